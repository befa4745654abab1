//! Fixtures the allocator's tests share (this crate's unit and integration tests, and the
//! crates above it): pools and nodes written to a store, and the arguments of one pod's
//! allocation.
//!
//! Behind the `test-support` feature, with [`crate::storm`].

use tern_model::{IpPool, IpPoolSpec, Node, NodeSpec, put_resource};
use tern_store::Store;

use crate::{AllocationAttrs, AssignArgs};

/// Writes the pool `name` over `cidr` with blocks of `/block`, for the nodes `selector` picks
/// (`all()` for every node), enabled unless `disabled`. Panics when the write fails.
pub fn put_pool(
    store: &dyn Store,
    name: &str,
    cidr: &str,
    block: u8,
    selector: &str,
    disabled: bool,
) {
    let mut spec = IpPoolSpec::new(cidr);
    spec.block_size = block;
    spec.node_selector = selector.into();
    spec.disabled = disabled;
    put_resource(store, &IpPool::new(name, spec).into()).unwrap();
}

/// Writes the Node `name` with `labels`. Panics when the write fails.
pub fn put_node(store: &dyn Store, name: &str, labels: &[(&str, &str)]) {
    let mut n = Node::new(name, NodeSpec::default());
    n.metadata.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    put_resource(store, &n.into()).unwrap();
}

/// The allocation of `v4` IPv4 and `v6` IPv6 addresses on `node` for the pod `pod-<handle>`
/// in `default` (container ID `handle`, interface `eth0`) under `handle`.
pub fn pod_args(handle: &str, node: &str, v4: usize, v6: usize) -> AssignArgs {
    AssignArgs {
        handle: handle.into(),
        node: node.into(),
        attrs: AllocationAttrs {
            namespace: "default".into(),
            pod: format!("pod-{handle}"),
            node: node.into(),
            container_id: handle.into(),
            ifname: "eth0".into(),
        },
        num_v4: v4,
        num_v6: v6,
        ..AssignArgs::default()
    }
}
