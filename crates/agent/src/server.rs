//! The agent: start-up, the socket server and the maintenance loop.

use crate::config::AgentConfig;
use crate::endpoints::Endpoints;
use anyhow::Context;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{Attachment, ErrorReply, FrameError, Request, Response};
use tern_cni::code;

pub use crate::config::MAX_CONNECTIONS;
/// Time a client has to send its whole request, however it paces the bytes.
pub const REQUEST_READ_DEADLINE: Duration = Duration::from_secs(10);
/// Time the agent waits for a client to take its reply.
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Error code of a caller refused by the peer-credential check (tern's codes start at 100;
/// 100-104 are the agent's request errors in [`tern_cni::code`]).
pub const CODE_NOT_PERMITTED: u32 = 110;
/// `SO_PEERGROUPS` (Linux 4.13): the peer's supplementary groups at connect time.
const SO_PEERGROUPS: libc::c_int = 59;
use tern_ipam::Ipam;
use tern_store::Store;

/// A running node agent.
pub struct Agent {
    pub(crate) cfg: AgentConfig,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) ipam: Ipam,
    pub(crate) endpoints: Endpoints,
    /// Pod MTU used when a request does not set one.
    pub(crate) mtu: u32,
    /// Host interfaces being created by an ADD that has not yet recorded its endpoint; the
    /// reconciler must not mistake them for leftovers.
    pub(crate) in_flight: crate::claims::Claims,
    /// Host interfaces a DEL has detached and the reaper thread has yet to delete.
    pub(crate) reaper: crate::reaper::Reaper,
    /// IPAM handles of ADDs (tern and standalone IPAM) between "about to allocate" and
    /// "endpoint recorded / reply sent": leak repair must not take their addresses.
    pub(crate) in_flight_handles: crate::claims::Claims,
    /// Leak-repair suspects and when they were first seen.
    pub(crate) leaks: crate::leak::LeakTracker,
    /// Request counters and the reclamation counter.
    pub(crate) metrics: crate::metrics::Metrics,
    /// Set when a release was journaled: the maintenance loop retries every few seconds until
    /// the journal is empty, instead of waiting for the next resync.
    pub(crate) journal_dirty: AtomicBool,
    /// Milliseconds since `started` at the maintenance loop's last tick (liveness).
    heartbeat_ms: AtomicU64,
    /// The dataplane reconciler (routes, tunnels, natOutgoing, node registration); None when
    /// disabled by configuration.
    pub(crate) dataplane: Option<Arc<crate::dataplane::Dataplane>>,
    /// NetworkPolicy enforcement (table `inet tern`); present when the dataplane is.
    pub(crate) policy: Option<Arc<crate::policy::PolicyEngine>>,
    /// Stops the dataplane watch thread.
    dataplane_stop: Arc<AtomicBool>,
    /// The BGP speaker (`--bgp`).
    pub(crate) bgp: Option<Arc<crate::bgp::Bgp>>,
    /// The Kubernetes source (`--kubernetes`, see [`crate::kube`]).
    pub(crate) kube: Option<crate::kube::Kube>,
    /// (st_dev, st_ino) of the namespaces no pod may be wired into: the agent's own network
    /// namespace (the node's) and that of PID 1 when it differs.
    pub(crate) host_netns: Vec<(u64, u64)>,
    /// Connections being served on the socket (bounded by `cfg.max_connections`).
    connections: AtomicUsize,
    /// Refusals logged at most once a second, with a count of those not logged.
    refusals: RateLimitedLog,
    /// The cluster ID this node joined at start ([`crate::identity`]).
    pub(crate) cluster_id: String,
    /// Why the store stopped being trusted (file replaced or deleted, cluster ID changed), as
    /// last found by [`Agent::store_trust_problem`]; reported by `/readiness`.
    pub(crate) store_problem: Mutex<Option<String>>,
    /// Why the last reconciliation kept pod interfaces the store does not know (the
    /// mass-deletion guard of `reconcile_interfaces`), for `/readiness`.
    pub(crate) orphan_problem: Mutex<Option<String>>,
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
        let ipam = Ipam::new(store.clone());
        match ipam.ensure_default_pool(&cfg.default_ipv4_pool) {
            Ok(true) => log::info!(
                "created IPPool default-ipv4-ippool ({})",
                cfg.default_ipv4_pool
            ),
            Ok(false) => {}
            Err(e) => log::warn!("cannot check IP pools now (will serve anyway): {e}"),
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
        // Before the dataplane's first sync (the engine's first apply): seeds the engine with
        // the last Kubernetes snapshot so the previous rules stay in force.
        let external = policy
            .clone()
            .map(|p| p as Arc<dyn crate::external::ExternalObjects>);
        let kube = crate::kube::from_config(&cfg, &store, &endpoint_store, external)?;
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
        let agent = Arc::new(Agent {
            cfg,
            store,
            ipam,
            endpoints,
            mtu,
            in_flight: crate::claims::Claims::default(),
            reaper: crate::reaper::Reaper::start()?,
            in_flight_handles: crate::claims::Claims::default(),
            leaks: crate::leak::LeakTracker::default(),
            metrics: crate::metrics::Metrics::default(),
            journal_dirty: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            dataplane,
            policy,
            dataplane_stop: Arc::new(AtomicBool::new(false)),
            bgp,
            kube,
            host_netns: host_netns_ids(),
            connections: AtomicUsize::new(0),
            refusals: RateLimitedLog::default(),
            cluster_id,
            store_problem: Mutex::new(None),
            orphan_problem: Mutex::new(None),
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
            agent.journal_dirty.store(true, Ordering::Relaxed);
        }
        // What the start-up reads (the datastore copy's lists, the first loads) freed.
        crate::metrics::trim_heap();
        log::info!(
            "ternd node {} ready: {} endpoints, mtu {}; start-up reconcile: {report}",
            agent.cfg.node_name,
            agent.endpoints.len(),
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

    /// Binds the socket and serves until [`Agent::shutdown`]; also runs the maintenance loop.
    ///
    /// The socket is the agent's trust boundary: it is created `0660 root:<socket_group>`
    /// whatever the umask, each connection's peer credentials are checked (uid 0, the agent's
    /// own uid, or a member of `socket_group`), at most `max_connections` are served at once,
    /// each must deliver its request within [`REQUEST_READ_DEADLINE`], and every descriptor it
    /// passes is checked (see `Agent::serve_stream`).
    pub fn serve(self: &Arc<Self>) -> anyhow::Result<()> {
        let listener = bind(&self.cfg.socket, self.cfg.socket_group)?;
        log::info!(
            "listening on {} (mode 0660, group {})",
            self.cfg.socket.display(),
            self.cfg.socket_group
        );
        self.start_http();
        self.start_maintenance()?;
        self.accept_loop(&listener);
        Ok(())
    }

    /// Serves connections of an already bound `listener` until [`Agent::shutdown`] (which wakes
    /// it by connecting to `cfg.socket`). Public for tests that bind the socket themselves.
    pub fn accept_loop(self: &Arc<Self>, listener: &UnixListener) {
        for conn in listener.incoming() {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            match conn {
                Ok(stream) => self.accept(stream),
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    // EMFILE and friends: do not spin.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Admits one connection: checks its credentials and the connection cap (both answered at
    /// once, without reading, so the accept loop never waits on a client), then serves it on a
    /// thread of its own.
    fn accept(self: &Arc<Self>, stream: UnixStream) {
        if let Err(e) = self.authorize(&stream) {
            self.refusals.warn(&format!("refused a caller: {}", e.msg));
            refuse(stream, e);
            return;
        }
        let limit = self.cfg.max_connections.max(1);
        let prev = self.connections.fetch_add(1, Ordering::AcqRel);
        if prev >= limit {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            let msg = format!(
                "ternd is busy: {prev} requests are being served (limit {limit}, --max-connections); retry"
            );
            self.refusals.warn(&msg);
            refuse(
                stream,
                ErrorReply {
                    code: code::TRY_AGAIN_LATER,
                    msg,
                    details: String::new(),
                },
            );
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("request".into())
            .spawn(move || {
                // Gives the slot back even if serving panics.
                struct Slot<'a>(&'a AtomicUsize);
                impl Drop for Slot<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                let _slot = Slot(&me.connections);
                me.serve_stream(stream);
            });
        if let Err(e) = spawned {
            self.connections.fetch_sub(1, Ordering::AcqRel);
            log::error!("cannot spawn request thread: {e}");
        }
    }

    /// The peer-credential check: uid 0, the agent's own uid, or a member (primary or
    /// supplementary) of the configured socket group.
    fn authorize(&self, stream: &UnixStream) -> Result<(), ErrorReply> {
        let denied = |msg: String| ErrorReply {
            code: CODE_NOT_PERMITTED,
            msg,
            details: String::new(),
        };
        let cred = peer_cred(stream.as_fd())
            .map_err(|e| denied(format!("cannot read the caller's credentials: {e}")))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let group = self.cfg.socket_group;
        if cred.uid == 0 || cred.uid == me || cred.gid == group {
            return Ok(());
        }
        if peer_groups(stream.as_fd()).is_ok_and(|g| g.contains(&group)) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied: uid {} (pid {}, gid {}) is neither root nor a member of group {group} (ternd --socket-group)",
            cred.uid, cred.pid, cred.gid
        )))
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

    /// Reads one request (bounded by [`tern_api::MAX_FRAME`] and [`REQUEST_READ_DEADLINE`]),
    /// checks the descriptors that came with it, serves it and replies. ADD and CHECK must carry
    /// exactly one descriptor, a network namespace other than the host's; every other request
    /// none. A refused request gets an error reply and every descriptor received is closed.
    fn serve_stream(&self, stream: UnixStream) {
        let _ = stream.set_write_timeout(Some(REPLY_WRITE_TIMEOUT));
        let deadline = Instant::now() + REQUEST_READ_DEADLINE;
        let frame = match tern_api::read_frame_limited(&stream, tern_api::MAX_FRAME, Some(deadline))
        {
            Ok(f) => f,
            Err(FrameError::Closed) => return,
            // Refused at the second descriptor, which the read has closed already.
            Err(e @ FrameError::TooManyFds { .. }) => {
                self.refusals.warn(&format!("refused a request: {e}"));
                reply(
                    &stream,
                    &Err(ErrorReply {
                        code: code::INVALID_ENV,
                        msg: format!("CNI_NETNS: {e}; exactly one network namespace is expected"),
                        details: String::new(),
                    }),
                );
                return;
            }
            Err(e @ (FrameError::TooLarge { .. } | FrameError::Deadline(_))) => {
                let code = match e {
                    FrameError::TooLarge { .. } => code::INVALID_CONFIG,
                    _ => code::DECODE,
                };
                self.refusals.warn(&format!("refused a request: {e}"));
                reply(
                    &stream,
                    &Err(ErrorReply {
                        code,
                        msg: format!("ternd refused the request: {e}"),
                        details: String::new(),
                    }),
                );
                return;
            }
            Err(e) => {
                log::debug!("dropping connection: {e}");
                return;
            }
        };
        let resp: Response = match serde_json::from_slice::<Request>(&frame.body) {
            Ok(req) => match self.check_fds(&req, frame.fds, frame.fds_truncated) {
                Ok(fd) => self.handle(req, fd),
                Err(e) => {
                    self.refusals
                        .warn(&format!("refused {}: {}", op_name(&req), e.msg));
                    Err(e)
                }
            },
            Err(e) => Err(ErrorReply {
                code: code::DECODE,
                msg: format!("cannot decode request: {e}"),
                details: String::new(),
            }),
        };
        reply(&stream, &resp);
    }

    /// The descriptor rule of the socket: ADD and CHECK carry one network namespace that is not
    /// the host's, other requests none. Errors are code 4 (CNI_NETNS); the descriptors of a
    /// refused request are closed when `fds` drops.
    fn check_fds(
        &self,
        req: &Request,
        mut fds: Vec<OwnedFd>,
        truncated: bool,
    ) -> Result<Option<OwnedFd>, ErrorReply> {
        let invalid = |msg: String| ErrorReply {
            code: code::INVALID_ENV,
            msg,
            details: String::new(),
        };
        let takes_netns = matches!(req, Request::Add(_) | Request::Check(_));
        if truncated || fds.len() > 1 {
            return Err(invalid(format!(
                "CNI_NETNS: {}{} file descriptors came with the request; exactly one network namespace is expected",
                fds.len(),
                if truncated { "+" } else { "" }
            )));
        }
        let Some(fd) = fds.pop() else {
            return Ok(None);
        };
        if !takes_netns {
            return Err(invalid(format!(
                "{} takes no file descriptor, one came with the request",
                op_name(req)
            )));
        }
        check_netns_fd(fd.as_fd(), &self.host_netns).map_err(invalid)?;
        Ok(Some(fd))
    }

    /// Serves one request. Public so tests can drive the agent without a socket. The socket
    /// server checks the request's descriptor before calling this (`Agent::serve_stream`);
    /// direct callers are trusted to pass a pod's network namespace.
    pub fn handle(&self, req: Request, fd: Option<OwnedFd>) -> Response {
        let started = std::time::Instant::now();
        let what = op_name(&req);
        let kind = op_kind(&req);
        // The plugin checks these identifiers; other socket callers are checked here, before
        // they name an endpoint, a store key or a handle.
        let ids = match &req {
            Request::Add(r) => Some(&r.attachment),
            Request::Del(r) => Some(&r.attachment),
            Request::Check(r) => Some(&r.attachment),
            Request::IpamAdd(r) => Some(&r.attachment),
            Request::IpamDel(a) | Request::IpamCheck(a) => Some(a),
            _ => None,
        };
        let checked = ids.map_or(Ok(()), check_attachment);
        let resp = match checked {
            Err(e) => Err(e),
            Ok(()) => match req {
                Request::Add(r) => self.add(r, fd),
                Request::Del(r) => self.del(r),
                Request::Check(r) => self.check(r, fd),
                Request::Status => self.status(),
                Request::Gc(r) => self.gc(r),
                Request::IpamAdd(r) => self.ipam_add(r),
                Request::IpamDel(a) => self.ipam_del(a),
                Request::IpamCheck(a) => self.ipam_check(a),
                Request::BgpStatus => Ok(tern_api::Reply::BgpStatus(
                    self.bgp.as_ref().map(|b| b.status()).unwrap_or_default(),
                )),
            },
        };
        let result = if resp.is_ok() { "ok" } else { "error" };
        self.metrics
            .observe_request(kind, result, started.elapsed());
        match &resp {
            Ok(_) => {
                let took = started.elapsed();
                // Whole microseconds beside the `Debug` text, for tern-bench's split.
                log::debug!("{what} ok in {took:?} ({} us)", took.as_micros());
            }
            Err(e) => log::info!("{what} failed (code {}): {}", e.code, e.msg),
        }
        resp
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

fn op_name(r: &Request) -> String {
    match r {
        Request::Add(a) => format!("ADD {}/{}", a.attachment.container_id, a.attachment.ifname),
        Request::Del(d) => format!("DEL {}/{}", d.attachment.container_id, d.attachment.ifname),
        Request::Check(c) => format!(
            "CHECK {}/{}",
            c.attachment.container_id, c.attachment.ifname
        ),
        Request::Status => "STATUS".into(),
        Request::Gc(g) => format!("GC {}", g.network),
        Request::IpamAdd(a) => format!("IPAM ADD {}", a.attachment.container_id),
        Request::IpamDel(a) => format!("IPAM DEL {}", a.container_id),
        Request::IpamCheck(a) => format!("IPAM CHECK {}", a.container_id),
        Request::BgpStatus => "BGP STATUS".into(),
    }
}

/// The `op` label of a request in the metrics.
fn op_kind(r: &Request) -> &'static str {
    match r {
        Request::Add(_) => "add",
        Request::Del(_) => "del",
        Request::Check(_) => "check",
        Request::Status => "status",
        Request::Gc(_) => "gc",
        Request::IpamAdd(_) => "ipam_add",
        Request::IpamDel(_) => "ipam_del",
        Request::IpamCheck(_) => "ipam_check",
        Request::BgpStatus => "bgp_status",
    }
}

/// Binds the socket, replacing a stale socket file left by a previous run, but refusing to
/// steal the socket of a live agent. The socket is bound inside a fresh `0700` directory next
/// to `path`, given mode `0660` and group `group`, and only then renamed into place: it is never
/// reachable with a mode the umask chose. A parent directory this creates is `0755`.
pub fn bind(path: &std::path::Path, group: u32) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        // The umask may have removed bits a group member needs to reach the socket.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("setting the mode of {}", dir.display()))?;
    }
    if let Ok(md) = path.symlink_metadata() {
        use std::os::unix::fs::FileTypeExt;
        // Only a socket is ever replaced: a typo naming the store, a log or a directory must
        // not cost that file.
        if !md.file_type().is_socket() {
            anyhow::bail!(
                "--socket {}: the path exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!("another ternd is already serving {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ternd.sock".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let private = dir.join(format!(".{file_name}.bind-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let result = (|| -> anyhow::Result<UnixListener> {
        let tmp = private.join("s");
        let listener =
            UnixListener::bind(&tmp).with_context(|| format!("binding {}", tmp.display()))?;
        set_socket_owner(&tmp, group)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("setting mode 0660 on {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("moving the socket into place at {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

/// Gives the socket file the configured group (the owner stays the agent, root in production).
fn set_socket_owner(path: &std::path::Path, group: u32) -> anyhow::Result<()> {
    // SAFETY: getegid has no preconditions.
    if unsafe { libc::getegid() } == group {
        return Ok(());
    }
    match std::os::unix::fs::chown(path, None, Some(group)) {
        Ok(()) => Ok(()),
        // SAFETY: geteuid has no preconditions.
        Err(e) if unsafe { libc::geteuid() } != 0 => {
            // An unprivileged agent (development) cannot give its socket away; it stays
            // reachable only by its own user and group.
            log::warn!(
                "cannot give {} to group {group}: {e}; only this user can use it",
                path.display()
            );
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("giving {} to group {group}", path.display())),
    }
}

/// Sends a refusal without reading the request and closes the connection. Non-blocking: a
/// fresh connection's send buffer always has room for it, and the accept loop must never wait.
fn refuse(stream: UnixStream, e: ErrorReply) {
    let _ = stream.set_nonblocking(true);
    let out = serde_json::to_vec(&Response::Err(e)).unwrap_or_else(|_| b"{}".to_vec());
    let _ = tern_api::write_frame(&stream, &out, None);
}

fn reply(stream: &UnixStream, resp: &Response) {
    let out = serde_json::to_vec(resp).unwrap_or_else(|_| b"{}".to_vec());
    if let Err(e) = tern_api::write_frame(stream, &out, None) {
        log::warn!("cannot send reply: {e}");
    }
}

/// A caller's credentials as the kernel recorded them at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a unix socket.
pub fn peer_cred(fd: BorrowedFd<'_>) -> std::io::Result<PeerCred> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: fd is open for the call; cred is ours and len its size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// `SO_PEERGROUPS` of a unix socket: the caller's supplementary groups.
fn peer_groups(fd: BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes; the kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / 4);
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        // ERANGE: `len` now says how much room the list needs.
        if e.raw_os_error() == Some(libc::ERANGE) && (len as usize / 4) > groups.len() {
            groups.resize(len as usize / 4, 0);
            continue;
        }
        return Err(e);
    }
}

/// (st_dev, st_ino) of an open file: two namespace files with equal pairs are one namespace.
fn file_id(fd: BorrowedFd<'_>) -> std::io::Result<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the call and st is ours to write.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// The namespaces no pod may be wired into: the calling thread's (the agent's, i.e. the node's)
/// and PID 1's when readable and different.
fn host_netns_ids() -> Vec<(u64, u64)> {
    let mut ids = Vec::new();
    for p in ["/proc/thread-self/ns/net", "/proc/1/ns/net"] {
        match std::fs::File::open(p).and_then(|f| file_id(f.as_fd())) {
            Ok(id) if !ids.contains(&id) => ids.push(id),
            Ok(_) => {}
            Err(e) => log::debug!("cannot identify {p}: {e}"),
        }
    }
    ids
}

/// Checks that a received descriptor is a network namespace (nsfs, `NS_GET_NSTYPE` ==
/// `CLONE_NEWNET`) and none of `host` (the node's own). The message names CNI_NETNS.
pub fn check_netns_fd(fd: BorrowedFd<'_>, host: &[(u64, u64)]) -> Result<(), String> {
    use tern_linux::netns::NsFileError;
    match tern_linux::netns::check_net_namespace(fd) {
        Ok(()) => {}
        Err(NsFileError::NotNsfs(t)) => {
            return Err(format!(
                "CNI_NETNS: the descriptor passed is not a namespace file (filesystem type {t:#x}); a network namespace is required"
            ));
        }
        Err(NsFileError::NotNet(kind)) => {
            return Err(format!(
                "CNI_NETNS: the descriptor passed is a namespace but not a network namespace (type {kind:#x})"
            ));
        }
        Err(e) => {
            return Err(format!(
                "CNI_NETNS: cannot inspect the descriptor passed: {e}"
            ));
        }
    }
    let id = file_id(fd).map_err(|e| format!("CNI_NETNS: cannot inspect the namespace: {e}"))?;
    if host.contains(&id) {
        return Err(
            "CNI_NETNS is the node's own network namespace (ternd's): a pod interface is never wired into the host"
                .to_string(),
        );
    }
    Ok(())
}

/// A warning logged at most once a second; the ones in between are counted and reported with
/// the next, so a flood of hostile requests cannot flood the log.
#[derive(Debug, Default)]
struct RateLimitedLog {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    fn warn(&self, msg: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        let n = self.suppressed.swap(0, Ordering::Relaxed);
        if n > 0 {
            log::warn!("{msg} ({n} similar refusals not logged)");
        } else {
            log::warn!("{msg}");
        }
    }
}

/// Checks an attachment's identifiers as the plugin does (tern-cni's environment rules), for
/// callers of the socket other than the plugin: they name WorkloadEndpoints, store keys and
/// handles, where a `/` or `:` would address another object. Container ID and network name
/// match `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`; the interface name is a Linux interface name; the
/// pod's namespace and name (kubelet's `K8S_POD_*`) are non-empty, at most 253 bytes, with
/// no `/`, `:`, whitespace or control character. Errors name the CNI field (code 4, or 7 for
/// the network name, which comes from the configuration).
pub fn check_attachment(a: &Attachment) -> Result<(), ErrorReply> {
    if !tern_cni::env::is_valid_id(&a.container_id) {
        return Err(coded(
            code::INVALID_ENV,
            format!(
                "invalid characters in containerID: CNI_CONTAINERID {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
                a.container_id
            ),
        ));
    }
    if !tern_cni::env::is_valid_id(&a.network) {
        return Err(coded(
            code::INVALID_CONFIG,
            format!(
                "name: network name {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
                a.network
            ),
        ));
    }
    tern_cni::env::validate_ifname(&a.ifname)
        .map_err(|why| coded(code::INVALID_ENV, format!("invalid CNI_IFNAME: {why}")))?;
    if let Some(p) = &a.pod {
        for (field, v) in [
            ("K8S_POD_NAMESPACE", &p.namespace),
            ("K8S_POD_NAME", &p.name),
        ] {
            let bad = v.is_empty()
                || v.len() > 253
                || v.chars()
                    .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
            if bad {
                return Err(coded(
                    code::INVALID_ENV,
                    format!(
                        "invalid CNI_ARGS: {field} {v:?} must be 1-253 bytes without '/', ':', whitespace or control characters"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn coded(code: u32, msg: String) -> ErrorReply {
    ErrorReply {
        code,
        msg,
        details: String::new(),
    }
}

#[cfg(test)]
mod attachment_tests {
    use super::*;

    #[test]
    fn attachment_identifiers_are_checked_like_the_plugin_does() {
        let ok = Attachment {
            network: "k8s-pod-network".into(),
            container_id: "abc123".into(),
            ifname: "eth0".into(),
            netns_path: String::new(),
            pod: Some(tern_api::PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                ..Default::default()
            }),
        };
        assert!(check_attachment(&ok).is_ok());
        let with = |f: &dyn Fn(&mut Attachment)| {
            let mut a = ok.clone();
            f(&mut a);
            check_attachment(&a).unwrap_err()
        };
        for (e, code, want) in [
            (
                with(&|a| a.container_id = "../x".into()),
                4,
                "CNI_CONTAINERID",
            ),
            (
                with(&|a| a.container_id = "a/b".into()),
                4,
                "CNI_CONTAINERID",
            ),
            (with(&|a| a.network = "n:1".into()), 7, "network name"),
            (with(&|a| a.ifname = "eth/0".into()), 4, "CNI_IFNAME"),
            (with(&|a| a.ifname = String::new()), 4, "CNI_IFNAME"),
            (
                with(&|a| a.pod.as_mut().unwrap().namespace = "a/b".into()),
                4,
                "K8S_POD_NAMESPACE",
            ),
            (
                with(&|a| a.pod.as_mut().unwrap().name = "web:0".into()),
                4,
                "K8S_POD_NAME",
            ),
        ] {
            assert_eq!(e.code, code, "{}", e.msg);
            assert!(e.msg.contains(want), "{} does not name {want}", e.msg);
        }
    }
}

#[cfg(test)]
mod bind_tests {
    /// `bind` replaces a stale socket but never a regular file or a directory at the path.
    #[test]
    fn bind_refuses_a_path_that_is_not_a_socket() {
        let dir = std::env::temp_dir().join(format!(
            "tern-bind-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        struct Cleanup(std::path::PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _c = Cleanup(dir.clone());
        // SAFETY: getgid has no preconditions.
        let gid = unsafe { libc::getgid() };
        let file = dir.join("store.db");
        std::fs::write(&file, b"precious").unwrap();
        let e = super::bind(&file, gid).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(super::bind(&sub, gid).is_err());
        assert!(sub.is_dir());
        // A stale socket (nobody listening) is replaced.
        let sock = dir.join("ternd.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let l = super::bind(&sock, gid).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
        drop(l);
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
