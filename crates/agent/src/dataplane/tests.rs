//! The kernel half of the reconciler ([`Dataplane::apply_desired`]) on the in-memory kernel:
//! route sync, tunnels and their neighbours, the BGP hand-over, host-route repair and
//! natOutgoing, with the kernel refusing what the tests make it refuse. No root.

use super::*;
use crate::snapshot::BlockInfo;
use tern_linux::fake::{FakeKernel, NftApplied, Op};
use tern_linux::kernel::{Addresses, Links, Neighbours};
use tern_model::EncapMode;

const ME: &str = "a";

fn n(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Node `a` (198.18.0.1/24 on eth0) of a three-node cluster on one subnet, each node with a
/// /26 of `pool` and a VXLAN tunnel address, and its kernel.
struct Fixture {
    dp: Dataplane,
    store: Arc<dyn Store>,
    k: FakeKernel,
    snap: Snapshot,
}

fn pool(vxlan: EncapMode, ipip: EncapMode, nat: bool) -> PoolInfo {
    PoolInfo {
        name: "default".into(),
        cidr: n("10.244.0.0/16"),
        vxlan,
        ipip,
        nat_outgoing: nat,
        disabled: false,
    }
}

fn fixture(p: PoolInfo) -> Fixture {
    let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
    let cfg = DataplaneConfig {
        node_name: ME.into(),
        node_ip: None,
        node_ip6: None,
        interface_prefix: "tern".into(),
        mtu: 0,
    };
    let dp = Dataplane::new(cfg, store.clone()).unwrap();
    let mut k = FakeKernel::new();
    let eth0 = k.add_device("eth0", 1500);
    k.add_address(eth0, n("198.18.0.1/24")).unwrap();
    let node = |name: &str, i: u8| NodeInfo {
        name: name.into(),
        addresses: vec![n(&format!("198.18.0.{i}/24"))],
        vxlan_tunnel_addr: Some(ip(&format!("10.244.{}.0", i - 1))),
        vtep_mac: Some(routes::vtep_mac(name)),
        ..Default::default()
    };
    let block = |i: u8, owner: &str| BlockInfo {
        cidr: n(&format!("10.244.{}.0/26", i - 1)),
        affinity: Some(owner.into()),
        allocations: Vec::new(),
    };
    let snap = Snapshot {
        pools: vec![p],
        nodes: vec![node("a", 1), node("b", 2), node("c", 3)],
        blocks: vec![block(1, "a"), block(2, "b"), block(3, "c")],
        ..Snapshot::default()
    };
    Fixture { dp, store, k, snap }
}

impl Fixture {
    /// One pass of the kernel half, as `sync_with(full)` runs it after reading the store.
    fn pass_with(&self, full: bool) -> SyncReport {
        let d = self.dp.desired(&self.snap, &[n("198.18.0.1/24")]);
        let mut r = SyncReport::default();
        let (mut k, mut nft) = (self.k.clone(), self.k.clone());
        self.dp
            .apply_desired(&mut k, &mut nft, &self.snap, &d, full, &mut r);
        r
    }

    fn pass(&self) -> SyncReport {
        self.pass_with(true)
    }

    fn route(&self, dst: &str) -> Option<Route> {
        let mut v = self.k.routes_to(n(dst));
        assert!(v.len() <= 1, "{v:?}");
        v.pop()
    }
}

fn clean(r: &SyncReport) {
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

#[test]
fn route_sync_adds_missing_deletes_stale_and_replaces_changed_routes() {
    let mut f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    let foreign = Route {
        protocol: 3,
        ..tern_route("0.0.0.0/0", Target::Direct(ip("198.18.0.254")))
    };
    f.k.put_route(foreign.clone());
    f.k.put_route(routes_blackhole("10.244.9.0/26"));
    let r = f.pass();
    clean(&r);
    assert_eq!((r.routes_set, r.routes_removed), (3, 1));
    assert_eq!(f.route("10.244.0.0/26").unwrap().kind, RouteKind::Blackhole);
    assert_eq!(
        f.route("10.244.1.0/26").unwrap().gateway,
        Some(ip("198.18.0.2"))
    );
    assert_eq!(
        f.route("10.244.2.0/26").unwrap().gateway,
        Some(ip("198.18.0.3"))
    );
    assert!(f.route("10.244.9.0/26").is_none());
    assert_eq!(f.route("0.0.0.0/0"), Some(foreign), "foreign route kept");
    // b moves: its route is replaced in place; then nothing is left to do.
    f.snap.nodes[1].addresses = vec![n("198.18.0.22/24")];
    let r = f.pass();
    clean(&r);
    assert_eq!((r.routes_set, r.routes_removed), (1, 0));
    assert_eq!(
        f.route("10.244.1.0/26").unwrap().gateway,
        Some(ip("198.18.0.22"))
    );
    let r = f.pass();
    assert_eq!((r.routes_set, r.routes_removed, r.vtep_changes), (0, 0, 0));
    // b's block goes: so does its route.
    f.snap.blocks.remove(1);
    let r = f.pass();
    assert_eq!(r.routes_removed, 1);
    assert!(f.route("10.244.1.0/26").is_none());
}

/// The reconciler's kernel route to `dst` (no tunnel).
fn tern_route(dst: &str, t: Target) -> Route {
    let d = Desired {
        routes: [(n(dst), t)].into(),
        ..Desired::default()
    };
    routes::plan::kernel_routes(&d, None, None, None).remove(0)
}

fn routes_blackhole(dst: &str) -> Route {
    tern_route(dst, Target::Blackhole)
}

#[test]
fn a_refused_route_is_reported_and_installed_by_the_next_pass() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    f.k.fail_next_route_add();
    let r = f.pass();
    assert_eq!(r.routes_set, 2);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].starts_with("route 10.244."), "{:?}", r.errors);
    let r = f.pass();
    clean(&r);
    assert_eq!(r.routes_set, 1);
    for dst in ["10.244.0.0/26", "10.244.1.0/26", "10.244.2.0/26"] {
        assert!(f.route(dst).is_some(), "{dst}");
    }
    // A refused delete: reported, the stale route stays, the next pass removes it.
    f.k.put_route(routes_blackhole("10.244.9.0/26"));
    f.k.fail_next_route_del();
    let r = f.pass();
    assert!(
        r.errors
            .iter()
            .any(|e| e.starts_with("removing route 10.244.9.0/26"))
    );
    assert!(f.route("10.244.9.0/26").is_some());
    clean(&f.pass());
    assert!(f.route("10.244.9.0/26").is_none());
}

