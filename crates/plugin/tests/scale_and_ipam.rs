//! Parallel ADD/DEL, and IPAM combinations: tern with a delegated host-local, and tern-ipam
//! under the reference ptp plugin.

mod common;

use common::*;
use serde_json::json;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

#[test]
fn thirty_parallel_adds_then_thirty_parallel_dels() {
    tern_testkit::need_root();
    const N: usize = 30;
    let node = Arc::new(Node::new());
    let pods: Vec<Arc<Pod>> = (0..N).map(|_| Arc::new(Pod::new())).collect();
    let conf = node.conf("1.0.0");

    let run_all = |cmd: &'static str| -> Vec<Out> {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (node, pod, conf) = (node.clone(), pod.clone(), conf.clone());
                std::thread::spawn(move || node.cni(cmd, &pod, &format!("par{i}"), "eth0", &conf))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("plugin thread"))
            .collect()
    };

    let adds = run_all("ADD");
    let mut ips = BTreeSet::new();
    for (i, out) in adds.iter().enumerate() {
        assert_eq!(
            out.status,
            0,
            "ADD par{i} failed: {}\n{}",
            out.json,
            node.agent_log()
        );
        let ip = result_ip(&out.json);
        assert!(ips.insert(ip), "address {ip} given twice");
        assert_eq!(pods[i].ipv4("eth0"), vec![format!("{ip}/32")]);
    }
    assert_eq!(node.tern_links().len(), N);
    assert_eq!(node.allocations().len(), N);
    assert_eq!(node.endpoints().len(), N);

    for (i, out) in run_all("DEL").iter().enumerate() {
        assert_eq!(out.status, 0, "DEL par{i} failed: {}", out.json);
    }
    assert!(
        node.tern_links_settled().is_empty(),
        "veths left: {:?}",
        node.tern_links()
    );
    assert!(
        node.allocations().is_empty(),
        "allocations left: {:?}",
        node.allocations()
    );
    assert!(
        node.endpoints().is_empty(),
        "endpoints left: {:?}",
        node.endpoints()
    );
}

#[test]
fn delegated_host_local_ipam() {
    let (node, pod) = node_and_pod();
    let data_dir = node.dir.path().join("host-local");
    let mut conf = node.conf("1.0.0");
    conf["ipam"] = json!({"type": "host-local", "subnet": "10.77.0.0/24", "dataDir": data_dir});

    let r = node.add(&pod, "hl1", &conf);
    let ip = result_ip(&r);
    assert!(ip.to_string().starts_with("10.77.0."), "{r}");
    // tern puts the delegated address on the pod as a /32 (its routing model), whatever
    // prefix host-local returned.
    assert_eq!(r["ips"][0]["address"], format!("{ip}/32"), "{r}");
    assert_eq!(pod.ipv4("eth0"), vec![format!("{ip}/32")]);
    let lease = data_dir.join(NETWORK).join(ip.to_string());
    assert!(
        lease.exists(),
        "host-local has no lease file {}",
        lease.display()
    );
    // tern IPAM is not involved.
    assert!(node.allocations().is_empty(), "{:?}", node.allocations());
    assert_eq!(node.endpoints_of("hl1").len(), 1);
    node.cni("CHECK", &pod, "hl1", "eth0", &conf).ok();
    let node_ip: IpAddr = NODE_IP.parse().unwrap();
    assert_eq!(
        udp_echo(&pod.path(), &node.ns.path(), node_ip).expect("pod -> node"),
        ip
    );

    node.cni("DEL", &pod, "hl1", "eth0", &conf).ok();
    assert!(
        !lease.exists(),
        "host-local lease {} not released",
        lease.display()
    );
    assert!(node.endpoints_of("hl1").is_empty());
    assert!(node.tern_links_settled().is_empty());
    node.cni("DEL", &pod, "hl1", "eth0", &conf).ok();
}

#[test]
fn tern_ipam_under_the_reference_ptp_plugin() {
    let (node, pod) = node_and_pod();
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "ptpnet",
        "type": "ptp",
        "agent_socket": node.socket(),
        "state_dir": node.state_dir(),
        "ipam": {"type": "tern-ipam"},
    });
    let ptp = std::path::Path::new("/usr/lib/cni/ptp");
    let env = |cmd: &str| node.env(cmd, &pod.path(), "ptp1", "eth0", pod.name());

    let out = node.run_plugin(ptp, &env("ADD"), conf.to_string().as_bytes());
    assert_eq!(
        out.status,
        0,
        "ptp ADD failed: {} {}\n{}",
        out.json,
        out.stderr,
        node.agent_log()
    );
    let ip = result_ip(&out.json);
    assert!(
        ip.to_string().starts_with("10.244."),
        "not from the tern pool: {}",
        out.json
    );
    assert_eq!(node.allocated_to("ptp1"), vec![ip]);
    // Standalone tern-ipam answers subnet-style (the block's prefix and an on-link gateway in
    // the block), which is what ptp needs.
    assert_eq!(
        out.json["ips"][0]["address"],
        format!("{ip}/26"),
        "{}",
        out.json
    );
    let gw: IpAddr = out.json["ips"][0]["gateway"]
        .as_str()
        .expect("gateway")
        .parse()
        .unwrap();
    assert_ne!(gw, ip);
    assert_eq!(pod.ipv4("eth0"), vec![format!("{ip}/26")]);
    let node_ip: IpAddr = NODE_IP.parse().unwrap();
    assert_eq!(
        udp_echo(&pod.path(), &node.ns.path(), node_ip).expect("pod -> node"),
        ip
    );
    // The allocation carries the attachment, so a plain IPAM CHECK finds it.
    let check = node.run_plugin(&tern_ipam_bin(), &env("CHECK"), conf.to_string().as_bytes());
    assert_eq!(check.status, 0, "tern-ipam CHECK: {}", check.json);

    let out = node.run_plugin(ptp, &env("DEL"), conf.to_string().as_bytes());
    assert_eq!(out.status, 0, "ptp DEL failed: {} {}", out.json, out.stderr);
    assert!(
        node.allocated_to("ptp1").is_empty(),
        "tern-ipam did not release {ip}"
    );
    assert!(!pod.has_link("eth0"));
}
