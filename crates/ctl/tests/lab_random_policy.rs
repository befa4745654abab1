//! Issue 21 on random policies, in a real two-node VXLAN lab (real `ternd`s, CNI plugin,
//! packets and flow records), against the independent evaluator of
//! `crates/policy/tests/randpol` (shared with `explain_random.rs`, included by path).
//!
//! One seeded world: the generator's three namespaces (their labels) and six pods (labels,
//! named ports; two per namespace, spread over both nodes, echo servers on TCP 80 and 8080).
//! The pods get the lab's addresses, and the nets the policies name are derived from them
//! (see the module doc of `randpol`). Then `ROUNDS` rounds, each with a fresh random set of
//! Kubernetes NetworkPolicies and tern (Global)NetworkPolicies written to the lab's store as
//! `ternctl apply` writes them (the previous round's deleted), and for every ordered pod pair on
//! TCP 80 and 8080:
//!
//! - (a) the probe's verdict is the evaluator's (egress at the client and ingress at the
//!   server combined), probed until every agent applied the round (`wait_for_matrices`);
//! - (b) the records of the last connection (egress at the client's node; ingress at the
//!   server's when egress let it through) carry that verdict and the evaluator's cause: the
//!   deciding policy (kind, namespace, name) and rule (`ingress[i]`, `egress[i]`), every
//!   selecting policy for a default deny, none for `no-policy`. A round whose matrices matched
//!   before every agent had its policies (right verdicts by another cause) is probed again
//!   until `STEP_DEADLINE`, as in netpol.rs;
//! - (c) `ternctl explain --lab ... -o json` (the binary) on a sample of pairs gives the
//!   evaluator's verdict and causes.
//!
//! The seed is printed; `TERN_RANDOM_SEED=0x...` replays a run (`TERN_RANDOM_FROM_ROUND=N`:
//! from round N alone), `TERN_RANDOM_SEED=clock` draws a new one; without it the run uses
//! `DEFAULT_SEED`. What the lab does not carry
//! (outside addresses, UDP and SCTP probes) is not probed; the policies still name them.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. The lab has a unique
//! name and is torn down by a guard, also when an assertion fails.
//!
//! `cargo build --bins && cargo test -p tern-ctl --test lab_random_policy -- --nocapture`

#[path = "../../policy/tests/randpol/mod.rs"]
mod randpol;

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use randpol::{Nets, World, leak, policy_json, random_namespaces, random_pods, random_policies};
use tern_api::flow::{FlowDirection, FlowPolicy, FlowQuery, FlowRecord, FlowVerdict};
use tern_lab::Encap;
use tern_lab::netpol::{self, Cell, K8sPod, L4, Matrix};
use tern_model::{EndpointPort, Kind};
use tern_policy::{Direction, Flow};
use tern_testkit::rng::Rng;

use common::Lab;
use common::flow_check::{self, Latest};

/// Rounds of random policies.
const ROUNDS: usize = 10;
/// Every this many rounds the namespaces, pods' labels and named ports are drawn again (the
/// pods keep their addresses), so the policies meet more than one labelling.
const ROUNDS_PER_WORLD: usize = 5;
/// The TCP ports every pod serves and every pair is probed on (`http` is 80 on some pods and
/// 8080 on others).
const PORTS: [u16; 2] = [80, 8080];
/// Pairs per round also asked of `ternctl explain`.
const EXPLAIN_SAMPLE: usize = 6;
/// Timeout of one probe; expected denials cost this much, so it is short.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a round may take to reach its matrices and records (policy propagates through
/// the store watch of both agents; only a failing round waits this long).
const STEP_DEADLINE: Duration = Duration::from_secs(10);

type Keys = Vec<(Kind, Option<String>, String)>;

/// The seed of a run without `TERN_RANDOM_SEED`: the one that found IPv4-only `notNets`
/// rules matching every IPv4 packet through their IPv6 copy (round 8: a record named
/// `egress[0]`, a Pass whose notNets excluded the pod, where the evaluator said `egress[2]`).
const DEFAULT_SEED: u64 = 0x2e31_c929_c1b2_4d55;

