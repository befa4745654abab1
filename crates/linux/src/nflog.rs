//! NFLOG: the packets nftables' `log group N` statements hand to userspace
//! (`nfnetlink_log`), read on a NETLINK_NETFILTER socket through the one framing core.
//!
//! tern logs each connection's first packet with a short tag as the prefix (flow records), so
//! the reader wants the prefix, the interfaces and the headers, never the data: the socket
//! binds the group, asks for packet copies of [`NflogConfig::copy_range`] bytes (the rule's
//! `snaplen` bounds them too), sequence numbers (`NFULNL_CFG_F_SEQ`: a gap in `NFULA_SEQ` is
//! events the kernel could not deliver, counted as lost), and batching (a queue threshold and
//! a flush timeout), with a bounded receive buffer. When the buffer overflows the kernel drops
//! messages and the next `recv` fails with ENOBUFS: counted as an overrun, never fatal.
//!
//! After an overflow the kernel marks the socket congested and drops *every* new message, room
//! or not, until the reader has read its queue empty (netlink's `NETLINK_S_CONGESTED`, cleared
//! in `netlink_rcv_wake`); then delivery resumes and the first event delivered carries the
//! gap. A reader slower than a steady flood therefore hears nothing new until it has read the
//! whole buffer (the 4 MiB default holds about 60,000 events: seconds at ~30 us a record),
//! and drops after the last event delivered are counted only when a next one arrives
//! (`tests/nflog.rs` shows both). `NETLINK_NO_ENOBUFS` would avoid the congested state
//! (delivery as soon as there is room, losses only as gaps) but is not set: ENOBUFS is what
//! tells an overrun now.
//!
//! Binding is per group, not per family: the kernel's `NFULNL_CFG_CMD_PF_BIND` has been a
//! no-op since Linux 3.17 (nfnetlink_log serves every family once loaded), so one
//! `NFULNL_CFG_CMD_BIND` serves IPv4 and IPv6 alike; a group another socket holds answers
//! EBUSY, which [`NflogSocket::open`] reports naming the group.
//!
//! Every length is checked ([`parse_datagram`](crate::netlink::framing::parse_datagram),
//! the attribute iterator, and [`parse_packet`] on the copied headers); a malformed message is
//! counted and skipped.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{LinuxError, Result};
use crate::netlink::framing::{
    Conn, MsgBuilder, NLM_F_ACK, attrs, open_bound, parse_datagram, read_str, recv_retrying,
    set_int_option, set_recv_timeout,
};

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFNETLINK_V0: u8 = 0;

const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_NLBUFSIZ: u16 = 3;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULA_CFG_QTHRESH: u16 = 5;
const NFULA_CFG_FLAGS: u16 = 6;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_CFG_CMD_UNBIND: u8 = 2;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULNL_CFG_F_SEQ: u16 = 0x0001;

const NFULA_PACKET_HDR: u16 = 1;
const NFULA_MARK: u16 = 2;
const NFULA_TIMESTAMP: u16 = 3;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_SEQ: u16 = 12;

/// The longest prefix read (the kernel's `NF_LOG_PREFIXLEN` is 128 with its NUL).
pub const MAX_PREFIX: usize = 128;
/// The most payload bytes kept of one packet (headers only).
pub const MAX_PAYLOAD: usize = 256;
/// How many IPv6 extension headers are walked before the transport header is given up.
const MAX_V6_EXT: usize = 4;
/// The receive buffer of one datagram: the kernel's largest batch (`nlbufsiz` is capped at
/// 128 KiB) fits.
const RECV_BUF: usize = 128 * 1024;

/// How the group is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NflogConfig {
    /// The NFLOG group (`log group N`).
    pub group: u16,
    /// Bytes of each packet copied to userspace (network and transport headers).
    pub copy_range: u32,
    /// Messages the kernel batches into one datagram before sending.
    pub qthreshold: u32,
    /// How long the kernel holds an incomplete batch.
    pub flush: Duration,
    /// The kernel's batch buffer (`NFULA_CFG_NLBUFSIZ`), at most 128 KiB.
    pub nlbufsiz: u32,
    /// The socket's receive buffer (`SO_RCVBUF`): what a slow reader may fall behind by
    /// before the kernel drops (and [`NflogBatch::lost`] counts).
    pub rcvbuf: usize,
}

