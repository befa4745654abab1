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

/// Not a test of its own: the body of a child process of `common::process_storm`.
#[test]
fn storm_child() {
    common::worker(sqlite);
}
