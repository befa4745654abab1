//! The pure policy model: namespaces, endpoints and policies normalised into one rule IR, and
//! the reference evaluator [`PolicySet::allowed`].
//!
//! Semantics (tier-less Calico, which also gives Kubernetes NetworkPolicy semantics):
//! - A policy applies to an endpoint in a direction when its selector matches the endpoint
//!   (only endpoints of its namespace for namespaced policies) and its types include the
//!   direction. Kubernetes policies have order 1000; tern policies without `order` come after
//!   all ordered ones. Policies are evaluated by (order, kind, namespace, name).
//! - An endpoint no policy applies to in a direction allows everything in that direction.
//! - Otherwise rules are evaluated in order: the first matching Allow allows, Deny denies, Log
//!   records and continues, Pass stops policy evaluation and hands the decision to the
//!   endpoint's profile, which in tern always allows (as Calico's per-namespace profiles do).
//!   No matching rule in any applicable policy: deny (default deny for selected endpoints).
//! - A flow is allowed when the source endpoint's egress allows it and the destination
//!   endpoint's ingress allows it; addresses that are not endpoints have no policy.
//! - Named ports are resolved on the destination endpoint (name and protocol must match); a
//!   name no endpoint has matches nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::IpNet;
use tern_model::{
    Action, BadIpNetwork, EndpointPort, GlobalNetworkPolicy, K8sNetworkPolicy, K8sPeer, K8sPort,
    Kind, NetworkPolicy, NetworkPolicySpec, PolicyType, Port, Protocol, Resource, Selector,
    StagedAction, WorkloadEndpoint,
};

use crate::PolicyError;

/// Label Kubernetes puts on every namespace; added to namespaces here so selectors on it work
/// even without a Namespace resource.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// An endpoint's labels. Shared: the pods of one workload carry the same labels, and a
/// [`PolicySet`] keeps one map per distinct label set (at 10,000 pods a map each took 7 MiB
/// of an agent's 35).
pub type Labels = Arc<BTreeMap<String, String>>;

/// A workload endpoint as the policy engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub namespace: String,
    pub name: String,
    /// The node hosting the endpoint.
    pub node: String,
    /// The host-side interface (only meaningful on `node`).
    pub interface: String,
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    /// Named container ports.
    pub ports: Vec<EndpointPort>,
}

impl Endpoint {
    /// The engine's view of a stored WorkloadEndpoint (labels from its metadata), and the
    /// `ipNetworks` entries of the record that are not CIDRs (left out of `ips`).
    pub fn from_workload_endpoint(w: &WorkloadEndpoint) -> (Endpoint, Vec<BadIpNetwork>) {
        let nets = w.ip_networks();
        let ep = Endpoint {
            namespace: w.metadata.namespace.clone().unwrap_or_default(),
            name: w.metadata.name.clone(),
            node: w.spec.node.clone(),
            interface: w.spec.interface_name.clone(),
            labels: Arc::new(w.metadata.labels.clone()),
            ips: nets.nets.iter().map(|n| n.addr()).collect(),
            ports: w.spec.ports.clone(),
        };
        (ep, nets.bad)
    }
}

/// Applies `w` with `upsert` (its readable addresses); the entries left out are the error.
pub(crate) fn upsert_workload_endpoint(
    w: &WorkloadEndpoint,
    upsert: impl FnOnce(Endpoint),
) -> Result<(), PolicyError> {
    let (ep, bad) = Endpoint::from_workload_endpoint(w);
    upsert(ep);
    if bad.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::BadAddresses(bad))
    }
}

/// Which namespaces an endpoint selector ranges over.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NamespaceScope {
    /// Every namespace (GlobalNetworkPolicy selectors).
    Any,
    /// One namespace (the policy's own).
    Named(String),
    /// Namespaces whose labels match.
    Selector(Selector),
}

/// A set of endpoints: a label selector within a namespace scope. Its canonical text names the
/// nftables address set it compiles to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointSelector {
    pub scope: NamespaceScope,
    pub selector: Selector,
}

impl EndpointSelector {
    /// Canonical text (stable across runs; hashed into set names).
    pub fn canonical(&self) -> String {
        match &self.scope {
            NamespaceScope::Any => format!("any|{}", self.selector),
            NamespaceScope::Named(n) => format!("ns={n}|{}", self.selector),
            NamespaceScope::Selector(s) => format!("nssel={s}|{}", self.selector),
        }
    }
}

/// One side (source or destination) of a normalised rule; all given criteria must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Match {
    pub endpoints: Option<EndpointSelector>,
    /// Address in any of these (when non-empty).
    pub nets: Vec<IpNet>,
    /// Address in none of these.
    pub not_nets: Vec<IpNet>,
    /// Destination port in any of these (when non-empty).
    pub ports: Vec<Port>,
}

/// A normalised rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrRule {
    /// The index of the policy's rule (in its direction) this one comes from: a Kubernetes
    /// rule expands into one IR rule per peer and port, and an explanation names the rule
    /// as written.
    pub index: usize,
    pub action: Action,
    pub protocol: Option<Protocol>,
    /// ICMP type and code the packet must have (`None` in a pair = any).
    pub icmp: Option<IcmpMatch>,
    /// ICMP type and code the packet must not have (both, when both are given).
    pub not_icmp: Option<IcmpMatch>,
    pub src: Match,
    pub dst: Match,
}

/// An ICMP / ICMPv6 type and code of a rule (the protocol is the rule's); `None` = any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IcmpMatch {
    pub icmp_type: Option<u8>,
    pub code: Option<u8>,
}

