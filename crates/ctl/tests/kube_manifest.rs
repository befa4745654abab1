//! The Kubernetes manifest (`ternctl install manifest`, `manifests/tern.yaml`) against a real
//! kube-apiserver (issue 13, "Installed the Kubernetes way"): the harness of the agent's API
//! server tests, `tern_testkit::kube_api` (etcd + kube-apiserver with RBAC, in a network
//! namespace of the test's own).
//!
//! Shown: every object passes server-side dry-run and a real apply with no warning; the stored
//! DaemonSet has the fields the design needs (hostNetwork, privileged, system-node-critical,
//! every taint tolerated, RollingUpdate maxUnavailable 1, the node name from the downward API,
//! probes on 127.0.0.1:9099, the conflist written by the container beside ternd); a Pod made
//! from its template is admitted (service account, priority class, privileged); impersonating
//! the ServiceAccount, the ClusterRole grants exactly ternd's verbs over a matrix of resources
//! and verbs (and nothing on secrets, configmaps, deletes). The ConfigMap's IPPool applies to a
//! store as the init container applies it, and re-applying it with VXLAN switches the pool.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. The namespace and every process are removed by drop guards.

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tern_testkit::kube_api::{KubeApi, KubeNode};

const NODE_IP: &str = "198.18.0.10";
const SA: &str = "system:serviceaccount:kube-system:tern-node";

/// `ternctl ARGS` (the binary under test); stdout, panicking on failure.
fn ternctl(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
        .args(args)
        .env_remove("TERN_STORE")
        .output()
        .expect("running ternctl");
    assert!(
        out.status.success(),
        "ternctl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Applies `yaml` (server dry-run or for real); asserts success, no warning, and that every
/// object of the manifest is named in the output.
fn apply(api: &KubeApi, yaml: &str, dry_run: bool) -> String {
    let mut args = vec!["apply", "-f", "-"];
    if dry_run {
        args.push("--dry-run=server");
    }
    let o = api.kubectl_out(&args, Some(yaml));
    assert!(o.ok, "kubectl {} failed: {}", args.join(" "), o.stderr);
    assert!(
        !o.stderr.to_lowercase().contains("warning"),
        "kubectl {} warned: {}",
        args.join(" "),
        o.stderr
    );
    for obj in [
        "serviceaccount/tern-node",
        "clusterrole.rbac.authorization.k8s.io/tern-node",
        "clusterrolebinding.rbac.authorization.k8s.io/tern-node",
        "configmap/tern-config",
        "daemonset.apps/tern-node",
    ] {
        assert!(o.stdout.contains(obj), "{obj} missing in: {}", o.stdout);
    }
    o.stdout
}

fn get_json(api: &KubeApi, args: &[&str]) -> Value {
    let o = api.kubectl_out(&[args, &["-o", "json"]].concat(), None);
    assert!(o.ok, "kubectl {} failed: {}", args.join(" "), o.stderr);
    serde_json::from_str(&o.stdout).unwrap()
}

fn env_of<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("env {name} missing in {}", c["name"]))
}

fn container<'a>(spec: &'a Value, list: &str, name: &str) -> &'a Value {
    spec[list]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("{list} {name} missing"))
}

