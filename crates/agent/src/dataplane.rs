//! The dataplane reconciler: node registration, routes to remote blocks, the VXLAN / IPIP
//! tunnels and natOutgoing, computed from a store snapshot ([`crate::routes::compute`]) and
//! diffed against the kernel of the namespace the caller runs in.
//!
//! Triggers: start-up, a store watch on `/tern/v1/` (debounced, so an event reaches the kernel
//! within ~100 ms), and the periodic resync. Only tern-owned state is ever removed: routes with
//! protocol 84 in the main table that do not go out of a tern veth (those are the endpoint
//! code's per-pod routes), neighbour / FDB entries on `vxlan.tern` and `vxlan-v6.tern` (the
//! IPv6 pools' VXLAN device over the IPv6 underlay), and tern's own BGP routes
//! (protocol 85) once no speaker routes them (`Dataplane::adopt_bgp_routes`: the switch from
//! BGP to VXLAN, or ternd restarted without `--bgp`).

pub mod node;
#[cfg(test)]
mod tests;

use crate::mtu;
use crate::nat::NatTable;
use crate::routes::{
    self, Desired, IPIP_DEVICE, Target, VXLAN_DEVICE, VXLAN_PORT, VXLAN_V6_DEVICE, VXLAN_VNI, Vtep,
};
use crate::snapshot::{NodeInfo, PoolInfo, Snapshot, load_snapshot, reconciler_owns};
use ipnet::IpNet;
use node::{Liveness, NodeError, Registration};
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_ipam::Ipam;
use tern_linux::kernel::{Netlink, NftApply, SystemNft};
use tern_linux::netlink::{Handle, MAIN_TABLE, Route, RouteKind, Scope};
use tern_linux::{TERN_BGP_ROUTE_PROTOCOL, TERN_ROUTE_PROTOCOL};
use tern_model::Kind;
use tern_store::{Store, keys};

/// Settings of the dataplane reconciler.
#[derive(Debug, Clone)]
pub struct DataplaneConfig {
    /// This node's name.
    pub node_name: String,
    /// Underlay address (`--node-ip`); None = the default-route interface's addresses.
    pub node_ip: Option<IpAddr>,
    /// The IPv6 underlay address next to an IPv4 `node_ip` (dual stack), registered with it.
    pub node_ip6: Option<IpAddr>,
    /// Host veth prefix: proto-84 routes out of such interfaces belong to the endpoint code.
    pub interface_prefix: String,
    /// Pod MTU forced by configuration (0 = computed).
    pub mtu: u32,
}

/// What the last sync did and what is wrong (surfaced by readiness and logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Routes installed or replaced.
    pub routes_set: usize,
    /// Routes removed.
    pub routes_removed: usize,
    /// Neighbour / FDB entries installed or removed.
    pub vtep_changes: usize,
    /// Problems; the rest of the dataplane was still applied.
    pub errors: Vec<String>,
}

/// The reconciler of one node.
pub struct Dataplane {
    cfg: DataplaneConfig,
    store: Arc<dyn Store>,
    ipam: Ipam,
    liveness: Liveness,
    last: Mutex<SyncReport>,
    pod_mtu: AtomicU64,
    syncs: AtomicU64,
    lock: Mutex<()>,
    /// The natOutgoing changes last applied successfully: event-driven syncs skip the kernel
    /// when unchanged.
    nat_applied: Mutex<Option<Vec<tern_nft::TableChange>>>,
    /// When set, natOutgoing is rendered with the policy chains in one table (the policy
    /// engine, attached by the root) instead of by its own changes.
    policy: Mutex<Option<Arc<dyn NatTable>>>,
    /// BGP routes the unencapsulated pools ([`Dataplane::set_bgp_routing`]).
    bgp: AtomicBool,
    /// Route the nodes' podCIDRs ([`Dataplane::set_pod_cidr_routing`]).
    pod_cidr: AtomicBool,
    /// Where this node's endpoint records are when not in `store`
    /// ([`Dataplane::set_endpoint_store`]).
    endpoint_store: std::sync::OnceLock<Arc<dyn Store>>,
}

impl Dataplane {
    /// A reconciler for `cfg.node_name` over `store`. Validates `--node-ip` at once: an
    /// address that is not on a local interface is an error (the agent refuses to start).
    pub fn new(cfg: DataplaneConfig, store: Arc<dyn Store>) -> Result<Dataplane, NodeError> {
        for ip in cfg.node_ip.iter().chain(&cfg.node_ip6) {
            crate::host::local_address(*ip)?;
        }
        Ok(Dataplane {
            ipam: Ipam::new(store.clone()),
            store,
            liveness: Liveness::new(Duration::from_secs(60)),
            last: Mutex::new(SyncReport::default()),
            pod_mtu: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            lock: Mutex::new(()),
            nat_applied: Mutex::new(None),
            policy: Mutex::new(None),
            bgp: AtomicBool::new(false),
            pod_cidr: AtomicBool::new(false),
            endpoint_store: std::sync::OnceLock::new(),
            cfg,
        })
    }

