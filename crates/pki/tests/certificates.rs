//! The certificates `tern-pki` makes, checked by other code than the code that made them:
//! rustls-webpki verifies each leaf's chain, usage and names against its CA as a TLS peer
//! would; x509-parser reads the subject (Kubernetes' user and groups) and the key files'
//! modes are checked on disk.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tern_pki::{Ca, CertPair, CertSpec, San};
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::prelude::{FromDer, X509Certificate};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate")
}

/// Verifies `leaf` against the CA certificate `ca` for `usage` as rustls would.
fn verify(ca: &str, leaf: &str, usage: KeyUsage) -> Result<(), webpki::Error> {
    let ca = der(ca);
    let anchors = [webpki::anchor_from_trusted_cert(&ca).expect("a trust anchor")];
    let leaf = der(leaf);
    let leaf = EndEntityCert::try_from(&leaf).expect("an end-entity certificate");
    leaf.verify_for_usage(
        &[webpki::ring::ECDSA_P256_SHA256],
        &anchors,
        &[],
        UnixTime::now(),
        usage,
        None,
        None,
    )
    .map(drop)
}

fn valid_for_name(leaf: &str, name: &str) -> bool {
    let leaf = der(leaf);
    let leaf = EndEntityCert::try_from(&leaf).unwrap();
    let name = match name.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(name.to_string()).unwrap(),
    };
    leaf.verify_is_valid_for_subject_name(&name).is_ok()
}

/// The subject's O entries (every one, to see there is only one) and CN.
fn subject(pem: &str) -> (Vec<String>, String) {
    let der = der(pem);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let orgs = cert
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    (orgs, cn)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_server_certificate_verifies_for_its_names_and_addresses_only() {
    let ca = Ca::new("tern-test-ca", DAY).unwrap();
    let ip: IpAddr = "198.18.0.3".parse().unwrap();
    let leaf = ca
        .issue(&CertSpec::server(
            "kube-apiserver",
            [San::Ip(ip), San::dns("kubernetes.default.svc")],
        ))
        .unwrap();
    verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::server_auth()).unwrap();
    assert!(valid_for_name(&leaf.cert_pem, "198.18.0.3"));
    assert!(valid_for_name(&leaf.cert_pem, "kubernetes.default.svc"));
    assert!(!valid_for_name(&leaf.cert_pem, "198.18.0.4"));
    assert!(!valid_for_name(&leaf.cert_pem, "kubernetes"));
    // Server use only: a TLS server refuses it as a client certificate.
    let e = verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap_err();
    assert!(
        matches!(e, webpki::Error::RequiredEkuNotFoundContext(_)),
        "{e:?}"
    );
}

#[test]
fn a_client_certificate_names_a_kubernetes_user_and_its_groups() {
    let ca = Ca::new("tern-test-ca", DAY).unwrap();
    let leaf = ca
        .issue(&CertSpec::client("system:node:node1").org("system:nodes"))
        .unwrap();
    verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap();
    let e = verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::server_auth()).unwrap_err();
    assert!(
        matches!(e, webpki::Error::RequiredEkuNotFoundContext(_)),
        "{e:?}"
    );
    assert_eq!(
        subject(&leaf.cert_pem),
        (
            vec!["system:nodes".to_string()],
            "system:node:node1".to_string()
        )
    );
}

#[test]
fn a_server_and_client_certificate_serves_both_uses() {
    let ca = Ca::new("tern-test-ca", DAY).unwrap();
    let leaf = ca
        .issue(&CertSpec::server("etcd", [San::Ip([127, 0, 0, 1].into())]).and_client())
        .unwrap();
    verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::server_auth()).unwrap();
    verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap();
}