#[test]
fn a_failed_route_listing_changes_nothing() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    f.k.put_route(routes_blackhole("10.244.9.0/26"));
    f.k.fail_next(Op::RouteList, libc::EINTR);
    let r = f.pass();
    assert!(
        r.errors.iter().any(|e| e.starts_with("listing routes")),
        "{:?}",
        r.errors
    );
    assert_eq!(f.k.calls(Op::RouteAdd) + f.k.calls(Op::RouteDel), 0);
    assert!(f.route("10.244.9.0/26").is_some());
}

#[test]
fn vxlan_device_neighbours_and_routes_are_created_and_repaired() {
    let f = fixture(pool(EncapMode::Always, EncapMode::Never, false));
    let r = f.pass();
    clean(&r);
    let vx = f.k.link(VXLAN_DEVICE).unwrap();
    assert!(vx.up);
    assert_eq!(vx.mac, Some(routes::vtep_mac(ME)));
    assert_eq!(vx.mtu, 1500 - mtu::VXLAN_OVERHEAD);
    assert!(
        f.k.all_addresses()
            .contains(&(vx.index, n("10.244.0.0/32")))
    );
    assert_eq!(r.vtep_changes, 4, "two neighbours, two FDB entries");
    let to_b = f.route("10.244.1.0/26").unwrap();
    assert_eq!(
        (to_b.gateway, to_b.oif, to_b.onlink),
        (Some(ip("10.244.1.0")), Some(vx.index), true)
    );
    // Drift: a neighbour deleted, an FDB entry pointing elsewhere, the MAC changed.
    let mut k = f.k.clone();
    assert!(k.delete_neighbour(vx.index, ip("10.244.1.0")).unwrap());
    k.add_fdb(vx.index, routes::vtep_mac("c"), ip("198.18.0.99"))
        .unwrap();
    k.set_mac(vx.index, [2, 0, 0, 0, 0, 1]).unwrap();
    let r = f.pass();
    clean(&r);
    assert!(r.vtep_changes >= 2, "{r:?}");
    assert_eq!(
        f.k.link(VXLAN_DEVICE).unwrap().mac,
        Some(routes::vtep_mac(ME))
    );
    assert_eq!(f.k.all_neighbours().len(), 2);
    let fdb: Vec<_> = f.k.all_fdb().into_iter().map(|e| (e.mac, e.dst)).collect();
    assert!(
        fdb.contains(&(routes::vtep_mac("c"), Some(ip("198.18.0.3")))),
        "{fdb:?}"
    );
    assert_eq!(fdb.len(), 2);
}

