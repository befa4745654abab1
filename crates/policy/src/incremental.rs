//! Incremental compilation: the desired `inet tern` ruleset of one node kept up to date change
//! by change, and the [`TableChange`]s (one transaction: a netlink batch, or their `nft -f`
//! [`Script`]) that bring the kernel from the last applied state to it.
//!
//! What is compiled is exactly what [`crate::compile()`] puts in the table: the chains of the
//! *active* policies only, those that select at least one local endpoint (as Calico's Felix
//! renders only policies that apply to a local endpoint), one per direction the policy has
//! rules for, since each such chain is jumped to from the endpoint chain of every local
//! endpoint the policy selects; and the address sets those chains use. A policy selecting no
//! local endpoint (on a large cluster: most policies on most nodes) costs the node nothing but
//! its entry in the [`PolicySet`]: no chain, no set, no work when endpoints change. Every policy
//! stays in [`Incremental::policy_set`] all the same (a daemon keeps last good versions there).
//!
//! Cost model (what makes a pod joining a selected set cheap at 1,000 policies x 1,000
//! endpoints): every compiled address set remembers what it holds ([`SetSource`]), so an
//! endpoint change re-evaluates each set of the active policies for that endpoint only, plus
//! (for a local endpoint) which policies select it and its own chains. A remote endpoint never
//! touches an inactive policy. A policy becomes active when the first local endpoint it selects
//! appears (its chains and the sets they use are compiled once, with full membership) and
//! inactive when the last one goes (its chains go, and the sets no other active policy uses).
//! A policy change recompiles that policy's chains (if it is active) and the chains of the
//! local endpoints it selected before or selects now. A namespace change (labels feed namespace
//! selectors) rebuilds everything, then applies only what differs. Deltas only touch the
//! chains and sets that changed since the last commit ("dirty"), so their size and the kernel's
//! work are O(change).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tern_model::{Kind, Resource};
use tern_nft::{
    Chain, Element, ElementChange, ElementOrder, Key, Pair, Ruleset, Set, TableChange, Verdict,
};

use crate::PolicyError;
use crate::compile::{
    Compiler, FlowLog, SetSource, endpoint_chain, endpoint_map, endpoint_parts, endpoint_target,
    policy_key_chain,
};
use crate::model::{Direction, Endpoint, PolicyKey, PolicySet};

const DIRS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

/// An nft script and whether it is a full resync (delete and re-create the table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub text: String,
    pub full: bool,
}

/// The pending change as table changes, in the order one transaction applies them: a delta,
/// or (`full`) the full resync that deletes and re-creates the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    pub changes: Vec<TableChange>,
    pub full: bool,
}

/// The incrementally maintained policy state of one node.
#[derive(Debug, Clone)]
pub struct Incremental {
    node: String,
    set: PolicySet,
    /// Desired policy chains and sets.
    rs: Ruleset,
    /// Chains and sets of other users of the table (natOutgoing), rendered with ours.
    extra: Ruleset,
    /// What each set of the active policies' chains holds: the sets an endpoint change
    /// re-evaluates.
    sources: BTreeMap<String, SetSource>,
    /// The sets each active policy's chains use.
    policy_sets: HashMap<PolicyKey, BTreeSet<String>>,
    /// How many active policies use each set.
    set_refs: HashMap<String, usize>,
    /// The active policies: how many local endpoints each selects (never 0).
    selected: HashMap<PolicyKey, usize>,
    /// Fast-path sets (shared by content) and how many endpoint chains look each up.
    fp_refs: HashMap<String, usize>,
    /// The fast-path sets each local endpoint chain looks up.
    ep_fp: HashMap<String, Vec<String>>,
    /// What the kernel holds (merged), as of the last commit; None = unknown: full resync.
    applied: Option<Ruleset>,
    dirty_chains: BTreeSet<String>,
    dirty_sets: BTreeSet<String>,
    /// Flow records on (the NFLOG group) or off, as [`crate::compile_with`].
    log: Option<FlowLog>,
}

