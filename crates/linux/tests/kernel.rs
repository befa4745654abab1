//! Real-kernel tests. Every test runs on its own thread inside a fresh network namespace that
//! plays the node ("host"); pod namespaces are named (`/run/netns/tern-test-*`, removed by a guard
//! even on panic) or anonymous. The machine's root namespace is never touched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ipnet::IpNet;
use tern_linux::netlink::{Handle, Link, MAIN_TABLE, RouteSpec, Scope};
use tern_linux::netns::{self, NetNs};
use tern_linux::veth::{self, POD_GATEWAY_V4, POD_GATEWAY_V6, PodInterfaceConfig};
use tern_linux::{HOST_VETH_MAC, LinuxError, TERN_ROUTE_PROTOCOL, host_veth_name, sysctl};

/// Runs `f` on a new thread that has unshared its network namespace.
fn in_private_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            netns::unshare_net().expect("unshare(CLONE_NEWNET)");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A named namespace deleted on drop, panics included.
struct NamedNs {
    name: String,
    path: PathBuf,
}

impl NamedNs {
    fn new(tag: &str) -> NamedNs {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "tern-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let path = netns::add_named(&name).expect("add named netns");
        NamedNs { name, path }
    }
    fn open(&self) -> NetNs {
        NetNs::open(&self.path).expect("open named netns")
    }
}

impl Drop for NamedNs {
    fn drop(&mut self) {
        let _ = netns::delete_named(&self.name);
    }
}

/// Creates a veth pair `a`-`b` in the current namespace and sets both ends up; returns the
/// two links as listed before they went up.
fn veth_pair_up(h: &mut Handle, a: &str, b: &str) -> (Link, Link) {
    let me = NetNs::current().unwrap();
    h.create_veth(a, b, me.as_fd(), 0).unwrap();
    let la = h.link_by_name(a).unwrap().unwrap();
    let lb = h.link_by_name(b).unwrap().unwrap();
    h.set_link_up(la.index).unwrap();
    h.set_link_up(lb.index).unwrap();
    (la, lb)
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ns_inode(ns: &NetNs) -> u64 {
    use std::os::fd::AsRawFd;
    // SAFETY: fstat on a valid fd into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the namespace's fd is open for the call and st is ours to write.
    assert_eq!(unsafe { libc::fstat(ns.as_fd().as_raw_fd(), &mut st) }, 0);
    st.st_ino
}

#[test]
fn open_missing_netns_path_is_not_found_and_names_the_path() {
    let e = NetNs::open(Path::new("/run/netns/tern-definitely-missing")).unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
    assert!(matches!(e, LinuxError::NetnsNotFound { .. }));
    assert!(
        e.to_string().contains("/run/netns/tern-definitely-missing"),
        "{e}"
    );
}

#[test]
fn open_rejects_a_file_that_is_not_a_netns() {
    let e = NetNs::open(Path::new("/proc/self/status")).unwrap_err();
    assert!(!e.is_not_found());
    assert!(e.to_string().contains("/proc/self/status"), "{e}");
}

#[test]
fn named_netns_lifecycle_and_run_enters_it() {
    let ns = NamedNs::new("life");
    assert!(ns.path.exists());
    let again = netns::add_named(&ns.name).unwrap_err();
    assert!(again.is_already_exists(), "{again}");
    let handle = ns.open();
    let here = NetNs::current().unwrap();
    assert_ne!(ns_inode(&handle), ns_inode(&here));
    // Inside, the thread's namespace is the named one, and only lo exists.
    let (inside, links) = handle
        .run(|| {
            let cur = NetNs::current().unwrap();
            (ns_inode(&cur), Handle::new().unwrap().links().unwrap())
        })
        .unwrap();
    assert_eq!(inside, ns_inode(&handle));
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].name, "lo");
    assert_eq!(links[0].index, 1);
    // The caller's thread did not move.
    assert_eq!(ns_inode(&NetNs::current().unwrap()), ns_inode(&here));
    netns::delete_named(&ns.name).unwrap();
    assert!(!ns.path.exists());
    netns::delete_named(&ns.name).unwrap();
    assert!(matches!(
        NetNs::open(&ns.path),
        Err(LinuxError::NetnsNotFound { .. })
    ));
}

