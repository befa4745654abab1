//! Proof for leak repair: `kill -9` of `ternd` in the middle of concurrent ADDs, five times.
//! Afterwards no address is held twice, and once the runtime has deleted what it believes
//! exists (and dropped the sandboxes of failed ADDs without DEL), leak repair reclaims every
//! orphan: the node holds no allocation and `ipam check` finds nothing.
//!
//! ternd runs in a uniquely named node namespace, pods are uniquely named namespaces; all are
//! deleted by drop guards and ternd is killed by PID. The root namespace is never touched.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, DelRequest, PodRef, Reply, Request};
use tern_ipam::Ipam;

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn unique(tag: &str) -> String {
    format!(
        "tk{}-{}{}",
        std::process::id(),
        tag,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A named network namespace deleted on drop.
struct Ns(String, bool);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = unique(tag);
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        Ns(name, false)
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
    fn delete(&mut self) {
        if !self.1 {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
            self.1 = true;
        }
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        self.delete();
    }
}

/// ternd in the node namespace, killed (by PID) on drop.
struct Ternd(Child);

impl Drop for Ternd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_ternd(node: &Ns, dir: &Path) -> Ternd {
    let log = File::options()
        .create(true)
        .append(true)
        .open(dir.join("ternd.log"))
        .unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &node.0, env!("CARGO_BIN_EXE_ternd")])
        .arg("--node-name=n1")
        .arg(format!(
            "--store=sqlite://{}",
            dir.join("store.db").display()
        ))
        .arg(format!("--socket={}", dir.join("ternd.sock").display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .args([
            "--default-ipv4-pool=10.78.0.0/22",
            "--resync-seconds=1",
            "--leak-grace-seconds=2",
            "--mtu=1500",
            "--metrics-addr=0",
            "--health-addr=0",
            "--log-level=info",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t = Ternd(child);
    let sock = dir.join("ternd.sock");
    let end = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < end, "ternd did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    t
}

fn attachment(cid: &str, ns: &Ns) -> Attachment {
    Attachment {
        network: "k8s-pod-network".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        netns_path: ns.path(),
        pod: Some(PodRef {
            namespace: "default".into(),
            name: format!("p-{cid}"),
            infra_container_id: String::new(),
            uid: String::new(),
        }),
    }
}

struct Pod {
    ns: Ns,
    att: Attachment,
    ip: Option<IpAddr>,
}

fn add(sock: &Path, pod: &Ns, att: &Attachment) -> Result<IpAddr, String> {
    let f = File::open(pod.path()).unwrap();
    let req = Request::Add(AddRequest::new(att.clone()));
    match tern_api::call(sock, &req, Some(f.as_raw_fd()), Duration::from_secs(20)) {
        Ok(Ok(Reply::Result(r))) => Ok(r.ips[0].address.parse::<ipnet::IpNet>().unwrap().addr()),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn kill_9_during_adds_leaves_no_duplicate_and_no_leak() {
    if !tern_testkit::require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let node = Ns::new("n");
    let sock: PathBuf = dir.path().join("ternd.sock");
    let pods: Arc<Mutex<Vec<Pod>>> = Arc::default();
    let mut killed_mid_stream = 0;
    for round in 0..5 {
        let mut ternd = start_ternd(&node, dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (sock, pods, stop, done) =
                    (sock.clone(), pods.clone(), stop.clone(), done.clone());
                std::thread::spawn(move || {
                    for i in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let ns = Ns::new("p");
                        let att = attachment(&format!("r{round}t{t}i{i}"), &ns);
                        let r = add(&sock, &ns, &att);
                        let failed = r.is_err();
                        pods.lock().unwrap().push(Pod {
                            ns,
                            att,
                            ip: r.ok(),
                        });
                        if failed {
                            // The agent is gone; this worker stops like a runtime would.
                            return;
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        // Let some ADDs complete, then kill in the middle of the stream.
        let end = Instant::now() + Duration::from_secs(20);
        while done.load(Ordering::Relaxed) < 3 + round && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(37 * (round as u64 + 1)));
        ternd.0.kill().unwrap(); // SIGKILL
        ternd.0.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        if pods.lock().unwrap().iter().any(|p| p.ip.is_none()) {
            killed_mid_stream += 1;
        }
    }
    assert!(killed_mid_stream > 0, "no ADD was ever interrupted");

    let store = tern_store::open(&format!(
        "sqlite://{}",
        dir.path().join("store.db").display()
    ))
    .unwrap();
    let ipam = Ipam::new(store.clone());
    let mut pods = std::mem::take(&mut *pods.lock().unwrap());
    let ok: Vec<&Pod> = pods.iter().filter(|p| p.ip.is_some()).collect();
    let failed = pods.len() - ok.len();
    eprintln!("{} ADDs succeeded, {failed} interrupted", ok.len());

    // No address held twice: every successful ADD got its own address, still allocated to it.
    let mut seen = HashSet::new();
    let allocs: HashMap<IpAddr, Option<String>> = ipam
        .allocations(None)
        .unwrap()
        .into_iter()
        .map(|a| (a.ip, a.handle))
        .collect();
    for p in &ok {
        let ip = p.ip.unwrap();
        assert!(seen.insert(ip), "{ip} was given twice");
        assert_eq!(allocs.get(&ip), Some(&Some(p.att.handle())), "{ip}");
    }
    let report = tern_agent::audit::check(&*store, &ipam).unwrap();
    assert!(report.duplicates.is_empty(), "{report:?}");
    assert!(report.in_use_not_allocated.is_empty(), "{report:?}");
    // Allocations of interrupted ADDs that never got an endpoint: only leak repair frees them.
    let orphans = report.allocated_not_in_use.len();
    eprintln!("{orphans} orphan allocations without endpoint");

    // The runtime: DEL what it believes exists; drop sandboxes of failed ADDs without DEL.
    let _ternd = start_ternd(&node, dir.path());
    for p in pods.iter_mut() {
        if p.ip.is_some() {
            let r = tern_api::call(
                &sock,
                &Request::Del(DelRequest {
                    attachment: p.att.clone(),
                    delegated_ipam: false,
                }),
                None,
                Duration::from_secs(20),
            )
            .unwrap();
            assert_eq!(r, Ok(Reply::Done), "DEL {}", p.att.container_id);
        }
        p.ns.delete();
    }

    // Leak repair (grace 2 s, resync 1 s) reclaims every orphan.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let left = ipam.allocations(Some("n1")).unwrap();
        let report = tern_agent::audit::check(&*store, &ipam).unwrap();
        if left.is_empty() && report.problems() == 0 && report.endpoints_checked == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "not reclaimed: {left:?}\n{}\nlog:\n{}",
            tern_agent::audit::summary(&report),
            std::fs::read_to_string(dir.path().join("ternd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = std::fs::read_to_string(dir.path().join("ternd.log")).unwrap_or_default();
    let repaired = log.matches("leak repair: released").count();
    eprintln!("leak repair released {repaired} addresses");
    assert!(
        repaired >= orphans,
        "{orphans} orphans, {repaired} released by leak repair"
    );
}
