//! A watched in-memory copy of some classes of keys in front of a store: what an informer is
//! to a Kubernetes controller.
//!
//! On the Kubernetes datastore every read of a class is a LIST of every object of it, and
//! every agent reads the same classes over and over: the dataplane its pools, nodes and
//! blocks at every resync, the policy engine every endpoint (every Pod of the cluster), IPAM
//! the node's affinities at every ADD and every block at every DEL, the node GC every node and
//! affinity. At 1,000 nodes that is the API server's whole load and most of an agent's
//! memory (each LIST decoded whole). [`CachedStore`] keeps one copy of each *cached class*
//! (a key prefix), filled and kept current by a [`Feed`] per class that the owner drives from
//! a watch (the agent: a kube-rs watcher per class, `tern_agent::kube::feed`), and serves from
//! it:
//!
//! - `range(prefix)` with `prefix` inside a synced class: the cached keys, no request. So the
//!   periodic resyncs, IPAM's lists and the GC read memory, and the API server serves only
//!   the watches.
//! - `watch_prefixes` of prefixes inside cached classes: the changes the feeds apply after
//!   the call, in the order they apply them. tern's consumers open a watch and then read the
//!   whole state with `range` (each resyncs after every new watch), so a change lands either
//!   in that read or in the watch (or both: a put is idempotent). `after_revision` is not
//!   replayed: the copy keeps no history. A consumer too slow to take its events (a bounded
//!   queue) gets [`StoreError::Compacted`] and opens a new watch, resyncing.
//! - `get` and `txn` go to the store (a compare-and-swap needs the current object), and so do
//!   reads of classes not cached or not synced yet, and ranges across several classes.
//!
//! **Read your writes.** A range right after this process's own write must see it (a DEL
//! looks for the addresses its ADD just recorded). Every key a `txn` through this store wrote
//! is remembered with the write's revision until the feed has delivered it (a put of that
//! revision or newer; for a delete, the key gone); a `range` over such a key waits, briefly,
//! for that (the write's own event always comes: a change to an object is an event on its
//! resource), and reads the store itself if it does not come in time.
//!
//! **Relists.** A feed that lost its watch lists the class again ([`Feed::relist_begin`],
//! [`Feed::relisted`], [`Feed::relist_end`]); meanwhile the copy keeps serving what it had,
//! and at the end the copy becomes the list, each difference delivered to the watches as a
//! put or a delete. Values that did not change (a Pod update that changes nothing of its
//! endpoint) update the copy's revisions without an event.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Event, EventKind, KeyValue, Result, Store, StoreError, Txn, TxnResponse, Watch};

/// Batches of events a watch may have waiting before it is ended as too slow.
const WATCH_QUEUE: usize = 4096;
/// How long a range waits for the feed to deliver this process's own last write of the class.
const OWN_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The cached copy of some classes, shared by the [`CachedStore`] and the [`Feed`]s.
pub struct Cache {
    state: Mutex<State>,
    /// Notified whenever a feed applied something (range waits on it).
    applied: Condvar,
}

struct State {
    classes: Vec<ClassState>,
    watches: Vec<Subscriber>,
    next_watch: u64,
}

struct ClassState {
    prefix: String,
    /// Whether `get` of a key of this class is answered from the copy (read-only classes,
    /// such as endpoints derived from Pods, where the store's own `get` is a list).
    serve_gets: bool,
    synced: bool,
    items: BTreeMap<String, KeyValue>,
    /// The newest revision the feed delivered for this class.
    rev: i64,
    /// This process's own writes the feed has not delivered yet: key, revision, and whether
    /// it was a delete.
    own: BTreeMap<String, (i64, bool)>,
    /// A relist in progress: what it has delivered so far.
    relist: Option<BTreeMap<String, KeyValue>>,
}

struct Subscriber {
    id: u64,
    prefixes: Vec<String>,
    tx: SyncSender<Vec<Event>>,
    overflowed: Arc<AtomicBool>,
}

