//! Reconciliation of the node against the store: run at start-up (before serving) and on a timer
//! by the maintenance loop ([`Agent::start_maintenance`]), which also retries journaled
//! releases, renews the node's liveness lease, gives back empty blocks, resyncs the dataplane
//! and policy, and repairs leaks.
//!
//! 1. Replay the release journal (DELs that happened while the agent or the store was down).
//! 2. Endpoints whose host interface is missing: re-create the wiring when the pod's netns still
//!    exists, otherwise release the addresses and delete the endpoint.
//! 3. Interfaces with tern's prefix that belong to no endpoint (and no ADD in flight): remove.

use crate::server::Agent;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tern_api::journal;
use tern_linux::netlink::Handle;
use tern_linux::netns::NetNs;
use tern_linux::veth;

/// What one reconciliation pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub journal_completed: usize,
    pub journal_pending: usize,
    pub endpoints_repaired: usize,
    pub endpoints_released: usize,
    pub interfaces_removed: usize,
    pub errors: Vec<String>,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        *self == Report::default()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "journal {} completed / {} pending, endpoints {} repaired / {} released, {} orphan interfaces removed",
            self.journal_completed,
            self.journal_pending,
            self.endpoints_repaired,
            self.endpoints_released,
            self.interfaces_removed
        )?;
        if !self.errors.is_empty() {
            write!(f, ", errors: {}", self.errors.join("; "))?;
        }
        Ok(())
    }
}

impl Agent {
    /// One full reconciliation pass; also checks the node's prerequisites (sysctls).
    ///
    /// Interfaces are reconciled only while the store is trusted ([`Agent::store_trust_problem`]):
    /// a store file replaced or deleted under the agent, or a cluster ID gone or changed, would
    /// otherwise make every running pod look like an orphan.
    pub fn reconcile(&self) -> Report {
        let mut r = Report::default();
        self.check_host();
        self.replay_journal(&mut r);
        if let Some(p) = self.store_trust_problem() {
            r.errors.push(format!("not reconciling interfaces: {p}"));
            return r;
        }
        if let Err(e) = self.endpoints.refresh() {
            r.errors.push(format!("refreshing endpoints: {e}"));
        }
        self.reconcile_interfaces(&mut r);
        r
    }

    /// Replays the release journal only (the quick retry while releases are pending).
    pub fn replay_pending(&self, r: &mut Report) {
        self.replay_journal(r);
    }

