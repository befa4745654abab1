//! Built-in traffic tools, so the lab needs no external programs: an echo server (TCP and UDP)
//! and a probe that sends a random token and expects it back. `ternctl lab serve` and
//! `ternctl lab probe` are thin wrappers, run inside a namespace with `ip netns exec`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{LabError, Result, process::random_hex};

/// Transport of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    /// `tcp` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A successful probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOk {
    pub proto: Proto,
    pub target: SocketAddr,
    /// Time from sending the token to receiving it back.
    pub rtt: Duration,
}

impl std::fmt::Display for ProbeOk {
    /// `ok tcp 10.244.0.1:7 rtt 0.2ms`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ok {} {} rtt {:.1}ms",
            self.proto.as_str(),
            self.target,
            self.rtt.as_secs_f64() * 1000.0
        )
    }
}

/// Serves echo on the given ports (all addresses) until the process is killed. Once every
/// socket is bound, creates `ready_file` (if given), so a starter knows it may probe.
pub fn serve(tcp: Option<u16>, udp: Option<u16>, ready_file: Option<&Path>) -> Result<()> {
    if tcp.is_none() && udp.is_none() {
        return Err(LabError::Invalid(
            "serve needs --tcp PORT and/or --udp PORT".into(),
        ));
    }
    // `[::]` takes IPv4 too (as mapped addresses, `bindv6only` 0, a namespace's default);
    // 0.0.0.0 where the kernel has no IPv6.
    let tcp_listener = tcp
        .map(|p| {
            TcpListener::bind(("::", p))
                .or_else(|_| TcpListener::bind(("0.0.0.0", p)))
                .map_err(|e| LabError::io(format!("cannot listen on tcp port {p}"), e))
        })
        .transpose()?;
    let udp_socket = udp
        .map(|p| {
            UdpSocket::bind(("::", p))
                .or_else(|_| UdpSocket::bind(("0.0.0.0", p)))
                .map_err(|e| LabError::io(format!("cannot bind udp port {p}"), e))
        })
        .transpose()?;
    if let Some(path) = ready_file {
        std::fs::write(path, std::process::id().to_string())
            .map_err(|e| LabError::io(format!("cannot write {}", path.display()), e))?;
    }
    let mut threads = Vec::new();
    if let Some(l) = tcp_listener {
        threads.push(std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                std::thread::spawn(move || echo_tcp(conn));
            }
        }));
    }
    if let Some(s) = udp_socket {
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], from);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn echo_tcp(mut conn: TcpStream) {
    let mut buf = [0u8; 16384];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

fn probe_err(proto: Proto, target: SocketAddr, message: impl Into<String>) -> LabError {
    LabError::Probe {
        proto: proto.as_str(),
        target: target.to_string(),
        message: message.into(),
    }
}

/// Connects to an echo server, sends a random token and checks that it comes back.
pub fn probe_tcp(target: SocketAddr, timeout: Duration) -> Result<ProbeOk> {
    let err = |m: String| probe_err(Proto::Tcp, target, m);
    let mut s = TcpStream::connect_timeout(&target, timeout).map_err(|e| err(e.to_string()))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|_| s.set_write_timeout(Some(timeout)))
        .and_then(|_| s.set_nodelay(true))
        .map_err(|e| err(e.to_string()))?;
    let token = format!("tern-{}\n", random_hex(8));
    let start = Instant::now();
    s.write_all(token.as_bytes())
        .map_err(|e| err(format!("send: {e}")))?;
    let mut back = vec![0u8; token.len()];
    s.read_exact(&mut back)
        .map_err(|e| err(format!("no echo: {e}")))?;
    let rtt = start.elapsed();
    if back != token.as_bytes() {
        return Err(err(format!(
            "echo mismatch: sent {:?}, got {:?}",
            token.trim_end(),
            String::from_utf8_lossy(&back).trim_end()
        )));
    }
    Ok(ProbeOk {
        proto: Proto::Tcp,
        target,
        rtt,
    })
}

