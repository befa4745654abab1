//! In-process backend: a `BTreeMap` behind a mutex, with the full etcd semantics of [`Store`].
//!
//! Used by unit tests of the crates above the store (IPAM, agent) and as the reference the other
//! backends are compared against. A condition variable wakes watchers on every write; lease expiry
//! is checked lazily on every call and while a watcher waits, so no background thread exists.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Store, StoreError, Txn, TxnResponse, Watch,
};

/// Default number of revisions whose events are kept for watchers.
pub const DEFAULT_HISTORY: usize = 10_000;

/// In-memory [`Store`]; clones share the same data.
#[derive(Clone)]
pub struct MemStore {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Notified after every write so that waiting watchers re-scan the history.
    changed: Condvar,
}

struct Lease {
    ttl: Duration,
    expires: Instant,
    keys: BTreeSet<String>,
}

struct Inner {
    kv: BTreeMap<String, KeyValue>,
    revision: i64,
    /// Events of the last `history` revisions, oldest first, each tagged with its revision.
    events: VecDeque<Event>,
    /// Events with revision <= `compacted` are gone.
    compacted: i64,
    history: usize,
    leases: HashMap<i64, Lease>,
    next_lease: i64,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemStore {
    /// An empty store keeping [`DEFAULT_HISTORY`] revisions of watch history.
    pub fn new() -> MemStore {
        MemStore::with_history(DEFAULT_HISTORY)
    }

    /// An empty store keeping the events of the last `history` revisions (at least 1); watching
    /// from an older revision fails with [`StoreError::Compacted`].
    pub fn with_history(history: usize) -> MemStore {
        MemStore {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    kv: BTreeMap::new(),
                    revision: 0,
                    events: VecDeque::new(),
                    compacted: 0,
                    history: history.max(1),
                    leases: HashMap::new(),
                    next_lease: 1,
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// Locks the state and reaps expired leases first, so every call sees a consistent view.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock_and_reap(&self.shared)
    }
}

fn lock_and_reap(shared: &Shared) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock cannot leave the maps half-updated in a way that matters more
    // than losing the whole store, so recover the guard instead of propagating the poison.
    let mut inner = shared.inner.lock().unwrap_or_else(|e| e.into_inner());
    if inner.reap_expired(Instant::now()) {
        shared.changed.notify_all();
    }
    inner
}

impl Inner {
    /// Deletes the keys of every expired lease, one revision per lease (as etcd revokes them).
    /// Returns true when something was written.
    fn reap_expired(&mut self, now: Instant) -> bool {
        let mut expired: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        expired.sort_unstable();
        let mut wrote = false;
        for id in expired {
            wrote |= self.revoke(id);
        }
        wrote
    }

    /// Removes the lease and its keys; true when a key was deleted.
    fn revoke(&mut self, id: i64) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        if lease.keys.is_empty() {
            return false;
        }
        let rev = self.revision + 1;
        let mut events = Vec::new();
        for key in lease.keys {
            if self.kv.remove(&key).is_some() {
                events.push(delete_event(key, rev));
            }
        }
        self.commit(rev, events)
    }

    /// Makes `rev` the current revision if `events` is not empty; records the events.
    fn commit(&mut self, rev: i64, events: Vec<Event>) -> bool {
        if events.is_empty() {
            return false;
        }
        self.revision = rev;
        self.events.extend(events);
        // Keep only the last `history` revisions: drop whole revisions from the front.
        let floor = self.revision - self.history as i64;
        while let Some(front) = self.events.front() {
            if front.kv.mod_revision > floor {
                break;
            }
            self.compacted = front.kv.mod_revision;
            self.events.pop_front();
        }
        self.compacted = self.compacted.max(floor.max(0));
        true
    }

    fn compare_holds(&self, c: &Compare) -> bool {
        match c {
            Compare::ModRevision(k, v) => self.kv.get(k).map_or(0, |kv| kv.mod_revision) == *v,
            Compare::CreateRevision(k, v) => {
                self.kv.get(k).map_or(0, |kv| kv.create_revision) == *v
            }
            Compare::Version(k, v) => self.kv.get(k).map_or(0, |kv| kv.version) == *v,
            Compare::Value(k, v) => self.kv.get(k).is_some_and(|kv| kv.value == *v),
        }
    }

    fn detach(&mut self, key: &str, lease: i64) {
        if lease != 0
            && let Some(l) = self.leases.get_mut(&lease)
        {
            l.keys.remove(key);
        }
    }

