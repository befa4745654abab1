//! Reading the policy (pools, node labels, reservations, the IPAM configuration) and
//! writing the configuration: the default pool, strict affinity, the migration lock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use ipnet::IpNet;
use tern_model::{IpPool, IpPoolSpec, IpamConfig, IpamConfigSpec, Kind, ModelError, Resource};
use tern_store::keys;

use crate::client::Ipam;
use crate::codec::resource_rev;
use crate::error::{IpamError, RETRIES, Result};
use crate::layout::family_of;
use crate::policy::{Policy, Pool};

impl Ipam {
    /// [`IpamError::Locked`] while the datastore is locked for a migration, read at most
    /// every policy TTL (allocations read it with their policy, and on a store with
    /// multi-key transactions their guard on the IPAM configuration's revision refuses an
    /// allocation decided before the lock).
    pub fn ensure_unlocked(&self) -> Result<()> {
        let ttl = self.policy_ttl;
        // The lock as last read, or with a policy read within the TTL (it holds the
        // configuration): no request of its own in the common case.
        let cached = self
            .with_cache(|c| {
                let from_policy = c
                    .policy
                    .values()
                    .filter(|p| p.read_at.elapsed() < ttl)
                    .max_by_key(|p| p.read_at)
                    .map(|p| (p.read_at, p.cfg.migration_lock.clone()));
                let own = c.lock.clone().filter(|(at, _)| at.elapsed() < ttl);
                match (own, from_policy) {
                    (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
                    (a, b) => a.or(b),
                }
            })
            .flatten();
        let lock = match cached {
            Some((_, l)) => l,
            None => {
                let l = self.config()?.migration_lock;
                self.with_cache(|c| c.lock = Some((Instant::now(), l.clone())));
                l
            }
        };
        match lock {
            Some(why) => Err(IpamError::Locked(why)),
            None => Ok(()),
        }
    }

    /// The policy for `node`: cached unless older than the TTL or `fresh` is asked for.
    /// The second value is true when the policy was read by this call.
    pub(crate) fn policy(&self, node: &str, fresh: bool) -> Result<(Arc<Policy>, bool)> {
        if !fresh
            && let Some(p) = self.with_cache(|c| c.policy.get(node).cloned()).flatten()
            && p.read_at.elapsed() < self.policy_ttl
        {
            return Ok((p, false));
        }
        let read_at = Instant::now();
        let pools = self.pools()?;
        let (cfg, cfg_rev) =
            match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                Some(r) => {
                    let rev = resource_rev(&r);
                    match r {
                        Resource::IpamConfig(c) => (c.spec, rev),
                        _ => (IpamConfigSpec::default(), rev),
                    }
                }
                None => (IpamConfigSpec::default(), 0),
            };
        let node_key = tern_model::resource_key(Kind::Node, None, node);
        let (labels, node_rev) =
            match tern_model::get_resource(&*self.store, Kind::Node, None, node)? {
                Some(r) => (Some(r.metadata().labels.clone()), resource_rev(&r)),
                None => (None, 0),
            };
        let p = Arc::new(Policy {
            pools,
            cfg,
            cfg_rev,
            labels,
            node_key,
            node_rev,
            reserved: self.reservations()?,
            read_at,
        });
        self.with_cache(|c| c.policy.insert(node.to_string(), p.clone()));
        Ok((p, true))
    }

    /// The node's labels from its Node resource (`metadata.labels`), `None` without one.
    pub(crate) fn node_labels(&self, node: &str) -> Result<Option<BTreeMap<String, String>>> {
        Ok(
            tern_model::get_resource(&*self.store, Kind::Node, None, node)?
                .map(|r| r.metadata().labels.clone()),
        )
    }

    /// Every reserved network of every `IPReservation` a daemon can read: one corrupt
    /// reservation (written past validation) is skipped with a warning naming its key rather
    /// than failing every assignment, the same read-path decision every daemon reader takes.
    pub(crate) fn reservations(&self) -> Result<Vec<IpNet>> {
        let mut out = Vec::new();
        for r in tern_model::list_resources_warn(&*self.store, Kind::IpReservation, "IPAM")? {
            if let Resource::IpReservation(r) = r {
                out.extend(r.spec.nets());
            }
        }
        Ok(out)
    }

    pub(crate) fn pools(&self) -> Result<Vec<Pool>> {
        let mut out = Vec::new();
        // A pool whose stored value cannot be used (oversized, corrupt, invalid: written past
        // validation) is skipped rather than failing every assignment. The decision is
        // `Resource::from_stored`'s, as for the dataplane and BGP, so a pool is allocated from
        // exactly when it is also routed; the agent's dataplane reports it with its key.
        let (pools, _unreadable) = tern_model::list_resources_skipping(&*self.store, Kind::IpPool)?;
        for r in pools {
            let rev = resource_rev(&r);
            if let Resource::IpPool(p) = r
                && let Some(net) = p.spec.net()
            {
                out.push(Pool {
                    key: tern_model::resource_key(Kind::IpPool, None, &p.metadata.name),
                    rev,
                    name: p.metadata.name,
                    net,
                    spec: p.spec,
                });
            }
        }
        Ok(out)
    }

