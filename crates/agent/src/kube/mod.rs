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

pub mod annotations;
pub mod error;
pub mod feed;
pub mod gc;
pub mod slim;
pub mod wep;

pub use error::{AddError, AnnotationError, ApiError};
pub use slim::{NodeInfo, PodInfo};
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

    /// The pod an ADD is for: from the cache when its UID matches the runtime's
    /// (`K8S_POD_UID`), else by one GET. `Ok(None)` for attachments without a pod. "Try
    /// again" ([`AddError::code`]) when the API server cannot answer and the pod is not
    /// cached, or when it knows another incarnation of the pod.
    pub fn pod_for_add(&self, a: &Attachment) -> Result<Option<PodInfo>, AddError> {
        let Some(p) = &a.pod else {
            return Ok(None);
        };
        let key = (p.namespace.clone(), p.name.clone());
        if let Some(c) = self.inner.pods.lock().unwrap().get(&key)
            && (p.uid.is_empty() || c.uid == p.uid)
        {
            return Ok(Some(c.clone()));
        }
        let got =
            self.inner
                .get_pod(&p.namespace, &p.name)
                .map_err(|cause| AddError::PodUnreadable {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    cause,
                })?;
        let Some(info) = got else {
            return Err(AddError::PodNotFound {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            });
        };
        if !p.uid.is_empty() && info.uid != p.uid {
            return Err(AddError::PodRecreated {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                asked: p.uid.clone(),
                found: info.uid,
            });
        }
        Ok(Some(info))
    }

    /// Applies the IPAM annotations of `pod` and of its namespace to the IPAM part of an ADD
    /// ([`annotations::apply`]; `delegated` when another IPAM plugin chose the addresses):
    /// `Ok(Some(addresses))` when they are to be used without IPAM (`ipAddrsNoIpam`). Fails
    /// with [`AddError::BadAnnotation`] for a bad or refused annotation (naming the pod and
    /// the annotation), and with a "try again" error when the namespace cannot be read now.
    pub fn ipam_for_add(
        &self,
        pod: &PodInfo,
        req: &mut tern_api::IpamRequest,
        delegated: bool,
    ) -> Result<Option<Vec<std::net::IpAddr>>, AddError> {
        let ns_ann = self.namespace_annotations(&pod.namespace)?;
        if pod.annotations.is_empty() && ns_ann.is_empty() {
            return Ok(None);
        }
        let parsed = annotations::parse(&pod.namespace, &pod.name, &pod.annotations, &ns_ann)?;
        if parsed.is_empty() {
            return Ok(None);
        }
        log::debug!(
            "kubernetes: pod {}/{} IPAM annotations {parsed:?}",
            pod.namespace,
            pod.name
        );
        let store = self.inner.store.clone();
        let pools = move || -> Result<Vec<annotations::PoolRef>, AddError> {
            let (list, _) = tern_model::list_resources_skipping(&*store, Kind::IpPool)
                .map_err(|e| AddError::pools(&e))?;
            Ok(list
                .into_iter()
                .filter_map(|r| match r {
                    Resource::IpPool(p) => Some(annotations::PoolRef {
                        net: p.spec.net()?,
                        name: p.metadata.name,
                        cidr: p.spec.cidr,
                    }),
                    _ => None,
                })
                .collect())
        };
        annotations::apply(&pod.namespace, &pod.name, &parsed, req, delegated, &pools)
    }

    /// The IPAM annotations of namespace `ns`: from the cache, else by one GET ("try again"
    /// when the API server cannot answer).
    fn namespace_annotations(&self, ns: &str) -> Result<BTreeMap<String, String>, AddError> {
        if let Some(a) = self.inner.ns_annotations.lock().unwrap().get(ns) {
            return Ok(a.clone());
        }
        self.inner
            .get_namespace_annotations(ns)
            .map_err(|cause| AddError::NamespaceUnreadable {
                namespace: ns.to_string(),
                cause,
            })
    }

    /// Called after an ADD recorded `ep`: when the pod changed between the cache read and the
    /// write (the watch event found no endpoint yet), the endpoint is brought up to date now.
    pub fn endpoint_recorded(&self, ep: &Endpoint) {
        let Some(p) = &ep.attachment.pod else {
            return;
        };
        let cached = self
            .inner
            .pods
            .lock()
            .unwrap()
            .get(&(p.namespace.clone(), p.name.clone()))
            .cloned();
        let Some(pod) = cached else {
            return;
        };
        if (!p.uid.is_empty() && p.uid != pod.uid)
            || (wep::desired_labels(&ep.labels, &pod) == ep.labels && pod.ports == ep.ports)
        {
            return;
        }
        if let Err(e) = wep::sync_pod(
            &*self.inner.endpoint_store,
            &self.inner.settings.node_name,
            &pod,
        ) {
            log::warn!(
                "kubernetes: labelling pod {}/{}: {e}",
                pod.namespace,
                pod.name
            );
            self.inner.pods_dirty.store(true, Ordering::Relaxed);
        }
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

    fn snapshot_path(&self) -> PathBuf {
        self.settings.state_dir.join(SNAPSHOT_FILE)
    }

    fn load_snapshot(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let path = self.snapshot_path();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                log::warn!("kubernetes: reading {}: {e}", path.display());
                return;
            }
        };
        let docs: Vec<serde_json::Value> = match serde_json::from_slice(&text) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("kubernetes: ignoring unreadable {}: {e}", path.display());
                return;
            }
        };
        let objects: Vec<Resource> = docs
            .iter()
            .filter_map(|d| {
                let bytes = serde_json::to_vec(d).ok()?;
                Resource::from_json(&bytes)
                    .map_err(|e| log::warn!("kubernetes: snapshot entry skipped: {e}"))
                    .ok()
            })
            .collect();
        let n = objects.len();
        if let Err(e) = policy.replace(&[Kind::Namespace, Kind::K8sNetworkPolicy], objects, false) {
            log::warn!("kubernetes: seeding the policy engine: {e}");
        }
        log::info!(
            "kubernetes: {n} namespaces and policies from {} kept until the API server lists them",
            path.display()
        );
    }

    fn save_snapshot(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let path = self.snapshot_path();
        let tmp = path.with_extension("json.tmp");
        let written = policy
            .objects_json()
            .map_err(std::io::Error::other)
            .and_then(|b| {
                std::fs::create_dir_all(&self.settings.state_dir)?;
                std::fs::write(&tmp, b)?;
                std::fs::rename(&tmp, &path)
            });
        if let Err(e) = written {
            log::warn!("kubernetes: writing {}: {e}", path.display());
            self.snapshot_dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Runs one GET on the source's runtime and waits for it (at most [`GET_TIMEOUT`]): the
    /// API's answer, or why there is none (no client yet, timed out).
    fn get<T, F, Fut>(&self, request: F) -> Result<Result<T, ::kube::Error>, ApiError>
    where
        F: FnOnce(::kube::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, ::kube::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let (Some(h), Some(c)) = (self.handle.get(), self.client.get()) else {
            return Err(ApiError::NoClient);
        };
        let fut = request(c.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        h.spawn(async move {
            let r = tokio::time::timeout(GET_TIMEOUT, fut).await;
            let _ = tx.send(r);
        });
        match rx.recv_timeout(GET_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) | Err(_) => Err(ApiError::Timeout(GET_TIMEOUT)),
        }
    }

    fn get_pod(&self, ns: &str, name: &str) -> Result<Option<PodInfo>, ApiError> {
        let (ns, name) = (ns.to_string(), name.to_string());
        let got = self
            .get(move |c| async move { Api::<SlimPod>::namespaced(c, &ns).get_opt(&name).await })?;
        match got {
            Ok(p) => Ok(p.map(|p| PodInfo::from_pod(&p))),
            Err(e) => Err(ApiError::from_client("get", PODS, &e)),
        }
    }

    /// One GET of a namespace's metadata; a namespace that does not exist has no annotations.
    fn get_namespace_annotations(&self, ns: &str) -> Result<BTreeMap<String, String>, ApiError> {
        let name = ns.to_string();
        let got = self
            .get(move |c| async move { Api::<Namespace>::all(c).get_metadata_opt(&name).await })?;
        match got {
            Ok(m) => Ok(m
                .map(|m| annotations::relevant(m.metadata.annotations.as_ref()))
                .unwrap_or_default()),
            Err(e) => Err(ApiError::from_client("get", NAMESPACES, &e)),
        }
    }

    /// Keeps the cluster's nodes; a relist replaces them at `InitDone`. Changes of podCIDRs,
    /// deletion marks and removals are logged (a removed node's IPAM is released by [`gc`]).
    fn on_node(&self, buf: &mut Option<HashMap<String, NodeInfo>>, ev: watcher::Event<SlimNode>) {
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(n) => {
                let i = NodeInfo::from_node(&n);
                buf.get_or_insert_with(HashMap::new)
                    .insert(i.name.clone(), i);
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} nodes in the cluster", all.len());
                *self.nodes.lock().unwrap() = all;
                self.nodes_synced.store(true, Ordering::Relaxed);
                self.sync_own_node();
            }
            watcher::Event::Apply(n) => {
                let i = NodeInfo::from_node(&n);
                let before = self.nodes.lock().unwrap().insert(i.name.clone(), i.clone());
                if i.name == self.node()
                    && before.as_ref().map(|b| &b.pod_cidrs) != Some(&i.pod_cidrs)
                {
                    self.sync_own_node();
                }
                match before {
                    Some(b) if b == i => {}
                    Some(b) => {
                        if b.pod_cidrs != i.pod_cidrs || b.addresses != i.addresses {
                            log::info!(
                                "kubernetes: node {} now has addresses {:?}, podCIDRs {:?}",
                                i.name,
                                i.addresses,
                                i.pod_cidrs
                            );
                        }
                        if i.deleting && !b.deleting {
                            log::info!("kubernetes: node {} is being deleted", i.name);
                        }
                    }
                    None => log::info!(
                        "kubernetes: node {} added (addresses {:?}, podCIDRs {:?})",
                        i.name,
                        i.addresses,
                        i.pod_cidrs
                    ),
                }
            }
            watcher::Event::Delete(n) => {
                let i = NodeInfo::from_node(&n);
                self.nodes.lock().unwrap().remove(&i.name);
                log::info!("kubernetes: node {} deleted", i.name);
            }
        }
    }

    /// Mirrors this node's `spec.podCIDRs` from Kubernetes into tern's Node resource (CAS on
    /// its revision; the agent's own registration writes the other fields). Retried by the
    /// ticker while the store refuses or the Node is not registered yet.
    fn sync_own_node(&self) {
        let Some(info) = self.nodes.lock().unwrap().get(self.node()).cloned() else {
            return;
        };
        let want: Option<Vec<String>> = (!info.pod_cidrs.is_empty())
            .then(|| info.pod_cidrs.iter().map(|c| c.to_string()).collect());
        let mut result = Err(String::new());
        for _ in 0..5 {
            result = match tern_model::get_resource(&*self.store, Kind::Node, None, self.node()) {
                Ok(Some(Resource::Node(mut n))) => {
                    if n.spec.pod_cidrs == want {
                        Ok(false)
                    } else {
                        n.spec.pod_cidrs = want.clone();
                        match tern_model::put_resource(&*self.store, &Resource::Node(n)) {
                            Ok(_) => Ok(true),
                            Err(tern_model::ModelError::Conflict { .. }) => continue,
                            Err(e) => Err(e.to_string()),
                        }
                    }
                }
                Ok(_) => Err(format!("tern Node {} is not registered yet", self.node())),
                Err(e) => Err(e.to_string()),
            };
            break;
        }
        if let Err(e) = self.write_pod_cidrs_file(&info) {
            log::warn!("kubernetes: writing {}: {e}", tern_api::POD_CIDRS_FILE);
            result = Err(e.to_string());
        }
        match result {
            Ok(wrote) => {
                self.own_node_dirty.store(false, Ordering::Relaxed);
                if wrote {
                    log::info!(
                        "kubernetes: node {} podCIDRs {:?} written to tern's Node",
                        self.node(),
                        want.unwrap_or_default()
                    );
                }
            }
            Err(e) => {
                self.own_node_dirty.store(true, Ordering::Relaxed);
                log::debug!("kubernetes: node podCIDRs not written yet: {e}");
            }
        }
    }

    /// Records this node's podCIDRs in `<state_dir>/pod-cidrs.json` for the plugin's
    /// `usePodCidr` (written to a temporary file and renamed, so a reader never sees half).
    fn write_pod_cidrs_file(&self, info: &NodeInfo) -> std::io::Result<()> {
        let path = self.settings.state_dir.join(tern_api::POD_CIDRS_FILE);
        let body = serde_json::json!({
            "node": info.name,
            "podCIDRs": info.pod_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        });
        if std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v == body)
        {
            return Ok(());
        }
        std::fs::create_dir_all(&self.settings.state_dir)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, body.to_string())?;
        std::fs::rename(&tmp, &path)
    }

    /// Keeps the namespaces' IPAM annotations; a relist replaces them at `InitDone`.
    fn on_namespace_meta(
        &self,
        buf: &mut Option<HashMap<String, BTreeMap<String, String>>>,
        ev: &watcher::Event<::kube::core::PartialObjectMeta<Namespace>>,
    ) {
        let entry = |m: &::kube::core::PartialObjectMeta<Namespace>| {
            (
                m.metadata.name.clone().unwrap_or_default(),
                annotations::relevant(m.metadata.annotations.as_ref()),
            )
        };
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(m) => {
                let (k, v) = entry(m);
                buf.get_or_insert_with(HashMap::new).insert(k, v);
            }
            watcher::Event::InitDone => {
                *self.ns_annotations.lock().unwrap() = buf.take().unwrap_or_default();
            }
            watcher::Event::Apply(m) => {
                let (k, v) = entry(m);
                self.ns_annotations.lock().unwrap().insert(k, v);
            }
            watcher::Event::Delete(m) => {
                let (k, _) = entry(m);
                self.ns_annotations.lock().unwrap().remove(&k);
            }
        }
    }

    fn set_rbac(&self, resource: &'static str, msg: String) {
        let mut r = self.rbac.lock().unwrap();
        if r.get(resource) != Some(&msg) {
            log::error!("kubernetes: {msg}");
        }
        r.insert(resource, msg);
    }

    fn clear_rbac(&self, resource: &'static str) {
        let mut r = self.rbac.lock().unwrap();
        if r.remove(resource).is_some() {
            log::info!("kubernetes: {resource} readable again");
        }
    }

    fn sync_node_endpoints(&self) {
        let pods = self.pods.lock().unwrap().clone();
        match wep::sync_node(&*self.endpoint_store, self.node(), &pods) {
            Ok(n) => {
                self.pods_dirty.store(false, Ordering::Relaxed);
                if n > 0 {
                    log::info!("kubernetes: {n} endpoints relabelled from their pods");
                }
            }
            Err(e) => {
                self.pods_dirty.store(true, Ordering::Relaxed);
                log::warn!("kubernetes: writing pod labels to the endpoints: {e}");
            }
        }
    }

    fn on_pod(
        &self,
        buf: &mut Option<HashMap<(String, String), PodInfo>>,
        ev: watcher::Event<SlimPod>,
    ) {
        let key = |p: &PodInfo| (p.namespace.clone(), p.name.clone());
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(p) => {
                let i = PodInfo::from_pod(&p);
                buf.get_or_insert_with(HashMap::new).insert(key(&i), i);
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} pods on node {}", all.len(), self.node());
                *self.pods.lock().unwrap() = all;
                self.pods_synced.store(true, Ordering::Relaxed);
                self.sync_node_endpoints();
            }
            watcher::Event::Apply(p) => {
                let i = PodInfo::from_pod(&p);
                let before = self.pods.lock().unwrap().insert(key(&i), i.clone());
                if before.as_ref() != Some(&i) {
                    log::debug!("kubernetes: pod {}/{} changed", i.namespace, i.name);
                    if let Err(e) = wep::sync_pod(&*self.endpoint_store, self.node(), &i) {
                        log::warn!("kubernetes: labelling pod {}/{}: {e}", i.namespace, i.name);
                        self.pods_dirty.store(true, Ordering::Relaxed);
                    }
                }
            }
            watcher::Event::Delete(p) => {
                let i = PodInfo::from_pod(&p);
                // The endpoint stays until the runtime's DEL (the sandbox may still run).
                self.pods.lock().unwrap().remove(&key(&i));
            }
        }
    }

    /// Feeds namespace or policy events into the engine; the full list replaces the engine's
    /// objects of `kind` only at `InitDone`.
    fn on_object(
        &self,
        kind: Kind,
        synced: &AtomicBool,
        buf: &mut Option<Vec<Resource>>,
        ev: watcher::Event<Converted>,
    ) {
        let Some(policy) = &self.policy else {
            return;
        };
        let converted = |r: Converted| match r {
            Ok(r) => Some(r),
            Err((ns, name, e)) => {
                log::error!(
                    "kubernetes: {} {}{name} cannot be enforced: {e}",
                    kind.as_str(),
                    ns.map(|n| format!("{n}/")).unwrap_or_default()
                );
                None
            }
        };
        let result = match ev {
            watcher::Event::Init => {
                *buf = Some(Vec::new());
                Ok(())
            }
            watcher::Event::InitApply(r) => {
                if let Some(r) = converted(r) {
                    buf.get_or_insert_with(Vec::new).push(r);
                }
                Ok(())
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} {} objects listed", all.len(), kind.as_str());
                let r = policy.replace(&[kind], all, true);
                synced.store(true, Ordering::Relaxed);
                r
            }
            watcher::Event::Apply(r) => match converted(r) {
                Some(r) => policy.apply(r),
                None => Ok(()),
            },
            watcher::Event::Delete(r) => {
                let (ns, name) = match &r {
                    Ok(r) => (r.namespace().map(str::to_string), r.name().to_string()),
                    Err((ns, name, _)) => (ns.clone(), name.clone()),
                };
                policy.remove(kind, ns.as_deref(), &name)
            }
        };
        if let Err(e) = result {
            log::warn!("kubernetes: policy update: {e}");
        }
        self.snapshot_dirty.store(true, Ordering::Relaxed);
    }
}

