//! Leak repair: releasing addresses of this node that nothing uses any more.
//!
//! An ADD that dies between allocating and recording its endpoint (agent killed, node
//! rebooted, runtime gave up without DEL) leaves an allocation that no DEL will ever release.
//! Calico calls an allocation leaked when its pod no longer exists; tern has no API server, so
//! the rule is, for allocations whose attribute `node` is this node and that have a handle:
//!
//! * made by the `tern` main plugin (no owner record, see below): leaked when no
//!   WorkloadEndpoint of this node has the allocation's handle and no ADD of that handle is in
//!   flight;
//! * made by standalone `tern-ipam` under another main plugin: such allocations never have a
//!   tern endpoint, so the agent records an *owner record* (`/tern/v1/ipam/owners/<node>/<handle>`
//!   with the pod's netns path) before allocating. Leaked when that netns path no longer exists
//!   (the sandbox is gone); an owner record without a netns path is never released here (only
//!   by DEL, CNI GC or `ternctl ipam release`).
//!
//! Allocations of other nodes in blocks affine to this node are never touched: their endpoints
//! live on the other node. Allocations without a handle (reservations, manual assignments) are
//! never touched.
//!
//! Safety: an allocation must look leaked in consecutive scans for longer than the grace
//! period; just before release the endpoints are re-read from the store (not the cache) and
//! the in-flight set re-checked; and the release is a compare-and-swap on the allocation's
//! sequence number, so an address that was freed and reused meanwhile is never released.

use crate::claims::Claims;
use crate::endpoints::{Endpoint, Endpoints};
use crate::owners::{OwnerRecord, delete_owner, list_owners};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tern_ipam::{Allocation, Ipam};
use tern_store::Store;

/// What the node knows about who uses addresses, for [`leak_suspects`].
pub struct UseView<'a> {
    /// This node's name.
    pub node: &'a str,
    /// Handles of this node's tern endpoints (non-delegated).
    pub endpoint_handles: &'a HashSet<String>,
    /// Handles of ADDs in flight.
    pub in_flight: &'a HashSet<String>,
    /// Owner records of standalone IPAM allocations of this node.
    pub owners: &'a HashMap<String, OwnerRecord>,
}

/// The allocations that look leaked now (see the module documentation for the rule).
/// `netns_exists` decides whether a recorded sandbox is still there.
pub fn leak_suspects(
    allocs: &[Allocation],
    view: &UseView<'_>,
    netns_exists: &dyn Fn(&str) -> bool,
) -> Vec<Allocation> {
    allocs
        .iter()
        .filter(|a| {
            let Some(h) = a.handle.as_deref() else {
                return false;
            };
            if a.attrs.node != view.node
                || view.in_flight.contains(h)
                || view.endpoint_handles.contains(h)
            {
                return false;
            }
            match view.owners.get(h) {
                Some(o) => !o.netns.is_empty() && !netns_exists(&o.netns),
                None => true,
            }
        })
        .cloned()
        .collect()
}

