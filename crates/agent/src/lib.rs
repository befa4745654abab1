//! `ternd`, the node agent: serves the CNI plugins over a unix socket, owns the node's pod
//! interfaces and routes, allocates addresses from the store, and repairs what changed while it
//! was down.
//!
//! ```text
//!   tern / tern-ipam ──unix socket──► server (one thread per connection)
//!                                        │
//!                     ┌──────────────────┼───────────────────┐
//!                     ▼                  ▼                   ▼
//!               endpoint ops        ipam (tern-ipam)     status / gc
//!          (add, del, check: kernel    over the store
//!           via tern-linux, store)
//!
//!   maintenance thread: release journal replay (every 2 s while entries are pending),
//!                       start-up and periodic reconciliation, leak repair (leak.rs)
//!   dataplane-watch:    store watch → routes, tunnels, nftables (dataplane.rs)
//!   http thread(s):     /metrics, /liveness, /readiness (metrics.rs)
//! ```
//!
//! Every request is handled on its own thread; the only shared state is the store (which
//! serialises by compare-and-swap) and the endpoint cache (a mutex held only for map updates).
//! Namespaces are entered only on dedicated threads (`NetNs::run`), never on a server thread.

pub mod audit;
pub mod bgp;
pub mod claims;
pub mod config;
pub mod dataplane;
pub mod endpoints;
pub mod leak;
pub mod logger;
pub mod metrics;
pub mod mtu;
pub mod nat;
pub mod node;
pub mod ops;
pub mod policy;
pub mod reaper;
pub mod reconcile;
pub mod routes;
pub mod server;

pub use config::AgentConfig;
pub use server::Agent;
