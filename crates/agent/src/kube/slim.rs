//! Slim Kubernetes objects: only the fields tern acts on are decoded, and each watched object is
//! turned into its small tern form at once, so the agent never holds full API objects.
//!
//! - Pods decode into [`SlimPod`] (metadata, `spec.nodeName`, `spec.serviceAccountName` and the
//!   containers' ports; serde skips the rest of the document without allocating it), then into
//!   [`PodInfo`].
//! - Namespaces are watched as metadata only and become tern `Namespace` resources (labels).
//! - NetworkPolicies become tern `KubernetesNetworkPolicy` resources, parsed and validated by
//!   `tern-model` exactly as `ternctl apply -f` parses a `networking.k8s.io/v1` document.

use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tern_model::{EndpointPort, Protocol, Resource};

/// A pod with only the fields tern needs (the API server's other fields are skipped by serde).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlimPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SlimPodSpec,
}

/// The part of `Pod.spec` tern reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<SlimContainer>,
}

/// A container's ports (named ones are what policies can reference).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimContainer {
    #[serde(default)]
    pub ports: Vec<SlimPort>,
}

/// One `containers[].ports[]` entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlimPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub container_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// Makes a slim type a `core/v1` resource for kube-rs's typed API (as k8s-openapi does for
/// the full type): its kind, URL segment, scope, and its `metadata` field.
macro_rules! core_v1_resource {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = "v1";
            const GROUP: &'static str = "";
            const KIND: &'static str = $kind;
            const VERSION: &'static str = "v1";
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

core_v1_resource!(SlimPod, "Pod", "pods", k8s_openapi::NamespaceResourceScope);

/// A pod as the datastore's endpoints are derived from it ([`tern_store::kube_pods`]): the
/// cache feed's watch of every Pod of the cluster decodes into this, never the full object.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EndpointPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: tern_store::kube_pods::PodSpec,
    #[serde(default)]
    pub status: tern_store::kube_pods::PodStatus,
}

core_v1_resource!(
    EndpointPod,
    "Pod",
    "pods",
    k8s_openapi::NamespaceResourceScope
);

impl EndpointPod {
    /// The store's slim pod (moved out of this one).
    pub fn into_pod(self) -> tern_store::kube_pods::Pod {
        let m = self.metadata;
        tern_store::kube_pods::Pod {
            metadata: tern_store::kube_pods::PodMeta {
                name: m.name.unwrap_or_default(),
                namespace: m.namespace.unwrap_or_default(),
                uid: m.uid.unwrap_or_default(),
                labels: m.labels.unwrap_or_default(),
                resource_version: m.resource_version.unwrap_or_default(),
            },
            spec: self.spec,
            status: self.status,
        }
    }
}

/// What tern keeps of one pod of this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub service_account: String,
    /// Named container ports, in declaration order, one per name.
    pub ports: Vec<EndpointPort>,
    /// The IPAM annotations only ([`super::annotations::relevant`]).
    pub annotations: BTreeMap<String, String>,
}

impl PodInfo {
    /// The slim form of a pod. Unnamed ports and ports a policy could not reference
    /// (out of range, unknown protocol) are left out with a debug log.
    pub fn from_pod(p: &SlimPod) -> PodInfo {
        let m = &p.metadata;
        let mut ports: Vec<EndpointPort> = Vec::new();
        for c in &p.spec.containers {
            for port in &c.ports {
                let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) else {
                    continue;
                };
                let Ok(number) = u16::try_from(port.container_port) else {
                    log::debug!("pod port {name}: {} is out of range", port.container_port);
                    continue;
                };
                let proto = port.protocol.as_deref().unwrap_or("TCP");
                let Ok(protocol) = serde_json::from_value::<Protocol>(proto.into()) else {
                    log::debug!("pod port {name}: unknown protocol {proto:?}");
                    continue;
                };
                if !ports.iter().any(|q| q.name == name) {
                    ports.push(EndpointPort {
                        name: name.to_string(),
                        protocol,
                        port: number,
                    });
                }
            }
        }
        PodInfo {
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            labels: m.labels.clone().unwrap_or_default(),
            service_account: p.spec.service_account_name.clone().unwrap_or_default(),
            ports,
            annotations: super::annotations::relevant(m.annotations.as_ref()),
        }
    }
}

