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
//!
//! An [`Ipam`] caches blocks and the allocation policy, so a common-case allocation is that
//! one transaction and no read; every cached value is checked by the transaction's compares
//! (see "Caching" on [`Ipam`]). Blocks are stored in a compact JSON form ([`Block`]).

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tern_model::{
    AllowedUse, IpPool, IpPoolSpec, IpamConfig, IpamConfigSpec, Kind, ModelError, Resource,
    Selector,
};
use tern_store::{Compare, KeyValue, Op, Store, StoreError, Txn, keys};

pub mod audit;
pub mod block;
pub mod node;
// The allocation storm of the tests and benchmarks, out of production builds.
#[cfg(feature = "test-support")]
pub mod storm;
// Shared test fixtures, out of production builds too.
#[cfg(feature = "test-support")]
pub mod testing;

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
    /// The datastore is locked for a migration (`IPAMConfig` `spec.migrationLock`): nothing is
    /// allocated or released until it is unlocked (or the agent uses the new datastore).
    #[error(
        "the datastore is locked for a migration ({0}); no address is allocated or released          until `ternctl datastore unlock` or the agents use the new datastore"
    )]
    Locked(String),
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
        matches!(
            self,
            IpamError::Store(StoreError::Unavailable(_) | StoreError::Ambiguous(_))
                | IpamError::Locked(_)
        )
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
    /// Handle the addresses are recorded under (tern-api's `Attachment::handle`).
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

/// How long a cached policy (pools, IPAM configuration, node labels, reservations) is
/// used before it is read again; see [`Ipam::with_policy_ttl`].
pub const DEFAULT_POLICY_TTL: Duration = Duration::from_secs(1);

/// Cached blocks beyond this many are dropped all at once (a node touches a handful; only a
/// process allocating for very many nodes gets here).
const MAX_CACHED_BLOCKS: usize = 4096;

/// The allocator. Cheap to clone; safe to use from many threads and processes at once.
///
/// # Caching and why it is safe
///
/// An allocation in the common case is one transaction and no read. Two caches, shared by
/// clones, make that possible:
///
/// - **Blocks** (value and `mod_revision`) and each node's list of affine blocks. An
///   allocation changes the cached block and writes it with `Compare::ModRevision(block,
///   cached)`: if anyone changed (or deleted and re-created) the block since, the write fails
///   and only that block is read again. A stale block can therefore cost a retry, never a
///   double allocation. When the cached copy has no room, it is re-read before the node gives
///   up on it (another process may have freed addresses), and the affinity list is re-read
///   before a new block is claimed.
/// - **Policy**: the pools, the IPAM configuration, the node's labels and the reservations,
///   read at most every [`DEFAULT_POLICY_TTL`] (one second; [`Ipam::with_policy_ttl`]). What
///   the decision depends on most is guarded exactly: the allocation's transaction also
///   compares the `mod_revision` of the pool the block belongs to, of the IPAM configuration
///   and of the node's Node resource with the cached ones. So an allocation from a pool that
///   was disabled, removed or edited, under a changed cooldown or strict-affinity setting, or
///   after the node was relabelled, cannot commit: the transaction fails, the policy is read
///   again and the request is decided afresh. A pool created meanwhile cannot make an
///   allocation invalid; a request naming it, or one the cached pools cannot serve, is retried
///   once with a fresh read before it fails. Only new `IPReservation`s are not guarded (a
///   prefix cannot be compared): for up to the TTL after one is created, an address in it may
///   still be handed out automatically, the same window Calico's cached pool and reservation
///   views have. Set the TTL to zero to read the policy on every request.
/// - **Handles**: the handle record is not read before an allocation; the transaction
///   instead requires it to be absent (`Compare::ModRevision(handle, 0)`), which is the case
///   for every new pod; when it exists, the transaction fails and the handle is read.
///
/// # One object per write
///
/// On a store without transactions across keys ([`Store::multi_key_txn`] false: the
/// Kubernetes API, whose only compare-and-swap is one object's `resourceVersion`), the same
/// algorithm runs with every write a single object:
///
/// - The block is the only record of an allocation: its attributes name the handle, so an
///   ADD from a block the node holds is **one** write (the block's compare-and-swap) and a DEL
///   one per block that holds the handle. No handle records are written, so there is nothing
///   to over-count: a crash between any two writes leaves no allocation without its block
///   (Calico writes the handle first and collects over-counted handles later). Finding a
///   handle's addresses reads the blocks ([`Ipam::release_by_handle`] takes only allocations
///   still carrying the sequence number read).
/// - A new block is claimed as on every store: affinity `Pending`, the block's create (only
///   one node can win it), affinity `Confirmed`. Releasing an empty block marks its affinity
///   `PendingDeletion`, deletes the block if unchanged, then the affinity; a crash in between
///   leaves an affinity that [`Ipam::release_node`] or the node's next read of its blocks
///   settles by the block: confirmed again while the block is there and the node's, removed
///   once it is gone.
/// - The policy guards cannot ride along (they compare other objects): an allocation racing
///   an edit of its pool or of the IPAM configuration is decided on the policy read at most
///   [`DEFAULT_POLICY_TTL`] before, as in Calico.
/// - A write whose outcome the store could not tell is settled by reading the block back
///   (its sequence numbers say whether this write's allocations are there).
#[derive(Clone)]
pub struct Ipam {
    store: Arc<dyn Store>,
    /// The store writes several keys in one transaction ([`Store::multi_key_txn`]): the
    /// handle index is kept beside the blocks, and allocations are guarded by the policy's
    /// revisions. Otherwise (the Kubernetes API) every write is one block, and a handle's
    /// addresses are found in the blocks themselves (see "One object per write").
    indexed: bool,
    clock: Clock,
    policy_ttl: Duration,
    cache: Arc<Mutex<Cache>>,
}