/// A watched object in tern's form, or its identity (namespace, name) and why it could not be
/// converted.
type Converted = Result<Resource, (Option<String>, String, String)>;

/// A client error as one line; a 401/403 names the verb and resource the agent lacks.
fn describe_client_error(verb: &'static str, resource: &'static str, e: &::kube::Error) -> String {
    ApiError::from_client(verb, resource, e).to_string()
}

fn rbac_message(verb: &'static str, resource: &'static str, s: &::kube::core::Status) -> String {
    ApiError::forbidden(verb, resource, s).to_string()
}

/// Classifies a watcher error: `Some(message)` when it is a permission problem.
fn rbac_problem(resource: &'static str, e: &watcher::Error) -> Option<String> {
    let (verb, status) = match e {
        watcher::Error::InitialListFailed(::kube::Error::Api(s)) => ("list", s),
        watcher::Error::WatchStartFailed(::kube::Error::Api(s))
        | watcher::Error::WatchFailed(::kube::Error::Api(s)) => ("watch", s),
        watcher::Error::WatchError(s) => ("watch", s),
        _ => return None,
    };
    (status.code == 401 || status.code == 403).then(|| rbac_message(verb, resource, status))
}

/// A client of the API server of `kubeconfig` (`None`: kube-rs's inference order).
pub(crate) async fn make_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<::kube::Client, String> {
    let mut cfg = match kubeconfig {
        Some(p) => {
            let kc = ::kube::config::Kubeconfig::read_from(p).map_err(|e| e.to_string())?;
            ::kube::Config::from_custom_kubeconfig(
                kc,
                &::kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| e.to_string())?
        }
        None => ::kube::Config::infer().await.map_err(|e| e.to_string())?,
    };
    cfg.connect_timeout = Some(Duration::from_secs(5));
    ::kube::Client::try_from(cfg).map_err(|e| e.to_string())
}

