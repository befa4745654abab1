//! Staged policies through `ternctl` on a SQLite store in a temporary directory: `apply`,
//! `get` and `delete` by calicoctl's names and aliases; `explain` shows what a staged
//! default-deny would deny (`pending`) while the enforced verdict stays; `policy promote`
//! enforces it (Set) or deletes the enforced policy (Delete), and finishes a promote that
//! stopped between its two writes.

use serde_json::{Value, json};
use tern_model::Kind;
use tern_store::Store;

mod store_cmd;
use store_cmd::explain::{cause, explain, pod};
use store_cmd::ternctl;

const POLICIES: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: shop}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: api}}}]
    ports: [{port: 8080}]
---
apiVersion: tern.dev/v1
kind: StagedKubernetesNetworkPolicy
metadata: {name: default-deny, namespace: shop, labels: {owner: sec}}
spec:
  podSelector: {}
  policyTypes: [Ingress]
";

fn ok(store: &str, args: &[&str]) -> String {
    let (code, out, err) = ternctl(store, args);
    assert_eq!(code, 0, "ternctl {args:?}: {err}");
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    url: String,
    store: std::sync::Arc<dyn Store>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = tern_store::open(&url).unwrap();
    pod(&*store, "shop", "web", "web", "10.92.0.2");
    pod(&*store, "shop", "api", "api", "10.92.0.3");
    pod(&*store, "shop", "db", "db", "10.92.0.4");
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, POLICIES).unwrap();
    let out = ok(&url, &["apply", "-f", file.to_str().unwrap()]);
    assert!(out.contains("StagedKubernetesNetworkPolicy"), "{out}");
    Fixture {
        _dir: dir,
        url,
        store,
    }
}

#[test]
fn a_staged_default_deny_is_pending_then_promoted() {
    let f = fixture();
    let url = &f.url;
    // calicoctl's names and aliases.
    for kind in [
        "stagedkubernetesnetworkpolicy",
        "stagedkubernetesnetworkpolicies",
        "sknp",
    ] {
        let out = ok(url, &["get", kind, "-n", "shop"]);
        assert!(out.contains("default-deny") && out.contains("Set"), "{out}");
    }

    // api -> db: allowed (no policy selects db), pending denied by the staged policy alone.
    let v = explain(url, "shop/api", "shop/db", "5432/TCP");
    assert_eq!(v["verdict"], "allowed");
    assert_eq!(v["ingress"]["reason"], "no-policy");
    assert_eq!(v["pending"]["verdict"], "denied");
    assert_eq!(
        cause(&v["pending"]["ingress"]),
        json!([
            "denied",
            "default-deny",
            [[
                "StagedKubernetesNetworkPolicy",
                "shop",
                "default-deny",
                null
            ]]
        ])
    );
    assert!(v["pending"].get("egress").is_none(), "{v}");
    // api -> web:8080: allowed by web-in's rule, staged or not: nothing pending.
    let v = explain(url, "shop/api", "shop/web", "8080");
    assert_eq!(v["verdict"], "allowed");
    assert!(v.get("pending").is_none(), "{v}");
    // The table says it in one glance.
    let table = ok(
        url,
        &[
            "explain", "--from", "shop/api", "--to", "shop/db", "--port", "5432",
        ],
    );
    assert!(
        table.starts_with(
            "shop/api (10.92.0.3) -> shop/db (10.92.0.4) 5432/TCP: ALLOWED (staged policies: DENIED)"
        ),
        "{table}"
    );
    assert!(
        table.contains("no rule matched in StagedKubernetesNetworkPolicy shop/default-deny"),
        "{table}"
    );

    // Promote: the enforced Kubernetes policy with the staged one's spec and labels.
    let out = ok(url, &["policy", "promote", "default-deny", "-n", "shop"]);
    assert!(out.contains("promoted"), "{out}");
    let enforced = tern_model::get_resource(
        &*f.store,
        Kind::K8sNetworkPolicy,
        Some("shop"),
        "default-deny",
    )
    .unwrap()
    .expect("the enforced policy is written");
    assert_eq!(enforced.metadata().labels["owner"], "sec");
    assert!(
        tern_model::get_resource(
            &*f.store,
            Kind::StagedKubernetesNetworkPolicy,
            Some("shop"),
            "default-deny"
        )
        .unwrap()
        .is_none()
    );
    let v = explain(url, "shop/api", "shop/db", "5432/TCP");
    assert_eq!(v["verdict"], "denied");
    assert_eq!(
        cause(&v["ingress"]),
        json!([
            "denied",
            "default-deny",
            [["KubernetesNetworkPolicy", "shop", "default-deny", null]]
        ])
    );
    assert!(v.get("pending").is_none(), "{v}");
    // Nothing left to promote.
    let (code, _, err) = ternctl(url, &["policy", "promote", "default-deny", "-n", "shop"]);
    assert_ne!(code, 0);
    assert!(err.contains("no staged policy \"default-deny\""), "{err}");
}

