//! ternd's unix-socket API, shared by the CNI plugins (`tern`, `tern-ipam`), `ternctl` and `ternd`.
//!
//! One request per connection. A frame is a 4-byte big-endian length followed by a JSON body of at
//! most [`MAX_FRAME`] bytes. A request may carry one file descriptor (the pod's network namespace)
//! as SCM_RIGHTS ancillary data on its first byte, so the agent needs no access to the runtime's
//! paths or PID namespace. The receiver takes every descriptor that arrives
//! ([`read_frame_limited`]) so that extra ones are closed, never leaked.
//!
//! Addresses travel as strings ("10.244.0.5/32", "169.254.1.1") so this crate stays free of
//! networking dependencies.

pub mod flow;
pub mod ident;
pub mod journal;
pub mod veth_name;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Default path of ternd's socket.
pub const DEFAULT_SOCKET: &str = "/run/tern/ternd.sock";
/// Default state directory shared by the plugin and the agent (release journal, endpoint status).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tern";
/// File in the state directory where ternd records this node's Kubernetes `spec.podCIDRs`
/// (`{"node": "...", "podCIDRs": ["10.244.1.0/24"]}`), read by the plugin to resolve
/// `ipam.subnet: usePodCidr` for a delegated host-local, as Calico's plugin does.
pub const POD_CIDRS_FILE: &str = "pod-cidrs.json";
/// Largest frame either side accepts: 1 MiB. A CNI request is a few KiB (the plugin's stdin is
/// itself capped at 1 MiB), so this only bounds what a hostile client can make the agent buffer.
pub const MAX_FRAME: usize = 1 << 20;

/// The Kubernetes identity of a pod, from `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub infra_container_id: String,
    /// `K8S_POD_UID`: tells two incarnations of one pod name apart.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// Identity of one attachment: what the runtime names in every call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// The network name from the conflist.
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// `CNI_NETNS` as given (may be empty on DEL).
    #[serde(default)]
    pub netns_path: String,
    #[serde(default)]
    pub pod: Option<PodRef>,
}

impl Attachment {
    /// The IPAM handle of this attachment: `<network>:<ifname>.<containerID>` with each part
    /// escaped ([`ident::encode_handle`]), injective over (network, container ID, interface),
    /// so no two attachments ever share a handle whatever dots their names contain.
    pub fn handle(&self) -> String {
        ident::encode_handle(&self.network, &self.container_id, &self.ifname)
    }

    /// The handle tern used before handles were unambiguous (`<network>.<containerID>`, plus
    /// `.<ifname>` for interfaces other than `eth0`): looked up, never written, so allocations
    /// made before the upgrade are still found ([`ident::legacy_handle`]).
    pub fn legacy_handle(&self) -> String {
        ident::legacy_handle(&self.network, &self.container_id, &self.ifname)
    }
}

/// What addresses to allocate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamRequest {
    pub assign_ipv4: bool,
    pub assign_ipv6: bool,
    /// Restrict IPv4 allocation to these pools (names or CIDRs); empty means any usable pool.
    #[serde(default)]
    pub ipv4_pools: Vec<String>,
    #[serde(default)]
    pub ipv6_pools: Vec<String>,
    /// Specific addresses requested (runtimeConfig.ips, CNI_ARGS IP=, args.cni.ips), without prefix.
    #[serde(default)]
    pub requested: Vec<String>,
    /// The network configuration's `feature_control.ip_addrs_no_ipam` (Calico's gate of the
    /// `ipAddrsNoIpam` pod annotation); absent from older plugins' requests.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ip_addrs_no_ipam: bool,
}

impl Default for IpamRequest {
    fn default() -> Self {
        IpamRequest {
            assign_ipv4: true,
            assign_ipv6: false,
            ipv4_pools: vec![],
            ipv6_pools: vec![],
            requested: vec![],
            ip_addrs_no_ipam: false,
        }
    }
}

