//! The conformance suite and the failure behaviour of the etcd backend, against real `etcd`
//! processes (one per test, on free loopback ports, killed on drop).
//!
//! Cross-process tests re-execute this test binary in a role (`tern_testkit::child`); the
//! `child_role` test does nothing without one.

use std::env;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tern_store::etcd::harness::{EtcdServer, TestCerts};
use tern_store::etcd::{self, EtcdStore, Timeouts, TlsFiles};
use tern_store::testing::{Call, Hook, Hooked, Verdict};
use tern_store::{EventKind, Op, Store, StoreError, Txn, conformance};
use tern_testkit::child;

const URL: &str = "TERN_ETCD_CHILD_URL";
const COUNT: &str = "TERN_ETCD_CHILD_COUNT";

fn server() -> EtcdServer {
    EtcdServer::start().expect("start etcd (Debian package etcd-server)")
}

fn etcd_opts() -> conformance::Options {
    conformance::Options {
        // etcd's minimum lease TTL is 2 s on a default single member.
        lease_ttl: Duration::from_secs(2),
        cas_threads: 4,
        cas_increments: 25,
    }
}

#[test]
fn etcd_store_passes_conformance() {
    let etcd = server();
    let base = etcd.store().unwrap();
    let n = AtomicUsize::new(0);
    // Every check gets its own namespace on the one etcd: fresh keys, shared revisions.
    conformance::run_all_with(
        &|| {
            let ns = format!("/run{}", n.fetch_add(1, Ordering::Relaxed));
            Arc::new(base.with_namespace(&ns)) as Arc<dyn Store>
        },
        &etcd_opts(),
    );
    // The namespaces really separated the checks: the raw keyspace holds them side by side.
    let (all, _) = base.range("/run0/conformance/meta/").unwrap();
    assert!(!all.is_empty());
    let (none, _) = base.range("/conformance/").unwrap();
    assert!(none.is_empty(), "a namespaced store wrote outside it");
}

/// Before each watch, compacts away all but `history` revisions, the way a cluster with
/// `--auto-compaction-mode=revision` would between the writes and the watch.
struct Compacting {
    etcd: Arc<EtcdStore>,
    history: i64,
}

impl Hook for Compacting {
    fn before(&self, call: &Call<'_>) -> Verdict {
        if !matches!(call, Call::Watch(..)) {
            return Verdict::Forward;
        }
        let compacted = self.etcd.revision().and_then(|now| {
            let keep_from = now - self.history;
            if keep_from > 0 {
                self.etcd.compact(keep_from)?;
            }
            Ok(())
        });
        match compacted {
            Ok(()) => Verdict::Forward,
            Err(e) => Verdict::Fail(e),
        }
    }
}

#[test]
fn etcd_watch_of_compacted_revision_fails() {
    let etcd = server();
    let inner = Arc::new(etcd.store().unwrap());
    let hook = Compacting {
        etcd: inner.clone(),
        history: 16,
    };
    let s = Hooked::new(inner.clone(), hook);
    conformance::watch_compacted(&*s, 16);
    // Compacting twice at the same revision is not an error.
    let r = inner.revision().unwrap();
    inner.compact(r).unwrap();
    inner.compact(r).unwrap();
}

