//! `ternctl delete KIND NAME [-n NS]`. An IPPool that still has allocated addresses is not
//! deleted: its addresses would be orphaned and its blocks' routes would disappear.

use std::sync::Arc;

use anyhow::bail;
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
}
