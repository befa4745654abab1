//! natOutgoing: masquerade traffic from a natOutgoing pool to destinations outside every pool.
//!
//! Everything lives in the nftables table `inet tern`, the only table tern writes. This module
//! owns the chain `nat-postrouting` and the sets `all-ipv4-pools`, `masq-ipv4-pools`,
//! `all-ipv6-pools`, `masq-ipv6-pools`, as typed values (`tern-nft`): with the policy engine
//! they are part of its table ([`chains`]); without it, [`changes`] flushes and refills only
//! those in one netlink transaction ([`apply`]), so chains other code adds to the table are
//! left alone.

use crate::snapshot::PoolInfo;
use tern_nft::{
    Addr, BaseChain, Chain, ChainPolicy, ChainType, Element, ElementChange, Family, Hook, Key,
    Match, Rule, Ruleset, Set, SetType, Stmt, TableChange,
};

/// Family and name of tern's nftables table.
pub const TABLE_FAMILY: &str = "inet";
/// Name of tern's nftables table.
pub const TABLE: &str = "tern";
/// The chain holding the masquerade rules.
pub const CHAIN: &str = "nat-postrouting";
/// The comment of the masquerade rules.
const COMMENT: &str = "tern natOutgoing";

/// The nat chain's declaration.
const NAT_BASE: BaseChain = BaseChain {
    chain_type: ChainType::Nat,
    hook: Hook::Postrouting,
    priority: 100,
    policy: ChainPolicy::Accept,
};

const FAMILIES: [(&str, Family); 2] = [("ipv4", Family::V4), ("ipv6", Family::V6)];

/// The pools' sets (`all-<fam>-pools`, `masq-<fam>-pools`) of one family, with their elements
/// in pool order.
fn pool_sets(pools: &[PoolInfo], fam: Family) -> [(String, Vec<Key>); 2] {
    let of_family = |p: &&PoolInfo| Family::of_net(&p.cidr) == fam;
    let all = pools
        .iter()
        .filter(of_family)
        .map(|p| Key::Net(p.cidr.trunc()))
        .collect();
    let masq = pools
        .iter()
        .filter(of_family)
        .filter(|p| p.nat_outgoing)
        .map(|p| Key::Net(p.cidr.trunc()))
        .collect();
    let fam = if fam == Family::V4 { "ipv4" } else { "ipv6" };
    [
        (format!("all-{fam}-pools"), all),
        (format!("masq-{fam}-pools"), masq),
    ]
}

/// `ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade comment "tern natOutgoing"`.
fn masquerade(fam: Family, name: &str) -> Rule {
    Rule::new(
        vec![
            Match::AddrInSet {
                addr: Addr::saddr(fam),
                negate: false,
                set: format!("masq-{name}-pools"),
            },
            Match::AddrInSet {
                addr: Addr::daddr(fam),
                negate: true,
                set: format!("all-{name}-pools"),
            },
        ],
        vec![Stmt::Masquerade],
    )
    .with_comment(COMMENT)
}

/// The changes that make tern's NAT state match `pools` (idempotent): the table, sets and
/// chain declared if absent, then the chain and sets flushed and refilled.
pub fn changes(pools: &[PoolInfo]) -> Vec<TableChange> {
    let set_type = |fam| SetType::addr(fam).auto_merge();
    let mut out = vec![TableChange::AddTable];
    for (name, fam) in FAMILIES {
        for set in ["all", "masq"] {
            out.push(TableChange::AddSet {
                name: format!("{set}-{name}-pools"),
                set_type: set_type(fam),
            });
        }
    }
    out.push(TableChange::AddBaseChain {
        name: CHAIN.into(),
        base: NAT_BASE,
    });
    out.push(TableChange::FlushChain(CHAIN.into()));
    for (name, fam) in FAMILIES {
        for set in ["all", "masq"] {
            out.push(TableChange::FlushSet {
                name: format!("{set}-{name}-pools"),
                set_type: set_type(fam),
            });
        }
    }
    for (name, fam) in FAMILIES {
        let [all, masq] = pool_sets(pools, fam);
        let any_masq = !masq.1.is_empty();
        for (set, keys) in [all, masq] {
            out.extend(keys.into_iter().map(|key| {
                TableChange::Element(ElementChange {
                    set: set.clone(),
                    set_type: set_type(fam),
                    add: true,
                    element: Element { key, verdict: None },
                })
            }));
        }
        if any_masq {
            out.push(TableChange::AddRule {
                chain: CHAIN.into(),
                rule: masquerade(fam, name),
            });
        }
    }
    out
}

