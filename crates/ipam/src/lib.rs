//! Block IPAM in the manner of Calico's libcalico-go `lib/ipam`, pure over a [`Store`].
//!
//! Pools are cut into blocks (default /26); a node claims blocks (affinity) and allocates from
//! them, so most allocations touch one block the node already owns. Every write is a
//! compare-and-swap on `mod_revision`; an allocation writes the block and the handle record in
//! one transaction, so in the common case it costs exactly one store write.
//!
//! Claiming a block is two-phase, as in Calico: write the node's affinity `Pending`, create the
//! block only if absent (`Compare::ModRevision(block, 0)`), then confirm the affinity. A crash in
//! between leaves a pending affinity that the next claim by the same node repairs.
//!
//! An [`Ipam`] caches blocks and the allocation policy, so a common-case allocation is that
//! one transaction and no read; every cached value is checked by the transaction's compares
//! (see "Caching" on [`Ipam`]). Blocks are stored in a compact JSON form ([`Block`]).

#![forbid(unsafe_code)]

mod affinity;
mod allocate;
mod api;
pub mod audit;
pub mod block;
mod client;
mod codec;
mod config;
mod error;
mod handles;
mod layout;
pub mod node;
mod policy;
mod query;
mod release;
// The allocation storm of the tests and benchmarks, out of production builds.
#[cfg(feature = "test-support")]
pub mod storm;
// Shared test fixtures, out of production builds too.
#[cfg(feature = "test-support")]
pub mod testing;

pub use api::{
    Allocation, AllocationAttrs, AssignArgs, Assigned, BlockUsage, Clock, DEFAULT_POLICY_TTL,
    PoolUsage, system_clock,
};
pub use block::{
    Affinity, AffinityRecord, AffinityState, AllocationAttribute, Block, Handle, HandleRecord,
    host_affinity,
};
pub use client::Ipam;
pub use error::{IpamError, Result};

#[cfg(test)]
mod cache_tests;
