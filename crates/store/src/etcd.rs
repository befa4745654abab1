//! etcd v3 backend: the [`Store`] trait over etcd's JSON gRPC gateway (`/v3/...` on the client
//! port), with a small synchronous HTTP/1.1 client and optional TLS (rustls).
//!
//! Why the gateway and not gRPC: the trait is synchronous and used from short-lived processes
//! (the CNI plugin, `ternctl`); speaking JSON over a plain socket needs no async runtime and no
//! protobuf toolchain, and every etcd since 3.4 serves it. Each [`Store`] call is exactly one
//! request, so a [`Txn`] is one etcd transaction (compares plus success/failure ops).
//!
//! Failure handling ([`RetryPolicy`]): a call rides through the loss of a member or of the
//! leader the way etcd's own clients do. An attempt that cannot connect, gets no answer within
//! the per-attempt timeout ([`Timeouts::request`]), loses its connection, or is answered with a
//! transient error ("no leader", "leader changed", "request timed out", "too many requests", a
//! stopping member) moves to the next endpoint; the member that failed goes to the back of the
//! order for a while, and after every round over the endpoints the call pauses (50 ms,
//! doubling up to 500 ms). The call gives up when its total budget (6 s by default) is used up,
//! with [`StoreError::Unavailable`] naming each failure.
//!
//! Reads, lease keep-alives and watches are retried as they are. A plain put or delete is
//! idempotent and is resent as it is. A transaction whose outcome is unknown (sent, no answer) is
//! resent with the same compares and writes and a failure branch that reads every key it writes:
//! if the resend applies, the first attempt had not (tern's transactions compare the
//! `mod_revision` of the keys they write, so a transaction cannot apply twice); if its compare
//! fails and every written key holds exactly what this transaction wrote, at one revision, the
//! first attempt had applied and the call reports success at that revision; otherwise the
//! outcome cannot be decided here and the error is [`StoreError::Ambiguous`] (the caller knows
//! which key is its own: IPAM checks its handle). When a call used up its budget with no member
//! answering at all, later calls make a single pass over the endpoints (going on with the whole
//! budget as soon as a member answers, even with "no leader"), so an outage is reported at once
//! instead of once per call.
//!
//! The retrying client (endpoints, their order, pooled connections, attempts and their
//! classification) is `client`; this module is the [`Store`] over it.
//!
//! Watches use a dedicated streaming connection read by a background thread; dropping the
//! [`Watch`] shuts the socket down, which ends the thread.
//!
//! [`EtcdStore::with_namespace`] confines a handle to a key prefix (several tenants or test runs
//! on one cluster); `harness` (feature `test-support`) starts throw-away etcd processes for tests
//! and benchmarks.
//!
//! Known limits: a range is one response (no pagination), so very large prefixes are bounded by
//! the gateway's message size; an idle watch on a member that vanishes without closing the TCP
//! connection is only noticed at the next write the caller expects.

use std::io::{self, BufRead, BufReader};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::http::{self, Body};
use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Store, StoreError, Txn, TxnResponse, Watch,
};

mod client;

use self::client::{CallError, Client, Endpoint};
pub use self::client::{RetryPolicy, Timeouts};

/// PEM files for TLS to the etcd members: the CA that signed their certificates and, when the
/// cluster requires client certificates (`--client-cert-auth`), this client's certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle used to verify the members' certificates.
    pub ca: PathBuf,
    /// Client certificate chain (PEM); must be given together with `key`.
    pub cert: Option<PathBuf>,
    /// Private key of the client certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// Environment variable overriding [`RetryPolicy::budget`] (milliseconds) for stores opened by
/// URL ([`crate::open`], [`open_with_tls`]): ternd, ternctl and the plugins.
pub const RETRY_BUDGET_ENV: &str = "TERN_ETCD_RETRY_BUDGET_MS";
/// Environment variable overriding [`Timeouts::request`] (milliseconds), likewise.
pub const ATTEMPT_TIMEOUT_ENV: &str = "TERN_ETCD_ATTEMPT_TIMEOUT_MS";

