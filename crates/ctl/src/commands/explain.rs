//! `ternctl explain --from NS/POD --to NS/POD|IP --port 8080/TCP [-o table|json]`: which
//! policy and which rule decide a connection, from the datastore's live state.
//!
//! The policy state is read as the agent reads it (namespaces, workload endpoints, Kubernetes
//! and tern policies; a stored object it cannot use is skipped with a warning, as the agent
//! skips it) and judged by [`tern_policy::PolicySet::explain`], the evaluator the agent's
//! compiled rules are tested against: egress at the source pod, ingress at the destination
//! pod. An address that is no pod's has no policy: a node's (from the Node resources, named
//! as that host) or an outside one.
//!
//! Staged policies are read too: where applying them on top of the enforced ones would change
//! a direction's verdict or cause ([`PolicySet::pending_direction`]), the report shows that
//! direction's `pending` explanation beside the enforced one, and the overall pending verdict.
//!
//! On the Kubernetes datastore, namespaces and NetworkPolicies are Kubernetes' own objects,
//! which the agent watches from the API server instead of reading them from the store: they
//! are listed from the API server here too and converted by the agent's conversion
//! ([`tern_model::kubernetes`]); tern's policies and the endpoints (derived from the Pods)
//! come from the store as on any other.
//!
//! On a lab (`--lab NAME`), the state is read from the lab's datastore, and `--probe` also
//! makes the connection for real from the source's network namespace (a lab pod's, a pod of
//! the lab's Kubernetes cluster found through its runtime, or a node's) and reports the
//! kernel's verdict ([`tern_lab::verdict`]) beside the computed one.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value;
use tern_lab::LabState;
use tern_lab::verdict::Seen;
use tern_model::{Kind, Protocol, Resource};
use tern_policy::explain::{Reason, action_str, direction_str};
use tern_policy::{DirectionExplanation, Explanation, Flow, PolicySet, Verdict};
use tern_store::Store;
use tern_store::kube::KubeStore;

use crate::table;

/// The kinds that make up policy state, namespaces first (as the agent loads them).
const POLICY_KINDS: [Kind; 8] = [
    Kind::Namespace,
    Kind::WorkloadEndpoint,
    Kind::K8sNetworkPolicy,
    Kind::NetworkPolicy,
    Kind::GlobalNetworkPolicy,
    Kind::StagedNetworkPolicy,
    Kind::StagedGlobalNetworkPolicy,
    Kind::StagedKubernetesNetworkPolicy,
];

/// The cluster's policy state and who its endpoints are.
pub struct State {
    pub set: PolicySet,
    /// Pod name of each endpoint, by (namespace, endpoint name).
    pods: BTreeMap<(String, String), String>,
    /// The node each node address belongs to.
    hosts: BTreeMap<IpAddr, String>,
    /// Stored objects left out, with why.
    pub skipped: Vec<String>,
}

/// Reads the policy state from the store (etcd, SQLite).
pub fn load(store: &dyn Store) -> anyhow::Result<State> {
    load_with(store, None)
}

/// Reads the policy state from the Kubernetes datastore at `url` (`kubernetes`,
/// `kubernetes:///path/to/kubeconfig`); `None` for a URL of another store.
pub fn load_kubernetes(url: &str) -> Option<anyhow::Result<State>> {
    let store = KubeStore::open_url(url)?;
    Some(
        store
            .with_context(|| format!("cannot open datastore {url}"))
            .and_then(|s| load_with(&s, Some(&s))),
    )
}

/// The conversion of an object as the API server serves it into a tern resource.
type Convert = fn(&Value) -> Result<Resource, String>;

/// The builtin collection each kind is listed from on the Kubernetes datastore, and the
/// conversion of its objects.
fn builtin(kind: Kind) -> Option<(&'static str, Convert)> {
    match kind {
        Kind::Namespace => Some((
            "/api/v1/namespaces",
            tern_model::kubernetes::namespace_object,
        )),
        Kind::K8sNetworkPolicy => Some((
            "/apis/networking.k8s.io/v1/networkpolicies",
            tern_model::kubernetes::network_policy_object,
        )),
        _ => None,
    }
}

