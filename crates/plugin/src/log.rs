//! The plugins' log: appended to `log_file_path` when configured (Calico's key), else stderr
//! for warnings only. Stdout belongs to the CNI result.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    /// Calico spells levels "Info", "debug", "WARNING"...
    pub fn parse(s: &str) -> Level {
        match s.to_ascii_lowercase().as_str() {
            "error" | "fatal" | "panic" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "debug" | "trace" => Level::Debug,
            _ => Level::Info,
        }
    }
}

/// Opens the log for appending without following a symlink in its last component (the
/// plugin runs as root: a link planted there would make it append to any file), and only a
/// regular file (O_NONBLOCK so a FIFO there cannot hang the plugin). New files are 0600.
fn open_log(p: &Path) -> Option<std::fs::File> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(p)
        .ok()?;
    f.metadata().ok()?.is_file().then_some(f)
}

pub struct Logger {
    level: Level,
    file: Option<Mutex<std::fs::File>>,
    prefix: String,
}

impl Logger {
    /// A logger for one invocation; a log file that cannot be opened falls back to stderr.
    pub fn new(
        level: Option<&str>,
        path: Option<&Path>,
        max_size_mb: Option<u64>,
        prefix: String,
    ) -> Logger {
        let level = level.map(Level::parse).unwrap_or(Level::Info);
        let file = path.and_then(|p| {
            if let Some(dir) = p.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            // Simple rotation: one previous file, as a bound on disk use. symlink_metadata:
            // a link is never ours to measure (and rename moves the link, not its target).
            if let (Some(max), Ok(meta)) = (max_size_mb, std::fs::symlink_metadata(p))
                && max > 0
                && meta.len() > max * 1024 * 1024
            {
                let _ = std::fs::rename(p, p.with_extension("log.1"));
            }
            open_log(p).map(Mutex::new)
        });
        Logger {
            level,
            file,
            prefix,
        }
    }

    pub fn enabled(&self, level: Level) -> bool {
        level <= self.level
    }

    pub fn log(&self, level: Level, msg: &str) {
        if !self.enabled(level) {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let line = format!(
            "{}.{:03} {:?} {} {msg}\n",
            now.as_secs(),
            now.subsec_millis(),
            level,
            self.prefix
        );
        match &self.file {
            Some(f) => {
                if let Ok(mut f) = f.lock() {
                    let _ = f.write_all(line.as_bytes());
                }
            }
            None if level <= Level::Warn => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tern-log-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_symlink_at_the_log_path_is_not_followed() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"root-owned\n").unwrap();
        let log = d.join("tern.log");
        std::os::unix::fs::symlink(&victim, &log).unwrap();
        let l = Logger::new(Some("debug"), Some(&log), Some(1), "test".into());
        l.log(Level::Error, "must not reach the victim");
        assert_eq!(std::fs::read(&victim).unwrap(), b"root-owned\n");
        assert!(l.file.is_none(), "falls back to stderr");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fifo_at_the_log_path_does_not_hang() {
        let d = scratch("fifo");
        let log = d.join("tern.log");
        let c = std::ffi::CString::new(log.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let l = Logger::new(None, Some(&log), None, "test".into());
        assert!(l.file.is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_regular_log_is_appended_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("plain");
        let log = d.join("sub/tern.log");
        let l = Logger::new(None, Some(&log), None, "test".into());
        l.log(Level::Info, "one");
        drop(l);
        let l = Logger::new(None, Some(&log), None, "test".into());
        l.log(Level::Info, "two");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("one") && text.contains("two"), "{text}");
        let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
