//! A list of [`TableChange`]s as one nfnetlink batch: one transaction, all or nothing.
//!
//! Each change becomes the messages `nft` sends for its text: `NEWTABLE` / `DELTABLE`,
//! `NEWCHAIN` (with its hook, priority, policy and type for a base chain), `DELRULE` without a
//! handle (flush a chain), `DELCHAIN`, `NEWSET` / `DELSET`, `DELSETELEM` without elements
//! (flush a set), `NEWRULE` (preceded by the anonymous sets it looks up), and
//! `NEWSETELEM` / `DELSETELEM` for a run of element changes of one set.

use std::collections::HashSet;
use std::io;

use tern_nft::{Element, SetType, TableChange};

use crate::error::{LinuxError, Result};
use crate::netlink::framing::{Answer, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};

use super::elems::{self, encode_anon_set, encode_elem_list_head, encode_entries, encode_set};
use super::expr::{anon_sets, encode_rule};
use super::{
    Batch, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NFPROTO_INET,
    NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELSETELEM, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE,
    NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_CHAIN,
    NFTA_RULE_TABLE, NftSocket, begin,
};

const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_DELTABLE: u8 = 2;
const NFT_MSG_DELSET: u8 = 11;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_USERDATA: u16 = 7;
/// nft's user data type of a rule's comment (`NFTNL_UDATA_RULE_COMMENT`).
const UDATA_RULE_COMMENT: u8 = 0;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;

/// Set entries per message: the entry list is one attribute, whose length is a u16.
const MAX_ENTRIES_PER_MSG: usize = 256;

/// A part of a batch that encodes as one or more messages; the kernel's answers to them are
/// reported (and tolerated, or not) together.
#[derive(Debug, Clone)]
pub(super) enum Unit<'a> {
    /// Consecutive element changes of one set, all additions or all removals.
    Elements {
        set: &'a str,
        set_type: SetType,
        add: bool,
        elements: Vec<&'a Element>,
        /// The set was created or flushed earlier in the batch and these are its first
        /// elements.
        fresh: bool,
    },
    /// Any other change.
    Change(&'a TableChange),
}

/// The units of `changes`, in order.
pub(super) fn units(changes: &[TableChange]) -> Vec<Unit<'_>> {
    let mut out: Vec<Unit<'_>> = Vec::new();
    let mut fresh: HashSet<&str> = HashSet::new();
    for c in changes {
        let e = match c {
            TableChange::Element(e) => e,
            TableChange::AddSet { name, .. } | TableChange::FlushSet { name, .. } => {
                fresh.insert(name);
                out.push(Unit::Change(c));
                continue;
            }
            _ => {
                out.push(Unit::Change(c));
                continue;
            }
        };
        if let Some(Unit::Elements {
            set, add, elements, ..
        }) = out.last_mut()
            && *set == e.set
            && *add == e.add
        {
            elements.push(&e.element);
            continue;
        }
        out.push(Unit::Elements {
            set: &e.set,
            set_type: e.set_type,
            add: e.add,
            elements: vec![&e.element],
            fresh: e.add && fresh.remove(e.set.as_str()),
        });
    }
    out
}

/// What a unit does, for error messages: its nft text.
pub(super) fn describe(u: &Unit<'_>, table: &str) -> String {
    let text = match u {
        Unit::Change(c) => tern_nft::render_changes(std::slice::from_ref(*c)),
        Unit::Elements {
            set, add, elements, ..
        } => {
            let verb = if *add { "add" } else { "delete" };
            let shown: Vec<String> = elements.iter().take(3).map(ToString::to_string).collect();
            let more = if elements.len() > 3 {
                format!(", ... ({} elements)", elements.len())
            } else {
                String::new()
            };
            format!("{verb} element {set} {{ {}{more} }}", shown.join(", "))
        }
    };
    format!("{} (table inet {table})", text.trim_end())
}

