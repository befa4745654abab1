//! Benchmark (issue 19, "Scale"): 20 real `ternd` agents on one real kube-apiserver holding a
//! 1,000-node cluster of 10,000 pods.
//!
//! The cluster is plain API objects (no kubelet, no kwok: kwok would give the pods addresses of
//! its own, not from tern's blocks), all created through the API server:
//!
//! - 1,000 Node objects: the 20 agents' nodes `scale-00`..`scale-19` and 980 fake nodes
//!   `fake-000`..`fake-979`;
//! - 10,000 Pods: 500 on the agents' nodes (25 each, namespace `sc-web`, `app: web`), which the
//!   agents wire through CNI ADDs over their sockets, and 9,500 on the fake nodes (9 or 10
//!   each, spread over 50 namespaces `sc-00`..`sc-49` labelled `team: t0`..`t4`, labels
//!   `app: a0`..`a9`), bound with `spec.nodeName` and reported `Running` with an address by
//!   a status apply as kubelet's, as the agents' pods are once added (the Kubernetes datastore
//!   derives every agent's view of remote endpoints from the Pods' `status.podIPs`);
//! - the fake nodes' tern state as their agents would have left it: a tern Node each (an
//!   underlay address in 198.19.76.0/22, which no interface holds: each agent's node routes
//!   that range on-link out of its underlay, so its dataplane programs a route to every fake
//!   node's block), and one /26 block each in the pool 10.64.0.0/15 (spread over the pool as
//!   tern's claims spread them) with its pods' addresses allocated as tern's IPAM records them
//!   (handle and attributes per pod), written directly (block affinity `Confirmed`, then the
//!   block: what a claim leaves); the agents claim their blocks through tern's IPAM among
//!   these;
//! - 500 NetworkPolicies in the fake namespaces (none selects an agent's pod).
//!
//! Then, measured (every figure printed in one block at the end; the benchmark asserts only
//! that every pod got an address, none given twice, that every DEL succeeded in the end, and
//! that every agent got every policy):
//!
//! - the agents' start on the populated cluster, one after another as a DaemonSet rolls out
//!   (each lists the 10,000 Pods, the Nodes, the policies and tern's resources), until
//!   `/readiness`; the benchmark stops before another agent would leave the (shared) machine
//!   with less than 3 GiB of memory, and a watchdog SIGKILLs the agents (failing it) once less
//!   than 1 GiB is left;
//! - the ADD wave: 25 pods per agent, 4 at a time per agent, all 20 agents at once (the pods'
//!   sandbox namespaces made beforehand; a failed ADD is followed, as a runtime does, by DELs
//!   until one succeeds and an ADD in a new sandbox): allocations/s, ADD latency, API requests
//!   per ADD by verb and resource (also net of the agents' background, at the steady state's
//!   rate), the blocks the agents hold, and conflicts per allocation (the API server's 409
//!   answers on `ipamblocks` and `blockaffinities`: every lost compare-and-swap or block
//!   claim);
//! - each agent's RSS (VmRSS and its peak VmHWM) after start, after the wave and at the end;
//! - the steady state (60 s with nothing changing, two of ternd's resync periods): the API
//!   server's open watch streams by resource, its requests/s and answer bytes/s by verb and
//!   resource, per agent, and the agents' CPU;
//! - policy propagation: 20 times, `kubectl apply` of a NetworkPolicy in `sc-web` selecting
//!   the agents' pods (so every agent compiles it) with peers from the fake pods, until its
//!   chain is in every agent's `inet tern` table (`nft monitor chains` in each node
//!   namespace, read as the kernel reports the commit), p50/p99 per agent and for all 20;
//! - the DEL wave of the 500 pods: DELs/s, latency, API requests and bytes per DEL.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`. Every namespace is
//! uniquely named and removed on drop, every process is killed by PID, also when the
//! benchmark fails; the root namespace is never touched. Underlay 198.18.19.0/24.
//!
//! `cargo test -p tern-agent --test kube_scale -- --ignored --nocapture`; figures of a release
//! ternd with `TERN_TEST_TERND=<target>/release/ternd`.

mod common;

use common::kube::NETWORK;
use common::pctl;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, DelRequest, PodRef, Reply, Request};
use tern_ipam::{Affinity, AffinityState, AllocationAttrs, Block, Ipam};
use tern_store::kube::{KubeConfig, KubeStore};
use tern_store::{Store, keys};
use tern_testkit::kube_api::{KubeApi, Sample};
use tern_testkit::netns::{Netns, Underlay, in_netns};
use tern_testkit::ternd::Ternd;

const API_IP: &str = "198.18.19.1";
/// The nodes' default gateway: on the underlay's subnet, held by nobody.
const GATEWAY: &str = "198.18.19.254";
const AGENTS: usize = 20;
/// Node objects in all, the agents' included.
const NODES: usize = 1000;
const FAKE_NODES: usize = NODES - AGENTS;
/// Pod objects in all, the agents' included.
const PODS: usize = 10_000;
const PODS_PER_AGENT: usize = 25;
const FAKE_PODS: usize = PODS - AGENTS * PODS_PER_AGENT;
/// ADDs (and DELs) in flight per agent.
const WORKERS_PER_AGENT: usize = 4;
/// Namespaces of the fake pods.
const NAMESPACES: usize = 50;
/// The agents' pods' namespace (also the propagation policies').
const WEB_NS: &str = "sc-web";
const BACKGROUND_POLICIES: usize = 500;
const SAMPLES: usize = 20;
const POOL: &str = "apiVersion: tern.dev/v1
kind: IPPool
metadata: {name: scale-pool}
spec: {cidr: 10.64.0.0/15, blockSize: 26}
";
const POOL_CIDR: &str = "10.64.0.0/15";
/// Addresses per block (/26).
const BLOCK_LEN: u32 = 64;
/// The fake nodes' underlay: `FAKE_UNDERLAY_BASE + 1 + i` for fake node `i`, routed on-link in
/// every agent's node.
const FAKE_UNDERLAY: &str = "198.19.76.0/22";
const FAKE_UNDERLAY_BASE: Ipv4Addr = Ipv4Addr::new(198, 19, 76, 0);
/// Concurrent `kubectl` processes (or store threads) while populating.
const PARALLEL: usize = 6;
/// The steady-state window: two of ternd's resync periods (30 s).
const STEADY: Duration = Duration::from_secs(60);
/// Memory the machine must still have before another agent starts (it is shared).
const MIN_AVAILABLE_MIB: u64 = 3072;
/// The plugin's own timeout of a call to ternd.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an agent may take to get a policy (a bound against hanging, not a target).
const PROPAGATION_LIMIT: Duration = Duration::from_secs(30);

/// The name of agent `a`'s node and its underlay address.
fn agent_node(a: usize) -> (String, String) {
    (format!("scale-{a:02}"), format!("198.18.19.{}", 11 + a))
}

fn fake_node(i: usize) -> String {
    format!("fake-{i:03}")
}

/// Fake pod `j`: (namespace, name, node index, index on its node).
fn fake_pod(j: usize) -> (String, String, usize, usize) {
    (
        format!("sc-{:02}", j % NAMESPACES),
        format!("f{j}"),
        j % FAKE_NODES,
        j / FAKE_NODES,
    )
}

/// The fake nodes' blocks, by fake node: spread over the pool as tern's claims spread them
/// (each node starts at a hash of its name, FNV-1a, and takes the next free block from
/// there), so that runs of taken blocks are as long as in a cluster grown by its agents.
fn fake_blocks() -> Vec<ipnet::IpNet> {
    let pool: ipnet::Ipv4Net = POOL_CIDR.parse().unwrap();
    let count = 1u64 << (32 - pool.prefix_len() - BLOCK_LEN.trailing_zeros() as u8);
    let mut taken = HashSet::new();
    (0..FAKE_NODES)
        .map(|i| {
            let hash = fake_node(i).bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            let mut idx = hash % count;
            while !taken.insert(idx) {
                idx = (idx + 1) % count;
            }
            let base = u32::from(pool.network()) + idx as u32 * BLOCK_LEN;
            ipnet::IpNet::V4(ipnet::Ipv4Net::new(Ipv4Addr::from(base), 26).unwrap())
        })
        .collect()
}

