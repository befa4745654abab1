//! The conformance suite against the SQLite backend, in one process and across processes.
//!
//! Cross-process tests re-execute this test binary in a role (`tern_testkit::child`) with
//! `TERN_STORE_CHILD_DB` set; the `child_role` test does nothing without a role.

use std::env;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tern_store::sqlite::{SqliteOptions, SqliteStore};
use tern_store::{Compare, EventKind, Op, Store, StoreError, Txn, conformance};
use tern_testkit::child;

const DB: &str = "TERN_STORE_CHILD_DB";
const COUNT: &str = "TERN_STORE_CHILD_COUNT";
const AFTER: &str = "TERN_STORE_CHILD_AFTER";

#[test]
fn sqlite_store_passes_conformance() {
    let dir = tempfile::tempdir().unwrap();
    let n = AtomicUsize::new(0);
    conformance::run_all(&|| {
        let path = dir
            .path()
            .join(format!("store-{}.db", n.fetch_add(1, Ordering::Relaxed)));
        Arc::new(SqliteStore::open(path).unwrap()) as Arc<dyn Store>
    });
}

#[test]
fn sqlite_store_compacts_history() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions {
        history_revisions: 16,
        ..SqliteOptions::default()
    };
    let s = SqliteStore::open_with(dir.path().join("c.db"), opts).unwrap();
    conformance::watch_compacted(&s, 16);
}

#[test]
fn sqlite_store_prunes_events_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SqliteOptions {
        history_age: Duration::from_millis(50),
        history_revisions: 8,
        ..SqliteOptions::default()
    };
    let s = SqliteStore::open_with(dir.path().join("age.db"), opts).unwrap();
    s.put("/k", b"1").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Crossing the count boundary triggers pruning, which also drops the aged events.
    for i in 0..10 {
        s.put("/k", i.to_string().as_bytes()).unwrap();
    }
    assert!(matches!(s.watch("/", 1), Err(StoreError::Compacted { .. })));
}

#[test]
fn sqlite_store_persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let (rev, lease) = {
        let s = SqliteStore::open(&path).unwrap();
        s.put("/a", b"1").unwrap();
        let lease = s.lease_grant(Duration::from_secs(60)).unwrap();
        let rev = s
            .txn(Txn {
                success: vec![Op::Put {
                    key: "/b".into(),
                    value: b"2".to_vec(),
                    lease,
                }],
                ..Txn::default()
            })
            .unwrap()
            .revision;
        (rev, lease)
    };
    let s = SqliteStore::open(&path).unwrap();
    assert_eq!(s.revision().unwrap(), rev);
    assert_eq!(s.get("/a").unwrap().unwrap().value, b"1");
    assert_eq!(s.get("/b").unwrap().unwrap().lease, lease);
    let lease2 = s.lease_grant(Duration::from_secs(1)).unwrap();
    assert_ne!(lease2, lease, "lease ids are not reused after reopening");
    s.lease_revoke(lease).unwrap();
    assert_eq!(s.get("/b").unwrap(), None);
    // History survived too: a watch from 0 replays everything.
    let mut w = s.watch("/", 0).unwrap();
    let got = conformance::collect_events(&mut *w, 3, Duration::from_secs(2));
    assert_eq!(got.len(), 3);
}

#[test]
fn two_instances_on_one_file_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.db");
    let a = SqliteStore::open(&path).unwrap();
    let b = SqliteStore::open(&path).unwrap();
    let mut w = b.watch("/x/", 0).unwrap();
    let r = a.put("/x/1", b"v").unwrap();
    let got = conformance::collect_events(&mut *w, 1, Duration::from_secs(2));
    assert_eq!(got[0].kv.mod_revision, r);
    // A CAS prepared against a stale read loses to the other instance's write.
    let seen = b.get("/x/1").unwrap().unwrap();
    a.put("/x/1", b"w").unwrap();
    let res = b
        .txn(Txn {
            compare: vec![Compare::ModRevision("/x/1".into(), seen.mod_revision)],
            success: vec![Op::put("/x/1", b"stale")],
            failure: vec![],
        })
        .unwrap();
    assert!(!res.succeeded);
    assert_eq!(b.get("/x/1").unwrap().unwrap().value, b"w");
}

