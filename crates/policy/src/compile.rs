//! Compiles a [`PolicySet`] into the desired `inet tern` [`Ruleset`] for one node.
//!
//! Layout:
//! - base chain `filter-forward` (hook forward, priority -5, before the usual filter chains):
//!   `ct state established,related accept`, `ct state invalid drop`, then
//!   `iifname vmap @ep-out` (egress of the sending local pod) and `oifname vmap @ep-in`
//!   (ingress of the receiving local pod). Traffic the node itself sends to its pods (kubelet
//!   probes) goes through the output hook, which tern does not filter, so it always passes.
//! - per selected local endpoint: `ep-in-<ifname>` / `ep-out-<ifname>`: the allow-only fast
//!   path lookup if any ([`crate::fastpath`]), then a jump to each applicable policy chain in
//!   order; the chain ends with `drop` (default deny). Ingress policy chains accept directly;
//!   egress ones set tern's mark bit ([`ALLOW_MARK`]) and return, and the egress chain, which
//!   clears the bit first, returns to the base chain as soon as it is set (the receiver's
//!   ingress is checked next). Endpoints no policy selects have no chain and no map entry, so
//!   they are not filtered.
//! - per policy and direction that a local endpoint's chain jumps to: `pol-<hash>-in|out`,
//!   compiled once and shared by all endpoints (a policy selecting no local endpoint has none).
//!   Allow/Pass accept (ingress) or mark and return (egress), Deny drops, Log logs and
//!   continues.
//! - per endpoint selector: address sets `sel-<hash>-v4|v6` of the matching endpoints'
//!   addresses (cluster-wide); per (named port, protocol): `np-<hash>-v4|v6` of
//!   `address . port`. Pods coming and going only change elements of these.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;
use sha1::{Digest, Sha1};
use tern_model::{Action, Port, Protocol};

use crate::model::{
    Direction, Endpoint, EndpointSelector, IrPolicy, IrRule, Match, PolicyKey, PolicySet,
};
use crate::nft::{Chain, Ruleset, Set};

/// Packet mark bit meaning "a policy allowed this packet in the current direction".
pub const ALLOW_MARK: u32 = 0x0001_0000;
/// Name of the forward base chain.
pub const FORWARD_CHAIN: &str = "filter-forward";
/// Map from a pod's host interface to its ingress chain.
pub const INGRESS_MAP: &str = "ep-in";
/// Map from a pod's host interface to its egress chain.
pub const EGRESS_MAP: &str = "ep-out";

/// A stable 48-bit FNV-1a hash in hex, for chain and set names derived from content.
pub fn short_hash(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

/// Name of a policy's chain for a direction.
pub fn policy_chain(p: &IrPolicy, dir: Direction) -> String {
    policy_key_chain(&p.key, dir)
}

/// Name of the chain of the policy with key `key` for a direction (a policy's chains are
/// named after its key alone).
pub fn policy_key_chain(key: &PolicyKey, dir: Direction) -> String {
    let d = match dir {
        Direction::Ingress => "in",
        Direction::Egress => "out",
    };
    format!("pol-{}-{d}", short_hash(&key.to_string()))
}

/// Name of an endpoint's chain for a direction.
pub fn endpoint_chain(ep: &Endpoint, dir: Direction) -> String {
    match dir {
        Direction::Ingress => format!("ep-in-{}", ep.interface),
        Direction::Egress => format!("ep-out-{}", ep.interface),
    }
}

/// Address family of a compiled set or rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

/// What a compiled address set holds, so its elements can be recomputed for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetSource {
    /// Addresses of the endpoints an endpoint selector matches.
    Selector(EndpointSelector, Family),
    /// `address . port` of the endpoints with a named port of this protocol.
    NamedPort(String, Protocol, Family),
}

impl SetSource {
    /// The elements `ep` contributes to the set.
    pub fn elements(&self, set: &PolicySet, ep: &Endpoint) -> Vec<String> {
        match self {
            SetSource::Selector(sel, fam) => {
                if !set.selects(sel, ep) {
                    return Vec::new();
                }
                ep.ips
                    .iter()
                    .filter(|ip| Family::of(ip) == *fam)
                    .map(ToString::to_string)
                    .collect()
            }
            SetSource::NamedPort(port, proto, fam) => {
                let mut out = Vec::new();
                for cp in ep
                    .ports
                    .iter()
                    .filter(|cp| &cp.name == port && cp.protocol == *proto)
                {
                    for ip in ep.ips.iter().filter(|ip| Family::of(ip) == *fam) {
                        out.push(format!("{ip} . {}", cp.port));
                    }
                }
                out
            }
        }
    }
}

