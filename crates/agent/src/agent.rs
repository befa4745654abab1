//! The agent: the root that wires the services (pod lifecycle, dataplane, policy, BGP, the
//! Kubernetes source, metrics) at start-up and hands each the others' parts it needs. The
//! socket server ([`crate::server`]), the maintenance loop ([`crate::reconcile`]) and the HTTP
//! endpoints ([`crate::http`]) are the root's other files.

use crate::config::AgentConfig;
use crate::endpoints::{Endpoint, Endpoints};
use crate::pod::{EndpointPolicy, PodConfig, PodForAdd, PodLifecycle, PodParts, PodSource};
use anyhow::Context;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{Attachment, ErrorReply, IpamRequest};
use tern_ipam::Ipam;
use tern_store::Store;

/// A running node agent.
pub struct Agent {
    pub(crate) cfg: AgentConfig,
    pub(crate) store: Arc<dyn Store>,
    /// The pod-lifecycle service (ADD, DEL, CHECK, GC, IPAM, journal, repair).
    pods: PodLifecycle,
    /// Pod MTU detected at start, used when nothing better is known.
    mtu: u32,
    /// Request counters and the reclamation counter.
    pub(crate) metrics: crate::metrics::Metrics,
    /// Milliseconds since `started` at the maintenance loop's last tick (liveness).
    heartbeat_ms: AtomicU64,
    /// The dataplane reconciler (routes, tunnels, natOutgoing, node registration); None when
    /// disabled by configuration.
    dataplane: Option<Arc<crate::dataplane::Dataplane>>,
    /// NetworkPolicy enforcement (table `inet tern`); present when the dataplane is.
    pub(crate) policy: Option<Arc<crate::policy::PolicyEngine>>,
    /// Stops the dataplane watch thread.
    dataplane_stop: Arc<AtomicBool>,
    /// The BGP speaker (`--bgp`).
    pub(crate) bgp: Option<Arc<crate::bgp::Bgp>>,
    /// The Kubernetes source (`--kubernetes`, see [`crate::kube`]).
    pub(crate) kube: Option<Arc<crate::kube::Kube>>,
    /// Flow records (see [`crate::flows`]); present when configured and the policy engine is.
    pub(crate) flows: Option<Arc<crate::flows::Flows>>,
    /// The socket server's admission state (connections served, refusals logged).
    pub(crate) gate: crate::admission::Gate,
    /// The cluster ID this node joined at start ([`crate::identity`]).
    cluster_id: String,
    /// Why the store stopped being trusted (file replaced or deleted, cluster ID changed), as
    /// last found by [`Agent::store_trust_problem`]; reported by `/readiness`.
    pub(crate) store_problem: Mutex<Option<String>>,
    /// Node prerequisites (sysctls) at the last check ([`crate::hostcheck`]).
    pub(crate) host: crate::hostcheck::HostState,
    started: Instant,
    stop: AtomicBool,
}

/// How long the agent waits at start for the first list of every cached class of the
/// Kubernetes datastore before it reads through to the API server.
const CACHE_SYNC_WAIT: Duration = Duration::from_secs(30);

