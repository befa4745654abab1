//! The one table of kinds. Every kind tern stores is one row of the `kinds!` invocation
//! below, with its names, aliases, apiVersions, scope and the functions that fill its defaults
//! and check it; from that row the macro generates the [`Kind`] variant, the [`Resource`]
//! variant, the [`Spec`] impl and every dispatch over kinds (parsing, decoding, defaults,
//! validation, store keys). Generic code (parsing, storage, [`Resource`]'s methods) reaches
//! the kind modules only through what this table generates, so adding a kind is a module in
//! `kinds/` plus one row here.

use std::fmt::Debug;
use std::str::FromStr;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::document::{API_VERSION, Document, ObjectMeta};
use crate::kinds::{
    bgp, ip_reservation, ipam_config, ippool, k8s_policy, namespace, node, policy, staged,
    workload_endpoint,
};
use crate::validate::FieldError;

/// Kinds that belong to tern's API but are not implemented yet; parsing them fails with a
/// message saying so rather than "unknown kind".
pub const PLANNED_KINDS: &[&str] = &["AgentConfiguration"];

/// The spec of one kind: ties the Rust type to its [`Kind`] and its defaults. Implemented for
/// each row of the table.
pub trait Spec:
    Serialize + DeserializeOwned + Clone + Debug + PartialEq + Send + Sync + 'static
{
    /// The kind this spec belongs to.
    const KIND: Kind;
    /// The `apiVersion` of documents of this kind.
    const API_VERSION: &'static str;
    /// Fills defaults that depend on other fields (e.g. block size by address family).
    fn fill_defaults(&mut self);
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

/// A way to decode one document into the typed [`Document`] of any kind: parsing (YAML, JSON,
/// a decoded value) and store reads implement it, and [`Kind::decode`] picks the spec type.
pub(crate) trait Decode {
    type Error;
    /// Decodes the document as a `Document<S>`.
    fn decode<S: Spec>(self) -> Result<Document<S>, Self::Error>;
}

/// A kind without defaults to fill.
fn no_defaults<S>(_: &mut S) {}

/// A kind without checks beyond the metadata and size checks every kind gets.
fn no_checks<S>(_: &Document<S>) -> Result<(), FieldError> {
    Ok(())
}

macro_rules! kinds {
    ($(
        $(#[$attr:meta])*
        $v:ident {
            spec: $spec:ty,
            name: $name:literal,
            document_kind: $dkind:literal,
            api_versions: [$api:expr $(, $also:expr)*],
            namespaced: $ns:literal,
            user_authored: $ua:literal,
            singleton_key: $single:expr,
            implied_spec: $implied:literal,
            aliases: [$($alias:literal),+],
            defaults: $defaults:path,
            validate: $validate:path $(,)?
        }
    ),+ $(,)?) => {
        /// The kinds of resource tern stores.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($(#[$attr])* $v,)+
        }

        impl Kind {
            /// Every supported kind.
            pub const ALL: [Kind; [$(stringify!($v)),+].len()] = [$(Kind::$v),+];

            /// The kind's unique name (the `kind:` string of documents, except for Kubernetes
            /// NetworkPolicies, whose documents say `NetworkPolicy`; see
            /// [`Kind::document_kind`]). Store keys use this name, so the two NetworkPolicy
            /// flavours never collide.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Kind::$v => $name,)+
                }
            }

            /// The `kind:` string written in documents of this kind.
            pub fn document_kind(self) -> &'static str {
                match self {
                    $(Kind::$v => $dkind,)+
                }
            }

            /// The `apiVersion` written in documents of this kind.
            pub fn api_version(self) -> &'static str {
                match self {
                    $(Kind::$v => $api,)+
                }
            }

            /// Every `apiVersion` under which a document saying [`Kind::document_kind`] is of
            /// this kind (the written one first).
            pub fn api_versions(self) -> &'static [&'static str] {
                match self {
                    $(Kind::$v => &[$api $(, $also)*],)+
                }
            }

            /// Whether resources of this kind live in a Kubernetes namespace.
            pub fn namespaced(self) -> bool {
                match self {
                    $(Kind::$v => $ns,)+
                }
            }

            /// Whether users author resources of this kind (rather than `ternd`); a daemon
            /// validates those again when it reads them from the store.
            pub(crate) fn user_authored(self) -> bool {
                match self {
                    $(Kind::$v => $ua,)+
                }
            }

            /// The store key of a kind with a single resource, whatever its name.
            pub(crate) fn singleton_key(self) -> Option<&'static str> {
                match self {
                    $(Kind::$v => $single,)+
                }
            }

            /// Whether a document of this kind may leave out `spec` (an empty one is implied),
            /// as core Kubernetes documents do.
            pub(crate) fn implied_spec(self) -> bool {
                match self {
                    $(Kind::$v => $implied,)+
                }
            }

            /// Decodes one document as this kind's typed document.
            pub(crate) fn decode<D: Decode>(self, d: D) -> Result<Resource, D::Error> {
                match self {
                    $(Kind::$v => d.decode::<$spec>().map(Resource::$v),)+
                }
            }

            /// The name, plural and short forms accepted for this kind (lowercase).
            pub fn aliases(self) -> &'static [&'static str] {
                match self {
                    $(Kind::$v => &[$($alias),+],)+
                }
            }
        }

        impl FromStr for Kind {
            type Err = String;

            /// Accepts the kind as written in documents, case-insensitively, and the CLI's
            /// plural and short forms (`ippools`, `wep`), as calicoctl does.
            fn from_str(s: &str) -> Result<Kind, String> {
                let k = s.to_ascii_lowercase();
                Ok(match k.as_str() {
                    $($($alias)|+ => Kind::$v,)+
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

        $(
            impl Spec for $spec {
                const KIND: Kind = Kind::$v;
                const API_VERSION: &'static str = $api;
                fn fill_defaults(&mut self) {
                    $defaults(self)
                }
            }

            impl From<Document<$spec>> for Resource {
                fn from(d: Document<$spec>) -> Resource {
                    Resource::$v(d)
                }
            }
        )+

        /// Any supported resource.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum Resource {
            $($v(Document<$spec>),)+
        }

        impl Resource {
            /// The resource's kind.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Resource::$v(_) => Kind::$v,)+
                }
            }

            /// The resource's metadata.
            pub fn metadata(&self) -> &ObjectMeta {
                match self {
                    $(Resource::$v(d) => &d.metadata,)+
                }
            }

            /// The resource's metadata, mutably.
            pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
                match self {
                    $(Resource::$v(d) => &mut d.metadata,)+
                }
            }

            /// Fills defaults that depend on other fields.
            pub fn fill_defaults(&mut self) {
                match self {
                    $(Resource::$v(d) => d.spec.fill_defaults(),)+
                }
            }

            /// The kind's own checks of the resource (metadata and size are checked by
            /// [`Resource::validate`] for every kind).
            pub(crate) fn validate_spec(&self) -> Result<(), FieldError> {
                match self {
                    $(Resource::$v(d) => $validate(d),)+
                }
            }
        }
    };
}

