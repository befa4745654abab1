//! Real-kernel tests of the dataplane reconciler: two or three nodes (network namespaces on an
//! underlay bridge that lives in its own namespace), pods wired as the agent wires them, and
//! real UDP/TCP between pods on different nodes. Every namespace is uniquely named and deleted
//! by a drop guard; the reconcilers run on threads that entered their node's namespace. The
//! root namespace is never touched. Underlay: 198.18.0.0/15.

mod common;

use tern_testkit::netns::{Netns as Ns, Underlay};

// The harness's UDP and TCP echoes between namespaces.
use common::tcp_echo as tcp;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tern_agent::dataplane::{Dataplane, DataplaneConfig};
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_linux::netns::NetNs;
use tern_model::{EncapMode, IpPool, IpPoolSpec, Kind, Resource};
use tern_store::Store;
use tern_testkit::netns::udp_echo;

/// One node: namespace, address, reconciler.
struct NodeNs {
    name: String,
    ns: Ns,
    ip: IpAddr,
    dp: Option<Arc<Dataplane>>,
    stop: Arc<AtomicBool>,
}

impl NodeNs {
    /// A node attached to the underlay bridge (or to `router` when given: then its gateway is
    /// the router's address `gw`).
    fn new(name: &str, u: &Underlay, cidr: &str, gw: &str) -> NodeNs {
        let ns = Ns::new(name);
        u.attach(&ns, cidr, gw);
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        NodeNs::in_ns(name, ns, cidr)
    }