    /// The pod MTU computed by the last sync (0 before the first).
    pub fn pod_mtu(&self) -> u32 {
        self.pod_mtu.load(Ordering::Relaxed) as u32
    }

    /// With BGP on, direct routes to other nodes' blocks (unencapsulated pools) are left to
    /// the BGP speaker ([`crate::bgp`]); VXLAN / IPIP routes and own blackholes stay here.
    pub fn set_bgp_routing(&self, on: bool) {
        self.bgp.store(on, Ordering::Relaxed);
    }

    /// `--use-pod-cidr`: route every other node's Kubernetes podCIDRs (Node `spec.podCIDRs`) to
    /// it like a block affine to it, and blackhole this node's own ([`crate::routes::compute`]).
    pub fn set_pod_cidr_routing(&self, on: bool) {
        self.pod_cidr.store(on, Ordering::Relaxed);
    }

    /// The store of this node's endpoint records when it is not the datastore
    /// ([`crate::endpoints::open_store`]); set once, before the first sync.
    pub fn set_endpoint_store(&self, store: Arc<dyn Store>) {
        let _ = self.endpoint_store.set(store);
    }

    /// Number of completed syncs.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// The report of the last sync.
    pub fn last_report(&self) -> SyncReport {
        self.last.lock().unwrap().clone()
    }

    /// Keeps the node's liveness lease alive (maintenance loop).
    pub fn keepalive(&self) -> Result<(), NodeError> {
        self.liveness.keepalive(&*self.store, &self.cfg.node_name)
    }

    /// Revokes the liveness lease.
    pub fn revoke(&self) {
        self.liveness.revoke(&*self.store);
    }

    /// The node's underlay addresses: `--node-ip` (one, or one of each family, with their
    /// interface prefixes) or the default-route interface's addresses.
    fn underlay(&self) -> Result<Vec<IpNet>, NodeError> {
        match self.cfg.node_ip {
            Some(ip) => std::iter::once(ip)
                .chain(self.cfg.node_ip6)
                .map(|ip| Ok(crate::host::local_address(ip)?))
                .collect(),
            None => Ok(crate::host::node_addresses()),
        }
    }

    /// Registers the node (addresses, tunnel addresses, MTU); returns the registration.
    pub fn register(&self, snap: &Snapshot) -> Result<Registration, NodeError> {
        let me = &self.cfg.node_name;
        let addresses = self.underlay()?;
        let v4 = addresses.iter().find(|a| a.addr().is_ipv4()).copied();
        let tunnel = |t: node::Tunnel| {
            node::ensure_tunnel_address(&self.ipam, me, &t.handle(me), &t.pools(&snap.pools))
        };
        let vxlan_tunnel_addr = tunnel(node::Tunnel::Vxlan)?;
        let vxlan_tunnel_addr_v6 = tunnel(node::Tunnel::VxlanV6)?;
        let ipip_tunnel_addr = tunnel(node::Tunnel::Ipip)?;
        let primary = v4.or(addresses.first().copied()).map(|a| a.addr());
        let pod_mtu = if self.cfg.mtu > 0 {
            self.cfg.mtu
        } else {
            let enabled: Vec<PoolInfo> =
                snap.pools.iter().filter(|p| !p.disabled).cloned().collect();
            let underlay_mtu = match Handle::new() {
                Ok(mut h) => underlay_mtu(&mut h, primary),
                Err(_) => crate::host::detect_mtu(),
            };
            mtu::pod_mtu(underlay_mtu, &enabled, primary.is_some_and(|a| a.is_ipv6()))
        };
        let reg = Registration {
            addresses,
            vxlan_tunnel_addr,
            vxlan_tunnel_addr_v6,
            ipip_tunnel_addr,
            pod_mtu,
        };
        let others = node::write_node(&*self.store, me, &reg)?;
        let prev = self.pod_mtu.swap(pod_mtu as u64, Ordering::Relaxed) as u32;
        let differ = mtu::disagreeing(pod_mtu, others.iter().map(|(n, m)| (n.as_str(), *m)));
        if !differ.is_empty() && prev != pod_mtu {
            log::warn!("pod MTU {pod_mtu} of node {me} differs from other nodes: {differ:?}");
        }
        Ok(reg)
    }

    /// One full pass: snapshot → register → desired state → kernel. Never panics on bad input;
    /// problems end up in the report (and the previous state of what failed is kept).
    pub fn sync(&self) -> SyncReport {
        self.sync_with(true)
    }

