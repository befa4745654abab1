//! The two kernel-wide things a kubelet touches: cgroups at the hierarchy roots and a few
//! sysctls. Every node's kubelet gets a cgroup root `/tl-<lab>-<node>` in every mounted
//! hierarchy (kubepods and everything below are created in it), so removing the lab's cgroups
//! is removing those subtrees; the sysctls are saved before the first kubelet starts and
//! restored at `down`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{LabError, Result};

/// Where the cgroup hierarchies are mounted.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// The kernel-wide sysctls kubelet sets at start (`pkg/kubelet/cm/container_manager_linux.go`
/// with `protectKernelDefaults: false`).
pub const KUBELET_SYSCTLS: [&str; 3] = [
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
];

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// Where the machine's own values of [`KUBELET_SYSCTLS`] are kept while any lab runs kubelets,
/// with the labs that hold them: several labs (or test processes) may overlap, and the second
/// one must not mistake the first one's kubelet values for the machine's.
fn registry_path() -> PathBuf {
    Path::new(crate::RUN_DIR).join("kubelet-sysctls.json")
}

/// The registry: the machine's values, and the labs whose kubelets may have changed them.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Registry {
    original: Vec<(String, String)>,
    holders: Vec<String>,
}

/// Runs `f` on the registry at `path` under an exclusive `flock`, writing it back (or
/// removing it when `f` returns `None`).
fn with_registry<T>(
    path: &Path,
    f: impl FnOnce(Option<Registry>) -> (Option<Registry>, T),
) -> Result<T> {
    use std::os::fd::AsRawFd;
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)
        .map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
    let lock_path = path.with_extension("lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| LabError::io(format!("cannot open {}", lock_path.display()), e))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(LabError::io(
            format!("cannot lock {}", lock_path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    let current = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Registry>(&b).ok());
    let (next, out) = f(current);
    let written = match next {
        Some(r) => {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&r).unwrap_or_default())
                .and_then(|_| std::fs::rename(&tmp, path))
        }
        None => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    };
    written.map_err(|e| LabError::io(format!("cannot write {}", path.display()), e))?;
    Ok(out)
}

/// The kernel's current values of [`KUBELET_SYSCTLS`] (tests compare them before and after).
pub fn read_current() -> Result<Vec<(String, String)>> {
    KUBELET_SYSCTLS
        .iter()
        .map(|k| {
            let p = sysctl_path(k);
            std::fs::read_to_string(&p)
                .map(|v| (k.to_string(), v.trim().to_string()))
                .map_err(|e| LabError::io(format!("cannot read {}", p.display()), e))
        })
        .collect()
}

/// The machine's values of [`KUBELET_SYSCTLS`], recorded for `lab` before its first kubelet
/// starts. The first lab to start reads them from the kernel; a lab that starts while others
/// still run kubelets gets the values the first one recorded (the kernel then shows kubelet's).
/// Labs whose state directory is gone (crashed without `down`) stop holding the values.
pub fn save_sysctls(lab: &str) -> Result<Vec<(String, String)>> {
    save_in(&registry_path(), lab)
}

/// [`save_sysctls`] with the registry at `registry`.
fn save_in(registry: &Path, lab: &str) -> Result<Vec<(String, String)>> {
    let now = read_current()?;
    with_registry(registry, |reg| {
        let mut reg = reg.unwrap_or_else(|| Registry {
            original: now.clone(),
            holders: Vec::new(),
        });
        reg.holders
            .retain(|h| h != lab && crate::state::lab_dir(h).exists());
        if reg.holders.is_empty() {
            reg.original = now.clone();
        }
        reg.holders.push(lab.to_string());
        let original = reg.original.clone();
        (Some(reg), original)
    })
}

/// Called at `lab`'s `down`: when no other lab still runs kubelets, writes the machine's values
/// back (falling back to `saved`, what `lab` recorded, if the registry is gone); returns what
/// was restored (changed values only). While other labs hold them nothing is written: their
/// kubelets expect kubelet's values, and the last one out restores the machine's.
pub fn restore_sysctls(saved: &[(String, String)], lab: &str) -> Result<Vec<String>> {
    let Some(original) = release_in(&registry_path(), saved, lab)? else {
        return Ok(vec![
            "kubelet sysctls left to the other labs still running kubelets".to_string(),
        ]);
    };
    write_values(&original)
}

