//! Hostile input on the plugin's path, against a real node (network namespace + ternd): a FIFO,
//! a non-network namespace and the node's own namespace as CNI_NETNS (code 4, never a hang or
//! 101, nothing wired into the node), a network configuration over the stdin limit (code 7
//! naming it), and undecodable prevResults (refused before anything is created: no veth, no
//! address, no endpoint remains).

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `tern` in the node like [`Node::run_plugin`], but kills it after `limit` (a hang is a
/// failure, not a stuck test). Returns the output and how long it took.
fn run_bounded(
    node: &Node,
    env: &[(&str, String)],
    stdin: &[u8],
    limit: Duration,
) -> (Out, Duration) {
    let mut cmd = node.plugin_command(&tern_bin(), env);
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawning the plugin");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // A plugin that stops reading must not block the test: write from a thread.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the plugin did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    let out = child.wait_with_output().unwrap();
    let _ = writer.join();
    (Out::from_output(out), took)
}

fn env_with_netns(node: &Node, cid: &str, netns: &str) -> Vec<(&'static str, String)> {
    node.env("ADD", netns, cid, "eth0", "hostile")
}

#[test]
fn bad_cni_netns_is_code_4_and_never_hangs() {
    tern_testkit::need_root();
    let node = Node::new();
    let conf = node.conf("1.0.0").to_string();
    let fifo = node.dir.path().join("fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let plain = node.dir.path().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let cases = [
        (
            "a FIFO",
            fifo.display().to_string(),
            "not a network namespace",
        ),
        (
            "a regular file",
            plain.display().to_string(),
            "not a network namespace",
        ),
        (
            "a UTS namespace",
            "/proc/self/ns/uts".to_string(),
            "not a network namespace",
        ),
        // The plugin runs in the node's namespace: this is the node itself.
        (
            "the node's own namespace",
            "/proc/self/ns/net".to_string(),
            "node's own",
        ),
    ];
    for (i, (what, path, says)) in cases.iter().enumerate() {
        let cid = format!("hostile-ns-{i}");
        let (out, took) = run_bounded(
            &node,
            &env_with_netns(&node, &cid, path),
            conf.as_bytes(),
            Duration::from_secs(10),
        );
        let msg = out.fails_with(4);
        assert!(
            msg.contains("CNI_NETNS") && msg.contains(says),
            "{what}: {msg}"
        );
        assert!(took < Duration::from_secs(5), "{what} took {took:?}");
        node.assert_nothing_left(&cid);
    }
    assert!(
        !node.has_link("eth0"),
        "eth0 was created in the node: {:?}",
        node.links()
    );
}

#[test]
fn stdin_over_the_limit_is_code_7_naming_it() {
    tern_testkit::need_root();
    let node = Node::new();
    let pod = Pod::new();
    let mut conf = node.conf("1.0.0");
    conf["padding"] = json!("p".repeat(tern_plugin::MAX_STDIN));
    let (out, _) = run_bounded(
        &node,
        &env_with_netns(&node, "hostile-big", &pod.path()),
        conf.to_string().as_bytes(),
        Duration::from_secs(20),
    );
    let msg = out.fails_with(7);
    assert!(msg.contains("1048576 bytes"), "{msg}");
    node.assert_nothing_left("hostile-big");
    // Just under the limit is still read and served.
    let mut conf = node.conf("1.0.0");
    conf["padding"] = json!("p".repeat(tern_plugin::MAX_STDIN - 4096));
    let (out, _) = run_bounded(
        &node,
        &env_with_netns(&node, "hostile-fits", &pod.path()),
        conf.to_string().as_bytes(),
        Duration::from_secs(20),
    );
    out.ok();
}

#[test]
fn undecodable_prev_results_leave_nothing_behind() {
    tern_testkit::need_root();
    let node = Node::new();
    let pod = Pod::new();
    let bad: Vec<Value> = vec![
        json!("not an object"),
        json!(42),
        json!([1, 2]),
        json!({"interfaces": "x"}),
        json!({"interfaces": [{"name": 7}]}),
        json!({"ips": [{"address": "nope"}]}),
        json!({"ips": [{"address": "10.0.0.1/33"}]}),
        json!({"ips": [{"address": "10.0.0.1/24", "interface": -1}]}),
        json!({"ips": [{"address": "10.0.0.1/24", "gateway": "x"}]}),
        json!({"ips": {"address": "10.0.0.1/24"}}),
        json!({"routes": [{"dst": "x"}]}),
        json!({"routes": [{"dst": "0.0.0.0/0", "gw": 5}]}),
        json!({"dns": {"nameservers": "x"}}),
        json!({"ip4": {"ip": "garbage"}}),
    ];
    for (i, prev) in bad.iter().enumerate() {
        let cid = format!("hostile-prev-{i}");
        let mut conf = node.conf("1.0.0");
        conf["prevResult"] = prev.clone();
        let out = node.cni("ADD", &pod, &cid, "eth0", &conf);
        assert_ne!(
            out.status, 0,
            "prevResult {prev} was accepted: {}",
            out.json
        );
        let msg = out.message();
        assert!(msg.contains("prevResult"), "{prev}: {msg}");
        node.assert_nothing_left(&cid);
        assert!(!pod.has_link("eth0"), "{prev}: eth0 left");
    }
    // A valid prevResult is merged: ours come after its interfaces.
    let mut conf = node.conf("1.0.0");
    conf["prevResult"] = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "lo0"}], "ips": []});
    let r = node.add(&pod, "hostile-prev-ok", &conf);
    assert_eq!(r["interfaces"][0]["name"], "lo0", "{r}");
    assert_eq!(r["ips"][0]["interface"], 2, "{r}");
}
