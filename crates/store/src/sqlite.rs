//! Embedded backend: one SQLite file in WAL mode, safe for several processes on one host.
//!
//! Layout:
//! - `kv(key, value, create_rev, mod_rev, version, lease)`: the live keys;
//! - `meta(revision, compacted, next_lease)`: one row; `compacted` is the newest revision whose
//!   events have been pruned;
//! - `events(rev, seq, key, kind, value, create_rev, version, lease, ts_ms)`: the revision log that
//!   watchers poll, pruned to the last [`SqliteOptions::history_revisions`] revisions and
//!   [`SqliteOptions::history_age`];
//! - `leases(id, ttl_ms, expires_at_ms)`: wall-clock expiry, shared by every process.
//!
//! Every write is ONE `BEGIN IMMEDIATE` transaction: reap expired leases (each reaped lease with
//! keys is its own revision, as in etcd), evaluate compares, apply ops, bump the revision, append
//! events, prune. SQLite's write lock serialises writers across processes, which is what makes
//! compare-and-swap safe. Readers that notice an expired lease reap it through the same path, so
//! expiry shows up even when nobody writes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Store, StoreError, Txn, TxnResponse, Watch,
};

/// Tunables of a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Revisions of events kept for watchers (at least 1).
    pub history_revisions: i64,
    /// Events older than this are pruned even within `history_revisions`.
    pub history_age: Duration,
    /// How long a writer waits for another process's write lock before giving up.
    pub busy_timeout: Duration,
    /// Sleep between two polls of the event log in [`Watch::next_events`].
    pub poll_interval: Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            history_revisions: 10_000,
            history_age: Duration::from_secs(600),
            busy_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(5),
        }
    }
}

