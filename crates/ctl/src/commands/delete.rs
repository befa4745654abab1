//! `ternctl delete KIND NAME [-n NS]` and `ternctl delete -f FILE`. An IPPool that still has
//! allocated addresses is not deleted: its addresses would be orphaned and its blocks' routes
//! would disappear.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, bail};
use tern_ipam::Ipam;
use tern_model::Kind;
use tern_store::Store;

/// Namespace used for namespaced kinds when `-n` is absent.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Deletes one resource; an error when it does not exist or (for an IPPool) still holds
/// addresses. Returns the confirmation message.
pub fn delete(
    store: Arc<dyn Store>,
    kind: Kind,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<String> {
    let ns = kind
        .namespaced()
        .then(|| namespace.unwrap_or(DEFAULT_NAMESPACE));
    if tern_model::get_resource(&*store, kind, ns, name)?.is_none() {
        match ns {
            Some(ns) => bail!("{kind} {name:?} not found in namespace {ns:?}"),
            None => bail!("{kind} {name:?} not found"),
        }
    }
    if kind == Kind::IpPool {
        refuse_if_in_use(store.clone(), name)?;
    }
    tern_model::delete_resource(&*store, kind, ns, name)?;
    Ok(format!("Successfully deleted 1 '{kind}' resource(s)"))
}

/// Deletes every resource the documents of `text` name (kind, namespace, name; the rest of each
/// document is ignored, as kubectl and calicoctl do). Every document is checked first: nothing
/// is deleted when the file does not parse, when a resource is missing (unless
/// `skip_not_exists`) or when an IPPool still holds addresses. Returns the number deleted per
/// kind.
pub fn delete_documents(
    store: Arc<dyn Store>,
    text: &str,
    file: &str,
    skip_not_exists: bool,
) -> anyhow::Result<BTreeMap<Kind, usize>> {
    let resources = tern_model::parse_documents(text, file)?;
    if resources.is_empty() {
        bail!("{file}: no resources found");
    }
    let mut targets = Vec::new();
    let mut problems = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        let kind = r.kind();
        let ns = kind
            .namespaced()
            .then(|| r.namespace().unwrap_or(DEFAULT_NAMESPACE).to_string());
        let name = r.name().to_string();
        let exists = tern_model::get_resource(&*store, kind, ns.as_deref(), &name)
            .with_context(|| format!("cannot read {kind} {name:?}"))?
            .is_some();
        if !exists {
            if !skip_not_exists {
                problems.push(match &ns {
                    Some(ns) => format!(
                        "{file}: document {}: {kind} {name:?} not found in namespace {ns:?}",
                        i + 1
                    ),
                    None => format!("{file}: document {}: {kind} {name:?} not found", i + 1),
                });
            }
            continue;
        }
        if kind == Kind::IpPool
            && let Err(e) = refuse_if_in_use(store.clone(), &name)
        {
            problems.push(format!("{file}: document {}: {e}", i + 1));
            continue;
        }
        targets.push((kind, ns, name));
    }
    if !problems.is_empty() {
        bail!(
            "{file}: nothing was deleted ({} problem{}):\n  {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("\n  ")
        );
    }
    let mut counts = BTreeMap::new();
    for (kind, ns, name) in targets {
        tern_model::delete_resource(&*store, kind, ns.as_deref(), &name)
            .with_context(|| format!("cannot delete {kind} {name:?}"))?;
        *counts.entry(kind).or_insert(0) += 1;
    }
    Ok(counts)
}

