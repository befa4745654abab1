//! Network benchmarks across lab nodes (`tern-bench net`, `tern-bench converge`).
//!
//! `net`: cross-node pod-to-pod TCP throughput with iperf3, on a two-node tern lab (direct and
//! VXLAN) side by side with the same path built by hand with `ip` commands and no tern: a veth
//! per pod, `/32` routes, and for VXLAN a device per node with static FDB/ARP entries and the
//! same MTU tern gives pods (1450). `converge`: from the start of a pod's CNI ADD on node A to
//! the first packet from a pod on node B that reaches it (a TCP connection attempt to a closed
//! port: the pod's RST proves the packet arrived), p50/p99 over many pods.
//!
//! Everything lives in lab namespaces (`tl-<name>-...`), removed again on every path.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tern_lab::process::{self, ip_in, netns_add, netns_del, netns_exec, sysctl_in};
use tern_lab::state::{Encap, LabState, StoreKind};
use tern_lab::topology::{self, UpOptions};
use tern_lab::{LabError, Result, mesh, netns, pod};

/// The iperf3 binary.
pub const IPERF3: &str = "/usr/bin/iperf3";
/// Target: tern's throughput relative to the hand-built path.
pub const THROUGHPUT_TARGET: f64 = 0.95;
/// Target: p99 of route convergence.
pub const CONVERGE_P99_TARGET: Duration = Duration::from_millis(200);

/// One throughput measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Throughput {
    /// `direct` or `vxlan`.
    pub mode: &'static str,
    /// `tern` or `hand-built`.
    pub path: &'static str,
    /// Median of the runs, bits per second.
    pub bits_per_second: f64,
    /// Every run.
    pub runs: Vec<f64>,
}

/// Median of a non-empty list (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The `q`-quantile (0..=1) of durations by nearest rank.
pub fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// Received bits per second from `iperf3 -J` output.
pub fn iperf_bps(json: &str) -> Result<f64> {
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| LabError::Invalid(format!("iperf3 output is not JSON ({e}): {json}")))?;
    if let Some(e) = v["error"].as_str() {
        return Err(LabError::Invalid(format!("iperf3: {e}")));
    }
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| LabError::Invalid("iperf3 output has no end.sum_received".into()))
}

/// Runs iperf3 from namespace `client_ns` to a server started in `server_ns` at `server_ip`.
fn iperf(server_ns: &str, client_ns: &str, server_ip: &str, seconds: u32) -> Result<f64> {
    let mut server: Child = netns_exec(server_ns, Path::new(IPERF3))
        .args(["-s", "-1", "-p", "5201"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| LabError::Spawn {
            command: format!("ip netns exec {server_ns} iperf3 -s"),
            source: e,
        })?;
    // The server listens within milliseconds; the client retries its connection anyway.
    std::thread::sleep(Duration::from_millis(300));
    let mut cmd = netns_exec(client_ns, Path::new(IPERF3));
    cmd.args([
        "-c",
        server_ip,
        "-p",
        "5201",
        "-J",
        "-t",
        &seconds.to_string(),
    ]);
    let out = process::output(&mut cmd);
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    iperf_bps(&String::from_utf8_lossy(&out.stdout))
}

/// Measures tern on a two-node lab with encapsulation `encap`.
fn tern_throughput(
    name: &str,
    bin_dir: &Path,
    encap: Encap,
    seconds: u32,
    runs: usize,
) -> Result<Vec<f64>> {
    let _ = tern_lab::down(name);
    let mut o = UpOptions::new(name, bin_dir);
    o.nodes = 2;
    o.encap = encap;
    let result = (|| -> Result<Vec<f64>> {
        let mut st = topology::up(&o)?;
        // The hand-built path has no NAT; measure the same pod-to-pod path (a masquerading
        // pool would put every packet through conntrack on both sides).
        without_nat_outgoing(&st)?;
        let a = pod::add_pod(&mut st, "node1", "a")?;
        let b = pod::add_pod(&mut st, "node2", "b")?;
        wait_reachable(&st, "a", &b.addresses[0], Duration::from_secs(10))?;
        (0..runs)
            .map(|_| iperf(&b.netns, &a.netns, &b.addresses[0], seconds))
            .collect()
    })();
    let down = tern_lab::down(name);
    let v = result?;
    down?;
    Ok(v)
}

/// Turns natOutgoing off on the lab's default pool and gives the agents a moment to drop their
/// nat chain.
fn without_nat_outgoing(st: &LabState) -> Result<()> {
    let mut pool = tern_lab::cluster::default_pool(st, tern_model::defaults::IPV4_POOL);
    if let tern_model::Resource::IpPool(p) = &mut pool {
        p.spec.nat_outgoing = false;
    }
    tern_lab::cluster::with_store(st, move |s| {
        tern_model::put_resource(&*s, &pool)
            .map(drop)
            .map_err(|e| LabError::Invalid(format!("cannot update the default IPPool: {e}")))
    })?;
    std::thread::sleep(Duration::from_millis(500));
    Ok(())
}

/// Waits until `ip` answers (RST or accept) a TCP connection from pod `from`.
fn wait_reachable(st: &LabState, from: &str, ip: &str, timeout: Duration) -> Result<()> {
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| LabError::Invalid(format!("bad pod address {ip}")))?;
    let p = st.pod(from)?;
    let ok = netns::in_netns(&p.netns, || first_contact(ip, timeout))?;
    ok.map(drop).ok_or_else(|| {
        LabError::Timeout(format!(
            "{ip} not reachable from pod {from} within {timeout:?}"
        ))
    })
}

