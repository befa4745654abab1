//! The one netlink framing core every family module builds on (rtnetlink in [`super::route`],
//! nfnetlink in [`crate::nft_netlink`]): the message builder with checked attribute lengths,
//! the attribute and message parsers, extended-ack decoding, the socket, and the
//! request/reply exchange whose dumps are retried when the kernel flags them
//! `NLM_F_DUMP_INTR`.
//!
//! Layouts are the stable kernel UAPI (`linux/netlink.h`); integers are host-endian.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::error::{LinuxError, Result};

pub(crate) const NLMSG_HDRLEN: usize = 16;
pub(crate) const NLMSG_NOOP: u16 = 1;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
/// Set on the messages of a dump the kernel's tables changed under: the dump may be
/// inconsistent (an entry missed or seen twice) and must be repeated.
pub(crate) const NLM_F_DUMP_INTR: u16 = 0x10;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;

const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLM_F_CAPPED: u16 = 0x100;

/// Header bytes of one attribute.
const NLA_HDRLEN: usize = 4;

/// How many times a dump the kernel flags `NLM_F_DUMP_INTR` is repeated before giving up.
/// A table that changes during every one of this many dumps in a row is being rewritten
/// faster than it can be read; the caller sees an error rather than a wrong list.
pub(crate) const MAX_DUMP_ATTEMPTS: usize = 5;

pub(crate) fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Builds netlink messages into one buffer: one request, or a batch of several (nfnetlink).
/// Each message is a header, a family header ([`MsgBuilder::raw`]) and attributes, possibly
/// nested.
///
/// Attribute and nest lengths are `u16` on the wire. An attribute or nest that would not fit
/// is not written; the builder remembers the first such error, ignores every later call, and
/// [`MsgBuilder::finish`] returns the error, so a message is never sent with a truncated
/// length.
pub(crate) struct MsgBuilder {
    buf: Vec<u8>,
    /// Offset of the open message, if one is open.
    msg_start: Option<usize>,
    /// Offset of the last message begun (open or ended), whose sequence number
    /// [`MsgBuilder::set_seq`] sets: a request is sent again with a new one.
    last_start: usize,
    nests: Vec<(usize, u16)>,
    error: Option<String>,
}

impl MsgBuilder {
    /// An empty buffer, for a batch of messages ([`MsgBuilder::begin`] each).
    pub(crate) fn batch() -> MsgBuilder {
        MsgBuilder {
            buf: Vec::with_capacity(4096),
            msg_start: None,
            last_start: 0,
            nests: Vec::new(),
            error: None,
        }
    }

    /// One request of `msg_type`; its sequence number is set when it is sent.
    pub(crate) fn new(msg_type: u16, flags: u16) -> MsgBuilder {
        let mut b = MsgBuilder {
            buf: Vec::with_capacity(256),
            msg_start: None,
            last_start: 0,
            nests: Vec::new(),
            error: None,
        };
        b.begin(msg_type, flags, 0);
        b
    }