#[test]
fn a_failed_vxlan_create_is_reported_and_retried() {
    let f = fixture(pool(EncapMode::Always, EncapMode::Never, false));
    f.k.fail_next_link_add();
    let r = f.pass();
    assert!(
        r.errors
            .iter()
            .any(|e| e.starts_with("cannot create vxlan.tern")),
        "{:?}",
        r.errors
    );
    assert!(f.k.link(VXLAN_DEVICE).is_none());
    // Without the device no tunnel route is planned; the own blackhole still is.
    assert!(f.route("10.244.1.0/26").is_none());
    assert!(f.route("10.244.0.0/26").is_some());
    clean(&f.pass());
    assert!(f.k.link(VXLAN_DEVICE).is_some());
    assert!(f.route("10.244.1.0/26").is_some());
}

#[test]
fn a_stale_vxlan_device_is_recreated_and_a_taken_vni_reported() {
    let f = fixture(pool(EncapMode::Always, EncapMode::Never, false));
    let mut k = f.k.clone();
    // Left by a run with another underlay address.
    k.create_vxlan(VXLAN_DEVICE, VXLAN_VNI, ip("198.18.0.77"), None, VXLAN_PORT)
        .unwrap();
    let old = f.k.link(VXLAN_DEVICE).unwrap().index;
    clean(&f.pass());
    let vx = k.vxlan_devices().unwrap();
    assert_eq!(vx.len(), 1);
    assert_ne!(vx[0].index, old);
    assert_eq!(vx[0].local, Some(ip("198.18.0.1")));
    // Another device holding the VNI and port: reported, ours not created.
    assert!(k.delete_link(VXLAN_DEVICE).unwrap());
    k.create_vxlan("flannel.1", VXLAN_VNI, ip("198.18.0.1"), None, VXLAN_PORT)
        .unwrap();
    let r = f.pass();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("already used by device flannel.1")),
        "{:?}",
        r.errors
    );
    assert!(f.k.link(VXLAN_DEVICE).is_none());
}

#[test]
fn the_vxlan_device_goes_when_no_pool_uses_vxlan() {
    let mut f = fixture(pool(EncapMode::Always, EncapMode::Never, false));
    clean(&f.pass());
    f.snap.pools[0].vxlan = EncapMode::Never;
    let r = f.pass();
    clean(&r);
    assert!(f.k.link(VXLAN_DEVICE).is_none());
    assert!(f.k.all_neighbours().is_empty());
    assert_eq!(
        f.route("10.244.1.0/26").unwrap().gateway,
        Some(ip("198.18.0.2"))
    );
}

