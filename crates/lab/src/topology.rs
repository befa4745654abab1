//! Creating, describing and removing a lab: the underlay, the nodes and their agents.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::process::{self, ip_in, netns_add, netns_del, netns_exec, sysctl_in};
use crate::state::{self, LabState, NodeState};
use crate::{LabError, Result};

/// Address of the underlay bridge: the nodes' default gateway.
pub const UNDERLAY_GATEWAY: &str = "198.18.0.1";
/// Prefix length of the underlay subnet.
pub const UNDERLAY_PREFIX: u8 = 24;
/// Most nodes a lab may have (addresses 198.18.0.11 ..).
pub const MAX_NODES: usize = 200;

/// How to build a lab.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// Lab name (see [`state::validate_name`]).
    pub name: String,
    /// Number of nodes.
    pub nodes: usize,
    /// Directory holding `tern`, `tern-ipam` and `ternd`.
    pub bin_dir: PathBuf,
    /// `--default-ipv4-pool` passed to every agent, when set.
    pub default_ipv4_pool: Option<String>,
    /// How long to wait for each agent's socket.
    pub agent_timeout: Duration,
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
        }
    }
}

/// Underlay address of node `i` (1-based).
pub fn node_address(i: usize) -> String {
    format!("198.18.0.{}", 10 + i)
}

/// Builds the lab and starts one agent per node. The state file is updated after every step,
/// so on error [`down`] removes whatever was created.
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
    let mut st = LabState::new(&opts.name, &opts.bin_dir);
    st.save()?;

    let ul = state::underlay_ns(&opts.name);
    netns_add(&ul)?;
    st.namespaces.push(ul.clone());
    st.save()?;
    ip_in(&ul, &["link", "set", "lo", "up"])?;
    ip_in(&ul, &["link", "add", "br0", "type", "bridge"])?;
    ip_in(
        &ul,
        &[
            "addr",
            "add",
            &format!("{UNDERLAY_GATEWAY}/{UNDERLAY_PREFIX}"),
            "dev",
            "br0",
        ],
    )?;
    ip_in(&ul, &["link", "set", "br0", "up"])?;

    for i in 1..=opts.nodes {
        add_node(&mut st, opts, i)?;
    }
    for n in &st.nodes {
        wait_for_agent(n, opts.agent_timeout)?;
    }
    Ok(st)
}

fn add_node(st: &mut LabState, opts: &UpOptions, i: usize) -> Result<()> {
    let name = format!("node{i}");
    let ns = state::node_ns(&st.name, &name);
    let ul = state::underlay_ns(&st.name);
    netns_add(&ns)?;
    st.namespaces.push(ns.clone());
    let dir = st.dir().join(&name);
    let node = NodeState {
        name: name.clone(),
        netns: ns.clone(),
        address: node_address(i),
        ternd_pid: None,
        socket: dir.join("ternd.sock"),
        state_dir: dir.clone(),
    };
    st.nodes.push(node.clone());
    st.save()?;

    // The veth's node end is created directly inside the node namespace, named eth0 there.
    let ul_end = format!("n{i}");
    ip_in(
        &ul,
        &[
            "link", "add", &ul_end, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ],
    )?;
    ip_in(&ul, &["link", "set", &ul_end, "master", "br0", "up"])?;
    ip_in(&ns, &["link", "set", "lo", "up"])?;
    ip_in(
        &ns,
        &[
            "addr",
            "add",
            &format!("{}/{UNDERLAY_PREFIX}", node.address),
            "dev",
            "eth0",
        ],
    )?;
    ip_in(&ns, &["link", "set", "eth0", "up"])?;
    // Proxy-ARP for 169.254.1.1 needs a route covering it: the default route.
    ip_in(&ns, &["route", "add", "default", "via", UNDERLAY_GATEWAY])?;
    sysctl_in(&ns, "net.ipv4.ip_forward", "1")?;

    std::fs::create_dir_all(&dir)
        .map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
    let log_path = dir.join("ternd.log");
    let log = File::create(&log_path)
        .map_err(|e| LabError::io(format!("cannot create {}", log_path.display()), e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| LabError::io(format!("cannot reopen {}", log_path.display()), e))?;
    let mut cmd = netns_exec(&ns, &opts.bin_dir.join("ternd"));
    cmd.arg("--node-name")
        .arg(&name)
        .arg("--store")
        .arg(st.store_url())
        .arg("--socket")
        .arg(&node.socket)
        .arg("--state-dir")
        .arg(&node.state_dir);
    if let Some(pool) = &opts.default_ipv4_pool {
        cmd.arg("--default-ipv4-pool").arg(pool);
    }
    // Own process group: a Ctrl-C aimed at ternctl does not kill the agents mid-teardown.
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0);
    let child = cmd.spawn().map_err(|e| LabError::Spawn {
        command: process::describe(&cmd),
        source: e,
    })?;
    // `ip netns exec` execs the program, so this PID is ternd's.
    if let Some(n) = st.nodes.iter_mut().find(|n| n.name == name) {
        n.ternd_pid = Some(child.id());
    }
    st.save()
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
    let text = std::fs::read_to_string(node.state_dir.join("ternd.log")).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Removes lab `name` entirely: stops echo servers, deletes pods (CNI DEL while the agents
/// still run), stops the agents, deletes every `tl-<name>-` namespace and the state directory.
/// Works on a half-built lab and on a lab without state file. Returns what was done; errors
/// are collected, not stopping at the first, and returned together at the end.
pub fn down(name: &str) -> Result<Vec<String>> {
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
pub fn status(name: &str) -> Result<String> {
    let Some(st) = LabState::load(name)? else {
        return Err(LabError::Invalid(format!("lab {name:?} does not exist")));
    };
    let mut out = format!("lab {}  (state {})\n", st.name, st.dir().display());
    out.push_str(&format!("store {}\n", st.store_url()));
    for n in &st.nodes {
        let agent = match n.ternd_pid {
            Some(pid) if process::is_ours(pid, &n.socket.display().to_string()) => {
                format!("ternd running (pid {pid})")
            }
            Some(pid) => format!("ternd NOT running (was pid {pid})"),
            None => "ternd not started".to_string(),
        };
        out.push_str(&format!(
            "node {}  netns {}  eth0 {}  {agent}\n",
            n.name, n.netns, n.address
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
        assert!(!state::lab_dir("t0").exists());
    }
}
