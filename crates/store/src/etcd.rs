//! etcd v3 backend: the [`Store`] trait over etcd's JSON gRPC gateway (`/v3/...` on the client
//! port), with a small synchronous HTTP/1.1 client and optional TLS (rustls).
//!
//! Why the gateway and not gRPC: the trait is synchronous and used from short-lived processes
//! (the CNI plugin, `ternctl`); speaking JSON over a plain socket needs no async runtime and no
//! protobuf toolchain, and every etcd since 3.4 serves it. Each [`Store`] call is exactly one
//! request, so a [`Txn`] is one etcd transaction (compares plus success/failure ops).
//!
//! Failure handling: an endpoint that refuses or does not answer within the connect timeout is
//! skipped for the next one; the request timeout bounds every read and write. A request that was
//! fully sent on a fresh connection and then lost is not retried unless it is a read, since etcd
//! may have applied it. When no endpoint answers the error is [`StoreError::Unavailable`] naming
//! each endpoint and why it failed.
//!
//! Watches use a dedicated streaming connection read by a background thread; dropping the
//! [`Watch`] shuts the socket down, which ends the thread.
//!
//! [`EtcdStore::with_namespace`] confines a handle to a key prefix (several tenants or test runs
//! on one cluster); [`harness`] starts throw-away etcd processes for tests and benchmarks.
//!
//! Known limits: a range is one response (no pagination), so very large prefixes are bounded by
//! the gateway's message size; an idle watch on a member that vanishes without closing the TCP
//! connection is only noticed at the next write the caller expects.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};

use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Store, StoreError, Txn, TxnResponse, Watch,
};

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

/// Time limits of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Limit for establishing a TCP (and TLS) connection to one endpoint.
    pub connect: Duration,
    /// Limit for each read and write of a request and its response.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(5),
        }
    }
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
    Ok(Arc::new(EtcdStore::connect(
        &endpoints,
        tls,
        Timeouts::default(),
    )?))
}

impl EtcdStore {
    /// Connects to the cluster: `endpoints` are `host:port` (an `http://` or `https://` prefix is
    /// accepted when it matches whether `tls` is given). Reads the TLS files, then checks that an
    /// endpoint answers, so a dead cluster is reported here as [`StoreError::Unavailable`].
    pub fn connect(
        endpoints: &[impl AsRef<str>],
        tls: Option<TlsFiles>,
        timeouts: Timeouts,
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
        let store = EtcdStore {
            client: Arc::new(Client {
                endpoints: parsed,
                tls,
                timeouts,
                preferred: AtomicUsize::new(0),
                pool: Mutex::new(Vec::new()),
            }),
            namespace: String::new(),
        };
        store.revision()?;
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
                true,
            )
            .map_err(|e| e.into_store(None))?;
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
                true,
            )
            .map_err(|e| e.into_store(None))?;
        let kvs = match resp.get("kvs").and_then(Value::as_array) {
            Some(kvs) => kvs
                .iter()
                .map(|kv| self.kv_from_json(kv))
                .collect::<Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        Ok((kvs, header_revision(&resp)?))
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let body = json!({
            "compare": txn.compare.iter().map(|c| self.compare_json(c)).collect::<Vec<_>>(),
            "success": txn.success.iter().map(|o| self.op_json(o)).collect::<Vec<_>>(),
            "failure": txn.failure.iter().map(|o| self.op_json(o)).collect::<Vec<_>>(),
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
        let resp = self
            .client
            .call("/v3/kv/txn", &body, false)
            .map_err(|e| e.into_store(lease))?;
        Ok(TxnResponse {
            succeeded: resp
                .get("succeeded")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            revision: header_revision(&resp)?,
        })
    }

    fn revision(&self) -> Result<i64> {
        let resp = self
            .client
            .call(
                "/v3/kv/range",
                &json!({"key": B64.encode([0u8]), "count_only": true}),
                true,
            )
            .map_err(|e| e.into_store(None))?;
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
            rx,
            shutdown,
            ended: false,
        }))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        // etcd counts in whole seconds; round up so a lease never lives shorter than asked.
        let secs = ttl.as_millis().div_ceil(1000).max(1) as i64;
        let resp = self
            .client
            .call("/v3/lease/grant", &json!({"TTL": secs.to_string()}), false)
            .map_err(|e| e.into_store(None))?;
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
                true,
            )
            .map_err(|e| e.into_store(Some(lease)))?;
        // A streaming endpoint: the body is one `{"result": ...}` line per request sent.
        let result = resp.get("result").unwrap_or(&resp);
        if int_field(result, "TTL")? <= 0 {
            return Err(StoreError::LeaseNotFound(lease));
        }
        Ok(())
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        self.client
            .call("/v3/lease/revoke", &json!({"ID": lease.to_string()}), false)
            .map_err(|e| e.into_store(Some(lease)))?;
        Ok(())
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
    rx: Receiver<Result<Vec<Event>>>,
    /// A handle on the stream's socket, to unblock the reader thread on drop.
    shutdown: TcpStream,
    /// Set once the thread reported the end of the stream (further calls return that error).
    ended: bool,
}