/// A node with only the fields tern needs: metadata, `spec.podCIDR(s)` and
/// `status.addresses` (conditions, images, capacity and the rest are skipped by serde).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlimNode {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SlimNodeSpec,
    #[serde(default)]
    pub status: SlimNodeStatus,
}

/// The part of `Node.spec` tern reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlimNodeSpec {
    #[serde(default, rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
}

/// The part of `Node.status` tern reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlimNodeStatus {
    #[serde(default)]
    pub addresses: Vec<SlimNodeAddress>,
}

/// One `status.addresses[]` entry (`InternalIP`, `ExternalIP`, `Hostname`, ...).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SlimNodeAddress {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub address: String,
}

core_v1_resource!(SlimNode, "Node", "nodes", k8s_openapi::ClusterResourceScope);

/// What tern keeps of one Kubernetes node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub uid: String,
    /// `InternalIP` and `ExternalIP` addresses, in the API server's order.
    pub addresses: Vec<std::net::IpAddr>,
    /// `spec.podCIDRs` (or the older single `spec.podCIDR`), at most one per family.
    pub pod_cidrs: Vec<ipnet::IpNet>,
    /// True once `metadata.deletionTimestamp` is set (the node is being deleted).
    pub deleting: bool,
}

impl NodeInfo {
    /// The slim form of a node. Addresses and CIDRs that do not parse are left out with a
    /// debug log (the API server validates them; this guards against anything else).
    pub fn from_node(n: &SlimNode) -> NodeInfo {
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut addresses = Vec::new();
        for a in &n.status.addresses {
            if a.kind != "InternalIP" && a.kind != "ExternalIP" {
                continue;
            }
            match a.address.parse() {
                Ok(ip) if !addresses.contains(&ip) => addresses.push(ip),
                Ok(_) => {}
                Err(_) => log::debug!("node {name}: address {:?} is not an IP", a.address),
            }
        }
        let mut cidrs: Vec<&String> = n.spec.pod_cidrs.iter().collect();
        if cidrs.is_empty() {
            cidrs.extend(n.spec.pod_cidr.iter());
        }
        let mut pod_cidrs: Vec<ipnet::IpNet> = Vec::new();
        for c in cidrs {
            match c.parse::<ipnet::IpNet>() {
                Ok(net)
                    if !pod_cidrs
                        .iter()
                        .any(|p| p.addr().is_ipv4() == net.addr().is_ipv4()) =>
                {
                    pod_cidrs.push(net.trunc())
                }
                Ok(_) => log::debug!("node {name}: second podCIDR of one family {c:?} ignored"),
                Err(_) => log::debug!("node {name}: podCIDR {c:?} is not a CIDR"),
            }
        }
        NodeInfo {
            uid: n.metadata.uid.clone().unwrap_or_default(),
            deleting: n.metadata.deletion_timestamp.is_some(),
            name,
            addresses,
            pod_cidrs,
        }
    }
}

/// The tern `Namespace` resource of a Kubernetes namespace (its labels feed namespaceSelectors),
/// by the conversion `ternctl explain` shares ([`tern_model::kubernetes`]).
pub fn namespace_resource(m: &ObjectMeta) -> Result<Resource, String> {
    tern_model::kubernetes::namespace(
        m.name.as_deref().unwrap_or_default(),
        m.labels.as_ref().unwrap_or(&BTreeMap::new()),
    )
}