/// An address given to an interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR form, e.g. "10.244.0.5/32".
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into the result's interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub mac: String,
    /// Netns path for a container-side interface, empty for a host-side one.
    #[serde(default)]
    pub sandbox: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// A CNI result in tern's internal form; the plugin renders it in the runtime's version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// A named container port of a pod (from `args.cni.ports`), which policies may reference by
/// name; the agent records it in the WorkloadEndpoint's `spec.ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPort {
    /// IANA service name, e.g. `http`.
    pub name: String,
    /// Port number in the pod.
    pub port: u16,
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
}

fn default_protocol() -> String {
    "TCP".to_string()
}

/// ADD of a pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRequest {
    pub attachment: Attachment,
    /// Pod MTU; 0 means the agent decides (underlay MTU minus encapsulation).
    #[serde(default)]
    pub mtu: u32,
    pub ipam: IpamRequest,
    /// Addresses already allocated by a delegated IPAM plugin (e.g. host-local); when set the
    /// agent does not allocate.
    #[serde(default)]
    pub delegated_ips: Option<Vec<IpConfig>>,
    /// Pod interface MAC requested by runtimeConfig.mac.
    #[serde(default)]
    pub mac: Option<String>,
    /// `container_settings.allow_ip_forwarding`.
    #[serde(default)]
    pub allow_ip_forwarding: bool,
    /// Pod labels (from `args.cni.labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Named container ports (from `args.cni.ports`); absent from older plugins' requests.
    #[serde(default)]
    pub ports: Vec<NamedPort>,
}

impl AddRequest {
    /// ADD of `attachment` with everything else left to the agent: its MTU, its IPAM with
    /// the default request, no delegated addresses, MAC, labels or ports.
    pub fn new(attachment: Attachment) -> AddRequest {
        AddRequest {
            attachment,
            mtu: 0,
            ipam: IpamRequest::default(),
            delegated_ips: None,
            mac: None,
            allow_ip_forwarding: false,
            labels: BTreeMap::new(),
            ports: Vec::new(),
        }
    }
}

/// DEL of a pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelRequest {
    pub attachment: Attachment,
    /// True when IPAM is delegated: the agent must not release tern IPAM addresses.
    #[serde(default)]
    pub delegated_ipam: bool,
}

/// CHECK of a pod interface against the previous result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRequest {
    pub attachment: Attachment,
    #[serde(default)]
    pub prev_result: Option<NetResult>,
}

/// CNI GC: release everything of `network` not in `valid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    pub network: String,
    /// (containerID, ifname) pairs still in use.
    pub valid: Vec<(String, String)>,
    /// True when IPAM is delegated (the agent only removes endpoints, not allocations).
    #[serde(default)]
    pub delegated_ipam: bool,
}

/// Standalone IPAM (`tern-ipam` under another main plugin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpamAddRequest {
    pub attachment: Attachment,
    pub ipam: IpamRequest,
}

/// Every request ternd serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Add(AddRequest),
    Del(DelRequest),
    Check(CheckRequest),
    Status,
    Gc(GcRequest),
    IpamAdd(IpamAddRequest),
    IpamDel(Attachment),
    IpamCheck(Attachment),
    /// The node's BGP sessions (`ternctl node status`).
    BgpStatus,
    /// The node's flow records (`ternctl flows`).
    Flows(flow::FlowQuery),
    /// The node's per-minute aggregates of flow records (`ternctl flows --aggregate`).
    FlowAggregates(flow::AggregateQuery),
}

/// A BGP session's state as BIRD names its protocols' (and calicoctl prints them): `up` when
/// the session is Established, else `start`. On the wire and on screen as those words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerState {
    /// Established.
    Up,
    /// Any other FSM state.
    Start,
}

impl PeerState {
    /// The word `ternctl node status` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Up => "up",
            PeerState::Start => "start",
        }
    }
}

impl std::fmt::Display for PeerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One BGP session in the agent's answer to `BgpStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpPeerStatus {
    /// The peer's address.
    pub address: std::net::IpAddr,
    /// `node-to-node mesh`, `global` or `node specific` (as calicoctl prints them).
    pub peer_type: String,
    /// `up` when Established, else `start` (BIRD's protocol states, as calicoctl prints them).
    pub state: PeerState,
    /// Seconds since the Unix epoch when the session entered its current FSM state.
    pub since_unix: u64,
    /// The FSM state (`Established`, `Active`, ...), followed by the last notable event.
    pub info: String,
}

