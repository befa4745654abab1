//! ADD / DEL / CHECK of the `tern` plugin against a real `ternd` in a node namespace.

mod common;

use common::*;
use serde_json::Value;
use std::net::IpAddr;

/// The pod side of an ADD: the /32 on the interface, the link-local gateway route and the
/// default route through it.
fn assert_pod_wired(pod: &Pod, ifname: &str, ip: IpAddr) {
    assert_eq!(
        pod.ipv4(ifname),
        vec![format!("{ip}/32")],
        "addresses of {ifname} in {}",
        pod.name()
    );
    let routes = pod.routes();
    let gw = routes.iter().any(|r| {
        r["dst"] == "169.254.1.1"
            && r["dev"] == ifname
            && r["scope"] == "link"
            && r.get("gateway").is_none()
    });
    assert!(gw, "no `169.254.1.1 dev {ifname} scope link` in {routes:?}");
    let default = routes
        .iter()
        .any(|r| r["dst"] == "default" && r["gateway"] == "169.254.1.1" && r["dev"] == ifname);
    assert!(
        default,
        "no `default via 169.254.1.1 dev {ifname}` in {routes:?}"
    );
}

/// The node side: `<ip> dev <host_if> scope link proto 84`.
fn assert_node_route(node: &Node, ip: IpAddr, host_if: &str) {
    let routes = node.routes();
    let found = routes.iter().any(|r| {
        r["dst"] == ip.to_string()
            && r["dev"] == host_if
            && r["scope"] == "link"
            && (r["protocol"] == "84" || r["protocol"] == 84)
    });
    assert!(
        found,
        "no `{ip} dev {host_if} scope link proto 84` on the node: {routes:?}"
    );
}

#[test]
fn add_result_and_wiring_for_every_version() {
    let (node, _) = node_and_pod();
    for (i, version) in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"].iter().enumerate() {
        let pod = Pod::new();
        let cid = format!("shape{i}");
        let r = node.add(&pod, &cid, &node.conf(version));
        assert_eq!(r["cniVersion"], *version, "{r}");
        let ifs = r["interfaces"]
            .as_array()
            .unwrap_or_else(|| panic!("no interfaces: {r}"));
        assert_eq!(ifs.len(), 2, "{r}");
        let host_if = ifs[0]["name"].as_str().unwrap();
        assert!(host_if.starts_with("tern"), "host veth {host_if:?}");
        assert_eq!(ifs[0]["mac"], HOST_MAC, "{r}");
        assert!(
            ifs[0].get("sandbox").is_none(),
            "host veth has a sandbox: {r}"
        );
        assert_eq!(ifs[1]["name"], "eth0", "{r}");
        assert_eq!(ifs[1]["sandbox"], pod.path(), "{r}");
        let ips = r["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 1, "{r}");
        assert_eq!(ips[0]["interface"], 1, "{r}");
        let has_version = version.starts_with("0.");
        assert_eq!(
            ips[0].get("version").is_some(),
            has_version,
            "ips[].version at {version}: {r}"
        );
        if has_version {
            assert_eq!(ips[0]["version"], "4", "{r}");
        }
        let ip = result_ip(&r);
        assert!(ips[0]["address"].as_str().unwrap().ends_with("/32"), "{r}");

        // The kernel agrees with the result.
        assert_pod_wired(&pod, "eth0", ip);
        assert!(
            node.has_link(host_if),
            "host veth {host_if} missing on the node"
        );
        assert_node_route(&node, ip, host_if);
        let mac = ip_json(node.name(), &["link", "show", "dev", host_if]);
        assert_eq!(mac[0]["address"], HOST_MAC);
        // And the store.
        assert_eq!(node.allocated_to(&cid), vec![ip]);
        assert_eq!(node.endpoints_of(&cid).len(), 1);
        node.cni("DEL", &pod, &cid, "eth0", &node.conf(version))
            .ok();
    }
}

