//! Per-name claims: an ADD, a DEL and the reconciler never work on the same host interface at
//! the same time, and leak repair never releases the addresses of an IPAM handle an ADD is
//! still working on.
//!
//! A claim is exclusive ([`Claims::claim`], [`Claims::try_claim`]): ADD and DEL wait for one on
//! the host interface; the reconciler skips what is claimed. A hold is shared
//! ([`Claims::hold`]): it never waits, and only marks the name as in use (an ADD's IPAM handle,
//! which leak repair reads with [`Claims::names`]). Both are released on drop.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The claimed names, each with its number of holders.
#[derive(Default)]
pub struct Claims {
    set: Mutex<HashMap<String, usize>>,
    cv: Condvar,
}

/// A held claim, released on drop.
pub struct Claim<'a> {
    claims: &'a Claims,
    name: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut set = self.claims.set.lock().unwrap();
        if let Some(n) = set.get_mut(&self.name) {
            *n -= 1;
            if *n == 0 {
                set.remove(&self.name);
            }
        }
        drop(set);
        self.claims.cv.notify_all();
    }
}

impl Claims {
    /// Claims `name` exclusively, waiting up to `timeout` for other holders; `None` on timeout.
    pub fn claim(&self, name: &str, timeout: Duration) -> Option<Claim<'_>> {
        let deadline = Instant::now() + timeout;
        let mut set = self.set.lock().unwrap();
        while set.contains_key(name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            set = self.cv.wait_timeout(set, left).unwrap().0;
        }
        set.insert(name.to_string(), 1);
        Some(self.held(name))
    }

    /// Claims `name` exclusively only if nobody holds it.
    pub fn try_claim(&self, name: &str) -> Option<Claim<'_>> {
        let mut set = self.set.lock().unwrap();
        if set.contains_key(name) {
            return None;
        }
        set.insert(name.to_string(), 1);
        Some(self.held(name))
    }

    /// Marks `name` as in use without excluding other holders (never waits).
    pub fn hold(&self, name: &str) -> Claim<'_> {
        *self
            .set
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default() += 1;
        self.held(name)
    }

    /// True while `name` is claimed or held.
    pub fn contains(&self, name: &str) -> bool {
        self.set.lock().unwrap().contains_key(name)
    }

    /// The names claimed or held now.
    pub fn names(&self) -> HashSet<String> {
        self.set.lock().unwrap().keys().cloned().collect()
    }

    fn held(&self, name: &str) -> Claim<'_> {
        Claim {
            claims: self,
            name: name.to_string(),
        }
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

    #[test]
    fn holds_are_shared_and_counted() {
        let c = Claims::default();
        let a = c.hold("h");
        let b = c.hold("h");
        assert!(c.try_claim("h").is_none());
        drop(a);
        assert!(c.contains("h"), "a second holder keeps the name held");
        assert_eq!(c.names(), HashSet::from(["h".to_string()]));
        drop(b);
        assert!(!c.contains("h"));
        assert!(c.names().is_empty());
    }
}
