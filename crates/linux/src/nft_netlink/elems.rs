//! Sets: declarations (`NFT_MSG_NEWSET`, named and anonymous) and elements as the kernel
//! holds them, encoded as `nft` encodes the same declaration and element text.
//!
//! - A named set's key is its type's id (a concatenation's ids packed 6 bits apart) and length
//!   (a concatenation's fields each padded to 4 bytes); an interval concatenation also sends
//!   its fields' lengths (`NFTA_SET_DESC_CONCAT`). nft's user data (key byte order,
//!   `auto-merge`, the concatenation marker) goes along, so `nft list` shows the set as
//!   declared.
//! - An interval is a start entry and an end entry (the first value after it, flagged
//!   `NFT_SET_ELEM_INTERVAL_END`); one that reaches the end of the key space has no end entry
//!   and is flagged open in its user data. The first elements given to a new or flushed
//!   interval set come with an end entry at 0 ("no interval below the first"), as nft sends
//!   them. (nft also sends it with the first elements added to a set of the kernel that is
//!   empty; this encoding does not know the kernel's elements and does not: that entry bounds
//!   nothing, both tables match the same packets.) Auto-merge and anonymous interval sets
//!   hold the merged ranges.
//! - An interval concatenation's element is one entry with `NFTA_SET_ELEM_KEY_END`.

use std::net::IpAddr;

use tern_nft::{DataType, Element, Key, SetType, Verdict, addr_bits};

use crate::error::{LinuxError, Result};

use super::{
    Batch, IFNAMSIZ, NFT_SET_ELEM_INTERVAL_END, NFTA_DATA_VALUE, NFTA_LIST_ELEM,
    NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_FLAGS, NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_NAME, NFTA_SET_TABLE,
};

pub(super) const NFTA_SET_FLAGS: u16 = 3;
pub(super) const NFTA_SET_KEY_TYPE: u16 = 4;
pub(super) const NFTA_SET_KEY_LEN: u16 = 5;
pub(super) const NFTA_SET_DATA_TYPE: u16 = 6;
pub(super) const NFTA_SET_DATA_LEN: u16 = 7;
pub(super) const NFTA_SET_DESC: u16 = 9;
pub(super) const NFTA_SET_ID: u16 = 10;
pub(super) const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_DESC_CONCAT: u16 = 2;
const NFTA_SET_FIELD_LEN: u16 = 1;
pub(super) const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_SET_ELEM_KEY_END: u16 = 10;

const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
const NFT_SET_INTERVAL: u32 = 0x4;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_CONCAT: u32 = 0x80;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

// nft's user data (libnftnl `nftnl_udata`): type, length, value; u32 values in host order.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_MERGE_ELEMENTS: u8 = 2;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
const UDATA_TYPEOF_EXPR: u8 = 0;
const UDATA_TYPEOF_DATA: u8 = 1;
const UDATA_SET_ELEM_FLAGS: u8 = 1;
const UDATA_SET_ELEM_F_INTERVAL_OPEN: u32 = 1;
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nft's expression kinds, as the `typeof` user data names them.
const EXPR_PAYLOAD: u32 = 7;
const EXPR_CONCAT: u32 = 13;

/// nft's id of a data type (`TYPE_*`).
fn type_id(t: DataType) -> u32 {
    match t {
        DataType::Verdict => 1,
        DataType::Ipv4Addr => 7,
        DataType::Ipv6Addr => 8,
        DataType::InetProto => 12,
        DataType::InetService => 13,
        DataType::Ifname => 41,
    }
}

/// Bytes of a value of a data type.
fn type_len(t: DataType) -> u32 {
    match t {
        DataType::Verdict => 0,
        DataType::Ipv4Addr => 4,
        DataType::Ipv6Addr => 16,
        DataType::InetProto => 1,
        DataType::InetService => 2,
        DataType::Ifname => IFNAMSIZ as u32,
    }
}

/// The key's type id: a concatenation packs its fields' ids 6 bits apart.
fn key_type(key: &[DataType]) -> u32 {
    key.iter().fold(0, |acc, t| (acc << 6) | type_id(*t))
}

/// The key's length: a concatenation's fields are each padded to 4 bytes.
fn key_len(key: &[DataType]) -> u32 {
    match key {
        [one] => type_len(*one),
        fields => fields
            .iter()
            .map(|t| type_len(*t).next_multiple_of(4))
            .sum(),
    }
}

fn udata_u32(out: &mut Vec<u8>, kind: u8, v: u32) {
    out.extend_from_slice(&[kind, 4]);
    out.extend_from_slice(&v.to_ne_bytes());
}

