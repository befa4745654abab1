//! Staged policies on the Kubernetes datastore, against a real kube-apiserver: a
//! StagedKubernetesNetworkPolicy applied with `kubectl apply` (tern's CRDs) is seen by
//! `ternctl get`; `ternctl policy promote` turns it into the cluster's own `networking.k8s.io`
//! NetworkPolicy through the API server and deletes the staged one; a staged Delete promoted
//! deletes that NetworkPolicy. ternd's policy engine reads the staged policy from the API
//! server as a staged one.

use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use tern_testkit::kube_api::KubeNode;

const NODE_IP: &str = "198.18.0.14";

/// `ternctl --store kubernetes://KUBECONFIG ARGS` inside the API server's namespace: exit
/// code, stdout, stderr.
fn ternctl(k: &KubeNode, kubeconfig: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", &k.netns.name])
        .arg(env!("CARGO_BIN_EXE_ternctl"))
        .arg("--store")
        .arg(format!("kubernetes://{kubeconfig}"))
        .args(args)
        .output()
        .expect("running ternctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(k: &KubeNode, kubeconfig: &str, args: &[&str]) -> String {
    let (code, out, err) = ternctl(k, kubeconfig, args);
    assert_eq!(code, 0, "ternctl {args:?}: {err}");
    out
}

#[test]
fn kubectl_applied_staged_policy_promotes_to_a_kubernetes_network_policy() {
    tern_testkit::kube_api::need_k8s();
    let k = KubeNode::start(NODE_IP);
    k.api.install_crds();
    let admin = k.api.kubeconfig("admin", "admin", &["system:masters"]);
    let admin = admin.to_str().unwrap();
    k.api
        .apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n");
    // kubectl takes ternctl's YAML.
    k.api.apply(
        "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: default-deny, namespace: shop, labels: {owner: sec}}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n",
    );
    let out = ok(&k, admin, &["get", "sknp", "-n", "shop"]);
    assert!(out.contains("default-deny") && out.contains("Set"), "{out}");
    // ternd's policy engine reads it from the datastore into its policy set, not its table.
    let cfg = tern_store::kube::KubeConfig::from_kubeconfig(std::path::Path::new(admin)).unwrap();
    let (staged, active) = tern_testkit::netns::in_netns(&k.netns.path(), move || {
        let store: Arc<dyn tern_store::Store> =
            Arc::new(tern_store::kube::KubeStore::connect(cfg).unwrap());
        let engine = tern_agent::policy::PolicyEngine::load(store, "n1").unwrap();
        (
            engine.with_policy_set(|s| s.staged().map(|(k, _)| k.to_string()).collect::<Vec<_>>()),
            engine.with_policy_set(|s| s.policies().count()),
        )
    });
    assert_eq!(staged, ["StagedKubernetesNetworkPolicy/shop/default-deny"]);
    assert_eq!(active, 0, "a staged policy is not an enforced one");

    let out = ok(
        &k,
        admin,
        &["policy", "promote", "default-deny", "-n", "shop"],
    );
    assert!(out.contains("promoted"), "{out}");
    let np: Value = serde_json::from_str(&k.api.must(&[
        "get",
        "networkpolicies.networking.k8s.io",
        "default-deny",
        "-n",
        "shop",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(np["metadata"]["labels"]["owner"], "sec");
    assert_eq!(np["spec"]["podSelector"], serde_json::json!({}));
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Ingress"]));
    let left = k.api.must(&[
        "get",
        "stagedkubernetesnetworkpolicies.tern.dev",
        "-n",
        "shop",
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "the staged policy is left: {left}");

    // A staged Delete of it, promoted, deletes the cluster's NetworkPolicy.
    k.api.apply(
        "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: default-deny, namespace: shop}\nspec: {stagedAction: Delete}\n",
    );
    let out = ok(
        &k,
        admin,
        &[
            "policy",
            "promote",
            "default-deny",
            "-n",
            "shop",
            "--kind",
            "StagedKubernetesNetworkPolicy",
        ],
    );
    assert!(out.contains("deleted"), "{out}");
    let gone = k.api.must(&[
        "get",
        "networkpolicies.networking.k8s.io",
        "-n",
        "shop",
        "-o",
        "name",
    ]);
    assert!(gone.trim().is_empty(), "the NetworkPolicy is left: {gone}");
}
