//! `tern-bench policy`: how fast policy reaches the kernel at scale. Programs 1,000 policies
//! over 1,000 local endpoints (plus remote endpoints feeding selector sets) into the `inet tern`
//! table of a private network namespace (`ip netns`, uniquely named, deleted even on failure),
//! then times incremental changes end to end, applied as ternd applies them (model update, then
//! one netlink batch, `nft -f` only if the kernel refuses it):
//! a remote pod joining selected sets, a local pod joining (its chains, map entries, set
//! elements), and one policy added. Target: an incremental change <= 10 ms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tern_agent::policy::{Applied, apply_pending};
use tern_model::{
    Action, EntityRule, NetworkPolicy, NetworkPolicySpec, PolicyType, Port, Protocol, Resource,
    Rule,
};
use tern_policy::{Endpoint, Incremental, PolicySet};

/// Options of the policy benchmark.
#[derive(Debug, Clone)]
pub struct PolicyBenchOptions {
    pub policies: u32,
    pub endpoints: u32,
    /// Give every policy a second ingress rule from a CIDR (`10.<i>.0.0/16`, TCP 443), so
    /// every selected endpoint has an allow-only fast-path set (shared by endpoints with the
    /// same policies).
    pub ipblocks: bool,
    /// Incremental changes timed per kind.
    pub samples: u32,
}

/// Results (durations) of one run.
#[derive(Debug, Clone)]
pub struct PolicyBenchReport {
    pub chains: usize,
    pub sets: usize,
    pub script_lines: usize,
    pub full_compile: Duration,
    pub full_apply: Duration,
    pub remote_join: Vec<Duration>,
    pub local_join: Vec<Duration>,
    pub policy_add: Vec<Duration>,
    /// The ways each kind of change reached the kernel.
    pub remote_path: String,
    pub local_path: String,
    pub policy_path: String,
}

