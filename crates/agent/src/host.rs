//! Host queries: the node's own interfaces, addresses and MTU as the kernel reports them, and
//! MAC address text. Plain functions over `tern-linux`, used by every layer above.

use ipnet::IpNet;
use std::net::IpAddr;
use tern_linux::netlink::Handle;

/// Errors of the host queries.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `--node-ip` names an address no local interface has.
    #[error("node address {0} is not configured on any interface of this node")]
    AddressNotLocal(IpAddr),
    /// Reading local interfaces failed.
    #[error("reading local interfaces: {0}")]
    Linux(#[from] tern_linux::LinuxError),
}

/// The local interface address (with prefix) equal to `ip`, or [`HostError::AddressNotLocal`].
pub fn local_address(ip: IpAddr) -> Result<IpNet, HostError> {
    let mut h = Handle::new()?;
    h.addresses(None)?
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.addr() == ip)
        .ok_or(HostError::AddressNotLocal(ip))
}

/// Every non-loopback interface network of this namespace, except tern's tunnel devices'
/// host addresses: the subnets CrossSubnet treats as "same subnet".
pub fn local_subnets() -> Result<Vec<IpNet>, HostError> {
    let mut h = Handle::new()?;
    Ok(h.addresses(None)?
        .into_iter()
        .map(|(_, a)| a)
        .filter(|a| !a.addr().is_loopback() && a.prefix_len() < a.max_prefix_len())
        .map(|a| a.trunc())
        .collect())
}

/// A netlink handle and the interface index of the default route, if there is one.
fn default_route_oif() -> Option<(Handle, u32)> {
    let mut h = Handle::new().ok()?;
    let default = h
        .routes(false)
        .ok()?
        .into_iter()
        .find(|r| r.dst.prefix_len() == 0)?;
    Some((h, default.oif?))
}

/// The MTU of the interface carrying the default route, 1500 when there is none.
pub fn detect_mtu() -> u32 {
    let detect = || -> Option<u32> {
        let (mut h, oif) = default_route_oif()?;
        let link = h.link_by_index(oif).ok()??;
        Some(link.mtu)
    };
    detect().unwrap_or(1500)
}

/// The addresses (with prefix) of the interface carrying the default route: the node's
/// underlay addresses.
pub fn node_addresses() -> Vec<IpNet> {
    let find = || -> Option<Vec<IpNet>> {
        let (mut h, oif) = default_route_oif()?;
        let addrs = h.addresses(Some(oif)).ok()?;
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
