//! Owner records: who holds a standalone `tern-ipam` allocation, written before the allocation
//! and read by leak repair ([`crate::pod::leak`]) and the IPAM audit. The record schema and its
//! store operations; the keys are the store's ([`keys::OWNERS`], [`keys::owner`]).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use tern_store::{Store, StoreError, keys};

/// Prefix of every owner record of standalone `tern-ipam` allocations.
pub const OWNERS_PREFIX: &str = keys::OWNERS;

/// Key of the owner record of `handle` on `node`.
pub use tern_store::keys::owner as owner_key;

/// Who holds a standalone `tern-ipam` allocation: written before the allocation so that a
/// crash in between leaves at worst a record without an allocation (harmless).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerRecord {
    pub handle: String,
    pub node: String,
    pub network: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// `CNI_NETNS` of the ADD; empty when unknown.
    pub netns: String,
}

/// Writes (or overwrites) an owner record.
pub fn record_owner(store: &dyn Store, o: &OwnerRecord) -> Result<(), StoreError> {
    let body = serde_json::to_vec(o).map_err(|e| StoreError::Backend(e.to_string()))?;
    store.put(&owner_key(&o.node, &o.handle), &body)?;
    Ok(())
}

/// Deletes an owner record; Ok when absent.
pub fn delete_owner(store: &dyn Store, node: &str, handle: &str) -> Result<(), StoreError> {
    store.delete(&owner_key(node, handle))?;
    Ok(())
}

/// Deletes the owner records of attachment `a` on `node`: the one under its handle, and the
/// one under its legacy handle (written before handles were unambiguous) when that record
/// names this attachment (a legacy handle may be shared with another attachment, whose
/// record stays). Ok when absent.
pub fn delete_owner_of(
    store: &dyn Store,
    node: &str,
    a: &tern_api::Attachment,
) -> Result<(), StoreError> {
    delete_owner(store, node, &a.handle())?;
    let legacy = a.legacy_handle();
    if let Some(kv) = store.get(&owner_key(node, &legacy))?
        && let Ok(o) = serde_json::from_slice::<OwnerRecord>(&kv.value)
        && o.network == a.network
        && o.container_id == a.container_id
        && tern_api::ident::same_ifname(&o.ifname, &a.ifname)
    {
        delete_owner(store, node, &legacy)?;
    }
    Ok(())
}

/// Owner records of one node (or of every node), by handle. Unreadable records are skipped
/// with a warning.
pub fn list_owners(
    store: &dyn Store,
    node: Option<&str>,
) -> Result<HashMap<String, OwnerRecord>, StoreError> {
    let prefix = match node {
        Some(n) => format!("{OWNERS_PREFIX}{n}/"),
        None => OWNERS_PREFIX.to_string(),
    };
    let (kvs, _) = store.range(&prefix)?;
    let mut out = HashMap::new();
    for kv in kvs {
        match serde_json::from_slice::<OwnerRecord>(&kv.value) {
            Ok(o) => {
                out.insert(o.handle.clone(), o);
            }
            Err(e) => log::warn!("skipping unreadable owner record {}: {e}", kv.key),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_round_trip() {
        let s = tern_store::mem::MemStore::new();
        let o = OwnerRecord {
            handle: "net.c1".into(),
            node: "n1".into(),
            network: "net".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/x".into(),
        };
        record_owner(&s, &o).unwrap();
        assert_eq!(list_owners(&s, Some("n1")).unwrap()["net.c1"], o);
        assert!(list_owners(&s, Some("n2")).unwrap().is_empty());
        assert_eq!(list_owners(&s, None).unwrap().len(), 1);
        delete_owner(&s, "n1", "net.c1").unwrap();
        delete_owner(&s, "n1", "net.c1").unwrap();
        assert!(list_owners(&s, None).unwrap().is_empty());
    }
}
