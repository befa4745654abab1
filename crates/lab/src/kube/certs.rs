//! The cluster's PKI, made with the `openssl` command line: one CA signs the apiserver's
//! serving certificate, every client certificate (admin, controller-manager, scheduler,
//! kube-proxy, each kubelet, the apiserver's kubelet client) and each kubelet's serving
//! certificate, so `kubectl exec/logs/port-forward` verify the kubelet. Keys are ECDSA P-256
//! (fast to make; every component accepts them). Plus the service-account signing key pair
//! and the kubeconfig files that point at them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::run;
use crate::{LabError, Result};

/// Days the lab's certificates are valid: labs are throwaway.
const DAYS: &str = "30";

/// A key and certificate pair on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    /// The PEM certificate.
    pub cert: PathBuf,
    /// The PEM private key.
    pub key: PathBuf,
}

/// What a certificate is for.
#[derive(Debug, Clone, Default)]
pub struct CertSpec<'a> {
    /// Subject CN (a user name for client certificates).
    pub cn: &'a str,
    /// Subject O entries (group names for client certificates).
    pub orgs: &'a [&'a str],
    /// Subject alternative names (`IP:1.2.3.4`, `DNS:name`); makes it a serving certificate.
    pub sans: &'a [String],
    /// Also usable as a client certificate (every certificate here but pure servers).
    pub client: bool,
}

fn openssl() -> Command {
    Command::new("openssl")
}

fn gen_key(path: &Path) -> Result<()> {
    run(openssl()
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .arg("-out")
        .arg(path))
    .map(drop)
}

/// The cluster CA under `dir` (`ca.crt`, `ca.key`); kept if it already exists.
pub fn ca(dir: &Path) -> Result<CertPair> {
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
    let pair = CertPair {
        cert: dir.join("ca.crt"),
        key: dir.join("ca.key"),
    };
    if pair.cert.is_file() && pair.key.is_file() {
        return Ok(pair);
    }
    gen_key(&pair.key)?;
    run(openssl()
        .args(["req", "-x509", "-new", "-sha256", "-days", DAYS])
        .arg("-key")
        .arg(&pair.key)
        .args(["-subj", "/CN=tern-lab-ca"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args([
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ])
        .arg("-out")
        .arg(&pair.cert))?;
    Ok(pair)
}

/// Issues `<dir>/<name>.crt` and `.key` signed by `ca`.
pub fn issue(dir: &Path, name: &str, ca: &CertPair, spec: &CertSpec<'_>) -> Result<CertPair> {
    let pair = CertPair {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    gen_key(&pair.key)?;
    let mut subj = String::new();
    for o in spec.orgs {
        subj.push_str(&format!("/O={o}"));
    }
    subj.push_str(&format!("/CN={}", spec.cn));
    let csr = dir.join(format!("{name}.csr"));
    run(openssl()
        .args(["req", "-new", "-sha256"])
        .arg("-key")
        .arg(&pair.key)
        .args(["-subj", &subj])
        .arg("-out")
        .arg(&csr))?;
    let mut usages = Vec::new();
    if spec.client {
        usages.push("clientAuth");
    }
    if !spec.sans.is_empty() {
        usages.push("serverAuth");
    }
    let mut ext = String::from(
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
    );
    ext.push_str(&format!("extendedKeyUsage={}\n", usages.join(",")));
    if !spec.sans.is_empty() {
        ext.push_str(&format!("subjectAltName={}\n", spec.sans.join(",")));
    }
    let ext_path = dir.join(format!("{name}.ext"));
    std::fs::write(&ext_path, ext)
        .map_err(|e| LabError::io(format!("cannot write {}", ext_path.display()), e))?;
    run(openssl()
        .args(["x509", "-req", "-sha256", "-days", DAYS])
        .arg("-in")
        .arg(&csr)
        .arg("-CA")
        .arg(&ca.cert)
        .arg("-CAkey")
        .arg(&ca.key)
        .arg("-CAcreateserial")
        .arg("-extfile")
        .arg(&ext_path)
        .arg("-out")
        .arg(&pair.cert))?;
    let _ = std::fs::remove_file(&csr);
    let _ = std::fs::remove_file(&ext_path);
    Ok(pair)
}

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
