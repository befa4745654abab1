//! Rules: the matches, statements and verdicts tern's chains are made of.
//!
//! A [`Rule`] is matches, then statements, then an optional comment, each rendered as nft
//! writes it and joined by single spaces: `meta l4proto tcp ip saddr @sel-x-v4 th dport { 80 }
//! accept`. The variants are the shapes the policy compiler, its fast path and natOutgoing
//! produce; a new shape is a new variant here, with its text and its netlink encoding
//! (`tern_linux::nft_netlink`) added together.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// Address family of an address match or set: `ip` (IPv4) or `ip6` (IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The family of a prefix.
    pub fn of_net(n: &IpNet) -> Family {
        Family::of(&n.addr())
    }

    /// The payload keyword: `ip` or `ip6`.
    pub fn keyword(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

/// Which address of the network header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddrField {
    /// `saddr`.
    Saddr,
    /// `daddr`.
    Daddr,
}

/// An address of the network header: `ip saddr`, `ip6 daddr`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    pub family: Family,
    pub field: AddrField,
}

impl Addr {
    /// `ip saddr` / `ip6 saddr`.
    pub fn saddr(family: Family) -> Addr {
        Addr {
            family,
            field: AddrField::Saddr,
        }
    }

    /// `ip daddr` / `ip6 daddr`.
    pub fn daddr(family: Family) -> Addr {
        Addr {
            family,
            field: AddrField::Daddr,
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = match self.field {
            AddrField::Saddr => "saddr",
            AddrField::Daddr => "daddr",
        };
        write!(f, "{} {field}", self.family.keyword())
    }
}

/// A layer 4 protocol as `meta l4proto` compares it: a name nft knows, or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Proto {
    Tcp,
    Udp,
    Sctp,
    UdpLite,
    Icmp,
    /// `ipv6-icmp`.
    Icmpv6,
    /// Any protocol by number, written as the number.
    Number(u8),
}

impl L4Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
            L4Proto::Sctp => 132,
            L4Proto::UdpLite => 136,
            L4Proto::Icmp => 1,
            L4Proto::Icmpv6 => 58,
            L4Proto::Number(n) => n,
        }
    }
}

impl fmt::Display for L4Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            L4Proto::Tcp => f.write_str("tcp"),
            L4Proto::Udp => f.write_str("udp"),
            L4Proto::Sctp => f.write_str("sctp"),
            L4Proto::UdpLite => f.write_str("udplite"),
            L4Proto::Icmp => f.write_str("icmp"),
            L4Proto::Icmpv6 => f.write_str("ipv6-icmp"),
            L4Proto::Number(n) => write!(f, "{n}"),
        }
    }
}

/// An inclusive range of values, written `first` when it holds one value, else
/// `first-last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span<T> {
    pub first: T,
    pub last: T,
}

impl<T: Copy> Span<T> {
    /// The range holding `v` alone.
    pub fn one(v: T) -> Span<T> {
        Span { first: v, last: v }
    }

    /// The range `first..=last`.
    pub fn new(first: T, last: T) -> Span<T> {
        Span { first, last }
    }
}

impl<T: fmt::Display + PartialEq> fmt::Display for Span<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Transport ports, inclusive.
pub type PortRange = Span<u16>;

/// Connection tracking states (`ct state`), as the kernel's bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CtState(pub u32);

impl CtState {
    pub const INVALID: CtState = CtState(1);
    pub const ESTABLISHED: CtState = CtState(2);
    pub const RELATED: CtState = CtState(4);
    pub const NEW: CtState = CtState(8);
    pub const UNTRACKED: CtState = CtState(64);

    /// Both sets of states.
    pub const fn or(self, other: CtState) -> CtState {
        CtState(self.0 | other.0)
    }
}

impl fmt::Display for CtState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (CtState::INVALID, "invalid"),
            (CtState::ESTABLISHED, "established"),
            (CtState::RELATED, "related"),
            (CtState::NEW, "new"),
            (CtState::UNTRACKED, "untracked"),
        ];
        let mut first = true;
        for (bit, name) in names {
            if self.0 & bit.0 != 0 {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

/// The interface a packet came in on or goes out of (`iifname` / `oifname`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Iface {
    In,
    Out,
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Iface::In => "iifname",
            Iface::Out => "oifname",
        })
    }
}

/// A verdict: of a rule, or what a verdict map maps a key to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Accept,
    Drop,
    Continue,
    Return,
    Jump(String),
    Goto(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// One match of a rule: the packet goes on to the next part of the rule only if it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `meta l4proto tcp`.
    L4Proto(L4Proto),
    /// `ip saddr @set`, `ip6 daddr != @set`: the address is (not) in a named set.
    AddrInSet {
        addr: Addr,
        negate: bool,
        set: String,
    },
    /// `ip saddr { 10.0.0.0/8, 10.9.0.0/16 }`, `ip saddr != { ... }`: the address is (not) in
    /// one of the prefixes (an anonymous set; at least one prefix).
    AddrInNets {
        addr: Addr,
        negate: bool,
        nets: Vec<IpNet>,
    },
    /// `th dport { 80, 8000-8090 }`: the transport destination port is in one of the ranges
    /// (an anonymous set; at least one range).
    DportIn(Vec<PortRange>),
    /// `ip daddr . th dport @set`: address and destination port in a named set of
    /// `addr . inet_service`.
    AddrDportInSet { addr: Addr, set: String },
    /// `ip saddr . meta l4proto . th dport @set`: address, protocol and destination port in a
    /// named interval set of `addr . inet_proto . inet_service`.
    AddrProtoDportInSet { addr: Addr, set: String },
    /// `icmp type 8`, `icmpv6 code != 0`: a byte of the ICMP (v6 when `v6`) header, type at
    /// transport offset 0, code at 1; after a `meta l4proto` match of that protocol.
    Icmp {
        v6: bool,
        field: IcmpField,
        negate: bool,
        value: u8,
    },
    /// `meta mark and BITS == BITS`: every bit of `BITS` is set in the packet mark.
    MarkAll(u32),
    /// `ct state established,related`: the connection is in one of the states.
    CtState(CtState),
}

