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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
    #[serde(default)]
    pub sequence_number_for_allocation: BTreeMap<u32, u64>,
    #[serde(default)]
    pub deleted: bool,
    /// When each free ordinal was last released (unix seconds), for the release cooldown;
    /// the entry goes when the ordinal is allocated again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub released_at: BTreeMap<u32, u64>,
    /// Since when (unix seconds) the block has had no allocation; `None` while in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emptied_at: Option<u64>,
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

    #[test]
    fn v6_ordinals() {
        let b = Block::new("fd00::40/122".parse().unwrap(), Some(host_affinity("n1")));
        assert_eq!(b.allocations.len(), 64);
        assert_eq!(b.ip(1), "fd00::41".parse::<IpAddr>().unwrap());
        assert_eq!(b.affine_node(), Some("n1"));
    }
}
