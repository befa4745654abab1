//! Cross-node policy propagation (`tern-bench policy-propagation`): how long after a
//! NetworkPolicy is written to the store every node enforces it, and how long after it is
//! deleted every node lets traffic through again.
//!
//! A 3-node VXLAN lab (etcd or SQLite) gets one server pod (`app=srv`, TCP echo on port 80) and
//! one client pod per node. Node `i`'s server is probed from the client on node `i+1`, so every
//! probe crosses nodes and the policy is enforced on the server's node. Per trial:
//!
//! 1. Threads per node, inside its client pod, open NEW TCP connections to the server with a
//!    short connect timeout (50 ms), recording when each attempt started. There are several
//!    probers per node ([`PropagationOptions::probers`]), staggered so that together they start
//!    an attempt every `timeout / probers` (2 ms), whether attempts complete at once or wait out
//!    their timeout. A connection is "open" when the handshake completes: the SYN passed the
//!    policy and the server answered.
//! 2. The main thread puts a NetworkPolicy denying all ingress to `app=srv` (what `ternctl apply`
//!    writes) and notes the instant the put returned (`t0`).
//! 3. A node's deny time is the start of the first failed attempt of [`Detector::confirm`]
//!    failures in a row, minus `t0`. Then the policy is deleted and the allow time is the start
//!    of the first successful attempt, minus the delete's return.
//!
//! The change took effect somewhere between the last attempt that still saw the old state and
//! the first that saw the new one, so every figure is an upper bound that overstates by at most
//! that gap, reported as the resolution (about the attempt spacing; a dropped attempt costs its
//! whole timeout, which is why one prober alone would only resolve the allow direction to the
//! timeout). A figure is clamped to 0 when the node acted before the put had returned (the
//! agents' watch can see the write before the writer sees the reply).

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use tern_model::Resource;

use crate::netbench::quantile;
use tern_lab::cluster::with_store;
use tern_lab::netns::in_netns;
use tern_lab::netpol::{self, L4};
use tern_lab::state::{Encap, LabState, StoreKind};
use tern_lab::topology::{self, UpOptions};
use tern_lab::{LabError, Result};

/// Name of the lab the benchmark builds (`tl-bpp-*` namespaces).
pub const LAB_NAME: &str = "bpp";
/// Kubernetes namespace of the benchmark's pods and policy.
pub const K8S_NAMESPACE: &str = "pp";
/// Port of the servers' TCP echo.
pub const SERVER_PORT: u16 = 80;
/// The bound tern holds itself to: every node enforces a change within this time.
pub const PROPAGATION_TARGET: Duration = Duration::from_secs(1);

/// The policy of a trial: deny all ingress to `app=srv`.
pub const DENY_POLICY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: deny-srv
  namespace: pp
spec:
  podSelector:
    matchLabels:
      app: srv
  policyTypes: [Ingress]
";

/// Options of `tern-bench policy-propagation`.
#[derive(Debug, Clone)]
pub struct PropagationOptions {
    /// Directory with `tern`, `tern-ipam`, `ternd`.
    pub bin_dir: PathBuf,
    /// Apply/delete rounds; each gives one sample per node and direction.
    pub trials: usize,
    /// Datastore of the lab.
    pub store: StoreKind,
    /// Nodes of the lab (one server and one client pod each; at least 2).
    pub nodes: usize,
    /// Connect timeout of one probe attempt.
    pub probe_timeout: Duration,
    /// Staggered probing threads per node, each starting an attempt once per
    /// `probe_timeout`: together one attempt every `probe_timeout / probers`.
    pub probers: usize,
    /// Failed attempts in a row that confirm a deny (a lone failure could be the machine
    /// stalling, not the policy).
    pub confirm: usize,
    /// How long a node may take before its change counts as missed.
    pub deadline: Duration,
}