/// The ICMP header byte an [`Match::Icmp`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcmpField {
    /// Offset 0.
    Type,
    /// Offset 1.
    Code,
}

impl IcmpField {
    /// The byte's offset in the ICMP / ICMPv6 header.
    pub fn offset(self) -> u32 {
        match self {
            IcmpField::Type => 0,
            IcmpField::Code => 1,
        }
    }
}

fn join<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{x}")?;
    }
    Ok(())
}

fn not(negate: bool) -> &'static str {
    if negate { "!= " } else { "" }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::L4Proto(p) => write!(f, "meta l4proto {p}"),
            Match::AddrInSet { addr, negate, set } => write!(f, "{addr} {}@{set}", not(*negate)),
            Match::AddrInNets { addr, negate, nets } => {
                write!(f, "{addr} {}{{ ", not(*negate))?;
                join(f, nets)?;
                f.write_str(" }")
            }
            Match::DportIn(ports) => {
                f.write_str("th dport { ")?;
                join(f, ports)?;
                f.write_str(" }")
            }
            Match::AddrDportInSet { addr, set } => write!(f, "{addr} . th dport @{set}"),
            Match::AddrProtoDportInSet { addr, set } => {
                write!(f, "{addr} . meta l4proto . th dport @{set}")
            }
            Match::Icmp {
                v6,
                field,
                negate,
                value,
            } => write!(
                f,
                "{} {} {}{value}",
                if *v6 { "icmpv6" } else { "icmp" },
                match field {
                    IcmpField::Type => "type",
                    IcmpField::Code => "code",
                },
                not(*negate)
            ),
            Match::MarkAll(bits) => write!(f, "meta mark and {bits:#x} == {bits:#x}"),
            Match::CtState(s) => write!(f, "ct state {s}"),
        }
    }
}

/// One statement of a rule, run in order once every match held.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `meta mark set meta mark and MASK`: clears the bits not in `MASK`.
    MarkAnd(u32),
    /// `meta mark set meta mark or BITS`: sets `BITS`.
    MarkOr(u32),
    /// `log prefix "PREFIX"`.
    Log { prefix: String },
    /// `log prefix "PREFIX" group GROUP snaplen SNAPLEN`: the packet's first `snaplen` bytes
    /// and the prefix to userspace through NFLOG group `group` (the flow records' tag).
    LogGroup {
        prefix: String,
        group: u16,
        snaplen: u32,
    },
    /// `masquerade`.
    Masquerade,
    /// `iifname vmap @map`: the verdict the map holds for the interface, if any.
    Vmap { iface: Iface, map: String },
    /// A verdict: `accept`, `jump CHAIN`, ...
    Verdict(Verdict),
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stmt::MarkAnd(mask) => write!(f, "meta mark set meta mark and {mask:#010x}"),
            Stmt::MarkOr(bits) => write!(f, "meta mark set meta mark or {bits:#x}"),
            Stmt::Log { prefix } => write!(f, "log prefix \"{prefix}\""),
            Stmt::LogGroup {
                prefix,
                group,
                snaplen,
            } => write!(f, "log prefix \"{prefix}\" group {group} snaplen {snaplen}"),
            Stmt::Masquerade => f.write_str("masquerade"),
            Stmt::Vmap { iface, map } => write!(f, "{iface} vmap @{map}"),
            Stmt::Verdict(v) => write!(f, "{v}"),
        }
    }
}

/// A rule: its matches, its statements, and a comment kept with it in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmts: Vec<Stmt>,
    pub comment: Option<String>,
}

impl Rule {
    /// A rule of matches and statements.
    pub fn new(matches: Vec<Match>, stmts: Vec<Stmt>) -> Rule {
        Rule {
            matches,
            stmts,
            comment: None,
        }
    }

    /// A rule that is only a verdict: `drop`, `jump CHAIN`.
    pub fn verdict(v: Verdict) -> Rule {
        Rule::new(Vec::new(), vec![Stmt::Verdict(v)])
    }

    /// The same rule with a comment.
    pub fn with_comment(mut self, comment: impl Into<String>) -> Rule {
        self.comment = Some(comment.into());
        self
    }

    /// The chains this rule jumps or goes to.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.stmts.iter().filter_map(|s| match s {
            Stmt::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) => Some(c.as_str()),
            _ => None,
        })
    }

    /// The named sets and maps this rule looks up.
    pub fn lookups(&self) -> impl Iterator<Item = &str> {
        let matches = self.matches.iter().filter_map(|m| match m {
            Match::AddrInSet { set, .. }
            | Match::AddrDportInSet { set, .. }
            | Match::AddrProtoDportInSet { set, .. } => Some(set.as_str()),
            _ => None,
        });
        let maps = self.stmts.iter().filter_map(|s| match s {
            Stmt::Vmap { map, .. } => Some(map.as_str()),
            _ => None,
        });
        matches.chain(maps)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            if first {
                first = false;
                Ok(())
            } else {
                f.write_str(" ")
            }
        };
        for m in &self.matches {
            sep(f)?;
            write!(f, "{m}")?;
        }
        for s in &self.stmts {
            sep(f)?;
            write!(f, "{s}")?;
        }
        if let Some(c) = &self.comment {
            sep(f)?;
            write!(f, "comment \"{c}\"")?;
        }
        Ok(())
    }
}
