//! The behaviour every [`Store`] backend must show, as plain functions that panic on a violation.
//!
//! Behind the `test-support` feature (not `cfg(test)`) so each backend's tests, in this crate or
//! another, call [`run_all`] with a factory of fresh stores; production builds leave it out.
//! Checks use relative revisions and keys under their own prefix, so a factory may hand out
//! stores that share data (one etcd, several prefixes of work) as long as nothing else writes
//! under `/conformance/`.
//!
//! [`watch_compacted`] is not part of [`run_all`]: how much history a backend keeps is its own
//! setting, so its tests call it with a store configured for a short history.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::{Compare, Event, EventKind, KeyValue, Op, Store, StoreError, Txn};

/// Tunables for backends with coarse timing (etcd rounds lease TTLs up to whole seconds).
#[derive(Debug, Clone)]
pub struct Options {
    /// TTL granted in the lease checks; expiry is awaited for up to `4 * lease_ttl + 2 s`.
    pub lease_ttl: Duration,
    /// Threads racing in [`concurrent_cas`].
    pub cas_threads: usize,
    /// Increments per thread in [`concurrent_cas`].
    pub cas_increments: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lease_ttl: Duration::from_secs(1),
            cas_threads: 4,
            cas_increments: 50,
        }
    }
}

/// Runs every check of [`run_all_with`] with default [`Options`].
pub fn run_all(make: &dyn Fn() -> Arc<dyn Store>) {
    run_all_with(make, &Options::default());
}

/// Runs every check, each against a fresh store from `make`.
pub fn run_all_with(make: &dyn Fn() -> Arc<dyn Store>, opts: &Options) {
    put_get_delete_metadata(&*make());
    range_prefix_sorted(&*make());
    txn_compare_mod_revision(&*make());
    txn_compare_create_revision(&*make());
    txn_compare_version(&*make());
    txn_compare_value(&*make());
    txn_multiple_compares_and_ops(&*make());
    delete_prefix(&*make());
    revision_monotonic(&*make());
    value_size_limit(&*make());
    concurrent_cas(make(), opts.cas_threads, opts.cas_increments);
    watch_sees_later_events(&*make());
    watch_prefixes_sees_only_its_prefixes(&*make());
    watch_live_from_other_thread(make());
    watch_timeout_returns_empty(&*make());
    lease_expiry_deletes_keys(&*make(), opts.lease_ttl);
    lease_keepalive_extends(&*make(), opts.lease_ttl);
    lease_revoke_deletes_keys(&*make());
    lease_unknown(&*make());
}

fn put_txn(key: &str, value: &[u8], compare: Vec<Compare>) -> Txn {
    Txn {
        compare,
        success: vec![Op::put(key, value)],
        failure: vec![],
    }
}

/// Put creates with version 1 and `create_revision == mod_revision`; a second put keeps the
/// create revision and bumps version; delete removes the key and is idempotent.
pub fn put_get_delete_metadata(s: &dyn Store) {
    let k = "/conformance/meta/a";
    assert_eq!(s.get(k).unwrap(), None, "fresh key must be absent");
    let base = s.revision().unwrap();

    let r1 = s.put(k, b"one").unwrap();
    assert_eq!(r1, base + 1, "a put bumps the revision by exactly one");
    assert_eq!(s.revision().unwrap(), r1);
    let kv = s.get(k).unwrap().expect("key after put");
    assert_eq!(
        kv,
        KeyValue {
            key: k.to_string(),
            value: b"one".to_vec(),
            create_revision: r1,
            mod_revision: r1,
            version: 1,
            lease: 0,
        }
    );

    let r2 = s.put(k, b"two").unwrap();
    assert_eq!(r2, r1 + 1);
    let kv = s.get(k).unwrap().expect("key after second put");
    assert_eq!(kv.value, b"two");
    assert_eq!(kv.create_revision, r1, "create_revision survives updates");
    assert_eq!(kv.mod_revision, r2);
    assert_eq!(kv.version, 2);

    let r3 = s.delete(k).unwrap();
    assert_eq!(r3, r2 + 1, "deleting an existing key is a write");
    assert_eq!(s.get(k).unwrap(), None);
    let r4 = s.delete(k).unwrap();
    assert_eq!(r4, r3, "deleting an absent key writes nothing");

    // Re-creation starts a new life: fresh create_revision, version 1.
    let r5 = s.put(k, b"three").unwrap();
    let kv = s.get(k).unwrap().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r5, r5, 1)
    );

    // create() only succeeds on an absent key.
    assert!(!s.create(k, b"x").unwrap());
    assert_eq!(s.get(k).unwrap().unwrap().value, b"three");
    assert!(s.create("/conformance/meta/b", b"y").unwrap());
    assert_eq!(s.get("/conformance/meta/b").unwrap().unwrap().version, 1);

    // Empty values and binary values round-trip.
    s.put("/conformance/meta/empty", b"").unwrap();
    assert_eq!(
        s.get("/conformance/meta/empty").unwrap().unwrap().value,
        b""
    );
    let bin: Vec<u8> = (0..=255u8).collect();
    s.put("/conformance/meta/bin", &bin).unwrap();
    assert_eq!(s.get("/conformance/meta/bin").unwrap().unwrap().value, bin);
}

