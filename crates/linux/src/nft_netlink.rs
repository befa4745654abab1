//! nftables set-element, chain and simple rule updates over NETLINK_NETFILTER, without
//! spawning `nft`.
//!
//! `nft -f` loads the whole table into its cache before it commits anything, which costs tens of
//! milliseconds with thousands of chains. A pod joining a selected set only needs
//! `add element inet tern sel-... { 10.0.0.7 }`: this module sends exactly that to the kernel as
//! one nfnetlink batch (one transaction: all changes or none), so the cost no longer depends on
//! the size of the table.
//!
//! Supported keys (the set types tern's policy compiler declares): IPv4 / IPv6 addresses,
//! intervals (a start element plus an end element flagged `NFT_SET_ELEM_INTERVAL_END`, as
//! `nft` encodes them), concatenations `ipv4_addr . inet_service` / `ipv6_addr . inet_service`
//! (each field padded to 4 bytes, the port in network order), and interface names (16 bytes,
//! NUL padded) mapped to a verdict (`jump chain`).
//!
//! Chains and rules: [`TableOp`] adds, flushes and deletes regular chains and appends rules of
//! the few shapes tern's per-endpoint chains are made of ([`Rule`]: mark bit clear / test,
//! jump, verdict, the fast-path `addr . l4proto . dport` set lookup), encoded as the same
//! expressions `nft` sends (`meta`, `bitwise`, `cmp`, `payload`, `byteorder`, `lookup`,
//! `immediate`). A local pod that policies select thus reaches the kernel in one batch too.
//! Policy chains (set lookups, ports, logging) stay `nft`'s job.
//!
//! Semantics are idempotent: adding an element that exists and deleting one that does not are
//! not errors. A missing table or set is ([`LinuxError::NotFound`]).
//!
//! Like the rtnetlink [`crate::netlink::Handle`], an [`NftSocket`] talks to the network
//! namespace of the thread that created it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};

use ipnet::IpNet;

use crate::error::{LinuxError, Result};

mod batch;
mod elems;
mod expr;
use crate::netlink::framing::{
    Answer, MsgBuilder, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLMSG_ERROR, open_bound,
    parse_datagram, recv_retrying, send_all,
};

/// `NFPROTO_INET`: the family of `inet` tables.
pub const NFPROTO_INET: u8 = 1;

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSET: u8 = 9;
const NFT_MSG_GETSET: u8 = 10;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_DELSETELEM: u8 = 14;

const NFT_MSG_NEWCHAIN: u8 = 3;
const NFT_MSG_DELCHAIN: u8 = 5;
const NFT_MSG_NEWRULE: u8 = 6;
const NFT_MSG_DELRULE: u8 = 8;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_META_SREG: u16 = 3;
const NFT_META_MARK: u32 = 3;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFT_CMP_EQ: u32 = 0;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_SET_ELEM_INTERVAL_END: u32 = 1;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// Interface name keys are `IFNAMSIZ` bytes.
const IFNAMSIZ: usize = 16;
/// Elements per message: the element list is one attribute, whose length is a u16.
const MAX_ELEMENTS_PER_MSG: usize = 256;
/// How long to wait for the kernel's answer to a batch, in seconds.
const REPLY_TIMEOUT_SECS: libc::time_t = 5;

/// The key of one set element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// One address (`type ipv4_addr` / `ipv6_addr` without `flags interval`).
    Addr(IpAddr),
    /// A prefix of an interval set (`flags interval`); a single address is a /32 or /128.
    Interval(IpNet),
    /// `ipv4_addr . inet_service` or `ipv6_addr . inet_service`.
    AddrPort(IpAddr, u16),
    /// An interface name (`type ifname`), at most 15 bytes.
    Ifname(String),
}

/// The verdict a map element maps its key to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `continue`.
    Continue,
    /// `return`.
    Return,
    /// `jump CHAIN`.
    Jump(String),
    /// `goto CHAIN`.
    Goto(String),
}

/// One set element, or one map element when `verdict` is set.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    /// The key.
    pub key: Key,
    /// The verdict of a verdict map's element; `None` for set elements.
    pub verdict: Option<Verdict>,
}

/// Whether a change adds or deletes its element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementOp {
    /// `add element` (no error when it already exists).
    Add,
    /// `delete element` (no error when it is already gone).
    Delete,
}

/// One element added to or deleted from a named set of the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ElementChange {
    /// The set (or map) name.
    pub set: String,
    /// Add or delete.
    pub op: ElementOp,
    /// The element.
    pub element: Element,
}

/// A rule of the shapes tern's per-endpoint chains are made of, which this module encodes
/// without `nft`. [`Rule::parse`] reads exactly the text `nft` accepts for them and `Display`
/// writes it back, so a compiled chain is sent over netlink only when every one of its rules is
/// one of these; anything else goes through `nft -f`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `meta mark set meta mark and MASK`: clear mark bits.
    MarkAnd(u32),
    /// `meta mark and BITS == BITS VERDICT`: the verdict when all of `BITS` are set.
    MarkTest {
        /// Bits that must all be set.
        bits: u32,
        /// What happens then.
        verdict: Verdict,
    },
    /// A bare verdict: `drop`, `accept`, `jump CHAIN`, ...
    Verdict(Verdict),
    /// `ip saddr . meta l4proto . th dport @SET VERDICT` (`ip6`, `daddr` likewise): the
    /// lookup of tern's allow-only fast-path set.
    AddrProtoPortLookup {
        /// `ip6` rather than `ip`.
        v6: bool,
        /// `daddr` rather than `saddr`.
        daddr: bool,
        /// The set.
        set: String,
        /// What happens on a hit.
        verdict: Verdict,
    },
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

impl Rule {
    /// Parses one rule as written in an nft chain, or `None` if it is not one of the shapes
    /// of [`Rule`].
    pub fn parse(text: &str) -> Option<Rule> {
        let w: Vec<&str> = text.split_whitespace().collect();
        match w.as_slice() {
            ["meta", "mark", "set", "meta", "mark", "and", m] => Some(Rule::MarkAnd(parse_u32(m)?)),
            ["meta", "mark", "and", a, "==", b, v @ ..] => {
                let bits = parse_u32(a)?;
                (parse_u32(b)? == bits).then_some(())?;
                Some(Rule::MarkTest {
                    bits,
                    verdict: Verdict::parse(v)?,
                })
            }
            [
                fam,
                field,
                ".",
                "meta",
                "l4proto",
                ".",
                "th",
                "dport",
                set,
                v @ ..,
            ] => Some(Rule::AddrProtoPortLookup {
                v6: match *fam {
                    "ip" => false,
                    "ip6" => true,
                    _ => return None,
                },
                daddr: match *field {
                    "saddr" => false,
                    "daddr" => true,
                    _ => return None,
                },
                set: set.strip_prefix('@').filter(|n| !n.is_empty())?.to_string(),
                verdict: Verdict::parse(v)?,
            }),
            v => Verdict::parse(v).map(Rule::Verdict),
        }
    }

