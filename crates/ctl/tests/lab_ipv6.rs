//! IPv6 and dual-stack labs (issue 22): `lab up --ip-family ipv6|dual` on three nodes, with the
//! real agents, the real CNI plugin and real packets. Each row of [`CASES`] builds a lab and
//! proves, in every family of the lab:
//!
//! - every pod has exactly one address of each of the lab's families, from the lab's pools;
//! - each node registered its underlay address of each family in its Node (`spec.addresses`,
//!   found by ternd itself: `tern_agent::host::node_addresses`);
//! - every pod reaches every other pod over TCP and UDP (pods on the same and on other nodes);
//! - every node reaches a pod on each node (TCP and UDP), from its own namespace;
//! - every pod reaches the outside (the underlay's gateway address, which has no route to the
//!   pods) over TCP and UDP, and the outside sees the pod's node's underlay address, not the
//!   pod's: natOutgoing masquerades the family.
//!
//! The table grows by rows: the VXLAN and cross-subnet rows run over the agent's
//! `vxlan-v6.tern` (IPv6 pools) beside `vxlan.tern` (IPv4 pools). The BGP rows (`--bgp`,
//! MP-BGP IPv6 unicast between the agents) also check the routes are BGP's (proto 85) and
//! `ternctl node status`'s tables; the dual-stack one adds a BIRD 2 peer over IPv6 (a BGPPeer
//! with an IPv6 `peerIP`).
//! The IPv4 row runs the same checks on an IPv4 lab, so the families are compared like for
//! like.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. Every lab has a
//! unique name and is torn down by a guard, also when an assertion fails.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use tern_lab::traffic::Proto;
use tern_lab::{Encap, IpFamily, StoreKind, mesh};

mod common;
use common::Lab;

/// Port of the pods' echo servers.
const PORT: u16 = 7;
/// Port of the outside's one-probe server.
const OUTSIDE_PORT: u16 = 8080;
/// Nodes of every lab.
const NODES: usize = 3;
/// Pods per node.
const PODS_PER_NODE: usize = 2;

/// One lab of the table.
struct Case {
    /// Lab name tag (at most 6 characters).
    tag: &'static str,
    family: IpFamily,
    encap: Encap,
    store: StoreKind,
    /// Agents run with `--bgp` (routes between nodes learned over BGP).
    bgp: bool,
}