    /// As [`Dataplane::sync`]; `full == false` (watch events) skips re-applying an unchanged
    /// nftables ruleset.
    fn sync_with(&self, full: bool) -> SyncReport {
        let _serial = self.lock.lock().unwrap();
        let mut r = SyncReport::default();
        let mut snap = match load_snapshot(&*self.store) {
            Ok(s) => s,
            Err(e) => {
                r.errors.push(e);
                return self.finish(r);
            }
        };
        r.errors.append(&mut snap.errors);
        snap.use_pod_cidr = self.pod_cidr.load(Ordering::Relaxed);
        match self.register(&snap) {
            Ok(_) => {
                // Registration may have changed our own Node: re-read it for the VTEP.
                if let Ok(s2) = load_snapshot(&*self.store) {
                    snap.nodes = s2.nodes;
                    snap.blocks = s2.blocks;
                    snap.pod_cidrs = s2.pod_cidrs;
                }
            }
            Err(e) => r.errors.push(format!("registering node: {e}")),
        }
        let subnets = match crate::host::local_subnets() {
            Ok(s) => s,
            Err(e) => {
                r.errors.push(e.to_string());
                Vec::new()
            }
        };
        let desired = self.desired(&snap, &subnets);
        r.errors.extend(desired.errors.iter().cloned());
        let mut h = match Handle::new() {
            Ok(h) => h,
            Err(e) => {
                r.errors.push(format!("netlink: {e}"));
                return self.finish(r);
            }
        };
        self.apply_desired(&mut h, &mut SystemNft, &snap, &desired, full, &mut r);
        self.finish(r)
    }

    /// The kernel half of a pass, through the kernel seam (one rtnetlink handle, nftables):
    /// tunnels and their neighbours, routes, natOutgoing. What fails is reported in `r` and
    /// left for the next pass, which plans it again from what the kernel then holds.
    fn apply_desired(
        &self,
        k: &mut dyn Netlink,
        nft: &mut dyn NftApply,
        snap: &Snapshot,
        desired: &Desired,
        full: bool,
        r: &mut SyncReport,
    ) {
        let me = snap.nodes.iter().find(|n| n.name == self.cfg.node_name);
        let vxlan_idx = self.sync_vxlan(k, VxlanDev::V4, desired, me, r);
        let vxlan6_idx = self.sync_vxlan(k, VxlanDev::V6, desired, me, r);
        let ipip_idx = self.sync_ipip(k, desired, r);
        let tunnels = [vxlan_idx, ipip_idx, vxlan6_idx];
        self.sync_routes(k, desired, snap, tunnels, r);
        self.sync_nat(nft, &snap.pools, full, r);
    }

    /// natOutgoing: through the attached policy engine's table, or as its own changes,
    /// skipped (`full == false`) when they equal the last ones applied. A failure forgets
    /// what was applied, so the next pass applies them again whatever triggers it.
    fn sync_nat(&self, nft: &mut dyn NftApply, pools: &[PoolInfo], full: bool, r: &mut SyncReport) {
        let policy = self.policy.lock().unwrap().clone();
        if let Some(engine) = policy {
            if let Err(e) = engine.replace_nat(crate::nat::chains(pools)) {
                r.errors.push(format!("natOutgoing: {e}"));
            }
            return;
        }
        let changes = crate::nat::changes(pools);
        let mut applied = self.nat_applied.lock().unwrap();
        if full || applied.as_ref() != Some(&changes) {
            match crate::nat::apply(nft, &changes) {
                Ok(()) => *applied = Some(changes),
                Err(e) => {
                    *applied = None;
                    r.errors
                        .push(format!("natOutgoing (nftables table inet tern): {e}"));
                }
            }
        }
    }

    /// The desired state of this node from `snap`: with BGP on, without the direct routes
    /// the speaker installs.
    fn desired(&self, snap: &Snapshot, local_subnets: &[IpNet]) -> Desired {
        let mut desired = routes::compute(snap, &self.cfg.node_name, local_subnets);
        if self.bgp.load(Ordering::Relaxed) {
            desired.routes.retain(|dst, t| {
                !matches!(t, Target::Direct(_)) || reconciler_owns(&snap.pools, dst)
            });
        }
        desired
    }

    /// Hands natOutgoing to the policy engine (or any [`NatTable`]): from now on both share
    /// every transaction.
    pub fn attach_policy(&self, engine: Arc<dyn NatTable>) {
        *self.policy.lock().unwrap() = Some(engine);
    }