impl PropagationOptions {
    /// Three nodes on etcd, `trials` trials, 25 probers per node with 50 ms connect timeouts (an
    /// attempt every 2 ms),
    /// deny confirmed by 3 failures, 10 s deadline.
    pub fn new(bin_dir: PathBuf, trials: usize) -> PropagationOptions {
        PropagationOptions {
            bin_dir,
            trials,
            store: StoreKind::Etcd,
            nodes: 3,
            probe_timeout: Duration::from_millis(50),
            probers: 25,
            confirm: 3,
            deadline: Duration::from_secs(10),
        }
    }
}

/// When a change showed up in one node's probes: the start of the last attempt that still saw
/// the old state (none if the first attempt already saw the new one) and of the first attempt
/// that saw the new state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start of the last attempt with the old outcome.
    pub last_old: Option<Instant>,
    /// Start of the first attempt with the new outcome (of a confirmed run).
    pub first_new: Instant,
}

impl Window {
    /// The sample of this window for a change whose write returned at `t0`.
    pub fn sample(&self, trial: usize, node: &str, t0: Instant) -> Sample {
        let floor = self.last_old.map_or(t0, |l| l.max(t0));
        Sample {
            trial,
            node: node.to_string(),
            latency: self.first_new.saturating_duration_since(t0),
            resolution: self.first_new.saturating_duration_since(floor),
        }
    }
}

/// Finds the switch from the old outcome to the wanted one in a stream of probe attempts.
#[derive(Debug, Clone)]
pub struct Detector {
    want_open: bool,
    /// Attempts in a row with the wanted outcome needed to accept the switch.
    pub confirm: usize,
    last_old: Option<Instant>,
    candidate: Option<Instant>,
    run: usize,
}

impl Detector {
    /// Looks for connections becoming possible (`want_open`) or impossible, accepted after
    /// `confirm` attempts in a row (at least 1).
    pub fn new(want_open: bool, confirm: usize) -> Detector {
        Detector {
            want_open,
            confirm: confirm.max(1),
            last_old: None,
            candidate: None,
            run: 0,
        }
    }

    /// Feeds one attempt that started at `start`; returns the window once the switch is
    /// confirmed. An old outcome in the middle of a run starts the run over.
    pub fn observe(&mut self, start: Instant, open: bool) -> Option<Window> {
        if open != self.want_open {
            self.last_old = Some(start);
            self.candidate = None;
            self.run = 0;
            return None;
        }
        let first_new = *self.candidate.get_or_insert(start);
        self.run += 1;
        (self.run >= self.confirm).then_some(Window {
            last_old: self.last_old,
            first_new,
        })
    }
}

/// One node's time to apply one change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Trial number (0-based).
    pub trial: usize,
    /// Node whose server was probed (where the policy is enforced).
    pub node: String,
    /// From the write's return to the first attempt that saw the change.
    pub latency: Duration,
    /// How much `latency` may overstate: the gap since the last attempt that saw the old state
    /// (or since the write returned, if later).
    pub resolution: Duration,
}

