//! Resource types. Field names follow Calico's `projectcalico.org/v3` API (camelCase), so users
//! can carry their manifests over by changing `apiVersion`.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{API_VERSION, ModelError};

/// The kinds of resource tern stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    IpPool,
    IpamConfig,
    Node,
    WorkloadEndpoint,
    IpReservation,
    /// tern's namespaced NetworkPolicy (`tern.dev/v1`).
    NetworkPolicy,
    /// tern's cluster-scoped GlobalNetworkPolicy.
    GlobalNetworkPolicy,
    /// A Kubernetes `networking.k8s.io/v1` NetworkPolicy (document kind `NetworkPolicy`).
    K8sNetworkPolicy,
    /// A namespace and its labels.
    Namespace,
    /// Cluster-wide BGP settings.
    BgpConfiguration,
    /// An explicit BGP peering.
    BgpPeer,
}

/// Kinds that belong to tern's API but are not implemented yet; parsing them fails with a
/// message saying so rather than "unknown kind".
pub const PLANNED_KINDS: &[&str] = &["AgentConfiguration"];

impl Kind {
    /// Every supported kind.
    pub const ALL: [Kind; 11] = [
        Kind::IpPool,
        Kind::IpamConfig,
        Kind::Node,
        Kind::WorkloadEndpoint,
        Kind::IpReservation,
        Kind::NetworkPolicy,
        Kind::GlobalNetworkPolicy,
        Kind::K8sNetworkPolicy,
        Kind::Namespace,
        Kind::BgpConfiguration,
        Kind::BgpPeer,
    ];

    /// The kind's unique name (the `kind:` string of documents, except for Kubernetes
    /// NetworkPolicies, whose documents say `NetworkPolicy`; see [`Kind::document_kind`]).
    /// Store keys use this name, so the two NetworkPolicy flavours never collide.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::IpPool => "IPPool",
            Kind::IpamConfig => "IPAMConfig",
            Kind::Node => "Node",
            Kind::WorkloadEndpoint => "WorkloadEndpoint",
            Kind::IpReservation => "IPReservation",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::GlobalNetworkPolicy => "GlobalNetworkPolicy",
            Kind::K8sNetworkPolicy => "KubernetesNetworkPolicy",
            Kind::Namespace => "Namespace",
            Kind::BgpConfiguration => "BGPConfiguration",
            Kind::BgpPeer => "BGPPeer",
        }
    }

    /// The `kind:` string written in documents of this kind.
    pub fn document_kind(self) -> &'static str {
        match self {
            Kind::K8sNetworkPolicy => "NetworkPolicy",
            k => k.as_str(),
        }
    }

    /// The `apiVersion` written in documents of this kind.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::K8sNetworkPolicy => crate::policy::K8S_NETWORKING_API_VERSION,
            _ => API_VERSION,
        }
    }

    /// Whether resources of this kind live in a Kubernetes namespace.
    pub fn namespaced(self) -> bool {
        matches!(
            self,
            Kind::WorkloadEndpoint | Kind::NetworkPolicy | Kind::K8sNetworkPolicy
        )
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    /// Accepts the kind as written in documents, case-insensitively, and the CLI's plural and
    /// short forms (`ippools`, `wep`), as calicoctl does.
    fn from_str(s: &str) -> Result<Kind, String> {
        let k = s.to_ascii_lowercase();
        Ok(match k.as_str() {
            "ippool" | "ippools" | "pool" | "pools" => Kind::IpPool,
            "ipamconfig" | "ipamconfigs" | "ipamconfiguration" => Kind::IpamConfig,
            "node" | "nodes" | "no" => Kind::Node,
            "workloadendpoint" | "workloadendpoints" | "wep" | "weps" => Kind::WorkloadEndpoint,
            "ipreservation" | "ipreservations" => Kind::IpReservation,
            "networkpolicy" | "networkpolicies" | "netpol" | "np" => Kind::NetworkPolicy,
            "globalnetworkpolicy" | "globalnetworkpolicies" | "gnp" => Kind::GlobalNetworkPolicy,
            "kubernetesnetworkpolicy" | "kubernetesnetworkpolicies" | "knp" => {
                Kind::K8sNetworkPolicy
            }
            "namespace" | "namespaces" | "ns" => Kind::Namespace,
            "bgpconfiguration" | "bgpconfigurations" | "bgpconfig" | "bgpconfigs" => {
                Kind::BgpConfiguration
            }
            "bgppeer" | "bgppeers" => Kind::BgpPeer,
            _ => {
                if let Some(p) = PLANNED_KINDS.iter().find(|p| p.eq_ignore_ascii_case(s)) {
                    return Err(format!("kind {p} is not supported yet"));
                }
                let all: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
                return Err(format!(
                    "unknown kind {s:?}; expected one of {}",
                    all.join(", ")
                ));
            }
        })
    }
}

