//! tern's typed resources: Kubernetes-style documents (`apiVersion: tern.dev/v1`, `kind`,
//! `metadata`, `spec`) with Calico v3 field names, their YAML/JSON parsing with precise error
//! locations, validation on write, and store I/O helpers.
//!
//! Modules: [`resources`] (types), [`parse`] (YAML/JSON documents), [`validate`] (write-time
//! checks), [`storage`] (read/write over a [`tern_store::Store`]).

use std::fmt;

pub mod bgp;
pub mod namespace;
pub mod parse;
pub mod policy;
pub mod resources;
pub mod selector;
pub mod storage;
pub mod validate;

pub use bgp::{
    BgpConfiguration, BgpConfigurationSpec, BgpPeer, BgpPeerSpec, DEFAULT_AS_NUMBER,
    DEFAULT_BGP_CONFIGURATION, DEFAULT_BGP_PORT,
};
pub use namespace::{Namespace, NamespaceSpec};
pub use parse::parse_documents;
pub use policy::*;
pub use resources::*;
pub use selector::{Selector, SelectorError};
pub use storage::{delete_resource, get_resource, list_resources, put_resource, resource_key};
pub use validate::{ip_pool_overlaps, validate_dns1123_subdomain};

/// The only `apiVersion` tern accepts.
pub const API_VERSION: &str = "tern.dev/v1";

/// Errors of parsing, validating and storing resources.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A document could not be parsed; names the file, the line (when known) and the field path.
    #[error("{}", fmt_parse(.file, .line, .path, .message))]
    Parse {
        file: String,
        line: Option<usize>,
        /// Field path inside the document (`spec.blockSize`), `.` for the document itself.
        path: String,
        message: String,
    },
    /// A resource failed validation.
    #[error("{kind} {name:?}: {field}: {reason}")]
    Invalid {
        kind: &'static str,
        name: String,
        /// Field path (`spec.cidr`, `metadata.name`).
        field: String,
        reason: String,
    },
    /// An update carried a `resourceVersion` that no longer matches the stored one.
    #[error(
        "{kind} {name:?} was modified concurrently (resourceVersion {resource_version} is stale); re-read and retry"
    )]
    Conflict {
        kind: &'static str,
        name: String,
        resource_version: String,
    },
    /// A stored value could not be decoded.
    #[error("stored value at {key} is not a valid resource: {message}")]
    Corrupt { key: String, message: String },
    /// The datastore failed.
    #[error(transparent)]
    Store(#[from] tern_store::StoreError),
}

fn fmt_parse(file: &str, line: &Option<usize>, path: &str, message: &str) -> String {
    struct Loc<'a>(&'a str, &'a Option<usize>);
    impl fmt::Display for Loc<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.1 {
                Some(l) => write!(f, "{}:{l}", self.0),
                None => write!(f, "{}", self.0),
            }
        }
    }
    if path.is_empty() || path == "." {
        format!("{}: {message}", Loc(file, line))
    } else {
        format!("{}: {path}: {message}", Loc(file, line))
    }
}
