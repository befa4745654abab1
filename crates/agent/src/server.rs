//! The socket server, the agent's trust boundary: it binds the socket (`0660
//! root:<socket_group>`), checks each caller's peer credentials, bounds the connections served
//! at once, the request's size and the time to send it, decodes the request, checks its
//! identifiers and descriptors, and dispatches it to the service that serves it (the pod
//! lifecycle, [`crate::pod`], for every CNI and IPAM operation). It holds no state of the
//! services.

use crate::agent::Agent;
use anyhow::Context;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tern_api::{Attachment, ErrorReply, FrameError, Request, Response};
use tern_cni::code;

pub use crate::pod::check_netns_fd;

pub use crate::config::MAX_CONNECTIONS;
/// Time a client has to send its whole request, however it paces the bytes.
pub const REQUEST_READ_DEADLINE: Duration = Duration::from_secs(10);
/// Time the agent waits for a client to take its reply.
const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Error code of a caller refused by the peer-credential check (tern's codes start at 100;
/// 100-104 are the agent's request errors in [`tern_cni::code`]).
pub const CODE_NOT_PERMITTED: u32 = 110;
/// `SO_PEERGROUPS` (Linux 4.13): the peer's supplementary groups at connect time.
const SO_PEERGROUPS: libc::c_int = 59;

impl Agent {
    /// Binds the socket and serves until [`Agent::shutdown`]; also runs the maintenance loop.
    ///
    /// The socket is the agent's trust boundary: it is created `0660 root:<socket_group>`
    /// whatever the umask, each connection's peer credentials are checked (uid 0, the agent's
    /// own uid, or a member of `socket_group`), at most `max_connections` are served at once,
    /// each must deliver its request within [`REQUEST_READ_DEADLINE`], and every descriptor it
    /// passes is checked (see `Agent::serve_stream`).
    pub fn serve(self: &Arc<Self>) -> anyhow::Result<()> {
        let listener = bind(&self.cfg.socket, self.cfg.socket_group)?;
        log::info!(
            "listening on {} (mode 0660, group {})",
            self.cfg.socket.display(),
            self.cfg.socket_group
        );
        self.start_http();
        self.start_maintenance()?;
        self.accept_loop(&listener);
        Ok(())
    }

    /// Serves connections of an already bound `listener` until [`Agent::shutdown`] (which wakes
    /// it by connecting to `cfg.socket`). Public for tests that bind the socket themselves.
    pub fn accept_loop(self: &Arc<Self>, listener: &UnixListener) {
        for conn in listener.incoming() {
            if self.stopping() {
                break;
            }
            match conn {
                Ok(stream) => self.accept(stream),
                Err(e) => {
                    log::warn!("accept failed: {e}");
                    // EMFILE and friends: do not spin.
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// Admits one connection: checks its credentials and the connection cap (both answered at
    /// once, without reading, so the accept loop never waits on a client), then serves it on a
    /// thread of its own.
    fn accept(self: &Arc<Self>, stream: UnixStream) {
        if let Err(e) = self.authorize(&stream) {
            self.gate
                .refusals
                .warn(&format!("refused a caller: {}", e.msg));
            refuse(stream, e);
            return;
        }
        let limit = self.cfg.max_connections.max(1);
        let prev = self.gate.connections.fetch_add(1, Ordering::AcqRel);
        if prev >= limit {
            self.gate.connections.fetch_sub(1, Ordering::AcqRel);
            let msg = format!(
                "ternd is busy: {prev} requests are being served (limit {limit}, --max-connections); retry"
            );
            self.gate.refusals.warn(&msg);
            refuse(
                stream,
                ErrorReply {
                    code: code::TRY_AGAIN_LATER,
                    msg,
                    details: String::new(),
                },
            );
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("request".into())
            .spawn(move || {
                // Gives the slot back even if serving panics.
                struct Slot<'a>(&'a AtomicUsize);
                impl Drop for Slot<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                let _slot = Slot(&me.gate.connections);
                me.serve_stream(stream);
            });
        if let Err(e) = spawned {
            self.gate.connections.fetch_sub(1, Ordering::AcqRel);
            log::error!("cannot spawn request thread: {e}");
        }
    }

    /// The peer-credential check: uid 0, the agent's own uid, or a member (primary or
    /// supplementary) of the configured socket group.
    fn authorize(&self, stream: &UnixStream) -> Result<(), ErrorReply> {
        let denied = |msg: String| ErrorReply {
            code: CODE_NOT_PERMITTED,
            msg,
            details: String::new(),
        };
        let cred = peer_cred(stream.as_fd())
            .map_err(|e| denied(format!("cannot read the caller's credentials: {e}")))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let group = self.cfg.socket_group;
        if cred.uid == 0 || cred.uid == me || cred.gid == group {
            return Ok(());
        }
        if peer_groups(stream.as_fd()).is_ok_and(|g| g.contains(&group)) {
            return Ok(());
        }
        Err(denied(format!(
            "permission denied: uid {} (pid {}, gid {}) is neither root nor a member of group {group} (ternd --socket-group)",
            cred.uid, cred.pid, cred.gid
        )))
    }

    /// Reads one request (bounded by [`tern_api::MAX_FRAME`] and [`REQUEST_READ_DEADLINE`]),
    /// checks the descriptors that came with it, serves it and replies. ADD and CHECK must carry
    /// exactly one descriptor, a network namespace other than the host's; every other request
    /// none. A refused request gets an error reply and every descriptor received is closed.
    fn serve_stream(&self, stream: UnixStream) {
        let _ = stream.set_write_timeout(Some(REPLY_WRITE_TIMEOUT));
        let deadline = Instant::now() + REQUEST_READ_DEADLINE;
        let frame = match tern_api::read_frame_limited(&stream, tern_api::MAX_FRAME, Some(deadline))
        {
            Ok(f) => f,
            Err(FrameError::Closed) => return,
            // Refused at the second descriptor, which the read has closed already.
            Err(e @ FrameError::TooManyFds { .. }) => {
                self.gate.refusals.warn(&format!("refused a request: {e}"));
                reply(
                    &stream,
                    &Err(ErrorReply {
                        code: code::INVALID_ENV,
                        msg: format!("CNI_NETNS: {e}; exactly one network namespace is expected"),
                        details: String::new(),
                    }),
                );
                return;
            }
            Err(e @ (FrameError::TooLarge { .. } | FrameError::Deadline(_))) => {
                let code = match e {
                    FrameError::TooLarge { .. } => code::INVALID_CONFIG,
                    _ => code::DECODE,
                };
                self.gate.refusals.warn(&format!("refused a request: {e}"));
                reply(
                    &stream,
                    &Err(ErrorReply {
                        code,
                        msg: format!("ternd refused the request: {e}"),
                        details: String::new(),
                    }),
                );
                return;
            }
            Err(e) => {
                log::debug!("dropping connection: {e}");
                return;
            }
        };
        let resp: Response = match serde_json::from_slice::<Request>(&frame.body) {
            Ok(req) => match self.check_fds(&req, frame.fds, frame.fds_truncated) {
                Ok(fd) => self.handle(req, fd),
                Err(e) => {
                    self.gate
                        .refusals
                        .warn(&format!("refused {}: {}", op_name(&req), e.msg));
                    Err(e)
                }
            },
            Err(e) => Err(ErrorReply {
                code: code::DECODE,
                msg: format!("cannot decode request: {e}"),
                details: String::new(),
            }),
        };
        reply(&stream, &resp);
    }

    /// The descriptor rule of the socket: ADD and CHECK carry one network namespace that is not
    /// the host's, other requests none. Errors are code 4 (CNI_NETNS); the descriptors of a
    /// refused request are closed when `fds` drops.
    fn check_fds(
        &self,
        req: &Request,
        mut fds: Vec<OwnedFd>,
        truncated: bool,
    ) -> Result<Option<OwnedFd>, ErrorReply> {
        let invalid = |msg: String| ErrorReply {
            code: code::INVALID_ENV,
            msg,
            details: String::new(),
        };
        let takes_netns = matches!(req, Request::Add(_) | Request::Check(_));
        if truncated || fds.len() > 1 {
            return Err(invalid(format!(
                "CNI_NETNS: {}{} file descriptors came with the request; exactly one network namespace is expected",
                fds.len(),
                if truncated { "+" } else { "" }
            )));
        }
        let Some(fd) = fds.pop() else {
            return Ok(None);
        };
        if !takes_netns {
            return Err(invalid(format!(
                "{} takes no file descriptor, one came with the request",
                op_name(req)
            )));
        }
        check_netns_fd(fd.as_fd(), self.pods().host_netns()).map_err(invalid)?;
        Ok(Some(fd))
    }

    /// The flow-record service, or the error a flows request gets when it is off.
    fn flow_service(&self) -> Result<&crate::flows::Flows, ErrorReply> {
        self.flows.as_deref().ok_or_else(|| ErrorReply {
            code: tern_cni::code::NOT_AVAILABLE,
            msg: format!(
                "flow records are off on node {} (ternd --flow-log-group, and the dataplane \
                 must run)",
                self.cfg.node_name
            ),
            details: String::new(),
        })
    }

    /// Serves one request. Public so tests can drive the agent without a socket. The socket
    /// server checks the request's descriptor before calling this (`Agent::serve_stream`);
    /// direct callers are trusted to pass a pod's network namespace.
    pub fn handle(&self, req: Request, fd: Option<OwnedFd>) -> Response {
        let started = std::time::Instant::now();
        let what = op_name(&req);
        let kind = op_kind(&req);
        // The plugin checks these identifiers; other socket callers are checked here, before
        // they name an endpoint, a store key or a handle.
        let ids = match &req {
            Request::Add(r) => Some(&r.attachment),
            Request::Del(r) => Some(&r.attachment),
            Request::Check(r) => Some(&r.attachment),
            Request::IpamAdd(r) => Some(&r.attachment),
            Request::IpamDel(a) | Request::IpamCheck(a) => Some(a),
            _ => None,
        };
        let checked = ids.map_or(Ok(()), check_attachment);
        let resp = match checked {
            Err(e) => Err(e),
            Ok(()) => match req {
                Request::Add(r) => self.pods().add(r, fd, self.pod_mtu()),
                Request::Del(r) => self.pods().del(r),
                Request::Check(r) => self.pods().check(r, fd),
                Request::Status => self.status(),
                Request::Gc(r) => self.pods().gc(r),
                Request::IpamAdd(r) => self.pods().ipam_add(r),
                Request::IpamDel(a) => self.pods().ipam_del(a),
                Request::IpamCheck(a) => self.pods().ipam_check(a),
                Request::BgpStatus => Ok(tern_api::Reply::BgpStatus(
                    self.bgp.as_ref().map(|b| b.status()).unwrap_or_default(),
                )),
                Request::Flows(q) => self
                    .flow_service()
                    .map(|f| tern_api::Reply::Flows(f.query(&q))),
                Request::FlowAggregates(q) => self
                    .flow_service()
                    .map(|f| tern_api::Reply::FlowAggregates(f.aggregate_reply(&q))),
            },
        };
        let result = if resp.is_ok() { "ok" } else { "error" };
        self.metrics
            .observe_request(kind, result, started.elapsed());
        match &resp {
            Ok(_) => {
                let took = started.elapsed();
                // Whole microseconds beside the `Debug` text, for tern-bench's split.
                log::debug!("{what} ok in {took:?} ({} us)", took.as_micros());
            }
            Err(e) => log::info!("{what} failed (code {}): {}", e.code, e.msg),
        }
        resp
    }
}

fn op_name(r: &Request) -> String {
    match r {
        Request::Add(a) => format!("ADD {}/{}", a.attachment.container_id, a.attachment.ifname),
        Request::Del(d) => format!("DEL {}/{}", d.attachment.container_id, d.attachment.ifname),
        Request::Check(c) => format!(
            "CHECK {}/{}",
            c.attachment.container_id, c.attachment.ifname
        ),
        Request::Status => "STATUS".into(),
        Request::Gc(g) => format!("GC {}", g.network),
        Request::IpamAdd(a) => format!("IPAM ADD {}", a.attachment.container_id),
        Request::IpamDel(a) => format!("IPAM DEL {}", a.container_id),
        Request::IpamCheck(a) => format!("IPAM CHECK {}", a.container_id),
        Request::BgpStatus => "BGP STATUS".into(),
        Request::Flows(_) => "FLOWS".into(),
        Request::FlowAggregates(_) => "FLOW AGGREGATES".into(),
    }
}

/// The `op` label of a request in the metrics.
fn op_kind(r: &Request) -> &'static str {
    match r {
        Request::Add(_) => "add",
        Request::Del(_) => "del",
        Request::Check(_) => "check",
        Request::Status => "status",
        Request::Gc(_) => "gc",
        Request::IpamAdd(_) => "ipam_add",
        Request::IpamDel(_) => "ipam_del",
        Request::IpamCheck(_) => "ipam_check",
        Request::BgpStatus => "bgp_status",
        Request::Flows(_) => "flows",
        Request::FlowAggregates(_) => "flow_aggregates",
    }
}

/// How long [`serving`] holds its probe connection open.
const LIVE_PROBE: Duration = Duration::from_secs(2);

/// Whether an agent serves the socket at `path`. Connecting is not enough: the listening
/// socket of an agent that was just killed outlives its main thread while its last threads
/// close their files, and the kernel queues connections on it until then. So the probe stays
/// connected for `wait`, sending nothing: a live agent holds the connection open (it waits
/// [`REQUEST_READ_DEADLINE`] for a request), a dying one resets or closes it when its
/// descriptors go. No connection at all is no agent.
fn serving(path: &std::path::Path, wait: Duration) -> bool {
    use std::io::Read;
    let Ok(mut s) = UnixStream::connect(path) else {
        return false;
    };
    if s.set_read_timeout(Some(wait)).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        // Closed or reset: the listener went away with its process.
        Ok(0) => false,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
        // Held open (or, unasked, it wrote): someone serves.
        _ => true,
    }
}

/// Binds the socket, replacing a stale socket file left by a previous run, but refusing to
/// steal the socket of a live agent. The socket is bound inside a fresh `0700` directory next
/// to `path`, given mode `0660` and group `group`, and only then renamed into place: it is never
/// reachable with a mode the umask chose. A parent directory this creates is `0755`.
pub fn bind(path: &std::path::Path, group: u32) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        // The umask may have removed bits a group member needs to reach the socket.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("setting the mode of {}", dir.display()))?;
    }
    if let Ok(md) = path.symlink_metadata() {
        use std::os::unix::fs::FileTypeExt;
        // Only a socket is ever replaced: a typo naming the store, a log or a directory must
        // not cost that file.
        if !md.file_type().is_socket() {
            anyhow::bail!(
                "--socket {}: the path exists and is not a socket; refusing to replace it",
                path.display()
            );
        }
        if serving(path, LIVE_PROBE) {
            anyhow::bail!("another ternd is already serving {}", path.display());
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "ternd.sock".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let private = dir.join(format!(".{file_name}.bind-{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let result = (|| -> anyhow::Result<UnixListener> {
        let tmp = private.join("s");
        let listener =
            UnixListener::bind(&tmp).with_context(|| format!("binding {}", tmp.display()))?;
        set_socket_owner(&tmp, group)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("setting mode 0660 on {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("moving the socket into place at {}", path.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    result
}

/// Gives the socket file the configured group (the owner stays the agent, root in production).
fn set_socket_owner(path: &std::path::Path, group: u32) -> anyhow::Result<()> {
    // SAFETY: getegid has no preconditions.
    if unsafe { libc::getegid() } == group {
        return Ok(());
    }
    match std::os::unix::fs::chown(path, None, Some(group)) {
        Ok(()) => Ok(()),
        // SAFETY: geteuid has no preconditions.
        Err(e) if unsafe { libc::geteuid() } != 0 => {
            // An unprivileged agent (development) cannot give its socket away; it stays
            // reachable only by its own user and group.
            log::warn!(
                "cannot give {} to group {group}: {e}; only this user can use it",
                path.display()
            );
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("giving {} to group {group}", path.display())),
    }
}

/// Sends a refusal without reading the request and closes the connection. Non-blocking: a
/// fresh connection's send buffer always has room for it, and the accept loop must never wait.
fn refuse(stream: UnixStream, e: ErrorReply) {
    let _ = stream.set_nonblocking(true);
    let out = serde_json::to_vec(&Response::Err(e)).unwrap_or_else(|_| b"{}".to_vec());
    let _ = tern_api::write_frame(&stream, &out, None);
}

fn reply(stream: &UnixStream, resp: &Response) {
    let out = serde_json::to_vec(resp).unwrap_or_else(|_| b"{}".to_vec());
    if let Err(e) = tern_api::write_frame(stream, &out, None) {
        log::warn!("cannot send reply: {e}");
    }
}

/// A caller's credentials as the kernel recorded them at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a unix socket.
pub fn peer_cred(fd: BorrowedFd<'_>) -> std::io::Result<PeerCred> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: fd is open for the call; cred is ours and len its size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// `SO_PEERGROUPS` of a unix socket: the caller's supplementary groups.
fn peer_groups(fd: BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: the buffer holds `len` bytes; the kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / 4);
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        // ERANGE: `len` now says how much room the list needs.
        if e.raw_os_error() == Some(libc::ERANGE) && (len as usize / 4) > groups.len() {
            groups.resize(len as usize / 4, 0);
            continue;
        }
        return Err(e);
    }
}

/// Checks an attachment's identifiers as the plugin does (tern-cni's environment rules), for
/// callers of the socket other than the plugin: they name WorkloadEndpoints, store keys and
/// handles, where a `/` or `:` would address another object. Container ID and network name
/// match `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`; the interface name is a Linux interface name; the
/// pod's namespace and name (kubelet's `K8S_POD_*`) are non-empty, at most 253 bytes, with
/// no `/`, `:`, whitespace or control character. Errors name the CNI field (code 4, or 7 for
/// the network name, which comes from the configuration).
pub fn check_attachment(a: &Attachment) -> Result<(), ErrorReply> {
    if !tern_cni::env::is_valid_id(&a.container_id) {
        return Err(coded(
            code::INVALID_ENV,
            format!(
                "invalid characters in containerID: CNI_CONTAINERID {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
                a.container_id
            ),
        ));
    }
    if !tern_cni::env::is_valid_id(&a.network) {
        return Err(coded(
            code::INVALID_CONFIG,
            format!(
                "name: network name {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
                a.network
            ),
        ));
    }
    tern_cni::env::validate_ifname(&a.ifname)
        .map_err(|why| coded(code::INVALID_ENV, format!("invalid CNI_IFNAME: {why}")))?;
    if let Some(p) = &a.pod {
        for (field, v) in [
            ("K8S_POD_NAMESPACE", &p.namespace),
            ("K8S_POD_NAME", &p.name),
        ] {
            let bad = v.is_empty()
                || v.len() > 253
                || v.chars()
                    .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
            if bad {
                return Err(coded(
                    code::INVALID_ENV,
                    format!(
                        "invalid CNI_ARGS: {field} {v:?} must be 1-253 bytes without '/', ':', whitespace or control characters"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn coded(code: u32, msg: String) -> ErrorReply {
    ErrorReply {
        code,
        msg,
        details: String::new(),
    }
}

#[cfg(test)]
mod attachment_tests {
    use super::*;

    #[test]
    fn attachment_identifiers_are_checked_like_the_plugin_does() {
        let ok = Attachment {
            network: "k8s-pod-network".into(),
            container_id: "abc123".into(),
            ifname: "eth0".into(),
            netns_path: String::new(),
            pod: Some(tern_api::PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                ..Default::default()
            }),
        };
        assert!(check_attachment(&ok).is_ok());
        let with = |f: &dyn Fn(&mut Attachment)| {
            let mut a = ok.clone();
            f(&mut a);
            check_attachment(&a).unwrap_err()
        };
        for (e, code, want) in [
            (
                with(&|a| a.container_id = "../x".into()),
                4,
                "CNI_CONTAINERID",
            ),
            (
                with(&|a| a.container_id = "a/b".into()),
                4,
                "CNI_CONTAINERID",
            ),
            (with(&|a| a.network = "n:1".into()), 7, "network name"),
            (with(&|a| a.ifname = "eth/0".into()), 4, "CNI_IFNAME"),
            (with(&|a| a.ifname = String::new()), 4, "CNI_IFNAME"),
            (
                with(&|a| a.pod.as_mut().unwrap().namespace = "a/b".into()),
                4,
                "K8S_POD_NAMESPACE",
            ),
            (
                with(&|a| a.pod.as_mut().unwrap().name = "web:0".into()),
                4,
                "K8S_POD_NAME",
            ),
        ] {
            assert_eq!(e.code, code, "{}", e.msg);
            assert!(e.msg.contains(want), "{} does not name {want}", e.msg);
        }
    }
}

#[cfg(test)]
mod bind_tests {
    /// `bind` replaces a stale socket but never a regular file or a directory at the path.
    #[test]
    fn bind_refuses_a_path_that_is_not_a_socket() {
        let dir = std::env::temp_dir().join(format!(
            "tern-bind-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        struct Cleanup(std::path::PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _c = Cleanup(dir.clone());
        // SAFETY: getgid has no preconditions.
        let gid = unsafe { libc::getgid() };
        let file = dir.join("store.db");
        std::fs::write(&file, b"precious").unwrap();
        let e = super::bind(&file, gid).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(super::bind(&sub, gid).is_err());
        assert!(sub.is_dir());
        // A stale socket (nobody listening) is replaced.
        let sock = dir.join("ternd.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let l = super::bind(&sock, gid).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
        // A live agent's socket (listening, accepting or not) is never taken.
        let e = super::bind(&sock, gid).unwrap_err().to_string();
        assert!(e.contains("already serving"), "{e}");
        drop(l);
    }

    /// A listener whose connections are closed as they come (an agent dying: its last
    /// threads still hold the socket) is not an agent serving; one that holds them is; a
    /// socket file nobody listens on is none.
    #[test]
    fn only_a_listener_that_holds_the_probe_serves() {
        use std::os::unix::net::UnixListener;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("ternd.sock");
        let l = UnixListener::bind(&sock).unwrap();
        let wait = Duration::from_millis(300);
        assert!(
            super::serving(&sock, wait),
            "a listener that holds the probe"
        );
        drop(l);
        assert!(!super::serving(&sock, wait), "no listener");
        let dying = dir.path().join("dying.sock");
        let l = UnixListener::bind(&dying).unwrap();
        let closer = std::thread::spawn(move || drop(l.accept().unwrap()));
        assert!(
            !super::serving(&dying, wait),
            "a listener closing the probe"
        );
        closer.join().unwrap();
    }
}
