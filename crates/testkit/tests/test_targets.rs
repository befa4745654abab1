//! `scripts/test.sh` runs the test targets that need the Kubernetes components (kube-apiserver,
//! kubelet, containerd: `scripts/k8s-components.sh`) after those are built, and every other
//! target before, while they build: it selects the first by name, `--test='*kube*'`. This
//! checks the naming it relies on: a test target that reaches for the components has `kube` in
//! its name (else it would run before they exist and fail), and one named `*kube*` does reach
//! for them (else it waits for nothing).

use std::path::{Path, PathBuf};

/// What a test file uses when it needs the components.
const KUBE_MARKERS: &[&str] = &[
    "kube_preconditions(",
    "need_k8s(",
    "KubeOptions::from_env",
    "TERN_K8S_BIN",
    "kube::check_binaries",
];

/// The test targets of every crate: `crates/*/tests/*.rs`.
fn test_targets() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for c in std::fs::read_dir(&crates).expect("read crates/") {
        let tests = c.expect("crates/ entry").path().join("tests");
        let Ok(entries) = std::fs::read_dir(&tests) else {
            continue;
        };
        for e in entries {
            let p = e.expect("tests/ entry").path();
            if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_targets_that_need_kubernetes_are_the_ones_named_kube() {
    let targets = test_targets();
    assert!(targets.len() > 50, "found only {targets:?}");
    let mut wrong = Vec::new();
    let mut kube = 0;
    for p in &targets {
        let name = p.file_stem().unwrap().to_string_lossy();
        if name == "test_targets" {
            continue; // this file names the markers
        }
        let text = std::fs::read_to_string(p).expect("read test file");
        let needs = KUBE_MARKERS.iter().find(|m| text.contains(**m));
        let named = name.contains("kube");
        match (needs, named) {
            (Some(m), false) => wrong.push(format!(
                "{}: uses {m:?} but its name has no \"kube\"",
                p.display()
            )),
            (None, true) => wrong.push(format!(
                "{}: named *kube* but uses none of {KUBE_MARKERS:?}",
                p.display()
            )),
            (Some(_), true) => kube += 1,
            (None, false) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(kube >= 10, "only {kube} Kubernetes test targets found");
}
