//! tern's datastore: one trait with etcd v3 semantics and the backends behind it.
//!
//! Every key carries `create_revision`, `mod_revision` and `version`; the store keeps a global
//! revision counter that increases by one for every transaction that changes something. Writers
//! that must not lose a race use [`Store::txn`] with a [`Compare`] on `mod_revision` (or on
//! existence), exactly as they would against etcd. Watchers resume from a revision.
//!
//! Backends: [`mem::MemStore`] (in-process, for unit tests), [`sqlite::SqliteStore`] (embedded,
//! safe across processes on one host), [`etcd::EtcdStore`] (an etcd v3 cluster). All of
//! them pass [`conformance`].

use std::sync::Arc;
use std::time::Duration;

pub mod conformance;
pub mod etcd;
pub mod keys;
pub mod mem;
pub mod sqlite;

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
    /// The watch start revision has been compacted away; resync with a fresh range.
    #[error("revision {requested} has been compacted (oldest kept: {oldest})")]
    Compacted { requested: i64, oldest: i64 },
    /// The lease does not exist or has expired.
    #[error("lease {0} not found")]
    LeaseNotFound(i64),
    /// A store URL or option is malformed.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// Anything else the backend reports.
    #[error("datastore error: {0}")]
    Backend(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

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
    /// Grants a lease that expires `ttl` after its last keep-alive; keys put with it are deleted
    /// when it expires or is revoked.
    fn lease_grant(&self, ttl: Duration) -> Result<i64>;
    /// Renews a lease.
    fn lease_keepalive(&self, lease: i64) -> Result<()>;
    /// Revokes a lease and deletes its keys.
    fn lease_revoke(&self, lease: i64) -> Result<()>;

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
///   [`etcd::open_with_tls`]); fails with `Unavailable` when no endpoint answers.
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
    Err(StoreError::Config(format!(
        "unsupported store URL {url:?} (expected sqlite:///abs/path.db, mem:// or etcd://host:port)"
    )))
}
