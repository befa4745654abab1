//! What the `explain` and `policy` command tests share: pods written to the store as the agent
//! writes them, `ternctl explain -o json`, and a direction's cause in a form to compare.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tern_agent::endpoints::{Endpoint, store_io};
use tern_api::{Attachment, PodRef};
use tern_store::Store;

use super::ternctl;

/// A pod `ns/name` labelled `app=<app>` at `ip`, on node `n1`, as the agent stores it.
pub fn pod(store: &dyn Store, ns: &str, name: &str, app: &str, ip: &str) {
    let ep = Endpoint {
        node: "n1".into(),
        attachment: Attachment {
            network: "k8s-pod-network".into(),
            container_id: format!("c-{name}"),
            ifname: "eth0".into(),
            netns_path: "/run/netns/x".into(),
            pod: Some(PodRef {
                namespace: ns.into(),
                name: name.into(),
                infra_container_id: String::new(),
                uid: String::new(),
            }),
        },
        host_ifname: format!("tern{name}"),
        mac: Some(tern_model::MacAddr([0xee, 0xee, 0xee, 0xee, 0xee, 0x01])),
        ip_networks: vec![format!("{ip}/32").parse().unwrap()],
        labels: BTreeMap::from([("app".to_string(), app.to_string())]),
        ports: Vec::new(),
        delegated_ipam: false,
    };
    store_io::put(store, &ep).unwrap();
}

/// `ternctl --store STORE explain --from FROM --to TO --port PORT -o json`, which must succeed.
pub fn explain(store: &str, from: &str, to: &str, port: &str) -> Value {
    let (code, out, err) = ternctl(
        store,
        &[
            "explain", "--from", from, "--to", to, "--port", port, "-o", "json",
        ],
    );
    assert_eq!(code, 0, "explain {from} -> {to} {port}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A direction's explanation (`v["ingress"]`, `v["pending"]["egress"]`, ...) as
/// `[verdict, reason, [[kind, namespace, name, rule]...]]`.
pub fn cause(d: &Value) -> Value {
    let pols: Vec<Value> = d["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| json!([p["kind"], p["namespace"], p["name"], p["rule"]]))
        .collect();
    json!([d["verdict"], d["reason"], pols])
}