/// Result of `tern-bench policy-propagation`.
#[derive(Debug, Clone)]
pub struct PropagationReport {
    /// Datastore of the lab.
    pub store: StoreKind,
    /// Encapsulation between the nodes.
    pub encap: Encap,
    /// Nodes probed.
    pub nodes: Vec<String>,
    /// Trials run.
    pub trials: usize,
    /// Connect timeout of one attempt.
    pub probe_timeout: Duration,
    /// Staggered probers per node.
    pub probers: usize,
    /// Failures in a row that confirmed a deny.
    pub confirm: usize,
    /// Samples of "deny takes effect".
    pub deny: Vec<Sample>,
    /// Samples of "allow restored".
    pub allow: Vec<Sample>,
    /// Changes some node did not show within the deadline, described.
    pub missed: Vec<String>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl PropagationReport {
    /// The largest latency of either direction: every node enforced every change within it.
    pub fn bound(&self) -> Duration {
        self.deny
            .iter()
            .chain(&self.allow)
            .map(|s| s.latency)
            .max()
            .unwrap_or_default()
    }

    /// Whether every change reached every node within [`PROPAGATION_TARGET`].
    pub fn pass(&self) -> bool {
        self.missed.is_empty()
            && !self.deny.is_empty()
            && !self.allow.is_empty()
            && self.bound() <= PROPAGATION_TARGET
    }
}

fn direction_line(f: &mut fmt::Formatter<'_>, name: &str, s: &[Sample]) -> fmt::Result {
    let lat: Vec<Duration> = s.iter().map(|s| s.latency).collect();
    let res: Vec<Duration> = s.iter().map(|s| s.resolution).collect();
    writeln!(
        f,
        "{name:<18} {:>4} {:>8.1} {:>8.1} {:>8.1}   {:>6.1} / {:.1}",
        s.len(),
        ms(quantile(&lat, 0.5)),
        ms(quantile(&lat, 0.95)),
        ms(quantile(&lat, 1.0)),
        ms(quantile(&res, 0.5)),
        ms(quantile(&res, 1.0)),
    )
}

impl fmt::Display for PropagationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "policy propagation: {} nodes ({}), store {}, {} trials; probe = new TCP connection \
             from a pod on the next node every {:.1} ms ({} staggered probers, connect timeout \
             {} ms each); deny confirmed by {} failures in a row",
            self.nodes.len(),
            self.encap.as_str(),
            self.store.as_str(),
            self.trials,
            ms(self.probe_timeout / self.probers.max(1) as u32),
            self.probers,
            self.probe_timeout.as_millis(),
            self.confirm
        )?;
        writeln!(
            f,
            "{:<18} {:>4} {:>8} {:>8} {:>8}   resolution p50 / max ms",
            "direction", "n", "p50 ms", "p95 ms", "max ms"
        )?;
        direction_line(f, "deny takes effect", &self.deny)?;
        direction_line(f, "allow restored", &self.allow)?;
        for node in &self.nodes {
            let of = |v: &[Sample]| -> Vec<Duration> {
                v.iter()
                    .filter(|s| s.node == *node)
                    .map(|s| s.latency)
                    .collect()
            };
            let (d, a) = (of(&self.deny), of(&self.allow));
            writeln!(
                f,
                "  {node}: deny p50 {:.1} max {:.1} ms, allow p50 {:.1} max {:.1} ms",
                ms(quantile(&d, 0.5)),
                ms(quantile(&d, 1.0)),
                ms(quantile(&a, 0.5)),
                ms(quantile(&a, 1.0))
            )?;
        }
        for m in &self.missed {
            writeln!(f, "missed: {m}")?;
        }
        write!(
            f,
            "bound: every change reached every node within {:.1} ms of the store write \
             returning ({} of {} changes seen; target <= {} ms): {}",
            ms(self.bound()),
            self.deny.len() + self.allow.len(),
            2 * self.trials * self.nodes.len(),
            PROPAGATION_TARGET.as_millis(),
            if self.pass() { "PASS" } else { "MISS" }
        )
    }
}

/// One probed path: the server on `node`, reached from the client pod in `client_netns`.
#[derive(Debug, Clone)]
struct ProbePath {
    node: String,
    client_netns: String,
    target: SocketAddr,
}

/// One attempt from the calling thread's namespace: whether a new TCP connection completes.
/// Only a timeout or a refusal means "blocked"; anything else is the lab being broken.
fn attempt(target: SocketAddr, timeout: Duration) -> Result<bool> {
    match TcpStream::connect_timeout(&target, timeout) {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(LabError::Probe {
            proto: "tcp",
            target: target.to_string(),
            message: e.to_string(),
        }),
    }
}

/// Runs a [`Detector`] over attempts `(start, open)` in order of their start (attempts of
/// several probers finish out of order; what a probe saw was decided when its SYN left).
pub fn detect(attempts: &[(Instant, bool)], want_open: bool, confirm: usize) -> Option<Window> {
    let mut sorted = attempts.to_vec();
    sorted.sort_by_key(|a| a.0);
    let mut d = Detector::new(want_open, confirm);
    sorted
        .into_iter()
        .find_map(|(start, open)| d.observe(start, open))
}

