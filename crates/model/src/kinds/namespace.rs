//! The `Namespace` kind: a Kubernetes namespace's name and labels, which policies'
//! `namespaceSelector`s match. Accepted as `tern.dev/v1` or as a core Kubernetes `v1` document
//! (whose `spec` may be absent).

use serde::{Deserialize, Serialize};

use crate::document::Document;

/// A Kubernetes namespace (cluster-scoped; labels live in `metadata.labels`).
pub type Namespace = Document<NamespaceSpec>;

/// Spec of a [`Namespace`]. Kubernetes' only spec field is `finalizers`, kept so core `v1`
/// documents apply unchanged; tern does not act on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}