    fn replay_journal(&self, r: &mut Report) {
        let entries = match journal::pending(&self.cfg.state_dir) {
            Ok(e) => e,
            Err(e) => {
                r.errors.push(format!("reading journal: {e}"));
                return;
            }
        };
        for (path, entry) in entries {
            let mut entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    r.errors
                        .push(format!("{}: unreadable journal entry: {e}", path.display()));
                    continue;
                }
            };
            let mut path = path;
            // The entry names an interface; it is deleted only when it is one of tern's pod
            // veths (prefix and kind checked) that no endpoint owns and no ADD is wiring: a
            // pod re-created under the same name (StatefulSet `web-0`) has the same veth name,
            // and a bridge or NIC of that name stays. The name is dropped from the entry once
            // dealt with, so a release that keeps failing never deletes a later veth.
            if !entry.host_ifname.is_empty() {
                let name = entry.host_ifname.clone();
                let same = |x: &tern_api::Attachment| {
                    let y = &entry.attachment;
                    (&x.network, &x.container_id, &x.ifname)
                        == (&y.network, &y.container_id, &y.ifname)
                };
                // Another attachment's endpoint (the journaled one's own may still be recorded:
                // its release is what is pending).
                let done = if self
                    .endpoints
                    .all()
                    .iter()
                    .any(|e| e.host_ifname == name && !same(&e.attachment))
                {
                    log::info!(
                        "journal entry {}: interface {name} belongs to a live endpoint; not deleting it",
                        path.display()
                    );
                    true
                } else if let Some(_claim) = self.in_flight.try_claim(&name) {
                    match tern_linux::delete_pod_veth(&name, &self.cfg.interface_prefix) {
                        Ok(tern_linux::Deleted::Refused(why)) => {
                            log::warn!(
                                "journal entry {}: not deleting interface {name}: {why}",
                                path.display()
                            );
                            true
                        }
                        Ok(_) => true,
                        Err(e) => {
                            r.errors.push(format!("{name}: {e}"));
                            false
                        }
                    }
                } else {
                    // An ADD or DEL of that name is running: it owns the interface now.
                    true
                };
                if done {
                    entry.host_ifname.clear();
                    match journal::record(&self.cfg.state_dir, &entry) {
                        Ok(p) => {
                            if let Err(e) = journal::complete(&path) {
                                r.errors.push(format!("{}: {e}", path.display()));
                            }
                            path = p;
                        }
                        Err(e) => r
                            .errors
                            .push(format!("rewriting journal entry {}: {e}", path.display())),
                    }
                }
            }
            let delegated = entry.delegated_ipam
                || self
                    .endpoints
                    .get(&entry.attachment)
                    .is_some_and(|e| e.delegated_ipam);
            let released = self
                .release_attachment(&entry.attachment, delegated)
                .and_then(|()| {
                    // A standalone tern-ipam DEL also ends the allocation's owner record.
                    crate::owners::delete_owner_of(
                        &*self.store,
                        &self.cfg.node_name,
                        &entry.attachment,
                    )
                    .map_err(|e| e.to_string())
                });
            match released {
                Ok(()) => {
                    if let Err(e) = journal::complete(&path) {
                        r.errors.push(format!("{}: {e}", path.display()));
                    }
                    log::info!(
                        "completed journaled release of {}/{} ({})",
                        entry.attachment.container_id,
                        entry.attachment.ifname,
                        entry.source
                    );
                    r.journal_completed += 1;
                }
                Err(e) => {
                    r.journal_pending += 1;
                    log::debug!("journal entry {} still pending: {e}", path.display());
                }
            }
        }
    }

    fn reconcile_interfaces(&self, r: &mut Report) {
        let mut h = match Handle::new() {
            Ok(h) => h,
            Err(e) => {
                r.errors.push(format!("netlink: {e}"));
                return;
            }
        };
        let links = match h.links() {
            Ok(l) => l,
            Err(e) => {
                r.errors.push(format!("listing links: {e}"));
                return;
            }
        };
        let present: HashSet<String> = links.iter().map(|l| l.name.clone()).collect();
        let mut owned = HashSet::new();
        for ep in self.endpoints.all() {
            owned.insert(ep.host_ifname.clone());
            if present.contains(&ep.host_ifname) {
                continue;
            }
            // An ADD or DEL of this interface is running: it decides, not us.
            let Some(_claim) = self.in_flight.try_claim(&ep.host_ifname) else {
                continue;
            };
            // Re-check under the claim: a DEL may have finished since the snapshot.
            if self.endpoints.get(&ep.attachment).is_none()
                || self.reaper.is_pending(&ep.host_ifname)
                || h.link_by_name(&ep.host_ifname).ok().flatten().is_some()
            {
                continue;
            }
            self.repair_or_release(&ep, r);
        }
        // Mass-deletion guard. A host veth's peer in a live foreign namespace is a running pod
        // (veth pairs die together): when the store no longer knows most of the node's pods
        // (a node renamed, a store restored from a backup, endpoints deleted), deleting them
        // all is an outage, not a cleanup. Such a pass deletes only half-made pairs (peer in
        // this namespace) and waits for the operator (`--accept-new-store`); `/readiness`
        // says why. One unknown pod among others is an ordinary leftover and goes.
        let ours_total = links
            .iter()
            .filter(|l| tern_linux::pod_veth_ours(l, &self.cfg.interface_prefix).is_ok())
            .count();
        let live_orphans: Vec<&str> = links
            .iter()
            .filter(|l| {
                tern_linux::pod_veth_ours(l, &self.cfg.interface_prefix).is_ok()
                    && l.link_netnsid.is_some()
                    && !owned.contains(&l.name)
                    && !self.reaper.is_pending(&l.name)
            })
            .map(|l| l.name.as_str())
            .collect();
        let hold_live = live_orphans.len() >= 2
            && live_orphans.len() * 2 > ours_total
            && !self.cfg.accept_new_store;
        {
            let mut p = self
                .orphan_problem
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if hold_live {
                let msg = format!(
                    "{} of the node's {ours_total} pod interfaces ({}{}) have a live pod but no \
                     endpoint in the store; not deleting them. If the store lost them (restored \
                     backup, changed --node-name), restore it; to delete them, restart ternd \
                     with --accept-new-store",
                    live_orphans.len(),
                    live_orphans
                        .iter()
                        .take(5)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", "),
                    if live_orphans.len() > 5 { ", ..." } else { "" }
                );
                if p.as_deref() != Some(msg.as_str()) {
                    log::error!("{msg}");
                }
                r.errors.push(msg.clone());
                *p = Some(msg);
            } else {
                *p = None;
            }
        }
        // Checked again at the first orphan, right before deleting anything: the store may have
        // been swapped since the pass began.
        let mut trusted: Option<bool> = None;
        for l in links {
            // Prefixed veths only (an empty prefix matches nothing, not everything).
            let ours = tern_linux::pod_veth_ours(&l, &self.cfg.interface_prefix).is_ok();
            if !ours || owned.contains(&l.name) || self.reaper.is_pending(&l.name) {
                continue;
            }
            if hold_live && l.link_netnsid.is_some() {
                continue;
            }
            let Some(_claim) = self.in_flight.try_claim(&l.name) else {
                continue;
            };
            if self.endpoints.all().iter().any(|e| e.host_ifname == l.name) {
                continue;
            }
            if !*trusted.get_or_insert_with(|| self.store_trust_problem().is_none()) {
                r.errors
                    .push(format!("not removing {}: the store is not trusted", l.name));
                continue;
            }
            // By index: the link checked above, not whatever holds the name by now.
            match h.delete_link_by_index(l.index) {
                Ok(_) => {
                    log::info!("removed orphan interface {} (no endpoint)", l.name);
                    r.interfaces_removed += 1;
                }
                Err(e) => r.errors.push(format!("removing {}: {e}", l.name)),
            }
        }
    }

    fn repair_or_release(&self, ep: &crate::endpoints::Endpoint, r: &mut Report) {
        let a = &ep.attachment;
        let ns_path = Path::new(&a.netns_path);
        // The path comes from the store: opened without blocking (a FIFO would hang the
        // maintenance thread and the start-up pass), and only a network namespace other than
        // the node's own is wired (the same checks as a namespace passed on the socket).
        // Released only when the namespace is gone (no path, or nothing at it). A path that
        // exists but is not a network namespace this agent can check (a mount that did not
        // propagate into ternd's container, a permission problem) may still be a live pod:
        // releasing its address would let another pod get it, so it is reported and kept.
        let ns = if a.netns_path.is_empty() {
            None
        } else {
            let not_checked = |why: String, r: &mut Report| {
                r.errors.push(format!(
                    "not repairing or releasing {} of {}/{}: netns {}: {why}",
                    ep.host_ifname, a.container_id, a.ifname, a.netns_path
                ));
            };
            match tern_linux::netns::open_nonblocking(ns_path) {
                Ok(fd) => match crate::server::check_netns_fd(
                    std::os::fd::AsFd::as_fd(&fd),
                    &self.host_netns,
                ) {
                    Ok(()) => Some(NetNs::from_fd(fd)),
                    Err(why) => return not_checked(why.to_string(), r),
                },
                Err(tern_linux::netns::NsFileError::Open(e))
                    if e.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                Err(e) => return not_checked(e.to_string(), r),
            }
        };
        if let Some(ns) = ns {
            let cfg = veth::PodInterfaceConfig {
                host_ifname: &ep.host_ifname,
                pod_ifname: &a.ifname,
                pod_ns: &ns,
                addresses: &ep.ip_networks,
                mtu: self.pod_mtu(),
                pod_mac: crate::host::parse_mac(&ep.mac),
                allow_ip_forwarding: false,
            };
            match veth::setup_pod_interface(&cfg) {
                Ok(_) => {
                    log::info!(
                        "repaired interface {} of {}/{}",
                        ep.host_ifname,
                        a.container_id,
                        a.ifname
                    );
                    r.endpoints_repaired += 1;
                    return;
                }
                // The namespace is alive, so the pod may be: its address stays allocated
                // (the next pass tries again; the pod's DEL releases it).
                Err(e) => {
                    r.errors.push(format!(
                        "repairing {} (address kept: its network namespace is alive): {e}",
                        ep.host_ifname
                    ));
                    return;
                }
            }
        }
        match self.release_attachment(a, ep.delegated_ipam) {
            Ok(()) => {
                log::info!(
                    "released endpoint {}/{}: its interface and network namespace are gone",
                    a.container_id,
                    a.ifname
                );
                r.endpoints_released += 1;
            }
            Err(e) => r
                .errors
                .push(format!("releasing {}/{}: {e}", a.container_id, a.ifname)),
        }
    }
}

