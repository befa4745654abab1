//! ternd reads Kubernetes (issue 13, API-server-only part): a real etcd and kube-apiserver (no
//! kubelet) on the loopback of a node namespace; ternd with `--kubeconfig` (a client
//! certificate whose user has only tern's RBAC); pods created with `kubectl` and bound to the
//! node (`spec.nodeName`), wired with the real `tern` plugin with `K8S_POD_NAMESPACE/NAME/UID`
//! in CNI_ARGS as containerd passes them; NetworkPolicies with `kubectl apply`. Pass or fail
//! is decided by the node's WorkloadEndpoints in the store, the `inet tern` table and real UDP
//! traffic between the pods.
//!
//! Shown: labels, service account, named ports and UID reach the endpoints; a policy (with a
//! named port) follows `kubectl apply`/`label`/`delete`; namespace labels feed
//! namespaceSelectors; a restart of the API server — and of ternd while the API server is
//! down — keeps the rules in force, and they follow again after the relist; an unknown pod's
//! ADD answers 11 while the API server is down and DEL succeeds; a missing RBAC permission is
//! a readiness error naming the verb and resource; the Node gets `NetworkUnavailable=False`.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. Every namespace and process is uniquely named / killed by PID and
//! removed by drop guards; the root namespace is never touched.

mod common;

use common::kube::{KubePod, KubeTernd as _};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tern_testkit::kube_api::{AGENT_RBAC, KubeNode};
use tern_testkit::netns::in_netns;
use tern_testkit::ternd::Ternd;
use tern_testkit::wait::wait_until;

const NODE: &str = "itest-node";
const NODE_IP: &str = "198.18.0.10";
const PORT: u16 = 8080;

/// The labels of pod `prod/<pod>`'s WorkloadEndpoint.
fn labels_of(t: &Ternd, pod: &str) -> BTreeMap<String, String> {
    t.endpoint("prod", pod)
        .and_then(|v| serde_json::from_value(v["metadata"]["labels"].clone()).ok())
        .unwrap_or_default()
}

/// Whether a UDP datagram from `from` reaches `to`:PORT and its echo comes back.
fn udp_reaches(from: &KubePod, to: &KubePod) -> bool {
    let to_ip = to.ip.expect("target pod has an address");
    // A process the test spawns (kubectl, kube-apiserver) holds a copy of a socket from fork to
    // exec: the previous probe's server may stay bound that long after it was dropped.
    let bind = || {
        in_netns(&to.ns.path(), move || {
            UdpSocket::bind(SocketAddr::new(to_ip, PORT))
        })
    };
    let mut bound = bind();
    for _ in 0..50 {
        if !matches!(&bound, Err(e) if e.kind() == std::io::ErrorKind::AddrInUse) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        bound = bind();
    }
    let server = bound.expect("binding the server");
    let client = in_netns(&from.ns.path(), || UdpSocket::bind("0.0.0.0:0")).unwrap();
    let t = Some(Duration::from_millis(400));
    server.set_read_timeout(t).unwrap();
    client.set_read_timeout(t).unwrap();
    let dst = SocketAddr::new(to_ip, PORT);
    for _ in 0..3 {
        let _ = client.send_to(b"tern", dst);
        let mut buf = [0u8; 16];
        let Ok((n, src)) = server.recv_from(&mut buf) else {
            continue;
        };
        let _ = server.send_to(&buf[..n], src);
        if client.recv_from(&mut buf).is_ok() {
            return true;
        }
    }
    false
}

/// Waits until `from` → `to` is `allowed` (or not); panics with `what` otherwise.
fn expect_traffic(from: &KubePod, to: &KubePod, allowed: bool, what: &str, t: &Ternd) {
    let ok = wait_until(Duration::from_secs(15), || udp_reaches(from, to) == allowed);
    assert!(
        ok,
        "{what}: {} -> {} should be {}\n{}",
        from.name,
        to.name,
        if allowed { "allowed" } else { "denied" },
        t.log()
    );
}