#[test]
fn run_propagates_the_closure_result() {
    let ns = netns::new_anonymous().unwrap();
    let v = ns.run(|| 40 + 2).unwrap();
    assert_eq!(v, 42);
    assert!(ns.to_string().starts_with("fd "));
}

#[test]
fn veth_pair_across_namespaces_links_and_delete_idempotent() {
    in_private_netns(|| {
        let pod = netns::new_anonymous().unwrap();
        let mut h = Handle::new().unwrap();
        h.create_veth("tvh0", "tvp0", pod.as_fd(), 1400).unwrap();
        let host = h.link_by_name("tvh0").unwrap().expect("host end");
        assert_eq!(host.kind.as_deref(), Some("veth"));
        assert_eq!(host.mtu, 1400);
        assert!(!host.up);
        assert!(host.link_netnsid.is_some(), "peer lives in another netns");
        assert!(
            h.link_by_name("tvp0").unwrap().is_none(),
            "peer not created here"
        );
        let by_index = h.link_by_index(host.index).unwrap().unwrap();
        assert_eq!(by_index, host);
        let peer = pod
            .run(|| Handle::new().unwrap().link_by_name("tvp0").unwrap())
            .unwrap()
            .expect("peer in pod ns");
        assert_eq!(host.peer_index, Some(peer.index));
        assert_eq!(peer.mtu, 1400);

        h.set_mac(host.index, [0x02, 0, 0, 0, 0, 1]).unwrap();
        h.set_mtu(host.index, 1300).unwrap();
        h.set_link_up(host.index).unwrap();
        let l = h.link_by_index(host.index).unwrap().unwrap();
        assert_eq!(l.mac, Some([0x02, 0, 0, 0, 0, 1]));
        assert_eq!(l.mtu, 1300);
        assert!(l.up);

        let dup = h
            .create_veth("tvh0", "tvp9", pod.as_fd(), 1400)
            .unwrap_err();
        assert!(dup.is_already_exists(), "{dup}");
        assert!(dup.to_string().contains("tvh0"), "{dup}");

        assert!(h.delete_link("tvh0").unwrap());
        assert!(!h.delete_link("tvh0").unwrap());
        assert!(h.link_by_index(host.index).unwrap().is_none());
        // The peer went with it.
        let gone = pod
            .run(|| Handle::new().unwrap().link_by_name("tvp0").unwrap())
            .unwrap();
        assert!(gone.is_none());
    });
}

#[test]
fn invalid_interface_names_are_refused_before_the_kernel() {
    in_private_netns(|| {
        let mut h = Handle::new().unwrap();
        let e = h.link_by_name("this-name-is-way-too-long").unwrap_err();
        assert!(matches!(e, LinuxError::InvalidArgument(_)), "{e}");
        assert!(h.delete_link("a/b").is_err());
    });
}