/// Numbers the messages of a batch and the sets it creates.
pub(super) struct Encoder<'b> {
    b: &'b mut Batch,
    /// The sequence number of the last message written.
    seq: u32,
    set_id: u32,
}

impl<'b> Encoder<'b> {
    /// Writes into `b`, numbering messages after `seq`.
    pub(super) fn new(b: &'b mut Batch, seq: u32) -> Encoder<'b> {
        Encoder { b, seq, set_id: 0 }
    }

    fn begin(&mut self, kind: u8, flags: u16) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        begin(
            self.b,
            (NFNL_SUBSYS_NFTABLES << 8) | u16::from(kind),
            flags,
            self.seq,
            NFPROTO_INET,
            0,
        );
        self.seq
    }

    /// Ends the open message, surfacing an attribute that did not fit as its error.
    fn end(&mut self) -> Result<()> {
        self.b.end();
        self.b.check()
    }

    /// Encodes `u`; returns how many messages it took.
    pub(super) fn unit(&mut self, table: &str, u: &Unit<'_>) -> Result<u32> {
        match u {
            Unit::Elements {
                set,
                set_type,
                add,
                elements,
                fresh,
            } => {
                let entries = elems::entries(set, set_type, *add, elements, *fresh)?;
                let kind = if *add {
                    NFT_MSG_NEWSETELEM
                } else {
                    NFT_MSG_DELSETELEM
                };
                let flags = if *add { NLM_F_CREATE } else { 0 };
                let mut n = 0;
                for chunk in entries.chunks(MAX_ENTRIES_PER_MSG) {
                    self.begin(kind, flags);
                    encode_elem_list_head(self.b, table, set, None);
                    encode_entries(self.b, chunk, *add)?;
                    self.end()?;
                    n += 1;
                }
                Ok(n)
            }
            Unit::Change(c) => self.change(table, c),
        }
    }

