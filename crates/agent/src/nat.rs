//! natOutgoing: masquerade traffic from a natOutgoing pool to destinations outside every pool.
//!
//! Everything lives in the nftables table `inet tern`, the only table tern writes. This module
//! owns the chain `nat-postrouting` and the sets `all-ipv4-pools`, `masq-ipv4-pools`,
//! `all-ipv6-pools`, `masq-ipv6-pools`; it flushes and refills only those, in one `nft -f -`
//! transaction, so chains other code adds to the table (policy) are left alone.

use crate::snapshot::PoolInfo;
use ipnet::IpNet;
use std::fmt::Write;

/// Family and name of tern's nftables table.
pub const TABLE_FAMILY: &str = "inet";
/// Name of tern's nftables table.
pub const TABLE: &str = "tern";
/// The chain holding the masquerade rules.
pub const CHAIN: &str = "nat-postrouting";

/// The nft script that makes tern's NAT state match `pools` (idempotent).
pub fn ruleset(pools: &[PoolInfo]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "add table {TABLE_FAMILY} {TABLE}");
    for (fam, ty) in [("ipv4", "ipv4_addr"), ("ipv6", "ipv6_addr")] {
        for set in ["all", "masq"] {
            let _ = writeln!(
                s,
                "add set {TABLE_FAMILY} {TABLE} {set}-{fam}-pools {{ type {ty}; flags interval; auto-merge; }}"
            );
        }
    }
    let _ = writeln!(
        s,
        "add chain {TABLE_FAMILY} {TABLE} {CHAIN} {{ type nat hook postrouting priority srcnat; policy accept; }}"
    );
    let _ = writeln!(s, "flush chain {TABLE_FAMILY} {TABLE} {CHAIN}");
    for fam in ["ipv4", "ipv6"] {
        for set in ["all", "masq"] {
            let _ = writeln!(s, "flush set {TABLE_FAMILY} {TABLE} {set}-{fam}-pools");
        }
    }
    for (fam, v4) in [("ipv4", true), ("ipv6", false)] {
        let of_family = |p: &&PoolInfo| p.cidr.addr().is_ipv4() == v4;
        let all: Vec<IpNet> = pools.iter().filter(of_family).map(|p| p.cidr).collect();
        let masq: Vec<IpNet> = pools
            .iter()
            .filter(of_family)
            .filter(|p| p.nat_outgoing)
            .map(|p| p.cidr)
            .collect();
        for (set, nets) in [("all", &all), ("masq", &masq)] {
            if !nets.is_empty() {
                let list: Vec<String> = nets.iter().map(|n| n.trunc().to_string()).collect();
                let _ = writeln!(
                    s,
                    "add element {TABLE_FAMILY} {TABLE} {set}-{fam}-pools {{ {} }}",
                    list.join(", ")
                );
            }
        }
        if !masq.is_empty() {
            let ipk = if v4 { "ip" } else { "ip6" };
            let _ = writeln!(
                s,
                "add rule {TABLE_FAMILY} {TABLE} {CHAIN} {ipk} saddr @masq-{fam}-pools {ipk} daddr != @all-{fam}-pools masquerade comment \"tern natOutgoing\""
            );
        }
    }
    s
}

/// natOutgoing's chain and sets as part of the shared table's desired state, rendered together
/// with the policy chains (see [`crate::policy`]).
pub fn chains(pools: &[PoolInfo]) -> tern_policy::Ruleset {
    let mut rs = tern_policy::Ruleset::new();
    let mut rules = Vec::new();
    for (fam, v4) in [("ipv4", true), ("ipv6", false)] {
        let ty = if v4 { "ipv4_addr" } else { "ipv6_addr" };
        let of_family = |p: &&PoolInfo| p.cidr.addr().is_ipv4() == v4;
        for set in ["all", "masq"] {
            let mut s = tern_policy::Set::new(format!("type {ty}; flags interval; auto-merge;"));
            for p in pools.iter().filter(of_family) {
                if set == "all" || p.nat_outgoing {
                    s.insert(p.cidr.trunc().to_string());
                }
            }
            rs.sets.insert(format!("{set}-{fam}-pools"), s);
        }
        if pools.iter().filter(of_family).any(|p| p.nat_outgoing) {
            let ipk = if v4 { "ip" } else { "ip6" };
            rules.push(format!(
                "{ipk} saddr @masq-{fam}-pools {ipk} daddr != @all-{fam}-pools masquerade comment \"tern natOutgoing\""
            ));
        }
    }
    // No masquerading pool, no nat chain: a registered nat hook would put every forwarded
    // packet of the node through conntrack for nothing.
    if !rules.is_empty() {
        rs.chains.insert(
            CHAIN.into(),
            tern_policy::Chain {
                base: Some("type nat hook postrouting priority srcnat; policy accept;".into()),
                rules,
            },
        );
    }
    rs
}

