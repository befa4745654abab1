//! The SQLite store and its WAL/SHM hold secrets (BGP MD5 passwords): they are 0600 whatever
//! the umask, and an existing world-readable store is tightened on open. One test in this
//! binary, so changing the process-wide umask races with nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tern_store::Store;
use tern_store::sqlite::SqliteStore;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn side(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn set_umask(m: u32) -> u32 {
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(m as libc::mode_t) as u32 }
}

#[test]
fn store_files_are_private_under_any_umask() {
    let saved = set_umask(0o022);
    let result = std::panic::catch_unwind(|| {
        for umask in [0o022, 0o000, 0o002] {
            set_umask(umask);
            let dir = tempfile::tempdir().unwrap();
            // A parent the store creates is 0700.
            let path = dir.path().join("state/store.db");
            let s = SqliteStore::open(&path).unwrap();
            s.put("/tern/v1/bgp/secret", b"md5-password").unwrap();
            for p in [path.clone(), side(&path, "-wal"), side(&path, "-shm")] {
                assert!(p.exists(), "{} missing", p.display());
                assert_eq!(mode(&p), 0o600, "{} under umask {umask:03o}", p.display());
            }
            assert_eq!(mode(&dir.path().join("state")), 0o700, "umask {umask:03o}");
            drop(s);
            // An existing store made world-readable (by an older tern) is tightened.
            for p in [path.clone(), side(&path, "-wal"), side(&path, "-shm")] {
                if p.exists() {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
                }
            }
            let s = SqliteStore::open(&path).unwrap();
            assert_eq!(
                s.get("/tern/v1/bgp/secret").unwrap().unwrap().value,
                b"md5-password"
            );
            for p in [path.clone(), side(&path, "-wal"), side(&path, "-shm")] {
                if p.exists() {
                    assert_eq!(mode(&p), 0o600, "{} re-opened", p.display());
                }
            }
            // An existing parent directory is not ours to change.
            let shared = dir.path().join("shared");
            std::fs::create_dir(&shared).unwrap();
            std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
            let p2 = shared.join("s.db");
            drop(SqliteStore::open(&p2).unwrap());
            assert_eq!(mode(&shared), 0o755);
            assert_eq!(mode(&p2), 0o600);
        }
    });
    set_umask(saved);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
