//! Pod start-up under kubelet (issue 12's benchmark): the time from `kubectl create` of a pod
//! to the API showing it Running with its address, for pods created one after another, and
//! the wall time of a burst of pods created at once until the last is Running with its
//! address. The same procedure runs with tern and with the reference `bridge` + `host-local`
//! network, chained alike (`bandwidth`, `portmap`), on one node of one cluster: [`use_network`]
//! switches that node's containerd between them (the reference conflist sorts before tern's,
//! and containerd loads only the first), so both are measured under the same kubelet,
//! containerd, control plane and image cache, in alternating phases that share the machine's
//! load drift. (A cluster of its own with only the reference network is
//! `KubeOptions::reference_cni`.)
//!
//! Times are taken from one `kubectl get pods --watch` stream read on a thread, so polling
//! adds neither load nor granularity; `kubectl create` itself is inside the measured time for
//! both networks alike.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{KubeState, kubectl};
use crate::{LabError, Result, process};

/// The networks the benchmark compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// tern's conflist (written by the DaemonSet or the lab): tern, bandwidth, portmap.
    Tern,
    /// [`REFERENCE_CONFLIST`]: bridge with host-local on [`REFERENCE_SUBNET`], bandwidth,
    /// portmap.
    Reference,
}

impl Network {
    /// The name in the benchmark's tables.
    pub fn label(self) -> &'static str {
        match self {
            Network::Tern => "tern",
            Network::Reference => "bridge+host-local",
        }
    }
}

/// The reference network's name in its conflist (and in containerd's `crictl info`).
pub const REFERENCE_NETWORK: &str = "tern-bench-reference";
/// The reference conflist's file: sorts before tern's `10-tern.conflist`.
pub const REFERENCE_CONFLIST: &str = "05-tern-bench-reference.conflist";
/// The reference network's host-local range: outside tern's pool, so a bridge address never
/// equals a tern pod's; room for every pod of a phase.
pub const REFERENCE_SUBNET: &str = "10.250.0.0/23";

/// Points node `node`'s containerd at `net` and waits until its CRI reports that network
/// (`crictl info` names the loaded conflist). Pods of the previous network must be gone.
pub fn use_network(k: &KubeState, node: &str, net: Network) -> Result<()> {
    let kn = k.node(node)?;
    let conf = kn.dir.join("cni/net.d").join(REFERENCE_CONFLIST);
    match net {
        Network::Reference => super::node::install_reference_conflist(
            &kn.dir,
            REFERENCE_NETWORK,
            REFERENCE_SUBNET,
            REFERENCE_CONFLIST,
        )?,
        Network::Tern => match std::fs::remove_file(&conf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LabError::io(format!("cannot remove {}", conf.display()), e)),
        },
    }
    let crictl = k.k8s_bin.join("crictl");
    let endpoint = format!("unix://{}", kn.containerd_socket.display());
    super::wait_for(
        &format!("containerd of {node} to load the {} network", net.label()),
        Duration::from_secs(30),
        None,
        || {
            let mut c = std::process::Command::new(&crictl);
            c.args(["--runtime-endpoint", &endpoint, "info"]);
            let info = process::run(&mut c).ok()?;
            (info.contains(REFERENCE_NETWORK) == (net == Network::Reference)).then_some(())
        },
    )
}

/// What [`pod_startup`] measured.
#[derive(Debug, Clone, Default)]
pub struct StartupFigures {
    /// Create-to-Running-with-address of each sequential pod, in creation order.
    pub sequential: Vec<Duration>,
    /// Pods in the burst.
    pub burst_pods: usize,
    /// From creating the burst until its last pod was Running with its address.
    pub burst: Duration,
    /// containerd's `RunPodSandbox` of each burst pod (from its log): the part of a pod's
    /// start that includes the CNI ADD of the whole chain, so the network's share.
    pub burst_sandboxes: Vec<Duration>,
    /// ternd's mean time to serve a CNI ADD during the burst (from its
    /// `tern_cni_request_duration_seconds` on the node's 127.0.0.1:9099); `None` for the
    /// reference network or when ternd's metrics cannot be read.
    pub burst_ternd_add: Option<Duration>,
}

