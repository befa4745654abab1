//! The etcd backend rides through member and leader failures, against a real 3-member etcd
//! cluster on loopback ([`EtcdCluster`]: unique ports and data directories, every member killed
//! by PID on drop): streams of compare-and-swap increments and lease keep-alives go on while the
//! leader is SIGKILLed or the member the client talks to is stopped gracefully, every operation
//! succeeds, and no increment is lost or applied twice. A proxy that forwards a request and then
//! drops etcd's answer makes the "sent, outcome unknown" case deterministic, for the
//! transaction read-back. With every member down, a call fails within its retry budget and the
//! next ones fail at once.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tern_store::etcd::harness::{EtcdCluster, etcd_available, leader_of};
use tern_store::etcd::{EtcdStore, RetryPolicy, Timeouts};
use tern_store::{Compare, Op, Store, StoreError, Txn};

fn cluster() -> EtcdCluster {
    assert!(
        etcd_available(),
        "no etcd binary: install Debian's etcd-server or set TERN_ETCD_BIN"
    );
    EtcdCluster::start(3).expect("start a 3-member etcd cluster")
}

fn store(endpoints: &[String], budget: Duration) -> EtcdStore {
    EtcdStore::connect_with(
        endpoints,
        None,
        Timeouts::default(),
        RetryPolicy {
            budget,
            ..RetryPolicy::default()
        },
    )
    .expect("connect to the cluster")
}

/// Waits until the cluster agrees on a leader; returns its index.
fn wait_leader(c: &EtcdCluster) -> usize {
    let eps = c.endpoints();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = leader_of(&eps) {
            return l;
        }
        assert!(Instant::now() < deadline, "no leader: {}", c.log_tail());
        thread::sleep(Duration::from_millis(100));
    }
}

/// One CAS increment of `key` (read, then compare `mod_revision` and put); retried on a lost
/// race, never on an error. Returns the revision it committed at.
fn increment(s: &dyn Store, key: &str) -> Result<i64, StoreError> {
    loop {
        let (n, rev) = match s.get(key)? {
            Some(kv) => (
                String::from_utf8(kv.value).unwrap().parse::<u64>().unwrap(),
                kv.mod_revision,
            ),
            None => (0, 0),
        };
        let r = s.txn(Txn {
            compare: vec![Compare::ModRevision(key.to_string(), rev)],
            success: vec![Op::put(key, (n + 1).to_string())],
            failure: vec![],
        })?;
        if r.succeeded {
            return Ok(r.revision);
        }
    }
}

/// Latencies of a stream of operations: the slowest ones and the total above the usual.
#[derive(Default)]
struct Lat {
    all: Vec<Duration>,
}

impl Lat {
    fn report(&self, what: &str) -> Duration {
        let mut v = self.all.clone();
        v.sort();
        let median = v.get(v.len() / 2).copied().unwrap_or_default();
        let max = v.last().copied().unwrap_or_default();
        let extra: Duration = v.iter().map(|d| d.saturating_sub(median)).sum();
        eprintln!(
            "{what}: {} operations, median {median:?}, max {max:?}, extra over the median in total {extra:?}",
            v.len()
        );
        max
    }
}

