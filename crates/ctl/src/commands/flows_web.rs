//! `ternctl flows --web ADDR`: the flow records as a page in a browser — a live table with the
//! filters of `ternctl flows`, and a graph of workloads whose edges are coloured by verdict;
//! clicking an edge lists its flows with the policy and rule that decided each.
//!
//! Access: records are sensitive, so the page is no wider than ternctl itself. The server binds
//! only a loopback address (it refuses any other), and every request must carry the random
//! token printed when it starts (`http://127.0.0.1:8089/?token=...`), so another local user who
//! can reach the port but not the agents' sockets reads nothing. The browser is the operator's,
//! on the node or through `ssh -L`.
//!
//! How: a collector thread asks the source (the same
//! [`Follower`](crate::commands::flows::Follower) as `ternctl flows --follow`, every node) for
//! records after the last ones it saw, once a second, and keeps the newest [`MAX_KEPT`] in a
//! buffer with its own sequence; the page polls `/api/flows?after=N`. The HTTP side is ours, on
//! std: two GET routes on loopback, one request per connection, bounded request size and time
//! ([`MAX_REQUEST`], [`REQUEST_TIMEOUT`]) and at most [`MAX_CONNECTIONS`] at once. A library
//! server (hyper, axum) would bring an async runtime into ternctl, which has none, for that.
//! The page itself is one file, `flows_web.html`, compiled in.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use tern_api::flow::FlowRecord;

/// The page.
const PAGE: &str = include_str!("flows_web.html");
/// Records the server keeps for the page (the newest).
pub const MAX_KEPT: usize = 5_000;
/// Largest request (line and headers) read.
pub const MAX_REQUEST: usize = 8 * 1024;
/// A request must arrive within this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 32;
/// Records per answer to the page.
const MAX_PER_ANSWER: usize = 1_000;

/// Where records come from: one round of a [`Follower`](crate::commands::flows::Follower)
/// over every node (`ternctl flows`'s agents), giving what is new since the last round.
pub type Source = Box<dyn FnMut() -> crate::commands::flows::Polled + Send>;

/// One record as the page gets it: the record and the server's sequence number for it.
#[derive(Serialize)]
struct Numbered<'a> {
    n: u64,
    #[serde(flatten)]
    record: &'a FlowRecord,
}

/// What `/api/flows` answers.
#[derive(Serialize)]
struct Answer<'a> {
    /// The last sequence number given (the page's next `after`).
    last: u64,
    records: Vec<Numbered<'a>>,
    /// Records the nodes did not keep (sampling, kernel losses), summed.
    dropped: u64,
    /// Nodes the last collection could not reach, with the error.
    errors: Vec<String>,
}

#[derive(Default)]
struct Buffer {
    records: VecDeque<(u64, FlowRecord)>,
    last: u64,
    dropped: u64,
    errors: Vec<String>,
}

impl Buffer {
    fn push(&mut self, r: FlowRecord) {
        self.last += 1;
        if self.records.len() == MAX_KEPT {
            self.records.pop_front();
        }
        self.records.push_back((self.last, r));
    }
}

/// Binds `addr`, which must be a loopback address (`127.0.0.1:8089`, `[::1]:8089`,
/// `localhost:8089`).
pub fn bind(addr: &str) -> anyhow::Result<TcpListener> {
    let parsed: SocketAddr = if let Some(port) = addr.strip_prefix("localhost:") {
        let port: u16 = port
            .parse()
            .with_context(|| format!("--web {addr:?}: bad port {port:?}"))?;
        SocketAddr::from(([127, 0, 0, 1], port))
    } else {
        addr.parse().with_context(|| {
            format!("--web {addr:?}: expected a loopback address and port, like 127.0.0.1:8089")
        })?
    };
    anyhow::ensure!(
        parsed.ip().is_loopback(),
        "--web {addr}: the page serves flow records, which are sensitive; it binds only a \
         loopback address (127.0.0.1 or ::1; reach it from elsewhere with ssh -L)"
    );
    TcpListener::bind(parsed).with_context(|| format!("--web: binding {parsed}"))
}

