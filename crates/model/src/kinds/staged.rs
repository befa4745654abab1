//! Staged policies, as Calico 3.30 has them: [`StagedNetworkPolicy`],
//! [`StagedGlobalNetworkPolicy`] and [`StagedKubernetesNetworkPolicy`]. Each is its enforced
//! kind's spec plus `stagedAction`: `Set` (the default: "what if this policy were in force",
//! replacing an enforced one of the same name) or `Delete` ("what if the enforced policy of
//! this name were deleted"; the spec then holds nothing else). They are evaluated, never
//! enforced: the policy engine keeps them beside the enforced policies and never compiles them.
//!
//! The specs repeat the enforced specs' fields rather than flattening them, because serde's
//! `flatten` cannot be combined with `deny_unknown_fields`, and a misspelt field must stay an
//! error naming it. [`StagedNetworkPolicySpec::enforced`] and its siblings give the enforced
//! spec, which is validated (and defaulted) exactly as the enforced kind's.

use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::kinds::k8s_policy::{
    self, K8sEgressRule, K8sIngressRule, K8sNetworkPolicySpec, LabelSelector,
};
use crate::kinds::policy::{self, NetworkPolicySpec, Rule};
use crate::kinds::shared::PolicyType;
use crate::validate::FieldError;

/// A staged tern NetworkPolicy (namespaced).
pub type StagedNetworkPolicy = Document<StagedNetworkPolicySpec>;
/// A staged tern GlobalNetworkPolicy (cluster-scoped).
pub type StagedGlobalNetworkPolicy = Document<StagedGlobalNetworkPolicySpec>;
/// A staged Kubernetes NetworkPolicy (namespaced).
pub type StagedKubernetesNetworkPolicy = Document<StagedKubernetesNetworkPolicySpec>;

/// What a staged policy would do to the enforced policy of the same name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StagedAction {
    /// Add the policy, or replace the enforced one of the same name.
    #[default]
    Set,
    /// Delete the enforced policy of the same name.
    Delete,
}

impl StagedAction {
    /// True for [`StagedAction::Set`] (the default, left out when written).
    pub fn is_set(&self) -> bool {
        *self == StagedAction::Set
    }

    /// `Set` or `Delete`.
    pub fn as_str(self) -> &'static str {
        match self {
            StagedAction::Set => "Set",
            StagedAction::Delete => "Delete",
        }
    }
}

/// Spec of a [`StagedNetworkPolicy`] or [`StagedGlobalNetworkPolicy`]: a
/// [`NetworkPolicySpec`]'s fields and `stagedAction`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StagedNetworkPolicySpec {
    #[serde(default, skip_serializing_if = "StagedAction::is_set")]
    pub staged_action: StagedAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    #[serde(default)]
    pub selector: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<PolicyType>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
}

impl StagedNetworkPolicySpec {
    /// The spec of the policy it stages.
    pub fn enforced(&self) -> NetworkPolicySpec {
        NetworkPolicySpec {
            order: self.order,
            selector: self.selector.clone(),
            types: self.types.clone(),
            ingress: self.ingress.clone(),
            egress: self.egress.clone(),
        }
    }

    /// A staged spec of `action` over an enforced spec.
    pub fn staging(action: StagedAction, s: NetworkPolicySpec) -> StagedNetworkPolicySpec {
        StagedNetworkPolicySpec {
            staged_action: action,
            order: s.order,
            selector: s.selector,
            types: s.types,
            ingress: s.ingress,
            egress: s.egress,
        }
    }
}

/// Spec of a [`StagedGlobalNetworkPolicy`]: the same fields as a staged NetworkPolicy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StagedGlobalNetworkPolicySpec(pub StagedNetworkPolicySpec);

impl std::ops::Deref for StagedGlobalNetworkPolicySpec {
    type Target = StagedNetworkPolicySpec;
    fn deref(&self) -> &StagedNetworkPolicySpec {
        &self.0
    }
}

/// Spec of a [`StagedKubernetesNetworkPolicy`]: a Kubernetes NetworkPolicy's spec and
/// `stagedAction`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StagedKubernetesNetworkPolicySpec {
    #[serde(default, skip_serializing_if = "StagedAction::is_set")]
    pub staged_action: StagedAction,
    #[serde(default)]
    pub pod_selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<K8sIngressRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<K8sEgressRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_types: Vec<PolicyType>,
}

