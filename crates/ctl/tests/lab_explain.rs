//! `ternctl explain --lab NAME --probe` on a one-node lab (real `ternd`, CNI plugin,
//! nftables and packets): pods x/a, x/b and x/c (echo servers on TCP and UDP 80 in b and c),
//! a default-deny of ingress in x, and two allows (a to b on TCP 80; a to c on anything).
//! For an allowed and a denied pair over TCP, UDP and ICMP, the computed verdict and the
//! kernel's (a real connection from the source pod's namespace) must agree and be the
//! expected one, with the deciding policy named. Then, with the node's `inet tern` table
//! deleted behind the agent's back, the probe sees a denied pair get through: explain flags
//! the disagreement and exits 2.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. The lab has a
//! unique name and is torn down by a guard, also when an assertion fails.
//!
//! `cargo test -p tern-ctl --test lab_explain -- --nocapture`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tern_lab::netns::in_netns;
use tern_lab::netpol::{self, K8sPod, L4};

mod common;
use common::Lab;

const POLICIES: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-in, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-to-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{port: 80, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-to-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
";

/// `ternctl explain --lab NAME --probe ... -o json`: exit code and the report.
fn explain(lab: &str, from: &str, to: &str, port: &str) -> (i32, Value, String) {
    let out = Command::new(common::ternctl())
        .args(["explain", "--lab", lab, "--probe", "--probe-timeout", "1"])
        .args(["--from", from, "--to", to, "--port", port, "-o", "json"])
        .env_remove("TERN_STORE")
        .output()
        .expect("ternctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        v,
        format!("{stdout}{stderr}"),
    )
}

/// The policies named in the ingress explanation, as `name rule` (`a-to-b ingress[0]`).
fn ingress_policies(v: &Value) -> Vec<String> {
    v["ingress"]["policies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let rule = p["rule"].as_str().map(|r| format!(" {r}"));
                    format!(
                        "{}{}",
                        p["name"].as_str().unwrap_or("?"),
                        rule.unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn explain_probe_agrees_with_the_kernel_and_flags_a_disagreement() {
    let bin = common::lab_ready();
    let name = common::lab_name("expl");
    let mut o = tern_lab::UpOptions::new(&name, bin);
    o.nodes = 1;
    // No periodic resync: the table deleted at the end stays deleted while explain probes.
    o.resync_seconds = Some(3600);
    let t0 = Instant::now();
    let mut lab = Lab::up(&o);
    let x = BTreeMap::from([("ns".to_string(), "x".to_string())]);
    netpol::put_namespace(&lab.st, "x", &x).unwrap();
    let mut pods: BTreeMap<&str, K8sPod> = BTreeMap::new();
    for p in ["a", "b", "c"] {
        let labels = BTreeMap::from([("pod".to_string(), p.to_string())]);
        let pod = netpol::add_k8s_pod(&mut lab.st, "node1", "x", p, &labels)
            .unwrap_or_else(|e| panic!("add x/{p}: {e}{}", lab.logs(15)));
        if p != "a" {
            netpol::serve_in(&pod.netns, &[80], &[L4::Tcp, L4::Udp]).unwrap();
        }
        pods.insert(p, pod);
    }
    netpol::apply_yaml(&lab.st, POLICIES).unwrap();
    // The policy is in force once a reaches b and c does not (the agent's store watch, then
    // nftables).
    let reach = |from: &str, to: &str| {
        let target = SocketAddr::new(pods[to].ip, 80);
        in_netns(&pods[from].netns, move || {
            netpol::probe(L4::Tcp, target, Duration::from_millis(500)).is_ok()
        })
        .unwrap()
    };
    common::wait_until(
        "the policies in force",
        30,
        || lab.logs(20),
        || match (reach("a", "b"), reach("c", "b")) {
            (true, false) => None,
            got => Some(format!("a->b, c->b reachable: {got:?}")),
        },
    );
    println!(
        "lab up and policies in force in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    // (from, to, port, verdict, the ingress policies named)
    let cases = [
        ("x/a", "x/b", "80/TCP", "allowed", vec!["a-to-b ingress[0]"]),
        ("x/c", "x/b", "80/TCP", "denied", vec!["deny-in", "a-to-b"]),
        ("x/a", "x/b", "80/UDP", "denied", vec!["deny-in", "a-to-b"]),
        ("x/a", "x/c", "80/UDP", "allowed", vec!["a-to-c ingress[0]"]),
        ("x/a", "x/c", "ICMP", "allowed", vec!["a-to-c ingress[0]"]),
        ("x/b", "x/c", "ICMP", "denied", vec!["deny-in", "a-to-c"]),
    ];
    for (from, to, port, want, named) in &cases {
        let t = Instant::now();
        let (code, v, text) = explain(&name, from, to, port);
        let what = format!("{from} -> {to} {port}");
        assert_eq!(code, 0, "{what}: exit code\n{text}");
        assert_eq!(v["verdict"], *want, "{what}: computed verdict\n{text}");
        assert_eq!(v["probe"]["verdict"], *want, "{what}: the kernel's\n{text}");
        assert_eq!(v["probe"]["agrees"], true, "{what}\n{text}");
        assert_eq!(
            v["probe"]["from"],
            format!("tl-{name}-pod-x-{}", &from[2..]),
            "{what}\n{text}"
        );
        let mut got = ingress_policies(&v);
        got.sort();
        let mut named = named.clone();
        named.sort();
        assert_eq!(got, named, "{what}: deciding policies\n{text}");
        let reason = if *want == "allowed" {
            "rule"
        } else {
            "default-deny"
        };
        assert_eq!(v["ingress"]["reason"], reason, "{what}\n{text}");
        println!(
            "explain --probe {what}: {want} / kernel {} ({}) in {:.1}s",
            v["probe"]["verdict"],
            v["probe"]["detail"],
            t.elapsed().as_secs_f64()
        );
    }

    // The kernel no longer enforces (the table is gone; no resync puts it back): a pair the
    // policy denies gets through, and explain says so.
    let node = lab.st.nodes[0].netns.clone();
    let mut nft = tern_lab::process::netns_exec(&node, std::path::Path::new("nft"));
    tern_lab::process::run(nft.args(["delete", "table", "inet", "tern"])).unwrap();
    let (code, v, text) = explain(&name, "x/c", "x/b", "80/TCP");
    assert_eq!(code, 2, "a disagreement exits 2\n{text}");
    assert_eq!(v["verdict"], "denied", "{text}");
    assert_eq!(v["probe"]["verdict"], "allowed", "{text}");
    assert_eq!(v["probe"]["agrees"], false, "{text}");
    let table = Command::new(common::ternctl())
        .args([
            "explain", "--lab", &name, "--probe", "--from", "x/c", "--to", "x/b",
        ])
        .args(["--port", "80/TCP"])
        .env_remove("TERN_STORE")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!(
            "probe from tl-{name}-pod-x-c: ALLOWED (TCP connected): DISAGREES with the computed verdict DENIED"
        )),
        "{table}"
    );
    println!("explain --probe flags the disagreement once the table is gone:\n{table}");
}
