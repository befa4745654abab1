//! The operations the plugins ask for: ADD, DEL, CHECK, STATUS, GC and standalone IPAM.
//!
//! Order matters for "nothing half-created remains": ADD allocates first (cheap to undo), then
//! wires the kernel, then records the endpoint; each step undoes the earlier ones when it fails.
//! DEL tears the kernel side down first, then releases; a release the store cannot take now is
//! journaled and completed by the maintenance loop.

use crate::endpoints::Endpoint;
use crate::host::{fmt_mac, parse_mac};
use crate::server::Agent;
use ipnet::IpNet;
use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use tern_api::journal::{self, JournalEntry};
use tern_api::{
    AddRequest, Attachment, CheckRequest, DelRequest, ErrorReply, GcRequest, Interface, IpConfig,
    IpamAddRequest, IpamRequest, NetResult, Reply, Response, Route, StatusReply,
};
use tern_cni::code;
use tern_ipam::{AllocationAttrs, AssignArgs, IpamError};
use tern_linux::netns::NetNs;
use tern_linux::veth;
use tern_model::{EndpointPort, Protocol};
use tern_store::StoreError;

fn err(code: u32, msg: impl Into<String>) -> ErrorReply {
    ErrorReply {
        code,
        msg: msg.into(),
        details: String::new(),
    }
}

/// How long an ADD or DEL waits for another operation on the same interface.
const CLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn busy(host_if: &str) -> ErrorReply {
    err(
        code::TRY_AGAIN_LATER,
        format!("another operation on interface {host_if} is still running; retry"),
    )
}

fn store_err(what: &str, e: &StoreError) -> ErrorReply {
    match e {
        // A lost answer (leader change) the store could not resolve is as transient as an
        // unreachable store: "try again later" (11), never an internal error (101).
        StoreError::Unavailable(_) | StoreError::Ambiguous(_) => err(
            code::TRY_AGAIN_LATER,
            format!("{what}: the datastore is unreachable ({e}); retry when it is back"),
        ),
        // Refused by the API server's authorizer: for a moment after its restart, or until
        // the agent's ClusterRole is fixed; either way the runtime's retry can succeed.
        StoreError::Forbidden(_) => err(
            code::TRY_AGAIN_LATER,
            format!("{what}: {e}; retry once the agent's RBAC allows it"),
        ),
        _ => err(code::AGENT, format!("{what}: {e}")),
    }
}

fn ipam_err(e: &IpamError) -> ErrorReply {
    if let IpamError::Locked(_) = e {
        return err(code::TRY_AGAIN_LATER, format!("IPAM: {e}"));
    }
    if e.is_unavailable() {
        return err(
            code::TRY_AGAIN_LATER,
            format!("IPAM: the datastore is unreachable ({e}); retry when it is back"),
        );
    }
    match e {
        IpamError::Store(s) => store_err("IPAM", s),
        IpamError::PoolsExhausted { .. } | IpamError::NoPools { .. } => {
            err(code::POOL_EXHAUSTED, e.to_string())
        }
        IpamError::AddressInUse { .. } | IpamError::NotInPool { .. } => {
            err(code::ADDRESS_UNAVAILABLE, e.to_string())
        }
        _ => err(code::AGENT, format!("IPAM: {e}")),
    }
}

