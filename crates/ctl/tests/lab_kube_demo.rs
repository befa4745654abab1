//! `ternctl lab demo --kubernetes`, the README's main command on a real 3-node cluster (the
//! components of `scripts/k8s-components.sh`), run as a process as `scripts/demo.sh` would:
//! the exit code, the key lines of the output, and that nothing of the lab is left
//! (namespaces, state directory, cgroups, kubelet's sysctls).
//!
//! Needs root and the components; without them it FAILS with what is missing. The lab has a
//! unique name, so it never collides with other labs.

use std::collections::BTreeSet;
use std::path::Path;

mod common;

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
    common::kube_preconditions("lab demo --kubernetes");
    let dir = common::fresh_binaries();
    let name = common::lab_name("dk");
    let _g = common::Lab::guard(&name);
    let others_before = common::kube_lab::other_clusters(&name);
    let sysctls_before = kubelet_sysctls();
    let run = common::lab_demo(&name, dir, &["--kubernetes"]);
    let (ok, out, err) = (run.ok(), run.stdout, run.stderr);
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
    let pool: ipnet::Ipv4Net = tern_model::defaults::IPV4_POOL.parse().unwrap();
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
        common::nodes_with_blocks(&out),
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
    // The Kubernetes datastore (the default): tern's pool and blocks are custom resources.
    assert!(
        out.contains("==> kubectl get ippools,ipamblocks -o wide"),
        "{out}"
    );
    let blocks = out
        .lines()
        .filter(|l| l.starts_with("ipamblock.tern.dev/"))
        .count();
    assert!(
        blocks >= 3,
        "a block per node in kubectl get ipamblocks:\n{out}"
    );
    // Teardown: cgroups removed, namespaces and state gone, sysctls back.
    assert!(out.contains("cgroup(s) under"), "{out}");
    common::assert_lab_gone(&name);
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
