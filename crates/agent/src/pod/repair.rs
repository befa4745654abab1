//! Repair: the reconciliation of the node's endpoints against its interfaces (run at start-up
//! and by the maintenance loop), and leak repair.
//!
//! 1. Endpoints whose host interface is missing: re-create the wiring when the pod's netns still
//!    exists, otherwise release the addresses and delete the endpoint.
//! 2. Interfaces with tern's prefix that belong to no endpoint (and no ADD in flight): remove
//!    (the orphan sweep).
//! 3. Allocations no endpoint, ADD or owner record accounts for: release after a grace period
//!    ([`super::leak`]).

use super::PodLifecycle;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::time::Duration;
use tern_linux::netns::NetNs;
use tern_linux::veth;
use tern_model::MacAddr;

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

impl PodLifecycle {
    /// Re-reads the endpoint cache from the store.
    pub fn refresh_endpoints(&self, r: &mut Report) {
        if let Err(e) = self.endpoints.refresh() {
            r.errors.push(format!("refreshing endpoints: {e}"));
        }
    }

    /// Reconciles the node's interfaces with its endpoints: an endpoint whose host interface
    /// is missing is repaired (its namespace alive, wired with `mtu`) or released; a host
    /// interface of tern's with no endpoint and no operation in flight is an orphan and
    /// deleted, unless `trusted` (asked right before the first deletion) says the store can no
    /// longer tell, or most of the node's live pods look orphaned (the mass-deletion guard).
    pub fn sweep_interfaces(&self, r: &mut Report, mtu: u32, trusted: &dyn Fn() -> bool) {
        let mut h = match self.kernel() {
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
            self.repair_or_release(&ep, mtu, r);
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
        let mut store_trusted: Option<bool> = None;
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
            if !*store_trusted.get_or_insert_with(trusted) {
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

    fn repair_or_release(&self, ep: &crate::endpoints::Endpoint, mtu: u32, r: &mut Report) {
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
                Ok(fd) => {
                    match super::check_netns_fd(std::os::fd::AsFd::as_fd(&fd), &self.host_netns) {
                        Ok(()) => Some(NetNs::from_fd(fd)),
                        Err(why) => return not_checked(why.to_string(), r),
                    }
                }
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
                mtu,
                pod_mac: ep.mac.map(MacAddr::octets),
                allow_ip_forwarding: false,
            };
            let wired = self
                .kernel()
                .and_then(|mut k| veth::setup_pod_interface_on(&mut *k, &cfg));
            match wired {
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

    /// One leak-repair pass ([`super::leak`]) over this node's allocations, endpoints and
    /// in-flight handles.
    pub fn repair_leaks(&self) -> super::leak::LeakReport {
        self.leaks.repair(&super::leak::RepairInputs {
            node: &self.cfg.node_name,
            store: &*self.store,
            ipam: &self.ipam,
            in_flight_handles: &self.in_flight_handles,
            endpoints: &self.endpoints,
            grace: self.cfg.leak_grace,
        })
    }

    /// Gives back this node's blocks that have been empty for longer than the configured grace
    /// period (never the node's last block).
    pub fn release_empty_blocks(&self) {
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
}
