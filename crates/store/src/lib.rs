//! tern's datastore: one trait with etcd v3 semantics and the backends behind it.
//!
//! Every key carries `create_revision`, `mod_revision` and `version`; the store keeps a global
//! revision counter that increases by one for every transaction that changes something. Writers
//! that must not lose a race use [`Store::txn`] with a [`Compare`] on `mod_revision` (or on
//! existence), exactly as they would against etcd. Watchers resume from a revision.
//!
//! Backends: [`mem::MemStore`] (in-process, for unit tests), [`sqlite::SqliteStore`] (embedded,
//! safe across processes on one host), [`etcd::EtcdStore`] (an etcd v3 cluster). All of
//! them pass `conformance`, the suite that tests enable with the `test-support` feature (with
//! `etcd::harness`, throw-away etcd processes); production builds carry neither.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

pub mod cache;
#[cfg(feature = "test-support")]
pub mod conformance;
pub mod etcd;
mod http;
pub mod keys;
pub mod kube;
pub mod kube_pods;
pub mod mem;
pub mod migrate;
pub mod sqlite;
#[cfg(feature = "test-support")]
pub mod testing;

/// A stored key and its metadata, as etcd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// Revision of the transaction that created this key (since its last deletion).
    pub create_revision: i64,
    /// Revision of the transaction that last modified this key.
    pub mod_revision: i64,
    /// Number of modifications since creation (1 after create).
    pub version: i64,
    /// Lease the key is attached to, 0 for none.
    pub lease: i64,
}

/// A condition evaluated atomically at the start of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key's `mod_revision` equals the value; 0 means "the key does not exist".
    ModRevision(String, i64),
    /// The key's `create_revision` equals the value; 0 means "the key does not exist".
    CreateRevision(String, i64),
    /// The key's `version` equals the value; 0 means "the key does not exist".
    Version(String, i64),
    /// The key's value equals the bytes (false when the key is absent).
    Value(String, Vec<u8>),
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Put the value; `lease` 0 detaches any lease.
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    /// Delete the key (no error if absent).
    Delete { key: String },
    /// Delete every key starting with the prefix.
    DeletePrefix { prefix: String },
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease: 0,
        }
    }
    pub fn delete(key: impl Into<String>) -> Op {
        Op::Delete { key: key.into() }
    }
}

/// If every compare holds, apply `success`, else apply `failure`; all in one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    /// The usual compare-and-swap: apply `success` if every compare holds, else nothing.
    pub fn when(compare: Vec<Compare>, success: Vec<Op>) -> Txn {
        Txn {
            compare,
            success,
            failure: vec![],
        }
    }
}

/// Outcome of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// True when every compare held and `success` was applied.
    pub succeeded: bool,
    /// The store revision after the transaction (unchanged if nothing was written).
    pub revision: i64,
}

/// A change seen by a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    /// For a put, the new key-value; for a delete, the key with empty value and
    /// `mod_revision` set to the revision of the deletion.
    pub kv: KeyValue,
}

/// Errors of every backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached (etcd down, file unreadable); the caller may retry later.
    #[error("datastore unavailable: {0}")]
    Unavailable(String),
    /// A write was sent and its answer lost (a member died or the leader changed), and the
    /// store could not tell whether it was applied. Unlike a failed compare, the caller must
    /// read its own keys back before it retries (IPAM looks for its handle); like
    /// [`StoreError::Unavailable`] it means "try again later" to a CNI runtime.
    #[error("datastore write outcome unknown: {0}")]
    Ambiguous(String),
    /// The watch start revision has been compacted away; resync with a fresh range.
    #[error("revision {requested} has been compacted (oldest kept: {oldest})")]
    Compacted { requested: i64, oldest: i64 },
    /// The lease does not exist or has expired.
    #[error("lease {0} not found")]
    LeaseNotFound(i64),
    /// A store URL or option is malformed.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// The store refused this caller the request (Kubernetes RBAC, HTTP 403); the message
    /// names the verb and the resource. To a CNI runtime it means "try again later": an API
    /// server that has just restarted answers 403 until its authorizer's caches are filled
    /// (kubernetes#121635), and a missing grant is fixed without restarting anything.
    #[error("datastore refused the request: {0}")]
    Forbidden(String),
    /// Anything else the backend reports.
    #[error("datastore error: {0}")]
    Backend(String),
    /// A value (or a whole transaction) exceeds [`MAX_VALUE_BYTES`]; nothing was written.
    #[error("{0}")]
    TooLarge(String),
}

