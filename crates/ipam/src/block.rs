//! The stored IPAM records (blocks, affinities, handles) and the pure operations on a block.
//! JSON field names follow Calico's `IPAMBlock`, so `ternctl` output reads the same.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::AllocationAttrs;

/// Who an allocation belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationAttribute {
    pub handle_id: Option<String>,
    pub secondary: AllocationAttrs,
}

/// An allocation block: a block-sized CIDR of a pool, usually affine to one node.
///
/// In memory the block has Calico's `IPAMBlock` shape. Stored, it is written in a compact JSON
/// form (see [`Block`]'s `Serialize`: format 2) because every allocation rewrites the whole
/// block and the write's cost grows with its size; both that form and the Calico-style form
/// written by earlier versions are read, so old blocks migrate on their next write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub cidr: IpNet,
    /// `host:<node>` when the block belongs to a node.
    pub affinity: Option<String>,
    /// Per ordinal: index into `attributes`, or `None` when free.
    pub allocations: Vec<Option<u32>>,
    /// Free ordinals, allocated from the front and released to the back, so the address that
    /// has been free longest is reused first.
    pub unallocated: Vec<u32>,
    pub attributes: Vec<AllocationAttribute>,
    /// Increases with every allocation; lets a release prove it targets the allocation it saw.
    pub sequence_number: u64,
    /// The sequence number of each live allocation, by ordinal.
    pub sequence_number_for_allocation: BTreeMap<u32, u64>,
    pub deleted: bool,
    /// When each free ordinal was last released (unix seconds), for the release cooldown;
    /// the entry goes when the ordinal is allocated again.
    pub released_at: BTreeMap<u32, u64>,
    /// Since when (unix seconds) the block has had no allocation; `None` while in use.
    pub emptied_at: Option<u64>,
}

/// The stored form of a [`Block`], a superset of both formats so one pass reads either.
///
/// Format 1 (no `v`, as written by earlier versions, Calico's field names): `unallocated` is
/// a list of ordinals, `attributes` a list of `{handle_id, secondary: {...}}` objects and
/// `sequenceNumberForAllocation` a map.
///
/// Format 2 (`"v": 2`): `free` is the free list as runs (`"5-63,0,2-3"`, in free-list
/// order), `strings` holds each distinct attribute string once, `attrs` is one array of six
/// indices into `strings` per attribute (handle, namespace, pod, node, containerID, ifname;
/// -1 = no handle, -2 = the containerID is the handle's part after its last `.`, as in
/// `k8s-pod-network.<containerID>`), and `seqs` is the sequence number per ordinal (0 =
/// free). A full /26 with 64 pods takes about a third of format 1's bytes, most of what is
/// left being the pods' own names.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    cidr: IpNet,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    v: u8,
    #[serde(default)]
    allocations: Vec<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unallocated: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attributes: Option<Vec<AllocationAttribute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sequence_number_for_allocation: Option<BTreeMap<u32, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    free: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    strings: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attrs: Option<Vec<[i64; 6]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seqs: Option<Vec<u64>>,
    sequence_number: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    deleted: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    released_at: BTreeMap<u32, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    emptied_at: Option<u64>,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `-2` in the containerID slot of a format-2 attribute: the containerID is the handle's
/// part after its last `.`.
const CID_FROM_HANDLE: i64 = -2;
/// `-1` in the handle slot: the attribute has no handle.
const NO_HANDLE: i64 = -1;