#[test]
fn pods_talk_to_each_other_and_to_the_node() {
    let (node, a) = node_and_pod();
    let b = Pod::new();
    let conf = node.conf("1.0.0");
    let ra = node.add(&a, "traffica", &conf);
    let rb = node.add(&b, "trafficb", &conf);
    let (ipa, ipb) = (result_ip(&ra), result_ip(&rb));
    assert_ne!(ipa, ipb);

    // Pod to pod, both directions; the server sees the pod's own address (no NAT).
    let src = udp_echo(&a.path(), &b.path(), ipb).unwrap_or_else(|e| panic!("A -> B: {e}"));
    assert_eq!(src, ipa);
    let src = udp_echo(&b.path(), &a.path(), ipa).unwrap_or_else(|e| panic!("B -> A: {e}"));
    assert_eq!(src, ipb);
    // Pod to the node's underlay address.
    let node_ip: IpAddr = NODE_IP.parse().unwrap();
    let src =
        udp_echo(&a.path(), &node.ns.path(), node_ip).unwrap_or_else(|e| panic!("A -> node: {e}"));
    assert_eq!(src, ipa);
}

#[test]
fn del_is_idempotent_and_releases_everything() {
    let (node, pod) = node_and_pod();
    let conf = node.conf("1.0.0");
    let (_, _, host_if) = node.add_pod(&pod, "del1", &conf);
    for _ in 0..2 {
        let out = node.cni("DEL", &pod, "del1", "eth0", &conf);
        assert_eq!(out.json, Value::Null, "DEL prints nothing");
        out.ok();
        node.assert_released("del1", &host_if);
        assert!(!pod.has_link("eth0"), "eth0 survived DEL in the pod");
    }
}

#[test]
fn del_with_empty_netns_releases_everything() {
    let (node, pod) = node_and_pod();
    let conf = node.conf("1.0.0");
    let (_, _, host_if) = node.add_pod(&pod, "delnons", &conf);
    // CNI_NETNS present and empty, as a runtime passes it for a sandbox without a netns.
    let env = node.env("DEL", "", "delnons", "eth0", pod.name());
    node.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes())
        .ok();
    node.assert_released("delnons", &host_if);
}

#[test]
fn del_after_the_pod_netns_is_gone() {
    let (node, mut pod) = node_and_pod();
    let conf = node.conf("1.0.0");
    let (_, _, host_if) = node.add_pod(&pod, "delgone", &conf);
    pod.ns.delete();
    node.cni("DEL", &pod, "delgone", "eth0", &conf).ok();
    // The veth may die with the namespace asynchronously; DEL must not leave it either way.
    assert!(
        wait_until(std::time::Duration::from_secs(3), || !node
            .has_link(&host_if)),
        "{host_if} survived"
    );
    node.assert_released("delgone", &host_if);
    node.cni("DEL", &pod, "delgone", "eth0", &conf).ok();
}

#[test]
fn check_passes_after_add_and_fails_when_the_address_is_gone() {
    let (node, pod) = node_and_pod();
    let (r, addr, _) = node.add_pod(&pod, "check1", &node.conf("1.0.0"));
    let mut conf = node.conf("1.0.0");
    conf["prevResult"] = r.clone();
    node.cni("CHECK", &pod, "check1", "eth0", &conf).ok();
    // Without prevResult too.
    node.cni("CHECK", &pod, "check1", "eth0", &node.conf("1.0.0"))
        .ok();

    ip(&[
        "-n",
        pod.name(),
        "addr",
        "del",
        &format!("{addr}/32"),
        "dev",
        "eth0",
    ]);
    let out = node.cni("CHECK", &pod, "check1", "eth0", &conf);
    let msg = out.fails("CHECK without the address");
    assert!(
        msg.contains(&addr.to_string()),
        "CHECK message does not name the missing address {addr}: {msg}"
    );
}

#[test]
fn check_at_0_3_1_is_incompatible() {
    let (node, pod) = node_and_pod();
    node.add(&pod, "check031", &node.conf("0.3.1"));
    let msg = node
        .cni("CHECK", &pod, "check031", "eth0", &node.conf("0.3.1"))
        .fails_with(1);
    assert!(msg.contains("0.3.1"), "{msg}");
}