/// nft's user data of a named set of this type.
fn set_udata(t: &SetType) -> Vec<u8> {
    let mut u = Vec::new();
    let key_order = match t.key {
        [DataType::Ifname] => BYTEORDER_HOST,
        [_] => BYTEORDER_BIG_ENDIAN,
        _ => 0,
    };
    udata_u32(&mut u, UDATA_SET_KEYBYTEORDER, key_order);
    if t.is_map() {
        udata_u32(&mut u, UDATA_SET_DATABYTEORDER, 0);
    }
    if t.auto_merge {
        udata_u32(&mut u, UDATA_SET_MERGE_ELEMENTS, 1);
    }
    if t.key.len() > 1 {
        // A concatenation of types: `typeof` names a concatenation with no field data.
        u.extend_from_slice(&[UDATA_SET_KEY_TYPEOF, 8]);
        udata_u32(&mut u, UDATA_TYPEOF_EXPR, EXPR_CONCAT);
        u.extend_from_slice(&[UDATA_TYPEOF_DATA, 0]);
    }
    if t.is_map() {
        udata_u32(&mut u, UDATA_SET_DATA_INTERVAL, 0);
    }
    u
}

/// `NFT_MSG_NEWSET` attributes of named set `name` (after the message header); `id` names it
/// within the batch (the kernel wants one for every new set).
pub(super) fn encode_set(b: &mut Batch, table: &str, name: &str, t: &SetType, id: u32) {
    let concat = t.key.len() > 1;
    let mut flags = 0;
    if t.interval {
        flags |= NFT_SET_INTERVAL;
        if concat {
            flags |= NFT_SET_CONCAT;
        }
    }
    if t.is_map() {
        flags |= NFT_SET_MAP;
    }
    b.attr_str(NFTA_SET_TABLE, table);
    b.attr_str(NFTA_SET_NAME, name);
    b.attr(NFTA_SET_FLAGS, &flags.to_be_bytes());
    b.attr(NFTA_SET_KEY_TYPE, &key_type(t.key).to_be_bytes());
    b.attr(NFTA_SET_KEY_LEN, &key_len(t.key).to_be_bytes());
    if let Some(d) = t.data {
        let ty = if d == DataType::Verdict {
            NFT_DATA_VERDICT
        } else {
            type_id(d)
        };
        b.attr(NFTA_SET_DATA_TYPE, &ty.to_be_bytes());
        b.attr(NFTA_SET_DATA_LEN, &type_len(d).to_be_bytes());
    }
    b.attr(NFTA_SET_ID, &id.to_be_bytes());
    if t.interval && concat {
        b.begin_nest(NFTA_SET_DESC);
        b.begin_nest(NFTA_SET_DESC_CONCAT);
        for f in t.key {
            b.begin_nest(NFTA_LIST_ELEM);
            b.attr(NFTA_SET_FIELD_LEN, &type_len(*f).to_be_bytes());
            b.end_nest();
        }
        b.end_nest();
        b.end_nest();
    }
    b.attr(NFTA_SET_USERDATA, &set_udata(t));
}

/// What an anonymous set holds, as nft's `typeof` user data describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnonKey {
    /// An address of the network header: family, saddr (false) or daddr (true).
    Addr { v6: bool, daddr: bool },
    /// `th dport`.
    Dport,
}

/// An anonymous constant set a rule looks up, sent just before the rule.
#[derive(Debug, Clone)]
pub(super) struct AnonSet {
    pub(super) id: u32,
    pub(super) key: AnonKey,
    pub(super) interval: bool,
    pub(super) entries: Vec<Entry>,
    /// What nft declares as the set's size: entries, counting an open interval's missing end.
    pub(super) size: u32,
}