/// [`Store`] on a SQLite file. Each instance owns one connection behind a mutex; open one
/// instance per process and share it (`Arc`).
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Mutex<Connection>,
    path: PathBuf,
    opts: SqliteOptions,
    /// Device and inode of the file at `path` when it was opened: if the path later names
    /// another file (or none), this handle is writing to a file nobody else will ever read.
    file_id: Option<(u64, u64)>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS kv (
    key        TEXT PRIMARY KEY NOT NULL,
    value      BLOB NOT NULL,
    create_rev INTEGER NOT NULL,
    mod_rev    INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    lease      INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv(lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS meta (
    id         INTEGER PRIMARY KEY CHECK (id = 0),
    revision   INTEGER NOT NULL,
    compacted  INTEGER NOT NULL,
    next_lease INTEGER NOT NULL
);
INSERT OR IGNORE INTO meta (id, revision, compacted, next_lease) VALUES (0, 0, 0, 1);
CREATE TABLE IF NOT EXISTS events (
    rev        INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    key        TEXT NOT NULL,
    kind       INTEGER NOT NULL,
    value      BLOB NOT NULL,
    create_rev INTEGER NOT NULL,
    version    INTEGER NOT NULL,
    lease      INTEGER NOT NULL,
    ts_ms      INTEGER NOT NULL,
    PRIMARY KEY (rev, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    id            INTEGER PRIMARY KEY,
    ttl_ms        INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases(expires_at_ms);
";

const KIND_PUT: i64 = 0;
const KIND_DELETE: i64 = 1;

/// Adds what was being done and on which file to a SQLite error.
trait Context<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T>;
}

impl<T> Context<T> for rusqlite::Result<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T> {
        self.map_err(|e| {
            let msg = format!("{what} on {}: {e}", path.display());
            match e.sqlite_error_code() {
                Some(
                    ErrorCode::DatabaseBusy
                    | ErrorCode::DatabaseLocked
                    | ErrorCode::CannotOpen
                    | ErrorCode::PermissionDenied
                    | ErrorCode::ReadOnly
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::DiskFull,
                ) => StoreError::Unavailable(msg),
                _ => StoreError::Backend(msg),
            }
        })
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The smallest string greater than every string starting with `prefix`, or `None` when no such
/// bound exists (empty prefix). UTF-8 byte order equals code-point order, and SQLite's default
/// BINARY collation compares bytes, so `key >= prefix AND key < upper` is exactly the prefix.
fn prefix_upper(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(c) = chars.pop() {
        let mut next = c as u32 + 1;
        if next == 0xD800 {
            next = 0xE000; // skip the surrogate gap, which is not valid in a `char`
        }
        if let Some(n) = char::from_u32(next) {
            chars.push(n);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The `meta` row, read and written inside one write transaction.
struct Meta {
    revision: i64,
    compacted: i64,
    next_lease: i64,
}

/// One write transaction in progress: the SQLite transaction plus what it has done so far.
struct Writer<'a> {
    tx: rusqlite::Transaction<'a>,
    path: &'a Path,
    meta: Meta,
    now: i64,
    changed: bool,
}

impl<'a> Writer<'a> {
    fn begin(conn: &'a mut Connection, path: &'a Path) -> Result<Writer<'a>> {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx("begin write transaction", path)?;
        let meta = tx
            .prepare_cached("SELECT revision, compacted, next_lease FROM meta WHERE id = 0")
            .and_then(|mut st| {
                st.query_row([], |r| {
                    Ok(Meta {
                        revision: r.get(0)?,
                        compacted: r.get(1)?,
                        next_lease: r.get(2)?,
                    })
                })
            })
            .ctx("read store revision", path)?;
        Ok(Writer {
            tx,
            path,
            meta,
            now: now_ms(),
            changed: false,
        })
    }

    /// Revokes every expired lease, one revision per lease that had keys.
    fn reap_expired(&mut self) -> Result<()> {
        let expired: Vec<i64> = self
            .tx
            .prepare_cached("SELECT id FROM leases WHERE expires_at_ms <= ?1 ORDER BY id")
            .and_then(|mut st| {
                st.query_map([self.now], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()
            })
            .ctx("find expired leases", self.path)?;
        for id in expired {
            self.revoke(id)?;
        }
        Ok(())
    }

    /// Deletes the lease and its keys (with delete events at a new revision); false if the
    /// lease did not exist.
    fn revoke(&mut self, id: i64) -> Result<bool> {
        let removed = self
            .tx
            .prepare_cached("DELETE FROM leases WHERE id = ?1")
            .and_then(|mut st| st.execute([id]))
            .ctx("delete lease", self.path)?;
        if removed == 0 {
            return Ok(false);
        }
        let keys: Vec<String> = self
            .tx
            .prepare_cached("SELECT key FROM kv WHERE lease = ?1 ORDER BY key")
            .and_then(|mut st| {
                st.query_map([id], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()
            })
            .ctx("list keys of lease", self.path)?;
        if !keys.is_empty() {
            let rev = self.meta.revision + 1;
            let mut seq = 0;
            for key in keys {
                self.delete_key(&key, rev, &mut seq)?;
            }
            self.meta.revision = rev;
            self.changed = true;
        }
        Ok(true)
    }

    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.tx
            .prepare_cached(
                "SELECT value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?1",
            )
            .and_then(|mut st| {
                st.query_row([key], |r| row_kv(key.to_string(), r))
                    .optional()
            })
            .ctx("read key", self.path)
    }

    fn compare_holds(&self, c: &Compare) -> Result<bool> {
        Ok(match c {
            Compare::ModRevision(k, v) => self.get(k)?.map_or(0, |kv| kv.mod_revision) == *v,
            Compare::CreateRevision(k, v) => self.get(k)?.map_or(0, |kv| kv.create_revision) == *v,
            Compare::Version(k, v) => self.get(k)?.map_or(0, |kv| kv.version) == *v,
            Compare::Value(k, v) => self.get(k)?.is_some_and(|kv| kv.value == *v),
        })
    }

    fn append_event(&self, ev: &Event, seq: &mut i64) -> Result<()> {
        let kind = match ev.kind {
            EventKind::Put => KIND_PUT,
            EventKind::Delete => KIND_DELETE,
        };
        self.tx
            .prepare_cached(
                "INSERT INTO events (rev, seq, key, kind, value, create_rev, version, lease, ts_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ev.kv.mod_revision,
                    *seq,
                    ev.kv.key,
                    kind,
                    ev.kv.value,
                    ev.kv.create_revision,
                    ev.kv.version,
                    ev.kv.lease,
                    self.now
                ])
            })
            .ctx("append event", self.path)?;
        *seq += 1;
        Ok(())
    }

    /// Deletes one existing key at `rev`, logging the delete event.
    fn delete_key(&self, key: &str, rev: i64, seq: &mut i64) -> Result<bool> {
        let n = self
            .tx
            .prepare_cached("DELETE FROM kv WHERE key = ?1")
            .and_then(|mut st| st.execute([key]))
            .ctx("delete key", self.path)?;
        if n > 0 {
            self.append_event(&crate::mem::delete_event(key.to_string(), rev), seq)?;
        }
        Ok(n > 0)
    }

    /// Applies the ops at the next revision; bumps the revision only if something changed.
    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        let rev = self.meta.revision + 1;
        let mut seq = 0;
        let mut wrote = false;
        for op in ops {
            match op {
                Op::Put { key, value, lease } => {
                    if *lease != 0 {
                        let exists = self
                            .tx
                            .prepare_cached("SELECT 1 FROM leases WHERE id = ?1")
                            .and_then(|mut st| st.exists([lease]))
                            .ctx("look up lease", self.path)?;
                        if !exists {
                            // The caller drops the transaction: nothing of this txn persists.
                            return Err(StoreError::LeaseNotFound(*lease));
                        }
                    }
                    let (create_revision, version) = match self.get(key)? {
                        Some(old) => (old.create_revision, old.version + 1),
                        None => (rev, 1),
                    };
                    let kv = KeyValue {
                        key: key.clone(),
                        value: value.clone(),
                        create_revision,
                        mod_revision: rev,
                        version,
                        lease: *lease,
                    };
                    self.tx
                        .prepare_cached(
                            "INSERT OR REPLACE INTO kv (key, value, create_rev, mod_rev, version, lease)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        )
                        .and_then(|mut st| {
                            st.execute(params![kv.key, kv.value, create_revision, rev, version, lease])
                        })
                        .ctx("write key", self.path)?;
                    self.append_event(
                        &Event {
                            kind: EventKind::Put,
                            kv,
                        },
                        &mut seq,
                    )?;
                    wrote = true;
                }
                Op::Delete { key } => wrote |= self.delete_key(key, rev, &mut seq)?,
                Op::DeletePrefix { prefix } => {
                    let upper = prefix_upper(prefix);
                    let keys: Vec<String> = self
                        .tx
                        .prepare_cached(
                            "SELECT key FROM kv WHERE key >= ?1 AND (?2 IS NULL OR key < ?2)
                             ORDER BY key",
                        )
                        .and_then(|mut st| {
                            st.query_map(params![prefix, upper], |r| r.get(0))?
                                .collect::<rusqlite::Result<_>>()
                        })
                        .ctx("list keys to delete", self.path)?;
                    for key in keys {
                        wrote |= self.delete_key(&key, rev, &mut seq)?;
                    }
                }
            }
        }
        if wrote {
            self.meta.revision = rev;
            self.changed = true;
        }
        Ok(())
    }

    /// Drops events outside the kept history, advancing `compacted` past them.
    fn prune(&mut self, opts: &SqliteOptions) -> Result<()> {
        let keep = opts.history_revisions.max(1);
        // Prune in batches (every keep/8 revisions) so the common write pays nothing.
        let mut floor = self.meta.compacted;
        if self.meta.revision - self.meta.compacted > keep + keep / 8 {
            floor = self.meta.revision - keep;
        }
        // Age-based pruning needs a look at the oldest event; do it on the batch boundary or
        // every 256 revisions.
        if floor != self.meta.compacted || self.meta.revision % 256 == 0 {
            let cutoff = self.now - opts.history_age.as_millis() as i64;
            let first_recent: Option<i64> = self
                .tx
                .prepare_cached("SELECT rev FROM events WHERE ts_ms >= ?1 ORDER BY rev LIMIT 1")
                .and_then(|mut st| st.query_row([cutoff], |r| r.get(0)).optional())
                .ctx("find old events", self.path)?;
            let by_age = first_recent.map_or(self.meta.revision, |r| r - 1);
            floor = floor.max(by_age);
        }
        if floor > self.meta.compacted {
            self.tx
                .prepare_cached("DELETE FROM events WHERE rev <= ?1")
                .and_then(|mut st| st.execute([floor]))
                .ctx("prune events", self.path)?;
            self.meta.compacted = floor;
            self.changed = true;
        }
        Ok(())
    }

    fn commit(self) -> Result<i64> {
        let path = self.path;
        if self.changed {
            self.tx
                .prepare_cached(
                    "UPDATE meta SET revision = ?1, compacted = ?2, next_lease = ?3 WHERE id = 0",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        self.meta.revision,
                        self.meta.compacted,
                        self.meta.next_lease
                    ])
                })
                .ctx("update store revision", path)?;
        }
        let rev = self.meta.revision;
        self.tx.commit().ctx("commit", path)?;
        Ok(rev)
    }
}