/// The sandbox attachment of a pod (as the runtime builds it for the plugin).
fn attachment(ns: &str, name: &str, uid: &str, cid: &str, netns: &str) -> Attachment {
    Attachment {
        network: NETWORK.into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        netns_path: netns.into(),
        pod: Some(PodRef {
            namespace: ns.into(),
            name: name.into(),
            infra_container_id: cid.into(),
            uid: uid.into(),
        }),
    }
}

/// A node: its agent (killed first on drop), then its namespace.
struct Agent {
    ternd: Ternd,
    ns: Netns,
}

/// The sandbox of one of the agents' pods.
struct Sandbox {
    agent: usize,
    name: String,
    ns: Netns,
    att: Attachment,
}

/// The API server, the 20 nodes and everything the benchmark started, removed on drop in
/// field order: the memory watchdog, chain monitors, agents, sandboxes, the API server, then
/// the namespaces.
struct Cluster {
    watchdog: Option<MemoryWatchdog>,
    monitors: Option<ChainMonitors>,
    agents: Vec<Agent>,
    sandboxes: Vec<Sandbox>,
    api: KubeApi,
    api_ns: Netns,
    _underlay: Underlay,
    /// An admin kubeconfig for the benchmark's own store clients.
    admin: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    /// The API server (reachable on the underlay) with tern's CRDs, the manifest's RBAC and
    /// the pool; the 20 node namespaces, their agents not started.
    fn start() -> Cluster {
        let tmp = tempfile::Builder::new().prefix("tksc-").tempdir().unwrap();
        let underlay = Underlay::new();
        let api_ns = Netns::new("k");
        underlay.attach(&api_ns, &format!("{API_IP}/24"), GATEWAY);
        let api = KubeApi::start_reachable(&api_ns.name, &tmp.path().join("k8s"), API_IP);
        api.install_crds();
        api.apply(&tern_testkit::kube_api::manifest_rbac());
        api.apply(POOL);
        let admin = api.kubeconfig("scale-admin", "scale-admin", &["system:masters"]);
        let kubeconfig = api.remote_kubeconfig("tern-node", tern_testkit::kube_api::SA_USER, &[]);
        let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
        let pool = format!("--default-ipv4-pool={POOL_CIDR}");
        let mut agents = Vec::new();
        for a in 0..AGENTS {
            let (name, ip) = agent_node(a);
            let ns = Netns::new("n");
            underlay.attach(&ns, &format!("{ip}/24"), GATEWAY);
            // The fake nodes' addresses, on-link: routes via them are accepted (nothing is
            // ever sent there).
            ns.ip(&["route", "add", FAKE_UNDERLAY, "dev", "eth0"]);
            let node_ip = format!("--node-ip={ip}");
            let ternd = Ternd::new(
                &ns.name,
                &tmp.path().join(&name),
                &name,
                &[
                    "--store=kubernetes",
                    &kubeconfig,
                    &node_ip,
                    &pool,
                    "--mtu=1500",
                    "--log-level=info",
                ],
            );
            agents.push(Agent { ternd, ns });
        }
        Cluster {
            watchdog: None,
            monitors: None,
            agents,
            sandboxes: Vec::new(),
            api,
            api_ns,
            _underlay: underlay,
            admin,
            _tmp: tmp,
        }
    }

    /// Runs `f` with a client of the Kubernetes store on a thread in the API server's
    /// namespace; threads `f` spawns are there too, so every socket the client opens is.
    fn with_store<T: Send>(&self, f: impl FnOnce(Arc<KubeStore>) -> T + Send) -> T {
        let admin = self.admin.clone();
        in_netns(&self.api_ns.path(), move || {
            let cfg = KubeConfig::from_kubeconfig(&admin).unwrap();
            f(Arc::new(
                KubeStore::connect(cfg).expect("connecting to the API server"),
            ))
        })
    }

    /// How many blocks each agent's node holds.
    fn agents_blocks(&self) -> Vec<usize> {
        let blocks = self.with_store(|store| Ipam::new(store).blocks().unwrap());
        (0..AGENTS)
            .map(|a| {
                let affinity = tern_ipam::host_affinity(&agent_node(a).0);
                blocks
                    .iter()
                    .filter(|b| b.affinity.as_deref() == Some(affinity.as_str()))
                    .count()
            })
            .collect()
    }

    fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|a| {
                let log = a.ternd.log();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- ternd {} (last 30 lines)\n{}\n",
                    a.ternd.netns,
                    lines[lines.len().saturating_sub(30)..].join("\n")
                )
            })
            .collect()
    }
}

/// `kubectl apply --server-side --subresource=status` of `Running` with each pod's address,
/// as kubelet reports it, `parallel` processes at once.
fn report_status(api: &KubeApi, pods: &[(String, String, IpAddr)], parallel: usize) {
    let docs: Vec<serde_json::Value> = pods
        .iter()
        .map(|(ns, name, ip)| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns},
                   "status": {"phase": "Running", "podIP": ip.to_string(),
                              "podIPs": [{"ip": ip.to_string()}]}})
        })
        .collect();
    api.run_parallel(
        &[
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=kubelet",
            "-f",
            "-",
        ],
        &docs,
        parallel,
    );
}

/// What populating the cluster took.
struct Population {
    lines: Vec<String>,
}