/// A named network namespace (`ip netns add` done by the caller), deleted when dropped.
pub(crate) struct Netns(pub(crate) String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

pub(crate) fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning nft")?;
    c.stdin
        .take()
        .context("nft stdin")?
        .write_all(script.as_bytes())?;
    let out = c.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft -f in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn endpoint(i: u32, node: &str) -> Endpoint {
    Endpoint {
        namespace: format!("ns{}", i % 10),
        name: format!("pod{i}"),
        node: node.into(),
        interface: format!("tb{i:08}"),
        labels: BTreeMap::from([
            ("app".to_string(), format!("app{}", i % 100)),
            ("tier".to_string(), format!("t{}", i % 7)),
        ])
        .into(),
        ips: vec![IpAddr::from([
            198,
            18,
            (i / 250) as u8 + 64,
            (i % 250) as u8 + 1,
        ])],
        ports: vec![],
    }
}

pub(crate) fn policy(i: u32, ipblocks: bool) -> Resource {
    let mut ingress = vec![Rule {
        action: Action::Allow,
        icmp: None,
        not_icmp: None,
        protocol: Some(Protocol::Tcp),
        source: EntityRule {
            selector: Some(format!("tier == 't{}' && app != 'x{i}'", i % 7)),
            ..EntityRule::default()
        },
        destination: EntityRule {
            ports: vec![Port::Range(8000 + (i % 50) as u16, 8000 + (i % 50) as u16)],
            ..EntityRule::default()
        },
    }];
    if ipblocks {
        ingress.push(Rule {
            action: Action::Allow,
            icmp: None,
            not_icmp: None,
            protocol: Some(Protocol::Tcp),
            source: EntityRule {
                nets: vec![format!("10.{}.{}.0/24", i / 256 % 256, i % 256)],
                ..EntityRule::default()
            },
            destination: EntityRule {
                ports: vec![Port::Range(443, 443)],
                ..EntityRule::default()
            },
        });
    }
    let mut p = NetworkPolicy::new(
        format!("p{i}"),
        NetworkPolicySpec {
            order: Some(f64::from(i)),
            selector: format!("app == 'app{}'", i % 100),
            types: vec![PolicyType::Ingress],
            ingress,
            egress: vec![],
        },
    );
    p.metadata.namespace = Some(format!("ns{}", i % 10));
    Resource::NetworkPolicy(p)
}

/// One incremental change timed end to end the way ternd applies it
/// (`tern_agent::policy::apply_pending`: one netlink batch, `nft -f` if the kernel refuses it); runs on
/// a thread inside the bench's namespace. Returns the time and the path taken.
fn timed(
    inc: &mut Incremental,
    change: impl FnOnce(&mut Incremental),
) -> anyhow::Result<(Duration, Applied)> {
    let t = Instant::now();
    change(inc);
    let t1 = t.elapsed();
    let how = apply_pending(inc)?;
    if std::env::var_os("TERN_BENCH_SPLIT").is_some() {
        eprintln!("model {:?} kernel {:?} {how:?}", t1, t.elapsed() - t1);
    }
    Ok((t.elapsed(), how))
}

/// Which ways the samples of one kind took to the kernel (`netlink`, `nft -f`, ...).
fn paths(v: &[Applied]) -> String {
    let mut names: Vec<&str> = v
        .iter()
        .map(|a| match a {
            Applied::Nothing => "nothing to do",
            Applied::Netlink => "netlink",
            Applied::Full => "netlink full",
            Applied::Nft { full: false } => "nft -f delta",
            Applied::Nft { full: true } => "nft -f full",
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(" + ")
}

/// Runs the benchmark (root only).
pub fn run_policy(o: &PolicyBenchOptions) -> anyhow::Result<PolicyBenchReport> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("tern-bench policy needs root (it creates a private network namespace)");
    }
    let ns = Netns(format!("tern-polbench-{}", std::process::id()));
    let ok = Command::new("ip").args(["netns", "add", &ns.0]).status()?;
    if !ok.success() {
        bail!("ip netns add {} failed", ns.0);
    }
    let mut set = PolicySet::new();
    for i in 0..o.endpoints {
        set.upsert_endpoint(endpoint(i, "n1"));
        // As many remote endpoints, which only feed selector sets.
        set.upsert_endpoint(endpoint(o.endpoints + i, "n2"));
    }
    for i in 0..o.policies {
        set.apply(&policy(i, o.ipblocks))?;
    }
    let t = Instant::now();
    let mut inc = Incremental::new("n1", set);
    let full = inc.full_script();
    let full_compile = t.elapsed();
    let t = Instant::now();
    nft(&ns.0, &full.text)?;
    let full_apply = t.elapsed();
    inc.commit(&full);
    let d = inc.desired();
    let mut r = PolicyBenchReport {
        chains: d.chains.len(),
        sets: d.sets.len(),
        script_lines: full.text.lines().count(),
        full_compile,
        full_apply,
        remote_join: Vec::new(),
        local_join: Vec::new(),
        policy_add: Vec::new(),
        remote_path: String::new(),
        local_path: String::new(),
        policy_path: String::new(),
    };
    let base = 2 * o.endpoints;
    let samples = o.samples;
    let policies = o.policies;
    let ipblocks = o.ipblocks;
    // ternd applies changes from a thread in the node's namespace: so does the bench.
    let timings = tern_lab::netns::in_netns(&ns.0, move || -> anyhow::Result<_> {
        let mut t: [Vec<(Duration, Applied)>; 3] = Default::default();
        for k in 0..samples {
            let e = endpoint(base + k, "n2");
            t[0].push(timed(&mut inc, |i| i.upsert_endpoint(e))?);
            let e = endpoint(base + samples + k, "n1");
            t[1].push(timed(&mut inc, |i| i.upsert_endpoint(e))?);
            let p = policy(policies + k, ipblocks);
            let mut err = None;
            t[2].push(timed(&mut inc, |i| {
                err = i.apply(&p).err();
            })?);
            if let Some(e) = err {
                return Err(e.into());
            }
        }
        Ok(t)
    })??;
    let [remote, local, added] = timings;
    let split = |v: Vec<(Duration, Applied)>| -> (Vec<Duration>, String) {
        let how: Vec<Applied> = v.iter().map(|x| x.1).collect();
        (v.into_iter().map(|x| x.0).collect(), paths(&how))
    };
    (r.remote_join, r.remote_path) = split(remote);
    (r.local_join, r.local_path) = split(local);
    (r.policy_add, r.policy_path) = split(added);
    Ok(r)
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The report as a Markdown table; incremental rows say whether they meet the 10 ms target.
pub fn render(o: &PolicyBenchOptions, r: &PolicyBenchReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "policy: {} policies{} x {} local endpoints (+{} remote): {} chains, {} sets, {} script lines",
        o.policies,
        if o.ipblocks {
            " (each also allowing a CIDR: fast-path sets)"
        } else {
            ""
        },
        o.endpoints,
        o.endpoints,
        r.chains,
        r.sets,
        r.script_lines
    );
    let _ = writeln!(
        s,
        "full program: compile+render {:.1} ms, nft apply {:.1} ms, total {:.1} ms\n",
        r.full_compile.as_secs_f64() * 1e3,
        r.full_apply.as_secs_f64() * 1e3,
        (r.full_compile + r.full_apply).as_secs_f64() * 1e3
    );
    let _ = writeln!(
        s,
        "| incremental change (model + kernel, as ternd applies it) | applied by | p50 ms | p95 ms | target <= 10 ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    for (name, v, how) in [
        (
            "remote pod joins selected sets",
            &r.remote_join,
            &r.remote_path,
        ),
        (
            "local pod joins (chains, map, sets)",
            &r.local_join,
            &r.local_path,
        ),
        ("one policy added", &r.policy_add, &r.policy_path),
    ] {
        let p50 = pct(v, 0.5);
        let p95 = pct(v, 0.95);
        let _ = writeln!(
            s,
            "| {name} | {how} | {:.2} | {:.2} | {} |",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3,
            if p95 <= Duration::from_millis(10) {
                "ok"
            } else {
                "MISS"
            }
        );
    }
    s
}

// ---- per-packet cost (`tern-bench policy --per-packet`) ----

/// Dataplane configurations measured: no netfilter at all; conntrack only (the stateful
/// minimum of any node: natOutgoing and kube-proxy need it), the baseline of the target;
/// tern's ruleset; tern's ruleset with flow records on (every deciding rule logs to NFLOG,
/// and the agent's flow-record service reads and resolves the events in this process, as
/// ternd does); the same rules as a linear iptables chain. (Five modes: the round order's
/// carry-over balance is exact only for an even count, see [`round_order`].)
pub const PP_MODES: [&str; 5] = ["none", "conntrack", "tern", "tern+records", "iptables"];

/// The mode flow records are compared with (records off).
pub const PP_RECORDS_BASE: &str = "tern";
/// The NFLOG group of the records mode.
const PP_FLOW_GROUP: u16 = 2199;

/// The flow-record service of the records mode, reading NFLOG in the node namespace.
struct RecordsReader {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    flows: std::sync::Arc<tern_agent::flows::Flows>,
}

/// The policy model the records resolve against: the benchmark's own.
pub(crate) struct BenchModel(pub(crate) PolicySet);

impl tern_agent::flows::FlowModel for BenchModel {
    fn with_policy_set(&self, f: &mut dyn FnMut(&PolicySet)) {
        f(&self.0)
    }
    fn generation(&self) -> u64 {
        self.0.revision()
    }
    fn hosts(&self) -> tern_agent::flows::resolve::Hosts {
        tern_agent::flows::resolve::Hosts::default()
    }
}

impl RecordsReader {
    /// Binds the group inside `node` and starts the service's reader thread, on `cpu` when
    /// given (the agent's own CPU, not the one the measured traffic runs on).
    fn start(node: &str, set: PolicySet, cpu: Option<usize>) -> anyhow::Result<RecordsReader> {
        let ns =
            tern_linux::netns::NetNs::open(std::path::Path::new(&format!("/run/netns/{node}")))?;
        let cfg = tern_agent::config::FlowsConfig::new(PP_FLOW_GROUP);
        let sock = ns.open_inside(|| {
            tern_linux::nflog::NflogSocket::open(&tern_linux::nflog::NflogConfig::new(
                PP_FLOW_GROUP,
            ))
        })??;
        let flows = std::sync::Arc::new(tern_agent::flows::Flows::new("n1", cfg));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (f2, s2) = (flows.clone(), stop.clone());
        std::thread::Builder::new()
            .name("bench-flows".into())
            .spawn(move || {
                if let Err(e) = pin_thread(cpu) {
                    log::warn!("flow reader not pinned: {e}");
                }
                let model = BenchModel(set);
                let hosts = tern_agent::flows::resolve::Hosts::default();
                let mut sock = sock;
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(b) = sock.recv(Duration::from_millis(100)) {
                        f2.take(b, &model, &hosts);
                    }
                }
            })?;
        Ok(RecordsReader { stop, flows })
    }

    /// Stops the reader; (records kept, records dropped).
    fn stop(self) -> (usize, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(150));
        (self.flows.len(), self.flows.dropped())
    }
}

