//! A dual-stack Kubernetes cluster networked by tern (issue 22): `ternctl lab up --nodes 3
//! --kubernetes --ip-family dual` (IPv4 and IPv6 underlay, kube-apiserver and
//! kube-controller-manager with a Service and a cluster CIDR of each family, kubelets with
//! both node addresses, kube-proxy with both proxiers, tern's DaemonSet with an IPv4 and a
//! /122-block IPv6 pool and a conflist asking for both). One cluster for the whole test:
//! - every Node has an InternalIP of each family;
//! - a Deployment of 6 pods spread over the 3 nodes, every pod with an IPv4 address in tern's
//!   IPv4 pool and an IPv6 one in its IPv6 pool in `status.podIPs` (the CNI result's two
//!   addresses, as the kubelet reports them), both on tern's workload endpoint;
//! - every pod reaches every pod on another node over TCP in each family;
//! - a `RequireDualStack` Service with its only backend on one node gets a ClusterIP of each
//!   family, and every pod on another node reaches the backend through both;
//! - `lab down` leaves nothing behind.
//!
//! Needs root and the components; without them the test FAILS with what is missing (it never
//! passes by skipping). The lab has a unique name and is removed by a guard.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use tern_lab::kube;

mod common;
use common::kube_lab::{KubeLab as Lab, ternctl_store};

/// A pod of the Deployment with both its addresses.
#[derive(Debug, Clone)]
struct DualPod {
    name: String,
    node: String,
    v4: IpAddr,
    v6: IpAddr,
}

/// name, node and `status.podIPs` of every pod labelled app=web.
const PODS_JSONPATH: &str = r#"jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIPs[*].ip}{"\n"}{end}"#;

/// The Service: its only backend is the pod labelled solo=yes; an address of each family.
const SOLO: &str = r#"apiVersion: v1
kind: Service
metadata: {name: solo}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {solo: "yes"}
  ports: [{port: 80, targetPort: 8080}]
"#;

