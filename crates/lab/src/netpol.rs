//! Kubernetes NetworkPolicy in a lab: pods that belong to a Kubernetes namespace and carry
//! labels (the upstream e2e model of namespaces x/y/z with pods a/b/c), echo servers for
//! TCP, UDP and SCTP that live in the pods' namespaces, and a probe of the whole reachability
//! matrix in parallel.
//!
//! A pod joins its Kubernetes namespace through `CNI_ARGS K8S_POD_NAMESPACE/K8S_POD_NAME` and
//! gets its labels through `args.cni.labels` in the netconf (the agent adds
//! `tern.dev/namespace`), exactly as a container runtime would pass them. Named container
//! ports can come through `args.cni.ports` (a tern extension; Calico reads them from the pod
//! spec); here [`set_pod_ports`] writes them into the pod's WorkloadEndpoint after ADD, as an
//! orchestrator integration or `ternctl port` would, which also proves that a port change
//! reaches every node's sets.
//! Namespaces, policies and label changes are written to the lab's store as `ternctl apply` /
//! `ternctl label` write them; every agent sees them through its store watch.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{FromRawFd, RawFd};
use std::time::{Duration, Instant};

use tern_model::{EndpointPort, Kind, Namespace, NamespaceSpec, Resource};

use crate::cluster::with_store;
use crate::netns::in_netns;
use crate::pod::{netconf_for, result_addresses};
use crate::process;
use crate::state::{self, LabState, PodState};
use crate::{LabError, Result};

/// Transport of a matrix probe; SCTP only where the kernel has it ([`sctp_available`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4 {
    Tcp,
    Udp,
    Sctp,
}

impl L4 {
    /// `TCP`, `UDP` or `SCTP`, as in Kubernetes.
    pub fn as_str(self) -> &'static str {
        match self {
            L4::Tcp => "TCP",
            L4::Udp => "UDP",
            L4::Sctp => "SCTP",
        }
    }

    /// Parses the Kubernetes spelling.
    pub fn parse(s: &str) -> Option<L4> {
        match s {
            "TCP" => Some(L4::Tcp),
            "UDP" => Some(L4::Udp),
            "SCTP" => Some(L4::Sctp),
            _ => None,
        }
    }
}

/// A pod of a Kubernetes namespace in the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8sPod {
    /// Kubernetes namespace.
    pub namespace: String,
    /// Kubernetes pod name.
    pub name: String,
    /// The lab's name for it (`<namespace>-<name>`; lab pod names are unique per lab).
    pub lab_pod: String,
    /// Node it runs on.
    pub node: String,
    /// Its network namespace.
    pub netns: String,
    /// Its address (its first: IPv4 in an IPv4 or dual-stack lab, IPv6 in an IPv6-only one).
    pub ip: IpAddr,
}

