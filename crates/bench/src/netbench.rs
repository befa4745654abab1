//! Network benchmarks across lab nodes (`tern-bench net`, `tern-bench converge`).
//!
//! `net`: cross-node pod-to-pod TCP throughput with iperf3 and request/response latency (64-byte
//! round trips over one TCP connection, p50/p99), on a two-node tern lab (direct and VXLAN) side
//! by side with the same path built by hand with `ip` commands and no tern: a veth per pod, `/32`
//! (IPv6: `/128`) routes, and for VXLAN a device per node with static FDB/neighbour entries and
//! the MTU of the family's encapsulation (1450 = 1500-50 over IPv4, 1430 = 1500-70 over IPv6).
//! With IPv6 among the families (`--families v4,v6`) each mode's lab is one `--ip-family dual`
//! lab, so both families are measured on the same lab. `converge`: from the start of a pod's CNI ADD on node A to
//! the first packet from a pod on node B that reaches it (a TCP connection attempt to a closed
//! port: the pod's RST proves the packet arrived), p50/p99 over many pods.
//!
//! Everything lives in lab namespaces (`tl-<name>-...`), removed again on every path.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tern_lab::process::{self, ip_in, netns_add, netns_del, netns_exec, sysctl_in};
use tern_lab::state::{Encap, IpFamily, LabState, StoreKind, family_name};
use tern_lab::topology::{self, UpOptions};
use tern_lab::{LabError, Result, mesh, netns, pod};

/// The iperf3 binary.
pub const IPERF3: &str = "/usr/bin/iperf3";
/// Target: tern's throughput relative to the hand-built path.
pub const THROUGHPUT_TARGET: f64 = 0.95;
/// Target: p99 of route convergence.
pub const CONVERGE_P99_TARGET: Duration = Duration::from_millis(200);

/// Most request/response round trips kept per path (one 16-byte sample each); a run stops
/// measuring when it is reached.
pub const MAX_RR_SAMPLES: usize = 1_000_000;
/// Size of a request (and of its response) in the request/response measurement.
pub const RR_MESSAGE_BYTES: usize = 64;
/// Port of the request/response server in the server pod.
const RR_PORT: u16 = 7000;

/// One throughput measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Throughput {
    /// `direct` or `vxlan`.
    pub mode: &'static str,
    /// `IPv4` or `IPv6` ([`family_name`]).
    pub family: &'static str,
    /// `tern` or `hand-built`.
    pub path: &'static str,
    /// Median of the runs, bits per second.
    pub bits_per_second: f64,
    /// Every run.
    pub runs: Vec<f64>,
    /// Request/response round trips: p50 and p99 over every round trip of every run.
    pub rr: RrLatency,
}

/// p50 and p99 of request/response round trips.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RrLatency {
    pub p50: Duration,
    pub p99: Duration,
    /// Round trips measured.
    pub samples: usize,
}

impl RrLatency {
    /// The quantiles of `samples` (zero when empty).
    pub fn of(samples: &[Duration]) -> RrLatency {
        RrLatency {
            p50: quantile(samples, 0.5),
            p99: quantile(samples, 0.99),
            samples: samples.len(),
        }
    }
}

/// Parses one address family of `--families`: `v4`/`ipv4`/`4` or `v6`/`ipv6`/`6`; true for
/// IPv6 (as [`tern_lab::state::family_name`]).
pub fn parse_family(s: &str) -> std::result::Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "v4" | "ipv4" | "4" => Ok(false),
        "v6" | "ipv6" | "6" => Ok(true),
        other => Err(format!(
            "unknown address family {other:?} (expected v4 or v6)"
        )),
    }
}

