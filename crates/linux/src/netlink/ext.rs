//! Route types beyond plain unicast (blackhole, on-link next hops), VXLAN device inspection and
//! IPIP tunnel creation: what the agent's route and tunnel reconcilers need.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use super::route::*;
use super::{
    Handle, Scope, check_ifname, deleted, family_of, ip_bytes, parse_ip, parse_link, parse_route,
};
use crate::error::{LinuxError, Result};

/// `RTN_BLACKHOLE`.
const RTN_BLACKHOLE: u8 = 6;
/// `RTNH_F_ONLINK` in `rtm_flags`: the gateway is reachable on the device without a covering
/// route (VXLAN and IPIP next hops are tunnel addresses / remote underlay addresses).
const RTNH_F_ONLINK: u32 = 4;
const IFLA_IPTUN_LOCAL: u16 = 2;

/// The type of a route tern manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    /// A normal route (`RTN_UNICAST`).
    Unicast,
    /// Drops the traffic (`RTN_BLACKHOLE`): own blocks, so unallocated addresses of a block
    /// this node owns are never sent back out of the node.
    Blackhole,
}

/// A route with type and on-link flag (a superset of [`super::RouteSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// Destination prefix.
    pub dst: IpNet,
    /// Unicast or blackhole.
    pub kind: RouteKind,
    /// Next hop, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index, if any.
    pub oif: Option<u32>,
    /// `onlink`: the gateway need not be covered by a connected route.
    pub onlink: bool,
    /// Scope.
    pub scope: Scope,
    /// Route protocol.
    pub protocol: u8,
    /// Routing table.
    pub table: u32,
}

/// Configuration of an existing VXLAN device, as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanInfo {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// VNI.
    pub vni: Option<u32>,
    /// UDP destination port.
    pub port: Option<u16>,
    /// Local (source) address.
    pub local: Option<IpAddr>,
    /// Hardware address.
    pub mac: Option<[u8; 6]>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up.
    pub up: bool,
}

impl From<&super::RouteSpec> for Route {
    fn from(r: &super::RouteSpec) -> Route {
        Route {
            dst: r.dst,
            kind: RouteKind::Unicast,
            gateway: r.gateway,
            oif: r.oif,
            onlink: false,
            scope: r.scope,
            protocol: r.protocol,
            table: r.table,
        }
    }
}

impl Handle {
    fn full_route_msg(&self, msg_type: u16, flags: u16, r: &Route) -> Msg {
        let ip = r.dst.addr();
        let table_byte = if r.table < 256 { r.table as u8 } else { 0 };
        let (rtype, scope) = match r.kind {
            RouteKind::Unicast => (RTN_UNICAST, r.scope),
            RouteKind::Blackhole => (RTN_BLACKHOLE, Scope::Universe),
        };
        let mut m = Msg::new(msg_type, flags);
        m.raw(&rtmsg(
            family_of(&ip),
            r.dst.prefix_len(),
            table_byte,
            r.protocol,
            scope.to_raw(),
            rtype,
            if r.onlink { RTNH_F_ONLINK } else { 0 },
        ));
        m.attr_u32(RTA_TABLE, r.table);
        if r.dst.prefix_len() > 0 {
            m.attr(RTA_DST, &ip_bytes(&r.dst.network()));
        }
        if r.kind == RouteKind::Unicast {
            if let Some(gw) = r.gateway {
                m.attr(RTA_GATEWAY, &ip_bytes(&gw));
            }
            if let Some(oif) = r.oif {
                m.attr_u32(RTA_OIF, oif);
            }
        }
        m
    }

    /// Sends `RTM_NEWROUTE` for `r` with `NLM_F_CREATE` and `flags` (`verb` names the
    /// operation in errors), after refusing a gateway of another family than the destination.
    fn new_route_full(&mut self, r: &Route, flags: u16, verb: &str) -> Result<()> {
        if r.gateway
            .is_some_and(|g| g.is_ipv4() != r.dst.addr().is_ipv4())
        {
            return Err(LinuxError::InvalidArgument(format!(
                "route {} has a gateway of another address family",
                r.dst
            )));
        }
        let mut m = self.full_route_msg(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | flags, r);
        self.sock
            .request_ack(&mut m, &|| format!("{verb} route {}", describe(r)))
    }

    /// Installs or replaces a route of any [`RouteKind`], honouring `onlink`.
    pub fn replace_route_full(&mut self, r: &Route) -> Result<()> {
        self.new_route_full(r, NLM_F_REPLACE, "replace")
    }

    /// Installs a route only when the kernel has none with the same destination, table, TOS
    /// and metric (`NLM_F_EXCL`); otherwise fails with an error that
    /// [`LinuxError::is_already_exists`] recognises. For callers that must never replace a
    /// route someone else installed.
    pub fn add_route_full(&mut self, r: &Route) -> Result<()> {
        self.new_route_full(r, NLM_F_EXCL, "add")
    }

