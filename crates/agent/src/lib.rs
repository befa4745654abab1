//! `ternd`, the node agent: serves the CNI plugins over a unix socket, owns the node's pod
//! interfaces and routes, allocates addresses from the store, and repairs what changed while it
//! was down.
//!
//! ```text
//!   tern / tern-ipam ──unix socket──► server (trust boundary: peer credentials, limits,
//!                                        │      decoding, identifiers, descriptors)
//!                     ┌──────────────────┴───────────────────┐
//!                     ▼                                      ▼
//!          pod lifecycle (pod/): ADD, DEL, CHECK,       BGP status
//!          GC, IPAM, journal, repair; kernel through
//!          tern-linux's seam, IPAM over the store
//!
//!   maintenance thread: release journal replay (every 2 s while entries are pending),
//!                       start-up and periodic reconciliation, leak repair (reconcile.rs,
//!                       pod/repair.rs, pod/leak.rs)
//!   dataplane-watch:    store watch → routes, tunnels, nftables (dataplane.rs)
//!   http thread(s):     /metrics, /liveness, /readiness (http.rs)
//!   kubernetes:         API server watches → pod labels into the endpoints, namespaces and
//!                       NetworkPolicies into the policy engine (kube/, with `--kubernetes`)
//! ```
//!
//! Every request is handled on its own thread; the only shared state is the store (which
//! serialises by compare-and-swap) and the endpoint cache (a mutex held only for map updates).
//! Namespaces are entered only on dedicated threads (`NetNs::run`), never on a server thread.
//!
//! # Layers
//!
//! A module imports only what lies below it (enforced by `tests/module_graph.rs`, which holds
//! the same table):
//!
//! | layer | modules | may import |
//! |---|---|---|
//! | leaf | `admission` `claims` `code` `config` `endpoints` `external` `host` `hostcheck` `identity` `logger` `metrics` `mtu` `nat` `owners` `reaper` `routes` `runtime` `snapshot` `undo` `testutil` (unit tests only) | other leaves (the leaves form a DAG) |
//! | service | `bgp` `dataplane` (with `dataplane::node`) `kube` `pod` (the pod lifecycle, with `pod::leak`) `policy` | leaves, never another service |
//! | root | `agent` (`Agent`: start-up and wiring), `server` (the socket server), `reconcile` (the maintenance loop), `http` (the HTTP endpoints), this file | anything below, and `agent`'s `Agent` |
//!
//! Only the root names [`Agent`]: a service gets its inputs as arguments and keeps its own
//! state (the pod lifecycle its claims, reaper, journal flag and leak tracker; the host checks),
//! and the root lends them what they need of each other. What two services share is a leaf
//! or a trait the receiving service declares: the snapshot types in `snapshot`,
//! `nat::NatTable`, through which the dataplane hands natOutgoing to the policy engine the
//! root attaches, `external::ExternalObjects`, through which the Kubernetes source feeds
//! namespaces and NetworkPolicies to the engine, and `pod::EndpointPolicy` / `pod::PodSource`,
//! which the root implements over the policy engine and the Kubernetes source for the pod
//! lifecycle. The graph is acyclic, the root's too: `server`, `reconcile` and `http` add
//! `impl Agent` blocks to the `Agent` of `agent`, which names none of them.

/// The cluster-wide IPAM check, which lives next to IPAM (`tern_ipam::audit`) so that `ternctl`
/// needs no agent; re-exported for agent code and tests.
pub use tern_ipam::audit;
pub mod admission;
pub mod agent;
pub mod bgp;
pub mod claims;
pub mod config;
pub mod dataplane;
pub mod endpoints;
pub mod external;
pub mod flows;
pub mod host;
pub mod hostcheck;
pub mod http;
pub mod identity;
pub mod kube;
pub mod logger;
pub mod metrics;
pub mod mtu;
pub mod nat;
pub mod owners;
pub mod pod;
pub mod policy;
pub mod reaper;
pub mod reconcile;
pub mod routes;
pub mod runtime;
pub mod server;
pub mod snapshot;
#[cfg(test)]
mod testutil;
pub mod undo;

pub use agent::Agent;
pub use config::AgentConfig;
