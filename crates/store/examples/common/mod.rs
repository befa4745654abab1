//! The measurements both store benchmarks make (`store_bench`, `etcd_bench`), one request at a
//! time on any backend.

use std::time::{Duration, Instant};

use tern_store::{Compare, Op, Store, Txn};

fn report(what: &str, n: usize, took: Duration) {
    let per_op = took.as_secs_f64() / n as f64;
    println!(
        "{what:<28} {n:>7} ops  {:>10.0} ops/s  {:>8.1} us/op",
        1.0 / per_op,
        per_op * 1e6
    );
}

/// Measures `n` unconditional puts (distinct keys), `n` single-key CAS txns, `n` get + CAS
/// round trips, `4n` gets and 20 ranges over the puts, under `/bench/`, and prints each rate.
/// `fresh`: the store held nothing under `/bench/` before (the range sees exactly the puts).
pub fn run(s: &dyn Store, n: usize, fresh: bool) {
    let start = Instant::now();
    for i in 0..n {
        s.put(&format!("/bench/put/{i:08}"), b"some value of modest size")
            .unwrap();
    }
    report("put (distinct keys)", n, start.elapsed());

    let key = "/bench/cas";
    let mut mod_rev = s.get(key).unwrap().map_or(0, |kv| kv.mod_revision);
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
        // A store of someone else's may hold more under the prefix from an earlier run.
        if fresh {
            assert_eq!(kvs.len(), n);
        } else {
            assert!(kvs.len() >= n);
        }
    }
    report(&format!("range ({n} keys)"), rounds, start.elapsed());
}