/// The largest value one put may carry, and the largest sum of keys and values one transaction
/// may carry: etcd's default `--max-request-bytes` (1.5 MiB). Every backend refuses more with
/// [`StoreError::TooLarge`], so a resource that fits in SQLite or memory also fits in etcd.
pub const MAX_VALUE_BYTES: usize = 1536 * 1024;

/// Refuses a transaction with a value, or keys and values in total, over [`MAX_VALUE_BYTES`].
/// Every backend calls it before touching anything.
pub fn check_txn_size(txn: &Txn) -> Result<()> {
    let mut total = 0usize;
    for c in &txn.compare {
        let (k, v) = match c {
            Compare::ModRevision(k, _) | Compare::CreateRevision(k, _) | Compare::Version(k, _) => {
                (k, 0)
            }
            Compare::Value(k, v) => (k, v.len()),
        };
        total = total.saturating_add(k.len()).saturating_add(v);
    }
    for op in txn.success.iter().chain(&txn.failure) {
        let (key, len) = match op {
            Op::Put { key, value, .. } => (key, value.len()),
            Op::Delete { key } => (key, 0),
            Op::DeletePrefix { prefix } => (prefix, 0),
        };
        if len > MAX_VALUE_BYTES {
            return Err(StoreError::TooLarge(format!(
                "value of key {:?} is {len} bytes; the store's limit is {MAX_VALUE_BYTES} bytes \
                 (1.5 MiB, etcd's default --max-request-bytes)",
                truncate_key(key)
            )));
        }
        total = total.saturating_add(key.len()).saturating_add(len);
    }
    if total > MAX_VALUE_BYTES {
        return Err(StoreError::TooLarge(format!(
            "transaction carries {total} bytes of keys and values; the store's limit is \
             {MAX_VALUE_BYTES} bytes (1.5 MiB, etcd's default --max-request-bytes)"
        )));
    }
    Ok(())
}

/// The one key a transaction touches (`None`: none), or the error of a store that writes one
/// object per transaction ([`Store::multi_key_txn`] false) for a transaction over several keys
/// or a prefix delete.
pub(crate) fn single_key(txn: &Txn) -> Result<Option<&str>> {
    let mut touched: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    for c in &txn.compare {
        let (Compare::ModRevision(k, _)
        | Compare::CreateRevision(k, _)
        | Compare::Version(k, _)
        | Compare::Value(k, _)) = c;
        touched.insert(k);
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            Op::Put { key, .. } | Op::Delete { key } => {
                touched.insert(key);
            }
            Op::DeletePrefix { prefix } => {
                return Err(StoreError::Backend(format!(
                    "the Kubernetes datastore writes one object per transaction; a delete of \
                     the prefix {} is not one",
                    truncate_key(prefix)
                )));
            }
        }
    }
    if touched.len() > 1 {
        let list: Vec<String> = touched.iter().take(4).map(|k| truncate_key(k)).collect();
        return Err(StoreError::Backend(format!(
            "the Kubernetes datastore writes one object per transaction; this one touches {} \
             keys ({})",
            touched.len(),
            list.join(", ")
        )));
    }
    Ok(touched.into_iter().next())
}

/// A key shortened for an error message (a hostile key may itself be huge).
fn truncate_key(key: &str) -> String {
    if key.len() <= 200 {
        return key.to_string();
    }
    let mut end = 200;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &key[..end], key.len())
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The longest prefix every one of `prefixes` starts with (on a character boundary).
pub fn common_prefix(prefixes: &[&str]) -> String {
    let Some((first, rest)) = prefixes.split_first() else {
        return String::new();
    };
    let mut len = first.len();
    for p in rest {
        len = first
            .char_indices()
            .zip(p.chars())
            .take_while(|((_, a), b)| a == b)
            .map(|((i, a), _)| i + a.len_utf8())
            .last()
            .unwrap_or(0)
            .min(len);
    }
    first[..len].to_string()
}

/// A watch that keeps the events under any of its prefixes ([`Store::watch_prefixes`]).
struct FilteredWatch {
    inner: Box<dyn Watch>,
    prefixes: Vec<String>,
}

impl Watch for FilteredWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut ev = self.inner.next_events(left)?;
            ev.retain(|e| {
                self.prefixes
                    .iter()
                    .any(|p| e.kv.key.starts_with(p.as_str()))
            });
            if !ev.is_empty() || left.is_zero() {
                return Ok(ev);
            }
        }
    }
}