/// Removes `lab` from the registry at `registry`: the values to write back when it was the
/// last holder (`saved` if the registry is gone), `None` while other labs hold them.
fn release_in(
    registry: &Path,
    saved: &[(String, String)],
    lab: &str,
) -> Result<Option<Vec<(String, String)>>> {
    with_registry(registry, |reg| match reg {
        None => (None, Some(saved.to_vec())),
        Some(mut reg) => {
            reg.holders
                .retain(|h| h != lab && crate::state::lab_dir(h).exists());
            if reg.holders.is_empty() {
                let o = reg.original.clone();
                (None, Some(o))
            } else {
                (Some(reg), None)
            }
        }
    })
}

/// Writes values back; returns what changed.
fn write_values(saved: &[(String, String)]) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for (k, v) in saved {
        let p = sysctl_path(k);
        let now = std::fs::read_to_string(&p).unwrap_or_default();
        if now.trim() == v {
            continue;
        }
        std::fs::write(&p, v).map_err(|e| LabError::io(format!("cannot restore {k}={v}"), e))?;
        done.push(format!("restored {k}={v} (was {})", now.trim()));
    }
    Ok(done)
}

/// Every mounted hierarchy: directories of [`CGROUP_MOUNT`] holding `cgroup.procs`.
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(CGROUP_MOUNT) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect();
    if Path::new(CGROUP_MOUNT).join("cgroup.procs").is_file() {
        // A pure cgroup v2 machine: one hierarchy at the mount point itself.
        v = vec![PathBuf::from(CGROUP_MOUNT)];
    }
    v.sort();
    v
}

/// Creates `/<root>/<child>` for each child (and `/<root>`) in every hierarchy. cpuset
/// cgroups start with no CPUs or memory nodes, so those are copied from the parent.
pub fn create(root: &str, children: &[&str]) -> Result<()> {
    for h in hierarchies() {
        let mut dirs = vec![h.join(root)];
        dirs.extend(children.iter().map(|c| h.join(root).join(c)));
        for d in dirs {
            if !d.is_dir() {
                std::fs::create_dir(&d).map_err(|e| {
                    LabError::io(format!("cannot create cgroup {}", d.display()), e)
                })?;
            }
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let own = d.join(f);
                let Some(parent) = d.parent() else { continue };
                if !own.is_file() {
                    continue;
                }
                let current = std::fs::read_to_string(&own).unwrap_or_default();
                if !current.trim().is_empty() {
                    continue;
                }
                let value = std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                std::fs::write(&own, value.trim())
                    .map_err(|e| LabError::io(format!("cannot initialise {}", own.display()), e))?;
            }
        }
    }
    Ok(())
}

/// PIDs in the subtree `dir` of one hierarchy.
fn pids_under(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir()),
            );
        }
    }
    out
}

/// Removes the subtree `/<root>` in every hierarchy: first SIGKILLs every process still in it
/// (containers and shims of the lab's kubelets: the cgroup is ours, so are they), then removes
/// the directories deepest first. Returns what was removed.
pub fn remove(root: &str) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let hs = hierarchies();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pids: Vec<u32> = hs.iter().flat_map(|h| pids_under(&h.join(root))).collect();
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(LabError::Timeout(format!(
                "processes {pids:?} still in cgroup /{root} 10 s after SIGKILL"
            )));
        }
        for pid in &pids {
            // SAFETY: kill(2); the PID was read from a cgroup only the lab creates.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            // Reap it if it is our child (ECHILD otherwise).
            let mut status = 0;
            // SAFETY: waitpid with WNOHANG only inspects the child table.
            unsafe { libc::waitpid(*pid as libc::pid_t, &mut status, libc::WNOHANG) };
        }
        done.push(format!(
            "killed {} process(es) left in cgroup /{root}",
            pids.len()
        ));
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut removed = 0;
    for h in &hs {
        let top = h.join(root);
        if !top.is_dir() {
            continue;
        }
        let mut dirs = Vec::new();
        let mut stack = vec![top.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                stack.extend(
                    rd.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.is_dir()),
                );
            }
            dirs.push(d);
        }
        // Deepest first: a cgroup directory can only be removed once it has no children.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(&d) {
                    Ok(()) => {
                        removed += 1;
                        break;
                    }
                    // A just-killed task may need a moment to leave the cgroup.
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 250 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => {
                        return Err(LabError::io(
                            format!("cannot remove cgroup {}", d.display()),
                            e,
                        ));
                    }
                }
            }
        }
    }
    if removed > 0 {
        done.push(format!("removed {removed} cgroup(s) under /{root}"));
    }
    Ok(done)
}

