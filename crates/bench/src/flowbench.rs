//! `tern-bench flows`: the records a node's flow service keeps per second, and the agent's
//! memory with a full ring (issue 21, benchmark section).
//!
//! 1. On the real kernel, in a private network namespace (`ip netns`, uniquely named, deleted
//!    even on failure): 1,000 pod addresses (198.18.64.0/22, local on `lo`) and a policy model
//!    of 1,000 endpoints (five labels each) and `policies` policies (policybench's); an nft
//!    rule logs every UDP packet to a pod address to an NFLOG group with a default-deny flow
//!    tag (and drops it, as the default deny would), a sender emits such packets as fast as it
//!    can (each one a new flow to the service), and the agent's service (`Flows::take`, rate
//!    budget off) is fed from `NflogSocket::recv` on this thread. Two workloads: (a) four pod
//!    pairs, one destination port (every event after the first of a pair resolves from the
//!    cache) and (b) every event a new key (1,000 pairs x distinct destination ports: cache
//!    misses, each resolved against the model).
//! 2. The userspace rate: the same service fed synthetic batches (no kernel), hits and misses.
//! 3. Memory: VmRSS of this process before and after filling a ring of 10,000 records (the
//!    default) and one of `--ring` records, each record carrying both ends' five labels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use tern_agent::config::FlowsConfig;
use tern_agent::flows::Flows;
use tern_agent::flows::resolve::Hosts;
use tern_agent::metrics::exposition::Page;
use tern_api::flow::FlowQuery;
use tern_linux::nflog::{NflogBatch, NflogConfig, NflogEvent, NflogSocket, PacketHeaders};
use tern_policy::{Endpoint, PolicySet};

use crate::policybench::{BenchModel as Model, Netns, nft, policy};

/// Options of the flow-records benchmark.
#[derive(Debug, Clone)]
pub struct FlowBenchOptions {
    /// Seconds of each measurement (per kernel workload, per userspace workload).
    pub seconds: u32,
    /// Records of the large ring measured for memory (the default ring is measured too).
    pub ring: usize,
    /// Endpoints of the model (all local, all addresses the sender uses).
    pub endpoints: u32,
    /// Policies of the model.
    pub policies: u32,
}

/// The NFLOG group of the bench (inside its own namespace).
const GROUP: u16 = 2198;
/// The tag the rule logs with: a default deny at ingress (resolution names the policies
/// selecting the destination).
const TAG: &str = "t:dd:i";
/// Destination port of the cache-hit workload.
const HIT_PORT: u16 = 9999;
/// Pod pairs of the cache-hit workload.
const HIT_PAIRS: u32 = 4;
/// Events per synthetic batch (the kernel's batch is 32 messages; a recv may take several).
const SYNTHETIC_BATCH: usize = 64;
/// The default ring (`FlowsConfig::new`).
const DEFAULT_RING: usize = 10_000;

/// The i-th pod address: 198.18.64.0/22 (the bench's underlay range, inside its namespace).
fn pod_addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 64 + (i / 250) as u8, (i % 250) as u8 + 1)
}

/// The i-th endpoint: policybench's app/tier labels (so its policies select it) and three more.
fn endpoint(i: u32) -> Endpoint {
    Endpoint {
        namespace: format!("ns{}", i % 10),
        name: format!("pod{i}"),
        node: "n1".into(),
        interface: format!("tf{i:08}"),
        labels: BTreeMap::from([
            ("app".to_string(), format!("app{}", i % 100)),
            ("tier".to_string(), format!("t{}", i % 7)),
            ("team".to_string(), format!("team-{}", i % 13)),
            ("version".to_string(), format!("v1.{}", i % 5)),
            (
                "topology.kubernetes.io/zone".to_string(),
                format!("zone-{}", i % 3),
            ),
        ])
        .into(),
        ips: vec![IpAddr::V4(pod_addr(i))],
        ports: vec![],
    }
}

/// The bench's model: `endpoints` endpoints and `policies` policies.
fn model(endpoints: u32, policies: u32) -> anyhow::Result<PolicySet> {
    let mut set = PolicySet::new();
    for i in 0..endpoints {
        set.upsert_endpoint(endpoint(i));
    }
    for i in 0..policies {
        set.apply(&policy(i, false))?;
    }
    Ok(set)
}