impl Agent {
    /// Why the store can no longer be trusted to say which pods exist, if it cannot (see
    /// [`crate::identity::store_trust_problem`]); the problem is kept for `/readiness`.
    pub fn store_trust_problem(&self) -> Option<String> {
        crate::identity::store_trust_problem(&*self.store, &self.cluster_id, &self.store_problem)
    }

    /// The cluster ID this agent joined at start.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Checks (and unless `--no-set-sysctls` sets) the node's prerequisites
    /// ([`crate::hostcheck`]); runs at start and at every reconciliation.
    pub fn check_host(&self) {
        self.host.check(
            &*self.store,
            self.cfg.set_sysctls,
            &[crate::routes::VXLAN_DEVICE, crate::routes::IPIP_DEVICE],
        );
    }

    /// One leak-repair pass ([`crate::leak`]) over this agent's allocations, endpoints and
    /// in-flight handles; released addresses count as GC reclamations in `/metrics`.
    pub fn repair_leaks(&self) -> crate::leak::LeakReport {
        let r = self.leaks.repair(&crate::leak::RepairInputs {
            node: &self.cfg.node_name,
            store: &*self.store,
            ipam: &self.ipam,
            in_flight_handles: &self.in_flight_handles,
            endpoints: &self.endpoints,
            grace: std::time::Duration::from_secs(self.cfg.leak_grace_seconds),
        });
        self.metrics.add_gc_reclamations(r.released.len() as u64);
        r
    }

    /// Gives back this node's blocks that have been empty for longer than the configured grace
    /// period (never the node's last block).
    fn release_empty_blocks(&self) {
        let grace = match self.ipam.config() {
            Ok(c) => Duration::from_secs(c.empty_block_grace_seconds),
            Err(e) => {
                log::debug!("cannot read the IPAM configuration: {e}");
                return;
            }
        };
        match self.ipam.release_empty_blocks(&self.cfg.node_name, grace) {
            Ok(blocks) if !blocks.is_empty() => log::info!("released empty blocks {blocks:?}"),
            Ok(_) => {}
            Err(e) => log::warn!("releasing empty blocks: {e}"),
        }
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
                if since_retry >= retry && self.journal_dirty.load(Ordering::Relaxed) {
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
            self.journal_dirty
                .store(report.journal_pending > 0, Ordering::Relaxed);
            self.release_empty_blocks();
            if let Some(dp) = &self.dataplane {
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
        if let Some(dp) = &self.dataplane
            && let Err(e) = dp.keepalive()
        {
            log::warn!("node liveness lease: {e}");
        }
    }
}
