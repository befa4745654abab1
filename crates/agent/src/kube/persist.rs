//! The last complete set of namespaces and NetworkPolicies, kept in the state directory
//! ([`super::SNAPSHOT_FILE`]) and seeded into the policy engine at start.

use super::*;

impl Inner {
    pub(super) fn snapshot_path(&self) -> PathBuf {
        self.settings.state_dir.join(SNAPSHOT_FILE)
    }

    pub(super) fn load_snapshot(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let path = self.snapshot_path();
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                log::warn!("kubernetes: reading {}: {e}", path.display());
                return;
            }
        };
        let docs: Vec<serde_json::Value> = match serde_json::from_slice(&text) {
            Ok(d) => d,
            Err(e) => {
                log::warn!("kubernetes: ignoring unreadable {}: {e}", path.display());
                return;
            }
        };
        let objects: Vec<Resource> = docs
            .iter()
            .filter_map(|d| {
                let bytes = serde_json::to_vec(d).ok()?;
                Resource::from_json(&bytes)
                    .map_err(|e| log::warn!("kubernetes: snapshot entry skipped: {e}"))
                    .ok()
            })
            .collect();
        let n = objects.len();
        if let Err(e) = policy.replace(&[Kind::Namespace, Kind::K8sNetworkPolicy], objects, false) {
            log::warn!("kubernetes: seeding the policy engine: {e}");
        }
        log::info!(
            "kubernetes: {n} namespaces and policies from {} kept until the API server lists them",
            path.display()
        );
    }

    pub(super) fn save_snapshot(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let path = self.snapshot_path();
        let tmp = path.with_extension("json.tmp");
        let written = policy
            .objects_json()
            .map_err(std::io::Error::other)
            .and_then(|b| {
                std::fs::create_dir_all(&self.settings.state_dir)?;
                std::fs::write(&tmp, b)?;
                std::fs::rename(&tmp, &path)
            });
        if let Err(e) = written {
            log::warn!("kubernetes: writing {}: {e}", path.display());
            self.snapshot_dirty.store(true, Ordering::Relaxed);
        }
    }
}