/// Interns strings for format 2.
#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: std::collections::HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.list.len() as i64;
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The free list as runs of consecutive ascending ordinals, in list order.
fn encode_runs(ords: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ords.len() {
        let start = ords[i];
        let mut end = start;
        while i + 1 < ords.len() && ords[i + 1] == end.wrapping_add(1) {
            end += 1;
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

fn decode_runs(s: &str, len: usize) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for run in s.split(',').filter(|r| !r.is_empty()) {
        let num = |t: &str| {
            t.parse::<u32>()
                .map_err(|_| format!("free list run {run:?} is not a number or a range"))
        };
        let (a, b) = match run.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(run)?, num(run)?),
        };
        if a > b || b as usize >= len {
            return Err(format!(
                "free list run {run:?} is outside the block's {len} ordinals"
            ));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

impl Serialize for Block {
    /// Writes format 2 (see the format notes on `Wire` in the source).
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut strings = Strings::default();
        let attrs = self
            .attributes
            .iter()
            .map(|a| {
                let s = &a.secondary;
                let handle = a.handle_id.as_deref();
                let cid = if !s.container_id.is_empty()
                    && handle.and_then(|h| h.rsplit_once('.')).map(|(_, c)| c)
                        == Some(s.container_id.as_str())
                {
                    CID_FROM_HANDLE
                } else {
                    strings.id(&s.container_id)
                };
                [
                    handle.map_or(NO_HANDLE, |h| strings.id(h)),
                    strings.id(&s.namespace),
                    strings.id(&s.pod),
                    strings.id(&s.node),
                    cid,
                    strings.id(&s.ifname),
                ]
            })
            .collect();
        // Trailing free ordinals are left out of `allocations` and `seqs` (the reader pads
        // them back), so a fresh or nearly empty block stays small.
        let used = self
            .allocations
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |p| p + 1);
        let seqs = (0..used as u32)
            .map(|o| {
                self.sequence_number_for_allocation
                    .get(&o)
                    .copied()
                    .unwrap_or(0)
            })
            .collect();
        Wire {
            cidr: self.cidr,
            affinity: self.affinity.clone(),
            v: 2,
            allocations: self.allocations[..used].to_vec(),
            unallocated: None,
            attributes: None,
            sequence_number_for_allocation: None,
            free: Some(encode_runs(&self.unallocated)),
            strings: Some(strings.list),
            attrs: Some(attrs),
            seqs: Some(seqs),
            sequence_number: self.sequence_number,
            deleted: self.deleted,
            released_at: self.released_at.clone(),
            emptied_at: self.emptied_at,
        }
        .serialize(ser)
    }
}

impl<'de> Deserialize<'de> for Block {
    /// Reads format 1 or 2 (see `Wire` in the source) and checks every ordinal and index, so a corrupt
    /// block is an error here rather than a panic later.
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Block, D::Error> {
        let w = Wire::deserialize(de)?;
        Block::from_wire(w).map_err(serde::de::Error::custom)
    }
}

impl Block {
    fn from_wire(mut w: Wire) -> Result<Block, String> {
        if w.v >= 2 {
            // Format 2 leaves trailing free ordinals out of `allocations`.
            let host_bits = w.cidr.max_prefix_len() - w.cidr.prefix_len();
            if host_bits > 16 {
                return Err(format!("{} is too large for a block", w.cidr));
            }
            let size = block_len(&w.cidr);
            if w.allocations.len() > size {
                return Err(format!(
                    "{} allocations in a block of {size} addresses",
                    w.allocations.len()
                ));
            }
            w.allocations.resize(size, None);
        }
        let len = w.allocations.len();
        let (unallocated, attributes, seq_for) = if w.v >= 2 {
            let strings = w.strings.unwrap_or_default();
            let get = |i: i64| -> Result<String, String> {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| strings.get(i))
                    .cloned()
                    .ok_or_else(|| format!("attribute string index {i} out of range"))
            };
            let mut attributes = Vec::new();
            for [h, ns, pod, node, cid, ifname] in w.attrs.unwrap_or_default() {
                let handle_id = if h == NO_HANDLE { None } else { Some(get(h)?) };
                let container_id = if cid == CID_FROM_HANDLE {
                    handle_id
                        .as_deref()
                        .and_then(|h| h.rsplit_once('.'))
                        .map(|(_, c)| c.to_string())
                        .ok_or("containerID refers to a handle without a '.'")?
                } else {
                    get(cid)?
                };
                attributes.push(AllocationAttribute {
                    handle_id,
                    secondary: AllocationAttrs {
                        namespace: get(ns)?,
                        pod: get(pod)?,
                        node: get(node)?,
                        container_id,
                        ifname: get(ifname)?,
                    },
                });
            }
            let seq_for = w
                .seqs
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .filter(|(_, s)| *s != 0)
                .map(|(o, s)| (o as u32, s))
                .collect();
            (
                decode_runs(w.free.as_deref().unwrap_or(""), len)?,
                attributes,
                seq_for,
            )
        } else {
            (
                w.unallocated.unwrap_or_default(),
                w.attributes.unwrap_or_default(),
                w.sequence_number_for_allocation.unwrap_or_default(),
            )
        };
        if let Some(o) = unallocated.iter().find(|&&o| o as usize >= len) {
            return Err(format!(
                "free ordinal {o} is outside the block's {len} ordinals"
            ));
        }
        if let Some(i) = w
            .allocations
            .iter()
            .flatten()
            .find(|&&i| i as usize >= attributes.len())
        {
            return Err(format!(
                "allocation refers to attribute {i} of {}",
                attributes.len()
            ));
        }
        Ok(Block {
            cidr: w.cidr,
            affinity: w.affinity,
            allocations: w.allocations,
            unallocated,
            attributes,
            sequence_number: w.sequence_number,
            sequence_number_for_allocation: seq_for,
            deleted: w.deleted,
            released_at: w.released_at,
            emptied_at: w.emptied_at,
        })
    }
}