fn v4(ip: IpAddr) -> Ipv4Addr {
    match ip {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => panic!("pod address {a} is not IPv4"),
    }
}

/// A verdict and cause as [`World::cause`] gives them: allowed, the reason, and the policies
/// as sorted `Kind/namespace/name rule`.
type Cause = (bool, String, Vec<String>);

fn cause_of(allowed: bool, reason: &str, policies: &[FlowPolicy]) -> Cause {
    (
        allowed,
        reason.to_string(),
        flow_check::policy_names(policies),
    )
}

/// A record's verdict and cause.
fn record_cause(r: &FlowRecord) -> Cause {
    cause_of(
        r.verdict == FlowVerdict::Allowed,
        r.reason.as_str(),
        &r.policies,
    )
}

/// One direction of `ternctl explain -o json` (its policies read as a record's).
fn explained_cause(d: &serde_json::Value) -> Cause {
    let policies: Vec<FlowPolicy> =
        serde_json::from_value(d["policies"].clone()).unwrap_or_else(|e| {
            panic!("explain's policies are not kind/namespace/name/rule: {e}: {d}")
        });
    cause_of(
        d["verdict"] == "allowed",
        d["reason"].as_str().unwrap_or("?"),
        &policies,
    )
}

/// The evaluator's verdict and cause of one direction.
fn evaluator_cause(w: &World, f: &Flow, d: Direction) -> Cause {
    let (allowed, reason, policies) = w.cause(f, d);
    (allowed, reason.to_string(), policies)
}

/// A round: the lab, the world with the round's policies, the lab's pods (in the world's
/// order) and the probed ports.
#[derive(Clone, Copy)]
struct Round<'a> {
    lab: &'a Lab,
    w: &'a World,
    pods: &'a [K8sPod],
    combos: &'a [(L4, u16)],
}

