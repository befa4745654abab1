//! Calico-class IPAM behaviour: node selectors, reservations, release cooldown, empty-block
//! release, migrations (strictAffinity flip, disabling a pool with live allocations), dual
//! stack all-or-nothing, stale releases and bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tern_ipam::testing::{pod_args as args, put_node as node, put_pool as pool};
use tern_ipam::*;
use tern_model::{
    IpPool, IpPoolSpec, IpReservation, IpReservationSpec, IpamConfigSpec, put_resource,
};
use tern_store::mem::MemStore;
use tern_store::{Store, keys};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A manual clock (unix seconds) and an allocator using it.
fn clocked(store: Arc<dyn Store>, start: u64) -> (Ipam, Arc<AtomicU64>) {
    let t = Arc::new(AtomicU64::new(start));
    let t2 = t.clone();
    (
        Ipam::with_clock(store, Arc::new(move || t2.load(Ordering::SeqCst))),
        t,
    )
}

fn mem() -> Arc<dyn Store> {
    Arc::new(MemStore::new())
}

#[test]
fn node_selector_picks_pools_by_node_labels() {
    let s = mem();
    pool(&*s, "zone-a", "10.1.0.0/24", 26, "zone == 'a'", false);
    pool(
        &*s,
        "edge",
        "10.2.0.0/24",
        26,
        "has(edge) && zone != 'a'",
        false,
    );
    pool(&*s, "everyone", "10.3.0.0/24", 26, "all()", false);
    node(&*s, "na", &[("zone", "a")]);
    node(&*s, "nb", &[("zone", "b"), ("edge", "true")]);
    let ipam = Ipam::new(s.clone());
    assert_eq!(ipam.usable_pools("na").unwrap(), ["everyone", "zone-a"]);
    assert_eq!(ipam.usable_pools("nb").unwrap(), ["edge", "everyone"]);
    // No Node resource: nothing is known about its labels, only all() pools.
    assert_eq!(ipam.usable_pools("ghost").unwrap(), ["everyone"]);

    let mut a = args("h1", "na", 1, 0);
    a.v4_pools = vec!["zone-a".into()];
    assert!(
        "10.1.0.0/24"
            .parse::<ipnet::IpNet>()
            .unwrap()
            .contains(&ipam.auto_assign(&a).unwrap()[0])
    );
    let mut b = args("h2", "nb", 1, 0);
    b.v4_pools = vec!["zone-a".into()];
    let e = ipam.auto_assign(&b).unwrap_err().to_string();
    assert!(e.contains("does not select this node"), "{e}");
    // Unrestricted: every address comes from a pool selecting the node.
    for i in 0..20 {
        let got = ipam
            .auto_assign(&args(&format!("g{i}"), "ghost", 1, 0))
            .unwrap();
        assert!(got[0].to_string().starts_with("10.3."), "{got:?}");
    }
    // Relabelling the node takes effect on the next request.
    node(&*s, "ghost", &[("zone", "a")]);
    assert_eq!(ipam.usable_pools("ghost").unwrap(), ["everyone", "zone-a"]);
}

#[test]
fn reservations_are_never_auto_assigned_but_may_be_requested() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/28", 28, "all()", false);
    let r = IpReservation::new(
        "gw",
        IpReservationSpec {
            reserved_cidrs: vec!["10.0.0.0/30".into(), "10.0.0.9".into()],
        },
    );
    put_resource(&*s, &r.into()).unwrap();
    let ipam = Ipam::new(s);
    let mut got = BTreeSet::new();
    for i in 0..11 {
        got.insert(
            ipam.auto_assign(&args(&format!("h{i}"), "n1", 1, 0))
                .unwrap()[0],
        );
    }
    let e = ipam.auto_assign(&args("more", "n1", 1, 0)).unwrap_err();
    assert!(matches!(e, IpamError::PoolsExhausted { .. }), "{e}");
    for reserved in ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.9"] {
        assert!(!got.contains(&ip(reserved)), "{reserved} was handed out");
    }
    assert_eq!(got.len(), 11);
    // Explicitly requested: allowed (Calico does the same), and then taken.
    let attrs = AllocationAttrs::default();
    ipam.assign_ip(ip("10.0.0.9"), "explicit", &attrs).unwrap();
    let e = ipam.assign_ip(ip("10.0.0.9"), "again", &attrs).unwrap_err();
    assert!(matches!(e, IpamError::AddressInUse { .. }), "{e}");
}

