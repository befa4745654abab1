//! Randomised storms on SQLite: simulated nodes as threads and as separate processes allocate
//! and release concurrently; the invariants of [`tern_ipam::storm::verify`] must hold after.
//!
//! Cross-process storms re-execute this test binary in a role (`tern_testkit::child`, the test
//! `storm_child`), as `crates/store/tests/sqlite_conformance.rs` does; the runs and checks are
//! shared with `storm_etcd.rs` (`common/mod.rs`).

mod common;

use std::sync::Arc;

use tern_store::Store;
use tern_store::sqlite::SqliteStore;

fn sqlite(path: &str) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).unwrap())
}

/// A fresh database path (its directory removed when the guard drops).
fn db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.db").display().to_string();
    (dir, path)
}

#[test]
fn thread_storm_roomy_pool() {
    let (_dir, db) = db();
    let r = common::thread_storm("roomy", &db, sqlite, common::roomy());
    assert_eq!(r.total(|w| w.exhausted), 0);
}

#[test]
fn thread_storm_exhaustion_and_borrowing() {
    let (_dir, db) = db();
    let opts = common::exhaustion("10.97.0.0/26", 11);
    let r = common::thread_storm("exhaustion", &db, sqlite, opts);
    common::assert_exhausted_and_borrowed(&r);
}

#[test]
fn thread_storm_strict_affinity_with_block_release() {
    let (_dir, db) = db();
    let r = common::thread_storm("strict+release", &db, sqlite, common::strict_release());
    common::assert_strict_release(&r);
}

#[test]
fn process_storm_exhaustion_and_borrowing() {
    let (_dir, db) = db();
    let opts = common::exhaustion("10.95.0.0/26", 17);
    common::process_storm("processes", "storm_child", &db, sqlite, opts);
}

#[test]
fn thread_storm_ipv6_exhaustion_and_borrowing() {
    let (_dir, db) = db();
    let opts = common::exhaustion6("fd00:97::/122", 23);
    let r = common::thread_storm("ipv6 exhaustion", &db, sqlite, opts);
    common::assert_exhausted_and_borrowed(&r);
}

#[test]
fn thread_storm_dual_stack_exhaustion_and_borrowing() {
    let (_dir, db) = db();
    let opts = common::dual_exhaustion("10.93.0.0/26", "fd00:93::/122", 29);
    let r = common::thread_storm("dual-stack exhaustion", &db, sqlite, opts);
    common::assert_exhausted_and_borrowed(&r);
}

#[test]
fn thread_storm_ipv6_strict_affinity_with_block_release() {
    let (_dir, db) = db();
    let opts = tern_ipam::storm::StormOptions {
        pool_cidr: "fd00:96::/121".into(),
        block_size: 125,
        ..common::strict_release()
    };
    let r = common::thread_storm("ipv6 strict+release", &db, sqlite, opts);
    common::assert_strict_release(&r);
}

#[test]
fn process_storm_ipv6_exhaustion_and_borrowing() {
    let (_dir, db) = db();
    let opts = common::exhaustion6("fd00:95::/122", 31);
    common::process_storm("ipv6 processes", "storm_child", &db, sqlite, opts);
}

/// Not a test of its own: the body of a child process of `common::process_storm`.
#[test]
fn storm_child() {
    common::worker(sqlite);
}