/// A promote that stopped after its first write (the enforced policy written, or deleted)
/// finishes when run again; a staged Delete deletes the enforced policy.
#[test]
fn promote_finishes_after_a_crash_between_its_writes() {
    let f = fixture();
    let url = &f.url;
    // The first write of a Set promote done by hand, as a crash would leave it.
    let staged = tern_model::get_resource(
        &*f.store,
        Kind::StagedKubernetesNetworkPolicy,
        Some("shop"),
        "default-deny",
    )
    .unwrap()
    .unwrap();
    let tern_ctl::commands::promote::Promotion::Set(enforced) =
        tern_ctl::commands::promote::promotion(&staged).unwrap()
    else {
        panic!("a Set")
    };
    tern_model::put_resource(&*f.store, &enforced).unwrap();
    let out = ok(
        url,
        &[
            "policy",
            "promote",
            "default-deny",
            "-n",
            "shop",
            "--kind",
            "sknp",
        ],
    );
    assert!(out.contains("written"), "{out}");
    let got = tern_model::get_resource(
        &*f.store,
        Kind::K8sNetworkPolicy,
        Some("shop"),
        "default-deny",
    )
    .unwrap()
    .unwrap();
    // The same document as the first write, the resource version aside.
    let mut got: Value = serde_json::from_str(&got.to_json()).unwrap();
    got["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let mut want = enforced.clone();
    want.fill_defaults();
    assert_eq!(got, serde_json::from_str::<Value>(&want.to_json()).unwrap());

    // A staged Delete of web-in: pending shows api -> web:8080 denied by the default deny.
    let del = "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: web-in, namespace: shop}\nspec: {stagedAction: Delete}\n";
    let file = f._dir.path().join("del.yaml");
    std::fs::write(&file, del).unwrap();
    ok(url, &["apply", "-f", file.to_str().unwrap()]);
    let v = explain(url, "shop/api", "shop/web", "8080");
    assert_eq!(v["verdict"], "allowed");
    assert_eq!(
        cause(&v["pending"]["ingress"]),
        json!([
            "denied",
            "default-deny",
            [["KubernetesNetworkPolicy", "shop", "default-deny", null]]
        ])
    );
    // Its first write (the enforced web-in deleted) done, then the crash: promote finishes.
    assert!(
        tern_model::delete_resource(&*f.store, Kind::K8sNetworkPolicy, Some("shop"), "web-in")
            .unwrap()
    );
    let out = ok(url, &["policy", "promote", "web-in", "-n", "shop"]);
    assert!(out.contains("was already absent"), "{out}");
    let v = explain(url, "shop/api", "shop/web", "8080");
    assert_eq!(v["verdict"], "denied");
    assert!(v.get("pending").is_none(), "{v}");
    let out = ok(url, &["get", "sknp", "-n", "shop"]);
    assert!(!out.contains("web-in"), "{out}");

    // Bad input names what is wrong.
    let (code, _, err) = ternctl(
        url,
        &[
            "policy",
            "promote",
            "default-deny",
            "-n",
            "shop",
            "--kind",
            "knp",
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("not a staged kind"), "{err}");
    // delete by alias.
    ok(url, &["apply", "-f", file.to_str().unwrap()]);
    ok(url, &["delete", "sknp", "web-in", "-n", "shop"]);
}
