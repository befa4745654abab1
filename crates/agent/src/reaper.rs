//! Deferred deletion of host veths.
//!
//! Deleting a veth costs the kernel ~20 ms (device unregistration waits for RCU), which would
//! dominate a DEL. A DEL therefore only takes the host side down, which cuts the pod off at once,
//! and hands the name to this thread, which deletes it. The deletion removes the host routes
//! through the device; a route that a later ADD re-pointed at a new veth is not touched. An ADD
//! that needs the same name waits for the deletion first. If the agent dies with names queued,
//! the start-up reconciliation removes them as interfaces without an endpoint.

use std::collections::HashSet;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tern_linux::netlink::Handle;

/// Handle to the reaper thread.
pub struct Reaper {
    tx: Mutex<Sender<String>>,
    pending: Arc<(Mutex<HashSet<String>>, Condvar)>,
}

impl Reaper {
    /// Starts the reaper thread in the calling thread's network namespace.
    pub fn start() -> std::io::Result<Reaper> {
        let (tx, rx) = channel::<String>();
        let pending: Arc<(Mutex<HashSet<String>>, Condvar)> = Arc::default();
        let p = pending.clone();
        std::thread::Builder::new()
            .name("veth-reaper".into())
            .spawn(move || {
                for name in rx {
                    if let Err(e) = tern_linux::veth::teardown_pod_interface(&name) {
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

    /// Takes the interface down now and queues its deletion; Ok if it does not exist.
    pub fn detach(&self, name: &str) -> Result<(), tern_linux::LinuxError> {
        let mut h = Handle::new()?;
        let Some(link) = h.link_by_name(name)? else {
            return Ok(());
        };
        h.set_link_down(link.index)?;
        self.pending.0.lock().unwrap().insert(name.to_string());
        if self.tx.lock().unwrap().send(name.to_string()).is_err() {
            // The thread is gone (it never exits while the agent runs); delete inline.
            self.pending.0.lock().unwrap().remove(name);
            tern_linux::veth::teardown_pod_interface(name)?;
        }
        Ok(())
    }

    /// True while a deletion of `name` is queued or running.
    pub fn is_pending(&self, name: &str) -> bool {
        self.pending.0.lock().unwrap().contains(name)
    }

    /// Waits until `name` is no longer pending deletion, at most `timeout`.
    pub fn wait_gone(&self, name: &str, timeout: Duration) {
        let (set, cv) = &*self.pending;
        let deadline = Instant::now() + timeout;
        let mut g = set.lock().unwrap();
        while g.contains(name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            g = cv.wait_timeout(g, left).unwrap().0;
        }
    }
}
