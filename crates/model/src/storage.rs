//! Reading and writing resources in a [`Store`]. The stored value is the document's JSON
//! without `resourceVersion`; on read, `resourceVersion` is set from the key's `mod_revision`,
//! and on write a present `resourceVersion` is a compare-and-swap precondition, as in
//! Kubernetes.

use tern_store::{Compare, Op, Store, Txn, keys};

use crate::error::ModelError;
use crate::registry::{Kind, Resource};

/// The name a singleton kind's resource is read by; its key does not depend on the name.
const SINGLETON_NAME: &str = "default";

/// The store key of a resource. A singleton kind (the IPAM configuration, at
/// [`keys::IPAM_CONFIG`], where the allocator reads it) has one key whatever the name.
pub fn resource_key(kind: Kind, namespace: Option<&str>, name: &str) -> String {
    if let Some(key) = kind.singleton_key() {
        return key.to_string();
    }
    if kind.namespaced() {
        keys::namespaced_resource(kind.as_str(), namespace.unwrap_or_default(), name)
    } else {
        keys::resource(kind.as_str(), name)
    }
}

fn decode(key: &str, kv: &tern_store::KeyValue) -> Result<Resource, ModelError> {
    // Refused before decoding: an oversized value written past validation must not cost
    // every reader its size in memory.
    let limit = crate::limits::MAX_RESOURCE_BYTES;
    if kv.value.len() > limit {
        return Err(ModelError::Corrupt {
            key: key.to_string(),
            message: format!(
                "the value is {} bytes, the limit is {limit}",
                kv.value.len()
            ),
        });
    }
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
    if kind.singleton_key().is_some() {
        return Ok(get_resource(store, kind, None, SINGLETON_NAME)?
            .into_iter()
            .collect());
    }
    let (kvs, _) = store.range(&keys::resource_prefix(kind.as_str()))?;
    kvs.iter().map(|kv| decode(&kv.key, kv)).collect()
}

/// Lists every resource of a kind that a daemon can use, and separately the error of each
/// stored value that it cannot (oversized, undecodable or unusable, naming its key): for a
/// daemon, which must keep serving from the good values rather than stop on one bad value
/// someone wrote past validation. Each value is judged by [`Resource::from_stored`], the one
/// read-path decision every daemon reader shares (so IPAM never allocates from a pool the
/// dataplane or BGP ignore).
pub fn list_resources_skipping(
    store: &dyn Store,
    kind: Kind,
) -> Result<(Vec<Resource>, Vec<ModelError>), ModelError> {
    let stored = |kv: &tern_store::KeyValue| -> Result<Resource, ModelError> {
        let mut r = Resource::from_stored(&kv.value).map_err(|message| ModelError::Corrupt {
            key: kv.key.clone(),
            message,
        })?;
        r.metadata_mut().resource_version = Some(kv.mod_revision.to_string());
        Ok(r)
    };
    if let Some(key) = kind.singleton_key() {
        return Ok(match store.get(key)? {
            None => (Vec::new(), Vec::new()),
            Some(kv) => match stored(&kv) {
                Ok(r) => (vec![r], Vec::new()),
                Err(e) => (Vec::new(), vec![e]),
            },
        });
    }
    let (kvs, _) = store.range(&keys::resource_prefix(kind.as_str()))?;
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for kv in &kvs {
        match stored(kv) {
            Ok(r) => good.push(r),
            Err(e) => bad.push(e),
        }
    }
    Ok((good, bad))
}

/// Every readable resource of `kind`, as [`list_resources_skipping`] finds them; each value that
/// cannot be decoded (corrupt, over a limit, invalid) is logged at warn level with its key and
/// `reader` (the component reading), so one bad value written past validation never takes a
/// whole list, and the service reading it, down.
pub fn list_resources_warn(
    store: &dyn Store,
    kind: Kind,
    reader: &str,
) -> Result<Vec<Resource>, ModelError> {
    let (good, bad) = list_resources_skipping(store, kind)?;
    for e in bad {
        log::warn!("{reader}: ignoring an unreadable {kind}: {e}");
    }
    Ok(good)
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