impl K8sPod {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The lab pod name of a Kubernetes pod.
pub fn lab_pod_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// The netconf for a pod of a lab of `family` with `labels` (as `args.cni.labels`) and
/// optionally a fixed address (as `runtimeConfig.ips`).
pub fn k8s_netconf(
    node: &state::NodeState,
    family: crate::IpFamily,
    labels: &BTreeMap<String, String>,
    ip: Option<IpAddr>,
) -> serde_json::Value {
    let mut c = netconf_for(node, family);
    let labels: Vec<serde_json::Value> = labels
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    c["args"] = serde_json::json!({"cni": {"labels": labels}});
    if let Some(ip) = ip {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        c["runtimeConfig"] = serde_json::json!({"ips": [format!("{ip}/{prefix}")]});
    }
    c
}

/// Creates the network namespace of pod `namespace/name` on `node` and records it in the lab
/// (so `down` removes it), without running CNI ADD yet: a caller may open sockets inside it
/// first. Returns the lab pod record.
pub fn create_pod_netns(
    st: &mut LabState,
    node: &str,
    namespace: &str,
    name: &str,
) -> Result<PodState> {
    let lab_pod = lab_pod_name(namespace, name);
    Ok(crate::pod::new_pod_netns(st, node, &lab_pod)?.1)
}

/// Runs CNI ADD for a pod made by [`create_pod_netns`]: the pod joins Kubernetes namespace
/// `namespace` as `name`, with `labels` and, when given, the fixed address `ip`.
pub fn cni_add(
    st: &mut LabState,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    ip: Option<IpAddr>,
) -> Result<K8sPod> {
    let lab_pod = lab_pod_name(namespace, name);
    let p = st.pod(&lab_pod)?.clone();
    let node = st.node(&p.node)?.clone();
    let err = |message: String| LabError::Cni {
        command: "ADD",
        pod: lab_pod.clone(),
        message,
    };
    let conf = k8s_netconf(&node, st.ip_family, labels, ip).to_string();
    let stdout = crate::pod::exec_plugin(st, &node, &p, "ADD", (namespace, name), &conf)?;
    let result: serde_json::Value = serde_json::from_str(&stdout)
        .map_err(|e| err(format!("result is not JSON ({e}): {stdout}")))?;
    let addresses = result_addresses(&result);
    let ips: Vec<IpAddr> = addresses.iter().filter_map(|a| a.parse().ok()).collect();
    let ip = ips
        .iter()
        .find(|a| a.is_ipv4())
        .or(ips.first())
        .copied()
        .ok_or_else(|| err(format!("result has no address: {stdout}")))?;
    if let Some(sp) = st.pods.iter_mut().find(|x| x.name == lab_pod) {
        sp.addresses = addresses;
    }
    st.save()?;
    Ok(K8sPod {
        namespace: namespace.into(),
        name: name.into(),
        lab_pod,
        node: p.node,
        netns: p.netns,
        ip,
    })
}

/// [`create_pod_netns`] then [`cni_add`] with an address from IPAM.
pub fn add_k8s_pod(
    st: &mut LabState,
    node: &str,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<K8sPod> {
    create_pod_netns(st, node, namespace, name)?;
    cni_add(st, namespace, name, labels, None)
}

fn store_err(what: String) -> impl FnOnce(tern_model::ModelError) -> LabError {
    move |e| LabError::Invalid(format!("{what}: {e}"))
}

/// Creates or replaces Kubernetes namespace `name` with exactly `labels`.
pub fn put_namespace(st: &LabState, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
    let mut ns = Namespace::new(name, NamespaceSpec::default());
    ns.metadata.labels = labels.clone();
    let r = Resource::Namespace(ns);
    with_store(st, move |s| {
        tern_model::put_resource(&*s, &r)
            .map(drop)
            .map_err(store_err(format!("writing Namespace {name}")))
    })
}

/// Applies every document of a YAML text (`ternctl apply -f`); returns the
/// `(kind, namespace, name)` of each.
pub fn apply_yaml(st: &LabState, text: &str) -> Result<Vec<(Kind, Option<String>, String)>> {
    let docs = tern_model::parse_documents(text, "netpol.yaml")
        .map_err(|e| LabError::Invalid(format!("cannot parse policy: {e}")))?;
    with_store(st, move |s| {
        let mut keys = Vec::new();
        for d in &docs {
            tern_model::put_resource(&*s, d).map_err(store_err(format!(
                "applying {} {}",
                d.kind().as_str(),
                d.name()
            )))?;
            keys.push((d.kind(), d.namespace().map(str::to_string), d.name().into()));
        }
        Ok(keys)
    })
}

/// Deletes the given resources (absent ones are fine).
pub fn delete_resources(st: &LabState, keys: &[(Kind, Option<String>, String)]) -> Result<()> {
    with_store(st, move |s| {
        for (k, ns, name) in keys {
            tern_model::delete_resource(&*s, *k, ns.as_deref(), name)
                .map_err(store_err(format!("deleting {} {name}", k.as_str())))?;
        }
        Ok(())
    })
}

/// Changes the WorkloadEndpoint of pod `namespace/name` with `f` and writes it back
/// (compare-and-swap on its resource version, retried when the agent wrote in between).
fn update_endpoint<F>(st: &LabState, namespace: &str, name: &str, f: F) -> Result<()>
where
    F: Fn(&mut tern_model::WorkloadEndpoint) + Send,
{
    with_store(st, move |s| {
        for _ in 0..10 {
            let weps = tern_model::list_resources(&*s, Kind::WorkloadEndpoint)
                .map_err(store_err("listing WorkloadEndpoints".into()))?;
            let mut wep = weps
                .into_iter()
                .find_map(|r| match r {
                    Resource::WorkloadEndpoint(w)
                        if w.metadata.namespace.as_deref() == Some(namespace)
                            && w.spec.pod == name =>
                    {
                        Some(w)
                    }
                    _ => None,
                })
                .ok_or_else(|| {
                    LabError::Invalid(format!(
                        "no WorkloadEndpoint of pod {name} in namespace {namespace}"
                    ))
                })?;
            f(&mut wep);
            match tern_model::put_resource(&*s, &Resource::WorkloadEndpoint(wep)) {
                Ok(_) => return Ok(()),
                Err(tern_model::ModelError::Conflict { .. }) => continue,
                Err(e) => {
                    return Err(LabError::Invalid(format!(
                        "writing the WorkloadEndpoint of {namespace}/{name}: {e}"
                    )));
                }
            }
        }
        Err(LabError::Timeout(format!(
            "the WorkloadEndpoint of {namespace}/{name} kept changing under us"
        )))
    })
}

/// The labels of pod `namespace/name`'s WorkloadEndpoint.
pub fn pod_labels(st: &LabState, namespace: &str, name: &str) -> Result<BTreeMap<String, String>> {
    let out = std::sync::Mutex::new(BTreeMap::new());
    update_endpoint(st, namespace, name, |w| {
        *out.lock().unwrap_or_else(|e| e.into_inner()) = w.metadata.labels.clone();
    })?;
    Ok(out.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// Replaces the labels of pod `namespace/name` (`ternctl label workloadendpoint`).
pub fn set_pod_labels(
    st: &LabState,
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<()> {
    update_endpoint(st, namespace, name, |w| w.metadata.labels = labels.clone())
}

/// Sets the named container ports of pod `namespace/name` (what Calico takes from the pod
/// spec), so policies can name ports.
pub fn set_pod_ports(
    st: &LabState,
    namespace: &str,
    name: &str,
    ports: &[EndpointPort],
) -> Result<()> {
    update_endpoint(st, namespace, name, |w| w.spec.ports = ports.to_vec())
}

// ---- SCTP through std's stream types ----

/// An SCTP one-to-one (`SOCK_STREAM`) socket behaves like a TCP socket for accept, read and
/// write, so std's `TcpListener` / `TcpStream` wrap it.
fn sctp_socket(v6: bool) -> std::io::Result<RawFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain socket(2) call; the descriptor is owned by the caller.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM, libc::IPPROTO_SCTP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// `addr` as a C socket address of its family, and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any socket address.
            let sa = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sa.sin_family = libc::AF_INET as libc::sa_family_t;
            sa.sin_port = a.port().to_be();
            sa.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above.
            let sa = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sa.sin6_port = a.port().to_be();
            sa.sin6_addr.s6_addr = a.ip().octets();
            sa.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Whether the kernel of the calling thread's namespace can make SCTP sockets (the module may
/// be missing; nothing is loaded by hand).
pub fn sctp_available() -> std::result::Result<(), String> {
    match sctp_socket(false) {
        Ok(fd) => {
            // SAFETY: fd was just created by us.
            unsafe { libc::close(fd) };
            Ok(())
        }
        Err(e) => Err(format!("cannot create an SCTP socket: {e}")),
    }
}

/// Listens for SCTP on `0.0.0.0:port` or, with `v6`, on `[::]:port` (IPv6 only, so both
/// listeners can hold the port).
pub fn sctp_listen(port: u16, v6: bool) -> std::io::Result<TcpListener> {
    let fd = sctp_socket(v6)?;
    // SAFETY: fd is ours; TcpListener takes ownership and closes it on drop (and on error).
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    let any = if v6 {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from(([0, 0, 0, 0], port))
    };
    let (sa, len) = sockaddr(any);
    let opt = |level, name| {
        // SAFETY: valid fd, a pointer to a live local of the right size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    opt(libc::SOL_SOCKET, libc::SO_REUSEADDR);
    if v6 && opt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: valid fd, a socket address of `len` bytes.
    let rc = unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: valid fd.
    if unsafe { libc::listen(fd, 128) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// Connects by SCTP with a timeout (non-blocking connect, then poll).
pub fn sctp_connect(target: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let fd = sctp_socket(target.is_ipv6())?;
    // SAFETY: fd is ours; the stream owns it from here on.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let (sa, len) = sockaddr(target);
    s.set_nonblocking(true)?;
    // SAFETY: valid fd and a socket address of `len` bytes.
    let rc = unsafe { libc::connect(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "SCTP connect timed out",
            ));
        }
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some(e) = s.take_error()? {
            return Err(e);
        }
    }
    s.set_nonblocking(false)?;
    Ok(s)
}

// ---- servers and probes ----

/// Echo servers on `ports` for every transport in `l4s`, in both families, bound inside network namespace
/// `netns` and served by threads of this process (sockets keep their namespace). The threads
/// live as long as the process; the sockets die with it.
pub fn serve_in(netns: &str, ports: &[u16], l4s: &[L4]) -> Result<()> {
    let (tcp, udp) = in_netns(netns, || -> std::io::Result<_> {
        let mut tcp = Vec::new();
        let mut udp = Vec::new();
        for &p in ports {
            for &l in l4s {
                // `[::]` takes both families (net.ipv6.bindv6only is 0 in a new namespace);
                // 0.0.0.0 where IPv6 is off.
                match l {
                    L4::Tcp => tcp.push(
                        TcpListener::bind(("::", p))
                            .or_else(|_| TcpListener::bind(("0.0.0.0", p)))?,
                    ),
                    L4::Sctp => {
                        tcp.push(sctp_listen(p, false)?);
                        // SCTP's v6 socket is IPv6 only: a second listener, where IPv6 is on.
                        tcp.extend(sctp_listen(p, true).ok());
                    }
                    L4::Udp => udp.push(
                        UdpSocket::bind(("::", p)).or_else(|_| UdpSocket::bind(("0.0.0.0", p)))?,
                    ),
                }
            }
        }
        Ok((tcp, udp))
    })?
    .map_err(|e| LabError::io(format!("cannot start echo servers in {netns}"), e))?;
    for l in tcp {
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 || c.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    for s in udp {
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], from);
            }
        });
    }
    Ok(())
}

/// One probe from the calling thread's namespace: a token must come back within `timeout`.
pub fn probe(l4: L4, target: SocketAddr, timeout: Duration) -> std::result::Result<(), String> {
    match l4 {
        L4::Udp => crate::traffic::probe_udp(target, timeout)
            .map(drop)
            .map_err(|e| e.to_string()),
        L4::Tcp | L4::Sctp => {
            let mut s = if l4 == L4::Tcp {
                TcpStream::connect_timeout(&target, timeout)
            } else {
                sctp_connect(target, timeout)
            }
            .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(timeout))
                .and_then(|_| s.set_write_timeout(Some(timeout)))
                .map_err(|e| e.to_string())?;
            let token = format!("tern-{}", process::random_hex(6));
            s.write_all(token.as_bytes())
                .map_err(|e| format!("send: {e}"))?;
            let mut back = vec![0u8; token.len()];
            s.read_exact(&mut back)
                .map_err(|e| format!("no echo: {e}"))?;
            if back != token.as_bytes() {
                return Err("echo mismatch".into());
            }
            Ok(())
        }
    }
}

/// Reachability of one transport and port: `matrix[i][j]` is whether pod `i` reached pod `j`.
pub type Matrix = Vec<Vec<bool>>;

/// One probe of a matrix round: combo (index into the `(l4, port)` list), source and
/// destination pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    pub combo: usize,
    pub from: usize,
    pub to: usize,
}

