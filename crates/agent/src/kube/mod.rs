//! Kubernetes as a source of desired state: pods, namespaces and NetworkPolicies from the API
//! server (kube-rs on its own thread with a current-thread tokio runtime, as the BGP speaker
//! runs).
//!
//! ```text
//!   kube-apiserver ──watch──► "kubernetes" thread
//!     pods (spec.nodeName=<this node>) ──► pod cache ──► this node's WorkloadEndpoints in the
//!                                                        store (labels, named ports, service
//!                                                        account; CAS) ──► every agent's
//!                                                        policy engine (existing store watch)
//!     namespaces (metadata only)   ─┐
//!     networking.k8s.io/v1         ─┴──► local PolicyEngine (external objects, no store write)
//!       NetworkPolicies                  + snapshot in <state_dir> for the next start
//!     namespaces' IPAM annotations ────► namespace annotation cache (pool defaults)
//!     nodes (slim: addresses, podCIDRs, deletion) ──► node cache (`Kube::node`, `nodes`)
//!                                         this node's podCIDRs ──► tern Node spec.podCIDRs
//!                                         a node gone for --node-gc-grace ──► its IPAM
//!                                         released by the Lease holder (gc.rs)
//!   CNI ADD ──► pod cache (UID checked) / one GET on a miss / code 11 when unreachable
//!           ──► pod + namespace IPAM annotations (annotations.rs): pools, ipAddrs,
//!               ipAddrsNoIpam; code 7 naming the pod and the annotation
//!   ready   ──► PATCH nodes/<node>/status NetworkUnavailable=False (reason TernIsUp)
//! ```
//!
//! Design choices:
//! - Pods: each agent watches only its own node's pods and publishes their labels through the
//!   WorkloadEndpoints it already owns. Memory per agent is O(pods on the node) (about 110)
//!   instead of O(pods in the cluster), and the API server serves N small filtered watches
//!   rather than N cluster-wide ones. The price is one store write per pod label change and
//!   the store watch's propagation delay to the other nodes (the same path and figures as
//!   `ternctl label`). Peer selectors keep working on every node because the policy engine
//!   already evaluates every node's WorkloadEndpoints.
//! - Namespaces and NetworkPolicies: every agent watches them cluster-wide (they are few and
//!   small: metadata only for namespaces) and feeds them straight into its local policy engine
//!   as external objects; no elected writer, no store writes, no extra propagation hop.
//! - No policy gap: after a watch restart or a 410 the watcher relists; the engine's objects are
//!   replaced only when the relist is complete (`Init` … `InitDone`), so rules stay in force
//!   meanwhile. The last complete set is also written to `<state_dir>/kubernetes-objects.json`
//!   and seeded into the engine before its first apply at start, so an agent restart while the
//!   API server is down keeps the rules as well.
//! - RBAC: a 401/403 on list or watch is kept as a problem naming the verb and resource; it is
//!   logged and fails `/readiness` and STATUS, so a missing permission is never an empty cache.
//!
//! The files: this one holds the source ([`Kube`]: settings, caches, readiness, metrics);
//! `run` the thread and its ticker, `watch` the watches and their events, `client` the API
//! client and one GET, `persist` the snapshot of namespaces and policies, `add` the ADD's
//! pod lookup and annotation glue (`annotations` parses and applies them, `error` says what
//! failed), `wep` the WorkloadEndpoints, `gc` the garbage collector and its Lease, `feed` the
//! endpoint feed, `slim` the slim objects watched.

mod add;
pub mod annotations;
mod client;
pub mod error;
pub mod feed;
pub mod gc;
mod persist;
mod run;
pub mod slim;
mod watch;
pub mod wep;

pub use error::{AddError, AnnotationError, ApiError};
pub use slim::{NodeInfo, PodInfo};

pub(crate) use client::make_client;
use client::{describe_client_error, rbac_message, rbac_problem};
use run::run;
use watch::{convert, watch};
pub use wep::SERVICE_ACCOUNT_LABEL;

use crate::endpoints::Endpoint;
use crate::external::ExternalObjects;
use crate::metrics::exposition::Page;
use ::kube::api::{Api, Patch, PatchParams};
use ::kube::runtime::WatchStreamExt;
use ::kube::runtime::watcher;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use slim::{SlimNode, SlimPod};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tern_api::Attachment;
use tern_model::{Kind, Resource};
use tern_store::Store;