/// The receiving end of a watch whose events a reader thread sends (etcd's, Kubernetes'):
/// batches of events, or the error that ended the stream.
pub(crate) struct ChannelWatch {
    rx: std::sync::mpsc::Receiver<Result<Vec<Event>>>,
    /// The datastore, for the errors ("etcd", "Kubernetes").
    what: &'static str,
    /// Set once the thread reported the end of the stream (further calls return that error).
    ended: bool,
}

impl ChannelWatch {
    pub(crate) fn new(
        rx: std::sync::mpsc::Receiver<Result<Vec<Event>>>,
        what: &'static str,
    ) -> Self {
        ChannelWatch {
            rx,
            what,
            ended: false,
        }
    }

    /// [`Watch::next_events`]: the first batch within `timeout`, then everything already
    /// received, so callers see whole bursts at once; an error ends the watch (returned once
    /// the events before it were handed over).
    pub(crate) fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        use std::sync::mpsc::RecvTimeoutError;
        if self.ended {
            return Err(StoreError::Unavailable(format!(
                "{} watch already ended; open a new one",
                self.what
            )));
        }
        let first = match self.rx.recv_timeout(timeout) {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
            Err(RecvTimeoutError::Disconnected) => {
                self.ended = true;
                return Err(StoreError::Unavailable(format!(
                    "{} watch stream closed",
                    self.what
                )));
            }
        };
        let mut out = first.inspect_err(|_| self.ended = true)?;
        while let Ok(batch) = self.rx.try_recv() {
            match batch {
                Ok(events) => out.extend(events),
                Err(e) => {
                    self.ended = true;
                    if out.is_empty() {
                        return Err(e);
                    }
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A stream of events from a prefix, starting at a revision.
pub trait Watch: Send {
    /// Waits up to `timeout` for the next batch of events (in revision order). Returns an empty
    /// vector on timeout.
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>>;
}

/// The datastore, with etcd v3 semantics. Implementations are cheap to share (`Arc<dyn Store>`).
pub trait Store: Send + Sync {
    /// Reads one key.
    fn get(&self, key: &str) -> Result<Option<KeyValue>>;
    /// Reads every key with the prefix, sorted by key, and the store revision of the read.
    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)>;
    /// Runs a transaction atomically.
    fn txn(&self, txn: Txn) -> Result<TxnResponse>;
    /// The store's current revision.
    fn revision(&self) -> Result<i64>;
    /// Watches every key with the prefix, delivering events with revision > `after_revision`.
    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>>;

    /// Watches every key under any of `prefixes`, delivering events with revision >
    /// `after_revision`. A consumer that needs a few kinds of keys names them: the Kubernetes
    /// backend then opens a stream for those resources only (a watch of the whole root is
    /// one stream per resource, on every node). The default watches the prefixes' common
    /// prefix and drops the events under none of them.
    fn watch_prefixes(&self, prefixes: &[&str], after_revision: i64) -> Result<Box<dyn Watch>> {
        let inner = self.watch(&common_prefix(prefixes), after_revision)?;
        Ok(Box::new(FilteredWatch {
            inner,
            prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
        }))
    }
    /// Grants a lease that expires `ttl` after its last keep-alive; keys put with it are deleted
    /// when it expires or is revoked.
    fn lease_grant(&self, ttl: Duration) -> Result<i64>;
    /// Renews a lease.
    fn lease_keepalive(&self, lease: i64) -> Result<()>;
    /// Revokes a lease and deletes its keys.
    fn lease_revoke(&self, lease: i64) -> Result<()>;

    /// Why this handle no longer reaches the data it opened, if it does not: for SQLite, the
    /// file at the store's path was deleted or replaced since it was opened (the handle still
    /// works on the old, unlinked file, so nothing else would notice). `None` when all is well
    /// or the backend cannot tell.
    fn integrity_problem(&self) -> Option<String> {
        None
    }

    /// True when a transaction may compare and write several keys atomically (etcd, SQLite,
    /// memory). The Kubernetes backend takes one object per transaction
    /// ([`kube::KubeStore`]); callers that write several keys check this and order their
    /// writes so that a crash between any two leaves the store consistent.
    fn multi_key_txn(&self) -> bool {
        true
    }

    /// True when the WorkloadEndpoints under [`keys::resource_prefix`]`("WorkloadEndpoint")`
    /// are derived from another source and cannot be written: on the Kubernetes datastore they
    /// are the cluster's Pods ([`kube_pods`]), and each agent keeps the records of its own
    /// node's attachments in a node-local store instead.
    fn derives_endpoints(&self) -> bool {
        false
    }

    /// True when at least one key has the prefix. Backends read at most one key (etcd
    /// `limit: 1`, SQLite `LIMIT 1`): testing a whole store for emptiness must not read it all.
    fn has_prefix(&self, prefix: &str) -> Result<bool> {
        Ok(!self.range(prefix)?.0.is_empty())
    }

    /// Unconditional put; returns the new revision.
    fn put(&self, key: &str, value: &[u8]) -> Result<i64> {
        Ok(self
            .txn(Txn {
                success: vec![Op::put(key, value)],
                ..Txn::default()
            })?
            .revision)
    }
    /// Unconditional delete (idempotent); returns the revision after it.
    fn delete(&self, key: &str) -> Result<i64> {
        Ok(self
            .txn(Txn {
                success: vec![Op::delete(key)],
                ..Txn::default()
            })?
            .revision)
    }
    /// Creates the key only if absent; true when created.
    fn create(&self, key: &str, value: &[u8]) -> Result<bool> {
        Ok(self
            .txn(Txn {
                compare: vec![Compare::ModRevision(key.to_string(), 0)],
                success: vec![Op::put(key, value)],
                failure: vec![],
            })?
            .succeeded)
    }
}

/// Opens the store named by a URL:
/// - `sqlite:///abs/path.db`: [`sqlite::SqliteStore`] on that file (parent directory created);
/// - `mem://`: a fresh, empty [`mem::MemStore`];
/// - `etcd://host:port[,host:port...]`: [`etcd::EtcdStore`] over plain HTTP (for TLS, see
///   [`etcd::open_with_tls`]); fails with `Unavailable` when no endpoint answers;
/// - `kubernetes`: [`kube::KubeStore`] on the API server of `$KUBECONFIG`, the pod's service
///   account or `~/.kube/config` ([`kube::KubeConfig::discover`]); `kubernetes:///path` with
///   that kubeconfig file.
pub fn open(url: &str) -> Result<Arc<dyn Store>> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if !path.starts_with('/') {
            return Err(StoreError::Config(format!(
                "store URL {url:?}: the sqlite path must be absolute (sqlite:///abs/path.db)"
            )));
        }
        let path = std::path::Path::new(path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot create directory {} for store {url:?}: {e}",
                    dir.display()
                ))
            })?;
        }
        return Ok(Arc::new(sqlite::SqliteStore::open(path)?));
    }
    if url == "mem://" || url == "mem:" {
        return Ok(Arc::new(mem::MemStore::new()));
    }
    if url.starts_with("etcd://") {
        return etcd::open_with_tls(url, None, None, None);
    }
    if let Some(store) = kube::KubeStore::open_url(url) {
        return Ok(Arc::new(store?));
    }
    Err(StoreError::Config(format!(
        "unsupported store URL {url:?} (expected sqlite:///abs/path.db, mem://, etcd://host:port, kubernetes or kubernetes:///path/to/kubeconfig)"
    )))
}

