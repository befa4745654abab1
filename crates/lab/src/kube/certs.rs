//! The cluster's PKI, made by [`crate::pki`]: one CA signs the apiserver's serving
//! certificate, every client certificate (admin, controller-manager, scheduler, kube-proxy,
//! each kubelet, the apiserver's kubelet client) and each kubelet's serving certificate, so
//! `kubectl exec/logs/port-forward` verify the kubelet. Plus the service-account signing key
//! pair and the kubeconfig files that point at them.

use std::path::Path;

pub use crate::pki::{Ca, CertPair, CertSpec, San, ca, ip_san, issue};
use crate::{LabError, Result};

/// The API server's serving certificate (`apiserver.crt`/`.key` in `dir`), for the names and
/// addresses in `sans`.
pub fn issue_apiserver(dir: &Path, ca: &Ca, sans: Vec<San>) -> Result<CertPair> {
    issue(
        dir,
        "apiserver",
        ca,
        CertSpec::server("kube-apiserver", sans),
    )
}

/// The service-account signing key pair (`sa.key`, `sa.pub`).
pub fn service_account_keys(dir: &Path) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join("sa.pub"),
        key: dir.join("sa.key"),
    };
    tern_pki::signing_key_pair(&pair).map_err(LabError::Pki)?;
    Ok(pair)
}

/// Writes a kubeconfig for `user` (certificate `client`) talking to `server`.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    client: &CertPair,
) -> Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: tern-lab\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- name: tern-lab\n  context:\n    cluster: tern-lab\n    user: {user}\ncurrent-context: tern-lab\n",
        ca = ca.display(),
        cert = client.cert.display(),
        key = client.key.display(),
    );
    std::fs::write(path, text)
        .map_err(|e| LabError::io(format!("cannot write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_cluster_files_are_where_the_components_look() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, ca_files) = ca(dir.path()).unwrap();
        assert_eq!(ca_files, CertPair::named(dir.path(), "ca"));
        let server = issue_apiserver(dir.path(), &ca, vec![ip_san("198.18.0.3").unwrap()]).unwrap();
        assert_eq!(server, CertPair::named(dir.path(), "apiserver"));
        let sa = service_account_keys(dir.path()).unwrap();
        for key in [&ca_files.key, &server.key, &sa.key] {
            let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        let public = std::fs::read_to_string(dir.path().join("sa.pub")).unwrap();
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
        // Reusing the directory keeps the CA.
        let (again, _) = super::ca(dir.path()).unwrap();
        assert_eq!(again.cert_pem(), ca.cert_pem());
        assert!(ip_san("node-1").unwrap_err().to_string().contains("node-1"));
    }
}
