//! The measured phases: sequential and concurrent ADDs and DELs of one plugin set, and their
//! figures.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::cni::CniCommand;
use super::error::BenchError;
use super::plugin_exec::{Invocation, Plugin, Pod, ResultCache, invoke};
use super::stats::Summary;

/// A measured phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// ADD for each pod, one after another.
    Add,
    /// DEL for each of those pods, one after another.
    Del,
    /// ADDs started together from a barrier, one thread each.
    AddConcurrent,
    /// DELs of the concurrent pods, started together.
    DelConcurrent,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Phase::Add => "add",
            Phase::Del => "del",
            Phase::AddConcurrent => "add-concurrent",
            Phase::DelConcurrent => "del-concurrent",
        })
    }
}

/// The figures of one phase of one plugin set.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    /// Plugin-set label.
    pub plugin: String,
    /// Which phase.
    pub phase: Phase,
    /// Latencies.
    pub summary: Summary,
    /// For concurrent phases: first start to last exit.
    pub wall: Option<Duration>,
    /// For ADD phases: whether every returned address was distinct.
    pub distinct_addresses: Option<bool>,
    /// The first few failure messages (count in `summary`).
    pub errors: Vec<String>,
    /// `CNI_CONTAINERID` of every pod of the phase (to find its requests in ternd's log).
    pub container_ids: Vec<String>,
}

const MAX_ERRORS_KEPT: usize = 3;

fn phase_result(
    plugin: &Plugin,
    phase: Phase,
    invocations: &[Invocation],
    wall: Option<Duration>,
) -> PhaseResult {
    let ok: Vec<Duration> = invocations
        .iter()
        .filter(|i| i.outcome.is_ok())
        .map(|i| i.elapsed)
        .collect();
    let errors = invocations
        .iter()
        .filter_map(|i| i.outcome.as_ref().err().cloned())
        .take(MAX_ERRORS_KEPT)
        .collect();
    let distinct_addresses = matches!(phase, Phase::Add | Phase::AddConcurrent).then(|| {
        let all: Vec<&String> = invocations
            .iter()
            .filter_map(|i| i.outcome.as_ref().ok())
            .flat_map(|r| &r.addresses)
            .collect();
        all.iter().collect::<HashSet<_>>().len() == all.len()
    });
    PhaseResult {
        plugin: plugin.label.clone(),
        phase,
        summary: Summary::new(invocations.len(), &ok),
        wall,
        distinct_addresses,
        errors,
        container_ids: Vec::new(),
    }
}

/// How much work one plugin set gets.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Pods added then deleted one after another.
    pub pods: usize,
    /// Pods added (then deleted) concurrently.
    pub concurrency: usize,
}

fn create_pods(dir: &Path, count: usize) -> Result<Vec<Pod>, BenchError> {
    (0..count).map(|_| Pod::create(dir)).collect()
}

fn sequential(
    plugin: &Plugin,
    cache: &ResultCache,
    pods: &[Pod],
    command: CniCommand,
) -> Vec<Invocation> {
    pods.iter()
        .map(|pod| run_one(plugin, cache, pod, command))
        .collect()
}

/// One execution plus the runtime's cache bookkeeping, which is outside the timed span.
fn run_one(plugin: &Plugin, cache: &ResultCache, pod: &Pod, command: CniCommand) -> Invocation {
    let prev = cache.before(plugin, pod, command);
    let invocation = invoke(plugin, command, pod, prev.as_ref());
    cache.after(plugin, pod, command, &invocation);
    invocation
}

/// Runs one execution per pod, each on its own thread, all released together by a barrier.
/// Returns the invocations in pod order and the wall time from first start to last exit.
fn concurrent(
    plugin: &Plugin,
    cache: &ResultCache,
    pods: &[Pod],
    command: CniCommand,
) -> (Vec<Invocation>, Duration) {
    let barrier = Barrier::new(pods.len());
    let (invocations, spans): (Vec<Invocation>, Vec<(Instant, Instant)>) =
        std::thread::scope(|scope| {
            let handles: Vec<_> = pods
                .iter()
                .map(|pod| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let prev = cache.before(plugin, pod, command);
                        barrier.wait();
                        let start = Instant::now();
                        let invocation = invoke(plugin, command, pod, prev.as_ref());
                        let end = Instant::now();
                        (invocation, (start, end))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("bench thread does not panic"))
                .unzip()
        });
    for (pod, invocation) in pods.iter().zip(&invocations) {
        cache.after(plugin, pod, command, invocation);
    }
    let first = spans.iter().map(|s| s.0).min();
    let last = spans.iter().map(|s| s.1).max();
    let wall = match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    };
    (invocations, wall)
}

/// Measures one plugin set: a warm-up ADD+DEL (not counted, so the page cache and the agent are
/// warm), `pods` sequential ADDs then DELs, and `concurrency` concurrent ADDs then DELs.
///
/// Pod namespaces are created in `netns_dir` before each phase pair and removed after it, also
/// on error. Failing executions are counted, not fatal; a failing warm-up is.
pub fn measure(
    plugin: &Plugin,
    workload: &Workload,
    netns_dir: &Path,
    cache: &ResultCache,
) -> Result<Vec<PhaseResult>, BenchError> {
    if !plugin.binary.is_file() {
        return Err(BenchError::MissingBinary(plugin.binary.clone()));
    }
    let warm = create_pods(netns_dir, 1)?;
    for command in [CniCommand::Add, CniCommand::Del] {
        if let Err(reason) = run_one(plugin, cache, &warm[0], command).outcome {
            return Err(BenchError::WarmUp {
                plugin: plugin.label.clone(),
                command,
                reason,
            });
        }
    }
    drop(warm);

    let mut results = Vec::new();
    if workload.pods > 0 {
        let pods = create_pods(netns_dir, workload.pods)?;
        let adds = sequential(plugin, cache, &pods, CniCommand::Add);
        let mut add = phase_result(plugin, Phase::Add, &adds, None);
        add.container_ids = pods.iter().map(|p| p.container_id.clone()).collect();
        results.push(add);
        let dels = sequential(plugin, cache, &pods, CniCommand::Del);
        results.push(phase_result(plugin, Phase::Del, &dels, None));
    }
    if workload.concurrency > 0 {
        let pods = create_pods(netns_dir, workload.concurrency)?;
        let (adds, wall) = concurrent(plugin, cache, &pods, CniCommand::Add);
        results.push(phase_result(
            plugin,
            Phase::AddConcurrent,
            &adds,
            Some(wall),
        ));
        let (dels, wall) = concurrent(plugin, cache, &pods, CniCommand::Del);
        results.push(phase_result(
            plugin,
            Phase::DelConcurrent,
            &dels,
            Some(wall),
        ));
    }
    Ok(results)
}