/// The lab family that carries `families` (IPv4 first when both): the lab of each mode is
/// built once, dual stack when both families are measured; `None` when `families` is empty.
pub fn lab_family(families: &[bool]) -> Option<IpFamily> {
    match (families.contains(&false), families.contains(&true)) {
        (true, true) => Some(IpFamily::Dual),
        (true, false) => Some(IpFamily::Ipv4),
        (false, true) => Some(IpFamily::Ipv6),
        (false, false) => None,
    }
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

/// Request/response round trips from `client_ns` to a server started in `server_ns` at
/// `server_ip`: one TCP connection (no Nagle), [`RR_MESSAGE_BYTES`] each way, for `seconds`
/// (or until [`MAX_RR_SAMPLES`] in `into`); each round trip's time is pushed to `into`.
fn request_response(
    server_ns: &str,
    client_ns: &str,
    server_ip: IpAddr,
    seconds: u32,
    into: &mut Vec<Duration>,
) -> Result<()> {
    use std::io::{Read, Write};
    let bad = |e: anyhow::Error| LabError::Invalid(format!("request/response: {e:#}"));
    let server = crate::policybench::PpServer::start_at(
        server_ns,
        SocketAddr::new(server_ip, RR_PORT),
        None,
        crate::policybench::pp_echo,
    )
    .map_err(bad)?;
    let d = Duration::from_secs(seconds.into());
    let room = MAX_RR_SAMPLES.saturating_sub(into.len());
    let measured = netns::in_netns(client_ns, move || -> std::io::Result<Vec<Duration>> {
        let target = SocketAddr::new(server_ip, RR_PORT);
        let mut c = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [7u8; RR_MESSAGE_BYTES];
        let mut v = Vec::new();
        let start = Instant::now();
        while start.elapsed() < d && v.len() < room {
            let t = Instant::now();
            c.write_all(&buf)?;
            c.read_exact(&mut buf)?;
            v.push(t.elapsed());
        }
        Ok(v)
    });
    let stopped = server.stop().map_err(bad);
    let v = measured?
        .map_err(|e| LabError::Invalid(format!("request/response to {server_ip}: {e}")))?;
    stopped?;
    into.extend(v);
    Ok(())
}

/// Throughput runs and request/response latency of one path: `runs` times an iperf3 run and a
/// request/response run, each of `seconds`.
fn measure(
    server_ns: &str,
    client_ns: &str,
    server_ip: &str,
    seconds: u32,
    runs: usize,
) -> Result<(Vec<f64>, RrLatency)> {
    let ip: IpAddr = server_ip
        .parse()
        .map_err(|_| LabError::Invalid(format!("bad server address {server_ip}")))?;
    let mut bps = Vec::with_capacity(runs);
    let mut rr = Vec::new();
    for _ in 0..runs {
        bps.push(iperf(server_ns, client_ns, server_ip, seconds)?);
        request_response(server_ns, client_ns, ip, seconds, &mut rr)?;
    }
    Ok((bps, RrLatency::of(&rr)))
}

/// Measures tern on a two-node lab with encapsulation `encap`, in each of `families` (true:
/// IPv6) on the same lab: per family, the throughput runs and the request/response latency.
fn tern_throughput(
    name: &str,
    bin_dir: &Path,
    encap: Encap,
    families: &[bool],
    seconds: u32,
    runs: usize,
) -> Result<Vec<(Vec<f64>, RrLatency)>> {
    let family = lab_family(families)
        .ok_or_else(|| LabError::Invalid("no address family to measure".into()))?;
    let _ = tern_lab::down(name);
    let mut o = UpOptions::new(name, bin_dir);
    o.nodes = 2;
    o.encap = encap;
    o.ip_family = family;
    let result = (|| -> Result<Vec<(Vec<f64>, RrLatency)>> {
        let mut st = topology::up(&o)?;
        // The hand-built path has no NAT; measure the same pod-to-pod path (a masquerading
        // pool would put every packet through conntrack on both sides).
        without_nat_outgoing(&st)?;
        let a = pod::add_pod(&mut st, "node1", "a")?;
        let b = pod::add_pod(&mut st, "node2", "b")?;
        families
            .iter()
            .map(|&v6| {
                let ip = b
                    .addresses
                    .iter()
                    .find(|a| a.contains(':') == v6)
                    .ok_or_else(|| {
                        LabError::Invalid(format!(
                            "pod b has no {} address: {:?}",
                            family_name(v6),
                            b.addresses
                        ))
                    })?;
                wait_reachable(&st, "a", ip, Duration::from_secs(10))?;
                measure(&b.netns, &a.netns, ip, seconds, runs)
            })
            .collect()
    })();
    let down = tern_lab::down(name);
    let v = result?;
    down?;
    Ok(v)
}

/// Turns natOutgoing off on the lab's default pools and gives the agents a moment to drop their
/// nat chain.
fn without_nat_outgoing(st: &LabState) -> Result<()> {
    let cidrs = [
        st.ip_family.has_v4().then(|| {
            st.pool_cidr
                .as_deref()
                .unwrap_or(tern_model::defaults::IPV4_POOL)
        }),
        st.pool6_cidr.as_deref(),
    ];
    for cidr in cidrs.into_iter().flatten() {
        let mut pool = tern_lab::cluster::default_pool(st, cidr);
        if let tern_model::Resource::IpPool(p) = &mut pool {
            p.spec.nat_outgoing = false;
        }
        tern_lab::cluster::with_store(st, move |s| {
            tern_model::put_resource(&*s, &pool).map(drop).map_err(|e| {
                LabError::Invalid(format!("cannot update the default IPPool {cidr}: {e}"))
            })
        })?;
    }
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

/// Addresses and sizes of a hand-built path in one family.
struct HandPlan {
    v6: bool,
    vxlan: bool,
}

impl HandPlan {
    /// Node `i`'s underlay address (as the lab's: 198.18.0.<10+i>, 2001:db8::<10+i>).
    fn node_ip(&self, i: usize) -> String {
        if self.v6 {
            format!("2001:db8::{}", 10 + i)
        } else {
            format!("198.18.0.{}", 10 + i)
        }
    }
    fn node_prefix(&self) -> &'static str {
        if self.v6 { "64" } else { "24" }
    }
    fn pod_ip(&self, i: usize) -> String {
        if self.v6 {
            format!("fd00:250:{i}::2")
        } else {
            format!("10.250.{i}.2")
        }
    }
    /// A host route's prefix length.
    fn host(&self) -> &'static str {
        if self.v6 { "128" } else { "32" }
    }
    /// The pod's gateway, owned by the node side of the pod's veth.
    fn gateway(&self) -> &'static str {
        if self.v6 { "fe80::1" } else { "169.254.1.1" }
    }
    fn vtep_ip(&self, i: usize) -> String {
        if self.v6 {
            format!("fd00:250:{i}::")
        } else {
            format!("10.250.{i}.0")
        }
    }
    fn vtep_mac(&self, i: usize) -> String {
        format!("02:00:00:00:00:0{i}")
    }
    /// The pods' MTU: 1500 direct, less the VXLAN overhead of the underlay's family (50 over
    /// IPv4, 70 over IPv6), as tern's.
    fn mtu(&self) -> &'static str {
        match (self.vxlan, self.v6) {
            (false, _) => "1500",
            (true, false) => "1450",
            (true, true) => "1430",
        }
    }
    /// `ip` with the family's option (`-4`/`-6`: `default` and `nodad` need it).
    fn ip(&self, ns: &str, args: &[&str]) -> Result<String> {
        let mut a = vec![if self.v6 { "-6" } else { "-4" }];
        a.extend(args);
        ip_in(ns, &a)
    }
    /// Adds `addr` to `dev`; IPv6 ones `nodad`, usable at once.
    fn addr(&self, ns: &str, addr: &str, dev: &str) -> Result<String> {
        let mut a = vec!["addr", "add", addr, "dev", dev];
        if self.v6 {
            a.push("nodad");
        }
        self.ip(ns, &a)
    }
}

