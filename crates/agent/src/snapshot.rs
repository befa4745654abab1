//! The store snapshot the dataplane reconciler and the BGP speaker both compute from: its types
//! (IP pools, nodes and allocation blocks as the dataplane sees them, the input of
//! `routes::compute`, `mtu` and `nat`), their loading from the store, and which of the pools'
//! routes belong to the reconciler rather than to BGP. With `--use-pod-cidr` the nodes'
//! Kubernetes podCIDRs ([`PodCidr`]) are routed as blocks affine to their node are.

use ipnet::IpNet;
use std::net::IpAddr;
use tern_model::MacAddr;
use tern_model::{EncapMode, Kind, Resource};
use tern_store::{Store, keys};

/// One IP pool, as the dataplane sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Pool name.
    pub name: String,
    /// Pool CIDR.
    pub cidr: IpNet,
    /// VXLAN mode.
    pub vxlan: EncapMode,
    /// IPIP mode.
    pub ipip: EncapMode,
    /// Masquerade traffic from the pool to destinations outside every pool.
    pub nat_outgoing: bool,
    /// No new allocations (routing of existing blocks continues).
    pub disabled: bool,
}

/// One node, as the dataplane sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Underlay addresses with their prefix length.
    pub addresses: Vec<IpNet>,
    /// Address of the node's VXLAN device.
    pub vxlan_tunnel_addr: Option<IpAddr>,
    /// MAC of the node's VXLAN device.
    pub vtep_mac: Option<[u8; 6]>,
    /// Address of the node's IPv6 VXLAN device (`vxlan-v6.tern`).
    pub vxlan_tunnel_addr_v6: Option<IpAddr>,
    /// MAC of the node's IPv6 VXLAN device.
    pub vtep_mac_v6: Option<[u8; 6]>,
}

impl NodeInfo {
    /// The node's first underlay address of the family of `like`.
    pub fn address_like(&self, like: &IpAddr) -> Option<IpNet> {
        self.addresses
            .iter()
            .find(|a| a.addr().is_ipv4() == like.is_ipv4())
            .copied()
    }
}

/// One allocation block: its affinity and who made each allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    /// Block CIDR.
    pub cidr: IpNet,
    /// Node the block is affine to.
    pub affinity: Option<String>,
    /// Allocated addresses and the node that allocated each (`attrs.node`, may be empty).
    pub allocations: Vec<(IpAddr, String)>,
}

/// One of a node's Kubernetes podCIDRs (tern Node `spec.podCIDRs`, mirrored by the node's own
/// agent from the Kubernetes Node): the range a delegated host-local (`ipam.subnet:
/// usePodCidr`) takes that node's pod addresses from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodCidr {
    /// The node.
    pub node: String,
    /// The podCIDR (host bits cleared).
    pub cidr: IpNet,
}

/// Everything the route reconciler reads from the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Valid pools.
    pub pools: Vec<PoolInfo>,
    /// Nodes.
    pub nodes: Vec<NodeInfo>,
    /// Allocation blocks.
    pub blocks: Vec<BlockInfo>,
    /// Problems found while reading (bad pools, bad nodes): reported, not fatal.
    pub errors: Vec<String>,
    /// Every node's podCIDRs as the store has them, routed only with
    /// [`Snapshot::use_pod_cidr`] (see [`Snapshot::routed_pod_cidrs`]).
    pub pod_cidrs: Vec<PodCidr>,
    /// `--use-pod-cidr`: route each node's podCIDRs to it like a block affine to it (and
    /// advertise them over BGP). Not read from the store: the caller sets it from the agent's
    /// configuration. Off by default, since a controller-manager that allocates podCIDRs from
    /// a cluster CIDR overlapping tern's pools would otherwise get routes over tern's blocks.
    pub use_pod_cidr: bool,
}

impl Snapshot {
    /// The podCIDRs to route: [`Snapshot::pod_cidrs`] with `use_pod_cidr` set, else none.
    pub fn routed_pod_cidrs(&self) -> &[PodCidr] {
        if self.use_pod_cidr {
            &self.pod_cidrs
        } else {
            &[]
        }
    }
}

