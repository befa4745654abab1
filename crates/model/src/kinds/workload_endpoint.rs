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

/// An `ipNetworks` entry that is not a CIDR, named with its record. Validation refuses these
/// at write, so only a record written around it (an older or foreign writer) has one; a
/// reader reports it rather than dropping it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("WorkloadEndpoint {endpoint}: ipNetworks entry {value:?} is not a CIDR")]
pub struct BadIpNetwork {
    /// `<namespace>/<name>` of the record.
    pub endpoint: String,
    /// The entry as stored.
    pub value: String,
}

/// The `ipNetworks` of a record, parsed where it is read: the networks, and each entry that
/// is not one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpNetworks {
    pub nets: Vec<IpNet>,
    pub bad: Vec<BadIpNetwork>,
}

/// One `ipNetworks` entry (`10.244.0.5/32`), the one parser of the field.
fn parse_ip_network(entry: &str) -> Option<IpNet> {
    entry.parse().ok()
}

/// Parses the `ipNetworks` entries of the record `endpoint` (`<namespace>/<name>`): for
/// readers that decode only part of a record (the IPAM audit); [`WorkloadEndpoint`]s have
/// [`Document::ip_networks`].
pub fn parse_ip_networks(endpoint: &str, entries: &[String]) -> IpNetworks {
    let mut out = IpNetworks::default();
    for e in entries {
        match parse_ip_network(e) {
            Some(n) => out.nets.push(n),
            None => out.bad.push(BadIpNetwork {
                endpoint: endpoint.to_string(),
                value: e.clone(),
            }),
        }
    }
    out
}

impl Document<WorkloadEndpointSpec> {
    /// `<namespace>/<name>` of the endpoint.
    pub fn label(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name
        )
    }

    /// The endpoint's addresses as networks; an entry that is not a CIDR comes back in
    /// [`IpNetworks::bad`], named with the record, for the reader to report.
    pub fn ip_networks(&self) -> IpNetworks {
        parse_ip_networks(&self.label(), &self.spec.ip_networks)
    }
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
        if parse_ip_network(n).is_none() {
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