/// Builds the hand-made path in one family (IPv6 when `v6`) and returns the pods' namespaces
/// and the server pod's address.
fn hand_built(name: &str, vxlan: bool, v6: bool) -> Result<(HandBuilt, String, String, String)> {
    let prefix = format!("tl-{name}-");
    let guard = HandBuilt {
        prefix: prefix.clone(),
    };
    for ns in process::netns_with_prefix(&prefix) {
        netns_del(&ns)?;
    }
    let h = HandPlan { v6, vxlan };
    let ul = format!("{prefix}ul");
    netns_add(&ul)?;
    ip_in(&ul, &["link", "add", "br0", "type", "bridge"])?;
    ip_in(&ul, &["link", "set", "br0", "up"])?;
    let mtu = h.mtu();
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
        h.addr(
            &node,
            &format!("{}/{}", h.node_ip(i), h.node_prefix()),
            "eth0",
        )?;
        ip_in(&node, &["link", "set", "eth0", "up"])?;
        ip_in(&node, &["link", "set", "lo", "up"])?;
        if v6 {
            sysctl_in(&node, "net.ipv6.conf.all.forwarding", "1")?;
        } else {
            sysctl_in(&node, "net.ipv4.ip_forward", "1")?;
        }
        // Pod: a host address, a link route to a node-side address and a default route via it.
        ip_in(
            &node,
            &[
                "link", "add", "hostveth", "type", "veth", "peer", "name", "eth0", "netns", &pod,
            ],
        )?;
        ip_in(&node, &["link", "set", "hostveth", "mtu", mtu, "up"])?;
        let gw = h.gateway();
        let gw_prefix = if v6 { "64" } else { "32" };
        h.addr(&node, &format!("{gw}/{gw_prefix}"), "hostveth")?;
        let pod_host = format!("{}/{}", h.pod_ip(i), h.host());
        h.ip(&node, &["route", "add", &pod_host, "dev", "hostveth"])?;
        ip_in(&pod, &["link", "set", "lo", "up"])?;
        ip_in(&pod, &["link", "set", "eth0", "mtu", mtu, "up"])?;
        h.addr(&pod, &pod_host, "eth0")?;
        if v6 {
            // A link-local address of its own (nodad) for the neighbour exchange with the
            // gateway; fe80::/64 is on-link with it.
            h.addr(&pod, "fe80::2/64", "eth0")?;
        } else {
            ip_in(&pod, &["route", "add", gw, "dev", "eth0", "scope", "link"])?;
        }
        h.ip(&pod, &["route", "add", "default", "via", gw, "dev", "eth0"])?;
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
                    &h.node_ip(i),
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
                    &h.vtep_mac(i),
                    "mtu",
                    mtu,
                    "up",
                ],
            )?;
            h.addr(
                &node,
                &format!("{}/{}", h.vtep_ip(i), h.host()),
                "vxlan.hand",
            )?;
        }
    }
    for (i, j) in [(1usize, 2usize), (2, 1)] {
        let node = format!("{prefix}node{i}");
        if vxlan {
            h.ip(
                &node,
                &[
                    "neigh",
                    "add",
                    &h.vtep_ip(j),
                    "lladdr",
                    &h.vtep_mac(j),
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
                &h.vtep_mac(j),
                "dev",
                "vxlan.hand",
                "dst",
                &h.node_ip(j),
            ]))?;
        }
        // The other node's pod: through the tunnel (on-link via its VTEP) or the underlay.
        let (via, dev, onlink): (String, &str, &[&str]) = if vxlan {
            (h.vtep_ip(j), "vxlan.hand", &["onlink"])
        } else {
            (h.node_ip(j), "eth0", &[])
        };
        let dst = format!("{}/{}", h.pod_ip(j), h.host());
        let mut route = vec!["route", "add", &dst, "via", &via, "dev", dev];
        route.extend(onlink);
        h.ip(&node, &route)?;
    }
    // The node answers ARP / neighbour solicitations for the gateway on the pod side: it owns
    // that address there.
    Ok((
        guard,
        format!("{prefix}pod1"),
        format!("{prefix}pod2"),
        h.pod_ip(2),
    ))
}

