//! Read-only listings for tools and audits: usage per pool, allocations, blocks, affinities,
//! handles, borrowed addresses, whether a pool is in use.

use std::collections::BTreeMap;

use ipnet::IpNet;
use tern_store::keys;

use crate::api::{Allocation, BlockUsage, PoolUsage};
use crate::block::{Affinity, AffinityRecord, Block, Handle, HandleRecord};
use crate::client::Ipam;
use crate::codec::decode;
use crate::error::{IpamError, Result};

impl Ipam {
    /// Usage per pool and per block (for `ternctl ipam show`), pools in store order, blocks
    /// in address order.
    pub fn usage(&self) -> Result<Vec<PoolUsage>> {
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        let blocks: Vec<Block> = kvs.iter().map(decode).collect::<Result<_>>()?;
        let mut out = Vec::new();
        for p in self.pools()? {
            let mut bl: Vec<BlockUsage> = blocks
                .iter()
                .filter(|b| p.net.contains(&b.cidr))
                .map(|b| BlockUsage {
                    cidr: b.cidr,
                    total: b.allocations.len() as u128,
                    in_use: b.in_use() as u128,
                    affinity: b.affine_node().map(str::to_string),
                })
                .collect();
            bl.sort_by_key(|b| b.cidr);
            let host_bits = (p.net.max_prefix_len() - p.net.prefix_len()) as u32;
            out.push(PoolUsage {
                pool: p.name,
                cidr: p.net,
                total: 1u128.checked_shl(host_bits).unwrap_or(u128::MAX),
                in_use: bl.iter().map(|b| b.in_use).sum(),
                blocks: bl,
            });
        }
        Ok(out)
    }

    /// Every live allocation, or only those on blocks affine to `node` plus those made by
    /// `node` in borrowed blocks (attribute `node`), for leak repair.
    pub fn allocations(&self, node: Option<&str>) -> Result<Vec<Allocation>> {
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        let mut out = Vec::new();
        for kv in &kvs {
            let b: Block = decode(kv)?;
            for (ord, a) in b.allocations.iter().enumerate() {
                let Some(idx) = a else { continue };
                let Some(attr) = b.attributes.get(*idx as usize) else {
                    continue;
                };
                let mine =
                    node.is_none_or(|n| b.affine_node() == Some(n) || attr.secondary.node == n);
                if !mine {
                    continue;
                }
                out.push(Allocation {
                    ip: b.ip(ord as u32),
                    handle: attr.handle_id.clone(),
                    attrs: attr.secondary.clone(),
                    block: b.cidr,
                    sequence_number: b
                        .sequence_number_for_allocation
                        .get(&(ord as u32))
                        .copied()
                        .unwrap_or(0),
                });
            }
        }
        Ok(out)
    }

    /// Why the pool named `name` cannot be deleted: `Some("IPPool \"p\" (10.0.0.0/16)
    /// still has 3 addresses allocated in blocks 10.0.0.0/26 (3 in use)")` while any of its
    /// blocks holds an allocation, `None` when it holds none (or does not exist).
    pub fn pool_in_use(&self, name: &str) -> Result<Option<String>> {
        let Some(pool) = self.pools()?.into_iter().find(|p| p.name == name) else {
            return Ok(None);
        };
        let mut total = 0usize;
        let mut held = Vec::new();
        for b in self.blocks()? {
            let n = b.in_use();
            if n > 0 && pool.net.contains(&b.cidr) {
                total += n;
                held.push(format!("{} ({n} in use)", b.cidr));
            }
        }
        if total == 0 {
            return Ok(None);
        }
        Ok(Some(format!(
            "IPPool {name:?} ({}) still has {total} addresses allocated in blocks {}; release them first",
            pool.net,
            held.join(", ")
        )))
    }

    /// Every stored block, in key order.
    pub fn blocks(&self) -> Result<Vec<Block>> {
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        kvs.iter().map(decode).collect()
    }

    /// Every stored affinity, or only those of `node`.
    pub fn affinities(&self, node: Option<&str>) -> Result<Vec<AffinityRecord>> {
        let prefix = match node {
            Some(n) => keys::node_affinities(n),
            None => keys::AFFINITIES.to_string(),
        };
        let (kvs, _) = self.store.range(&prefix)?;
        let mut out = Vec::new();
        for kv in &kvs {
            let a: Affinity = decode(kv)?;
            let rest = &kv.key[keys::AFFINITIES.len()..];
            let Some((n, seg)) = rest.split_once('/') else {
                continue;
            };
            let Ok(cidr) = keys::segment_cidr(seg).parse::<IpNet>() else {
                return Err(IpamError::Corrupt {
                    key: kv.key.clone(),
                    message: format!("{seg:?} is not a block CIDR"),
                });
            };
            out.push(AffinityRecord {
                node: n.to_string(),
                cidr,
                state: a.state,
            });
        }
        Ok(out)
    }

    /// Every stored handle with its per-block counts.
    pub fn handles(&self) -> Result<Vec<HandleRecord>> {
        let (kvs, _) = self.store.range(keys::HANDLES)?;
        let mut out = Vec::new();
        for kv in &kvs {
            let h: Handle = decode(kv)?;
            out.push(HandleRecord {
                id: kv.key[keys::HANDLES.len()..].to_string(),
                blocks: h.block,
            });
        }
        Ok(out)
    }

    /// Borrowed allocations: those whose `node` attribute names a node other than the one
    /// the block is affine to (or the block has no affinity); only those made by `node`
    /// when given. For `ipam show --show-borrowed`.
    pub fn borrowed(&self, node: Option<&str>) -> Result<Vec<Allocation>> {
        let affine: BTreeMap<IpNet, Option<String>> = self
            .blocks()?
            .into_iter()
            .map(|b| (b.cidr, b.affine_node().map(str::to_string)))
            .collect();
        Ok(self
            .allocations(None)?
            .into_iter()
            .filter(|a| {
                !a.attrs.node.is_empty()
                    && node.is_none_or(|n| a.attrs.node == n)
                    && affine.get(&a.block).cloned().flatten().as_deref() != Some(&a.attrs.node)
            })
            .collect())
    }
}