/// `NFT_MSG_NEWSET` attributes of an anonymous set.
pub(super) fn encode_anon_set(b: &mut Batch, table: &str, s: &AnonSet) {
    let (ty, len, desc, tmpl) = match s.key {
        // nft's protocol description and header field ids (`PROTO_DESC_*`, `*HDR_*`).
        AnonKey::Addr { v6: false, daddr } => (DataType::Ipv4Addr, 4, 12, 11 + u32::from(daddr)),
        AnonKey::Addr { v6: true, daddr } => (DataType::Ipv6Addr, 16, 13, 8 + u32::from(daddr)),
        AnonKey::Dport => (DataType::InetService, 2, 11, 2),
    };
    let mut flags = NFT_SET_ANONYMOUS | NFT_SET_CONSTANT;
    if s.interval {
        flags |= NFT_SET_INTERVAL;
    }
    b.attr_str(NFTA_SET_TABLE, table);
    b.attr_str(NFTA_SET_NAME, "__set%d");
    b.attr(NFTA_SET_FLAGS, &flags.to_be_bytes());
    b.attr(NFTA_SET_KEY_TYPE, &type_id(ty).to_be_bytes());
    b.attr(NFTA_SET_KEY_LEN, &(len as u32).to_be_bytes());
    b.attr(NFTA_SET_ID, &s.id.to_be_bytes());
    b.begin_nest(NFTA_SET_DESC);
    b.attr(NFTA_SET_DESC_SIZE, &s.size.to_be_bytes());
    b.end_nest();
    let mut u = Vec::new();
    udata_u32(&mut u, UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN);
    if s.interval {
        udata_u32(&mut u, UDATA_SET_MERGE_ELEMENTS, 1);
    }
    // `typeof` the payload field the rule matches.
    u.extend_from_slice(&[UDATA_SET_KEY_TYPEOF, 20]);
    udata_u32(&mut u, UDATA_TYPEOF_EXPR, EXPR_PAYLOAD);
    u.extend_from_slice(&[UDATA_TYPEOF_DATA, 12]);
    udata_u32(&mut u, 0, desc);
    udata_u32(&mut u, 1, tmpl);
    b.attr(NFTA_SET_USERDATA, &u);
}

/// One kernel entry of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) key: Vec<u8>,
    /// The inclusive end of an interval concatenation's element.
    pub(super) key_end: Option<Vec<u8>>,
    /// `NFT_SET_ELEM_INTERVAL_END` or 0.
    pub(super) flags: u32,
    /// The start of an interval reaching the end of the key space.
    pub(super) open: bool,
    pub(super) verdict: Option<Verdict>,
}

impl Entry {
    fn key(key: Vec<u8>) -> Entry {
        Entry {
            key,
            key_end: None,
            flags: 0,
            open: false,
            verdict: None,
        }
    }
}

/// An inclusive range of keys of `width` bytes, as numbers.
pub(super) type Range = (u128, u128);

/// `v` as a big-endian key of `width` bytes.
pub(super) fn be(v: u128, width: usize) -> Vec<u8> {
    v.to_be_bytes()[16 - width..].to_vec()
}

/// Sorted ranges with overlapping and adjacent ones merged, as nft merges auto-merge and
/// anonymous interval sets.
pub(super) fn merged(mut v: Vec<Range>) -> Vec<Range> {
    v.sort_unstable();
    let mut out: Vec<Range> = Vec::with_capacity(v.len());
    for r in v {
        match out.last_mut() {
            Some(last) if r.0 <= last.1.saturating_add(1) && last.1 != u128::MAX => {
                last.1 = last.1.max(r.1);
            }
            Some(last) if last.1 == u128::MAX => {}
            _ => out.push(r),
        }
    }
    out
}

/// The largest key of `width` bytes.
pub(super) fn key_max(width: usize) -> u128 {
    if width >= 16 {
        u128::MAX
    } else {
        (1u128 << (8 * width)) - 1
    }
}

/// The entries of interval ranges (sorted, disjoint) of keys of `width` bytes: an end entry at
/// 0 first when `first_segment` and the first range does not start there, then a start and an
/// end entry per range (none for a range reaching the end, whose start is flagged open).
pub(super) fn interval_entries(ranges: &[Range], width: usize, first_segment: bool) -> Vec<Entry> {
    let max = key_max(width);
    let mut out = Vec::with_capacity(ranges.len() * 2 + 1);
    if first_segment && ranges.first().is_some_and(|r| r.0 != 0) {
        out.push(Entry {
            flags: NFT_SET_ELEM_INTERVAL_END,
            ..Entry::key(be(0, width))
        });
    }
    for &(a, b) in ranges {
        out.push(Entry {
            open: b == max,
            ..Entry::key(be(a, width))
        });
        if b != max {
            out.push(Entry {
                flags: NFT_SET_ELEM_INTERVAL_END,
                ..Entry::key(be(b + 1, width))
            });
        }
    }
    out
}