#[test]
fn ipip_needs_tunl0_and_a_kernel_without_ipip_is_reported() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Always, false));
    f.k.unsupported("ipip");
    let r = f.pass();
    assert!(
        r.errors.iter().any(|e| e.starts_with("IPIP not supported")),
        "{:?}",
        r.errors
    );
    assert!(f.route("10.244.1.0/26").is_none());
    let f = fixture(pool(EncapMode::Never, EncapMode::Always, false));
    clean(&f.pass());
    let tunl = f.k.link(IPIP_DEVICE).unwrap();
    assert!(tunl.up);
    let to_b = f.route("10.244.1.0/26").unwrap();
    assert_eq!(
        (to_b.gateway, to_b.oif, to_b.onlink),
        (Some(ip("198.18.0.2")), Some(tunl.index), true)
    );
}

#[test]
fn a_lost_host_route_of_an_up_pod_veth_is_restored() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    let ep = |name: &str, addr: &str| {
        let ep = crate::endpoints::Endpoint {
            node: ME.into(),
            attachment: tern_api::Attachment {
                network: "k8s-pod-network".into(),
                container_id: format!("c-{name}"),
                ifname: "eth0".into(),
                netns_path: String::new(),
                pod: None,
            },
            host_ifname: name.into(),
            mac: Some(tern_model::MacAddr([0x0a, 0x58, 0, 0, 0, 1])),
            ip_networks: vec![addr.parse().unwrap()],
            labels: Default::default(),
            ports: Vec::new(),
            delegated_ipam: false,
        };
        crate::endpoints::store_io::put(&*f.store, &ep).unwrap();
    };
    ep("tern0000000000a", "10.244.0.5/32");
    ep("tern0000000000b", "10.244.0.6/32");
    let up = f.k.add_link("tern0000000000a", "veth", true);
    // A DEL in progress: the veth is down; its route is not restored.
    f.k.add_link("tern0000000000b", "veth", false);
    let r = f.pass();
    clean(&r);
    let host = f.route("10.244.0.5/32").unwrap();
    assert_eq!(
        (host.oif, host.scope, host.protocol),
        (Some(up), Scope::Link, TERN_ROUTE_PROTOCOL)
    );
    assert!(f.route("10.244.0.6/32").is_none());
    // The endpoint code's route is never the reconciler's to delete.
    let r = f.pass();
    assert_eq!((r.routes_set, r.routes_removed), (0, 0));
    assert!(f.route("10.244.0.5/32").is_some());
}

/// A route of tern's BGP speaker out of eth0.
fn bgp_route(dst: &str, gw: &str) -> Route {
    Route {
        oif: Some(2),
        protocol: TERN_BGP_ROUTE_PROTOCOL,
        ..tern_route(dst, Target::Direct(ip(gw)))
    }
}

#[test]
fn bgp_routes_no_speaker_routes_are_taken_over_in_place() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    // Left by a run with --bgp: a remote block, this node's own block, a withdrawn prefix.
    f.k.put_route(bgp_route("10.244.1.0/26", "198.18.0.2"));
    f.k.put_route(bgp_route("10.244.0.0/26", "198.18.0.2"));
    f.k.put_route(bgp_route("10.244.77.0/26", "198.18.0.2"));
    clean(&f.pass());
    let b = f.route("10.244.1.0/26").unwrap();
    assert_eq!(
        (b.protocol, b.gateway),
        (TERN_ROUTE_PROTOCOL, Some(ip("198.18.0.2")))
    );
    assert_eq!(f.route("10.244.0.0/26").unwrap().kind, RouteKind::Blackhole);
    assert!(f.route("10.244.77.0/26").is_none());
    assert!(
        f.k.all_routes()
            .iter()
            .all(|r| r.protocol != TERN_BGP_ROUTE_PROTOCOL)
    );
}

#[test]
fn with_bgp_the_speakers_direct_routes_are_left_to_it() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, false));
    f.dp.set_bgp_routing(true);
    f.k.put_route(bgp_route("10.244.1.0/26", "198.18.0.2"));
    clean(&f.pass());
    assert_eq!(
        f.route("10.244.1.0/26").unwrap().protocol,
        TERN_BGP_ROUTE_PROTOCOL
    );
    // The reconciler routes neither remote block, and blackholes its own.
    assert!(f.route("10.244.2.0/26").is_none());
    assert_eq!(f.route("10.244.0.0/26").unwrap().kind, RouteKind::Blackhole);
}

