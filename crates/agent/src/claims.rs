//! Per-interface claims: an ADD, a DEL and the reconciler never work on the same host interface
//! at the same time. ADD and DEL wait for a claim; the reconciler skips what is claimed.

use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The set of claimed interface names.
#[derive(Default)]
pub struct Claims {
    set: Mutex<HashSet<String>>,
    cv: Condvar,
}

/// A held claim, released on drop.
pub struct Claim<'a> {
    claims: &'a Claims,
    name: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.claims.set.lock().unwrap().remove(&self.name);
        self.claims.cv.notify_all();
    }
}

impl Claims {
    /// Claims `name`, waiting up to `timeout` for another holder; `None` on timeout.
    pub fn claim(&self, name: &str, timeout: Duration) -> Option<Claim<'_>> {
        let deadline = Instant::now() + timeout;
        let mut set = self.set.lock().unwrap();
        while set.contains(name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            set = self.cv.wait_timeout(set, left).unwrap().0;
        }
        set.insert(name.to_string());
        Some(Claim {
            claims: self,
            name: name.to_string(),
        })
    }

    /// Claims `name` only if nobody holds it.
    pub fn try_claim(&self, name: &str) -> Option<Claim<'_>> {
        self.set
            .lock()
            .unwrap()
            .insert(name.to_string())
            .then(|| Claim {
                claims: self,
                name: name.to_string(),
            })
    }

    /// True while `name` is claimed.
    pub fn contains(&self, name: &str) -> bool {
        self.set.lock().unwrap().contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn claims_exclude_and_release() {
        let c = Claims::default();
        let a = c.try_claim("x").unwrap();
        assert!(c.try_claim("x").is_none());
        assert!(c.claim("x", Duration::from_millis(20)).is_none());
        assert!(c.contains("x"));
        drop(a);
        assert!(!c.contains("x"));
        assert!(c.try_claim("x").is_some());
    }

    #[test]
    fn waiter_gets_claim_when_released() {
        let c = Arc::new(Claims::default());
        let held = c.try_claim("y").unwrap();
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.claim("y", Duration::from_secs(5)).is_some());
        std::thread::sleep(Duration::from_millis(30));
        drop(held);
        assert!(t.join().unwrap());
    }
}
