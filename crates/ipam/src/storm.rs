//! A randomised allocation storm and the invariants that must hold after it, usable on any
//! [`Store`] backend (the tests run it on SQLite with threads and with processes; the etcd
//! backend can run the same storm).
//!
//! Each simulated node runs [`worker`]: for a bounded time it allocates (one or two addresses
//! per handle) and releases random handles, remembering what it believes it holds. Afterwards
//! [`verify`] checks the store against those beliefs:
//! - no address is held twice (blocks do not overlap, no address is in two workers' hands);
//! - the set of allocated addresses equals the set the workers hold, handle for handle (every
//!   release returned its addresses, no rollback left anything behind);
//! - every handle record matches its blocks, and every block is internally consistent;
//! - no block is claimed by two nodes, and every block's affinity is confirmed by its node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tern_model::{IpPool, IpPoolSpec, IpamConfigSpec};
use tern_store::Store;

use crate::block::block_len;
use crate::{AffinityState, AllocationAttrs, AssignArgs, Ipam, IpamError, Result};

/// What the storm does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StormOptions {
    /// Simulated nodes (one worker each).
    pub nodes: usize,
    /// How long the workers run at least.
    pub duration: Duration,
    /// A worker runs past `duration` until it made this many allocations and this many
    /// releases (so a storm on a loaded machine still contends, instead of a timed test that
    /// fails when the machine is slow), but never past 20 × `duration`.
    pub min_allocations: u64,
    pub min_releases: u64,
    /// With `release_empty_blocks`: a worker also runs on until it released this many empty
    /// blocks (same bound).
    pub min_blocks_released: u64,
    /// The pool the storm allocates from (small pools exercise exhaustion), of either family.
    pub pool_cidr: String,
    /// A second pool, of the other family: every allocation then takes addresses of both
    /// families (a dual-stack pod), all or nothing. Its blocks hold as many addresses as the
    /// first pool's (`block_size` ± 96).
    #[serde(default)]
    pub other_family_pool: Option<String>,
    pub block_size: u8,
    pub strict_affinity: bool,
    /// 0 = unlimited.
    pub max_blocks_per_host: u32,
    /// Handles a worker holds at most before it only releases.
    pub max_held: usize,
    /// Percentage of steps that allocate (when below `max_held`); the rest release.
    pub alloc_percent: u64,
    /// Workers also release their empty blocks (grace 0) now and then.
    pub release_empty_blocks: bool,
    /// Seed of the workers' random choices (each worker mixes in its index).
    pub seed: u64,
    /// Behave as a container runtime when the datastore is unreachable (an API server
    /// restarted mid-wave): a failed ADD is followed by DELs of its handle until one
    /// succeeds, a failed DEL is retried until it succeeds; neither counts as an error.
    #[serde(default)]
    pub retry_unavailable: bool,
}

impl Default for StormOptions {
    fn default() -> Self {
        StormOptions {
            nodes: 4,
            duration: Duration::from_secs(3),
            min_allocations: 25,
            min_releases: 10,
            min_blocks_released: 0,
            pool_cidr: "10.99.0.0/24".into(),
            other_family_pool: None,
            block_size: 28,
            strict_affinity: false,
            max_blocks_per_host: 0,
            max_held: 20,
            alloc_percent: 60,
            release_empty_blocks: false,
            seed: 1,
            retry_unavailable: false,
        }
    }
}

/// What one worker did and what it believes it holds at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerReport {
    pub node: String,
    /// Successful allocations (handles).
    pub allocations: u64,
    /// Successful releases (handles).
    pub releases: u64,
    /// Allocations refused because the pool was exhausted (all rolled back).
    pub exhausted: u64,
    /// Addresses obtained from blocks not affine to this node.
    pub borrowed: u64,
    /// Empty blocks this worker released.
    pub blocks_released: u64,
    /// Handle → addresses, as the worker believes.
    pub held: BTreeMap<String, Vec<IpAddr>>,
    /// Anything unexpected the worker saw (errors, a release returning other addresses).
    pub errors: Vec<String>,
    /// ADDs and DELs that failed because the datastore was unreachable and were cleaned up
    /// or retried as a runtime does (`retry_unavailable`).
    #[serde(default)]
    pub unavailable: u64,
}

