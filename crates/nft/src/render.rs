//! Table changes as an `nft -f` script: what humans read, golden files pin, and `nft` applies
//! when the kernel refused a netlink batch. Never parsed back.

use std::fmt::Write;

use crate::set::Key;
use crate::table::{Ruleset, TableChange, delta_changes, full_changes_merged};
use crate::{ElementChange, TABLE};

/// In which order the elements of one `add element` / `delete element` command are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementOrder {
    /// As the changes list them.
    AsGiven,
    /// Sorted by the key's text, as scripts rendered from a [`Ruleset`] write them.
    ByKeyText,
}

/// Elements per `add element` / `delete element` line, so a command line stays reasonable for
/// sets of thousands of addresses.
const ELEMENTS_PER_LINE: usize = 500;

/// The script of `changes`, one command per line; consecutive element changes of one set
/// and direction share a command (chunked), with their elements in the order given.
pub fn render_changes(changes: &[TableChange]) -> String {
    render(changes, ElementOrder::AsGiven)
}

/// The script of `changes` (see [`render_changes`]) with the elements of each command in
/// `order`.
pub fn render(changes: &[TableChange], order: ElementOrder) -> String {
    let mut s = String::new();
    let mut i = 0;
    while i < changes.len() {
        if let TableChange::Element(first) = &changes[i] {
            let mut run: Vec<&ElementChange> = vec![first];
            i += 1;
            while let Some(TableChange::Element(e)) = changes.get(i) {
                if e.set != first.set || e.add != first.add {
                    break;
                }
                run.push(e);
                i += 1;
            }
            render_elements(&mut s, &run, order);
            continue;
        }
        render_one(&mut s, &changes[i]);
        i += 1;
    }
    s
}

fn render_one(s: &mut String, c: &TableChange) {
    let _ = match c {
        TableChange::AddTable => writeln!(s, "add table {TABLE}"),
        TableChange::DeleteTable => writeln!(s, "delete table {TABLE}"),
        TableChange::AddChain(n) => writeln!(s, "add chain {TABLE} {n}"),
        TableChange::AddBaseChain { name, base } => {
            writeln!(s, "add chain {TABLE} {name} {{ {base} }}")
        }
        TableChange::FlushChain(n) => writeln!(s, "flush chain {TABLE} {n}"),
        TableChange::DeleteChain(n) => writeln!(s, "delete chain {TABLE} {n}"),
        TableChange::AddRule { chain, rule } => writeln!(s, "add rule {TABLE} {chain} {rule}"),
        TableChange::AddSet { name, set_type } => {
            writeln!(s, "add {} {TABLE} {name} {{ {set_type} }}", set_type.noun())
        }
        TableChange::FlushSet { name, set_type } => {
            writeln!(s, "flush {} {TABLE} {name}", set_type.noun())
        }
        TableChange::DeleteSet { name, set_type } => {
            writeln!(s, "delete {} {TABLE} {name}", set_type.noun())
        }
        TableChange::Element(_) => unreachable!("element changes are rendered in runs"),
    };
}

/// One run of element changes of one set and direction: additions with their verdicts,
/// removals by key.
fn render_elements(s: &mut String, run: &[&ElementChange], order: ElementOrder) {
    let first = run[0];
    let verb = if first.add { "add" } else { "delete" };
    let mut texts: Vec<(String, String)> = run
        .iter()
        .map(|e| {
            let key = key_text(&e.element.key);
            let text = match (&e.element.verdict, e.add) {
                (Some(v), true) => format!("{key} : {v}"),
                _ => key.clone(),
            };
            (key, text)
        })
        .collect();
    if order == ElementOrder::ByKeyText {
        texts.sort_by(|a, b| a.0.cmp(&b.0));
    }
    for chunk in texts.chunks(ELEMENTS_PER_LINE) {
        let list: Vec<&str> = chunk.iter().map(|(_, t)| t.as_str()).collect();
        let _ = writeln!(
            s,
            "{verb} element {TABLE} {} {{ {} }}",
            first.set,
            list.join(", ")
        );
    }
}

fn key_text(k: &Key) -> String {
    k.to_string()
}

impl Ruleset {
    /// The full-resync script ([`Ruleset::full_changes`]).
    pub fn render_full(&self) -> String {
        render(&self.full_changes(), ElementOrder::ByKeyText)
    }
}

/// The full-resync script of `base` merged with `over` ([`full_changes_merged`]).
pub fn render_full_merged(base: &Ruleset, over: &Ruleset) -> String {
    render(&full_changes_merged(base, over), ElementOrder::ByKeyText)
}

/// The script that turns the kernel state `old` into `new` ([`delta_changes`]); the full
/// script of `new` when something is redeclared. Empty when nothing changed.
pub fn render_delta(old: &Ruleset, new: &Ruleset) -> String {
    match delta_changes(old, new) {
        Some(changes) => render(&changes, ElementOrder::ByKeyText),
        None => new.render_full(),
    }
}