    fn encode(&self, b: &mut Batch) -> Result<()> {
        b.begin_nest(NFTA_RULE_EXPRESSIONS);
        match self {
            Rule::MarkAnd(mask) => {
                expr_meta_load(b, NFT_META_MARK)?;
                expr_bitwise(b, *mask)?;
                expr(b, "meta", |b| {
                    b.attr(NFTA_META_KEY, &NFT_META_MARK.to_be_bytes());
                    b.attr(NFTA_META_SREG, &NFT_REG_1.to_be_bytes());
                    Ok(())
                })?;
            }
            Rule::MarkTest { bits, verdict } => {
                expr_meta_load(b, NFT_META_MARK)?;
                expr_bitwise(b, *bits)?;
                expr(b, "cmp", |b| {
                    b.attr(NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes());
                    b.attr(NFTA_CMP_OP, &NFT_CMP_EQ.to_be_bytes());
                    b.begin_nest(NFTA_CMP_DATA);
                    // The mark sits in the register in host byte order.
                    b.attr(NFTA_DATA_VALUE, &bits.to_ne_bytes());
                    b.end_nest();
                    Ok(())
                })?;
                expr_verdict(b, verdict)?;
            }
            Rule::Verdict(v) => expr_verdict(b, v)?,
            Rule::AddrProtoPortLookup {
                v6,
                daddr,
                set,
                verdict,
            } => {
                // As nft encodes it in an inet table: the family check `ip saddr` implies,
                // then the three fields in consecutive 32-bit registers, then the lookup.
                let (nfproto, offset, len) = match (v6, daddr) {
                    (false, false) => (NFPROTO_IPV4, 12, 4),
                    (false, true) => (NFPROTO_IPV4, 16, 4),
                    (true, false) => (NFPROTO_IPV6, 8, 16),
                    (true, true) => (NFPROTO_IPV6, 24, 16),
                };
                expr_meta_load(b, NFT_META_NFPROTO)?;
                expr(b, "cmp", |b| {
                    b.attr(NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes());
                    b.attr(NFTA_CMP_OP, &NFT_CMP_EQ.to_be_bytes());
                    b.begin_nest(NFTA_CMP_DATA);
                    b.attr(NFTA_DATA_VALUE, &[nfproto]);
                    b.end_nest();
                    Ok(())
                })?;
                let words = len / 4;
                expr_payload(b, reg32(0), NFT_PAYLOAD_NETWORK_HEADER, offset, len)?;
                let proto = reg32(words);
                expr(b, "meta", |b| {
                    b.attr(NFTA_META_DREG, &proto.to_be_bytes());
                    b.attr(NFTA_META_KEY, &NFT_META_L4PROTO.to_be_bytes());
                    Ok(())
                })?;
                // A no-op (len / size = 0 words), but nft emits it for a protocol in an
                // interval concatenation; kept so the kernel holds exactly nft's rule.
                expr(b, "byteorder", |b| {
                    b.attr(NFTA_BYTEORDER_SREG, &proto.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_DREG, &proto.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_OP, &NFT_BYTEORDER_HTON.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_LEN, &1u32.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_SIZE, &2u32.to_be_bytes());
                    Ok(())
                })?;
                expr_payload(b, reg32(words + 1), NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)?;
                expr(b, "lookup", |b| {
                    b.attr_str(NFTA_LOOKUP_SET, set);
                    b.attr(NFTA_LOOKUP_SREG, &NFT_REG_1.to_be_bytes());
                    Ok(())
                })?;
                expr_verdict(b, verdict)?;
            }
        }
        b.end_nest();
        Ok(())
    }
}

/// The register holding 32-bit word `i` of the register file, named as nft names it: a
/// 16-byte register (`NFT_REG_1`..) when the word starts one, else `NFT_REG32_nn`.
fn reg32(i: u32) -> u32 {
    if i.is_multiple_of(4) {
        NFT_REG_1 + i / 4
    } else {
        8 + i
    }
}

/// `payload load LEN @ BASE + OFFSET => DREG`.
fn expr_payload(b: &mut Batch, dreg: u32, base: u32, offset: u32, len: u32) -> Result<()> {
    expr(b, "payload", |b| {
        b.attr(NFTA_PAYLOAD_DREG, &dreg.to_be_bytes());
        b.attr(NFTA_PAYLOAD_BASE, &base.to_be_bytes());
        b.attr(NFTA_PAYLOAD_OFFSET, &offset.to_be_bytes());
        b.attr(NFTA_PAYLOAD_LEN, &len.to_be_bytes());
        Ok(())
    })
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::MarkAnd(m) => write!(f, "meta mark set meta mark and {m:#010x}"),
            Rule::MarkTest { bits, verdict } => {
                write!(f, "meta mark and {bits:#x} == {bits:#x} {verdict}")
            }
            Rule::Verdict(v) => write!(f, "{v}"),
            Rule::AddrProtoPortLookup {
                v6,
                daddr,
                set,
                verdict,
            } => write!(
                f,
                "{} {} . meta l4proto . th dport @{set} {verdict}",
                if *v6 { "ip6" } else { "ip" },
                if *daddr { "daddr" } else { "saddr" }
            ),
        }
    }
}

/// One expression of a rule: `NFTA_LIST_ELEM { name, data { ... } }`.
fn expr(b: &mut Batch, name: &str, data: impl FnOnce(&mut Batch) -> Result<()>) -> Result<()> {
    b.begin_nest(NFTA_LIST_ELEM);
    b.attr_str(NFTA_EXPR_NAME, name);
    b.begin_nest(NFTA_EXPR_DATA);
    data(b)?;
    b.end_nest();
    b.end_nest();
    Ok(())
}

/// `meta load KEY => reg 1`.
fn expr_meta_load(b: &mut Batch, key: u32) -> Result<()> {
    expr(b, "meta", |b| {
        b.attr(NFTA_META_DREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_META_KEY, &key.to_be_bytes());
        Ok(())
    })
}