/// Reads the policy state: every kind from `store`, and namespaces and NetworkPolicies also
/// from the API server of `api` when given (the Kubernetes datastore), applied after the
/// store's.
fn load_with(store: &dyn Store, api: Option<&KubeStore>) -> anyhow::Result<State> {
    let mut state = State {
        set: PolicySet::new(),
        pods: BTreeMap::new(),
        hosts: BTreeMap::new(),
        skipped: Vec::new(),
    };
    let (nodes, _) =
        tern_model::list_resources_skipping(store, Kind::Node).context("reading Node objects")?;
    for n in nodes {
        if let Resource::Node(n) = n {
            for ip in node_addresses(&n.spec) {
                state.hosts.insert(ip, n.metadata.name.clone());
            }
        }
    }
    for kind in POLICY_KINDS {
        let (mut good, bad) = tern_model::list_resources_skipping(store, kind)
            .with_context(|| format!("reading {kind} objects"))?;
        state.skipped.extend(bad.iter().map(ToString::to_string));
        // The API server's objects over the store's, as the agent holds them over its store's.
        if let (Some(api), Some((collection, convert))) = (api, builtin(kind)) {
            let objects = api
                .list_builtin(collection)
                .with_context(|| format!("listing {collection}"))?;
            for o in &objects {
                match convert(o) {
                    Ok(r) => good.push(r),
                    Err(e) => state.skipped.push(e),
                }
            }
        }
        for r in good {
            if let Err(e) = state.set.apply(&r) {
                state.skipped.push(e.to_string());
                continue;
            }
            if let Resource::WorkloadEndpoint(w) = &r {
                let ns = w.metadata.namespace.clone().unwrap_or_default();
                let pod = if w.spec.pod.is_empty() {
                    w.metadata.name.clone()
                } else {
                    w.spec.pod.clone()
                };
                state.pods.insert((ns, w.metadata.name.clone()), pod);
            }
        }
    }
    Ok(state)
}

/// Every address of a node: its addresses, BGP addresses and VXLAN tunnel address (each
/// may carry a prefix length).
fn node_addresses(n: &tern_model::NodeSpec) -> Vec<IpAddr> {
    let bgp = n.bgp.as_ref();
    n.addresses
        .iter()
        .map(|a| a.address.as_str())
        .chain(bgp.and_then(|b| b.ipv4_address.as_deref()))
        .chain(bgp.and_then(|b| b.ipv6_address.as_deref()))
        .chain(n.ipv4_vxlan_tunnel_addr.as_deref())
        .chain(n.ipv6_vxlan_tunnel_addr.as_deref())
        .filter_map(|a| a.split('/').next()?.parse().ok())
        .collect()
}

/// `8080/TCP`, `53/udp`, `8080` (TCP): the destination port and protocol; `ICMP` (or
/// `ICMPv6`) alone: an echo request, which has no port.
pub fn parse_port(s: &str) -> anyhow::Result<(u16, Protocol)> {
    match s.to_ascii_uppercase().as_str() {
        "ICMP" => return Ok((0, Protocol::Icmp)),
        "ICMPV6" => return Ok((0, Protocol::IcmpV6)),
        _ => {}
    }
    let (num, proto) = s.split_once('/').unwrap_or((s, "TCP"));
    let port = num
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .with_context(|| format!("--port {s:?}: {num:?} is not a port (1-65535)"))?;
    let protocol = crate::commands::port::parse_protocol(proto)
        .with_context(|| format!("--port {s:?}: protocol {proto:?} is not TCP, UDP or SCTP"))?;
    Ok((port, protocol))
}

