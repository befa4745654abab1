//! NetworkPolicy on a real cluster, driven only through kubectl (issue 13): one
//! `ternctl lab up --nodes 2 --kubernetes` cluster (tern installed as its DaemonSet) for the
//! whole test binary, then
//!
//! 1. **Conformance**: every case of `crates/testkit/data/netpol_cases.yaml` (the
//!    upstream e2e truth tables: namespaces x/y/z, pods a/b/c, ports 80 and 81). The
//!    namespaces and pods are created with `kubectl apply` (pods round-robin over the nodes,
//!    so every namespace has pods on both), each case's policies applied with
//!    `kubectl apply -f`, its relabelling done with `kubectl label`, and every pair probed
//!    from the pods' network namespaces (`tern_lab::kube::probe`: a thread per probe, no
//!    process in the pod), over TCP and UDP (SCTP where the kernel has
//!    it), both to the server pod's address and, as upstream's probes do, to a ClusterIP
//!    Service in front of it (policy evaluated after kube-proxy's DNAT). Between cases every
//!    policy is deleted and every label restored, and the matrix must be open again. Prints a
//!    line per case with its pass count.
//! 2. **Policy on Service traffic**: a ClusterIP Service over two backends (one per node)
//!    and one over the node2 backend only, protected by an ingress policy: allowed clients on
//!    both nodes reach both backends through the Service, denied clients on both nodes reach
//!    neither (nor the pods directly); a client whose egress policy allows only the backend
//!    pods reaches them through the ClusterIP (egress evaluated on the DNATed destination)
//!    and nothing else.
//! 3. **Flow records** (issue 21), read as `ternctl flows --store kubernetes:///<admin
//!    kubeconfig>` reads them (each `tern-node` pod's agent through the API server's
//!    `pods/exec`): after each step of part 1 that the probes matched, both nodes' records
//!    are read once and every pod-to-pod probe's last connection must be on record (egress at
//!    the client's node; ingress at the server's when egress let it through) with the verdict
//!    the probe saw and the cause `explain` gives the cell (the deciding rule; the selecting
//!    policies of a default deny) — `common::flow_check`, shared with `netpol.rs`. After the
//!    cases, a connection from node1's host to a pod on node2 must be on record with its
//!    source named as node1's host, and one from a pod to the control plane's address (no node,
//!    no pod) with its destination named as outside.
//!
//! 4. **Random policies** (issue 21): [`RANDOM_ROUNDS`] seeded rounds (the seed is printed;
//!    `TERN_RANDOM_SEED=0x...` replays it, `TERN_RANDOM_SEED=clock` draws a new one) of one
//!    to four random Kubernetes NetworkPolicies over the same pods, drawn from the lab's own
//!    namespaces, labels, named ports and addresses and judged by the independent evaluator
//!    of `crates/policy/tests/randpol`
//!    (its `World` built from the lab). Each round's policies replace the previous round's
//!    (`kubectl apply`); the probes (TCP 80 and 81, pod and Service addresses) must show the
//!    evaluator's matrix, `explain` on the Kubernetes datastore must give every pod-to-pod
//!    cell the evaluator's verdict and cause in each direction, and every probe's last
//!    connection on record (through the API server) the verdict the probe saw and that cause.
//!
//! The servers are the upstream e2e image `agnhost` (`netexec`: HTTP and UDP servers that
//! answer their hostname; the probes ask as netexec's `/dial` does); `scripts/k8s-e2e.sh` builds it
//! and the lab imports it on every node. Needs root, the components of
//! `scripts/k8s-components.sh` and the agnhost image; without them the test FAILS naming what
//! is missing. The lab has a unique name and is removed by a guard, also when an assertion
//! fails.
//!
//! `cargo test -p tern-ctl --test lab_kube_netpol -- --nocapture`

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_norway::Value;
use tern_api::flow::{FlowDirection, FlowQuery, FlowRecord};
use tern_ctl::commands::flows::{Agent, Follower, Pages};
use tern_lab::kube;
use tern_lab::kube::probe::{self, Dial};
use tern_lab::netpol;

mod common;
#[path = "../../policy/tests/randpol/mod.rs"]
mod randpol;
use common::flow_check::{self, Latest, Named, Probed};
use common::kube_lab::KubeLab;

/// Nodes of the cluster; pods are spread round-robin.
const NODES: usize = 2;
/// How long one probe waits for its answer (a denied probe costs this much, all probes of a
/// round run at once).
const PROBE_SECS: u32 = 1;
/// How long a probe of a cell that a round saw closed waits when it is probed again, alone
/// (as long as netexec's own `/dial` waits).
const RETRY_SECS: u32 = 5;
/// How long a step may take to show its expected matrices (kubectl apply, the API server,
/// both nodes' ternd watches, nftables).
const STEP_DEADLINE: Duration = Duration::from_secs(25);

/// The cluster (removed when dropped) and what these cases ask of it.
struct Cluster {
    /// The network namespace of each probing pod (`ns/pod`), found on first use (see
    /// [`probe`]). Dropped before the lab.
    netns: Mutex<BTreeMap<String, Arc<File>>>,
    /// The agents `ternctl flows` asks (the `tern-node` pods, through the API server), found
    /// on the first read of records and kept while reads succeed. Used only from the control
    /// plane's namespace, so every connection of its client is made there.
    agents: Mutex<Option<Arc<Vec<Agent>>>>,
    lab: KubeLab,
}

impl Cluster {
    /// For a failure message: what every node's policy works from — tern's endpoints in the
    /// store (labels and addresses as the other nodes read them) and the address sets of each
    /// node's `inet tern` table.
    fn policy_view(&self) -> String {
        let st = self.lab.state();
        let (_, weps) =
            common::kube_lab::ternctl_store(&st, &["get", "workloadendpoints", "-o", "wide"]);
        let mut out = format!("\n--- tern's endpoints ---\n{weps}");
        for n in &st.nodes {
            let mut nft = tern_lab::process::netns_exec(&n.netns, std::path::Path::new("nft"));
            let table = tern_lab::process::run(nft.args(["list", "sets", "inet", "tern"]))
                .unwrap_or_else(|e| e.to_string());
            let sets: String = table.chars().take(6_000).collect();
            let _ = write!(out, "\n--- {} address sets ---\n{sets}", n.name);
        }
        out
    }
}

impl std::ops::Deref for Cluster {
    type Target = KubeLab;
    fn deref(&self) -> &KubeLab {
        &self.lab
    }
}

impl Cluster {
    /// Waits until every pod of `namespace` is Ready.
    fn wait_namespace_ready(&self, namespace: &str) {
        self.kubectl(&[
            "-n",
            namespace,
            "wait",
            "--for=condition=Ready",
            "pod",
            "--all",
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}{}",
                self.kubectl(&["-n", namespace, "describe", "pods"])
                    .unwrap_or_default(),
                self.diagnostics()
            )
        });
    }

    /// `namespace/name address` of every pod (or Service: `kind` "svc", ClusterIP) of the
    /// namespaces.
    fn addresses(&self, kind: &str, namespaces: &[&str]) -> BTreeMap<String, String> {
        let path = if kind == "svc" {
            "{.spec.clusterIP}"
        } else {
            "{.status.podIP}"
        };
        let mut out = BTreeMap::new();
        for ns in namespaces {
            let text = self.must(&[
                "-n",
                ns,
                "get",
                kind,
                "-o",
                &format!(r#"jsonpath={{range .items[*]}}{{.metadata.name}} {path}{{"\n"}}{{end}}"#),
            ]);
            for l in text.lines() {
                let (name, ip) = l.split_once(' ').unwrap_or((l, ""));
                assert!(!ip.is_empty(), "{kind} {ns}/{name} has no address");
                out.insert(format!("{ns}/{name}"), ip.to_string());
            }
        }
        out
    }

    /// The network namespace of pod `ns/pod` (looked up through the CRI on first use, then
    /// kept open).
    fn netns(&self, from: &str) -> Result<Arc<File>, String> {
        if let Some(f) = self.netns.lock().unwrap().get(from) {
            return Ok(f.clone());
        }
        let (ns, pod) = from.split_once('/').unwrap();
        let st = self.state();
        let k = st.kube.as_ref().ok_or("the lab has no Kubernetes state")?;
        let f = Arc::new(probe::pod_netns(k, ns, pod).map_err(|e| e.to_string())?);
        self.netns
            .lock()
            .unwrap()
            .insert(from.to_string(), f.clone());
        Ok(f)
    }

    /// Runs the probes of `reqs` from pod `ns/pod`'s network namespace, all at once:
    /// `(protocol, host, port)` with protocol `http`, `udp` or `sctp`, each asking the netexec
    /// server there for its hostname as netexec's `/dial` does, given `secs`. The answer of
    /// each (`None`: no answer).
    fn probe(
        &self,
        from: &str,
        reqs: &[(&str, String, u16)],
        secs: u32,
    ) -> Result<Vec<Option<String>>, String> {
        let netns = self.netns(from)?;
        let reqs: Vec<(Dial, SocketAddr)> = reqs
            .iter()
            .map(|(proto, host, port)| {
                let dial = match *proto {
                    "http" => Dial::Http,
                    "udp" => Dial::Udp,
                    _ => Dial::Sctp,
                };
                let ip: IpAddr = host.parse().map_err(|e| format!("address {host}: {e}"))?;
                Ok((dial, SocketAddr::new(ip, *port)))
            })
            .collect::<Result<_, String>>()?;
        probe::from_pod(&netns, from, &reqs, Duration::from_secs(secs.into()))
            .map_err(|e| e.to_string())
    }
}

