//! One NFLOG event into a [`FlowRecord`]: the kernel's tag says the verdict and the deciding
//! rule; the policy model fills in the rest (the ends as pods, hosts or outside addresses,
//! the policies of a default deny, the rule behind a fast-path allow), through
//! `PolicySet::explain`. Where the kernel named a rule and the model disagrees, the kernel's
//! verdict stands and the record is marked so the service counts it. Pure.
//!
//! In two steps, so the service can cache the first ([`super::cache`]): [`resolve_cause`]
//! reads the model, and depends on the tag, the addresses, the protocol and the destination
//! port only (a rule never matches a source port: [`Flow`] has none); [`complete`] adds the
//! time, the ports and the host ends' node names (of [`Hosts`], not of the model).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use tern_api::flow::{
    EndKind, FlowDirection, FlowEnd, FlowPolicy, FlowReason, FlowRecord, FlowVerdict,
};
use tern_linux::nflog::PacketHeaders;
use tern_model::Protocol;
use tern_policy::compile::short_hash;
use tern_policy::flowtag::FlowTag;
use tern_policy::{Direction, Endpoint, Flow, PolicyRef, PolicySet, Reason};

/// Node addresses (underlay and tunnel) by address: the host ends of flows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hosts {
    pub by_ip: HashMap<IpAddr, String>,
}

/// A record (its `seq` not yet given) and whether the model disagreed with the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub record: FlowRecord,
    pub disagrees: bool,
}

/// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, `udplite` or the number.
pub fn proto_name(p: u8) -> String {
    match p {
        6 => "tcp".into(),
        17 => "udp".into(),
        132 => "sctp".into(),
        1 => "icmp".into(),
        58 => "icmpv6".into(),
        136 => "udplite".into(),
        n => n.to_string(),
    }
}

fn protocol(p: u8) -> Protocol {
    match p {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        132 => Protocol::Sctp,
        1 => Protocol::Icmp,
        58 => Protocol::IcmpV6,
        136 => Protocol::UdpLite,
        n => Protocol::Number(n),
    }
}

/// The pod name inside an endpoint name `<node>-k8s-<pod>-<ifname>` (each part with `-`
/// written `--`); the endpoint name itself when it is not of that form.
pub fn pod_name(ep: &Endpoint) -> String {
    let esc_node = ep.node.replace('-', "--");
    let Some(rest) = ep.name.strip_prefix(&format!("{esc_node}-k8s-")) else {
        return ep.name.clone();
    };
    // The last single `-` separates the pod from the interface name.
    let b = rest.as_bytes();
    let mut cut = None;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'-' {
            if b.get(i + 1) == Some(&b'-') {
                i += 2;
                continue;
            }
            cut = Some(i);
        }
        i += 1;
    }
    match cut {
        Some(c) => rest[..c].replace("--", "-"),
        None => ep.name.clone(),
    }
}

/// An end as the model knows it: a pod, or outside (until [`complete`] finds a host); no
/// port yet.
fn end(set: &PolicySet, ip: IpAddr) -> FlowEnd {
    let mut e = FlowEnd {
        ip: ip.to_string(),
        port: None,
        kind: EndKind::Outside,
        namespace: None,
        pod: None,
        labels: BTreeMap::new(),
        node: None,
    };
    if let Some(ep) = set.endpoint_by_ip(ip) {
        e.kind = EndKind::Pod;
        e.namespace = Some(ep.namespace.clone());
        e.pod = Some(pod_name(ep));
        e.labels = (*ep.labels).clone();
    }
    e
}

/// An end of [`end`] with its port, and its node when it is a host.
fn complete_end(e: &mut FlowEnd, hosts: &Hosts, ip: IpAddr, port: Option<u16>) {
    e.port = port;
    if e.kind == EndKind::Outside
        && let Some(n) = hosts.by_ip.get(&ip)
    {
        e.kind = EndKind::Host;
        e.node = Some(n.clone());
    }
}

fn dir_str(d: Direction) -> &'static str {
    tern_policy::explain::direction_str(d)
}

/// Resolves one event: `tag` from its prefix, `pkt` its headers, `time_ms` when it was seen.
/// [`complete`] of [`resolve_cause`].
pub fn resolve(
    set: &PolicySet,
    node: &str,
    hosts: &Hosts,
    tag: &FlowTag,
    pkt: &PacketHeaders,
    time_ms: u64,
) -> Resolved {
    complete(resolve_cause(set, node, tag, pkt), hosts, pkt, time_ms)
}

/// The record of an event at a time and ports of its own, from the cause of an event of the
/// same tag, addresses, protocol and destination port ([`resolve_cause`], perhaps cached):
/// the time, both ports and the host ends' nodes filled in.
pub fn complete(mut r: Resolved, hosts: &Hosts, pkt: &PacketHeaders, time_ms: u64) -> Resolved {
    r.record.time = time_ms;
    complete_end(&mut r.record.src, hosts, pkt.src, pkt.src_port);
    complete_end(&mut r.record.dst, hosts, pkt.dst, pkt.dst_port);
    r
}

