//! `ternctl lab demo`: the whole story in one command. Builds a lab (three nodes by default),
//! adds pods with the real CNI plugin, shows the nodes' interfaces and routes, checks that every
//! node routes every other node's address blocks (learned over BGP with `--encap none`, the
//! default, or carried by VXLAN), proves pod→pod (TCP, UDP; cross-node pairs marked) and
//! node→pod (TCP) connectivity with real packets, prints `ternctl get nodes -o wide`, `ipam show
//! --show-blocks` (checked: a block per node) and, with BGP, `ternctl node status` (checked:
//! every session Established), tears everything down and prints a verdict.
//!
//! `--kubernetes` runs the same story on a real cluster (kube-apiserver, kubelet, containerd's
//! CRI, kube-proxy; see docs/kubernetes.md): `kubectl get nodes -o wide`, a Deployment of
//! busybox pods, `kubectl get pod -A -o wide`, a node's `ip route`, the ipam blocks, the BGP
//! sessions and TCP/UDP traffic between pods on different nodes through `kubectl exec`.
//!
//! Teardown happens on every path, including panics (a guard's `Drop`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use tern_lab::kube::pods::{self, KubePod};
use tern_lab::process::{netns_exec, netns_with_prefix, output};
use tern_lab::traffic::Proto;
use tern_lab::{Encap, IpFamily, LabState, StoreKind, state};

/// Port of the echo servers (the classic echo port).
pub const ECHO_PORT: u16 = 7;
/// Most pods the demo adds.
pub const MAX_PODS: usize = 20;
/// Most nodes the demo builds.
pub const MAX_NODES: usize = 8;

/// What the demo builds.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Pods (at least one per node when there are several nodes).
    pub pods: usize,
    /// Nodes.
    pub nodes: usize,
    /// Encapsulation between nodes.
    pub encap: Encap,
    /// Address families of the lab; traffic is proven in each.
    pub ip_family: IpFamily,
    /// Datastore ([`StoreKind::Kubernetes`], with `kubernetes` only: the cluster's API server,
    /// no etcd of tern's and no host ternd).
    pub store: StoreKind,
    /// Run the agents with `--bgp` (routes between nodes learned over BGP).
    pub bgp: bool,
    /// Run a real Kubernetes cluster on the lab, with its components from this directory
    /// (`scripts/k8s-components.sh`).
    pub kubernetes: Option<PathBuf>,
}

/// Removes the lab when dropped, unless disarmed after an orderly teardown.
struct Teardown {
    name: String,
    armed: bool,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if self.armed {
            // No eprintln!: this may run while unwinding from a failed print (closed pipe), and
            // a second panic would abort before the lab is removed.
            let mut err = std::io::stderr();
            let _ = writeln!(err, "tearing down lab {} after an interruption", self.name);
            if let Err(e) = tern_lab::down(&self.name) {
                let _ = writeln!(err, "{e}");
            }
        }
    }
}

/// Steps and their outcome.
#[derive(Default)]
struct Verdict {
    steps: usize,
    failed: Vec<String>,
}

impl Verdict {
    fn ok(&mut self) {
        self.steps += 1;
    }
    fn fail(&mut self, step: &str, err: impl std::fmt::Display) {
        self.steps += 1;
        println!("FAILED: {step}: {err}");
        self.failed.push(step.to_string());
    }
}

fn section(title: &str) {
    println!("\n==> {title}");
}

/// Runs `ternctl lab probe` inside namespace `ns`; prints its line; true on success.
fn probe(ternctl: &Path, ns: &str, proto: &str, target: &str, label: &str) -> Result<(), String> {
    let mut cmd = netns_exec(ns, ternctl);
    cmd.args([
        "lab",
        "probe",
        &format!("--{proto}"),
        target,
        "--timeout-ms",
        "3000",
    ]);
    let out = output(&mut cmd).map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    println!("{line}  [{label}]");
    if out.status.success() && line.starts_with("ok ") {
        Ok(())
    } else {
        Err(format!("{line} {err}").trim().to_string())
    }
}