/// Range returns exactly the keys with the prefix, sorted, plus the revision of the read.
pub fn range_prefix_sorted(s: &dyn Store) {
    let p = "/conformance/range/";
    for k in ["b", "a", "c/d", "c", "ab"] {
        s.put(&format!("{p}{k}"), k.as_bytes()).unwrap();
    }
    // Neighbours that share a textual start but not the prefix.
    s.put("/conformance/range", b"no").unwrap();
    s.put("/conformance/range0", b"no").unwrap();
    s.put("/conformance/rangf/x", b"no").unwrap();
    let rev = s.revision().unwrap();

    let (kvs, at) = s.range(p).unwrap();
    let keys: Vec<&str> = kvs.iter().map(|kv| &kv.key[p.len()..]).collect();
    assert_eq!(keys, ["a", "ab", "b", "c", "c/d"]);
    assert_eq!(at, rev);
    for kv in &kvs {
        assert_eq!(kv.value, &kv.key.as_bytes()[p.len()..]);
    }

    let (kvs, _) = s.range(&format!("{p}c")).unwrap();
    assert_eq!(kvs.len(), 2);
    let (kvs, _) = s.range("/conformance/nothing-here/").unwrap();
    assert!(kvs.is_empty());

    // Non-ASCII prefixes bound the range correctly too.
    s.put("/conformance/rangé/1", b"1").unwrap();
    s.put("/conformance/rangê/1", b"1").unwrap();
    let (kvs, _) = s.range("/conformance/rangé/").unwrap();
    assert_eq!(kvs.len(), 1);
}

/// Shared shape of the revision/version compares: 0 means absent, then exact match.
fn compare_kind(
    s: &dyn Store,
    name: &str,
    mk: fn(String, i64) -> Compare,
    pick: fn(&KeyValue) -> i64,
) {
    let k = format!("/conformance/cmp-{name}/k");
    let other = format!("/conformance/cmp-{name}/failure-branch");

    // Absent key: compare with 0 holds, anything else fails.
    let r = s.txn(put_txn(&k, b"v1", vec![mk(k.clone(), 5)])).unwrap();
    assert!(!r.succeeded, "{name}: compare 5 on an absent key must fail");
    assert_eq!(s.get(&k).unwrap(), None);
    let r = s.txn(put_txn(&k, b"v1", vec![mk(k.clone(), 0)])).unwrap();
    assert!(r.succeeded, "{name}: compare 0 on an absent key must hold");
    let kv = s.get(&k).unwrap().unwrap();
    assert_eq!(kv.mod_revision, r.revision);

    // Present key: 0 fails; the current value holds; a wrong one fails and runs `failure`.
    let r = s.txn(put_txn(&k, b"x", vec![mk(k.clone(), 0)])).unwrap();
    assert!(!r.succeeded, "{name}: compare 0 on a present key must fail");
    let before = s.revision().unwrap();
    let r = s
        .txn(Txn {
            compare: vec![mk(k.clone(), pick(&kv) + 100)],
            success: vec![Op::put(&k, b"wrong")],
            failure: vec![Op::put(&other, b"ran")],
        })
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.revision, before + 1, "{name}: the failure branch writes");
    assert_eq!(s.get(&k).unwrap().unwrap().value, b"v1");
    assert_eq!(s.get(&other).unwrap().unwrap().value, b"ran");

    let r = s
        .txn(put_txn(&k, b"v2", vec![mk(k.clone(), pick(&kv))]))
        .unwrap();
    assert!(
        r.succeeded,
        "{name}: compare with the current value must hold"
    );
    let kv2 = s.get(&k).unwrap().unwrap();
    assert_eq!(kv2.value, b"v2");
    assert_eq!(kv2.mod_revision, r.revision);
}

/// `Compare::ModRevision` paths.
pub fn txn_compare_mod_revision(s: &dyn Store) {
    compare_kind(s, "mod", Compare::ModRevision, |kv| kv.mod_revision);
    // A stale mod_revision (the classic lost-update guard) fails after someone else wrote.
    let k = "/conformance/cmp-mod/stale";
    let r1 = s.put(k, b"1").unwrap();
    s.put(k, b"2").unwrap();
    let r = s
        .txn(put_txn(k, b"3", vec![Compare::ModRevision(k.into(), r1)]))
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(s.get(k).unwrap().unwrap().value, b"2");
}

/// `Compare::CreateRevision` paths; updates do not change the create revision.
pub fn txn_compare_create_revision(s: &dyn Store) {
    compare_kind(s, "create", Compare::CreateRevision, |kv| {
        kv.create_revision
    });
    let k = "/conformance/cmp-create/k";
    let created = s.get(k).unwrap().unwrap().create_revision;
    s.put(k, b"again").unwrap();
    let r = s
        .txn(put_txn(
            k,
            b"v3",
            vec![Compare::CreateRevision(k.into(), created)],
        ))
        .unwrap();
    assert!(r.succeeded, "create_revision is unchanged by updates");
}

/// `Compare::Version` paths.
pub fn txn_compare_version(s: &dyn Store) {
    compare_kind(s, "version", Compare::Version, |kv| kv.version);
    let k = "/conformance/cmp-version/k";
    assert_eq!(s.get(k).unwrap().unwrap().version, 2);
    let r = s
        .txn(put_txn(k, b"v3", vec![Compare::Version(k.into(), 2)]))
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(s.get(k).unwrap().unwrap().version, 3);
}

/// `Compare::Value` paths: equal bytes hold, different bytes or an absent key fail.
pub fn txn_compare_value(s: &dyn Store) {
    let k = "/conformance/cmp-value/k";
    let r = s
        .txn(put_txn(k, b"a", vec![Compare::Value(k.into(), Vec::new())]))
        .unwrap();
    assert!(
        !r.succeeded,
        "a value compare on an absent key fails, even for empty bytes"
    );
    s.put(k, b"a").unwrap();
    let r = s
        .txn(put_txn(
            k,
            b"b",
            vec![Compare::Value(k.into(), b"x".to_vec())],
        ))
        .unwrap();
    assert!(!r.succeeded);
    let r = s
        .txn(put_txn(
            k,
            b"b",
            vec![Compare::Value(k.into(), b"a".to_vec())],
        ))
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(s.get(k).unwrap().unwrap().value, b"b");
}