/// Streams of single-writer CAS increments (one key per thread, so a read-back is always
/// conclusive) and lease keep-alives run while `fault` strikes the cluster; every operation
/// must succeed and every counter must end at exactly the number of increments made.
/// `leader_first`: the client's first endpoint is the leader, else a follower.
fn ride_through(leader_first: bool, fault: &dyn Fn(&mut EtcdCluster, usize) -> String) {
    let mut c = cluster();
    let leader = wait_leader(&c);
    let mut eps = c.endpoints();
    let first = if leader_first {
        leader
    } else {
        (leader + 1) % eps.len()
    };
    eps.rotate_left(first);
    let s = Arc::new(store(&eps, Duration::from_secs(10)));
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for t in 0..2 {
        let (s, stop, made) = (s.clone(), stop.clone(), made.clone());
        writers.push(thread::spawn(move || {
            let key = format!("/failover/counter{t}");
            let mut lat = Lat::default();
            let mut revs = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match increment(&*s, &key) {
                    Ok(r) => revs.push(r),
                    Err(e) => panic!("increment {} of {key} failed: {e}", revs.len() + 1),
                }
                lat.all.push(t0.elapsed());
                made.fetch_add(1, Ordering::Relaxed);
            }
            (key, revs, lat)
        }));
    }
    let keeper = {
        let (s, stop) = (s.clone(), stop.clone());
        thread::spawn(move || {
            let lease = s.lease_grant(Duration::from_secs(10)).unwrap();
            s.put_with_lease("/failover/leased", lease);
            let mut lat = Lat::default();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                s.lease_keepalive(lease)
                    .unwrap_or_else(|e| panic!("keep-alive failed: {e}"));
                lat.all.push(t0.elapsed());
                thread::sleep(Duration::from_millis(200));
            }
            lat
        })
    };
    // Some traffic first, then the fault, then traffic on the survivors.
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while made.load(Ordering::Relaxed) < n {
            assert!(
                Instant::now() < deadline,
                "only {} increments",
                made.load(Ordering::Relaxed)
            );
            thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(40);
    let what = fault(&mut c, first);
    let at = made.load(Ordering::Relaxed);
    eprintln!("{what} after {at} increments");
    wait_for(at + 60);
    stop.store(true, Ordering::Relaxed);
    let mut max = Duration::ZERO;
    for w in writers {
        let (key, revs, lat) = w.join().expect("a writer panicked");
        max = max.max(lat.report(&format!("CAS increments of {key}")));
        let kv = s.get(&key).unwrap().expect("counter exists");
        let value: usize = String::from_utf8(kv.value).unwrap().parse().unwrap();
        assert_eq!(
            value,
            revs.len(),
            "{key}: {} increments succeeded but the counter is {value} (lost or doubled)",
            revs.len()
        );
        assert_eq!(
            kv.version as usize,
            revs.len(),
            "{key}: one version per increment"
        );
        let mut sorted = revs.clone();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            revs.len(),
            "{key}: two increments share a revision"
        );
    }
    let lat = keeper.join().expect("the keep-alive thread panicked");
    lat.report("lease keep-alives");
    assert!(
        s.get("/failover/leased").unwrap().is_some(),
        "the kept-alive lease expired"
    );
    // Generous: an election, plus one per-attempt timeout on a member that held the request.
    assert!(max < Duration::from_secs(10), "an operation took {max:?}");
}

trait PutWithLease {
    fn put_with_lease(&self, key: &str, lease: i64);
}

impl PutWithLease for EtcdStore {
    fn put_with_lease(&self, key: &str, lease: i64) {
        self.txn(Txn {
            success: vec![Op::Put {
                key: key.to_string(),
                value: b"x".to_vec(),
                lease,
            }],
            ..Txn::default()
        })
        .unwrap();
    }
}

/// The observed failure: the client talks to a follower, the leader dies.
#[test]
fn cas_and_keepalives_survive_sigkill_of_the_leader() {
    ride_through(false, &|c, _first| {
        let leader = wait_leader(c);
        c.kill(leader);
        format!("SIGKILLed the leader (member {leader})")
    });
}

/// The client talks to the leader, which dies: its connections break mid-request.
#[test]
fn cas_and_keepalives_survive_sigkill_of_the_leader_in_use() {
    ride_through(true, &|c, first| {
        c.kill(first);
        format!("SIGKILLed the leader (member {first}, the client's first endpoint)")
    });
}

#[test]
fn cas_and_keepalives_survive_a_graceful_stop_of_the_member_in_use() {
    ride_through(false, &|c, first| {
        c.stop(first);
        format!("stopped member {first} (a follower, the client's first endpoint) with SIGTERM")
    });
}

#[test]
fn cas_and_keepalives_survive_a_graceful_stop_of_the_leader_in_use() {
    ride_through(true, &|c, first| {
        c.stop(first);
        format!("stopped member {first} (the leader, the client's first endpoint) with SIGTERM")
    });
}