/// Runs ternctl inside a node's namespace against the lab's store (an etcd store is only
/// reachable from there) and prints its output.
fn show_ternctl(
    ternctl: &Path,
    st: &LabState,
    node_ns: &str,
    args: &[&str],
) -> Result<String, String> {
    let url = st.store_url();
    println!("$ ternctl --store {url} {}", args.join(" "));
    let mut cmd = netns_exec(node_ns, ternctl);
    cmd.arg("--store").arg(&url).args(args);
    let out = output(&mut cmd).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{text}");
    if out.status.success() {
        Ok(text)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn show_command(args: &[&str]) -> Result<(), String> {
    println!("$ ip {}", args.join(" "));
    let out = output(Command::new("ip").args(args)).map_err(|e| e.to_string())?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// `-4` and/or `-6`: the `ip` family flags of the lab's families.
fn ip_families(st: &LabState) -> Vec<&'static str> {
    let mut v = Vec::new();
    if st.ip_family.has_v4() {
        v.push("-4");
    }
    if st.ip_family.has_v6() {
        v.push("-6");
    }
    v
}

/// The node's routes of every family of the lab (`ip -4 route` then `ip -6 route`).
fn lab_routes(st: &LabState, netns: &str, extra: &[&str]) -> String {
    ip_families(st)
        .into_iter()
        .map(|fam| {
            let mut args = vec![fam, "route", "show"];
            args.extend_from_slice(extra);
            tern_lab::process::ip_in(netns, &args).unwrap_or_default()
        })
        .collect()
}

/// The blocks each node keeps for itself (its `blackhole` routes, every family of the lab),
/// in node order.
fn node_blocks(st: &LabState) -> Vec<(String, Vec<String>)> {
    st.nodes
        .iter()
        .map(|n| {
            let table = lab_routes(st, &n.netns, &["type", "blackhole"]);
            let blocks = table
                .lines()
                .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
                .collect();
            (n.name.clone(), blocks)
        })
        .collect()
}

/// How node routes reach the other nodes' blocks in this lab (for the headers).
fn route_kind(encap: Encap, bgp: bool) -> &'static str {
    match (encap, bgp) {
        (Encap::None, true) => "learned over BGP (proto 85, via the peer's underlay address)",
        (Encap::None, false) => "programmed by ternd from the store (proto 84)",
        (Encap::Vxlan, _) => "carried by VXLAN (dev vxlan.tern, onlink to the peer's VTEP)",
        (Encap::Crosssubnet, _) => {
            "direct within a subnet, VXLAN (dev vxlan.tern) across the router"
        }
        (Encap::Ipip, _) => "carried by IP-in-IP (dev tunl0, onlink to the peer)",
    }
}

/// The route of `table` (from `ip route`) that carries `block` the way the mode says, if any.
fn block_route<'a>(table: &'a str, block: &str, encap: Encap, bgp: bool) -> Option<&'a str> {
    table.lines().find(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(block)
            && match (encap, bgp) {
                (Encap::None, true) => l.contains(" via ") && l.contains("proto 85"),
                (Encap::None, false) => l.contains(" via "),
                (Encap::Vxlan, _) => vxlan_dev(l),
                (Encap::Crosssubnet, _) => l.contains(" via ") || vxlan_dev(l),
                (Encap::Ipip, _) => l.contains("dev tunl0"),
            }
    })
}

/// Whether an `ip route` line goes through one of tern's VXLAN devices (`vxlan.tern`, or
/// `vxlan-v6.tern` for IPv6 blocks).
fn vxlan_dev(line: &str) -> bool {
    line.contains("dev vxlan.tern") || line.contains("dev vxlan-v6.tern")
}