impl Watch for EtcdWatch {
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        if self.ended {
            return Err(StoreError::Unavailable(
                "etcd watch already ended; open a new one".to_string(),
            ));
        }
        let first = match self.rx.recv_timeout(timeout) {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
            Err(RecvTimeoutError::Disconnected) => {
                self.ended = true;
                return Err(StoreError::Unavailable(
                    "etcd watch stream closed".to_string(),
                ));
            }
        };
        let mut out = first.inspect_err(|_| self.ended = true)?;
        // Hand over everything already received, so callers see whole bursts at once.
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
    let cfg_err = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        StoreError::Config(format!("etcd TLS {what} {}: {e}", path.display()))
    };
    let mut roots = rustls::RootCertStore::empty();
    let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.ca)
        .and_then(|it| it.collect())
        .map_err(|e| cfg_err("CA", &files.ca, &e))?;
    if cas.is_empty() {
        return Err(cfg_err("CA", &files.ca, &"no certificate in the file"));
    }
    for ca in cas {
        roots.add(ca).map_err(|e| cfg_err("CA", &files.ca, &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("etcd TLS setup: {e}")))?
        .with_root_certificates(roots);
    let config = match (&files.cert, &files.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect())
                .map_err(|e| cfg_err("client certificate", cert, &e))?;
            if chain.is_empty() {
                return Err(cfg_err(
                    "client certificate",
                    cert,
                    &"no certificate in the file",
                ));
            }
            let pk =
                PrivateKeyDer::from_pem_file(key).map_err(|e| cfg_err("client key", key, &e))?;
            builder
                .with_client_auth_cert(chain, pk)
                .map_err(|e| cfg_err("client certificate/key", cert, &e))?
        }
        _ => {
            return Err(StoreError::Config(
                "etcd TLS: the client certificate and key must be given together".to_string(),
            ));
        }
    };
    Ok(Arc::new(config))
}

struct Endpoint {
    host: String,
    port: u16,
    /// `scheme://host:port`, for messages.
    name: String,
}

/// Connections and endpoints shared by the clones of one [`EtcdStore`].
struct Client {
    endpoints: Vec<Endpoint>,
    tls: Option<Arc<rustls::ClientConfig>>,
    timeouts: Timeouts,
    /// Index of the endpoint that answered last; tried first.
    preferred: AtomicUsize,
    /// Idle keep-alive connections.
    pool: Mutex<Vec<Conn>>,
}

/// Why one request failed.
enum CallError {
    /// No endpoint could be reached or the exchange broke; the text names each attempt.
    Unavailable(String),
    /// etcd answered with a gRPC error.
    Grpc {
        endpoint: String,
        path: String,
        code: i64,
        message: String,
    },
    /// etcd answered something this client does not understand.
    Protocol(String),
}

