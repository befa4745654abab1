//! A datastore outage end to end, on a real etcd and a real ternd in a real network
//! namespace: DEL while etcd is down succeeds and is journaled, ADD answers CNI code 11 quickly,
//! and when etcd comes back (same data directory, same port) the journal is replayed and ADD
//! works again. Also: ternd started before etcd serves once etcd is up, and `ternctl` against an
//! etcd endpoint that refuses connections fails fast with a clear error.
//!
//! etcd runs inside the node's network namespace (ternd resolves `etcd://127.0.0.1:PORT` there),
//! started by [`NsEtcd`] below rather than `tern_store::etcd::harness::EtcdServer`: the harness
//! picks fresh ports and directories on every start and runs in the caller's namespace, while
//! these tests must restart the same member on the same data directory and port.

mod common;

use common::*;
use std::fs::File;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tern_store::etcd::harness::etcd_binary;
use tern_store::etcd::{EtcdStore, Timeouts};

/// etcd's client port inside a node namespace. Each node is a fresh namespace with nothing else
/// listening, so fixed ports cannot collide between tests running in parallel.
const CLIENT_PORT: u16 = 23790;
const PEER_PORT: u16 = 23800;

/// How long a store outage may take to be reported to the runtime, and how long the agent may
/// take to catch up once the store is back.
const BOUND: Duration = Duration::from_secs(10);

/// The store URL of an [`NsEtcd`], as seen from inside its namespace.
fn etcd_url() -> String {
    format!("etcd://127.0.0.1:{CLIENT_PORT}")
}

/// A single-member etcd inside a network namespace, on a data directory that survives
/// [`NsEtcd::kill`] so that [`NsEtcd::start`] restarts the same member. Killed by PID on drop.
struct NsEtcd {
    ns_name: String,
    ns_path: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    starts: usize,
}

impl NsEtcd {
    /// Prepares (does not start) an etcd for the namespace of `node`.
    fn new(node: &Node) -> NsEtcd {
        NsEtcd {
            ns_name: node.name().to_string(),
            ns_path: node.ns.path(),
            dir: tempfile::Builder::new()
                .prefix("tpt-etcd-")
                .tempdir()
                .expect("etcd temp dir"),
            child: None,
            starts: 0,
        }
    }

    fn log_path(&self, start: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("etcd.{start}.log"))
    }

    /// Everything etcd logged, every run.
    fn log(&self) -> String {
        let mut s = String::new();
        for i in 1..=self.starts {
            s.push_str(&format!("--- etcd run {i}\n"));
            let all = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
            let from = all.len().saturating_sub(3000);
            s.push_str(&all[all.ceil_char_boundary(from)..]);
        }
        s
    }

    /// Starts (or restarts) etcd and waits until it serves requests.
    fn start(&mut self) {
        assert!(self.child.is_none(), "etcd already running");
        self.starts += 1;
        let log = File::create(self.log_path(self.starts)).expect("etcd log");
        let client = format!("http://127.0.0.1:{CLIENT_PORT}");
        let peer = format!("http://127.0.0.1:{PEER_PORT}");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns_name])
            .arg(etcd_binary())
            .args(["--name", "itest"])
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("itest={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .expect("spawning etcd");
        self.child = Some(child);
        let ns = self.ns_path.clone();
        let ready = wait_until(Duration::from_secs(15), || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("etcd exited at start ({st}): {}", self.log());
            }
            let ns = ns.clone();
            in_netns(&ns, || {
                let quick = Timeouts {
                    connect: Duration::from_millis(300),
                    request: Duration::from_secs(1),
                };
                let ep = format!("127.0.0.1:{CLIENT_PORT}");
                EtcdStore::connect(&[ep], None, quick).is_ok()
            })
        });
        assert!(ready, "etcd not ready within 15 s: {}", self.log());
    }

    /// Sends `sig` to etcd by PID: SIGSTOP makes a member that accepts connections but never
    /// answers (a hung or partitioned store), SIGCONT brings it back.
    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.as_ref().expect("etcd is not running").id();
        // SAFETY: kill(2) on the PID of a child we spawned and have not reaped.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(
            rc,
            0,
            "kill({pid}, {sig}): {}",
            std::io::Error::last_os_error()
        );
    }

    /// Kills etcd by PID (SIGKILL, like a crash) and reaps it; the data directory stays.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NsEtcd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("etcd log:\n{}", self.log());
        }
        self.kill();
    }
}

