//! The node-local release journal.
//!
//! A DEL must succeed even when ternd or the store is down. Whoever performs the local teardown
//! then records the release that could not be completed here: one small JSON file per
//! attachment under `<state_dir>/journal/`, written atomically (temp file + rename). ternd replays
//! the journal at start and periodically, releasing the addresses and deleting the endpoint, and
//! removes each entry only once its release is complete. Replaying an entry twice is harmless:
//! every release is idempotent.

use crate::Attachment;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One pending release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub attachment: Attachment,
    /// The host-side interface, when known, so the agent can finish a partial teardown.
    #[serde(default)]
    pub host_ifname: String,
    /// IPAM was delegated: release nothing in tern IPAM, only the endpoint.
    #[serde(default)]
    pub delegated_ipam: bool,
    /// Who wrote it: "plugin" or "agent".
    #[serde(default)]
    pub source: String,
}

/// The journal directory inside a state directory.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("journal")
}

fn file_name(a: &Attachment) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}.{}.{}.json",
        clean(&a.network),
        clean(&a.container_id),
        clean(&a.ifname)
    )
}

/// Records a pending release; overwrites an entry for the same attachment.
pub fn record(state_dir: &Path, entry: &JournalEntry) -> io::Result<PathBuf> {
    let d = dir(state_dir);
    fs::create_dir_all(&d)?;
    let path = d.join(file_name(&entry.attachment));
    let tmp = d.join(format!(
        ".{}.tmp{}",
        file_name(&entry.attachment),
        std::process::id()
    ));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(entry).map_err(io::Error::other)?)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Every pending entry with its file; unreadable files are returned as errors, not skipped
/// silently, so the agent can log them.
pub fn pending(state_dir: &Path) -> io::Result<Vec<(PathBuf, Result<JournalEntry, String>)>> {
    let d = dir(state_dir);
    let mut out = Vec::new();
    let rd = match fs::read_dir(&d) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for ent in rd {
        let path = ent?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        let parsed = fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        out.push((path, parsed));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Removes a completed entry; Ok if already gone.
pub fn complete(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_pending_complete() {
        let d = std::env::temp_dir().join(format!("tern-journal-test-{}", std::process::id()));
        let a = Attachment {
            network: "net".into(),
            container_id: "c/1".into(),
            ifname: "eth0".into(),
            ..Default::default()
        };
        let e = JournalEntry {
            attachment: a,
            host_ifname: "ternabc".into(),
            delegated_ipam: false,
            source: "plugin".into(),
        };
        let p = record(&d, &e).unwrap();
        assert!(
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("net.c_1.eth0")
        );
        record(&d, &e).unwrap();
        let all = pending(&d).unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1.as_ref().unwrap(), &e);
        complete(&p).unwrap();
        complete(&p).unwrap();
        assert!(pending(&d).unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
