//! The randomised storms of `storm.rs`, on a real etcd: simulated nodes as threads (each with
//! its own etcd connection) and as separate processes allocate and release concurrently, and
//! the invariants of [`tern_ipam::storm::verify`] must hold after. Each test starts its own
//! throw-away etcd ([`EtcdServer`], killed by PID and removed on drop) so tests can run in
//! parallel without sharing keys.
//!
//! Cross-process storms re-execute this test binary (`current_exe() --exact storm_etcd_child`)
//! with the role, the store URL, the options and the worker index in the environment.
//!
//! When no etcd binary is installed (`$TERN_ETCD_BIN` or `etcd` on `PATH`) the tests print why
//! and pass without running, like the kernel tests without root.

use std::env;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_ipam::storm::{self, StormOptions, StormReport};
use tern_store::Store;
use tern_store::etcd::harness::{EtcdServer, etcd_available};

const ROLE: &str = "TERN_IPAM_STORM_ETCD_CHILD";
const URL: &str = "TERN_IPAM_STORM_ETCD_URL";
const OPTS: &str = "TERN_IPAM_STORM_ETCD_OPTS";
const INDEX: &str = "TERN_IPAM_STORM_ETCD_INDEX";

/// Starts a fresh etcd, or `None` (a SKIP line; a failure under `TERN_TEST_STRICT=1`, see
/// tern-testkit) when etcd is not installed.
fn etcd() -> Option<EtcdServer> {
    let how = tern_testkit::install_hint("etcd");
    if !tern_testkit::require("an etcd binary", etcd_available(), how) {
        return None;
    }
    Some(EtcdServer::start().expect("starting a throw-away etcd"))
}

/// A new connection to the store at `url` (every simulated node gets its own).
fn open(url: &str) -> Arc<dyn Store> {
    tern_store::open(url).unwrap_or_else(|e| panic!("opening {url}: {e}"))
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
    // etcd round trips are slower than SQLite's, but a 3 s storm still does hundreds of steps;
    // fewer means the storm did not actually contend.
    assert!(
        report.total(|w| w.allocations) > 50,
        "{name}: storm too quiet"
    );
    assert!(report.total(|w| w.releases) > 20, "{name}: storm too quiet");
}

fn thread_storm(name: &str, opts: StormOptions) -> Option<StormReport> {
    let server = etcd()?;
    let url = server.url();
    let u = url.clone();
    let report = storm::run(&move || open(&u), &opts).unwrap();
    check(name, &report, open(&url));
    Some(report)
}

#[test]
fn etcd_thread_storm_roomy_pool() {
    let Some(r) = thread_storm(
        "etcd roomy",
        StormOptions {
            pool_cidr: "10.98.0.0/20".into(),
            block_size: 27,
            seed: 7,
            ..StormOptions::default()
        },
    ) else {
        return;
    };
    assert_eq!(r.total(|w| w.exhausted), 0, "a /20 must not run dry");
}

#[test]
fn etcd_thread_storm_exhaustion_and_borrowing() {
    // 64 addresses in 8 blocks of 8 for 4 nodes wanting up to 24 handles (1-2 addresses)
    // each: blocks run out, nodes borrow from each other's blocks, the pool runs dry.
    let Some(r) = thread_storm(
        "etcd exhaustion",
        StormOptions {
            pool_cidr: "10.97.0.0/26".into(),
            block_size: 29,
            max_held: 24,
            alloc_percent: 70,
            seed: 11,
            ..StormOptions::default()
        },
    ) else {
        return;
    };
    assert!(r.total(|w| w.exhausted) > 0, "pool never ran dry");
    assert!(r.total(|w| w.borrowed) > 0, "nobody borrowed");
}

#[test]
fn etcd_thread_storm_strict_affinity_with_block_release() {
    let Some(r) = thread_storm(
        "etcd strict+release",
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
    ) else {
        return;
    };
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

/// Runs `opts.nodes` workers as child processes of this test binary against one etcd.
fn process_storm(name: &str, opts: StormOptions) -> Option<StormReport> {
    let server = etcd()?;
    let url = server.url();
    storm::setup(open(&url), &opts).unwrap();
    let start = Instant::now();
    let children: Vec<_> = (0..opts.nodes)
        .map(|i| {
            Command::new(env::current_exe().unwrap())
                .args([
                    "--exact",
                    "storm_etcd_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ROLE, "1")
                .env(URL, &url)
                .env(OPTS, serde_json::to_string(&opts).unwrap())
                .env(INDEX, i.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
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
    check(name, &report, open(&url));
    Some(report)
}

#[test]
fn etcd_process_storm_exhaustion_and_borrowing() {
    let Some(r) = process_storm(
        "etcd processes",
        StormOptions {
            pool_cidr: "10.95.0.0/26".into(),
            block_size: 29,
            max_held: 24,
            alloc_percent: 70,
            duration: Duration::from_secs(3),
            seed: 17,
            ..StormOptions::default()
        },
    ) else {
        return;
    };
    assert!(r.total(|w| w.exhausted) > 0, "pool never ran dry");
    assert!(r.total(|w| w.borrowed) > 0, "nobody borrowed");
}

#[test]
fn etcd_process_storm_roomy_pool() {
    // Many blocks claimed concurrently by separate processes: the claim protocol (pending
    // affinity, block create, confirm) must never give one block to two nodes.
    let Some(r) = process_storm(
        "etcd processes roomy",
        StormOptions {
            pool_cidr: "10.94.0.0/22".into(),
            block_size: 29,
            max_held: 30,
            alloc_percent: 65,
            duration: Duration::from_secs(3),
            seed: 19,
            ..StormOptions::default()
        },
    ) else {
        return;
    };
    assert_eq!(r.total(|w| w.exhausted), 0, "a /22 must not run dry");
}

/// Not a test of its own: the body of a child process of [`process_storm`].
#[test]
fn storm_etcd_child() {
    if env::var(ROLE).is_err() {
        return;
    }
    let url = env::var(URL).unwrap();
    let opts: StormOptions = serde_json::from_str(&env::var(OPTS).unwrap()).unwrap();
    let index: usize = env::var(INDEX).unwrap().parse().unwrap();
    let report = storm::worker(open(&url), index, &opts);
    println!("STORM_REPORT {}", serde_json::to_string(&report).unwrap());
}
