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
//! Import policy ([`ImportPolicy`], Calico's BIRD filter made explicit): the speaker only
//! uses routes inside an IPPool at its block size or longer, never this node's own blocks or
//! pod addresses, never the underlay or a default route unless a BGPPeer lists the prefix in
//! `acceptPrefixes`. Refused routes stay out of the RIB's best paths (so they are neither
//! installed nor passed on), are counted per peer (`tern_bgp_routes_rejected_total`) and
//! logged (rate-limited). A learned route is never installed over a kernel route of another
//! protocol (the connected underlay, a default route, a pod's route, the reconciler's):
//! new routes are added with `NLM_F_EXCL`, and only tern's own proto-85 routes are replaced or
//! deleted.
//!
//! Learned routes are installed with protocol
//! [`TERN_BGP_ROUTE_PROTOCOL`](tern_linux::TERN_BGP_ROUTE_PROTOCOL) (85), a recursive
//! next hop resolved through the kernel's table when it is not on a connected network. They
//! are desired routes like the reconciler's: planned by `crate::routes::plan` and applied
//! through its loop, over one netlink handle (`install::Installer`).
//! Prefixes inside pools that encapsulate (VXLAN, IPIP) stay with the route reconciler, and
//! the reconciler leaves direct routes of unencapsulated pools to BGP
//! ([`reconciler_owns`]): the two never write the same route. The one hand-over: proto-85
//! routes the speaker no longer routes, because a pool switched to VXLAN/IPIP or the agent
//! now runs without `--bgp`, are left for the reconciler to replace in place
//! (`Dataplane::adopt_bgp_routes`), so the switch from BGP to VXLAN leaves no destination
//! unrouted and no stale BGP route behind.
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
use tern_api::{BgpPeerStatus, BgpStatusReply, PeerState};
use tern_bgp::driver::RouteEvent;
use tern_bgp::driver::{PeerConfig, Speaker, SpeakerConfig, SpeakerHandle};
use tern_bgp::fsm::State;
use tern_bgp::rib::ImportFilter;
use tern_model::{
    BgpConfigurationSpec, BgpPeer, DEFAULT_BGP_CONFIGURATION, Kind, Node, Resource, Selector,
};
use tern_store::{Store, keys};
use tokio::sync::mpsc;

use crate::snapshot::{PoolInfo, Snapshot, load_snapshot, reconciler_owns};

mod install;

