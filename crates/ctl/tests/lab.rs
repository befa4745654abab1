//! End to end: `ternctl lab demo` builds a one-node lab in network namespaces, runs the real
//! `tern` plugin and `ternd`, and proves connectivity with real packets. Needs root (it
//! creates namespaces); nothing happens in the root network namespace.

use std::path::{Path, PathBuf};
use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The directory of the built ternctl, where the workspace's other binaries are built too.
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_ternctl"))
        .parent()
        .expect("ternctl has a directory")
        .to_path_buf()
}

/// Builds the plugin and agent binaries if they are not there yet (`cargo test -p tern-ctl`
/// only builds ternctl itself).
fn ensure_binaries(dir: &Path) {
    if ["tern", "tern-ipam", "ternd"]
        .iter()
        .all(|b| dir.join(b).is_file())
    {
        return;
    }
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "tern-plugin", "-p", "tern-agent"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building tern and ternd failed");
}

#[test]
fn lab_demo_proves_connectivity() {
    if !is_root() {
        println!("skipped: lab_demo_proves_connectivity needs root to create network namespaces");
        return;
    }
    let dir = bin_dir();
    ensure_binaries(&dir);
    // A name of our own, so a concurrent `ternctl lab` of a user is never touched.
    let name = format!("t{}", std::process::id() % 100_000_000);
    let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
        .args(["lab", "--name", &name, "--bin-dir"])
        .arg(&dir)
        .args(["demo", "--pods", "2"])
        .output()
        .expect("ternctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed ({}):\n{stdout}\n{stderr}",
        out.status
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
    if !is_root() {
        println!(
            "skipped: down_cleans_up_after_a_failed_up needs root to create network namespaces"
        );
        return;
    }
    // An agent that dies at start-up makes `up` fail after the namespaces exist.
    let fake = tempfile::tempdir().unwrap();
    for b in ["tern", "tern-ipam", "ternd"] {
        let p = fake.path().join(b);
        std::fs::write(&p, "#!/bin/sh\necho agent exploded >&2\nexit 3\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let name = format!("f{}", std::process::id() % 100_000_000);
    let ternctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ternctl"))
            .args(["lab", "--name", &name, "--bin-dir"])
            .arg(fake.path())
            .args(args)
            .output()
            .expect("ternctl runs")
    };
    let up = ternctl(&["up"]);
    let err = String::from_utf8_lossy(&up.stderr);
    assert!(!up.status.success());
    assert!(
        err.contains("exited during start-up") && err.contains("agent exploded"),
        "{err}"
    );
    assert!(
        !lab_namespaces(&name).is_empty(),
        "up should have left namespaces behind"
    );
    let down = ternctl(&["down"]);
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        lab_namespaces(&name).is_empty(),
        "{:?}",
        lab_namespaces(&name)
    );
    assert!(!Path::new("/run/tern-lab").join(&name).exists());
    // Down of a lab that no longer exists is a no-op, not an error.
    assert!(ternctl(&["down"]).status.success());
}