impl IcmpMatch {
    /// Whether an ICMP message of `(type, code)` has this type and code; a flow without an
    /// ICMP type (`None`) has neither.
    pub fn holds(&self, msg: Option<(u8, u8)>) -> bool {
        let eq = |want: Option<u8>, got: Option<u8>| want.is_none_or(|w| got == Some(w));
        eq(self.icmp_type, msg.map(|m| m.0)) && eq(self.code, msg.map(|m| m.1))
    }
}

/// Identity of a policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyKey {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for PolicyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{ns}/{}", self.kind, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

/// A policy normalised to the IR.
#[derive(Debug, Clone, PartialEq)]
pub struct IrPolicy {
    pub key: PolicyKey,
    /// Evaluation order (`f64::INFINITY` when unset).
    pub order: f64,
    /// Endpoints the policy applies to.
    pub applies_to: EndpointSelector,
    /// Ingress rules; `None` when the policy does not apply to ingress.
    pub ingress: Option<Vec<IrRule>>,
    /// Egress rules; `None` when the policy does not apply to egress.
    pub egress: Option<Vec<IrRule>>,
}

impl IrPolicy {
    /// The rules for a direction, if the policy applies to it.
    pub fn rules(&self, dir: Direction) -> Option<&[IrRule]> {
        match dir {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }
}

/// Traffic direction relative to an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

/// A flow to judge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: Protocol,
    /// Destination port (ignored for protocols without ports).
    pub dst_port: u16,
    /// ICMP / ICMPv6 type and code (`None`: not ICMP, or unknown).
    pub icmp: Option<(u8, u8)>,
}

/// An endpoint as a [`PolicySet`] keeps it: one allocation shared by the endpoint map and
/// the named-port index, ordered by (namespace, name) read from the endpoint itself, so at
/// 10,000 pods each name is stored once, not once per map.
#[derive(Debug, Clone)]
struct Kept(Arc<Endpoint>);

/// The order of kept endpoints, (namespace, name); looked up by a borrowed pair, with no
/// copy of the strings (a map keyed by [`Kept`] is searched through `dyn EndpointKey`).
trait EndpointKey {
    fn key(&self) -> (&str, &str);
}

impl EndpointKey for Kept {
    fn key(&self) -> (&str, &str) {
        (&self.0.namespace, &self.0.name)
    }
}

impl EndpointKey for (&str, &str) {
    fn key(&self) -> (&str, &str) {
        *self
    }
}

/// The lookup form of `(namespace, name)`.
fn by_key<'k>(k: &'k (&'k str, &'k str)) -> &'k (dyn EndpointKey + 'k) {
    k
}

impl<'a> std::borrow::Borrow<dyn EndpointKey + 'a> for Kept {
    fn borrow(&self) -> &(dyn EndpointKey + 'a) {
        self
    }
}

impl PartialEq for dyn EndpointKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for dyn EndpointKey + '_ {}

impl PartialOrd for dyn EndpointKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for dyn EndpointKey + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Kept {}

impl PartialOrd for Kept {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kept {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// The whole policy state of a cluster: namespaces, endpoints and policies.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The endpoints by (namespace, name).
    endpoints: BTreeSet<Kept>,
    /// The endpoints with a named port, by port name (the same allocations as `endpoints`): a
    /// named-port set is built from these few instead of from every endpoint.
    named_ports: BTreeMap<String, BTreeSet<Kept>>,
    /// The endpoints by address (the same allocations as `endpoints`), for
    /// [`PolicySet::endpoint_by_ip`]; an address two endpoints claim lists both, in key order.
    by_ip: HashMap<IpAddr, BTreeSet<Kept>>,
    /// One map per distinct label set of the endpoints (see [`Labels`]), with how many
    /// endpoints hold it.
    label_sets: HashMap<Labels, usize>,
    policies: BTreeMap<PolicyKey, IrPolicy>,
    /// The staged policies, by their staged key (`StagedNetworkPolicy/ns/name`): evaluated
    /// by [`PolicySet::pending`], never compiled (the compiler and [`crate::Incremental`]
    /// read [`PolicySet::policies`] only).
    staged: BTreeMap<PolicyKey, StagedPolicy>,
    /// See [`PolicySet::revision`].
    revision: u64,
}

/// The source of [`PolicySet::revision`]s: one counter for the whole process, so two sets
/// (a clone changed on its own, or a set rebuilt from scratch) never share a revision unless
/// they have the same content.
static NEXT_REVISION: AtomicU64 = AtomicU64::new(1);

/// A staged policy as a [`PolicySet`] keeps it.
#[derive(Debug, Clone, PartialEq)]
pub enum StagedPolicy {
    /// `stagedAction: Set`: the policy, keyed and named by its staged kind, replacing the
    /// enforced policy of the same name (or added).
    Set(Box<IrPolicy>),
    /// `stagedAction: Delete`: the enforced policy of the same name left out.
    Delete,
}

impl PolicyKey {
    /// The key of the enforced policy a staged policy's key stages (the key itself for an
    /// enforced policy).
    pub fn enforced(&self) -> PolicyKey {
        PolicyKey {
            kind: self.kind.enforced_of_staged().unwrap_or(self.kind),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The key in evaluation order: a staged policy sorts as the policy it stages.
    pub(crate) fn eval_order(&self) -> (Kind, &Option<String>, &str) {
        (
            self.kind.enforced_of_staged().unwrap_or(self.kind),
            &self.namespace,
            &self.name,
        )
    }
}

fn parse_selector(text: &str, what: &str, key: &PolicyKey) -> Result<Selector, PolicyError> {
    Selector::parse(text).map_err(|e| PolicyError::Invalid {
        policy: key.to_string(),
        reason: format!("{what}: {e}"),
    })
}

impl PolicySet {
    /// An empty set.
    pub fn new() -> PolicySet {
        PolicySet::default()
    }

    /// The set's revision: it changes with every change of the set (namespaces, endpoints,
    /// policies, staged policies), and two sets with the same revision have the same content
    /// (a clone keeps its original's until either changes; every change takes a fresh number
    /// from a process-wide counter; every empty new set is revision 0). What is computed from
    /// a set (an explanation, a flow record's cause) holds as long as its revision does.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Marks a change: a fresh revision.
    fn changed(&mut self) {
        self.revision = NEXT_REVISION.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds or replaces a namespace's labels.
    pub fn upsert_namespace(&mut self, name: &str, mut labels: BTreeMap<String, String>) {
        // Kept with the implicit name label, so a selector reads them without a copy.
        labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.to_string());
        self.namespaces.insert(name.to_string(), labels);
        self.changed();
    }

    /// Removes a namespace (its endpoints keep only the implicit name label).
    pub fn remove_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name).is_some() {
            self.changed();
        }
    }

