//! Tests of the allocator's caches: the round trips they save, and that every way a cached
//! value can go stale (another allocator, a policy change, an old block format) still gives
//! correct allocations.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tern_model::{IpReservation, IpReservationSpec, IpamConfigSpec, put_resource};
use tern_store::mem::MemStore;
use tern_store::testing::{Call, Hook, Hooked, Verdict};
use tern_store::{Store, keys};

use crate::testing::{put_node as node, put_pool as pool};
use crate::{AssignArgs, Block, Ipam};

/// Counts every store call by kind.
#[derive(Default)]
struct Calls {
    gets: AtomicUsize,
    ranges: AtomicUsize,
    txns: AtomicUsize,
}

impl Hook for Calls {
    fn before(&self, call: &Call<'_>) -> Verdict {
        let n = match call {
            Call::Get(_) => &self.gets,
            Call::Range(_) => &self.ranges,
            Call::Txn(_) => &self.txns,
            Call::Watch(..) => return Verdict::Forward,
        };
        n.fetch_add(1, Ordering::SeqCst);
        Verdict::Forward
    }
}

impl Calls {
    /// (gets, ranges, txns) since the last call.
    fn take(&self) -> (usize, usize, usize) {
        (
            self.gets.swap(0, Ordering::SeqCst),
            self.ranges.swap(0, Ordering::SeqCst),
            self.txns.swap(0, Ordering::SeqCst),
        )
    }
}

/// A memory store counting its calls (`.hook.take()`).
type Counting = Hooked<Calls>;

fn counting() -> Arc<Counting> {
    Hooked::new(Arc::new(MemStore::new()), Calls::default())
}

fn args(handle: &str, node: &str, v4: usize) -> AssignArgs {
    crate::testing::pod_args(handle, node, v4, 0)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn in_net(cidr: &str, a: IpAddr) -> bool {
    cidr.parse::<ipnet::IpNet>().unwrap().contains(&a)
}

#[test]
fn common_case_is_one_transaction_and_release_two_round_trips() {
    let s = counting();
    pool(&*s, "p", "10.244.0.0/16", 26, "all()", false);
    let ipam = Ipam::new(s.clone()).with_policy_ttl(Duration::from_secs(3600));
    ipam.auto_assign(&args("first", "n1", 1)).unwrap();
    s.hook.take();
    for i in 0..20 {
        ipam.auto_assign(&args(&format!("h{i}"), "n1", 1)).unwrap();
        assert_eq!(
            s.hook.take(),
            (0, 0, 1),
            "allocation {i}: (gets, ranges, txns)"
        );
    }
    for i in 0..20 {
        assert_eq!(ipam.release_by_handle(&format!("h{i}")).unwrap().len(), 1);
        assert_eq!(
            s.hook.take(),
            (1, 0, 1),
            "release {i}: (gets, ranges, txns)"
        );
    }
    // A handle the allocator has never seen (and no cached block, no policy read yet): read
    // the configuration (the migration lock), the handle, the block, CAS.
    let other = Ipam::new(s.clone());
    s.hook.take();
    assert_eq!(other.release_by_handle("first").unwrap().len(), 1);
    assert_eq!(s.hook.take(), (3, 0, 1));
    assert!(ipam.handles().unwrap().is_empty());
}

#[test]
fn two_allocators_for_one_node_never_double_allocate() {
    // The agent and a CLI (or two plugin processes) share a node and a store, each with its
    // own stale cache.
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/24", 28, "all()", false);
    let a = Ipam::new(s.clone());
    let b = Ipam::new(s.clone());
    let mut held: BTreeMap<IpAddr, String> = BTreeMap::new();
    let ipams = [&a, &b];
    for i in 0..40 {
        // Allocate through one, and now and then release the previous handle through the
        // other, so each one's cached blocks are regularly stale.
        let who = usize::from(i % 3 != 0);
        let handle = format!("h{i}");
        for got in ipams[who].auto_assign(&args(&handle, "n1", 1)).unwrap() {
            assert!(held.insert(got, handle.clone()).is_none(), "{got} twice");
        }
        if i % 5 == 4 {
            let prev = format!("h{}", i - 1);
            let released = ipams[1 - who].release_by_handle(&prev).unwrap();
            assert_eq!(released.len(), 1, "{prev}");
            held.remove(&released[0]);
        }
    }
    let stored: BTreeSet<IpAddr> = a.allocations(None).unwrap().iter().map(|x| x.ip).collect();
    assert_eq!(stored, held.keys().copied().collect());
    for h in a.handles().unwrap() {
        let n: u32 = h.blocks.values().sum();
        assert_eq!(
            n as usize,
            a.ips_by_handle(&h.id).unwrap().len(),
            "{}",
            h.id
        );
    }
}

#[test]
fn addresses_freed_by_another_allocator_are_reused_before_claiming() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/24", 30, "all()", false);
    let a = Ipam::new(s.clone());
    let b = Ipam::new(s.clone());
    let first: Vec<IpAddr> = (0..4)
        .flat_map(|i| a.auto_assign(&args(&format!("h{i}"), "n1", 1)).unwrap())
        .collect();
    // a's cached copy of the block is full; b frees an address in it.
    assert_eq!(b.release_by_handle("h2").unwrap(), [first[2]]);
    assert_eq!(a.auto_assign(&args("x", "n1", 1)).unwrap(), [first[2]]);
    assert_eq!(
        a.affinities(Some("n1")).unwrap().len(),
        1,
        "no second block"
    );
}

