//! The random policy generator and the independent evaluator of issue 21's random proofs,
//! shared by two tests without duplication:
//!
//! - `crates/policy/tests/explain_random.rs` (`mod randpol;`): `PolicySet::explain` against
//!   this evaluator on 300 random worlds, every flow between pods and outside addresses;
//! - `crates/ctl/tests/lab_random_policy.rs` (through
//!   `#[path = "../../policy/tests/randpol/mod.rs"] mod randpol;`, since tern-ctl's tests
//!   cannot name tern-policy's test files otherwise, and tern-testkit cannot depend on
//!   tern-model or tern-policy, whose own tests use tern-testkit): the same worlds on a real
//!   two-node lab, the probes' verdicts and the agents' flow records compared with it.
//!
//! A seeded generator ([`Rng`]) makes namespaces and pods with random labels and named ports,
//! and random Kubernetes NetworkPolicies (pod and namespace selectors, ipBlocks with excepts,
//! numbered, ranged and named ports) and tern NetworkPolicies and GlobalNetworkPolicies
//! (orders with ties, Allow/Deny/Pass/Log, protocols, selectors, nets and notNets). The
//! generator's own values are evaluated here by the semantics `tern_policy::model` documents,
//! written afresh and reading nothing of the crate but [`Kind`]'s order for ties; the tests
//! render the same values as documents ([`policy_json`]) for the code under test.
//!
//! Addresses: the pods of [`random_pods`] get the addresses of a fixed layout (10.1.x.y), and
//! the nets policies name come from a [`Nets`] ([`Nets::TABLE`] for that layout). The lab
//! test gives the pods the addresses its IPAM assigned and derives the nets from them (the
//! pods' /16, one pod's /24, that pod's /32), so every net still selects some pods and not
//! others. The lab probes only what it can carry: TCP between pods (no outside address, no
//! UDP or SCTP); policies still name UDP, outside nets and named ports, which then must not
//! match those probes.

#![allow(dead_code)] // each test uses its own subset

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use serde_json::{Value, json};
use tern_model::{Kind, Protocol};
use tern_policy::{Direction, Flow};
use tern_testkit::rng::Rng;

pub type Labels = BTreeMap<String, String>;

pub const KEYS: [&str; 2] = ["app", "tier"];
pub const VALUES: [&str; 3] = ["w", "d", "c"];
pub const NAMESPACES: [&str; 3] = ["a", "b", "c"];
/// Named ports a pod may have: the same name with different numbers on different pods.
pub const NAMED: [(&str, Protocol, u16); 4] = [
    ("http", Protocol::Tcp, 80),
    ("http", Protocol::Tcp, 8080),
    ("dns", Protocol::Udp, 53),
    ("alt", Protocol::Tcp, 443),
];
/// The nets policies name: `all` holds every pod, `part` some of them, `one` a single pod;
/// `192.0.2.0/24` (outside) and `0.0.0.0/0` come with them.
#[derive(Clone, Copy, Debug)]
pub struct Nets {
    pub all: &'static str,
    pub part: &'static str,
    pub one: &'static str,
}

impl Nets {
    /// The nets of [`random_pods`]' own addresses: `part` holds pod1 and pod4, `one` pod1.
    pub const TABLE: Nets = Nets {
        all: "10.1.0.0/16",
        part: "10.1.1.0/24",
        one: "10.1.1.2/32",
    };

    /// The five nets a tern rule may name.
    pub fn list(&self) -> [&'static str; 5] {
        [self.all, self.part, self.one, "192.0.2.0/24", "0.0.0.0/0"]
    }
}
pub const OUTSIDE: [&str; 2] = ["192.0.2.7", "198.51.100.1"];

pub fn random_labels(r: &mut Rng) -> Labels {
    let mut l = Labels::new();
    for k in KEYS {
        if r.chance(60) {
            l.insert(k.to_string(), r.pick(&VALUES).to_string());
        }
    }
    l
}