/// After [`need_etcd`], a node whose ternd runs on an etcd in the node's underlay, both
/// started. The node comes first in the pair so that, bound as `let (node, etcd)`, etcd is
/// dropped (killed) before the node's namespace goes.
fn started_on_etcd() -> (Node, NsEtcd) {
    need_etcd();
    let mut node = Node::unstarted_with_store(&etcd_url());
    let mut etcd = NsEtcd::new(&node);
    etcd.start();
    node.start();
    (node, etcd)
}

#[test]
fn etcd_outage_del_is_journaled_add_is_code_11_and_the_journal_is_replayed() {
    let (node, mut etcd) = started_on_etcd();
    let conf = node.conf("1.0.0");

    let pod_a = Pod::new();
    let (_, ip_a, host_a) = node.add_pod(&pod_a, "outage-a", &conf);
    assert_eq!(node.allocated_to("outage-a"), vec![ip_a]);
    assert_eq!(node.endpoints_of("outage-a").len(), 1);

    etcd.kill();

    // DEL must succeed: the runtime would otherwise retry forever and leak the sandbox.
    let (del, del_took) = timed(|| node.cni("DEL", &pod_a, "outage-a", "eth0", &conf));
    del.ok();
    eprintln!("DEL with etcd down took {del_took:?}");
    assert!(del_took < BOUND, "DEL with etcd down took {del_took:?}");
    assert!(
        wait_until(Duration::from_secs(5), || !node.has_link(&host_a)),
        "host veth {host_a} survived the DEL: {:?}",
        node.links()
    );
    assert!(!pod_a.has_link("eth0"), "pod interface survived the DEL");
    let journal = node.journal_files();
    assert_eq!(journal.len(), 1, "journal after DEL: {journal:?}");
    let entry = std::fs::read_to_string(&journal[0]).expect("reading the journal entry");
    assert!(
        entry.contains("outage-a"),
        "journal entry does not name the container: {entry}"
    );

    // ADD must fail fast with "try again later" (code 11), saying why, and leave nothing.
    let pod_b = Pod::new();
    let (add, add_took) = timed(|| node.cni("ADD", &pod_b, "outage-b", "eth0", &conf));
    eprintln!("ADD with etcd down took {add_took:?}: {}", add.json);
    let msg = add.fails_with(11);
    assert!(add_took < BOUND, "ADD with etcd down took {add_took:?}");
    assert_store_unreachable(&msg);
    assert!(!pod_b.has_link("eth0"), "a failed ADD left eth0 in the pod");
    assert!(
        node.tern_links_settled().is_empty(),
        "a failed ADD left host veths: {:?}",
        node.tern_links()
    );

    // etcd back on the same data directory and port: the address is still allocated in the
    // store (the release could not happen) until ternd replays its journal.
    etcd.start();
    let back = Instant::now();
    let replayed = wait_until(BOUND, || {
        node.journal_files().is_empty()
            && node.allocated_to("outage-a").is_empty()
            && node.endpoints_of("outage-a").is_empty()
    });
    let replay_took = back.elapsed();
    eprintln!("journal replayed {replay_took:?} after etcd came back");
    assert!(
        replayed,
        "not replayed within {BOUND:?}: journal {:?}, allocations {:?}, endpoints {:?}\n{}",
        node.journal_files(),
        node.allocated_to("outage-a"),
        node.endpoints_of("outage-a"),
        node.agent_log()
    );
    assert!(
        node.allocations().iter().all(|a| a.ip != ip_a),
        "{ip_a} still allocated after the replay"
    );

    // And ADD works again, with a real address.
    let r = node.add(&pod_b, "outage-b", &conf);
    let ip_b = result_ip(&r);
    assert_eq!(node.allocated_to("outage-b"), vec![ip_b]);
    assert_eq!(pod_b.ipv4("eth0").len(), 1);
    node.cni("DEL", &pod_b, "outage-b", "eth0", &conf).ok();
    assert!(node.allocated_to("outage-b").is_empty());
    assert!(node.journal_files().is_empty());
}

