//! The agent's own test helpers, beside tern-testkit's harnesses (namespaces, `ternd`, polling,
//! the API server: `tern_testkit::{netns, ternd, wait, kube_api}`): the `tern` plugin run as a
//! runtime runs it, UDP and TCP probes between namespaces, an in-process agent's configuration,
//! the raw socket client the trust tests probe with, and (`kube`) pods and ternd's records
//! for the Kubernetes tests.

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

pub mod kube;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tern_testkit::netns::Netns;

/// p50, p99 and max of `v` in milliseconds (`v` not empty).
pub fn pctl(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p99 = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (ms(v[v.len() / 2]), ms(v[p99]), ms(v[v.len() - 1]))
}

/// A TCP connection from namespace `from` to a listener on `to_ip` in `to`, one byte each way
/// (3 s to connect and to answer).
pub fn tcp_echo(from: &Netns, to: &Netns, to_ip: IpAddr) -> Result<(), String> {
    let l = to
        .run(|| TcpListener::bind(SocketAddr::new(to_ip, 0)))
        .map_err(|e| e.to_string())?;
    let addr = l.local_addr().unwrap();
    let acc = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
        s.write_all(&b)
    });
    let res = (|| {
        let mut c = from
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        c.write_all(b"x").map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        c.read_exact(&mut b).map_err(|e| e.to_string())
    })();
    if res.is_err() {
        // Unblock the acceptor so the thread ends.
        let _ = to.run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(1)));
    }
    let _ = acc.join();
    res
}

/// Where the reference CNI plugins (host-local) are installed.
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

/// `ip netns exec NETNS PLUGIN` as a runtime runs a CNI plugin: a clean environment but for
/// PATH, `CNI_COMMAND=cmd` and CNI_PATH (the plugin's directory, then the reference plugins').
/// The sandbox's variables are the caller's.
pub fn cni_command(netns: &str, plugin: &Path, cmd: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns])
        .arg(plugin)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", cmd)
        .env(
            "CNI_PATH",
            format!("{}:{REFERENCE_PLUGINS}", plugin.parent().unwrap().display()),
        );
    c
}

/// Runs `cmd` with `input` on its stdin and its stdout and stderr captured.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// The `ternd` cargo built for tern-agent's tests.
pub fn cargo_ternd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ternd"))
}

/// The `tern` plugin, built next to ternd (checked current: tern-testkit's
/// `workspace_binaries`).
pub fn tern_plugin() -> PathBuf {
    tern_testkit::workspace_binaries(&cargo_ternd()).join("tern")
}

/// The configuration of an in-process agent with its files under `dir` (socket, state), the
/// store URL it reports, a default pool and an MTU of 1500 (no route lookup).
pub fn agent_config(dir: &Path, store_url: &str, pool: &str) -> tern_agent::AgentConfig {
    let mut cfg = tern_agent::AgentConfig::new("n1", store_url, dir.join("ternd.sock"));
    cfg.state_dir = dir.join("state");
    cfg.default_ipv4_pool = pool.into();
    cfg.mtu = 1500;
    cfg
}

/// Sets `lo` up in the calling thread's namespace (a fresh one starts with it down).
pub fn lo_up() {
    let mut h = tern_linux::netlink::Handle::new().unwrap();
    let lo = h.link_by_name("lo").unwrap().unwrap();
    h.set_link_up(lo.index).unwrap();
}

/// A pod attachment on `k8s-pod-network` (pod `default/pod-<cid>`, interface eth0).
pub fn attachment(cid: &str, netns_path: &str) -> tern_api::Attachment {
    tern_api::Attachment {
        network: "k8s-pod-network".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        netns_path: netns_path.into(),
        pod: Some(tern_api::PodRef {
            namespace: "default".into(),
            name: format!("pod-{cid}"),
            ..Default::default()
        }),
    }
}

/// One `sendmsg` of `buf` with `fds` attached (SCM_RIGHTS): the bytes sent. A closed peer's
/// error is returned, not a panic. (The test's own copy: tern-api's is private, and these
/// tests send what its framing never would.)
pub fn sendmsg_fds(s: &UnixStream, buf: &[u8], fds: &[RawFd]) -> std::io::Result<usize> {
    let data_len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
    // u64 elements: the control buffer must be aligned for cmsghdr.
    let mut cmsg_buf = vec![0u64; space.div_ceil(8)];
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
    // SAFETY: the control buffer holds one cmsghdr with room for `fds` (written unaligned).
    let sent = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
        let data = libc::CMSG_DATA(c) as *mut RawFd;
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(i), *fd);
        }
        libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sent as usize)
}
