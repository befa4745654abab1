//! Garbage collection of deleted Kubernetes nodes: when a Node is gone from the API server for
//! the grace period (`--node-gc-grace`), exactly one agent, the holder of the
//! coordination.k8s.io/v1 Lease `kube-system/tern-node-gc`, releases what the node held in
//! tern's store ([`tern_ipam::Ipam::release_node`], the function `ternctl lab node del` uses):
//! its WorkloadEndpoints, addresses, blocks, affinities and tern Node. Every agent's dataplane
//! then drops its routes to the node through the existing store watch (routes follow blocks).
//!
//! The Lease protocol (client-go's, simplified): the record holds `holderIdentity` (the node
//! name), `leaseDurationSeconds` and `renewTime`. An agent that does not hold it takes it only
//! when it is expired: no holder, or its resourceVersion unchanged for a whole duration as
//! measured on this agent's monotonic clock (so clock skew between nodes does not matter). The
//! holder renews every duration/3. Every write is an update carrying the resourceVersion read
//! (a compare-and-swap: a 409 means someone else won), and the first one a create (409 when
//! another agent created it first). The holder acts only while its last successful renewal is
//! younger than two thirds of the duration, so two agents never act at once.
//!
//! Candidates are the nodes tern knows (tern Nodes and nodes with block affinities) that the
//! Kubernetes node cache does not have once it is synced; the holder times them from when it
//! first saw them missing (a new holder starts every grace period again: the other agents
//! read nothing for this), a node that reappears is forgotten, and the holder confirms the
//! deletion with a GET before it releases. Never this agent's own node.
//!
//! On a datastore that derives endpoints from Pods (the Kubernetes datastore) the holder also
//! runs the **pod IPAM GC** (Calico's kube-controllers IPAM GC, with its safety rules): an
//! allocation made for a pod that the audit finds unused ([`tern_ipam::audit::check`], which
//! there matches allocations with the Pods' addresses) is a suspect; one still unused after
//! the grace period is released only when a GET confirms its pod is gone, finished
//! (`Succeeded`/`Failed`), or running with other addresses (an earlier incarnation's), and the
//! release checks the allocation again (same address, handle and sequence number: never an
//! address reused since). A pod still starting (no address reported yet) keeps its
//! allocation. At most [`POD_GC_CAP`] releases a pass, a pass every half grace period; what
//! it freed is counted (`tern_ipam_gc_released_total`). Each node's own leak repair and the
//! runtime's DEL release almost everything first; this catches what a node whose agent is down
//! leaves when its pods are deleted.

use super::Inner;
use super::slim::SlimNode;
use ::kube::api::{Api, PostParams};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tern_model::{Kind, Resource};

/// Name of the Lease electing the node garbage collector.
pub const LEASE_NAME: &str = "tern-node-gc";
/// Namespace of the Lease.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Default `--node-gc-grace`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);
/// Default Lease duration.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
const LEASES: &str = "leases.coordination.k8s.io";
/// Most allocations the pod IPAM GC releases in one pass.
pub const POD_GC_CAP: usize = 100;

/// One agent's side of the Lease.
struct Elector {
    identity: String,
    duration: Duration,
    /// resourceVersion last seen and when it was first seen (this agent's clock).
    observed: Option<(String, Instant)>,
    /// When this agent last wrote the Lease as its holder.
    renewed: Option<Instant>,
}

fn conflict(e: &::kube::Error) -> bool {
    matches!(e, ::kube::Error::Api(s) if s.code == 409)
}

impl Elector {
    /// Whether this agent may act now.
    fn leading(&self) -> bool {
        self.renewed
            .is_some_and(|t| t.elapsed() < self.duration * 2 / 3)
    }

