//! `tern-pki`'s modules import each other in no circle (`tern_testkit::modules`).

#[test]
fn module_graph_is_acyclic() {
    let g = tern_testkit::modules::graph(env!("CARGO_MANIFEST_DIR"));
    tern_testkit::modules::assert_acyclic(&g);
}
