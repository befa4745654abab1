//! Throughput of the etcd backend on this machine:
//! `cargo run --release -p tern-store --example etcd_bench [ops]`.
//!
//! Starts its own single-member etcd on free loopback ports (or uses `$TERN_ETCD_URL`, e.g.
//! `etcd://127.0.0.1:2379`, writing under `/bench/`) and measures unconditional puts, single-key
//! CAS txns (compare `mod_revision`, put), get + CAS and gets, one request at a time.

mod common;

use tern_store::etcd::harness::EtcdServer;

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

    common::run(&*s, n, own.is_some());
    drop(own.take());
}