/// The success message of `delete -f`, as calicoctl words it.
pub fn summary(counts: &BTreeMap<Kind, usize>) -> String {
    if counts.is_empty() {
        return "Successfully deleted 0 resource(s)".to_string();
    }
    counts
        .iter()
        .map(|(k, n)| format!("Successfully deleted {n} '{k}' resource(s)"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn refuse_if_in_use(store: Arc<dyn Store>, name: &str) -> anyhow::Result<()> {
    let usage = Ipam::new(store).usage()?;
    let Some(pool) = usage.iter().find(|p| p.pool == name) else {
        return Ok(());
    };
    if pool.in_use == 0 {
        return Ok(());
    }
    let blocks: Vec<String> = pool
        .blocks
        .iter()
        .filter(|b| b.in_use > 0)
        .map(|b| format!("{} ({} in use)", b.cidr, b.in_use))
        .collect();
    bail!(
        "IPPool {name:?} ({}) still has {} address{} allocated, in block{} {}; delete the pods \
         using them (or release the addresses) first",
        pool.cidr,
        pool.in_use,
        if pool.in_use == 1 { "" } else { "es" },
        if blocks.len() == 1 { "" } else { "s" },
        blocks.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_ipam::AssignArgs;
    use tern_model::{Document, IpPoolSpec};

    fn store_with_pool() -> Arc<dyn Store> {
        let s: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        tern_model::put_resource(
            &*s,
            &Document::new("p1", IpPoolSpec::new("10.250.0.0/16")).into(),
        )
        .unwrap();
        s
    }

    #[test]
    fn deletes_an_unused_pool() {
        let s = store_with_pool();
        assert_eq!(
            delete(s.clone(), Kind::IpPool, "p1", None).unwrap(),
            "Successfully deleted 1 'IPPool' resource(s)"
        );
        assert!(
            tern_model::get_resource(&*s, Kind::IpPool, None, "p1")
                .unwrap()
                .is_none()
        );
        let e = delete(s, Kind::IpPool, "p1", None).unwrap_err().to_string();
        assert!(e.contains("IPPool \"p1\" not found"), "{e}");
    }

    #[test]
    fn refuses_a_pool_with_allocations() {
        let s = store_with_pool();
        let ipam = Ipam::new(s.clone());
        let args = AssignArgs {
            handle: "k8s-pod-network.c1".into(),
            node: "node1".into(),
            num_v4: 3,
            ..AssignArgs::default()
        };
        let ips = ipam.auto_assign(&args).unwrap();
        assert_eq!(ips.len(), 3);
        let e = delete(s.clone(), Kind::IpPool, "p1", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("still has 3 addresses allocated"), "{e}");
        assert!(e.contains("/26 (3 in use)"), "{e}");
        assert!(
            tern_model::get_resource(&*s, Kind::IpPool, None, "p1")
                .unwrap()
                .is_some()
        );
        ipam.release_by_handle("k8s-pod-network.c1").unwrap();
        delete(s, Kind::IpPool, "p1", None).unwrap();
    }

    const FILE: &str = "\
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: p1
spec:
  cidr: 10.250.0.0/16
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny
  namespace: prod
spec:
  podSelector: {}
";

    #[test]
    fn deletes_every_document_of_a_file() {
        let s = store_with_pool();
        crate::commands::apply::apply(&*s, FILE, "f.yaml").unwrap();
        assert!(
            tern_model::get_resource(&*s, Kind::K8sNetworkPolicy, Some("prod"), "deny")
                .unwrap()
                .is_some()
        );
        let counts = delete_documents(s.clone(), FILE, "f.yaml", false).unwrap();
        assert_eq!(counts[&Kind::IpPool], 1);
        assert_eq!(counts[&Kind::K8sNetworkPolicy], 1);
        assert!(summary(&counts).contains("Successfully deleted 1 'IPPool' resource(s)"));
        assert!(
            tern_model::get_resource(&*s, Kind::K8sNetworkPolicy, Some("prod"), "deny")
                .unwrap()
                .is_none()
        );
        // Again: both are gone, which is an error unless told otherwise.
        let e = delete_documents(s.clone(), FILE, "f.yaml", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing was deleted (2 problems)"), "{e}");
        assert!(
            e.contains(
                "document 2: KubernetesNetworkPolicy \"deny\" not found in namespace \"prod\""
            ),
            "{e}"
        );
        let counts = delete_documents(s, FILE, "f.yaml", true).unwrap();
        assert!(counts.is_empty());
        assert_eq!(summary(&counts), "Successfully deleted 0 resource(s)");
    }

    #[test]
    fn delete_file_refuses_a_pool_in_use_and_deletes_nothing() {
        let s = store_with_pool();
        crate::commands::apply::apply(&*s, FILE, "f.yaml").unwrap();
        Ipam::new(s.clone())
            .auto_assign(&AssignArgs {
                handle: "k8s-pod-network.c2".into(),
                node: "node1".into(),
                num_v4: 1,
                ..AssignArgs::default()
            })
            .unwrap();
        let e = delete_documents(s.clone(), FILE, "f.yaml", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("document 1: IPPool \"p1\""), "{e}");
        // The policy of the same file is still there: all or nothing.
        assert!(
            tern_model::get_resource(&*s, Kind::K8sNetworkPolicy, Some("prod"), "deny")
                .unwrap()
                .is_some()
        );
    }
}
