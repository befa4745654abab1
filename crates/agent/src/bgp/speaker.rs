//! The agent's handle on the BGP thread ([`Bgp`]): starting it, asking it for the sessions'
//! status, stopping it for a restart, its metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::metrics::exposition::Page;

use tern_api::BgpStatusReply;
use tern_store::Store;
use tokio::sync::mpsc;

use super::plan::BgpError;
use super::runner::{BgpSettings, Msg, Runner, watch_loop};
use super::status::Shared;

/// The running BGP speaker of the agent.
pub struct Bgp {
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) tx: mpsc::UnboundedSender<Msg>,
    pub(super) stopping: Arc<AtomicBool>,
}

impl Bgp {
    /// Starts the BGP thread (and the store watch feeding it). Sessions come up in the
    /// background; configuration problems are logged and retried on the next store change.
    pub fn start(settings: BgpSettings, store: Arc<dyn Store>) -> Result<Arc<Bgp>, BgpError> {
        let shared = Arc::new(Mutex::new(Shared {
            status: BgpStatusReply {
                enabled: true,
                ..Default::default()
            },
            ..Default::default()
        }));
        let (tx, rx) = mpsc::unbounded_channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let bgp = Arc::new(Bgp {
            shared: shared.clone(),
            tx: tx.clone(),
            stopping: stopping.clone(),
        });
        let store2 = store.clone();
        let stop2 = stopping.clone();
        let tx2 = tx.clone();
        std::thread::Builder::new()
            .name("bgp-watch".into())
            .spawn(move || watch_loop(&*store2, &tx2, &stop2))?;
        crate::runtime::spawn_current_thread("bgp", "BGP", move |_| {
            Runner::new(settings, store, shared).run(rx)
        })?;
        Ok(bgp)
    }

    /// The sessions, for `ternctl node status`: asked from the speaker at the time of the
    /// call (a periodic snapshot would show sessions that came up within the last second as
    /// still connecting). Falls back to the last snapshot when the BGP thread is busy or
    /// stopped.
    pub fn status(&self) -> BgpStatusReply {
        if !self.stopping.load(Ordering::Relaxed) {
            let (tx, rx) = std::sync::mpsc::channel();
            if self.tx.send(Msg::Status(tx)).is_ok()
                && let Ok(s) = rx.recv_timeout(Duration::from_secs(3))
            {
                return s;
            }
        }
        self.shared.lock().unwrap().status.clone()
    }

    /// Stops the speaker for a restart: sessions with graceful restart are closed without
    /// NOTIFICATION, so peers keep our routes; learned routes stay in the kernel. Waits up to
    /// five seconds.
    pub fn stop_for_restart(&self) {
        if self.stopping.swap(true, Ordering::Relaxed) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Stop(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }

    /// Appends the per-session metrics to a `/metrics` page.
    pub fn render_metrics(&self, page: &mut Page) {
        self.shared.lock().unwrap().render_metrics(page);
    }
}
