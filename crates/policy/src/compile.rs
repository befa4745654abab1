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
//! - with flow records on ([`FlowLog`]; off by default, and the table is then exactly what it
//!   is without them): every rule that ends a direction's walk (a policy's Allow, Deny or
//!   Pass rule, the fast path, the endpoint chain's final drop) logs a tag
//!   ([`crate::flowtag`]) to the NFLOG group before its verdict, and local endpoints no policy
//!   selects in a direction get a map entry to one shared chain per direction
//!   (`flow-np-in`/`flow-np-out`) that logs `t:np:<i|e>` and then does what having no entry
//!   does (ingress: accept; egress: return to the base chain). Established packets never
//!   reach these rules, so each new connection logs once per direction at a local pod.

use std::collections::BTreeMap;

use sha1::{Digest, Sha1};
use tern_model::{Action, Port, Protocol};
use tern_nft::{
    Addr, AddrField, BaseChain, Chain, ChainPolicy, ChainType, CtState, Hook, IcmpField, Iface,
    Key, L4Proto, Match, PortRange, Rule, Ruleset, Set, SetType, Stmt, Verdict,
};

use crate::flowtag::{FlowTag, TagAction};
use crate::model::{
    Direction, Endpoint, EndpointSelector, IcmpMatch, IrPolicy, IrRule, Match as Side, PolicyKey,
    PolicySet,
};

/// Address family of a compiled set or rule.
pub use tern_nft::Family;

/// Packet mark bit meaning "a policy allowed this packet in the current direction".
pub const ALLOW_MARK: u32 = 0x0001_0000;
/// Name of the forward base chain.
pub const FORWARD_CHAIN: &str = "filter-forward";
/// Map from a pod's host interface to its ingress chain.
pub const INGRESS_MAP: &str = "ep-in";
/// Map from a pod's host interface to its egress chain.
pub const EGRESS_MAP: &str = "ep-out";

/// The shared chain of local endpoints no policy selects in the ingress direction (flow
/// records only).
pub const NO_POLICY_IN_CHAIN: &str = "flow-np-in";
/// The same for egress.
pub const NO_POLICY_OUT_CHAIN: &str = "flow-np-out";
/// How many bytes of a logged packet go to userspace: the network and transport headers (an
/// IPv4 header with options and the ports, or an IPv6 header and the ports), not the data.
pub const FLOW_SNAPLEN: u32 = 96;

/// Flow records: the NFLOG group each connection's first packet is logged to with its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLog {
    pub group: u16,
}

impl FlowLog {
    /// The statement logging `tag`.
    pub fn stmt(self, tag: &FlowTag) -> Stmt {
        Stmt::LogGroup {
            prefix: tag.to_string(),
            group: self.group,
            snaplen: FLOW_SNAPLEN,
        }
    }
}

/// `stmts` preceded by the log statement of `tag` when records are on.
fn logged(log: Option<FlowLog>, tag: impl FnOnce() -> FlowTag, stmts: Vec<Stmt>) -> Vec<Stmt> {
    match log {
        Some(l) => std::iter::once(l.stmt(&tag())).chain(stmts).collect(),
        None => stmts,
    }
}

/// The shared no-policy chain of a direction.
pub fn no_policy_chain_name(dir: Direction) -> &'static str {
    match dir {
        Direction::Ingress => NO_POLICY_IN_CHAIN,
        Direction::Egress => NO_POLICY_OUT_CHAIN,
    }
}

/// The shared no-policy chain of a direction: log, then what having no map entry does.
pub fn no_policy_chain(log: FlowLog, dir: Direction) -> Chain {
    let verdict = match dir {
        Direction::Ingress => Verdict::Accept,
        Direction::Egress => Verdict::Return,
    };
    Chain::regular(vec![Rule::new(
        Vec::new(),
        vec![log.stmt(&FlowTag::NoPolicy(dir)), Stmt::Verdict(verdict)],
    )])
}