/// Reads a duration in milliseconds from `var`: `None` when unset, a `Config` error naming the
/// variable when it is not a number of milliseconds between 1 and 600000.
fn env_millis(var: &str, lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Duration>> {
    let Some(text) = lookup(var) else {
        return Ok(None);
    };
    match text.trim().parse::<u64>() {
        Ok(ms @ 1..=600_000) => Ok(Some(Duration::from_millis(ms))),
        _ => Err(StoreError::Config(format!(
            "{var}={text:?}: expected a number of milliseconds from 1 to 600000"
        ))),
    }
}

/// The timeouts and retry policy of stores opened by URL: the defaults, overridden by
/// [`RETRY_BUDGET_ENV`] and [`ATTEMPT_TIMEOUT_ENV`].
pub fn settings_from_env() -> Result<(Timeouts, RetryPolicy)> {
    settings_from(|var| std::env::var(var).ok())
}

/// [`settings_from_env`] with the variables read through `lookup` (a test's own, so that no
/// test changes the environment of its process).
fn settings_from(lookup: impl Fn(&str) -> Option<String>) -> Result<(Timeouts, RetryPolicy)> {
    let mut t = Timeouts::default();
    let mut r = RetryPolicy::default();
    if let Some(b) = env_millis(RETRY_BUDGET_ENV, &lookup)? {
        r.budget = b;
    }
    if let Some(a) = env_millis(ATTEMPT_TIMEOUT_ENV, &lookup)? {
        t.request = a;
    }
    Ok((t, r))
}

/// A [`Store`] backed by an etcd v3 cluster. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct EtcdStore {
    client: Arc<Client>,
    /// Prepended to every key sent to etcd and stripped from every key returned, so that several
    /// independent stores can share one cluster.
    namespace: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.client.endpoint_names())
            .field("tls", &self.client.tls.is_some())
            .field("namespace", &self.namespace)
            .finish()
    }
}

/// Parses `etcd://host:port[,host:port...]` into its endpoints.
pub fn parse_url(url: &str) -> Result<Vec<String>> {
    let rest = url.strip_prefix("etcd://").ok_or_else(|| {
        StoreError::Config(format!(
            "store URL {url:?}: an etcd URL starts with etcd:// (etcd://host:port[,host:port])"
        ))
    })?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let endpoints: Vec<String> = rest.split(',').map(|e| e.trim().to_string()).collect();
    if endpoints.iter().any(|e| e.is_empty()) {
        return Err(StoreError::Config(format!(
            "store URL {url:?}: empty endpoint (expected etcd://host:port[,host:port])"
        )));
    }
    for e in &endpoints {
        split_host_port(e)
            .map_err(|msg| StoreError::Config(format!("store URL {url:?}: {msg}")))?;
    }
    Ok(endpoints)
}

