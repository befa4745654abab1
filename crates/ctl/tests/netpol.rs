//! Issue 5 proofs in one 3-node VXLAN lab (real `ternd`s, real CNI plugin, real packets):
//!
//! 1. Conformance: every case of `crates/testkit/data/netpol_cases.yaml` (upstream
//!    Kubernetes e2e truth tables, x/y/z x a/b/c, pods spread over the nodes), probed with TCP,
//!    UDP and (where the kernel has it) SCTP on ports 80 and 81; the diagonal must be allowed.
//! 2. First packet: a pod ADDed under deny-all ingress, with a sender hammering its
//!    pre-assigned address since before the ADD, receives nothing.
//! 3. Restart under load: while the receiving node's agent is killed and restarted, an allowed
//!    TCP flow keeps flowing (bounded longest gap) and a denied UDP flow never gets through.
//! 4. Flow records (issue 21): after each step of proof 1, every probe's last connection has
//!    its records on the agents (egress at the client's node; ingress at the server's when
//!    egress let it through) with the verdict the probe saw and the cause the independent
//!    evaluator (`PolicySet::explain` over the store's state) gives: the deciding rule for an
//!    allow or a deny by rule, every selecting policy for a default deny, none without policy
//!    (`common::flow_check`, shared with `lab_kube_netpol.rs`).
//! 5. Host and outside ends (issue 21; run after proof 1): a connection from node1's host to a
//!    pod on another node has an ingress record naming its source as node1's host; one from a
//!    pod to the lab's etcd (no node, no pod) an egress record naming its destination as
//!    outside.
//! 6. IPv6 (issue 22): proofs 1 and 4 again in an IPv6-only 3-node lab routed directly over
//!    the IPv6 underlay, every address IPv6 (`ipBlock`s too: /128 for the tables' /32). The two
//!    labs run one after the other.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. The lab has a unique
//! name and is torn down by a guard, also when an assertion fails.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_norway::Value;
use tern_api::flow::{FlowDirection, FlowQuery, FlowRecord, FlowVerdict};
use tern_lab::netns::in_netns;
use tern_lab::netpol::{self, K8sPod, L4, Matrix};
use tern_lab::traffic::Proto;
use tern_lab::{Encap, IpFamily, mesh};
use tern_model::{EndpointPort, Kind};

/// Timeout of one probe; expected denials cost this much, so it is short.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a step may take to reach its expected matrices (policy propagates through the
/// store watch of three agents; on a loaded machine, beside other labs, seconds). A step that
/// matches returns at once, so only a failing one waits this long.
const STEP_DEADLINE: Duration = Duration::from_secs(10);

mod common;
use common::Lab;
use common::flow_check::{self, Latest, Named, Probed};

use tern_testkit::conformance::labels;

/// The x/y/z model in the lab, with what a case may change and must be reset afterwards.
struct Model {
    pods: Vec<K8sPod>,
    ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// WorkloadEndpoint labels right after ADD (including the agent's `tern.dev/*`).
    pod_labels: BTreeMap<String, BTreeMap<String, String>>,
}

fn build_model(lab: &mut Lab, model: &Value, l4s: &[L4]) -> Model {
    let mut ns_labels = BTreeMap::new();
    for ns in model["namespaces"].as_sequence().unwrap() {
        let name = ns["name"].as_str().unwrap();
        let l = labels(&ns["labels"]);
        netpol::put_namespace(&lab.st, name, &l).unwrap();
        ns_labels.insert(name.to_string(), l);
    }
    let ports: Vec<EndpointPort> =
        serde_json::from_value(tern_testkit::conformance::endpoint_ports(model)).unwrap();
    let nodes = lab.st.nodes.len();
    let mut pods = Vec::new();
    let mut pod_labels = BTreeMap::new();
    for (i, p) in model["pods"].as_sequence().unwrap().iter().enumerate() {
        let ns = p["namespace"].as_str().unwrap();
        let name = p["name"].as_str().unwrap();
        // Round-robin: every namespace has a pod on every node.
        let node = format!("node{}", i % nodes + 1);
        let pod = netpol::add_k8s_pod(&mut lab.st, &node, ns, name, &labels(&p["labels"]))
            .unwrap_or_else(|e| panic!("add {ns}/{name}: {e}{}", lab.logs(15)));
        netpol::set_pod_ports(&lab.st, ns, name, &ports).unwrap();
        netpol::serve_in(&pod.netns, &[80, 81], l4s).unwrap();
        pod_labels.insert(pod.id(), netpol::pod_labels(&lab.st, ns, name).unwrap());
        pods.push(pod);
    }
    // The model lists pods in matrix_columns order; keep the columns' order explicitly.
    let cols = tern_testkit::conformance::matrix_columns(model);
    pods.sort_by_key(|p| cols.iter().position(|c| *c == p.id()).unwrap());
    Model {
        pods,
        ns_labels,
        pod_labels,
    }
}