/// Sends a random token by UDP and waits for it to be echoed, resending every 200 ms (the
/// first datagram may wait for neighbour resolution) until `timeout`.
pub fn probe_udp(target: SocketAddr, timeout: Duration) -> Result<ProbeOk> {
    let err = |m: String| probe_err(Proto::Udp, target, m);
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().unwrap_or(target)
    } else {
        "[::]:0".parse().unwrap_or(target)
    };
    let s = UdpSocket::bind(bind).map_err(|e| err(format!("bind: {e}")))?;
    s.connect(target)
        .map_err(|e| err(format!("connect: {e}")))?;
    let token = format!("tern-{}", random_hex(8));
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer");
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        let start = Instant::now();
        if let Err(e) = s.send(token.as_bytes()) {
            // ECONNREFUSED from an earlier ICMP port unreachable: report it if nothing works.
            last = format!("send: {e}");
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let wait = Duration::from_millis(200).min(deadline.saturating_duration_since(start));
        s.set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .map_err(|e| err(e.to_string()))?;
        // Stray replies to earlier tokens are skipped; only our current token counts.
        loop {
            match s.recv(&mut buf) {
                Ok(n) if &buf[..n] == token.as_bytes() => {
                    return Ok(ProbeOk {
                        proto: Proto::Udp,
                        target,
                        rtt: start.elapsed(),
                    });
                }
                Ok(_) => {
                    if start.elapsed() >= wait {
                        break;
                    }
                }
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut
                    {
                        last = format!("receive: {e}");
                    }
                    break;
                }
            }
        }
    }
    Err(err(format!("{last} within {} ms", timeout.as_millis())))
}

/// Runs a probe of either kind.
pub fn probe(proto: Proto, target: SocketAddr, timeout: Duration) -> Result<ProbeOk> {
    match proto {
        Proto::Tcp => probe_tcp(target, timeout),
        Proto::Udp => probe_udp(target, timeout),
    }
}

/// What an echo server outside the cluster saw of one probe: the answer and the source
/// address the probe arrived from (with natOutgoing: the node's, not the pod's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenProbe {
    pub ok: ProbeOk,
    /// The probe's source address as the server saw it.
    pub source: std::net::IpAddr,
}

/// An echo server for one probe that records where it came from: bound to `listen` (from the
/// thread creating it, so in that thread's namespace), it answers the first connection (TCP)
/// or datagram (UDP) within `timeout` and returns its source address.
pub struct Witness {
    proto: Proto,
    tcp: Option<TcpListener>,
    udp: Option<UdpSocket>,
    timeout: Duration,
}

impl Witness {
    /// Binds the server. Call it inside the namespace the server is to live in.
    pub fn bind(proto: Proto, listen: SocketAddr, timeout: Duration) -> Result<Witness> {
        let what = format!("cannot bind {} {listen}", proto.as_str());
        let (tcp, udp) = match proto {
            Proto::Tcp => (
                Some(TcpListener::bind(listen).map_err(|e| LabError::io(&what, e))?),
                None,
            ),
            Proto::Udp => (
                None,
                Some(UdpSocket::bind(listen).map_err(|e| LabError::io(&what, e))?),
            ),
        };
        Ok(Witness {
            proto,
            tcp,
            udp,
            timeout,
        })
    }

    /// Answers one probe (echoing what it sent) on a thread of its own; the thread's result is
    /// the probe's source address.
    pub fn answer_one(self) -> std::thread::JoinHandle<Result<std::net::IpAddr>> {
        std::thread::spawn(move || {
            let deadline = Instant::now() + self.timeout;
            let err = |m: String| LabError::Invalid(format!("outside server: {m}"));
            if let Some(l) = self.tcp {
                l.set_nonblocking(true).map_err(|e| err(e.to_string()))?;
                loop {
                    match l.accept() {
                        Ok((mut c, from)) => {
                            c.set_nonblocking(false).map_err(|e| err(e.to_string()))?;
                            c.set_read_timeout(Some(self.timeout))
                                .map_err(|e| err(e.to_string()))?;
                            let mut buf = [0u8; 256];
                            let n = c.read(&mut buf).map_err(|e| err(e.to_string()))?;
                            c.write_all(&buf[..n]).map_err(|e| err(e.to_string()))?;
                            return Ok(from.ip());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() > deadline {
                                return Err(err("no connection came".into()));
                            }
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => return Err(err(e.to_string())),
                    }
                }
            }
            let Some(u) = self.udp else {
                return Err(err(format!("no {} socket", self.proto.as_str())));
            };
            u.set_read_timeout(Some(self.timeout))
                .map_err(|e| err(e.to_string()))?;
            let mut buf = [0u8; 1500];
            let (n, first) = u
                .recv_from(&mut buf)
                .map_err(|e| err(format!("no datagram came: {e}")))?;
            u.send_to(&buf[..n], first)
                .map_err(|e| err(e.to_string()))?;
            // The probe resends until it hears back (an answer may be lost): answer those
            // too, until it goes quiet.
            u.set_read_timeout(Some(Duration::from_millis(300)))
                .map_err(|e| err(e.to_string()))?;
            while Instant::now() < deadline {
                let Ok((n, from)) = u.recv_from(&mut buf) else {
                    break;
                };
                let _ = u.send_to(&buf[..n], from);
            }
            Ok(first.ip())
        })
    }
}

/// Outcome of a continuous probe: how many probes were answered and the longest time without
/// an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinuousReport {
    pub proto: Proto,
    pub target: SocketAddr,
    /// Probes sent.
    pub sent: u64,
    /// Probes answered.
    pub received: u64,
    /// Longest interval with no answer: between two answers, or from the start to the first
    /// answer, or from the last answer to the end.
    pub longest_gap: Duration,
    /// How long the probe ran.
    pub elapsed: Duration,
}

