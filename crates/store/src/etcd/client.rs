//! The retrying client under [`super::EtcdStore`]: the members' endpoints, the order they are
//! tried in (a failed member goes last for a while), pooled keep-alive connections, and one call
//! as a series of attempts within the retry budget, each failure classified as retryable or not
//! and whether a write may have been applied (see the parent module for the policy).

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Body, Conn, Response, exchange, is_timeout, read_head};
use crate::{Result, StoreError};
/// Time limits of every attempt of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Limit for establishing a TCP (and TLS) connection to one endpoint (default 1 s).
    pub connect: Duration,
    /// Limit for each read and write of one attempt (default 2 s): a member that holds a
    /// request longer (a follower whose leader died keeps proposals for ~7 s) is left for
    /// another one. Also bounds a watch's handshake.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(1),
            request: Duration::from_secs(2),
        }
    }
}

/// How a call rides through member failures (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total time one call may spend on attempts and pauses before it fails with
    /// [`StoreError::Unavailable`] (default 6 s: an etcd election takes 1 to 3 s with the
    /// default election timeout, and the CNI runtime should hear "try again" well within 10 s).
    pub budget: Duration,
    /// Pause after a round in which every endpoint failed; doubles every round (default 50 ms).
    pub backoff: Duration,
    /// Longest pause between rounds (default 500 ms).
    pub max_backoff: Duration,
    /// How long an endpoint that failed is tried only after the others (default 5 s).
    pub penalty: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            budget: Duration::from_secs(6),
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            penalty: Duration::from_secs(5),
        }
    }
}

pub(super) struct Endpoint {
    pub(super) host: String,
    pub(super) port: u16,
    /// `scheme://host:port`, for messages.
    pub(super) name: String,
}

/// Connections and endpoints shared by the clones of one [`EtcdStore`].
pub(super) struct Client {
    pub(super) endpoints: Vec<Endpoint>,
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
    pub(super) timeouts: Timeouts,
    pub(super) retry: RetryPolicy,
    /// Index of the endpoint that answered last; tried first.
    pub(super) preferred: AtomicUsize,
    /// Per endpoint: until when it is tried only after the others, because it failed.
    pub(super) penalized: Mutex<Vec<Option<Instant>>>,
    /// Set when a call used up its whole budget without any member answering at all, cleared by
    /// the next answer: while the cluster is known to be down, calls make one pass over the
    /// endpoints instead of waiting out the budget again (a failed ADD's rollback, the agent's
    /// background loops and the runtime's retries then fail fast). A pass in which a member
    /// answers, even with "no leader", goes on with the whole budget.
    pub(super) outage: AtomicBool,
    /// Idle keep-alive connections.
    pub(super) pool: Mutex<Vec<Conn>>,
}

/// Why one request failed.
pub(super) enum CallError {
    /// No member gave a usable answer within the retry budget; the text names each attempt.
    /// `unknown`: an attempt was sent and got no answer, so a write may have been applied.
    Unavailable { msg: String, unknown: bool },
    /// etcd answered with a gRPC error.
    Grpc {
        endpoint: String,
        path: String,
        code: i64,
        message: String,
    },
    /// A gateway or proxy answered with an HTTP error page (502/503/504): the member is going
    /// away or cannot reach its own server; worth another endpoint.
    Transient(String),
    /// etcd answered something this client does not understand.
    Protocol(String),
}

/// What to do with an answer that is an error.
#[derive(Debug, PartialEq, Eq)]
enum Retry {
    /// A real answer (bad request, lease not found, ...): return it.
    No,
    /// The member refused before doing anything (no leader, too many requests): try another.
    NotApplied,
    /// The member gave up on the request (timed out, leader changed, stopping): a write may or
    /// may not have been applied; try another.
    MaybeApplied,
}

impl CallError {
    /// Whether another member should be asked, and whether the request may have taken effect.
    fn retry(&self) -> Retry {
        match self {
            CallError::Grpc { code, message, .. } => grpc_retry(*code, message),
            CallError::Transient(_) => Retry::MaybeApplied,
            CallError::Unavailable { .. } | CallError::Protocol(_) => Retry::No,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            CallError::Unavailable { msg, .. }
            | CallError::Transient(msg)
            | CallError::Protocol(msg) => msg.clone(),
            CallError::Grpc {
                endpoint,
                path,
                code,
                message,
            } => format!("etcd {endpoint}{path}: {message} (code {code})"),
        }
    }

