//! The one harness of tern-ctl's lab tests (issue 11): the guards (root, BIRD, the Kubernetes
//! components; a missing one fails the test, tern-testkit), binaries that are never stale,
//! `ternctl lab` runs, unique lab names and a teardown guard.
//!
//! Each test file includes it with `mod common;`. A file uses only part of it, hence the
//! `dead_code` allowance below.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tern_lab::{LabState, mesh};

pub mod flow_check;
pub mod kube_lab;

/// The ternctl under test (built by cargo for this test binary).
pub fn ternctl() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ternctl"))
}

/// The directory of the workspace's binaries, checked current (tern-testkit's
/// `workspace_binaries`: a lab never runs a stale `ternd`, and no test runs cargo).
pub fn fresh_binaries() -> &'static Path {
    tern_testkit::workspace_binaries(Path::new(env!("CARGO_BIN_EXE_ternctl")))
}

/// The guard of a lab test: root (tern-testkit's `need_root`), then [`fresh_binaries`].
#[track_caller]
pub fn lab_ready() -> &'static Path {
    tern_testkit::need_root();
    fresh_binaries()
}

/// A lab name of our own, so that a user's `ternctl lab` or a concurrent test is never
/// touched: `tag` (at most 6 lowercase letters or digits) and 6 random hex digits, within
/// tern-lab's 12-character limit.
pub fn lab_name(tag: &str) -> String {
    assert!(
        tag.len() <= 6,
        "lab tag {tag:?}: at most 6 characters, names have 12"
    );
    format!("{tag}{}", tern_lab::process::random_hex(3))
}

/// The seed of a random lab: `TERN_RANDOM_SEED` (decimal or `0x` hex; `clock` for a new one
/// each run), or `default` without it.
pub fn random_seed(default: u64) -> u64 {
    match std::env::var("TERN_RANDOM_SEED").as_deref() {
        Err(_) => default,
        Ok("clock") => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            // splitmix64's finaliser: close clocks give unrelated seeds.
            let mut x = t.as_nanos() as u64;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (x ^ (x >> 31)) | 1
        }
        Ok(s) => {
            let s = s.trim();
            let v = match s.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => s.parse(),
            };
            match v {
                Ok(v) if v != 0 => v,
                _ => panic!(
                    "TERN_RANDOM_SEED={s:?}: want a non-zero decimal or 0x hex number, or clock"
                ),
            }
        }
    }
}

/// What a `ternctl` run printed.
pub struct Run {
    pub out: Output,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Whether ternctl exited with status 0.
    pub fn ok(&self) -> bool {
        self.out.status.success()
    }
}

/// Runs `ternctl lab --name NAME --bin-dir DIR ARGS...` and collects its output.
pub fn ternctl_lab(name: &str, bin_dir: &Path, args: &[&str]) -> Run {
    let out = Command::new(ternctl())
        .args(["lab", "--name", name, "--bin-dir"])
        .arg(bin_dir)
        .args(args)
        .output()
        .expect("ternctl runs");
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        out,
    }
}

/// `ternctl lab --name NAME --bin-dir DIR demo ARGS...`, the README's main command, timed
/// on stderr.
pub fn lab_demo(name: &str, bin_dir: &Path, args: &[&str]) -> Run {
    let t = Instant::now();
    let mut all = vec!["demo"];
    all.extend_from_slice(args);
    let run = ternctl_lab(name, bin_dir, &all);
    eprintln!("ternctl lab demo {}: {:?}", args.join(" "), t.elapsed());
    run
}

/// Nothing of lab `name` is left: no state directory, no namespace.
#[track_caller]
pub fn assert_lab_gone(name: &str) {
    assert!(
        !Path::new("/run/tern-lab").join(name).exists(),
        "state directory of {name} left"
    );
    let prefix = tern_lab::state::ns_prefix(name);
    let left = tern_lab::process::netns_with_prefix(&prefix);
    assert!(left.is_empty(), "namespaces left: {left:?}");
}

/// The nodes of a demo's `ok block <cidr> of <node>` lines.
pub fn nodes_with_blocks(out: &str) -> std::collections::BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("ok block "))
        .filter_map(|l| l.split(" of ").nth(1).map(str::to_string))
        .collect()
}

/// A lab that is removed when dropped (test passed, failed or panicked).
pub struct Lab {
    pub name: String,
    pub st: LabState,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = tern_lab::down(&self.name) {
            eprintln!("teardown of lab {}: {e}", self.name);
        }
    }
}

