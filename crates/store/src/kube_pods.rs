//! WorkloadEndpoints derived from Pods, on the Kubernetes datastore.
//!
//! On etcd and SQLite every pod interface is a WorkloadEndpoint document that ternd writes at
//! ADD and deletes at DEL. On the Kubernetes datastore that would be a second API write per
//! ADD and per DEL (and a per-pod object of tern's that every agent watches), so the
//! endpoints of the cluster are *derived from the Pods* the API server already has, as
//! Calico's Kubernetes datastore does: `range`, `get` and `watch` under the WorkloadEndpoint
//! prefix read Pods (`/api/v1/pods`) and give each scheduled, running pod with addresses the
//! document ternd would have written for its `eth0`:
//!
//! - name `<node>-k8s-<pod>-eth0` (each part with `-` doubled), namespace the pod's;
//! - labels: the pod's (less any under `tern.dev/`), `tern.dev/namespace`,
//!   `tern.dev/orchestrator: k8s` and `tern.dev/serviceaccount`;
//! - `ipNetworks` from `status.podIPs` (what the runtime reported from tern's ADD result),
//!   `ports` from the containers' named ports, `interfaceName` the host veth's name with the
//!   default prefix (`tern_api::veth_name`), the pod's UID as `tern.dev/pod-uid`.
//!
//! Not derived: host-network pods (no interface of tern's), pods without a node or without
//! addresses yet, and finished pods (`Succeeded`/`Failed`: their addresses may already belong
//! to another pod). `containerID`, `network` and `mac` are not in the Pod; the node's own
//! record of each attachment (its agent's local endpoint store) has them, and
//! `ternctl datastore migrate` fills them from the IPAM block that holds the address.
//!
//! These documents cannot be written: the store refuses, saying to label the Pod instead.

use serde::Deserialize as _;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

use crate::keys;

/// The kind whose keys are derived.
pub const KIND: &str = "WorkloadEndpoint";
/// Prefix of tern's own labels on an endpoint; a pod's labels may not set them.
const TERN_LABEL_PREFIX: &str = "tern.dev/";
/// Label with the endpoint's Kubernetes namespace (`crate::endpoints::NAMESPACE_LABEL` in the
/// agent).
pub const NAMESPACE_LABEL: &str = "tern.dev/namespace";
/// Label naming the orchestrator.
pub const ORCHESTRATOR_LABEL: &str = "tern.dev/orchestrator";
/// Label with the pod's service account.
pub const SERVICE_ACCOUNT_LABEL: &str = "tern.dev/serviceaccount";
/// Annotation with the pod's UID.
pub const POD_UID_ANNOTATION: &str = "tern.dev/pod-uid";

/// The endpoint name of a pod's interface on `node`, as the agent builds it.
pub fn endpoint_name(node: &str, pod: &str, ifname: &str) -> String {
    let esc = |s: &str| s.replace('-', "--");
    format!("{}-k8s-{}-{}", esc(node), esc(pod), esc(ifname))
}

/// A Pod with only the fields an endpoint is derived from: serde skips the rest of the API
/// server's document (managed fields, conditions, container statuses, the spec's volumes)
/// without keeping it, so a list of 10,000 Pods is never held as JSON values.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct Pod {
    #[serde(deserialize_with = "null_default")]
    pub metadata: PodMeta,
    #[serde(deserialize_with = "null_default")]
    pub spec: PodSpec,
    #[serde(deserialize_with = "null_default")]
    pub status: PodStatus,
}

/// The Pod's `metadata`, as much as tern reads.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodMeta {
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    #[serde(deserialize_with = "null_default")]
    pub namespace: String,
    #[serde(deserialize_with = "null_default")]
    pub uid: String,
    #[serde(deserialize_with = "null_default")]
    pub labels: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_default")]
    pub resource_version: String,
}

/// The Pod's `spec`, as much as tern reads.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(deserialize_with = "null_default")]
    pub node_name: String,
    #[serde(deserialize_with = "null_default")]
    pub host_network: bool,
    #[serde(deserialize_with = "null_default")]
    pub service_account_name: String,
    #[serde(deserialize_with = "null_default")]
    pub containers: Vec<Container>,
}