#[test]
fn addresses_and_routes_round_trip() {
    in_private_netns(|| {
        let mut h = Handle::new().unwrap();
        let (a, b) = veth_pair_up(&mut h, "ra0", "rb0");
        h.add_address(a.index, net("198.18.5.1/24")).unwrap();
        h.add_address(a.index, net("198.18.5.1/24")).unwrap(); // EEXIST is success
        h.add_address(a.index, net("fd00:5::1/64")).unwrap();
        let addrs = h.addresses(Some(a.index)).unwrap();
        assert!(
            addrs.contains(&(a.index, net("198.18.5.1/24"))),
            "{addrs:?}"
        );
        assert!(addrs.contains(&(a.index, net("fd00:5::1/64"))), "{addrs:?}");
        assert!(
            h.addresses(Some(b.index))
                .unwrap()
                .iter()
                .all(|(_, n)| !n.addr().is_ipv4())
        );

        let via = RouteSpec {
            dst: net("10.9.0.0/16"),
            gateway: Some("198.18.5.254".parse().unwrap()),
            oif: Some(a.index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        };
        h.replace_route(&via).unwrap();
        h.replace_route(&via).unwrap(); // replace is idempotent
        let link = RouteSpec {
            dst: net("10.9.1.7/32"),
            gateway: None,
            oif: Some(b.index),
            scope: Scope::Link,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        };
        h.replace_route(&link).unwrap();
        let v6 = RouteSpec {
            dst: net("fd00:9::/64"),
            gateway: Some("fd00:5::fe".parse().unwrap()),
            oif: Some(a.index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        };
        h.replace_route(&v6).unwrap();
        let routes = h.routes(false).unwrap();
        assert!(routes.contains(&via), "{routes:?}");
        assert!(routes.contains(&link), "{routes:?}");
        let connected = routes
            .iter()
            .find(|r| r.dst == net("198.18.5.0/24"))
            .expect("kernel prefix route");
        assert_eq!(connected.scope, Scope::Link);
        assert_eq!(connected.protocol, 2, "proto kernel");
        let routes6 = h.routes(true).unwrap();
        assert!(routes6.contains(&v6), "{routes6:?}");

        // Replacing moves the route to the other link instead of adding a second one.
        let moved = RouteSpec {
            oif: Some(a.index),
            ..link.clone()
        };
        h.replace_route(&moved).unwrap();
        let routes = h.routes(false).unwrap();
        assert_eq!(routes.iter().filter(|r| r.dst == link.dst).count(), 1);
        assert!(routes.contains(&moved));

        assert!(h.delete_route(&moved).unwrap());
        assert!(!h.delete_route(&moved).unwrap());
        assert!(h.delete_route(&via).unwrap());
        assert!(h.delete_route(&v6).unwrap());
        assert!(!h.delete_route(&v6).unwrap());
        let bad = RouteSpec {
            gateway: Some("fd00::1".parse().unwrap()),
            ..via
        };
        assert!(matches!(
            h.replace_route(&bad),
            Err(LinuxError::InvalidArgument(_))
        ));
    });
}

#[test]
fn bridge_vxlan_neighbours_and_fdb() {
    in_private_netns(|| {
        let mut h = Handle::new().unwrap();
        let me = NetNs::current().unwrap();
        h.create_bridge("br-t").unwrap();
        h.create_veth("bp0", "bp1", me.as_fd(), 0).unwrap();
        let br = h.link_by_name("br-t").unwrap().unwrap();
        assert_eq!(br.kind.as_deref(), Some("bridge"));
        let port = h.link_by_name("bp0").unwrap().unwrap();
        h.set_master(port.index, br.index).unwrap();
        h.set_link_up(br.index).unwrap();
        h.add_address(br.index, net("198.18.0.1/24")).unwrap();

        h.create_vxlan(
            "vxlan.tern",
            4096,
            "198.18.0.1".parse().unwrap(),
            Some(br.index),
            4789,
        )
        .unwrap();
        let vx = h.link_by_name("vxlan.tern").unwrap().unwrap();
        assert_eq!(vx.kind.as_deref(), Some("vxlan"));
        h.set_link_up(vx.index).unwrap();
        h.add_address(vx.index, net("10.244.0.0/32")).unwrap();

        let vtep_ip: IpAddr = "10.244.1.0".parse().unwrap();
        let vtep_mac = [0x66, 0x55, 0x44, 0x33, 0x22, 0x11];
        let remote: IpAddr = "198.18.0.2".parse().unwrap();
        h.add_neighbour(vx.index, vtep_ip, vtep_mac).unwrap();
        h.add_neighbour(vx.index, vtep_ip, vtep_mac).unwrap(); // replace
        h.add_fdb(vx.index, vtep_mac, remote).unwrap();
        let neigh = h.neighbours(Some(vx.index)).unwrap();
        let n = neigh.iter().find(|n| n.ip == vtep_ip).expect("neighbour");
        assert_eq!(n.mac, Some(vtep_mac));
        assert_eq!(n.state, 0x80, "NUD_PERMANENT");
        let fdb = h.fdb(vx.index).unwrap();
        assert!(
            fdb.iter()
                .any(|f| f.mac == vtep_mac && f.dst == Some(remote)),
            "{fdb:?}"
        );
        // The block route through the tunnel, as Felix programs it (onlink not needed: the
        // neighbour is permanent and the gateway is covered by no route, so use a link route
        // to the VTEP first).
        h.replace_route(&RouteSpec {
            dst: net("10.244.1.0/32"),
            gateway: None,
            oif: Some(vx.index),
            scope: Scope::Link,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        })
        .unwrap();
        h.replace_route(&RouteSpec {
            dst: net("10.244.1.0/26"),
            gateway: Some(vtep_ip),
            oif: Some(vx.index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        })
        .unwrap();

        assert!(h.delete_fdb(vx.index, vtep_mac, remote).unwrap());
        assert!(!h.delete_fdb(vx.index, vtep_mac, remote).unwrap());
        assert!(h.delete_neighbour(vx.index, vtep_ip).unwrap());
        assert!(!h.delete_neighbour(vx.index, vtep_ip).unwrap());
        h.set_master(port.index, 0).unwrap();

        // Moving the other end of the veth into a node namespace, as the lab does.
        let node = netns::new_anonymous().unwrap();
        let p1 = h.link_by_name("bp1").unwrap().unwrap();
        h.set_netns(p1.index, node.as_fd()).unwrap();
        assert!(h.link_by_name("bp1").unwrap().is_none());
        let moved = node
            .run(|| Handle::new().unwrap().link_by_name("bp1").unwrap())
            .unwrap();
        assert_eq!(moved.map(|l| l.kind), Some(Some("veth".to_string())));
    });
}

/// `vxlan-v6.tern` beside `vxlan.tern`: the kernel takes a second device of the same VNI and
/// port when its local address is of the other family (and refuses one of the same family);
/// the seam lists its IPv6 local address, and programs its permanent NDP neighbour, its FDB
/// entry towards an IPv6 underlay address and an IPv6 block route `via <tunnel> onlink`.
#[test]
fn vxlan_v6_device_beside_the_v4_one_with_ndp_fdb_and_onlink_routes() {
    use tern_linux::netlink::{Route, RouteKind};
    in_private_netns(|| {
        let mut h = Handle::new().unwrap();
        let (u, _) = veth_pair_up(&mut h, "u0", "u1");
        h.add_address(u.index, net("198.18.0.1/24")).unwrap();
        h.add_address(u.index, net("2001:db8::11/64")).unwrap();
        let local4: IpAddr = "198.18.0.1".parse().unwrap();
        let local6: IpAddr = "2001:db8::11".parse().unwrap();
        h.create_vxlan("vxlan.tern", 4096, local4, None, 4789)
            .unwrap();
        h.create_vxlan("vxlan-v6.tern", 4096, local6, None, 4789)
            .unwrap();
        let e = h
            .create_vxlan("vxlan-v6.x", 4096, local6, None, 4789)
            .unwrap_err();
        assert!(e.is_already_exists(), "{e}");
        let devs = h.vxlan_devices().unwrap();
        let v6 = devs
            .iter()
            .find(|d| d.name == "vxlan-v6.tern")
            .expect("listed");
        assert_eq!(
            (v6.vni, v6.port, v6.local),
            (Some(4096), Some(4789), Some(local6))
        );
        // Both up: the kernel opens a UDP socket of each family on port 4789.
        for d in &devs {
            h.set_link_up(d.index).unwrap();
        }
        let idx = v6.index;
        h.add_address(idx, net("fd00:10:244::1/128")).unwrap();
        let tip: IpAddr = "fd00:10:244::41".parse().unwrap();
        let mac = [0x66, 0, 0, 0, 0, 6];
        let remote: IpAddr = "2001:db8::12".parse().unwrap();
        h.add_neighbour(idx, tip, mac).unwrap();
        h.add_neighbour(idx, tip, mac).unwrap(); // replace
        h.add_fdb(idx, mac, remote).unwrap();
        let n = h.neighbours(Some(idx)).unwrap();
        let n = n.iter().find(|n| n.ip == tip).expect("NDP neighbour");
        assert_eq!((n.mac, n.state), (Some(mac), 0x80), "NUD_PERMANENT");
        let fdb = h.fdb(idx).unwrap();
        assert!(
            fdb.iter().any(|f| f.mac == mac && f.dst == Some(remote)),
            "{fdb:?}"
        );
        let route = Route {
            dst: net("fd00:10:244::40/122"),
            kind: RouteKind::Unicast,
            gateway: Some(tip),
            oif: Some(idx),
            onlink: true,
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        };
        h.replace_route_full(&route).unwrap();
        let got = h.routes_full(true, MAIN_TABLE).unwrap();
        let r = got
            .iter()
            .find(|r| r.dst == route.dst)
            .expect("the v6 block route");
        assert_eq!(
            (r.gateway, r.oif, r.onlink, r.protocol),
            (Some(tip), Some(idx), true, TERN_ROUTE_PROTOCOL),
            "{r:?}"
        );
        assert!(h.delete_route_full(&route).unwrap());
        assert!(h.delete_fdb(idx, mac, remote).unwrap());
        assert!(!h.delete_fdb(idx, mac, remote).unwrap());
        assert!(h.delete_neighbour(idx, tip).unwrap());
        assert!(!h.delete_neighbour(idx, tip).unwrap());
    });
}

#[test]
fn sysctl_is_per_thread_namespace() {
    in_private_netns(|| {
        sysctl::set("net/ipv4/ip_forward", "1").unwrap();
        assert_eq!(sysctl::get("net/ipv4/ip_forward").unwrap(), "1");
        // A fresh namespace has forwarding off: the write above stayed in ours.
        let other = netns::new_anonymous().unwrap();
        let v = other
            .run(|| sysctl::get("net/ipv4/ip_forward").unwrap())
            .unwrap();
        assert_eq!(v, "0");
    });
}

fn pod_config<'a>(
    host: &'a str,
    pod_ns: &'a NetNs,
    addrs: &'a [IpNet],
    allow_fwd: bool,
) -> PodInterfaceConfig<'a> {
    PodInterfaceConfig {
        host_ifname: host,
        pod_ifname: "eth0",
        pod_ns,
        addresses: addrs,
        mtu: 1450,
        pod_mac: None,
        allow_ip_forwarding: allow_fwd,
    }
}

#[test]
fn pod_interface_setup_check_teardown_end_to_end() {
    in_private_netns(|| {
        let pod_named = NamedNs::new("e2e");
        let pod_ns = pod_named.open();
        let host_name = host_veth_name("tern", Some(("default", "nginx")), "cid");
        let addrs = [net("10.65.0.5/32"), net("fd00:65::5/128")];
        let pi =
            veth::setup_pod_interface(&pod_config(&host_name, &pod_ns, &addrs, false)).unwrap();
        assert_eq!(pi.host_ifname, "ternc440f455693");
        assert_eq!(pi.host_mac, HOST_VETH_MAC);
        assert_eq!(pi.pod_ifname, "eth0");
        assert_eq!(pi.mtu, 1450);

        let mut h = Handle::new().unwrap();
        let host = h.link_by_name(&host_name).unwrap().unwrap();
        assert!(host.up);
        assert_eq!(host.index, pi.host_ifindex);
        assert_eq!(host.mac, Some(HOST_VETH_MAC));
        assert_eq!(host.peer_index, Some(pi.pod_ifindex));
        for (key, want) in [
            (format!("net/ipv4/conf/{host_name}/proxy_arp"), "1"),
            (format!("net/ipv4/neigh/{host_name}/proxy_delay"), "0"),
            (format!("net/ipv4/conf/{host_name}/forwarding"), "1"),
            (format!("net/ipv6/conf/{host_name}/proxy_ndp"), "1"),
            (format!("net/ipv6/conf/{host_name}/forwarding"), "1"),
            (format!("net/ipv6/conf/{host_name}/accept_ra"), "0"),
        ] {
            assert_eq!(sysctl::get(&key).unwrap(), want, "{key}");
        }
        let r4 = h.routes(false).unwrap();
        assert!(
            r4.contains(&RouteSpec {
                dst: net("10.65.0.5/32"),
                gateway: None,
                oif: Some(host.index),
                scope: Scope::Link,
                protocol: TERN_ROUTE_PROTOCOL,
                table: MAIN_TABLE,
            }),
            "{r4:?}"
        );
        let r6 = h.routes(true).unwrap();
        assert!(
            r6.iter().any(|r| r.dst == net("fd00:65::5/128")
                && r.oif == Some(host.index)
                && r.protocol == TERN_ROUTE_PROTOCOL),
            "{r6:?}"
        );

        let pod_view = pod_ns
            .run(|| {
                let mut ph = Handle::new().unwrap();
                let eth0 = ph.link_by_name("eth0").unwrap().unwrap();
                let lo = ph.link_by_index(1).unwrap().unwrap();
                (
                    eth0,
                    lo.up,
                    ph.addresses(None).unwrap(),
                    ph.routes(false).unwrap(),
                    ph.routes(true).unwrap(),
                    sysctl::get("net/ipv4/ip_forward").unwrap(),
                )
            })
            .unwrap();
        let (eth0, lo_up, paddrs, proutes4, proutes6, fwd) = pod_view;
        assert_eq!(eth0.index, pi.pod_ifindex);
        assert_eq!(eth0.mac, Some(pi.pod_mac));
        assert!(eth0.up && lo_up);
        assert_eq!(eth0.mtu, 1450);
        assert!(
            paddrs.contains(&(eth0.index, net("10.65.0.5/32"))),
            "{paddrs:?}"
        );
        assert!(
            paddrs.contains(&(eth0.index, net("fd00:65::5/128"))),
            "{paddrs:?}"
        );
        assert!(
            proutes4.contains(&RouteSpec {
                dst: net("169.254.1.1/32"),
                gateway: None,
                oif: Some(eth0.index),
                scope: Scope::Link,
                protocol: TERN_ROUTE_PROTOCOL,
                table: MAIN_TABLE,
            }),
            "{proutes4:?}"
        );
        assert!(
            proutes4.contains(&RouteSpec {
                dst: net("0.0.0.0/0"),
                gateway: Some(IpAddr::V4(POD_GATEWAY_V4)),
                oif: Some(eth0.index),
                scope: Scope::Universe,
                protocol: TERN_ROUTE_PROTOCOL,
                table: MAIN_TABLE,
            }),
            "{proutes4:?}"
        );
        assert!(
            proutes6.iter().any(|r| r.dst == net("::/0")
                && r.gateway == Some(IpAddr::V6(POD_GATEWAY_V6))
                && r.oif == Some(eth0.index)),
            "{proutes6:?}"
        );
        assert_eq!(fwd, "0", "ip_forward stays off unless allowed");

        veth::check_pod_interface(&host_name, "eth0", &pod_ns, &addrs).unwrap();

        // CHECK names what is missing.
        pod_ns
            .run(|| {
                Handle::new()
                    .unwrap()
                    .delete_route(&RouteSpec {
                        dst: net("0.0.0.0/0"),
                        gateway: Some(IpAddr::V4(POD_GATEWAY_V4)),
                        oif: Some(eth0.index),
                        scope: Scope::Universe,
                        protocol: 0,
                        table: MAIN_TABLE,
                    })
                    .unwrap()
            })
            .unwrap();
        let e = veth::check_pod_interface(&host_name, "eth0", &pod_ns, &addrs).unwrap_err();
        assert!(
            e.to_string().contains("default route via 169.254.1.1"),
            "{e}"
        );
        let e = veth::check_pod_interface(&host_name, "eth0", &pod_ns, &[net("10.65.0.9/32")])
            .unwrap_err();
        assert!(e.to_string().contains("host route 10.65.0.9/32"), "{e}");

        veth::teardown_pod_interface(&host_name).unwrap();
        assert!(h.link_by_name(&host_name).unwrap().is_none());
        assert!(
            !h.routes(false)
                .unwrap()
                .iter()
                .any(|r| r.dst == net("10.65.0.5/32"))
        );
        assert!(
            !h.routes(true)
                .unwrap()
                .iter()
                .any(|r| r.dst == net("fd00:65::5/128"))
        );
        let pod_links = pod_ns
            .run(|| Handle::new().unwrap().links().unwrap())
            .unwrap();
        assert!(pod_links.iter().all(|l| l.name != "eth0"), "{pod_links:?}");
        // DEL is idempotent.
        veth::teardown_pod_interface(&host_name).unwrap();
        let e = veth::check_pod_interface(&host_name, "eth0", &pod_ns, &addrs).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("host veth {host_name} does not exist")),
            "{e}"
        );
    });
}

