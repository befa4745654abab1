//! Allocation: automatic assignment from the node's blocks (claiming a new block when they
//! are full, borrowing when allowed) and assignment of a chosen address.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use tern_store::{Compare, KeyValue, Op, StoreError, Txn, keys};

use crate::api::{AllocationAttrs, AssignArgs, Assigned};
use crate::block::{Affinity, AffinityState, Block, Handle, host_affinity};
use crate::client::Ipam;
use crate::codec::{decode, encode};
use crate::error::{IpamError, RETRIES, Result};
use crate::layout::family_of;
use crate::policy::{Cx, Filter, Pool};

/// The handle record as this request believes it is: at first assumed absent (revision 0),
/// corrected from the store when a transaction says otherwise.
#[derive(Default)]
pub(crate) struct HandleState {
    pub(crate) h: Handle,
    pub(crate) rev: i64,
}

impl Ipam {
    /// `assign_ipv4`: `max(num_v4, 1)` IPv4 addresses for the handle (no IPv6).
    pub fn assign_ipv4(&self, args: &AssignArgs) -> Result<Vec<Ipv4Addr>> {
        let a = AssignArgs {
            num_v4: args.num_v4.max(1),
            num_v6: 0,
            ..args.clone()
        };
        Ok(self.auto_assign_dual(&a)?.ipv4)
    }

    /// `assign_ipv6`: `max(num_v6, 1)` IPv6 addresses for the handle (no IPv4).
    pub fn assign_ipv6(&self, args: &AssignArgs) -> Result<Vec<Ipv6Addr>> {
        let a = AssignArgs {
            num_v4: 0,
            num_v6: args.num_v6.max(1),
            ..args.clone()
        };
        Ok(self.auto_assign_dual(&a)?.ipv6)
    }

    /// [`Ipam::auto_assign`] with the result split by family; all or nothing.
    pub fn auto_assign_dual(&self, args: &AssignArgs) -> Result<Assigned> {
        let mut out = Assigned::default();
        for ip in self.auto_assign(args)? {
            match ip {
                IpAddr::V4(a) => out.ipv4.push(a),
                IpAddr::V6(a) => out.ipv6.push(a),
            }
        }
        Ok(out)
    }

    /// Allocates `num_v4` IPv4 and `num_v6` IPv6 addresses for the handle; all or nothing:
    /// on any failure the addresses already taken by this call are released.
    pub fn auto_assign(&self, args: &AssignArgs) -> Result<Vec<IpAddr>> {
        let mut got = Vec::new();
        let mut hs = HandleState::default();
        if let Err(e) = self.auto_assign_into(args, &mut got, &mut hs) {
            if !got.is_empty() {
                // Best effort: the original error matters more than a failed rollback.
                let _ = self.release_ips(&got);
            }
            return Err(e);
        }
        Ok(got)
    }