/// Opens a store URL, with TLS to etcd when `ca` is given (and a client certificate when `cert`
/// and `key` are). This is what `--etcd-ca/--etcd-cert/--etcd-key` feed; without any of them it
/// behaves like [`crate::open`], and TLS files with a non-etcd URL are a `Config` error.
pub fn open_with_tls(
    url: &str,
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Arc<dyn Store>> {
    let tls = match (ca, cert, key) {
        (None, None, None) => None,
        (Some(ca), cert, key) => Some(TlsFiles {
            ca: ca.to_path_buf(),
            cert: cert.map(Path::to_path_buf),
            key: key.map(Path::to_path_buf),
        }),
        (None, _, _) => {
            return Err(StoreError::Config(
                "a client certificate or key for etcd needs the CA too (--etcd-ca)".to_string(),
            ));
        }
    };
    if !url.starts_with("etcd://") {
        if tls.is_some() {
            return Err(StoreError::Config(format!(
                "TLS files are only used with an etcd:// store URL, not {url:?}"
            )));
        }
        return crate::open(url);
    }
    let endpoints = parse_url(url)?;
    let (timeouts, retry) = settings_from_env()?;
    Ok(Arc::new(EtcdStore::connect_with(
        &endpoints, tls, timeouts, retry,
    )?))
}

impl EtcdStore {
    /// Connects to the cluster with the default [`RetryPolicy`]: see [`EtcdStore::connect_with`].
    pub fn connect(
        endpoints: &[impl AsRef<str>],
        tls: Option<TlsFiles>,
        timeouts: Timeouts,
    ) -> Result<EtcdStore> {
        Self::connect_with(endpoints, tls, timeouts, RetryPolicy::default())
    }

    /// Connects to the cluster: `endpoints` are `host:port` (an `http://` or `https://` prefix is
    /// accepted when it matches whether `tls` is given). Reads the TLS files, then checks that an
    /// endpoint answers (one attempt per endpoint, no retry budget: the caller decides how long
    /// to wait for a cluster that is not up), so a dead cluster is reported here as
    /// [`StoreError::Unavailable`].
    pub fn connect_with(
        endpoints: &[impl AsRef<str>],
        tls: Option<TlsFiles>,
        timeouts: Timeouts,
        retry: RetryPolicy,
    ) -> Result<EtcdStore> {
        if endpoints.is_empty() {
            return Err(StoreError::Config("no etcd endpoint given".to_string()));
        }
        let scheme = if tls.is_some() { "https://" } else { "http://" };
        let other = if tls.is_some() { "http://" } else { "https://" };
        let mut parsed = Vec::new();
        for e in endpoints {
            let e = e.as_ref().trim();
            if e.starts_with(other) {
                return Err(StoreError::Config(format!(
                    "etcd endpoint {e:?}: scheme does not match the TLS settings (TLS {})",
                    if tls.is_some() { "on" } else { "off" }
                )));
            }
            let hp = e.strip_prefix(scheme).unwrap_or(e);
            let hp = hp.strip_suffix('/').unwrap_or(hp);
            let (host, port) = split_host_port(hp)
                .map_err(|msg| StoreError::Config(format!("etcd endpoint {e:?}: {msg}")))?;
            parsed.push(Endpoint {
                host,
                port,
                name: format!("{scheme}{hp}"),
            });
        }
        let tls = tls.map(|files| load_tls(&files)).transpose()?;
        let n = parsed.len();
        let store = EtcdStore {
            client: Arc::new(Client {
                endpoints: parsed,
                tls,
                timeouts,
                retry,
                preferred: AtomicUsize::new(0),
                penalized: Mutex::new(vec![None; n]),
                outage: AtomicBool::new(false),
                pool: Mutex::new(Vec::new()),
            }),
            namespace: String::new(),
        };
        store
            .client
            .call(
                "/v3/kv/range",
                &json!({"key": B64.encode([0u8]), "count_only": true}),
                None,
                true,
            )
            .map_err(|e| e.into_store(None))?;
        Ok(store)
    }

    /// The same cluster and connections, with every key of this handle stored under `namespace`
    /// (like etcd's `--namespace`): `get("/a")` reads `{namespace}/a`, and returned keys and
    /// watch events have the namespace stripped.
    pub fn with_namespace(&self, namespace: &str) -> EtcdStore {
        EtcdStore {
            client: self.client.clone(),
            namespace: format!("{}{namespace}", self.namespace),
        }
    }

    /// Compacts etcd's history up to `revision`: watches from older revisions then fail with
    /// [`StoreError::Compacted`]. Compacting at or below an already compacted revision is a no-op.
    pub fn compact(&self, revision: i64) -> Result<()> {
        match self.client.call(
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}),
            None,
            false,
        ) {
            Ok(_) => Ok(()),
            Err(CallError::Grpc {
                code: 11, message, ..
            }) if message.contains("compacted") => Ok(()),
            Err(e) => Err(e.into_store(None)),
        }
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        let mut k = self.namespace.as_bytes().to_vec();
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// `key` and `range_end` for every key starting with `prefix` (inside the namespace).
    fn prefix_range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let start = self.full_key(prefix);
        if start.is_empty() {
            // etcd reads key "\0" with range_end "\0" as "every key".
            return (vec![0], vec![0]);
        }
        let end = prefix_end(&start);
        (start, end)
    }

    fn kv_from_json(&self, v: &Value) -> Result<KeyValue> {
        let key = b64_field(v, "key")?;
        let key = key
            .strip_prefix(self.namespace.as_bytes())
            .unwrap_or(&key)
            .to_vec();
        Ok(KeyValue {
            key: String::from_utf8_lossy(&key).into_owned(),
            value: b64_field(v, "value")?,
            create_revision: int_field(v, "create_revision")?,
            mod_revision: int_field(v, "mod_revision")?,
            version: int_field(v, "version")?,
            lease: int_field(v, "lease")?,
        })
    }

    fn compare_json(&self, c: &Compare) -> Value {
        let (target, key, field, val) = match c {
            Compare::ModRevision(k, r) => ("MOD", k, "mod_revision", json!(r.to_string())),
            Compare::CreateRevision(k, r) => ("CREATE", k, "create_revision", json!(r.to_string())),
            Compare::Version(k, r) => ("VERSION", k, "version", json!(r.to_string())),
            Compare::Value(k, v) => ("VALUE", k, "value", json!(B64.encode(v))),
        };
        let mut obj = json!({
            "target": target,
            "result": "EQUAL",
            "key": B64.encode(self.full_key(key)),
        });
        obj[field] = val;
        obj
    }

    fn op_json(&self, op: &Op) -> Value {
        match op {
            Op::Put { key, value, lease } => json!({"request_put": {
                "key": B64.encode(self.full_key(key)),
                "value": B64.encode(value),
                "lease": lease.to_string(),
            }}),
            Op::Delete { key } => json!({"request_delete_range": {
                "key": B64.encode(self.full_key(key)),
            }}),
            Op::DeletePrefix { prefix } => {
                let (key, end) = self.prefix_range(prefix);
                json!({"request_delete_range": {
                    "key": B64.encode(key),
                    "range_end": B64.encode(end),
                }})
            }
        }
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let resp = self
            .client
            .call(
                "/v3/kv/range",
                &json!({"key": B64.encode(self.full_key(key))}),
                None,
                false,
            )
            .map_err(|e| e.into_store(None))?
            .value;
        match resp.get("kvs").and_then(Value::as_array) {
            Some(kvs) if !kvs.is_empty() => Ok(Some(self.kv_from_json(&kvs[0])?)),
            _ => Ok(None),
        }
    }

    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        let (key, end) = self.prefix_range(prefix);
        let resp = self
            .client
            .call(
                "/v3/kv/range",
                &json!({"key": B64.encode(key), "range_end": B64.encode(end)}),
                None,
                false,
            )
            .map_err(|e| e.into_store(None))?
            .value;
        let kvs = match resp.get("kvs").and_then(Value::as_array) {
            Some(kvs) => kvs
                .iter()
                .map(|kv| self.kv_from_json(kv))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok((kvs, header_revision(&resp)?))
    }

    fn has_prefix(&self, prefix: &str) -> Result<bool> {
        let (key, end) = self.prefix_range(prefix);
        let resp = self
            .client
            .call(
                "/v3/kv/range",
                &json!({
                    "key": B64.encode(key),
                    "range_end": B64.encode(end),
                    "limit": 1,
                    "keys_only": true,
                }),
                None,
                false,
            )
            .map_err(|e| e.into_store(None))?
            .value;
        Ok(resp
            .get("kvs")
            .and_then(Value::as_array)
            .is_some_and(|kvs| !kvs.is_empty()))
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        crate::check_txn_size(&txn)?;
        let compare: Vec<Value> = txn.compare.iter().map(|c| self.compare_json(c)).collect();
        let success: Vec<Value> = txn.success.iter().map(|o| self.op_json(o)).collect();
        let body = json!({
            "compare": compare,
            "success": success,
            "failure": txn.failure.iter().map(|o| self.op_json(o)).collect::<Vec<_>>(),
        });
        // The resend after an attempt whose outcome is unknown: the same transaction, with a
        // failure branch that reads back every key it writes, so that a failed compare tells
        // whether the first attempt applied. Only without a failure branch of the caller's own
        // (which would have run instead) and without prefix deletes (not checkable key by key).
        let written: Option<Vec<&Op>> = (txn.failure.is_empty()
            && !txn.success.is_empty()
            && !txn
                .success
                .iter()
                .any(|o| matches!(o, Op::DeletePrefix { .. })))
        .then(|| txn.success.iter().collect());
        let resend = written.as_ref().map(|ops| {
            let reads: Vec<Value> = ops
                .iter()
                .map(|op| {
                    let key = match op {
                        Op::Put { key, .. } | Op::Delete { key } => key,
                        Op::DeletePrefix { prefix } => prefix,
                    };
                    json!({"request_range": {"key": B64.encode(self.full_key(key))}})
                })
                .collect();
            json!({"compare": compare, "success": success, "failure": reads})
        });
        // etcd names no lease in "lease not found"; report the first one the txn attaches.
        let lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                Op::Put { lease, .. } if *lease != 0 => Some(*lease),
                _ => None,
            });
        let answer = match self
            .client
            .call("/v3/kv/txn", &body, resend.as_ref(), false)
        {
            Ok(a) => a,
            Err(CallError::Unavailable { msg, unknown: true }) => {
                return Err(StoreError::Ambiguous(format!(
                    "{msg}; an attempt of the transaction was sent without an answer, so it may \
                     or may not have been applied"
                )));
            }
            Err(e) => return Err(e.into_store(lease)),
        };
        let resp = answer.value;
        let succeeded = resp
            .get("succeeded")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if succeeded || !answer.after_unknown {
            return Ok(TxnResponse {
                succeeded,
                revision: header_revision(&resp)?,
            });
        }
        // The compare failed after an attempt that may have applied.
        let Some(ops) = written else {
            // Without read-back: a blind or failure-branch transaction, reported as answered.
            return Ok(TxnResponse {
                succeeded,
                revision: header_revision(&resp)?,
            });
        };
        match self.applied_revision(&ops, &resp)? {
            Some(revision) => Ok(TxnResponse {
                succeeded: true,
                revision,
            }),
            None => Err(StoreError::Ambiguous(format!(
                "etcd transaction on {:?}: an attempt was sent without an answer, and the resend's \
                 compare failed with the keys no longer as that attempt would have left them",
                ops.iter()
                    .map(|op| match op {
                        Op::Put { key, .. } | Op::Delete { key } => key.as_str(),
                        Op::DeletePrefix { prefix } => prefix.as_str(),
                    })
                    .collect::<Vec<_>>()
            ))),
        }
    }

    fn revision(&self) -> Result<i64> {
        let resp = self
            .client
            .call(
                "/v3/kv/range",
                &json!({"key": B64.encode([0u8]), "count_only": true}),
                None,
                false,
            )
            .map_err(|e| e.into_store(None))?
            .value;
        header_revision(&resp)
    }

    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        let (key, end) = self.prefix_range(prefix);
        let start = after_revision.max(0) + 1;
        let body = json!({"create_request": {
            "key": B64.encode(key),
            "range_end": B64.encode(end),
            "start_revision": start.to_string(),
        }});
        let (mut lines, shutdown) = self.client.open_stream("/v3/watch", &body)?;
        // The first message confirms the watch exists; waiting for it turns a refused watch into
        // an error here instead of a silent empty stream.
        let first = read_stream_message(&mut lines)
            .map_err(|e| StoreError::Unavailable(format!("etcd watch of {prefix:?}: {e}")))?;
        if first.get("created").and_then(Value::as_bool) != Some(true) {
            let _ = shutdown.shutdown(Shutdown::Both);
            return Err(watch_end_error(&first, start, prefix));
        }
        // Events may be far apart: only the handshake is bounded by the request timeout.
        let _ = shutdown.set_read_timeout(None);
        let (tx, rx) = mpsc::channel();
        let store = self.clone();
        let prefix_owned = prefix.to_string();
        thread::Builder::new()
            .name("etcd-watch".to_string())
            .spawn(move || store.watch_loop(lines, tx, start, &prefix_owned))
            .map_err(|e| StoreError::Backend(format!("cannot start the etcd watch thread: {e}")))?;
        Ok(Box::new(EtcdWatch {
            events: crate::ChannelWatch::new(rx, "etcd"),
            shutdown,
        }))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        // etcd counts in whole seconds; round up so a lease never lives shorter than asked.
        let secs = ttl.as_millis().div_ceil(1000).max(1) as i64;
        let resp = self
            .client
            // A grant resent after a lost answer may create a second lease; the extra one
            // holds no key and expires after its TTL.
            .call(
                "/v3/lease/grant",
                &json!({"TTL": secs.to_string()}),
                None,
                false,
            )
            .map_err(|e| e.into_store(None))?
            .value;
        if let Some(err) = resp.get("error").and_then(Value::as_str)
            && !err.is_empty()
        {
            return Err(StoreError::Backend(format!("etcd lease grant: {err}")));
        }
        let id = int_field(&resp, "ID")?;
        if id == 0 {
            return Err(StoreError::Backend(format!(
                "etcd lease grant returned no lease id: {resp}"
            )));
        }
        Ok(id)
    }

    fn lease_keepalive(&self, lease: i64) -> Result<()> {
        let resp = self
            .client
            .call(
                "/v3/lease/keepalive",
                &json!({"ID": lease.to_string()}),
                None,
                false,
            )
            .map_err(|e| e.into_store(Some(lease)))?
            .value;
        // A streaming endpoint: the body is one `{"result": ...}` line per request sent.
        let result = resp.get("result").unwrap_or(&resp);
        if int_field(result, "TTL")? <= 0 {
            return Err(StoreError::LeaseNotFound(lease));
        }
        Ok(())
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        // Resent after a lost answer, a revoke may report the lease its first attempt revoked
        // as not found; callers treat a missing lease as revoked.
        self.client
            .call(
                "/v3/lease/revoke",
                &json!({"ID": lease.to_string()}),
                None,
                false,
            )
            .map_err(|e| e.into_store(Some(lease)))?;
        Ok(())
    }
}

