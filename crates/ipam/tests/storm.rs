//! Randomised storms on SQLite: simulated nodes as threads and as separate processes allocate
//! and release concurrently; the invariants of [`tern_ipam::storm::verify`] must hold after.
//!
//! Cross-process storms re-execute this test binary (`current_exe() --exact storm_child`) with
//! the role in the environment, as `crates/store/tests/sqlite_conformance.rs` does.

use std::env;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tern_ipam::storm::{self, StormOptions, StormReport};
use tern_store::Store;
use tern_store::sqlite::SqliteStore;

const ROLE: &str = "TERN_IPAM_STORM_CHILD";
const DB: &str = "TERN_IPAM_STORM_DB";
const OPTS: &str = "TERN_IPAM_STORM_OPTS";
const INDEX: &str = "TERN_IPAM_STORM_INDEX";

fn sqlite(path: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).unwrap())
}

fn check(name: &str, report: &StormReport, store: Arc<dyn Store>) {
    eprintln!(
        "{name}: {} allocations, {} releases, {} exhausted, {} borrowed, {} blocks released in {:?}",
        report.total(|w| w.allocations),
        report.total(|w| w.releases),
        report.total(|w| w.exhausted),
        report.total(|w| w.borrowed),
        report.total(|w| w.blocks_released),
        report.elapsed
    );
    if let Err(v) = report.verify(store) {
        panic!("{name}: {} violations:\n{}", v.len(), v.join("\n"));
    }
    assert!(
        report.total(|w| w.allocations) > 50,
        "{name}: storm too quiet"
    );
    assert!(report.total(|w| w.releases) > 20, "{name}: storm too quiet");
}

fn thread_storm(name: &str, opts: StormOptions) -> StormReport {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.db");
    let p = path.clone();
    let report = storm::run(&move || sqlite(&p), &opts).unwrap();
    check(name, &report, sqlite(&path));
    report
}

#[test]
fn thread_storm_roomy_pool() {
    let r = thread_storm(
        "roomy",
        StormOptions {
            pool_cidr: "10.98.0.0/20".into(),
            block_size: 27,
            seed: 7,
            ..StormOptions::default()
        },
    );
    assert_eq!(r.total(|w| w.exhausted), 0);
}

#[test]
fn thread_storm_exhaustion_and_borrowing() {
    // 64 addresses in 8 blocks of 8 for 4 nodes wanting up to 24 handles (1-2 addresses)
    // each: blocks run out, nodes borrow, the pool runs dry.
    let r = thread_storm(
        "exhaustion",
        StormOptions {
            pool_cidr: "10.97.0.0/26".into(),
            block_size: 29,
            max_held: 24,
            alloc_percent: 70,
            seed: 11,
            ..StormOptions::default()
        },
    );
    assert!(r.total(|w| w.exhausted) > 0, "pool never ran dry");
    assert!(r.total(|w| w.borrowed) > 0, "nobody borrowed");
}

#[test]
fn thread_storm_strict_affinity_with_block_release() {
    let r = thread_storm(
        "strict+release",
        StormOptions {
            pool_cidr: "10.96.0.0/25".into(),
            block_size: 29,
            strict_affinity: true,
            max_blocks_per_host: 2,
            max_held: 12,
            alloc_percent: 52,
            release_empty_blocks: true,
            seed: 13,
            ..StormOptions::default()
        },
    );
    assert_eq!(
        r.total(|w| w.borrowed),
        0,
        "strict affinity must not borrow"
    );
    assert!(
        r.total(|w| w.blocks_released) > 0,
        "no empty block was released"
    );
}

fn process_storm(name: &str, opts: StormOptions) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.db");
    storm::setup(sqlite(&path), &opts).unwrap();
    let start = std::time::Instant::now();
    let children: Vec<_> = (0..opts.nodes)
        .map(|i| {
            Command::new(env::current_exe().unwrap())
                .args(["--exact", "storm_child", "--nocapture", "--test-threads=1"])
                .env(ROLE, "1")
                .env(DB, &path)
                .env(OPTS, serde_json::to_string(&opts).unwrap())
                .env(INDEX, i.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut workers = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("STORM_REPORT ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no report from child: {stdout}"));
        workers.push(serde_json::from_str(line).unwrap());
    }
    let report = StormReport {
        workers,
        elapsed: start.elapsed(),
    };
    check(name, &report, sqlite(&path));
}

#[test]
fn process_storm_exhaustion_and_borrowing() {
    process_storm(
        "processes",
        StormOptions {
            pool_cidr: "10.95.0.0/26".into(),
            block_size: 29,
            max_held: 24,
            alloc_percent: 70,
            duration: Duration::from_secs(3),
            seed: 17,
            ..StormOptions::default()
        },
    );
}

/// Not a test of its own: the body of a child process of [`process_storm`].
#[test]
fn storm_child() {
    if env::var(ROLE).is_err() {
        return;
    }
    let path = env::var(DB).unwrap();
    let opts: StormOptions = serde_json::from_str(&env::var(OPTS).unwrap()).unwrap();
    let index: usize = env::var(INDEX).unwrap().parse().unwrap();
    let report = storm::worker(sqlite(std::path::Path::new(&path)), index, &opts);
    println!("STORM_REPORT {}", serde_json::to_string(&report).unwrap());
}
