//! tern's DaemonSet on an etcd store over TLS with client certificates (issue 13): `ternctl
//! lab up --nodes 2 --kubernetes --store etcd --etcd-tls` serves the lab's etcd over HTTPS
//! with `--client-cert-auth` (CA, server and client certificates under the lab's directory)
//! and installs tern with `ternctl install manifest --store etcd://… --etcd-ca/--etcd-cert/
//! --etcd-key`. On the real cluster:
//! - the manifest's Secret `tern-etcd-certs` holds exactly the lab's client files and
//!   `tern-config` names them as mounted in the pods;
//! - the tern-node pods are Running and ready on both nodes, both Nodes Ready;
//! - a pod on each node gets an address from tern's pool, recorded in the store (read over
//!   TLS), and the two reach each other over TCP;
//! - the etcd refuses a client with the CA but no certificate, and plain http, while the same
//!   request with the client certificate succeeds: TLS and client-certificate auth are on;
//! - `lab down` leaves no namespace, cgroup or sysctl behind.
//!
//! Needs root and the components of `scripts/k8s-components.sh`; without them the test FAILS
//! naming what is missing. The lab has a unique name and is removed by a guard.

use std::time::Instant;

use base64::Engine as _;
use serde_json::Value;
use tern_lab::LabState;

mod common;
use common::kube_lab::{
    KubeLab as Lab, NAME_SERVER, assert_tern_addresses, busybox_pod, ternctl_in, ternctl_output,
};

/// `ternctl --store <lab store> EXTRA ARGS` in node1's namespace (the etcd is reachable only
/// from the lab's namespaces): (success, stdout + stderr).
fn ternctl_in_node(
    st: &LabState,
    store: &str,
    extra: &[std::ffi::OsString],
    args: &[&str],
) -> (bool, String) {
    ternctl_output(
        ternctl_in(&st.nodes[0].netns)
            .env_remove("TERN_STORE")
            .env_remove("TERN_ETCD_CA")
            .env_remove("TERN_ETCD_CERT")
            .env_remove("TERN_ETCD_KEY")
            // One attempt: a refusal is not retried for seconds.
            .env("TERN_ETCD_RETRY_BUDGET_MS", "1")
            .args(["--store", store])
            .args(extra)
            .args(args),
    )
}

/// A busybox pod on `node` answering TCP :8080 with its name.
fn server(name: &str, node: &str) -> String {
    busybox_pod(name, node, "  labels: {app: tls}\n", "", NAME_SERVER)
}

#[test]
fn tern_daemonset_on_etcd_over_tls() {
    let k8s = common::kube_preconditions("lab_kube_etcd_tls");
    let t0 = Instant::now();
    let lab = Lab::up(
        "tls",
        &k8s,
        &["--nodes", "2", "--store", "etcd", "--etcd-tls"],
    );
    let st = lab.state();
    let url = st.store_url();
    let tls = st
        .store_tls()
        .cloned()
        .expect("the lab records its etcd's TLS files");
    assert!(url.starts_with("etcd://"), "{url}");
    for n in &st.nodes {
        assert_eq!(n.ternd_pid, None, "{}: a host ternd runs", n.name);
    }

    // The Secret holds the lab's client files; the ConfigMap names them as mounted.
    let secret: Value = serde_json::from_str(&lab.must(&[
        "-n",
        "kube-system",
        "get",
        "secret",
        "tern-etcd-certs",
        "-o",
        "json",
    ]))
    .unwrap();
    for (key, file) in [
        ("etcd-ca", &tls.ca),
        ("etcd-cert", &tls.cert),
        ("etcd-key", &tls.key),
    ] {
        let got = base64::engine::general_purpose::STANDARD
            .decode(secret["data"][key].as_str().unwrap_or_default())
            .unwrap();
        assert_eq!(got, std::fs::read(file).unwrap(), "Secret key {key}");
    }
    let cm: Value = serde_json::from_str(&lab.must(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "tern-config",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(cm["data"]["store"], url.as_str());
    for (k, f) in [
        ("etcd_ca", "etcd-ca"),
        ("etcd_cert", "etcd-cert"),
        ("etcd_key", "etcd-key"),
    ] {
        assert_eq!(cm["data"][k], format!("/etc/tern-etcd-certs/{f}"), "{k}");
    }

    // tern-node Running and ready on both nodes: ternd opened the store over TLS.
    let (on, ds) = lab.tern_node_pods_ready();
    assert_eq!(
        on,
        ["node1", "node2"],
        "tern-node pods:\n{ds}{}",
        lab.diagnostics()
    );
    let (ready, nodes) = lab.ready_nodes();
    assert_eq!(ready, 2, "nodes: {nodes}");

    // A pod on each node: tern addresses, recorded in the store, reachable both ways.
    lab.apply("a", &server("a", "node1"));
    lab.apply("b", &server("b", "node2"));
    let pods = lab.wait_pods("app=tls", 2);
    let ip = |name: &str| -> String {
        pods.iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("pod {name} in {pods:?}"))
            .ip
            .clone()
    };
    let (a, b) = (ip("a"), ip("b"));
    let pool: ipnet::Ipv4Net = st.kube.as_ref().unwrap().cluster_cidr.parse().unwrap();
    let with_cert = st.store_tls_args();
    let (ok, weps) = ternctl_in_node(&st, &url, &with_cert, &["get", "wep", "-o", "wide"]);
    assert!(ok, "ternctl with the client certificate: {weps}");
    assert_tern_addresses(&pool, &weps, &[("a", &a), ("b", &b)]);
    let ask = |from: &str, to: &str| -> String {
        // The first connection may race the route's installation: a few tries.
        let mut last = String::new();
        for _ in 0..10 {
            match lab.kubectl(&["exec", from, "--", "nc", "-w", "2", to, "8080"]) {
                Ok(s) if !s.trim().is_empty() => return s.trim().to_string(),
                Ok(s) => last = s,
                Err(e) => last = e,
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        panic!("{from} -> {to}: no answer ({last}){}", lab.diagnostics());
    };
    assert_eq!(ask("a", &b), "b", "node1 -> node2");
    assert_eq!(ask("b", &a), "a", "node2 -> node1");
    eprintln!("pods a {a} (node1), b {b} (node2): reachable");

    // TLS and client-certificate auth are really on: the CA alone, or plain http, is refused;
    // the same request with the client certificate (above, and again now) is answered.
    let ca_only = vec!["--etcd-ca".into(), tls.ca.clone().into_os_string()];
    let (ok, out) = ternctl_in_node(&st, &url, &ca_only, &["get", "ippool"]);
    assert!(!ok, "a client without a certificate was answered: {out}");
    // Refused for its missing certificate (rustls reports etcd's alert), not for anything else.
    assert!(
        out.to_lowercase().contains("certificate"),
        "refused, but not for the certificate: {out}"
    );
    eprintln!("without a client certificate: {}", out.trim());
    let (ok, out) = ternctl_in_node(&st, &url, &[], &["get", "ippool"]);
    assert!(!ok, "a plain-http client was answered: {out}");
    eprintln!("plain http: {}", out.trim());
    let (ok, out) = ternctl_in_node(&st, &url, &with_cert, &["get", "ippool"]);
    assert!(
        ok && out.contains("default-ipv4-ippool"),
        "with the client certificate: {out}"
    );

    let done = lab.down_clean();
    assert!(
        !tern_lab::state::lab_dir(&lab.name).exists(),
        "the lab's directory (and its PKI) is removed: {done:?}"
    );
    eprintln!("lab_kube_etcd_tls: {:?}", t0.elapsed());
}