/// The Kubernetes datastore behind the agent's copy of what it reads ([`crate::kube::feed`]):
/// the copy's watchers start now, and the agent waits (bounded) for their first lists, so
/// its start-up reads come from memory.
fn cached_kube_store(
    kube: Arc<dyn Store>,
    kubeconfig: Option<std::path::PathBuf>,
) -> anyhow::Result<Arc<dyn Store>> {
    let cache = tern_store::cache::Cache::new(crate::kube::feed::cached_classes());
    crate::kube::feed::spawn(cache.clone(), kubeconfig).context("starting the datastore feed")?;
    let t0 = Instant::now();
    let missing = cache.wait_synced(CACHE_SYNC_WAIT);
    if missing.is_empty() {
        log::info!(
            "datastore copy listed in {} ms: {}",
            t0.elapsed().as_millis(),
            cache
                .sizes()
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    } else {
        log::warn!(
            "datastore copy: not listed after {}s: {}; reading those from the API server",
            CACHE_SYNC_WAIT.as_secs(),
            missing.join(", ")
        );
    }
    Ok(Arc::new(tern_store::cache::CachedStore::new(kube, cache)))
}

impl Agent {
    /// Opens the store, creates the default pool if no pool exists, loads this node's endpoints,
    /// replays the release journal and reconciles the node's interfaces.
    pub fn start(cfg: AgentConfig) -> anyhow::Result<Arc<Agent>> {
        // `--store kubernetes`: the API server of `--kubeconfig` when given (else the pod's
        // service account or $KUBECONFIG), the one ternd watches pods on.
        let store: Arc<dyn Store> = match (cfg.store_url.as_str(), &cfg.kubeconfig) {
            ("kubernetes" | "kubernetes://", kubeconfig) => {
                let kube = match kubeconfig {
                    Some(path) => tern_store::kube::KubeConfig::from_kubeconfig(path),
                    None => tern_store::kube::KubeConfig::discover(None),
                }
                .and_then(tern_store::kube::KubeStore::connect)
                .with_context(|| {
                    let from = kubeconfig.as_ref().map(|p| p.display().to_string());
                    format!(
                        "opening store kubernetes ({})",
                        from.as_deref().unwrap_or("in-cluster or $KUBECONFIG")
                    )
                })?;
                cached_kube_store(Arc::new(kube), kubeconfig.clone())?
            }
            _ => tern_store::etcd::open_with_tls(
                &cfg.store_url,
                cfg.etcd_ca.as_deref(),
                cfg.etcd_cert.as_deref(),
                cfg.etcd_key.as_deref(),
            )
            .with_context(|| format!("opening store {}", cfg.store_url))?,
        };
        Agent::start_with_store(cfg, store)
    }

    /// As [`Agent::start`], on a store the caller opened (`cfg.store_url` is then only
    /// informative). Lets tests wrap the store, e.g. to simulate an outage.
    pub fn start_with_store(cfg: AgentConfig, store: Arc<dyn Store>) -> anyhow::Result<Arc<Agent>> {
        // A prefix that shortens the name digest or matches other software's devices would
        // make reconciliation delete interfaces that are not tern's.
        tern_linux::validate_interface_prefix(&cfg.interface_prefix)
            .map_err(|e| anyhow::anyhow!("--interface-prefix (TERN_INTERFACE_PREFIX): {e}"))?;
        // First, before anything writes to the store or looks for orphans: is this the store
        // the node's pods were recorded in? (An empty or foreign one is refused while pods run.)
        let joining = crate::identity::Joining {
            node_name: &cfg.node_name,
            store_url: &cfg.store_url,
            state_dir: &cfg.state_dir,
            interface_prefix: &cfg.interface_prefix,
            accept_new_store: cfg.accept_new_store,
        };
        let cluster_id = crate::identity::establish(&joining, &*store)?;
        // One default pool per family asked for (an empty IPv4 CIDR: none, IPv6-only).
        let defaults = [Some(&cfg.default_ipv4_pool), cfg.default_ipv6_pool.as_ref()];
        for cidr in defaults.into_iter().flatten().filter(|c| !c.is_empty()) {
            match Ipam::new(store.clone()).ensure_default_pool(cidr) {
                Ok(true) => log::info!("created a default IPPool ({cidr})"),
                Ok(false) => {}
                Err(e) => log::warn!("cannot check IP pools now (will serve anyway): {e}"),
            }
        }
        let endpoint_store =
            crate::endpoints::open_store(&store, &cfg.state_dir, &cfg.node_name)
                .with_context(|| format!("opening the endpoint store of node {}", cfg.node_name))?;
        // The node's own endpoints come from there when it is not the datastore.
        let local_endpoints =
            (!Arc::ptr_eq(&endpoint_store, &store)).then(|| endpoint_store.clone());
        let endpoints = match Endpoints::load(endpoint_store.clone(), &cfg.node_name) {
            Ok(e) => e,
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("loading endpoints of node {}", cfg.node_name)));
            }
        };
        let policy = if cfg.dataplane {
            Some(Arc::new(
                crate::policy::PolicyEngine::load_with(
                    store.clone(),
                    local_endpoints.clone(),
                    &cfg.node_name,
                )
                .context("loading network policy")?,
            ))
        } else {
            None
        };
        // Flow records change the compiled table: set before its first apply.
        let flows = match (&policy, cfg.flows) {
            (Some(p), Some(fc)) => {
                p.set_flow_log(Some(tern_policy::FlowLog { group: fc.group }));
                Some(Arc::new(crate::flows::Flows::new(&cfg.node_name, fc)))
            }
            _ => None,
        };
        // Before the dataplane's first sync (the engine's first apply): seeds the engine with
        // the last Kubernetes snapshot so the previous rules stay in force.
        let external = policy
            .clone()
            .map(|p| p as Arc<dyn crate::external::ExternalObjects>);
        let kube = crate::kube::from_config(&cfg, &store, &endpoint_store, external)?.map(Arc::new);
        let dataplane = if cfg.dataplane {
            Some(Arc::new(start_dataplane(
                &cfg,
                &store,
                local_endpoints,
                policy.clone(),
            )?))
        } else {
            None
        };
        if let Some(k) = &kube {
            k.spawn()?;
        }
        let bgp = if cfg.bgp {
            let settings = crate::bgp::BgpSettings {
                node_name: cfg.node_name.clone(),
                node_ip: cfg.node_ip,
                node_ip6: cfg.node_ip6,
                use_pod_cidr: cfg.use_pod_cidr,
            };
            Some(crate::bgp::Bgp::start(settings, store.clone()).context("starting BGP")?)
        } else {
            None
        };
        let mtu = if cfg.mtu > 0 {
            cfg.mtu
        } else if let Some(m) = dataplane.as_ref().map(|d| d.pod_mtu()).filter(|m| *m > 0) {
            // The underlay MTU minus the encapsulation overhead of the pools.
            m
        } else {
            crate::host::detect_mtu()
        };
        let pods = PodLifecycle::new(
            PodConfig {
                node_name: cfg.node_name.clone(),
                interface_prefix: cfg.interface_prefix.clone(),
                state_dir: cfg.state_dir.clone(),
                accept_new_store: cfg.accept_new_store,
                leak_grace: Duration::from_secs(cfg.leak_grace_seconds),
            },
            PodParts {
                store: store.clone(),
                endpoints,
                kernel: crate::pod::system_kernel(),
                policy: policy
                    .clone()
                    .map(|p| Arc::new(PolicyHook(p)) as Arc<dyn EndpointPolicy>),
                pods: kube
                    .clone()
                    .map(|k| Arc::new(KubePods(k)) as Arc<dyn PodSource>),
                host_netns: crate::pod::host_netns_ids(),
            },
        )?;
        let agent = Arc::new(Agent {
            cfg,
            store,
            pods,
            mtu,
            metrics: crate::metrics::Metrics::default(),
            heartbeat_ms: AtomicU64::new(0),
            dataplane,
            policy,
            dataplane_stop: Arc::new(AtomicBool::new(false)),
            bgp,
            kube,
            flows,
            gate: crate::admission::Gate::default(),
            cluster_id,
            store_problem: Mutex::new(None),
            host: crate::hostcheck::HostState::default(),
            started: Instant::now(),
            stop: AtomicBool::new(false),
        });
        if agent.dataplane.is_none()
            && let Err(e) = agent.register_node()
        {
            log::warn!("cannot record Node {} now: {e}", agent.cfg.node_name);
        }
        let report = agent.reconcile();
        if report.journal_pending > 0 {
            agent.pods.set_journal_dirty(true);
        }
        // What the start-up reads (the datastore copy's lists, the first loads) freed.
        crate::metrics::trim_heap();
        log::info!(
            "ternd node {} ready: {} endpoints, mtu {}; start-up reconcile: {report}",
            agent.cfg.node_name,
            agent.pods.endpoint_count(),
            agent.mtu
        );
        Ok(agent)
    }

    /// The MTU for a new pod: the configured one, else the dataplane's current figure (underlay
    /// minus the encapsulation the pools use now), else what was detected at start.
    pub fn pod_mtu(&self) -> u32 {
        if self.cfg.mtu > 0 {
            return self.cfg.mtu;
        }
        self.dataplane()
            .map(|d| d.pod_mtu())
            .filter(|m| *m > 0)
            .unwrap_or(self.mtu)
    }

    /// Records this node as a Node resource with the addresses of its default-route interface
    /// (keeping fields other components set, such as BGP and tunnel addresses).
    fn register_node(&self) -> anyhow::Result<()> {
        use tern_model::{Kind, Node, NodeAddress, NodeSpec, Resource};
        let addresses: Vec<NodeAddress> = crate::host::node_addresses()
            .into_iter()
            .map(|a| NodeAddress {
                address: a.to_string(),
                kind: Some("InternalIP".into()),
            })
            .collect();
        let existing =
            tern_model::get_resource(&*self.store, Kind::Node, None, &self.cfg.node_name)?;
        let node = match existing {
            Some(Resource::Node(mut n)) => {
                if n.spec.addresses == addresses {
                    return Ok(());
                }
                n.spec.addresses = addresses;
                n
            }
            _ => Node::new(
                self.cfg.node_name.clone(),
                NodeSpec {
                    addresses,
                    ..Default::default()
                },
            ),
        };
        tern_model::put_resource(&*self.store, &Resource::Node(node))?;
        Ok(())
    }

    /// Starts the maintenance thread (journal replay, reconciliation, leak repair). [`Agent::serve`]
    /// calls it; public for tests that drive the agent without a socket.
    pub fn start_maintenance(self: &Arc<Self>) -> anyhow::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || me.maintenance_loop())
            .context("spawning maintenance thread")?;
        if let Some(dp) = &self.dataplane {
            dp.spawn_watch(self.dataplane_stop.clone())
                .context("spawning the dataplane watch thread")?;
        }
        if let Some(p) = &self.policy {
            p.spawn_watch(self.dataplane_stop.clone())
                .context("spawning the policy watch thread")?;
            if let Some(f) = &self.flows {
                let model = Arc::new(FlowPolicyModel {
                    policy: p.clone(),
                    store: self.store.clone(),
                });
                f.spawn(model, self.dataplane_stop.clone())
                    .context("spawning the flow records thread")?;
            }
        }
        Ok(())
    }

    /// True once [`Agent::shutdown`] was called.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Time since the maintenance loop last ticked (since start if it never ran).
    pub fn heartbeat_age(&self) -> Duration {
        let now = self.started.elapsed();
        now.saturating_sub(Duration::from_millis(
            self.heartbeat_ms.load(Ordering::Relaxed),
        ))
    }

    /// Addresses released by leak repair since start.
    pub fn gc_reclamations(&self) -> u64 {
        self.metrics.gc_reclamations()
    }

    /// The cluster ID this agent joined at start.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Asks the serve loop and maintenance thread to stop.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.dataplane_stop.store(true, Ordering::Relaxed);
        if let Some(dp) = &self.dataplane {
            dp.revoke();
        }
        if let Some(b) = &self.bgp {
            b.stop_for_restart();
        }
        // Wake the accept loop.
        let _ = UnixStream::connect(&self.cfg.socket);
    }

    /// Records that the maintenance loop is alive (see [`Agent::heartbeat_age`]).
    pub(crate) fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }

    /// The dataplane reconciler, when enabled.
    pub fn dataplane(&self) -> Option<&Arc<crate::dataplane::Dataplane>> {
        self.dataplane.as_ref()
    }

    /// STATUS: the Kubernetes source is ready, then the pod lifecycle's datastore and pools.
    pub(crate) fn status(&self) -> tern_api::Response {
        if let Some(k) = &self.kube
            && let Err(e) = k.readiness()
        {
            return Err(ErrorReply {
                code: tern_cni::code::NOT_AVAILABLE,
                msg: format!("ternd is not ready: {e}"),
                details: String::new(),
            });
        }
        self.pods.status()
    }

    /// The pod-lifecycle service.
    pub fn pods(&self) -> &PodLifecycle {
        &self.pods
    }

    /// The host-side veth name of an attachment.
    pub fn host_ifname(&self, a: &Attachment) -> String {
        self.pods.host_ifname(a)
    }
}