/// Probes `cells`, all in parallel: a thread per source pod enters its namespace, and a
/// thread per probe inherits it. Whether each cell reached its destination, in order.
pub fn probe_cells(
    pods: &[K8sPod],
    combos: &[(L4, u16)],
    cells: &[Cell],
    timeout: Duration,
) -> Result<Vec<bool>> {
    let mut by_from: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, c) in cells.iter().enumerate() {
        by_from.entry(c.from).or_default().push(k);
    }
    let rows: Vec<Result<Vec<(usize, bool)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = by_from
            .into_iter()
            .map(|(from, ks)| {
                scope.spawn(move || {
                    in_netns(&pods[from].netns, || {
                        std::thread::scope(|inner| {
                            let hs: Vec<_> = ks
                                .iter()
                                .map(|&k| {
                                    let c = cells[k];
                                    let (l4, port) = combos[c.combo];
                                    let target = SocketAddr::new(pods[c.to].ip, port);
                                    inner.spawn(move || probe(l4, target, timeout).is_ok())
                                })
                                .collect();
                            ks.iter()
                                .zip(hs)
                                .map(|(&k, h)| h.join().map(|ok| (k, ok)))
                                .collect::<std::result::Result<Vec<_>, _>>()
                        })
                    })
                    .and_then(|r| {
                        r.map_err(|_| LabError::Invalid("a probe thread panicked".into()))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(LabError::Invalid("a probe thread panicked".into())))
            })
            .collect()
    });
    let mut out = vec![false; cells.len()];
    for r in rows {
        for (k, ok) in r? {
            out[k] = ok;
        }
    }
    Ok(out)
}

