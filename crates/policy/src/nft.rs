//! A desired-state model of the `inet tern` nftables table and its rendering as `nft -f`
//! scripts: a full resync ([`Ruleset::render_full`]) and an incremental delta between two
//! states ([`render_delta`]). Both are one `nft -f` transaction, so the kernel switches
//! atomically and never shows a half-applied (or empty, allow-all) table.
//!
//! The table is shared: other components (natOutgoing) add their chains and sets to the same
//! [`Ruleset`] before rendering, so a full resync never deletes them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The table's family and name.
pub const TABLE: &str = "inet tern";

/// A chain: a base chain when `base` is set (`type filter hook forward priority -5; policy
/// accept;`), else a regular chain reached by jumps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    pub base: Option<String>,
    pub rules: Vec<String>,
}

/// A named set or map: `spec` is its declaration body (`type ipv4_addr; flags interval;`),
/// elements are rendered element texts (`10.0.0.1`, `"veth1" : jump ep-in-veth1`) keyed by
/// their key text (what `delete element` needs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Set {
    pub spec: String,
    pub elements: BTreeMap<String, String>,
}

impl Set {
    /// A set with the given declaration body and no elements.
    pub fn new(spec: impl Into<String>) -> Set {
        Set {
            spec: spec.into(),
            elements: BTreeMap::new(),
        }
    }

    /// Adds an element of a plain set.
    pub fn insert(&mut self, key: impl Into<String>) {
        let k = key.into();
        self.elements.insert(k.clone(), k);
    }

    /// Adds an element of a map (`key : value`).
    pub fn insert_mapping(&mut self, key: impl Into<String>, value: &str) {
        let k = key.into();
        let v = format!("{k} : {value}");
        self.elements.insert(k, v);
    }
}

/// Desired content of the `inet tern` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub chains: BTreeMap<String, Chain>,
    /// Sets and maps, by name.
    pub sets: BTreeMap<String, Set>,
}

impl Ruleset {
    /// An empty table.
    pub fn new() -> Ruleset {
        Ruleset::default()
    }

    /// Adds the chains and sets of `other`; entries of `other` win on a name clash.
    pub fn merge(&mut self, other: Ruleset) {
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
    }

    /// The full-resync script: creates the table if absent, deletes it and re-creates every
    /// chain, set, rule and element, all in one transaction (stale chains and drift vanish,
    /// and no packet ever sees the table missing).
    pub fn render_full(&self) -> String {
        render_full_merged(self, &Ruleset::new())
    }

    /// True when a chain or set of `self` also exists in `old` with another declaration (a
    /// base chain's hook, a set's type or flags): that cannot be patched, only re-created.
    pub fn redeclares(&self, old: &Ruleset) -> bool {
        self.chains
            .iter()
            .any(|(n, c)| old.chains.get(n).is_some_and(|o| o.base != c.base))
            || self
                .sets
                .iter()
                .any(|(n, s)| old.sets.get(n).is_some_and(|o| o.spec != s.spec))
    }
}

/// The full-resync script ([`Ruleset::render_full`]) of `base` merged with `over` (entries of
/// `over` win on a name clash, as in [`Ruleset::merge`]), rendered without building the merged
/// table.
pub fn render_full_merged(base: &Ruleset, over: &Ruleset) -> String {
    let mut chains: BTreeMap<&String, &Chain> = base.chains.iter().collect();
    chains.extend(&over.chains);
    let mut sets: BTreeMap<&String, &Set> = base.sets.iter().collect();
    sets.extend(&over.sets);
    let mut s = format!("add table {TABLE}\ndelete table {TABLE}\nadd table {TABLE}\n");
    render_declarations(
        &mut s,
        chains.iter().map(|(n, c)| (*n, *c)),
        sets.iter().map(|(n, v)| (*n, *v)),
    );
    for (name, c) in &chains {
        render_rules(&mut s, name, &c.rules);
    }
    for (name, set) in &sets {
        render_elements(&mut s, "add", name, set.elements.values());
    }
    s
}