impl NflogConfig {
    /// Headers-only copies, batches of up to 32 events flushed every 50 ms, a 4 MiB receive
    /// buffer (about 60,000 events: 61,664 in `tests/nflog.rs`).
    pub fn new(group: u16) -> NflogConfig {
        NflogConfig {
            group,
            copy_range: 96,
            qthreshold: 32,
            flush: Duration::from_millis(50),
            nlbufsiz: 64 * 1024,
            rcvbuf: 4 << 20,
        }
    }
}

/// The network and transport headers of a logged packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeaders {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The transport protocol number (after IPv6 extension headers).
    pub proto: u8,
    /// TCP, UDP, UDP-Lite and SCTP ports (`None` for other protocols, a non-first
    /// fragment, or headers cut short).
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    /// ICMP and ICMPv6 type and code.
    pub icmp: Option<(u8, u8)>,
}

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NflogEvent {
    /// `NFPROTO_IPV4` (2) or `NFPROTO_IPV6` (10), from the message header.
    pub family: u8,
    /// The rule's prefix.
    pub prefix: String,
    pub indev: Option<u32>,
    pub outdev: Option<u32>,
    pub mark: Option<u32>,
    /// The group's sequence number (`NFULNL_CFG_F_SEQ`).
    pub seq: Option<u32>,
    /// The packet's kernel timestamp when it had one, else when the batch was received.
    pub time: SystemTime,
    /// `None` when the copy was missing or not a well-formed IP header.
    pub packet: Option<PacketHeaders>,
}

/// What one [`NflogSocket::recv`] got.
#[derive(Debug, Default)]
pub struct NflogBatch {
    pub events: Vec<NflogEvent>,
    /// Events the kernel dropped: the gaps in the sequence numbers (a loss shows with the
    /// next event delivered).
    pub lost: u64,
    /// Times the socket's buffer overflowed (ENOBUFS): events were lost, how many the next
    /// sequence number tells.
    pub overruns: u64,
    /// Messages that did not parse (skipped).
    pub malformed: u64,
}

/// A socket bound to one NFLOG group in the namespace it was opened in.
pub struct NflogSocket {
    fd: OwnedFd,
    group: u16,
    buf: Vec<u8>,
    /// The sequence number expected next.
    next_seq: Option<u32>,
    /// The receive timeout set on the socket now (set again only when a call asks another).
    timeout: Option<Duration>,
}

fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, NFNETLINK_V0, r[0], r[1]]
}

