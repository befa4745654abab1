//! PEM files on disk: a certificate beside its key, the key readable by its owner only.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{PkiError, Result};

/// A certificate (or public key) and its private key on disk, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPair {
    /// The PEM certificate (or public key).
    pub cert: PathBuf,
    /// The PEM private key (mode 0600).
    pub key: PathBuf,
}

impl CertPair {
    /// `<dir>/<name>.crt` and `<dir>/<name>.key`.
    pub fn named(dir: &Path, name: &str) -> CertPair {
        CertPair {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        }
    }

    /// Writes `cert` and `key` (the key with mode 0600, also when it replaces a file), creating
    /// the directory when missing.
    pub(crate) fn write(&self, cert: &str, key: &str) -> Result<()> {
        for parent in [&self.cert, &self.key]
            .into_iter()
            .filter_map(|p| p.parent())
        {
            fs::create_dir_all(parent).map_err(|source| PkiError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        write_file(&self.key, key, 0o600)?;
        write_file(&self.cert, cert, 0o644)
    }
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    // `mode` applies only to a new file: an existing one gets it here, before the key is in it.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}

/// Reads a PEM file.
pub(crate) fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    })
}
