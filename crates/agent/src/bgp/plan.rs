//! What the speaker of one node should be doing ([`plan`]): its AS, router ID, session
//! addresses, peers (mesh, global and node-specific BGPPeers, route-reflector clients) and the
//! prefixes it originates, computed from a store snapshot. Pure.
//!
//! IPv6, as Calico's BIRD: a node's sessions use `spec.bgp.ipv4Address` and
//! `spec.bgp.ipv6Address`. The router ID is the IPv4 address, or on a node without one a hash
//! of the node name ([`router_id_hash`], Calico's `CALICO_ROUTER_ID=hash`). A mesh session
//! between two nodes runs over IPv4 when both have an IPv4 address, else over IPv6 when both
//! have an IPv6 one; every session carries both families (MP-BGP), each with the node's own
//! address of that family as next hop. An explicit BGPPeer of a family the node has no address
//! of is left out (Calico writes it to no BIRD).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use tern_bgp::driver::PeerConfig;
use tern_model::{BgpConfigurationSpec, BgpPeer, Node, Selector};

use crate::snapshot::Snapshot;

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
    /// Router ID: the IPv4 address, else [`router_id_hash`] of the node name.
    pub router_id: Ipv4Addr,
    /// IPv4 listen / session address and next hop of IPv4 routes.
    pub v4: Option<Ipv4Addr>,
    /// IPv6 listen / session address and next hop of IPv6 routes.
    pub v6: Option<Ipv6Addr>,
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
    /// This node has no BGP address yet.
    #[error(
        "node {0} has neither spec.bgp.ipv4Address nor spec.bgp.ipv6Address (and no underlay \
         address to use)"
    )]
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

/// The address of a `spec.bgp` address field (`198.18.0.11/24` or without a prefix).
fn bgp_address(
    field: impl Fn(&tern_model::NodeBgpSpec) -> Option<&String>,
    n: &Node,
) -> Option<IpAddr> {
    field(n.spec.bgp.as_ref()?)?.split('/').next()?.parse().ok()
}

pub(super) fn node_v4(n: &Node) -> Option<Ipv4Addr> {
    match bgp_address(|b| b.ipv4_address.as_ref(), n)? {
        IpAddr::V4(v) => Some(v),
        IpAddr::V6(_) => None,
    }
}

pub(super) fn node_v6(n: &Node) -> Option<Ipv6Addr> {
    match bgp_address(|b| b.ipv6_address.as_ref(), n)? {
        IpAddr::V6(v) => Some(v),
        IpAddr::V4(_) => None,
    }
}

/// The node's BGP addresses, both families.
pub(super) fn node_addrs(n: &Node) -> impl Iterator<Item = IpAddr> {
    node_v4(n)
        .map(IpAddr::V4)
        .into_iter()
        .chain(node_v6(n).map(IpAddr::V6))
}

/// The router ID of a node without an IPv4 address, as Calico's `CALICO_ROUTER_ID=hash`: the
/// first four bytes of the SHA-256 of the node name, the first lowered by 32 when above 223 (a
/// router ID outside the multicast and reserved ranges). Stable across restarts.
pub fn router_id_hash(node: &str) -> Ipv4Addr {
    use sha2::Digest;
    let h = sha2::Sha256::digest(node.as_bytes());
    let first = if h[0] > 223 { h[0] - 32 } else { h[0] };
    Ipv4Addr::new(first, h[1], h[2], h[3])
}

pub(super) fn is_rr(n: &Node) -> bool {
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
    let (v4, v6) = (node_v4(own), node_v6(own));
    if v4.is_none() && v6.is_none() {
        return Err(BgpError::NoAddress(me.to_string()));
    }
    let router_id = v4.unwrap_or_else(|| router_id_hash(me));
    let mine = |a: &IpAddr| match a {
        IpAddr::V4(a) => v4 == Some(*a),
        IpAddr::V6(a) => v6 == Some(*a),
    };
    // Whether this node has an address of `a`'s family to run a session from.
    let has_family = |a: &IpAddr| {
        if a.is_ipv4() {
            v4.is_some()
        } else {
            v6.is_some()
        }
    };
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
        // Over IPv4 when both nodes have it, else over IPv6.
        let addr = match (v4, node_v4(n), v6, node_v6(n)) {
            (Some(_), Some(a), _, _) => IpAddr::V4(a),
            (_, _, Some(_), Some(a)) => IpAddr::V6(a),
            _ => return None,
        };
        let mut p = PeerConfig::new(addr, asn_of(n));
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
            if mine(&p.address) || !has_family(&p.address) || out.contains_key(&p.address) {
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
        v4,
        v6,
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
