//! Hand-rolled rtnetlink wire format: the handful of kernel structs and attributes tern needs.
//!
//! The layouts are the stable kernel UAPI (`linux/netlink.h`, `linux/rtnetlink.h`,
//! `linux/if_link.h`, `linux/neighbour.h`); all integers are host-endian unless noted.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{LinuxError, Result};

pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLMSG_NOOP: u16 = 1;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;

pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_DELLINK: u16 = 17;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWADDR: u16 = 20;
pub(crate) const RTM_GETADDR: u16 = 22;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_DELROUTE: u16 = 25;
pub(crate) const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWNEIGH: u16 = 28;
pub(crate) const RTM_DELNEIGH: u16 = 29;
pub(crate) const RTM_GETNEIGH: u16 = 30;

pub(crate) const IFLA_ADDRESS: u16 = 1;
pub(crate) const IFLA_IFNAME: u16 = 3;
pub(crate) const IFLA_MTU: u16 = 4;
pub(crate) const IFLA_LINK: u16 = 5;
pub(crate) const IFLA_MASTER: u16 = 10;
pub(crate) const IFLA_LINKINFO: u16 = 18;
pub(crate) const IFLA_NET_NS_FD: u16 = 28;
pub(crate) const IFLA_LINK_NETNSID: u16 = 37;
pub(crate) const IFLA_INFO_KIND: u16 = 1;
pub(crate) const IFLA_INFO_DATA: u16 = 2;
pub(crate) const VETH_INFO_PEER: u16 = 1;
pub(crate) const IFLA_VXLAN_ID: u16 = 1;
pub(crate) const IFLA_VXLAN_LINK: u16 = 3;
pub(crate) const IFLA_VXLAN_LOCAL: u16 = 4;
pub(crate) const IFLA_VXLAN_LEARNING: u16 = 7;
pub(crate) const IFLA_VXLAN_PORT: u16 = 15;
pub(crate) const IFLA_VXLAN_LOCAL6: u16 = 17;
pub(crate) const IFF_UP: u32 = 0x1;

pub(crate) const IFA_ADDRESS: u16 = 1;
pub(crate) const IFA_LOCAL: u16 = 2;
pub(crate) const IFA_FLAGS: u16 = 8;
pub(crate) const IFA_F_NODAD: u32 = 0x02;

pub(crate) const RTA_DST: u16 = 1;
pub(crate) const RTA_OIF: u16 = 4;
pub(crate) const RTA_GATEWAY: u16 = 5;
pub(crate) const RTA_TABLE: u16 = 15;
pub(crate) const RTN_UNICAST: u8 = 1;
pub(crate) const RTM_F_CLONED: u32 = 0x200;

pub(crate) const NDA_DST: u16 = 1;
pub(crate) const NDA_LLADDR: u16 = 2;
pub(crate) const NUD_PERMANENT: u16 = 0x80;
pub(crate) const NTF_SELF: u8 = 0x02;

const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLM_F_CAPPED: u16 = 0x100;

pub(crate) fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Builds one netlink request: header, fixed family struct, then attributes (possibly nested).
pub(crate) struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    pub(crate) fn new(msg_type: u16, flags: u16) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in finish()
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // seq, set by the socket
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: kernel fills it
        Msg {
            buf,
            nests: Vec::new(),
        }
    }

    /// Appends raw bytes (a family header such as ifinfomsg), padded to 4 bytes.
    pub(crate) fn raw(&mut self, bytes: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    pub(crate) fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Msg {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    pub(crate) fn attr_u32(&mut self, kind: u16, v: u32) -> &mut Msg {
        self.attr(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute, as the kernel's NLA_STRING / IFNAMSIZ checks want.
    pub(crate) fn attr_str(&mut self, kind: u16, s: &str) -> &mut Msg {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.attr(kind, &data)
    }

    pub(crate) fn begin_nest(&mut self, kind: u16) -> &mut Msg {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    pub(crate) fn end_nest(&mut self) -> &mut Msg {
        let start = self.nests.pop().expect("end_nest without begin_nest");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn finish(&mut self, seq: u32) -> &[u8] {
        debug_assert!(self.nests.is_empty(), "unclosed netlink nest");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.buf
    }
}

/// `struct ifinfomsg`.
pub(crate) fn ifinfomsg(family: u8, index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = family;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `struct ifaddrmsg`.
pub(crate) fn ifaddrmsg(family: u8, prefix_len: u8, flags: u8, scope: u8, index: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = family;
    b[1] = prefix_len;
    b[2] = flags;
    b[3] = scope;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// `struct rtmsg`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rtmsg(
    family: u8,
    dst_len: u8,
    table: u8,
    protocol: u8,
    scope: u8,
    rtype: u8,
    flags: u32,
) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[1] = dst_len;
    b[4] = table;
    b[5] = protocol;
    b[6] = scope;
    b[7] = rtype;
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b
}

/// `struct ndmsg`.
pub(crate) fn ndmsg(family: u8, index: u32, state: u16, flags: u8) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..10].copy_from_slice(&state.to_ne_bytes());
    b[10] = flags;
    b
}

/// Iterates over the attributes in `buf`. Malformed trailing bytes end the iteration.
pub(crate) struct Attrs<'a> {
    buf: &'a [u8],
}

pub(crate) fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { buf }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);
    fn next(&mut self) -> Option<(u16, &'a [u8])> {
        if self.buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.buf[0], self.buf[1]]) as usize;
        let kind = u16::from_ne_bytes([self.buf[2], self.buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.buf.len() {
            return None;
        }
        let data = &self.buf[4..len];
        self.buf = &self.buf[align4(len).min(self.buf.len())..];
        Some((kind, data))
    }
}

