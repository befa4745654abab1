//! tern's Kubernetes datastore (issue 19, first part): `tern_store::kube::KubeStore` on a real
//! etcd and kube-apiserver (no kubelet) on the loopback of a node namespace.
//!
//! Shown: tern's CustomResourceDefinitions install and become Established; the store passes
//! the single-object conformance suite (metadata, compares, CAS races, watches, leases, the
//! refusal of multi-key transactions); IPAM storms of four simulated nodes (roomy, exhausted
//! with borrowing, strict affinity with empty blocks released) keep every invariant with one
//! object per write, and a DEL of everything leaves nothing allocated; ternd with `--store
//! kubernetes` serves a pod's ADD (its block visible to kubectl, its WorkloadEndpoint derived
//! from the Pod once the Pod's status has the address; one API write) and DEL (one write)
//! through the real plugin; an IPPool applied with `kubectl apply` in `ternctl
//! apply`'s YAML is the pool tern's model reads, and one tern writes is what `kubectl get
//! ippools` shows; the API server itself refuses invalid pools (bad CIDR, block size for the
//! family or bigger than the pool, two encapsulations) with the reason; an IPAM block record
//! shows its CIDR, node and used/free addresses in `kubectl get ipamblocks`; a user without
//! RBAC on the CRDs gets an error naming the verb and the resource; a storm keeps every
//! invariant through a restart of the API server in its middle.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the
//! test fails and says how to get them. The namespace and processes are removed on drop; the
//! root namespace is never touched.

mod common;

use common::kube::KubeTernd as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tern_store::conformance::{self, Options};
use tern_store::kube::{KubeConfig, KubeStore};
use tern_store::{Store, StoreError};
use tern_testkit::kube_api::KubeNode;
use tern_testkit::netns::in_netns;

const NODE_IP: &str = "198.18.0.40";
const NODE: &str = "kds-node";

/// What ternd needs on tern's own resources (the manifest's rule for group tern.dev), for
/// the test's `tern-agent` user.
const DATASTORE_RBAC: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tern-datastore}
rules:
- apiGroups: [tern.dev]
  resources: [\"*\"]
  verbs: [get, list, watch, create, update, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tern-datastore}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tern-datastore}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: tern-agent}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tern-datastore-gc}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tern-datastore-gc}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tern-datastore-gc}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: tern-agent}
";

const POOL: &str = "apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: kubectl-pool
  labels: {team: net}
spec:
  cidr: 10.250.0.0/16
  blockSize: 24
  vxlanMode: Always
  natOutgoing: true
";

/// The API server's count of write requests (POST, PUT, PATCH, DELETE) by verb and resource,
/// from its `apiserver_request_total`.
fn api_writes(api: &tern_testkit::kube_api::KubeApi) -> BTreeMap<(String, String), u64> {
    api_requests(api, |verb| {
        matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY")
    })
}

/// The API server's count of the requests whose verb `keep` takes, by verb and resource,
/// from its `apiserver_request_total`.
fn api_requests(
    api: &tern_testkit::kube_api::KubeApi,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<(String, String), u64> {
    let text = api.must(&["get", "--raw", "/metrics"]);
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_string()
        };
        let verb = label("verb");
        if !keep(&verb) {
            continue;
        }
        let n = value.parse::<f64>().unwrap_or(0.0) as u64;
        *out.entry((verb, label("resource"))).or_default() += n;
    }
    out
}

/// The watch streams open on tern's resources (group tern.dev), by resource, from the API
/// server's `apiserver_longrunning_requests`.
fn tern_watches(api: &tern_testkit::kube_api::KubeApi) -> BTreeMap<String, u64> {
    watches(api, "tern.dev")
}

/// The watch streams open on the resources of API `group` ("" for the core group), by
/// resource, from the API server's `apiserver_longrunning_requests`.
fn watches(api: &tern_testkit::kube_api::KubeApi, group: &str) -> BTreeMap<String, u64> {
    let text = api.must(&["get", "--raw", "/metrics"]);
    let mut out = BTreeMap::new();
    let group = format!("group=\"{group}\"");
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .filter(|l| l.contains(&group) && l.contains("verb=\"WATCH\""))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let resource = labels
            .split("resource=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_string();
        let n = value.parse::<f64>().unwrap_or(0.0) as u64;
        if n > 0 {
            *out.entry(resource).or_default() += n;
        }
    }
    out
}