/// Where a local endpoint's map entry for a direction jumps: its own chain when it has one,
/// the shared no-policy chain when records are on, else nowhere (no entry).
pub fn endpoint_target(
    ep: &Endpoint,
    dir: Direction,
    has_chain: bool,
    log: Option<FlowLog>,
) -> Option<String> {
    if has_chain {
        Some(endpoint_chain(ep, dir))
    } else {
        log.map(|_| no_policy_chain_name(dir).to_string())
    }
}

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
    pub fn elements(&self, set: &PolicySet, ep: &Endpoint) -> Vec<Key> {
        match self {
            SetSource::Selector(sel, fam) => {
                if !set.selects(sel, ep) {
                    return Vec::new();
                }
                ep.ips
                    .iter()
                    .filter(|ip| Family::of(ip) == *fam)
                    .map(|ip| Key::Addr(*ip))
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
                        out.push(Key::AddrPort(*ip, cp.port));
                    }
                }
                out
            }
        }
    }
}

/// The suffix of a family's set names: `v4` or `v6`.
pub(crate) fn family_suffix(fam: Family) -> &'static str {
    match fam {
        Family::V4 => "v4",
        Family::V6 => "v6",
    }
}

/// The protocol as `meta l4proto` matches it in a family, or `None` when it cannot occur
/// there (ICMP in IPv6, ICMPv6 in IPv4).
fn l4proto(p: Protocol, fam: Family) -> Option<L4Proto> {
    Some(match p {
        Protocol::Tcp => L4Proto::Tcp,
        Protocol::Udp => L4Proto::Udp,
        Protocol::Sctp => L4Proto::Sctp,
        Protocol::UdpLite => L4Proto::UdpLite,
        Protocol::Icmp if fam == Family::V4 => L4Proto::Icmp,
        Protocol::IcmpV6 if fam == Family::V6 => L4Proto::Icmpv6,
        Protocol::Icmp | Protocol::IcmpV6 => return None,
        Protocol::Number(n) => L4Proto::Number(n),
    })
}

fn port_range(p: &Port) -> Option<PortRange> {
    match p {
        Port::Range(a, b) => Some(PortRange::new(*a, *b)),
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
pub fn fast_path_set(
    dir: Direction,
    fam: Family,
    elements: &BTreeMap<Key, Option<Verdict>>,
) -> String {
    let d = match dir {
        Direction::Ingress => "in",
        Direction::Egress => "out",
    };
    // Endpoints sharing a name share the set, so the name must not collide for different
    // contents even when a policy author tries to: a cryptographic digest, not short_hash.
    // Over the elements' nft text in text order, so names stay what they were when the
    // elements were text.
    let mut texts: Vec<String> = elements.keys().map(ToString::to_string).collect();
    texts.sort_unstable();
    let mut h = Sha1::new();
    for k in &texts {
        h.update(k.as_bytes());
        h.update(b",");
    }
    let digest = h.finalize();
    format!(
        "fp-{d}-{}-{}",
        hex::encode(&digest[..16]),
        family_suffix(fam)
    )
}

/// What a local endpoint has in the table for one direction: its chain (`None` when no
/// policy applies: the endpoint is not filtered) and the fast-path sets the chain looks up.
pub struct EndpointParts {
    pub chain: Option<Chain>,
    pub sets: Vec<(String, Set)>,
}

/// The chain and fast-path sets of local endpoint `ep` for a direction, given the policies
/// that apply to it in evaluation order.
pub fn endpoint_parts(pols: &[&IrPolicy], dir: Direction, log: Option<FlowLog>) -> EndpointParts {
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
            Direction::Ingress => AddrField::Saddr,
            Direction::Egress => AddrField::Daddr,
        };
        fast.push(Match::AddrProtoDportInSet {
            addr: Addr { family: fam, field },
            set: name.clone(),
        });
        let set = Set {
            set_type: SetType::addr_proto_port(fam),
            elements,
        };
        sets.push((name, set));
    }
    EndpointParts {
        chain: endpoint_chain_rules(pols, dir, &fast, log),
        sets,
    }
}

