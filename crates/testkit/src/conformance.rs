//! The project's shared conformance material (`../shared/conformance/` beside the repository):
//! the NetworkPolicy truth tables three test suites replay (the policy evaluator and compiler,
//! the namespace lab through `ternctl apply`, the Kubernetes lab through `kubectl`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_norway::Value;

/// Where the shared folder is: `$TERN_SHARED_DIR`, else `shared/` beside the repository
/// (the layout of the project and of CI's clone), else `/work/shared`.
pub fn shared_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TERN_SHARED_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // crates/testkit → the repository → its parent.
    let beside = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    if beside.join("conformance").is_dir() {
        return beside;
    }
    PathBuf::from("/work/shared")
}

/// The path of `netpol_cases.yaml` (upstream's NetworkPolicy cases over the x/y/z model).
pub fn netpol_cases_path() -> PathBuf {
    shared_dir().join("conformance/netpol_cases.yaml")
}

/// `netpol_cases.yaml`, parsed; panics naming the file when it is missing or malformed (the
/// conformance suites cannot run without it, and a silent skip would hide that).
pub fn netpol_cases() -> Value {
    let p = netpol_cases_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (set TERN_SHARED_DIR to the shared folder)",
            p.display()
        )
    });
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
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
    fn the_cases_file_is_found() {
        let p = super::netpol_cases_path();
        assert!(p.is_file(), "{} is missing", p.display());
        assert!(
            super::netpol_cases()["cases"]
                .as_sequence()
                .is_some_and(|c| !c.is_empty())
        );
    }
}
