//! The plugin with ternd down and restarted: the release journal, start-up reconciliation,
//! STATUS and GC.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

/// Creates a prefixed veth no endpoint owns on the node, as a crashed ADD would leave one.
fn add_orphan_veth(node: &Node, name: &str, peer: &str) {
    ip(&[
        "-n",
        node.name(),
        "link",
        "add",
        name,
        "type",
        "veth",
        "peer",
        "name",
        peer,
    ]);
}

#[test]
fn add_while_the_agent_is_down_is_code_11_and_says_how_to_start_it() {
    let (mut node, pod) = node_and_pod();
    node.stop();
    let msg = node
        .cni("ADD", &pod, "down1", "eth0", &node.conf("1.0.0"))
        .fails_with(11);
    assert!(msg.contains("ternd"), "{msg}");
    assert!(
        msg.contains("ternd --node-name"),
        "message does not say how to start the agent: {msg}"
    );
    assert!(node.tern_links_settled().is_empty());
    assert!(!pod.has_link("eth0"));
}

#[test]
fn del_while_the_agent_is_down_is_journaled_and_replayed_at_start() {
    let (mut node, pod) = node_and_pod();
    let conf = node.conf("1.0.0");
    let (_, ip, host_if) = node.add_pod(&pod, "journal1", &conf);
    node.stop();

    node.cni("DEL", &pod, "journal1", "eth0", &conf).ok();
    assert!(
        !node.has_link(&host_if),
        "the plugin did not remove {host_if} itself"
    );
    let files = node.journal_files();
    assert_eq!(files.len(), 1, "journal: {files:?}");
    // The store still holds the address and endpoint until ternd replays the journal.
    assert_eq!(node.allocated_to("journal1"), vec![ip]);
    assert_eq!(node.endpoints_of("journal1").len(), 1);
    // A second DEL while down is fine too.
    node.cni("DEL", &pod, "journal1", "eth0", &conf).ok();

    node.start();
    assert!(
        node.journal_files().is_empty(),
        "journal not replayed at start: {:?}",
        node.journal_files()
    );
    node.assert_unclaimed("journal1", "by the replay");
}

#[test]
fn status_is_code_50_when_the_agent_is_down_and_ok_when_up() {
    let (mut node, _) = node_and_pod();
    let conf = node.conf("1.1.0");
    let out = node.cni_global("STATUS", &conf);
    out.ok();
    node.stop();
    let msg = node.cni_global("STATUS", &conf).fails_with(50);
    assert!(msg.contains("ternd"), "{msg}");
    node.start();
    node.cni_global("STATUS", &conf).ok();
}

#[test]
fn start_up_reconciliation_releases_dead_pods_and_orphans() {
    let (mut node, mut a) = node_and_pod();
    let conf = node.conf("1.0.0");
    let b = Pod::new();
    let (_, _, host_a) = node.add_pod(&a, "recona", &conf);
    let (_, ip_b, host_b) = node.add_pod(&b, "reconb", &conf);
    node.stop();

    a.ns.delete();
    // The veth dies with its namespace, asynchronously.
    assert!(
        wait_until(Duration::from_secs(5), || !node.has_link(&host_a)),
        "{host_a} outlived its pod"
    );
    add_orphan_veth(&node, "tern00000000000", "orphpeer0");
    assert_eq!(node.allocated_to("recona").len(), 1);

    node.start();
    // The start-up pass runs before the socket is served, so this holds right away.
    node.assert_unclaimed("recona", "at start-up (pod A)");
    let links = node.links();
    assert!(
        !links.contains(&"tern00000000000".to_string()),
        "orphan veth not removed: {links:?}"
    );
    assert!(
        links.contains(&host_b),
        "pod B's veth was removed: {links:?}"
    );
    assert_eq!(node.allocated_to("reconb"), vec![ip_b]);
    node.cni("CHECK", &b, "reconb", "eth0", &conf).ok();
}

