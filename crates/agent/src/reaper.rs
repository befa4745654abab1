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

use std::collections::HashSet;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tern_linux::netlink::Handle;

/// Handle to the reaper thread.
pub struct Reaper {
    tx: Mutex<Sender<(String, u32)>>,
    pending: Arc<(Mutex<HashSet<String>>, Condvar)>,
}

impl Reaper {
    /// Starts the reaper thread in the calling thread's network namespace.
    pub fn start() -> std::io::Result<Reaper> {
        let (tx, rx) = channel::<(String, u32)>();
        let pending: Arc<(Mutex<HashSet<String>>, Condvar)> = Arc::default();
        let p = pending.clone();
        std::thread::Builder::new()
            .name("veth-reaper".into())
            .spawn(move || {
                for (name, index) in rx {
                    if let Err(e) = delete_checked_index(&name, index) {
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
        })
    }

    /// Takes the interface down now and queues its deletion; Ok if it does not exist. Only a
    /// pod veth of tern's (a veth whose name carries `prefix`) is touched: any other device of
    /// that name is left up and in place, with a warning.
    pub fn detach(&self, name: &str, prefix: &str) -> Result<(), tern_linux::LinuxError> {
        let mut h = Handle::new()?;
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
fn delete_checked_index(name: &str, index: u32) -> Result<(), tern_linux::LinuxError> {
    let mut h = Handle::new()?;
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
            super::delete_checked_index(name, old.index).unwrap();
            assert!(
                h.link_by_name(name).unwrap().is_some(),
                "the new veth was deleted"
            );
            super::delete_checked_index(name, new.index).unwrap();
            assert!(h.link_by_name(name).unwrap().is_none());
        });
    }
}
