//! The CNI side of the harness: the version and interface name every execution is sent with,
//! and the commands it issues.

use std::fmt;

/// The CNI version every configuration is sent with.
pub const CNI_VERSION: &str = "1.0.0";
/// The interface name requested inside every pod, as kubelet does.
pub const POD_IFNAME: &str = "eth0";

/// A CNI command the harness issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    /// `CNI_COMMAND=ADD`.
    Add,
    /// `CNI_COMMAND=DEL`.
    Del,
}

impl fmt::Display for CniCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
        })
    }
}