fn row_kv(key: String, r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyValue> {
    Ok(KeyValue {
        key,
        value: r.get(0)?,
        create_revision: r.get(1)?,
        mod_revision: r.get(2)?,
        version: r.get(3)?,
        lease: r.get(4)?,
    })
}

impl SqliteStore {
    /// Opens (creating if needed) the store file with default [`SqliteOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore> {
        SqliteStore::open_with(path, SqliteOptions::default())
    }

    /// Opens (creating if needed) the store file. Several processes may open the same file.
    pub fn open_with(path: impl AsRef<Path>, opts: SqliteOptions) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        restrict_file_modes(&path)?;
        let mut conn = Connection::open(&path).ctx("open store", &path)?;
        conn.busy_timeout(opts.busy_timeout)
            .ctx("set busy timeout", &path)?;
        conn.set_prepared_statement_cache_capacity(64);
        // Switching to WAL needs an exclusive moment; when several processes open a fresh file at
        // once the loser may see SQLITE_BUSY without the busy handler, so retry briefly.
        let deadline = Instant::now() + opts.busy_timeout;
        loop {
            let mode = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0));
            match mode {
                Ok(m) if m.eq_ignore_ascii_case("wal") => break,
                Ok(m) => {
                    return Err(StoreError::Unavailable(format!(
                        "cannot enable WAL on {} (journal mode stays {m})",
                        path.display()
                    )));
                }
                Err(e)
                    if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                        && Instant::now() < deadline =>
                {
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e).ctx("enable WAL", &path),
            }
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF;")
            .ctx("set pragmas", &path)?;
        {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .ctx("begin schema transaction", &path)?;
            tx.execute_batch(SCHEMA).ctx("create schema", &path)?;
            tx.commit().ctx("commit schema", &path)?;
        }
        // The schema transaction has created the file: this is the one the connection holds.
        let file_id = file_id(&path).ok();
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                path,
                opts,
                file_id,
            }),
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

