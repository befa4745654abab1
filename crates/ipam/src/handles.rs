//! Handles (who holds which addresses): rebuilding the handle index, looking a handle up.

use std::collections::BTreeMap;
use std::net::IpAddr;

use tern_store::keys;

use crate::block::Handle;
use crate::client::Ipam;
use crate::codec::encode;
use crate::error::Result;

impl Ipam {
    /// Writes a handle record for every handle the blocks hold (the per-block counts read
    /// from the blocks), for a store that keeps them ([`Store::multi_key_txn`]) after a
    /// migration from one that does not. Returns how many were written.
    pub fn rebuild_handles(&self) -> Result<usize> {
        if !self.indexed {
            return Ok(0);
        }
        let mut handles: BTreeMap<String, Handle> = BTreeMap::new();
        for b in self.blocks()? {
            for o in 0..b.allocations.len() as u32 {
                if let Some(h) = b.handle_of(o) {
                    *handles
                        .entry(h.to_string())
                        .or_default()
                        .block
                        .entry(b.cidr.to_string())
                        .or_default() += 1;
                }
            }
        }
        for (id, h) in &handles {
            self.store.put(&keys::handle(id), &encode(h))?;
        }
        Ok(handles.len())
    }

    /// The addresses held by the handle.
    pub fn ips_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>> {
        let mut out = Vec::new();
        for (_, b) in self.handle_blocks(handle)? {
            out.extend(b.ordinals_of(handle).into_iter().map(|o| b.ip(o)));
        }
        Ok(out)
    }

    /// True when `handle` holds at least one address and every address it holds was
    /// allocated for container `container_id`, interface `ifname` (an empty interface is
    /// `eth0`), by the allocation attributes. Used to accept a handle of the old, ambiguous
    /// form (`<network>.<containerID>[.<ifname>]`) as an attachment's own: such a handle may
    /// also be another attachment's, whose attributes then differ.
    pub fn handle_held_by(&self, handle: &str, container_id: &str, ifname: &str) -> Result<bool> {
        let norm = |s: &str| {
            if s.is_empty() {
                "eth0".to_string()
            } else {
                s.to_string()
            }
        };
        let mut held = 0usize;
        for (_, b) in self.handle_blocks(handle)? {
            for a in b.allocations.iter().flatten() {
                let Some(attr) = b.attributes.get(*a as usize) else {
                    continue;
                };
                if attr.handle_id.as_deref() != Some(handle) {
                    continue;
                }
                if attr.secondary.container_id != container_id
                    || norm(&attr.secondary.ifname) != norm(ifname)
                {
                    return Ok(false);
                }
                held += 1;
            }
        }
        Ok(held > 0)
    }
}