/// Several compares are ANDed; several ops share one revision; a txn that writes nothing does
/// not bump the revision.
pub fn txn_multiple_compares_and_ops(s: &dyn Store) {
    let p = "/conformance/multi/";
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    let ra = s.put(&a, b"1").unwrap();
    let before = s.revision().unwrap();

    let r = s
        .txn(Txn {
            compare: vec![
                Compare::ModRevision(a.clone(), ra),
                Compare::ModRevision(b.clone(), 0),
            ],
            success: vec![Op::put(&b, b"2"), Op::put(&c, b"3"), Op::delete(&a)],
            failure: vec![],
        })
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(
        r.revision,
        before + 1,
        "all ops of a txn share one revision"
    );
    assert_eq!(s.get(&a).unwrap(), None);
    for k in [&b, &c] {
        let kv = s.get(k).unwrap().unwrap();
        assert_eq!(
            (kv.create_revision, kv.mod_revision),
            (r.revision, r.revision)
        );
    }

    // One failing compare among holding ones fails the whole txn; empty failure writes nothing.
    let r2 = s
        .txn(Txn {
            compare: vec![
                Compare::ModRevision(b.clone(), r.revision),
                Compare::Value(c.clone(), b"nope".to_vec()),
            ],
            success: vec![Op::delete(&b)],
            failure: vec![],
        })
        .unwrap();
    assert!(!r2.succeeded);
    assert_eq!(
        r2.revision, r.revision,
        "a txn that writes nothing keeps the revision"
    );
    assert!(s.get(&b).unwrap().is_some());

    // An empty txn succeeds and writes nothing.
    let r3 = s.txn(Txn::default()).unwrap();
    assert!(r3.succeeded);
    assert_eq!(r3.revision, r.revision);
}

/// DeletePrefix removes exactly the keys under the prefix, in one revision.
pub fn delete_prefix(s: &dyn Store) {
    let p = "/conformance/dp/";
    for k in ["x/1", "x/2", "x/3/4", "y"] {
        s.put(&format!("{p}{k}"), b"v").unwrap();
    }
    s.put("/conformance/dp/x", b"sibling-not-under-prefix")
        .unwrap();
    let before = s.revision().unwrap();
    let r = s
        .txn(Txn {
            success: vec![Op::DeletePrefix {
                prefix: format!("{p}x/"),
            }],
            ..Txn::default()
        })
        .unwrap();
    assert_eq!(r.revision, before + 1);
    let (left, _) = s.range(p).unwrap();
    let keys: Vec<&str> = left.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/conformance/dp/x", "/conformance/dp/y"]);

    // Nothing under the prefix: no write.
    let r2 = s
        .txn(Txn {
            success: vec![Op::DeletePrefix {
                prefix: format!("{p}x/"),
            }],
            ..Txn::default()
        })
        .unwrap();
    assert_eq!(r2.revision, r.revision);
}

/// Revisions only grow, by one per writing txn, and match the metadata of written keys.
pub fn revision_monotonic(s: &dyn Store) {
    let mut last = s.revision().unwrap();
    for i in 0..20 {
        let k = format!("/conformance/rev/{}", i % 3);
        let r = if i % 4 == 3 {
            s.delete(&k).unwrap()
        } else {
            s.put(&k, format!("{i}").as_bytes()).unwrap()
        };
        assert!(r >= last, "revision went backwards: {r} < {last}");
        assert!(
            r <= last + 1,
            "one txn bumped the revision by more than one"
        );
        if i % 4 != 3 {
            assert_eq!(r, last + 1);
            assert_eq!(s.get(&k).unwrap().unwrap().mod_revision, r);
        }
        assert_eq!(s.revision().unwrap(), r);
        last = r;
    }
}

/// Checks the end of a CAS race of [`cas_increments`] (threads or processes): the counter at
/// `key` of `s` is `total`, it was written `total` times, and no two increments share a
/// revision (`revs`, every increment's revision).
pub fn assert_cas_total(s: &dyn Store, key: &str, total: usize, mut revs: Vec<i64>) {
    let kv = s.get(key).unwrap().expect("the counter exists");
    assert_eq!(String::from_utf8(kv.value).unwrap(), total.to_string());
    assert_eq!(kv.version, total as i64);
    assert_eq!(revs.len(), total, "increments reported");
    revs.sort_unstable();
    revs.dedup();
    assert_eq!(revs.len(), total, "two increments share a revision");
}

/// Increments the integer stored at `key` `n` times with get + CAS retry loops; returns the
/// revision of every successful increment. Used by the in-process race below and by
/// cross-process tests.
pub fn cas_increments(s: &dyn Store, key: &str, n: usize) -> Vec<i64> {
    let mut revs = Vec::with_capacity(n);
    for _ in 0..n {
        loop {
            let (current, mod_rev) = match s.get(key).unwrap() {
                Some(kv) => {
                    let text = String::from_utf8(kv.value).expect("counter is utf-8");
                    (
                        text.parse::<u64>().expect("counter is a number"),
                        kv.mod_revision,
                    )
                }
                None => (0, 0),
            };
            let r = s
                .txn(put_txn(
                    key,
                    (current + 1).to_string().as_bytes(),
                    vec![Compare::ModRevision(key.to_string(), mod_rev)],
                ))
                .unwrap();
            if r.succeeded {
                revs.push(r.revision);
                break;
            }
        }
    }
    revs
}

