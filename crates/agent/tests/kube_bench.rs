//! Benchmark (issue 13): ternd's memory and policy propagation with the Kubernetes watch on,
//! against a real etcd + kube-apiserver (no kubelet) in a node namespace.
//!
//! Prints ternd's RSS idle, with 110 pods on its node, and with 1,000 pods in the cluster (the
//! others bound to fake Node objects: plain API objects), 200 namespaces and 500
//! NetworkPolicies; then the time from `kubectl apply` of a NetworkPolicy to its chain in the
//! node's `inet tern` table, and from `kubectl label pod` (peer membership) to the change of
//! the rules, p50/p99 of 20 samples each. Figures only; it asserts that the rules appear.
//!
//! `ipam_add_del_latency_per_datastore` (issue 19): p50/p99 of an IPAM ADD and DEL on SQLite,
//! etcd and the Kubernetes API in one run, with one node and with 1,000 nodes' blocks.
//!
//! Remote pods need no `status.podIP`: ternd watches only its own node's pods
//! (`spec.nodeName`); remote peers come from other nodes' WorkloadEndpoints in the store.
//!
//! `TERN_K8S_BIN=/var/cache/tern/k8s/v1.34.4/bin cargo test -p tern-agent --test kube_bench --
//! --ignored --nocapture`

mod common;
mod kube_api;

use common::pctl;
use kube_api::{AGENT_RBAC, KubeNode};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

const NODE: &str = "bench-node";
const NODE_IP: &str = "198.18.0.20";
const LOCAL_PODS: usize = 110;
const CLUSTER_PODS: usize = 1000;
const NAMESPACES: usize = 200;
const POLICIES: usize = 500;
const FAKE_NODES: usize = 9;
const SAMPLES: usize = 20;

/// Polls `cond` every ~5 ms for up to 10 s; the instant it first held.
fn poll_until(mut cond: impl FnMut() -> bool) -> Option<Instant> {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if cond() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

fn docs(objs: &[serde_json::Value]) -> String {
    objs.iter()
        .map(|o| o.to_string())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn pod(ns: &str, name: &str, node: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "pause"}]}
    })
}

