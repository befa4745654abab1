//! tern-policy: NetworkPolicy semantics and the nftables policy compiler, all pure.
//!
//! - [`model`]: [`PolicySet`] (namespaces, endpoints, Kubernetes and tern policies normalised
//!   to one rule IR) and the reference evaluator [`PolicySet::allowed`]; the module
//!   documentation defines the semantics precisely.
//! - [`explain`]: [`PolicySet::explain`], the same evaluator naming its cause: per direction
//!   the policies that select the endpoint, the deciding policy and rule (`ingress[0]`) or the
//!   default deny, as `ternctl explain` shows it; and [`PolicySet::pending`], what the staged
//!   policies (kept beside the enforced ones, never compiled) would decide instead, in a flow
//!   record's terms (`tern_api::flow::FlowPending`; hence the dependency on `tern-api`, the
//!   crate of that agreed JSON shape).
//! - [`compile`]: [`compile()`] turns a [`PolicySet`] into the desired `inet tern`
//!   [`Ruleset`] for one node.
//! - [`incremental`]: [`Incremental`] keeps one node's compiled state up to date change by
//!   change and gives the O(change) [`TableChange`]s that bring the kernel to it.
//! - [`nft`] (the `tern-nft` crate): the table as typed values ([`Ruleset`], [`Chain`],
//!   [`Set`], rules), shared with the other users of the table, and their rendering as
//!   full-resync ([`Ruleset::render_full`]) and incremental ([`render_delta`]) `nft -f`
//!   scripts, each one atomic transaction.

#![forbid(unsafe_code)]

pub mod compile;
pub mod explain;
pub mod fastpath;
pub mod flowtag;
pub mod incremental;
pub mod model;

pub use compile::{FlowLog, compile, compile_with};
pub use explain::{DirectionExplanation, Explanation, PolicyRef, Reason, RuleRef, Verdict};
pub use incremental::{Changes, Incremental, Script, policy_key};
pub use model::{
    Direction, Endpoint, EndpointSelector, Flow, IcmpMatch, IrPolicy, IrRule, Labels, Match,
    PolicyKey, PolicySet, StagedPolicy,
};
pub use tern_nft as nft;
pub use tern_nft::{Chain, ElementChange, Ruleset, Set, TableChange, render_delta};

/// Errors of building a policy set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A policy is invalid; names the policy (`Kind/namespace/name`) and the field.
    #[error("policy {policy}: {reason}")]
    Invalid { policy: String, reason: String },
    /// A WorkloadEndpoint's `ipNetworks` entries that are not CIDRs, each naming the record
    /// and the value; the endpoint was applied with its other addresses.
    #[error("{}; the endpoint applies without them", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    BadAddresses(Vec<tern_model::BadIpNetwork>),
}
