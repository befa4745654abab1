//! `tern-testkit`'s modules import each other in no circle, and every crate of the workspace
//! has a `tests/module_graph.rs` that checks its own with the same scanner, never ignored
//! (`tern_testkit::modules`).

#[test]
fn module_graph_is_acyclic() {
    let g = tern_testkit::modules::graph(env!("CARGO_MANIFEST_DIR"));
    tern_testkit::modules::assert_acyclic(&g);
}

#[test]
fn every_crate_checks_its_module_graph() {
    let mut missing = Vec::new();
    for c in tern_testkit::modules::workspace_crates(env!("CARGO_MANIFEST_DIR")) {
        let test = c.join("tests/module_graph.rs");
        let text = std::fs::read_to_string(&test).unwrap_or_default();
        if !text.contains("assert_acyclic(") || text.contains(concat!("#[", "ignore")) {
            missing.push(test.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "these crates do not check their module graph (a test, not ignored, calling \
         tern_testkit::modules::assert_acyclic): {missing:?}"
    );
}
