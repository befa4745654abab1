//! Release: by handle, by address, or a list of allocations; a block's addresses freed in one
//! compare-and-swap.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use tern_store::{Compare, Op, Txn, keys};

use crate::api::Allocation;
use crate::block::{Block, Handle};
use crate::client::Ipam;
use crate::codec::{contains, decode, encode};
use crate::error::{IpamError, RETRIES, Result};

impl Ipam {
    /// The blocks holding an address of `handle`, as read now: through the handle record
    /// where the store keeps one, else by reading every block.
    pub(crate) fn handle_blocks(&self, handle: &str) -> Result<Vec<(String, Block)>> {
        let mut out = Vec::new();
        if self.indexed {
            let Some(hkv) = self.store.get(&keys::handle(handle))? else {
                return Ok(out);
            };
            let h: Handle = decode(&hkv)?;
            for cidr in h.block.keys() {
                let bkey = keys::block(cidr);
                if let Some(bkv) = self.store.get(&bkey)? {
                    out.push((bkey, decode(&bkv)?));
                }
            }
            return Ok(out);
        }
        // Every block is read (there is no handle record to say which), but only the few
        // whose bytes hold the handle are decoded: a DEL at 1,000 nodes reads 1,000 blocks.
        // The handle is in a block's JSON as serde_json writes the string (tern writes every
        // block with serde_json).
        let quoted = serde_json::to_string(handle).unwrap_or_default();
        let needle = quoted.as_bytes();
        let needle = &needle[1..needle.len().saturating_sub(1).max(1)];
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        for kv in &kvs {
            if !needle.is_empty() && !contains(&kv.value, needle) {
                continue;
            }
            let b: Block = decode(kv)?;
            if !b.ordinals_of(handle).is_empty() {
                out.push((kv.key.clone(), b));
            }
        }
        Ok(out)
    }

    /// Releases every address of the handle and deletes the handle; returns the addresses
    /// released. An unknown handle releases nothing and is not an error (DEL is idempotent).
    ///
    /// One block per transaction (block CAS + handle CAS). In the common case (one block,
    /// cached) that is two round trips: read the handle, then the transaction; the block is
    /// read only when it is not cached or the cached copy turned out stale.
    pub fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>> {
        self.ensure_unlocked()?;
        if !self.indexed {
            // One compare-and-swap per block holding the handle; each allocation is released
            // only while it still has the sequence number read (never a later allocation of
            // the same address).
            let mut released = Vec::new();
            for (bkey, b) in self.handle_blocks(handle)? {
                let ips: Vec<(IpAddr, Option<u64>)> = b
                    .ordinals_of(handle)
                    .into_iter()
                    .map(|o| (b.ip(o), b.sequence_number_for_allocation.get(&o).copied()))
                    .collect();
                released.extend(self.release_in_block(&bkey, &ips)?);
            }
            return Ok(released);
        }
        let hkey = keys::handle(handle);
        let mut released = Vec::new();
        let mut current: Option<(Handle, i64)> = None;
        let mut use_cache = true;
        for _ in 0..RETRIES {
            let (mut h, hrev) = match current.take() {
                Some(c) => c,
                None => match self.store.get(&hkey)? {
                    Some(kv) => (decode::<Handle>(&kv)?, kv.mod_revision),
                    None => return Ok(released),
                },
            };
            let Some(cs) = h.block.keys().next().cloned() else {
                self.store.txn(Txn {
                    compare: vec![Compare::ModRevision(hkey.clone(), hrev)],
                    success: vec![Op::delete(hkey.clone())],
                    failure: vec![],
                })?;
                return Ok(released);
            };
            h.block.remove(&cs);
            let handle_op = if h.block.is_empty() {
                Op::delete(hkey.clone())
            } else {
                Op::put(hkey.clone(), encode(&h))
            };
            let cidr: Option<IpNet> = cs.parse().ok();
            let cached = match (use_cache, &cidr) {
                (true, Some(c)) => self.cached_block(c),
                _ => None,
            };
            let blk = match (cached, &cidr) {
                (Some(b), _) => Some(b),
                (None, Some(c)) => self.read_block(c)?,
                (None, None) => None,
            };
            let mut compare = vec![Compare::ModRevision(hkey.clone(), hrev)];
            let mut success = vec![handle_op];
            let mut freed = Vec::new();
            let mut written = None;
            match blk {
                Some((mut b, brev)) => {
                    let ords = b.ordinals_of(handle);
                    b.release_at(&ords, self.now());
                    freed = ords.into_iter().map(|o| b.ip(o)).collect();
                    compare.push(Compare::ModRevision(keys::block(&cs), brev));
                    success.push(Op::put(keys::block(&cs), encode(&b)));
                    written = Some(b);
                }
                None => {
                    // No such block: nothing to free there, but the entry must not survive a
                    // block created meanwhile.
                    compare.push(Compare::ModRevision(keys::block(&cs), 0));
                }
            }
            let resp = self.store.txn(Txn::when(compare, success))?;
            if resp.succeeded {
                if let Some(b) = written {
                    self.cache_block(&b, resp.revision);
                }
                released.extend(freed);
                if h.block.is_empty() {
                    return Ok(released);
                }
                // The handle as just written: no need to read it again for its next block.
                current = Some((h, resp.revision));
                use_cache = true;
            } else {
                // The handle or the block changed (or the cached block was stale): read both.
                use_cache = false;
            }
        }
        Err(IpamError::Contention { key: hkey })
    }

