//! Behaviour of the block allocator over the in-memory store (and SQLite for a few cases).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tern_ipam::testing::pod_args as args;
use tern_ipam::*;
use tern_model::{IpPool, IpPoolSpec, IpamConfig, IpamConfigSpec, put_resource};
use tern_store::mem::MemStore;
use tern_store::testing::{Call, Hook, Hooked, Verdict};
use tern_store::{Store, keys};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn add_pool(store: &dyn Store, name: &str, cidr: &str, block_size: u8) {
    let mut spec = IpPoolSpec::new(cidr);
    spec.block_size = block_size;
    put_resource(store, &IpPool::new(name, spec).into()).unwrap();
}

fn set_config(store: &dyn Store, strict: bool, max_blocks: u32) {
    let c = IpamConfig::new(
        "default",
        IpamConfigSpec {
            strict_affinity: strict,
            max_blocks_per_host: max_blocks,
            ..IpamConfigSpec::default()
        },
    );
    put_resource(store, &c.into()).unwrap();
}

fn mem() -> Arc<dyn Store> {
    Arc::new(MemStore::new())
}

#[test]
fn allocates_in_order_from_a_claimed_block() {
    let store = mem();
    add_pool(&*store, "p", "10.244.0.0/16", 26);
    let ipam = Ipam::new(store.clone());
    let a = ipam.auto_assign(&args("h1", "n1", 1, 0)).unwrap();
    let b = ipam.auto_assign(&args("h2", "n1", 2, 0)).unwrap();
    let base = match a[0] {
        IpAddr::V4(v) => u32::from(v),
        _ => panic!(),
    };
    // The first address of the node's block, then the next ones in order.
    assert_eq!(base % 64, 0);
    let want: Vec<IpAddr> = (1..3).map(|i| IpAddr::V4((base + i).into())).collect();
    assert_eq!(b, want);
    let block = format!("{}/26", a[0]);
    let aff = store.get(&keys::affinity("n1", &block)).unwrap().unwrap();
    assert_eq!(
        String::from_utf8(aff.value).unwrap(),
        r#"{"state":"confirmed"}"#
    );
    assert_eq!(ipam.ips_by_handle("h2").unwrap(), want);

    let usage = ipam.usage().unwrap();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].pool, "p");
    assert_eq!(usage[0].total, 65536);
    assert_eq!(usage[0].in_use, 3);
    assert_eq!(usage[0].blocks.len(), 1);
    assert_eq!(usage[0].blocks[0].cidr.to_string(), block);
    assert_eq!(usage[0].blocks[0].total, 64);
    assert_eq!(usage[0].blocks[0].affinity.as_deref(), Some("n1"));

    let allocs = ipam.allocations(Some("n1")).unwrap();
    assert_eq!(allocs.len(), 3);
    assert_eq!(allocs[1].handle.as_deref(), Some("h2"));
    assert_eq!(allocs[1].attrs.pod, "pod-h2");
    assert!(ipam.allocations(Some("n2")).unwrap().is_empty());
}

#[test]
fn nodes_claim_different_blocks_and_more_when_full() {
    let store = mem();
    add_pool(&*store, "p", "10.244.0.0/24", 30);
    let ipam = Ipam::new(store.clone());
    let a = ipam.auto_assign(&args("a", "node-a", 1, 0)).unwrap()[0];
    let b = ipam.auto_assign(&args("b", "node-b", 1, 0)).unwrap()[0];
    let blk = |ip: IpAddr| ipnet::IpNet::new(ip, 30).unwrap().trunc();
    assert_ne!(blk(a), blk(b));
    // node-a fills its block and claims a second one for the fifth address.
    let more = ipam.auto_assign(&args("a2", "node-a", 4, 0)).unwrap();
    assert!(more[..3].iter().all(|ip| blk(*ip) == blk(a)));
    assert_ne!(blk(more[3]), blk(a));
    assert_ne!(blk(more[3]), blk(b));
    let (affs, _) = store.range(&keys::node_affinities("node-a")).unwrap();
    assert_eq!(affs.len(), 2);
    // The same node walks the same order: the claim order is deterministic.
    let store2 = mem();
    add_pool(&*store2, "p", "10.244.0.0/24", 30);
    let a_again = Ipam::new(store2)
        .auto_assign(&args("a", "node-a", 1, 0))
        .unwrap()[0];
    assert_eq!(a_again, a);
}

