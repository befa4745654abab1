//! The shape every resource shares: a Kubernetes-style [`Document`] (`apiVersion`, `kind`,
//! `metadata`, `spec`) with its [`ObjectMeta`]. A leaf: the kind modules build their types on
//! it without knowing the table of kinds ([`crate::registry`]), which in turn names them.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// tern's own `apiVersion`; every kind but the Kubernetes NetworkPolicy is written with it.
pub const API_VERSION: &str = "tern.dev/v1";

/// Standard object metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The store's `mod_revision` of the resource when read; on write, a precondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
}

/// A Kubernetes-style document with a typed spec. [`Document::new`] (for specs of a listed
/// kind) fills `apiVersion` and `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    bound(deserialize = "S: DeserializeOwned")
)]
pub struct Document<S> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: S,
}