#[test]
fn ternd_started_while_etcd_is_down_serves_once_etcd_is_up() {
    need_etcd();
    let mut node = Node::unstarted_with_store(&etcd_url());
    let mut etcd = NsEtcd::new(&node);
    node.spawn_agent();
    // ternd waits for the store before it serves: no socket, and the plugin says "later".
    assert!(
        !node.wait_listening(Duration::from_secs(2)),
        "ternd served without a datastore"
    );
    let conf = node.conf("1.0.0");
    let pod = Pod::new();
    node.cni("ADD", &pod, "late-etcd", "eth0", &conf)
        .fails_with(11);

    etcd.start();
    let up = Instant::now();
    assert!(
        node.wait_listening(BOUND),
        "ternd did not serve within {BOUND:?} of etcd coming up:\n{}",
        node.agent_log()
    );
    eprintln!("ternd served {:?} after etcd came up", up.elapsed());
    let r = node.add(&pod, "late-etcd", &conf);
    assert_eq!(node.allocated_to("late-etcd"), vec![result_ip(&r)]);
    assert_eq!(node.endpoints_of("late-etcd").len(), 1);
    node.cni("DEL", &pod, "late-etcd", "eth0", &conf).ok();
    assert!(node.allocated_to("late-etcd").is_empty());
}

#[test]
fn ternctl_on_an_etcd_that_refuses_connections_fails_fast_and_clearly() {
    tern_testkit::need_root();
    // A fresh namespace: nothing listens on 127.0.0.1:1 there, so the connection is refused.
    let ns = Netns::new("p");
    let ternctl = ternctl_bin();
    let (out, took) = timed(|| {
        Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(&ternctl)
            .args(["--store", "etcd://127.0.0.1:1", "ipam", "show"])
            .env_remove("TERN_STORE")
            .stdin(Stdio::null())
            .output()
            .expect("running ternctl")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("ternctl took {took:?}: {stderr}");
    assert!(!out.status.success(), "ternctl succeeded without a store");
    assert!(took < Duration::from_secs(5), "ternctl took {took:?}");
    assert!(
        stderr.contains("127.0.0.1:1"),
        "error does not name the endpoint: {stderr}"
    );
    let lower = stderr.to_lowercase();
    assert!(
        lower.contains("unreachable") || lower.contains("unavailable"),
        "error does not say the datastore is unreachable: {stderr}"
    );
    assert!(
        lower.contains("refused"),
        "error does not say why (connection refused): {stderr}"
    );
}

/// A stopped (SIGSTOP) etcd accepts connections and never answers: the store must give up on
/// it after one request timeout per call (it does not retry a member that timed out on a fresh
/// connection), so ADD answers code 11 well within 10 s.
#[test]
fn etcd_that_hangs_add_is_code_11_in_bounded_time_and_works_after() {
    let (node, mut etcd) = started_on_etcd();
    let conf = node.conf("1.0.0");
    let pod = Pod::new();

    // Connections are accepted by the kernel but nothing answers: only timeouts help.
    etcd.signal(libc::SIGSTOP);
    let (add, took) = timed(|| node.cni("ADD", &pod, "hung-etcd", "eth0", &conf));
    eprintln!("ADD with a hung etcd took {took:?}: {}", add.json);
    etcd.signal(libc::SIGCONT);
    let msg = add.fails_with(11);
    assert!(took < BOUND, "ADD with a hung etcd took {took:?}");
    assert_store_unreachable(&msg);
    assert!(
        node.tern_links_settled().is_empty(),
        "a failed ADD left host veths: {:?}",
        node.tern_links()
    );

    let r = node.add(&pod, "hung-etcd", &conf);
    assert_eq!(node.allocated_to("hung-etcd"), vec![result_ip(&r)]);
    node.cni("DEL", &pod, "hung-etcd", "eth0", &conf).ok();
    assert!(node.allocated_to("hung-etcd").is_empty());
    etcd.kill();
}