use install::Installer;

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
    /// Per peer, the prefixes outside the pools its BGPPeer admits (`acceptPrefixes`), as
    /// (covering prefix, longest length).
    pub accept: BTreeMap<IpAddr, Vec<(IpNet, u8)>>,
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
    let mut accept: BTreeMap<IpAddr, Vec<(IpNet, u8)>> = BTreeMap::new();
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
        let admits = s
            .accept_prefixes
            .iter()
            .map(|a| {
                a.parse().map_err(|e| {
                    BgpError::Config(format!("BGPPeer {}: acceptPrefixes: {e}", bp.metadata.name))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut add = |mut p: PeerConfig| {
            if p.address == IpAddr::V4(router_id) || out.contains_key(&p.address) {
                return;
            }
            p.password = s.password.clone();
            p.keep_original_next_hop = s.keep_original_next_hop;
            if !admits.is_empty() {
                accept.insert(p.address, admits.clone());
            }
            out.insert(p.address, (p, kind));
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
        accept,
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
    // `--use-pod-cidr`: the node's podCIDRs, as its blocks.
    for pc in snap.routed_pod_cidrs() {
        if pc.node == me {
            out.insert(pc.cidr);
        }
    }
    out
}

/// An IPPool as the import policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRange {
    /// Pool CIDR.
    pub cidr: IpNet,
    /// Its `blockSize`: the shortest prefix accepted inside it.
    pub block_size: u8,
    /// No new allocations: only prefixes inside existing blocks are accepted.
    pub disabled: bool,
}

/// What node `me` accepts from its BGP peers. Pure data; [`ImportPolicy::evaluate`] is the
/// filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportPolicy {
    /// The IPPools.
    pub pools: Vec<PoolRange>,
    /// Every allocation block (affine to any node, or none).
    pub blocks: Vec<IpNet>,
    /// This node's blocks.
    pub own_blocks: Vec<IpNet>,
    /// Addresses inside this node's blocks allocated by other nodes: their host routes are
    /// the one thing learned inside an own block.
    pub lent: BTreeSet<IpAddr>,
    /// Addresses this node allocated (its pods, its tunnel addresses).
    pub local: BTreeSet<IpAddr>,
    /// The underlay: this node's interface networks and the networks of its node addresses.
    pub underlay: Vec<IpNet>,
    /// Every node's underlay addresses (ours included).
    pub node_addresses: BTreeSet<IpAddr>,
    /// The prefix length of each node address's own network (`/24` for `198.18.0.12/24`): a
    /// learned route more specific than that would steal the node's traffic.
    pub node_address_len: BTreeMap<IpAddr, u8>,
    /// Per peer, extra prefixes its BGPPeer admits (see [`Plan::accept`]).
    pub accept: BTreeMap<IpAddr, Vec<(IpNet, u8)>>,
    /// Other nodes' blocks: the node holding the affinity (if any) and who allocated each
    /// address in it, so that only the owner announces the block and only the borrower
    /// announces a borrowed address.
    pub remote_blocks: BTreeMap<IpNet, RemoteBlock>,
    /// The node each peer address belongs to (node addresses and BGP addresses).
    pub peer_nodes: BTreeMap<IpAddr, String>,
    /// Peers that are route reflectors: they relay other nodes' routes, so they may announce
    /// any node's block and borrowed addresses.
    pub reflectors: BTreeSet<IpAddr>,
    /// `--use-pod-cidr`: other nodes' podCIDRs and their node. Accepted exactly, inside or
    /// outside a pool, from that node or a route reflector, as a block from its owner.
    pub pod_cidrs: BTreeMap<IpNet, String>,
}

/// Another node's block as the import policy sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteBlock {
    /// The node the block is affine to.
    pub owner: Option<String>,
    /// Allocated addresses and the node that allocated each.
    pub allocated_by: BTreeMap<IpAddr, String>,
}

/// Why the import policy refused a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Inside one of this node's blocks (and not an address lent to another node).
    OwnBlock(IpNet),
    /// The host route of an address this node allocated.
    LocalAddress(IpAddr),
    /// `0.0.0.0/0` or `::/0`.
    DefaultRoute,
    /// Overlaps an underlay network.
    Underlay(IpNet),
    /// Covers a node's underlay address.
    NodeAddress(IpAddr),
    /// Inside no IPPool.
    OutsidePools,
    /// Shorter than the pool's block size.
    ShorterThanBlock {
        /// The pool.
        pool: IpNet,
        /// Its blockSize.
        block_size: u8,
    },
    /// Inside a disabled pool but in no existing block.
    DisabledPool(IpNet),
    /// Another node's block, from a peer that is neither that node nor a route reflector.
    NotBlockOwner(IpNet),
    /// More specific than another node's block and not an address borrowed into it, or a
    /// borrowed address from a peer that is neither its borrower nor a route reflector.
    InsideRemoteBlock(IpNet),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::OwnBlock(b) => write!(f, "inside this node's block {b}"),
            Rejection::LocalAddress(a) => write!(f, "{a} is a local pod or tunnel address"),
            Rejection::DefaultRoute => {
                f.write_str("default route not in the peer's acceptPrefixes")
            }
            Rejection::Underlay(n) => {
                write!(
                    f,
                    "overlaps the underlay network {n} (not in the peer's acceptPrefixes)"
                )
            }
            Rejection::NodeAddress(a) => write!(f, "covers node address {a}"),
            Rejection::OutsidePools => {
                f.write_str("outside every IPPool (and not in the peer's acceptPrefixes)")
            }
            Rejection::ShorterThanBlock { pool, block_size } => {
                write!(f, "shorter than blockSize /{block_size} of pool {pool}")
            }
            Rejection::DisabledPool(p) => {
                write!(f, "inside disabled pool {p} but in no allocated block")
            }
            Rejection::NotBlockOwner(b) => {
                write!(
                    f,
                    "block {b} from a peer that is not its node or a route reflector"
                )
            }
            Rejection::InsideRemoteBlock(b) => write!(
                f,
                "more specific than another node's block {b} and not an address borrowed \
                 into it by the announcing node"
            ),
        }
    }
}

