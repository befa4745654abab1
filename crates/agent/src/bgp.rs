//! BGP in the agent (`ternd --bgp`): one thread runs a current-thread tokio runtime with the
//! [`tern_bgp::driver::Speaker`], in the node's network namespace (the agent's own).
//!
//! Configuration comes from the store and is re-read on every store change (a watch on
//! `/tern/v1/`), so changes apply without restarting the agent:
//!
//! - the speaker: AS = `Node.spec.bgp.asNumber`, else `BGPConfiguration default`'s asNumber,
//!   else 64512; router ID and listen address = `Node.spec.bgp.ipv4Address` (which the agent
//!   fills from its underlay address when unset); port = `listenPort`; a node with
//!   `routeReflectorClusterID` is a route reflector.
//! - peers ([`plan`]): every other node with a BGP address (node-to-node mesh) unless
//!   `nodeToNodeMeshEnabled: false`, plus the BGPPeers selecting this node. A route reflector's
//!   peers that are not reflectors themselves are its clients.
//! - originated prefixes: the node's affine blocks and the addresses it borrowed from other
//!   nodes' blocks, never more-specifics inside its own blocks.
//!
//! Learned routes are installed with protocol [`TERN_BGP_ROUTE_PROTOCOL`] (85), a recursive
//! next hop resolved through the kernel's table when it is not on a connected network.
//! Prefixes inside pools that encapsulate (VXLAN, IPIP) stay with the route reconciler, and
//! the reconciler leaves direct routes of unencapsulated pools to BGP
//! ([`reconciler_owns`]): the two never write the same route.
//!
//! Restarts: proto-85 routes found at start mean the agent restarted; the speaker then sets
//! the graceful-restart Restart State bit, keeps those routes while the sessions come back
//! and removes the ones not learned again once every session is up (or after the restart
//! time). The peers keep our routes meanwhile (RFC 4724 helper), also after a SIGKILL.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use ipnet::IpNet;
use tern_api::{BgpPeerStatus, BgpStatusReply};
use tern_bgp::driver::RouteEvent;
use tern_bgp::driver::{PeerConfig, Speaker, SpeakerConfig, SpeakerHandle};
use tern_bgp::fsm::State;
use tern_linux::TERN_BGP_ROUTE_PROTOCOL;
use tern_linux::netlink::{Handle, MAIN_TABLE, Route, RouteKind, Scope};
use tern_model::{
    BgpConfigurationSpec, BgpPeer, DEFAULT_BGP_CONFIGURATION, Kind, Node, Resource, Selector,
};
use tern_store::{Store, keys};
use tokio::sync::mpsc;

use crate::routes::{PoolInfo, Snapshot};

/// Graceful-restart time advertised, and how long stale routes survive our own restart.
const RESTART_TIME: u16 = 120;

/// How a peer was configured (the PEER TYPE column of `ternctl node status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerKind {
    /// Another node, from the node-to-node mesh.
    Mesh,
    /// A BGPPeer without `node` (all nodes, or those matching `nodeSelector`).
    Global,
    /// A BGPPeer with `node` naming this node.
    NodeSpecific,
}

impl PeerKind {
    /// calicoctl's wording.
    pub fn label(self) -> &'static str {
        match self {
            PeerKind::Mesh => "node-to-node mesh",
            PeerKind::Global => "global",
            PeerKind::NodeSpecific => "node specific",
        }
    }
}

/// Everything the speaker of one node should be doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Our AS.
    pub asn: u32,
    /// Router ID and listen / session address.
    pub router_id: Ipv4Addr,
    /// Listen port.
    pub port: u16,
    /// Set when this node is a route reflector.
    pub cluster_id: Option<Ipv4Addr>,
    /// Peers by address.
    pub peers: BTreeMap<IpAddr, (PeerConfig, PeerKind)>,
    /// Prefixes to originate.
    pub originate: BTreeSet<IpNet>,
}