    /// Applies `ops` at revision `rev`, returning the events produced.
    fn apply(&mut self, ops: Vec<Op>, rev: i64) -> Vec<Event> {
        let mut events = Vec::new();
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    let (create_revision, version, old_lease) = match self.kv.get(&key) {
                        Some(old) => (old.create_revision, old.version + 1, old.lease),
                        None => (rev, 1, 0),
                    };
                    if old_lease != lease {
                        self.detach(&key, old_lease);
                    }
                    if lease != 0
                        && let Some(l) = self.leases.get_mut(&lease)
                    {
                        l.keys.insert(key.clone());
                    }
                    let kv = KeyValue {
                        key: key.clone(),
                        value,
                        create_revision,
                        mod_revision: rev,
                        version,
                        lease,
                    };
                    self.kv.insert(key, kv.clone());
                    events.push(Event {
                        kind: EventKind::Put,
                        kv,
                    });
                }
                Op::Delete { key } => {
                    if let Some(old) = self.kv.remove(&key) {
                        self.detach(&key, old.lease);
                        events.push(delete_event(key, rev));
                    }
                }
                Op::DeletePrefix { prefix } => {
                    let keys: Vec<String> = self
                        .kv
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in keys {
                        if let Some(old) = self.kv.remove(&key) {
                            self.detach(&key, old.lease);
                            events.push(delete_event(key, rev));
                        }
                    }
                }
            }
        }
        events
    }
}

/// The event etcd reports for a deletion: the key, empty value, `mod_revision` of the deletion.
pub(crate) fn delete_event(key: String, rev: i64) -> Event {
    Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key,
            value: Vec::new(),
            create_revision: 0,
            mod_revision: rev,
            version: 0,
            lease: 0,
        },
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.lock().kv.get(key).cloned())
    }

    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        let inner = self.lock();
        let kvs = inner
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .collect();
        Ok((kvs, inner.revision))
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        crate::check_txn_size(&txn)?;
        let mut inner = self.lock();
        let succeeded = txn.compare.iter().all(|c| inner.compare_holds(c));
        let ops = if succeeded { txn.success } else { txn.failure };
        // Validate before applying anything, so a bad lease leaves the store untouched.
        for op in &ops {
            if let Op::Put { lease, .. } = op
                && *lease != 0
                && !inner.leases.contains_key(lease)
            {
                return Err(StoreError::LeaseNotFound(*lease));
            }
        }
        let rev = inner.revision + 1;
        let events = inner.apply(ops, rev);
        if inner.commit(rev, events) {
            self.shared.changed.notify_all();
        }
        Ok(TxnResponse {
            succeeded,
            revision: inner.revision,
        })
    }

    fn revision(&self) -> Result<i64> {
        Ok(self.lock().revision)
    }

    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        let inner = self.lock();
        check_compacted(&inner, after_revision)?;
        Ok(Box::new(MemWatch {
            shared: self.shared.clone(),
            prefix: prefix.to_string(),
            after: after_revision,
        }))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        let mut inner = self.lock();
        let id = inner.next_lease;
        inner.next_lease += 1;
        inner.leases.insert(
            id,
            Lease {
                ttl,
                expires: Instant::now() + ttl,
                keys: BTreeSet::new(),
            },
        );
        // A watcher may be sleeping until the previous earliest expiry; let it recompute.
        self.shared.changed.notify_all();
        Ok(id)
    }

    fn lease_keepalive(&self, lease: i64) -> Result<()> {
        let mut inner = self.lock();
        let l = inner
            .leases
            .get_mut(&lease)
            .ok_or(StoreError::LeaseNotFound(lease))?;
        l.expires = Instant::now() + l.ttl;
        Ok(())
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        let mut inner = self.lock();
        if !inner.leases.contains_key(&lease) {
            return Err(StoreError::LeaseNotFound(lease));
        }
        if inner.revoke(lease) {
            self.shared.changed.notify_all();
        }
        Ok(())
    }
}

fn check_compacted(inner: &Inner, after_revision: i64) -> Result<()> {
    if after_revision < inner.compacted {
        return Err(StoreError::Compacted {
            requested: after_revision + 1,
            oldest: inner.compacted + 1,
        });
    }
    Ok(())
}

/// A watcher on a [`MemStore`]: scans the shared history for revisions after the last delivered.
struct MemWatch {
    shared: Arc<Shared>,
    prefix: String,
    after: i64,
}

impl Watch for MemWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        let mut inner = lock_and_reap(&self.shared);
        loop {
            check_compacted(&inner, self.after)?;
            if inner.revision > self.after {
                let out: Vec<Event> = inner
                    .events
                    .iter()
                    .filter(|e| {
                        e.kv.mod_revision > self.after && e.kv.key.starts_with(&self.prefix)
                    })
                    .cloned()
                    .collect();
                // Everything up to the current revision has been examined, matching or not.
                self.after = inner.revision;
                if !out.is_empty() {
                    return Ok(out);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            // Wake at the earliest lease expiry too: its delete events may concern this watcher.
            let mut wake = deadline;
            if let Some(exp) = inner.leases.values().map(|l| l.expires).min() {
                wake = wake.min(exp.max(now));
            }
            let (guard, _) = self
                .shared
                .changed
                .wait_timeout(inner, wake - now)
                .unwrap_or_else(|e| e.into_inner());
            inner = guard;
            if inner.reap_expired(Instant::now()) {
                self.shared.changed.notify_all();
            }
        }
    }
}
