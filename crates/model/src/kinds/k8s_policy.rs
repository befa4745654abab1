//! Kubernetes `networking.k8s.io/v1` `NetworkPolicy` ([`K8sNetworkPolicy`], namespaced),
//! accepted unchanged and validated as the Kubernetes API server does (CIDRs, `except`
//! strictly inside `cidr`, `endPort` only with a numeric `port` and not below it, protocol
//! TCP|UDP|SCTP defaulting to TCP, `policyTypes` defaulting to Ingress plus Egress when egress
//! rules are present).

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::kinds::shared::{IntOrString, PolicyType, Protocol};
use crate::limits::MAX_EXPANDED_RULES_PER_DIRECTION;
use crate::selector::Selector;
use crate::validate::{FieldError, listed_once, parse_rule_cidr, validate_port_name};

/// `apiVersion` of Kubernetes NetworkPolicy documents.
pub const K8S_NETWORKING_API_VERSION: &str = "networking.k8s.io/v1";

/// A Kubernetes NetworkPolicy (namespaced).
pub type K8sNetworkPolicy = Document<K8sNetworkPolicySpec>;

/// Kubernetes `metav1.LabelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: LabelSelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// Operators of a `matchExpressions` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelSelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelSelector {
    /// The equivalent selector in tern's (Calico's) language: an empty selector selects
    /// everything; `NotIn` also matches when the label is absent, as in Kubernetes.
    pub fn to_selector(&self) -> Selector {
        let mut parts: Vec<Selector> = self
            .match_labels
            .iter()
            .map(|(k, v)| Selector::Eq(k.clone(), v.clone()))
            .collect();
        for e in &self.match_expressions {
            let vals = e.values.iter().cloned().collect();
            parts.push(match e.operator {
                LabelSelectorOperator::In => Selector::In(e.key.clone(), vals),
                LabelSelectorOperator::NotIn => Selector::NotIn(e.key.clone(), vals),
                LabelSelectorOperator::Exists => Selector::Has(e.key.clone()),
                LabelSelectorOperator::DoesNotExist => {
                    Selector::Not(Box::new(Selector::Has(e.key.clone())))
                }
            });
        }
        match parts.len() {
            0 => Selector::All,
            1 => parts.pop().expect("one part"),
            _ => Selector::And(parts),
        }
    }

    // No count limits here: Kubernetes has none, so any count would refuse objects the API
    // server accepted. The resource size bound (`MAX_RESOURCE_BYTES`) bounds the memory, and
    // the selector built from the terms is a flat `And` of flat sets (linear to evaluate).
    fn validate(&self, field: &str) -> Result<(), FieldError> {
        for (i, e) in self.match_expressions.iter().enumerate() {
            let f = format!("{field}.matchExpressions[{i}].values");
            match e.operator {
                LabelSelectorOperator::In | LabelSelectorOperator::NotIn if e.values.is_empty() => {
                    return Err((
                        f,
                        format!("must be non-empty for operator {:?}", e.operator),
                    ));
                }
                LabelSelectorOperator::Exists | LabelSelectorOperator::DoesNotExist
                    if !e.values.is_empty() =>
                {
                    return Err((f, format!("must be empty for operator {:?}", e.operator)));
                }
                _ => {}
            }
            if e.key.is_empty() {
                return Err((
                    format!("{field}.matchExpressions[{i}].key"),
                    "must not be empty".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Protocols of Kubernetes NetworkPolicy ports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum K8sProtocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

/// Spec of a [`K8sNetworkPolicy`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sNetworkPolicySpec {
    /// Pods of the policy's namespace it applies to; `{}` selects all.
    #[serde(default)]
    pub pod_selector: LabelSelector,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<K8sIngressRule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<K8sEgressRule>,
    /// Defaulted on parse (as the API server does): `[Ingress]`, plus `Egress` when `egress`
    /// has rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_types: Vec<PolicyType>,
}

/// One direction's rules, each as its peers and ports.
type RuleSides<'a> = Vec<(&'a [K8sPeer], &'a [K8sPort])>;

impl K8sNetworkPolicySpec {
    /// Both directions as (direction, the field of its peers, its rules): `ingress` with
    /// `from`, `egress` with `to`.
    fn rule_sides(&self) -> [(&'static str, &'static str, RuleSides<'_>); 2] {
        [
            (
                "ingress",
                "from",
                self.ingress
                    .iter()
                    .map(|r| (&r.from[..], &r.ports[..]))
                    .collect(),
            ),
            (
                "egress",
                "to",
                self.egress
                    .iter()
                    .map(|r| (&r.to[..], &r.ports[..]))
                    .collect(),
            ),
        ]
    }
}

/// Defaults the API server fills: `policyTypes` and each port's protocol.
pub(crate) fn fill_defaults(s: &mut K8sNetworkPolicySpec) {
    if s.policy_types.is_empty() {
        s.policy_types.push(PolicyType::Ingress);
        if !s.egress.is_empty() {
            s.policy_types.push(PolicyType::Egress);
        }
    }
    for p in s
        .ingress
        .iter_mut()
        .flat_map(|r| r.ports.iter_mut())
        .chain(s.egress.iter_mut().flat_map(|r| r.ports.iter_mut()))
    {
        p.protocol.get_or_insert(K8sProtocol::Tcp);
    }
}

impl From<K8sProtocol> for Protocol {
    fn from(p: K8sProtocol) -> Protocol {
        match p {
            K8sProtocol::Tcp => Protocol::Tcp,
            K8sProtocol::Udp => Protocol::Udp,
            K8sProtocol::Sctp => Protocol::Sctp,
        }
    }
}

/// One ingress rule: traffic from any of `from` (all when empty) to any of `ports` (all when
/// empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sIngressRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<K8sPeer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<K8sPort>,
}

/// One egress rule: traffic to any of `to` (all when empty) on any of `ports`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sEgressRule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<K8sPeer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<K8sPort>,
}

/// A peer: pods (by pod and/or namespace selector) or an IP block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_block: Option<IpBlock>,
}

/// A CIDR minus exceptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpBlock {
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub except: Vec<String>,
}

impl IpBlock {
    /// The block's network and exceptions, validated as the API server does.
    pub fn nets(&self) -> Result<(IpNet, Vec<IpNet>), FieldError> {
        let cidr = parse_rule_cidr(&self.cidr).map_err(|e| ("cidr".to_string(), e))?;
        let mut except = Vec::new();
        for (i, e) in self.except.iter().enumerate() {
            let f = format!("except[{i}]");
            let n = parse_rule_cidr(e).map_err(|m| (f.clone(), m))?;
            let inside = match (cidr, n) {
                (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)) => {
                    cidr.contains(&n.network()) && n.prefix_len() > cidr.prefix_len()
                }
                _ => false,
            };
            if !inside {
                return Err((
                    f,
                    format!("{e} must be a strict subset of cidr {}", self.cidr),
                ));
            }
            except.push(n);
        }
        Ok((cidr, except))
    }
}

