//! tern-lab: throwaway clusters built from network namespaces, for tests, `ternctl lab` and the
//! benchmarks of `tern-bench` (crate `crates/bench`).
//!
//! A lab named `<lab>` consists of (every name prefixed `tl-<lab>-`, nothing in the root
//! namespace is touched):
//!
//! ```text
//!   tl-<lab>-ul        underlay: bridge br0 198.18.0.1/24 (two bridges and a router
//!                      namespace tl-<lab>-rtr for cross-subnet; see [`topology`])
//!     |  veth n1 <-> eth0
//!   tl-<lab>-node1     eth0 198.18.0.11/24, default via 198.18.0.1, ip_forward=0 until ternd sets it
//!                      (--ip-family ipv6|dual: 2001:db8::11/64 too or instead, default via
//!                      2001:db8::1, IPv6 forwarding off until ternd sets it)
//!     |  veth made by ternd
//!   tl-<lab>-pod-<p>   eth0 configured by the real `tern` CNI plugin
//! ```
//!
//! The lab's state (namespaces, PIDs, pods) is recorded in `/run/tern-lab/<lab>/state.json`
//! after every step, so [`down`] can undo a half-finished [`up`]. Set-up uses `ip` commands
//! (iproute2), which always name a namespace (`ip -n NS`, `ip netns exec NS`).
//!
//! Modules: [`state`] (state file, the Kubernetes cluster's record included), [`topology`]
//! (the base lab: up/down/status, nodes joining and leaving, agent restarts, etcd),
//! [`cluster`] (the lab's datastore), [`pod`] (CNI ADD/DEL of pods), [`traffic`] (echo server
//! and probes used to prove connectivity), [`verdict`] (the kernel's verdict on one new
//! connection, for `ternctl explain --probe`), [`mesh`] (every pod to every pod), [`netns`] (code
//! inside a lab namespace), [`process`] (commands and PIDs), [`pki`] (a CA and its
//! certificates, made by `tern-pki`), [`bird`] (BIRD peers), [`netpol`] (the NetworkPolicy harness).
//!
//! The Kubernetes cluster ([`kube`]) is an add-on on the base: `topology` calls it only
//! through the hook [`addon::Addon`] (`kube::Cluster` implements it), and [`ops`] hands it
//! over, so [`down`], [`status`], [`node_add`] and [`node_del`] (the `ops` ones) include the
//! cluster's steps while `kube` depends on `topology`, never the reverse
//! (`tests/module_graph.rs`).

use std::path::PathBuf;

pub mod addon;
pub mod bird;
pub mod cluster;
pub mod kube;
pub mod mesh;
pub mod netns;
pub mod netpol;
pub mod ops;
pub mod pki;
pub mod pod;
pub mod process;
pub mod state;
pub mod topology;
pub mod traffic;
pub mod verdict;

pub use ops::{down, node_add, node_del, status};
pub use pod::{add_pod, del_pod, start_server};
pub use state::{Encap, IpFamily, LabState, NodeState, PodState, ServerState, StoreKind};
pub use topology::{UpOptions, kill_agent, restart_agent, start_agent, up};

/// Directory holding every lab's state directory.
pub const RUN_DIR: &str = "/run/tern-lab";

/// Errors of building, using and removing a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A command could not be started.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// The state file could not be read or written.
    #[error("lab state {path}: {message}")]
    State { path: PathBuf, message: String },
    /// The request does not make sense for this lab (bad name, unknown node, existing lab).
    #[error("{0}")]
    Invalid(String),
    /// Something did not become ready in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The CNI plugin failed or printed something unexpected.
    #[error("CNI {command} of pod {pod:?} failed: {message}")]
    Cni {
        command: &'static str,
        pod: String,
        message: String,
    },
    /// A traffic probe got no (or a wrong) answer.
    #[error("probe {proto} {target}: {message}")]
    Probe {
        proto: &'static str,
        target: String,
        message: String,
    },
    /// A certificate or key could not be made, read or written.
    #[error("lab PKI: {0}")]
    Pki(#[source] tern_pki::PkiError),
}

impl LabError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> LabError {
        LabError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result of lab operations.
pub type Result<T> = std::result::Result<T, LabError>;