/// The `q`-quantile (0..=1) of `v` (nearest rank).
pub fn quantile(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl StartupFigures {
    /// One line: p50, p99, max of the sequential pods, the burst, and the burst's
    /// `RunPodSandbox` p50/p99.
    pub fn summary(&self) -> String {
        format!(
            "sequential {} pods: p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms; burst of {}: {:.2} s \
             (RunPodSandbox of {}: p50 {:.0} ms  p99 {:.0} ms)",
            self.sequential.len(),
            ms(quantile(&self.sequential, 0.5)),
            ms(quantile(&self.sequential, 0.99)),
            ms(self.sequential.iter().max().copied().unwrap_or_default()),
            self.burst_pods,
            self.burst.as_secs_f64(),
            self.burst_sandboxes.len(),
            ms(quantile(&self.burst_sandboxes, 0.5)),
            ms(quantile(&self.burst_sandboxes, 0.99)),
        ) + &self
            .burst_ternd_add
            .map(|d| format!("; ternd ADD mean {:.1} ms", ms(d)))
            .unwrap_or_default()
    }
}

/// Seconds since midnight of a containerd log line's `time="...T12:34:56.123456789Z"`.
fn log_time(line: &str) -> Option<f64> {
    let t = line.strip_prefix("time=\"")?;
    let (_, clock) = t.split_once('T')?;
    let clock = clock.split(['Z', '+', '"']).next()?;
    let mut f = clock.splitn(3, ':');
    let (h, m, s) = (f.next()?, f.next()?, f.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// The pod name in what follows `RunPodSandbox for ` in a containerd log line: containerd
/// 2.x prints `name:\"<pod>\"  uid:...`, 1.x `&PodSandboxMetadata{Name:<pod>,...}`.
fn sandbox_pod(rest: &str) -> Option<&str> {
    if let Some(r) = rest.strip_prefix("name:\\\"") {
        return r.split("\\\"").next();
    }
    rest.strip_prefix("&PodSandboxMetadata{Name:")?
        .split(',')
        .next()
}

/// The duration of containerd's `RunPodSandbox` for every pod whose name starts with
/// `prefix`, from its log (`RunPodSandbox for <pod>` and the same line with `returns
/// sandbox id`). Pods whose start or end is missing are left out.
pub fn sandbox_durations(log: &str, prefix: &str) -> Vec<Duration> {
    let mut started: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    let mut out = Vec::new();
    for line in log.lines() {
        let Some((_, rest)) = line.split_once("RunPodSandbox for ") else {
            continue;
        };
        let Some(name) = sandbox_pod(rest).filter(|n| n.starts_with(prefix)) else {
            continue;
        };
        let Some(t) = log_time(line) else { continue };
        if rest.contains("returns sandbox id") {
            if let Some(t0) = started.remove(name) {
                // Across midnight the clock wraps.
                let d = if t >= t0 { t - t0 } else { t + 86400.0 - t0 };
                out.push(Duration::from_secs_f64(d));
            }
        } else if !rest.contains("failed") {
            started.insert(name.to_string(), t);
        }
    }
    out
}

/// ternd's `tern_cni_request_duration_seconds` sum and count for ADD, read from its metrics
/// listener in the node's namespace (both ways of running ternd listen on 127.0.0.1:9099).
fn ternd_add_totals(netns: &str) -> Option<(f64, u64)> {
    let mut c = process::netns_exec(netns, std::path::Path::new("curl"));
    c.args(["-sf", "--max-time", "5", "http://127.0.0.1:9099/metrics"]);
    let text = process::run(&mut c).ok()?;
    parse_add_totals(&text)
}

/// The ADD sum (seconds) and count of ternd's request histogram in a metrics text.
fn parse_add_totals(text: &str) -> Option<(f64, u64)> {
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    let sum = value("tern_cni_request_duration_seconds_sum{op=\"add\"}")?;
    let count = value("tern_cni_request_duration_seconds_count{op=\"add\"}")?;
    Some((sum, count as u64))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pod_yaml(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{tern-bench: startup}}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: c\n    image: tern-busybox:1\n    imagePullPolicy: Never\n    command: [\"sleep\", \"86400\"]\n"
    )
}

/// A pod event: when it was read, name, phase, address.
type Event = (Instant, String, String, String);

struct Watch {
    child: Child,
    rx: mpsc::Receiver<Event>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn watch(k: &KubeState) -> Result<Watch> {
    let mut c = process::netns_exec(&k.cp_netns, &k.kubectl_bin());
    c.arg("--kubeconfig")
        .arg(k.admin_kubeconfig())
        .arg("--cache-dir")
        .arg(k.dir.join("kubectl-cache"))
        .args(["get", "pods", "-l", "tern-bench=startup", "--watch", "-o"])
        .arg(r#"jsonpath={.metadata.name} {.status.phase} {.status.podIP}{"\n"}"#)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().map_err(|e| LabError::Spawn {
        command: process::describe(&c),
        source: e,
    })?;
    let out = child.stdout.take().expect("stdout piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let f: Vec<&str> = line.split_whitespace().collect();
            let ev = (
                Instant::now(),
                f.first().unwrap_or(&"").to_string(),
                f.get(1).unwrap_or(&"").to_string(),
                f.get(2).unwrap_or(&"").to_string(),
            );
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    Ok(Watch { child, rx })
}

fn create(k: &KubeState, yaml: &str) -> Result<()> {
    let file = k.dir.join(format!("bench-{}.yaml", process::random_hex(4)));
    std::fs::write(&file, yaml)
        .map_err(|e| LabError::io(format!("cannot write {}", file.display()), e))?;
    let r = kubectl(k, &["create", "-f", &file.display().to_string()]);
    let _ = std::fs::remove_file(&file);
    r.map(drop)
}

/// Waits on the watch until every pod in `names` was seen Running with an address; returns
/// when the last one was.
fn wait_running(w: &Watch, names: &[String], timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    let mut pending: std::collections::BTreeSet<&str> = names.iter().map(|s| s.as_str()).collect();
    let mut last = Instant::now();
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match w.rx.recv_timeout(left) {
            Ok((t, name, phase, ip)) => {
                if phase == "Running" && !ip.is_empty() && pending.remove(name.as_str()) {
                    last = t;
                }
            }
            Err(_) => {
                return Err(LabError::Timeout(format!(
                    "{} pod(s) not Running with an address within {timeout:?}: {:?}",
                    pending.len(),
                    pending.iter().take(5).collect::<Vec<_>>()
                )));
            }
        }
    }
    Ok(last)
}

/// Deletes the benchmark's pods and waits until they are gone.
pub fn cleanup(k: &KubeState) -> Result<()> {
    kubectl(
        k,
        &[
            "delete",
            "pods",
            "-l",
            "tern-bench=startup",
            "--wait=true",
            "--timeout=300s",
        ],
    )
    .map(drop)
}

/// Runs the benchmark on node `node`: `sequential` pods one after another, then a burst of
/// `burst` pods. Removes its pods afterwards.
pub fn pod_startup(
    k: &KubeState,
    node: &str,
    sequential: usize,
    burst: usize,
) -> Result<StartupFigures> {
    let w = watch(k)?;
    // The watch lists existing pods first; give it a moment to be established.
    std::thread::sleep(Duration::from_millis(500));
    let mut fig = StartupFigures {
        burst_pods: burst,
        ..StartupFigures::default()
    };
    for i in 0..sequential {
        let name = format!("seq-{i}");
        let t0 = Instant::now();
        create(k, &pod_yaml(&name, node))?;
        let t1 = wait_running(&w, std::slice::from_ref(&name), Duration::from_secs(60))?;
        fig.sequential.push(t1.duration_since(t0));
    }
    let names: Vec<String> = (0..burst).map(|i| format!("burst-{i}")).collect();
    let yaml: Vec<String> = names.iter().map(|n| pod_yaml(n, node)).collect();
    let netns = k.node(node)?.netns.clone();
    // ternd's ADDs of this burst (none when the reference network serves it).
    let before = ternd_add_totals(&netns);
    let ctrd_log = k.node(node)?.proc("containerd").map(|p| p.log.clone());
    let log_start = ctrd_log
        .as_ref()
        .and_then(|l| std::fs::metadata(l).ok())
        .map_or(0, |m| m.len());
    let t0 = Instant::now();
    create(k, &yaml.join("---\n"))?;
    let t1 = wait_running(&w, &names, Duration::from_secs(600))?;
    fig.burst = t1.duration_since(t0);
    drop(w);
    if let Some(l) = &ctrd_log {
        // Only this burst's part of the log: earlier phases had pods of the same names.
        let log = std::fs::read(l).unwrap_or_default();
        let from = usize::try_from(log_start)
            .unwrap_or(usize::MAX)
            .min(log.len());
        fig.burst_sandboxes = sandbox_durations(&String::from_utf8_lossy(&log[from..]), "burst-");
    }
    if let (Some((s0, n0)), Some((s1, n1))) = (before, ternd_add_totals(&netns))
        && n1 > n0
    {
        fig.burst_ternd_add = Some(Duration::from_secs_f64((s1 - s0) / (n1 - n0) as f64));
    }
    cleanup(k)?;
    Ok(fig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&v[..30], 0.99), Duration::from_millis(30));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn add_totals_come_from_the_request_histogram() {
        let text = "tern_cni_request_duration_seconds_bucket{op=\"add\",le=\"+Inf\"} 4\n\
                    tern_cni_request_duration_seconds_sum{op=\"add\"} 0.5\n\
                    tern_cni_request_duration_seconds_count{op=\"add\"} 4\n\
                    tern_cni_request_duration_seconds_sum{op=\"del\"} 9\n";
        assert_eq!(parse_add_totals(text), Some((0.5, 4)));
        assert_eq!(parse_add_totals("nothing\n"), None);
    }

    #[test]
    fn sandbox_durations_pair_containerd_log_lines() {
        let log = r#"time="2026-12-01T11:30:00.250000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-1,Uid:u1,Namespace:default,Attempt:0,}"
time="2026-12-01T11:30:00.300000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:seq-0,Uid:u0,Namespace:default,Attempt:0,}"
time="2026-12-01T11:30:01.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-1,Uid:u1,Namespace:default,Attempt:0,} returns sandbox id \"abc\""
time="2026-12-01T23:59:59.900000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-2,Uid:u2,Namespace:default,Attempt:0,}"
time="2026-12-02T00:00:00.100000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-2,Uid:u2,Namespace:default,Attempt:0,} returns sandbox id \"def\""
time="2026-12-02T00:00:01.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-3,Uid:u3,Namespace:default,Attempt:0,} returns sandbox id \"ghi\"
time="2026-12-02T00:00:02.000000000Z" level=info msg="RunPodSandbox for name:\"burst-4\"  uid:\"u4\"  namespace:\"default\""
time="2026-12-02T00:00:02.158000000Z" level=info msg="RunPodSandbox for name:\"burst-4\"  uid:\"u4\"  namespace:\"default\" returns sandbox id \"c56d\""
"#;
        let d: Vec<f64> = sandbox_durations(log, "burst-")
            .iter()
            .map(|d| (d.as_secs_f64() * 1e3).round())
            .collect();
        assert_eq!(d, [750.0, 200.0, 158.0]);
    }
}
