//! Reconciliation of the node against the store: run at start-up (before serving) and on a timer.
//!
//! 1. Replay the release journal (DELs that happened while the agent or the store was down).
//! 2. Endpoints whose host interface is missing: re-create the wiring when the pod's netns still
//!    exists, otherwise release the addresses and delete the endpoint.
//! 3. Interfaces with tern's prefix that belong to no endpoint (and no ADD in flight): remove.

use crate::server::Agent;
use ipnet::IpNet;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;
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
    /// One full reconciliation pass.
    pub fn reconcile(&self) -> Report {
        let mut r = Report::default();
        self.replay_journal(&mut r);
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
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    r.errors
                        .push(format!("{}: unreadable journal entry: {e}", path.display()));
                    continue;
                }
            };
            if !entry.host_ifname.is_empty()
                && let Err(e) = veth::teardown_pod_interface(&entry.host_ifname)
            {
                r.errors.push(format!("{}: {e}", entry.host_ifname));
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
                    crate::leak::delete_owner(
                        &*self.store,
                        &self.cfg.node_name,
                        &entry.attachment.handle(),
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
        for l in links {
            let ours =
                l.name.starts_with(&self.cfg.interface_prefix) && l.kind.as_deref() == Some("veth");
            if !ours || owned.contains(&l.name) || self.reaper.is_pending(&l.name) {
                continue;
            }
            let Some(_claim) = self.in_flight.try_claim(&l.name) else {
                continue;
            };
            if self.endpoints.all().iter().any(|e| e.host_ifname == l.name) {
                continue;
            }
            match h.delete_link(&l.name) {
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
        let ns = if a.netns_path.is_empty() {
            None
        } else {
            NetNs::open(ns_path).ok()
        };
        if let Some(ns) = ns {
            let addrs: Vec<IpNet> = ep
                .ip_networks
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            let cfg = veth::PodInterfaceConfig {
                host_ifname: &ep.host_ifname,
                pod_ifname: &a.ifname,
                pod_ns: &ns,
                addresses: &addrs,
                mtu: self.pod_mtu(),
                pod_mac: crate::ops::parse_mac(&ep.mac),
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
                Err(e) => r.errors.push(format!("repairing {}: {e}", ep.host_ifname)),
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

/// The MTU of the interface carrying the default route, 1500 when there is none.
pub fn detect_mtu() -> u32 {
    let detect = || -> Option<u32> {
        let mut h = Handle::new().ok()?;
        let default = h
            .routes(false)
            .ok()?
            .into_iter()
            .find(|r| r.dst.prefix_len() == 0)?;
        let link = h.link_by_index(default.oif?).ok()??;
        Some(link.mtu)
    };
    detect().unwrap_or(1500)
}

/// The addresses (with prefix) of the interface carrying the default route: the node's
/// underlay addresses.
pub fn node_addresses() -> Vec<IpNet> {
    let find = || -> Option<Vec<IpNet>> {
        let mut h = Handle::new().ok()?;
        let default = h
            .routes(false)
            .ok()?
            .into_iter()
            .find(|r| r.dst.prefix_len() == 0)?;
        let addrs = h.addresses(Some(default.oif?)).ok()?;
        Some(
            addrs
                .into_iter()
                .map(|(_, a)| a)
                .filter(|a| !a.addr().is_loopback())
                .collect(),
        )
    };
    find().unwrap_or_default()
}
