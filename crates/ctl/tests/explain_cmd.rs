//! `ternctl explain` on a SQLite store in a temporary directory: endpoints written as the agent
//! writes them (`tern_agent::endpoints::store_io`), namespaces and policies (Kubernetes and
//! tern, global and namespaced) with `ternctl apply`; the JSON and the table name the policy
//! and rule that decide, the policies of a default deny, a node's address (a host), an outside
//! address, and a pod that does not exist.

use serde_json::{Value, json};

mod store_cmd;
use store_cmd::explain::{cause, explain, pod};
use store_cmd::ternctl;

const POLICIES: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: shop}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: api}}}]
    ports: [{port: 8080}]
  - from: [{namespaceSelector: {matchLabels: {team: ops}}}, {podSelector: {matchLabels: {app: api}}}]
    ports: [{port: 9090}]
---
apiVersion: tern.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: no-other}
spec:
  order: 10
  selector: app == 'web'
  ingress:
  - action: Log
  - action: Deny
    source: {namespaceSelector: \"kubernetes.io/metadata.name == 'other'\"}
";

#[test]
fn explain_names_the_deciding_policy_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = tern_store::open(&url).unwrap();
    pod(&*store, "shop", "web", "web", "10.91.0.2");
    pod(&*store, "shop", "api", "api", "10.91.0.3");
    pod(&*store, "other", "client", "client", "10.91.0.4");
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, POLICIES).unwrap();
    let (code, _, err) = ternctl(&url, &["apply", "-f", file.to_str().unwrap()]);
    assert_eq!(code, 0, "apply: {err}");

    // Allowed by the Kubernetes policy's first rule; the log rule is passed over.
    let v = explain(&url, "shop/api", "shop/web", "8080/TCP");
    assert_eq!(v["verdict"], "allowed");
    assert_eq!(
        (&v["src"], &v["dst"]["pod"], &v["proto"], &v["port"]),
        (
            &json!({"ip": "10.91.0.3", "namespace": "shop", "pod": "api", "endpoint": "n1-k8s-api-eth0"}),
            &json!("web"),
            &json!("TCP"),
            &json!(8080)
        )
    );
    assert_eq!(
        cause(&v["ingress"]),
        json!([
            "allowed",
            "rule",
            [["KubernetesNetworkPolicy", "shop", "web-in", "ingress[0]"]]
        ])
    );
    assert_eq!(cause(&v["egress"]), json!(["allowed", "no-policy", []]));
    assert_eq!(v["ingress"]["logged"][0]["name"], "no-other");
    // The second rule as written, though it expands into two peers and is the third IR rule.
    let v = explain(&url, "shop/api", "shop/web", "9090");
    assert_eq!(
        cause(&v["ingress"]),
        json!([
            "allowed",
            "rule",
            [["KubernetesNetworkPolicy", "shop", "web-in", "ingress[1]"]]
        ])
    );
    // Denied by the global policy's Deny rule, which comes first by order.
    let v = explain(&url, "other/client", "shop/web", "8080/TCP");
    assert_eq!(v["verdict"], "denied");
    assert_eq!(
        cause(&v["ingress"]),
        json!([
            "denied",
            "rule",
            [["GlobalNetworkPolicy", null, "no-other", "ingress[1]"]]
        ])
    );
    // No rule matches: both selecting policies, in evaluation order, no rule.
    let v = explain(&url, "shop/api", "shop/web", "9999/UDP");
    assert_eq!(
        cause(&v["ingress"]),
        json!([
            "denied",
            "default-deny",
            [
                ["GlobalNetworkPolicy", null, "no-other", null],
                ["KubernetesNetworkPolicy", "shop", "web-in", null]
            ]
        ])
    );
    // An outside address has no pod and no policy; api is selected by nothing.
    let v = explain(&url, "192.0.2.9", "shop/api", "80");
    assert_eq!(v["verdict"], "allowed");
    assert_eq!(v["src"], json!({"ip": "192.0.2.9"}));
    assert_eq!(v["egress"]["endpoint"], Value::Null);
    assert_eq!(cause(&v["ingress"]), json!(["allowed", "no-policy", []]));
    // A node's address is that host; the web pod's policies leave it to the default deny.
    let node = "apiVersion: tern.dev/v1\nkind: Node\nmetadata: {name: n1}\nspec: {bgp: {ipv4Address: 198.18.0.2/24}}\n";
    for n in tern_model::parse_documents(node, "node.yaml").unwrap() {
        tern_model::put_resource(&*store, &n).unwrap();
    }
    let v = explain(&url, "198.18.0.2", "shop/web", "8080");
    assert_eq!(v["src"], json!({"ip": "198.18.0.2", "node": "n1"}));
    assert_eq!(v["ingress"]["reason"], "default-deny");
    let (_, out, _) = ternctl(
        &url,
        &[
            "explain",
            "--from",
            "198.18.0.2",
            "--to",
            "shop/web",
            "--port",
            "8080",
        ],
    );
    assert!(
        out.starts_with("host n1 (198.18.0.2) -> shop/web (10.91.0.2) 8080/TCP: DENIED"),
        "{out}"
    );
    // An address of a pod is that pod.
    let v = explain(&url, "10.91.0.4", "10.91.0.2", "8080/tcp");
    assert_eq!(v["src"]["pod"], "client");
    assert_eq!(v["verdict"], "denied");

    // The table: verdict, a row per direction, the selecting policies in order.
    let (code, out, err) = ternctl(
        &url,
        &[
            "explain",
            "--from",
            "other/client",
            "--to",
            "shop/web",
            "--port",
            "8080/TCP",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "other/client (10.91.0.4) -> shop/web (10.91.0.2) 8080/TCP: DENIED",
        "{out}"
    );
    let row = |dir: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(dir))
            .unwrap_or_else(|| panic!("no {dir} row:\n{out}"))
            .split("   ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row("egress"),
        [
            "egress",
            "other/client (10.91.0.4)",
            "allowed",
            "no-policy",
            "no policy selects it"
        ]
    );
    assert_eq!(
        row("ingress "),
        [
            "ingress",
            "shop/web (10.91.0.2)",
            "denied",
            "rule",
            "GlobalNetworkPolicy no-other ingress[1] (deny)"
        ]
    );
    let order: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with("ingress policies selecting shop/web"))
        .skip(2)
        .copied()
        .collect();
    assert_eq!(order.len(), 2, "{out}");
    assert!(
        order[0].contains("GlobalNetworkPolicy no-other")
            && order[0].contains("decides: ingress[1] deny; logged by ingress[0]"),
        "{out}"
    );
    assert!(
        order[1].contains("KubernetesNetworkPolicy shop/web-in")
            && order[1].contains("not reached"),
        "{out}"
    );

    // A pod that does not exist is named.
    let (code, _, err) = ternctl(
        &url,
        &[
            "explain",
            "--from",
            "shop/nope",
            "--to",
            "shop/web",
            "--port",
            "80",
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("pod shop/nope not found"), "{err}");
    let (code, _, err) = ternctl(
        &url,
        &[
            "explain", "--from", "shop/api", "--to", "shop/web", "--port", "80/ICMP",
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("\"ICMP\" is not TCP, UDP or SCTP"), "{err}");
}