impl Family {
    pub(crate) fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }
    pub(crate) fn of_net(n: &IpNet) -> Family {
        Family::of(&n.addr())
    }
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Family::V4 => "v4",
            Family::V6 => "v6",
        }
    }
    pub(crate) fn kw(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
    fn addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }
}

fn proto_name(p: Protocol, fam: Family) -> Option<String> {
    Some(match p {
        Protocol::Tcp => "tcp".into(),
        Protocol::Udp => "udp".into(),
        Protocol::Sctp => "sctp".into(),
        Protocol::UdpLite => "udplite".into(),
        Protocol::Icmp if fam == Family::V4 => "icmp".into(),
        Protocol::IcmpV6 if fam == Family::V6 => "ipv6-icmp".into(),
        Protocol::Icmp | Protocol::IcmpV6 => return None,
        Protocol::Number(n) => n.to_string(),
    })
}

fn port_text(p: &Port) -> Option<String> {
    match p {
        Port::Range(a, b) if a == b => Some(a.to_string()),
        Port::Range(a, b) => Some(format!("{a}-{b}")),
        Port::Named(_) => None,
    }
}

/// The map holding an endpoint's entry for a direction.
pub fn endpoint_map(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => INGRESS_MAP,
        Direction::Egress => EGRESS_MAP,
    }
}

/// Name of a fast-path set (see [`crate::fastpath`]) for a direction and family, derived from
/// its elements: endpoints whose policies give them the same fast path share one set, so a
/// pod like one already on the node adds no set (and its chain can go over netlink).
pub fn fast_path_set(dir: Direction, fam: Family, elements: &BTreeMap<String, String>) -> String {
    let d = match dir {
        Direction::Ingress => "in",
        Direction::Egress => "out",
    };
    // Endpoints sharing a name share the set, so the name must not collide for different
    // contents even when a policy author tries to: a cryptographic digest, not short_hash.
    let mut h = Sha1::new();
    for k in elements.keys() {
        h.update(k.as_bytes());
        h.update(b",");
    }
    let digest = h.finalize();
    format!("fp-{d}-{}-{}", hex::encode(&digest[..16]), fam.suffix())
}

/// What a local endpoint has in the table for one direction: its chain (`None` when no
/// policy applies: the endpoint is not filtered) and the fast-path sets the chain looks up.
pub struct EndpointParts {
    pub chain: Option<Chain>,
    pub sets: Vec<(String, Set)>,
}

/// The chain and fast-path sets of local endpoint `ep` for a direction, given the policies
/// that apply to it in evaluation order.
pub fn endpoint_parts(pols: &[&IrPolicy], dir: Direction) -> EndpointParts {
    let mut sets = Vec::new();
    let mut fast = Vec::new();
    for fam in [Family::V4, Family::V6] {
        if pols.is_empty() {
            break;
        }
        let elements = crate::fastpath::elements(pols, dir, fam);
        if elements.is_empty() {
            continue;
        }
        let name = fast_path_set(dir, fam, &elements);
        let field = match dir {
            Direction::Ingress => "saddr",
            Direction::Egress => "daddr",
        };
        fast.push(format!(
            "{} {field} . meta l4proto . th dport @{name}",
            fam.kw()
        ));
        let set = Set {
            spec: crate::fastpath::set_spec(fam),
            elements,
        };
        sets.push((name, set));
    }
    EndpointParts {
        chain: endpoint_chain_rules(pols, dir, &fast),
        sets,
    }
}

/// The chain of a local endpoint for a direction, given the policies that apply to it in
/// evaluation order and the fast-path matches to try first; `None` when no policy applies (the
/// endpoint is not filtered).
pub fn endpoint_chain_rules(pols: &[&IrPolicy], dir: Direction, fast: &[String]) -> Option<Chain> {
    if pols.is_empty() {
        return None;
    }
    let mut rules = Vec::new();
    match dir {
        // Ingress: a policy that allows accepts the packet itself (nothing comes after the
        // receiver's ingress), so the chain is just the jumps: half the rules, and half the
        // jump graph the kernel re-validates when a chain is added.
        Direction::Ingress => {
            for m in fast {
                rules.push(format!("{m} accept"));
            }
            for p in pols {
                rules.push(format!("jump {}", policy_chain(p, dir)));
            }
        }
        // Egress: an allowed packet goes back to the base chain, which checks the receiver's
        // ingress; the policy chain marks it and returns, and the mark ends the walk here.
        Direction::Egress => {
            rules.push(format!("meta mark set meta mark and {:#010x}", !ALLOW_MARK));
            for m in fast {
                rules.push(format!("{m} return"));
            }
            for p in pols {
                rules.push(format!("jump {}", policy_chain(p, dir)));
                rules.push(format!(
                    "meta mark and {ALLOW_MARK:#x} == {ALLOW_MARK:#x} return"
                ));
            }
        }
    }
    rules.push("drop".into());
    Some(Chain { base: None, rules })
}