fn hand_throughput(
    name: &str,
    vxlan: bool,
    v6: bool,
    seconds: u32,
    runs: usize,
) -> Result<(Vec<f64>, RrLatency)> {
    let (_guard, client, server, ip) = hand_built(name, vxlan, v6)?;
    // Neighbour discovery across the bridge (IPv6: after the nodes' router advertisements
    // settle) takes a moment the first time.
    let addr: IpAddr = ip
        .parse()
        .map_err(|_| LabError::Invalid(format!("bad pod address {ip}")))?;
    netns::in_netns(&client, || first_contact(addr, Duration::from_secs(10)))?
        .ok_or_else(|| LabError::Timeout(format!("hand-built {ip} not reachable within 10 s")))?;
    measure(&server, &client, &ip, seconds, runs)
}

/// Options of `tern-bench net`.
#[derive(Debug, Clone)]
pub struct NetBenchOptions {
    /// Directory with `tern`, `tern-ipam`, `ternd`.
    pub bin_dir: PathBuf,
    /// Seconds per iperf3 run (and per request/response run).
    pub seconds: u32,
    /// Runs per path (the median is reported).
    pub runs: usize,
    /// Address families to measure (true: IPv6), each once; with both, each mode's lab is
    /// dual stack.
    pub families: Vec<bool>,
}

