//! The seam between the base lab ([`crate::topology`]: namespaces, nodes, their ternd, the
//! datastore) and what is built on it, today the Kubernetes cluster ([`crate::kube`]): the base
//! calls an [`Addon`] at each step where an add-on has work of its own, and never names one.
//! [`crate::ops`] hands the base the add-on (`kube::Cluster`), so `kube` depends on `topology`
//! and not the other way round.
//!
//! Every method does nothing by default.

use crate::Result;
use crate::state::LabState;

/// What an add-on does at the base's steps. An add-on with nothing recorded in the lab's state
/// does nothing at any of them.
pub trait Addon {
    /// Refuses a node that cannot join, before anything of it is created (`node_add`).
    fn check_node_add(&self, _st: &LabState) -> Result<()> {
        Ok(())
    }

    /// A node joined: its namespace is on the underlay and its ternd, if the lab runs one,
    /// serves (`node_add`, last step).
    fn node_joined(&self, _st: &mut LabState, _node: &str) -> Result<()> {
        Ok(())
    }

    /// A node is leaving: called before its pods are deleted and its ternd stopped
    /// (`node_del`, first step); appends what it did to `done`.
    fn node_leaving(&self, _st: &mut LabState, _node: &str, _done: &mut Vec<String>) -> Result<()> {
        Ok(())
    }

    /// The lab is going down: called first, while the agents still run (`down`). Collects
    /// what it did and its errors rather than stopping at the first.
    fn teardown(&self, _st: &mut LabState, _done: &mut Vec<String>, _errors: &mut Vec<String>) {}

    /// The lab `name` is gone but for what no state file recorded (a crash before it was
    /// saved): removes the add-on's part of that (`down`, last step, with or without state).
    fn sweep(&self, _name: &str, _done: &mut Vec<String>, _errors: &mut Vec<String>) {}

    /// The agent part of a node's `lab status` line when the lab started no ternd there;
    /// `None`: the base's ("ternd not started").
    fn agent_status(&self, _st: &LabState) -> Option<String> {
        None
    }

    /// Lines that `lab status` adds after the pods' (before the echo servers').
    fn status(&self, _st: &LabState) -> String {
        String::new()
    }
}