impl EtcdStore {
    /// After a resent transaction's compare failed: the revision at which the first attempt
    /// applied, when every key it writes holds exactly what it wrote (value and lease, all at one
    /// `mod_revision`) and every key it deletes is absent; `None` when the keys show otherwise.
    /// `resp` holds one read per written key in its failure responses.
    fn applied_revision(&self, ops: &[&Op], resp: &Value) -> Result<Option<i64>> {
        let empty = Vec::new();
        let responses = resp
            .get("responses")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        if responses.len() != ops.len() {
            return Err(StoreError::Backend(format!(
                "etcd answered {} reads for the {} keys of a resent transaction: {resp}",
                responses.len(),
                ops.len()
            )));
        }
        let mut revision = None;
        for (op, r) in ops.iter().zip(responses) {
            let kvs = r
                .get("response_range")
                .and_then(|rr| rr.get("kvs"))
                .and_then(Value::as_array)
                .unwrap_or(&empty);
            let current = kvs.first().map(|kv| self.kv_from_json(kv)).transpose()?;
            match (op, current) {
                (Op::Delete { .. }, None) => {}
                (Op::Put { value, lease, .. }, Some(kv))
                    if kv.value == *value && kv.lease == *lease =>
                {
                    if *revision.get_or_insert(kv.mod_revision) != kv.mod_revision {
                        return Ok(None);
                    }
                }
                _ => return Ok(None),
            }
        }
        match revision {
            Some(r) => Ok(Some(r)),
            // Only deletes, all done: as of the resend's read.
            None => header_revision(resp).map(Some),
        }
    }
}

