//! What the kernel does to one new connection: `ternctl explain --probe` makes a real
//! connection from the calling thread's network namespace (a lab pod's, entered with
//! [`crate::netns::in_netns`]) and reads the kernel's verdict from how it ends.
//!
//! tern's policy drops (never rejects), so a denied connection is one that gets no answer
//! within the timeout. Anything that comes back from the destination means the packet passed
//! every policy on the way:
//!
//! | transport | allowed | denied |
//! | --- | --- | --- |
//! | TCP | connected, or refused (a RST: nobody listens, the SYN arrived) | no answer |
//! | UDP | a datagram back, or refused (ICMP port unreachable) | no answer (also what a server that never replies looks like: probe a port that echoes, as the lab's servers do) |
//! | SCTP | associated, or refused (ABORT) | no answer |
//! | ICMP | an echo reply | no answer |
//!
//! Any other error (no route, no such address family, no permission for a raw socket) is no
//! verdict of the policy's and is reported as such ([`Seen::Failed`]).

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use tern_model::Protocol;

use crate::process::random_hex;

/// The kernel's answer to one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The destination answered: every policy on the path let the packet through.
    Allowed(String),
    /// No answer within the timeout: dropped on the way.
    Denied(String),
    /// The probe could not be made or ended in an error that is no policy verdict.
    Failed(String),
}

