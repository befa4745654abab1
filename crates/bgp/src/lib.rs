//! tern-bgp: the BGP speaker's pure core (issue 6, part 1).
//!
//! Everything here is sans-IO, in the style of holo-bgp: no sockets, no clocks, no tasks.
//!
//! - [`codec`]: BGP-4 wire format (RFC 4271, 4760, 6793, 2918, 4724, 4456, 7606 error handling)
//!   and a stream [`codec::Framer`].
//! - [`fsm`]: one peer's RFC 4271 §8 state machine, [`fsm::Session`], which consumes
//!   [`fsm::Event`]s and emits [`fsm::Action`]s. Timers are deadlines the driver arms on request.
//! - [`rib`]: Adj-RIB-In per peer, Loc-RIB best-path selection, route reflection (RFC 4456),
//!   graceful-restart helper stale handling and per-peer export UPDATE generation.
//!
//! - [`driver`]: the tokio driver, [`driver::Speaker`]: sockets, timers, connection collision
//!   detection, TCP MD5 ([`md5`]) and best-route events for the agent.
//!
//! The driver owns the TCP connections and timers, feeds bytes through the
//! framer and decoder into the session, executes the session's actions, and passes received
//! routes and session transitions to the RIB.

pub mod codec;
pub mod driver;
pub mod fsm;
pub mod md5;
pub mod rib;