/// The mode every loss is measured against.
pub const PP_BASELINE: &str = "conntrack";

/// The target: tern's median paired loss against the baseline, in percent, on every figure.
pub const PP_TARGET_LOSS_PCT: f64 = 5.0;

/// The conntrack-only configuration.
const PP_CONNTRACK_ONLY: &str = "table inet ternbench-ct {\n  chain ctonly {\n    type filter hook forward priority 0; policy accept;\n    ct state established,related accept\n  }\n}\n";

/// Options of the per-packet benchmark.
#[derive(Debug, Clone)]
pub struct PerPacketOptions {
    /// Rounds; each round measures every mode once, in the order [`round_order`] gives.
    pub runs: u32,
    /// Rules in front of the one that admits the benchmark's traffic.
    pub rules: u32,
    /// Seconds of each measurement (iperf3, request/response, new connections).
    pub seconds: u32,
    /// CPUs the client and the server are pinned to (`None`: left to the scheduler).
    pub pin: Option<CpuPin>,
}

/// Where the client and the server run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPin {
    /// CPU of the client (iperf3 -c, the request/response and connection clients).
    pub client: usize,
    /// CPU of the server (iperf3 -s, the request/response and connection servers).
    pub server: usize,
}

/// The three figures of one measurement of one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Figure {
    /// iperf3 TCP throughput received, bits per second.
    Throughput,
    /// 64-byte request/response round trips per second over one TCP connection.
    Requests,
    /// New connections per second (connect, one 64-byte request/response, close).
    Connections,
}

impl Figure {
    /// All figures, in table order.
    pub const ALL: [Figure; 3] = [Figure::Throughput, Figure::Requests, Figure::Connections];

    /// This figure's value in `s`.
    pub fn of(self, s: &PerPacketSample) -> f64 {
        match self {
            Figure::Throughput => s.throughput_bps,
            Figure::Requests => s.requests_per_s,
            Figure::Connections => s.connections_per_s,
        }
    }

    /// Short name, as in the verdict column.
    pub fn name(self) -> &'static str {
        match self {
            Figure::Throughput => "iperf3",
            Figure::Requests => "req/resp",
            Figure::Connections => "new conn",
        }
    }
}

/// One measurement of one mode in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct PerPacketSample {
    /// Round number, from 0; samples of the same round are paired.
    pub round: u32,
    /// One of [`PP_MODES`].
    pub mode: String,
    /// iperf3 TCP throughput received, bits per second.
    pub throughput_bps: f64,
    /// Request/response round trips per second over one TCP connection.
    pub requests_per_s: f64,
    /// New connections per second, each with one request/response.
    pub connections_per_s: f64,
}

/// Results of [`run_per_packet`]: every sample, summarised by [`render_per_packet`].
#[derive(Debug, Clone)]
pub struct PerPacketReport {
    pub rules: u32,
    /// Seconds of each measurement.
    pub seconds: u32,
    /// Placement of client and server, if pinned.
    pub pin: Option<CpuPin>,
    /// `iptables -V` of the iptables used for the linear chain.
    pub iptables_version: String,
    /// One sample per round and mode (in [`PP_MODES`] order within a round).
    pub samples: Vec<PerPacketSample>,
}

/// Median, minimum and maximum of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The median of `v` (mean of the two middle values for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Median and range of `v`; `None` when empty.
pub fn spread(v: &[f64]) -> Option<Spread> {
    let median = median(v)?;
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Spread { median, min, max })
}

/// Loss of `v` against `base` in percent (positive = slower).
fn loss_pct(base: f64, v: f64) -> f64 {
    if base <= 0.0 {
        return 0.0;
    }
    (base - v) / base * 100.0
}

/// Per-round losses (percent) of `mode` against `base` on `figure`: one value per round that
/// measured both. Pairing within a round cancels slow drifts of a shared machine (a build
/// starting on another core slows both modes of that round alike).
pub fn paired_losses(
    samples: &[PerPacketSample],
    mode: &str,
    base: &str,
    figure: Figure,
) -> Vec<f64> {
    let mut out = Vec::new();
    for s in samples.iter().filter(|s| s.mode == mode) {
        if let Some(b) = samples
            .iter()
            .find(|b| b.mode == base && b.round == s.round)
            && figure.of(b) > 0.0
        {
            out.push(loss_pct(figure.of(b), figure.of(s)));
        }
    }
    out
}