#[test]
fn two_interfaces_of_one_container() {
    let (node, pod) = node_and_pod();
    let conf = node.conf("1.0.0");
    let r0 = node.cni("ADD", &pod, "multi", "eth0", &conf);
    let r0 = r0.ok().clone();
    let out1 = node.cni("ADD", &pod, "multi", "net1", &conf);
    assert_eq!(
        out1.status,
        0,
        "ADD of net1 failed: {}\n{}",
        out1.json,
        node.agent_log()
    );
    let r1 = out1.json;
    let (ip0, ip1) = (result_ip(&r0), result_ip(&r1));
    assert_ne!(ip0, ip1);
    // The second interface must not disturb the first.
    assert_pod_wired(&pod, "eth0", ip0);
    assert_eq!(pod.ipv4("net1"), vec![format!("{ip1}/32")]);
    let (h0, h1) = (result_host_if(&r0), result_host_if(&r1));
    assert_ne!(h0, h1, "both interfaces got the same host veth");
    assert_eq!(node.endpoints_of("multi").len(), 2);

    node.cni("DEL", &pod, "multi", "net1", &conf).ok();
    assert!(!pod.has_link("net1"));
    assert!(!node.has_link(&h1));
    assert_eq!(
        node.allocated_to("multi"),
        vec![ip0],
        "DEL of net1 must release only net1's address"
    );
    node.cni("CHECK", &pod, "multi", "eth0", &conf).ok();
    assert_pod_wired(&pod, "eth0", ip0);
    let src = udp_echo(&pod.path(), &node.ns.path(), NODE_IP.parse().unwrap())
        .expect("eth0 still carries traffic");
    assert_eq!(src, ip0);
}

/// F15: an ADD whose answer is lost after it was sent (the connection breaks: a timeout, the
/// agent dying mid-request) is undone with a DEL, since the agent may still complete it. A
/// stand-in agent takes the ADD, closes without answering, and records what comes next.
#[test]
fn an_add_whose_answer_is_lost_is_rolled_back_with_a_del() {
    let (node, pod) = node_and_pod();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let mut ops = Vec::new();
        listener.set_nonblocking(true).unwrap();
        for i in 0..2 {
            // Without a rollback no second connection comes: give up after 10 s.
            let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let s = loop {
                match listener.accept() {
                    Ok((s, _)) => break Some(s),
                    Err(_) if std::time::Instant::now() < end => {
                        std::thread::sleep(std::time::Duration::from_millis(20))
                    }
                    Err(_) => break None,
                }
            };
            let Some(s) = s else { break };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let (body, _) = tern_api::read_frame(&s).unwrap();
            let req: Value = serde_json::from_slice(&body).unwrap();
            ops.push(req["op"].as_str().unwrap_or("").to_string());
            if i == 1 {
                let done: tern_api::Response = Ok(tern_api::Reply::Done);
                tern_api::write_frame(&s, &serde_json::to_vec(&done).unwrap(), None).unwrap();
            }
            // i == 0: dropped without an answer.
        }
        ops
    });
    let mut conf = node.conf("1.0.0");
    conf["agent_socket"] = Value::from(sock.to_str().unwrap());
    let out = node.cni("ADD", &pod, "lost1", "eth0", &conf);
    assert_ne!(out.status, 0, "{}", out.json);
    let ops = server.join().unwrap();
    assert_eq!(ops, ["add", "del"], "the lost ADD was not rolled back");
}

/// F15: a delegated IPAM plugin that exits 0 with no output may still have allocated: its DEL
/// runs before the ADD fails.
#[test]
fn a_delegated_ipam_add_without_output_is_undone() {
    let (node, pod) = node_and_pod();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ipam-del-ran");
    let script = dir.path().join("silent-ipam");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\nif [ \"$CNI_COMMAND\" = DEL ]; then touch {}; fi\nexit 0\n",
            marker.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut conf = node.conf("1.0.0");
    conf["ipam"] = serde_json::json!({"type": "silent-ipam"});
    let mut env = node.env("ADD", &pod.path(), "silent1", "eth0", pod.name());
    for (k, v) in env.iter_mut() {
        if *k == "CNI_PATH" {
            *v = format!("{}:{v}", dir.path().display());
        }
    }
    let out = node.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes());
    assert_ne!(out.status, 0, "{}", out.json);
    assert!(
        out.json.to_string().contains("returned no result"),
        "{}",
        out.json
    );
    assert!(marker.exists(), "the delegated IPAM DEL did not run");
}