/// Creates the dataplane reconciler and runs its start-up sync (before the agent serves, so
/// pods created at once get the computed MTU and routes exist). A `--node-ip` that is not on
/// a local interface is fatal; every other dataplane problem is reported and retried.
fn start_dataplane(
    cfg: &AgentConfig,
    store: &Arc<dyn Store>,
    endpoint_store: Option<Arc<dyn Store>>,
    policy: Option<Arc<crate::policy::PolicyEngine>>,
) -> anyhow::Result<crate::dataplane::Dataplane> {
    let dp = crate::dataplane::Dataplane::new(
        crate::dataplane::DataplaneConfig {
            node_name: cfg.node_name.clone(),
            node_ip: cfg.node_ip,
            node_ip6: cfg.node_ip6,
            interface_prefix: cfg.interface_prefix.clone(),
            mtu: cfg.mtu,
        },
        store.clone(),
    )
    .context("--node-ip")?;
    if let Some(s) = endpoint_store {
        dp.set_endpoint_store(s);
    }
    // Before the first sync: with BGP, direct routes must never be installed over BGP's.
    dp.set_bgp_routing(cfg.bgp);
    dp.set_pod_cidr_routing(cfg.use_pod_cidr);
    if let Err(e) = dp.keepalive() {
        log::warn!("node liveness lease: {e}");
    }
    // Before the first sync: its natOutgoing chains and the policy chains then replace the
    // table left by the previous agent in one transaction (no allow-all window).
    if let Some(p) = policy {
        dp.attach_policy(p);
    }
    let r = dp.sync();
    log::info!(
        "dataplane start-up sync: {} routes set, {} removed, pod MTU {}, {} problems",
        r.routes_set,
        r.routes_removed,
        dp.pod_mtu(),
        r.errors.len()
    );
    Ok(dp)
}