    /// The node `name` in `ns`, its underlay address the address of `cidr`.
    fn in_ns(name: &str, ns: Ns, cidr: &str) -> NodeNs {
        NodeNs {
            name: name.to_string(),
            ns,
            ip: cidr.split('/').next().unwrap().parse().unwrap(),
            dp: None,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn start(&mut self, store: &Arc<dyn Store>, watch: bool) {
        let cfg = DataplaneConfig {
            node_name: self.name.clone(),
            node_ip: Some(self.ip),
            node_ip6: None,
            interface_prefix: "tern".into(),
            mtu: 0,
        };
        let store = store.clone();
        let stop = self.stop.clone();
        let dp = self.ns.run(move || {
            let dp = Arc::new(Dataplane::new(cfg, store).unwrap());
            if watch {
                dp.spawn_watch(stop).unwrap();
            }
            dp
        });
        self.dp = Some(dp);
    }

    /// A node on an IPv6-only underlay: `eth0` on the bridge with `cidr` (added `nodad`, so
    /// usable at once), IPv6 forwarding on.
    fn new_v6(name: &str, u: &Underlay, cidr: &str) -> NodeNs {
        let ns = Ns::new(name);
        let port = tern_testkit::netns::unique_name("u");
        u.ns.ip(&[
            "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        u.ns.ip(&["link", "set", &port, "master", "br0", "up"]);
        ns.ip(&["-6", "addr", "add", cidr, "dev", "eth0", "nodad"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        NodeNs::in_ns(name, ns, cidr)
    }

    fn sync(&self) -> tern_agent::dataplane::SyncReport {
        let dp = self.dp.clone().unwrap();
        self.ns.run(move || dp.sync())
    }

    fn routes(&self) -> String {
        self.ns.ip(&["route", "show", "proto", "84"])
    }
}

impl Drop for NodeNs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A pod on a node: namespace with eth0 wired like the agent does, address from IPAM.
struct Pod {
    ns: Ns,
    ip: IpAddr,
}

fn add_pod(node: &NodeNs, ipam: &Ipam, tag: &str) -> Pod {
    add_pod_of(node, ipam, tag, false)
}

/// [`add_pod`] with an IPv6 address instead when `v6`.
fn add_pod_of(node: &NodeNs, ipam: &Ipam, tag: &str, v6: bool) -> Pod {
    let ns = Ns::new(tag);
    let handle = format!("test.{}", ns.name);
    let ip = ipam
        .auto_assign(&AssignArgs {
            handle,
            node: node.name.clone(),
            attrs: AllocationAttrs {
                node: node.name.clone(),
                pod: tag.into(),
                ..Default::default()
            },
            num_v4: usize::from(!v6),
            num_v6: usize::from(v6),
            ..Default::default()
        })
        .unwrap()[0];
    let pod_ns = NetNs::open(std::path::Path::new(&ns.path())).unwrap();
    let host_if = format!("tern{}", &ns.name[ns.name.len().saturating_sub(8)..]);
    let mtu = node.dp.as_ref().unwrap().pod_mtu();
    node.ns.run(|| {
        let cfg = tern_linux::veth::PodInterfaceConfig {
            host_ifname: &host_if,
            pod_ifname: "eth0",
            pod_ns: &pod_ns,
            addresses: &[ipnet::IpNet::from(ip)],
            mtu,
            pod_mac: None,
            allow_ip_forwarding: false,
        };
        tern_linux::veth::setup_pod_interface(&cfg).unwrap();
    });
    Pod { ns, ip }
}

/// Writes pool `name` over 10.244.0.0/16 (every test's pool) with these modes.
fn put_pool(store: &dyn Store, name: &str, vxlan: EncapMode, ipip: EncapMode, nat: bool) {
    let mut spec = IpPoolSpec::new("10.244.0.0/16");
    spec.vxlan_mode = vxlan;
    spec.ipip_mode = ipip;
    spec.nat_outgoing = nat;
    tern_model::put_resource(
        store,
        &Resource::IpPool(IpPool::new(name.to_string(), spec)),
    )
    .unwrap();
}

/// Syncs every node twice (the first pass may precede another node's registration) and
/// asserts the second reported no error.
fn sync_all(nodes: &[&NodeNs]) {
    for n in nodes {
        n.sync();
    }
    for n in nodes {
        let r = n.sync();
        assert!(r.errors.is_empty(), "{}: {:?}", n.name, r.errors);
    }
}

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/store.db", dir.path().display());
    let s = tern_store::open(&url).unwrap();
    (dir, s)
}

fn block_of(ipam: &Ipam, ip: IpAddr) -> ipnet::IpNet {
    ipam.blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.cidr.contains(&ip))
        .unwrap()
        .cidr
}

fn two_nodes(
    mode: EncapMode,
    nat: bool,
) -> (tempfile::TempDir, Arc<dyn Store>, Underlay, NodeNs, NodeNs) {
    let (dir, s) = store();
    put_pool(&*s, "pool", mode, EncapMode::Never, nat);
    let u = Underlay::new();
    let mut a = NodeNs::new("a", &u, "198.18.0.1/24", "198.18.0.254");
    let mut b = NodeNs::new("b", &u, "198.18.0.2/24", "198.18.0.254");
    a.start(&s, false);
    b.start(&s, false);
    (dir, s, u, a, b)
}

#[test]
fn direct_routing_between_two_nodes() {
    tern_testkit::need_root();
    let (_d, s, _u, a, b) = two_nodes(EncapMode::Never, false);
    let ipam = Ipam::new(s.clone());
    let pa = add_pod(&a, &ipam, "pa");
    let pb = add_pod(&b, &ipam, "pb");
    sync_all(&[&a, &b]);
    let (ba, bb) = (block_of(&ipam, pa.ip), block_of(&ipam, pb.ip));
    let ra = a.routes();
    assert!(ra.contains(&format!("blackhole {ba}")), "{ra}");
    assert!(
        ra.contains(&format!("{bb} via 198.18.0.2 dev eth0")),
        "{ra}"
    );
    assert!(!ra.contains("vxlan.tern"), "{ra}");
    assert_eq!(a.dp.as_ref().unwrap().pod_mtu(), 1500);
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
    tcp(&pb.ns, &pa.ns, pa.ip).unwrap();

    // A route deleted behind the reconciler's back is repaired by the resync.
    a.ns.ip(&["route", "del", &bb.to_string()]);
    assert!(!a.routes().contains(&bb.to_string()));
    a.sync();
    assert!(
        a.routes().contains(&format!("{bb} via 198.18.0.2")),
        "{}",
        a.routes()
    );
    // Pod host routes (proto 84 on tern veths) are never touched.
    assert!(
        a.routes().contains(&format!("{} dev tern", pa.ip)),
        "{}",
        a.routes()
    );

    // A route that is not tern's is never touched, even to a pool address.
    a.ns.ip(&["route", "add", "10.244.250.0/24", "via", "198.18.0.2"]);
    a.sync();
    assert!(a.ns.ip(&["route"]).contains("10.244.250.0/24"));

    // A removed node's routes disappear.
    tern_model::delete_resource(&*s, Kind::Node, None, "b").unwrap();
    let r = a.sync();
    assert!(!a.routes().contains(&bb.to_string()), "{}", a.routes());
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("no Node resource for node b")),
        "{:?}",
        r.errors
    );
}

#[test]
fn vxlan_between_two_nodes_and_watch_latency() {
    tern_testkit::need_root();
    let (_d, s, _u, mut a, mut b) = two_nodes(EncapMode::Always, false);
    a.start(&s, true);
    b.start(&s, true);
    let ipam = Ipam::new(s.clone());
    sync_all(&[&a, &b]);
    assert_eq!(a.dp.as_ref().unwrap().pod_mtu(), 1450);
    let link = a.ns.ip(&["-d", "link", "show", "vxlan.tern"]);
    assert!(
        link.contains("vxlan id 4096") && link.contains("dstport 4789"),
        "{link}"
    );
    assert!(
        link.contains("mtu 1450") && link.contains("nolearning"),
        "{link}"
    );
    let pa = add_pod(&a, &ipam, "pa");
    // The watch applies b's new block on a quickly (sqlite watch polls; allow some slack).
    let pb_start = Instant::now();
    let pb = add_pod(&b, &ipam, "pb");
    let bb = block_of(&ipam, pb.ip);
    assert!(
        tern_testkit::wait::poll(Duration::from_secs(2), Duration::from_millis(10), || a
            .routes()
            .contains(&bb.to_string())),
        "{}",
        a.routes()
    );
    eprintln!(
        "remote block routed {:?} after the allocation started",
        pb_start.elapsed()
    );
    let node_b = match tern_model::get_resource(&*s, Kind::Node, None, "b").unwrap() {
        Some(Resource::Node(n)) => n,
        _ => panic!("no Node b"),
    };
    let tip = node_b.spec.ipv4_vxlan_tunnel_addr.clone().unwrap();
    let mac = node_b.spec.vxlan_tunnel_mac_addr.clone().unwrap();
    let ra = a.routes();
    assert!(
        ra.contains(&format!("{bb} via {tip} dev vxlan.tern")) && ra.contains("onlink"),
        "{ra}"
    );
    let neigh = a.ns.ip(&["neigh", "show", "dev", "vxlan.tern"]);
    assert!(
        neigh.contains(&tip) && neigh.contains(&mac) && neigh.contains("PERMANENT"),
        "{neigh}"
    );
    let fdb = a.ns.exec(&["bridge", "fdb", "show", "dev", "vxlan.tern"]);
    assert!(fdb.contains(&format!("{mac} dst 198.18.0.2")), "{fdb}");
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
    tcp(&pa.ns, &pb.ns, pb.ip).unwrap();

    // Delete the neighbour behind our back: the resync repairs it.
    a.ns.ip(&["neigh", "del", &tip, "dev", "vxlan.tern"]);
    a.sync();
    assert!(
        a.ns.ip(&["neigh", "show", "dev", "vxlan.tern"])
            .contains(&tip)
    );
}

#[test]
fn cross_subnet_encapsulates_only_across_the_router() {
    tern_testkit::need_root();
    let (_d, s) = store();
    put_pool(&*s, "pool", EncapMode::CrossSubnet, EncapMode::Never, false);
    let u = Underlay::new();
    // A router namespace joins 198.18.0.0/24 (the bridge) and 198.18.1.0/24 (a link to c).
    let r = Ns::new("r");
    let port = tern_testkit::netns::unique_name("u");
    u.ns.ip(&[
        "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &r.name,
    ]);
    u.ns.ip(&["link", "set", &port, "master", "br0", "up"]);
    r.ip(&["addr", "add", "198.18.0.254/24", "dev", "eth0"]);
    r.ip(&["link", "set", "eth0", "up"]);
    r.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let mut a = NodeNs::new("a", &u, "198.18.0.1/24", "198.18.0.254");
    let mut b = NodeNs::new("b", &u, "198.18.0.2/24", "198.18.0.254");
    let c_ns = Ns::new("c");
    r.ip(&[
        "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", &c_ns.name,
    ]);
    r.ip(&["addr", "add", "198.18.1.254/24", "dev", "eth1"]);
    r.ip(&["link", "set", "eth1", "up"]);
    c_ns.ip(&["addr", "add", "198.18.1.3/24", "dev", "eth0"]);
    c_ns.ip(&["link", "set", "eth0", "up"]);
    c_ns.ip(&["route", "add", "default", "via", "198.18.1.254"]);
    c_ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let mut c = NodeNs::in_ns("c", c_ns, "198.18.1.3");
    for n in [&mut a, &mut b, &mut c] {
        n.start(&s, false);
    }
    let ipam = Ipam::new(s.clone());
    let pa = add_pod(&a, &ipam, "pa");
    let pb = add_pod(&b, &ipam, "pb");
    let pc = add_pod(&c, &ipam, "pc");
    sync_all(&[&a, &b, &c]);
    let ra = a.routes();
    let (bb, bc) = (block_of(&ipam, pb.ip), block_of(&ipam, pc.ip));
    assert!(
        ra.contains(&format!("{bb} via 198.18.0.2 dev eth0")),
        "{ra}"
    );
    assert!(
        ra.contains(&format!("{bc} via")) && ra.contains("dev vxlan.tern"),
        "{ra}"
    );
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
    assert_eq!(
        udp_echo(&pa.ns.path(), &pc.ns.path(), pc.ip).unwrap(),
        pa.ip
    );
    tcp(&pc.ns, &pb.ns, pb.ip).unwrap();
}

#[test]
fn nat_outgoing_masquerades_to_destinations_outside_the_pools() {
    tern_testkit::need_root();
    let (_d, s, u, a, b) = two_nodes(EncapMode::Never, true);
    let ipam = Ipam::new(s.clone());
    let pa = add_pod(&a, &ipam, "pa");
    let pb = add_pod(&b, &ipam, "pb");
    sync_all(&[&a, &b]);
    let table = a.ns.exec(&["nft", "list", "table", "inet", "tern"]);
    assert!(table.contains("chain nat-postrouting"), "{table}");
    assert!(
        table.contains("ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade"),
        "{table}"
    );
    // An "external" host on the underlay, outside every pool.
    u.ns.ip(&["addr", "add", "198.18.0.100/24", "dev", "br0"]);
    let seen = udp_echo(&pa.ns.path(), &u.ns.path(), "198.18.0.100".parse().unwrap()).unwrap();
    assert_eq!(
        seen, a.ip,
        "traffic leaving the pool is masqueraded to the node address"
    );
    // Pod to pod stays unmasqueraded.
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
    // Turning natOutgoing off empties the chain; other tables are untouched.
    a.ns.exec(&["nft", "add", "table", "ip", "other"]);
    put_pool(&*s, "pool", EncapMode::Never, EncapMode::Never, false);
    a.sync();
    let table = a.ns.exec(&["nft", "list", "table", "inet", "tern"]);
    assert!(!table.contains("masquerade"), "{table}");
    assert!(
        a.ns.exec(&["nft", "list", "tables"])
            .contains("table ip other")
    );
    // Without NAT the external host sees the pod address (given a route back to the pool).
    u.ns.ip(&["route", "add", "10.244.0.0/16", "via", "198.18.0.1"]);
    assert_eq!(
        udp_echo(&pa.ns.path(), &u.ns.path(), "198.18.0.100".parse().unwrap()).unwrap(),
        pa.ip
    );
}

#[test]
fn bad_input_is_reported_and_the_rest_keeps_working() {
    tern_testkit::need_root();
    let (_d, s) = store();
    put_pool(&*s, "good", EncapMode::Never, EncapMode::Never, false);
    // Written behind validation's back: both encapsulations, and an unknown mode.
    let mut both = IpPoolSpec::new("10.50.0.0/16");
    both.vxlan_mode = EncapMode::Always;
    both.ipip_mode = EncapMode::Always;
    let u = Underlay::new();
    let mut a = NodeNs::new("a", &u, "198.18.0.1/24", "198.18.0.254");
    let b = NodeNs::new("b", &u, "198.18.0.2/24", "198.18.0.254");
    a.start(&s, false);
    let ipam = Ipam::new(s.clone());
    let _pa = add_pod(&a, &ipam, "pa");
    let doc = Resource::IpPool(IpPool::new("both".to_string(), both)).to_json();
    s.put(
        &tern_store::keys::resource("IPPool", "both"),
        doc.as_bytes(),
    )
    .unwrap();
    let unknown = doc
        .replace("\"Always\"", "\"Sometimes\"")
        .replace("both", "weird")
        .replace("10.50.", "10.51.");
    s.put(
        &tern_store::keys::resource("IPPool", "weird"),
        unknown.as_bytes(),
    )
    .unwrap();

    // --node-ip that is not on any interface: a clear error.
    let store2 = s.clone();
    let err =
        a.ns.run(move || {
            Dataplane::new(
                DataplaneConfig {
                    node_name: "a".into(),
                    node_ip: Some("198.19.9.9".parse().unwrap()),
                    node_ip6: None,
                    interface_prefix: "tern".into(),
                    mtu: 0,
                },
                store2,
            )
            .err()
        })
        .expect("a foreign --node-ip must be refused");
    assert!(
        err.to_string()
            .contains("198.19.9.9 is not configured on any interface"),
        "{err}"
    );

    let r = a.sync();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("both") && e.contains("IPIP and VXLAN")),
        "{:?}",
        r.errors
    );
    assert!(
        r.errors.iter().any(|e| e.contains("weird")),
        "{:?}",
        r.errors
    );
    assert!(a.routes().contains("blackhole 10.244."), "{}", a.routes());

