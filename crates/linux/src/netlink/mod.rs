//! Synchronous rtnetlink: links, addresses, routes, neighbours and FDB entries.
//!
//! A [`Handle`] is one NETLINK_ROUTE socket. It talks to the network namespace of the thread that
//! created it, for its whole life, whichever thread later uses it: so open one per namespace
//! (inside [`crate::netns::NetNs::run`]) and keep it.

mod ext;
pub(crate) mod framing;
mod route;

#[cfg(any(test, feature = "test-support"))]
pub(crate) use ext::describe;
pub use ext::{Route, RouteKind, VxlanInfo};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, BorrowedFd};

use ipnet::IpNet;

use crate::error::{LinuxError, Result};
use route::*;

/// The kernel's main routing table (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = 254;

/// One network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, when the link has a 6-byte one.
    pub mac: Option<[u8; 6]>,
    /// MTU in bytes.
    pub mtu: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// `IFLA_INFO_KIND`: "veth", "vxlan", "bridge", ...; None for physical devices and `lo`.
    pub kind: Option<String>,
    /// The namespace id (as seen from this namespace) of the peer / lower device, when elsewhere.
    pub link_netnsid: Option<i32>,
    /// `IFLA_LINK`: for a veth, the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
}

/// Route scope (`rtm_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// RT_SCOPE_UNIVERSE: routes via a gateway.
    Universe,
    /// RT_SCOPE_LINK: directly attached destinations.
    Link,
    /// RT_SCOPE_HOST: local addresses.
    Host,
}

impl Scope {
    fn to_raw(self) -> u8 {
        match self {
            Scope::Universe => 0,
            Scope::Link => 253,
            Scope::Host => 254,
        }
    }
    fn from_raw(v: u8) -> Scope {
        match v {
            253 => Scope::Link,
            254 => Scope::Host,
            _ => Scope::Universe,
        }
    }
}

/// A unicast route. IPv6 routes always read back with `Scope::Universe`: the kernel does not
/// keep a scope for them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteSpec {
    /// Destination prefix (`0.0.0.0/0` / `::/0` for a default route).
    pub dst: IpNet,
    /// Next hop, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index, if any.
    pub oif: Option<u32>,
    /// Scope.
    pub scope: Scope,
    /// Route protocol (`proto`); tern's routes use [`crate::TERN_ROUTE_PROTOCOL`].
    pub protocol: u8,
    /// Routing table; [`MAIN_TABLE`] normally.
    pub table: u32,
}

/// A permanent neighbour (ARP / NDP) entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    /// Interface index.
    pub index: u32,
    /// Protocol address.
    pub ip: IpAddr,
    /// Link-layer address, when resolved.
    pub mac: Option<[u8; 6]>,
    /// `NUD_*` state bits.
    pub state: u16,
}

/// A bridge forwarding database entry (`AF_BRIDGE` neighbour), as used by VXLAN devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdbEntry {
    /// Interface index (the VXLAN device).
    pub index: u32,
    /// Destination MAC.
    pub mac: [u8; 6],
    /// Remote tunnel endpoint, when set.
    pub dst: Option<IpAddr>,
}

/// A synchronous rtnetlink socket in the network namespace of the thread that created it.
pub struct Handle {
    sock: Socket,
}

fn family_of(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn parse_ip(data: &[u8]) -> Option<IpAddr> {
    match data.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?))),
        _ => None,
    }
}

/// A delete's outcome: `Ok(true)` when it deleted, `Ok(false)` when there was nothing to delete
/// ([`LinuxError::is_not_found`]).
fn deleted(r: Result<()>) -> Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

/// One entry of a neighbour dump (`RTM_GETNEIGH`): the `ndmsg` header's fields and the
/// `NDA_DST` and `NDA_LLADDR` attributes.
struct NeighRow {
    family: u8,
    index: u32,
    state: u16,
    dst: Option<IpAddr>,
    mac: Option<[u8; 6]>,
}