/// What an [`Ipam`] remembers between requests (see "Caching" on [`Ipam`]).
#[derive(Default)]
struct Cache {
    /// Per node, the policy last read for it.
    policy: HashMap<String, Arc<Policy>>,
    /// Blocks as last read or written by this allocator, with their `mod_revision`.
    blocks: HashMap<IpNet, (Block, i64)>,
    /// Per node, its confirmed blocks as last listed (plus those it claimed since).
    affine: HashMap<String, Vec<IpNet>>,
    /// Per node, the affine block that last had room: tried first.
    hints: HashMap<String, IpNet>,
    /// The migration lock as last read (releases check it at most every policy TTL).
    lock: Option<(Instant, Option<String>)>,
}

/// Everything automatic assignment decides on besides blocks, with the `mod_revision`s that
/// guard it.
struct Policy {
    pools: Vec<Pool>,
    cfg: IpamConfigSpec,
    /// `mod_revision` of the IPAM configuration, 0 when none is stored.
    cfg_rev: i64,
    labels: Option<BTreeMap<String, String>>,
    /// Key and `mod_revision` of the node's Node resource (0 = none).
    node_key: String,
    node_rev: i64,
    reserved: Vec<IpNet>,
    read_at: Instant,
}

/// The handle record as this request believes it is: at first assumed absent (revision 0),
/// corrected from the store when a transaction says otherwise.
#[derive(Default)]
struct HandleState {
    h: Handle,
    rev: i64,
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
    policy: &'a Policy,
}

impl Cx<'_> {
    /// The compares that keep an allocation in `block` from committing under a policy that
    /// has changed since it was read (see "Caching" on [`Ipam`]).
    fn guards(&self, block: &IpNet) -> Vec<Compare> {
        let p = self.policy;
        let mut g = vec![
            Compare::ModRevision(keys::IPAM_CONFIG.to_string(), p.cfg_rev),
            Compare::ModRevision(p.node_key.clone(), p.node_rev),
        ];
        if let Some(pool) = p.pools.iter().find(|x| x.net.contains(block)) {
            g.push(Compare::ModRevision(pool.key.clone(), pool.rev));
        }
        g
    }
}