/// F13: a reservation covering a large pool (a /64 of /122 blocks: 2^58 of them) used to make
/// every ADD walk the blocks forever. Now the ADD fails at once with "exhausted" (the agent's
/// CNI code 100), and reservations covering most of a pool are skipped arithmetically.
#[test]
fn reserved_large_pools_fail_or_allocate_fast() {
    let s = mem();
    pool(&*s, "v6", "fd00:1::/64", 122, "all()", false);
    let reserve = |name: &str, cidrs: &[&str]| {
        let r = IpReservation::new(
            name,
            IpReservationSpec {
                reserved_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            },
        );
        put_resource(&*s, &r.into()).unwrap();
    };
    reserve("all", &["fd00:1::/64"]);
    let ipam = Ipam::new(s.clone());
    let t = std::time::Instant::now();
    let e = ipam.auto_assign(&args("h0", "n1", 0, 1)).unwrap_err();
    assert!(matches!(e, IpamError::PoolsExhausted { .. }), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    // All but the last /122 reserved, in two ranges: found by skipping, not walking.
    tern_model::delete_resource(&*s, tern_model::Kind::IpReservation, None, "all").unwrap();
    reserve(
        "most",
        &[
            "fd00:1::/65",
            "fd00:1:0:0:8000::/66",
            "fd00:1:0:0:c000::/67",
        ],
    );
    // What is left: fd00:1:0:0:e000::/67, minus one more /68 and everything below the last
    // /122 of it.
    reserve("more", &["fd00:1:0:0:e000::/68", "fd00:1:0:0:f000::/69"]);
    let ipam = Ipam::new(s.clone());
    let t = std::time::Instant::now();
    let got = ipam.auto_assign(&args("h1", "n1", 0, 1)).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    let IpAddr::V6(a) = got[0] else {
        panic!("{got:?}")
    };
    assert!(
        u128::from(a) >= u128::from("fd00:1:0:0:f800::".parse::<std::net::Ipv6Addr>().unwrap()),
        "{a} is reserved"
    );
}

/// F11: one corrupt IPReservation (written straight into the store) is skipped with a warning;
/// it does not fail every assignment.
#[test]
fn a_corrupt_reservation_does_not_fail_assignments() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/28", 28, "all()", false);
    s.put(&keys::resource("IPReservation", "broken"), b"{not json")
        .unwrap();
    let ipam = Ipam::new(s);
    ipam.auto_assign(&args("h", "n1", 1, 0)).unwrap();
}

/// F11: IPAM reads pools with the same decision as the dataplane and BGP
/// (`Resource::from_stored`): a pool stored before the metadata limits (a 100-byte label
/// value) is used; one the dataplane cannot route (a block size out of range) is not
/// allocated from either.
#[test]
fn pools_are_read_as_every_daemon_reads_them() {
    let s = mem();
    let raw = |name: &str, cidr: &str, block: u8| {
        format!(
            "{{\"apiVersion\":\"tern.dev/v1\",\"kind\":\"IPPool\",\"metadata\":{{\"name\":\"{name}\",\"labels\":{{\"team\":\"{}\"}}}},\"spec\":{{\"cidr\":\"{cidr}\",\"blockSize\":{block}}}}}",
            "x".repeat(100)
        )
    };
    s.put(
        &keys::resource("IPPool", "old"),
        raw("old", "10.1.0.0/24", 28).as_bytes(),
    )
    .unwrap();
    s.put(
        &keys::resource("IPPool", "bad"),
        raw("bad", "10.2.0.0/24", 8).as_bytes(),
    )
    .unwrap();
    assert!(tern_model::Resource::from_stored(raw("old", "10.1.0.0/24", 28).as_bytes()).is_ok());
    assert!(tern_model::Resource::from_stored(raw("bad", "10.2.0.0/24", 8).as_bytes()).is_err());
    let ipam = Ipam::new(s);
    assert_eq!(ipam.usable_pools("n1").unwrap(), ["old"]);
    let got = ipam.auto_assign(&args("h", "n1", 1, 0)).unwrap();
    assert!(got[0].to_string().starts_with("10.1.0."), "{got:?}");
}