fn args_of(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// The DaemonSet as the API server stored it has every field of the design.
fn check_daemonset(ds: &Value) {
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert!(spec["hostPID"].is_null() || spec["hostPID"] == false);
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert_eq!(spec["serviceAccountName"], "tern-node");
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    // Init containers: the binaries (no conflist), then the pool.
    let inits: Vec<&str> = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(inits, ["install-cni", "apply-ippool"]);
    let install = container(spec, "initContainers", "install-cni");
    let a = args_of(install);
    assert_eq!(a[0], "install-cni");
    assert!(a.contains(&"--bin-dir=/host/opt/cni/bin"), "{a:?}");
    assert!(a.contains(&"--conf-dir=/host/etc/cni/net.d"), "{a:?}");
    assert!(a.contains(&"--skip-conflist"), "{a:?}");
    let pool = container(spec, "initContainers", "apply-ippool");
    assert_eq!(
        env_of(pool, "TERN_STORE")["valueFrom"]["configMapKeyRef"],
        json!({"name": "tern-config", "key": "store"})
    );
    // ternd.
    let ternd = container(spec, "containers", "ternd");
    assert_eq!(args_of(ternd), ["--kubernetes"]);
    assert_eq!(ternd["securityContext"]["privileged"], true);
    assert_eq!(
        env_of(ternd, "TERN_NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(
        env_of(ternd, "TERN_NODE_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    for (var, key) in [
        ("TERN_STORE", "store"),
        ("TERN_BGP", "bgp"),
        ("TERN_USE_POD_CIDR", "use_pod_cidr"),
        ("TERN_LOG_LEVEL", "log_level"),
    ] {
        assert_eq!(
            env_of(ternd, var)["valueFrom"]["configMapKeyRef"],
            json!({"name": "tern-config", "key": key}),
            "{var}"
        );
    }
    assert_eq!(env_of(ternd, "TERN_HEALTH_ADDR")["value"], "127.0.0.1:9099");
    for (probe, path) in [
        ("livenessProbe", "/liveness"),
        ("readinessProbe", "/readiness"),
    ] {
        let g = &ternd[probe]["httpGet"];
        assert_eq!(g["host"], "127.0.0.1", "{probe}");
        assert_eq!(g["port"], 9099, "{probe}");
        assert_eq!(g["path"], path, "{probe}");
        assert_eq!(g["scheme"], "HTTP", "{probe}");
    }
    let mounts: Vec<(&str, &str)> = ternd["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    for m in [
        ("run-tern", "/run/tern"),
        ("var-lib-tern", "/var/lib/tern"),
        ("run-netns", "/run/netns"),
        ("lib-modules", "/lib/modules"),
    ] {
        assert!(mounts.contains(&m), "{m:?} not in {mounts:?}");
    }
    // The conflist: beside ternd, after its readiness.
    let conf = container(spec, "containers", "cni-conf");
    let a = args_of(conf);
    assert!(a.contains(&"--conflist-only"), "{a:?}");
    assert!(
        a.contains(&"--wait-ready=http://127.0.0.1:9099/readiness"),
        "{a:?}"
    );
    assert!(a.contains(&"--stay"), "{a:?}");
    let host_paths: Vec<&str> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for p in [
        "/run/tern",
        "/var/lib/tern",
        "/opt/cni/bin",
        "/etc/cni/net.d",
        "/run/netns",
        "/lib/modules",
    ] {
        assert!(
            host_paths.contains(&p),
            "hostPath {p} not in {host_paths:?}"
        );
    }
}

/// What the ServiceAccount may do: (verb, resource, subresource) → allowed, over a matrix.
fn check_rbac(api: &KubeApi) {
    const VERBS: [&str; 8] = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    // resource, subresource, allowed verbs
    let datastore: &[&str] = &["get", "list", "watch", "create", "update", "delete"];
    let create_once: &[&str] = &["get", "list", "watch", "create"];
    // The apply-ippool init container applies tern-config's pool: created, then updated.
    let pools: &[&str] = &["get", "list", "watch", "create", "update"];
    let read: &[&str] = &["get", "list", "watch"];
    let table: [(&str, &str, &[&str]); 20] = [
        ("pods", "", &["get", "list", "watch"]),
        ("namespaces", "", &["get", "list", "watch"]),
        ("nodes", "", &["get", "list", "watch"]),
        ("nodes", "status", &["patch", "update"]),
        (
            "networkpolicies.networking.k8s.io",
            "",
            &["get", "list", "watch"],
        ),
        (
            "leases.coordination.k8s.io",
            "",
            &["get", "create", "update"],
        ),
        // tern's own resources, for the Kubernetes datastore.
        ("ipamblocks.tern.dev", "", datastore),
        ("blockaffinities.tern.dev", "", datastore),
        ("ippools.tern.dev", "", pools),
        ("clusterinformations.tern.dev", "", create_once),
        ("globalnetworkpolicies.tern.dev", "", read),
        ("stagednetworkpolicies.tern.dev", "", read),
        ("stagedglobalnetworkpolicies.tern.dev", "", read),
        ("stagedkubernetesnetworkpolicies.tern.dev", "", read),
        ("bgppeers.tern.dev", "", read),
        ("secrets", "", &[]),
        ("configmaps", "", &[]),
        ("services", "", &[]),
        ("daemonsets.apps", "", &[]),
        ("pods", "status", &[]),
    ];
    let mut wrong = Vec::new();
    for (res, sub, allowed) in table {
        for verb in VERBS {
            let mut args = vec!["auth", "can-i", verb, res, "--as", SA, "--all-namespaces"];
            let sub_arg = format!("--subresource={sub}");
            if !sub.is_empty() {
                args.push(&sub_arg);
            }
            let o = api.kubectl_out(&args, None);
            let answer = o.stdout.trim();
            let want = allowed.contains(&verb);
            let got = match answer {
                "yes" => true,
                "no" => false,
                _ => panic!("kubectl {}: {answer:?} {}", args.join(" "), o.stderr),
            };
            if got != want {
                wrong.push(format!("{verb} {res}{sub}: got {answer}, want {want}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "RBAC differs from ternd's needs:\n{}",
        wrong.join("\n")
    );
    // Nothing beyond: the rules the SA has on resources are exactly the manifest's.
    let o = api.kubectl_out(
        &["auth", "can-i", "--list", "--as", SA, "-n", "kube-system"],
        None,
    );
    assert!(o.ok, "{}", o.stderr);
    assert!(!o.stdout.contains("*.*"), "wildcard grant: {}", o.stdout);
}

#[test]
fn manifest_is_accepted_by_a_real_apiserver_with_least_rbac() {
    tern_testkit::kube_api::need_k8s();
    let mut k = KubeNode::start(NODE_IP);
    k.api.request_timeout = Duration::from_secs(20);
    let api = &k.api;

    let default = ternctl(&["install", "manifest"]);
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/tern.yaml"),
    )
    .unwrap();
    assert_eq!(
        default, checked_in,
        "the checked-in manifest is the default rendering"
    );
    // Variants validate too (etcd store, VXLAN, BGP, another image).
    let variant = ternctl(&[
        "install",
        "manifest",
        "--store",
        "etcd://198.18.0.3:2379,198.18.0.4:2379",
        "--encap",
        "vxlan",
        "--bgp",
        "--image",
        "registry.example/tern/tern-node:9",
        "--pool",
        "10.50.0.0/16",
    ]);
    let out = apply(api, &variant, true);
    assert!(out.contains("(server dry run)"), "{out}");
    assert!(
        api.kubectl_out(&["get", "ds", "-n", "kube-system", "tern-node"], None)
            .stderr
            .contains("NotFound"),
        "a dry run must not create anything"
    );
    // etcd over TLS: the Secret is accepted too, and a pod of the template with it.
    let pem = tempfile::tempdir().unwrap();
    let [ca, cert, key] = fake_pem_files(pem.path());
    let tls = ternctl(&[
        "install",
        "manifest",
        "--store",
        "etcd://198.18.0.3:2379",
        "--etcd-ca",
        &ca,
        "--etcd-cert",
        &cert,
        "--etcd-key",
        &key,
    ]);
    let out = apply(api, &tls, true);
    assert!(out.contains("secret/tern-etcd-certs"), "{out}");
    apply(api, &default, true);
    apply(api, &default, false);
    // Applying again changes nothing.
    let again = apply(api, &default, false);
    assert!(
        again.contains("daemonset.apps/tern-node unchanged"),
        "{again}"
    );

    let ds = get_json(api, &["get", "daemonset", "tern-node", "-n", "kube-system"]);
    check_daemonset(&ds);
    let cm = get_json(
        api,
        &["get", "configmap", "tern-config", "-n", "kube-system"],
    );
    assert_eq!(
        cm["data"]["store"], "kubernetes",
        "the Kubernetes datastore by default"
    );
    // Its CRDs are in the manifest: the API server serves tern's kinds.
    let served = api.must(&["api-resources", "--api-group=tern.dev", "-o", "name"]);
    for r in [
        "ippools.tern.dev",
        "ipamblocks.tern.dev",
        "blockaffinities.tern.dev",
    ] {
        assert!(served.lines().any(|l| l == r), "{r} not served:\n{served}");
    }
    assert_eq!(cm["data"]["bgp"], "false");

    // A Pod from the template is admitted as the DaemonSet controller would create it: the
    // service account exists, system-node-critical resolves in kube-system, privileged is
    // allowed.
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tern-node-dryrun", "namespace": "kube-system",
                     "labels": ds["spec"]["template"]["metadata"]["labels"]},
        "spec": ds["spec"]["template"]["spec"],
    });
    pod["spec"]["nodeName"] = json!("itest-node");
    let o = api.kubectl_out(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&pod.to_string()),
    );
    assert!(o.ok, "the template's pod is refused: {}", o.stderr);
    let admitted: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(admitted["spec"]["priority"], 2_000_001_000, "{}", o.stdout);

    check_rbac(api);
}

/// PEM-looking CA, certificate and key files in `dir` (the API server does not parse them).
fn fake_pem_files(dir: &Path) -> [String; 3] {
    [
        ("ca.crt", "CERTIFICATE"),
        ("client.crt", "CERTIFICATE"),
        ("client.key", "PRIVATE KEY"),
    ]
    .map(|(name, label)| {
        let p = dir.join(name);
        std::fs::write(
            &p,
            format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n"),
        )
        .unwrap();
        p.display().to_string()
    })
}

/// `ternctl install manifest` with TLS files that are missing or incomplete fails, naming the
/// flag and the path; nothing is printed.
#[test]
fn install_manifest_names_a_bad_tls_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = fake_pem_files(dir.path());
    let [ca, cert, key] = files.each_ref().map(String::as_str);
    let missing = dir.path().join("missing.key").display().to_string();
    let store = "etcd://198.18.0.3:2379";
    for (args, want) in [
        (
            vec![
                "--etcd-ca",
                ca,
                "--etcd-cert",
                cert,
                "--etcd-key",
                missing.as_str(),
            ],
            vec!["--etcd-key", missing.as_str()],
        ),
        (
            vec!["--etcd-cert", cert, "--etcd-key", key],
            vec!["--etcd-ca"],
        ),
        (
            vec!["--etcd-ca", ca, "--etcd-cert", cert],
            vec!["--etcd-key"],
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
            .args(["install", "manifest", "--store", store])
            .args(&args)
            .env_remove("TERN_STORE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?} printed a manifest");
        for w in want {
            assert!(err.contains(w), "{args:?}: {w:?} not in {err}");
        }
    }
}

/// The init container's `ternctl apply -f /etc/tern/ippool.yaml`, on a SQLite store: the
/// ConfigMap's pool is created, and a re-rendered ConfigMap with VXLAN switches it (the
/// backend switch by ConfigMap + rollout restart).
#[test]
fn configmap_pool_applies_and_switches_encapsulation() {
    let tmp = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", tmp.path().join("tern.db").display());
    let pool_doc = |args: &[&str]| -> String {
        let text = ternctl(&[&["install", "manifest"], args].concat());
        let docs: Vec<Value> = text
            .split("\n---\n")
            .filter_map(|d| serde_norway::from_str::<Value>(d).ok())
            .collect();
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap")
            .expect("a ConfigMap");
        cm["data"]["ippool.yaml"].as_str().unwrap().to_string()
    };
    let file = tmp.path().join("ippool.yaml");
    std::fs::write(&file, pool_doc(&[])).unwrap();
    let f = file.to_str().unwrap();
    // As in the pod without TLS: the ConfigMap's empty etcd_* keys set TERN_ETCD_*="" (not
    // given), which ternctl accepts.
    let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
        .args(["--store", &store, "apply", "-f", f])
        .env_remove("TERN_STORE")
        .env("TERN_ETCD_CA", "")
        .env("TERN_ETCD_CERT", "")
        .env("TERN_ETCD_KEY", "")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "empty TERN_ETCD_*: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pool = || -> (Value, String) {
        let got = ternctl(&[
            "--store",
            &store,
            "get",
            "ippool",
            "default-ipv4-ippool",
            "-o",
            "json",
        ]);
        (serde_json::from_str(&got).unwrap(), got)
    };
    let (v, got) = pool();
    assert_eq!(v["spec"]["cidr"], "10.244.0.0/16", "{got}");
    assert_eq!(v["spec"]["vxlanMode"], "Never", "{got}");
    // The same document again (every node's pod applies it): no error, no change.
    ternctl(&["--store", &store, "apply", "-f", f]);
    std::fs::write(&file, pool_doc(&["--encap", "vxlan"])).unwrap();
    ternctl(&["--store", &store, "apply", "-f", f]);
    let (v, got) = pool();
    assert_eq!(v["spec"]["vxlanMode"], "Always", "{got}");
    assert_eq!(v["spec"]["natOutgoing"], true, "{got}");
}