/// The policy engine as the pod lifecycle asks it.
struct PolicyHook(Arc<crate::policy::PolicyEngine>);

impl EndpointPolicy for PolicyHook {
    fn endpoint_added(&self, ep: &Endpoint) -> Result<(), String> {
        self.0
            .endpoint_added(crate::policy::local_endpoint(ep))
            .map_err(|e| e.to_string())
    }
    fn endpoint_removed(&self, namespace: &str, name: &str) -> Result<(), String> {
        self.0
            .endpoint_removed(namespace, name)
            .map_err(|e| e.to_string())
    }
}

/// The policy engine and the store's nodes as the flow records ask them.
struct FlowPolicyModel {
    policy: Arc<crate::policy::PolicyEngine>,
    store: Arc<dyn Store>,
}

impl crate::flows::FlowModel for FlowPolicyModel {
    fn with_policy_set(&self, f: &mut dyn FnMut(&tern_policy::PolicySet)) {
        self.policy.with_policy_set(f)
    }

    fn generation(&self) -> u64 {
        self.policy.generation()
    }

    fn hosts(&self) -> crate::flows::resolve::Hosts {
        let mut hosts = crate::flows::resolve::Hosts::default();
        match crate::snapshot::load_snapshot(&*self.store) {
            Ok(s) => {
                for n in s.nodes {
                    for a in &n.addresses {
                        hosts.by_ip.insert(a.addr(), n.name.clone());
                    }
                    if let Some(t) = n.vxlan_tunnel_addr {
                        hosts.by_ip.insert(t, n.name.clone());
                    }
                }
            }
            Err(e) => log::debug!("flows: cannot read the nodes now: {e}"),
        }
        hosts
    }
}