#[test]
fn kubernetes_dual_stack_over_tern() {
    let k8s = common::kube_preconditions("lab_kube_dual");
    let lab = Lab::up(
        "kd",
        &k8s,
        &["--nodes", "3", "--encap", "none", "--ip-family", "dual"],
    );
    let (ready, nodes) = lab.ready_nodes();
    assert_eq!(ready, 3, "nodes: {nodes}");
    let st = lab.state();
    let k = st.kube.as_ref().expect("cluster state");
    let pool4: ipnet::IpNet = k.cluster_cidr.parse().unwrap();
    let pool6: ipnet::IpNet = k
        .cluster_cidr6
        .as_deref()
        .expect("a dual-stack cluster has an IPv6 pool")
        .parse()
        .unwrap();
    assert!(matches!(pool4, ipnet::IpNet::V4(_)) && matches!(pool6, ipnet::IpNet::V6(_)));

    // Every Node: an InternalIP of each family, the lab's addresses of the node.
    let internal = lab.must(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}"#,
    ]);
    for n in &st.nodes {
        let line = internal
            .lines()
            .find(|l| l.split_whitespace().next() == Some(n.name.as_str()))
            .unwrap_or_else(|| panic!("no Node {}: {internal}", n.name));
        let got: Vec<&str> = line.split_whitespace().skip(1).collect();
        assert_eq!(got, n.addresses(), "InternalIPs of {}", n.name);
    }

    lab.apply("web", &kube::pods::echo_deployment("web", 6, true));
    let t = Instant::now();
    lab.wait_pods("app=web", 6);
    let pods = dual_pods(&lab);
    eprintln!("6 pods Running after {:?}: {pods:?}", t.elapsed());
    let spread: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(spread.len(), 3, "pods spread over all nodes: {pods:?}");
    let (_, weps) = ternctl_store(&st, &["get", "wep", "-o", "wide"]);
    for p in &pods {
        assert!(pool4.contains(&p.v4), "{p:?}: IPv4 not in {pool4}");
        assert!(pool6.contains(&p.v6), "{p:?}: IPv6 not in {pool6}");
        let line = weps
            .lines()
            .find(|l| l.split_whitespace().any(|f| f == p.name))
            .unwrap_or_else(|| panic!("pod {p:?} not among tern's workload endpoints:\n{weps}"));
        for ip in [p.v4, p.v6] {
            assert!(
                line.split([' ', ','])
                    .any(|f| f.split('/').next() == Some(ip.to_string().as_str())),
                "{ip} of {p:?} not on its workload endpoint: {line}"
            );
        }
    }

    // Pod to pod across nodes, each family: one exec per pod runs its probes.
    let mut failures = Vec::new();
    let mut probes = 0;
    for a in &pods {
        let peers: Vec<&DualPod> = pods.iter().filter(|b| b.node != a.node).collect();
        let script = peers
            .iter()
            .flat_map(|b| [b.v4, b.v6])
            .map(|ip| format!("echo \"{ip} $(nc -w 3 {ip} 8080)\""))
            .collect::<Vec<_>>()
            .join("; ");
        let out = lab
            .exec(&[&a.name, "--", "sh", "-c", &script])
            .unwrap_or_else(|e| format!("exec failed: {e}"));
        for b in &peers {
            for ip in [b.v4, b.v6] {
                probes += 1;
                let answer = out
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{ip} ")))
                    .map(str::trim);
                if answer != Some(b.name.as_str()) {
                    failures.push(format!(
                        "{} ({}) -> {} {ip}:8080 ({}): {answer:?}",
                        a.name, a.node, b.name, b.node
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "pod-to-pod probes failed ({} of {probes}):\n{}{}",
        failures.len(),
        failures.join("\n"),
        lab.diagnostics()
    );
    eprintln!("{probes} pod-to-pod TCP probes across nodes (IPv4 and IPv6) answered");

    // The dual-stack Service, its backend on one node, asked from the other nodes' pods.
    let backend = &pods[0];
    lab.must(&["label", "pod", &backend.name, "solo=yes"]);
    lab.apply("solo", SOLO);
    let ips = lab.must(&[
        "get",
        "svc",
        "solo",
        "-o",
        "jsonpath={.spec.ipFamilies[*]}|{.spec.clusterIPs[*]}",
    ]);
    let (families, cluster_ips) = ips.split_once('|').unwrap();
    assert_eq!(families, "IPv4 IPv6", "{ips}");
    let cluster_ips: Vec<IpAddr> = cluster_ips
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    assert!(
        cluster_ips.len() == 2 && cluster_ips[0].is_ipv4() && cluster_ips[1].is_ipv6(),
        "{ips}"
    );
    let services: Vec<ipnet::IpNet> = kube::service_cidrs((true, true))
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    for (ip, net) in cluster_ips.iter().zip(&services) {
        assert!(net.contains(ip), "ClusterIP {ip} not in {net}");
    }
    let mut failures = Vec::new();
    for p in pods.iter().filter(|p| p.node != backend.node) {
        for ip in &cluster_ips {
            // kube-proxy programs a new Service within a second or two.
            let t = Instant::now();
            let got = loop {
                let got = lab
                    .exec(&[&p.name, "--", "nc", "-w", "3", &ip.to_string(), "80"])
                    .map(|s| s.trim().to_string());
                if got.as_deref() == Ok(backend.name.as_str())
                    || t.elapsed() > Duration::from_secs(20)
                {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(500));
            };
            if got.as_deref() != Ok(backend.name.as_str()) {
                failures.push(format!("{} ({}) -> solo {ip}:80: {got:?}", p.name, p.node));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "Service probes failed:\n{}{}",
        failures.join("\n"),
        lab.diagnostics()
    );
    eprintln!(
        "RequireDualStack Service {cluster_ips:?} reached through both ClusterIPs from the other nodes"
    );

    let done = lab.down_clean();
    assert!(
        done.iter().any(|d| d.contains("cgroup")),
        "down removed cgroups: {done:?}"
    );
}

/// The Deployment's pods with their node and both addresses (panics when a pod has not one
/// of each family).
fn dual_pods(lab: &Lab) -> Vec<DualPod> {
    let out = lab.must(&["get", "pods", "-l", "app=web", "-o", PODS_JSONPATH]);
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ips: Vec<IpAddr> = f[2..].iter().filter_map(|s| s.parse().ok()).collect();
            let (v4, v6) = match ips[..] {
                [a, b] if a.is_ipv4() && b.is_ipv6() => (a, b),
                _ => panic!(
                    "pod {} has not an IPv4 and an IPv6 address in status.podIPs: {l}",
                    f[0]
                ),
            };
            DualPod {
                name: f[0].to_string(),
                node: f[1].to_string(),
                v4,
                v6,
            }
        })
        .collect()
}
