//! The maintenance loop and the reconciliation it runs: at start-up (before serving) and on a
//! timer ([`Agent::start_maintenance`]), which also retries journaled releases, renews the
//! node's liveness lease, gives back empty blocks, resyncs the dataplane and policy, and
//! repairs leaks. The pod lifecycle ([`crate::pod::repair`]) does the pods' part:
//!
//! 1. Replay the release journal (DELs that happened while the agent or the store was down).
//! 2. Endpoints whose host interface is missing: re-create the wiring when the pod's netns still
//!    exists, otherwise release the addresses and delete the endpoint.
//! 3. Interfaces with tern's prefix that belong to no endpoint (and no ADD in flight): remove.

use crate::agent::Agent;
use std::time::Duration;

pub use crate::pod::Report;

impl Agent {
    /// One full reconciliation pass; also checks the node's prerequisites (sysctls).
    ///
    /// Interfaces are reconciled only while the store is trusted ([`Agent::store_trust_problem`]):
    /// a store file replaced or deleted under the agent, or a cluster ID gone or changed, would
    /// otherwise make every running pod look like an orphan.
    pub fn reconcile(&self) -> Report {
        let mut r = Report::default();
        self.check_host();
        self.pods().replay_journal(&mut r);
        if let Some(p) = self.store_trust_problem() {
            r.errors.push(format!("not reconciling interfaces: {p}"));
            return r;
        }
        self.pods().refresh_endpoints(&mut r);
        self.pods().sweep_interfaces(&mut r, self.pod_mtu(), &|| {
            self.store_trust_problem().is_none()
        });
        r
    }

    /// Replays the release journal only (the quick retry while releases are pending).
    pub fn replay_pending(&self, r: &mut Report) {
        self.pods().replay_journal(r);
    }
}

impl Agent {
    /// Why the store can no longer be trusted to say which pods exist, if it cannot (see
    /// [`crate::identity::store_trust_problem`]); the problem is kept for `/readiness`.
    pub fn store_trust_problem(&self) -> Option<String> {
        crate::identity::store_trust_problem(&*self.store, self.cluster_id(), &self.store_problem)
    }

    /// Checks (and unless `--no-set-sysctls` sets) the node's prerequisites
    /// ([`crate::hostcheck`]); runs at start and at every reconciliation.
    pub fn check_host(&self) {
        self.host.check(
            &*self.store,
            self.cfg.set_sysctls,
            // Not `vxlan-v6.tern`: only IPv6 travels in it, and IPv6 has no rp_filter.
            &[crate::routes::VXLAN_DEVICE, crate::routes::IPIP_DEVICE],
        );
    }

    /// One leak-repair pass ([`crate::pod::leak`]) over the pod lifecycle's allocations,
    /// endpoints and in-flight handles; released addresses count as GC reclamations in
    /// `/metrics`.
    pub fn repair_leaks(&self) -> crate::pod::leak::LeakReport {
        let r = self.pods().repair_leaks();
        self.metrics.add_gc_reclamations(r.released.len() as u64);
        r
    }

    /// The maintenance thread's body (see [`Agent::start_maintenance`]); returns once the agent
    /// is stopping.
    pub(crate) fn maintenance_loop(&self) {
        let period = Duration::from_secs(self.cfg.resync_seconds.max(1));
        // While releases are journaled, retry this often rather than once per resync.
        let retry = Duration::from_secs(2).min(period);
        loop {
            let mut slept = Duration::ZERO;
            let mut since_retry = Duration::ZERO;
            while slept < period {
                if self.stopping() {
                    return;
                }
                self.tick();
                if slept.as_millis().is_multiple_of(10_000) {
                    self.dataplane_keepalive();
                }
                std::thread::sleep(Duration::from_millis(200));
                slept += Duration::from_millis(200);
                since_retry += Duration::from_millis(200);
                if since_retry >= retry && self.pods().journal_dirty() {
                    since_retry = Duration::ZERO;
                    let mut r = Report::default();
                    self.replay_pending(&mut r);
                    if !r.is_empty() {
                        log::info!("journal retry: {r}");
                    }
                }
            }
            self.tick();
            let report = self.reconcile();
            if !report.is_empty() {
                log::info!("periodic reconcile: {report}");
            }
            self.pods().set_journal_dirty(report.journal_pending > 0);
            self.pods().release_empty_blocks();
            if let Some(dp) = self.dataplane() {
                // Full resync: repairs what changed behind the agent's back.
                dp.sync();
            }
            if let Some(p) = &self.policy
                && let Err(e) = p.resync()
            {
                log::warn!("policy resync: {e}");
            }
            let leaks = self.repair_leaks();
            if !leaks.released.is_empty() || !leaks.errors.is_empty() {
                log::info!(
                    "leak repair: {} suspects, released {:?}, errors {:?}",
                    leaks.suspects,
                    leaks.released,
                    leaks.errors
                );
            }
            crate::metrics::trim_heap();
        }
    }

    fn dataplane_keepalive(&self) {
        if let Some(dp) = self.dataplane()
            && let Err(e) = dp.keepalive()
        {
            log::warn!("node liveness lease: {e}");
        }
    }
}
