//! NetworkPolicy enforcement: the node's `inet tern` table, kept equal to the policies,
//! namespaces and endpoints of the whole cluster by [`tern_policy::Incremental`].
//!
//! - The table is shared with natOutgoing: [`crate::dataplane`] hands its chains and sets over
//!   ([`PolicyEngine::set_nat`]) and they are rendered in the same transactions, so a full
//!   resync (delete + re-create the table in one `nft -f`) never drops them.
//! - Start: the table the previous agent left in the kernel stays until the first full render
//!   replaces it in one transaction, so a restart never opens a window of allow-all.
//! - ADD: [`PolicyEngine::endpoint_added`] puts the endpoint's chains, map entries and set
//!   elements into the kernel before the pod has an address or a route (see `ops.rs`), so no
//!   packet reaches or leaves the pod unpoliced.
//! - Watch: every policy / namespace / endpoint change in the store becomes a delta script of
//!   the chains and sets it touched. A periodic full resync (from the maintenance loop) repairs
//!   drift.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_model::{Kind, Resource};
use tern_policy::{Endpoint, Incremental, PolicySet, Ruleset, Script, TableChange};
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

/// The netlink form of a table delta, or `None` when some element or rule has a shape
/// `tern_linux::nft_netlink` does not encode (then `nft -f` applies it).
pub fn netlink_ops(delta: &[TableChange]) -> Option<Vec<tern_linux::nft_netlink::TableOp>> {
    use tern_linux::nft_netlink::{ElementChange, ElementOp, Rule, SetKind, TableOp};
    delta
        .iter()
        .map(|c| {
            Some(match c {
                TableChange::Element(e) => {
                    // Set kinds nft must handle itself (auto-merge intervals, ...) go to nft.
                    let element = SetKind::from_spec(&e.spec)?
                        .parse_element(&e.element)
                        .ok()?;
                    TableOp::Element(ElementChange {
                        set: e.set.clone(),
                        op: if e.add {
                            ElementOp::Add
                        } else {
                            ElementOp::Delete
                        },
                        element,
                    })
                }
                TableChange::AddChain(n) => TableOp::AddChain(n.clone()),
                TableChange::FlushChain(n) => TableOp::FlushChain(n.clone()),
                TableChange::DeleteChain(n) => TableOp::DeleteChain(n.clone()),
                TableChange::AddRule { chain, rule } => TableOp::AddRule {
                    chain: chain.clone(),
                    rule: Rule::parse(rule)?,
                },
            })
        })
        .collect()
}

/// How [`apply_pending`] brought a change to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing was pending.
    Nothing,
    /// One nfnetlink batch (elements and endpoint chains).
    Netlink,
    /// An `nft -f` delta script.
    Delta,
    /// A full resync: the table deleted and re-created in one `nft -f` transaction.
    Full,
}