impl Round<'_> {
    /// (b) for one round whose matrices hold: the problems of the last connection of every probed
    /// pair, and the pairs to probe again. Also counts the records compared.
    fn record_problems(self, since_ms: u64, checked: &mut u64) -> (Vec<Cell>, Vec<String>) {
        let Round {
            lab,
            w,
            pods,
            combos,
        } = self;
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
        let mut cells = Vec::new();
        for (ci, &(_, port)) in combos.iter().enumerate() {
            for (i, a) in pods.iter().enumerate() {
                for (j, b) in pods.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let cell = format!("tcp/{port} {} -> {}", a.id(), b.id());
                    let f = w.tcp_flow(i, j, port);
                    let newest = |d| latest.newest(d, a.ip, b.ip, "tcp", port);
                    let before = problems.len();
                    let mut check = |r: &FlowRecord, d: Direction| {
                        *checked += 1;
                        let want = evaluator_cause(w, &f, d);
                        if record_cause(r) != want {
                            problems.push(format!(
                                "  {cell}: {} record {:?}, evaluator {want:?}",
                                r.direction.as_str(),
                                record_cause(r),
                            ));
                        }
                    };
                    match newest(FlowDirection::Egress) {
                        None => problems.push(format!("  {cell}: no egress record")),
                        Some(eg) => {
                            check(eg, Direction::Egress);
                            let mut allowed = eg.verdict == FlowVerdict::Allowed;
                            if allowed {
                                match newest(FlowDirection::Ingress) {
                                    Some(ig) if ig.time + 1000 >= eg.time => {
                                        allowed = ig.verdict == FlowVerdict::Allowed;
                                        check(ig, Direction::Ingress);
                                    }
                                    _ => problems.push(format!(
                                        "  {cell}: egress allowed, no ingress record"
                                    )),
                                }
                            }
                            if allowed != w.allowed(&f) {
                                problems.push(format!(
                                    "  {cell}: records say {}, the evaluator {}",
                                    if allowed { "allowed" } else { "denied" },
                                    if w.allowed(&f) { "allowed" } else { "denied" }
                                ));
                            }
                        }
                    }
                    if problems.len() > before {
                        cells.push(Cell {
                            combo: ci,
                            from: i,
                            to: j,
                        });
                    }
                }
            }
        }
        (cells, problems)
    }

    /// (b) with re-probing: a pair whose records disagree is probed again (its records may come
    /// from before every agent applied the round) until `STEP_DEADLINE`.
    fn check_records(self, since_ms: u64, checked: &mut u64) -> Vec<String> {
        let Round { pods, combos, .. } = self;
        let t = Instant::now();
        loop {
            let mut n = 0;
            let (cells, mut problems) = self.record_problems(since_ms, &mut n);
            if problems.is_empty() || cells.is_empty() || t.elapsed() > STEP_DEADLINE {
                *checked += n;
                return problems;
            }
            std::thread::sleep(Duration::from_millis(300));
            if let Err(e) = netpol::probe_cells(pods, combos, &cells, PROBE_TIMEOUT) {
                problems.push(format!("  probing again: {e}"));
                return problems;
            }
        }
    }

    /// (c): `ternctl explain --lab NAME --from A --to B --port P/TCP -o json` against the
    /// evaluator, both directions and the overall verdict.
    fn explain_problem(self, i: usize, j: usize, port: u16) -> Option<String> {
        let Round { lab, w, pods, .. } = self;
        let (from, to) = (pods[i].id(), pods[j].id());
        let out = Command::new(common::ternctl())
            .args([
                "explain",
                "--lab",
                &lab.st.name,
                "--from",
                &from,
                "--to",
                &to,
            ])
            .args(["--port", &format!("{port}/TCP"), "-o", "json"])
            .env_remove("TERN_STORE")
            .output()
            .expect("ternctl runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                return Some(format!(
                    "  explain {from} -> {to} {port}/TCP: no JSON ({e}): {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        };
        let f = w.tcp_flow(i, j, port);
        let mut bad = Vec::new();
        for (d, key) in [
            (Direction::Egress, "egress"),
            (Direction::Ingress, "ingress"),
        ] {
            let want = evaluator_cause(w, &f, d);
            let got = explained_cause(&v[key]);
            if got != want {
                bad.push(format!("{key} explain {got:?}, evaluator {want:?}"));
            }
        }
        if (v["verdict"] == "allowed") != w.allowed(&f) {
            bad.push(format!("verdict explain {}", v["verdict"]));
        }
        (!bad.is_empty())
            .then(|| format!("  explain {from} -> {to} {port}/TCP: {}", bad.join("; ")))
    }
}

/// A pod's named ports as its WorkloadEndpoint carries them.
fn endpoint_ports(p: &randpol::Pod) -> Vec<EndpointPort> {
    p.ports
        .iter()
        .map(|(n, protocol, port)| EndpointPort {
            name: n.to_string(),
            protocol: *protocol,
            port: *port,
        })
        .collect()
}

/// The world's pods and namespaces.
fn describe_pods(w: &World) -> String {
    let mut s = String::from("pods:\n");
    for p in &w.pods {
        s += &format!(
            "  {}/{} {} labels {:?} ports {:?}\n",
            p.ns, p.name, p.ip, p.labels, p.ports
        );
    }
    s + &format!("namespaces: {:?}\n", w.ns_labels)
}

/// The world's pods and the round's policies, for a failure message.
fn describe(w: &World) -> String {
    let mut s = describe_pods(w) + "policies:\n";
    for p in &w.pols {
        s += &format!("  {}\n", policy_json(p));
    }
    s
}