fn config_msg(group: u16) -> MsgBuilder {
    let mut m = MsgBuilder::new((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG, NLM_F_ACK);
    m.raw(&nfgenmsg(libc::AF_UNSPEC as u8, group));
    m
}

impl NflogSocket {
    /// Opens a socket in the calling thread's network namespace and binds `cfg.group`.
    pub fn open(cfg: &NflogConfig) -> Result<NflogSocket> {
        let g = cfg.group;
        if cfg.nlbufsiz > 128 * 1024 {
            return Err(LinuxError::InvalidArgument(format!(
                "NFLOG nlbufsiz {} is above the kernel's 131072",
                cfg.nlbufsiz
            )));
        }
        let fd = open_bound(NETLINK_NETFILTER, "NFLOG")?;
        let rcvbuf = libc::c_int::try_from(cfg.rcvbuf).map_err(|_| {
            LinuxError::InvalidArgument(format!("NFLOG rcvbuf {} too large", cfg.rcvbuf))
        })?;
        // SO_RCVBUFFORCE (root) may exceed net.core.rmem_max, which SO_RCVBUF is capped at
        // (208 KiB by default: a burst of new connections would overflow it).
        set_int_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcvbuf)
            .or_else(|_| set_int_option(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf))
            .map_err(|e| LinuxError::io("set NFLOG socket receive buffer", e))?;
        let mut conn = Conn::new(fd);
        let mut bind = config_msg(g);
        bind.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
        conn.request_ack(&mut bind, &|| format!("bind NFLOG group {g}"))?;
        let mut mode = config_msg(g);
        let mut m = cfg.copy_range.to_be_bytes().to_vec();
        m.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
        mode.attr(NFULA_CFG_MODE, &m);
        mode.attr(NFULA_CFG_FLAGS, &NFULNL_CFG_F_SEQ.to_be_bytes());
        mode.attr(NFULA_CFG_QTHRESH, &cfg.qthreshold.to_be_bytes());
        let hundredths = u32::try_from(cfg.flush.as_millis() / 10).unwrap_or(u32::MAX);
        mode.attr(NFULA_CFG_TIMEOUT, &hundredths.to_be_bytes());
        mode.attr(NFULA_CFG_NLBUFSIZ, &cfg.nlbufsiz.to_be_bytes());
        conn.request_ack(&mut mode, &|| format!("configure NFLOG group {g}"))?;
        Ok(NflogSocket {
            fd: conn.into_transport(),
            group: g,
            buf: vec![0u8; RECV_BUF],
            // A new instance numbers its events from 0.
            next_seq: Some(0),
            timeout: None,
        })
    }

    /// The group this socket reads.
    pub fn group(&self) -> u16 {
        self.group
    }

    /// Waits up to `timeout` for one datagram (one batch of events). An empty batch on
    /// timeout; ENOBUFS is a loss in the batch, not an error.
    pub fn recv(&mut self, timeout: Duration) -> Result<NflogBatch> {
        let timeout = timeout.max(Duration::from_millis(1));
        if self.timeout != Some(timeout) {
            set_recv_timeout(&self.fd, timeout)
                .map_err(|e| LinuxError::io("set NFLOG socket receive timeout", e))?;
            self.timeout = Some(timeout);
        }
        let mut batch = NflogBatch::default();
        let n = match recv_retrying(&self.fd, &mut self.buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                batch.overruns += 1;
                return Ok(batch);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(batch);
            }
            Err(e) => {
                return Err(LinuxError::io(
                    format!("receive NFLOG group {}", self.group),
                    e,
                ));
            }
        };
        let now = SystemTime::now();
        let g = self.group;
        let msgs = match parse_datagram(&self.buf[..n], &|| format!("NFLOG group {g}")) {
            Ok(m) => m,
            Err(_) => {
                batch.malformed += 1;
                return Ok(batch);
            }
        };
        for m in msgs {
            if m.msg_type != ((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET) {
                continue;
            }
            match parse_packet_msg(m.payload, now) {
                Some(ev) => {
                    if let Some(s) = ev.seq {
                        // A gap is events the kernel dropped; a step back (never seen)
                        // is not counted.
                        if let Some(want) = self.next_seq {
                            let gap = s.wrapping_sub(want);
                            if gap < 1 << 31 {
                                batch.lost += u64::from(gap);
                            }
                        }
                        self.next_seq = Some(s.wrapping_add(1));
                    }
                    batch.events.push(ev);
                }
                None => batch.malformed += 1,
            }
        }
        Ok(batch)
    }

    /// Unbinds the group (also done by the kernel when the socket closes).
    pub fn unbind(self) -> Result<()> {
        let g = self.group;
        let mut conn = Conn::new(self.fd);
        let mut m = config_msg(g);
        m.attr(NFULA_CFG_CMD, &[NFULNL_CFG_CMD_UNBIND]);
        conn.request_ack(&mut m, &|| format!("unbind NFLOG group {g}"))
    }
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

fn be64(d: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(d.get(..8)?.try_into().ok()?))
}

/// One `NFULNL_MSG_PACKET` payload (after the netlink header): the nfgenmsg and attributes.
/// `None` when the message is cut short or has no prefix.
pub fn parse_packet_msg(payload: &[u8], received: SystemTime) -> Option<NflogEvent> {
    let family = *payload.first()?;
    let body = payload.get(4..)?;
    let mut ev = NflogEvent {
        family,
        prefix: String::new(),
        indev: None,
        outdev: None,
        mark: None,
        seq: None,
        time: received,
        packet: None,
    };
    let mut has_hdr = false;
    for (kind, data) in attrs(body) {
        match kind {
            NFULA_PACKET_HDR => has_hdr = data.len() >= 4,
            NFULA_PREFIX => {
                if data.len() > MAX_PREFIX {
                    return None;
                }
                ev.prefix = read_str(data);
            }
            NFULA_IFINDEX_INDEV => ev.indev = Some(be32(data)?),
            NFULA_IFINDEX_OUTDEV => ev.outdev = Some(be32(data)?),
            NFULA_MARK => ev.mark = Some(be32(data)?),
            NFULA_SEQ => ev.seq = Some(be32(data)?),
            NFULA_TIMESTAMP => {
                let sec = be64(data)?;
                let usec = be64(data.get(8..)?)?;
                if usec < 1_000_000 {
                    ev.time = UNIX_EPOCH + Duration::from_secs(sec) + Duration::from_micros(usec);
                }
            }
            NFULA_PAYLOAD => {
                let d = &data[..data.len().min(MAX_PAYLOAD)];
                ev.packet = parse_packet(d);
            }
            _ => {}
        }
    }
    has_hdr.then_some(ev)
}