impl Resource {
    /// The kind's write-time-only checks (count limits), which [`Resource::validate`] applies
    /// and [`Resource::from_stored`] does not: a stored resource over them is still used.
    pub(crate) fn validate_counts(&self) -> Result<(), FieldError> {
        match self {
            Resource::NetworkPolicy(p) => policy::validate_tern_counts(&p.spec),
            Resource::GlobalNetworkPolicy(p) => policy::validate_tern_counts(&p.spec.0),
            Resource::StagedNetworkPolicy(p) => staged::validate_staged_counts(&p.spec),
            Resource::StagedGlobalNetworkPolicy(p) => staged::validate_staged_counts(&p.spec.0),
            _ => Ok(()),
        }
    }
}

kinds! {
    IpPool {
        spec: ippool::IpPoolSpec,
        name: "IPPool",
        document_kind: "IPPool",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["ippool", "ippools", "pool", "pools"],
        defaults: ippool::fill_defaults,
        validate: ippool::validate_ip_pool,
    },
    IpamConfig {
        spec: ipam_config::IpamConfigSpec,
        name: "IPAMConfig",
        document_kind: "IPAMConfig",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        // The allocator reads the configuration from its own key.
        singleton_key: Some(tern_store::keys::IPAM_CONFIG),
        implied_spec: false,
        aliases: ["ipamconfig", "ipamconfigs", "ipamconfiguration"],
        defaults: no_defaults,
        validate: ipam_config::validate_ipam_config,
    },
    Node {
        spec: node::NodeSpec,
        name: "Node",
        document_kind: "Node",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: false,
        singleton_key: None,
        implied_spec: false,
        aliases: ["node", "nodes", "no"],
        defaults: no_defaults,
        validate: node::validate_node,
    },
    WorkloadEndpoint {
        spec: workload_endpoint::WorkloadEndpointSpec,
        name: "WorkloadEndpoint",
        document_kind: "WorkloadEndpoint",
        api_versions: [API_VERSION],
        namespaced: true,
        user_authored: false,
        singleton_key: None,
        implied_spec: false,
        aliases: ["workloadendpoint", "workloadendpoints", "wep", "weps"],
        defaults: no_defaults,
        validate: workload_endpoint::validate_workload_endpoint,
    },
    IpReservation {
        spec: ip_reservation::IpReservationSpec,
        name: "IPReservation",
        document_kind: "IPReservation",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["ipreservation", "ipreservations"],
        defaults: no_defaults,
        validate: ip_reservation::validate_ip_reservation,
    },
    /// tern's namespaced NetworkPolicy (`tern.dev/v1`).
    NetworkPolicy {
        spec: policy::NetworkPolicySpec,
        name: "NetworkPolicy",
        document_kind: "NetworkPolicy",
        api_versions: [API_VERSION],
        namespaced: true,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["networkpolicy", "networkpolicies", "netpol", "np"],
        defaults: policy::fill_defaults,
        validate: policy::validate_policy,
    },
    /// tern's cluster-scoped GlobalNetworkPolicy.
    GlobalNetworkPolicy {
        spec: policy::GlobalNetworkPolicySpec,
        name: "GlobalNetworkPolicy",
        document_kind: "GlobalNetworkPolicy",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["globalnetworkpolicy", "globalnetworkpolicies", "gnp"],
        defaults: policy::fill_global_defaults,
        validate: policy::validate_global_policy,
    },
    /// A Kubernetes `networking.k8s.io/v1` NetworkPolicy (document kind `NetworkPolicy`).
    K8sNetworkPolicy {
        spec: k8s_policy::K8sNetworkPolicySpec,
        name: "KubernetesNetworkPolicy",
        document_kind: "NetworkPolicy",
        api_versions: [k8s_policy::K8S_NETWORKING_API_VERSION],
        namespaced: true,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["kubernetesnetworkpolicy", "kubernetesnetworkpolicies", "knp"],
        defaults: k8s_policy::fill_defaults,
        validate: k8s_policy::validate_k8s_policy,
    },
    /// A staged tern NetworkPolicy: evaluated, never enforced (see `kinds/staged.rs`).
    StagedNetworkPolicy {
        spec: staged::StagedNetworkPolicySpec,
        name: "StagedNetworkPolicy",
        document_kind: "StagedNetworkPolicy",
        api_versions: [API_VERSION],
        namespaced: true,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["stagednetworkpolicy", "stagednetworkpolicies", "snp"],
        defaults: staged::fill_defaults,
        validate: staged::validate_staged_policy,
    },
    /// A staged tern GlobalNetworkPolicy.
    StagedGlobalNetworkPolicy {
        spec: staged::StagedGlobalNetworkPolicySpec,
        name: "StagedGlobalNetworkPolicy",
        document_kind: "StagedGlobalNetworkPolicy",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["stagedglobalnetworkpolicy", "stagedglobalnetworkpolicies", "sgnp"],
        defaults: staged::fill_global_defaults,
        validate: staged::validate_staged_global_policy,
    },
    /// A staged Kubernetes NetworkPolicy (tern's API group: Kubernetes has no such kind).
    StagedKubernetesNetworkPolicy {
        spec: staged::StagedKubernetesNetworkPolicySpec,
        name: "StagedKubernetesNetworkPolicy",
        document_kind: "StagedKubernetesNetworkPolicy",
        api_versions: [API_VERSION],
        namespaced: true,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: [
            "stagedkubernetesnetworkpolicy",
            "stagedkubernetesnetworkpolicies",
            "sknp"
        ],
        defaults: staged::fill_k8s_defaults,
        validate: staged::validate_staged_k8s_policy,
    },
    /// A namespace and its labels.
    Namespace {
        spec: namespace::NamespaceSpec,
        name: "Namespace",
        document_kind: "Namespace",
        // Core Kubernetes `v1` Namespace documents apply unchanged.
        api_versions: [API_VERSION, "v1"],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: true,
        aliases: ["namespace", "namespaces", "ns"],
        defaults: no_defaults,
        validate: no_checks,
    },
    /// Cluster-wide BGP settings.
    BgpConfiguration {
        spec: bgp::BgpConfigurationSpec,
        name: "BGPConfiguration",
        document_kind: "BGPConfiguration",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["bgpconfiguration", "bgpconfigurations", "bgpconfig", "bgpconfigs"],
        defaults: no_defaults,
        validate: bgp::validate_configuration,
    },
    /// An explicit BGP peering.
    BgpPeer {
        spec: bgp::BgpPeerSpec,
        name: "BGPPeer",
        document_kind: "BGPPeer",
        api_versions: [API_VERSION],
        namespaced: false,
        user_authored: true,
        singleton_key: None,
        implied_spec: false,
        aliases: ["bgppeer", "bgppeers"],
        defaults: no_defaults,
        validate: bgp::validate_peer,
    },
}

