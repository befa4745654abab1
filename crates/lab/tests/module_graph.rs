//! `tern-lab`'s modules import each other in no circle (`tern_testkit::modules`), and the
//! Kubernetes cluster is an add-on on the base lab: `kube` depends on `topology`, never the
//! reverse.

use tern_testkit::modules;

#[test]
fn module_graph_is_acyclic() {
    let g = modules::graph(env!("CARGO_MANIFEST_DIR"));
    modules::assert_acyclic(&g);
}

/// Nothing of the base names `kube`: `topology` calls the cluster only through the hook
/// `addon::Addon`, and `ops` alone hands it `kube::Cluster`.
#[test]
fn the_base_never_names_kube() {
    let g = modules::graph(env!("CARGO_MANIFEST_DIR")).top_level();
    modules::assert_acyclic(&g);
    let naming: Vec<&str> = g
        .edges
        .iter()
        .filter(|(m, to)| to.contains("kube") && !["kube", "ops"].contains(&m.as_str()))
        .map(|(m, _)| m.as_str())
        .collect();
    assert!(
        naming.is_empty(),
        "{naming:?} name kube; only ops may (the base calls it through addon::Addon)\n{}",
        g.render()
    );
}