#[test]
fn policy_changes_by_others_take_effect_on_the_next_request() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "a", "10.1.0.0/24", 26, "zone == 'a'", false);
    pool(&*s, "b", "10.2.0.0/24", 26, "zone == 'b'", false);
    node(&*s, "n1", &[("zone", "a")]);
    // A TTL far longer than the test: only the guards can notice the changes.
    let ipam = Ipam::new(s.clone()).with_policy_ttl(Duration::from_secs(3600));
    assert!(in_net(
        "10.1.0.0/24",
        ipam.auto_assign(&args("h0", "n1", 1)).unwrap()[0]
    ));
    // Relabelled: pool a no longer selects the node.
    node(&*s, "n1", &[("zone", "b")]);
    assert!(in_net(
        "10.2.0.0/24",
        ipam.auto_assign(&args("h1", "n1", 1)).unwrap()[0]
    ));
    // Pool b disabled, a opened to everyone: back to a.
    pool(&*s, "b", "10.2.0.0/24", 26, "zone == 'b'", true);
    pool(&*s, "a", "10.1.0.0/24", 26, "all()", false);
    for i in 2..6 {
        let got = ipam.auto_assign(&args(&format!("h{i}"), "n1", 1)).unwrap();
        assert!(in_net("10.1.0.0/24", got[0]), "{got:?}");
    }
    // Pool a deleted, a new pool created: the next allocation comes from the new one.
    tern_model::delete_resource(&*s, tern_model::Kind::IpPool, None, "a").unwrap();
    pool(&*s, "c", "10.3.0.0/24", 26, "all()", false);
    let got = ipam.auto_assign(&args("h6", "n1", 1)).unwrap();
    assert!(in_net("10.3.0.0/24", got[0]), "{got:?}");
    // A request naming a pool created after the cache was filled.
    pool(&*s, "d", "10.4.0.0/24", 26, "all()", false);
    let mut named = args("h7", "n1", 1);
    named.v4_pools = vec!["d".into()];
    assert!(in_net("10.4.0.0/24", ipam.auto_assign(&named).unwrap()[0]));
    // Strict affinity switched on elsewhere: no borrowing from now on.
    let other = Ipam::new(s.clone());
    other.auto_assign(&args("o", "n2", 1)).unwrap();
    other.set_config(true, 1).unwrap();
    let mut from_d = args("h8", "n1", 64);
    from_d.v4_pools = vec!["d".into()];
    let e = ipam.auto_assign(&from_d).unwrap_err().to_string();
    assert!(e.contains("strict affinity"), "{e}");
}

