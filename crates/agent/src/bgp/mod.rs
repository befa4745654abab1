//! BGP in the agent (`ternd --bgp`): one thread runs a current-thread tokio runtime with the
//! [`tern_bgp::driver::Speaker`], in the node's network namespace (the agent's own).
//!
//! Configuration comes from the store and is re-read on every store change (a watch on
//! `/tern/v1/`), so changes apply without restarting the agent:
//!
//! - the speaker: AS = `Node.spec.bgp.asNumber`, else `BGPConfiguration default`'s asNumber,
//!   else 64512; router ID and listen address = `Node.spec.bgp.ipv4Address` (which the agent
//!   fills from its underlay address when unset); port = `listenPort`; a node with
//!   `routeReflectorClusterID` is a route reflector.
//! - peers ([`plan`]): every other node with a BGP address (node-to-node mesh) unless
//!   `nodeToNodeMeshEnabled: false`, plus the BGPPeers selecting this node. A route reflector's
//!   peers that are not reflectors themselves are its clients.
//! - originated prefixes: the node's affine blocks and the addresses it borrowed from other
//!   nodes' blocks, never more-specifics inside its own blocks.
//!
//! Import policy ([`ImportPolicy`], Calico's BIRD filter made explicit): the speaker only
//! uses routes inside an IPPool at its block size or longer, never this node's own blocks or
//! pod addresses, never the underlay or a default route unless a BGPPeer lists the prefix in
//! `acceptPrefixes`. Refused routes stay out of the RIB's best paths (so they are neither
//! installed nor passed on), are counted per peer (`tern_bgp_routes_rejected_total`) and
//! logged (rate-limited). A learned route is never installed over a kernel route of another
//! protocol (the connected underlay, a default route, a pod's route, the reconciler's):
//! new routes are added with `NLM_F_EXCL`, and only tern's own proto-85 routes are replaced or
//! deleted.
//!
//! Learned routes are installed with protocol
//! [`TERN_BGP_ROUTE_PROTOCOL`](tern_linux::TERN_BGP_ROUTE_PROTOCOL) (85), a recursive
//! next hop resolved through the kernel's table when it is not on a connected network. They
//! are desired routes like the reconciler's: planned by `crate::routes::plan` and applied
//! through its loop, over one netlink handle (`install::Installer`).
//! Prefixes inside pools that encapsulate (VXLAN, IPIP) stay with the route reconciler, and
//! the reconciler leaves direct routes of unencapsulated pools to BGP
//! ([`reconciler_owns`](crate::snapshot::reconciler_owns)): the two never write the same route. The one hand-over: proto-85
//! routes the speaker no longer routes, because a pool switched to VXLAN/IPIP or the agent
//! now runs without `--bgp`, are left for the reconciler to replace in place
//! (`Dataplane::adopt_bgp_routes`), so the switch from BGP to VXLAN leaves no destination
//! unrouted and no stale BGP route behind.
//!
//! Restarts: proto-85 routes found at start mean the agent restarted; the speaker then sets
//! the graceful-restart Restart State bit, keeps those routes while the sessions come back
//! and removes the ones not learned again once every session is up (or after the restart
//! time). The peers keep our routes meanwhile (RFC 4724 helper), also after a SIGKILL.
//!
//! The files: `plan` (peers and originated prefixes from a snapshot, pure),
//! `import` (the import policy, pure), `runner` (the BGP thread: store watch, speaker,
//! route events), `install` (the learned routes in the kernel), `status` (figures shared with
//! the status request and `/metrics`), `speaker` (the agent's handle, [`Bgp`]).

mod import;
mod install;
mod plan;
mod runner;
mod speaker;
mod status;

pub use import::{ImportPolicy, PoolRange, Rejection, RemoteBlock};
pub use plan::{BgpError, PeerKind, Plan, originated, plan, router_id_hash};
pub use runner::BgpSettings;
pub use speaker::Bgp;

#[cfg(test)]
mod tests;