/// A container's ports.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct Container {
    #[serde(deserialize_with = "null_default")]
    pub ports: Vec<ContainerPort>,
}

/// One `containers[].ports[]` entry.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(deserialize_with = "null_default")]
    pub name: String,
    #[serde(deserialize_with = "null_default")]
    pub container_port: i64,
    #[serde(deserialize_with = "null_default")]
    pub protocol: String,
}

/// The Pod's `status`, as much as tern reads.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(deserialize_with = "null_default")]
    pub phase: String,
    #[serde(rename = "podIP", deserialize_with = "null_default")]
    pub pod_ip: String,
    #[serde(rename = "podIPs", deserialize_with = "null_default")]
    pub pod_ips: Vec<PodIp>,
}

/// One `status.podIPs[]` entry.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct PodIp {
    #[serde(deserialize_with = "null_default")]
    pub ip: String,
}

/// A field the API server may send as `null` reads as its default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    use serde::Deserialize;
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl Pod {
    /// The slim form of a Pod document; an error when a field tern reads has the wrong type.
    pub fn from_value(v: &Value) -> Result<Pod, serde_json::Error> {
        Pod::deserialize(v)
    }
}

/// What one Pod says about its endpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Derived {
    /// The pod's endpoint: its key and document.
    Endpoint { key: String, doc: Value },
    /// The pod has no endpoint now; `key` is the one it would have (when it has a node), so a
    /// watcher can drop an endpoint it derived before.
    Nothing { key: Option<String> },
}

impl Derived {
    /// The key, whichever the case.
    pub fn key(&self) -> Option<&str> {
        match self {
            Derived::Endpoint { key, .. } => Some(key),
            Derived::Nothing { key } => key.as_deref(),
        }
    }
}

