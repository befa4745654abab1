//! Creating, describing and removing a lab: the underlay, the nodes and their agents.
//!
//! Underlay layouts (all inside the lab's namespaces):
//!
//! ```text
//! flat (encap none|vxlan|ipip)         crosssubnet
//!   tl-<lab>-ul  br0 198.18.0.1/24       tl-<lab>-ul  br1 (198.18.1.0/24)  br2 (198.18.2.0/24)
//!     nodeN  198.18.0.(10+N)                            |                  |
//!     etcd   198.18.0.2                  tl-<lab>-rtr  eth1 198.18.1.1    eth2 198.18.2.1
//!                                          odd nodes on br1 198.18.1.(10+N), even on br2
//!                                          etcd on br1 198.18.1.2
//! ```
//!
//! `--ip-family ipv6` puts the same layout in IPv6 (documentation range, addresses added
//! `nodad`): br0 2001:db8::1/64, nodeN 2001:db8::<10+N>, etcd 2001:db8::2; cross-subnet
//! 2001:db8:1::/64 and 2001:db8:2::/64, the router at ::1 of each. `dual` gives every node,
//! the router and the etcd both (the etcd's clients use its IPv4 address).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::addon::Addon;
use crate::process::{self, ip_in, netns_add, netns_del, netns_exec, sysctl_in};
use crate::state::{self, Encap, EtcdState, IpFamily, LabState, NodeState, StoreKind};
use crate::{LabError, Result, cluster, pki};

/// Address of the underlay bridge: the nodes' default gateway.
pub const UNDERLAY_GATEWAY: &str = "198.18.0.1";
/// Prefix length of the underlay subnet.
pub const UNDERLAY_PREFIX: u8 = 24;
/// Address of the IPv6 underlay bridge: the nodes' IPv6 default gateway (flat labs).
pub const UNDERLAY_GATEWAY6: &str = "2001:db8::1";
/// Prefix length of the IPv6 underlay subnets.
pub const UNDERLAY_PREFIX6: u8 = 64;
/// Most nodes a lab may have (addresses 198.18.0.11 ..).
pub const MAX_NODES: usize = 200;
/// The etcd binary the lab runs for `--store etcd`.
pub const ETCD_BIN: &str = "/usr/bin/etcd";

/// How to build a lab.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// Lab name (see [`state::validate_name`]).
    pub name: String,
    /// Number of nodes.
    pub nodes: usize,
    /// Directory holding `tern`, `tern-ipam` and `ternd`.
    pub bin_dir: PathBuf,
    /// `--default-ipv4-pool` passed to every agent, when set; also the CIDR of the pool the
    /// lab applies when `encap` asks for one.
    pub default_ipv4_pool: Option<String>,
    /// How long to wait for each agent's socket.
    pub agent_timeout: Duration,
    /// Encapsulation between nodes (and the underlay layout for `Crosssubnet`).
    pub encap: Encap,
    /// Datastore shared by the agents. [`StoreKind::Kubernetes`] is the API server of the
    /// cluster `kube::up` builds next: until then the lab has no store, so `up` starts no
    /// agent and writes no pool (`kube::up` does, and installs tern's DaemonSet).
    pub store: StoreKind,
    /// `--resync-seconds` of every agent, when set.
    pub resync_seconds: Option<u64>,
    /// Further arguments given to every agent.
    pub agent_args: Vec<String>,
    /// Serve the lab's etcd over TLS and require client certificates (`--client-cert-auth`):
    /// a CA, the server's and a client certificate under `<lab dir>/etcd-pki`, which every
    /// client of the store (agents, the lab, the DaemonSet's Secret) uses. Needs `store` etcd.
    pub etcd_tls: bool,
    /// Address families of the underlay, the pools and the pods (default IPv4).
    pub ip_family: IpFamily,
    /// `--default-ipv6-pool` passed to every agent, when set; also the CIDR of the IPv6 pool
    /// the lab applies when it has IPv6 (default [`tern_model::defaults::IPV6_POOL`]).
    pub default_ipv6_pool: Option<String>,
}

impl UpOptions {
    /// One node, binaries from `bin_dir`, agent defaults.
    pub fn new(name: &str, bin_dir: &Path) -> UpOptions {
        UpOptions {
            name: name.to_string(),
            nodes: 1,
            bin_dir: bin_dir.to_path_buf(),
            default_ipv4_pool: None,
            agent_timeout: Duration::from_secs(15),
            encap: Encap::None,
            store: StoreKind::Sqlite,
            resync_seconds: None,
            agent_args: Vec::new(),
            etcd_tls: false,
            ip_family: IpFamily::Ipv4,
            default_ipv6_pool: None,
        }
    }
}

/// Underlay address of node `i` (1-based) in a flat lab.
pub fn node_address(i: usize) -> String {
    underlay_host(0, false, 10 + i)
}

/// Where node `i` (1-based) sits on the underlay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node's address.
    pub address: String,
    /// Its default gateway (the underlay bridge, or the router for cross-subnet).
    pub gateway: String,
    /// The bridge in the underlay namespace its veth joins.
    pub bridge: String,
    /// Prefix length of its subnet.
    pub prefix_len: u8,
}

/// Placement of node `i`: one subnet, or (cross-subnet) odd nodes in 198.18.1.0/24 and even
/// nodes in 198.18.2.0/24.
pub fn placement(encap: Encap, i: usize) -> Placement {
    placement_in(encap, i, false)
}