/// Standard object metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The store's `mod_revision` of the resource when read; on write, a precondition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
}

/// The spec of one kind: ties the Rust type to its `kind:` string and its checks.
pub trait Spec:
    Serialize + DeserializeOwned + Clone + Debug + PartialEq + Send + Sync + 'static
{
    /// The kind this spec belongs to.
    const KIND: Kind;
    /// The `apiVersion` of documents of this kind.
    const API_VERSION: &'static str = API_VERSION;
    /// Fills defaults that depend on other fields (e.g. block size by address family).
    fn fill_defaults(&mut self) {}
}

/// A Kubernetes-style document with a typed spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    bound(deserialize = "S: DeserializeOwned")
)]
pub struct Document<S> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: S,
}

impl<S: Spec> Document<S> {
    /// A document of `S`'s kind with the given name and spec, defaults filled.
    pub fn new(name: impl Into<String>, mut spec: S) -> Document<S> {
        spec.fill_defaults();
        Document {
            api_version: S::API_VERSION.to_string(),
            kind: S::KIND.document_kind().to_string(),
            metadata: ObjectMeta {
                name: name.into(),
                ..ObjectMeta::default()
            },
            spec,
        }
    }
}

/// An IP pool.
pub type IpPool = Document<IpPoolSpec>;
/// The cluster IPAM configuration (one, named `default`).
pub type IpamConfig = Document<IpamConfigSpec>;
/// A node of the cluster.
pub type Node = Document<NodeSpec>;
/// A pod's network interface.
pub type WorkloadEndpoint = Document<WorkloadEndpointSpec>;
/// Addresses excluded from automatic assignment (cluster-scoped).
pub type IpReservation = Document<IpReservationSpec>;

/// When a pool's traffic is encapsulated between nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EncapMode {
    Always,
    CrossSubnet,
    #[default]
    Never,
}

/// What addresses of a pool may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
}

fn default_allowed_uses() -> Vec<AllowedUse> {
    vec![AllowedUse::Workload, AllowedUse::Tunnel]
}

fn default_node_selector() -> String {
    "all()".to_string()
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Spec of an [`IpPool`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpPoolSpec {
    pub cidr: String,
    /// Prefix length of the pool's blocks; 0 in a document means "family default" and is
    /// replaced by 26 (IPv4) or 122 (IPv6) when parsed.
    #[serde(default)]
    pub block_size: u8,
    #[serde(default)]
    pub vxlan_mode: EncapMode,
    #[serde(default)]
    pub ipip_mode: EncapMode,
    #[serde(default, skip_serializing_if = "is_false")]
    pub nat_outgoing: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disabled: bool,
    #[serde(default = "default_node_selector")]
    pub node_selector: String,
    #[serde(default = "default_allowed_uses")]
    pub allowed_uses: Vec<AllowedUse>,
}

impl IpPoolSpec {
    /// A pool over `cidr` with every other field at its default.
    pub fn new(cidr: impl Into<String>) -> IpPoolSpec {
        let mut s = IpPoolSpec {
            cidr: cidr.into(),
            block_size: 0,
            vxlan_mode: EncapMode::Never,
            ipip_mode: EncapMode::Never,
            nat_outgoing: false,
            disabled: false,
            node_selector: default_node_selector(),
            allowed_uses: default_allowed_uses(),
        };
        s.fill_defaults();
        s
    }

    /// The pool's network, if `cidr` parses.
    pub fn net(&self) -> Option<ipnet::IpNet> {
        self.cidr.parse().ok()
    }
}

impl Spec for IpPoolSpec {
    const KIND: Kind = Kind::IpPool;
    fn fill_defaults(&mut self) {
        if self.block_size == 0 {
            self.block_size = match self.net() {
                Some(ipnet::IpNet::V6(_)) => 122,
                _ => 26,
            };
        }
    }
}

fn default_max_blocks() -> u32 {
    20
}

/// Spec of the [`IpamConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpamConfigSpec {
    /// When true, a node never borrows addresses from blocks affine to other nodes.
    #[serde(default)]
    pub strict_affinity: bool,
    /// Maximum blocks one node may claim; 0 = unlimited.
    #[serde(default = "default_max_blocks")]
    pub max_blocks_per_host: u32,
    /// A released address is not handed out again for this many seconds (0 = immediately;
    /// free addresses are reused oldest-first either way).
    #[serde(default)]
    pub release_cooldown_seconds: u64,
    /// An empty block stays affine to its node for at least this long before it may be
    /// released (never the node's last block).
    #[serde(default = "default_empty_block_grace")]
    pub empty_block_grace_seconds: u64,
}

fn default_empty_block_grace() -> u64 {
    300
}

impl Default for IpamConfigSpec {
    fn default() -> Self {
        IpamConfigSpec {
            strict_affinity: false,
            max_blocks_per_host: default_max_blocks(),
            release_cooldown_seconds: 0,
            empty_block_grace_seconds: default_empty_block_grace(),
        }
    }
}

/// Spec of an [`IpReservation`]: CIDRs (or single addresses) that automatic assignment never
/// hands out. An explicitly requested address (`assign_ip`) may still be reserved, as in Calico.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpReservationSpec {
    #[serde(rename = "reservedCIDRs")]
    pub reserved_cidrs: Vec<String>,
}