#[test]
fn release_cooldown_delays_reuse_and_keeps_fifo() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/30", 30, "all()", false);
    let (ipam, t) = clocked(s, 1_000);
    ipam.put_config(&IpamConfigSpec {
        release_cooldown_seconds: 10,
        ..IpamConfigSpec::default()
    })
    .unwrap();
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(
            ipam.auto_assign(&args(&format!("h{i}"), "n1", 1, 0))
                .unwrap()[0],
        );
    }
    assert_eq!(ipam.release_by_handle("h2").unwrap(), [held[2]]);
    t.store(1_001, Ordering::SeqCst);
    assert_eq!(ipam.release_by_handle("h0").unwrap(), [held[0]]);
    // Both cooling down: nothing to hand out.
    t.store(1_009, Ordering::SeqCst);
    let e = ipam.auto_assign(&args("x", "n1", 1, 0)).unwrap_err();
    assert!(matches!(e, IpamError::PoolsExhausted { .. }), "{e}");
    // h2's address cooled first.
    t.store(1_010, Ordering::SeqCst);
    assert_eq!(ipam.auto_assign(&args("x", "n1", 1, 0)).unwrap(), [held[2]]);
    assert!(ipam.auto_assign(&args("y", "n1", 1, 0)).is_err());
    t.store(1_011, Ordering::SeqCst);
    assert_eq!(ipam.auto_assign(&args("y", "n1", 1, 0)).unwrap(), [held[0]]);

    // Without cooldown, the longest-free address comes first even if later ones are free.
    ipam.put_config(&IpamConfigSpec::default()).unwrap();
    ipam.release_by_handle("h3").unwrap();
    ipam.release_by_handle("h1").unwrap();
    assert_eq!(ipam.auto_assign(&args("z", "n1", 1, 0)).unwrap(), [held[3]]);
    assert_eq!(ipam.auto_assign(&args("w", "n1", 1, 0)).unwrap(), [held[1]]);
}

#[test]
fn empty_blocks_are_released_after_grace_but_never_the_last() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/28", 30, "all()", false);
    let (ipam, t) = clocked(s.clone(), 5_000);
    for i in 0..12 {
        ipam.auto_assign(&args(&format!("h{i}"), "n1", 1, 0))
            .unwrap();
    }
    assert_eq!(ipam.affinities(Some("n1")).unwrap().len(), 3);
    // n2 fills the pool's fourth block, then borrows the address h0 frees in n1's first.
    ipam.auto_assign(&args("n2a", "n2", 4, 0)).unwrap();
    ipam.release_by_handle("h0").unwrap(); // frees one address in n1's first block
    ipam.auto_assign(&args("borrow", "n2", 1, 0)).unwrap();
    assert_eq!(ipam.borrowed(Some("n2")).unwrap().len(), 1);
    for i in 1..12 {
        ipam.release_by_handle(&format!("h{i}")).unwrap();
    }
    // Just emptied: within grace nothing goes.
    t.store(5_100, Ordering::SeqCst);
    assert!(
        ipam.release_empty_blocks("n1", Duration::from_secs(300))
            .unwrap()
            .is_empty()
    );
    t.store(5_301, Ordering::SeqCst);
    let released = ipam
        .release_empty_blocks("n1", Duration::from_secs(300))
        .unwrap();
    // Of n1's three blocks, the one holding n2's borrowed address is in use and stays; it
    // remains the node's block, so both empty ones may go.
    let kept: Vec<_> = ipam.affinities(Some("n1")).unwrap();
    assert_eq!(released.len() + kept.len(), 3);
    assert!(!kept.is_empty());
    for b in &released {
        assert!(s.get(&keys::block(&b.to_string())).unwrap().is_none());
        assert!(
            s.get(&keys::affinity("n1", &b.to_string()))
                .unwrap()
                .is_none()
        );
    }
    let borrowed_block = ipam.borrowed(Some("n2")).unwrap()[0].block;
    assert!(
        !released.contains(&borrowed_block),
        "a block in use was released"
    );
    assert_eq!(
        released.len(),
        2,
        "both empty blocks go: the borrowed one remains"
    );
    // With only one block left, it stays even when empty.
    ipam.release_by_handle("borrow").unwrap();
    t.store(9_000, Ordering::SeqCst);
    assert!(
        ipam.release_empty_blocks("n1", Duration::ZERO)
            .unwrap()
            .is_empty()
    );
    assert_eq!(ipam.affinities(Some("n1")).unwrap().len(), 1);
    // A released block can be claimed again.
    ipam.auto_assign(&args("again", "n3", 1, 0)).unwrap();
}