/// How long an ADD waits for the GET of a pod the cache does not have.
const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// Reason of the Node condition tern sets.
pub const NODE_CONDITION_REASON: &str = "TernIsUp";

/// File in the state directory holding the last complete set of namespaces and policies.
pub const SNAPSHOT_FILE: &str = "kubernetes-objects.json";

/// Errors of the Kubernetes source's start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("starting the kubernetes thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Where to find the API server and what this node is.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub node_name: String,
    /// `--kubeconfig`; None = `KUBECONFIG`, `~/.kube/config` or the in-cluster service account
    /// (kube-rs's inference order).
    pub kubeconfig: Option<PathBuf>,
    /// The snapshot of namespaces and policies lives here.
    pub state_dir: PathBuf,
    /// How long a Kubernetes Node must stay deleted before its IPAM is released
    /// (`--node-gc-grace`; [`gc`]).
    pub node_gc_grace: Duration,
    /// Duration of the Lease electing the node garbage collector.
    pub lease_duration: Duration,
}

/// The resources watched, as RBAC names them.
const PODS: &str = "pods";
const NAMESPACES: &str = "namespaces";
const POLICIES: &str = "networkpolicies.networking.k8s.io";
const NODE_STATUS: &str = "nodes/status";
const NODES: &str = "nodes";

struct Inner {
    settings: KubeSettings,
    store: Arc<dyn Store>,
    /// Where this node's endpoint records are (`store`, or the node-local store when the
    /// datastore derives endpoints from Pods): the pods' labels and ports go there.
    endpoint_store: Arc<dyn Store>,
    policy: Option<Arc<dyn ExternalObjects>>,
    pods: Mutex<HashMap<(String, String), PodInfo>>,
    /// Every namespace's IPAM annotations ([`annotations::relevant`]), for pool defaults.
    ns_annotations: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Every node of the cluster, slim ([`NodeInfo`]).
    nodes: Mutex<HashMap<String, NodeInfo>>,
    nodes_synced: AtomicBool,
    /// Set when this node's podCIDRs still have to be written to tern's Node resource.
    own_node_dirty: AtomicBool,
    pods_synced: AtomicBool,
    namespaces_synced: AtomicBool,
    policies_synced: AtomicBool,
    /// Set when a pod's endpoints could not be written (store down): the next tick rewrites.
    pods_dirty: AtomicBool,
    snapshot_dirty: AtomicBool,
    node_condition_set: AtomicBool,
    /// This agent holds the node garbage collector's Lease.
    gc_leader: AtomicBool,
    /// Addresses the pod IPAM GC released ([`gc`]).
    ipam_gc_released: std::sync::atomic::AtomicU64,
    /// Permission problems by resource (cleared by the next successful event of it).
    rbac: Mutex<BTreeMap<&'static str, String>>,
    client: OnceLock<::kube::Client>,
    /// Why no client could be built yet (bad kubeconfig, no in-cluster environment).
    client_error: Mutex<Option<String>>,
    handle: OnceLock<tokio::runtime::Handle>,
    stop: AtomicBool,
}

/// The Kubernetes source of one agent.
pub struct Kube {
    inner: Arc<Inner>,
}

impl Kube {
    /// Checks the kubeconfig and seeds the policy engine with the last snapshot (without
    /// applying it: the first apply of the engine then includes it, so the rules of the
    /// previous run stay in force). `policy` is where namespaces and NetworkPolicies go (the
    /// policy engine, which the root hands over; `None` without the dataplane). Call
    /// [`Kube::spawn`] to start watching.
    pub fn new(
        settings: KubeSettings,
        store: Arc<dyn Store>,
        policy: Option<Arc<dyn ExternalObjects>>,
    ) -> Result<Kube, KubeError> {
        Self::with_endpoint_store(settings, store.clone(), store, policy)
    }

