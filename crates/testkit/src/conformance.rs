//! The NetworkPolicy truth tables three test suites replay (the policy evaluator and compiler,
//! the namespace lab through `ternctl apply`, the Kubernetes lab through `kubectl`):
//! `data/netpol_cases.yaml`, upstream's e2e cases (`test/e2e/network/netpol`) and cyclonus's
//! over the x/y/z model, every expected reachability matrix written out. The file is compiled
//! into this crate, so no test reads anything outside the repository.

use std::collections::BTreeMap;

use serde_norway::Value;

/// The text of `data/netpol_cases.yaml`.
pub const NETPOL_CASES: &str = include_str!("../data/netpol_cases.yaml");

/// The truth tables, parsed; panics naming the file when it is malformed.
pub fn netpol_cases() -> Value {
    serde_norway::from_str(NETPOL_CASES)
        .unwrap_or_else(|e| panic!("crates/testkit/data/netpol_cases.yaml: {e}"))
}

/// A case file's `labels:` mapping as a map (empty when absent); every key and value is a string.
pub fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().expect("a label key is a string").to_string(),
                        v.as_str().expect("a label value is a string").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The model's `matrix_columns` (`ns/pod`, the order of every expected matrix's rows and
/// columns).
pub fn matrix_columns(model: &Value) -> Vec<String> {
    model["matrix_columns"]
        .as_sequence()
        .expect("the model has matrix_columns")
        .iter()
        .map(|c| c.as_str().expect("a column is a string").to_string())
        .collect()
}

/// The model's `container_ports` in the shape of a WorkloadEndpoint's `spec.ports`
/// (`[{name, protocol, port}]`, the protocol as written: `TCP`, `UDP`, `SCTP`), for
/// `serde_json::from_value::<Vec<tern_model::EndpointPort>>`.
pub fn endpoint_ports(model: &Value) -> serde_json::Value {
    model["container_ports"]
        .as_sequence()
        .expect("the model has container_ports")
        .iter()
        .map(|p| {
            serde_json::json!({
                "name": p["name"].as_str().expect("a port's name"),
                "protocol": p["protocol"].as_str().expect("a port's protocol"),
                "port": p["containerPort"].as_u64().expect("containerPort"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_of_a_mapping_and_of_nothing() {
        let v: serde_norway::Value = serde_norway::from_str("{app: web, tier: \"1\"}").unwrap();
        let l = super::labels(&v);
        assert_eq!(l.len(), 2);
        assert_eq!(l["tier"], "1");
        assert!(super::labels(&serde_norway::Value::Null).is_empty());
    }

    #[test]
    fn the_cases_parse_and_every_case_has_steps() {
        let doc = super::netpol_cases();
        let cases = doc["cases"].as_sequence().expect("cases: a sequence");
        assert!(cases.len() > 20, "{} cases", cases.len());
        for c in cases {
            assert!(
                c["steps"].as_sequence().is_some_and(|s| !s.is_empty()),
                "a case without steps: {:?}",
                c.get("name")
            );
        }
        assert_eq!(super::matrix_columns(&doc["model"]).len(), 9);
    }
}