fn ip_octets(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn ip_width(ip: &IpAddr) -> usize {
    if ip.is_ipv4() { 4 } else { 16 }
}

/// The inclusive range of a key of an interval set of one field.
fn key_range(key: &Key) -> Option<(Range, usize)> {
    match key {
        Key::Addr(ip) => Some(((addr_bits(ip), addr_bits(ip)), ip_width(ip))),
        Key::Net(n) => {
            let n = n.trunc();
            Some((
                (addr_bits(&n.network()), addr_bits(&n.broadcast())),
                ip_width(&n.addr()),
            ))
        }
        _ => None,
    }
}

fn bad(set: &str, e: &Element, why: &str) -> LinuxError {
    LinuxError::InvalidArgument(format!("element {e} of set {set}: {why}"))
}

/// The key bytes of one element of a set of no interval (or of an interval concatenation,
/// with the end key): a concatenation's fields are each padded to 4 bytes, ports big-endian.
fn plain_entry(set: &str, e: &Element) -> Result<Entry> {
    let mut entry = match &e.key {
        Key::Addr(ip) => Entry::key(ip_octets(ip)),
        Key::AddrPort(ip, port) => {
            let mut k = ip_octets(ip);
            k.extend_from_slice(&port.to_be_bytes());
            k.extend_from_slice(&[0, 0]);
            Entry::key(k)
        }
        Key::AddrProtoPort { addr, proto, port } => {
            if addr.first.is_ipv4() != addr.last.is_ipv4() {
                return Err(bad(set, e, "address range of two families"));
            }
            let concat = |ip: &IpAddr, p: u8, port: u16| {
                let mut k = ip_octets(ip);
                k.extend_from_slice(&[p, 0, 0, 0]);
                k.extend_from_slice(&port.to_be_bytes());
                k.extend_from_slice(&[0, 0]);
                k
            };
            Entry {
                key_end: Some(concat(&addr.last, proto.last, port.last)),
                ..Entry::key(concat(&addr.first, proto.first, port.first))
            }
        }
        Key::Ifname(name) => {
            if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('\0') {
                return Err(bad(set, e, "an interface name is 1-15 bytes"));
            }
            let mut k = name.as_bytes().to_vec();
            k.resize(IFNAMSIZ, 0);
            Entry::key(k)
        }
        Key::Net(_) => return Err(bad(set, e, "a prefix in a set without intervals")),
    };
    entry.verdict = e.verdict.clone();
    Ok(entry)
}

/// The kernel entries of a run of elements of one set, all added or all removed. `fresh`:
/// the set was created or flushed in this batch and gets no element before these (nft then
/// sends the end entry at 0 of an interval set).
pub(super) fn entries(
    set: &str,
    t: &SetType,
    add: bool,
    elements: &[&Element],
    fresh: bool,
) -> Result<Vec<Entry>> {
    if !(t.interval && t.key.len() == 1) {
        return elements.iter().map(|e| plain_entry(set, e)).collect();
    }
    let mut ranges = Vec::with_capacity(elements.len());
    let mut width = None;
    for e in elements {
        let (r, w) = key_range(&e.key).ok_or_else(|| bad(set, e, "not an address or prefix"))?;
        if width.is_some_and(|x| x != w) {
            return Err(bad(set, e, "addresses of two families"));
        }
        width = Some(w);
        ranges.push(r);
    }
    let Some(width) = width else {
        return Ok(Vec::new());
    };
    let ranges = if t.auto_merge && add {
        merged(ranges)
    } else {
        ranges.sort_unstable();
        if add && ranges.windows(2).any(|w| w[1].0 <= w[0].1) {
            return Err(LinuxError::InvalidArgument(format!(
                "overlapping intervals added to set {set}, which does not merge them"
            )));
        }
        ranges
    };
    Ok(interval_entries(&ranges, width, add && fresh))
}

/// `NFTA_SET_ELEM_LIST_ELEMENTS` entries: key (and end key), flags, open-interval user data,
/// and an added map element's verdict (deletes are matched by key: nft omits the data).
pub(super) fn encode_entries(b: &mut Batch, entries: &[Entry], add: bool) -> Result<()> {
    b.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
    for e in entries {
        b.begin_nest(NFTA_LIST_ELEM);
        if e.flags != 0 {
            b.attr(NFTA_SET_ELEM_FLAGS, &e.flags.to_be_bytes());
        }
        b.begin_nest(NFTA_SET_ELEM_KEY);
        b.attr(NFTA_DATA_VALUE, &e.key);
        b.end_nest();
        if let Some(end) = &e.key_end {
            b.begin_nest(NFTA_SET_ELEM_KEY_END);
            b.attr(NFTA_DATA_VALUE, end);
            b.end_nest();
        }
        if let (Some(v), true) = (&e.verdict, add) {
            b.begin_nest(NFTA_SET_ELEM_DATA);
            encode_verdict(b, v)?;
            b.end_nest();
        }
        if e.open && add {
            let mut u = Vec::new();
            udata_u32(&mut u, UDATA_SET_ELEM_FLAGS, UDATA_SET_ELEM_F_INTERVAL_OPEN);
            b.attr(NFTA_SET_ELEM_USERDATA, &u);
        }
        b.end_nest();
    }
    b.end_nest();
    Ok(())
}

/// `NFTA_DATA_VERDICT { code, chain }` (inside an element's data or an immediate's data).
pub(super) fn encode_verdict(b: &mut Batch, v: &Verdict) -> Result<()> {
    use super::{
        NF_ACCEPT, NF_DROP, NFT_CONTINUE, NFT_GOTO, NFT_JUMP, NFT_RETURN, NFTA_DATA_VERDICT,
        NFTA_VERDICT_CHAIN, NFTA_VERDICT_CODE,
    };
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Continue => (NFT_CONTINUE, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    b.begin_nest(NFTA_DATA_VERDICT);
    b.attr(NFTA_VERDICT_CODE, &code.to_be_bytes());
    if let Some(c) = chain {
        b.attr_str(NFTA_VERDICT_CHAIN, c);
    }
    b.end_nest();
    Ok(())
}

/// The table and set attributes of a NEWSETELEM / DELSETELEM message.
pub(super) fn encode_elem_list_head(b: &mut Batch, table: &str, set: &str, id: Option<u32>) {
    b.attr_str(NFTA_SET_ELEM_LIST_TABLE, table);
    b.attr_str(NFTA_SET_ELEM_LIST_SET, set);
    if let Some(id) = id {
        b.attr(NFTA_SET_ELEM_LIST_SET_ID, &id.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_when_they_overlap_or_touch() {
        assert_eq!(
            merged(vec![(10, 20), (21, 30), (5, 12), (40, 50), (45, 46)]),
            vec![(5, 30), (40, 50)]
        );
        assert_eq!(merged(vec![(0, u128::MAX), (3, 4)]), vec![(0, u128::MAX)]);
        assert_eq!(merged(vec![(5, u128::MAX), (0, 4)]), vec![(0, u128::MAX)]);
    }

    #[test]
    fn interval_entries_start_at_zero_and_leave_open_ends_open() {
        let e = interval_entries(&[(10, 20), (0xffff_ff00, 0xffff_ffff)], 4, true);
        let keys: Vec<(Vec<u8>, u32, bool)> =
            e.iter().map(|e| (e.key.clone(), e.flags, e.open)).collect();
        assert_eq!(
            keys,
            vec![
                (vec![0, 0, 0, 0], NFT_SET_ELEM_INTERVAL_END, false),
                (vec![0, 0, 0, 10], 0, false),
                (vec![0, 0, 0, 21], NFT_SET_ELEM_INTERVAL_END, false),
                (vec![0xff, 0xff, 0xff, 0], 0, true),
            ]
        );
        // A first range starting at 0 needs no end entry before it.
        assert_eq!(interval_entries(&[(0, 1)], 2, true).len(), 2);
    }

    #[test]
    fn concatenations_pad_fields_and_ends_are_inclusive() {
        let e = Element {
            key: Key::AddrProtoPort {
                addr: tern_nft::AddrRange {
                    first: "10.0.0.0".parse().unwrap(),
                    last: "10.255.255.255".parse().unwrap(),
                },
                proto: tern_nft::Span::one(6),
                port: tern_nft::PortRange::new(80, 90),
            },
            verdict: None,
        };
        let entry = plain_entry("fp", &e).unwrap();
        assert_eq!(entry.key, vec![10, 0, 0, 0, 6, 0, 0, 0, 0, 80, 0, 0]);
        assert_eq!(
            entry.key_end.unwrap(),
            vec![10, 255, 255, 255, 6, 0, 0, 0, 0, 90, 0, 0]
        );
        let e = Element {
            key: Key::AddrPort("10.0.0.1".parse().unwrap(), 8080),
            verdict: None,
        };
        assert_eq!(
            plain_entry("np", &e).unwrap().key,
            vec![10, 0, 0, 1, 0x1f, 0x90, 0, 0]
        );
    }

    #[test]
    fn key_types_and_lengths_of_concatenations() {
        let fp = [
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService,
        ];
        assert_eq!(key_type(&fp), 0x730d);
        assert_eq!(key_len(&fp), 12);
        assert_eq!(
            key_type(&[DataType::Ipv4Addr, DataType::InetService]),
            0x1cd
        );
        assert_eq!(key_len(&[DataType::Ifname]), 16);
    }
}