/// Names of the top-level cgroups (in any hierarchy) starting with `prefix`.
pub fn with_prefix(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = hierarchies()
        .iter()
        .filter_map(|h| std::fs::read_dir(h).ok())
        .flat_map(|rd| rd.filter_map(|e| e.ok()))
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroups_are_created_and_removed_with_their_processes() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skip: needs root to create cgroups");
            return;
        }
        let root = format!("tl-cgtest{}", crate::process::random_hex(3));
        create(&root, &["a", "b"]).unwrap();
        let h = hierarchies();
        assert!(!h.is_empty());
        assert!(h.iter().all(|h| h.join(&root).join("b").is_dir()));
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        for h in &h {
            std::fs::write(h.join(&root).join("a/cgroup.procs"), pid.to_string()).unwrap();
        }
        assert_eq!(with_prefix(&root), vec![root.clone()]);
        let done = remove(&root).unwrap();
        assert!(done.iter().any(|d| d.contains("killed 1")), "{done:?}");
        let _ = child.wait();
        assert!(h.iter().all(|h| !h.join(&root).exists()));
        assert!(with_prefix(&root).is_empty());
    }

    /// Removes the test's lab directories and registry, also when an assertion failed.
    struct Cleanup(Vec<PathBuf>);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }

    #[test]
    fn overlapping_labs_share_the_machines_values_and_the_last_restores() {
        // /run/tern-lab is root's; the lab itself needs root.
        tern_testkit::need_root();
        let tag = format!("{}-{}", std::process::id(), crate::process::random_hex(3));
        let (a, b) = (format!("sysreg-a-{tag}"), format!("sysreg-b-{tag}"));
        // A registry of the test's own: real labs (CI runs upstream's e2e on one meanwhile)
        // hold the machine's, and this test must neither see them nor write the kernel.
        let dir = std::env::temp_dir().join(format!("tern-sysreg-{tag}"));
        let _cleanup = Cleanup(vec![
            crate::state::lab_dir(&a),
            crate::state::lab_dir(&b),
            dir.clone(),
        ]);
        let registry = dir.join("kubelet-sysctls.json");
        for l in [&a, &b] {
            std::fs::create_dir_all(crate::state::lab_dir(l)).unwrap();
        }
        let machine = read_current().unwrap();
        let first = save_in(&registry, &a).unwrap();
        assert_eq!(first, machine, "the first lab records the kernel's values");
        let second = save_in(&registry, &b).unwrap();
        // The second lab gets what the first recorded, not what the kernel shows now.
        assert_eq!(first, second);
        let fake = vec![("vm.overcommit_memory".to_string(), "1".to_string())];
        assert_eq!(
            release_in(&registry, &fake, &b).unwrap(),
            None,
            "a lab leaving while another holds the values writes nothing"
        );
        // The last one out gets the machine's values to write back, not its own record.
        assert_eq!(release_in(&registry, &fake, &a).unwrap(), Some(first));
        assert!(!registry.exists(), "the last one out removes the registry");
        // With no registry, a lab falls back to what it recorded.
        assert_eq!(
            release_in(&registry, &fake, &a).unwrap(),
            Some(fake.clone())
        );
        // A holder whose lab directory is gone (crashed without `down`) stops holding.
        save_in(&registry, &a).unwrap();
        save_in(&registry, &b).unwrap();
        std::fs::remove_dir_all(crate::state::lab_dir(&b)).unwrap();
        assert!(release_in(&registry, &fake, &a).unwrap().is_some());
    }

    #[test]
    fn sysctls_are_read() {
        let saved = read_current().unwrap();
        assert_eq!(saved.len(), 3);
        // Restoring the current values changes nothing.
        assert!(write_values(&saved).unwrap().is_empty());
    }
}
