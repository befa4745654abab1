//! Desired dataplane state, computed purely from a store snapshot: the routes to remote blocks
//! (direct, VXLAN, IPIP, CrossSubnet), blackholes for own blocks, `/32` routes for borrowed
//! addresses, and the VXLAN neighbours (ARP + FDB) of remote VTEPs. With `--use-pod-cidr`
//! ([`Snapshot::use_pod_cidr`]) every node's Kubernetes podCIDRs are routed like blocks affine
//! to it: the encapsulation of the pool covering the podCIDR, direct routing when no pool
//! covers it, a blackhole for the node's own. No kernel access here but [`plan::apply`]:
//! [`plan`] diffs the routes against what the kernel reports and runs the resulting
//! operations through the kernel seam ([`tern_linux::kernel::Routes`]), for the reconciler
//! in `crate::dataplane` and for the routes the BGP speaker learns (`crate::bgp`).

pub mod plan;

use crate::snapshot::{NodeInfo, PodCidr, PoolInfo, Snapshot};
use ipnet::IpNet;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use tern_model::EncapMode;

/// Name of tern's VXLAN device (IPv4 pools over the IPv4 underlay).
pub const VXLAN_DEVICE: &str = "vxlan.tern";
/// Name of tern's IPv6 VXLAN device (IPv6 pools over the IPv6 underlay), as Calico's
/// `vxlan-v6.calico`: same VNI and port as [`VXLAN_DEVICE`], which the kernel allows because
/// the two devices are of different families.
pub const VXLAN_V6_DEVICE: &str = "vxlan-v6.tern";
/// VXLAN network identifier of tern's overlay.
pub const VXLAN_VNI: u32 = 4096;
/// UDP destination port of tern's VXLAN traffic.
pub const VXLAN_PORT: u16 = 4789;
/// Name of the IPIP device.
pub const IPIP_DEVICE: &str = "tunl0";

/// The encapsulation `pool` asks for, and whether it is CrossSubnet.
fn encap(pool: &PoolInfo) -> (Encap, bool) {
    match (pool.vxlan, pool.ipip) {
        (EncapMode::Never, EncapMode::Never) => (Encap::None, false),
        (m, EncapMode::Never) => (Encap::Vxlan, m == EncapMode::CrossSubnet),
        (EncapMode::Never, m) => (Encap::Ipip, m == EncapMode::CrossSubnet),
        // Rejected by validation on write; the snapshot loader reports and drops such pools.
        _ => (Encap::None, false),
    }
}

/// Encapsulation between two nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Encap {
    /// Plain routing via the node's underlay address.
    None,
    /// VXLAN via `vxlan.tern`.
    Vxlan,
    /// IP-in-IP via `tunl0`.
    Ipip,
}

/// Where a desired route sends traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Drop (own blocks).
    Blackhole,
    /// `via <node underlay address>` (direct routing).
    Direct(IpAddr),
    /// `via <remote tunnel address> dev vxlan.tern onlink` (`dev vxlan-v6.tern` for an IPv6
    /// tunnel address).
    Vxlan(IpAddr),
    /// `via <remote underlay address> dev tunl0 onlink`.
    Ipip(IpAddr),
}

/// A remote VTEP: the permanent ARP and FDB entries on `vxlan.tern` (an IPv4 tunnel address),
/// or the permanent NDP and FDB entries on `vxlan-v6.tern` (an IPv6 one: its underlay is the
/// node's IPv6 address).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vtep {
    /// Remote node.
    pub node: String,
    /// Its VXLAN device address (neighbour IP).
    pub tunnel_ip: IpAddr,
    /// Its VXLAN device MAC (neighbour lladdr, FDB MAC).
    pub mac: [u8; 6],
    /// Its underlay address (FDB dst).
    pub underlay: IpAddr,
}

/// The desired dataplane of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Destination → target.
    pub routes: BTreeMap<IpNet, Target>,
    /// Remote VTEPs (only when some pool uses VXLAN).
    pub vteps: BTreeSet<Vtep>,
    /// Some IPv4 pool uses VXLAN: `vxlan.tern` must exist.
    pub vxlan: bool,
    /// Some IPv6 pool uses VXLAN: `vxlan-v6.tern` must exist.
    pub vxlan_v6: bool,
    /// Some pool uses IPIP: `tunl0` must exist.
    pub ipip: bool,
    /// Problems (missing node address, missing VTEP, ...): routes affected are left out.
    pub errors: Vec<String>,
}

