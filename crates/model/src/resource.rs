//! What every [`Resource`] can do whatever its kind: names, write-time validation (metadata,
//! the kind's own checks through the table, size), JSON/YAML encoding and decoding of stored
//! values. Kind-specific behaviour comes only from [`crate::registry`].

use serde::Deserialize;

use crate::document::{Document, ObjectMeta};
use crate::error::ModelError;
use crate::limits::{MAX_ANNOTATIONS_BYTES, MAX_RESOURCE_BYTES};
use crate::registry::{Decode, Kind, Resource, Spec};
use crate::validate::{
    FieldError, short, validate_dns1123_subdomain, validate_label_key, validate_label_value,
};

impl Resource {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    /// `metadata.namespace`, for namespaced kinds.
    pub fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }

    /// Checks the resource before it is written: its metadata (name, labels, annotations,
    /// namespace against the kind's scope), the kind's own checks, and last its size.
    pub fn validate(&self) -> Result<(), ModelError> {
        let kind = self.kind();
        let err = |(field, reason): FieldError| ModelError::Invalid {
            kind: kind.as_str(),
            name: self.name().to_string(),
            field,
            reason,
        };
        validate_meta(kind, self.metadata()).map_err(err)?;
        self.validate_counts().map_err(err)?;
        self.validate_spec().map_err(err)?;
        // Last: the checks above bound every list, so what is left to refuse is bulk.
        let size = self.to_json().len();
        if size > MAX_RESOURCE_BYTES {
            return Err(err((
                "(resource)".into(),
                format!("the resource is {size} bytes as JSON, the limit is {MAX_RESOURCE_BYTES}"),
            )));
        }
        Ok(())
    }

    /// The document as JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain structs of strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).unwrap_or_default()
    }

    /// Decodes a value read from the store the way every daemon reader must (the dataplane
    /// snapshot, policy, IPAM, BGP, through `list_resources_skipping` too), so they
    /// all take the same decision on each value. Anyone with store access can write a value
    /// without `ternctl`'s checks, and older versions wrote values newer limits refuse, so
    /// only what keeps a daemon safe and correct is enforced here:
    /// - a value over [`crate::limits::MAX_RESOURCE_BYTES`] is refused before it is decoded;
    /// - defaults are filled;
    /// - policies must pass their structural checks (selector parse bounds, CIDRs, ports, and
    ///   for a Kubernetes policy [`crate::limits::MAX_EXPANDED_RULES_PER_DIRECTION`], the compiler's
    ///   bound), but not the count limits, which are write-time only: the policy agent keeps
    ///   the last good version of a policy it cannot use, since dropping it would switch its
    ///   protection off;
    /// - other user-authored kinds (pools, reservations, BGP) must pass their kind's own
    ///   checks, since a daemon cannot use e.g. a pool whose CIDR does not parse.
    ///
    /// The write-time metadata checks (name and label charset, label lengths) and the count
    /// limits of [`Resource::validate`] are not applied. The error says why; a caller skips
    /// the value with a warning naming its key.
    pub fn from_stored(bytes: &[u8]) -> Result<Resource, String> {
        let limit = MAX_RESOURCE_BYTES;
        if bytes.len() > limit {
            return Err(format!(
                "the stored value is {} bytes, the limit is {limit}",
                bytes.len()
            ));
        }
        let mut r = Resource::from_json(bytes)?;
        r.fill_defaults();
        // The kind's checks, without the write-time metadata and count checks.
        let checked = if r.kind().user_authored() {
            r.validate_spec()
        } else {
            Ok(())
        };
        checked.map_err(|(field, reason)| {
            ModelError::Invalid {
                kind: r.kind().as_str(),
                name: r.name().to_string(),
                field,
                reason,
            }
            .to_string()
        })?;
        Ok(r)
    }

    /// Decodes a stored JSON document (as written by [`crate::put_resource`]).
    pub fn from_json(bytes: &[u8]) -> Result<Resource, String> {
        #[derive(Deserialize)]
        struct Header {
            #[serde(rename = "apiVersion", default)]
            api_version: String,
            kind: String,
        }
        struct Json<'a>(&'a [u8]);
        impl Decode for Json<'_> {
            type Error = String;
            fn decode<S: Spec>(self) -> Result<Document<S>, String> {
                serde_json::from_slice(self.0).map_err(|e| e.to_string())
            }
        }
        let h: Header = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        Kind::of_document(&h.api_version, &h.kind)?.decode(Json(bytes))
    }
}

fn validate_meta(kind: Kind, m: &ObjectMeta) -> Result<(), FieldError> {
    let at = |field: String| move |e: String| (field, e);
    validate_dns1123_subdomain(&m.name).map_err(at("metadata.name".into()))?;
    for (k, v) in &m.labels {
        validate_label_key(k).map_err(at(format!("metadata.labels[{}]", short(k))))?;
        validate_label_value(v).map_err(at(format!("metadata.labels[{}]", short(k))))?;
    }
    let total: usize = m.annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_ANNOTATIONS_BYTES {
        return Err((
            "metadata.annotations".into(),
            format!("annotations total {total} bytes, the limit is {MAX_ANNOTATIONS_BYTES}"),
        ));
    }
    for k in m.annotations.keys() {
        validate_label_key(k).map_err(at(format!("metadata.annotations[{}]", short(k))))?;
    }
    match (&m.namespace, kind.namespaced()) {
        (None, true) => Err((
            "metadata.namespace".into(),
            format!("{kind} is namespaced; a namespace is required"),
        )),
        (Some(ns), true) => validate_dns1123_subdomain(ns).map_err(at("metadata.namespace".into())),
        (Some(_), false) => Err((
            "metadata.namespace".into(),
            format!("{kind} is cluster-scoped; remove the namespace"),
        )),
        (None, false) => Ok(()),
    }
}