/// The affinity prefix of a node's blocks.
pub fn host_affinity(node: &str) -> String {
    format!("host:{node}")
}

impl Block {
    /// An empty block over `cidr`, every ordinal free in address order.
    pub fn new(cidr: IpNet, affinity: Option<String>) -> Block {
        let size = block_len(&cidr);
        Block {
            cidr,
            affinity,
            allocations: vec![None; size],
            unallocated: (0..size as u32).collect(),
            attributes: Vec::new(),
            sequence_number: 0,
            sequence_number_for_allocation: BTreeMap::new(),
            deleted: false,
            released_at: BTreeMap::new(),
            emptied_at: None,
        }
    }

    /// The address at `ordinal` of a block over `cidr`, without building the block.
    pub(crate) fn new_view(cidr: &IpNet) -> BlockView {
        BlockView(*cidr)
    }

    /// The node the block is affine to.
    pub fn affine_node(&self) -> Option<&str> {
        self.affinity
            .as_deref()
            .and_then(|a| a.strip_prefix("host:"))
    }

    /// The address at an ordinal.
    pub fn ip(&self, ordinal: u32) -> IpAddr {
        BlockView(self.cidr).ip(ordinal)
    }

    /// The ordinal of an address, if it is in the block.
    pub fn ordinal(&self, ip: IpAddr) -> Option<u32> {
        if !self.cidr.contains(&ip) {
            return None;
        }
        Some(match (self.cidr, ip) {
            (IpNet::V4(n), IpAddr::V4(a)) => u32::from(a) - u32::from(n.network()),
            (IpNet::V6(n), IpAddr::V6(a)) => (u128::from(a) - u128::from(n.network())) as u32,
            _ => return None,
        })
    }

    /// Number of allocated ordinals.
    pub fn in_use(&self) -> usize {
        self.allocations.iter().filter(|a| a.is_some()).count()
    }

    /// The handle owning an ordinal.
    pub fn handle_of(&self, ordinal: u32) -> Option<&str> {
        let idx = (*self.allocations.get(ordinal as usize)?)?;
        self.attributes.get(idx as usize)?.handle_id.as_deref()
    }

    fn attribute_index(&mut self, handle: &str, attrs: &AllocationAttrs) -> u32 {
        let attr = AllocationAttribute {
            handle_id: Some(handle.to_string()),
            secondary: attrs.clone(),
        };
        if let Some(i) = self.attributes.iter().position(|a| *a == attr) {
            return i as u32;
        }
        self.attributes.push(attr);
        (self.attributes.len() - 1) as u32
    }

    fn record(&mut self, ordinal: u32, attr: u32) {
        self.allocations[ordinal as usize] = Some(attr);
        self.sequence_number += 1;
        self.sequence_number_for_allocation
            .insert(ordinal, self.sequence_number);
        self.released_at.remove(&ordinal);
        self.emptied_at = None;
    }

    /// Allocates up to `n` free ordinals (oldest-free first) to the handle.
    pub fn allocate(&mut self, n: usize, handle: &str, attrs: &AllocationAttrs) -> Vec<u32> {
        self.allocate_where(n, handle, attrs, |_| true)
    }