/// The agent's answer to `BgpStatus`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpStatusReply {
    /// False when the agent runs without BGP (`ternd` without `--bgp`).
    pub enabled: bool,
    /// The node's AS and router ID, when BGP runs.
    #[serde(default)]
    pub asn: u32,
    #[serde(default)]
    pub router_id: String,
    /// Every configured session.
    pub peers: Vec<BgpPeerStatus>,
}

/// The agent's answer to `Status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReply {
    pub node: String,
    /// True when the store is reachable.
    pub store_ok: bool,
    /// Names of pools that can serve workload allocations on this node.
    pub usable_pools: Vec<String>,
    pub endpoints: usize,
}

/// A successful reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reply {
    /// ADD, IpamAdd.
    Result(NetResult),
    /// DEL, CHECK, GC, IpamDel, IpamCheck.
    Done,
    Status(StatusReply),
    /// BgpStatus.
    BgpStatus(BgpStatusReply),
    /// Flows.
    Flows(flow::FlowReply),
    /// FlowAggregates.
    FlowAggregates(flow::AggregateReply),
}

/// A failed request, carrying the CNI error code to report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub code: u32,
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

pub type Response = std::result::Result<Reply, ErrorReply>;

/// Most file descriptors one received frame can hold in its control buffer. A request carries at
/// most one; any beyond this many are closed by the kernel (`MSG_CTRUNC`), the ones that fit are
/// returned in [`Frame::fds`] so the receiver can close them and refuse the request.
pub const MAX_FDS_RECEIVED: usize = 8;

/// One frame as received: its body and every file descriptor that came with any of its bytes.
#[derive(Debug)]
pub struct Frame {
    /// The JSON body.
    pub body: Vec<u8>,
    /// Every descriptor received with the frame (normally zero or one). Dropping the frame
    /// closes them.
    pub fds: Vec<OwnedFd>,
    /// True when the sender passed more descriptors than [`MAX_FDS_RECEIVED`] (the kernel
    /// closed the rest).
    pub fds_truncated: bool,
}

/// Why [`read_frame_limited`] returned no frame.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection before the first byte.
    Closed,
    /// The length prefix announces more than the limit; nothing of the body was read.
    TooLarge {
        /// Length announced by the prefix.
        len: usize,
        /// The receiver's limit.
        max: usize,
    },
    /// The whole frame did not arrive within the deadline.
    Deadline(Duration),
    /// More than one file descriptor arrived with the frame (a request carries at most one).
    /// The read stops at once and every descriptor received is closed, so a sender cannot
    /// pile descriptors up in the receiver (one byte per `sendmsg`, each with 8 descriptors).
    TooManyFds {
        /// Descriptors received before the read stopped (at most [`MAX_FDS_RECEIVED`]).
        received: usize,
        /// True when the kernel or the receiver closed more than those.
        truncated: bool,
    },
    /// The connection broke (or ended mid-frame).
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::TooManyFds {
                received,
                truncated,
            } => write!(
                f,
                "{received}{} file descriptors came with one frame; at most one is allowed",
                if *truncated { "+" } else { "" }
            ),
            FrameError::TooLarge { len, max } => write!(
                f,
                "frame of {len} bytes is over the limit of {max} bytes (tern_api::MAX_FRAME)"
            ),
            FrameError::Deadline(d) => {
                // Rounded: the deadline is measured from slightly before the first read.
                write!(
                    f,
                    "the request did not arrive within {} ms",
                    d.as_micros().div_ceil(1000)
                )
            }
            FrameError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<FrameError> for io::Error {
    fn from(e: FrameError) -> io::Error {
        match e {
            FrameError::Io(e) => e,
            FrameError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, e.to_string()),
            FrameError::TooLarge { .. } | FrameError::TooManyFds { .. } => {
                io::Error::new(io::ErrorKind::InvalidData, e.to_string())
            }
            FrameError::Deadline(_) => io::Error::new(io::ErrorKind::TimedOut, e.to_string()),
        }
    }
}