    /// Deletes a route; `Ok(false)` when absent.
    pub fn delete_route_full(&mut self, r: &Route) -> Result<bool> {
        let mut m = self.full_route_msg(RTM_DELROUTE, NLM_F_ACK, r);
        deleted(
            self.sock
                .request_ack(&mut m, &|| format!("delete route {}", describe(r))),
        )
    }

    /// Unicast and blackhole routes of `table` (cache clones excluded).
    pub fn routes_full(&mut self, v6: bool, table: u32) -> Result<Vec<Route>> {
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
        let mut m = Msg::new(RTM_GETROUTE, NLM_F_DUMP);
        m.raw(&rtmsg(family, 0, 0, 0, 0, 0, 0));
        let replies = self.sock.request_dump(&mut m, &|| {
            format!("list IPv{} routes", if v6 { 6 } else { 4 })
        })?;
        Ok(replies
            .iter()
            .filter_map(|r| parse_route(&r.payload))
            .filter_map(|(r, rtype, flags)| {
                let kind = match rtype {
                    RTN_UNICAST => RouteKind::Unicast,
                    RTN_BLACKHOLE => RouteKind::Blackhole,
                    _ => return None,
                };
                if r.table != table || flags & RTM_F_CLONED != 0 {
                    return None;
                }
                Some(Route {
                    dst: r.dst,
                    kind,
                    gateway: r.gateway,
                    oif: r.oif,
                    onlink: flags & RTNH_F_ONLINK != 0,
                    scope: r.scope,
                    protocol: r.protocol,
                    table: r.table,
                })
            })
            .collect())
    }

    /// Every VXLAN device of this namespace with its VNI, port and local address.
    pub fn vxlan_devices(&mut self) -> Result<Vec<VxlanInfo>> {
        let mut m = Msg::new(RTM_GETLINK, NLM_F_DUMP);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        let replies = self
            .sock
            .request_dump(&mut m, &|| "list links".to_string())?;
        let mut out = Vec::new();
        for r in replies.iter().filter(|r| r.msg_type == RTM_NEWLINK) {
            let link = parse_link(&r.payload)?;
            if link.kind.as_deref() != Some("vxlan") {
                continue;
            }
            let mut info = VxlanInfo {
                index: link.index,
                name: link.name,
                vni: None,
                port: None,
                local: None,
                mac: link.mac,
                mtu: link.mtu,
                up: link.up,
            };
            let linkinfo = attrs(&r.payload[16..]).find(|(k, _)| *k == IFLA_LINKINFO);
            if let Some((_, li)) = linkinfo
                && let Some((_, data)) = attrs(li).find(|(k, _)| *k == IFLA_INFO_DATA)
            {
                for (k, v) in attrs(data) {
                    match k {
                        IFLA_VXLAN_ID => info.vni = read_u32(v),
                        IFLA_VXLAN_PORT if v.len() >= 2 => {
                            info.port = Some(u16::from_be_bytes([v[0], v[1]]))
                        }
                        IFLA_VXLAN_LOCAL | IFLA_VXLAN_LOCAL6 => info.local = parse_ip(v),
                        _ => {}
                    }
                }
            }
            out.push(info);
        }
        Ok(out)
    }

    /// Creates an IPIP tunnel device (`kind ipip`), down. On kernels without IPIP support the
    /// kernel answers EOPNOTSUPP (or "unknown device type"); see [`LinuxError::is_unsupported`].
    pub fn create_ipip(&mut self, name: &str, local: Option<Ipv4Addr>) -> Result<()> {
        check_ifname(name)?;
        let mut m = Msg::new(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
        m.raw(&ifinfomsg(libc::AF_UNSPEC as u8, 0, 0, 0));
        m.attr_str(IFLA_IFNAME, name);
        m.begin_nest(IFLA_LINKINFO);
        m.attr_str(IFLA_INFO_KIND, "ipip");
        if let Some(l) = local {
            m.begin_nest(IFLA_INFO_DATA);
            m.attr(IFLA_IPTUN_LOCAL, &l.octets());
            m.end_nest();
        }
        m.end_nest();
        self.sock
            .request_ack(&mut m, &|| format!("create ipip link {name}"))
    }
}

impl LinuxError {
    /// True when the kernel lacks support for what was asked (no module for a link kind):
    /// EOPNOTSUPP, or "Unknown device type" as rtnetlink reports a missing link kind.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.errno(),
            Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT) | Some(libc::EAFNOSUPPORT)
        ) || self.to_string().contains("Unknown device type")
    }
}

/// `r` as `ip route` would show it, for error contexts.
pub(crate) fn describe(r: &Route) -> String {
    let mut s = match r.kind {
        RouteKind::Blackhole => format!("blackhole {}", r.dst),
        RouteKind::Unicast => r.dst.to_string(),
    };
    if let Some(gw) = r.gateway {
        s.push_str(&format!(" via {gw}"));
    }
    if let Some(oif) = r.oif {
        s.push_str(&format!(" dev index {oif}"));
    }
    if r.onlink {
        s.push_str(" onlink");
    }
    s.push_str(&format!(" proto {} table {}", r.protocol, r.table));
    s
}
