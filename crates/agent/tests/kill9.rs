//! Proof for leak repair: `kill -9` of `ternd` in the middle of concurrent ADDs, five times.
//! Afterwards no address is held twice, and once the runtime has deleted what it believes
//! exists (and dropped the sandboxes of failed ADDs without DEL), leak repair reclaims every
//! orphan: the node holds no allocation and `ipam check` finds nothing.
//!
//! ternd runs in a uniquely named node namespace, pods are uniquely named namespaces; all are
//! deleted by drop guards and ternd is killed by PID. The root namespace is never touched.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, DelRequest, Reply, Request};
use tern_ipam::Ipam;
use tern_testkit::netns::Netns;
use tern_testkit::ternd::Node;

struct Pod {
    ns: Netns,
    att: Attachment,
    ip: Option<IpAddr>,
}

fn add(sock: &Path, pod: &Netns, att: &Attachment) -> Result<IpAddr, String> {
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
    tern_testkit::need_root();
    let mut node = Node::new(&[
        "--default-ipv4-pool=10.78.0.0/22",
        "--resync-seconds=1",
        "--leak-grace-seconds=2",
        "--mtu=1500",
        "--metrics-addr=0",
        "--health-addr=0",
        "--log-level=info",
    ]);
    let ternd = &mut node.ternd;
    let sock: PathBuf = ternd.socket();
    let pods: Arc<Mutex<Vec<Pod>>> = Arc::default();
    let mut killed_mid_stream = 0;
    for round in 0..5 {
        ternd.start();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (sock, pods, stop, done) =
                    (sock.clone(), pods.clone(), stop.clone(), done.clone());
                std::thread::spawn(move || {
                    for i in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let ns = Netns::new("p");
                        let att = common::attachment(&format!("r{round}t{t}i{i}"), &ns.path());
                        let r = add(&sock, &ns, &att);
                        let failed = r.is_err();
                        pods.lock().unwrap().push(Pod {
                            ns,
                            att,
                            ip: r.ok(),
                        });
                        if failed {
                            // The agent is gone; this worker stops like a runtime would.
                            break;
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
        ternd.kill(); // SIGKILL
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        if pods.lock().unwrap().iter().any(|p| p.ip.is_none()) {
            killed_mid_stream += 1;
        }
    }
    assert!(killed_mid_stream > 0, "no ADD was ever interrupted");

    let store = ternd.store();
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
    ternd.start();
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
            ternd.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = ternd.log();
    let repaired = log.matches("leak repair: released").count();
    eprintln!("leak repair released {repaired} addresses");
    assert!(
        repaired >= orphans,
        "{orphans} orphans, {repaired} released by leak repair"
    );
}