use tern_testkit::conformance::labels as yaml_labels;

/// `s` as a YAML scalar that stays a string (`y` is a boolean to kubectl's YAML 1.1).
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// Labels as a YAML flow map of quoted strings.
fn flow(labels: &BTreeMap<String, String>) -> String {
    let items: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{}: {}", serde_json::json!(k), serde_json::json!(v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// A transport of the truth tables and how netexec's `/dial` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L4 {
    Tcp,
    Udp,
    Sctp,
}

impl L4 {
    fn parse(s: &str) -> L4 {
        match s {
            "TCP" => L4::Tcp,
            "UDP" => L4::Udp,
            "SCTP" => L4::Sctp,
            other => panic!("unknown protocol {other}"),
        }
    }
    fn dial(self) -> &'static str {
        match self {
            L4::Tcp => "http",
            L4::Udp => "udp",
            L4::Sctp => "sctp",
        }
    }
    fn k8s(self) -> &'static str {
        match self {
            L4::Tcp => "TCP",
            L4::Udp => "UDP",
            L4::Sctp => "SCTP",
        }
    }
    /// As flow records name it.
    fn record(self) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
            L4::Sctp => "sctp",
        }
    }
}

/// The x/y/z model on the cluster.
struct Model {
    /// Pod ids (`ns/name`) in matrix-column order.
    cols: Vec<String>,
    pod_ip: BTreeMap<String, String>,
    svc_ip: BTreeMap<String, String>,
    ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    pod_labels: BTreeMap<String, BTreeMap<String, String>>,
    node_of: BTreeMap<String, String>,
    l4s: Vec<L4>,
}

/// A server pod: one netexec container per port, serving HTTP (TCP), UDP (and SCTP) there,
/// with the model's named container ports.
fn model_pod(
    ns: &str,
    name: &str,
    node: &str,
    labels: &BTreeMap<String, String>,
    ports: &[(String, u16, L4)],
    l4s: &[L4],
) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n  namespace: {}\n  labels: {}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n",
        q(name),
        q(ns),
        flow(labels)
    );
    for port in [80u16, 81] {
        let mut args = format!("[netexec, --http-port={port}, --udp-port={port}");
        if l4s.contains(&L4::Sctp) {
            let _ = write!(args, ", --sctp-port={port}");
        }
        args.push(']');
        let _ = write!(
            y,
            "  - name: c{port}\n    image: {}\n    imagePullPolicy: Never\n    args: {args}\n    ports:\n",
            kube::AGNHOST_IMAGE
        );
        for (pname, p, l4) in ports {
            if *p == port && l4s.contains(l4) {
                let _ = writeln!(
                    y,
                    "    - {{name: {pname}, containerPort: {p}, protocol: {}}}",
                    l4.k8s()
                );
            }
        }
    }
    y
}

/// The ClusterIP Service in front of one model pod (all its ports).
fn model_service(ns: &str, name: &str, l4s: &[L4]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: {}\nspec:\n  selector: {{pod: {}}}\n  ports:\n",
        q(name),
        q(ns),
        q(name)
    );
    for l4 in l4s {
        for port in [80, 81] {
            let _ = writeln!(
                y,
                "  - {{name: {}-{port}, port: {port}, targetPort: {port}, protocol: {}}}",
                l4.dial(),
                l4.k8s()
            );
        }
    }
    y
}

fn build_model(c: &Cluster, model: &Value, l4s: &[L4]) -> Model {
    let mut ns_labels = BTreeMap::new();
    let mut namespaces = Vec::new();
    for ns in model["namespaces"].as_sequence().unwrap() {
        let name = ns["name"].as_str().unwrap().to_string();
        let l = yaml_labels(&ns["labels"]);
        c.apply(
            &format!("ns-{name}"),
            &format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n  labels: {}\n",
                q(&name),
                flow(&l)
            ),
        );
        ns_labels.insert(name.clone(), l);
        namespaces.push(name);
    }
    // Pods are created in a namespace only once its default ServiceAccount exists.
    for ns in &namespaces {
        common::wait_until(
            &format!("the default ServiceAccount of {ns}"),
            60,
            String::new,
            || {
                c.kubectl(&["-n", ns, "get", "serviceaccount", "default"])
                    .err()
            },
        );
    }
    let ports: Vec<(String, u16, L4)> = model["container_ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_u64().unwrap() as u16,
                L4::parse(p["protocol"].as_str().unwrap()),
            )
        })
        .collect();
    let mut pod_labels = BTreeMap::new();
    let mut node_of = BTreeMap::new();
    let mut all = String::new();
    for (i, p) in model["pods"].as_sequence().unwrap().iter().enumerate() {
        let ns = p["namespace"].as_str().unwrap();
        let name = p["name"].as_str().unwrap();
        let node = format!("node{}", i % NODES + 1);
        let labels = yaml_labels(&p["labels"]);
        all.push_str("---\n");
        all.push_str(&model_pod(ns, name, &node, &labels, &ports, l4s));
        all.push_str("---\n");
        all.push_str(&model_service(ns, name, l4s));
        pod_labels.insert(format!("{ns}/{name}"), labels);
        node_of.insert(format!("{ns}/{name}"), node);
    }
    c.apply("model", &all);
    let nss: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    for ns in &nss {
        c.wait_namespace_ready(ns);
    }
    let cols = tern_testkit::conformance::matrix_columns(model);
    Model {
        pod_ip: c.addresses("pod", &nss),
        svc_ip: c.addresses("svc", &nss),
        cols,
        ns_labels,
        pod_labels,
        node_of,
        l4s: l4s.to_vec(),
    }
}

/// One truth table: `(l4, port)` and `want[from][to]`.
struct Table {
    l4: L4,
    port: u16,
    want: Vec<Vec<bool>>,
}

/// A round's results: per table, `[from][to]` to the pod address and to its Service.
struct Round {
    pod: Vec<Vec<Vec<bool>>>,
    svc: Vec<Vec<Vec<bool>>>,
}