/// Creates the 1,000 Nodes, the namespaces, the 10,000 Pods, the fake nodes' tern state and
/// the background policies; returns the agents' pods' UIDs by name.
fn populate(c: &Cluster) -> (Population, HashMap<String, String>) {
    let api = &c.api;
    let mut lines = Vec::new();
    let mut step = |what: String, t: Instant, n: usize| {
        let s = t.elapsed().as_secs_f64();
        let line = format!("{what}: {n} in {s:.1} s ({:.0}/s)", n as f64 / s);
        eprintln!("populate: {line}");
        lines.push(line);
    };

    let t = Instant::now();
    let mut nodes: Vec<_> = (0..AGENTS).map(|a| agent_node(a).0).collect();
    nodes.extend((0..FAKE_NODES).map(fake_node));
    let nodes: Vec<_> = nodes
        .iter()
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}})
        })
        .collect();
    api.create_parallel(&nodes, PARALLEL);
    step("Node objects".into(), t, nodes.len());

    let t = Instant::now();
    let mut names: Vec<String> = (0..NAMESPACES).map(|i| format!("sc-{i:02}")).collect();
    names.push(WEB_NS.into());
    let namespaces: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": n, "labels": {"team": format!("t{}", i % 5)}}})
        })
        .collect();
    api.create_parallel(&namespaces, PARALLEL);
    // No controller-manager: each namespace's `default` service account by hand.
    let accounts: Vec<_> = names
        .iter()
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "default", "namespace": n}})
        })
        .collect();
    api.create_parallel(&accounts, PARALLEL);
    step(
        "namespaces with their service account".into(),
        t,
        names.len(),
    );

    let t = Instant::now();
    let pod = |ns: &str, name: &str, node: &str, labels: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"nodeName": node, "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "pause",
                                        "ports": [{"name": "http", "containerPort": 8080}]}]}})
    };
    let mut pods = Vec::with_capacity(PODS);
    for a in 0..AGENTS {
        for i in 0..PODS_PER_AGENT {
            pods.push(pod(
                WEB_NS,
                &format!("w{a:02}-{i:02}"),
                &agent_node(a).0,
                json!({"app": "web", "role": "server"}),
            ));
        }
    }
    for j in 0..FAKE_PODS {
        let (ns, name, node, _) = fake_pod(j);
        pods.push(pod(
            &ns,
            &name,
            &fake_node(node),
            json!({"app": format!("a{}", (j / NAMESPACES) % 10), "tier": "backend"}),
        ));
    }
    api.create_parallel(&pods, PARALLEL);
    step("Pod objects".into(), t, pods.len());

    // The fake nodes' tern state: per node, its tern Node, then its block's affinity and the
    // block with its pods' allocations.
    let t = Instant::now();
    let writes = AtomicUsize::new(0);
    let blocks = fake_blocks();
    c.with_store(|store| {
        let (store, blocks) = (&*store, &blocks);
        std::thread::scope(|s| {
            for w in 0..PARALLEL {
                let writes = &writes;
                s.spawn(move || {
                    for i in (w..FAKE_NODES).step_by(PARALLEL) {
                        let node = fake_node(i);
                        let addr = Ipv4Addr::from(u32::from(FAKE_UNDERLAY_BASE) + 1 + i as u32);
                        let spec = tern_model::NodeSpec {
                            addresses: vec![tern_model::NodeAddress {
                                address: format!("{addr}/22"),
                                kind: Some("InternalIP".into()),
                            }],
                            ..Default::default()
                        };
                        tern_model::put_resource(
                            store,
                            &tern_model::Node::new(node.clone(), spec).into(),
                        )
                        .unwrap_or_else(|e| panic!("tern Node {node}: {e}"));
                        let cidr = blocks[i];
                        let mut block = Block::new(cidr, Some(tern_ipam::host_affinity(&node)));
                        for j in (i..FAKE_PODS).step_by(FAKE_NODES) {
                            let (ns, name, _, _) = fake_pod(j);
                            let cid = format!("fake{j:06}");
                            let att = attachment(&ns, &name, "", &cid, "");
                            let attrs = AllocationAttrs {
                                namespace: ns,
                                pod: name,
                                node: node.clone(),
                                container_id: cid,
                                ifname: "eth0".into(),
                            };
                            assert_eq!(block.allocate(1, &att.handle(), &attrs).len(), 1);
                        }
                        let cs = cidr.to_string();
                        let affinity = Affinity {
                            state: AffinityState::Confirmed,
                        };
                        store
                            .put(
                                &keys::affinity(&node, &cs),
                                &serde_json::to_vec(&affinity).unwrap(),
                            )
                            .unwrap_or_else(|e| panic!("affinity of {cs}: {e}"));
                        store
                            .put(&keys::block(&cs), &serde_json::to_vec(&block).unwrap())
                            .unwrap_or_else(|e| panic!("block {cs}: {e}"));
                        writes.fetch_add(3, Ordering::Relaxed);
                    }
                });
            }
        })
    });
    step(
        "fake nodes' tern Nodes, block affinities and blocks (writes)".into(),
        t,
        writes.load(Ordering::Relaxed),
    );

    // Their addresses, in the order the blocks hand them out (ordinal 0 first).
    let t = Instant::now();
    let statuses: Vec<(String, String, IpAddr)> = (0..FAKE_PODS)
        .map(|j| {
            let (ns, name, node, k) = fake_pod(j);
            let ip = match blocks[node] {
                ipnet::IpNet::V4(b) => Ipv4Addr::from(u32::from(b.network()) + k as u32),
                ipnet::IpNet::V6(_) => unreachable!("an IPv4 pool"),
            };
            (ns, name, IpAddr::V4(ip))
        })
        .collect();
    report_status(api, &statuses, PARALLEL);
    step(
        "fake pods' status (Running, podIPs)".into(),
        t,
        statuses.len(),
    );

    let t = Instant::now();
    let policies: Vec<_> = (0..BACKGROUND_POLICIES)
        .map(|i| {
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                   "metadata": {"name": format!("bg-{i}"), "namespace": format!("sc-{:02}", i % NAMESPACES)},
                   "spec": {"podSelector": {"matchLabels": {"app": format!("a{}", i % 10)}},
                            "policyTypes": ["Ingress"],
                            "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "backend"}}},
                                                  {"namespaceSelector": {"matchLabels": {"team": format!("t{}", i % 5)}}}],
                                         "ports": [{"port": 8000 + (i % 7), "protocol": "TCP"}]}]}})
        })
        .collect();
    api.create_parallel(&policies, PARALLEL);
    step("background NetworkPolicies".into(), t, policies.len());

    let count = |kind: &str| {
        api.must(&["get", kind, "-A", "--no-headers", "-o", "name"])
            .lines()
            .count()
    };
    assert_eq!(count("nodes"), NODES, "Node objects");
    assert_eq!(count("pods"), PODS, "Pod objects");
    let uids = api.must(&[
        "get",
        "pods",
        "-n",
        WEB_NS,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{\"\\n\"}{end}",
    ]);
    let uids = uids
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, u)| (n.to_string(), u.to_string()))
        .collect();
    (Population { lines }, uids)
}

// ---------------------------------------------------------------------------------------
// The API server's metrics.

/// Sum of `name`'s samples that `keep` accepts, by the values of `labels`.
fn by_labels(
    samples: &[Sample],
    name: &str,
    labels: &[&str],
    keep: impl Fn(&Sample) -> bool,
) -> BTreeMap<Vec<String>, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name && keep(s)) {
        let key = labels.iter().map(|l| s.label(l).to_string()).collect();
        *out.entry(key).or_default() += s.value;
    }
    out
}

/// What `after` counts beyond `before` (entries that grew).
fn grown(
    before: &BTreeMap<Vec<String>, f64>,
    after: &BTreeMap<Vec<String>, f64>,
) -> BTreeMap<Vec<String>, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Requests to resources (not `/metrics` or other plain paths, not watch streams), by verb,
/// resource, subresource, status code and API group.
fn requests(samples: &[Sample]) -> BTreeMap<Vec<String>, f64> {
    by_labels(
        samples,
        "apiserver_request_total",
        &["verb", "resource", "subresource", "code", "group"],
        |s| !s.label("resource").is_empty() && s.label("verb") != "WATCH",
    )
}

/// Bytes of the API server's answers, by verb, resource and API group.
fn response_bytes(samples: &[Sample]) -> BTreeMap<Vec<String>, f64> {
    by_labels(
        samples,
        "apiserver_response_sizes_sum",
        &["verb", "resource", "group"],
        |s| !s.label("resource").is_empty(),
    )
}

/// Open watch streams, by resource.
fn watches(samples: &[Sample]) -> BTreeMap<Vec<String>, f64> {
    by_labels(
        samples,
        "apiserver_longrunning_requests",
        &["group", "resource"],
        |s| s.label("verb") == "WATCH",
    )
}

/// `resource` of API `group`, the group's first label after it (`nodes`, `nodes.tern`,
/// `leases.coordination`).
fn resource_name(resource: &str, group: &str) -> String {
    match group.split('.').next() {
        Some(g) if !g.is_empty() => format!("{resource}.{g}"),
        _ => resource.to_string(),
    }
}

