//! Reading and writing resources in a [`Store`]. The stored value is the document's JSON
//! without `resourceVersion`; on read, `resourceVersion` is set from the key's `mod_revision`,
//! and on write a present `resourceVersion` is a compare-and-swap precondition, as in
//! Kubernetes.

use tern_store::{Compare, Op, Store, Txn, keys};

use crate::ModelError;
use crate::resources::{Kind, Resource};

/// The store key of a resource. The IPAM configuration is a singleton at
/// [`keys::IPAM_CONFIG`], where the allocator reads it.
pub fn resource_key(kind: Kind, namespace: Option<&str>, name: &str) -> String {
    match kind {
        Kind::IpamConfig => keys::IPAM_CONFIG.to_string(),
        k if k.namespaced() => {
            keys::namespaced_resource(k.as_str(), namespace.unwrap_or_default(), name)
        }
        k => keys::resource(k.as_str(), name),
    }
}

fn decode(key: &str, kv: &tern_store::KeyValue) -> Result<Resource, ModelError> {
    let mut r = Resource::from_json(&kv.value).map_err(|message| ModelError::Corrupt {
        key: key.to_string(),
        message,
    })?;
    r.metadata_mut().resource_version = Some(kv.mod_revision.to_string());
    Ok(r)
}

/// Validates and writes a resource; returns the store revision of the write. When
/// `metadata.resourceVersion` is set, the write only succeeds if the stored resource still has
/// that revision (`0` = must not exist), else [`ModelError::Conflict`].
pub fn put_resource(store: &dyn Store, resource: &Resource) -> Result<i64, ModelError> {
    let mut r = resource.clone();
    r.fill_defaults();
    r.validate()?;
    let rv = r.metadata_mut().resource_version.take();
    let key = resource_key(r.kind(), r.namespace(), r.name());
    let mut txn = Txn {
        success: vec![Op::put(key.clone(), r.to_json())],
        ..Txn::default()
    };
    if let Some(rv) = &rv {
        let rev: i64 = rv.parse().map_err(|_| ModelError::Invalid {
            kind: r.kind().as_str(),
            name: r.name().to_string(),
            field: "metadata.resourceVersion".into(),
            reason: format!("{rv:?} is not a resource version"),
        })?;
        txn.compare.push(Compare::ModRevision(key, rev));
    }
    let resp = store.txn(txn)?;
    if !resp.succeeded {
        return Err(ModelError::Conflict {
            kind: r.kind().as_str(),
            name: r.name().to_string(),
            resource_version: rv.unwrap_or_default(),
        });
    }
    Ok(resp.revision)
}

/// Reads one resource; `None` when absent. `namespace` is ignored for cluster-scoped kinds.
pub fn get_resource(
    store: &dyn Store,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<Resource>, ModelError> {
    let key = resource_key(kind, namespace, name);
    match store.get(&key)? {
        Some(kv) => decode(&key, &kv).map(Some),
        None => Ok(None),
    }
}

/// Lists every resource of a kind (all namespaces), sorted by key.
pub fn list_resources(store: &dyn Store, kind: Kind) -> Result<Vec<Resource>, ModelError> {
    if kind == Kind::IpamConfig {
        return Ok(get_resource(store, kind, None, "default")?
            .into_iter()
            .collect());
    }
    let (kvs, _) = store.range(&keys::resource_prefix(kind.as_str()))?;
    kvs.iter().map(|kv| decode(&kv.key, kv)).collect()
}

/// Deletes a resource; true when it existed. Deleting an absent resource is not an error.
pub fn delete_resource(
    store: &dyn Store,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
) -> Result<bool, ModelError> {
    let key = resource_key(kind, namespace, name);
    // "Absent" compare succeeds with nothing to do; otherwise the failure branch deletes, so
    // existence is decided atomically with the delete.
    let resp = store.txn(Txn {
        compare: vec![Compare::Version(key.clone(), 0)],
        success: vec![],
        failure: vec![Op::delete(key)],
    })?;
    Ok(!resp.succeeded)
}
