//! Invalid input: each case asserts the CNI error code and that the message names the culprit,
//! and, where the kernel or the store was reached, that nothing half-created remains.

mod common;

use common::*;
use serde_json::json;

/// ADD with the usual environment except `overrides` (an empty value removes the variable).
fn add_with_env(
    node: &Node,
    pod: &Pod,
    cid: &str,
    overrides: &[(&'static str, &str)],
    stdin: &[u8],
) -> Out {
    let env = node.env_with("ADD", pod, cid, overrides);
    node.run_plugin(&tern_bin(), &env, stdin)
}

/// Nothing of `cid` exists: no address, no endpoint, no host veth, no pod interface.
fn assert_nothing_left(node: &Node, pod: &Pod, cid: &str) {
    node.assert_nothing_left(cid);
    assert!(!pod.has_link("eth0"), "eth0 left in the pod");
}

#[test]
fn malformed_json_is_code_6() {
    let (node, pod) = node_and_pod();
    let out = add_with_env(
        &node,
        &pod,
        "bad1",
        &[],
        b"{\"cniVersion\": \"1.0.0\", \"name\": ",
    );
    out.fails_with(6);
    assert_nothing_left(&node, &pod, "bad1");
}

/// ADD of `cid` with `overrides` and the configuration of `version` changed by `edit`: fails
/// with `code`, names `culprit` and leaves nothing behind. Returns the message.
#[track_caller]
fn refused(
    version: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    cid: &str,
    overrides: &[(&'static str, &str)],
    code: u64,
    culprit: &str,
) -> String {
    let (node, pod) = node_and_pod();
    let mut conf = node.conf(version);
    edit(&mut conf);
    let msg =
        add_with_env(&node, &pod, cid, overrides, conf.to_string().as_bytes()).fails_with(code);
    assert!(msg.contains(culprit), "{msg}");
    assert_nothing_left(&node, &pod, cid);
    msg
}

#[test]
fn mtu_of_the_wrong_type_is_code_7_naming_mtu() {
    refused("1.0.0", |c| c["mtu"] = json!("x"), "bad2", &[], 7, "mtu");
}

#[test]
fn assign_ipv4_maybe_is_code_7_naming_the_field() {
    let edit = |c: &mut serde_json::Value| c["ipam"]["assign_ipv4"] = json!("maybe");
    refused("1.0.0", edit, "bad3", &[], 7, "assign_ipv4");
}

#[test]
fn unknown_cni_version_is_code_1() {
    refused("9.9.9", |_| {}, "bad4", &[], 1, "9.9.9");
}

#[test]
fn too_long_ifname_is_code_4_naming_cni_ifname() {
    let env = [("CNI_IFNAME", "eth0123456789abcdef")];
    refused("1.0.0", |_| {}, "bad5", &env, 4, "CNI_IFNAME");
}

#[test]
fn container_id_with_a_slash_is_code_4() {
    let (node, pod) = node_and_pod();
    let conf = node.conf("1.0.0").to_string();
    let msg = add_with_env(
        &node,
        &pod,
        "bad6",
        &[("CNI_CONTAINERID", "bad/6")],
        conf.as_bytes(),
    )
    .fails_with(4);
    assert!(msg.contains("CNI_CONTAINERID"), "{msg}");
    assert!(node.allocations().is_empty());
    assert!(node.tern_links_settled().is_empty());
}

#[test]
fn missing_netns_on_add_is_code_4() {
    refused(
        "1.0.0",
        |_| {},
        "bad7",
        &[("CNI_NETNS", "")],
        4,
        "CNI_NETNS",
    );
}

#[test]
fn netns_that_does_not_exist_is_code_4_naming_cni_netns() {
    let missing = format!("/run/netns/{}-absent", unique_name("x"));
    let env = [("CNI_NETNS", missing.as_str())];
    let msg = refused("1.0.0", |_| {}, "bad8", &env, 4, "CNI_NETNS");
    assert!(msg.contains(&missing), "{msg}");
}

#[test]
fn interface_already_in_the_pod_fails_and_leaves_nothing() {
    let (node, pod) = node_and_pod();
    ip(&[
        "-n",
        pod.name(),
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "x0",
    ]);
    let out = node.cni("ADD", &pod, "dup1", "eth0", &node.conf("1.0.0"));
    let msg = out.fails("ADD over an existing eth0");
    assert!(
        msg.contains("eth0"),
        "message does not name the interface: {msg}"
    );
    assert!(out.code().is_some_and(|c| c != 0), "{}", out.json);
    node.assert_nothing_left("dup1");
    // The pre-existing interface is the pod's and stays.
    assert!(pod.has_link("eth0"));
}

#[test]
fn pool_exhaustion_is_code_100_and_leaves_nothing() {
    tern_testkit::need_root();
    let node = Node::with_pool("10.99.0.0/30");
    let conf = node.conf("1.0.0");
    let pods: Vec<Pod> = (0..5).map(|_| Pod::new()).collect();
    let mut got = Vec::new();
    for (i, pod) in pods.iter().take(4).enumerate() {
        let r = node.add(pod, &format!("full{i}"), &conf);
        got.push(result_ip(&r));
    }
    let pool: std::collections::BTreeSet<String> = got.iter().map(|ip| ip.to_string()).collect();
    let want: std::collections::BTreeSet<String> =
        ["10.99.0.0", "10.99.0.1", "10.99.0.2", "10.99.0.3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(pool, want, "a /30 pool gives its four addresses");

    let out = node.cni("ADD", &pods[4], "full4", "eth0", &conf);
    let msg = out.fails_with(100);
    assert!(
        msg.to_lowercase().contains("exhausted") || msg.to_lowercase().contains("no free"),
        "{msg}"
    );
    assert!(node.allocated_to("full4").is_empty());
    assert!(node.endpoints_of("full4").is_empty());
    assert_eq!(node.tern_links().len(), 4, "{:?}", node.tern_links());
    assert!(!pods[4].has_link("eth0"));
    assert_eq!(node.allocations().len(), 4);

    // Releasing one makes room again.
    node.cni("DEL", &pods[0], "full0", "eth0", &conf).ok();
    let r = node.add(&pods[4], "full4", &conf);
    assert_eq!(result_ip(&r), got[0]);
}