impl ImportPolicy {
    /// The policy of node `me`: `pools` with their block sizes, `underlay` its interface
    /// networks, `accept` the per-peer admitted prefixes.
    pub fn new(
        me: &str,
        snap: &Snapshot,
        pools: Vec<PoolRange>,
        underlay: Vec<IpNet>,
        accept: BTreeMap<IpAddr, Vec<(IpNet, u8)>>,
    ) -> ImportPolicy {
        let mut p = ImportPolicy {
            pools,
            underlay,
            accept,
            ..Default::default()
        };
        for b in &snap.blocks {
            p.blocks.push(b.cidr);
            let mine = b.affinity.as_deref() == Some(me);
            if mine {
                p.own_blocks.push(b.cidr);
            } else {
                p.remote_blocks.insert(
                    b.cidr.trunc(),
                    RemoteBlock {
                        owner: b.affinity.clone(),
                        allocated_by: b.allocations.iter().cloned().collect(),
                    },
                );
            }
            for (ip, by) in &b.allocations {
                if by == me {
                    p.local.insert(*ip);
                } else if mine && !by.is_empty() {
                    p.lent.insert(*ip);
                }
            }
        }
        for pc in snap.routed_pod_cidrs() {
            if pc.node == me {
                p.own_blocks.push(pc.cidr);
            } else {
                p.pod_cidrs.insert(pc.cidr, pc.node.clone());
            }
        }
        for n in &snap.nodes {
            for a in &n.addresses {
                p.node_addresses.insert(a.addr());
                p.node_address_len.insert(a.addr(), a.prefix_len());
                p.peer_nodes.insert(a.addr(), n.name.clone());
                if n.name == me && a.prefix_len() < a.max_prefix_len() {
                    p.underlay.push(a.trunc());
                }
            }
        }
        p.underlay.sort();
        p.underlay.dedup();
        p
    }

    /// Records the peers that are nodes (by their BGP address) and which of them are route
    /// reflectors, from the Node resources.
    pub fn set_peer_nodes(&mut self, nodes: &[Node]) {
        for n in nodes {
            if let Some(a) = node_v4(n) {
                self.peer_nodes
                    .insert(IpAddr::V4(a), n.metadata.name.clone());
                if is_rr(n) {
                    self.reflectors.insert(IpAddr::V4(a));
                }
            }
        }
    }

    /// The filter: `Ok` when the route for `prefix` learned from `peer` may be installed.
    ///
    /// In order, refused whatever the peer's `acceptPrefixes` say: inside this node's blocks
    /// (except the host route of an address lent to another node), this node's own addresses,
    /// a prefix more specific than an underlay network or than a node address's network
    /// (these would move tunnel and BGP traffic). Then admitted when the peer's
    /// `acceptPrefixes` lists it. Then refused: a default route, a prefix overlapping the
    /// underlay or covering a node address. Inside an IPPool, admitted with a length of at
    /// least its blockSize (in a disabled pool only inside an existing block), except inside
    /// another node's block: the block itself only from its node (or a route reflector), a
    /// host route only for an address a different node borrowed into it, from that node (or a
    /// route reflector), and nothing else more specific. Refused otherwise.
    pub fn evaluate(&self, peer: IpAddr, prefix: &IpNet) -> Result<(), Rejection> {
        self.evaluate_via(peer, prefix, None)
    }