fn print_samples(what: &str, total: Vec<Duration>, kubectl: Vec<Duration>) {
    let (p50, p99, max) = pctl(total);
    let (k50, k99, _) = pctl(kubectl);
    eprintln!(
        "{what}: p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms ({SAMPLES} samples; the \
         kubectl process itself: p50 {k50:.1} ms, p99 {k99:.1} ms)"
    );
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn kube_watch_memory_and_propagation() {
    assert!(
        kube_api::require_k8s(),
        "root and the Kubernetes binaries are needed"
    );
    let bench_start = Instant::now();
    let plugin = common::tern_plugin();
    let k = KubeNode::start(NODE_IP);
    k.netns
        .ip(&["route", "add", "default", "via", "198.18.0.1"]);
    let mut ternd = k.ternd(NODE, &[]);
    // Info, not the harness's debug logging: a benchmark measures ternd, not its log volume.
    for a in ternd.args.iter_mut() {
        if a.starts_with("--log-level=") {
            *a = "--log-level=info".into();
        }
    }
    let api = &k.api;
    api.apply(AGENT_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\n---\napiVersion: v1\nkind: \
         Namespace\nmetadata: {{name: prod}}\n---\napiVersion: v1\nkind: \
         ServiceAccount\nmetadata: {{name: default, namespace: prod}}\n"
    ));
    api.apply(&docs(&[
        pod("prod", "web", NODE, json!({"app": "web"})),
        pod("prod", "client", NODE, json!({})),
    ]));
    ternd.start();
    ternd.wait_ready(Duration::from_secs(60));

    // Two wired pods: web (selected by the policies) and client (the peer relabelled).
    let pods = ternd.add_api_pods(api, &plugin, "prod", &["web", "client"]);
    std::thread::sleep(Duration::from_secs(3));
    let rss_idle = ternd.rss_kib();
    eprintln!("ternd RSS idle, Kubernetes watch on (2 pods): {rss_idle} KiB");

    // 110 pods on the node (API objects; the two above are wired).
    let local: Vec<_> = (2..LOCAL_PODS)
        .map(|i| {
            pod(
                "prod",
                &format!("local-{i}"),
                NODE,
                json!({"app": "filler"}),
            )
        })
        .collect();
    let t0 = Instant::now();
    api.create_parallel(&local, 2);
    eprintln!("created {} local pods in {:?}", local.len(), t0.elapsed());
    std::thread::sleep(Duration::from_secs(5));
    let rss_local = ternd.rss_kib();
    eprintln!("ternd RSS with {LOCAL_PODS} pods on its node: {rss_local} KiB");

    // The cluster: fake nodes, 200 namespaces, 1,000 pods, 500 NetworkPolicies.
    let mut base: Vec<_> = (0..FAKE_NODES)
        .map(|i| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("fake-{i}")}}))
        .collect();
    base.extend((0..NAMESPACES).map(|i| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": format!("bench-{i}"), "labels": {"team": format!("t{}", i % 10)}}})
    }));
    let remote: Vec<_> = (0..CLUSTER_PODS - LOCAL_PODS)
        .map(|i| {
            pod(
                &format!("bench-{}", i % NAMESPACES),
                &format!("remote-{i}"),
                &format!("fake-{}", i % FAKE_NODES),
                json!({"app": format!("a{}", i % 5), "tier": "x"}),
            )
        })
        .collect();
    let policies: Vec<_> = (0..POLICIES)
        .map(|i| {
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": format!("np-{i}"), "namespace": format!("bench-{}", i % NAMESPACES)},
                   "spec": {"podSelector": {"matchLabels": {"app": format!("a{}", i % 5)}},
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "x"}}},
                                                  {"namespaceSelector": {"matchLabels": {"team": "t1"}}}],
                                         "ports": [{"port": 8080 + (i % 7), "protocol": "TCP"}]}]}})
        })
        .collect();
    let t0 = Instant::now();
    api.create_parallel(&base, 2);
    // No controller-manager: each namespace's `default` service account by hand.
    let accounts: Vec<_> = (0..NAMESPACES)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": format!("bench-{i}")}})
        })
        .collect();
    api.create_parallel(&accounts, 2);
    let mut rest = remote.clone();
    rest.extend(policies.iter().cloned());
    api.create_parallel(&rest, 4);
    eprintln!(
        "created {} nodes+namespaces, {} remote pods, {} policies in {:?}",
        base.len(),
        remote.len(),
        policies.len(),
        t0.elapsed()
    );
    let counted = api.must(&["get", "pods", "-A", "--no-headers", "-o", "name"]);
    assert_eq!(counted.lines().count(), CLUSTER_PODS, "pods in the cluster");
    std::thread::sleep(Duration::from_secs(8));
    ternd.wait_ready(Duration::from_secs(30));
    let rss_cluster = ternd.rss_kib();
    eprintln!(
        "ternd RSS with {CLUSTER_PODS} pods, {NAMESPACES} namespaces, {POLICIES} policies: \
         {rss_cluster} KiB ({:.1} MiB; target <= 40 MiB)",
        rss_cluster as f64 / 1024.0
    );

    // Propagation 1: kubectl apply of a NetworkPolicy selecting web -> its chain in nft.
    // The 500 bench policies select no pod of this node, so they have no chain here (only
    // policies selecting a local pod are compiled); a new policy selecting web adds one.
    let base_chains = ternd.policy_chains();
    eprintln!("policy chains in inet tern before the samples: {base_chains}");
    let (mut total, mut kubectl) = (Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        let yaml = format!(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: web-{i}, \
             namespace: prod}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  \
             policyTypes: [Ingress]\n  ingress: [{{from: [{{podSelector: {{matchLabels: {{role: \
             client}}}}}}]}}]\n"
        );
        let start = Instant::now();
        api.apply(&yaml);
        let k_done = start.elapsed();
        let seen = poll_until(|| ternd.policy_chains() > base_chains)
            .unwrap_or_else(|| panic!("policy web-{i}: no chain in 10 s\n{}", ternd.log()));
        total.push(seen - start);
        kubectl.push(k_done);
        api.must(&["delete", "networkpolicy", "-n", "prod", &format!("web-{i}")]);
        assert!(
            poll_until(|| ternd.policy_chains() == base_chains).is_some(),
            "policy web-{i}'s chain stays after delete"
        );
    }
    print_samples(
        "kubectl apply NetworkPolicy -> chain in inet tern",
        total,
        kubectl,
    );

    // Propagation 2: kubectl label pod client role=client / role- -> the rules change.
    api.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-peer, \
         namespace: prod}\nspec:\n  podSelector: {matchLabels: {app: web}}\n  policyTypes: \
         [Ingress]\n  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}]}]\n",
    );
    assert!(poll_until(|| ternd.policy_chains() > base_chains).is_some());
    std::thread::sleep(Duration::from_millis(500));
    let (mut total, mut kubectl) = (Vec::new(), Vec::new());
    let mut states = std::collections::BTreeSet::new();
    for i in 0..SAMPLES {
        let before = ternd.nft_table();
        let label = if i % 2 == 0 { "role=client" } else { "role-" };
        let start = Instant::now();
        api.must(&["label", "pod", "-n", "prod", "client", label]);
        let k_done = start.elapsed();
        let mut after = String::new();
        let seen = poll_until(|| {
            after = ternd.nft_table();
            after != before
        })
        .unwrap_or_else(|| panic!("label {label}: rules unchanged in 10 s\n{}", ternd.log()));
        total.push(seen - start);
        kubectl.push(k_done);
        states.insert(after);
        // Let the change settle so the next baseline is the final state.
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(states.len() >= 2, "labelling did not change the rules");
    print_samples(
        "kubectl label pod (peer membership) -> rules changed",
        total,
        kubectl,
    );
    eprintln!(
        "ternd RSS at the end: {} KiB; benchmark took {:?}",
        ternd.rss_kib(),
        bench_start.elapsed()
    );
    let up = Command::new("uptime")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    eprintln!("uptime: {}", String::from_utf8_lossy(&up).trim());
    for p in pods.iter() {
        let _ = ternd.cni(&plugin, "DEL", Some(p), &json!({}));
    }
    drop(ternd);
}