/// Marks dirty (in `dirty`: chains, sets) every chain and set that differs between `old` and
/// `new`, present in either.
fn mark_changes(
    dirty: (&mut BTreeSet<String>, &mut BTreeSet<String>),
    old: &Ruleset,
    new: &Ruleset,
) {
    fn changed<V: PartialEq>(
        old: &BTreeMap<String, V>,
        new: &BTreeMap<String, V>,
        dirty: &mut BTreeSet<String>,
    ) {
        for n in old.keys().chain(new.keys()) {
            if old.get(n) != new.get(n) {
                dirty.insert(n.clone());
            }
        }
    }
    changed(&old.chains, &new.chains, dirty.0);
    changed(&old.sets, &new.sets, dirty.1);
}

fn is_local(ep: &Endpoint, node: &str) -> bool {
    ep.node == node && !ep.interface.is_empty()
}

fn map_key(ep: &Endpoint) -> Key {
    Key::Ifname(ep.interface.clone())
}

impl Incremental {
    /// The state of `node` for an initial policy set (compiled in one pass).
    pub fn new(node: &str, set: PolicySet) -> Incremental {
        Incremental::with_flow_log(node, set, None)
    }

    /// [`Incremental::new`] with flow records on (`log`) or off, compiled once.
    pub fn with_flow_log(node: &str, set: PolicySet, log: Option<FlowLog>) -> Incremental {
        let mut inc = Incremental {
            node: node.to_string(),
            set,
            rs: Ruleset::new(),
            extra: Ruleset::new(),
            sources: BTreeMap::new(),
            policy_sets: HashMap::new(),
            set_refs: HashMap::new(),
            selected: HashMap::new(),
            fp_refs: HashMap::new(),
            ep_fp: HashMap::new(),
            applied: None,
            dirty_chains: BTreeSet::new(),
            dirty_sets: BTreeSet::new(),
            log,
        };
        inc.rebuild();
        inc
    }

    /// The node this state is for.
    /// Turns flow records on (`Some`: the NFLOG group) or off, recompiling what changes.
    pub fn set_flow_log(&mut self, log: Option<FlowLog>) {
        if self.log != log {
            self.log = log;
            self.rebuild();
        }
    }