impl EtcdStore {
    /// Body of the watch thread: forwards each batch of events until the stream ends, the
    /// receiver is gone, or etcd cancels the watch.
    fn watch_loop(
        &self,
        mut lines: BufReader<Body>,
        tx: Sender<Result<Vec<Event>>>,
        start: i64,
        prefix: &str,
    ) {
        loop {
            let msg = match read_stream_message(&mut lines) {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(Err(StoreError::Unavailable(format!(
                        "etcd watch of {prefix:?} ended: {e}"
                    ))));
                    return;
                }
            };
            if msg.get("canceled").and_then(Value::as_bool) == Some(true)
                || int_field(&msg, "compact_revision").unwrap_or(0) != 0
            {
                let _ = tx.send(Err(watch_end_error(&msg, start, prefix)));
                return;
            }
            let Some(events) = msg.get("events").and_then(Value::as_array) else {
                continue; // progress notification or other header-only message
            };
            let batch: Result<Vec<Event>> = events
                .iter()
                .map(|e| {
                    let kind = match e.get("type").and_then(Value::as_str) {
                        Some("DELETE") => EventKind::Delete,
                        _ => EventKind::Put,
                    };
                    let empty = Value::Null;
                    let kv = self.kv_from_json(e.get("kv").unwrap_or(&empty))?;
                    Ok(Event { kind, kv })
                })
                .collect();
            let failed = batch.is_err();
            if tx.send(batch).is_err() || failed {
                return;
            }
        }
    }
}

