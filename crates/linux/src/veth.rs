//! Pod interface wiring, Calico style: a veth pair whose host end answers ARP/NDP for the pod's
//! gateway (169.254.1.1 / fe80::ecee:eeff:feee:eeee) by proxy, plus one /32 (/128) host route
//! per pod address. No bridge, no per-pod subnet.
//!
//! ADD cost is kept to one netlink socket per namespace and no thread: the veth is created with
//! both MACs, MTU and admin state in a single request, and the pod's side is configured through
//! a socket (and sysctl files) that the calling thread opens inside the pod's namespace and
//! leaves at once ([`NetNs::open_inside`]).
//!
//! The wiring is four steps on the kernel seam ([`PodKernel`]), so a caller can register an
//! undo after each ([`create_pod_veth`], [`prepare_host_side`], [`configure_pod_side`],
//! [`host_routes`]) and a fake kernel can fail any of them;
//! [`setup_pod_interface`] runs them all on the real kernel.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::error::{LinuxError, Result};
use crate::kernel::PodKernel;
use crate::netlink::{
    Handle, Link, MAIN_TABLE, Route, RouteSpec, Scope, VethOptions, check_ifname,
};
use crate::netns::NetNs;
use crate::{HOST_VETH_MAC, TERN_ROUTE_PROTOCOL};

/// The pod's IPv4 gateway: never assigned anywhere, answered by proxy-ARP on the host veth.
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The pod's IPv6 gateway: the EUI-64 link-local address of a host veth with MAC ee:ee:ee:ee:ee:ee.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

/// What to build for one pod.
#[derive(Debug, Clone, Copy)]
pub struct PodInterfaceConfig<'a> {
    /// Host-side veth name (see [`crate::host_veth_name`]).
    pub host_ifname: &'a str,
    /// Interface name inside the pod (`CNI_IFNAME`, usually eth0).
    pub pod_ifname: &'a str,
    /// The pod's network namespace.
    pub pod_ns: &'a NetNs,
    /// Pod addresses; installed as /32 and /128 whatever prefix they carry.
    pub addresses: &'a [IpNet],
    /// MTU of both veth ends.
    pub mtu: u32,
    /// MAC for the pod interface; None lets the kernel choose.
    pub pod_mac: Option<[u8; 6]>,
    /// Enable IP forwarding inside the pod (`net/ipv4/ip_forward`, IPv6 `all/forwarding`).
    pub allow_ip_forwarding: bool,
}

/// What was built, as the CNI result needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInterface {
    /// Host-side veth name.
    pub host_ifname: String,
    /// Host-side MAC (always [`HOST_VETH_MAC`]).
    pub host_mac: [u8; 6],
    /// Pod-side interface name.
    pub pod_ifname: String,
    /// Pod-side MAC as the kernel reports it.
    pub pod_mac: [u8; 6],
    /// Pod-side interface index (in the pod namespace).
    pub pod_ifindex: u32,
    /// Host-side interface index.
    pub host_ifindex: u32,
    /// MTU of the pair.
    pub mtu: u32,
}

fn host_prefix(addr: &IpNet) -> IpNet {
    let ip = addr.addr();
    IpNet::new(ip, if ip.is_ipv4() { 32 } else { 128 }).expect("max prefix is valid")
}

fn host_route(addr: &IpNet, host_index: u32) -> RouteSpec {
    RouteSpec {
        dst: host_prefix(addr),
        gateway: None,
        oif: Some(host_index),
        scope: Scope::Link,
        protocol: TERN_ROUTE_PROTOCOL,
        table: MAIN_TABLE,
    }
}

fn default_dst(v6: bool) -> IpNet {
    if v6 {
        IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0).expect("valid")
    } else {
        IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0).expect("valid")
    }
}

