//! A store for tests that watches or disturbs the calls of the code under test: [`Hooked`]
//! forwards every call to an inner store after asking its [`Hook`], which may count the call,
//! fail it, or let it apply and then lose the answer (an ambiguous write, as after a timeout).
//!
//! Behind the `test-support` feature, like the conformance suite.

use std::sync::Arc;
use std::time::Duration;

use crate::{KeyValue, Result, Store, StoreError, Txn, TxnResponse, Watch};

/// A call of a [`Hooked`] store that its hook sees before it is forwarded.
#[derive(Debug)]
pub enum Call<'a> {
    /// [`Store::get`] of this key.
    Get(&'a str),
    /// [`Store::range`] of this prefix.
    Range(&'a str),
    /// [`Store::txn`] (every write goes through it).
    Txn(&'a Txn),
    /// [`Store::watch`] of this prefix after this revision.
    Watch(&'a str, i64),
}

/// What a [`Hook`] makes of a call.
#[derive(Debug)]
pub enum Verdict {
    /// Forward it to the inner store.
    Forward,
    /// Fail with this error without forwarding.
    Fail(StoreError),
    /// Forward it, then report this error instead of the answer (when forwarding itself
    /// succeeded).
    ApplyThenFail(StoreError),
}

/// Decides about each get, range, txn and watch of a [`Hooked`] store; keeps whatever the test reads
/// back (counters, armed faults).
pub trait Hook: Send + Sync {
    /// Called before `call` is forwarded.
    fn before(&self, call: &Call<'_>) -> Verdict;

    /// What the hooked store answers to [`Store::multi_key_txn`], given `inner`'s answer.
    fn multi_key_txn(&self, inner: bool) -> bool {
        inner
    }

    /// What the hooked store answers to [`Store::derives_endpoints`], given `inner`'s answer.
    fn derives_endpoints(&self, inner: bool) -> bool {
        inner
    }
}

/// A store forwarding to `inner`, with `hook` consulted before each get, range, txn and watch;
/// the other calls (revision, leases) are forwarded as they are.
pub struct Hooked<H> {
    /// The store calls are forwarded to.
    pub inner: Arc<dyn Store>,
    /// The test's hook, readable while the store is in use.
    pub hook: H,
}

impl<H: Hook> Hooked<H> {
    /// A hooked store over `inner`, shareable as `Arc<dyn Store>`.
    pub fn new(inner: Arc<dyn Store>, hook: H) -> Arc<Hooked<H>> {
        Arc::new(Hooked { inner, hook })
    }

    fn through<T>(&self, call: Call<'_>, forward: impl FnOnce() -> Result<T>) -> Result<T> {
        match self.hook.before(&call) {
            Verdict::Forward => forward(),
            Verdict::Fail(e) => Err(e),
            Verdict::ApplyThenFail(e) => forward().and(Err(e)),
        }
    }
}

impl<H: Hook> Store for Hooked<H> {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.through(Call::Get(key), || self.inner.get(key))
    }
    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        self.through(Call::Range(prefix), || self.inner.range(prefix))
    }
    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        match self.hook.before(&Call::Txn(&txn)) {
            Verdict::Forward => self.inner.txn(txn),
            Verdict::Fail(e) => Err(e),
            Verdict::ApplyThenFail(e) => self.inner.txn(txn).and(Err(e)),
        }
    }
    fn revision(&self) -> Result<i64> {
        self.inner.revision()
    }
    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        self.through(Call::Watch(prefix, after_revision), || {
            self.inner.watch(prefix, after_revision)
        })
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
    fn multi_key_txn(&self) -> bool {
        self.hook.multi_key_txn(self.inner.multi_key_txn())
    }
    fn derives_endpoints(&self) -> bool {
        self.hook.derives_endpoints(self.inner.derives_endpoints())
    }
}

/// A store forwarding to `inner` that takes transactions on one key only, refusing the
/// others as the Kubernetes datastore does ([`Store::multi_key_txn`] false): the fast
/// stand-in for `kube::KubeStore` in unit tests of what callers do on such a store (the
/// Kubernetes backend itself runs against a real kube-apiserver). Made by [`single_object`].
pub type SingleObject = Hooked<SingleKeyOnly>;

/// A [`SingleObject`] store over `inner`.
pub fn single_object(inner: Arc<dyn Store>) -> Arc<SingleObject> {
    Hooked::new(inner, SingleKeyOnly)
}

/// The hook of [`SingleObject`]: a transaction touching more than one key fails as the
/// Kubernetes datastore fails it, without reaching the inner store.
pub struct SingleKeyOnly;

impl Hook for SingleKeyOnly {
    fn before(&self, call: &Call<'_>) -> Verdict {
        match call {
            Call::Txn(t) => match crate::single_key(t) {
                Err(e) => Verdict::Fail(e),
                Ok(_) => Verdict::Forward,
            },
            _ => Verdict::Forward,
        }
    }

    fn multi_key_txn(&self, _inner: bool) -> bool {
        false
    }
}

/// A store that behaves as the Kubernetes datastore does towards its callers: transactions on
/// one key only, and WorkloadEndpoints derived from elsewhere ([`Store::derives_endpoints`]),
/// so a write under their prefix is refused. A test stands in for the cluster's Pods by
/// writing endpoint documents into `inner` directly. Made by [`kube_like`].
pub type KubeLike = Hooked<KubeLikeHook>;

/// A [`KubeLike`] store over `inner`.
pub fn kube_like(inner: Arc<dyn Store>) -> Arc<KubeLike> {
    Hooked::new(inner, KubeLikeHook)
}

/// The hook of [`KubeLike`].
pub struct KubeLikeHook;

impl Hook for KubeLikeHook {
    fn before(&self, call: &Call<'_>) -> Verdict {
        let weps = crate::keys::resource_prefix("WorkloadEndpoint");
        match call {
            Call::Txn(t) => match crate::single_key(t) {
                Err(e) => Verdict::Fail(e),
                Ok(Some(k)) if k.starts_with(&weps) => Verdict::Fail(StoreError::Backend(format!(
                    "{k:?}: WorkloadEndpoints are derived and cannot be written"
                ))),
                Ok(_) => Verdict::Forward,
            },
            _ => Verdict::Forward,
        }
    }

    fn multi_key_txn(&self, _inner: bool) -> bool {
        false
    }

    fn derives_endpoints(&self, _inner: bool) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::mem::MemStore;

    /// Counts txns and loses the answer of every put under `/lost/` after applying it.
    #[derive(Default)]
    struct Lossy(AtomicUsize);
    impl Hook for Lossy {
        fn before(&self, call: &Call<'_>) -> Verdict {
            match call {
                Call::Txn(t) => {
                    self.0.fetch_add(1, Ordering::SeqCst);
                    let lost = t.success.iter().any(
                        |op| matches!(op, crate::Op::Put { key, .. } if key.starts_with("/lost/")),
                    );
                    if lost {
                        Verdict::ApplyThenFail(StoreError::Ambiguous("lost".into()))
                    } else {
                        Verdict::Forward
                    }
                }
                Call::Get(k) if k.starts_with("/down/") => {
                    Verdict::Fail(StoreError::Unavailable("down".into()))
                }
                _ => Verdict::Forward,
            }
        }
    }

    #[test]
    fn the_hook_counts_fails_and_loses_answers() {
        let s = Hooked::new(Arc::new(MemStore::new()), Lossy::default());
        s.put("/a", b"1").unwrap();
        assert!(matches!(
            s.put("/lost/b", b"2"),
            Err(StoreError::Ambiguous(_))
        ));
        assert_eq!(s.get("/lost/b").unwrap().unwrap().value, b"2", "applied");
        assert!(matches!(s.get("/down/x"), Err(StoreError::Unavailable(_))));
        assert_eq!(s.hook.0.load(Ordering::SeqCst), 2);
    }
}
