//! The health and metrics endpoints (`/metrics`, `/liveness`, `/readiness`) over a minimal
//! HTTP/1.1 server on std that a slow or hostile local client cannot stall (see
//! [`HTTP_MAX_HEAD`] and the limits after it). The page is rendered from the agent's services
//! here; the counters and gauges themselves are [`crate::metrics`]'s.

use crate::agent::Agent;
use crate::metrics::exposition::Page;
use crate::metrics::{PoolGauges, ipam_gauges};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

impl Agent {
    /// Binds the HTTP listeners of the configuration (see [`start_http`]).
    pub fn start_http(self: &Arc<Self>) -> Vec<std::net::SocketAddr> {
        start_http(self)
    }

    /// The full `/metrics` page.
    pub fn render_metrics(&self) -> String {
        let node = &self.cfg.node_name;
        let mut page = Page::new();
        let up = "Whether the last scrape could read the datastore.";
        match ipam_gauges(self.pods().ipam(), node) {
            Ok(g) => {
                for (name, help, get) in [
                    (
                        "ipam_allocations_in_use",
                        "Addresses allocated by this node, per pool.",
                        (|g: &PoolGauges| g.in_use) as fn(&PoolGauges) -> u64,
                    ),
                    (
                        "ipam_blocks",
                        "Blocks affine to this node, per pool.",
                        |g: &PoolGauges| g.blocks,
                    ),
                    (
                        "ipam_allocations_borrowed",
                        "Addresses this node allocated from blocks of other nodes, per pool.",
                        |g: &PoolGauges| g.borrowed,
                    ),
                ] {
                    let mut f = page.gauge(name, help);
                    for (pool, v) in &g {
                        f.sample(&[("ippool", pool), ("node", node)], get(v));
                    }
                }
                page.gauge("tern_datastore_up", up)
                    .sample(&[("node", node)], 1u64);
            }
            Err(e) => {
                log::debug!("metrics: cannot read IPAM: {e}");
                page.gauge("tern_datastore_up", up)
                    .sample(&[("node", node)], 0u64);
            }
        }
        if let Some(b) = &self.bgp {
            b.render_metrics(&mut page);
        }
        page.gauge(
            "tern_endpoints",
            "Pod interfaces (WorkloadEndpoints) of this node.",
        )
        .sample(&[("node", node)], self.pods().endpoint_count());
        if let Some(k) = &self.kube {
            k.render_metrics(node, &mut page);
        }
        if let Some(f) = &self.flows {
            f.render_metrics(node, &mut page);
        }
        self.metrics.render_counters(node, &mut page);
        self.host.render_metrics(node, &mut page);
        crate::metrics::render_heap(node, &mut page);
        page.into_string()
    }

    /// Reasons this node is not ready beyond the datastore and pools: a store that can no
    /// longer be trusted, prerequisites (sysctls) that are not met. Empty when none.
    pub fn readiness_problems(&self) -> Vec<String> {
        // A poisoned lock still holds the last problem set.
        let held = |m: &Mutex<Option<String>>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = Vec::new();
        if let Some(p) = held(&self.store_problem) {
            out.push(format!("store not trusted: {p}"));
        }
        if let Some(p) = self.pods().orphan_problem() {
            out.push(format!("pod interfaces kept: {p}"));
        }
        out.extend(self.host.problems());
        // Stored policies this node cannot use: each keeps its last good version, but the
        // node does not enforce what the store says.
        if let Some(pe) = &self.policy {
            let u = pe.unusable_policies();
            if !u.is_empty() {
                let list: Vec<String> = u.iter().map(|(k, why)| format!("{k}: {why}")).collect();
                out.push(format!(
                    "{} stored policies cannot be used (their last good versions are kept): {}",
                    u.len(),
                    list.join("; ")
                ));
            }
        }
        out
    }

    /// [`Agent::readiness_problems`] as one readiness verdict.
    pub fn prerequisites_ready(&self) -> Result<(), String> {
        let p = self.readiness_problems();
        if p.is_empty() {
            Ok(())
        } else {
            Err(p.join("; "))
        }
    }

