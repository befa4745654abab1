//! The allocator's errors, and the retry bound after which a conflict is one.

use std::net::IpAddr;

use tern_model::ModelError;
use tern_store::StoreError;

/// How often a compare-and-swap is retried on conflict before giving up.
pub(crate) const RETRIES: usize = 100;

/// Errors of the allocator.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// Every candidate pool is full (or the node may not claim/borrow more).
    #[error("no free address in pools [{}] for node {node}{}", .pools.join(", "), fmt_detail(.detail))]
    PoolsExhausted {
        pools: Vec<String>,
        node: String,
        detail: String,
    },
    /// No enabled pool of the family is usable for this request.
    #[error("no usable IPv{family} pool for node {node}{}", fmt_detail(.detail))]
    NoPools {
        family: u8,
        node: String,
        detail: String,
    },
    /// The requested address is allocated already.
    #[error("{ip} is already in use (handle {handle})")]
    AddressInUse { ip: IpAddr, handle: String },
    /// The requested address is in no enabled pool.
    #[error("{ip} is not in any enabled IP pool")]
    NotInPool { ip: IpAddr },
    /// Compare-and-swap kept failing.
    #[error("gave up on {key} after {RETRIES} conflicting concurrent updates")]
    Contention { key: String },
    /// The datastore is locked for a migration (`IPAMConfig` `spec.migrationLock`): nothing is
    /// allocated or released until it is unlocked (or the agent uses the new datastore).
    #[error(
        "the datastore is locked for a migration ({0}); no address is allocated or released          until `ternctl datastore unlock` or the agents use the new datastore"
    )]
    Locked(String),
    /// A stored IPAM record does not decode.
    #[error("corrupt IPAM record at {key}: {message}")]
    Corrupt { key: String, message: String },
    /// A stored resource (pool, config) is invalid.
    #[error(transparent)]
    Model(ModelError),
    /// The datastore failed; see [`IpamError::is_unavailable`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(crate) fn fmt_detail(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

impl IpamError {
    /// True when the datastore could not be reached: the caller should retry later (the
    /// agent reports CNI error code 11, "try again later").
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            IpamError::Store(StoreError::Unavailable(_) | StoreError::Ambiguous(_))
                | IpamError::Locked(_)
        )
    }
}

impl From<ModelError> for IpamError {
    fn from(e: ModelError) -> IpamError {
        match e {
            ModelError::Store(s) => IpamError::Store(s),
            other => IpamError::Model(other),
        }
    }
}

/// Result of the allocator.
pub type Result<T> = std::result::Result<T, IpamError>;