/// Probes `target` with `o.probers` staggered threads (started in the calling thread's
/// namespace, which they inherit) until their merged attempts show the switch, the deadline
/// passes (`None`) or `stop` is set.
fn probe_until(
    target: SocketAddr,
    want_open: bool,
    confirm: usize,
    o: &PropagationOptions,
    stop: &AtomicBool,
) -> Result<Option<Window>> {
    let attempts = Mutex::new(Vec::<(Instant, bool)>::new());
    let done = AtomicBool::new(false);
    let probers = o.probers.max(1);
    // Each prober starts an attempt once per timeout, offset by timeout/probers from the
    // previous one: the spacing is the same whether attempts complete at once or time out.
    let period = o.probe_timeout;
    let begin = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..probers)
            .map(|k| {
                let (attempts, done) = (&attempts, &done);
                s.spawn(move || -> Result<()> {
                    std::thread::sleep(period * k as u32 / probers as u32);
                    while !done.load(Ordering::Relaxed)
                        && !stop.load(Ordering::Relaxed)
                        && begin.elapsed() < o.deadline
                    {
                        let start = Instant::now();
                        let open = attempt(target, o.probe_timeout).inspect_err(|_| {
                            done.store(true, Ordering::Relaxed);
                        })?;
                        let mut a = attempts.lock().unwrap_or_else(|e| e.into_inner());
                        a.push((start, open));
                        if detect(&a, want_open, confirm).is_some() {
                            done.store(true, Ordering::Relaxed);
                        }
                        drop(a);
                        std::thread::sleep(period.saturating_sub(start.elapsed()));
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(LabError::Invalid("a prober panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    // Every prober has finished its last attempt: decide on the complete record.
    let a = attempts.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(detect(&a, want_open, confirm))
}

/// Starts a probing thread per path (inside its client pod), runs `change` once all probe, and
/// returns the instant `change` reported and each path's window (`None`: not seen in time).
fn watch<F>(
    paths: &[ProbePath],
    want_open: bool,
    o: &PropagationOptions,
    change: F,
) -> Result<(Instant, Vec<Option<Window>>)>
where
    F: FnOnce() -> Result<Instant>,
{
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<std::result::Result<(), String>>();
    std::thread::scope(|s| {
        let handles: Vec<_> = paths
            .iter()
            .map(|p| {
                let (tx, stop) = (tx.clone(), &stop);
                let confirm = if want_open { 1 } else { o.confirm };
                s.spawn(move || {
                    let r = in_netns(&p.client_netns, || {
                        let _ = tx.send(Ok(()));
                        probe_until(p.target, want_open, confirm, o, stop)
                    });
                    match r {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = tx.send(Err(e.to_string()));
                            Err(e)
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        let mut ready = Ok(());
        for _ in paths {
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    ready = Err(LabError::Invalid(format!("a probe thread failed: {e}")));
                    break;
                }
                Err(_) => {
                    ready = Err(LabError::Timeout("probe threads did not start".into()));
                    break;
                }
            }
        }
        let t0 = ready.and_then(|()| change());
        if t0.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        let windows: Vec<Result<Option<Window>>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(LabError::Invalid("a probe thread panicked".into())))
            })
            .collect();
        let t0 = t0?;
        Ok((t0, windows.into_iter().collect::<Result<Vec<_>>>()?))
    })
}

/// Writes `docs` to the lab's store; the instant the last put returned.
fn put_all(st: &LabState, docs: &[Resource]) -> Result<Instant> {
    with_store(st, |s| {
        for d in docs {
            tern_model::put_resource(&*s, d).map_err(|e| {
                LabError::Invalid(format!("applying {} {}: {e}", d.kind().as_str(), d.name()))
            })?;
        }
        Ok(Instant::now())
    })
}

/// Deletes `docs` from the lab's store; the instant the last delete returned.
fn delete_all(st: &LabState, docs: &[Resource]) -> Result<Instant> {
    with_store(st, |s| {
        for d in docs {
            tern_model::delete_resource(&*s, d.kind(), d.namespace(), d.name()).map_err(|e| {
                LabError::Invalid(format!("deleting {} {}: {e}", d.kind().as_str(), d.name()))
            })?;
        }
        Ok(Instant::now())
    })
}

/// Builds the pods: a server (`app=srv`, echo on [`SERVER_PORT`]) and a client (`app=cli`) per
/// node; node `i`'s server is probed from node `i+1`'s client.
fn build_paths(st: &mut LabState) -> Result<Vec<ProbePath>> {
    let ns_labels = BTreeMap::from([("ns".to_string(), K8S_NAMESPACE.to_string())]);
    netpol::put_namespace(st, K8S_NAMESPACE, &ns_labels)?;
    let nodes: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    let app = |v: &str| BTreeMap::from([("app".to_string(), v.to_string())]);
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let srv = netpol::add_k8s_pod(
            st,
            node,
            K8S_NAMESPACE,
            &format!("srv{}", i + 1),
            &app("srv"),
        )?;
        netpol::serve_in(&srv.netns, &[SERVER_PORT], &[L4::Tcp])?;
        servers.push(srv);
        clients.push(netpol::add_k8s_pod(
            st,
            node,
            K8S_NAMESPACE,
            &format!("cli{}", i + 1),
            &app("cli"),
        )?);
    }
    Ok(servers
        .iter()
        .enumerate()
        .map(|(i, srv)| ProbePath {
            node: srv.node.clone(),
            client_netns: clients[(i + 1) % clients.len()].netns.clone(),
            target: SocketAddr::new(srv.ip, SERVER_PORT),
        })
        .collect())
}

/// Waits until every path is open (routes converged, no policy in force).
fn wait_open(paths: &[ProbePath], o: &PropagationOptions) -> Result<()> {
    let stop = AtomicBool::new(false);
    for p in paths {
        let w = in_netns(&p.client_netns, || probe_until(p.target, true, 1, o, &stop))??;
        if w.is_none() {
            return Err(LabError::Timeout(format!(
                "server {} on {} not reachable from {} within {:?}",
                p.target, p.node, p.client_netns, o.deadline
            )));
        }
    }
    Ok(())
}

/// Runs the trials on a built lab.
fn trials(st: &mut LabState, o: &PropagationOptions) -> Result<PropagationReport> {
    let paths = build_paths(st)?;
    wait_open(&paths, o)?;
    let docs = tern_model::parse_documents(DENY_POLICY, "policyprop.yaml")
        .map_err(|e| LabError::Invalid(format!("cannot parse the benchmark's policy: {e}")))?;
    let mut report = PropagationReport {
        store: o.store,
        encap: st.encap,
        nodes: paths.iter().map(|p| p.node.clone()).collect(),
        trials: o.trials,
        probe_timeout: o.probe_timeout,
        probers: o.probers,
        confirm: o.confirm,
        deny: Vec::new(),
        allow: Vec::new(),
        missed: Vec::new(),
    };
    for trial in 0..o.trials {
        for (want_open, name) in [(false, "deny"), (true, "allow")] {
            let (t0, windows) = if want_open {
                watch(&paths, true, o, || delete_all(st, &docs))?
            } else {
                watch(&paths, false, o, || put_all(st, &docs))?
            };
            for (p, w) in paths.iter().zip(windows) {
                match w {
                    Some(w) => {
                        let s = w.sample(trial, &p.node, t0);
                        if want_open {
                            report.allow.push(s);
                        } else {
                            report.deny.push(s);
                        }
                    }
                    None => report.missed.push(format!(
                        "trial {trial} {}: {name} not seen within {:?}",
                        p.node, o.deadline
                    )),
                }
            }
        }
        // Every node must be open again before the next trial, or its samples would start
        // from a wrong state.
        wait_open(&paths, o)?;
    }
    Ok(report)
}

/// Measures policy propagation on a fresh lab named [`LAB_NAME`], removed again afterwards
/// (also on failure).
pub fn run_propagation(o: &PropagationOptions) -> Result<PropagationReport> {
    if o.nodes < 2 {
        return Err(LabError::Invalid(format!(
            "policy propagation needs at least 2 nodes (probes cross nodes), got {}",
            o.nodes
        )));
    }
    let _ = tern_lab::down(LAB_NAME);
    let mut up = UpOptions::new(LAB_NAME, &o.bin_dir);
    up.nodes = o.nodes;
    up.encap = Encap::Vxlan;
    up.store = o.store;
    up.agent_timeout = Duration::from_secs(30);
    let result = topology::up(&up).and_then(|mut st| trials(&mut st, o));
    let down = tern_lab::down(LAB_NAME);
    let r = result?;
    down?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn detector_confirms_a_deny_and_restarts_on_a_blip() {
        let b = Instant::now();
        let mut d = Detector::new(false, 3);
        assert_eq!(d.observe(at(b, 0), true), None);
        assert_eq!(d.observe(at(b, 1), true), None);
        // A lone failure followed by a success is not the policy.
        assert_eq!(d.observe(at(b, 2), false), None);
        assert_eq!(d.observe(at(b, 52), true), None);
        assert_eq!(d.observe(at(b, 53), false), None);
        assert_eq!(d.observe(at(b, 103), false), None);
        assert_eq!(
            d.observe(at(b, 153), false),
            Some(Window {
                last_old: Some(at(b, 52)),
                first_new: at(b, 53)
            })
        );
    }

    #[test]
    fn detector_takes_the_first_success_for_allow() {
        let b = Instant::now();
        let mut d = Detector::new(true, 0);
        assert_eq!(d.confirm, 1);
        assert_eq!(d.observe(at(b, 0), false), None);
        assert_eq!(
            d.observe(at(b, 50), true),
            Some(Window {
                last_old: Some(at(b, 0)),
                first_new: at(b, 50)
            })
        );
        let mut d = Detector::new(true, 1);
        assert_eq!(
            d.observe(at(b, 7), true),
            Some(Window {
                last_old: None,
                first_new: at(b, 7)
            })
        );
    }

    #[test]
    fn detect_orders_attempts_of_several_probers_by_start() {
        let b = Instant::now();
        // Recorded in finish order: the timed-out attempt that started at 2 ms finished last.
        let attempts = [
            (at(b, 0), false),
            (at(b, 4), true),
            (at(b, 6), true),
            (at(b, 2), false),
        ];
        assert_eq!(
            detect(&attempts, true, 1),
            Some(Window {
                last_old: Some(at(b, 2)),
                first_new: at(b, 4)
            })
        );
        assert_eq!(detect(&attempts, false, 3), None);
        assert_eq!(detect(&[], true, 1), None);
    }

    #[test]
    fn samples_measure_from_the_write_and_bound_the_error() {
        let b = Instant::now();
        let t0 = at(b, 10);
        // Old state seen after the write returned: resolution is the gap between attempts.
        let w = Window {
            last_old: Some(at(b, 40)),
            first_new: at(b, 41),
        };
        let s = w.sample(2, "node1", t0);
        assert_eq!(s.latency, Duration::from_millis(31));
        assert_eq!(s.resolution, Duration::from_millis(1));
        assert_eq!((s.trial, s.node.as_str()), (2, "node1"));
        // Last old attempt before the write: the change cannot predate the write's window.
        let w = Window {
            last_old: Some(at(b, 0)),
            first_new: at(b, 50),
        };
        let s = w.sample(0, "node2", t0);
        assert_eq!(s.latency, Duration::from_millis(40));
        assert_eq!(s.resolution, Duration::from_millis(40));
        // The node acted before the write returned: clamped to 0.
        let w = Window {
            last_old: None,
            first_new: at(b, 5),
        };
        let s = w.sample(0, "node3", t0);
        assert_eq!((s.latency, s.resolution), (Duration::ZERO, Duration::ZERO));
    }

    fn sample(node: &str, latency: u64, resolution: u64) -> Sample {
        Sample {
            trial: 0,
            node: node.into(),
            latency: Duration::from_millis(latency),
            resolution: Duration::from_millis(resolution),
        }
    }

    fn report(deny: Vec<Sample>, allow: Vec<Sample>) -> PropagationReport {
        PropagationReport {
            store: StoreKind::Etcd,
            encap: Encap::Vxlan,
            nodes: vec!["node1".into(), "node2".into()],
            trials: 1,
            probe_timeout: Duration::from_millis(50),
            probers: 25,
            confirm: 3,
            deny,
            allow,
            missed: Vec::new(),
        }
    }

    #[test]
    fn report_renders_quantiles_per_direction_and_node() {
        let r = report(
            vec![sample("node1", 30, 1), sample("node2", 60, 2)],
            vec![sample("node1", 80, 50), sample("node2", 120, 49)],
        );
        let text = r.to_string();
        assert!(
            text.contains("deny takes effect     2     30.0     60.0     60.0      1.0 / 2.0"),
            "{text}"
        );
        assert!(
            text.contains("allow restored        2     80.0    120.0    120.0     49.0 / 50.0"),
            "{text}"
        );
        assert!(
            text.contains("node2: deny p50 60.0 max 60.0 ms, allow p50 120.0 max 120.0 ms"),
            "{text}"
        );
        assert!(text.contains("store etcd, 1 trials"), "{text}");
        assert!(
            text.contains("every 2.0 ms (25 staggered probers, connect timeout 50 ms each)"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "within 120.0 ms of the store write returning (4 of 4 changes seen; target \
                 <= 1000 ms): PASS"
            ),
            "{text}"
        );
        assert_eq!(r.bound(), Duration::from_millis(120));
    }

    #[test]
    fn report_misses_on_slow_or_unseen_changes() {
        let mut r = report(
            vec![sample("node1", 30, 1)],
            vec![sample("node1", 1500, 50)],
        );
        assert!(!r.pass());
        assert!(r.to_string().ends_with("MISS"));
        r.allow = vec![sample("node1", 100, 50)];
        assert!(r.pass());
        r.missed
            .push("trial 0 node2: deny not seen within 10s".into());
        assert!(!r.pass());
        let text = r.to_string();
        assert!(
            text.contains("missed: trial 0 node2: deny not seen within 10s"),
            "{text}"
        );
        assert!(text.ends_with("MISS"), "{text}");
        assert!(!report(Vec::new(), Vec::new()).pass());
    }

    #[test]
    fn the_policy_denies_ingress_to_servers() {
        let docs = tern_model::parse_documents(DENY_POLICY, "p.yaml").unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].kind(), tern_model::Kind::K8sNetworkPolicy);
        assert_eq!(docs[0].namespace(), Some(K8S_NAMESPACE));
        assert_eq!(docs[0].name(), "deny-srv");
    }

    #[test]
    fn staggered_probers_see_a_port_open_and_closed() {
        let mut o = PropagationOptions::new(PathBuf::new(), 1);
        o.probers = 5;
        o.probe_timeout = Duration::from_millis(20);
        o.deadline = Duration::from_secs(5);
        let stop = AtomicBool::new(false);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let w = probe_until(addr, true, 1, &o, &stop).unwrap().unwrap();
        assert_eq!(w.last_old, None);
        drop(l);
        let w = probe_until(addr, false, 3, &o, &stop).unwrap().unwrap();
        assert_eq!(w.last_old, None);
        // Told to stop: no verdict, no error.
        stop.store(true, Ordering::Relaxed);
        assert_eq!(probe_until(addr, true, 1, &o, &stop).unwrap(), None);
    }

    #[test]
    fn an_attempt_tells_open_from_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap();
        assert!(attempt(open, Duration::from_millis(200)).unwrap());
        drop(l);
        // Nothing listens any more: the RST counts as blocked, not as an error.
        assert!(!attempt(open, Duration::from_millis(200)).unwrap());
    }
}
