//! A store write whose outcome is unknown ([`StoreError::Ambiguous`], an etcd answer lost in a
//! leader change that the store could not resolve): the allocator reads its handle back and
//! neither allocates twice (when the write had applied) nor gives up (when it had not).

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tern_ipam::*;
use tern_model::{IpPool, IpPoolSpec, put_resource};
use tern_store::mem::MemStore;
use tern_store::testing::{Call, Hook, Hooked, Verdict};
use tern_store::{StoreError, keys};

/// What the next transaction writing a handle suffers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Applied, then reported as ambiguous.
    Applied,
    /// Not applied, reported as ambiguous.
    Lost,
}

/// Hits the next `count` handle-writing transactions with `fault`.
struct Faults {
    fault: Mutex<(Fault, usize)>,
    hit: AtomicUsize,
}

impl Faults {
    fn arm(&self, fault: Fault, count: usize) {
        *self.fault.lock().unwrap() = (fault, count);
    }
}

impl Hook for Faults {
    fn before(&self, call: &Call<'_>) -> Verdict {
        let Call::Txn(txn) = call else {
            return Verdict::Forward;
        };
        let writes_handle = txn.success.iter().any(|op| match op {
            tern_store::Op::Put { key, .. } => key.starts_with(keys::HANDLES),
            _ => false,
        });
        let fault = {
            let mut f = self.fault.lock().unwrap();
            if writes_handle && f.1 > 0 {
                f.1 -= 1;
                f.0
            } else {
                Fault::None
            }
        };
        if fault != Fault::None {
            self.hit.fetch_add(1, Ordering::SeqCst);
        }
        match fault {
            Fault::None => Verdict::Forward,
            Fault::Applied => Verdict::ApplyThenFail(StoreError::Ambiguous(
                "test: answer lost after applying".into(),
            )),
            Fault::Lost => Verdict::Fail(StoreError::Ambiguous(
                "test: answer lost, not applied".into(),
            )),
        }
    }
}

/// A [`MemStore`] whose handle writes suffer the armed [`Faults`].
type Flaky = Hooked<Faults>;

fn args(handle: &str) -> AssignArgs {
    tern_ipam::testing::pod_args(handle, "n1", 1, 0)
}

fn setup() -> (Arc<Flaky>, Ipam) {
    let store = Hooked::new(
        Arc::new(MemStore::new()),
        Faults {
            fault: Mutex::new((Fault::None, 0)),
            hit: AtomicUsize::new(0),
        },
    );
    put_resource(
        &*store,
        &IpPool::new("p", IpPoolSpec::new("10.244.0.0/24")).into(),
    )
    .unwrap();
    let ipam = Ipam::new(store.clone());
    // A first allocation claims the block and fills the cache.
    ipam.auto_assign(&args("warm")).unwrap();
    (store, ipam)
}

fn held(ipam: &Ipam, handle: &str) -> Vec<IpAddr> {
    let mut v = ipam.ips_by_handle(handle).unwrap();
    v.sort();
    v
}

#[test]
fn an_applied_write_reported_ambiguous_is_recognised_by_its_handle() {
    let (store, ipam) = setup();
    store.hook.arm(Fault::Applied, 1);
    let got = ipam.auto_assign(&args("pod-a")).unwrap();
    assert_eq!(
        store.hook.hit.load(Ordering::SeqCst),
        1,
        "the fault did not strike"
    );
    assert_eq!(got.len(), 1);
    assert_eq!(held(&ipam, "pod-a"), got, "allocated twice or not recorded");
    let allocs = ipam.allocations(None).unwrap();
    assert_eq!(allocs.len(), 2, "warm + pod-a: {allocs:?}");
    // The allocator goes on normally after it.
    let b = ipam.auto_assign(&args("pod-b")).unwrap();
    assert_ne!(b, got);
    assert_eq!(ipam.allocations(None).unwrap().len(), 3);
}

#[test]
fn a_lost_write_reported_ambiguous_is_retried_once() {
    let (store, ipam) = setup();
    store.hook.arm(Fault::Lost, 2);
    let got = ipam.auto_assign(&args("pod-a")).unwrap();
    assert_eq!(
        store.hook.hit.load(Ordering::SeqCst),
        2,
        "the faults did not strike"
    );
    assert_eq!(held(&ipam, "pod-a"), got);
    assert_eq!(ipam.allocations(None).unwrap().len(), 2);
}

#[test]
fn an_ambiguous_error_is_try_again_later() {
    assert!(IpamError::Store(StoreError::Ambiguous("x".into())).is_unavailable());
}

#[test]
fn a_requested_address_written_ambiguously_is_recognised_by_its_handle() {
    let (store, ipam) = setup();
    let want: IpAddr = "10.244.0.40".parse().unwrap();
    store.hook.arm(Fault::Applied, 1);
    ipam.assign_ip(want, "static", &args("static").attrs)
        .unwrap();
    assert_eq!(
        store.hook.hit.load(Ordering::SeqCst),
        1,
        "the fault did not strike"
    );
    assert_eq!(held(&ipam, "static"), vec![want]);
    // Not applied: retried, and the address is still given to it (once).
    let other: IpAddr = "10.244.0.41".parse().unwrap();
    store.hook.arm(Fault::Lost, 1);
    ipam.assign_ip(other, "static2", &args("static2").attrs)
        .unwrap();
    assert_eq!(held(&ipam, "static2"), vec![other]);
    assert_eq!(ipam.allocations(None).unwrap().len(), 3);
}