#[test]
fn strict_affinity_flip_keeps_borrowed_allocations_valid() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/29", 30, "all()", false);
    let ipam = Ipam::new(s);
    ipam.set_config(false, 1).unwrap();
    ipam.auto_assign(&args("a", "n1", 2, 0)).unwrap();
    ipam.auto_assign(&args("b", "n2", 4, 0)).unwrap();
    let borrowed = ipam.auto_assign(&args("c", "n2", 1, 0)).unwrap();
    assert_eq!(ipam.borrowed(None).unwrap().len(), 1);
    assert_eq!(ipam.borrowed(None).unwrap()[0].ip, borrowed[0]);

    ipam.set_config(true, 1).unwrap();
    let cfg = ipam.config().unwrap();
    assert!(cfg.strict_affinity);
    assert_eq!(cfg.empty_block_grace_seconds, 300, "other fields kept");
    // The borrowed allocation is still counted and still listed.
    assert_eq!(ipam.usage().unwrap()[0].in_use, 7);
    assert_eq!(ipam.ips_by_handle("c").unwrap(), borrowed);
    // n2 may no longer borrow; n1 gets the last address of its own block, not a double.
    let e = ipam
        .auto_assign(&args("d", "n2", 1, 0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("strict affinity"), "{e}");
    let last = ipam.auto_assign(&args("e", "n1", 1, 0)).unwrap();
    assert_ne!(last, borrowed);
    assert!(ipam.auto_assign(&args("f", "n1", 1, 0)).is_err());
    // Release still works, and the freed address goes back to n1's block.
    assert_eq!(ipam.release_by_handle("c").unwrap(), borrowed);
    assert_eq!(ipam.auto_assign(&args("g", "n1", 1, 0)).unwrap(), borrowed);
    let all: Vec<IpAddr> = ipam
        .allocations(None)
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect();
    let uniq: BTreeSet<_> = all.iter().collect();
    assert_eq!(all.len(), uniq.len());
    assert_eq!(all.len(), 8);
}

#[test]
fn disabling_a_pool_keeps_its_allocations_valid() {
    let s = mem();
    pool(&*s, "old", "10.0.0.0/24", 26, "all()", false);
    let ipam = Ipam::new(s.clone());
    let old = ipam.auto_assign(&args("old1", "n1", 3, 0)).unwrap();
    assert!(ipam.pool_in_use("old").unwrap().is_some());
    pool(&*s, "old", "10.0.0.0/24", 26, "all()", true);
    pool(&*s, "new", "10.1.0.0/24", 26, "all()", false);
    // New allocations come from the enabled pool, even for the node owning an old block.
    let new = ipam.auto_assign(&args("new1", "n1", 1, 0)).unwrap();
    assert!(new[0].to_string().starts_with("10.1."), "{new:?}");
    let usage: BTreeMap<String, u128> = ipam
        .usage()
        .unwrap()
        .into_iter()
        .map(|u| (u.pool, u.in_use))
        .collect();
    assert_eq!(usage["old"], 3);
    assert_eq!(usage["new"], 1);
    let msg = ipam.pool_in_use("old").unwrap().unwrap();
    assert!(
        msg.contains("IPPool \"old\" (10.0.0.0/24) still has 3 addresses allocated"),
        "{msg}"
    );
    assert!(msg.contains("/26 (3 in use)"), "{msg}");
    // A specific address in the disabled pool is refused.
    let e = ipam
        .assign_ip(ip("10.0.0.200"), "x", &AllocationAttrs::default())
        .unwrap_err();
    assert!(matches!(e, IpamError::NotInPool { .. }), "{e}");
    let mut rel = ipam.release_by_handle("old1").unwrap();
    rel.sort();
    assert_eq!(rel, old);
    assert_eq!(ipam.pool_in_use("old").unwrap(), None);
    assert_eq!(ipam.pool_in_use("nonexistent").unwrap(), None);
}

