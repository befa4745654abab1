//! IPAM on a store that writes one object per transaction (`Store::multi_key_txn` false, as
//! the Kubernetes API): `tern_store::testing::SingleObject` over a memory store refuses every
//! transaction over several keys, as `KubeStore` does. (The same storms run on a real
//! kube-apiserver in `crates/agent/tests/kube_datastore.rs`.)
//!
//! Shown: the storms keep every invariant with no handle records at all; an ADD from a block
//! the node holds is one write and a DEL one write; and a crash between any two writes of a
//! sequence of ADDs, DELs and an empty-block release (the store refuses every write from the
//! k-th on, for every k) leaves a store that, once the DELs are retried as the runtime retries
//! them, holds no address and no inconsistent block or affinity.

// Only the storm options and checks of the shared module are used here.
#[allow(dead_code)]
mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tern_ipam::storm::{self, WorkerReport};
use tern_ipam::{AssignArgs, Ipam};
use tern_model::{IpPool, IpPoolSpec, put_resource};
use tern_store::mem::MemStore;
use tern_store::testing::{Call, Hook, Hooked, Verdict, single_object};
use tern_store::{Store, StoreError};

fn single() -> Arc<dyn Store> {
    single_object(Arc::new(MemStore::new()))
}

fn args(handle: &str, node: &str, n: usize) -> AssignArgs {
    AssignArgs {
        handle: handle.into(),
        node: node.into(),
        num_v4: n,
        ..AssignArgs::default()
    }
}

#[test]
fn storms_keep_every_invariant_without_handle_records() {
    for (name, opts) in [
        ("single-object roomy", common::roomy()),
        (
            "single-object exhaustion",
            common::exhaustion("10.97.0.0/26", 11),
        ),
        ("single-object strict+release", common::strict_release()),
    ] {
        let store = single();
        let shared = store.clone();
        let r = storm::run(&move || shared.clone(), &opts).unwrap();
        common::check(name, &r, store.clone());
        assert!(Ipam::new(store).handles().unwrap().is_empty(), "{name}");
        if name.contains("exhaustion") {
            common::assert_exhausted_and_borrowed(&r);
        }
    }
}

/// Counts transactions; from the `fail_from`-th on (counting from 0), refuses them all, as if
/// the process had died there.
struct DieAt {
    txns: AtomicUsize,
    fail_from: usize,
}

impl Hook for DieAt {
    fn before(&self, call: &Call<'_>) -> Verdict {
        if let Call::Txn(_) = call
            && self.txns.fetch_add(1, Ordering::SeqCst) >= self.fail_from
        {
            return Verdict::Fail(StoreError::Unavailable("the process died here".into()));
        }
        Verdict::Forward
    }
}

fn writes(s: &Hooked<DieAt>) -> usize {
    s.hook.txns.load(Ordering::SeqCst)
}

#[test]
fn one_write_per_add_from_a_held_block_and_per_del() {
    let inner = single();
    let mut spec = IpPoolSpec::new("10.60.0.0/16");
    spec.block_size = 26;
    put_resource(&*inner, &IpPool::new("p", spec).into()).unwrap();
    let s = Hooked::new(
        inner,
        DieAt {
            txns: AtomicUsize::new(0),
            fail_from: usize::MAX,
        },
    );
    let ipam = Ipam::new(s.clone());
    ipam.auto_assign(&args("h0", "n1", 1)).unwrap();
    let claimed = writes(&s);
    assert_eq!(
        claimed, 4,
        "claim: affinity Pending, block create, Confirmed, then the ADD"
    );
    for i in 1..=5 {
        let before = writes(&s);
        ipam.auto_assign(&args(&format!("h{i}"), "n1", 1)).unwrap();
        assert_eq!(writes(&s) - before, 1, "ADD {i} from the held block");
    }
    for i in 0..=5 {
        let before = writes(&s);
        assert_eq!(ipam.release_by_handle(&format!("h{i}")).unwrap().len(), 1);
        assert_eq!(writes(&s) - before, 1, "DEL {i}");
    }
    // A DEL of a handle with no address writes nothing.
    let before = writes(&s);
    assert!(ipam.release_by_handle("h0").unwrap().is_empty());
    assert_eq!(writes(&s), before);
}

/// The sequence the crash test cuts at every write: two nodes, blocks of 4 addresses, ADDs
/// that claim blocks, DELs, an empty-block release.
fn sequence(ipam: &Ipam) {
    let _ = ipam.auto_assign(&args("a1", "n1", 3));
    let _ = ipam.auto_assign(&args("a2", "n1", 3));
    let _ = ipam.auto_assign(&args("b1", "n2", 2));
    let _ = ipam.release_by_handle("a1");
    let _ = ipam.auto_assign(&args("a3", "n1", 1));
    let _ = ipam.release_by_handle("a2");
    let _ = ipam.release_by_handle("a3");
    let _ = ipam.release_empty_blocks("n1", std::time::Duration::ZERO);
    let _ = ipam.release_by_handle("b1");
}

const HANDLES: [&str; 4] = ["a1", "a2", "a3", "b1"];

