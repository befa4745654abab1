//! Giving back: CNI DEL and GC, the standalone IPAM operations of the `tern-ipam` plugin, and
//! the replay of the release journal.
//!
//! DEL tears the kernel side down first, then releases; a release the store cannot take now is
//! journaled (`tern_api::journal`) and completed by the maintenance loop's replay.

use super::PodLifecycle;
use super::add::{CLAIM_WAIT, busy};
use super::errors::{err, ipam_err, store_err};
use super::repair::Report;
use crate::undo::Undo;
use ipnet::IpNet;
use std::collections::HashSet;
use std::net::IpAddr;
use tern_api::journal::{self, JournalEntry};
use tern_api::{
    Attachment, DelRequest, ErrorReply, GcRequest, IpConfig, IpamAddRequest, NetResult, Reply,
    Response, Route,
};
use tern_cni::code;
use tern_ipam::{AllocationAttrs, IpamError};
use tern_store::StoreError;

impl PodLifecycle {
    /// Serves a DEL: the pod's interface detached (deleted off the request path), its policy
    /// removed, its addresses released and its endpoint deleted; a release the store cannot take
    /// now is journaled.
    pub fn del(&self, req: DelRequest) -> Response {
        let a = &req.attachment;
        let ep = self.endpoints.get(a);
        let host_if = ep
            .as_ref()
            .map(|e| e.host_ifname.clone())
            .unwrap_or_else(|| self.host_ifname(a));
        let Some(_claim) = self.in_flight.claim(&host_if, CLAIM_WAIT) else {
            return Err(busy(&host_if));
        };
        // Read again under the claim: an ADD of this very attachment may have held it and
        // finished meanwhile (a runtime DELs after an ADD timed out). Its endpoint is this
        // DEL's, not "another endpoint's": deleting only the addresses would leave the live
        // veth with an address IPAM hands out again.
        let ep = self.endpoints.get(a).or(ep);
        // Without an endpoint of its own (a stale sandbox of the pod, a repeated DEL), the
        // derived name may be the veth of another attachment: another sandbox of the same pod
        // shares it. That veth is not this DEL's to touch; only the addresses are released.
        let owned_by_other = ep.is_none()
            && self
                .endpoints
                .all()
                .iter()
                .any(|e| e.host_ifname == host_if);
        if owned_by_other {
            log::info!(
                "DEL {}/{}: interface {host_if} belongs to another endpoint; releasing addresses only",
                a.container_id,
                a.ifname
            );
        }
        // The kernel takes ~20 ms to unregister a veth; the pod is cut off now (link down) and
        // the deletion itself happens off the request path.
        if !owned_by_other && let Err(e) = self.reaper.detach(&host_if, &self.cfg.interface_prefix)
        {
            return Err(err(
                code::INTERFACE,
                format!("removing interface {host_if}: {e}"),
            ));
        }
        if let (Some(p), Some(e)) = (&self.policy, &ep)
            && let Err(pe) = p.endpoint_removed(&e.namespace(), &e.name())
        {
            // The store watch and the periodic resync retry it.
            log::warn!("removing the policy rules of {host_if}: {pe}");
        }
        let delegated = req.delegated_ipam || ep.as_ref().is_some_and(|e| e.delegated_ipam);
        match self.release_attachment(a, delegated) {
            Ok(()) => {}
            Err(e) => {
                // Local teardown is done; the release completes when the store is back.
                // The interface is gone already (or another endpoint's): the replay releases only.
                let entry = JournalEntry {
                    attachment: a.clone(),
                    host_ifname: String::new(),
                    delegated_ipam: delegated,
                    source: "agent".into(),
                };
                match journal::record(&self.cfg.state_dir, &entry) {
                    Ok(p) => {
                        self.set_journal_dirty(true);
                        log::warn!(
                            "store unavailable ({e}); release journaled at {}",
                            p.display()
                        )
                    }
                    Err(je) => {
                        return Err(err(
                            code::TRY_AGAIN_LATER,
                            format!("store unavailable ({e}) and journal failed: {je}"),
                        ));
                    }
                }
            }
        }
        Ok(Reply::Done)
    }

    /// Releases an attachment's addresses (unless delegated) and deletes its endpoint.
    pub fn release_attachment(&self, a: &Attachment, delegated: bool) -> Result<(), String> {
        if !delegated {
            self.release_handles(a).map_err(|e| e.to_string())?;
        }
        self.endpoints.remove(a).map_err(|e| e.to_string())
    }

    /// The attachment's handle in the form written before handles were unambiguous, when the
    /// store still holds addresses under it that were allocated for this very attachment
    /// (same container ID and interface): a pod added before the upgrade. A legacy handle
    /// shared with another attachment is never returned.
    pub fn legacy_handle_of(&self, a: &Attachment) -> Result<Option<String>, IpamError> {
        let legacy = a.legacy_handle();
        if legacy == a.handle() {
            return Ok(None);
        }
        Ok(self
            .ipam
            .handle_held_by(&legacy, &a.container_id, &a.ifname)?
            .then_some(legacy))
    }