#[test]
fn pod_ip_forwarding_and_fixed_mac_are_applied() {
    in_private_netns(|| {
        let pod_ns = netns::new_anonymous().unwrap();
        let addrs = [net("10.65.0.6/32")];
        let mac = [0x0a, 0x58, 0x0a, 0x41, 0x00, 0x06];
        let mut cfg = pod_config("ternfwd", &pod_ns, &addrs, true);
        cfg.pod_mac = Some(mac);
        let pi = veth::setup_pod_interface(&cfg).unwrap();
        assert_eq!(pi.pod_mac, mac);
        let fwd = pod_ns
            .run(|| sysctl::get("net/ipv4/ip_forward").unwrap())
            .unwrap();
        assert_eq!(fwd, "1");
        veth::teardown_pod_interface("ternfwd").unwrap();
    });
}

#[test]
fn existing_pod_interface_is_a_clear_error_and_leaves_nothing_behind() {
    in_private_netns(|| {
        let pod_named = NamedNs::new("exists");
        let pod_ns = pod_named.open();
        pod_ns
            .run(|| Handle::new().unwrap().create_bridge("eth0").unwrap())
            .unwrap();
        let addrs = [net("10.65.0.7/32")];
        let e = veth::setup_pod_interface(&pod_config("ternexists", &pod_ns, &addrs, false))
            .unwrap_err();
        assert!(e.is_already_exists(), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "interface eth0 already exists in container namespace {}",
                pod_named.path.display()
            )
        );
        assert!(
            Handle::new()
                .unwrap()
                .link_by_name("ternexists")
                .unwrap()
                .is_none()
        );
    });
}

