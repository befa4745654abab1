//! Isolation: the private network and mount namespace the harness runs in, the bench namespace set
//! up as a node, and the pods' network namespaces.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{BenchError, io_err, run};

/// The bench namespace's uplink address; from the benchmarking range 198.18.0.0/15.
pub const UPLINK_ADDR: &str = "198.18.0.1/30";
/// The default route's gateway, on the uplink's subnet.
pub const UPLINK_GATEWAY: &str = "198.18.0.2";
/// Name of the uplink veth (its peer is `UPLINK_IF` + "p").
pub const UPLINK_IF: &str = "tbench0";

pub(super) fn netns_inode(path: &str) -> Result<u64, BenchError> {
    Ok(std::fs::metadata(path)
        .map_err(io_err(format!("stat {path}")))?
        .ino())
}

/// Inode of the network namespace [`enter_private_namespaces`] left; 0 until it has run.
static HOST_NETNS: AtomicU64 = AtomicU64::new(0);

/// Moves the calling thread into a new network and mount namespace.
///
/// Call it first thing in `main` (before any thread exists) so every thread and process the
/// harness starts inherits the namespaces; tests call it on a dedicated thread. Mount propagation
/// is made private before anything is mounted so no mount leaks back to the machine, and `/sys`
/// is remounted so `/sys/class/net` describes the new namespace.
pub fn enter_private_namespaces() -> Result<(), BenchError> {
    let before = netns_inode("/proc/thread-self/ns/net")?;
    let sys_remount = tern_linux::netns::unshare_net_and_mounts().map_err(|e| BenchError::Io {
        context: "enter new network and mount namespaces (tern-bench must run as root)".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let after = netns_inode("/proc/thread-self/ns/net")?;
    HOST_NETNS.store(before, Ordering::SeqCst);
    if after == before {
        return Err(BenchError::NotIsolated(after));
    }
    if let Some(e) = sys_remount {
        // Not fatal: the plugins use netlink; only tools reading /sys would be misled.
        log::warn!("could not remount /sys in the bench namespace: {e}");
    }
    Ok(())
}

/// Fails unless [`enter_private_namespaces`] has run and the calling thread is in neither the
/// namespace it left nor (when readable: it is not in every sandbox) PID 1's.
pub fn ensure_isolated() -> Result<(), BenchError> {
    let ours = netns_inode("/proc/thread-self/ns/net")?;
    let left = HOST_NETNS.load(Ordering::SeqCst);
    let pid1 = netns_inode("/proc/1/ns/net").ok();
    if left == 0 || ours == left || pid1 == Some(ours) {
        return Err(BenchError::NotIsolated(ours));
    }
    Ok(())
}

/// Prepares the bench namespace as a node: `lo` up and a default route via a veth addressed from
/// 198.18.0.0/15 (the kernel has no dummy module). Refuses to run in PID 1's network namespace.
pub fn setup_bench_host() -> Result<(), BenchError> {
    ensure_isolated()?;
    let peer = format!("{UPLINK_IF}p");
    run("ip", &["link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "link", "add", UPLINK_IF, "type", "veth", "peer", "name", &peer,
        ],
    )?;
    run("ip", &["addr", "add", UPLINK_ADDR, "dev", UPLINK_IF])?;
    run("ip", &["link", "set", &peer, "up"])?;
    run("ip", &["link", "set", UPLINK_IF, "up"])?;
    run(
        "ip",
        &[
            "route",
            "add",
            "default",
            "via",
            UPLINK_GATEWAY,
            "dev",
            UPLINK_IF,
        ],
    )?;
    Ok(())
}

/// A pod's network namespace, bind-mounted on a file; unmounted and removed on drop.
#[derive(Debug)]
pub struct PodNetns {
    path: PathBuf,
}

impl PodNetns {
    /// Creates a new network namespace and pins it at `path` (a file that must not exist yet).
    pub fn create(path: &Path) -> Result<PodNetns, BenchError> {
        tern_linux::netns::pin_new_at(path).map_err(|e| BenchError::Io {
            context: format!("create pod network namespace {}", path.display()),
            source: match e {
                tern_linux::LinuxError::Io { source, .. } => source,
                e => std::io::Error::other(e.to_string()),
            },
        })?;
        Ok(PodNetns {
            path: path.to_owned(),
        })
    }

    /// The path given to plugins as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if let Err(e) = tern_linux::netns::unpin(&self.path) {
            log::warn!("could not remove pod network namespace: {e}");
        }
    }
}
