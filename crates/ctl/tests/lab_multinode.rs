//! Labs across nodes (issue 4): nodes are namespaces on an underlay bridge in its own
//! namespace, each running `ternd`; pods are added with the real CNI plugin and real TCP/UDP
//! packets decide. Per encapsulation mode (direct, VXLAN, cross-subnet; IPIP where the kernel
//! has it) on SQLite, and VXLAN on etcd: every pod reaches every other pod. Then: a killed and
//! restarted agent leaves running pods connected (longest gap of a continuous probe) and repairs
//! a route deleted behind its back; a departed node's routes disappear everywhere; a joining
//! node is reachable without restarting anyone.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. Every lab has a
//! unique name and is torn down by a guard, also when an assertion fails.

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use tern_lab::traffic::Proto;
use tern_lab::{Encap, StoreKind, mesh};

const PORT: u16 = 7;

mod common;
use common::{Lab, ternctl};

/// Builds a lab of `nodes` nodes with `pods_per_node` pods each (`p<node>x<k>`) and an echo
/// server (TCP and UDP) in every pod.
fn build(tag: &str, encap: Encap, store: StoreKind, nodes: usize, pods_per_node: usize) -> Lab {
    let dir = common::fresh_binaries();
    let name = common::lab_name(tag);
    let mut o = tern_lab::UpOptions::new(&name, dir);
    o.nodes = nodes;
    o.encap = encap;
    o.store = store;
    // Short resyncs so that repairs are observed quickly.
    o.resync_seconds = Some(2);
    o.agent_timeout = Duration::from_secs(30);
    let mut lab = Lab::guard(&name);
    lab.st = tern_lab::up(&o).unwrap_or_else(|e| panic!("lab up {name} ({encap}, {store}): {e}"));
    lab.add_echo_pods(nodes, pods_per_node, PORT);
    lab
}

fn target(lab: &Lab, pod: &str) -> SocketAddr {
    SocketAddr::new(mesh::pod_ip(&lab.st, pod).unwrap(), PORT)
}

