//! Block IPAM in the manner of Calico's libcalico-go `lib/ipam`, pure over a [`Store`].
//!
//! Pools are cut into blocks (default /26); a node claims blocks (affinity) and allocates from
//! them, so most allocations touch one block the node already owns. Every write is a
//! compare-and-swap on `mod_revision`; an allocation writes the block and the handle record in
//! one transaction, so in the common case it costs exactly one store write.
//!
//! Claiming a block is two-phase, as in Calico: write the node's affinity `Pending`, create the
//! block only if absent (`Compare::ModRevision(block, 0)`), then confirm the affinity. A crash in
//! between leaves a pending affinity that the next claim by the same node repairs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tern_model::{
    AllowedUse, IpPool, IpPoolSpec, IpamConfig, IpamConfigSpec, Kind, ModelError, Resource,
    Selector,
};
use tern_store::{Compare, KeyValue, Op, Store, StoreError, Txn, keys};

pub mod block;
pub mod storm;

pub use block::{
    Affinity, AffinityRecord, AffinityState, AllocationAttribute, Block, Handle, HandleRecord,
    host_affinity,
};

/// How often a compare-and-swap is retried on conflict before giving up.
const RETRIES: usize = 100;

/// Errors of the allocator.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// Every candidate pool is full (or the node may not claim/borrow more).
    #[error("no free address in pools [{}] for node {node}{}", .pools.join(", "), fmt_detail(.detail))]
    PoolsExhausted {
        pools: Vec<String>,
        node: String,
        detail: String,
    },
    /// No enabled pool of the family is usable for this request.
    #[error("no usable IPv{family} pool for node {node}{}", fmt_detail(.detail))]
    NoPools {
        family: u8,
        node: String,
        detail: String,
    },
    /// The requested address is allocated already.
    #[error("{ip} is already in use (handle {handle})")]
    AddressInUse { ip: IpAddr, handle: String },
    /// The requested address is in no enabled pool.
    #[error("{ip} is not in any enabled IP pool")]
    NotInPool { ip: IpAddr },
    /// Compare-and-swap kept failing.
    #[error("gave up on {key} after {RETRIES} conflicting concurrent updates")]
    Contention { key: String },
    /// A stored IPAM record does not decode.
    #[error("corrupt IPAM record at {key}: {message}")]
    Corrupt { key: String, message: String },
    /// A stored resource (pool, config) is invalid.
    #[error(transparent)]
    Model(ModelError),
    /// The datastore failed; see [`IpamError::is_unavailable`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn fmt_detail(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

impl IpamError {
    /// True when the datastore could not be reached: the caller should retry later (the
    /// agent reports CNI error code 11, "try again later").
    pub fn is_unavailable(&self) -> bool {
        matches!(self, IpamError::Store(StoreError::Unavailable(_)))
    }
}

impl From<ModelError> for IpamError {
    fn from(e: ModelError) -> IpamError {
        match e {
            ModelError::Store(s) => IpamError::Store(s),
            other => IpamError::Model(other),
        }
    }
}

/// Result of the allocator.
pub type Result<T> = std::result::Result<T, IpamError>;

/// Who an address is allocated to (Calico's "secondary" attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationAttrs {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A request for addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignArgs {
    /// Handle the addresses are recorded under (`<network>.<containerID>`).
    pub handle: String,
    /// The node allocating (blocks are claimed for it).
    pub node: String,
    pub attrs: AllocationAttrs,
    pub num_v4: usize,
    pub num_v6: usize,
    /// Restrict to these pools (by name or CIDR); empty = every usable pool.
    pub v4_pools: Vec<String>,
    pub v6_pools: Vec<String>,
}

/// Usage of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockUsage {
    pub cidr: IpNet,
    pub total: u128,
    pub in_use: u128,
    /// The node the block is affine to.
    pub affinity: Option<String>,
}

/// Usage of one pool and its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    pub pool: String,
    pub cidr: IpNet,
    pub total: u128,
    pub in_use: u128,
    pub blocks: Vec<BlockUsage>,
}

/// One live allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ip: IpAddr,
    pub handle: Option<String>,
    pub attrs: AllocationAttrs,
    pub block: IpNet,
    /// The allocation's sequence number in its block (changes if the address is reused).
    pub sequence_number: u64,
}