/// The rules of the forward base chain. Conntrack is only asked for while some local endpoint
/// is filtered: a `ct` expression makes the kernel track every forwarded packet of the node,
/// which an unfiltered node should not pay for.
pub fn forward_rules(filtering: bool) -> Vec<String> {
    let mut rules = Vec::new();
    if filtering {
        rules.push("ct state established,related accept".into());
        rules.push("ct state invalid drop".into());
    }
    rules.push(format!("iifname vmap @{EGRESS_MAP}"));
    rules.push(format!("oifname vmap @{INGRESS_MAP}"));
    rules
}

/// Sets the forward chain's rules from whether any endpoint map has an entry; true if they
/// changed.
pub fn sync_forward_chain(rs: &mut Ruleset) -> bool {
    let filtering = [INGRESS_MAP, EGRESS_MAP]
        .iter()
        .any(|m| rs.sets.get(*m).is_some_and(|s| !s.elements.is_empty()));
    match rs.chains.get_mut(FORWARD_CHAIN) {
        Some(c) => {
            let want = forward_rules(filtering);
            if c.rules == want {
                false
            } else {
                c.rules = want;
                true
            }
        }
        None => false,
    }
}

/// Compiles everything: `node` picks the local endpoints that get chains and map entries. A
/// policy's chain for a direction is present only when some local endpoint's chain jumps to it
/// (the policy selects a local endpoint and has rules for that direction), and so are the
/// address sets its rules use; those sets cover endpoints of every node.
pub fn compile(set: &PolicySet, node: &str) -> Ruleset {
    let mut c = Compiler::new(set);
    c.base();
    let local: Vec<&Endpoint> = set
        .endpoints()
        .filter(|e| e.node == node && !e.interface.is_empty())
        .collect();
    let mut needed: BTreeMap<(String, Direction), (&IrPolicy, Direction)> = BTreeMap::new();
    for ep in local {
        for dir in [Direction::Ingress, Direction::Egress] {
            let pols = set.policies_for(ep, dir);
            let parts = endpoint_parts(&pols, dir);
            c.rs.sets.extend(parts.sets);
            let Some(chain) = parts.chain else {
                continue;
            };
            for p in pols {
                needed.insert((policy_chain(p, dir), dir), (p, dir));
            }
            let name = endpoint_chain(ep, dir);
            c.rs.chains.insert(name.clone(), chain);
            if let Some(m) = c.rs.sets.get_mut(endpoint_map(dir)) {
                m.insert_mapping(format!("\"{}\"", ep.interface), &format!("jump {name}"));
            }
        }
    }
    for ((name, _), (p, dir)) in needed {
        let rules = c.policy_rules(p, dir);
        c.rs.chains.insert(name, Chain { base: None, rules });
    }
    sync_forward_chain(&mut c.rs);
    c.rs
}

/// The compiler's working state; `used` records every set a compiled rule refers to.
pub(crate) struct Compiler<'a> {
    pub(crate) set: &'a PolicySet,
    pub(crate) rs: Ruleset,
    pub(crate) used: BTreeMap<String, SetSource>,
}

