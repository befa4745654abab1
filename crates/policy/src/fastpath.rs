//! The allow-only fast path: one set lookup in front of an endpoint's policy chains.
//!
//! A connection's first packet walks the endpoint chain, which jumps to every applicable policy
//! chain in order; with thousands of rules that walk is what a new connection pays (established
//! packets are accepted by conntrack before it). When every policy that applies to an endpoint
//! in a direction only allows (no Deny, Log or Pass-before-Deny ordering to respect: the
//! Kubernetes NetworkPolicy case), the verdict is "allowed if any rule matches", so order does
//! not matter. The rules whose peer is given by CIDRs alone (`ipBlock` without `except`, or any
//! peer) are then merged into one concatenated interval set per family,
//! `ip saddr . meta l4proto . th dport` (egress: `ip daddr ...`), looked up once at the top of
//! the endpoint chain: a hit is the verdict; a miss walks the chains as before (selector
//! rules, and packets no rule allows). The set is an accelerator only: it never holds a box no
//! rule allows, so the verdict is always the chains'.
//!
//! The kernel's interval sets refuse overlapping elements, so [`disjoint`] turns the rules'
//! boxes (address range x protocol range x port range) into disjoint boxes with the same union.
//! "Any protocol" is protocol 0-255 with ports 0-65535: every packet has a 16-bit value where
//! `th dport` reads, so the full range matches it whatever the protocol.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use tern_model::{Action, Port, Protocol};
use tern_nft::{AddrRange, Family, Key, PortRange, Span, Verdict};

use crate::model::{Direction, IrPolicy};

/// An inclusive range.
pub type Range<T> = (T, T);

/// One element: addresses (as u128; IPv4 in the low 32 bits) x protocols x ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Box3 {
    pub addr: Range<u128>,
    pub proto: Range<u8>,
    pub port: Range<u16>,
}

fn family_max(fam: Family) -> u128 {
    match fam {
        Family::V4 => u128::from(u32::MAX),
        Family::V6 => u128::MAX,
    }
}

fn net_range(n: &IpNet) -> Range<u128> {
    let n = n.trunc();
    match (n.network(), n.broadcast()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b))),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b)),
        _ => unreachable!("network and broadcast share a family"),
    }
}

fn proto_range(p: Option<Protocol>, fam: Family) -> Option<Range<u8>> {
    match p {
        None => Some((0, 255)),
        Some(Protocol::Icmp) if fam == Family::V6 => None,
        Some(Protocol::IcmpV6) if fam == Family::V4 => None,
        Some(p) => {
            let n = p.number();
            Some((n, n))
        }
    }
}

