//! Prometheus metrics: the agent's in-memory counters ([`Metrics`]) and the IPAM gauges, in the
//! text exposition format, which [`exposition`] alone writes. The HTTP endpoints that serve
//! them are the root's (`http.rs`).
//!
//! The IPAM gauges are computed from the store at
//! scrape time, so they are never stale and cost nothing between scrapes. Gauges cover only
//! this node (label `node`), so that a cluster of agents exports each series exactly once;
//! they are labelled by pool as Calico's kube-controllers label theirs.

pub mod exposition;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use exposition::{Histogram, Page};

/// Upper bounds (seconds) of the request latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The agent's in-memory counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    gc_reclamations: AtomicU64,
}

impl Metrics {
    /// Counts one CNI request of `op` ("add", "del", ...) that ended in `result` ("ok" or
    /// "error") after `elapsed`.
    pub fn observe_request(&self, op: &str, result: &str, elapsed: Duration) {
        *self
            .requests
            .lock()
            .unwrap()
            .entry((op.to_string(), result.to_string()))
            .or_default() += 1;
        self.latency
            .lock()
            .unwrap()
            .entry(op.to_string())
            .or_insert_with(|| Histogram::new(&LATENCY_BUCKETS))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts addresses released by leak repair.
    pub fn add_gc_reclamations(&self, n: u64) {
        self.gc_reclamations.fetch_add(n, Ordering::Relaxed);
    }

    /// Addresses released by leak repair since start.
    pub fn gc_reclamations(&self) -> u64 {
        self.gc_reclamations.load(Ordering::Relaxed)
    }

    /// Writes the counters (not the store-derived gauges) to a `/metrics` page.
    pub fn render_counters(&self, node: &str, page: &mut Page) {
        let mut f = page.counter(
            "tern_cni_requests_total",
            "CNI requests served, by operation and result.",
        );
        for ((op, result), n) in self.requests.lock().unwrap().iter() {
            f.sample(&[("op", op), ("result", result)], *n);
        }
        let mut f = page.histogram(
            "tern_cni_request_duration_seconds",
            "Time to serve a CNI request.",
        );
        for (op, h) in self.latency.lock().unwrap().iter() {
            f.series(&[("op", op)], h);
        }
        page.counter(
            "ipam_gc_reclamations",
            "Leaked addresses released by the agent's leak repair.",
        )
        .sample(&[("node", node)], self.gc_reclamations());
    }
}

/// Gives the heap's free pages back to the kernel (glibc `malloc_trim`). The periodic resyncs
/// read whole classes (every endpoint of the cluster, every block) into new structures and
/// drop the old ones; glibc keeps what they freed, so without this the RSS stays at the peak
/// of the last resync (at 1,000 nodes: 40 MiB in use, up to 60 MiB more kept). Called after
/// each maintenance cycle; it costs a walk of the free lists.
pub fn trim_heap() {
    // SAFETY: malloc_trim only returns free memory of glibc's arenas to the kernel; 0 keeps
    // no padding.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// glibc's view of the agent's heap (`mallinfo2`): the bytes in use, the bytes freed but
/// kept by the allocator (fragmentation, arenas), and the bytes in whole mapped blocks. The
/// difference between the RSS and the bytes in use tells memory held from memory lost.
pub fn render_heap(node: &str, page: &mut Page) {
    // SAFETY: mallinfo2 only reads the allocator's counters; it takes no argument.
    let m = unsafe { libc::mallinfo2() };
    for (name, help, v) in [
        (
            "tern_heap_in_use_bytes",
            "Heap bytes allocated and not freed (glibc mallinfo2 uordblks + hblkhd).",
            m.uordblks + m.hblkhd,
        ),
        (
            "tern_heap_free_bytes",
            "Heap bytes freed but kept by the allocator (glibc mallinfo2 fordblks).",
            m.fordblks,
        ),
    ] {
        page.gauge(name, help).sample(&[("node", node)], v);
    }
}

/// Per-pool IPAM figures of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolGauges {
    /// Addresses allocated by this node (attribute `node`).
    pub in_use: u64,
    /// Blocks affine to this node.
    pub blocks: u64,
    /// Addresses this node allocated from blocks affine to another node (or to none).
    pub borrowed: u64,
}

/// Computes this node's IPAM gauges per pool name from the store.
pub fn ipam_gauges(
    ipam: &tern_ipam::Ipam,
    node: &str,
) -> Result<BTreeMap<String, PoolGauges>, tern_ipam::IpamError> {
    let usage = ipam.usage()?;
    let allocs = ipam.allocations(None)?;
    let mut out: BTreeMap<String, PoolGauges> = BTreeMap::new();
    let pool_of = |block: &ipnet::IpNet| -> Option<(&str, Option<&str>)> {
        usage.iter().find_map(|p| {
            p.blocks
                .iter()
                .find(|b| b.cidr == *block)
                .map(|b| (p.pool.as_str(), b.affinity.as_deref()))
        })
    };
    for p in &usage {
        let g = out.entry(p.pool.clone()).or_default();
        g.blocks = p
            .blocks
            .iter()
            .filter(|b| b.affinity.as_deref() == Some(node))
            .count() as u64;
    }
    for a in allocs.iter().filter(|a| a.attrs.node == node) {
        let Some((pool, affinity)) = pool_of(&a.block) else {
            continue;
        };
        let g = out.entry(pool.to_string()).or_default();
        g.in_use += 1;
        if affinity != Some(node) {
            g.borrowed += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counters_render_in_prometheus_format() {
        let m = Metrics::default();
        m.observe_request("add", "ok", Duration::from_millis(20));
        m.observe_request("add", "ok", Duration::from_millis(700));
        m.observe_request("del", "error", Duration::from_millis(1));
        m.add_gc_reclamations(3);
        let mut page = Page::new();
        m.render_counters("n1", &mut page);
        render_heap("n1", &mut page);
        let out = page.into_string();
        // The page parses, and the names dashboards, tests and docs rely on are unchanged.
        assert_eq!(
            exposition::check(&out).unwrap(),
            vec![
                "tern_cni_requests_total",
                "tern_cni_request_duration_seconds",
                "ipam_gc_reclamations",
                "tern_heap_in_use_bytes",
                "tern_heap_free_bytes",
            ]
        );
        assert!(
            out.contains("tern_cni_requests_total{op=\"add\",result=\"ok\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("tern_cni_requests_total{op=\"del\",result=\"error\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("tern_cni_request_duration_seconds_bucket{op=\"add\",le=\"0.025\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("tern_cni_request_duration_seconds_bucket{op=\"add\",le=\"1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("tern_cni_request_duration_seconds_bucket{op=\"add\",le=\"+Inf\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("tern_cni_request_duration_seconds_count{op=\"add\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("ipam_gc_reclamations{node=\"n1\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("# TYPE ipam_gc_reclamations counter\n"),
            "{out}"
        );
    }

    #[test]
    fn gauges_count_own_borrowed_and_blocks() {
        use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
        use tern_model::{Document, IpPoolSpec};
        let store: Arc<dyn tern_store::Store> = Arc::new(tern_store::mem::MemStore::new());
        let mut spec = IpPoolSpec::new("10.250.0.0/28");
        spec.block_size = 30;
        tern_model::put_resource(&*store, &Document::new("p1", spec).into()).unwrap();
        let ipam_store = store.clone();
        let ipam = Ipam::new(store);
        let assign = |node: &str, h: &str, n: usize| {
            ipam.auto_assign(&AssignArgs {
                handle: h.into(),
                node: node.into(),
                attrs: AllocationAttrs {
                    node: node.into(),
                    ..Default::default()
                },
                num_v4: n,
                ..Default::default()
            })
            .unwrap()
        };
        // n2 claims a block; n1 may hold one block only, fills it, then borrows from n2's.
        assign("n2", "h2", 1);
        let cfg = tern_model::IpamConfigSpec {
            strict_affinity: false,
            max_blocks_per_host: 1,
            ..Default::default()
        };
        tern_model::put_resource(&*ipam_store, &Document::new("default", cfg).into()).unwrap();
        assign("n1", "h1", 4);
        assign("n1", "h3", 1);
        let g = ipam_gauges(&ipam, "n1").unwrap();
        assert_eq!(
            g["p1"],
            PoolGauges {
                in_use: 5,
                blocks: 1,
                borrowed: 1
            }
        );
        let g2 = ipam_gauges(&ipam, "n2").unwrap();
        assert_eq!(
            g2["p1"],
            PoolGauges {
                in_use: 1,
                blocks: 1,
                borrowed: 0
            }
        );
    }
}