/// Addresses of both families from one dual-stack request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assigned {
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

/// The clock of the allocator: unix seconds. Injectable so tests of cooldowns and grace
/// periods need not sleep.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock in unix seconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// The allocator. Cheap to clone; safe to use from many threads and processes at once.
#[derive(Clone)]
pub struct Ipam {
    store: Arc<dyn Store>,
    clock: Clock,
    /// Per node, the affine block that last had room: only an ordering hint (every write is
    /// still a compare-and-swap), shared by clones.
    hints: Arc<Mutex<HashMap<String, IpNet>>>,
}

/// Which free ordinals automatic assignment may hand out, decided once per request.
struct Filter {
    /// `IPReservation` networks: never handed out automatically.
    reserved: Vec<IpNet>,
    cooldown: u64,
    now: u64,
}

impl Filter {
    fn usable(&self, cidr: &IpNet, released_at: &BTreeMap<u32, u64>, ordinal: u32) -> bool {
        if let Some(&t) = released_at.get(&ordinal)
            && t.saturating_add(self.cooldown) > self.now
        {
            return false;
        }
        if self.reserved.is_empty() {
            return true;
        }
        let ip = Block::new_view(cidr).ip(ordinal);
        !self.reserved.iter().any(|r| r.contains(&ip))
    }

    /// Whether some reservation covers the whole block, so claiming it is pointless.
    fn covers(&self, block: &IpNet) -> bool {
        self.reserved.iter().any(|r| r.contains(block))
    }
}

fn decode<T: for<'de> Deserialize<'de>>(kv: &KeyValue) -> Result<T> {
    serde_json::from_slice(&kv.value).map_err(|e| IpamError::Corrupt {
        key: kv.key.clone(),
        message: e.to_string(),
    })
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain data; serialisation cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// Everything one automatic assignment decides on up front.
struct Cx<'a> {
    pools: &'a [Pool],
    cfg: &'a IpamConfigSpec,
    labels: Option<&'a BTreeMap<String, String>>,
    filter: &'a Filter,
}

/// A pool that has been parsed and checked once.
#[derive(Debug, Clone)]
struct Pool {
    name: String,
    net: IpNet,
    spec: IpPoolSpec,
}

impl Pool {
    /// Enabled, allowed for workloads, and its node selector selects the node. `labels` is
    /// `None` when the node has no Node resource: then only `all()` pools qualify, since
    /// nothing is known about the node. A selector that does not parse selects nothing.
    fn workload_usable(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        !self.spec.disabled
            && self.spec.allowed_uses.contains(&AllowedUse::Workload)
            && match Selector::parse(&self.spec.node_selector) {
                Ok(sel) => match labels {
                    Some(l) => sel.matches(l),
                    None => sel.is_all(),
                },
                Err(_) => false,
            }
    }
}

/// FNV-1a: a stable hash, so a node walks the pool's blocks in the same order across restarts
/// and nodes start at different places.
fn node_hash(node: &str) -> u64 {
    node.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The `index`-th block of `block_size` within `pool`.
fn nth_block(pool: &IpNet, block_size: u8, index: u128) -> IpNet {
    let shift = pool.max_prefix_len() - block_size;
    match pool {
        IpNet::V4(n) => {
            let base = u32::from(n.network()) as u128 + (index << shift);
            IpNet::new(IpAddr::V4((base as u32).into()), block_size).expect("valid prefix")
        }
        IpNet::V6(n) => {
            let base = u128::from(n.network()) + (index << shift);
            IpNet::new(IpAddr::V6(base.into()), block_size).expect("valid prefix")
        }
    }
}

fn family_of(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 4,
        IpNet::V6(_) => 6,
    }
}

impl Ipam {
    /// An allocator over the store.
    pub fn new(store: Arc<dyn Store>) -> Ipam {
        Ipam::with_clock(store, system_clock())
    }

    /// An allocator with its own clock (unix seconds), for tests of time-based behaviour.
    pub fn with_clock(store: Arc<dyn Store>, clock: Clock) -> Ipam {
        Ipam {
            store,
            clock,
            hints: Arc::default(),
        }
    }

    fn remember(&self, node: &str, block: IpNet) {
        if let Ok(mut h) = self.hints.lock() {
            h.insert(node.to_string(), block);
        }
    }