/// Whether a netns path still names a namespace (a bind mount or a /proc path of a live
/// process). Any error other than "not found" counts as existing: never release on doubt.
pub fn netns_path_exists(p: &str) -> bool {
    match std::fs::metadata(Path::new(p)) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// Suspects and when each was first seen, keyed by (address, sequence number) so that a
/// reused address starts a new grace period.
#[derive(Debug, Default)]
pub struct LeakTracker {
    first_seen: Mutex<HashMap<(IpAddr, u64), Instant>>,
}

impl LeakTracker {
    /// Records the current suspects (forgetting those no longer suspect) and returns those
    /// suspected for at least `grace`.
    pub fn update(
        &self,
        suspects: &[Allocation],
        grace: Duration,
        now: Instant,
    ) -> Vec<Allocation> {
        let mut seen = self.first_seen.lock().unwrap();
        let current: HashSet<(IpAddr, u64)> =
            suspects.iter().map(|a| (a.ip, a.sequence_number)).collect();
        seen.retain(|k, _| current.contains(k));
        suspects
            .iter()
            .filter(|a| {
                let t = *seen.entry((a.ip, a.sequence_number)).or_insert(now);
                now.duration_since(t) >= grace
            })
            .cloned()
            .collect()
    }

    /// Forgets released suspects.
    pub fn forget(&self, released: &[Allocation]) {
        let mut seen = self.first_seen.lock().unwrap();
        for a in released {
            seen.remove(&(a.ip, a.sequence_number));
        }
    }

    /// Number of allocations currently suspected.
    pub fn len(&self) -> usize {
        self.first_seen.lock().unwrap().len()
    }

    /// True when nothing is suspected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Outcome of one leak-repair pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeakReport {
    /// Allocations that look leaked now (including those released).
    pub suspects: usize,
    /// Addresses released in this pass.
    pub released: Vec<IpAddr>,
    pub errors: Vec<String>,
}

/// What one leak-repair pass reads; the agent lends it its own state.
pub struct RepairInputs<'a> {
    /// This node's name.
    pub node: &'a str,
    pub store: &'a dyn Store,
    pub ipam: &'a Ipam,
    /// IPAM handles of ADDs in flight (re-read just before release).
    pub in_flight_handles: &'a Claims,
    /// The endpoint cache (the store itself is re-read before release).
    pub endpoints: &'a Endpoints,
    /// How long an allocation must look leaked before it is released.
    pub grace: Duration,
}

impl LeakTracker {
    /// Handles in use by endpoints: each endpoint's handle and its legacy form, since a pod
    /// added before handles were unambiguous still holds its addresses under the latter
    /// (keeping a legacy handle another attachment shares errs on the side of not releasing).
    fn endpoint_handles(eps: &[Endpoint]) -> HashSet<String> {
        eps.iter()
            .filter(|e| !e.delegated_ipam)
            .flat_map(|e| [e.attachment.handle(), e.attachment.legacy_handle()])
            .collect()
    }