pub struct Pod {
    pub ns: &'static str,
    pub name: String,
    pub labels: Labels,
    pub ip: Ipv4Addr,
    pub ports: Vec<(&'static str, Protocol, u16)>,
}

/// A tern selector: generated as a value, rendered as text, evaluated here.
#[derive(Clone, Debug)]
pub enum Sel {
    All,
    Eq(&'static str, &'static str),
    Ne(&'static str, &'static str),
    Has(&'static str),
    NotHas(&'static str),
    In(&'static str, Vec<&'static str>),
    And(Box<Sel>, Box<Sel>),
}

impl Sel {
    pub fn random(r: &mut Rng, depth: usize) -> Sel {
        let (k, v) = (r.pick(&KEYS), r.pick(&VALUES));
        match r.below(if depth > 0 { 7 } else { 6 }) {
            0 => Sel::All,
            1 | 5 => Sel::Eq(k, v),
            2 => Sel::Ne(k, v),
            3 => Sel::Has(k),
            4 => {
                if r.chance(50) {
                    Sel::NotHas(k)
                } else {
                    Sel::In(k, vec![v, r.pick(&VALUES)])
                }
            }
            _ => Sel::And(
                Box::new(Sel::random(r, depth - 1)),
                Box::new(Sel::random(r, depth - 1)),
            ),
        }
    }
    pub fn text(&self) -> String {
        match self {
            Sel::All => "all()".into(),
            Sel::Eq(k, v) => format!("{k} == '{v}'"),
            Sel::Ne(k, v) => format!("{k} != '{v}'"),
            Sel::Has(k) => format!("has({k})"),
            Sel::NotHas(k) => format!("!has({k})"),
            Sel::In(k, vs) => format!(
                "{k} in {{{}}}",
                vs.iter()
                    .map(|v| format!("'{v}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Sel::And(a, b) => format!("({}) && ({})", a.text(), b.text()),
        }
    }
    pub fn matches(&self, l: &Labels) -> bool {
        match self {
            Sel::All => true,
            Sel::Eq(k, v) => l.get(*k).is_some_and(|x| x == v),
            // Calico: `k != v` also matches a missing key.
            Sel::Ne(k, v) => l.get(*k).is_none_or(|x| x != v),
            Sel::Has(k) => l.contains_key(*k),
            Sel::NotHas(k) => !l.contains_key(*k),
            Sel::In(k, vs) => l.get(*k).is_some_and(|x| vs.contains(&x.as_str())),
            Sel::And(a, b) => a.matches(l) && b.matches(l),
        }
    }
}

/// A destination port criterion.
#[derive(Clone, Debug)]
pub enum PortSpec {
    Range(u16, u16),
    Named(&'static str),
}

impl PortSpec {
    pub fn random(r: &mut Rng) -> PortSpec {
        match r.below(4) {
            0 => PortSpec::Range(80, 80),
            1 => PortSpec::Range(53, 443),
            2 => PortSpec::Named(r.pick(&["http", "dns", "alt"])),
            _ => PortSpec::Range(8080, 8080),
        }
    }
}

pub fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        _ => "SCTP",
    }
}

/// A Kubernetes peer: pods by selectors, or an ipBlock.
#[derive(Clone, Debug)]
pub enum Peer {
    Pods {
        ns: Option<Labels>,
        pods: Option<Labels>,
    },
    Block(&'static str, Vec<&'static str>),
}

#[derive(Clone, Debug)]
pub struct K8sRule {
    pub peers: Vec<Peer>,
    /// (protocol, port): no port = every port of the protocol.
    pub ports: Vec<(Protocol, Option<PortSpec>)>,
}

#[derive(Clone, Debug, Default)]
pub struct Entity {
    pub sel: Option<Sel>,
    pub ns_sel: Option<Sel>,
    pub nets: Vec<&'static str>,
    pub not_nets: Vec<&'static str>,
    pub ports: Vec<PortSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Allow,
    Deny,
    Pass,
    Log,
}

#[derive(Clone, Debug)]
pub struct TernRule {
    pub action: Act,
    pub proto: Option<Protocol>,
    pub src: Entity,
    pub dst: Entity,
}

#[derive(Clone, Debug)]
pub enum Body {
    K8s {
        pods: Labels,
        ingress: Option<Vec<K8sRule>>,
        egress: Option<Vec<K8sRule>>,
    },
    Tern {
        order: Option<f64>,
        selector: Sel,
        ingress: Option<Vec<TernRule>>,
        egress: Option<Vec<TernRule>>,
    },
}

#[derive(Clone, Debug)]
pub struct Pol {
    pub kind: Kind,
    pub ns: Option<&'static str>,
    pub name: String,
    pub body: Body,
}

pub fn random_small_labels(r: &mut Rng) -> Labels {
    let mut l = random_labels(r);
    while l.len() > 1 {
        l.pop_first();
    }
    l
}

pub fn random_k8s_rule(r: &mut Rng, nets: &Nets) -> K8sRule {
    let peers = (0..r.below(3))
        .map(|_| match r.below(4) {
            0 => Peer::Block(
                nets.all,
                if r.chance(50) {
                    vec![nets.part]
                } else {
                    vec![]
                },
            ),
            1 => Peer::Block(r.pick(&["0.0.0.0/0", "192.0.2.0/24", nets.one]), vec![]),
            _ => {
                let ns = r.chance(50).then(|| {
                    if r.chance(30) {
                        Labels::new()
                    } else {
                        BTreeMap::from([("team".to_string(), r.pick(&["x", "y"]).to_string())])
                    }
                });
                let pods = (ns.is_none() || r.chance(50)).then(|| random_small_labels(r));
                Peer::Pods { ns, pods }
            }
        })
        .collect();
    let ports = (0..r.below(3))
        .map(|_| {
            let proto = r.pick(&[Protocol::Tcp, Protocol::Tcp, Protocol::Udp]);
            (proto, r.chance(80).then(|| PortSpec::random(r)))
        })
        .collect();
    K8sRule { peers, ports }
}

pub fn random_entity(r: &mut Rng, ports: bool, nets: &Nets) -> Entity {
    let mut e = Entity::default();
    if r.chance(40) {
        e.sel = Some(Sel::random(r, 1));
    }
    if r.chance(20) {
        e.ns_sel = Some(if r.chance(50) {
            Sel::Eq("team", "x")
        } else {
            Sel::Has("team")
        });
    }
    if r.chance(20) {
        e.nets.push(r.pick(&nets.list()));
    }
    if r.chance(15) {
        e.not_nets.push(r.pick(&nets.list()));
    }
    if ports && r.chance(60) {
        e.ports = (0..1 + r.below(2)).map(|_| PortSpec::random(r)).collect();
    }
    e
}

pub fn random_tern_rule(r: &mut Rng, nets: &Nets) -> TernRule {
    let action = r.pick(&[Act::Allow, Act::Allow, Act::Deny, Act::Pass, Act::Log]);
    let proto = r
        .chance(60)
        .then(|| r.pick(&[Protocol::Tcp, Protocol::Udp]));
    TernRule {
        action,
        proto,
        src: random_entity(r, false, nets),
        dst: random_entity(r, proto.is_some(), nets),
    }
}

pub fn random_policy(r: &mut Rng, i: usize, nets: &Nets) -> Pol {
    let dirs = r.pick(&[(true, false), (false, true), (true, true)]);
    let name = format!("p{i}");
    match r.below(3) {
        0 => {
            let rules = |r: &mut Rng| (0..r.below(3)).map(|_| random_k8s_rule(r, nets)).collect();
            Pol {
                kind: Kind::K8sNetworkPolicy,
                ns: Some(r.pick(&NAMESPACES)),
                name,
                body: Body::K8s {
                    pods: random_small_labels(r),
                    ingress: dirs.0.then(|| rules(r)),
                    egress: dirs.1.then(|| rules(r)),
                },
            }
        }
        k => {
            let rules = |r: &mut Rng| (0..r.below(4)).map(|_| random_tern_rule(r, nets)).collect();
            let global = k == 2;
            Pol {
                kind: if global {
                    Kind::GlobalNetworkPolicy
                } else {
                    Kind::NetworkPolicy
                },
                ns: (!global).then(|| r.pick(&NAMESPACES)),
                name,
                body: Body::Tern {
                    order: r.pick(&[None, Some(5.0), Some(10.0), Some(1000.0), Some(2000.0)]),
                    selector: Sel::random(r, 1),
                    ingress: dirs.0.then(|| rules(r)),
                    egress: dirs.1.then(|| rules(r)),
                },
            }
        }
    }
}

// ---- rendering as documents ----

pub fn port_json(p: &PortSpec) -> Value {
    match p {
        PortSpec::Range(a, b) if a == b => json!(a),
        PortSpec::Range(a, b) => json!(format!("{a}:{b}")),
        PortSpec::Named(n) => json!(n),
    }
}

pub fn k8s_rule_json(rule: &K8sRule, peer_key: &str) -> Value {
    let peers: Vec<Value> = rule
        .peers
        .iter()
        .map(|p| match p {
            Peer::Block(cidr, except) => json!({"ipBlock": {"cidr": cidr, "except": except}}),
            Peer::Pods { ns, pods } => {
                let mut m = serde_json::Map::new();
                if let Some(ns) = ns {
                    m.insert("namespaceSelector".into(), json!({"matchLabels": ns}));
                }
                if let Some(pods) = pods {
                    m.insert("podSelector".into(), json!({"matchLabels": pods}));
                }
                Value::Object(m)
            }
        })
        .collect();
    let ports: Vec<Value> = rule
        .ports
        .iter()
        .map(|(proto, port)| match port {
            None => json!({"protocol": proto_name(*proto)}),
            Some(PortSpec::Named(n)) => json!({"protocol": proto_name(*proto), "port": n}),
            Some(PortSpec::Range(a, b)) if a == b => {
                json!({"protocol": proto_name(*proto), "port": a})
            }
            Some(PortSpec::Range(a, b)) => {
                json!({"protocol": proto_name(*proto), "port": a, "endPort": b})
            }
        })
        .collect();
    json!({peer_key: peers, "ports": ports})
}

pub fn entity_json(e: &Entity) -> Value {
    let mut m = serde_json::Map::new();
    if let Some(s) = &e.sel {
        m.insert("selector".into(), json!(s.text()));
    }
    if let Some(s) = &e.ns_sel {
        m.insert("namespaceSelector".into(), json!(s.text()));
    }
    if !e.nets.is_empty() {
        m.insert("nets".into(), json!(e.nets));
    }
    if !e.not_nets.is_empty() {
        m.insert("notNets".into(), json!(e.not_nets));
    }
    if !e.ports.is_empty() {
        m.insert(
            "ports".into(),
            Value::Array(e.ports.iter().map(port_json).collect()),
        );
    }
    Value::Object(m)
}

pub fn policy_json(p: &Pol) -> Value {
    let mut meta = json!({"name": p.name});
    if let Some(ns) = p.ns {
        meta["namespace"] = json!(ns);
    }
    match &p.body {
        Body::K8s {
            pods,
            ingress,
            egress,
        } => {
            let mut types = Vec::new();
            let mut spec = json!({"podSelector": {"matchLabels": pods}});
            if let Some(rs) = ingress {
                types.push("Ingress");
                spec["ingress"] = rs.iter().map(|r| k8s_rule_json(r, "from")).collect();
            }
            if let Some(rs) = egress {
                types.push("Egress");
                spec["egress"] = rs.iter().map(|r| k8s_rule_json(r, "to")).collect();
            }
            spec["policyTypes"] = json!(types);
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": meta, "spec": spec})
        }
        Body::Tern {
            order,
            selector,
            ingress,
            egress,
        } => {
            let rule = |r: &TernRule| {
                let mut v = json!({
                    "action": format!("{:?}", r.action),
                    "source": entity_json(&r.src),
                    "destination": entity_json(&r.dst),
                });
                if let Some(p) = r.proto {
                    v["protocol"] = json!(proto_name(p));
                }
                v
            };
            let mut types = Vec::new();
            let mut spec = json!({"selector": selector.text()});
            if let Some(o) = order {
                spec["order"] = json!(o);
            }
            if let Some(rs) = ingress {
                types.push("Ingress");
                spec["ingress"] = rs.iter().map(rule).collect();
            }
            if let Some(rs) = egress {
                types.push("Egress");
                spec["egress"] = rs.iter().map(rule).collect();
            }
            spec["types"] = json!(types);
            json!({"apiVersion": "tern.dev/v1", "kind": p.kind.as_str(),
                   "metadata": meta, "spec": spec})
        }
    }
}

// ---- the independent evaluator ----

pub struct World {
    pub ns_labels: BTreeMap<&'static str, Labels>,
    pub pods: Vec<Pod>,
    pub pols: Vec<Pol>,
}

pub fn in_net(ip: Ipv4Addr, net: &str) -> bool {
    net.parse::<Ipv4Net>().unwrap().contains(&ip)
}

/// A policy's rules of `dir`, if it has that direction.
pub fn of_dir<'a, T>(
    dir: Direction,
    ingress: &'a Option<T>,
    egress: &'a Option<T>,
) -> Option<&'a T> {
    match dir {
        Direction::Ingress => ingress.as_ref(),
        Direction::Egress => egress.as_ref(),
    }
}

pub fn map_matches(sel: &Labels, l: &Labels) -> bool {
    sel.iter().all(|(k, v)| l.get(k) == Some(v))
}

/// What the evaluator found for one direction.
#[derive(Debug, PartialEq)]
pub enum Found {
    NoPolicy,
    DefaultDeny,
    /// Policy name, rule index, allowed.
    Rule(String, usize, bool),
}

/// A string of `'static` life (the generator's names and nets hold such; a few per run).
pub fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

impl World {
    /// The TCP flow from pod `i` to pod `j` on `port`.
    pub fn tcp_flow(&self, i: usize, j: usize, port: u16) -> Flow {
        Flow {
            src: self.pods[i].ip.into(),
            dst: self.pods[j].ip.into(),
            protocol: Protocol::Tcp,
            dst_port: port,
            icmp: None,
        }
    }

    pub fn pod_at(&self, ip: Ipv4Addr) -> Option<&Pod> {
        self.pods.iter().find(|p| p.ip == ip)
    }

    pub fn ns_of(&self, p: &Pod) -> &Labels {
        &self.ns_labels[p.ns]
    }

    pub fn port_ok(&self, spec: &PortSpec, proto: Protocol, port: u16, dst: Option<&Pod>) -> bool {
        match spec {
            PortSpec::Range(a, b) => (*a..=*b).contains(&port),
            PortSpec::Named(n) => dst.is_some_and(|d| {
                d.ports
                    .iter()
                    .any(|(pn, pp, pnum)| pn == n && *pp == proto && *pnum == port)
            }),
        }
    }

    /// Whether a Kubernetes rule of policy `pol` matches; `remote` is the other end.
    pub fn k8s_rule(
        &self,
        pol: &Pol,
        rule: &K8sRule,
        remote: Ipv4Addr,
        f: &Flow,
        dst: Option<&Pod>,
    ) -> bool {
        let peer_ok = rule.peers.is_empty()
            || rule.peers.iter().any(|peer| match peer {
                Peer::Block(cidr, except) => {
                    in_net(remote, cidr) && !except.iter().any(|e| in_net(remote, e))
                }
                Peer::Pods { ns, pods } => self.pod_at(remote).is_some_and(|rp| {
                    let ns_ok = match ns {
                        Some(sel) => map_matches(sel, self.ns_of(rp)),
                        None => Some(rp.ns) == pol.ns,
                    };
                    ns_ok && pods.as_ref().is_none_or(|s| map_matches(s, &rp.labels))
                }),
            });
        let port_ok = rule.ports.is_empty()
            || rule.ports.iter().any(|(proto, spec)| {
                *proto == f.protocol
                    && spec
                        .as_ref()
                        .is_none_or(|s| self.port_ok(s, f.protocol, f.dst_port, dst))
            });
        peer_ok && port_ok
    }

    pub fn entity(&self, pol: &Pol, e: &Entity, ip: Ipv4Addr, f: &Flow, dst: Option<&Pod>) -> bool {
        if e.sel.is_some() || e.ns_sel.is_some() {
            let Some(p) = self.pod_at(ip) else {
                return false;
            };
            let ns_ok = match &e.ns_sel {
                Some(s) => s.matches(self.ns_of(p)),
                None => pol.ns.is_none_or(|n| n == p.ns),
            };
            if !ns_ok || !e.sel.as_ref().is_none_or(|s| s.matches(&p.labels)) {
                return false;
            }
        }
        (e.nets.is_empty() || e.nets.iter().any(|n| in_net(ip, n)))
            && !e.not_nets.iter().any(|n| in_net(ip, n))
            && (e.ports.is_empty()
                || e.ports
                    .iter()
                    .any(|s| self.port_ok(s, f.protocol, f.dst_port, dst)))
    }

    pub fn selects(&self, pol: &Pol, p: &Pod, dir: Direction) -> bool {
        match &pol.body {
            Body::K8s {
                pods,
                ingress,
                egress,
            } => {
                of_dir(dir, ingress, egress).is_some()
                    && Some(p.ns) == pol.ns
                    && map_matches(pods, &p.labels)
            }
            Body::Tern {
                selector,
                ingress,
                egress,
                ..
            } => {
                of_dir(dir, ingress, egress).is_some()
                    && pol.ns.is_none_or(|n| n == p.ns)
                    && selector.matches(&p.labels)
            }
        }
    }

    pub fn order(pol: &Pol) -> f64 {
        match &pol.body {
            Body::K8s { .. } => 1000.0,
            Body::Tern { order, .. } => order.unwrap_or(f64::INFINITY),
        }
    }

    pub fn decide(&self, f: &Flow, dir: Direction) -> Found {
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (f.src, f.dst) else {
            unreachable!()
        };
        let at = if dir == Direction::Ingress { dst } else { src };
        let remote = if dir == Direction::Ingress { src } else { dst };
        let Some(pod) = self.pod_at(at) else {
            return Found::NoPolicy;
        };
        let dst_pod = self.pod_at(dst);
        let mut pols: Vec<&Pol> = self
            .pols
            .iter()
            .filter(|p| self.selects(p, pod, dir))
            .collect();
        if pols.is_empty() {
            return Found::NoPolicy;
        }
        pols.sort_by(|a, b| {
            World::order(a)
                .total_cmp(&World::order(b))
                .then((a.kind, a.ns, &a.name).cmp(&(b.kind, b.ns, &b.name)))
        });
        for pol in pols {
            match &pol.body {
                Body::K8s {
                    ingress, egress, ..
                } => {
                    let rules = of_dir(dir, ingress, egress).unwrap();
                    for (i, rule) in rules.iter().enumerate() {
                        if self.k8s_rule(pol, rule, remote, f, dst_pod) {
                            return Found::Rule(pol.name.clone(), i, true);
                        }
                    }
                }
                Body::Tern {
                    ingress, egress, ..
                } => {
                    let rules = of_dir(dir, ingress, egress).unwrap();
                    for (i, rule) in rules.iter().enumerate() {
                        let ok = rule.proto.is_none_or(|p| p == f.protocol)
                            && self.entity(pol, &rule.src, src, f, dst_pod)
                            && self.entity(pol, &rule.dst, dst, f, dst_pod);
                        match (ok, rule.action) {
                            (false, _) | (true, Act::Log) => {}
                            (true, Act::Deny) => return Found::Rule(pol.name.clone(), i, false),
                            (true, _) => return Found::Rule(pol.name.clone(), i, true),
                        }
                    }
                }
            }
        }
        Found::DefaultDeny
    }

    /// The policy named `name` (names are unique in a world).
    pub fn policy(&self, name: &str) -> &Pol {
        self.pols.iter().find(|p| p.name == name).unwrap()
    }

    /// The policies that select the endpoint of `dir`'s end of `f` in that direction.
    pub fn selecting(&self, f: &Flow, dir: Direction) -> Vec<&Pol> {
        let at = match dir {
            Direction::Ingress => f.dst,
            Direction::Egress => f.src,
        };
        let IpAddr::V4(at) = at else { unreachable!() };
        self.pod_at(at).map_or_else(Vec::new, |pod| {
            self.pols
                .iter()
                .filter(|p| self.selects(p, pod, dir))
                .collect()
        })
    }

    /// A direction's verdict and cause in a flow record's terms: allowed, the reason
    /// (`rule`, `default-deny`, `no-policy`) and the policies, sorted, as
    /// `Kind/namespace/name rule`: the deciding one with its rule (`ingress[0]`), or every
    /// selecting one (no rule) for a default deny.
    pub fn cause(&self, f: &Flow, dir: Direction) -> (bool, &'static str, Vec<String>) {
        let id = |p: &Pol, rule: &str| {
            format!(
                "{}/{}/{} {rule}",
                p.kind.as_str(),
                p.ns.unwrap_or(""),
                p.name
            )
        };
        let (allowed, reason, mut pols) = match self.decide(f, dir) {
            Found::NoPolicy => (true, "no-policy", vec![]),
            Found::DefaultDeny => (
                false,
                "default-deny",
                self.selecting(f, dir)
                    .into_iter()
                    .map(|p| id(p, ""))
                    .collect(),
            ),
            Found::Rule(name, i, allowed) => {
                let d = match dir {
                    Direction::Ingress => "ingress",
                    Direction::Egress => "egress",
                };
                (
                    allowed,
                    "rule",
                    vec![id(self.policy(&name), &format!("{d}[{i}]"))],
                )
            }
        };
        pols.sort();
        (allowed, reason, pols)
    }

    /// Whether `f` is allowed: by egress at its source and ingress at its destination.
    pub fn allowed(&self, f: &Flow) -> bool {
        [Direction::Egress, Direction::Ingress]
            .into_iter()
            .all(|d| {
                !matches!(
                    self.decide(f, d),
                    Found::DefaultDeny | Found::Rule(_, _, false)
                )
            })
    }
}

/// The namespaces' labels: `team` on some, and `kubernetes.io/metadata.name` as Kubernetes
/// sets it.
pub fn random_namespaces(r: &mut Rng) -> BTreeMap<&'static str, Labels> {
    NAMESPACES
        .iter()
        .map(|ns| {
            let mut l = Labels::new();
            if r.chance(60) {
                l.insert("team".into(), r.pick(&["x", "y"]).into());
            }
            l.insert("kubernetes.io/metadata.name".into(), ns.to_string());
            (*ns, l)
        })
        .collect()
}

/// Six pods, two per namespace, with random labels and named ports and the addresses of the
/// fixed layout ([`Nets::TABLE`]).
pub fn random_pods(r: &mut Rng) -> Vec<Pod> {
    (0..6)
        .map(|i| Pod {
            ns: NAMESPACES[i % 3],
            name: format!("pod{i}"),
            labels: random_labels(r),
            ip: Ipv4Addr::new(10, 1, (i % 3) as u8, 2 + (i / 3) as u8),
            ports: NAMED.iter().filter(|_| r.chance(40)).copied().collect(),
        })
        .collect()
}

/// One to five random policies, named `p0`, `p1`, ... (unique in a world).
pub fn random_policies(r: &mut Rng, nets: &Nets) -> Vec<Pol> {
    (0..1 + r.below(5))
        .map(|i| random_policy(r, i, nets))
        .collect()
}

/// A whole world on the fixed layout.
pub fn random_world(r: &mut Rng) -> World {
    let ns_labels = random_namespaces(r);
    let pods = random_pods(r);
    let pols = random_policies(r, &Nets::TABLE);
    World {
        ns_labels,
        pods,
        pols,
    }
}