/// Every cell of `combos` over `pods` (the diagonal included), combo by combo, row by row.
fn all_cells(pods: usize, combos: usize) -> Vec<Cell> {
    (0..combos)
        .flat_map(|combo| {
            (0..pods).flat_map(move |from| (0..pods).map(move |to| Cell { combo, from, to }))
        })
        .collect()
}

/// Probes every pod from every pod (the diagonal included) for each `(l4, port)`, all in
/// parallel ([`probe_cells`]). Returns one matrix per `(l4, port)` in the given order.
pub fn probe_matrix(
    pods: &[K8sPod],
    combos: &[(L4, u16)],
    timeout: Duration,
) -> Result<Vec<Matrix>> {
    let cells = all_cells(pods.len(), combos.len());
    let got = probe_cells(pods, combos, &cells, timeout)?;
    let mut out = vec![vec![vec![false; pods.len()]; pods.len()]; combos.len()];
    for (c, ok) in cells.iter().zip(got) {
        out[c.combo][c.from][c.to] = ok;
    }
    Ok(out)
}

/// The cells where `got` differs from `want`, as `from -> to: want allow|deny`.
pub fn matrix_diff(pods: &[K8sPod], want: &Matrix, got: &Matrix) -> Vec<String> {
    let mut d = Vec::new();
    for (i, row) in want.iter().enumerate() {
        for (j, &w) in row.iter().enumerate() {
            if got[i][j] != w {
                d.push(cell_diff(pods, i, j, w));
            }
        }
    }
    d
}