/// `reg 1 = (reg 1 & mask) ^ 0` over 4 bytes.
fn expr_bitwise(b: &mut Batch, mask: u32) -> Result<()> {
    expr(b, "bitwise", |b| {
        b.attr(NFTA_BITWISE_SREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_BITWISE_DREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_BITWISE_LEN, &4u32.to_be_bytes());
        b.begin_nest(NFTA_BITWISE_MASK);
        b.attr(NFTA_DATA_VALUE, &mask.to_ne_bytes());
        b.end_nest();
        b.begin_nest(NFTA_BITWISE_XOR);
        b.attr(NFTA_DATA_VALUE, &0u32.to_ne_bytes());
        b.end_nest();
        Ok(())
    })
}

/// `immediate reg 0 VERDICT`.
fn expr_verdict(b: &mut Batch, v: &Verdict) -> Result<()> {
    expr(b, "immediate", |b| {
        b.attr(NFTA_IMMEDIATE_DREG, &NFT_REG_VERDICT.to_be_bytes());
        b.begin_nest(NFTA_IMMEDIATE_DATA);
        encode_verdict(b, v)?;
        b.end_nest();
        Ok(())
    })
}

/// One change of a table, as [`NftSocket::apply_ops`] applies them in order in one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TableOp {
    /// Add or delete a set / map element.
    Element(ElementChange),
    /// Create a regular chain (no error when it exists).
    AddChain(String),
    /// Delete every rule of a chain.
    FlushChain(String),
    /// Delete a chain and its rules; nothing may still jump to it.
    DeleteChain(String),
    /// Append a rule to a chain.
    AddRule {
        /// The chain.
        chain: String,
        /// The rule.
        rule: Rule,
    },
}

impl std::fmt::Display for TableOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableOp::Element(c) => {
                let verb = match c.op {
                    ElementOp::Add => "add",
                    ElementOp::Delete => "delete",
                };
                write!(f, "{verb} element {} {{ {} }}", c.set, c.element)
            }
            TableOp::AddChain(c) => write!(f, "add chain {c}"),
            TableOp::FlushChain(c) => write!(f, "flush chain {c}"),
            TableOp::DeleteChain(c) => write!(f, "delete chain {c}"),
            TableOp::AddRule { chain, rule } => write!(f, "add rule {chain} {rule}"),
        }
    }
}

/// The set types this module can update, recognised from a set's nft declaration body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    /// `type ipv4_addr;` or `type ipv6_addr;`, optionally `flags interval;`.
    Addr {
        /// IPv6 rather than IPv4.
        v6: bool,
        /// `flags interval`.
        interval: bool,
    },
    /// `type ipv4_addr . inet_service;` or `type ipv6_addr . inet_service;`.
    AddrPort {
        /// IPv6 rather than IPv4.
        v6: bool,
    },
    /// `type ifname : verdict;`.
    IfnameVerdict,
}

impl SetKind {
    /// Recognises a declaration body such as `type ipv4_addr; flags interval;`. Anything with
    /// other flags or options (`auto-merge`, `timeout`, ...) is `None`: those need `nft`'s own
    /// logic (auto-merge happens in `nft`, not in the kernel).
    pub fn from_spec(spec: &str) -> Option<SetKind> {
        let stmts: Vec<String> = spec
            .split(';')
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|s| !s.is_empty())
            .collect();
        let (ty, rest) = stmts.split_first()?;
        let interval = match rest {
            [] => false,
            [f] if f == "flags interval" => true,
            _ => return None,
        };
        let kind = match ty.as_str() {
            "type ipv4_addr" => SetKind::Addr {
                v6: false,
                interval,
            },
            "type ipv6_addr" => SetKind::Addr { v6: true, interval },
            "type ipv4_addr . inet_service" if !interval => SetKind::AddrPort { v6: false },
            "type ipv6_addr . inet_service" if !interval => SetKind::AddrPort { v6: true },
            "type ifname : verdict" if !interval => SetKind::IfnameVerdict,
            _ => return None,
        };
        Some(kind)
    }

    /// Parses an element as nft writes it in this kind of set: `10.0.0.1`, `10.0.0.0/24`
    /// (interval sets), `10.0.0.1 . 8080`, `"veth1" : jump ep-in-veth1`.
    pub fn parse_element(&self, text: &str) -> Result<Element> {
        let bad = |why: &str| LinuxError::InvalidArgument(format!("set element {text:?}: {why}"));
        let text = text.trim();
        let family_ok = |ip: &IpAddr, v6: bool| ip.is_ipv6() == v6;
        match *self {
            SetKind::Addr { v6, interval } => {
                let key = if interval {
                    let net: IpNet = match text.parse::<IpAddr>() {
                        Ok(ip) => IpNet::from(ip),
                        Err(_) => text.parse().map_err(|_| bad("not an address or prefix"))?,
                    };
                    if !family_ok(&net.addr(), v6) {
                        return Err(bad("wrong address family for the set"));
                    }
                    Key::Interval(net.trunc())
                } else {
                    let ip: IpAddr = text.parse().map_err(|_| bad("not an address"))?;
                    if !family_ok(&ip, v6) {
                        return Err(bad("wrong address family for the set"));
                    }
                    Key::Addr(ip)
                };
                Ok(Element { key, verdict: None })
            }
            SetKind::AddrPort { v6 } => {
                let (a, p) = text
                    .split_once(" . ")
                    .ok_or_else(|| bad("expected `address . port`"))?;
                let ip: IpAddr = a.trim().parse().map_err(|_| bad("not an address"))?;
                if !family_ok(&ip, v6) {
                    return Err(bad("wrong address family for the set"));
                }
                let port: u16 = p.trim().parse().map_err(|_| bad("not a port number"))?;
                Ok(Element {
                    key: Key::AddrPort(ip, port),
                    verdict: None,
                })
            }
            SetKind::IfnameVerdict => {
                let (k, v) = text
                    .split_once(" : ")
                    .ok_or_else(|| bad("expected `\"ifname\" : verdict`"))?;
                let name = k.trim().trim_matches('"');
                if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('\0') {
                    return Err(bad("interface name must be 1-15 bytes"));
                }
                let words: Vec<&str> = v.split_whitespace().collect();
                let verdict = Verdict::parse(&words).ok_or_else(|| bad("unknown verdict"))?;
                Ok(Element {
                    key: Key::Ifname(name.to_string()),
                    verdict: Some(verdict),
                })
            }
        }
    }
}