    // A VNI/port conflict: another device holds VNI 4096 on port 4789. (The corrupt pool is
    // removed first: IPAM itself refuses to allocate while a pool document is unreadable.)
    s.delete(&tern_store::keys::resource("IPPool", "weird"))
        .unwrap();
    put_pool(&*s, "good", EncapMode::Always, EncapMode::Never, false);
    a.ns.ip(&[
        "link", "add", "vx-other", "type", "vxlan", "id", "4096", "dstport", "4789",
    ]);
    let r = a.sync();
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("VNI 4096") && e.contains("vx-other")),
        "{:?}",
        r.errors
    );
    assert!(a.routes().contains("blackhole 10.244."), "{}", a.routes());
    drop(b);

    // IPIP on a kernel without the module is reported clearly (and works where supported).
    put_pool(&*s, "good", EncapMode::Never, EncapMode::Always, false);
    let r = a.sync();
    let has_tunl0 = a.ns.ip(&["link"]).contains("tunl0");
    assert!(
        has_tunl0
            || r.errors
                .iter()
                .any(|e| e.contains("IPIP not supported by this kernel")),
        "{:?}",
        r.errors
    );
    if !has_tunl0 {
        tern_testkit::kernel_limit("ipip", "no tunl0: only the clear error was checked");
    }
}