/// What a case did that must be undone before the next.
#[derive(Default)]
struct CaseState {
    policies: Vec<(Kind, Option<String>, String)>,
    touched_ns: Vec<String>,
    touched_pods: Vec<String>,
}

fn apply_action(lab: &Lab, m: &Model, cs: &mut CaseState, action: &Value) {
    let (kind, arg) = action.as_mapping().unwrap().iter().next().unwrap();
    match kind.as_str().unwrap() {
        "create_policy" | "update_policy" => {
            let mut text = serde_norway::to_string(arg).unwrap();
            for p in &m.pods {
                let ip = format!("{{{{ip:{}}}}}", p.id());
                // The tables' one-address blocks are IPv4 /32s: /128 for an IPv6 pod. Their
                // wide blocks (/4) hold every pod address of either family.
                if p.ip.is_ipv6() {
                    text = text.replace(&format!("{ip}/32"), &format!("{}/128", p.ip));
                }
                text = text.replace(&ip, &p.ip.to_string());
            }
            let keys = netpol::apply_yaml(&lab.st, &text).unwrap();
            cs.policies.extend(keys);
        }
        "delete_all_policies" => {
            netpol::delete_resources(&lab.st, &cs.policies).unwrap();
            cs.policies.clear();
        }
        "add_namespace_labels" => {
            let ns = arg["namespace"].as_str().unwrap();
            let mut l = m.ns_labels[ns].clone();
            l.extend(labels(&arg["labels"]));
            netpol::put_namespace(&lab.st, ns, &l).unwrap();
            cs.touched_ns.push(ns.to_string());
        }
        "add_pod_labels" => {
            let pod = arg["pod"].as_str().unwrap();
            let (ns, name) = pod.split_once('/').unwrap();
            let mut l = netpol::pod_labels(&lab.st, ns, name).unwrap();
            l.extend(labels(&arg["labels"]));
            netpol::set_pod_labels(&lab.st, ns, name, &l).unwrap();
            cs.touched_pods.push(pod.to_string());
        }
        other => panic!("unknown action {other}"),
    }
}

fn reset(lab: &Lab, m: &Model, cs: &mut CaseState) {
    netpol::delete_resources(&lab.st, &cs.policies).unwrap();
    for ns in cs.touched_ns.drain(..) {
        netpol::put_namespace(&lab.st, &ns, &m.ns_labels[&ns]).unwrap();
    }
    for pod in cs.touched_pods.drain(..) {
        let (ns, name) = pod.split_once('/').unwrap();
        netpol::set_pod_labels(&lab.st, ns, name, &m.pod_labels[&pod]).unwrap();
    }
    cs.policies.clear();
}

/// The expected matrices of a step, for the transports this kernel can probe; the diagonal is
/// always allowed (the packet never leaves the pod).
fn expected(step: &Value, cols: &[String], l4s: &[L4]) -> (Vec<(L4, u16)>, Vec<Matrix>) {
    let mut combos = Vec::new();
    let mut want = Vec::new();
    for (pp, rows) in step["expected"].as_mapping().unwrap() {
        let (proto, port) = pp.as_str().unwrap().split_once('/').unwrap();
        let l4 = L4::parse(proto).unwrap();
        if !l4s.contains(&l4) {
            continue;
        }
        let mut mx = vec![vec![true; cols.len()]; cols.len()];
        for (from, row) in rows.as_mapping().unwrap() {
            let i = cols
                .iter()
                .position(|c| c == from.as_str().unwrap())
                .unwrap();
            for (j, g) in row.as_str().unwrap().chars().enumerate() {
                mx[i][j] = i == j || g == '.';
            }
        }
        combos.push((l4, port.parse().unwrap()));
        want.push(mx);
    }
    (combos, want)
}