/// `wave` less what the steady state's `steady` (over `steady_secs`) would have counted in
/// `wave_secs`: the requests of the wave itself, net of the agents' background.
fn net_of_background(
    wave: &BTreeMap<Vec<String>, f64>,
    steady: &BTreeMap<Vec<String>, f64>,
    steady_secs: f64,
    wave_secs: f64,
) -> BTreeMap<Vec<String>, f64> {
    wave.iter()
        .map(|(k, v)| {
            let bg = steady.get(k).copied().unwrap_or(0.0) / steady_secs * wave_secs;
            (k.clone(), (v - bg).max(0.0))
        })
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// `counts` (keys verb, resource, subresource, code, group) summed by verb and resource,
/// divided by `per`, as `VERB resource[/sub] n` items, largest first.
fn per_verb_resource(counts: &BTreeMap<Vec<String>, f64>, per: f64) -> String {
    let mut by: BTreeMap<String, f64> = BTreeMap::new();
    for (k, v) in counts {
        let res = if k[2].is_empty() {
            resource_name(&k[1], &k[4])
        } else {
            format!("{}/{}", resource_name(&k[1], &k[4]), k[2])
        };
        *by.entry(format!("{} {res}", k[0])).or_default() += v;
    }
    // Those that round to 0.00 are left out.
    let mut v: Vec<(String, f64)> = by.into_iter().filter(|(_, n)| n / per >= 0.005).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter()
        .map(|(k, n)| format!("{k} {:.2}", n / per))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `bytes` (keys verb, resource, group) divided by `per`, as `VERB resource KiB` items, largest
/// first, those under 1 KiB left out.
fn bytes_by_verb_resource(bytes: &BTreeMap<Vec<String>, f64>, per: f64) -> String {
    let mut v: Vec<(String, f64)> = bytes
        .iter()
        .map(|(k, b)| {
            (
                format!("{} {}", k[0], resource_name(&k[1], &k[2])),
                b / per / 1024.0,
            )
        })
        .filter(|(_, kib)| *kib >= 1.0)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter()
        .map(|(k, kib)| format!("{k} {kib:.0} KiB"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// 409 answers (lost compare-and-swaps and block claims) on IPAM's resources.
fn conflicts(counts: &BTreeMap<Vec<String>, f64>) -> f64 {
    counts
        .iter()
        .filter(|(k, _)| k[3] == "409" && matches!(k[1].as_str(), "ipamblocks" | "blockaffinities"))
        .map(|(_, v)| v)
        .sum()
}

// ---------------------------------------------------------------------------------------
// Processes.

/// `/proc/<pid>/status` field `field` (`VmRSS`, `VmHWM`) in KiB; 0 when unreadable.
fn proc_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    cpu_ticks(pid, &[11, 12])
}

/// CPU seconds of each thread of process `pid`, by thread ID, with the thread's name.
fn thread_cpu(pid: u32) -> BTreeMap<u32, (String, f64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |x| x.1)
            .split_whitespace()
            .collect();
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
            .sum();
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        out.insert(tid, (comm.trim().to_string(), ticks / hz.max(1) as f64));
    }
    out
}

/// [`cpu_seconds`] with that of its waited-for children (an agent's `nft` processes).
fn cpu_seconds_with_children(pid: u32) -> f64 {
    cpu_ticks(pid, &[11, 12, 13, 14])
}

/// The sum of the `/proc/<pid>/stat` fields at `idx` (counted from the state field), in
/// seconds.
fn cpu_ticks(pid: u32, idx: &[usize]) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces), from field 3 on.
    let fields: Vec<&str> = s
        .rsplit_once(')')
        .map_or("", |x| x.1)
        .split_whitespace()
        .collect();
    let ticks: f64 = idx
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks / hz.max(1) as f64
}

/// Memory the machine must keep while the agents run: below it the watchdog stops them.
const WATCHDOG_MIB: u64 = 1024;

/// SIGKILLs the agents (by PID) once the machine has less than [`WATCHDOG_MIB`] of memory
/// left, so that the benchmark fails rather than the kernel's OOM killer choosing among the
/// machine's processes (it is shared). Stopped on drop.
struct MemoryWatchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MemoryWatchdog {
    fn start(pids: Vec<u32>) -> MemoryWatchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let avail = mem_available_mib();
                if avail < WATCHDOG_MIB {
                    let rss: Vec<u64> = pids.iter().map(|p| proc_kib(*p, "VmRSS") / 1024).collect();
                    eprintln!(
                        "memory watchdog: {avail} MiB available: SIGKILL to the agents (RSS MiB \
                         {rss:?}); the benchmark fails"
                    );
                    let _ = Command::new("kill")
                        .arg("-KILL")
                        .args(pids.iter().map(u32::to_string))
                        .status();
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        MemoryWatchdog {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for MemoryWatchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The machine's `MemAvailable`, in MiB.
fn mem_available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k / 1024)
}

/// min / mean / max of `v`, in MiB from KiB.
fn mib_spread(v: &[u64]) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let min = v.iter().copied().min().unwrap_or(0);
    let max = v.iter().copied().max().unwrap_or(0);
    let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 1024.0;
    format!(
        "min {:.1} / mean {mean:.1} / max {:.1} MiB",
        mib(min),
        mib(max)
    )
}

fn rss_line(c: &Cluster, when: &str) -> String {
    let rss: Vec<u64> = c
        .agents
        .iter()
        .map(|a| proc_kib(a.ternd.pid(), "VmRSS"))
        .collect();
    let hwm: Vec<u64> = c
        .agents
        .iter()
        .map(|a| proc_kib(a.ternd.pid(), "VmHWM"))
        .collect();
    // The heap the agents' allocator says is in use, and what it keeps freed (their
    // /metrics: glibc's mallinfo2), in KiB as the RSS.
    let heap = |metric: &str| -> Vec<u64> {
        c.agents
            .iter()
            .map(|a| {
                let (_, text) = a.ternd.http_get("/metrics");
                text.lines()
                    .find(|l| l.starts_with(metric))
                    .and_then(|l| l.rsplit_once(' '))
                    .and_then(|(_, v)| v.trim().parse::<u64>().ok())
                    .unwrap_or(0)
                    / 1024
            })
            .collect()
    };
    let (in_use, kept) = (heap("tern_heap_in_use_bytes"), heap("tern_heap_free_bytes"));
    let api = c.api.apiserver_pid().map_or(0, |p| proc_kib(p, "VmRSS"));
    let etcd = c.api.etcd_pid().map_or(0, |p| proc_kib(p, "VmRSS"));
    let line = format!(
        "ternd RSS {when}: {} (peak VmHWM max {:.1} MiB; heap in use {}, freed and kept {}); \
         kube-apiserver {:.0} MiB, etcd {:.0} MiB",
        mib_spread(&rss),
        hwm.iter().copied().max().unwrap_or(0) as f64 / 1024.0,
        mib_spread(&in_use),
        mib_spread(&kept),
        api as f64 / 1024.0,
        etcd as f64 / 1024.0,
    );
    eprintln!("{line}");
    line
}

/// Warnings and errors in every agent's log, with the first few distinct messages.
fn log_problems(c: &Cluster) -> String {
    let mut count = 0;
    let mut first: Vec<String> = Vec::new();
    for a in &c.agents {
        for l in a.ternd.log().lines() {
            if l.contains(" WARN ") || l.contains(" ERROR ") {
                count += 1;
                // The message without its timestamp, so agents' repeats count once.
                let msg: String = l
                    .split_once(']')
                    .map_or(l, |x| x.1)
                    .chars()
                    .take(200)
                    .collect();
                if first.len() < 8 && !first.contains(&msg) {
                    first.push(msg);
                }
            }
        }
    }
    format!(
        "{count} warnings/errors in the 20 agents' logs{}",
        first
            .iter()
            .map(|m| format!("\n      {m}"))
            .collect::<String>()
    )
}

// ---------------------------------------------------------------------------------------
// CNI over the agents' sockets.

fn add(sock: &Path, ns: &Netns, att: &Attachment) -> Result<IpAddr, String> {
    let f = File::open(ns.path()).unwrap();
    let req = Request::Add(AddRequest::new(att.clone()));
    match tern_api::call(sock, &req, Some(f.as_raw_fd()), CALL_TIMEOUT) {
        Ok(Ok(Reply::Result(r))) => r
            .ips
            .first()
            .and_then(|c| c.address.parse::<ipnet::IpNet>().ok())
            .map(|n| n.addr())
            .ok_or_else(|| format!("ADD result without an address: {r:?}")),
        Ok(Ok(other)) => Err(format!("ADD answered {other:?}")),
        Ok(Err(e)) => Err(format!("code {}: {}", e.code, e.msg)),
        Err(e) => Err(format!("transport: {e}")),
    }
}