/// `threads` threads race `increments` CAS increments each on one counter: no update is lost
/// and every successful increment got its own revision.
pub fn concurrent_cas(s: Arc<dyn Store>, threads: usize, increments: usize) {
    let key = "/conformance/cas/counter";
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let s = s.clone();
            thread::spawn(move || cas_increments(&*s, key, increments))
        })
        .collect();
    let mut revs: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("CAS thread panicked"))
        .collect();
    let total = threads * increments;
    let value = s.get(key).unwrap().expect("counter exists").value;
    assert_eq!(
        String::from_utf8(value).unwrap(),
        total.to_string(),
        "lost update"
    );
    revs.sort_unstable();
    revs.dedup();
    assert_eq!(
        revs.len(),
        total,
        "two increments claimed the same revision"
    );
    assert_eq!(s.get(key).unwrap().unwrap().version, total as i64);
}

/// Collects events from `w` until `n` arrived or `wait` passed.
pub fn collect_events(w: &mut dyn crate::Watch, n: usize, wait: Duration) -> Vec<Event> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    while out.len() < n {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        out.extend(w.next_events(deadline - now).unwrap());
    }
    out
}

fn summary(events: &[Event]) -> Vec<(EventKind, String, i64)> {
    events
        .iter()
        .map(|e| (e.kind.clone(), e.kv.key.clone(), e.kv.mod_revision))
        .collect()
}

/// A watch from a revision delivers exactly the later events under its prefix, in order:
/// puts, deletes, txn ops and DeletePrefix deletions; a watch from a later revision skips the
/// earlier ones.
pub fn watch_sees_later_events(s: &dyn Store) {
    let p = "/conformance/watch/";
    s.put(&format!("{p}before"), b"old").unwrap();
    let base = s.revision().unwrap();

    let r1 = s.put(&format!("{p}a"), b"1").unwrap();
    s.put("/conformance/elsewhere", b"ignored").unwrap();
    let r2 = s
        .txn(Txn {
            success: vec![
                Op::put(format!("{p}b"), b"2"),
                Op::put(format!("{p}c/1"), b"3"),
            ],
            ..Txn::default()
        })
        .unwrap()
        .revision;
    let r3 = s.delete(&format!("{p}a")).unwrap();
    let r4 = s
        .txn(Txn {
            success: vec![Op::DeletePrefix {
                prefix: format!("{p}c/"),
            }],
            ..Txn::default()
        })
        .unwrap()
        .revision;
    let r5 = s.put(&format!("{p}b"), b"22").unwrap();

    let expected = vec![
        (EventKind::Put, format!("{p}a"), r1),
        (EventKind::Put, format!("{p}b"), r2),
        (EventKind::Put, format!("{p}c/1"), r2),
        (EventKind::Delete, format!("{p}a"), r3),
        (EventKind::Delete, format!("{p}c/1"), r4),
        (EventKind::Put, format!("{p}b"), r5),
    ];
    let mut w = s.watch(p, base).unwrap();
    let got = collect_events(&mut *w, expected.len(), Duration::from_secs(5));
    assert_eq!(summary(&got), expected);
    // Put events carry the full key-value; deletes carry an empty value.
    assert_eq!(got[0].kv.value, b"1");
    assert_eq!(got[0].kv.version, 1);
    assert_eq!(got[5].kv.value, b"22");
    assert_eq!(got[5].kv.version, 2);
    assert_eq!(got[5].kv.create_revision, r2);
    assert!(got[3].kv.value.is_empty());
    // Nothing more.
    assert!(w.next_events(Duration::from_millis(50)).unwrap().is_empty());

    // Resuming from a later revision skips what came before it.
    let mut w = s.watch(p, r3).unwrap();
    let got = collect_events(&mut *w, 2, Duration::from_secs(5));
    assert_eq!(summary(&got), expected[4..].to_vec());
}

/// A watch of several prefixes delivers the events under any of them, in order, and none of
/// the keys beside them (a sibling of the same parent, a key that only shares their start).
pub fn watch_prefixes_sees_only_its_prefixes(s: &dyn Store) {
    let (a, b) = ("/conformance/wp/a/", "/conformance/wp/bb/");
    let base = s.revision().unwrap();
    let mut w = s.watch_prefixes(&[a, b], base).unwrap();
    let r1 = s.put(&format!("{a}1"), b"1").unwrap();
    s.put("/conformance/wp/c/1", b"beside").unwrap();
    s.put("/conformance/wp/b/1", b"shares the start").unwrap();
    let r2 = s.put(&format!("{b}1"), b"2").unwrap();
    let r3 = s.delete(&format!("{a}1")).unwrap();
    s.put("/conformance/wp/z", b"after").unwrap();
    let expected = vec![
        (EventKind::Put, format!("{a}1"), r1),
        (EventKind::Put, format!("{b}1"), r2),
        (EventKind::Delete, format!("{a}1"), r3),
    ];
    let got = collect_events(&mut *w, expected.len(), Duration::from_secs(5));
    assert_eq!(summary(&got), expected);
    assert!(
        w.next_events(Duration::from_millis(200))
            .unwrap()
            .is_empty()
    );
}

/// A watcher waiting in `next_events` sees writes made by another thread while it waits.
pub fn watch_live_from_other_thread(s: Arc<dyn Store>) {
    let p = "/conformance/live/";
    let base = s.revision().unwrap();
    let mut w = s.watch(p, base).unwrap();
    let writer = {
        let s = s.clone();
        thread::spawn(move || {
            let mut revs = Vec::new();
            for i in 0..10 {
                thread::sleep(Duration::from_millis(5));
                revs.push(s.put(&format!("{p}{i}"), b"v").unwrap());
            }
            revs
        })
    };
    let got = collect_events(&mut *w, 10, Duration::from_secs(10));
    let revs = writer.join().unwrap();
    let expected: Vec<_> = (0..10)
        .map(|i| (EventKind::Put, format!("{p}{i}"), revs[i]))
        .collect();
    assert_eq!(summary(&got), expected);
}

