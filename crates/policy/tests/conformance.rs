//! Checks the reference evaluator against the upstream Kubernetes NetworkPolicy truth tables in
//! `crates/testkit/data/netpol_cases.yaml` (3 namespaces x 3 pods, every case, step,
//! protocol and port; the diagonal is excluded as upstream does).

mod netpol_cluster;

#[test]
fn evaluator_matches_upstream_truth_tables() {
    let mut failures = Vec::new();
    let cells = netpol_cluster::for_each_cell(|c| {
        let got = c.set.allowed(&c.flow);
        if got != c.want {
            failures.push(format!("{}: want {}, got {got}", c.name(), c.want));
        }
    });
    assert!(cells > 10_000, "only {cells} cells compared");
    assert!(
        failures.is_empty(),
        "{} of {cells} cells differ:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}