/// A class to cache: a key prefix, no two of which may overlap.
#[derive(Debug, Clone)]
pub struct ClassSpec {
    pub prefix: String,
    /// Answer `get` from the copy once synced (only for classes nothing writes through this
    /// store, where a stale read cannot feed a compare-and-swap).
    pub serve_gets: bool,
}

impl ClassSpec {
    pub fn new(prefix: impl Into<String>) -> ClassSpec {
        ClassSpec {
            prefix: prefix.into(),
            serve_gets: false,
        }
    }
}

impl Cache {
    /// A cache of `classes`, none synced yet. Panics when two prefixes overlap (a programming
    /// error: a key would belong to two classes).
    pub fn new(classes: Vec<ClassSpec>) -> Arc<Cache> {
        for (i, a) in classes.iter().enumerate() {
            for b in &classes[i + 1..] {
                assert!(
                    !a.prefix.starts_with(&b.prefix) && !b.prefix.starts_with(&a.prefix),
                    "cached classes {:?} and {:?} overlap",
                    a.prefix,
                    b.prefix
                );
            }
        }
        Arc::new(Cache {
            state: Mutex::new(State {
                classes: classes
                    .into_iter()
                    .map(|c| ClassState {
                        prefix: c.prefix,
                        serve_gets: c.serve_gets,
                        synced: false,
                        items: BTreeMap::new(),
                        rev: 0,
                        own: BTreeMap::new(),
                        relist: None,
                    })
                    .collect(),
                watches: Vec::new(),
                next_watch: 0,
            }),
            applied: Condvar::new(),
        })
    }

    /// The feed of the class with this prefix; `None` when no class has it.
    pub fn feed(self: &Arc<Self>, prefix: &str) -> Option<Feed> {
        let st = self.state.lock().unwrap();
        let class = st.classes.iter().position(|c| c.prefix == prefix)?;
        Some(Feed {
            cache: self.clone(),
            class,
        })
    }

    /// The prefixes of the cached classes.
    pub fn prefixes(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        st.classes.iter().map(|c| c.prefix.clone()).collect()
    }

    /// Whether every class has been listed once.
    pub fn synced(&self) -> bool {
        self.state.lock().unwrap().classes.iter().all(|c| c.synced)
    }

