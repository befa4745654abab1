//! Block affinity: the node's confirmed blocks, the two-phase claim of a new block, settling
//! a half-done claim or deletion, and releasing empty blocks.

use std::collections::BTreeSet;
use std::time::Duration;

use ipnet::IpNet;
use tern_store::{Compare, KeyValue, Op, StoreError, Txn, keys};

use crate::block::{Affinity, AffinityState, Block, host_affinity};
use crate::client::Ipam;
use crate::codec::{decode, encode};
use crate::error::Result;
use crate::layout::{net_offset, node_hash, nth_block};
use crate::policy::{Filter, Pool};

impl Ipam {
    /// The node's confirmed blocks, in address order. A pending affinity whose block exists
    /// and names this node is a claim interrupted before confirmation: it is confirmed here.
    pub(crate) fn affine_blocks(&self, node: &str) -> Result<Vec<IpNet>> {
        let prefix = keys::node_affinities(node);
        let (kvs, _) = self.store.range(&prefix)?;
        let mut out = Vec::new();
        for kv in kvs {
            let a: Affinity = decode(&kv)?;
            let seg = &kv.key[prefix.len()..];
            let Ok(cidr) = keys::segment_cidr(seg).parse::<IpNet>() else {
                continue;
            };
            match a.state {
                AffinityState::Confirmed => out.push(cidr),
                AffinityState::Pending => {
                    if let Some(bkv) = self.store.get(&keys::block(&cidr.to_string()))? {
                        let b: Block = decode(&bkv)?;
                        if b.affine_node() == Some(node) {
                            self.confirm_affinity(node, &cidr, kv.mod_revision)?;
                            out.push(cidr);
                        }
                    }
                }
                AffinityState::PendingDeletion => {
                    // An empty-block release did not finish (a crash between the writes of a
                    // single-object store): settled by what the block says.
                    if self.settle_pending_deletion(node, &cidr, &kv.key, kv.mod_revision)? {
                        out.push(cidr);
                    }
                }
            }
        }
        out.sort();
        self.with_cache(|c| c.affine.insert(node.to_string(), out.clone()));
        Ok(out)
    }

    /// Settles an affinity left `PendingDeletion` (at revision `rev`) by an empty-block
    /// release that did not finish, from the block itself: still there and the node's, it is
    /// `Confirmed` again (a later release tries again) and `true` is returned; gone or
    /// another node's, the affinity goes. Everyone who meets such an affinity (the node's next
    /// read of its blocks, the release racing it) applies the same rule, so they agree.
    pub(crate) fn settle_pending_deletion(
        &self,
        node: &str,
        cidr: &IpNet,
        akey: &str,
        rev: i64,
    ) -> Result<bool> {
        let mine = match self.store.get(&keys::block(&cidr.to_string()))? {
            Some(bkv) => decode::<Block>(&bkv)?.affine_node() == Some(node),
            None => false,
        };
        if mine {
            self.confirm_affinity(node, cidr, rev)?;
        } else {
            self.store.txn(Txn::when(
                vec![Compare::ModRevision(akey.to_string(), rev)],
                vec![Op::delete(akey.to_string())],
            ))?;
        }
        Ok(mine)
    }

    pub(crate) fn confirm_affinity(&self, node: &str, cidr: &IpNet, rev: i64) -> Result<()> {
        let key = keys::affinity(node, &cidr.to_string());
        self.store.txn(Txn {
            compare: vec![Compare::ModRevision(key.clone(), rev)],
            success: vec![Op::put(
                key,
                encode(&Affinity {
                    state: AffinityState::Confirmed,
                }),
            )],
            failure: vec![],
        })?;
        Ok(())
    }