/// `next_events` returns an empty batch when nothing happens before the timeout, and does not
/// return early by much.
pub fn watch_timeout_returns_empty(s: &dyn Store) {
    let base = s.revision().unwrap();
    let mut w = s.watch("/conformance/quiet/", base).unwrap();
    let start = Instant::now();
    let got = w.next_events(Duration::from_millis(100)).unwrap();
    assert!(got.is_empty());
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "returned before the timeout"
    );
}

/// After more than `history` revisions, a watch from before them fails with `Compacted`, while
/// a watch from the current revision works. Call with a store configured to keep `history`
/// revisions of events.
pub fn watch_compacted(s: &dyn Store, history: usize) {
    let base = s.revision().unwrap();
    let k = "/conformance/compact/k";
    for i in 0..(2 * history + 2) {
        s.put(k, i.to_string().as_bytes()).unwrap();
    }
    match s.watch("/conformance/compact/", base) {
        Err(StoreError::Compacted { requested, oldest }) => {
            assert!(
                requested <= base + 1,
                "requested {requested} for base {base}"
            );
            assert!(oldest > requested);
        }
        Err(e) => panic!("expected Compacted, got {e}"),
        Ok(mut w) => match w.next_events(Duration::from_millis(200)) {
            Err(StoreError::Compacted { .. }) => {}
            other => panic!("watch of a compacted revision must fail, got {other:?}"),
        },
    }
    let now = s.revision().unwrap();
    let mut w = s.watch("/conformance/compact/", now).unwrap();
    let r = s.put(k, b"last").unwrap();
    let got = collect_events(&mut *w, 1, Duration::from_secs(5));
    assert_eq!(summary(&got), vec![(EventKind::Put, k.to_string(), r)]);
}

/// Keys put with a lease vanish when it expires, with delete events; keys without it stay.
pub fn lease_expiry_deletes_keys(s: &dyn Store, ttl: Duration) {
    let p = "/conformance/lease-exp/";
    let lease = s.lease_grant(ttl).unwrap();
    let base = s.revision().unwrap();
    let r = s
        .txn(Txn {
            success: vec![
                Op::Put {
                    key: format!("{p}a"),
                    value: b"1".to_vec(),
                    lease,
                },
                Op::Put {
                    key: format!("{p}b"),
                    value: b"2".to_vec(),
                    lease,
                },
                Op::put(format!("{p}keep"), b"3"),
            ],
            ..Txn::default()
        })
        .unwrap();
    assert_eq!(s.get(&format!("{p}a")).unwrap().unwrap().lease, lease);
    assert_eq!(s.get(&format!("{p}keep")).unwrap().unwrap().lease, 0);

    let mut w = s.watch(p, r.revision).unwrap();
    let got = collect_events(&mut *w, 2, 4 * ttl + Duration::from_secs(2));
    let mut deleted: Vec<(EventKind, String)> = got
        .iter()
        .map(|e| (e.kind.clone(), e.kv.key.clone()))
        .collect();
    deleted.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        deleted,
        vec![
            (EventKind::Delete, format!("{p}a")),
            (EventKind::Delete, format!("{p}b")),
        ]
    );
    assert!(got.iter().all(|e| e.kv.mod_revision > base));
    assert_eq!(s.get(&format!("{p}a")).unwrap(), None);
    assert_eq!(s.get(&format!("{p}b")).unwrap(), None);
    assert!(s.get(&format!("{p}keep")).unwrap().is_some());
    assert!(matches!(
        s.lease_keepalive(lease),
        Err(StoreError::LeaseNotFound(id)) if id == lease
    ));
}

/// Keep-alives sent more often than the TTL keep the lease and its keys alive past the TTL.
pub fn lease_keepalive_extends(s: &dyn Store, ttl: Duration) {
    let k = "/conformance/lease-ka/k";
    let lease = s.lease_grant(ttl).unwrap();
    s.txn(Txn {
        success: vec![Op::Put {
            key: k.to_string(),
            value: b"alive".to_vec(),
            lease,
        }],
        ..Txn::default()
    })
    .unwrap();
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        s.lease_keepalive(lease).unwrap();
        thread::sleep(ttl / 5);
        assert!(
            s.get(k).unwrap().is_some(),
            "key expired despite keep-alives"
        );
    }
    // Re-putting without the lease detaches the key: revoking no longer deletes it.
    s.put(k, b"detached").unwrap();
    assert_eq!(s.get(k).unwrap().unwrap().lease, 0);
    s.lease_revoke(lease).unwrap();
    assert_eq!(s.get(k).unwrap().unwrap().value, b"detached");
}

/// Revoking deletes the lease's keys at once, with delete events, in one revision.
pub fn lease_revoke_deletes_keys(s: &dyn Store) {
    let p = "/conformance/lease-rev/";
    let lease = s.lease_grant(Duration::from_secs(60)).unwrap();
    for k in ["a", "b"] {
        s.txn(Txn {
            success: vec![Op::Put {
                key: format!("{p}{k}"),
                value: b"v".to_vec(),
                lease,
            }],
            ..Txn::default()
        })
        .unwrap();
    }
    let before = s.revision().unwrap();
    let mut w = s.watch(p, before).unwrap();
    s.lease_revoke(lease).unwrap();
    assert_eq!(s.revision().unwrap(), before + 1);
    let (left, _) = s.range(p).unwrap();
    assert!(left.is_empty());
    let got = collect_events(&mut *w, 2, Duration::from_secs(5));
    assert_eq!(
        summary(&got),
        vec![
            (EventKind::Delete, format!("{p}a"), before + 1),
            (EventKind::Delete, format!("{p}b"), before + 1),
        ]
    );
    assert!(matches!(
        s.lease_revoke(lease),
        Err(StoreError::LeaseNotFound(_))
    ));
}

