//! `ternctl lab demo`, the README's main command, run as a process exactly as
//! `scripts/demo.sh` runs it: the default (3 nodes, `--encap none`, BGP) and `--encap vxlan`,
//! a demo whose agents cannot start (it must exit non-zero and still tear down), and
//! `ternctl lab demo --kubernetes` on a real 3-node cluster (the components of
//! `scripts/k8s-components.sh`). Each checks the exit code, the key lines of the output and
//! that nothing of the lab is left (namespaces, state directory; for Kubernetes cgroups and
//! kubelet's sysctls too).
//!
//! Needs root; without it (or, for `--kubernetes`, without the components) a test FAILS with
//! what is missing. Every lab has a unique name, so they never collide with other labs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod common;

/// Root, and the plugin and agent binaries next to ternctl (rebuilt when stale).
fn preconditions() -> PathBuf {
    common::root_and_binaries("the demo tests", "network namespaces").to_path_buf()
}

/// A lab name of our own.
fn lab_name(tag: &str) -> String {
    format!("{tag}{}", tern_lab::process::random_hex(3))
}

/// Removes the lab should the demo itself not have (a panic mid-way, a killed process).
struct Guard(String);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Err(e) = tern_lab::down(&self.0) {
            eprintln!("teardown of lab {}: {e}", self.0);
        }
    }
}

/// `ternctl lab --name NAME --bin-dir DIR demo ARGS`: (exit success, stdout, stderr).
fn demo(name: &str, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
        .args(["lab", "--name", name, "--bin-dir"])
        .arg(dir)
        .arg("demo")
        .args(args)
        .output()
        .expect("ternctl runs");
    eprintln!("ternctl lab demo {}: {:?}", args.join(" "), t.elapsed());
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Nothing of lab `name` is left.
fn assert_gone(name: &str) {
    assert!(
        !Path::new("/run/tern-lab").join(name).exists(),
        "state directory of {name} left"
    );
    let prefix = tern_lab::state::ns_prefix(name);
    let left = tern_lab::process::netns_with_prefix(&prefix);
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// The `| Block | CIDR |` rows of `ipam show --show-blocks`.
fn ipam_blocks(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("| Block "))
        .filter_map(|l| l.split('|').nth(2).map(|c| c.trim().to_string()))
        .collect()
}

/// The nodes of the `ok block <cidr> of <node>` lines.
fn nodes_with_blocks(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("ok block "))
        .filter_map(|l| l.split(" of ").nth(1).map(str::to_string))
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
        nodes_with_blocks(out),
        ["node1", "node2", "node3"].map(String::from).into(),
        "{out}"
    );
    assert!(out.contains("PASS: all"), "{out}");
}