/// The `mod_revision` a model resource was read at.
fn resource_rev(r: &Resource) -> i64 {
    r.metadata()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pool that has been parsed and checked once.
#[derive(Debug, Clone)]
struct Pool {
    name: String,
    net: IpNet,
    spec: IpPoolSpec,
    /// Store key and `mod_revision` of the IPPool, to guard allocations from it.
    key: String,
    rev: i64,
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

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// FNV-1a: a stable hash, so a node walks the pool's blocks in the same order across restarts
/// and nodes start at different places.
fn node_hash(node: &str) -> u64 {
    node.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The `index`-th block of `block_size` within `pool`.
/// How far `addr` lies from `pool`'s network address.
fn net_offset(pool: &IpNet, addr: &IpAddr) -> u128 {
    match (pool, addr) {
        (IpNet::V4(n), IpAddr::V4(a)) => {
            (u32::from(*a) as u128).wrapping_sub(u32::from(n.network()) as u128)
        }
        (IpNet::V6(n), IpAddr::V6(a)) => u128::from(*a).wrapping_sub(u128::from(n.network())),
        _ => 0,
    }
}

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
            indexed: store.multi_key_txn(),
            store,
            clock,
            policy_ttl: DEFAULT_POLICY_TTL,
            cache: Arc::default(),
        }
    }

    /// The same allocator with another policy cache lifetime (see "Caching" on [`Ipam`]);
    /// `Duration::ZERO` reads pools, configuration, labels and reservations on every request.
    pub fn with_policy_ttl(mut self, ttl: Duration) -> Ipam {
        self.policy_ttl = ttl;
        self
    }

    /// Forgets every cached policy, block and affinity list, so the next request reads them
    /// (e.g. after an operator changed reservations and does not want to wait for the TTL).
    pub fn invalidate_cache(&self) {
        if let Ok(mut c) = self.cache.lock() {
            *c = Cache::default();
        }
    }

    fn with_cache<T>(&self, f: impl FnOnce(&mut Cache) -> T) -> Option<T> {
        // A poisoned lock only means another thread panicked mid-update of a hint: the cache
        // is advisory, so carry on without it.
        self.cache.lock().ok().map(|mut c| f(&mut c))
    }

    /// [`IpamError::Locked`] while the datastore is locked for a migration, read at most
    /// every policy TTL (allocations read it with their policy, and on a store with
    /// multi-key transactions their guard on the IPAM configuration's revision refuses an
    /// allocation decided before the lock).
    pub fn ensure_unlocked(&self) -> Result<()> {
        let ttl = self.policy_ttl;
        // The lock as last read, or with a policy read within the TTL (it holds the
        // configuration): no request of its own in the common case.
        let cached = self
            .with_cache(|c| {
                let from_policy = c
                    .policy
                    .values()
                    .filter(|p| p.read_at.elapsed() < ttl)
                    .max_by_key(|p| p.read_at)
                    .map(|p| (p.read_at, p.cfg.migration_lock.clone()));
                let own = c.lock.clone().filter(|(at, _)| at.elapsed() < ttl);
                match (own, from_policy) {
                    (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
                    (a, b) => a.or(b),
                }
            })
            .flatten();
        let lock = match cached {
            Some((_, l)) => l,
            None => {
                let l = self.config()?.migration_lock;
                self.with_cache(|c| c.lock = Some((Instant::now(), l.clone())));
                l
            }
        };
        match lock {
            Some(why) => Err(IpamError::Locked(why)),
            None => Ok(()),
        }
    }

    fn remember(&self, node: &str, block: IpNet) {
        self.with_cache(|c| c.hints.insert(node.to_string(), block));
    }

    /// Records a block value seen at `rev` (newer than what is cached).
    fn cache_block(&self, b: &Block, rev: i64) {
        self.with_cache(|c| {
            if c.blocks.len() >= MAX_CACHED_BLOCKS {
                c.blocks.clear();
            }
            match c.blocks.get(&b.cidr) {
                Some((_, old)) if *old > rev => {}
                _ => {
                    c.blocks.insert(b.cidr, (b.clone(), rev));
                }
            }
        });
    }

    fn forget_block(&self, cidr: &IpNet) {
        self.with_cache(|c| {
            c.blocks.remove(cidr);
            for list in c.affine.values_mut() {
                list.retain(|x| x != cidr);
            }
        });
    }

    fn cached_block(&self, cidr: &IpNet) -> Option<(Block, i64)> {
        self.with_cache(|c| c.blocks.get(cidr).cloned()).flatten()
    }

    /// Reads a block from the store (and caches it); `None` when it does not exist.
    fn read_block(&self, cidr: &IpNet) -> Result<Option<(Block, i64)>> {
        match self.store.get(&keys::block(&cidr.to_string()))? {
            Some(kv) => {
                let b: Block = decode(&kv)?;
                self.cache_block(&b, kv.mod_revision);
                Ok(Some((b, kv.mod_revision)))
            }
            None => {
                self.forget_block(cidr);
                Ok(None)
            }
        }
    }

    /// The policy for `node`: cached unless older than the TTL or `fresh` is asked for.
    /// The second value is true when the policy was read by this call.
    fn policy(&self, node: &str, fresh: bool) -> Result<(Arc<Policy>, bool)> {
        if !fresh
            && let Some(p) = self.with_cache(|c| c.policy.get(node).cloned()).flatten()
            && p.read_at.elapsed() < self.policy_ttl
        {
            return Ok((p, false));
        }
        let read_at = Instant::now();
        let pools = self.pools()?;
        let (cfg, cfg_rev) =
            match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                Some(r) => {
                    let rev = resource_rev(&r);
                    match r {
                        Resource::IpamConfig(c) => (c.spec, rev),
                        _ => (IpamConfigSpec::default(), rev),
                    }
                }
                None => (IpamConfigSpec::default(), 0),
            };
        let node_key = tern_model::resource_key(Kind::Node, None, node);
        let (labels, node_rev) =
            match tern_model::get_resource(&*self.store, Kind::Node, None, node)? {
                Some(r) => (Some(r.metadata().labels.clone()), resource_rev(&r)),
                None => (None, 0),
            };
        let p = Arc::new(Policy {
            pools,
            cfg,
            cfg_rev,
            labels,
            node_key,
            node_rev,
            reserved: self.reservations()?,
            read_at,
        });
        self.with_cache(|c| c.policy.insert(node.to_string(), p.clone()));
        Ok((p, true))
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

    /// Every reserved network of every `IPReservation` a daemon can read: one corrupt
    /// reservation (written past validation) is skipped with a warning naming its key rather
    /// than failing every assignment, the same read-path decision every daemon reader takes.
    fn reservations(&self) -> Result<Vec<IpNet>> {
        let mut out = Vec::new();
        for r in tern_model::list_resources_warn(&*self.store, Kind::IpReservation, "IPAM")? {
            if let Resource::IpReservation(r) = r {
                out.extend(r.spec.nets());
            }
        }
        Ok(out)
    }

    fn pools(&self) -> Result<Vec<Pool>> {
        let mut out = Vec::new();
        // A pool whose stored value cannot be used (oversized, corrupt, invalid: written past
        // validation) is skipped rather than failing every assignment. The decision is
        // `Resource::from_stored`'s, as for the dataplane and BGP, so a pool is allocated from
        // exactly when it is also routed; the agent's dataplane reports it with its key.
        let (pools, _unreadable) = tern_model::list_resources_skipping(&*self.store, Kind::IpPool)?;
        for r in pools {
            let rev = resource_rev(&r);
            if let Resource::IpPool(p) = r
                && let Some(net) = p.spec.net()
            {
                out.push(Pool {
                    key: tern_model::resource_key(Kind::IpPool, None, &p.metadata.name),
                    rev,
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
            Some(IpNet::V6(_)) => tern_model::defaults::IPV6_POOL_NAME,
            _ => tern_model::defaults::IPV4_POOL_NAME,
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

    /// Sets or clears the migration lock (`IPAMConfig` `spec.migrationLock`, see
    /// [`IpamError::Locked`]), keeping the other fields: one compare-and-swap on the
    /// configuration as read, retried.
    pub fn set_migration_lock(&self, lock: Option<String>) -> Result<()> {
        for _ in 0..RETRIES {
            let (mut spec, rv) =
                match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                    Some(Resource::IpamConfig(c)) => (c.spec, c.metadata.resource_version),
                    Some(r) => (
                        IpamConfigSpec::default(),
                        r.metadata().resource_version.clone(),
                    ),
                    None => (IpamConfigSpec::default(), Some("0".to_string())),
                };
            spec.migration_lock = lock.clone();
            let mut c = IpamConfig::new("default", spec);
            c.metadata.resource_version = rv;
            match tern_model::put_resource(&*self.store, &c.into()) {
                Ok(_) => {
                    self.with_cache(|c| {
                        c.lock = None;
                        c.policy.clear();
                    });
                    return Ok(());
                }
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
    fn auto_assign_into(
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
    fn assign_family(
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
    fn settle_pending_deletion(
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
    /// `blocks`: every stored block, when just read by the caller.
    fn claim_block(
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

    /// Allocates up to `want` addresses in one block and records them under the handle, in one
    /// transaction. With `owner`, only while the block is still affine to that node. Starts
    /// from the cached block (no read) and assumes the handle state in `hs`; the transaction's
    /// compares catch either being stale, and then both are read again. `Ok(None)`: the
    /// block and the handle were as assumed, so a policy guard failed (see [`Cx::guards`]).
    fn alloc_in_block(
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
    fn write_block(&self, cidr: &IpNet, b: &Block, brev: i64, ords: &[u32]) -> Result<Option<i64>> {
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

    /// After a claim of `cidr` for `node` lost the block's create: true when the block is
    /// this node's anyway (another thread or process of the node created it), and then its
    /// affinity is made `Confirmed`; else the claim's `Pending` affinity is withdrawn, only if
    /// it is still the one this claim wrote (`pending`, its revision), so a concurrent claim
    /// of the same node that won is never undone.
    fn lost_claim(&self, node: &str, cidr: &IpNet, aff_key: &str, pending: i64) -> Result<bool> {
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

    /// A new block affine to `node`: the node's cached list of blocks learns of it.
    fn learn_affine(&self, node: &str, cidr: IpNet) {
        self.with_cache(|c| {
            if let Some(list) = c.affine.get_mut(node)
                && !list.contains(&cidr)
            {
                list.push(cidr);
                list.sort();
            }
        });
    }

    /// The blocks holding an address of `handle`, as read now: through the handle record
    /// where the store keeps one, else by reading every block.
    fn handle_blocks(&self, handle: &str) -> Result<Vec<(String, Block)>> {
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

#[cfg(test)]
mod cache_tests;