    /// Allocates up to `n` free ordinals accepted by `usable` (reservations, cooldown),
    /// oldest-free first; ordinals skipped keep their place in the free list.
    pub fn allocate_where(
        &mut self,
        n: usize,
        handle: &str,
        attrs: &AllocationAttrs,
        usable: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        let mut ords = Vec::new();
        let mut kept = Vec::with_capacity(self.unallocated.len());
        for &o in &self.unallocated {
            if ords.len() < n && usable(o) {
                ords.push(o);
            } else {
                kept.push(o);
            }
        }
        if ords.is_empty() {
            return ords;
        }
        self.unallocated = kept;
        let attr = self.attribute_index(handle, attrs);
        for &o in &ords {
            self.record(o, attr);
        }
        ords
    }

    /// Allocates one specific ordinal; `Err(owner handle)` when it is taken.
    pub fn allocate_ordinal(
        &mut self,
        ordinal: u32,
        handle: &str,
        attrs: &AllocationAttrs,
    ) -> Result<(), String> {
        if let Some(pos) = self.unallocated.iter().position(|&o| o == ordinal) {
            self.unallocated.remove(pos);
            let attr = self.attribute_index(handle, attrs);
            self.record(ordinal, attr);
            Ok(())
        } else {
            Err(self.handle_of(ordinal).unwrap_or("<unknown>").to_string())
        }
    }

    /// Frees the ordinals (those allocated); returns, per freed ordinal, the handle it had.
    /// The release time is recorded as 0 (no cooldown); see [`Block::release_at`].
    pub fn release(&mut self, ordinals: &[u32]) -> Vec<(u32, Option<String>)> {
        self.release_at(ordinals, 0)
    }

    /// Frees the ordinals at time `now` (unix seconds): each freed ordinal goes to the back of
    /// the free list stamped `now`, and a block left empty records `emptied_at = now`.
    pub fn release_at(&mut self, ordinals: &[u32], now: u64) -> Vec<(u32, Option<String>)> {
        let mut freed = Vec::new();
        for &o in ordinals {
            let Some(Some(idx)) = self.allocations.get(o as usize).copied() else {
                continue;
            };
            let handle = self
                .attributes
                .get(idx as usize)
                .and_then(|a| a.handle_id.clone());
            self.allocations[o as usize] = None;
            self.sequence_number_for_allocation.remove(&o);
            self.unallocated.push(o);
            if now > 0 {
                self.released_at.insert(o, now);
            }
            freed.push((o, handle));
        }
        if !freed.is_empty() {
            self.compact_attributes();
            if self.in_use() == 0 {
                self.emptied_at = Some(now);
            }
        }
        freed
    }

    /// Ordinals allocated to a handle.
    pub fn ordinals_of(&self, handle: &str) -> Vec<u32> {
        (0..self.allocations.len() as u32)
            .filter(|&o| self.handle_of(o) == Some(handle))
            .collect()
    }

    /// Drops attributes no allocation refers to, renumbering the rest, so the block does not
    /// grow with churn.
    fn compact_attributes(&mut self) {
        let mut remap = vec![None; self.attributes.len()];
        let mut kept = Vec::new();
        for a in self.allocations.iter_mut().flatten() {
            let old = *a as usize;
            let new = *remap[old].get_or_insert_with(|| {
                kept.push(self.attributes[old].clone());
                (kept.len() - 1) as u32
            });
            *a = new;
        }
        self.attributes = kept;
    }
}

/// Address arithmetic of a block's CIDR alone.
pub(crate) struct BlockView(IpNet);

impl BlockView {
    pub(crate) fn ip(&self, ordinal: u32) -> IpAddr {
        match self.0 {
            IpNet::V4(n) => {
                IpAddr::V4(Ipv4Addr::from(u32::from(n.network()).wrapping_add(ordinal)))
            }
            IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(
                u128::from(n.network()).wrapping_add(ordinal as u128),
            )),
        }
    }
}

/// Number of addresses in a block.
pub fn block_len(cidr: &IpNet) -> usize {
    1usize << (cidr.max_prefix_len() - cidr.prefix_len())
}

/// State of a node's claim on a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AffinityState {
    /// Claim in progress (block may not exist yet); treated as absent by readers.
    Pending,
    Confirmed,
    PendingDeletion,
}

