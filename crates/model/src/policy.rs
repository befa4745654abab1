//! Network policy resources:
//!
//! - [`K8sNetworkPolicy`]: Kubernetes `networking.k8s.io/v1` `NetworkPolicy`, accepted unchanged
//!   and validated as the Kubernetes API server does (CIDRs, `except` strictly inside `cidr`,
//!   `endPort` only with a numeric `port` and not below it, protocol TCP|UDP|SCTP defaulting to
//!   TCP, `policyTypes` defaulting to Ingress plus Egress when egress rules are present).
//! - [`NetworkPolicy`] (namespaced) and [`GlobalNetworkPolicy`] (cluster-scoped): tern's own,
//!   with Calico v3's fields (`order`, `selector`, `types`, rules with `action`, `protocol`,
//!   `source`/`destination` {`selector`, `namespaceSelector`, `nets`, `notNets`, `ports`}).
//!
//! Errors are `(field path, reason)` pairs; [`crate::validate`] wraps them into
//! [`crate::ModelError::Invalid`].

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::resources::{Document, Kind, Spec};
use crate::selector::Selector;

/// `apiVersion` of Kubernetes NetworkPolicy documents.
pub const K8S_NETWORKING_API_VERSION: &str = "networking.k8s.io/v1";

/// A Kubernetes NetworkPolicy (namespaced).
pub type K8sNetworkPolicy = Document<K8sNetworkPolicySpec>;
/// A tern (Calico-style) namespaced NetworkPolicy.
pub type NetworkPolicy = Document<NetworkPolicySpec>;
/// A tern (Calico-style) cluster-scoped GlobalNetworkPolicy.
pub type GlobalNetworkPolicy = Document<GlobalNetworkPolicySpec>;

/// A value that is either an integer or a string, as Kubernetes' `IntOrString` (ports) and
/// Calico's `Protocol`/`Port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IntOrString {
    Int(i64),
    Str(String),
}

impl fmt::Display for IntOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrString::Int(i) => write!(f, "{i}"),
            IntOrString::Str(s) => f.write_str(s),
        }
    }
}