    /// Whether flow records are on, and their NFLOG group.
    pub fn flow_log(&self) -> Option<FlowLog> {
        self.log
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The policy model.
    pub fn policy_set(&self) -> &PolicySet {
        &self.set
    }

    /// Whether a policy is active: it selects a local endpoint, so its chains are compiled.
    pub fn is_active(&self, key: &PolicyKey) -> bool {
        self.selected.contains_key(key)
    }

    /// Number of active policies (see [`Self::is_active`]).
    pub fn active_policies(&self) -> usize {
        self.selected.len()
    }

    /// Names of the address sets the active policies' chains use: the sets an endpoint change
    /// re-evaluates.
    pub fn tracked_sets(&self) -> impl Iterator<Item = &str> {
        self.sources.keys().map(String::as_str)
    }

    /// The desired table: policy chains and sets merged with the other users' ([`Self::set_extra`]).
    pub fn desired(&self) -> Ruleset {
        let mut r = self.rs.clone();
        r.merge(self.extra.clone());
        r
    }

    /// The other users' chains and sets, as last given to [`Self::set_extra`].
    pub fn extra(&self) -> &Ruleset {
        &self.extra
    }

    /// Number of chains and sets changed since the last commit.
    pub fn pending(&self) -> usize {
        self.dirty_chains.len() + self.dirty_sets.len()
    }

    /// Replaces the chains and sets other components own in the shared table.
    pub fn set_extra(&mut self, extra: Ruleset) {
        mark_changes(
            (&mut self.dirty_chains, &mut self.dirty_sets),
            &self.extra,
            &extra,
        );
        self.extra = extra;
    }

    /// Recompiles everything from the policy model and marks what differs. Used at start, on
    /// namespace changes and by the periodic resync.
    pub fn rebuild(&mut self) {
        let mut fp_refs: HashMap<String, usize> = HashMap::new();
        let mut ep_fp: HashMap<String, Vec<String>> = HashMap::new();
        let local: Vec<&Endpoint> = self
            .set
            .endpoints()
            .filter(|e| is_local(e, &self.node))
            .collect();
        let mut selected = HashMap::new();
        for p in self.set.policies() {
            let n = local
                .iter()
                .filter(|e| self.set.selects(&p.applies_to, e))
                .count();
            if n > 0 {
                selected.insert(p.key.clone(), n);
            }
        }
        let mut c = Compiler::new(&self.set);
        c.log = self.log;
        c.base();
        let mut policy_sets: HashMap<PolicyKey, BTreeSet<String>> = HashMap::new();
        let mut sources = BTreeMap::new();
        for p in self
            .set
            .policies()
            .filter(|p| selected.contains_key(&p.key))
        {
            let mut used = BTreeSet::new();
            for dir in DIRS {
                if p.rules(dir).is_none() {
                    continue;
                }
                let rules = c.policy_rules(p, dir);
                c.rs.chains
                    .insert(policy_key_chain(&p.key, dir), Chain::regular(rules));
                for (name, src) in std::mem::take(&mut c.used) {
                    used.insert(name.clone());
                    sources.insert(name, src);
                }
            }
            if !used.is_empty() {
                policy_sets.insert(p.key.clone(), used);
            }
        }
        for ep in local {
            for dir in DIRS {
                let pols = self.set.policies_for(ep, dir);
                let parts = endpoint_parts(&pols, dir, self.log);
                let names: Vec<String> = parts.sets.iter().map(|(n, _)| n.clone()).collect();
                for n in &names {
                    *fp_refs.entry(n.clone()).or_insert(0) += 1;
                }
                if !names.is_empty() {
                    ep_fp.insert(endpoint_chain(ep, dir), names);
                }
                c.rs.sets.extend(parts.sets);
                let target = endpoint_target(ep, dir, parts.chain.is_some(), self.log);
                if let Some(chain) = parts.chain {
                    c.rs.chains.insert(endpoint_chain(ep, dir), chain);
                }
                if let (Some(t), Some(m)) = (target, c.rs.sets.get_mut(endpoint_map(dir))) {
                    m.insert_mapping(map_key(ep), Verdict::Jump(t));
                }
            }
        }
        crate::compile::sync_forward_chain(&mut c.rs);
        let new = c.rs;
        mark_changes(
            (&mut self.dirty_chains, &mut self.dirty_sets),
            &self.rs,
            &new,
        );
        let mut refs = HashMap::new();
        for names in policy_sets.values() {
            for n in names {
                *refs.entry(n.clone()).or_insert(0) += 1;
            }
        }
        self.rs = new;
        self.fp_refs = fp_refs;
        self.ep_fp = ep_fp;
        self.sources = sources;
        self.policy_sets = policy_sets;
        self.set_refs = refs;
        self.selected = selected;
    }

    fn put_chain(&mut self, name: String, chain: Option<Chain>) {
        let changed = self.rs.chains.get(&name) != chain.as_ref();
        if !changed {
            return;
        }
        match chain {
            Some(c) => self.rs.chains.insert(name.clone(), c),
            None => self.rs.chains.remove(&name),
        };
        self.dirty_chains.insert(name);
    }

    fn put_set(&mut self, name: String, set: Option<Set>) {
        if self.rs.sets.get(&name) == set.as_ref() {
            return;
        }
        match set {
            Some(s) => self.rs.sets.insert(name.clone(), s),
            None => self.rs.sets.remove(&name),
        };
        self.dirty_sets.insert(name);
    }

    /// Records the fast-path sets endpoint chain `chain` looks up: sets new to the table are
    /// created, sets no chain looks up any more are deleted.
    fn set_endpoint_fast_path(&mut self, chain: String, sets: Vec<(String, Set)>) {
        let names: Vec<String> = sets.iter().map(|(n, _)| n.clone()).collect();
        for (name, set) in sets {
            let refs = self.fp_refs.entry(name.clone()).or_insert(0);
            *refs += 1;
            if *refs == 1 {
                self.put_set(name, Some(set));
            }
        }
        let old = if names.is_empty() {
            self.ep_fp.remove(&chain)
        } else {
            self.ep_fp.insert(chain, names)
        };
        for name in old.unwrap_or_default() {
            let Some(refs) = self.fp_refs.get_mut(&name) else {
                continue;
            };
            *refs -= 1;
            if *refs == 0 {
                self.fp_refs.remove(&name);
                self.put_set(name, None);
            }
        }
    }

    fn put_map_entry(&mut self, map: &str, key: Key, target: Option<String>) {
        let Some(m) = self.rs.sets.get_mut(map) else {
            return;
        };
        let before = m.elements.get(&key).cloned();
        match target {
            Some(t) => m.insert_mapping(key.clone(), Verdict::Jump(t)),
            None => {
                m.elements.remove(&key);
            }
        }
        if m.elements.get(&key) != before.as_ref() {
            self.dirty_sets.insert(map.to_string());
            if crate::compile::sync_forward_chain(&mut self.rs) {
                self.dirty_chains
                    .insert(crate::compile::FORWARD_CHAIN.to_string());
            }
        }
    }

    /// Moves the set elements `old` contributed to the ones `new` contributes, in the sets of
    /// the active policies (the only sets there are).
    fn update_members(&mut self, old: Option<&Endpoint>, new: Option<&Endpoint>) {
        for (name, src) in &self.sources {
            let before = old.map(|e| src.elements(&self.set, e)).unwrap_or_default();
            let after = new.map(|e| src.elements(&self.set, e)).unwrap_or_default();
            if before == after {
                continue;
            }
            let Some(s) = self.rs.sets.get_mut(name) else {
                continue;
            };
            for e in before.iter().filter(|e| !after.contains(e)) {
                s.elements.remove(e);
            }
            for e in after {
                s.insert(e);
            }
            self.dirty_sets.insert(name.clone());
        }
    }

    /// Counts a local endpoint that went (`old`) and one that came (`new`) in the number of
    /// local endpoints each policy selects, then compiles the policies this made active and
    /// removes the chains of those it made inactive. O(policies) selector evaluations, and
    /// only for local endpoints.
    fn update_selected(&mut self, old: Option<&Endpoint>, new: Option<&Endpoint>) {
        let old = old.filter(|o| is_local(o, &self.node));
        let new = new.filter(|n| is_local(n, &self.node));
        if old.is_none() && new.is_none() || old == new {
            return;
        }
        let mut flipped = Vec::new();
        for p in self.set.policies() {
            let before = old.is_some_and(|o| self.set.selects(&p.applies_to, o));
            let after = new.is_some_and(|n| self.set.selects(&p.applies_to, n));
            match (before, after) {
                (false, true) => {
                    let n = self.selected.entry(p.key.clone()).or_insert(0);
                    *n += 1;
                    if *n == 1 {
                        flipped.push(p.key.clone());
                    }
                }
                (true, false) => {
                    let Some(n) = self.selected.get_mut(&p.key) else {
                        continue;
                    };
                    *n -= 1;
                    if *n == 0 {
                        self.selected.remove(&p.key);
                        flipped.push(p.key.clone());
                    }
                }
                _ => {}
            }
        }
        for key in flipped {
            self.sync_policy(&key);
        }
    }

    /// Rebuilds a local endpoint's chains and map entries (or removes them when `ep` is gone),
    /// activating and deactivating the policies it makes start or stop selecting a local
    /// endpoint.
    fn update_local(&mut self, old: Option<&Endpoint>, new: Option<&Endpoint>) {
        self.update_selected(old, new);
        let node = self.node.clone();
        if let Some(o) = old.filter(|o| is_local(o, &node))
            && new.is_none_or(|n| !is_local(n, &node) || n.interface != o.interface)
        {
            for dir in DIRS {
                self.put_map_entry(endpoint_map(dir), map_key(o), None);
                let chain = endpoint_chain(o, dir);
                self.put_chain(chain.clone(), None);
                self.set_endpoint_fast_path(chain, Vec::new());
            }
        }
        let Some(n) = new.filter(|n| is_local(n, &node)) else {
            return;
        };
        for dir in DIRS {
            let parts = endpoint_parts(&self.set.policies_for(n, dir), dir, self.log);
            self.set_endpoint_fast_path(endpoint_chain(n, dir), parts.sets);
            let name = endpoint_chain(n, dir);
            let target = endpoint_target(n, dir, parts.chain.is_some(), self.log);
            // Chain before map entry: the delta declares and fills the chain first.
            self.put_chain(name, parts.chain);
            self.put_map_entry(endpoint_map(dir), map_key(n), target);
        }
    }

    /// Adds or replaces an endpoint: one evaluation of each set of the active policies, plus,
    /// when it is local, one selector evaluation per policy (which policies select it: some
    /// may become active or inactive) and its own chains.
    pub fn upsert_endpoint(&mut self, ep: Endpoint) {
        let old = self.set.endpoint(&ep.namespace, &ep.name).cloned();
        if old.as_ref() == Some(&ep) {
            return;
        }
        self.set.upsert_endpoint(ep.clone());
        self.update_members(old.as_ref(), Some(&ep));
        self.update_local(old.as_ref(), Some(&ep));
    }

    /// Removes an endpoint; false when it was unknown.
    pub fn remove_endpoint(&mut self, namespace: &str, name: &str) -> bool {
        let Some(old) = self.set.endpoint(namespace, name).cloned() else {
            return false;
        };
        self.set.remove_endpoint(namespace, name);
        self.update_members(Some(&old), None);
        self.update_local(Some(&old), None);
        // Another endpoint may hold the same address (an IP re-used while the old record
        // lingers): put its elements back.
        let others: Vec<Endpoint> = self
            .set
            .endpoints()
            .filter(|e| e.ips.iter().any(|ip| old.ips.contains(ip)))
            .cloned()
            .collect();
        for e in others {
            self.update_members(None, Some(&e));
        }
        true
    }

    /// Applies a stored resource: a policy of any flavour, a Namespace or a WorkloadEndpoint.
    pub fn apply(&mut self, r: &Resource) -> Result<(), PolicyError> {
        match r {
            Resource::WorkloadEndpoint(w) => {
                crate::model::upsert_workload_endpoint(w, |ep| self.upsert_endpoint(ep))
            }
            Resource::Namespace(_) => {
                self.set.apply(r)?;
                self.rebuild();
                Ok(())
            }
            Resource::K8sNetworkPolicy(_)
            | Resource::NetworkPolicy(_)
            | Resource::GlobalNetworkPolicy(_) => {
                let key = policy_key(r).expect("a policy kind has a key");
                let old = self.set.policy(&key).cloned();
                self.set.apply(r)?;
                self.policy_changed(&key, old);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Removes a stored object by kind and name; unknown objects are ignored.
    pub fn remove(&mut self, kind: Kind, namespace: Option<&str>, name: &str) {
        match kind {
            Kind::WorkloadEndpoint => {
                self.remove_endpoint(namespace.unwrap_or_default(), name);
            }
            Kind::Namespace if self.set.has_namespace(name) => {
                self.set.remove_namespace(name);
                self.rebuild();
            }
            Kind::K8sNetworkPolicy | Kind::NetworkPolicy | Kind::GlobalNetworkPolicy => {
                let key = PolicyKey {
                    kind,
                    namespace: (kind != Kind::GlobalNetworkPolicy)
                        .then(|| namespace.unwrap_or_default().to_string()),
                    name: name.to_string(),
                };
                let old = self.set.policy(&key).cloned();
                if self.set.remove_policy(&key) {
                    self.policy_changed(&key, old);
                }
            }
            _ => {}
        }
    }

    fn policy_changed(&mut self, key: &PolicyKey, old: Option<crate::IrPolicy>) {
        let new = self.set.policy(key).cloned();
        // Local endpoints the policy selected before or selects now; how many it selects now
        // says whether it is active.
        let node = self.node.clone();
        let mut count = 0;
        let affected: Vec<Endpoint> = self
            .set
            .endpoints()
            .filter(|e| is_local(e, &node))
            .filter(|e| {
                let now = new
                    .as_ref()
                    .is_some_and(|p| self.set.selects(&p.applies_to, e));
                count += usize::from(now);
                now || old
                    .as_ref()
                    .is_some_and(|p| self.set.selects(&p.applies_to, e))
            })
            .cloned()
            .collect();
        let was_active = self.selected.contains_key(key);
        if count > 0 {
            self.selected.insert(key.clone(), count);
        } else {
            self.selected.remove(key);
        }
        // Neither active before nor now: nothing of it was or is compiled.
        if was_active || count > 0 {
            self.sync_policy(key);
        }
        for e in affected {
            self.update_local(Some(&e), Some(&e));
        }
    }

    /// Makes policy `key`'s chains and the sets they use what they should be: compiled from its
    /// current rules while it is active, absent otherwise; a set goes when no active policy
    /// uses it any more. A set new to the table is created with its full membership.
    fn sync_policy(&mut self, key: &PolicyKey) {
        let policy = self
            .set
            .policy(key)
            .filter(|_| self.selected.contains_key(key));
        let mut c = Compiler::new(&self.set);
        c.log = self.log;
        c.rs = std::mem::take(&mut self.rs);
        let mut chains = Vec::new();
        let mut used = BTreeMap::new();
        for dir in DIRS {
            let rules = policy
                .filter(|p| p.rules(dir).is_some())
                .map(|p| c.policy_rules(p, dir));
            used.append(&mut c.used);
            chains.push((policy_key_chain(key, dir), rules));
        }
        self.rs = c.rs;
        for (name, src) in &used {
            if !self.sources.contains_key(name) {
                // Created (with its full membership) by this compile.
                self.sources.insert(name.clone(), src.clone());
                self.dirty_sets.insert(name.clone());
            }
        }
        for (name, rules) in chains {
            self.put_chain(name, rules.map(Chain::regular));
        }
        let now: BTreeSet<String> = used.into_keys().collect();
        let before = self.policy_sets.remove(key).unwrap_or_default();
        for n in now.difference(&before) {
            *self.set_refs.entry(n.clone()).or_insert(0) += 1;
        }
        for n in before.difference(&now) {
            let left = self.set_refs.get_mut(n).map(|c| {
                *c = c.saturating_sub(1);
                *c
            });
            if left == Some(0) {
                self.set_refs.remove(n);
                self.sources.remove(n);
                self.rs.sets.remove(n);
                self.dirty_sets.insert(n.clone());
            }
        }
        if !now.is_empty() {
            self.policy_sets.insert(key.clone(), now);
        }
    }

    /// The dirty chains and sets as the kernel holds them and as they should be.
    fn pairs<'a>(&'a self, applied: &'a Ruleset) -> (Vec<Pair<'a, Chain>>, Vec<Pair<'a, Set>>) {
        let chains = self
            .dirty_chains
            .iter()
            .map(|n| Pair {
                name: n,
                old: applied.chains.get(n),
                new: self.rs.chains.get(n).or(self.extra.chains.get(n)),
            })
            .collect();
        let sets = self
            .dirty_sets
            .iter()
            .map(|n| Pair {
                name: n,
                old: applied.sets.get(n),
                new: self.rs.sets.get(n).or(self.extra.sets.get(n)),
            })
            .collect();
        (chains, sets)
    }

    /// The changes to apply next (in one transaction): a delta over what changed since the last
    /// commit (see [`tern_nft::diff`]), or the full resync when the kernel state is unknown or
    /// a declaration changed (a set's type, a base chain's hook). No changes = nothing to do.
    /// Commit with [`Self::commit_changes`] once applied.
    pub fn changes(&self) -> Changes {
        match self.table_delta() {
            Some(changes) => Changes {
                changes,
                full: false,
            },
            None => self.full_changes(),
        }
    }

    /// The pending delta (see [`Self::changes`]), or `None` when only a full resync can apply
    /// it: the kernel state is unknown or a declaration changed.
    pub fn table_delta(&self) -> Option<Vec<TableChange>> {
        let applied = self.applied.as_ref()?;
        let (chains, sets) = self.pairs(applied);
        tern_nft::diff(&chains, &sets)
    }

    /// The full resync of the desired table: delete and re-create it in one transaction.
    pub fn full_changes(&self) -> Changes {
        Changes {
            changes: tern_nft::full_changes_merged(&self.rs, &self.extra),
            full: true,
        }
    }

    /// The script to apply next: [`Self::changes`] as `nft -f` text. Empty text = nothing to
    /// do.
    pub fn script(&self) -> Script {
        let c = self.changes();
        Script {
            text: tern_nft::render(&c.changes, ElementOrder::ByKeyText),
            full: c.full,
        }
    }

    /// The pending change as set element additions and removals only, when that is all it
    /// is (the common "a pod joins or leaves selected sets" case). `None` when the kernel state
    /// is unknown or anything else changed: a chain's rules, a set declared, deleted or
    /// redeclared, an auto-merge set (refilled, not patched). Removals come before additions,
    /// so a changed map entry is deleted then re-added.
    pub fn element_delta(&self) -> Option<Vec<ElementChange>> {
        let applied = self.applied.as_ref()?;
        for n in &self.dirty_chains {
            let desired = self.rs.chains.get(n).or(self.extra.chains.get(n));
            if applied.chains.get(n) != desired {
                return None;
            }
        }
        let mut removed = Vec::new();
        let mut added = Vec::new();
        for n in &self.dirty_sets {
            let desired = self.rs.sets.get(n).or(self.extra.sets.get(n));
            let (old, new) = match (applied.sets.get(n), desired) {
                (None, None) => continue,
                (Some(o), Some(d)) if o.set_type == d.set_type && !d.set_type.auto_merge => (o, d),
                _ => return None,
            };
            let change = |add: bool, k: &Key, v: &Option<Verdict>| ElementChange {
                set: n.clone(),
                set_type: new.set_type,
                add,
                element: Element {
                    key: k.clone(),
                    verdict: v.clone(),
                },
            };
            for (k, v) in &old.elements {
                if new.elements.get(k) != Some(v) {
                    removed.push(change(false, k, v));
                }
            }
            for (k, v) in &new.elements {
                if old.elements.get(k) != Some(v) {
                    added.push(change(true, k, v));
                }
            }
        }
        removed.append(&mut added);
        Some(removed)
    }

    /// The full-resync script of the desired table (one transaction).
    pub fn full_script(&self) -> Script {
        Script {
            text: tern_nft::render_full_merged(&self.rs, &self.extra),
            full: true,
        }
    }

    /// Records that `script` (from [`Self::script`] or [`Self::full_script`]) is now in the
    /// kernel.
    pub fn commit(&mut self, script: &Script) {
        self.commit_applied(script.full);
    }

    /// Records that `changes` (from [`Self::changes`] or [`Self::full_changes`]) are now in
    /// the kernel.
    pub fn commit_changes(&mut self, changes: &Changes) {
        self.commit_applied(changes.full);
    }

    fn commit_applied(&mut self, full: bool) {
        if full || self.applied.is_none() {
            self.applied = Some(self.desired());
        } else if let Some(applied) = &mut self.applied {
            for n in &self.dirty_chains {
                match self.rs.chains.get(n).or(self.extra.chains.get(n)) {
                    Some(c) => applied.chains.insert(n.clone(), c.clone()),
                    None => applied.chains.remove(n),
                };
            }
            for n in &self.dirty_sets {
                match self.rs.sets.get(n).or(self.extra.sets.get(n)) {
                    Some(s) => applied.sets.insert(n.clone(), s.clone()),
                    None => applied.sets.remove(n),
                };
            }
        }
        self.dirty_chains.clear();
        self.dirty_sets.clear();
    }

    /// Forgets what the kernel holds (after a failed apply): the next changes are a full
    /// resync.
    pub fn invalidate(&mut self) {
        self.applied = None;
    }

    /// The elements of a set or map of the desired table (tests, diagnostics).
    pub fn set_elements(&self, name: &str) -> Option<&Set> {
        self.rs.sets.get(name).or(self.extra.sets.get(name))
    }
}

/// The key of a policy resource.
pub fn policy_key(r: &Resource) -> Option<PolicyKey> {
    let (kind, meta) = match r {
        Resource::K8sNetworkPolicy(p) => (Kind::K8sNetworkPolicy, &p.metadata),
        Resource::NetworkPolicy(p) => (Kind::NetworkPolicy, &p.metadata),
        Resource::GlobalNetworkPolicy(p) => (Kind::GlobalNetworkPolicy, &p.metadata),
        _ => return None,
    };
    Some(PolicyKey {
        kind,
        namespace: (kind != Kind::GlobalNetworkPolicy)
            .then(|| meta.namespace.clone().unwrap_or_default()),
        name: meta.name.clone(),
    })
}