/// The pod-side /32 (/128) of an address.
fn host_prefix(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn attrs_of(node: &str, a: &Attachment) -> AllocationAttrs {
    let pod = a.pod.clone().unwrap_or_default();
    AllocationAttrs {
        namespace: pod.namespace,
        pod: pod.name,
        node: node.to_string(),
        container_id: a.container_id.clone(),
        ifname: a.ifname.clone(),
    }
}

impl Agent {
    /// The host-side veth name of an attachment.
    pub fn host_ifname(&self, a: &Attachment) -> String {
        let pod = a
            .pod
            .as_ref()
            .map(|p| (p.namespace.as_str(), p.name.as_str()));
        tern_linux::attachment_veth_name(
            &self.cfg.interface_prefix,
            pod,
            &a.container_id,
            &a.ifname,
        )
    }

    /// Allocates the addresses an ADD asks for; returns them and whether tern IPAM holds them.
    fn allocate(&self, a: &Attachment, req: &IpamRequest) -> Result<Vec<IpAddr>, ErrorReply> {
        let handle = a.handle();
        let attrs = attrs_of(&self.cfg.node_name, a);
        if !req.requested.is_empty() {
            let mut got = Vec::new();
            for s in &req.requested {
                let ip: IpAddr = match s.split('/').next().unwrap_or("").parse() {
                    Ok(ip) => ip,
                    Err(_) => {
                        self.release_quietly(&handle);
                        return Err(err(
                            code::INVALID_CONFIG,
                            format!("requested IP {s:?} is not an IP address"),
                        ));
                    }
                };
                if let Err(e) = self.ipam.assign_ip(ip, &handle, &attrs) {
                    self.release_quietly(&handle);
                    return Err(ipam_err(&e));
                }
                got.push(ip);
            }
            return Ok(got);
        }
        let args = AssignArgs {
            handle,
            node: self.cfg.node_name.clone(),
            attrs,
            num_v4: usize::from(req.assign_ipv4),
            num_v6: usize::from(req.assign_ipv6),
            v4_pools: req.ipv4_pools.clone(),
            v6_pools: req.ipv6_pools.clone(),
        };
        if args.num_v4 + args.num_v6 == 0 {
            return Err(err(
                code::INVALID_CONFIG,
                "ipam: both assign_ipv4 and assign_ipv6 are false",
            ));
        }
        self.ipam.auto_assign(&args).map_err(|e| ipam_err(&e))
    }

    /// The addresses of an ADD: the delegated IPAM plugin's, or allocated by tern IPAM.
    fn addresses_for(&self, a: &Attachment, req: &AddRequest) -> Result<Vec<IpAddr>, ErrorReply> {
        let Some(list) = &req.delegated_ips else {
            return self.allocate(a, &req.ipam);
        };
        list.iter()
            .map(|c| {
                c.address.parse::<IpNet>().map(|n| n.addr()).map_err(|_| {
                    err(
                        code::INVALID_CONFIG,
                        format!("delegated IPAM returned an invalid address {:?}", c.address),
                    )
                })
            })
            .collect()
    }

    /// Releases a handle after a failed ADD. A failure (the store unreachable) is only logged:
    /// the runtime DELs a failed ADD, and leak repair releases what no endpoint holds.
    fn release_quietly(&self, handle: &str) {
        if let Err(e) = self.ipam.release_by_handle(handle) {
            log::warn!("rolling back allocation of {handle}: {e}");
        }
    }

    pub(crate) fn add(&self, req: AddRequest, fd: Option<OwnedFd>) -> Response {
        let a = &req.attachment;
        let Some(fd) = fd else {
            return Err(err(
                code::INVALID_ENV,
                "CNI_NETNS: no network namespace was passed with the ADD request",
            ));
        };
        let ns = NetNs::from_fd(fd);
        if self.endpoints.get(a).is_some() {
            return Err(err(
                code::INTERFACE,
                format!(
                    "container {} already has interface {} on network {} (ADD without DEL)",
                    a.container_id, a.ifname, a.network
                ),
            ));
        }
        let host_if = self.host_ifname(a);
        // A pod re-created with the same name gets the same veth name: let an earlier DEL's
        // deferred deletion of that name finish first. Proceeding while it is still queued
        // would replace a device the queue is about to delete: "try again" instead.
        if !self
            .reaper
            .wait_gone(&host_if, std::time::Duration::from_secs(5))
        {
            return Err(err(
                code::TRY_AGAIN_LATER,
                format!("the deletion of the previous interface {host_if} is still queued; retry"),
            ));
        }
        let Some(_claim) = self.in_flight.claim(&host_if, CLAIM_WAIT) else {
            return Err(busy(&host_if));
        };
        let _handle_guard = self.in_flight_handles.hold(&a.handle());

        let t0 = std::time::Instant::now();
        let delegated = req.delegated_ips.is_some();
        let mtu = if req.mtu > 0 { req.mtu } else { self.pod_mtu() };
        let pod_mac = match req.mac.as_deref().map(parse_mac) {
            Some(Some(m)) => Some(m),
            Some(None) => {
                return Err(err(
                    code::INVALID_CONFIG,
                    format!(
                        "runtimeConfig.mac: {:?} is not a MAC address",
                        req.mac.unwrap_or_default()
                    ),
                ));
            }
            None => None,
        };
        // Checked before anything is created, so a bad port has nothing to roll back.
        let ports = endpoint_ports(&req.ports)?;
        // The pod's labels and ports from the API server (cache, or one GET): before anything
        // is created, so "try again" has nothing to roll back.
        let kube_pod = match &self.kube {
            Some(k) => k.pod_for_add(a).map_err(|e| err(e.code(), e.to_string()))?,
            None => None,
        };
        // The pod's (and namespace's) IPAM annotations: pools, fixed addresses, or addresses
        // without IPAM (`no_ipam`); refused before anything is created.
        let mut ipam_req = req.ipam.clone();
        let no_ipam = match (&self.kube, &kube_pod) {
            (Some(k), Some(pod)) => k
                .ipam_for_add(pod, &mut ipam_req, delegated)
                .map_err(|e| err(e.code(), e.to_string()))?,
            _ => None,
        };
        let mut cfg = veth::PodInterfaceConfig {
            host_ifname: &host_if,
            pod_ifname: &a.ifname,
            pod_ns: &ns,
            addresses: &[],
            mtu,
            pod_mac,
            allow_ip_forwarding: req.allow_ip_forwarding,
        };
        // Allocate first (cheap to undo), then create the veth pair, on this thread. The two
        // used to overlap on a second thread, but that thread cost more than it saved: ~0.2 ms
        // of IPAM hidden behind a spawn and a join, i.e. two cross-CPU wake-ups, which cost
        // tens of µs on an idle node and milliseconds on a busy one (docs/benchmarks.md).
        // The allocation and the endpoint record stay two store transactions, with the kernel
        // wiring between them, so each step can undo the earlier ones. Neither syncs to disk
        // on SQLite (WAL, `synchronous = NORMAL`): a killed ternd loses no commit (it is in the
        // page cache), and an OS crash or power loss can only lose the last whole commits, and
        // with them the pods they were made for, so no address is ever live twice.
        let ips = match &no_ipam {
            Some(v) => Ok(v.clone()),
            None if delegated => self.addresses_for(a, &req),
            // A refusal of what the annotations asked for names the pod.
            None => self.allocate(a, &ipam_req).map_err(|mut e| {
                if let Some(p) = kube_pod.as_ref().filter(|_| ipam_req != req.ipam) {
                    e.msg = format!(
                        "pod {}/{} (IPAM annotations): {}",
                        p.namespace, p.name, e.msg
                    );
                }
                e
            }),
        };
        let t_alloc = t0.elapsed();
        let ips = ips?;
        let created = veth::create_pod_veth(&cfg);
        let rollback = |why: ErrorReply| -> ErrorReply {
            if !delegated {
                self.release_quietly(&a.handle());
            }
            why
        };
        let link_err = |e: tern_linux::LinuxError| {
            let c = if e.is_already_exists() {
                code::INTERFACE
            } else {
                code::AGENT
            };
            err(c, e.to_string())
        };
        let pending = match created {
            Ok(p) => p,
            Err(e) => return Err(rollback(link_err(e))),
        };
        let addrs: Vec<IpNet> = ips.iter().map(|ip| host_prefix(*ip)).collect();
        cfg.addresses = &addrs;
        let t_veth = t0.elapsed();
        let mut ep = Endpoint {
            node: self.cfg.node_name.clone(),
            attachment: a.clone(),
            host_ifname: host_if.clone(),
            mac: String::new(),
            ip_networks: addrs.clone(),
            labels: crate::endpoints::workload_labels(a, &req.labels),
            ports,
            // Addresses without IPAM are, like a delegated plugin's, never released by tern.
            delegated_ipam: delegated || no_ipam.is_some(),
        };
        if let Some(pod) = &kube_pod {
            crate::kube::apply_pod(&mut ep, pod);
        }
        // Policy first: the pod has no address and the host no route to it yet, so no packet
        // can reach or leave it before its chains, map entries and set elements are in.
        if let Some(p) = &self.policy
            && let Err(e) = p.endpoint_added(crate::policy::local_endpoint(&ep))
        {
            if let Err(de) = veth::abandon_pod_veth(pending) {
                log::warn!("removing the veth of a failed ADD: {de}");
            }
            let _ = p.endpoint_removed(&ep.namespace(), &ep.name());
            return Err(rollback(err(code::AGENT, e.to_string())));
        }
        let (ep_ns, ep_name) = (ep.namespace(), ep.name());
        let unpolice = || {
            if let Some(p) = &self.policy
                && let Err(e) = p.endpoint_removed(&ep_ns, &ep_name)
            {
                log::warn!("removing the policy of a failed ADD: {e}");
            }
        };
        let iface = match veth::finish_pod_interface(&cfg, pending) {
            Ok(i) => i,
            Err(e) => {
                unpolice();
                return Err(rollback(link_err(e)));
            }
        };
        ep.mac = fmt_mac(&iface.pod_mac);
        let t_link = t0.elapsed();
        if let Err(e) = self.endpoints.put(ep.clone()) {
            if let Err(te) = veth::teardown_pod_interface(&host_if) {
                log::warn!("rolling back interface {host_if}: {te}");
            }
            unpolice();
            return Err(rollback(store_err("recording the endpoint", &e)));
        }
        if let Some(k) = &self.kube {
            k.endpoint_recorded(&ep);
        }
        let steps = [
            t_alloc,
            t_veth - t_alloc,
            t_link - t_veth,
            t0.elapsed() - t_link,
        ];
        // The same steps in whole microseconds at the end, for readers (tern-bench's split) that
        // should not parse `Duration`'s `Debug` text.
        log::debug!(
            "ADD {}: allocate {:?}, create veth {:?}, policy+configure {:?}, endpoint {:?} (us: {} {} {} {})",
            a.container_id,
            steps[0],
            steps[1],
            steps[2],
            steps[3],
            steps[0].as_micros(),
            steps[1].as_micros(),
            steps[2].as_micros(),
            steps[3].as_micros()
        );
        let mut result = NetResult {
            interfaces: vec![
                Interface {
                    name: host_if,
                    mac: fmt_mac(&iface.host_mac),
                    sandbox: String::new(),
                    mtu: None,
                },
                Interface {
                    name: a.ifname.clone(),
                    mac: fmt_mac(&iface.pod_mac),
                    sandbox: a.netns_path.clone(),
                    mtu: Some(iface.mtu),
                },
            ],
            ips: Vec::new(),
            routes: Vec::new(),
        };
        let (mut v4, mut v6) = (false, false);
        for n in &addrs {
            result.ips.push(IpConfig {
                address: n.to_string(),
                gateway: None,
                interface: Some(1),
            });
            match n {
                IpNet::V4(_) => v4 = true,
                IpNet::V6(_) => v6 = true,
            }
        }
        if v4 {
            result.routes.push(Route {
                dst: "0.0.0.0/0".into(),
                gw: None,
            });
        }
        if v6 {
            result.routes.push(Route {
                dst: "::/0".into(),
                gw: None,
            });
        }
        Ok(Reply::Result(result))
    }

    pub(crate) fn del(&self, req: DelRequest) -> Response {
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
                        self.journal_dirty
                            .store(true, std::sync::atomic::Ordering::Relaxed);
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
    pub(crate) fn release_attachment(&self, a: &Attachment, delegated: bool) -> Result<(), String> {
        if !delegated {
            self.release_handles(a).map_err(|e| e.to_string())?;
        }
        self.endpoints.remove(a).map_err(|e| e.to_string())
    }

    /// The attachment's handle in the form written before handles were unambiguous, when the
    /// store still holds addresses under it that were allocated for this very attachment
    /// (same container ID and interface): a pod added before the upgrade. A legacy handle
    /// shared with another attachment is never returned.
    pub(crate) fn legacy_handle_of(&self, a: &Attachment) -> Result<Option<String>, IpamError> {
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
    fn release_handles(&self, a: &Attachment) -> Result<Option<String>, IpamError> {
        self.ipam.release_by_handle(&a.handle())?;
        let legacy = self.legacy_handle_of(a)?;
        if let Some(l) = &legacy {
            self.ipam.release_by_handle(l)?;
        }
        Ok(legacy)
    }

    /// The addresses IPAM holds for the attachment, under either handle form.
    fn ips_of(&self, a: &Attachment) -> Result<Vec<IpAddr>, IpamError> {
        let mut held = self.ipam.ips_by_handle(&a.handle())?;
        if let Some(l) = self.legacy_handle_of(a)? {
            held.extend(self.ipam.ips_by_handle(&l)?);
        }
        Ok(held)
    }

    pub(crate) fn check(&self, req: CheckRequest, fd: Option<OwnedFd>) -> Response {
        let a = &req.attachment;
        let Some(ep) = self.endpoints.get(a) else {
            return Err(err(
                code::CHECK_FAILED,
                format!(
                    "ternd has no endpoint for container {} interface {} on network {}",
                    a.container_id, a.ifname, a.network
                ),
            ));
        };
        let Some(fd) = fd else {
            return Err(err(
                code::INVALID_ENV,
                "CNI_NETNS: no network namespace was passed with the CHECK request",
            ));
        };
        let ns = NetNs::from_fd(fd);
        let addrs = &ep.ip_networks;
        if let Err(e) = veth::check_pod_interface(&ep.host_ifname, &a.ifname, &ns, addrs) {
            return Err(err(code::CHECK_FAILED, e.to_string()));
        }
        if let Some(prev) = &req.prev_result {
            for ip in &prev.ips {
                let Ok(n) = ip.address.parse::<IpNet>() else {
                    continue;
                };
                if !addrs.iter().any(|x| x.addr() == n.addr()) {
                    return Err(err(
                        code::CHECK_FAILED,
                        format!(
                            "address {} of the previous result is not on the endpoint",
                            ip.address
                        ),
                    ));
                }
            }
        }
        if !ep.delegated_ipam {
            let held = self.ips_of(a).map_err(|e| ipam_err(&e))?;
            for n in addrs {
                if !held.contains(&n.addr()) {
                    return Err(err(
                        code::CHECK_FAILED,
                        format!(
                            "address {} is not allocated to handle {} in IPAM",
                            n.addr(),
                            a.handle()
                        ),
                    ));
                }
            }
        }
        Ok(Reply::Done)
    }

    pub(crate) fn status(&self) -> Response {
        if let Some(k) = &self.kube
            && let Err(e) = k.readiness()
        {
            return Err(err(code::NOT_AVAILABLE, format!("ternd is not ready: {e}")));
        }
        if let Err(e) = self.store.revision() {
            return Err(err(
                code::NOT_AVAILABLE,
                format!("ternd cannot reach the datastore: {e}"),
            ));
        }
        let pools = self.ipam.usable_pools(&self.cfg.node_name).map_err(|e| {
            err(
                code::NOT_AVAILABLE,
                format!("ternd cannot read IP pools: {e}"),
            )
        })?;
        if pools.is_empty() {
            return Err(err(
                code::NOT_AVAILABLE,
                format!(
                    "no IP pool is usable for workloads on node {}",
                    self.cfg.node_name
                ),
            ));
        }
        Ok(Reply::Status(StatusReply {
            node: self.cfg.node_name.clone(),
            store_ok: true,
            usable_pools: pools,
            endpoints: self.endpoints.len(),
        }))
    }

    pub(crate) fn gc(&self, req: GcRequest) -> Response {
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
            match tern_linux::delete_pod_veth(&ep.host_ifname, &self.cfg.interface_prefix) {
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

    pub(crate) fn ipam_add(&self, req: IpamAddRequest) -> Response {
        let a = &req.attachment;
        let _handle_guard = self.in_flight_handles.hold(&a.handle());
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
        let ips = match self.allocate(a, &req.ipam) {
            Ok(ips) => ips,
            Err(e) => {
                if let Err(de) =
                    crate::owners::delete_owner(&*self.store, &self.cfg.node_name, &a.handle())
                {
                    log::warn!("removing owner record of {}: {de}", a.handle());
                }
                return Err(e);
            }
        };
        // Main plugins such as the reference ptp expect a subnet-style result: the address with
        // its block's prefix and an on-link gateway inside that block. Each block served this way
        // gets one gateway address of its own, allocated like a pod address and never released
        // automatically (as host-local keeps its gateway out of its range).
        let mut result = NetResult::default();
        for ip in ips {
            let (addr, gw) = match self.block_gateway(ip) {
                Ok(x) => x,
                Err(e) => {
                    self.release_quietly(&a.handle());
                    return Err(e);
                }
            };
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
        let addr = IpNet::new(ip, block.prefix_len()).unwrap_or_else(|_| host_prefix(ip));
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

    pub(crate) fn ipam_del(&self, a: Attachment) -> Response {
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
                self.journal_dirty
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(Reply::Done)
            }
            Err(e) => Err(ipam_err(&e)),
        }
    }

    pub(crate) fn ipam_check(&self, a: Attachment) -> Response {
        let held = self.ips_of(&a).map_err(|e| ipam_err(&e))?;
        if held.is_empty() {
            return Err(err(
                code::CHECK_FAILED,
                format!("IPAM holds no address for handle {}", a.handle()),
            ));
        }
        Ok(Reply::Done)
    }
}

/// The named ports of an ADD as the WorkloadEndpoint stores them. The plugin validates
/// `args.cni.ports` already; this guards against other clients of the socket, with code 7
/// naming the field.
pub fn endpoint_ports(ports: &[tern_api::NamedPort]) -> Result<Vec<EndpointPort>, ErrorReply> {
    let mut out: Vec<EndpointPort> = Vec::with_capacity(ports.len());
    for (i, p) in ports.iter().enumerate() {
        let bad = |field: &str, why: String| {
            err(
                code::INVALID_CONFIG,
                format!("args.cni.ports[{i}].{field}: {why}"),
            )
        };
        tern_model::validate_port_name(&p.name).map_err(|e| bad("name", e))?;
        if p.port == 0 {
            return Err(bad("containerPort", "0 is not a port (1-65535)".into()));
        }
        let protocol = match p.protocol.to_ascii_uppercase().as_str() {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            _ => {
                return Err(bad(
                    "protocol",
                    format!("{:?} is not TCP, UDP or SCTP", p.protocol),
                ));
            }
        };
        if let Some(j) = out.iter().position(|q| q.name == p.name) {
            return Err(bad(
                "name",
                format!("{:?} is already the name of args.cni.ports[{j}]", p.name),
            ));
        }
        out.push(EndpointPort {
            name: p.name.clone(),
            protocol,
            port: p.port,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::port;

    /// An unreachable store, a lost answer and an authorizer's refusal are "try again" (11)
    /// to the runtime; anything else is an internal error (101).
    #[test]
    fn store_errors_map_to_cni_codes() {
        let code = |e: StoreError| store_err("IPAM", &e).code;
        assert_eq!(
            code(StoreError::Unavailable("down".into())),
            code::TRY_AGAIN_LATER
        );
        assert_eq!(
            code(StoreError::Ambiguous("lost".into())),
            code::TRY_AGAIN_LATER
        );
        let forbidden = StoreError::Forbidden("list ippools.tern.dev: forbidden".into());
        let r = store_err("IPAM", &forbidden);
        assert_eq!(r.code, code::TRY_AGAIN_LATER);
        assert!(
            r.msg.contains("ippools.tern.dev") && r.msg.contains("RBAC"),
            "{}",
            r.msg
        );
        assert_eq!(code(StoreError::Backend("bad".into())), code::AGENT);
    }

    #[test]
    fn endpoint_ports_convert_and_reject_bad_ones() {
        let np = |name: &str, port: u16, protocol: &str| tern_api::NamedPort {
            name: name.into(),
            port,
            protocol: protocol.into(),
        };
        let got = endpoint_ports(&[np("http", 8080, "TCP"), np("dns", 53, "udp")]).unwrap();
        assert_eq!(
            got,
            vec![
                port("http", 8080, Protocol::Tcp),
                port("dns", 53, Protocol::Udp)
            ]
        );
        for (ports, want) in [
            (vec![np("Bad", 1, "TCP")], "args.cni.ports[0].name"),
            (
                vec![np("a", 1, "TCP"), np("b", 0, "TCP")],
                "args.cni.ports[1].containerPort: 0 is not a port",
            ),
            (vec![np("a", 1, "ICMP")], "args.cni.ports[0].protocol"),
            (
                vec![np("a", 1, "TCP"), np("a", 2, "UDP")],
                "args.cni.ports[1].name: \"a\" is already",
            ),
        ] {
            let e = endpoint_ports(&ports).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(want), "{} does not contain {want}", e.msg);
        }
    }
}