fn cell_diff(pods: &[K8sPod], from: usize, to: usize, want: bool) -> String {
    let verdict = |open: bool| if open { "allow" } else { "deny" };
    format!(
        "{} -> {}: want {}, got {}",
        pods[from].id(),
        pods[to].id(),
        verdict(want),
        verdict(!want)
    )
}

/// How long a re-probe of a cell that a round saw closed waits for its answer.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(2);
/// How many times such cells are probed again before the round counts.
pub const CELL_RETRIES: usize = 2;

/// The re-probe rule of a probe round (here and in the Kubernetes NetworkPolicy lab): the
/// `wrong` cells of a round of `total` are probed again, alone, when every one of them is a
/// miss (`all_misses`: wanted open, seen closed) and they are few, or however many once the
/// step's deadline passed (`late`). A round with many wrong cells is a step still being
/// applied, probed whole again; a cell seen open though wanted closed is never retried.
pub fn reprobe_wanted(wrong: usize, all_misses: bool, total: usize, late: bool) -> bool {
    wrong > 0 && all_misses && (wrong <= total / 50 + 2 || late)
}

/// Probes until every matrix equals its expectation or `deadline` passes (policy reaches the
/// nodes through their store watches, so the first rounds may see the old state). Returns the
/// differences of the last round (empty on success) and how long it took.
///
/// A round is hundreds of probes at once, each given `timeout`; on a loaded machine some miss
/// it though their path is open. So when every cell a round got wrong is such a miss (wanted
/// open, seen closed) and they are few, or the deadline has passed, they are probed again,
/// alone, with [`RETRY_TIMEOUT`]. A path the policy drops stays closed however long a probe
/// waits, and an answer that came is never retried: a real wrong verdict is never rescued.
pub fn wait_for_matrices(
    pods: &[K8sPod],
    combos: &[(L4, u16)],
    want: &[Matrix],
    timeout: Duration,
    deadline: Duration,
) -> Result<(Vec<String>, Duration)> {
    let start = Instant::now();
    let cells = all_cells(pods.len(), combos.len());
    let wants = |c: &Cell| want[c.combo][c.from][c.to];
    loop {
        let got = probe_cells(pods, combos, &cells, timeout)?;
        let mut wrong: Vec<Cell> = cells
            .iter()
            .zip(got)
            .filter(|(c, ok)| *ok != wants(c))
            .map(|(c, _)| *c)
            .collect();
        let late = start.elapsed() >= deadline;
        if reprobe_wanted(wrong.len(), wrong.iter().all(wants), cells.len(), late) {
            for _ in 0..CELL_RETRIES {
                let again = probe_cells(pods, combos, &wrong, RETRY_TIMEOUT)?;
                wrong = wrong
                    .into_iter()
                    .zip(again)
                    .filter(|(_, ok)| !ok)
                    .map(|(c, _)| c)
                    .collect();
                if wrong.is_empty() {
                    break;
                }
            }
        }
        if wrong.is_empty() || late {
            let diffs = wrong
                .iter()
                .map(|c| {
                    let (l4, port) = combos[c.combo];
                    let d = cell_diff(pods, c.from, c.to, wants(c));
                    format!("{}/{port} {d}", l4.as_str())
                })
                .collect();
            return Ok((diffs, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_few_misses_are_probed_again_before_the_deadline() {
        // 612 cells: up to 14 misses are probed again at once, more only once late.
        assert!(reprobe_wanted(14, true, 612, false));
        assert!(!reprobe_wanted(15, true, 612, false));
        assert!(reprobe_wanted(200, true, 612, true));
        // A cell seen open though wanted closed is never retried, late or not.
        assert!(!reprobe_wanted(1, false, 612, false));
        assert!(!reprobe_wanted(1, false, 612, true));
        assert!(!reprobe_wanted(0, true, 612, true));
    }

    #[test]
    fn netconf_carries_labels_and_ip() {
        let n = state::NodeState {
            name: "node1".into(),
            socket: "/run/x.sock".into(),
            state_dir: "/run/x".into(),
            ..Default::default()
        };
        let labels = BTreeMap::from([("pod".to_string(), "a".to_string())]);
        let c = k8s_netconf(
            &n,
            crate::IpFamily::Ipv4,
            &labels,
            Some("10.244.9.9".parse().unwrap()),
        );
        assert_eq!(c["args"]["cni"]["labels"][0]["key"], "pod");
        assert_eq!(c["args"]["cni"]["labels"][0]["value"], "a");
        assert_eq!(c["runtimeConfig"]["ips"][0], "10.244.9.9/32");
        assert_eq!(c["name"], crate::pod::NETWORK_NAME);
        let c = k8s_netconf(&n, crate::IpFamily::Ipv4, &BTreeMap::new(), None);
        assert!(c.get("runtimeConfig").is_none());
    }

    #[test]
    fn l4_round_trips() {
        for l in [L4::Tcp, L4::Udp, L4::Sctp] {
            assert_eq!(L4::parse(l.as_str()), Some(l));
        }
        assert_eq!(L4::parse("ICMP"), None);
    }

    #[test]
    fn matrix_diff_names_cells() {
        let pod = |n: &str| K8sPod {
            namespace: "x".into(),
            name: n.into(),
            lab_pod: format!("x-{n}"),
            node: "node1".into(),
            netns: "none".into(),
            ip: "10.0.0.1".parse().unwrap(),
        };
        let pods = [pod("a"), pod("b")];
        let want = vec![vec![true, false], vec![true, true]];
        let got = vec![vec![true, true], vec![true, true]];
        assert_eq!(
            matrix_diff(&pods, &want, &got),
            vec!["x/a -> x/b: want deny, got allow"]
        );
    }

    #[test]
    fn probes_reach_servers_on_loopback() {
        // Port 0 cannot be probed; use ephemeral ports found by binding.
        let port = {
            let t = TcpListener::bind("127.0.0.1:0").unwrap();
            t.local_addr().unwrap().port()
        };
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut b = [0u8; 64];
                let n = c.read(&mut b).unwrap();
                c.write_all(&b[..n]).unwrap();
            }
        });
        let t: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        probe(L4::Tcp, t, Duration::from_secs(1)).unwrap();
        let closed: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(probe(L4::Tcp, closed, Duration::from_millis(200)).is_err());
    }
}