    fn change(&mut self, table: &str, c: &TableChange) -> Result<u32> {
        let mut n = 1;
        match c {
            TableChange::AddTable => {
                self.begin(NFT_MSG_NEWTABLE, NLM_F_CREATE);
                self.b.attr_str(NFTA_TABLE_NAME, table);
                self.b.attr(NFTA_TABLE_FLAGS, &0u32.to_be_bytes());
            }
            TableChange::DeleteTable => {
                self.begin(NFT_MSG_DELTABLE, 0);
                self.b.attr_str(NFTA_TABLE_NAME, table);
            }
            TableChange::AddChain(name) => {
                self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE);
                self.b.attr_str(NFTA_CHAIN_TABLE, table);
                self.b.attr_str(NFTA_CHAIN_NAME, name);
            }
            TableChange::AddBaseChain { name, base } => {
                self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE);
                self.b.attr_str(NFTA_CHAIN_TABLE, table);
                self.b.attr_str(NFTA_CHAIN_NAME, name);
                self.b.attr_str(NFTA_CHAIN_TYPE, base.chain_type.name());
                let policy = match base.policy {
                    tern_nft::ChainPolicy::Accept => NF_ACCEPT,
                    tern_nft::ChainPolicy::Drop => NF_DROP,
                };
                self.b.attr(NFTA_CHAIN_POLICY, &policy.to_be_bytes());
                self.b.begin_nest(NFTA_CHAIN_HOOK);
                self.b
                    .attr(NFTA_HOOK_HOOKNUM, &base.hook.number().to_be_bytes());
                self.b
                    .attr(NFTA_HOOK_PRIORITY, &base.priority.to_be_bytes());
                self.b.end_nest();
            }
            TableChange::FlushChain(name) => {
                // DELRULE without a handle removes every rule of the chain.
                self.begin(NFT_MSG_DELRULE, 0);
                self.b.attr_str(NFTA_RULE_TABLE, table);
                self.b.attr_str(NFTA_RULE_CHAIN, name);
            }
            TableChange::DeleteChain(name) => {
                self.begin(NFT_MSG_DELCHAIN, 0);
                self.b.attr_str(NFTA_CHAIN_TABLE, table);
                self.b.attr_str(NFTA_CHAIN_NAME, name);
            }
            TableChange::AddRule { chain, rule } => {
                if rule.matches.is_empty() && rule.stmts.is_empty() {
                    // The kernel would take it; nft has no text for it.
                    return Err(LinuxError::InvalidArgument(format!(
                        "an empty rule for chain {chain}"
                    )));
                }
                let sets = anon_sets(rule, &mut self.set_id)?;
                for s in &sets {
                    self.begin(NFT_MSG_NEWSET, NLM_F_CREATE);
                    encode_anon_set(self.b, table, s);
                    self.end()?;
                    for chunk in s.entries.chunks(MAX_ENTRIES_PER_MSG) {
                        self.begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE);
                        encode_elem_list_head(self.b, table, "__set%d", Some(s.id));
                        encode_entries(self.b, chunk, true)?;
                        self.end()?;
                        n += 1;
                    }
                    n += 1;
                }
                self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND);
                self.b.attr_str(NFTA_RULE_TABLE, table);
                self.b.attr_str(NFTA_RULE_CHAIN, chain);
                let ids: Vec<u32> = sets.iter().map(|s| s.id).collect();
                encode_rule(self.b, rule, &ids)?;
                if let Some(comment) = &rule.comment {
                    let mut u = vec![UDATA_RULE_COMMENT];
                    let len = u8::try_from(comment.len() + 1).map_err(|_| {
                        LinuxError::InvalidArgument(format!(
                            "rule comment {comment:?} is longer than 254 bytes"
                        ))
                    })?;
                    u.push(len);
                    u.extend_from_slice(comment.as_bytes());
                    u.push(0);
                    self.b.attr(NFTA_RULE_USERDATA, &u);
                }
            }
            TableChange::AddSet { name, set_type } => {
                self.begin(NFT_MSG_NEWSET, NLM_F_CREATE);
                self.set_id += 1;
                encode_set(self.b, table, name, set_type, self.set_id);
            }
            TableChange::FlushSet { name, .. } => {
                // DELSETELEM without elements removes every element.
                self.begin(NFT_MSG_DELSETELEM, 0);
                encode_elem_list_head(self.b, table, name, None);
            }
            TableChange::DeleteSet { name, .. } => {
                self.begin(NFT_MSG_DELSET, 0);
                self.b.attr_str(super::NFTA_SET_TABLE, table);
                self.b.attr_str(super::NFTA_SET_NAME, name);
            }
            TableChange::Element(_) => unreachable!("element changes are grouped in units"),
        }
        self.end()?;
        Ok(n)
    }
}