/// Longest cluster ID accepted when read back (IDs tern writes are 32 hex digits).
const MAX_CLUSTER_ID_LEN: usize = 128;

/// The cluster ID recorded in the store ([`keys::CLUSTER_ID`]), if any. A recorded value that is
/// not a short printable token is an error: the key is not one tern wrote.
pub fn read_cluster_id(store: &dyn Store) -> Result<Option<String>> {
    let Some(kv) = store.get(keys::CLUSTER_ID)? else {
        return Ok(None);
    };
    parse_cluster_id(&kv.value).map(Some).ok_or_else(|| {
        StoreError::Backend(format!(
            "the cluster ID at {} is malformed ({} bytes, expected up to {MAX_CLUSTER_ID_LEN} \
                 letters, digits or '-')",
            keys::CLUSTER_ID,
            kv.value.len()
        ))
    })
}

/// The ID in `raw` when it is a well-formed cluster ID (surrounding whitespace ignored).
pub fn parse_cluster_id(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?.trim();
    let ok = !s.is_empty()
        && s.len() <= MAX_CLUSTER_ID_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| s.to_string())
}

/// True when the store holds no tern key at all (a fresh, truncated or wiped store).
pub fn is_empty(store: &dyn Store) -> Result<bool> {
    Ok(!store.has_prefix(keys::ROOT)?)
}

/// Records a new random cluster ID with a create-only transaction and returns the ID the store
/// holds afterwards: ours, or the one another agent created first.
pub fn create_cluster_id(store: &dyn Store) -> Result<String> {
    let id = random_id()?;
    if store.create(keys::CLUSTER_ID, id.as_bytes())? {
        return Ok(id);
    }
    read_cluster_id(store)?.ok_or_else(|| {
        StoreError::Backend(format!(
            "{} was neither created nor readable (deleted concurrently?)",
            keys::CLUSTER_ID
        ))
    })
}