/// Tries TCP connections to `ip` (port 9, nobody listens) until one is answered, by a RST
/// (refused) or an accept; the time it took, or `None` after `timeout`.
pub fn first_contact(ip: IpAddr, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    let target = SocketAddr::new(ip, 9);
    while start.elapsed() < timeout {
        match TcpStream::connect_timeout(&target, Duration::from_millis(10)) {
            Ok(_) => return Some(start.elapsed()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Some(start.elapsed());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    None
}

/// A hand-built two-node path: underlay bridge, two nodes, a pod on each; routes by hand.
struct HandBuilt {
    prefix: String,
}

impl Drop for HandBuilt {
    fn drop(&mut self) {
        for ns in process::netns_with_prefix(&self.prefix) {
            let _ = netns_del(&ns);
        }
    }
}

/// Builds the hand-made path and returns the pods' namespaces and the server pod's address.
fn hand_built(name: &str, vxlan: bool) -> Result<(HandBuilt, String, String, String)> {
    let prefix = format!("tl-{name}-");
    let guard = HandBuilt {
        prefix: prefix.clone(),
    };
    for ns in process::netns_with_prefix(&prefix) {
        netns_del(&ns)?;
    }
    let ul = format!("{prefix}ul");
    netns_add(&ul)?;
    ip_in(&ul, &["link", "add", "br0", "type", "bridge"])?;
    ip_in(&ul, &["link", "set", "br0", "up"])?;
    let pod_ip = |i: usize| format!("10.250.{i}.2");
    let node_ip = |i: usize| format!("198.18.0.{}", 10 + i);
    let vtep_mac = |i: usize| format!("02:00:00:00:00:0{i}");
    let vtep_ip = |i: usize| format!("10.250.{i}.0");
    for i in [1usize, 2] {
        let node = format!("{prefix}node{i}");
        let pod = format!("{prefix}pod{i}");
        netns_add(&node)?;
        netns_add(&pod)?;
        ip_in(
            &ul,
            &[
                "link",
                "add",
                &format!("n{i}"),
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &node,
            ],
        )?;
        ip_in(
            &ul,
            &["link", "set", &format!("n{i}"), "master", "br0", "up"],
        )?;
        ip_in(
            &node,
            &["addr", "add", &format!("{}/24", node_ip(i)), "dev", "eth0"],
        )?;
        ip_in(&node, &["link", "set", "eth0", "up"])?;
        ip_in(&node, &["link", "set", "lo", "up"])?;
        sysctl_in(&node, "net.ipv4.ip_forward", "1")?;
        // Pod: /32 address, a link route to a node-side address and a default route via it.
        ip_in(
            &node,
            &[
                "link", "add", "hostveth", "type", "veth", "peer", "name", "eth0", "netns", &pod,
            ],
        )?;
        let mtu = if vxlan { "1450" } else { "1500" };
        ip_in(&node, &["link", "set", "hostveth", "mtu", mtu, "up"])?;
        ip_in(&node, &["addr", "add", "169.254.1.1/32", "dev", "hostveth"])?;
        ip_in(
            &node,
            &[
                "route",
                "add",
                &format!("{}/32", pod_ip(i)),
                "dev",
                "hostveth",
            ],
        )?;
        ip_in(&pod, &["link", "set", "lo", "up"])?;
        ip_in(&pod, &["link", "set", "eth0", "mtu", mtu, "up"])?;
        ip_in(
            &pod,
            &["addr", "add", &format!("{}/32", pod_ip(i)), "dev", "eth0"],
        )?;
        ip_in(
            &pod,
            &[
                "route",
                "add",
                "169.254.1.1",
                "dev",
                "eth0",
                "scope",
                "link",
            ],
        )?;
        ip_in(
            &pod,
            &[
                "route",
                "add",
                "default",
                "via",
                "169.254.1.1",
                "dev",
                "eth0",
            ],
        )?;
        if vxlan {
            ip_in(
                &node,
                &[
                    "link",
                    "add",
                    "vxlan.hand",
                    "type",
                    "vxlan",
                    "id",
                    "4096",
                    "dstport",
                    "4789",
                    "local",
                    &node_ip(i),
                    "dev",
                    "eth0",
                    "nolearning",
                ],
            )?;
            ip_in(
                &node,
                &[
                    "link",
                    "set",
                    "vxlan.hand",
                    "address",
                    &vtep_mac(i),
                    "mtu",
                    "1450",
                    "up",
                ],
            )?;
            ip_in(
                &node,
                &[
                    "addr",
                    "add",
                    &format!("{}/32", vtep_ip(i)),
                    "dev",
                    "vxlan.hand",
                ],
            )?;
        }
    }
    for (i, j) in [(1usize, 2usize), (2, 1)] {
        let node = format!("{prefix}node{i}");
        if vxlan {
            ip_in(
                &node,
                &[
                    "neigh",
                    "add",
                    &vtep_ip(j),
                    "lladdr",
                    &vtep_mac(j),
                    "dev",
                    "vxlan.hand",
                    "nud",
                    "permanent",
                ],
            )?;
            ip_in(&node, &["link", "set", "vxlan.hand", "up"])?;
            process::run(Command::new("bridge").args([
                "-n",
                &node,
                "fdb",
                "add",
                &vtep_mac(j),
                "dev",
                "vxlan.hand",
                "dst",
                &node_ip(j),
            ]))?;
        }
        // The other node's pod: through the tunnel (on-link via its VTEP) or the underlay.
        let (via, dev, onlink): (String, &str, &[&str]) = if vxlan {
            (vtep_ip(j), "vxlan.hand", &["onlink"])
        } else {
            (node_ip(j), "eth0", &[])
        };
        let dst = format!("{}/32", pod_ip(j));
        let mut route = vec!["route", "add", &dst, "via", &via, "dev", dev];
        route.extend(onlink);
        ip_in(&node, &route)?;
    }
    // The node answers ARP for 169.254.1.1 on the pod side: it owns that address there.
    Ok((
        guard,
        format!("{prefix}pod1"),
        format!("{prefix}pod2"),
        pod_ip(2),
    ))
}

fn hand_throughput(name: &str, vxlan: bool, seconds: u32, runs: usize) -> Result<Vec<f64>> {
    let (_guard, client, server, ip) = hand_built(name, vxlan)?;
    (0..runs)
        .map(|_| iperf(&server, &client, &ip, seconds))
        .collect()
}

/// Options of `tern-bench net`.
#[derive(Debug, Clone)]
pub struct NetBenchOptions {
    /// Directory with `tern`, `tern-ipam`, `ternd`.
    pub bin_dir: PathBuf,
    /// Seconds per iperf3 run.
    pub seconds: u32,
    /// Runs per path (the median is reported).
    pub runs: usize,
}

/// Runs the throughput comparison; one line per path, and the ratios.
pub fn run_net(o: &NetBenchOptions) -> Result<(Vec<Throughput>, String)> {
    if !Path::new(IPERF3).is_file() {
        return Err(LabError::Invalid(format!(
            "{IPERF3} not found (apt-get install iperf3)"
        )));
    }
    let mut all = Vec::new();
    for (mode, encap, vx) in [
        ("direct", Encap::None, false),
        ("vxlan", Encap::Vxlan, true),
    ] {
        let hand = hand_throughput("bnh", vx, o.seconds, o.runs)?;
        let tern = tern_throughput("bnt", &o.bin_dir, encap, o.seconds, o.runs)?;
        all.push(Throughput {
            mode,
            path: "hand-built",
            bits_per_second: median(&hand),
            runs: hand,
        });
        all.push(Throughput {
            mode,
            path: "tern",
            bits_per_second: median(&tern),
            runs: tern,
        });
    }
    let mut out = format!(
        "{:<8} {:<11} {:>12}  runs (Gbit/s)\n",
        "MODE", "PATH", "MEDIAN Gbit/s"
    );
    for t in &all {
        let runs: Vec<String> = t.runs.iter().map(|r| format!("{:.2}", r / 1e9)).collect();
        out.push_str(&format!(
            "{:<8} {:<11} {:>12.2}  {}\n",
            t.mode,
            t.path,
            t.bits_per_second / 1e9,
            runs.join(" ")
        ));
    }
    for mode in ["direct", "vxlan"] {
        let get = |p: &str| {
            all.iter()
                .find(|t| t.mode == mode && t.path == p)
                .map_or(0.0, |t| t.bits_per_second)
        };
        let ratio = if get("hand-built") > 0.0 {
            get("tern") / get("hand-built")
        } else {
            0.0
        };
        out.push_str(&format!(
            "{mode}: tern = {:.1}% of hand-built (target >= {:.0}%): {}\n",
            ratio * 100.0,
            THROUGHPUT_TARGET * 100.0,
            if ratio >= THROUGHPUT_TARGET {
                "PASS"
            } else {
                "MISS"
            }
        ));
    }
    Ok((all, out))
}

/// Options of `tern-bench converge`.
#[derive(Debug, Clone)]
pub struct ConvergeOptions {
    pub bin_dir: PathBuf,
    /// Pods added on node A.
    pub pods: usize,
    pub store: StoreKind,
    pub encap: Encap,
}

/// Result of `tern-bench converge`.
#[derive(Debug, Clone)]
pub struct ConvergeReport {
    /// Per pod: ADD start → first packet from node B.
    pub from_add: Vec<Duration>,
    /// Per pod: ADD duration.
    pub add: Vec<Duration>,
}

impl std::fmt::Display for ConvergeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let p99 = quantile(&self.from_add, 0.99);
        writeln!(
            f,
            "pods {}  ADD p50 {:.1} ms p99 {:.1} ms",
            self.add.len(),
            ms(quantile(&self.add, 0.5)),
            ms(quantile(&self.add, 0.99))
        )?;
        writeln!(
            f,
            "ADD start -> first packet from node B: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
            ms(quantile(&self.from_add, 0.5)),
            ms(p99),
            ms(quantile(&self.from_add, 1.0))
        )?;
        write!(
            f,
            "target p99 <= {} ms: {}",
            CONVERGE_P99_TARGET.as_millis(),
            if p99 <= CONVERGE_P99_TARGET {
                "PASS"
            } else {
                "MISS"
            }
        )
    }
}

/// Measures route convergence on a two-node lab.
pub fn run_converge(o: &ConvergeOptions) -> Result<ConvergeReport> {
    let name = "bcv";
    let _ = tern_lab::down(name);
    let mut up = UpOptions::new(name, &o.bin_dir);
    up.nodes = 2;
    up.encap = o.encap;
    up.store = o.store;
    let result = (|| {
        let mut st = topology::up(&up)?;
        pod::add_pod(&mut st, "node2", "probe")?;
        let probe_ns = st.pod("probe")?.netns.clone();
        let mut report = ConvergeReport {
            from_add: Vec::new(),
            add: Vec::new(),
        };
        for i in 0..o.pods {
            let start = Instant::now();
            let p = pod::add_pod(&mut st, "node1", &format!("c{i}"))?;
            let add = start.elapsed();
            let ip: IpAddr = p.addresses[0]
                .parse()
                .map_err(|_| LabError::Invalid(format!("bad address {:?}", p.addresses)))?;
            let first = netns::in_netns(&probe_ns, || first_contact(ip, Duration::from_secs(10)))?
                .ok_or_else(|| {
                    LabError::Timeout(format!(
                        "pod c{i} ({ip}) not reachable from node2 within 10 s"
                    ))
                })?;
            report.add.push(add);
            report.from_add.push(add + first);
        }
        let _ = mesh::routes(&st, "node2");
        Ok(report)
    })();
    let down = tern_lab::down(name);
    let r = result?;
    down?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&d, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&d, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&d, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn iperf_json() {
        let j = r#"{"start":{},"end":{"sum_sent":{"bits_per_second":9.5e9},
            "sum_received":{"bits_per_second":9.4e9}}}"#;
        assert_eq!(iperf_bps(j).unwrap(), 9.4e9);
        let e = iperf_bps(r#"{"error":"unable to connect to server"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unable to connect"), "{e}");
        assert!(iperf_bps("nope").is_err());
    }

    #[test]
    fn first_contact_counts_a_refusal_as_reached() {
        // Nothing listens on port 9 of loopback: the RST arrives at once.
        let d = first_contact("127.0.0.1".parse().unwrap(), Duration::from_secs(2));
        assert!(d.is_some_and(|d| d < Duration::from_secs(1)));
    }
}
