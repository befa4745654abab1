//! ternd's unix-socket API, shared by the CNI plugins (`tern`, `tern-ipam`), `ternctl` and `ternd`.
//!
//! One request per connection. A frame is a 4-byte big-endian length followed by a JSON body. A
//! request may carry one file descriptor (the pod's network namespace) as SCM_RIGHTS ancillary
//! data on its first byte, so the agent needs no access to the runtime's paths or PID namespace.
//!
//! Addresses travel as strings ("10.244.0.5/32", "169.254.1.1") so this crate stays free of
//! networking dependencies.

pub mod journal;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Default path of ternd's socket.
pub const DEFAULT_SOCKET: &str = "/run/tern/ternd.sock";
/// Default state directory shared by the plugin and the agent (release journal, endpoint status).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/tern";
/// Largest frame either side accepts.
pub const MAX_FRAME: usize = 16 << 20;

/// The Kubernetes identity of a pod, from `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub infra_container_id: String,
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
    /// The IPAM handle of this attachment: `<network>.<containerID>`, as Calico names it; a
    /// second interface of the same container gets its own handle (`<network>.<containerID>.<ifname>`)
    /// so each interface is released independently.
    pub fn handle(&self) -> String {
        if self.ifname == "eth0" || self.ifname.is_empty() {
            format!("{}.{}", self.network, self.container_id)
        } else {
            format!("{}.{}.{}", self.network, self.container_id, self.ifname)
        }
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
}

impl Default for IpamRequest {
    fn default() -> Self {
        IpamRequest {
            assign_ipv4: true,
            assign_ipv6: false,
            ipv4_pools: vec![],
            ipv6_pools: vec![],
            requested: vec![],
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
}

/// One BGP session in the agent's answer to `BgpStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BgpPeerStatus {
    /// The peer's address.
    pub address: std::net::IpAddr,
    /// `node-to-node mesh`, `global` or `node specific` (as calicoctl prints them).
    pub peer_type: String,
    /// `up` when Established, else `start` (BIRD's protocol states, as calicoctl prints them).
    pub state: String,
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

/// Writes one frame, with `fd` attached as SCM_RIGHTS when given.
pub fn write_frame(stream: &UnixStream, body: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "frame too large",
        ));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    let mut off = 0;
    if let Some(fd) = fd {
        off = send_with_fd(stream, &buf, fd)?;
    }
    (&*stream).write_all(&buf[off..])
}

fn send_with_fd(stream: &UnixStream, buf: &[u8], fd: RawFd) -> io::Result<usize> {
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cmsg_buf = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr() as *mut _;
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one cmsg carrying one fd (CMSG_SPACE above).
    let n = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Reads one frame and the file descriptor that came with it, if any.
pub fn read_frame(stream: &UnixStream) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut head = [0u8; 4];
    let (n, fd) = recv_with_fd(stream, &mut head)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    if n < 4 {
        (&*stream).read_exact(&mut head[n..])?;
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut body = vec![0u8; len];
    (&*stream).read_exact(&mut body)?;
    Ok((body, fd))
}

fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cmsg_buf = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // SAFETY: as in send_with_fd; the kernel writes at most `space` control bytes.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg_buf.as_mut_ptr() as *mut _;
    msg.msg_controllen = space as _;
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fd = None;
    // SAFETY: walking the control messages the kernel filled in.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const RawFd);
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, fd))
}

/// Errors of a client call.
#[derive(Debug)]
pub enum CallError {
    /// The agent's socket is absent or refuses connections: ternd is not running.
    AgentDown(String),
    /// The connection broke or the reply could not be decoded.
    Io(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::AgentDown(m) | CallError::Io(m) => f.write_str(m),
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
    let stream = UnixStream::connect(socket).map_err(|e| {
        CallError::AgentDown(format!(
            "cannot connect to ternd at {}: {e}",
            socket.display()
        ))
    })?;
    let io = |e: io::Error| CallError::Io(format!("ternd at {}: {e}", socket.display()));
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let body = serde_json::to_vec(req).map_err(|e| CallError::Io(e.to_string()))?;
    write_frame(&stream, &body, fd).map_err(io)?;
    let (reply, _) = read_frame(&stream).map_err(io)?;
    serde_json::from_slice(&reply).map_err(|e| CallError::Io(format!("bad reply from ternd: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

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
    fn handle_is_network_dot_container() {
        let a = Attachment {
            network: "k8s-pod-network".into(),
            container_id: "abc".into(),
            ..Default::default()
        };
        assert_eq!(a.handle(), "k8s-pod-network.abc");
    }
}
