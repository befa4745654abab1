//! Kubernetes' own objects as tern resources, the one conversion every reader shares: the
//! agent's watches on the Kubernetes datastore (`tern_agent::kube`) and `ternctl explain`,
//! which reads the same objects from the API server, so both judge the same policy state.
//!
//! - a namespace becomes a tern `Namespace` with its labels (which feed namespaceSelectors);
//! - a `networking.k8s.io/v1` NetworkPolicy becomes a tern `KubernetesNetworkPolicy`: the
//!   document `ternctl apply` accepts (metadata reduced to name, namespace and labels;
//!   `status` dropped), parsed and validated exactly as `ternctl apply -f` parses it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::registry::Resource;

/// The tern `Namespace` of Kubernetes namespace `name` with `labels`.
pub fn namespace(name: &str, labels: &BTreeMap<String, String>) -> Result<Resource, String> {
    parse_validated(&json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }))
}

/// The tern form of NetworkPolicy `namespace/name` with `labels` and `spec` (as the API
/// server serves it; `null` is an empty spec).
pub fn network_policy(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    spec: Value,
) -> Result<Resource, String> {
    let spec = if spec.is_null() { json!({}) } else { spec };
    parse_validated(&json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
    }))
}

/// `metadata.name`, `metadata.namespace` (empty when absent) and `metadata.labels` of an
/// object as the API server serves it.
fn meta(obj: &Value) -> Result<(String, String, BTreeMap<String, String>), String> {
    let m = &obj["metadata"];
    let name = m["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or("metadata.name: missing")?;
    let labels = match &m["labels"] {
        Value::Null => BTreeMap::new(),
        l => serde_json::from_value(l.clone())
            .map_err(|e| format!("{name}: metadata.labels: {e}"))?,
    };
    let ns = m["namespace"].as_str().unwrap_or_default();
    Ok((name.to_string(), ns.to_string(), labels))
}

/// [`namespace`] of a `v1` Namespace object (JSON, as listed from `/api/v1/namespaces`).
pub fn namespace_object(obj: &Value) -> Result<Resource, String> {
    let (name, _, labels) = meta(obj).map_err(|e| format!("Namespace {e}"))?;
    namespace(&name, &labels).map_err(|e| format!("Namespace {name}: {e}"))
}

/// [`network_policy`] of a NetworkPolicy object (JSON, as listed from
/// `/apis/networking.k8s.io/v1/networkpolicies`).
pub fn network_policy_object(obj: &Value) -> Result<Resource, String> {
    let (name, ns, labels) = meta(obj).map_err(|e| format!("NetworkPolicy {e}"))?;
    network_policy(&name, &ns, &labels, obj["spec"].clone())
        .map_err(|e| format!("NetworkPolicy {ns}/{name}: {e}"))
}

fn parse_validated(doc: &Value) -> Result<Resource, String> {
    let bytes = serde_json::to_vec(doc).map_err(|e| e.to_string())?;
    let mut r = Resource::from_json(&bytes)?;
    r.fill_defaults();
    r.validate().map_err(|e| e.to_string())?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Kind;

    /// A namespace keeps its labels; a policy its name, namespace and spec, whatever else the
    /// API server serves beside them.
    #[test]
    fn served_objects_become_resources() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "prod", "uid": "u", "resourceVersion": "7",
                         "labels": {"team": "red"}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        let r = namespace_object(&ns).unwrap();
        assert_eq!(r.kind(), Kind::Namespace);
        assert_eq!(r.name(), "prod");
        assert_eq!(
            r.metadata().labels.get("team").map(String::as_str),
            Some("red")
        );
        let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "web", "namespace": "prod", "generation": 2,
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                     "ingress": [{"ports": [{"port": 80, "protocol": "TCP"}]}],
                     "policyTypes": ["Ingress"]}});
        let r = network_policy_object(&np).unwrap();
        assert_eq!(r.kind(), Kind::K8sNetworkPolicy);
        assert_eq!((r.namespace(), r.name()), (Some("prod"), "web"));
        // The same object through the field-wise entry the agent uses.
        let again = network_policy("web", "prod", &BTreeMap::new(), np["spec"].clone()).unwrap();
        assert_eq!(again, r);
    }

    /// What the model refuses is an error naming the object, never a silent allow.
    #[test]
    fn bad_objects_are_named() {
        let bad = json!({"metadata": {"name": "bad", "namespace": "prod"},
            "spec": {"podSelector": {},
                     "ingress": [{"from": [{"ipBlock": {"cidr": "not-a-cidr"}}]}]}});
        let e = network_policy_object(&bad).unwrap_err();
        assert!(e.starts_with("NetworkPolicy prod/bad: "), "{e}");
        let e = namespace_object(&json!({"metadata": {}})).unwrap_err();
        assert_eq!(e, "Namespace metadata.name: missing");
        let e =
            namespace_object(&json!({"metadata": {"name": "x", "labels": {"a": 1}}})).unwrap_err();
        assert!(e.contains("metadata.labels"), "{e}");
    }
}