    /// As [`Kube::new`], with this node's endpoint records in `endpoint_store`
    /// ([`crate::endpoints::open_store`]).
    pub fn with_endpoint_store(
        settings: KubeSettings,
        store: Arc<dyn Store>,
        endpoint_store: Arc<dyn Store>,
        policy: Option<Arc<dyn ExternalObjects>>,
    ) -> Result<Kube, KubeError> {
        if let Some(p) = &settings.kubeconfig {
            ::kube::config::Kubeconfig::read_from(p).map_err(|e| KubeError::Kubeconfig {
                path: p.clone(),
                reason: e.to_string(),
            })?;
        }
        let inner = Arc::new(Inner {
            settings,
            store,
            endpoint_store,
            policy,
            pods: Mutex::new(HashMap::new()),
            ns_annotations: Mutex::new(HashMap::new()),
            nodes: Mutex::new(HashMap::new()),
            nodes_synced: AtomicBool::new(false),
            own_node_dirty: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            namespaces_synced: AtomicBool::new(false),
            policies_synced: AtomicBool::new(false),
            pods_dirty: AtomicBool::new(false),
            snapshot_dirty: AtomicBool::new(false),
            node_condition_set: AtomicBool::new(false),
            gc_leader: AtomicBool::new(false),
            ipam_gc_released: std::sync::atomic::AtomicU64::new(0),
            rbac: Mutex::new(BTreeMap::new()),
            client: OnceLock::new(),
            client_error: Mutex::new(None),
            handle: OnceLock::new(),
            stop: AtomicBool::new(false),
        });
        if inner.policy.is_none() {
            // Without the dataplane there is no policy engine to feed.
            inner.namespaces_synced.store(true, Ordering::Relaxed);
            inner.policies_synced.store(true, Ordering::Relaxed);
        }
        inner.load_snapshot();
        Ok(Kube { inner })
    }

    /// Starts the `kubernetes` thread (its own current-thread runtime).
    pub fn spawn(&self) -> Result<(), KubeError> {
        let inner = self.inner.clone();
        crate::runtime::spawn_current_thread("kubernetes", "kubernetes", move |handle| {
            let _ = inner.handle.set(handle.clone());
            run(inner)
        })
        .map_err(KubeError::Thread)
    }

    /// Asks the watches to stop (tests; the agent's process exit ends them otherwise).
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::Relaxed);
    }

    /// Ready once pods, namespaces and policies were each listed completely and no permission
    /// is missing. The error names what is missing.
    pub fn readiness(&self) -> Result<(), String> {
        let rbac = self.inner.rbac.lock().unwrap();
        if !rbac.is_empty() {
            return Err(rbac.values().cloned().collect::<Vec<_>>().join("; "));
        }
        drop(rbac);
        if let Some(e) = self.inner.client_error.lock().unwrap().as_ref() {
            return Err(format!("no client for the Kubernetes API server: {e}"));
        }
        let waiting: Vec<&str> = [
            (PODS, &self.inner.pods_synced),
            (NAMESPACES, &self.inner.namespaces_synced),
            (POLICIES, &self.inner.policies_synced),
        ]
        .into_iter()
        .filter(|(_, f)| !f.load(Ordering::Relaxed))
        .map(|(n, _)| n)
        .collect();
        if !waiting.is_empty() {
            return Err(format!(
                "waiting for the first complete list of {} from the Kubernetes API server",
                waiting.join(", ")
            ));
        }
        Ok(())
    }

    /// Whether the Node's `NetworkUnavailable=False` condition was written.
    pub fn node_condition_set(&self) -> bool {
        self.inner.node_condition_set.load(Ordering::Relaxed)
    }

    /// Whether this agent holds the Lease of the node garbage collector ([`gc`]).
    pub fn node_gc_leader(&self) -> bool {
        self.inner.gc_leader.load(Ordering::Relaxed)
    }

    /// Addresses the pod IPAM GC has released since start ([`gc`]).
    pub fn ipam_gc_released(&self) -> u64 {
        self.inner.ipam_gc_released.load(Ordering::Relaxed)
    }

    /// The Kubernetes source's lines of `/metrics`: whether this agent leads the garbage
    /// collection, and what the pod IPAM GC released.
    pub fn render_metrics(&self, node: &str, page: &mut Page) {
        page.gauge(
            "tern_gc_leader",
            "Whether this agent holds the Lease kube-system/tern-node-gc.",
        )
        .sample(&[("node", node)], self.node_gc_leader());
        page.counter(
            "tern_ipam_gc_released_total",
            "Addresses of pods gone or finished that the pod IPAM GC released.",
        )
        .sample(&[("node", node)], self.ipam_gc_released());
    }

    /// A node of the cluster as last seen by the node watch (`None` before the first list or
    /// for an unknown node).
    pub fn node(&self, name: &str) -> Option<NodeInfo> {
        self.inner.nodes.lock().unwrap().get(name).cloned()
    }

    /// Every node of the cluster in the cache, by name, and whether the first complete list
    /// arrived.
    pub fn nodes(&self) -> (Vec<NodeInfo>, bool) {
        let mut v: Vec<NodeInfo> = self.inner.nodes.lock().unwrap().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        (v, self.inner.nodes_synced.load(Ordering::Relaxed))
    }

    /// Number of pods of this node in the cache.
    pub fn cached_pods(&self) -> usize {
        self.inner.pods.lock().unwrap().len()
    }
}

