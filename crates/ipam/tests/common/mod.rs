//! The storm runs shared by `storm.rs` (SQLite) and `storm_etcd.rs` (etcd): simulated nodes as
//! threads or as child processes of the test binary, and the checks every storm must pass.

use std::sync::Arc;
use std::time::Instant;

use tern_ipam::storm::{self, StormOptions, StormReport};
use tern_store::Store;
use tern_testkit::child;

/// The variable naming the store a child worker opens (a path or URL, as its test's `open`).
const STORE: &str = "TERN_IPAM_STORM_STORE";
/// The variable carrying the storm's options, as JSON.
const OPTS: &str = "TERN_IPAM_STORM_OPTS";
/// The variable carrying a child worker's index.
const INDEX: &str = "TERN_IPAM_STORM_INDEX";

/// Panics on any violation of [`StormReport::verify`] or when the storm was too quiet to have
/// contended ([`StormReport::assert_sound`]).
pub fn check(name: &str, report: &StormReport, store: Arc<dyn Store>) {
    report.assert_sound(name, report.verify(store));
}

/// Runs the storm with one thread per node, each with its own store from `open(at)`, and
/// checks it.
pub fn thread_storm(
    name: &str,
    at: &str,
    open: fn(&str) -> Arc<dyn Store>,
    opts: StormOptions,
) -> StormReport {
    let owned = at.to_string();
    let report = storm::run(&move || open(&owned), &opts).unwrap();
    check(name, &report, open(at));
    report
}

/// Runs the storm with one child process of this test binary per node (the test `child_test`,
/// which calls [`worker`]) on the store at `at`, and checks it.
pub fn process_storm(
    name: &str,
    child_test: &str,
    at: &str,
    open: fn(&str) -> Arc<dyn Store>,
    opts: StormOptions,
) -> StormReport {
    storm::setup(open(at), &opts).unwrap();
    let start = Instant::now();
    let json = serde_json::to_string(&opts).unwrap();
    let children: Vec<_> = (0..opts.nodes)
        .map(|i| {
            let env = [
                (STORE, at.to_string()),
                (OPTS, json.clone()),
                (INDEX, i.to_string()),
            ];
            child::spawn(child_test, "worker", &env)
        })
        .collect();
    let workers = children
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let lines = child::output(&format!("{name} worker {i}"), c);
            serde_json::from_str(&lines[0]).unwrap()
        })
        .collect();
    let report = StormReport {
        workers,
        elapsed: start.elapsed(),
    };
    check(name, &report, open(at));
    report
}

/// The body of a child test of [`process_storm`]: runs one worker and reports it; nothing in
/// an ordinary test run.
pub fn worker(open: fn(&str) -> Arc<dyn Store>) {
    child::serve(|_| {
        let at = std::env::var(STORE).unwrap();
        let opts: StormOptions = serde_json::from_str(&std::env::var(OPTS).unwrap()).unwrap();
        let index: usize = std::env::var(INDEX).unwrap().parse().unwrap();
        let report = storm::worker(open(&at), index, &opts);
        child::emit(serde_json::to_string(&report).unwrap());
    });
}

/// A /20 in blocks of 32 for 4 nodes: plenty of room, the pool never runs dry.
pub fn roomy() -> StormOptions {
    StormOptions {
        pool_cidr: "10.98.0.0/20".into(),
        block_size: 27,
        seed: 7,
        ..StormOptions::default()
    }
}

/// 64 addresses (`pool`, a /26) in 8 blocks of 8 for 4 nodes wanting up to 24 handles (1-2
/// addresses) each: blocks run out, nodes borrow from each other's blocks, the pool runs dry.
pub fn exhaustion(pool: &str, seed: u64) -> StormOptions {
    StormOptions {
        pool_cidr: pool.into(),
        block_size: 29,
        max_held: 24,
        alloc_percent: 70,
        seed,
        ..StormOptions::default()
    }
}

/// [`exhaustion`] in IPv6: `pool` a /122 in 8 blocks of 8 (/125).
pub fn exhaustion6(pool: &str, seed: u64) -> StormOptions {
    StormOptions {
        block_size: 125,
        ..exhaustion(pool, seed)
    }
}

/// [`exhaustion`] with dual-stack pods: every allocation takes addresses from `v4` (a /26 in
/// blocks of 8) and `v6` (a /122 in blocks of 8), all or nothing.
pub fn dual_exhaustion(v4: &str, v6: &str, seed: u64) -> StormOptions {
    StormOptions {
        other_family_pool: Some(v6.into()),
        ..exhaustion(v4, seed)
    }
}

/// Asserts what [`exhaustion`] must bring about.
pub fn assert_exhausted_and_borrowed(r: &StormReport) {
    assert!(r.total(|w| w.exhausted) > 0, "pool never ran dry");
    assert!(r.total(|w| w.borrowed) > 0, "nobody borrowed");
}

/// Strict affinity, at most 2 blocks per node, and empty blocks released now and then, until
/// every node released one. Releases outweigh allocations (45 %), so a node's holdings often
/// fall to nothing and its blocks are empty when it releases them (at 52 %, an etcd storm on a
/// loaded machine emptied none in 177 allocations).
pub fn strict_release() -> StormOptions {
    StormOptions {
        pool_cidr: "10.96.0.0/25".into(),
        block_size: 29,
        strict_affinity: true,
        max_blocks_per_host: 2,
        max_held: 12,
        alloc_percent: 45,
        release_empty_blocks: true,
        min_blocks_released: 1,
        seed: 13,
        ..StormOptions::default()
    }
}

/// Asserts what [`strict_release`] must bring about.
pub fn assert_strict_release(r: &StormReport) {
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
