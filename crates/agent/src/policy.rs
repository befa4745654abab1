//! NetworkPolicy enforcement: the node's `inet tern` table, kept equal to the policies,
//! namespaces and endpoints of the whole cluster by [`tern_policy::Incremental`].
//!
//! - Every change reaches the kernel as one nfnetlink batch ([`apply_pending`]): the
//!   [`tern_policy::TableChange`]s of the delta (a pod joining a set, a policy becoming active
//!   with its chains, sets and elements, ...) or of the full resync (the table deleted and
//!   re-created in one transaction). No `nft` process, except as the fallback when the kernel
//!   refuses a batch (then a full resync through `nft -f`).
//! - The table is shared with natOutgoing: [`crate::dataplane`] hands its chains and sets over
//!   ([`PolicyEngine::set_nat`]) and they are applied in the same transactions, so a full
//!   resync never drops them.
//! - Start: the table the previous agent left in the kernel stays until the first full resync
//!   replaces it in one transaction, so a restart never opens a window of allow-all.
//! - ADD: [`PolicyEngine::endpoint_added`] puts the endpoint's chains, map entries and set
//!   elements into the kernel before the pod has an address or a route (see `pod/add.rs`), so no
//!   packet reaches or leaves the pod unpoliced.
//! - Watch: every policy / namespace / endpoint change in the store becomes a delta of the
//!   chains and sets it touched. A periodic full resync (from the maintenance loop) repairs
//!   drift.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tern_linux::kernel::{NftApply, SystemNft};
use tern_model::{Kind, Resource};
use tern_policy::{Endpoint, Incremental, PolicyKey, PolicySet, Ruleset, Script};
use tern_store::{EventKind, Store, keys};

/// Errors of policy enforcement.
#[derive(Debug, thiserror::Error)]
pub enum PolicyAgentError {
    /// The store could not be read.
    #[error("reading {what} from the datastore: {source}")]
    Store {
        what: String,
        #[source]
        source: tern_store::StoreError,
    },
    /// `nft -f` refused a script.
    #[error(
        "applying the policy ruleset (table inet tern, {kind} script of {lines} lines): {source}"
    )]
    Apply {
        kind: &'static str,
        lines: usize,
        #[source]
        source: tern_linux::LinuxError,
    },
}

/// How [`apply_pending`] brought a change to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing was pending.
    Nothing,
    /// A delta, as one nfnetlink batch.
    Netlink,
    /// A full resync (the table deleted and re-created), as one nfnetlink batch.
    Full,
    /// An `nft -f` script ([`run_script`]; a full resync when `full`): the fallback when the
    /// kernel refused the netlink batch.
    Nft { full: bool },
}

/// Applies a script with `nft -f` and commits it; a failure forgets the kernel state, so the
/// next change is a full resync.
pub fn run_script(inc: &mut Incremental, s: &Script) -> Result<Applied, PolicyAgentError> {
    run_script_with(inc, &mut SystemNft, s)
}

/// [`run_script`] through any nftables (`nft`).
fn run_script_with(
    inc: &mut Incremental,
    nft: &mut dyn NftApply,
    s: &Script,
) -> Result<Applied, PolicyAgentError> {
    if s.text.is_empty() {
        inc.commit(s);
        return Ok(Applied::Nothing);
    }
    log::debug!(
        "policy: applying {} lines with nft (full: {}): {:.200}",
        s.text.lines().count(),
        s.full,
        s.text
    );
    match nft.apply_script(&s.text) {
        Ok(()) => {
            inc.commit(s);
            Ok(Applied::Nft { full: s.full })
        }
        Err(e) => {
            inc.invalidate();
            Err(PolicyAgentError::Apply {
                kind: if s.full { "full" } else { "delta" },
                lines: s.text.lines().count(),
                source: e,
            })
        }
    }
}

/// Brings the `inet tern` table of the calling thread's network namespace to `inc`'s desired
/// state as one nfnetlink batch ([`apply_netlink`]). A delta the kernel refuses (drift: a
/// chain or set changed behind the agent's back) is retried as a full resync over netlink;
/// a full resync the kernel refuses goes through `nft -f`, which encodes by itself.
pub fn apply_pending(inc: &mut Incremental) -> Result<Applied, PolicyAgentError> {
    apply_pending_with(inc, &mut SystemNft)
}

/// [`apply_pending`] through any nftables (`nft`; the real one is
/// [`tern_linux::kernel::SystemNft`]).
pub fn apply_pending_with(
    inc: &mut Incremental,
    nft: &mut dyn NftApply,
) -> Result<Applied, PolicyAgentError> {
    let mut full = match try_netlink(inc, nft) {
        Ok(how) => return Ok(how),
        Err(full) => full,
    };
    if !full {
        // The batch was one transaction: it changed nothing. Resync it all.
        inc.invalidate();
        match try_netlink(inc, nft) {
            Ok(how) => return Ok(how),
            Err(f) => full = f,
        }
    }
    debug_assert!(full);
    log::warn!("policy: the kernel refused the full resync over netlink; resyncing with nft -f");
    let script = inc.full_script();
    run_script_with(inc, nft, &script)
}

/// Applies the pending changes ([`Incremental::changes`]: the delta since the last commit, or
/// the full resync when the kernel state is unknown) as one nfnetlink batch instead of
/// `nft -f`, which would first load the whole table (tens of milliseconds at 1,000 policies);
/// no script text is rendered. `Some` when applied (or nothing was pending) and committed;
/// `None` when the kernel refused the batch (the batch is one transaction: nothing changed,
/// nothing is committed).
pub fn apply_netlink(inc: &mut Incremental) -> Option<Applied> {
    try_netlink(inc, &mut SystemNft).ok()
}

/// [`apply_netlink`]; on a refusal, whether the refused batch was a full resync.
fn try_netlink(inc: &mut Incremental, nft: &mut dyn NftApply) -> Result<Applied, bool> {
    let c = inc.changes();
    if c.changes.is_empty() {
        inc.commit_changes(&c);
        return Ok(Applied::Nothing);
    }
    // Like the `nft` child process it replaces, this acts in the network namespace of the
    // calling thread (the socket is cached per thread and namespace).
    match nft.apply_changes(tern_policy::nft::TABLE_NAME, &c.changes) {
        Ok(()) => {
            log::debug!(
                "policy: applied {} table changes over netlink (full: {})",
                c.changes.len(),
                c.full
            );
            inc.commit_changes(&c);
            Ok(if c.full {
                Applied::Full
            } else {
                Applied::Netlink
            })
        }
        Err(e) => {
            log::warn!(
                "policy: the kernel refused a netlink batch of {} changes (full: {}): {e}",
                c.changes.len(),
                c.full
            );
            Err(c.full)
        }
    }
}

/// Logs how long a change of one object from the Kubernetes source (a NetworkPolicy, a
/// namespace: rare next to pods) took to reach the kernel, and where the time went.
fn log_apply(
    k: &ObjectKey,
    t0: Instant,
    locked: Duration,
    compiled: Duration,
    how: &Result<Applied, PolicyAgentError>,
) {
    let total = t0.elapsed();
    log::info!(
        "policy: {} {}{} in force after {} ms (waited {} ms for the engine, compiled in {} ms,          applied {:?} in {} ms)",
        k.0.as_str(),
        k.1.as_deref().map(|n| format!("{n}/")).unwrap_or_default(),
        k.2,
        total.as_millis(),
        locked.as_millis(),
        (compiled - locked).as_millis(),
        how.as_ref().map_err(|e| e.to_string()),
        (total - compiled).as_millis()
    );
}