impl CallError {
    /// The store error, with `lease` for "lease not found" answers.
    fn into_store(self, lease: Option<i64>) -> StoreError {
        match self {
            CallError::Unavailable(msg) => StoreError::Unavailable(msg),
            CallError::Grpc {
                code: 5, message, ..
            } if message.contains("lease not found") => {
                StoreError::LeaseNotFound(lease.unwrap_or(0))
            }
            // UNAVAILABLE, DEADLINE_EXCEEDED: no leader, timed-out proposal; worth retrying later.
            CallError::Grpc {
                endpoint,
                path,
                code: code @ (4 | 14),
                message,
            } => StoreError::Unavailable(format!("etcd {endpoint}{path}: {message} (code {code})")),
            CallError::Grpc {
                endpoint,
                path,
                code,
                message,
            } => StoreError::Backend(format!("etcd {endpoint}{path}: {message} (code {code})")),
            CallError::Protocol(msg) => StoreError::Backend(msg),
        }
    }
}

/// A failed exchange on one connection; `answered` is true once any response byte arrived.
/// True for the errors a socket timeout produces.
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

struct ExchangeError {
    answered: bool,
    error: io::Error,
}

impl Client {
    fn endpoint_names(&self) -> Vec<&str> {
        self.endpoints.iter().map(|e| e.name.as_str()).collect()
    }

    /// Endpoint indexes, the preferred one first.
    fn order(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        (0..n).map(move |i| (first + i) % n)
    }

