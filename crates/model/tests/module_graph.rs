//! The module graph of `tern-model` is acyclic, also counting an edge from each parent to the
//! children it declares (so a module importing through the root or its parent is a cycle), and
//! generic code reaches the kind modules only through the table (`registry`). The scanner is
//! the workspace's one (`tern_testkit::modules`).

use tern_testkit::modules::{self, Graph};

fn graph() -> Graph {
    let g = modules::graph(env!("CARGO_MANIFEST_DIR")).with_declarations();
    assert!(g.files.len() > 5, "found only {:?}", g.files.keys());
    g
}

#[test]
fn module_graph_is_acyclic() {
    let g = graph();
    modules::assert_acyclic(&g);
    println!("module graph:\n{}", g.render());
}

#[test]
fn generic_code_reaches_kinds_only_through_the_table() {
    let g = graph();
    for (m, deps) in &g.edges {
        let generic = !(m == modules::ROOT || m == "registry" || m.starts_with("kinds"));
        let to_kinds: Vec<_> = deps.iter().filter(|d| d.starts_with("kinds")).collect();
        assert!(
            !generic || to_kinds.is_empty(),
            "{m} imports {to_kinds:?}; generic code must go through the registry\nmodule graph:\n{}",
            g.render()
        );
    }
    for leaf in ["error", "limits", "document", "validate"] {
        let deps = &g.edges[leaf];
        assert!(
            deps.iter().all(|d| d == "limits"),
            "{leaf} must be a leaf (it may use only limits) but imports {deps:?}"
        );
    }
}