impl IpReservationSpec {
    /// The reserved networks that parse (a bare address counts as a host route).
    pub fn nets(&self) -> Vec<ipnet::IpNet> {
        self.reserved_cidrs
            .iter()
            .filter_map(|c| {
                c.parse::<ipnet::IpNet>()
                    .ok()
                    .or_else(|| c.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
            })
            .collect()
    }
}

impl Spec for IpReservationSpec {
    const KIND: Kind = Kind::IpReservation;
}

impl Spec for IpamConfigSpec {
    const KIND: Kind = Kind::IpamConfig;
}

/// One address of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeAddress {
    pub address: String,
    /// `InternalIP`, `ExternalIP`, ... (free-form, as Calico).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// BGP settings of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeBgpSpec {
    /// The node's IPv4 address with prefix length (`198.18.0.2/24`), as Calico.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_address: Option<String>,
    /// The node's AS number; the cluster default applies when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// With a cluster ID (an IPv4 address) the node is a BGP route reflector (RFC 4456) and
    /// its mesh peers are its clients.
    #[serde(
        default,
        rename = "routeReflectorClusterID",
        skip_serializing_if = "Option::is_none"
    )]
    pub route_reflector_cluster_id: Option<String>,
}

/// Spec of a [`Node`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Option::is_none")]
    pub pod_cidrs: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<NodeBgpSpec>,
    /// Address of the node's VXLAN device, allocated from a pool.
    #[serde(
        default,
        rename = "ipv4VXLANTunnelAddr",
        skip_serializing_if = "Option::is_none"
    )]
    pub ipv4_vxlan_tunnel_addr: Option<String>,
    /// MAC of the node's VXLAN device.
    #[serde(
        default,
        rename = "vxlanTunnelMACAddr",
        skip_serializing_if = "Option::is_none"
    )]
    pub vxlan_tunnel_mac_addr: Option<String>,
}

impl Spec for NodeSpec {
    const KIND: Kind = Kind::Node;
}

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
    pub ports: Vec<crate::policy::EndpointPort>,
}

impl Spec for WorkloadEndpointSpec {
    const KIND: Kind = Kind::WorkloadEndpoint;
}

/// Any supported resource.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Resource {
    IpPool(IpPool),
    IpamConfig(IpamConfig),
    Node(Node),
    WorkloadEndpoint(WorkloadEndpoint),
    IpReservation(IpReservation),
    NetworkPolicy(crate::policy::NetworkPolicy),
    GlobalNetworkPolicy(crate::policy::GlobalNetworkPolicy),
    K8sNetworkPolicy(crate::policy::K8sNetworkPolicy),
    Namespace(crate::namespace::Namespace),
    BgpConfiguration(crate::bgp::BgpConfiguration),
    BgpPeer(crate::bgp::BgpPeer),
}

macro_rules! each {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Resource::IpPool($d) => $e,
            Resource::IpamConfig($d) => $e,
            Resource::Node($d) => $e,
            Resource::WorkloadEndpoint($d) => $e,
            Resource::IpReservation($d) => $e,
            Resource::NetworkPolicy($d) => $e,
            Resource::GlobalNetworkPolicy($d) => $e,
            Resource::K8sNetworkPolicy($d) => $e,
            Resource::Namespace($d) => $e,
            Resource::BgpConfiguration($d) => $e,
            Resource::BgpPeer($d) => $e,
        }
    };
}

