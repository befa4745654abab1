//! tern's own policies with Calico v3's fields: [`NetworkPolicy`] (namespaced) and
//! [`GlobalNetworkPolicy`] (cluster-scoped): `order`, `selector`, `types`, rules with
//! `action`, `protocol`, `icmp` / `notICMP` {`type`, `code`}, `source`/`destination`
//! {`selector`, `namespaceSelector`, `nets`, `notNets`, `ports`}.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::kinds::shared::{PolicyType, Port, Protocol};
use crate::limits::{MAX_NETS_PER_RULE, MAX_PORTS_PER_RULE, MAX_RULES_PER_DIRECTION};
use crate::selector::Selector;
use crate::validate::{FieldError, at_most, listed_once, parse_rule_cidr};

/// A tern (Calico-style) namespaced NetworkPolicy.
pub type NetworkPolicy = Document<NetworkPolicySpec>;
/// A tern (Calico-style) cluster-scoped GlobalNetworkPolicy.
pub type GlobalNetworkPolicy = Document<GlobalNetworkPolicySpec>;

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

impl EntityRule {
    /// `nets` and `notNets` as networks, host bits cleared (`10.0.0.1/24` means its network);
    /// an entry that is not a CIDR is an error naming its field (`nets[0]`) and value.
    pub fn parsed_nets(&self) -> Result<(Vec<IpNet>, Vec<IpNet>), FieldError> {
        let parse = |name: &str, nets: &[String]| -> Result<Vec<IpNet>, FieldError> {
            nets.iter()
                .enumerate()
                .map(|(i, n)| parse_rule_cidr(n).map_err(|m| (format!("{name}[{i}]"), m)))
                .collect()
        };
        Ok((
            parse("nets", &self.nets)?,
            parse("notNets", &self.not_nets)?,
        ))
    }
}

/// An ICMP (or ICMPv6) type and code to match, Calico's `ICMPFields`: `type` 0-254, `code`
/// 0-255 and only with a type; absent fields match any value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IcmpFields {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u32>,
}

impl IcmpFields {
    /// The highest ICMP type Calico accepts (255 is reserved).
    pub const MAX_TYPE: u32 = 254;
    /// The highest ICMP code.
    pub const MAX_CODE: u32 = 255;

    fn validate(&self, field: &str) -> Result<(), FieldError> {
        if let Some(t) = self.icmp_type
            && t > Self::MAX_TYPE
        {
            return Err((
                format!("{field}.type"),
                format!("{t} is not an ICMP type 0-{}", Self::MAX_TYPE),
            ));
        }
        match (self.icmp_type, self.code) {
            (_, Some(c)) if c > Self::MAX_CODE => Err((
                format!("{field}.code"),
                format!("{c} is not an ICMP code 0-{}", Self::MAX_CODE),
            )),
            (None, Some(_)) => Err((format!("{field}.code"), "an ICMP code needs a type".into())),
            _ => Ok(()),
        }
    }

    /// Type and code as bytes, once validated (`None` = any).
    pub fn bytes(&self) -> (Option<u8>, Option<u8>) {
        let b = |v: Option<u32>| v.and_then(|v| u8::try_from(v).ok());
        (b(self.icmp_type), b(self.code))
    }
}

/// One rule of a tern policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// ICMP type/code to match (requires protocol ICMP or ICMPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<IcmpFields>,
    /// ICMP type/code the packet must not have (requires protocol ICMP or ICMPv6).
    #[serde(default, rename = "notICMP", skip_serializing_if = "Option::is_none")]
    pub not_icmp: Option<IcmpFields>,
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

/// Defaults of a NetworkPolicy: `types` as Calico derives them.
pub(crate) fn fill_defaults(s: &mut NetworkPolicySpec) {
    default_types(s);
}

/// Defaults of a GlobalNetworkPolicy, as of a NetworkPolicy.
pub(crate) fn fill_global_defaults(s: &mut GlobalNetworkPolicySpec) {
    default_types(&mut s.0);
}

/// The write-time count limits of one side of a rule (see [`validate_tern_counts`]).
fn entity_counts(e: &EntityRule, field: &str) -> Result<(), FieldError> {
    at_most(
        &e.nets,
        MAX_NETS_PER_RULE,
        &format!("{field}.nets"),
        "CIDRs",
    )?;
    at_most(
        &e.not_nets,
        MAX_NETS_PER_RULE,
        &format!("{field}.notNets"),
        "CIDRs",
    )?;
    at_most(
        &e.ports,
        MAX_PORTS_PER_RULE,
        &format!("{field}.ports"),
        "ports",
    )
}

fn validate_entity(e: &EntityRule, field: &str, dst: bool) -> Result<(), FieldError> {
    for (name, s) in [
        ("selector", &e.selector),
        ("namespaceSelector", &e.namespace_selector),
    ] {
        if let Some(s) = s {
            Selector::parse(s).map_err(|err| (format!("{field}.{name}"), err.to_string()))?;
        }
    }
    e.parsed_nets()
        .map_err(|(f, m)| (format!("{field}.{f}"), m))?;
    if !dst && !e.ports.is_empty() {
        return Err((
            format!("{field}.ports"),
            "source ports are not supported; match destination ports".into(),
        ));
    }
    Ok(())
}

/// The count limits of a tern policy, checked on write only (`put_resource`, `ternctl`): a
/// stored policy over them (written before they existed, or straight into the store) is still
/// enforced, because dropping a policy would switch its protection off. Every list is linear
/// to compile, so the resource size bound is what keeps a daemon safe.
pub fn validate_tern_counts(s: &NetworkPolicySpec) -> Result<(), FieldError> {
    for (dir, rules) in [("ingress", &s.ingress), ("egress", &s.egress)] {
        at_most(
            rules,
            MAX_RULES_PER_DIRECTION,
            &format!("spec.{dir}"),
            "rules",
        )?;
        for (i, r) in rules.iter().enumerate() {
            let f = format!("spec.{dir}[{i}]");
            entity_counts(&r.source, &format!("{f}.source"))?;
            entity_counts(&r.destination, &format!("{f}.destination"))?;
        }
    }
    Ok(())
}

/// Validates a tern policy spec's structure (selectors, CIDRs, ports, types); the error is
/// `(field path, reason)`. The count limits are [`validate_tern_counts`], write-time only.
pub fn validate_tern_spec(s: &NetworkPolicySpec) -> Result<(), FieldError> {
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
            for (name, icmp) in [("icmp", &r.icmp), ("notICMP", &r.not_icmp)] {
                if let Some(icmp) = icmp {
                    if !matches!(r.protocol, Some(Protocol::Icmp | Protocol::IcmpV6)) {
                        return Err((
                            format!("{f}.{name}"),
                            "ICMP matches require protocol ICMP or ICMPv6".into(),
                        ));
                    }
                    icmp.validate(&format!("{f}.{name}"))?;
                }
            }
        }
    }
    listed_once(&s.types, "spec.types")
}

/// Checks of a [`NetworkPolicy`] on write and on read; the count limits are
/// [`validate_tern_counts`], write-time only.
pub(crate) fn validate_policy(p: &NetworkPolicy) -> Result<(), FieldError> {
    validate_tern_spec(&p.spec)
}

/// Checks of a [`GlobalNetworkPolicy`] on write and on read, as of a NetworkPolicy.
pub(crate) fn validate_global_policy(p: &GlobalNetworkPolicy) -> Result<(), FieldError> {
    validate_tern_spec(&p.spec.0)
}