#[test]
fn exhaustion_of_a_small_pool() {
    let store = mem();
    add_pool(&*store, "tiny", "10.9.0.0/30", 30);
    let ipam = Ipam::new(store);
    let got = ipam.auto_assign(&args("h", "n1", 4, 0)).unwrap();
    assert_eq!(
        got,
        ["10.9.0.0", "10.9.0.1", "10.9.0.2", "10.9.0.3"].map(ip)
    );
    let err = ipam.auto_assign(&args("h2", "n1", 1, 0)).unwrap_err();
    assert!(matches!(err, IpamError::PoolsExhausted { .. }));
    assert_eq!(
        err.to_string(),
        "no free address in pools [tiny] for node n1"
    );
    // Asking for more than is free takes nothing.
    ipam.release_ips(&[ip("10.9.0.1")]).unwrap();
    assert!(ipam.auto_assign(&args("h3", "n1", 2, 0)).is_err());
    assert_eq!(ipam.usage().unwrap()[0].in_use, 3);
    assert!(ipam.ips_by_handle("h3").unwrap().is_empty());
}

#[test]
fn borrowing_unless_strict_affinity() {
    let store = mem();
    add_pool(&*store, "tiny", "10.9.0.0/30", 30);
    let ipam = Ipam::new(store.clone());
    ipam.auto_assign(&args("h1", "n1", 1, 0)).unwrap();
    // n2 has no block and none is left to claim: it borrows from n1's block.
    let got = ipam.auto_assign(&args("h2", "n2", 1, 0)).unwrap();
    assert_eq!(got, vec![ip("10.9.0.1")]);
    let n2: Vec<_> = ipam.allocations(Some("n2")).unwrap();
    assert_eq!(n2.len(), 1);
    assert_eq!(n2[0].ip, ip("10.9.0.1"));

    set_config(&*store, true, 20);
    let err = ipam.auto_assign(&args("h3", "n2", 1, 0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no free address in pools [tiny] for node n2: no more free affine blocks and strict affinity enabled"
    );
}

#[test]
fn max_blocks_per_host() {
    let store = mem();
    add_pool(&*store, "p", "10.9.0.0/28", 30);
    set_config(&*store, true, 1);
    let ipam = Ipam::new(store.clone());
    ipam.auto_assign(&args("h1", "n1", 4, 0)).unwrap();
    let err = ipam.auto_assign(&args("h2", "n1", 1, 0)).unwrap_err();
    assert!(
        err.to_string()
            .contains("limit of 1 blocks reached for this node"),
        "{err}"
    );
    set_config(&*store, true, 0);
    ipam.auto_assign(&args("h2", "n1", 1, 0)).unwrap();
}

#[test]
fn release_is_idempotent() {
    let store = mem();
    add_pool(&*store, "p", "10.244.0.0/16", 26);
    let ipam = Ipam::new(store.clone());
    let got = ipam.auto_assign(&args("h", "n1", 2, 0)).unwrap();
    assert_eq!(ipam.release_by_handle("h").unwrap(), got);
    assert!(ipam.release_by_handle("h").unwrap().is_empty());
    assert!(ipam.release_by_handle("never-seen").unwrap().is_empty());
    assert!(store.get(&keys::handle("h")).unwrap().is_none());
    assert!(ipam.release_ips(&got).unwrap().is_empty());
    assert_eq!(ipam.usage().unwrap()[0].in_use, 0);
}

#[test]
fn released_addresses_are_reused_last() {
    let store = mem();
    add_pool(&*store, "tiny", "10.9.0.0/30", 30);
    let ipam = Ipam::new(store);
    for h in ["a", "b", "c"] {
        ipam.auto_assign(&args(h, "n1", 1, 0)).unwrap();
    }
    assert_eq!(ipam.release_by_handle("a").unwrap(), vec![ip("10.9.0.0")]);
    // .3 has never been used: it goes before the just-released .0.
    assert_eq!(
        ipam.auto_assign(&args("d", "n1", 1, 0)).unwrap(),
        vec![ip("10.9.0.3")]
    );
    assert_eq!(
        ipam.auto_assign(&args("e", "n1", 1, 0)).unwrap(),
        vec![ip("10.9.0.0")]
    );
}

#[test]
fn release_by_ip_updates_the_handle() {
    let store = mem();
    add_pool(&*store, "p", "10.244.0.0/16", 26);
    let ipam = Ipam::new(store.clone());
    let got = ipam.auto_assign(&args("h", "n1", 3, 0)).unwrap();
    assert_eq!(ipam.release_ips(&got[..1]).unwrap(), got[..1].to_vec());
    assert_eq!(ipam.ips_by_handle("h").unwrap(), got[1..].to_vec());
    ipam.release_ips(&got[1..]).unwrap();
    assert!(store.get(&keys::handle("h")).unwrap().is_none());
}

#[test]
fn stale_allocation_is_not_released() {
    let store = mem();
    add_pool(&*store, "tiny", "10.9.0.0/32", 32);
    let ipam = Ipam::new(store);
    ipam.auto_assign(&args("old", "n1", 1, 0)).unwrap();
    let seen = ipam.allocations(None).unwrap();
    // The address is released and handed to someone else before the repair acts.
    ipam.release_by_handle("old").unwrap();
    ipam.auto_assign(&args("new", "n1", 1, 0)).unwrap();
    assert!(ipam.release_allocations(&seen).unwrap().is_empty());
    assert_eq!(ipam.ips_by_handle("new").unwrap(), vec![ip("10.9.0.0")]);
    let now = ipam.allocations(None).unwrap();
    assert_eq!(
        ipam.release_allocations(&now).unwrap(),
        vec![ip("10.9.0.0")]
    );
}

#[test]
fn specific_addresses() {
    let store = mem();
    add_pool(&*store, "p", "10.244.0.0/16", 26);
    let ipam = Ipam::new(store.clone());
    let a = args("fixed", "n1", 0, 0).attrs;
    ipam.assign_ip(ip("10.244.7.3"), "fixed", &a).unwrap();
    assert_eq!(ipam.ips_by_handle("fixed").unwrap(), vec![ip("10.244.7.3")]);
    let err = ipam.assign_ip(ip("10.244.7.3"), "other", &a).unwrap_err();
    assert_eq!(
        err.to_string(),
        "10.244.7.3 is already in use (handle fixed)"
    );
    let err = ipam.assign_ip(ip("10.99.0.1"), "other", &a).unwrap_err();
    assert_eq!(err.to_string(), "10.99.0.1 is not in any enabled IP pool");
    // The block was created affine to the node; automatic assignment now uses it and skips .3.
    let got = ipam.auto_assign(&args("auto", "n1", 4, 0)).unwrap();
    assert_eq!(
        got,
        ["10.244.7.0", "10.244.7.1", "10.244.7.2", "10.244.7.4"].map(ip)
    );
}

#[test]
fn dual_stack_is_all_or_nothing() {
    let store = mem();
    add_pool(&*store, "v4", "10.244.0.0/16", 26);
    let ipam = Ipam::new(store.clone());
    let err = ipam.auto_assign(&args("h", "n1", 1, 1)).unwrap_err();
    assert!(matches!(err, IpamError::NoPools { family: 6, .. }), "{err}");
    assert_eq!(ipam.usage().unwrap()[0].in_use, 0);
    assert!(store.get(&keys::handle("h")).unwrap().is_none());

    add_pool(&*store, "v6", "fd00:10::/64", 122);
    let got = ipam.auto_assign(&args("h", "n1", 1, 1)).unwrap();
    assert!(got[0].is_ipv4() && got[1].is_ipv6());
    let v6: ipnet::IpNet = "fd00:10::/64".parse().unwrap();
    assert!(v6.contains(&got[1]));
}

#[test]
fn pool_selection() {
    let store = mem();
    add_pool(&*store, "a", "10.1.0.0/16", 26);
    add_pool(&*store, "b", "10.2.0.0/16", 26);
    let mut off = IpPoolSpec::new("10.3.0.0/16");
    off.disabled = true;
    put_resource(&*store, &IpPool::new("off", off).into()).unwrap();
    let ipam = Ipam::new(store);
    assert_eq!(ipam.usable_pools("n1").unwrap(), ["a", "b"]);
    let mut req = args("h", "n1", 1, 0);
    req.v4_pools = vec!["10.2.0.0/16".into()];
    assert!(matches!(ipam.auto_assign(&req).unwrap()[0], IpAddr::V4(v) if v.octets()[1] == 2));
    req.v4_pools = vec!["off".into()];
    assert!(matches!(
        ipam.auto_assign(&req),
        Err(IpamError::NoPools { .. })
    ));
    req.v4_pools = vec!["nope".into()];
    assert_eq!(
        ipam.auto_assign(&req).unwrap_err().to_string(),
        "no usable IPv4 pool for node n1: requested pool \"nope\" does not exist"
    );
}

#[test]
fn default_pool_is_created_once() {
    let store = mem();
    let ipam = Ipam::new(store);
    assert!(ipam.ensure_default_pool("10.244.0.0/16").unwrap());
    assert!(!ipam.ensure_default_pool("10.245.0.0/16").unwrap());
    let u = ipam.usage().unwrap();
    assert_eq!(u.len(), 1);
    assert_eq!(u[0].pool, "default-ipv4-ippool");
    assert_eq!(u[0].cidr.to_string(), "10.244.0.0/16");
    let got = ipam.auto_assign(&args("h", "n1", 1, 0)).unwrap();
    assert_eq!(ipam.usage().unwrap()[0].blocks[0].cidr.prefix_len(), 26);
    assert!(got[0].to_string().starts_with("10.244."));
}

/// Counts transactions (every write goes through `txn`).
#[derive(Default)]
struct Writes(AtomicUsize);

impl Hook for Writes {
    fn before(&self, call: &Call<'_>) -> Verdict {
        if let Call::Txn(_) = call {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Verdict::Forward
    }
}

#[test]
fn one_write_per_allocation_in_an_owned_block() {
    let counting = Hooked::new(mem(), Writes::default());
    add_pool(&*counting, "p", "10.244.0.0/16", 26);
    let ipam = Ipam::new(counting.clone());
    ipam.auto_assign(&args("first", "n1", 1, 0)).unwrap();
    for i in 0..10 {
        let before = counting.hook.0.load(Ordering::SeqCst);
        ipam.auto_assign(&args(&format!("h{i}"), "n1", 1, 0))
            .unwrap();
        assert_eq!(counting.hook.0.load(Ordering::SeqCst) - before, 1);
    }
    let before = counting.hook.0.load(Ordering::SeqCst);
    ipam.release_by_handle("h3").unwrap();
    assert_eq!(counting.hook.0.load(Ordering::SeqCst) - before, 1);
}

/// Many threads assign and release concurrently; no address is ever held by two handles.
fn stress(store: Arc<dyn Store>, threads: usize, rounds: usize) {
    add_pool(&*store, "p", "10.244.0.0/24", 26);
    let ipam = Ipam::new(store);
    let live: Arc<Mutex<BTreeMap<IpAddr, String>>> = Arc::default();
    std::thread::scope(|s| {
        for t in 0..threads {
            let ipam = ipam.clone();
            let live = live.clone();
            s.spawn(move || {
                let node = format!("n{}", t % 2);
                let mut mine: Vec<(String, IpAddr)> = Vec::new();
                for r in 0..rounds {
                    if r % 3 != 2 || mine.is_empty() {
                        let h = format!("t{t}-r{r}");
                        let got = ipam.auto_assign(&args(&h, &node, 1, 0)).unwrap();
                        let mut l = live.lock().unwrap();
                        if let Some(prev) = l.insert(got[0], h.clone()) {
                            panic!("{} handed to {h} while held by {prev}", got[0]);
                        }
                        drop(l);
                        mine.push((h, got[0]));
                    }
                    if mine.len() > 4 || r % 3 == 2 {
                        let (h, ip) = mine.remove(0);
                        // Forget it before the store frees it, so a reuse is not a false alarm.
                        live.lock().unwrap().remove(&ip);
                        assert_eq!(ipam.release_by_handle(&h).unwrap(), vec![ip]);
                    }
                }
            });
        }
    });
    // The store agrees with what the threads believe they hold.
    let allocs = ipam.allocations(None).unwrap();
    let held: BTreeMap<IpAddr, String> = allocs
        .iter()
        .map(|a| (a.ip, a.handle.clone().unwrap()))
        .collect();
    assert_eq!(held.len(), allocs.len());
    assert_eq!(held, *live.lock().unwrap());
    let handles: HashSet<_> = held.values().collect();
    for h in handles {
        assert_eq!(ipam.ips_by_handle(h).unwrap().len(), 1);
    }
}

#[test]
fn concurrent_assign_release_on_memstore() {
    stress(mem(), 8, 150);
}

#[test]
fn concurrent_assign_release_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ipam.db", dir.path().display());
    stress(tern_store::open(&url).unwrap(), 4, 30);
}

#[test]
fn sqlite_basic_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ipam.db", dir.path().display());
    let store = tern_store::open(&url).unwrap();
    add_pool(&*store, "tiny", "10.9.0.0/30", 30);
    let ipam = Ipam::new(store);
    let got = ipam.auto_assign(&args("h", "n1", 2, 0)).unwrap();
    assert_eq!(got, ["10.9.0.0", "10.9.0.1"].map(ip));
    // A second process (here: a second connection) sees the same state.
    let again = Ipam::new(tern_store::open(&url).unwrap());
    assert_eq!(again.ips_by_handle("h").unwrap(), got);
    assert_eq!(again.release_by_handle("h").unwrap(), got);
}