/// IPv6 placement of node `i`, as [`placement`]: flat 2001:db8::<10+i>/64, or (cross-subnet)
/// odd nodes in 2001:db8:1::/64 and even nodes in 2001:db8:2::/64. The node number is written
/// as the last group's digits (node 1 is 2001:db8::11), as the IPv4 address's last number.
pub fn placement6(encap: Encap, i: usize) -> Placement {
    placement_in(encap, i, true)
}

/// Placement of node `i` in family `v6`: subnet 0 (flat, `br0`) or, cross-subnet, 1 for odd
/// and 2 for even nodes (`br1`, `br2`); the gateway is host 1 of the subnet.
fn placement_in(encap: Encap, i: usize, v6: bool) -> Placement {
    let subnet = match encap {
        Encap::Crosssubnet => 1 + (i + 1) % 2,
        _ => 0,
    };
    Placement {
        address: underlay_host(subnet, v6, 10 + i),
        gateway: underlay_host(subnet, v6, 1),
        bridge: format!("br{subnet}"),
        prefix_len: if v6 {
            UNDERLAY_PREFIX6
        } else {
            UNDERLAY_PREFIX
        },
    }
}

/// Address `host` of underlay subnet `subnet` (0: flat) in family `v6`: 198.18.<subnet>.<host>
/// or 2001:db8:<subnet>::<host> (2001:db8::<host> on subnet 0).
fn underlay_host(subnet: usize, v6: bool, host: usize) -> String {
    match (v6, subnet) {
        (false, _) => format!("198.18.{subnet}.{host}"),
        (true, 0) => format!("2001:db8::{host}"),
        (true, _) => format!("2001:db8:{subnet}::{host}"),
    }
}

/// Every placement of node `i` in a lab of `family`: IPv4 first, then IPv6.
pub fn placements(family: IpFamily, encap: Encap, i: usize) -> Vec<Placement> {
    family
        .families()
        .into_iter()
        .map(|v6| placement_in(encap, i, v6))
        .collect()
}

/// Placement of the etcd server.
pub fn etcd_placement(encap: Encap) -> Placement {
    etcd_placement_in(encap, false)
}

/// Placement of the etcd server in family `v6`: host 2 of node 1's subnet.
fn etcd_placement_in(encap: Encap, v6: bool) -> Placement {
    let mut p = placement_in(encap, 1, v6);
    let subnet = if encap == Encap::Crosssubnet { 1 } else { 0 };
    p.address = underlay_host(subnet, v6, 2);
    p
}

/// Every placement of the etcd server in a lab of `family` (IPv4 first): its clients use
/// the first one.
pub fn etcd_placements(family: IpFamily, encap: Encap) -> Vec<Placement> {
    family
        .families()
        .into_iter()
        .map(|v6| etcd_placement_in(encap, v6))
        .collect()
}

/// Whether the kernel can create links of `kind` (`vxlan`, `ipip`, ...). Tries in a private
/// network namespace of a dedicated thread, so nothing outside it is touched.
pub fn kernel_supports(kind: &str) -> Result<bool> {
    let kind = kind.to_string();
    let probe = tern_linux::netns::run_in_new(move || {
        let mut args = vec!["link", "add", "tprobe0", "type", kind.as_str()];
        if kind == "vxlan" {
            args.extend(["id", "42", "dstport", "4789"]);
        }
        // `ip` inherits this thread's namespace.
        let out = process::output(std::process::Command::new("ip").args(&args))?;
        Ok(out.status.success())
    });
    match probe {
        Ok((_ns, supported)) => supported,
        Err(tern_linux::LinuxError::Io { source, .. }) => Err(LabError::io(
            "cannot create a private network namespace",
            source,
        )),
        Err(e) => Err(LabError::Invalid(format!(
            "cannot create a private network namespace: {e}"
        ))),
    }
}

