//! Why a flow is allowed or denied: the policy evaluator that names its cause.
//!
//! [`PolicySet::explain`] walks, for each direction (egress at the source endpoint, ingress at
//! the destination endpoint), the policies that select the endpoint in evaluation order and
//! stops at the first matching Allow, Deny or Pass rule, as [`crate::model`] defines. It says
//! which policy and which rule (as written: `ingress[0]` is the policy's first ingress rule,
//! however many peers and ports it has) decided, every policy that left a selected endpoint
//! to the default deny, or that no policy selects it. [`PolicySet::allowed`] and
//! [`PolicySet::direction_allows`] are this evaluator's verdict, so there is one.
//!
//! An end that is not an endpoint (a host or an outside address) has no policy: its direction
//! allows with [`Reason::NoPolicy`] and no endpoint.

use serde::{Serialize, Serializer};
use tern_api::flow::{FlowDirection, FlowPending, FlowPolicy, FlowReason, FlowVerdict};
use tern_model::{Action, Kind};

use crate::model::{Direction, Endpoint, Flow, IrPolicy, PolicySet};

/// Allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allowed,
    Denied,
}

impl Verdict {
    /// True for [`Verdict::Allowed`].
    pub fn is_allowed(self) -> bool {
        self == Verdict::Allowed
    }

    fn of(allowed: bool) -> Verdict {
        if allowed {
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }

    /// `allowed` or `denied`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
        }
    }
}

/// What decided a direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// A rule matched: Allow or Pass allows, Deny denies.
    Rule,
    /// Policies select the endpoint in this direction and none of their rules matched.
    DefaultDeny,
    /// No policy selects the endpoint in this direction (or the end is not an endpoint).
    NoPolicy,
}

impl Reason {
    /// `rule`, `default-deny` or `no-policy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rule => "rule",
            Reason::DefaultDeny => "default-deny",
            Reason::NoPolicy => "no-policy",
        }
    }
}

/// `ingress` or `egress`.
pub fn direction_str(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

/// `allow`, `deny`, `pass` or `log`.
pub fn action_str(a: Action) -> &'static str {
    match a {
        Action::Allow => "allow",
        Action::Deny => "deny",
        Action::Pass => "pass",
        Action::Log => "log",
    }
}

/// A rule of a policy as written: its direction and its index among that direction's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleRef {
    pub direction: Direction,
    pub index: usize,
}

impl std::fmt::Display for RuleRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", direction_str(self.direction), self.index)
    }
}

impl Serialize for RuleRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A policy in an explanation, with the rule of it that matched when one did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyRef {
    #[serde(serialize_with = "kind_str")]
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Its evaluation order (absent when unset: after every ordered policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// The rule that matched (absent for a policy that left the endpoint to the default deny).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleRef>,
    /// The matching rule's action.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_action_str"
    )]
    pub action: Option<Action>,
}

impl PolicyRef {
    fn of(p: &IrPolicy, rule: Option<(RuleRef, Action)>) -> PolicyRef {
        PolicyRef {
            kind: p.key.kind,
            namespace: p.key.namespace.clone(),
            name: p.key.name.clone(),
            order: p.order.is_finite().then_some(p.order),
            rule: rule.map(|(r, _)| r),
            action: rule.map(|(_, a)| a),
        }
    }

    /// The policy as a flow record names it.
    pub fn flow_policy(&self) -> FlowPolicy {
        FlowPolicy {
            kind: self.kind.as_str().to_string(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            rule: self.rule.map(|r| r.to_string()),
        }
    }

    /// `Kind/namespace/name` (no namespace for a global policy).
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.kind, self.name),
            None => format!("{}/{}", self.kind, self.name),
        }
    }
}

fn kind_str<S: Serializer>(k: &Kind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(k.as_str())
}

fn opt_action_str<S: Serializer>(a: &Option<Action>, s: S) -> Result<S::Ok, S::Error> {
    match a {
        Some(a) => s.serialize_str(action_str(*a)),
        None => s.serialize_none(),
    }
}

fn dir_str<S: Serializer>(d: &Direction, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(direction_str(*d))
}

/// An endpoint by namespace and (endpoint) name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointRef {
    pub namespace: String,
    pub name: String,
}

/// One direction's verdict and its cause.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DirectionExplanation {
    #[serde(serialize_with = "dir_str")]
    pub direction: Direction,
    /// The endpoint whose policies decide (`None`: the end is not an endpoint).
    pub endpoint: Option<EndpointRef>,
    pub verdict: Verdict,
    pub reason: Reason,
    /// The cause: for [`Reason::Rule`] the deciding policy with its rule; for
    /// [`Reason::DefaultDeny`] every policy that selects the endpoint (no rule); empty for
    /// [`Reason::NoPolicy`].
    pub policies: Vec<PolicyRef>,
    /// Every policy that selects the endpoint in this direction, in evaluation order.
    pub selecting: Vec<PolicyRef>,
    /// Log rules that matched before the decision (they record and go on).
    pub logged: Vec<PolicyRef>,
}