    /// The labels of a namespace, including [`NAMESPACE_NAME_LABEL`].
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        self.namespace_labels_ref(name).into_owned()
    }

    /// [`PolicySet::namespace_labels`] without a copy for a namespace the set knows.
    fn namespace_labels_ref(&self, name: &str) -> std::borrow::Cow<'_, BTreeMap<String, String>> {
        match self.namespaces.get(name) {
            Some(l) => std::borrow::Cow::Borrowed(l),
            None => std::borrow::Cow::Owned(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                name.to_string(),
            )])),
        }
    }

    /// Whether the namespace scope of `sel` takes namespace `ns`.
    fn in_scope(&self, sel: &EndpointSelector, ns: &str) -> bool {
        match &sel.scope {
            NamespaceScope::Any => true,
            NamespaceScope::Named(n) => ns == n,
            NamespaceScope::Selector(s) => s.matches(&self.namespace_labels_ref(ns)),
        }
    }

    /// The endpoints `sel` selects, in key order. The namespace scope is decided once per
    /// namespace (endpoints are kept by namespace, then name), not once per endpoint: a
    /// policy's peer set over 10,000 endpoints evaluates its namespace selector once per
    /// namespace and its pod selector only inside the namespaces it takes.
    pub fn endpoints_selected<'a>(
        &'a self,
        sel: &'a EndpointSelector,
    ) -> impl Iterator<Item = &'a Endpoint> + 'a {
        let mut current: Option<(&'a str, bool)> = None;
        let range: Box<dyn Iterator<Item = &'a Endpoint> + 'a> = match &sel.scope {
            NamespaceScope::Named(n) => {
                let first = (n.as_str(), "");
                Box::new(
                    self.endpoints
                        .range::<dyn EndpointKey, _>((
                            std::ops::Bound::Included(by_key(&first)),
                            std::ops::Bound::Unbounded,
                        ))
                        .map(|k| &*k.0)
                        .take_while(move |e| e.namespace == *n),
                )
            }
            _ => Box::new(self.endpoints()),
        };
        range.filter(move |e| {
            let taken = match current {
                Some((ns, t)) if ns == e.namespace => t,
                _ => {
                    let t = self.in_scope(sel, &e.namespace);
                    current = Some((&e.namespace, t));
                    t
                }
            };
            taken && sel.selector.matches(&e.labels)
        })
    }

    /// Adds or replaces an endpoint (keyed by namespace and name).
    pub fn upsert_endpoint(&mut self, mut ep: Endpoint) {
        ep.labels = self.intern_labels(ep.labels);
        let ep = Kept(Arc::new(ep));
        if let Some(old) = self.endpoints.replace(ep.clone()) {
            self.forget(&old);
        }
        for p in &ep.0.ports {
            self.named_ports
                .entry(p.name.clone())
                .or_default()
                .replace(ep.clone());
        }
        for ip in &ep.0.ips {
            self.by_ip.entry(*ip).or_default().replace(ep.clone());
        }
        self.changed();
    }

    /// The set's own copy of `labels`: an equal map it already keeps, or `labels`, kept.
    fn intern_labels(&mut self, labels: Labels) -> Labels {
        if let Some((kept, n)) = self.label_sets.get_key_value(&*labels) {
            let kept = kept.clone();
            self.label_sets.insert(kept.clone(), n + 1);
            return kept;
        }
        self.label_sets.insert(labels.clone(), 1);
        labels
    }

    /// One endpoint fewer holds `labels` (a removed or replaced endpoint's); the set forgets
    /// a label set none holds.
    fn release_labels(&mut self, labels: Labels) {
        if let Some(n) = self.label_sets.get_mut(&*labels) {
            *n -= 1;
            if *n == 0 {
                self.label_sets.remove(&*labels);
            }
        }
    }

    /// How many distinct label sets the endpoints have.
    pub fn label_set_count(&self) -> usize {
        self.label_sets.len()
    }

    /// Drops a removed or replaced endpoint from the named-port and address indexes and the
    /// label sets.
    fn forget(&mut self, old: &Kept) {
        for p in &old.0.ports {
            if let Some(kept) = self.named_ports.get_mut(&p.name) {
                kept.remove(old as &dyn EndpointKey);
                if kept.is_empty() {
                    self.named_ports.remove(&p.name);
                }
            }
        }
        for ip in &old.0.ips {
            if let Some(kept) = self.by_ip.get_mut(ip) {
                kept.remove(old as &dyn EndpointKey);
                if kept.is_empty() {
                    self.by_ip.remove(ip);
                }
            }
        }
        self.release_labels(old.0.labels.clone());
    }

    /// Removes an endpoint; true when it existed.
    pub fn remove_endpoint(&mut self, namespace: &str, name: &str) -> bool {
        match self.endpoints.take(by_key(&(namespace, name))) {
            Some(old) => {
                self.forget(&old);
                self.changed();
                true
            }
            None => false,
        }
    }

    /// The endpoints with a named port called `name`.
    pub fn endpoints_with_port<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a Endpoint> {
        self.named_ports
            .get(name)
            .into_iter()
            .flatten()
            .map(|k| &*k.0)
    }

    /// One endpoint by namespace and name.
    pub fn endpoint(&self, namespace: &str, name: &str) -> Option<&Endpoint> {
        self.endpoints
            .get(by_key(&(namespace, name)))
            .map(|k| &*k.0)
    }

    /// One policy by key.
    pub fn policy(&self, key: &PolicyKey) -> Option<&IrPolicy> {
        self.policies.get(key)
    }

    /// Whether a namespace resource is known (with labels of its own).
    pub fn has_namespace(&self, name: &str) -> bool {
        self.namespaces.contains_key(name)
    }

    /// Every endpoint, by (namespace, name).
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter().map(|k| &*k.0)
    }

    /// Every policy, by key.
    pub fn policies(&self) -> impl Iterator<Item = &IrPolicy> {
        self.policies.values()
    }

    /// Puts back a policy's compiled form as it was: a daemon keeps the last good version of
    /// a policy whose stored update it cannot use, since dropping it would switch its
    /// protection off.
    pub fn keep_policy(&mut self, ir: IrPolicy) {
        self.policies.insert(ir.key.clone(), ir);
        self.changed();
    }

    /// Removes a policy; true when it existed.
    pub fn remove_policy(&mut self, key: &PolicyKey) -> bool {
        let removed = self.policies.remove(key).is_some();
        if removed {
            self.changed();
        }
        removed
    }

    /// Adds or replaces whatever `r` is: a policy of any flavour, a Namespace or a
    /// WorkloadEndpoint. Other kinds are ignored (they carry no policy state). A
    /// WorkloadEndpoint with `ipNetworks` entries that are not CIDRs is applied with its other
    /// addresses, and the entries are the error ([`PolicyError::BadAddresses`]).
    pub fn apply(&mut self, r: &Resource) -> Result<(), PolicyError> {
        match r {
            Resource::K8sNetworkPolicy(p) => self.upsert_k8s_policy(p),
            Resource::NetworkPolicy(p) => self.upsert_tern_policy(p),
            Resource::GlobalNetworkPolicy(p) => self.upsert_global_policy(p),
            Resource::Namespace(n) => {
                self.upsert_namespace(&n.metadata.name, n.metadata.labels.clone());
                Ok(())
            }
            Resource::WorkloadEndpoint(w) => {
                upsert_workload_endpoint(w, |ep| self.upsert_endpoint(ep))
            }
            Resource::StagedNetworkPolicy(_)
            | Resource::StagedGlobalNetworkPolicy(_)
            | Resource::StagedKubernetesNetworkPolicy(_) => self.upsert_staged(r),
            _ => Ok(()),
        }
    }

    /// Adds or replaces a staged policy of any flavour (a `Set` validated as its enforced
    /// kind); other resources are ignored.
    pub fn upsert_staged(&mut self, r: &Resource) -> Result<(), PolicyError> {
        let meta = r.metadata();
        let key = PolicyKey {
            kind: r.kind(),
            namespace: r
                .kind()
                .namespaced()
                .then(|| meta.namespace.clone().unwrap_or_default()),
            name: meta.name.clone(),
        };
        let (action, ir) = match r {
            Resource::StagedNetworkPolicy(p) => (
                p.spec.staged_action,
                calico_ir(key.clone(), key.namespace.clone(), &p.spec.enforced()),
            ),
            Resource::StagedGlobalNetworkPolicy(p) => (
                p.spec.staged_action,
                calico_ir(key.clone(), None, &p.spec.enforced()),
            ),
            Resource::StagedKubernetesNetworkPolicy(p) => {
                let doc = K8sNetworkPolicy {
                    api_version: tern_model::K8S_NETWORKING_API_VERSION.to_string(),
                    kind: "NetworkPolicy".to_string(),
                    metadata: p.metadata.clone(),
                    spec: p.spec.enforced(),
                };
                (p.spec.staged_action, k8s_ir(&doc, key.kind))
            }
            _ => return Ok(()),
        };
        let staged = match action {
            StagedAction::Set => StagedPolicy::Set(Box::new(ir?)),
            StagedAction::Delete => StagedPolicy::Delete,
        };
        self.staged.insert(key, staged);
        self.changed();
        Ok(())
    }

    /// Puts a staged policy's kept form back as it was (as [`PolicySet::keep_policy`]); the
    /// key is the staged one.
    pub fn keep_staged(&mut self, key: PolicyKey, staged: StagedPolicy) {
        self.staged.insert(key, staged);
        self.changed();
    }

    /// Removes a staged policy by its staged key; true when it existed.
    pub fn remove_staged(&mut self, key: &PolicyKey) -> bool {
        let removed = self.staged.remove(key).is_some();
        if removed {
            self.changed();
        }
        removed
    }

    /// One staged policy by its staged key.
    pub fn staged_policy(&self, key: &PolicyKey) -> Option<&StagedPolicy> {
        self.staged.get(key)
    }

    /// Every staged policy, by staged key.
    pub fn staged(&self) -> impl Iterator<Item = (&PolicyKey, &StagedPolicy)> {
        self.staged.iter()
    }

    /// Whether any staged policy is kept (nothing can be pending without one).
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Adds or replaces a Kubernetes NetworkPolicy (validated first).
    pub fn upsert_k8s_policy(&mut self, p: &K8sNetworkPolicy) -> Result<(), PolicyError> {
        let ir = k8s_ir(p, Kind::K8sNetworkPolicy)?;
        self.policies.insert(ir.key.clone(), ir);
        self.changed();
        Ok(())
    }

    /// Adds or replaces a tern NetworkPolicy (namespaced).
    pub fn upsert_tern_policy(&mut self, p: &NetworkPolicy) -> Result<(), PolicyError> {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let key = PolicyKey {
            kind: Kind::NetworkPolicy,
            namespace: Some(ns.clone()),
            name: p.metadata.name.clone(),
        };
        self.upsert_calico(key, Some(ns), &p.spec)
    }

    /// Adds or replaces a tern GlobalNetworkPolicy.
    pub fn upsert_global_policy(&mut self, p: &GlobalNetworkPolicy) -> Result<(), PolicyError> {
        let key = PolicyKey {
            kind: Kind::GlobalNetworkPolicy,
            namespace: None,
            name: p.metadata.name.clone(),
        };
        self.upsert_calico(key, None, &p.spec.0)
    }

    fn upsert_calico(
        &mut self,
        key: PolicyKey,
        ns: Option<String>,
        spec: &NetworkPolicySpec,
    ) -> Result<(), PolicyError> {
        let ir = calico_ir(key, ns, spec)?;
        self.policies.insert(ir.key.clone(), ir);
        self.changed();
        Ok(())
    }

    /// Whether an endpoint is in an endpoint selector's set.
    pub fn selects(&self, sel: &EndpointSelector, ep: &Endpoint) -> bool {
        self.in_scope(sel, &ep.namespace) && sel.selector.matches(&ep.labels)
    }

    /// The policies that apply to `ep` in `dir`, in evaluation order.
    pub fn policies_for(&self, ep: &Endpoint, dir: Direction) -> Vec<&IrPolicy> {
        let mut v: Vec<&IrPolicy> = self
            .policies
            .values()
            .filter(|p| p.rules(dir).is_some() && self.selects(&p.applies_to, ep))
            .collect();
        v.sort_by(|a, b| a.order.total_cmp(&b.order).then_with(|| a.key.cmp(&b.key)));
        v
    }

    /// The policies that would apply to `ep` in `dir` were the staged policies in force, in
    /// evaluation order: the enforced ones no staged policy replaces or deletes, and the
    /// staged `Set` ones (sorted as the policy each stages).
    pub fn staged_policies_for(&self, ep: &Endpoint, dir: Direction) -> Vec<&IrPolicy> {
        let overridden: BTreeSet<PolicyKey> = self.staged.keys().map(PolicyKey::enforced).collect();
        let staged = self.staged.values().filter_map(|s| match s {
            StagedPolicy::Set(p) => Some(&**p),
            StagedPolicy::Delete => None,
        });
        let mut v: Vec<&IrPolicy> = self
            .policies
            .values()
            .filter(|p| !overridden.contains(&p.key))
            .chain(staged)
            .filter(|p| p.rules(dir).is_some() && self.selects(&p.applies_to, ep))
            .collect();
        v.sort_by(|a, b| {
            a.order
                .total_cmp(&b.order)
                .then_with(|| a.key.eval_order().cmp(&b.key.eval_order()))
        });
        v
    }

    /// The endpoint owning an address (of two claiming it, the first by namespace and name).
    /// One hash lookup: the set keeps an index by address.
    pub fn endpoint_by_ip(&self, ip: IpAddr) -> Option<&Endpoint> {
        self.by_ip.get(&ip)?.first().map(|k| &*k.0)
    }

    pub(crate) fn side_matches(&self, m: &Match, ip: IpAddr, ep: Option<&Endpoint>) -> bool {
        if let Some(sel) = &m.endpoints
            && !ep.is_some_and(|e| self.selects(sel, e))
        {
            return false;
        }
        if !m.nets.is_empty() && !m.nets.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        !m.not_nets.iter().any(|n| n.contains(&ip))
    }

    pub(crate) fn rule_matches(
        &self,
        r: &IrRule,
        f: &Flow,
        src: Option<&Endpoint>,
        dst: Option<&Endpoint>,
    ) -> bool {
        if r.protocol.is_some_and(|p| p != f.protocol) {
            return false;
        }
        if r.icmp.is_some_and(|m| !m.holds(f.icmp)) || r.not_icmp.is_some_and(|m| m.holds(f.icmp)) {
            return false;
        }
        if !self.side_matches(&r.src, f.src, src) || !self.side_matches(&r.dst, f.dst, dst) {
            return false;
        }
        r.dst.ports.is_empty()
            || r.dst.ports.iter().any(|p| match p {
                Port::Range(lo, hi) => (*lo..=*hi).contains(&f.dst_port),
                Port::Named(n) => dst.is_some_and(|d| {
                    d.ports.iter().any(|cp| {
                        &cp.name == n && cp.protocol == f.protocol && cp.port == f.dst_port
                    })
                }),
            })
    }

    /// The verdict of `ep`'s policies in `dir` for a flow: true = allowed. One evaluator:
    /// this is [`PolicySet::explain_direction`]'s verdict.
    pub fn direction_allows(&self, ep: &Endpoint, dir: Direction, f: &Flow) -> bool {
        self.explain_direction(ep, dir, f).verdict.is_allowed()
    }

    /// The reference verdict for a flow: the source endpoint's egress and the destination
    /// endpoint's ingress must both allow it ([`PolicySet::explain`]'s verdict).
    pub fn allowed(&self, f: &Flow) -> bool {
        self.explain(f).verdict.is_allowed()
    }
}

