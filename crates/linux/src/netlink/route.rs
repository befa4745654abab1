//! rtnetlink (NETLINK_ROUTE), the family of links, addresses, routes and neighbours, on the
//! framing core ([`super::framing`]): its message types, attributes and fixed family
//! headers, and the socket [`super::Handle`] talks through.
//!
//! The layouts are the stable kernel UAPI (`linux/rtnetlink.h`, `linux/if_link.h`,
//! `linux/neighbour.h`); all integers are host-endian unless noted.

use std::os::fd::OwnedFd;

pub(crate) use super::framing::{
    Conn, MsgBuilder as Msg, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, attrs,
    open_bound, read_str, read_u32,
};
use crate::error::Result;

pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_DELLINK: u16 = 17;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWADDR: u16 = 20;
pub(crate) const RTM_GETADDR: u16 = 22;
pub(crate) const RTM_NEWROUTE: u16 = 24;
pub(crate) const RTM_DELROUTE: u16 = 25;
pub(crate) const RTM_GETROUTE: u16 = 26;
pub(crate) const RTM_NEWNEIGH: u16 = 28;
pub(crate) const RTM_DELNEIGH: u16 = 29;
pub(crate) const RTM_GETNEIGH: u16 = 30;

pub(crate) const IFLA_ADDRESS: u16 = 1;
pub(crate) const IFLA_IFNAME: u16 = 3;
pub(crate) const IFLA_MTU: u16 = 4;
pub(crate) const IFLA_LINK: u16 = 5;
pub(crate) const IFLA_MASTER: u16 = 10;
pub(crate) const IFLA_LINKINFO: u16 = 18;
pub(crate) const IFLA_NET_NS_FD: u16 = 28;
pub(crate) const IFLA_LINK_NETNSID: u16 = 37;
pub(crate) const IFLA_INFO_KIND: u16 = 1;
pub(crate) const IFLA_INFO_DATA: u16 = 2;
pub(crate) const VETH_INFO_PEER: u16 = 1;
pub(crate) const IFLA_VXLAN_ID: u16 = 1;
pub(crate) const IFLA_VXLAN_LINK: u16 = 3;
pub(crate) const IFLA_VXLAN_LOCAL: u16 = 4;
pub(crate) const IFLA_VXLAN_LEARNING: u16 = 7;
pub(crate) const IFLA_VXLAN_PORT: u16 = 15;
pub(crate) const IFLA_VXLAN_LOCAL6: u16 = 17;
pub(crate) const IFF_UP: u32 = 0x1;

pub(crate) const IFA_ADDRESS: u16 = 1;
pub(crate) const IFA_LOCAL: u16 = 2;
pub(crate) const IFA_FLAGS: u16 = 8;
pub(crate) const IFA_F_NODAD: u32 = 0x02;

pub(crate) const RTA_DST: u16 = 1;
pub(crate) const RTA_OIF: u16 = 4;
pub(crate) const RTA_GATEWAY: u16 = 5;
pub(crate) const RTA_TABLE: u16 = 15;
pub(crate) const RTN_UNICAST: u8 = 1;
pub(crate) const RTM_F_CLONED: u32 = 0x200;

pub(crate) const NDA_DST: u16 = 1;
pub(crate) const NDA_LLADDR: u16 = 2;
pub(crate) const NUD_PERMANENT: u16 = 0x80;
pub(crate) const NTF_SELF: u8 = 0x02;

/// `struct ifinfomsg`.
pub(crate) fn ifinfomsg(family: u8, index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = family;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `struct ifaddrmsg`.
pub(crate) fn ifaddrmsg(family: u8, prefix_len: u8, flags: u8, scope: u8, index: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = family;
    b[1] = prefix_len;
    b[2] = flags;
    b[3] = scope;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b
}

/// `struct rtmsg`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rtmsg(
    family: u8,
    dst_len: u8,
    table: u8,
    protocol: u8,
    scope: u8,
    rtype: u8,
    flags: u32,
) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[1] = dst_len;
    b[4] = table;
    b[5] = protocol;
    b[6] = scope;
    b[7] = rtype;
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b
}

/// `struct ndmsg`.
pub(crate) fn ndmsg(family: u8, index: u32, state: u16, flags: u8) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = family;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..10].copy_from_slice(&state.to_ne_bytes());
    b[10] = flags;
    b
}

/// A blocking NETLINK_ROUTE socket, bound in the network namespace of the creating thread.
pub(crate) type Socket = Conn<OwnedFd>;

/// Opens the rtnetlink socket of the calling thread's network namespace.
pub(crate) fn socket() -> Result<Socket> {
    Ok(Conn::new(open_bound(libc::NETLINK_ROUTE, "rtnetlink")?))
}