/// 128 random bits from the kernel, as 32 hex digits.
fn random_id() -> Result<String> {
    let mut b = [0u8; 16];
    random_bytes(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Fills `b` from the kernel's random source.
pub(crate) fn random_bytes(b: &mut [u8]) -> Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(b))
        .map_err(|e| StoreError::Backend(format!("cannot read /dev/urandom: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_of_watched_prefixes() {
        assert_eq!(common_prefix(&[]), "");
        assert_eq!(common_prefix(&["/a/b/"]), "/a/b/");
        assert_eq!(
            common_prefix(&["/tern/v1/resources/node/", "/tern/v1/ipam/blocks/"]),
            "/tern/v1/"
        );
        assert_eq!(common_prefix(&["/x/ab", "/x/a", "/x/abc"]), "/x/a");
        assert_eq!(common_prefix(&["/é/a", "/é/b"]), "/é/");
        assert_eq!(common_prefix(&["a", "b"]), "");
    }

    /// `is_empty` probes one key (`has_prefix`), with the same answer as a full range, on
    /// every local backend.
    #[test]
    fn is_empty_probes_with_has_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let stores: Vec<Box<dyn Store>> = vec![
            Box::new(mem::MemStore::new()),
            Box::new(sqlite::SqliteStore::open(dir.path().join("s.db")).unwrap()),
        ];
        for s in stores {
            assert!(is_empty(&*s).unwrap());
            s.put("/other/key", b"x").unwrap();
            assert!(is_empty(&*s).unwrap(), "a key outside the tern root counts");
            s.put(&format!("{}a/b", keys::ROOT), b"x").unwrap();
            s.put(&format!("{}c", keys::ROOT), b"y").unwrap();
            assert!(!is_empty(&*s).unwrap());
            assert!(s.has_prefix(&format!("{}a/", keys::ROOT)).unwrap());
            assert!(!s.has_prefix(&format!("{}z", keys::ROOT)).unwrap());
            s.delete(&format!("{}a/b", keys::ROOT)).unwrap();
            s.delete(&format!("{}c", keys::ROOT)).unwrap();
            assert!(is_empty(&*s).unwrap());
        }
    }

    #[test]
    fn cluster_id_is_created_once() {
        let s = mem::MemStore::new();
        assert!(is_empty(&s).unwrap());
        assert_eq!(read_cluster_id(&s).unwrap(), None);
        let a = create_cluster_id(&s).unwrap();
        assert_eq!(a.len(), 32);
        // A second creator (another agent racing) gets the first one's ID, not its own.
        let b = create_cluster_id(&s).unwrap();
        assert_eq!(a, b);
        assert_eq!(read_cluster_id(&s).unwrap().as_deref(), Some(a.as_str()));
        assert!(!is_empty(&s).unwrap());
    }

    #[test]
    fn malformed_cluster_id_is_an_error() {
        let s = mem::MemStore::new();
        s.put(keys::CLUSTER_ID, b"not an id\n\x00").unwrap();
        let e = read_cluster_id(&s).unwrap_err().to_string();
        assert!(
            e.contains("malformed") && e.contains(keys::CLUSTER_ID),
            "{e}"
        );
        assert_eq!(parse_cluster_id(b" abc-1\n").as_deref(), Some("abc-1"));
        assert_eq!(parse_cluster_id(&[b'a'; 129]), None);
    }

    #[test]
    fn size_check_names_the_key_and_the_limit() {
        let big = vec![0u8; MAX_VALUE_BYTES + 1];
        let e = check_txn_size(&Txn {
            success: vec![Op::put("/k", big)],
            ..Txn::default()
        })
        .unwrap_err();
        assert!(matches!(e, StoreError::TooLarge(_)));
        let m = e.to_string();
        assert!(m.contains("\"/k\"") && m.contains("1572864"), "{m}");
        // A huge key is shortened in the message.
        let key = "k".repeat(10_000);
        let m = check_txn_size(&Txn {
            failure: vec![Op::put(key.clone(), vec![0u8; MAX_VALUE_BYTES + 1])],
            ..Txn::default()
        })
        .unwrap_err()
        .to_string();
        assert!(m.len() < 600 && m.contains("10000 bytes"), "{m}");
        assert!(
            check_txn_size(&Txn {
                success: vec![Op::put("/k", vec![0u8; MAX_VALUE_BYTES - 2])],
                ..Txn::default()
            })
            .is_ok()
        );
    }
}