#[test]
fn demo_default_three_nodes_over_bgp() {
    let dir = preconditions();
    let name = lab_name("dd");
    let _g = Guard(name.clone());
    // No arguments: exactly what `bash scripts/demo.sh` runs.
    let (ok, out, err) = demo(&name, &dir, &[]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert_lab_demo(&out, "none");
    assert!(out.contains("==> ternctl node status: BGP sessions of node1"));
    assert!(
        out.contains("ok bgp: node1 has 2 Established sessions"),
        "{out}"
    );
    assert!(out.matches("node-to-node mesh").count() == 2, "{out}");
    assert_gone(&name);
}

#[test]
fn demo_vxlan() {
    let dir = preconditions();
    let name = lab_name("dv");
    let _g = Guard(name.clone());
    let (ok, out, err) = demo(&name, &dir, &["--encap", "vxlan"]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert_lab_demo(&out, "vxlan");
    // No BGP with VXLAN unless asked for.
    assert!(!out.contains("node status"), "{out}");
    assert_gone(&name);
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
    let name = lab_name("df");
    let _g = Guard(name.clone());
    let (ok, out, err) = demo(&name, fake.path(), &[]);
    assert!(
        !ok,
        "a demo whose agents cannot start must fail:\n{out}\n{err}"
    );
    assert!(out.contains("FAILED: lab up"), "{out}");
    assert!(out.contains("FAIL: 1 of"), "{out}");
    assert!(out.contains("deleted namespace"), "teardown ran:\n{out}");
    assert_gone(&name);
}

/// The sysctls kubelet changes, as the kernel shows them now.
fn kubelet_sysctls() -> Vec<(String, String)> {
    [
        "vm/overcommit_memory",
        "kernel/panic",
        "kernel/panic_on_oops",
    ]
    .iter()
    .map(|k| {
        let v = std::fs::read_to_string(Path::new("/proc/sys").join(k)).expect("read sysctl");
        (k.to_string(), v.trim().to_string())
    })
    .collect()
}

#[test]
fn demo_kubernetes() {
    let dir = preconditions();
    let k8s = tern_lab::kube::KubeOptions::from_env().k8s_bin;
    if let Err(e) = tern_lab::kube::check_binaries(&k8s) {
        panic!("{e}");
    }
    let name = lab_name("dk");
    let _g = Guard(name.clone());
    let others_before = common::kube_lab::other_clusters(&name);
    let sysctls_before = kubelet_sysctls();
    let (ok, out, err) = demo(&name, &dir, &["--kubernetes"]);
    assert!(ok, "demo --kubernetes failed:\n{out}\n{err}");
    for header in [
        "==> kubectl get nodes -o wide",
        "==> kubectl get pod -A -o wide",
        "==> ip route of node1",
        "==> ternctl ipam show --show-blocks",
        "==> ternctl node status",
        "==> traffic between pods on different nodes",
    ] {
        assert!(out.contains(header), "no {header:?} in:\n{out}");
    }
    // Every node Ready in `kubectl get nodes -o wide`.
    let ready = out
        .lines()
        .filter(|l| l.starts_with("node") && l.contains(" Ready ") && l.contains("v1.34"))
        .count();
    assert_eq!(ready, 3, "{out}");
    // `kubectl get pod -A -o wide`: the Deployment's pods Running on every node with an address
    // from tern's pool.
    let pods: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<&str>>())
        // NAMESPACE NAME READY STATUS RESTARTS AGE IP NODE ... (`get wep` rows name the
        // endpoint, `<node>-k8s-demo--...`, in the second column).
        .filter(|f| f.len() >= 8 && f[0] == "default" && f[1].starts_with("demo-"))
        .collect();
    assert_eq!(pods.len(), 6, "{out}");
    let pool: ipnet::Ipv4Net = tern_lab::cluster::DEFAULT_POOL_CIDR.parse().unwrap();
    let mut nodes = BTreeSet::new();
    for f in &pods {
        assert_eq!(f[3], "Running", "{f:?}");
        let ip: std::net::Ipv4Addr = f[6].parse().unwrap_or_else(|_| panic!("{f:?}"));
        assert!(pool.contains(&ip), "{f:?} not in {pool}");
        nodes.insert(f[7].to_string());
    }
    assert_eq!(nodes.len(), 3, "a pod on every node: {pods:?}");
    for n in ["node1", "node2", "node3"] {
        assert!(out.contains(&format!("ok pods on {n} in ")), "{out}");
    }
    // Routes to the other nodes' blocks learned over BGP; a block per node; sessions up.
    assert!(out.contains("ok routes: node1 reaches every other node's blocks"));
    assert!(
        out.lines()
            .any(|l| l.contains("block of node2, routed by node1") && l.contains("proto 85")),
        "{out}"
    );
    assert_eq!(
        nodes_with_blocks(&out),
        ["node1", "node2", "node3"].map(String::from).into(),
        "{out}"
    );
    assert!(
        out.contains("ok bgp: node1 has 2 Established sessions"),
        "{out}"
    );
    // One source pod per node to the 4 pods on other nodes, TCP and UDP, all cross-node.
    let traffic = |proto: &str| {
        out.lines()
            .filter(|l| l.starts_with(&format!("ok {proto} demo-")) && l.ends_with("[cross-node]"))
            .count()
    };
    assert_eq!(traffic("tcp"), 12, "{out}");
    assert_eq!(traffic("udp"), 12, "{out}");
    assert!(out.contains("PASS: all"), "{out}");
    // Teardown: cgroups removed, namespaces and state gone, sysctls back.
    assert!(out.contains("cgroup(s) under"), "{out}");
    assert_gone(&name);
    let prefix = tern_lab::state::ns_prefix(&name);
    assert!(
        tern_lab::kube::sys::with_prefix(&prefix).is_empty(),
        "cgroups left"
    );
    let others_after = common::kube_lab::other_clusters(&name);
    if others_before.is_empty() && others_after.is_empty() {
        assert_eq!(kubelet_sysctls(), sysctls_before, "sysctls restored");
    } else {
        // Their kubelets hold kubelet's values; the last lab out restores the machine's.
        eprintln!(
            "sysctl check not applicable: other clusters ran meanwhile: {others_before:?} {others_after:?}"
        );
    }
}