pub(crate) fn read_u32(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

pub(crate) fn read_str(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// One received message: its type and the payload after the netlink header.
pub(crate) struct Reply {
    pub(crate) msg_type: u16,
    pub(crate) payload: Vec<u8>,
}

/// A blocking NETLINK_ROUTE socket, bound in the network namespace of the creating thread.
pub(crate) struct Socket {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

/// One datagram from a netlink socket into `buf` (retried on EINTR); its length.
pub(crate) fn recv_retrying(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid writable buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Opens a netlink socket of `protocol` in the calling thread's network namespace, with
/// extended acks asked for, bound to a kernel-chosen port. `name` goes into error messages.
pub(crate) fn open_bound(protocol: libc::c_int, name: &str) -> Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the returned fd is checked and then owned.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if raw < 0 {
        return Err(LinuxError::last_os(format!("open {name} socket")));
    }
    // SAFETY: raw is a fresh, valid fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let one: libc::c_int = 1;
    // Extended acks turn a bare EINVAL into the kernel's own explanation; failure to enable
    // them (old kernels) is harmless, so the result is ignored.
    // SAFETY: valid fd, pointer and length describe `one`.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            NETLINK_EXT_ACK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    // SAFETY: zeroed sockaddr_nl is valid; nl_family set, pid 0 lets the kernel choose.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: addr is a valid sockaddr_nl of the given length.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(LinuxError::last_os(format!("bind {name} socket")));
    }
    Ok(fd)
}

impl Socket {
    pub(crate) fn new() -> Result<Socket> {
        let fd = open_bound(libc::NETLINK_ROUTE, "rtnetlink")?;
        Ok(Socket {
            fd,
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        })
    }

    fn send(&mut self, msg: &mut Msg, context: &dyn Fn() -> String) -> Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = msg.finish(seq);
        // SAFETY: bytes is a valid buffer of the given length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        if n < 0 {
            return Err(LinuxError::io(
                format!("{}: send netlink request", context()),
                io::Error::last_os_error(),
            ));
        }
        Ok(seq)
    }

    /// Receives one datagram and calls `each` for every message of sequence `seq` in it.
    /// Returns true when the exchange is complete (ACK, error or DONE seen).
    fn recv_batch(
        &mut self,
        seq: u32,
        context: &dyn Fn() -> String,
        each: &mut dyn FnMut(u16, &[u8]) -> Result<bool>,
    ) -> Result<bool> {
        let n = recv_retrying(&self.fd, &mut self.buf)
            .map_err(|err| LinuxError::io(format!("{}: receive netlink reply", context()), err))?;
        let mut off = 0;
        let data = std::mem::take(&mut self.buf);
        let result = (|| {
            while off + NLMSG_HDRLEN <= n {
                let h = &data[off..];
                let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
                let msg_type = u16::from_ne_bytes(h[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(h[6..8].try_into().unwrap());
                let mseq = u32::from_ne_bytes(h[8..12].try_into().unwrap());
                if len < NLMSG_HDRLEN || off + len > n {
                    return Err(LinuxError::Malformed(format!(
                        "{}: message length {len} at offset {off} of {n}",
                        context()
                    )));
                }
                let payload = &data[off + NLMSG_HDRLEN..off + len];
                off += align4(len);
                if mseq != seq {
                    // A reply to an earlier request that was abandoned; not ours.
                    continue;
                }
                match msg_type {
                    NLMSG_NOOP => {}
                    NLMSG_DONE => return Ok(true),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                            .ok_or_else(|| {
                                LinuxError::Malformed(format!("{}: short NLMSG_ERROR", context()))
                            })?;
                        if code == 0 {
                            return Ok(true);
                        }
                        return Err(LinuxError::Netlink {
                            context: context(),
                            source: io::Error::from_raw_os_error(-code),
                            ext_ack: ext_ack_message(payload, flags),
                        });
                    }
                    _ => {
                        if each(msg_type, payload)? {
                            return Ok(true);
                        }
                    }
                }
            }
            Ok(false)
        })();
        self.buf = data;
        result
    }

    /// Sends a request that expects only an acknowledgement.
    pub(crate) fn request_ack(
        &mut self,
        msg: &mut Msg,
        context: &dyn Fn() -> String,
    ) -> Result<()> {
        let seq = self.send(msg, context)?;
        while !self.recv_batch(seq, context, &mut |_, _| Ok(false))? {}
        Ok(())
    }

    /// Sends a request that is answered by exactly one message (a GET of one object).
    pub(crate) fn request_one(
        &mut self,
        msg: &mut Msg,
        context: &dyn Fn() -> String,
    ) -> Result<Reply> {
        let seq = self.send(msg, context)?;
        let mut reply = None;
        while !self.recv_batch(seq, context, &mut |t, p| {
            reply = Some(Reply {
                msg_type: t,
                payload: p.to_vec(),
            });
            Ok(true)
        })? {}
        reply.ok_or_else(|| LinuxError::Malformed(format!("{}: no reply", context())))
    }

    /// Sends a dump request and collects every message until NLMSG_DONE.
    pub(crate) fn request_dump(
        &mut self,
        msg: &mut Msg,
        context: &dyn Fn() -> String,
    ) -> Result<Vec<Reply>> {
        let seq = self.send(msg, context)?;
        let mut out = Vec::new();
        while !self.recv_batch(seq, context, &mut |t, p| {
            out.push(Reply {
                msg_type: t,
                payload: p.to_vec(),
            });
            Ok(false)
        })? {}
        Ok(out)
    }
}

/// Extracts NLMSGERR_ATTR_MSG from an error payload (errno + original header [+ request] + TLVs).
fn ext_ack_message(payload: &[u8], flags: u16) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    // After the errno comes the original request: only its header when capped.
    let orig_len = payload
        .get(4..8)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()) as usize)?;
    let skip = if flags & NLM_F_CAPPED != 0 {
        4 + NLMSG_HDRLEN
    } else {
        4 + align4(orig_len)
    };
    let tlvs = payload.get(skip..)?;
    attrs(tlvs)
        .find(|(k, _)| *k == NLMSGERR_ATTR_MSG)
        .map(|(_, v)| read_str(v))
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_nested_attributes_with_lengths_and_padding() {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK);
        m.raw(&ifinfomsg(0, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, "ab");
        m.begin_nest(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, "veth");
        m.end_nest();
        let bytes = m.finish(7).to_vec();
        assert_eq!(
            u32::from_ne_bytes(bytes[0..4].try_into().unwrap()) as usize,
            bytes.len()
        );
        assert_eq!(
            u16::from_ne_bytes(bytes[6..8].try_into().unwrap()),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(u32::from_ne_bytes(bytes[8..12].try_into().unwrap()), 7);
        let body = &bytes[NLMSG_HDRLEN + 16..];
        let parsed: Vec<_> = attrs(body).collect();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0], (IFLA_IFNAME, &b"ab\0"[..]));
        assert_eq!(parsed[1].0, IFLA_LINKINFO);
        let inner: Vec<_> = attrs(parsed[1].1).collect();
        assert_eq!(inner, vec![(IFLA_INFO_KIND, &b"veth\0"[..])]);
        // "ab\0" is 7 bytes with the header and must be padded to 8.
        assert_eq!(body.len(), 8 + 4 + 12);
    }

    #[test]
    fn attribute_iterator_stops_on_truncated_input() {
        let buf = [8u8, 0, 3, 0, b'x', 0, 0, 0, 50, 0, 1, 0];
        let parsed: Vec<_> = attrs(&buf).collect();
        assert_eq!(parsed, vec![(3, &b"x\0\0\0"[..])]);
    }
}