fn too_large(len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "frame of {len} bytes is over the limit of {MAX_FRAME} bytes (tern_api::MAX_FRAME)"
        ),
    )
}

/// Writes one frame, with `fd` attached as SCM_RIGHTS when given.
pub fn write_frame(stream: &UnixStream, body: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    match fd {
        Some(fd) => write_frame_fds(stream, body, &[fd]),
        None => write_frame_fds(stream, body, &[]),
    }
}

/// Writes one frame with any number of descriptors attached to its first bytes. Only tests and
/// fuzzers need more than one: the agent refuses such a request.
pub fn write_frame_fds(stream: &UnixStream, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(too_large(body.len()));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    let mut off = 0;
    if !fds.is_empty() {
        off = send_with_fds(stream, &buf, fds)?;
    }
    (&*stream).write_all(&buf[off..])
}

/// A zeroed control-message buffer of at least `space` bytes, in u64 elements: it must be
/// aligned for `cmsghdr`.
fn control_buffer(space: usize) -> Vec<u64> {
    vec![0u64; space.div_ceil(8)]
}

/// A `msghdr` over the one buffer `iov` with the first `space` bytes of `control` as its
/// control buffer. The caller keeps both alive across the `sendmsg`/`recvmsg` it is used for.
fn one_iov_msghdr(iov: &mut libc::iovec, control: &mut [u64], space: usize) -> libc::msghdr {
    debug_assert!(space <= std::mem::size_of_val(control));
    // SAFETY: msghdr is plain data, for which all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut _;
    msg.msg_controllen = space as _;
    msg
}

fn send_with_fds(stream: &UnixStream, buf: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    let mut cmsg_buf = control_buffer(space);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // Every pointer in it (iov, cmsg_buf) outlives the sendmsg call.
    let msg = one_iov_msghdr(&mut iov, &mut cmsg_buf, space);
    // SAFETY: the control buffer has room for one cmsg carrying `fds.len()` descriptors
    // (CMSG_SPACE above); the data is written unaligned.
    let n = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
        let data = libc::CMSG_DATA(cmsg) as *mut RawFd;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), *fd);
        }
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Reads one frame and the file descriptor that came with it, if any (at most [`MAX_FRAME`]
/// bytes, within the stream's own read timeout). More than one descriptor is an error, and every
/// descriptor received is closed.
pub fn read_frame(stream: &UnixStream) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut f = read_frame_limited(stream, MAX_FRAME, None)?;
    if f.fds.len() > 1 || f.fds_truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} file descriptors came with one frame; at most one is allowed",
                f.fds.len()
            ),
        ));
    }
    Ok((f.body, f.fds.pop()))
}

/// Reads one frame of at most `max` bytes. With a `deadline`, the whole frame must arrive by
/// then whatever the pace of the sender (each read waits at most until the deadline); without
/// one, each read waits as long as the stream's read timeout. Every descriptor that arrives
/// with any byte of the frame is returned (or closed, when an error is returned), so a
/// hostile sender cannot make the receiver leak descriptors. The body buffer grows with the
/// bytes actually received, not with the announced length.
pub fn read_frame_limited(
    stream: &UnixStream,
    max: usize,
    deadline: Option<Instant>,
) -> Result<Frame, FrameError> {
    let started = Instant::now();
    let mut frame = Frame {
        body: Vec::new(),
        fds: Vec::new(),
        fds_truncated: false,
    };
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = recv_part(stream, &mut head[got..], &mut frame, deadline, started)?;
        if n == 0 {
            return Err(if got == 0 {
                FrameError::Closed
            } else {
                FrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside the length prefix",
                ))
            });
        }
        got += n;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut chunk = vec![0u8; len.min(64 << 10)];
    while frame.body.len() < len {
        let want = (len - frame.body.len()).min(chunk.len());
        let n = recv_part(stream, &mut chunk[..want], &mut frame, deadline, started)?;
        if n == 0 {
            return Err(FrameError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed after {} of {len} bytes",
                    frame.body.len()
                ),
            )));
        }
        frame.body.extend_from_slice(&chunk[..n]);
    }
    Ok(frame)
}