/// One end of the connection as resolved.
#[derive(Debug, Clone, Serialize)]
pub struct End {
    pub ip: IpAddr,
    /// The pod's namespace and name (absent for an address that is no pod's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its WorkloadEndpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The node whose address it is (a host, not a pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl End {
    fn label(&self) -> String {
        match (&self.namespace, &self.pod) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod} ({})", self.ip),
            _ => match &self.node {
                Some(node) => format!("host {node} ({})", self.ip),
                None => format!("{} (outside)", self.ip),
            },
        }
    }
}

/// The answer: the connection and its explanation.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub src: End,
    pub dst: End,
    pub proto: String,
    pub port: u16,
    /// The protocol judged (and probed).
    #[serde(skip)]
    pub protocol: Protocol,
    #[serde(flatten)]
    pub explanation: Explanation,
    /// What the staged policies would decide, when it differs (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
    /// The kernel's verdict on a real connection (`--probe`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// What the kernel did to a real connection, beside the computed verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Probe {
    /// `allowed`, `denied`, or `failed` (no verdict: the probe itself went wrong).
    pub verdict: &'static str,
    /// What happened (`TCP connected`, `UDP: no answer within 2000.0 ms`).
    pub detail: String,
    /// The namespace the connection was made from.
    pub from: String,
    /// Whether the kernel's verdict is the computed one.
    pub agrees: bool,
}

/// The staged policies' verdict: overall, and each direction they change.
#[derive(Debug, Clone, Serialize)]
pub struct Pending {
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<DirectionExplanation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress: Option<DirectionExplanation>,
}

impl Pending {
    /// The pending explanations of `flow` against the enforced `e`; `None` when the staged
    /// policies change neither direction.
    fn of(set: &PolicySet, flow: &Flow, e: &Explanation) -> Option<Pending> {
        let egress = set.pending_direction_given(flow, &e.egress);
        let ingress = set.pending_direction_given(flow, &e.ingress);
        if egress.is_none() && ingress.is_none() {
            return None;
        }
        let allows = |p: &Option<DirectionExplanation>, enforced: &DirectionExplanation| {
            p.as_ref()
                .map_or(enforced.verdict, |p| p.verdict)
                .is_allowed()
        };
        let verdict = if allows(&egress, &e.egress) && allows(&ingress, &e.ingress) {
            Verdict::Allowed
        } else {
            Verdict::Denied
        };
        Some(Pending {
            verdict,
            egress,
            ingress,
        })
    }
}

impl State {
    /// The pod `NS/POD` (`POD` alone: namespace `default`) or an address, as an end; the
    /// address family of `like` is preferred for a pod with addresses of both.
    fn resolve(&self, what: &str, like: Option<IpAddr>) -> anyhow::Result<End> {
        if let Ok(ip) = what.parse::<IpAddr>() {
            return Ok(self.end_of(ip));
        }
        let (ns, pod) = what.split_once('/').unwrap_or(("default", what));
        if ns.is_empty() || pod.is_empty() || pod.contains('/') {
            bail!("{what:?} is neither NAMESPACE/POD nor an IP address");
        }
        let ips: Vec<IpAddr> = self
            .pods
            .iter()
            .filter(|((n, _), p)| n == ns && *p == pod)
            .filter_map(|((n, e), _)| self.set.endpoint(n, e))
            .flat_map(|e| e.ips.iter().copied())
            .collect();
        let ip = ips
            .iter()
            .find(|ip| like.is_none_or(|l| l.is_ipv4() == ip.is_ipv4()))
            .or(ips.first())
            .with_context(|| {
                format!("pod {ns}/{pod} not found: no WorkloadEndpoint with an address has it")
            })?;
        Ok(self.end_of(*ip))
    }

    fn end_of(&self, ip: IpAddr) -> End {
        let ep = self.set.endpoint_by_ip(ip);
        End {
            ip,
            namespace: ep.map(|e| e.namespace.clone()),
            pod: ep.and_then(|e| {
                self.pods
                    .get(&(e.namespace.clone(), e.name.clone()))
                    .cloned()
            }),
            endpoint: ep.map(|e| e.name.clone()),
            node: ep.is_none().then(|| self.hosts.get(&ip).cloned()).flatten(),
        }
    }