#[test]
fn a_failed_nat_apply_is_reported_and_reapplied_by_the_next_pass() {
    let f = fixture(pool(EncapMode::Never, EncapMode::Never, true));
    clean(&f.pass_with(false));
    let applied = f.k.nft_applied();
    assert!(
        matches!(&applied[..], [NftApplied::Batch { table, .. }] if table == "tern"),
        "{applied:?}"
    );
    // Unchanged: event-driven passes skip the kernel, full ones re-apply.
    clean(&f.pass_with(false));
    assert_eq!(f.k.nft_applied().len(), 1);
    clean(&f.pass_with(true));
    assert_eq!(f.k.nft_applied().len(), 2);
    // The periodic pass's batch and its nft -f fallback both refused: reported, and what
    // was in force is no longer known, so the next event-driven pass applies again.
    f.k.fail_next_nft_apply();
    f.k.fail_next_nft_script();
    let r = f.pass_with(true);
    assert!(
        r.errors
            .iter()
            .any(|e| e.starts_with("natOutgoing (nftables table inet tern)")),
        "{:?}",
        r.errors
    );
    assert_eq!(f.k.nft_applied().len(), 2);
    clean(&f.pass_with(false));
    assert_eq!(f.k.nft_applied().len(), 3);
    // Only the batch refused: the same changes through nft -f, no error.
    f.k.fail_next_nft_apply();
    clean(&f.pass_with(true));
    assert!(
        matches!(f.k.nft_applied().last(), Some(NftApplied::Script(s)) if s.contains("table inet tern"))
    );
}

/// [`fixture`] dual-stack: a's eth0 also holds 2001:db8::11/64, every node an IPv6 address,
/// IPv6 VXLAN tunnel address and MAC, a /122 of an IPv6 pool of `v6_vxlan` beside the IPv4
/// pool of `v4_vxlan`.
fn dual_fixture(v4_vxlan: EncapMode, v6_vxlan: EncapMode) -> Fixture {
    let mut f = fixture(pool(v4_vxlan, EncapMode::Never, false));
    let eth0 = f.k.link("eth0").unwrap().index;
    f.k.add_address(eth0, n("2001:db8::11/64")).unwrap();
    f.snap.pools.push(PoolInfo {
        name: "v6".into(),
        cidr: n("fd00:10:244::/48"),
        ..pool(v6_vxlan, EncapMode::Never, false)
    });
    for (i, node) in f.snap.nodes.iter_mut().enumerate() {
        node.addresses.push(n(&format!("2001:db8::{}/64", 11 + i)));
        node.vxlan_tunnel_addr_v6 = Some(ip(&format!("fd00:10:244::{:x}", i * 64)));
        node.vtep_mac_v6 = Some(routes::vtep_mac_v6(&node.name));
        f.snap.blocks.push(BlockInfo {
            cidr: n(&format!("fd00:10:244::{:x}/122", i * 64)),
            affinity: Some(node.name.clone()),
            allocations: Vec::new(),
        });
    }
    f
}

impl Fixture {
    fn dual_pass(&self) -> SyncReport {
        let d = self
            .dp
            .desired(&self.snap, &[n("198.18.0.1/24"), n("2001:db8::11/64")]);
        let mut r = SyncReport::default();
        let (mut k, mut nft) = (self.k.clone(), self.k.clone());
        self.dp
            .apply_desired(&mut k, &mut nft, &self.snap, &d, true, &mut r);
        r
    }
}