    fn connect(&self, idx: usize) -> io::Result<Conn> {
        let ep = &self.endpoints[idx];
        let addrs = (ep.host.as_str(), ep.port).to_socket_addrs()?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolves to no address");
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, self.timeouts.connect) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let tcp = tcp.ok_or(last)?;
        tcp.set_nodelay(true)?;
        // The TLS handshake happens on first use; bound it by the connect timeout.
        tcp.set_read_timeout(Some(self.timeouts.connect))?;
        tcp.set_write_timeout(Some(self.timeouts.connect))?;
        let stream = match &self.tls {
            None => Stream::Plain(tcp),
            Some(cfg) => {
                let name = ServerName::try_from(ep.host.clone()).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name: {e}"))
                })?;
                let conn = rustls::ClientConnection::new(cfg.clone(), name)
                    .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
                let mut s = rustls::StreamOwned::new(conn, tcp);
                while s.conn.is_handshaking() {
                    s.conn
                        .complete_io(&mut s.sock)
                        .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
                }
                Stream::Tls(Box::new(s))
            }
        };
        stream.tcp().set_read_timeout(Some(self.timeouts.request))?;
        stream
            .tcp()
            .set_write_timeout(Some(self.timeouts.request))?;
        Ok(Conn {
            reader: BufReader::new(stream),
            endpoint: idx,
        })
    }

    fn take_pooled(&self) -> Option<Conn> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, conn: Conn) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        // Enough for a handful of concurrent callers; extra connections are simply closed.
        if pool.len() < 16 {
            pool.push(conn);
        }
    }

    /// POSTs `body` to `path` and returns the parsed JSON answer. `idempotent` requests are
    /// retried on the next endpoint even after they were sent.
    fn call(
        &self,
        path: &str,
        body: &Value,
        idempotent: bool,
    ) -> std::result::Result<Value, CallError> {
        let request = self.request_bytes(path, body);
        let mut failures = Vec::new();
        // An endpoint that timed out is not asked again in this call: a hung member accepts
        // new connections too, and each attempt would cost another full request timeout.
        let mut hung: Option<usize> = None;
        if let Some(mut conn) = self.take_pooled() {
            match exchange(&mut conn, &request) {
                Ok(resp) => return self.finish(conn, path, resp),
                Err(e) if is_timeout(&e.error) && !e.answered && idempotent => {
                    hung = Some(conn.endpoint);
                    failures.push(format!(
                        "{}: no answer within {:?}",
                        self.endpoints[conn.endpoint].name, self.timeouts.request
                    ));
                }
                // A pooled connection the server closed while idle: nothing was processed.
                Err(e) if !is_timeout(&e.error) && (!e.answered || idempotent) => {
                    failures.push(format!(
                        "{} (reused connection): {}",
                        self.endpoints[conn.endpoint].name, e.error
                    ))
                }
                Err(e) if is_timeout(&e.error) => {
                    return Err(CallError::Unavailable(format!(
                        "etcd {}{path}: no answer within {:?} (the request may or may not have \
                         been applied)",
                        self.endpoints[conn.endpoint].name, self.timeouts.request
                    )));
                }
                Err(e) => {
                    return Err(CallError::Unavailable(format!(
                        "etcd {}{path}: connection lost mid-response: {}",
                        self.endpoints[conn.endpoint].name, e.error
                    )));
                }
            }
        }
        for idx in self.order() {
            if hung == Some(idx) {
                continue;
            }
            let name = &self.endpoints[idx].name;
            let mut conn = match self.connect(idx) {
                Ok(c) => c,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            match exchange(&mut conn, &request) {
                Ok(resp) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return self.finish(conn, path, resp);
                }
                Err(e) if idempotent && is_timeout(&e.error) => failures.push(format!(
                    "{name}: no answer within {:?}",
                    self.timeouts.request
                )),
                Err(e) if idempotent => failures.push(format!("{name}: {}", e.error)),
                Err(e) => {
                    // The write may have been applied: do not repeat it elsewhere.
                    return Err(CallError::Unavailable(format!(
                        "etcd {name}{path}: request sent but no complete answer (it may or may \
                         not have been applied): {}",
                        e.error
                    )));
                }
            }
        }
        Err(CallError::Unavailable(format!(
            "no etcd endpoint answered {path}: {}",
            failures.join("; ")
        )))
    }

    /// Parses an answer and returns the connection to the pool when it can be reused.
    fn finish(
        &self,
        conn: Conn,
        path: &str,
        resp: Response,
    ) -> std::result::Result<Value, CallError> {
        let endpoint = self.endpoints[conn.endpoint].name.clone();
        if resp.keep_alive {
            self.give_back(conn);
        }
        let text = String::from_utf8_lossy(&resp.body);
        // Streaming endpoints answer one JSON object per line; unary calls use the first.
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let v: Value = serde_json::from_str(first).map_err(|e| {
            CallError::Protocol(format!(
                "etcd {endpoint}{path}: HTTP {} with a body that is not JSON ({e}): {:.200}",
                resp.status, text
            ))
        })?;
        if let Some(code) = v.get("code").and_then(Value::as_i64)
            && (v.get("error").is_some() || resp.status != 200)
        {
            let message = v
                .get("message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            return Err(CallError::Grpc {
                endpoint,
                path: path.to_string(),
                code,
                message,
            });
        }
        if resp.status != 200 {
            return Err(CallError::Protocol(format!(
                "etcd {endpoint}{path}: HTTP {}: {:.200}",
                resp.status, text
            )));
        }
        Ok(v)
    }

    fn request_bytes(&self, path: &str, body: &Value) -> Vec<u8> {
        let body = body.to_string();
        format!(
            "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Opens a streaming request on a dedicated connection: returns the body reader and a
    /// handle on the socket for shutting it down.
    fn open_stream(&self, path: &str, body: &Value) -> Result<(BufReader<Body>, TcpStream)> {
        let request = self.request_bytes(path, body);
        let mut failures = Vec::new();
        for idx in self.order() {
            let name = &self.endpoints[idx].name;
            let attempt = self.connect(idx).and_then(|mut conn| {
                conn.reader.get_mut().write_all(&request)?;
                conn.reader.get_mut().flush()?;
                let head = read_head(&mut conn.reader)?;
                if head.status != 200 {
                    let mut body = Vec::new();
                    let _ = head.body_reader(conn.reader).read_to_end(&mut body);
                    return Err(io::Error::other(format!(
                        "HTTP {}: {}",
                        head.status,
                        String::from_utf8_lossy(&body)
                    )));
                }
                let handle = conn.reader.get_ref().tcp().try_clone()?;
                Ok((BufReader::new(head.body_reader(conn.reader)), handle))
            });
            match attempt {
                Ok(s) => {
                    self.preferred.store(idx, Ordering::Relaxed);
                    return Ok(s);
                }
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        Err(StoreError::Unavailable(format!(
            "no etcd endpoint answered {path}: {}",
            failures.join("; ")
        )))
    }
}

/// Sends one request and reads the whole answer.
fn exchange(conn: &mut Conn, request: &[u8]) -> std::result::Result<Response, ExchangeError> {
    let not_answered = |error| ExchangeError {
        answered: false,
        error,
    };
    let answered = |error| ExchangeError {
        answered: true,
        error,
    };
    let stream = conn.reader.get_mut();
    stream.write_all(request).map_err(not_answered)?;
    stream.flush().map_err(not_answered)?;
    if conn.reader.fill_buf().map_err(not_answered)?.is_empty() {
        return Err(not_answered(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before an answer",
        )));
    }
    let head = read_head(&mut conn.reader).map_err(answered)?;
    let mut body = Vec::new();
    let keep_alive = head.keep_alive && head.framed();
    match head.framing {
        Framing::Length(n) => {
            body.resize(n, 0);
            conn.reader.read_exact(&mut body).map_err(answered)?;
        }
        Framing::Chunked => {
            Body::chunked(&mut conn.reader)
                .read_to_end(&mut body)
                .map_err(answered)?;
        }
        Framing::UntilClose => {
            conn.reader.read_to_end(&mut body).map_err(answered)?;
        }
    }
    Ok(Response {
        status: head.status,
        keep_alive,
        body,
    })
}

struct Response {
    status: u16,
    keep_alive: bool,
    body: Vec<u8>,
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

struct Head {
    status: u16,
    keep_alive: bool,
    framing: Framing,
}

impl Head {
    fn framed(&self) -> bool {
        !matches!(self.framing, Framing::UntilClose)
    }

    /// The body of a streaming answer as a reader that owns the connection.
    fn body_reader(&self, reader: BufReader<Stream>) -> Body {
        Body::chunked(Box::new(reader)).with_framing(&self.framing)
    }
}

fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before an answer",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP status line: {line:?}"),
            )
        })?;
    let mut keep_alive = line.starts_with("HTTP/1.1");
    let mut framing = Framing::UntilClose;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside the HTTP header",
            ));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let n = value.parse().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad Content-Length {value:?}"),
                    )
                })?;
                if !matches!(framing, Framing::Chunked) {
                    framing = Framing::Length(n);
                }
            }
            "transfer-encoding" if value.to_ascii_lowercase().contains("chunked") => {
                framing = Framing::Chunked;
            }
            "connection" if value.eq_ignore_ascii_case("close") => keep_alive = false,
            _ => {}
        }
    }
    Ok(Head {
        status,
        keep_alive,
        framing,
    })
}

