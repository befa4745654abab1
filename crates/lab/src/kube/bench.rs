//! Pod start-up under kubelet (issue 12's benchmark): the time from `kubectl create` of a pod
//! to the API showing it Running with its address, for pods created one after another, and
//! the wall time of a burst of pods created at once until the last is Running with its
//! address. The same procedure runs on a tern cluster and on one with the reference
//! `bridge` + `host-local` network (`KubeOptions::reference_cni`), same kubelet and containerd.
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

/// What [`pod_startup`] measured.
#[derive(Debug, Clone, Default)]
pub struct StartupFigures {
    /// Create-to-Running-with-address of each sequential pod, in creation order.
    pub sequential: Vec<Duration>,
    /// Pods in the burst.
    pub burst_pods: usize,
    /// From creating the burst until its last pod was Running with its address.
    pub burst: Duration,
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
    /// One line: p50, p99, max of the sequential pods, and the burst.
    pub fn summary(&self) -> String {
        format!(
            "sequential {} pods: p50 {:.0} ms  p99 {:.0} ms  max {:.0} ms; burst of {}: {:.2} s",
            self.sequential.len(),
            ms(quantile(&self.sequential, 0.5)),
            ms(quantile(&self.sequential, 0.99)),
            ms(self.sequential.iter().max().copied().unwrap_or_default()),
            self.burst_pods,
            self.burst.as_secs_f64()
        )
    }
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
    let t0 = Instant::now();
    create(k, &yaml.join("---\n"))?;
    let t1 = wait_running(&w, &names, Duration::from_secs(600))?;
    fig.burst = t1.duration_since(t0);
    drop(w);
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
}