/// A table that renders natOutgoing's [`chains`] together with other chains (the policy
/// engine implements it): defined here so that the dataplane hands over its chains without
/// importing the engine, and the root wires the two.
pub trait NatTable: Send + Sync {
    /// Replaces natOutgoing's chains and sets in the table and applies it.
    fn replace_nat(
        &self,
        nat: tern_policy::Ruleset,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Applies [`ruleset`] atomically in the caller's network namespace.
pub fn apply(pools: &[PoolInfo]) -> Result<(), tern_linux::LinuxError> {
    tern_linux::nft::apply(&ruleset(pools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_model::EncapMode;

    fn p(cidr: &str, nat: bool) -> PoolInfo {
        PoolInfo {
            name: cidr.into(),
            cidr: cidr.parse().unwrap(),
            vxlan: EncapMode::Never,
            ipip: EncapMode::Never,
            nat_outgoing: nat,
            disabled: false,
        }
    }

    #[test]
    fn no_nat_chain_without_a_masquerading_pool() {
        // A registered nat hook would send every forwarded packet through conntrack.
        let rs = chains(&[p("10.244.0.0/16", false)]);
        assert!(rs.chains.is_empty(), "{:?}", rs.chains.keys());
        let rs = chains(&[p("10.244.0.0/16", true)]);
        assert_eq!(rs.chains.len(), 1);
    }

    #[test]
    fn masquerades_only_nat_pools_to_outside_every_pool() {
        let r = ruleset(&[
            p("10.244.0.0/16", true),
            p("10.96.0.0/16", false),
            p("fd00::/64", false),
        ]);
        assert!(
            r.contains("add element inet tern all-ipv4-pools { 10.244.0.0/16, 10.96.0.0/16 }"),
            "{r}"
        );
        assert!(
            r.contains("add element inet tern masq-ipv4-pools { 10.244.0.0/16 }"),
            "{r}"
        );
        assert!(
            r.contains("add element inet tern all-ipv6-pools { fd00::/64 }"),
            "{r}"
        );
        assert!(!r.contains("masq-ipv6-pools {  "), "{r}");
        assert!(r.contains(
            "add rule inet tern nat-postrouting ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade"
        ));
        assert!(
            !r.contains("ip6 saddr"),
            "no IPv6 nat pool, no IPv6 rule: {r}"
        );
        // Only tern's own chain and sets are flushed; the table itself is never deleted.
        assert!(!r.contains("delete"));
        assert!(r.contains("flush chain inet tern nat-postrouting"));
    }

    #[test]
    fn shared_table_form_matches_the_standalone_script() {
        let rs = chains(&[p("10.244.0.0/16", true), p("10.96.0.0/16", false)]);
        let full = rs.render_full();
        assert!(
            full.contains("add element inet tern all-ipv4-pools { 10.244.0.0/16, 10.96.0.0/16 }"),
            "{full}"
        );
        assert!(full.contains("add rule inet tern nat-postrouting ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade"), "{full}");
        assert!(
            full.contains("add chain inet tern nat-postrouting { type nat hook postrouting"),
            "{full}"
        );
        assert!(rs.sets["masq-ipv6-pools"].elements.is_empty());
    }

    #[test]
    fn no_nat_pool_leaves_the_chain_empty() {
        let r = ruleset(&[p("10.244.0.0/16", false)]);
        assert!(!r.contains("add rule"), "{r}");
    }
}