    /// One round: create, take over an expired Lease, or renew ours. `Ok(true)` while held.
    async fn round(&mut self, api: &Api<Lease>) -> Result<bool, ::kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let secs = i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = api.get_opt(LEASE_NAME).await? else {
            let lease = Lease {
                metadata: ::kube::core::ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    log::info!(
                        "kubernetes: node gc: {} created Lease {LEASE_NAMESPACE}/{LEASE_NAME} \
                         and leads the node garbage collection",
                        self.identity
                    );
                    self.took(&l);
                    Ok(true)
                }
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        if self.observed.as_ref().map(|o| &o.0) != Some(&rv) {
            self.observed = Some((rv, Instant::now()));
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let their = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(secs).max(1)).unwrap_or(1),
        );
        let unchanged_for = self
            .observed
            .as_ref()
            .map_or(Duration::ZERO, |o| o.1.elapsed());
        let expired = holder.is_empty() || unchanged_for >= their;
        if holder != self.identity && !expired {
            self.renewed = None;
            return Ok(false);
        }
        if holder != self.identity {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(secs);
        spec.renew_time = Some(now);
        // The resourceVersion read is sent back: the update holds only if nobody wrote since.
        match api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                if holder != self.identity {
                    log::info!(
                        "kubernetes: node gc: {} took Lease {LEASE_NAMESPACE}/{LEASE_NAME} \
                         (previous holder {:?}, unchanged for {:?})",
                        self.identity,
                        holder,
                        unchanged_for
                    );
                }
                self.took(&l);
                Ok(true)
            }
            Err(e) if conflict(&e) => {
                self.renewed = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn took(&mut self, l: &Lease) {
        let rv = l.metadata.resource_version.clone().unwrap_or_default();
        self.observed = Some((rv, Instant::now()));
        self.renewed = Some(Instant::now());
    }
}

/// Runs the election and the collection until the agent stops.
pub(super) async fn run(inner: Arc<Inner>, client: ::kube::Client) {
    let duration = inner.settings.lease_duration.max(Duration::from_secs(1));
    let grace = inner.settings.node_gc_grace;
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<SlimNode> = Api::all(client);
    let mut pod_gc = PodGc::default();
    let mut elector = Elector {
        identity: inner.settings.node_name.clone(),
        duration,
        observed: None,
        renewed: None,
    };
    // Nodes tern knows and Kubernetes does not, and since when (this agent's clock).
    let mut missing: HashMap<String, Instant> = HashMap::new();
    let mut last_error = String::new();
    loop {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        match elector.round(&leases).await {
            Ok(_) => last_error.clear(),
            Err(e) => {
                let msg = super::describe_client_error("update", LEASES, &e);
                if msg != last_error {
                    log::error!("kubernetes: node gc: Lease {LEASE_NAMESPACE}/{LEASE_NAME}: {msg}");
                    last_error = msg;
                }
            }
        }
        inner.gc_leader.store(elector.leading(), Ordering::Relaxed);
        // Only the holder tracks and collects: at 1,000 nodes, reading every node and
        // affinity every few seconds on every agent is a cost nobody uses. A new holder
        // starts its grace periods from when it took the Lease.
        if inner.nodes_synced.load(Ordering::Relaxed) && elector.leading() {
            track_missing(&inner, &mut missing);
            collect(&inner, &nodes, &mut missing, grace).await;
            if inner.store.derives_endpoints() {
                collect_pods(&inner, &pods, &mut pod_gc, grace).await;
            }
        } else {
            missing.clear();
            pod_gc = PodGc::default();
        }
        tokio::time::sleep(duration / 3).await;
    }
}

/// Updates `missing` from tern's store and the node cache.
fn track_missing(inner: &Inner, missing: &mut HashMap<String, Instant>) {
    let mut known: HashSet<String> = HashSet::new();
    match tern_model::list_resources_warn(&*inner.store, Kind::Node, "node gc") {
        Ok(list) => known.extend(list.into_iter().filter_map(|r| match r {
            Resource::Node(n) => Some(n.metadata.name),
            _ => None,
        })),
        Err(e) => {
            log::debug!("kubernetes: node gc: listing tern Nodes: {e}");
            return;
        }
    }
    match tern_ipam::Ipam::new(inner.store.clone()).affinities(None) {
        Ok(a) => known.extend(a.into_iter().map(|a| a.node)),
        Err(e) => {
            log::debug!("kubernetes: node gc: listing affinities: {e}");
            return;
        }
    }
    known.remove(inner.node());
    let cache = inner.nodes.lock().unwrap();
    missing.retain(|n, since| {
        let back = cache.contains_key(n);
        if back {
            log::info!(
                "kubernetes: node gc: node {n} is back in Kubernetes after {:?}; kept",
                since.elapsed()
            );
        }
        known.contains(n) && !back
    });
    for n in known {
        if !cache.contains_key(&n) && !missing.contains_key(&n) {
            log::info!(
                "kubernetes: node gc: node {n} is in tern's store but not in Kubernetes; \
                 released after {:?} unless it comes back",
                inner.settings.node_gc_grace
            );
            missing.insert(n, Instant::now());
        }
    }
}

/// Releases the nodes missing for longer than `grace`, each confirmed absent by a GET.
async fn collect(
    inner: &Inner,
    nodes: &Api<SlimNode>,
    missing: &mut HashMap<String, Instant>,
    grace: Duration,
) {
    let due: Vec<(String, Duration)> = missing
        .iter()
        .map(|(n, t)| (n.clone(), t.elapsed()))
        .filter(|(_, e)| *e >= grace)
        .collect();
    for (node, gone_for) in due {
        if node == inner.node() {
            continue;
        }
        match nodes.get_opt(&node).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                log::info!("kubernetes: node gc: node {node} exists again; kept");
                missing.remove(&node);
                continue;
            }
            Err(e) => {
                log::warn!("kubernetes: node gc: cannot confirm node {node} is gone: {e}");
                continue;
            }
        }
        match tern_ipam::Ipam::new(inner.store.clone()).release_node(&node) {
            Ok(r) => {
                missing.remove(&node);
                log::info!(
                    "kubernetes: node gc: node {node} deleted from Kubernetes {gone_for:?} ago: \
                     released {} address(es), deleted {} endpoint(s) [{}], blocks [{}], \
                     unaffined blocks still borrowed [{}], tern Node {}",
                    r.released.len(),
                    r.endpoints.len(),
                    r.endpoints.join(", "),
                    r.blocks.join(", "),
                    r.orphaned_blocks.join(", "),
                    if r.node_deleted { "deleted" } else { "absent" }
                );
            }
            Err(e) => log::warn!("kubernetes: node gc: releasing node {node}: {e}; retrying"),
        }
    }
}

