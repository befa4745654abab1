//! Named sets and verdict maps: their declarations and their elements.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::rule::{Family, PortRange, Span, Verdict};

/// A data type of a set key (one field of a concatenation) or of a map's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    /// A layer 4 protocol number.
    InetProto,
    /// A transport port.
    InetService,
    /// An interface name.
    Ifname,
    /// A verdict (map values only).
    Verdict,
}

impl DataType {
    /// The address type of a family.
    pub fn addr(family: Family) -> DataType {
        match family {
            Family::V4 => DataType::Ipv4Addr,
            Family::V6 => DataType::Ipv6Addr,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Ifname => "ifname",
            DataType::Verdict => "verdict",
        })
    }
}

/// The declaration of a named set or map: `type ipv4_addr . inet_service; flags interval;`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetType {
    /// The key's fields: one, or several for a concatenation.
    pub key: &'static [DataType],
    /// The type a map maps keys to; `None` for a set.
    pub data: Option<DataType>,
    /// `flags interval`: elements are ranges (prefixes, `a-b`).
    pub interval: bool,
    /// `auto-merge`: overlapping and adjacent ranges become one (nft merges them; so does
    /// tern's netlink encoding).
    pub auto_merge: bool,
}

impl SetType {
    /// `type ipv4_addr;` / `type ipv6_addr;`.
    pub fn addr(family: Family) -> SetType {
        SetType::of(match family {
            Family::V4 => &[DataType::Ipv4Addr],
            Family::V6 => &[DataType::Ipv6Addr],
        })
    }

    /// `type ipv4_addr . inet_service;`: an address and a port (the policy compiler's
    /// named-port sets).
    pub fn addr_port(family: Family) -> SetType {
        SetType::of(match family {
            Family::V4 => &[DataType::Ipv4Addr, DataType::InetService],
            Family::V6 => &[DataType::Ipv6Addr, DataType::InetService],
        })
    }

    /// `type ipv4_addr . inet_proto . inet_service; flags interval;`: ranges of addresses,
    /// protocols and ports ([`Key::AddrProtoPort`], the policy fast path's set).
    pub fn addr_proto_port(family: Family) -> SetType {
        SetType::of(match family {
            Family::V4 => &[
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ],
            Family::V6 => &[
                DataType::Ipv6Addr,
                DataType::InetProto,
                DataType::InetService,
            ],
        })
        .interval()
    }

    /// A set whose key has these fields, without flags.
    pub fn of(key: &'static [DataType]) -> SetType {
        SetType {
            key,
            data: None,
            interval: false,
            auto_merge: false,
        }
    }

    /// `type ifname : verdict;`.
    pub fn ifname_vmap() -> SetType {
        SetType {
            data: Some(DataType::Verdict),
            ..SetType::of(&[DataType::Ifname])
        }
    }

    /// The same type with `flags interval`.
    pub fn interval(self) -> SetType {
        SetType {
            interval: true,
            ..self
        }
    }

    /// The same type with `flags interval` and `auto-merge`.
    pub fn auto_merge(self) -> SetType {
        SetType {
            interval: true,
            auto_merge: true,
            ..self
        }
    }

    /// A map (`add map`), rather than a set.
    pub fn is_map(&self) -> bool {
        self.data.is_some()
    }

    /// `set` or `map`, as nft commands name it.
    pub fn noun(&self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }
}

impl fmt::Display for SetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("type ")?;
        for (i, t) in self.key.iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            write!(f, "{t}")?;
        }
        if let Some(d) = self.data {
            write!(f, " : {d}")?;
        }
        f.write_str(";")?;
        if self.interval {
            f.write_str(" flags interval;")?;
        }
        if self.auto_merge {
            f.write_str(" auto-merge;")?;
        }
        Ok(())
    }
}

/// An inclusive range of addresses of one family, written as nft writes it: `10.0.0.0/8` when
/// it is a prefix, `10.0.0.1` when it is one address, else `10.0.0.1-10.0.0.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddrRange {
    pub first: IpAddr,
    pub last: IpAddr,
}

/// An address as a number (IPv4 in the low 32 bits).
pub fn addr_bits(ip: &IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (addr_bits(&self.first), addr_bits(&self.last));
        if a == b {
            return write!(f, "{}", self.first);
        }
        let size = b.wrapping_sub(a);
        if size
            .checked_add(1)
            .is_some_and(|n| n.is_power_of_two() && a.is_multiple_of(n))
            || (a == 0 && b == u128::MAX)
        {
            let bits = if self.first.is_ipv4() { 32 } else { 128 };
            let prefix = bits - size.count_ones();
            return write!(f, "{}/{prefix}", self.first);
        }
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// The key of one element.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// One address: `10.0.0.1` (`type ipv4_addr` / `ipv6_addr` sets).
    Addr(IpAddr),
    /// A prefix of an interval set: `10.0.0.0/8`, written as given.
    Net(IpNet),
    /// `10.0.0.1 . 8080` (`addr . inet_service` sets).
    AddrPort(IpAddr, u16),
    /// `10.0.0.0/8 . 6 . 80-90`: ranges of addresses, protocols and ports (interval sets of
    /// `addr . inet_proto . inet_service`).
    AddrProtoPort {
        addr: AddrRange,
        proto: Span<u8>,
        port: PortRange,
    },
    /// `"veth1"`: an interface name (`type ifname`), at most 15 bytes.
    Ifname(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Addr(ip) => write!(f, "{ip}"),
            Key::Net(n) => write!(f, "{n}"),
            Key::AddrPort(ip, p) => write!(f, "{ip} . {p}"),
            Key::AddrProtoPort { addr, proto, port } => write!(f, "{addr} . {proto} . {port}"),
            Key::Ifname(n) => write!(f, "\"{n}\""),
        }
    }
}

/// One element: a key, and the verdict it maps to in a verdict map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Key,
    pub verdict: Option<Verdict>,
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.key)?;
        match &self.verdict {
            Some(v) => write!(f, " : {v}"),
            None => Ok(()),
        }
    }
}

/// A named set or map: its declaration and its elements (for a map, with their verdicts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub set_type: SetType,
    pub elements: BTreeMap<Key, Option<Verdict>>,
}

impl Set {
    /// An empty set or map of this type.
    pub fn new(set_type: SetType) -> Set {
        Set {
            set_type,
            elements: BTreeMap::new(),
        }
    }

    /// Adds an element of a set.
    pub fn insert(&mut self, key: Key) {
        self.elements.insert(key, None);
    }

    /// Adds (or replaces) an element of a map.
    pub fn insert_mapping(&mut self, key: Key, verdict: Verdict) {
        self.elements.insert(key, Some(verdict));
    }

    /// Whether the set holds an element with this key.
    pub fn contains(&self, key: &Key) -> bool {
        self.elements.contains_key(key)
    }

    /// The elements, in key order.
    pub fn iter(&self) -> impl Iterator<Item = Element> + '_ {
        self.elements.iter().map(|(k, v)| Element {
            key: k.clone(),
            verdict: v.clone(),
        })
    }
}
