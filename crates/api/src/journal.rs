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
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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
    crate::ident::journal_file_name(&a.network, &a.container_id, &a.ifname)
}

/// Mode of the journal directory: entries name pods and interfaces, only root reads them.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every journal entry.
pub const FILE_MODE: u32 = 0o600;
/// Largest journal entry read back (an entry tern writes is well under 4 KiB); a bigger file
/// is reported as unreadable, never loaded whole.
pub const MAX_ENTRY_BYTES: usize = 1 << 20;

/// Opens (creating it 0700 when missing) the journal directory without following a symlink
/// in its last component, and refuses one owned by another user: entries are created
/// relative to this descriptor, so nothing can redirect them elsewhere.
fn open_dir(state_dir: &Path) -> io::Result<OwnedFd> {
    // A state directory made here is private too (an existing one is left as it is).
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(state_dir)?;
    let d = dir(state_dir);
    match fs::DirBuilder::new().mode(DIR_MODE).create(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let c = cstr(d.as_os_str().as_bytes())?;
    // SAFETY: open with a valid C string; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "opening journal directory {} (symlinks refused): {e}",
                d.display()
            ),
        ));
    }
    // SAFETY: fd was just returned by open and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat into a zeroed stat on an open descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the call and st is ours to write.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "journal directory {} is owned by uid {}, not {me}: refusing to write there",
                d.display(),
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o7777 != DIR_MODE {
        // SAFETY: fchmod on our own directory descriptor.
        if unsafe { libc::fchmod(fd.as_raw_fd(), DIR_MODE as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Creates `name` in `dir` exclusively (never through an existing file or symlink), 0600.
fn create_excl(dir: &OwnedFd, name: &str) -> io::Result<fs::File> {
    let c = cstr(name.as_bytes())?;
    // SAFETY: openat relative to an open directory with a valid C string; checked.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            FILE_MODE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat and is owned by nobody else.
    let f = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // The umask may have narrowed the mode further, never widened it; make it exact.
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    Ok(f)
}

/// Records a pending release; overwrites an entry for the same attachment. The entry is
/// written to a fresh temporary file (O_EXCL|O_NOFOLLOW, relative to the opened journal
/// directory, so a planted symlink is never written through) and renamed into place.
pub fn record(state_dir: &Path, entry: &JournalEntry) -> io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dfd = open_dir(state_dir)?;
    let name = file_name(&entry.attachment);
    let body = serde_json::to_vec(entry).map_err(io::Error::other)?;
    let mut attempt = 0;
    let (tmp, mut f) = loop {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let tmp = format!(
            ".{name}.tmp{}.{nanos}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        match create_excl(&dfd, &tmp) {
            Ok(f) => break (tmp, f),
            // Something already sits at that name (a crash leftover or a planted link): pick
            // another name, never open it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
            Err(e) => return Err(e),
        }
    };
    let written = f.write_all(&body).and_then(|()| f.sync_all());
    drop(f);
    let renamed = written.and_then(|()| {
        let (from, to) = (cstr(tmp.as_bytes())?, cstr(name.as_bytes())?);
        // SAFETY: renameat within the one directory descriptor, valid C strings; checked.
        let rc =
            unsafe { libc::renameat(dfd.as_raw_fd(), from.as_ptr(), dfd.as_raw_fd(), to.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fsync of the directory descriptor makes the rename durable.
        unsafe { libc::fsync(dfd.as_raw_fd()) };
        Ok(())
    });
    if let Err(e) = renamed {
        if let Ok(c) = cstr(tmp.as_bytes()) {
            // SAFETY: unlinkat of our own temporary name in our directory.
            unsafe { libc::unlinkat(dfd.as_raw_fd(), c.as_ptr(), 0) };
        }
        return Err(e);
    }
    Ok(dir(state_dir).join(name))
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
        let parsed = read_nofollow(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
        out.push((path, parsed));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Reads an entry without following a symlink (a link in the journal is never ours).
fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut b = Vec::new();
    f.take(MAX_ENTRY_BYTES as u64 + 1).read_to_end(&mut b)?;
    if b.len() > MAX_ENTRY_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("journal entry is over {MAX_ENTRY_BYTES} bytes, the limit"),
        ));
    }
    Ok(b)
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
                .starts_with("net:eth0.c%2F1")
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

    fn scratch(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "tern-journal-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn entry(cid: &str) -> JournalEntry {
        JournalEntry {
            attachment: Attachment {
                network: "net".into(),
                container_id: cid.into(),
                ifname: "eth0".into(),
                ..Default::default()
            },
            host_ifname: "ternabc".into(),
            delegated_ipam: false,
            source: "plugin".into(),
        }
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn symlinks_at_temp_and_entry_paths_are_not_written_through() {
        let root = scratch("links");
        let victim = root.join("victim");
        fs::write(&victim, b"root-owned content").unwrap();
        let state = root.join("state");
        let jdir = dir(&state);
        fs::create_dir_all(&jdir).unwrap();
        let e = entry("c1");
        let name = file_name(&e.attachment);
        // The temporary name the old code used (predictable: name + pid), and the entry itself.
        std::os::unix::fs::symlink(
            &victim,
            jdir.join(format!(".{name}.tmp{}", std::process::id())),
        )
        .unwrap();
        std::os::unix::fs::symlink(&victim, jdir.join(&name)).unwrap();
        let p = record(&state, &e).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"root-owned content");
        let meta = fs::symlink_metadata(&p).unwrap();
        assert!(meta.file_type().is_file(), "the entry replaced the link");
        assert_eq!(mode(&p), FILE_MODE);
        assert_eq!(mode(&jdir), DIR_MODE);
        // A symlink planted as an entry is not followed when the journal is read.
        std::os::unix::fs::symlink(&victim, jdir.join("net:eth0.planted.json")).unwrap();
        let all = pending(&state).unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.iter().any(|(_, r)| r.as_ref() == Ok(&e)));
        assert!(all.iter().any(|(_, r)| r.is_err()));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn oversized_and_special_entries_are_reported_not_loaded() {
        let root = scratch("big");
        let jdir = dir(&root);
        record(&root, &entry("c1")).unwrap();
        fs::write(
            jdir.join("net:eth0.big.json"),
            vec![b' '; MAX_ENTRY_BYTES + 1],
        )
        .unwrap();
        let c = CString::new(jdir.join("net:eth0.fifo.json").as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let all = pending(&root).unwrap();
        assert_eq!(all.len(), 3);
        let errs: Vec<&String> = all.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("the limit")), "{errs:?}");
        assert!(
            errs.iter().any(|e| e.contains("not a regular file")),
            "{errs:?}"
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn journal_directory_symlink_is_refused() {
        let root = scratch("dirlink");
        let elsewhere = root.join("elsewhere");
        fs::create_dir_all(&elsewhere).unwrap();
        let state = root.join("state");
        fs::create_dir_all(&state).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir(&state)).unwrap();
        let err = record(&state, &entry("c1")).unwrap_err();
        assert!(err.to_string().contains("symlinks refused"), "{err}");
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn colliding_attachments_get_separate_entries() {
        let root = scratch("collide");
        let mut a = entry("x.net1");
        a.attachment.ifname = "eth0".into();
        let mut b = entry("x");
        b.attachment.ifname = "net1".into();
        record(&root, &a).unwrap();
        record(&root, &b).unwrap();
        assert_eq!(pending(&root).unwrap().len(), 2);
        fs::remove_dir_all(&root).unwrap();
    }

    /// Runs the named test of this binary in a child process under `umask`, so changing the
    /// process-wide umask never races with other tests.
    fn in_child_with_umask(test: &str, umask: u32) -> bool {
        if let Ok(m) = std::env::var("TERN_JOURNAL_UMASK") {
            // SAFETY: umask has no preconditions; this child runs one test only.
            unsafe { libc::umask(u32::from_str_radix(&m, 8).unwrap() as libc::mode_t) };
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("TERN_JOURNAL_UMASK", format!("{umask:o}"))
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child under umask {umask:o}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    fn modes_whatever_the_umask(test: &str, umask: u32) {
        if !in_child_with_umask(test, umask) {
            return;
        }
        let root = scratch("umask");
        let p = record(&root, &entry("c1")).unwrap();
        assert_eq!(mode(&p), FILE_MODE);
        assert_eq!(mode(&dir(&root)), DIR_MODE);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn modes_under_umask_000() {
        modes_whatever_the_umask("journal::tests::modes_under_umask_000", 0o000);
    }

    #[test]
    fn modes_under_umask_022() {
        modes_whatever_the_umask("journal::tests::modes_under_umask_022", 0o022);
    }
}
