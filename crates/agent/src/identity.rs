//! The store's identity, so that a lost store cannot wipe the node.
//!
//! The first agent to find a store without tern keys records a random cluster ID in it
//! ([`tern_store::keys::CLUSTER_ID`], one create-only transaction). Every agent keeps the ID of
//! the cluster it last joined in `<state_dir>/identity` (mode 0600). Without this, a store file
//! that is truncated, deleted or swapped for another cluster's looks like a cluster with no
//! pods, and the start-up reconciliation deletes every running pod's veth as an orphan.
//!
//! At start ([`establish`]): a store that is empty, lacks the ID while holding data, or holds
//! another ID is refused while the node has local evidence of pods (tern-prefixed veths, or
//! journaled releases), with an error naming both IDs, the files and the override
//! (`--accept-new-store`). While running ([`store_trust_problem`], checked before every
//! pass that could delete interfaces): the store file replaced or deleted under the agent, or
//! the ID changed or gone, stops orphan deletion and makes `/readiness` fail with the reason.

use anyhow::Context;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tern_store::{Store, keys};

/// Name of the identity file in the state directory.
pub const IDENTITY_FILE: &str = "identity";

/// The path of the node's identity file.
pub fn identity_path(state_dir: &Path) -> PathBuf {
    state_dir.join(IDENTITY_FILE)
}

/// Reads the cluster ID the node last joined; `None` when the file does not exist.
pub fn read_identity(state_dir: &Path) -> anyhow::Result<Option<String>> {
    let path = identity_path(state_dir);
    let raw = match std::fs::read(&path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if raw.len() > 4096 {
        anyhow::bail!(
            "{} is {} bytes: not a tern identity file",
            path.display(),
            raw.len()
        );
    }
    let text = String::from_utf8_lossy(&raw);
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("cluster_id="))
        .and_then(|v| tern_store::parse_cluster_id(v.as_bytes()));
    match id {
        Some(id) => Ok(Some(id)),
        None => anyhow::bail!(
            "{} holds no valid cluster_id= line; delete it only if this node has no pods",
            path.display()
        ),
    }
}

/// The node name the identity file records (`node_name=`), if it records one: a node that
/// comes back under another name finds none of its endpoints in the store.
pub fn read_identity_node(state_dir: &Path) -> Option<String> {
    let raw = std::fs::read(identity_path(state_dir)).ok()?;
    if raw.len() > 4096 {
        return None;
    }
    String::from_utf8_lossy(&raw)
        .lines()
        .find_map(|l| l.strip_prefix("node_name="))
        .map(str::to_string)
        .filter(|n| !n.is_empty())
}

