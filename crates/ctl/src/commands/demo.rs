//! `ternctl lab demo`: the whole story in one command. Builds a lab, adds pods with the real
//! CNI plugin, shows the nodes' interfaces and routes, proves pod→pod (TCP, UDP) and node→pod
//! (TCP) connectivity with real packets, prints `ipam show --show-blocks`, tears everything down
//! and prints a verdict. With several nodes (the multi-node part) pods are spread over the
//! nodes, every pod probes every other pod (cross-node pairs marked), and `ternctl get nodes -o
//! wide` shows the nodes' tunnel endpoints. Teardown happens on every path, including panics
//! (a guard's `Drop`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;
use tern_lab::process::{netns_exec, netns_with_prefix, output};
use tern_lab::traffic::Proto;
use tern_lab::{Encap, LabState, StoreKind, state};

/// Port of the echo servers (the classic echo port).
pub const ECHO_PORT: u16 = 7;
/// Most pods the demo adds.
pub const MAX_PODS: usize = 20;
/// Most nodes the demo builds.
pub const MAX_NODES: usize = 8;

/// What the demo builds.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// Pods (at least one per node when there are several nodes).
    pub pods: usize,
    /// Nodes.
    pub nodes: usize,
    /// Encapsulation between nodes.
    pub encap: Encap,
    /// Datastore.
    pub store: StoreKind,
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
fn show_ternctl(ternctl: &Path, st: &LabState, node_ns: &str, args: &[&str]) -> Result<(), String> {
    let url = st.store_url();
    println!("$ ternctl --store {url} {}", args.join(" "));
    let mut cmd = netns_exec(node_ns, ternctl);
    cmd.arg("--store").arg(&url).args(args);
    let out = output(&mut cmd).map_err(|e| e.to_string())?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.success() {
        Ok(())
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

/// Runs the demo for lab `name`; the process exit code (0 only when every step passed).
pub fn run(name: &str, bin_dir: &Path, o: &DemoOptions) -> anyhow::Result<i32> {
    if o.pods == 0 || o.pods > MAX_PODS {
        bail!("--pods must be between 1 and {MAX_PODS}");
    }
    if o.nodes == 0 || o.nodes > MAX_NODES {
        bail!("--nodes must be between 1 and {MAX_NODES}");
    }
    let pods = o.pods.max(o.nodes);
    let multi = o.nodes > 1;
    state::validate_name(name)?;
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

    'demo: {
        section(&format!(
            "lab up: {} node{}, encap {}, store {}, underlay in its own namespace{}",
            o.nodes,
            if multi { "s" } else { "" },
            o.encap,
            o.store,
            if o.encap == Encap::Crosssubnet {
                " (two subnets joined by a router namespace)"
            } else {
                ""
            }
        ));
        let mut opts = tern_lab::UpOptions::new(name, bin_dir);
        opts.nodes = o.nodes;
        opts.encap = o.encap;
        opts.store = o.store;
        match tern_lab::up(&opts) {
            Ok(s) => {
                for n in &s.nodes {
                    println!(
                        "node {}: netns {}, eth0 {}, ternd pid {}",
                        n.name,
                        n.netns,
                        n.address,
                        n.ternd_pid.map_or("-".into(), |p| p.to_string())
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
                    break 'demo;
                }
            }
        }

        for node in &nodes {
            section(&format!("interfaces and routes of {}", node.name));
            for args in [
                vec!["-n", node.netns.as_str(), "-br", "link"],
                vec!["-n", node.netns.as_str(), "route"],
            ] {
                match show_command(&args) {
                    Ok(()) => v.ok(),
                    Err(e) => v.fail(&format!("ip {}", args.join(" ")), e),
                }
            }
        }

        section(&format!(
            "echo servers in every pod (tcp {ECHO_PORT}, udp {ECHO_PORT})"
        ));
        for p in &pod_list {
            match tern_lab::start_server(s, &p.name, &ternctl, Some(ECHO_PORT), Some(ECHO_PORT)) {
                Ok(srv) => {
                    println!("echo server in {} (pid {})", p.name, srv.pid);
                    v.ok();
                }
                Err(e) => v.fail(&format!("echo server in {}", p.name), e),
            }
        }

        if multi {
            section("traffic: every pod -> every other pod (tcp, udp), across nodes");
            match tern_lab::mesh::check_mesh(
                s,
                ECHO_PORT,
                &[Proto::Tcp, Proto::Udp],
                std::time::Duration::from_secs(3),
            ) {
                Ok(report) => {
                    let node_of = |pod: &str| s.pod(pod).map(|p| p.node.clone()).ok();
                    for r in &report.results {
                        let cross = node_of(&r.src) != node_of(&r.dst);
                        println!("{r}{}", if cross { "  [cross-node]" } else { "" });
                        match &r.outcome {
                            Ok(_) => v.ok(),
                            Err(e) => {
                                v.fail(&format!("{} {} -> {}", r.proto.as_str(), r.src, r.dst), e)
                            }
                        }
                    }
                }
                Err(e) => v.fail("pod mesh", e),
            }
        } else {
            section("traffic: pod -> pod (tcp, udp) and node -> pod (tcp)");
        }
        for (i, dst) in pod_list.iter().enumerate() {
            let Some(ip) = dst.addresses.first() else {
                continue;
            };
            let target = format!("{ip}:{ECHO_PORT}");
            if !multi {
                // Each pod is probed by the previous one (the last probes the first).
                let src = &pod_list[(i + pod_list.len() - 1) % pod_list.len()];
                for proto in ["tcp", "udp"] {
                    let label = format!("{} -> {}", src.name, dst.name);
                    match probe(&ternctl, &src.netns, proto, &target, &label) {
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
                match probe(&ternctl, &node.netns, "tcp", &target, &label) {
                    Ok(()) => v.ok(),
                    Err(e) => v.fail(&format!("tcp {label}"), e),
                }
            }
        }

        if multi {
            section("ternctl get nodes -o wide");
            match show_ternctl(
                &ternctl,
                s,
                &nodes[0].netns,
                &["get", "nodes", "-o", "wide"],
            ) {
                Ok(()) => v.ok(),
                Err(e) => v.fail("get nodes -o wide", e),
            }
        }

        section("ternctl ipam show --show-blocks");
        match show_ternctl(
            &ternctl,
            s,
            &nodes[0].netns,
            &["ipam", "show", "--show-blocks"],
        ) {
            Ok(()) => v.ok(),
            Err(e) => v.fail("ipam show", e),
        }
    }

    if !v.failed.is_empty()
        && let Some(s) = &st
    {
        for n in &s.nodes {
            println!("\n--- last lines of {}'s ternd log ---", n.name);
            println!("{}", tern_lab::topology::log_tail(n, 30));
        }
    }

    section("teardown: CNI DEL every pod, then remove the lab");
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