/// Device and inode of the file at `path` (following symlinks, as SQLite's open does).
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Mode of the store file and its `-wal` / `-shm`: the store holds secrets (BGP MD5
/// passwords), so only its owner reads it, whatever the umask.
pub const FILE_MODE: u32 = 0o600;

/// Creates the store file 0600 before SQLite opens it (SQLite gives `-wal` and `-shm` the main
/// file's mode), creates a missing parent directory 0700, and tightens the mode of existing
/// files (a store made world-readable by an older tern). Existing parent directories are left
/// as they are: they may be shared (`/var/lib`, a temp dir).
fn restrict_file_modes(path: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let fail = |what: &str, p: &Path, e: std::io::Error| {
        StoreError::Unavailable(format!("{what} {}: {e}", p.display()))
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail("creating store directory", dir, e))?;
    }
    // No O_TRUNC: an existing store is opened, never emptied.
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(f) => f,
        // Someone else's store this process may only read (`ternctl` as a group member):
        // not ours to re-mode; SQLite opens it as far as it is allowed to.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && path.exists() => {
            return Ok(());
        }
        Err(e) => return Err(fail("opening store file", path, e)),
    };
    let tighten = |f: &std::fs::File, p: &Path| -> Result<()> {
        let m = f.metadata().map_err(|e| fail("stat", p, e))?;
        if m.is_file() && m.permissions().mode() & 0o7777 != FILE_MODE {
            match f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE)) {
                Ok(()) => {}
                // Not the owner (writable through its group): only the owner can tighten it.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                Err(e) => return Err(fail("restricting the mode of", p, e)),
            }
        }
        Ok(())
    };
    tighten(&f, path)?;
    for suffix in ["-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let side = PathBuf::from(side);
        if let Ok(f) = std::fs::File::open(&side) {
            tighten(&f, &side)?;
        }
    }
    Ok(())
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        // The connection is still usable after a panic elsewhere: SQLite rolled back any
        // transaction left open when its `Transaction` was dropped during unwinding.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` inside one write transaction after reaping expired leases, then prunes history
    /// and commits. Returns `f`'s result and the revision after the commit.
    fn write<T>(&self, f: impl FnOnce(&mut Writer<'_>) -> Result<T>) -> Result<(T, i64)> {
        let mut conn = self.lock();
        let mut w = Writer::begin(&mut conn, &self.path)?;
        w.reap_expired()?;
        let out = f(&mut w)?;
        w.prune(&self.opts)?;
        let rev = w.commit()?;
        Ok((out, rev))
    }

    /// Reaps expired leases if any exist, so readers see expiry without waiting for a writer.
    fn reap_if_due(&self) -> Result<()> {
        let due = {
            let conn = self.lock();
            conn.prepare_cached("SELECT 1 FROM leases WHERE expires_at_ms <= ?1 LIMIT 1")
                .and_then(|mut st| st.exists([now_ms()]))
                .ctx("check lease expiry", &self.path)?
        };
        if due {
            self.write(|_| Ok(()))?;
        }
        Ok(())
    }

    fn read_meta(conn: &Connection, path: &Path) -> Result<(i64, i64)> {
        conn.prepare_cached("SELECT revision, compacted FROM meta WHERE id = 0")
            .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .ctx("read store revision", path)
    }
}

