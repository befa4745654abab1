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

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Reply, Request};
use tern_testkit::netns::Netns;
use tern_testkit::ternd::{Node, Ternd};

/// ternd's health listener (in the node namespace).
const HEALTH: &str = "127.0.0.1:19099";

/// A node whose ternd (not started) reports readiness on [`HEALTH`].
fn node() -> Node {
    Node::new(&[
        "--default-ipv4-pool=10.79.0.0/22",
        "--resync-seconds=1",
        "--mtu=1500",
        "--metrics-addr=0",
        &format!("--health-addr={HEALTH}"),
        "--log-level=info",
    ])
}

fn add_pod(t: &Ternd, pod: &Netns, cid: &str) {
    let f = File::open(pod.path()).unwrap();
    let req = Request::Add(AddRequest::new(common::attachment(cid, &pod.path())));
    let r = tern_api::call(
        &t.socket(),
        &req,
        Some(f.as_raw_fd()),
        Duration::from_secs(20),
    )
    .unwrap();
    assert!(matches!(r, Ok(Reply::Result(_))), "ADD {cid}: {r:?}");
}

fn store_files(dir: &Path) -> [PathBuf; 3] {
    ["store.db", "store.db-wal", "store.db-shm"].map(|f| dir.join(f))
}

fn identity(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("state/identity")).unwrap()
}

/// A node with two pods added by its running ternd: the node, its two pods' host veths and the pods' sandboxes (a veth lives as long as its
/// peer's namespace); needs root (tern-testkit).
fn node_with_pods() -> (Node, Vec<String>, Vec<Netns>) {
    tern_testkit::need_root();
    let mut n = node();
    n.ternd.start();
    let pods: Vec<Netns> = (0..2).map(|_| Netns::new("p")).collect();
    for (i, p) in pods.iter().enumerate() {
        add_pod(&n.ternd, p, &format!("c{i}"));
    }
    let veths = n.ns.tern_veths();
    assert_eq!(veths.len(), 2, "{veths:?}");
    (n, veths, pods)
}

#[test]
fn truncated_store_is_refused_and_pods_survive() {
    let (mut n, veths, _pods) = node_with_pods();
    let dir = n.dir.path();
    let id = identity(dir);
    n.ternd.kill(); // SIGKILL: the agent is down
    // A zero-byte store file (a failed restore, a full disk): no WAL either.
    let [db, wal, shm] = store_files(dir);
    File::create(&db).unwrap().set_len(0).unwrap();
    let _ = std::fs::remove_file(wal);
    let _ = std::fs::remove_file(shm);
    let err = n.ternd.expect_refusal();
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
        n.ns.tern_veths(),
        veths,
        "pod veths deleted by a refused start"
    );
    // A refused start writes nothing: a second try refuses the same way.
    let again = n.ternd.expect_refusal();
    assert!(again.contains("refusing to start"), "{again}");
    assert_eq!(n.ns.tern_veths(), veths);
    // The explicit operator command adopts the new store (and then reclaims the interfaces
    // the store does not know).
    n.ternd.start_with(&["--accept-new-store"]);
    let new = identity(dir);
    assert_ne!(new, id, "the node joined the new store's cluster");
    let end = Instant::now() + Duration::from_secs(15);
    while !n.ns.tern_veths().is_empty() {
        assert!(
            Instant::now() < end,
            "accepted store: orphans stay\n{}",
            n.ternd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn store_deleted_under_running_ternd_is_noticed_and_pods_survive() {
    let (mut n, veths, _pods) = node_with_pods();
    let dir = n.dir.path();
    assert_eq!(n.ternd.http_get("/readiness").0, 200, "{}", n.ternd.log());
    for f in store_files(dir) {
        let _ = std::fs::remove_file(f);
    }
    // Several resync periods (1 s each).
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(n.ns.tern_veths(), veths, "{}", n.ternd.log());
    let (code, body) = n.ternd.http_get("/readiness");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("store") && body.contains("deleted"),
        "readiness names the reason: {body}"
    );
    assert!(
        n.ternd.log().contains("stops deleting pod interfaces"),
        "an error is logged:\n{}",
        n.ternd.log()
    );
    // Liveness is not affected: the agent is healthy, its store is not.
    assert_eq!(n.ternd.http_get("/liveness").0, 200);
    // And the next start, on the now missing store, refuses instead of wiping the node.
    n.ternd.kill();
    let err = n.ternd.expect_refusal();
    assert!(err.contains("refusing to start"), "{err}");
    assert_eq!(n.ns.tern_veths(), veths);
}

#[test]
fn fresh_node_and_fresh_store_start_normally() {
    tern_testkit::need_root();
    let mut n = node();
    n.ternd.start();
    let (t, dir) = (&mut n.ternd, n.dir.path());
    let path = dir.join("state/identity");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "identity file mode");
    let id = identity(dir);
    let store = t.store();
    let in_store = tern_store::read_cluster_id(&*store).unwrap().unwrap();
    assert!(id.contains(&format!("cluster_id={in_store}")), "{id}");
    // A pod, a restart on the same store: the same cluster, the pod kept.
    let pod = Netns::new("p");
    add_pod(t, &pod, "c0");
    t.kill();
    t.start();
    assert_eq!(identity(dir), id);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(n.ns.tern_veths().len(), 1, "{}", t.log());
    assert_eq!(t.http_get("/readiness").0, 200, "{}", t.log());
}
