//! Deferred deletion of host veths.
//!
//! Deleting a veth costs the kernel ~20 ms (device unregistration waits for RCU), which would
//! dominate a DEL. A DEL therefore only takes the host side down, which cuts the pod off at once,
//! and hands the name to this thread, which deletes it. The deletion removes the host routes
//! through the device; a route that a later ADD re-pointed at a new veth is not touched. An ADD
//! that needs the same name waits for the deletion first (and fails with "try again" if it does
//! not finish in time). The queue holds the index of the link that was checked, and the thread
//! deletes that link only: a new pod's veth that took the name meanwhile is never hit. If the
//! agent dies with names queued, the start-up reconciliation removes them as interfaces without
//! an endpoint.
//!
//! The links are reached through the kernel seam ([`tern_linux::kernel::Links`]): the real
//! kernel in the agent, the in-memory one in the unit tests.

use std::collections::HashSet;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tern_linux::LinuxError;
use tern_linux::kernel::Links;
use tern_linux::netlink::Handle;

/// Opens the links of the reaper's network namespace (the real kernel: a netlink handle).
/// Opens the links of the namespace the reaper works in.
pub type Open = Arc<dyn Fn() -> Result<Box<dyn Links>, LinuxError> + Send + Sync>;

/// Handle to the reaper thread.
pub struct Reaper {
    tx: Mutex<Sender<(String, u32)>>,
    pending: Arc<(Mutex<HashSet<String>>, Condvar)>,
    open: Open,
}

impl Reaper {
    /// Starts the reaper thread in the calling thread's network namespace.
    pub fn start() -> std::io::Result<Reaper> {
        Reaper::start_with(Arc::new(|| Ok(Box::new(Handle::new()?) as Box<dyn Links>)))
    }

    /// [`Reaper::start`] over the links `open` gives (the kernel seam).
    pub fn start_with(open: Open) -> std::io::Result<Reaper> {
        let (tx, rx) = channel::<(String, u32)>();
        let pending: Arc<(Mutex<HashSet<String>>, Condvar)> = Arc::default();
        let p = pending.clone();
        let o = open.clone();
        std::thread::Builder::new()
            .name("veth-reaper".into())
            .spawn(move || {
                for (name, index) in rx {
                    let res = o().and_then(|mut k| delete_checked_index(&mut *k, &name, index));
                    if let Err(e) = res {
                        log::warn!("deleting interface {name}: {e}");
                    }
                    let (set, cv) = &*p;
                    set.lock().unwrap().remove(&name);
                    cv.notify_all();
                }
            })?;
        Ok(Reaper {
            tx: Mutex::new(tx),
            pending,
            open,
        })
    }

    /// Takes the interface down now and queues its deletion; Ok if it does not exist. Only a
    /// pod veth of tern's (a veth whose name carries `prefix`) is touched: any other device of
    /// that name is left up and in place, with a warning.
    pub fn detach(&self, name: &str, prefix: &str) -> Result<(), LinuxError> {
        let mut h = (self.open)()?;
        let Some(link) = h.link_by_name(name)? else {
            return Ok(());
        };
        if let Err(why) = tern_linux::pod_veth_ours(&link, prefix) {
            log::warn!("DEL: not deleting interface {name}: {why}");
            return Ok(());
        }
        h.set_link_down(link.index)?;
        self.pending.0.lock().unwrap().insert(name.to_string());
        if self
            .tx
            .lock()
            .unwrap()
            .send((name.to_string(), link.index))
            .is_err()
        {
            // The thread is gone (it never exits while the agent runs); delete inline.
            self.pending.0.lock().unwrap().remove(name);
            h.delete_link_by_index(link.index)?;
        }
        Ok(())
    }

    /// True while a deletion of `name` is queued or running.
    pub fn is_pending(&self, name: &str) -> bool {
        self.pending.0.lock().unwrap().contains(name)
    }

    /// Waits until `name` is no longer pending deletion, at most `timeout`; false when it is
    /// still pending then.
    pub fn wait_gone(&self, name: &str, timeout: Duration) -> bool {
        let (set, cv) = &*self.pending;
        let deadline = Instant::now() + timeout;
        let mut g = set.lock().unwrap();
        while g.contains(name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = cv.wait_timeout(g, left).unwrap().0;
        }
        true
    }
}

