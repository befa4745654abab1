//! Node registration: the Node resource (underlay addresses, VXLAN tunnel address and VTEP MAC
//! of each family, IPIP tunnel address, pod MTU), tunnel addresses allocated through IPAM, and
//! the liveness lease.

use crate::routes::{vtep_mac, vtep_mac_v6};
use crate::snapshot::PoolInfo;
use ipnet::IpNet;
use std::net::IpAddr;
use std::time::Duration;
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_model::{EncapMode, Kind, Node, NodeAddress, NodeSpec, Resource};
use tern_store::{Op, Store, Txn, keys};

/// Node annotation carrying the IPIP tunnel address (the Node spec has no field for it).
pub const IPIP_TUNNEL_ANNOTATION: &str = "tern.dev/ipv4IPIPTunnelAddr";

/// Errors of node registration.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// `--node-ip` names an address no local interface has, or the interfaces cannot be read.
    #[error(transparent)]
    Host(#[from] crate::host::HostError),
    /// Reading local interfaces failed.
    #[error("reading local interfaces: {0}")]
    Linux(#[from] tern_linux::LinuxError),
    /// The store failed.
    #[error("datastore: {0}")]
    Store(#[from] tern_store::StoreError),
    /// Reading or writing the Node failed.
    #[error("Node {node}: {source}")]
    Model {
        node: String,
        #[source]
        source: tern_model::ModelError,
    },
    /// Allocating or releasing a tunnel address failed.
    #[error("tunnel address {handle}: {source}")]
    Ipam {
        handle: String,
        #[source]
        source: tern_ipam::IpamError,
    },
}

/// A tunnel device whose address a node holds through IPAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tunnel {
    /// `vxlan.tern`: IPv4 pools using VXLAN.
    Vxlan,
    /// `vxlan-v6.tern`: IPv6 pools using VXLAN.
    VxlanV6,
    /// `tunl0`: IPv4 pools using IPIP.
    Ipip,
}

impl Tunnel {
    /// The IPAM handle of `node`'s address of this tunnel.
    pub fn handle(self, node: &str) -> String {
        match self {
            Tunnel::Vxlan => format!("vxlan-tunnel-addr-{node}"),
            Tunnel::VxlanV6 => format!("vxlan-v6-tunnel-addr-{node}"),
            Tunnel::Ipip => format!("ipip-tunnel-addr-{node}"),
        }
    }

    /// The pools that need an address of this tunnel: enabled pools of its family using its
    /// encapsulation.
    pub fn pools(self, pools: &[PoolInfo]) -> Vec<&PoolInfo> {
        pools
            .iter()
            .filter(|p| !p.disabled && p.cidr.addr().is_ipv6() == (self == Tunnel::VxlanV6))
            .filter(|p| {
                let m = if self == Tunnel::Ipip {
                    p.ipip
                } else {
                    p.vxlan
                };
                m != EncapMode::Never
            })
            .collect()
    }
}

/// Ensures the node holds a tunnel address under `handle` from one of `pools` when `pools` is
/// not empty (preferring its own blocks: the allocator fills affine blocks first), and holds
/// none otherwise. Returns the address held. The address is of the pools' family (one family
/// per handle: [`Tunnel::pools`] gives pools of one).
pub fn ensure_tunnel_address(
    ipam: &Ipam,
    node: &str,
    handle: &str,
    pools: &[&PoolInfo],
) -> Result<Option<IpAddr>, NodeError> {
    let err = |source| NodeError::Ipam {
        handle: handle.to_string(),
        source,
    };
    let held = ipam.ips_by_handle(handle).map_err(err)?;
    if pools.is_empty() {
        if !held.is_empty() {
            ipam.release_by_handle(handle).map_err(err)?;
            log::info!("released tunnel address(es) {held:?} ({handle}): no pool needs them");
            let _ = crate::owners::delete_owner(ipam.store().as_ref(), node, handle);
        }
        return Ok(None);
    }
    let v6 = pools[0].cidr.addr().is_ipv6();
    if let Some(ip) = held
        .iter()
        .find(|ip| ip.is_ipv6() == v6 && pools.iter().any(|p| p.cidr.contains(*ip)))
    {
        return Ok(Some(*ip));
    }
    if !held.is_empty() {
        // Held from a pool that no longer asks for a tunnel: give it back, take a new one.
        ipam.release_by_handle(handle).map_err(err)?;
    }
    // The owner record (no netns) keeps leak repair away from an address no endpoint uses.
    crate::owners::record_owner(
        ipam.store().as_ref(),
        &crate::owners::OwnerRecord {
            handle: handle.to_string(),
            node: node.to_string(),
            network: "tunnel".to_string(),
            ..Default::default()
        },
    )?;
    let got = ipam
        .auto_assign(&AssignArgs {
            handle: handle.to_string(),
            node: node.to_string(),
            attrs: AllocationAttrs {
                node: node.to_string(),
                ..Default::default()
            },
            num_v4: usize::from(!v6),
            num_v6: usize::from(v6),
            v4_pools: if v6 { vec![] } else { names(pools) },
            v6_pools: if v6 { names(pools) } else { vec![] },
        })
        .map_err(err)?;
    log::info!("allocated tunnel address {got:?} ({handle})");
    Ok(got.first().copied())
}

fn names(pools: &[&PoolInfo]) -> Vec<String> {
    pools.iter().map(|p| p.name.clone()).collect()
}

/// What this node records about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Underlay addresses (with prefix).
    pub addresses: Vec<IpNet>,
    /// VXLAN tunnel address, when a VXLAN pool exists.
    pub vxlan_tunnel_addr: Option<IpAddr>,
    /// IPv6 VXLAN tunnel address, when an IPv6 VXLAN pool exists.
    pub vxlan_tunnel_addr_v6: Option<IpAddr>,
    /// IPIP tunnel address, when an IPIP pool exists.
    pub ipip_tunnel_addr: Option<IpAddr>,
    /// Pod MTU computed by this node.
    pub pod_mtu: u32,
}