/// Order of the `n` modes (indices) in round `round`: the rows of a Williams Latin square.
/// Over `n` consecutive rounds (n even) every mode runs once in every position and directly
/// follows every other mode exactly once, so no mode always inherits the state (caches,
/// conntrack entries, a warming CPU) left by one particular other mode. A plain rotation
/// would keep the cyclic order, and tern would always run right after conntrack.
pub fn round_order(round: u32, n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // First row 0, n-1, 1, n-2, 2, ... (its steps n-1, n-2, ..., 1 are all different mod n,
    // which is what balances the carry-over); row r adds r to every entry (mod n).
    let mut first = Vec::with_capacity(n);
    let (mut lo, mut hi) = (0usize, n);
    for i in 0..n {
        if i % 2 == 0 {
            first.push(lo);
            lo += 1;
        } else {
            hi -= 1;
            first.push(hi);
        }
    }
    let r = round as usize % n;
    first.into_iter().map(|m| (m + r) % n).collect()
}

/// Address plan of the bench (inside its private namespaces only; 198.18.0.0/15).
const PP_CLIENT: &str = "198.19.1.2";
const PP_SERVER: &str = "198.19.2.2";
const PP_RR_PORT: u16 = 7000;
const PP_CONN_PORT: u16 = 7001;
const PP_IPERF_PORT: u16 = 5201;
/// Pause after each ruleset change, before measuring.
const PP_SETTLE: Duration = Duration::from_millis(1000);