/// Builds the lab and starts one agent per node (none on the Kubernetes datastore, see
/// [`UpOptions::store`]). The state file is updated after every step, so on error [`down`]
/// removes whatever was created.
pub fn up(opts: &UpOptions) -> Result<LabState> {
    state::validate_name(&opts.name)?;
    if opts.nodes == 0 || opts.nodes > MAX_NODES {
        return Err(LabError::Invalid(format!(
            "a lab has 1 to {MAX_NODES} nodes, not {}",
            opts.nodes
        )));
    }
    for bin in ["ternd", "tern", "tern-ipam"] {
        let p = opts.bin_dir.join(bin);
        if !p.is_file() {
            return Err(LabError::Invalid(format!(
                "{} not found (build the workspace, or pass --bin-dir)",
                p.display()
            )));
        }
    }
    if opts.etcd_tls && opts.store != StoreKind::Etcd {
        return Err(LabError::Invalid(
            "--etcd-tls is for the lab's etcd: add --store etcd".to_string(),
        ));
    }
    if opts.encap == Encap::Ipip && opts.ip_family == IpFamily::Ipv6 {
        return Err(LabError::Invalid(
            "--encap ipip carries IPv4 only (IPv6 pools cannot use IPIP, as Calico's); an \
             IPv6-only lab takes --encap none or vxlan"
                .to_string(),
        ));
    }
    if opts.default_ipv6_pool.is_some() && !opts.ip_family.has_v6() {
        return Err(LabError::Invalid(
            "--default-ipv6-pool needs a lab with IPv6: add --ip-family ipv6 or dual".to_string(),
        ));
    }
    if opts.default_ipv4_pool.is_some() && !opts.ip_family.has_v4() {
        return Err(LabError::Invalid(
            "--default-ipv4-pool needs a lab with IPv4 (--ip-family ipv4 or dual)".to_string(),
        ));
    }
    for (flag, cidr, v6) in [
        ("--default-ipv4-pool", &opts.default_ipv4_pool, false),
        ("--default-ipv6-pool", &opts.default_ipv6_pool, true),
    ] {
        if let Some(c) = cidr {
            match c.parse::<ipnet::IpNet>() {
                Ok(n) if n.addr().is_ipv6() == v6 => {}
                _ => {
                    return Err(LabError::Invalid(format!(
                        "{flag} {c:?} is not an {} CIDR",
                        state::family_name(v6)
                    )));
                }
            }
        }
    }
    if opts.store == StoreKind::Etcd && !Path::new(ETCD_BIN).is_file() {
        return Err(LabError::Invalid(format!(
            "--store etcd needs {ETCD_BIN} (apt-get install etcd-server)"
        )));
    }
    if LabState::load(&opts.name)?.is_some() {
        return Err(LabError::Invalid(format!(
            "lab {:?} already exists; remove it with `ternctl lab down --name {}`",
            opts.name, opts.name
        )));
    }
    let leftovers = process::netns_with_prefix(&state::ns_prefix(&opts.name));
    if !leftovers.is_empty() {
        return Err(LabError::Invalid(format!(
            "namespaces of lab {:?} still exist ({}); run `ternctl lab down --name {}`",
            opts.name,
            leftovers.join(", "),
            opts.name
        )));
    }
    let encap_link = match opts.encap {
        Encap::Vxlan | Encap::Crosssubnet => Some("vxlan"),
        Encap::Ipip => Some("ipip"),
        Encap::None => None,
    };
    if let Some(kind) = encap_link
        && !kernel_supports(kind)?
    {
        return Err(LabError::Invalid(format!(
            "this kernel cannot create {kind} devices (no {kind} support), so --encap {} \
             cannot work here",
            opts.encap
        )));
    }
    let family = opts.ip_family;
    let cidr = family.has_v4().then(|| {
        opts.default_ipv4_pool
            .as_deref()
            .unwrap_or(tern_model::defaults::IPV4_POOL)
    });
    let cidr6 = family.has_v6().then(|| {
        opts.default_ipv6_pool
            .as_deref()
            .unwrap_or(tern_model::defaults::IPV6_POOL)
    });
    let mut st = LabState::new(&opts.name, &opts.bin_dir);
    st.encap = opts.encap;
    st.store = opts.store;
    st.ip_family = family;
    st.pool_cidr = cidr.map(str::to_string);
    st.pool6_cidr = cidr6.map(str::to_string);
    if let Some(pool) = &opts.default_ipv4_pool {
        st.agent_args
            .extend(["--default-ipv4-pool".to_string(), pool.clone()]);
    }
    if let Some(pool) = &opts.default_ipv6_pool {
        st.agent_args
            .extend(["--default-ipv6-pool".to_string(), pool.clone()]);
    }
    if !family.has_v4() {
        // An IPv6-only lab: no agent creates an IPv4 pool of its own.
        st.agent_args.push("--no-default-ipv4-pool".to_string());
    }
    if let Some(r) = opts.resync_seconds {
        st.agent_args
            .extend(["--resync-seconds".to_string(), r.to_string()]);
    }
    st.agent_args.extend(opts.agent_args.iter().cloned());
    st.save()?;

    build_underlay(&mut st)?;
    if opts.store == StoreKind::Etcd {
        start_etcd(&mut st, opts.etcd_tls)?;
    }
    // The pool decides the encapsulation; it exists before any agent could create its own.
    // The Kubernetes datastore is not up yet: `kube::up` applies it there.
    if host_agents(&st) {
        for c in cidr.into_iter().chain(cidr6) {
            cluster::apply_default_pool(&st, c)?;
        }
    }

    for i in 1..=opts.nodes {
        add_node(&mut st, i)?;
    }
    for n in &st.nodes {
        if n.ternd_pid.is_some() {
            wait_for_agent(n, opts.agent_timeout)?;
        }
    }
    Ok(st)
}