impl Kind {
    /// The kind of a document from its `apiVersion` and `kind`: the kind whose
    /// [`Kind::document_kind`] and [`Kind::api_versions`] match exactly (so Kubernetes
    /// `networking.k8s.io/v1` NetworkPolicy and core `v1` Namespace documents are accepted
    /// unchanged), else the kind named by `kind` (any alias, any case).
    pub(crate) fn of_document(api_version: &str, kind: &str) -> Result<Kind, String> {
        match Kind::exact(api_version, kind) {
            Some(k) => Ok(k),
            None => kind.parse(),
        }
    }

    /// The kind whose document kind is `kind` under `api_version`, if one is.
    pub(crate) fn exact(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.document_kind() == kind && k.api_versions().contains(&api_version))
    }
}

impl Kind {
    /// The enforced kind a staged kind stages (`StagedNetworkPolicy` -> `NetworkPolicy`, ...);
    /// `None` for any other kind.
    pub fn enforced_of_staged(self) -> Option<Kind> {
        match self {
            Kind::StagedNetworkPolicy => Some(Kind::NetworkPolicy),
            Kind::StagedGlobalNetworkPolicy => Some(Kind::GlobalNetworkPolicy),
            Kind::StagedKubernetesNetworkPolicy => Some(Kind::K8sNetworkPolicy),
            _ => None,
        }
    }

    /// Whether this is one of the staged policy kinds.
    pub fn is_staged(self) -> bool {
        self.enforced_of_staged().is_some()
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is consistent: names are unique, every kind parses back from its name and
    /// each of its aliases, and no alias names two kinds.
    #[test]
    fn every_kind_parses_from_its_name_and_aliases() {
        let mut seen = std::collections::BTreeMap::new();
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
            assert_eq!(k.api_versions()[0], k.api_version());
            assert!(
                k.aliases()
                    .contains(&k.as_str().to_ascii_lowercase().as_str()),
                "{k}: its name must be an alias"
            );
            for a in k.aliases() {
                assert_eq!(a.parse::<Kind>(), Ok(k), "{a}");
                if let Some(other) = seen.insert(*a, k) {
                    panic!("alias {a} names both {other} and {k}");
                }
            }
            assert_eq!(
                Kind::of_document(k.api_version(), k.document_kind()),
                Ok(k),
                "{k}"
            );
        }
    }
}