#[test]
fn dual_stack_is_all_or_nothing() {
    let s = mem();
    let ipam = Ipam::new(s.clone());
    assert!(ipam.ensure_default_pool("10.0.0.0/30").unwrap());
    assert!(
        ipam.ensure_default_pool("fd00::/126").unwrap(),
        "v6 pool besides the v4 one"
    );
    assert!(!ipam.ensure_default_pool("fd00:1::/120").unwrap());
    let got = ipam.auto_assign_dual(&args("h1", "n1", 1, 1)).unwrap();
    assert_eq!(got.ipv4.len(), 1);
    assert_eq!(got.ipv6.len(), 1);
    assert_eq!(ipam.assign_ipv6(&args("h2", "n1", 0, 3)).unwrap().len(), 3);
    assert_eq!(ipam.assign_ipv4(&args("h3", "n1", 0, 0)).unwrap().len(), 1);
    // IPv6 exhausted: the IPv4 half is rolled back.
    let before = ipam.allocations(None).unwrap().len();
    let e = ipam.auto_assign(&args("h4", "n1", 1, 1)).unwrap_err();
    assert!(matches!(e, IpamError::PoolsExhausted { .. }), "{e}");
    assert_eq!(ipam.allocations(None).unwrap().len(), before);
    assert!(ipam.ips_by_handle("h4").unwrap().is_empty());
    assert!(s.get(&keys::handle("h4")).unwrap().is_none());
    // The v4 address the failed request briefly held is still available.
    assert_eq!(ipam.assign_ipv4(&args("h5", "n1", 2, 0)).unwrap().len(), 2);
}

#[test]
fn stale_release_of_a_reused_address_is_rejected() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/32", 32, "all()", false);
    let ipam = Ipam::new(s);
    ipam.auto_assign(&args("first", "n1", 1, 0)).unwrap();
    let seen = ipam.allocations(Some("n1")).unwrap();
    ipam.release_by_handle("first").unwrap();
    let again = ipam.auto_assign(&args("second", "n1", 1, 0)).unwrap();
    assert_eq!(again, [seen[0].ip], "the only address is reused");
    assert!(ipam.release_allocations(&seen).unwrap().is_empty());
    assert_eq!(ipam.ips_by_handle("second").unwrap(), again);
    let now = ipam.allocations(None).unwrap();
    assert!(now[0].sequence_number > seen[0].sequence_number);
    assert_eq!(ipam.release_allocations(&now).unwrap(), again);
}

#[test]
fn inspection_api_lists_blocks_affinities_and_handles() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/24", 26, "all()", false);
    let ipam = Ipam::new(s);
    ipam.auto_assign(&args("h1", "n1", 2, 0)).unwrap();
    ipam.auto_assign(&args("h2", "n2", 1, 0)).unwrap();
    let blocks = ipam.blocks().unwrap();
    assert_eq!(blocks.len(), 2);
    let affs = ipam.affinities(None).unwrap();
    assert_eq!(affs.len(), 2);
    for a in &affs {
        assert_eq!(a.state, AffinityState::Confirmed);
        let b = blocks.iter().find(|b| b.cidr == a.cidr).unwrap();
        assert_eq!(b.affine_node(), Some(a.node.as_str()));
    }
    assert_eq!(ipam.affinities(Some("n2")).unwrap().len(), 1);
    let handles = ipam.handles().unwrap();
    assert_eq!(handles.len(), 2);
    let h1 = handles.iter().find(|h| h.id == "h1").unwrap();
    assert_eq!(h1.blocks.values().sum::<u32>(), 2);
    assert!(ipam.borrowed(None).unwrap().is_empty());
}

