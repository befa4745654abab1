//! The certificate authority: made (self-signed) or loaded from its PEM files, it signs leaf
//! certificates from a [`CertSpec`]; and plain key pairs for signing tokens.

use std::path::Path;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use crate::files::{self, CertPair};
use crate::spec::{CertSpec, San};
use crate::{PkiError, Result};

/// How far back a certificate's validity starts: a clock a little behind ours still accepts it.
const BACKDATE: Duration = Duration::from_secs(300);

/// A certificate authority: its certificate and the key that signs.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A certificate and its new private key, PEM, not yet on disk.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    /// The PEM certificate.
    pub cert_pem: String,
    /// The PEM (PKCS#8) private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Issued {
    /// Writes `<dir>/<name>.crt` and `<dir>/<name>.key` (mode 0600).
    pub fn write(&self, dir: &Path, name: &str) -> Result<CertPair> {
        let pair = CertPair::named(dir, name);
        pair.write(&self.cert_pem, &self.key_pem)?;
        Ok(pair)
    }
}

fn rcgen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> PkiError {
    let what = what.into();
    move |source| PkiError::Rcgen { what, source }
}

/// Parameters valid from a little before now for `validity`.
fn params_valid_for(validity: Duration) -> CertificateParams {
    let mut params = CertificateParams::default();
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
    params
}

impl Ca {
    /// A new self-signed CA with subject CN `cn`, valid for `validity`.
    pub fn new(cn: &str, validity: Duration) -> Result<Ca> {
        let key = KeyPair::generate().map_err(rcgen_err("generating the CA key"))?;
        let mut params = params_valid_for(validity);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err(format!("self-signing the CA {cn}")))?;
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA in the PEM files `pair` (a certificate and its PKCS#8 key).
    pub fn load(pair: &CertPair) -> Result<Ca> {
        let cert_pem = files::read(&pair.cert)?;
        let key_pem = files::read(&pair.key)?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(rcgen_err(format!("reading the key {}", pair.key.display())))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(rcgen_err(format!(
            "reading the CA certificate {}",
            pair.cert.display()
        )))?;
        Ok(Ca {
            cert_pem,
            key_pem,
            issuer,
        })
    }

    /// The CA in `<dir>/<name>.crt` and `.key` when both exist, else a new one (CN `cn`,
    /// valid for `validity`) written there. Its files and itself.
    pub fn load_or_create(
        dir: &Path,
        name: &str,
        cn: &str,
        validity: Duration,
    ) -> Result<(Ca, CertPair)> {
        let pair = CertPair::named(dir, name);
        if pair.cert.is_file() && pair.key.is_file() {
            return Ok((Ca::load(&pair)?, pair));
        }
        let ca = Ca::new(cn, validity)?;
        ca.write(dir, name)?;
        Ok((ca, pair))
    }

    /// Writes the CA's certificate and key to `<dir>/<name>.crt` and `.key` (mode 0600).
    pub fn write(&self, dir: &Path, name: &str) -> Result<CertPair> {
        let pair = CertPair::named(dir, name);
        pair.write(&self.cert_pem, &self.key_pem)?;
        Ok(pair)
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A new key and a certificate for it as `spec` says, signed by this CA.
    pub fn issue(&self, spec: &CertSpec) -> Result<Issued> {
        let what = || format!("issuing a certificate for {}", spec.cn);
        let key = KeyPair::generate().map_err(rcgen_err(what()))?;
        let mut params = params_valid_for(spec.validity);
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(o) = &spec.org {
            params
                .distinguished_name
                .push(DnType::OrganizationName, o.as_str());
        }
        params
            .distinguished_name
            .push(DnType::CommonName, spec.cn.as_str());
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if spec.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        for san in &spec.sans {
            params.subject_alt_names.push(match san {
                San::Ip(ip) => SanType::IpAddress(*ip),
                San::Dns(name) => SanType::DnsName(
                    name.as_str()
                        .try_into()
                        .map_err(rcgen_err(format!("the DNS name {name:?}")))?,
                ),
            });
        }
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err(what()))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// A new signing key pair (no certificate): the private key at `pair.key` (mode 0600) and its
/// public key (SubjectPublicKeyInfo PEM) at `pair.cert`. Kubernetes signs service-account
/// tokens with it (`--service-account-signing-key-file`, `--service-account-key-file`).
pub fn signing_key_pair(pair: &CertPair) -> Result<()> {
    let key = KeyPair::generate().map_err(rcgen_err("generating a signing key"))?;
    pair.write(&key.public_key_pem(), &key.serialize_pem())
}