const CASES: &[Case] = &[
    Case {
        tag: "v6dir",
        family: IpFamily::Ipv6,
        encap: Encap::None,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    Case {
        tag: "dsdir",
        family: IpFamily::Dual,
        encap: Encap::None,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    // The etcd of an IPv6-only lab has only an IPv6 address: etcd://[2001:db8::2]:2379.
    Case {
        tag: "v6etcd",
        family: IpFamily::Ipv6,
        encap: Encap::None,
        store: StoreKind::Etcd,
        bgp: false,
    },
    Case {
        tag: "v4dir",
        family: IpFamily::Ipv4,
        encap: Encap::None,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    // Over the agent's `vxlan-v6.tern`.
    Case {
        tag: "v6vx",
        family: IpFamily::Ipv6,
        encap: Encap::Vxlan,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    // Pods across the router go over `vxlan-v6.tern`, pods on one subnet directly.
    Case {
        tag: "v6cs",
        family: IpFamily::Ipv6,
        encap: Encap::Crosssubnet,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    // Both VXLAN devices: `vxlan.tern` for the IPv4 pool, `vxlan-v6.tern` for the IPv6 one.
    Case {
        tag: "dsvx",
        family: IpFamily::Dual,
        encap: Encap::Vxlan,
        store: StoreKind::Sqlite,
        bgp: false,
    },
    // MP-BGP IPv6 unicast between the agents, over IPv6 sessions.
    Case {
        tag: "v6bgp",
        family: IpFamily::Ipv6,
        encap: Encap::None,
        store: StoreKind::Sqlite,
        bgp: true,
    },
    // The mesh over IPv4 carries the IPv6 blocks too, with IPv6 next hops.
    Case {
        tag: "dsbgp",
        family: IpFamily::Dual,
        encap: Encap::None,
        store: StoreKind::Sqlite,
        bgp: true,
    },
];

fn case(tag: &str) -> &'static Case {
    CASES
        .iter()
        .find(|c| c.tag == tag)
        .unwrap_or_else(|| panic!("no case {tag}"))
}

use tern_lab::state::family_name as fam;

/// Builds the lab of `c`: `NODES` nodes, `PODS_PER_NODE` pods on each (`p<node>x<k>`), an
/// echo server (TCP and UDP) in every pod.
fn build(c: &Case) -> Lab {
    let dir = common::lab_ready();
    if c.store == StoreKind::Etcd {
        tern_testkit::need_binary(tern_lab::topology::ETCD_BIN);
    }
    let name = common::lab_name(c.tag);
    let mut o = tern_lab::UpOptions::new(&name, dir);
    o.nodes = NODES;
    o.encap = c.encap;
    o.store = c.store;
    o.ip_family = c.family;
    o.resync_seconds = Some(2);
    o.agent_timeout = Duration::from_secs(30);
    if c.bgp {
        o.agent_args.push("--bgp".into());
    }
    let mut lab = Lab::guard(&name);
    lab.st = tern_lab::up(&o)
        .unwrap_or_else(|e| panic!("lab up {name} ({} {}): {e}", c.family, c.encap));
    lab.add_echo_pods(NODES, PODS_PER_NODE, PORT);
    lab
}

fn context(lab: &Lab) -> String {
    format!("{}{}", lab.logs(15), mesh::all_routes(&lab.st))
}

/// The nodes start as stock hosts (forwarding off in both families); with an IPv6 pool each
/// agent turned IPv6 forwarding on and said so, as it does IPv4's.
fn check_forwarding(lab: &Lab) {
    for n in &lab.st.nodes {
        for v6 in lab.st.ip_family.families() {
            let (path, name) = if v6 {
                (
                    "/proc/sys/net/ipv6/conf/all/forwarding",
                    "net.ipv6.conf.all.forwarding",
                )
            } else {
                ("/proc/sys/net/ipv4/ip_forward", "net.ipv4.ip_forward")
            };
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &n.netns, "cat", path])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                "1",
                "{} {name}",
                n.name
            );
            let log = tern_lab::topology::log_tail(n, 400);
            assert!(
                log.contains(&format!("set {name} = 1 (was 0)")),
                "{}: {name} not set by the agent:\n{log}",
                n.name
            );
        }
    }
}

/// Every pod has one address of each family of the lab, in that family's pool, and none of
/// another family; its default route of each family goes to Calico's gateway
/// (169.254.1.1, fe80::ecee:eeff:feee:eeee).
fn check_pod_addresses(lab: &Lab) {
    let v4_pool: ipnet::IpNet = tern_model::defaults::IPV4_POOL.parse().unwrap();
    let v6_pool: ipnet::IpNet = tern_model::defaults::IPV6_POOL.parse().unwrap();
    for p in &lab.st.pods {
        let ips: Vec<IpAddr> = p.addresses.iter().map(|a| a.parse().unwrap()).collect();
        for v6 in [false, true] {
            let of: Vec<&IpAddr> = ips.iter().filter(|a| a.is_ipv6() == v6).collect();
            let want = usize::from(lab.st.ip_family.has(v6));
            assert_eq!(
                of.len(),
                want,
                "pod {} {} addresses: {ips:?}",
                p.name,
                fam(v6)
            );
            let pool = if v6 { &v6_pool } else { &v4_pool };
            assert!(
                of.iter().all(|a| pool.contains(*a)),
                "pod {}: {ips:?} not in {pool}",
                p.name
            );
            // Calico's gateways, answered by the host side (proxy ARP / proxy NDP): the
            // pod's default route of each of its families.
            let routes =
                tern_lab::process::ip_in(&p.netns, &[if v6 { "-6" } else { "-4" }, "route"])
                    .unwrap();
            let gw = if v6 {
                "fe80::ecee:eeff:feee:eeee"
            } else {
                "169.254.1.1"
            };
            assert_eq!(
                routes.contains(&format!("default via {gw} dev eth0")),
                lab.st.ip_family.has(v6),
                "pod {} {} routes:\n{routes}",
                p.name,
                fam(v6)
            );
        }
    }
}

/// Each node's Node resource lists its underlay address of every family of the lab (what
/// ternd found on its default-route interfaces), and no link-local address.
fn check_node_addresses(lab: &Lab) {
    let mut why = String::new();
    let done =
        tern_testkit::wait::poll(Duration::from_secs(15), Duration::from_millis(300), || {
            let nodes = match tern_lab::cluster::nodes(&lab.st) {
                Ok(n) => n,
                Err(e) => {
                    why = e.to_string();
                    return false;
                }
            };
            for n in &lab.st.nodes {
                let Some(tern_model::Resource::Node(r)) =
                    nodes.iter().find(|r| r.name() == n.name.as_str())
                else {
                    why = format!("no Node {}", n.name);
                    return false;
                };
                let got: Vec<String> = r
                    .spec
                    .addresses
                    .iter()
                    .map(|a| a.address.split('/').next().unwrap_or_default().to_string())
                    .collect();
                let want: Vec<String> = n.addresses().iter().map(|a| a.to_string()).collect();
                if got != want {
                    why = format!("Node {} spec.addresses {got:?}, want {want:?}", n.name);
                    return false;
                }
            }
            true
        });
    assert!(done, "{why}{}", context(lab));
}

/// Every pod reaches every other pod over TCP and UDP at its address of family `v6`; retried
/// for a while, since the last pods' routes may still be converging on the other nodes.
fn check_mesh(lab: &Lab, v6: bool) {
    let pods = lab.st.pods.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = mesh::check_mesh_family(
            &lab.st,
            PORT,
            &[Proto::Tcp, Proto::Udp],
            Duration::from_millis(1500),
            v6,
        )
        .unwrap();
        assert_eq!(r.results.len(), pods * (pods - 1) * 2, "{r}");
        if r.failures().is_empty() {
            break r;
        }
        if Instant::now() > deadline {
            panic!(
                "{}: {} of {} probes failed:\n{r}{}",
                fam(v6),
                r.failures().len(),
                r.results.len(),
                context(lab)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(r.results.iter().all(|x| x.target.is_ipv6() == v6), "{r}");
    eprintln!("{} mesh: {} probes ok", fam(v6), r.ok_count());
}

/// Every node reaches the first pod of every node (its own and the others') over TCP and UDP.
fn check_node_to_pod(lab: &Lab, v6: bool) {
    for n in &lab.st.nodes {
        for k in 1..=NODES {
            let pod = format!("p{k}x1");
            for proto in [Proto::Tcp, Proto::Udp] {
                let r = mesh::probe_from_node(
                    &lab.st,
                    &n.name,
                    &pod,
                    proto,
                    PORT,
                    v6,
                    Duration::from_secs(3),
                );
                if let Err(e) = r {
                    panic!(
                        "{} {} {} -> {pod}: {e}{}",
                        fam(v6),
                        proto.as_str(),
                        n.name,
                        context(lab)
                    );
                }
            }
        }
    }
}

/// A pod on every node reaches the outside over TCP and UDP; the outside sees the node's
/// underlay address of the family (natOutgoing), never the pod's.
fn check_outside(lab: &Lab, v6: bool) {
    let (_, outside) = mesh::outside(&lab.st, v6).unwrap();
    for n in &lab.st.nodes {
        let idx = n.name.trim_start_matches("node");
        let pod = format!("p{idx}x1");
        let pod_ip = mesh::pod_ip_of(lab.st.pod(&pod).unwrap(), v6).unwrap();
        let node_ip: IpAddr = n.address_of(v6).unwrap().parse().unwrap();
        for proto in [Proto::Tcp, Proto::Udp] {
            let seen = mesh::probe_outside(
                &lab.st,
                &pod,
                proto,
                OUTSIDE_PORT,
                v6,
                Duration::from_secs(3),
            )
            .unwrap_or_else(|e| {
                panic!(
                    "{} {} {pod} -> outside {outside}: {e}{}",
                    fam(v6),
                    proto.as_str(),
                    context(lab)
                )
            });
            assert_eq!(
                seen.source,
                node_ip,
                "{} {} from {pod} ({pod_ip}): the outside saw {}, not {}'s address",
                fam(v6),
                proto.as_str(),
                seen.source,
                n.name
            );
            assert_ne!(seen.source, pod_ip);
        }
    }
}

/// The whole row: build, then every check in every family of the lab.
fn run(c: &Case) -> Lab {
    let t = Instant::now();
    let lab = build(c);
    eprintln!(
        "lab {} ({} {} {}) up with {} pods after {:.1?}",
        lab.name,
        c.family,
        c.encap,
        c.store,
        lab.st.pods.len(),
        t.elapsed()
    );
    check_pod_addresses(&lab);
    check_node_addresses(&lab);
    check_forwarding(&lab);
    for v6 in c.family.families() {
        check_mesh(&lab, v6);
        check_node_to_pod(&lab, v6);
        check_outside(&lab, v6);
    }
    eprintln!(
        "lab {}: every check passed after {:.1?}",
        lab.name,
        t.elapsed()
    );
    lab
}

#[test]
fn ipv6_direct() {
    let lab = run(case("v6dir"));
    // Direct routing over the IPv6 underlay: node1 reaches the other nodes' IPv6 blocks
    // through their underlay addresses; no IPv4 pool exists, no pod has an IPv4 address.
    let routes = mesh::routes_of(&lab.st, "node1", true).unwrap();
    assert!(
        routes.contains("via 2001:db8::12 dev eth0")
            && routes.contains("via 2001:db8::13 dev eth0"),
        "{routes}"
    );
    assert_eq!(lab.st.pool_cidr, None);
    let pools = tern_lab::cluster::with_store(&lab.st, |s| {
        tern_model::list_resources(&*s, tern_model::Kind::IpPool)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap();
    let names: Vec<&str> = pools.iter().map(|p| p.name()).collect();
    assert_eq!(names, [tern_model::defaults::IPV6_POOL_NAME], "{pools:?}");
}

#[test]
fn dual_stack_direct() {
    let lab = run(case("dsdir"));
    let v4 = mesh::routes_of(&lab.st, "node1", false).unwrap();
    let v6 = mesh::routes_of(&lab.st, "node1", true).unwrap();
    assert!(v4.contains("via 198.18.0.12 dev eth0"), "{v4}");
    assert!(v6.contains("via 2001:db8::12 dev eth0"), "{v6}");
}

#[test]
fn ipv6_only_etcd() {
    let lab = run(case("v6etcd"));
    assert_eq!(lab.st.store_url(), "etcd://[2001:db8::2]:2379");
}

#[test]
fn ipv4_direct_same_checks() {
    run(case("v4dir"));
}

/// node1's tern routes (protocol 84) of family `v6` through `dev` onlink: one per remote
/// block the tunnel carries.
fn tunnel_routes(lab: &Lab, v6: bool, dev: &str) -> Vec<String> {
    mesh::routes_of(&lab.st, "node1", v6)
        .unwrap()
        .lines()
        .filter(|l| l.contains(&format!("dev {dev} proto 84")) && l.contains("onlink"))
        .map(str::to_string)
        .collect()
}

/// Every Node of the lab: its VXLAN tunnel address of each family and its pod MTU.
fn vxlan_registrations(lab: &Lab) -> Vec<(String, Option<String>, Option<String>, String)> {
    tern_lab::cluster::with_store(&lab.st, |s| {
        tern_model::list_resources(&*s, tern_model::Kind::Node)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap()
    .into_iter()
    .filter_map(|r| match r {
        tern_model::Resource::Node(n) => Some((
            n.metadata.name.clone(),
            n.spec.ipv4_vxlan_tunnel_addr.clone(),
            n.spec.ipv6_vxlan_tunnel_addr.clone(),
            n.metadata
                .annotations
                .get("tern.dev/pod-mtu")
                .cloned()
                .unwrap_or_default(),
        )),
        _ => None,
    })
    .collect()
}

/// IPv6 pool over VXLAN on an IPv6-only underlay: node1 routes the other two nodes' /122
/// blocks through `vxlan-v6.tern`; every node holds an IPv6 tunnel address from the pool and
/// no IPv4 one, and its pod MTU leaves 70 bytes for VXLAN over IPv6.
#[test]
fn ipv6_vxlan() {
    let lab = run(case("v6vx"));
    let via = tunnel_routes(&lab, true, "vxlan-v6.tern");
    assert_eq!(via.len(), NODES - 1, "{}", context(&lab));
    assert!(
        via.iter().all(|l| l.contains("/122 via fd00:10:244:")),
        "{via:?}"
    );
    let regs = vxlan_registrations(&lab);
    assert_eq!(regs.len(), NODES, "{regs:?}");
    for (node, v4, v6, mtu) in &regs {
        assert_eq!(v4, &None, "{node}");
        assert!(
            v6.as_deref().is_some_and(|a| a.starts_with("fd00:10:244:")),
            "{node}: {v6:?}"
        );
        assert_eq!(mtu, "1430", "{node}");
    }
}

/// Dual stack over VXLAN: each family's blocks through its own device, both tunnel
/// addresses registered, the pod MTU that of the larger (IPv6) overhead.
#[test]
fn dual_stack_vxlan() {
    let lab = run(case("dsvx"));
    let v4 = tunnel_routes(&lab, false, "vxlan.tern");
    let v6 = tunnel_routes(&lab, true, "vxlan-v6.tern");
    assert_eq!(
        (v4.len(), v6.len()),
        (NODES - 1, NODES - 1),
        "{}",
        context(&lab)
    );
    for (node, v4, v6, mtu) in vxlan_registrations(&lab) {
        assert!(v4.is_some() && v6.is_some(), "{node}: {v4:?} {v6:?}");
        assert_eq!(mtu, "1430", "{node}");
    }
}

/// CrossSubnet on the routed IPv6 underlay (odd nodes on 2001:db8:1::/64, even ones on
/// 2001:db8:2::/64): node1 reaches node3's block directly and node2's through
/// `vxlan-v6.tern`.
#[test]
fn ipv6_crosssubnet() {
    let lab = run(case("v6cs"));
    let via = tunnel_routes(&lab, true, "vxlan-v6.tern");
    assert_eq!(via.len(), 1, "{}", context(&lab));
    let routes = mesh::routes_of(&lab.st, "node1", true).unwrap();
    assert!(
        routes
            .lines()
            .any(|l| l.contains("/122 via 2001:db8:1::13 dev eth0") && l.contains("proto 84")),
        "{routes}"
    );
}

/// Asserts node1's routes of family `v6` to the other nodes' blocks are BGP's (proto 85) via
/// `peers`.
fn assert_bgp_routes(lab: &Lab, v6: bool, peers: &[&str]) {
    let routes = mesh::routes_of(&lab.st, "node1", v6).unwrap();
    for peer in peers {
        assert!(
            routes
                .lines()
                .any(|l| l.contains(&format!("via {peer} dev eth0")) && l.contains("proto 85")),
            "{routes}"
        );
    }
    // No reconciler route (proto 84) to another node's block: BGP routes them.
    assert!(
        !routes
            .lines()
            .any(|l| l.contains("proto 84") && peers.iter().any(|p| l.contains(p))),
        "{routes}"
    );
}

/// `ternctl node status` of `node`.
fn node_status(lab: &Lab, node: &str) -> String {
    let n = lab.st.node(node).unwrap();
    let out = std::process::Command::new(common::ternctl())
        .args(["node", "status", "--socket"])
        .arg(&n.socket)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The part of a node status report of one family's table.
fn status_table(status: &str, v6: bool) -> &str {
    let (_, v6_part) = status.split_once("IPv6 BGP status").unwrap_or((status, ""));
    if v6 {
        v6_part
    } else {
        status
            .split_once("IPv6 BGP status")
            .map_or(status, |(v4, _)| v4)
    }
}

#[test]
fn ipv6_bgp() {
    let lab = run(case("v6bgp"));
    // Learned over BGP (proto 85), next hop the peer's IPv6 address.
    assert_bgp_routes(&lab, true, &["2001:db8::12", "2001:db8::13"]);
    // The sessions run over IPv6: calicoctl's IPv6 table, the IPv4 one empty.
    let s = node_status(&lab, "node1");
    let v6 = status_table(&s, true);
    for peer in ["2001:db8::12", "2001:db8::13"] {
        assert!(
            v6.lines()
                .any(|l| l.contains(peer) && l.contains("node-to-node mesh") && l.contains("up")),
            "{s}"
        );
    }
    assert!(
        status_table(&s, false).contains("No IPv4 peers found."),
        "{s}"
    );
}

#[test]
fn dual_stack_bgp_with_a_bird_peer_over_ipv6() {
    tern_testkit::need_root();
    common::need_bird();
    let mut lab = run(case("dsbgp"));
    // One mesh session per pair, over IPv4, carrying both families: each with the node's
    // address of its family as next hop.
    assert_bgp_routes(&lab, false, &["198.18.0.12", "198.18.0.13"]);
    assert_bgp_routes(&lab, true, &["2001:db8::12", "2001:db8::13"]);
    // A BIRD 2 in AS 65001 at 2001:db8::250, peering over IPv6 with every node (a global
    // BGPPeer), originating a prefix its BGPPeer admits (outside every pool) and a default
    // route it does not.
    let bird_ip = "2001:db8::250";
    let mut conf = String::from(
        "log stderr all;\nrouter id 198.18.0.250;\nprotocol device { scan time 1; }\n\
         protocol static st { ipv6;\n  route 2001:db8:99::/64 blackhole;\n  \
         route ::/0 blackhole;\n}\n",
    );
    for (i, n) in lab.st.nodes.iter().enumerate() {
        let peer = n.address_of(true).unwrap();
        conf.push_str(&format!(
            "protocol bgp e{i} {{\n  local {bird_ip} as 65001;\n  neighbor {peer} as 64512;\n  \
             graceful restart;\n  connect retry time 1;\n  \
             ipv6 {{ import all; export all; }};\n}}\n"
        ));
    }
    let bird = tern_lab::bird::BirdPeer::start_with(&mut lab.st, "e6", &[bird_ip], &conf).unwrap();
    let peer = tern_model::BgpPeer::new(
        "tor6".to_string(),
        tern_model::BgpPeerSpec {
            peer_ip: Some(bird_ip.into()),
            as_number: Some(65001),
            accept_prefixes: vec![tern_model::AcceptPrefix {
                cidr: "2001:db8:99::/48".into(),
                max_length: Some(64),
            }],
            ..Default::default()
        },
    );
    tern_lab::cluster::with_store(&lab.st, move |s| {
        tern_model::put_resource(&*s, &tern_model::Resource::BgpPeer(peer))
            .map(drop)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap();
    // BIRD learns every node's IPv6 block, via that node's IPv6 address.
    let v6_blocks: Vec<(String, String)> = lab
        .st
        .nodes
        .iter()
        .flat_map(|n| {
            let via = n.address_of(true).unwrap().to_string();
            let holes =
                tern_lab::process::ip_in(&n.netns, &["-6", "route", "show", "type", "blackhole"])
                    .unwrap_or_default();
            holes
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
                .map(move |b| (b, via.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(v6_blocks.len() >= NODES, "{v6_blocks:?}");
    common::wait_until(
        "BIRD learns the nodes' IPv6 blocks",
        40,
        || bird.log(),
        || {
            let missing: Vec<String> = v6_blocks
                .iter()
                .filter(|(b, via)| {
                    let out = bird
                        .birdc(&format!("show route for {b}"))
                        .unwrap_or_default();
                    !(out.contains(b.as_str()) && out.contains(&format!("via {via}")))
                })
                .map(|(b, via)| format!("{b} via {via}"))
                .collect();
            (!missing.is_empty()).then(|| {
                format!(
                    "missing {missing:?}:\n{}",
                    bird.birdc("show route").unwrap_or_default()
                )
            })
        },
    );
    // The nodes learn BIRD's admitted prefix, never its default route.
    common::wait_until(
        "the nodes learn BIRD's prefix",
        40,
        || context(&lab),
        || {
            lab.st.nodes.iter().find_map(|n| {
                let r = mesh::routes_of(&lab.st, &n.name, true).unwrap_or_default();
                (!r.contains(&format!("2001:db8:99::/64 via {bird_ip} dev eth0 proto 85")))
                    .then(|| format!("{}: {r}", n.name))
            })
        },
    );
    let r = mesh::routes_of(&lab.st, "node1", true).unwrap();
    assert!(
        !r.lines()
            .any(|l| l.starts_with("default") && l.contains(bird_ip)),
        "{r}"
    );
    // Both of calicoctl's tables filled: the mesh over IPv4, BIRD over IPv6.
    common::wait_until(
        "node status shows the BIRD session up",
        30,
        || context(&lab),
        || {
            let s = node_status(&lab, "node1");
            let v6 = status_table(&s, true);
            let bird_up = v6
                .lines()
                .any(|l| l.contains(bird_ip) && l.contains("global") && l.contains("up"));
            let mesh = status_table(&s, false);
            let mesh_up = ["198.18.0.12", "198.18.0.13"].iter().all(|p| {
                mesh.lines()
                    .any(|l| l.contains(p) && l.contains("node-to-node mesh") && l.contains("up"))
            });
            (!(bird_up && mesh_up)).then_some(s)
        },
    );
    // Pods still reach each other in both families.
    for v6 in [false, true] {
        check_mesh(&lab, v6);
    }
    drop(bird);
}

/// The cross-subnet IPv6 underlay itself: node1 (2001:db8:1::11) reaches node2
/// (2001:db8:2::12) through the router, which forwards IPv6, over TCP and UDP, and node2 sees
/// node1's own address (routed, not translated). The agents' pods across the router need
/// VXLAN over IPv6 (the `v6cs` row).
#[test]
fn crosssubnet_ipv6_underlay_is_routed() {
    let dir = common::lab_ready();
    let name = common::lab_name("v6csu");
    let mut o = tern_lab::UpOptions::new(&name, dir);
    o.nodes = 2;
    o.encap = Encap::Crosssubnet;
    o.ip_family = IpFamily::Ipv6;
    let lab = Lab::up(&o);
    let (n1, n2) = (lab.st.node("node1").unwrap(), lab.st.node("node2").unwrap());
    assert_eq!(
        (n1.address.as_str(), n2.address.as_str()),
        ("2001:db8:1::11", "2001:db8:2::12")
    );
    let to = std::net::SocketAddr::new(n2.address.parse().unwrap(), OUTSIDE_PORT);
    for proto in [Proto::Tcp, Proto::Udp] {
        let timeout = Duration::from_secs(3);
        let witness = tern_lab::netns::in_netns(&n2.netns, || {
            tern_lab::traffic::Witness::bind(proto, to, timeout)
        })
        .unwrap()
        .unwrap();
        let seen = witness.answer_one();
        let ok =
            tern_lab::netns::in_netns(&n1.netns, || tern_lab::traffic::probe(proto, to, timeout))
                .unwrap();
        let source = seen.join().unwrap();
        ok.unwrap_or_else(|e| panic!("{} node1 -> node2: {e}{}", proto.as_str(), context(&lab)));
        assert_eq!(source.unwrap().to_string(), n1.address);
    }
}

/// `lab up` refuses what it cannot build, before building anything.
#[test]
fn bad_family_options_are_refused() {
    let dir = common::lab_ready();
    let name = common::lab_name("v6bad");
    let run = common::ternctl_lab(
        &name,
        dir,
        &[
            "up",
            "--ip-family",
            "ipv4",
            "--default-ipv6-pool",
            "fd00:1::/48",
        ],
    );
    assert!(!run.ok());
    assert!(
        run.stderr.contains("--ip-family ipv6 or dual"),
        "{}",
        run.stderr
    );
    // `lab up --kubernetes` builds dual-stack and IPv6-only clusters (lab_kube_dual.rs); the
    // demo's cluster is IPv4 and says where to go instead.
    let run = common::lab_demo(&name, dir, &["--ip-family", "ipv6", "--kubernetes"]);
    assert!(!run.ok());
    assert!(run.stderr.contains("IPv4 cluster"), "{}", run.stderr);
    let run = common::ternctl_lab(&name, dir, &["up", "--ip-family", "triple"]);
    assert!(!run.ok());
    common::assert_lab_gone(&name);
}

/// `ternctl lab demo --ip-family ipv6`: the README's demo over an IPv6 underlay passes, its
/// routes to the other node's block go via the node's IPv6 address, and every pod-to-pod probe
/// is IPv6; the lab is gone afterwards.
#[test]
fn demo_ipv6() {
    let dir = common::lab_ready();
    let name = common::lab_name("v6demo");
    let _guard = Lab::guard(&name);
    let run = common::lab_demo(
        &name,
        dir,
        &["--ip-family", "ipv6", "--nodes", "2", "--pods", "2"],
    );
    let out = &run.stdout;
    assert!(run.ok(), "{out}\n{}", run.stderr);
    assert!(out.contains("PASS: all "), "{out}");
    // Routed by BGP (the default without encapsulation): MP-BGP IPv6 unicast over the IPv6
    // session with node2.
    assert!(out.contains("via 2001:db8::12 dev eth0 proto 85"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("| 2001:db8::12 ") && l.contains("Established")),
        "{out}"
    );
    assert!(!out.contains("over IPv4"), "{out}");
    // The mesh (2 pairs, TCP and UDP) and node-to-pod (3 probes) lines, every one IPv6.
    let ok: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ok tcp ") || l.starts_with("ok udp "))
        .collect();
    assert!(ok.len() >= 7, "{out}");
    assert!(
        ok.iter().all(|l| l.contains("[fd00:10:244:")),
        "a probe not over IPv6 in an IPv6-only lab: {out}"
    );
    common::assert_lab_gone(&name);
}

/// A tern NetworkPolicy on pod b of namespace x: `rules` are its ingress rules.
fn icmp_policy(rules: &str) -> String {
    format!(
        "apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {{name: icmp-in, namespace: x}}\n\
         spec:\n  selector: pod == 'b'\n  types: [Ingress]\n  ingress:\n{rules}"
    )
}

/// Policy with ICMP types in both families, with real echoes across nodes in a dual-stack
/// lab: `icmp: {type: 128}` (ICMPv6 echo request) and `{type: 8, code: 0}` (ICMP) from pod a
/// let a's echoes into b and nobody else's; `notICMP: {type: 128}` then refuses a's ICMPv6
/// echo while the IPv4 one still passes.
#[test]
fn icmp_types_in_policy_across_nodes_in_both_families() {
    use tern_lab::netpol;
    use tern_lab::verdict::probe;
    use tern_model::Protocol;
    let dir = common::lab_ready();
    let mut o = tern_lab::UpOptions::new(&common::lab_name("v6icmp"), dir);
    o.nodes = 2;
    o.ip_family = IpFamily::Dual;
    let mut lab = Lab::up(&o);
    netpol::put_namespace(&lab.st, "x", &[("ns".to_string(), "x".to_string())].into()).unwrap();
    let mut pods = std::collections::BTreeMap::new();
    for (p, node) in [("a", "node1"), ("b", "node2"), ("c", "node1")] {
        let labels = [("pod".to_string(), p.to_string())].into();
        let pod = netpol::add_k8s_pod(&mut lab.st, node, "x", p, &labels)
            .unwrap_or_else(|e| panic!("add x/{p}: {e}{}", lab.logs(15)));
        let addrs: Vec<IpAddr> = lab
            .st
            .pod(&pod.lab_pod)
            .unwrap()
            .addresses
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        pods.insert(p, (pod.netns.clone(), addrs));
    }
    // The verdicts (a->b v6, a->b v4, c->b v6, c->b v4) of one ICMP echo each.
    let seen = || -> Vec<&'static str> {
        let b = &pods["b"].1;
        let mut out = Vec::new();
        for from in ["a", "c"] {
            for v6 in [true, false] {
                let dst = *b.iter().find(|a| a.is_ipv6() == v6).unwrap();
                let proto = if v6 { Protocol::IcmpV6 } else { Protocol::Icmp };
                let ns = pods[from].0.clone();
                out.push(
                    tern_lab::netns::in_netns(&ns, move || {
                        probe(
                            proto,
                            std::net::SocketAddr::new(dst, 0),
                            Duration::from_millis(700),
                        )
                        .verdict()
                    })
                    .unwrap(),
                );
            }
        }
        out
    };
    let expect = |what: &str, want: [&str; 4]| {
        common::wait_until(
            what,
            30,
            || lab.logs(15),
            || {
                let got = seen();
                (got != want).then(|| format!("a->b v6, v4, c->b v6, v4: {got:?}, want {want:?}"))
            },
        );
    };
    expect("no policy: every echo answered", ["allowed"; 4]);
    netpol::apply_yaml(
        &lab.st,
        &icmp_policy(
            "  - action: Allow\n    protocol: ICMPv6\n    icmp: {type: 128}\n    source: {selector: pod == 'a'}\n\
             \x20 - action: Allow\n    protocol: ICMP\n    icmp: {type: 8, code: 0}\n    source: {selector: pod == 'a'}\n",
        ),
    )
    .unwrap();
    expect(
        "icmp echo types from a only",
        ["allowed", "allowed", "denied", "denied"],
    );
    netpol::apply_yaml(
        &lab.st,
        &icmp_policy(
            "  - action: Allow\n    protocol: ICMPv6\n    notICMP: {type: 128}\n    source: {selector: pod == 'a'}\n\
             \x20 - action: Allow\n    protocol: ICMP\n    icmp: {type: 8}\n    source: {selector: pod == 'a'}\n",
        ),
    )
    .unwrap();
    expect(
        "notICMP refuses a's ICMPv6 echo",
        ["denied", "allowed", "denied", "denied"],
    );
}