    fn finish(&self, r: SyncReport) -> SyncReport {
        let prev = std::mem::replace(&mut *self.last.lock().unwrap(), r.clone());
        for e in &r.errors {
            if !prev.errors.contains(e) {
                log::warn!("dataplane: {e}");
            }
        }
        if r.routes_set + r.routes_removed + r.vtep_changes > 0 {
            log::info!(
                "dataplane: {} routes set, {} removed, {} VTEP entries changed",
                r.routes_set,
                r.routes_removed,
                r.vtep_changes
            );
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// Ensures the VXLAN device `dev` (`vxlan.tern` when some IPv4 pool uses VXLAN,
    /// `vxlan-v6.tern` when some IPv6 pool does, and this node has its tunnel address of that
    /// family and an underlay address of that family) with its permanent neighbours (ARP or
    /// NDP) and FDB entries; removes it otherwise. Returns its index.
    fn sync_vxlan(
        &self,
        k: &mut dyn Netlink,
        dev: VxlanDev,
        d: &Desired,
        me: Option<&NodeInfo>,
        r: &mut SyncReport,
    ) -> Option<u32> {
        let devices = match k.vxlan_devices() {
            Ok(v) => v,
            Err(e) => {
                r.errors.push(format!("listing VXLAN devices: {e}"));
                return None;
            }
        };
        let name = dev.name;
        let ours = devices.iter().find(|v| v.name == name);
        let want = me.and_then(|n| {
            let tip = dev.tunnel_addr(n)?;
            let local = n.address_like(&tip)?.addr();
            Some((tip, local))
        });
        let Some((tip, local)) = want.filter(|_| dev.wanted(d)) else {
            if let Some(v) = ours {
                match k.delete_link(&v.name) {
                    Ok(_) => log::info!("removed {name}: no IPv{} pool uses VXLAN", dev.family()),
                    Err(e) => r.errors.push(format!("removing {name}: {e}")),
                }
            }
            if dev.wanted(d) {
                r.errors.push(format!(
                    "{name} not created: node {} has no IPv{fam} VXLAN tunnel address or IPv{fam} underlay address yet",
                    self.cfg.node_name,
                    fam = dev.family()
                ));
            }
            return None;
        };
        // The kernel refuses a second device of a VNI and port only within one family
        // (a device without a local address is IPv4): `vxlan.tern` and `vxlan-v6.tern` share
        // both.
        if let Some(other) = devices.iter().find(|v| {
            v.name != name
                && v.vni == Some(VXLAN_VNI)
                && v.port == Some(VXLAN_PORT)
                && v.local.is_some_and(|l| l.is_ipv6()) == dev.v6
        }) {
            r.errors.push(format!(
                "cannot create {name}: VNI {VXLAN_VNI} on UDP port {VXLAN_PORT} is already used by device {}",
                other.name
            ));
            return None;
        }
        let mac = dev.mac(&self.cfg.node_name);
        let mtu = underlay_mtu(k, Some(local)).saturating_sub(dev.overhead());
        let stale = ours.is_some_and(|v| {
            v.vni != Some(VXLAN_VNI) || v.port != Some(VXLAN_PORT) || v.local != Some(local)
        });
        if stale {
            log::info!("re-creating {name}: VNI, port or local address changed");
            let _ = k.delete_link(name);
        }
        if ours.is_none() || stale {
            if let Err(e) = k.create_vxlan(name, VXLAN_VNI, local, None, VXLAN_PORT) {
                r.errors.push(format!(
                    "cannot create {name} (VNI {VXLAN_VNI}, UDP port {VXLAN_PORT}, local {local}): {e}"
                ));
                return None;
            }
            log::info!("created {name} (VNI {VXLAN_VNI}, port {VXLAN_PORT}, local {local})");
        }
        let link = match k.link_by_name(name) {
            Ok(Some(l)) => l,
            Ok(None) => {
                r.errors.push(format!("{name} vanished"));
                return None;
            }
            Err(e) => {
                r.errors.push(format!("reading {name}: {e}"));
                return None;
            }
        };
        let idx = link.index;
        let mut step = |res: tern_linux::Result<()>, what: &str| {
            if let Err(e) = res {
                r.errors.push(format!("{name}: {what}: {e}"));
            }
        };
        if link.mac != Some(mac) {
            step(k.set_mac(idx, mac), "setting the VTEP MAC");
        }
        if link.mtu != mtu && mtu > 0 {
            step(k.set_mtu(idx, mtu), "setting the MTU");
        }
        let want_addr = IpNet::from(tip);
        match k.addresses(Some(idx)) {
            Ok(addrs) => {
                if !addrs.iter().any(|(_, a)| *a == want_addr) {
                    step(k.add_address(idx, want_addr), "adding the tunnel address");
                }
            }
            Err(e) => step(Err(e), "listing addresses"),
        }
        if !link.up
            && let Err(e) = k.set_link_up(idx)
        {
            r.errors.push(format!(
                "cannot bring {name} up (is UDP port {VXLAN_PORT} used by another socket or device?): {e}"
            ));
            return None;
        }
        let vteps: std::collections::BTreeSet<Vtep> = d
            .vteps
            .iter()
            .filter(|v| v.tunnel_ip.is_ipv6() == dev.v6)
            .cloned()
            .collect();
        self.sync_vteps(k, dev, idx, &vteps, r);
        Some(idx)
    }

    /// The permanent neighbours and FDB entries of `want` (the VTEPs of `dev`'s family) on
    /// `dev`; other entries with a remote address are removed. The kernel's own neighbours of
    /// the device (IPv6 link-local and multicast) are left alone.
    fn sync_vteps(
        &self,
        k: &mut dyn Netlink,
        dev: VxlanDev,
        idx: u32,
        want: &std::collections::BTreeSet<Vtep>,
        r: &mut SyncReport,
    ) {
        // Neighbours: tunnel IP -> MAC (permanent).
        match k.neighbours(Some(idx)) {
            Ok(have) => {
                for v in want {
                    let ok = have.iter().any(|n| {
                        n.ip == v.tunnel_ip && n.mac == Some(v.mac) && n.state & 0x80 != 0
                    });
                    if !ok {
                        match k.add_neighbour(idx, v.tunnel_ip, v.mac) {
                            Ok(()) => r.vtep_changes += 1,
                            Err(e) => r.errors.push(format!("neighbour of {}: {e}", v.node)),
                        }
                    }
                }
                for n in have.into_iter().filter(|n| !kernel_neighbour(&n.ip)) {
                    if !want.iter().any(|v| v.tunnel_ip == n.ip) {
                        match k.delete_neighbour(idx, n.ip) {
                            Ok(_) => r.vtep_changes += 1,
                            Err(e) => r.errors.push(format!("removing neighbour {}: {e}", n.ip)),
                        }
                    }
                }
            }
            Err(e) => r
                .errors
                .push(format!("listing neighbours of {}: {e}", dev.name)),
        }
        // FDB: MAC -> remote underlay address.
        match k.fdb(idx) {
            Ok(have) => {
                for v in want {
                    if !have
                        .iter()
                        .any(|f| f.mac == v.mac && f.dst == Some(v.underlay))
                    {
                        match k.add_fdb(idx, v.mac, v.underlay) {
                            Ok(()) => r.vtep_changes += 1,
                            Err(e) => r.errors.push(format!("FDB entry of {}: {e}", v.node)),
                        }
                    }
                }
                for f in have {
                    let Some(dst) = f.dst else { continue };
                    if !want.iter().any(|v| v.mac == f.mac && v.underlay == dst) {
                        match k.delete_fdb(idx, f.mac, dst) {
                            Ok(_) => r.vtep_changes += 1,
                            Err(e) => r.errors.push(format!("removing FDB entry: {e}")),
                        }
                    }
                }
            }
            Err(e) => r.errors.push(format!("listing FDB of {}: {e}", dev.name)),
        }
    }

    /// Ensures `tunl0` is up when some pool uses IPIP; reports kernels without IPIP support.
    fn sync_ipip(&self, k: &mut dyn Netlink, d: &Desired, r: &mut SyncReport) -> Option<u32> {
        if !d.ipip {
            return None;
        }
        let link = match k.link_by_name(IPIP_DEVICE) {
            Ok(Some(l)) => l,
            Ok(None) => match k.create_ipip(IPIP_DEVICE, None) {
                Ok(()) => match k.link_by_name(IPIP_DEVICE) {
                    Ok(Some(l)) => l,
                    _ => {
                        r.errors
                            .push(format!("{IPIP_DEVICE} vanished after creation"));
                        return None;
                    }
                },
                Err(e) if e.is_unsupported() => {
                    r.errors.push(format!(
                        "IPIP not supported by this kernel (cannot create {IPIP_DEVICE}: {e}); IPIP routes not installed"
                    ));
                    return None;
                }
                Err(e) => {
                    r.errors.push(format!("cannot create {IPIP_DEVICE}: {e}"));
                    return None;
                }
            },
            Err(e) => {
                r.errors.push(format!("reading {IPIP_DEVICE}: {e}"));
                return None;
            }
        };
        if !link.up
            && let Err(e) = k.set_link_up(link.index)
        {
            r.errors.push(format!("cannot bring {IPIP_DEVICE} up: {e}"));
        }
        Some(link.index)
    }

    /// Applies [`crate::routes::plan::plan`] for the desired routes: the kernel work is this
    /// loop; which routes to add, replace or delete (and which are foreign) is decided purely.
    fn sync_routes(
        &self,
        k: &mut dyn Netlink,
        d: &Desired,
        snap: &Snapshot,
        [vxlan, ipip, vxlan6]: [Option<u32>; 3],
        r: &mut SyncReport,
    ) {
        use crate::routes::plan::{self, RouteOp};
        let want = plan::kernel_routes(d, vxlan, ipip, vxlan6);
        let links: Vec<_> = match k.links() {
            Ok(l) => l
                .into_iter()
                .filter(|l| {
                    l.kind.as_deref() == Some("veth")
                        && l.name.starts_with(&self.cfg.interface_prefix)
                })
                .collect(),
            Err(e) => {
                r.errors.push(format!("listing links: {e}"));
                return;
            }
        };
        let veths: HashSet<u32> = links.iter().map(|l| l.index).collect();
        self.sync_pod_routes(k, &links, r);
        let mut have = Vec::new();
        for v6 in [false, true] {
            match k.routes_full(v6, MAIN_TABLE) {
                Ok(rs) => have.extend(rs),
                Err(e) => {
                    r.errors.push(format!("listing routes: {e}"));
                    return;
                }
            }
        }
        let have = self.adopt_bgp_routes(k, &want, have, snap, r);
        let done = plan::apply(k, plan::plan(&want, &have, &veths), plan::AddMode::Replace);
        r.routes_set += done.set.len();
        r.routes_removed += done.removed.len();
        for (want, foreign) in done.blocked {
            r.errors.push(format!(
                "route {} not installed: the kernel has a route for it with protocol {} that tern does not own",
                want.dst, foreign.protocol
            ));
        }
        for (op, e) in done.failed {
            r.errors.push(match op {
                RouteOp::Delete(x) => format!("removing route {}: {e}", x.dst),
                RouteOp::Add(w)
                | RouteOp::Replace { new: w, .. }
                | RouteOp::Blocked { want: w, .. } => {
                    format!("route {}: {e}", w.dst)
                }
            });
        }
    }

    /// Takes over the proto-85 routes of tern's BGP speaker that no speaker routes any more:
    /// all of them when ternd runs without `--bgp` (left in the kernel by an agent that ran
    /// with it, for graceful restart: after a switch from BGP to VXLAN they would otherwise
    /// stay for good, foreign to [`plan::owned`](crate::routes::plan::owned), and block the
    /// tunnel routes), and with `--bgp` those inside pools that encapsulate (a pool switched to
    /// VXLAN or IPIP: [`reconciler_owns`]). Each is replaced in place by the reconciler's route
    /// for its destination (`NLM_F_REPLACE` keeps the destination routed throughout); kept
    /// while its destination is another node's block the reconciler cannot route yet (that
    /// node's VTEP not registered: the old route still carries its traffic meanwhile); deleted
    /// otherwise. Returns `have` with the replaced routes as the reconciler's own and the
    /// deleted ones gone, for [`crate::routes::plan::plan`].
    fn adopt_bgp_routes(
        &self,
        k: &mut dyn Netlink,
        want: &[Route],
        have: Vec<Route>,
        snap: &Snapshot,
        r: &mut SyncReport,
    ) -> Vec<Route> {
        let bgp = self.bgp.load(Ordering::Relaxed);
        let me = self.cfg.node_name.as_str();
        let mut out = Vec::with_capacity(have.len());
        for x in have {
            let adopt = x.protocol == TERN_BGP_ROUTE_PROTOCOL
                && x.table == MAIN_TABLE
                && (!bgp || reconciler_owns(&snap.pools, &x.dst));
            if !adopt {
                out.push(x);
                continue;
            }
            match want.iter().find(|w| w.dst == x.dst) {
                Some(w) if w.kind == x.kind => match k.replace_route_full(w) {
                    Ok(()) => {
                        log::info!(
                            "took over the BGP route {} (via {:?}): the reconciler's now (via {:?})",
                            x.dst,
                            x.gateway,
                            w.gateway
                        );
                        r.routes_set += 1;
                        out.push(w.clone());
                    }
                    Err(e) => {
                        r.errors
                            .push(format!("replacing the BGP route {}: {e}", x.dst));
                        out.push(x);
                    }
                },
                // Another type (a blackhole): deleted here, added by the plan.
                Some(_) => self.delete_bgp_route(k, &x, r),
                None => {
                    // A remote block (or, with `--use-pod-cidr`, a remote node's podCIDR)
                    // whose VXLAN endpoint is not registered yet: the old route still
                    // carries its traffic until the plan can replace it.
                    let remote_block =
                        snap.blocks.iter().any(|b| {
                            b.cidr == x.dst && b.affinity.as_deref().is_some_and(|a| a != me)
                        }) || snap
                            .routed_pod_cidrs()
                            .iter()
                            .any(|p| p.cidr == x.dst && p.node != me);
                    if remote_block {
                        out.push(x);
                    } else {
                        self.delete_bgp_route(k, &x, r);
                    }
                }
            }
        }
        out
    }

    /// Deletes a proto-85 route [`Dataplane::adopt_bgp_routes`] took over.
    fn delete_bgp_route(&self, k: &mut dyn Netlink, x: &Route, r: &mut SyncReport) {
        match k.delete_route_full(x) {
            Ok(_) => {
                log::info!(
                    "removed the BGP route {} (via {:?}): no BGP speaker routes it",
                    x.dst,
                    x.gateway
                );
                r.routes_removed += 1;
            }
            Err(e) => r
                .errors
                .push(format!("removing the BGP route {}: {e}", x.dst)),
        }
    }

    /// Restores the host route (`<pod address>/32 dev <host veth> scope link proto 84`) of
    /// every local endpoint whose veth is up but whose route is gone (deleted by hand, or by
    /// anything that replaced and then withdrew it): the endpoint code installs these routes
    /// only at ADD. Veths that are down (a DEL in progress) are left alone.
    fn sync_pod_routes(
        &self,
        k: &mut dyn Netlink,
        links: &[tern_linux::netlink::Link],
        r: &mut SyncReport,
    ) {
        let store = self.endpoint_store.get().unwrap_or(&self.store);
        let eps = match crate::endpoints::store_io::list(&**store, &self.cfg.node_name) {
            Ok(e) => e,
            Err(e) => {
                r.errors.push(format!("listing endpoints: {e}"));
                return;
            }
        };
        let mut have: Option<Vec<Route>> = None;
        for ep in eps {
            let Some(link) = links.iter().find(|l| l.name == ep.host_ifname && l.up) else {
                continue;
            };
            for a in &ep.ip_networks {
                let ip = a.addr();
                let dst = IpNet::from(ip);
                let routes = match &mut have {
                    Some(v) => v,
                    None => {
                        let mut v = Vec::new();
                        for v6 in [false, true] {
                            match k.routes_full(v6, MAIN_TABLE) {
                                Ok(rs) => v.extend(rs),
                                Err(e) => {
                                    r.errors.push(format!("listing routes: {e}"));
                                    return;
                                }
                            }
                        }
                        have.insert(v)
                    }
                };
                if routes
                    .iter()
                    .any(|x| x.dst == dst && x.oif == Some(link.index))
                {
                    continue;
                }
                let route = Route {
                    dst,
                    kind: RouteKind::Unicast,
                    gateway: None,
                    oif: Some(link.index),
                    onlink: false,
                    scope: Scope::Link,
                    protocol: TERN_ROUTE_PROTOCOL,
                    table: MAIN_TABLE,
                };
                match k.replace_route_full(&route) {
                    Ok(()) => {
                        log::info!("restored the host route {dst} dev {}", link.name);
                        r.routes_set += 1;
                    }
                    // The veth went down since the listing: its DEL is running.
                    Err(tern_linux::LinuxError::Netlink { source, .. })
                        if source.raw_os_error() == Some(libc::ENETDOWN) => {}
                    Err(e) => r
                        .errors
                        .push(format!("host route {dst} dev {}: {e}", link.name)),
                }
            }
        }
    }

    /// Starts the watch thread: every change under `/tern/v1/` triggers a sync after a short
    /// debounce (5 ms of quiet, at most 50 ms of accumulation). Runs in the caller's network
    /// namespace (threads inherit it). Stops when `stop` is set.
    pub fn spawn_watch(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("dataplane-watch".into())
            .spawn(move || me.watch_loop(&stop))
            .map(|_| ())
    }

    fn watch_loop(&self, stop: &AtomicBool) {
        let mut watch: Option<Box<dyn tern_store::Watch>> = None;
        let mut digests = BlockDigests::default();
        let prefixes = watched_prefixes();
        let prefixes: Vec<&str> = prefixes.iter().map(String::as_str).collect();
        while !stop.load(Ordering::Relaxed) {
            let w = match watch.as_mut() {
                Some(w) => w,
                None => {
                    let rev = match self.store.revision() {
                        Ok(r) => r,
                        Err(e) => {
                            log::debug!("dataplane watch: {e}");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    };
                    match self.store.watch_prefixes(&prefixes, rev) {
                        Ok(w) => {
                            // Events between the last sync and the watch start are covered by
                            // this sync.
                            self.sync_with(false);
                            watch.insert(w)
                        }
                        Err(e) => {
                            log::debug!("dataplane watch: {e}");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    }
                }
            };
            match w.next_events(Duration::from_millis(500)) {
                Ok(ev) if ev.is_empty() => continue,
                Ok(ev) => {
                    if !ev.iter().any(|e| digests.changed(&e.kv.key, e)) {
                        continue;
                    }
                    let start = Instant::now();
                    // Debounce: gather the rest of a burst (an IPAM allocation is several
                    // writes) without delaying a lone event by more than a few ms.
                    while start.elapsed() < Duration::from_millis(50) {
                        match w.next_events(Duration::from_millis(5)) {
                            Ok(more) if more.is_empty() => break,
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                    self.sync_with(false);
                }
                Err(e) => {
                    log::debug!("dataplane watch ended: {e}; re-watching");
                    watch = None;
                }
            }
        }
    }
}

/// One of tern's VXLAN devices: `vxlan.tern` for the IPv4 pools over the IPv4 underlay, or
/// `vxlan-v6.tern` for the IPv6 pools over the IPv6 underlay (as Calico's `vxlan.calico` and
/// `vxlan-v6.calico`). Both have VNI [`VXLAN_VNI`] and UDP port [`VXLAN_PORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VxlanDev {
    name: &'static str,
    v6: bool,
}

impl VxlanDev {
    const V4: VxlanDev = VxlanDev {
        name: VXLAN_DEVICE,
        v6: false,
    };
    const V6: VxlanDev = VxlanDev {
        name: VXLAN_V6_DEVICE,
        v6: true,
    };

    fn family(self) -> u8 {
        if self.v6 { 6 } else { 4 }
    }

    /// Some pool of the device's family uses VXLAN.
    fn wanted(self, d: &Desired) -> bool {
        if self.v6 { d.vxlan_v6 } else { d.vxlan }
    }

    /// The node's tunnel address on this device.
    fn tunnel_addr(self, n: &NodeInfo) -> Option<IpAddr> {
        if self.v6 {
            n.vxlan_tunnel_addr_v6
        } else {
            n.vxlan_tunnel_addr
        }
    }

    /// The device's deterministic MAC on node `node`.
    fn mac(self, node: &str) -> [u8; 6] {
        if self.v6 {
            routes::vtep_mac_v6(node)
        } else {
            routes::vtep_mac(node)
        }
    }

    /// What encapsulation over the device's underlay family costs.
    fn overhead(self) -> u32 {
        if self.v6 {
            mtu::VXLAN_V6_OVERHEAD
        } else {
            mtu::VXLAN_OVERHEAD
        }
    }
}

/// A neighbour the kernel keeps on a device by itself (IPv6 link-local and multicast
/// addresses: router solicitations, NDP of the device's own link-local address), never one of
/// tern's VTEPs.
fn kernel_neighbour(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V6(a) => a.is_multicast() || a.is_unicast_link_local(),
        IpAddr::V4(a) => a.is_multicast(),
    }
}

/// The MTU of the interface holding the underlay address `addr`; the default route's
/// interface's when unknown.
fn underlay_mtu(k: &mut dyn Netlink, addr: Option<IpAddr>) -> u32 {
    fn find(k: &mut dyn Netlink, addr: Option<IpAddr>) -> Option<u32> {
        let a = addr?;
        let (idx, _) = k
            .addresses(None)
            .ok()?
            .into_iter()
            .find(|(_, n)| n.addr() == a)?;
        Some(k.link_by_index(idx).ok()??.mtu)
    }
    find(k, addr).unwrap_or_else(crate::host::detect_mtu)
}

/// Keys whose changes can change the dataplane: pools, nodes, blocks, affinities.
/// What of a block matters to routes: its affinity and its borrowed addresses (allocations made
/// by a node other than the block's). An allocation inside a node's own block changes neither,
/// so the pod ADDs that dominate block writes do not trigger a resync.
#[derive(Default)]
struct BlockDigests {
    seen: std::collections::HashMap<String, BlockDigest>,
}

/// A block's affinity and its borrowed (ordinal, node) pairs.
type BlockDigest = (Option<String>, Vec<(u32, String)>);

impl BlockDigests {
    /// True when the event can change routes; remembers block digests.
    fn changed(&mut self, key: &str, ev: &tern_store::Event) -> bool {
        if !key.starts_with(keys::BLOCKS) {
            return true;
        }
        if ev.kind == tern_store::EventKind::Delete {
            self.seen.remove(key);
            return true;
        }
        let Ok(b) = serde_json::from_slice::<tern_ipam::Block>(&ev.kv.value) else {
            return true;
        };
        let owner = b.affinity.as_deref().and_then(|a| a.strip_prefix("host:"));
        let borrowed: Vec<(u32, String)> = b
            .allocations
            .iter()
            .enumerate()
            .filter_map(|(ord, attr)| {
                let node = &b.attributes.get((*attr)? as usize)?.secondary.node;
                (Some(node.as_str()) != owner).then(|| (ord as u32, node.clone()))
            })
            .collect();
        let digest = (b.affinity.clone(), borrowed);
        self.seen.insert(key.to_string(), digest.clone()) != Some(digest)
    }
}

/// What the routes and VTEPs are made of: pools, nodes, blocks and their affinities (the
/// only keys the dataplane watches, so every event it gets is one of them).
fn watched_prefixes() -> [String; 4] {
    [
        keys::resource_prefix(Kind::IpPool.as_str()),
        keys::resource_prefix(Kind::Node.as_str()),
        keys::BLOCKS.to_string(),
        keys::AFFINITIES.to_string(),
    ]
}