fn build_underlay(st: &mut LabState) -> Result<()> {
    let ul = state::underlay_ns(&st.name);
    netns_add(&ul)?;
    st.namespaces.push(ul.clone());
    st.save()?;
    ip_in(&ul, &["link", "set", "lo", "up"])?;
    let family = st.ip_family;
    if st.encap != Encap::Crosssubnet {
        ip_in(&ul, &["link", "add", "br0", "type", "bridge"])?;
        if family.has_v4() {
            let gw = format!("{UNDERLAY_GATEWAY}/{UNDERLAY_PREFIX}");
            ip_in(&ul, &["addr", "add", &gw, "dev", "br0"])?;
        }
        if family.has_v6() {
            let gw = format!("{UNDERLAY_GATEWAY6}/{UNDERLAY_PREFIX6}");
            add_address(&ul, &gw, "br0")?;
        }
        ip_in(&ul, &["link", "set", "br0", "up"])?;
        return Ok(());
    }
    // Two L2 segments with no address in the underlay namespace: only the router joins them.
    let rtr = state::router_ns(&st.name);
    netns_add(&rtr)?;
    st.namespaces.push(rtr.clone());
    st.save()?;
    ip_in(&rtr, &["link", "set", "lo", "up"])?;
    for subnet in [1, 2] {
        let br = format!("br{subnet}");
        let ul_end = format!("r{subnet}");
        let rtr_end = format!("eth{subnet}");
        ip_in(&ul, &["link", "add", &br, "type", "bridge"])?;
        ip_in(&ul, &["link", "set", &br, "up"])?;
        ip_in(
            &ul,
            &[
                "link", "add", &ul_end, "type", "veth", "peer", "name", &rtr_end, "netns", &rtr,
            ],
        )?;
        ip_in(&ul, &["link", "set", &ul_end, "master", &br, "up"])?;
        if family.has_v4() {
            let addr = format!("198.18.{subnet}.1/{UNDERLAY_PREFIX}");
            ip_in(&rtr, &["addr", "add", &addr, "dev", &rtr_end])?;
        }
        if family.has_v6() {
            let addr = format!("2001:db8:{subnet}::1/{UNDERLAY_PREFIX6}");
            add_address(&rtr, &addr, &rtr_end)?;
        }
        ip_in(&rtr, &["link", "set", &rtr_end, "up"])?;
    }
    sysctl_in(&rtr, "net.ipv4.ip_forward", "1")?;
    if family.has_v6() {
        sysctl_in(&rtr, "net.ipv6.conf.all.forwarding", "1")?;
    }
    Ok(())
}

/// Adds `addr` (with prefix) to `dev` in `ns`; an IPv6 address `nodad`, usable at once (the
/// lab's addresses are unique by construction).
pub(crate) fn add_address(ns: &str, addr: &str, dev: &str) -> Result<()> {
    if addr.contains(':') {
        ip_in(ns, &["-6", "addr", "add", addr, "dev", dev, "nodad"]).map(drop)
    } else {
        ip_in(ns, &["addr", "add", addr, "dev", dev]).map(drop)
    }
}

/// Plugs namespace `ns` into the underlay: a veth `ul_end` on the first placement's bridge
/// in the underlay namespace, and for every placement of `places` (one per family, on the
/// same bridge) its address on `eth0` in `ns` and a default route of its family via its
/// gateway.
pub(crate) fn plug_all(st: &LabState, ns: &str, ul_end: &str, places: &[Placement]) -> Result<()> {
    let Some(first) = places.first() else {
        return Err(LabError::Invalid(format!("{ns}: no underlay address")));
    };
    let ul = state::underlay_ns(&st.name);
    // The veth's inner end is created directly inside `ns`, named eth0 there.
    ip_in(
        &ul,
        &[
            "link", "add", ul_end, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ],
    )?;
    ip_in(&ul, &["link", "set", ul_end, "master", &first.bridge, "up"])?;
    ip_in(ns, &["link", "set", "lo", "up"])?;
    for p in places {
        add_address(ns, &format!("{}/{}", p.address, p.prefix_len), "eth0")?;
    }
    ip_in(ns, &["link", "set", "eth0", "up"])?;
    for p in places {
        let fam = if p.gateway.contains(':') { "-6" } else { "-4" };
        ip_in(ns, &[fam, "route", "add", "default", "via", &p.gateway])?;
    }
    Ok(())
}

/// The lab etcd's PKI in `dir` ([`crate::pki`], as the Kubernetes cluster's): a CA,
/// the server's certificate for `address` and a client certificate. The server's pair and
/// the client's files.
fn etcd_pki(dir: &Path, address: &str) -> Result<(pki::CertPair, state::EtcdTlsFiles)> {
    use crate::pki::CertSpec;
    let (ca, ca_files) = pki::ca(dir)?;
    // Also a client certificate: etcd's HTTP gateway (the JSON API tern uses) dials etcd's own
    // gRPC listener with it, which --client-cert-auth checks too.
    let server = CertSpec::server("tern-lab-etcd", [pki::ip_san(address)?]).and_client();
    let server = pki::issue(dir, "server", &ca, server)?;
    let client = pki::issue(dir, "client", &ca, CertSpec::client("tern-node"))?;
    let files = state::EtcdTlsFiles {
        ca: ca_files.cert,
        cert: client.cert,
        key: client.key,
    };
    Ok((server, files))
}