/// Runs one watch until the agent stops, handing events to `on`; errors are retried with
/// kube-runtime's backoff (a 410 relists), permission errors are kept as problems.
async fn watch<K, T>(
    inner: Arc<Inner>,
    resource: &'static str,
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut on: T,
) where
    T: FnMut(&Inner, watcher::Event<K>),
{
    let mut s = std::pin::pin!(stream.default_backoff());
    while let Some(item) = s.next().await {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        match item {
            Ok(ev) => {
                inner.clear_rbac(resource);
                on(&inner, ev);
            }
            Err(e) => match rbac_problem(resource, &e) {
                Some(msg) => inner.set_rbac(resource, msg),
                None => match &e {
                    watcher::Error::WatchError(s) if s.code == 410 => {
                        log::info!("kubernetes: {resource} watch expired (410): relisting")
                    }
                    _ => log::warn!("kubernetes: {resource}: {e}; retrying"),
                },
            },
        }
    }
}

/// Converts a watched object, keeping its identity on failure for the log and for deletes.
fn convert<K>(
    ev: watcher::Event<K>,
    f: impl Fn(&K) -> (Option<String>, String, Result<Resource, String>),
) -> watcher::Event<Converted> {
    let c = |k: K| {
        let (ns, name, r) = f(&k);
        r.map_err(|e| (ns, name, e))
    };
    match ev {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(k) => watcher::Event::InitApply(c(k)),
        watcher::Event::Apply(k) => watcher::Event::Apply(c(k)),
        watcher::Event::Delete(k) => watcher::Event::Delete(c(k)),
    }
}