    /// Claims the first free block of `pool` in this node's order; `None` when the pool has
    /// no block left to claim.
    /// `blocks`: every stored block, when just read by the caller.
    pub(crate) fn claim_block(
        &self,
        node: &str,
        pool: &Pool,
        filter: &Filter,
        blocks: Option<Vec<KeyValue>>,
    ) -> Result<Option<IpNet>> {
        let bs = pool.spec.block_size;
        if bs < pool.net.prefix_len() || bs > pool.net.max_prefix_len() {
            return Ok(None);
        }
        let count: u128 = 1u128 << (bs - pool.net.prefix_len()).min(127);
        let kvs = match blocks {
            Some(b) => b,
            None => self.store.range(keys::BLOCKS)?.0,
        };
        let mut taken: BTreeSet<String> = kvs
            .iter()
            .map(|kv| keys::segment_cidr(&kv.key[keys::BLOCKS.len()..]))
            .collect();
        // A reservation covering the whole pool leaves nothing to claim (a common way to drain
        // a pool; a /64 of /122 blocks would otherwise be a walk of 2^58 steps).
        if filter.reserved.iter().any(|r| r.contains(&pool.net)) {
            return Ok(None);
        }
        let start = node_hash(node) as u128 % count;
        // Every step claims a free block, skips one taken block (at most one step per block in
        // the store or lost to another node), or skips a reservation's whole range of blocks
        // at once (at most twice per reservation: once more after wrapping around). So the
        // walk is bounded by those counts, not by the pool's size.
        let shift = pool.net.max_prefix_len() - bs;
        let mut i: u128 = 0;
        let mut steps: usize = 0;
        while i < count {
            steps += 1;
            if steps > taken.len() + 2 * filter.reserved.len() + 2 {
                break;
            }
            let idx = (start + i) % count;
            let cidr = nth_block(&pool.net, bs, idx);
            let cs = cidr.to_string();
            if let Some(r) = filter
                .reserved
                .iter()
                .filter(|r| r.contains(&cidr))
                .min_by_key(|r| r.prefix_len())
            {
                // `r` lies inside the pool (CIDRs nest or are disjoint, and none covers the
                // pool), so its blocks are the indices up to the one holding its last address.
                let last = (net_offset(&pool.net, &r.broadcast()) >> shift).min(count - 1);
                let skip = last.saturating_sub(idx) + 1;
                // Not past the wrap point: the indices after it start again at 0.
                i += skip.min(count - idx);
                continue;
            }
            i += 1;
            if taken.contains(&cs) {
                continue;
            }
            let aff_key = keys::affinity(node, &cs);
            let pending = self.store.put(
                &aff_key,
                &encode(&Affinity {
                    state: AffinityState::Pending,
                }),
            )?;
            let mut block = Block::new(cidr, Some(host_affinity(node)));
            // A fresh block counts as empty from now, for the empty-block grace period.
            block.emptied_at = Some(filter.now);
            let created = self.store.txn(Txn {
                compare: vec![Compare::ModRevision(keys::block(&cs), 0)],
                success: vec![Op::put(keys::block(&cs), encode(&block))],
                failure: vec![],
            })?;
            if !created.succeeded {
                if self.lost_claim(node, &cidr, &aff_key, pending)? {
                    // Another thread or process of this node won it: it is this node's.
                    self.learn_affine(node, cidr);
                    return Ok(Some(cidr));
                }
                taken.insert(cs);
                continue;
            }
            self.store.put(
                &aff_key,
                &encode(&Affinity {
                    state: AffinityState::Confirmed,
                }),
            )?;
            self.cache_block(&block, created.revision);
            self.with_cache(|c| {
                let list = c.affine.entry(node.to_string()).or_default();
                if !list.contains(&cidr) {
                    list.push(cidr);
                    list.sort();
                }
            });
            return Ok(Some(cidr));
        }
        Ok(None)
    }

    /// After a claim of `cidr` for `node` lost the block's create: true when the block is
    /// this node's anyway (another thread or process of the node created it), and then its
    /// affinity is made `Confirmed`; else the claim's `Pending` affinity is withdrawn, only if
    /// it is still the one this claim wrote (`pending`, its revision), so a concurrent claim
    /// of the same node that won is never undone.
    pub(crate) fn lost_claim(
        &self,
        node: &str,
        cidr: &IpNet,
        aff_key: &str,
        pending: i64,
    ) -> Result<bool> {
        if let Some((b, _)) = self.read_block(cidr)?
            && b.affine_node() == Some(node)
        {
            self.store.put(
                aff_key,
                &encode(&Affinity {
                    state: AffinityState::Confirmed,
                }),
            )?;
            return Ok(true);
        }
        self.store.txn(Txn::when(
            vec![Compare::ModRevision(aff_key.to_string(), pending)],
            vec![Op::delete(aff_key)],
        ))?;
        Ok(false)
    }

    /// A new block affine to `node`: the node's cached list of blocks learns of it.
    pub(crate) fn learn_affine(&self, node: &str, cidr: IpNet) {
        self.with_cache(|c| {
            if let Some(list) = c.affine.get_mut(node)
                && !list.contains(&cidr)
            {
                list.push(cidr);
                list.sort();
            }
        });
    }