    /// The body of [`Ipam::auto_assign`]: decides with the cached policy, and again with a
    /// freshly read one when a guard shows the policy changed or the cached policy cannot
    /// serve the request. Addresses committed before a retry stay: each was valid under the
    /// policy current when it committed.
    pub(crate) fn auto_assign_into(
        &self,
        args: &AssignArgs,
        got: &mut Vec<IpAddr>,
        hs: &mut HandleState,
    ) -> Result<()> {
        let mut fresh = false;
        for _ in 0..RETRIES {
            let (policy, read_now) = self.policy(&args.node, fresh)?;
            if let Some(why) = &policy.cfg.migration_lock {
                return Err(IpamError::Locked(why.clone()));
            }
            let filter = Filter {
                reserved: policy.reserved.clone(),
                cooldown: policy.cfg.release_cooldown_seconds,
                now: self.now(),
            };
            let cx = Cx {
                pools: &policy.pools,
                cfg: &policy.cfg,
                labels: policy.labels.as_ref(),
                filter: &filter,
                policy: &policy,
            };
            let mut stale = false;
            for (family, n, wanted) in [
                (4u8, args.num_v4, &args.v4_pools),
                (6u8, args.num_v6, &args.v6_pools),
            ] {
                let have = got
                    .iter()
                    .filter(|ip| (family == 4) == ip.is_ipv4())
                    .count();
                if n <= have {
                    continue;
                }
                match self.assign_family(args, family, n - have, wanted, &cx, got, hs) {
                    Ok(true) => {}
                    Ok(false) => {
                        stale = true;
                        break;
                    }
                    // Decided on a cached policy: a pool created or enabled since may serve it.
                    Err(IpamError::NoPools { .. } | IpamError::PoolsExhausted { .. })
                        if !read_now =>
                    {
                        stale = true;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if !stale {
                return Ok(());
            }
            fresh = true;
        }
        Err(IpamError::Contention {
            key: keys::handle(&args.handle),
        })
    }

    /// Allocates `n` addresses of one family; `Ok(false)` when a guard showed that the policy
    /// in `cx` is out of date (nothing was allocated by the failed attempt).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assign_family(
        &self,
        args: &AssignArgs,
        family: u8,
        n: usize,
        wanted: &[String],
        cx: &Cx,
        got: &mut Vec<IpAddr>,
        hs: &mut HandleState,
    ) -> Result<bool> {
        let (pools, cfg, labels, filter) = (cx.pools, cx.cfg, cx.labels, cx.filter);
        let node = args.node.as_str();
        let of_family: Vec<&Pool> = pools
            .iter()
            .filter(|p| family_of(&p.net) == family)
            .collect();
        let candidates: Vec<&Pool> = if wanted.is_empty() {
            of_family
                .into_iter()
                .filter(|p| p.workload_usable(labels))
                .collect()
        } else {
            let mut c = Vec::new();
            for w in wanted {
                let Some(p) = of_family
                    .iter()
                    .find(|p| p.name == *w || p.spec.cidr == *w || p.net.to_string() == *w)
                else {
                    return Err(IpamError::NoPools {
                        family,
                        node: node.into(),
                        detail: format!("requested pool {w:?} does not exist"),
                    });
                };
                if !p.workload_usable(labels) {
                    return Err(IpamError::NoPools {
                        family,
                        node: node.into(),
                        detail: format!(
                            "requested pool {w:?} is disabled, not usable for workloads or does not select this node"
                        ),
                    });
                }
                c.push(*p);
            }
            c
        };
        if candidates.is_empty() {
            return Err(IpamError::NoPools {
                family,
                node: node.into(),
                detail: String::new(),
            });
        }
        let in_candidates = |cidr: &IpNet| candidates.iter().any(|p| p.net.contains(cidr));
        let start = got.len();
        let missing = |got: &Vec<IpAddr>| n - (got.len() - start);

        // 1. Blocks this node already owns; the block that last had room first, so a node
        //    with many full blocks does not try them all for every allocation. The list and
        //    the blocks come from the cache when there is one. When no cached block has room,
        //    the list and the blocks are read again (another process may have freed addresses
        //    or claimed a block for this node) before a new block is claimed; that read of
        //    every block is the one claiming needs anyway, so it is handed on.
        let (cached, hint) = self
            .with_cache(|c| (c.affine.get(node).cloned(), c.hints.get(node).copied()))
            .unwrap_or_default();
        let mut mine = match cached {
            Some(m) => m,
            None => self.affine_blocks(node)?,
        };
        let mut all_blocks: Option<Vec<KeyValue>> = None;
        loop {
            if let Some(pos) = hint.and_then(|h| mine.iter().position(|c| *c == h)) {
                let h = mine.remove(pos);
                mine.insert(0, h);
            }
            for cidr in mine {
                if missing(got) == 0 {
                    return Ok(true);
                }
                if in_candidates(&cidr) {
                    let Some(ips) =
                        self.alloc_in_block(&cidr, missing(got), args, Some(node), cx, hs)?
                    else {
                        return Ok(false);
                    };
                    if !ips.is_empty() {
                        self.remember(node, cidr);
                    }
                    got.extend(ips);
                }
            }
            if missing(got) == 0 {
                return Ok(true);
            }
            if all_blocks.is_some() {
                break;
            }
            mine = self.affine_blocks(node)?;
            let (kvs, _) = self.store.range(keys::BLOCKS)?;
            let mut present = BTreeSet::new();
            for kv in &kvs {
                let cidr: Option<IpNet> = keys::segment_cidr(&kv.key[keys::BLOCKS.len()..])
                    .parse()
                    .ok();
                if let Some(c) = cidr.filter(|c| mine.contains(c)) {
                    self.cache_block(&decode::<Block>(kv)?, kv.mod_revision);
                    present.insert(c);
                }
            }
            for c in mine.iter().filter(|c| !present.contains(*c)) {
                self.forget_block(c);
            }
            mine.retain(|c| present.contains(c));
            all_blocks = Some(kvs);
        }
        // 2. Claim new blocks, pool by pool.
        let mut limit_hit = false;
        'claim: for pool in &candidates {
            while missing(got) > 0 {
                let max = cfg.max_blocks_per_host as usize;
                if max > 0 && self.store.range(&keys::node_affinities(node))?.0.len() >= max {
                    limit_hit = true;
                    break 'claim;
                }
                let Some(cidr) = self.claim_block(node, pool, filter, all_blocks.take())? else {
                    break;
                };
                self.remember(node, cidr);
                let Some(ips) =
                    self.alloc_in_block(&cidr, missing(got), args, Some(node), cx, hs)?
                else {
                    return Ok(false);
                };
                got.extend(ips);
            }
        }
        // 3. Borrow from other nodes' blocks unless affinity is strict.
        if missing(got) > 0 && !cfg.strict_affinity {
            let (blocks, _) = self.store.range(keys::BLOCKS)?;
            for kv in blocks {
                if missing(got) == 0 {
                    break;
                }
                let b: Block = decode(&kv)?;
                if !b.deleted && !b.unallocated.is_empty() && in_candidates(&b.cidr) {
                    self.cache_block(&b, kv.mod_revision);
                    let Some(ips) =
                        self.alloc_in_block(&b.cidr, missing(got), args, None, cx, hs)?
                    else {
                        return Ok(false);
                    };
                    got.extend(ips);
                }
            }
        }
        if missing(got) > 0 {
            let mut why = Vec::new();
            if limit_hit {
                why.push(format!(
                    "limit of {} blocks reached for this node",
                    cfg.max_blocks_per_host
                ));
            }
            if cfg.strict_affinity {
                why.push("no more free affine blocks and strict affinity enabled".to_string());
            }
            return Err(IpamError::PoolsExhausted {
                pools: candidates.iter().map(|p| p.name.clone()).collect(),
                node: node.into(),
                detail: why.join("; "),
            });
        }
        Ok(true)
    }

    /// Allocates up to `want` addresses in one block and records them under the handle, in one
    /// transaction. With `owner`, only while the block is still affine to that node. Starts
    /// from the cached block (no read) and assumes the handle state in `hs`; the transaction's
    /// compares catch either being stale, and then both are read again. `Ok(None)`: the
    /// block and the handle were as assumed, so a policy guard failed (see [`Cx::guards`]).
    pub(crate) fn alloc_in_block(
        &self,
        cidr: &IpNet,
        want: usize,
        args: &AssignArgs,
        owner: Option<&str>,
        cx: &Cx,
        hs: &mut HandleState,
    ) -> Result<Option<Vec<IpAddr>>> {
        let filter = cx.filter;
        let bkey = keys::block(&cidr.to_string());
        let hkey = keys::handle(&args.handle);
        let mut from_cache = true;
        let mut cur = match self.cached_block(cidr) {
            Some(c) => Some(c),
            None => {
                from_cache = false;
                self.read_block(cidr)?
            }
        };
        for _ in 0..RETRIES {
            let Some((mut b, brev)) = cur.take() else {
                self.forget_block(cidr);
                return Ok(Some(Vec::new()));
            };
            let mut ords = Vec::new();
            if !b.deleted && owner.is_none_or(|o| b.affine_node() == Some(o)) {
                // The release stamps are moved out so the filter can read them while the
                // block is being changed; those of the ordinals just allocated are dropped.
                let mut released = std::mem::take(&mut b.released_at);
                let cidr_b = b.cidr;
                ords = b.allocate_where(want, &args.handle, &args.attrs, |o| {
                    filter.usable(&cidr_b, &released, o)
                });
                for o in &ords {
                    released.remove(o);
                }
                b.released_at = released;
            }
            if ords.is_empty() {
                // A cached copy without room may be out of date (another process freed
                // addresses): the caller reads every block before it claims a new one.
                if !from_cache && (owner.is_some_and(|o| b.affine_node() != Some(o)) || b.deleted) {
                    self.forget_block(cidr);
                }
                return Ok(Some(Vec::new()));
            }
            if !self.indexed {
                let ips: Vec<IpAddr> = ords.iter().map(|o| b.ip(*o)).collect();
                match self.write_block(cidr, &b, brev, &ords)? {
                    Some(_) => return Ok(Some(ips)),
                    None => {
                        cur = self.read_block(cidr)?;
                        from_cache = false;
                        continue;
                    }
                }
            }
            let mut h = hs.h.clone();
            *h.block.entry(cidr.to_string()).or_default() += ords.len() as u32;
            let mut compare = vec![
                Compare::ModRevision(bkey.clone(), brev),
                Compare::ModRevision(hkey.clone(), hs.rev),
            ];
            compare.extend(cx.guards(cidr));
            let hval = encode(&h);
            let resp = match self.store.txn(Txn {
                compare,
                success: vec![
                    Op::put(bkey.clone(), encode(&b)),
                    Op::put(hkey.clone(), hval.clone()),
                ],
                failure: vec![],
            }) {
                Ok(r) => r,
                // The store could not tell whether this write applied (its answer was lost in
                // a leader change and the keys have moved on since). The handle tells: only
                // this operation writes it, so holding exactly what this write put there means
                // it applied; anything else means it did not, as after a failed compare.
                Err(StoreError::Ambiguous(_)) => {
                    let applied = self
                        .store
                        .get(&hkey)?
                        .filter(|kv| kv.value == hval)
                        .map(|kv| kv.mod_revision);
                    if let Some(rev) = applied {
                        // The block has changed since; read it again when next needed.
                        self.forget_block(cidr);
                        *hs = HandleState { h, rev };
                        return Ok(Some(ords.into_iter().map(|o| b.ip(o)).collect()));
                    }
                    tern_store::TxnResponse {
                        succeeded: false,
                        revision: 0,
                    }
                }
                Err(e) => return Err(e.into()),
            };
            if resp.succeeded {
                self.cache_block(&b, resp.revision);
                *hs = HandleState {
                    h,
                    rev: resp.revision,
                };
                return Ok(Some(ords.into_iter().map(|o| b.ip(o)).collect()));
            }
            // Find out which assumption failed: the block, the handle, or the policy.
            cur = self.read_block(cidr)?;
            from_cache = false;
            let hkv = self.store.get(&hkey)?;
            let hrev = hkv.as_ref().map_or(0, |kv| kv.mod_revision);
            let block_same = cur.as_ref().map_or(0, |(_, r)| *r) == brev;
            if block_same && hrev == hs.rev {
                return Ok(None);
            }
            *hs = HandleState {
                h: match &hkv {
                    Some(kv) => decode(kv)?,
                    None => Handle::default(),
                },
                rev: hrev,
            };
        }
        Err(IpamError::Contention { key: bkey })
    }

    /// Writes block `b` (read at `brev`, 0: absent) alone, as a compare-and-swap: `Some(rev)`
    /// when it applied (0: at a revision not known here), `None` when another writer got in
    /// first. A write whose outcome the store could not tell is settled by reading the block
    /// again: it applied when the block holds the allocations of `ords` with this write's
    /// handles and sequence numbers (a sequence number is never handed out twice in a block).
    pub(crate) fn write_block(
        &self,
        cidr: &IpNet,
        b: &Block,
        brev: i64,
        ords: &[u32],
    ) -> Result<Option<i64>> {
        let bkey = keys::block(&cidr.to_string());
        match self.store.txn(Txn::when(
            vec![Compare::ModRevision(bkey.clone(), brev)],
            vec![Op::put(bkey, encode(b))],
        )) {
            Ok(r) if r.succeeded => {
                self.cache_block(b, r.revision);
                Ok(Some(r.revision))
            }
            Ok(_) => Ok(None),
            Err(StoreError::Ambiguous(_)) => {
                self.forget_block(cidr);
                let now = self.read_block(cidr)?;
                let applied = now.is_some_and(|(nb, _)| {
                    !ords.is_empty()
                        && ords.iter().all(|o| {
                            let seq = b.sequence_number_for_allocation.get(o);
                            seq.is_some()
                                && nb.sequence_number_for_allocation.get(o) == seq
                                && nb.handle_of(*o) == b.handle_of(*o)
                        })
                });
                Ok(applied.then_some(0))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Assigns a specific address to the handle. It must lie in an enabled pool and be free.
    /// When its block does not exist yet, the block is created affine to `attrs.node`.
    /// An address inside an `IPReservation` is allowed here, as in Calico: reservations
    /// only keep addresses out of automatic assignment, and an explicit request (a static
    /// pod IP, a gateway) is the operator's decision.
    pub fn assign_ip(&self, ip: IpAddr, handle: &str, attrs: &AllocationAttrs) -> Result<()> {
        self.ensure_unlocked()?;
        let pools = self.pools()?;
        let Some(pool) = pools
            .iter()
            .find(|p| !p.spec.disabled && p.net.contains(&ip))
        else {
            return Err(IpamError::NotInPool { ip });
        };
        let cidr = IpNet::new(ip, pool.spec.block_size)
            .map_err(|_| IpamError::NotInPool { ip })
            .map(|n| n.trunc())?;
        let cs = cidr.to_string();
        let bkey = keys::block(&cs);
        let hkey = keys::handle(handle);
        for _ in 0..RETRIES {
            let bkv = self.store.get(&bkey)?;
            let (mut b, brev) = match &bkv {
                Some(kv) => (decode::<Block>(kv)?, kv.mod_revision),
                None => {
                    let aff = (!attrs.node.is_empty()).then(|| host_affinity(&attrs.node));
                    (Block::new(cidr, aff), 0)
                }
            };
            let ord = b.ordinal(ip).ok_or(IpamError::NotInPool { ip })?;
            if let Err(owner) = b.allocate_ordinal(ord, handle, attrs) {
                return Err(IpamError::AddressInUse { ip, handle: owner });
            }
            if !self.indexed {
                // A new block is claimed as `claim_block` does: the affinity as Pending,
                // the block, then the affinity Confirmed (a crash in between leaves a
                // Pending affinity, confirmed or ignored by `affine_blocks`).
                let new_affine = brev == 0 && !attrs.node.is_empty();
                let akey = keys::affinity(&attrs.node, &cs);
                let mut pending = 0;
                if new_affine {
                    pending = self.store.put(
                        &akey,
                        &encode(&Affinity {
                            state: AffinityState::Pending,
                        }),
                    )?;
                }
                match self.write_block(&cidr, &b, brev, &[ord])? {
                    Some(_) => {
                        if new_affine {
                            self.store.put(
                                &akey,
                                &encode(&Affinity {
                                    state: AffinityState::Confirmed,
                                }),
                            )?;
                            self.learn_affine(&attrs.node, cidr);
                        }
                        return Ok(());
                    }
                    None => {
                        if new_affine && self.lost_claim(&attrs.node, &cidr, &akey, pending)? {
                            self.learn_affine(&attrs.node, cidr);
                        }
                        continue;
                    }
                }
            }
            let hkv = self.store.get(&hkey)?;
            let mut h: Handle = match &hkv {
                Some(kv) => decode(kv)?,
                None => Handle::default(),
            };
            *h.block.entry(cs.clone()).or_default() += 1;
            let hval = encode(&h);
            let mut success = vec![
                Op::put(bkey.clone(), encode(&b)),
                Op::put(hkey.clone(), hval.clone()),
            ];
            if brev == 0 && !attrs.node.is_empty() {
                success.push(Op::put(
                    keys::affinity(&attrs.node, &cs),
                    encode(&Affinity {
                        state: AffinityState::Confirmed,
                    }),
                ));
            }
            // `Some(revision)` when the write applied, `Some(None)` when it applied at a
            // revision not known here.
            let committed = match self.store.txn(Txn {
                compare: vec![
                    Compare::ModRevision(bkey.clone(), brev),
                    Compare::ModRevision(hkey.clone(), hkv.map_or(0, |kv| kv.mod_revision)),
                ],
                success,
                failure: vec![],
            }) {
                Ok(r) => r.succeeded.then_some(Some(r.revision)),
                // Outcome unknown (see `alloc_in_block`): the handle tells whether it applied.
                Err(StoreError::Ambiguous(_)) => self
                    .store
                    .get(&hkey)?
                    .is_some_and(|kv| kv.value == hval)
                    .then_some(None),
                Err(e) => return Err(e.into()),
            };
            if let Some(revision) = committed {
                match revision {
                    Some(r) => self.cache_block(&b, r),
                    None => self.forget_block(&cidr),
                }
                if brev == 0 && !attrs.node.is_empty() {
                    self.learn_affine(&attrs.node, cidr);
                }
                return Ok(());
            }
        }
        Err(IpamError::Contention { key: bkey })
    }
}