/// The Kubernetes source as the pod lifecycle asks it.
struct KubePods(Arc<crate::kube::Kube>);

impl PodSource for KubePods {
    fn pod_for_add(
        &self,
        a: &Attachment,
        ipam: &mut IpamRequest,
        delegated: bool,
    ) -> Result<Option<PodForAdd>, ErrorReply> {
        let coded = |e: crate::kube::AddError| ErrorReply {
            code: e.code(),
            msg: e.to_string(),
            details: String::new(),
        };
        let Some(pod) = self.0.pod_for_add(a).map_err(coded)? else {
            return Ok(None);
        };
        let no_ipam = self.0.ipam_for_add(&pod, ipam, delegated).map_err(coded)?;
        Ok(Some(PodForAdd {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            no_ipam,
            apply: Box::new(move |ep| crate::kube::apply_pod(ep, &pod)),
        }))
    }

    fn endpoint_recorded(&self, ep: &Endpoint) {
        self.0.endpoint_recorded(ep);
    }
}

/// The Kubernetes source's objects in the policy engine, as the root wires the two.
#[cfg(test)]
mod kube_policy_tests {
    use crate::kube::slim;
    use crate::policy::PolicyEngine;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tern_model::{Kind, Resource};
    use tern_store::Store;

    fn pol_chains(p: &PolicyEngine) -> usize {
        p.desired()
            .render_full()
            .lines()
            .filter(|l| l.starts_with("add chain inet tern pol-"))
            .count()
    }

