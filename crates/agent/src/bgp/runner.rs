//! The BGP thread: the store watch that wakes it ([`watch_loop`]) and the [`Runner`], which
//! re-plans on every change, (re)starts the speaker, applies the import policy to route
//! events, keeps the status and syncs the learned routes into the kernel (`install`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use ipnet::IpNet;
use tern_api::{BgpPeerStatus, BgpStatusReply, PeerState};
use tern_bgp::driver::RouteEvent;
use tern_bgp::driver::{Speaker, SpeakerConfig, SpeakerHandle};
use tern_bgp::fsm::State;
use tern_model::{BgpConfigurationSpec, BgpPeer, DEFAULT_BGP_CONFIGURATION, Kind, Node, Resource};
use tern_store::{Store, keys};
use tokio::sync::mpsc;

use super::import::{ImportPolicy, PoolRange};
use super::install::Installer;
use super::plan::{BgpError, PeerKind, Plan, node_v4, node_v6, plan};
use super::status::Shared;
use crate::snapshot::{PoolInfo, load_snapshot, reconciler_owns};

/// Graceful-restart time advertised, and how long stale routes survive our own restart.
pub(super) const RESTART_TIME: u16 = 120;

pub(super) enum Msg {
    Changed,
    /// A fresh status snapshot for `ternctl node status`.
    Status(std::sync::mpsc::Sender<BgpStatusReply>),
    Stop(std::sync::mpsc::Sender<()>),
}

/// Settings of [`Bgp::start`].
#[derive(Debug, Clone)]
pub struct BgpSettings {
    /// This node.
    pub node_name: String,
    /// `--node-ip`: the address written to `spec.bgp.ipv4Address` (or `ipv6Address`) when
    /// unset.
    pub node_ip: Option<IpAddr>,
    /// The IPv6 address of a dual-stack `--node-ip` (`v4,v6`), written to
    /// `spec.bgp.ipv6Address` when unset.
    pub node_ip6: Option<IpAddr>,
    /// `--use-pod-cidr`: advertise this node's podCIDRs, accept the other nodes'.
    pub use_pod_cidr: bool,
}

/// What a plan is made of ([`Runner`] reads nodes, the BGP configuration, peers, pools and
/// blocks): the only keys the BGP thread watches, so a pod's endpoint or a policy written
/// anywhere in the cluster does not make every node plan again.
pub(super) fn watched_prefixes() -> Vec<String> {
    let mut p: Vec<String> = [
        Kind::Node,
        Kind::BgpConfiguration,
        Kind::BgpPeer,
        Kind::IpPool,
    ]
    .iter()
    .map(|k| keys::resource_prefix(k.as_str()))
    .collect();
    p.push(keys::BLOCKS.to_string());
    p
}

/// The speaker's listen addresses, for the log.
fn listen_addresses(plan: &Plan) -> String {
    let mut v: Vec<String> = Vec::new();
    if let Some(a) = plan.v4 {
        v.push(SocketAddr::new(IpAddr::V4(a), plan.port).to_string());
    }
    if let Some(a) = plan.v6 {
        v.push(SocketAddr::new(IpAddr::V6(a), plan.port).to_string());
    }
    v.join(" and ")
}