/// The entries of a neighbour dump's replies; replies too short for an `ndmsg` are skipped.
fn parse_neighbours(replies: &[framing::Reply]) -> Vec<NeighRow> {
    let mut out = Vec::new();
    for r in replies.iter().filter(|r| r.payload.len() >= 12) {
        let p = &r.payload;
        let mut row = NeighRow {
            family: p[0],
            index: u32::from_ne_bytes(p[4..8].try_into().unwrap()),
            state: u16::from_ne_bytes(p[8..10].try_into().unwrap()),
            dst: None,
            mac: None,
        };
        for (kind, data) in attrs(&p[12..]) {
            match kind {
                NDA_DST => row.dst = parse_ip(data),
                NDA_LLADDR => row.mac = parse_mac(data),
                _ => {}
            }
        }
        out.push(row);
    }
    out
}

fn parse_mac(data: &[u8]) -> Option<[u8; 6]> {
    <[u8; 6]>::try_from(data).ok()
}

/// Formats a MAC as `ee:ee:ee:ee:ee:ee`.
pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub(crate) fn check_ifname(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 15
        || name.contains(['/', ':', '\0'])
        || name.contains(char::is_whitespace)
        || name == "."
        || name == ".."
    {
        return Err(LinuxError::InvalidArgument(format!(
            "interface name {name:?} must be 1-15 bytes without '/', ':' or whitespace"
        )));
    }
    Ok(())
}

fn parse_link(payload: &[u8]) -> Result<Link> {
    if payload.len() < 16 {
        return Err(LinuxError::Malformed("short ifinfomsg".into()));
    }
    let index = i32::from_ne_bytes(payload[4..8].try_into().unwrap()) as u32;
    let flags = u32::from_ne_bytes(payload[8..12].try_into().unwrap());
    let mut link = Link {
        index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: flags & IFF_UP != 0,
        kind: None,
        link_netnsid: None,
        peer_index: None,
    };
    for (kind, data) in attrs(&payload[16..]) {
        match kind {
            IFLA_IFNAME => link.name = read_str(data),
            IFLA_ADDRESS => link.mac = parse_mac(data),
            IFLA_MTU => link.mtu = read_u32(data).unwrap_or(0),
            IFLA_LINK => link.peer_index = read_u32(data).filter(|&i| i != 0),
            IFLA_LINK_NETNSID => link.link_netnsid = read_u32(data).map(|v| v as i32),
            IFLA_LINKINFO => {
                link.kind = attrs(data)
                    .find(|(k, _)| *k == IFLA_INFO_KIND)
                    .map(|(_, v)| read_str(v));
            }
            _ => {}
        }
    }
    Ok(link)
}

fn parse_route(payload: &[u8]) -> Option<(RouteSpec, u8, u32)> {
    if payload.len() < 12 {
        return None;
    }
    let family = payload[0];
    let dst_len = payload[1];
    let mut table = payload[4] as u32;
    let protocol = payload[5];
    let scope = Scope::from_raw(payload[6]);
    let rtype = payload[7];
    let flags = u32::from_ne_bytes(payload[8..12].try_into().unwrap());
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    for (kind, data) in attrs(&payload[12..]) {
        match kind {
            RTA_DST => dst = parse_ip(data),
            RTA_GATEWAY => gateway = parse_ip(data),
            RTA_OIF => oif = read_u32(data),
            RTA_TABLE => table = read_u32(data).unwrap_or(table),
            _ => {}
        }
    }
    let dst = dst.unwrap_or(if family == libc::AF_INET6 as u8 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    });
    let dst = IpNet::new(dst, dst_len).ok()?;
    Some((
        RouteSpec {
            dst,
            gateway,
            oif,
            scope,
            protocol,
            table,
        },
        rtype,
        flags,
    ))
}

impl Handle {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> Result<Handle> {
        Ok(Handle {
            sock: route::socket()?,
        })
    }