/// The outcome of a storm.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StormReport {
    pub workers: Vec<WorkerReport>,
    pub elapsed: Duration,
}

impl StormReport {
    /// Sum of a counter over the workers.
    pub fn total(&self, f: impl Fn(&WorkerReport) -> u64) -> u64 {
        self.workers.iter().map(f).sum()
    }

    /// Checks the store against the workers' beliefs (see the module documentation); the
    /// workers' own errors count as violations too.
    pub fn verify(&self, store: Arc<dyn Store>) -> std::result::Result<(), Vec<String>> {
        let mut v: Vec<String> = self
            .workers
            .iter()
            .flat_map(|w| {
                w.errors
                    .iter()
                    .map(move |e| format!("worker {}: {e}", w.node))
            })
            .collect();
        match verify(store, &self.workers) {
            Ok(more) => v.extend(more),
            Err(e) => v.push(format!("cannot read the store: {e}")),
        }
        if v.is_empty() { Ok(()) } else { Err(v) }
    }

    /// The storm's totals on one line, after `name`.
    pub fn summary(&self, name: &str) -> String {
        format!(
            "{name}: {} allocations, {} releases, {} exhausted, {} borrowed, {} blocks released, \
             {} failed on an outage and retried, in {:?}",
            self.total(|w| w.allocations),
            self.total(|w| w.releases),
            self.total(|w| w.exhausted),
            self.total(|w| w.borrowed),
            self.total(|w| w.blocks_released),
            self.total(|w| w.unavailable),
            self.elapsed
        )
    }

    /// The checks every storm must pass, for a test: prints [`Self::summary`], panics on the
    /// violations `verified` (what [`Self::verify`] returned) or when the storm was too quiet
    /// to have contended. Every worker runs until it made `min_allocations` and
    /// `min_releases` (4 × 25 and 4 × 10 by default, however slow the machine); fewer means a
    /// worker gave up at its hard limit (20 × the duration).
    pub fn assert_sound(&self, name: &str, verified: std::result::Result<(), Vec<String>>) {
        eprintln!("{}", self.summary(name));
        if let Err(v) = verified {
            panic!("{name}: {} violations:\n{}", v.len(), v.join("\n"));
        }
        assert!(
            self.total(|w| w.allocations) > 50,
            "{name}: storm too quiet"
        );
        assert!(self.total(|w| w.releases) > 20, "{name}: storm too quiet");
    }
}

/// Writes the storm's pool and IPAM configuration.
pub fn setup(store: Arc<dyn Store>, opts: &StormOptions) -> Result<()> {
    let mut spec = IpPoolSpec::new(&opts.pool_cidr);
    spec.block_size = opts.block_size;
    tern_model::put_resource(&*store, &IpPool::new("storm", spec).into())?;
    if let Some(cidr) = &opts.other_family_pool {
        let mut spec = IpPoolSpec::new(cidr);
        // As many addresses per block as the first pool's.
        spec.block_size = if cidr.contains(':') {
            opts.block_size + 96
        } else {
            opts.block_size.saturating_sub(96)
        };
        tern_model::put_resource(&*store, &IpPool::new("storm-other", spec).into())?;
    }
    Ipam::new(store).put_config(&IpamConfigSpec {
        strict_affinity: opts.strict_affinity,
        max_blocks_per_host: opts.max_blocks_per_host,
        ..IpamConfigSpec::default()
    })
}

/// splitmix64: small, seedable, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
}

/// The node name of worker `index`.
pub fn node_name(index: usize) -> String {
    format!("storm-node-{index}")
}

