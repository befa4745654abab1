//! The agent's module layering, enforced: every module of `src/` declares its layer in
//! [`LAYERS`], and the `crate::` references of its code (comments are ignored) must respect it.
//!
//! - The module graph is acyclic.
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
use std::path::Path;

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

/// The layer of every module (a directory module such as `kube/` is one node).
const LAYERS: &[(&str, Layer)] = &[
    ("claims", Leaf),
    ("code", Leaf),
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
    ("bgp", Service),
    ("dataplane", Service),
    ("kube", Service),
    ("leak", Service),
    ("policy", Service),
    ("http", Root),
    ("lib", Root),
    ("ops", Root),
    ("reconcile", Root),
    ("server", Root),
];

/// Edges that break a layer rule today (never a cycle, never `Agent`), each with its reason.
const KNOWN_EDGES: &[(&str, &str, &str)] = &[];

/// The module a file belongs to: `src/x.rs` → `x`, `src/x/...` → `x`; `None` for binaries.
fn module_of(rel: &Path) -> Option<String> {
    let mut parts = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    if first == "bin" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// The code of a file without its comment lines (doc links are not imports).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with("//"))
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules a line names through `crate::x` or `crate::{x, y::z}`.
fn crate_refs(line: &str, out: &mut BTreeSet<String>) {
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `tern_crate::`, not ours
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident_at(&group[j..]).to_string());
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let id = ident_at(rest);
            if !id.is_empty() {
                out.insert(id.to_string());
            }
        }
    }
}

fn names_agent(line: &str) -> bool {
    line.match_indices("Agent").any(|(i, _)| {
        let before = line[..i].chars().last();
        let after = line[i + "Agent".len()..].chars().next();
        let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !word(before) && !word(after)
    })
}

fn rs_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    agent_named: BTreeSet<String>,
}

fn scan() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut g = Graph {
        edges: BTreeMap::new(),
        agent_named: BTreeSet::new(),
    };
    for f in files {
        let Some(m) = module_of(f.strip_prefix(&src).unwrap()) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        let refs = g.edges.entry(m.clone()).or_default();
        for l in code_lines(&text) {
            crate_refs(l, refs);
            if names_agent(l) {
                g.agent_named.insert(m.clone());
            }
        }
        refs.remove(&m);
    }
    g
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

/// A cycle in the graph, if any (depth-first search).
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = stack.iter().position(|s| s == n).unwrap();
                let mut c = stack[at..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, stack) {
                return Some(c);
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.edges.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn agent_modules_are_layered() {
    let g = scan();
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

    if let Some(c) = find_cycle(&g) {
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
                problems.push(format!("`{m}` names `crate::{t}`, which is no module"));
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

    for m in &g.agent_named {
        if layer.get(m.as_str()) != Some(&Root) {
            problems.push(format!("`{m}` names `Agent`; only the root may"));
        }
    }

    assert!(problems.is_empty(), "{}\n\n{graph}", problems.join("\n"));
    println!("{graph}");
}

#[test]
fn scanner_reads_paths_and_groups() {
    let mut r = BTreeSet::new();
    crate_refs(
        "use crate::{a, b::{C, d}, e::F}; let x = crate::g::h(); tern_crate::z",
        &mut r,
    );
    let r: Vec<&str> = r.iter().map(String::as_str).collect();
    assert_eq!(r, ["a", "b", "e", "g"]);
    assert!(names_agent("impl Agent {"));
    assert!(!names_agent("let c: AgentConfig;"));
}