impl<'a> Compiler<'a> {
    pub(crate) fn new(set: &'a PolicySet) -> Compiler<'a> {
        Compiler {
            set,
            rs: Ruleset::new(),
            used: BTreeMap::new(),
        }
    }

    pub(crate) fn base(&mut self) {
        self.rs.chains.insert(
            FORWARD_CHAIN.into(),
            Chain {
                base: Some("type filter hook forward priority -5; policy accept;".into()),
                rules: forward_rules(false),
            },
        );
        for m in [INGRESS_MAP, EGRESS_MAP] {
            self.rs
                .sets
                .insert(m.into(), Set::new("type ifname : verdict;"));
        }
    }

    /// The address set of an endpoint selector for a family, created on first use.
    fn selector_set(&mut self, sel: &EndpointSelector, fam: Family) -> String {
        let name = format!("sel-{}-{}", short_hash(&sel.canonical()), fam.suffix());
        self.used
            .insert(name.clone(), SetSource::Selector(sel.clone(), fam));
        if !self.rs.sets.contains_key(&name) {
            let mut s = Set::new(format!("type {};", fam.addr_type()));
            for ep in self.set.endpoints_selected(sel) {
                for ip in ep.ips.iter().filter(|ip| Family::of(ip) == fam) {
                    s.insert(ip.to_string());
                }
            }
            self.rs.sets.insert(name.clone(), s);
        }
        name
    }

    /// The `address . port` set of a named port for a protocol and family.
    fn named_port_set(&mut self, port: &str, proto: Protocol, fam: Family) -> String {
        let name = format!(
            "np-{}-{}",
            short_hash(&format!("{port}/{}", proto.number())),
            fam.suffix()
        );
        self.used.insert(
            name.clone(),
            SetSource::NamedPort(port.to_string(), proto, fam),
        );
        if !self.rs.sets.contains_key(&name) {
            let mut s = Set::new(format!("type {} . inet_service;", fam.addr_type()));
            for ep in self.set.endpoints_with_port(port) {
                for cp in ep
                    .ports
                    .iter()
                    .filter(|cp| cp.name == port && cp.protocol == proto)
                {
                    for ip in ep.ips.iter().filter(|ip| Family::of(ip) == fam) {
                        s.insert(format!("{ip} . {}", cp.port));
                    }
                }
            }
            self.rs.sets.insert(name.clone(), s);
        }
        name
    }

    /// Match text of one side, or `None` when it cannot match in this family.
    fn side(&mut self, m: &Match, fam: Family, field: &str) -> Option<String> {
        let kw = fam.kw();
        let mut out = String::new();
        if let Some(sel) = &m.endpoints {
            let s = self.selector_set(sel, fam);
            let _ = write!(out, " {kw} {field} @{s}");
        }
        if !m.nets.is_empty() {
            let nets: Vec<String> = m
                .nets
                .iter()
                .filter(|n| Family::of_net(n) == fam)
                .map(ToString::to_string)
                .collect();
            if nets.is_empty() {
                return None;
            }
            let _ = write!(out, " {kw} {field} {{ {} }}", nets.join(", "));
        }
        let not: Vec<String> = m
            .not_nets
            .iter()
            .filter(|n| Family::of_net(n) == fam)
            .map(ToString::to_string)
            .collect();
        if !not.is_empty() {
            let _ = write!(out, " {kw} {field} != {{ {} }}", not.join(", "));
        }
        Some(out)
    }

    pub(crate) fn policy_rules(&mut self, p: &IrPolicy, dir: Direction) -> Vec<String> {
        let mut out = Vec::new();
        let rules: Vec<IrRule> = p.rules(dir).unwrap_or_default().to_vec();
        for (i, r) in rules.iter().enumerate() {
            let verdict = match r.action {
                Action::Allow | Action::Pass if dir == Direction::Ingress => "accept".into(),
                Action::Allow | Action::Pass => {
                    format!("meta mark set meta mark or {ALLOW_MARK:#x} return")
                }
                Action::Deny => "drop".into(),
                Action::Log => format!(
                    "log prefix \"tern {}-{}{i}: \"",
                    short_hash(&p.key.to_string()),
                    if dir == Direction::Ingress { "i" } else { "e" }
                ),
            };
            for fam in [Family::V4, Family::V6] {
                let proto = match r.protocol {
                    Some(pr) => match proto_name(pr, fam) {
                        Some(n) => format!(" meta l4proto {n}"),
                        None => continue,
                    },
                    None => String::new(),
                };
                let Some(src) = self.side(&r.src, fam, "saddr") else {
                    continue;
                };
                let Some(dst) = self.side(&r.dst, fam, "daddr") else {
                    continue;
                };
                let head = format!("{proto}{src}{dst}");
                let mut variants = Vec::new();
                if r.dst.ports.is_empty() {
                    variants.push(String::new());
                } else {
                    let nums: Vec<String> = r.dst.ports.iter().filter_map(port_text).collect();
                    if !nums.is_empty() {
                        variants.push(format!(" th dport {{ {} }}", nums.join(", ")));
                    }
                    for port in &r.dst.ports {
                        if let (Port::Named(n), Some(pr)) = (port, r.protocol) {
                            let s = self.named_port_set(n, pr, fam);
                            variants.push(format!(" {} daddr . th dport @{s}", fam.kw()));
                        }
                    }
                }
                for v in variants {
                    let text = format!("{head}{v} {verdict}");
                    out.push(text.trim_start().to_string());
                }
            }
        }
        out
    }
}