#[test]
fn periodic_reconciliation_removes_an_orphan_while_running() {
    let (node, pod) = node_and_pod();
    let r = node.add(&pod, "periodic", &node.conf("1.0.0"));
    add_orphan_veth(&node, "tern00000000001", "orphpeer1");
    // --resync-seconds 1.
    assert!(
        wait_until(Duration::from_secs(5), || !node.has_link("tern00000000001")),
        "orphan not removed by the periodic pass"
    );
    assert!(node.has_link(&result_host_if(&r)));
    node.cni("CHECK", &pod, "periodic", "eth0", &node.conf("1.0.0"))
        .ok();
}

#[test]
fn gc_releases_attachments_that_are_not_valid() {
    let (node, _) = node_and_pod();
    let conf = node.conf("1.1.0");
    let pods: Vec<Pod> = (0..3).map(|_| Pod::new()).collect();
    let results: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| node.add(p, &format!("gc{i}"), &conf))
        .collect();
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([
        {"containerID": "gc0", "ifname": "eth0"},
        {"containerID": "gc1", "ifname": "eth0"},
    ]);
    node.cni_global("GC", &gc_conf).ok();

    let links = node.links();
    node.assert_released("gc2", &result_host_if(&results[2]));
    for (i, r) in results.iter().enumerate().take(2) {
        let cid = format!("gc{i}");
        assert!(links.contains(&result_host_if(r)));
        assert_eq!(node.allocated_to(&cid), vec![result_ip(r)]);
        node.cni("CHECK", &pods[i], &cid, "eth0", &conf).ok();
    }
}

/// F2: with ternd down, a DEL of an old sandbox of a pod (another container ID, another or
/// no netns) must not delete the veth of the pod's current sandbox, which has the same
/// derived name: the plugin deletes it only when its peer is CNI_IFNAME inside CNI_NETNS.
#[test]
fn del_while_down_deletes_only_its_own_sandboxs_veth() {
    let (mut node, pod) = node_and_pod();
    let old_sandbox = Pod::new();
    let conf = node.conf("1.0.0");
    let (_, _, host_if) = node.add_pod(&pod, "sandbox-b", &conf);
    node.stop();
    let tern = tern_bin();
    let stdin = conf.to_string();
    // The old sandbox A's netns (no eth0 of that veth in it), then an empty CNI_NETNS.
    for netns in [old_sandbox.path(), String::new()] {
        let env = node.env("DEL", &netns, "sandbox-a", "eth0", pod.name());
        let out = node.run_plugin(&tern, &env, stdin.as_bytes());
        assert_eq!(out.status, 0, "{}", out.stderr);
        assert!(
            node.has_link(&host_if),
            "a stale sandbox's DEL (netns {netns:?}) deleted {host_if}"
        );
    }
    // One entry per attachment (the second DEL rewrote it).
    assert_eq!(node.journal_files().len(), 1, "{:?}", node.journal_files());
    // ternd replays A's entry at start (it names the veth): B's endpoint owns it, so it stays.
    node.start();
    assert!(
        wait_until(Duration::from_secs(10), || node.journal_files().is_empty()),
        "journal not replayed: {}",
        node.agent_log()
    );
    assert!(
        node.has_link(&host_if),
        "the replay of the stale DEL deleted {host_if}"
    );
    // B's own DEL (ternd down again; its netns holds the peer) deletes it.
    node.stop();
    node.cni("DEL", &pod, "sandbox-b", "eth0", &conf).ok();
    assert!(
        !node.has_link(&host_if),
        "the plugin did not remove {host_if} for its own sandbox"
    );
}

/// F10: an `interface_prefix` that would cut the name digest short or match other software's
/// devices is refused with code 7 naming the field, before anything is named or deleted.
#[test]
fn a_bad_interface_prefix_is_code_7_naming_the_field() {
    let (node, pod) = node_and_pod();
    for bad in ["veth", "mycluster-pod-", "Tern", ""] {
        let mut conf = node.conf("1.0.0");
        conf["interface_prefix"] = json!(bad);
        for cmd in ["ADD", "DEL"] {
            let msg = node.cni(cmd, &pod, "prefix1", "eth0", &conf).fails_with(7);
            assert!(msg.contains("interface_prefix"), "{bad:?} {cmd}: {msg}");
        }
    }
    assert!(
        node.tern_links().is_empty(),
        "something was created: {:?}",
        node.tern_links()
    );
}