#[test]
fn reservations_apply_after_the_ttl_or_at_once_without_cache() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/28", 28, "all()", false);
    let reserve = |cidr: &str| {
        let r = IpReservation::new(
            format!("r-{}", cidr.replace(['.', '/'], "-")),
            IpReservationSpec {
                reserved_cidrs: vec![cidr.into()],
            },
        );
        put_resource(&*s, &r.into()).unwrap();
    };
    let uncached = Ipam::new(s.clone()).with_policy_ttl(Duration::ZERO);
    assert_eq!(
        uncached.auto_assign(&args("h0", "n1", 1)).unwrap(),
        [ip("10.0.0.0")]
    );
    reserve("10.0.0.1/32");
    assert_eq!(
        uncached.auto_assign(&args("h1", "n1", 1)).unwrap(),
        [ip("10.0.0.2")]
    );
    let cached = Ipam::new(s.clone()).with_policy_ttl(Duration::from_millis(200));
    assert_eq!(
        cached.auto_assign(&args("h2", "n1", 1)).unwrap(),
        [ip("10.0.0.3")]
    );
    reserve("10.0.0.4/32");
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(
        cached.auto_assign(&args("h3", "n1", 1)).unwrap(),
        [ip("10.0.0.5")]
    );
    reserve("10.0.0.6/32");
    cached.invalidate_cache();
    assert_eq!(
        cached.auto_assign(&args("h4", "n1", 1)).unwrap(),
        [ip("10.0.0.7")]
    );
}

#[test]
fn a_cooldown_set_elsewhere_applies_at_once() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/30", 30, "all()", false);
    let ipam = Ipam::new(s.clone()).with_policy_ttl(Duration::from_secs(3600));
    for i in 0..4 {
        ipam.auto_assign(&args(&format!("h{i}"), "n1", 1)).unwrap();
    }
    Ipam::new(s.clone())
        .put_config(&IpamConfigSpec {
            release_cooldown_seconds: 600,
            ..IpamConfigSpec::default()
        })
        .unwrap();
    ipam.release_by_handle("h1").unwrap();
    assert!(
        ipam.auto_assign(&args("x", "n1", 1)).is_err(),
        "cooling down"
    );
}

#[test]
fn a_handle_that_exists_gets_its_counts_added() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/24", 29, "all()", false);
    let ipam = Ipam::new(s.clone());
    let mut all = ipam.auto_assign(&args("h", "n1", 3)).unwrap();
    // Same handle again (a retried ADD): the handle exists, the CAS on "absent" fails once.
    all.extend(ipam.auto_assign(&args("h", "n1", 7)).unwrap());
    assert_eq!(all.len(), 10);
    let rec = ipam.handles().unwrap();
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].blocks.values().sum::<u32>(), 10);
    assert_eq!(rec[0].blocks.len(), 2, "{:?}", rec[0].blocks);
    let mut released = ipam.release_by_handle("h").unwrap();
    released.sort();
    all.sort();
    assert_eq!(released, all);
    assert!(ipam.handles().unwrap().is_empty());
    assert!(ipam.allocations(None).unwrap().is_empty());
}

#[test]
fn blocks_in_the_old_format_are_used_and_migrated() {
    let s: Arc<dyn Store> = Arc::new(MemStore::new());
    pool(&*s, "p", "10.0.0.0/24", 30, "all()", false);
    // Written by an earlier version: n1 owns 10.0.0.0/30 with .0 held by handle "old".
    let old = br#"{"cidr":"10.0.0.0/30","affinity":"host:n1","allocations":[0,null,null,null],
        "unallocated":[1,2,3],"attributes":[{"handle_id":"old","secondary":{"namespace":"ns",
        "pod":"p","node":"n1","containerID":"old","ifname":"eth0"}}],"sequenceNumber":1,
        "sequenceNumberForAllocation":{"0":1},"deleted":false}"#;
    s.put(&keys::block("10.0.0.0/30"), old).unwrap();
    s.put(
        &keys::affinity("n1", "10.0.0.0/30"),
        br#"{"state":"confirmed"}"#,
    )
    .unwrap();
    s.put(&keys::handle("old"), br#"{"block":{"10.0.0.0/30":1}}"#)
        .unwrap();
    let ipam = Ipam::new(s.clone());
    assert_eq!(
        ipam.auto_assign(&args("new", "n1", 1)).unwrap(),
        [ip("10.0.0.1")]
    );
    let raw = s.get(&keys::block("10.0.0.0/30")).unwrap().unwrap().value;
    assert!(String::from_utf8_lossy(&raw).contains("\"v\":2"));
    let b: Block = serde_json::from_slice(&raw).unwrap();
    assert_eq!(b.handle_of(0), Some("old"));
    assert_eq!(b.handle_of(1), Some("new"));
    assert_eq!(b.unallocated, vec![2, 3]);
    assert_eq!(ipam.release_by_handle("old").unwrap(), [ip("10.0.0.0")]);
}