fn ports(proto: u8, l4: &[u8]) -> (Option<u16>, Option<u16>, Option<(u8, u8)>) {
    let be16 = |o: usize| l4.get(o..o + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    match proto {
        // TCP, UDP, SCTP, UDP-Lite: the ports are the first four bytes.
        6 | 17 | 132 | 136 => match (be16(0), be16(2)) {
            (Some(s), Some(d)) => (Some(s), Some(d), None),
            _ => (None, None, None),
        },
        1 | 58 => (None, None, l4.get(..2).map(|b| (b[0], b[1]))),
        _ => (None, None, None),
    }
}

/// The headers of an IP packet (its first bytes); `None` when they are not a well-formed
/// IPv4 or IPv6 header.
pub fn parse_packet(d: &[u8]) -> Option<PacketHeaders> {
    match d.first()? >> 4 {
        4 => {
            let ihl = usize::from(d[0] & 0x0f) * 4;
            if ihl < 20 || d.len() < 20 {
                return None;
            }
            let proto = d[9];
            let src = IpAddr::V4(Ipv4Addr::new(d[12], d[13], d[14], d[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(d[16], d[17], d[18], d[19]));
            let frag_offset = u16::from_be_bytes([d[6], d[7]]) & 0x1fff;
            let (sp, dp, icmp) = if frag_offset == 0 {
                ports(proto, d.get(ihl..).unwrap_or(&[]))
            } else {
                (None, None, None)
            };
            Some(PacketHeaders {
                src,
                dst,
                proto,
                src_port: sp,
                dst_port: dp,
                icmp,
            })
        }
        6 => {
            if d.len() < 40 {
                return None;
            }
            let addr = |o: usize| -> IpAddr {
                let b: [u8; 16] = d[o..o + 16].try_into().unwrap_or([0; 16]);
                IpAddr::V6(Ipv6Addr::from(b))
            };
            let (src, dst) = (addr(8), addr(24));
            let mut next = d[6];
            let mut off = 40;
            let mut first_fragment = true;
            for _ in 0..MAX_V6_EXT {
                match next {
                    // Hop-by-hop, routing, destination options: length in 8-byte units
                    // after the first 8.
                    0 | 43 | 60 => {
                        let h = d.get(off..off + 2)?;
                        next = h[0];
                        off += (usize::from(h[1]) + 1) * 8;
                    }
                    44 => {
                        let h = d.get(off..off + 8)?;
                        next = h[0];
                        first_fragment = u16::from_be_bytes([h[2], h[3]]) >> 3 == 0;
                        off += 8;
                    }
                    _ => break,
                }
            }
            let (sp, dp, icmp) = if first_fragment {
                ports(next, d.get(off..).unwrap_or(&[]))
            } else {
                (None, None, None)
            };
            Some(PacketHeaders {
                src,
                dst,
                proto: next,
                src_port: sp,
                dst_port: dp,
                icmp,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_udp(sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0, 8, 0, 0]);
        p
    }

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = ((4 + data.len()) as u16).to_ne_bytes().to_vec();
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        while !a.len().is_multiple_of(4) {
            a.push(0);
        }
        a
    }

    #[test]
    fn ipv4_and_ipv6_headers_parse_with_ports_and_icmp() {
        let h = parse_packet(&v4_udp(40000, 53)).unwrap();
        assert_eq!(h.src, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(h.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(
            (h.proto, h.src_port, h.dst_port),
            (17, Some(40000), Some(53))
        );
        // A non-first fragment has no ports.
        let mut frag = v4_udp(1, 2);
        frag[7] = 8;
        assert_eq!(parse_packet(&frag).unwrap().dst_port, None);
        // ICMP echo.
        let mut icmp = v4_udp(0, 0);
        icmp[9] = 1;
        icmp[20] = 8;
        icmp[21] = 0;
        let h = parse_packet(&icmp).unwrap();
        assert_eq!((h.icmp, h.dst_port), (Some((8, 0)), None));
        // IPv6, a destination-options header, then TCP.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 32, 60, 64];
        v6.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[6, 0, 1, 4, 0, 0, 0, 0]);
        v6.extend_from_slice(&[0x1f, 0x90, 0x00, 0x50]);
        let h = parse_packet(&v6).unwrap();
        assert_eq!((h.proto, h.src_port, h.dst_port), (6, Some(8080), Some(80)));
        assert_eq!(h.dst, "fd00::2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn short_or_foreign_headers_are_refused_without_panic() {
        assert_eq!(parse_packet(&[]), None);
        assert_eq!(parse_packet(&[0x45; 19]), None);
        assert_eq!(parse_packet(&[0x41; 40]), None); // IHL 4 words < 20 bytes
        assert_eq!(parse_packet(&[0x60; 39]), None);
        assert_eq!(parse_packet(&[0x20; 60]), None);
        // Ports cut short: addresses without ports.
        let h = parse_packet(&v4_udp(1, 2)[..22]).unwrap();
        assert_eq!(h.src_port, None);
        // An extension header running past the copy.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 0, 64];
        v6.extend_from_slice(&[0; 32]);
        assert_eq!(parse_packet(&v6), None);
        // Every prefix of a real packet parses or is refused, never panics.
        let p = v4_udp(5, 6);
        for n in 0..p.len() {
            let _ = parse_packet(&p[..n]);
        }
    }

    #[test]
    fn packet_messages_decode_their_attributes() {
        let mut msg = nfgenmsg(2, 7).to_vec();
        msg.extend(attr(NFULA_PACKET_HDR, &[8, 0, 2, 0]));
        msg.extend(attr(NFULA_PREFIX, b"t:dd:i\0"));
        msg.extend(attr(NFULA_IFINDEX_OUTDEV, &5u32.to_be_bytes()));
        msg.extend(attr(NFULA_SEQ, &41u32.to_be_bytes()));
        let mut ts = 1_700_000_000u64.to_be_bytes().to_vec();
        ts.extend_from_slice(&250_000u64.to_be_bytes());
        msg.extend(attr(NFULA_TIMESTAMP, &ts));
        msg.extend(attr(NFULA_PAYLOAD, &v4_udp(3, 4)));
        let ev = parse_packet_msg(&msg, UNIX_EPOCH).unwrap();
        assert_eq!(ev.prefix, "t:dd:i");
        assert_eq!(
            (ev.family, ev.outdev, ev.indev, ev.seq),
            (2, Some(5), None, Some(41))
        );
        assert_eq!(
            ev.time,
            UNIX_EPOCH + Duration::from_millis(1_700_000_000_250)
        );
        assert_eq!(ev.packet.unwrap().dst_port, Some(4));
        // A bad 32-bit attribute or a missing packet header refuses the message.
        let mut bad = nfgenmsg(2, 7).to_vec();
        bad.extend(attr(NFULA_PACKET_HDR, &[8, 0, 2, 0]));
        bad.extend(attr(NFULA_SEQ, &[1, 2]));
        assert_eq!(parse_packet_msg(&bad, UNIX_EPOCH), None);
        let mut no_hdr = nfgenmsg(2, 7).to_vec();
        no_hdr.extend(attr(NFULA_PREFIX, b"x\0"));
        assert_eq!(parse_packet_msg(&no_hdr, UNIX_EPOCH), None);
        assert_eq!(parse_packet_msg(&[2, 0], UNIX_EPOCH), None);
        let mut long = nfgenmsg(2, 7).to_vec();
        long.extend(attr(NFULA_PACKET_HDR, &[8, 0, 2, 0]));
        long.extend(attr(NFULA_PREFIX, &[b'a'; MAX_PREFIX + 1]));
        assert_eq!(parse_packet_msg(&long, UNIX_EPOCH), None);
    }
}
