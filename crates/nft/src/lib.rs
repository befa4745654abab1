//! tern-nft: tern's nftables table `inet tern` as typed values, and their rendering as nft
//! text. Pure: no kernel, no `nft`.
//!
//! Everything that writes the table (the policy compiler `tern-policy`, natOutgoing in the
//! agent) builds these values; they cross every seam as values and are turned into bytes at
//! the two edges only:
//!
//! - text, here: [`render_changes`], [`Ruleset::render_full`], [`render_delta`] (for humans,
//!   golden files, and `nft -f` when the kernel refused a netlink batch);
//! - netlink, in `tern_linux::nft_netlink`, which encodes the same values as the nfnetlink
//!   messages `nft` itself would send for that text.
//!
//! The parts:
//! - [`rule`]: [`Rule`] = [`Match`]es + [`Stmt`]s (+ a comment), with [`Verdict`];
//! - [`set`]: [`SetType`] declarations ([`DataType`] keys, concatenations, interval and
//!   auto-merge flags, verdict maps) and typed elements ([`Key`], [`Element`]);
//! - [`chain`]: [`Chain`], [`BaseChain`] (type, hook, priority, policy);
//! - [`table`]: the desired table [`Ruleset`] and the [`TableChange`]s that bring the kernel
//!   from one state to another (a full resync, or a [`diff`]), in an order one transaction
//!   accepts.

#![forbid(unsafe_code)]

pub mod chain;
pub mod render;
pub mod rule;
pub mod set;
pub mod table;

pub use chain::{BaseChain, Chain, ChainPolicy, ChainType, Hook};
pub use render::{ElementOrder, render, render_changes, render_delta, render_full_merged};
pub use rule::{
    Addr, AddrField, CtState, Family, IcmpField, Iface, L4Proto, Match, PortRange, Rule, Span,
    Stmt, Verdict,
};
pub use set::{AddrRange, DataType, Element, Key, Set, SetType, addr_bits};
pub use table::{
    ElementChange, Pair, Ruleset, TableChange, delta_changes, diff, full_changes_merged,
};

/// The table's family and name, as nft commands write it.
pub const TABLE: &str = "inet tern";
/// The table's name (its family is `inet`).
pub const TABLE_NAME: &str = "tern";

#[cfg(test)]
mod tests;