/// The switch from BGP to VXLAN (issue 13): the BGP routes (protocol 85) an agent that ran
/// with `--bgp` left in the kernel are taken over by the reconciler. With BGP on they stay
/// BGP's while the pool is unencapsulated; once it encapsulates, a route to a block whose
/// owner has no VTEP yet keeps carrying traffic, and each is replaced in place by the tunnel
/// route as soon as the reconciler can route it; a stale one to no block is removed. Without
/// BGP, a BGP route outside every pool is removed too. Traffic flows at every step.
#[test]
fn bgp_routes_are_taken_over_when_the_pool_switches_to_vxlan() {
    tern_testkit::need_root();
    let (_d, s, _u, a, b) = two_nodes(EncapMode::Never, false);
    for n in [&a, &b] {
        n.dp.as_ref().unwrap().set_bgp_routing(true);
    }
    let ipam = Ipam::new(s.clone());
    let pa = add_pod(&a, &ipam, "pa");
    let pb = add_pod(&b, &ipam, "pb");
    sync_all(&[&a, &b]);
    let (ba, bb) = (block_of(&ipam, pa.ip), block_of(&ipam, pb.ip));
    let bgp_routes = |n: &NodeNs| n.ns.ip(&["route", "show", "proto", "85"]);
    // What the speakers would have installed, a stale one to a block that is gone, and one
    // outside every pool (a BGPPeer's acceptPrefixes).
    let add85 = |n: &NodeNs, dst: &str, via: &str| {
        n.ns.ip(&["route", "add", dst, "via", via, "proto", "85"]);
    };
    add85(&a, &bb.to_string(), "198.18.0.2");
    add85(&b, &ba.to_string(), "198.18.0.1");
    add85(&a, "10.244.200.0/27", "198.18.0.2");
    add85(&a, "10.99.0.0/24", "198.18.0.2");
    sync_all(&[&a, &b]);
    assert!(
        bgp_routes(&a).contains(&format!("{bb} via 198.18.0.2")),
        "BGP's while the pool is unencapsulated:\n{}",
        bgp_routes(&a)
    );
    assert!(!a.routes().contains(&format!("{bb} via")), "{}", a.routes());
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );

    // The pool switches to VXLAN; only a has seen it (b has no VTEP yet).
    put_pool(&*s, "pool", EncapMode::Always, EncapMode::Never, false);
    let r = a.sync();
    assert!(
        r.errors.iter().any(|e| e.contains("node b")),
        "{:?}",
        r.errors
    );
    let bgp = bgp_routes(&a);
    assert!(
        bgp.contains(&format!("{bb} via 198.18.0.2")),
        "kept while b's VTEP is unknown:\n{bgp}"
    );
    assert!(!bgp.contains("10.244.200.0/27"), "stale route kept:\n{bgp}");
    assert!(
        bgp.contains("10.99.0.0/24"),
        "outside the pools, BGP's:\n{bgp}"
    );
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );

    // Both know each other's VTEP: the tunnel routes replace the BGP routes.
    sync_all(&[&a, &b]);
    for (n, other) in [(&a, bb), (&b, ba)] {
        let bgp = bgp_routes(n);
        assert!(
            !bgp.contains(&other.to_string()),
            "{}: BGP route left:\n{bgp}",
            n.name
        );
        let routes = n.routes();
        assert!(
            routes
                .lines()
                .any(|l| l.starts_with(&format!("{other} via ")) && l.contains("dev vxlan.tern")),
            "{}: {other} not over vxlan.tern:\n{routes}",
            n.name
        );
    }
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
    tcp(&pb.ns, &pa.ns, pa.ip).unwrap();

    // ternd restarted without --bgp: no speaker routes anything, its last route goes.
    let mut a = a;
    a.start(&s, false);
    let r = a.sync();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(bgp_routes(&a).trim(), "", "BGP routes left without --bgp");
    assert_eq!(
        udp_echo(&pa.ns.path(), &pb.ns.path(), pb.ip).unwrap(),
        pa.ip
    );
}