/// Runs worker `index` (node [`node_name`]) for `opts.duration`, and on until it did
/// `opts.min_allocations`, `opts.min_releases` and `opts.min_blocks_released` (at most 20 ×
/// `opts.duration`).
pub fn worker(store: Arc<dyn Store>, index: usize, opts: &StormOptions) -> WorkerReport {
    let node = node_name(index);
    let ipam = Ipam::new(store);
    let mut rng = Rng(opts.seed ^ ((index as u64 + 1) << 32));
    let mut rep = WorkerReport {
        node: node.clone(),
        ..WorkerReport::default()
    };
    // Addresses per family an allocation asks for: the families of the storm's pools.
    let v6 = |c: &str| c.contains(':');
    let pools: Vec<&str> = std::iter::once(opts.pool_cidr.as_str())
        .chain(opts.other_family_pool.as_deref())
        .collect();
    let (has_v4, has_v6) = (pools.iter().any(|c| !v6(c)), pools.iter().any(|c| v6(c)));
    let start = Instant::now();
    let mut serial = 0u64;
    loop {
        let ran = start.elapsed();
        let enough = rep.allocations >= opts.min_allocations
            && rep.releases >= opts.min_releases
            && rep.blocks_released >= opts.min_blocks_released;
        if ran >= opts.duration * 20 || (ran >= opts.duration && enough) {
            break;
        }
        let r = rng.next() % 100;
        let allocate =
            rep.held.len() < opts.max_held && (rep.held.is_empty() || r < opts.alloc_percent);
        if allocate {
            serial += 1;
            let handle = format!("storm.{node}.{serial}");
            let n = if rng.next().is_multiple_of(5) { 2 } else { 1 };
            let args = AssignArgs {
                handle: handle.clone(),
                node: node.clone(),
                attrs: AllocationAttrs {
                    namespace: "storm".into(),
                    pod: format!("pod-{serial}"),
                    node: node.clone(),
                    container_id: handle.clone(),
                    ifname: "eth0".into(),
                },
                num_v4: if has_v4 { n } else { 0 },
                num_v6: if has_v6 { n } else { 0 },
                ..AssignArgs::default()
            };
            match ipam.auto_assign(&args) {
                Ok(ips) => {
                    if ips.len() != n * pools.len()
                        || ips.iter().filter(|a| a.is_ipv6()).count() != if has_v6 { n } else { 0 }
                    {
                        rep.errors.push(format!(
                            "{handle}: asked for {n} addresses of each of {pools:?}, got {ips:?}"
                        ));
                    }
                    rep.allocations += 1;
                    rep.borrowed += count_borrowed(
                        &ipam,
                        &node,
                        &ips,
                        opts,
                        &mut rep.errors,
                        &mut rep.unavailable,
                    );
                    rep.held.insert(handle, ips);
                }
                Err(IpamError::PoolsExhausted { .. }) => {
                    rep.exhausted += 1;
                    // All or nothing: a refused request leaves nothing behind.
                    match ipam.ips_by_handle(&handle) {
                        Ok(left) if left.is_empty() => {}
                        Ok(left) => rep
                            .errors
                            .push(format!("{handle}: refused but still holds {left:?}")),
                        Err(e) => rep.errors.push(format!("{handle}: {e}")),
                    }
                }
                Err(e) if opts.retry_unavailable && e.is_unavailable() => {
                    // The runtime's answer to a failed ADD: DEL of the sandbox, until it
                    // goes through.
                    rep.unavailable += 1;
                    if let Err(e) = until_done(|| ipam.release_by_handle(&handle)) {
                        rep.errors
                            .push(format!("DEL after failed ADD {handle}: {e}"));
                    }
                }
                Err(e) => rep.errors.push(format!("assign {handle}: {e}")),
            }
        } else if !rep.held.is_empty() {
            let i = (rng.next() % rep.held.len() as u64) as usize;
            let Some(handle) = rep.held.keys().nth(i).cloned() else {
                continue;
            };
            let mut want = rep.held.remove(&handle).unwrap_or_default();
            let mut first = ipam.release_by_handle(&handle);
            if opts.retry_unavailable
                && let Err(e) = &first
                && e.is_unavailable()
            {
                rep.unavailable += 1;
                // A release that failed may have applied; the retry then finds nothing.
                first = until_done(|| ipam.release_by_handle(&handle)).map(|_| want.clone());
            }
            match first {
                Ok(mut got) => {
                    got.sort();
                    want.sort();
                    if got != want {
                        rep.errors.push(format!(
                            "release {handle}: returned {got:?}, worker held {want:?}"
                        ));
                    }
                    rep.releases += 1;
                }
                Err(e) => {
                    rep.errors.push(format!("release {handle}: {e}"));
                    // Unknown outcome: keep believing we hold it; verify will tell.
                    rep.held.insert(handle, want);
                }
            }
        }
        if opts.release_empty_blocks && rng.next().is_multiple_of(20) {
            match ipam.release_empty_blocks(&node, Duration::ZERO) {
                Ok(b) => rep.blocks_released += b.len() as u64,
                // A node's next pass does it (the runtime is not involved).
                Err(e) if opts.retry_unavailable && e.is_unavailable() => rep.unavailable += 1,
                Err(e) => rep.errors.push(format!("release_empty_blocks: {e}")),
            }
        }
    }
    rep
}

