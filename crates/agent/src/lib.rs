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
//!   maintenance thread: release journal replay, start-up and periodic reconciliation
//! ```
//!
//! Every request is handled on its own thread; the only shared state is the store (which
//! serialises by compare-and-swap) and the endpoint cache (a mutex held only for map updates).
//! Namespaces are entered only on dedicated threads (`NetNs::run`), never on a server thread.

pub mod config;
pub mod endpoints;
pub mod logger;
pub mod ops;
pub mod reaper;
pub mod reconcile;
pub mod server;

pub use config::AgentConfig;
pub use server::Agent;