    fn failed(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(message);
        }
    }

    /// Starts a message (ending the open one): the netlink header with `NLM_F_REQUEST`.
    pub(crate) fn begin(&mut self, msg_type: u16, flags: u16, seq: u32) -> &mut MsgBuilder {
        if self.msg_start.is_some() {
            self.end();
        }
        self.msg_start = Some(self.buf.len());
        self.last_start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in end()
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf
            .extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: kernel fills it
        self
    }

    /// Sets the sequence number of the last message begun.
    pub(crate) fn set_seq(&mut self, seq: u32) -> &mut MsgBuilder {
        let start = self.last_start;
        if let Some(field) = self.buf.get_mut(start + 8..start + 12) {
            field.copy_from_slice(&seq.to_ne_bytes());
        }
        self
    }

    /// Adds `flags` to the header of the last message begun (a batch asks for the
    /// acknowledgement of its last message only, known once every message is written).
    pub(crate) fn add_flags(&mut self, flags: u16) -> &mut MsgBuilder {
        let start = self.last_start;
        if let Some(field) = self.buf.get_mut(start + 6..start + 8) {
            let old = u16::from_ne_bytes([field[0], field[1]]);
            field.copy_from_slice(&(old | flags).to_ne_bytes());
        }
        self
    }

    /// Appends raw bytes (a family header such as ifinfomsg or nfgenmsg), padded to 4 bytes.
    pub(crate) fn raw(&mut self, bytes: &[u8]) -> &mut MsgBuilder {
        if self.error.is_none() {
            self.buf.extend_from_slice(bytes);
            self.pad();
        }
        self
    }

    fn pad(&mut self) {
        let padded = align4(self.buf.len());
        self.buf.resize(padded, 0);
    }

    /// One attribute. Fails the builder (see [`MsgBuilder::finish`]) when `data` makes it
    /// longer than the 65535 bytes an attribute's length can say.
    pub(crate) fn attr(&mut self, kind: u16, data: &[u8]) -> &mut MsgBuilder {
        if self.error.is_some() {
            return self;
        }
        let Ok(len) = u16::try_from(NLA_HDRLEN + data.len()) else {
            self.failed(format!(
                "netlink attribute type {kind} would be {} bytes, more than the {} an \
                 attribute can hold",
                NLA_HDRLEN + data.len(),
                u16::MAX
            ));
            return self;
        };
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    pub(crate) fn attr_u32(&mut self, kind: u16, v: u32) -> &mut MsgBuilder {
        self.attr(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute, as the kernel's NLA_STRING / IFNAMSIZ checks want.
    pub(crate) fn attr_str(&mut self, kind: u16, s: &str) -> &mut MsgBuilder {
        let mut data = Vec::with_capacity(s.len() + 1);
        data.extend_from_slice(s.as_bytes());
        data.push(0);
        self.attr(kind, &data)
    }

    /// Opens a nested attribute; [`MsgBuilder::end_nest`] closes it.
    pub(crate) fn begin_nest(&mut self, kind: u16) -> &mut MsgBuilder {
        self.nests.push((self.buf.len(), kind));
        if self.error.is_none() {
            self.buf.extend_from_slice(&0u16.to_ne_bytes());
            self.buf
                .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        }
        self
    }

    /// Closes the innermost nest. Fails the builder when its content makes it longer than
    /// 65535 bytes.
    pub(crate) fn end_nest(&mut self) -> &mut MsgBuilder {
        let Some((start, kind)) = self.nests.pop() else {
            self.failed("netlink nest closed that was never opened".into());
            return self;
        };
        if self.error.is_some() {
            return self;
        }
        match u16::try_from(self.buf.len() - start) {
            Ok(len) => self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes()),
            Err(_) => self.failed(format!(
                "nested netlink attribute type {kind} would be {} bytes, more than the {} an \
                 attribute can hold",
                self.buf.len() - start,
                u16::MAX
            )),
        }
        self
    }

    /// Ends the open message: patches its length.
    pub(crate) fn end(&mut self) -> &mut MsgBuilder {
        if !self.nests.is_empty() {
            self.failed(format!(
                "netlink message ended with {} nest(s) open",
                self.nests.len()
            ));
        }
        if let Some(start) = self.msg_start.take()
            && self.error.is_none()
        {
            match u32::try_from(self.buf.len() - start) {
                Ok(len) => self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes()),
                Err(_) => self.failed("netlink message longer than 4 GiB".into()),
            }
        }
        self
    }

    /// The first length error so far, if any.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.error {
            Some(e) => Err(LinuxError::InvalidArgument(e.clone())),
            None => Ok(()),
        }
    }

    /// Ends the open message and returns the bytes, or the first length error.
    pub(crate) fn finish(&mut self) -> Result<&[u8]> {
        self.end();
        self.check()?;
        Ok(&self.buf)
    }
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
        if self.buf.len() < NLA_HDRLEN {
            return None;
        }
        let len = u16::from_ne_bytes([self.buf[0], self.buf[1]]) as usize;
        let kind = u16::from_ne_bytes([self.buf[2], self.buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > self.buf.len() {
            return None;
        }
        let data = &self.buf[NLA_HDRLEN..len];
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

/// One message of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawMsg<'a> {
    pub(crate) msg_type: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    /// The bytes after the netlink header.
    pub(crate) payload: &'a [u8],
}

/// The messages of one datagram, in order; a length that does not fit the datagram is an
/// error naming `context`.
pub(crate) fn parse_datagram<'a>(
    data: &'a [u8],
    context: &dyn Fn() -> String,
) -> Result<Vec<RawMsg<'a>>> {
    let n = data.len();
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= n {
        let h = &data[off..];
        let len = u32::from_ne_bytes(h[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDRLEN || len > h.len() {
            return Err(LinuxError::Malformed(format!(
                "{}: message length {len} at offset {off} of {n}",
                context()
            )));
        }
        out.push(RawMsg {
            msg_type: u16::from_ne_bytes(h[4..6].try_into().unwrap()),
            flags: u16::from_ne_bytes(h[6..8].try_into().unwrap()),
            seq: u32::from_ne_bytes(h[8..12].try_into().unwrap()),
            payload: &h[NLMSG_HDRLEN..len],
        });
        off += align4(len);
    }
    Ok(out)
}

/// The kernel's answer in an `NLMSG_ERROR` message: errno (0 = acknowledged) and the
/// extended-ack text, when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) errno: i32,
    pub(crate) ext_ack: Option<String>,
}

