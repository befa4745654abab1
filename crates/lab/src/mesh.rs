//! Proving connectivity between every pair of pods, and looking at what the nodes route. The
//! probes run on threads inside the source pods' namespaces, so a full mesh costs no process
//! starts; the echo servers are the ones `start_server` launched.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::netns::in_netns;
use crate::process::ip_in;
use crate::state::{self, LabState, PodState, family_name};
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
    mesh_to(st, port, protos, timeout, |p| {
        p.addresses.first()?.parse().ok()
    })
}

/// As [`check_mesh`], to every pod's address of one family (`v6`): in a dual-stack lab, run
/// once per family. A pod without an address of the family is a failed probe, not skipped.
pub fn check_mesh_family(
    st: &LabState,
    port: u16,
    protos: &[Proto],
    timeout: Duration,
    v6: bool,
) -> Result<MeshReport> {
    let mut report = mesh_to(st, port, protos, timeout, |p| pod_ip_of(p, v6))?;
    for d in st.pods.iter().filter(|d| pod_ip_of(d, v6).is_none()) {
        for proto in protos {
            report.results.push(PairResult {
                src: "-".into(),
                dst: d.name.clone(),
                proto: *proto,
                target: SocketAddr::new(unspecified(v6), port),
                outcome: Err(format!("pod has no {} address", family_name(v6))),
            });
        }
    }
    Ok(report)
}

fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    }
}

/// A pod's address of one family (`v6`), if it has one.
pub fn pod_ip_of(p: &PodState, v6: bool) -> Option<IpAddr> {
    p.addresses
        .iter()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|a| a.is_ipv6() == v6)
}

/// Probes every pod from every other pod at the address `addr` picks (pods it gives none are
/// left out).
fn mesh_to(
    st: &LabState,
    port: u16,
    protos: &[Proto],
    timeout: Duration,
    addr: impl Fn(&PodState) -> Option<IpAddr>,
) -> Result<MeshReport> {
    let mut report = MeshReport::default();
    for src in &st.pods {
        let targets: Vec<(String, SocketAddr)> = st
            .pods
            .iter()
            .filter(|d| d.name != src.name)
            .filter_map(|d| Some((d.name.clone(), SocketAddr::new(addr(d)?, port))))
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
    routes_of(st, node, false)
}

/// A node's routing table of one family (`v6`: `ip -6 route`).
pub fn routes_of(st: &LabState, node: &str, v6: bool) -> Result<String> {
    let n = st.node(node)?;
    ip_in(&n.netns, &[if v6 { "-6" } else { "-4" }, "route", "show"])
}

/// The routing tables of every family of the lab, every node (for failure messages).
pub fn all_routes(st: &LabState) -> String {
    let mut out = String::new();
    for n in &st.nodes {
        for v6 in st.ip_family.families() {
            out.push_str(&format!(
                "\n--- {} {} routes ---\n{}",
                n.name,
                family_name(v6),
                routes_of(st, &n.name, v6).unwrap_or_else(|e| e.to_string())
            ));
        }
    }
    out
}

/// Probes pod `pod`'s echo server on `port` (its address of family `v6`) from node `node`'s
/// own namespace (the host, not a pod).
pub fn probe_from_node(
    st: &LabState,
    node: &str,
    pod: &str,
    proto: Proto,
    port: u16,
    v6: bool,
    timeout: Duration,
) -> Result<traffic::ProbeOk> {
    let n = st.node(node)?;
    let p = st.pod(pod)?;
    let ip = pod_ip_of(p, v6).ok_or_else(|| {
        LabError::Invalid(format!("pod {pod} has no {} address", family_name(v6)))
    })?;
    in_netns(&n.netns, || {
        traffic::probe(proto, SocketAddr::new(ip, port), timeout)
    })?
}

/// The lab's "outside": a namespace and address of family `v6` off the pod network that every
/// node reaches over its default route, but that has no route to the pods (so only
/// natOutgoing gets an answer back): the underlay bridge's address, or in a cross-subnet lab
/// the router's address on the first subnet.
pub fn outside(st: &LabState, v6: bool) -> Result<(String, IpAddr)> {
    let (ns, addr) = match (st.encap, v6) {
        (crate::Encap::Crosssubnet, false) => (state::router_ns(&st.name), "198.18.1.1"),
        (crate::Encap::Crosssubnet, true) => (state::router_ns(&st.name), "2001:db8:1::1"),
        (_, false) => (
            state::underlay_ns(&st.name),
            crate::topology::UNDERLAY_GATEWAY,
        ),
        (_, true) => (
            state::underlay_ns(&st.name),
            crate::topology::UNDERLAY_GATEWAY6,
        ),
    };
    if !st.ip_family.has(v6) {
        return Err(LabError::Invalid(format!(
            "lab {} ({}) has no {} outside",
            st.name,
            st.ip_family,
            family_name(v6)
        )));
    }
    let ip = addr
        .parse()
        .map_err(|e| LabError::Invalid(format!("{addr}: {e}")))?;
    Ok((ns, ip))
}

/// Probes the lab's outside ([`outside`], family `v6`) on `port` from pod `pod`, with a
/// one-probe echo server there ([`traffic::Witness`]); returns the answer and the source
/// address the outside saw (the node's underlay address when the pool masquerades).
pub fn probe_outside(
    st: &LabState,
    pod: &str,
    proto: Proto,
    port: u16,
    v6: bool,
    timeout: Duration,
) -> Result<traffic::SeenProbe> {
    let p = st.pod(pod)?;
    let (ns, ip) = outside(st, v6)?;
    let target = SocketAddr::new(ip, port);
    let witness = in_netns(&ns, || traffic::Witness::bind(proto, target, timeout))??;
    let seen = witness.answer_one();
    let ok = in_netns(&p.netns, || traffic::probe(proto, target, timeout))?;
    let source = seen
        .join()
        .map_err(|_| LabError::Invalid("outside server thread panicked".into()))?;
    let ok = ok?;
    Ok(traffic::SeenProbe {
        ok,
        source: source?,
    })
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
