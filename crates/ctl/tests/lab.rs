//! End to end: `ternctl lab demo` builds a one-node lab in network namespaces, runs the real
//! `tern` plugin and `ternd`, and proves connectivity with real packets. Needs root (it
//! creates namespaces); nothing happens in the root network namespace.

use std::path::Path;

mod common;

#[test]
fn lab_demo_proves_connectivity() {
    let dir = common::lab_ready();
    let name = common::lab_name("t");
    // `demo` tears its lab down itself; the guard is for a demo that fails half-way.
    let _lab = common::Lab::guard(&name);
    let run = common::ternctl_lab(&name, dir, &["demo", "--nodes", "1", "--pods", "2"]);
    let (stdout, stderr) = (&run.stdout, &run.stderr);
    assert!(
        run.ok(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        run.out.status
    );
    let probes = |prefix: &str| stdout.lines().filter(|l| l.starts_with(prefix)).count();
    // Two pods: pod->pod TCP and UDP both ways, node->pod TCP to each.
    assert_eq!(probes("ok tcp "), 4, "{stdout}");
    assert_eq!(probes("ok udp "), 2, "{stdout}");
    assert!(
        stdout.contains("pod1 -> pod2") && stdout.contains("node1 -> pod1"),
        "{stdout}"
    );
    assert!(stdout.contains("| IP Pool  |"), "{stdout}");
    assert!(stdout.contains("PASS: all"), "{stdout}");
    // Everything is gone.
    assert!(!Path::new("/run/tern-lab").join(&name).exists());
    let leftovers = lab_namespaces(&name);
    assert!(leftovers.is_empty(), "namespaces left: {leftovers:?}");
}

fn lab_namespaces(name: &str) -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("tl-{name}-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn down_cleans_up_after_a_failed_up() {
    tern_testkit::need_root();
    // An agent that dies at start-up makes `up` fail after the namespaces exist.
    let fake = tempfile::tempdir().unwrap();
    for b in ["tern", "tern-ipam", "ternd"] {
        let p = fake.path().join(b);
        std::fs::write(&p, "#!/bin/sh\necho agent exploded >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let name = common::lab_name("f");
    let _lab = common::Lab::guard(&name);
    let ternctl = |args: &[&str]| common::ternctl_lab(&name, fake.path(), args);
    let up = ternctl(&["up"]);
    let err = &up.stderr;
    assert!(!up.ok());
    assert!(
        err.contains("exited during start-up") && err.contains("agent exploded"),
        "{err}"
    );
    assert!(
        !lab_namespaces(&name).is_empty(),
        "up should have left namespaces behind"
    );
    let down = ternctl(&["down"]);
    assert!(down.ok(), "{}", down.stderr);
    assert!(
        lab_namespaces(&name).is_empty(),
        "{:?}",
        lab_namespaces(&name)
    );
    assert!(!Path::new("/run/tern-lab").join(&name).exists());
    // Down of a lab that no longer exists is a no-op, not an error.
    assert!(ternctl(&["down"]).ok());
}