#[test]
fn open_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/store.db");
    let s = tern_store::open(&format!("sqlite://{}", path.display())).unwrap();
    s.put("/k", b"v").unwrap();
    assert!(path.exists(), "the parent directory and file are created");

    let m = tern_store::open("mem://").unwrap();
    assert_eq!(m.revision().unwrap(), 0);

    let err = |url: &str| match tern_store::open(url) {
        Err(StoreError::Config(msg)) => msg,
        Err(e) => panic!("{url}: expected a Config error, got {e}"),
        Ok(_) => panic!("{url}: expected a Config error"),
    };
    assert!(matches!(
        tern_store::open("etcd://127.0.0.1:1"),
        Err(StoreError::Unavailable(_))
    ));
    assert!(err("redis://x").contains("redis://x"));
    assert!(err("sqlite://relative.db").contains("absolute"));
}

/// Starts this test binary as a child running `child_role` in `role` on the database `db`.
fn spawn_child(role: &str, db: &str, extra: &[(&str, String)]) -> std::process::Child {
    let mut env = vec![(DB, db.to_string())];
    env.extend(extra.iter().cloned());
    child::spawn("child_role", role, &env)
}

#[test]
fn cross_process_cas_loses_no_update() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cas.db").display().to_string();
    // Create the schema once so the children only race on the counter.
    SqliteStore::open(&db).unwrap();
    let (procs, per) = (4, 100);
    let children: Vec<_> = (0..procs)
        .map(|_| spawn_child("cas", &db, &[(COUNT, per.to_string())]))
        .collect();
    let mut revs: Vec<i64> = Vec::new();
    for c in children {
        for line in child::output("cas child", c) {
            revs.push(line.parse().unwrap());
        }
    }
    let s = SqliteStore::open(&db).unwrap();
    conformance::assert_cas_total(&s, "/race/counter", procs * per, revs);
}

#[test]
fn cross_process_watch_sees_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("watch.db").display().to_string();
    let s = SqliteStore::open(&db).unwrap();
    s.put("/w/before", b"old").unwrap();
    let base = s.revision().unwrap();
    let events = 60;
    let watcher = spawn_child(
        "watch",
        &db,
        &[(COUNT, events.to_string()), (AFTER, base.to_string())],
    );
    // Let the watcher start polling so that it follows the writes live.
    std::thread::sleep(Duration::from_millis(200));
    let writer = spawn_child("write", &db, &[(COUNT, events.to_string())]);
    let written = child::output("writer", writer);
    let seen = child::output("watcher", watcher);
    assert_eq!(written.len(), events);
    assert_eq!(seen, written);
}

/// The body of every child process; a no-op when run as an ordinary test.
#[test]
fn child_role() {
    child::serve(run_role);
}

/// One child's role, on the database the parent named.
fn run_role(role: &str) {
    let db = env::var(DB).unwrap();
    let count: usize = env::var(COUNT).unwrap().parse().unwrap();
    let s = SqliteStore::open(&db).unwrap();
    match role {
        "cas" => {
            for rev in conformance::cas_increments(&s, "/race/counter", count) {
                child::emit(rev);
            }
        }
        "write" => {
            // Puts, deletes of earlier keys, and a two-op txn now and then: one event per line.
            let mut lines = Vec::new();
            let mut i = 0;
            while lines.len() < count {
                let key = format!("/w/{i}");
                if i % 5 == 4 {
                    let gone = format!("/w/{}", i - 1);
                    let rev = s.delete(&gone).unwrap();
                    lines.push(format!("Delete {gone} {rev}"));
                } else if i % 7 == 6 && lines.len() + 2 <= count {
                    let other = format!("/w/{i}b");
                    let rev = s
                        .txn(Txn {
                            success: vec![Op::put(&key, b"t"), Op::put(&other, b"t")],
                            ..Txn::default()
                        })
                        .unwrap()
                        .revision;
                    lines.push(format!("Put {key} {rev}"));
                    lines.push(format!("Put {other} {rev}"));
                } else {
                    let rev = s.put(&key, b"v").unwrap();
                    lines.push(format!("Put {key} {rev}"));
                }
                // Not visible to the watcher: outside its prefix.
                s.put("/elsewhere", i.to_string().as_bytes()).unwrap();
                i += 1;
            }
            for l in lines {
                child::emit(l);
            }
        }
        "watch" => {
            let after: i64 = env::var(AFTER).unwrap().parse().unwrap();
            let mut w = s.watch("/w/", after).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut got = Vec::new();
            while got.len() < count && Instant::now() < deadline {
                got.extend(w.next_events(Duration::from_millis(500)).unwrap());
            }
            for e in got {
                let kind = match e.kind {
                    EventKind::Put => "Put",
                    EventKind::Delete => "Delete",
                };
                child::emit(format!("{kind} {} {}", e.kv.key, e.kv.mod_revision));
            }
        }
        other => panic!("unknown child role {other}"),
    }
}