#[test]
fn all_members_down_fails_within_the_budget_then_at_once() {
    let mut c = cluster();
    let budget = Duration::from_secs(3);
    let s = store(&c.endpoints(), budget);
    s.put("/down/k", b"v").unwrap();
    c.kill_all();
    let t0 = Instant::now();
    let e = s.get("/down/k").unwrap_err();
    let took = t0.elapsed();
    eprintln!("first call with every member down: {took:?}: {e}");
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(
        took >= budget && took < budget + Duration::from_secs(3),
        "took {took:?} for a budget of {budget:?}"
    );
    for ep in c.endpoints() {
        assert!(e.to_string().contains(&ep), "{e} does not name {ep}");
    }
    // Known down: the next calls make one pass (refused at once) instead of a second budget.
    let t0 = Instant::now();
    let e = s.put("/down/k", b"w").unwrap_err();
    let took = t0.elapsed();
    eprintln!("next call: {took:?}: {e}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    // A write that was never sent is not ambiguous.
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
}

/// A TCP proxy to `upstream` that, while `drop_answers` is above zero, forwards a request, waits
/// for etcd's answer, calls `on_drop`, and closes the client connection without relaying it:
/// the request was applied and the client cannot know.
struct LossyProxy {
    endpoint: String,
    drop_answers: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl LossyProxy {
    fn start(upstream: String, on_drop: Arc<dyn Fn() + Send + Sync>) -> LossyProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = l.local_addr().unwrap().to_string();
        let drop_answers = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (d, n) = (drop_answers.clone(), dropped.clone());
        thread::spawn(move || {
            for client in l.incoming() {
                let Ok(client) = client else { break };
                let Ok(up) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (d, n, on_drop) = (d.clone(), n.clone(), on_drop.clone());
                thread::spawn(move || serve(client, up, d, n, &*on_drop));
            }
        });
        LossyProxy {
            endpoint,
            drop_answers,
            dropped,
        }
    }
}

fn serve(
    mut client: TcpStream,
    mut up: TcpStream,
    drop_answers: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
    on_drop: &dyn Fn(),
) {
    let mut c2 = client.try_clone().unwrap();
    let mut u2 = up.try_clone().unwrap();
    let lossy = Arc::new(Mutex::new(false));
    let l2 = lossy.clone();
    // Requests: decide per request whether its answer is lost.
    thread::spawn(move || {
        let mut buf = [0u8; 65536];
        loop {
            match c2.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = u2.shutdown(Shutdown::Write);
                    break;
                }
                Ok(n) => {
                    if buf[..n].starts_with(b"POST /v3/kv/txn")
                        && drop_answers
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                            .is_ok()
                    {
                        *l2.lock().unwrap() = true;
                    }
                    if u2.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut buf = [0u8; 65536];
    loop {
        match up.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = client.shutdown(Shutdown::Both);
                break;
            }
            Ok(n) => {
                if *lossy.lock().unwrap() {
                    dropped.fetch_add(1, Ordering::SeqCst);
                    on_drop();
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = up.shutdown(Shutdown::Both);
                    break;
                }
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
}

#[test]
fn a_transaction_whose_answer_was_lost_is_not_applied_twice() {
    let c = cluster();
    let direct = store(&c.endpoints(), Duration::from_secs(5));
    let interfere = Arc::new(AtomicBool::new(false));
    let on_drop: Arc<dyn Fn() + Send + Sync> = {
        let (d, i) = (direct.clone(), interfere.clone());
        Arc::new(move || {
            if i.load(Ordering::SeqCst) {
                // Another writer moves the key on before the client can resend.
                d.put("/lossy/counter", b"100").unwrap();
            }
        })
    };
    let proxy = LossyProxy::start(c.endpoints()[0].clone(), on_drop);
    // The proxy first, then the real members: the resend goes to a member directly.
    let mut eps = vec![proxy.endpoint.clone()];
    eps.extend(c.endpoints());
    let s = store(&eps, Duration::from_secs(5));

    // 1. A CAS increment applied, answer lost: the read-back recognises it, exactly once.
    increment(&s, "/lossy/counter").unwrap();
    // Talk to the proxy again (it was penalized by the lost answer).
    let s = store(&eps, Duration::from_secs(5));
    proxy.drop_answers.store(1, Ordering::SeqCst);
    let r = increment(&s, "/lossy/counter").unwrap();
    assert_eq!(
        proxy.dropped.load(Ordering::SeqCst),
        1,
        "no answer was dropped"
    );
    let kv = direct.get("/lossy/counter").unwrap().unwrap();
    assert_eq!(kv.value, b"2", "the increment was lost or applied twice");
    assert_eq!(kv.mod_revision, r, "the reported revision is the write's");

    // 2. A blind put (no compare) whose answer was lost is simply resent.
    let s = store(&eps, Duration::from_secs(5));
    proxy.drop_answers.store(1, Ordering::SeqCst);
    s.put("/lossy/plain", b"p").unwrap();
    assert_eq!(proxy.dropped.load(Ordering::SeqCst), 2);
    assert_eq!(direct.get("/lossy/plain").unwrap().unwrap().value, b"p");

    // 3. Applied, answer lost, and the key moved on before the resend: the store cannot tell,
    // and says so distinctly from a failed compare.
    let s = store(&eps, Duration::from_secs(5));
    interfere.store(true, Ordering::SeqCst);
    proxy.drop_answers.store(1, Ordering::SeqCst);
    let kv = direct.get("/lossy/counter").unwrap().unwrap();
    let e = s
        .txn(Txn {
            compare: vec![Compare::ModRevision(
                "/lossy/counter".into(),
                kv.mod_revision,
            )],
            success: vec![Op::put("/lossy/counter", "3")],
            failure: vec![],
        })
        .unwrap_err();
    assert_eq!(proxy.dropped.load(Ordering::SeqCst), 3);
    assert!(matches!(e, StoreError::Ambiguous(_)), "{e}");
    eprintln!("ambiguous outcome reported as: {e}");

    // 4. Not applied because the compare failed: an ordinary failed compare, no error.
    let s = store(&eps, Duration::from_secs(5));
    let r = s
        .txn(Txn {
            compare: vec![Compare::ModRevision("/lossy/counter".into(), 1)],
            success: vec![Op::put("/lossy/counter", "4")],
            failure: vec![],
        })
        .unwrap();
    assert!(!r.succeeded);
}