    /// Releases the attachment's handle and, for a pod added before the upgrade, its legacy
    /// handle; returns the legacy handle released, if any.
    pub(super) fn release_handles(&self, a: &Attachment) -> Result<Option<String>, IpamError> {
        self.ipam.release_by_handle(&a.handle())?;
        let legacy = self.legacy_handle_of(a)?;
        if let Some(l) = &legacy {
            self.ipam.release_by_handle(l)?;
        }
        Ok(legacy)
    }

    /// The addresses IPAM holds for the attachment, under either handle form.
    pub(super) fn ips_of(&self, a: &Attachment) -> Result<Vec<IpAddr>, IpamError> {
        let mut held = self.ipam.ips_by_handle(&a.handle())?;
        if let Some(l) = self.legacy_handle_of(a)? {
            held.extend(self.ipam.ips_by_handle(&l)?);
        }
        Ok(held)
    }

    /// Serves a CNI GC: deletes the interfaces and releases the addresses of this network's
    /// attachments that are not in `req.valid`.
    pub fn gc(&self, req: GcRequest) -> Response {
        let valid: HashSet<(String, String)> = req.valid.iter().cloned().collect();
        let mut errors = Vec::new();
        let mut released = 0usize;
        for ep in self.endpoints.all() {
            let a = &ep.attachment;
            if a.network != req.network
                || valid.contains(&(a.container_id.clone(), a.ifname.clone()))
            {
                continue;
            }
            // The name comes from the store: only tern's own pod veth of that name goes (prefix,
            // digest shape and kind checked, deleted by index), never `cni0` or a NIC.
            let deleted = self.kernel().and_then(|mut k| {
                tern_linux::delete_pod_veth_on(&mut *k, &ep.host_ifname, &self.cfg.interface_prefix)
            });
            match deleted {
                Ok(tern_linux::Deleted::Refused(why)) => log::warn!(
                    "GC: not deleting interface {} of {}/{}: {why}",
                    ep.host_ifname,
                    a.container_id,
                    a.ifname
                ),
                Ok(_) => {}
                Err(e) => {
                    errors.push(format!("{}: {e}", ep.host_ifname));
                    continue;
                }
            }
            match self.release_attachment(a, ep.delegated_ipam || req.delegated_ipam) {
                Ok(()) => released += 1,
                Err(e) => errors.push(format!("{}/{}: {e}", a.container_id, a.ifname)),
            }
        }
        if !req.delegated_ipam {
            // Allocations of this network on this node with no valid attachment (e.g. IPAM-only
            // users of tern-ipam, or an ADD that died between allocation and endpoint).
            match self.ipam.allocations(Some(&self.cfg.node_name)) {
                Ok(allocs) => {
                    let prefix = tern_api::ident::handle_prefix(&req.network);
                    let mut seen = HashSet::new();
                    for al in allocs {
                        let Some(handle) = al.handle else { continue };
                        // This network's handles; a legacy one (`<network>.<cid>[.<if>]`) only
                        // when it is exactly what this network's attachment of the
                        // allocation's container and interface was given, never by prefix (a
                        // network `a.b` is not part of network `a`).
                        let legacy = tern_api::ident::legacy_handle(
                            &req.network,
                            &al.attrs.container_id,
                            &al.attrs.ifname,
                        );
                        let ours = handle.starts_with(&prefix)
                            || (!al.attrs.container_id.is_empty() && handle == legacy);
                        if !ours || !seen.insert(handle.clone()) {
                            continue;
                        }
                        let key = (al.attrs.container_id.clone(), al.attrs.ifname.clone());
                        if valid.contains(&key) {
                            continue;
                        }
                        match self.ipam.release_by_handle(&handle) {
                            Ok(_) => released += 1,
                            Err(e) => errors.push(format!("{handle}: {e}")),
                        }
                    }
                }
                Err(e) => errors.push(format!("listing allocations: {e}")),
            }
        }
        log::info!(
            "GC of network {}: released {released} attachments",
            req.network
        );
        if errors.is_empty() {
            Ok(Reply::Done)
        } else {
            Err(err(
                code::AGENT,
                format!("GC finished with errors: {}", errors.join("; ")),
            ))
        }
    }

