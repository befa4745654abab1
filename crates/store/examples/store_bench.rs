//! Throughput of the SQLite backend on this machine:
//! `cargo run --release -p tern-store --example store_bench [ops]`.
//!
//! Measures unconditional puts, single-key CAS txns (compare `mod_revision`, put) and gets on a
//! fresh file in a temporary directory, with the store's production settings (WAL,
//! `synchronous=NORMAL`).

mod common;

use tern_store::sqlite::SqliteStore;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("bench.db");
    let s = SqliteStore::open(&path).expect("open store");
    println!("store: {}", path.display());
    common::run(&s, n, true);
}