impl NftSocket {
    /// Sends `units` as one batch; returns the kernel's answer per unit (`None` = accepted;
    /// else the first error of its messages).
    fn send_units(&mut self, table: &str, units: &[Unit<'_>]) -> Result<Vec<Option<Answer>>> {
        let context = format!("update table inet {table}");
        let mut b = Batch::batch();
        let begin_seq = self.next_seq();
        begin(
            &mut b,
            NFNL_MSG_BATCH_BEGIN,
            0,
            begin_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        b.end();
        // (first sequence number, number of messages) of each unit.
        let mut spans = Vec::with_capacity(units.len());
        let mut enc = Encoder::new(&mut b, self.seq);
        for u in units {
            let first = enc.seq.wrapping_add(1);
            let n = enc.unit(table, u)?;
            spans.push((first, n));
        }
        let last = enc.seq;
        self.seq = enc.seq;
        if spans.iter().all(|(_, n)| *n == 0) {
            return Ok(vec![None; units.len()]);
        }
        // Errors are always reported; only the last message asks for an ack, whose arrival
        // ends the exchange (answers come in message order).
        b.add_flags(NLM_F_ACK);
        let end_seq = self.next_seq();
        begin(
            &mut b,
            NFNL_MSG_BATCH_END,
            0,
            end_seq,
            0,
            NFNL_SUBSYS_NFTABLES,
        );
        self.send(b.finish()?, &context)?;
        let first = spans[0].0;
        let mut out: Vec<Option<Answer>> = vec![None; units.len()];
        let mut batch_error = None;
        self.receive(
            &context,
            &mut |seq, a| {
                if seq == begin_seq || seq == end_seq {
                    // The batch as a whole was refused (e.g. EPERM, ENOMEM).
                    batch_error = Some(a);
                    return true;
                }
                let off = seq.wrapping_sub(first);
                if off > last.wrapping_sub(first) {
                    return false; // an answer to an earlier, abandoned exchange
                }
                // The unit whose messages include `seq`.
                let i = spans.partition_point(|(s, _)| s.wrapping_sub(first) <= off) - 1;
                if a.errno != 0 && out[i].is_none() {
                    out[i] = Some(a);
                }
                seq == last
            },
            &mut |_, _| {},
        )?;
        if let Some(a) = batch_error {
            return Err(a.into_error(context));
        }
        Ok(out)
    }

    /// Applies `changes` in order to table `inet table` as one transaction: either all take
    /// effect or none. Adding an element that exists, deleting one that does not and creating
    /// a chain or set that exists (declared alike) are no-ops; a missing table or set of an
    /// element change is
    /// [`LinuxError::NotFound`]; anything else the kernel refuses (a rule jumping to a missing
    /// chain, deleting a chain something still jumps to, a key of the wrong size) fails the
    /// whole transaction with [`LinuxError::Netlink`] naming the change.
    pub fn apply(&mut self, table: &str, changes: &[TableChange]) -> Result<()> {
        let mut us = units(changes);
        // Each round either succeeds, fails for good, or strictly shrinks a tolerated failure
        // (split a run into single elements, or drop a single no-op element or chain).
        loop {
            if us.is_empty() {
                return Ok(());
            }
            let answers = self.send_units(table, &us)?;
            if answers.iter().all(Option::is_none) {
                return Ok(());
            }
            let mut next = Vec::with_capacity(us.len());
            for (u, a) in us.iter().zip(answers) {
                let Some(a) = a else {
                    next.push(u.clone());
                    continue;
                };
                let (set, add, elements, fresh) = match u {
                    Unit::Elements {
                        set,
                        add,
                        elements,
                        fresh,
                        ..
                    } => (*set, *add, elements, *fresh),
                    Unit::Change(TableChange::AddChain(_)) if a.errno == libc::EEXIST => {
                        continue;
                    }
                    Unit::Change(_) => {
                        return Err(LinuxError::Netlink {
                            context: describe(u, table),
                            source: io::Error::from_raw_os_error(a.errno),
                            ext_ack: a.ext_ack,
                        });
                    }
                };
                let tolerable = match (add, a.errno) {
                    (true, libc::EEXIST) => true,
                    (_, libc::ENOENT) => {
                        if !self.set_exists(table, set)? {
                            return Err(LinuxError::NotFound {
                                what: format!(
                                    "nftables set inet {table} {set} (for: {})",
                                    describe(u, table)
                                ),
                            });
                        }
                        // On an existing set, ENOENT of a delete is a missing element; of an
                        // add, a missing jump target, which is a real error.
                        !add
                    }
                    _ => false,
                };
                if !tolerable {
                    return Err(LinuxError::Netlink {
                        context: describe(u, table),
                        source: io::Error::from_raw_os_error(a.errno),
                        ext_ack: a.ext_ack,
                    });
                }
                if elements.len() > 1 {
                    let Unit::Elements { set_type, .. } = u else {
                        unreachable!()
                    };
                    next.extend(elements.iter().enumerate().map(|(i, e)| Unit::Elements {
                        set,
                        set_type: *set_type,
                        add,
                        elements: vec![*e],
                        fresh: fresh && i == 0,
                    }));
                }
            }
            us = next;
        }
    }
}