/// The endpoint of one Pod.
pub fn derive(pod: &Pod) -> Derived {
    let (ns, name, node) = (
        pod.metadata.namespace.as_str(),
        pod.metadata.name.as_str(),
        pod.spec.node_name.as_str(),
    );
    if ns.is_empty() || name.is_empty() || node.is_empty() {
        return Derived::Nothing { key: None };
    }
    let ep_name = endpoint_name(node, name, "eth0");
    let key = keys::namespaced_resource(KIND, ns, &ep_name);
    if pod.spec.host_network || matches!(pod.status.phase.as_str(), "Succeeded" | "Failed") {
        return Derived::Nothing { key: Some(key) };
    }
    let ips = pod_ips(pod);
    if ips.is_empty() {
        return Derived::Nothing { key: Some(key) };
    }
    let sa = pod.spec.service_account_name.as_str();
    let mut labels: BTreeMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with(TERN_LABEL_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(NAMESPACE_LABEL.into(), ns.into());
    labels.insert(ORCHESTRATOR_LABEL.into(), "k8s".into());
    if !sa.is_empty() {
        labels.insert(SERVICE_ACCOUNT_LABEL.into(), sa.into());
    }
    let mut annotations = Map::new();
    if !pod.metadata.uid.is_empty() {
        annotations.insert(POD_UID_ANNOTATION.into(), pod.metadata.uid.clone().into());
    }
    let mut spec = json!({
        "node": node,
        "orchestrator": "k8s",
        "pod": name,
        "endpoint": "eth0",
        "interfaceName": tern_api::veth_name::host_veth_name(
            tern_api::veth_name::DEFAULT_VETH_PREFIX,
            Some((ns, name)),
            "",
        ),
        "ipNetworks": ips,
    });
    if !sa.is_empty() {
        spec["serviceAccountName"] = sa.into();
    }
    let ports = named_ports(pod);
    if !ports.is_empty() {
        spec["ports"] = Value::Array(ports);
    }
    let doc = json!({
        "apiVersion": "tern.dev/v1",
        "kind": KIND,
        "metadata": {
            "name": ep_name,
            "namespace": ns,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    });
    Derived::Endpoint { key, doc }
}

/// `status.podIPs` (else `status.podIP`) as host CIDRs, each address once.
fn pod_ips(pod: &Pod) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let listed = pod.status.pod_ips.iter().map(|p| p.ip.as_str());
    for ip in listed.chain([pod.status.pod_ip.as_str()]) {
        let Ok(addr) = ip.parse::<std::net::IpAddr>() else {
            continue;
        };
        let cidr = match addr {
            std::net::IpAddr::V4(_) => format!("{addr}/32"),
            std::net::IpAddr::V6(_) => format!("{addr}/128"),
        };
        if !out.contains(&cidr) {
            out.push(cidr);
        }
    }
    out
}

/// The containers' named ports a policy can reference (`spec.containers[].ports[]` with a
/// name, a port in 1..=65535 and TCP, UDP or SCTP), the first of each name, in order.
fn named_ports(pod: &Pod) -> Vec<Value> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for p in pod.spec.containers.iter().flat_map(|c| &c.ports) {
        let name = p.name.as_str();
        if !(1..=65535).contains(&p.container_port) {
            continue;
        }
        let proto = match p.protocol.as_str() {
            "" => "TCP",
            s @ ("TCP" | "UDP" | "SCTP") => s,
            _ => continue,
        };
        if name.is_empty() || seen.contains(&name) {
            continue;
        }
        seen.push(name);
        out.push(json!({"name": name, "protocol": proto, "port": p.container_port}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slim(v: &Value) -> Pod {
        Pod::from_value(v).unwrap()
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "u-1",
                "labels": {"app": "web", "tern.dev/namespace": "spoofed"}},
            "spec": {"nodeName": "node-a", "serviceAccountName": "sa",
                "containers": [
                    {"ports": [{"name": "http", "containerPort": 8080},
                               {"containerPort": 9000},
                               {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                    {"ports": [{"name": "http", "containerPort": 81},
                               {"name": "bad", "containerPort": 70000}]}]},
            "status": {"phase": "Running", "podIP": "10.244.0.5",
                "podIPs": [{"ip": "10.244.0.5"}, {"ip": "fd00::5"}]}
        })
    }

    #[test]
    fn a_running_pod_is_an_endpoint() {
        let Derived::Endpoint { key, doc } = derive(&slim(&pod())) else {
            panic!("no endpoint");
        };
        assert_eq!(
            key,
            "/tern/v1/resources/workloadendpoint/prod/node--a-k8s-web--1-eth0"
        );
        assert_eq!(doc["metadata"]["name"], "node--a-k8s-web--1-eth0");
        assert_eq!(
            doc["metadata"]["labels"],
            json!({"app": "web", "tern.dev/namespace": "prod",
                "tern.dev/orchestrator": "k8s", "tern.dev/serviceaccount": "sa"})
        );
        assert_eq!(doc["metadata"]["annotations"]["tern.dev/pod-uid"], "u-1");
        assert_eq!(
            doc["spec"]["ipNetworks"],
            json!(["10.244.0.5/32", "fd00::5/128"])
        );
        assert_eq!(
            doc["spec"]["ports"],
            json!([{"name": "http", "protocol": "TCP", "port": 8080},
                   {"name": "dns", "protocol": "UDP", "port": 53}])
        );
        // printf prod.web-1 | sha1sum: the name ternd gives the pod's host veth.
        assert_eq!(
            doc["spec"]["interfaceName"],
            tern_api::veth_name::host_veth_name("tern", Some(("prod", "web-1")), "")
        );
    }

    #[test]
    fn pods_without_an_interface_of_terns_are_not() {
        let mut p = pod();
        p["spec"]["hostNetwork"] = true.into();
        assert!(matches!(
            derive(&slim(&p)),
            Derived::Nothing { key: Some(_) }
        ));
        for phase in ["Succeeded", "Failed"] {
            let mut p = pod();
            p["status"]["phase"] = phase.into();
            assert!(matches!(
                derive(&slim(&p)),
                Derived::Nothing { key: Some(_) }
            ));
        }
        let mut p = pod();
        p["status"] = json!({"phase": "Pending"});
        assert!(matches!(
            derive(&slim(&p)),
            Derived::Nothing { key: Some(_) }
        ));
        let mut p = pod();
        p["spec"]["nodeName"] = Value::Null;
        assert_eq!(derive(&slim(&p)), Derived::Nothing { key: None });
    }
}