#[test]
fn another_cas_certificate_does_not_verify() {
    let ca = Ca::new("tern-test-ca", DAY).unwrap();
    let other = Ca::new("other-ca", DAY).unwrap();
    let leaf = other.issue(&CertSpec::client("admin")).unwrap();
    let e = verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap_err();
    assert!(matches!(e, webpki::Error::UnknownIssuer), "{e:?}");
    // A CA of the same name but another key: the signature is what fails.
    let twin = Ca::new("tern-test-ca", DAY).unwrap();
    let leaf = twin.issue(&CertSpec::client("admin")).unwrap();
    let e = verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap_err();
    assert!(
        matches!(e, webpki::Error::InvalidSignatureForPublicKey),
        "{e:?}"
    );
}

#[test]
fn an_expired_validity_is_refused() {
    let ca = Ca::new("tern-test-ca", DAY).unwrap();
    // Valid for no time at all: it began five minutes ago (backdated) and ended now.
    let leaf = ca
        .issue(&CertSpec::client("admin").valid_for(Duration::ZERO))
        .unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let e = verify(ca.cert_pem(), &leaf.cert_pem, KeyUsage::client_auth()).unwrap_err();
    assert!(matches!(e, webpki::Error::CertExpired { .. }), "{e:?}");
}

#[test]
fn a_ca_loaded_from_its_files_issues_what_its_certificate_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (made, pair) = Ca::load_or_create(dir.path(), "ca", "tern-lab-ca", DAY).unwrap();
    assert_eq!(pair, CertPair::named(dir.path(), "ca"));
    assert_eq!(mode(&pair.key), 0o600);
    assert_eq!(
        std::fs::read_to_string(&pair.cert).unwrap(),
        made.cert_pem()
    );
    // A second call keeps the CA on disk.
    let (again, _) = Ca::load_or_create(dir.path(), "ca", "tern-lab-ca", DAY).unwrap();
    assert_eq!(again.cert_pem(), made.cert_pem());
    let loaded = Ca::load(&pair).unwrap();
    let leaf = loaded
        .issue(&CertSpec::server("node1", [San::dns("node1")]))
        .unwrap();
    verify(made.cert_pem(), &leaf.cert_pem, KeyUsage::server_auth()).unwrap();
    let files = leaf
        .write(&dir.path().join("sub"), "kubelet-serving")
        .unwrap();
    assert_eq!(mode(&files.key), 0o600);
    assert_eq!(std::fs::read_to_string(&files.cert).unwrap(), leaf.cert_pem);
    assert_eq!(std::fs::read_to_string(&files.key).unwrap(), leaf.key_pem);
}

#[test]
fn loading_a_missing_ca_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = Ca::load(&CertPair::named(dir.path(), "ca")).unwrap_err();
    assert!(e.to_string().contains("ca.crt"), "{e}");
}

#[test]
fn a_rewritten_key_file_is_made_private() {
    let dir = tempfile::tempdir().unwrap();
    let pair = CertPair::named(dir.path(), "ca");
    std::fs::write(&pair.key, "old").unwrap();
    std::fs::set_permissions(&pair.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    Ca::new("tern-test-ca", DAY)
        .unwrap()
        .write(dir.path(), "ca")
        .unwrap();
    assert_eq!(mode(&pair.key), 0o600);
    assert!(Ca::load(&pair).is_ok());
}

#[test]
fn a_signing_key_pair_is_a_private_key_and_its_public_key() {
    let dir = tempfile::tempdir().unwrap();
    let pair = CertPair {
        cert: dir.path().join("sa.pub"),
        key: dir.path().join("sa.key"),
    };
    tern_pki::signing_key_pair(&pair).unwrap();
    assert_eq!(mode(&pair.key), 0o600);
    let public = std::fs::read_to_string(&pair.cert).unwrap();
    assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"), "{public}");
    let private = std::fs::read_to_string(&pair.key).unwrap();
    assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
    // The public key is the private key's.
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(private.as_bytes()).unwrap();
    let signer = rustls::crypto::ring::sign::any_ecdsa_type(&key).unwrap();
    let spki = signer.public_key().unwrap();
    let from_file =
        rustls::pki_types::SubjectPublicKeyInfoDer::from_pem_slice(public.as_bytes()).unwrap();
    assert_eq!(spki.as_ref(), from_file.as_ref());
}