    /// The store error, with `lease` for "lease not found" answers.
    pub(super) fn into_store(self, lease: Option<i64>) -> StoreError {
        match self {
            // A lost answer only matters for a transaction, which reports it as `Ambiguous`.
            CallError::Unavailable { msg, .. } => StoreError::Unavailable(msg),
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
            CallError::Transient(msg) => StoreError::Unavailable(msg),
            CallError::Protocol(msg) => StoreError::Backend(msg),
        }
    }
}

/// Classifies a gRPC error of etcd (codes as in `google.golang.org/grpc/codes`, messages as in
/// etcd's `rpctypes`): which ones another member may answer, and which ones leave a write's
/// outcome open.
fn grpc_retry(code: i64, message: &str) -> Retry {
    const NOT_APPLIED: &[&str] = &[
        "no leader",
        "not leader",
        "too many requests",
        "not capable",
        "unhealthy cluster",
    ];
    const MAYBE_APPLIED: &[&str] = &[
        "leader changed",
        "timed out",
        "server stopped",
        "connection lost",
        "transport is closing",
        "client connection is closing",
        "connection refused",
        "connection reset",
        "error reading from server",
    ];
    let m = message.to_ascii_lowercase();
    if NOT_APPLIED.iter().any(|s| m.contains(s)) {
        Retry::NotApplied
    } else if MAYBE_APPLIED.iter().any(|s| m.contains(s)) {
        Retry::MaybeApplied
    } else {
        match code {
            // RESOURCE_EXHAUSTED: rate limited before anything was done.
            8 => Retry::NotApplied,
            // CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE.
            1 | 4 | 14 => Retry::MaybeApplied,
            _ => Retry::No,
        }
    }
}

/// A successful call: the answer, and whether an earlier attempt of the same call was sent and
/// lost (so a write may already have been applied once before this answer).
pub(super) struct Answer {
    pub(super) value: Value,
    pub(super) after_unknown: bool,
}

/// Why one attempt failed: the text for the error, whether the request was sent (so its
/// outcome is unknown), and whether the connection was a pooled one found dead.
struct AttemptError {
    msg: String,
    sent: bool,
    stale: bool,
}

/// The largest answer read whole (a range is one answer): etcd's gateway answers at most
/// `--max-request-bytes` (1.5 MiB by default) per value, a range of many values more.
const MAX_ANSWER: usize = 256 * 1024 * 1024;

/// The shortest time given to one attempt, even when the budget is nearly used up.
const MIN_ATTEMPT: Duration = Duration::from_millis(200);

impl Client {
    pub(super) fn endpoint_names(&self) -> Vec<&str> {
        self.endpoints.iter().map(|e| e.name.as_str()).collect()
    }

    /// Endpoint indexes in the order to try them: the preferred one and those after it, then
    /// (like clientv3's balancer) the ones that failed recently, the longest-penalized last.
    pub(super) fn order(&self) -> Vec<usize> {
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let now = Instant::now();
        let pen = self.penalized.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
        v.sort_by_key(|&i| pen[i].filter(|t| *t > now));
        v
    }

