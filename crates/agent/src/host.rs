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

/// A netlink handle and the interface index of the default route, if there is one: the IPv4
/// default route's, else (an IPv6-only node) the IPv6 one's.
fn default_route_oif() -> Option<(Handle, u32)> {
    let mut h = Handle::new().ok()?;
    let oif = default_oif(&mut h, false).or_else(|| default_oif(&mut h, true))?;
    Some((h, oif))
}

/// The interface index of the default route of one family (`v6`), if there is one.
fn default_oif(h: &mut Handle, v6: bool) -> Option<u32> {
    h.routes(v6)
        .ok()?
        .into_iter()
        .find(|r| r.dst.prefix_len() == 0)?
        .oif
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

/// The node's underlay addresses (with prefix): those of the interface carrying the IPv4
/// default route, and the IPv6 ones of the interface carrying the IPv6 default route when
/// that is another interface (an IPv6-only node has only the latter), IPv4 first; loopback
/// and link-local addresses excluded, as Calico's autodetection does.
pub fn node_addresses() -> Vec<IpNet> {
    let find = || -> Option<Vec<IpNet>> {
        let mut h = Handle::new().ok()?;
        let v4_oif = default_oif(&mut h, false);
        let v6_oif = default_oif(&mut h, true).filter(|o| Some(*o) != v4_oif);
        let mut out: Vec<IpNet> = Vec::new();
        for (oif, only_v6) in [(v4_oif, false), (v6_oif, true)] {
            let Some(oif) = oif else { continue };
            out.extend(
                h.addresses(Some(oif))
                    .ok()?
                    .into_iter()
                    .map(|(_, a)| a)
                    .filter(|a| (!only_v6 || a.addr().is_ipv6()) && underlay_candidate(&a.addr())),
            );
        }
        out.sort_by_key(|a| a.addr().is_ipv6());
        Some(out)
    };
    find().unwrap_or_default()
}

/// Whether `ip` can be a node's underlay address: neither loopback nor link-local (an
/// `fe80::/10` address exists on every IPv6 interface and means nothing off the link).
pub fn underlay_candidate(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !a.is_loopback() && !a.is_link_local(),
        IpAddr::V6(a) => !a.is_loopback() && !a.is_unicast_link_local(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `ip ARGS` (split at spaces); it forks from this thread, so it runs in the test's
    /// private namespace.
    fn ip(args: &str) {
        let out = std::process::Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .unwrap();
        assert!(out.status.success(), "ip {args}: {out:?}");
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// An IPv6-only node finds its IPv6 address (over the IPv6 default route), a dual-stack
    /// node both, IPv4 first; never the link-local address every IPv6 interface has.
    #[test]
    fn node_addresses_of_ipv6_only_and_dual_stack_nodes() {
        crate::testutil::in_new_netns(|h, here| {
            h.create_veth("ul0", "ul1", here.as_fd(), 0).unwrap();
            ip("link set ul0 up");
            ip("link set ul1 up");
            assert_eq!(node_addresses(), Vec::<IpNet>::new());
            ip("-6 addr add 2001:db8::11/64 dev ul0 nodad");
            ip("-6 route add default via 2001:db8::1 dev ul0");
            assert_eq!(node_addresses(), [net("2001:db8::11/64")]);
            ip("addr add 198.18.0.11/24 dev ul0");
            ip("route add default via 198.18.0.1");
            let dual = [net("198.18.0.11/24"), net("2001:db8::11/64")];
            assert_eq!(node_addresses(), dual);
            // The IPv6 default route through another interface: its IPv6 address counts.
            ip("-6 route del default");
            ip("-6 addr del 2001:db8::11/64 dev ul0");
            ip("-6 addr add 2001:db8:5::11/64 dev ul1 nodad");
            ip("-6 route add default via 2001:db8:5::1 dev ul1");
            let other = [net("198.18.0.11/24"), net("2001:db8:5::11/64")];
            assert_eq!(node_addresses(), other);
            assert!(!underlay_candidate(&"fe80::1".parse().unwrap()));
            assert!(underlay_candidate(&"2001:db8::1".parse().unwrap()));
        });
    }
}
