//! The plugins' log: appended to `log_file_path` when configured (Calico's key), else stderr
//! for warnings only. Stdout belongs to the CNI result.

use std::fs::OpenOptions;
use std::io::Write;
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
            // Simple rotation: one previous file, as a bound on disk use.
            if let (Some(max), Ok(meta)) = (max_size_mb, std::fs::metadata(p))
                && max > 0
                && meta.len() > max * 1024 * 1024
            {
                let _ = std::fs::rename(p, p.with_extension("log.1"));
            }
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
                .map(Mutex::new)
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