impl DirectionExplanation {
    /// The verdict and its cause in a flow record's terms (`tern_api::flow`): the record's
    /// `verdict`, `reason` and `policies`, or its `pending`.
    pub fn flow_cause(&self) -> FlowPending {
        FlowPending {
            verdict: match self.verdict {
                Verdict::Allowed => FlowVerdict::Allowed,
                Verdict::Denied => FlowVerdict::Denied,
            },
            reason: match self.reason {
                Reason::Rule => FlowReason::Rule,
                Reason::DefaultDeny => FlowReason::DefaultDeny,
                Reason::NoPolicy => FlowReason::NoPolicy,
            },
            policies: self.policies.iter().map(PolicyRef::flow_policy).collect(),
        }
    }
}

impl From<FlowDirection> for Direction {
    fn from(d: FlowDirection) -> Direction {
        match d {
            FlowDirection::Ingress => Direction::Ingress,
            FlowDirection::Egress => Direction::Egress,
        }
    }
}

/// Both directions of a flow and the overall verdict (both must allow).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub verdict: Verdict,
    pub egress: DirectionExplanation,
    pub ingress: DirectionExplanation,
}

impl PolicySet {
    /// Explains a flow: the source endpoint's egress and the destination endpoint's ingress.
    pub fn explain(&self, f: &Flow) -> Explanation {
        let src = self.endpoint_by_ip(f.src);
        let dst = self.endpoint_by_ip(f.dst);
        let egress = self.decide(src, Direction::Egress, f, src, dst, false);
        let ingress = self.decide(dst, Direction::Ingress, f, src, dst, false);
        Explanation {
            verdict: Verdict::of(egress.verdict.is_allowed() && ingress.verdict.is_allowed()),
            egress,
            ingress,
        }
    }

    /// Explains one direction of a flow at `ep`.
    pub fn explain_direction(
        &self,
        ep: &Endpoint,
        dir: Direction,
        f: &Flow,
    ) -> DirectionExplanation {
        let src = self.endpoint_by_ip(f.src);
        let dst = self.endpoint_by_ip(f.dst);
        self.decide(Some(ep), dir, f, src, dst, false)
    }

    /// What the staged policies would decide for one direction of a flow (egress at the
    /// source endpoint, ingress at the destination endpoint), applied on top of the enforced
    /// ones (a `Set` replaces the enforced policy of the same name or adds itself, a `Delete`
    /// removes it): `Some` only when its verdict or cause differs from the enforced one. A
    /// staged policy in the cause is named by its staged kind. `None` without staged
    /// policies, and for an end that is not an endpoint.
    pub fn pending_direction(&self, f: &Flow, dir: Direction) -> Option<DirectionExplanation> {
        if !self.has_staged() {
            return None;
        }
        let src = self.endpoint_by_ip(f.src);
        let dst = self.endpoint_by_ip(f.dst);
        let ep = match dir {
            Direction::Egress => src,
            Direction::Ingress => dst,
        }?;
        let enforced = self.decide(Some(ep), dir, f, src, dst, false);
        self.staged_if_other(ep, f, src, dst, &enforced)
    }

    /// [`PolicySet::pending_direction`] of `enforced`'s direction, with the enforced
    /// evaluation already done: `enforced` is that direction's explanation of the same flow
    /// ([`PolicySet::explain_direction`] at the flow's endpoint in that direction, or a
    /// direction of [`PolicySet::explain`]), so only the staged policies are evaluated.
    /// `None` without staged policies, and when `enforced` has no endpoint.
    pub fn pending_direction_given(
        &self,
        f: &Flow,
        enforced: &DirectionExplanation,
    ) -> Option<DirectionExplanation> {
        if !self.has_staged() {
            return None;
        }
        let at = enforced.endpoint.as_ref()?;
        let ep = self.endpoint(&at.namespace, &at.name)?;
        let src = self.endpoint_by_ip(f.src);
        let dst = self.endpoint_by_ip(f.dst);
        self.staged_if_other(ep, f, src, dst, enforced)
    }

    /// [`PolicySet::pending_direction`] as a flow record's `pending` (`tern_api::flow`): what
    /// the flows service puts in [`tern_api::flow::FlowRecord::pending`].
    pub fn pending(&self, f: &Flow, dir: Direction) -> Option<FlowPending> {
        self.pending_direction(f, dir).map(|e| e.flow_cause())
    }