/// The error for a watch response that ends the watch (compacted start or cancellation).
fn watch_end_error(msg: &Value, start: i64, prefix: &str) -> StoreError {
    let compacted = int_field(msg, "compact_revision").unwrap_or(0);
    if compacted != 0 {
        return StoreError::Compacted {
            requested: start,
            oldest: compacted,
        };
    }
    let reason = msg
        .get("cancel_reason")
        .and_then(Value::as_str)
        .unwrap_or("no reason given");
    StoreError::Backend(format!(
        "etcd canceled the watch of {prefix:?} from revision {start}: {reason}"
    ))
}

/// A live etcd watch; events arrive from a background thread.
struct EtcdWatch {
    events: crate::ChannelWatch,
    /// A handle on the stream's socket, to unblock the reader thread on drop.
    shutdown: TcpStream,
}

impl Watch for EtcdWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        self.events.next_events(timeout)
    }
}

impl Drop for EtcdWatch {
    fn drop(&mut self) {
        let _ = self.shutdown.shutdown(Shutdown::Both);
    }
}

/// Reads one `{"result": ...}` message of a gateway stream (one JSON object per line).
fn read_stream_message(lines: &mut BufReader<Body>) -> io::Result<Value> {
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "stream closed by etcd",
            ));
        }
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad stream message {line:?}: {e}"),
            )
        })?;
        if let Some(result) = v.get("result") {
            return Ok(result.clone());
        }
        let err = v.get("error").unwrap_or(&v);
        return Err(io::Error::other(format!("etcd stream error: {err}")));
    }
}

