//! tern's one certificate maker: a CA ([`Ca`]: made, or loaded from its PEM files), the leaf
//! certificates it issues ([`CertSpec`]: CN, O, DNS and IP SANs, server and/or client use,
//! validity), and plain signing key pairs ([`signing_key_pair`], the Kubernetes
//! service-account key). Everything is written as PEM, private keys with mode 0600.
//!
//! Built on `rcgen` with the `ring` backend that rustls already uses here; every key is ECDSA
//! P-256 (fast to make, and etcd and every Kubernetes component accept it).
//!
//! A crate of its own rather than a module of `tern-lab` or `tern-store`: the lab makes its
//! cluster's certificates with it in product code (`ternctl lab up`), and the test harnesses
//! of crates the lab does not sit under (`tern-store`'s TLS etcd, the agent's kube-apiserver)
//! make theirs with it too; it depends on no tern crate, so every crate can use it.

#![forbid(unsafe_code)]

mod ca;
mod files;
mod spec;

pub use ca::{Ca, Issued, signing_key_pair};
pub use files::CertPair;
pub use spec::{CertSpec, San};

/// What went wrong making, loading or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused (a bad name, key or certificate).
    #[error("{what}: {source}")]
    Rcgen {
        /// What was being made or read.
        what: String,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, PkiError>;
