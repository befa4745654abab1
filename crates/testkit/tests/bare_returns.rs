//! Every bare `return;` in the workspace's integration tests is either a skip through a
//! tern-testkit guard (which fails under `TERN_TEST_STRICT=1`, so CI never passes a test that
//! did not run, kernel limits aside) or marked `// not a skip: <why>` on the line above.
//! A `return;` is taken as a guard's when one of the eight lines before it calls
//! `tern_testkit::` or one of the harness helpers below, each of which returns `None`/`false`
//! only through such a guard.

use std::path::{Path, PathBuf};

/// Harness helpers that report a missing precondition only through a tern-testkit guard.
const GUARDED_HELPERS: &[&str] = &[
    "node_and_pod(",
    "can_run(",
    "can_run_etcd(",
    "started_on_etcd(",
    "lab_ready(",
    "have_bird(",
    "kernel_incremental(",
    "node_with_pods(",
    "require_k8s(",
    "preconditions(",
    "setup(",
    "common::require_root(",
    "common::require_bird(",
];

const WINDOW: usize = 8;

fn test_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            test_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_bare_return_in_tests_is_a_guarded_skip_or_marked() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in std::fs::read_dir(&crates).expect("crates/").flatten() {
        test_files(&c.path().join("tests"), &mut files);
    }
    assert!(files.len() > 50, "found only {} test files", files.len());
    let (mut seen, mut bad) = (0, Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim() != "return;" {
                continue;
            }
            seen += 1;
            let before = &lines[i.saturating_sub(WINDOW)..i];
            let marked = i > 0 && lines[i - 1].trim().starts_with("// not a skip:");
            let guarded = before.iter().any(|b| {
                b.contains("tern_testkit::") || GUARDED_HELPERS.iter().any(|h| b.contains(h))
            });
            if !marked && !guarded {
                bad.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(seen > 0, "no bare return found: the scan is broken");
    assert!(
        bad.is_empty(),
        "bare `return;` in a test with no tern-testkit guard before it (a test that cannot \
         run must say why and fail in CI) and no `// not a skip:` mark: {bad:#?}"
    );
}