/// The chain of a local endpoint for a direction, given the policies that apply to it in
/// evaluation order and the fast-path matches to try first; `None` when no policy applies (the
/// endpoint is not filtered).
pub fn endpoint_chain_rules(
    pols: &[&IrPolicy],
    dir: Direction,
    fast: &[Match],
    log: Option<FlowLog>,
) -> Option<Chain> {
    if pols.is_empty() {
        return None;
    }
    let verdict = |v| vec![Stmt::Verdict(v)];
    let fast_verdict = |v| logged(log, || FlowTag::FastPath(dir), vec![Stmt::Verdict(v)]);
    let jump = |p: &IrPolicy| Rule::verdict(Verdict::Jump(policy_chain(p, dir)));
    let mut rules = Vec::new();
    match dir {
        // Ingress: a policy that allows accepts the packet itself (nothing comes after the
        // receiver's ingress), so the chain is just the jumps: half the rules, and half the
        // jump graph the kernel re-validates when a chain is added.
        Direction::Ingress => {
            for m in fast {
                rules.push(Rule::new(vec![m.clone()], fast_verdict(Verdict::Accept)));
            }
            rules.extend(pols.iter().map(|p| jump(p)));
        }
        // Egress: an allowed packet goes back to the base chain, which checks the receiver's
        // ingress; the policy chain marks it and returns, and the mark ends the walk here.
        Direction::Egress => {
            rules.push(Rule::new(Vec::new(), vec![Stmt::MarkAnd(!ALLOW_MARK)]));
            for m in fast {
                rules.push(Rule::new(vec![m.clone()], fast_verdict(Verdict::Return)));
            }
            for p in pols {
                rules.push(jump(p));
                rules.push(Rule::new(
                    vec![Match::MarkAll(ALLOW_MARK)],
                    verdict(Verdict::Return),
                ));
            }
        }
    }
    rules.push(Rule::new(
        Vec::new(),
        logged(
            log,
            || FlowTag::DefaultDeny(dir),
            vec![Stmt::Verdict(Verdict::Drop)],
        ),
    ));
    Some(Chain::regular(rules))
}

/// The rules of the forward base chain. Conntrack is only asked for while some local endpoint
/// is filtered: a `ct` expression makes the kernel track every forwarded packet of the node,
/// which an unfiltered node should not pay for.
pub fn forward_rules(filtering: bool) -> Vec<Rule> {
    let mut rules = Vec::new();
    if filtering {
        rules.push(Rule::new(
            vec![Match::CtState(CtState::ESTABLISHED.or(CtState::RELATED))],
            vec![Stmt::Verdict(Verdict::Accept)],
        ));
        rules.push(Rule::new(
            vec![Match::CtState(CtState::INVALID)],
            vec![Stmt::Verdict(Verdict::Drop)],
        ));
    }
    for (iface, map) in [(Iface::In, EGRESS_MAP), (Iface::Out, INGRESS_MAP)] {
        rules.push(Rule::new(
            Vec::new(),
            vec![Stmt::Vmap {
                iface,
                map: map.to_string(),
            }],
        ));
    }
    rules
}

/// The forward base chain: hook forward, priority -5 (before the usual filter chains).
pub const FORWARD_BASE: BaseChain = BaseChain {
    chain_type: ChainType::Filter,
    hook: Hook::Forward,
    priority: -5,
    policy: ChainPolicy::Accept,
};

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
    compile_with(set, node, None)
}

/// [`compile()`] with flow records on (`log`) or off.
pub fn compile_with(set: &PolicySet, node: &str, log: Option<FlowLog>) -> Ruleset {
    let mut c = Compiler::new(set);
    c.log = log;
    c.base();
    let local: Vec<&Endpoint> = set
        .endpoints()
        .filter(|e| e.node == node && !e.interface.is_empty())
        .collect();
    let mut needed: BTreeMap<(String, Direction), (&IrPolicy, Direction)> = BTreeMap::new();
    for ep in local {
        for dir in [Direction::Ingress, Direction::Egress] {
            let pols = set.policies_for(ep, dir);
            let parts = endpoint_parts(&pols, dir, log);
            c.rs.sets.extend(parts.sets);
            let Some(chain) = parts.chain else {
                let target = endpoint_target(ep, dir, false, log);
                if let (Some(t), Some(m)) = (target, c.rs.sets.get_mut(endpoint_map(dir))) {
                    m.insert_mapping(Key::Ifname(ep.interface.clone()), Verdict::Jump(t));
                }
                continue;
            };
            for p in pols {
                needed.insert((policy_chain(p, dir), dir), (p, dir));
            }
            let name = endpoint_chain(ep, dir);
            c.rs.chains.insert(name.clone(), chain);
            if let Some(m) = c.rs.sets.get_mut(endpoint_map(dir)) {
                m.insert_mapping(Key::Ifname(ep.interface.clone()), Verdict::Jump(name));
            }
        }
    }
    for ((name, _), (p, dir)) in needed {
        let rules = c.policy_rules(p, dir);
        c.rs.chains.insert(name, Chain::regular(rules));
    }
    sync_forward_chain(&mut c.rs);
    c.rs
}

