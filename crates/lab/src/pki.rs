//! The lab's PKI, made by [`tern_pki`]: one CA per directory (kept when it exists, so nodes
//! joining later are signed by the same one) and the certificates it issues, all valid for
//! [`VALIDITY`]. Used by the lab's etcd over TLS (`topology`) and the Kubernetes cluster
//! (`kube::certs`).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

pub use tern_pki::{Ca, CertPair, CertSpec, San};

use crate::{LabError, Result};

/// How long the lab's certificates are valid: labs are throwaway.
pub const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

/// The CA under `dir` (`ca.crt`, `ca.key`): loaded if it exists, else made. Itself and its
/// files.
pub fn ca(dir: &Path) -> Result<(Ca, CertPair)> {
    Ca::load_or_create(dir, "ca", "tern-lab-ca", VALIDITY).map_err(LabError::Pki)
}

/// Issues `<dir>/<name>.crt` and `.key` as `spec` says (valid for [`VALIDITY`]), signed by
/// `ca`.
pub fn issue(dir: &Path, name: &str, ca: &Ca, spec: CertSpec) -> Result<CertPair> {
    ca.issue(&spec.valid_for(VALIDITY))
        .and_then(|issued| issued.write(dir, name))
        .map_err(LabError::Pki)
}

/// The IP address SAN for an address of the lab's state.
pub fn ip_san(address: &str) -> Result<San> {
    address.parse::<IpAddr>().map(San::Ip).map_err(|e| {
        LabError::Invalid(format!(
            "{address:?} is no IP address for a certificate: {e}"
        ))
    })
}