    /// Serves a standalone IPAM ADD (the `tern-ipam` plugin).
    pub fn ipam_add(&self, req: IpamAddRequest) -> Response {
        let a = &req.attachment;
        let mut undo = Undo::new(format!("IPAM ADD {}", a.container_id));
        undo.hold(self.in_flight_handles.hold(&a.handle()));
        // Standalone IPAM allocations have no tern endpoint: the owner record (written before
        // allocating) tells leak repair which sandbox holds them.
        let owner = crate::owners::OwnerRecord {
            handle: a.handle(),
            node: self.cfg.node_name.clone(),
            network: a.network.clone(),
            container_id: a.container_id.clone(),
            ifname: a.ifname.clone(),
            netns: a.netns_path.clone(),
        };
        crate::owners::record_owner(&*self.store, &owner)
            .map_err(|e| store_err("recording the IPAM owner", &e))?;
        let handle = a.handle();
        undo.push(format!("the owner record of {handle}"), move || {
            crate::owners::delete_owner(&*self.store, &self.cfg.node_name, &handle)
                .map_err(|e| e.to_string())
        });
        self.undo_allocation(&mut undo, a.handle());
        let ips = self.allocate(a, &req.ipam)?;
        // Main plugins such as the reference ptp expect a subnet-style result: the address with
        // its block's prefix and an on-link gateway inside that block. Each block served this way
        // gets one gateway address of its own, allocated like a pod address and never released
        // automatically (as host-local keeps its gateway out of its range).
        let mut result = NetResult::default();
        for ip in ips {
            let (addr, gw) = self.block_gateway(ip)?;
            result.ips.push(IpConfig {
                address: addr.to_string(),
                gateway: Some(gw.to_string()),
                interface: None,
            });
            let dst = if ip.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
            if !result.routes.iter().any(|r| r.dst == dst) {
                result.routes.push(Route {
                    dst: dst.into(),
                    gw: None,
                });
            }
        }
        undo.commit();
        Ok(Reply::Result(result))
    }

    /// The address `ip` with its block's prefix, and the block's gateway for standalone IPAM
    /// results (allocated on first use under the handle `tern-ipam-gateway.<node>.<block>`).
    fn block_gateway(&self, ip: IpAddr) -> Result<(IpNet, IpAddr), ErrorReply> {
        let node = &self.cfg.node_name;
        let allocs = self.ipam.allocations(None).map_err(|e| ipam_err(&e))?;
        let block = allocs
            .iter()
            .find(|al| al.ip == ip)
            .map(|al| al.block)
            .ok_or_else(|| err(code::AGENT, format!("allocated address {ip} has no block")))?;
        let addr = IpNet::new(ip, block.prefix_len()).unwrap_or_else(|_| IpNet::from(ip));
        let handle = format!(
            "tern-ipam-gateway.{node}.{}",
            tern_store::keys::cidr_segment(&block.to_string())
        );
        if let Some(gw) = allocs
            .iter()
            .find(|al| al.handle.as_deref() == Some(handle.as_str()) && block.contains(&al.ip))
        {
            return Ok((addr, gw.ip));
        }
        let owner = crate::owners::OwnerRecord {
            handle: handle.clone(),
            node: node.clone(),
            network: String::new(),
            container_id: String::new(),
            ifname: String::new(),
            netns: String::new(),
        };
        crate::owners::record_owner(&*self.store, &owner)
            .map_err(|e| store_err("recording the gateway owner", &e))?;
        let attrs = AllocationAttrs {
            node: node.clone(),
            ..Default::default()
        };
        // Highest addresses first: pods fill a block from the bottom.
        for candidate in block.hosts().collect::<Vec<_>>().into_iter().rev() {
            match self.ipam.assign_ip(candidate, &handle, &attrs) {
                Ok(()) => return Ok((addr, candidate)),
                Err(IpamError::AddressInUse { .. }) => continue,
                Err(e) => return Err(ipam_err(&e)),
            }
        }
        Err(err(
            code::POOL_EXHAUSTED,
            format!("block {block} has no free address for its gateway"),
        ))
    }

    /// Serves a standalone IPAM DEL; a release the store cannot take now is journaled.
    pub fn ipam_del(&self, a: Attachment) -> Response {
        let released = self.release_handles(&a).and_then(|_| {
            crate::owners::delete_owner_of(&*self.store, &self.cfg.node_name, &a)
                .map_err(IpamError::Store)
        });
        match released {
            Ok(()) => Ok(Reply::Done),
            Err(IpamError::Store(StoreError::Unavailable(e) | StoreError::Ambiguous(e))) => {
                let entry = JournalEntry {
                    attachment: a,
                    host_ifname: String::new(),
                    delegated_ipam: false,
                    source: "agent".into(),
                };
                journal::record(&self.cfg.state_dir, &entry).map_err(|je| {
                    err(
                        code::TRY_AGAIN_LATER,
                        format!("store unavailable ({e}) and journal failed: {je}"),
                    )
                })?;
                self.set_journal_dirty(true);
                Ok(Reply::Done)
            }
            Err(e) => Err(ipam_err(&e)),
        }
    }

    /// Serves a standalone IPAM CHECK.
    pub fn ipam_check(&self, a: Attachment) -> Response {
        let held = self.ips_of(&a).map_err(|e| ipam_err(&e))?;
        if held.is_empty() {
            return Err(err(
                code::CHECK_FAILED,
                format!("IPAM holds no address for handle {}", a.handle()),
            ));
        }
        Ok(Reply::Done)
    }

    /// Replays the release journal: DELs that happened while the agent or the store was down.
    pub fn replay_journal(&self, r: &mut Report) {
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
                    let deleted = self.kernel().and_then(|mut k| {
                        tern_linux::delete_pod_veth_on(&mut *k, &name, &self.cfg.interface_prefix)
                    });
                    match deleted {
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
}