    /// Waits up to `timeout` for every class to be listed once; the prefixes still missing
    /// when it gives up.
    pub fn wait_synced(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock().unwrap();
        loop {
            let missing: Vec<String> = st
                .classes
                .iter()
                .filter(|c| !c.synced)
                .map(|c| c.prefix.clone())
                .collect();
            let now = Instant::now();
            if missing.is_empty() || now >= deadline {
                return missing;
            }
            st = self.applied.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// Number of keys held, per class prefix (metrics, tests).
    pub fn sizes(&self) -> Vec<(String, usize)> {
        let st = self.state.lock().unwrap();
        st.classes
            .iter()
            .map(|c| (c.prefix.clone(), c.items.len()))
            .collect()
    }
}

impl State {
    /// The class a key or a range prefix lies in.
    fn class_of(&self, key: &str) -> Option<usize> {
        self.classes.iter().position(|c| key.starts_with(&c.prefix))
    }

    /// Hands `events` to every watch whose prefixes take them; a watch whose queue is full is
    /// marked overflowed (it ends with `Compacted`) and dropped.
    fn publish(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.watches.retain(|w| {
            let mine: Vec<Event> = events
                .iter()
                .filter(|e| w.prefixes.iter().any(|p| e.kv.key.starts_with(p.as_str())))
                .cloned()
                .collect();
            if mine.is_empty() {
                return true;
            }
            match w.tx.try_send(mine) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    w.overflowed.store(true, Ordering::Relaxed);
                    false
                }
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }
}

/// The writer of one class of a [`Cache`]: what a watch of the class delivers, in order.
pub struct Feed {
    cache: Arc<Cache>,
    class: usize,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.cache.state.lock().unwrap()
    }

    /// The class's prefix.
    pub fn prefix(&self) -> String {
        self.lock().classes[self.class].prefix.clone()
    }

    /// A key was created or changed. A key outside the class is ignored.
    pub fn put(&self, kv: KeyValue) {
        let mut st = self.lock();
        let c = &mut st.classes[self.class];
        if !kv.key.starts_with(&c.prefix) {
            return;
        }
        c.rev = c.rev.max(kv.mod_revision);
        if c.own
            .get(&kv.key)
            .is_some_and(|(r, _)| kv.mod_revision >= *r)
        {
            c.own.remove(&kv.key);
        }
        if let Some(r) = c.relist.as_mut() {
            // Not expected (a watcher lists before it watches), but never lose it.
            r.insert(kv.key.clone(), kv.clone());
        }
        let same = c.items.get(&kv.key).is_some_and(|o| o.value == kv.value);
        c.items.insert(kv.key.clone(), kv.clone());
        if !same && c.synced {
            st.publish(vec![Event {
                kind: EventKind::Put,
                kv,
            }]);
        }
        drop(st);
        self.cache.applied.notify_all();
    }

    /// A key was deleted at `rev`.
    pub fn delete(&self, key: &str, rev: i64) {
        let mut st = self.lock();
        let c = &mut st.classes[self.class];
        c.rev = c.rev.max(rev);
        if c.own.get(key).is_some_and(|(_, deleted)| *deleted) {
            c.own.remove(key);
        }
        if let Some(r) = c.relist.as_mut() {
            r.remove(key);
        }
        let had = c.items.remove(key).is_some();
        if had && c.synced {
            st.publish(vec![crate::mem::delete_event(key.to_string(), rev)]);
        }
        drop(st);
        self.cache.applied.notify_all();
    }

    /// The class's revision reached `rev` with nothing to apply (a bookmark).
    pub fn progress(&self, rev: i64) {
        let mut st = self.lock();
        let c = &mut st.classes[self.class];
        c.rev = c.rev.max(rev);
        drop(st);
        self.cache.applied.notify_all();
    }

    /// A full list of the class begins; the copy keeps serving until [`Feed::relist_end`].
    pub fn relist_begin(&self) {
        self.lock().classes[self.class].relist = Some(BTreeMap::new());
    }

    /// One key of the list.
    pub fn relisted(&self, kv: KeyValue) {
        let mut st = self.lock();
        let c = &mut st.classes[self.class];
        if !kv.key.starts_with(&c.prefix) {
            return;
        }
        c.rev = c.rev.max(kv.mod_revision);
        if let Some(r) = c.relist.as_mut() {
            r.insert(kv.key.clone(), kv);
        }
    }

    /// The list is complete: it becomes the copy, each difference a watch event (deletes at
    /// the class's revision), and the class is synced.
    pub fn relist_end(&self) {
        let mut st = self.lock();
        let c = &mut st.classes[self.class];
        let Some(listed) = c.relist.take() else {
            return;
        };
        let rev = c.rev;
        let was_synced = c.synced;
        let old = std::mem::replace(&mut c.items, listed);
        c.synced = true;
        let items = &c.items;
        c.own.retain(|k, (r, deleted)| match items.get(k) {
            Some(kv) => kv.mod_revision < *r,
            None => !*deleted,
        });
        let mut events = Vec::new();
        if was_synced {
            for (k, v) in &c.items {
                if old.get(k).is_none_or(|o| o.value != v.value) {
                    events.push(Event {
                        kind: EventKind::Put,
                        kv: v.clone(),
                    });
                }
            }
            for k in old.keys().filter(|k| !c.items.contains_key(*k)) {
                events.push(crate::mem::delete_event(k.clone(), rev));
            }
        } else {
            // The first list: watches opened before it read the store itself (the class was
            // not synced), so they get the whole class.
            events.extend(c.items.values().map(|v| Event {
                kind: EventKind::Put,
                kv: v.clone(),
            }));
        }
        events.sort_by_key(|e| e.kv.mod_revision);
        st.publish(events);
        drop(st);
        self.cache.applied.notify_all();
    }
}

/// A store whose cached classes are read from a [`Cache`] (see the module doc).
pub struct CachedStore {
    inner: Arc<dyn Store>,
    cache: Arc<Cache>,
}

impl CachedStore {
    pub fn new(inner: Arc<dyn Store>, cache: Arc<Cache>) -> CachedStore {
        CachedStore { inner, cache }
    }

    /// The store behind the copy.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The copy.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// The copy's state once the class of `prefix` is synced and has delivered this process's
    /// own writes under `prefix`; `None` to read the store instead.
    fn served(&self, prefix: &str) -> Option<(MutexGuard<'_, State>, usize)> {
        let mut st = self.cache.state.lock().unwrap();
        let class = st.class_of(prefix)?;
        let deadline = Instant::now() + OWN_WRITE_WAIT;
        loop {
            let c = &mut st.classes[class];
            if !c.synced {
                return None;
            }
            let waiting = c
                .own
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .count();
            if waiting == 0 {
                return Some((st, class));
            }
            let now = Instant::now();
            if now >= deadline {
                log::debug!(
                    "cache: {prefix}: {waiting} own writes not delivered yet; reading the store"
                );
                c.own.retain(|k, _| !k.starts_with(prefix));
                return None;
            }
            st = self
                .cache
                .applied
                .wait_timeout(st, deadline - now)
                .unwrap()
                .0;
        }
    }
}

impl Store for CachedStore {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        if let Some((st, class)) = self.served(key)
            && st.classes[class].serve_gets
        {
            return Ok(st.classes[class].items.get(key).cloned());
        }
        self.inner.get(key)
    }

    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        if let Some((st, class)) = self.served(prefix) {
            let c = &st.classes[class];
            let kvs = c
                .items
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(_, v)| v.clone())
                .collect();
            return Ok((kvs, c.rev));
        }
        self.inner.range(prefix)
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let (success, failure) = (txn.success.clone(), txn.failure.clone());
        let r = self.inner.txn(txn);
        // An ambiguous write may have been applied, at an unknown revision: nothing waits for
        // it (the next range may miss it, as any reader of an ambiguous write may).
        if let Ok(resp) = &r {
            let ops = if resp.succeeded { &success } else { &failure };
            let mut st = self.cache.state.lock().unwrap();
            for op in ops {
                let (key, deleted) = match op {
                    crate::Op::Put { key, .. } => (key, false),
                    crate::Op::Delete { key } => (key, true),
                    crate::Op::DeletePrefix { .. } => continue,
                };
                if let Some(class) = st.class_of(key) {
                    let c = &mut st.classes[class];
                    let delivered = match c.items.get(key) {
                        Some(kv) => kv.mod_revision >= resp.revision,
                        None => deleted,
                    };
                    if !delivered {
                        c.own.insert(key.clone(), (resp.revision, deleted));
                    }
                }
            }
        }
        r
    }

    fn revision(&self) -> Result<i64> {
        self.inner.revision()
    }

    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        self.watch_prefixes(&[prefix], after_revision)
    }

    fn watch_prefixes(&self, prefixes: &[&str], after_revision: i64) -> Result<Box<dyn Watch>> {
        let mut st = self.cache.state.lock().unwrap();
        if prefixes.is_empty() || prefixes.iter().any(|p| st.class_of(p).is_none()) {
            drop(st);
            return self.inner.watch_prefixes(prefixes, after_revision);
        }
        let (tx, rx) = sync_channel(WATCH_QUEUE);
        let overflowed = Arc::new(AtomicBool::new(false));
        let id = st.next_watch;
        st.next_watch += 1;
        st.watches.push(Subscriber {
            id,
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            tx,
            overflowed: overflowed.clone(),
        });
        Ok(Box::new(CacheWatch {
            cache: self.cache.clone(),
            id,
            rx,
            overflowed,
        }))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        self.inner.lease_grant(ttl)
    }

    fn lease_keepalive(&self, lease: i64) -> Result<()> {
        self.inner.lease_keepalive(lease)
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        self.inner.lease_revoke(lease)
    }

    fn integrity_problem(&self) -> Option<String> {
        self.inner.integrity_problem()
    }

    fn multi_key_txn(&self) -> bool {
        self.inner.multi_key_txn()
    }

    fn derives_endpoints(&self) -> bool {
        self.inner.derives_endpoints()
    }

    fn has_prefix(&self, prefix: &str) -> Result<bool> {
        if let Some((st, class)) = self.served(prefix) {
            let c = &st.classes[class];
            return Ok(c
                .items
                .range(prefix.to_string()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(prefix)));
        }
        self.inner.has_prefix(prefix)
    }
}