/// The Kubernetes source the configuration asks for (`None` without `--kubernetes`), not yet
/// spawned.
pub fn from_config(
    cfg: &crate::config::AgentConfig,
    store: &Arc<dyn Store>,
    endpoint_store: &Arc<dyn Store>,
    policy: Option<Arc<dyn ExternalObjects>>,
) -> Result<Option<Kube>, KubeError> {
    if !cfg.kubernetes {
        return Ok(None);
    }
    let settings = KubeSettings {
        node_name: cfg.node_name.clone(),
        kubeconfig: cfg.kubeconfig.clone(),
        state_dir: cfg.state_dir.clone(),
        node_gc_grace: Duration::from_secs(cfg.node_gc_grace_seconds),
        lease_duration: gc::DEFAULT_LEASE_DURATION,
    };
    Kube::with_endpoint_store(settings, store.clone(), endpoint_store.clone(), policy).map(Some)
}

/// Puts what the API server says about `pod` into a new endpoint: labels (tern's derived
/// labels kept), named ports (the pod's replace the runtime's `args.cni.ports`, as every later
/// watch event would), and the UID when the runtime passed none.
pub fn apply_pod(ep: &mut Endpoint, pod: &PodInfo) {
    ep.labels = wep::desired_labels(&ep.labels, pod);
    // The pod spec is authoritative for named ports, as the watch path writes them.
    ep.ports = pod.ports.clone();
    if let Some(r) = ep.attachment.pod.as_mut()
        && r.uid.is_empty()
    {
        r.uid = pod.uid.clone();
    }
}

impl Inner {
    fn node(&self) -> &str {
        &self.settings.node_name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::label;
    use crate::testutil::port;
    use tern_model::Protocol;

    #[test]
    fn apply_pod_keeps_derived_labels_and_fills_the_uid() {
        let mut ep = Endpoint {
            node: "n1".into(),
            attachment: Attachment {
                pod: Some(tern_api::PodRef {
                    namespace: "prod".into(),
                    name: "web".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            host_ifname: String::new(),
            mac: None,
            ip_networks: vec![],
            labels: BTreeMap::from([
                ("tern.dev/orchestrator".to_string(), "k8s".to_string()),
                ("cni".to_string(), "x".to_string()),
            ]),
            ports: vec![port("cni", 1, Protocol::Tcp)],
            delegated_ipam: false,
        };
        let pod = PodInfo {
            namespace: "prod".into(),
            name: "web".into(),
            uid: "u1".into(),
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            service_account: "default".into(),
            ports: vec![port("http", 8080, Protocol::Tcp)],
            annotations: BTreeMap::new(),
        };
        apply_pod(&mut ep, &pod);
        assert_eq!(ep.ports, pod.ports);
        assert_eq!(ep.attachment.pod.as_ref().unwrap().uid, "u1");
        assert_eq!(label(&ep.labels, "app"), Some("web"));
        assert_eq!(ep.labels.get("cni"), None);
        assert_eq!(label(&ep.labels, "tern.dev/orchestrator"), Some("k8s"));
        assert_eq!(label(&ep.labels, SERVICE_ACCOUNT_LABEL), Some("default"));
    }
}