    /// Releases the node's blocks that have been empty for longer than `grace` and returns
    /// them; never the node's last block. Per block, as in Calico: the affinity goes
    /// `Confirmed → PendingDeletion` (CAS), then the block and the affinity are deleted in one
    /// transaction that holds only if the block is unchanged (still empty); if an allocation
    /// (a borrower's) slipped in, the affinity is put back to `Confirmed`.
    pub fn release_empty_blocks(&self, node: &str, grace: Duration) -> Result<Vec<IpNet>> {
        self.ensure_unlocked()?;
        let now = self.now();
        let mine = self.affine_blocks(node)?;
        let mut remaining = mine.len();
        let mut out = Vec::new();
        for cidr in mine {
            if remaining <= 1 {
                break;
            }
            let cs = cidr.to_string();
            let bkey = keys::block(&cs);
            let Some(bkv) = self.store.get(&bkey)? else {
                continue;
            };
            let b: Block = decode(&bkv)?;
            // Blocks written before `emptiedAt` existed count as empty since forever.
            let emptied = b.emptied_at.unwrap_or(0);
            if b.in_use() > 0
                || b.affine_node() != Some(node)
                || now < emptied.saturating_add(grace.as_secs())
            {
                continue;
            }
            let akey = keys::affinity(node, &cs);
            let Some(akv) = self.store.get(&akey)? else {
                continue;
            };
            let a: Affinity = decode(&akv)?;
            if a.state != AffinityState::Confirmed {
                continue;
            }
            let marked = self.store.txn(Txn {
                compare: vec![Compare::ModRevision(akey.clone(), akv.mod_revision)],
                success: vec![Op::put(
                    akey.clone(),
                    encode(&Affinity {
                        state: AffinityState::PendingDeletion,
                    }),
                )],
                failure: vec![],
            })?;
            if !marked.succeeded {
                continue;
            }
            let deleted = if self.indexed {
                self.store.txn(Txn {
                    compare: vec![
                        Compare::ModRevision(bkey.clone(), bkv.mod_revision),
                        Compare::ModRevision(akey.clone(), marked.revision),
                    ],
                    success: vec![Op::delete(bkey), Op::delete(akey.clone())],
                    failure: vec![],
                })?
            } else {
                // The block (if still as read), then its affinity: a crash in between leaves
                // a PendingDeletion affinity without a block, which `affine_blocks` removes.
                let d = match self.store.txn(Txn::when(
                    vec![Compare::ModRevision(bkey.clone(), bkv.mod_revision)],
                    vec![Op::delete(bkey.clone())],
                )) {
                    Ok(d) => d,
                    // Outcome unknown: it was deleted when the block is gone, or is another
                    // node's now (claimed again since).
                    Err(StoreError::Ambiguous(_)) => tern_store::TxnResponse {
                        succeeded: match self.store.get(&bkey)? {
                            None => true,
                            Some(kv) => decode::<Block>(&kv)?.affine_node() != Some(node),
                        },
                        revision: 0,
                    },
                    Err(e) => return Err(e.into()),
                };
                if d.succeeded {
                    let gone = self.store.txn(Txn::when(
                        vec![Compare::ModRevision(akey.clone(), marked.revision)],
                        vec![Op::delete(akey.clone())],
                    ))?;
                    // Confirmed again meanwhile (the node read its blocks): its block is gone
                    // now, so the affinity goes, from whatever revision it has.
                    if !gone.succeeded
                        && let Some(akv) = self.store.get(&akey)?
                    {
                        self.store.txn(Txn::when(
                            vec![Compare::ModRevision(akey.clone(), akv.mod_revision)],
                            vec![Op::delete(akey.clone())],
                        ))?;
                    }
                }
                d
            };
            if deleted.succeeded {
                self.forget_block(&cidr);
                remaining -= 1;
                out.push(cidr);
            } else if self.indexed {
                // Someone allocated in the block meanwhile: it stays the node's.
                self.confirm_affinity(node, &cidr, marked.revision)?;
            } else {
                // The block changed, or went (deleted by whoever settled the affinity first):
                // the same rule as every reader's.
                self.settle_pending_deletion(node, &cidr, &akey, marked.revision)?;
            }
        }
        Ok(out)
    }
}