/// Errors of BGP configuration and start-up.
#[derive(Debug, thiserror::Error)]
pub enum BgpError {
    /// This node has no IPv4 BGP address yet.
    #[error("node {0} has no spec.bgp.ipv4Address (and no IPv4 underlay address to use)")]
    NoAddress(String),
    /// A resource is malformed.
    #[error("{0}")]
    Config(String),
    /// The store failed.
    #[error("reading BGP configuration: {0}")]
    Store(String),
    /// The thread could not be started.
    #[error("starting the BGP thread: {0}")]
    Thread(#[from] std::io::Error),
}

fn node_v4(n: &Node) -> Option<Ipv4Addr> {
    let a = n.spec.bgp.as_ref()?.ipv4_address.as_deref()?;
    match a.split('/').next()?.parse::<IpAddr>().ok()? {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(_) => None,
    }
}

fn is_rr(n: &Node) -> bool {
    n.spec
        .bgp
        .as_ref()
        .is_some_and(|b| b.route_reflector_cluster_id.is_some())
}

/// Computes the speaker configuration of node `me` from the resources. Pure: unit-tested.
pub fn plan(
    me: &str,
    nodes: &[Node],
    config: &BgpConfigurationSpec,
    peers: &[BgpPeer],
    snap: &Snapshot,
) -> Result<Plan, BgpError> {
    let own = nodes
        .iter()
        .find(|n| n.metadata.name == me)
        .ok_or_else(|| BgpError::NoAddress(me.to_string()))?;
    let router_id = node_v4(own).ok_or_else(|| BgpError::NoAddress(me.to_string()))?;
    let asn_of = |n: &Node| {
        n.spec
            .bgp
            .as_ref()
            .and_then(|b| b.as_number)
            .unwrap_or(config.as_number())
    };
    let asn = asn_of(own);
    let cluster_id = match own
        .spec
        .bgp
        .as_ref()
        .and_then(|b| b.route_reflector_cluster_id.as_deref())
    {
        Some(c) => Some(c.parse::<Ipv4Addr>().map_err(|_| {
            BgpError::Config(format!(
                "Node {me}: routeReflectorClusterID {c:?} is not an IPv4 address"
            ))
        })?),
        None => None,
    };
    let i_am_rr = cluster_id.is_some();
    let mut out = BTreeMap::new();
    let node_peer = |n: &Node, port: u16| -> Option<PeerConfig> {
        let addr = node_v4(n)?;
        let mut p = PeerConfig::new(IpAddr::V4(addr), asn_of(n));
        p.port = port;
        p.rr_client = i_am_rr && !is_rr(n) && asn_of(n) == asn;
        Some(p)
    };
    // Explicit peers first: they win over the mesh for the same address.
    for bp in peers {
        let s = &bp.spec;
        let applies = match (&s.node, &s.node_selector) {
            (Some(n), _) => n == me,
            (None, Some(sel)) => Selector::parse(sel)
                .map(|sel| sel.matches(&own.metadata.labels))
                .unwrap_or(false),
            (None, None) => true,
        };
        if !applies {
            continue;
        }
        let kind = if s.node.is_some() {
            PeerKind::NodeSpecific
        } else {
            PeerKind::Global
        };
        let mut add = |mut p: PeerConfig| {
            if p.address == IpAddr::V4(router_id) {
                return;
            }
            p.password = s.password.clone();
            p.keep_original_next_hop = s.keep_original_next_hop;
            out.entry(p.address).or_insert((p, kind));
        };
        match s.peer_address() {
            Ok(Some(sa)) => {
                let mut p = PeerConfig::new(sa.ip(), s.as_number.unwrap_or(asn));
                p.port = sa.port();
                add(p);
            }
            Ok(None) => {
                let Some(sel) = s.peer_selector.as_deref() else {
                    continue;
                };
                let sel = Selector::parse(sel).map_err(|e| {
                    BgpError::Config(format!("BGPPeer {}: peerSelector: {e}", bp.metadata.name))
                })?;
                for n in nodes {
                    if n.metadata.name != me
                        && sel.matches(&n.metadata.labels)
                        && let Some(p) = node_peer(n, config.listen_port)
                    {
                        add(p);
                    }
                }
            }
            Err(e) => {
                return Err(BgpError::Config(format!(
                    "BGPPeer {}: peerIP: {e}",
                    bp.metadata.name
                )));
            }
        }
    }
    if config.node_to_node_mesh_enabled {
        for n in nodes {
            if n.metadata.name == me {
                continue;
            }
            if let Some(p) = node_peer(n, config.listen_port) {
                out.entry(p.address).or_insert((p, PeerKind::Mesh));
            }
        }
    }
    Ok(Plan {
        asn,
        router_id,
        port: config.listen_port,
        cluster_id,
        peers: out,
        originate: originated(snap, me),
    })
}

/// The prefixes node `me` advertises: its affine blocks, and the single addresses it
/// allocated from blocks affine to other nodes. Addresses inside its own blocks are covered by
/// the block and never advertised on their own.
pub fn originated(snap: &Snapshot, me: &str) -> BTreeSet<IpNet> {
    let mut out = BTreeSet::new();
    for b in &snap.blocks {
        if b.affinity.as_deref() == Some(me) {
            out.insert(b.cidr);
            continue;
        }
        for (ip, by) in &b.allocations {
            if by == me {
                out.insert(IpNet::from(*ip));
            }
        }
    }
    out
}

/// True when routes to `dst` belong to the route reconciler even with BGP on: `dst` lies in a
/// pool that encapsulates (VXLAN / IPIP), whose routes go through the tunnel devices.
pub fn reconciler_owns(pools: &[PoolInfo], dst: &IpNet) -> bool {
    pools
        .iter()
        .filter(|p| p.cidr.contains(dst))
        .max_by_key(|p| p.cidr.prefix_len())
        .is_some_and(|p| {
            p.vxlan != tern_model::EncapMode::Never || p.ipip != tern_model::EncapMode::Never
        })
}

/// Per-session figures shared with the status request and `/metrics`.
#[derive(Debug, Default)]
struct Shared {
    status: BgpStatusReply,
    routes_installed: usize,
    established_transitions: BTreeMap<IpAddr, u64>,
    last_error: Option<String>,
}

enum Msg {
    Changed,
    /// A fresh status snapshot for `ternctl node status`.
    Status(std::sync::mpsc::Sender<BgpStatusReply>),
    Stop(std::sync::mpsc::Sender<()>),
}

/// The running BGP speaker of the agent.
pub struct Bgp {
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::UnboundedSender<Msg>,
    stopping: Arc<AtomicBool>,
}

/// Settings of [`Bgp::start`].
#[derive(Debug, Clone)]
pub struct BgpSettings {
    /// This node.
    pub node_name: String,
    /// `--node-ip`: the address written to `spec.bgp.ipv4Address` when unset.
    pub node_ip: Option<IpAddr>,
}

impl Bgp {
    /// Starts the BGP thread (and the store watch feeding it). Sessions come up in the
    /// background; configuration problems are logged and retried on the next store change.
    pub fn start(settings: BgpSettings, store: Arc<dyn Store>) -> Result<Arc<Bgp>, BgpError> {
        let shared = Arc::new(Mutex::new(Shared {
            status: BgpStatusReply {
                enabled: true,
                ..Default::default()
            },
            ..Default::default()
        }));
        let (tx, rx) = mpsc::unbounded_channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let bgp = Arc::new(Bgp {
            shared: shared.clone(),
            tx: tx.clone(),
            stopping: stopping.clone(),
        });
        let store2 = store.clone();
        let stop2 = stopping.clone();
        let tx2 = tx.clone();
        std::thread::Builder::new()
            .name("bgp-watch".into())
            .spawn(move || watch_loop(&*store2, &tx2, &stop2))?;
        std::thread::Builder::new()
            .name("bgp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        log::error!("BGP: cannot build the runtime: {e}");
                        return;
                    }
                };
                rt.block_on(Runner::new(settings, store, shared).run(rx));
            })?;
        Ok(bgp)
    }

    /// The sessions, for `ternctl node status`: asked from the speaker at the time of the
    /// call (a periodic snapshot would show sessions that came up within the last second as
    /// still connecting). Falls back to the last snapshot when the BGP thread is busy or
    /// stopped.
    pub fn status(&self) -> BgpStatusReply {
        if !self.stopping.load(Ordering::Relaxed) {
            let (tx, rx) = std::sync::mpsc::channel();
            if self.tx.send(Msg::Status(tx)).is_ok()
                && let Ok(s) = rx.recv_timeout(Duration::from_secs(3))
            {
                return s;
            }
        }
        self.shared.lock().unwrap().status.clone()
    }

    /// Stops the speaker for a restart: sessions with graceful restart are closed without
    /// NOTIFICATION, so peers keep our routes; learned routes stay in the kernel. Waits up to
    /// five seconds.
    pub fn stop_for_restart(&self) {
        if self.stopping.swap(true, Ordering::Relaxed) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Stop(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }

    /// Appends the per-session metrics to a `/metrics` page.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let s = self.shared.lock().unwrap();
        out.push_str("# HELP tern_bgp_session_up Whether the BGP session with the peer is Established.\n# TYPE tern_bgp_session_up gauge\n");
        for p in &s.status.peers {
            let _ = writeln!(
                out,
                "tern_bgp_session_up{{peer=\"{}\",type=\"{}\"}} {}",
                p.address,
                p.peer_type,
                u8::from(p.state == "up")
            );
        }
        out.push_str("# HELP tern_bgp_session_established_total Times the session with the peer reached Established.\n# TYPE tern_bgp_session_established_total counter\n");
        for p in &s.status.peers {
            let n = s
                .established_transitions
                .get(&p.address)
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "tern_bgp_session_established_total{{peer=\"{}\"}} {n}",
                p.address
            );
        }
        out.push_str("# HELP tern_bgp_routes_installed Routes learned over BGP installed in the kernel.\n# TYPE tern_bgp_routes_installed gauge\n");
        let _ = writeln!(out, "tern_bgp_routes_installed {}", s.routes_installed);
    }
}