/// Reads the pools, nodes (with their podCIDRs) and blocks; a malformed pool or node is
/// reported and skipped. `use_pod_cidr` is left off: the caller sets it.
pub fn load_snapshot(store: &dyn Store) -> Result<Snapshot, String> {
    let mut s = Snapshot::default();
    let (kvs, _) = store
        .range(&keys::resource_prefix(Kind::IpPool.as_str()))
        .map_err(|e| format!("reading IP pools: {e}"))?;
    for kv in kvs {
        // Size-checked, defaulted and validated: a pool written past ternctl is skipped.
        let r = Resource::from_stored(&kv.value);
        match r {
            Ok(Resource::IpPool(p)) => match p.spec.net() {
                Some(cidr) => s.pools.push(PoolInfo {
                    name: p.metadata.name.clone(),
                    cidr,
                    vxlan: p.spec.vxlan_mode,
                    ipip: p.spec.ipip_mode,
                    nat_outgoing: p.spec.nat_outgoing,
                    disabled: p.spec.disabled,
                }),
                None => s
                    .errors
                    .push(format!("IPPool {}: bad cidr", p.metadata.name)),
            },
            Ok(_) => {}
            Err(e) => s.errors.push(format!("IPPool at {} ignored: {e}", kv.key)),
        }
    }
    let (kvs, _) = store
        .range(&keys::resource_prefix(Kind::Node.as_str()))
        .map_err(|e| format!("reading nodes: {e}"))?;
    for kv in kvs {
        match Resource::from_stored(&kv.value) {
            Ok(Resource::Node(n)) => {
                // Validated on write; a value written past the model is reported by name and
                // left out, the node's other fields still count.
                let node = &n.metadata.name;
                let mut addresses = Vec::new();
                for a in &n.spec.addresses {
                    match a
                        .address
                        .parse::<IpNet>()
                        .or_else(|e| a.address.parse::<IpAddr>().map(IpNet::from).map_err(|_| e))
                    {
                        Ok(net) => addresses.push(net),
                        Err(e) => s.errors.push(format!(
                            "Node {node}: spec.addresses entry {:?} ignored: {e}",
                            a.address
                        )),
                    }
                }
                // A tunnel address of the field's family, or the error naming the field.
                let mut tunnel = |field: &str, value: &Option<String>, v6: bool| {
                    let t = value.as_deref()?;
                    let ip = t.split('/').next().unwrap_or_default();
                    match ip.parse::<IpAddr>() {
                        Ok(ip) if ip.is_ipv6() == v6 => Some(ip),
                        Ok(_) => {
                            s.errors.push(format!(
                                "Node {node}: spec.{field} {t:?} ignored: not an IPv{} address",
                                if v6 { 6 } else { 4 }
                            ));
                            None
                        }
                        Err(e) => {
                            s.errors
                                .push(format!("Node {node}: spec.{field} {t:?} ignored: {e}"));
                            None
                        }
                    }
                };
                let vxlan_tunnel_addr =
                    tunnel("ipv4VXLANTunnelAddr", &n.spec.ipv4_vxlan_tunnel_addr, false);
                let vxlan_tunnel_addr_v6 =
                    tunnel("ipv6VXLANTunnelAddr", &n.spec.ipv6_vxlan_tunnel_addr, true);
                let mut mac = |field: &str, value: &Option<String>| {
                    value.as_deref().and_then(|m| {
                        m.parse::<MacAddr>()
                            .map_err(|e| {
                                s.errors
                                    .push(format!("Node {node}: spec.{field} ignored: {e}"))
                            })
                            .ok()
                            .map(MacAddr::octets)
                    })
                };
                let vtep_mac = mac("vxlanTunnelMACAddr", &n.spec.vxlan_tunnel_mac_addr);
                let vtep_mac_v6 = mac("vxlanTunnelMACAddrV6", &n.spec.vxlan_tunnel_mac_addr_v6);
                s.nodes.push(NodeInfo {
                    name: node.clone(),
                    addresses,
                    vxlan_tunnel_addr,
                    vtep_mac,
                    vxlan_tunnel_addr_v6,
                    vtep_mac_v6,
                });
                for c in n.spec.pod_cidrs.iter().flatten() {
                    // Validated on write (`spec.podCIDRs[i]`); a bad one written past the model
                    // is reported, the node's other podCIDRs still count.
                    match c.parse::<IpNet>() {
                        Ok(cidr) => s.pod_cidrs.push(PodCidr {
                            node: n.metadata.name.clone(),
                            cidr: cidr.trunc(),
                        }),
                        Err(e) => s.errors.push(format!(
                            "Node {}: spec.podCIDRs entry {c:?} ignored: {e}",
                            n.metadata.name
                        )),
                    }
                }
            }
            Ok(_) => {}
            Err(e) => s.errors.push(format!("Node at {} ignored: {e}", kv.key)),
        }
    }
    s.blocks = load_blocks(store)?;
    Ok(s)
}

/// The allocation blocks with their affinity and the node behind each allocation.
fn load_blocks(store: &dyn Store) -> Result<Vec<BlockInfo>, String> {
    {
        let (kvs, _) = store
            .range(keys::BLOCKS)
            .map_err(|e| format!("reading blocks: {e}"))?;
        let mut out = Vec::new();
        for kv in kvs {
            let b: tern_ipam::Block = match serde_json::from_slice(&kv.value) {
                Ok(b) => b,
                Err(e) => return Err(format!("block {}: {e}", kv.key)),
            };
            if b.deleted {
                continue;
            }
            let allocations = b
                .allocations
                .iter()
                .enumerate()
                .filter_map(|(ord, a)| {
                    let idx = (*a)? as usize;
                    let by = b
                        .attributes
                        .get(idx)
                        .map(|at| at.secondary.node.clone())
                        .unwrap_or_default();
                    Some((b.ip(ord as u32), by))
                })
                .collect();
            out.push(BlockInfo {
                cidr: b.cidr,
                affinity: b.affine_node().map(str::to_string),
                allocations,
            });
        }
        Ok(out)
    }
}

