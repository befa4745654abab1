//! Dual-stack and IPv6-only Kubernetes clusters networked by tern (issue 22): `ternctl lab up
//! --kubernetes --ip-family dual` (IPv4 and IPv6 underlay, kube-apiserver and
//! kube-controller-manager with a Service and a cluster CIDR of each family, kubelets with
//! both node addresses, kube-proxy with both proxiers, tern's DaemonSet with an IPv4 and a
//! /122-block IPv6 pool and a conflist asking for both), and `--ip-family ipv6` (all of it in
//! IPv6 only). One cluster per test (they run one at a time):
//! - every Node has an InternalIP of each family of the lab (its lab addresses);
//! - a Deployment spread over the nodes, every pod with an address of each family in
//!   `status.podIPs` (the CNI result's addresses, as the kubelet reports them), each in tern's
//!   pool of its family and on tern's workload endpoint;
//! - every pod reaches every pod on another node over TCP at each of its addresses;
//! - a Service (`RequireDualStack` in the dual-stack cluster) with its only backend on one node
//!   gets a ClusterIP of each family, and every pod on another node reaches the backend
//!   through each;
//! - `lab down` leaves nothing behind.
//!
//! Needs root and the components; without them the test FAILS with what is missing (it never
//! passes by skipping). The lab has a unique name and is removed by a guard.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use tern_lab::kube;

mod common;
use common::kube_lab::{KubeLab as Lab, ternctl_store};

/// A pod of the Deployment with its addresses (`status.podIPs`, in order).
#[derive(Debug, Clone)]
struct FamilyPod {
    name: String,
    node: String,
    ips: Vec<IpAddr>,
}

/// name, node and `status.podIPs` of every pod labelled app=web.
const PODS_JSONPATH: &str = r#"jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIPs[*].ip}{"\n"}{end}"#;

/// The Service: its only backend is the pod labelled solo=yes; `policy` its ipFamilyPolicy.
fn solo_service(policy: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: solo}}
spec:
  ipFamilyPolicy: {policy}
  selector: {{solo: "yes"}}
  ports: [{{port: 80, targetPort: 8080}}]
"#
    )
}

/// One cluster at a time: they share the machine's two cores and the kernel-wide sysctls
/// whose restoration each test checks.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn kubernetes_dual_stack_over_tern() {
    cluster_test("dual", 3, 6);
}

#[test]
fn kubernetes_ipv6_only_over_tern() {
    cluster_test("ipv6", 2, 4);
}

fn cluster_test(family: &str, nodes: usize, replicas: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let k8s = common::kube_preconditions("lab_kube_dual");
    let lab = Lab::up(
        "kd",
        &k8s,
        &[
            "--nodes",
            &nodes.to_string(),
            "--encap",
            "none",
            "--ip-family",
            family,
        ],
    );
    let (ready, node_list) = lab.ready_nodes();
    assert_eq!(ready, nodes, "nodes: {node_list}");
    let st = lab.state();
    let k = st.kube.as_ref().expect("cluster state");
    // The pools, IPv4 first: what each pod must have an address of, in this order.
    let pools: Vec<ipnet::IpNet> = k
        .cluster_cidrs()
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    let want_v6: Vec<bool> = match family {
        "dual" => vec![false, true],
        _ => vec![true],
    };
    assert_eq!(
        pools.iter().map(|p| p.addr().is_ipv6()).collect::<Vec<_>>(),
        want_v6,
        "pools {pools:?}"
    );

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
        assert_eq!(got.len(), pools.len(), "{line}");
    }

    lab.apply("web", &kube::pods::echo_deployment("web", replicas, true));
    let t = Instant::now();
    lab.wait_pods("app=web", replicas);
    let pods = family_pods(&lab);
    eprintln!("{replicas} pods Running after {:?}: {pods:?}", t.elapsed());
    let spread: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(spread.len(), nodes, "pods spread over all nodes: {pods:?}");
    let (_, weps) = ternctl_store(&st, &["get", "wep", "-o", "wide"]);
    for p in &pods {
        assert_eq!(p.ips.len(), pools.len(), "an address per family: {p:?}");
        for (ip, pool) in p.ips.iter().zip(&pools) {
            assert!(pool.contains(ip), "{p:?}: {ip} not in {pool}");
        }
        let line = weps
            .lines()
            .find(|l| l.split_whitespace().any(|f| f == p.name))
            .unwrap_or_else(|| panic!("pod {p:?} not among tern's workload endpoints:\n{weps}"));
        for ip in &p.ips {
            assert!(
                line.split([' ', ','])
                    .any(|f| f.split('/').next() == Some(ip.to_string().as_str())),
                "{ip} of {p:?} not on its workload endpoint: {line}"
            );
        }
    }

    // Pod to pod across nodes, at every address: one exec per pod runs its probes.
    let mut failures = Vec::new();
    let mut probes = 0;
    for a in &pods {
        let peers: Vec<&FamilyPod> = pods.iter().filter(|b| b.node != a.node).collect();
        let script = peers
            .iter()
            .flat_map(|b| b.ips.iter())
            .map(|ip| format!("echo \"{ip} $(nc -w 3 {ip} 8080)\""))
            .collect::<Vec<_>>()
            .join("; ");
        let out = lab
            .exec(&[&a.name, "--", "sh", "-c", &script])
            .unwrap_or_else(|e| format!("exec failed: {e}"));
        for b in &peers {
            for ip in &b.ips {
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
    eprintln!("{probes} pod-to-pod TCP probes across nodes ({family}) answered");

    // The Service, its backend on one node, asked from the other nodes' pods.
    let backend = &pods[0];
    lab.must(&["label", "pod", &backend.name, "solo=yes"]);
    let policy = if family == "dual" {
        "RequireDualStack"
    } else {
        "SingleStack"
    };
    lab.apply("solo", &solo_service(policy));
    let ips = lab.must(&[
        "get",
        "svc",
        "solo",
        "-o",
        "jsonpath={.spec.ipFamilies[*]}|{.spec.clusterIPs[*]}",
    ]);
    let (families, cluster_ips) = ips.split_once('|').unwrap();
    let want_families = if family == "dual" {
        "IPv4 IPv6"
    } else {
        "IPv6"
    };
    assert_eq!(families, want_families, "{ips}");
    let cluster_ips: Vec<IpAddr> = cluster_ips
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    let services: Vec<ipnet::IpNet> = kube::service_cidrs(k.families())
        .iter()
        .map(|c| c.parse().unwrap())
        .collect();
    assert_eq!(cluster_ips.len(), services.len(), "{ips}");
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
        "{policy} Service {cluster_ips:?} reached through each ClusterIP from the other nodes"
    );

    let done = lab.down_clean();
    assert!(
        done.iter().any(|d| d.contains("cgroup")),
        "down removed cgroups: {done:?}"
    );
}

/// The Deployment's pods with their node and addresses.
fn family_pods(lab: &Lab) -> Vec<FamilyPod> {
    let out = lab.must(&["get", "pods", "-l", "app=web", "-o", PODS_JSONPATH]);
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            FamilyPod {
                name: f[0].to_string(),
                node: f[1].to_string(),
                ips: f[2..]
                    .iter()
                    .map(|s| s.parse().unwrap_or_else(|e| panic!("{l}: {e}")))
                    .collect(),
            }
        })
        .collect()
}