fn compacted_error(after: i64, compacted: i64) -> StoreError {
    StoreError::Compacted {
        requested: after + 1,
        oldest: compacted + 1,
    }
}

impl Store for SqliteStore {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.inner.reap_if_due()?;
        let conn = self.inner.lock();
        conn.prepare_cached(
            "SELECT value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?1",
        )
        .and_then(|mut st| {
            st.query_row([key], |r| row_kv(key.to_string(), r))
                .optional()
        })
        .ctx("read key", &self.inner.path)
    }

    fn has_prefix(&self, prefix: &str) -> Result<bool> {
        self.inner.reap_if_due()?;
        let path = &self.inner.path;
        let conn = self.inner.lock();
        let upper = prefix_upper(prefix);
        let found: Option<i64> = conn
            .prepare_cached("SELECT 1 FROM kv WHERE key >= ?1 AND (?2 IS NULL OR key < ?2) LIMIT 1")
            .and_then(|mut st| {
                let mut rows = st.query(params![prefix, upper])?;
                rows.next()?.map(|r| r.get(0)).transpose()
            })
            .ctx("probe keys", path)?;
        Ok(found.is_some())
    }

    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        self.inner.reap_if_due()?;
        let path = &self.inner.path;
        let mut conn = self.inner.lock();
        // A deferred (read) transaction: the rows and the revision come from one snapshot.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .ctx("begin read transaction", path)?;
        let upper = prefix_upper(prefix);
        let kvs = tx
            .prepare_cached(
                "SELECT value, create_rev, mod_rev, version, lease, key FROM kv
                 WHERE key >= ?1 AND (?2 IS NULL OR key < ?2) ORDER BY key",
            )
            .and_then(|mut st| {
                st.query_map(params![prefix, upper], |r| row_kv(r.get(5)?, r))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .ctx("range keys", path)?;
        let (rev, _) = Inner::read_meta(&tx, path)?;
        tx.commit().ctx("end read transaction", path)?;
        Ok((kvs, rev))
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        crate::check_txn_size(&txn)?;
        let (succeeded, revision) = self.inner.write(|w| {
            let mut succeeded = true;
            for c in &txn.compare {
                if !w.compare_holds(c)? {
                    succeeded = false;
                    break;
                }
            }
            w.apply(if succeeded {
                &txn.success
            } else {
                &txn.failure
            })?;
            Ok(succeeded)
        })?;
        Ok(TxnResponse {
            succeeded,
            revision,
        })
    }

    fn revision(&self) -> Result<i64> {
        self.inner.reap_if_due()?;
        let conn = self.inner.lock();
        Ok(Inner::read_meta(&conn, &self.inner.path)?.0)
    }

    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        {
            let conn = self.inner.lock();
            let (_, compacted) = Inner::read_meta(&conn, &self.inner.path)?;
            if after_revision < compacted {
                return Err(compacted_error(after_revision, compacted));
            }
        }
        Ok(Box::new(SqliteWatch {
            inner: self.inner.clone(),
            prefix: prefix.to_string(),
            upper: prefix_upper(prefix),
            after: after_revision,
            last_change: None,
            last_poll: None,
        }))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        let ttl_ms = ttl.as_millis() as i64;
        let (id, _) = self.inner.write(|w| {
            let id = w.meta.next_lease;
            w.meta.next_lease += 1;
            w.changed = true;
            w.tx.prepare_cached(
                "INSERT INTO leases (id, ttl_ms, expires_at_ms) VALUES (?1, ?2, ?3)",
            )
            .and_then(|mut st| st.execute(params![id, ttl_ms, w.now + ttl_ms]))
            .ctx("grant lease", w.path)?;
            Ok(id)
        })?;
        Ok(id)
    }

    fn lease_keepalive(&self, lease: i64) -> Result<()> {
        self.inner.write(|w| {
            // Expired leases were reaped just before: an update of nothing means "not found".
            let n =
                w.tx.prepare_cached("UPDATE leases SET expires_at_ms = ?2 + ttl_ms WHERE id = ?1")
                    .and_then(|mut st| st.execute(params![lease, w.now]))
                    .ctx("renew lease", w.path)?;
            if n == 0 {
                return Err(StoreError::LeaseNotFound(lease));
            }
            Ok(())
        })?;
        Ok(())
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        self.inner.write(|w| {
            if !w.revoke(lease)? {
                return Err(StoreError::LeaseNotFound(lease));
            }
            Ok(())
        })?;
        Ok(())
    }

    fn integrity_problem(&self) -> Option<String> {
        let path = &self.inner.path;
        let opened = self.inner.file_id?;
        match file_id(path) {
            Ok(now) if now == opened => None,
            Ok(_) => Some(format!(
                "store file {} was replaced by another file since it was opened; this process \
                 still writes to the old one",
                path.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
                "store file {} was deleted since it was opened; this process still writes to the \
                 unlinked file",
                path.display()
            )),
            Err(e) => Some(format!("cannot stat store file {}: {e}", path.display())),
        }
    }
}