/// The boxes of the allow-only fast path of policies `pols` (in evaluation order) for a
/// direction and family, or `None` when there is no fast path: some policy has a rule that is
/// not Allow (order would matter), or no rule can be expressed as boxes.
pub fn boxes(pols: &[&IrPolicy], dir: Direction, fam: Family) -> Option<Vec<Box3>> {
    let mut out = Vec::new();
    for p in pols {
        for r in p.rules(dir).unwrap_or_default() {
            if r.action != Action::Allow {
                return None;
            }
            let (peer, local) = match dir {
                Direction::Ingress => (&r.src, &r.dst),
                Direction::Egress => (&r.dst, &r.src),
            };
            // Destination ports live on `dst` in both directions; the local side must not
            // narrow anything else, the peer must be CIDRs (or anything).
            let local_ok = local.endpoints.is_none()
                && local.nets.is_empty()
                && local.not_nets.is_empty()
                && (dir == Direction::Ingress || local.ports.is_empty());
            let peer_ok = peer.endpoints.is_none()
                && peer.not_nets.is_empty()
                && (dir == Direction::Egress || peer.ports.is_empty());
            if !local_ok || !peer_ok {
                continue;
            }
            let Some(proto) = proto_range(r.protocol, fam) else {
                continue;
            };
            let addrs: Vec<Range<u128>> = if peer.nets.is_empty() {
                vec![(0, family_max(fam))]
            } else {
                peer.nets
                    .iter()
                    .filter(|n| Family::of_net(n) == fam)
                    .map(net_range)
                    .collect()
            };
            let mut ports = Vec::new();
            for p in &r.dst.ports {
                match p {
                    Port::Range(a, b) => ports.push((*a, *b)),
                    // Named ports resolve per pod: left to the chains.
                    Port::Named(_) => {}
                }
            }
            if r.dst.ports.is_empty() {
                ports.push((0, u16::MAX));
            } else if ports.len() != r.dst.ports.len() {
                continue;
            }
            for a in &addrs {
                for pt in &ports {
                    out.push(Box3 {
                        addr: *a,
                        proto,
                        port: *pt,
                    });
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Sorted, merged, disjoint ranges with the same union.
fn merge_ranges<T: Copy + Ord + Into<u128>>(mut v: Vec<Range<T>>) -> Vec<Range<T>> {
    v.sort();
    let mut out: Vec<Range<T>> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            // Touching ranges merge too (end + 1 == start).
            Some(last) if r.0.into() <= last.1.into() + 1 => {
                if r.1 > last.1 {
                    last.1 = r.1;
                }
            }
            _ => out.push(r),
        }
    }
    out
}

/// Elementary intervals of `ranges` (inclusive, within 0..=max): the pieces between every start
/// and every end + 1, so each input range is a union of consecutive pieces.
fn pieces(ranges: &[Range<u128>], max: u128) -> Vec<Range<u128>> {
    let mut cuts: Vec<u128> = Vec::with_capacity(ranges.len() * 2);
    for r in ranges {
        cuts.push(r.0);
        if r.1 < max {
            cuts.push(r.1 + 1);
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.iter()
        .enumerate()
        .map(|(i, &c)| (c, cuts.get(i + 1).map_or(max, |n| n - 1)))
        .collect()
}

/// Protocol x port profile of one address piece: disjoint protocol ranges, each with its
/// disjoint port ranges.
type Profile = Vec<(Range<u8>, Vec<Range<u16>>)>;

fn profile(boxes: &[(Range<u8>, Range<u16>)]) -> Profile {
    let protos: Vec<Range<u128>> = boxes
        .iter()
        .map(|(p, _)| (u128::from(p.0), u128::from(p.1)))
        .collect();
    let mut out: Profile = Vec::new();
    for (a, b) in pieces(&protos, 255) {
        let ports: Vec<Range<u16>> = boxes
            .iter()
            .filter(|(p, _)| u128::from(p.0) <= a && b <= u128::from(p.1))
            .map(|(_, pt)| *pt)
            .collect();
        if ports.is_empty() {
            continue;
        }
        let ports = merge_ranges(ports);
        let range = (a as u8, b as u8);
        match out.last_mut() {
            // Adjacent protocol pieces with the same ports become one range.
            Some((last, lp)) if u16::from(last.1) + 1 == u16::from(range.0) && *lp == ports => {
                last.1 = range.1;
            }
            _ => out.push((range, ports)),
        }
    }
    out
}

/// Disjoint boxes whose union is the union of `boxes` (the kernel refuses overlapping
/// elements of an interval set). Adjacent address pieces with the same protocol/port profile
/// are merged, so a CIDR cut by others' boundaries stays as few elements as possible.
pub fn disjoint(boxes: &[Box3], fam: Family) -> Vec<Box3> {
    let max = family_max(fam);
    let addrs: Vec<Range<u128>> = boxes.iter().map(|b| b.addr).collect();
    let cuts = pieces(&addrs, max);
    // Which piece each box starts in: pieces are sorted and every box starts on a cut.
    let mut per_piece: Vec<Vec<(Range<u8>, Range<u16>)>> = vec![Vec::new(); cuts.len()];
    for b in boxes {
        let first = cuts.partition_point(|p| p.0 < b.addr.0);
        for (i, piece) in cuts.iter().enumerate().skip(first) {
            if piece.0 > b.addr.1 {
                break;
            }
            per_piece[i].push((b.proto, b.port));
        }
    }
    let mut runs: Vec<(Range<u128>, Profile)> = Vec::new();
    for (piece, bs) in cuts.iter().zip(per_piece) {
        if bs.is_empty() {
            continue;
        }
        let prof = profile(&bs);
        match runs.last_mut() {
            Some((r, p)) if r.1 + 1 == piece.0 && *p == prof => r.1 = piece.1,
            _ => runs.push((*piece, prof)),
        }
    }
    let mut out = Vec::new();
    for (addr, prof) in runs {
        for (proto, ports) in prof {
            for port in ports {
                out.push(Box3 { addr, proto, port });
            }
        }
    }
    out
}

fn addr_of(v: u128, fam: Family) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// The element of a box: `10.0.0.0/8 . 6 . 80-90` in nft text.
pub fn element(b: &Box3, fam: Family) -> Key {
    Key::AddrProtoPort {
        addr: AddrRange {
            first: addr_of(b.addr.0, fam),
            last: addr_of(b.addr.1, fam),
        },
        proto: Span::new(b.proto.0, b.proto.1),
        port: PortRange::new(b.port.0, b.port.1),
    }
}

/// The fast-path elements of policies `pols` for a direction and family; empty when there is
/// no fast path.
pub fn elements(pols: &[&IrPolicy], dir: Direction, fam: Family) -> BTreeMap<Key, Option<Verdict>> {
    boxes(pols, dir, fam)
        .map(|b| disjoint(&b, fam))
        .unwrap_or_default()
        .iter()
        .map(|b| (element(b, fam), None))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(addr: (u128, u128), proto: (u8, u8), port: (u16, u16)) -> Box3 {
        Box3 { addr, proto, port }
    }

    fn overlaps(x: &Box3, y: &Box3) -> bool {
        let o = |a: (u128, u128), b: (u128, u128)| a.0 <= b.1 && b.0 <= a.1;
        o(x.addr, y.addr)
            && o(
                (u128::from(x.proto.0), u128::from(x.proto.1)),
                (u128::from(y.proto.0), u128::from(y.proto.1)),
            )
            && o(
                (u128::from(x.port.0), u128::from(x.port.1)),
                (u128::from(y.port.0), u128::from(y.port.1)),
            )
    }

    fn covered(v: &[Box3], a: u128, p: u8, q: u16) -> bool {
        v.iter().any(|x| {
            x.addr.0 <= a
                && a <= x.addr.1
                && x.proto.0 <= p
                && p <= x.proto.1
                && x.port.0 <= q
                && q <= x.port.1
        })
    }

    #[test]
    fn disjoint_boxes_have_the_same_union_and_never_overlap() {
        // Nested and overlapping CIDRs, any-protocol, port ranges, touching ranges.
        let input = vec![
            b((10 << 24, (11 << 24) - 1), (6, 6), (80, 80)),
            b((10 << 24, (10 << 24) + 255), (6, 6), (80, 90)),
            b((10 << 24, (10 << 24) + 255), (17, 17), (53, 53)),
            b((9 << 24, (10 << 24) + 5), (0, 255), (0, 65535)),
            b((12 << 24, 12 << 24), (6, 6), (1, 100)),
            b((12 << 24, 12 << 24), (6, 6), (101, 200)),
        ];
        let out = disjoint(&input, Family::V4);
        for (i, x) in out.iter().enumerate() {
            for y in &out[i + 1..] {
                assert!(!overlaps(x, y), "{x:?} overlaps {y:?}");
            }
        }
        // Same union, probed at every boundary and its neighbours.
        let mut addrs = Vec::new();
        for x in &input {
            for a in [x.addr.0, x.addr.1] {
                addrs.extend([a.saturating_sub(1), a, a + 1]);
            }
        }
        for a in addrs {
            for p in [0u8, 5, 6, 7, 17, 255] {
                for q in [
                    0u16, 52, 53, 54, 79, 80, 85, 90, 91, 100, 101, 200, 201, 65535,
                ] {
                    assert_eq!(
                        covered(&input, a, p, q),
                        covered(&out, a, p, q),
                        "{a} {p} {q}"
                    );
                }
            }
        }
        // Touching port ranges merged; the /8 cut by the /24 is not split more than needed.
        assert!(
            out.contains(&b((12 << 24, 12 << 24), (6, 6), (1, 200))),
            "{out:?}"
        );
    }

    /// The nft text of a box's address range.
    fn addr_text(r: Range<u128>, fam: Family) -> String {
        AddrRange {
            first: addr_of(r.0, fam),
            last: addr_of(r.1, fam),
        }
        .to_string()
    }

    #[test]
    fn element_texts_use_prefixes_when_they_can() {
        let t = |a, bb| addr_text((a, bb), Family::V4);
        assert_eq!(t(10 << 24, (11 << 24) - 1), "10.0.0.0/8");
        assert_eq!(t(10 << 24, 10 << 24), "10.0.0.0");
        assert_eq!(t(10 << 24, (10 << 24) + 5), "10.0.0.0-10.0.0.5");
        assert_eq!(t(0, u128::from(u32::MAX)), "0.0.0.0/0");
        assert_eq!(addr_text((0, u128::MAX), Family::V6), "::/0");
        assert_eq!(
            element(&b((1, 1), (0, 255), (0, 65535)), Family::V4).to_string(),
            "0.0.0.1 . 0-255 . 0-65535"
        );
    }
}
