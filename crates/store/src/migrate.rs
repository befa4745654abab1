//! Moving a cluster's tern state from one datastore to another (`ternctl datastore migrate`,
//! as `calicoctl datastore migrate` export/import): pools, policies, BGP resources, nodes,
//! endpoints, every IPAM block and affinity and the cluster ID, so running pods keep their
//! addresses and the nodes keep recognising the store as theirs.
//!
//! What is not copied: keys attached to a lease (node liveness: each agent writes its own
//! again within seconds) and, onto a store without multi-key transactions (the Kubernetes
//! API), the IPAM handle records (there the blocks are the only record of an allocation, see
//! `tern_ipam::Ipam`'s "One object per write"); the other way round, `ternctl datastore
//! migrate` rebuilds them from the blocks (`Ipam::rebuild_handles`). Each key is one write on
//! the target, so an interrupted migration is finished by running it again with `--force`
//! (every key is written whole; nothing depends on the order).
//!
//! WorkloadEndpoints onto a store that derives them from Pods (the Kubernetes datastore, see
//! [`crate::kube_pods`]) cannot be written as such: each becomes an endpoint record for its
//! node's agent under [`keys::ENDPOINT_IMPORT`], which the agent moves into its node-local
//! endpoint store when it starts on the new store (so it keeps recognising its pods' veths).
//! From such a store the derived endpoints are not copied (they carry no container ID): each
//! agent writes its node's own records, kept in its local endpoint store, into the target
//! when it starts there (`tern_agent::endpoints::open_store`); endpoint records no agent took
//! yet are copied back as the endpoints they are.
//!
//! The source should not change while it runs: stop the agents (or scale the DaemonSet to
//! zero) first; pods keep running, and their addresses are in the blocks copied. `ternctl
//! datastore migrate` also locks the source first and leaves it locked (the IPAM
//! configuration's `migrationLock`, `tern_ipam::IpamError::Locked`): an agent still using it
//! allocates and releases nothing there, so nothing is allocated that the copy lacks.

use crate::{Result, Store, StoreError, keys};

/// What a migration does (or, dry, would do).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Keys copied, per class of key (`resources/ippool`, `ipam/blocks`, ...).
    pub copy: Vec<(String, usize)>,
    /// Keys left out, per reason.
    pub skip: Vec<(String, usize)>,
    /// Keys the target held before (0 unless forced).
    pub target_keys: usize,
    /// The source's revision the copy was read at.
    pub source_revision: i64,
}

impl Plan {
    pub fn copied(&self) -> usize {
        self.copy.iter().map(|(_, n)| n).sum()
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "source revision {}", self.source_revision)?;
        for (class, n) in &self.copy {
            writeln!(f, "  copy {n:>6}  {class}")?;
        }
        for (why, n) in &self.skip {
            writeln!(f, "  skip {n:>6}  {why}")?;
        }
        if self.target_keys > 0 {
            writeln!(
                f,
                "  the target already held {} keys (--force)",
                self.target_keys
            )?;
        }
        write!(f, "{} keys", self.copied())
    }
}

/// The class of a key for the plan: its first two segments under the root.
fn class(key: &str) -> String {
    let tail = key.strip_prefix(keys::ROOT).unwrap_or(key);
    let mut parts = tail.splitn(3, '/');
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) if !b.is_empty() => format!("{a}/{b}"),
        (Some(a), _) => a.to_string(),
        _ => tail.to_string(),
    }
}

fn bump(list: &mut Vec<(String, usize)>, name: String) {
    match list.iter_mut().find(|(n, _)| *n == name) {
        Some((_, c)) => *c += 1,
        None => list.push((name, 1)),
    }
}