/// A watcher polling the `events` table of a [`SqliteStore`].
struct SqliteWatch {
    inner: Arc<Inner>,
    prefix: String,
    upper: Option<String>,
    after: i64,
    /// Size and modification time of the WAL (or database) file at the last poll.
    last_change: Option<(u64, std::time::SystemTime)>,
    last_poll: Option<Instant>,
}

/// How often a watcher looks at the log even when the files look unchanged: file times are
/// coarse and a restarted WAL can keep its size, so a change can hide from `stat` for a tick.
const FORCED_POLL: Duration = Duration::from_millis(100);

/// A cheap fingerprint of the store files: every commit writes the WAL, which changes its size
/// or modification time. Reading it takes no SQLite lock and not the connection mutex, so idle
/// watchers neither burn CPU nor delay writers.
fn change_signature(db: &std::path::Path) -> Option<(u64, std::time::SystemTime)> {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let meta = std::fs::metadata(&wal)
        .or_else(|_| std::fs::metadata(db))
        .ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

impl SqliteWatch {
    /// One look at the log: events after `self.after` under the prefix, from one snapshot.
    fn poll(&mut self) -> Result<Vec<Event>> {
        self.inner.reap_if_due()?;
        let path = &self.inner.path;
        let mut conn = self.inner.lock();
        let (revision, compacted) = Inner::read_meta(&conn, path)?;
        if self.after < compacted {
            return Err(compacted_error(self.after, compacted));
        }
        if revision <= self.after {
            return Ok(Vec::new());
        }
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .ctx("begin read transaction", path)?;
        let (revision, compacted) = Inner::read_meta(&tx, path)?;
        if self.after < compacted {
            return Err(compacted_error(self.after, compacted));
        }
        let events = tx
            .prepare_cached(
                "SELECT rev, key, kind, value, create_rev, version, lease FROM events
                 WHERE rev > ?1 AND rev <= ?2 AND key >= ?3 AND (?4 IS NULL OR key < ?4)
                 ORDER BY rev, seq",
            )
            .and_then(|mut st| {
                st.query_map(
                    params![self.after, revision, self.prefix, self.upper],
                    |r| {
                        let kind = if r.get::<_, i64>(2)? == KIND_PUT {
                            EventKind::Put
                        } else {
                            EventKind::Delete
                        };
                        Ok(Event {
                            kind,
                            kv: KeyValue {
                                key: r.get(1)?,
                                value: r.get(3)?,
                                create_revision: r.get(4)?,
                                mod_revision: r.get(0)?,
                                version: r.get(5)?,
                                lease: r.get(6)?,
                            },
                        })
                    },
                )?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .ctx("read events", path)?;
        tx.commit().ctx("end read transaction", path)?;
        // Every revision up to the snapshot's has been examined, whether it matched or not.
        self.after = revision;
        Ok(events)
    }
}

impl Watch for SqliteWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            let sig = change_signature(&self.inner.path);
            let due = self.last_poll.is_none_or(|t| t.elapsed() >= FORCED_POLL);
            if sig.is_none() || sig != self.last_change || due {
                // The signature is taken before the poll: a commit during the poll changes it
                // again and is seen next time.
                self.last_change = sig;
                self.last_poll = Some(Instant::now());
                let events = self.poll()?;
                if !events.is_empty() {
                    return Ok(events);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            thread::sleep(self.inner.opts.poll_interval.min(deadline - now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_upper;
    use crate::Store;

    #[test]
    fn integrity_notices_a_deleted_or_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let s = super::SqliteStore::open(&path).unwrap();
        s.put("/a", b"1").unwrap();
        assert_eq!(s.integrity_problem(), None);
        std::fs::remove_file(&path).unwrap();
        let p = s.integrity_problem().expect("deletion noticed");
        assert!(p.contains("deleted") && p.contains("s.db"), "{p}");
        // A new, empty file at the same path is another file, not ours.
        let other = super::SqliteStore::open(&path).unwrap();
        assert_eq!(other.integrity_problem(), None);
        let p = s.integrity_problem().expect("replacement noticed");
        assert!(p.contains("replaced"), "{p}");
    }

    #[test]
    fn prefix_upper_bounds() {
        assert_eq!(prefix_upper(""), None);
        assert_eq!(prefix_upper("/a/").as_deref(), Some("/a0"));
        assert_eq!(prefix_upper("ab").as_deref(), Some("ac"));
        assert_eq!(prefix_upper("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(prefix_upper("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_upper("\u{10FFFF}"), None);
    }
}