/// The pod IPAM GC's memory: suspects (address, handle, sequence number) and since when.
#[derive(Default)]
struct PodGc {
    suspects: HashMap<(IpAddr, String, u64), Instant>,
    last_pass: Option<Instant>,
}

/// What a GET of its pod says of a suspect allocation of `ip`: whether it may go.
fn pod_lets_go(pod: Option<&Pod>, ip: IpAddr) -> Result<(), String> {
    let Some(p) = pod else {
        return Ok(());
    };
    let status = p.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    if matches!(phase.as_str(), "Succeeded" | "Failed") {
        return Ok(());
    }
    let ips: Vec<IpAddr> = status
        .pod_ips
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.ip.parse().ok())
        .collect();
    if phase == "Running" && !ips.is_empty() && !ips.contains(&ip) {
        return Ok(());
    }
    Err(format!(
        "its pod exists ({}, addresses {ips:?})",
        if phase.is_empty() { "no phase" } else { &phase }
    ))
}

/// One pass of the pod IPAM GC (see the module documentation), every half grace period.
async fn collect_pods(inner: &Inner, pods: &Api<Pod>, gc: &mut PodGc, grace: Duration) {
    let every = grace.max(Duration::from_secs(2)) / 2;
    if gc.last_pass.is_some_and(|t| t.elapsed() < every) {
        return;
    }
    gc.last_pass = Some(Instant::now());
    pod_pass(inner, pods, gc, grace).await;
    // The audit decoded every allocation and endpoint of the cluster: the Lease holder's
    // heap gives those pages back now rather than at the next maintenance cycle (at 10,000
    // pods the holder's RSS was the agents' highest).
    crate::metrics::trim_heap();
}