fn del(sock: &Path, att: &Attachment) -> Result<(), String> {
    let req = Request::Del(DelRequest {
        attachment: att.clone(),
        delegated_ipam: false,
    });
    match tern_api::call(sock, &req, None, CALL_TIMEOUT) {
        Ok(Ok(Reply::Done)) => Ok(()),
        Ok(Ok(other)) => Err(format!("DEL answered {other:?}")),
        Ok(Err(e)) => Err(format!("code {}: {}", e.code, e.msg)),
        Err(e) => Err(format!("transport: {e}")),
    }
}

/// DEL of `att` as a runtime does it: retried every second until it succeeds, for up to two
/// minutes; the failures' messages.
fn del_until_done(sock: &Path, att: &Attachment) -> Result<Vec<String>, String> {
    let end = Instant::now() + Duration::from_secs(120);
    let mut failed = Vec::new();
    loop {
        match del(sock, att) {
            Ok(()) => return Ok(failed),
            Err(e) if Instant::now() < end => {
                failed.push(e);
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(format!("DEL of {} never succeeded: {e}", att.container_id)),
        }
    }
}

/// A pod brought up as a runtime does it.
struct Added {
    ip: IpAddr,
    /// Each ADD's latency, the successful one last.
    attempts: Vec<Duration>,
    /// The failures before the success (ADDs, and the DELs after them).
    errors: Vec<String>,
    /// The sandbox that got the address, when it is not the first one.
    fresh: Option<(Netns, Attachment)>,
}

/// Attempts at a pod's ADD before the benchmark gives up.
const ADD_TRIES: usize = 5;

/// ADD of `sb`'s pod as a runtime does it: after a failed ADD, DEL until it succeeds, then a
/// new sandbox (the old one deleted) and another ADD, up to [`ADD_TRIES`] in all.
fn provision(sock: &Path, sb: &Sandbox) -> Result<Added, String> {
    let uid = sb.att.pod.as_ref().map_or("", |p| p.uid.as_str());
    let mut errors = Vec::new();
    let mut attempts = Vec::new();
    let mut fresh: Option<(Netns, Attachment)> = None;
    for _ in 0..ADD_TRIES {
        let (ns, att) = fresh.as_ref().map_or((&sb.ns, &sb.att), |(n, a)| (n, a));
        let t = Instant::now();
        let r = add(sock, ns, att);
        attempts.push(t.elapsed());
        match r {
            Ok(ip) => {
                return Ok(Added {
                    ip,
                    attempts,
                    errors,
                    fresh,
                });
            }
            Err(e) => {
                errors.push(format!("ADD: {e}"));
                errors.extend(
                    del_until_done(sock, att)?
                        .into_iter()
                        .map(|e| format!("DEL: {e}")),
                );
                let ns = Netns::new("p");
                let cid = format!("sandbox-{}", ns.name);
                let att = attachment(WEB_NS, &sb.name, uid, &cid, &ns.path());
                fresh = Some((ns, att));
            }
        }
    }
    Err(errors.join("; "))
}

/// The kinds of `errors` ("ADD: code 11", "DEL: transport", ...) and how often each came.
fn error_kinds<'a>(errors: impl Iterator<Item = &'a String>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in errors {
        let kind = e.split(':').take(2).collect::<Vec<_>>().join(":");
        *out.entry(kind).or_default() += 1;
    }
    out
}

/// One call's latency and outcome.
type Timed<T> = (Duration, Result<T, String>);

/// One wave of `op` over every sandbox, `WORKERS_PER_AGENT` at a time per agent, every agent
/// at once: each call's latency and result, by sandbox index, and the wave's wall time.
fn wave<T: Send>(
    c: &Cluster,
    op: impl Fn(&Path, &Sandbox) -> Result<T, String> + Sync,
) -> (Vec<Timed<T>>, Duration) {
    let socks: Vec<PathBuf> = c.agents.iter().map(|a| a.ternd.socket()).collect();
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); AGENTS];
    for (i, sb) in c.sandboxes.iter().enumerate() {
        queues[sb.agent].push(i);
    }
    let next: Vec<AtomicUsize> = (0..AGENTS).map(|_| AtomicUsize::new(0)).collect();
    let results: Mutex<Vec<Option<Timed<T>>>> =
        Mutex::new((0..c.sandboxes.len()).map(|_| None).collect());
    let sandboxes = &c.sandboxes;
    let t = Instant::now();
    std::thread::scope(|s| {
        for a in 0..AGENTS {
            for _ in 0..WORKERS_PER_AGENT {
                let (queue, next, results, op, sock) =
                    (&queues[a], &next[a], &results, &op, &socks[a]);
                s.spawn(move || {
                    while let Some(&i) = queue.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let t = Instant::now();
                        let r = op(sock, &sandboxes[i]);
                        results.lock().unwrap()[i] = Some((t.elapsed(), r));
                    }
                });
            }
        }
    });
    let wall = t.elapsed();
    let results = results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every sandbox had its call"))
        .collect();
    (results, wall)
}

/// p50/p99/max of `v`, in ms.
fn ms_line(v: Vec<Duration>) -> String {
    let (p50, p99, max) = pctl(v);
    format!("p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms")
}

// ---------------------------------------------------------------------------------------
// Chains in the agents' tables, as the kernel reports them.

/// A chain added to or deleted from a node's `inet tern` (`*`: the whole table deleted).
struct ChainEvent {
    agent: usize,
    at: Instant,
    added: bool,
    chain: String,
}

/// `nft monitor chains` in every node namespace, each line read on a thread as it comes.
struct ChainMonitors {
    children: Vec<Child>,
    readers: Vec<JoinHandle<()>>,
    rx: mpsc::Receiver<ChainEvent>,
}

impl ChainMonitors {
    fn start(c: &Cluster) -> ChainMonitors {
        let (tx, rx) = mpsc::channel();
        let mut children = Vec::new();
        let mut readers = Vec::new();
        for (agent, a) in c.agents.iter().enumerate() {
            let mut child = Command::new("ip")
                .args(["netns", "exec", &a.ns.name, "nft", "monitor", "chains"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning nft monitor");
            let out = child.stdout.take().unwrap();
            children.push(child);
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    let at = Instant::now();
                    let w: Vec<&str> = line.split_whitespace().collect();
                    let ev = match w.as_slice() {
                        [op @ ("add" | "delete"), "chain", "inet", "tern", name, ..] => {
                            Some((*op == "add", name.to_string()))
                        }
                        ["delete", "table", "inet", "tern", ..] => Some((false, "*".to_string())),
                        _ => None,
                    };
                    if let Some((added, chain)) = ev
                        && tx
                            .send(ChainEvent {
                                agent,
                                at,
                                added,
                                chain,
                            })
                            .is_err()
                    {
                        break;
                    }
                }
            }));
        }
        ChainMonitors {
            children,
            readers,
            rx,
        }
    }

    /// Waits until every agent reports `chain` added (`added`) or gone; the instant each did.
    fn wait_all(&self, chain: &str, added: bool, limit: Duration) -> Result<Vec<Instant>, String> {
        let end = Instant::now() + limit;
        let mut seen: Vec<Option<Instant>> = vec![None; AGENTS];
        while seen.iter().any(Option::is_none) {
            let left = end.saturating_duration_since(Instant::now());
            let ev = self.rx.recv_timeout(left).map_err(|_| {
                let missing: Vec<usize> = (0..AGENTS).filter(|&a| seen[a].is_none()).collect();
                format!(
                    "chain {chain} {} not seen on agents {missing:?} within {limit:?}",
                    if added { "added" } else { "deleted" }
                )
            })?;
            let hit = if added {
                ev.added && ev.chain == chain
            } else {
                !ev.added && (ev.chain == chain || ev.chain == "*")
            };
            if hit && seen[ev.agent].is_none() {
                seen[ev.agent] = Some(ev.at);
            }
        }
        Ok(seen.into_iter().flatten().collect())
    }
}