#[test]
fn ipv6_pools_get_vxlan_v6_beside_vxlan_each_with_the_vteps_of_its_family() {
    let mut f = dual_fixture(EncapMode::Always, EncapMode::Always);
    let r = f.dual_pass();
    clean(&r);
    assert_eq!(
        r.vtep_changes, 8,
        "two neighbours and two FDB entries per device"
    );
    let mut k = f.k.clone();
    let devs = k.vxlan_devices().unwrap();
    let v6 = devs.iter().find(|d| d.name == VXLAN_V6_DEVICE).unwrap();
    let v4 = devs.iter().find(|d| d.name == VXLAN_DEVICE).unwrap();
    assert_eq!(
        (v6.vni, v6.port, v6.local),
        (Some(VXLAN_VNI), Some(VXLAN_PORT), Some(ip("2001:db8::11")))
    );
    assert_eq!(v4.local, Some(ip("198.18.0.1")));
    let link = f.k.link(VXLAN_V6_DEVICE).unwrap();
    assert!(link.up);
    assert_eq!(link.mac, Some(routes::vtep_mac_v6(ME)));
    assert_ne!(link.mac, f.k.link(VXLAN_DEVICE).unwrap().mac);
    assert_eq!(link.mtu, 1500 - mtu::VXLAN_V6_OVERHEAD);
    assert!(
        f.k.all_addresses()
            .contains(&(v6.index, n("fd00:10:244::/128")))
    );
    for (dev, want_v6) in [(v4.index, false), (v6.index, true)] {
        let neigh = k.neighbours(Some(dev)).unwrap();
        assert_eq!(neigh.len(), 2, "{neigh:?}");
        assert!(neigh.iter().all(|x| x.ip.is_ipv6() == want_v6), "{neigh:?}");
        let fdb = k.fdb(dev).unwrap();
        assert_eq!(fdb.len(), 2, "{fdb:?}");
        assert!(
            fdb.iter()
                .all(|e| e.dst.is_some_and(|d| d.is_ipv6() == want_v6)),
            "{fdb:?}"
        );
    }
    assert!(
        k.fdb(v6.index)
            .unwrap()
            .iter()
            .any(|e| e.mac == routes::vtep_mac_v6("b") && e.dst == Some(ip("2001:db8::12")))
    );
    let to_b6 = f.route("fd00:10:244::40/122").unwrap();
    assert_eq!(
        (to_b6.gateway, to_b6.oif, to_b6.onlink),
        (Some(ip("fd00:10:244::40")), Some(v6.index), true)
    );
    assert_eq!(f.route("10.244.1.0/26").unwrap().oif, Some(v4.index));
    let r = f.dual_pass();
    assert_eq!((r.routes_set, r.routes_removed, r.vtep_changes), (0, 0, 0));

    // The IPv6 pool stops using VXLAN: vxlan-v6.tern goes, its blocks route directly over
    // the IPv6 underlay, vxlan.tern stays.
    f.snap.pools[1].vxlan = EncapMode::Never;
    clean(&f.dual_pass());
    assert!(f.k.link(VXLAN_V6_DEVICE).is_none());
    assert!(f.k.link(VXLAN_DEVICE).is_some());
    assert_eq!(
        f.route("fd00:10:244::40/122").unwrap().gateway,
        Some(ip("2001:db8::12"))
    );
}

#[test]
fn a_foreign_device_on_the_vni_and_port_blocks_only_its_own_family() {
    let f = dual_fixture(EncapMode::Always, EncapMode::Always);
    let mut k = f.k.clone();
    k.create_vxlan("other6", VXLAN_VNI, ip("2001:db8::11"), None, VXLAN_PORT)
        .unwrap();
    let r = f.dual_pass();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].contains("cannot create vxlan-v6.tern")
            && r.errors[0].contains("already used by device other6"),
        "{:?}",
        r.errors
    );
    assert!(f.k.link(VXLAN_V6_DEVICE).is_none());
    assert!(f.k.link(VXLAN_DEVICE).is_some());
    // Without the device the IPv6 tunnel routes wait; the IPv4 ones are there.
    assert!(f.route("fd00:10:244::40/122").is_none());
    assert!(f.route("10.244.1.0/26").is_some());
}