    /// The objects the Kubernetes source feeds survive the engine's store resync, and a full list
    /// replaces only the kinds it covers.
    #[test]
    fn external_objects_survive_a_store_reload_and_lists_replace_them() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        // A local endpoint the policy selects.
        let mut inc_ep = tern_policy::Endpoint {
            namespace: "prod".into(),
            name: "n1-k8s-web-eth0".into(),
            node: "n1".into(),
            interface: "tern0123456789a".into(),
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]).into(),
            ips: vec!["10.244.0.5".parse().unwrap()],
            ports: vec![],
        };
        Arc::make_mut(&mut inc_ep.labels).insert(
            crate::endpoints::NAMESPACE_LABEL.to_string(),
            "prod".to_string(),
        );
        let ep = Resource::WorkloadEndpoint({
            let mut w = tern_model::WorkloadEndpoint::new(
                inc_ep.name.clone(),
                tern_model::WorkloadEndpointSpec {
                    node: "n1".into(),
                    orchestrator: "k8s".into(),
                    pod: "web".into(),
                    container_id: "c1".into(),
                    endpoint: "eth0".into(),
                    interface_name: inc_ep.interface.clone(),
                    mac: String::new(),
                    ip_networks: vec!["10.244.0.5/32".parse().unwrap()],
                    network: "k8s-pod-network".into(),
                    profiles: vec![],
                    service_account_name: None,
                    ports: vec![],
                },
            );
            w.metadata.namespace = Some("prod".into());
            w.metadata.labels = (*inc_ep.labels).clone();
            w
        });
        tern_model::put_resource(&*store, &ep).unwrap();
        // Loaded with the endpoint, so the engine compiles the policy (only policies selecting
        // a local endpoint have chains).
        let engine = Arc::new(PolicyEngine::load(store.clone(), "n1").unwrap());
        let np: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "deny", "namespace": "prod"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                         "policyTypes": ["Ingress"]}
            }))
            .unwrap();
        let r = slim::network_policy_resource(&np).unwrap();
        engine
            .external_replace(&[Kind::K8sNetworkPolicy], vec![r.clone()], false)
            .unwrap();
        // What a store reload (the maintenance resync) computes keeps the external policy.
        let reloaded = crate::policy::load_policy_set(&*store).unwrap();
        let mut set = reloaded;
        for o in engine.external_objects() {
            set.apply(&o).unwrap();
        }
        let inc = tern_policy::Incremental::new("n1", set);
        assert!(
            inc.desired()
                .render_full()
                .lines()
                .any(|l| l.starts_with("add chain inet tern pol-")),
            "external policy lost on reload"
        );
        assert_eq!(engine.external_objects(), vec![r]);
        assert!(pol_chains(&engine) > 0);
        // A namespace list does not touch policies; an empty policy list removes them.
        engine
            .external_replace(&[Kind::Namespace], vec![], false)
            .unwrap();
        assert!(pol_chains(&engine) > 0);
        engine
            .external_replace(&[Kind::K8sNetworkPolicy], vec![], false)
            .unwrap();
        assert_eq!(pol_chains(&engine), 0);
        assert!(engine.external_objects().is_empty());
    }
}
