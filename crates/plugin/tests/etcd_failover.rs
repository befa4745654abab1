//! A 3-member etcd losing a member under a stream of pod ADDs, end to end: real `ternd` and the
//! real `tern` plugin in a node network namespace, and three real etcd members inside that
//! namespace (ternd resolves `127.0.0.1` there). The leader is SIGKILLed while ternd talks to a
//! follower, and separately the member ternd talks to first is stopped gracefully: every ADD
//! succeeds, no address is handed out twice, `ternctl ipam check` is clean, and the extra
//! latency is printed. With every member down for longer than the store's retry budget, ADD
//! fails with CNI code 11 ("try again later"), never 101.
//!
//! Every etcd member is killed by PID on drop ([`EtcdCluster`]), before the node's namespace
//! goes away.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tern_store::etcd::harness::{EtcdCluster, leader_of, member_status, transfer_leadership};
use tern_store::etcd::{EtcdStore, Timeouts};

/// Client and peer ports of the three members inside the node namespace (a fresh namespace:
/// fixed ports cannot collide with other tests).
const PORTS: [(u16, u16); 3] = [(23791, 23801), (23792, 23802), (23793, 23803)];

fn etcd_url() -> String {
    let eps: Vec<String> = PORTS
        .iter()
        .map(|(c, _)| format!("127.0.0.1:{c}"))
        .collect();
    format!("etcd://{}", eps.join(","))
}

fn endpoints() -> Vec<String> {
    PORTS
        .iter()
        .map(|(c, _)| format!("127.0.0.1:{c}"))
        .collect()
}

/// Starts the three members inside the node's namespace.
fn start_cluster(node: &Node) -> EtcdCluster {
    let ns_path = node.ns.path();
    let ready = move |ep: &str| {
        let (ns, ep) = (ns_path.clone(), ep.to_string());
        in_netns(&ns, move || {
            let quick = Timeouts {
                connect: Duration::from_millis(300),
                request: Duration::from_secs(1),
            };
            EtcdStore::connect(&[ep], None, quick).is_ok()
        })
    };
    EtcdCluster::start_on(&PORTS, &["ip", "netns", "exec", node.name()], &ready)
        .expect("starting a 3-member etcd in the node namespace")
}

/// The leader's index, asked from inside the node namespace; waits up to 20 s for one.
fn leader(node: &Node) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = in_netns(&node.ns.path(), || leader_of(&endpoints())) {
            return l;
        }
        assert!(Instant::now() < deadline, "the cluster elected no leader");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Makes member `want` the leader (ternd talks to its first endpoint, member 0).