    /// [`PolicySet::pending_direction_given`] as a flow record's `pending`: the flows service
    /// has the enforced explanation already (it names the record's cause).
    pub fn pending_given(&self, f: &Flow, enforced: &DirectionExplanation) -> Option<FlowPending> {
        self.pending_direction_given(f, enforced)
            .map(|e| e.flow_cause())
    }

    /// The staged evaluation at `ep` in `enforced`'s direction, when it differs from
    /// `enforced`.
    fn staged_if_other(
        &self,
        ep: &Endpoint,
        f: &Flow,
        src: Option<&Endpoint>,
        dst: Option<&Endpoint>,
        enforced: &DirectionExplanation,
    ) -> Option<DirectionExplanation> {
        let staged = self.decide(Some(ep), enforced.direction, f, src, dst, true);
        let same = staged.verdict == enforced.verdict
            && staged.reason == enforced.reason
            && staged.policies == enforced.policies;
        (!same).then_some(staged)
    }

    /// The evaluation itself, with the flow's ends already resolved to endpoints; with the
    /// staged policies on top when `staged`.
    fn decide(
        &self,
        ep: Option<&Endpoint>,
        dir: Direction,
        f: &Flow,
        src: Option<&Endpoint>,
        dst: Option<&Endpoint>,
        staged: bool,
    ) -> DirectionExplanation {
        let pols = ep
            .map(|e| {
                if staged {
                    self.staged_policies_for(e, dir)
                } else {
                    self.policies_for(e, dir)
                }
            })
            .unwrap_or_default();
        let mut out = DirectionExplanation {
            direction: dir,
            endpoint: ep.map(|e| EndpointRef {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
            }),
            verdict: Verdict::Allowed,
            reason: Reason::NoPolicy,
            policies: Vec::new(),
            selecting: pols.iter().map(|p| PolicyRef::of(p, None)).collect(),
            logged: Vec::new(),
        };
        if pols.is_empty() {
            return out;
        }
        for p in &pols {
            for r in p.rules(dir).unwrap_or_default() {
                if !self.rule_matches(r, f, src, dst) {
                    continue;
                }
                let at = RuleRef {
                    direction: dir,
                    index: r.index,
                };
                let hit = PolicyRef::of(p, Some((at, r.action)));
                match r.action {
                    Action::Log => {
                        out.logged.push(hit);
                        continue;
                    }
                    // Pass hands the decision to the endpoint's profile, which allows.
                    Action::Allow | Action::Pass => out.verdict = Verdict::Allowed,
                    Action::Deny => out.verdict = Verdict::Denied,
                }
                out.reason = Reason::Rule;
                out.policies.push(hit);
                return out;
            }
        }
        out.verdict = Verdict::Denied;
        out.reason = Reason::DefaultDeny;
        out.policies = out.selecting.clone();
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tern_model::Protocol;

    use super::*;

    fn ep(ns: &str, name: &str, ip: &str, app: &str) -> Endpoint {
        Endpoint {
            namespace: ns.into(),
            name: name.into(),
            node: "n1".into(),
            interface: format!("v{name}"),
            labels: Arc::new([("app".to_string(), app.to_string())].into()),
            ips: vec![ip.parse().unwrap()],
            ports: Vec::new(),
        }
    }

    fn set(yaml: &str) -> PolicySet {
        let mut s = PolicySet::new();
        s.upsert_endpoint(ep("d", "a", "10.0.0.1", "a"));
        s.upsert_endpoint(ep("d", "b", "10.0.0.2", "b"));
        s.upsert_endpoint(ep("d", "c", "10.0.0.3", "c"));
        for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
            s.apply(&r).unwrap();
        }
        s
    }