#[test]
fn bad_input_is_refused_with_reasons() {
    let s = mem();
    pool(&*s, "p", "10.0.0.0/24", 26, "all()", false);
    let try_pool = |cidr: &str, bs: u8| {
        let mut spec = IpPoolSpec::new(cidr);
        spec.block_size = bs;
        put_resource(&*s, &IpPool::new("q", spec).into())
            .unwrap_err()
            .to_string()
    };
    assert!(try_pool("10.0.1.1/24", 26).contains("not a network address"));
    assert!(try_pool("10.1.0.0/16", 19).contains("out of range"));
    assert!(try_pool("fd00::/64", 112).contains("out of range"));
    assert!(try_pool("10.1.0.0/28", 26).contains("block must fit in the pool"));
    assert!(try_pool("169.254.0.0/24", 26).contains("link-local"));
    let q = IpPool::new("q", IpPoolSpec::new("10.0.0.128/25"));
    let existing = match tern_model::get_resource(&*s, tern_model::Kind::IpPool, None, "p")
        .unwrap()
        .unwrap()
    {
        tern_model::Resource::IpPool(p) => p,
        _ => unreachable!(),
    };
    let overlap = tern_model::ip_pool_overlaps(&q, &[existing]).unwrap();
    assert!(overlap.contains("overlaps IPPool \"p\""), "{overlap}");

    let ipam = Ipam::new(s.clone());
    let attrs = AllocationAttrs::default();
    let e = ipam
        .assign_ip(ip("192.168.0.1"), "h", &attrs)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "192.168.0.1 is not in any enabled IP pool");
    ipam.assign_ip(ip("10.0.0.7"), "h", &attrs).unwrap();
    let e = ipam
        .assign_ip(ip("10.0.0.7"), "h2", &attrs)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "10.0.0.7 is already in use (handle h)");
}

/// A datastore locked for a migration (`ternctl datastore lock`, and `migrate` on its source)
/// changes no block: allocations and releases are refused as "try again later" (the agent
/// answers ADD with code 11 and journals the DEL); an allocator that decided under a policy
/// read before the lock is stopped by its guard on the configuration's revision (a store with
/// multi-key transactions), not only after its policy TTL; unlocked, everything works again.
#[test]
fn a_migration_lock_stops_every_change_of_the_blocks() {
    let s = mem();
    pool(&*s, "p", "10.9.0.0/24", 26, "all()", false);
    // Policies read once and trusted for a minute: only the guard can stop these.
    let a = Ipam::new(s.clone()).with_policy_ttl(Duration::from_secs(60));
    let before = a.auto_assign(&args("h1", "n1", 1, 0)).unwrap();
    let admin = Ipam::new(s.clone());
    admin
        .set_migration_lock(Some("ternctl datastore migrate to kubernetes".into()))
        .unwrap();
    assert_eq!(
        admin.config().unwrap().migration_lock.as_deref(),
        Some("ternctl datastore migrate to kubernetes")
    );
    let blocks = |s: &Arc<dyn Store>| s.range(keys::BLOCKS).unwrap().0;
    let frozen = blocks(&s);
    let e = a.auto_assign(&args("h2", "n1", 1, 0)).unwrap_err();
    assert!(
        matches!(e, IpamError::Locked(_)) && e.is_unavailable(),
        "{e}"
    );
    assert!(e.to_string().contains("ternctl datastore migrate"), "{e}");
    let fresh = Ipam::new(s.clone());
    assert!(matches!(
        fresh.auto_assign(&args("h3", "n2", 1, 0)),
        Err(IpamError::Locked(_))
    ));
    assert!(matches!(
        fresh.assign_ip(ip("10.9.0.200"), "h4", &AllocationAttrs::default()),
        Err(IpamError::Locked(_))
    ));
    assert!(matches!(
        fresh.release_by_handle("h1"),
        Err(IpamError::Locked(_))
    ));
    assert!(matches!(
        fresh.release_ips(&before),
        Err(IpamError::Locked(_))
    ));
    assert!(matches!(
        fresh.release_node("n1"),
        Err(IpamError::Locked(_))
    ));
    assert_eq!(
        blocks(&s),
        frozen,
        "a locked datastore's blocks did not change"
    );
    // The other settings survive the lock and the unlock.
    admin.set_config(true, 7).unwrap();
    admin.set_migration_lock(None).unwrap();
    let cfg = admin.config().unwrap();
    assert_eq!(
        (
            cfg.strict_affinity,
            cfg.max_blocks_per_host,
            cfg.migration_lock
        ),
        (true, 7, None)
    );
    let b = Ipam::new(s.clone());
    assert_eq!(b.release_by_handle("h1").unwrap(), before);
    assert_eq!(b.auto_assign(&args("h2", "n1", 1, 0)).unwrap().len(), 1);
}
