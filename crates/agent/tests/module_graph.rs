//! The agent's module layering, enforced on the workspace's module graph
//! (`tern_testkit::modules`, which every crate's `tests/module_graph.rs` uses): every top-level
//! module of `src/` declares its layer in [`LAYERS`], and the modules its code names (through
//! `crate::`, `super::` and `self::` paths; comments and unit tests are not read) must respect it.
//!
//! - The module graph is acyclic, file by file and between top-level modules.
//! - A leaf imports only leaves: the leaves form a DAG among themselves (acyclic by the rule
//!   above). The store snapshot's types live in the `snapshot` leaf, and the pure modules that
//!   compute from them (`routes`, `mtu`, `nat`) import them from there.
//! - A service imports only leaves, never another service: what two services share is a leaf
//!   (a type, or a trait such as `nat::NatTable` that one implements and the root hands the
//!   other).
//! - The root alone names `Agent`, and nothing below the root imports it.
//!
//! An edge that breaks a rule today is listed, with its reason, in [`KNOWN_EDGES`]; the test
//! also fails when a listed edge has disappeared, so the list only shrinks.
//! This mirrors the table in the doc of `src/lib.rs`; keep the two equal.

use std::collections::{BTreeMap, BTreeSet};

use tern_testkit::modules::{self, Graph};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// Data, pure functions and host queries: imports other leaves only (no cycle).
    Leaf,
    /// One concern with its own state: imports leaves only.
    Service,
    /// The agent: wires the services, serves the socket and HTTP, runs the loops.
    Root,
}
use Layer::*;

/// The layer of every top-level module (a directory module such as `kube/` is one node; `crate`
/// is `lib.rs`).
const LAYERS: &[(&str, Layer)] = &[
    ("admission", Leaf),
    ("claims", Leaf),
    ("config", Leaf),
    ("endpoints", Leaf),
    ("external", Leaf),
    ("host", Leaf),
    ("hostcheck", Leaf),
    ("identity", Leaf),
    ("logger", Leaf),
    ("metrics", Leaf),
    ("mtu", Leaf),
    ("nat", Leaf),
    ("owners", Leaf),
    ("reaper", Leaf),
    ("routes", Leaf),
    ("runtime", Leaf),
    ("snapshot", Leaf),
    ("testutil", Leaf),
    ("undo", Leaf),
    ("bgp", Service),
    ("dataplane", Service),
    ("kube", Service),
    ("pod", Service),
    ("policy", Service),
    ("flows", Service),
    ("agent", Root),
    ("http", Root),
    ("crate", Root),
    ("reconcile", Root),
    ("server", Root),
];

/// Edges that break a layer rule today (never a cycle, never `Agent`), each with its reason.
const KNOWN_EDGES: &[(&str, &str, &str)] = &[];

fn names_agent(line: &str) -> bool {
    line.match_indices("Agent").any(|(i, _)| {
        let before = line[..i].chars().last();
        let after = line[i + "Agent".len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
}

/// The crate's module graph (file by file).
fn files() -> Graph {
    modules::graph(env!("CARGO_MANIFEST_DIR"))
}

/// The top-level modules whose code names `Agent`.
fn agent_named(g: &Graph) -> BTreeSet<String> {
    g.files
        .keys()
        .filter(|m| g.code(m).lines().any(names_agent))
        .map(|m| m.split("::").next().unwrap_or(m).to_string())
        .collect()
}

fn render(g: &Graph) -> String {
    let layer = layer_map();
    let mut s = String::from("agent module graph (module [layer] -> imports):\n");
    for (m, to) in &g.edges {
        let l = layer
            .get(m.as_str())
            .map_or("?".into(), |l| format!("{l:?}"));
        let to: Vec<&str> = to.iter().map(String::as_str).collect();
        s += &format!("  {m} [{l}] -> {}\n", to.join(", "));
    }
    s
}

fn layer_map() -> BTreeMap<&'static str, Layer> {
    LAYERS.iter().copied().collect()
}

#[test]
fn module_graph_is_acyclic() {
    modules::assert_acyclic(&files());
}

#[test]
fn agent_modules_are_layered() {
    let files = files();
    let g = files.top_level();
    let layer = layer_map();
    let graph = render(&g);
    let mut problems = Vec::new();

    let declared: BTreeSet<&str> = layer.keys().copied().collect();
    let found: BTreeSet<&str> = g.edges.keys().map(String::as_str).collect();
    for m in found.difference(&declared) {
        problems.push(format!("module `{m}` has no layer in LAYERS"));
    }
    for m in declared.difference(&found) {
        problems.push(format!("LAYERS names `{m}`, which has no file"));
    }

    if let Some(c) = g.find_cycle() {
        problems.push(format!("import cycle: {}", c.join(" -> ")));
    }

    let known: BTreeSet<(&str, &str)> = KNOWN_EDGES.iter().map(|(a, b, _)| (*a, *b)).collect();
    let mut used_known = BTreeSet::new();
    for (m, to) in &g.edges {
        let Some(&lm) = layer.get(m.as_str()) else {
            continue;
        };
        for t in to {
            let Some(&lt) = layer.get(t.as_str()) else {
                problems.push(format!("`{m}` names `{t}`, which has no layer"));
                continue;
            };
            let ok = match lm {
                Leaf | Service => lt == Leaf,
                Root => true,
            };
            if ok {
                continue;
            }
            if known.contains(&(m.as_str(), t.as_str())) {
                used_known.insert((m.as_str(), t.as_str()));
                continue;
            }
            problems.push(format!(
                "`{m}` ({lm:?}) imports `{t}` ({lt:?}): a leaf or a service imports only leaves"
            ));
        }
    }
    for k in known.difference(&used_known) {
        problems.push(format!(
            "KNOWN_EDGES lists {} -> {}, which no longer exists or is allowed: remove it",
            k.0, k.1
        ));
    }

    for m in &agent_named(&files) {
        if layer.get(m.as_str()) != Some(&Root) {
            problems.push(format!("`{m}` names `Agent`; only the root may"));
        }
    }

    assert!(problems.is_empty(), "{}\n\n{graph}", problems.join("\n"));
    println!("{graph}");
}

#[test]
fn agent_is_found_as_a_word() {
    assert!(names_agent("impl Agent {"));
    assert!(!names_agent("let c: AgentConfig;"));
}
