//! Measures rendering and applying 1,000 policies over 1,000 endpoints, and the latency of one
//! incremental change (a pod joining), in a private network namespace. Run as root:
//! `cargo run -p tern-policy --example nft_bench`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

use tern_model::{
    Action, EntityRule, NetworkPolicy, NetworkPolicySpec, PolicyType, Port, Protocol, Rule,
};
use tern_policy::{Endpoint, PolicySet, compile, render_delta};

fn nft(ns: &str, script: &str) {
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn nft");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write");
    assert!(c.wait().expect("wait").success(), "nft -f failed");
}

fn ep(i: u32, node: &str) -> Endpoint {
    Endpoint {
        namespace: format!("ns{}", i % 10),
        name: format!("pod{i}"),
        node: node.into(),
        interface: format!("tern{i:08}"),
        labels: BTreeMap::from([
            ("app".to_string(), format!("app{}", i % 100)),
            ("tier".to_string(), format!("t{}", i % 7)),
        ]),
        ips: vec![IpAddr::from([
            198,
            18,
            (i / 250) as u8 + 100,
            (i % 250) as u8 + 1,
        ])],
        ports: vec![],
    }
}

fn main() {
    let ns = format!("tpol-bench-{}", std::process::id());
    assert!(
        Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .expect("ip")
            .success()
    );
    let mut set = PolicySet::new();
    // 1,000 endpoints, all on this node (the worst case: every policy is compiled).
    for i in 0..1000 {
        set.upsert_endpoint(ep(i, "n1"));
    }
    for i in 0..1000u32 {
        let mut p = NetworkPolicy::new(
            format!("p{i}"),
            NetworkPolicySpec {
                order: Some(f64::from(i)),
                selector: format!("app == 'app{}'", i % 100),
                types: vec![PolicyType::Ingress],
                ingress: vec![Rule {
                    action: Action::Allow,
                    protocol: Some(Protocol::Tcp),
                    source: EntityRule {
                        selector: Some(format!("tier == 't{}'", i % 7)),
                        ..EntityRule::default()
                    },
                    destination: EntityRule {
                        ports: vec![Port::Range(8000 + (i % 50) as u16, 8000 + (i % 50) as u16)],
                        ..EntityRule::default()
                    },
                }],
                egress: vec![],
            },
        );
        p.metadata.namespace = Some(format!("ns{}", i % 10));
        set.upsert_tern_policy(&p).expect("valid policy");
    }
    let t = Instant::now();
    let rs = compile(&set, "n1");
    let script = rs.render_full();
    let render = t.elapsed();
    let t = Instant::now();
    nft(&ns, &script);
    let apply = t.elapsed();
    println!(
        "full: {} chains, {} sets, {} lines; compile+render {:?}, nft apply {:?}",
        rs.chains.len(),
        rs.sets.len(),
        script.lines().count(),
        render,
        apply
    );
    // A pod joins on another node and is selected by existing source selectors.
    let t = Instant::now();
    set.upsert_endpoint(ep(1000, "n2"));
    let rs2 = compile(&set, "n1");
    let delta = render_delta(&rs, &rs2);
    let render = t.elapsed();
    let t = Instant::now();
    nft(&ns, &delta);
    println!(
        "incremental (remote pod joins): {} lines; compile+diff {:?}, nft apply {:?}",
        delta.lines().count(),
        render,
        t.elapsed()
    );
    // A local pod joins: its chain, map entry and set elements.
    let t = Instant::now();
    set.upsert_endpoint(ep(1010, "n1"));
    let rs3 = compile(&set, "n1");
    let delta = render_delta(&rs2, &rs3);
    let render = t.elapsed();
    let t = Instant::now();
    nft(&ns, &delta);
    println!(
        "incremental (local pod joins): {} lines; compile+diff {:?}, nft apply {:?}",
        delta.lines().count(),
        render,
        t.elapsed()
    );
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
}