/// Applies a script with `nft -f` and commits it; a failure forgets the kernel state, so the
/// next script is a full resync.
pub fn run_script(inc: &mut Incremental, s: &Script) -> Result<Applied, PolicyAgentError> {
    if s.text.is_empty() {
        inc.commit(s);
        return Ok(Applied::Nothing);
    }
    log::debug!(
        "policy: applying {} lines (full: {}): {:.200}",
        s.text.lines().count(),
        s.full,
        s.text
    );
    match tern_linux::nft::apply(&s.text) {
        Ok(()) => {
            inc.commit(s);
            Ok(if s.full {
                Applied::Full
            } else {
                Applied::Delta
            })
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
/// state: over netlink when the change allows ([`apply_netlink`]), else as an `nft -f` delta;
/// a delta the kernel refuses (drift) is retried as a full resync.
pub fn apply_pending(inc: &mut Incremental) -> Result<Applied, PolicyAgentError> {
    if let Some(how) = apply_netlink(inc) {
        return Ok(how);
    }
    let s = inc.script();
    match run_script(inc, &s) {
        Err(e) if !s.full => {
            log::warn!("policy: {e}; resyncing the whole table");
            let full = inc.full_script();
            run_script(inc, &full)
        }
        other => other,
    }
}

/// Fast path of [`apply_pending`]: a delta that only adds and removes set / map elements and
/// creates, re-fills or deletes endpoint chains (a pod joining or leaving selected sets, a
/// local pod that policies select) goes to the kernel as one nfnetlink batch instead of
/// `nft -f`, which would first load the whole table (15-40 ms at 1,000 policies); no script
/// text is rendered for it. `Some` when applied (or nothing was pending) and committed; `None`
/// when the delta is anything else (a policy's own rules, a base chain, a set declaration) or
/// the kernel state is unknown, or on any netlink error, after which the caller applies the
/// same delta with `nft -f` (the batch is one transaction, so a failed one changed nothing),
/// then a full resync if that fails too.
pub fn apply_netlink(inc: &mut Incremental) -> Option<Applied> {
    let delta = inc.table_delta()?;
    // Commits the dirty state; a delta script's text is never looked at by commit.
    let done = Script {
        text: String::new(),
        full: false,
    };
    if delta.is_empty() {
        inc.commit(&done);
        return Some(Applied::Nothing);
    }
    let ops = netlink_ops(&delta)?;
    let table = tern_policy::nft::TABLE
        .strip_prefix("inet ")
        .expect("the policy table is an inet table");
    // Like the `nft` child process it replaces, this acts in the network namespace of the
    // calling thread (the socket is cached per thread and namespace).
    match tern_linux::nft_netlink::apply_ops_cached(table, &ops) {
        Ok(()) => {
            log::debug!("policy: applied {} table changes over netlink", ops.len());
            inc.commit(&done);
            Some(Applied::Netlink)
        }
        Err(e) => {
            log::warn!("policy: netlink table update failed ({e}); retrying with nft -f");
            None
        }
    }
}

/// Kinds whose objects feed policy.
const KINDS: [Kind; 5] = [
    Kind::K8sNetworkPolicy,
    Kind::NetworkPolicy,
    Kind::GlobalNetworkPolicy,
    Kind::Namespace,
    Kind::WorkloadEndpoint,
];

/// The policy state of this node and the kernel table it drives.
pub struct PolicyEngine {
    store: Arc<dyn Store>,
    state: Mutex<Incremental>,
    applies: AtomicU64,
    full_applies: AtomicU64,
}

/// Loads every policy, namespace and endpoint; a stored object that does not parse or
/// validate is skipped with a warning (it must not block enforcement of the others).
pub fn load_policy_set(store: &dyn Store) -> Result<PolicySet, PolicyAgentError> {
    let mut set = PolicySet::new();
    // Namespaces first so their labels exist when anything else is evaluated.
    for kind in [
        Kind::Namespace,
        Kind::WorkloadEndpoint,
        Kind::K8sNetworkPolicy,
        Kind::NetworkPolicy,
        Kind::GlobalNetworkPolicy,
    ] {
        let prefix = keys::resource_prefix(kind.as_str());
        let (kvs, _) = store.range(&prefix).map_err(|e| PolicyAgentError::Store {
            what: format!("{} objects", kind.as_str()),
            source: e,
        })?;
        for kv in kvs {
            match Resource::from_json(&kv.value) {
                Ok(r) => {
                    if let Err(e) = set.apply(&r) {
                        log::warn!("policy: skipping {}: {e}", kv.key);
                    }
                }
                Err(e) => log::warn!("policy: skipping unreadable {}: {e}", kv.key),
            }
        }
    }
    Ok(set)
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

/// Label every endpoint gets with its Kubernetes namespace (as Calico's
/// `projectcalico.org/namespace`), so global policies can select by namespace.
pub const NAMESPACE_LABEL: &str = "tern.dev/namespace";
/// Label naming the orchestrator (`k8s` for pods, `cni` otherwise).
pub const ORCHESTRATOR_LABEL: &str = "tern.dev/orchestrator";

/// The labels an endpoint is created with: the runtime's (`args.cni.labels`) plus the ones
/// derived from the Kubernetes CNI args.
pub fn workload_labels(
    a: &tern_api::Attachment,
    cni_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = cni_labels.clone();
    let (ns, orch) = match &a.pod {
        Some(p) => (p.namespace.as_str(), "k8s"),
        None => ("default", "cni"),
    };
    l.insert(NAMESPACE_LABEL.into(), ns.into());
    l.insert(ORCHESTRATOR_LABEL.into(), orch.into());
    l
}

/// The policy engine's view of an endpoint being added on this node.
pub fn local_endpoint(ep: &crate::endpoints::Endpoint) -> Endpoint {
    Endpoint {
        namespace: ep.namespace(),
        name: ep.name(),
        node: ep.node.clone(),
        interface: ep.host_ifname.clone(),
        labels: ep.labels.clone(),
        ips: ep
            .ip_networks
            .iter()
            .filter_map(|n| n.parse::<ipnet::IpNet>().ok().map(|n| n.addr()))
            .collect(),
        ports: ep.ports.clone(),
    }
}

impl PolicyEngine {
    /// Reads the cluster's policy state for `node`; nothing is applied yet (see
    /// [`PolicyEngine::resync`]), so the table already in the kernel keeps enforcing.
    pub fn load(store: Arc<dyn Store>, node: &str) -> Result<PolicyEngine, PolicyAgentError> {
        let set = load_policy_set(&*store)?;
        Ok(PolicyEngine {
            store,
            state: Mutex::new(Incremental::new(node, set)),
            applies: AtomicU64::new(0),
            full_applies: AtomicU64::new(0),
        })
    }

    /// Number of scripts applied (full and delta).
    pub fn applies(&self) -> u64 {
        self.applies.load(Ordering::Relaxed)
    }

    /// Number of full resyncs applied.
    pub fn full_applies(&self) -> u64 {
        self.full_applies.load(Ordering::Relaxed)
    }

    /// The desired table as it is now (diagnostics, tests).
    pub fn desired(&self) -> Ruleset {
        self.state.lock().unwrap().desired()
    }

    fn count(&self, how: Applied) {
        if how != Applied::Nothing {
            self.applies.fetch_add(1, Ordering::Relaxed);
        }
        if how == Applied::Full {
            self.full_applies.fetch_add(1, Ordering::Relaxed);
        }
    }

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

    /// Re-reads everything from the store and replaces the table in one transaction.
    pub fn resync(&self) -> Result<(), PolicyAgentError> {
        let set = load_policy_set(&*self.store)?;
        let mut inc = self.state.lock().unwrap();
        let node = inc.node().to_string();
        // natOutgoing's part comes from the dataplane, not from this store read: keep it.
        let extra = inc.extra().clone();
        let mut next = Incremental::new(&node, set);
        next.set_extra(extra);
        let full = next.full_script();
        *inc = next;
        self.run(&mut inc, &full)
    }

    /// Puts a local endpoint's rules into the kernel now (called by ADD before the pod gets
    /// its addresses and routes).
    pub fn endpoint_added(&self, ep: Endpoint) -> Result<(), PolicyAgentError> {
        let mut inc = self.state.lock().unwrap();
        inc.upsert_endpoint(ep);
        self.flush(&mut inc)
    }

    /// Removes an endpoint's rules and set elements (DEL).
    pub fn endpoint_removed(&self, namespace: &str, name: &str) -> Result<(), PolicyAgentError> {
        let mut inc = self.state.lock().unwrap();
        if !inc.remove_endpoint(namespace, name) {
            return Ok(());
        }
        self.flush(&mut inc)
    }

    /// Replaces natOutgoing's chains and sets in the shared table.
    pub fn set_nat(&self, nat: Ruleset) -> Result<(), PolicyAgentError> {
        let mut inc = self.state.lock().unwrap();
        inc.set_extra(nat);
        self.flush(&mut inc)
    }

    /// Applies a batch of store events in one transaction.
    pub fn handle_events(&self, events: &[tern_store::Event]) -> Result<usize, PolicyAgentError> {
        let mut inc = self.state.lock().unwrap();
        let mut n = 0;
        for ev in events {
            let Some((kind, ns, name)) = parse_key(&ev.kv.key) else {
                continue;
            };
            n += 1;
            match ev.kind {
                EventKind::Put => match Resource::from_json(&ev.kv.value) {
                    Ok(r) => {
                        if let Err(e) = inc.apply(&r) {
                            log::warn!("policy: ignoring {}: {e}", ev.kv.key);
                        }
                    }
                    Err(e) => log::warn!("policy: ignoring unreadable {}: {e}", ev.kv.key),
                },
                EventKind::Delete => inc.remove(kind, ns.as_deref(), &name),
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
        std::thread::Builder::new()
            .name("policy-watch".into())
            .spawn(move || me.watch_loop(&stop))
            .map(|_| ())
    }

    fn watch_loop(&self, stop: &AtomicBool) {
        let mut watch: Option<Box<dyn tern_store::Watch>> = None;
        while !stop.load(Ordering::Relaxed) {
            let w = match watch.as_mut() {
                Some(w) => w,
                None => {
                    let started = self
                        .store
                        .revision()
                        .and_then(|rev| Ok((rev, self.store.watch(keys::ROOT, rev)?)));
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
                    if let Err(e) = self.handle_events(&ev) {
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

    #[test]
    fn store_events_update_the_desired_table() {
        // nft runs in a network namespace of this thread's own (never the machine's).
        std::thread::spawn(events_in_private_netns).join().unwrap();
    }

    #[test]
    fn element_and_endpoint_chain_deltas_go_over_netlink() {
        // The kernel part runs in a network namespace of this thread's own.
        std::thread::spawn(netlink_in_private_netns).join().unwrap();
    }

    fn netlink_in_private_netns() {
        // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot create a network namespace (needs root)");
            return;
        }
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let engine = PolicyEngine::load(store, "n1").unwrap();
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-b, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}\n";
        let r = tern_model::parse_documents(yaml, "t.yaml")
            .unwrap()
            .remove(0);
        let mut inc = engine.state.lock().unwrap();
        inc.apply(&r).unwrap();
        engine.flush(&mut inc).unwrap();
        let remote = |ip: &str, pod: &str| Endpoint {
            namespace: "x".into(),
            name: format!("b-{ip}"),
            node: "n2".into(),
            interface: String::new(),
            labels: BTreeMap::from([("pod".to_string(), pod.to_string())]),
            ips: vec![ip.parse().unwrap()],
            ports: Vec::new(),
        };
        // A remote pod joins the source set: applied without nft, and the kernel has it.
        inc.upsert_endpoint(remote("198.18.0.5", "b"));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        assert_eq!(inc.pending(), 0);
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
        assert!(listing.contains("198.18.0.5"), "{listing}");
        // It leaves (label change): removed the same way.
        inc.upsert_endpoint(remote("198.18.0.5", "c"));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
        assert!(!listing.contains("198.18.0.5"), "{listing}");
        // The first filtered local pod adds the conntrack rules to the base chain: nft's job.
        let local = |n: u8| Endpoint {
            node: "n1".into(),
            interface: format!("ternlocal{n}"),
            name: format!("local{n}"),
            ..remote(&format!("198.18.0.{}", 10 + n), "b")
        };
        inc.upsert_endpoint(local(1));
        assert_eq!(apply_netlink(&mut inc), None);
        engine.flush(&mut inc).unwrap();
        // The next one only brings its own chain, map entry and set elements: netlink.
        inc.upsert_endpoint(local(2));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let chain = || {
            std::process::Command::new("nft")
                .args(["list", "chain", "inet", "tern", "ep-in-ternlocal2"])
                .output()
                .unwrap()
        };
        let by_netlink = chain();
        assert!(by_netlink.status.success());
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
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
        // An allow-only CIDR policy gives local1 a fast-path set (declared: nft). A pod with
        // the same policies shares that set, so its chain, with the set lookup, goes over
        // netlink and equals what nft builds.
        let cidr = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-net, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - ipBlock: {cidr: 198.19.0.0/16}\n    ports:\n    - {port: 80, protocol: TCP}\n";
        let r = tern_model::parse_documents(cidr, "t.yaml")
            .unwrap()
            .remove(0);
        inc.apply(&r).unwrap();
        assert_eq!(apply_netlink(&mut inc), None);
        engine.flush(&mut inc).unwrap();
        inc.upsert_endpoint(local(3));
        assert_eq!(apply_netlink(&mut inc), Some(Applied::Netlink));
        let chain3 = || {
            std::process::Command::new("nft")
                .args(["list", "chain", "inet", "tern", "ep-in-ternlocal3"])
                .output()
                .unwrap()
        };
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
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
        assert!(listing.contains("198.18.0.7"), "{listing}");
    }

    fn events_in_private_netns() {
        // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot create a network namespace (needs root)");
            return;
        }
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
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
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
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
        let listing = tern_linux::nft::list_table("inet", "tern")
            .unwrap()
            .unwrap();
        assert!(!listing.contains("chain pol-"), "{listing}");
        assert_eq!(
            engine.full_applies(),
            1,
            "first apply is a full one, then deltas"
        );
    }
}