    /// All links in this namespace.
    pub fn links(&mut self) -> Result<Vec<Link>> {
        let mut m = Msg::new(RTM_GETLINK, NLM_F_DUMP);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        let replies = self
            .sock
            .request_dump(&mut m, &|| "list links".to_string())?;
        replies
            .iter()
            .filter(|r| r.msg_type == RTM_NEWLINK)
            .map(|r| parse_link(&r.payload))
            .collect()
    }

    fn get_link(&mut self, m: &mut Msg, what: &dyn Fn() -> String) -> Result<Option<Link>> {
        match self.sock.request_one(m, what) {
            Ok(r) => Ok(Some(parse_link(&r.payload)?)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The link called `name`, if present.
    pub fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        check_ifname(name)?;
        let mut m = Msg::new(RTM_GETLINK, 0);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        self.get_link(&mut m, &|| format!("get link {name}"))
    }

    /// The link with index `index`, if present.
    pub fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        let mut m = Msg::new(RTM_GETLINK, 0);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, index as i32, 0, 0));
        self.get_link(&mut m, &|| format!("get link index {index}"))
    }

    /// Creates a veth pair: `host_name` here, `peer_name` created directly in the namespace
    /// `peer_ns` (no create-then-move). Both ends get `mtu` (0: kernel default) and stay down.
    pub fn create_veth(
        &mut self,
        host_name: &str,
        peer_name: &str,
        peer_ns: BorrowedFd<'_>,
        mtu: u32,
    ) -> Result<()> {
        self.create_veth_with(&VethOptions {
            host_name,
            peer_name,
            peer_ns,
            mtu,
            host_mac: None,
            peer_mac: None,
            up: false,
        })
    }

    /// Creates a veth pair with MACs and admin state set in the same request, which saves a
    /// round trip per attribute on the pod ADD path.
    pub fn create_veth_with(&mut self, o: &VethOptions<'_>) -> Result<()> {
        check_ifname(o.host_name)?;
        check_ifname(o.peer_name)?;
        let up = if o.up { IFF_UP } else { 0 };
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, up, up));
        m.attr_str(IFLA_IFNAME, o.host_name);
        if o.mtu > 0 {
            m.attr_u32(IFLA_MTU, o.mtu);
        }
        if let Some(mac) = o.host_mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        m.begin_nest(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, "veth");
        m.begin_nest(IFLA_INFO_DATA);
        m.begin_nest(VETH_INFO_PEER);
        // The peer cannot be brought up here: the kernel configures it before linking the
        // pair, and opening an unpaired veth fails with ENOTCONN.
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, o.peer_name);
        if o.mtu > 0 {
            m.attr_u32(IFLA_MTU, o.mtu);
        }
        if let Some(mac) = o.peer_mac {
            m.attr(IFLA_ADDRESS, &mac);
        }
        m.attr_u32(IFLA_NET_NS_FD, o.peer_ns.as_raw_fd() as u32);
        m.end_nest();
        m.end_nest();
        m.end_nest();
        self.sock.request_ack(&mut m, &|| {
            format!("create veth {} (peer {})", o.host_name, o.peer_name)
        })
    }

    fn create_simple(&mut self, name: &str, kind: &str) -> Result<()> {
        check_ifname(name)?;
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        m.begin_nest(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, kind);
        m.end_nest();
        self.sock
            .request_ack(&mut m, &|| format!("create {kind} link {name}"))
    }

    /// Creates a bridge device (down).
    pub fn create_bridge(&mut self, name: &str) -> Result<()> {
        self.create_simple(name, "bridge")
    }

    /// Creates a VXLAN device with learning off (tern programs ARP and FDB statically), bound
    /// to `local` and, when given, to the underlay device `dev_index`; `port` is the UDP port.
    pub fn create_vxlan(
        &mut self,
        name: &str,
        vni: u32,
        local: IpAddr,
        dev_index: Option<u32>,
        port: u16,
    ) -> Result<()> {
        check_ifname(name)?;
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        m.begin_nest(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, "vxlan");
        m.begin_nest(IFLA_INFO_DATA);
        m.attr_u32(IFLA_VXLAN_ID, vni);
        match local {
            IpAddr::V4(a) => m.attr(IFLA_VXLAN_LOCAL, &a.octets()),
            IpAddr::V6(a) => m.attr(IFLA_VXLAN_LOCAL6, &a.octets()),
        };
        if let Some(dev) = dev_index {
            m.attr_u32(IFLA_VXLAN_LINK, dev);
        }
        m.attr(IFLA_VXLAN_LEARNING, &[0]);
        // The port travels in network byte order.
        m.attr(IFLA_VXLAN_PORT, &port.to_be_bytes());
        m.end_nest();
        m.end_nest();
        self.sock
            .request_ack(&mut m, &|| format!("create vxlan link {name} (vni {vni})"))
    }

    /// Deletes the link called `name`; `Ok(false)` when it does not exist.
    pub fn delete_link(&mut self, name: &str) -> Result<bool> {
        check_ifname(name)?;
        let mut m = Msg::new(RTM_DELLINK, NLM_F_ACK);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        deleted(
            self.sock
                .request_ack(&mut m, &|| format!("delete link {name}")),
        )
    }

    /// Deletes the link with index `index`; `Ok(false)` when it does not exist.
    pub fn delete_link_by_index(&mut self, index: u32) -> Result<bool> {
        let mut m = Msg::new(RTM_DELLINK, NLM_F_ACK);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, index as i32, 0, 0));
        deleted(
            self.sock
                .request_ack(&mut m, &|| format!("delete link index {index}")),
        )
    }

    fn set_link(
        &mut self,
        index: u32,
        flags: u32,
        change: u32,
        attr: Option<(u16, &[u8])>,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK);
        m.raw(&ifinfomsg(
            libc::AF_UNSPEC as u8,
            index as i32,
            flags,
            change,
        ));
        if let Some((k, v)) = attr {
            m.attr(k, v);
        }
        self.sock.request_ack(&mut m, what)
    }

    /// Moves the link into the network namespace `ns` (it keeps its name; the index may change).
    pub fn set_netns(&mut self, index: u32, ns: BorrowedFd<'_>) -> Result<()> {
        let fd = ns.as_raw_fd() as u32;
        self.set_link(
            index,
            0,
            0,
            Some((IFLA_NET_NS_FD, &fd.to_ne_bytes())),
            &|| format!("move link index {index} to network namespace fd {fd}"),
        )
    }

    /// Sets the link administratively up.
    pub fn set_link_up(&mut self, index: u32) -> Result<()> {
        self.set_link(index, IFF_UP, IFF_UP, None, &|| {
            format!("set link index {index} up")
        })
    }

    /// Sets the link administratively down.
    pub fn set_link_down(&mut self, index: u32) -> Result<()> {
        self.set_link(index, 0, IFF_UP, None, &|| {
            format!("set link index {index} down")
        })
    }

    /// Sets the link's MAC address.
    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        self.set_link(index, 0, 0, Some((IFLA_ADDRESS, &mac)), &|| {
            format!("set MAC {} on link index {index}", format_mac(&mac))
        })
    }

    /// Sets the link's MTU.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        self.set_link(index, 0, 0, Some((IFLA_MTU, &mtu.to_ne_bytes())), &|| {
            format!("set MTU {mtu} on link index {index}")
        })
    }

    /// Enslaves the link to `master_index` (a bridge); `0` releases it.
    pub fn set_master(&mut self, index: u32, master_index: u32) -> Result<()> {
        self.set_link(
            index,
            0,
            0,
            Some((IFLA_MASTER, &master_index.to_ne_bytes())),
            &|| format!("set master of link index {index} to index {master_index}"),
        )
    }

    /// Adds an address. IPv6 addresses are added with `nodad` so they are usable at once;
    /// an address that already exists is success.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> Result<()> {
        let ip = addr.addr();
        let v6 = ip.is_ipv6();
        let nodad = if v6 { IFA_F_NODAD } else { 0 };
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        m.raw(&ifaddrmsg(
            family_of(&ip),
            addr.prefix_len(),
            nodad as u8,
            0,
            index,
        ));
        let bytes = ip_bytes(&ip);
        if !v6 {
            m.attr(IFA_LOCAL, &bytes);
        }
        m.attr(IFA_ADDRESS, &bytes);
        if v6 {
            m.attr_u32(IFA_FLAGS, nodad);
        }
        match self.sock.request_ack(&mut m, &|| {
            format!("add address {addr} to link index {index}")
        }) {
            Err(e) if e.is_already_exists() => Ok(()),
            other => other,
        }
    }

    /// Addresses as `(link index, address/prefix)`, of one link or of all.
    pub fn addresses(&mut self, index: Option<u32>) -> Result<Vec<(u32, IpNet)>> {
        let mut m = Msg::new(RTM_GETADDR, NLM_F_DUMP);
        m.raw(&ifaddrmsg(libc::AF_UNSPEC as u8, 0, 0, 0, 0));
        let replies = self
            .sock
            .request_dump(&mut m, &|| "list addresses".to_string())?;
        let mut out = Vec::new();
        for r in replies.iter().filter(|r| r.payload.len() >= 8) {
            let p = &r.payload;
            let prefix_len = p[1];
            let ifindex = u32::from_ne_bytes(p[4..8].try_into().unwrap());
            if index.is_some_and(|i| i != ifindex) {
                continue;
            }
            let (mut local, mut address) = (None, None);
            for (kind, data) in attrs(&p[8..]) {
                match kind {
                    IFA_LOCAL => local = parse_ip(data),
                    IFA_ADDRESS => address = parse_ip(data),
                    _ => {}
                }
            }
            // On point-to-point links IFA_ADDRESS is the peer; IFA_LOCAL is always ours.
            if let Some(ip) = local.or(address)
                && let Ok(net) = IpNet::new(ip, prefix_len)
            {
                out.push((ifindex, net));
            }
        }
        Ok(out)
    }

    /// Installs or replaces a unicast route.
    pub fn replace_route(&mut self, r: &RouteSpec) -> Result<()> {
        self.replace_route_full(&Route::from(r))
    }

    /// Deletes a route; `Ok(false)` when no such route exists. Protocol 0 matches any protocol.
    pub fn delete_route(&mut self, r: &RouteSpec) -> Result<bool> {
        self.delete_route_full(&Route::from(r))
    }

    /// Unicast routes of the main table.
    pub fn routes(&mut self, v6: bool) -> Result<Vec<RouteSpec>> {
        self.routes_in_table(v6, MAIN_TABLE)
    }

    /// Unicast routes of `table` (kernel cache clones excluded).
    pub fn routes_in_table(&mut self, v6: bool, table: u32) -> Result<Vec<RouteSpec>> {
        Ok(self
            .routes_full(v6, table)?
            .into_iter()
            .filter(|r| r.kind == RouteKind::Unicast)
            .map(|r| RouteSpec {
                dst: r.dst,
                gateway: r.gateway,
                oif: r.oif,
                scope: r.scope,
                protocol: r.protocol,
                table: r.table,
            })
            .collect())
    }

    /// Adds or replaces a permanent neighbour entry (static ARP / NDP).
    pub fn add_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()> {
        let mut m = Msg::new(RTM_NEWNEIGH, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE);
        m.raw(&ndmsg(family_of(&ip), index, NUD_PERMANENT, 0));
        m.attr(NDA_DST, &ip_bytes(&ip));
        m.attr(NDA_LLADDR, &mac);
        self.sock.request_ack(&mut m, &|| {
            format!(
                "add neighbour {ip} lladdr {} on link index {index}",
                format_mac(&mac)
            )
        })
    }

    /// Deletes a neighbour entry; `Ok(false)` when absent.
    pub fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> Result<bool> {
        let mut m = Msg::new(RTM_DELNEIGH, NLM_F_ACK);
        m.raw(&ndmsg(family_of(&ip), index, 0, 0));
        m.attr(NDA_DST, &ip_bytes(&ip));
        deleted(self.sock.request_ack(&mut m, &|| {
            format!("delete neighbour {ip} on link index {index}")
        }))
    }

    /// Neighbour entries (IPv4 and IPv6) of one link or of all.
    pub fn neighbours(&mut self, index: Option<u32>) -> Result<Vec<Neighbour>> {
        let mut m = Msg::new(RTM_GETNEIGH, NLM_F_DUMP);
        m.raw(&ndmsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        let replies = self
            .sock
            .request_dump(&mut m, &|| "list neighbours".to_string())?;
        Ok(parse_neighbours(&replies)
            .into_iter()
            .filter(|n| n.family == libc::AF_INET as u8 || n.family == libc::AF_INET6 as u8)
            .filter(|n| index.is_none_or(|i| i == n.index))
            .filter_map(|n| {
                Some(Neighbour {
                    index: n.index,
                    ip: n.dst?,
                    mac: n.mac,
                    state: n.state,
                })
            })
            .collect())
    }

    /// Adds or replaces a permanent FDB entry `mac -> dst` on a VXLAN device (`NTF_SELF`).
    pub fn add_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<()> {
        let mut m = Msg::new(RTM_NEWNEIGH, NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE);
        m.raw(&ndmsg(
            libc::AF_BRIDGE as u8,
            index,
            NUD_PERMANENT,
            NTF_SELF,
        ));
        m.attr(NDA_LLADDR, &mac);
        m.attr(NDA_DST, &ip_bytes(&dst));
        self.sock.request_ack(&mut m, &|| {
            format!(
                "add fdb {} dst {dst} on link index {index}",
                format_mac(&mac)
            )
        })
    }

    /// Deletes an FDB entry (`NTF_SELF`); `Ok(false)` when absent.
    pub fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<bool> {
        let mut m = Msg::new(RTM_DELNEIGH, NLM_F_ACK);
        m.raw(&ndmsg(libc::AF_BRIDGE as u8, index, 0, NTF_SELF));
        m.attr(NDA_LLADDR, &mac);
        m.attr(NDA_DST, &ip_bytes(&dst));
        deleted(self.sock.request_ack(&mut m, &|| {
            format!(
                "delete fdb {} dst {dst} on link index {index}",
                format_mac(&mac)
            )
        }))
    }

    /// FDB entries of one device (`bridge fdb show dev X`), including those with a remote dst.
    pub fn fdb(&mut self, index: u32) -> Result<Vec<FdbEntry>> {
        let mut m = Msg::new(RTM_GETNEIGH, NLM_F_DUMP);
        m.raw(&ndmsg(libc::AF_BRIDGE as u8, 0, 0, 0));
        let replies = self
            .sock
            .request_dump(&mut m, &|| format!("list fdb of link index {index}"))?;
        Ok(parse_neighbours(&replies)
            .into_iter()
            .filter(|n| n.family == libc::AF_BRIDGE as u8 && n.index == index)
            .filter_map(|n| {
                Some(FdbEntry {
                    index: n.index,
                    mac: n.mac?,
                    dst: n.dst,
                })
            })
            .collect())
    }
}

/// Options for [`Handle::create_veth_with`].
#[derive(Debug, Clone, Copy)]
pub struct VethOptions<'a> {
    /// Name of the end created in this namespace.
    pub host_name: &'a str,
    /// Name of the end created in `peer_ns`.
    pub peer_name: &'a str,
    /// Namespace of the peer end.
    pub peer_ns: BorrowedFd<'a>,
    /// MTU of both ends; 0 keeps the kernel default.
    pub mtu: u32,
    /// MAC of the end here; None lets the kernel pick a random one.
    pub host_mac: Option<[u8; 6]>,
    /// MAC of the peer end; None lets the kernel pick a random one.
    pub peer_mac: Option<[u8; 6]>,
    /// Create the end here administratively up (the peer end is always created down; bring it
    /// up from its own namespace).
    pub up: bool,
}