async fn pod_pass(inner: &Inner, pods: &Api<Pod>, gc: &mut PodGc, grace: Duration) {
    let ipam = tern_ipam::Ipam::new(inner.store.clone());
    let report = match tern_ipam::audit::check(&*inner.store, &ipam) {
        Ok(r) => r,
        Err(e) => {
            log::warn!("kubernetes: ipam gc: checking IPAM: {e}");
            return;
        }
    };
    let key = |l: &tern_ipam::audit::LeakedAllocation| (l.ip, l.handle.clone(), l.sequence_number);
    let leaked: Vec<_> = report
        .allocated_not_in_use
        .iter()
        .filter(|l| !l.pod.is_empty() && !l.namespace.is_empty())
        .collect();
    let now = Instant::now();
    gc.suspects
        .retain(|k, _| leaked.iter().any(|l| key(l) == *k));
    let mut due = Vec::new();
    for l in leaked {
        let since = *gc.suspects.entry(key(l)).or_insert(now);
        if since.elapsed() >= grace && due.len() < POD_GC_CAP {
            due.push(l.clone());
        }
    }
    let mut todo = Vec::new();
    for l in due {
        let pod = match Api::<Pod>::namespaced(pods.clone().into_client(), &l.namespace)
            .get_opt(&l.pod)
            .await
        {
            Ok(p) => p,
            Err(e) => {
                log::warn!(
                    "kubernetes: ipam gc: cannot confirm pod {}/{} is gone: {e}",
                    l.namespace,
                    l.pod
                );
                continue;
            }
        };
        match pod_lets_go(pod.as_ref(), l.ip) {
            Ok(()) => todo.push(l),
            Err(why) => log::debug!(
                "kubernetes: ipam gc: {} of {}/{} kept: {why}",
                l.ip,
                l.namespace,
                l.pod
            ),
        }
    }
    if todo.is_empty() {
        return;
    }
    let batch = tern_ipam::audit::IpamReport {
        allocated_not_in_use: todo,
        ..Default::default()
    };
    match tern_ipam::audit::release_from_report(&*inner.store, &ipam, &batch) {
        Ok(out) => {
            inner
                .ipam_gc_released
                .fetch_add(out.released.len() as u64, Ordering::Relaxed);
            for l in &batch.allocated_not_in_use {
                if out.released.contains(&l.ip) {
                    gc.suspects.remove(&key(l));
                    log::info!(
                        "kubernetes: ipam gc: released {} (handle {}, node {}) of pod {}/{}, \
                         unused for over {grace:?} and its pod gone or finished",
                        l.ip,
                        l.handle,
                        l.node,
                        l.namespace,
                        l.pod
                    );
                }
            }
            for (ip, why) in out.skipped {
                log::info!("kubernetes: ipam gc: {ip} left alone: {why}");
            }
        }
        Err(e) => log::warn!("kubernetes: ipam gc: releasing: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::{Kube, KubeSettings, NodeInfo};

    /// A suspect allocation goes when its pod is gone, finished, or running with other
    /// addresses; never while the pod is starting or holds the address.
    #[test]
    fn the_pod_gc_releases_only_for_pods_gone_finished_or_readdressed() {
        let ip: IpAddr = "10.250.0.5".parse().unwrap();
        let pod = |phase: &str, ips: &[&str]| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "x"},
                "status": {"phase": phase, "podIPs": ips.iter().map(|i| serde_json::json!({"ip": i})).collect::<Vec<_>>()},
            }))
            .unwrap()
        };
        assert!(pod_lets_go(None, ip).is_ok());
        assert!(pod_lets_go(Some(&pod("Succeeded", &["10.250.0.5"])), ip).is_ok());
        assert!(pod_lets_go(Some(&pod("Failed", &[])), ip).is_ok());
        assert!(pod_lets_go(Some(&pod("Running", &["10.250.0.9"])), ip).is_ok());
        assert!(pod_lets_go(Some(&pod("Running", &["10.250.0.5"])), ip).is_err());
        assert!(pod_lets_go(Some(&pod("Pending", &[])), ip).is_err());
        assert!(pod_lets_go(Some(&pod("Running", &[])), ip).is_err());
    }

    /// Candidates are tern's nodes missing from Kubernetes, never this agent's own; a node
    /// that comes back is forgotten.
    #[test]
    fn missing_nodes_exclude_the_own_node_and_forget_returning_ones() {
        let store: Arc<dyn tern_store::Store> = Arc::new(tern_store::mem::MemStore::new());
        for n in ["me", "gone", "here"] {
            let node = tern_model::Node::new(n, tern_model::NodeSpec::default());
            tern_model::put_resource(&*store, &node.into()).unwrap();
        }
        // A node known only by its block affinity counts too.
        let ipam = tern_ipam::Ipam::new(store.clone());
        ipam.ensure_default_pool("10.250.0.0/16").unwrap();
        ipam.assign_ipv4(&tern_ipam::AssignArgs {
            num_v4: 1,
            handle: "h".into(),
            node: "blocks-only".into(),
            ..Default::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kube = Kube::new(
            KubeSettings {
                node_name: "me".into(),
                kubeconfig: None,
                state_dir: dir.path().into(),
                node_gc_grace: DEFAULT_GRACE,
                lease_duration: DEFAULT_LEASE_DURATION,
            },
            store,
            None,
        )
        .unwrap();
        let info = |n: &str| NodeInfo {
            name: n.into(),
            ..Default::default()
        };
        kube.inner
            .nodes
            .lock()
            .unwrap()
            .insert("here".into(), info("here"));
        let mut missing = HashMap::new();
        track_missing(&kube.inner, &mut missing);
        let mut names: Vec<&String> = missing.keys().collect();
        names.sort();
        assert_eq!(names, ["blocks-only", "gone"]);
        kube.inner
            .nodes
            .lock()
            .unwrap()
            .insert("gone".into(), info("gone"));
        track_missing(&kube.inner, &mut missing);
        assert_eq!(missing.keys().collect::<Vec<_>>(), ["blocks-only"]);
    }
}