/// A Kubernetes NetworkPolicy in the IR, keyed by `kind` (its own, or the staged kind).
fn k8s_ir(p: &K8sNetworkPolicy, kind: Kind) -> Result<IrPolicy, PolicyError> {
    let mut p = p.clone();
    tern_model::Spec::fill_defaults(&mut p.spec);
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let key = PolicyKey {
        kind,
        namespace: Some(ns.clone()),
        name: p.metadata.name.clone(),
    };
    tern_model::validate_k8s_spec(&p.spec).map_err(|(f, m)| PolicyError::Invalid {
        policy: key.to_string(),
        reason: format!("{f}: {m}"),
    })?;
    let peer_match = |peer: &K8sPeer| -> Result<Match, PolicyError> {
        if let Some(b) = &peer.ip_block {
            let (cidr, except) = b.nets().map_err(|(f, m)| PolicyError::Invalid {
                policy: key.to_string(),
                reason: format!("ipBlock.{f}: {m}"),
            })?;
            return Ok(Match {
                nets: vec![cidr],
                not_nets: except,
                ..Match::default()
            });
        }
        let scope = match &peer.namespace_selector {
            Some(s) => NamespaceScope::Selector(s.to_selector()),
            None => NamespaceScope::Named(ns.clone()),
        };
        let selector = peer
            .pod_selector
            .as_ref()
            .map_or(Selector::All, |s| s.to_selector());
        Ok(Match {
            endpoints: Some(EndpointSelector { scope, selector }),
            ..Match::default()
        })
    };
    // A rule allows (any peer) x (any port entry); the IR has one protocol per rule, so
    // the product is expanded.
    let expand = |index: usize, peers: &[K8sPeer], ports: &[K8sPort], peer_is_src: bool| {
        let peer_matches: Vec<Match> = if peers.is_empty() {
            vec![Match::default()]
        } else {
            peers.iter().map(peer_match).collect::<Result<_, _>>()?
        };
        let port_specs: Vec<(Option<Protocol>, Vec<Port>)> = if ports.is_empty() {
            vec![(None, Vec::new())]
        } else {
            ports
                .iter()
                .map(|p| {
                    let proto = Protocol::from(p.protocol.unwrap_or_default());
                    let ports = match &p.port {
                        None => Vec::new(),
                        Some(tern_model::IntOrString::Int(n)) => {
                            let lo = *n as u16;
                            let hi = p.end_port.map_or(lo, |e| e as u16);
                            vec![Port::Range(lo, hi)]
                        }
                        Some(tern_model::IntOrString::Str(s)) => vec![Port::Named(s.clone())],
                    };
                    (Some(proto), ports)
                })
                .collect()
        };
        let mut out = Vec::new();
        for m in &peer_matches {
            for (proto, ports) in &port_specs {
                let mut dst = Match {
                    ports: ports.clone(),
                    ..Match::default()
                };
                let mut src = Match::default();
                if peer_is_src {
                    src = m.clone();
                } else {
                    dst.endpoints = m.endpoints.clone();
                    dst.nets = m.nets.clone();
                    dst.not_nets = m.not_nets.clone();
                }
                out.push(IrRule {
                    index,
                    action: Action::Allow,
                    protocol: *proto,
                    icmp: None,
                    not_icmp: None,
                    src,
                    dst,
                });
            }
        }
        Ok::<_, PolicyError>(out)
    };
    // The rules of a direction, (peers, ports) each, when the policy has that type.
    let direction = |ty: PolicyType, rules: Vec<(usize, &[K8sPeer], &[K8sPort])>, peer_is_src| {
        if !p.spec.policy_types.contains(&ty) {
            return Ok(None);
        }
        let mut out = Vec::new();
        for (index, peers, ports) in rules {
            out.extend(expand(index, peers, ports, peer_is_src)?);
        }
        Ok::<_, PolicyError>(Some(out))
    };
    let ingress = direction(
        PolicyType::Ingress,
        p.spec
            .ingress
            .iter()
            .enumerate()
            .map(|(i, r)| (i, &r.from[..], &r.ports[..]))
            .collect(),
        true,
    )?;
    let egress = direction(
        PolicyType::Egress,
        p.spec
            .egress
            .iter()
            .enumerate()
            .map(|(i, r)| (i, &r.to[..], &r.ports[..]))
            .collect(),
        false,
    )?;
    let ir = IrPolicy {
        key: key.clone(),
        order: 1000.0,
        applies_to: EndpointSelector {
            scope: NamespaceScope::Named(ns),
            selector: p.spec.pod_selector.to_selector(),
        },
        ingress,
        egress,
    };
    Ok(ir)
}