/// Unknown leases: keep-alive and revoke fail with `LeaseNotFound`; a put attached to one fails
/// and leaves the store untouched.
pub fn lease_unknown(s: &dyn Store) {
    let bogus = 0x7eadbeef;
    assert!(matches!(
        s.lease_keepalive(bogus),
        Err(StoreError::LeaseNotFound(id)) if id == bogus
    ));
    assert!(matches!(
        s.lease_revoke(bogus),
        Err(StoreError::LeaseNotFound(id)) if id == bogus
    ));
    let before = s.revision().unwrap();
    let res = s.txn(Txn {
        success: vec![
            Op::put("/conformance/lease-unknown/plain", b"v"),
            Op::Put {
                key: "/conformance/lease-unknown/leased".to_string(),
                value: b"v".to_vec(),
                lease: bogus,
            },
        ],
        ..Txn::default()
    });
    assert!(
        matches!(res, Err(StoreError::LeaseNotFound(id)) if id == bogus),
        "put with an unknown lease: {res:?}"
    );
    assert_eq!(s.revision().unwrap(), before);
    assert_eq!(s.get("/conformance/lease-unknown/plain").unwrap(), None);
}

/// A value up to 1 MiB is stored and read back; one over [`crate::MAX_VALUE_BYTES`] (etcd's
/// default `--max-request-bytes`), or a transaction whose values add up to more, is refused
/// with [`StoreError::TooLarge`] naming the limit, and nothing of it is written.
pub fn value_size_limit(s: &dyn Store) {
    let ok = vec![b'v'; 1024 * 1024];
    s.put("/conformance/size/ok", &ok).unwrap();
    assert_eq!(s.get("/conformance/size/ok").unwrap().unwrap().value, ok);
    let rev = s.revision().unwrap();
    let big = vec![b'x'; crate::MAX_VALUE_BYTES + 1];
    match s.put("/conformance/size/big", &big) {
        Err(StoreError::TooLarge(m)) => assert!(
            m.contains("/conformance/size/big") && m.contains(&crate::MAX_VALUE_BYTES.to_string()),
            "{m}"
        ),
        other => panic!("a value over the limit gave {other:?}"),
    }
    // Two values each under the limit, together over it: one request too large for etcd.
    let half = vec![b'h'; crate::MAX_VALUE_BYTES / 2 + 16];
    let r = s.txn(Txn {
        success: vec![
            Op::put("/conformance/size/h1", half.clone()),
            Op::put("/conformance/size/h2", half),
        ],
        ..Txn::default()
    });
    assert!(matches!(r, Err(StoreError::TooLarge(_))), "{r:?}");
    // ... also when they sit in the failure branch.
    let r = s.txn(Txn {
        compare: vec![Compare::Version("/conformance/size/ok".into(), 99)],
        success: vec![],
        failure: vec![Op::put("/conformance/size/big", big)],
    });
    assert!(matches!(r, Err(StoreError::TooLarge(_))), "{r:?}");
    assert_eq!(
        s.revision().unwrap(),
        rev,
        "a refused write changed the store"
    );
    for k in ["big", "h1", "h2"] {
        assert!(s.get(&format!("/conformance/size/{k}")).unwrap().is_none());
    }
}

/// The checks for a backend whose transactions take one key ([`Store::multi_key_txn`] is
/// false: the Kubernetes API) and whose revision counter other writers share (the API server
/// writes its own objects): revisions are asserted to grow and to match, not to step by one.
pub fn run_single_object(make: &dyn Fn() -> Arc<dyn Store>, opts: &Options) {
    single_object_metadata(&*make());
    single_object_range(&*make());
    for (name, mk, pick) in [
        (
            "mod",
            Compare::ModRevision as fn(String, i64) -> Compare,
            (|kv: &KeyValue| kv.mod_revision) as fn(&KeyValue) -> i64,
        ),
        ("create", Compare::CreateRevision, |kv| kv.create_revision),
        ("version", Compare::Version, |kv| kv.version),
    ] {
        single_object_compare(&*make(), name, mk, pick);
    }
    txn_compare_value(&*make());
    multi_key_refused(&*make());
    single_object_size_limit(&*make());
    concurrent_cas(make(), opts.cas_threads, opts.cas_increments);
    single_object_watch(&*make());
    watch_prefixes_sees_only_its_prefixes(&*make());
    watch_live_from_other_thread(make());
    watch_timeout_returns_empty(&*make());
    lease_keepalive_extends(&*make(), opts.lease_ttl);
    single_object_leases(&*make(), opts.lease_ttl);
}