impl Seen {
    /// `allowed`, `denied` or `failed`.
    pub fn verdict(&self) -> &'static str {
        match self {
            Seen::Allowed(_) => "allowed",
            Seen::Denied(_) => "denied",
            Seen::Failed(_) => "failed",
        }
    }

    /// What happened, in a phrase (`connected in 0.3 ms`).
    pub fn detail(&self) -> &str {
        match self {
            Seen::Allowed(d) | Seen::Denied(d) | Seen::Failed(d) => d,
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Probes `target` over `protocol` (the port is ignored for ICMP) from the calling thread's
/// network namespace, waiting at most `timeout` for an answer.
pub fn probe(protocol: Protocol, target: SocketAddr, timeout: Duration) -> Seen {
    let timeout = timeout.max(Duration::from_millis(10));
    match protocol {
        Protocol::Tcp => stream(TcpStream::connect_timeout(&target, timeout), timeout, "TCP"),
        Protocol::Sctp => stream(
            crate::netpol::sctp_connect(target, timeout),
            timeout,
            "SCTP",
        ),
        Protocol::Udp => udp(target, timeout),
        Protocol::Icmp | Protocol::IcmpV6 => icmp_echo(target.ip(), timeout),
        other => Seen::Failed(format!("cannot probe protocol {other:?}")),
    }
}

/// A connect's outcome: connected or refused is an answer.
fn stream(r: std::io::Result<TcpStream>, timeout: Duration, what: &str) -> Seen {
    let start = Instant::now();
    match r {
        Ok(_) => Seen::Allowed(format!("{what} connected")),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Seen::Allowed(format!(
            "{what} refused: the destination answered, nobody listens"
        )),
        Err(e) if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock => {
            Seen::Denied(format!(
                "{what}: no answer within {}",
                ms(timeout.max(start.elapsed()))
            ))
        }
        Err(e) => Seen::Failed(format!("{what} connect: {e}")),
    }
}

/// A random token by UDP, resent every 200 ms until it comes back or `timeout` passes.
fn udp(target: SocketAddr, timeout: Duration) -> Seen {
    let bind: SocketAddr = if target.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = match UdpSocket::bind(bind).and_then(|s| s.connect(target).map(|()| s)) {
        Ok(s) => s,
        Err(e) => return Seen::Failed(format!("UDP socket: {e}")),
    };
    let token = format!("tern-explain-{}", random_hex(6));
    let start = Instant::now();
    let mut buf = [0u8; 1500];
    while start.elapsed() < timeout {
        match s.send(token.as_bytes()) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Seen::Allowed("UDP refused (port unreachable): nobody listens".into());
            }
            Err(e) => return Seen::Failed(format!("UDP send: {e}")),
            Ok(_) => {}
        }
        let wait = Duration::from_millis(200).min(timeout.saturating_sub(start.elapsed()));
        if let Err(e) = s.set_read_timeout(Some(wait.max(Duration::from_millis(1)))) {
            return Seen::Failed(format!("UDP socket: {e}"));
        }
        match s.recv(&mut buf) {
            Ok(n) if &buf[..n] == token.as_bytes() => {
                return Seen::Allowed(format!("UDP answered in {}", ms(start.elapsed())));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Seen::Allowed("UDP refused (port unreachable): nobody listens".into());
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Seen::Failed(format!("UDP receive: {e}")),
        }
    }
    Seen::Denied(format!("UDP: no answer within {}", ms(timeout)))
}

/// ICMP (v4) and ICMPv6 echo request and reply types.
const ECHO_REQUEST: (u8, u8) = (8, 128);
const ECHO_REPLY: (u8, u8) = (0, 129);

/// The internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An echo request with `id` and `seq` and `payload`; the checksum is filled for ICMP (v4),
/// the kernel fills ICMPv6's (it covers a pseudo-header only the kernel knows).
fn echo_request(v6: bool, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let kind = if v6 { ECHO_REQUEST.1 } else { ECHO_REQUEST.0 };
    let mut m = vec![kind, 0, 0, 0];
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&seq.to_be_bytes());
    m.extend_from_slice(payload);
    if !v6 {
        let c = checksum(&m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
    }
    m
}

/// Whether `packet` (as a raw socket returns it: with the IPv4 header for ICMP, without one
/// for ICMPv6) is the echo reply to `id`/`seq`.
fn is_reply(v6: bool, packet: &[u8], id: u16, seq: u16) -> bool {
    let icmp = if v6 {
        packet
    } else {
        let header = usize::from(packet.first().map_or(0, |b| b & 0x0f)) * 4;
        packet.get(header..).unwrap_or(&[])
    };
    let kind = if v6 { ECHO_REPLY.1 } else { ECHO_REPLY.0 };
    icmp.len() >= 8
        && icmp[0] == kind
        && icmp[4..6] == id.to_be_bytes()
        && icmp[6..8] == seq.to_be_bytes()
}

/// One echo request to `dst` on a raw socket (needs CAP_NET_RAW), resent every 200 ms until
/// its reply comes or `timeout` passes.
fn icmp_echo(dst: IpAddr, timeout: Duration) -> Seen {
    let v6 = dst.is_ipv6();
    let (family, proto) = if v6 {
        (libc::AF_INET6, libc::IPPROTO_ICMPV6)
    } else {
        (libc::AF_INET, libc::IPPROTO_ICMP)
    };
    // SAFETY: plain socket(2); the descriptor is checked and then owned by the UdpSocket.
    let fd = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
    if fd < 0 {
        return Seen::Failed(format!(
            "ICMP raw socket (needs CAP_NET_RAW): {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd is a socket we just created and own; std's datagram calls (sendto, recv)
    // work on a raw socket, the port of its addresses being unused.
    let s = unsafe { UdpSocket::from_raw_fd(fd) };
    let id = u16::from_str_radix(&random_hex(2), 16).unwrap_or(0x7e57);
    let start = Instant::now();
    let mut buf = [0u8; 1500];
    let mut seq: u16 = 0;
    while start.elapsed() < timeout {
        seq = seq.wrapping_add(1);
        let m = echo_request(v6, id, seq, b"tern-explain");
        if let Err(e) = s.send_to(&m, SocketAddr::new(dst, 0)) {
            return Seen::Failed(format!("ICMP echo to {dst}: {e}"));
        }
        let sent = Instant::now();
        let wait = Duration::from_millis(200).min(timeout.saturating_sub(start.elapsed()));
        while sent.elapsed() < wait {
            let left = wait
                .saturating_sub(sent.elapsed())
                .max(Duration::from_millis(1));
            if let Err(e) = s.set_read_timeout(Some(left)) {
                return Seen::Failed(format!("ICMP socket: {e}"));
            }
            match s.recv_from(&mut buf) {
                Ok((n, from)) if from.ip() == dst && is_reply(v6, &buf[..n], id, seq) => {
                    return Seen::Allowed(format!("echo reply in {}", ms(sent.elapsed())));
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    break;
                }
                Err(e) => return Seen::Failed(format!("ICMP receive: {e}")),
            }
        }
    }
    Seen::Denied(format!("ICMP: no echo reply within {}", ms(timeout)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A TCP listener's port (connected: allowed) and a closed port (refused: allowed too;
    /// the destination answered).
    #[test]
    fn tcp_connected_and_refused_are_answers() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        std::thread::spawn(move || for _ in l.incoming() {});
        let seen = probe(Protocol::Tcp, open, Duration::from_secs(2));
        assert_eq!(seen, Seen::Allowed("TCP connected".into()));
        let closed = {
            let t = TcpListener::bind("127.0.0.1:0").unwrap();
            t.local_addr().unwrap()
        };
        let seen = probe(Protocol::Tcp, closed, Duration::from_secs(2));
        assert_eq!(seen.verdict(), "allowed", "{seen:?}");
        assert!(seen.detail().contains("refused"), "{seen:?}");
    }

    /// A UDP echo is an answer; a port nobody binds answers with port unreachable.
    #[test]
    fn udp_echo_and_port_unreachable_are_answers() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = s.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut b = [0u8; 256];
            while let Ok((n, from)) = s.recv_from(&mut b) {
                let _ = s.send_to(&b[..n], from);
            }
        });
        let seen = probe(Protocol::Udp, at, Duration::from_secs(2));
        assert_eq!(seen.verdict(), "allowed", "{seen:?}");
        assert!(seen.detail().starts_with("UDP answered"), "{seen:?}");
        let closed = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let seen = probe(Protocol::Udp, closed, Duration::from_secs(2));
        assert_eq!(seen.verdict(), "allowed", "{seen:?}");
        assert!(seen.detail().contains("refused"), "{seen:?}");
    }

    /// A UDP socket that reads and never answers looks like a drop: denied after the timeout.
    #[test]
    fn udp_silence_is_denied_after_the_timeout() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = s.local_addr().unwrap();
        let t = Instant::now();
        let seen = probe(Protocol::Udp, at, Duration::from_millis(300));
        assert_eq!(seen.verdict(), "denied", "{seen:?}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        drop(s);
    }

    /// The checksum of an echo request verifies to zero, and a reply is matched by type, id
    /// and sequence behind the IPv4 header (and without one for ICMPv6).
    #[test]
    fn echo_messages_are_built_and_matched() {
        let m = echo_request(false, 0x1234, 7, b"abc");
        assert_eq!(&m[..2], &[8, 0]);
        assert_eq!(checksum(&m), 0);
        let mut reply = vec![0x45u8; 1];
        reply.extend_from_slice(&[0; 19]);
        let mut icmp = m.clone();
        icmp[0] = 0;
        reply.extend_from_slice(&icmp);
        assert!(is_reply(false, &reply, 0x1234, 7));
        assert!(!is_reply(false, &reply, 0x1234, 8));
        assert!(!is_reply(false, &reply, 0x1235, 7));
        // The request itself (looped back on a raw socket) is no reply.
        let mut own = reply.clone();
        own[20] = 8;
        assert!(!is_reply(false, &own, 0x1234, 7));
        let m6 = echo_request(true, 1, 2, b"");
        assert_eq!(m6[0], 128);
        let mut r6 = m6.clone();
        r6[0] = 129;
        assert!(is_reply(true, &r6, 1, 2));
    }

    /// Root only (a raw socket): loopback answers an echo request.
    #[test]
    fn icmp_echo_on_loopback() {
        tern_testkit::need_root();
        let seen = probe(
            Protocol::Icmp,
            "127.0.0.1:0".parse().unwrap(),
            Duration::from_secs(2),
        );
        assert_eq!(seen.verdict(), "allowed", "{seen:?}");
    }
}