/// Proof 4 for one step whose matrices hold: the last connection of every probed cell has
/// records with the probe's verdict and explain's cause. A round that matched before every
/// agent had the step's policies (its verdicts were right by another cause) is probed again,
/// as the matrices are, until `STEP_DEADLINE`. `since_ms`: before the step's probes.
fn check_records(
    lab: &Lab,
    m: &Model,
    combos: &[(L4, u16)],
    want: &[Matrix],
    since_ms: u64,
) -> Vec<String> {
    let t = Instant::now();
    loop {
        let (cells, mut problems) = record_problems(lab, m, combos, want, since_ms);
        if problems.is_empty() || cells.is_empty() || t.elapsed() > STEP_DEADLINE {
            return problems;
        }
        std::thread::sleep(Duration::from_millis(300));
        if let Err(e) = netpol::probe_cells(&m.pods, combos, &cells, PROBE_TIMEOUT) {
            problems.push(format!("  probing again: {e}"));
            return problems;
        }
    }
}

/// One check of proof 4: the cells with a problem (to probe again) and every problem.
fn record_problems(
    lab: &Lab,
    m: &Model,
    combos: &[(L4, u16)],
    want: &[Matrix],
    since_ms: u64,
) -> (Vec<netpol::Cell>, Vec<String>) {
    let mut cells = Vec::new();
    let state = tern_lab::cluster::with_store(&lab.st, |s| {
        tern_ctl::commands::explain::load(&*s)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap();
    let q = FlowQuery {
        after_seq: Some(0),
        since_ms: Some(since_ms),
        last: None,
    };
    let mut latest = Latest::default();
    let mut problems = Vec::new();
    for n in &lab.st.nodes {
        match tern_ctl::commands::flows::fetch(&n.socket, &q) {
            Ok(reply) => latest.add(reply.records),
            Err(e) => problems.push(format!("  records of {}: {e}", n.name)),
        }
    }
    let mut checked = 0u64;
    for (ci, &(l4, port)) in combos.iter().enumerate() {
        let (proto, protocol) = match l4 {
            L4::Tcp => ("tcp", tern_model::Protocol::Tcp),
            L4::Udp => ("udp", tern_model::Protocol::Udp),
            L4::Sctp => ("sctp", tern_model::Protocol::Sctp),
        };
        for (i, a) in m.pods.iter().enumerate() {
            for (j, b) in m.pods.iter().enumerate() {
                if i == j {
                    continue;
                }
                let x = state.set.explain(&tern_policy::Flow {
                    src: a.ip,
                    dst: b.ip,
                    protocol,
                    dst_port: port,
                });
                let cell = Probed {
                    what: format!("{}/{port} {} -> {}", l4.as_str(), a.id(), b.id()),
                    src: a.ip,
                    dst: b.ip,
                    proto,
                    port,
                    saw: want[ci][i][j],
                    explained: &x,
                };
                let p = flow_check::cell_problems(&latest, &cell, &mut checked);
                if !p.is_empty() {
                    problems.extend(p);
                    cells.push(netpol::Cell {
                        combo: ci,
                        from: i,
                        to: j,
                    });
                }
            }
        }
    }
    if checked == 0 {
        problems.push("  no record checked".into());
    }
    RECORDS_CHECKED.fetch_add(checked, Ordering::Relaxed);
    (cells, problems)
}

/// Records proof 4 compared with explain, over the whole run.
static RECORDS_CHECKED: AtomicU64 = AtomicU64::new(0);

/// Proof 1 (and 4). Returns the failed cases' reports.
fn conformance(lab: &Lab, m: &Model, doc: &Value, l4s: &[L4]) -> Vec<String> {
    let cols: Vec<String> = m.pods.iter().map(K8sPod::id).collect();
    let all: Vec<(L4, u16)> = l4s.iter().flat_map(|&l| [(l, 80), (l, 81)]).collect();
    let open: Vec<Matrix> = all
        .iter()
        .map(|_| vec![vec![true; cols.len()]; cols.len()])
        .collect();
    let (diffs, _) =
        netpol::wait_for_matrices(&m.pods, &all, &open, PROBE_TIMEOUT, Duration::from_secs(10))
            .unwrap();
    assert!(
        diffs.is_empty(),
        "without policies every pod must reach every pod:\n{}{}",
        diffs.join("\n"),
        lab.logs(15)
    );
    let mut failed = Vec::new();
    let started = Instant::now();
    let checked_before = RECORDS_CHECKED.load(Ordering::Relaxed);
    for case in doc["cases"].as_sequence().unwrap() {
        let id = case["id"].as_str().unwrap();
        let t0 = Instant::now();
        let mut cs = CaseState::default();
        let mut problems = Vec::new();
        for (si, step) in case["steps"].as_sequence().unwrap().iter().enumerate() {
            for a in step["actions"].as_sequence().unwrap() {
                apply_action(lab, m, &mut cs, a);
            }
            let (combos, want) = expected(step, &cols, l4s);
            let since = tern_ctl::commands::flows::now_ms();
            let (diffs, _) =
                netpol::wait_for_matrices(&m.pods, &combos, &want, PROBE_TIMEOUT, STEP_DEADLINE)
                    .unwrap();
            let matched = diffs.is_empty();
            for d in diffs {
                problems.push(format!("  step {si}: {d}"));
            }
            if matched {
                for p in check_records(lab, m, &combos, &want, since) {
                    problems.push(format!("  step {si} records:{p}"));
                }
            }
        }
        reset(lab, m, &mut cs);
        // Back to open before the next case, so its first round does not see this one.
        let (diffs, _) =
            netpol::wait_for_matrices(&m.pods, &all, &open, PROBE_TIMEOUT, STEP_DEADLINE).unwrap();
        for d in diffs {
            problems.push(format!("  after reset: {d}"));
        }
        let verdict = if problems.is_empty() { "PASS" } else { "FAIL" };
        println!(
            "netpol {verdict} {id} ({:.1}s) {}",
            t0.elapsed().as_secs_f64(),
            case["name"].as_str().unwrap_or("")
        );
        if !problems.is_empty() {
            let shown = problems.len().min(12);
            let more = problems.len() - shown;
            failed.push(format!(
                "{id}:\n{}{}",
                problems[..shown].join("\n"),
                if more > 0 {
                    format!("\n  ... {more} more")
                } else {
                    String::new()
                }
            ));
        }
    }
    println!(
        "netpol conformance: {} cases, {} failed, {:.1}s; {} flow records agreed with explain",
        doc["cases"].as_sequence().unwrap().len(),
        failed.len(),
        started.elapsed().as_secs_f64(),
        RECORDS_CHECKED.load(Ordering::Relaxed) - checked_before
    );
    failed
}

/// An address of the pool no pod has, for a pod whose address must be known before its ADD.
fn free_pool_ip(lab: &Lab) -> IpAddr {
    let used: Vec<String> = lab
        .st
        .pods
        .iter()
        .flat_map(|p| p.addresses.clone())
        .collect();
    (200..250)
        .map(|i| format!("10.244.{i}.77"))
        .find(|a| !used.contains(a))
        .unwrap()
        .parse()
        .unwrap()
}

/// Proof 2: a pod ADDed under deny-all ingress receives none of the datagrams a sender has
/// been firing at its (pre-assigned) address since before the ADD. Then the policy is deleted
/// and the same sender gets through, which shows the sender was reaching it all along.
fn first_packet(lab: &mut Lab, sender: &K8sPod) -> Result<String, String> {
    let ns = "fp";
    let nsl = BTreeMap::from([("ns".to_string(), ns.to_string())]);
    netpol::put_namespace(&lab.st, ns, &nsl).map_err(|e| e.to_string())?;
    let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: deny-all\n  namespace: fp\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n";
    let keys = netpol::apply_yaml(&lab.st, deny).map_err(|e| e.to_string())?;
    // Let every agent learn the policy before the pod exists (it is then enforced from ADD).
    std::thread::sleep(Duration::from_millis(500));
    let ip = free_pool_ip(lab);
    let recv_node = lab
        .st
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .find(|n| *n != sender.node)
        .unwrap();
    let p =
        netpol::create_pod_netns(&mut lab.st, &recv_node, ns, "r").map_err(|e| e.to_string())?;
    // The receiving socket exists before the pod has an interface: nothing can be missed.
    let sock = in_netns(&p.netns, || UdpSocket::bind("0.0.0.0:9000"))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let counter = {
        let (received, stop) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if sock.recv(&mut buf).is_ok() {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let sent = Arc::new(AtomicU64::new(0));
    let sender_thread = {
        let (sent, stop, netns) = (sent.clone(), stop.clone(), sender.netns.clone());
        std::thread::spawn(move || {
            in_netns(&netns, || {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                let target = SocketAddr::new(ip, 9000);
                while !stop.load(Ordering::Relaxed) {
                    // Errors (no route yet, ICMP unreachable) are expected before the ADD.
                    let _ = s.send_to(b"first-packet", target);
                    sent.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let before_add = sent.load(Ordering::Relaxed);
    let add = netpol::cni_add(&mut lab.st, ns, "r", &BTreeMap::new(), Some(ip));
    let result = (|| {
        let pod = add.map_err(|e| format!("ADD with a fixed address {ip}: {e}"))?;
        if pod.ip != ip {
            return Err(format!("asked for {ip}, got {}", pod.ip));
        }
        // Long enough for routes to reach the sender's node.
        std::thread::sleep(Duration::from_millis(1500));
        let during = received.load(Ordering::Relaxed);
        let sent_denied = sent.load(Ordering::Relaxed);
        if during != 0 {
            return Err(format!(
                "{during} of {sent_denied} datagrams reached a pod under deny-all ingress"
            ));
        }
        netpol::delete_resources(&lab.st, &keys).map_err(|e| e.to_string())?;
        let t = Instant::now();
        while received.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = received.load(Ordering::Relaxed);
        if after == 0 {
            return Err(
                "the sender never got through, even after the policy was deleted: the \
                        proof proves nothing"
                    .into(),
            );
        }
        Ok(format!(
            "first packet: {sent_denied} datagrams sent ({before_add} before ADD), 0 delivered \
             under deny-all; after deleting the policy the first arrived in {:.0} ms",
            t.elapsed().as_secs_f64() * 1000.0
        ))
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = counter.join();
    let _ = sender_thread.join();
    let _ = netpol::delete_resources(&lab.st, &keys);
    result
}

/// Proof 3: allowed TCP and denied UDP across nodes while the receiver's agent restarts.
fn restart_under_load(lab: &mut Lab, m: &Model) -> Result<String, String> {
    // x/a may only be reached from pods labelled pod=b (any namespace), on TCP 80.
    let policy = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: only-b\n  namespace: x\nspec:\n  podSelector:\n    matchLabels: {pod: a}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - namespaceSelector: {}\n      podSelector:\n        matchLabels: {pod: b}\n    ports:\n    - {protocol: TCP, port: 80}\n";
    let keys = netpol::apply_yaml(&lab.st, policy).map_err(|e| e.to_string())?;
    let by = |id: &str| m.pods.iter().find(|p| p.id() == id).unwrap().clone();
    let dst = by("x/a");
    let allowed_src = m
        .pods
        .iter()
        .find(|p| p.name == "b" && p.node != dst.node)
        .unwrap()
        .clone();
    let denied_src = m
        .pods
        .iter()
        .find(|p| p.name == "c" && p.node != dst.node)
        .unwrap()
        .clone();
    // Wait until the policy is in force on the receiving node.
    let t = Instant::now();
    loop {
        let ok = in_netns(&allowed_src.netns, || {
            netpol::probe(L4::Tcp, SocketAddr::new(dst.ip, 80), PROBE_TIMEOUT)
        })
        .map_err(|e| e.to_string())?
        .is_ok();
        let denied = in_netns(&denied_src.netns, || {
            netpol::probe(L4::Udp, SocketAddr::new(dst.ip, 80), PROBE_TIMEOUT)
        })
        .map_err(|e| e.to_string())?
        .is_err();
        if ok && denied {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            let _ = netpol::delete_resources(&lab.st, &keys);
            return Err(format!(
                "policy only-b not in force (allowed ok {ok}, denied {denied})"
            ));
        }
    }
    let run = Duration::from_secs(6);
    let interval = Duration::from_millis(10);
    let st = lab.st.clone();
    let (a, d) = std::thread::scope(|s| {
        let st2 = st.clone();
        let a = s.spawn(|| {
            mesh::probe_continuous_from(
                &st,
                &allowed_src.lab_pod,
                Proto::Tcp,
                SocketAddr::new(dst.ip, 80),
                interval,
                run,
            )
        });
        let d = s.spawn(move || {
            mesh::probe_continuous_from(
                &st2,
                &denied_src.lab_pod,
                Proto::Udp,
                SocketAddr::new(dst.ip, 80),
                interval,
                run,
            )
        });
        std::thread::sleep(Duration::from_millis(1000));
        let r = tern_lab::restart_agent(&mut lab.st, &dst.node, Duration::from_secs(20));
        (a.join().unwrap(), d.join().unwrap().map(|d| (d, r)))
    });
    let _ = netpol::delete_resources(&lab.st, &keys);
    let a = a.map_err(|e| e.to_string())?;
    let (d, restarted) = d.map_err(|e| e.to_string())?;
    restarted.map_err(|e| format!("restarting the agent of {}: {e}", dst.node))?;
    let line = format!("restart under load: allowed {a}; denied {d}");
    if a.longest_gap >= Duration::from_secs(1) || a.received == 0 {
        return Err(format!("allowed flow interrupted: {line}"));
    }
    if d.received != 0 {
        return Err(format!("denied flow got through: {line}"));
    }
    Ok(line)
}

/// `ternctl flows` on the lab (after proof 3): the denied records as JSON lines and as a table,
/// and the filters holding on what comes back.
fn flows_cli(lab: &Lab) -> Result<String, String> {
    let run = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(common::ternctl())
            .args(["flows", "--lab", &lab.st.name])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "ternctl flows {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // The last denied records, whatever denied them: the truth tables' steps and proof 3
    // leave many. (Proof 3's own denials cannot be relied on: the receiving agent restarts in
    // the middle of them, its ring starts empty, and records resolved after only-b is deleted
    // may name no policy.)
    let json = run(&["--verdict", "denied", "--last", "20", "-o", "json"])?;
    let denied: Vec<FlowRecord> = json
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a JSON line does not parse: {e}\n{json}"))?;
    if denied.is_empty() || denied.len() > 20 {
        return Err(format!("--last 20 gave {} denied records", denied.len()));
    }
    if let Some(r) = denied.iter().find(|r| r.verdict != FlowVerdict::Denied) {
        return Err(format!("--verdict denied gave {r:?}"));
    }
    // --policy: the records of a policy named by one of them, each naming it.
    let named = denied
        .iter()
        .rev()
        .find_map(|r| r.policies.first())
        .ok_or_else(|| format!("no denied record names a policy: {json}"))?;
    let policy = match &named.namespace {
        Some(ns) => format!("{ns}/{}", named.name),
        None => named.name.clone(),
    };
    let json = run(&["--policy", &policy, "--last", "20", "-o", "json"])?;
    let by_policy: Vec<FlowRecord> = json
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a JSON line does not parse: {e}\n{json}"))?;
    if by_policy.is_empty() {
        return Err(format!("--policy {policy} gave nothing"));
    }
    if let Some(r) = by_policy.iter().find(|r| {
        !r.policies
            .iter()
            .chain(r.pending.iter().flat_map(|p| p.policies.iter()))
            .any(|p| p.name == named.name && p.namespace == named.namespace)
    }) {
        return Err(format!(
            "--policy {policy} gave a record not naming it: {r:?}"
        ));
    }
    let table = run(&["--verdict", "denied", "--last", "3"])?;
    if table.lines().count() != 3 || !table.lines().all(|l| l.contains(" DENIED ")) {
        return Err(format!("the table of the last 3 denied:\n{table}"));
    }
    let filtered = run(&[
        "-n",
        "x",
        "--direction",
        "ingress",
        "--port",
        "80",
        "--last",
        "50",
        "-o",
        "json",
    ])?;
    let n = filtered.lines().count();
    for l in filtered.lines() {
        let r: FlowRecord = serde_json::from_str(l).map_err(|e| e.to_string())?;
        let in_x = [&r.src, &r.dst]
            .iter()
            .any(|e| e.namespace.as_deref() == Some("x"));
        if !in_x || r.direction != FlowDirection::Ingress || r.dst.port != Some(80) {
            return Err(format!("a record past the filters: {l}"));
        }
    }
    Ok(format!(
        "ternctl flows: {} denied records as JSON, {} naming {policy}, a table of 3, {n} \
         filtered (-n x --direction ingress --port 80); last denied: {}",
        denied.len(),
        by_policy.len(),
        table.lines().last().unwrap_or("")
    ))
}

/// Proof 5 (right after the cases: no policy in force, every agent up): node1's host
/// connecting to a pod on another node has an ingress record naming its source as node1's
/// host; a pod connecting to an address outside the cluster (the lab's etcd, else the
/// underlay's gateway) has an egress record naming its destination as outside.
fn host_and_outside(lab: &Lab, m: &Model) -> Result<String, String> {
    let since = tern_ctl::commands::flows::now_ms();
    let host = &lab.st.nodes[0];
    let pod = m
        .pods
        .iter()
        .find(|p| p.node != host.name)
        .ok_or("no pod on another node than node1")?;
    let client = &m.pods[0];
    let (out_ip, out_port) = match &lab.st.etcd {
        Some(e) => (e.address.clone(), 2379),
        None => (tern_lab::topology::UNDERLAY_GATEWAY.to_string(), 80),
    };
    let out_ip: IpAddr = out_ip.parse().map_err(|e| format!("{out_ip}: {e}"))?;
    // The answers do not matter (the gateway may refuse): the first packet is what is logged.
    let h = in_netns(&host.netns, || {
        netpol::probe(L4::Tcp, SocketAddr::new(pod.ip, 80), PROBE_TIMEOUT)
    })
    .map_err(|e| e.to_string())?;
    let _ = in_netns(&client.netns, || {
        netpol::probe(L4::Tcp, SocketAddr::new(out_ip, out_port), PROBE_TIMEOUT)
    })
    .map_err(|e| e.to_string())?;
    h.map_err(|e| format!("{} host -> {} {}:80: {e}", host.name, pod.id(), pod.ip))?;
    let host_conn = Named {
        what: "host to pod",
        direction: FlowDirection::Ingress,
        src: None,
        dst: pod.ip,
        proto: "tcp",
        port: 80,
    };
    let outside = Named {
        what: "pod to outside",
        direction: FlowDirection::Egress,
        src: Some(client.ip),
        dst: out_ip,
        proto: "tcp",
        port: out_port,
    };
    let q = FlowQuery {
        after_seq: Some(0),
        since_ms: Some(since),
        last: None,
    };
    // The agents read the kernel's log on their own threads: wait (bounded) for the records.
    let t = Instant::now();
    loop {
        let mut records = Vec::new();
        for n in &lab.st.nodes {
            let reply = tern_ctl::commands::flows::fetch(&n.socket, &q)
                .map_err(|e| format!("records of {}: {e}", n.name))?;
            records.extend(reply.records);
        }
        let r = flow_check::host_and_outside(&records, (&host_conn, &host.name), &outside);
        if r.is_ok() || t.elapsed() > Duration::from_secs(5) {
            return r;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One lab at a time: the tests' probes time out in 300 ms, and two labs probing at once on a
/// small machine would turn load into verdicts.
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A 3-node lab of `family` and `encap` whose agents record every flow, and the transports
/// its kernel can probe.
fn three_node_lab(prefix: &str, family: IpFamily, encap: Encap) -> (Lab, Vec<L4>) {
    let dir = common::lab_ready();
    let name = common::lab_name(prefix);
    let mut o = tern_lab::UpOptions::new(&name, dir);
    o.nodes = 3;
    o.encap = encap;
    o.ip_family = family;
    o.agent_timeout = Duration::from_secs(30);
    // Every probe's record is checked: no sampling, and room for a step's rounds.
    o.agent_args = flow_check::recording_agent_args();
    let lab = Lab::up(&o);
    let sctp = in_netns(&lab.st.nodes[0].netns, netpol::sctp_available).unwrap();
    let l4s: Vec<L4> = match &sctp {
        Ok(()) => vec![L4::Tcp, L4::Udp, L4::Sctp],
        Err(why) => {
            tern_testkit::kernel_limit(
                "sctp",
                format!("netpol ({family}) runs TCP and UDP only: {why}"),
            );
            vec![L4::Tcp, L4::Udp]
        }
    };
    (lab, l4s)
}

/// [`build_model`], timed.
fn model(lab: &mut Lab, doc: &Value, l4s: &[L4]) -> Model {
    let t0 = Instant::now();
    let m = build_model(lab, &doc["model"], l4s);
    println!(
        "netpol: model of {} pods on {} nodes ({}) built in {:.1}s",
        m.pods.len(),
        lab.st.nodes.len(),
        lab.st.ip_family,
        t0.elapsed().as_secs_f64()
    );
    m
}

/// Issue 22: proofs 1 and 4 (the truth tables, and every probe's flow records against the
/// evaluator) with IPv6 addresses: an IPv6-only lab, routed directly over the IPv6 underlay;
/// `ipBlock`s name the pods' IPv6 addresses (/128 for the tables' /32).
#[test]
fn netpol_truth_tables_in_ipv6_lab() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let doc: Value = tern_testkit::conformance::netpol_cases();
    let (mut lab, l4s) = three_node_lab("np6", IpFamily::Ipv6, Encap::None);
    let m = model(&mut lab, &doc, &l4s);
    assert!(
        m.pods.iter().all(|p| p.ip.is_ipv6()),
        "an IPv6-only lab's pods have IPv6 addresses: {:?}",
        m.pods.iter().map(|p| p.ip).collect::<Vec<_>>()
    );
    let failed = conformance(&lab, &m, &doc, &l4s);
    assert!(
        failed.is_empty(),
        "{} cases failed with IPv6 addresses:\n{}{}",
        failed.len(),
        failed.join("\n"),
        lab.logs(15)
    );
}

#[test]
fn netpol_proofs_in_three_node_lab() {
    let _one = ONE_LAB.lock().unwrap_or_else(|e| e.into_inner());
    let doc: Value = tern_testkit::conformance::netpol_cases();
    let (mut lab, l4s) = three_node_lab("np", IpFamily::Ipv4, Encap::Vxlan);
    let m = model(&mut lab, &doc, &l4s);
    let failed = conformance(&lab, &m, &doc, &l4s);
    // Before proof 3, which restarts an agent.
    let ho = host_and_outside(&lab, &m);
    println!("{}", ho.as_ref().unwrap_or_else(|e| e));
    let sender = m.pods[0].clone();
    let fp = first_packet(&mut lab, &sender);
    println!("{}", fp.as_ref().unwrap_or_else(|e| e));
    let rl = restart_under_load(&mut lab, &m);
    println!("{}", rl.as_ref().unwrap_or_else(|e| e));
    let fl = flows_cli(&lab);
    println!("{}", fl.as_ref().unwrap_or_else(|e| e));
    let mut problems = failed;
    problems.extend(fp.err().map(|e| format!("first packet: {e}")));
    problems.extend(rl.err().map(|e| format!("restart under load: {e}")));
    problems.extend(fl.err().map(|e| format!("ternctl flows: {e}")));
    problems.extend(ho.err().map(|e| format!("host and outside: {e}")));
    assert!(
        problems.is_empty(),
        "{} problems:\n{}{}",
        problems.len(),
        problems.join("\n"),
        lab.logs(15)
    );
}