fn ns_run(ns: &str, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {} in {ns}", args.join(" ")))?;
    if let Some(text) = stdin {
        c.stdin
            .take()
            .context("stdin")?
            .write_all(text.as_bytes())?;
    }
    let out = c.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`{}` in {ns} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The i-th non-matching source network of the rule set (100.64.0.0/10, never the client).
fn pp_source(i: u32) -> String {
    format!("100.{}.{}.{}/32", 64 + i / 65536, (i / 256) % 256, i % 256)
}

/// The i-th rule's destination port (never one the benchmark uses).
fn pp_port(i: u32) -> u16 {
    10000 + (i % 1000) as u16
}

/// `rules` ingress rules for the server in tern's model: policies of 10 rules each selecting
/// the server, none matching the client, then one policy admitting the client.
fn pp_policy_set(rules: u32) -> anyhow::Result<PolicySet> {
    let mut set = PolicySet::new();
    let ep = |name: &str, ifname: &str, ip: &str, app: &str| Endpoint {
        namespace: "bench".into(),
        name: name.into(),
        node: "n1".into(),
        interface: ifname.into(),
        labels: BTreeMap::from([("app".to_string(), app.to_string())]).into(),
        ips: vec![ip.parse().expect("static address")],
        ports: vec![],
    };
    set.upsert_endpoint(ep("cli", "tbc", PP_CLIENT, "cli"));
    set.upsert_endpoint(ep("srv", "tbs", PP_SERVER, "srv"));
    let mk = |name: String, order: f64, rules: Vec<Rule>| {
        let mut p = NetworkPolicy::new(
            name,
            NetworkPolicySpec {
                order: Some(order),
                selector: "app == 'srv'".into(),
                types: vec![PolicyType::Ingress],
                ingress: rules,
                egress: vec![],
            },
        );
        p.metadata.namespace = Some("bench".into());
        Resource::NetworkPolicy(p)
    };
    let rule = |i: u32| Rule {
        action: Action::Allow,
        icmp: None,
        not_icmp: None,
        protocol: Some(Protocol::Tcp),
        source: EntityRule {
            nets: vec![pp_source(i)],
            ..EntityRule::default()
        },
        destination: EntityRule {
            ports: vec![Port::Range(pp_port(i), pp_port(i))],
            ..EntityRule::default()
        },
    };
    let per_policy = 10;
    let mut i = 0;
    while i < rules {
        let n = per_policy.min(rules - i);
        set.apply(&mk(
            format!("bulk{i}"),
            f64::from(i),
            (i..i + n).map(rule).collect(),
        ))?;
        i += n;
    }
    set.apply(&mk(
        "admit-client".into(),
        1e9,
        vec![Rule {
            action: Action::Allow,
            icmp: None,
            not_icmp: None,
            protocol: Some(Protocol::Tcp),
            source: EntityRule {
                nets: vec![format!("{PP_CLIENT}/32")],
                ..EntityRule::default()
            },
            destination: EntityRule::default(),
        }],
    ))?;
    Ok(set)
}

/// The same rules as one linear iptables chain on the server's way in (`iptables-restore`
/// input): every packet to the server walks the chain until its match, as in a
/// kube-proxy-era policy implementation without conntrack shortcuts.
fn pp_iptables(rules: u32) -> String {
    let mut s = String::from("*filter\n:TERNBENCH - [0:0]\n-A FORWARD -o tbs -j TERNBENCH\n");
    for i in 0..rules {
        let _ = writeln!(
            s,
            "-A TERNBENCH -s {} -p tcp -m tcp --dport {} -j ACCEPT",
            pp_source(i),
            pp_port(i)
        );
    }
    let _ = writeln!(s, "-A TERNBENCH -s {PP_CLIENT}/32 -p tcp -j ACCEPT");
    s.push_str("-A TERNBENCH -j DROP\nCOMMIT\n");
    s
}

/// Pins the calling thread to `cpu` (no-op for `None`): the same placement in every round,
/// instead of wherever the scheduler puts the thread this time.
fn pin_thread(cpu: Option<usize>) -> anyhow::Result<()> {
    let Some(cpu) = cpu else { return Ok(()) };
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; sched_setaffinity
    // with pid 0 changes the calling thread only.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        bail!(
            "cannot pin a bench thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Sets SO_LINGER {on, 0}: close() then sends a RST and frees the port at once, so a loop
/// of short connections never piles up TIME_WAIT sockets nor runs out of ephemeral ports.
fn linger_zero(s: &std::net::TcpStream) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` outlives the call and the length is its size; the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const l).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("SO_LINGER: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A TCP server in `server_ns` on `port`, serving each accepted connection with `serve` on
/// one thread pinned to `cpu`, one connection at a time, until [`PpServer::stop`].
pub(crate) struct PpServer {
    listener: std::sync::Arc<std::net::TcpListener>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl PpServer {
    fn start(
        server_ns: &str,
        port: u16,
        cpu: Option<usize>,
        serve: fn(std::net::TcpStream),
    ) -> anyhow::Result<Self> {
        let any = std::net::SocketAddr::from(([0, 0, 0, 0], port));
        Self::start_at(server_ns, any, cpu, serve)
    }

    /// [`PpServer::start`] listening on `addr` (e.g. an IPv6 one).
    pub(crate) fn start_at(
        server_ns: &str,
        addr: std::net::SocketAddr,
        cpu: Option<usize>,
        serve: fn(std::net::TcpStream),
    ) -> anyhow::Result<Self> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = Arc::new(
            tern_lab::netns::in_netns(server_ns, || std::net::TcpListener::bind(addr))?
                .with_context(|| format!("binding a bench server on {addr} in {server_ns}"))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (l, st) = (listener.clone(), stop.clone());
        let thread = std::thread::spawn(move || -> anyhow::Result<()> {
            pin_thread(cpu)?;
            loop {
                match l.accept() {
                    Ok((c, _)) => serve(c),
                    Err(_) if st.load(Ordering::SeqCst) => return Ok(()),
                    // A connection reset before accept (ECONNABORTED): take the next.
                    Err(_) => {}
                }
            }
        });
        Ok(PpServer {
            listener,
            stop,
            thread: Some(thread),
        })
    }

    /// Ends the accept loop and returns the thread's result.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        self.halt()
    }

    fn halt(&mut self) -> anyhow::Result<()> {
        use std::os::fd::AsRawFd;
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // shutdown() on a listening socket wakes a thread blocked in accept() (EINVAL); the
        // fd stays open (this Arc holds it) until the thread has returned.
        // SAFETY: the fd is open for as long as `self.listener` lives.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        t.join()
            .map_err(|_| anyhow::anyhow!("bench server thread panicked"))?
    }
}

impl Drop for PpServer {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Echoes 64-byte requests until the client closes.
pub(crate) fn pp_echo(mut c: std::net::TcpStream) {
    use std::io::Read;
    let _ = c.set_nodelay(true);
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    while c.read_exact(&mut buf).is_ok() {
        if c.write_all(&buf).is_err() {
            break;
        }
    }
}

/// Round trips of 64-byte requests over one TCP connection for `d`.
fn pp_request_rate(
    client_ns: &str,
    server_ns: &str,
    d: Duration,
    pin: Option<CpuPin>,
) -> anyhow::Result<f64> {
    use std::io::Read;
    let server = PpServer::start(server_ns, PP_RR_PORT, pin.map(|p| p.server), pp_echo)?;
    let target = format!("{PP_SERVER}:{PP_RR_PORT}");
    let rate = tern_lab::netns::in_netns(client_ns, move || -> anyhow::Result<f64> {
        pin_thread(pin.map(|p| p.client))?;
        let addr = target.parse().context("server address")?;
        let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .with_context(|| format!("connecting to {target}"))?;
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [7u8; 64];
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < d {
            c.write_all(&buf)?;
            c.read_exact(&mut buf)?;
            n += 1;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    })??;
    server.stop()?;
    Ok(rate)
}

/// Answers one 64-byte request, then waits for the client's close (its RST, with linger 0)
/// so the connection never lingers on this side either.
fn pp_answer_once(mut c: std::net::TcpStream) {
    use std::io::Read;
    let _ = c.set_nodelay(true);
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 64];
    if c.read_exact(&mut buf).is_ok() && c.write_all(&buf).is_ok() {
        let _ = c.read(&mut buf);
    }
}

/// New connections per second for `d`: connect, one 64-byte request/response, close (RST).
/// Every connection's SYN is a new flow, so it walks the policy rules; established packets
/// are accepted by conntrack before the rules.
fn pp_connection_rate(
    client_ns: &str,
    server_ns: &str,
    d: Duration,
    pin: Option<CpuPin>,
) -> anyhow::Result<f64> {
    use std::io::Read;
    let server = PpServer::start(
        server_ns,
        PP_CONN_PORT,
        pin.map(|p| p.server),
        pp_answer_once,
    )?;
    let target = format!("{PP_SERVER}:{PP_CONN_PORT}");
    let rate = tern_lab::netns::in_netns(client_ns, move || -> anyhow::Result<f64> {
        pin_thread(pin.map(|p| p.client))?;
        let addr = target.parse().context("server address")?;
        let mut buf = [7u8; 64];
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < d {
            let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .with_context(|| format!("connection {n} to {target}"))?;
            linger_zero(&c)?;
            c.set_nodelay(true)?;
            c.set_read_timeout(Some(Duration::from_secs(2)))?;
            c.write_all(&buf)?;
            c.read_exact(&mut buf)
                .with_context(|| format!("answer on connection {n} to {target}"))?;
            drop(c);
            n += 1;
        }
        Ok(n as f64 / start.elapsed().as_secs_f64())
    })??;
    server.stop()?;
    Ok(rate)
}

/// `taskset -c <cpu>` in front of a command when pinned.
fn pinned<'a>(cpu: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = Vec::new();
    if let Some(c) = cpu {
        v.extend(["taskset", "-c", c]);
    }
    v.extend_from_slice(args);
    v
}

/// iperf3 TCP throughput from the client to the server for `seconds`.
fn pp_iperf(
    client_ns: &str,
    server_ns: &str,
    seconds: u32,
    pin: Option<CpuPin>,
) -> anyhow::Result<f64> {
    let port = PP_IPERF_PORT.to_string();
    let (ccpu, scpu) = (
        pin.map(|p| p.client.to_string()),
        pin.map(|p| p.server.to_string()),
    );
    let mut server = Command::new("ip")
        .args(["netns", "exec", server_ns])
        .args(pinned(
            scpu.as_deref(),
            &["iperf3", "-s", "-1", "-p", &port],
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s")?;
    // `ip netns exec` execs taskset, which execs iperf3: this PID is the server's, ours to end.
    std::thread::sleep(Duration::from_millis(300));
    let secs = seconds.to_string();
    let out = ns_run(
        client_ns,
        &pinned(
            ccpu.as_deref(),
            &["iperf3", "-c", PP_SERVER, "-p", &port, "-t", &secs, "-J"],
        ),
        None,
    );
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_str(&out?).context("iperf3 -J output")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 output has no end.sum_received.bits_per_second")
}

/// Runs the per-packet benchmark (root only): client and server pods behind a router
/// namespace (the node), all private and uniquely named. Each round measures every mode of
/// [`PP_MODES`] (in the order of [`round_order`]) on three figures: iperf3 throughput,
/// request/response rate on one connection, new-connection rate.
pub fn run_per_packet(o: &PerPacketOptions) -> anyhow::Result<PerPacketReport> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("tern-bench policy --per-packet needs root (it creates private network namespaces)");
    }
    let tag = format!("tern-ppb-{}", std::process::id());
    let mut guards = Vec::new();
    for role in ["node", "cli", "srv"] {
        let name = format!("{tag}-{role}");
        let ok = Command::new("ip").args(["netns", "add", &name]).status()?;
        if !ok.success() {
            bail!("ip netns add {name} failed");
        }
        guards.push(Netns(name));
    }
    let (node, cli, srv) = (&guards[0].0, &guards[1].0, &guards[2].0);
    for (pod, host, net) in [(cli, "tbc", "198.19.1"), (srv, "tbs", "198.19.2")] {
        ns_run(
            node,
            &[
                "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", pod,
            ],
            None,
        )?;
        ns_run(
            node,
            &["ip", "addr", "add", &format!("{net}.1/24"), "dev", host],
            None,
        )?;
        ns_run(node, &["ip", "link", "set", host, "up"], None)?;
        ns_run(
            pod,
            &["ip", "addr", "add", &format!("{net}.2/24"), "dev", "eth0"],
            None,
        )?;
        ns_run(pod, &["ip", "link", "set", "eth0", "up"], None)?;
        ns_run(pod, &["ip", "link", "set", "lo", "up"], None)?;
        ns_run(
            pod,
            &["ip", "route", "add", "default", "via", &format!("{net}.1")],
            None,
        )?;
    }
    ns_run(node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"], None)?;
    let iptables_version = ns_run(node, &["iptables", "-V"], None)?.trim().to_string();
    let d = Duration::from_secs(u64::from(o.seconds));
    let tern_script = Incremental::new("n1", pp_policy_set(o.rules)?)
        .full_script()
        .text;
    let records_script = Incremental::with_flow_log(
        "n1",
        pp_policy_set(o.rules)?,
        Some(tern_policy::FlowLog {
            group: PP_FLOW_GROUP,
        }),
    )
    .full_script()
    .text;
    let iptables_script = pp_iptables(o.rules);
    let mut samples = Vec::new();
    // Round -> figure -> every mode: the samples paired for one figure are taken within
    // seconds of each other, and each block of modes has its own order (consecutive rows of
    // the Williams square), so drifts and carry-over hit every mode alike.
    let mut block = 0;
    for round in 0..o.runs.max(1) {
        let first = samples.len();
        samples.extend(PP_MODES.iter().map(|m| PerPacketSample {
            round,
            mode: m.to_string(),
            throughput_bps: 0.0,
            requests_per_s: 0.0,
            connections_per_s: 0.0,
        }));
        for figure in Figure::ALL {
            for m in round_order(block, PP_MODES.len()) {
                let mode = PP_MODES[m];
                ns_run(node, &["nft", "flush", "ruleset"], None)?;
                let mut reader = None;
                match mode {
                    "conntrack" => nft(node, PP_CONNTRACK_ONLY)?,
                    "tern" => nft(node, &tern_script)?,
                    "tern+records" => {
                        nft(node, &records_script)?;
                        // The reader on the other CPU than client and server, as an agent
                        // would run beside the pods it watches.
                        let other = o.pin.map(|p| usize::from(p.client == 0));
                        reader = Some(RecordsReader::start(node, pp_policy_set(o.rules)?, other)?);
                    }
                    "iptables" => {
                        ns_run(node, &["iptables-restore"], Some(&iptables_script))?;
                    }
                    _ => {}
                }
                // Replacing 10,000 rules leaves deferred work (freeing the old ruleset in a
                // kworker): let it finish before the measurement, not during it.
                std::thread::sleep(PP_SETTLE);
                let what = || format!("{} with {mode} rules, round {round}", figure.name());
                let s = &mut samples[first + m];
                match figure {
                    Figure::Throughput => {
                        s.throughput_bps =
                            pp_iperf(cli, srv, o.seconds, o.pin).with_context(what)?;
                    }
                    Figure::Requests => {
                        s.requests_per_s =
                            pp_request_rate(cli, srv, d, o.pin).with_context(what)?;
                    }
                    Figure::Connections => {
                        s.connections_per_s =
                            pp_connection_rate(cli, srv, d, o.pin).with_context(what)?;
                    }
                }
                if let Some(r) = reader {
                    let (kept, dropped) = r.stop();
                    log::info!("{}: {kept} flow records kept, {dropped} dropped", what());
                }
            }
            block += 1;
        }
        for s in &samples[first..] {
            log::info!("{s:?}");
        }
    }
    ns_run(node, &["nft", "flush", "ruleset"], None)?;
    Ok(PerPacketReport {
        rules: o.rules,
        seconds: o.seconds,
        pin: o.pin,
        iptables_version,
        samples,
    })
}

/// Values of `figure` for `mode`, in the order measured.
fn figure_values(r: &PerPacketReport, mode: &str, figure: Figure) -> Vec<f64> {
    r.samples
        .iter()
        .filter(|s| s.mode == mode)
        .map(|s| figure.of(s))
        .collect()
}

/// `median (min-max)` of `v` divided by `unit`, with `decimals` decimals.
fn fmt_spread(v: &[f64], unit: f64, decimals: usize) -> String {
    match spread(v) {
        Some(s) => format!(
            "{:.decimals$} ({:.decimals$}-{:.decimals$})",
            s.median / unit,
            s.min / unit,
            s.max / unit
        ),
        None => "-".into(),
    }
}

/// `median% [min..max]` of paired losses.
fn fmt_loss(v: &[f64]) -> String {
    match spread(v) {
        Some(s) => format!("{:.1}% [{:.1}..{:.1}]", s.median, s.min, s.max),
        None => "-".into(),
    }
}

/// The per-packet report as a Markdown table: per mode and figure the median (min-max) over
/// the rounds, and the median [min..max] of the per-round paired losses against conntrack.
/// tern's row says whether every figure meets the 5% target, then one row per round follows.
pub fn render_per_packet(r: &PerPacketReport) -> String {
    let mut s = String::new();
    let rounds = r
        .samples
        .iter()
        .map(|s| s.round)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let placement = match r.pin {
        Some(p) => format!("client on CPU {}, server on CPU {}", p.client, p.server),
        None => "not pinned".into(),
    };
    let _ = writeln!(
        s,
        "per-packet: {} rules in front of the admitting rule; {rounds} rounds x {} s per \
         figure; {placement}; iptables: {}",
        r.rules, r.seconds, r.iptables_version
    );
    let _ = writeln!(
        s,
        "values: median (min-max) over rounds; loss: median [min..max] of per-round paired \
         losses against {PP_BASELINE}\n"
    );
    let _ = writeln!(
        s,
        "| mode | iperf3 Gbit/s | loss | req/resp per s | loss | new conn per s | loss | target <= 5% |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for mode in PP_MODES {
        if !r.samples.iter().any(|x| x.mode == mode) {
            continue;
        }
        let mut cells = Vec::new();
        let mut missed = Vec::new();
        for (figure, unit, dec) in [
            (Figure::Throughput, 1e9, 2),
            (Figure::Requests, 1.0, 0),
            (Figure::Connections, 1.0, 0),
        ] {
            cells.push(fmt_spread(&figure_values(r, mode, figure), unit, dec));
            if mode == PP_BASELINE {
                cells.push("baseline".into());
                continue;
            }
            let losses = paired_losses(&r.samples, mode, PP_BASELINE, figure);
            if median(&losses).is_none_or(|l| l > PP_TARGET_LOSS_PCT) {
                missed.push(figure.name());
            }
            cells.push(fmt_loss(&losses));
        }
        let verdict = match mode {
            PP_BASELINE => "baseline".to_string(),
            "none" => "(no netfilter)".into(),
            "tern" if missed.is_empty() => "ok".into(),
            "tern" => format!("MISS ({})", missed.join(", ")),
            "tern+records" => "(records on)".into(),
            _ => "(comparison)".into(),
        };
        let _ = writeln!(s, "| {mode} | {} | {verdict} |", cells.join(" | "));
    }
    if r.samples.iter().any(|x| x.mode == "tern+records") {
        let loss = |f| {
            fmt_loss(&paired_losses(
                &r.samples,
                "tern+records",
                PP_RECORDS_BASE,
                f,
            ))
        };
        let conn = median(&paired_losses(
            &r.samples,
            "tern+records",
            PP_RECORDS_BASE,
            Figure::Connections,
        ));
        let _ = writeln!(
            s,
            "\nflow records on vs off (tern+records against tern, paired): iperf3 {}, \
             req/resp {}, new conn {}; target new conn <= {PP_TARGET_LOSS_PCT}%: {}",
            loss(Figure::Throughput),
            loss(Figure::Requests),
            loss(Figure::Connections),
            match conn {
                Some(l) if l <= PP_TARGET_LOSS_PCT => "ok",
                Some(_) => "MISS",
                None => "-",
            }
        );
    }
    let _ = writeln!(
        s,
        "\n| round | mode | iperf3 Gbit/s | req/resp per s | new conn per s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    for x in &r.samples {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.0} | {:.0} |",
            x.round,
            x.mode,
            x.throughput_bps / 1e9,
            x.requests_per_s,
            x.connections_per_s
        );
    }
    s
}

#[cfg(test)]
mod per_packet_tests {
    use super::*;

    #[test]
    fn rule_sets_have_the_requested_size() {
        let ipt = pp_iptables(25);
        assert_eq!(ipt.matches("--dport").count(), 25);
        assert!(ipt.contains(&format!("-s {PP_CLIENT}/32 -p tcp -j ACCEPT")));
        let set = pp_policy_set(25).unwrap();
        let inc = Incremental::new("n1", set);
        let text = inc.full_script().text;
        assert!(text.contains("100.64.0.24"), "{text}");
        assert!(text.contains(PP_CLIENT), "{text}");
        assert_ne!(pp_source(0), pp_source(256));
    }

    fn sample(round: u32, mode: &str, t: f64, r: f64, c: f64) -> PerPacketSample {
        PerPacketSample {
            round,
            mode: mode.into(),
            throughput_bps: t,
            requests_per_s: r,
            connections_per_s: c,
        }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        // An outlier moves the mean, not the median.
        assert_eq!(median(&[10.0, 10.0, 10.0, 10.0, 1000.0]), Some(10.0));
        let s = spread(&[7.0, 2.0, 5.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (5.0, 2.0, 7.0));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn paired_losses_cancel_drift_between_rounds() {
        // The machine halves in speed in round 1 and recovers in round 2; tern is 2% behind
        // conntrack in every round. Unpaired medians would mix rounds; paired ratios do not.
        let mut v = Vec::new();
        for (round, speed) in [(0, 1.0), (1, 0.5), (2, 0.9)] {
            v.push(sample(
                round,
                "conntrack",
                10e9 * speed,
                1000.0 * speed,
                500.0 * speed,
            ));
            v.push(sample(
                round,
                "tern",
                9.8e9 * speed,
                990.0 * speed,
                250.0 * speed,
            ));
        }
        // A round in which only tern ran is not paired.
        v.push(sample(3, "tern", 1.0, 1.0, 1.0));
        let l = paired_losses(&v, "tern", "conntrack", Figure::Throughput);
        assert_eq!(l.len(), 3);
        for x in &l {
            assert!((x - 2.0).abs() < 1e-9, "{l:?}");
        }
        let l = paired_losses(&v, "tern", "conntrack", Figure::Connections);
        assert!((median(&l).unwrap() - 50.0).abs() < 1e-9, "{l:?}");
        assert!(paired_losses(&v, "iptables", "conntrack", Figure::Requests).is_empty());
    }

    #[test]
    fn round_order_is_a_balanced_latin_square() {
        for n in [2usize, 4, 6] {
            let rows: Vec<Vec<usize>> = (0..n as u32).map(|r| round_order(r, n)).collect();
            let mut follows = std::collections::BTreeMap::new();
            for row in &rows {
                let mut sorted = row.clone();
                sorted.sort();
                assert_eq!(
                    sorted,
                    (0..n).collect::<Vec<_>>(),
                    "{row:?} is a permutation"
                );
                for w in row.windows(2) {
                    *follows.entry((w[0], w[1])).or_insert(0) += 1;
                }
            }
            for pos in 0..n {
                let mut col: Vec<usize> = rows.iter().map(|r| r[pos]).collect();
                col.sort();
                assert_eq!(col, (0..n).collect::<Vec<_>>(), "position {pos}: {rows:?}");
            }
            // Every ordered pair of different modes is adjacent exactly once.
            assert_eq!(follows.len(), n * (n - 1), "{rows:?}");
            assert!(follows.values().all(|&c| c == 1), "{rows:?}");
        }
        // The order repeats every n rounds.
        assert_eq!(round_order(5, 4), round_order(1, 4));
        assert!(round_order(0, 0).is_empty());
        // tern (2) does not always follow conntrack (1), unlike a plain rotation.
        let after_ct = (0..4)
            .filter(|&r| round_order(r, 4).windows(2).any(|w| w == [1, 2]))
            .count();
        assert_eq!(after_ct, 1);
    }

    #[test]
    fn loss_and_verdicts() {
        let mut v = Vec::new();
        for round in 0..3 {
            let k = 1.0 + f64::from(round) * 0.1;
            v.push(sample(round, "none", 11e9 * k, 1100.0 * k, 600.0 * k));
            v.push(sample(round, "conntrack", 10e9 * k, 1000.0 * k, 500.0 * k));
            v.push(sample(round, "tern", 9.8e9 * k, 990.0 * k, 490.0 * k));
            v.push(sample(round, "iptables", 5e9 * k, 500.0 * k, 100.0 * k));
        }
        let r = PerPacketReport {
            rules: 10,
            seconds: 3,
            pin: Some(CpuPin {
                client: 0,
                server: 1,
            }),
            iptables_version: "iptables v1.8.9 (nf_tables)".into(),
            samples: v,
        };
        let t = render_per_packet(&r);
        assert!(
            t.contains(
                "| tern | 10.78 (9.80-11.76) | 2.0% [2.0..2.0] | 1089 (990-1188) | \
                 1.0% [1.0..1.0] | 539 (490-588) | 2.0% [2.0..2.0] | ok |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| iptables | 5.50 (5.00-6.00) | 50.0% [50.0..50.0] |"),
            "{t}"
        );
        assert!(t.contains("| none | 12.10 (11.00-13.20) | -10.0%"), "{t}");
        assert!(t.contains("client on CPU 0, server on CPU 1"), "{t}");
        assert!(t.contains("3 rounds x 3 s"), "{t}");
        assert!(t.contains("| 2 | tern | 11.76 | 1188 | 588 |"), "{t}");
        // A miss on one figure names it.
        let mut r2 = r.clone();
        for x in r2.samples.iter_mut().filter(|x| x.mode == "tern") {
            x.connections_per_s *= 0.5;
        }
        let t2 = render_per_packet(&r2);
        assert!(t2.contains("| MISS (new conn) |"), "{t2}");
        let mut r3 = r.clone();
        r3.samples[6].throughput_bps = 9e9; // round 1 tern: 18% loss in one round of three
        assert!(
            render_per_packet(&r3).contains("| ok |"),
            "one slow round is outvoted"
        );
    }
}