#[test]
fn refused_endpoint_is_unavailable_quickly() {
    let start = Instant::now();
    match tern_store::open("etcd://127.0.0.1:1") {
        Err(StoreError::Unavailable(msg)) => {
            assert!(
                msg.contains("127.0.0.1:1"),
                "message names the endpoint: {msg}"
            );
        }
        Err(e) => panic!("expected Unavailable, got {e}"),
        Ok(_) => panic!("expected Unavailable, got a store"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn first_endpoint_dead_second_works() {
    let etcd = server();
    let url = format!("etcd://127.0.0.1:1,{}", etcd.endpoint);
    let s = tern_store::open(&url).unwrap();
    let r = s.put("/two/k", b"v").unwrap();
    assert_eq!(s.get("/two/k").unwrap().unwrap().mod_revision, r);
    let mut w = s.watch("/two/", 0).unwrap();
    let got = conformance::collect_events(&mut *w, 1, Duration::from_secs(5));
    assert_eq!(got.len(), 1);
}

#[test]
fn killed_server_gives_unavailable_to_calls_and_watches() {
    let mut etcd = server();
    // The first call after the kill retries for its whole budget (the member may be
    // restarting); later ones see the cluster is down and fail at once.
    let budget = Duration::from_secs(2);
    let s = EtcdStore::connect_with(
        &[&etcd.endpoint],
        None,
        Timeouts::default(),
        etcd::RetryPolicy {
            budget,
            ..etcd::RetryPolicy::default()
        },
    )
    .unwrap();
    s.put("/k", b"v").unwrap();
    let mut w = s.watch("/", s.revision().unwrap()).unwrap();
    etcd.kill();

    let start = Instant::now();
    assert!(matches!(s.get("/k"), Err(StoreError::Unavailable(_))));
    let first = start.elapsed();
    assert!(
        first >= budget && first < budget + Duration::from_secs(2),
        "first call failed after {first:?} for a budget of {budget:?}"
    );
    let start = Instant::now();
    assert!(matches!(s.put("/k", b"w"), Err(StoreError::Unavailable(_))));
    assert!(start.elapsed() < Duration::from_secs(1));
    match w.next_events(Duration::from_secs(5)) {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("ended"), "{msg}"),
        other => panic!("a watch on a dead server must end with Unavailable, got {other:?}"),
    }
}

#[test]
fn open_by_url_and_config_errors() {
    let etcd = server();
    let s = tern_store::open(&format!("{}/", etcd.url())).unwrap();
    s.put("/url", b"1").unwrap();
    for bad in ["etcd://", "etcd://nohost", "etcd://h:1,,h:2", "etcd://h:x"] {
        assert!(
            matches!(tern_store::open(bad), Err(StoreError::Config(_))),
            "{bad}"
        );
    }
    // TLS flags only make sense with etcd, and a client key needs its certificate.
    let p = std::path::Path::new("/nonexistent");
    assert!(matches!(
        etcd::open_with_tls("mem://", Some(p), None, None),
        Err(StoreError::Config(_))
    ));
    assert!(etcd::open_with_tls("mem://", None, None, None).is_ok());
    match etcd::open_with_tls(&etcd.url(), Some(p), None, None) {
        Err(StoreError::Config(msg)) => assert!(msg.contains("/nonexistent"), "{msg}"),
        Err(e) => panic!("missing CA file must be a Config error, got {e}"),
        Ok(_) => panic!("missing CA file must be a Config error, got a store"),
    }
}

#[test]
fn tls_with_client_certificates() {
    let certs = TestCerts::generate().expect("test certificates made with tern-pki");
    let etcd = EtcdServer::start_tls(&certs).expect("start TLS etcd");
    let url = etcd.url();
    let s = etcd::open_with_tls(
        &url,
        Some(&certs.ca),
        Some(&certs.client_cert),
        Some(&certs.client_key),
    )
    .unwrap();
    let base = s.revision().unwrap();
    let mut w = s.watch("/tls/", base).unwrap();
    let r = s
        .txn(Txn {
            success: vec![Op::put("/tls/a", b"1"), Op::put("/tls/b", b"2")],
            ..Txn::default()
        })
        .unwrap();
    let got = conformance::collect_events(&mut *w, 2, Duration::from_secs(5));
    assert_eq!(got.len(), 2);
    assert!(
        got.iter()
            .all(|e| e.kind == EventKind::Put && e.kv.mod_revision == r.revision)
    );

    // Without a client certificate the server refuses the handshake.
    let no_client = TlsFiles {
        ca: certs.ca.clone(),
        cert: None,
        key: None,
    };
    match EtcdStore::connect(&[&etcd.endpoint], Some(no_client), Timeouts::default()) {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains(&etcd.endpoint), "{msg}"),
        other => panic!("TLS without a client certificate must fail, got {other:?}"),
    }
    // Plain HTTP to the TLS port fails too, and quickly.
    let start = Instant::now();
    assert!(matches!(
        tern_store::open(&url),
        Err(StoreError::Unavailable(_))
    ));
    assert!(start.elapsed() < Duration::from_secs(8));
}

#[test]
fn cross_process_cas_loses_no_update() {
    let etcd = server();
    let (procs, per) = (3, 30);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            child::spawn(
                "child_role",
                "cas",
                &[(URL, etcd.url()), (COUNT, per.to_string())],
            )
        })
        .collect();
    let mut revs: Vec<i64> = Vec::new();
    for c in children {
        let lines = child::output("cas child", c);
        assert_eq!(lines.len(), per, "child output:\n{lines:?}");
        revs.extend(lines.iter().map(|l| l.trim().parse::<i64>().unwrap()));
    }
    let s = etcd.store().unwrap();
    conformance::assert_cas_total(&s, "/race/counter", procs * per, revs);
}

/// The body of every child process; a no-op when run as an ordinary test.
#[test]
fn child_role() {
    child::serve(run_role);
}

/// One child's role, on the etcd the parent named.
fn run_role(role: &str) {
    let s = tern_store::open(&env::var(URL).unwrap()).unwrap();
    let count: usize = env::var(COUNT).unwrap().parse().unwrap();
    match role {
        "cas" => {
            for rev in conformance::cas_increments(&*s, "/race/counter", count) {
                child::emit(rev);
            }
        }
        other => panic!("unknown child role {other}"),
    }
}