#[test]
fn stale_host_veth_is_replaced() {
    in_private_netns(|| {
        let me = NetNs::current().unwrap();
        let mut h = Handle::new().unwrap();
        h.create_veth("ternstale", "stalepeer", me.as_fd(), 0)
            .unwrap();
        let old = h.link_by_name("ternstale").unwrap().unwrap();
        let pod_ns = netns::new_anonymous().unwrap();
        let addrs = [net("10.65.0.8/32")];
        let pi =
            veth::setup_pod_interface(&pod_config("ternstale", &pod_ns, &addrs, false)).unwrap();
        assert_ne!(pi.host_ifindex, old.index);
        assert!(h.link_by_name("stalepeer").unwrap().is_none());
        veth::check_pod_interface("ternstale", "eth0", &pod_ns, &addrs).unwrap();
    });
}

#[test]
fn failure_inside_the_pod_rolls_back_the_host_veth() {
    in_private_netns(|| {
        let pod_ns = netns::new_anonymous().unwrap();
        // New interfaces in the pod get IPv6 disabled, so adding the v6 address fails after
        // the veth exists.
        pod_ns
            .run(|| sysctl::set("net/ipv6/conf/default/disable_ipv6", "1").unwrap())
            .unwrap();
        let addrs = [net("10.65.0.9/32"), net("fd00:65::9/128")];
        let e =
            veth::setup_pod_interface(&pod_config("ternfail", &pod_ns, &addrs, false)).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("fd00:65::9") && msg.contains("container namespace"),
            "{msg}"
        );
        let mut h = Handle::new().unwrap();
        assert!(h.link_by_name("ternfail").unwrap().is_none());
        assert!(
            !h.routes(false)
                .unwrap()
                .iter()
                .any(|r| r.dst == net("10.65.0.9/32"))
        );
        let pod_links = pod_ns
            .run(|| Handle::new().unwrap().links().unwrap())
            .unwrap();
        assert_eq!(pod_links.len(), 1, "{pod_links:?}");
    });
}

