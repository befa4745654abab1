//! Isolation: the private network and mount namespace the harness runs in, the bench namespace set
//! up as a node, and the pods' network namespaces.

use std::ffi::CString;
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

fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> Result<(), BenchError> {
    let cstr = |s: &str| CString::new(s).expect("mount arguments contain no NUL");
    let source = source.map(cstr);
    let fstype = fstype.map(cstr);
    let target_c = cstr(&target.to_string_lossy());
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(BenchError::Io {
            context: format!("mount {:?} on {}", source, target.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
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
    // SAFETY: unshare has no memory-safety preconditions; it only changes this thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) } != 0 {
        return Err(BenchError::Io {
            context: "unshare(CLONE_NEWNET | CLONE_NEWNS) (tern-bench must run as root)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)?;
    let after = netns_inode("/proc/thread-self/ns/net")?;
    HOST_NETNS.store(before, Ordering::SeqCst);
    if after == before {
        return Err(BenchError::NotIsolated(after));
    }
    if let Err(e) = mount(Some("sysfs"), Path::new("/sys"), Some("sysfs"), 0) {
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
        std::fs::File::create_new(path).map_err(io_err(format!("create {}", path.display())))?;
        // From here on, drop cleans up whatever exists.
        let netns = PodNetns {
            path: path.to_owned(),
        };
        let target = netns.path.clone();
        // A dedicated thread enters the new namespace so no other thread's namespace changes; the
        // bind mount keeps the namespace alive after the thread exits.
        let (_ns, mounted) = tern_linux::netns::run_in_new(|| {
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None,
                libc::MS_BIND,
            )
        })
        .map_err(|e| BenchError::Io {
            context: format!("unshare(CLONE_NEWNET) for pod {}", target.display()),
            source: match e {
                tern_linux::LinuxError::Io { source, .. } => source,
                e => std::io::Error::other(e.to_string()),
            },
        })?;
        mounted?;
        Ok(netns)
    }

    /// The path given to plugins as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if let Ok(target) = CString::new(self.path.to_string_lossy().as_bytes()) {
            // SAFETY: target is a valid NUL-terminated path. EINVAL (not mounted) is fine here.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
