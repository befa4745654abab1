//! One module per kind of resource: its spec type, defaults and write-time checks. The kind
//! modules know nothing of each other beyond [`shared`] (value types several kinds use), save
//! [`staged`], whose kinds are the policy kinds' specs staged, and nothing of the table that lists them ([`crate::registry`]); they build on
//! [`crate::document`], [`crate::validate`], [`crate::selector`] and [`crate::limits`] only.
//!
//! Adding a kind: a module here, one row in `registry.rs`, and its re-exports in `lib.rs`.

pub mod bgp;
pub mod ip_reservation;
pub mod ipam_config;
pub mod ippool;
pub mod k8s_policy;
pub mod namespace;
pub mod node;
pub mod policy;
pub mod shared;
pub mod staged;
pub mod workload_endpoint;