#[test]
fn pod_udp_packet_reaches_the_host_through_proxy_arp() {
    in_private_netns(|| {
        // The node: an uplink with an underlay address and a default route, which proxy-ARP
        // needs before it answers for 169.254.1.1.
        let mut h = Handle::new().unwrap();
        let (up0, _) = veth_pair_up(&mut h, "uplink0", "uplink1");
        h.set_link_up(1).unwrap();
        h.add_address(up0.index, net("198.18.0.1/24")).unwrap();
        h.replace_route(&RouteSpec {
            dst: net("0.0.0.0/0"),
            gateway: Some("198.18.0.254".parse().unwrap()),
            oif: Some(up0.index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        })
        .unwrap();
        let server = UdpSocket::bind("198.18.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let server_addr = server.local_addr().unwrap();

        let pod_ns = netns::new_anonymous().unwrap();
        let pod_ip = Ipv4Addr::new(10, 65, 0, 10);
        let addrs = [IpNet::new(IpAddr::V4(pod_ip), 32).unwrap()];
        veth::setup_pod_interface(&pod_config("ternudp", &pod_ns, &addrs, false)).unwrap();

        pod_ns
            .run(|| {
                let s = UdpSocket::bind(SocketAddr::new(IpAddr::V4(pod_ip), 0)).unwrap();
                s.send_to(b"hello from pod", server_addr).unwrap();
            })
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = server.recv_from(&mut buf).expect("packet from the pod");
        assert_eq!(&buf[..n], b"hello from pod");
        assert_eq!(from.ip(), IpAddr::V4(pod_ip));

        // The reply travels back through the /32 host route.
        let client = pod_ns
            .run(|| UdpSocket::bind(SocketAddr::new(IpAddr::V4(pod_ip), 0)).unwrap())
            .unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let client_addr = client.local_addr().unwrap();
        server.send_to(b"pong", client_addr).unwrap();
        let (n, from) = client.recv_from(&mut buf).expect("reply in the pod");
        assert_eq!(&buf[..n], b"pong");
        assert_eq!(from, server_addr);

        // The pod resolved its gateway to the host veth MAC via proxy-ARP.
        let neigh = pod_ns
            .run(|| Handle::new().unwrap().neighbours(None).unwrap())
            .unwrap();
        let gw = neigh
            .iter()
            .find(|n| n.ip == IpAddr::V4(POD_GATEWAY_V4))
            .expect("ARP entry for 169.254.1.1");
        assert_eq!(gw.mac, Some(HOST_VETH_MAC));
        let _ = Ipv6Addr::UNSPECIFIED;
    });
}
