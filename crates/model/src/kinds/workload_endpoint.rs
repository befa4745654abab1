//! The `WorkloadEndpoint` kind: a pod's network interface (namespaced), written by `ternd` on
//! each CNI ADD.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::kinds::shared::EndpointPort;
use crate::validate::{FieldError, invalid, valid_mac, validate_port_name};

/// A pod's network interface.
pub type WorkloadEndpoint = Document<WorkloadEndpointSpec>;

fn default_orchestrator() -> String {
    "k8s".to_string()
}

/// Spec of a [`WorkloadEndpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadEndpointSpec {
    pub node: String,
    #[serde(default = "default_orchestrator")]
    pub orchestrator: String,
    pub pod: String,
    #[serde(default, rename = "containerID")]
    pub container_id: String,
    /// The interface name inside the pod (`eth0`).
    #[serde(default)]
    pub endpoint: String,
    /// The host-side veth.
    #[serde(default)]
    pub interface_name: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub ip_networks: Vec<String>,
    /// The CNI network name (`k8s-pod-network`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Named container ports of the pod, which policies may reference by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<EndpointPort>,
}

/// Write-time checks of a [`WorkloadEndpoint`].
pub(crate) fn validate_workload_endpoint(w: &WorkloadEndpoint) -> Result<(), FieldError> {
    let s = &w.spec;
    if s.node.is_empty() {
        return Err(invalid("spec.node", "must not be empty"));
    }
    if s.pod.is_empty() {
        return Err(invalid("spec.pod", "must not be empty"));
    }
    for (i, n) in s.ip_networks.iter().enumerate() {
        if n.parse::<IpNet>().is_err() {
            return Err(invalid(
                format!("spec.ipNetworks[{i}]"),
                format!("{n:?} is not a CIDR (expected e.g. 10.244.0.5/32)"),
            ));
        }
    }
    if !s.mac.is_empty() && !valid_mac(&s.mac) {
        return Err(invalid(
            "spec.mac",
            format!("{:?} is not a MAC address", s.mac),
        ));
    }
    for (i, p) in s.ports.iter().enumerate() {
        validate_port_name(&p.name).map_err(|e| invalid(format!("spec.ports[{i}].name"), e))?;
    }
    if s.interface_name.len() > 15 {
        return Err(invalid(
            "spec.interfaceName",
            format!("{:?} is longer than 15 characters", s.interface_name),
        ));
    }
    Ok(())
}
