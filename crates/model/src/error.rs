//! [`ModelError`], the one error type of the crate. A leaf: it imports nothing of the crate, so
//! every module may use it.

use std::fmt;

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