    /// Explains the connection `from` → `to` on `port`.
    pub fn explain(
        &self,
        from: &str,
        to: &str,
        (port, protocol): (u16, Protocol),
    ) -> anyhow::Result<Report> {
        let src = self.resolve(from, None)?;
        let dst = self.resolve(to, Some(src.ip))?;
        let src = if src.pod.is_some() {
            self.resolve(from, Some(dst.ip))?
        } else {
            src
        };
        if src.ip.is_ipv4() != dst.ip.is_ipv4() {
            bail!(
                "{} and {} are of different address families",
                src.ip,
                dst.ip
            );
        }
        // An echo request is ICMPv6's between IPv6 addresses.
        let protocol = match protocol {
            Protocol::Icmp | Protocol::IcmpV6 if dst.ip.is_ipv6() => Protocol::IcmpV6,
            Protocol::Icmp | Protocol::IcmpV6 => Protocol::Icmp,
            p => p,
        };
        let flow = Flow {
            src: src.ip,
            dst: dst.ip,
            protocol,
            dst_port: port,
        };
        let explanation = self.set.explain(&flow);
        let pending = Pending::of(&self.set, &flow, &explanation);
        Ok(Report {
            src,
            dst,
            proto: proto_name(protocol),
            port,
            protocol,
            explanation,
            pending,
            probe: None,
        })
    }
}

fn proto_name(p: Protocol) -> String {
    match p {
        Protocol::Tcp => "TCP".into(),
        Protocol::Udp => "UDP".into(),
        Protocol::Sctp => "SCTP".into(),
        Protocol::Icmp => "ICMP".into(),
        Protocol::IcmpV6 => "ICMPv6".into(),
        other => format!("{other:?}").to_uppercase(),
    }
}

/// The report as JSON (one object).
pub fn render_json(r: &Report) -> String {
    serde_json::to_string_pretty(r).expect("a report serialises") + "\n"
}

/// A policy as a person reads it: `KubernetesNetworkPolicy x/deny-all`.
fn policy_name(p: &tern_policy::PolicyRef) -> String {
    match &p.namespace {
        Some(ns) => format!("{} {ns}/{}", p.kind, p.name),
        None => format!("{} {}", p.kind, p.name),
    }
}