/// Copies every tern key of `from` into `to` (or only plans it, with `dry_run`). A target
/// that already holds tern keys is refused unless `force` (then keys are overwritten).
pub fn migrate(from: &dyn Store, to: &dyn Store, dry_run: bool, force: bool) -> Result<Plan> {
    let (kvs, rev) = from.range(keys::ROOT)?;
    let wep_prefix = keys::resource_prefix("WorkloadEndpoint");
    // The target's derived endpoints (its running Pods) are not tern state of its own.
    let existing: Vec<_> = to
        .range(keys::ROOT)?
        .0
        .into_iter()
        .filter(|kv| !(to.derives_endpoints() && kv.key.starts_with(&wep_prefix)))
        .collect();
    let mut plan = Plan {
        source_revision: rev,
        target_keys: existing.len(),
        ..Plan::default()
    };
    if !existing.is_empty() && !force {
        let sample: Vec<&str> = existing.iter().take(3).map(|kv| kv.key.as_str()).collect();
        return Err(StoreError::Config(format!(
            "the target datastore is not empty ({} tern keys, e.g. {}): migrating into it would \
             mix two clusters' state; pass --force to overwrite (or empty it first)",
            existing.len(),
            sample.join(", ")
        )));
    }
    let single = !to.multi_key_txn();
    let mut todo = Vec::new();
    for kv in kvs {
        if kv.lease != 0 {
            bump(
                &mut plan.skip,
                "attached to a lease (node liveness, written again by each agent)".into(),
            );
        } else if single && kv.key.starts_with(keys::HANDLES) {
            bump(
                &mut plan.skip,
                "IPAM handle records (the target keeps allocations in the blocks only)".into(),
            );
        } else if from.derives_endpoints() && kv.key.starts_with(&wep_prefix) {
            bump(
                &mut plan.skip,
                "endpoints derived from Pods (each agent brings its node's own records from its \
                 local endpoint store when it starts on the target)"
                    .into(),
            );
        } else if kv.key.starts_with(keys::ENDPOINT_IMPORT) && !to.derives_endpoints() {
            // Records no agent took yet are the endpoints themselves.
            let Some(tail) = kv.key[keys::ENDPOINT_IMPORT.len()..]
                .split_once('/')
                .map(|(_, t)| t.to_string())
            else {
                bump(&mut plan.skip, "malformed endpoint-import keys".into());
                continue;
            };
            bump(&mut plan.copy, class(&wep_prefix));
            todo.push(crate::KeyValue {
                key: format!("{wep_prefix}{tail}"),
                ..kv
            });
        } else if to.derives_endpoints() && kv.key.starts_with(&wep_prefix) {
            let tail = &kv.key[wep_prefix.len()..];
            let node = serde_json::from_slice::<serde_json::Value>(&kv.value)
                .ok()
                .and_then(|d| d["spec"]["node"].as_str().map(str::to_string))
                .filter(|n| !n.is_empty() && !n.contains('/'))
                .ok_or_else(|| {
                    StoreError::Backend(format!(
                        "endpoint {}: no spec.node, so no agent would take it",
                        kv.key
                    ))
                })?;
            bump(
                &mut plan.copy,
                "endpoint records for the nodes' agents (endpoint-import)".into(),
            );
            todo.push(crate::KeyValue {
                key: format!("{}{tail}", keys::node_endpoint_imports(&node)),
                ..kv
            });
        } else {
            bump(&mut plan.copy, class(&kv.key));
            todo.push(kv);
        }
    }
    if dry_run {
        return Ok(plan);
    }
    for kv in todo {
        to.put(&kv.key, &kv.value).map_err(|e| match e {
            StoreError::Backend(m) => StoreError::Backend(format!("copying {}: {m}", kv.key)),
            other => other,
        })?;
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;
    use crate::{Op, Txn};
    use std::time::Duration;

    #[test]
    fn copies_all_but_leased_keys_and_refuses_a_full_target() {
        let from = MemStore::new();
        from.put(&keys::resource("IPPool", "p"), b"{}").unwrap();
        from.put(&keys::block("10.0.0.0/26"), b"{\"cidr\":\"10.0.0.0/26\"}")
            .unwrap();
        from.put(&keys::handle("net.c1"), b"{}").unwrap();
        from.put(keys::CLUSTER_ID, b"abc").unwrap();
        let lease = from.lease_grant(Duration::from_secs(60)).unwrap();
        from.txn(Txn {
            success: vec![Op::Put {
                key: keys::node_liveness("n1"),
                value: b"n1".to_vec(),
                lease,
            }],
            ..Txn::default()
        })
        .unwrap();
        let to = MemStore::new();
        let dry = migrate(&from, &to, true, false).unwrap();
        assert_eq!(dry.copied(), 4, "{dry}");
        assert!(
            to.range(keys::ROOT).unwrap().0.is_empty(),
            "a dry run writes nothing"
        );
        let plan = migrate(&from, &to, false, false).unwrap();
        assert_eq!(plan.copied(), 4);
        assert!(plan.to_string().contains("ipam/blocks"), "{plan}");
        assert_eq!(to.get(keys::CLUSTER_ID).unwrap().unwrap().value, b"abc");
        assert!(to.get(&keys::node_liveness("n1")).unwrap().is_none());
        let e = migrate(&from, &to, false, false).unwrap_err().to_string();
        assert!(e.contains("not empty") && e.contains("--force"), "{e}");
        assert_eq!(migrate(&from, &to, false, true).unwrap().target_keys, 4);
    }

    #[test]
    fn endpoints_onto_a_store_that_derives_them_become_records_for_their_agents() {
        let from = MemStore::new();
        let wep = keys::namespaced_resource("WorkloadEndpoint", "prod", "n1-k8s-web-eth0");
        from.put(
            &wep,
            br#"{"kind":"WorkloadEndpoint","spec":{"node":"n1","pod":"web"}}"#,
        )
        .unwrap();
        from.put(&keys::resource("IPPool", "p"), b"{}").unwrap();
        let inner: std::sync::Arc<dyn Store> = std::sync::Arc::new(MemStore::new());
        // A running pod of the target cluster: derived, not state that makes it non-empty.
        let pod = keys::namespaced_resource("WorkloadEndpoint", "kube", "n9-k8s-dns-eth0");
        inner.put(&pod, b"{}").unwrap();
        let to = crate::testing::kube_like(inner.clone());
        let plan = migrate(&from, &*to, false, false).unwrap();
        assert_eq!(plan.copied(), 2, "{plan}");
        assert!(plan.to_string().contains("endpoint-import"), "{plan}");
        let record = format!("{}prod/n1-k8s-web-eth0", keys::node_endpoint_imports("n1"));
        assert_eq!(
            inner.get(&record).unwrap().unwrap().value,
            from.get(&wep).unwrap().unwrap().value
        );
        assert!(inner.get(&wep).unwrap().is_none());
        // And back: the records no agent took are the endpoints again; the derived ones
        // (the Pods) are not copied.
        let back = MemStore::new();
        let plan = migrate(&*to, &back, false, false).unwrap();
        assert!(back.get(&record).unwrap().is_none(), "{plan}");
        assert_eq!(
            back.get(&wep).unwrap().unwrap().value,
            from.get(&wep).unwrap().unwrap().value,
            "{plan}"
        );
        assert!(back.get(&pod).unwrap().is_none(), "{plan}");
        assert!(plan.to_string().contains("derived from Pods"), "{plan}");
    }
}