/// Deletes the link `index` if it is still the device `name` that [`Reaper::detach`] checked;
/// a device that has since taken the name (another index) or the index (another name) stays.
fn delete_checked_index(h: &mut dyn Links, name: &str, index: u32) -> Result<(), LinuxError> {
    match h.link_by_index(index)? {
        Some(l) if l.name == name => {
            h.delete_link_by_index(index)?;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// F6: a queued deletion goes by the index that was checked: a new veth that took the name
    /// since (a re-created pod's) survives it; the checked one is deleted.
    #[test]
    fn a_queued_deletion_never_hits_a_device_that_took_the_name() {
        crate::testutil::in_new_netns(|h, here| {
            let name = "tern00000000aaa";
            h.create_veth(name, "oldpeer", here.as_fd(), 0).unwrap();
            let old = h.link_by_name(name).unwrap().unwrap();
            h.delete_link_by_index(old.index).unwrap();
            h.create_veth(name, "newpeer", here.as_fd(), 0).unwrap();
            let new = h.link_by_name(name).unwrap().unwrap();
            assert_ne!(new.index, old.index);
            super::delete_checked_index(h, name, old.index).unwrap();
            assert!(
                h.link_by_name(name).unwrap().is_some(),
                "the new veth was deleted"
            );
            super::delete_checked_index(h, name, new.index).unwrap();
            assert!(h.link_by_name(name).unwrap().is_none());
        });
    }

    /// The DEL path on the in-memory kernel: what is detached, what is left, and what a
    /// refusal leaves.
    mod on_the_fake {
        use super::super::*;
        use tern_linux::fake::{FakeKernel, Op};

        const VETH: &str = "tern0123456789a";

        fn reaper(k: &FakeKernel) -> Reaper {
            let k = k.clone();
            Reaper::start_with(Arc::new(move || Ok(Box::new(k.clone()) as Box<dyn Links>))).unwrap()
        }

        #[test]
        fn a_pod_veth_is_taken_down_at_once_and_deleted_by_the_thread() {
            let k = FakeKernel::new();
            k.add_link(VETH, "veth", true);
            let r = reaper(&k);
            r.detach(VETH, "tern").unwrap();
            assert!(r.wait_gone(VETH, Duration::from_secs(5)));
            assert!(k.link(VETH).is_none());
            // Gone already: nothing to do, no error.
            r.detach(VETH, "tern").unwrap();
            assert!(!r.is_pending(VETH));
        }

        #[test]
        fn anything_but_a_prefixed_veth_is_left_up_and_in_place() {
            let k = FakeKernel::new();
            k.add_link(VETH, "bridge", true);
            k.add_link("eth1", "veth", true);
            let r = reaper(&k);
            r.detach(VETH, "tern").unwrap();
            r.detach("eth1", "tern").unwrap();
            assert!(!r.is_pending(VETH) && !r.is_pending("eth1"));
            assert!(k.link(VETH).unwrap().up && k.link("eth1").unwrap().up);
            assert_eq!(k.calls(Op::LinkSet) + k.calls(Op::LinkDel), 0);
        }

        #[test]
        fn a_refused_down_fails_the_detach_and_queues_nothing() {
            let k = FakeKernel::new();
            k.add_link(VETH, "veth", true);
            let r = reaper(&k);
            k.fail_next(Op::LinkSet, libc::EBUSY);
            assert_eq!(
                r.detach(VETH, "tern").unwrap_err().errno(),
                Some(libc::EBUSY)
            );
            assert!(!r.is_pending(VETH));
            assert!(k.link(VETH).unwrap().up);
            // The DEL's retry goes through.
            r.detach(VETH, "tern").unwrap();
            assert!(r.wait_gone(VETH, Duration::from_secs(5)));
            assert!(k.link(VETH).is_none());
        }

        #[test]
        fn a_queued_deletion_spares_a_device_that_took_the_name() {
            let mut k = FakeKernel::new();
            let old = k.add_link(VETH, "veth", false);
            assert!(k.delete_link_by_index(old).unwrap());
            let new = k.add_link(VETH, "veth", true);
            delete_checked_index(&mut k, VETH, old).unwrap();
            assert_eq!(k.link(VETH).map(|l| l.index), Some(new));
            delete_checked_index(&mut k, VETH, new).unwrap();
            assert!(k.link(VETH).is_none());
        }
    }
}