/// Pod-side routes, in installation order (the gateway's link route before the default route
/// that needs it).
fn pod_routes(pod_index: u32, v4: bool, v6: bool) -> Vec<RouteSpec> {
    let mut out = Vec::new();
    if v4 {
        out.push(RouteSpec {
            dst: IpNet::new(IpAddr::V4(POD_GATEWAY_V4), 32).expect("valid"),
            gateway: None,
            oif: Some(pod_index),
            scope: Scope::Link,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        });
        out.push(RouteSpec {
            dst: default_dst(false),
            gateway: Some(IpAddr::V4(POD_GATEWAY_V4)),
            oif: Some(pod_index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        });
    }
    if v6 {
        out.push(RouteSpec {
            dst: default_dst(true),
            gateway: Some(IpAddr::V6(POD_GATEWAY_V6)),
            oif: Some(pod_index),
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        });
    }
    out
}

fn families(addresses: &[IpNet]) -> (bool, bool) {
    (
        addresses.iter().any(|a| a.addr().is_ipv4()),
        addresses.iter().any(|a| a.addr().is_ipv6()),
    )
}

/// Builds the pod's interface. Call from a thread in the HOST (node) namespace. See the module
/// docs for the layout; on any failure after the veth exists it is deleted again.
pub fn setup_pod_interface(cfg: &PodInterfaceConfig) -> Result<PodInterface> {
    setup_pod_interface_on(&mut Handle::new()?, cfg)
}

/// [`setup_pod_interface`] on the kernel `k` (the node's namespace): every step in order, the
/// veth pair deleted again when a later step fails.
pub fn setup_pod_interface_on(
    k: &mut dyn PodKernel,
    cfg: &PodInterfaceConfig,
) -> Result<PodInterface> {
    let pending = create_pod_veth(k, cfg)?;
    let wired = (|| {
        prepare_host_side(k, cfg, &pending)?;
        let pod = configure_pod_side(k, cfg, &pending)?;
        for r in host_routes(cfg, &pending) {
            k.replace_route_full(&r)?;
        }
        Ok(pending.interface(&pod, cfg.mtu))
    })();
    if wired.is_err() {
        // Deleting the host end removes the pod end and the host routes with it.
        let _ = k.delete_link_by_index(pending.host.index);
    }
    wired
}

/// A veth pair made by [`create_pod_veth`]: the host end, whose deletion removes both ends and
/// every route through it.
#[derive(Debug)]
pub struct PendingVeth {
    host: Link,
}

impl PendingVeth {
    /// The host end's interface index.
    pub fn host_index(&self) -> u32 {
        self.host.index
    }

    /// What was built, once the pod side is configured ([`configure_pod_side`]'s link).
    pub fn interface(&self, pod: &Link, mtu: u32) -> PodInterface {
        PodInterface {
            host_ifname: self.host.name.clone(),
            host_mac: self.host.mac.unwrap_or(HOST_VETH_MAC),
            pod_ifname: pod.name.clone(),
            pod_mac: pod.mac.unwrap_or_default(),
            pod_ifindex: pod.index,
            host_ifindex: self.host.index,
            mtu: if self.host.mtu > 0 {
                self.host.mtu
            } else {
                mtu
            },
        }
    }
}

/// Step 1: the veth pair, in one request, with the peer created directly inside the pod's
/// namespace (host MAC [`HOST_VETH_MAC`], MTU, both ends up). A stale host end of an earlier
/// attempt (its pod side already gone) is replaced; an interface of the pod's name already in
/// the pod is [`LinuxError::InterfaceExists`]. On success the caller owns the pair: deleting
/// the host end ([`PendingVeth::host_index`]) undoes this step and every later one.
pub fn create_pod_veth(k: &mut dyn PodKernel, cfg: &PodInterfaceConfig) -> Result<PendingVeth> {
    check_ifname(cfg.host_ifname)?;
    check_ifname(cfg.pod_ifname)?;
    let opts = VethOptions {
        host_name: cfg.host_ifname,
        peer_name: cfg.pod_ifname,
        peer_ns: cfg.pod_ns.as_fd(),
        mtu: cfg.mtu,
        host_mac: Some(HOST_VETH_MAC),
        peer_mac: cfg.pod_mac,
        up: true,
    };
    // Try first and diagnose EEXIST only when it happens: the common path stays one request.
    if let Err(e) = k.create_veth_with(&opts) {
        if !e.is_already_exists() {
            return Err(e);
        }
        let mut inside = k.enter_pod(cfg.pod_ns, &[])?;
        if inside.netlink.link_by_name(cfg.pod_ifname)?.is_some() {
            return Err(LinuxError::InterfaceExists {
                name: cfg.pod_ifname.to_string(),
                namespace: cfg.pod_ns.to_string(),
            });
        }
        // A stale host veth from an earlier attempt (its pod side is already gone): replace it.
        if !k.delete_link(cfg.host_ifname)? {
            return Err(e);
        }
        k.create_veth_with(&opts)?;
    }
    match k.link_by_name(cfg.host_ifname) {
        Ok(Some(host)) => Ok(PendingVeth { host }),
        Ok(None) => Err(LinuxError::NotFound {
            what: format!("host veth {} right after creating it", cfg.host_ifname),
        }),
        Err(e) => {
            let _ = k.delete_link(cfg.host_ifname);
            Err(e)
        }
    }
}

/// Step 2: the host end's sysctls: proxy-ARP without delay and forwarding; for a pod with
/// IPv6, proxy-NDP and forwarding, router advertisements ignored (IPv6 keys skipped where the
/// node has IPv6 disabled).
pub fn prepare_host_side(
    k: &mut dyn PodKernel,
    cfg: &PodInterfaceConfig,
    _pending: &PendingVeth,
) -> Result<()> {
    let name = cfg.host_ifname;
    k.set_sysctl(&format!("net/ipv4/conf/{name}/proxy_arp"), "1")?;
    k.set_sysctl(&format!("net/ipv4/neigh/{name}/proxy_delay"), "0")?;
    k.set_sysctl(&format!("net/ipv4/conf/{name}/forwarding"), "1")?;
    if families(cfg.addresses).1 {
        k.set_sysctl_if_present(&format!("net/ipv6/conf/{name}/proxy_ndp"), "1")?;
        k.set_sysctl_if_present(&format!("net/ipv6/conf/{name}/forwarding"), "1")?;
        k.set_sysctl_if_present(&format!("net/ipv6/conf/{name}/accept_ra"), "0")?;
    }
    Ok(())
}

/// Step 3: inside the pod's namespace, in one visit: IPv6 off for an IPv4-only pod, the
/// interface and `lo` up, the addresses as /32 (/128), the default routes via the proxy
/// gateways (for the pod's first interface only), forwarding when asked. Returns the pod's
/// interface. Undone with the pair.
pub fn configure_pod_side(
    k: &mut dyn PodKernel,
    cfg: &PodInterfaceConfig,
    _pending: &PendingVeth,
) -> Result<Link> {
    let (v4, v6) = families(cfg.addresses);
    let ns = cfg.pod_ns;
    let pod_ifname = cfg.pod_ifname;
    // The pod's side is configured through descriptors opened inside its namespace, from this
    // thread (no thread per visit, see `NetNs::open_inside`): its rtnetlink socket and the
    // sysctl files to set there.
    let fwd_v4 = "net/ipv4/ip_forward";
    let fwd_v6 = "net/ipv6/conf/all/forwarding";
    let no_v6_key = format!("net/ipv6/conf/{pod_ifname}/disable_ipv6");
    let mut keys: Vec<&str> = Vec::new();
    // An IPv4-only pod gets no IPv6 on its interface (as Calico does): no link-local
    // address, no DAD or router solicitation work when the link comes up.
    if !v6 {
        keys.push(&no_v6_key);
    }
    if cfg.allow_ip_forwarding {
        keys.push(fwd_v4);
        if v6 {
            keys.push(fwd_v6);
        }
    }
    let side = k.enter_pod(ns, &keys)?;
    let (mut ph, mut sys) = (side.netlink, side.sysctls);
    let mut pod = ph
        .link_by_name(pod_ifname)?
        .ok_or_else(|| LinuxError::NotFound {
            what: format!("interface {pod_ifname} in container namespace {ns} after creating it"),
        })?;
    let pod_index = pod.index;
    if !v6 {
        sys.set_sysctl_if_present(&no_v6_key, "1")?;
    }
    ph.set_link_up(pod_index)?;
    // lo is ifindex 1 in every namespace.
    ph.set_link_up(1)?;
    pod.up = true;
    for a in cfg.addresses {
        ph.add_address(pod_index, host_prefix(a))
            .map_err(|e| in_container(e, ns))?;
    }
    // The pod's first interface owns its default route; a second interface of the same pod
    // (e.g. `net1`) gets its addresses only, so it never takes the default away.
    let mut has_default = |v6: bool| -> Result<bool> {
        Ok(ph
            .routes_full(v6, MAIN_TABLE)?
            .iter()
            .any(|r| r.dst.prefix_len() == 0 && r.oif != Some(pod_index)))
    };
    let (v4_routes, v6_routes) = (v4 && !has_default(false)?, v6 && !has_default(true)?);
    for r in pod_routes(pod_index, v4_routes, v6_routes) {
        ph.replace_route_full(&Route::from(&r))
            .map_err(|e| in_container(e, ns))?;
    }
    if cfg.allow_ip_forwarding {
        sys.set_sysctl(fwd_v4, "1")?;
        if v6 {
            sys.set_sysctl_if_present(fwd_v6, "1")?;
        }
    }
    if pod.mac.is_none() {
        return Err(LinuxError::Malformed(format!(
            "interface {} has no MAC address",
            pod.name
        )));
    }
    Ok(pod)
}

/// Step 4: the node's /32 (/128) routes to the pod's addresses through the host end, for the
/// caller to install (`replace_route_full`) and, on a later failure, delete.
pub fn host_routes(cfg: &PodInterfaceConfig, pending: &PendingVeth) -> Vec<Route> {
    cfg.addresses
        .iter()
        .map(|a| Route::from(&host_route(a, pending.host.index)))
        .collect()
}

fn in_container(e: LinuxError, ns: &NetNs) -> LinuxError {
    match e {
        LinuxError::Netlink {
            context,
            source,
            ext_ack,
        } => LinuxError::Netlink {
            context: format!("{context} in container namespace {ns}"),
            source,
            ext_ack,
        },
        other => other,
    }
}

/// Removes the host veth, which removes the pod end with it, and with them every route through
/// the veth (the kernel flushes routes of a deleted device). Ok when already gone, so DEL can
/// be repeated.
pub fn teardown_pod_interface(host_ifname: &str) -> Result<()> {
    let mut h = Handle::new()?;
    h.delete_link(host_ifname)?;
    Ok(())
}

/// CNI CHECK: the host veth exists, is up and peers with the pod interface; the pod interface
/// exists with every address and the default route(s); every host route exists. The error names
/// the first thing found missing.
pub fn check_pod_interface(
    host_ifname: &str,
    pod_ifname: &str,
    pod_ns: &NetNs,
    addresses: &[IpNet],
) -> Result<()> {
    check_pod_interface_on(
        &mut Handle::new()?,
        host_ifname,
        pod_ifname,
        pod_ns,
        addresses,
    )
}

/// [`check_pod_interface`] on the kernel `k` (the node's namespace); the pod's side is read
/// through a netlink socket opened inside `pod_ns` ([`PodNamespaces::enter_pod`]).
///
/// [`PodNamespaces::enter_pod`]: crate::kernel::PodNamespaces::enter_pod
pub fn check_pod_interface_on(
    k: &mut dyn PodKernel,
    host_ifname: &str,
    pod_ifname: &str,
    pod_ns: &NetNs,
    addresses: &[IpNet],
) -> Result<()> {
    check_ifname(host_ifname)?;
    check_ifname(pod_ifname)?;
    let (v4, v6) = families(addresses);
    let host = k.link_by_name(host_ifname)?.ok_or_else(|| {
        LinuxError::CheckFailed(format!("host veth {host_ifname} does not exist"))
    })?;
    if !host.up {
        return Err(LinuxError::CheckFailed(format!(
            "host veth {host_ifname} is down"
        )));
    }
    if host.kind.as_deref() != Some("veth") {
        return Err(LinuxError::CheckFailed(format!(
            "host interface {host_ifname} is a {} device, not a veth",
            host.kind.as_deref().unwrap_or("physical")
        )));
    }
    let mut host_routes = Vec::new();
    if v4 {
        host_routes.extend(k.routes_full(false, MAIN_TABLE)?);
    }
    if v6 {
        host_routes.extend(k.routes_full(true, MAIN_TABLE)?);
    }
    for a in addresses {
        let dst = host_prefix(a);
        if !host_routes
            .iter()
            .any(|r| r.dst == dst && r.oif == Some(host.index))
        {
            return Err(LinuxError::CheckFailed(format!(
                "host route {dst} dev {host_ifname} is missing"
            )));
        }
    }

    let mut ph = k.enter_pod(pod_ns, &[])?.netlink;
    let pod = ph.link_by_name(pod_ifname)?.ok_or_else(|| {
        LinuxError::CheckFailed(format!(
            "interface {pod_ifname} does not exist in container namespace {pod_ns}"
        ))
    })?;
    if host.peer_index.is_some_and(|p| p != pod.index) {
        return Err(LinuxError::CheckFailed(format!(
            "host veth {host_ifname} is not the peer of {pod_ifname} in container namespace {pod_ns}"
        )));
    }
    let have = ph.addresses(Some(pod.index))?;
    for a in addresses {
        if !have.iter().any(|(_, h)| h.addr() == a.addr()) {
            return Err(LinuxError::CheckFailed(format!(
                "address {} is missing on {pod_ifname} in container namespace {pod_ns}",
                a.addr()
            )));
        }
    }
    for (want, is_v6) in [(v4, false), (v6, true)] {
        if !want {
            continue;
        }
        let gw = if is_v6 {
            IpAddr::V6(POD_GATEWAY_V6)
        } else {
            IpAddr::V4(POD_GATEWAY_V4)
        };
        // A secondary interface relies on the default route of the pod's first interface.
        let routes = ph.routes_full(is_v6, MAIN_TABLE)?;
        if !routes
            .iter()
            .any(|r| r.dst == default_dst(is_v6) && r.gateway == Some(gw))
        {
            return Err(LinuxError::CheckFailed(format!(
                "default route via {gw} dev {pod_ifname} is missing in container namespace {pod_ns}"
            )));
        }
    }
    Ok(())
}
