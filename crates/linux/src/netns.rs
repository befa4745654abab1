//! Network namespaces: open by path or fd, run code inside one, and persistent named namespaces
//! compatible with `ip netns` (bind mounts under `/run/netns`).

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{LinuxError, Result};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// `NS_GET_NSTYPE` ioctl: `_IO(0xb7, 0x3)`.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// `statfs.f_type` of nsfs, the filesystem of namespace files.
pub const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Why a file is not a usable network namespace ([`open_nonblocking`], [`check_net_namespace`]).
#[derive(Debug)]
pub enum NsFileError {
    /// The path cannot be opened.
    Open(io::Error),
    /// `fstatfs` failed on the descriptor.
    Inspect(io::Error),
    /// The file is not on nsfs (filesystem type given): a FIFO, a device, a regular file, ...
    NotNsfs(i64),
    /// A namespace of another type (`NS_GET_NSTYPE` result given).
    NotNet(i32),
}

impl fmt::Display for NsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NsFileError::Open(e) => write!(f, "cannot open the network namespace: {e}"),
            NsFileError::Inspect(e) => write!(f, "cannot inspect the namespace file: {e}"),
            NsFileError::NotNsfs(t) => {
                write!(f, "not a namespace file (filesystem type {t:#x})")
            }
            NsFileError::NotNet(k) => {
                write!(f, "a namespace but not a network namespace (type {k:#x})")
            }
        }
    }
}

impl std::error::Error for NsFileError {}

/// Checks that `fd` is a network namespace file: nsfs, and `NS_GET_NSTYPE` says CLONE_NEWNET.
/// Shared by every path that takes a namespace from outside (the plugin's CNI_NETNS, ternd's
/// socket, ternd's repair of a stored netns path).
pub fn check_net_namespace(fd: BorrowedFd<'_>) -> std::result::Result<(), NsFileError> {
    // SAFETY: fstatfs writes into the zeroed struct we own.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the call and sfs is ours to write.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(NsFileError::Inspect(io::Error::last_os_error()));
    }
    if sfs.f_type as i64 != NSFS_MAGIC {
        return Err(NsFileError::NotNsfs(sfs.f_type as i64));
    }
    // SAFETY: ioctl without argument on a valid nsfs fd.
    let kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind != libc::CLONE_NEWNET {
        return Err(NsFileError::NotNet(kind));
    }
    Ok(())
}

/// Opens a namespace path that comes from outside (CNI_NETNS, a stored endpoint) without ever
/// blocking (`O_NONBLOCK`: a FIFO would otherwise wait for a writer forever; `O_NOCTTY`), and
/// checks it with [`check_net_namespace`].
pub fn open_nonblocking(path: &Path) -> std::result::Result<OwnedFd, NsFileError> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        NsFileError::Open(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path contains a NUL byte",
        ))
    })?;
    // SAFETY: c is a valid NUL-terminated path.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY,
        )
    };
    if raw < 0 {
        return Err(NsFileError::Open(io::Error::last_os_error()));
    }
    // SAFETY: raw is a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    check_net_namespace(fd.as_fd())?;
    Ok(fd)
}

/// An open network namespace (owned fd). The namespace stays alive while this is open.
pub struct NetNs {
    fd: OwnedFd,
    path: Option<PathBuf>,
}

impl fmt::Debug for NetNs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetNs({self})")
    }
}

impl fmt::Display for NetNs {
    /// The path it was opened from, or `fd N`: used in error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}", p.display()),
            None => write!(f, "fd {}", self.fd.as_raw_fd()),
        }
    }
}

fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        LinuxError::InvalidArgument(format!("path {} contains a NUL byte", path.display()))
    })
}