fn watch_loop(store: &dyn Store, tx: &mpsc::UnboundedSender<Msg>, stop: &AtomicBool) {
    let mut watch: Option<Box<dyn tern_store::Watch>> = None;
    while !stop.load(Ordering::Relaxed) {
        let w = match watch.as_mut() {
            Some(w) => w,
            None => match store
                .revision()
                .and_then(|rev| store.watch(keys::ROOT, rev))
            {
                Ok(w) => {
                    let _ = tx.send(Msg::Changed);
                    watch.insert(w)
                }
                Err(e) => {
                    log::debug!("BGP watch: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            },
        };
        match w.next_events(Duration::from_millis(500)) {
            Ok(ev) if ev.is_empty() => {}
            Ok(_) => {
                if tx.send(Msg::Changed).is_err() {
                    return;
                }
            }
            Err(e) => {
                log::debug!("BGP watch ended: {e}");
                watch = None;
            }
        }
    }
}

/// State of the BGP thread.
struct Runner {
    settings: BgpSettings,
    store: Arc<dyn Store>,
    shared: Arc<Mutex<Shared>>,
    speaker: Option<(SpeakerHandle, Plan)>,
    events: Option<mpsc::UnboundedReceiver<RouteEvent>>,
    kinds: BTreeMap<IpAddr, PeerKind>,
    /// Learned routes we want in the kernel.
    learned: BTreeMap<IpNet, IpAddr>,
    pools: Vec<PoolInfo>,
    own: BTreeSet<IpNet>,
    /// Proto-85 routes found at start (we restarted); removed unless learned again.
    stale: Option<BTreeSet<IpNet>>,
    started: Instant,
    last_states: BTreeMap<IpAddr, State>,
}

impl Runner {
    fn new(settings: BgpSettings, store: Arc<dyn Store>, shared: Arc<Mutex<Shared>>) -> Runner {
        let stale: BTreeSet<IpNet> = kernel_routes()
            .map(|r| r.into_iter().map(|r| r.dst).collect())
            .unwrap_or_default();
        Runner {
            settings,
            store,
            shared,
            speaker: None,
            events: None,
            kinds: BTreeMap::new(),
            learned: BTreeMap::new(),
            pools: Vec::new(),
            own: BTreeSet::new(),
            stale: (!stale.is_empty()).then_some(stale),
            started: Instant::now(),
            last_states: BTreeMap::new(),
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks = 0u64;
        loop {
            let ev = async {
                match self.events.as_mut() {
                    Some(e) => e.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                m = rx.recv() => match m {
                    Some(Msg::Changed) => {
                        // Debounce: a burst of store writes (a pod ADD) is one reconfiguration.
                        // Other requests that arrive meanwhile are answered afterwards, never
                        // dropped.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let mut later = Vec::new();
                        while let Ok(m) = rx.try_recv() {
                            if !matches!(m, Msg::Changed) {
                                later.push(m);
                            }
                        }
                        self.reconfigure().await;
                        for m in later {
                            if !self.request(m).await {
                                return;
                            }
                        }
                    }
                    Some(m) => {
                        if !self.request(m).await {
                            return;
                        }
                    }
                    None => return,
                },
                e = ev => match e {
                    Some(e) => self.route_event(e),
                    None => self.events = None,
                },
                _ = tick.tick() => {
                    ticks += 1;
                    self.refresh_status().await;
                    if ticks.is_multiple_of(10) {
                        // Periodic full pass: picks up what the watch missed, repairs the kernel.
                        self.reconfigure().await;
                    } else if ticks.is_multiple_of(3) {
                        self.sync_kernel();
                    }
                }
            }
        }
    }

    /// Answers a status or stop request; false once the thread must end.
    async fn request(&mut self, m: Msg) -> bool {
        match m {
            Msg::Changed => self.reconfigure().await,
            Msg::Status(reply) => {
                self.refresh_status().await;
                let _ = reply.send(self.shared.lock().unwrap().status.clone());
            }
            Msg::Stop(done) => {
                if let Some((h, _)) = self.speaker.take() {
                    h.graceful_shutdown_for_restart().await;
                }
                let _ = done.send(());
                return false;
            }
        }
        true
    }

    /// Reads the resources, fills our BGP address if unset, and applies the [`Plan`].
    async fn reconfigure(&mut self) {
        let plan = match self.load_plan() {
            Ok(p) => p,
            Err(e) => {
                let msg = e.to_string();
                let mut s = self.shared.lock().unwrap();
                if s.last_error.as_deref() != Some(msg.as_str()) {
                    log::warn!("BGP: {msg}");
                    s.last_error = Some(msg);
                }
                return;
            }
        };
        self.shared.lock().unwrap().last_error = None;
        let restart = match &self.speaker {
            Some((_, cur)) => {
                (cur.asn, cur.router_id, cur.port, cur.cluster_id)
                    != (plan.asn, plan.router_id, plan.port, plan.cluster_id)
            }
            None => true,
        };
        if restart {
            if let Some((h, _)) = self.speaker.take() {
                log::info!(
                    "BGP: AS, router ID, port or cluster ID changed: restarting the speaker"
                );
                h.shutdown().await;
            }
            let mut c = SpeakerConfig::new(plan.asn, plan.router_id);
            c.listen = Some(SocketAddr::new(IpAddr::V4(plan.router_id), plan.port));
            c.cluster_id = plan.cluster_id;
            c.graceful_restart_time = Some(RESTART_TIME);
            c.restarting = self.stale.is_some();
            c.connect_retry = Duration::from_secs(1);
            c.connect_retry_max = Duration::from_secs(5);
            match Speaker::start(c).await {
                Ok(mut h) => {
                    log::info!(
                        "BGP speaker AS {} router ID {} listening on port {}{}",
                        plan.asn,
                        plan.router_id,
                        plan.port,
                        if plan.cluster_id.is_some() {
                            " (route reflector)"
                        } else {
                            ""
                        }
                    );
                    self.events = h.take_events();
                    let empty = Plan {
                        peers: BTreeMap::new(),
                        originate: BTreeSet::new(),
                        ..plan.clone()
                    };
                    self.speaker = Some((h, empty));
                }
                Err(e) => {
                    log::warn!("BGP: {e}");
                    return;
                }
            }
        }
        let Some((h, cur)) = self.speaker.as_mut() else {
            return;
        };
        for (addr, (pc, _)) in &cur.peers {
            if plan.peers.get(addr).map(|(p, _)| p) != Some(pc) {
                if let Err(e) = h.remove_peer(*addr).await {
                    log::warn!("BGP: removing peer {addr}: {e}");
                }
                log::info!("BGP: removed peer {addr}");
            }
        }
        for (addr, (pc, kind)) in &plan.peers {
            if cur.peers.get(addr).map(|(p, _)| p) != Some(pc) {
                match h.add_peer(pc.clone()).await {
                    Ok(()) => log::info!(
                        "BGP: peer {addr} AS {} ({}{})",
                        pc.asn,
                        kind.label(),
                        if pc.rr_client {
                            ", route-reflector client"
                        } else {
                            ""
                        }
                    ),
                    Err(e) => log::warn!("BGP: adding peer {addr}: {e}"),
                }
            }
        }
        for p in cur.originate.difference(&plan.originate) {
            let _ = h.withdraw(*p).await;
        }
        for p in plan.originate.difference(&cur.originate) {
            let _ = h.originate(*p, None).await;
        }
        self.kinds = plan.peers.iter().map(|(a, (_, k))| (*a, *k)).collect();
        self.own = plan.originate.clone();
        *cur = plan;
        self.sync_kernel();
    }

    fn load_plan(&mut self) -> Result<Plan, BgpError> {
        let store = &*self.store;
        let me = self.settings.node_name.clone();
        let st = |e: tern_model::ModelError| BgpError::Store(e.to_string());
        let mut nodes: Vec<Node> = tern_model::list_resources(store, Kind::Node)
            .map_err(st)?
            .into_iter()
            .filter_map(|r| match r {
                Resource::Node(n) => Some(n),
                _ => None,
            })
            .collect();
        if let Some(own) = nodes.iter_mut().find(|n| n.metadata.name == me)
            && node_v4(own).is_none()
            && let Some(addr) = self.underlay_v4()
        {
            let bgp = own.spec.bgp.get_or_insert_with(Default::default);
            bgp.ipv4_address = Some(addr.to_string());
            // resourceVersion makes this a compare-and-swap: a concurrent write wins and the
            // next pass retries.
            tern_model::put_resource(store, &Resource::Node(own.clone())).map_err(st)?;
            log::info!("BGP: recorded spec.bgp.ipv4Address {addr} on Node {me}");
        }
        let config = match tern_model::get_resource(
            store,
            Kind::BgpConfiguration,
            None,
            DEFAULT_BGP_CONFIGURATION,
        )
        .map_err(st)?
        {
            Some(Resource::BgpConfiguration(c)) => c.spec,
            _ => BgpConfigurationSpec::default(),
        };
        let peers: Vec<BgpPeer> = tern_model::list_resources(store, Kind::BgpPeer)
            .map_err(st)?
            .into_iter()
            .filter_map(|r| match r {
                Resource::BgpPeer(p) => Some(p),
                _ => None,
            })
            .collect();
        let snap = crate::dataplane::load_snapshot(store).map_err(BgpError::Store)?;
        self.pools = snap.pools.clone();
        plan(&me, &nodes, &config, &peers, &snap)
    }

    fn underlay_v4(&self) -> Option<IpNet> {
        match self.settings.node_ip {
            Some(ip) => crate::node::local_address(ip).ok(),
            None => crate::reconcile::node_addresses()
                .into_iter()
                .find(|a| a.addr().is_ipv4()),
        }
    }

    fn wanted(&self, prefix: &IpNet) -> bool {
        !self.own.contains(prefix) && !reconciler_owns(&self.pools, prefix)
    }

    fn route_event(&mut self, e: RouteEvent) {
        match e {
            RouteEvent::Install { prefix, next_hop } => {
                self.learned.insert(prefix, next_hop);
                if self.wanted(&prefix)
                    && let Err(e) = install(prefix, next_hop)
                {
                    log::warn!("BGP: installing {prefix} via {next_hop}: {e}");
                }
            }
            RouteEvent::Remove { prefix } => {
                self.learned.remove(&prefix);
                if let Err(e) = uninstall(prefix) {
                    log::warn!("BGP: removing {prefix}: {e}");
                }
            }
        }
        self.shared.lock().unwrap().routes_installed =
            self.learned.keys().filter(|p| self.wanted(p)).count();
    }

    /// Makes the kernel's proto-85 routes match the learned routes: installs missing ones and,
    /// once stale routes of a previous run may go, removes the rest.
    fn sync_kernel(&mut self) {
        let have = match kernel_routes() {
            Ok(r) => r,
            Err(e) => {
                log::warn!("BGP: listing routes: {e}");
                return;
            }
        };
        let have: BTreeMap<IpNet, Option<IpAddr>> =
            have.into_iter().map(|r| (r.dst, r.gateway)).collect();
        let want: BTreeMap<IpNet, IpAddr> = self
            .learned
            .iter()
            .filter(|(p, _)| self.wanted(p))
            .map(|(p, n)| (*p, *n))
            .collect();
        for (p, nh) in &want {
            if !have.contains_key(p)
                && let Err(e) = install(*p, *nh)
            {
                log::warn!("BGP: installing {p} via {nh}: {e}");
            }
        }
        // Stale routes of a previous run stay until every session is back (they keep traffic
        // flowing meanwhile) or the restart time is over.
        if self.stale.is_some() {
            let all_up = !self.last_states.is_empty()
                && self.last_states.values().all(|s| *s == State::Established);
            if (all_up && self.started.elapsed() > Duration::from_secs(5))
                || self.started.elapsed() > Duration::from_secs(RESTART_TIME.into())
            {
                self.stale = None;
            } else {
                return;
            }
        }
        for p in have.keys() {
            if !want.contains_key(p)
                && let Err(e) = uninstall(*p)
            {
                log::warn!("BGP: removing {p}: {e}");
            }
        }
        self.shared.lock().unwrap().routes_installed = want.len();
    }

    async fn refresh_status(&mut self) {
        let Some((h, plan)) = &self.speaker else {
            return;
        };
        let Ok(st) = h.status().await else {
            return;
        };
        let mut s = self.shared.lock().unwrap();
        for p in &st {
            if p.state == State::Established
                && self.last_states.get(&p.address) != Some(&State::Established)
            {
                *s.established_transitions.entry(p.address).or_default() += 1;
            }
        }
        self.last_states = st.iter().map(|p| (p.address, p.state)).collect();
        s.status = BgpStatusReply {
            enabled: true,
            asn: plan.asn,
            router_id: plan.router_id.to_string(),
            peers: st
                .iter()
                .map(|p| BgpPeerStatus {
                    address: p.address,
                    peer_type: self
                        .kinds
                        .get(&p.address)
                        .copied()
                        .unwrap_or(PeerKind::Global)
                        .label()
                        .to_string(),
                    state: if p.state == State::Established {
                        "up"
                    } else {
                        "start"
                    }
                    .into(),
                    since_unix: p
                        .since
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    // calicoctl shows just "Established" for a working session; otherwise the
                    // state and why it is not up (the last error or event).
                    info: if p.info.is_empty() || p.state == State::Established {
                        format!("{:?}", p.state)
                    } else {
                        format!("{:?} {}", p.state, p.info)
                    },
                })
                .collect(),
        };
    }
}

/// tern's BGP routes in the main table.
fn kernel_routes() -> tern_linux::Result<Vec<Route>> {
    let mut h = Handle::new()?;
    let mut out = h.routes_full(false, MAIN_TABLE)?;
    out.extend(h.routes_full(true, MAIN_TABLE)?);
    out.retain(|r| r.protocol == TERN_BGP_ROUTE_PROTOCOL);
    Ok(out)
}

fn bgp_route(dst: IpNet, gateway: Option<IpAddr>) -> Route {
    Route {
        dst,
        kind: RouteKind::Unicast,
        gateway,
        oif: None,
        onlink: false,
        scope: Scope::Universe,
        protocol: TERN_BGP_ROUTE_PROTOCOL,
        table: MAIN_TABLE,
    }
}

/// Installs `dst via next_hop`; when the next hop is not on a connected network (eBGP
/// multihop, a reflected route), resolves it recursively through the kernel's routes.
fn install(dst: IpNet, next_hop: IpAddr) -> tern_linux::Result<()> {
    let mut h = Handle::new()?;
    match h.replace_route_full(&bgp_route(dst, Some(next_hop))) {
        Ok(()) => Ok(()),
        Err(first) => {
            let routes = h.routes_full(next_hop.is_ipv6(), MAIN_TABLE)?;
            let via = routes
                .iter()
                .filter(|r| {
                    r.dst.contains(&next_hop)
                        && r.gateway.is_some()
                        && r.protocol != TERN_BGP_ROUTE_PROTOCOL
                })
                .max_by_key(|r| r.dst.prefix_len())
                .and_then(|r| r.gateway);
            match via {
                Some(g) => h.replace_route_full(&bgp_route(dst, Some(g))),
                None => Err(first),
            }
        }
    }
}

fn uninstall(dst: IpNet) -> tern_linux::Result<bool> {
    let mut h = Handle::new()?;
    h.delete_route_full(&bgp_route(dst, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::BlockInfo;
    use tern_model::{BgpPeerSpec, Document, EncapMode, NodeBgpSpec, NodeSpec};

    fn node(name: &str, addr: Option<&str>, rr: bool, labels: &[(&str, &str)]) -> Node {
        let mut n = Document::new(
            name,
            NodeSpec {
                bgp: addr.map(|a| NodeBgpSpec {
                    ipv4_address: Some(format!("{a}/24")),
                    route_reflector_cluster_id: rr.then(|| "224.0.0.1".to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        n.metadata.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        n
    }

    fn peer(name: &str, spec: BgpPeerSpec) -> BgpPeer {
        Document::new(name, spec)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snap() -> Snapshot {
        Snapshot {
            blocks: vec![
                BlockInfo {
                    cidr: "10.244.1.0/26".parse().unwrap(),
                    affinity: Some("a".into()),
                    allocations: vec![(ip("10.244.1.1"), "a".into())],
                },
                BlockInfo {
                    cidr: "10.244.2.0/26".parse().unwrap(),
                    affinity: Some("b".into()),
                    allocations: vec![
                        (ip("10.244.2.1"), "b".into()),
                        (ip("10.244.2.9"), "a".into()),
                    ],
                },
            ],
            ..Default::default()
        }
    }

    fn nodes() -> Vec<Node> {
        vec![
            node("a", Some("198.18.0.11"), false, &[("rack", "r1")]),
            node("b", Some("198.18.0.12"), false, &[("rack", "r2")]),
            node("c", Some("198.18.0.13"), true, &[]),
            node("d", None, false, &[]),
        ]
    }

    #[test]
    fn full_mesh_by_default() {
        let p = plan("a", &nodes(), &Default::default(), &[], &snap()).unwrap();
        assert_eq!((p.asn, p.port, p.cluster_id), (64512, 179, None));
        assert_eq!(p.router_id, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
        let addrs: Vec<_> = p.peers.keys().copied().collect();
        assert_eq!(addrs, vec![ip("198.18.0.12"), ip("198.18.0.13")]);
        assert!(
            p.peers
                .values()
                .all(|(c, k)| *k == PeerKind::Mesh && !c.rr_client)
        );
        // Own block plus the borrowed address; not the pod address inside the own block.
        let o: Vec<String> = p.originate.iter().map(|n| n.to_string()).collect();
        assert_eq!(o, vec!["10.244.1.0/26", "10.244.2.9/32"]);
    }

    #[test]
    fn route_reflector_has_clients() {
        let p = plan("c", &nodes(), &Default::default(), &[], &snap()).unwrap();
        assert_eq!(p.cluster_id, Some("224.0.0.1".parse().unwrap()));
        assert!(p.peers.values().all(|(c, _)| c.rr_client));
        assert!(p.originate.is_empty());
    }

    #[test]
    fn mesh_disabled_with_global_and_node_specific_peers() {
        let cfg = BgpConfigurationSpec {
            node_to_node_mesh_enabled: false,
            as_number: Some(65010),
            listen_port: 1179,
            ..Default::default()
        };
        let peers = vec![
            peer(
                "tor",
                BgpPeerSpec {
                    peer_ip: Some("198.18.0.250".into()),
                    as_number: Some(65001),
                    password: Some("pw".into()),
                    keep_original_next_hop: true,
                    ..Default::default()
                },
            ),
            peer(
                "only-b",
                BgpPeerSpec {
                    node: Some("b".into()),
                    peer_ip: Some("198.18.0.251:2179".into()),
                    as_number: Some(65002),
                    ..Default::default()
                },
            ),
            peer(
                "rack1-to-rr",
                BgpPeerSpec {
                    node_selector: Some("rack == 'r1'".into()),
                    peer_selector: Some("!has(rack)".into()),
                    ..Default::default()
                },
            ),
        ];
        let p = plan("a", &nodes(), &cfg, &peers, &snap()).unwrap();
        assert_eq!((p.asn, p.port), (65010, 1179));
        let tor = &p.peers[&ip("198.18.0.250")];
        assert_eq!(tor.1, PeerKind::Global);
        assert_eq!((tor.0.asn, tor.0.port), (65001, 179));
        assert_eq!(tor.0.password.as_deref(), Some("pw"));
        assert!(tor.0.keep_original_next_hop);
        // The selector picks node c (no rack label; d has no BGP address).
        assert_eq!(p.peers[&ip("198.18.0.13")].0.port, 1179);
        assert_eq!(p.peers.len(), 2, "{:?}", p.peers);
        let pb = plan("b", &nodes(), &cfg, &peers, &snap()).unwrap();
        let only = &pb.peers[&ip("198.18.0.251")];
        assert_eq!(
            (only.1, only.0.port, only.0.asn),
            (PeerKind::NodeSpecific, 2179, 65002)
        );
        assert_eq!(pb.peers.len(), 2, "{:?}", pb.peers);
    }

    #[test]
    fn node_without_address_is_an_error_and_own_as_wins() {
        assert!(matches!(
            plan("d", &nodes(), &Default::default(), &[], &snap()),
            Err(BgpError::NoAddress(_))
        ));
        let mut ns = nodes();
        ns[0].spec.bgp.as_mut().unwrap().as_number = Some(65100);
        let p = plan("a", &ns, &Default::default(), &[], &snap()).unwrap();
        assert_eq!(p.asn, 65100);
        // b is then in another AS: eBGP, never an RR client.
        let pc = plan("c", &ns, &Default::default(), &[], &snap()).unwrap();
        let a = &pc.peers[&ip("198.18.0.11")].0;
        assert_eq!(a.asn, 65100);
        assert!(!a.rr_client);
    }

    #[test]
    fn encapsulating_pools_stay_with_the_reconciler() {
        let pool = |cidr: &str, vx: EncapMode| PoolInfo {
            name: cidr.into(),
            cidr: cidr.parse().unwrap(),
            vxlan: vx,
            ipip: EncapMode::Never,
            nat_outgoing: false,
            disabled: false,
        };
        let pools = vec![
            pool("10.244.0.0/16", EncapMode::Never),
            pool("10.245.0.0/16", EncapMode::Always),
        ];
        assert!(!reconciler_owns(&pools, &"10.244.1.0/26".parse().unwrap()));
        assert!(reconciler_owns(&pools, &"10.245.1.0/26".parse().unwrap()));
        assert!(!reconciler_owns(&pools, &"10.99.0.0/24".parse().unwrap()));
    }
}