/// Put, get, update, delete and re-create one key: revisions grow with each write and are the
/// key's `mod_revision`; `create_revision` survives updates; `version` counts writes.
pub fn single_object_metadata(s: &dyn Store) {
    assert!(!s.multi_key_txn());
    let k = "/conformance/so-meta/a";
    assert_eq!(s.get(k).unwrap(), None, "fresh key must be absent");
    let base = s.revision().unwrap();
    let r1 = s.put(k, b"one").unwrap();
    assert!(r1 > base);
    assert!(s.revision().unwrap() >= r1);
    assert_eq!(
        s.get(k).unwrap().expect("key after put"),
        KeyValue {
            key: k.to_string(),
            value: b"one".to_vec(),
            create_revision: r1,
            mod_revision: r1,
            version: 1,
            lease: 0,
        }
    );
    let r2 = s.put(k, b"two").unwrap();
    assert!(r2 > r1);
    let kv = s.get(k).unwrap().unwrap();
    assert_eq!(
        (
            kv.value.as_slice(),
            kv.create_revision,
            kv.mod_revision,
            kv.version
        ),
        (&b"two"[..], r1, r2, 2)
    );
    let r3 = s.put(k, b"three").unwrap();
    let kv = s.get(k).unwrap().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r1, r3, 3),
        "create_revision survives updates"
    );
    let r4 = s.delete(k).unwrap();
    assert!(r4 > r3, "deleting an existing key is a write");
    assert_eq!(s.get(k).unwrap(), None);
    assert!(
        s.delete(k).unwrap() >= r4,
        "deleting an absent key is no error"
    );
    let r5 = s.put(k, b"again").unwrap();
    let kv = s.get(k).unwrap().unwrap();
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.version),
        (r5, r5, 1),
        "a new life"
    );
    assert!(!s.create(k, b"x").unwrap());
    assert_eq!(s.get(k).unwrap().unwrap().value, b"again");
    assert!(s.create("/conformance/so-meta/b", b"y").unwrap());
    s.put("/conformance/so-meta/empty", b"").unwrap();
    assert_eq!(
        s.get("/conformance/so-meta/empty").unwrap().unwrap().value,
        b""
    );
    let bin: Vec<u8> = (0..=255u8).collect();
    s.put("/conformance/so-meta/bin", &bin).unwrap();
    assert_eq!(
        s.get("/conformance/so-meta/bin").unwrap().unwrap().value,
        bin
    );
    // Keys any string may be: upper case, spaces, deep paths, long.
    let odd = format!("/conformance/so-meta/Upper Case/ü/{}", "x".repeat(300));
    s.put(&odd, b"odd").unwrap();
    assert_eq!(s.get(&odd).unwrap().unwrap().value, b"odd");
    assert!(
        s.get("/conformance/so-meta/upper case/ü")
            .unwrap()
            .is_none()
    );
}

/// Range: exactly the keys with the prefix, sorted, with a revision no older than the last
/// write before it.
pub fn single_object_range(s: &dyn Store) {
    let p = "/conformance/so-range/";
    for k in ["b", "a", "c/d", "c", "ab"] {
        s.put(&format!("{p}{k}"), k.as_bytes()).unwrap();
    }
    s.put("/conformance/so-range", b"no").unwrap();
    s.put("/conformance/so-range0", b"no").unwrap();
    let rev = s.revision().unwrap();
    let (kvs, at) = s.range(p).unwrap();
    let keys: Vec<&str> = kvs.iter().map(|kv| &kv.key[p.len()..]).collect();
    assert_eq!(keys, ["a", "ab", "b", "c", "c/d"]);
    assert!(at >= rev, "range at {at}, before it {rev}");
    for kv in &kvs {
        assert_eq!(kv.value, &kv.key.as_bytes()[p.len()..]);
    }
    assert_eq!(s.range(&format!("{p}c")).unwrap().0.len(), 2);
    assert!(
        s.range("/conformance/so-nothing-here/")
            .unwrap()
            .0
            .is_empty()
    );
    assert!(s.has_prefix(p).unwrap());
    assert!(!s.has_prefix("/conformance/so-nothing-here/").unwrap());
}

/// One kind of compare on one key: 0 means absent; the current value holds, others fail and
/// run the failure branch (on the same key).
pub fn single_object_compare(
    s: &dyn Store,
    name: &str,
    mk: fn(String, i64) -> Compare,
    pick: fn(&KeyValue) -> i64,
) {
    let k = format!("/conformance/so-cmp-{name}/k");
    let r = s.txn(put_txn(&k, b"v1", vec![mk(k.clone(), 5)])).unwrap();
    assert!(!r.succeeded, "{name}: compare 5 on an absent key must fail");
    assert_eq!(s.get(&k).unwrap(), None);
    let r = s.txn(put_txn(&k, b"v1", vec![mk(k.clone(), 0)])).unwrap();
    assert!(r.succeeded, "{name}: compare 0 on an absent key must hold");
    let kv = s.get(&k).unwrap().unwrap();
    assert_eq!(kv.mod_revision, r.revision);
    let r = s.txn(put_txn(&k, b"x", vec![mk(k.clone(), 0)])).unwrap();
    assert!(!r.succeeded, "{name}: compare 0 on a present key must fail");
    let r = s
        .txn(Txn {
            compare: vec![mk(k.clone(), pick(&kv) + 100)],
            success: vec![Op::put(&k, b"wrong")],
            failure: vec![Op::put(&k, b"failure-branch")],
        })
        .unwrap();
    assert!(!r.succeeded);
    let kv2 = s.get(&k).unwrap().unwrap();
    assert_eq!(
        (kv2.value.as_slice(), kv2.mod_revision),
        (&b"failure-branch"[..], r.revision),
        "{name}: the failure branch writes"
    );
    let r = s
        .txn(put_txn(&k, b"v2", vec![mk(k.clone(), pick(&kv2))]))
        .unwrap();
    assert!(
        r.succeeded,
        "{name}: compare with the current value must hold"
    );
    assert_eq!(s.get(&k).unwrap().unwrap().value, b"v2");
    // The classic lost update: a stale compare fails, the delete too.
    let r = s
        .txn(Txn::when(
            vec![mk(k.clone(), pick(&kv))],
            vec![Op::delete(&k)],
        ))
        .unwrap();
    assert!(
        !r.succeeded || name == "create",
        "{name}: a stale compare must fail a delete"
    );
    if name != "create" {
        assert!(s.get(&k).unwrap().is_some());
    }
}

