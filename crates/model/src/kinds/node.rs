//! The `Node` kind: a node of the cluster, with its addresses, pod CIDRs, BGP settings and
//! VXLAN tunnel device. Written by each node's `ternd`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::validate::{FieldError, invalid, ip_or_cidr, valid_mac};

/// A node of the cluster.
pub type Node = Document<NodeSpec>;

/// One address of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAddress {
    pub address: String,
    /// `InternalIP`, `ExternalIP`, ... (free-form, as Calico).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// BGP settings of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBgpSpec {
    /// The node's IPv4 address with prefix length (`198.18.0.2/24`), as Calico.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<String>,
    /// The node's AS number; the cluster default applies when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// With a cluster ID (an IPv4 address) the node is a BGP route reflector (RFC 4456) and
    /// its mesh peers are its clients.
    #[serde(
        default,
        rename = "routeReflectorClusterID",
        skip_serializing_if = "Option::is_none"
    )]
    pub route_reflector_cluster_id: Option<String>,
}

/// Spec of a [`Node`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Option::is_none")]
    pub pod_cidrs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<NodeBgpSpec>,
    /// Address of the node's VXLAN device, allocated from a pool.
    #[serde(
        default,
        rename = "ipv4VXLANTunnelAddr",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv4_vxlan_tunnel_addr: Option<String>,
    /// MAC of the node's VXLAN device.
    #[serde(
        default,
        rename = "vxlanTunnelMACAddr",
        skip_serializing_if = "Option::is_none"
    )]
    pub vxlan_tunnel_mac_addr: Option<String>,
    /// Address of the node's IPv6 VXLAN device (`vxlan-v6.tern`), allocated from an IPv6 pool.
    #[serde(
        default,
        rename = "ipv6VXLANTunnelAddr",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv6_vxlan_tunnel_addr: Option<String>,
    /// MAC of the node's IPv6 VXLAN device.
    #[serde(
        default,
        rename = "vxlanTunnelMACAddrV6",
        skip_serializing_if = "Option::is_none"
    )]
    pub vxlan_tunnel_mac_addr_v6: Option<String>,
}

/// Write-time checks of a [`Node`].
pub(crate) fn validate_node(n: &Node) -> Result<(), FieldError> {
    for (i, a) in n.spec.addresses.iter().enumerate() {
        if !ip_or_cidr(&a.address) {
            return Err(invalid(
                format!("spec.addresses[{i}].address"),
                format!("{:?} is not an IP address", a.address),
            ));
        }
    }
    for (i, c) in n.spec.pod_cidrs.iter().flatten().enumerate() {
        if c.parse::<IpNet>().is_err() {
            return Err(invalid(
                format!("spec.podCIDRs[{i}]"),
                format!("{c:?} is not a CIDR"),
            ));
        }
    }
    if let Some(bgp) = &n.spec.bgp {
        if let Some(id) = &bgp.route_reflector_cluster_id
            && id.parse::<Ipv4Addr>().is_err()
        {
            return Err(invalid(
                "spec.bgp.routeReflectorClusterID",
                format!("{id:?} is not an IPv4 address"),
            ));
        }
        if bgp.as_number == Some(0) {
            return Err(invalid("spec.bgp.asNumber", "AS 0 is reserved"));
        }
        for (field, v, want_v4) in [
            ("spec.bgp.ipv4Address", &bgp.ipv4_address, true),
            ("spec.bgp.ipv6Address", &bgp.ipv6_address, false),
        ] {
            let Some(v) = v else { continue };
            let ip = v
                .parse::<IpNet>()
                .map(|n| n.addr())
                .or_else(|_| v.parse::<IpAddr>());
            match ip {
                Ok(ip) if ip.is_ipv4() == want_v4 => {}
                _ => {
                    return Err(invalid(
                        field,
                        format!("{v:?} is not an IPv{} address", if want_v4 { 4 } else { 6 }),
                    ));
                }
            }
        }
    }
    if let Some(a) = &n.spec.ipv4_vxlan_tunnel_addr
        && a.parse::<Ipv4Addr>().is_err()
    {
        return Err(invalid(
            "spec.ipv4VXLANTunnelAddr",
            format!("{a:?} is not an IPv4 address"),
        ));
    }
    if let Some(a) = &n.spec.ipv6_vxlan_tunnel_addr
        && a.parse::<Ipv6Addr>().is_err()
    {
        return Err(invalid(
            "spec.ipv6VXLANTunnelAddr",
            format!("{a:?} is not an IPv6 address"),
        ));
    }
    for (field, m) in [
        ("spec.vxlanTunnelMACAddr", &n.spec.vxlan_tunnel_mac_addr),
        (
            "spec.vxlanTunnelMACAddrV6",
            &n.spec.vxlan_tunnel_mac_addr_v6,
        ),
    ] {
        if let Some(m) = m
            && !valid_mac(m)
        {
            return Err(invalid(field, format!("{m:?} is not a MAC address")));
        }
    }
    Ok(())
}
