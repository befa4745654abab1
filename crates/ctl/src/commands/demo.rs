//! `ternctl lab demo`: the whole story in one command. Builds a one-node lab, adds pods with
//! the real CNI plugin, shows the node's interfaces and routes, proves pod→pod (TCP, UDP) and
//! node→pod (TCP) connectivity with real packets, prints `ipam show --show-blocks`, tears
//! everything down and prints a verdict. Teardown happens on every path, including panics
//! (a guard's `Drop`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;
use tern_lab::process::{netns_exec, netns_with_prefix, output};
use tern_lab::{LabState, state};

/// Port of the echo servers (the classic echo port).
pub const ECHO_PORT: u16 = 7;
/// Most pods the demo adds.
pub const MAX_PODS: usize = 20;

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
pub fn run(name: &str, bin_dir: &Path, pods: usize) -> anyhow::Result<i32> {
    if pods == 0 || pods > MAX_PODS {
        bail!("--pods must be between 1 and {MAX_PODS}");
    }
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
        section("lab up: 1 node, underlay 198.18.0.0/24 in its own namespace");
        let opts = tern_lab::UpOptions::new(name, bin_dir);
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
        let node = s.nodes[0].clone();

        section(&format!(
            "add {pods} pods with the tern CNI plugin (CNI ADD)"
        ));
        let mut pod_list = Vec::new();
        for i in 1..=pods {
            let pod = format!("pod{i}");
            match tern_lab::add_pod(s, &node.name, &pod) {
                Ok(p) => {
                    println!(
                        "pod {} (netns {}): {}",
                        p.name,
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

        section("traffic: pod -> pod (tcp, udp) and node -> pod (tcp)");
        for (i, dst) in pod_list.iter().enumerate() {
            let Some(ip) = dst.addresses.first() else {
                continue;
            };
            let target = format!("{ip}:{ECHO_PORT}");
            // Each pod is probed by the previous one (the last probes the first).
            let src = &pod_list[(i + pod_list.len() - 1) % pod_list.len()];
            for proto in ["tcp", "udp"] {
                let label = format!("{} -> {}", src.name, dst.name);
                match probe(&ternctl, &src.netns, proto, &target, &label) {
                    Ok(()) => v.ok(),
                    Err(e) => v.fail(&format!("{proto} {label}"), e),
                }
            }
            let label = format!("{} -> {}", node.name, dst.name);
            match probe(&ternctl, &node.netns, "tcp", &target, &label) {
                Ok(()) => v.ok(),
                Err(e) => v.fail(&format!("tcp {label}"), e),
            }
        }

        section("ternctl ipam show --show-blocks");
        let shown = tern_store::open(&s.store_url())
            .map_err(anyhow::Error::from)
            .and_then(|store| super::ipam_show::show(store, true));
        match shown {
            Ok(table) => {
                print!("{table}");
                v.ok();
            }
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