/// What `after` counts beyond `before` (non-zero entries).
fn diff(
    before: &BTreeMap<(String, String), u64>,
    after: &BTreeMap<(String, String), u64>,
) -> BTreeMap<(String, String), u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn kubernetes_datastore_conformance_crds_and_kubectl() {
    tern_testkit::kube_api::need_k8s();
    let mut k = KubeNode::start(NODE_IP);
    let api = &k.api;
    api.install_crds();
    let admin = api.kubeconfig("store-admin", "store-admin", &["system:masters"]);
    let nobody = api.kubeconfig("nobody", "nobody", &[]);
    let ns = format!("/run/netns/{}", k.netns.name);

    // The conformance suite, every store a new client of the same API server.
    let t0 = std::time::Instant::now();
    in_netns(&ns, || {
        let make = || -> Arc<dyn Store> {
            let cfg = KubeConfig::from_kubeconfig(&admin).unwrap();
            Arc::new(KubeStore::connect(cfg).unwrap())
        };
        conformance::run_single_object(
            &make,
            &Options {
                lease_ttl: Duration::from_secs(2),
                cas_threads: 4,
                cas_increments: 10,
            },
        );
    });
    eprintln!(
        "single-object conformance on kube-apiserver: {:?}",
        t0.elapsed()
    );

    // A lease whose holder died without revoking it (an agent killed with SIGKILL): the next
    // grant, a TTL past its expiry, removes its DatastoreLease object and the keys on it.
    in_netns(&ns, || {
        let s = KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap();
        let dead = s.lease_grant(Duration::from_secs(1)).unwrap();
        let put = tern_store::Op::Put {
            key: "/conformance/sweep/a".into(),
            value: b"x".to_vec(),
            lease: dead,
        };
        s.txn(tern_store::Txn::when(vec![], vec![put])).unwrap();
        let name = format!("l-{:016x}", dead as u64);
        let label = format!("tern.dev/lease={name}");
        let attached = || api.must(&["get", "datastoreentries", "-l", &label, "-o", "name"]);
        assert!(
            api.must(&["get", "datastoreleases", "-o", "name"])
                .contains(&name)
        );
        assert!(!attached().trim().is_empty(), "the key on the lease");
        std::thread::sleep(Duration::from_millis(2_200));
        let fresh = s.lease_grant(Duration::from_secs(30)).unwrap();
        let leases = api.must(&["get", "datastoreleases", "-o", "name"]);
        assert!(
            !leases.contains(&name),
            "the dead lease is still there:\n{leases}"
        );
        assert!(
            attached().trim().is_empty(),
            "a key of the dead lease is left"
        );
        s.lease_revoke(fresh).unwrap();
    });

    // IPAM on one object per write: storms of simulated nodes (threads, each its own client),
    // roomy, and small with strict affinity and empty blocks released; no address twice,
    // none leaked, blocks and affinities consistent, no handle records.
    // (Strict first: its per-node block limit counts the affinities earlier storms leave.)
    for (name, opts) in [
        (
            "kube strict+release",
            tern_ipam::storm::StormOptions {
                pool_cidr: "10.242.0.0/25".into(),
                block_size: 29,
                strict_affinity: true,
                max_blocks_per_host: 2,
                max_held: 12,
                alloc_percent: 45,
                release_empty_blocks: true,
                min_blocks_released: 1,
                seed: 13,
                ..Default::default()
            },
        ),
        (
            "kube roomy",
            tern_ipam::storm::StormOptions {
                pool_cidr: "10.240.0.0/20".into(),
                block_size: 27,
                seed: 7,
                ..Default::default()
            },
        ),
        (
            "kube exhaustion",
            tern_ipam::storm::StormOptions {
                pool_cidr: "10.241.0.0/26".into(),
                block_size: 29,
                max_held: 24,
                alloc_percent: 70,
                seed: 11,
                ..Default::default()
            },
        ),
        (
            "kube dual-stack exhaustion",
            tern_ipam::storm::StormOptions {
                pool_cidr: "10.239.0.0/26".into(),
                other_family_pool: Some("fd00:239::/122".into()),
                block_size: 29,
                max_held: 24,
                alloc_percent: 70,
                seed: 41,
                ..Default::default()
            },
        ),
    ] {
        let report = in_netns(&ns, || {
            let factory = || -> Arc<dyn Store> {
                Arc::new(KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap())
            };
            let r = tern_ipam::storm::run(&factory, &opts).unwrap();
            let v = r.verify(factory());
            (r, v)
        });
        let (r, v) = report;
        r.assert_sound(name, v);
        if name == "kube exhaustion" {
            assert!(
                r.total(|w| w.exhausted) > 0,
                "{name}: the pool never ran dry"
            );
            assert!(r.total(|w| w.borrowed) > 0, "{name}: nobody borrowed");
        }
        if name == "kube strict+release" {
            assert!(
                r.total(|w| w.blocks_released) > 0,
                "{name}: no block released"
            );
            assert_eq!(
                r.total(|w| w.borrowed),
                0,
                "{name}: borrowed under strict affinity"
            );
        }
        // Then DEL of everything held: nothing stays allocated.
        in_netns(&ns, || {
            let ipam = tern_ipam::Ipam::new(Arc::new(
                KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap(),
            ));
            for w in &r.workers {
                for (h, ips) in &w.held {
                    let mut got = ipam.release_by_handle(h).unwrap();
                    got.sort();
                    let mut want = ips.clone();
                    want.sort();
                    assert_eq!(got, want, "{name}: release of {h}");
                }
            }
            let left = ipam.allocations(None).unwrap();
            assert!(left.is_empty(), "{name}: left allocated: {left:?}");
        });
    }

    // kubectl apply of ternctl's YAML is the pool tern reads.
    api.kubectl_in(&["apply", "-f", "-"], Some(POOL))
        .unwrap_or_else(|e| panic!("kubectl apply of the pool: {e}"));
    let store = in_netns(&ns, || {
        KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap()
    });
    let pools = in_netns(&ns, || {
        tern_model::storage::list_resources(&store, tern_model::Kind::IpPool).unwrap()
    });
    let pool = pools
        .iter()
        .find(|p| p.name() == "kubectl-pool")
        .unwrap_or_else(|| panic!("the applied pool is not among {pools:?}"));
    let json: serde_json::Value = serde_json::from_str(&pool.to_json()).unwrap();
    assert_eq!(json["spec"]["cidr"], "10.250.0.0/16");
    assert_eq!(json["spec"]["blockSize"], 24);
    assert_eq!(json["spec"]["vxlanMode"], "Always");
    assert_eq!(json["spec"]["nodeSelector"], "all()", "the CRD's default");
    assert_eq!(json["metadata"]["labels"]["team"], "net");
    // A pool tern writes is what kubectl shows.
    let mine = tern_model::parse::parse_documents(
        "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata: {name: tern-pool}\nspec: {cidr: 10.251.0.0/16}\n",
        "pool.yaml",
    )
    .unwrap()
    .remove(0);
    in_netns(&ns, || {
        tern_model::storage::put_resource(&store, &mine).unwrap()
    });
    let table = api.must(&["get", "ippools.tern.dev"]);
    for want in [
        "kubectl-pool",
        "10.250.0.0/16",
        "tern-pool",
        "10.251.0.0/16",
        "Always",
    ] {
        assert!(
            table.contains(want),
            "kubectl get ippools lacks {want}:\n{table}"
        );
    }
    let explained = api.must(&[
        "explain",
        "ippools.spec.blockSize",
        "--api-version=tern.dev/v1",
    ]);
    assert!(explained.contains("Prefix length"), "{explained}");

    // The API server refuses invalid pools at apply time, with the reason.
    for (spec, reason) in [
        ("{cidr: 10.250.0.0/33}", "must be a CIDR"),
        ("{cidr: not-a-cidr}", "must be a CIDR"),
        (
            "{cidr: 10.252.0.0/16, blockSize: 19}",
            "blockSize must be 20..32",
        ),
        (
            "{cidr: 10.252.0.0/24, blockSize: 22}",
            "a block must fit in the pool",
        ),
        (
            "{cidr: 'fd00::/48', blockSize: 64}",
            "116..128 for an IPv6 pool",
        ),
        (
            "{cidr: 10.252.0.0/16, ipipMode: Always, vxlanMode: Always}",
            "both IPIP and VXLAN",
        ),
        (
            "{cidr: 10.252.0.0/16, vxlanMode: Sometimes}",
            "Unsupported value",
        ),
    ] {
        let doc = format!(
            "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata: {{name: bad}}\nspec: {spec}\n"
        );
        let out = api.kubectl_out(&["apply", "-f", "-"], Some(&doc));
        assert!(!out.ok, "kubectl apply accepted spec {spec}");
        assert!(out.stderr.contains(reason), "spec {spec}: {}", out.stderr);
    }
    assert!(api.kubectl(&["get", "ippools.tern.dev", "bad"]).is_err());
    // A pool overlapping another (inside it, or around it) is refused by the admission policy
    // that takes the pools as its parameters. Its informer may not have seen kubectl-pool yet:
    // an accepted pool is deleted and the apply tried again, for up to 20 s.
    for (cidr, reason) in [
        (
            "10.250.128.0/17",
            "overlaps IPPool kubectl-pool (10.250.0.0/16)",
        ),
        ("10.248.0.0/14", "overlaps IPPool"),
    ] {
        let doc = format!(
            "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata: {{name: overlapping}}\nspec: {{cidr: '{cidr}'}}\n"
        );
        let t0 = Instant::now();
        let out = loop {
            let out = api.kubectl_out(&["apply", "-f", "-"], Some(&doc));
            if !out.ok || t0.elapsed() > Duration::from_secs(20) {
                break out;
            }
            api.must(&["delete", "ippools.tern.dev", "overlapping"]);
            std::thread::sleep(Duration::from_secs(1));
        };
        assert!(
            !out.ok,
            "kubectl apply accepted {cidr}, which overlaps a pool"
        );
        assert!(out.stderr.contains(reason), "{cidr}: {}", out.stderr);
    }
    // An IPv6 pool beside the IPv4 ones, and the same pool applied again, pass.
    let v6 = "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata: {name: v6-pool}\nspec: {cidr: 'fd00:10::/48'}\n";
    api.kubectl_in(&["apply", "-f", "-"], Some(v6)).unwrap();
    let v6_nat = v6.replace("/48'}", "/48', natOutgoing: true}");
    api.kubectl_in(&["apply", "-f", "-"], Some(&v6_nat))
        .unwrap();
    api.must(&["delete", "ippools.tern.dev", "v6-pool"]);

    // An IPAM block record: exact bytes back, columns for kubectl.
    let block = br#"{"v":2,"cidr":"10.250.3.0/26","affinity":"host:node-a","free":"3-63","strings":[],"attrs":[]}"#;
    let key = tern_store::keys::block("10.250.3.0/26");
    in_netns(&ns, || {
        store.put(&key, block).unwrap();
        assert_eq!(store.get(&key).unwrap().unwrap().value, block);
    });
    let wide = api.must(&["get", "ipamblocks", "-o", "wide"]);
    let line = wide
        .lines()
        .find(|l| l.contains("10.250.3.0/26"))
        .unwrap_or_else(|| panic!("no block line:\n{wide}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &cols[1..5],
        ["10.250.3.0/26", "node-a", "3", "61"],
        "{wide}"
    );
    // (Only the record's columns were the point: it is not a whole block.)
    in_netns(&ns, || store.delete(&key).unwrap());

    // ternd on the Kubernetes datastore (`--store kubernetes` with its `--kubeconfig`, as
    // tern-agent with tern's RBAC): a pod's ADD takes an address from a block it claims in
    // the API server, its DEL gives it back.
    api.apply(tern_testkit::kube_api::AGENT_RBAC);
    api.apply(DATASTORE_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: prod}}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: prod}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: prod}}\nspec: {{nodeName: {NODE}, automountServiceAccountToken: false, containers: [{{name: c, image: pause}}]}}\n"
    ));
    let plugin = common::tern_plugin();
    let mut ternd = k.ternd(
        NODE,
        &[
            "--store=kubernetes",
            "--resync-seconds=5",
            "--node-gc-grace=2",
        ],
    );
    ternd.start();
    ternd.wait_ready(Duration::from_secs(30));
    // ternd watches each resource it reads once, for its copy (`tern_agent::kube::feed`):
    // one stream per cached class's resource, whatever reads it (dataplane, policy, BGP,
    // IPAM, GC), not one per reader and class (48 streams a node before classes, 7-12 with a
    // stream per class and reader).
    let resources: std::collections::BTreeSet<&str> = tern_agent::kube::feed::cached_classes()
        .iter()
        .map(|c| tern_store::kube::class_of(&c.prefix).plural)
        .filter(|r| *r != "workloadendpoints")
        .collect();
    let t0 = std::time::Instant::now();
    let mut watches = tern_watches(api);
    while resources.iter().any(|r| !watches.contains_key(*r))
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(200));
        watches = tern_watches(api);
    }
    let streams: u64 = watches.values().sum();
    let core = self::watches(api, "");
    eprintln!(
        "ternd's watch streams on tern.dev: {streams} {watches:?}; on the core group: {core:?}"
    );
    for r in &resources {
        assert_eq!(
            watches.get(*r).copied().unwrap_or(0),
            // The API server watches the pools itself: the overlap policy's parameters.
            if *r == "ippools" { 2 } else { 1 },
            "{r}: {watches:?}\n{}",
            ternd.log()
        );
    }
    assert_eq!(
        streams,
        resources.len() as u64 + 1,
        "one stream per copied resource: {watches:?}"
    );
    assert!(
        !watches.contains_key("ipamhandles"),
        "nobody reads handle records on this datastore: {watches:?}"
    );
    // The cluster's endpoints are its Pods: no per-pod object of tern's is watched.
    assert!(
        !watches.contains_key("workloadendpoints") && core.get("pods").copied().unwrap_or(0) >= 1,
        "endpoints are watched as Pods: tern.dev {watches:?}, core {core:?}"
    );
    // ternd reads the datastore from its watched copy (`tern_agent::kube::feed`): over two
    // resync periods (dataplane, policy, node GC, leak repair each read their classes
    // again) it lists none of the classes it watches. (`datastoreentries` with `limit=1` is
    // how the store reads the API server's revision: at a watch's start, a readiness probe,
    // a lost compare-and-swap of the node GC releasing the storms' nodes meanwhile.)
    let cached = [
        "ippools",
        "nodes",
        "ipreservations",
        "networkpolicies",
        "globalnetworkpolicies",
        "bgpconfigurations",
        "bgppeers",
        "ipamconfigs",
        "ipamblocks",
        "blockaffinities",
        "ipamowners",
        "pods",
    ];
    let lists = || api_requests(api, |v| v == "LIST");
    let before = lists();
    std::thread::sleep(Duration::from_secs(12));
    let listed = diff(&before, &lists());
    eprintln!("LISTs in 12 s of an idle ternd (resync 5 s): {listed:?}");
    assert!(
        !listed.keys().any(|(_, r)| cached.contains(&r.as_str())),
        "ternd listed a class it keeps a copy of: {listed:?}\n{}",
        ternd.log()
    );
    let pods = ternd.add_api_pods(api, &plugin, "prod", &["web"]);
    let ip = pods[0].ip.unwrap();
    let held = in_netns(&ns, || {
        tern_ipam::Ipam::new(Arc::new(store.clone()))
            .allocations(None)
            .unwrap()
            .into_iter()
            .filter(|a| a.attrs.pod == "web")
            .map(|a| a.ip)
            .collect::<Vec<_>>()
    });
    assert_eq!(held, [ip], "{}", ternd.log());
    let wide = api.must(&["get", "ipamblocks", "-o", "wide"]);
    assert!(
        wide.lines().any(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            c.len() > 4 && c[2] == NODE && c[3].parse::<u32>().is_ok_and(|n| n >= 1)
        }),
        "no block of {NODE} with an address in use:\n{wide}"
    );
    // No WorkloadEndpoint object of tern's: the endpoint is derived from the Pod once its
    // status has the address (which kubelet writes from the CNI result; here the test does).
    assert!(
        api.kubectl(&["get", "crd", "workloadendpoints.tern.dev"])
            .is_err(),
        "WorkloadEndpoints are no custom resource on the Kubernetes datastore"
    );
    let wep_prefix = tern_store::keys::namespaced_resource("WorkloadEndpoint", "prod", "");
    let derived = || {
        in_netns(&ns, || {
            store
                .range(&wep_prefix)
                .unwrap()
                .0
                .into_iter()
                .map(|kv| serde_json::from_slice::<serde_json::Value>(&kv.value).unwrap())
                .collect::<Vec<_>>()
        })
    };
    assert!(
        derived().is_empty(),
        "no address in the Pod's status yet: {:?}",
        derived()
    );
    api.must(&[
        "patch",
        "pod",
        "web",
        "-n",
        "prod",
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#),
    ]);
    let weps = derived();
    assert_eq!(weps.len(), 1, "{weps:?}");
    assert_eq!(weps[0]["spec"]["pod"], "web", "{weps:?}");
    assert_eq!(weps[0]["spec"]["node"], NODE, "{weps:?}");
    assert_eq!(
        weps[0]["spec"]["ipNetworks"][0],
        format!("{ip}/32"),
        "{weps:?}"
    );
    // The audit matches the Pod's address with the allocation made for it.
    let report = in_netns(&ns, || {
        let s: Arc<dyn Store> = Arc::new(store.clone());
        tern_ipam::audit::check(&*s, &tern_ipam::Ipam::new(s.clone())).unwrap()
    });
    assert_eq!(
        report.problems(),
        0,
        "{}",
        tern_ipam::audit::summary(&report)
    );
    // The API writes of one more pod's ADD (from the block the node holds) and of its DEL,
    // by verb and resource, from the API server's own request counter.
    api.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web2, namespace: prod}}\nspec: {{nodeName: {NODE}, automountServiceAccountToken: false, containers: [{{name: c, image: pause}}]}}\n"
    ));
    let before = api_writes(api);
    let web2 = ternd.add_api_pods(api, &plugin, "prod", &["web2"]);
    let after_add = api_writes(api);
    let (st, out) = ternd.cni(&plugin, "DEL", Some(&web2[0]), &serde_json::json!({}));
    assert_eq!(st, 0, "DEL web2: {out}\n{}", ternd.log());
    let after_del = api_writes(api);
    let add = diff(&before, &after_add);
    let del = diff(&after_add, &after_del);
    eprintln!("API writes of one ADD from a held block: {add:?}");
    eprintln!("API writes of one DEL: {del:?}");
    let blocks = |d: &BTreeMap<(String, String), u64>| {
        d.iter()
            .filter(|((_, r), _)| r == "ipamblocks")
            .map(|(_, n)| n)
            .sum::<u64>()
    };
    assert_eq!(blocks(&add), 1, "block writes of an ADD: {add:?}");
    assert_eq!(blocks(&del), 1, "block writes of a DEL: {del:?}");
    // And nothing else of tern's: the block is the one write (ternd's own writes on their
    // periods, its node-status patch, the node-GC Lease renewal and its node's liveness
    // lease renewal every 10 s, are not the pod's).
    let pod_writes = |d: &BTreeMap<(String, String), u64>| {
        d.iter()
            .filter(|((_, r), _)| !matches!(r.as_str(), "nodes" | "leases" | "datastoreleases"))
            .map(|(k, n)| (k.clone(), *n))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        pod_writes(&add).values().sum::<u64>(),
        1,
        "API writes of an ADD from a held block: {add:?}"
    );
    assert_eq!(
        pod_writes(&del).values().sum::<u64>(),
        1,
        "API writes of a DEL: {del:?}"
    );

    let (st, out) = ternd.cni(&plugin, "DEL", Some(&pods[0]), &serde_json::json!({}));
    assert_eq!(st, 0, "DEL: {out}\n{}", ternd.log());
    let left = in_netns(&ns, || {
        tern_ipam::Ipam::new(Arc::new(store.clone()))
            .allocations(None)
            .unwrap()
            .into_iter()
            .filter(|a| a.attrs.pod == "web")
            .collect::<Vec<_>>()
    });
    assert!(left.is_empty(), "after DEL: {left:?}");

    // The pod IPAM GC of the Lease holder (ternd, here): allocations of pods on another node
    // (whose agent is down) that no Pod uses. Gone: the one whose Pod was deleted, the one
    // whose Pod finished, the one whose Pod runs with another address. Kept: the one whose Pod
    // is still starting (no address reported yet).
    api.apply(
        "apiVersion: v1\nkind: Node\nmetadata: {name: gc-node}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: starting, namespace: prod}\nspec: {nodeName: gc-node, automountServiceAccountToken: false, containers: [{name: c, image: pause}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: moved, namespace: prod}\nspec: {nodeName: gc-node, automountServiceAccountToken: false, containers: [{name: c, image: pause}]}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: done, namespace: prod}\nspec: {nodeName: gc-node, automountServiceAccountToken: false, containers: [{name: c, image: pause}]}\n",
    );
    for (pod, status) in [
        (
            "moved",
            r#"{"status":{"phase":"Running","podIPs":[{"ip":"10.250.255.254"}]}}"#,
        ),
        ("done", r#"{"status":{"phase":"Succeeded"}}"#),
    ] {
        api.must(&[
            "patch",
            "pod",
            pod,
            "-n",
            "prod",
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        ]);
    }
    let gc_ipam = || tern_ipam::Ipam::new(Arc::new(store.clone()));
    let held_by = |pod: &str| {
        in_netns(&ns, || {
            gc_ipam()
                .allocations(None)
                .unwrap()
                .into_iter()
                .filter(|a| a.attrs.node == "gc-node" && a.attrs.pod == pod)
                .count()
        })
    };
    for pod in ["gone", "starting", "moved", "done"] {
        in_netns(&ns, || {
            gc_ipam()
                .auto_assign(&tern_ipam::AssignArgs {
                    num_v4: 1,
                    handle: format!("k8s-pod-network.gc-{pod}"),
                    node: "gc-node".into(),
                    attrs: tern_ipam::AllocationAttrs {
                        namespace: "prod".into(),
                        pod: pod.into(),
                        node: "gc-node".into(),
                        container_id: format!("gc-{pod}"),
                        ifname: "eth0".into(),
                    },
                    ..Default::default()
                })
                .unwrap()
        });
    }
    let released = tern_testkit::wait::wait_until(Duration::from_secs(40), || {
        ["gone", "moved", "done"].iter().all(|p| held_by(p) == 0)
    });
    assert!(
        released,
        "the pod IPAM GC left {:?}\n{}",
        ["gone", "moved", "done"].map(held_by),
        ternd.log()
    );
    assert_eq!(held_by("starting"), 1, "a starting pod keeps its address");
    let (_, metrics) = ternd.http_get("/metrics");
    let counted = metrics
        .lines()
        .find(|l| l.starts_with("tern_ipam_gc_released_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(counted, Some(3), "tern_ipam_gc_released_total:\n{metrics}");
    assert!(metrics.contains("tern_gc_leader{"), "{metrics}");
    in_netns(&ns, || {
        gc_ipam()
            .release_by_handle("k8s-pod-network.gc-starting")
            .unwrap();
    });
    api.must(&[
        "delete",
        "pod",
        "-n",
        "prod",
        "starting",
        "moved",
        "done",
        "--wait=false",
    ]);
    drop(ternd);
    // The node is gone for this test: its VXLAN tunnel address goes too.
    in_netns(&ns, || {
        let ipam = tern_ipam::Ipam::new(Arc::new(store.clone()));
        assert_eq!(
            ipam.release_by_handle(&format!("vxlan-tunnel-addr-{NODE}"))
                .unwrap()
                .len(),
            1
        );
    });

    // `datastore migrate` from another store (here a memory store with a pool, the cluster
    // ID and two pods' addresses): refused into a non-empty target without --force; then the
    // addresses are where they were, and a DEL on the new store releases them.
    let old = Arc::new(tern_store::mem::MemStore::new());
    let mut spec = tern_model::IpPoolSpec::new("10.230.0.0/16");
    spec.block_size = 26;
    tern_model::put_resource(&*old, &tern_model::IpPool::new("migrated", spec).into()).unwrap();
    let old_ipam = tern_ipam::Ipam::new(old.clone());
    let mut held = Vec::new();
    for h in ["net.pod-a", "net.pod-b"] {
        let args = tern_ipam::AssignArgs {
            handle: h.into(),
            node: "old-node".into(),
            num_v4: 1,
            ..Default::default()
        };
        held.push((h, old_ipam.auto_assign(&args).unwrap()));
    }
    in_netns(&ns, || {
        use tern_store::migrate::migrate;
        let e = migrate(&*old, &store, false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty"), "{e}");
        let dry = migrate(&*old, &store, true, true).unwrap();
        let plan = migrate(&*old, &store, false, true).unwrap();
        assert_eq!(dry.copy, plan.copy);
        eprintln!("datastore migrate: {plan}");
        assert!(
            plan.skip
                .iter()
                .any(|(why, n)| why.contains("handle") && *n == 2),
            "{plan}"
        );
        let ipam = tern_ipam::Ipam::new(Arc::new(store.clone()));
        for (h, ips) in &held {
            assert_eq!(
                &ipam.ips_by_handle(h).unwrap(),
                ips,
                "{h} after the migration"
            );
            assert_eq!(&ipam.release_by_handle(h).unwrap(), ips, "DEL of {h}");
        }
    });

    // A user without RBAC on the CRDs: the error names the verb and the resource.
    let e = in_netns(&ns, || {
        let cfg = KubeConfig::from_kubeconfig(&nobody).unwrap();
        KubeStore::connect(cfg).map(|_| ()).unwrap_err()
    });
    let msg = e.to_string();
    assert!(
        matches!(e, StoreError::Forbidden(_))
            && msg.contains("forbidden")
            && msg.contains("list")
            && msg.contains("datastoreentries"),
        "{msg}"
    );

    // The API server restarted (SIGKILL, then started again) in the middle of a storm whose
    // workers act as runtimes do: a failed ADD is followed by DELs until one succeeds, a
    // failed DEL is retried. Afterwards: no address twice, none leaked.
    let opts = tern_ipam::storm::StormOptions {
        pool_cidr: "10.243.0.0/24".into(),
        block_size: 28,
        duration: Duration::from_secs(8),
        retry_unavailable: true,
        seed: 5,
        ..Default::default()
    };
    let (r, v) = std::thread::scope(|s| {
        let storm = s.spawn(|| {
            in_netns(&ns, || {
                let factory = || -> Arc<dyn Store> {
                    Arc::new(
                        KubeStore::connect(KubeConfig::from_kubeconfig(&admin).unwrap()).unwrap(),
                    )
                };
                let r = tern_ipam::storm::run(&factory, &opts).unwrap();
                let v = r.verify(factory());
                (r, v)
            })
        });
        std::thread::sleep(Duration::from_secs(2));
        k.api.stop_apiserver();
        // Longer than a call's retry budget (6 s), so operations fail and are retried.
        std::thread::sleep(Duration::from_secs(8));
        k.api.start_apiserver();
        storm.join().unwrap()
    });
    r.assert_sound("kube restart", v);
    assert!(
        r.total(|w| w.unavailable) > 0,
        "no operation met the outage"
    );
}
