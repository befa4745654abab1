//! tern's typed resources: Kubernetes-style documents (`apiVersion: tern.dev/v1`, `kind`,
//! `metadata`, `spec`) with Calico v3 field names, their YAML/JSON parsing with precise error
//! locations, validation on write, and store I/O helpers.
//!
//! Modules, in layers (each imports only the layers above it; `tests/module_graph.rs` checks
//! that the graph has no cycle):
//!
//! - leaves: [`error`] ([`ModelError`]), [`limits`] (every bound on input, listed with where it
//!   is enforced in `docs/limits.md`), [`document`] ([`Document`], [`ObjectMeta`]),
//!   [`selector`], [`validate`] (shared checks: DNS names, labels, CIDRs, port names);
//! - [`kinds`]: one module per kind with its spec, defaults and checks;
//! - [`registry`]: the one table of kinds, generating [`Kind`], [`Resource`] and [`Spec`];
//! - generic code over the table: [`mod@resource`] ([`Resource`]'s methods), [`parse`] (YAML/JSON
//!   streams), [`storage`] (read/write over a [`tern_store::Store`]), [`kubernetes`]
//!   (Kubernetes' own namespaces and NetworkPolicies as tern resources, for the agent and
//!   `ternctl explain` alike).
//!
//! This file only declares and re-exports; every public item is reachable at the crate root.

#![forbid(unsafe_code)]

pub mod defaults;
pub mod document;
pub mod error;
pub mod kinds;
pub mod kubernetes;
pub mod limits;
pub mod mac;
pub mod parse;
pub mod registry;
pub mod resource;
pub mod selector;
pub mod storage;
pub mod validate;

pub use document::{API_VERSION, Document, ObjectMeta};
pub use error::ModelError;
pub use kinds::bgp::{
    AcceptPrefix, BgpConfiguration, BgpConfigurationSpec, BgpPeer, BgpPeerSpec, DEFAULT_AS_NUMBER,
    DEFAULT_BGP_CONFIGURATION, DEFAULT_BGP_PORT, MAX_ACCEPT_PREFIXES,
};
pub use kinds::ip_reservation::{IpReservation, IpReservationSpec};
pub use kinds::ipam_config::{IpamConfig, IpamConfigSpec};
pub use kinds::ippool::{AllowedUse, EncapMode, IpPool, IpPoolSpec, ip_pool_overlaps};
pub use kinds::k8s_policy::{
    IpBlock, K8S_NETWORKING_API_VERSION, K8sEgressRule, K8sIngressRule, K8sNetworkPolicy,
    K8sNetworkPolicySpec, K8sPeer, K8sPort, K8sProtocol, LabelSelector, LabelSelectorOperator,
    LabelSelectorRequirement, validate_k8s_spec,
};
pub use kinds::namespace::{Namespace, NamespaceSpec};
pub use kinds::node::{Node, NodeAddress, NodeBgpSpec, NodeSpec};
pub use kinds::policy::{
    Action, EntityRule, GlobalNetworkPolicy, GlobalNetworkPolicySpec, IcmpFields, NetworkPolicy,
    NetworkPolicySpec, Rule, validate_tern_spec,
};
pub use kinds::shared::{EndpointPort, IntOrString, PolicyType, Port, Protocol};
pub use kinds::staged::{
    StagedAction, StagedGlobalNetworkPolicy, StagedGlobalNetworkPolicySpec,
    StagedKubernetesNetworkPolicy, StagedKubernetesNetworkPolicySpec, StagedNetworkPolicy,
    StagedNetworkPolicySpec, validate_staged_k8s_spec, validate_staged_spec,
};
pub use kinds::workload_endpoint::{
    BadIpNetwork, IpNetworks, WorkloadEndpoint, WorkloadEndpointSpec, parse_ip_networks,
};
pub use mac::{BadMac, MacAddr};
pub use parse::{parse_documents, parse_stream};
pub use registry::{Kind, PLANNED_KINDS, Resource, Spec};
pub use selector::{Selector, SelectorError};
pub use storage::{
    delete_resource, get_resource, list_resources, list_resources_skipping, list_resources_warn,
    put_resource, resource_key,
};
pub use validate::{
    validate_dns1123_subdomain, validate_label_key, validate_label_value, validate_port_name,
};
