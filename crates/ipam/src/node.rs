//! Releasing everything a departed node holds in the datastore, as `calicoctl delete node` and
//! Calico's node controller do: the one function behind `ternctl lab node del` and the
//! Kubernetes node garbage collector of ternd.

use std::net::IpAddr;

use tern_model::{Kind, WorkloadEndpoint};
use tern_store::{Compare, Op, Txn, keys};

use crate::block::Block;
use crate::codec::{decode, encode};
use crate::{Ipam, IpamError, Result};

/// What [`Ipam::release_node`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleasedNode {
    /// WorkloadEndpoints of the node deleted (`<namespace>/<name>`).
    pub endpoints: Vec<String>,
    /// Addresses released (the node's pods and tunnel addresses).
    pub released: Vec<IpAddr>,
    /// Blocks deleted together with their affinity.
    pub blocks: Vec<String>,
    /// Blocks kept because another node still borrows an address in them: their affinity is
    /// gone and the block is no node's (the borrowers keep their `/32` routes).
    pub orphaned_blocks: Vec<String>,
    /// Whether a Node resource was deleted.
    pub node_deleted: bool,
}

impl ReleasedNode {
    /// Whether anything was removed.
    pub fn is_empty(&self) -> bool {
        *self == ReleasedNode::default()
    }
}

impl Ipam {
    /// Removes node `node` from the datastore: its WorkloadEndpoints, its owner records, every
    /// address it allocated (in its own blocks and those it borrowed elsewhere; other nodes'
    /// borrowed addresses in its blocks are left alone), its blocks with their affinities (a
    /// block another node still borrows from stays, unaffined), its liveness record and its
    /// Node resource. Every other agent's dataplane then withdraws its routes to the node.
    /// Idempotent: a second call finds nothing. Every block change is a compare-and-swap, so a
    /// concurrent allocation is never lost (the block then stays).
    pub fn release_node(&self, node: &str) -> Result<ReleasedNode> {
        self.ensure_unlocked()?;
        let store = self.store().clone();
        let mut out = ReleasedNode::default();
        let model = IpamError::Model;
        // Endpoints first: once gone, their addresses are allocated-not-in-use and the audit
        // would report them until released just below.
        // Where endpoints are derived (from the Pods, on the Kubernetes datastore) there is
        // nothing to delete: the node's own records went with the node, and the endpoint
        // records a migration left for its agent are removed below.
        let (kvs, _) = if store.derives_endpoints() {
            (Vec::new(), 0)
        } else {
            store.range(&keys::resource_prefix(Kind::WorkloadEndpoint.as_str()))?
        };
        for kv in kvs {
            let Ok(w) = serde_json::from_slice::<WorkloadEndpoint>(&kv.value) else {
                continue;
            };
            if w.spec.node != node {
                continue;
            }
            let del = store.txn(Txn {
                compare: vec![Compare::ModRevision(kv.key.clone(), kv.mod_revision)],
                success: vec![Op::delete(kv.key.clone())],
                failure: vec![],
            })?;
            if del.succeeded {
                out.endpoints.push(format!(
                    "{}/{}",
                    w.metadata.namespace.as_deref().unwrap_or_default(),
                    w.metadata.name
                ));
            }
        }
        let (owners, _) = store.range(&format!("{}{node}/", keys::OWNERS))?;
        let (imports, _) = store.range(&keys::node_endpoint_imports(node))?;
        for kv in owners.into_iter().chain(imports) {
            store.delete(&kv.key)?;
        }
        // Addresses this node allocated: by attribute, or unattributed in its own blocks.
        let allocs: Vec<_> = self
            .allocations(Some(node))?
            .into_iter()
            .filter(|a| {
                a.attrs.node == node
                    || (a.attrs.node.is_empty()
                        && self
                            .block_affinity(&a.block)
                            .is_some_and(|n| n.as_deref() == Some(node)))
            })
            .collect();
        out.released = self.release_allocations(&allocs)?;
        for a in self.affinities(Some(node))? {
            let cidr = a.cidr.to_string();
            let akey = keys::affinity(node, &cidr);
            let bkey = keys::block(&cidr);
            let Some(akv) = store.get(&akey)? else {
                continue;
            };
            let mut txn = Txn {
                compare: vec![Compare::ModRevision(akey.clone(), akv.mod_revision)],
                success: vec![Op::delete(akey.clone())],
                failure: vec![],
            };
            let mut orphaned = false;
            if let Some(bkv) = store.get(&bkey)? {
                let mut b: Block = decode(&bkv)?;
                txn.compare
                    .push(Compare::ModRevision(bkey.clone(), bkv.mod_revision));
                // An empty block goes only if it is this node's (or no one's): a stale
                // affinity of this node must not take another node's block with it.
                if b.in_use() == 0 && b.affine_node().is_none_or(|n| n == node) {
                    txn.success.push(Op::delete(bkey.clone()));
                } else if b.affine_node() == Some(node) {
                    b.affinity = None;
                    txn.success.push(Op::put(bkey.clone(), encode(&b)));
                    orphaned = true;
                }
            }
            let done = if store.multi_key_txn() {
                store.txn(txn)?.succeeded
            } else {
                // One object per write: the block first (as read), then the affinity; a
                // crash in between leaves the affinity, which the next call removes.
                let (akey_cmp, block_txn) =
                    txn.compare.split_first().expect("the affinity compare");
                let block_ok = block_txn.is_empty()
                    || txn.success.len() < 2
                    || store
                        .txn(Txn::when(block_txn.to_vec(), txn.success[1..].to_vec()))?
                        .succeeded;
                block_ok
                    && store
                        .txn(Txn::when(
                            vec![akey_cmp.clone()],
                            vec![Op::delete(akey.clone())],
                        ))?
                        .succeeded
            };
            if done {
                self.forget_block(&a.cidr);
                if orphaned {
                    out.orphaned_blocks.push(cidr);
                } else {
                    out.blocks.push(cidr);
                }
            }
        }
        store.delete(&keys::node_liveness(node))?;
        out.node_deleted =
            tern_model::delete_resource(&*store, Kind::Node, None, node).map_err(model)?;
        Ok(out)
    }