fn make_leader(node: &Node, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while leader(node) != want {
        let l = leader(node);
        let eps = endpoints();
        let moved = in_netns(&node.ns.path(), move || {
            let target = member_status(&eps[want])?.member_id;
            transfer_leadership(&eps[l], target)
        });
        if let Err(e) = moved {
            eprintln!("moving the leadership: {e}");
        }
        assert!(
            Instant::now() < deadline,
            "could not make member {want} the leader"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `ternctl ipam check` inside the node namespace: exit status and output.
fn ipam_check(node: &Node) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", node.name()])
        .arg(ternctl_bin())
        .args(["--store", &etcd_url(), "ipam", "check"])
        .env_remove("TERN_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("running ternctl ipam check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Two parallel streams of ADDs (`per_stream` each, a fresh pod each); `fault` runs on its own
/// thread once `trigger` ADDs have completed, so that ADDs are in flight when it strikes. Every
/// ADD must succeed; returns (container ID, address, latency) of each, and the pods (which must
/// outlive the checks: ternd releases the endpoint of a pod whose namespace is gone).
fn add_stream(
    node: &Node,
    per_stream: usize,
    trigger: usize,
    fault: &(dyn Fn() -> String + Sync),
) -> (Vec<(String, IpAddr, Duration)>, Vec<Pod>) {
    let conf = node.conf("1.0.0");
    let done = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let pods = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(60);
            while done.load(Ordering::SeqCst) < trigger {
                assert!(Instant::now() < deadline, "the ADD stream stalled");
                std::thread::sleep(Duration::from_millis(5));
            }
            let what = fault();
            eprintln!("{what} with {} ADDs done", done.load(Ordering::SeqCst));
        });
        for stream in 0..2 {
            let (conf, done, results, pods) = (&conf, &done, &results, &pods);
            s.spawn(move || {
                for i in 0..per_stream {
                    let pod = Pod::new();
                    let id = format!("failover-{stream}-{i}");
                    let t0 = Instant::now();
                    let out = node.cni("ADD", &pod, &id, "eth0", conf);
                    let took = t0.elapsed();
                    assert_eq!(
                        out.status,
                        0,
                        "ADD {id} failed after {took:?}: {}\n{}",
                        out.json,
                        node.agent_log()
                    );
                    results
                        .lock()
                        .unwrap()
                        .push((id, result_ip(&out.json), took));
                    pods.lock().unwrap().push(pod);
                    done.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (results.into_inner().unwrap(), pods.into_inner().unwrap())
}

/// Asserts distinct addresses, one allocation per ADD, a clean IPAM check; prints latencies.
fn check_outcome(node: &Node, what: &str, results: &[(String, IpAddr, Duration)]) {
    let ips: BTreeSet<IpAddr> = results.iter().map(|r| r.1).collect();
    assert_eq!(ips.len(), results.len(), "an address was handed out twice");
    let allocs = node.allocations();
    for (id, ip, _) in results {
        let mine: Vec<IpAddr> = allocs
            .iter()
            .filter(|a| a.attrs.container_id == *id)
            .map(|a| a.ip)
            .collect();
        assert_eq!(mine, vec![*ip], "allocations of {id}");
    }
    let (clean, report) = ipam_check(node);
    assert!(clean, "ternctl ipam check found problems:\n{report}");
    let mut lat: Vec<Duration> = results.iter().map(|r| r.2).collect();
    lat.sort();
    let median = lat[lat.len() / 2];
    let max = lat[lat.len() - 1];
    let extra: Duration = lat.iter().map(|d| d.saturating_sub(median)).sum();
    eprintln!(
        "{what}: {} ADDs all succeeded, median {median:?}, max {max:?}, extra latency over the \
         median in total {extra:?}; slowest: {:?}",
        lat.len(),
        &lat[lat.len().saturating_sub(4)..]
    );
}

/// A node on a 3-member cluster whose leader is member `leader`, under [`add_stream`]: `fault`
/// strikes (it gets the node and the cluster, and says what it did) once six ADDs are done;
/// when the stream is done, `after` runs while the cluster still does, then the outcome is
/// checked as [`check_outcome`].
fn ride_through(
    leader: usize,
    what: &str,
    fault: &(dyn Fn(&Node, &Mutex<EtcdCluster>) -> String + Sync),
    after: impl FnOnce(&Node),
) {
    // Declared first, dropped last: etcd is killed before the node's namespace goes.
    let mut node = Node::unstarted_with_store(&etcd_url());
    let cluster = Mutex::new(start_cluster(&node));
    make_leader(&node, leader);
    node.start();
    let (results, _pods) = add_stream(&node, 12, 6, &|| fault(&node, &cluster));
    after(&node);
    check_outcome(&node, what, &results);
}

#[test]
fn adds_ride_through_sigkill_of_the_leader() {
    need_etcd();
    // ternd talks to a follower, as in the observed failure.
    ride_through(
        1,
        "leader SIGKILLed",
        &|node, cluster| {
            let l = leader(node);
            cluster.lock().unwrap().kill(l);
            format!("SIGKILLed the leader (member {l}; ternd talks to member 0)")
        },
        |node| eprintln!("new leader: member {}", leader(node)),
    );
}

#[test]
fn adds_ride_through_a_graceful_stop_of_the_member_in_use() {
    need_etcd();
    // The member ternd talks to is the leader: stopping it breaks ternd's connections and
    // hands the leadership over.
    ride_through(
        0,
        "member in use stopped",
        &|_, cluster| {
            cluster.lock().unwrap().stop(0);
            "stopped member 0 (ternd's first endpoint, the leader) with SIGTERM".to_string()
        },
        |_| {},
    );
}

#[test]
fn every_member_down_longer_than_the_budget_fails_add_with_code_11() {
    need_etcd();
    let mut node = Node::unstarted_with_store(&etcd_url());
    let mut cluster = start_cluster(&node);
    node.start();
    let conf = node.conf("1.0.0");
    let pod = Pod::new();
    let (_, ip, _) = node.add_pod(&pod, "all-down-before", &conf);

    cluster.kill_all();
    let pod_b = Pod::new();
    let (add, took) = timed(|| node.cni("ADD", &pod_b, "all-down", "eth0", &conf));
    eprintln!("ADD with every member down took {took:?}: {}", add.json);
    assert_store_unreachable(&add.fails_with(11));
    // The store's budget (6 s) plus the ADD's own work; the runtime hears "later" in time.
    assert!(took < Duration::from_secs(15), "ADD took {took:?}");
    assert!(!pod_b.has_link("eth0"), "a failed ADD left eth0 in the pod");
    // Still down: the next ADD is told at once, not after another budget.
    let pod_c = Pod::new();
    let t0 = Instant::now();
    node.cni("ADD", &pod_c, "all-down-2", "eth0", &conf)
        .fails_with(11);
    eprintln!("next ADD with every member down took {:?}", t0.elapsed());
    assert!(
        pod.ipv4("eth0")
            .iter()
            .any(|a| a.starts_with(&ip.to_string()))
    );
}