    fn tcp(src: &str, dst: &str, port: u16) -> Flow {
        Flow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: Protocol::Tcp,
            dst_port: port,
            icmp: None,
        }
    }

    fn rule(e: &DirectionExplanation) -> Vec<String> {
        e.policies
            .iter()
            .map(|p| match p.rule {
                Some(r) => format!("{} {r}", p.name),
                None => p.name.clone(),
            })
            .collect()
    }

    const K8S: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: d}\nspec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: a}}}]\n    ports: [{port: 80}]\n  - from: [{podSelector: {matchLabels: {app: x}}}, {podSelector: {matchLabels: {app: c}}}]\n    ports: [{port: 80}, {port: 81}]\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: also, namespace: d}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n";

    /// A Kubernetes rule of several peers and ports is named by its index as written.
    #[test]
    fn a_kubernetes_rule_is_named_as_written() {
        let s = set(K8S);
        let e = s.explain(&tcp("10.0.0.3", "10.0.0.2", 81));
        assert_eq!(e.verdict, Verdict::Allowed);
        assert_eq!(e.ingress.reason, Reason::Rule);
        assert_eq!(rule(&e.ingress), ["web ingress[1]"]);
        assert_eq!(e.ingress.policies[0].action, Some(Action::Allow));
        // `also` (namespace d, name before `web`) selects b too, at the same order.
        let names: Vec<_> = e.ingress.selecting.iter().map(|p| &p.name).collect();
        assert_eq!(names, ["also", "web"]);
        assert_eq!(e.egress.reason, Reason::NoPolicy);
        assert!(e.egress.selecting.is_empty());
        let e = s.explain(&tcp("10.0.0.1", "10.0.0.2", 80));
        assert_eq!(rule(&e.ingress), ["web ingress[0]"]);
    }

    /// No rule matched: every selecting policy is the cause, with no rule.
    #[test]
    fn a_default_deny_names_every_selecting_policy() {
        let s = set(K8S);
        let e = s.explain(&tcp("10.0.0.1", "10.0.0.2", 81));
        assert_eq!(e.verdict, Verdict::Denied);
        assert_eq!(e.ingress.reason, Reason::DefaultDeny);
        assert_eq!(rule(&e.ingress), ["also", "web"]);
        // c is selected by `also` only.
        let e = s.explain(&tcp("10.0.0.1", "10.0.0.3", 80));
        assert_eq!(rule(&e.ingress), ["also"]);
        // An outside source has no egress policy and no endpoint.
        let e = s.explain(&tcp("192.0.2.1", "10.0.0.3", 80));
        assert_eq!(e.egress.endpoint, None);
        assert_eq!(e.egress.reason, Reason::NoPolicy);
        assert_eq!(e.ingress.reason, Reason::DefaultDeny);
    }

    const TERN: &str = "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: first}\nspec:\n  order: 10\n  selector: app == 'b'\n  ingress:\n  - action: Log\n  - action: Pass\n    source: {selector: app == 'a'}\n---\napiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: second, namespace: d}\nspec:\n  order: 20\n  selector: all()\n  ingress:\n  - action: Deny\n    source: {selector: app == 'c'}\n";

    /// Order decides; Log rules are passed over and listed; Pass allows (the profile).
    #[test]
    fn order_log_pass_and_deny() {
        let s = set(TERN);
        let e = s.explain(&tcp("10.0.0.1", "10.0.0.2", 80));
        assert_eq!(e.verdict, Verdict::Allowed);
        assert_eq!(rule(&e.ingress), ["first ingress[1]"]);
        assert_eq!(e.ingress.policies[0].action, Some(Action::Pass));
        assert_eq!(e.ingress.logged.len(), 1);
        assert_eq!(e.ingress.logged[0].rule.unwrap().to_string(), "ingress[0]");
        let e = s.explain(&tcp("10.0.0.3", "10.0.0.2", 80));
        assert_eq!(e.verdict, Verdict::Denied);
        assert_eq!(rule(&e.ingress), ["second ingress[0]"]);
        assert_eq!(e.ingress.policies[0].action, Some(Action::Deny));
        // a -> c: only `second` selects c, and its one rule does not match a.
        let e = s.explain(&tcp("10.0.0.1", "10.0.0.3", 80));
        assert_eq!(e.ingress.reason, Reason::DefaultDeny);
        assert_eq!(rule(&e.ingress), ["second"]);
        assert!(e.ingress.logged.is_empty());
    }

    /// The JSON shape issue 21 names: verdict, reason, policies of {kind, namespace, name, rule}.
    #[test]
    fn the_json_shape_is_pinned() {
        let s = set(TERN);
        let e = s.explain(&tcp("10.0.0.3", "10.0.0.2", 80));
        let got = serde_json::to_value(&e).unwrap();
        let want = serde_json::json!({
            "verdict": "denied",
            "egress": {
                "direction": "egress",
                "endpoint": {"namespace": "d", "name": "c"},
                "verdict": "allowed",
                "reason": "no-policy",
                "policies": [],
                "selecting": [],
                "logged": [],
            },
            "ingress": {
                "direction": "ingress",
                "endpoint": {"namespace": "d", "name": "b"},
                "verdict": "denied",
                "reason": "rule",
                "policies": [{"kind": "NetworkPolicy", "namespace": "d", "name": "second",
                    "order": 20.0, "rule": "ingress[0]", "action": "deny"}],
                "selecting": [
                    {"kind": "GlobalNetworkPolicy", "name": "first", "order": 10.0},
                    {"kind": "NetworkPolicy", "namespace": "d", "name": "second", "order": 20.0},
                ],
                "logged": [{"kind": "GlobalNetworkPolicy", "name": "first", "order": 10.0,
                    "rule": "ingress[0]", "action": "log"}],
            },
        });
        assert_eq!(got, want);
    }
}