/// Every pod reaches every other pod over TCP and UDP; retried for a few seconds, since the
/// last pods' routes may still be converging on the other nodes.
fn assert_full_mesh(lab: &Lab) {
    let pods = lab.st.pods.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = lab.probe_mesh(PORT);
        assert_eq!(r.results.len(), pods * (pods - 1) * 2);
        if r.failures().is_empty() {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "{} of {} probes failed:\n{r}{}",
                r.failures().len(),
                r.results.len(),
                lab.logs_and_routes(15)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn mesh_test(tag: &str, encap: Encap, store: StoreKind) -> Lab {
    let lab = build(tag, encap, store, 3, 2);
    assert_full_mesh(&lab);
    lab
}

#[test]
fn mesh_direct_sqlite() {
    tern_testkit::need_root();
    let lab = mesh_test("md", Encap::None, StoreKind::Sqlite);
    // Direct routing: node1 reaches the other nodes' blocks through their underlay addresses.
    let routes = mesh::routes(&lab.st, "node1").unwrap();
    assert!(
        routes.contains("via 198.18.0.12 dev eth0") && routes.contains("via 198.18.0.13 dev eth0"),
        "{routes}"
    );
    assert!(!routes.contains("vxlan"), "{routes}");
}

#[test]
fn mesh_vxlan_sqlite() {
    tern_testkit::need_root();
    let lab = mesh_test("mv", Encap::Vxlan, StoreKind::Sqlite);
    let routes = mesh::routes(&lab.st, "node1").unwrap();
    assert_eq!(
        routes.matches("dev vxlan.tern").count(),
        2,
        "one VXLAN route per remote node's block:\n{routes}"
    );
}

#[test]
fn mesh_crosssubnet_sqlite() {
    tern_testkit::need_root();
    let lab = mesh_test("mc", Encap::Crosssubnet, StoreKind::Sqlite);
    // node1 and node3 share 198.18.1.0/24: direct; node2 is behind the router: VXLAN.
    assert_eq!(lab.st.node("node1").unwrap().address, "198.18.1.11");
    assert_eq!(lab.st.node("node2").unwrap().address, "198.18.2.12");
    let routes = mesh::routes(&lab.st, "node1").unwrap();
    assert!(routes.contains("via 198.18.1.13 dev eth0"), "{routes}");
    assert_eq!(routes.matches("dev vxlan.tern").count(), 1, "{routes}");
}

#[test]
fn mesh_vxlan_etcd() {
    tern_testkit::need_root();
    tern_testkit::need_binary(tern_lab::topology::ETCD_BIN);
    let lab = mesh_test("me", Encap::Vxlan, StoreKind::Etcd);
    assert!(lab.st.store_url().starts_with("etcd://198.18.0.2:"));
    // The nodes registered themselves in etcd, with their VXLAN endpoints.
    let nodes = tern_lab::cluster::nodes(&lab.st).unwrap();
    assert_eq!(nodes.len(), 3);
}

#[test]
fn mesh_ipip_sqlite() {
    tern_testkit::need_root();
    if !tern_lab::topology::kernel_supports("ipip").unwrap() {
        tern_testkit::skip_kernel_limit!(
            "ipip",
            "this kernel cannot create ipip devices (`ip link add type ipip` fails: \
             no ipip support built in or loadable)",
        );
    }
    mesh_test("mi", Encap::Ipip, StoreKind::Sqlite);
}

#[test]
fn agent_restart_keeps_pods_connected_and_repairs_routes() {
    tern_testkit::need_root();
    let mut lab = build("ar", Encap::Vxlan, StoreKind::Sqlite, 2, 1);
    assert_full_mesh(&lab);
    let to = target(&lab, "p2x1");

    // A continuous probe from node1's pod to node2's pod while node1's agent is killed and
    // restarted: routes stay in the kernel, so the pods keep talking.
    let st = lab.st.clone();
    let probe = std::thread::spawn(move || {
        mesh::probe_continuous_from(
            &st,
            "p1x1",
            Proto::Udp,
            to,
            Duration::from_millis(10),
            Duration::from_secs(5),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    tern_lab::kill_agent(&mut lab.st, "node1").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    tern_lab::start_agent(&mut lab.st, "node1", true).unwrap();
    tern_lab::topology::wait_for_agent(lab.st.node("node1").unwrap(), Duration::from_secs(30))
        .unwrap();
    let report = probe.join().unwrap().unwrap();
    println!("{report}");
    assert!(report.received > 0, "{report}");
    assert!(
        report.longest_gap < Duration::from_secs(1),
        "pods lost connectivity during the agent restart: {report}"
    );

    // A route deleted behind the agent's back comes back.
    let block = remote_blocks(&lab, "node1");
    assert_eq!(block.len(), 1, "node1 routes to node2's block only");
    let n1 = lab.st.node("node1").unwrap().netns.clone();
    let out = Command::new("ip")
        .args(["-n", &n1, "route", "del", &block[0]])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(remote_blocks(&lab, "node1").is_empty());
    let deadline = Instant::now() + Duration::from_secs(15);
    while remote_blocks(&lab, "node1").is_empty() {
        assert!(
            Instant::now() < deadline,
            "route to {} not repaired within 15 s{}",
            block[0],
            lab.logs_and_routes(15)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(remote_blocks(&lab, "node1"), block);
    assert_full_mesh(&lab);
}

/// Destinations of `node`'s routes toward other nodes' pod blocks.
fn remote_blocks(lab: &Lab, node: &str) -> Vec<String> {
    mesh::remote_pod_routes(&lab.st, node)
        .unwrap()
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The block a node keeps for itself (its `blackhole` route).
fn own_blocks(lab: &Lab, node: &str) -> Vec<String> {
    mesh::routes(&lab.st, node)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("blackhole "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn node_leaves_and_joins_live() {
    tern_testkit::need_root();
    let mut lab = build("nj", Encap::Vxlan, StoreKind::Sqlite, 3, 1);
    assert_full_mesh(&lab);
    let pids: Vec<Option<u32>> = lab.st.nodes.iter().map(|n| n.ternd_pid).collect();

    // node3 leaves: its block routes disappear from node1 and node2.
    let gone = own_blocks(&lab, "node3");
    assert!(!gone.is_empty());
    for n in ["node1", "node2"] {
        assert!(remote_blocks(&lab, n).contains(&gone[0]));
    }
    let done = tern_lab::node_del(&mut lab.st, "node3").unwrap();
    assert!(
        done.iter()
            .any(|l| l.contains("removed node3 from the datastore"))
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    for n in ["node1", "node2"] {
        while remote_blocks(&lab, n).iter().any(|b| gone.contains(b)) {
            assert!(
                Instant::now() < deadline,
                "{n} still routes to departed node3's {gone:?}{}",
                lab.logs_and_routes(15)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(
        tern_lab::cluster::nodes(&lab.st)
            .unwrap()
            .iter()
            .all(|n| n.name() != "node3")
    );

    // node4 joins and is reachable from the existing pods without restarting anything.
    let n4 = tern_lab::node_add(&mut lab.st, Duration::from_secs(30)).unwrap();
    assert_eq!(n4.name, "node4");
    assert_eq!(n4.address, "198.18.0.14");
    tern_lab::add_pod(&mut lab.st, "node4", "p4x1").unwrap();
    tern_lab::start_server(&mut lab.st, "p4x1", &ternctl(), Some(PORT), Some(PORT)).unwrap();
    assert_full_mesh(&lab);
    let now: Vec<Option<u32>> = lab.st.nodes[..2].iter().map(|n| n.ternd_pid).collect();
    assert_eq!(now, pids[..2], "node1 and node2 kept their agents");
}