/// True when `addr` is inside one of the node's own interface subnets (then CrossSubnet
/// traffic to it is not encapsulated).
pub fn same_subnet(local_subnets: &[IpNet], addr: &IpAddr) -> bool {
    local_subnets
        .iter()
        .any(|n| n.prefix_len() > 0 && n.contains(addr))
}

/// The deterministic VTEP MAC of a node: the first six bytes of sha1(name), made unicast and
/// locally administered, so a restarted or re-registered node keeps its MAC.
pub fn vtep_mac(node: &str) -> [u8; 6] {
    use sha1::{Digest, Sha1};
    let d = Sha1::digest(node.as_bytes());
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&d[..6]);
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

/// The deterministic MAC of a node's IPv6 VTEP (`vxlan-v6.tern`): [`vtep_mac`] of
/// `<node>/v6`, which no node name can be (names are DNS subdomains), so it differs from
/// every node's IPv4 VTEP MAC.
pub fn vtep_mac_v6(node: &str) -> [u8; 6] {
    vtep_mac(&format!("{node}/v6"))
}

/// Computes the desired state of node `me`. `local_subnets` are the node's own interface
/// networks (for CrossSubnet).
pub fn compute(s: &Snapshot, me: &str, local_subnets: &[IpNet]) -> Desired {
    let vxlan_pool = |v6: bool| {
        s.pools
            .iter()
            .any(|p| p.vxlan != EncapMode::Never && p.cidr.addr().is_ipv6() == v6)
    };
    let mut d = Desired {
        vxlan: vxlan_pool(false),
        vxlan_v6: vxlan_pool(true),
        ipip: s.pools.iter().any(|p| p.ipip != EncapMode::Never),
        ..Desired::default()
    };
    let nodes: BTreeMap<&str, &NodeInfo> = s.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let pool_of = |cidr: &IpNet| {
        s.pools
            .iter()
            .filter(|p| p.cidr.contains(cidr))
            .max_by_key(|p| p.cidr.prefix_len())
    };
    for n in s.nodes.iter().filter(|n| n.name != me) {
        let v4 = (n.vxlan_tunnel_addr, n.vtep_mac);
        let v6 = (n.vxlan_tunnel_addr_v6, n.vtep_mac_v6);
        for (on, vtep) in [(d.vxlan, v4), (d.vxlan_v6, v6)] {
            let (true, Some(tip), Some(mac)) = (on, vtep.0, vtep.1) else {
                continue;
            };
            match n.address_like(&tip) {
                Some(u) => {
                    d.vteps.insert(Vtep {
                        node: n.name.clone(),
                        tunnel_ip: tip,
                        mac,
                        underlay: u.addr(),
                    });
                }
                None => d.errors.push(format!(
                    "node {} has a VXLAN tunnel address {tip} but no IPv{} underlay address",
                    n.name,
                    if tip.is_ipv4() { 4 } else { 6 }
                )),
            }
        }
    }
    // A node's VTEP of the family of `dst`: a pool's VXLAN tunnel is of the pool's family.
    let vtep_of = |node: &str, dst: &IpNet| {
        d.vteps
            .iter()
            .find(|v| v.node == node && v.tunnel_ip.is_ipv4() == dst.addr().is_ipv4())
            .cloned()
    };
    // The route towards `dst` on `node` through `pool` (none, for a podCIDR outside every
    // pool: routed directly), or why there is none.
    let target = |dst: &IpNet, node: &str, pool: Option<&PoolInfo>| -> Result<Target, String> {
        let n = nodes
            .get(node)
            .ok_or_else(|| format!("no Node resource for node {node} (owner of {dst})"))?;
        let addr = n
            .address_like(&dst.addr())
            .ok_or_else(|| format!("node {node} has no IPv{} address for {dst}", fam(dst)))?
            .addr();
        let (mut encap, cross) = pool.map_or((Encap::None, false), encap);
        if cross && same_subnet(local_subnets, &addr) {
            encap = Encap::None;
        }
        match encap {
            Encap::None => Ok(Target::Direct(addr)),
            Encap::Ipip => Ok(Target::Ipip(addr)),
            Encap::Vxlan => match vtep_of(node, dst) {
                Some(v) => Ok(Target::Vxlan(v.tunnel_ip)),
                None => Err(format!(
                    "node {node} has no IPv{} VXLAN tunnel address / VTEP MAC yet; {dst} not routed",
                    fam(dst)
                )),
            },
        }
    };
    for b in &s.blocks {
        let Some(pool) = pool_of(&b.cidr) else {
            continue;
        };
        match b.affinity.as_deref() {
            Some(a) if a == me => {
                d.routes.insert(b.cidr, Target::Blackhole);
            }
            Some(a) => match target(&b.cidr, a, Some(pool)) {
                Ok(t) => {
                    d.routes.insert(b.cidr, t);
                }
                Err(e) => d.errors.push(e),
            },
            None => {}
        }
        // Borrowed addresses: allocated by a node other than the block's owner.
        for (ip, by) in &b.allocations {
            if by.is_empty() || Some(by.as_str()) == b.affinity.as_deref() || by == me {
                continue;
            }
            let dst = IpNet::from(*ip);
            match target(&dst, by, Some(pool)) {
                Ok(t) => {
                    d.routes.insert(dst, t);
                }
                Err(e) => d.errors.push(e),
            }
        }
    }
    for pc in s.routed_pod_cidrs() {
        if let Err(e) = pod_cidr_usable(s, pc) {
            d.errors.push(e);
            continue;
        }
        // A tern block with the same CIDR is routed as the block (its affinity is the truth
        // of tern's IPAM); the overlap is a misconfiguration worth reporting.
        if d.routes.contains_key(&pc.cidr) {
            d.errors.push(format!(
                "podCIDR {} of node {} is also a tern IPAM block or address; routed as that",
                pc.cidr, pc.node
            ));
            continue;
        }
        if pc.node == me {
            d.routes.insert(pc.cidr, Target::Blackhole);
            continue;
        }
        match target(&pc.cidr, &pc.node, pool_of(&pc.cidr)) {
            Ok(t) => {
                d.routes.insert(pc.cidr, t);
            }
            Err(e) => d.errors.push(e),
        }
    }
    d
}