impl std::fmt::Display for ContinuousReport {
    /// `continuous udp 10.244.0.5:7 sent 500 received 498 lost 2 longest gap 21.3ms over 5.00s`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "continuous {} {} sent {} received {} lost {} longest gap {:.1}ms over {:.2}s",
            self.proto.as_str(),
            self.target,
            self.sent,
            self.received,
            self.sent.saturating_sub(self.received),
            self.longest_gap.as_secs_f64() * 1000.0,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Tracks the longest stretch without an answer.
struct Gaps {
    start: Instant,
    last: Instant,
    longest: Duration,
    received: u64,
}

impl Gaps {
    fn new() -> Gaps {
        let now = Instant::now();
        Gaps {
            start: now,
            last: now,
            longest: Duration::ZERO,
            received: 0,
        }
    }
    fn answer(&mut self, at: Instant) {
        self.longest = self.longest.max(at.saturating_duration_since(self.last));
        self.last = at;
        self.received += 1;
    }
    fn finish(mut self, proto: Proto, target: SocketAddr, sent: u64) -> ContinuousReport {
        let end = Instant::now();
        self.longest = self.longest.max(end.saturating_duration_since(self.last));
        ContinuousReport {
            proto,
            target,
            sent,
            received: self.received,
            longest_gap: self.longest,
            elapsed: end - self.start,
        }
    }
}

/// Probes `target` every `interval` for `duration` and reports the longest gap between
/// answers. UDP sends numbered datagrams and counts the echoes as they arrive (a late echo
/// still counts); TCP keeps one connection, sends a token per tick and waits up to `interval`
/// for it, reconnecting after any error — an established connection that survives is exactly
/// what running pods need from the network.
pub fn probe_continuous(
    proto: Proto,
    target: SocketAddr,
    interval: Duration,
    duration: Duration,
) -> Result<ContinuousReport> {
    let interval = interval.max(Duration::from_millis(1));
    match proto {
        Proto::Udp => continuous_udp(target, interval, duration),
        Proto::Tcp => Ok(continuous_tcp(target, interval, duration)),
    }
}

fn continuous_udp(
    target: SocketAddr,
    interval: Duration,
    duration: Duration,
) -> Result<ContinuousReport> {
    let err = |m: String| probe_err(Proto::Udp, target, m);
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(bind).map_err(|e| err(format!("bind: {e}")))?;
    s.connect(target)
        .map_err(|e| err(format!("connect: {e}")))?;
    let prefix = format!("tern-c-{}-", random_hex(4));
    let mut gaps = Gaps::new();
    let end = gaps.start + duration;
    let mut sent = 0u64;
    let mut next_seq_expected = 0u64;
    let mut buf = [0u8; 1500];
    let mut next_send = gaps.start;
    while Instant::now() < end {
        if Instant::now() >= next_send {
            // Errors (ECONNREFUSED from an ICMP error, no route) count as lost probes.
            let _ = s.send(format!("{prefix}{sent}").as_bytes());
            sent += 1;
            next_send += interval;
        }
        let wait = next_send
            .min(end)
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(200));
        s.set_read_timeout(Some(wait))
            .map_err(|e| err(e.to_string()))?;
        if let Ok(n) = s.recv(&mut buf) {
            let at = Instant::now();
            let seq = std::str::from_utf8(&buf[..n])
                .ok()
                .and_then(|t| t.strip_prefix(&prefix))
                .and_then(|t| t.parse::<u64>().ok());
            // Only new answers of ours; duplicates or stray datagrams are not progress.
            if let Some(seq) = seq
                && seq >= next_seq_expected
            {
                next_seq_expected = seq + 1;
                gaps.answer(at);
            }
        }
    }
    Ok(gaps.finish(Proto::Udp, target, sent))
}