/// One `recvmsg` into `buf`, collecting descriptors into `frame`; retries EINTR, honours the
/// deadline.
fn recv_part(
    stream: &UnixStream,
    buf: &mut [u8],
    frame: &mut Frame,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<usize, FrameError> {
    loop {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FrameError::Deadline(d.saturating_duration_since(started)));
            }
            stream
                .set_read_timeout(Some(left))
                .map_err(FrameError::Io)?;
        }
        match recv_with_fds(stream, buf, frame) {
            // A second descriptor ends the read: the frame is refused whatever else comes,
            // and its descriptors are closed now rather than held until the frame completes.
            Ok(_) if frame.fds.len() > 1 || frame.fds_truncated => {
                let e = FrameError::TooManyFds {
                    received: frame.fds.len(),
                    truncated: frame.fds_truncated,
                };
                frame.fds.clear();
                return Err(e);
            }
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if deadline.is_some()
                    && matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
            {
                // The loop's deadline check decides whether time is up.
                continue;
            }
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
}

fn recv_with_fds(stream: &UnixStream, buf: &mut [u8], frame: &mut Frame) -> io::Result<usize> {
    let fd_size = std::mem::size_of::<RawFd>();
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS_RECEIVED * fd_size) as u32) } as usize;
    let mut cmsg_buf = control_buffer(space);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // As in send_with_fds; the kernel writes at most `space` control bytes.
    let mut msg = one_iov_msghdr(&mut iov, &mut cmsg_buf, space);
    // SAFETY: recvmsg on our socket with buffers we own.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        frame.fds_truncated = true;
    }
    // SAFETY: walking the control messages the kernel filled in; every descriptor of every
    // SCM_RIGHTS message is taken into an OwnedFd (so it is closed unless the caller keeps it).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header) / fd_size;
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    if raw >= 0 {
                        let fd = OwnedFd::from_raw_fd(raw);
                        if frame.fds.len() < MAX_FDS_RECEIVED {
                            frame.fds.push(fd);
                        } else {
                            // Closed here (drop): the frame never holds more than the cap.
                            frame.fds_truncated = true;
                        }
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}

/// Errors of a client call.
#[derive(Debug)]
pub enum CallError {
    /// The agent's socket is absent or refuses connections: ternd is not running.
    AgentDown(String),
    /// The socket exists but this caller may not use it (permission denied).
    Denied(String),
    /// The request is larger than the agent accepts ([`MAX_FRAME`]); nothing was sent.
    TooLarge {
        /// Size of the encoded request.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The connection broke or the reply could not be decoded.
    Io(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::AgentDown(m) | CallError::Denied(m) | CallError::Io(m) => f.write_str(m),
            CallError::TooLarge { len, max } => write!(
                f,
                "the request to ternd is {len} bytes, over the limit of {max} bytes (tern_api::MAX_FRAME)"
            ),
        }
    }
}

