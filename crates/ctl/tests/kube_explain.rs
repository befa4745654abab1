//! `ternctl explain` on the Kubernetes datastore against a real kube-apiserver (tern-testkit's
//! `kube_api`: etcd and kube-apiserver in a test namespace, no kubelet or controllers, so the
//! service accounts are made here too): namespaces, Pods and
//! NetworkPolicies exist only as Kubernetes' own objects (created with kubectl, the Pods'
//! addresses written to their status as a kubelet would), and `ternctl --store
//! kubernetes:///<kubeconfig> explain` must judge with them: a named port, a namespaceSelector
//! on a namespace's label (then the label removed), a default deny naming the policy.
//! Without reading namespaces and NetworkPolicies from the API server, explain would see no
//! policy at all and allow everything.
//!
//! Needs root and the Kubernetes binaries (`scripts/k8s-components.sh`); without them the test
//! FAILS naming what is missing.
//!
//! `cargo test -p tern-ctl --test kube_explain`

use std::process::Command;

use serde_json::Value;
use tern_testkit::kube_api::{KubeNode, need_k8s};

const OBJECTS: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {team: ops}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: default, namespace: other}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  nodeName: n1
  containers: [{name: c, image: none, ports: [{name: http, containerPort: 8080}]}]
---
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: shop, labels: {app: api}}
spec: {nodeName: n1, containers: [{name: c, image: none}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: other, labels: {app: client}}
spec: {nodeName: n1, containers: [{name: c, image: none}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: api}}}]
    ports: [{port: http}]
  - from: [{namespaceSelector: {matchLabels: {team: ops}}}]
    ports: [{port: 9090}]
";

/// `ternctl --store STORE explain --from FROM --to TO --port PORT -o json` in namespace `ns`.
fn explain(ns: &str, store: &str, from: &str, to: &str, port: &str) -> Value {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(env!("CARGO_BIN_EXE_ternctl"))
        .args(["--store", store, "explain", "--from", from, "--to", to])
        .args(["--port", port, "-o", "json"])
        .env_remove("TERN_STORE")
        .output()
        .expect("ternctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "explain {from} -> {to} {port}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `verdict`, the ingress reason and the ingress policies as `namespace/name rule`.
fn summary(v: &Value) -> (String, String, Vec<String>) {
    let policies = v["ingress"]["policies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let rule = p["rule"]
                .as_str()
                .map(|r| format!(" {r}"))
                .unwrap_or_default();
            format!(
                "{} {}/{}{rule}",
                p["kind"].as_str().unwrap_or(""),
                p["namespace"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    let s = |x: &Value| x.as_str().unwrap_or("").to_string();
    (s(&v["verdict"]), s(&v["ingress"]["reason"]), policies)
}

#[test]
fn explain_reads_namespaces_and_network_policies_from_the_api_server() {
    need_k8s();
    let k = KubeNode::start("198.18.0.2");
    let api = &k.api;
    api.install_crds();
    api.apply(OBJECTS);
    for (ns, pod, ip) in [
        ("shop", "web", "10.244.0.2"),
        ("shop", "api", "10.244.0.3"),
        ("other", "client", "10.244.0.4"),
    ] {
        api.must(&[
            "patch",
            "pod",
            pod,
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#
            ),
        ]);
    }
    let admin = api.kubeconfig("explain", "explain", &["system:masters"]);
    let store = format!("kubernetes://{}", admin.display());
    let ns = k.netns.name.clone();
    let web_in = "KubernetesNetworkPolicy shop/web-in";

    // The named port `http` of web is 8080: api is allowed by the first rule.
    let v = explain(&ns, &store, "shop/api", "shop/web", "8080/TCP");
    assert_eq!(
        summary(&v),
        (
            "allowed".into(),
            "rule".into(),
            vec![format!("{web_in} ingress[0]")]
        ),
        "{v}"
    );
    assert_eq!(v["dst"]["ip"], "10.244.0.2", "{v}");
    // client is in a namespace labelled team=ops: allowed on 9090 only.
    let v = explain(&ns, &store, "other/client", "shop/web", "9090/TCP");
    assert_eq!(
        summary(&v),
        (
            "allowed".into(),
            "rule".into(),
            vec![format!("{web_in} ingress[1]")]
        ),
        "{v}"
    );
    let v = explain(&ns, &store, "other/client", "shop/web", "8080/TCP");
    assert_eq!(
        summary(&v),
        (
            "denied".into(),
            "default-deny".into(),
            vec![web_in.to_string()]
        ),
        "{v}"
    );
    // Without the label the namespaceSelector matches nothing (read again from the API
    // server: explain keeps no cache).
    api.must(&["label", "namespace", "other", "team-"]);
    let v = explain(&ns, &store, "other/client", "shop/web", "9090/TCP");
    assert_eq!(
        summary(&v),
        (
            "denied".into(),
            "default-deny".into(),
            vec![web_in.to_string()]
        ),
        "{v}"
    );
    // A pod no policy selects: no policy.
    let v = explain(&ns, &store, "shop/web", "other/client", "80/TCP");
    assert_eq!(
        summary(&v),
        ("allowed".into(), "no-policy".into(), vec![]),
        "{v}"
    );
}
