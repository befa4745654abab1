//! Throughput of the SQLite backend on this machine:
//! `cargo run --release -p tern-store --example store_bench [ops]`.
//!
//! Measures unconditional puts, single-key CAS txns (compare `mod_revision`, put) and gets on a
//! fresh file in a temporary directory, with the store's production settings (WAL,
//! `synchronous=NORMAL`).

use std::time::{Duration, Instant};

use tern_store::sqlite::SqliteStore;
use tern_store::{Compare, Op, Store, Txn};

fn report(what: &str, n: usize, took: Duration) {
    let per_op = took.as_secs_f64() / n as f64;
    println!(
        "{what:<28} {n:>7} ops  {:>10.0} ops/s  {:>8.1} us/op",
        1.0 / per_op,
        per_op * 1e6
    );
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("bench.db");
    let s = SqliteStore::open(&path).expect("open store");
    println!("store: {}", path.display());

    let start = Instant::now();
    for i in 0..n {
        s.put(&format!("/bench/put/{i:08}"), b"some value of modest size")
            .unwrap();
    }
    report("put (distinct keys)", n, start.elapsed());

    let key = "/bench/cas";
    let mut mod_rev = 0;
    let start = Instant::now();
    for i in 0..n {
        let r = s
            .txn(Txn {
                compare: vec![Compare::ModRevision(key.to_string(), mod_rev)],
                success: vec![Op::put(key, i.to_string())],
                failure: vec![],
            })
            .unwrap();
        assert!(r.succeeded, "uncontended CAS must succeed");
        mod_rev = r.revision;
    }
    report("CAS txn (one key)", n, start.elapsed());

    let start = Instant::now();
    for i in 0..n {
        let kv = s.get(key).unwrap().unwrap();
        let r = s
            .txn(Txn {
                compare: vec![Compare::ModRevision(key.to_string(), kv.mod_revision)],
                success: vec![Op::put(key, i.to_string())],
                failure: vec![],
            })
            .unwrap();
        assert!(r.succeeded);
    }
    report("get + CAS txn (read-modify)", n, start.elapsed());

    let gets = n * 4;
    let start = Instant::now();
    for i in 0..gets {
        let k = format!("/bench/put/{:08}", i % n);
        assert!(s.get(&k).unwrap().is_some());
    }
    report("get", gets, start.elapsed());

    let start = Instant::now();
    let rounds = 20;
    for _ in 0..rounds {
        let (kvs, _) = s.range("/bench/put/").unwrap();
        assert_eq!(kvs.len(), n);
    }
    report(&format!("range ({n} keys)"), rounds, start.elapsed());
}
