//! The allocator handle ([`Ipam`]) and its caches of blocks and policy (see "Caching" on
//! [`Ipam`]): constructing it, remembering and forgetting blocks. The operations are
//! `impl Ipam` blocks in the modules beside this one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tern_store::{Store, keys};

use crate::api::{Clock, DEFAULT_POLICY_TTL, system_clock};
use crate::block::Block;
use crate::codec::decode;
use crate::error::Result;
use crate::policy::Policy;

/// Cached blocks beyond this many are dropped all at once (a node touches a handful; only a
/// process allocating for very many nodes gets here).
pub(crate) const MAX_CACHED_BLOCKS: usize = 4096;

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
    pub(crate) store: Arc<dyn Store>,
    /// The store writes several keys in one transaction ([`Store::multi_key_txn`]): the
    /// handle index is kept beside the blocks, and allocations are guarded by the policy's
    /// revisions. Otherwise (the Kubernetes API) every write is one block, and a handle's
    /// addresses are found in the blocks themselves (see "One object per write").
    pub(crate) indexed: bool,
    pub(crate) clock: Clock,
    pub(crate) policy_ttl: Duration,
    pub(crate) cache: Arc<Mutex<Cache>>,
}

/// What an [`Ipam`] remembers between requests (see "Caching" on [`Ipam`]).
#[derive(Default)]
pub(crate) struct Cache {
    /// Per node, the policy last read for it.
    pub(crate) policy: HashMap<String, Arc<Policy>>,
    /// Blocks as last read or written by this allocator, with their `mod_revision`.
    pub(crate) blocks: HashMap<IpNet, (Block, i64)>,
    /// Per node, its confirmed blocks as last listed (plus those it claimed since).
    pub(crate) affine: HashMap<String, Vec<IpNet>>,
    /// Per node, the affine block that last had room: tried first.
    pub(crate) hints: HashMap<String, IpNet>,
    /// The migration lock as last read (releases check it at most every policy TTL).
    pub(crate) lock: Option<(Instant, Option<String>)>,
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

    pub(crate) fn with_cache<T>(&self, f: impl FnOnce(&mut Cache) -> T) -> Option<T> {
        // A poisoned lock only means another thread panicked mid-update of a hint: the cache
        // is advisory, so carry on without it.
        self.cache.lock().ok().map(|mut c| f(&mut c))
    }

    pub(crate) fn remember(&self, node: &str, block: IpNet) {
        self.with_cache(|c| c.hints.insert(node.to_string(), block));
    }

    /// Records a block value seen at `rev` (newer than what is cached).
    pub(crate) fn cache_block(&self, b: &Block, rev: i64) {
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

    pub(crate) fn forget_block(&self, cidr: &IpNet) {
        self.with_cache(|c| {
            c.blocks.remove(cidr);
            for list in c.affine.values_mut() {
                list.retain(|x| x != cidr);
            }
        });
    }

    pub(crate) fn cached_block(&self, cidr: &IpNet) -> Option<(Block, i64)> {
        self.with_cache(|c| c.blocks.get(cidr).cloned()).flatten()
    }

    /// Reads a block from the store (and caches it); `None` when it does not exist.
    pub(crate) fn read_block(&self, cidr: &IpNet) -> Result<Option<(Block, i64)>> {
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

    /// The store the allocator works on.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub(crate) fn now(&self) -> u64 {
        (self.clock)()
    }
}