impl NetNs {
    /// Opens the namespace file at `path` (`/proc/<pid>/ns/net`, `/run/netns/<name>`, ...).
    /// A missing path is [`LinuxError::NetnsNotFound`]; a file that is not a network namespace
    /// is an error naming the path.
    pub fn open(path: &Path) -> Result<NetNs> {
        let c = cstring(path)?;
        // SAFETY: c is a valid NUL-terminated path.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if raw < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOENT) {
                return Err(LinuxError::NetnsNotFound {
                    path: path.to_path_buf(),
                });
            }
            return Err(LinuxError::io(
                format!("open network namespace {}", path.display()),
                err,
            ));
        }
        // SAFETY: raw is a fresh fd owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ioctl on a valid fd with no argument.
        let kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
        if kind != libc::CLONE_NEWNET {
            return Err(LinuxError::InvalidArgument(format!(
                "{} is not a network namespace",
                path.display()
            )));
        }
        Ok(NetNs {
            fd,
            path: Some(path.to_path_buf()),
        })
    }

    /// Wraps an fd already known to refer to a network namespace (e.g. received over SCM_RIGHTS).
    pub fn from_fd(fd: OwnedFd) -> NetNs {
        NetNs { fd, path: None }
    }

    /// The calling thread's network namespace.
    pub fn current() -> Result<NetNs> {
        let mut ns = NetNs::open(Path::new("/proc/thread-self/ns/net"))?;
        // The path is relative to whichever thread reads it, so it must not be remembered.
        ns.path = None;
        Ok(ns)
    }

    /// The namespace's fd.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The path it was opened from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Duplicates the handle (a new fd to the same namespace).
    pub fn try_clone(&self) -> Result<NetNs> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| LinuxError::io(format!("duplicate fd of network namespace {self}"), e))?;
        Ok(NetNs {
            fd,
            path: self.path.clone(),
        })
    }

    /// Runs `f` on a dedicated new thread that has entered this namespace, and joins it.
    /// The caller's thread never changes namespace. A panic in `f` is propagated.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let fd = self.fd.as_raw_fd();
        std::thread::scope(|s| {
            let h = s.spawn(move || -> Result<T> {
                // SAFETY: fd stays open for the scope (borrowed from self).
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                    return Err(LinuxError::last_os(format!(
                        "enter network namespace {self}"
                    )));
                }
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Opens descriptors inside this namespace from the CALLING thread: the thread enters the
    /// namespace, runs `open`, and is back in its own namespace before this returns (also when
    /// `open` panics). What `open` creates stays bound to this namespace after the thread has
    /// left: a netlink socket talks to this namespace's kernel tables, a `/proc/sys/net` file
    /// is this namespace's setting. `open` must do nothing else (no work that depends on the
    /// thread's namespace beyond creating descriptors).
    ///
    /// Why not [`NetNs::run`]: that costs a thread spawn and two wake-ups per visit (tens of
    /// µs on an idle machine, milliseconds on a loaded one, the largest item of a pod ADD's
    /// namespace visit), while two `setns` calls cost ~3 µs.
    ///
    /// If the thread cannot return to its own namespace (`setns` failing on a descriptor of
    /// the namespace it came from: only memory exhaustion), the process aborts: a thread left
    /// in a pod's namespace would do the node's later work in the wrong place.
    pub fn open_inside<T>(&self, open: impl FnOnce() -> T) -> Result<T> {
        struct Back(OwnedFd);
        impl Drop for Back {
            fn drop(&mut self) {
                // SAFETY: self.0 is an open namespace descriptor.
                if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let e = io::Error::last_os_error();
                    eprintln!(
                        "fatal: cannot return a thread to its network namespace ({e}); aborting"
                    );
                    std::process::abort();
                }
            }
        }
        let own = NetNs::current()?;
        // SAFETY: self.fd is an open network namespace descriptor (checked at construction
        // for `open`, the caller's contract for `from_fd`).
        if unsafe { libc::setns(self.fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(LinuxError::last_os(format!(
                "enter network namespace {self}"
            )));
        }
        let back = Back(own.fd);
        let out = open();
        drop(back);
        Ok(out)
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Runs `f` on a new thread inside a brand-new, anonymous network namespace and returns its
/// result along with a handle that keeps the namespace alive.
pub fn run_in_new<T: Send>(f: impl FnOnce() -> T + Send) -> Result<(NetNs, T)> {
    std::thread::scope(|s| {
        let h = s.spawn(move || -> Result<(NetNs, T)> {
            unshare_net()?;
            let ns = NetNs::current()?;
            Ok((ns, f()))
        });
        match h.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Creates a new anonymous network namespace and returns a handle keeping it alive.
pub fn new_anonymous() -> Result<NetNs> {
    run_in_new(|| ()).map(|(ns, ())| ns)
}

/// Moves the CALLING THREAD into a new network namespace (`unshare(CLONE_NEWNET)`). Only for
/// threads created for that purpose (tests, examples, [`run_in_new`]).
pub fn unshare_net() -> Result<()> {
    // SAFETY: unshare affects only the calling thread's network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(LinuxError::last_os("unshare network namespace"));
    }
    Ok(())
}

/// Moves the CALLING THREAD into a new network namespace and a new mount namespace whose
/// mounts are all private (nothing mounted afterwards propagates back to the machine), then
/// remounts `/sys` so `/sys/class/net` describes the new network namespace (a failed remount is
/// returned as `Ok(Some(error))`: the caller decides whether tools reading `/sys` matter).
/// For a process that isolates itself first thing in `main` (tern-bench), before any thread
/// exists, so every thread and child inherits both namespaces.
pub fn unshare_net_and_mounts() -> Result<Option<io::Error>> {
    // SAFETY: unshare affects only the calling thread's network and mount namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) } != 0 {
        return Err(LinuxError::last_os(
            "unshare network and mount namespaces (needs root)",
        ));
    }
    let empty = c"none".to_owned();
    let root = c"/".to_owned();
    mount(&empty, &root, libc::MS_REC | libc::MS_PRIVATE).map_err(|source| LinuxError::Io {
        context: "make / a private mount".into(),
        source,
    })?;
    let sysfs = c"sysfs";
    Ok(mount_fs(sysfs, c"/sys", sysfs, 0).err())
}

fn named_path(name: &str) -> Result<PathBuf> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.contains('\0') {
        return Err(LinuxError::InvalidArgument(format!(
            "network namespace name {name:?} must be a plain file name"
        )));
    }
    Ok(Path::new(NETNS_RUN_DIR).join(name))
}

/// Serialises the one-time "make /run/netns a shared mount" step within this process.
static RUN_DIR_SETUP: Mutex<bool> = Mutex::new(false);

fn mount(src: &CString, target: &CString, flags: libc::c_ulong) -> io::Result<()> {
    mount_fs(src, target, c"none", flags)
}

/// `mount(2)` of `src` on `target` with file system type `fstype` and no data.
fn mount_fs(src: &CStr, target: &CStr, fstype: &CStr, flags: libc::c_ulong) -> io::Result<()> {
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Like `ip netns`: /run/netns is made a shared mount point so namespace bind mounts propagate
/// to mount namespaces created later (agents and runtimes see the same names).
fn prepare_run_dir() -> Result<()> {
    let mut done = RUN_DIR_SETUP.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return Ok(());
    }
    std::fs::create_dir_all(NETNS_RUN_DIR)
        .map_err(|e| LinuxError::io(format!("create {NETNS_RUN_DIR}"), e))?;
    let dir = cstring(Path::new(NETNS_RUN_DIR))?;
    let empty = c"".to_owned();
    match mount(&empty, &dir, libc::MS_SHARED | libc::MS_REC) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            // Not a mount point yet: bind it onto itself, then share it.
            mount(&dir, &dir, libc::MS_BIND | libc::MS_REC)
                .map_err(|e| LinuxError::io(format!("bind mount {NETNS_RUN_DIR}"), e))?;
            mount(&empty, &dir, libc::MS_SHARED | libc::MS_REC)
                .map_err(|e| LinuxError::io(format!("make {NETNS_RUN_DIR} shared"), e))?;
        }
        Err(e) => return Err(LinuxError::io(format!("make {NETNS_RUN_DIR} shared"), e)),
    }
    *done = true;
    Ok(())
}

/// Creates a persistent named namespace like `ip netns add NAME` (a bind mount of a new
/// namespace on `/run/netns/NAME`). Fails with `AlreadyExists` if the name is taken.
pub fn add_named(name: &str) -> Result<PathBuf> {
    let path = named_path(name)?;
    prepare_run_dir()?;
    pin_new_at(&path)?;
    Ok(path)
}

/// Creates a new network namespace and pins it with a bind mount on `path`, a file that must
/// not exist yet (`AlreadyExists` otherwise). The namespace lives until [`unpin`]. The caller
/// chooses the directory; [`add_named`] uses `/run/netns`.
pub fn pin_new_at(path: &Path) -> Result<()> {
    let c = cstring(path)?;
    // SAFETY: valid path; O_EXCL makes the name ours or fails.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o444,
        )
    };
    if raw < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EEXIST) {
            return Err(LinuxError::AlreadyExists {
                what: format!("network namespace {}", path.display()),
            });
        }
        return Err(LinuxError::io(format!("create {}", path.display()), err));
    }
    // SAFETY: raw is a valid fd we own; closing it at once, only the file is needed.
    drop(unsafe { OwnedFd::from_raw_fd(raw) });
    let bound = std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            unshare_net()?;
            let src = c"/proc/thread-self/ns/net".to_owned();
            mount(&src, &c, libc::MS_BIND).map_err(|e| {
                LinuxError::io(
                    format!("bind mount network namespace on {}", path.display()),
                    e,
                )
            })
        })
        .join()
        .unwrap_or_else(|_| {
            Err(LinuxError::InvalidArgument(
                "namespace creation thread panicked".into(),
            ))
        })
    });
    if let Err(e) = bound {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Removes a named namespace (unmount + unlink); Ok if absent. The namespace itself lives on
/// while something still holds it open.
pub fn delete_named(name: &str) -> Result<()> {
    unpin(&named_path(name)?)
}

/// Removes a namespace pinned at `path` (unmount + unlink); Ok if absent. The namespace itself
/// lives on while something still holds it open.
pub fn unpin(path: &Path) -> Result<()> {
    let c = cstring(path)?;
    // SAFETY: valid path. MNT_DETACH so a busy namespace file does not block the delete.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        let err = io::Error::last_os_error();
        // EINVAL: not mounted (half-created); ENOENT: already gone. Both still need the unlink.
        if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
            return Err(LinuxError::io(
                format!("unmount network namespace {}", path.display()),
                err,
            ));
        }
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LinuxError::io(format!("remove {}", path.display()), e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Handle;
    use crate::sysctl;
    use std::os::unix::fs::MetadataExt;

    fn own_ns_inode() -> u64 {
        std::fs::metadata("/proc/thread-self/ns/net")
            .expect("own netns")
            .ino()
    }

    #[test]
    fn open_inside_binds_descriptors_to_the_namespace_and_returns_the_thread() {
        tern_testkit::need_root();
        let pod = new_anonymous().expect("new namespace");
        let pod_ino = pod.run(own_ns_inode).unwrap();
        let home = own_ns_inode();
        assert_ne!(pod_ino, home);
        let key = "net/ipv4/conf/lo/forwarding";
        let home_value = sysctl::get(key).unwrap();

        let (h, fwd) = pod
            .open_inside(|| {
                assert_eq!(own_ns_inode(), pod_ino, "open runs inside the namespace");
                (Handle::new(), sysctl::open_if_present(key))
            })
            .unwrap();
        assert_eq!(own_ns_inode(), home, "the thread is back in its namespace");
        let mut h = h.expect("netlink socket in the namespace");
        let fwd = fwd.unwrap().expect("lo's forwarding sysctl exists");

        // Used from here, both act on the pod's namespace.
        h.set_link_up(1).unwrap();
        fwd.set(if home_value == "1" { "0" } else { "1" }).unwrap();
        let (lo_up, pod_value) = pod
            .run(|| {
                let lo = Handle::new().unwrap().link_by_index(1).unwrap().unwrap();
                (lo.up, sysctl::get(key).unwrap())
            })
            .unwrap();
        assert!(lo_up, "lo was brought up in the pod's namespace");
        assert_ne!(pod_value, home_value);
        assert_eq!(sysctl::get(key).unwrap(), home_value, "home untouched");

        // A panic inside still returns the thread.
        let r = std::panic::catch_unwind(|| pod.open_inside(|| panic!("boom")));
        assert!(r.is_err());
        assert_eq!(own_ns_inode(), home);
    }
}