impl Drop for ChainMonitors {
    fn drop(&mut self) {
        for c in self.children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

/// The `inet tern` chain of a Kubernetes NetworkPolicy's ingress rules, as tern's compiler
/// names it (`tern_policy::compile::policy_chain`).
fn ingress_chain(ns: &str, name: &str) -> String {
    let key = tern_policy::PolicyKey {
        kind: tern_model::Kind::K8sNetworkPolicy,
        namespace: Some(ns.to_string()),
        name: name.to_string(),
    };
    format!(
        "pol-{}-in",
        tern_policy::compile::short_hash(&key.to_string())
    )
}

/// The propagation policy `name`: the agents' pods, from a fifth of the fake namespaces'
/// `app: a3` pods and from each other.
fn propagation_policy(name: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, \
         namespace: {WEB_NS}}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  \
         policyTypes: [Ingress]\n  ingress:\n  - from:\n    - namespaceSelector: \
         {{matchLabels: {{team: t1}}}}\n      podSelector: {{matchLabels: {{app: a3}}}}\n    \
         - podSelector: {{matchLabels: {{role: server}}}}\n    ports: [{{port: http}}]\n"
    )
}

// ---------------------------------------------------------------------------------------

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn kube_scale_1000_nodes_10000_pods_20_agents() {
    tern_testkit::kube_api::need_k8s();
    let t0 = Instant::now();
    let mut c = Cluster::start();
    eprintln!(
        "API server up, {AGENTS} node namespaces made in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let (population, uids) = populate(&c);
    let m_idle = c.api.metrics();

    // The agents, on the populated cluster, one after another (as a DaemonSet rolls out);
    // stopped before the machine runs out of memory (it is shared).
    let t = Instant::now();
    let api_cpu_start = c.api.apiserver_pid().map_or(0.0, cpu_seconds);
    let mut listen = Vec::new();
    for i in 0..AGENTS {
        let avail = mem_available_mib();
        if avail < MIN_AVAILABLE_MIB {
            panic!(
                "only {avail} MiB of memory available before agent {i} starts, stopping: {}",
                rss_line(&c, &format!("of the {i} agents started"))
            );
        }
        let ts = Instant::now();
        // Every agent started before re-reads the cluster each resync: the API server and
        // the CPUs are shared by all of them.
        c.agents[i].ternd.listen_timeout = Duration::from_secs(180);
        c.agents[i].ternd.start();
        listen.push(ts.elapsed());
        // The watchdog, renewed with every agent started.
        c.watchdog = None;
        c.watchdog = Some(MemoryWatchdog::start(
            c.agents[..=i].iter().map(|a| a.ternd.pid()).collect(),
        ));
        eprintln!(
            "agent {i} listening after {:.1} s; {avail} MiB available before it started",
            ts.elapsed().as_secs_f64()
        );
    }
    for a in &c.agents {
        a.ternd.wait_ready(Duration::from_secs(300));
    }
    let start_time = t.elapsed();
    let api_cpu_start = c.api.apiserver_pid().map_or(0.0, cpu_seconds) - api_cpu_start;
    let agents_cpu_start: f64 = c.agents.iter().map(|a| cpu_seconds(a.ternd.pid())).sum();
    eprintln!("{AGENTS} agents ready in {:.1} s", start_time.as_secs_f64());
    // Let every agent's first reconciliation (routes to 999 nodes) finish.
    std::thread::sleep(Duration::from_secs(5));
    let rss_start = rss_line(&c, "after start");
    let routes: Vec<usize> = c
        .agents
        .iter()
        .map(|a| {
            a.ns.ip(&["-4", "route", "show", "proto", "84"])
                .lines()
                .count()
        })
        .collect();

    // The sandboxes of the agents' pods, made before the wave (the runtime's part).
    let t = Instant::now();
    let made: Mutex<Vec<Sandbox>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..PARALLEL {
            let (made, uids) = (&made, &uids);
            s.spawn(move || {
                for k in (w..AGENTS * PODS_PER_AGENT).step_by(PARALLEL) {
                    let (agent, i) = (k / PODS_PER_AGENT, k % PODS_PER_AGENT);
                    let name = format!("w{agent:02}-{i:02}");
                    let uid = uids
                        .get(&name)
                        .unwrap_or_else(|| panic!("no UID for pod {WEB_NS}/{name}"));
                    let ns = Netns::new("p");
                    let cid = format!("sandbox-{}", ns.name);
                    let att = attachment(WEB_NS, &name, uid, &cid, &ns.path());
                    made.lock().unwrap().push(Sandbox {
                        agent,
                        name,
                        ns,
                        att,
                    });
                }
            });
        }
    });
    c.sandboxes = made.into_inner().unwrap();
    c.sandboxes.sort_by(|a, b| a.name.cmp(&b.name));
    eprintln!(
        "{} sandboxes made in {:.1} s",
        c.sandboxes.len(),
        t.elapsed().as_secs_f64()
    );

    // The ADD wave.
    let m0 = c.api.metrics();
    let (adds, add_wall) = wave(&c, provision);
    let m1 = c.api.metrics();
    let failed: Vec<String> = adds
        .iter()
        .zip(&c.sandboxes)
        .filter_map(|((_, r), sb)| r.as_ref().err().map(|e| format!("{}: {e}", sb.name)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} pods never got an address: {failed:#?}\n{}",
        failed.len(),
        c.logs()
    );
    let adds: Vec<(Duration, Added)> = adds.into_iter().map(|(d, r)| (d, r.unwrap())).collect();
    let add_errors = error_kinds(adds.iter().flat_map(|(_, a)| &a.errors));
    let first_error = adds
        .iter()
        .find_map(|(_, a)| a.errors.first().cloned())
        .unwrap_or_default();
    let mut owner: HashMap<IpAddr, &str> = HashMap::new();
    let mut statuses = Vec::new();
    for ((_, a), sb) in adds.iter().zip(&c.sandboxes) {
        if let Some(other) = owner.insert(a.ip, &sb.name) {
            panic!("{} was given to {other} and to {}", a.ip, sb.name);
        }
        statuses.push((WEB_NS.to_string(), sb.name.clone(), a.ip));
    }
    let attempts: Vec<Duration> = adds
        .iter()
        .flat_map(|(_, a)| a.attempts.iter().copied())
        .collect();
    let n_attempts = attempts.len();
    let add_latency: Vec<Duration> = adds.iter().map(|(d, _)| *d).collect();
    // The sandboxes that got the addresses replace those that failed (deleted now).
    for ((_, a), sb) in adds.into_iter().zip(c.sandboxes.iter_mut()) {
        if let Some((ns, att)) = a.fresh {
            sb.ns = ns;
            sb.att = att;
        }
    }
    let add_requests = grown(&requests(&m0), &requests(&m1));
    let n_adds = c.sandboxes.len() as f64;
    let add_conflicts = conflicts(&add_requests);
    let add_bytes = grown(&response_bytes(&m0), &response_bytes(&m1));
    eprintln!(
        "ADD wave: {} ADDs in {:.1} s",
        c.sandboxes.len(),
        add_wall.as_secs_f64()
    );

    let blocks_held = c.agents_blocks();
    // kubelet's status reports of the wave's pods.
    let t = Instant::now();
    report_status(&c.api, &statuses, 2);
    let status_time = t.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let rss_wave = rss_line(&c, "after the ADD wave");

    // The steady state.
    let cpu0: Vec<f64> = c
        .agents
        .iter()
        .map(|a| cpu_seconds(a.ternd.pid()))
        .collect();
    let api_cpu0 = c.api.apiserver_pid().map_or(0.0, cpu_seconds);
    let m2 = c.api.metrics();
    std::thread::sleep(STEADY);
    let m3 = c.api.metrics();
    let api_cpu = c.api.apiserver_pid().map_or(0.0, cpu_seconds) - api_cpu0;
    // At rest: two resync periods with nothing changing (the agents' figure to compare with
    // the target).
    let rss_steady = rss_line(&c, "at rest (after the steady state)");
    let cpu: Vec<f64> = c
        .agents
        .iter()
        .zip(&cpu0)
        .map(|(a, c0)| cpu_seconds(a.ternd.pid()) - c0)
        .collect();
    let steady = grown(&requests(&m2), &requests(&m3));
    let steady_bytes = grown(&response_bytes(&m2), &response_bytes(&m3));
    let steady_total: f64 = steady.values().sum();
    let w_idle = watches(&m_idle);
    let w_now = watches(&m3);
    let agent_watches = grown(&w_idle, &w_now);
    let n_watches: f64 = agent_watches.values().sum();
    let watch_list = agent_watches
        .iter()
        .map(|(k, v)| {
            let g = if k[0].is_empty() { "core" } else { &k[0] };
            format!("{}.{g} {:.2}", k[1], v / AGENTS as f64)
        })
        .collect::<Vec<_>>()
        .join(", ");

    // Policy propagation.
    c.monitors = Some(ChainMonitors::start(&c));
    std::thread::sleep(Duration::from_secs(1));
    let monitors = c.monitors.as_ref().unwrap();
    let (mut all, mut each, mut kubectl) = (Vec::new(), Vec::new(), Vec::new());
    let prop_cpu = |c: &Cluster| {
        let agents: f64 = c
            .agents
            .iter()
            .map(|a| cpu_seconds_with_children(a.ternd.pid()))
            .sum();
        (agents, c.api.apiserver_pid().map_or(0.0, cpu_seconds))
    };
    let (prop_cpu0, prop_t0) = (prop_cpu(&c), Instant::now());
    let threads0 = thread_cpu(c.agents[0].ternd.pid());
    for i in 0..SAMPLES {
        let name = format!("np-prop-{i}");
        let chain = ingress_chain(WEB_NS, &name);
        let start = Instant::now();
        c.api.apply(&propagation_policy(&name));
        kubectl.push(start.elapsed());
        let seen = monitors
            .wait_all(&chain, true, PROPAGATION_LIMIT)
            .unwrap_or_else(|e| {
                panic!(
                    "policy {name}: {e}; agent 0's chains:\n{}\n{}",
                    c.agents[0]
                        .ternd
                        .nft_table()
                        .lines()
                        .filter(|l| l.trim_start().starts_with("chain "))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    c.logs()
                )
            });
        let times: Vec<Duration> = seen.iter().map(|t| *t - start).collect();
        all.push(times.iter().copied().max().unwrap());
        each.extend(times);
        c.api
            .must(&["delete", "networkpolicy", "-n", WEB_NS, &name]);
        monitors
            .wait_all(&chain, false, PROPAGATION_LIMIT)
            .unwrap_or_else(|e| panic!("policy {name} deleted: {e}\n{}", c.logs()));
        std::thread::sleep(Duration::from_millis(200));
    }
    // Where an agent's time went, from its own log (`tern_agent::policy`'s "in force after"
    // line of each propagation policy): waiting for the engine, compiling, the kernel.
    let mut inside: [Vec<Duration>; 4] = Default::default();
    for a in &c.agents {
        for line in a.ternd.log().lines() {
            if !line.contains("np-prop-") || !line.contains(" in force after ") {
                continue;
            }
            let nums: Vec<u64> = line
                .split(|ch: char| !ch.is_ascii_digit())
                .rev()
                .filter(|w| !w.is_empty())
                .take(4)
                .filter_map(|w| w.parse().ok())
                .collect();
            // The last four numbers: total, waited, compiled, applied (read backwards).
            if let [applied, compiled, waited, total] = nums[..] {
                for (v, ms) in inside.iter_mut().zip([total, waited, compiled, applied]) {
                    v.push(Duration::from_millis(ms));
                }
            }
        }
    }
    let prop_wall = prop_t0.elapsed();
    let prop_cpu1 = prop_cpu(&c);
    let threads1 = thread_cpu(c.agents[0].ternd.pid());
    let mut by_thread: BTreeMap<String, f64> = BTreeMap::new();
    for (tid, (comm, t1)) in &threads1 {
        let t0 = threads0.get(tid).map_or(0.0, |x| x.1);
        *by_thread.entry(comm.clone()).or_default() += t1 - t0;
    }
    let mut by_thread: Vec<(String, f64)> =
        by_thread.into_iter().filter(|(_, v)| *v > 0.0).collect();
    by_thread.sort_by(|a, b| b.1.total_cmp(&a.1));
    let chains: Vec<usize> = c
        .agents
        .iter()
        .map(|a| {
            a.ternd
                .nft_table()
                .lines()
                .filter(|l| l.trim_start().starts_with("chain pol-"))
                .count()
        })
        .collect();

    // The DEL wave.
    let m4 = c.api.metrics();
    let (dels, del_wall) = wave(&c, |sock, sb| del_until_done(sock, &sb.att));
    let m5 = c.api.metrics();
    let failed: Vec<String> = dels
        .iter()
        .zip(&c.sandboxes)
        .filter_map(|((_, r), sb)| r.as_ref().err().map(|e| format!("{}: {e}", sb.name)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} DELs failed: {failed:#?}\n{}",
        failed.len(),
        c.logs()
    );
    let del_latency: Vec<Duration> = dels.iter().map(|(d, _)| *d).collect();
    let del_errors = error_kinds(dels.iter().filter_map(|(_, r)| r.as_ref().ok()).flatten());
    let del_requests = grown(&requests(&m4), &requests(&m5));
    let del_bytes = grown(&response_bytes(&m4), &response_bytes(&m5));
    let rss_end = rss_line(&c, "at the end");
    let problems = log_problems(&c);

    // Every figure, in one block.
    let total = |m: &BTreeMap<Vec<String>, f64>| m.values().sum::<f64>();
    let mib = |b: f64| b / 1_048_576.0;
    let list_blocks = |m: &BTreeMap<Vec<String>, f64>| {
        m.get(&vec![
            "LIST".to_string(),
            "ipamblocks".to_string(),
            "tern.dev".to_string(),
        ])
        .copied()
        .unwrap_or(0.0)
    };
    let distinct_routes: HashSet<usize> = routes.iter().copied().collect();
    let steady_secs = STEADY.as_secs_f64();
    let (add_secs, del_secs) = (add_wall.as_secs_f64(), del_wall.as_secs_f64());
    let add_net = net_of_background(&add_requests, &steady, steady_secs, add_secs);
    let add_bytes_net = net_of_background(&add_bytes, &steady_bytes, steady_secs, add_secs);
    let del_net = net_of_background(&del_requests, &steady, steady_secs, del_secs);
    let del_bytes_net = net_of_background(&del_bytes, &steady_bytes, steady_secs, del_secs);
    let mut out = vec![
        format!(
            "kube_scale: one kube-apiserver v1.34 + etcd, {AGENTS} ternd agents ({}{}), \
             {NODES} Node objects ({FAKE_NODES} fake), {PODS} Pods ({FAKE_PODS} on fake \
             nodes), {} namespaces, {BACKGROUND_POLICIES} NetworkPolicies; {} CPUs",
            tern_testkit::ternd::default_bin().display(),
            std::env::var("MALLOC_ARENA_MAX")
                .map(|v| format!(", MALLOC_ARENA_MAX={v}"))
                .unwrap_or_default(),
            NAMESPACES + 1,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
        "population (through the API server):".to_string(),
    ];
    out.extend(population.lines.iter().map(|l| format!("    {l}")));
    out.push(format!(
        "agents' start on the populated cluster, one after another: all {AGENTS} ready in \
         {:.1} s; each listening after {}; CPU meanwhile: kube-apiserver {:.0} s, the \
         agents {:.0} s; kernel routes (proto 84) per agent: {:?}",
        start_time.as_secs_f64(),
        ms_line(listen),
        api_cpu_start,
        agents_cpu_start,
        distinct_routes
    ));
    out.push(format!("    {rss_start}"));
    out.push(format!(
        "ADD wave: {} pods ({PODS_PER_AGENT} per agent, {WORKERS_PER_AGENT} at a time per \
         agent) up in {add_secs:.2} s = {:.1} allocations/s; time to a pod's address {}; \
         {n_attempts} ADDs, each {}",
        c.sandboxes.len(),
        n_adds / add_secs,
        ms_line(add_latency),
        ms_line(attempts),
    ));
    out.push(format!(
        "    failures on the way (a runtime's DEL and new sandbox after each): {add_errors:?}{}",
        if first_error.is_empty() {
            String::new()
        } else {
            format!(
                "; the first: {}",
                first_error.chars().take(200).collect::<String>()
            )
        }
    ));
    out.push(format!(
        "    conflicts (409 on ipamblocks/blockaffinities): {add_conflicts} = {:.3} per \
         allocation, by request: {:?}; blocks held per agent after the wave: {:?}",
        add_conflicts / n_adds,
        add_requests
            .iter()
            .filter(|(k, _)| k[3] == "409")
            .map(|(k, v)| (format!("{} {}", k[0], k[1]), *v))
            .collect::<Vec<_>>(),
        blocks_held,
    ));
    out.push(format!(
        "    API requests per ADD: {:.2} in the wave, {:.2} net of the agents' background (at \
         the steady state's rate): {}; LIST ipamblocks answers {:.0} KiB per ADD net",
        total(&add_requests) / n_adds,
        total(&add_net) / n_adds,
        per_verb_resource(&add_net, n_adds),
        list_blocks(&add_bytes_net) / n_adds / 1024.0,
    ));
    out.push(format!(
        "    status reports of the wave's pods (kubectl apply --server-side): {:.1} s",
        status_time.as_secs_f64()
    ));
    out.push(format!("    {rss_wave}"));
    out.push(format!("    {rss_steady}"));
    out.push(format!(
        "steady state ({} s, nothing changing): API requests {:.2}/s in all = {:.3}/s per \
         agent: {}",
        STEADY.as_secs(),
        steady_total / STEADY.as_secs_f64(),
        steady_total / STEADY.as_secs_f64() / AGENTS as f64,
        if steady.is_empty() {
            "none".to_string()
        } else {
            per_verb_resource(&steady, STEADY.as_secs_f64() * AGENTS as f64)
        }
    ));
    out.push(format!(
        "    API answers {:.2} MiB/s in all = {:.0} KiB/s per agent: {}",
        mib(total(&steady_bytes)) / STEADY.as_secs_f64(),
        total(&steady_bytes) / 1024.0 / STEADY.as_secs_f64() / AGENTS as f64,
        bytes_by_verb_resource(&steady_bytes, STEADY.as_secs_f64() * AGENTS as f64)
    ));
    out.push(format!(
        "    watch streams at the API server: {n_watches:.0} opened by the agents = {:.1} per \
         agent ({watch_list}); {:.0} before they started",
        n_watches / AGENTS as f64,
        total(&w_idle)
    ));
    out.push(format!(
        "    CPU: ternd {:.2} % of a core each (mean; max {:.2} %), kube-apiserver {:.1} %",
        cpu.iter().sum::<f64>() / AGENTS as f64 / STEADY.as_secs_f64() * 100.0,
        cpu.iter().copied().fold(0.0, f64::max) / STEADY.as_secs_f64() * 100.0,
        api_cpu / STEADY.as_secs_f64() * 100.0
    ));
    out.push(format!(
        "policy propagation, kubectl apply -> chain in inet tern ({SAMPLES} samples; nft \
         monitor): on all {AGENTS} agents {}; per agent ({} samples) {}; the kubectl process \
         alone {}",
        ms_line(all),
        each.len(),
        ms_line(each),
        ms_line(kubectl)
    ));
    let [t_total, t_wait, t_compile, t_apply] = inside;
    out.push(format!(
        "    inside each agent ({} applies, its log): watch event to rules in force {}; of \
         which waiting for the engine {}, compiling {}, the kernel (nft) {}",
        t_total.len(),
        ms_line(t_total),
        ms_line(t_wait),
        ms_line(t_compile),
        ms_line(t_apply)
    ));
    out.push(format!(
        "    CPU of the {SAMPLES} samples (each an apply and a delete, {:.1} s): the agents \
         {:.2} s ({:.0} ms per agent and sample, their nft included), kube-apiserver {:.2} s; \
         {:.0} % of the {} cores",
        prop_wall.as_secs_f64(),
        prop_cpu1.0 - prop_cpu0.0,
        (prop_cpu1.0 - prop_cpu0.0) * 1000.0 / (SAMPLES * AGENTS) as f64,
        prop_cpu1.1 - prop_cpu0.1,
        (prop_cpu1.0 - prop_cpu0.0 + prop_cpu1.1 - prop_cpu0.1) * 100.0
            / prop_wall.as_secs_f64()
            / std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    ));
    out.push(format!(
        "    agent 0's threads' CPU over the samples: {}",
        by_thread
            .iter()
            .map(|(t, v)| format!("{t} {:.0} ms", v * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push(format!(
        "    policy chains per agent after the samples: {:?}",
        chains.iter().copied().collect::<HashSet<_>>()
    ));
    out.push(format!(
        "DEL wave: {} pods in {del_secs:.2} s = {:.1} DELs/s; time to a successful DEL {} \
         (failed and retried: {del_errors:?})",
        c.sandboxes.len(),
        n_adds / del_secs,
        ms_line(del_latency),
    ));
    out.push(format!(
        "    API requests per DEL: {:.2} in the wave, {:.2} net of the background: {}; LIST \
         ipamblocks answers {:.0} KiB per DEL net",
        total(&del_requests) / n_adds,
        total(&del_net) / n_adds,
        per_verb_resource(&del_net, n_adds),
        list_blocks(&del_bytes_net) / n_adds / 1024.0,
    ));
    out.push(format!("    {rss_end}"));
    out.push(format!("logs: {problems}"));
    out.push(format!(
        "benchmark took {:.0} s",
        t0.elapsed().as_secs_f64()
    ));
    eprintln!("\n===== kube_scale summary =====\n{}\n", out.join("\n"));
}

/// The metrics parser the benchmark reads the API server with (no API server needed).
#[test]
fn prometheus_samples_parse() {
    let text = "# HELP x y\n# TYPE x counter\n\
        apiserver_request_total{code=\"409\",resource=\"ipamblocks\",verb=\"PUT\"} 7\n\
        apiserver_longrunning_requests{group=\"\",resource=\"pods\",verb=\"WATCH\"} 20\n\
        odd{msg=\"a \\\"quoted\\\", {braced} value\"} 1.5e3\n\
        plain 4 1700000000\n\nbroken{x=\"1\" 2\n";
    let s = tern_testkit::kube_api::parse_metrics(text);
    assert_eq!(s.len(), 4, "{s:?}");
    assert_eq!(s[0].name, "apiserver_request_total");
    assert_eq!(
        (s[0].label("code"), s[0].label("verb"), s[0].value),
        ("409", "PUT", 7.0)
    );
    assert_eq!((s[1].label("group"), s[1].label("resource")), ("", "pods"));
    assert_eq!(s[2].label("msg"), "a \"quoted\", {braced} value");
    assert_eq!(s[2].value, 1500.0);
    assert_eq!((s[3].name.as_str(), s[3].value), ("plain", 4.0));
    assert_eq!(s[3].label("none"), "");
}