/// What the model says of an event: the record without its time (0), ports and host ends
/// (see [`complete`]). A function of the model, `node`, `tag`, the addresses, the protocol
/// and the destination port of `pkt`, nothing else of it.
pub fn resolve_cause(set: &PolicySet, node: &str, tag: &FlowTag, pkt: &PacketHeaders) -> Resolved {
    let dir = tag.direction();
    let flow = Flow {
        src: pkt.src,
        dst: pkt.dst,
        protocol: protocol(pkt.proto),
        dst_port: pkt.dst_port.unwrap_or(0),
        icmp: None,
    };
    let local_ip = match dir {
        Direction::Ingress => pkt.dst,
        Direction::Egress => pkt.src,
    };
    let ep = set.endpoint_by_ip(local_ip);
    let expl = ep.map(|e| set.explain_direction(e, dir, &flow));
    let verdict = if tag.allows() {
        FlowVerdict::Allowed
    } else {
        FlowVerdict::Denied
    };
    let mut disagrees = false;
    let (reason, policies) = match tag {
        FlowTag::Rule {
            policy_hash, index, ..
        } => {
            let rule = format!("{}[{index}]", dir_str(dir));
            let hashed = |p: &&PolicyRef| short_hash(&p.id()) == *policy_hash;
            // The policy the model names, when the kernel's tag names it too (the usual case:
            // one hash); else the first of the endpoint's policies (explain's `selecting`, in
            // evaluation order) the tag names.
            let named = expl.as_ref().and_then(|x| {
                x.policies
                    .first()
                    .filter(|_| x.reason == Reason::Rule)
                    .filter(hashed)
                    .or_else(|| x.selecting.iter().find(hashed))
            });
            if let Some(x) = &expl {
                let same = named.is_some_and(|p| {
                    x.reason == Reason::Rule
                        && x.policies.first().is_some_and(|d| {
                            d.kind == p.kind
                                && d.namespace == p.namespace
                                && d.name == p.name
                                && d.rule.is_some_and(|r| r.index == *index)
                        })
                });
                disagrees = !same || x.verdict.is_allowed() != tag.allows();
            }
            let policies = named
                .map(|p| {
                    vec![FlowPolicy {
                        rule: Some(rule),
                        ..p.flow_policy()
                    }]
                })
                .unwrap_or_default();
            (FlowReason::Rule, policies)
        }
        FlowTag::DefaultDeny(_) => {
            if let Some(x) = &expl {
                disagrees = x.reason != Reason::DefaultDeny;
            }
            // Every policy selecting the endpoint in this direction, as explain lists them.
            let policies = expl
                .as_ref()
                .map(|x| x.selecting.iter().map(PolicyRef::flow_policy).collect())
                .unwrap_or_default();
            (FlowReason::DefaultDeny, policies)
        }
        FlowTag::FastPath(_) => match &expl {
            Some(x) if x.reason == Reason::Rule && x.verdict.is_allowed() => (
                FlowReason::Rule,
                x.policies.iter().map(PolicyRef::flow_policy).collect(),
            ),
            Some(_) => {
                disagrees = true;
                (FlowReason::Rule, Vec::new())
            }
            None => (FlowReason::Rule, Vec::new()),
        },
        FlowTag::NoPolicy(_) => {
            if let Some(x) = &expl {
                disagrees = x.reason != Reason::NoPolicy;
            }
            (FlowReason::NoPolicy, Vec::new())
        }
    };
    // What the staged policies would have done, when it differs (the enforced evaluation is
    // `expl`'s, not done again).
    let pending = expl.as_ref().and_then(|x| set.pending_given(&flow, x));
    let record = FlowRecord {
        seq: 0,
        time: 0,
        node: node.to_string(),
        direction: match dir {
            Direction::Ingress => FlowDirection::Ingress,
            Direction::Egress => FlowDirection::Egress,
        },
        proto: proto_name(pkt.proto),
        src: end(set, pkt.src),
        dst: end(set, pkt.dst),
        verdict,
        reason,
        policies,
        pending,
    };
    Resolved { record, disagrees }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tern_policy::flowtag::TagAction;

    use super::*;

    fn ep(ns: &str, pod: &str, ip: &str, app: &str) -> Endpoint {
        Endpoint {
            namespace: ns.into(),
            name: format!("node--1-k8s-{}-eth0", pod.replace('-', "--")),
            node: "node-1".into(),
            interface: format!("t{pod}"),
            labels: Arc::new([("app".to_string(), app.to_string())].into()),
            ips: vec![ip.parse().unwrap()],
            ports: Vec::new(),
        }
    }

    const POLICY: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: b}\nspec:\n  podSelector: {matchLabels: {app: server}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {app: client}}\n      namespaceSelector: {}\n    ports:\n    - {port: 8080, protocol: TCP}\n";

    fn set() -> PolicySet {
        let mut s = PolicySet::new();
        s.upsert_endpoint(ep("a", "client-x", "10.0.0.1", "client"));
        s.upsert_endpoint(ep("b", "server", "10.0.0.2", "server"));
        s.upsert_endpoint(ep("a", "other", "10.0.0.3", "other"));
        for r in tern_model::parse_documents(POLICY, "t.yaml").unwrap() {
            s.apply(&r).unwrap();
        }
        s
    }

    fn tcp(src: &str, dst: &str, port: u16) -> PacketHeaders {
        PacketHeaders {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: 6,
            src_port: Some(40000),
            dst_port: Some(port),
            icmp: None,
        }
    }

    fn hosts() -> Hosts {
        Hosts {
            by_ip: HashMap::from([("198.18.0.9".parse().unwrap(), "node-9".to_string())]),
        }
    }

    #[test]
    fn pod_names_come_out_of_endpoint_names() {
        let s = set();
        let e = s.endpoint_by_ip("10.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(pod_name(e), "client-x");
        let mut odd = e.clone();
        odd.name = "something-else".into();
        assert_eq!(pod_name(&odd), "something-else");
    }

    #[test]
    fn a_rule_allow_names_the_policy_and_rule() {
        let s = set();
        let key = s.policies().next().unwrap().key.to_string();
        let tag = FlowTag::Rule {
            policy_hash: short_hash(&key),
            direction: Direction::Ingress,
            index: 0,
            action: TagAction::Allow,
        };
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &tag,
            &tcp("10.0.0.1", "10.0.0.2", 8080),
            5,
        );
        assert!(!r.disagrees);
        let rec = r.record;
        assert_eq!(rec.verdict, FlowVerdict::Allowed);
        assert_eq!(rec.reason, FlowReason::Rule);
        assert_eq!(rec.policies.len(), 1);
        assert_eq!(rec.policies[0].name, "web");
        assert_eq!(rec.policies[0].kind, "KubernetesNetworkPolicy");
        assert_eq!(rec.policies[0].rule.as_deref(), Some("ingress[0]"));
        assert_eq!(rec.src.pod.as_deref(), Some("client-x"));
        assert_eq!(rec.src.namespace.as_deref(), Some("a"));
        assert_eq!(rec.dst.labels["app"], "server");
        assert_eq!((rec.proto.as_str(), rec.dst.port), ("tcp", Some(8080)));
        // The same tag for a flow the model denies: the kernel's verdict stands, counted.
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &tag,
            &tcp("10.0.0.3", "10.0.0.2", 8080),
            5,
        );
        assert!(r.disagrees);
        assert_eq!(r.record.verdict, FlowVerdict::Allowed);
    }

    #[test]
    fn a_default_deny_names_every_selecting_policy() {
        let s = set();
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &FlowTag::DefaultDeny(Direction::Ingress),
            &tcp("198.18.0.9", "10.0.0.2", 22),
            5,
        );
        assert!(!r.disagrees);
        let rec = r.record;
        assert_eq!(
            (rec.verdict, rec.reason),
            (FlowVerdict::Denied, FlowReason::DefaultDeny)
        );
        assert_eq!(rec.policies.len(), 1);
        assert_eq!(rec.policies[0].rule, None);
        assert_eq!(rec.src.kind, EndKind::Host);
        assert_eq!(rec.src.node.as_deref(), Some("node-9"));
    }

    #[test]
    fn no_policy_and_fast_path_take_their_cause_from_the_model() {
        let s = set();
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &FlowTag::NoPolicy(Direction::Egress),
            &tcp("10.0.0.3", "192.0.2.1", 443),
            5,
        );
        assert!(!r.disagrees);
        assert_eq!(r.record.reason, FlowReason::NoPolicy);
        assert!(r.record.policies.is_empty());
        assert_eq!(r.record.dst.kind, EndKind::Outside);
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &FlowTag::FastPath(Direction::Ingress),
            &tcp("10.0.0.1", "10.0.0.2", 8080),
            5,
        );
        assert!(!r.disagrees);
        assert_eq!(r.record.reason, FlowReason::Rule);
        assert_eq!(r.record.policies[0].rule.as_deref(), Some("ingress[0]"));
        // A no-policy tag at a pod the model has policies for disagrees.
        let r = resolve(
            &s,
            "node-1",
            &hosts(),
            &FlowTag::NoPolicy(Direction::Ingress),
            &tcp("10.0.0.1", "10.0.0.2", 22),
            5,
        );
        assert!(r.disagrees);
        assert_eq!(r.record.verdict, FlowVerdict::Allowed);
    }
}