/// The compiler's working state; `used` records every set a compiled rule refers to.
pub(crate) struct Compiler<'a> {
    pub(crate) set: &'a PolicySet,
    pub(crate) rs: Ruleset,
    pub(crate) used: BTreeMap<String, SetSource>,
    /// Flow records on (the NFLOG group) or off.
    pub(crate) log: Option<FlowLog>,
}

impl<'a> Compiler<'a> {
    pub(crate) fn new(set: &'a PolicySet) -> Compiler<'a> {
        Compiler {
            set,
            rs: Ruleset::new(),
            used: BTreeMap::new(),
            log: None,
        }
    }

    pub(crate) fn base(&mut self) {
        self.rs.chains.insert(
            FORWARD_CHAIN.into(),
            Chain {
                base: Some(FORWARD_BASE),
                rules: forward_rules(false),
            },
        );
        for m in [INGRESS_MAP, EGRESS_MAP] {
            self.rs
                .sets
                .insert(m.into(), Set::new(SetType::ifname_vmap()));
        }
        if let Some(log) = self.log {
            for dir in [Direction::Ingress, Direction::Egress] {
                self.rs.chains.insert(
                    no_policy_chain_name(dir).to_string(),
                    no_policy_chain(log, dir),
                );
            }
        }
    }

    /// The address set of an endpoint selector for a family, created on first use.
    fn selector_set(&mut self, sel: &EndpointSelector, fam: Family) -> String {
        let name = format!(
            "sel-{}-{}",
            short_hash(&sel.canonical()),
            family_suffix(fam)
        );
        self.used
            .insert(name.clone(), SetSource::Selector(sel.clone(), fam));
        if !self.rs.sets.contains_key(&name) {
            let mut s = Set::new(SetType::addr(fam));
            for ep in self.set.endpoints_selected(sel) {
                for ip in ep.ips.iter().filter(|ip| Family::of(ip) == fam) {
                    s.insert(Key::Addr(*ip));
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
            family_suffix(fam)
        );
        self.used.insert(
            name.clone(),
            SetSource::NamedPort(port.to_string(), proto, fam),
        );
        if !self.rs.sets.contains_key(&name) {
            let mut s = Set::new(SetType::addr_port(fam));
            for ep in self.set.endpoints_with_port(port) {
                for cp in ep
                    .ports
                    .iter()
                    .filter(|cp| cp.name == port && cp.protocol == proto)
                {
                    for ip in ep.ips.iter().filter(|ip| Family::of(ip) == fam) {
                        s.insert(Key::AddrPort(*ip, cp.port));
                    }
                }
            }
            self.rs.sets.insert(name.clone(), s);
        }
        name
    }

    /// The matches of one side, or `None` when it cannot match in this family.
    fn side(&mut self, m: &Side, fam: Family, field: AddrField) -> Option<Vec<Match>> {
        let addr = Addr { family: fam, field };
        let mut out = Vec::new();
        if let Some(sel) = &m.endpoints {
            let set = self.selector_set(sel, fam);
            out.push(Match::AddrInSet {
                addr,
                negate: false,
                set,
            });
        }
        if !m.nets.is_empty() {
            let nets: Vec<_> = m
                .nets
                .iter()
                .filter(|n| Family::of_net(n) == fam)
                .copied()
                .collect();
            if nets.is_empty() {
                return None;
            }
            out.push(Match::AddrInNets {
                addr,
                negate: false,
                nets,
            });
        }
        let not: Vec<_> = m
            .not_nets
            .iter()
            .filter(|n| Family::of_net(n) == fam)
            .copied()
            .collect();
        if !not.is_empty() {
            out.push(Match::AddrInNets {
                addr,
                negate: true,
                nets: not,
            });
        } else if !m.not_nets.is_empty() && out.is_empty() {
            // notNets of the other family only: here the side excludes nothing, but the rule
            // must still match this family's packets alone. Without an address match an
            // `inet` rule matches the other family's packets too, and there it would act on
            // the very addresses its notNets exclude.
            let all = match fam {
                Family::V4 => ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
                Family::V6 => ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
            };
            out.push(Match::AddrInNets {
                addr,
                negate: false,
                nets: vec![all],
            });
        }
        Some(out)
    }

    pub(crate) fn policy_rules(&mut self, p: &IrPolicy, dir: Direction) -> Vec<Rule> {
        let mut out = Vec::new();
        let rules: Vec<IrRule> = p.rules(dir).unwrap_or_default().to_vec();
        let hash = short_hash(&p.key.to_string());
        for (i, r) in rules.iter().enumerate() {
            let tag = || FlowTag::Rule {
                policy_hash: hash.clone(),
                direction: dir,
                index: r.index,
                action: TagAction::of(r.action).unwrap_or(TagAction::Allow),
            };
            let verdict = match r.action {
                Action::Allow | Action::Pass if dir == Direction::Ingress => {
                    logged(self.log, tag, vec![Stmt::Verdict(Verdict::Accept)])
                }
                Action::Allow | Action::Pass => logged(
                    self.log,
                    tag,
                    vec![Stmt::MarkOr(ALLOW_MARK), Stmt::Verdict(Verdict::Return)],
                ),
                Action::Deny => logged(self.log, tag, vec![Stmt::Verdict(Verdict::Drop)]),
                Action::Log => vec![Stmt::Log {
                    prefix: format!(
                        "tern {}-{}{i}: ",
                        hash,
                        if dir == Direction::Ingress { "i" } else { "e" }
                    ),
                }],
            };
            for fam in [Family::V4, Family::V6] {
                let mut head = Vec::new();
                if let Some(pr) = r.protocol {
                    match l4proto(pr, fam) {
                        Some(p) => head.push(Match::L4Proto(p)),
                        None => continue,
                    }
                }
                let Some(src) = self.side(&r.src, fam, AddrField::Saddr) else {
                    continue;
                };
                let Some(dst) = self.side(&r.dst, fam, AddrField::Daddr) else {
                    continue;
                };
                head.extend(src);
                head.extend(dst);
                let v6 = fam == Family::V6;
                if let Some(m) = r.icmp {
                    head.extend(icmp_matches(m, v6));
                }
                let mut variants = Vec::new();
                if r.dst.ports.is_empty() {
                    variants.push(None);
                } else {
                    let nums: Vec<PortRange> = r.dst.ports.iter().filter_map(port_range).collect();
                    if !nums.is_empty() {
                        variants.push(Some(Match::DportIn(nums)));
                    }
                    for port in &r.dst.ports {
                        if let (Port::Named(n), Some(pr)) = (port, r.protocol) {
                            let set = self.named_port_set(n, pr, fam);
                            variants.push(Some(Match::AddrDportInSet {
                                addr: Addr::daddr(fam),
                                set,
                            }));
                        }
                    }
                }
                // notICMP {type, code} is "type != T or code != C": two disjoint rules,
                // `type != T` and `type T code != C`, so a Log rule logs a packet once.
                let not_icmp: Vec<Vec<Match>> = match r.not_icmp {
                    None => vec![Vec::new()],
                    Some(m) => not_icmp_variants(m, v6),
                };
                for v in variants {
                    for n in &not_icmp {
                        let mut matches = head.clone();
                        matches.extend(v.clone());
                        matches.extend(n.iter().cloned());
                        out.push(Rule::new(matches, verdict.clone()));
                    }
                }
            }
        }
        out
    }
}

/// One ICMP (v6: ICMPv6) header match: `icmp type T`, `icmp code != C`, ...
fn icmp_match(v6: bool, field: IcmpField, value: u8, negate: bool) -> Match {
    Match::Icmp {
        v6,
        field,
        negate,
        value,
    }
}

/// `icmp type T icmp code C` (v6: `icmpv6`), for the fields given.
fn icmp_matches(m: IcmpMatch, v6: bool) -> Vec<Match> {
    [(IcmpField::Type, m.icmp_type), (IcmpField::Code, m.code)]
        .into_iter()
        .filter_map(|(field, value)| Some(icmp_match(v6, field, value?, false)))
        .collect()
}

/// The disjoint alternatives of notICMP: `type != T`, and with a code `type T code != C`;
/// notICMP `{}` holds for no ICMP message, so no alternative.
fn not_icmp_variants(m: IcmpMatch, v6: bool) -> Vec<Vec<Match>> {
    let Some(t) = m.icmp_type else {
        return Vec::new();
    };
    let mut out = vec![vec![icmp_match(v6, IcmpField::Type, t, true)]];
    if let Some(c) = m.code {
        out.push(vec![
            icmp_match(v6, IcmpField::Type, t, false),
            icmp_match(v6, IcmpField::Code, c, true),
        ]);
    }
    out
}