/// Whether podCIDR `pc` may be routed: not a default route and not covering a node's underlay
/// address (either would take the underlay's traffic away from it).
fn pod_cidr_usable(s: &Snapshot, pc: &PodCidr) -> Result<(), String> {
    if pc.cidr.prefix_len() == 0 {
        return Err(format!(
            "podCIDR {} of node {} not routed: a default route",
            pc.cidr, pc.node
        ));
    }
    for n in &s.nodes {
        if let Some(a) = n.addresses.iter().find(|a| pc.cidr.contains(&a.addr())) {
            return Err(format!(
                "podCIDR {} of node {} not routed: it covers the underlay address {} of node {}",
                pc.cidr,
                pc.node,
                a.addr(),
                n.name
            ));
        }
    }
    Ok(())
}

fn fam(n: &IpNet) -> u8 {
    if n.addr().is_ipv4() { 4 } else { 6 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::BlockInfo;

    fn pool(cidr: &str, vxlan: EncapMode, ipip: EncapMode) -> PoolInfo {
        PoolInfo {
            name: format!("p-{cidr}"),
            cidr: cidr.parse().unwrap(),
            vxlan,
            ipip,
            nat_outgoing: false,
            disabled: false,
        }
    }

    fn node(name: &str, addr: &str, tunnel: Option<&str>) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            addresses: vec![addr.parse().unwrap()],
            vxlan_tunnel_addr: tunnel.map(|t| t.parse().unwrap()),
            vtep_mac: tunnel.map(|_| vtep_mac(name)),
            ..Default::default()
        }
    }

    fn block(cidr: &str, owner: &str, allocs: &[(&str, &str)]) -> BlockInfo {
        BlockInfo {
            cidr: cidr.parse().unwrap(),
            affinity: Some(owner.into()),
            allocations: allocs
                .iter()
                .map(|(ip, n)| (ip.parse().unwrap(), n.to_string()))
                .collect(),
        }
    }

    fn snap(p: PoolInfo) -> Snapshot {
        Snapshot {
            pools: vec![p],
            nodes: vec![
                node("a", "198.18.0.1/24", Some("10.244.0.1")),
                node("b", "198.18.0.2/24", Some("10.244.1.1")),
                node("c", "198.18.5.3/24", Some("10.244.2.1")),
            ],
            blocks: vec![
                block("10.244.0.0/26", "a", &[("10.244.0.1", "a")]),
                block("10.244.1.0/26", "b", &[("10.244.1.1", "b")]),
                block("10.244.2.0/26", "c", &[("10.244.2.1", "c")]),
            ],
            ..Snapshot::default()
        }
    }

    /// [`snap`] with podCIDRs 10.250.<i>.0/24 on a, b and c, routed (`--use-pod-cidr`).
    fn with_pod_cidrs(mut s: Snapshot) -> Snapshot {
        s.pod_cidrs = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, node)| PodCidr {
                node: node.to_string(),
                cidr: n(&format!("10.250.{i}.0/24")),
            })
            .collect();
        s.use_pod_cidr = true;
        s
    }

    fn local() -> Vec<IpNet> {
        vec!["198.18.0.1/24".parse().unwrap()]
    }

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    /// What node a computes from [`snap`] with one pool 10.244.0.0/16 of these modes.
    fn node_a(vxlan: EncapMode, ipip: EncapMode) -> Desired {
        compute(&snap(pool("10.244.0.0/16", vxlan, ipip)), "a", &local())
    }

    /// Asserts the route `d` has for each CIDR.
    fn assert_routes(d: &Desired, want: &[(&str, Target)]) {
        for (cidr, target) in want {
            assert_eq!(d.routes.get(&n(cidr)), Some(target), "{cidr}");
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_encapsulation_routes_directly_and_blackholes_own_block() {
        let d = node_a(EncapMode::Never, EncapMode::Never);
        assert_routes(
            &d,
            &[
                ("10.244.0.0/26", Target::Blackhole),
                ("10.244.1.0/26", Target::Direct(ip("198.18.0.2"))),
                ("10.244.2.0/26", Target::Direct(ip("198.18.5.3"))),
            ],
        );
        assert!(!d.vxlan && !d.ipip && d.vteps.is_empty());
        assert!(d.errors.is_empty(), "{:?}", d.errors);
    }

    #[test]
    fn vxlan_always_routes_via_remote_tunnel_addresses_with_vteps() {
        let d = node_a(EncapMode::Always, EncapMode::Never);
        assert!(d.vxlan);
        assert_routes(
            &d,
            &[
                ("10.244.1.0/26", Target::Vxlan(ip("10.244.1.1"))),
                ("10.244.2.0/26", Target::Vxlan(ip("10.244.2.1"))),
            ],
        );
        let vteps: Vec<_> = d
            .vteps
            .iter()
            .map(|v| (v.node.as_str(), v.underlay))
            .collect();
        assert_eq!(
            vteps,
            vec![("b", ip("198.18.0.2")), ("c", ip("198.18.5.3"))]
        );
        assert!(d.vteps.iter().all(|v| v.mac == vtep_mac(&v.node)));
    }

    #[test]
    fn vxlan_without_remote_vtep_is_an_error_not_a_route() {
        let mut s = snap(pool("10.244.0.0/16", EncapMode::Always, EncapMode::Never));
        s.nodes[1].vxlan_tunnel_addr = None;
        let d = compute(&s, "a", &local());
        assert!(!d.routes.contains_key(&n("10.244.1.0/26")));
        assert!(
            d.errors.iter().any(|e| e.contains("node b")),
            "{:?}",
            d.errors
        );
        assert!(d.routes.contains_key(&n("10.244.2.0/26")));
    }

    #[test]
    fn ipip_routes_via_underlay_on_tunl0() {
        let d = node_a(EncapMode::Never, EncapMode::Always);
        assert!(d.ipip && !d.vxlan);
        assert_routes(&d, &[("10.244.1.0/26", Target::Ipip(ip("198.18.0.2")))]);
        assert!(d.vteps.is_empty());
    }

    #[test]
    fn cross_subnet_encapsulates_only_across_subnets() {
        for (vx, ii) in [
            (EncapMode::CrossSubnet, EncapMode::Never),
            (EncapMode::Never, EncapMode::CrossSubnet),
        ] {
            let d = node_a(vx, ii);
            assert_routes(&d, &[("10.244.1.0/26", Target::Direct(ip("198.18.0.2")))]);
            let expect = if vx == EncapMode::CrossSubnet {
                Target::Vxlan(ip("10.244.2.1"))
            } else {
                Target::Ipip(ip("198.18.5.3"))
            };
            assert_routes(&d, &[("10.244.2.0/26", expect)]);
        }
    }

    #[test]
    fn borrowed_addresses_get_host_routes_to_the_borrower() {
        let mut s = snap(pool("10.244.0.0/16", EncapMode::Never, EncapMode::Never));
        // b borrowed .5 from a's block; c borrowed .9 from b's block.
        s.blocks[0].allocations.push((ip("10.244.0.5"), "b".into()));
        s.blocks[1].allocations.push((ip("10.244.1.9"), "c".into()));
        // a borrowed from c's block: a needs no route for its own pod (the endpoint route).
        s.blocks[2].allocations.push((ip("10.244.2.7"), "a".into()));
        let d = compute(&s, "a", &local());
        assert_routes(
            &d,
            &[
                ("10.244.0.5/32", Target::Direct(ip("198.18.0.2"))),
                ("10.244.1.9/32", Target::Direct(ip("198.18.5.3"))),
            ],
        );
        assert!(!d.routes.contains_key(&n("10.244.2.7/32")));
        assert_routes(&d, &[("10.244.0.0/26", Target::Blackhole)]);
    }

    #[test]
    fn missing_node_or_address_is_reported_and_others_still_routed() {
        let mut s = snap(pool("10.244.0.0/16", EncapMode::Never, EncapMode::Never));
        s.nodes.retain(|n| n.name != "c");
        s.nodes[1].addresses.clear();
        let d = compute(&s, "a", &local());
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("no Node resource for node c"))
        );
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("node b has no IPv4 address"))
        );
        assert_eq!(d.routes.len(), 1);
    }

    #[test]
    fn blocks_outside_every_pool_are_ignored() {
        let mut s = snap(pool("10.244.0.0/16", EncapMode::Never, EncapMode::Never));
        s.blocks.push(block("10.99.0.0/26", "b", &[]));
        let d = compute(&s, "a", &local());
        assert!(!d.routes.contains_key(&n("10.99.0.0/26")));
    }

    #[test]
    fn pod_cidrs_are_not_routed_unless_use_pod_cidr_is_set() {
        let plain = snap(pool("10.244.0.0/16", EncapMode::Never, EncapMode::Never));
        let mut s = with_pod_cidrs(plain.clone());
        s.use_pod_cidr = false;
        assert!(s.routed_pod_cidrs().is_empty());
        let d = compute(&s, "a", &local());
        assert_eq!(d, compute(&plain, "a", &local()));
        assert!(!d.routes.keys().any(|r| n("10.250.0.0/16").contains(r)));
    }

    #[test]
    fn pod_cidrs_outside_every_pool_route_directly_and_own_is_blackholed() {
        // Even with a VXLAN pool elsewhere: a podCIDR no pool covers is routed directly.
        for vx in [EncapMode::Never, EncapMode::Always] {
            let s = with_pod_cidrs(snap(pool("10.244.0.0/16", vx, EncapMode::Never)));
            let d = compute(&s, "a", &local());
            assert_routes(
                &d,
                &[
                    ("10.250.0.0/24", Target::Blackhole),
                    ("10.250.1.0/24", Target::Direct(ip("198.18.0.2"))),
                    ("10.250.2.0/24", Target::Direct(ip("198.18.5.3"))),
                ],
            );
            assert!(d.errors.is_empty(), "{:?}", d.errors);
            // The blocks are routed as before.
            let blocks = compute(
                &snap(pool("10.244.0.0/16", vx, EncapMode::Never)),
                "a",
                &local(),
            );
            for (dst, t) in &blocks.routes {
                assert_eq!(d.routes.get(dst), Some(t), "{dst}");
            }
            assert_eq!(d.routes.len(), blocks.routes.len() + 3);
        }
    }

    #[test]
    fn pod_cidrs_take_the_encapsulation_of_the_pool_covering_them() {
        let mut s = with_pod_cidrs(snap(pool(
            "10.244.0.0/16",
            EncapMode::Never,
            EncapMode::Never,
        )));
        s.pools
            .push(pool("10.250.0.0/16", EncapMode::Always, EncapMode::Never));
        let d = compute(&s, "a", &local());
        assert!(d.vxlan);
        assert_routes(
            &d,
            &[
                ("10.250.0.0/24", Target::Blackhole),
                ("10.250.1.0/24", Target::Vxlan(ip("10.244.1.1"))),
                ("10.250.2.0/24", Target::Vxlan(ip("10.244.2.1"))),
                // The blocks of the unencapsulated pool stay direct.
                ("10.244.1.0/26", Target::Direct(ip("198.18.0.2"))),
            ],
        );
        let vteps: Vec<_> = d.vteps.iter().map(|v| v.node.as_str()).collect();
        assert_eq!(vteps, ["b", "c"]);
        // CrossSubnet: b shares a's subnet, c does not.
        s.pools[1].vxlan = EncapMode::CrossSubnet;
        let d = compute(&s, "a", &local());
        assert_routes(
            &d,
            &[
                ("10.250.1.0/24", Target::Direct(ip("198.18.0.2"))),
                ("10.250.2.0/24", Target::Vxlan(ip("10.244.2.1"))),
            ],
        );
        // A node without a VTEP yet: reported, its podCIDR not routed, the others are.
        s.nodes[2].vxlan_tunnel_addr = None;
        s.pools[1].vxlan = EncapMode::Always;
        let d = compute(&s, "a", &local());
        assert!(!d.routes.contains_key(&n("10.250.2.0/24")));
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("node c") && e.contains("10.250.2.0/24")),
            "{:?}",
            d.errors
        );
        assert!(d.routes.contains_key(&n("10.250.1.0/24")));
    }

    #[test]
    fn a_pod_cidr_route_goes_with_the_pod_cidr_or_the_node() {
        let base = with_pod_cidrs(snap(pool(
            "10.244.0.0/16",
            EncapMode::Never,
            EncapMode::Never,
        )));
        let mut s = base.clone();
        s.pod_cidrs.retain(|p| p.node != "b");
        let d = compute(&s, "a", &local());
        assert!(!d.routes.contains_key(&n("10.250.1.0/24")));
        assert!(d.routes.contains_key(&n("10.250.2.0/24")));
        // A podCIDR whose node has no Node resource (only possible in a hand-edited store):
        // reported, not routed.
        let mut s = base.clone();
        s.nodes.retain(|n| n.name != "c");
        let d = compute(&s, "a", &local());
        assert!(!d.routes.contains_key(&n("10.250.2.0/24")));
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("no Node resource for node c (owner of 10.250.2.0/24)")),
            "{:?}",
            d.errors
        );
        // Several podCIDRs of one node (dual-stack style): each routed; an IPv6 one without
        // an IPv6 node address is reported.
        let mut s = base;
        s.pod_cidrs.push(PodCidr {
            node: "b".into(),
            cidr: n("10.251.1.0/24"),
        });
        s.pod_cidrs.push(PodCidr {
            node: "b".into(),
            cidr: n("fd00:250:1::/64"),
        });
        let d = compute(&s, "a", &local());
        assert_routes(&d, &[("10.251.1.0/24", Target::Direct(ip("198.18.0.2")))]);
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("node b has no IPv6 address for fd00:250:1::/64")),
            "{:?}",
            d.errors
        );
    }

    #[test]
    fn dangerous_or_overlapping_pod_cidrs_are_reported_not_routed() {
        let mut s = with_pod_cidrs(snap(pool(
            "10.244.0.0/16",
            EncapMode::Never,
            EncapMode::Never,
        )));
        let pc = |node: &str, cidr: &str| PodCidr {
            node: node.into(),
            cidr: n(cidr),
        };
        s.pod_cidrs = vec![
            // A default route.
            pc("b", "0.0.0.0/0"),
            // Covers node c's underlay address (and a's own: no blackhole over the underlay).
            pc("b", "198.18.5.0/25"),
            pc("a", "198.18.0.0/28"),
            // The same CIDR as c's tern block: the block's route stays.
            pc("b", "10.244.2.0/26"),
            // Fine.
            pc("b", "10.250.1.0/24"),
        ];
        let d = compute(&s, "a", &local());
        for bad in ["0.0.0.0/0", "198.18.5.0/25", "198.18.0.0/28"] {
            assert!(!d.routes.contains_key(&n(bad)), "{bad}");
            assert!(
                d.errors
                    .iter()
                    .any(|e| e.contains(bad) && e.contains("not routed")),
                "{bad}: {:?}",
                d.errors
            );
        }
        assert_routes(
            &d,
            &[
                ("10.244.2.0/26", Target::Direct(ip("198.18.5.3"))),
                ("10.250.1.0/24", Target::Direct(ip("198.18.0.2"))),
            ],
        );
        assert!(
            d.errors
                .iter()
                .any(|e| e.contains("podCIDR 10.244.2.0/26 of node b is also a tern IPAM block")),
            "{:?}",
            d.errors
        );
    }

    /// Dual-stack nodes (a 198.18.0.0/24 + 2001:db8:1::/64, b on the same subnets, c on
    /// 198.18.5.0/24 + 2001:db8:2::/64) with both VTEPs, an IPv4 and an IPv6 pool of these
    /// VXLAN modes, and one block of each pool per node.
    fn dual(v4: EncapMode, v6: EncapMode) -> Snapshot {
        let node = |name: &str, i: u8, sub: u8, v4sub: u8| NodeInfo {
            name: name.into(),
            addresses: vec![
                n(&format!("198.18.{v4sub}.{i}/24")),
                n(&format!("2001:db8:{sub}::{}/64", 10 + i)),
            ],
            vxlan_tunnel_addr: Some(ip(&format!("10.244.{}.1", i - 1))),
            vtep_mac: Some(vtep_mac(name)),
            vxlan_tunnel_addr_v6: Some(ip(&format!("fd00:10:244::{:x}", (i as u32 - 1) * 64 + 1))),
            vtep_mac_v6: Some(vtep_mac_v6(name)),
        };
        let mut s = Snapshot {
            pools: vec![
                pool("10.244.0.0/16", v4, EncapMode::Never),
                pool("fd00:10:244::/48", v6, EncapMode::Never),
            ],
            nodes: vec![node("a", 1, 1, 0), node("b", 2, 1, 0), node("c", 3, 2, 5)],
            ..Snapshot::default()
        };
        for (i, owner) in ["a", "b", "c"].iter().enumerate() {
            s.blocks
                .push(block(&format!("10.244.{i}.0/26"), owner, &[]));
            s.blocks
                .push(block(&format!("fd00:10:244::{:x}/122", i * 64), owner, &[]));
        }
        s
    }

    fn local_dual() -> Vec<IpNet> {
        vec![n("198.18.0.1/24"), n("2001:db8:1::11/64")]
    }

    #[test]
    fn vxlan_v6_routes_v6_blocks_through_v6_vteps_on_the_v6_underlay() {
        let d = compute(
            &dual(EncapMode::Always, EncapMode::Always),
            "a",
            &local_dual(),
        );
        assert!(d.vxlan && d.vxlan_v6 && !d.ipip);
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        assert_routes(
            &d,
            &[
                ("fd00:10:244::/122", Target::Blackhole),
                ("fd00:10:244::40/122", Target::Vxlan(ip("fd00:10:244::41"))),
                ("fd00:10:244::80/122", Target::Vxlan(ip("fd00:10:244::81"))),
                // The IPv4 pool keeps its own VTEPs.
                ("10.244.1.0/26", Target::Vxlan(ip("10.244.1.1"))),
                ("10.244.2.0/26", Target::Vxlan(ip("10.244.2.1"))),
            ],
        );
        let vteps: Vec<_> = d
            .vteps
            .iter()
            .map(|v| (v.node.as_str(), v.tunnel_ip, v.underlay, v.mac))
            .collect();
        assert_eq!(
            vteps,
            vec![
                ("b", ip("10.244.1.1"), ip("198.18.0.2"), vtep_mac("b")),
                (
                    "b",
                    ip("fd00:10:244::41"),
                    ip("2001:db8:1::12"),
                    vtep_mac_v6("b")
                ),
                ("c", ip("10.244.2.1"), ip("198.18.5.3"), vtep_mac("c")),
                (
                    "c",
                    ip("fd00:10:244::81"),
                    ip("2001:db8:2::13"),
                    vtep_mac_v6("c")
                ),
            ]
        );
    }

    #[test]
    fn vxlan_v6_alone_needs_no_ipv4_vtep_and_ipv4_vxlan_alone_no_ipv6_one() {
        // IPv6-only nodes: no IPv4 address, no IPv4 tunnel, only the IPv6 pool.
        let mut s = dual(EncapMode::Never, EncapMode::Always);
        s.pools.remove(0);
        s.blocks.retain(|b| b.cidr.addr().is_ipv6());
        for node in &mut s.nodes {
            node.addresses.retain(|a| a.addr().is_ipv6());
            node.vxlan_tunnel_addr = None;
            node.vtep_mac = None;
        }
        let d = compute(&s, "a", &local_dual()[1..]);
        assert!(!d.vxlan && d.vxlan_v6);
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        assert_eq!(d.vteps.len(), 2);
        assert!(
            d.vteps
                .iter()
                .all(|v| v.tunnel_ip.is_ipv6() && v.underlay.is_ipv6())
        );
        assert_routes(
            &d,
            &[("fd00:10:244::40/122", Target::Vxlan(ip("fd00:10:244::41")))],
        );
        // VXLAN on the IPv4 pool only: the IPv6 blocks route directly, no IPv6 VTEP.
        let d = compute(
            &dual(EncapMode::Always, EncapMode::Never),
            "a",
            &local_dual(),
        );
        assert!(d.vxlan && !d.vxlan_v6);
        assert!(d.vteps.iter().all(|v| v.tunnel_ip.is_ipv4()));
        assert_routes(
            &d,
            &[("fd00:10:244::40/122", Target::Direct(ip("2001:db8:1::12")))],
        );
    }

    #[test]
    fn vxlan_v6_cross_subnet_goes_by_the_ipv6_subnet() {
        let d = compute(
            &dual(EncapMode::Never, EncapMode::CrossSubnet),
            "a",
            &local_dual(),
        );
        assert!(d.vxlan_v6 && !d.vxlan);
        assert_routes(
            &d,
            &[
                // b shares a's IPv6 subnet, c does not.
                ("fd00:10:244::40/122", Target::Direct(ip("2001:db8:1::12"))),
                ("fd00:10:244::80/122", Target::Vxlan(ip("fd00:10:244::81"))),
            ],
        );
        // Only the IPv4 subnet shared: b is across an IPv6 subnet boundary, encapsulated.
        let d = compute(
            &dual(EncapMode::Never, EncapMode::CrossSubnet),
            "a",
            &[n("198.18.0.1/24"), n("2001:db8:9::11/64")],
        );
        assert_routes(
            &d,
            &[("fd00:10:244::40/122", Target::Vxlan(ip("fd00:10:244::41")))],
        );
    }

    #[test]
    fn a_missing_ipv6_vtep_or_underlay_is_reported_and_the_other_family_still_routed() {
        let mut s = dual(EncapMode::Always, EncapMode::Always);
        s.nodes[1].vxlan_tunnel_addr_v6 = None;
        s.nodes[2].addresses.retain(|a| a.addr().is_ipv4());
        let d = compute(&s, "a", &local_dual());
        for (bad, why) in [
            (
                "fd00:10:244::40/122",
                "node b has no IPv6 VXLAN tunnel address",
            ),
            ("fd00:10:244::80/122", "node c has no IPv6 address"),
        ] {
            assert!(!d.routes.contains_key(&n(bad)), "{bad}");
            assert!(
                d.errors.iter().any(|e| e.contains(why)),
                "{why}: {:?}",
                d.errors
            );
        }
        assert!(
            d.errors.iter().any(|e| e.contains(
                "node c has a VXLAN tunnel address fd00:10:244::81 but no IPv6 underlay"
            )),
            "{:?}",
            d.errors
        );
        assert_routes(
            &d,
            &[
                ("10.244.1.0/26", Target::Vxlan(ip("10.244.1.1"))),
                ("10.244.2.0/26", Target::Vxlan(ip("10.244.2.1"))),
            ],
        );
    }

    #[test]
    fn the_ipv6_vtep_mac_is_stable_and_differs_from_the_ipv4_one() {
        let m = vtep_mac_v6("node-1");
        assert_eq!(m, vtep_mac_v6("node-1"));
        assert_ne!(m, vtep_mac("node-1"));
        assert_ne!(m, vtep_mac_v6("node-2"));
        assert_eq!(m[0] & 0x03, 0x02, "unicast, locally administered");
    }

    #[test]
    fn vtep_mac_is_stable_unicast_and_locally_administered() {
        let m = vtep_mac("node-1");
        assert_eq!(m, vtep_mac("node-1"));
        assert_ne!(m, vtep_mac("node-2"));
        assert_eq!(m[0] & 0x01, 0, "unicast");
        assert_eq!(m[0] & 0x02, 0x02, "locally administered");
    }
}