    /// Readiness: the store answers and at least one pool can serve workloads on this node.
    pub fn readiness(&self) -> Result<(), String> {
        self.prerequisites_ready()?;
        if let Some(k) = &self.kube {
            k.readiness().map_err(|e| format!("kubernetes: {e}"))?;
        }
        self.store
            .revision()
            .map_err(|e| format!("datastore unreachable: {e}"))?;
        let pools = self
            .pods()
            .ipam()
            .usable_pools(&self.cfg.node_name)
            .map_err(|e| format!("cannot read IP pools: {e}"))?;
        if pools.is_empty() {
            return Err(format!(
                "no IP pool is usable for workloads on node {}",
                self.cfg.node_name
            ));
        }
        Ok(())
    }

    /// Liveness: the maintenance loop has ticked recently (it is not wedged).
    pub fn liveness(&self) -> Result<(), String> {
        let age = self.heartbeat_age();
        let limit = Duration::from_secs(self.cfg.resync_seconds.max(1) * 3 + 60);
        if age > limit {
            return Err(format!(
                "maintenance loop has not run for {}s",
                age.as_secs()
            ));
        }
        Ok(())
    }

    /// Answers one HTTP request path: (status, content type, body).
    pub fn http_response(&self, path: &str) -> (u16, &'static str, String) {
        let path = path.split('?').next().unwrap_or("");
        match path {
            "/metrics" => (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                self.render_metrics(),
            ),
            "/liveness" | "/livez" | "/healthz" => match self.liveness() {
                Ok(()) => (200, "text/plain", "ok\n".into()),
                Err(e) => (503, "text/plain", format!("{e}\n")),
            },
            "/readiness" | "/readyz" => match self.readiness() {
                Ok(()) => (200, "text/plain", "ready\n".into()),
                Err(e) => (503, "text/plain", format!("{e}\n")),
            },
            _ => (404, "text/plain", format!("no such path {path}\n")),
        }
    }
}

/// Largest HTTP request head (request line and headers) the listener reads: 8 KiB.
pub const HTTP_MAX_HEAD: usize = 8 << 10;
/// Time a client has to send its whole request head.
pub const HTTP_REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take the response.
pub const HTTP_WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to take the whole response of `/metrics` or `/readiness`, however it
/// paces its reads (each write still waits at most [`HTTP_WRITE_TIMEOUT`]).
pub const HTTP_RESPONSE_DEADLINE: Duration = Duration::from_secs(10);
/// Connections whose request is still being read; beyond this the oldest is dropped, so new
/// clients (kubelet's probe) always get in.
pub const HTTP_MAX_PENDING: usize = 512;
/// Responses computed at once on their own threads (`/metrics` and `/readiness`, which read the
/// store); beyond this a request gets 503 at once. `/liveness` never waits for them.
pub const HTTP_MAX_RESPONDERS: usize = 8;

/// Binds the HTTP listeners of the configuration (one when both addresses are equal); a
/// listener that cannot bind is logged and skipped: metrics must never stop the agent.
pub fn start_http(agent: &Arc<Agent>) -> Vec<std::net::SocketAddr> {
    let mut addrs: Vec<&str> = Vec::new();
    for a in [
        agent.cfg.metrics_addr.as_str(),
        agent.cfg.health_addr.as_str(),
    ] {
        let a = a.trim();
        if a.is_empty() || a == "0" || addrs.contains(&a) {
            continue;
        }
        addrs.push(a);
    }
    let mut bound = Vec::new();
    for a in addrs {
        let listener = match TcpListener::bind(a).and_then(|l| {
            l.set_nonblocking(true)?;
            Ok(l)
        }) {
            Ok(l) => l,
            Err(e) => {
                log::warn!("cannot serve metrics/health on {a}: {e}");
                continue;
            }
        };
        if let Ok(local) = listener.local_addr() {
            bound.push(local);
        }
        let me = agent.clone();
        let spawned = std::thread::Builder::new()
            .name("http".into())
            .spawn(move || HttpServer::new(me, listener).run());
        match spawned {
            Ok(_) => log::info!("serving /metrics, /liveness, /readiness on {a}"),
            Err(e) => log::warn!("cannot spawn http thread: {e}"),
        }
    }
    bound
}