/// Runs `f` until it succeeds or fails with an error other than an unreachable datastore,
/// for at most two minutes.
fn until_done<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Err(e) if e.is_unavailable() && start.elapsed() < Duration::from_secs(120) => {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

fn count_borrowed(
    ipam: &Ipam,
    node: &str,
    ips: &[IpAddr],
    opts: &StormOptions,
    errors: &mut Vec<String>,
    unavailable: &mut u64,
) -> u64 {
    let affinities = match ipam.affinities(Some(node)) {
        Err(e) if opts.retry_unavailable && e.is_unavailable() => {
            *unavailable += 1;
            until_done(|| ipam.affinities(Some(node)))
        }
        other => other,
    };
    match affinities {
        Ok(affs) => ips
            .iter()
            .filter(|ip| !affs.iter().any(|a| a.cidr.contains(*ip)))
            .count() as u64,
        Err(e) => {
            errors.push(format!("affinities: {e}"));
            0
        }
    }
}

/// Sets up the store (through one store from `factory`) and runs `opts.nodes` workers as
/// threads, each with its own store from `factory` (its own connection, like a real node).
pub fn run(
    factory: &(dyn Fn() -> Arc<dyn Store> + Sync),
    opts: &StormOptions,
) -> Result<StormReport> {
    setup(factory(), opts)?;
    let start = Instant::now();
    let workers = std::thread::scope(|s| {
        let hs: Vec<_> = (0..opts.nodes)
            .map(|i| {
                let store = factory();
                s.spawn(move || worker(store, i, opts))
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join().unwrap_or_else(|_| WorkerReport {
                    node: node_name(i),
                    errors: vec!["worker thread panicked".into()],
                    ..WorkerReport::default()
                })
            })
            .collect()
    });
    Ok(StormReport {
        workers,
        elapsed: start.elapsed(),
    })
}

/// Checks the store's IPAM records against what the workers believe they hold; returns
/// every violation found (empty = all invariants hold).
pub fn verify(store: Arc<dyn Store>, workers: &[WorkerReport]) -> Result<Vec<String>> {
    // A single-object store keeps no handle records: the blocks are the only record.
    let indexed = store.multi_key_txn();
    let ipam = Ipam::new(store);
    let mut v = Vec::new();
    let blocks = ipam.blocks()?;

    // Blocks must not overlap, or one address could be handed out twice.
    let mut cidrs: Vec<IpNet> = blocks.iter().map(|b| b.cidr).collect();
    cidrs.sort();
    for w in cidrs.windows(2) {
        if w[0].contains(&w[1].network()) {
            v.push(format!("blocks {} and {} overlap", w[0], w[1]));
        }
    }

    // Per block consistency, and the store's view: address → handle, (handle, block) → count.
    let mut allocated: BTreeMap<IpAddr, String> = BTreeMap::new();
    let mut counts: BTreeMap<(String, String), u32> = BTreeMap::new();
    for b in &blocks {
        let len = block_len(&b.cidr);
        if b.allocations.len() != len {
            v.push(format!(
                "block {}: {} ordinals, expected {len}",
                b.cidr,
                b.allocations.len()
            ));
        }
        let free: BTreeSet<u32> = b.unallocated.iter().copied().collect();
        if free.len() != b.unallocated.len() {
            v.push(format!("block {}: an ordinal is free twice", b.cidr));
        }
        for (o, a) in b.allocations.iter().enumerate() {
            let o = o as u32;
            match a {
                None if !free.contains(&o) => v.push(format!(
                    "block {}: ordinal {o} is neither allocated nor free",
                    b.cidr
                )),
                Some(_) if free.contains(&o) => v.push(format!(
                    "block {}: ordinal {o} is allocated and free",
                    b.cidr
                )),
                Some(idx) => {
                    let Some(attr) = b.attributes.get(*idx as usize) else {
                        v.push(format!("block {}: ordinal {o} has no attribute", b.cidr));
                        continue;
                    };
                    let h = attr.handle_id.clone().unwrap_or_default();
                    if !b.sequence_number_for_allocation.contains_key(&o) {
                        v.push(format!(
                            "block {}: ordinal {o} has no sequence number",
                            b.cidr
                        ));
                    }
                    *counts.entry((h.clone(), b.cidr.to_string())).or_default() += 1;
                    if let Some(prev) = allocated.insert(b.ip(o), h.clone()) {
                        v.push(format!("{} allocated twice ({prev}, {h})", b.ip(o)));
                    }
                }
                None => {}
            }
        }
    }

    // The workers' view must be exactly the store's.
    let mut held: BTreeMap<IpAddr, String> = BTreeMap::new();
    for w in workers {
        for (h, ips) in &w.held {
            for ip in ips {
                if let Some(prev) = held.insert(*ip, h.clone()) {
                    v.push(format!("{ip} held twice, by {prev} and {h}"));
                }
            }
        }
    }
    for (ip, h) in &held {
        match allocated.get(ip) {
            None => v.push(format!("{ip} is held by {h} but not allocated")),
            Some(a) if a != h => v.push(format!("{ip} is held by {h} but allocated to {a}")),
            Some(_) => {}
        }
    }
    for (ip, a) in &allocated {
        if !held.contains_key(ip) {
            v.push(format!(
                "{ip} is allocated to {a} but nobody holds it (leak)"
            ));
        }
    }

    // Handle records match their blocks, both ways.
    let mut recorded: BTreeMap<(String, String), u32> = BTreeMap::new();
    if !indexed {
        for h in ipam.handles()? {
            v.push(format!("handle record {} on a store that keeps none", h.id));
        }
        recorded = counts.clone();
    }
    for h in ipam.handles()?.into_iter().filter(|_| indexed) {
        if h.blocks.is_empty() {
            v.push(format!("handle {} has no blocks but was not deleted", h.id));
        }
        for (b, n) in h.blocks {
            recorded.insert((h.id.clone(), b), n);
        }
    }
    if recorded != counts {
        for (k, n) in &recorded {
            if counts.get(k) != Some(n) {
                v.push(format!(
                    "handle {} records {n} addresses in {}, the block has {}",
                    k.0,
                    k.1,
                    counts.get(k).copied().unwrap_or(0)
                ));
            }
        }
        for (k, n) in &counts {
            if !recorded.contains_key(k) {
                v.push(format!(
                    "block {} has {n} addresses of handle {} that its record does not list",
                    k.1, k.0
                ));
            }
        }
    }

    // Affinities: one node per block, matching the block, and confirmed.
    let by_cidr: BTreeMap<IpNet, &crate::Block> = blocks.iter().map(|b| (b.cidr, b)).collect();
    let mut claimed: BTreeMap<IpNet, Vec<String>> = BTreeMap::new();
    for a in ipam.affinities(None)? {
        if a.state == AffinityState::Pending {
            // A claim in flight (or interrupted): readers treat it as absent.
            continue;
        }
        claimed.entry(a.cidr).or_default().push(a.node.clone());
        match by_cidr.get(&a.cidr) {
            None => v.push(format!(
                "{} has a {:?} affinity for missing block {}",
                a.node, a.state, a.cidr
            )),
            Some(b) if b.affine_node() != Some(a.node.as_str()) => v.push(format!(
                "{} has an affinity for block {} which is affine to {:?}",
                a.node,
                a.cidr,
                b.affine_node()
            )),
            Some(_) => {}
        }
    }
    for (cidr, nodes) in &claimed {
        if nodes.len() > 1 {
            v.push(format!(
                "block {cidr} is claimed by several nodes: {nodes:?}"
            ));
        }
    }
    for b in &blocks {
        if let Some(n) = b.affine_node()
            && !claimed
                .get(&b.cidr)
                .is_some_and(|ns| ns.iter().any(|x| x == n))
        {
            v.push(format!(
                "block {} is affine to {n} without a confirmed affinity",
                b.cidr
            ));
        }
    }
    Ok(v)
}