/// Waits (up to `timeout`) until node `idx` routes every block of every other node, and every
/// node has a block; prints the node's `ip route` (when `print_table`) and which route carries
/// each remote block.
fn check_routes(
    st: &LabState,
    idx: usize,
    encap: Encap,
    bgp: bool,
    timeout: Duration,
    print_table: bool,
) -> Result<(), String> {
    let node = &st.nodes[idx];
    let t = Instant::now();
    let (table, blocks, missing) = loop {
        let table = lab_routes(st, &node.netns, &[]);
        let blocks = node_blocks(st);
        let mut missing = Vec::new();
        for (other, bs) in &blocks {
            if bs.is_empty() {
                missing.push(format!("{other} has no block"));
            }
            if *other == node.name {
                continue;
            }
            for b in bs {
                if block_route(&table, b, encap, bgp).is_none() {
                    missing.push(format!("no route to {b} of {other}"));
                }
            }
        }
        if missing.is_empty() || t.elapsed() > timeout {
            break (table, blocks, missing);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    if print_table {
        for fam in ip_families(st) {
            println!("$ ip -n {} {fam} route", node.netns);
        }
        print!("{table}");
        println!();
    }
    for (other, bs) in &blocks {
        for b in bs {
            if *other == node.name {
                let host = if b.contains(':') { 128 } else { 32 };
                println!(
                    "{b}: {}'s own block (blackhole; its pods have /{host} routes)",
                    node.name
                );
            } else if let Some(r) = block_route(&table, b, encap, bgp) {
                println!("{b}: block of {other}, routed by {}: {r}", node.name);
            }
        }
    }
    if missing.is_empty() {
        println!(
            "ok routes: {} reaches every other node's blocks after {:.1?}",
            node.name,
            t.elapsed()
        );
        Ok(())
    } else {
        Err(format!(
            "after {timeout:?} on {}: {}",
            node.name,
            missing.join("; ")
        ))
    }
}

/// Checks that `ipam show --show-blocks` lists every node's block(s).
fn check_ipam_blocks(st: &LabState, shown: &str) -> Result<(), String> {
    let mut missing = Vec::new();
    for (node, bs) in node_blocks(st) {
        if bs.is_empty() {
            missing.push(format!("{node} has no block"));
        }
        for b in bs {
            if !shown.contains(&b) {
                missing.push(format!("block {b} of {node} not shown"));
            } else {
                println!("ok block {b} of {node}");
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join("; "))
    }
}

/// `ternctl node status` against node `idx`'s agent: prints it, checks that it has an
/// Established session with every other node.
fn show_node_status(ternctl: &Path, st: &LabState, idx: usize) -> Result<(), String> {
    let n = &st.nodes[idx];
    let peers = st.nodes.len() - 1;
    let t = Instant::now();
    loop {
        let out = output(
            Command::new(ternctl)
                .args(["node", "status", "--socket"])
                .arg(&n.socket),
        )
        .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let up = text.matches("Established").count();
        if (out.status.success() && up >= peers) || t.elapsed() > Duration::from_secs(30) {
            println!("$ ternctl node status   # on {}", n.name);
            print!("{text}");
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
            }
            if up < peers {
                return Err(format!(
                    "{} of {peers} BGP sessions Established on {}",
                    up, n.name
                ));
            }
            println!("ok bgp: {} has {up} Established sessions", n.name);
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs the demo for lab `name`; the process exit code (0 only when every step passed).
pub fn run(name: &str, bin_dir: &Path, o: &DemoOptions) -> anyhow::Result<i32> {
    if o.pods == 0 || o.pods > MAX_PODS {
        bail!("--pods must be between 1 and {MAX_PODS}");
    }
    if o.nodes == 0 || o.nodes > MAX_NODES {
        bail!("--nodes must be between 1 and {MAX_NODES}");
    }
    state::validate_name(name)?;
    if let Some(k8s) = &o.kubernetes {
        // Before building anything: a missing component is an error at once, naming the
        // script that builds it.
        tern_lab::kube::check_binaries(k8s)?;
    }
    // Never adopt (and so never tear down) a lab someone else built.
    if LabState::load(name)?.is_some() || !netns_with_prefix(&state::ns_prefix(name)).is_empty() {
        bail!(
            "lab {name:?} already exists; use another --name or remove it with `ternctl lab down --name {name}`"
        );
    }
    let ternctl: PathBuf = std::env::current_exe()?;
    let mut guard = Teardown {
        name: name.to_string(),
        armed: true,
    };
    let mut v = Verdict::default();
    let mut st: Option<LabState> = None;
    let multi = o.nodes > 1;

    'demo: {
        section(&format!(
            "lab up: {} node{}, encap {}{}, store {}{}, underlay in its own namespace{}",
            o.nodes,
            if multi { "s" } else { "" },
            o.encap,
            match o.ip_family {
                IpFamily::Ipv4 => String::new(),
                f => format!(", ip-family {f}"),
            },
            o.store,
            if o.bgp { ", BGP full mesh" } else { "" },
            if o.encap == Encap::Crosssubnet {
                " (two subnets joined by a router namespace)"
            } else {
                ""
            }
        ));
        let mut opts = tern_lab::UpOptions::new(name, bin_dir);
        opts.nodes = o.nodes;
        opts.encap = o.encap;
        opts.ip_family = o.ip_family;
        opts.store = o.store;
        if o.bgp {
            opts.agent_args.push("--bgp".into());
        }
        match tern_lab::up(&opts) {
            Ok(s) => {
                for n in &s.nodes {
                    let agent = match n.ternd_pid {
                        Some(p) => format!("ternd pid {p}"),
                        // The Kubernetes datastore: the cluster's API server, not up yet.
                        None => "ternd from the tern-node DaemonSet, once the cluster runs".into(),
                    };
                    println!(
                        "node {}: netns {}, eth0 {}, {agent}",
                        n.name,
                        n.netns,
                        n.addresses().join(", ")
                    );
                }
                st = Some(s);
                v.ok();
            }
            Err(e) => {
                v.fail("lab up", e);
                break 'demo;
            }
        }
        let Some(s) = st.as_mut() else { break 'demo };
        match &o.kubernetes {
            Some(k8s) => kube_steps(&ternctl, s, o, k8s, &mut v),
            None => lab_steps(&ternctl, s, o, &mut v),
        }
    }

    if !v.failed.is_empty()
        && let Some(s) = &st
    {
        for n in &s.nodes {
            println!("\n--- last lines of {}'s ternd log ---", n.name);
            println!("{}", tern_lab::topology::log_tail(n, 30));
        }
        if let Some(k) = &s.kube {
            for n in &k.nodes {
                for p in &n.procs {
                    println!("\n--- last lines of {}'s {} log ---", n.name, p.name);
                    println!("{}", p.log_tail(15));
                }
            }
        }
    }

    section(if o.kubernetes.is_some() {
        "teardown: remove the cluster (pods, kubelet, containerd, cgroups, sysctls restored) and the lab"
    } else {
        "teardown: CNI DEL every pod, then remove the lab"
    });
    if let Some(mut s) = st.take() {
        let pods: Vec<String> = s.pods.iter().map(|p| p.name.clone()).collect();
        for p in pods {
            match tern_lab::del_pod(&mut s, &p) {
                Ok(()) => {
                    println!("deleted pod {p} (CNI DEL)");
                    v.ok();
                }
                Err(e) => v.fail(&format!("delete {p}"), e),
            }
        }
    }
    match tern_lab::down(name) {
        Ok(done) => {
            for line in done {
                println!("{line}");
            }
            v.ok();
        }
        Err(e) => v.fail("lab down", e),
    }
    guard.armed = false;

    println!();
    if v.failed.is_empty() {
        println!("PASS: all {} steps succeeded", v.steps);
        Ok(0)
    } else {
        println!(
            "FAIL: {} of {} steps failed: {}",
            v.failed.len(),
            v.steps,
            v.failed.join("; ")
        );
        Ok(1)
    }
}

/// The demo on the lab itself: pods added with the CNI plugin by hand.
fn lab_steps(ternctl: &Path, s: &mut LabState, o: &DemoOptions, v: &mut Verdict) {
    let pods = o.pods.max(o.nodes);
    let multi = o.nodes > 1;
    let nodes = s.nodes.clone();

    section(&format!(
        "add {pods} pods with the tern CNI plugin (CNI ADD)"
    ));
    let mut pod_list = Vec::new();
    for i in 1..=pods {
        let pod = format!("pod{i}");
        // Round robin, so every node has pods when there are at least as many pods.
        let node = &nodes[(i - 1) % nodes.len()];
        match tern_lab::add_pod(s, &node.name, &pod) {
            Ok(p) => {
                println!(
                    "pod {} on {} (netns {}): {}",
                    p.name,
                    p.node,
                    p.netns,
                    p.addresses.join(", ")
                );
                pod_list.push(p);
                v.ok();
            }
            Err(e) => {
                v.fail(&format!("add {pod}"), e);
                return;
            }
        }
    }

    for node in &nodes {
        section(&format!("interfaces and routes of {}", node.name));
        let mut shows = vec![vec!["-n", node.netns.as_str(), "-br", "link"]];
        for fam in ip_families(s) {
            shows.push(vec!["-n", node.netns.as_str(), fam, "route"]);
        }
        for args in shows {
            match show_command(&args) {
                Ok(()) => v.ok(),
                Err(e) => v.fail(&format!("ip {}", args.join(" ")), e),
            }
        }
    }

    if multi {
        section(&format!(
            "routes of {} to the other nodes' blocks: {}",
            nodes[0].name,
            route_kind(o.encap, o.bgp)
        ));
        match check_routes(s, 0, o.encap, o.bgp, Duration::from_secs(60), false) {
            Ok(()) => v.ok(),
            Err(e) => v.fail("routes to other nodes' blocks", e),
        }
    }

    section(&format!(
        "echo servers in every pod (tcp {ECHO_PORT}, udp {ECHO_PORT})"
    ));
    for p in &pod_list {
        match tern_lab::start_server(s, &p.name, ternctl, Some(ECHO_PORT), Some(ECHO_PORT)) {
            Ok(srv) => {
                println!("echo server in {} (pid {})", p.name, srv.pid);
                v.ok();
            }
            Err(e) => v.fail(&format!("echo server in {}", p.name), e),
        }
    }

    let families = s.ip_family.families();
    for &v6 in families.iter().filter(|_| multi) {
        section(&format!(
            "traffic: every pod -> every other pod (tcp, udp) over {}, across nodes",
            state::family_name(v6)
        ));
        match tern_lab::mesh::check_mesh_family(
            s,
            ECHO_PORT,
            &[Proto::Tcp, Proto::Udp],
            Duration::from_secs(3),
            v6,
        ) {
            Ok(report) => {
                let node_of = |pod: &str| s.pod(pod).map(|p| p.node.clone()).ok();
                let mut cross_ok = 0;
                for r in &report.results {
                    let cross = node_of(&r.src) != node_of(&r.dst);
                    println!("{r}{}", if cross { "  [cross-node]" } else { "" });
                    match &r.outcome {
                        Ok(_) => {
                            cross_ok += usize::from(cross);
                            v.ok()
                        }
                        Err(e) => {
                            v.fail(&format!("{} {} -> {}", r.proto.as_str(), r.src, r.dst), e)
                        }
                    }
                }
                println!("ok cross-node: {cross_ok} probes between pods on different nodes");
            }
            Err(e) => v.fail("pod mesh", e),
        }
    }
    if !multi {
        section("traffic: pod -> pod (tcp, udp) and node -> pod (tcp)");
    }
    let targets = pod_list.iter().enumerate().flat_map(|(i, dst)| {
        families.iter().filter_map(move |v6| {
            let ip = tern_lab::mesh::pod_ip_of(dst, *v6)?;
            Some((i, dst, std::net::SocketAddr::new(ip, ECHO_PORT).to_string()))
        })
    });
    for (i, dst, target) in targets {
        if !multi {
            // Each pod is probed by the previous one (the last probes the first).
            let src = &pod_list[(i + pod_list.len() - 1) % pod_list.len()];
            for proto in ["tcp", "udp"] {
                let label = format!("{} -> {}", src.name, dst.name);
                match probe(ternctl, &src.netns, proto, &target, &label) {
                    Ok(()) => v.ok(),
                    Err(e) => v.fail(&format!("{proto} {label}"), e),
                }
            }
        }
        // The pod's own node reaches it directly; another node over the pod network.
        let probers: Vec<_> = nodes
            .iter()
            .filter(|n| n.name == dst.node || (multi && i == 0))
            .collect();
        for node in probers {
            let label = format!("{} -> {}", node.name, dst.name);
            match probe(ternctl, &node.netns, "tcp", &target, &label) {
                Ok(()) => v.ok(),
                Err(e) => v.fail(&format!("tcp {label}"), e),
            }
        }
    }

    if multi {
        section("ternctl get nodes -o wide");
        match show_ternctl(ternctl, s, &nodes[0].netns, &["get", "nodes", "-o", "wide"]) {
            Ok(_) => v.ok(),
            Err(e) => v.fail("get nodes -o wide", e),
        }
    }
    ipam_and_bgp(ternctl, s, o, v);
}

/// `ipam show --show-blocks` (a block per node) and, with BGP, `node status`.
fn ipam_and_bgp(ternctl: &Path, s: &LabState, o: &DemoOptions, v: &mut Verdict) {
    section("ternctl ipam show --show-blocks: a block per node");
    match show_ternctl(
        ternctl,
        s,
        &s.nodes[0].netns,
        &["ipam", "show", "--show-blocks"],
    ) {
        Ok(shown) => {
            v.ok();
            match check_ipam_blocks(s, &shown) {
                Ok(()) => v.ok(),
                Err(e) => v.fail("a block per node", e),
            }
        }
        Err(e) => v.fail("ipam show", e),
    }
    if o.bgp && s.nodes.len() > 1 {
        section(&format!(
            "ternctl node status: BGP sessions of {}",
            s.nodes[0].name
        ));
        match show_node_status(ternctl, s, 0) {
            Ok(()) => v.ok(),
            Err(e) => v.fail("node status", e),
        }
    }
}

/// Pods of the demo's Deployment: a busybox `nc` answering TCP with the pod's name, and the
/// probe image answering UDP with it; spread evenly over the nodes.
fn deployment(replicas: usize) -> String {
    pods::echo_deployment("demo", replicas, false)
}

/// Waits until exactly `n` pods of the Deployment are Running with an address.
fn wait_kube_pods(k: &tern_lab::kube::KubeState, n: usize) -> Result<Vec<KubePod>, String> {
    let list = [
        "get",
        "pods",
        "-l",
        "app=demo",
        "-o",
        pods::POD_LINES_JSONPATH,
    ];
    pods::wait_running(n, Duration::from_secs(180), || {
        tern_lab::kube::kubectl(k, &list).map_err(|e| e.to_string())
    })
}

/// Prints `kubectl ARGS` (run in the control-plane namespace with the admin kubeconfig).
fn show_kubectl(k: &tern_lab::kube::KubeState, args: &[&str]) -> Result<String, String> {
    println!("$ kubectl {}", args.join(" "));
    let out = tern_lab::kube::kubectl(k, args).map_err(|e| e.to_string())?;
    print!("{out}");
    Ok(out)
}

/// The demo on a real Kubernetes cluster: kubelet creates the pods through containerd's CRI,
/// which runs tern as the CNI.
fn kube_steps(ternctl: &Path, s: &mut LabState, o: &DemoOptions, k8s: &Path, v: &mut Verdict) {
    section(&format!(
        "kubernetes {}: control plane in its own namespace; containerd, kubelet, kube-proxy on every node; tern as the CNI",
        tern_lab::kube::K8S_VERSION
    ));
    let mut ko = tern_lab::kube::KubeOptions::from_env();
    ko.k8s_bin = k8s.to_path_buf();
    let t = Instant::now();
    if let Err(e) = tern_lab::kube::up(s, &ko) {
        v.fail("kubernetes up", e);
        return;
    }
    v.ok();
    let Some(k) = s.kube.clone() else {
        v.fail("kubernetes up", "no cluster state after up");
        return;
    };
    print!("{}", tern_lab::kube::status(&k));
    println!("cluster up, every node Ready, after {:.1?}", t.elapsed());

    section("kubectl get nodes -o wide");
    match show_kubectl(&k, &["get", "nodes", "-o", "wide"]) {
        Ok(out) => {
            let ready = out.lines().filter(|l| l.contains(" Ready ")).count();
            if ready == s.nodes.len() {
                v.ok();
            } else {
                v.fail(
                    "nodes Ready",
                    format!("{ready} of {} nodes Ready", s.nodes.len()),
                );
            }
        }
        Err(e) => v.fail("kubectl get nodes", e),
    }

    let replicas = o.pods.max(o.nodes);
    section(&format!(
        "a Deployment of {replicas} busybox pods (imagePullPolicy: Never), spread over the nodes"
    ));
    let manifest = k.dir.join("demo-deployment.yaml");
    let yaml = deployment(replicas);
    print!("{yaml}");
    if let Err(e) = std::fs::write(&manifest, &yaml) {
        v.fail("write the Deployment", e);
        return;
    }
    let path = manifest.display().to_string();
    match show_kubectl(&k, &["apply", "-f", &path]) {
        Ok(_) => v.ok(),
        Err(e) => {
            v.fail("kubectl apply", e);
            return;
        }
    }
    let t = Instant::now();
    let pods = match wait_kube_pods(&k, replicas) {
        Ok(p) => {
            println!("{replicas} pods Running after {:.1?}", t.elapsed());
            v.ok();
            p
        }
        Err(e) => {
            v.fail("pods Running", e);
            let _ = show_kubectl(&k, &["get", "pod", "-A", "-o", "wide"]);
            return;
        }
    };

    section("kubectl get pod -A -o wide: every pod has an address from tern's pool");
    let _ = show_kubectl(&k, &["get", "pod", "-A", "-o", "wide"]);
    let pool: Option<ipnet::Ipv4Net> = k.cluster_cidr.parse().ok();
    for n in &s.nodes {
        let on: Vec<&KubePod> = pods.iter().filter(|p| p.node == n.name).collect();
        let in_pool = |p: &&KubePod| {
            p.ip.parse::<std::net::Ipv4Addr>()
                .ok()
                .zip(pool)
                .is_some_and(|(ip, pool)| pool.contains(&ip))
        };
        if !on.is_empty() && on.iter().all(in_pool) {
            let list: Vec<String> = on.iter().map(|p| format!("{} {}", p.name, p.ip)).collect();
            println!(
                "ok pods on {} in {}: {}",
                n.name,
                k.cluster_cidr,
                list.join(", ")
            );
            v.ok();
        } else {
            v.fail(
                &format!("pods on {}", n.name),
                format!("expected pods with addresses in {} on it", k.cluster_cidr),
            );
        }
    }
    if o.store == StoreKind::Kubernetes {
        section(
            "kubectl get ippools,ipamblocks -o wide: tern's state is custom resources in the API server",
        );
        match show_kubectl(&k, &["get", "ippools.tern.dev,ipamblocks", "-o", "wide"]) {
            Ok(out) => {
                let blocks = out.lines().filter(|l| l.starts_with("ipamblock")).count();
                if out.contains(&k.cluster_cidr) && blocks >= s.nodes.len() {
                    v.ok();
                } else {
                    v.fail(
                        "kubectl get ipamblocks",
                        format!("expected the pool {} and a block per node", k.cluster_cidr),
                    );
                }
            }
            Err(e) => v.fail("kubectl get ippools,ipamblocks", e),
        }
    }
    section("ternctl get wep -o wide: tern's endpoints of those pods");
    match show_ternctl(ternctl, s, &s.nodes[0].netns, &["get", "wep", "-o", "wide"]) {
        Ok(weps) => {
            let missing: Vec<&str> = pods
                .iter()
                .filter(|p| {
                    !weps
                        .lines()
                        .any(|l| l.contains(&p.name) && l.contains(&format!("{}/", p.ip)))
                })
                .map(|p| p.name.as_str())
                .collect();
            if missing.is_empty() {
                v.ok();
            } else {
                v.fail(
                    "endpoints",
                    format!("no endpoint for {}", missing.join(", ")),
                );
            }
        }
        Err(e) => v.fail("get wep", e),
    }

    section(&format!(
        "ip route of {}: the other nodes' blocks {}",
        s.nodes[0].name,
        route_kind(o.encap, o.bgp)
    ));
    match check_routes(s, 0, o.encap, o.bgp, Duration::from_secs(60), true) {
        Ok(()) => v.ok(),
        Err(e) => v.fail("routes to other nodes' blocks", e),
    }

    ipam_and_bgp(ternctl, s, o, v);

    section("traffic between pods on different nodes (kubectl exec; tcp 8080 via nc, udp 8081)");
    // One source pod per node, to every pod on another node.
    let mut sources: Vec<&KubePod> = Vec::new();
    for p in &pods {
        if !sources.iter().any(|q| q.node == p.node) {
            sources.push(p);
        }
    }
    for a in &sources {
        for b in pods.iter().filter(|b| b.node != a.node) {
            for (proto, args) in [
                (
                    "tcp",
                    vec![
                        "exec", &a.name, "-c", "web", "--", "nc", "-w", "3", &b.ip, "8080",
                    ],
                ),
                (
                    "udp",
                    vec![
                        "exec", &a.name, "-c", "udp", "--", "/probe", "udp", &b.ip, "8081",
                    ],
                ),
            ] {
                let label = format!(
                    "{} ({}, {}) -> {} ({}, {})",
                    a.name, a.node, a.ip, b.name, b.node, b.ip
                );
                match tern_lab::kube::kubectl(&k, &args).map(|s| s.trim().to_string()) {
                    Ok(answer) if answer == b.name => {
                        println!("ok {proto} {label}: answered {answer}  [cross-node]");
                        v.ok();
                    }
                    other => v.fail(&format!("{proto} {label}"), format!("{other:?}")),
                }
            }
        }
    }
}
