//! Stock hosts (issue 10): lab nodes start with the distribution's default
//! `net.ipv4.ip_forward=0`. ternd sets what it needs, so pods on different nodes reach each
//! other; with `--no-set-sysctls` it leaves the host alone and `/readiness` answers 503 naming
//! the sysctl instead of failing silently.
//!
//! Needs root (namespaces); nothing happens in the root network namespace. Every lab has a
//! unique name and is torn down by a guard, also when an assertion fails.

use std::process::Command;
use std::time::{Duration, Instant};

use tern_lab::{Encap, StoreKind};

const PORT: u16 = 7;

mod common;
use common::Lab;

impl Lab {
    fn netns(&self, node: &str) -> String {
        self.st.node(node).unwrap().netns.clone()
    }

    /// A sysctl of the node's namespace; `key` in slash form (interface names have dots).
    fn sysctl(&self, node: &str, key: &str) -> String {
        let path = format!("/proc/sys/{key}");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns(node), "cat", &path])
            .output()
            .unwrap();
        assert!(out.status.success(), "{path}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `/readiness` of the node's ternd (default health address, inside the node namespace).
    fn readiness(&self, node: &str) -> (u16, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns(node)])
            .args(["curl", "-sS", "--max-time", "5", "-w", "\n%{http_code}"])
            .arg("http://127.0.0.1:9099/readiness")
            .output()
            .expect("curl runs (apt install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

/// A 2-node VXLAN lab with one pod (and an echo server) per node; `agent_args` go to ternd.
fn build(tag: &str, agent_args: &[&str]) -> Lab {
    let dir = common::fresh_binaries();
    let name = common::lab_name(tag);
    let mut o = tern_lab::UpOptions::new(&name, dir);
    o.nodes = 2;
    o.encap = Encap::Vxlan;
    o.store = StoreKind::Sqlite;
    o.resync_seconds = Some(2);
    o.agent_timeout = Duration::from_secs(30);
    o.agent_args = agent_args.iter().map(|s| s.to_string()).collect();
    let mut lab = Lab::up(&o);
    for n in 1..=2 {
        lab.add_echo_pod(
            &format!("node{n}"),
            &format!("p{n}"),
            Some(PORT),
            Some(PORT),
        );
    }
    lab
}

fn mesh_failures(lab: &Lab) -> (usize, String) {
    let r = lab.probe_mesh(PORT);
    (r.failures().len(), r.to_string())
}

#[test]
fn stock_hosts_reach_each_other_because_ternd_sets_forwarding() {
    tern_testkit::need_root();
    let lab = build("sh", &[]);
    for node in ["node1", "node2"] {
        assert_eq!(
            lab.sysctl(node, "net/ipv4/ip_forward"),
            "1",
            "{node}: ternd did not set forwarding{}",
            lab.logs(20)
        );
        let log = tern_lab::topology::log_tail(lab.st.node(node).unwrap(), 400);
        assert!(
            log.contains("set net.ipv4.ip_forward = 1 (was 0)"),
            "{node}: the lab node started with forwarding off and ternd says it set it:\n{log}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (failed, report) = mesh_failures(&lab);
        if failed == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cross-node pod traffic fails:\n{report}{}",
            lab.logs(20)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // VXLAN's device gets loose reverse-path filtering whatever conf.all says.
    let rp = lab.sysctl("node1", "net/ipv4/conf/vxlan.tern/rp_filter");
    let all = lab.sysctl("node1", "net/ipv4/conf/all/rp_filter");
    assert!(
        rp == "2" || (all != "1" && rp != "1"),
        "vxlan.tern rp_filter {rp}, all {all}"
    );
    assert_eq!(lab.readiness("node1").0, 200, "{}", lab.logs(20));
}

#[test]
fn no_set_sysctls_leaves_the_host_and_readiness_says_why() {
    tern_testkit::need_root();
    let lab = build("sn", &["--no-set-sysctls"]);
    assert_eq!(lab.sysctl("node1", "net/ipv4/ip_forward"), "0");
    let (code, body) = lab.readiness("node1");
    assert_eq!(code, 503, "{body}{}", lab.logs(20));
    assert!(
        body.contains("net.ipv4.ip_forward") && body.contains("--no-set-sysctls"),
        "readiness names the sysctl and the flag: {body}"
    );
    let log = tern_lab::topology::log_tail(lab.st.node("node1").unwrap(), 400);
    assert!(
        log.contains("node prerequisite not met") && log.contains("net.ipv4.ip_forward"),
        "a warning is logged:\n{log}"
    );
    // And that is indeed why pods on different nodes cannot talk.
    let (failed, report) = mesh_failures(&lab);
    assert!(
        failed > 0,
        "cross-node traffic works without forwarding?\n{report}"
    );
}