/// Runs the throughput comparison; one line per path, and the ratios.
pub fn run_net(o: &NetBenchOptions) -> Result<(Vec<Throughput>, String)> {
    if !Path::new(IPERF3).is_file() {
        return Err(LabError::Invalid(format!(
            "{IPERF3} not found (apt-get install iperf3)"
        )));
    }
    let mut families = o.families.clone();
    families.sort();
    families.dedup();
    if families.is_empty() {
        return Err(LabError::Invalid("no address family to measure".into()));
    }
    let mut all = Vec::new();
    for (mode, encap, vx) in [
        ("direct", Encap::None, false),
        ("vxlan", Encap::Vxlan, true),
    ] {
        let mut hand = Vec::new();
        for &v6 in &families {
            hand.push(hand_throughput("bnh", vx, v6, o.seconds, o.runs)?);
        }
        let tern = tern_throughput("bnt", &o.bin_dir, encap, &families, o.seconds, o.runs)?;
        for ((&v6, (hand, hand_rr)), (tern, tern_rr)) in families.iter().zip(hand).zip(tern) {
            let family = family_name(v6);
            all.push(Throughput {
                mode,
                family,
                path: "hand-built",
                bits_per_second: median(&hand),
                runs: hand,
                rr: hand_rr,
            });
            all.push(Throughput {
                mode,
                family,
                path: "tern",
                bits_per_second: median(&tern),
                runs: tern,
                rr: tern_rr,
            });
        }
    }
    let table = render_net(&all);
    Ok((all, table))
}

