//! Running code inside a lab namespace from this process: on a dedicated thread that enters the
//! namespace and then exits, so no other thread (and never the process's root-namespace
//! threads) changes namespace. Sockets keep the namespace they were created in.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::path::Path;

use tern_linux::LinuxError;
use tern_linux::netns::NetNs;

use crate::{LabError, Result};

/// Runs `f` on a fresh thread inside the named namespace `ns` and returns its result. Threads
/// that `f` spawns inherit the namespace.
pub fn in_netns<T, F>(ns: &str, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let path = Path::new("/run/netns").join(ns);
    let file = File::open(&path)
        .map_err(|e| LabError::io(format!("cannot open {}", path.display()), e))?;
    in_netns_file(&file, ns, f)
}

/// [`in_netns`] for a namespace given as an open file (`/proc/PID/ns/net`, a pod's), named
/// `what` in errors.
pub fn in_netns_file<T, F>(file: &File, what: &str, f: F) -> Result<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let fd = file
        .try_clone()
        .map_err(|e| LabError::io(format!("cannot use network namespace {what}"), e))?;
    let ns = NetNs::from_fd(OwnedFd::from(fd));
    // `NetNs::run` enters on a thread of its own and passes a panic of `f` on: a lab error here.
    std::panic::catch_unwind(AssertUnwindSafe(|| ns.run(f)))
        .map_err(|_| LabError::Invalid(format!("thread in namespace {what} panicked")))?
        .map_err(|e| match e {
            LinuxError::Io { source, .. } => {
                LabError::io(format!("cannot enter network namespace {what}"), source)
            }
            e => LabError::Invalid(format!("cannot enter network namespace {what}: {e}")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_is_named() {
        let e = in_netns("tl-nonexistent-ns", || ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tl-nonexistent-ns"), "{e}");
    }
}