    /// Records that `idx` failed: it goes to the back of the order for the penalty period and
    /// its idle connections are closed (they most likely lead to the same dead process).
    pub(super) fn penalize(&self, idx: usize) {
        self.penalized.lock().unwrap_or_else(|e| e.into_inner())[idx] =
            Some(Instant::now() + self.retry.penalty);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c.endpoint != idx);
        if self.preferred.load(Ordering::Relaxed) % self.endpoints.len() == idx {
            self.preferred
                .store((idx + 1) % self.endpoints.len(), Ordering::Relaxed);
        }
    }

    /// Records that `idx` answered: the cluster is up and `idx` is preferred again.
    pub(super) fn answered(&self, idx: usize) {
        self.outage.store(false, Ordering::Relaxed);
        self.penalized.lock().unwrap_or_else(|e| e.into_inner())[idx] = None;
        self.preferred.store(idx, Ordering::Relaxed);
    }

    /// A new connection to endpoint `idx`, within the connect timeout or `limit` if shorter.
    pub(super) fn connect(&self, idx: usize, limit: Duration) -> io::Result<Conn> {
        let ep = &self.endpoints[idx];
        http::connect(
            &ep.host,
            ep.port,
            self.tls.as_ref(),
            self.timeouts.connect.min(limit),
            self.timeouts.request,
            idx,
        )
    }

    pub(super) fn take_pooled(&self, idx: usize) -> Option<Conn> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let pos = pool.iter().rposition(|c| c.endpoint == idx)?;
        Some(pool.swap_remove(pos))
    }

    pub(super) fn give_back(&self, conn: Conn) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        // Enough for a handful of concurrent callers; extra connections are simply closed.
        if pool.len() < 16 {
            pool.push(conn);
        }
    }

    /// One attempt on endpoint `idx` with at most `limit` per read and write, on an idle pooled
    /// connection when `pooled` and there is one, else on a new connection. Returns the parsed
    /// answer, or why the exchange failed.
    fn attempt(
        &self,
        idx: usize,
        path: &str,
        request: &[u8],
        limit: Duration,
        pooled: bool,
    ) -> std::result::Result<std::result::Result<Value, CallError>, AttemptError> {
        let name = &self.endpoints[idx].name;
        let (mut conn, reused) = match pooled.then(|| self.take_pooled(idx)).flatten() {
            Some(c) => (c, true),
            None => (
                self.connect(idx, limit).map_err(|e| AttemptError {
                    msg: format!("{name}: {e}"),
                    sent: false,
                    stale: false,
                })?,
                false,
            ),
        };
        let tcp = conn.reader.get_ref().tcp();
        let _ = tcp.set_read_timeout(Some(limit));
        let _ = tcp.set_write_timeout(Some(limit));
        match exchange(&mut conn, request, MAX_ANSWER) {
            Ok(resp) => {
                if resp.keep_alive {
                    self.give_back(conn);
                }
                Ok(parse_answer(name, path, resp))
            }
            Err(e) => {
                let what = if is_timeout(&e.error) {
                    format!("no answer within {limit:?}")
                } else if e.answered {
                    format!("connection lost mid-answer: {}", e.error)
                } else {
                    e.error.to_string()
                };
                Err(AttemptError {
                    msg: format!("{name}: {what}"),
                    sent: e.sent,
                    // An idle connection the server had closed (keep-alive race), or one to a
                    // member that died since: worth one fresh connection before moving on.
                    stale: reused && !e.answered && !is_timeout(&e.error),
                })
            }
        }
    }

    /// POSTs `body` to `path` and returns the parsed JSON answer, riding through member
    /// failures: a member that is down, does not answer within the per-attempt timeout, or
    /// answers with a transient error (no leader, leader changed, timed out, too many
    /// requests, stopping) is penalized and the next endpoint is asked, with a growing pause
    /// after every round, until the retry budget is used up. After an attempt whose outcome is
    /// unknown (sent, no answer) the call sends `resend` instead when given (a transaction that
    /// can tell whether the first one applied), else `body` again (for reads and for writes
    /// that are idempotent). `quick`: one pass over the endpoints, no pauses (the liveness
    /// check of [`EtcdStore::connect`]).
    pub(super) fn call(
        &self,
        path: &str,
        body: &Value,
        resend: Option<&Value>,
        quick: bool,
    ) -> std::result::Result<Answer, CallError> {
        let first = self.request_bytes(path, body);
        let again = resend.map(|b| self.request_bytes(path, b));
        let start = Instant::now();
        let mut one_pass = quick || self.outage.load(Ordering::Relaxed);
        let deadline = start + self.retry.budget;
        let mut failures: Vec<String> = Vec::new();
        let mut unknown = false;
        // Whether some member answered (if only with "no leader"): the cluster is reachable.
        let mut reachable = false;
        let mut pause = self.retry.backoff;
        let mut attempts = 0usize;
        'rounds: loop {
            for idx in self.order() {
                let now = Instant::now();
                if attempts > 0 && !one_pass && now >= deadline {
                    break 'rounds;
                }
                let limit = if one_pass {
                    self.timeouts.request
                } else {
                    self.timeouts
                        .request
                        .min(deadline.saturating_duration_since(now))
                        .max(MIN_ATTEMPT)
                };
                let request = match (&again, unknown) {
                    (Some(a), true) => a.as_slice(),
                    _ => first.as_slice(),
                };
                attempts += 1;
                let mut result = self.attempt(idx, path, request, limit, true);
                if let Err(AttemptError {
                    stale: true, sent, ..
                }) = &result
                {
                    // Once more on a fresh connection to the same member; if the dead one had
                    // carried the request, the outcome is unknown and the resend is used.
                    unknown |= *sent;
                    let request = match (&again, unknown) {
                        (Some(a), true) => a.as_slice(),
                        _ => first.as_slice(),
                    };
                    result = self.attempt(idx, path, request, limit, false);
                }
                match result {
                    Ok(Ok(value)) => {
                        self.answered(idx);
                        return Ok(Answer {
                            value,
                            after_unknown: unknown,
                        });
                    }
                    Ok(Err(e)) => match e.retry() {
                        Retry::No => {
                            self.answered(idx);
                            return Err(e);
                        }
                        r => {
                            unknown |= r == Retry::MaybeApplied;
                            reachable = true;
                            self.penalize(idx);
                            failures.push(e.describe());
                        }
                    },
                    Err(AttemptError { msg, sent, .. }) => {
                        unknown |= sent;
                        self.penalize(idx);
                        failures.push(msg);
                    }
                }
            }
            // A cluster believed down that answers again (electing a leader, say) gets the
            // whole budget to finish.
            if one_pass && !quick && reachable {
                one_pass = false;
            }
            let now = Instant::now();
            if one_pass || now >= deadline {
                break;
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(self.retry.max_backoff);
        }
        if !quick && !reachable {
            self.outage.store(true, Ordering::Relaxed);
        }
        Err(CallError::Unavailable {
            msg: format!(
                "no etcd endpoint answered {path} {}: {}",
                if quick {
                    "(one attempt per endpoint)".to_string()
                } else if one_pass {
                    "(one attempt per endpoint: the cluster was unreachable before this call)"
                        .to_string()
                } else {
                    format!(
                        "within the retry budget of {:?} ({attempts} attempts)",
                        self.retry.budget
                    )
                },
                summarize(&failures)
            ),
            unknown,
        })
    }

    pub(super) fn request_bytes(&self, path: &str, body: &Value) -> Vec<u8> {
        let body = body.to_string();
        format!(
            "POST {path} HTTP/1.1\r\nHost: etcd\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Opens a streaming request on a dedicated connection: returns the body reader and a
    /// handle on the socket for shutting it down. Retried over the endpoints within the budget
    /// like a read.
    pub(super) fn open_stream(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(BufReader<Body>, TcpStream)> {
        let request = self.request_bytes(path, body);
        let mut failures = Vec::new();
        let one_pass = self.outage.load(Ordering::Relaxed);
        let deadline = Instant::now() + self.retry.budget;
        let mut pause = self.retry.backoff;
        'rounds: loop {
            for idx in self.order() {
                if !failures.is_empty() && !one_pass && Instant::now() >= deadline {
                    break 'rounds;
                }
                let name = &self.endpoints[idx].name;
                let attempt = self
                    .connect(idx, self.timeouts.connect)
                    .and_then(|mut conn| {
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
                        self.answered(idx);
                        return Ok(s);
                    }
                    Err(e) => {
                        self.penalize(idx);
                        failures.push(format!("{name}: {e}"));
                    }
                }
            }
            let now = Instant::now();
            if one_pass || now >= deadline {
                break;
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(self.retry.max_backoff);
        }
        Err(StoreError::Unavailable(format!(
            "no etcd endpoint answered {path}: {}",
            summarize(&failures)
        )))
    }
}

/// The attempts of a failed call for its error message: each distinct failure once, with a
/// count, so a long retry does not make a huge message.
fn summarize(failures: &[String]) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for f in failures {
        match seen.iter_mut().find(|(s, _)| *s == f.as_str()) {
            Some((_, n)) => *n += 1,
            None => seen.push((f, 1)),
        }
    }
    seen.iter()
        .map(|(s, n)| {
            if *n > 1 {
                format!("{s} (x{n})")
            } else {
                s.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Parses an answer of endpoint `endpoint` into JSON, or the error it reports.
fn parse_answer(
    endpoint: &str,
    path: &str,
    resp: Response,
) -> std::result::Result<Value, CallError> {
    let text = String::from_utf8_lossy(&resp.body);
    // Streaming endpoints answer one JSON object per line; unary calls use the first.
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let v: Value = match serde_json::from_str(first) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!(
                "etcd {endpoint}{path}: HTTP {} with a body that is not JSON ({e}): {:.200}",
                resp.status, text
            );
            return Err(if matches!(resp.status, 502..=504) {
                CallError::Transient(msg)
            } else {
                CallError::Protocol(msg)
            });
        }
    };
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
            endpoint: endpoint.to_string(),
            path: path.to_string(),
            code,
            message,
        });
    }
    // A streaming answer carries its error inside the message (`{"error": {...}}`).
    if let Some(err) = v.get("error").filter(|e| e.is_object()) {
        let code = err.get("grpc_code").or_else(|| err.get("code"));
        return Err(CallError::Grpc {
            endpoint: endpoint.to_string(),
            path: path.to_string(),
            code: code.and_then(Value::as_i64).unwrap_or(2),
            message: err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        });
    }
    if resp.status != 200 {
        let msg = format!("etcd {endpoint}{path}: HTTP {}: {:.200}", resp.status, text);
        return Err(if matches!(resp.status, 502..=504) {
            CallError::Transient(msg)
        } else {
            CallError::Protocol(msg)
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_etcd_errors_are_retried_and_classified() {
        for (code, msg, want) in [
            (14, "etcdserver: no leader", Retry::NotApplied),
            (14, "etcdserver: not leader", Retry::NotApplied),
            (8, "etcdserver: too many requests", Retry::NotApplied),
            (14, "etcdserver: leader changed", Retry::MaybeApplied),
            (14, "etcdserver: request timed out", Retry::MaybeApplied),
            (
                14,
                "etcdserver: request timed out, possibly due to previous leader failure",
                Retry::MaybeApplied,
            ),
            (14, "etcdserver: server stopped", Retry::MaybeApplied),
            (14, "transport is closing", Retry::MaybeApplied),
            (1, "context canceled", Retry::MaybeApplied),
            (4, "context deadline exceeded", Retry::MaybeApplied),
            (3, "etcdserver: request is too large", Retry::No),
            (5, "etcdserver: requested lease not found", Retry::No),
            (
                11,
                "etcdserver: mvcc: required revision has been compacted",
                Retry::No,
            ),
        ] {
            assert_eq!(grpc_retry(code, msg), want, "{code} {msg}");
        }
        // A proxy's error page is worth another endpoint; another HTTP error is not.
        let page = |status| Response {
            status,
            keep_alive: false,
            body: b"Service Unavailable".to_vec(),
        };
        assert_eq!(
            parse_answer("e", "/p", page(503)).unwrap_err().retry(),
            Retry::MaybeApplied
        );
        assert_eq!(
            parse_answer("e", "/p", page(400)).unwrap_err().retry(),
            Retry::No
        );
        let grpc = Response {
            status: 503,
            keep_alive: true,
            body:
                br#"{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}"#
                    .to_vec(),
        };
        assert_eq!(
            parse_answer("e", "/p", grpc).unwrap_err().retry(),
            Retry::NotApplied
        );
    }

    #[test]
    fn failed_endpoints_go_last_and_messages_stay_short() {
        let client = Client {
            endpoints: (0..3)
                .map(|i| Endpoint {
                    host: "127.0.0.1".into(),
                    port: 1 + i,
                    name: format!("e{i}"),
                })
                .collect(),
            tls: None,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            preferred: AtomicUsize::new(0),
            penalized: Mutex::new(vec![None; 3]),
            outage: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
        };
        assert_eq!(client.order(), [0, 1, 2]);
        client.penalize(0);
        assert_eq!(client.order(), [1, 2, 0], "a failed endpoint is tried last");
        client.penalize(2);
        assert_eq!(client.order(), [1, 0, 2], "the longest-penalized last");
        client.answered(2);
        assert_eq!(
            client.order(),
            [2, 1, 0],
            "an answering endpoint is preferred again"
        );
        let many: Vec<String> = (0..50).map(|i| format!("e{}: refused", i % 2)).collect();
        assert_eq!(summarize(&many), "e0: refused (x25); e1: refused (x25)");
    }
}
