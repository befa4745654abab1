//! `ternd` as a process in a test's network namespace: its socket, store and state directory
//! under the test's directory, started, restarted and killed (by PID, also on drop) by the test,
//! every run's output in one log that is printed when the test panics.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::netns::{Netns, in_netns};
use crate::wait::wait_until;

/// The `ternd` tests run: `TERN_TEST_TERND` (e.g. a release build, to measure its RSS), else
/// the one cargo built beside the running test binary (`target/<profile>/ternd`; the test
/// binary is in `target/<profile>/deps`). A crate whose tests must never run a stale one sets
/// [`Ternd::bin`] from [`crate::workspace_binaries`].
pub fn default_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TERN_TEST_TERND") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not in target/<profile>/deps", exe.display()));
    profile.join("ternd")
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
    /// The binary ([`default_bin`] unless the test sets another).
    pub bin: PathBuf,
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
            bin: default_bin(),
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
            .arg(&self.bin)
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
        self.spawn_with(extra);
        let timeout = self.listen_timeout;
        let up = self.wait_listening(timeout);
        assert!(
            up,
            "ternd did not listen on {} within {timeout:?}:\n{}",
            self.socket().display(),
            self.log()
        );
    }

    /// Starts ternd without waiting for its socket (e.g. while its datastore is down, when it
    /// waits before it serves); the stale socket file of an earlier run is removed first.
    pub fn spawn(&mut self) {
        self.spawn_with(&[]);
    }

    fn spawn_with(&mut self, extra: &[&str]) {
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
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// Waits up to `timeout` until ternd's socket accepts connections; panics with the log when
    /// ternd exits instead.
    pub fn wait_listening(&mut self, timeout: Duration) -> bool {
        let sock = self.socket();
        wait_until(timeout, || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("ternd exited ({st}) instead of serving:\n{}", self.log());
            }
            UnixStream::connect(&sock).is_ok()
        })
    }

    /// Whether ternd was started and has not been stopped (it may have exited).
    pub fn is_started(&self) -> bool {
        self.child.is_some()
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

/// ternd seen from outside: its readiness and its nftables table.
impl Ternd {
    /// Waits until ternd's `/readiness` answers 200; panics with its last answer and log.
    pub fn wait_ready(&self, timeout: Duration) {
        let mut last = String::new();
        let ok = wait_until(timeout, || {
            let (code, body) = self.http_get("/readiness");
            last = body;
            code == 200
        });
        assert!(
            ok,
            "ternd not ready within {timeout:?}: {last}\n{}",
            self.log()
        );
    }

    /// `nft list table inet tern` in the node's namespace.
    pub fn nft_table(&self) -> String {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "nft",
                "list",
                "table",
                "inet",
                "tern",
            ])
            .output()
            .expect("nft");
        String::from_utf8_lossy(&out.stdout).into_owned()
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
        let dir = tempfile::Builder::new()
            .prefix("tern-node-")
            .tempdir()
            .unwrap();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_name_the_node_socket_state_and_a_default_store() {
        let dir = tempfile::tempdir().unwrap();
        let t = Ternd::new("ns1", dir.path(), "n7", &["--log-level=debug"]);
        let d = dir.path().display();
        assert_eq!(
            t.args,
            [
                "--node-name=n7".to_string(),
                format!("--store=sqlite://{d}/store.db"),
                format!("--socket={d}/ternd.sock"),
                format!("--state-dir={d}/state"),
                "--log-level=debug".to_string(),
            ]
        );
        assert_eq!(t.store_url(), format!("sqlite://{d}/store.db"));
        assert_eq!(t.health_addr(), "127.0.0.1:9099".parse().unwrap());
        assert!(!t.is_started());

        let t = Ternd::new(
            "ns1",
            dir.path(),
            "n7",
            &["--store=etcd://127.0.0.1:2379", "--health-addr=127.0.0.1:1"],
        );
        assert_eq!(t.store_url(), "etcd://127.0.0.1:2379");
        assert_eq!(
            t.args.iter().filter(|a| a.starts_with("--store=")).count(),
            1
        );
        assert_eq!(t.health_addr(), "127.0.0.1:1".parse().unwrap());
    }
}