/// Sends one request to the agent and waits for its response.
pub fn call(
    socket: &Path,
    req: &Request,
    fd: Option<RawFd>,
    timeout: Duration,
) -> std::result::Result<Response, CallError> {
    let body = serde_json::to_vec(req).map_err(|e| CallError::Io(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(CallError::TooLarge {
            len: body.len(),
            max: MAX_FRAME,
        });
    }
    let stream = UnixStream::connect(socket).map_err(|e| {
        let m = format!("cannot connect to ternd at {}: {e}", socket.display());
        match e.kind() {
            io::ErrorKind::PermissionDenied => CallError::Denied(m),
            _ => CallError::AgentDown(m),
        }
    })?;
    let io = |e: io::Error| CallError::Io(format!("ternd at {}: {e}", socket.display()));
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    if let Err(e) = write_frame(&stream, &body, fd) {
        // The agent may have answered and closed before reading (a refused caller, a busy
        // node): that answer says more than the broken pipe.
        if !matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            return Err(io(e));
        }
        return match read_frame(&stream) {
            Ok((reply, _)) => serde_json::from_slice(&reply)
                .map_err(|e| CallError::Io(format!("bad reply from ternd: {e}"))),
            Err(_) => Err(io(e)),
        };
    }
    match read_frame(&stream) {
        Ok((reply, _)) => serde_json::from_slice(&reply)
            .map_err(|e| CallError::Io(format!("bad reply from ternd: {e}"))),
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Read;

    #[test]
    fn peer_state_is_the_word_on_wire_and_screen() {
        for (st, word) in [(PeerState::Up, "up"), (PeerState::Start, "start")] {
            assert_eq!(serde_json::to_string(&st).unwrap(), format!("\"{word}\""));
            assert_eq!(
                serde_json::from_str::<PeerState>(&format!("\"{word}\"")).unwrap(),
                st
            );
            assert_eq!(st.to_string(), word);
        }
    }

    #[test]
    fn request_json_is_tagged() {
        let r = Request::Status;
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"op":"status"}"#);
        let resp: Response = Err(ErrorReply {
            code: 11,
            msg: "x".into(),
            details: String::new(),
        });
        let s = serde_json::to_string(&resp).unwrap();
        let back: Response = serde_json::from_str(&s).unwrap();
        assert_eq!(back, resp);
    }

    #[test]
    fn frame_carries_fd() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = File::open("/proc/self/status").unwrap();
        write_frame(&a, b"hello", Some(f.as_raw_fd())).unwrap();
        let (body, fd) = read_frame(&b).unwrap();
        assert_eq!(body, b"hello");
        let fd = fd.expect("fd passed");
        let mut s = String::new();
        File::from(fd).read_to_string(&mut s).unwrap();
        assert!(s.contains("Name:"));
    }

    #[test]
    fn a_second_fd_fails_the_read_and_read_frame_refuses_two() {
        let (a, b) = UnixStream::pair().unwrap();
        let f1 = File::open("/proc/self/status").unwrap();
        let f2 = File::open("/proc/self/stat").unwrap();
        write_frame_fds(&a, b"two", &[f1.as_raw_fd(), f2.as_raw_fd()]).unwrap();
        match read_frame_limited(&b, MAX_FRAME, None) {
            Err(FrameError::TooManyFds {
                received: 2,
                truncated: false,
            }) => {}
            other => panic!("expected TooManyFds, got {other:?}"),
        }
        let (a, b) = UnixStream::pair().unwrap();
        write_frame_fds(&a, b"two", &[f1.as_raw_fd(), f2.as_raw_fd()]).unwrap();
        let e = read_frame(&b).unwrap_err();
        assert!(e.to_string().contains("2 file descriptors"), "{e}");
    }

    #[test]
    fn more_fds_than_the_buffer_are_flagged() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = File::open("/proc/self/status").unwrap();
        let many = vec![f.as_raw_fd(); MAX_FDS_RECEIVED + 5];
        write_frame_fds(&a, b"x", &many).unwrap();
        match read_frame_limited(&b, MAX_FRAME, None) {
            Err(FrameError::TooManyFds {
                received,
                truncated: true,
            }) => assert!(received <= MAX_FDS_RECEIVED),
            other => panic!("expected TooManyFds, got {other:?}"),
        }
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// The review's attack: announce 1 MiB, then send it one byte per `sendmsg`, each byte with
    /// 8 descriptors. The read fails at the first chunk and the receiver's descriptor count
    /// stays flat (it used to hold 8 per byte until the frame completed).
    #[test]
    fn one_byte_chunks_with_eight_fds_each_do_not_pile_up() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = File::open("/proc/self/status").unwrap();
        let eight = [f.as_raw_fd(); 8];
        (&a).write_all(&(1u32 << 20).to_be_bytes()).unwrap();
        for _ in 0..50 {
            send_with_fds(&a, b"x", &eight).unwrap();
        }
        let before = open_fds();
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = read_frame_limited(&b, MAX_FRAME, Some(deadline)).unwrap_err();
        assert!(
            matches!(e, FrameError::TooManyFds { received, .. } if received <= MAX_FDS_RECEIVED),
            "{e:?}"
        );
        assert!(
            open_fds() <= before,
            "descriptors grew from {before} to {}",
            open_fds()
        );
    }

    #[test]
    fn an_announced_length_over_the_limit_is_refused_unread() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&(16u32 << 20).to_be_bytes()).unwrap();
        match read_frame_limited(&b, MAX_FRAME, None) {
            Err(FrameError::TooLarge { len, max }) => {
                assert_eq!((len, max), (16 << 20, MAX_FRAME));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        let e = write_frame(&a, &vec![b' '; MAX_FRAME + 1], None).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
    }

    #[test]
    fn a_slow_sender_meets_the_whole_request_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            (&a).write_all(&10u32.to_be_bytes()).unwrap();
            // One byte every 100 ms: each read is quick, the whole is not.
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(100));
                if (&a).write_all(b"x").is_err() {
                    return;
                }
            }
        });
        let t0 = Instant::now();
        let r = read_frame_limited(&b, MAX_FRAME, Some(t0 + Duration::from_millis(350)));
        let took = t0.elapsed();
        assert!(matches!(r, Err(FrameError::Deadline(_))), "{r:?}");
        assert!(took < Duration::from_millis(600), "took {took:?}");
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn call_reports_an_oversized_request_as_such() {
        let req = Request::IpamDel(Attachment {
            network: "n".repeat(MAX_FRAME),
            ..Default::default()
        });
        let e = call(
            Path::new("/nonexistent/ternd.sock"),
            &req,
            None,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, CallError::TooLarge { .. }), "{e:?}");
        assert!(e.to_string().contains("over the limit"), "{e}");
    }

    #[test]
    fn frame_without_fd() {
        let (a, b) = UnixStream::pair().unwrap();
        write_frame(&a, b"{}", None).unwrap();
        let (body, fd) = read_frame(&b).unwrap();
        assert_eq!(body, b"{}");
        assert!(fd.is_none());
    }

    #[test]
    fn add_request_without_ports_still_parses() {
        // An older plugin's ADD has no `ports` (nor `labels`); a newer agent must accept it.
        let old = r#"{"op":"add","attachment":{"network":"n","container_id":"c","ifname":"eth0"},
                      "ipam":{"assign_ipv4":true,"assign_ipv6":false}}"#;
        let Request::Add(a) = serde_json::from_str::<Request>(old).unwrap() else {
            panic!("not an ADD")
        };
        assert!(a.ports.is_empty() && a.labels.is_empty());
        let with = Request::Add(AddRequest {
            ports: vec![NamedPort {
                name: "http".into(),
                port: 8080,
                protocol: "TCP".into(),
            }],
            ..a
        });
        let back: Request = serde_json::from_str(&serde_json::to_string(&with).unwrap()).unwrap();
        assert_eq!(back, with);
        let p: NamedPort = serde_json::from_str(r#"{"name":"dns","port":53}"#).unwrap();
        assert_eq!(p.protocol, "TCP");
    }

    #[test]
    fn handle_is_escaped_network_container_ifname() {
        let a = Attachment {
            network: "k8s-pod-network".into(),
            container_id: "abc".into(),
            ..Default::default()
        };
        assert_eq!(a.handle(), "k8s-pod-network:eth0.abc");
        assert_eq!(a.legacy_handle(), "k8s-pod-network.abc");
        // Pod x.net1's eth0 and pod x's net1 shared `n.x.net1`.
        let x_net1 = Attachment {
            network: "n".into(),
            container_id: "x.net1".into(),
            ifname: "eth0".into(),
            ..Default::default()
        };
        let x = Attachment {
            container_id: "x".into(),
            ifname: "net1".into(),
            ..x_net1.clone()
        };
        assert_eq!(x_net1.legacy_handle(), x.legacy_handle());
        assert_ne!(x_net1.handle(), x.handle());
    }
}