/// True when routes to `dst` belong to the route reconciler even with BGP on: `dst` lies in a
/// pool that encapsulates (VXLAN / IPIP), whose routes go through the tunnel devices.
pub fn reconciler_owns(pools: &[PoolInfo], dst: &IpNet) -> bool {
    pools
        .iter()
        .filter(|p| p.cidr.contains(dst))
        .max_by_key(|p| p.cidr.prefix_len())
        .is_some_and(|p| p.vxlan != EncapMode::Never || p.ipip != EncapMode::Never)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The snapshot of a store holding only the Node record `spec` of node `n1`, as written.
    fn with_node(spec: serde_json::Value) -> Snapshot {
        let store = tern_store::mem::MemStore::new();
        let node = serde_json::json!({
            "apiVersion": "tern.dev/v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "spec": spec
        });
        let key = keys::resource(Kind::Node.as_str(), "n1");
        store
            .put(&key, node.to_string().as_bytes())
            .expect("put the record");
        load_snapshot(&store).expect("snapshot")
    }

    /// A Node record written past validation: each bad value is reported naming the node, the
    /// field and the value, and the node's good fields still count.
    #[test]
    fn a_bad_node_field_is_reported_by_name_not_dropped_silently() {
        let s = with_node(serde_json::json!({
            "addresses": [{"address": "198.18.0.1/24"}, {"address": "not-an-ip"}],
            "ipv4VXLANTunnelAddr": "10.244.0.0.1",
            "vxlanTunnelMACAddr": "ee:ee:zz:ee:ee:ee",
            "ipv6VXLANTunnelAddr": "10.244.0.9",
            "vxlanTunnelMACAddrV6": "ee:ee"
        }));
        let n = s.nodes.iter().find(|n| n.name == "n1").expect("node kept");
        assert_eq!(n.addresses, vec!["198.18.0.1/24".parse::<IpNet>().unwrap()]);
        assert_eq!(n.vxlan_tunnel_addr, None);
        assert_eq!(n.vtep_mac, None);
        assert_eq!((n.vxlan_tunnel_addr_v6, n.vtep_mac_v6), (None, None));
        let errors = s.errors.join("\n");
        for want in [
            "Node n1: spec.addresses entry \"not-an-ip\" ignored",
            "Node n1: spec.ipv4VXLANTunnelAddr \"10.244.0.0.1\" ignored",
            "Node n1: spec.vxlanTunnelMACAddr ignored: \"ee:ee:zz:ee:ee:ee\" is not a MAC address",
            "Node n1: spec.ipv6VXLANTunnelAddr \"10.244.0.9\" ignored: not an IPv6 address",
            "Node n1: spec.vxlanTunnelMACAddrV6 ignored: \"ee:ee\" is not a MAC address",
        ] {
            assert!(errors.contains(want), "missing {want:?} in:\n{errors}");
        }
    }

    /// A node's IPv6 VXLAN address and MAC reach the snapshot beside the IPv4 ones.
    #[test]
    fn both_vteps_of_a_dual_stack_node_are_loaded() {
        let s = with_node(serde_json::json!({
            "addresses": [{"address": "198.18.0.1/24"}, {"address": "2001:db8::11/64"}],
            "ipv4VXLANTunnelAddr": "10.244.0.1",
            "vxlanTunnelMACAddr": "66:00:00:00:00:04",
            "ipv6VXLANTunnelAddr": "fd00:10:244::1",
            "vxlanTunnelMACAddrV6": "66:00:00:00:00:06"
        }));
        assert!(s.errors.is_empty(), "{:?}", s.errors);
        let n = &s.nodes[0];
        assert_eq!(n.vxlan_tunnel_addr, Some("10.244.0.1".parse().unwrap()));
        assert_eq!(n.vtep_mac, Some([0x66, 0, 0, 0, 0, 4]));
        assert_eq!(
            n.vxlan_tunnel_addr_v6,
            Some("fd00:10:244::1".parse().unwrap())
        );
        assert_eq!(n.vtep_mac_v6, Some([0x66, 0, 0, 0, 0, 6]));
        let v6 = n.vxlan_tunnel_addr_v6.unwrap();
        assert_eq!(
            n.address_like(&v6),
            Some("2001:db8::11/64".parse().unwrap())
        );
    }
}