    /// The store the allocator works on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn now(&self) -> u64 {
        (self.clock)()
    }

    /// The node's labels from its Node resource (`metadata.labels`), `None` without one.
    fn node_labels(&self, node: &str) -> Result<Option<BTreeMap<String, String>>> {
        Ok(
            tern_model::get_resource(&*self.store, Kind::Node, None, node)?
                .map(|r| r.metadata().labels.clone()),
        )
    }

    /// Every reserved network of every `IPReservation`.
    fn reservations(&self) -> Result<Vec<IpNet>> {
        let mut out = Vec::new();
        for r in tern_model::list_resources(&*self.store, Kind::IpReservation)? {
            if let Resource::IpReservation(r) = r {
                out.extend(r.spec.nets());
            }
        }
        Ok(out)
    }

    fn filter(&self, cfg: &IpamConfigSpec) -> Result<Filter> {
        Ok(Filter {
            reserved: self.reservations()?,
            cooldown: cfg.release_cooldown_seconds,
            now: self.now(),
        })
    }

    fn pools(&self) -> Result<Vec<Pool>> {
        let mut out = Vec::new();
        for r in tern_model::list_resources(&*self.store, Kind::IpPool)? {
            if let Resource::IpPool(p) = r
                && let Some(net) = p.spec.net()
            {
                out.push(Pool {
                    name: p.metadata.name,
                    net,
                    spec: p.spec,
                });
            }
        }
        Ok(out)
    }

    /// The cluster IPAM configuration (defaults when none is stored).
    pub fn config(&self) -> Result<IpamConfigSpec> {
        Ok(
            match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                Some(Resource::IpamConfig(c)) => c.spec,
                _ => IpamConfigSpec::default(),
            },
        )
    }

    /// Creates `default-ipv4-ippool` (or `default-ipv6-ippool` for an IPv6 CIDR) with the
    /// family's default block size when no IPPool exists; returns whether it was created. A
    /// pool smaller than the default block gets one block covering the whole pool.
    /// Pools of the other family do not count, so a dual-stack node can ensure one of each.
    pub fn ensure_default_pool(&self, cidr: &str) -> Result<bool> {
        let mut spec = IpPoolSpec::new(cidr);
        let family = spec.net().map(|n| family_of(&n));
        if self
            .pools()?
            .iter()
            .any(|p| Some(family_of(&p.net)) == family)
        {
            return Ok(false);
        }
        let name = match spec.net() {
            Some(IpNet::V6(_)) => "default-ipv6-ippool",
            _ => "default-ipv4-ippool",
        };
        if let Some(net) = spec.net() {
            spec.block_size = spec.block_size.max(net.prefix_len());
        }
        let mut pool = IpPool::new(name, spec);
        // Create-only: two agents starting together must not overwrite each other.
        pool.metadata.resource_version = Some("0".into());
        match tern_model::put_resource(&*self.store, &pool.into()) {
            Ok(_) => Ok(true),
            Err(ModelError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Stores the configuration (compare-and-swap on the stored revision, retried).
    pub fn put_config(&self, spec: &IpamConfigSpec) -> Result<()> {
        for _ in 0..RETRIES {
            let rv =
                match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                    Some(r) => r.metadata().resource_version.clone(),
                    None => Some("0".to_string()),
                };
            let mut c = IpamConfig::new("default", spec.clone());
            c.metadata.resource_version = rv;
            match tern_model::put_resource(&*self.store, &c.into()) {
                Ok(_) => return Ok(()),
                Err(ModelError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            key: keys::IPAM_CONFIG.to_string(),
        })
    }

    /// `ipam configure`: sets `strictAffinity` and `maxBlocksPerHost`, keeping the other
    /// fields. Existing allocations stay valid either way (borrowed addresses are kept and
    /// still released normally).
    pub fn set_config(&self, strict_affinity: bool, max_blocks_per_host: u32) -> Result<()> {
        let mut spec = self.config()?;
        spec.strict_affinity = strict_affinity;
        spec.max_blocks_per_host = max_blocks_per_host;
        self.put_config(&spec)
    }

    /// Names of the pools usable for workloads on this node: enabled, `Workload` allowed,
    /// and `nodeSelector` matching the labels of the node's Node resource (without a Node
    /// resource, only pools selecting `all()`).
    pub fn usable_pools(&self, node: &str) -> Result<Vec<String>> {
        let labels = self.node_labels(node)?;
        Ok(self
            .pools()?
            .into_iter()
            .filter(|p| p.workload_usable(labels.as_ref()))
            .map(|p| p.name)
            .collect())
    }

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
        let pools = self.pools()?;
        let cfg = self.config()?;
        let labels = self.node_labels(&args.node)?;
        let filter = self.filter(&cfg)?;
        let cx = Cx {
            pools: &pools,
            cfg: &cfg,
            labels: labels.as_ref(),
            filter: &filter,
        };
        let mut got = Vec::new();
        for (family, n, wanted) in [
            (4u8, args.num_v4, &args.v4_pools),
            (6u8, args.num_v6, &args.v6_pools),
        ] {
            if n == 0 {
                continue;
            }
            if let Err(e) = self.assign_family(args, family, n, wanted, &cx, &mut got) {
                if !got.is_empty() {
                    // Best effort: the original error matters more than a failed rollback.
                    let _ = self.release_ips(&got);
                }
                return Err(e);
            }
        }
        Ok(got)
    }

    fn assign_family(
        &self,
        args: &AssignArgs,
        family: u8,
        n: usize,
        wanted: &[String],
        cx: &Cx,
        got: &mut Vec<IpAddr>,
    ) -> Result<()> {
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
        //    with many full blocks does not re-read them all for every allocation.
        let mut mine = self.affine_blocks(node)?;
        let hint = self.hints.lock().ok().and_then(|h| h.get(node).copied());
        if let Some(pos) = hint.and_then(|h| mine.iter().position(|c| *c == h)) {
            let h = mine.remove(pos);
            mine.insert(0, h);
        }
        for cidr in mine {
            if missing(got) == 0 {
                return Ok(());
            }
            if in_candidates(&cidr) {
                let ips = self.alloc_in_block(&cidr, missing(got), args, Some(node), filter)?;
                if !ips.is_empty() {
                    self.remember(node, cidr);
                }
                got.extend(ips);
            }
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
                let Some(cidr) = self.claim_block(node, pool, filter)? else {
                    break;
                };
                self.remember(node, cidr);
                got.extend(self.alloc_in_block(&cidr, missing(got), args, Some(node), filter)?);
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
                    got.extend(self.alloc_in_block(&b.cidr, missing(got), args, None, filter)?);
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
        Ok(())
    }

    /// The node's confirmed blocks, in address order. A pending affinity whose block exists
    /// and names this node is a claim interrupted before confirmation: it is confirmed here.
    fn affine_blocks(&self, node: &str) -> Result<Vec<IpNet>> {
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
                AffinityState::PendingDeletion => {}
            }
        }
        out.sort();
        Ok(out)
    }

    fn confirm_affinity(&self, node: &str, cidr: &IpNet, rev: i64) -> Result<()> {
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
    fn claim_block(&self, node: &str, pool: &Pool, filter: &Filter) -> Result<Option<IpNet>> {
        let bs = pool.spec.block_size;
        if bs < pool.net.prefix_len() || bs > pool.net.max_prefix_len() {
            return Ok(None);
        }
        let count: u128 = 1u128 << (bs - pool.net.prefix_len()).min(127);
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        let mut taken: BTreeSet<String> = kvs
            .iter()
            .map(|kv| keys::segment_cidr(&kv.key[keys::BLOCKS.len()..]))
            .collect();
        let start = node_hash(node) as u128 % count;
        // Every step either finds a free block or skips a taken one, so the walk ends after at
        // most (blocks in the store + 1) useful steps unless the pool is full.
        for i in 0..count {
            let cidr = nth_block(&pool.net, bs, (start + i) % count);
            let cs = cidr.to_string();
            if taken.contains(&cs) || filter.covers(&cidr) {
                continue;
            }
            let aff_key = keys::affinity(node, &cs);
            self.store.put(
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
                // Another node won this block; withdraw the claim and keep walking.
                self.store.delete(&aff_key)?;
                taken.insert(cs);
                continue;
            }
            self.store.put(
                &aff_key,
                &encode(&Affinity {
                    state: AffinityState::Confirmed,
                }),
            )?;
            return Ok(Some(cidr));
        }
        Ok(None)
    }

    /// Allocates up to `want` addresses in one block and records them under the handle, in one
    /// transaction. With `owner`, only while the block is still affine to that node.
    fn alloc_in_block(
        &self,
        cidr: &IpNet,
        want: usize,
        args: &AssignArgs,
        owner: Option<&str>,
        filter: &Filter,
    ) -> Result<Vec<IpAddr>> {
        let bkey = keys::block(&cidr.to_string());
        let hkey = keys::handle(&args.handle);
        for _ in 0..RETRIES {
            let Some(bkv) = self.store.get(&bkey)? else {
                return Ok(Vec::new());
            };
            let mut b: Block = decode(&bkv)?;
            if b.deleted || owner.is_some_and(|o| b.affine_node() != Some(o)) {
                return Ok(Vec::new());
            }
            // The release stamps are moved out so the filter can read them while the block
            // is being changed; those of the ordinals just allocated are dropped.
            let mut released = std::mem::take(&mut b.released_at);
            let cidr_b = b.cidr;
            let ords = b.allocate_where(want, &args.handle, &args.attrs, |o| {
                filter.usable(&cidr_b, &released, o)
            });
            for o in &ords {
                released.remove(o);
            }
            b.released_at = released;
            if ords.is_empty() {
                return Ok(Vec::new());
            }
            let hkv = self.store.get(&hkey)?;
            let mut h: Handle = match &hkv {
                Some(kv) => decode(kv)?,
                None => Handle::default(),
            };
            *h.block.entry(cidr.to_string()).or_default() += ords.len() as u32;
            let resp = self.store.txn(Txn {
                compare: vec![
                    Compare::ModRevision(bkey.clone(), bkv.mod_revision),
                    Compare::ModRevision(hkey.clone(), hkv.map_or(0, |kv| kv.mod_revision)),
                ],
                success: vec![
                    Op::put(bkey.clone(), encode(&b)),
                    Op::put(hkey.clone(), encode(&h)),
                ],
                failure: vec![],
            })?;
            if resp.succeeded {
                return Ok(ords.into_iter().map(|o| b.ip(o)).collect());
            }
        }
        Err(IpamError::Contention { key: bkey })
    }

    /// Assigns a specific address to the handle. It must lie in an enabled pool and be free.
    /// When its block does not exist yet, the block is created affine to `attrs.node`.
    /// An address inside an `IPReservation` is allowed here, as in Calico: reservations
    /// only keep addresses out of automatic assignment, and an explicit request (a static
    /// pod IP, a gateway) is the operator's decision.
    pub fn assign_ip(&self, ip: IpAddr, handle: &str, attrs: &AllocationAttrs) -> Result<()> {
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
            let hkv = self.store.get(&hkey)?;
            let mut h: Handle = match &hkv {
                Some(kv) => decode(kv)?,
                None => Handle::default(),
            };
            *h.block.entry(cs.clone()).or_default() += 1;
            let mut success = vec![
                Op::put(bkey.clone(), encode(&b)),
                Op::put(hkey.clone(), encode(&h)),
            ];
            if brev == 0 && !attrs.node.is_empty() {
                success.push(Op::put(
                    keys::affinity(&attrs.node, &cs),
                    encode(&Affinity {
                        state: AffinityState::Confirmed,
                    }),
                ));
            }
            let resp = self.store.txn(Txn {
                compare: vec![
                    Compare::ModRevision(bkey.clone(), brev),
                    Compare::ModRevision(hkey.clone(), hkv.map_or(0, |kv| kv.mod_revision)),
                ],
                success,
                failure: vec![],
            })?;
            if resp.succeeded {
                return Ok(());
            }
        }
        Err(IpamError::Contention { key: bkey })
    }

    /// Releases every address of the handle and deletes the handle; returns the addresses
    /// released. An unknown handle releases nothing and is not an error (DEL is idempotent).
    pub fn release_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>> {
        let hkey = keys::handle(handle);
        let mut released = Vec::new();
        for _ in 0..RETRIES {
            let Some(hkv) = self.store.get(&hkey)? else {
                return Ok(released);
            };
            let mut h: Handle = decode(&hkv)?;
            let Some(cidr) = h.block.keys().next().cloned() else {
                self.store.txn(Txn {
                    compare: vec![Compare::ModRevision(hkey.clone(), hkv.mod_revision)],
                    success: vec![Op::delete(hkey.clone())],
                    failure: vec![],
                })?;
                continue;
            };
            h.block.remove(&cidr);
            let handle_op = if h.block.is_empty() {
                Op::delete(hkey.clone())
            } else {
                Op::put(hkey.clone(), encode(&h))
            };
            let bkey = keys::block(&cidr);
            let mut compare = vec![Compare::ModRevision(hkey.clone(), hkv.mod_revision)];
            let mut success = vec![handle_op];
            let mut freed = Vec::new();
            if let Some(bkv) = self.store.get(&bkey)? {
                let mut b: Block = decode(&bkv)?;
                let ords = b.ordinals_of(handle);
                b.release_at(&ords, self.now());
                freed = ords.into_iter().map(|o| b.ip(o)).collect();
                compare.push(Compare::ModRevision(bkey.clone(), bkv.mod_revision));
                success.push(Op::put(bkey, encode(&b)));
            }
            let resp = self.store.txn(Txn {
                compare,
                success,
                failure: vec![],
            })?;
            if resp.succeeded {
                released.extend(freed);
            }
            // Either way, re-read the handle: next block, or retry after a conflict.
        }
        Err(IpamError::Contention { key: hkey })
    }

    /// Releases the given addresses (whoever holds them); returns those that were allocated.
    /// Addresses not allocated are ignored.
    pub fn release_ips(&self, ips: &[IpAddr]) -> Result<Vec<IpAddr>> {
        let (kvs, _) = self.store.range(keys::BLOCKS)?;
        let mut by_block: BTreeMap<String, Vec<(IpAddr, Option<u64>)>> = BTreeMap::new();
        for kv in &kvs {
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
    fn release_in_block(&self, bkey: &str, ips: &[(IpAddr, Option<u64>)]) -> Result<Vec<IpAddr>> {
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
            let resp = self.store.txn(Txn {
                compare,
                success,
                failure: vec![],
            })?;
            if resp.succeeded {
                return Ok(freed.into_iter().map(|(o, _)| b.ip(o)).collect());
            }
        }
        Err(IpamError::Contention {
            key: bkey.to_string(),
        })
    }

    /// The addresses held by the handle.
    pub fn ips_by_handle(&self, handle: &str) -> Result<Vec<IpAddr>> {
        let Some(hkv) = self.store.get(&keys::handle(handle))? else {
            return Ok(Vec::new());
        };
        let h: Handle = decode(&hkv)?;
        let mut out = Vec::new();
        for cidr in h.block.keys() {
            if let Some(bkv) = self.store.get(&keys::block(cidr))? {
                let b: Block = decode(&bkv)?;
                out.extend(b.ordinals_of(handle).into_iter().map(|o| b.ip(o)));
            }
        }
        Ok(out)
    }

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

    /// Releases the node's blocks that have been empty for longer than `grace` and returns
    /// them; never the node's last block. Per block, as in Calico: the affinity goes
    /// `Confirmed → PendingDeletion` (CAS), then the block and the affinity are deleted in one
    /// transaction that holds only if the block is unchanged (still empty); if an allocation
    /// (a borrower's) slipped in, the affinity is put back to `Confirmed`.
    pub fn release_empty_blocks(&self, node: &str, grace: Duration) -> Result<Vec<IpNet>> {
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
            let deleted = self.store.txn(Txn {
                compare: vec![
                    Compare::ModRevision(bkey.clone(), bkv.mod_revision),
                    Compare::ModRevision(akey.clone(), marked.revision),
                ],
                success: vec![Op::delete(bkey), Op::delete(akey.clone())],
                failure: vec![],
            })?;
            if deleted.succeeded {
                remaining -= 1;
                out.push(cidr);
            } else {
                // Someone allocated in the block meanwhile: it stays the node's.
                self.store.txn(Txn {
                    compare: vec![Compare::ModRevision(akey.clone(), marked.revision)],
                    success: vec![Op::put(
                        akey,
                        encode(&Affinity {
                            state: AffinityState::Confirmed,
                        }),
                    )],
                    failure: vec![],
                })?;
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
