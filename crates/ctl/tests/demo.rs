//! `ternctl lab demo`, the README's main command, run as a process exactly as
//! `scripts/demo.sh` runs it: the default (3 nodes, `--encap none`, BGP) and `--encap vxlan`,
//! and a demo whose agents cannot start (it must exit non-zero and still tear down). Each
//! checks the exit code, the key lines of the output and that nothing of the lab is left
//! (namespaces, state directory). `ternctl lab demo --kubernetes` is tested in
//! `lab_kube_demo.rs` (the targets that need the Kubernetes components are named `*kube*`).
//!
//! Needs root; without it a test FAILS with what is missing. Every lab has a unique name, so they never collide with other labs.

use std::path::PathBuf;

mod common;

/// Root, and the plugin and agent binaries next to ternctl (checked current).
fn preconditions() -> PathBuf {
    common::root_and_binaries("the demo tests", "network namespaces").to_path_buf()
}

/// The `| Block | CIDR |` rows of `ipam show --show-blocks`.
fn ipam_blocks(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("| Block "))
        .filter_map(|l| l.split('|').nth(2).map(|c| c.trim().to_string()))
        .collect()
}

/// The checks both lab modes share: a block per node shown by ipam, every node's blocks routed
/// by node1, traffic between pods on different nodes, a clean PASS.
fn assert_lab_demo(out: &str, encap: &str) {
    assert!(
        out.contains(&format!(
            "lab up: 3 nodes, encap {encap}, store sqlite{}",
            if encap == "none" {
                ", BGP full mesh"
            } else {
                ""
            }
        )),
        "{out}"
    );
    // 6 pods (2 per node): every pod reaches the 5 others over TCP and UDP.
    let count = |prefix: &str| out.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("ok udp "), 30, "{out}");
    // 30 pod -> pod, plus node1 -> pod1 from every node and each pod from its own node.
    assert_eq!(count("ok tcp "), 30 + 3 + 5, "{out}");
    let cross = out
        .lines()
        .filter(|l| l.starts_with("ok ") && l.ends_with("[cross-node]"))
        .count();
    assert_eq!(cross, 48, "{out}");
    assert!(
        out.contains("ok cross-node: 48 probes between pods on different nodes"),
        "{out}"
    );
    assert!(out.contains("ok routes: node1 reaches every other node's blocks"));
    let via = if encap == "none" {
        "dev eth0 proto 85"
    } else {
        "dev vxlan.tern"
    };
    for n in ["node2", "node3"] {
        assert!(
            out.lines()
                .any(|l| l.contains(&format!("block of {n}, routed by node1")) && l.contains(via)),
            "node1 routes {n}'s block with {via:?}:\n{out}"
        );
    }
    let blocks = ipam_blocks(out);
    assert!(blocks.len() >= 3, "a block per node: {blocks:?}\n{out}");
    assert_eq!(
        common::nodes_with_blocks(out),
        ["node1", "node2", "node3"].map(String::from).into(),
        "{out}"
    );
    assert!(out.contains("PASS: all"), "{out}");
}

#[test]
fn demo_default_three_nodes_over_bgp() {
    let dir = preconditions();
    let name = common::lab_name("dd");
    let _g = common::Lab::guard(&name);
    // No arguments: exactly what `bash scripts/demo.sh` runs.
    let run = common::lab_demo(&name, &dir, &[]);
    let (ok, out, err) = (run.ok(), run.stdout, run.stderr);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert_lab_demo(&out, "none");
    assert!(out.contains("==> ternctl node status: BGP sessions of node1"));
    assert!(
        out.contains("ok bgp: node1 has 2 Established sessions"),
        "{out}"
    );
    assert!(out.matches("node-to-node mesh").count() == 2, "{out}");
    common::assert_lab_gone(&name);
}

#[test]
fn demo_vxlan() {
    let dir = preconditions();
    let name = common::lab_name("dv");
    let _g = common::Lab::guard(&name);
    let run = common::lab_demo(&name, &dir, &["--encap", "vxlan"]);
    let (ok, out, err) = (run.ok(), run.stdout, run.stderr);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert_lab_demo(&out, "vxlan");
    // No BGP with VXLAN unless asked for.
    assert!(!out.contains("node status"), "{out}");
    common::assert_lab_gone(&name);
}

#[test]
fn demo_fails_loudly_and_still_tears_down() {
    preconditions();
    // Agents that die at start-up: `lab up` fails after the namespaces exist.
    let fake = tempfile::tempdir().unwrap();
    for b in ["tern", "tern-ipam", "ternd"] {
        let p = fake.path().join(b);
        std::fs::write(&p, "#!/bin/sh\necho agent exploded >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let name = common::lab_name("df");
    let _g = common::Lab::guard(&name);
    let run = common::lab_demo(&name, fake.path(), &[]);
    let (ok, out, err) = (run.ok(), run.stdout, run.stderr);
    assert!(
        !ok,
        "a demo whose agents cannot start must fail:\n{out}\n{err}"
    );
    assert!(out.contains("FAILED: lab up"), "{out}");
    assert!(out.contains("FAIL: 1 of"), "{out}");
    assert!(out.contains("deleted namespace"), "teardown ran:\n{out}");
    common::assert_lab_gone(&name);
}
