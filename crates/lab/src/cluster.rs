//! The lab's datastore: applying the default IPPool before the agents start, reading Nodes and
//! removing a node's records when it leaves. An etcd store listens on the underlay, which only
//! the lab's namespaces reach, so its client runs on a thread inside the etcd namespace; the
//! Kubernetes datastore (the cluster's API server, through the admin kubeconfig) likewise from
//! inside the control plane's.

use std::sync::Arc;

use tern_ipam::Ipam;
use tern_model::defaults::{IPV4_POOL_NAME, IPV6_BLOCK_SIZE, IPV6_POOL_NAME};
use tern_model::{Document, IpPoolSpec, Kind, Resource};
use tern_store::Store;

use crate::netns::in_netns;
use crate::state::{LabState, StoreKind};
use crate::{LabError, Result};

fn store_err(st: &LabState, e: impl std::fmt::Display) -> LabError {
    LabError::Invalid(format!(
        "datastore {} of lab {}: {e}",
        st.store_url(),
        st.name
    ))
}

/// Opens the lab's store and runs `f` on it, from inside the etcd namespace for an etcd store
/// and the control plane's for the Kubernetes datastore.
pub fn with_store<T, F>(st: &LabState, f: F) -> Result<T>
where
    F: FnOnce(Arc<dyn Store>) -> Result<T> + Send,
    T: Send,
{
    let url = st.store_url();
    let tls = st.store_tls().cloned();
    let open_and_run = move || -> Result<T> {
        let store = match &tls {
            None => tern_store::open(&url),
            Some(t) => {
                tern_store::etcd::open_with_tls(&url, Some(&t.ca), Some(&t.cert), Some(&t.key))
            }
        }
        .map_err(|e| LabError::Invalid(format!("cannot open datastore {url}: {e}")))?;
        f(store)
    };
    match (&st.store, &st.etcd) {
        (StoreKind::Etcd, Some(etcd)) => in_netns(&etcd.netns, open_and_run)?,
        (StoreKind::Etcd, None) => Err(LabError::Invalid(format!(
            "lab {} uses etcd but has no etcd server recorded",
            st.name
        ))),
        (StoreKind::Sqlite, _) => open_and_run(),
        (StoreKind::Kubernetes, _) => match &st.kube {
            Some(k) => in_netns(&k.cp_netns, open_and_run)?,
            None => Err(LabError::Invalid(format!(
                "lab {} uses the Kubernetes datastore but has no cluster recorded",
                st.name
            ))),
        },
    }
}

/// The lab's default IPPool of `cidr`'s family: `cidr`, encapsulation from the lab's mode,
/// natOutgoing on; an IPv6 one is `default-ipv6-ippool` with Calico's /122 blocks, and no
/// IPIP (IPv4 only, as Calico's: a dual-stack IPIP lab routes IPv6 directly).
pub fn default_pool(st: &LabState, cidr: &str) -> Resource {
    let mut spec = IpPoolSpec::new(cidr);
    let (vxlan, ipip) = st.encap.pool_modes();
    spec.vxlan_mode = vxlan;
    spec.ipip_mode = ipip;
    spec.nat_outgoing = true;
    let name = if cidr.contains(':') {
        spec.block_size = IPV6_BLOCK_SIZE;
        spec.ipip_mode = tern_model::EncapMode::Never;
        IPV6_POOL_NAME
    } else {
        IPV4_POOL_NAME
    };
    Document::new(name, spec).into()
}

/// Writes the lab's default IPPool (as `ternctl apply` would). Done before any agent starts, so
/// no agent creates a pool of its own (on the Kubernetes datastore by `kube::up`, once the API
/// server runs and tern's CRDs are there).
pub fn apply_default_pool(st: &LabState, cidr: &str) -> Result<()> {
    let pool = default_pool(st, cidr);
    with_store(st, move |s| {
        tern_model::put_resource(&*s, &pool)
            .map(drop)
            .map_err(|e| LabError::Invalid(format!("cannot apply IPPool {}: {e}", pool.name())))
    })
}

/// Every Node resource in the lab's store.
pub fn nodes(st: &LabState) -> Result<Vec<Resource>> {
    with_store(st, |s| {
        tern_model::list_resources(&*s, Kind::Node)
            .map_err(|e| LabError::Invalid(format!("cannot list Nodes: {e}")))
    })
    .map_err(|e| store_err(st, e))
}

