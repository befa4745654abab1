//! Write-time validation, with Calico's rules for IP pools.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::ModelError;
use crate::resources::{
    EncapMode, IpPool, IpReservation, IpamConfig, Kind, Node, ObjectMeta, Resource,
    WorkloadEndpoint,
};
use crate::selector::Selector;

/// Checks that `name` is a DNS-1123 subdomain: at most 253 characters of lowercase
/// alphanumerics, `-` and `.`, starting and ending with an alphanumeric.
pub fn validate_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let first = name.chars().next().unwrap_or('-');
    let last = name.chars().last().unwrap_or('-');
    if !name.chars().all(ok_char) || !alnum(first) || !alnum(last) {
        return Err(format!(
            "{name:?} is not a valid DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

struct Ctx<'a> {
    kind: Kind,
    name: &'a str,
}

impl Ctx<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            kind: self.kind.as_str(),
            name: self.name.to_string(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

pub(crate) fn validate(r: &Resource) -> Result<(), ModelError> {
    let cx = Ctx {
        kind: r.kind(),
        name: r.name(),
    };
    validate_meta(&cx, r.metadata())?;
    match r {
        Resource::IpPool(p) => validate_ip_pool(&cx, p),
        Resource::IpamConfig(c) => validate_ipam_config(&cx, c),
        Resource::Node(n) => validate_node(&cx, n),
        Resource::WorkloadEndpoint(w) => validate_wep(&cx, w),
        Resource::IpReservation(r) => validate_ip_reservation(&cx, r),
        Resource::NetworkPolicy(p) => {
            crate::policy::validate_tern_spec(&p.spec).map_err(|(f, m)| cx.err(&f, m))
        }
        Resource::GlobalNetworkPolicy(p) => {
            crate::policy::validate_tern_spec(&p.spec.0).map_err(|(f, m)| cx.err(&f, m))
        }
        Resource::K8sNetworkPolicy(p) => {
            crate::policy::validate_k8s_spec(&p.spec).map_err(|(f, m)| cx.err(&f, m))
        }
        Resource::Namespace(_) => Ok(()),
        Resource::BgpConfiguration(c) => {
            crate::bgp::validate_configuration(c).map_err(|(f, m)| cx.err(&f, m))
        }
        Resource::BgpPeer(p) => crate::bgp::validate_peer(p).map_err(|(f, m)| cx.err(&f, m)),
    }
}

fn validate_meta(cx: &Ctx, m: &ObjectMeta) -> Result<(), ModelError> {
    validate_dns1123_subdomain(&m.name).map_err(|e| cx.err("metadata.name", e))?;
    match (&m.namespace, cx.kind.namespaced()) {
        (None, true) => Err(cx.err(
            "metadata.namespace",
            format!("{} is namespaced; a namespace is required", cx.kind),
        )),
        (Some(ns), true) => {
            validate_dns1123_subdomain(ns).map_err(|e| cx.err("metadata.namespace", e))
        }
        (Some(_), false) => Err(cx.err(
            "metadata.namespace",
            format!("{} is cluster-scoped; remove the namespace", cx.kind),
        )),
        (None, false) => Ok(()),
    }
}

fn link_local(net: &IpNet) -> IpNet {
    match net {
        IpNet::V4(_) => "169.254.0.0/16".parse().expect("valid literal"),
        IpNet::V6(_) => "fe80::/10".parse().expect("valid literal"),
    }
}

fn nets_overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Parses a pool CIDR the way validation does: it must be a network address.
fn parse_pool_cidr(cidr: &str) -> Result<IpNet, String> {
    let net: IpNet = cidr
        .parse()
        .map_err(|_| format!("{cidr:?} is not a CIDR (expected e.g. 10.244.0.0/16)"))?;
    if net.trunc() != net {
        return Err(format!(
            "{cidr} is not a network address; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

fn validate_ip_pool(cx: &Ctx, p: &IpPool) -> Result<(), ModelError> {
    let s = &p.spec;
    let net = parse_pool_cidr(&s.cidr).map_err(|e| cx.err("spec.cidr", e))?;
    let ll = link_local(&net);
    if nets_overlap(&net, &ll) {
        return Err(cx.err(
            "spec.cidr",
            format!("{net} overlaps the link-local range {ll}"),
        ));
    }
    let (lo, hi) = match net {
        IpNet::V4(_) => (20, 32),
        IpNet::V6(_) => (116, 128),
    };
    if !(lo..=hi).contains(&s.block_size) {
        return Err(cx.err(
            "spec.blockSize",
            format!(
                "{} is out of range for {net} (must be {lo}..={hi})",
                s.block_size
            ),
        ));
    }
    if s.block_size < net.prefix_len() {
        return Err(cx.err(
            "spec.blockSize",
            format!(
                "{} is smaller than the pool's prefix length {}: a block must fit in the pool",
                s.block_size,
                net.prefix_len()
            ),
        ));
    }
    if s.ipip_mode != EncapMode::Never && matches!(net, IpNet::V6(_)) {
        return Err(cx.err("spec.ipipMode", "IPIP is not supported on IPv6 pools"));
    }
    if s.ipip_mode != EncapMode::Never && s.vxlan_mode != EncapMode::Never {
        return Err(cx.err(
            "spec.vxlanMode",
            "a pool cannot use both IPIP and VXLAN; set one of them to Never",
        ));
    }
    if s.node_selector.trim().is_empty() {
        return Err(cx.err(
            "spec.nodeSelector",
            "must not be empty (use \"all()\" to select every node)",
        ));
    }
    Selector::parse(&s.node_selector).map_err(|e| cx.err("spec.nodeSelector", e.to_string()))?;
    Ok(())
}

fn validate_ip_reservation(cx: &Ctx, r: &IpReservation) -> Result<(), ModelError> {
    if r.spec.reserved_cidrs.is_empty() {
        return Err(cx.err("spec.reservedCIDRs", "must list at least one CIDR"));
    }
    for (i, c) in r.spec.reserved_cidrs.iter().enumerate() {
        let field = format!("spec.reservedCIDRs[{i}]");
        if c.parse::<IpAddr>().is_ok() {
            continue;
        }
        parse_pool_cidr(c).map_err(|e| cx.err(&field, e))?;
    }
    Ok(())
}

/// Returns a description of the first pool in `others` (other than `pool` itself, by name)
/// whose CIDR overlaps `pool`'s, or `None`. Pools with unparseable CIDRs are ignored here;
/// [`Resource::validate`] reports those.
pub fn ip_pool_overlaps(pool: &IpPool, others: &[IpPool]) -> Option<String> {
    let net: IpNet = pool.spec.cidr.parse().ok()?;
    others
        .iter()
        .filter(|o| o.metadata.name != pool.metadata.name)
        .find_map(|o| {
            let on: IpNet = o.spec.cidr.parse().ok()?;
            nets_overlap(&net, &on).then(|| {
                format!(
                    "IPPool {:?} ({net}) overlaps IPPool {:?} ({on})",
                    pool.metadata.name, o.metadata.name
                )
            })
        })
}

fn validate_ipam_config(cx: &Ctx, c: &IpamConfig) -> Result<(), ModelError> {
    if cx.name != "default" {
        return Err(cx.err(
            "metadata.name",
            "the IPAM configuration is a singleton and must be named \"default\"",
        ));
    }
    // Calico caps the cooldown at 20 minutes: longer only starves small pools.
    if c.spec.release_cooldown_seconds > 1200 {
        return Err(cx.err(
            "spec.releaseCooldownSeconds",
            format!(
                "{} is more than the maximum 1200",
                c.spec.release_cooldown_seconds
            ),
        ));
    }
    Ok(())
}

fn ip_or_cidr(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok() || s.parse::<IpNet>().is_ok()
}

fn validate_node(cx: &Ctx, n: &Node) -> Result<(), ModelError> {
    for (i, a) in n.spec.addresses.iter().enumerate() {
        if !ip_or_cidr(&a.address) {
            return Err(cx.err(
                &format!("spec.addresses[{i}].address"),
                format!("{:?} is not an IP address", a.address),
            ));
        }
    }
    for (i, c) in n.spec.pod_cidrs.iter().flatten().enumerate() {
        if c.parse::<IpNet>().is_err() {
            return Err(cx.err(
                &format!("spec.podCIDRs[{i}]"),
                format!("{c:?} is not a CIDR"),
            ));
        }
    }
    if let Some(bgp) = &n.spec.bgp {
        if let Some(id) = &bgp.route_reflector_cluster_id
            && id.parse::<std::net::Ipv4Addr>().is_err()
        {
            return Err(cx.err(
                "spec.bgp.routeReflectorClusterID",
                format!("{id:?} is not an IPv4 address"),
            ));
        }
        if bgp.as_number == Some(0) {
            return Err(cx.err("spec.bgp.asNumber", "AS 0 is reserved"));
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
                    return Err(cx.err(
                        field,
                        format!("{v:?} is not an IPv{} address", if want_v4 { 4 } else { 6 }),
                    ));
                }
            }
        }
    }
    if let Some(a) = &n.spec.ipv4_vxlan_tunnel_addr
        && a.parse::<std::net::Ipv4Addr>().is_err()
    {
        return Err(cx.err(
            "spec.ipv4VXLANTunnelAddr",
            format!("{a:?} is not an IPv4 address"),
        ));
    }
    if let Some(m) = &n.spec.vxlan_tunnel_mac_addr
        && !valid_mac(m)
    {
        return Err(cx.err(
            "spec.vxlanTunnelMACAddr",
            format!("{m:?} is not a MAC address"),
        ));
    }
    Ok(())
}

fn valid_mac(m: &str) -> bool {
    let parts: Vec<_> = m.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn validate_wep(cx: &Ctx, w: &WorkloadEndpoint) -> Result<(), ModelError> {
    let s = &w.spec;
    if s.node.is_empty() {
        return Err(cx.err("spec.node", "must not be empty"));
    }
    if s.pod.is_empty() {
        return Err(cx.err("spec.pod", "must not be empty"));
    }
    for (i, n) in s.ip_networks.iter().enumerate() {
        if n.parse::<IpNet>().is_err() {
            return Err(cx.err(
                &format!("spec.ipNetworks[{i}]"),
                format!("{n:?} is not a CIDR (expected e.g. 10.244.0.5/32)"),
            ));
        }
    }
    if !s.mac.is_empty() && !valid_mac(&s.mac) {
        return Err(cx.err("spec.mac", format!("{:?} is not a MAC address", s.mac)));
    }
    for (i, p) in s.ports.iter().enumerate() {
        crate::policy::validate_port_name(&p.name)
            .map_err(|e| cx.err(&format!("spec.ports[{i}].name"), e))?;
    }
    if s.interface_name.len() > 15 {
        return Err(cx.err(
            "spec.interfaceName",
            format!("{:?} is longer than 15 characters", s.interface_name),
        ));
    }
    Ok(())
}
