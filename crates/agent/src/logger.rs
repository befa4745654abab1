//! A minimal `log` backend writing timestamped lines to stderr.

use log::{Level, LevelFilter, Metadata, Record};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }
    fn log(&self, record: &Record) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let lvl = match record.level() {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}.{:03} {lvl} {}",
            now.as_secs(),
            now.subsec_millis(),
            record.args()
        );
    }
    fn flush(&self) {}
}

/// Installs the logger; `level` is one of error, warn, info, debug, trace.
pub fn init(level: &str) {
    let filter = level.parse().unwrap_or(LevelFilter::Info);
    if log::set_boxed_logger(Box::new(StderrLogger)).is_ok() {
        log::set_max_level(filter);
    }
}