/// The tern form of a `networking.k8s.io/v1` NetworkPolicy: the same document `ternctl apply`
/// accepts (metadata reduced to name, namespace and labels; `status` dropped), parsed and
/// validated by `tern-model` ([`tern_model::kubernetes`], which `ternctl explain` shares), so
/// semantics are those of the existing compiler.
pub fn network_policy_resource(p: &NetworkPolicy) -> Result<Resource, String> {
    let m = &p.metadata;
    let spec = serde_json::to_value(p.spec.clone().unwrap_or_default())
        .map_err(|e| format!("encoding spec: {e}"))?;
    tern_model::kubernetes::network_policy(
        m.name.as_deref().unwrap_or_default(),
        m.namespace.as_deref().unwrap_or_default(),
        m.labels.as_ref().unwrap_or(&BTreeMap::new()),
        spec,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::port;
    use tern_model::Kind;

    #[test]
    fn pod_decodes_only_what_tern_needs() {
        let doc = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-1", "namespace": "prod", "uid": "u-1",
                "labels": {"app": "web"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
                "annotations": {"big": "x"}
            },
            "spec": {
                "nodeName": "n1", "serviceAccountName": "web-sa",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [
                    {"name": "c", "image": "i", "ports": [
                        {"name": "http", "containerPort": 8080},
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                        {"containerPort": 9000},
                        {"name": "http", "containerPort": 8081}
                    ]},
                    {"name": "d", "image": "i", "ports": [
                        {"name": "bad", "containerPort": 70000}
                    ]}
                ]
            },
            "status": {"phase": "Pending", "podIP": "10.0.0.1"}
        });
        let p: SlimPod = serde_json::from_value(doc).unwrap();
        let i = PodInfo::from_pod(&p);
        assert_eq!(i.namespace, "prod");
        assert_eq!(i.name, "web-1");
        assert_eq!(i.uid, "u-1");
        assert_eq!(i.service_account, "web-sa");
        assert_eq!(i.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(
            i.ports,
            vec![
                port("http", 8080, Protocol::Tcp),
                port("dns", 53, Protocol::Udp)
            ]
        );
    }

    #[test]
    fn node_decodes_addresses_and_pod_cidrs() {
        let doc = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u-n1",
                         "managedFields": [{"manager": "kubelet"}],
                         "deletionTimestamp": "2026-12-01T08:00:00Z"},
            "spec": {"podCIDR": "10.244.1.0/24",
                     "podCIDRs": ["10.244.1.0/24", "fd00:1::/64", "10.9.0.0/24"],
                     "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "198.18.0.11"},
                {"type": "Hostname", "address": "n1"},
                {"type": "ExternalIP", "address": "bad"},
                {"type": "InternalIP", "address": "fd00::11"}
            ], "conditions": [{"type": "Ready", "status": "True"}],
               "images": [{"names": ["x"], "sizeBytes": 1}]}
        });
        let n: SlimNode = serde_json::from_value(doc).unwrap();
        let i = NodeInfo::from_node(&n);
        assert_eq!(i.name, "n1");
        assert_eq!(i.uid, "u-n1");
        assert!(i.deleting);
        assert_eq!(
            i.addresses,
            vec![
                "198.18.0.11".parse::<std::net::IpAddr>().unwrap(),
                "fd00::11".parse().unwrap()
            ]
        );
        assert_eq!(
            i.pod_cidrs,
            vec![
                "10.244.1.0/24".parse::<ipnet::IpNet>().unwrap(),
                "fd00:1::/64".parse().unwrap()
            ]
        );
        // The single-family field of older clusters.
        let n: SlimNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n2"}, "spec": {"podCIDR": "10.244.2.0/24"}
        }))
        .unwrap();
        let i = NodeInfo::from_node(&n);
        assert_eq!(
            i.pod_cidrs,
            vec!["10.244.2.0/24".parse::<ipnet::IpNet>().unwrap()]
        );
        assert!(!i.deleting);
    }

    #[test]
    fn namespace_and_policy_become_tern_resources() {
        let m = ObjectMeta {
            name: Some("prod".into()),
            labels: Some(BTreeMap::from([("team".into(), "red".into())])),
            resource_version: Some("17".into()),
            uid: Some("x".into()),
            ..Default::default()
        };
        let r = namespace_resource(&m).unwrap();
        assert_eq!(r.kind(), Kind::Namespace);
        assert_eq!(
            r.metadata().labels.get("team").map(String::as_str),
            Some("red")
        );

        let np: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-web", "namespace": "prod", "uid": "y",
                         "resourceVersion": "5", "generation": 1,
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                             "ports": [{"port": "http", "protocol": "TCP"},
                                       {"port": 9000, "endPort": 9010}]}],
                "policyTypes": ["Ingress"]
            }
        }))
        .unwrap();
        let r = network_policy_resource(&np).unwrap();
        assert_eq!(r.kind(), Kind::K8sNetworkPolicy);
        assert_eq!(r.namespace(), Some("prod"));
        assert_eq!(r.name(), "allow-web");

        // A policy the model refuses is an error naming the problem, not a silent allow.
        let bad: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bad", "namespace": "prod"},
            "spec": {"podSelector": {},
                     "ingress": [{"from": [{"ipBlock": {"cidr": "not-a-cidr"}}]}]}
        }))
        .unwrap();
        assert!(network_policy_resource(&bad).is_err());
    }
}
