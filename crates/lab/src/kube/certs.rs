//! The cluster's PKI, made with the `openssl` command line: one CA signs the apiserver's
//! serving certificate, every client certificate (admin, controller-manager, scheduler,
//! kube-proxy, each kubelet, the apiserver's kubelet client) and each kubelet's serving
//! certificate, so `kubectl exec/logs/port-forward` verify the kubelet. Keys are ECDSA P-256
//! (fast to make; every component accepts them). Plus the service-account signing key pair
//! and the kubeconfig files that point at them. The CA and the certificates are the lab's
//! [`crate::pki`]'s.

use std::path::Path;

pub use crate::pki::{CertPair, CertSpec, ca, issue};
use crate::pki::{gen_key, openssl};
use crate::process::run;
use crate::{LabError, Result};

/// The API server's serving certificate (`apiserver.crt`/`.key` in `dir`), for the names and
/// addresses in `sans` (`IP:...`, `DNS:...`).
pub fn issue_apiserver(dir: &Path, ca: &CertPair, sans: &[String]) -> Result<CertPair> {
    issue(
        dir,
        "apiserver",
        ca,
        &CertSpec {
            cn: "kube-apiserver",
            sans,
            ..CertSpec::default()
        },
    )
}

/// The service-account signing key pair (`sa.key`, `sa.pub`).
pub fn service_account_keys(dir: &Path) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join("sa.pub"),
        key: dir.join("sa.key"),
    };
    gen_key(&pair.key)?;
    run(openssl()
        .args(["pkey", "-pubout"])
        .arg("-in")
        .arg(&pair.key)
        .arg("-out")
        .arg(&pair.cert))?;
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
    use std::process::Command;

    use super::*;

    #[test]
    fn issued_certificates_verify_against_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path()).unwrap();
        let sans = vec!["IP:198.18.0.3".to_string(), "DNS:kubernetes".to_string()];
        let server = issue_apiserver(dir.path(), &ca, &sans).unwrap();
        let client = issue(
            dir.path(),
            "node1",
            &ca,
            &CertSpec {
                cn: "system:node:node1",
                orgs: &["system:nodes"],
                client: true,
                ..CertSpec::default()
            },
        )
        .unwrap();
        for c in [&server.cert, &client.cert] {
            run(Command::new("openssl")
                .arg("verify")
                .arg("-CAfile")
                .arg(&ca.cert)
                .arg(c))
            .unwrap();
        }
        let text = run(Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&client.cert))
        .unwrap();
        assert!(
            text.contains("O = system:nodes, CN = system:node:node1"),
            "{text}"
        );
        assert!(text.contains("TLS Web Client Authentication"), "{text}");
        let text = run(Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&server.cert))
        .unwrap();
        assert!(text.contains("IP Address:198.18.0.3"), "{text}");
        // Reusing the CA keeps it.
        let again = super::ca(dir.path()).unwrap();
        assert_eq!(
            std::fs::read(&again.cert).unwrap(),
            std::fs::read(&ca.cert).unwrap()
        );
    }
}