/// The byte string just past every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().unwrap_or(&mut 0) += 1;
            return end;
        }
        end.pop();
    }
    // All 0xff: no upper bound, which etcd spells "\0".
    vec![0]
}

/// An int64 field, which the gateway sends as a JSON string (absent when zero).
fn int_field(v: &Value, name: &str) -> Result<i64> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|e| StoreError::Backend(format!("etcd sent a bad integer {name}={s:?}: {e}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| StoreError::Backend(format!("etcd sent a bad integer {name}={n}"))),
        Some(other) => Err(StoreError::Backend(format!(
            "etcd sent a non-integer {name}={other}"
        ))),
    }
}

/// A bytes field, base64 in JSON (absent when empty).
fn b64_field(v: &Value, name: &str) -> Result<Vec<u8>> {
    match v.get(name).and_then(Value::as_str) {
        None => Ok(Vec::new()),
        Some(s) => B64
            .decode(s)
            .map_err(|e| StoreError::Backend(format!("etcd sent bad base64 in {name}: {e}"))),
    }
}

fn header_revision(resp: &Value) -> Result<i64> {
    let header = resp
        .get("header")
        .ok_or_else(|| StoreError::Backend(format!("etcd response without a header: {resp}")))?;
    int_field(header, "revision")
}

/// Splits `host:port` or `[v6]:port`.
fn split_host_port(s: &str) -> std::result::Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| format!("{s:?} is not [address]:port"))?;
        (h, p)
    } else {
        s.rsplit_once(':')
            .ok_or_else(|| format!("{s:?} has no port (expected host:port)"))?
    };
    if host.is_empty() {
        return Err(format!("{s:?} has no host"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{s:?} has a bad port {port:?}"))?;
    Ok((host.to_string(), port))
}

fn load_tls(files: &TlsFiles) -> Result<Arc<rustls::ClientConfig>> {
    let client = match (&files.cert, &files.key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((
            http::read_pem("etcd TLS client certificate", cert).map_err(StoreError::Config)?,
            http::read_pem("etcd TLS client key", key).map_err(StoreError::Config)?,
        )),
        _ => {
            return Err(StoreError::Config(
                "etcd TLS: the client certificate and key must be given together".to_string(),
            ));
        }
    };
    let pem = http::TlsPem {
        ca: http::read_pem("etcd TLS CA", &files.ca).map_err(StoreError::Config)?,
        client,
    };
    http::tls_config(&format!("etcd TLS ({})", files.ca.display()), &pem)
        .map_err(StoreError::Config)
}

#[cfg(feature = "test-support")]
pub mod harness;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_settings_from_the_environment_are_checked() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                vars.iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| v.to_string())
            }
        };
        match settings_from(env(&[(RETRY_BUDGET_ENV, "abc")])) {
            Err(StoreError::Config(m)) => assert!(m.contains(RETRY_BUDGET_ENV), "{m}"),
            other => panic!("expected a Config error, got {other:?}"),
        }
        let (t, r) = settings_from(env(&[
            (RETRY_BUDGET_ENV, "1500"),
            (ATTEMPT_TIMEOUT_ENV, "700"),
        ]))
        .unwrap();
        assert_eq!(r.budget, Duration::from_millis(1500));
        assert_eq!(t.request, Duration::from_millis(700));
        let (t, r) = settings_from(env(&[])).unwrap();
        assert_eq!((t, r), (Timeouts::default(), RetryPolicy::default()));
    }

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(&[b'a', 0xff, 0xff]), b"b");
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

    #[test]
    fn url_parsing() {
        assert_eq!(
            parse_url("etcd://127.0.0.1:2379,[::1]:2380/").unwrap(),
            ["127.0.0.1:2379", "[::1]:2380"]
        );
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://a:1,,b:2",
            "etcd://h:99999",
            "http://h:1",
        ] {
            assert!(
                matches!(parse_url(bad), Err(StoreError::Config(_))),
                "{bad} must be rejected"
            );
        }
        assert_eq!(split_host_port("[::1]:7").unwrap(), ("::1".to_string(), 7));
    }

    #[test]
    fn gateway_integers_and_bytes() {
        let v = json!({"a": "12", "b": 3, "k": "Zm9v"});
        assert_eq!(int_field(&v, "a").unwrap(), 12);
        assert_eq!(int_field(&v, "b").unwrap(), 3);
        assert_eq!(int_field(&v, "missing").unwrap(), 0);
        assert_eq!(b64_field(&v, "k").unwrap(), b"foo");
        assert!(b64_field(&v, "missing").unwrap().is_empty());
    }
}
