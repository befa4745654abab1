//! Waiting in tests: polling a condition until it holds or a timeout passes.

use std::time::{Duration, Instant};

/// Polls `cond` every 50 ms until it holds or `timeout` has passed (then once more); whether
/// it held.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    poll(timeout, Duration::from_millis(50), cond)
}

/// Polls `cond` every `every` until it holds or `timeout` has passed (then once more); whether
/// it held.
pub fn poll(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(every);
    }
    cond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_polled_until_it_holds_or_time_is_up() {
        let mut n = 0;
        assert!(wait_until(Duration::from_secs(5), || {
            n += 1;
            n == 3
        }));
        assert_eq!(n, 3);
        let t = Instant::now();
        let mut calls = 0;
        assert!(!poll(
            Duration::from_millis(120),
            Duration::from_millis(40),
            || {
                calls += 1;
                false
            }
        ));
        assert!(t.elapsed() >= Duration::from_millis(120));
        assert!((3..=5).contains(&calls), "{calls} calls");
    }
}