/// A reader of an HTTP body: chunked transfer encoding, or (`length_framed`) a body of
/// `remaining` bytes (`usize::MAX` for "until the connection closes").
struct Body<R = Box<BufReader<Stream>>> {
    inner: R,
    /// Bytes left in the current chunk, or in the whole body when length-framed.
    remaining: usize,
    done: bool,
    length_framed: bool,
}

impl<R> Body<R> {
    fn chunked(inner: R) -> Body<R> {
        Body {
            inner,
            remaining: 0,
            done: false,
            length_framed: false,
        }
    }

    /// Adapts the reader to the answer's framing: a length-framed body is one big chunk.
    fn with_framing(mut self, framing: &Framing) -> Body<R> {
        match framing {
            Framing::Chunked => {}
            Framing::Length(n) => {
                self.remaining = *n;
                self.done = *n == 0;
                self.length_framed = true;
            }
            Framing::UntilClose => {
                self.remaining = usize::MAX;
                self.length_framed = true;
            }
        }
        self
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.length_framed {
            let want = buf.len().min(self.remaining);
            let n = self.inner.read(&mut buf[..want])?;
            if n == 0 {
                self.done = true;
                if self.remaining != usize::MAX {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside the body",
                    ));
                }
            } else if self.remaining != usize::MAX {
                self.remaining -= n;
                self.done = self.remaining == 0;
            }
            return Ok(n);
        }
        if self.remaining == 0 {
            // Chunk header: hex size, optional extensions.
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a chunked body",
                ));
            }
            let size_text = line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size line {line:?}"),
                )
            })?;
            if size == 0 {
                // Trailers end with an empty line.
                loop {
                    line.clear();
                    if self.inner.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
            self.remaining = size;
        }
        let want = buf.len().min(self.remaining);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a chunk",
            ));
        }
        self.remaining -= n;
        if self.remaining == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// A plain or TLS connection to one endpoint.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