/// ADD and DEL latency of tern's IPAM (`Ipam::auto_assign` of one IPv4 address, then
/// `release_by_handle`) on each datastore in one run: SQLite (a file), etcd (the API
/// server's own, over its JSON gateway) and the Kubernetes API (one object per write), with
/// the node's block already held; then again once 1,000 other nodes each hold a block of the
/// pool (a 1,000-node cluster's IPAM), which on the Kubernetes API costs a DEL the list of
/// every block (the handle is found in the blocks: no handle records there).
#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn ipam_add_del_latency_per_datastore() {
    use tern_ipam::{AssignArgs, Ipam};
    use tern_model::{IpPool, IpPoolSpec, put_resource};
    use tern_store::Store;
    use tern_store::kube::{KubeConfig, KubeStore};
    const OPS: usize = 200;
    const OTHER_NODES: usize = 1000;
    assert!(
        kube_api::require_k8s(),
        "root and the Kubernetes binaries are needed"
    );
    let k = kube_api::KubeNode::start(NODE_IP);
    let api = &k.api;
    api.install_crds();
    let admin = api.kubeconfig("store-admin", "store-admin", &["system:masters"]);
    let db = k.tmp.path().join("ipam.db");
    let ns = format!("/run/netns/{}", k.netns.name);
    common::in_netns(&ns, || {
        let stores: Vec<(&str, std::sync::Arc<dyn Store>)> = vec![
            (
                "sqlite",
                tern_store::open(&format!("sqlite://{}", db.display())).unwrap(),
            ),
            (
                "etcd",
                tern_store::open(&format!("etcd://127.0.0.1:{}", kube_api::ETCD_PORT)).unwrap(),
            ),
            (
                "kubernetes",
                std::sync::Arc::new(
                    KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap(),
                ),
            ),
            // As ternd reads it: through its watched copy (kube-rs watchers). Runs after the
            // plain Kubernetes store on the same API server, so its "one node" already has
            // the other 1,000 nodes' blocks around it.
            ("kubernetes+copy", {
                let cache = tern_store::cache::Cache::new(tern_agent::kube::feed::cached_classes());
                tern_agent::kube::feed::spawn(cache.clone(), Some(admin.clone())).unwrap();
                let missing = cache.wait_synced(Duration::from_secs(30));
                assert!(missing.is_empty(), "the copy did not sync: {missing:?}");
                let kube =
                    KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap();
                std::sync::Arc::new(tern_store::cache::CachedStore::new(
                    std::sync::Arc::new(kube),
                    cache,
                ))
            }),
        ];
        let args = |handle: String, node: String| AssignArgs {
            handle,
            node,
            num_v4: 1,
            ..AssignArgs::default()
        };
        // `OPS` ADDs then DELs on node `bench`, after a first ADD that claims its block.
        let run = |ipam: &Ipam, what: &str, store: &str| {
            ipam.auto_assign(&args("warm".into(), "bench".into()))
                .unwrap();
            let (mut add, mut del) = (Vec::new(), Vec::new());
            for i in 0..OPS {
                let h = format!("{what}-{i}");
                let t = Instant::now();
                let got = ipam.auto_assign(&args(h.clone(), "bench".into())).unwrap();
                add.push(t.elapsed());
                assert_eq!(got.len(), 1, "{store}: one address");
                let t = Instant::now();
                let freed = ipam.release_by_handle(&h).unwrap();
                del.push(t.elapsed());
                assert_eq!(freed, got, "{store}: the DEL frees the ADD's address");
            }
            let (a50, a99, amax) = pctl(add);
            let (d50, d99, dmax) = pctl(del);
            eprintln!(
                "{store:>10} {what:>12}: ADD p50 {a50:.2} ms, p99 {a99:.2} ms, max {amax:.1} ms; \
                 DEL p50 {d50:.2} ms, p99 {d99:.2} ms, max {dmax:.1} ms ({OPS} each)"
            );
        };
        for (name, store) in &stores {
            let mut spec = IpPoolSpec::new("10.80.0.0/14");
            spec.block_size = 26;
            put_resource(&**store, &IpPool::new("bench", spec).into()).unwrap();
            run(&Ipam::new(store.clone()), "one node", name);
            // 1,000 other nodes, each claiming a block with its first address (4 threads).
            let t = Instant::now();
            std::thread::scope(|s| {
                for w in 0..4 {
                    let ipam = Ipam::new(store.clone());
                    s.spawn(move || {
                        for n in (w..OTHER_NODES).step_by(4) {
                            ipam.auto_assign(&args(format!("pod-{n}"), format!("node-{n}")))
                                .unwrap();
                        }
                    });
                }
            });
            eprintln!(
                "{name:>10}: {OTHER_NODES} nodes claimed a block each in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            run(&Ipam::new(store.clone()), "1000 blocks", name);
        }
    });
}