    /// [`ImportPolicy::evaluate`] for a route with its next hop: inside another node's block,
    /// a route whose next hop is the entitled node's address counts as that node's (a route
    /// reflector, tern's or an external one, keeps the originator's next hop), since the
    /// traffic goes where the next hop says.
    pub fn evaluate_via(
        &self,
        peer: IpAddr,
        prefix: &IpNet,
        next_hop: Option<IpAddr>,
    ) -> Result<(), Rejection> {
        let prefix = prefix.trunc();
        let host = prefix.prefix_len() == prefix.max_prefix_len();
        if let Some(b) = self.own_blocks.iter().find(|b| b.contains(&prefix))
            && !(host && self.lent.contains(&prefix.addr()))
        {
            return Err(Rejection::OwnBlock(*b));
        }
        if host && self.local.contains(&prefix.addr()) {
            return Err(Rejection::LocalAddress(prefix.addr()));
        }
        // Strictly more specific than an underlay network: it would beat the connected route.
        // (The network itself is left to acceptPrefixes; the kernel check keeps the connected
        // route in place.)
        if let Some(u) = self
            .underlay
            .iter()
            .find(|u| u.contains(&prefix) && prefix.prefix_len() > u.prefix_len())
        {
            return Err(Rejection::Underlay(*u));
        }
        // A range query: the filter runs for every received route.
        if let Some(a) = self
            .node_addresses
            .range(prefix.network()..=prefix.broadcast())
            .find(|a| {
                host || prefix.prefix_len() > self.node_address_len.get(*a).copied().unwrap_or(0)
            })
        {
            return Err(Rejection::NodeAddress(*a));
        }
        if self.accept.get(&peer).is_some_and(|l| {
            l.iter()
                .any(|(net, max)| net.contains(&prefix) && prefix.prefix_len() <= *max)
        }) {
            return Ok(());
        }
        if prefix.prefix_len() == 0 {
            return Err(Rejection::DefaultRoute);
        }
        if let Some(u) = self
            .underlay
            .iter()
            .find(|u| u.contains(&prefix) || prefix.contains(&u.network()))
        {
            return Err(Rejection::Underlay(*u));
        }
        if let Some(a) = self
            .node_addresses
            .range(prefix.network()..=prefix.broadcast())
            .next()
        {
            return Err(Rejection::NodeAddress(*a));
        }
        if let Some(owner) = self.pod_cidrs.get(&prefix) {
            let from_owner = self.peer_nodes.get(&peer) == Some(owner)
                || next_hop.is_some_and(|h| self.peer_nodes.get(&h) == Some(owner));
            if self.reflectors.contains(&peer) || from_owner {
                return Ok(());
            }
            return Err(Rejection::NotBlockOwner(prefix));
        }
        let pool = self
            .pools
            .iter()
            .filter(|p| p.cidr.contains(&prefix))
            .max_by_key(|p| p.cidr.prefix_len())
            .ok_or(Rejection::OutsidePools)?;
        if prefix.prefix_len() < pool.block_size {
            return Err(Rejection::ShorterThanBlock {
                pool: pool.cidr,
                block_size: pool.block_size,
            });
        }
        let block = IpNet::new(prefix.addr(), pool.block_size)
            .map(|b| b.trunc())
            .unwrap_or(prefix);
        if let Some(rb) = self.remote_blocks.get(&block) {
            let relayed = self.reflectors.contains(&peer);
            // Whether the route comes from node `n`: the peer is `n`, or its next hop is.
            let by_node = |n: &String| {
                self.peer_nodes.get(&peer) == Some(n)
                    || next_hop.is_some_and(|h| self.peer_nodes.get(&h) == Some(n))
            };
            if prefix == block {
                if relayed || rb.owner.as_ref().is_some_and(by_node) {
                    return Ok(());
                }
                return Err(Rejection::NotBlockOwner(block));
            }
            if host
                && let Some(by) = rb.allocated_by.get(&prefix.addr())
                && !by.is_empty()
                && Some(by) != rb.owner.as_ref()
                && (relayed || by_node(by))
            {
                return Ok(());
            }
            return Err(Rejection::InsideRemoteBlock(block));
        }
        if pool.disabled && !self.blocks.iter().any(|b| b.contains(&prefix)) {
            return Err(Rejection::DisabledPool(pool.cidr));
        }
        Ok(())
    }