struct Conn {
    reader: BufReader<Stream>,
    endpoint: usize,
}

/// A throw-away single-member etcd for tests and benchmarks (of this crate and the crates above
/// it): started on free loopback ports with its data in a temporary directory, killed by PID and
/// cleaned up on drop, also when a test panics.
pub mod harness {
    use std::fs;
    use std::io;
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;
    use std::time::{Duration, Instant};

    use super::{EtcdStore, Timeouts, TlsFiles};

    /// The etcd binary: `$TERN_ETCD_BIN`, else `etcd` from `PATH`.
    pub fn etcd_binary() -> PathBuf {
        std::env::var_os("TERN_ETCD_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("etcd"))
    }

    /// True when the etcd binary can be run.
    pub fn etcd_available() -> bool {
        Command::new(etcd_binary())
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A fresh directory under the system temporary directory, removed by its owner's drop.
    fn scratch_dir(what: &str) -> io::Result<PathBuf> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tern-{what}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    fn free_port() -> io::Result<u16> {
        Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
    }

    /// Certificates made with `openssl` for a TLS etcd on 127.0.0.1.
    #[derive(Debug)]
    pub struct TestCerts {
        /// Directory holding every file (removed on drop).
        pub dir: PathBuf,
        /// The CA certificate that signed both others.
        pub ca: PathBuf,
        /// Server certificate for IP 127.0.0.1 / `localhost` (server and client use).
        pub server_cert: PathBuf,
        /// The server certificate's key.
        pub server_key: PathBuf,
        /// Client certificate (client use only).
        pub client_cert: PathBuf,
        /// The client certificate's key.
        pub client_key: PathBuf,
    }

    impl TestCerts {
        /// Generates a CA, a server certificate for IP 127.0.0.1 and a client certificate
        /// (P-256 keys) in a new directory. Fails when `openssl` is missing.
        pub fn generate() -> io::Result<TestCerts> {
            let dir = scratch_dir("etcd-certs")?;
            let run = |args: &[&str]| -> io::Result<()> {
                let out = Command::new("openssl")
                    .args(args)
                    .current_dir(&dir)
                    .output()?;
                if !out.status.success() {
                    return Err(io::Error::other(format!(
                        "openssl {}: {}",
                        args.join(" "),
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
                Ok(())
            };
            let ec = [
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ];
            let mut ca_args = vec!["req", "-x509"];
            ca_args.extend(ec);
            ca_args.extend([
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=tern-test-ca",
            ]);
            run(&ca_args)?;
            for (name, usage, san) in [
                // etcd's gateway dials its own gRPC port with the server certificate, so the
                // server certificate needs client use too.
                (
                    "server",
                    "serverAuth,clientAuth",
                    "IP:127.0.0.1,DNS:localhost",
                ),
                ("client", "clientAuth", "DNS:tern-client"),
            ] {
                let (key, csr, crt, ext) = (
                    format!("{name}.key"),
                    format!("{name}.csr"),
                    format!("{name}.crt"),
                    format!("{name}.ext"),
                );
                fs::write(
                    dir.join(&ext),
                    format!("subjectAltName={san}\nextendedKeyUsage={usage}\n"),
                )?;
                let subj = format!("/CN=tern-{name}");
                let mut req = vec!["req"];
                req.extend(ec);
                req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
                run(&req)?;
                run(&[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext,
                ])?;
            }
            Ok(TestCerts {
                ca: dir.join("ca.crt"),
                server_cert: dir.join("server.crt"),
                server_key: dir.join("server.key"),
                client_cert: dir.join("client.crt"),
                client_key: dir.join("client.key"),
                dir,
            })
        }

        /// The client side: CA plus client certificate and key.
        pub fn client_files(&self) -> TlsFiles {
            TlsFiles {
                ca: self.ca.clone(),
                cert: Some(self.client_cert.clone()),
                key: Some(self.client_key.clone()),
            }
        }
    }

    impl Drop for TestCerts {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    /// A running etcd child process.
    pub struct EtcdServer {
        child: Child,
        dir: PathBuf,
        /// `127.0.0.1:PORT` of the client listener.
        pub endpoint: String,
        tls: Option<TlsFiles>,
    }

    impl EtcdServer {
        /// Starts a plain-HTTP etcd and waits until it serves requests.
        pub fn start() -> io::Result<EtcdServer> {
            Self::start_with(None)
        }

        /// Starts an etcd serving HTTPS with `certs`, requiring client certificates.
        pub fn start_tls(certs: &TestCerts) -> io::Result<EtcdServer> {
            Self::start_with(Some(certs))
        }

        fn start_with(certs: Option<&TestCerts>) -> io::Result<EtcdServer> {
            // Another process may grab a probed port before etcd binds it: try a few times.
            let mut last = io::Error::other("etcd did not start");
            for _ in 0..3 {
                match Self::try_start(certs) {
                    Ok(s) => return Ok(s),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }

        fn try_start(certs: Option<&TestCerts>) -> io::Result<EtcdServer> {
            let dir = scratch_dir("etcd")?;
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let scheme = if certs.is_some() { "https" } else { "http" };
            let client_url = format!("{scheme}://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let name = format!("t{}", std::process::id());
            let log = fs::File::create(dir.join("etcd.log"))?;
            let mut cmd = Command::new(etcd_binary());
            cmd.args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("{name}={peer_url}")])
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            if let Some(c) = certs {
                cmd.arg("--cert-file")
                    .arg(&c.server_cert)
                    .arg("--key-file")
                    .arg(&c.server_key)
                    .arg("--trusted-ca-file")
                    .arg(&c.ca)
                    .arg("--client-cert-auth");
            }
            let child = cmd.spawn().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot run {}: {e}", etcd_binary().display()),
                )
            })?;
            let mut server = EtcdServer {
                child,
                dir,
                endpoint: format!("127.0.0.1:{client_port}"),
                tls: certs.map(TestCerts::client_files),
            };
            server.wait_ready(Duration::from_secs(20))?;
            Ok(server)
        }

        fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
            let deadline = Instant::now() + limit;
            let quick = Timeouts {
                connect: Duration::from_millis(500),
                request: Duration::from_secs(2),
            };
            loop {
                if let Some(status) = self.child.try_wait()? {
                    return Err(io::Error::other(format!(
                        "etcd exited early ({status}): {}",
                        self.log_tail()
                    )));
                }
                match EtcdStore::connect(&[&self.endpoint], self.tls.clone(), quick) {
                    Ok(_) => return Ok(()),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(io::Error::other(format!(
                            "etcd on {} not ready after {limit:?}: {e}; log: {}",
                            self.endpoint,
                            self.log_tail()
                        )));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(50)),
                }
            }
        }

        fn log_tail(&self) -> String {
            let log = fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
            let start = log.len().saturating_sub(2000);
            log[log.ceil_char_boundary(start)..].to_string()
        }

        /// `etcd://127.0.0.1:PORT`.
        pub fn url(&self) -> String {
            format!("etcd://{}", self.endpoint)
        }

        /// The client TLS files when the server runs TLS.
        pub fn tls(&self) -> Option<TlsFiles> {
            self.tls.clone()
        }

        /// A store connected to this server (with TLS when it runs TLS).
        pub fn store(&self) -> crate::Result<EtcdStore> {
            EtcdStore::connect(&[&self.endpoint], self.tls.clone(), Timeouts::default())
        }

        /// The process id, e.g. for tests that stop the server.
        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        /// Kills the server now (the directory stays until drop).
        pub fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }

        /// The data directory's parent, holding `etcd.log`.
        pub fn dir(&self) -> &Path {
            &self.dir
        }
    }

    impl Drop for EtcdServer {
        fn drop(&mut self) {
            self.kill();
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn chunked_body_decodes() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut r = io::Cursor::new(&raw[..]);
        let mut c = Body::chunked(&mut r);
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "NEXT", "the reader stops right after the body");
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