#[test]
fn random_policies_in_a_lab_agree_with_the_independent_evaluator() {
    let bin = common::lab_ready();
    let seed = common::random_seed(DEFAULT_SEED);
    println!("lab_random_policy: seed {seed:#x} (replay with TERN_RANDOM_SEED={seed:#x})");
    let mut r = Rng(seed);
    let mut w = World {
        ns_labels: random_namespaces(&mut r),
        pods: random_pods(&mut r),
        pols: Vec::new(),
    };
    let started = Instant::now();
    let name = common::lab_name("rnd");
    let mut o = tern_lab::UpOptions::new(&name, bin);
    o.nodes = 2;
    o.encap = Encap::Vxlan;
    o.agent_timeout = Duration::from_secs(30);
    // Every probe's record is checked: no sampling.
    o.agent_args = flow_check::recording_agent_args();
    let mut lab = Lab::up(&o);
    for (ns, l) in &w.ns_labels {
        netpol::put_namespace(&lab.st, ns, l).unwrap();
    }
    let nodes = lab.st.nodes.len();
    let (mut pods, mut agent_labels) = (Vec::new(), Vec::new());
    for (i, p) in w.pods.iter_mut().enumerate() {
        let node = format!("node{}", i % nodes + 1);
        let pod = netpol::add_k8s_pod(&mut lab.st, &node, p.ns, &p.name, &p.labels)
            .unwrap_or_else(|e| panic!("add {}/{}: {e}{}", p.ns, p.name, lab.logs(15)));
        netpol::set_pod_ports(&lab.st, p.ns, &p.name, &endpoint_ports(p)).unwrap();
        // What the agent added (`tern.dev/*`), kept when the generator's labels change.
        let mut own = netpol::pod_labels(&lab.st, p.ns, &p.name).unwrap();
        own.retain(|k, _| !randpol::KEYS.contains(&k.as_str()));
        agent_labels.push(own);
        netpol::serve_in(&pod.netns, &PORTS, &[L4::Tcp]).unwrap();
        p.ip = v4(pod.ip);
        pods.push(pod);
    }
    // The nets: the pods' /16; the widest net that holds pod1 but not pod0 (IPAM blocks are
    // per node, so it may hold other pods too); pod1 alone.
    let (zero, one) = (w.pods[0].ip.to_bits(), w.pods[1].ip.to_bits());
    let part_len = (zero ^ one).leading_zeros() + 1;
    let net = |bits: u32, len: u32| {
        let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
        leak(&format!("{}/{len}", Ipv4Addr::from_bits(bits & mask)))
    };
    let nets = Nets {
        all: net(one, 16),
        part: net(one, part_len),
        one: net(one, 32),
    };
    assert!(
        w.pods.iter().all(|p| randpol::in_net(p.ip, nets.all)),
        "the pods are not all in {}: {}",
        nets.all,
        describe(&w)
    );
    println!(
        "lab_random_policy: {} pods on {nodes} nodes in {:.1}s; nets {nets:?}",
        pods.len(),
        started.elapsed().as_secs_f64()
    );
    let combos: Vec<(L4, u16)> = PORTS.iter().map(|&p| (L4::Tcp, p)).collect();
    let n = pods.len();
    let open: Vec<Matrix> = combos.iter().map(|_| vec![vec![true; n]; n]).collect();
    let (diffs, _) =
        netpol::wait_for_matrices(&pods, &combos, &open, PROBE_TIMEOUT, STEP_DEADLINE).unwrap();
    assert!(
        diffs.is_empty(),
        "without policies every pod must reach every pod:\n{}{}",
        diffs.join("\n"),
        lab.logs(15)
    );
    // `TERN_RANDOM_FROM_ROUND=N` replays a seed from round N alone: the earlier rounds are
    // drawn (and their labels set) but not applied or probed.
    let from_round: usize = std::env::var("TERN_RANDOM_FROM_ROUND")
        .map(|v| v.parse().expect("TERN_RANDOM_FROM_ROUND is a round number"))
        .unwrap_or(0);
    let mut sample = Rng(seed.rotate_left(29) | 1);
    let (mut keys, mut failed): (Keys, Vec<String>) = (Vec::new(), Vec::new());
    let (mut probes, mut records, mut explained, mut policies) = (0usize, 0u64, 0usize, 0usize);
    let mut denied = 0usize;
    for round in 0..ROUNDS {
        let t0 = Instant::now();
        netpol::delete_resources(&lab.st, &keys).unwrap();
        keys.clear();
        if round > 0 && round % ROUNDS_PER_WORLD == 0 {
            w.ns_labels = random_namespaces(&mut r);
            for (ns, l) in &w.ns_labels {
                netpol::put_namespace(&lab.st, ns, l).unwrap();
            }
            for ((p, new), own) in w
                .pods
                .iter_mut()
                .zip(random_pods(&mut r))
                .zip(&agent_labels)
            {
                p.labels = new.labels;
                p.ports = new.ports;
                let mut labels = own.clone();
                labels.extend(p.labels.clone());
                netpol::set_pod_labels(&lab.st, p.ns, &p.name, &labels).unwrap();
                netpol::set_pod_ports(&lab.st, p.ns, &p.name, &endpoint_ports(p)).unwrap();
            }
            print!(
                "lab_random_policy: new labels and ports\n{}",
                describe_pods(&w)
            );
        }
        w.pols = random_policies(&mut r, &nets);
        if round < from_round {
            continue;
        }
        policies += w.pols.len();
        for p in &w.pols {
            let text = policy_json(p).to_string();
            keys.extend(
                netpol::apply_yaml(&lab.st, &text).unwrap_or_else(|e| panic!("{e}: {text}")),
            );
        }
        let want: Vec<Matrix> = PORTS
            .iter()
            .map(|&port| {
                (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| i == j || w.allowed(&w.tcp_flow(i, j, port)))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        denied += want.iter().flatten().flatten().filter(|a| !**a).count();
        probes += combos.len() * n * (n - 1);
        let since = tern_ctl::commands::flows::now_ms();
        let mut problems = Vec::new();
        let (diffs, _) =
            netpol::wait_for_matrices(&pods, &combos, &want, PROBE_TIMEOUT, STEP_DEADLINE).unwrap();
        let matched = diffs.is_empty();
        let checks = Round {
            lab: &lab,
            w: &w,
            pods: &pods,
            combos: &combos,
        };
        problems.extend(diffs.into_iter().map(|d| format!("  probe: {d}")));
        if matched {
            problems.extend(checks.check_records(since, &mut records));
        }
        for _ in 0..EXPLAIN_SAMPLE {
            let i = sample.below(n);
            let j = (i + 1 + sample.below(n - 1)) % n;
            let port = sample.pick(&PORTS);
            explained += 1;
            problems.extend(checks.explain_problem(i, j, port));
        }
        println!(
            "lab_random_policy {} round {round} ({:.1}s): {} policies, {} of {} pairs denied",
            if problems.is_empty() { "PASS" } else { "FAIL" },
            t0.elapsed().as_secs_f64(),
            w.pols.len(),
            want.iter().flatten().flatten().filter(|a| !**a).count(),
            combos.len() * n * (n - 1),
        );
        if !problems.is_empty() {
            let shown = problems.len().min(12);
            failed.push(format!(
                "round {round}:\n{}{}\n{}",
                problems[..shown].join("\n"),
                if problems.len() > shown {
                    format!("\n  ... {} more", problems.len() - shown)
                } else {
                    String::new()
                },
                describe(&w)
            ));
        }
    }
    netpol::delete_resources(&lab.st, &keys).unwrap();
    println!(
        "lab_random_policy: seed {seed:#x}, {ROUNDS} rounds, {policies} policies, {probes} \
         probed pairs ({denied} denied), {records} flow records and {explained} ternctl explain \
         answers compared with the evaluator, {} rounds failed, {:.1}s in all",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "seed {seed:#x} (replay with TERN_RANDOM_SEED={seed:#x}), {} rounds failed:\n{}{}",
        failed.len(),
        failed.join("\n"),
        lab.logs(15)
    );
    assert!(records > 0, "no record compared");
}