fn render_declarations<'a>(
    s: &mut String,
    chains: impl Iterator<Item = (&'a String, &'a Chain)>,
    sets: impl Iterator<Item = (&'a String, &'a Set)>,
) {
    for (name, chain) in chains {
        match &chain.base {
            Some(b) => {
                let _ = writeln!(s, "add chain {TABLE} {name} {{ {b} }}");
            }
            None => {
                let _ = writeln!(s, "add chain {TABLE} {name}");
            }
        }
    }
    for (name, set) in sets {
        let kind = if set.spec.contains(" : ") {
            "map"
        } else {
            "set"
        };
        let _ = writeln!(s, "add {kind} {TABLE} {name} {{ {} }}", set.spec);
    }
}

fn render_rules(s: &mut String, chain: &str, rules: &[String]) {
    for r in rules {
        let _ = writeln!(s, "add rule {TABLE} {chain} {r}");
    }
}

fn render_elements<'a>(
    s: &mut String,
    verb: &str,
    set: &str,
    elems: impl Iterator<Item = &'a String>,
) {
    let v: Vec<&str> = elems.map(String::as_str).collect();
    // Chunked so one command line stays reasonable for sets of thousands of addresses.
    for chunk in v.chunks(500) {
        let _ = writeln!(s, "{verb} element {TABLE} {set} {{ {} }}", chunk.join(", "));
    }
}

/// The script that turns the kernel state `old` into `new` with the fewest changes: new sets
/// and chains are declared, changed chains are flushed and refilled, set/map elements are added
/// and deleted, and vanished chains and sets are deleted last (after nothing refers to them).
/// A pod joining a selected set therefore costs one `add element` (plus its own chain and map
/// entry), never a rewrite of policy chains. Returns an empty string when nothing changed.
/// When a base chain's declaration changed, the full script is returned instead.
pub fn render_delta(old: &Ruleset, new: &Ruleset) -> String {
    if new.redeclares(old) {
        return new.render_full();
    }
    let mut s = String::new();
    let new_chains = new
        .chains
        .iter()
        .filter(|(n, _)| !old.chains.contains_key(*n));
    let new_sets = new.sets.iter().filter(|(n, _)| !old.sets.contains_key(*n));
    render_declarations(&mut s, new_chains, new_sets);
    // Elements first added to sets (before rules use them), map entries later (after the
    // chains they jump to have rules).
    let empty = Set::default();
    let mut map_adds = String::new();
    let mut deletes = String::new();
    for (name, set) in &new.sets {
        let o = old.sets.get(name).unwrap_or(&empty);
        let is_map = set.spec.contains(" : ");
        let removed: Vec<&String> = o
            .elements
            .iter()
            .filter(|(k, v)| set.elements.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        let added = set
            .elements
            .iter()
            .filter(|(k, v)| o.elements.get(*k) != Some(*v))
            .map(|(_, v)| v);
        if is_map {
            // A changed mapping is deleted before it is re-added.
            render_elements(&mut s, "delete", name, removed.into_iter());
            render_elements(&mut map_adds, "add", name, added);
        } else if set.spec.contains("flags interval") {
            // Interval sets refuse an element overlapping one still there: remove first.
            render_elements(&mut s, "delete", name, removed.into_iter());
            render_elements(&mut s, "add", name, added);
        } else {
            render_elements(&mut s, "add", name, added);
            render_elements(&mut deletes, "delete", name, removed.into_iter());
        }
    }
    for (name, c) in &new.chains {
        match old.chains.get(name) {
            Some(o) if o.rules == c.rules => {}
            Some(_) => {
                let _ = writeln!(s, "flush chain {TABLE} {name}");
                render_rules(&mut s, name, &c.rules);
            }
            None => render_rules(&mut s, name, &c.rules),
        }
    }
    s.push_str(&map_adds);
    s.push_str(&deletes);
    // Chains that vanish: flush all first (they may jump to each other), then delete.
    let gone: BTreeSet<&String> = old
        .chains
        .keys()
        .filter(|n| !new.chains.contains_key(*n))
        .collect();
    for n in &gone {
        let _ = writeln!(s, "flush chain {TABLE} {n}");
    }
    for n in &gone {
        let _ = writeln!(s, "delete chain {TABLE} {n}");
    }
    for n in old.sets.keys().filter(|n| !new.sets.contains_key(*n)) {
        let kind = if old.sets[n].spec.contains(" : ") {
            "map"
        } else {
            "set"
        };
        let _ = writeln!(s, "delete {kind} {TABLE} {n}");
    }
    s
}