pub(super) fn watch_loop(store: &dyn Store, tx: &mpsc::UnboundedSender<Msg>, stop: &AtomicBool) {
    let mut watch: Option<Box<dyn tern_store::Watch>> = None;
    let prefixes = watched_prefixes();
    let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
    while !stop.load(Ordering::Relaxed) {
        let w = match watch.as_mut() {
            Some(w) => w,
            None => match store
                .revision()
                .and_then(|rev| store.watch_prefixes(&prefixes, rev))
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
pub(super) struct Runner {
    pub(super) settings: BgpSettings,
    pub(super) store: Arc<dyn Store>,
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) speaker: Option<(SpeakerHandle, Plan)>,
    pub(super) events: Option<mpsc::UnboundedReceiver<RouteEvent>>,
    pub(super) kinds: BTreeMap<IpAddr, PeerKind>,
    /// Learned routes we want in the kernel.
    pub(super) learned: BTreeMap<IpNet, IpAddr>,
    pub(super) pools: Vec<PoolInfo>,
    pub(super) own: BTreeSet<IpNet>,
    /// Proto-85 routes found at start (we restarted); removed unless learned again.
    pub(super) stale: Option<BTreeSet<IpNet>>,
    pub(super) started: Instant,
    pub(super) last_states: BTreeMap<IpAddr, State>,
    /// The import policy of the last plan, and the one the speaker has.
    pub(super) policy: Arc<ImportPolicy>,
    pub(super) policy_sent: Option<Arc<ImportPolicy>>,
    /// Rate limit of rejection log lines: window start, lines logged, lines suppressed.
    pub(super) reject_log: (Instant, u32, u64),
    /// The learned routes in the kernel, and the prefixes a foreign route holds.
    pub(super) kernel: Installer,
}

/// Rejection log lines per minute (the counter counts all).
pub(super) const REJECT_LOG_PER_MINUTE: u32 = 20;

impl Runner {
    pub(super) fn new(
        settings: BgpSettings,
        store: Arc<dyn Store>,
        shared: Arc<Mutex<Shared>>,
    ) -> Runner {
        let mut kernel = Installer::system();
        let stale = kernel.installed().unwrap_or_default();
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
            policy: Arc::new(ImportPolicy::default()),
            policy_sent: None,
            reject_log: (Instant::now(), 0, 0),
            kernel,
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
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
                (
                    cur.asn,
                    cur.router_id,
                    cur.v4,
                    cur.v6,
                    cur.port,
                    cur.cluster_id,
                ) != (
                    plan.asn,
                    plan.router_id,
                    plan.v4,
                    plan.v6,
                    plan.port,
                    plan.cluster_id,
                )
            }
            None => true,
        };
        if restart {
            if let Some((h, _)) = self.speaker.take() {
                log::info!(
                    "BGP: AS, router ID, address, port or cluster ID changed: restarting the speaker"
                );
                h.shutdown().await;
            }
            let mut c = SpeakerConfig::new(plan.asn, plan.router_id);
            // Listen on (and connect from) the node's address of each family; routes of each
            // family carry the node's address of that family as next hop, whatever the
            // session's family (IPv6 blocks over an IPv4 session, as Calico's BIRD).
            let v4 = plan.v4.map(|a| SocketAddr::new(IpAddr::V4(a), plan.port));
            let v6 = plan.v6.map(|a| SocketAddr::new(IpAddr::V6(a), plan.port));
            c.listen = v4.or(v6);
            c.listen_also = v4.and(v6);
            c.next_hop_v4 = plan.v4;
            c.next_hop_v6 = plan.v6;
            c.cluster_id = plan.cluster_id;
            c.graceful_restart_time = Some(RESTART_TIME);
            c.restarting = self.stale.is_some();
            c.connect_retry = Duration::from_secs(1);
            c.connect_retry_max = Duration::from_secs(5);
            match Speaker::start(c).await {
                Ok(mut h) => {
                    log::info!(
                        "BGP speaker AS {} router ID {} listening on {}{}",
                        plan.asn,
                        plan.router_id,
                        listen_addresses(&plan),
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
                    self.policy_sent = None;
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
        // The filter goes first: no route of a peer added below is ever used unfiltered.
        if self.policy_sent.as_ref() != Some(&self.policy) {
            match h.set_import_filter(Some(self.policy.filter())).await {
                Ok(()) => self.policy_sent = Some(self.policy.clone()),
                Err(e) => {
                    log::warn!("BGP: setting the import policy: {e}");
                    return;
                }
            }
        }
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

    pub(super) fn load_plan(&mut self) -> Result<Plan, BgpError> {
        let store = &*self.store;
        let me = self.settings.node_name.clone();
        let st = |e: tern_model::ModelError| BgpError::Store(e.to_string());
        let mut nodes: Vec<Node> = tern_model::list_resources_warn(store, Kind::Node, "BGP")
            .map_err(st)?
            .into_iter()
            .filter_map(|r| match r {
                Resource::Node(n) => Some(n),
                _ => None,
            })
            .collect();
        if let Some(own) = nodes.iter_mut().find(|n| n.metadata.name == me)
            && (node_v4(own).is_none() || node_v6(own).is_none())
        {
            let (v4, v6) = self.underlay();
            let mut recorded = Vec::new();
            if node_v4(own).is_none()
                && let Some(addr) = v4
            {
                let bgp = own.spec.bgp.get_or_insert_with(Default::default);
                bgp.ipv4_address = Some(addr.to_string());
                recorded.push(format!("spec.bgp.ipv4Address {addr}"));
            }
            if node_v6(own).is_none()
                && let Some(addr) = v6
            {
                let bgp = own.spec.bgp.get_or_insert_with(Default::default);
                bgp.ipv6_address = Some(addr.to_string());
                recorded.push(format!("spec.bgp.ipv6Address {addr}"));
            }
            if !recorded.is_empty() {
                // resourceVersion makes this a compare-and-swap: a concurrent write wins and
                // the next pass retries.
                tern_model::put_resource(store, &Resource::Node(own.clone())).map_err(st)?;
                log::info!("BGP: recorded {} on Node {me}", recorded.join(" and "));
            }
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
        let peers: Vec<BgpPeer> = tern_model::list_resources_warn(store, Kind::BgpPeer, "BGP")
            .map_err(st)?
            .into_iter()
            .filter_map(|r| match r {
                Resource::BgpPeer(p) => Some(p),
                _ => None,
            })
            .collect();
        let mut snap = load_snapshot(store).map_err(BgpError::Store)?;
        snap.use_pod_cidr = self.settings.use_pod_cidr;
        self.pools = snap.pools.clone();
        let ranges = tern_model::list_resources_warn(store, Kind::IpPool, "BGP")
            .map_err(st)?
            .into_iter()
            .filter_map(|mut r| {
                r.fill_defaults();
                match r {
                    Resource::IpPool(p) => Some(PoolRange {
                        cidr: p.spec.net()?.trunc(),
                        block_size: p.spec.block_size,
                        disabled: p.spec.disabled,
                    }),
                    _ => None,
                }
            })
            .collect();
        let underlay = crate::host::local_subnets().map_err(|e| BgpError::Config(e.to_string()))?;
        let plan = plan(&me, &nodes, &config, &peers, &snap)?;
        let mut policy = ImportPolicy::new(&me, &snap, ranges, underlay, plan.accept.clone());
        policy.set_peer_nodes(&nodes);
        if *self.policy != policy {
            self.policy = Arc::new(policy);
        }
        Ok(plan)
    }

    /// The node's underlay addresses to record as its BGP addresses, IPv4 and IPv6: the
    /// families of `--node-ip` from it, the others from the default-route interfaces
    /// (`host::node_addresses`, which never gives a link-local address).
    pub(super) fn underlay(&self) -> (Option<IpNet>, Option<IpNet>) {
        let given: Vec<IpNet> = [self.settings.node_ip, self.settings.node_ip6]
            .into_iter()
            .flatten()
            .filter_map(|ip| crate::host::local_address(ip).ok())
            .collect();
        let found = crate::host::node_addresses();
        let pick = |v6: bool| {
            given
                .iter()
                .chain(&found)
                .find(|a| a.addr().is_ipv6() == v6)
                .copied()
        };
        (pick(false), pick(true))
    }

    pub(super) fn wanted(&self, prefix: &IpNet) -> bool {
        !self.own.contains(prefix) && !reconciler_owns(&self.pools, prefix)
    }

    pub(super) fn route_event(&mut self, e: RouteEvent) {
        match e {
            RouteEvent::Install { prefix, next_hop } => {
                self.learned.insert(prefix, next_hop);
                if self.wanted(&prefix) {
                    self.kernel.sync_one(prefix, Some(next_hop));
                }
            }
            RouteEvent::Rejected { peer, prefix } => self.rejected(peer, prefix),
            RouteEvent::Remove { prefix } => {
                self.learned.remove(&prefix);
                self.kernel.conflicts.remove(&prefix);
                // In a pool that encapsulates, the reconciler replaces our old route in place
                // (`Dataplane::adopt_bgp_routes`): removing it here would leave a gap.
                if !reconciler_owns(&self.pools, &prefix) {
                    self.kernel.sync_one(prefix, None);
                }
            }
        }
        let conflicts = &self.kernel.conflicts;
        let mut s = self.shared.lock().unwrap();
        s.routes_installed = self
            .learned
            .keys()
            .filter(|p| self.wanted(p) && !conflicts.contains(p))
            .count();
        s.routes_conflicting = conflicts.len();
    }

    /// Counts and (rate-limited) logs a route the import policy refused.
    pub(super) fn rejected(&mut self, peer: IpAddr, prefix: IpNet) {
        *self
            .shared
            .lock()
            .unwrap()
            .routes_rejected
            .entry(peer)
            .or_default() += 1;
        let (start, logged, suppressed) = &mut self.reject_log;
        if start.elapsed() > Duration::from_secs(60) {
            if *suppressed > 0 {
                log::warn!(
                    "BGP: {suppressed} more routes rejected by the import policy in the last minute"
                );
            }
            *start = Instant::now();
            *logged = 0;
            *suppressed = 0;
        }
        if *logged < REJECT_LOG_PER_MINUTE {
            *logged += 1;
            let why = match self.policy.evaluate(peer, &prefix) {
                Err(r) => r.to_string(),
                Ok(()) => "import policy".to_string(),
            };
            log::warn!("BGP: rejected {prefix} from peer {peer}: {why}");
        } else {
            *suppressed += 1;
        }
    }

    /// Makes the kernel's proto-85 routes match the learned routes (the same plan and apply
    /// as every route: missing ones installed, changed next hops replaced) and, once stale
    /// routes of a previous run may go, removes the rest.
    pub(super) fn sync_kernel(&mut self) {
        let want: BTreeMap<IpNet, IpAddr> = self
            .learned
            .iter()
            .filter(|(p, _)| self.wanted(p))
            .map(|(p, n)| (*p, *n))
            .collect();
        self.kernel.conflicts.retain(|p| want.contains_key(p));
        // Stale routes of a previous run stay until every session is back (they keep traffic
        // flowing meanwhile) or the restart time is over.
        if self.stale.is_some() {
            let all_up = !self.last_states.is_empty()
                && self.last_states.values().all(|s| *s == State::Established);
            if (all_up && self.started.elapsed() > Duration::from_secs(5))
                || self.started.elapsed() > Duration::from_secs(RESTART_TIME.into())
            {
                self.stale = None;
            }
        }
        // Routes in pools that encapsulate (one switched from BGP to VXLAN) are left to the
        // reconciler, which replaces them in place with its tunnel routes.
        let pools = &self.pools;
        self.kernel
            .sync_all(&want, self.stale.is_none(), &|p| reconciler_owns(pools, p));
        let conflicts = self.kernel.conflicts.len();
        let mut s = self.shared.lock().unwrap();
        s.routes_installed = want.len().saturating_sub(conflicts);
        s.routes_conflicting = conflicts;
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
                        PeerState::Up
                    } else {
                        PeerState::Start
                    },
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