/// Reads a counter of `dev` in the node's namespace.
fn counter(n: &NodeNs, dev: &str, what: &str) -> u64 {
    let path = format!("/sys/class/net/{dev}/statistics/{what}");
    n.ns.exec(&["cat", &path]).trim().parse().unwrap()
}

/// IPv6 pools over an IPv6-only underlay (2001:db8::/64): each node registers an IPv6 VXLAN
/// tunnel address and VTEP MAC, creates `vxlan-v6.tern` (VNI 4096, port 4789, local = its IPv6
/// address, MTU 1500 - 70), programs the other node's permanent NDP neighbour and FDB entry
/// and routes its /122 block through it; TCP between pods crosses the device both ways.
/// Switching the pool's VXLAN off removes the device and the tunnel address.
#[test]
fn vxlan_v6_between_two_nodes_on_an_ipv6_underlay() {
    tern_testkit::need_root();
    let (_d, s) = store();
    let mut spec = IpPoolSpec::new("fd00:10:244::/48");
    spec.vxlan_mode = EncapMode::Always;
    let pool = IpPool::new("default-ipv6-ippool".to_string(), spec);
    tern_model::put_resource(&*s, &Resource::IpPool(pool.clone())).unwrap();
    let u = Underlay::new();
    let mut a = NodeNs::new_v6("a", &u, "2001:db8::11/64");
    let mut b = NodeNs::new_v6("b", &u, "2001:db8::12/64");
    a.start(&s, false);
    b.start(&s, false);
    let ipam = Ipam::new(s.clone());
    sync_all(&[&a, &b]);
    assert_eq!(a.dp.as_ref().unwrap().pod_mtu(), 1430);
    let link = a.ns.ip(&["-d", "link", "show", "vxlan-v6.tern"]);
    for want in [
        "vxlan id 4096",
        "local 2001:db8::11",
        "dstport 4789",
        "nolearning",
        "mtu 1430",
    ] {
        assert!(link.contains(want), "{want}: {link}");
    }
    assert!(
        !a.ns.links().contains("vxlan.tern:"),
        "no IPv4 pool, no vxlan.tern: {}",
        a.ns.links()
    );
    let pa = add_pod_of(&a, &ipam, "pa", true);
    let pb = add_pod_of(&b, &ipam, "pb", true);
    sync_all(&[&a, &b]);
    let node = |name: &str| match tern_model::get_resource(&*s, Kind::Node, None, name).unwrap() {
        Some(Resource::Node(n)) => n,
        _ => panic!("no Node {name}"),
    };
    let (na, nb) = (node("a"), node("b"));
    let tip = nb
        .spec
        .ipv6_vxlan_tunnel_addr
        .clone()
        .expect("b's v6 tunnel");
    let mac = nb
        .spec
        .vxlan_tunnel_mac_addr_v6
        .clone()
        .expect("b's v6 MAC");
    assert!(tip.parse::<IpAddr>().unwrap().is_ipv6());
    assert_eq!(nb.spec.ipv4_vxlan_tunnel_addr, None);
    assert_ne!(
        na.spec.vxlan_tunnel_mac_addr_v6,
        nb.spec.vxlan_tunnel_mac_addr_v6
    );
    // The device carries the node's own tunnel address and VTEP MAC.
    let a_tip = na.spec.ipv6_vxlan_tunnel_addr.clone().unwrap();
    let addrs = a.ns.ip(&["-6", "addr", "show", "dev", "vxlan-v6.tern"]);
    assert!(addrs.contains(&format!("{a_tip}/128")), "{addrs}");
    assert!(
        link.contains(na.spec.vxlan_tunnel_mac_addr_v6.as_deref().unwrap()),
        "{link}"
    );
    let bb = block_of(&ipam, pb.ip);
    assert_eq!(bb.prefix_len(), 122);
    let ra = a.ns.ip(&["-6", "route", "show", "proto", "84"]);
    assert!(
        ra.contains(&format!("{bb} via {tip} dev vxlan-v6.tern")) && ra.contains("onlink"),
        "{ra}"
    );
    let neigh = a.ns.ip(&["-6", "neigh", "show", "dev", "vxlan-v6.tern"]);
    assert!(
        neigh.contains(&tip) && neigh.contains(&mac) && neigh.contains("PERMANENT"),
        "{neigh}"
    );
    let fdb =
        a.ns.exec(&["bridge", "fdb", "show", "dev", "vxlan-v6.tern"]);
    assert!(fdb.contains(&format!("{mac} dst 2001:db8::12")), "{fdb}");
    let (tx, rx) = (
        counter(&a, "vxlan-v6.tern", "tx_packets"),
        counter(&a, "vxlan-v6.tern", "rx_packets"),
    );
    tcp(&pa.ns, &pb.ns, pb.ip).unwrap();
    tcp(&pb.ns, &pa.ns, pa.ip).unwrap();
    assert!(counter(&a, "vxlan-v6.tern", "tx_packets") > tx);
    assert!(counter(&a, "vxlan-v6.tern", "rx_packets") > rx);

    // The NDP neighbour deleted behind the reconciler's back is repaired by the resync.
    a.ns.ip(&["-6", "neigh", "del", &tip, "dev", "vxlan-v6.tern"]);
    a.sync();
    assert!(
        a.ns.ip(&["-6", "neigh", "show", "dev", "vxlan-v6.tern"])
            .contains(&tip)
    );

    // VXLAN off: the device goes, the tunnel address is given back.
    let mut off = pool;
    off.spec.vxlan_mode = EncapMode::Never;
    tern_model::put_resource(&*s, &Resource::IpPool(off)).unwrap();
    sync_all(&[&a, &b]);
    assert!(!a.ns.links().contains("vxlan-v6.tern"), "{}", a.ns.links());
    assert_eq!(node("a").spec.ipv6_vxlan_tunnel_addr, None);
    assert!(
        ipam.ips_by_handle("vxlan-v6-tunnel-addr-a")
            .unwrap()
            .is_empty(),
        "tunnel address not released"
    );
    let ra = a.ns.ip(&["-6", "route", "show", "proto", "84"]);
    assert!(
        ra.contains(&format!("{bb} via 2001:db8::12 dev eth0")),
        "{ra}"
    );
    tcp(&pa.ns, &pb.ns, pb.ip).unwrap();
}