impl StagedKubernetesNetworkPolicySpec {
    /// The spec of the Kubernetes NetworkPolicy it stages.
    pub fn enforced(&self) -> K8sNetworkPolicySpec {
        K8sNetworkPolicySpec {
            pod_selector: self.pod_selector.clone(),
            ingress: self.ingress.clone(),
            egress: self.egress.clone(),
            policy_types: self.policy_types.clone(),
        }
    }

    /// A staged spec of `action` over a Kubernetes NetworkPolicy's spec.
    pub fn staging(
        action: StagedAction,
        s: K8sNetworkPolicySpec,
    ) -> StagedKubernetesNetworkPolicySpec {
        StagedKubernetesNetworkPolicySpec {
            staged_action: action,
            pod_selector: s.pod_selector,
            ingress: s.ingress,
            egress: s.egress,
            policy_types: s.policy_types,
        }
    }
}

/// Defaults of a staged tern policy: the enforced kind's, for `Set` only (a `Delete` holds
/// nothing to default).
pub(crate) fn fill_defaults(s: &mut StagedNetworkPolicySpec) {
    if s.staged_action.is_set() {
        let mut e = s.enforced();
        policy::fill_defaults(&mut e);
        *s = StagedNetworkPolicySpec::staging(s.staged_action, e);
    }
}

/// Defaults of a staged GlobalNetworkPolicy, as of a staged NetworkPolicy.
pub(crate) fn fill_global_defaults(s: &mut StagedGlobalNetworkPolicySpec) {
    fill_defaults(&mut s.0);
}

/// Defaults of a staged Kubernetes NetworkPolicy: the API server's, for `Set` only.
pub(crate) fn fill_k8s_defaults(s: &mut StagedKubernetesNetworkPolicySpec) {
    if s.staged_action.is_set() {
        let mut e = s.enforced();
        k8s_policy::fill_defaults(&mut e);
        *s = StagedKubernetesNetworkPolicySpec::staging(s.staged_action, e);
    }
}

/// A `Delete` must hold nothing but `stagedAction` (as Calico requires): the first field it
/// does hold is the error.
fn delete_is_bare(set: &[(&str, bool)]) -> Result<(), FieldError> {
    match set.iter().find(|(_, given)| *given) {
        Some((field, _)) => Err((
            format!("spec.{field}"),
            "must not be set when stagedAction is Delete".into(),
        )),
        None => Ok(()),
    }
}

/// Checks of a staged tern policy spec: the enforced kind's for `Set`, nothing but
/// `stagedAction` for `Delete`.
pub fn validate_staged_spec(s: &StagedNetworkPolicySpec) -> Result<(), FieldError> {
    match s.staged_action {
        StagedAction::Set => policy::validate_tern_spec(&s.enforced()),
        StagedAction::Delete => delete_is_bare(&[
            ("order", s.order.is_some()),
            ("selector", !s.selector.is_empty()),
            ("types", !s.types.is_empty()),
            ("ingress", !s.ingress.is_empty()),
            ("egress", !s.egress.is_empty()),
        ]),
    }
}

/// Checks of a staged Kubernetes NetworkPolicy spec, as [`validate_staged_spec`].
pub fn validate_staged_k8s_spec(s: &StagedKubernetesNetworkPolicySpec) -> Result<(), FieldError> {
    match s.staged_action {
        StagedAction::Set => k8s_policy::validate_k8s_spec(&s.enforced()),
        StagedAction::Delete => delete_is_bare(&[
            ("podSelector", s.pod_selector != LabelSelector::default()),
            ("ingress", !s.ingress.is_empty()),
            ("egress", !s.egress.is_empty()),
            ("policyTypes", !s.policy_types.is_empty()),
        ]),
    }
}

/// Write-time count limits of a staged tern policy (those of the enforced kind).
pub fn validate_staged_counts(s: &StagedNetworkPolicySpec) -> Result<(), FieldError> {
    policy::validate_tern_counts(&s.enforced())
}

pub(crate) fn validate_staged_policy(p: &StagedNetworkPolicy) -> Result<(), FieldError> {
    validate_staged_spec(&p.spec)
}

pub(crate) fn validate_staged_global_policy(
    p: &StagedGlobalNetworkPolicy,
) -> Result<(), FieldError> {
    validate_staged_spec(&p.spec.0)
}

pub(crate) fn validate_staged_k8s_policy(
    p: &StagedKubernetesNetworkPolicy,
) -> Result<(), FieldError> {
    validate_staged_k8s_spec(&p.spec)
}