fn start_etcd(st: &mut LabState, tls: bool) -> Result<()> {
    let ns = state::etcd_ns(&st.name);
    netns_add(&ns)?;
    st.namespaces.push(ns.clone());
    let places = etcd_placements(st.ip_family, st.encap);
    let Some(p) = places.first().cloned() else {
        return Err(LabError::Invalid("the etcd has no underlay address".into()));
    };
    let data_dir = st.dir().join("etcd");
    let pki = if tls {
        Some(etcd_pki(&st.dir().join("etcd-pki"), &p.address)?)
    } else {
        None
    };
    st.etcd = Some(EtcdState {
        netns: ns.clone(),
        address: p.address.clone(),
        pid: None,
        data_dir: data_dir.clone(),
        tls: pki.as_ref().map(|(_, files)| files.clone()),
    });
    st.save()?;
    plug_all(st, &ns, "etcd", &places)?;
    let log_path = st.dir().join("etcd.log");
    let scheme = if tls { "https" } else { "http" };
    let addr = state::host_port(&p.address, state::ETCD_CLIENT_PORT);
    let client = format!("{scheme}://{addr}");
    let mut cmd = netns_exec(&ns, Path::new(ETCD_BIN));
    cmd.arg("--name")
        .arg("lab")
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        // Peers are never used: a single member, peer port on the namespace's loopback.
        .args(["--listen-peer-urls", "http://127.0.0.1:2380"])
        .args(["--initial-advertise-peer-urls", "http://127.0.0.1:2380"])
        .args(["--initial-cluster", "lab=http://127.0.0.1:2380"])
        .args(["--log-level", "warn"]);
    if let Some((server, files)) = &pki {
        // Only clients with a certificate of the lab's CA get an answer.
        cmd.arg("--cert-file")
            .arg(&server.cert)
            .arg("--key-file")
            .arg(&server.key)
            .arg("--trusted-ca-file")
            .arg(&files.ca)
            .arg("--client-cert-auth");
    }
    let child = process::spawn_logged(&mut cmd, &log_path, false)?;
    let pid = child.id();
    if let Some(e) = st.etcd.as_mut() {
        e.pid = Some(pid);
    }
    st.save()?;
    let start = Instant::now();
    let files = pki.map(|(_, files)| files);
    loop {
        let healthy = crate::netns::in_netns(&ns, || match &files {
            None => etcd_healthy(&addr),
            Some(f) => etcd_tls_healthy(&addr, f),
        })?;
        if healthy {
            return Ok(());
        }
        if !process::is_alive(pid) {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(LabError::Invalid(format!(
                "etcd exited during start-up: {}",
                log.trim()
            )));
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(LabError::Timeout(format!(
                "etcd at {addr} not healthy after 20 s (log {})",
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `GET /health` answers `"health":"true"`.
fn etcd_healthy(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(sa) = addr.parse::<std::net::SocketAddr>() else {
        return false;
    };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

/// A TLS etcd at `addr` answers a request of a client with the lab's certificate.
fn etcd_tls_healthy(addr: &str, f: &state::EtcdTlsFiles) -> bool {
    let quick = tern_store::etcd::Timeouts {
        connect: Duration::from_millis(300),
        request: Duration::from_secs(1),
    };
    let tls = tern_store::etcd::TlsFiles {
        ca: f.ca.clone(),
        cert: Some(f.cert.clone()),
        key: Some(f.key.clone()),
    };
    tern_store::etcd::EtcdStore::connect(&[addr], Some(tls), quick).is_ok()
}

/// Index of a node named `node<i>`.
fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix("node")?.parse().ok()
}

/// Creates node `i` (`node<i>`): its namespace on the underlay and its agent (not waited for).
fn add_node(st: &mut LabState, i: usize) -> Result<NodeState> {
    let name = format!("node{i}");
    let ns = state::node_ns(&st.name, &name);
    st.last_node_index = st.last_node_index.max(i);
    netns_add(&ns)?;
    st.namespaces.push(ns.clone());
    let dir = st.dir().join(&name);
    let places = placements(st.ip_family, st.encap, i);
    let Some(p) = places.first() else {
        return Err(LabError::Invalid(format!("{name}: no underlay address")));
    };
    let node = NodeState {
        name: name.clone(),
        netns: ns.clone(),
        address: p.address.clone(),
        ternd_pid: None,
        socket: dir.join("ternd.sock"),
        state_dir: dir.clone(),
        gateway: p.gateway.clone(),
        prefix_len: p.prefix_len,
        address6: places.get(1).map(|p6| p6.address.clone()),
    };
    st.nodes.push(node.clone());
    st.save()?;
    // Proxy-ARP for 169.254.1.1 needs a route covering it: plug_all() adds the default route.
    plug_all(st, &ns, &format!("n{i}"), &places)?;
    // A stock host: forwarding off, as distributions ship it (and whatever the machine's own
    // setting, which a new namespace may inherit). ternd must turn it on itself.
    sysctl_in(&ns, "net.ipv4.ip_forward", "0")?;
    if st.ip_family.has_v6() {
        sysctl_in(&ns, "net.ipv6.conf.all.forwarding", "0")?;
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
    if host_agents(st) {
        start_agent(st, &name, false)?;
    }
    Ok(st.node(&name)?.clone())
}

/// Whether the lab runs a ternd of its own on each node: not on the Kubernetes datastore,
/// where tern's only agents are its DaemonSet's (the store is the cluster's API server, which
/// a lab's first nodes are created before).
fn host_agents(st: &LabState) -> bool {
    st.store != StoreKind::Kubernetes
}

/// Starts `ternd` of an existing node (again), without waiting for its socket. The log is
/// appended to when `append_log`.
pub fn start_agent(st: &mut LabState, node: &str, append_log: bool) -> Result<u32> {
    if !host_agents(st) {
        return Err(LabError::Invalid(format!(
            "lab {}: tern runs as the tern-node DaemonSet on the Kubernetes datastore; no \
             ternd of the lab's is started on {node} (restart its pod: kubectl -n kube-system \
             delete pod -l k8s-app=tern-node --field-selector spec.nodeName={node})",
            st.name
        )));
    }
    let n = st.node(node)?.clone();
    let log_path = n.state_dir.join("ternd.log");
    let mut cmd = netns_exec(&n.netns, &st.bin_dir.join("ternd"));
    cmd.arg("--node-name")
        .arg(&n.name)
        .arg("--store")
        .arg(st.store_url())
        .arg("--socket")
        .arg(&n.socket)
        .arg("--state-dir")
        .arg(&n.state_dir)
        .args(st.store_tls_args())
        .args(&st.agent_args);
    let child = process::spawn_logged(&mut cmd, &log_path, append_log)?;
    // `ip netns exec` execs the program, so this PID is ternd's.
    let pid = child.id();
    if let Some(x) = st.nodes.iter_mut().find(|x| x.name == node) {
        x.ternd_pid = Some(pid);
    }
    st.save()?;
    Ok(pid)
}

/// Kills a node's `ternd` with SIGKILL (no graceful shutdown, as a crash would), and waits
/// until it is gone. Its pods, routes and interfaces stay in the kernel.
pub fn kill_agent(st: &mut LabState, node: &str) -> Result<()> {
    let n = st.node(node)?.clone();
    if let Some(pid) = n.ternd_pid {
        process::kill(pid, &n.socket.display().to_string(), Duration::from_secs(5))?;
    }
    if let Some(x) = st.nodes.iter_mut().find(|x| x.name == node) {
        x.ternd_pid = None;
    }
    st.save()
}

/// Kills and restarts a node's agent and waits until it serves again.
pub fn restart_agent(st: &mut LabState, node: &str, timeout: Duration) -> Result<()> {
    kill_agent(st, node)?;
    start_agent(st, node, true)?;
    wait_for_agent(st.node(node)?, timeout)
}

/// Joins a new node to a running lab (`node<max+1>`), starts its agent and waits for it (on
/// the Kubernetes datastore the lab starts none: the DaemonSet's serves it, see
/// `kube::node_joined`, which `addon` calls).
pub fn node_add(st: &mut LabState, timeout: Duration, addon: &dyn Addon) -> Result<NodeState> {
    addon.check_node_add(st)?;
    let next = st
        .nodes
        .iter()
        .filter_map(|n| node_index(&n.name))
        .max()
        .unwrap_or(0)
        .max(st.last_node_index)
        + 1;
    if next > MAX_NODES {
        return Err(LabError::Invalid(format!(
            "a lab has at most {MAX_NODES} nodes"
        )));
    }
    let n = add_node(st, next)?;
    if n.ternd_pid.is_some() {
        wait_for_agent(&n, timeout)?;
    }
    // A Kubernetes lab's new node joins the cluster too.
    addon.node_joined(st, &n.name)?;
    Ok(n)
}

/// Removes a node from a running lab: deletes its pods (CNI DEL while its agent runs), stops
/// its agent, removes its records from the datastore (so the other agents withdraw their
/// routes to it) and deletes its namespace. Returns what was done.
pub fn node_del(st: &mut LabState, node: &str, addon: &dyn Addon) -> Result<Vec<String>> {
    let n = st.node(node)?.clone();
    let mut done = Vec::new();
    // A Kubernetes lab's node leaves the cluster first (its pods' CNI DEL while ternd runs).
    addon.node_leaving(st, node, &mut done)?;
    let pods: Vec<String> = st
        .pods
        .iter()
        .filter(|p| p.node == node)
        .map(|p| p.name.clone())
        .collect();
    for p in pods {
        crate::pod::del_pod(st, &p)?;
        done.push(format!("deleted pod {p}"));
    }
    if let Some(pid) = n.ternd_pid
        && process::stop(pid, &n.socket.display().to_string(), Duration::from_secs(5))
    {
        done.push(format!("stopped ternd {pid} of {node}"));
    }
    let removed = cluster::remove_node_records(st, node)?;
    done.push(format!(
        "removed {node} from the datastore: {} address(es) released, blocks [{}], Node {}",
        removed.released,
        removed.blocks.join(", "),
        if removed.node_deleted {
            "deleted"
        } else {
            "absent"
        }
    ));
    // Deleting a namespace frees its devices asynchronously; unplug the underlay end now so
    // the node is off the underlay when this returns.
    if let Some(i) = node_index(node) {
        let _ = ip_in(
            &state::underlay_ns(&st.name),
            &["link", "del", &format!("n{i}")],
        );
    }
    netns_del(&n.netns)?;
    done.push(format!("deleted namespace {}", n.netns));
    st.namespaces.retain(|x| *x != n.netns);
    st.nodes.retain(|x| x.name != node);
    st.save()?;
    let _ = std::fs::remove_dir_all(&n.state_dir);
    Ok(done)
}

/// Waits until the agent's socket accepts a connection, failing early (with the log's tail)
/// if the agent exits.
pub fn wait_for_agent(node: &NodeState, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        if std::os::unix::net::UnixStream::connect(&node.socket).is_ok() {
            return Ok(());
        }
        // The agent is our unreaped child here, so liveness alone identifies it.
        let alive = node.ternd_pid.is_some_and(process::is_alive);
        if !alive {
            return Err(LabError::Invalid(format!(
                "ternd of {} exited during start-up; last log lines:\n{}",
                node.name,
                log_tail(node, 20)
            )));
        }
        if start.elapsed() > timeout {
            return Err(LabError::Timeout(format!(
                "ternd of {} did not accept connections on {} within {:?}; last log lines:\n{}",
                node.name,
                node.socket.display(),
                timeout,
                log_tail(node, 20)
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `lines` lines of a node's `ternd.log`.
pub fn log_tail(node: &NodeState, lines: usize) -> String {
    process::tail(&node.state_dir.join("ternd.log"), lines)
}

/// Removes lab `name` entirely: stops echo servers, deletes pods (CNI DEL while the agents
/// still run), stops the agents, deletes every `tl-<name>-` namespace and the state directory.
/// Works on a half-built lab and on a lab without state file. Returns what was done; errors
/// are collected, not stopping at the first, and returned together at the end.
pub fn down(name: &str, addon: &dyn Addon) -> Result<Vec<String>> {
    state::validate_name(name)?;
    let mut done = Vec::new();
    let mut errors = Vec::new();
    let st = match LabState::load(name) {
        Ok(s) => s,
        Err(e) => {
            errors.push(e.to_string());
            None
        }
    };
    if let Some(mut st) = st {
        // The cluster first: its pods are deleted while the agents still run.
        addon.teardown(&mut st, &mut done, &mut errors);
        for s in std::mem::take(&mut st.servers) {
            if process::stop(
                s.pid,
                &s.ready_file.display().to_string(),
                Duration::from_secs(2),
            ) {
                done.push(format!("stopped echo server {} in pod {}", s.pid, s.pod));
            }
        }
        let pods: Vec<String> = st.pods.iter().map(|p| p.name.clone()).collect();
        for p in pods {
            match crate::pod::del_pod(&mut st, &p) {
                Ok(()) => done.push(format!("deleted pod {p}")),
                Err(e) => errors.push(e.to_string()),
            }
        }
        for n in &st.nodes {
            if let Some(pid) = n.ternd_pid
                && process::stop(pid, &n.socket.display().to_string(), Duration::from_secs(5))
            {
                done.push(format!("stopped ternd {pid} of {}", n.name));
            }
        }
        if let Some(e) = &st.etcd
            && let Some(pid) = e.pid
            && process::stop(
                pid,
                &e.data_dir.display().to_string(),
                Duration::from_secs(5),
            )
        {
            done.push(format!("stopped etcd {pid}"));
        }
        // Recorded namespaces in reverse creation order: nodes before the underlay.
        for ns in st.namespaces.iter().rev() {
            match netns_del(ns) {
                Ok(()) => done.push(format!("deleted namespace {ns}")),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    // Anything left with the lab's prefix (for example from a crash before the state was
    // written) is ours too: lab names contain no '-', so the prefix is unambiguous.
    for ns in process::netns_with_prefix(&state::ns_prefix(name)) {
        match netns_del(&ns) {
            Ok(()) => done.push(format!("deleted namespace {ns}")),
            Err(e) => errors.push(e.to_string()),
        }
    }
    addon.sweep(name, &mut done, &mut errors);
    let dir = state::lab_dir(name);
    if dir.exists() {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => done.push(format!("removed {}", dir.display())),
            Err(e) => errors.push(format!("cannot remove {}: {e}", dir.display())),
        }
    }
    if errors.is_empty() {
        Ok(done)
    } else {
        Err(LabError::Invalid(format!(
            "lab {name:?} teardown finished with errors:\n  {}",
            errors.join("\n  ")
        )))
    }
}

/// A human-readable description of the lab: nodes (with agent liveness), pods, servers.
pub fn status(name: &str, addon: &dyn Addon) -> Result<String> {
    let Some(st) = LabState::load(name)? else {
        return Err(LabError::Invalid(format!("lab {name:?} does not exist")));
    };
    let mut out = format!("lab {}  (state {})\n", st.name, st.dir().display());
    out.push_str(&format!(
        "encap {}  ip-family {}  store {}\n",
        st.encap,
        st.ip_family,
        st.store_url()
    ));
    let pools: Vec<&str> = st
        .pool_cidr
        .iter()
        .chain(st.pool6_cidr.iter())
        .map(String::as_str)
        .collect();
    if !pools.is_empty() {
        out.push_str(&format!("pools {}\n", pools.join(", ")));
    }
    if let Some(e) = &st.etcd {
        let running = e
            .pid
            .is_some_and(|pid| process::is_ours(pid, &e.data_dir.display().to_string()));
        out.push_str(&format!(
            "etcd  netns {}  eth0 {}  {}{}\n",
            e.netns,
            e.address,
            if running { "running" } else { "NOT running" },
            match &e.tls {
                Some(t) => format!("  TLS, client certificates (CA {})", t.ca.display()),
                None => String::new(),
            }
        ));
    }
    for n in &st.nodes {
        let agent = match n.ternd_pid {
            Some(pid) if process::is_ours(pid, &n.socket.display().to_string()) => {
                format!("ternd running (pid {pid})")
            }
            Some(pid) => format!("ternd NOT running (was pid {pid})"),
            None => addon
                .agent_status(&st)
                .unwrap_or_else(|| "ternd not started".into()),
        };
        out.push_str(&format!(
            "node {}  netns {}  eth0 {}  {agent}\n",
            n.name,
            n.netns,
            n.addresses().join(",")
        ));
    }
    for p in &st.pods {
        let addrs = if p.addresses.is_empty() {
            "-".to_string()
        } else {
            p.addresses.join(",")
        };
        out.push_str(&format!(
            "pod {}  node {}  netns {}  ip {addrs}\n",
            p.name, p.node, p.netns
        ));
    }
    out.push_str(&addon.status(&st));
    for s in &st.servers {
        let alive = process::is_ours(s.pid, &s.ready_file.display().to_string());
        out.push_str(&format!(
            "echo server in pod {} (pid {}, tcp {}, udp {}){}\n",
            s.pod,
            s.pid,
            s.tcp.map_or("-".into(), |p| p.to_string()),
            s.udp.map_or("-".into(), |p| p.to_string()),
            if alive { "" } else { " NOT running" }
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_in_the_benchmarking_range() {
        assert_eq!(node_address(1), "198.18.0.11");
        assert_eq!(node_address(MAX_NODES), "198.18.0.210");
    }

    #[test]
    fn placements() {
        let flat = placement(Encap::Vxlan, 3);
        assert_eq!(
            flat,
            Placement {
                address: "198.18.0.13".into(),
                gateway: "198.18.0.1".into(),
                bridge: "br0".into(),
                prefix_len: 24,
            }
        );
        let odd = placement(Encap::Crosssubnet, 1);
        assert_eq!(
            (
                odd.address.as_str(),
                odd.gateway.as_str(),
                odd.bridge.as_str()
            ),
            ("198.18.1.11", "198.18.1.1", "br1")
        );
        let even = placement(Encap::Crosssubnet, 2);
        assert_eq!(
            (
                even.address.as_str(),
                even.gateway.as_str(),
                even.bridge.as_str()
            ),
            ("198.18.2.12", "198.18.2.1", "br2")
        );
        assert_eq!(placement(Encap::Crosssubnet, 3).bridge, "br1");
        assert_eq!(etcd_placement(Encap::None).address, "198.18.0.2");
        assert_eq!(etcd_placement(Encap::Crosssubnet).address, "198.18.1.2");
        assert_eq!(etcd_placement(Encap::Crosssubnet).gateway, "198.18.1.1");
        assert_eq!(node_index("node12"), Some(12));
        // IPv6: the same layout in 2001:db8::/32, the node number as the last group.
        let p6 = placement6(Encap::None, 1);
        assert_eq!(
            (p6.address.as_str(), p6.gateway.as_str(), p6.prefix_len),
            ("2001:db8::11", "2001:db8::1", 64)
        );
        let even6 = placement6(Encap::Crosssubnet, 2);
        assert_eq!(
            (
                even6.address.as_str(),
                even6.gateway.as_str(),
                even6.bridge.as_str()
            ),
            ("2001:db8:2::12", "2001:db8:2::1", "br2")
        );
        assert!(
            placement6(Encap::None, MAX_NODES)
                .address
                .parse::<std::net::Ipv6Addr>()
                .is_ok()
        );
        let dual: Vec<String> = super::placements(IpFamily::Dual, Encap::None, 2)
            .into_iter()
            .map(|p| p.address)
            .collect();
        assert_eq!(dual, ["198.18.0.12", "2001:db8::12"]);
        assert_eq!(super::placements(IpFamily::Ipv6, Encap::None, 2).len(), 1);
        let etcd6 = etcd_placements(IpFamily::Ipv6, Encap::None);
        assert_eq!(etcd6[0].address, "2001:db8::2");
        assert_eq!(
            etcd_placements(IpFamily::Dual, Encap::Crosssubnet)[1].address,
            "2001:db8:1::2"
        );
        assert_eq!(node_index("etcd"), None);
    }

    #[test]
    fn kernel_probe_answers_for_known_and_unknown_kinds() {
        // The probe creates a private network namespace: root (tern-testkit; fails when strict).
        tern_testkit::need_root();
        assert!(kernel_supports("bridge").unwrap());
        assert!(!kernel_supports("no-such-link-kind").unwrap());
    }

    #[test]
    fn up_refuses_bad_input_before_touching_anything() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = UpOptions::new("bad-name", dir.path());
        assert!(up(&o).is_err());
        o.name = "t0".into();
        o.nodes = 0;
        assert!(up(&o).unwrap_err().to_string().contains("1 to"));
        o.nodes = 1;
        let e = up(&o).unwrap_err().to_string();
        assert!(e.contains("ternd not found"), "{e}");
        for b in ["ternd", "tern", "tern-ipam"] {
            std::fs::write(dir.path().join(b), "").unwrap();
        }
        o.default_ipv6_pool = Some("fd00:99::/48".into());
        let e = up(&o).unwrap_err().to_string();
        assert!(e.contains("--ip-family ipv6 or dual"), "{e}");
        o.ip_family = IpFamily::Ipv6;
        o.default_ipv6_pool = Some("10.9.0.0/16".into());
        let e = up(&o).unwrap_err().to_string();
        assert!(e.contains("not an IPv6 CIDR"), "{e}");
        o.default_ipv6_pool = None;
        o.default_ipv4_pool = Some("10.9.0.0/16".into());
        let e = up(&o).unwrap_err().to_string();
        assert!(e.contains("needs a lab with IPv4"), "{e}");
        o.default_ipv4_pool = None;
        o.encap = Encap::Ipip;
        let e = up(&o).unwrap_err().to_string();
        assert!(e.contains("IPv4 only"), "{e}");
        assert!(!state::lab_dir("t0").exists());
    }
}
