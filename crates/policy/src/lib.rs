//! tern-policy: NetworkPolicy semantics and the nftables policy compiler, all pure.
//!
//! - [`model`]: [`PolicySet`] (namespaces, endpoints, Kubernetes and tern policies normalised
//!   to one rule IR) and the reference evaluator [`PolicySet::allowed`]; the module
//!   documentation defines the semantics precisely.
//! - [`compile`]: [`compile()`] turns a [`PolicySet`] into the desired `inet tern`
//!   [`Ruleset`] for one node.
//! - [`incremental`]: [`Incremental`] keeps one node's compiled state up to date change by
//!   change and renders O(change) delta scripts.
//! - [`nft`]: the [`Ruleset`] builder shared with other users of the table, and its rendering
//!   as full-resync ([`Ruleset::render_full`]) and incremental ([`render_delta`]) `nft -f`
//!   scripts, each one atomic transaction.

pub mod compile;
pub mod fastpath;
pub mod incremental;
pub mod model;
pub mod nft;

pub use compile::compile;
pub use incremental::{ElementChange, Incremental, Script, TableChange, policy_key};
pub use model::{
    Direction, Endpoint, EndpointSelector, Flow, IrPolicy, IrRule, Match, NamespaceScope,
    PolicyKey, PolicySet,
};
pub use nft::{Chain, Ruleset, Set, render_delta};

/// Errors of building a policy set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A policy is invalid; names the policy (`Kind/namespace/name`) and the field.
    #[error("policy {policy}: {reason}")]
    Invalid { policy: String, reason: String },
}
