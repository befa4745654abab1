//! The import policy ([`ImportPolicy`]): which learned routes the speaker uses, and why a
//! refused one was refused ([`Rejection`]). Pure data and functions.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use tern_bgp::rib::ImportFilter;
use tern_model::Node;

use super::plan::{is_rr, node_addrs};
use crate::snapshot::Snapshot;

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

    /// Records the peers that are nodes (by their BGP addresses, IPv4 and IPv6) and which of
    /// them are route reflectors, from the Node resources.
    pub fn set_peer_nodes(&mut self, nodes: &[Node]) {
        for n in nodes {
            for a in node_addrs(n) {
                self.peer_nodes.insert(a, n.metadata.name.clone());
                if is_rr(n) {
                    self.reflectors.insert(a);
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