/// The two workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A few pod pairs, one destination port: cache hits.
    Hits,
    /// Every flow a new key: cache misses.
    Misses,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Hits => "hits (4 pairs)",
            Workload::Misses => "misses (new key each)",
        }
    }

    /// The n-th flow: (source endpoint, destination endpoint, destination port).
    fn flow(self, n: u64, endpoints: u32) -> (u32, u32, u16) {
        let e = u64::from(endpoints.max(2));
        match self {
            Workload::Hits => {
                let p = (n % u64::from(HIT_PAIRS)) as u32 * 2;
                (p, p + 1, HIT_PORT)
            }
            Workload::Misses => {
                let p = n % e;
                // A new port each round over the pairs: keys repeat after 64,000 rounds.
                let port = 1024 + (n / e % 64_000) as u16;
                (p as u32, ((p + 1) % e) as u32, port)
            }
        }
    }
}

/// Figures of one kernel run.
#[derive(Debug, Clone)]
pub struct KernelRun {
    pub workload: Workload,
    /// Packets the sender handed to the kernel (each logged), in `window`.
    pub sent: u64,
    /// Sends that failed before the rule (not logged).
    pub send_failed: u64,
    pub window: Duration,
    /// Records the service kept (numbered into the ring), in `elapsed` (the window and the
    /// drain of what the kernel had queued).
    pub kept: u64,
    /// Events the kernel dropped (sequence gaps), and socket buffer overflows.
    pub lost: u64,
    pub overruns: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub elapsed: Duration,
}

/// Figures of one userspace run.
#[derive(Debug, Clone)]
pub struct UserRun {
    pub workload: Workload,
    pub records: u64,
    /// Time inside `Flows::take` only (building the batches is not counted).
    pub busy: Duration,
}

/// Memory with a full ring.
#[derive(Debug, Clone)]
pub struct MemoryRun {
    pub ring: usize,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
}

#[derive(Debug, Clone)]
pub struct FlowBenchReport {
    pub kernel: Vec<KernelRun>,
    pub user: Vec<UserRun>,
    pub memory: Vec<MemoryRun>,
    pub rss_baseline_kib: u64,
}

/// `n` per second over `d` (0 for no time).
pub fn per_second(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// Bytes per record of a ring of `records` that moved RSS from `before` to `after` KiB (0 if
/// it did not grow).
pub fn bytes_per_record(before_kib: u64, after_kib: u64, records: usize) -> f64 {
    if records == 0 {
        return 0.0;
    }
    after_kib.saturating_sub(before_kib) as f64 * 1024.0 / records as f64
}

/// VmRSS (KiB) of a `/proc/PID/status` text.
pub fn parse_vmrss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

fn rss_kib() -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status").context("read /proc/self/status")?;
    parse_vmrss(&s).context("no VmRSS in /proc/self/status")
}