impl Lab {
    /// The guard of lab `name`, before it is up: whatever `up` leaves behind is removed.
    pub fn guard(name: &str) -> Lab {
        Lab {
            name: name.to_string(),
            st: LabState::default(),
        }
    }

    /// Brings the lab of `o` up, guarded; panics with the error.
    pub fn up(o: &tern_lab::UpOptions) -> Lab {
        let mut lab = Lab::guard(&o.name);
        lab.st = tern_lab::up(o).unwrap_or_else(|e| panic!("lab up {}: {e}", o.name));
        lab
    }

    /// The last `lines` lines of every node's ternd log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        self.st
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "\n--- {} ternd log ---\n{}",
                    n.name,
                    tern_lab::topology::log_tail(n, lines)
                )
            })
            .collect()
    }

    /// As [`Lab::logs`], with every node's routes.
    pub fn logs_and_routes(&self, lines: usize) -> String {
        self.st
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "\n--- {} ternd log ---\n{}\n--- {} routes ---\n{}",
                    n.name,
                    tern_lab::topology::log_tail(n, lines),
                    n.name,
                    mesh::routes(&self.st, &n.name).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Adds pod `pod` on `node` with an echo server (TCP on `tcp`, UDP on `udp`); panics with
    /// the nodes' logs and routes.
    pub fn add_echo_pod(&mut self, node: &str, pod: &str, tcp: Option<u16>, udp: Option<u16>) {
        if let Err(e) = tern_lab::add_pod(&mut self.st, node, pod) {
            panic!("add {pod}: {e}{}", self.logs_and_routes(15));
        }
        tern_lab::start_server(&mut self.st, pod, &ternctl(), tcp, udp)
            .unwrap_or_else(|e| panic!("echo server in {pod}: {e}"));
    }

    /// `per_node` pods on each of nodes 1 to `nodes` (`p<node>x<k>`), each with an echo server
    /// on TCP and UDP `port`.
    pub fn add_echo_pods(&mut self, nodes: usize, per_node: usize, port: u16) {
        for n in 1..=nodes {
            for k in 1..=per_node {
                let (node, pod) = (format!("node{n}"), format!("p{n}x{k}"));
                self.add_echo_pod(&node, &pod, Some(port), Some(port));
            }
        }
    }
}

/// Polls `f` every 300 ms until it returns `None` (done); after `secs` seconds panics with
/// `what`, the last reason `f` gave and `context()` (logs, routes).
pub fn wait_until(
    what: &str,
    secs: u64,
    context: impl Fn() -> String,
    mut f: impl FnMut() -> Option<String>,
) {
    let mut why = String::new();
    let done = tern_testkit::wait::poll(
        Duration::from_secs(secs),
        Duration::from_millis(300),
        || match f() {
            None => true,
            Some(w) => {
                why = w;
                false
            }
        },
    );
    if !done {
        panic!("{what}: {why}{}", context());
    }
}

/// BIRD 2 for a lab's BIRD node, or the test fails (tern-testkit).
#[track_caller]
pub fn need_bird() {
    tern_testkit::need(
        "BIRD 2",
        tern_lab::bird::available(),
        tern_testkit::install_hint("bird"),
    )
}

impl Lab {
    /// One round of TCP and UDP probes from every pod to every other pod's echo server on
    /// `port` (1.5 s per probe).
    pub fn probe_mesh(&self, port: u16) -> mesh::MeshReport {
        mesh::check_mesh(
            &self.st,
            port,
            &[tern_lab::traffic::Proto::Tcp, tern_lab::traffic::Proto::Udp],
            Duration::from_millis(1500),
        )
        .unwrap()
    }
}

/// The guard of a lab test that never skips (it FAILS naming what is missing): root, then
/// [`fresh_binaries`]. `who` and `why` go into the message ("lab_kube needs root (...)").
#[track_caller]
pub fn root_and_binaries(who: &str, why: &str) -> &'static Path {
    tern_testkit::need(
        "root",
        tern_testkit::is_root(),
        format!("{who} needs it ({why})"),
    );
    fresh_binaries()
}

/// As [`root_and_binaries`], and the Kubernetes components of `scripts/k8s-components.sh`;
/// returns their directory.
#[track_caller]
pub fn kube_preconditions(who: &str) -> PathBuf {
    root_and_binaries(who, "network namespaces, cgroups, mounts");
    let k8s = tern_lab::kube::KubeOptions::from_env().k8s_bin;
    if let Err(e) = tern_lab::kube::check_binaries(&k8s) {
        panic!("{e}");
    }
    k8s
}