impl Verdict {
    /// Parses a verdict statement split into words: `accept`, `jump CHAIN`, ...
    pub fn parse(words: &[&str]) -> Option<Verdict> {
        Some(match words {
            ["accept"] => Verdict::Accept,
            ["drop"] => Verdict::Drop,
            ["continue"] => Verdict::Continue,
            ["return"] => Verdict::Return,
            ["jump", c] => Verdict::Jump(c.to_string()),
            ["goto", c] => Verdict::Goto(c.to_string()),
            _ => return None,
        })
    }

    /// The kernel's verdict code and target chain.
    fn code(&self) -> (i32, Option<&str>) {
        match self {
            Verdict::Accept => (NF_ACCEPT, None),
            Verdict::Drop => (NF_DROP, None),
            Verdict::Continue => (NFT_CONTINUE, None),
            Verdict::Return => (NFT_RETURN, None),
            Verdict::Jump(c) => (NFT_JUMP, Some(c)),
            Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Accept => write!(f, "accept"),
            Verdict::Drop => write!(f, "drop"),
            Verdict::Continue => write!(f, "continue"),
            Verdict::Return => write!(f, "return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Key::Addr(ip) => write!(f, "{ip}")?,
            Key::Interval(n) => write!(f, "{n}")?,
            Key::AddrPort(ip, p) => write!(f, "{ip} . {p}")?,
            Key::Ifname(n) => write!(f, "\"{n}\"")?,
        }
        match &self.verdict {
            None => Ok(()),
            Some(v) => write!(f, " : {v}"),
        }
    }
}

fn ip_octets(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The first address after `net`, or `None` when `net` reaches the end of the address space
/// (then the interval is open-ended and nft sends no end element either).
fn interval_end(net: &IpNet) -> Option<IpAddr> {
    match net {
        IpNet::V4(n) => {
            let size = 1u64 << (32 - n.prefix_len());
            let end = u64::from(u32::from(n.network())) + size;
            u32::try_from(end)
                .ok()
                .map(|e| IpAddr::V4(Ipv4Addr::from(e)))
        }
        IpNet::V6(n) => {
            let start = u128::from(n.network());
            let end = if n.prefix_len() == 0 {
                None
            } else {
                start.checked_add(1u128 << (128 - n.prefix_len()))
            };
            end.map(|e| IpAddr::V6(Ipv6Addr::from(e)))
        }
    }
}

/// One kernel entry: key bytes, `NFTA_SET_ELEM_FLAGS`, verdict.
type Entry<'a> = (Vec<u8>, u32, Option<&'a Verdict>);

/// The kernel entries of one element. An interval is a start entry plus (unless open-ended)
/// an end entry.
fn entries(e: &Element) -> Result<Vec<Entry<'_>>> {
    Ok(match &e.key {
        Key::Addr(ip) => vec![(ip_octets(ip), 0, e.verdict.as_ref())],
        Key::Interval(net) => {
            let net = net.trunc();
            let mut v = vec![(ip_octets(&net.network()), 0, e.verdict.as_ref())];
            if let Some(end) = interval_end(&net) {
                v.push((ip_octets(&end), NFT_SET_ELEM_INTERVAL_END, None));
            }
            v
        }
        Key::AddrPort(ip, port) => {
            let mut k = ip_octets(ip);
            // Each concatenated field is padded to 4 bytes; the port is big-endian.
            k.extend_from_slice(&port.to_be_bytes());
            k.extend_from_slice(&[0, 0]);
            vec![(k, 0, e.verdict.as_ref())]
        }
        Key::Ifname(name) => {
            if name.is_empty() || name.len() >= IFNAMSIZ {
                return Err(LinuxError::InvalidArgument(format!(
                    "interface name {name:?} must be 1-15 bytes"
                )));
            }
            let mut k = name.as_bytes().to_vec();
            k.resize(IFNAMSIZ, 0);
            vec![(k, 0, e.verdict.as_ref())]
        }
    })
}

/// nfnetlink messages are built on the framing core's builder; a batch is several messages in
/// one buffer, sent as one datagram.
type Batch = MsgBuilder;

/// Starts an nfnetlink message: the netlink header, then `struct nfgenmsg` (family, version 0,
/// res_id big-endian).
fn begin(b: &mut Batch, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
    let [r0, r1] = res_id.to_be_bytes();
    b.begin(msg_type, flags, seq).raw(&[family, 0, r0, r1]); // 0: NFNETLINK_V0
}

/// One NEWSETELEM / DELSETELEM message of a batch: a run of changes of one set and op.
#[derive(Debug, Clone)]
struct Group<'a> {
    set: &'a str,
    op: ElementOp,
    elements: Vec<&'a Element>,
}

fn groups(changes: &[ElementChange]) -> Vec<Group<'_>> {
    let mut out: Vec<Group<'_>> = Vec::new();
    for c in changes {
        match out.last_mut() {
            Some(g)
                if g.set == c.set && g.op == c.op && g.elements.len() < MAX_ELEMENTS_PER_MSG =>
            {
                g.elements.push(&c.element)
            }
            _ => out.push(Group {
                set: &c.set,
                op: c.op,
                elements: vec![&c.element],
            }),
        }
    }
    out
}

/// One message of a batch.
#[derive(Debug, Clone)]
enum Msg<'a> {
    /// NEWSETELEM / DELSETELEM of a run of element changes.
    Elements(Group<'a>),
    /// A chain or rule operation.
    Table(&'a TableOp),
}

/// The messages of `ops`: consecutive element changes of one set and op share a message.
fn messages(ops: &[TableOp]) -> Vec<Msg<'_>> {
    let mut out: Vec<Msg<'_>> = Vec::new();
    for op in ops {
        let TableOp::Element(c) = op else {
            out.push(Msg::Table(op));
            continue;
        };
        match out.last_mut() {
            Some(Msg::Elements(g))
                if g.set == c.set && g.op == c.op && g.elements.len() < MAX_ELEMENTS_PER_MSG =>
            {
                g.elements.push(&c.element)
            }
            _ => out.push(Msg::Elements(Group {
                set: &c.set,
                op: c.op,
                elements: vec![&c.element],
            })),
        }
    }
    out
}

