//! Deleted Kubernetes nodes are garbage collected (issue 13, issue 12's "a node drained and
//! deleted: its blocks and routes go") against a real etcd and kube-apiserver: two agents'
//! Kubernetes sources (node1, node2) share one tern store, authenticated as the manifest's
//! ServiceAccount with the manifest's RBAC (so the Lease verbs there are proven). node3 and
//! node4 are Kubernetes Nodes with tern Nodes, blocks, affinities, addresses and (node3)
//! WorkloadEndpoints in the store.
//!
//! Shown: exactly one agent holds the Lease `kube-system/tern-node-gc`; node4 deleted and
//! re-created within the grace period keeps everything; node3 deleted is released no earlier
//! than the grace period: its endpoints, addresses, blocks, affinities and tern Node are gone,
//! the IPAM audit (`ternctl ipam check`) is clean, node1/node2/node4 untouched; the routes
//! every agent computes from the store no longer lead to node3; stopping the Lease holder lets
//! the other agent take the Lease over, and it collects node4 once deleted.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. The network namespace is uniquely named and removed on drop, every
//! process is killed by PID by the harness; the root namespace is never touched.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tern_agent::kube::{Kube, KubeSettings};
use tern_ipam::Ipam;
use tern_model::{Kind, Resource};
use tern_store::Store;
use tern_testkit::kube_api::{KubeApi, KubeNode};
use tern_testkit::netns::in_netns;
use tern_testkit::wait::wait_until;

const NODE_IP: &str = "198.18.0.40";
const GRACE: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(3);
/// A pod of `node` with an address from tern IPAM and its WorkloadEndpoint.
fn pod(store: &Arc<dyn Store>, ipam: &Ipam, node: &str, name: &str) -> IpAddr {
    let att = tern_api::Attachment {
        network: "k8s-pod-network".into(),
        container_id: format!("c-{name}"),
        ifname: "eth0".into(),
        netns_path: String::new(),
        pod: None,
    };
    let got = ipam
        .auto_assign(&tern_ipam::AssignArgs {
            num_v4: 1,
            handle: att.handle(),
            node: node.into(),
            attrs: tern_ipam::AllocationAttrs {
                namespace: "prod".into(),
                pod: name.into(),
                node: node.into(),
                container_id: att.container_id.clone(),
                ifname: "eth0".into(),
            },
            ..Default::default()
        })
        .unwrap();
    let addr = got[0];
    let mut w = tern_model::WorkloadEndpoint::new(
        format!("{node}-k8s-{name}-eth0"),
        tern_model::WorkloadEndpointSpec {
            node: node.into(),
            orchestrator: "k8s".into(),
            pod: name.into(),
            container_id: att.container_id.clone(),
            endpoint: "eth0".into(),
            interface_name: format!("tern{name}"),
            mac: String::new(),
            ip_networks: vec![format!("{addr}/32")],
            network: "k8s-pod-network".into(),
            profiles: vec![],
            service_account_name: None,
            ports: vec![],
        },
    );
    w.metadata.namespace = Some("prod".into());
    tern_model::put_resource(&**store, &Resource::WorkloadEndpoint(w)).unwrap();
    addr
}

fn tern_node(store: &Arc<dyn Store>, node: &str) -> bool {
    tern_model::get_resource(&**store, Kind::Node, None, node)
        .unwrap()
        .is_some()
}

/// What the store holds of `node`: affinities, allocations made by it, endpoints, tern Node.
fn holdings(store: &Arc<dyn Store>, node: &str) -> (usize, usize, usize, bool) {
    let ipam = Ipam::new(store.clone());
    let aff = ipam.affinities(Some(node)).unwrap().len();
    let allocs = ipam
        .allocations(None)
        .unwrap()
        .iter()
        .filter(|a| a.attrs.node == node)
        .count();
    let eps = tern_ipam::audit::list_endpoints(&**store)
        .unwrap()
        .iter()
        .filter(|e| e.node == node)
        .count();
    (aff, allocs, eps, tern_node(store, node))
}

fn audit_clean(store: &Arc<dyn Store>) {
    let r = tern_ipam::audit::check(&**store, &Ipam::new(store.clone())).unwrap();
    assert_eq!(r.problems(), 0, "{}", tern_ipam::audit::summary(&r));
}