/// A random token of 32 hex digits from the kernel's generator.
pub fn new_token() -> anyhow::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom for the page's token")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Serves the page on `listener` until `stop` is set, collecting from `source` every
/// `interval`. Returns when stopped (the collector and the connections end on their own).
pub fn serve(
    listener: TcpListener,
    token: String,
    mut source: Source,
    interval: Duration,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let buf = Arc::new(Mutex::new(Buffer::default()));
    let collector = {
        let buf = Arc::clone(&buf);
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("flows-web-collect".into())
            .spawn(move || collect(&mut source, &buf, interval, &stop))
            .context("starting the collector")?
    };
    listener
        .set_nonblocking(true)
        .context("listening without blocking")?;
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    drop(conn);
                    continue;
                }
                open.fetch_add(1, Ordering::Relaxed);
                let (buf, token, mine) = (Arc::clone(&buf), token.clone(), Arc::clone(&open));
                let spawned = std::thread::Builder::new()
                    .name("flows-web-conn".into())
                    .spawn(move || {
                        let _ = handle(conn, &token, &buf);
                        mine.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).context("accepting a connection"),
        }
    }
    let _ = collector.join();
    Ok(())
}

/// The collector: asks every node for what is new since its cursor.
fn collect(source: &mut Source, buf: &Mutex<Buffer>, interval: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let polled = source();
        {
            let mut b = buf.lock().unwrap_or_else(|p| p.into_inner());
            for r in polled.records {
                b.push(r);
            }
            b.dropped = polled.dropped;
            b.errors = polled.errors;
        }
        let mut slept = Duration::ZERO;
        while slept < interval && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            slept += Duration::from_millis(50);
        }
    }
}

/// One request: GET `/` (the page) or GET `/api/flows?after=N`, each with `token=`.
fn handle(conn: TcpStream, token: &str, buf: &Mutex<Buffer>) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    conn.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut reader = BufReader::new((&conn).take(MAX_REQUEST as u64));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Headers are read and ignored (bounded by the take above).
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut w = &conn;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut w, 405, "text/plain", b"only GET\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    if !param("token").is_some_and(|t| same(t.as_bytes(), token.as_bytes())) {
        return respond(
            &mut w,
            403,
            "text/plain",
            b"a token is needed: use the address ternctl printed\n",
        );
    }
    match path {
        "/" => respond(&mut w, 200, "text/html; charset=utf-8", PAGE.as_bytes()),
        "/api/flows" => {
            let after: u64 = param("after").and_then(|a| a.parse().ok()).unwrap_or(0);
            let body = {
                let b = buf.lock().unwrap_or_else(|p| p.into_inner());
                let records: Vec<Numbered> = b
                    .records
                    .iter()
                    .filter(|(n, _)| *n > after)
                    .take(MAX_PER_ANSWER)
                    .map(|(n, record)| Numbered { n: *n, record })
                    .collect();
                let last = records.last().map_or(b.last.max(after), |r| r.n);
                serde_json::to_vec(&Answer {
                    last,
                    records,
                    dropped: b.dropped,
                    errors: b.errors.clone(),
                })
                .map_err(std::io::Error::other)?
            };
            respond(&mut w, 200, "application/json", &body)
        }
        _ => respond(&mut w, 404, "text/plain", b"not found\n"),
    }
}

/// Compares two byte strings in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn respond(w: &mut impl Write, status: u16, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Method Not Allowed",
    };
    write!(
        w,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n\
         Content-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; \
         style-src 'unsafe-inline'\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    w.write_all(body)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_loopback_only() {
        let err = bind("0.0.0.0:0").unwrap_err().to_string();
        assert!(err.contains("loopback"), "{err}");
        let err = bind("198.18.0.1:80").unwrap_err().to_string();
        assert!(err.contains("loopback"), "{err}");
        assert!(bind("nonsense").unwrap_err().to_string().contains("--web"));
    }

    #[test]
    fn buffer_keeps_the_newest() {
        let mut b = Buffer::default();
        let r = FlowRecord::sample();
        for _ in 0..MAX_KEPT + 10 {
            b.push(r.clone());
        }
        assert_eq!(b.records.len(), MAX_KEPT);
        assert_eq!(b.records.front().unwrap().0, 11);
        assert_eq!(b.last, (MAX_KEPT + 10) as u64);
    }

    #[test]
    fn token_compare() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
