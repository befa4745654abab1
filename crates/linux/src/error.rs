//! The crate's single error type: every variant names what was being done and to what.

use std::io;
use std::path::PathBuf;

/// Errors from kernel adapters. Each carries enough context to be shown to an operator as is.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// A network namespace path does not exist.
    #[error("network namespace {path} not found")]
    NetnsNotFound {
        /// The path that was opened.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done ("open network namespace /run/netns/x").
        context: String,
        /// The underlying OS error.
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a netlink request.
    #[error("{context}: {source}{}", ext_ack_suffix(.ext_ack))]
    Netlink {
        /// The operation ("create veth tern1234 (peer eth0)").
        context: String,
        /// The errno the kernel answered with.
        #[source]
        source: io::Error,
        /// The kernel's extended acknowledgement message, when it sent one.
        ext_ack: Option<String>,
    },
    /// The pod interface name is taken inside the pod's namespace (CNI ADD must fail).
    #[error("interface {name} already exists in container namespace {namespace}")]
    InterfaceExists {
        /// The interface name (`CNI_IFNAME`).
        name: String,
        /// The namespace path (or `fd N`).
        namespace: String,
    },
    /// Something that must not exist already does ("network namespace /run/netns/x").
    #[error("{what} already exists")]
    AlreadyExists {
        /// Description of the existing object.
        what: String,
    },
    /// Something expected is missing (used by checks and look-ups that must succeed).
    #[error("{what} not found")]
    NotFound {
        /// Description of the missing object.
        what: String,
    },
    /// A CHECK found state that differs from what was expected.
    #[error("check failed: {0}")]
    CheckFailed(String),
    /// A caller passed something the kernel would refuse or misinterpret.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The kernel sent something this crate could not parse.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
}

fn ext_ack_suffix(ext_ack: &Option<String>) -> String {
    match ext_ack {
        Some(msg) => format!(" ({msg})"),
        None => String::new(),
    }
}

impl LinuxError {
    /// True when the error means "the thing does not exist": a missing namespace, interface,
    /// route or file. Deletes treat these as success.
    pub fn is_not_found(&self) -> bool {
        match self {
            LinuxError::NetnsNotFound { .. } | LinuxError::NotFound { .. } => true,
            LinuxError::Io { source, .. } | LinuxError::Netlink { source, .. } => {
                errno_is_not_found(source)
            }
            _ => false,
        }
    }

    /// True when the kernel answered EEXIST (or the crate detected an existing object).
    pub fn is_already_exists(&self) -> bool {
        match self {
            LinuxError::AlreadyExists { .. } | LinuxError::InterfaceExists { .. } => true,
            LinuxError::Io { source, .. } | LinuxError::Netlink { source, .. } => {
                source.raw_os_error() == Some(libc::EEXIST)
            }
            _ => false,
        }
    }

    /// The errno behind this error, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            LinuxError::Io { source, .. } | LinuxError::Netlink { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        LinuxError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn last_os(context: impl Into<String>) -> Self {
        LinuxError::io(context, io::Error::last_os_error())
    }
}

fn errno_is_not_found(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ESRCH) | Some(libc::EADDRNOTAVAIL)
    )
}

/// Result alias for this crate.
pub type Result<T, E = LinuxError> = std::result::Result<T, E>;