/// A node's affinity for a block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affinity {
    pub state: AffinityState,
}

/// One stored affinity, with the node and block it links (for `ipam check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinityRecord {
    pub node: String,
    pub cidr: IpNet,
    pub state: AffinityState,
}

/// One stored handle with its per-block counts (for `ipam check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleRecord {
    pub id: String,
    /// Block CIDR → number of the handle's addresses in it.
    pub blocks: BTreeMap<String, u32>,
}

/// All blocks holding addresses of one handle, with counts, for O(blocks) release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    pub block: BTreeMap<String, u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs() -> AllocationAttrs {
        AllocationAttrs {
            namespace: "ns".into(),
            pod: "p".into(),
            node: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn fifo_and_compaction() {
        let mut b = Block::new("10.0.0.0/30".parse().unwrap(), None);
        assert_eq!(b.allocate(2, "h1", &attrs()), vec![0, 1]);
        assert_eq!(b.allocate(1, "h2", &attrs()), vec![2]);
        assert_eq!(b.attributes.len(), 2);
        assert_eq!(b.release(&[0, 1]).len(), 2);
        // h1's attribute is gone; h2's allocation was renumbered.
        assert_eq!(b.attributes.len(), 1);
        assert_eq!(b.handle_of(2), Some("h2"));
        // 3 was free longest, then 0, then 1.
        assert_eq!(b.unallocated, vec![3, 0, 1]);
        assert_eq!(b.ip(3), "10.0.0.3".parse::<IpAddr>().unwrap());
        assert_eq!(b.ordinal("10.0.0.2".parse().unwrap()), Some(2));
        assert_eq!(b.ordinal("10.0.0.4".parse().unwrap()), None);
        assert_eq!(b.allocate_ordinal(2, "h3", &attrs()), Err("h2".to_string()));
        assert_eq!(b.sequence_number, 3);
        assert_eq!(b.sequence_number_for_allocation.get(&2), Some(&3));
    }

    fn k8s_attrs(i: usize) -> AllocationAttrs {
        AllocationAttrs {
            namespace: "default".into(),
            pod: format!("web-7d4b9c-{i:05}"),
            node: "worker-1".into(),
            container_id: format!("{i:064x}"),
            ifname: "eth0".into(),
        }
    }

    /// A full /26 as Kubernetes fills it: handle `k8s-pod-network.<containerID>`.
    fn full_block() -> Block {
        let mut b = Block::new(
            "10.244.3.0/26".parse().unwrap(),
            Some(host_affinity("worker-1")),
        );
        for i in 0..64 {
            let a = k8s_attrs(i);
            b.allocate(1, &format!("k8s-pod-network.{}", a.container_id), &a);
        }
        b
    }

    /// The block in format 1, as the derived encoding of earlier versions wrote it.
    fn format1(b: &Block) -> Vec<u8> {
        serde_json::to_vec(&Wire {
            cidr: b.cidr,
            affinity: b.affinity.clone(),
            v: 0,
            allocations: b.allocations.clone(),
            unallocated: Some(b.unallocated.clone()),
            attributes: Some(b.attributes.clone()),
            sequence_number_for_allocation: Some(b.sequence_number_for_allocation.clone()),
            free: None,
            strings: None,
            attrs: None,
            seqs: None,
            sequence_number: b.sequence_number,
            deleted: b.deleted,
            released_at: b.released_at.clone(),
            emptied_at: b.emptied_at,
        })
        .unwrap()
    }

    #[test]
    fn compact_format_round_trips_every_field() {
        let mut b = full_block();
        b.release_at(&[5, 6, 7, 40], 1_700_000_000);
        // An attribute whose containerID is not the handle's suffix, and one without handle.
        let odd = AllocationAttrs {
            container_id: "other".into(),
            ..attrs()
        };
        b.allocate(1, "plain-handle", &odd);
        b.allocate_ordinal(40, "x.y", &AllocationAttrs::default())
            .unwrap();
        b.attributes.push(AllocationAttribute {
            handle_id: None,
            secondary: attrs(),
        });
        let last = b.attributes.len() as u32 - 1;
        let o = b.unallocated.remove(0);
        b.allocations[o as usize] = Some(last);
        b.deleted = true;
        let json = serde_json::to_vec(&b).unwrap();
        let text = String::from_utf8(json.clone()).unwrap();
        assert!(text.contains("\"v\":2"), "{text}");
        assert!(text.contains("\"free\":\"7\""), "{text}");
        let back: Block = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, b);
    }

    #[test]
    fn format1_blocks_are_still_read_and_migrate_on_write() {
        let mut b = full_block();
        b.release_at(&[3, 9], 1_700_000_000);
        let old = format1(&b);
        let text = String::from_utf8(old.clone()).unwrap();
        assert!(
            text.contains("\"handle_id\"") && !text.contains("\"v\""),
            "{text}"
        );
        let read: Block = serde_json::from_slice(&old).unwrap();
        assert_eq!(read, b);
        // Written again, it is format 2 and reads back the same.
        let new = serde_json::to_vec(&read).unwrap();
        assert_eq!(serde_json::from_slice::<Block>(&new).unwrap(), b);
        // A literal block as an earlier version stored it.
        let literal = br#"{"cidr":"10.0.0.0/30","affinity":"host:n","allocations":[0,null,null,0],
            "unallocated":[2,1],"attributes":[{"handle_id":"h","secondary":{"namespace":"ns",
            "pod":"p","node":"n","containerID":"c","ifname":"eth0"}}],"sequenceNumber":2,
            "sequenceNumberForAllocation":{"0":1,"3":2},"deleted":false}"#;
        let b: Block = serde_json::from_slice(literal).unwrap();
        assert_eq!(b.unallocated, vec![2, 1]);
        assert_eq!(b.ordinals_of("h"), vec![0, 3]);
        assert_eq!(b.attributes[0].secondary.container_id, "c");
        assert_eq!(b.sequence_number_for_allocation.get(&3), Some(&2));
    }

    #[test]
    fn compact_format_is_much_smaller() {
        let b = full_block();
        let old = format1(&b).len();
        let new = serde_json::to_vec(&b).unwrap().len();
        // The pods' names and containerIDs are most of what is left.
        assert!(new * 2 < old, "format 2 is {new} bytes, format 1 {old}");
        let empty = Block::new("10.244.3.0/26".parse().unwrap(), Some(host_affinity("w")));
        let empty_json = serde_json::to_vec(&empty).unwrap();
        assert!(
            empty_json.len() < 160,
            "{}",
            String::from_utf8_lossy(&empty_json)
        );
        assert_eq!(serde_json::from_slice::<Block>(&empty_json).unwrap(), empty);
    }

    #[test]
    fn corrupt_compact_blocks_are_errors_not_panics() {
        let base = |extra: &str| {
            format!(
                r#"{{"cidr":"10.0.0.0/30","v":2,"allocations":[0,null,null,null],"sequenceNumber":1{extra}}}"#
            )
        };
        for (extra, want) in [
            (
                r#","free":"1-3","strings":["a"],"attrs":[[0,0,0,0,7,0]]"#,
                "index 7",
            ),
            (
                r#","free":"1-4","strings":["a"],"attrs":[[0,0,0,0,0,0]]"#,
                "outside",
            ),
            (
                r#","free":"1-3","strings":[],"attrs":[]"#,
                "attribute 0 of 0",
            ),
            (
                r#","free":"x","strings":["a"],"attrs":[[0,0,0,0,0,0]]"#,
                "not a number",
            ),
        ] {
            let e = serde_json::from_str::<Block>(&base(extra))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn free_list_runs() {
        for list in [vec![], vec![0], vec![5, 6, 7, 0, 2, 3, 1], vec![3, 2, 1]] {
            let s = encode_runs(&list);
            assert_eq!(decode_runs(&s, 8).unwrap(), list, "{s}");
        }
        assert_eq!(encode_runs(&[5, 6, 7, 0, 2, 3]), "5-7,0,2-3");
    }

    #[test]
    fn v6_ordinals() {
        let b = Block::new("fd00::40/122".parse().unwrap(), Some(host_affinity("n1")));
        assert_eq!(b.allocations.len(), 64);
        assert_eq!(b.ip(1), "fd00::41".parse::<IpAddr>().unwrap());
        assert_eq!(b.affine_node(), Some("n1"));
    }
}