/// Writes the identity file atomically (temporary file, fsync, rename), mode 0600, never
/// through a symlink.
pub fn write_identity(state_dir: &Path, cluster_id: &str, node: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let path = identity_path(state_dir);
    let tmp = state_dir.join(format!(".{IDENTITY_FILE}.tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let body = format!(
        "# The tern cluster this node's pods belong to. ternd refuses a store without this ID\n\
         # while the node has pods; see ternd --accept-new-store.\n\
         cluster_id={cluster_id}\nnode_name={node}\n"
    );
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(body.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    write().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// What on this node shows that it runs pods, whatever the store says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LocalEvidence {
    /// Host veths with tern's prefix in the node's network namespace.
    pub veths: Vec<String>,
    /// Journaled releases in the state directory.
    pub journal_entries: usize,
}

impl LocalEvidence {
    /// True when nothing local depends on the store.
    pub fn is_empty(&self) -> bool {
        self.veths.is_empty() && self.journal_entries == 0
    }

    fn describe(&self) -> String {
        let mut shown: Vec<&str> = self.veths.iter().take(5).map(String::as_str).collect();
        if self.veths.len() > 5 {
            shown.push("...");
        }
        format!(
            "{} pod interfaces ({}) and {} journaled releases",
            self.veths.len(),
            if shown.is_empty() {
                "none".to_string()
            } else {
                shown.join(", ")
            },
            self.journal_entries
        )
    }
}

/// Looks for pods on this node: prefixed veths in the current network namespace and journal
/// entries in the state directory. An error reading either is reported, never taken as "none".
pub fn local_evidence(prefix: &str, state_dir: &Path) -> anyhow::Result<LocalEvidence> {
    let mut h = tern_linux::netlink::Handle::new().context("netlink (listing pod interfaces)")?;
    let veths = if prefix.is_empty() {
        Vec::new()
    } else {
        h.links()
            .context("listing interfaces")?
            .into_iter()
            .filter(|l| tern_linux::pod_veth_ours(l, prefix).is_ok())
            .map(|l| l.name)
            .collect()
    };
    let journal_entries = tern_api::journal::pending(state_dir)
        .with_context(|| format!("reading the release journal in {}", state_dir.display()))?
        .len();
    Ok(LocalEvidence {
        veths,
        journal_entries,
    })
}

/// The node as [`establish`] sees it (the agent's settings of the same names).
#[derive(Debug, Clone, Copy)]
pub struct Joining<'a> {
    pub node_name: &'a str,
    /// Only named in messages.
    pub store_url: &'a str,
    /// Where the identity file and the release journal live.
    pub state_dir: &'a Path,
    /// Host veths with this prefix are evidence of pods.
    pub interface_prefix: &'a str,
    /// `--accept-new-store`.
    pub accept_new_store: bool,
}

/// Decides whether this node may use `store`, records the cluster ID where needed and returns
/// it. Refuses (an error saying what to do) an empty, ID-less or foreign store while the node
/// has pods, unless `cfg.accept_new_store`.
pub fn establish(cfg: &Joining<'_>, store: &dyn Store) -> anyhow::Result<String> {
    let local = read_identity(cfg.state_dir)?;
    let in_store = tern_store::read_cluster_id(store).context("reading the cluster ID")?;
    let path = identity_path(cfg.state_dir);
    // The node's endpoints are recorded under its name: under a new name (a short hostname
    // turned FQDN) the store knows none of its pods, and every veth would look orphaned.
    let recorded_node = read_identity_node(cfg.state_dir);
    if let Some(old) = recorded_node.as_deref()
        && old != cfg.node_name
    {
        let evidence = local_evidence(cfg.interface_prefix, cfg.state_dir)?;
        if !evidence.is_empty() && !cfg.accept_new_store {
            anyhow::bail!(
                "refusing to start: {} records node name {old:?}, but ternd was started as \
                 {:?}, and this node has {}. The store records this node's pods under {old:?}; \
                 under another name they would look like orphans and lose their interfaces. \
                 Start ternd with --node-name {old}, or, if the rename is intended and the pods \
                 may be deleted, once with --accept-new-store (TERN_ACCEPT_NEW_STORE=true).",
                path.display(),
                cfg.node_name,
                evidence.describe()
            );
        }
        log::warn!(
            "{} records node name {old:?}; continuing as {:?} ({})",
            path.display(),
            cfg.node_name,
            if evidence.is_empty() {
                "this node has no pods"
            } else {
                "--accept-new-store"
            }
        );
    }
    // Only read the node's state when the store does not simply confirm it.
    if let (Some(l), Some(s)) = (&local, &in_store)
        && l == s
    {
        if recorded_node.as_deref() != Some(cfg.node_name) {
            write_identity(cfg.state_dir, s, cfg.node_name)?;
        }
        return Ok(s.clone());
    }
    let empty = in_store.is_none() && tern_store::is_empty(store).context("reading the store")?;
    let evidence = local_evidence(cfg.interface_prefix, cfg.state_dir)?;
    let store_desc = match (&in_store, empty) {
        (Some(s), _) => format!("holds cluster ID {s}"),
        (None, true) => "is empty (no tern keys: new, truncated, deleted or wiped)".to_string(),
        (None, false) => format!("holds tern data but no cluster ID at {}", keys::CLUSTER_ID),
    };
    let local_desc = match &local {
        Some(l) => format!("{} records cluster ID {l}", path.display()),
        None => format!("{} does not exist", path.display()),
    };
    // A store this node cannot vouch for, while pods depend on it.
    let suspicious = match (&local, &in_store) {
        (Some(l), Some(s)) => l != s,
        // Data without an ID: an upgrade from before cluster IDs when the node never joined
        // one; the ID key deleted (or another cluster's pre-ID store) when it did.
        (Some(_), None) => true,
        (None, None) => empty,
        (None, Some(_)) => false,
    };
    if suspicious && !evidence.is_empty() && !cfg.accept_new_store {
        anyhow::bail!(
            "refusing to start: the store {} {store_desc}, but {local_desc} and this node has {}. \
             Starting would treat those pods as orphans and delete their interfaces. If the \
             store was lost or replaced by mistake, restore it (or point --store at the right \
             one). To use this store anyway and let ternd delete the interfaces it does not \
             know, start ternd once with --accept-new-store (TERN_ACCEPT_NEW_STORE=true).",
            cfg.store_url,
            evidence.describe()
        );
    }
    let id = match in_store {
        Some(s) => s,
        None => tern_store::create_cluster_id(store).context("recording the cluster ID")?,
    };
    if suspicious {
        if evidence.is_empty() {
            log::warn!(
                "the store {} {store_desc} and {local_desc}; this node has no pods, so it joins \
                 cluster {id}",
                cfg.store_url
            );
        } else {
            log::error!(
                "--accept-new-store: the store {} {store_desc} and {local_desc}; joining cluster \
                 {id}: {} it does not know will be deleted",
                cfg.store_url,
                evidence.describe()
            );
        }
    } else if local.is_none() {
        log::info!("node {} joins cluster {id}", cfg.node_name);
    }
    write_identity(cfg.state_dir, &id, cfg.node_name)?;
    Ok(id)
}

/// Why the store can no longer be trusted to say which pods exist, if it cannot: its file
/// was deleted or replaced under the agent, or the cluster ID is gone or changed. Checked
/// before every reconciliation that could delete interfaces; a problem is kept for
/// `/readiness` and logged as an error when it first appears. A store that merely cannot
/// be read is reported as a problem for this pass only (no orphan is deleted on a guess).
/// `last` holds the problem found by the previous check.
pub fn store_trust_problem(
    store: &dyn Store,
    cluster_id: &str,
    last: &Mutex<Option<String>>,
) -> Option<String> {
    let found = match store.integrity_problem() {
        Some(p) => Some(p),
        None => match tern_store::read_cluster_id(store) {
            Ok(Some(id)) if id == cluster_id => None,
            Ok(Some(id)) => Some(format!(
                "the store now holds cluster ID {id}, not {} (the cluster this node joined)",
                cluster_id
            )),
            Ok(None) => Some(format!(
                "the store lost its cluster ID ({} is gone; this node joined {})",
                keys::CLUSTER_ID,
                cluster_id
            )),
            Err(e) => return Some(format!("cannot read the cluster ID now: {e}")),
        },
    };
    let mut cur = last.lock().unwrap_or_else(|e| e.into_inner());
    match (&found, &*cur) {
        (Some(p), prev) if prev.as_ref() != Some(p) => log::error!(
            "{p}: ternd stops deleting pod interfaces and reports not ready; restart it on \
             the right store (or with --accept-new-store to adopt this one)"
        ),
        (None, Some(_)) => {
            log::info!("the store is trusted again (cluster {})", cluster_id)
        }
        _ => {}
    }
    cur.clone_from(&found);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tern_store::mem::MemStore;

    fn cfg(dir: &Path, accept: bool) -> Joining<'_> {
        Joining {
            node_name: "n1",
            store_url: "mem://",
            state_dir: dir,
            // A prefix no interface of the test's namespace has: the journal is the evidence.
            interface_prefix: "zzterntest",
            accept_new_store: accept,
        }
    }

    fn journal_one(dir: &Path) {
        let entry = tern_api::journal::JournalEntry {
            attachment: tern_api::Attachment {
                network: "net".into(),
                container_id: "c1".into(),
                ifname: "eth0".into(),
                netns_path: String::new(),
                pod: None,
            },
            host_ifname: String::new(),
            delegated_ipam: false,
            source: "test".into(),
        };
        tern_api::journal::record(dir, &entry).unwrap();
    }

    #[test]
    fn identity_file_round_trip_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_identity(d.path()).unwrap(), None);
        write_identity(d.path(), "abc123", "n1").unwrap();
        assert_eq!(read_identity(d.path()).unwrap().as_deref(), Some("abc123"));
        let mode = std::fs::metadata(identity_path(d.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(identity_path(d.path()), "garbage").unwrap();
        let e = read_identity(d.path()).unwrap_err().to_string();
        assert!(e.contains("cluster_id"), "{e}");
    }

    #[test]
    fn fresh_node_fresh_store_creates_and_records_the_id() {
        let d = tempfile::tempdir().unwrap();
        let s = MemStore::new();
        let id = establish(&cfg(d.path(), false), &s).unwrap();
        assert_eq!(
            read_identity(d.path()).unwrap().as_deref(),
            Some(id.as_str())
        );
        assert_eq!(
            tern_store::read_cluster_id(&s).unwrap().as_deref(),
            Some(id.as_str())
        );
        // Restart on the same store: same ID, accepted.
        assert_eq!(establish(&cfg(d.path(), false), &s).unwrap(), id);
    }

    #[test]
    fn empty_store_with_local_pods_is_refused_without_writing() {
        let d = tempfile::tempdir().unwrap();
        let first = MemStore::new();
        let id = establish(&cfg(d.path(), false), &first).unwrap();
        journal_one(d.path());
        let wiped = MemStore::new();
        let e = establish(&cfg(d.path(), false), &wiped)
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to start"), "{e}");
        assert!(e.contains("is empty") && e.contains(&id), "{e}");
        assert!(
            e.contains("--accept-new-store") && e.contains("identity"),
            "{e}"
        );
        assert!(
            tern_store::is_empty(&wiped).unwrap(),
            "a refused start wrote to the store"
        );
        // The operator's override adopts the new store.
        let new = establish(&cfg(d.path(), true), &wiped).unwrap();
        assert_ne!(new, id);
        assert_eq!(
            read_identity(d.path()).unwrap().as_deref(),
            Some(new.as_str())
        );
    }

    /// F3: the same store under another node name (hostname turned FQDN) is refused while the
    /// node has pods, accepted without pods or with the override, and the new name is recorded.
    #[test]
    fn a_changed_node_name_with_local_pods_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = MemStore::new();
        let id = establish(&cfg(d.path(), false), &s).unwrap();
        assert_eq!(read_identity_node(d.path()).as_deref(), Some("n1"));
        let renamed = |accept| Joining {
            node_name: "n1.example.com",
            ..cfg(d.path(), accept)
        };
        // No pods: the rename is harmless and recorded.
        assert_eq!(establish(&renamed(false), &s).unwrap(), id);
        assert_eq!(
            read_identity_node(d.path()).as_deref(),
            Some("n1.example.com")
        );
        establish(&cfg(d.path(), false), &s).unwrap();
        journal_one(d.path());
        let e = establish(&renamed(false), &s).unwrap_err().to_string();
        assert!(
            e.contains("records node name \"n1\"") && e.contains("--accept-new-store"),
            "{e}"
        );
        assert_eq!(read_identity_node(d.path()).as_deref(), Some("n1"));
        assert_eq!(establish(&renamed(true), &s).unwrap(), id);
        assert_eq!(
            read_identity_node(d.path()).as_deref(),
            Some("n1.example.com")
        );
    }

    #[test]
    fn foreign_store_with_local_pods_is_refused() {
        let d = tempfile::tempdir().unwrap();
        establish(&cfg(d.path(), false), &MemStore::new()).unwrap();
        journal_one(d.path());
        let other = MemStore::new();
        let other_id = tern_store::create_cluster_id(&other).unwrap();
        let e = establish(&cfg(d.path(), false), &other)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("holds cluster ID {other_id}")), "{e}");
    }

    /// The etcd flavour at unit level: a non-empty store whose cluster ID key went missing (a
    /// partial wipe, a restore from before the ID) is refused while the node has pods, and
    /// noticed by a running agent's check.
    #[test]
    fn data_without_the_id_is_refused_when_the_node_joined_a_cluster() {
        let d = tempfile::tempdir().unwrap();
        let s = MemStore::new();
        establish(&cfg(d.path(), false), &s).unwrap();
        s.put("/tern/v1/resources/ippool/p", b"{}").unwrap();
        s.delete(keys::CLUSTER_ID).unwrap();
        journal_one(d.path());
        let e = establish(&cfg(d.path(), false), &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no cluster ID"), "{e}");
        // Without pods, the node re-records an ID and starts.
        let d2 = tempfile::tempdir().unwrap();
        assert!(establish(&cfg(d2.path(), false), &s).is_ok());
    }

    /// An upgrade: the store has data from before cluster IDs and the node never wrote an
    /// identity file. It keeps its pods and records an ID.
    #[test]
    fn pre_identity_store_is_adopted() {
        let d = tempfile::tempdir().unwrap();
        let s: Arc<dyn Store> = Arc::new(MemStore::new());
        s.put("/tern/v1/resources/ippool/p", b"{}").unwrap();
        journal_one(d.path());
        let id = establish(&cfg(d.path(), false), &*s).unwrap();
        assert_eq!(tern_store::read_cluster_id(&*s).unwrap(), Some(id));
    }
}