/// A counter of the service's `/metrics` part, by name.
fn metric(flows: &Flows, name: &str) -> u64 {
    let mut page = Page::new();
    flows.render_metrics("n1", &mut page);
    let text = page.into_string();
    let prefix = format!("{name}{{node=\"n1\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Records numbered into the ring so far.
fn kept(flows: &Flows) -> u64 {
    flows
        .query(&FlowQuery {
            last: Some(1),
            ..FlowQuery::default()
        })
        .last_seq
}

/// The service without a rate budget.
fn service(ring: usize) -> Flows {
    Flows::new(
        "n1",
        FlowsConfig {
            ring,
            rate: u32::MAX,
            ..FlowsConfig::new(GROUP)
        },
    )
}

fn event(src: u32, dst: u32, sport: u16, dport: u16) -> NflogEvent {
    NflogEvent {
        family: 2,
        prefix: TAG.into(),
        indev: None,
        outdev: None,
        mark: None,
        seq: None,
        time: SystemTime::now(),
        packet: Some(PacketHeaders {
            src: IpAddr::V4(pod_addr(src)),
            dst: IpAddr::V4(pod_addr(dst)),
            proto: 17,
            src_port: Some(sport),
            dst_port: Some(dport),
            icmp: None,
        }),
    }
}

/// A synthetic batch of flows `from..from + n` of `w`.
fn batch(w: Workload, from: u64, n: usize, endpoints: u32) -> NflogBatch {
    NflogBatch {
        events: (from..from + n as u64)
            .map(|i| {
                let (s, d, port) = w.flow(i, endpoints);
                event(s, d, 10_000 + (i % 50_000) as u16, port)
            })
            .collect(),
        ..NflogBatch::default()
    }
}

fn run_user(w: Workload, o: &FlowBenchOptions, model: &Model) -> UserRun {
    let flows = service(DEFAULT_RING);
    let hosts = Hosts::default();
    let budget = Duration::from_secs(u64::from(o.seconds.max(1)));
    let (mut busy, mut n) = (Duration::ZERO, 0u64);
    while busy < budget {
        let b = batch(w, n, SYNTHETIC_BATCH, o.endpoints);
        let t = Instant::now();
        flows.take(b, model, &hosts);
        busy += t.elapsed();
        n += SYNTHETIC_BATCH as u64;
    }
    UserRun {
        workload: w,
        records: kept(&flows),
        busy,
    }
}

fn run_memory(ring: usize, endpoints: u32, model: &Model) -> anyhow::Result<(MemoryRun, Flows)> {
    let hosts = Hosts::default();
    let rss_before_kib = rss_kib()?;
    let flows = service(ring);
    let mut n = 0u64;
    // 1,000 pairs, one port: the cache holds 1,000 resolutions, the records are the ring's.
    while (n as usize) < ring {
        let count = SYNTHETIC_BATCH.min(ring - n as usize);
        flows.take(
            batch(Workload::Misses, n % 1000, count, endpoints),
            model,
            &hosts,
        );
        n += count as u64;
    }
    if flows.len() != ring {
        bail!("ring of {ring} holds {} records", flows.len());
    }
    Ok((
        MemoryRun {
            ring,
            rss_before_kib,
            rss_after_kib: rss_kib()?,
        },
        flows,
    ))
}

/// The sender: `w`'s flows as fast as it can until `stop`, counting what the kernel took.
fn send(w: Workload, endpoints: u32, stop: &AtomicBool, counts: &SendCounts) -> anyhow::Result<()> {
    let sources = match w {
        Workload::Hits => HIT_PAIRS * 2,
        Workload::Misses => endpoints,
    };
    let socks: Vec<UdpSocket> = (0..sources)
        .map(|i| UdpSocket::bind(SocketAddr::new(IpAddr::V4(pod_addr(i)), 0)))
        .collect::<Result<_, _>>()
        .context("bind the sender's sockets")?;
    let start = Instant::now();
    let mut n = 0u64;
    let (mut logged, mut failed) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..256 {
            let (s, d, port) = w.flow(n, endpoints);
            n += 1;
            // The rule drops the packet after logging it (EPERM): it was logged all the same.
            match socks[s as usize].send_to(b"x", SocketAddr::new(IpAddr::V4(pod_addr(d)), port)) {
                Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => failed += 1,
                _ => logged += 1,
            }
        }
        counts.logged.fetch_add(logged, Ordering::Relaxed);
        counts.failed.fetch_add(failed, Ordering::Relaxed);
        (logged, failed) = (0, 0);
    }
    counts.window_us.store(
        u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    Ok(())
}

/// What the sender did.
#[derive(Debug, Default)]
struct SendCounts {
    /// Packets the output hook saw (sent, or dropped by the rule after logging).
    logged: AtomicU64,
    /// Sends that failed before (any error but the rule's EPERM).
    failed: AtomicU64,
    /// How long it sent.
    window_us: AtomicU64,
}

fn run_kernel(
    w: Workload,
    o: &FlowBenchOptions,
    ns: &str,
    model: &Model,
) -> anyhow::Result<KernelRun> {
    let netns = tern_linux::netns::NetNs::open(std::path::Path::new(&format!("/run/netns/{ns}")))?;
    let mut sock = netns.open_inside(|| NflogSocket::open(&NflogConfig::new(GROUP)))??;
    let flows = service(DEFAULT_RING);
    let hosts = Hosts::default();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(SendCounts::default());
    let (stop2, counts2, ns2, endpoints) =
        (stop.clone(), counts.clone(), ns.to_string(), o.endpoints);
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        tern_lab::netns::in_netns(&ns2, || send(w, endpoints, &stop2, &counts2))
    });
    let (mut lost, mut overruns) = (0, 0);
    let mut take = |b: NflogBatch| {
        lost += b.lost;
        overruns += b.overruns;
        flows.take(b, model, &hosts);
    };
    let window = Duration::from_secs(u64::from(o.seconds.max(1)));
    let mut failed = None;
    while start.elapsed() < window {
        match sock.recv(Duration::from_millis(100)) {
            Ok(b) => take(b),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let joined = sender.join();
    if let Some(e) = failed {
        return Err(e).context("NFLOG recv");
    }
    joined
        .map_err(|_| anyhow::anyhow!("sender panicked"))?
        .context("sender")??;
    // What the kernel already queued: until nothing comes for 300 ms (at most 5 s).
    let drain = Instant::now();
    while drain.elapsed() < Duration::from_secs(5) {
        let b = sock
            .recv(Duration::from_millis(300))
            .context("NFLOG recv")?;
        if b.events.is_empty() && b.lost == 0 && b.overruns == 0 {
            break;
        }
        take(b);
    }
    let elapsed = start.elapsed();
    Ok(KernelRun {
        workload: w,
        sent: counts.logged.load(Ordering::Relaxed),
        send_failed: counts.failed.load(Ordering::Relaxed),
        window: Duration::from_micros(counts.window_us.load(Ordering::Relaxed)),
        kept: kept(&flows),
        lost,
        overruns,
        cache_hits: metric(&flows, "tern_flow_resolve_cache_hits_total"),
        cache_misses: metric(&flows, "tern_flow_resolve_cache_misses_total"),
        elapsed,
    })
}

/// Runs the benchmark (as root: it makes a network namespace).
pub fn run_flows(o: &FlowBenchOptions) -> anyhow::Result<FlowBenchReport> {
    if o.endpoints < 2 || o.endpoints > 1000 {
        bail!("endpoints: 2 to 1,000 (the addresses of 198.18.64.0/22 the bench uses)");
    }
    let rss_baseline_kib = rss_kib()?;
    let model = Model(model(o.endpoints, o.policies)?);
    // Memory first, on a heap that has not yet grown and shrunk; both rings kept until the end
    // so the second does not reuse what the first freed.
    let (m1, keep1) = run_memory(DEFAULT_RING, o.endpoints, &model)?;
    let (m2, keep2) = run_memory(o.ring, o.endpoints, &model)?;
    drop((keep1, keep2));
    let user = vec![
        run_user(Workload::Hits, o, &model),
        run_user(Workload::Misses, o, &model),
    ];
    let ns = Netns(format!("tern-flowbench-{}", std::process::id()));
    let ok = Command::new("ip").args(["netns", "add", &ns.0]).status()?;
    if !ok.success() {
        bail!("ip netns add {} failed", ns.0);
    }
    for args in [
        &["ip", "link", "set", "lo", "up"][..],
        &["ip", "route", "add", "local", "198.18.64.0/22", "dev", "lo"][..],
    ] {
        let ok = Command::new("ip")
            .args(["netns", "exec", &ns.0])
            .args(args)
            .status()?;
        if !ok.success() {
            bail!("`{}` in {} failed", args.join(" "), ns.0);
        }
    }
    nft(
        &ns.0,
        &format!(
            "table inet ternflowbench {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    ip daddr 198.18.64.0/22 meta l4proto udp log prefix \"{TAG}\" group {GROUP} snaplen 96 drop\n  }}\n}}\n"
        ),
    )?;
    let kernel = vec![
        run_kernel(Workload::Hits, o, &ns.0, &model)?,
        run_kernel(Workload::Misses, o, &ns.0, &model)?,
    ];
    Ok(FlowBenchReport {
        kernel,
        user,
        memory: vec![m1, m2],
        rss_baseline_kib,
    })
}

/// The report as a short table.
pub fn render(o: &FlowBenchOptions, r: &FlowBenchReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "flow records: model of {} endpoints (5 labels each) and {} policies, rate budget off",
        o.endpoints, o.policies
    );
    let _ = writeln!(
        s,
        "\nkernel (NFLOG in a private netns, {} s per workload; every packet a new flow; \
         not kept = sent - kept; lost = the kernel's sequence gaps):",
        o.seconds
    );
    let _ = writeln!(
        s,
        "  {:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "workload",
        "sent/s",
        "sent",
        "kept",
        "not kept",
        "kept/s",
        "drain",
        "lost",
        "overruns",
        "hits",
        "misses"
    );
    for k in &r.kernel {
        if k.send_failed > 0 {
            let _ = writeln!(
                s,
                "  ({}: {} sends failed before the rule)",
                k.workload.name(),
                k.send_failed
            );
        }
        let _ = writeln!(
            s,
            "  {:<24} {:>9.0} {:>9} {:>9} {:>9} {:>9.0} {:>5.1}s {:>9} {:>9} {:>9} {:>9}",
            k.workload.name(),
            per_second(k.sent, k.window),
            k.sent,
            k.kept,
            k.sent.saturating_sub(k.kept),
            per_second(k.kept, k.elapsed),
            k.elapsed.saturating_sub(k.window).as_secs_f64(),
            k.lost,
            k.overruns,
            k.cache_hits,
            k.cache_misses
        );
    }
    let _ = writeln!(
        s,
        "\nuserspace only (Flows::take on synthetic batches of {SYNTHETIC_BATCH}):"
    );
    let _ = writeln!(
        s,
        "  {:<24} {:>12} {:>14}",
        "workload", "records/s", "us/record"
    );
    for u in &r.user {
        let rate = per_second(u.records, u.busy);
        let _ = writeln!(
            s,
            "  {:<24} {:>12.0} {:>14.2}",
            u.workload.name(),
            rate,
            if rate > 0.0 { 1e6 / rate } else { 0.0 }
        );
    }
    let _ = writeln!(
        s,
        "\nmemory with a full ring (VmRSS; process at start {} KiB):",
        r.rss_baseline_kib
    );
    let _ = writeln!(
        s,
        "  {:>10} {:>12} {:>12} {:>12} {:>14}",
        "records", "before KiB", "after KiB", "grew KiB", "bytes/record"
    );
    for m in &r.memory {
        let _ = writeln!(
            s,
            "  {:>10} {:>12} {:>12} {:>12} {:>14.0}",
            m.ring,
            m.rss_before_kib,
            m.rss_after_kib,
            m.rss_after_kib.saturating_sub(m.rss_before_kib),
            bytes_per_record(m.rss_before_kib, m.rss_after_kib, m.ring)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        assert_eq!(per_second(500, Duration::from_millis(250)), 2000.0);
        assert_eq!(per_second(5, Duration::ZERO), 0.0);
        assert_eq!(bytes_per_record(1000, 2000, 1024), 1000.0);
        assert_eq!(
            bytes_per_record(2000, 1000, 10),
            0.0,
            "a shrink is not negative"
        );
        assert_eq!(bytes_per_record(0, 10, 0), 0.0);
        let status = "Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t   12345 kB\nVmData: 1 kB\n";
        assert_eq!(parse_vmrss(status), Some(12345));
        assert_eq!(parse_vmrss("VmRSS: lots\n"), None);
    }

    #[test]
    fn workloads_hit_and_miss_as_named() {
        let keys = |w: Workload| {
            (0..10_000u64)
                .map(|n| w.flow(n, 1000))
                .collect::<std::collections::HashSet<_>>()
                .len()
        };
        assert_eq!(keys(Workload::Hits), HIT_PAIRS as usize);
        assert_eq!(keys(Workload::Misses), 10_000);
        for n in 0..5_000 {
            let (s, d, _) = Workload::Misses.flow(n, 1000);
            assert!(s < 1000 && d < 1000 && s != d);
        }
    }
}