fn encode_msg(b: &mut Batch, seq: u32, flags: u16, table: &str, m: &Msg<'_>) -> Result<()> {
    let op = match m {
        Msg::Elements(g) => return encode_group(b, seq, flags, table, g),
        Msg::Table(op) => op,
    };
    let (kind, extra, chain) = match op {
        TableOp::Element(_) => unreachable!("element changes are grouped"),
        TableOp::AddChain(c) => (NFT_MSG_NEWCHAIN, NLM_F_CREATE, c),
        TableOp::DeleteChain(c) => (NFT_MSG_DELCHAIN, 0, c),
        TableOp::FlushChain(c) => (NFT_MSG_DELRULE, 0, c),
        TableOp::AddRule { chain, .. } => (NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, chain),
    };
    begin(
        b,
        (NFNL_SUBSYS_NFTABLES << 8) | u16::from(kind),
        flags | extra,
        seq,
        NFPROTO_INET,
        0,
    );
    match op {
        TableOp::AddChain(_) | TableOp::DeleteChain(_) => {
            b.attr_str(NFTA_CHAIN_TABLE, table);
            b.attr_str(NFTA_CHAIN_NAME, chain);
        }
        TableOp::FlushChain(_) => {
            // DELRULE without a handle removes every rule of the chain.
            b.attr_str(NFTA_RULE_TABLE, table);
            b.attr_str(NFTA_RULE_CHAIN, chain);
        }
        TableOp::AddRule { rule, .. } => {
            b.attr_str(NFTA_RULE_TABLE, table);
            b.attr_str(NFTA_RULE_CHAIN, chain);
            rule.encode(b)?;
        }
        TableOp::Element(_) => {}
    }
    // Surfaces an attribute that did not fit as the error of this message.
    b.end();
    b.check()
}

fn describe_msg(m: &Msg<'_>, table: &str) -> String {
    match m {
        Msg::Elements(g) => describe(g, table),
        Msg::Table(op) => format!("{op} (table inet {table})"),
    }
}

fn describe(g: &Group<'_>, table: &str) -> String {
    let verb = match g.op {
        ElementOp::Add => "add",
        ElementOp::Delete => "delete",
    };
    let shown: Vec<String> = g.elements.iter().take(3).map(ToString::to_string).collect();
    let more = if g.elements.len() > 3 {
        format!(", ... ({} elements)", g.elements.len())
    } else {
        String::new()
    };
    format!(
        "{verb} element inet {table} {} {{ {}{more} }}",
        g.set,
        shown.join(", ")
    )
}

fn encode_group(b: &mut Batch, seq: u32, flags: u16, table: &str, g: &Group<'_>) -> Result<()> {
    let (kind, extra) = match g.op {
        ElementOp::Add => (NFT_MSG_NEWSETELEM, NLM_F_CREATE),
        ElementOp::Delete => (NFT_MSG_DELSETELEM, 0),
    };
    begin(
        b,
        (NFNL_SUBSYS_NFTABLES << 8) | u16::from(kind),
        flags | extra,
        seq,
        NFPROTO_INET,
        0,
    );
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, g.set);
    b.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
    for e in &g.elements {
        for (key, eflags, verdict) in entries(e)? {
            b.begin_nest(NFTA_LIST_ELEM);
            b.begin_nest(NFTA_SET_ELEM_KEY);
            b.attr(NFTA_DATA_VALUE, &key);
            b.end_nest();
            if eflags != 0 {
                b.attr(NFTA_SET_ELEM_FLAGS, &eflags.to_be_bytes());
            }
            // Deletes are matched by key: the kernel ignores (and nft omits) the data.
            if let (Some(v), ElementOp::Add) = (verdict, g.op) {
                b.begin_nest(NFTA_SET_ELEM_DATA);
                encode_verdict(b, v)?;
                b.end_nest();
            }
            b.end_nest();
        }
    }
    b.end_nest();
    // Surfaces an attribute that did not fit as the error of this message.
    b.end();
    b.check()
}

/// `NFTA_DATA_VERDICT { code, chain }` (inside an element's data or an immediate's data).
fn encode_verdict(b: &mut Batch, v: &Verdict) -> Result<()> {
    let (code, chain) = v.code();
    b.begin_nest(NFTA_DATA_VERDICT);
    b.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
    if let Some(c) = chain {
        b.attr_str(NFTA_VERDICT_CHAIN, c);
    }
    b.end_nest();
    Ok(())
}

