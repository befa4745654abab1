//! The CNI error codes of the lifecycle's failures: the datastore's and IPAM's errors mapped to
//! "try again" (11) where the runtime's retry can succeed, the rest to tern's own codes.

use tern_api::ErrorReply;
use tern_cni::code;
use tern_ipam::IpamError;
use tern_store::StoreError;

pub(super) fn err(code: u32, msg: impl Into<String>) -> ErrorReply {
    ErrorReply {
        code,
        msg: msg.into(),
        details: String::new(),
    }
}

/// A store error as a CNI error of `what`.
pub fn store_err(what: &str, e: &StoreError) -> ErrorReply {
    match e {
        // A lost answer (leader change) the store could not resolve is as transient as an
        // unreachable store: "try again later" (11), never an internal error (101).
        StoreError::Unavailable(_) | StoreError::Ambiguous(_) => err(
            code::TRY_AGAIN_LATER,
            format!("{what}: the datastore is unreachable ({e}); retry when it is back"),
        ),
        // Refused by the API server's authorizer: for a moment after its restart, or until
        // the agent's ClusterRole is fixed; either way the runtime's retry can succeed.
        StoreError::Forbidden(_) => err(
            code::TRY_AGAIN_LATER,
            format!("{what}: {e}; retry once the agent's RBAC allows it"),
        ),
        _ => err(code::AGENT, format!("{what}: {e}")),
    }
}

/// An IPAM error as a CNI error.
pub fn ipam_err(e: &IpamError) -> ErrorReply {
    if let IpamError::Locked(_) = e {
        return err(code::TRY_AGAIN_LATER, format!("IPAM: {e}"));
    }
    if e.is_unavailable() {
        return err(
            code::TRY_AGAIN_LATER,
            format!("IPAM: the datastore is unreachable ({e}); retry when it is back"),
        );
    }
    match e {
        IpamError::Store(s) => store_err("IPAM", s),
        IpamError::PoolsExhausted { .. } | IpamError::NoPools { .. } => {
            err(code::POOL_EXHAUSTED, e.to_string())
        }
        IpamError::AddressInUse { .. } | IpamError::NotInPool { .. } => {
            err(code::ADDRESS_UNAVAILABLE, e.to_string())
        }
        _ => err(code::AGENT, format!("IPAM: {e}")),
    }
}

/// A kernel error of the wiring: an interface that exists already is CNI's "interface" error.
pub(super) fn link_err(e: tern_linux::LinuxError) -> ErrorReply {
    let c = if e.is_already_exists() {
        code::INTERFACE
    } else {
        code::AGENT
    };
    err(c, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unreachable store, a lost answer and an authorizer's refusal are "try again" (11)
    /// to the runtime; anything else is an internal error (101).
    #[test]
    fn store_errors_map_to_cni_codes() {
        let code = |e: StoreError| store_err("IPAM", &e).code;
        assert_eq!(
            code(StoreError::Unavailable("down".into())),
            code::TRY_AGAIN_LATER
        );
        assert_eq!(
            code(StoreError::Ambiguous("lost".into())),
            code::TRY_AGAIN_LATER
        );
        let forbidden = StoreError::Forbidden("list ippools.tern.dev: forbidden".into());
        let r = store_err("IPAM", &forbidden);
        assert_eq!(r.code, code::TRY_AGAIN_LATER);
        assert!(
            r.msg.contains("ippools.tern.dev") && r.msg.contains("RBAC"),
            "{}",
            r.msg
        );
        assert_eq!(code(StoreError::Backend("bad".into())), code::AGENT);
    }
}