fn continuous_tcp(target: SocketAddr, interval: Duration, duration: Duration) -> ContinuousReport {
    let mut gaps = Gaps::new();
    let end = gaps.start + duration;
    let mut sent = 0u64;
    let mut conn: Option<TcpStream> = None;
    let mut next_send = gaps.start;
    while Instant::now() < end {
        let now = Instant::now();
        if now < next_send {
            std::thread::sleep(next_send - now);
            continue;
        }
        next_send += interval;
        sent += 1;
        let timeout = interval.max(Duration::from_millis(50));
        if conn.is_none() {
            conn = TcpStream::connect_timeout(&target, timeout)
                .and_then(|c| {
                    c.set_nodelay(true)?;
                    c.set_read_timeout(Some(timeout))?;
                    Ok(c)
                })
                .ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        let token = format!("{}\n", random_hex(6));
        let mut back = vec![0u8; token.len()];
        let ok = c.write_all(token.as_bytes()).is_ok()
            && c.read_exact(&mut back).is_ok()
            && back == token.as_bytes();
        if ok {
            gaps.answer(Instant::now());
        } else {
            // A half-read echo would desynchronise the stream: start over.
            conn = None;
        }
    }
    gaps.finish(Proto::Tcp, target, sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finds a free port on loopback for both protocols (bind to 0, read back, release).
    fn free_port() -> u16 {
        loop {
            let t = TcpListener::bind("127.0.0.1:0").unwrap();
            let p = t.local_addr().unwrap().port();
            if UdpSocket::bind(("127.0.0.1", p)).is_ok() {
                return p;
            }
        }
    }

    /// An echo server on a free loopback port (TCP and UDP), once it is ready: the port and
    /// its address.
    fn echo_server() -> (u16, SocketAddr) {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let port = free_port();
        let r = ready.clone();
        std::thread::spawn(move || serve(Some(port), Some(port), Some(&r)));
        let t0 = Instant::now();
        while !ready.exists() {
            assert!(t0.elapsed() < Duration::from_secs(5), "server not ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        (port, format!("127.0.0.1:{port}").parse().unwrap())
    }

    #[test]
    fn echo_server_answers_probes() {
        let (port, target) = echo_server();
        let ok = probe_tcp(target, Duration::from_secs(2)).unwrap();
        let line = ok.to_string();
        assert!(
            line.starts_with(&format!("ok tcp 127.0.0.1:{port} rtt ")),
            "{line}"
        );
        assert!(line.ends_with("ms"), "{line}");
        let ok = probe_udp(target, Duration::from_secs(2)).unwrap();
        assert!(ok.to_string().starts_with("ok udp 127.0.0.1:"));
    }

    #[test]
    fn probe_without_server_fails_with_target() {
        let port = free_port();
        let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let e = probe_tcp(target, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("probe tcp 127.0.0.1:{port}")), "{e}");
        let e = probe_udp(target, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("probe udp"), "{e}");
    }

    #[test]
    fn continuous_probe_counts_answers_and_gaps() {
        let (port, target) = echo_server();
        for proto in [Proto::Udp, Proto::Tcp] {
            let r = probe_continuous(
                proto,
                target,
                Duration::from_millis(10),
                Duration::from_millis(500),
            )
            .unwrap();
            // No timing is asserted (a loaded machine stalls the prober for a second and
            // more): at most one probe per interval, every probe but the last two answered,
            // and a gap shorter than the run, which a silent target's is not (below).
            assert!(
                r.sent >= 2 && r.sent as u128 <= r.elapsed.as_millis() / 10 + 1,
                "{r}"
            );
            assert!(r.received + 2 >= r.sent, "{r}");
            assert!(r.longest_gap < r.elapsed, "{r}");
            assert!(r.to_string().starts_with(&format!(
                "continuous {} 127.0.0.1:{port} sent ",
                proto.as_str()
            )));
        }
        // Nobody answers: the gap is the whole run.
        let silent: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let r = probe_continuous(
            Proto::Udp,
            silent,
            Duration::from_millis(10),
            Duration::from_millis(300),
        )
        .unwrap();
        assert_eq!(r.received, 0);
        assert!(r.longest_gap >= Duration::from_millis(290), "{r}");
    }

    #[test]
    fn rtt_formatting() {
        let ok = ProbeOk {
            proto: Proto::Tcp,
            target: "10.244.0.5:7".parse().unwrap(),
            rtt: Duration::from_micros(230),
        };
        assert_eq!(ok.to_string(), "ok tcp 10.244.0.5:7 rtt 0.2ms");
    }
}