impl Serialize for IntOrString {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            IntOrString::Int(i) => s.serialize_i64(*i),
            IntOrString::Str(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<IntOrString, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IntOrString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IntOrString, E> {
                Ok(IntOrString::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IntOrString, E> {
                i64::try_from(v)
                    .map(IntOrString::Int)
                    .map_err(|_| E::custom(format!("{v} is out of range")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Kubernetes NetworkPolicy

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
        parts
            .into_iter()
            .reduce(|a, b| Selector::And(Box::new(a), Box::new(b)))
            .unwrap_or(Selector::All)
    }

    fn validate(&self, field: &str) -> Result<(), (String, String)> {
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

/// Direction a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyType {
    Ingress,
    Egress,
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

impl Spec for K8sNetworkPolicySpec {
    const KIND: Kind = Kind::K8sNetworkPolicy;
    const API_VERSION: &'static str = K8S_NETWORKING_API_VERSION;
    fn fill_defaults(&mut self) {
        if self.policy_types.is_empty() {
            self.policy_types.push(PolicyType::Ingress);
            if !self.egress.is_empty() {
                self.policy_types.push(PolicyType::Egress);
            }
        }
        for p in self
            .ingress
            .iter_mut()
            .flat_map(|r| r.ports.iter_mut())
            .chain(self.egress.iter_mut().flat_map(|r| r.ports.iter_mut()))
        {
            p.protocol.get_or_insert(K8sProtocol::Tcp);
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
    pub fn nets(&self) -> Result<(IpNet, Vec<IpNet>), (String, String)> {
        let cidr = parse_cidr(&self.cidr).map_err(|e| ("cidr".to_string(), e))?;
        let mut except = Vec::new();
        for (i, e) in self.except.iter().enumerate() {
            let f = format!("except[{i}]");
            let n = parse_cidr(e).map_err(|m| (f.clone(), m))?;
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

/// A CIDR; host bits are allowed (Kubernetes accepts `10.0.0.1/24` and means its network).
fn parse_cidr(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("{s:?} is not a CIDR (expected e.g. 10.0.0.0/16)"))
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

/// Checks an IANA service name as Kubernetes does for named ports: 1-15 characters of
/// lowercase letters, digits and `-`, at least one letter, no leading, trailing or double `-`.
pub fn validate_port_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid port name (1-15 lowercase letters, digits and '-', with at \
             least one letter)"
        ))
    }
}

fn validate_k8s_port(p: &K8sPort, field: &str) -> Result<(), (String, String)> {
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

fn validate_k8s_peer(p: &K8sPeer, field: &str) -> Result<(), (String, String)> {
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

/// Validates a Kubernetes NetworkPolicy spec as the API server does; the error is
/// `(field path, reason)`.
pub fn validate_k8s_spec(s: &K8sNetworkPolicySpec) -> Result<(), (String, String)> {
    s.pod_selector.validate("spec.podSelector")?;
    for (i, r) in s.ingress.iter().enumerate() {
        for (j, p) in r.from.iter().enumerate() {
            validate_k8s_peer(p, &format!("spec.ingress[{i}].from[{j}]"))?;
        }
        for (j, p) in r.ports.iter().enumerate() {
            validate_k8s_port(p, &format!("spec.ingress[{i}].ports[{j}]"))?;
        }
    }
    for (i, r) in s.egress.iter().enumerate() {
        for (j, p) in r.to.iter().enumerate() {
            validate_k8s_peer(p, &format!("spec.egress[{i}].to[{j}]"))?;
        }
        for (j, p) in r.ports.iter().enumerate() {
            validate_k8s_port(p, &format!("spec.egress[{i}].ports[{j}]"))?;
        }
    }
    let mut seen = Vec::new();
    for t in &s.policy_types {
        if seen.contains(t) {
            return Err(("spec.policyTypes".into(), format!("{t:?} is listed twice")));
        }
        seen.push(*t);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// tern NetworkPolicy / GlobalNetworkPolicy (Calico v3)

/// What a rule does with matching traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Accept and stop evaluating.
    Allow,
    /// Drop and stop evaluating.
    Deny,
    /// Log and continue with the next rule.
    Log,
    /// Skip the remaining policies; the endpoint's profile decides (tern's profile allows).
    Pass,
}

/// An IP protocol of a rule (Calico names, or a number 1-255).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "IntOrString", into = "IntOrString")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    IcmpV6,
    UdpLite,
    /// Any other IP protocol number.
    Number(u8),
}

impl Protocol {
    /// Whether rules with this protocol may match ports.
    pub fn has_ports(self) -> bool {
        matches!(
            self,
            Protocol::Tcp | Protocol::Udp | Protocol::Sctp | Protocol::UdpLite
        )
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Icmp => 1,
            Protocol::IcmpV6 => 58,
            Protocol::UdpLite => 136,
            Protocol::Number(n) => n,
        }
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

impl TryFrom<IntOrString> for Protocol {
    type Error = String;
    fn try_from(v: IntOrString) -> Result<Protocol, String> {
        match v {
            IntOrString::Int(n) => u8::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .map(Protocol::Number)
                .ok_or_else(|| format!("protocol number {n} is not in 1..=255")),
            IntOrString::Str(s) => Ok(match s.to_ascii_uppercase().as_str() {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                "ICMP" => Protocol::Icmp,
                "ICMPV6" => Protocol::IcmpV6,
                "UDPLITE" => Protocol::UdpLite,
                _ => {
                    return Err(format!(
                        "unknown protocol {s:?}; expected TCP, UDP, SCTP, ICMP, ICMPv6, UDPLite \
                         or a number"
                    ));
                }
            }),
        }
    }
}

impl From<Protocol> for IntOrString {
    fn from(p: Protocol) -> IntOrString {
        IntOrString::Str(
            match p {
                Protocol::Tcp => "TCP",
                Protocol::Udp => "UDP",
                Protocol::Sctp => "SCTP",
                Protocol::Icmp => "ICMP",
                Protocol::IcmpV6 => "ICMPv6",
                Protocol::UdpLite => "UDPLite",
                Protocol::Number(n) => return IntOrString::Int(n.into()),
            }
            .to_string(),
        )
    }
}

/// A port of a Calico rule: a number, a range (`"80:90"`) or a named port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "IntOrString", into = "IntOrString")]
pub enum Port {
    /// An inclusive range (a single port is `lo == hi`).
    Range(u16, u16),
    /// A named container port of the destination endpoint.
    Named(String),
}

impl TryFrom<IntOrString> for Port {
    type Error = String;
    fn try_from(v: IntOrString) -> Result<Port, String> {
        let num = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("{s:?} is not a port number (0-65535)"))
        };
        match v {
            IntOrString::Int(n) => u16::try_from(n)
                .map(|p| Port::Range(p, p))
                .map_err(|_| format!("port {n} is not in 0..=65535")),
            IntOrString::Str(s) => {
                if let Some((a, b)) = s.split_once(':') {
                    let (lo, hi) = (num(a)?, num(b)?);
                    if hi < lo {
                        return Err(format!("port range {s:?}: end {hi} is below start {lo}"));
                    }
                    Ok(Port::Range(lo, hi))
                } else if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                    num(&s).map(|p| Port::Range(p, p))
                } else {
                    validate_port_name(&s)?;
                    Ok(Port::Named(s))
                }
            }
        }
    }
}

impl From<Port> for IntOrString {
    fn from(p: Port) -> IntOrString {
        match p {
            Port::Range(a, b) if a == b => IntOrString::Int(a.into()),
            Port::Range(a, b) => IntOrString::Str(format!("{a}:{b}")),
            Port::Named(n) => IntOrString::Str(n),
        }
    }
}

/// The source or destination side of a rule; every field given must match (AND), an empty
/// entity matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntityRule {
    /// Endpoints matching this selector (in the policy's namespace for a NetworkPolicy, unless
    /// `namespaceSelector` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Endpoints in namespaces whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<String>,
    /// Addresses inside any of these CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nets: Vec<String>,
    /// Addresses outside all of these CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_nets: Vec<String>,
    /// Ports (destination side only; require a protocol with ports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
}

/// One rule of a tern policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    #[serde(default)]
    pub source: EntityRule,
    #[serde(default)]
    pub destination: EntityRule,
}

/// Spec of a tern [`NetworkPolicy`] or [`GlobalNetworkPolicy`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicySpec {
    /// Evaluation order, lowest first; absent = after every ordered policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// Endpoints the policy applies to (empty = `all()`).
    #[serde(default)]
    pub selector: String,
    /// Directions; defaulted on parse as Calico does: Ingress when there are no egress
    /// rules, Egress when there are only egress rules, both when both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<PolicyType>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
}

fn default_types(s: &mut NetworkPolicySpec) {
    if s.types.is_empty() {
        if !s.ingress.is_empty() || s.egress.is_empty() {
            s.types.push(PolicyType::Ingress);
        }
        if !s.egress.is_empty() {
            s.types.push(PolicyType::Egress);
        }
    }
}

impl Spec for NetworkPolicySpec {
    const KIND: Kind = Kind::NetworkPolicy;
    fn fill_defaults(&mut self) {
        default_types(self);
    }
}

/// Spec of a [`GlobalNetworkPolicy`]: the same fields as a NetworkPolicy; selectors in rules
/// range over every namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GlobalNetworkPolicySpec(pub NetworkPolicySpec);

impl std::ops::Deref for GlobalNetworkPolicySpec {
    type Target = NetworkPolicySpec;
    fn deref(&self) -> &NetworkPolicySpec {
        &self.0
    }
}

impl Spec for GlobalNetworkPolicySpec {
    const KIND: Kind = Kind::GlobalNetworkPolicy;
    fn fill_defaults(&mut self) {
        default_types(&mut self.0);
    }
}

fn validate_entity(e: &EntityRule, field: &str, dst: bool) -> Result<(), (String, String)> {
    for (name, s) in [
        ("selector", &e.selector),
        ("namespaceSelector", &e.namespace_selector),
    ] {
        if let Some(s) = s {
            Selector::parse(s).map_err(|err| (format!("{field}.{name}"), err.to_string()))?;
        }
    }
    for (name, nets) in [("nets", &e.nets), ("notNets", &e.not_nets)] {
        for (i, n) in nets.iter().enumerate() {
            parse_cidr(n).map_err(|m| (format!("{field}.{name}[{i}]"), m))?;
        }
    }
    if !dst && !e.ports.is_empty() {
        return Err((
            format!("{field}.ports"),
            "source ports are not supported; match destination ports".into(),
        ));
    }
    Ok(())
}

/// Validates a tern policy spec; the error is `(field path, reason)`.
pub fn validate_tern_spec(s: &NetworkPolicySpec) -> Result<(), (String, String)> {
    if let Some(o) = s.order
        && !o.is_finite()
    {
        return Err(("spec.order".into(), format!("{o} is not a finite number")));
    }
    Selector::parse(&s.selector).map_err(|e| ("spec.selector".to_string(), e.to_string()))?;
    for (dir, rules) in [("ingress", &s.ingress), ("egress", &s.egress)] {
        for (i, r) in rules.iter().enumerate() {
            let f = format!("spec.{dir}[{i}]");
            validate_entity(&r.source, &format!("{f}.source"), false)?;
            validate_entity(&r.destination, &format!("{f}.destination"), true)?;
            if !r.destination.ports.is_empty() && !r.protocol.is_some_and(Protocol::has_ports) {
                return Err((
                    format!("{f}.destination.ports"),
                    "ports require protocol TCP, UDP, SCTP or UDPLite".into(),
                ));
            }
        }
    }
    let mut seen = Vec::new();
    for t in &s.types {
        if seen.contains(t) {
            return Err(("spec.types".into(), format!("{t:?} is listed twice")));
        }
        seen.push(*t);
    }
    Ok(())
}

/// A named container port of a workload (`WorkloadEndpoint.spec.ports`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPort {
    pub name: String,
    #[serde(default = "default_tcp")]
    pub protocol: Protocol,
    pub port: u16,
}

fn default_tcp() -> Protocol {
    Protocol::Tcp
}