/// Nodes the store's blocks route to (what every agent's dataplane computes routes from).
fn routed_nodes(store: &Arc<dyn Store>) -> Vec<String> {
    let mut v: Vec<String> = Ipam::new(store.clone())
        .blocks()
        .unwrap()
        .iter()
        .filter_map(|b| b.affine_node().map(str::to_string))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn lease_holder(api: &KubeApi) -> String {
    api.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "tern-node-gc",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
    .unwrap_or_default()
}

#[test]
fn deleted_nodes_are_released_by_one_elected_agent() {
    tern_testkit::kube_api::need_k8s();
    let _ = env_logger::builder().is_test(true).try_init();
    let k = KubeNode::start(NODE_IP);
    let (api, tmp, n) = (&k.api, &k.tmp, &k.netns.name);
    api.apply(&tern_testkit::kube_api::manifest_rbac());
    let node_yaml =
        |name: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n");
    for name in ["node1", "node2", "node3", "node4"] {
        api.apply(&node_yaml(name));
    }
    let kubeconfig = api.kubeconfig("tern-node", tern_testkit::kube_api::SA_USER, &[]);

    let url = format!("sqlite://{}", tmp.path().join("store.db").display());
    let store = tern_store::open(&url).unwrap();
    let ipam = Ipam::new(store.clone());
    ipam.ensure_default_pool("10.244.0.0/16").unwrap();
    let mut addrs: BTreeMap<&str, Vec<IpAddr>> = BTreeMap::new();
    for (node, pods) in [
        ("node1", vec!["a1"]),
        ("node2", vec!["b1"]),
        ("node3", vec!["c1", "c2"]),
        ("node4", vec!["d1"]),
    ] {
        let node_res = tern_model::Node::new(node, tern_model::NodeSpec::default());
        tern_model::put_resource(&*store, &node_res.into()).unwrap();
        for p in pods {
            addrs
                .entry(node)
                .or_default()
                .push(pod(&store, &ipam, node, p));
        }
    }
    audit_clean(&store);
    assert_eq!(holdings(&store, "node3"), (1, 2, 2, true));
    let before: BTreeMap<&str, _> = ["node1", "node2", "node4"]
        .into_iter()
        .map(|n| (n, holdings(&store, n)))
        .collect();

    let start = |node: &str| {
        let settings = KubeSettings {
            node_name: node.into(),
            kubeconfig: Some(kubeconfig.clone()),
            state_dir: tmp.path().join(node),
            node_gc_grace: GRACE,
            lease_duration: LEASE,
        };
        let kube = Kube::new(settings, store.clone(), None).unwrap();
        let ns_path = format!("/run/netns/{n}");
        // The `kubernetes` thread is created inside the namespace and stays there.
        in_netns(&ns_path, move || {
            kube.spawn().unwrap();
            kube
        })
    };
    let agents = [start("node1"), start("node2")];
    let leaders = |a: &[Kube]| a.iter().filter(|k| k.node_gc_leader()).count();
    assert!(
        wait_until(Duration::from_secs(30), || leaders(&agents) == 1
            && agents.iter().all(|k| k.nodes().1)),
        "no agent took the Lease (leaders: {}); apiserver lease: {:?}",
        leaders(&agents),
        api.kubectl(&["get", "lease", "-n", "kube-system", "-o", "yaml"])
    );
    let leader = if agents[0].node_gc_leader() { 0 } else { 1 };
    let leader_name = ["node1", "node2"][leader];
    assert_eq!(lease_holder(api), leader_name);
    // Stays one for a few renewals.
    for _ in 0..20 {
        assert_eq!(leaders(&agents), 1, "two agents lead at once");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(lease_holder(api), leader_name);

    // node4 deleted and back within the grace period keeps everything.
    api.must(&["delete", "node", "node4"]);
    assert!(wait_until(Duration::from_secs(10), || agents
        .iter()
        .all(|k| k.node("node4").is_none())));
    std::thread::sleep(LEASE); // the agents see it missing
    api.apply(&node_yaml("node4"));
    // node3 deleted for good.
    api.must(&["delete", "node", "node3"]);
    let deleted = Instant::now();
    assert!(
        wait_until(GRACE * 4, || !tern_node(&store, "node3")),
        "node3's tern Node still there {:?} after its deletion",
        GRACE * 4
    );
    let took = deleted.elapsed();
    assert!(
        took >= GRACE,
        "released after {took:?}, before the grace period {GRACE:?}"
    );
    eprintln!("node3 released {took:?} after its deletion (grace {GRACE:?})");
    assert_eq!(holdings(&store, "node3"), (0, 0, 0, false));
    let held: BTreeSet<IpAddr> = ipam
        .allocations(None)
        .unwrap()
        .into_iter()
        .map(|a| a.ip)
        .collect();
    for a in &addrs["node3"] {
        assert!(!held.contains(a), "{a} of node3 still allocated");
    }
    assert!(
        !routed_nodes(&store).iter().any(|n| n == "node3"),
        "a block of node3 remains"
    );
    assert_eq!(routed_nodes(&store), ["node1", "node2", "node4"]);
    audit_clean(&store);
    // node4 (re-created in time), node1 and node2 untouched, past node4's grace too.
    std::thread::sleep(GRACE);
    for (n, h) in &before {
        assert_eq!(&holdings(&store, n), h, "{n} changed");
    }
    assert_eq!(leaders(&agents), 1);

    // The holder stops (as if killed: it never gives the Lease back); the other takes over.
    agents[leader].stop();
    let other = 1 - leader;
    let other_name = ["node1", "node2"][other];
    let stopped = Instant::now();
    assert!(
        wait_until(LEASE * 5, || agents[other].node_gc_leader()
            && lease_holder(api) == other_name),
        "{other_name} did not take the Lease over from {leader_name} (holder {:?})",
        lease_holder(api)
    );
    eprintln!(
        "{other_name} took the Lease over {:?} after {leader_name} stopped",
        stopped.elapsed()
    );
    api.must(&["delete", "node", "node4"]);
    assert!(
        wait_until(GRACE * 4, || !tern_node(&store, "node4")),
        "the new leader did not collect node4"
    );
    assert_eq!(holdings(&store, "node4"), (0, 0, 0, false));
    for n in ["node1", "node2"] {
        assert_eq!(&holdings(&store, n), &before[n], "{n} changed");
        assert!(tern_node(&store, n));
    }
    assert_eq!(routed_nodes(&store), ["node1", "node2"]);
    audit_clean(&store);
    agents[other].stop();
}