/// A validated rule's ICMP fields in the IR.
fn icmp_match(f: tern_model::IcmpFields) -> IcmpMatch {
    let (icmp_type, code) = f.bytes();
    IcmpMatch { icmp_type, code }
}

/// A tern policy in the IR, keyed by `key` (its own kind, or the staged kind).
fn calico_ir(
    key: PolicyKey,
    ns: Option<String>,
    spec: &NetworkPolicySpec,
) -> Result<IrPolicy, PolicyError> {
    let mut spec = spec.clone();
    tern_model::Spec::fill_defaults(&mut spec);
    tern_model::validate_tern_spec(&spec).map_err(|(f, m)| PolicyError::Invalid {
        policy: key.to_string(),
        reason: format!("{f}: {m}"),
    })?;
    let scope_default = || match &ns {
        Some(n) => NamespaceScope::Named(n.clone()),
        None => NamespaceScope::Any,
    };
    let entity = |e: &tern_model::EntityRule, what: &str| -> Result<Match, PolicyError> {
        let nssel = e
            .namespace_selector
            .as_deref()
            .map(|s| parse_selector(s, &format!("{what}.namespaceSelector"), &key))
            .transpose()?;
        let sel = e
            .selector
            .as_deref()
            .map(|s| parse_selector(s, &format!("{what}.selector"), &key))
            .transpose()?;
        let endpoints = match (sel, nssel) {
            (None, None) => None,
            (sel, nssel) => Some(EndpointSelector {
                scope: nssel.map_or_else(scope_default, NamespaceScope::Selector),
                selector: sel.unwrap_or(Selector::All),
            }),
        };
        let (nets, not_nets) = e.parsed_nets().map_err(|(f, m)| PolicyError::Invalid {
            policy: key.to_string(),
            reason: format!("{what}.{f}: {m}"),
        })?;
        Ok(Match {
            endpoints,
            nets,
            not_nets,
            ports: e.ports.clone(),
        })
    };
    let rules = |rs: &[tern_model::Rule], dir: &str| -> Result<Vec<IrRule>, PolicyError> {
        rs.iter()
            .enumerate()
            .map(|(i, r)| {
                Ok(IrRule {
                    index: i,
                    action: r.action,
                    protocol: r.protocol,
                    icmp: r.icmp.map(icmp_match),
                    not_icmp: r.not_icmp.map(icmp_match),
                    src: entity(&r.source, &format!("{dir}[{i}].source"))?,
                    dst: entity(&r.destination, &format!("{dir}[{i}].destination"))?,
                })
            })
            .collect()
    };
    let ingress = if spec.types.contains(&PolicyType::Ingress) {
        Some(rules(&spec.ingress, "ingress")?)
    } else {
        None
    };
    let egress = if spec.types.contains(&PolicyType::Egress) {
        Some(rules(&spec.egress, "egress")?)
    } else {
        None
    };
    let ir = IrPolicy {
        key: key.clone(),
        order: spec.order.unwrap_or(f64::INFINITY),
        applies_to: EndpointSelector {
            scope: scope_default(),
            selector: parse_selector(&spec.selector, "selector", &key)?,
        },
        ingress,
        egress,
    };
    Ok(ir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_model::{EndpointPort, Protocol};

    fn ep(name: &str, ports: &[&str]) -> Endpoint {
        Endpoint {
            namespace: "ns".into(),
            name: name.into(),
            node: "n".into(),
            interface: String::new(),
            labels: Labels::default(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ports: ports
                .iter()
                .map(|p| EndpointPort {
                    name: p.to_string(),
                    protocol: Protocol::Tcp,
                    port: 80,
                })
                .collect(),
        }
    }

    fn with_port(s: &PolicySet, port: &str) -> Vec<String> {
        s.endpoints_with_port(port)
            .map(|e| e.name.clone())
            .collect()
    }

    /// The named-port index follows every upsert and removal.
    #[test]
    fn the_named_port_index_follows_the_endpoints() {
        let mut s = PolicySet::new();
        s.upsert_endpoint(ep("a", &["http", "dns"]));
        s.upsert_endpoint(ep("b", &["http"]));
        s.upsert_endpoint(ep("c", &[]));
        assert_eq!(with_port(&s, "http"), ["a", "b"]);
        assert_eq!(with_port(&s, "dns"), ["a"]);
        s.upsert_endpoint(ep("a", &["web"]));
        assert_eq!(with_port(&s, "http"), ["b"]);
        assert!(with_port(&s, "dns").is_empty());
        assert_eq!(with_port(&s, "web"), ["a"]);
        s.upsert_endpoint(ep("b", &["http"]));
        assert_eq!(with_port(&s, "http"), ["b"]);
        assert!(s.remove_endpoint("ns", "b"));
        assert!(with_port(&s, "http").is_empty());
        assert!(s.named_ports.keys().eq(["web"]));
    }

    /// An endpoint is kept once: the named-port index holds the endpoint map's allocation,
    /// so a replaced endpoint is seen in its new version through either, and a lookup by
    /// name finds it without building a key.
    #[test]
    fn an_endpoint_is_kept_once_for_both_indexes() {
        let mut s = PolicySet::new();
        s.upsert_endpoint(ep("a", &["http"]));
        let mut moved = ep("a", &["http"]);
        moved.node = "n2".into();
        s.upsert_endpoint(moved);
        let by_name = s.endpoint("ns", "a").unwrap();
        let by_port = s.endpoints_with_port("http").next().unwrap();
        assert_eq!(by_port.node, "n2");
        assert!(std::ptr::eq(by_name, by_port));
        assert_eq!(s.endpoints.len(), 1);
        assert!(s.endpoint("ns", "b").is_none());
        assert!(s.endpoint("other", "a").is_none());
    }

    fn labelled(name: &str, labels: &[(&str, &str)]) -> Endpoint {
        let mut e = ep(name, &[]);
        e.labels = Arc::new(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        e
    }

    /// Endpoints with equal labels share one map; a label set goes with its last endpoint.
    #[test]
    fn equal_label_sets_are_kept_once() {
        let mut s = PolicySet::new();
        s.upsert_endpoint(labelled("a", &[("app", "web")]));
        s.upsert_endpoint(labelled("b", &[("app", "web")]));
        s.upsert_endpoint(labelled("c", &[("app", "db")]));
        let (a, b) = (
            s.endpoint("ns", "a").unwrap(),
            s.endpoint("ns", "b").unwrap(),
        );
        assert!(Arc::ptr_eq(&a.labels, &b.labels), "one map for a and b");
        assert_eq!(s.label_set_count(), 2);
        // b relabelled: web is still a's, db now c's and b's.
        s.upsert_endpoint(labelled("b", &[("app", "db")]));
        assert_eq!(s.label_set_count(), 2);
        assert!(Arc::ptr_eq(
            &s.endpoint("ns", "b").unwrap().labels,
            &s.endpoint("ns", "c").unwrap().labels
        ));
        assert!(s.remove_endpoint("ns", "a"));
        assert_eq!(s.label_set_count(), 1, "web went with a");
        // A copy of the set counts on its own.
        let mut copy = s.clone();
        assert!(copy.remove_endpoint("ns", "b"));
        assert!(copy.remove_endpoint("ns", "c"));
        assert_eq!(copy.label_set_count(), 0);
        assert_eq!(s.label_set_count(), 1);
        // The same endpoint upserted again holds its set once.
        s.upsert_endpoint(labelled("c", &[("app", "db")]));
        assert!(s.remove_endpoint("ns", "b"));
        assert!(s.remove_endpoint("ns", "c"));
        assert_eq!(s.label_set_count(), 0);
    }

    fn at(name: &str, ips: &[&str]) -> Endpoint {
        let mut e = ep(name, &[]);
        e.ips = ips.iter().map(|i| i.parse().unwrap()).collect();
        e
    }

    fn owner(s: &PolicySet, ip: &str) -> Option<String> {
        s.endpoint_by_ip(ip.parse().unwrap())
            .map(|e| e.name.clone())
    }

    /// The address index follows every upsert, update and removal, and names what a scan
    /// of the endpoints in key order names (the first owner when two claim an address).
    #[test]
    fn the_address_index_follows_the_endpoints() {
        let mut s = PolicySet::new();
        s.upsert_endpoint(at("a", &["10.0.0.1", "fd00::1"]));
        s.upsert_endpoint(at("b", &["10.0.0.2"]));
        assert_eq!(owner(&s, "10.0.0.1").as_deref(), Some("a"));
        assert_eq!(owner(&s, "fd00::1").as_deref(), Some("a"));
        assert_eq!(owner(&s, "10.0.0.2").as_deref(), Some("b"));
        assert_eq!(owner(&s, "10.0.0.3"), None);
        // a moves to another address: the old one is nobody's.
        s.upsert_endpoint(at("a", &["10.0.0.3"]));
        assert_eq!(owner(&s, "10.0.0.1"), None);
        assert_eq!(owner(&s, "fd00::1"), None);
        assert_eq!(owner(&s, "10.0.0.3").as_deref(), Some("a"));
        // c claims b's address too (a pod replaced before its predecessor left): b first by
        // key; b gone, c.
        s.upsert_endpoint(at("c", &["10.0.0.2"]));
        assert_eq!(owner(&s, "10.0.0.2").as_deref(), Some("b"));
        assert!(s.remove_endpoint("ns", "b"));
        assert_eq!(owner(&s, "10.0.0.2").as_deref(), Some("c"));
        assert!(s.remove_endpoint("ns", "c"));
        assert_eq!(owner(&s, "10.0.0.2"), None);
        assert!(!s.remove_endpoint("ns", "c"));
        assert!(s.by_ip.keys().eq(&["10.0.0.3".parse::<IpAddr>().unwrap()]));
        // A long mixed sequence against the scan.
        let mut x: u32 = 7;
        let mut next = |n: u32| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (x >> 16) % n
        };
        for _ in 0..2_000 {
            let name = format!("e{}", next(12));
            match next(3) {
                0 => {
                    s.remove_endpoint("ns", &name);
                }
                _ => {
                    let ips: Vec<String> = (0..next(3))
                        .map(|_| format!("10.1.0.{}", next(8)))
                        .collect();
                    let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
                    s.upsert_endpoint(at(&name, &ips));
                }
            }
            for i in 0..8 {
                let ip: IpAddr = format!("10.1.0.{i}").parse().unwrap();
                let scan = s.endpoints().find(|e| e.ips.contains(&ip));
                assert_eq!(s.endpoint_by_ip(ip).map(|e| &e.name), scan.map(|e| &e.name));
            }
        }
    }

    /// Every change gives a fresh revision; reads do not; a clone keeps its original's until
    /// either changes, and then they differ.
    #[test]
    fn every_change_moves_the_revision() {
        let mut s = PolicySet::new();
        assert_eq!(s.revision(), 0);
        let mut seen = std::collections::BTreeSet::from([0]);
        let mut fresh = |s: &PolicySet| assert!(seen.insert(s.revision()), "{}", s.revision());
        s.upsert_endpoint(at("a", &["10.0.0.1"]));
        fresh(&s);
        s.upsert_endpoint(at("a", &["10.0.0.2"]));
        fresh(&s);
        s.upsert_namespace("ns", BTreeMap::new());
        fresh(&s);
        let r = s.revision();
        let _ = (
            s.endpoint_by_ip("10.0.0.2".parse().unwrap()),
            s.policies().count(),
        );
        s.remove_namespace("absent");
        assert!(!s.remove_endpoint("ns", "absent"));
        assert_eq!(s.revision(), r, "reads and no-op removals keep it");
        let yaml = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns}\nspec:\n  podSelector: {}\n---\napiVersion: tern.dev/v1\nkind: StagedNetworkPolicy\nmetadata: {name: q, namespace: ns}\nspec:\n  stagedAction: Delete\n";
        let docs = tern_model::parse_documents(yaml, "t.yaml").unwrap();
        for d in &docs {
            s.apply(d).unwrap();
            fresh(&s);
        }
        let copy = s.clone();
        assert_eq!(copy.revision(), s.revision());
        let key = s.policies().next().unwrap().key.clone();
        assert!(s.remove_policy(&key));
        fresh(&s);
        let staged = s.staged().next().unwrap().0.clone();
        assert!(s.remove_staged(&staged));
        fresh(&s);
        s.remove_namespace("ns");
        fresh(&s);
        assert!(s.remove_endpoint("ns", "a"));
        fresh(&s);
        assert_ne!(copy.revision(), s.revision());
    }
}
