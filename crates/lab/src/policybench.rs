//! `tern-bench policy`: how fast policy reaches the kernel at scale. Programs 1,000 policies
//! over 1,000 local endpoints (plus remote endpoints feeding selector sets) into the `inet tern`
//! table of a private network namespace (`ip netns`, uniquely named, deleted even on failure),
//! then times incremental changes end to end (model update + script + `nft -f`):
//! a remote pod joining selected sets, a local pod joining (its chains, map entries, set
//! elements), and one policy added. Target: an incremental change <= 10 ms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
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
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
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
        ]),
        ips: vec![IpAddr::from([
            198,
            18,
            (i / 250) as u8 + 64,
            (i % 250) as u8 + 1,
        ])],
        ports: vec![],
    }
}

fn policy(i: u32) -> Resource {
    let mut p = NetworkPolicy::new(
        format!("p{i}"),
        NetworkPolicySpec {
            order: Some(f64::from(i)),
            selector: format!("app == 'app{}'", i % 100),
            types: vec![PolicyType::Ingress],
            ingress: vec![Rule {
                action: Action::Allow,
                protocol: Some(Protocol::Tcp),
                source: EntityRule {
                    selector: Some(format!("tier == 't{}' && app != 'x{i}'", i % 7)),
                    ..EntityRule::default()
                },
                destination: EntityRule {
                    ports: vec![Port::Range(8000 + (i % 50) as u16, 8000 + (i % 50) as u16)],
                    ..EntityRule::default()
                },
            }],
            egress: vec![],
        },
    );
    p.metadata.namespace = Some(format!("ns{}", i % 10));
    Resource::NetworkPolicy(p)
}

fn timed(
    ns: &str,
    inc: &mut Incremental,
    change: impl FnOnce(&mut Incremental),
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    change(inc);
    let s = inc.script();
    if !s.text.is_empty() {
        nft(ns, &s.text)?;
    }
    inc.commit(&s);
    Ok(t.elapsed())
}

/// Runs the benchmark (root only).
pub fn run_policy(o: &PolicyBenchOptions) -> anyhow::Result<PolicyBenchReport> {
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
        set.apply(&policy(i))?;
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
    };
    let base = 2 * o.endpoints;
    for k in 0..o.samples {
        let e = endpoint(base + k, "n2");
        r.remote_join
            .push(timed(&ns.0, &mut inc, |i| i.upsert_endpoint(e))?);
        let e = endpoint(base + o.samples + k, "n1");
        r.local_join
            .push(timed(&ns.0, &mut inc, |i| i.upsert_endpoint(e))?);
        let p = policy(o.policies + k);
        let mut err = None;
        r.policy_add.push(timed(&ns.0, &mut inc, |i| {
            err = i.apply(&p).err();
        })?);
        if let Some(e) = err {
            return Err(e.into());
        }
    }
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
        "policy: {} policies x {} local endpoints (+{} remote): {} chains, {} sets, {} script lines",
        o.policies, o.endpoints, o.endpoints, r.chains, r.sets, r.script_lines
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
        "| incremental change (model+script+nft) | p50 ms | p95 ms | target <= 10 ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    for (name, v) in [
        ("remote pod joins selected sets", &r.remote_join),
        ("local pod joins (chains, map, sets)", &r.local_join),
        ("one policy added", &r.policy_add),
    ] {
        let p50 = pct(v, 0.5);
        let p95 = pct(v, 0.95);
        let _ = writeln!(
            s,
            "| {name} | {:.2} | {:.2} | {} |",
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