impl Answer {
    /// Decodes an `NLMSG_ERROR` payload.
    pub(crate) fn decode(m: &RawMsg<'_>, context: &dyn Fn() -> String) -> Result<Answer> {
        let code = m
            .payload
            .get(..4)
            .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
            .ok_or_else(|| LinuxError::Malformed(format!("{}: short NLMSG_ERROR", context())))?;
        Ok(Answer {
            errno: -code,
            ext_ack: ext_ack_message(m.payload, m.flags),
        })
    }

    /// The error this answer reports (for a non-zero errno).
    pub(crate) fn into_error(self, context: String) -> LinuxError {
        LinuxError::Netlink {
            context,
            source: io::Error::from_raw_os_error(self.errno),
            ext_ack: self.ext_ack,
        }
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

/// Sends `bytes` as one datagram.
pub(crate) fn send_all(fd: &OwnedFd, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: bytes is a valid buffer of the given length.
    let n = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets an `int` socket option (`SOL_SOCKET` level unless `level` says otherwise): the one
/// `setsockopt(2)` of an integer every socket of this crate goes through.
pub(crate) fn set_int_option(
    fd: &OwnedFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: valid fd; pointer and length describe `v`.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets how long a blocking receive on `fd` waits (`SO_RCVTIMEO`) before failing with
/// `EAGAIN`; a zero `t` would mean forever, so it is raised to 1 µs.
pub(crate) fn set_recv_timeout(fd: &OwnedFd, t: Duration) -> io::Result<()> {
    let t = t.max(Duration::from_micros(1));
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid fd; pointer and length describe `tv`.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    // Extended acks turn a bare EINVAL into the kernel's own explanation; failure to enable
    // them (old kernels) is harmless, so the result is ignored.
    let _ = set_int_option(&fd, libc::SOL_NETLINK, NETLINK_EXT_ACK, 1);
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

/// Where an exchange sends requests and receives datagrams: a netlink socket, or canned
/// datagrams in tests.
pub(crate) trait Transport {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Receives one datagram into `buf`; its length.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

impl Transport for OwnedFd {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        send_all(self, bytes)
    }
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv_retrying(self, buf)
    }
}

/// One received message: its type and the payload after the netlink header.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) msg_type: u16,
    pub(crate) payload: Vec<u8>,
}

/// Request/reply exchanges over a [`Transport`]: acknowledged requests, single replies and
/// dumps, matched by sequence number.
pub(crate) struct Conn<T> {
    transport: T,
    seq: u32,
    buf: Vec<u8>,
}

impl<T: Transport> Conn<T> {
    pub(crate) fn new(transport: T) -> Conn<T> {
        Conn {
            transport,
            seq: 0,
            buf: vec![0u8; 64 * 1024],
        }
    }

    /// The transport back (a socket configured through requests, then read as a stream of
    /// kernel-initiated messages).
    pub(crate) fn into_transport(self) -> T {
        self.transport
    }

    fn send(&mut self, msg: &mut MsgBuilder, context: &dyn Fn() -> String) -> Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let bytes = msg
            .set_seq(seq)
            .finish()
            .map_err(|e| LinuxError::InvalidArgument(format!("{}: {e}", context())))?;
        self.transport
            .send(bytes)
            .map_err(|err| LinuxError::io(format!("{}: send netlink request", context()), err))?;
        Ok(seq)
    }

    /// Receives one datagram and calls `each` for every data message of sequence `seq` in
    /// it. Returns true when the exchange is complete (ACK, error, DONE, or `each` says so);
    /// sets `interrupted` when a message of the exchange carries `NLM_F_DUMP_INTR`.
    fn recv_batch(
        &mut self,
        seq: u32,
        context: &dyn Fn() -> String,
        interrupted: &mut bool,
        each: &mut dyn FnMut(u16, &[u8]) -> Result<bool>,
    ) -> Result<bool> {
        let n = self
            .transport
            .recv(&mut self.buf)
            .map_err(|err| LinuxError::io(format!("{}: receive netlink reply", context()), err))?;
        let data = std::mem::take(&mut self.buf);
        let result = (|| {
            for m in parse_datagram(&data[..n], context)? {
                if m.seq != seq {
                    // A reply to an earlier request that was abandoned; not ours.
                    continue;
                }
                if m.flags & NLM_F_DUMP_INTR != 0 {
                    *interrupted = true;
                }
                match m.msg_type {
                    NLMSG_NOOP => {}
                    NLMSG_DONE => return Ok(true),
                    NLMSG_ERROR => {
                        let a = Answer::decode(&m, context)?;
                        if a.errno == 0 {
                            return Ok(true);
                        }
                        return Err(a.into_error(context()));
                    }
                    _ => {
                        if each(m.msg_type, m.payload)? {
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
        msg: &mut MsgBuilder,
        context: &dyn Fn() -> String,
    ) -> Result<()> {
        let seq = self.send(msg, context)?;
        let mut intr = false;
        while !self.recv_batch(seq, context, &mut intr, &mut |_, _| Ok(false))? {}
        Ok(())
    }

    /// Sends a request that is answered by exactly one message (a GET of one object).
    pub(crate) fn request_one(
        &mut self,
        msg: &mut MsgBuilder,
        context: &dyn Fn() -> String,
    ) -> Result<Reply> {
        let seq = self.send(msg, context)?;
        let mut reply = None;
        let mut intr = false;
        while !self.recv_batch(seq, context, &mut intr, &mut |t, p| {
            reply = Some(Reply {
                msg_type: t,
                payload: p.to_vec(),
            });
            Ok(true)
        })? {}
        reply.ok_or_else(|| LinuxError::Malformed(format!("{}: no reply", context())))
    }

    /// Sends a dump request and collects every message until NLMSG_DONE. A dump the kernel
    /// flags `NLM_F_DUMP_INTR` (its table changed while it was read) is read to its end and
    /// then repeated, up to [`MAX_DUMP_ATTEMPTS`] times in all.
    pub(crate) fn request_dump(
        &mut self,
        msg: &mut MsgBuilder,
        context: &dyn Fn() -> String,
    ) -> Result<Vec<Reply>> {
        for _ in 0..MAX_DUMP_ATTEMPTS {
            let seq = self.send(msg, context)?;
            let mut out = Vec::new();
            let mut interrupted = false;
            while !self.recv_batch(seq, context, &mut interrupted, &mut |t, p| {
                out.push(Reply {
                    msg_type: t,
                    payload: p.to_vec(),
                });
                Ok(false)
            })? {}
            if !interrupted {
                return Ok(out);
            }
        }
        Err(LinuxError::Io {
            context: format!(
                "{}: the kernel interrupted the dump {MAX_DUMP_ATTEMPTS} times in a row \
                 (NLM_F_DUMP_INTR: the table changed while it was read)",
                context()
            ),
            source: io::Error::from_raw_os_error(libc::EINTR),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    #[test]
    fn builds_nested_attributes_with_lengths_and_padding() {
        let mut m = MsgBuilder::new(16, NLM_F_ACK);
        m.raw(&[0u8; 16]);
        m.attr_str(3, "ab");
        m.begin_nest(18);
        m.attr_str(1, "veth");
        m.end_nest();
        let bytes = m.set_seq(7).finish().unwrap().to_vec();
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
        assert_eq!(parsed[0], (3, &b"ab\0"[..]));
        assert_eq!(parsed[1].0, 18);
        let inner: Vec<_> = attrs(parsed[1].1).collect();
        assert_eq!(inner, vec![(1, &b"veth\0"[..])]);
        // "ab\0" is 7 bytes with the header and must be padded to 8.
        assert_eq!(body.len(), 8 + 4 + 12);
    }

    #[test]
    fn attribute_iterator_stops_on_truncated_input() {
        let buf = [8u8, 0, 3, 0, b'x', 0, 0, 0, 50, 0, 1, 0];
        let parsed: Vec<_> = attrs(&buf).collect();
        assert_eq!(parsed, vec![(3, &b"x\0\0\0"[..])]);
    }

    #[test]
    fn an_attribute_over_65535_bytes_is_an_error_not_a_truncated_length() {
        // The largest attribute that fits: 65531 bytes of data plus the 4-byte header.
        let mut m = MsgBuilder::new(16, 0);
        m.attr(1, &vec![0u8; 65531]);
        let bytes = m.finish().unwrap();
        assert_eq!(u16::from_ne_bytes([bytes[16], bytes[17]]), u16::MAX);
        // `finish` of what `build` wrote fails with an error containing `want`.
        let refused = |build: &dyn Fn(&mut MsgBuilder), want: &str| {
            let mut m = MsgBuilder::new(16, 0);
            build(&mut m);
            let e = m.finish().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        // One byte more would wrap to a 0-byte length with `as u16`.
        refused(
            &|m| {
                m.attr(7, &vec![0u8; 65532]);
                m.attr(1, b"later attributes are ignored");
            },
            "attribute type 7 would be 65536 bytes, more than the 65535",
        );
        // A nest whose content overflows: each attribute fits, together they do not.
        refused(
            &|m| {
                m.begin_nest(3);
                for _ in 0..3 {
                    m.attr(1, &vec![0u8; 30000]);
                }
                m.end_nest();
            },
            "nested netlink attribute type 3 would be",
        );
        // An unbalanced nest is an error too, not a panic.
        let mut m = MsgBuilder::new(16, 0);
        m.begin_nest(3);
        assert!(m.finish().is_err());
    }

    /// Canned datagrams: each `recv` hands out the next one with its sequence numbers set to
    /// the last request's, as the kernel's would be.
    struct Canned {
        datagrams: VecDeque<Vec<u8>>,
        sent: Vec<Vec<u8>>,
    }

    impl Transport for Canned {
        fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
            self.sent.push(bytes.to_vec());
            Ok(())
        }
        fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let seq = &self.sent.last().expect("a request before a reply")[8..12];
            let mut d = self
                .datagrams
                .pop_front()
                .expect("no more canned datagrams");
            let mut off = 0;
            while off + NLMSG_HDRLEN <= d.len() {
                d[off + 8..off + 12].copy_from_slice(seq);
                off += align4(u32::from_ne_bytes(d[off..off + 4].try_into().unwrap()) as usize);
            }
            buf[..d.len()].copy_from_slice(&d);
            Ok(d.len())
        }
    }

    fn msg(msg_type: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = ((NLMSG_HDRLEN + payload.len()) as u32)
            .to_ne_bytes()
            .to_vec();
        v.extend_from_slice(&msg_type.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&[0u8; 8]);
        v.extend_from_slice(payload);
        v.resize(align4(v.len()), 0);
        v
    }

    /// A dump of `items` as one datagram of messages (type 16) then NLMSG_DONE.
    fn dump(items: &[&[u8]], flags: u16) -> Vec<u8> {
        let mut d: Vec<u8> = items.iter().flat_map(|p| msg(16, flags, p)).collect();
        d.extend(msg(NLMSG_DONE, flags, &0i32.to_ne_bytes()));
        d
    }

    fn payloads(r: &[Reply]) -> Vec<Vec<u8>> {
        r.iter().map(|r| r.payload.clone()).collect()
    }

    #[test]
    fn an_interrupted_dump_is_repeated() {
        let mut c = Conn::new(Canned {
            datagrams: [
                dump(&[b"old1", b"old2"], NLM_F_DUMP_INTR),
                dump(&[b"new1", b"new2", b"new3"], 0),
            ]
            .into(),
            sent: Vec::new(),
        });
        let got = c
            .request_dump(&mut MsgBuilder::new(18, NLM_F_DUMP), &|| "list".into())
            .unwrap();
        assert_eq!(
            payloads(&got),
            vec![b"new1".to_vec(), b"new2".to_vec(), b"new3".to_vec()]
        );
        assert_eq!(c.transport.sent.len(), 2, "the dump is sent again");
        // The repeat is a new request (a new sequence number), byte for byte the same
        // otherwise.
        let (a, b) = (&c.transport.sent[0], &c.transport.sent[1]);
        assert_ne!(a[8..12], b[8..12]);
        assert_eq!((&a[..8], &a[12..]), (&b[..8], &b[12..]));
    }

    #[test]
    fn the_flag_on_the_done_message_alone_counts_and_clean_dumps_are_not_repeated() {
        // The kernel may set the flag only on NLMSG_DONE.
        let mut only_done = msg(16, 0, b"a");
        only_done.extend(msg(NLMSG_DONE, NLM_F_DUMP_INTR, &0i32.to_ne_bytes()));
        let mut c = Conn::new(Canned {
            datagrams: [only_done, dump(&[b"b"], 0)].into(),
            sent: Vec::new(),
        });
        let got = c
            .request_dump(&mut MsgBuilder::new(18, NLM_F_DUMP), &|| "list".into())
            .unwrap();
        assert_eq!(payloads(&got), vec![b"b".to_vec()]);
        assert_eq!(c.transport.sent.len(), 2);
        let mut c = Conn::new(Canned {
            datagrams: [dump(&[b"x"], 0)].into(),
            sent: Vec::new(),
        });
        c.request_dump(&mut MsgBuilder::new(18, NLM_F_DUMP), &|| "list".into())
            .unwrap();
        assert_eq!(c.transport.sent.len(), 1);
    }

    #[test]
    fn a_dump_interrupted_every_time_fails_after_the_bounded_attempts() {
        let mut c = Conn::new(Canned {
            datagrams: (0..MAX_DUMP_ATTEMPTS)
                .map(|_| dump(&[b"x"], NLM_F_DUMP_INTR))
                .collect(),
            sent: Vec::new(),
        });
        let e = c
            .request_dump(&mut MsgBuilder::new(18, NLM_F_DUMP), &|| {
                "list routes".into()
            })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("list routes: the kernel interrupted the dump 5 times"),
            "{e}"
        );
        assert_eq!(c.transport.sent.len(), MAX_DUMP_ATTEMPTS);
    }

    #[test]
    fn errors_carry_the_extended_ack_and_foreign_sequence_numbers_are_skipped() {
        // errno -22, the original header (capped), then NLMSGERR_ATTR_MSG.
        let mut payload = (-22i32).to_ne_bytes().to_vec();
        payload.extend_from_slice(&(NLMSG_HDRLEN as u32).to_ne_bytes());
        payload.extend_from_slice(&[0u8; 12]);
        payload.extend_from_slice(&12u16.to_ne_bytes());
        payload.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend_from_slice(b"bad mtu\0");
        let err = msg(NLMSG_ERROR, NLM_F_ACK_TLVS | NLM_F_CAPPED, &payload);
        let m = parse_datagram(&err, &|| "x".into()).unwrap();
        let a = Answer::decode(&m[0], &|| "x".into()).unwrap();
        assert_eq!(
            a,
            Answer {
                errno: 22,
                ext_ack: Some("bad mtu".into())
            }
        );
        let mut c = Conn::new(Canned {
            datagrams: [err].into(),
            sent: Vec::new(),
        });
        let e = c
            .request_ack(&mut MsgBuilder::new(16, NLM_F_ACK), &|| "set mtu".into())
            .unwrap_err();
        assert_eq!(e.errno(), Some(22));
        assert!(e.to_string().contains("bad mtu"), "{e}");
        // A message length past the datagram is malformed, not a panic.
        let mut short = msg(16, 0, b"abcd");
        short[0] = 200;
        assert!(parse_datagram(&short, &|| "x".into()).is_err());
    }
}
