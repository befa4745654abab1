//! Pod MTU: the underlay MTU minus the overhead of the encapsulation the pools use.

use crate::snapshot::PoolInfo;
use tern_model::EncapMode;

/// Bytes IPIP adds (outer IPv4 header).
pub const IPIP_OVERHEAD: u32 = 20;
/// Bytes VXLAN over IPv4 adds (outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8).
pub const VXLAN_OVERHEAD: u32 = 50;
/// Bytes VXLAN over IPv6 adds (the outer IPv6 header is 20 bytes larger).
pub const VXLAN_V6_OVERHEAD: u32 = 70;
/// Node annotation recording the pod MTU the node computed.
pub const MTU_ANNOTATION: &str = "tern.dev/pod-mtu";

/// The largest overhead of the encapsulations the pools enable (0 when none do): every pod
/// must fit the worst path it may take. `v6_underlay` selects VXLAN over IPv6; an IPv6 pool's
/// VXLAN always goes over IPv6 (`vxlan-v6.tern`).
pub fn encap_overhead(pools: &[PoolInfo], v6_underlay: bool) -> u32 {
    pools
        .iter()
        .map(|p| {
            if p.vxlan != EncapMode::Never {
                if v6_underlay || p.cidr.addr().is_ipv6() {
                    VXLAN_V6_OVERHEAD
                } else {
                    VXLAN_OVERHEAD
                }
            } else if p.ipip != EncapMode::Never {
                IPIP_OVERHEAD
            } else {
                0
            }
        })
        .max()
        .unwrap_or(0)
}

/// The pod MTU for an underlay MTU and the pools (never below the IPv4 minimum of 576... in
/// practice the underlay is far larger; the floor only guards against nonsense input).
pub fn pod_mtu(underlay_mtu: u32, pools: &[PoolInfo], v6_underlay: bool) -> u32 {
    underlay_mtu
        .saturating_sub(encap_overhead(pools, v6_underlay))
        .max(576)
}

/// Names and MTUs of other nodes whose recorded pod MTU differs from `mine`.
pub fn disagreeing<'a>(
    mine: u32,
    others: impl IntoIterator<Item = (&'a str, u32)>,
) -> Vec<(String, u32)> {
    others
        .into_iter()
        .filter(|(_, m)| *m != mine)
        .map(|(n, m)| (n.to_string(), m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(vxlan: EncapMode, ipip: EncapMode) -> PoolInfo {
        PoolInfo {
            name: "p".into(),
            cidr: "10.244.0.0/16".parse().unwrap(),
            vxlan,
            ipip,
            nat_outgoing: false,
            disabled: false,
        }
    }

    #[test]
    fn overheads() {
        use EncapMode::*;
        assert_eq!(pod_mtu(1500, &[p(Never, Never)], false), 1500);
        assert_eq!(pod_mtu(1500, &[p(Never, Always)], false), 1480);
        assert_eq!(pod_mtu(1500, &[p(Always, Never)], false), 1450);
        assert_eq!(pod_mtu(1500, &[p(CrossSubnet, Never)], true), 1430);
        assert_eq!(
            pod_mtu(9000, &[p(Never, CrossSubnet), p(Always, Never)], false),
            8950
        );
        assert_eq!(pod_mtu(1500, &[], false), 1500);
    }

    /// An IPv6 pool with VXLAN rides `vxlan-v6.tern` (70 bytes) even when the node's first
    /// underlay address is IPv4; beside an IPv4 VXLAN pool the larger overhead wins.
    #[test]
    fn an_ipv6_vxlan_pool_costs_70_bytes() {
        use EncapMode::*;
        let v6 = |vxlan| PoolInfo {
            cidr: "fd00:10:244::/48".parse().unwrap(),
            ..p(vxlan, Never)
        };
        assert_eq!(pod_mtu(1500, &[v6(Always)], false), 1430);
        assert_eq!(
            pod_mtu(1500, &[p(Always, Never), v6(CrossSubnet)], false),
            1430
        );
        assert_eq!(pod_mtu(1500, &[p(Always, Never), v6(Never)], false), 1450);
        assert_eq!(pod_mtu(9000, &[v6(Never)], true), 9000);
    }

    #[test]
    fn disagreement() {
        let d = disagreeing(1450, [("a", 1450), ("b", 1480)]);
        assert_eq!(d, vec![("b".to_string(), 1480)]);
    }
}