impl Resource {
    /// The resource's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Resource::IpPool(_) => Kind::IpPool,
            Resource::IpamConfig(_) => Kind::IpamConfig,
            Resource::Node(_) => Kind::Node,
            Resource::WorkloadEndpoint(_) => Kind::WorkloadEndpoint,
            Resource::IpReservation(_) => Kind::IpReservation,
            Resource::NetworkPolicy(_) => Kind::NetworkPolicy,
            Resource::GlobalNetworkPolicy(_) => Kind::GlobalNetworkPolicy,
            Resource::K8sNetworkPolicy(_) => Kind::K8sNetworkPolicy,
            Resource::Namespace(_) => Kind::Namespace,
            Resource::BgpConfiguration(_) => Kind::BgpConfiguration,
            Resource::BgpPeer(_) => Kind::BgpPeer,
        }
    }

    /// The resource's metadata.
    pub fn metadata(&self) -> &ObjectMeta {
        each!(self, d => &d.metadata)
    }

    /// The resource's metadata, mutably.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        each!(self, d => &mut d.metadata)
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.metadata().name
    }

    /// `metadata.namespace`, for namespaced kinds.
    pub fn namespace(&self) -> Option<&str> {
        self.metadata().namespace.as_deref()
    }

    /// Fills defaults that depend on other fields.
    pub fn fill_defaults(&mut self) {
        each!(self, d => d.spec.fill_defaults())
    }

    /// Checks the resource before it is written; see [`crate::validate`].
    pub fn validate(&self) -> Result<(), ModelError> {
        crate::validate::validate(self)
    }

    /// The document as JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain structs of strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).unwrap_or_default()
    }

    /// Decodes a stored JSON document (as written by [`crate::put_resource`]).
    pub fn from_json(bytes: &[u8]) -> Result<Resource, String> {
        #[derive(Deserialize)]
        struct Header {
            #[serde(rename = "apiVersion", default)]
            api_version: String,
            kind: String,
        }
        let h: Header = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let kind = crate::parse::kind_of(&h.api_version, &h.kind)?;
        fn typed<S: Spec>(b: &[u8]) -> Result<Document<S>, String> {
            serde_json::from_slice(b).map_err(|e| e.to_string())
        }
        Ok(match kind {
            Kind::IpPool => Resource::IpPool(typed(bytes)?),
            Kind::IpamConfig => Resource::IpamConfig(typed(bytes)?),
            Kind::Node => Resource::Node(typed(bytes)?),
            Kind::WorkloadEndpoint => Resource::WorkloadEndpoint(typed(bytes)?),
            Kind::IpReservation => Resource::IpReservation(typed(bytes)?),
            Kind::NetworkPolicy => Resource::NetworkPolicy(typed(bytes)?),
            Kind::GlobalNetworkPolicy => Resource::GlobalNetworkPolicy(typed(bytes)?),
            Kind::K8sNetworkPolicy => Resource::K8sNetworkPolicy(typed(bytes)?),
            Kind::Namespace => Resource::Namespace(typed(bytes)?),
            Kind::BgpConfiguration => Resource::BgpConfiguration(typed(bytes)?),
            Kind::BgpPeer => Resource::BgpPeer(typed(bytes)?),
        })
    }
}

impl From<IpPool> for Resource {
    fn from(d: IpPool) -> Resource {
        Resource::IpPool(d)
    }
}
impl From<IpamConfig> for Resource {
    fn from(d: IpamConfig) -> Resource {
        Resource::IpamConfig(d)
    }
}
impl From<Node> for Resource {
    fn from(d: Node) -> Resource {
        Resource::Node(d)
    }
}
impl From<WorkloadEndpoint> for Resource {
    fn from(d: WorkloadEndpoint) -> Resource {
        Resource::WorkloadEndpoint(d)
    }
}
impl From<IpReservation> for Resource {
    fn from(d: IpReservation) -> Resource {
        Resource::IpReservation(d)
    }
}

macro_rules! from_doc {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Resource {
            fn from(d: $t) -> Resource {
                Resource::$v(d)
            }
        }
    )*};
}
from_doc!(
    crate::policy::NetworkPolicy => NetworkPolicy,
    crate::policy::GlobalNetworkPolicy => GlobalNetworkPolicy,
    crate::policy::K8sNetworkPolicy => K8sNetworkPolicy,
    crate::namespace::Namespace => Namespace,
    crate::bgp::BgpConfiguration => BgpConfiguration,
    crate::bgp::BgpPeer => BgpPeer
);