/// What decided one direction, in a phrase.
fn decided_by(d: &DirectionExplanation, at: &End) -> String {
    match d.reason {
        Reason::Rule => d
            .policies
            .iter()
            .map(|p| {
                let rule = p.rule.map(|r| format!(" {r}")).unwrap_or_default();
                let action = p.action.map(|a| format!(" ({})", action_str(a)));
                format!("{}{rule}{}", policy_name(p), action.unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join(", "),
        Reason::DefaultDeny => format!(
            "no rule matched in {}",
            d.policies
                .iter()
                .map(policy_name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Reason::NoPolicy if at.pod.is_none() => "not a pod: no policy".into(),
        Reason::NoPolicy => "no policy selects it".into(),
    }
}

/// The report as tables: the connection and its verdict, a row per direction, then per
/// direction the policies selecting the pod in evaluation order.
pub fn render_table(r: &Report) -> String {
    let e = &r.explanation;
    let staged = r
        .pending
        .as_ref()
        .map(|p| format!(" (staged policies: {})", p.verdict.as_str().to_uppercase()))
        .unwrap_or_default();
    let service = match r.port {
        0 => r.proto.clone(),
        port => format!("{port}/{}", r.proto),
    };
    let mut out = format!(
        "{} -> {} {service}: {}{staged}\n",
        r.src.label(),
        r.dst.label(),
        e.verdict.as_str().to_uppercase()
    );
    if let Some(p) = &r.probe {
        out.push_str(&format!(
            "probe from {}: {} ({}){}\n",
            p.from,
            p.verdict.to_uppercase(),
            p.detail,
            if p.agrees {
                ": agrees".to_string()
            } else {
                format!(
                    ": DISAGREES with the computed verdict {}",
                    e.verdict.as_str().to_uppercase()
                )
            }
        ));
    }
    out.push('\n');
    let dirs = [(&e.egress, &r.src), (&e.ingress, &r.dst)];
    let rows: Vec<Vec<String>> = dirs
        .iter()
        .map(|(d, at)| {
            vec![
                direction_str(d.direction).to_string(),
                at.label(),
                d.verdict.as_str().to_string(),
                d.reason.as_str().to_string(),
                decided_by(d, at),
            ]
        })
        .collect();
    out.push_str(&table::plain(
        &["DIRECTION", "AT", "VERDICT", "REASON", "DECIDED BY"],
        &rows,
    ));
    if let Some(p) = &r.pending {
        let rows: Vec<Vec<String>> = [(&p.egress, &r.src), (&p.ingress, &r.dst)]
            .into_iter()
            .filter_map(|(d, at)| {
                let d = d.as_ref()?;
                Some(vec![
                    direction_str(d.direction).to_string(),
                    at.label(),
                    d.verdict.as_str().to_string(),
                    d.reason.as_str().to_string(),
                    decided_by(d, at),
                ])
            })
            .collect();
        out.push_str("\npending: what the staged policies would decide instead:\n");
        out.push_str(&table::plain(
            &["DIRECTION", "AT", "VERDICT", "REASON", "DECIDED BY"],
            &rows,
        ));
    }
    for (d, at) in dirs {
        if d.selecting.is_empty() {
            continue;
        }
        // Where the deciding policy is in the order (none for a default deny).
        let decided = d
            .policies
            .first()
            .filter(|_| d.reason == Reason::Rule)
            .and_then(|k| {
                d.selecting
                    .iter()
                    .position(|p| p.id() == k.id())
                    .map(|i| (i, k))
            });
        let rows: Vec<Vec<String>> = d
            .selecting
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut what = vec![match decided {
                    Some((at, k)) if at == i => format!(
                        "decides: {} {}",
                        k.rule.map(|r| r.to_string()).unwrap_or_default(),
                        k.action.map(action_str).unwrap_or_default()
                    ),
                    Some((at, _)) if at < i => "not reached".to_string(),
                    _ => "no rule matched".to_string(),
                }];
                what.extend(
                    d.logged
                        .iter()
                        .filter(|l| l.id() == p.id())
                        .filter_map(|l| l.rule.map(|r| format!("logged by {r}"))),
                );
                vec![
                    p.order.map_or_else(|| "-".to_string(), |o| o.to_string()),
                    policy_name(p),
                    what.join("; "),
                ]
            })
            .collect();
        out.push_str(&format!(
            "\n{} policies selecting {}, in evaluation order:\n",
            direction_str(d.direction),
            at.label()
        ));
        out.push_str(&table::plain(&["ORDER", "POLICY", "RESULT"], &rows));
    }
    out
}

/// The state file of lab `name` and its policy state, read from the lab's datastore (from
/// inside the namespace that reaches it: the etcd's, or the control plane's for the
/// Kubernetes datastore).
pub fn load_lab(name: &str) -> anyhow::Result<(LabState, State)> {
    let st = LabState::load(name)?
        .with_context(|| format!("lab {name:?} does not exist; create it with `ternctl lab up`"))?;
    let state = match (&st.store, &st.kube) {
        // The API server's namespaces and NetworkPolicies too, from where the admin
        // kubeconfig's address is reachable.
        (tern_lab::StoreKind::Kubernetes, Some(k)) => {
            let url = st.store_url();
            tern_lab::netns::in_netns(&k.cp_netns, move || {
                load_kubernetes(&url).unwrap_or_else(|| bail!("{url} is no Kubernetes datastore"))
            })??
        }
        _ => tern_lab::cluster::with_store(&st, |s| {
            load(&*s).map_err(|e| tern_lab::LabError::Invalid(format!("{e:#}")))
        })?,
    };
    Ok((st, state))
}

/// The network namespace a connection from `src` starts in on the lab: that of the lab pod
/// or node with its address, or, on a Kubernetes lab, the pod's sandbox (through the
/// runtime). Its description and the open namespace.
fn source_netns(st: &LabState, src: &End) -> anyhow::Result<(String, std::fs::File)> {
    let ip = src.ip.to_string();
    let named = |ns: &str| -> anyhow::Result<(String, std::fs::File)> {
        let path = std::path::Path::new("/run/netns").join(ns);
        let f = std::fs::File::open(&path)
            .with_context(|| format!("--probe: opening {}", path.display()))?;
        Ok((ns.to_string(), f))
    };
    if let Some(p) = st.pods.iter().find(|p| p.addresses.contains(&ip)) {
        return named(&p.netns);
    }
    let host = |a: &str| a.split('/').next() == Some(ip.as_str());
    if let Some(n) = st.nodes.iter().find(|n| host(&n.address)) {
        return named(&n.netns);
    }
    if let (Some(k), Some(ns), Some(pod)) = (&st.kube, &src.namespace, &src.pod) {
        let f = tern_lab::kube::probe::pod_netns(k, ns, pod)
            .with_context(|| format!("--probe: the network namespace of pod {ns}/{pod}"))?;
        return Ok((format!("pod {ns}/{pod}"), f));
    }
    bail!(
        "--probe: {} is neither a pod nor a node of lab {:?}",
        src.label(),
        st.name
    )
}

/// Makes the connection of `r` for real on lab `st` (from the source's namespace, waiting at
/// most `timeout`) and records the kernel's verdict in `r.probe`.
pub fn probe(st: &LabState, r: &mut Report, timeout: Duration) -> anyhow::Result<()> {
    let (from, netns) = source_netns(st, &r.src)?;
    let (protocol, target) = (r.protocol, SocketAddr::new(r.dst.ip, r.port));
    let seen: Seen = tern_lab::netns::in_netns_file(&netns, &from, move || {
        tern_lab::verdict::probe(protocol, target, timeout)
    })?;
    r.probe = Some(Probe {
        verdict: seen.verdict(),
        detail: seen.detail().to_string(),
        from,
        agrees: seen.verdict() == r.explanation.verdict.as_str(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--port` takes a number with an optional protocol in any case, TCP by default.
    #[test]
    fn ports_parse_with_their_protocol() {
        assert_eq!(parse_port("8080/TCP").unwrap(), (8080, Protocol::Tcp));
        assert_eq!(parse_port("53/udp").unwrap(), (53, Protocol::Udp));
        assert_eq!(parse_port("9000/Sctp").unwrap(), (9000, Protocol::Sctp));
        assert_eq!(parse_port("80").unwrap(), (80, Protocol::Tcp));
        assert_eq!(parse_port("ICMP").unwrap(), (0, Protocol::Icmp));
        assert_eq!(parse_port("icmpv6").unwrap(), (0, Protocol::IcmpV6));
        for bad in ["0", "70000/TCP", "http", "80/ICMP", "80/", "ICMP/80"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
    }

    /// Every address a Node resource gives, without prefix lengths.
    #[test]
    fn a_node_has_all_its_addresses() {
        let doc = "apiVersion: tern.dev/v1\nkind: Node\nmetadata: {name: n1}\nspec:\n  addresses: [{address: 192.0.2.1/24}]\n  bgp: {ipv4Address: 198.18.0.2/24, ipv6Address: 'fd00::2/64'}\n  ipv4VXLANTunnelAddr: 10.244.0.1\n";
        let Resource::Node(n) = tern_model::parse_documents(doc, "n.yaml")
            .unwrap()
            .remove(0)
        else {
            panic!("not a node")
        };
        let got: Vec<String> = node_addresses(&n.spec)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["192.0.2.1", "198.18.0.2", "fd00::2", "10.244.0.1"]);
    }
}