/// A port of a rule: protocol (TCP when absent), a number or a named container port, and an
/// optional range end.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct K8sPort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<K8sProtocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<i64>,
}

fn validate_k8s_port(p: &K8sPort, field: &str) -> Result<(), FieldError> {
    let f = |s: &str| format!("{field}.{s}");
    match &p.port {
        None => {
            if p.end_port.is_some() {
                return Err((f("endPort"), "may not be specified without port".into()));
            }
        }
        Some(IntOrString::Int(n)) => {
            if !(1..=65535).contains(n) {
                return Err((f("port"), format!("{n} must be between 1 and 65535")));
            }
            if let Some(e) = p.end_port {
                if !(1..=65535).contains(&e) {
                    return Err((f("endPort"), format!("{e} must be between 1 and 65535")));
                }
                if e < *n {
                    return Err((
                        f("endPort"),
                        format!("{e} must be greater than or equal to port {n}"),
                    ));
                }
            }
        }
        Some(IntOrString::Str(s)) => {
            validate_port_name(s).map_err(|e| (f("port"), e))?;
            if p.end_port.is_some() {
                return Err((
                    f("endPort"),
                    format!("may not be specified when port is the named port {s:?}"),
                ));
            }
        }
    }
    Ok(())
}

fn validate_k8s_peer(p: &K8sPeer, field: &str) -> Result<(), FieldError> {
    let n = [
        p.pod_selector.is_some() || p.namespace_selector.is_some(),
        p.ip_block.is_some(),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if n == 0 {
        return Err((
            field.to_string(),
            "must specify podSelector, namespaceSelector or ipBlock".into(),
        ));
    }
    if n > 1 {
        return Err((
            field.to_string(),
            "ipBlock may not be combined with podSelector or namespaceSelector".into(),
        ));
    }
    if let Some(s) = &p.pod_selector {
        s.validate(&format!("{field}.podSelector"))?;
    }
    if let Some(s) = &p.namespace_selector {
        s.validate(&format!("{field}.namespaceSelector"))?;
    }
    if let Some(b) = &p.ip_block {
        b.nets()
            .map_err(|(f, m)| (format!("{field}.ipBlock.{f}"), m))?;
    }
    Ok(())
}

/// The one bound a stored Kubernetes NetworkPolicy must meet to be used, beyond the resource
/// size: the compiler expands each rule into (peer, port) pairs and copies a peer's
/// `ipBlock.except` list into each, so the work is `sum(peers x ports x (1 + except))`,
/// which the size bound alone does not keep linear (1 MiB could hold 16k peers x 50k ports).
/// This is checked both on write and on read ([`crate::Resource::from_stored`]); Kubernetes
/// objects never come near it.
pub fn check_k8s_expansion(s: &K8sNetworkPolicySpec) -> Result<(), FieldError> {
    let weight = |peers: &[K8sPeer]| -> usize {
        if peers.is_empty() {
            return 1;
        }
        peers
            .iter()
            .map(|p| 1 + p.ip_block.as_ref().map_or(0, |b| b.except.len()))
            .fold(0usize, usize::saturating_add)
    };
    for (dir, _, rules) in s.rule_sides() {
        let expanded = rules
            .iter()
            .map(|(peers, ports)| weight(peers).saturating_mul(ports.len().max(1)))
            .fold(0usize, usize::saturating_add);
        if expanded > MAX_EXPANDED_RULES_PER_DIRECTION {
            return Err((
                format!("spec.{dir}"),
                format!(
                    "the rules expand to {expanded} (peer, port) pairs (each except CIDR of a \
                     peer counting once more), the limit is {MAX_EXPANDED_RULES_PER_DIRECTION}"
                ),
            ));
        }
    }
    Ok(())
}

/// Validates a Kubernetes NetworkPolicy spec as the API server does; the error is
/// `(field path, reason)`. Like the API server it puts no limit on how many rules, peers,
/// ports, CIDRs or selector terms there are (the resource size bounds those); the only extra
/// bound is [`check_k8s_expansion`], which the compiler needs.
pub fn validate_k8s_spec(s: &K8sNetworkPolicySpec) -> Result<(), FieldError> {
    s.pod_selector.validate("spec.podSelector")?;
    // First: it is cheap, and bounds the work of every check after it.
    check_k8s_expansion(s)?;
    for (dir, side, rules) in s.rule_sides() {
        for (i, (peers, ports)) in rules.into_iter().enumerate() {
            for (j, p) in peers.iter().enumerate() {
                validate_k8s_peer(p, &format!("spec.{dir}[{i}].{side}[{j}]"))?;
            }
            for (j, p) in ports.iter().enumerate() {
                validate_k8s_port(p, &format!("spec.{dir}[{i}].ports[{j}]"))?;
            }
        }
    }
    listed_once(&s.policy_types, "spec.policyTypes")
}

/// Write-time checks of a [`K8sNetworkPolicy`].
pub(crate) fn validate_k8s_policy(p: &K8sNetworkPolicy) -> Result<(), FieldError> {
    validate_k8s_spec(&p.spec)
}
