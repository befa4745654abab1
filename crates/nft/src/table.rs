//! The whole table: its desired state ([`Ruleset`]) and the changes that bring the kernel
//! from one state to another ([`TableChange`]), in an order one transaction accepts.

use std::collections::BTreeMap;

use crate::chain::Chain;
use crate::rule::Rule;
use crate::set::{Element, Key, Set, SetType};
use crate::{BaseChain, Verdict};

/// One element added to or removed from a named set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementChange {
    /// The set or map.
    pub set: String,
    /// Its declaration.
    pub set_type: SetType,
    /// True to add, false to remove.
    pub add: bool,
    /// The element (a removal is by key; a map element keeps its verdict for diagnostics).
    pub element: Element,
}

/// One change of the table. A list of them is applied in order as one transaction, by
/// `nft -f` (rendered with [`crate::render_changes`]) or as one nfnetlink batch
/// (`tern_linux::nft_netlink`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableChange {
    /// Create the table if absent.
    AddTable,
    /// Delete the table and everything in it.
    DeleteTable,
    /// Create a regular chain.
    AddChain(String),
    /// Create a base chain.
    AddBaseChain { name: String, base: BaseChain },
    /// Delete every rule of a chain.
    FlushChain(String),
    /// Delete a chain (nothing may jump to it any more).
    DeleteChain(String),
    /// Append a rule to a chain.
    AddRule { chain: String, rule: Rule },
    /// Declare a set or map.
    AddSet { name: String, set_type: SetType },
    /// Delete every element of a set or map.
    FlushSet { name: String, set_type: SetType },
    /// Delete a set or map (no rule may look it up any more).
    DeleteSet { name: String, set_type: SetType },
    /// Add or remove one element.
    Element(ElementChange),
}

/// Desired content of the table.
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

    /// True when a chain or set of `self` also exists in `old` with another declaration (a
    /// base chain's hook, a set's type or flags): that cannot be patched, only re-created.
    pub fn redeclares(&self, old: &Ruleset) -> bool {
        self.chains
            .iter()
            .any(|(n, c)| old.chains.get(n).is_some_and(|o| o.base != c.base))
            || self
                .sets
                .iter()
                .any(|(n, s)| old.sets.get(n).is_some_and(|o| o.set_type != s.set_type))
    }

    /// The full resync: create the table if absent, delete it, and create every chain, set,
    /// rule and element again, all in one transaction (stale chains and drift vanish, and no
    /// packet ever sees the table missing).
    pub fn full_changes(&self) -> Vec<TableChange> {
        full_changes_merged(self, &Ruleset::new())
    }
}

/// [`Ruleset::full_changes`] of `base` merged with `over` (entries of `over` win on a name
/// clash, as in [`Ruleset::merge`]), without building the merged table.
pub fn full_changes_merged(base: &Ruleset, over: &Ruleset) -> Vec<TableChange> {
    let mut chains: BTreeMap<&String, &Chain> = base.chains.iter().collect();
    chains.extend(&over.chains);
    let mut sets: BTreeMap<&String, &Set> = base.sets.iter().collect();
    sets.extend(&over.sets);
    let mut out = vec![
        TableChange::AddTable,
        TableChange::DeleteTable,
        TableChange::AddTable,
    ];
    for (name, c) in &chains {
        out.push(add_chain(name, c));
    }
    for (name, s) in &sets {
        out.push(TableChange::AddSet {
            name: name.to_string(),
            set_type: s.set_type,
        });
    }
    for (name, c) in &chains {
        add_rules(&mut out, name, &c.rules);
    }
    for (name, s) in &sets {
        out.extend(
            s.elements
                .iter()
                .map(|(k, v)| element(name, s.set_type, true, k, v)),
        );
    }
    out
}

fn add_chain(name: &str, c: &Chain) -> TableChange {
    match c.base {
        Some(base) => TableChange::AddBaseChain {
            name: name.to_string(),
            base,
        },
        None => TableChange::AddChain(name.to_string()),
    }
}

fn add_rules(out: &mut Vec<TableChange>, chain: &str, rules: &[Rule]) {
    out.extend(rules.iter().map(|r| TableChange::AddRule {
        chain: chain.to_string(),
        rule: r.clone(),
    }));
}

fn element(set: &str, set_type: SetType, add: bool, k: &Key, v: &Option<Verdict>) -> TableChange {
    TableChange::Element(ElementChange {
        set: set.to_string(),
        set_type,
        add,
        element: Element {
            key: k.clone(),
            verdict: v.clone(),
        },
    })
}

/// A chain or set as the kernel holds it (`old`) and as it should be (`new`); absent on a
/// side where it does not exist.
#[derive(Debug, Clone, Copy)]
pub struct Pair<'a, T> {
    pub name: &'a str,
    pub old: Option<&'a T>,
    pub new: Option<&'a T>,
}