/// Kinds whose objects feed policy. The staged policies are kept in the policy set (for
/// `PolicySet::pending`), never compiled into the kernel's table.
const KINDS: [Kind; 8] = [
    Kind::K8sNetworkPolicy,
    Kind::NetworkPolicy,
    Kind::GlobalNetworkPolicy,
    Kind::StagedNetworkPolicy,
    Kind::StagedGlobalNetworkPolicy,
    Kind::StagedKubernetesNetworkPolicy,
    Kind::Namespace,
    Kind::WorkloadEndpoint,
];

/// The policy state of this node and the kernel table it drives.
pub struct PolicyEngine {
    store: Arc<dyn Store>,
    /// The store of this node's own endpoint records when it is not `store`
    /// ([`crate::endpoints::open_store`]): this node's endpoints are read from it, and the
    /// ones `store` derives for this node (from its Pods) are ignored.
    local: Option<Arc<dyn Store>>,
    /// Objects from a source other than the store (the Kubernetes API, see [`crate::kube`]):
    /// applied over the store's at every resync, so a resync never drops them. Locked before
    /// `state` whenever both are held.
    external: Mutex<BTreeMap<ObjectKey, Resource>>,
    /// Stored policies this node cannot use (undecodable, or refused by the compiler), with
    /// why; each keeps enforcing its last good version, if it had one, across resyncs (see
    /// [`PolicyEngine::unusable_policies`]). Locked after `state`.
    unusable: Mutex<BTreeMap<PolicyKey, String>>,
    /// Locked through [`PolicyEngine::lock`] only, which keeps `generation` true.
    state: Mutex<Incremental>,
    /// The model's revision ([`PolicySet::revision`] of `state`'s set), published by every
    /// release of `state`: see [`PolicyEngine::generation`].
    generation: AtomicU64,
    applies: AtomicU64,
    full_applies: AtomicU64,
}

/// The engine's state, locked: on release it publishes the model's revision as the engine's
/// generation, so no change of the model (policies, staged policies, endpoints, namespaces),
/// whichever method makes it, leaves the generation behind. Released before the lock itself.
struct Locked<'a> {
    inc: MutexGuard<'a, Incremental>,
    generation: &'a AtomicU64,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Incremental;
    fn deref(&self) -> &Incremental {
        &self.inc
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Incremental {
        &mut self.inc
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.generation
            .store(self.inc.policy_set().revision(), Ordering::Release);
    }
}

/// Identity of a policy-relevant object: kind, namespace, name.
pub type ObjectKey = (Kind, Option<String>, String);

fn object_key(r: &Resource) -> ObjectKey {
    (
        r.kind(),
        r.namespace().map(str::to_string),
        r.name().to_string(),
    )
}

/// Loads every policy, namespace and endpoint; a stored object that does not parse or
/// validate is skipped with a warning (it must not block enforcement of the others).
pub fn load_policy_set(store: &dyn Store) -> Result<PolicySet, PolicyAgentError> {
    load_policy_set_reporting(store).map(|(set, _)| set)
}

/// As [`load_policy_set`], and also the policies that were skipped, with why: the caller
/// keeps their last good version (see [`PolicyEngine::resync`]).
pub fn load_policy_set_reporting(
    store: &dyn Store,
) -> Result<(PolicySet, BTreeMap<PolicyKey, String>), PolicyAgentError> {
    load_sources(store, None, "")
}

/// Where an event or a stored object came from: the datastore, or the node-local store of
/// this node's endpoint records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Datastore,
    Local,
}

/// Whether an object of the datastore is left out because the node-local store has it: an
/// endpoint of this node, when there is such a store.
fn shadowed(local: bool, node: &str, kind: Kind, name: &str) -> bool {
    local
        && kind == Kind::WorkloadEndpoint
        && crate::endpoints::endpoint_name_node(name).as_deref() == Some(node)
}

/// [`load_policy_set_reporting`], with this node's endpoints from `local` when given.
fn load_sources(
    store: &dyn Store,
    local: Option<&dyn Store>,
    node: &str,
) -> Result<(PolicySet, BTreeMap<PolicyKey, String>), PolicyAgentError> {
    let mut set = PolicySet::new();
    let mut unusable = BTreeMap::new();
    // Namespaces first so their labels exist when anything else is evaluated.
    for kind in [
        Kind::Namespace,
        Kind::WorkloadEndpoint,
        Kind::K8sNetworkPolicy,
        Kind::NetworkPolicy,
        Kind::GlobalNetworkPolicy,
        Kind::StagedNetworkPolicy,
        Kind::StagedGlobalNetworkPolicy,
        Kind::StagedKubernetesNetworkPolicy,
    ] {
        let prefix = keys::resource_prefix(kind.as_str());
        let read = |s: &dyn Store| {
            s.range(&prefix).map_err(|e| PolicyAgentError::Store {
                what: format!("{} objects", kind.as_str()),
                source: e,
            })
        };
        let (mut kvs, _) = read(store)?;
        kvs.retain(|kv| {
            !parse_key(&kv.key)
                .is_some_and(|(k, _, name)| shadowed(local.is_some(), node, k, &name))
        });
        if let (Some(l), Kind::WorkloadEndpoint) = (local, kind) {
            kvs.extend(read(l)?.0);
        }
        for kv in kvs {
            let why = match Resource::from_stored(&kv.value) {
                Ok(r) => match set.apply(&r) {
                    Ok(()) => continue,
                    Err(e) => e.to_string(),
                },
                Err(e) => format!("unreadable: {e}"),
            };
            log::warn!("policy: skipping {}: {why}", kv.key);
            if let Some(key) = policy_key_of(&kv.key) {
                unusable.insert(key, why);
            }
        }
    }
    Ok((set, unusable))
}

/// The policy a store key names, when it names one.
fn policy_key_of(key: &str) -> Option<PolicyKey> {
    let (kind, namespace, name) = parse_key(key)?;
    matches!(
        kind,
        Kind::K8sNetworkPolicy | Kind::NetworkPolicy | Kind::GlobalNetworkPolicy
    )
    .then_some(PolicyKey {
        kind,
        namespace,
        name,
    })
}

/// The kind, namespace and name a resource key names, for the kinds policy cares about.
pub fn parse_key(key: &str) -> Option<(Kind, Option<String>, String)> {
    for kind in KINDS {
        let Some(rest) = key.strip_prefix(&keys::resource_prefix(kind.as_str())) else {
            continue;
        };
        return Some(match rest.split_once('/') {
            Some((ns, name)) if kind.namespaced() => (kind, Some(ns.to_string()), name.to_string()),
            _ => (kind, None, rest.to_string()),
        });
    }
    None
}

/// The policy engine's view of an endpoint being added on this node.
pub fn local_endpoint(ep: &crate::endpoints::Endpoint) -> Endpoint {
    Endpoint {
        namespace: ep.namespace(),
        name: ep.name(),
        node: ep.node.clone(),
        interface: ep.host_ifname.clone(),
        labels: std::sync::Arc::new(ep.labels.clone()),
        ips: ep.ip_networks.iter().map(|n| n.addr()).collect(),
        ports: ep.ports.clone(),
    }
}