/// Writes the node's Node resource (compare-and-swap, retried), keeping fields others set.
/// Returns the pod MTUs other nodes recorded.
pub fn write_node(
    store: &dyn Store,
    node: &str,
    reg: &Registration,
) -> Result<Vec<(String, u32)>, NodeError> {
    let merr = |source| NodeError::Model {
        node: node.to_string(),
        source,
    };
    let addresses: Vec<NodeAddress> = reg
        .addresses
        .iter()
        .map(|a| NodeAddress {
            address: a.to_string(),
            kind: Some("InternalIP".into()),
        })
        .collect();
    for attempt in 0..5 {
        let existing = tern_model::get_resource(store, Kind::Node, None, node).map_err(merr)?;
        let mut n = match existing {
            Some(Resource::Node(n)) => n,
            _ => {
                let mut n = Node::new(node.to_string(), NodeSpec::default());
                n.metadata.resource_version = Some("0".into());
                n
            }
        };
        let before = n.clone();
        if !addresses.is_empty() {
            n.spec.addresses = addresses.clone();
        }
        n.spec.ipv4_vxlan_tunnel_addr = reg.vxlan_tunnel_addr.map(|a| a.to_string());
        n.spec.vxlan_tunnel_mac_addr = reg
            .vxlan_tunnel_addr
            .map(|_| tern_linux::netlink::format_mac(&vtep_mac(node)));
        n.spec.ipv6_vxlan_tunnel_addr = reg.vxlan_tunnel_addr_v6.map(|a| a.to_string());
        n.spec.vxlan_tunnel_mac_addr_v6 = reg
            .vxlan_tunnel_addr_v6
            .map(|_| tern_linux::netlink::format_mac(&vtep_mac_v6(node)));
        match reg.ipip_tunnel_addr {
            Some(a) => {
                n.metadata
                    .annotations
                    .insert(IPIP_TUNNEL_ANNOTATION.into(), a.to_string());
            }
            None => {
                n.metadata.annotations.remove(IPIP_TUNNEL_ANNOTATION);
            }
        }
        n.metadata
            .annotations
            .insert(crate::mtu::MTU_ANNOTATION.into(), reg.pod_mtu.to_string());
        if n == before {
            break;
        }
        match tern_model::put_resource(store, &Resource::Node(n)) {
            Ok(_) => break,
            Err(tern_model::ModelError::Conflict { .. }) if attempt < 4 => continue,
            Err(e) => return Err(merr(e)),
        }
    }
    let mut others = Vec::new();
    for r in tern_model::list_resources_warn(store, Kind::Node, "mtu").map_err(merr)? {
        if let Resource::Node(n) = r
            && n.metadata.name != node
            && let Some(m) = n
                .metadata
                .annotations
                .get(crate::mtu::MTU_ANNOTATION)
                .and_then(|m| m.parse().ok())
        {
            others.push((n.metadata.name.clone(), m));
        }
    }
    Ok(others)
}

/// The node's liveness lease: `keys::node_liveness(node)` attached to a store lease kept
/// alive by the maintenance loop; when the agent dies, the key expires.
pub struct Liveness {
    lease: std::sync::Mutex<Option<i64>>,
    ttl: Duration,
}

impl Liveness {
    /// A lease of `ttl` (not yet granted).
    pub fn new(ttl: Duration) -> Liveness {
        Liveness {
            lease: std::sync::Mutex::new(None),
            ttl,
        }
    }

    /// Renews the lease, or grants a new one and re-attaches the liveness key when it is gone
    /// (expired during a datastore outage, or never granted).
    pub fn keepalive(&self, store: &dyn Store, node: &str) -> Result<(), NodeError> {
        let mut lease = self.lease.lock().unwrap();
        if let Some(id) = *lease {
            match store.lease_keepalive(id) {
                Ok(()) => return Ok(()),
                Err(tern_store::StoreError::LeaseNotFound(_)) => *lease = None,
                Err(e) => return Err(e.into()),
            }
        }
        let id = store.lease_grant(self.ttl)?;
        store.txn(Txn {
            success: vec![Op::Put {
                key: keys::node_liveness(node),
                value: node.as_bytes().to_vec(),
                lease: id,
            }],
            ..Txn::default()
        })?;
        *lease = Some(id);
        Ok(())
    }

    /// Revokes the lease (clean shutdown): the node shows as not live at once.
    pub fn revoke(&self, store: &dyn Store) {
        if let Some(id) = self.lease.lock().unwrap().take() {
            let _ = store.lease_revoke(id);
        }
    }
}