/// The changes that turn the kernel state of the given chains and sets into the desired one
/// with the fewest changes, or `None` when a chain or set is redeclared (a base chain's hook,
/// a set's type or flags: only a full resync can change that). `chains` and `sets` are in
/// name order. New sets and chains are declared first; set elements are added before the
/// rules that use them and map entries after the chains they jump to have their rules;
/// changed chains are flushed and refilled; vanished chains and sets are deleted last, after
/// nothing refers to them. A pod joining a selected set therefore costs one element change
/// (plus its own chain and map entry), never a rewrite of policy chains.
///
/// Elements of a plain set are added early and removed late; those of an interval set are
/// removed before they are added (the kernel refuses an element overlapping one still there);
/// an auto-merge set that changed is flushed and refilled (its kernel elements are nft's
/// merged ranges, not the ones given).
pub fn diff(chains: &[Pair<'_, Chain>], sets: &[Pair<'_, Set>]) -> Option<Vec<TableChange>> {
    let redeclared = chains.iter().any(|p| match (p.old, p.new) {
        (Some(o), Some(n)) => o.base != n.base,
        _ => false,
    }) || sets.iter().any(|p| match (p.old, p.new) {
        (Some(o), Some(n)) => o.set_type != n.set_type,
        _ => false,
    });
    if redeclared {
        return None;
    }
    let mut out = Vec::new();
    for p in chains {
        if let (None, Some(c)) = (p.old, p.new) {
            out.push(add_chain(p.name, c));
        }
    }
    for p in sets {
        if let (None, Some(s)) = (p.old, p.new) {
            out.push(TableChange::AddSet {
                name: p.name.to_string(),
                set_type: s.set_type,
            });
        }
    }
    let mut map_adds = Vec::new();
    let mut deletes = Vec::new();
    for p in sets {
        let Some(set) = p.new else { continue };
        let ty = set.set_type;
        let empty = BTreeMap::new();
        let old = p.old.map_or(&empty, |o| &o.elements);
        let removed = old
            .iter()
            .filter(|(k, v)| set.elements.get(*k) != Some(*v))
            .map(|(k, v)| element(p.name, ty, false, k, v));
        let added = set
            .elements
            .iter()
            .filter(|(k, v)| old.get(*k) != Some(*v))
            .map(|(k, v)| element(p.name, ty, true, k, v));
        if ty.is_map() {
            // A changed mapping is deleted before it is re-added.
            out.extend(removed);
            map_adds.extend(added);
        } else if ty.auto_merge {
            if p.old.is_some_and(|o| o.elements != set.elements) {
                out.push(TableChange::FlushSet {
                    name: p.name.to_string(),
                    set_type: ty,
                });
                out.extend(
                    set.elements
                        .iter()
                        .map(|(k, v)| element(p.name, ty, true, k, v)),
                );
            } else if p.old.is_none() {
                out.extend(added);
            }
        } else if ty.interval {
            // Interval sets refuse an element overlapping one still there: remove first.
            out.extend(removed);
            out.extend(added);
        } else {
            out.extend(added);
            deletes.extend(removed);
        }
    }
    for p in chains {
        let Some(c) = p.new else { continue };
        match p.old {
            Some(o) if o.rules == c.rules => {}
            Some(_) => {
                out.push(TableChange::FlushChain(p.name.to_string()));
                add_rules(&mut out, p.name, &c.rules);
            }
            None => add_rules(&mut out, p.name, &c.rules),
        }
    }
    out.append(&mut map_adds);
    out.append(&mut deletes);
    // Chains that vanish: flush all first (they may jump to each other), then delete.
    let gone: Vec<&str> = chains
        .iter()
        .filter(|p| p.old.is_some() && p.new.is_none())
        .map(|p| p.name)
        .collect();
    out.extend(gone.iter().map(|n| TableChange::FlushChain(n.to_string())));
    out.extend(gone.iter().map(|n| TableChange::DeleteChain(n.to_string())));
    for p in sets {
        if let (Some(s), None) = (p.old, p.new) {
            out.push(TableChange::DeleteSet {
                name: p.name.to_string(),
                set_type: s.set_type,
            });
        }
    }
    Some(out)
}

/// Every name of two maps, in order, with its value on each side.
fn pairs<'a, T>(old: &'a BTreeMap<String, T>, new: &'a BTreeMap<String, T>) -> Vec<Pair<'a, T>> {
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|n| Pair {
            name: n,
            old: old.get(n),
            new: new.get(n),
        })
        .collect()
}

/// [`diff`] of two whole tables: the changes that turn `old` into `new`, or `None` when
/// something is redeclared (see [`Ruleset::redeclares`]).
pub fn delta_changes(old: &Ruleset, new: &Ruleset) -> Option<Vec<TableChange>> {
    diff(
        &pairs(&old.chains, &new.chains),
        &pairs(&old.sets, &new.sets),
    )
}
