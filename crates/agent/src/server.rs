//! The agent: start-up, the socket server and the maintenance loop.

use crate::config::AgentConfig;
use crate::endpoints::Endpoints;
use anyhow::Context;
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{ErrorReply, Request, Response};
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
    pub(crate) in_flight_handles: Mutex<HashSet<String>>,
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
    started: Instant,
    stop: AtomicBool,
}

impl Agent {
    /// Opens the store, creates the default pool if no pool exists, loads this node's endpoints,
    /// replays the release journal and reconciles the node's interfaces.
    pub fn start(cfg: AgentConfig) -> anyhow::Result<Arc<Agent>> {
        let store = tern_store::etcd::open_with_tls(
            &cfg.store_url,
            cfg.etcd_ca.as_deref(),
            cfg.etcd_cert.as_deref(),
            cfg.etcd_key.as_deref(),
        )
        .with_context(|| format!("opening store {}", cfg.store_url))?;
        Agent::start_with_store(cfg, store)
    }

    /// As [`Agent::start`], on a store the caller opened (`cfg.store_url` is then only
    /// informative). Lets tests wrap the store, e.g. to simulate an outage.
    pub fn start_with_store(cfg: AgentConfig, store: Arc<dyn Store>) -> anyhow::Result<Arc<Agent>> {
        let ipam = Ipam::new(store.clone());
        match ipam.ensure_default_pool(&cfg.default_ipv4_pool) {
            Ok(true) => log::info!(
                "created IPPool default-ipv4-ippool ({})",
                cfg.default_ipv4_pool
            ),
            Ok(false) => {}
            Err(e) => log::warn!("cannot check IP pools now (will serve anyway): {e}"),
        }
        let endpoints = match Endpoints::load(store.clone(), &cfg.node_name) {
            Ok(e) => e,
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("loading endpoints of node {}", cfg.node_name)));
            }
        };
        let policy = if cfg.dataplane {
            Some(Arc::new(
                crate::policy::PolicyEngine::load(store.clone(), &cfg.node_name)
                    .context("loading network policy")?,
            ))
        } else {
            None
        };
        let dataplane = if cfg.dataplane {
            Some(Arc::new(start_dataplane(&cfg, &store, policy.clone())?))
        } else {
            None
        };
        let bgp = if cfg.bgp {
            let settings = crate::bgp::BgpSettings {
                node_name: cfg.node_name.clone(),
                node_ip: cfg.node_ip,
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
            crate::reconcile::detect_mtu()
        };
        let agent = Arc::new(Agent {
            cfg,
            store,
            ipam,
            endpoints,
            mtu,
            in_flight: crate::claims::Claims::default(),
            reaper: crate::reaper::Reaper::start()?,
            in_flight_handles: Mutex::new(HashSet::new()),
            leaks: crate::leak::LeakTracker::default(),
            metrics: crate::metrics::Metrics::default(),
            journal_dirty: AtomicBool::new(false),
            heartbeat_ms: AtomicU64::new(0),
            dataplane,
            policy,
            dataplane_stop: Arc::new(AtomicBool::new(false)),
            bgp,
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
        let addresses: Vec<NodeAddress> = crate::reconcile::node_addresses()
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
    pub fn serve(self: &Arc<Self>) -> anyhow::Result<()> {
        let listener = bind(&self.cfg.socket)?;
        log::info!("listening on {}", self.cfg.socket.display());
        crate::metrics::start_http(self);
        self.start_maintenance()?;
        for conn in listener.incoming() {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            match conn {
                Ok(stream) => {
                    let me = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("request".into())
                        .spawn(move || me.serve_connection(stream));
                    if let Err(e) = spawned {
                        log::error!("cannot spawn request thread: {e}");
                    }
                }
                Err(e) => log::warn!("accept failed: {e}"),
            }
        }
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

    fn serve_connection(&self, stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        let (body, fd) = match tern_api::read_frame(&stream) {
            Ok(x) => x,
            Err(e) => {
                log::debug!("dropping connection: {e}");
                return;
            }
        };
        let resp: Response = match serde_json::from_slice::<Request>(&body) {
            Ok(req) => self.handle(req, fd),
            Err(e) => Err(ErrorReply {
                code: 6,
                msg: format!("cannot decode request: {e}"),
                details: String::new(),
            }),
        };
        let out = serde_json::to_vec(&resp).unwrap_or_else(|_| b"{}".to_vec());
        if let Err(e) = tern_api::write_frame(&stream, &out, None) {
            log::warn!("cannot send reply: {e}");
        }
    }

    /// Serves one request. Public so tests can drive the agent without a socket.
    pub fn handle(&self, req: Request, fd: Option<OwnedFd>) -> Response {
        let started = std::time::Instant::now();
        let what = op_name(&req);
        let kind = op_kind(&req);
        let resp = match req {
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
        };
        let result = if resp.is_ok() { "ok" } else { "error" };
        self.metrics
            .observe_request(kind, result, started.elapsed());
        match &resp {
            Ok(_) => log::debug!("{what} ok in {:?}", started.elapsed()),
            Err(e) => log::info!("{what} failed (code {}): {}", e.code, e.msg),
        }
        resp
    }

    /// Gives back this node's blocks that have been empty for longer than the configured grace
    /// period (never the node's last block).
    fn release_empty_blocks(&self) {
        let grace = match self.ipam.config() {
            Ok(c) => Duration::from_secs(c.empty_block_grace_seconds),
            Err(e) => {
                log::debug!("cannot read the IPAM configuration: {e}");
                return;
            }
        };
        match self.ipam.release_empty_blocks(&self.cfg.node_name, grace) {
            Ok(blocks) if !blocks.is_empty() => log::info!("released empty blocks {blocks:?}"),
            Ok(_) => {}
            Err(e) => log::warn!("releasing empty blocks: {e}"),
        }
    }

    fn maintenance_loop(&self) {
        let period = Duration::from_secs(self.cfg.resync_seconds.max(1));
        // While releases are journaled, retry this often rather than once per resync.
        let retry = Duration::from_secs(2).min(period);
        loop {
            let mut slept = Duration::ZERO;
            let mut since_retry = Duration::ZERO;
            while slept < period {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                self.tick();
                if slept.as_millis().is_multiple_of(10_000) {
                    self.dataplane_keepalive();
                }
                std::thread::sleep(Duration::from_millis(200));
                slept += Duration::from_millis(200);
                since_retry += Duration::from_millis(200);
                if since_retry >= retry && self.journal_dirty.load(Ordering::Relaxed) {
                    since_retry = Duration::ZERO;
                    let mut r = crate::reconcile::Report::default();
                    self.replay_pending(&mut r);
                    if !r.is_empty() {
                        log::info!("journal retry: {r}");
                    }
                }
            }
            self.tick();
            let report = self.reconcile();
            if !report.is_empty() {
                log::info!("periodic reconcile: {report}");
            }
            self.journal_dirty
                .store(report.journal_pending > 0, Ordering::Relaxed);
            self.release_empty_blocks();
            if let Some(dp) = &self.dataplane {
                // Full resync: repairs what changed behind the agent's back.
                dp.sync();
            }
            if let Some(p) = &self.policy
                && let Err(e) = p.resync()
            {
                log::warn!("policy resync: {e}");
            }
            let leaks = self.repair_leaks();
            if !leaks.released.is_empty() || !leaks.errors.is_empty() {
                log::info!(
                    "leak repair: {} suspects, released {:?}, errors {:?}",
                    leaks.suspects,
                    leaks.released,
                    leaks.errors
                );
            }
        }
    }

    /// The dataplane reconciler, when enabled.
    pub fn dataplane(&self) -> Option<&Arc<crate::dataplane::Dataplane>> {
        self.dataplane.as_ref()
    }

    fn dataplane_keepalive(&self) {
        if let Some(dp) = &self.dataplane
            && let Err(e) = dp.keepalive()
        {
            log::warn!("node liveness lease: {e}");
        }
    }

    fn tick(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }
}

/// Creates the dataplane reconciler and runs its start-up sync (before the agent serves, so
/// pods created at once get the computed MTU and routes exist). A `--node-ip` that is not on
/// a local interface is fatal; every other dataplane problem is reported and retried.
fn start_dataplane(
    cfg: &AgentConfig,
    store: &Arc<dyn Store>,
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
    // Before the first sync: with BGP, direct routes must never be installed over BGP's.
    dp.set_bgp_routing(cfg.bgp);
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
/// steal the socket of a live agent.
fn bind(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!("another ternd is already serving {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}
