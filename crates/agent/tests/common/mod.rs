//! Harness shared by the agent's integration tests (and, through `#[path]`, by ternctl's
//! Kubernetes manifest test): uniquely named network namespaces deleted on drop, commands that
//! must succeed, polling, `ternd` as a process in a node namespace (killed by PID on drop), an
//! in-process agent's configuration, and the raw socket and HTTP clients the tests probe with.
//!
//! Nothing here touches the root network namespace: commands that change the network run with
//! `ip -n NS` / `ip netns exec NS`, and sockets are made on threads that entered a test
//! namespace (`tern_linux::netns::NetNs::run`).

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A name unique on this machine: `ta<pid>-<tag><n>`.
pub fn unique(tag: &str) -> String {
    format!(
        "ta{}-{tag}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `cmd` and returns its stdout; panics naming the command and its stderr when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip ARGS`, which must succeed; its stdout.
pub fn ip(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

/// Polls `cond` every 100 ms until it holds or `timeout` has passed (then once more).
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    poll(timeout, Duration::from_millis(100), cond)
}

/// Polls `cond` every `every` until it holds or `timeout` has passed (then once more).
pub fn poll(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(every);
    }
    cond()
}

/// Runs `f` on a fresh thread inside the network namespace at `ns_path` (sockets it creates
/// stay in that namespace; no thread of the test changes namespace).
pub fn in_netns<T: Send>(ns_path: &str, f: impl FnOnce() -> T + Send) -> T {
    tern_linux::netns::NetNs::open(Path::new(ns_path))
        .and_then(|ns| ns.run(f))
        .unwrap_or_else(|e| panic!("running in {ns_path}: {e}"))
}

/// p50, p99 and max of `v` in milliseconds (`v` not empty).
pub fn pctl(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p99 = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (ms(v[v.len() / 2]), ms(v[p99]), ms(v[v.len() - 1]))
}

/// A uniquely named network namespace with `lo` up, deleted on drop.
pub struct Netns {
    pub name: String,
    deleted: bool,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = unique(tag);
        ip(&["netns", "add", &name]);
        let ns = Netns {
            name,
            deleted: false,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// A node namespace with an underlay address: `addr`/24 on `ul0`, a veth whose peer `ul1`
    /// stays in the namespace (up, so the address is usable and advertised).
    pub fn with_underlay(tag: &str, addr: &str) -> Netns {
        let ns = Netns::new(tag);
        ns.ip(&["link", "add", "ul0", "type", "veth", "peer", "name", "ul1"]);
        ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "ul0"]);
        ns.ip(&["link", "set", "ul0", "up"]);
        ns.ip(&["link", "set", "ul1", "up"]);
        ns
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `ip -n NS ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// `ARGS` run inside the namespace (`ip netns exec`), which must succeed.
    pub fn exec(&self, args: &[&str]) -> String {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args))
    }

    /// Runs `f` on a fresh thread inside this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.path(), f)
    }

    /// `ip -o link show` in the namespace.
    pub fn links(&self) -> String {
        self.ip(&["-o", "link", "show"])
    }

    /// The veths with tern's prefix (the pods' host ends), sorted.
    pub fn tern_veths(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .ip(&["-o", "link", "show", "type", "veth"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("tern"))
            .collect();
        v.sort();
        v
    }

    /// Deletes the namespace now (as a runtime drops a sandbox).
    pub fn delete(&mut self) {
        if !self.deleted {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .stderr(Stdio::null())
                .status();
            self.deleted = true;
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.delete();
    }
}

/// The underlay of a multi-node test: a bridge `br0` in its own namespace, the nodes attached
/// to it with a veth each.
pub struct Underlay {
    pub ns: Netns,
}

impl Underlay {
    pub fn new() -> Underlay {
        let ns = Netns::new("u");
        ns.ip(&["link", "add", "br0", "type", "bridge"]);
        ns.ip(&["link", "set", "br0", "up"]);
        Underlay { ns }
    }

    /// Attaches the node namespace `node`: a veth whose end `eth0` in the node has `cidr`
    /// (address/prefix) and carries the default route via `gw`, its other end on the bridge.
    pub fn attach(&self, node: &Netns, cidr: &str, gw: &str) {
        let host_end = unique("u");
        self.ns.ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &node.name,
        ]);
        self.ns
            .ip(&["link", "set", &host_end, "master", "br0", "up"]);
        node.ip(&["addr", "add", cidr, "dev", "eth0"]);
        node.ip(&["link", "set", "eth0", "up"]);
        node.ip(&["route", "add", "default", "via", gw]);
    }
}

/// UDP from namespace `from` to a socket on `to_ip` in `to`, echoed back (6 tries of 500 ms):
/// the source address the server saw.
pub fn udp_echo(from: &Netns, to: &Netns, to_ip: IpAddr) -> Result<IpAddr, String> {
    let server = to
        .run(|| UdpSocket::bind(SocketAddr::new(to_ip, 0)))
        .map_err(|e| e.to_string())?;
    let client = from
        .run(|| UdpSocket::bind("0.0.0.0:0"))
        .map_err(|e| e.to_string())?;
    let dst = server.local_addr().unwrap();
    for s in [&server, &client] {
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
    }
    let mut last = String::new();
    for _ in 0..6 {
        client.send_to(b"ping", dst).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 16];
        match server.recv_from(&mut buf) {
            Ok((n, src)) => {
                server
                    .send_to(&buf[..n], src)
                    .map_err(|e| format!("reply to {src}: {e}"))?;
                let mut back = [0u8; 16];
                match client.recv_from(&mut back) {
                    Ok(_) => return Ok(src.ip()),
                    Err(e) => last = format!("no echo: {e}"),
                }
            }
            Err(e) => last = format!("server got nothing: {e}"),
        }
    }
    Err(last)
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

/// The `ternd` the tests run: `TERN_TEST_TERND` (e.g. a release build, to measure its RSS),
/// else the one cargo built for this package's tests.
pub fn ternd_bin() -> PathBuf {
    std::env::var_os("TERN_TEST_TERND")
        .map(PathBuf::from)
        .unwrap_or_else(cargo_ternd)
}

/// The `ternd` cargo built for tern-agent's tests. (`option_env!`: ternctl's tests compile
/// this module too, without the agent's binary, and never start ternd.)
pub fn cargo_ternd() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_ternd") {
        Some(p) => PathBuf::from(p),
        None => panic!("no ternd built for these tests: run them with `cargo test -p tern-agent`"),
    }
}

/// The `tern` plugin, built next to ternd (checked current: tern-testkit's
/// `workspace_binaries`).
pub fn tern_plugin() -> PathBuf {
    tern_testkit::workspace_binaries(&cargo_ternd()).join("tern")
}

/// ternd's default health listener.
const DEFAULT_HEALTH: &str = "127.0.0.1:9099";

/// `ternd` in a node namespace with its files under `dir` (store `store.db`, socket
/// `ternd.sock`, state `state/`), started and restarted by the test and killed by PID on drop.
/// Every run's output goes to `dir/ternd.log`, printed when the test panics.
pub struct Ternd {
    pub netns: String,
    pub dir: PathBuf,
    /// Every argument ternd starts with.
    pub args: Vec<String>,
    /// The umask it starts under (the socket's mode must not depend on it).
    pub umask: Option<libc::mode_t>,
    /// How long a start waits for the socket to answer (30 s).
    pub listen_timeout: Duration,
    child: Option<Child>,
    starts: usize,
}

impl Ternd {
    /// ternd for node `node` with `args` after the node name, store, socket and state
    /// directory; not started yet.
    pub fn new(netns: &str, dir: &Path, node: &str, args: &[&str]) -> Ternd {
        std::fs::create_dir_all(dir).unwrap();
        let mut all = vec![
            format!("--node-name={node}"),
            format!("--socket={}", dir.join("ternd.sock").display()),
            format!("--state-dir={}", dir.join("state").display()),
        ];
        // A store in `args` replaces the default SQLite file.
        if !args.iter().any(|a| a.starts_with("--store=")) {
            all.insert(
                1,
                format!("--store=sqlite://{}", dir.join("store.db").display()),
            );
        }
        all.extend(args.iter().map(|a| a.to_string()));
        Ternd {
            netns: netns.to_string(),
            dir: dir.to_path_buf(),
            args: all,
            umask: None,
            listen_timeout: Duration::from_secs(30),
            child: None,
            starts: 0,
        }
    }

    /// As [`Ternd::new`], started.
    pub fn started(netns: &str, dir: &Path, node: &str, args: &[&str]) -> Ternd {
        let mut t = Ternd::new(netns, dir, node, args);
        t.start();
        t
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("ternd.sock")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn store_url(&self) -> String {
        self.args
            .iter()
            .find_map(|a| a.strip_prefix("--store="))
            .map(str::to_string)
            .unwrap_or_else(|| format!("sqlite://{}", self.dir.join("store.db").display()))
    }
    /// The node's store, opened by the test.
    pub fn store(&self) -> Arc<dyn tern_store::Store> {
        tern_store::open(&self.store_url()).expect("opening the store")
    }

    /// Where ternd's `/liveness` and `/readiness` answer (`--health-addr`).
    pub fn health_addr(&self) -> SocketAddr {
        let addr = self
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--health-addr="))
            .unwrap_or(DEFAULT_HEALTH);
        addr.parse()
            .unwrap_or_else(|e| panic!("--health-addr={addr}: {e}"))
    }

    /// `ip netns exec NS ternd ARGS EXTRA` (ip execs ternd: the child's PID is ternd's).
    fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns])
            .arg(ternd_bin())
            .args(&self.args)
            .args(extra)
            .stdin(Stdio::null());
        if let Some(mask) = self.umask {
            // SAFETY: umask is async-signal-safe and touches only the child's own state.
            unsafe {
                c.pre_exec(move || {
                    libc::umask(mask);
                    Ok(())
                });
            }
        }
        c
    }

    pub fn start(&mut self) {
        self.start_with(&[]);
    }

    /// Starts ternd with `extra` arguments for this run only, and waits until its socket
    /// answers (panicking with the log when it exits instead).
    pub fn start_with(&mut self, extra: &[&str]) {
        assert!(self.child.is_none(), "ternd is already running");
        self.starts += 1;
        let _ = std::fs::remove_file(self.socket());
        let mut log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("ternd.log"))
            .unwrap();
        writeln!(log, "--- ternd run {} {extra:?}", self.starts).unwrap();
        let child = self
            .command(extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning ternd");
        self.child = Some(child);
        let sock = self.socket();
        let timeout = self.listen_timeout;
        let up = wait_until(timeout, || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("ternd exited ({st}) instead of serving:\n{}", self.log());
            }
            UnixStream::connect(&sock).is_ok()
        });
        assert!(
            up,
            "ternd did not listen within {timeout:?}:\n{}",
            self.log()
        );
    }

    /// SIGKILL by PID and reap; nothing when it is not running.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL by PID and reap, asserting it was still running.
    pub fn kill(&mut self) {
        let mut c = self.child.take().expect("ternd is running");
        c.kill().expect("SIGKILL ternd");
        c.wait().unwrap();
    }

    /// ternd's resident set (`VmRSS` of /proc/<pid>/status), in KiB; 0 when unreadable.
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("ternd running").id()
    }

    /// Every run's output.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ternd.log")).unwrap_or_default()
    }

    /// The number of descriptors ternd holds.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    /// Runs ternd expecting it to refuse to start within 30 s; returns its stderr.
    pub fn expect_refusal(&self) -> String {
        let path = self.dir.join("refusal.log");
        let mut child = self
            .command(&[])
            .stdout(Stdio::null())
            .stderr(File::create(&path).unwrap())
            .spawn()
            .expect("spawning ternd");
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ternd did not refuse to start within 30 s (it is serving)");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = std::fs::read_to_string(&path).unwrap();
        assert!(!status.success(), "ternd exited with success: {err}");
        err
    }

    /// GET `path` from ternd's health listener inside the node namespace: (status, body), or
    /// (0, why) when nothing answers.
    pub fn http_get(&self, path: &str) -> (u16, String) {
        let addr = self.health_addr();
        in_netns(&format!("/run/netns/{}", self.netns), || {
            http_get(addr, path, Duration::from_secs(3)).unwrap_or_else(|e| (0, e))
        })
    }
}

impl Drop for Ternd {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- ternd log\n{}", self.log());
        }
    }
}

/// A node: a fresh namespace and ternd (node `n1`, not started yet) with its files in a
/// temporary directory; on drop ternd is killed first, then the namespace and the files go.
pub struct Node {
    pub ternd: Ternd,
    pub ns: Netns,
    pub dir: tempfile::TempDir,
}

impl Node {
    pub fn new(args: &[&str]) -> Node {
        let ns = Netns::new("n");
        let dir = tempfile::Builder::new().prefix("tat-").tempdir().unwrap();
        let ternd = Ternd::new(&ns.name, dir.path(), "n1", args);
        Node { ternd, ns, dir }
    }
}

/// `GET path` over HTTP/1.1 to `addr`: (status, body).
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(timeout)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let status = out
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad response {out:?}"))?;
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Ok((status, body))
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
