//! Through the real binaries: attachments whose old dotted names collided get distinct
//! handles and veths (and DEL of one leaves the other), and a DEL while ternd is down, then
//! its journal replay, never delete a device that is not one of tern's pod veths.

mod common;

use common::*;

/// ADD of `ifname` for container `cid` of pod `pod_name` on network `network`.
fn add_as(node: &Node, pod: &Pod, network: &str, cid: &str, ifname: &str, pod_name: &str) -> Out {
    let mut conf = node.conf("1.0.0");
    conf["name"] = network.into();
    let env = node.env("ADD", &pod.path(), cid, ifname, pod_name);
    node.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes())
}

fn del_as(node: &Node, pod: &Pod, network: &str, cid: &str, ifname: &str, pod_name: &str) -> Out {
    let mut conf = node.conf("1.0.0");
    conf["name"] = network.into();
    let env = node.env("DEL", &pod.path(), cid, ifname, pod_name);
    node.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes())
}

#[test]
fn colliding_names_get_distinct_handles_and_veths() {
    tern_testkit::need_root();
    let node = Node::new();
    // (network, containerID, ifname, pod): the first two shared handle `n.x.net1` and veth
    // sha1("default.x.net1"); the last two shared handle `a.b.c`.
    let cases = [
        (NETWORK, "x.net1", "eth0", "x.net1"),
        (NETWORK, "x", "net1", "x"),
        ("a.b", "c", "eth0", "pc"),
        ("a", "b.c", "eth0", "pd"),
    ];
    let pods: Vec<Pod> = cases.iter().map(|_| Pod::new()).collect();
    let mut got = Vec::new();
    for ((net, cid, ifname, name), pod) in cases.iter().zip(&pods) {
        let out = add_as(&node, pod, net, cid, ifname, name);
        assert_eq!(
            out.status,
            0,
            "ADD {cid}/{ifname}: {}\n{}",
            out.json,
            node.agent_log()
        );
        got.push((result_ip(&out.json), result_host_if(&out.json)));
        assert!(pod.has_link(ifname));
    }
    let veths: std::collections::HashSet<&String> = got.iter().map(|g| &g.1).collect();
    assert_eq!(veths.len(), 4, "{got:?}");
    let allocs = node.allocations();
    for (ip, _) in &got {
        assert_eq!(allocs.iter().filter(|a| a.ip == *ip).count(), 1);
    }
    let handles: std::collections::HashSet<_> = got
        .iter()
        .map(|(ip, _)| allocs.iter().find(|a| a.ip == *ip).unwrap().handle.clone())
        .collect();
    assert_eq!(handles.len(), 4, "{handles:?}");
    assert!(
        handles.contains(&Some(format!("{NETWORK}:eth0.x.net1"))),
        "{handles:?}"
    );
    assert!(
        handles.contains(&Some(format!("{NETWORK}:net1.x"))),
        "{handles:?}"
    );
    // ternctl ipam check: no address used twice, nothing unallocated or leaked.
    let out = std::process::Command::new(ternctl_bin())
        .args(["--store", &node.store_url(), "ipam", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("found 0 problems"), "{text}");

    // DEL of the second of each pair leaves the first wired and allocated.
    for i in [1, 3] {
        let (net, cid, ifname, name) = cases[i];
        let out = del_as(&node, &pods[i], net, cid, ifname, name);
        assert_eq!(out.status, 0, "DEL {cid}: {}", out.json);
    }
    for i in [0, 2] {
        let (_, cid, ifname, _) = cases[i];
        assert_eq!(
            node.allocated_to(cid),
            vec![got[i].0],
            "{cid} lost its address"
        );
        assert!(node.has_link(&got[i].1), "{cid} lost its veth");
        assert!(pods[i].has_link(ifname));
    }
    for i in [1, 3] {
        assert!(node.allocated_to(cases[i].1).is_empty());
    }
}

#[test]
fn agent_down_del_and_replay_leave_a_bridge_of_that_name() {
    tern_testkit::need_root();
    let mut node = Node::new();
    let pod = Pod::new();
    // The name the plugin computes for this attachment, taken by a bridge.
    let name =
        tern_linux::attachment_veth_name("tern", Some(("default", pod.name())), "br1", "eth0");
    node.stop();
    ip(&["-n", node.name(), "link", "add", &name, "type", "bridge"]);
    let out = node.cni("DEL", &pod, "br1", "eth0", &node.conf("1.0.0"));
    assert_eq!(out.status, 0, "{}", out.json);
    assert!(
        node.has_link(&name),
        "the agent-down DEL deleted bridge {name}"
    );
    assert_eq!(node.journal_files().len(), 1);
    // ternd replays the entry (naming the bridge) at start: the bridge stays.
    node.start();
    assert!(
        wait_until(std::time::Duration::from_secs(10), || node
            .journal_files()
            .is_empty()),
        "journal not replayed: {}",
        node.agent_log()
    );
    assert!(
        node.has_link(&name),
        "the journal replay deleted bridge {name}"
    );
    assert!(
        node.agent_log().contains("not deleting interface"),
        "{}",
        node.agent_log()
    );
}