/// What [`remove_node_records`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemovedNode {
    /// Addresses released (pods and tunnel addresses of the node).
    pub released: usize,
    /// Blocks deleted together with their affinity.
    pub blocks: Vec<String>,
    /// Whether a Node resource was deleted.
    pub node_deleted: bool,
}

/// Removes a departed node from the datastore, as `calicoctl delete node` does: releases every
/// address allocated to it, deletes its (then empty) blocks with their affinities, its liveness
/// record and its Node resource. Other agents then withdraw their routes to it.
pub fn remove_node_records(st: &LabState, node: &str) -> Result<RemovedNode> {
    let node = node.to_string();
    with_store(st, move |s| remove_records_in(s, &node))
}

/// [`remove_node_records`] on an open store.
pub fn remove_records_in(s: Arc<dyn Store>, node: &str) -> Result<RemovedNode> {
    let err = |what: &str, e: &dyn std::fmt::Display| {
        LabError::Invalid(format!(
            "removing node {node} from the datastore: {what}: {e}"
        ))
    };
    // The same release as ternd's Kubernetes node garbage collector.
    let r = Ipam::new(s)
        .release_node(node)
        .map_err(|e| err("releasing it", &e))?;
    let (released, node_deleted) = (r.released.len(), r.node_deleted);
    let mut blocks = r.blocks;
    blocks.extend(r.orphaned_blocks);
    Ok(RemovedNode {
        released,
        blocks,
        node_deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Encap;

    #[test]
    fn default_pool_carries_the_lab_encapsulation() {
        let mut st = LabState::new("t", std::path::Path::new("/b"));
        st.encap = Encap::Crosssubnet;
        let Resource::IpPool(p) = default_pool(&st, "10.245.0.0/16") else {
            panic!("not a pool")
        };
        assert_eq!(p.metadata.name, IPV4_POOL_NAME);
        assert_eq!(p.spec.cidr, "10.245.0.0/16");
        assert_eq!(p.spec.vxlan_mode, tern_model::EncapMode::CrossSubnet);
        assert_eq!(p.spec.ipip_mode, tern_model::EncapMode::Never);
        assert!(p.spec.nat_outgoing);
        let Resource::IpPool(p6) = default_pool(&st, "fd00:10:244::/48") else {
            panic!("not a pool")
        };
        assert_eq!(p6.metadata.name, IPV6_POOL_NAME);
        assert_eq!(p6.spec.block_size, 122);
        assert_eq!(p6.spec.vxlan_mode, tern_model::EncapMode::CrossSubnet);
        assert!(p6.spec.nat_outgoing);
        st.encap = Encap::Ipip;
        let Resource::IpPool(p6) = default_pool(&st, "fd00:10:244::/48") else {
            panic!("not a pool")
        };
        assert_eq!(p6.spec.ipip_mode, tern_model::EncapMode::Never);
    }

    #[test]
    fn node_records_are_removed_from_a_sqlite_store() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = tern_store::open(&url).unwrap();
        let ipam = Ipam::new(store.clone());
        ipam.ensure_default_pool("10.246.0.0/16").unwrap();
        let args = |node: &str, handle: &str| tern_ipam::AssignArgs {
            num_v4: 1,
            handle: handle.to_string(),
            node: node.to_string(),
            ..tern_ipam::AssignArgs::default()
        };
        ipam.assign_ipv4(&args("gone", "h1")).unwrap();
        ipam.assign_ipv4(&args("stays", "h2")).unwrap();
        let node = tern_model::Node::new("gone", tern_model::NodeSpec::default());
        tern_model::put_resource(&*store, &node.into()).unwrap();

        let removed = remove_records_in(store.clone(), "gone").unwrap();
        assert_eq!(removed.released, 1);
        assert_eq!(removed.blocks.len(), 1);
        assert!(removed.node_deleted);
        assert!(ipam.affinities(Some("gone")).unwrap().is_empty());
        assert_eq!(ipam.affinities(Some("stays")).unwrap().len(), 1);
        assert_eq!(ipam.allocations(Some("stays")).unwrap().len(), 1);
        assert!(
            tern_model::get_resource(&*store, Kind::Node, None, "gone")
                .unwrap()
                .is_none()
        );
        // Removing again finds nothing and is not an error.
        let again = remove_records_in(store, "gone").unwrap();
        assert_eq!(again, RemovedNode::default());
    }
}