impl PolicyEngine {
    /// Reads the cluster's policy state for `node`; nothing is applied yet (see
    /// [`PolicyEngine::resync`]), so the table already in the kernel keeps enforcing.
    pub fn load(store: Arc<dyn Store>, node: &str) -> Result<PolicyEngine, PolicyAgentError> {
        Self::load_with(store, None, node)
    }

    /// As [`PolicyEngine::load`], with this node's endpoints read from `local` (its endpoint
    /// store, when that is not the datastore) instead of from `store`.
    pub fn load_with(
        store: Arc<dyn Store>,
        local: Option<Arc<dyn Store>>,
        node: &str,
    ) -> Result<PolicyEngine, PolicyAgentError> {
        let (set, unusable) = load_sources(&*store, local.as_deref(), node)?;
        Ok(PolicyEngine {
            store,
            local,
            external: Mutex::new(BTreeMap::new()),
            unusable: Mutex::new(unusable),
            generation: AtomicU64::new(set.revision()),
            state: Mutex::new(Incremental::new(node, set)),
            applies: AtomicU64::new(0),
            full_applies: AtomicU64::new(0),
        })
    }

    /// The state, locked (every use of `state` goes through here).
    fn lock(&self) -> Locked<'_> {
        Locked {
            inc: self.state.lock().unwrap(),
            generation: &self.generation,
        }
    }

    /// The policy model's generation now, read without the lock: the [`PolicySet::revision`]
    /// of the set [`PolicyEngine::with_policy_set`] would show, as of the last release of
    /// the lock. It moves with every change of the model; what was computed from the model
    /// at one generation (a flow record's cause) holds while it does not move.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The stored policies this node cannot use and why (each still enforces its last good
    /// version if it had one). For `/readiness`: a non-empty list means the node does not
    /// enforce what the store says.
    pub fn unusable_policies(&self) -> Vec<(String, String)> {
        let u = self.unusable.lock().unwrap();
        u.iter()
            .map(|(k, why)| (k.to_string(), why.clone()))
            .collect()
    }

    /// Number of changes applied to the kernel (full resyncs and deltas).
    pub fn applies(&self) -> u64 {
        self.applies.load(Ordering::Relaxed)
    }

    /// Number of full resyncs applied.
    pub fn full_applies(&self) -> u64 {
        self.full_applies.load(Ordering::Relaxed)
    }

    /// What the staged policies would decide for one direction of a flow, when it differs
    /// from what is enforced ([`PolicySet::pending`]): a flow record's `pending`.
    pub fn pending(
        &self,
        flow: &tern_policy::Flow,
        dir: tern_policy::Direction,
    ) -> Option<tern_api::flow::FlowPending> {
        self.lock().policy_set().pending(flow, dir)
    }

    /// Turns flow records on (the NFLOG group the rules log to) or off; the next apply
    /// carries the change, and every resync keeps it.
    pub fn set_flow_log(&self, log: Option<tern_policy::FlowLog>) {
        self.lock().set_flow_log(log);
    }

    /// Runs `f` over the policy model as it is now (flow records resolve against it).
    pub fn with_policy_set<R>(&self, f: impl FnOnce(&PolicySet) -> R) -> R {
        f(self.lock().policy_set())
    }

    /// The desired table as it is now (diagnostics, tests).
    pub fn desired(&self) -> Ruleset {
        self.lock().desired()
    }

    fn count(&self, how: Applied) {
        if how != Applied::Nothing {
            self.applies.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(how, Applied::Full | Applied::Nft { full: true }) {
            self.full_applies.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Applies `s` through `nft -f` (tests compare it with what netlink builds).
    #[cfg(test)]
    fn run(&self, inc: &mut Incremental, s: &Script) -> Result<(), PolicyAgentError> {
        let how = run_script(inc, s)?;
        self.count(how);
        Ok(())
    }

    fn flush(&self, inc: &mut Incremental) -> Result<(), PolicyAgentError> {
        let how = apply_pending(inc)?;
        self.count(how);
        Ok(())
    }

    /// Re-reads everything from the store and replaces the table in one transaction (one
    /// netlink batch).
    ///
    /// A stored policy that cannot be used keeps the version enforced now (its last good
    /// one), so a resync or an upgrade never switches a policy's protection off; it is
    /// listed in [`PolicyEngine::unusable_policies`].
    pub fn resync(&self) -> Result<(), PolicyAgentError> {
        let node = self.lock().node().to_string();
        let (mut set, unusable) = load_sources(&*self.store, self.local.as_deref(), &node)?;
        let external = self.external.lock().unwrap();
        for (k, r) in external.iter() {
            if let Err(e) = set.apply(r) {
                log::warn!("policy: skipping {k:?}: {e}");
            }
        }
        let mut inc = self.lock();
        for (key, why) in &unusable {
            if set.policy(key).is_none()
                && let Some(ir) = inc.policy_set().policy(key)
            {
                log::warn!("policy: keeping the last good version of {key} ({why})");
                set.keep_policy(ir.clone());
            }
        }
        *self.unusable.lock().unwrap() = unusable;
        let node = inc.node().to_string();
        // natOutgoing's part comes from the dataplane, not from this store read: keep it.
        let extra = inc.extra().clone();
        let mut next = Incremental::with_flow_log(&node, set, inc.flow_log());
        next.set_extra(extra);
        // A fresh state does not know the kernel's: its first apply is the full resync.
        *inc = next;
        self.flush(&mut inc)
    }

    /// Puts a local endpoint's rules into the kernel now (called by ADD before the pod gets
    /// its addresses and routes).
    pub fn endpoint_added(&self, ep: Endpoint) -> Result<(), PolicyAgentError> {
        let mut inc = self.lock();
        inc.upsert_endpoint(ep);
        self.flush(&mut inc)
    }

    /// Removes an endpoint's rules and set elements (DEL).
    pub fn endpoint_removed(&self, namespace: &str, name: &str) -> Result<(), PolicyAgentError> {
        let mut inc = self.lock();
        if !inc.remove_endpoint(namespace, name) {
            return Ok(());
        }
        self.flush(&mut inc)
    }

    /// Replaces natOutgoing's chains and sets in the shared table.
    pub fn set_nat(&self, nat: Ruleset) -> Result<(), PolicyAgentError> {
        let mut inc = self.lock();
        inc.set_extra(nat);
        self.flush(&mut inc)
    }

    /// Replaces every external object of `kinds` by `objects` (a source's full list) in one
    /// transaction; with `flush` false only the desired state changes (before the first
    /// apply, so the table left by the previous agent keeps enforcing until then).
    pub fn external_replace(
        &self,
        kinds: &[Kind],
        objects: Vec<Resource>,
        flush: bool,
    ) -> Result<(), PolicyAgentError> {
        let mut external = self.external.lock().unwrap();
        let mut inc = self.lock();
        let gone: Vec<ObjectKey> = external
            .keys()
            .filter(|k| kinds.contains(&k.0))
            .cloned()
            .collect();
        let fresh: BTreeMap<ObjectKey, Resource> =
            objects.into_iter().map(|r| (object_key(&r), r)).collect();
        for k in gone {
            if !fresh.contains_key(&k) {
                external.remove(&k);
                inc.remove(k.0, k.1.as_deref(), &k.2);
            }
        }
        for (k, r) in fresh {
            if external.get(&k) == Some(&r) {
                continue;
            }
            if let Err(e) = inc.apply(&r) {
                log::warn!("policy: ignoring {k:?}: {e}");
            }
            external.insert(k, r);
        }
        if flush {
            self.flush(&mut inc)?;
        }
        Ok(())
    }

    /// Adds or replaces one external object.
    pub fn external_apply(&self, r: Resource) -> Result<(), PolicyAgentError> {
        let t0 = Instant::now();
        let mut external = self.external.lock().unwrap();
        let k = object_key(&r);
        if external.get(&k) == Some(&r) {
            return Ok(());
        }
        let mut inc = self.lock();
        let locked = t0.elapsed();
        if let Err(e) = inc.apply(&r) {
            log::warn!("policy: ignoring {k:?}: {e}");
        }
        external.insert(k.clone(), r);
        let compiled = t0.elapsed();
        let how = apply_pending(&mut inc);
        log_apply(&k, t0, locked, compiled, &how);
        let how = how?;
        self.count(how);
        Ok(())
    }

    /// Removes one external object.
    pub fn external_remove(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), PolicyAgentError> {
        let mut external = self.external.lock().unwrap();
        let k = (kind, namespace.map(str::to_string), name.to_string());
        if external.remove(&k).is_none() {
            return Ok(());
        }
        let mut inc = self.lock();
        inc.remove(kind, namespace, name);
        self.flush(&mut inc)
    }

    /// The external objects held now (the Kubernetes source snapshots them to disk).
    pub fn external_objects(&self) -> Vec<Resource> {
        self.external.lock().unwrap().values().cloned().collect()
    }

    /// Applies a batch of store events in one transaction.
    pub fn handle_events(&self, events: &[tern_store::Event]) -> Result<usize, PolicyAgentError> {
        self.handle_events_from(events, Source::Datastore)
    }

    fn handle_events_from(
        &self,
        events: &[tern_store::Event],
        source: Source,
    ) -> Result<usize, PolicyAgentError> {
        let external = self.external.lock().unwrap();
        let mut inc = self.lock();
        let node = inc.node().to_string();
        let mut n = 0;
        for ev in events {
            let Some((kind, ns, name)) = parse_key(&ev.kv.key) else {
                continue;
            };
            if source == Source::Datastore && shadowed(self.local.is_some(), &node, kind, &name) {
                continue;
            }
            n += 1;
            // An unusable update leaves the previous version in force (`inc` is unchanged).
            let unusable = match ev.kind {
                EventKind::Put => match Resource::from_stored(&ev.kv.value) {
                    Ok(r) => inc.apply(&r).err().map(|e| e.to_string()),
                    Err(e) => Some(format!("unreadable: {e}")),
                },
                EventKind::Delete => {
                    inc.remove(kind, ns.as_deref(), &name);
                    None
                }
            };
            if let Some(why) = &unusable {
                log::warn!(
                    "policy: ignoring {} (keeping its last good version): {why}",
                    ev.kv.key
                );
            }
            if let Some(key) = policy_key_of(&ev.kv.key) {
                let mut u = self.unusable.lock().unwrap();
                match unusable {
                    Some(why) => u.insert(key, why),
                    None => u.remove(&key),
                };
            }
            // An external object of the same identity wins over the store's.
            if let Some(r) = external.get(&(kind, ns.clone(), name.clone()))
                && let Err(e) = inc.apply(r)
            {
                log::warn!("policy: ignoring external {}: {e}", ev.kv.key);
            }
        }
        if n > 0 {
            self.flush(&mut inc)?;
        }
        Ok(n)
    }

    /// Starts the watch thread (in the caller's network namespace); stops when `stop` is set.
    /// A lost watch is re-established after a full resync, so missed events cannot leave the
    /// table stale.
    pub fn spawn_watch(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
        let me = self.clone();
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("policy-watch".into())
            .spawn(move || me.watch_loop(&stop, Source::Datastore))?;
        if self.local.is_some() {
            let me = self.clone();
            std::thread::Builder::new()
                .name("policy-watch-local".into())
                .spawn(move || me.watch_loop(&stop2, Source::Local))?;
        }
        Ok(())
    }

    fn watch_loop(&self, stop: &AtomicBool, source: Source) {
        let (store, kinds): (&Arc<dyn Store>, &[Kind]) = match (source, &self.local) {
            (Source::Local, Some(l)) => (l, &[Kind::WorkloadEndpoint]),
            _ => (&self.store, &KINDS),
        };
        let mut watch: Option<Box<dyn tern_store::Watch>> = None;
        while !stop.load(Ordering::Relaxed) {
            let w = match watch.as_mut() {
                Some(w) => w,
                None => {
                    let started = store.revision().and_then(|rev| {
                        let prefixes: Vec<String> = kinds
                            .iter()
                            .map(|k| keys::resource_prefix(k.as_str()))
                            .collect();
                        let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
                        Ok((rev, store.watch_prefixes(&prefixes, rev)?))
                    });
                    match started {
                        Ok((_, w)) => {
                            // Covers whatever happened before the watch started.
                            if let Err(e) = self.resync() {
                                log::warn!("policy: {e}");
                            }
                            watch.insert(w)
                        }
                        Err(e) => {
                            log::debug!("policy watch: {e}");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    }
                }
            };
            match w.next_events(Duration::from_millis(500)) {
                Ok(ev) if ev.is_empty() => {}
                Ok(mut ev) => {
                    // Gather the rest of a burst briefly so it becomes one transaction.
                    let start = Instant::now();
                    while start.elapsed() < Duration::from_millis(20) {
                        match w.next_events(Duration::from_millis(2)) {
                            Ok(more) if more.is_empty() => break,
                            Ok(more) => ev.extend(more),
                            Err(_) => break,
                        }
                    }
                    if let Err(e) = self.handle_events_from(&ev, source) {
                        log::warn!("policy: {e}");
                    }
                }
                Err(e) => {
                    log::debug!("policy watch ended: {e}; re-watching");
                    watch = None;
                }
            }
        }
    }
}

/// natOutgoing's chains go into the engine's table ([`PolicyEngine::set_nat`]).
impl crate::nat::NatTable for PolicyEngine {
    fn replace_nat(&self, nat: Ruleset) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(self.set_nat(nat)?)
    }
}

/// The Kubernetes source's namespaces and policies go into the engine's external objects.
impl crate::external::ExternalObjects for PolicyEngine {
    fn replace(
        &self,
        kinds: &[Kind],
        objects: Vec<Resource>,
        flush: bool,
    ) -> Result<(), crate::external::ExternalError> {
        Ok(self.external_replace(kinds, objects, flush)?)
    }

    fn apply(&self, r: Resource) -> Result<(), crate::external::ExternalError> {
        Ok(self.external_apply(r)?)
    }

    fn remove(
        &self,
        kind: Kind,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), crate::external::ExternalError> {
        Ok(self.external_remove(kind, namespace, name)?)
    }

    fn objects(&self) -> Vec<Resource> {
        self.external_objects()
    }

    fn objects_json(&self) -> serde_json::Result<Vec<u8>> {
        let external = self.external.lock().unwrap();
        serde_json::to_vec(&external.values().collect::<Vec<&Resource>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_kind_namespace_and_name() {
        let k = keys::namespaced_resource("KubernetesNetworkPolicy", "x", "deny-all");
        assert_eq!(
            parse_key(&k),
            Some((Kind::K8sNetworkPolicy, Some("x".into()), "deny-all".into()))
        );
        let k = keys::resource("GlobalNetworkPolicy", "g1");
        assert_eq!(
            parse_key(&k),
            Some((Kind::GlobalNetworkPolicy, None, "g1".into()))
        );
        let k = keys::resource("Namespace", "y");
        assert_eq!(parse_key(&k), Some((Kind::Namespace, None, "y".into())));
        assert_eq!(parse_key(&keys::resource("IPPool", "p")), None);
    }

    /// Staged policies are read from the store with the others and kept in the policy set:
    /// `pending` sees them, the desired table does not.
    #[test]
    fn staged_policies_are_loaded_and_pending_never_compiled() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let docs = "apiVersion: tern.dev/v1\nkind: WorkloadEndpoint\nmetadata: {name: n1-k8s-web-eth0, namespace: x, labels: {app: web}}\nspec: {node: n1, pod: web, orchestrator: k8s, interfaceName: ternweb, ipNetworks: [10.0.1.5/32]}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress: [{ports: [{port: 80}]}]\n";
        for r in tern_model::parse_documents(docs, "t.yaml").unwrap() {
            tern_model::put_resource(&*store, &r).unwrap();
        }
        let before = PolicyEngine::load(store.clone(), "n1").unwrap().desired();
        let put = |yaml: &str| {
            for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
                tern_model::put_resource(&*store, &r).unwrap();
            }
        };
        let flow = |protocol, dst_port| tern_policy::Flow {
            src: "192.0.2.1".parse().unwrap(),
            dst: "10.0.1.5".parse().unwrap(),
            protocol,
            dst_port,
            icmp: None,
        };
        let ingress = tern_policy::Direction::Ingress;
        // A staged Delete of web: 81/TCP, denied by web's default deny, would meet no policy.
        put(
            "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: web, namespace: x}\nspec: {stagedAction: Delete}\n",
        );
        let engine = PolicyEngine::load(store.clone(), "n1").unwrap();
        assert_eq!(
            engine.desired(),
            before,
            "a staged policy reached the table"
        );
        let p = engine
            .pending(&flow(tern_model::Protocol::Tcp, 81), ingress)
            .unwrap();
        assert_eq!(p.verdict, tern_api::flow::FlowVerdict::Allowed);
        assert_eq!(p.reason, tern_api::flow::FlowReason::NoPolicy);
        // A staged global deny of UDP: its rule, named by its staged kind.
        put(
            "apiVersion: tern.dev/v1\nkind: StagedGlobalNetworkPolicy\nmetadata: {name: deny}\nspec: {order: 1, selector: all(), ingress: [{action: Deny, protocol: UDP}]}\n",
        );
        let engine = PolicyEngine::load(store.clone(), "n1").unwrap();
        assert_eq!(
            engine.desired(),
            before,
            "a staged policy reached the table"
        );
        assert_eq!(engine.with_policy_set(|s| s.staged().count()), 2);
        let p = engine
            .pending(&flow(tern_model::Protocol::Udp, 53), ingress)
            .unwrap();
        assert_eq!(p.verdict, tern_api::flow::FlowVerdict::Denied);
        assert_eq!(p.policies[0].kind, "StagedGlobalNetworkPolicy");
        assert_eq!(p.policies[0].rule.as_deref(), Some("ingress[0]"));
        assert_eq!(
            parse_key(&keys::resource("StagedGlobalNetworkPolicy", "deny")),
            Some((Kind::StagedGlobalNetworkPolicy, None, "deny".into()))
        );
    }

    /// The engine's generation is the model's revision after every change, whichever method
    /// made it, and only moves when the model does (flow records cache on it).
    #[test]
    fn the_generation_follows_every_change_of_the_model() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let engine = PolicyEngine::load(store.clone(), "n1").unwrap();
        let now = || {
            (
                engine.generation(),
                engine.with_policy_set(|s| s.revision()),
            )
        };
        let (g0, r0) = now();
        assert_eq!(g0, r0);
        let docs = |yaml: &str| tern_model::parse_documents(yaml, "t.yaml").unwrap();
        let wep = docs(
            "apiVersion: tern.dev/v1\nkind: WorkloadEndpoint\nmetadata: {name: n2-k8s-web-eth0, namespace: x, labels: {app: web}}\nspec: {node: n2, pod: web, orchestrator: k8s, interfaceName: ternweb, ipNetworks: [10.0.1.5/32]}\n",
        );
        let pol = docs(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress: [{ports: [{port: 80}]}]\n",
        );
        // Changes that reach no kernel (no flush): external objects, then a store event.
        engine
            .external_replace(&[Kind::WorkloadEndpoint], wep.clone(), false)
            .unwrap();
        let (g1, r1) = now();
        assert_eq!(g1, r1);
        assert_ne!(g1, g0, "an endpoint added");
        assert!(
            engine.with_policy_set(|s| s.endpoint_by_ip("10.0.1.5".parse().unwrap()).is_some())
        );
        engine
            .external_replace(&[Kind::WorkloadEndpoint], wep, false)
            .unwrap();
        assert_eq!(now(), (g1, g1), "the same object again changes nothing");
        engine
            .external_replace(&[Kind::K8sNetworkPolicy], pol, false)
            .unwrap();
        let (g2, r2) = now();
        assert_eq!(g2, r2);
        assert_ne!(g2, g1, "a policy added");
        engine
            .external_replace(&[Kind::K8sNetworkPolicy], Vec::new(), false)
            .unwrap();
        let (g3, r3) = now();
        assert_eq!(g3, r3);
        assert!(g3 != g2 && g3 != g1, "a policy removed: a fresh generation");
        let _ = (engine.desired(), engine.unusable_policies());
        assert_eq!(now(), (g3, g3), "reads keep it");
    }

    /// Runs `f` on a thread of its own (named after the test, so tern-testkit's skip or failure
    /// names it) inside a network namespace of that thread's own, never the machine's: nft and
    /// netlink act there only. Without one (not root) the test fails saying so.
    fn in_private_netns(f: fn()) {
        let t = tern_testkit::thread_for_test().spawn(move || {
            // Only this dedicated thread (and processes it spawns) changes namespace.
            let entered = tern_linux::netns::unshare_net();
            let why = match &entered {
                Ok(()) => String::new(),
                Err(e) => format!("{e}; run as root"),
            };
            tern_testkit::need("a private network namespace (root)", entered.is_ok(), why);
            f();
        });
        t.unwrap().join().unwrap();
    }

    /// The kernel's `inet tern` table, as `nft list table` prints it.
    fn table() -> String {
        tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap()
    }

    /// `nft list chain inet tern <chain>`: its status says whether the chain exists.
    fn list_chain(chain: &str) -> std::process::Output {
        std::process::Command::new("nft")
            .args(["list", "chain", "inet", "tern", chain])
            .output()
            .unwrap()
    }

    #[test]
    fn this_nodes_endpoints_come_from_its_local_store_on_a_derived_datastore() {
        in_private_netns(derived_endpoints_in_private_netns);
    }

    /// A WorkloadEndpoint document (`labels` as YAML flow mapping).
    fn wep(name: &str, node: &str, labels: &str, ifname: &str, ip: &str) -> (String, Vec<u8>) {
        let yaml = format!(
            "apiVersion: tern.dev/v1\nkind: WorkloadEndpoint\nmetadata: {{name: {name}, namespace: x, labels: {labels}}}\nspec: {{node: {node}, pod: {name}, orchestrator: k8s, interfaceName: {ifname}, ipNetworks: [{ip}/32]}}\n"
        );
        let r = tern_model::parse_documents(&yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let key = tern_model::resource_key(Kind::WorkloadEndpoint, Some("x"), name);
        (key, r.to_json().into_bytes())
    }

    /// On a datastore that derives endpoints from Pods (the Kubernetes datastore): this
    /// node's endpoints are its local records (the derived copy of one of them, with other
    /// labels, is ignored, at load and in events), other nodes' are the derived ones.
    fn derived_endpoints_in_private_netns() {
        let inner: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let main: Arc<dyn Store> = tern_store::testing::kube_like(inner.clone());
        let local: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        // The Pods as the datastore derives them: this node's web (stale labels) and n2's db.
        let (k, v) = wep(
            "n1-k8s-web-eth0",
            "n1",
            "{app: stale}",
            "ternweb",
            "10.0.1.5",
        );
        inner.put(&k, &v).unwrap();
        let (k, v) = wep("n2-k8s-db-eth0", "n2", "{app: db}", "terndb", "10.0.2.5");
        inner.put(&k, &v).unwrap();
        let (k, v) = wep("n1-k8s-web-eth0", "n1", "{app: web}", "ternweb", "10.0.1.5");
        local.put(&k, &v).unwrap();
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]\n";
        let r = tern_model::parse_documents(yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let key = tern_model::resource_key(Kind::K8sNetworkPolicy, Some("x"), "web");
        inner.put(&key, r.to_json().as_bytes()).unwrap();
        let engine = PolicyEngine::load_with(main.clone(), Some(local.clone()), "n1").unwrap();
        engine.resync().unwrap();
        let desired = format!("{:?}", engine.desired());
        assert!(
            desired.contains("ternweb") && desired.contains("10.0.2.5"),
            "web (app: web, from the local store) is selected, db's address allowed: {desired}"
        );
        // A derived update of this node's endpoint is not this node's record: ignored.
        let event = |kv: (String, Vec<u8>)| tern_store::Event {
            kind: EventKind::Put,
            kv: tern_store::KeyValue {
                key: kv.0,
                value: kv.1,
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                lease: 0,
            },
        };
        let stale = wep(
            "n1-k8s-web-eth0",
            "n1",
            "{app: other}",
            "ternweb",
            "10.0.1.5",
        );
        assert_eq!(engine.handle_events(&[event(stale)]).unwrap(), 0);
        assert_eq!(format!("{:?}", engine.desired()), desired);
        // The local record's change is applied: web is no longer selected.
        let relabelled = wep(
            "n1-k8s-web-eth0",
            "n1",
            "{app: other}",
            "ternweb",
            "10.0.1.5",
        );
        assert_eq!(
            engine
                .handle_events_from(&[event(relabelled)], Source::Local)
                .unwrap(),
            1
        );
        let after = engine.desired();
        assert!(
            after.sets["ep-in"].elements.is_empty() && !format!("{after:?}").contains("ternweb"),
            "{after:?}"
        );
    }

    #[test]
    fn store_events_update_the_desired_table() {
        in_private_netns(events_in_private_netns);
    }

    #[test]
    fn big_and_pre_existing_policies_are_enforced_and_kept() {
        in_private_netns(big_policies_in_private_netns);
    }

    /// F1: a Kubernetes policy the API server accepts (65 peers, 300 except CIDRs) is
    /// enforced; a tern policy stored over a write-time count limit (1001 rules, written
    /// before the limit existed) is enforced and survives a resync; an unusable update keeps
    /// the last good version across resyncs and is reported.
    fn big_policies_in_private_netns() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        // A pod of this node that both policies select (only such policies are compiled).
        let (k, v) = wep("w1", "n1", "{app: w}", "ternw1", "198.18.0.9");
        store.put(&k, &v).unwrap();
        let peers: Vec<String> = (0..64)
            .map(|i| format!("{{podSelector: {{matchLabels: {{app: a{i}}}}}}}"))
            .collect();
        let except: Vec<String> = (0..300)
            .map(|i| format!("10.{}.{}.0/24", i / 100, (i % 100) * 2))
            .collect();
        let k8s = format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: big, namespace: x}}\nspec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n  - from: [{}, {{ipBlock: {{cidr: 10.0.0.0/8, except: [{}]}}}}]\n",
            peers.join(", "),
            except.join(", ")
        );
        let k8s = tern_model::parse_documents(&k8s, "k.yaml")
            .unwrap()
            .remove(0);
        tern_model::put_resource(&*store, &k8s).unwrap();
        // Over MAX_RULES_PER_DIRECTION: put_resource refuses it, so written as an older
        // version (or anyone with store access) would have.
        let rules: Vec<String> = (0..=tern_model::limits::MAX_RULES_PER_DIRECTION)
            .map(|i| {
                format!(
                    "{{\"action\":\"Allow\",\"source\":{{\"nets\":[\"198.19.{}.{}/32\"]}}}}",
                    i / 250,
                    i % 250
                )
            })
            .collect();
        let gnp = |sel: &str| {
            format!(
                "{{\"apiVersion\":\"tern.dev/v1\",\"kind\":\"GlobalNetworkPolicy\",\"metadata\":{{\"name\":\"old\",\"labels\":{{\"team\":\"{}\"}}}},\"spec\":{{\"selector\":\"{sel}\",\"ingress\":[{}]}}}}",
                "x".repeat(100),
                rules.join(",")
            )
        };
        let gkey = keys::resource("GlobalNetworkPolicy", "old");
        assert!(tern_model::Resource::from_stored(gnp("all()").as_bytes()).is_ok());
        store.put(&gkey, gnp("all()").as_bytes()).unwrap();
        let engine = PolicyEngine::load(store.clone(), "n1").unwrap();
        engine.resync().unwrap();
        let gp = PolicyKey {
            kind: Kind::GlobalNetworkPolicy,
            namespace: None,
            name: "old".into(),
        };
        let kp = PolicyKey {
            kind: Kind::K8sNetworkPolicy,
            namespace: Some("x".into()),
            name: "big".into(),
        };
        let rules_of = |k: &PolicyKey| {
            let inc = engine.lock();
            inc.policy_set()
                .policy(k)
                .and_then(|p| p.ingress.as_ref().map(Vec::len))
        };
        assert_eq!(rules_of(&kp), Some(65));
        assert_eq!(rules_of(&gp), Some(1001));
        assert!(engine.unusable_policies().is_empty());
        let listing = table();
        assert!(
            listing.contains("10.2.198.0/24"),
            "the except list is in the kernel"
        );
        assert!(listing.contains("198.19.4.0"), "rule 1000 is in the kernel");
        // An unusable update (a selector nested past the limit): the last good version stays,
        // through the event and through later resyncs, and is reported.
        let bad = gnp(&format!("{}all(){}", "(".repeat(40), ")".repeat(40)));
        store.put(&gkey, bad.as_bytes()).unwrap();
        let ev = tern_store::Event {
            kind: EventKind::Put,
            kv: tern_store::KeyValue {
                key: gkey.clone(),
                value: bad.into_bytes(),
                create_revision: 1,
                mod_revision: 2,
                version: 2,
                lease: 0,
            },
        };
        engine.handle_events(&[ev]).unwrap();
        assert_eq!(rules_of(&gp), Some(1001));
        for _ in 0..2 {
            engine.resync().unwrap();
            assert_eq!(rules_of(&gp), Some(1001));
            let u = engine.unusable_policies();
            assert_eq!(u.len(), 1, "{u:?}");
            assert!(u[0].1.contains("nests deeper"), "{u:?}");
        }
        let listing = table();
        assert!(
            listing.contains("198.19.4.0"),
            "still enforced after resyncs"
        );
        // Restart (a fresh engine): there is no last good version to keep; it is reported.
        let fresh = PolicyEngine::load(store, "n1").unwrap();
        assert_eq!(fresh.unusable_policies().len(), 1);
    }

    #[test]
    fn element_and_endpoint_chain_deltas_go_over_netlink() {
        in_private_netns(netlink_in_private_netns);
    }

    fn netlink_in_private_netns() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let engine = PolicyEngine::load(store, "n1").unwrap();
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-b, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}\n";
        let r = tern_model::parse_documents(yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let mut inc = engine.lock();
        inc.apply(&r).unwrap();
        engine.flush(&mut inc).unwrap();
        let remote = |ip: &str, pod: &str| Endpoint {
            namespace: "x".into(),
            name: format!("b-{ip}"),
            node: "n2".into(),
            interface: String::new(),
            labels: BTreeMap::from([("pod".to_string(), pod.to_string())]).into(),
            ips: vec![ip.parse().unwrap()],
            ports: Vec::new(),
        };
        let local = |n: u8| Endpoint {
            node: "n1".into(),
            interface: format!("ternlocal{n}"),
            name: format!("local{n}"),
            ..remote(&format!("198.18.0.{}", 10 + n), "b")
        };
        // The policy selects no pod of this node: it is not compiled, so a remote pod its
        // source selector matches changes nothing.
        inc.upsert_endpoint(remote("198.18.0.4", "b"));
        assert_eq!(inc.pending(), 0);
        // The first filtered local pod brings the policy's chain and source set and adds the
        // conntrack rules to the base chain: one batch too.
        inc.upsert_endpoint(local(1));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let listing = table();
        assert!(listing.contains("198.18.0.4"), "{listing}");
        // A remote pod joins the source set: applied without nft, and the kernel has it.
        inc.upsert_endpoint(remote("198.18.0.5", "b"));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        assert_eq!(inc.pending(), 0);
        let listing = table();
        assert!(listing.contains("198.18.0.5"), "{listing}");
        // It leaves (label change): removed the same way.
        inc.upsert_endpoint(remote("198.18.0.5", "c"));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let listing = table();
        assert!(!listing.contains("198.18.0.5"), "{listing}");
        // The next one only brings its own chain, map entry and set elements: netlink.
        inc.upsert_endpoint(local(2));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let chain = || list_chain("ep-in-ternlocal2");
        let by_netlink = chain();
        assert!(by_netlink.status.success());
        let listing = table();
        assert!(
            listing.contains("\"ternlocal2\" : jump ep-in-ternlocal2"),
            "{listing}"
        );
        // What netlink built is what nft builds from the same desired table.
        let full = inc.full_script();
        engine.run(&mut inc, &full).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&chain().stdout),
            String::from_utf8_lossy(&by_netlink.stdout)
        );
        // It goes away the same way: map entry and chain gone.
        inc.remove_endpoint("x", "local2");
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        assert!(!chain().status.success(), "the chain was deleted");
        // An allow-only CIDR policy gives local1 a fast-path set (declared in the same
        // batch). A pod with the same policies shares that set, so its chain, with the set
        // lookup, goes over netlink and equals what nft builds.
        let cidr = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-net, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - ipBlock: {cidr: 198.19.0.0/16}\n    ports:\n    - {port: 80, protocol: TCP}\n";
        let r = tern_model::parse_documents(cidr, "t.yaml")
            .unwrap()
            .remove(0);
        inc.apply(&r).unwrap();
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        inc.upsert_endpoint(local(3));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let chain3 = || list_chain("ep-in-ternlocal3");
        let by_netlink = String::from_utf8_lossy(&chain3().stdout).into_owned();
        assert!(
            by_netlink.contains("ip saddr . meta l4proto . th dport @fp-in-"),
            "{by_netlink}"
        );
        let full = inc.full_script();
        engine.run(&mut inc, &full).unwrap();
        assert_eq!(String::from_utf8_lossy(&chain3().stdout), by_netlink);
        // Drift (the set vanished behind the agent's back): the netlink batch fails, nothing
        // is committed, and flush repairs it through nft and a full resync.
        tern_linux::nft::apply("delete table inet tern\n").unwrap();
        inc.upsert_endpoint(remote("198.18.0.7", "b"));
        assert_eq!(apply_netlink(&mut inc), None);
        assert!(inc.pending() > 0);
        let fulls = engine.full_applies();
        engine.flush(&mut inc).unwrap();
        assert_eq!(engine.full_applies(), fulls + 1);
        let listing = table();
        assert!(listing.contains("198.18.0.7"), "{listing}");
    }

    #[test]
    fn policy_activation_and_deactivation_are_one_netlink_batch_each() {
        in_private_netns(activation_in_private_netns);
    }

    /// The table as `nft -j` lists it, handles removed and elements sorted: comparable
    /// between a table built over netlink and one built by `nft -f`.
    fn table_json() -> String {
        fn normalise(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    m.remove("handle");
                    for (k, x) in m.iter_mut() {
                        normalise(x);
                        if (k == "elem" || k == "set")
                            && let serde_json::Value::Array(a) = x
                        {
                            a.sort_by_key(|e| e.to_string());
                        }
                    }
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(normalise),
                _ => {}
            }
        }
        let out = std::process::Command::new("nft")
            .args(["-j", "list", "table", "inet", "tern"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        normalise(&mut v);
        // Objects list in the order the kernel created them, which differs between a delta
        // and a full resync: order them by kind and name, rules of a chain kept in order.
        if let Some(a) = v["nftables"].as_array_mut() {
            a.sort_by_key(|o| {
                let (kind, body) = o.as_object().and_then(|m| m.iter().next()).unwrap();
                let name = body.get("chain").or(body.get("name")).cloned();
                (kind.clone(), name.map(|n| n.to_string()))
            });
        }
        serde_json::to_string_pretty(&v).unwrap()
    }

    /// A NetworkPolicy that selects local pods becomes active (its chain, a new selector set
    /// with its members, a named-port set, an anonymous CIDR set, the pods' chains rewritten,
    /// the conntrack rules of the base chain) in one netlink batch, and the kernel then holds
    /// what `nft -f` makes of the same desired table; deleting it is one batch too.
    fn activation_in_private_netns() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        for (name, ifname, ip) in [
            ("w1", "ternw1", "198.18.0.9"),
            ("w2", "ternw2", "198.18.0.10"),
        ] {
            let (k, v) = wep(name, "n1", "{app: w}", ifname, ip);
            store.put(&k, &v).unwrap();
        }
        for i in 0..20 {
            let (k, v) = wep(
                &format!("c{i}"),
                "n2",
                "{role: client}",
                &format!("ternc{i}"),
                &format!("198.18.1.{}", i + 1),
            );
            store.put(&k, &v).unwrap();
        }
        let engine = PolicyEngine::load(store, "n1").unwrap();
        engine.resync().unwrap();
        assert_eq!(engine.full_applies(), 1);
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: clients, namespace: x}\nspec:\n  podSelector: {matchLabels: {app: w}}\n  policyTypes: [Ingress, Egress]\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {role: client}}\n    ports:\n    - {port: 8080, protocol: TCP}\n  - from:\n    - ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16, 10.2.0.0/16]}\n  egress:\n  - to:\n    - ipBlock: {cidr: 0.0.0.0/0}\n";
        let r = tern_model::parse_documents(yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let mut inc = engine.lock();
        let before = table_json();
        inc.apply(&r).unwrap();
        let key = tern_policy::policy_key(&r).unwrap();
        assert!(inc.is_active(&key));
        let d = inc.table_delta().expect("a delta");
        assert!(
            d.iter()
                .any(|c| matches!(c, tern_policy::TableChange::AddSet { name, .. } if name.starts_with("sel-"))),
            "{d:#?}"
        );
        assert_eq!(apply_pending(&mut inc).unwrap(), Applied::Netlink);
        assert_eq!(inc.pending(), 0);
        let by_netlink = table_json();
        assert!(by_netlink.contains("198.18.1.20"), "{by_netlink}");
        // The two adjacent exceptions, merged as nft merges an anonymous set's ranges.
        assert!(by_netlink.contains("10.2.255.255"), "{by_netlink}");
        let full = inc.full_script();
        engine.run(&mut inc, &full).unwrap();
        assert_eq!(table_json(), by_netlink, "netlink and nft -f disagree");
        // Deactivation: back to the table before, in one batch.
        inc.remove(Kind::K8sNetworkPolicy, Some("x"), "clients");
        assert!(!inc.is_active(&key));
        assert_eq!(apply_pending(&mut inc).unwrap(), Applied::Netlink);
        assert_eq!(table_json(), before);
        assert_eq!(
            engine.full_applies(),
            2,
            "the first apply and the nft -f comparison: no full resync on the way"
        );
    }

    fn events_in_private_netns() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        // A pod of this node in namespace x, so the policy below selects a local endpoint
        // (only such policies are compiled).
        let (k, v) = wep("w1", "n1", "{app: w}", "ternw1", "198.18.0.9");
        store.put(&k, &v).unwrap();
        let engine = PolicyEngine::load(store.clone(), "n1").unwrap();
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n";
        let r = tern_model::parse_documents(yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let key = tern_model::resource_key(Kind::K8sNetworkPolicy, Some("x"), "deny");
        let ev = tern_store::Event {
            kind: EventKind::Put,
            kv: tern_store::KeyValue {
                key: key.clone(),
                value: r.to_json().into_bytes(),
                create_revision: 1,
                mod_revision: 1,
                version: 1,
                lease: 0,
            },
        };
        assert_eq!(engine.handle_events(std::slice::from_ref(&ev)).unwrap(), 1);
        let listing = table();
        assert!(listing.contains("chain pol-"), "{listing}");
        assert!(
            engine
                .desired()
                .chains
                .keys()
                .any(|c| c.starts_with("pol-") && c.ends_with("-in")),
            "{:?}",
            engine.desired().chains.keys()
        );
        let del = tern_store::Event {
            kind: EventKind::Delete,
            kv: tern_store::KeyValue {
                value: Vec::new(),
                ..ev.kv
            },
        };
        engine.handle_events(&[del]).unwrap();
        assert!(
            !engine
                .desired()
                .chains
                .keys()
                .any(|c| c.starts_with("pol-"))
        );
        let listing = table();
        assert!(!listing.contains("chain pol-"), "{listing}");
        assert_eq!(
            engine.full_applies(),
            1,
            "first apply is a full one, then deltas"
        );
    }

    /// natOutgoing's chains for a pool with natOutgoing: a change of the table.
    fn nat_chains(cidr: &str) -> Ruleset {
        crate::nat::chains(&[crate::snapshot::PoolInfo {
            name: cidr.into(),
            cidr: cidr.parse().unwrap(),
            vxlan: tern_model::EncapMode::Never,
            ipip: tern_model::EncapMode::Never,
            nat_outgoing: true,
            disabled: false,
        }])
    }

    #[test]
    fn refused_batches_fall_back_to_a_full_resync_then_nft_and_a_failure_forces_a_resync() {
        use tern_linux::fake::{FakeKernel, NftApplied};
        let mut k = FakeKernel::new();
        let mut inc = Incremental::new("n1", PolicySet::default());
        // A fresh state knows nothing of the kernel: the first apply is a full resync.
        assert_eq!(apply_pending_with(&mut inc, &mut k).unwrap(), Applied::Full);
        assert!(k.nft_applied()[0].is_full());
        // A change goes as a delta.
        inc.set_extra(nat_chains("10.244.0.0/16"));
        assert_eq!(
            apply_pending_with(&mut inc, &mut k).unwrap(),
            Applied::Netlink
        );
        assert!(!k.nft_applied()[1].is_full());
        // The delta refused (drift): the whole table again, over netlink.
        inc.set_extra(nat_chains("10.245.0.0/16"));
        k.fail_next_nft_apply();
        assert_eq!(apply_pending_with(&mut inc, &mut k).unwrap(), Applied::Full);
        assert!(k.nft_applied()[2].is_full());
        assert_eq!(inc.pending(), 0);
        // The full resync refused too: nft -f, itself a full resync.
        inc.set_extra(nat_chains("10.246.0.0/16"));
        k.fail_next_nft_apply();
        k.fail_next_nft_apply();
        assert_eq!(
            apply_pending_with(&mut inc, &mut k).unwrap(),
            Applied::Nft { full: true }
        );
        assert!(
            matches!(&k.nft_applied()[3], NftApplied::Script(s) if s.contains("10.246.0.0/16"))
        );
        // Everything refused: an error, nothing recorded as in force, and whatever changes
        // next, the next apply is a full resync.
        inc.set_extra(nat_chains("10.247.0.0/16"));
        k.fail_next_nft_apply();
        k.fail_next_nft_apply();
        k.fail_next_nft_script();
        assert!(apply_pending_with(&mut inc, &mut k).is_err());
        assert_eq!(k.nft_applied().len(), 4);
        assert_eq!(apply_pending_with(&mut inc, &mut k).unwrap(), Applied::Full);
        let last = k.nft_applied().pop().unwrap();
        assert!(last.is_full());
        assert!(matches!(&last, NftApplied::Batch { changes, .. }
            if tern_nft::render_changes(changes).contains("10.247.0.0/16")));
    }
}