/// One round of probes: every source pod (in parallel) probes every destination, for every
/// table, at the pod address and the Service address.
fn probe_round(c: &Cluster, m: &Model, tables: &[Table]) -> Result<Round, String> {
    let n = m.cols.len();
    let mut reqs = Vec::new();
    for t in tables {
        for to in &m.cols {
            reqs.push((t.l4.dial(), m.pod_ip[to].clone(), t.port));
            reqs.push((t.l4.dial(), m.svc_ip[to].clone(), t.port));
        }
    }
    let answers: Vec<Result<Vec<Option<String>>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = m
            .cols
            .iter()
            .map(|from| {
                let reqs = &reqs;
                s.spawn(move || c.probe(from, reqs, PROBE_SECS))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut r = Round {
        pod: vec![vec![vec![false; n]; n]; tables.len()],
        svc: vec![vec![vec![false; n]; n]; tables.len()],
    };
    for (i, a) in answers.into_iter().enumerate() {
        let a = a?;
        for t in 0..tables.len() {
            for j in 0..n {
                r.pod[t][i][j] = a[(t * n + j) * 2].is_some();
                r.svc[t][i][j] = a[(t * n + j) * 2 + 1].is_some();
            }
        }
    }
    Ok(r)
}

/// A probe that did not show what its table wants: table, source and destination index,
/// through the Service or not.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Cell {
    table: usize,
    from: usize,
    to: usize,
    svc: bool,
}

/// How many times the cells a full round got wrong are probed again, alone and given
/// [`RETRY_SECS`], before the round counts as wrong ([`netpol::reprobe_wanted`] says when).
/// A round is over a thousand probes from nine pods at once; on a loaded machine some of
/// them miss their [`PROBE_SECS`] though the path is open (in one CI run, beside another
/// lab's probes, a third of a round), and a step whose every round has such misses never
/// matches. A cell that is truly wrong is wrong again when probed alone; a real verdict is
/// never rescued by a retry.
const CELL_RETRIES: usize = netpol::CELL_RETRIES;

/// Re-probes `cells` (each source pod's in parallel, all of one source's at once) and
/// returns those still not as wanted.
fn reprobe(
    c: &Cluster,
    m: &Model,
    tables: &[Table],
    cells: Vec<Cell>,
) -> Result<Vec<Cell>, String> {
    let mut by_from: BTreeMap<usize, Vec<Cell>> = BTreeMap::new();
    for cell in cells {
        by_from.entry(cell.from).or_default().push(cell);
    }
    let results: Vec<Result<Vec<Cell>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = by_from
            .into_iter()
            .map(|(from, cells)| {
                s.spawn(move || {
                    let reqs: Vec<(&str, String, u16)> = cells
                        .iter()
                        .map(|cell| {
                            let t = &tables[cell.table];
                            let to = &m.cols[cell.to];
                            let ip = if cell.svc {
                                &m.svc_ip[to]
                            } else {
                                &m.pod_ip[to]
                            };
                            (t.l4.dial(), ip.clone(), t.port)
                        })
                        .collect();
                    let answers = c.probe(&m.cols[from], &reqs, RETRY_SECS)?;
                    Ok(cells
                        .into_iter()
                        .zip(answers)
                        .filter(|(cell, a)| a.is_some() != want(tables, cell))
                        .map(|(cell, _)| cell)
                        .collect())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut still = Vec::new();
    for r in results {
        still.extend(r?);
    }
    Ok(still)
}

/// What `cell`'s table wants of it (a pod always reaches itself at its own address).
fn want(tables: &[Table], cell: &Cell) -> bool {
    (!cell.svc && cell.from == cell.to) || tables[cell.table].want[cell.from][cell.to]
}

/// Probes until the round matches `tables` or [`STEP_DEADLINE`] passes. Returns the
/// differences of the last round (empty: matched), the number of matching probes and the
/// number of probes. The diagonal (a pod to itself) is expected open at its own address
/// (the packet never leaves the pod) and not asserted through its Service (a hairpin,
/// which upstream does not assert either). The few cells a round gets wrong are probed
/// again alone ([`CELL_RETRIES`]) before the round counts as wrong. Also the cells the last
/// round saw otherwise than their table wants.
fn wait_tables(c: &Cluster, m: &Model, tables: &[Table]) -> (Vec<String>, usize, usize, Vec<Cell>) {
    let t0 = Instant::now();
    let n = m.cols.len();
    loop {
        let mut wrong = Vec::new();
        let mut total = 0;
        let mut failed = None;
        match probe_round(c, m, tables) {
            Err(e) => failed = Some(format!("probe round failed: {e}")),
            Ok(r) => {
                for (ti, _) in tables.iter().enumerate() {
                    for i in 0..n {
                        for j in 0..n {
                            // Through its own Service a pod is not probed (not counted).
                            for svc in if i == j {
                                &[false][..]
                            } else {
                                &[false, true][..]
                            } {
                                let cell = Cell {
                                    table: ti,
                                    from: i,
                                    to: j,
                                    svc: *svc,
                                };
                                total += 1;
                                let got = if *svc {
                                    r.svc[ti][i][j]
                                } else {
                                    r.pod[ti][i][j]
                                };
                                if got != want(tables, &cell) {
                                    wrong.push(cell);
                                }
                            }
                        }
                    }
                }
                // Many wrong cells: the step is still being applied; probe all again. Past the
                // deadline, cells wanted open and seen closed are probed again however many
                // (a loaded machine; an answer that came is never retried).
                let late = t0.elapsed() > STEP_DEADLINE;
                let misses = wrong.iter().all(|cell| want(tables, cell));
                if netpol::reprobe_wanted(wrong.len(), misses, total, late) {
                    for _ in 0..CELL_RETRIES {
                        match reprobe(c, m, tables, wrong.clone()) {
                            Ok(still) => wrong = still,
                            Err(e) => failed = Some(format!("probe failed: {e}")),
                        }
                        if wrong.is_empty() || failed.is_some() {
                            break;
                        }
                    }
                }
            }
        }
        let mut diffs: Vec<String> = failed.into_iter().collect();
        for cell in &wrong {
            let t = &tables[cell.table];
            let (from, to) = (&m.cols[cell.from], &m.cols[cell.to]);
            let (via, ip) = if cell.svc {
                ("Service ", &m.svc_ip[to])
            } else {
                ("", &m.pod_ip[to])
            };
            let want = want(tables, cell);
            diffs.push(format!(
                "{}/{} {from} -> {via}{to} ({ip}): want {}, got {}",
                t.l4.k8s(),
                t.port,
                verdict(want),
                verdict(!want)
            ));
        }
        let ok = total - wrong.len();
        if diffs.is_empty() || t0.elapsed() > STEP_DEADLINE {
            return (diffs, ok, total, wrong);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn verdict(open: bool) -> &'static str {
    if open { "allowed" } else { "denied" }
}

/// The truth tables of a step, for the transports probed.
fn step_tables(step: &Value, m: &Model) -> Vec<Table> {
    let mut out = Vec::new();
    for (pp, rows) in step["expected"].as_mapping().unwrap() {
        let (proto, port) = pp.as_str().unwrap().split_once('/').unwrap();
        let l4 = L4::parse(proto);
        if !m.l4s.contains(&l4) {
            continue;
        }
        let n = m.cols.len();
        let mut want = vec![vec![true; n]; n];
        for (from, row) in rows.as_mapping().unwrap() {
            let i = m
                .cols
                .iter()
                .position(|c| c == from.as_str().unwrap())
                .unwrap();
            for (j, g) in row.as_str().unwrap().chars().enumerate() {
                want[i][j] = g == '.';
            }
        }
        out.push(Table {
            l4,
            port: port.parse().unwrap(),
            want,
        });
    }
    out
}

fn open_tables(m: &Model) -> Vec<Table> {
    let n = m.cols.len();
    m.l4s
        .iter()
        .flat_map(|&l4| [80, 81].map(|port| (l4, port)))
        .map(|(l4, port)| Table {
            l4,
            port,
            want: vec![vec![true; n]; n],
        })
        .collect()
}

/// What a case changed besides its policies.
#[derive(Default)]
struct Touched {
    ns: Vec<String>,
    pods: Vec<String>,
}

fn apply_action(c: &Cluster, m: &Model, t: &mut Touched, action: &Value) -> Result<(), String> {
    let (kind, arg) = action.as_mapping().unwrap().iter().next().unwrap();
    match kind.as_str().unwrap() {
        "create_policy" | "update_policy" => {
            // As JSON: kubectl reads YAML 1.1, where the namespace `y` is a boolean.
            let mut text = serde_json::to_string(arg).map_err(|e| e.to_string())?;
            for (id, ip) in &m.pod_ip {
                text = text.replace(&format!("{{{{ip:{id}}}}}"), ip);
            }
            c.try_apply("policy", &text)?;
        }
        "delete_all_policies" => {
            c.kubectl(&["delete", "networkpolicy", "--all", "--all-namespaces"])?;
        }
        "add_namespace_labels" => {
            let ns = arg["namespace"].as_str().unwrap();
            label(
                c,
                &["label", "--overwrite", "namespace", ns],
                &arg["labels"],
            )?;
            t.ns.push(ns.to_string());
        }
        "add_pod_labels" => {
            let pod = arg["pod"].as_str().unwrap();
            let (ns, name) = pod.split_once('/').unwrap();
            let cmd = ["-n", ns, "label", "--overwrite", "pod", name];
            label(c, &cmd, &arg["labels"])?;
            t.pods.push(pod.to_string());
        }
        other => return Err(format!("unknown action {other}")),
    }
    Ok(())
}

/// `kubectl CMD k=v...` with the case's `labels`.
fn label(c: &Cluster, cmd: &[&str], labels: &Value) -> Result<String, String> {
    let kv: Vec<String> = yaml_labels(labels)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut args = cmd.to_vec();
    args.extend(kv.iter().map(String::as_str));
    c.kubectl(&args)
}

/// `kubectl label` arguments that turn `now` back into `want`.
fn relabel(now: &BTreeMap<String, String>, want: &BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = now
        .keys()
        .filter(|k| !want.contains_key(*k))
        .map(|k| format!("{k}-"))
        .collect();
    out.extend(
        want.iter()
            .filter(|(k, v)| now.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}={v}")),
    );
    out
}

fn current_labels(c: &Cluster, args: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let mut a = args.to_vec();
    a.extend(["-o", "jsonpath={.metadata.labels}"]);
    let text = c.kubectl(&a)?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{text}: {e}"))?;
    Ok(v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default())
}

/// Deletes every policy and restores the labels a case changed.
fn reset(c: &Cluster, m: &Model, t: &mut Touched) -> Result<(), String> {
    c.kubectl(&["delete", "networkpolicy", "--all", "--all-namespaces"])?;
    for ns in t.ns.drain(..) {
        let now = current_labels(c, &["get", "namespace", &ns])?;
        // The API server's own label stays as it is.
        let mut want = m.ns_labels[&ns].clone();
        if let Some(v) = now.get("kubernetes.io/metadata.name") {
            want.insert("kubernetes.io/metadata.name".into(), v.clone());
        }
        let kv = relabel(&now, &want);
        if !kv.is_empty() {
            let mut args = vec!["label", "--overwrite", "namespace", &ns];
            args.extend(kv.iter().map(String::as_str));
            c.kubectl(&args)?;
        }
    }
    for pod in t.pods.drain(..) {
        let (ns, name) = pod.split_once('/').unwrap();
        let now = current_labels(c, &["-n", ns, "get", "pod", name])?;
        let kv = relabel(&now, &m.pod_labels[&pod]);
        if !kv.is_empty() {
            let mut args = vec!["-n", ns, "label", "--overwrite", "pod", name];
            args.extend(kv.iter().map(String::as_str));
            c.kubectl(&args)?;
        }
    }
    Ok(())
}

/// Part 1; the failed cases' reports.
fn conformance(c: &Cluster, m: &Model, doc: &Value) -> Vec<String> {
    let open = open_tables(m);
    let t0 = Instant::now();
    let (diffs, ok, total, _) = wait_tables(c, m, &open);
    assert!(
        diffs.is_empty(),
        "without policies every pod must reach every pod and Service ({ok}/{total} after {:?}):\n{}{}",
        t0.elapsed(),
        diffs.join("\n"),
        c.diagnostics()
    );
    println!(
        "netpol: open matrix {ok}/{total} probes in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let cases = doc["cases"].as_sequence().unwrap();
    let mut failed = Vec::new();
    let (mut probes_ok, mut probes) = (0, 0);
    let mut explained = Explained::default();
    let started = Instant::now();
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let t1 = Instant::now();
        let mut touched = Touched::default();
        let mut problems = Vec::new();
        let (mut case_ok, mut case_total) = (0, 0);
        // The case's policies as `namespace/name`: what a denial may name.
        let mut policies = std::collections::BTreeSet::new();
        // One denial of the case goes through the ternctl binary too.
        let mut cli_done = false;
        for (si, step) in case["steps"].as_sequence().unwrap().iter().enumerate() {
            for a in step["actions"].as_sequence().unwrap() {
                if let Some(p) = a.get("create_policy").or_else(|| a.get("update_policy")) {
                    let meta = &p["metadata"];
                    let (ns, name) = (meta["namespace"].as_str(), meta["name"].as_str());
                    policies.insert(format!("{}/{}", ns.unwrap_or(""), name.unwrap_or("")));
                }
                if let Err(e) = apply_action(c, m, &mut touched, a) {
                    problems.push(format!("  step {si}: {e}"));
                }
            }
            let tables = step_tables(step, m);
            let since = tern_ctl::commands::flows::now_ms();
            let (diffs, ok, total, wrong) = wait_tables(c, m, &tables);
            case_ok += ok;
            case_total += total;
            // A step the probes matched: explain must give every pod-to-pod probe the
            // verdict it saw (a failed step is reported above already).
            // Then every such probe's last connection on record must carry the verdict the
            // probe saw and explain's cause.
            if diffs.is_empty() {
                let mut cells = Vec::new();
                let e = explain_step(
                    c,
                    m,
                    (&tables, &wrong),
                    (&policies, &mut cli_done),
                    &mut explained,
                    &mut cells,
                );
                problems.extend(e.into_iter().map(|d| format!("  step {si}: explain: {d}")));
                let r = records_step(c, m, &tables, &cells, since, &mut explained);
                problems.extend(
                    r.into_iter()
                        .map(|d| format!("  step {si}: records: {}", d.trim_start())),
                );
            }
            problems.extend(diffs.into_iter().map(|d| format!("  step {si}: {d}")));
        }
        if let Err(e) = reset(c, m, &mut touched) {
            problems.push(format!("  reset: {e}"));
        }
        // Open again before the next case, so its first round does not see this one.
        let (diffs, _, _, _) = wait_tables(c, m, &open);
        problems.extend(diffs.into_iter().map(|d| format!("  after reset: {d}")));
        probes_ok += case_ok;
        probes += case_total;
        println!(
            "netpol {} {id} {case_ok}/{case_total} ({:.1}s) {}",
            if problems.is_empty() { "PASS" } else { "FAIL" },
            t1.elapsed().as_secs_f64(),
            case["name"].as_str().unwrap_or("")
        );
        if !problems.is_empty() {
            let shown = problems.len().min(12);
            failed.push(format!(
                "{id}:\n{}{}",
                problems[..shown].join("\n"),
                if problems.len() > shown {
                    format!("\n  ... {} more", problems.len() - shown)
                } else {
                    String::new()
                }
            ));
        }
    }
    println!(
        "netpol conformance through kubectl: {} cases, {} passed, {} failed; {probes_ok}/{probes} probes as expected; {:.1}s",
        cases.len(),
        cases.len() - failed.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "netpol explain on the Kubernetes datastore: {} pod-to-pod probes ({} denied) judged as the probes saw them, {} through `ternctl explain`; state read {} times in {:.1}s",
        explained.cells,
        explained.denied,
        explained.cli,
        explained.loads,
        explained.time.as_secs_f64()
    );
    println!(
        "netpol flow records through the API server: {} records (egress and ingress of every pod-to-pod probe's last connection) agreed with the probes and with explain; {} reads of every node's records, {} cells probed again, {:.1}s",
        explained.records,
        explained.record_reads,
        explained.record_reprobes,
        explained.record_time.as_secs_f64()
    );
    failed
}

/// What the explain and record checks did, for the summary lines.
#[derive(Default)]
struct Explained {
    cells: usize,
    denied: usize,
    cli: usize,
    loads: usize,
    time: Duration,
    /// Records compared (the last check of each step).
    records: u64,
    /// Reads of every node's records through the API server.
    record_reads: usize,
    /// Cells probed again because their records were not (yet) the step's.
    record_reprobes: usize,
    record_time: Duration,
}

/// A pod-to-pod cell explain judged: what the probe saw and explain's answer.
struct Explains {
    cell: Cell,
    saw: bool,
    explanation: tern_policy::Explanation,
}

/// The policies an explanation's denying directions name, as `namespace/name`, and whether
/// each such direction has one.
fn denying_policies(e: &tern_ctl::commands::explain::Report) -> Vec<Vec<String>> {
    [&e.explanation.egress, &e.explanation.ingress]
        .into_iter()
        .filter(|d| d.verdict.as_str() == "denied")
        .map(|d| {
            d.policies
                .iter()
                .map(|p| format!("{}/{}", p.namespace.as_deref().unwrap_or(""), p.name))
                .collect()
        })
        .collect()
}

/// `ternctl explain` on the Kubernetes datastore against a step's probes: the policy state
/// read as `ternctl explain --store kubernetes:///<admin kubeconfig>` reads it (the API
/// server's namespaces and NetworkPolicies, tern's store for the endpoints derived from the
/// Pods; from the control plane's namespace, where that address is reachable), then every
/// pod-to-pod cell of `tables` (the pod to itself excepted: that packet never leaves the pod)
/// explained and compared with what the last round saw (its table's want, but for the
/// `wrong` cells). A denial must name, in each denying direction, policies and only
/// policies of the case (`policies`). The first denied cell is also run through the
/// `ternctl explain` binary (unless `cli_done`: once per case), whose JSON must say the same.
/// Every cell explained goes to `out` (for the records). Problems, one line each.
fn explain_step(
    c: &Cluster,
    m: &Model,
    (tables, wrong): (&[Table], &[Cell]),
    (policies, cli_done): (&std::collections::BTreeSet<String>, &mut bool),
    explained: &mut Explained,
    out: &mut Vec<Explains>,
) -> Vec<String> {
    let t0 = Instant::now();
    let st = c.state();
    let Some(k) = st.kube.as_ref() else {
        return vec!["the lab has no Kubernetes state".into()];
    };
    let url = st.store_url();
    let u = url.clone();
    let state = match tern_lab::netns::in_netns(&k.cp_netns, move || {
        tern_ctl::commands::explain::load_kubernetes(&u).map(|r| r.map_err(|e| format!("{e:#}")))
    }) {
        Ok(Some(Ok(s))) => s,
        Ok(Some(Err(e))) => return vec![format!("reading the state: {e}")],
        Ok(None) => return vec![format!("{url} is no Kubernetes datastore")],
        Err(e) => return vec![format!("reading the state: {e}")],
    };
    explained.loads += 1;
    let mut problems = Vec::new();
    for (ti, t) in tables.iter().enumerate() {
        let proto =
            tern_ctl::commands::explain::parse_port(&format!("{}/{}", t.port, t.l4.k8s())).unwrap();
        for (i, from) in m.cols.iter().enumerate() {
            for (j, to) in m.cols.iter().enumerate() {
                if i == j {
                    continue;
                }
                let cell = Cell {
                    table: ti,
                    from: i,
                    to: j,
                    svc: false,
                };
                let saw = want(tables, &cell) != wrong.contains(&cell);
                let what = format!("{}/{} {from} -> {to}", t.l4.k8s(), t.port);
                let r = match state.explain(from, to, proto) {
                    Ok(r) => r,
                    Err(e) => {
                        problems.push(format!("{what}: {e:#}"));
                        continue;
                    }
                };
                explained.cells += 1;
                out.push(Explains {
                    cell,
                    saw,
                    explanation: r.explanation.clone(),
                });
                let says = r.explanation.verdict.as_str();
                if says != verdict(saw) {
                    problems.push(format!(
                        "{what}: the probe saw {}, explain says {says}",
                        verdict(saw)
                    ));
                    continue;
                }
                if saw {
                    continue;
                }
                explained.denied += 1;
                let named = denying_policies(&r);
                if named
                    .iter()
                    .any(|d| d.is_empty() || d.iter().any(|p| !policies.contains(p)))
                {
                    problems.push(format!(
                        "{what}: denied, explain names {named:?}, the case's policies are {policies:?}"
                    ));
                }
                if !*cli_done {
                    *cli_done = true;
                    explained.cli += 1;
                    problems.extend(explain_cli(&st, &url, from, to, t, &named));
                }
            }
        }
    }
    explained.time += t0.elapsed();
    problems
}

/// `ternctl --store URL explain ... -o json` from node1's namespace for one denied cell: the
/// verdict is `denied` and the denying directions name `named`.
fn explain_cli(
    st: &tern_lab::LabState,
    url: &str,
    from: &str,
    to: &str,
    t: &Table,
    named: &[Vec<String>],
) -> Option<String> {
    let port = format!("{}/{}", t.port, t.l4.k8s());
    let run = common::kube_lab::ternctl_in(&st.nodes[0].netns)
        .args(["--store", url, "explain", "--from", from, "--to", to])
        .args(["--port", &port, "-o", "json"])
        .output()
        .expect("ternctl runs");
    let out = String::from_utf8_lossy(&run.stdout);
    let what = format!("`ternctl explain --from {from} --to {to} --port {port}`");
    let v: serde_json::Value = match serde_json::from_str(&out) {
        Ok(v) if run.status.success() => v,
        _ => {
            let err = String::from_utf8_lossy(&run.stderr);
            return Some(format!("{what} failed: {out}{err}"));
        }
    };
    let got: Vec<Vec<String>> = ["egress", "ingress"]
        .iter()
        .filter(|d| v[**d]["verdict"] == "denied")
        .map(|d| {
            v[*d]["policies"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p["namespace"].as_str().unwrap_or(""),
                        p["name"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .collect();
    (v["verdict"] != "denied" || got != named)
        .then(|| format!("{what}: want denied by {named:?}, got {out}"))
}

/// Every node's records since `since_ms` (every page, one exec each), read as `ternctl
/// flows --store kubernetes:///<admin kubeconfig>` reads them: `ternctl flows --agent-reply`
/// in each `tern-node` pod through the API server's `pods/exec` (from the control plane's
/// namespace, where the kubeconfig's address is reachable). The agents found are kept for the
/// next read (found again after a failed one).
fn read_records(c: &Cluster, since_ms: u64) -> Result<Vec<FlowRecord>, String> {
    let st = c.state();
    let k = st.kube.as_ref().ok_or("the lab has no Kubernetes state")?;
    let url = st.store_url();
    let known = c.agents.lock().unwrap().clone();
    let read = tern_lab::netns::in_netns(&k.cp_netns, move || {
        let agents = match known {
            Some(a) => a,
            None => Arc::new(
                tern_ctl::commands::flows::agents(&[], "", Some(&url))
                    .map_err(|e| format!("the agents of {url}: {e:#}"))?,
            ),
        };
        if agents.len() != NODES {
            return Err(format!("{} tern-node pods, {NODES} nodes", agents.len()));
        }
        let q = FlowQuery {
            since_ms: Some(since_ms),
            ..FlowQuery::default()
        };
        let mut out = Vec::new();
        for a in agents.iter() {
            let records = Follower::new(q.clone())
                .poll_node(a.node(), &mut |q| a.page(q))
                .map_err(|e| format!("records of {}: {e:#}", a.node()))?;
            out.extend(records);
        }
        Ok((agents, out))
    })
    .map_err(|e| e.to_string())?;
    let mut known = c.agents.lock().unwrap();
    match read {
        Ok((agents, out)) => {
            *known = Some(agents);
            Ok(out)
        }
        Err(e) => {
            *known = None;
            Err(e)
        }
    }
}

/// The records of a step the probes matched, against the probes and explain: every
/// pod-to-pod cell explain judged (`cells`) must have its last connection on record with the
/// verdict the probe saw and explain's cause ([`flow_check::cell_problems`]), read once from
/// both nodes (since `since_ms`, the step's start). A round that matched before every agent
/// had the step's policies has records with another cause: such cells are probed again (as
/// [`wait_tables`] does, and they must again show their table) and the records read again,
/// until [`STEP_DEADLINE`]; a disagreement that stays is a problem. Problems, one line each.
fn records_step(
    c: &Cluster,
    m: &Model,
    tables: &[Table],
    cells: &[Explains],
    since_ms: u64,
    explained: &mut Explained,
) -> Vec<String> {
    let t0 = Instant::now();
    let mut saw: Vec<bool> = cells.iter().map(|e| e.saw).collect();
    let problems = loop {
        explained.record_reads += 1;
        let records = match read_records(c, since_ms) {
            Ok(r) => r,
            Err(e) if t0.elapsed() > STEP_DEADLINE => break vec![format!(" {e}")],
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        let mut latest = Latest::default();
        latest.add(records);
        let mut checked = 0;
        let mut problems = Vec::new();
        let mut again = Vec::new();
        for (e, &saw) in cells.iter().zip(&saw) {
            let t = &tables[e.cell.table];
            let (from, to) = (&m.cols[e.cell.from], &m.cols[e.cell.to]);
            let ip = |p: &str| m.pod_ip[p].parse::<IpAddr>().unwrap();
            let probed = Probed {
                what: format!("{}/{} {from} -> {to}", t.l4.k8s(), t.port),
                src: ip(from),
                dst: ip(to),
                proto: t.l4.record(),
                port: t.port,
                saw,
                explained: &e.explanation,
            };
            let p = flow_check::cell_problems(&latest, &probed, &mut checked);
            if !p.is_empty() {
                problems.extend(p);
                again.push(e.cell);
            }
        }
        if problems.is_empty() || t0.elapsed() > STEP_DEADLINE {
            explained.records += checked;
            break problems;
        }
        std::thread::sleep(Duration::from_millis(300));
        explained.record_reprobes += again.len();
        match reprobe(c, m, tables, again.clone()) {
            // What the probes see now; a cell no longer as its table wants is a problem itself.
            Ok(still) => {
                for (e, saw) in cells.iter().zip(saw.iter_mut()) {
                    if again.contains(&e.cell) {
                        *saw = want(tables, &e.cell) != still.contains(&e.cell);
                    }
                }
            }
            Err(e) => break vec![format!(" probing again: {e}")],
        }
    };
    explained.record_time += t0.elapsed();
    let mut problems = problems;
    for (e, &saw) in cells.iter().zip(&saw) {
        if saw != want(tables, &e.cell) {
            let t = &tables[e.cell.table];
            problems.push(format!(
                " {}/{} {} -> {} probed again: want {}, got {}",
                t.l4.k8s(),
                t.port,
                m.cols[e.cell.from],
                m.cols[e.cell.to],
                verdict(!saw),
                verdict(saw)
            ));
        }
    }
    problems
}

/// Host and outside traffic named as such (after the cases: no policy in force): node1's host
/// connecting to a model pod on node2 has an ingress record naming its source as node1's
/// host, and a model pod connecting to the control plane's address (outside the cluster: no
/// node, no pod) an egress record naming its destination as outside; read through the API
/// server as the steps' records are.
fn host_and_outside(c: &Cluster, m: &Model) -> Result<String, String> {
    let st = c.state();
    let k = st.kube.as_ref().ok_or("the lab has no Kubernetes state")?;
    let host = &st.nodes[0];
    let pod = m
        .cols
        .iter()
        .find(|p| m.node_of[*p] != host.name)
        .ok_or("no model pod on another node than node1")?;
    let pod_ip: IpAddr = m.pod_ip[pod].parse().map_err(|e| format!("{e}"))?;
    let client = &m.cols[0];
    let out_ip: IpAddr = k.cp_address.parse().map_err(|e| format!("{e}"))?;
    let since = tern_ctl::commands::flows::now_ms();
    let timeout = Duration::from_secs(PROBE_SECS.into());
    // The answers do not matter (the API server speaks TLS): the first packet is logged.
    tern_lab::netns::in_netns(&host.netns, || {
        std::net::TcpStream::connect_timeout(&SocketAddr::new(pod_ip, 80), timeout)
    })
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("{} host -> {pod} {pod_ip}:80: {e}", host.name))?;
    c.probe(client, &[("http", out_ip.to_string(), 6443)], PROBE_SECS)?;
    let host_conn = Named {
        what: "host to pod",
        direction: FlowDirection::Ingress,
        src: None,
        dst: pod_ip,
        proto: "tcp",
        port: 80,
    };
    let client_ip: IpAddr = m.pod_ip[client].parse().map_err(|e| format!("{e}"))?;
    let outside = Named {
        what: "pod to outside",
        direction: FlowDirection::Egress,
        src: Some(client_ip),
        dst: out_ip,
        proto: "tcp",
        port: 6443,
    };
    // The agents read the kernel's log on their own threads: wait (bounded) for the records.
    let t = Instant::now();
    loop {
        let r = read_records(c, since).and_then(|records| {
            flow_check::host_and_outside(&records, (&host_conn, &host.name), &outside)
        });
        if r.is_ok() || t.elapsed() > Duration::from_secs(10) {
            return r.map(|l| format!("{l} ({:.1}s)", t.elapsed().as_secs_f64()));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

// ---------------------------------------------------------------- part 4

/// Rounds of random policies.
const RANDOM_ROUNDS: usize = 4;
/// The seed of a run without `TERN_RANDOM_SEED`.
const RANDOM_SEED: u64 = 0x6b72_616e_6421_0021;
/// The ports the random rounds probe (TCP; the servers' ports).
const RANDOM_PORTS: [u16; 2] = [80, 81];

fn l4_protocol(l4: L4) -> tern_model::Protocol {
    match l4 {
        L4::Tcp => tern_model::Protocol::Tcp,
        L4::Udp => tern_model::Protocol::Udp,
        L4::Sctp => tern_model::Protocol::Sctp,
    }
}

/// The lab's model as the evaluator's world, without policies: its namespaces' labels, its
/// pods (in matrix order) with their labels, addresses and named ports.
fn random_world(m: &Model) -> randpol::World {
    let ns_labels = m
        .ns_labels
        .iter()
        .map(|(ns, l)| {
            let mut l = l.clone();
            l.insert("kubernetes.io/metadata.name".into(), ns.clone());
            (randpol::leak(ns), l)
        })
        .collect();
    let ports: Vec<_> = m
        .l4s
        .iter()
        .flat_map(|&l4| {
            [80u16, 81].map(|p| {
                (
                    randpol::leak(&format!("serve-{p}-{}", l4.record())),
                    l4_protocol(l4),
                    p,
                )
            })
        })
        .collect();
    let pods = m
        .cols
        .iter()
        .map(|id| {
            let (ns, name) = id.split_once('/').unwrap();
            randpol::Pod {
                ns: randpol::leak(ns),
                name: name.to_string(),
                labels: m.pod_labels[id].clone(),
                ip: m.pod_ip[id].parse().unwrap(),
                ports: ports.clone(),
            }
        })
        .collect();
    randpol::World {
        ns_labels,
        pods,
        pols: Vec::new(),
    }
}

/// One label of a random pod of `w` (none: every pod), as a selector.
fn random_pod_selector(r: &mut tern_testkit::rng::Rng, w: &randpol::World) -> randpol::Labels {
    if r.chance(25) {
        return randpol::Labels::new();
    }
    let pod = &w.pods[r.below(w.pods.len())];
    let l: Vec<_> = pod.labels.iter().collect();
    let (k, v) = l[r.below(l.len())];
    randpol::Labels::from([(k.clone(), v.clone())])
}

/// One label of a random namespace of `w` (none: every namespace), as a selector.
fn random_ns_selector(r: &mut tern_testkit::rng::Rng, w: &randpol::World) -> randpol::Labels {
    if r.chance(25) {
        return randpol::Labels::new();
    }
    let l: Vec<_> = w.ns_labels.values().flat_map(|l| l.iter()).collect();
    let (k, v) = l[r.below(l.len())];
    randpol::Labels::from([(k.clone(), v.clone())])
}

/// A random Kubernetes rule over the lab: pod and namespace selectors of its labels, ipBlocks
/// of its addresses (the pods' /16 less one pod's /24; one pod's /32; an outside net), TCP
/// ports probed or not, by number, range or name, and UDP ones (never matching a probe).
fn random_lab_rule(r: &mut tern_testkit::rng::Rng, w: &randpol::World) -> randpol::K8sRule {
    use randpol::{Peer, PortSpec};
    use tern_model::Protocol;
    let net = |ip: std::net::Ipv4Addr, len: u8| {
        randpol::leak(&ipnet::Ipv4Net::new(ip, len).unwrap().trunc().to_string())
    };
    let peers = (0..r.below(3))
        .map(|_| match r.below(5) {
            0 => {
                let ip = w.pods[r.below(w.pods.len())].ip;
                let except = if r.chance(50) {
                    vec![net(ip, 24)]
                } else {
                    vec![]
                };
                Peer::Block(net(ip, 16), except)
            }
            1 => {
                let one = net(w.pods[r.below(w.pods.len())].ip, 32);
                Peer::Block(r.pick(&[one, "192.0.2.0/24"]), vec![])
            }
            _ => {
                let ns = r.chance(50).then(|| random_ns_selector(r, w));
                let pods = (ns.is_none() || r.chance(50)).then(|| random_pod_selector(r, w));
                Peer::Pods { ns, pods }
            }
        })
        .collect();
    let ports = (0..r.below(3))
        .map(|_| {
            let proto = r.pick(&[Protocol::Tcp, Protocol::Tcp, Protocol::Udp]);
            let spec = r.chance(80).then(|| match r.below(5) {
                0 => PortSpec::Range(80, 80),
                1 => PortSpec::Range(81, 81),
                2 => PortSpec::Range(81, 8080),
                3 => PortSpec::Named("serve-80-tcp"),
                _ => PortSpec::Named(r.pick(&["serve-81-tcp", "serve-80-udp"])),
            });
            (proto, spec)
        })
        .collect();
    randpol::K8sRule { peers, ports }
}

/// One to four random Kubernetes NetworkPolicies over the lab, named `rand<round>-<i>`.
fn random_lab_policies(
    r: &mut tern_testkit::rng::Rng,
    w: &randpol::World,
    round: usize,
) -> Vec<randpol::Pol> {
    let namespaces: Vec<&'static str> = w.ns_labels.keys().copied().collect();
    (0..1 + r.below(4))
        .map(|i| {
            let ns = r.pick(&namespaces);
            let pods = random_pod_selector(r, w);
            let (ingress, egress) = r.pick(&[(true, false), (false, true), (true, true)]);
            let mut rules =
                |on: bool| on.then(|| (0..r.below(3)).map(|_| random_lab_rule(r, w)).collect());
            let ingress = rules(ingress);
            let egress = rules(egress);
            randpol::Pol {
                kind: tern_model::Kind::K8sNetworkPolicy,
                ns: Some(ns),
                name: format!("rand{round}-{i}"),
                body: randpol::Body::K8s {
                    pods,
                    ingress,
                    egress,
                },
            }
        })
        .collect()
}

/// explain's answer for `cell` against the evaluator's, direction by direction (verdict,
/// reason, policies with the deciding rule). Problems, one line each.
fn explain_vs_evaluator(w: &randpol::World, t: &Table, e: &Explains) -> Vec<String> {
    let f = w.tcp_flow(e.cell.from, e.cell.to, t.port);
    [
        (tern_policy::Direction::Egress, &e.explanation.egress),
        (tern_policy::Direction::Ingress, &e.explanation.ingress),
    ]
    .into_iter()
    .filter_map(|(dir, d)| {
        let (allowed, reason, policies) = w.cause(&f, dir);
        let want = (allowed, reason.to_string(), policies);
        let (reason, policies) = flow_check::explained_cause(d);
        let got = (d.verdict.is_allowed(), reason, policies);
        (got != want).then(|| {
            format!(
                "TCP/{} {} -> {} {dir:?}: explain {got:?}, evaluator {want:?}",
                t.port, w.pods[e.cell.from].name, w.pods[e.cell.to].name
            )
        })
    })
    .collect()
}

/// Part 4. Problems, one line each (a round's lines name the seed and its policies).
fn random_policies(c: &Cluster, m: &Model) -> Vec<String> {
    let seed = common::random_seed(RANDOM_SEED);
    println!("netpol random: seed {seed:#x} (replay with TERN_RANDOM_SEED={seed:#x})");
    let t0 = Instant::now();
    let mut r = tern_testkit::rng::Rng(seed);
    let mut w = random_world(m);
    let mut explained = Explained::default();
    let (mut probes_ok, mut probes, mut agreed) = (0, 0, 0);
    let mut problems = Vec::new();
    for round in 0..RANDOM_ROUNDS {
        w.pols = random_lab_policies(&mut r, &w, round);
        let docs: Vec<_> = w.pols.iter().map(randpol::policy_json).collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
        let mut round_problems = Vec::new();
        let applied = c
            .kubectl(&["delete", "networkpolicy", "--all", "--all-namespaces"])
            .and_then(|_| c.try_apply(&format!("random-{round}"), &list.to_string()));
        if let Err(e) = applied {
            round_problems.push(e);
        }
        let n = w.pods.len();
        let tables: Vec<Table> = RANDOM_PORTS
            .iter()
            .map(|&port| Table {
                l4: L4::Tcp,
                port,
                want: (0..n)
                    .map(|i| (0..n).map(|j| w.allowed(&w.tcp_flow(i, j, port))).collect())
                    .collect(),
            })
            .collect();
        let since = tern_ctl::commands::flows::now_ms();
        let (diffs, ok, total, wrong) = wait_tables(c, m, &tables);
        probes_ok += ok;
        probes += total;
        round_problems.extend(diffs.iter().cloned());
        if diffs.is_empty() && round_problems.is_empty() {
            let policies: std::collections::BTreeSet<String> = w
                .pols
                .iter()
                .map(|p| format!("{}/{}", p.ns.unwrap_or(""), p.name))
                .collect();
            // The ternctl binary once per run (its JSON is the library's answer).
            let mut cli_done = round > 0;
            let mut cells = Vec::new();
            round_problems.extend(explain_step(
                c,
                m,
                (&tables, &wrong),
                (&policies, &mut cli_done),
                &mut explained,
                &mut cells,
            ));
            for e in &cells {
                let p = explain_vs_evaluator(&w, &tables[e.cell.table], e);
                if p.is_empty() {
                    agreed += 1;
                }
                round_problems.extend(p);
            }
            round_problems.extend(records_step(c, m, &tables, &cells, since, &mut explained));
        }
        if !round_problems.is_empty() {
            let shown = round_problems.len().min(12);
            problems.push(format!(
                "random round {round} (seed {seed:#x}): {} problems:\n  {}\n  policies: {}",
                round_problems.len(),
                round_problems[..shown].join("\n  "),
                list
            ));
        }
    }
    if let Err(e) = c.kubectl(&["delete", "networkpolicy", "--all", "--all-namespaces"]) {
        problems.push(format!("random: deleting the policies: {e}"));
    }
    println!(
        "netpol random policies: {RANDOM_ROUNDS} rounds (seed {seed:#x}), {probes_ok}/{probes} probes as the evaluator wants; {agreed}/{} pod-to-pod cells ({} denied) explained as the evaluator does; {} records agreed with the probes and the evaluator; {} rounds failed; {:.1}s",
        explained.cells,
        explained.denied,
        explained.records,
        problems.len(),
        t0.elapsed().as_secs_f64()
    );
    problems
}

// ---------------------------------------------------------------- part 2

const SVC_NS: &str = "svc";

/// A netexec pod in [`SVC_NS`]: servers on `port` (HTTP and UDP).
fn svc_pod(name: &str, node: &str, labels: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {SVC_NS}\n  labels: {labels}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: {}\n    imagePullPolicy: Never\n    args: [netexec, --http-port={port}, --udp-port={port}]\n",
        kube::AGNHOST_IMAGE
    )
}

fn svc(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {SVC_NS}\nspec:\n  selector: {selector}\n  ports:\n  - {{name: tcp, port: 80, targetPort: 80, protocol: TCP}}\n  - {{name: udp, port: 80, targetPort: 80, protocol: UDP}}\n"
    )
}

/// Only `access: "yes"` pods may reach the backends, on TCP and UDP 80.
const BACKEND_POLICY: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: backends, namespace: svc}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {access: "yes"}}
    ports:
    - {protocol: TCP, port: 80}
    - {protocol: UDP, port: 80}
"#;

/// `egress: web-only` pods may send only to the backends (by pod selector: a ClusterIP
/// passes only if egress is evaluated on the DNATed destination).
const EGRESS_POLICY: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-only, namespace: svc}
spec:
  podSelector: {matchLabels: {egress: web-only}}
  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {matchLabels: {app: web}}
    ports:
    - {protocol: TCP, port: 80}
    - {protocol: UDP, port: 80}
"#;

/// Tries per client and destination: enough that a two-backend Service shows both (a miss
/// of one has probability 2^-15).
const SVC_TRIES: usize = 16;

/// What one client must see at one destination: the backends (pod names) that answer.
struct Expect {
    from: &'static str,
    proto: &'static str,
    host: String,
    port: u16,
    what: String,
    want: Vec<String>,
}

fn expect(
    from: &'static str,
    proto: &'static str,
    host: &str,
    port: u16,
    what: &str,
    want: &[&str],
) -> Expect {
    Expect {
        from,
        proto,
        host: host.to_string(),
        port,
        what: what.to_string(),
        want: want.iter().map(|s| s.to_string()).collect(),
    }
}

/// Probes every expectation ([`SVC_TRIES`] times; one script per client in its exec session, all
/// clients at once) until all hold or [`STEP_DEADLINE`] passes; the ones that do not.
fn check(c: &Cluster, phase: &str, expect: &[Expect]) -> Vec<String> {
    let mut clients: Vec<&'static str> = expect.iter().map(|e| e.from).collect();
    clients.sort();
    clients.dedup();
    let t0 = Instant::now();
    loop {
        let answers: BTreeMap<&str, Result<Vec<Option<String>>, String>> =
            std::thread::scope(|s| {
                let hs: Vec<_> = clients
                    .iter()
                    .map(|&from| {
                        let reqs: Vec<(&str, String, u16)> = expect
                            .iter()
                            .filter(|e| e.from == from)
                            .flat_map(|e| (0..SVC_TRIES).map(|_| (e.proto, e.host.clone(), e.port)))
                            .collect();
                        s.spawn(move || {
                            (
                                from,
                                c.probe(&format!("{SVC_NS}/{from}"), &reqs, PROBE_SECS),
                            )
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
        let mut bad = Vec::new();
        let mut next: BTreeMap<&str, usize> = BTreeMap::new();
        for e in expect {
            let i = next.entry(e.from).or_default();
            let got = match &answers[e.from] {
                Err(err) => {
                    bad.push(format!("{phase}: {} -> {}: {err}", e.from, e.what));
                    continue;
                }
                Ok(a) => {
                    let mut g: Vec<String> =
                        a[*i..*i + SVC_TRIES].iter().flatten().cloned().collect();
                    g.sort();
                    g.dedup();
                    g
                }
            };
            *i += SVC_TRIES;
            if got != e.want {
                bad.push(format!(
                    "{phase}: {} -> {} over {}: want {:?}, got {got:?}",
                    e.from, e.what, e.proto, e.want
                ));
            }
        }
        if bad.is_empty() || t0.elapsed() > STEP_DEADLINE {
            return bad;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Part 2. Returns the lines to print or the problems.
fn service_policy(c: &Cluster) -> Result<Vec<String>, Vec<String>> {
    c.apply(
        "svc-ns",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {SVC_NS}\n"),
    );
    common::wait_until("the default ServiceAccount of svc", 60, String::new, || {
        c.kubectl(&["-n", SVC_NS, "get", "serviceaccount", "default"])
            .err()
    });
    let mut all = String::new();
    for (name, node, labels, port) in [
        ("web-1", "node1", "{app: web}", 80),
        ("web-2", "node2", "{app: web, tier: far}", 80),
        ("ok-1", "node1", "{access: \"yes\"}", 8080),
        ("ok-2", "node2", "{access: \"yes\"}", 8080),
        ("no-1", "node1", "{access: \"no\"}", 8080),
        ("no-2", "node2", "{}", 8080),
        ("eg-1", "node1", "{access: \"yes\", egress: web-only}", 8080),
    ] {
        all.push_str("---\n");
        all.push_str(&svc_pod(name, node, labels, port));
    }
    for (name, sel) in [("web", "{app: web}"), ("far", "{tier: far}")] {
        all.push_str("---\n");
        all.push_str(&svc(name, sel));
    }
    c.apply("svc-objects", &all);
    c.wait_namespace_ready(SVC_NS);
    let pods = c.addresses("pod", &[SVC_NS]);
    let svcs = c.addresses("svc", &[SVC_NS]);
    let web = &svcs["svc/web"];
    let far = &svcs["svc/far"];
    let web2 = &pods["svc/web-2"];
    let ok2 = &pods["svc/ok-2"];
    let clients = ["ok-1", "ok-2", "no-1", "no-2", "eg-1"];
    let both = ["web-1", "web-2"];
    let mut lines = Vec::new();
    let mut problems = Vec::new();

    // Before any policy: every client reaches both backends through `web`, web-2 through
    // `far` and directly; eg-1 reaches ok-2's server.
    let mut open = Vec::new();
    for cl in clients {
        for proto in ["http", "udp"] {
            open.push(expect(
                cl,
                proto,
                web,
                80,
                &format!("Service web {web}"),
                &both,
            ));
            open.push(expect(
                cl,
                proto,
                far,
                80,
                &format!("Service far {far}"),
                &["web-2"],
            ));
            open.push(expect(
                cl,
                proto,
                web2,
                80,
                &format!("pod web-2 {web2}"),
                &["web-2"],
            ));
        }
    }
    for proto in ["http", "udp"] {
        open.push(expect(
            "eg-1",
            proto,
            ok2,
            8080,
            &format!("pod ok-2 {ok2}:8080"),
            &["ok-2"],
        ));
    }
    let t0 = Instant::now();
    let bad = check(c, "no policy", &open);
    if !bad.is_empty() {
        problems.extend(bad);
        problems.push(c.diagnostics());
        return Err(problems);
    }
    lines.push(format!(
        "service policy: without policies {} clients reach both backends of web and the node2 backend of far over TCP and UDP ({:.1}s)",
        clients.len(),
        t0.elapsed().as_secs_f64()
    ));

    // The backends' ingress policy; the egress-restricted client's policy.
    if let Err(e) = c.try_apply(
        "svc-policies",
        &format!("{BACKEND_POLICY}---\n{EGRESS_POLICY}"),
    ) {
        return Err(vec![e]);
    }
    let t0 = Instant::now();
    let mut with = Vec::new();
    for cl in clients {
        let allowed = cl.starts_with("ok") || cl.starts_with("eg");
        let (b, f): (&[&str], &[&str]) = if allowed {
            (&both, &["web-2"])
        } else {
            (&[], &[])
        };
        for proto in ["http", "udp"] {
            with.push(expect(cl, proto, web, 80, &format!("Service web {web}"), b));
            with.push(expect(cl, proto, far, 80, &format!("Service far {far}"), f));
            // Directly too: the Service is no way around the policy.
            with.push(expect(cl, proto, web2, 80, &format!("pod web-2 {web2}"), f));
        }
    }
    // The egress-restricted client reaches nothing but the backends: not ok-2's server.
    for proto in ["http", "udp"] {
        with.push(expect(
            "eg-1",
            proto,
            ok2,
            8080,
            &format!("pod ok-2 {ok2}:8080"),
            &[],
        ));
    }
    let bad = check(c, "with policies", &with);
    if bad.is_empty() {
        lines.push(format!(
            "service policy: allowed clients on node1 and node2 reach both backends (one per node) through ClusterIP {web} and the node2 backend through {far}, over TCP and UDP; denied clients reach none, through the Services or directly; the egress-restricted client reaches the backends through the ClusterIPs and not ok-2 ({:.1}s after kubectl apply)",
            t0.elapsed().as_secs_f64()
        ));
    }
    problems.extend(bad);

    // Deleting the policies opens everything again.
    if let Err(e) = c.kubectl(&["-n", SVC_NS, "delete", "networkpolicy", "--all"]) {
        problems.push(e);
    }
    problems.extend(check(c, "policies deleted", &open));
    if problems.is_empty() {
        Ok(lines)
    } else {
        problems.push(c.policy_view());
        problems.push(c.diagnostics());
        Err(problems)
    }
}

#[test]
fn netpol_conformance_and_service_policy_through_kubectl() {
    let k8s = common::kube_preconditions("lab_kube_netpol");
    let agnhost = kube::images_dir(&k8s).join("agnhost.tar");
    assert!(
        agnhost.is_file(),
        "lab_kube_netpol needs the agnhost image {} (build it with `bash scripts/k8s-e2e.sh`)",
        agnhost.display()
    );
    let doc: Value = tern_testkit::conformance::netpol_cases();
    let t0 = Instant::now();
    let c = Cluster {
        netns: Mutex::default(),
        agents: Mutex::default(),
        lab: KubeLab::up("knp", &k8s, &["--nodes", &NODES.to_string()]),
    };
    println!(
        "netpol: lab up --nodes {NODES} --kubernetes in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let st = c.state();
    let sctp = tern_lab::netns::in_netns(&st.nodes[0].netns, netpol::sctp_available).unwrap();
    let l4s = match &sctp {
        Ok(()) => vec![L4::Tcp, L4::Udp, L4::Sctp],
        Err(why) => {
            tern_testkit::kernel_limit("sctp", format!("probing TCP and UDP only: {why}"));
            vec![L4::Tcp, L4::Udp]
        }
    };
    let t1 = Instant::now();
    let m = build_model(&c, &doc["model"], &l4s);
    println!(
        "netpol: 9 pods and 9 Services in x/y/z on {NODES} nodes in {:.1}s ({})",
        t1.elapsed().as_secs_f64(),
        m.cols
            .iter()
            .map(|p| format!("{p} {} {}", m.node_of[p], m.pod_ip[p]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut problems = conformance(&c, &m, &doc);
    match host_and_outside(&c, &m) {
        Ok(l) => println!("netpol records: {l}"),
        Err(e) => problems.push(format!("host and outside records: {e}")),
    }
    problems.extend(random_policies(&c, &m));
    match service_policy(&c) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(p) => problems.extend(p),
    }
    println!("netpol: total {:.1}s", t0.elapsed().as_secs_f64());
    assert!(
        problems.is_empty(),
        "{} problems:\n{}{}",
        problems.len(),
        problems.join("\n"),
        c.diagnostics()
    );
}
