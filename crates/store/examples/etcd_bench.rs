//! Throughput of the etcd backend on this machine:
//! `cargo run --release -p tern-store --example etcd_bench [ops]`.
//!
//! Starts its own single-member etcd on free loopback ports (or uses `$TERN_ETCD_URL`, e.g.
//! `etcd://127.0.0.1:2379`, writing under `/bench/`) and measures unconditional puts, single-key
//! CAS txns (compare `mod_revision`, put), get + CAS and gets, one request at a time.

use std::time::{Duration, Instant};

use tern_store::etcd::harness::EtcdServer;
use tern_store::{Compare, Op, Txn};

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
        .unwrap_or(2_000);
    // Kept alive until the end of main: dropping it kills the etcd it started.
    let mut own = None;
    let url = match std::env::var("TERN_ETCD_URL") {
        Ok(url) => url,
        Err(_) => {
            let server = EtcdServer::start().expect("start etcd (Debian package etcd-server)");
            let url = server.url();
            own = Some(server);
            url
        }
    };
    let s = tern_store::open(&url).expect("connect to etcd");
    println!(
        "store: {url}{}",
        if own.is_some() { " (own etcd)" } else { "" }
    );

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
        assert!(kvs.len() >= n);
    }
    report(&format!("range ({n} keys)"), rounds, start.elapsed());
    drop(own.take());
}