/// A connection whose request head is still arriving.
struct Pending {
    stream: TcpStream,
    head: Vec<u8>,
    since: Instant,
}

/// The health and metrics listener: one thread polls the listener and every connection still
/// sending its request (non-blocking, each head bounded by [`HTTP_MAX_HEAD`] and
/// [`HTTP_REQUEST_DEADLINE`]), answers `/liveness` and every error itself, and hands
/// `/metrics` and `/readiness` to at most [`HTTP_MAX_RESPONDERS`] threads. A slow or hostile
/// client thus costs a bounded buffer for at most two seconds and never delays another.
struct HttpServer {
    agent: Arc<Agent>,
    listener: TcpListener,
    pending: Vec<Pending>,
    responders: Arc<AtomicUsize>,
}

impl HttpServer {
    fn new(agent: Arc<Agent>, listener: TcpListener) -> HttpServer {
        HttpServer {
            agent,
            listener,
            pending: Vec::new(),
            responders: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn run(mut self) {
        while !self.agent.stopping() {
            let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.pending.len() + 1);
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            for p in &self.pending {
                fds.push(libc::pollfd {
                    fd: p.stream.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let now = Instant::now();
            let wait = self
                .pending
                .iter()
                .map(|p| (p.since + HTTP_REQUEST_DEADLINE).saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_millis(500))
                .min(Duration::from_millis(500));
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd entries.
            let rc = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    wait.as_millis() as libc::c_int + 1,
                )
            };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    log::warn!("http: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            // Connections first (their indices match `fds[1..]`), then new ones.
            let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
            let mut keep = Vec::with_capacity(self.pending.len());
            for (p, r) in std::mem::take(&mut self.pending).into_iter().zip(ready) {
                if let Some(p) = self.progress(p, r) {
                    keep.push(p);
                }
            }
            self.pending = keep;
            if fds[0].revents != 0 {
                self.accept_all();
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if self.pending.len() >= HTTP_MAX_PENDING {
                        // The oldest is the likeliest to be stalling.
                        let old = self.pending.remove(0);
                        log::debug!(
                            "http: {HTTP_MAX_PENDING} connections pending, dropping the oldest"
                        );
                        answer_now(old.stream, 503, "too many connections\n");
                    }
                    self.pending.push(Pending {
                        stream,
                        head: Vec::new(),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::debug!("http: accept: {e}");
                    return;
                }
            }
        }
    }

    /// Reads what arrived on `p`; returns it when its head is still incomplete and in time.
    fn progress(&mut self, mut p: Pending, readable: bool) -> Option<Pending> {
        if readable {
            let mut buf = [0u8; 4096];
            loop {
                match (&p.stream).read(&mut buf) {
                    Ok(0) => return None,
                    Ok(n) => {
                        let from = p.head.len().saturating_sub(3);
                        p.head.extend_from_slice(&buf[..n]);
                        if let Some(end) = head_end(&p.head[from..]) {
                            p.head.truncate(from + end);
                            self.dispatch(p);
                            return None;
                        }
                        if p.head.len() > HTTP_MAX_HEAD {
                            answer_now(
                                p.stream,
                                431,
                                &format!("request head over {HTTP_MAX_HEAD} bytes\n"),
                            );
                            return None;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return None,
                }
            }
        }
        if p.since.elapsed() >= HTTP_REQUEST_DEADLINE {
            answer_now(
                p.stream,
                408,
                &format!(
                    "request not received within {} ms\n",
                    HTTP_REQUEST_DEADLINE.as_millis()
                ),
            );
            return None;
        }
        Some(p)
    }

    fn dispatch(&mut self, p: Pending) {
        let line = String::from_utf8_lossy(p.head.split(|b| *b == b'\n').next().unwrap_or(b""))
            .into_owned();
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("/").to_string();
        let head_only = method == "HEAD";
        if method != "GET" && !head_only {
            answer_now(p.stream, 405, "only GET is supported\n");
            return;
        }
        let bare = path.split('?').next().unwrap_or("");
        let slow = matches!(bare, "/metrics" | "/readiness" | "/readyz");
        if !slow {
            // Liveness, 404: no I/O, answered on this thread without waiting for anything.
            // The stream stays non-blocking: a short answer fits a fresh send buffer, and
            // this thread must never wait on a client.
            let (status, ctype, body) = self.agent.http_response(&path);
            let _ = write_response(&p.stream, status, ctype, &body, head_only, None);
            return;
        }
        if self.responders.fetch_add(1, Ordering::AcqRel) >= HTTP_MAX_RESPONDERS {
            self.responders.fetch_sub(1, Ordering::AcqRel);
            answer_now(p.stream, 503, "busy: too many scrapes at once\n");
            return;
        }
        let agent = self.agent.clone();
        let responders = self.responders.clone();
        let stream = p.stream;
        let spawned = std::thread::Builder::new()
            .name("http-reply".into())
            .spawn(move || {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(HTTP_WRITE_TIMEOUT));
                let (status, ctype, body) = agent.http_response(&path);
                // The whole response within one deadline: a client reading a few bytes per
                // write timeout would otherwise hold this responder for ever.
                let deadline = Instant::now() + HTTP_RESPONSE_DEADLINE;
                if let Err(e) =
                    write_response(&stream, status, ctype, &body, head_only, Some(deadline))
                {
                    log::debug!("http: {e}");
                }
                responders.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.responders.fetch_sub(1, Ordering::AcqRel);
            log::warn!("http: cannot spawn a responder: {e}");
        }
    }
}

/// End of the head in `buf`: the index just past the blank line (CRLF or bare LF).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2))
}

/// A short answer written without blocking (a fresh connection's send buffer has room for it).
fn answer_now(stream: TcpStream, status: u16, body: &str) {
    let _ = stream.set_nonblocking(true);
    let _ = write_response(&stream, status, "text/plain", body, false, None);
}

fn write_response(
    mut w: &TcpStream,
    status: u16,
    ctype: &str,
    body: &str,
    head_only: bool,
    deadline: Option<Instant>,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    let Some(deadline) = deadline else {
        w.write_all(&out)?;
        return w.flush();
    };
    let mut rest = &out[..];
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = w.shutdown(std::net::Shutdown::Both);
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took more than {HTTP_RESPONSE_DEADLINE:?} to read the response ({} of {} bytes left)",
                    rest.len(),
                    out.len()
                ),
            ));
        }
        w.set_write_timeout(Some(left.min(HTTP_WRITE_TIMEOUT)))?;
        match w.write(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            // A stall of one write timeout ends the response as before; only EINTR retries.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F15: a client that keeps reading, but slowly, cannot hold a responder past the response
    /// deadline (each write progresses, so the per-write timeout alone never fires).
    #[test]
    fn a_slow_reader_meets_the_whole_response_deadline() {
        crate::testutil::in_new_netns(|h, _| {
            let lo = h.link_by_name("lo").unwrap().unwrap();
            h.set_link_up(lo.index).unwrap();
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop2 = stop.clone();
            let reader = std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                let mut buf = vec![0u8; 16 << 10];
                let mut total = 0usize;
                // ~320 KiB/s: a 32 MiB body would take well over a minute.
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    total += n;
                    std::thread::sleep(Duration::from_millis(50));
                }
                total
            });
            let (s, _) = l.accept().unwrap();
            let body = "x".repeat(32 << 20);
            let t0 = Instant::now();
            let e = write_response(
                &s,
                200,
                "text/plain",
                &body,
                false,
                Some(Instant::now() + Duration::from_secs(1)),
            )
            .unwrap_err();
            let took = t0.elapsed();
            assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
            assert!(took < Duration::from_secs(4), "the write took {took:?}");
            drop(s);
            stop.store(true, Ordering::Relaxed);
            let got = reader.join().unwrap();
            assert!(got < body.len(), "the client got the whole body");
        });
    }
}