/// A transaction over two keys is refused, naming them, and writes nothing.
pub fn multi_key_refused(s: &dyn Store) {
    let (a, b) = ("/conformance/so-multi/a", "/conformance/so-multi/b");
    let ra = s.put(a, b"1").unwrap();
    for txn in [
        Txn::when(
            vec![Compare::ModRevision(a.into(), ra)],
            vec![Op::put(b, b"2")],
        ),
        Txn::when(vec![], vec![Op::put(a, b"x"), Op::put(b, b"y")]),
        Txn::when(
            vec![],
            vec![Op::DeletePrefix {
                prefix: "/conformance/so-multi/".into(),
            }],
        ),
    ] {
        match s.txn(txn) {
            Err(StoreError::Backend(m)) => assert!(m.contains("one object per transaction"), "{m}"),
            other => panic!("a transaction over several keys gave {other:?}"),
        }
    }
    assert_eq!(s.get(a).unwrap().unwrap().value, b"1");
    assert!(s.get(b).unwrap().is_none());
}

/// A value up to 1 MiB round-trips; one over [`crate::MAX_VALUE_BYTES`] is refused with
/// `TooLarge` before anything is sent.
pub fn single_object_size_limit(s: &dyn Store) {
    let ok = vec![b'v'; 1024 * 1024];
    s.put("/conformance/so-size/ok", &ok).unwrap();
    assert_eq!(s.get("/conformance/so-size/ok").unwrap().unwrap().value, ok);
    let big = vec![b'x'; crate::MAX_VALUE_BYTES + 1];
    match s.put("/conformance/so-size/big", &big) {
        Err(StoreError::TooLarge(m)) => {
            assert!(m.contains(&crate::MAX_VALUE_BYTES.to_string()), "{m}")
        }
        other => panic!("a value over the limit gave {other:?}"),
    }
    assert!(s.get("/conformance/so-size/big").unwrap().is_none());
}

/// A watch from a revision delivers the later puts and deletes under its prefix in order,
/// with their revisions, values and versions; resumed from a later revision it skips the
/// earlier ones.
pub fn single_object_watch(s: &dyn Store) {
    let p = "/conformance/so-watch/";
    s.put(&format!("{p}before"), b"old").unwrap();
    let base = s.revision().unwrap();
    let r1 = s.put(&format!("{p}a"), b"1").unwrap();
    s.put("/conformance/so-elsewhere", b"ignored").unwrap();
    let r2 = s.put(&format!("{p}b"), b"2").unwrap();
    let r3 = s.delete(&format!("{p}a")).unwrap();
    let r4 = s.put(&format!("{p}b"), b"22").unwrap();
    let expected = vec![
        (EventKind::Put, format!("{p}a"), r1),
        (EventKind::Put, format!("{p}b"), r2),
        (EventKind::Delete, format!("{p}a"), r3),
        (EventKind::Put, format!("{p}b"), r4),
    ];
    let mut w = s.watch(p, base).unwrap();
    let got = collect_events(&mut *w, expected.len(), Duration::from_secs(10));
    assert_eq!(summary(&got), expected);
    assert_eq!(got[0].kv.value, b"1");
    assert_eq!(got[3].kv.value, b"22");
    assert_eq!((got[3].kv.version, got[3].kv.create_revision), (2, r2));
    assert!(got[2].kv.value.is_empty());
    assert!(
        w.next_events(Duration::from_millis(200))
            .unwrap()
            .is_empty()
    );
    let mut w = s.watch(p, r3).unwrap();
    let got = collect_events(&mut *w, 1, Duration::from_secs(10));
    assert_eq!(summary(&got), expected[3..].to_vec());
}

/// Leases on a single-object store: a key of an expired lease reads as absent (and keep-alive
/// says the lease is gone); revoking deletes the lease's keys; a put with an unknown lease
/// fails and writes nothing.
pub fn single_object_leases(s: &dyn Store, ttl: Duration) {
    let p = "/conformance/so-lease/";
    let lease = s.lease_grant(ttl).unwrap();
    let leased = |key: &str, lease: i64| Txn {
        success: vec![Op::Put {
            key: key.to_string(),
            value: b"v".to_vec(),
            lease,
        }],
        ..Txn::default()
    };
    s.txn(leased(&format!("{p}exp"), lease)).unwrap();
    s.put(&format!("{p}keep"), b"3").unwrap();
    assert_eq!(s.get(&format!("{p}exp")).unwrap().unwrap().lease, lease);
    let deadline = Instant::now() + 4 * ttl + Duration::from_secs(2);
    while s.get(&format!("{p}exp")).unwrap().is_some() {
        assert!(Instant::now() < deadline, "the key outlived its lease");
        thread::sleep(ttl / 4);
    }
    let (left, _) = s.range(p).unwrap();
    assert_eq!(left.len(), 1, "only the key without a lease is left");
    assert!(matches!(s.lease_keepalive(lease), Err(StoreError::LeaseNotFound(id)) if id == lease));

    let lease = s.lease_grant(Duration::from_secs(60)).unwrap();
    for k in ["a", "b"] {
        s.txn(leased(&format!("{p}rev-{k}"), lease)).unwrap();
    }
    s.lease_revoke(lease).unwrap();
    assert!(s.get(&format!("{p}rev-a")).unwrap().is_none());
    assert!(s.get(&format!("{p}rev-b")).unwrap().is_none());
    assert!(matches!(
        s.lease_revoke(lease),
        Err(StoreError::LeaseNotFound(_))
    ));

    let bogus = 0x7eadbeef;
    assert!(matches!(s.lease_keepalive(bogus), Err(StoreError::LeaseNotFound(id)) if id == bogus));
    let r = s.txn(leased(&format!("{p}unknown"), bogus));
    assert!(
        matches!(r, Err(StoreError::LeaseNotFound(id)) if id == bogus),
        "{r:?}"
    );
    assert!(s.get(&format!("{p}unknown")).unwrap().is_none());
}