    /// One leak-repair pass: finds suspects, releases those suspected for longer than the
    /// grace period after re-checking them against the store.
    pub fn repair(&self, inp: &RepairInputs<'_>) -> LeakReport {
        let mut r = LeakReport::default();
        let node = inp.node;
        // Order matters: allocations first, then in-flight, then endpoints. An ADD marks its
        // handle in flight before allocating and records its endpoint before unmarking, so an
        // allocation listed here is covered by one of the two later snapshots.
        let allocs = match inp.ipam.allocations(Some(node)) {
            Ok(a) => a,
            Err(e) => {
                r.errors.push(format!("listing allocations: {e}"));
                return r;
            }
        };
        let owners = match list_owners(inp.store, Some(node)) {
            Ok(o) => o,
            Err(e) => {
                r.errors.push(format!("listing IPAM owner records: {e}"));
                return r;
            }
        };
        let in_flight = inp.in_flight_handles.names();
        let handles = Self::endpoint_handles(&inp.endpoints.all());
        let view = UseView {
            node,
            endpoint_handles: &handles,
            in_flight: &in_flight,
            owners: &owners,
        };
        let suspects = leak_suspects(&allocs, &view, &netns_path_exists);
        r.suspects = suspects.len();
        let grace = inp.grace;
        let due = self.update(&suspects, grace, Instant::now());
        if due.is_empty() {
            return r;
        }
        // Re-check against the stored records: the endpoint cache may lag a concurrent refresh.
        let fresh = match inp.endpoints.list_stored() {
            Ok(eps) => eps,
            Err(e) => {
                r.errors.push(format!("re-reading endpoints: {e}"));
                return r;
            }
        };
        let in_flight = inp.in_flight_handles.names();
        let handles = Self::endpoint_handles(&fresh);
        let view = UseView {
            in_flight: &in_flight,
            endpoint_handles: &handles,
            ..view
        };
        let due = leak_suspects(&due, &view, &netns_path_exists);
        match inp.ipam.release_allocations(&due) {
            Ok(ips) => {
                for a in &due {
                    if ips.contains(&a.ip) {
                        log::info!(
                            "leak repair: released {} (handle {}, container {}, suspected for over {}s)",
                            a.ip,
                            a.handle.as_deref().unwrap_or(""),
                            a.attrs.container_id,
                            grace.as_secs()
                        );
                    }
                }
                r.released = ips;
            }
            Err(e) => r.errors.push(format!("releasing leaked addresses: {e}")),
        }
        self.forget(&due);
        // Owner records of released standalone allocations are done with.
        let done: HashSet<&str> = due.iter().filter_map(|a| a.handle.as_deref()).collect();
        for h in done {
            if owners.contains_key(h)
                && inp.ipam.ips_by_handle(h).is_ok_and(|l| l.is_empty())
                && let Err(e) = delete_owner(inp.store, node, h)
            {
                r.errors.push(format!("deleting owner record of {h}: {e}"));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_ipam::AllocationAttrs;

    fn alloc(ip: &str, handle: Option<&str>, node: &str, seq: u64) -> Allocation {
        Allocation {
            ip: ip.parse().unwrap(),
            handle: handle.map(str::to_string),
            attrs: AllocationAttrs {
                node: node.into(),
                ..Default::default()
            },
            block: "10.0.0.0/26".parse().unwrap(),
            sequence_number: seq,
        }
    }

    #[test]
    fn suspects_follow_the_rule() {
        let allocs = vec![
            alloc("10.0.0.1", Some("net.live"), "n1", 1),
            alloc("10.0.0.2", Some("net.orphan"), "n1", 2),
            alloc("10.0.0.3", Some("net.flying"), "n1", 3),
            alloc("10.0.0.4", Some("net.other-node"), "n2", 4),
            alloc("10.0.0.5", None, "n1", 5),
            alloc("10.0.0.6", Some("net.ipam-live"), "n1", 6),
            alloc("10.0.0.7", Some("net.ipam-gone"), "n1", 7),
            alloc("10.0.0.8", Some("net.ipam-unknown"), "n1", 8),
        ];
        let eps: HashSet<String> = ["net.live".to_string()].into();
        let fl: HashSet<String> = ["net.flying".to_string()].into();
        let owner = |h: &str, ns: &str| {
            (
                h.to_string(),
                OwnerRecord {
                    handle: h.into(),
                    node: "n1".into(),
                    netns: ns.into(),
                    ..Default::default()
                },
            )
        };
        let owners: HashMap<String, OwnerRecord> = [
            owner("net.ipam-live", "/run/netns/alive"),
            owner("net.ipam-gone", "/run/netns/gone"),
            owner("net.ipam-unknown", ""),
        ]
        .into();
        let view = UseView {
            node: "n1",
            endpoint_handles: &eps,
            in_flight: &fl,
            owners: &owners,
        };
        let s = leak_suspects(&allocs, &view, &|p| p == "/run/netns/alive");
        let ips: Vec<String> = s.iter().map(|a| a.ip.to_string()).collect();
        assert_eq!(ips, vec!["10.0.0.2", "10.0.0.7"]);
    }

    #[test]
    fn tracker_waits_for_the_grace_period_and_restarts_on_reuse() {
        let t = LeakTracker::default();
        let t0 = Instant::now();
        let a = alloc("10.0.0.2", Some("h"), "n1", 2);
        let g = Duration::from_secs(10);
        assert!(t.update(std::slice::from_ref(&a), g, t0).is_empty());
        assert!(
            t.update(std::slice::from_ref(&a), g, t0 + Duration::from_secs(5))
                .is_empty()
        );
        assert_eq!(t.update(std::slice::from_ref(&a), g, t0 + g).len(), 1);
        // No longer suspect: forgotten; suspected again later: a new grace period.
        assert!(t.update(&[], g, t0 + g).is_empty());
        assert!(t.is_empty());
        assert!(t.update(std::slice::from_ref(&a), g, t0 + g * 2).is_empty());
        // Same address, new allocation (sequence number): its own grace period.
        let reused = alloc("10.0.0.2", Some("h2"), "n1", 9);
        assert!(
            t.update(std::slice::from_ref(&reused), g, t0 + g * 3)
                .is_empty()
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn missing_paths_do_not_exist() {
        assert!(netns_path_exists("/proc/self/ns/net"));
        assert!(!netns_path_exists("/nonexistent/tern/netns"));
    }
}