#[test]
fn a_crash_between_any_two_writes_leaves_a_consistent_store() {
    let setup = || {
        let inner = single();
        let mut spec = IpPoolSpec::new("10.61.0.0/24");
        spec.block_size = 30;
        put_resource(&*inner, &IpPool::new("p", spec).into()).unwrap();
        inner
    };
    // How many writes the whole sequence makes.
    let counting = Hooked::new(
        setup(),
        DieAt {
            txns: AtomicUsize::new(0),
            fail_from: usize::MAX,
        },
    );
    sequence(&Ipam::new(counting.clone()));
    let total = writes(&counting);
    assert!(total >= 20, "the sequence makes {total} writes");
    for k in 0..total {
        let inner = setup();
        let dying = Hooked::new(
            inner.clone(),
            DieAt {
                txns: AtomicUsize::new(0),
                fail_from: k,
            },
        );
        sequence(&Ipam::new(dying));
        // Restart: a new allocator (cold caches); the runtime retries every DEL, and the
        // node allocates again (which reads its blocks and affinities).
        let ipam = Ipam::new(inner.clone());
        for h in HANDLES {
            ipam.release_by_handle(h).unwrap();
        }
        for node in ["n1", "n2"] {
            let got: Vec<IpAddr> = ipam.auto_assign(&args("after", node, 1)).unwrap();
            assert_eq!(got.len(), 1);
            ipam.release_by_handle("after").unwrap();
        }
        let nobody = [WorkerReport::default()];
        let v = storm::verify(inner.clone(), &nobody).unwrap();
        assert!(v.is_empty(), "crash at write {k} of {total}: {v:#?}");
        // No block is lost to its node: every block affine to a node has that node's
        // affinity confirmed once the node has read its blocks again (a crash between an
        // empty-block release's PendingDeletion mark and its block delete left the block
        // out of the node's list, unusable and never released).
        for b in ipam.blocks().unwrap() {
            let Some(node) = b.affine_node().map(str::to_string) else {
                continue;
            };
            let states: Vec<_> = ipam
                .affinities(Some(&node))
                .unwrap()
                .into_iter()
                .filter(|a| a.cidr == b.cidr)
                .map(|a| a.state)
                .collect();
            assert_eq!(
                states,
                [tern_ipam::AffinityState::Confirmed],
                "crash at write {k} of {total}: block {} of {node}",
                b.cidr
            );
        }
        assert!(
            ipam.allocations(None).unwrap().is_empty(),
            "crash at write {k}"
        );
    }
}

#[test]
fn releasing_a_node_survives_a_crash_between_any_two_writes() {
    let setup = || {
        let inner = single();
        let mut spec = IpPoolSpec::new("10.62.0.0/26");
        spec.block_size = 30;
        put_resource(&*inner, &IpPool::new("p", spec).into()).unwrap();
        let ipam = Ipam::new(inner.clone());
        ipam.auto_assign(&args("gone1", "n1", 3)).unwrap();
        ipam.auto_assign(&args("gone2", "n1", 2)).unwrap();
        let kept = ipam.auto_assign(&args("kept", "n2", 2)).unwrap();
        (inner, kept)
    };
    let (counting, _) = setup();
    let counted = Hooked::new(
        counting,
        DieAt {
            txns: AtomicUsize::new(0),
            fail_from: usize::MAX,
        },
    );
    let out = Ipam::new(counted.clone()).release_node("n1").unwrap();
    assert_eq!(out.released.len(), 5, "{out:?}");
    let total = writes(&counted);
    for k in 0..total {
        let (inner, kept) = setup();
        let dying = Hooked::new(
            inner.clone(),
            DieAt {
                txns: AtomicUsize::new(0),
                fail_from: k,
            },
        );
        let _ = Ipam::new(dying).release_node("n1");
        // The elected agent's next pass finishes the job.
        let ipam = Ipam::new(inner.clone());
        ipam.release_node("n1").unwrap();
        assert!(
            ipam.affinities(Some("n1")).unwrap().is_empty(),
            "crash at {k}"
        );
        assert!(
            ipam.blocks()
                .unwrap()
                .iter()
                .all(|b| b.affine_node() != Some("n1")),
            "crash at {k}"
        );
        let n2 = WorkerReport {
            node: "n2".into(),
            held: [("kept".to_string(), kept)].into_iter().collect(),
            ..WorkerReport::default()
        };
        let v = storm::verify(inner, &[n2]).unwrap();
        assert!(v.is_empty(), "crash at write {k} of {total}: {v:#?}");
    }
}

#[test]
fn migrating_to_an_indexed_store_rebuilds_the_handle_records() {
    let from = single();
    let shared = from.clone();
    let r = storm::run(&move || shared.clone(), &common::roomy()).unwrap();
    let to: Arc<dyn Store> = Arc::new(MemStore::new());
    tern_store::migrate::migrate(&*from, &*to, false, false).unwrap();
    let ipam = Ipam::new(to.clone());
    let held: usize = r.workers.iter().map(|w| w.held.len()).sum();
    assert_eq!(ipam.rebuild_handles().unwrap(), held);
    // The indexed store's invariants, handle records included, over what the workers hold.
    let v = storm::verify(to.clone(), &r.workers).unwrap();
    assert!(v.is_empty(), "{v:#?}");
    // And a DEL there (through the handle record) frees the addresses.
    let w = &r.workers[0];
    let (h, ips) = w.held.iter().next().expect("a held handle");
    let mut got = ipam.release_by_handle(h).unwrap();
    got.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(got, want);
}
