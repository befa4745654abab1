//! The `IPAMConfig` kind: the cluster's IPAM settings, a singleton named `default` stored at
//! `tern_store::keys::IPAM_CONFIG`, where the allocator reads it.

use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::validate::{FieldError, invalid};

/// The cluster IPAM configuration (one, named `default`).
pub type IpamConfig = Document<IpamConfigSpec>;

fn default_max_blocks() -> u32 {
    20
}

/// Spec of the [`IpamConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpamConfigSpec {
    /// When true, a node never borrows addresses from blocks affine to other nodes.
    #[serde(default)]
    pub strict_affinity: bool,
    /// Maximum blocks one node may claim; 0 = unlimited.
    #[serde(default = "default_max_blocks")]
    pub max_blocks_per_host: u32,
    /// A released address is not handed out again for this many seconds (0 = immediately;
    /// free addresses are reused oldest-first either way).
    #[serde(default)]
    pub release_cooldown_seconds: u64,
    /// An empty block stays affine to its node for at least this long before it may be
    /// released (never the node's last block).
    #[serde(default = "default_empty_block_grace")]
    pub empty_block_grace_seconds: u64,
    /// Set while the datastore is locked for a migration (`ternctl datastore lock`, and
    /// `ternctl datastore migrate` on its source; Calico's `datastore migrate lock`): why and
    /// by whom. While set no address is allocated or released here (a CNI ADD answers "try
    /// again later", a DEL is journaled and replayed on the datastore the agent uses next),
    /// so nothing changes in the blocks after they were copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_lock: Option<String>,
}

fn default_empty_block_grace() -> u64 {
    300
}

impl Default for IpamConfigSpec {
    fn default() -> Self {
        IpamConfigSpec {
            strict_affinity: false,
            max_blocks_per_host: default_max_blocks(),
            release_cooldown_seconds: 0,
            empty_block_grace_seconds: default_empty_block_grace(),
            migration_lock: None,
        }
    }
}

/// Write-time checks of the [`IpamConfig`].
pub(crate) fn validate_ipam_config(c: &IpamConfig) -> Result<(), FieldError> {
    if c.metadata.name != "default" {
        return Err(invalid(
            "metadata.name",
            "the IPAM configuration is a singleton and must be named \"default\"",
        ));
    }
    // Calico caps the cooldown at 20 minutes: longer only starves small pools.
    if c.spec.release_cooldown_seconds > 1200 {
        return Err(invalid(
            "spec.releaseCooldownSeconds",
            format!(
                "{} is more than the maximum 1200",
                c.spec.release_cooldown_seconds
            ),
        ));
    }
    Ok(())
}