    /// Releases the given addresses (whoever holds them); returns those that were allocated.
    /// Addresses not allocated are ignored.
    pub fn release_ips(&self, ips: &[IpAddr]) -> Result<Vec<IpAddr>> {
        self.ensure_unlocked()?;
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        let mut by_block: BTreeMap<String, Vec<(IpAddr, Option<u64>)>> = BTreeMap::new();
        for kv in &kvs {
            // A block's key names its CIDR: only the blocks holding an address are decoded.
            let key_cidr: Option<IpNet> = keys::segment_cidr(&kv.key[keys::BLOCKS.len()..])
                .parse()
                .ok();
            if key_cidr.is_some_and(|c| !ips.iter().any(|ip| c.contains(ip))) {
                continue;
            }
            let b: Block = decode(kv)?;
            for ip in ips.iter().filter(|ip| b.cidr.contains(*ip)) {
                by_block
                    .entry(kv.key.clone())
                    .or_default()
                    .push((*ip, None));
            }
        }
        let mut released = Vec::new();
        for (bkey, ips) in by_block {
            released.extend(self.release_in_block(&bkey, &ips)?);
        }
        Ok(released)
    }

    /// Releases addresses of one block in one CAS; an address with an expected sequence number
    /// is released only if its allocation still has it.
    pub(crate) fn release_in_block(
        &self,
        bkey: &str,
        ips: &[(IpAddr, Option<u64>)],
    ) -> Result<Vec<IpAddr>> {
        for _ in 0..RETRIES {
            let Some(bkv) = self.store.get(bkey)? else {
                return Ok(Vec::new());
            };
            let mut b: Block = decode(&bkv)?;
            let ords: Vec<u32> = ips
                .iter()
                .filter_map(|(ip, seq)| {
                    let o = b.ordinal(*ip)?;
                    match seq {
                        Some(s) => {
                            (b.sequence_number_for_allocation.get(&o) == Some(s)).then_some(o)
                        }
                        None => Some(o),
                    }
                })
                .collect();
            let freed = b.release_at(&ords, self.now());
            if freed.is_empty() {
                return Ok(Vec::new());
            }
            let mut per_handle: BTreeMap<String, u32> = BTreeMap::new();
            for (_, h) in &freed {
                if let Some(h) = h {
                    *per_handle.entry(h.clone()).or_default() += 1;
                }
            }
            let mut compare = vec![Compare::ModRevision(bkey.to_string(), bkv.mod_revision)];
            let mut success = vec![Op::put(bkey.to_string(), encode(&b))];
            let cs = b.cidr.to_string();
            if !self.indexed {
                per_handle.clear();
            }
            for (handle, n) in per_handle {
                let hkey = keys::handle(&handle);
                let Some(hkv) = self.store.get(&hkey)? else {
                    continue;
                };
                let mut h: Handle = decode(&hkv)?;
                let left = h.block.get(&cs).copied().unwrap_or(0).saturating_sub(n);
                if left == 0 {
                    h.block.remove(&cs);
                } else {
                    h.block.insert(cs.clone(), left);
                }
                compare.push(Compare::ModRevision(hkey.clone(), hkv.mod_revision));
                success.push(if h.block.is_empty() {
                    Op::delete(hkey)
                } else {
                    Op::put(hkey, encode(&h))
                });
            }
            let resp = self.store.txn(Txn::when(compare, success))?;
            if resp.succeeded {
                self.cache_block(&b, resp.revision);
                return Ok(freed.into_iter().map(|(o, _)| b.ip(o)).collect());
            }
        }
        Err(IpamError::Contention {
            key: bkey.to_string(),
        })
    }

    /// Releases allocations seen earlier (by [`Ipam::allocations`]) only if each is still the
    /// same allocation (same sequence number, checked in the same compare-and-swap as the
    /// release): an address reused in between is left alone. Returns the addresses released.
    pub fn release_allocations(&self, allocs: &[Allocation]) -> Result<Vec<IpAddr>> {
        let mut by_block: BTreeMap<String, Vec<(IpAddr, Option<u64>)>> = BTreeMap::new();
        for a in allocs {
            by_block
                .entry(keys::block(&a.block.to_string()))
                .or_default()
                .push((a.ip, Some(a.sequence_number)));
        }
        let mut released = Vec::new();
        for (bkey, ips) in by_block {
            released.extend(self.release_in_block(&bkey, &ips)?);
        }
        Ok(released)
    }
}