fn pod_yaml(name: &str, labels: &[(&str, &str)]) -> String {
    let labels: BTreeMap<&str, &str> = labels.iter().cloned().collect();
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "labels": labels},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "web-sa",
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "pause",
                            "ports": [{"name": "echo", "containerPort": PORT, "protocol": "UDP"}]}]
        }
    }))
    .unwrap()
}

/// ternd's role without any permission on networkpolicies.
fn agent_rbac_no_policies() -> String {
    let rule = "- apiGroups: [\"networking.k8s.io\"]\n  resources: [networkpolicies]\n  verbs: \
                [get, list, watch]\n";
    assert!(AGENT_RBAC.contains(rule), "{AGENT_RBAC}");
    AGENT_RBAC.replace(rule, "")
}

/// NetworkPolicy `name` in `prod` over the pods `app: web` with `ingress` (the YAML of
/// `spec.ingress`; none denies every ingress).
fn web_policy(name: &str, ingress: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: {name}, \
         namespace: prod}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  \
         policyTypes: [Ingress]\n  ingress: {ingress}\n"
    )
}

#[test]
fn ternd_follows_the_kubernetes_api() {
    tern_testkit::kube_api::need_k8s();
    let plugin = common::tern_plugin();
    let k = KubeNode::start(NODE_IP);
    k.netns
        .ip(&["route", "add", "default", "via", "198.18.0.1"]);
    let mut ternd = k.ternd(NODE, &["--resync-seconds=5"]);
    let mut api = k.api;
    api.apply(AGENT_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\n---\napiVersion: v1\nkind: \
         Namespace\nmetadata: {{name: prod, labels: {{team: red}}}}\n---\napiVersion: v1\nkind: \
         ServiceAccount\nmetadata: {{name: web-sa, namespace: prod}}\n"
    ));
    for (name, labels) in [
        ("web", vec![("app", "web")]),
        ("client", vec![("role", "client")]),
        ("other", vec![]),
    ] {
        api.apply(&pod_yaml(name, &labels));
    }
    ternd.start();
    ternd.wait_ready(Duration::from_secs(30));

    // The Node condition.
    let cond = wait_until(Duration::from_secs(20), || {
        api.kubectl(&[
            "get", "node", NODE, "-o",
            "jsonpath={.status.conditions[?(@.type==\"NetworkUnavailable\")].status}/{.status.conditions[?(@.type==\"NetworkUnavailable\")].reason}",
        ])
        .is_ok_and(|s| s == "False/TernIsUp")
    });
    assert!(
        cond,
        "NetworkUnavailable=False (TernIsUp) not set on node {NODE}\n{}",
        ternd.log()
    );

    // ADD: labels, service account, named ports and UID from the API server.
    let none = json!({});
    let pods = ternd.add_api_pods(&api, &plugin, "prod", &["web", "client", "other"]);
    let (web, client, other) = (&pods[0], &pods[1], &pods[2]);
    let web_uid = &web.uid;
    let w = &ternd.endpoint("prod", "web").expect("web's endpoint");
    assert_eq!(w["metadata"]["labels"]["app"], "web", "{w}");
    assert_eq!(
        w["metadata"]["labels"]["tern.dev/serviceaccount"], "web-sa",
        "{w}"
    );
    assert_eq!(
        w["metadata"]["annotations"]["tern.dev/pod-uid"],
        web_uid.as_str(),
        "{w}"
    );
    assert_eq!(w["spec"]["serviceAccountName"], "web-sa", "{w}");
    assert_eq!(
        w["spec"]["ports"],
        json!([{"name": "echo", "protocol": "UDP", "port": PORT}]),
        "{w}"
    );

    // A UID the API server does not know for that name: try again, nothing created.
    let mut ghost = KubePod::new("prod", "web");
    ghost.uid = "00000000-0000-0000-0000-000000000000".into();
    let (st, out) = ternd.cni(&plugin, "ADD", Some(&ghost), &none);
    assert_ne!(st, 0, "ADD with a stale UID must fail: {out}");
    assert_eq!(out["code"], 11, "{out}");
    eprintln!("ADD with a stale UID: {}", out["msg"]);

    // No policy: everything flows.
    expect_traffic(client, web, true, "no policy", &ternd);
    expect_traffic(other, web, true, "no policy", &ternd);

    // A NetworkPolicy with a named port, by kubectl apply.
    assert_eq!(ternd.policy_chains(), 0);
    api.apply(&web_policy(
        "web-from-client",
        "[{from: [{podSelector: {matchLabels: {role: client}}}], ports: [{port: echo, protocol: UDP}]}]",
    ));
    expect_traffic(other, web, false, "web-from-client", &ternd);
    expect_traffic(client, web, true, "web-from-client", &ternd);
    assert!(ternd.policy_chains() > 0);

    // kubectl label pod: the endpoint's labels follow and policy re-evaluates.
    api.must(&["label", "pod", "-n", "prod", "other", "role=client"]);
    assert!(
        wait_until(Duration::from_secs(10), || labels_of(&ternd, "other")
            .get("role")
            == Some(&"client".to_string())),
        "label not on the endpoint: {:?}",
        labels_of(&ternd, "other")
    );
    expect_traffic(other, web, true, "other relabelled role=client", &ternd);
    api.must(&["label", "pod", "-n", "prod", "other", "role-"]);
    expect_traffic(other, web, false, "other's role removed", &ternd);
    assert_eq!(labels_of(&ternd, "other").get("role"), None);

    // Delete the policy: its rules go.
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-from-client"]);
    expect_traffic(other, web, true, "policy deleted", &ternd);
    assert!(wait_until(Duration::from_secs(5), || ternd.policy_chains() == 0));

    // namespaceSelector follows the namespace's labels.
    api.apply(&web_policy(
        "web-from-blue",
        "[{from: [{namespaceSelector: {matchLabels: {team: blue}}}]}]",
    ));
    expect_traffic(
        client,
        web,
        false,
        "web-from-blue, namespace team=red",
        &ternd,
    );
    api.must(&["label", "namespace", "prod", "team=blue", "--overwrite"]);
    expect_traffic(client, web, true, "namespace relabelled team=blue", &ternd);
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-from-blue"]);

    // API server restart, and ternd restart while it is down: the rules stay in force.
    api.apply(&web_policy("web-deny", "[]"));
    expect_traffic(client, web, false, "web-deny", &ternd);
    let rss_idle = ternd.rss_kib();
    eprintln!("ternd RSS with the Kubernetes watch on (3 pods): {rss_idle} KiB");

    // Watch expiry: etcd moves on (other objects change) and the API server restarts while
    // ternd runs; its watch cache starts at the new revision, so ternd's resume is answered
    // 410 and the watcher relists. The rules stay in force throughout and follow afterwards.
    let listed = |t: &Ternd| {
        t.log()
            .matches("KubernetesNetworkPolicy objects listed")
            .count()
    };
    let before = listed(&ternd);
    for i in 0..5 {
        api.must(&["create", "configmap", "-n", "prod", &format!("bump-{i}")]);
    }
    // A prober sends to the denied port the whole time: not one datagram may get through
    // while the API server is down, while ternd resumes (410) and while it relists.
    let leaked = AtomicUsize::new(0);
    let probes = AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (relisted, expired) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                probes.fetch_add(1, Ordering::Relaxed);
                if udp_reaches(client, web) {
                    leaked.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        api.stop_apiserver();
        std::thread::sleep(Duration::from_secs(2));
        api.start_apiserver();
        let relisted = wait_until(Duration::from_secs(60), || listed(&ternd) > before);
        let expired = ternd.log().contains("watch expired (410)");
        // A few more probes after the relist completed.
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        (relisted, expired)
    });
    eprintln!(
        "API server restart: 410 seen {expired}, relisted {relisted}, {} probes, {} leaked",
        probes.load(Ordering::Relaxed),
        leaked.load(Ordering::Relaxed)
    );
    assert!(
        relisted && expired,
        "after the API server restart ternd should get a 410 and relist (410 {expired}, \
         relisted {relisted})\n{}",
        ternd.log()
    );
    assert_eq!(
        leaked.load(Ordering::Relaxed),
        0,
        "denied traffic got through during the API server restart / relist"
    );
    expect_traffic(client, web, false, "after the API server restart", &ternd);
    api.must(&["label", "pod", "-n", "prod", "client", "after=restart"]);
    assert!(
        wait_until(Duration::from_secs(20), || labels_of(&ternd, "client")
            .get("after")
            == Some(&"restart".to_string())),
        "pod labels do not follow after the API server restart: {:?}",
        labels_of(&ternd, "client")
    );

    api.stop_apiserver();
    std::thread::sleep(Duration::from_secs(3));
    expect_traffic(client, web, false, "API server down", &ternd);
    ternd.stop();
    ternd.start();
    assert!(ternd.policy_chains() > 0, "ternd restart dropped the rules");
    expect_traffic(
        client,
        web,
        false,
        "ternd restarted while the API server is down",
        &ternd,
    );
    let (code, body) = ternd.http_get("/readiness");
    assert_ne!(code, 200, "ternd ready without the API server: {body}");
    // An ADD of a pod ternd has never seen cannot be answered: try again. DEL needs no API.
    let mut newcomer = KubePod::new("prod", "newcomer");
    let (st, out) = ternd.cni(&plugin, "ADD", Some(&newcomer), &none);
    assert_eq!((st != 0, out["code"].clone()), (true, json!(11)), "{out}");
    eprintln!("ADD of an unknown pod, API server down: {}", out["msg"]);
    let (st, out) = ternd.cni(&plugin, "DEL", Some(other), &none);
    assert_eq!(st, 0, "DEL with the API server down: {out}");

    api.start_apiserver();
    ternd.wait_ready(Duration::from_secs(60));
    expect_traffic(
        client,
        web,
        false,
        "after the relist, web-deny still exists",
        &ternd,
    );
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-deny"]);
    expect_traffic(
        client,
        web,
        true,
        "web-deny deleted after the API server restart",
        &ternd,
    );
    assert!(wait_until(Duration::from_secs(5), || ternd.policy_chains() == 0));

    // The runtime retries the newcomer's ADD once the API server is back and the pod exists.
    api.apply(&pod_yaml("newcomer", &[("app", "newcomer")]));
    newcomer.uid = api.pod_uid("prod", "newcomer");
    let (st, out) = ternd.cni(&plugin, "ADD", Some(&newcomer), &none);
    assert_eq!(st, 0, "ADD newcomer after the API server is back: {out}");
    assert_eq!(
        labels_of(&ternd, "newcomer").get("app").map(String::as_str),
        Some("newcomer")
    );

    // RBAC: without networkpolicies the agent says exactly what it lacks.
    api.apply(&agent_rbac_no_policies());
    ternd.stop();
    ternd.start();
    let mut last = String::new();
    let named = wait_until(Duration::from_secs(30), || {
        let (code, body) = ternd.http_get("/readiness");
        last = body;
        code != 200 && last.contains("may not list networkpolicies.networking.k8s.io")
    });
    assert!(
        named,
        "readiness does not name the missing permission: {last}"
    );
    assert!(
        ternd
            .log()
            .contains("RBAC: ternd may not list networkpolicies.networking.k8s.io"),
        "the log does not name the missing permission"
    );
    let (st, out) = ternd.cni_status(&plugin);
    assert_ne!(
        st, 0,
        "STATUS must fail while a permission is missing: {out}"
    );
    assert_eq!(out["code"], 50, "{out}");
    assert!(
        out["msg"]
            .as_str()
            .unwrap_or("")
            .contains("networkpolicies"),
        "{out}"
    );
    api.apply(AGENT_RBAC);
    ternd.wait_ready(Duration::from_secs(90));
    eprintln!("ternd RSS idle with the watch on: {} KiB", ternd.rss_kib());
    if let Ok(p) = std::env::var("TERN_TEST_DUMP_LOGS") {
        std::fs::write(p, ternd.log()).unwrap();
    }
}
