//! The socket server's admission state: how many connections are being served (the
//! `--max-connections` bound) and a rate-limited log of refusals, so a flood of hostile
//! requests can neither exhaust the agent nor flood its log.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Connections being served and the log of refusals.
#[derive(Debug, Default)]
pub struct Gate {
    /// Connections being served now.
    pub connections: AtomicUsize,
    /// Refusals, logged at most once a second.
    pub refusals: RateLimitedLog,
}

/// A warning logged at most once a second; the ones in between are counted and reported with
/// the next, so a flood of hostile requests cannot flood the log.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl RateLimitedLog {
    /// Logs `msg` unless another was logged less than a second ago.
    pub fn warn(&self, msg: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        let n = self.suppressed.swap(0, Ordering::Relaxed);
        if n > 0 {
            log::warn!("{msg} ({n} similar refusals not logged)");
        } else {
            log::warn!("{msg}");
        }
    }
}
