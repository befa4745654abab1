//! What an allocation decides on besides blocks: the pools, the IPAM configuration, the
//! node's labels and reservations ([`Policy`]), with the revisions that guard it; which
//! ordinals may be handed out ([`Filter`]).

use std::collections::BTreeMap;
use std::time::Instant;

use ipnet::IpNet;
use tern_model::{AllowedUse, IpPoolSpec, IpamConfigSpec, Selector};
use tern_store::{Compare, keys};

use crate::block::Block;

/// Everything automatic assignment decides on besides blocks, with the `mod_revision`s that
/// guard it.
pub(crate) struct Policy {
    pub(crate) pools: Vec<Pool>,
    pub(crate) cfg: IpamConfigSpec,
    /// `mod_revision` of the IPAM configuration, 0 when none is stored.
    pub(crate) cfg_rev: i64,
    pub(crate) labels: Option<BTreeMap<String, String>>,
    /// Key and `mod_revision` of the node's Node resource (0 = none).
    pub(crate) node_key: String,
    pub(crate) node_rev: i64,
    pub(crate) reserved: Vec<IpNet>,
    pub(crate) read_at: Instant,
}

/// Which free ordinals automatic assignment may hand out, decided once per request.
pub(crate) struct Filter {
    /// `IPReservation` networks: never handed out automatically.
    pub(crate) reserved: Vec<IpNet>,
    pub(crate) cooldown: u64,
    pub(crate) now: u64,
}

impl Filter {
    pub(crate) fn usable(
        &self,
        cidr: &IpNet,
        released_at: &BTreeMap<u32, u64>,
        ordinal: u32,
    ) -> bool {
        if let Some(&t) = released_at.get(&ordinal)
            && t.saturating_add(self.cooldown) > self.now
        {
            return false;
        }
        if self.reserved.is_empty() {
            return true;
        }
        let ip = Block::new_view(cidr).ip(ordinal);
        !self.reserved.iter().any(|r| r.contains(&ip))
    }
}

/// Everything one automatic assignment decides on up front.
pub(crate) struct Cx<'a> {
    pub(crate) pools: &'a [Pool],
    pub(crate) cfg: &'a IpamConfigSpec,
    pub(crate) labels: Option<&'a BTreeMap<String, String>>,
    pub(crate) filter: &'a Filter,
    pub(crate) policy: &'a Policy,
}

impl Cx<'_> {
    /// The compares that keep an allocation in `block` from committing under a policy that
    /// has changed since it was read (see "Caching" on [`Ipam`]).
    pub(crate) fn guards(&self, block: &IpNet) -> Vec<Compare> {
        let p = self.policy;
        let mut g = vec![
            Compare::ModRevision(keys::IPAM_CONFIG.to_string(), p.cfg_rev),
            Compare::ModRevision(p.node_key.clone(), p.node_rev),
        ];
        if let Some(pool) = p.pools.iter().find(|x| x.net.contains(block)) {
            g.push(Compare::ModRevision(pool.key.clone(), pool.rev));
        }
        g
    }
}

/// A pool that has been parsed and checked once.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) name: String,
    pub(crate) net: IpNet,
    pub(crate) spec: IpPoolSpec,
    /// Store key and `mod_revision` of the IPPool, to guard allocations from it.
    pub(crate) key: String,
    pub(crate) rev: i64,
}

impl Pool {
    /// Enabled, allowed for workloads, and its node selector selects the node. `labels` is
    /// `None` when the node has no Node resource: then only `all()` pools qualify, since
    /// nothing is known about the node. A selector that does not parse selects nothing.
    pub(crate) fn workload_usable(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        !self.spec.disabled
            && self.spec.allowed_uses.contains(&AllowedUse::Workload)
            && match Selector::parse(&self.spec.node_selector) {
                Ok(sel) => match labels {
                    Some(l) => sel.matches(l),
                    None => sel.is_all(),
                },
                Err(_) => false,
            }
    }
}