    /// The cluster IPAM configuration (defaults when none is stored).
    pub fn config(&self) -> Result<IpamConfigSpec> {
        Ok(
            match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                Some(Resource::IpamConfig(c)) => c.spec,
                _ => IpamConfigSpec::default(),
            },
        )
    }

    /// Creates `default-ipv4-ippool` (or `default-ipv6-ippool` for an IPv6 CIDR) with the
    /// family's default block size when no IPPool exists; returns whether it was created. A
    /// pool smaller than the default block gets one block covering the whole pool.
    /// Pools of the other family do not count, so a dual-stack node can ensure one of each.
    pub fn ensure_default_pool(&self, cidr: &str) -> Result<bool> {
        let mut spec = IpPoolSpec::new(cidr);
        let family = spec.net().map(|n| family_of(&n));
        if self
            .pools()?
            .iter()
            .any(|p| Some(family_of(&p.net)) == family)
        {
            return Ok(false);
        }
        let name = match spec.net() {
            Some(IpNet::V6(_)) => tern_model::defaults::IPV6_POOL_NAME,
            _ => tern_model::defaults::IPV4_POOL_NAME,
        };
        if let Some(net) = spec.net() {
            spec.block_size = spec.block_size.max(net.prefix_len());
        }
        let mut pool = IpPool::new(name, spec);
        // Create-only: two agents starting together must not overwrite each other.
        pool.metadata.resource_version = Some("0".into());
        match tern_model::put_resource(&*self.store, &pool.into()) {
            Ok(_) => Ok(true),
            Err(ModelError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Stores the configuration (compare-and-swap on the stored revision, retried).
    pub fn put_config(&self, spec: &IpamConfigSpec) -> Result<()> {
        for _ in 0..RETRIES {
            let rv =
                match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                    Some(r) => r.metadata().resource_version.clone(),
                    None => Some("0".to_string()),
                };
            let mut c = IpamConfig::new("default", spec.clone());
            c.metadata.resource_version = rv;
            match tern_model::put_resource(&*self.store, &c.into()) {
                Ok(_) => return Ok(()),
                Err(ModelError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            key: keys::IPAM_CONFIG.to_string(),
        })
    }

    /// Sets or clears the migration lock (`IPAMConfig` `spec.migrationLock`, see
    /// [`IpamError::Locked`]), keeping the other fields: one compare-and-swap on the
    /// configuration as read, retried.
    pub fn set_migration_lock(&self, lock: Option<String>) -> Result<()> {
        for _ in 0..RETRIES {
            let (mut spec, rv) =
                match tern_model::get_resource(&*self.store, Kind::IpamConfig, None, "default")? {
                    Some(Resource::IpamConfig(c)) => (c.spec, c.metadata.resource_version),
                    Some(r) => (
                        IpamConfigSpec::default(),
                        r.metadata().resource_version.clone(),
                    ),
                    None => (IpamConfigSpec::default(), Some("0".to_string())),
                };
            spec.migration_lock = lock.clone();
            let mut c = IpamConfig::new("default", spec);
            c.metadata.resource_version = rv;
            match tern_model::put_resource(&*self.store, &c.into()) {
                Ok(_) => {
                    self.with_cache(|c| {
                        c.lock = None;
                        c.policy.clear();
                    });
                    return Ok(());
                }
                Err(ModelError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(IpamError::Contention {
            key: keys::IPAM_CONFIG.to_string(),
        })
    }

    /// `ipam configure`: sets `strictAffinity` and `maxBlocksPerHost`, keeping the other
    /// fields. Existing allocations stay valid either way (borrowed addresses are kept and
    /// still released normally).
    pub fn set_config(&self, strict_affinity: bool, max_blocks_per_host: u32) -> Result<()> {
        let mut spec = self.config()?;
        spec.strict_affinity = strict_affinity;
        spec.max_blocks_per_host = max_blocks_per_host;
        self.put_config(&spec)
    }

    /// Names of the pools usable for workloads on this node: enabled, `Workload` allowed,
    /// and `nodeSelector` matching the labels of the node's Node resource (without a Node
    /// resource, only pools selecting `all()`).
    pub fn usable_pools(&self, node: &str) -> Result<Vec<String>> {
        let labels = self.node_labels(node)?;
        Ok(self
            .pools()?
            .into_iter()
            .filter(|p| p.workload_usable(labels.as_ref()))
            .map(|p| p.name)
            .collect())
    }
}