async fn run(inner: Arc<Inner>) {
    let client = loop {
        match make_client(inner.settings.kubeconfig.as_deref()).await {
            Ok(c) => {
                *inner.client_error.lock().unwrap() = None;
                break c;
            }
            Err(e) => {
                log::warn!("kubernetes: no client for the API server: {e}; retrying");
                *inner.client_error.lock().unwrap() = Some(e);
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let _ = inner.client.set(client.clone());
    log::info!(
        "kubernetes: watching pods of node {}, namespaces and networkpolicies",
        inner.node()
    );
    let pods = {
        let api: Api<SlimPod> = Api::all(client.clone());
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={}", inner.node()))
            .page_size(100);
        let mut buf = None;
        watch(inner.clone(), PODS, watcher(api, cfg), move |i, ev| {
            i.on_pod(&mut buf, ev)
        })
    };
    let namespaces = {
        // Metadata only: the API server sends PartialObjectMetadata, never the full object.
        let api: Api<::kube::core::PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let mut buf = None;
        let mut meta_buf = None;
        let cache = inner.clone();
        let s = watcher(api, watcher::Config::default()).map(move |r| {
            r.map(|ev| {
                cache.on_namespace_meta(&mut meta_buf, &ev);
                convert(ev, |m: &::kube::core::PartialObjectMeta<Namespace>| {
                    let name = m.metadata.name.clone().unwrap_or_default();
                    (None, name, slim::namespace_resource(&m.metadata))
                })
            })
        });
        watch(inner.clone(), NAMESPACES, s, move |i, ev| {
            i.on_object(Kind::Namespace, &i.namespaces_synced, &mut buf, ev)
        })
    };
    let policies = {
        let api: Api<NetworkPolicy> = Api::all(client.clone());
        let mut buf = None;
        let s = watcher(api, watcher::Config::default()).map(|r| {
            r.map(|ev| {
                convert(ev, |p: &NetworkPolicy| {
                    (
                        p.metadata.namespace.clone(),
                        p.metadata.name.clone().unwrap_or_default(),
                        slim::network_policy_resource(p),
                    )
                })
            })
        });
        watch(inner.clone(), POLICIES, s, move |i, ev| {
            i.on_object(Kind::K8sNetworkPolicy, &i.policies_synced, &mut buf, ev)
        })
    };
    let nodes = {
        let api: Api<SlimNode> = Api::all(client.clone());
        let mut buf = None;
        watch(
            inner.clone(),
            NODES,
            watcher(api, watcher::Config::default().page_size(100)),
            move |i, ev| i.on_node(&mut buf, ev),
        )
    };
    let node_gc = gc::run(inner.clone(), client.clone());
    let ticks = ticker(inner.clone(), client);
    if inner.policy.is_some() {
        tokio::join!(pods, namespaces, policies, nodes, ticks, node_gc);
    } else {
        // Namespaces still feed the IPAM annotation defaults.
        tokio::join!(pods, namespaces, nodes, ticks, node_gc);
    }
}

/// Once a second: write the snapshot when it changed, retry endpoint writes the store refused,
/// and set the Node condition once the agent is ready.
async fn ticker(inner: Arc<Inner>, client: ::kube::Client) {
    let mut last_patch = std::time::Instant::now() - Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        if inner.snapshot_dirty.swap(false, Ordering::Relaxed)
            && inner.namespaces_synced.load(Ordering::Relaxed)
            && inner.policies_synced.load(Ordering::Relaxed)
        {
            inner.save_snapshot();
        }
        if inner.pods_dirty.load(Ordering::Relaxed) {
            inner.sync_node_endpoints();
        }
        if inner.own_node_dirty.load(Ordering::Relaxed) {
            inner.sync_own_node();
        }
        let ready = inner.pods_synced.load(Ordering::Relaxed)
            && inner.namespaces_synced.load(Ordering::Relaxed)
            && inner.policies_synced.load(Ordering::Relaxed);
        if ready
            && !inner.node_condition_set.load(Ordering::Relaxed)
            && last_patch.elapsed() >= Duration::from_secs(5)
        {
            last_patch = std::time::Instant::now();
            match set_node_condition(&client, inner.node()).await {
                Ok(()) => {
                    inner.clear_rbac(NODE_STATUS);
                    inner.node_condition_set.store(true, Ordering::Relaxed);
                    log::info!(
                        "kubernetes: node {} condition NetworkUnavailable=False ({NODE_CONDITION_REASON})",
                        inner.node()
                    );
                }
                Err(::kube::Error::Api(s)) if s.code == 401 || s.code == 403 => {
                    inner.set_rbac(NODE_STATUS, rbac_message("patch", NODE_STATUS, &s))
                }
                Err(e) => log::debug!("kubernetes: node condition not set yet: {e}"),
            }
        }
    }
}

async fn set_node_condition(client: &::kube::Client, node: &str) -> Result<(), ::kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let now = rfc3339_now();
    let patch = serde_json::json!({
        "status": {
            "conditions": [{
                "type": "NetworkUnavailable",
                "status": "False",
                "reason": NODE_CONDITION_REASON,
                "message": "tern is running on this node",
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]
        }
    });
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
}

/// The current UTC time as RFC 3339 with second precision (`2026-12-01T08:00:00Z`).
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    // The jiff of k8s-openapi, whose own `Time` is a `jiff::Timestamp`.
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::label;
    use crate::testutil::port;
    use tern_model::Protocol;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_200 + 3661), "2026-12-01T01:01:01Z");
    }

    #[test]
    fn forbidden_names_verb_and_resource() {
        let s = ::kube::core::Status {
            code: 403,
            message: "pods is forbidden: User \"tern\" cannot list resource \"pods\"".into(),
            ..Default::default()
        };
        let e = watcher::Error::InitialListFailed(::kube::Error::Api(Box::new(s)));
        let m = rbac_problem(PODS, &e).expect("a permission problem");
        assert!(m.contains("may not list pods"), "{m}");
        assert!(m.contains("HTTP 403"), "{m}");
        let gone = ::kube::core::Status {
            code: 410,
            ..Default::default()
        };
        assert!(rbac_problem(PODS, &watcher::Error::WatchError(Box::new(gone))).is_none());
    }

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
            mac: String::new(),
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
