//! Rules as nf_tables expressions, as `nft` encodes the text of the same rule in an `inet`
//! table:
//!
//! - an `ip` / `ip6` payload match is preceded, once per rule, by the family check it implies
//!   (`meta nfproto`);
//! - an anonymous set of one element is a comparison instead (a prefix loads only its whole
//!   bytes, or masks the address when it does not end on a byte; a port range is `>=` and
//!   `<=`); of more, a constant anonymous set created just before the rule, interval sets
//!   holding merged ranges;
//! - `icmp type T icmp code C` (both equal, adjacent) is one 2-byte load and compare;
//! - a concatenation loads its fields into consecutive 32-bit registers, and a protocol in an
//!   interval concatenation goes through a (no-op) `byteorder`, as nft emits it.

use tern_nft::{Addr, AddrField, Family, IcmpField, Iface, Match, PortRange, Rule, Stmt, Verdict};

use crate::error::Result;

use super::elems::{AnonKey, AnonSet, Range, be, encode_verdict, interval_entries, merged};
use super::{Batch, NFTA_DATA_VALUE, NFTA_LIST_ELEM};

const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
const NFTA_META_SREG: u16 = 3;
const NFTA_BITWISE_SREG: u16 = 1;
const NFTA_BITWISE_DREG: u16 = 2;
const NFTA_BITWISE_LEN: u16 = 3;
const NFTA_BITWISE_MASK: u16 = 4;
const NFTA_BITWISE_XOR: u16 = 5;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
const NFTA_BYTEORDER_SREG: u16 = 1;
const NFTA_BYTEORDER_DREG: u16 = 2;
const NFTA_BYTEORDER_OP: u16 = 3;
const NFTA_BYTEORDER_LEN: u16 = 4;
const NFTA_BYTEORDER_SIZE: u16 = 5;
const NFTA_LOOKUP_SET: u16 = 1;
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_DREG: u16 = 3;
const NFTA_LOOKUP_SET_ID: u16 = 4;
const NFTA_LOOKUP_FLAGS: u16 = 5;
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_LOG_PREFIX: u16 = 2;
const NFTA_LOG_SNAPLEN: u16 = 3;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_META_MARK: u32 = 3;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CT_STATE: u32 = 0;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_BYTEORDER_HTON: u32 = 1;
const NFT_LOOKUP_F_INV: u32 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// `cmp` operators.
#[derive(Debug, Clone, Copy)]
enum Cmp {
    Eq = 0,
    Neq = 1,
    Lte = 3,
    Gte = 5,
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

/// Offset and length of an address in the network header.
fn addr_payload(a: &Addr) -> (u32, u32) {
    match (a.family, a.field) {
        (Family::V4, AddrField::Saddr) => (12, 4),
        (Family::V4, AddrField::Daddr) => (16, 4),
        (Family::V6, AddrField::Saddr) => (8, 16),
        (Family::V6, AddrField::Daddr) => (24, 16),
    }
}

fn anon_key(a: &Addr) -> AnonKey {
    AnonKey::Addr {
        v6: a.family == Family::V6,
        daddr: a.field == AddrField::Daddr,
    }
}

/// The anonymous set of the ranges of one match (`{ a, b }` with two or more elements):
/// interval (merged) when `interval`, else one entry per value.
fn anon_set(id: u32, key: AnonKey, width: usize, ranges: Vec<Range>, interval: bool) -> AnonSet {
    if interval {
        let ranges = merged(ranges);
        let entries = interval_entries(&ranges, width, true);
        let zero = usize::from(ranges.first().is_some_and(|r| r.0 != 0));
        AnonSet {
            id,
            key,
            interval,
            size: (2 * ranges.len() + zero) as u32,
            entries,
        }
    } else {
        let mut values: Vec<u128> = Vec::with_capacity(ranges.len());
        for (a, _) in ranges {
            if !values.contains(&a) {
                values.push(a);
            }
        }
        let entries = values
            .iter()
            .map(|v| super::elems::Entry {
                key: be(*v, width),
                key_end: None,
                flags: 0,
                open: false,
                verdict: None,
            })
            .collect();
        AnonSet {
            id,
            key,
            interval,
            size: values.len() as u32,
            entries,
        }
    }
}

/// The anonymous sets `rule` needs, in the order its matches use them; ids from `next_id`.
/// Prefixes of another family than the address they match are refused.
pub(super) fn anon_sets(rule: &Rule, next_id: &mut u32) -> Result<Vec<AnonSet>> {
    let mut out = Vec::new();
    let mut id = || {
        *next_id += 1;
        *next_id
    };
    for m in &rule.matches {
        if let Match::AddrInNets { addr, nets, .. } = m
            && let Some(n) = nets.iter().find(|n| Family::of_net(n) != addr.family)
        {
            return Err(crate::error::LinuxError::InvalidArgument(format!(
                "prefix {n} matched against {addr} in rule {rule}"
            )));
        }
        match m {
            Match::AddrInNets { addr, nets, .. } if nets.len() > 1 => {
                let ranges = nets
                    .iter()
                    .map(|n| {
                        let n = n.trunc();
                        (
                            tern_nft::addr_bits(&n.network()),
                            tern_nft::addr_bits(&n.broadcast()),
                        )
                    })
                    .collect();
                let width = addr_payload(addr).1 as usize;
                out.push(anon_set(id(), anon_key(addr), width, ranges, true));
            }
            Match::DportIn(ports) if ports.len() > 1 => {
                let interval = ports.iter().any(|p| p.first != p.last);
                let ranges = ports
                    .iter()
                    .map(|p| (u128::from(p.first), u128::from(p.last)))
                    .collect();
                out.push(anon_set(id(), AnonKey::Dport, 2, ranges, interval));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// One expression: `NFTA_LIST_ELEM { name, data { ... } }`.
fn expr(b: &mut Batch, name: &str, data: impl FnOnce(&mut Batch)) {
    b.begin_nest(NFTA_LIST_ELEM);
    b.attr_str(NFTA_EXPR_NAME, name);
    b.begin_nest(NFTA_EXPR_DATA);
    data(b);
    b.end_nest();
    b.end_nest();
}

fn meta_load(b: &mut Batch, key: u32, dreg: u32) {
    expr(b, "meta", |b| {
        b.attr(NFTA_META_DREG, &dreg.to_be_bytes());
        b.attr(NFTA_META_KEY, &key.to_be_bytes());
    });
}

fn payload(b: &mut Batch, dreg: u32, base: u32, offset: u32, len: u32) {
    expr(b, "payload", |b| {
        b.attr(NFTA_PAYLOAD_DREG, &dreg.to_be_bytes());
        b.attr(NFTA_PAYLOAD_BASE, &base.to_be_bytes());
        b.attr(NFTA_PAYLOAD_OFFSET, &offset.to_be_bytes());
        b.attr(NFTA_PAYLOAD_LEN, &len.to_be_bytes());
    });
}

fn cmp(b: &mut Batch, op: Cmp, data: &[u8]) {
    expr(b, "cmp", |b| {
        b.attr(NFTA_CMP_SREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_CMP_OP, &(op as u32).to_be_bytes());
        b.begin_nest(NFTA_CMP_DATA);
        b.attr(NFTA_DATA_VALUE, data);
        b.end_nest();
    });
}

/// `reg 1 = (reg 1 & mask) ^ xor` over `mask.len()` bytes.
fn bitwise(b: &mut Batch, mask: &[u8], xor: &[u8]) {
    expr(b, "bitwise", |b| {
        b.attr(NFTA_BITWISE_SREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_BITWISE_DREG, &NFT_REG_1.to_be_bytes());
        b.attr(NFTA_BITWISE_LEN, &(mask.len() as u32).to_be_bytes());
        b.begin_nest(NFTA_BITWISE_MASK);
        b.attr(NFTA_DATA_VALUE, mask);
        b.end_nest();
        b.begin_nest(NFTA_BITWISE_XOR);
        b.attr(NFTA_DATA_VALUE, xor);
        b.end_nest();
    });
}

/// A lookup of reg 1 in a named set, or in an anonymous set of this batch (`id`).
fn lookup(b: &mut Batch, set: &str, id: Option<u32>, negate: bool) {
    expr(b, "lookup", |b| {
        b.attr(NFTA_LOOKUP_SREG, &NFT_REG_1.to_be_bytes());
        b.attr_str(NFTA_LOOKUP_SET, set);
        if let Some(id) = id {
            b.attr(NFTA_LOOKUP_SET_ID, &id.to_be_bytes());
        }
        if negate {
            b.attr(NFTA_LOOKUP_FLAGS, &NFT_LOOKUP_F_INV.to_be_bytes());
        }
    });
}

fn immediate(b: &mut Batch, v: &Verdict) -> Result<()> {
    b.begin_nest(NFTA_LIST_ELEM);
    b.attr_str(NFTA_EXPR_NAME, "immediate");
    b.begin_nest(NFTA_EXPR_DATA);
    b.attr(NFTA_IMMEDIATE_DREG, &NFT_REG_VERDICT.to_be_bytes());
    b.begin_nest(NFTA_IMMEDIATE_DATA);
    encode_verdict(b, v)?;
    b.end_nest();
    b.end_nest();
    b.end_nest();
    Ok(())
}

/// `meta mark set (meta mark & mask) ^ xor`.
fn mark_set(b: &mut Batch, mask: u32, xor: u32) {
    meta_load(b, NFT_META_MARK, NFT_REG_1);
    // The mark sits in the register in host byte order.
    bitwise(b, &mask.to_ne_bytes(), &xor.to_ne_bytes());
    expr(b, "meta", |b| {
        b.attr(NFTA_META_KEY, &NFT_META_MARK.to_be_bytes());
        b.attr(NFTA_META_SREG, &NFT_REG_1.to_be_bytes());
    });
}

/// Emits rule expressions, remembering the family check already made.
struct Lowering<'a> {
    b: &'a mut Batch,
    checked: Option<Family>,
}

impl Lowering<'_> {
    /// `meta nfproto ipv4|ipv6`, once per rule, before the first payload of the family.
    fn family(&mut self, f: Family) {
        if self.checked == Some(f) {
            return;
        }
        self.checked = Some(f);
        meta_load(self.b, NFT_META_NFPROTO, NFT_REG_1);
        let p = match f {
            Family::V4 => NFPROTO_IPV4,
            Family::V6 => NFPROTO_IPV6,
        };
        cmp(self.b, Cmp::Eq, &[p]);
    }

    /// The address into reg 1 (after its family check).
    fn addr(&mut self, a: &Addr) {
        self.family(a.family);
        let (offset, len) = addr_payload(a);
        payload(self.b, NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
    }

    fn dport(&mut self, dreg: u32) {
        payload(self.b, dreg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
    }

    fn one_net(&mut self, a: &Addr, negate: bool, net: &ipnet::IpNet) {
        self.family(a.family);
        let (offset, len) = addr_payload(a);
        let net = net.trunc();
        let bytes = super::elems::be(tern_nft::addr_bits(&net.network()), len as usize);
        let plen = u32::from(net.prefix_len());
        let op = if negate { Cmp::Neq } else { Cmp::Eq };
        if plen > 0 && plen.is_multiple_of(8) {
            // Whole bytes: load only those.
            let n = plen / 8;
            payload(self.b, NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, n);
            cmp(self.b, op, &bytes[..n as usize]);
        } else {
            payload(self.b, NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            let mask = be(
                super::elems::key_max(len as usize) ^ (super::elems::key_max(len as usize) >> plen),
                len as usize,
            );
            bitwise(self.b, &mask, &vec![0; len as usize]);
            cmp(self.b, op, &bytes);
        }
    }

    fn one_port(&mut self, p: &PortRange) {
        self.dport(NFT_REG_1);
        if p.first == p.last {
            cmp(self.b, Cmp::Eq, &p.first.to_be_bytes());
        } else {
            cmp(self.b, Cmp::Gte, &p.first.to_be_bytes());
            cmp(self.b, Cmp::Lte, &p.last.to_be_bytes());
        }
    }

    fn matches(&mut self, m: &Match, anon: &mut impl Iterator<Item = u32>) {
        match m {
            Match::L4Proto(p) => {
                meta_load(self.b, NFT_META_L4PROTO, NFT_REG_1);
                cmp(self.b, Cmp::Eq, &[p.number()]);
            }
            Match::AddrInSet { addr, negate, set } => {
                self.addr(addr);
                lookup(self.b, set, None, *negate);
            }
            Match::AddrInNets { addr, negate, nets } => match nets.as_slice() {
                [net] => self.one_net(addr, *negate, net),
                _ => {
                    self.addr(addr);
                    let id = anon
                        .next()
                        .expect("an anonymous set per multi-element match");
                    lookup(self.b, "__set%d", Some(id), *negate);
                }
            },
            Match::DportIn(ports) => match ports.as_slice() {
                [p] => self.one_port(p),
                _ => {
                    self.dport(NFT_REG_1);
                    let id = anon
                        .next()
                        .expect("an anonymous set per multi-element match");
                    lookup(self.b, "__set%d", Some(id), false);
                }
            },
            Match::AddrDportInSet { addr, set } => {
                self.addr(addr);
                let words = addr_payload(addr).1 / 4;
                self.dport(reg32(words));
                lookup(self.b, set, None, false);
            }
            Match::AddrProtoDportInSet { addr, set } => {
                self.addr(addr);
                let words = addr_payload(addr).1 / 4;
                let proto = reg32(words);
                meta_load(self.b, NFT_META_L4PROTO, proto);
                // A no-op (len / size = 0 words), but nft emits it for a protocol in an
                // interval concatenation; kept so the kernel holds exactly nft's rule.
                expr(self.b, "byteorder", |b| {
                    b.attr(NFTA_BYTEORDER_SREG, &proto.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_DREG, &proto.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_OP, &NFT_BYTEORDER_HTON.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_LEN, &1u32.to_be_bytes());
                    b.attr(NFTA_BYTEORDER_SIZE, &2u32.to_be_bytes());
                });
                self.dport(reg32(words + 1));
                lookup(self.b, set, None, false);
            }
            Match::Icmp {
                field,
                negate,
                value,
                ..
            } => {
                payload(
                    self.b,
                    NFT_REG_1,
                    NFT_PAYLOAD_TRANSPORT_HEADER,
                    field.offset(),
                    1,
                );
                cmp(self.b, if *negate { Cmp::Neq } else { Cmp::Eq }, &[*value]);
            }
            Match::MarkAll(bits) => {
                meta_load(self.b, NFT_META_MARK, NFT_REG_1);
                bitwise(self.b, &bits.to_ne_bytes(), &0u32.to_ne_bytes());
                cmp(self.b, Cmp::Eq, &bits.to_ne_bytes());
            }
            Match::CtState(s) => {
                expr(self.b, "ct", |b| {
                    b.attr(NFTA_CT_KEY, &NFT_CT_STATE.to_be_bytes());
                    b.attr(NFTA_CT_DREG, &NFT_REG_1.to_be_bytes());
                });
                bitwise(self.b, &s.0.to_ne_bytes(), &0u32.to_ne_bytes());
                cmp(self.b, Cmp::Neq, &0u32.to_ne_bytes());
            }
        }
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::MarkAnd(mask) => mark_set(self.b, *mask, 0),
            Stmt::MarkOr(bits) => mark_set(self.b, !bits, *bits),
            Stmt::Log { prefix } => expr(self.b, "log", |b| {
                b.attr_str(NFTA_LOG_PREFIX, prefix);
            }),
            // As nftnl builds it: prefix, group (u16), snaplen (u32), network byte order.
            Stmt::LogGroup {
                prefix,
                group,
                snaplen,
            } => expr(self.b, "log", |b| {
                b.attr_str(NFTA_LOG_PREFIX, prefix);
                b.attr(NFTA_LOG_GROUP, &group.to_be_bytes());
                b.attr(NFTA_LOG_SNAPLEN, &snaplen.to_be_bytes());
            }),
            Stmt::Masquerade => expr(self.b, "masq", |_| {}),
            Stmt::Vmap { iface, map } => {
                let key = match iface {
                    Iface::In => NFT_META_IIFNAME,
                    Iface::Out => NFT_META_OIFNAME,
                };
                meta_load(self.b, key, NFT_REG_1);
                expr(self.b, "lookup", |b| {
                    b.attr(NFTA_LOOKUP_SREG, &NFT_REG_1.to_be_bytes());
                    b.attr_str(NFTA_LOOKUP_SET, map);
                    b.attr(NFTA_LOOKUP_DREG, &NFT_REG_VERDICT.to_be_bytes());
                });
            }
            Stmt::Verdict(v) => immediate(self.b, v)?,
        }
        Ok(())
    }
}

/// `NFTA_RULE_EXPRESSIONS` of `rule`; `anon` are the ids of the sets [`anon_sets`] made for
/// it, in order.
pub(super) fn encode_rule(b: &mut Batch, rule: &Rule, anon: &[u32]) -> Result<()> {
    b.begin_nest(NFTA_RULE_EXPRESSIONS);
    let mut ids = anon.iter().copied();
    let mut l = Lowering { b, checked: None };
    let mut i = 0;
    while i < rule.matches.len() {
        // nft merges `icmp type T icmp code C` (equal both, adjacent) into one 2-byte load.
        if let [
            Match::Icmp {
                v6,
                field: IcmpField::Type,
                negate: false,
                value: t,
            },
            Match::Icmp {
                v6: v6c,
                field: IcmpField::Code,
                negate: false,
                value: c,
            },
            ..,
        ] = &rule.matches[i..]
            && v6 == v6c
        {
            payload(l.b, NFT_REG_1, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2);
            cmp(l.b, Cmp::Eq, &[*t, *c]);
            i += 2;
            continue;
        }
        l.matches(&rule.matches[i], &mut ids);
        i += 1;
    }
    for s in &rule.stmts {
        l.stmt(s)?;
    }
    l.b.end_nest();
    Ok(())
}
