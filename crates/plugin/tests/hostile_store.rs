//! ternd survives hostile resources written straight into its store (issue 10): selectors of
//! a few kilobytes (deep parentheses, long `||` chains, thousands of `!`) in a
//! GlobalNetworkPolicy and an IPPool `nodeSelector`, and a document over tern's resource limit
//! (1 MiB) but under the store's own value limit, each written past `ternctl`'s validation. Before the bounds, a debug ternd aborted with a stack overflow
//! on its policy watch thread as soon as such a policy was written, and again at every
//! restart. Now each is skipped with a warning naming its key, ternd keeps serving, and an ADD
//! still succeeds, both while running and after a restart that loads them from the store.
//!
//! The node is a uniquely named network namespace with ternd killed by PID on drop (see
//! `common`); nothing touches the root namespace.

mod common;

use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tern_model::Kind;

fn nested_parens(n: usize) -> String {
    format!("{}a == 'x'{}", "(".repeat(n), ")".repeat(n))
}

/// A raw document (key, JSON) of `kind` named `name`, with `spec` and, when given, one
/// annotation `a` of that value.
fn document(kind: Kind, name: &str, annotation: Option<String>, spec: Value) -> (String, String) {
    let mut metadata = json!({"name": name});
    if let Some(a) = annotation {
        metadata["annotations"] = json!({ "a": a });
    }
    let doc = json!({
        "apiVersion": "tern.dev/v1",
        "kind": kind.document_kind(),
        "metadata": metadata,
        "spec": spec,
    });
    (tern_model::resource_key(kind, None, name), doc.to_string())
}

/// The raw documents (key, JSON) that bypass validation.
fn hostile_documents() -> Vec<(String, String)> {
    let gnp = |name: &str, selector: &str| {
        document(
            Kind::GlobalNetworkPolicy,
            name,
            None,
            json!({
                "selector": selector,
                "ingress": [{"action": "Allow", "source": {"selector": selector}}],
            }),
        )
    };
    let chain = (0..3000)
        .map(|i| format!("k{i} == 'v'"))
        .collect::<Vec<_>>()
        .join(" || ");
    let pool = document(
        Kind::IpPool,
        "evil-pool",
        None,
        json!({
            "cidr": "10.99.0.0/16",
            "nodeSelector": format!("{}all()", "!".repeat(3000)),
        }),
    );
    let fat = document(
        Kind::GlobalNetworkPolicy,
        "evil-fat",
        Some("x".repeat(1_200_000)),
        json!({"selector": "all()"}),
    );
    // Over the resource limit in the IPAM path too: every ADD lists the pools.
    let fat_pool = document(
        Kind::IpPool,
        "evil-fat-pool",
        Some("x".repeat(1_200_000)),
        json!({"cidr": "10.98.0.0/16"}),
    );
    vec![
        gnp("evil-parens", &nested_parens(1500)),
        gnp("evil-chain", &chain),
        pool,
        fat,
        fat_pool,
    ]
}

fn alive(node: &Node) -> bool {
    // A crashed ternd leaves its socket file behind, refusing connections.
    UnixStream::connect(node.socket()).is_ok()
}

#[test]
fn ternd_survives_pathological_selectors_and_documents_in_the_store() {
    tern_testkit::need_root();
    let mut node = Node::new();
    let conf = node.conf("1.0.0");
    let before = Pod::new();
    node.add(&before, "hostile-before", &conf);

    let docs = hostile_documents();
    let keys: Vec<String> = docs.iter().map(|(k, _)| k.clone()).collect();
    node.with_store_conn(move |s| {
        for (k, v) in docs {
            s.put(&k, v.as_bytes()).expect("raw put");
        }
    });
    // The watch threads see the writes at once; resync runs every second: give both time.
    std::thread::sleep(Duration::from_secs(3));
    assert!(alive(&node), "ternd died: {}", node.agent_log());
    let during = Pod::new();
    node.add(&during, "hostile-during", &conf);
    let log = node.agent_log();
    assert!(!log.contains("overflow"), "{log}");
    for k in &keys {
        assert!(
            log.contains(k.as_str()),
            "no warning naming {k} in the log: {log}"
        );
    }

    // At restart the documents are loaded from the store: ternd starts, stays up and serves.
    node.stop();
    node.start();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        alive(&node),
        "ternd died after restart: {}",
        node.agent_log()
    );
    let after = Pod::new();
    node.add(&after, "hostile-after", &conf);
    assert!(!node.agent_log().contains("overflow"));
}
