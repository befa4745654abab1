//! Proving connectivity between every pair of pods, and looking at what the nodes route. The
//! probes run on threads inside the source pods' namespaces, so a full mesh costs no process
//! starts; the echo servers are the ones `start_server` launched.

use std::net::SocketAddr;
use std::time::Duration;

use crate::netns::in_netns;
use crate::process::ip_in;
use crate::state::LabState;
use crate::traffic::{self, Proto};
use crate::{LabError, Result};

/// One probe of the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairResult {
    /// Source pod.
    pub src: String,
    /// Destination pod.
    pub dst: String,
    pub proto: Proto,
    /// Target address.
    pub target: SocketAddr,
    /// Round-trip time, or why it failed.
    pub outcome: std::result::Result<Duration, String>,
}

impl std::fmt::Display for PairResult {
    /// `ok tcp pod1 -> pod2 (10.244.1.2:7) rtt 0.3ms` or `FAIL udp pod1 -> pod2 (...): why`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Ok(rtt) => write!(
                f,
                "ok {} {} -> {} ({}) rtt {:.1}ms",
                self.proto.as_str(),
                self.src,
                self.dst,
                self.target,
                rtt.as_secs_f64() * 1000.0
            ),
            Err(e) => write!(
                f,
                "FAIL {} {} -> {} ({}): {e}",
                self.proto.as_str(),
                self.src,
                self.dst,
                self.target
            ),
        }
    }
}

/// Results of a full mesh.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshReport {
    pub results: Vec<PairResult>,
}

impl MeshReport {
    /// The failed probes.
    pub fn failures(&self) -> Vec<&PairResult> {
        self.results.iter().filter(|r| r.outcome.is_err()).collect()
    }

    /// Number of successful probes.
    pub fn ok_count(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_ok()).count()
    }
}

impl std::fmt::Display for MeshReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.results {
            writeln!(f, "{r}")?;
        }
        write!(
            f,
            "mesh: {} of {} probes ok",
            self.ok_count(),
            self.results.len()
        )
    }
}

/// Probes every pod from every other pod (first address of each) with each protocol in
/// `protos`, on port `port`, where echo servers must already listen.
pub fn check_mesh(
    st: &LabState,
    port: u16,
    protos: &[Proto],
    timeout: Duration,
) -> Result<MeshReport> {
    let mut report = MeshReport::default();
    for src in &st.pods {
        let targets: Vec<(String, SocketAddr)> = st
            .pods
            .iter()
            .filter(|d| d.name != src.name)
            .filter_map(|d| {
                let ip = d.addresses.first()?.parse().ok()?;
                Some((d.name.clone(), SocketAddr::new(ip, port)))
            })
            .collect();
        let src_name = src.name.clone();
        let results = in_netns(&src.netns, || {
            let mut out = Vec::new();
            for (dst, target) in &targets {
                for proto in protos {
                    out.push(PairResult {
                        src: src_name.clone(),
                        dst: dst.clone(),
                        proto: *proto,
                        target: *target,
                        outcome: traffic::probe(*proto, *target, timeout)
                            .map(|ok| ok.rtt)
                            .map_err(|e| e.to_string()),
                    });
                }
            }
            out
        })?;
        report.results.extend(results);
    }
    Ok(report)
}

/// Probes `target` from inside pod `pod` continuously (see [`traffic::probe_continuous`]).
pub fn probe_continuous_from(
    st: &LabState,
    pod: &str,
    proto: Proto,
    target: SocketAddr,
    interval: Duration,
    duration: Duration,
) -> Result<traffic::ContinuousReport> {
    let p = st.pod(pod)?;
    in_netns(&p.netns, || {
        traffic::probe_continuous(proto, target, interval, duration)
    })?
}

/// A node's IPv4 routing table (`ip route` inside its namespace).
pub fn routes(st: &LabState, node: &str) -> Result<String> {
    let n = st.node(node)?;
    ip_in(&n.netns, &["-4", "route", "show"])
}

/// The routes of `node` toward the pod networks of other nodes: every line of its routing
/// table that is neither local (`dev tern...`/scope link to a pod), the default route, nor
/// the underlay subnet. Used to check that a departed node's block routes are gone.
pub fn remote_pod_routes(st: &LabState, node: &str) -> Result<Vec<String>> {
    let table = routes(st, node)?;
    Ok(table
        .lines()
        .filter(|l| {
            !l.starts_with("default")
                && !l.starts_with("198.18.")
                && !l.contains(" dev tern")
                && !l.starts_with("blackhole")
                && !l.contains("proto kernel")
        })
        .map(str::to_string)
        .collect())
}

/// The first address of pod `pod`.
pub fn pod_ip(st: &LabState, pod: &str) -> Result<std::net::IpAddr> {
    let p = st.pod(pod)?;
    p.addresses
        .first()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| LabError::Invalid(format!("pod {pod} has no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines() {
        let ok = PairResult {
            src: "pod1".into(),
            dst: "pod2".into(),
            proto: Proto::Tcp,
            target: "10.244.1.2:7".parse().unwrap(),
            outcome: Ok(Duration::from_micros(300)),
        };
        let bad = PairResult {
            outcome: Err("no echo".into()),
            proto: Proto::Udp,
            ..ok.clone()
        };
        assert_eq!(
            ok.to_string(),
            "ok tcp pod1 -> pod2 (10.244.1.2:7) rtt 0.3ms"
        );
        assert_eq!(
            bad.to_string(),
            "FAIL udp pod1 -> pod2 (10.244.1.2:7): no echo"
        );
        let r = MeshReport {
            results: vec![ok, bad],
        };
        assert_eq!(r.failures().len(), 1);
        assert!(r.to_string().ends_with("mesh: 1 of 2 probes ok"));
    }
}