/// A blocking NETLINK_NETFILTER socket in the network namespace of the creating thread.
pub struct NftSocket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl NftSocket {
    /// Opens and binds the socket (needs CAP_NET_ADMIN to change anything).
    pub fn new() -> Result<NftSocket> {
        let fd = open_bound(libc::NETLINK_NETFILTER, "nfnetlink")?;
        // A lost answer must not hang the agent: time out and let the caller fall back.
        let tv = libc::timeval {
            tv_sec: REPLY_TIMEOUT_SECS,
            tv_usec: 0,
        };
        // SAFETY: valid fd; pointer and length describe `tv`.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(LinuxError::last_os("set nfnetlink receive timeout"));
        }
        Ok(NftSocket {
            fd,
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn send(&self, bytes: &[u8], context: &str) -> Result<()> {
        // A batch is one datagram: big ones need a send buffer to match. SO_SNDBUFFORCE
        // (CAP_NET_ADMIN, which changing nftables needs anyway) goes past wmem_max; without it,
        // best effort.
        if bytes.len() > 128 * 1024 {
            let size = libc::c_int::try_from(bytes.len() * 2).unwrap_or(libc::c_int::MAX);
            for opt in [libc::SO_SNDBUFFORCE, libc::SO_SNDBUF] {
                // SAFETY: valid fd; pointer and length describe `size`.
                let rc = unsafe {
                    libc::setsockopt(
                        self.fd.as_raw_fd(),
                        libc::SOL_SOCKET,
                        opt,
                        (&size as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                if rc == 0 {
                    break;
                }
            }
        }
        send_all(&self.fd, bytes)
            .map_err(|err| LinuxError::io(format!("{context}: send nfnetlink batch"), err))
    }

    /// Receives datagrams, handing every NLMSG_ERROR (ack or error) to `each` by sequence
    /// number, until `each` says the exchange is complete. Other messages go to `other`.
    fn receive(
        &mut self,
        context: &str,
        each: &mut dyn FnMut(u32, Answer) -> bool,
        other: &mut dyn FnMut(u32, u16),
    ) -> Result<()> {
        loop {
            let n = recv_retrying(&self.fd, &mut self.buf).map_err(|err| {
                LinuxError::io(format!("{context}: receive nfnetlink answer"), err)
            })?;
            for m in parse_datagram(&self.buf[..n], &|| context.to_string())? {
                if m.msg_type != NLMSG_ERROR {
                    other(m.seq, m.msg_type);
                    continue;
                }
                if each(m.seq, Answer::decode(&m, &|| context.to_string())?) {
                    return Ok(());
                }
            }
        }
    }

    /// True when set `set` of table `inet table` exists.
    pub fn set_exists(&mut self, table: &str, set: &str) -> Result<bool> {
        let context = format!("look up set inet {table} {set}");
        let seq = self.next_seq();
        let mut b = Batch::batch();
        begin(
            &mut b,
            (NFNL_SUBSYS_NFTABLES << 8) | u16::from(NFT_MSG_GETSET),
            NLM_F_ACK,
            seq,
            NFPROTO_INET,
            0,
        );
        b.attr_str(NFTA_SET_TABLE, table);
        b.attr_str(NFTA_SET_NAME, set);
        self.send(b.finish()?, &context)?;
        let mut found = false;
        let mut answer = None;
        self.receive(
            &context,
            &mut |s, a| {
                if s == seq {
                    answer = Some(a);
                    true
                } else {
                    false
                }
            },
            &mut |s, t| {
                if s == seq && t == (NFNL_SUBSYS_NFTABLES << 8) | u16::from(NFT_MSG_NEWSET) {
                    found = true;
                }
            },
        )?;
        match answer {
            Some(Answer { errno: 0, .. }) => Ok(found),
            Some(Answer { errno, .. }) if errno == libc::ENOENT => Ok(false),
            Some(a) => Err(a.into_error(context)),
            None => Err(LinuxError::Malformed(format!("{context}: no answer"))),
        }
    }

    /// Sends one batch of the groups; returns the kernel's answer per group (`None` = ok).
    fn send_batch(&mut self, table: &str, gs: &[Msg<'_>]) -> Result<Vec<Option<Answer>>> {
        let context = format!("update table inet {table}");
        let mut b = Batch::batch();
        let begin_seq = self.next_seq();
        begin(
            &mut b,
            NFNL_MSG_BATCH_BEGIN,
            0,
            begin_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        b.end();
        let first = self.next_seq();
        for (i, g) in gs.iter().enumerate() {
            // Errors are always reported; only the last message asks for an ack, whose
            // arrival ends the exchange (answers come in message order).
            let flags = if i + 1 == gs.len() { NLM_F_ACK } else { 0 };
            let seq = if i == 0 { first } else { self.next_seq() };
            encode_msg(&mut b, seq, flags, table, g)?;
        }
        let end_seq = self.next_seq();
        begin(
            &mut b,
            NFNL_MSG_BATCH_END,
            0,
            end_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        self.send(b.finish()?, &context)?;
        let last = first.wrapping_add(gs.len() as u32 - 1);
        let mut out: Vec<Option<Answer>> = vec![None; gs.len()];
        let mut batch_error = None;
        self.receive(
            &context,
            &mut |seq, a| {
                if seq == begin_seq || seq == end_seq {
                    // The batch as a whole was refused (e.g. EPERM, ENOMEM).
                    batch_error = Some(a);
                    return true;
                }
                let i = seq.wrapping_sub(first) as usize;
                if i >= gs.len() {
                    return false; // an answer to an earlier, abandoned exchange
                }
                if a.errno != 0 {
                    out[i] = Some(a);
                }
                seq == last
            },
            &mut |_, _| {},
        )?;
        if let Some(a) = batch_error {
            return Err(a.into_error(context));
        }
        Ok(out)
    }

    /// Applies `changes` to table `inet table` as one transaction: either all take effect or
    /// none. Adding an existing element and deleting a missing one are no-ops; a missing table
    /// or set is [`LinuxError::NotFound`]; anything else the kernel refuses (a map element
    /// jumping to a missing chain, a key of the wrong size) is [`LinuxError::Netlink`] naming
    /// the operation.
    pub fn apply(&mut self, table: &str, changes: &[ElementChange]) -> Result<()> {
        self.apply_msgs(
            table,
            groups(changes).into_iter().map(Msg::Elements).collect(),
        )
    }

    /// Applies `ops` in order to table `inet table` as one transaction, with the element
    /// semantics of [`Self::apply`]. Creating a chain that exists is a no-op; any other refusal
    /// (a rule for a missing chain, deleting a chain something still jumps to) fails the whole
    /// transaction with [`LinuxError::Netlink`] naming the operation.
    pub fn apply_ops(&mut self, table: &str, ops: &[TableOp]) -> Result<()> {
        self.apply_msgs(table, messages(ops))
    }

    fn apply_msgs(&mut self, table: &str, mut gs: Vec<Msg<'_>>) -> Result<()> {
        // Each round either succeeds, fails for good, or strictly shrinks a tolerated failure
        // (split a message into single elements, or drop a single no-op element or chain).
        loop {
            if gs.is_empty() {
                return Ok(());
            }
            let answers = self.send_batch(table, &gs)?;
            if answers.iter().all(Option::is_none) {
                return Ok(());
            }
            let mut next = Vec::with_capacity(gs.len());
            for (m, a) in gs.iter().zip(answers) {
                let Some(a) = a else {
                    next.push(m.clone());
                    continue;
                };
                let g = match m {
                    Msg::Elements(g) => g,
                    Msg::Table(TableOp::AddChain(_)) if a.errno == libc::EEXIST => continue,
                    Msg::Table(_) => {
                        return Err(LinuxError::Netlink {
                            context: describe_msg(m, table),
                            source: io::Error::from_raw_os_error(a.errno),
                            ext_ack: a.ext_ack,
                        });
                    }
                };
                let tolerable = match (g.op, a.errno) {
                    (ElementOp::Add, libc::EEXIST) => true,
                    (_, libc::ENOENT) => {
                        if !self.set_exists(table, g.set)? {
                            return Err(LinuxError::NotFound {
                                what: format!(
                                    "nftables set inet {table} {} (for: {})",
                                    g.set,
                                    describe(g, table)
                                ),
                            });
                        }
                        // On an existing set, ENOENT of a delete is a missing element; of an
                        // add, a missing jump target, which is a real error.
                        g.op == ElementOp::Delete
                    }
                    _ => false,
                };
                if !tolerable {
                    return Err(LinuxError::Netlink {
                        context: describe(g, table),
                        source: io::Error::from_raw_os_error(a.errno),
                        ext_ack: a.ext_ack,
                    });
                }
                if g.elements.len() > 1 {
                    next.extend(g.elements.iter().map(|e| {
                        Msg::Elements(Group {
                            set: g.set,
                            op: g.op,
                            elements: vec![*e],
                        })
                    }));
                }
            }
            gs = next;
        }
    }
}

thread_local! {
    /// This thread's socket and the network namespace (device, inode) it was opened in.
    static CACHED: std::cell::RefCell<Option<((u64, u64), NftSocket)>> =
        const { std::cell::RefCell::new(None) };
}

/// The (device, inode) of the calling thread's network namespace.
fn current_netns() -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| LinuxError::io("stat /proc/thread-self/ns/net", e))?;
    Ok((m.dev(), m.ino()))
}

/// [`NftSocket::apply`] on a socket kept per thread and reused while the thread stays in the
/// same network namespace. Closing a socket that committed a transaction costs the kernel
/// several milliseconds, more than the change itself, so a caller that applies changes one by
/// one should use this rather than a socket per change. After an error the socket is
/// dropped, so no stale answer can confuse the next exchange.
pub fn apply_cached(table: &str, changes: &[ElementChange]) -> Result<()> {
    with_cached(|sock| sock.apply(table, changes))
}

/// [`NftSocket::apply_changes`] on the socket [`apply_cached`] keeps per thread.
pub fn apply_changes_cached(table: &str, changes: &[tern_nft::TableChange]) -> Result<()> {
    with_cached(|sock| sock.apply_changes(table, changes))
}

/// [`NftSocket::apply_ops`] on the socket [`apply_cached`] keeps per thread.
pub fn apply_ops_cached(table: &str, ops: &[TableOp]) -> Result<()> {
    with_cached(|sock| sock.apply_ops(table, ops))
}

fn with_cached(f: impl FnOnce(&mut NftSocket) -> Result<()>) -> Result<()> {
    let ns = current_netns()?;
    CACHED.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(n, _)| *n != ns) {
            *slot = Some((ns, NftSocket::new()?));
        }
        let (_, sock) = slot.as_mut().expect("socket just cached");
        let r = f(sock);
        if r.is_err() {
            *slot = None;
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::framing::{NLM_F_REQUEST, NLMSG_HDRLEN};

    #[test]
    fn rules_parse_only_the_shapes_they_encode() {
        for text in [
            "meta mark set meta mark and 0xfffeffff",
            "meta mark and 0x10000 == 0x10000 accept",
            "meta mark and 0x10000 == 0x10000 return",
            "jump pol-0123456789ab-in",
            "drop",
            "ip saddr . meta l4proto . th dport @fp-in-0123456789ab-v4 accept",
            "ip6 daddr . meta l4proto . th dport @fp-out-0123456789ab-v6 return",
        ] {
            let r = Rule::parse(text).unwrap_or_else(|| panic!("{text} parses"));
            assert_eq!(r.to_string(), text);
        }
        assert_eq!(
            Rule::parse("meta mark and 65536 == 0x10000 goto x"),
            Some(Rule::MarkTest {
                bits: 0x10000,
                verdict: Verdict::Goto("x".into())
            })
        );
        for text in [
            "ip saddr @sel-a-v4 accept",
            "meta mark and 0x1 == 0x2 accept",
            "meta mark set meta mark or 0x10000 return",
            "jump",
            "drop now",
            "ip saddr . meta l4proto . th dport @ accept",
            "ip saddr . meta l4proto . th sport @s accept",
            "arp saddr . meta l4proto . th dport @s accept",
            "",
        ] {
            assert_eq!(Rule::parse(text), None, "{text}");
        }
    }

    fn attrs(buf: &[u8]) -> Vec<(u16, Vec<u8>)> {
        crate::netlink::framing::attrs(buf)
            .map(|(k, v)| (k, v.to_vec()))
            .collect()
    }

    fn one_message(op: ElementOp, set: &str, e: Element) -> Vec<u8> {
        let changes = [ElementChange {
            set: set.into(),
            op,
            element: e,
        }];
        let gs = groups(&changes);
        let mut b = Batch::batch();
        encode_group(&mut b, 9, NLM_F_ACK, "tern", &gs[0]).unwrap();
        b.finish().unwrap().to_vec()
    }

    /// [`one_message`] of a set element (no verdict).
    fn set_message(op: ElementOp, set: &str, key: Key) -> Vec<u8> {
        one_message(op, set, Element { key, verdict: None })
    }

    /// The NFTA_LIST_ELEM entries of a NEWSETELEM/DELSETELEM message.
    fn list_elems(msg: &[u8]) -> Vec<Vec<(u16, Vec<u8>)>> {
        let len = u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize;
        assert_eq!(len, msg.len());
        let top = attrs(&msg[NLMSG_HDRLEN + 4..]);
        assert_eq!(top[0], (NFTA_SET_ELEM_LIST_TABLE, b"tern\0".to_vec()));
        assert_eq!(top[2].0, NFTA_SET_ELEM_LIST_ELEMENTS);
        attrs(&top[2].1)
            .into_iter()
            .map(|(k, v)| {
                assert_eq!(k, NFTA_LIST_ELEM);
                attrs(&v)
            })
            .collect()
    }

    fn key_of(elem: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let k = &elem
            .iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_KEY)
            .unwrap()
            .1;
        attrs(k)[0].1.clone()
    }

    #[test]
    fn header_and_nfgenmsg_of_an_add() {
        let m = set_message(
            ElementOp::Add,
            "sel-1-v4",
            Key::Addr("10.0.0.1".parse().unwrap()),
        );
        let ty = u16::from_ne_bytes(m[4..6].try_into().unwrap());
        assert_eq!(ty, (10 << 8) | 12);
        let flags = u16::from_ne_bytes(m[6..8].try_into().unwrap());
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 9);
        assert_eq!(&m[16..20], &[NFPROTO_INET, 0, 0, 0]);
        let elems = list_elems(&m);
        assert_eq!(elems.len(), 1);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 1]);
    }

    #[test]
    fn single_address_of_an_interval_set_is_start_and_end_plus_one() {
        let m = set_message(
            ElementOp::Delete,
            "pools",
            Key::Interval("10.0.0.255/32".parse().unwrap()),
        );
        assert_eq!(
            u16::from_ne_bytes(m[4..6].try_into().unwrap()),
            (10 << 8) | 14
        );
        let elems = list_elems(&m);
        assert_eq!(elems.len(), 2);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 255]);
        assert!(!elems[0].iter().any(|(t, _)| *t == NFTA_SET_ELEM_FLAGS));
        assert_eq!(key_of(&elems[1]), vec![10, 0, 1, 0]);
        let f = &elems[1]
            .iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_FLAGS)
            .unwrap()
            .1;
        assert_eq!(f, &NFT_SET_ELEM_INTERVAL_END.to_be_bytes().to_vec());
    }

    #[test]
    fn interval_ends_and_open_ended_prefixes() {
        let end = |s: &str| interval_end(&s.parse().unwrap());
        assert_eq!(end("10.1.0.0/16"), Some("10.2.0.0".parse().unwrap()));
        assert_eq!(end("255.255.255.255/32"), None);
        assert_eq!(end("0.0.0.0/0"), None);
        assert_eq!(end("fd00::/64"), Some("fd00:0:0:1::".parse().unwrap()));
        assert_eq!(end("::/0"), None);
        assert_eq!(
            entries(&Element {
                key: Key::Interval("0.0.0.0/0".parse().unwrap()),
                verdict: None
            })
            .unwrap()
            .len(),
            1
        );
    }

    #[test]
    fn concatenation_pads_fields_and_port_is_big_endian() {
        let m = set_message(
            ElementOp::Add,
            "np-1-v4",
            Key::AddrPort("10.0.0.1".parse().unwrap(), 8080),
        );
        let elems = list_elems(&m);
        assert_eq!(key_of(&elems[0]), vec![10, 0, 0, 1, 0x1f, 0x90, 0, 0]);
    }

    #[test]
    fn ifname_key_with_jump_verdict() {
        let m = one_message(
            ElementOp::Add,
            "ep-in",
            Element {
                key: Key::Ifname("veth1".into()),
                verdict: Some(Verdict::Jump("ep-in-veth1".into())),
            },
        );
        let elems = list_elems(&m);
        let mut want = b"veth1".to_vec();
        want.resize(16, 0);
        assert_eq!(key_of(&elems[0]), want);
        let data = &elems[0]
            .iter()
            .find(|(t, _)| *t == NFTA_SET_ELEM_DATA)
            .unwrap()
            .1;
        let verdict = attrs(data);
        assert_eq!(verdict[0].0, NFTA_DATA_VERDICT);
        let v = attrs(&verdict[0].1);
        assert_eq!(v[0], (NFTA_VERDICT_CODE, NFT_JUMP.to_be_bytes().to_vec()));
        assert_eq!(v[1], (NFTA_VERDICT_CHAIN, b"ep-in-veth1\0".to_vec()));
        // Deletes carry only the key.
        let m = one_message(
            ElementOp::Delete,
            "ep-in",
            Element {
                key: Key::Ifname("veth1".into()),
                verdict: Some(Verdict::Jump("ep-in-veth1".into())),
            },
        );
        assert!(
            !list_elems(&m)[0]
                .iter()
                .any(|(t, _)| *t == NFTA_SET_ELEM_DATA)
        );
    }

    #[test]
    fn groups_runs_of_one_set_and_op_and_caps_their_size() {
        let c = |set: &str, op, i: u32| ElementChange {
            set: set.into(),
            op,
            element: Element {
                key: Key::Addr(IpAddr::V4(Ipv4Addr::from(i))),
                verdict: None,
            },
        };
        let mut changes = vec![
            c("a", ElementOp::Add, 1),
            c("a", ElementOp::Add, 2),
            c("a", ElementOp::Delete, 3),
            c("b", ElementOp::Delete, 4),
        ];
        let g = groups(&changes);
        assert_eq!(
            g.iter().map(|g| g.elements.len()).collect::<Vec<_>>(),
            vec![2, 1, 1]
        );
        changes = (0..600).map(|i| c("a", ElementOp::Add, i)).collect();
        let g = groups(&changes);
        assert_eq!(
            g.iter().map(|g| g.elements.len()).collect::<Vec<_>>(),
            vec![256, 256, 88]
        );
    }

    #[test]
    fn set_kinds_from_specs() {
        assert_eq!(
            SetKind::from_spec("type ipv4_addr;"),
            Some(SetKind::Addr {
                v6: false,
                interval: false
            })
        );
        assert_eq!(
            SetKind::from_spec(" type ipv6_addr;  flags interval; "),
            Some(SetKind::Addr {
                v6: true,
                interval: true
            })
        );
        assert_eq!(
            SetKind::from_spec("type ipv4_addr . inet_service;"),
            Some(SetKind::AddrPort { v6: false })
        );
        assert_eq!(
            SetKind::from_spec("type ifname : verdict;"),
            Some(SetKind::IfnameVerdict)
        );
        assert_eq!(
            SetKind::from_spec("type ipv4_addr; flags interval; auto-merge;"),
            None
        );
        assert_eq!(SetKind::from_spec("type ether_addr;"), None);
        assert_eq!(SetKind::from_spec(""), None);
    }

    #[test]
    fn parses_the_element_texts_of_each_kind() {
        let v4 = SetKind::from_spec("type ipv4_addr;").unwrap();
        assert_eq!(
            v4.parse_element("10.0.0.1").unwrap().key,
            Key::Addr("10.0.0.1".parse().unwrap())
        );
        assert!(v4.parse_element("fd00::1").is_err());
        assert!(v4.parse_element("10.0.0.0/24").is_err());
        let iv = SetKind::from_spec("type ipv4_addr; flags interval;").unwrap();
        assert_eq!(
            iv.parse_element("10.0.0.1").unwrap().key,
            Key::Interval("10.0.0.1/32".parse().unwrap())
        );
        assert_eq!(
            iv.parse_element("10.0.0.9/24").unwrap().key,
            Key::Interval("10.0.0.0/24".parse().unwrap())
        );
        let np = SetKind::from_spec("type ipv6_addr . inet_service;").unwrap();
        assert_eq!(
            np.parse_element("fd00::1 . 53").unwrap().key,
            Key::AddrPort("fd00::1".parse().unwrap(), 53)
        );
        assert!(np.parse_element("fd00::1 . 70000").is_err());
        let map = SetKind::IfnameVerdict;
        let e = map.parse_element("\"tern1\" : jump ep-in-tern1").unwrap();
        assert_eq!(e.key, Key::Ifname("tern1".into()));
        assert_eq!(e.verdict, Some(Verdict::Jump("ep-in-tern1".into())));
        assert_eq!(e.to_string(), "\"tern1\" : jump ep-in-tern1");
        assert!(map.parse_element("\"tern1\" : frobnicate").is_err());
        assert!(
            map.parse_element("\"a-name-longer-than-15\" : drop")
                .is_err()
        );
    }
}