    /// The node a stored block is affine to (`Some(None)`: unaffined; `None`: unreadable or
    /// gone).
    fn block_affinity(&self, cidr: &ipnet::IpNet) -> Option<Option<String>> {
        let kv = self.store().get(&keys::block(&cidr.to_string())).ok()??;
        let b: Block = decode(&kv).ok()?;
        Some(b.affine_node().map(str::to_string))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AssignArgs;
    use std::sync::Arc;
    use tern_store::Store;

    fn args(node: &str, handle: &str) -> AssignArgs {
        AssignArgs {
            num_v4: 1,
            handle: handle.to_string(),
            node: node.to_string(),
            ..AssignArgs::default()
        }
    }

    #[test]
    fn a_node_is_released_and_others_and_borrowers_are_kept() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let ipam = Ipam::new(store.clone());
        ipam.ensure_default_pool("10.246.0.0/16").unwrap();
        let gone = ipam.assign_ipv4(&args("gone", "h1")).unwrap()[0];
        ipam.assign_ipv4(&args("stays", "h2")).unwrap();
        // "stays" borrows an address in gone's block.
        let borrowed = IpAddr::V4((u32::from(gone) + 7).into());
        let attrs = crate::AllocationAttrs {
            node: "stays".into(),
            ..Default::default()
        };
        ipam.assign_ip(borrowed, "h3", &attrs).unwrap();
        tern_model::put_resource(
            &*store,
            &tern_model::Node::new("gone", tern_model::NodeSpec::default()).into(),
        )
        .unwrap();

        let r = ipam.release_node("gone").unwrap();
        assert_eq!(r.released, vec![IpAddr::V4(gone)]);
        assert!(r.blocks.is_empty(), "{r:?}");
        assert_eq!(r.orphaned_blocks.len(), 1, "{r:?}");
        assert!(r.node_deleted);
        assert!(ipam.affinities(Some("gone")).unwrap().is_empty());
        assert_eq!(ipam.affinities(Some("stays")).unwrap().len(), 1);
        // The borrower keeps its address; the block is no one's.
        let held: Vec<IpAddr> = ipam
            .allocations(None)
            .unwrap()
            .iter()
            .map(|a| a.ip)
            .collect();
        assert!(held.contains(&borrowed), "{held:?}");
        assert_eq!(held.len(), 2, "{held:?}");
        assert!(
            ipam.blocks()
                .unwrap()
                .iter()
                .all(|b| b.affine_node() != Some("gone"))
        );
        assert!(ipam.release_node("gone").unwrap().is_empty());
    }
}