/// [`changes`] as an `nft -f` script.
pub fn ruleset(pools: &[PoolInfo]) -> String {
    tern_nft::render_changes(&changes(pools))
}

/// natOutgoing's chain and sets as part of the shared table's desired state, rendered together
/// with the policy chains (see [`crate::policy`]).
pub fn chains(pools: &[PoolInfo]) -> Ruleset {
    let mut rs = Ruleset::new();
    let mut rules = Vec::new();
    for (name, fam) in FAMILIES {
        let sets = pool_sets(pools, fam);
        let any_masq = !sets[1].1.is_empty();
        for (set, keys) in sets {
            let mut s = Set::new(SetType::addr(fam).auto_merge());
            keys.into_iter().for_each(|k| s.insert(k));
            rs.sets.insert(set, s);
        }
        if any_masq {
            rules.push(masquerade(fam, name));
        }
    }
    // No masquerading pool, no nat chain: a registered nat hook would put every forwarded
    // packet of the node through conntrack for nothing.
    if !rules.is_empty() {
        rs.chains.insert(
            CHAIN.into(),
            Chain {
                base: Some(NAT_BASE),
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
    fn replace_nat(&self, nat: Ruleset) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Applies `changes` (from [`changes`]) atomically to `nft` (the real one,
/// `tern_linux::kernel::SystemNft`, acts in the caller's network namespace): one netlink
/// batch; if the kernel refuses it, the same changes through `nft -f`.
pub fn apply(
    nft: &mut dyn tern_linux::kernel::NftApply,
    changes: &[TableChange],
) -> Result<(), tern_linux::LinuxError> {
    match nft.apply_changes(TABLE, changes) {
        Ok(()) => Ok(()),
        Err(e) => {
            log::warn!("natOutgoing: netlink update failed ({e}); retrying with nft -f");
            nft.apply_script(&tern_nft::render_changes(changes))
        }
    }
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
    fn standalone_script_text_is_pinned() {
        let r = ruleset(&[p("10.244.0.0/16", true), p("fd00::/64", true)]);
        assert_eq!(
            r,
            "add table inet tern\n\
             add set inet tern all-ipv4-pools { type ipv4_addr; flags interval; auto-merge; }\n\
             add set inet tern masq-ipv4-pools { type ipv4_addr; flags interval; auto-merge; }\n\
             add set inet tern all-ipv6-pools { type ipv6_addr; flags interval; auto-merge; }\n\
             add set inet tern masq-ipv6-pools { type ipv6_addr; flags interval; auto-merge; }\n\
             add chain inet tern nat-postrouting { type nat hook postrouting priority srcnat; policy accept; }\n\
             flush chain inet tern nat-postrouting\n\
             flush set inet tern all-ipv4-pools\n\
             flush set inet tern masq-ipv4-pools\n\
             flush set inet tern all-ipv6-pools\n\
             flush set inet tern masq-ipv6-pools\n\
             add element inet tern all-ipv4-pools { 10.244.0.0/16 }\n\
             add element inet tern masq-ipv4-pools { 10.244.0.0/16 }\n\
             add rule inet tern nat-postrouting ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade comment \"tern natOutgoing\"\n\
             add element inet tern all-ipv6-pools { fd00::/64 }\n\
             add element inet tern masq-ipv6-pools { fd00::/64 }\n\
             add rule inet tern nat-postrouting ip6 saddr @masq-ipv6-pools ip6 daddr != @all-ipv6-pools masquerade comment \"tern natOutgoing\"\n"
        );
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
