//! The randomised storms of `storm.rs`, on a real etcd: simulated nodes as threads (each with
//! its own etcd connection) and as separate processes allocate and release concurrently, and
//! the invariants of [`tern_ipam::storm::verify`] must hold after. Each test starts its own
//! throw-away etcd ([`EtcdServer`], killed by PID and removed on drop) so tests can run in
//! parallel without sharing keys.
//!
//! Cross-process storms re-execute this test binary in a role (`tern_testkit::child`, the test
//! `storm_etcd_child`) with the store URL, the options and the worker index in the environment;
//! the runs and checks are shared with `storm.rs` (`common/mod.rs`).
//!
//! When no etcd binary is installed (`$TERN_ETCD_BIN` or `etcd` on `PATH`) the tests fail
//! saying how to get one (tern-testkit).

mod common;

use std::sync::Arc;

use tern_store::Store;
use tern_store::etcd::harness::{EtcdServer, etcd_available};

/// Runs `body` with the URL of a fresh etcd, stopped after it; fails the test when etcd is
/// not installed (tern-testkit).
fn with_etcd(body: impl FnOnce(&str)) {
    let how = tern_testkit::install_hint("etcd");
    tern_testkit::need("an etcd binary", etcd_available(), how);
    let server = EtcdServer::start().expect("starting a throw-away etcd");
    body(&server.url());
}

/// A new connection to the store at `url` (every simulated node gets its own).
fn open(url: &str) -> Arc<dyn Store> {
    tern_store::open(url).unwrap_or_else(|e| panic!("opening {url}: {e}"))
}

#[test]
fn etcd_thread_storm_roomy_pool() {
    with_etcd(|url| {
        let r = common::thread_storm("etcd roomy", url, open, common::roomy());
        assert_eq!(r.total(|w| w.exhausted), 0, "a /20 must not run dry");
    });
}

#[test]
fn etcd_thread_storm_exhaustion_and_borrowing() {
    with_etcd(|url| {
        let opts = common::exhaustion("10.97.0.0/26", 11);
        let r = common::thread_storm("etcd exhaustion", url, open, opts);
        common::assert_exhausted_and_borrowed(&r);
    });
}

#[test]
fn etcd_thread_storm_ipv6_exhaustion_and_borrowing() {
    with_etcd(|url| {
        let opts = common::exhaustion6("fd00:97::/122", 23);
        let r = common::thread_storm("etcd ipv6 exhaustion", url, open, opts);
        common::assert_exhausted_and_borrowed(&r);
    });
}

#[test]
fn etcd_process_storm_dual_stack_exhaustion_and_borrowing() {
    with_etcd(|url| {
        let opts = common::dual_exhaustion("10.92.0.0/26", "fd00:92::/122", 37);
        let r = common::process_storm("etcd dual processes", "storm_etcd_child", url, open, opts);
        common::assert_exhausted_and_borrowed(&r);
    });
}

#[test]
fn etcd_thread_storm_strict_affinity_with_block_release() {
    with_etcd(|url| {
        let opts = common::strict_release();
        let r = common::thread_storm("etcd strict+release", url, open, opts);
        common::assert_strict_release(&r);
    });
}

#[test]
fn etcd_process_storm_exhaustion_and_borrowing() {
    with_etcd(|url| {
        let opts = common::exhaustion("10.95.0.0/26", 17);
        let r = common::process_storm("etcd processes", "storm_etcd_child", url, open, opts);
        common::assert_exhausted_and_borrowed(&r);
    });
}

#[test]
fn etcd_process_storm_roomy_pool() {
    // Many blocks claimed concurrently by separate processes: the claim protocol (pending
    // affinity, block create, confirm) must never give one block to two nodes.
    with_etcd(|url| {
        let opts = tern_ipam::storm::StormOptions {
            pool_cidr: "10.94.0.0/22".into(),
            block_size: 29,
            max_held: 30,
            alloc_percent: 65,
            seed: 19,
            ..Default::default()
        };
        let r = common::process_storm("etcd processes roomy", "storm_etcd_child", url, open, opts);
        assert_eq!(r.total(|w| w.exhausted), 0, "a /22 must not run dry");
    });
}

/// Not a test of its own: the body of a child process of `common::process_storm`.
#[test]
fn storm_etcd_child() {
    common::worker(open);
}