/// A watch served by the copy.
struct CacheWatch {
    cache: Arc<Cache>,
    id: u64,
    rx: Receiver<Vec<Event>>,
    overflowed: Arc<AtomicBool>,
}

impl Watch for CacheWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        let mut out = match self.rx.recv_timeout(timeout) {
            Ok(b) => b,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Vec::new(),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Vec::new(),
        };
        while let Ok(more) = self.rx.try_recv() {
            out.extend(more);
        }
        if out.is_empty() && self.overflowed.load(Ordering::Relaxed) {
            return Err(StoreError::Compacted {
                requested: 0,
                oldest: 0,
            });
        }
        Ok(out)
    }
}

impl Drop for CacheWatch {
    fn drop(&mut self) {
        let mut st = self.cache.state.lock().unwrap();
        st.watches.retain(|w| w.id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;
    use crate::testing::{Call, Hook, Hooked, Verdict};
    use std::sync::atomic::AtomicUsize;

    /// Counts the calls that reach the store.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Hook for Count {
        fn before(&self, _: &Call<'_>) -> Verdict {
            self.0.fetch_add(1, Ordering::Relaxed);
            Verdict::Forward
        }
    }

    type Counted = Hooked<Count>;

    fn calls(s: &Counted) -> usize {
        s.hook.0.load(Ordering::Relaxed)
    }

    fn counted() -> Arc<Counted> {
        Hooked::new(Arc::new(MemStore::new()), Count::default())
    }

    const PODS: &str = "/p/";
    const BLOCKS: &str = "/b/";

    fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        }
    }

    /// A cache over a counting store, both classes listed (empty).
    fn setup() -> (Arc<Counted>, CachedStore, Feed, Feed) {
        let inner = counted();
        let cache = Cache::new(vec![
            ClassSpec {
                serve_gets: true,
                ..ClassSpec::new(PODS)
            },
            ClassSpec::new(BLOCKS),
        ]);
        let s = CachedStore::new(inner.clone(), cache.clone());
        let pods = cache.feed(PODS).unwrap();
        let blocks = cache.feed(BLOCKS).unwrap();
        for f in [&pods, &blocks] {
            f.relist_begin();
            f.relist_end();
        }
        (inner, s, pods, blocks)
    }

    #[test]
    fn ranges_of_a_synced_class_are_served_from_the_copy() {
        let inner = counted();
        inner.put("/b/x", b"store").unwrap();
        let cache = Cache::new(vec![ClassSpec::new(BLOCKS)]);
        let s = CachedStore::new(inner.clone(), cache.clone());
        // Not synced: the store answers.
        assert_eq!(s.range(BLOCKS).unwrap().0[0].value, b"store");
        let f = cache.feed(BLOCKS).unwrap();
        f.relist_begin();
        f.relisted(kv("/b/x", "listed", 7));
        f.relisted(kv("/b/y", "listed", 8));
        assert!(!cache.synced());
        f.relist_end();
        assert!(cache.synced());
        let before = calls(&inner);
        let (kvs, rev) = s.range("/b/").unwrap();
        assert_eq!(kvs.len(), 2);
        assert_eq!((kvs[0].value.as_slice(), rev), (b"listed".as_slice(), 8));
        assert_eq!(s.range("/b/y").unwrap().0.len(), 1);
        assert!(s.has_prefix("/b/x").unwrap() && !s.has_prefix("/b/z").unwrap());
        assert_eq!(calls(&inner), before, "no store call");
        // Outside the cached classes, and gets of a class that does not serve them: the store.
        s.range("/other/").unwrap();
        s.get("/b/x").unwrap();
        assert_eq!(calls(&inner), before + 2);
    }

    #[test]
    fn watches_get_what_the_feed_applies_after_they_open() {
        let (_, s, pods, blocks) = setup();
        pods.put(kv("/p/early", "1", 2));
        let mut w = s.watch_prefixes(&[PODS], 0).unwrap();
        pods.put(kv("/p/a", "1", 3));
        blocks.put(kv("/b/x", "1", 4));
        pods.put(kv("/p/a", "1", 5)); // same value: no event
        pods.put(kv("/p/a", "2", 6));
        pods.delete("/p/early", 7);
        pods.delete("/p/never", 8); // unknown: no event
        let ev = w.next_events(Duration::from_millis(100)).unwrap();
        let got: Vec<(EventKind, &str, i64)> = ev
            .iter()
            .map(|e| (e.kind.clone(), e.kv.key.as_str(), e.kv.mod_revision))
            .collect();
        assert_eq!(
            got,
            vec![
                (EventKind::Put, "/p/a", 3),
                (EventKind::Put, "/p/a", 6),
                (EventKind::Delete, "/p/early", 7)
            ]
        );
        // The unchanged put still moved the copy's revision.
        assert_eq!(s.get("/p/a").unwrap().unwrap().mod_revision, 6);
        assert!(w.next_events(Duration::from_millis(10)).unwrap().is_empty());
    }

    #[test]
    fn a_relist_replaces_the_copy_and_reports_the_difference() {
        let (_, s, pods, _) = setup();
        pods.put(kv("/p/keep", "1", 2));
        pods.put(kv("/p/change", "1", 3));
        pods.put(kv("/p/gone", "1", 4));
        let mut w = s.watch_prefixes(&[PODS], 0).unwrap();
        pods.relist_begin();
        pods.relisted(kv("/p/keep", "1", 2));
        pods.relisted(kv("/p/change", "2", 9));
        pods.relisted(kv("/p/new", "1", 10));
        // The copy serves the old state until the list is complete.
        assert_eq!(s.range(PODS).unwrap().0.len(), 3);
        assert!(w.next_events(Duration::from_millis(10)).unwrap().is_empty());
        pods.relist_end();
        let keys: Vec<String> = s
            .range(PODS)
            .unwrap()
            .0
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["/p/change", "/p/keep", "/p/new"]);
        let ev = w.next_events(Duration::from_millis(100)).unwrap();
        let got: Vec<(EventKind, &str)> = ev
            .iter()
            .map(|e| (e.kind.clone(), e.kv.key.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (EventKind::Put, "/p/change"),
                (EventKind::Put, "/p/new"),
                (EventKind::Delete, "/p/gone")
            ]
        );
    }

    #[test]
    fn a_range_after_an_own_write_waits_for_its_event() {
        let (inner, s, _, blocks) = setup();
        let rev = s.put("/b/x", b"mine").unwrap();
        // The feed delivers the write a little later, from another thread.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            blocks.put(kv("/b/x", "mine", rev));
            blocks
        });
        let before = calls(&inner);
        let (kvs, _) = s.range(BLOCKS).unwrap();
        assert_eq!(kvs.len(), 1, "the own write is seen");
        assert_eq!(calls(&inner), before, "served by the copy");
        let blocks = t.join().unwrap();
        // A write whose event never comes: the store is read after the wait.
        let rev2 = s.put("/b/y", b"lost").unwrap();
        assert!(rev2 > rev);
        let t0 = Instant::now();
        let (kvs, _) = s.range(BLOCKS).unwrap();
        assert_eq!(kvs.len(), 2, "the store's answer");
        assert!(t0.elapsed() >= OWN_WRITE_WAIT);
        drop(blocks);
    }

    #[test]
    fn only_writes_that_happened_are_waited_for() {
        let (inner, s, _, blocks) = setup();
        // A lost compare-and-swap wrote nothing: no wait, no store read.
        let lost = s
            .txn(Txn::when(
                vec![crate::Compare::ModRevision("/b/x".into(), 42)],
                vec![crate::Op::put("/b/x", "v")],
            ))
            .unwrap();
        assert!(!lost.succeeded);
        let before = calls(&inner);
        let t0 = Instant::now();
        assert!(s.range(BLOCKS).unwrap().0.is_empty());
        assert!(t0.elapsed() < OWN_WRITE_WAIT);
        assert_eq!(calls(&inner), before);
        // An own delete is delivered once the key is gone from the copy; a range of another
        // part of the class does not wait for it.
        let rev = s.put("/b/x/1", b"v").unwrap();
        blocks.put(kv("/b/x/1", "v", rev));
        let del = s.delete("/b/x/1").unwrap();
        let t0 = Instant::now();
        assert!(s.range("/b/y").unwrap().0.is_empty());
        assert!(t0.elapsed() < OWN_WRITE_WAIT);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            blocks.delete("/b/x/1", del);
        });
        let before = calls(&inner);
        assert!(s.range("/b/x").unwrap().0.is_empty(), "the delete is seen");
        assert_eq!(calls(&inner), before);
        t.join().unwrap();
    }

    #[test]
    fn a_slow_watch_is_ended_as_compacted_and_the_rest_continue() {
        let (_, s, pods, _) = setup();
        let mut slow = s.watch_prefixes(&[PODS], 0).unwrap();
        let mut fast = s.watch_prefixes(&[PODS], 0).unwrap();
        for i in 0..WATCH_QUEUE + 10 {
            pods.put(kv(&format!("/p/{i}"), "v", i as i64 + 1));
            if i % 100 == 0 {
                fast.next_events(Duration::ZERO).unwrap();
            }
        }
        let mut drained = 0;
        loop {
            match slow.next_events(Duration::ZERO) {
                Ok(ev) if ev.is_empty() => panic!("no error after {drained} events"),
                Ok(ev) => drained += ev.len(),
                Err(StoreError::Compacted { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(drained, WATCH_QUEUE);
        pods.put(kv("/p/last", "v", 99_999));
        let ev = fast.next_events(Duration::from_millis(100)).unwrap();
        assert_eq!(ev.last().unwrap().kv.key, "/p/last");
    }

    #[test]
    fn gets_of_a_read_only_class_come_from_the_copy() {
        let (inner, s, pods, _) = setup();
        pods.put(kv("/p/a", "1", 3));
        let before = calls(&inner);
        assert_eq!(s.get("/p/a").unwrap().unwrap().value, b"1");
        assert_eq!(s.get("/p/b").unwrap(), None);
        assert_eq!(calls(&inner), before);
    }

    #[test]
    fn a_watch_across_an_uncached_prefix_goes_to_the_store() {
        let (inner, s, _, _) = setup();
        let before = calls(&inner);
        let _w = s.watch_prefixes(&[PODS, "/other/"], 0).unwrap();
        assert_eq!(calls(&inner), before + 1);
    }

    #[test]
    #[should_panic(expected = "overlap")]
    fn overlapping_classes_are_refused() {
        Cache::new(vec![ClassSpec::new("/a/"), ClassSpec::new("/a/b/")]);
    }
}
