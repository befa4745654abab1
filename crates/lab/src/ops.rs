//! The lab operations a user runs (`ternctl lab`, the tests, the benchmarks): the base's
//! ([`crate::topology`]) with the Kubernetes cluster ([`crate::kube::Cluster`]) hooked in
//! through [`crate::addon::Addon`]. A lab without a cluster is unchanged by it.

use std::time::Duration;

use crate::kube::Cluster;
use crate::state::{LabState, NodeState};
use crate::{Result, topology};

/// [`topology::node_add`]: a Kubernetes lab's new node joins the cluster too.
pub fn node_add(st: &mut LabState, timeout: Duration) -> Result<NodeState> {
    topology::node_add(st, timeout, &Cluster)
}

/// [`topology::node_del`]: a Kubernetes lab's node leaves the cluster first.
pub fn node_del(st: &mut LabState, node: &str) -> Result<Vec<String>> {
    topology::node_del(st, node, &Cluster)
}

/// [`topology::down`]: the cluster is torn down first, and its leftovers swept last.
pub fn down(name: &str) -> Result<Vec<String>> {
    topology::down(name, &Cluster)
}

/// [`topology::status`], with the cluster's lines.
pub fn status(name: &str) -> Result<String> {
    topology::status(name, &Cluster)
}
