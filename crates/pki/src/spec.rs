//! What a leaf certificate says: its subject, the names it serves, its uses and how long it is
//! valid.

use std::net::IpAddr;
use std::time::Duration;

/// A subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum San {
    /// A DNS name.
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl San {
    /// A DNS name.
    pub fn dns(name: impl Into<String>) -> San {
        San::Dns(name.into())
    }
}

impl From<IpAddr> for San {
    fn from(ip: IpAddr) -> San {
        San::Ip(ip)
    }
}

/// What a leaf certificate is for. Built with [`CertSpec::server`] or [`CertSpec::client`];
/// Kubernetes reads the CN as the user name and the O as a group (`system:masters`,
/// `system:nodes` with CN `system:node:NAME`). One O at most: rcgen's subject holds one value
/// per attribute type, and no certificate here is in two groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSpec {
    /// Subject CN.
    pub cn: String,
    /// Subject O (a Kubernetes group).
    pub org: Option<String>,
    /// Subject alternative names.
    pub sans: Vec<San>,
    /// Extended key usage serverAuth.
    pub server: bool,
    /// Extended key usage clientAuth.
    pub client: bool,
    /// How long it is valid from now.
    pub validity: Duration,
}

/// Default validity of a leaf: two days, enough for any test; the lab sets its own.
const DEFAULT_VALIDITY: Duration = Duration::from_secs(2 * 24 * 3600);

impl CertSpec {
    /// A serving certificate for `cn` at the names and addresses `sans`.
    pub fn server(cn: impl Into<String>, sans: impl IntoIterator<Item = San>) -> CertSpec {
        CertSpec {
            cn: cn.into(),
            org: None,
            sans: sans.into_iter().collect(),
            server: true,
            client: false,
            validity: DEFAULT_VALIDITY,
        }
    }

    /// A client certificate for user `cn`.
    pub fn client(cn: impl Into<String>) -> CertSpec {
        CertSpec {
            cn: cn.into(),
            org: None,
            sans: Vec::new(),
            server: false,
            client: true,
            validity: DEFAULT_VALIDITY,
        }
    }

    /// Also usable as a client certificate (etcd's gateway dials etcd with its server's).
    pub fn and_client(mut self) -> CertSpec {
        self.client = true;
        self
    }

    /// With the subject O `org` (a Kubernetes group).
    pub fn org(mut self, org: impl Into<String>) -> CertSpec {
        self.org = Some(org.into());
        self
    }

    /// Valid for `validity` from now.
    pub fn valid_for(mut self, validity: Duration) -> CertSpec {
        self.validity = validity;
        self
    }
}