/// The report of `tern-bench net`: the IPv4 table as it always was (throughput runs and the
/// ratio to hand-built per mode), then every family's rows with request/response latency and
/// the ratios of the other families.
pub fn render_net(all: &[Throughput]) -> String {
    let v4_name = family_name(false);
    let gbit = |t: &Throughput| t.bits_per_second / 1e9;
    let ratio_line = |mode: &str, family: Option<&str>| -> Option<String> {
        let get = |p: &str| {
            all.iter()
                .find(|t| t.mode == mode && t.family == family.unwrap_or(v4_name) && t.path == p)
                .map(|t| t.bits_per_second)
        };
        let (hand, tern) = (get("hand-built")?, get("tern")?);
        let ratio = if hand > 0.0 { tern / hand } else { 0.0 };
        let label = family.map_or(mode.to_string(), |f| format!("{mode} {f}"));
        Some(format!(
            "{label}: tern = {:.1}% of hand-built (target >= {:.0}%): {}\n",
            ratio * 100.0,
            THROUGHPUT_TARGET * 100.0,
            if ratio >= THROUGHPUT_TARGET {
                "PASS"
            } else {
                "MISS"
            }
        ))
    };
    let mut out = String::new();
    let v4: Vec<&Throughput> = all.iter().filter(|t| t.family == v4_name).collect();
    if !v4.is_empty() {
        out.push_str(&format!(
            "{:<8} {:<11} {:>12}  runs (Gbit/s)\n",
            "MODE", "PATH", "MEDIAN Gbit/s"
        ));
        for t in &v4 {
            let runs: Vec<String> = t.runs.iter().map(|r| format!("{:.2}", r / 1e9)).collect();
            out.push_str(&format!(
                "{:<8} {:<11} {:>12.2}  {}\n",
                t.mode,
                t.path,
                gbit(t),
                runs.join(" ")
            ));
        }
        for mode in ["direct", "vxlan"] {
            out.extend(ratio_line(mode, None));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "{:<8} {:<6} {:<11} {:>13}  {:>16}\n",
        "MODE", "FAMILY", "PATH", "MEDIAN Gbit/s", "RR p50/p99 us"
    ));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for t in all {
        out.push_str(&format!(
            "{:<8} {:<6} {:<11} {:>13.2}  {:>16}\n",
            t.mode,
            t.family,
            t.path,
            gbit(t),
            format!("{:.0}/{:.0}", us(t.rr.p50), us(t.rr.p99))
        ));
    }
    for mode in ["direct", "vxlan"] {
        out.extend(ratio_line(mode, Some(family_name(true))));
    }
    out
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
    fn families_parse_and_pick_the_lab() {
        assert_eq!(parse_family("v4"), Ok(false));
        assert_eq!(parse_family(" IPv6 "), Ok(true));
        assert_eq!(parse_family("6"), Ok(true));
        let e = parse_family("v5").unwrap_err();
        assert!(e.contains("v5") && e.contains("v4 or v6"), "{e}");
        assert_eq!(lab_family(&[false]), Some(IpFamily::Ipv4));
        assert_eq!(lab_family(&[true]), Some(IpFamily::Ipv6));
        assert_eq!(lab_family(&[true, false]), Some(IpFamily::Dual));
        assert_eq!(lab_family(&[]), None);
    }

    #[test]
    fn request_response_quantiles() {
        let d: Vec<Duration> = (1..=1000).rev().map(Duration::from_micros).collect();
        let rr = RrLatency::of(&d);
        assert_eq!(rr.p50, Duration::from_micros(500));
        assert_eq!(rr.p99, Duration::from_micros(990));
        assert_eq!(rr.samples, 1000);
        assert_eq!(RrLatency::of(&[]), RrLatency::default());
    }

    fn row(mode: &'static str, family: &'static str, path: &'static str, g: f64) -> Throughput {
        Throughput {
            mode,
            family,
            path,
            bits_per_second: g * 1e9,
            runs: vec![g * 1e9],
            rr: RrLatency {
                p50: Duration::from_micros(40),
                p99: Duration::from_micros(95),
                samples: 10,
            },
        }
    }

    #[test]
    fn report_keeps_the_ipv4_table_and_adds_family_rows() {
        let all = [
            row("direct", "IPv4", "hand-built", 8.0),
            row("direct", "IPv4", "tern", 7.9),
            row("direct", "IPv6", "hand-built", 8.0),
            row("direct", "IPv6", "tern", 6.0),
        ];
        let out = render_net(&all);
        assert!(
            out.contains("MODE     PATH        MEDIAN Gbit/s  runs (Gbit/s)\n"),
            "{out}"
        );
        assert!(
            out.contains("direct   tern                7.90  7.90\n"),
            "{out}"
        );
        assert!(out.contains("direct: tern = 98.8% of hand-built (target >= 95%): PASS"));
        assert!(out.contains("MODE     FAMILY PATH        MEDIAN Gbit/s     RR p50/p99 us"));
        assert!(out.contains("direct   IPv6   tern                 6.00             40/95\n"));
        assert!(out.contains("direct IPv6: tern = 75.0% of hand-built (target >= 95%): MISS"));
        // No vxlan rows measured: no vxlan ratio.
        assert!(!out.contains("vxlan"), "{out}");
        // IPv6 alone: no IPv4 table.
        let v6 = render_net(&all[2..]);
        assert!(
            !v6.contains("runs (Gbit/s)") && v6.contains("direct IPv6:"),
            "{v6}"
        );
    }

    #[test]
    fn first_contact_counts_a_refusal_as_reached() {
        // Nothing listens on port 9 of loopback: the RST arrives at once.
        let d = first_contact("127.0.0.1".parse().unwrap(), Duration::from_secs(2));
        assert!(d.is_some_and(|d| d < Duration::from_secs(1)));
    }
}
