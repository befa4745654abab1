//! A lost store must not wipe the node (issue 10): real `ternd` processes in a private node
//! namespace, pods added over the socket, then the SQLite file truncated or deleted.
//!
//! - (a) store truncated to 0 bytes while ternd is down: ternd refuses to start, naming the
//!   cluster IDs, the identity file and `--accept-new-store`; the pods' veths are intact. With
//!   `--accept-new-store` (the explicit operator command) it starts and adopts the store.
//! - (b) store file deleted under a running ternd: the veths survive several resync periods,
//!   `/readiness` answers 503 saying why, and a restart refuses to start.
//! - (c) fresh node, fresh store: starts normally and records the identity (mode 0600).
//!
//! Namespaces are uniquely named and deleted by drop guards; ternd is killed by PID. The root
//! namespace is never touched.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, PodRef, Reply, Request};

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn unique(tag: &str) -> String {
    format!(
        "ts{}-{}{}",
        std::process::id() % 100_000,
        tag,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A named network namespace deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = unique(tag);
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        let ns = Ns(name);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .arg("-n")
            .arg(&self.0)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
    /// Host veths with tern's prefix in this namespace.
    fn tern_veths(&self) -> Vec<String> {
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
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A ternd process, killed by PID on drop.
struct Ternd(Child);

impl Drop for Ternd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const HEALTH: &str = "127.0.0.1:19099";

fn ternd_cmd(node: &Ns, dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &node.0, env!("CARGO_BIN_EXE_ternd")])
        .arg("--node-name=n1")
        .arg(format!(
            "--store=sqlite://{}",
            dir.join("store.db").display()
        ))
        .arg(format!("--socket={}", dir.join("ternd.sock").display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .args([
            "--default-ipv4-pool=10.79.0.0/22",
            "--resync-seconds=1",
            "--mtu=1500",
            "--metrics-addr=0",
            &format!("--health-addr={HEALTH}"),
            "--log-level=info",
        ])
        .args(extra);
    c
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ternd.log")).unwrap_or_default()
}

/// Starts ternd and waits until its socket answers.
fn start_ternd(node: &Ns, dir: &Path, extra: &[&str]) -> Ternd {
    let _ = std::fs::remove_file(dir.join("ternd.sock"));
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join("ternd.log"))
        .unwrap();
    let child = ternd_cmd(node, dir, extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut t = Ternd(child);
    let sock = dir.join("ternd.sock");
    let end = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if let Ok(Some(st)) = t.0.try_wait() {
            panic!("ternd exited ({st}) instead of serving:\n{}", log_of(dir));
        }
        assert!(
            Instant::now() < end,
            "ternd did not come up:\n{}",
            log_of(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t
}

/// Runs ternd expecting it to refuse to start; returns its stderr.
fn expect_refusal(node: &Ns, dir: &Path) -> String {
    let mut child = ternd_cmd(node, dir, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
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
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "ternd exited with success: {err}");
    err
}

fn add_pod(dir: &Path, pod: &Ns, cid: &str) {
    let f = File::open(pod.path()).unwrap();
    let req = Request::Add(AddRequest::new(Attachment {
        network: "k8s-pod-network".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        netns_path: pod.path(),
        pod: Some(PodRef {
            namespace: "default".into(),
            name: format!("p-{cid}"),
            ..Default::default()
        }),
    }));
    let r = tern_api::call(
        &dir.join("ternd.sock"),
        &req,
        Some(f.as_raw_fd()),
        Duration::from_secs(20),
    )
    .unwrap();
    assert!(matches!(r, Ok(Reply::Result(_))), "ADD {cid}: {r:?}");
}

/// GET `path` from ternd's health listener inside the node namespace.
fn http_get(node: &Ns, path: &str) -> (u16, String) {
    let ns = tern_linux::netns::NetNs::open(Path::new(&node.path())).unwrap();
    let path = path.to_string();
    ns.run(move || {
        let mut s = std::net::TcpStream::connect(HEALTH).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (status, body)
    })
    .unwrap()
}

fn store_files(dir: &Path) -> [PathBuf; 3] {
    ["store.db", "store.db-wal", "store.db-shm"].map(|f| dir.join(f))
}

fn identity(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("state/identity")).unwrap()
}

/// A node with two pods added by a running ternd.
struct Node {
    dir: tempfile::TempDir,
    node: Ns,
    _pods: Vec<Ns>,
    veths: Vec<String>,
}

fn node_with_pods() -> (Node, Ternd) {
    let dir = tempfile::tempdir().unwrap();
    let node = Ns::new("n");
    let t = start_ternd(&node, dir.path(), &[]);
    let pods: Vec<Ns> = (0..2).map(|_| Ns::new("p")).collect();
    for (i, p) in pods.iter().enumerate() {
        add_pod(dir.path(), p, &format!("c{i}"));
    }
    let veths = node.tern_veths();
    assert_eq!(veths.len(), 2, "{veths:?}");
    (
        Node {
            dir,
            node,
            _pods: pods,
            veths,
        },
        t,
    )
}

#[test]
fn truncated_store_is_refused_and_pods_survive() {
    assert!(is_root(), "needs root (network namespaces)");
    let (n, t) = node_with_pods();
    let dir = n.dir.path();
    let id = identity(dir);
    drop(t); // SIGKILL: the agent is down
    // A zero-byte store file (a failed restore, a full disk): no WAL either.
    let [db, wal, shm] = store_files(dir);
    File::create(&db).unwrap().set_len(0).unwrap();
    let _ = std::fs::remove_file(wal);
    let _ = std::fs::remove_file(shm);
    let err = expect_refusal(&n.node, dir);
    assert!(err.contains("refusing to start"), "{err}");
    assert!(err.contains("is empty"), "{err}");
    let cluster = id
        .lines()
        .find_map(|l| l.strip_prefix("cluster_id="))
        .unwrap();
    assert!(
        err.contains(cluster),
        "the error names the node's cluster ID: {err}"
    );
    assert!(
        err.contains("state/identity"),
        "the error names the identity file: {err}"
    );
    assert!(err.contains("--accept-new-store"), "{err}");
    assert!(err.contains("2 pod interfaces"), "{err}");
    assert_eq!(
        n.node.tern_veths(),
        n.veths,
        "pod veths deleted by a refused start"
    );
    // A refused start writes nothing: a second try refuses the same way.
    let again = expect_refusal(&n.node, dir);
    assert!(again.contains("refusing to start"), "{again}");
    assert_eq!(n.node.tern_veths(), n.veths);
    // The explicit operator command adopts the new store (and then reclaims the interfaces
    // the store does not know).
    let _t = start_ternd(&n.node, dir, &["--accept-new-store"]);
    let new = identity(dir);
    assert_ne!(new, id, "the node joined the new store's cluster");
    let end = Instant::now() + Duration::from_secs(15);
    while !n.node.tern_veths().is_empty() {
        assert!(
            Instant::now() < end,
            "accepted store: orphans stay\n{}",
            log_of(dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn store_deleted_under_running_ternd_is_noticed_and_pods_survive() {
    assert!(is_root(), "needs root (network namespaces)");
    let (n, t) = node_with_pods();
    let dir = n.dir.path();
    assert_eq!(http_get(&n.node, "/readiness").0, 200, "{}", log_of(dir));
    for f in store_files(dir) {
        let _ = std::fs::remove_file(f);
    }
    // Several resync periods (1 s each).
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(n.node.tern_veths(), n.veths, "{}", log_of(dir));
    let (code, body) = http_get(&n.node, "/readiness");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("store") && body.contains("deleted"),
        "readiness names the reason: {body}"
    );
    assert!(
        log_of(dir).contains("stops deleting pod interfaces"),
        "an error is logged:\n{}",
        log_of(dir)
    );
    // Liveness is not affected: the agent is healthy, its store is not.
    assert_eq!(http_get(&n.node, "/liveness").0, 200);
    // And the next start, on the now missing store, refuses instead of wiping the node.
    drop(t);
    let err = expect_refusal(&n.node, dir);
    assert!(err.contains("refusing to start"), "{err}");
    assert_eq!(n.node.tern_veths(), n.veths);
}

#[test]
fn fresh_node_and_fresh_store_start_normally() {
    assert!(is_root(), "needs root (network namespaces)");
    let dir = tempfile::tempdir().unwrap();
    let node = Ns::new("n");
    let t = start_ternd(&node, dir.path(), &[]);
    let path = dir.path().join("state/identity");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "identity file mode");
    let id = identity(dir.path());
    let store = tern_store::open(&format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    ))
    .unwrap();
    let in_store = tern_store::read_cluster_id(&*store).unwrap().unwrap();
    assert!(id.contains(&format!("cluster_id={in_store}")), "{id}");
    // A pod, a restart on the same store: the same cluster, the pod kept.
    let pod = Ns::new("p");
    add_pod(dir.path(), &pod, "c0");
    drop(t);
    let _t = start_ternd(&node, dir.path(), &[]);
    assert_eq!(identity(dir.path()), id);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(node.tern_veths().len(), 1, "{}", log_of(dir.path()));
    assert_eq!(
        http_get(&node, "/readiness").0,
        200,
        "{}",
        log_of(dir.path())
    );
}
