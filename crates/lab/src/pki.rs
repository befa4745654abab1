//! The lab's PKI, made with the `openssl` command line: a CA and the certificates it issues
//! (client, serving, or both). Keys are ECDSA P-256 (fast to make; etcd and every Kubernetes
//! component accept them). Used by the lab's etcd over TLS (`topology`) and the Kubernetes
//! cluster (`kube::certs`).

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

pub(crate) fn openssl() -> Command {
    Command::new("openssl")
}

/// A new ECDSA P-256 private key at `path`.
pub(crate) fn gen_key(path: &Path) -> Result<()> {
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

/// A CA under `dir` (`ca.crt`, `ca.key`); kept if it already exists.
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