    /// The policy as the speaker's import filter.
    pub fn filter(self: &Arc<Self>) -> ImportFilter {
        let p = self.clone();
        ImportFilter::with_next_hop(move |peer, prefix, nh| {
            p.evaluate_via(peer, prefix, nh).is_ok()
        })
    }
}

/// Per-session figures shared with the status request and `/metrics`.
#[derive(Debug, Default)]
struct Shared {
    status: BgpStatusReply,
    routes_installed: usize,
    /// Routes the import policy refused, per peer, since start.
    routes_rejected: BTreeMap<IpAddr, u64>,
    /// Learned routes not installed because the kernel has a route tern does not own.
    routes_conflicting: usize,
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
    /// `--use-pod-cidr`: advertise this node's podCIDRs, accept the other nodes'.
    pub use_pod_cidr: bool,
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
        crate::runtime::spawn_current_thread("bgp", "BGP", move |_| {
            Runner::new(settings, store, shared).run(rx)
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
                u8::from(p.state == PeerState::Up)
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
        out.push_str("# HELP tern_bgp_routes_rejected_total Routes from the peer refused by the import policy.\n# TYPE tern_bgp_routes_rejected_total counter\n");
        for (peer, n) in &s.routes_rejected {
            let _ = writeln!(out, "tern_bgp_routes_rejected_total{{peer=\"{peer}\"}} {n}");
        }
        out.push_str("# HELP tern_bgp_routes_conflicting Accepted routes not installed: the kernel has a route for the prefix that tern did not install.\n# TYPE tern_bgp_routes_conflicting gauge\n");
        let _ = writeln!(out, "tern_bgp_routes_conflicting {}", s.routes_conflicting);
    }
}

/// What a plan is made of ([`Runner`] reads nodes, the BGP configuration, peers, pools and
/// blocks): the only keys the BGP thread watches, so a pod's endpoint or a policy written
/// anywhere in the cluster does not make every node plan again.
fn watched_prefixes() -> Vec<String> {
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

fn watch_loop(store: &dyn Store, tx: &mpsc::UnboundedSender<Msg>, stop: &AtomicBool) {
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
    /// The import policy of the last plan, and the one the speaker has.
    policy: Arc<ImportPolicy>,
    policy_sent: Option<Arc<ImportPolicy>>,
    /// Rate limit of rejection log lines: window start, lines logged, lines suppressed.
    reject_log: (Instant, u32, u64),
    /// The learned routes in the kernel, and the prefixes a foreign route holds.
    kernel: Installer,
}

/// Rejection log lines per minute (the counter counts all).
const REJECT_LOG_PER_MINUTE: u32 = 20;

impl Runner {
    fn new(settings: BgpSettings, store: Arc<dyn Store>, shared: Arc<Mutex<Shared>>) -> Runner {
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

    fn load_plan(&mut self) -> Result<Plan, BgpError> {
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

    fn underlay_v4(&self) -> Option<IpNet> {
        match self.settings.node_ip {
            Some(ip) => crate::host::local_address(ip).ok(),
            None => crate::host::node_addresses()
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
    fn rejected(&mut self, peer: IpAddr, prefix: IpNet) {
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
    fn sync_kernel(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{BlockInfo, NodeInfo};
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

    /// An explicit peer's spec: its address (`ip` or `ip:port`) and AS number.
    fn explicit(peer_ip: &str, as_number: u32) -> BgpPeerSpec {
        BgpPeerSpec {
            peer_ip: Some(peer_ip.into()),
            as_number: Some(as_number),
            ..Default::default()
        }
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
        let mut tor = explicit("198.18.0.250", 65001);
        tor.password = Some("pw".into());
        tor.keep_original_next_hop = true;
        let mut only_b = explicit("198.18.0.251:2179", 65002);
        only_b.node = Some("b".into());
        let rack1_to_rr = BgpPeerSpec {
            node_selector: Some("rack == 'r1'".into()),
            peer_selector: Some("!has(rack)".into()),
            ..Default::default()
        };
        let peers = vec![
            peer("tor", tor),
            peer("only-b", only_b),
            peer("rack1-to-rr", rack1_to_rr),
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

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// Node a: pool 10.244.0.0/16 (/26 blocks), disabled pool 10.250.0.0/16 with one block,
    /// own block 10.244.1.0/26 with pod .1 and .5 lent to b, a pod of a borrowed in b's
    /// block (.9), underlay 198.18.0.0/24; node b at 198.18.0.12, c at 198.18.5.13.
    fn policy() -> ImportPolicy {
        let mut s = snap();
        s.blocks[0].allocations.push((ip("10.244.1.5"), "b".into()));
        s.blocks.push(BlockInfo {
            cidr: n("10.250.3.0/26"),
            affinity: Some("c".into()),
            allocations: vec![],
        });
        s.nodes = vec![
            NodeInfo {
                name: "a".into(),
                addresses: vec![n("198.18.0.11/24")],
                vxlan_tunnel_addr: None,
                vtep_mac: None,
            },
            NodeInfo {
                name: "b".into(),
                addresses: vec![n("198.18.0.12/24")],
                vxlan_tunnel_addr: None,
                vtep_mac: None,
            },
            NodeInfo {
                name: "c".into(),
                addresses: vec![n("198.18.5.13/24")],
                vxlan_tunnel_addr: None,
                vtep_mac: None,
            },
        ];
        let pools = vec![
            PoolRange {
                cidr: n("10.244.0.0/16"),
                block_size: 26,
                disabled: false,
            },
            PoolRange {
                cidr: n("10.250.0.0/16"),
                block_size: 26,
                disabled: true,
            },
            PoolRange {
                cidr: n("fd00:244::/48"),
                block_size: 122,
                disabled: false,
            },
        ];
        let mut accept = BTreeMap::new();
        accept.insert(
            ip("198.18.0.250"),
            vec![
                (n("0.0.0.0/0"), 0),
                (n("10.99.0.0/16"), 24),
                (n("198.18.7.0/24"), 24),
            ],
        );
        // The interface list also has the node's own subnet (dedup'ed).
        ImportPolicy::new(
            "a",
            &s,
            pools,
            vec![n("198.18.0.0/24"), n("fe80::/64")],
            accept,
        )
    }

    #[test]
    fn import_policy_accepts_only_pool_prefixes_at_block_size_or_longer() {
        let p = policy();
        let tor = ip("198.18.0.250");
        let mesh = ip("198.18.0.12");
        let ok = |peer: IpAddr, s: &str| p.evaluate(peer, &n(s));
        let c = ip("198.18.5.13");
        // Legitimate: b's block from b, a v6 prefix in no known block, an address of our own
        // block lent to b (from b), a block of a disabled pool from its node c.
        for (from, good) in [
            (mesh, "10.244.2.0/26"),
            (mesh, "10.244.9.0/26"),
            (mesh, "fd00:244::40/122"),
            (mesh, "10.244.1.5/32"),
            (c, "10.250.3.0/26"),
        ] {
            assert_eq!(ok(from, good), Ok(()), "{good}");
        }
        let shorter = Rejection::ShorterThanBlock {
            pool: n("10.244.0.0/16"),
            block_size: 26,
        };
        let cases: &[(IpAddr, &[&str], Result<(), Rejection>)] = &[
            (mesh, &["0.0.0.0/0", "::/0"], Err(Rejection::DefaultRoute)),
            (
                mesh,
                &["198.18.0.0/24", "198.18.0.11/32", "198.18.0.0/16"],
                Err(Rejection::Underlay(n("198.18.0.0/24"))),
            ),
            (mesh, &["198.18.5.0/24"], Err(Rejection::NodeAddress(c))),
            (
                mesh,
                &["fe80::/64"],
                Err(Rejection::Underlay(n("fe80::/64"))),
            ),
            (
                mesh,
                &["10.99.0.0/24", "192.0.2.0/24"],
                Err(Rejection::OutsidePools),
            ),
            (
                mesh,
                &["10.244.0.0/16", "10.244.0.0/24", "10.244.2.0/25"],
                Err(shorter),
            ),
            (
                mesh,
                &["10.250.4.0/26"],
                Err(Rejection::DisabledPool(n("10.250.0.0/16"))),
            ),
            // Our own block, anything inside it, our pods and our borrowed address: never.
            (
                tor,
                &[
                    "10.244.1.0/26",
                    "10.244.1.0/27",
                    "10.244.1.1/32",
                    "10.244.1.6/32",
                ],
                Err(Rejection::OwnBlock(n("10.244.1.0/26"))),
            ),
            (
                tor,
                &["10.244.2.9/32"],
                Err(Rejection::LocalAddress(ip("10.244.2.9"))),
            ),
            // The ToR's acceptPrefixes admit exactly what they list, to it alone.
            (tor, &["0.0.0.0/0", "10.99.0.0/24", "198.18.7.0/24"], Ok(())),
            (tor, &["10.99.0.0/25"], Err(Rejection::OutsidePools)),
            (tor, &["::/0"], Err(Rejection::DefaultRoute)),
            // Another node's block only from that node (or a route reflector, or a peer whose
            // acceptPrefixes list it).
            (
                tor,
                &["10.244.2.0/26"],
                Err(Rejection::NotBlockOwner(n("10.244.2.0/26"))),
            ),
        ];
        for (from, prefixes, want) in cases {
            for prefix in *prefixes {
                assert_eq!(&ok(*from, prefix), want, "{prefix} from {from}");
            }
        }
        // The filter the speaker gets says the same.
        let f = Arc::new(p.clone()).filter();
        assert!(f.accepts(mesh, &n("10.244.2.0/26")));
        assert!(!f.accepts(mesh, &n("0.0.0.0/0")) && f.accepts(tor, &n("0.0.0.0/0")));
        // Every rejection explains itself.
        assert_eq!(
            ok(mesh, "10.244.0.0/24").unwrap_err().to_string(),
            "shorter than blockSize /26 of pool 10.244.0.0/16"
        );
    }

    /// F8: inside another node's block, only that node announces the block, only a borrower
    /// announces its borrowed address, nothing else more specific is taken from anyone; a
    /// route reflector relays them; acceptPrefixes admit what they list, but never a route
    /// more specific than a node address's network or inside the underlay.
    #[test]
    fn import_policy_refuses_hijacks_of_other_nodes_pods() {
        let mut s = snap();
        // c (198.18.5.13) borrowed 10.244.2.20 from b's block.
        s.blocks[1]
            .allocations
            .push((ip("10.244.2.20"), "c".into()));
        s.nodes = ["a", "b", "c"]
            .iter()
            .zip(["198.18.0.11/24", "198.18.0.12/24", "198.18.5.13/24"])
            .map(|(name, a)| NodeInfo {
                name: name.to_string(),
                addresses: vec![n(a)],
                vxlan_tunnel_addr: None,
                vtep_mac: None,
            })
            .collect();
        let pools = vec![PoolRange {
            cidr: n("10.244.0.0/16"),
            block_size: 26,
            disabled: false,
        }];
        let (b, c, ext) = (ip("198.18.0.12"), ip("198.18.5.13"), ip("198.18.9.1"));
        let rr = ip("198.18.0.20");
        let mut accept = BTreeMap::new();
        accept.insert(ext, vec![(n("10.0.0.0/8"), 32), (n("198.18.0.0/16"), 32)]);
        let mut p = ImportPolicy::new("a", &s, pools, vec![n("198.18.0.0/24")], accept);
        p.set_peer_nodes(&[
            node("r", Some("198.18.0.20"), true, &[]),
            node("c", Some("198.18.5.13"), false, &[]),
        ]);
        let ok = |peer: IpAddr, s: &str| p.evaluate(peer, &n(s));
        let blk = n("10.244.2.0/26");
        let inside = Rejection::InsideRemoteBlock(blk);
        let node_address = Rejection::NodeAddress(c);
        let cases: &[(&str, &[IpAddr], Result<(), Rejection>)] = &[
            // The block: from b, or relayed by the route reflector; not from c.
            ("10.244.2.0/26", &[b, rr], Ok(())),
            ("10.244.2.0/26", &[c], Err(Rejection::NotBlockOwner(blk))),
            // A pod of b as /32: from nobody (b does not announce its own pods' host routes).
            ("10.244.2.1/32", &[b, c, rr], Err(inside.clone())),
            // The address c borrowed: from c or the reflector, not from b.
            ("10.244.2.20/32", &[c, rr], Ok(())),
            ("10.244.2.20/32", &[b], Err(inside.clone())),
            // A more specific than the block, from anyone: refused (it would win by LPM).
            ("10.244.2.0/27", &[b], Err(inside.clone())),
            // acceptPrefixes: an explicit peer admitted 10.0.0.0/8 gets the blocks it lists...
            ("10.244.2.1/32", &[ext], Ok(())),
            // ...and a route to a node's network (routing as usual)...
            ("198.18.5.0/24", &[ext], Ok(())),
            // ...but never another node's underlay address or the underlay itself.
            ("198.18.5.13/32", &[ext], Err(node_address.clone())),
            ("198.18.5.0/25", &[ext], Err(node_address)),
            (
                "198.18.0.128/25",
                &[ext],
                Err(Rejection::Underlay(n("198.18.0.0/24"))),
            ),
        ];
        for (prefix, peers, want) in cases {
            for from in *peers {
                assert_eq!(&ok(*from, prefix), want, "{prefix} from {from}");
            }
        }
        // An external reflector (not a Node): the route counts as the next hop's node's.
        let bird = ip("198.18.0.30");
        for (prefix, next_hop, want) in [
            (blk, b, Ok(())),
            (blk, bird, Err(Rejection::NotBlockOwner(blk))),
            (n("10.244.2.20/32"), c, Ok(())),
            (n("10.244.2.1/32"), b, Err(inside)),
        ] {
            assert_eq!(
                p.evaluate_via(bird, &prefix, Some(next_hop)),
                want,
                "{prefix} via {next_hop}"
            );
        }
    }

    #[test]
    fn accept_prefixes_follow_the_bgppeer_that_wins_the_address() {
        use tern_model::AcceptPrefix;
        let cfg = BgpConfigurationSpec::default();
        let ap = |c: &str, m: Option<u8>| AcceptPrefix {
            cidr: c.into(),
            max_length: m,
        };
        let mut tor = explicit("198.18.0.250", 65001);
        tor.accept_prefixes = vec![ap("0.0.0.0/0", None), ap("10.99.0.0/16", Some(24))];
        let mut tor_again = explicit("198.18.0.250", 65001);
        tor_again.accept_prefixes = vec![ap("192.0.2.0/24", None)];
        let peers = vec![peer("tor", tor), peer("tor-again", tor_again)];
        let p = plan("a", &nodes(), &cfg, &peers, &snap()).unwrap();
        assert_eq!(
            p.accept.get(&ip("198.18.0.250")),
            Some(&vec![(n("0.0.0.0/0"), 0), (n("10.99.0.0/16"), 24)])
        );
        assert_eq!(p.accept.len(), 1, "mesh peers admit nothing extra");
        let mut bad = peers.clone();
        bad[0].spec.accept_prefixes = vec![ap("10.0.0.1/8", None)];
        let e = plan("a", &nodes(), &cfg, &bad, &snap()).unwrap_err();
        assert!(e.to_string().contains("BGPPeer tor: acceptPrefixes"), "{e}");
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
