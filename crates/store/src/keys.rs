//! Every key path tern writes, in one place. All keys live under `/tern/v1/`.
//!
//! CIDRs appear in keys with `/` replaced by `-` (`10.244.0.0-26`), as Calico does.

/// Root of all tern keys.
pub const ROOT: &str = "/tern/v1/";

/// Encodes a CIDR for use as one key segment.
pub fn cidr_segment(cidr: &str) -> String {
    cidr.replace('/', "-")
}

/// Decodes a key segment produced by [`cidr_segment`].
pub fn segment_cidr(seg: &str) -> String {
    match seg.rfind('-') {
        Some(i) => format!("{}/{}", &seg[..i], &seg[i + 1..]),
        None => seg.to_string(),
    }
}

/// Prefix of typed resources of one kind (`IPPool`, `WorkloadEndpoint`, ...).
pub fn resource_prefix(kind: &str) -> String {
    format!("{ROOT}resources/{}/", kind.to_ascii_lowercase())
}

/// Key of one cluster-scoped resource.
pub fn resource(kind: &str, name: &str) -> String {
    format!("{}{name}", resource_prefix(kind))
}

/// Key of one namespaced resource.
pub fn namespaced_resource(kind: &str, namespace: &str, name: &str) -> String {
    format!("{}{namespace}/{name}", resource_prefix(kind))
}

/// Prefix of all IPAM blocks.
pub const BLOCKS: &str = "/tern/v1/ipam/blocks/";

/// Key of the allocation block for a CIDR.
pub fn block(cidr: &str) -> String {
    format!("{BLOCKS}{}", cidr_segment(cidr))
}

/// Prefix of all block affinities.
pub const AFFINITIES: &str = "/tern/v1/ipam/affinities/";

/// Prefix of one node's block affinities.
pub fn node_affinities(node: &str) -> String {
    format!("{AFFINITIES}{node}/")
}

/// Key of the affinity of `node` for the block `cidr`.
pub fn affinity(node: &str, cidr: &str) -> String {
    format!("{}{}", node_affinities(node), cidr_segment(cidr))
}

/// Prefix of all IPAM handles.
pub const HANDLES: &str = "/tern/v1/ipam/handles/";

/// Key of an IPAM handle (`<network>.<containerID>`).
pub fn handle(handle_id: &str) -> String {
    format!("{HANDLES}{handle_id}")
}

/// Key of the cluster IPAM configuration.
pub const IPAM_CONFIG: &str = "/tern/v1/ipam/config";

/// Key of the cluster's identity: a random ID written once, with a create-only transaction, by
/// the first agent that finds the store empty (see `tern_store::cluster_id`). Nodes remember it
/// in their state directory; a store without it, or with another one, is not the store their
/// pods were recorded in.
pub const CLUSTER_ID: &str = "/tern/v1/cluster/id";

/// Prefix of the endpoint records `ternctl datastore migrate` leaves for each node's agent
/// when the target derives its WorkloadEndpoints from Pods (the Kubernetes datastore): the
/// agent moves its node's into its local endpoint store at start and deletes them here.
pub const ENDPOINT_IMPORT: &str = "/tern/v1/endpoint-import/";

/// Prefix of the endpoint records left for `node`'s agent.
pub fn node_endpoint_imports(node: &str) -> String {
    format!("{ENDPOINT_IMPORT}{node}/")
}

/// Prefix of the owner records of standalone `tern-ipam` allocations (`<node>/<handle>`).
pub const OWNERS: &str = "/tern/v1/ipam/owners/";

/// Key of the owner record of `handle` on `node`.
pub fn owner(node: &str, handle: &str) -> String {
    format!("{OWNERS}{node}/{handle}")
}

/// Prefix of node liveness keys (attached to a lease).
pub const NODE_LIVENESS: &str = "/tern/v1/liveness/";

/// Key of a node's liveness record.
pub fn node_liveness(node: &str) -> String {
    format!("{NODE_LIVENESS}{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_round_trip() {
        assert_eq!(cidr_segment("10.244.0.0/26"), "10.244.0.0-26");
        assert_eq!(segment_cidr("10.244.0.0-26"), "10.244.0.0/26");
        assert_eq!(segment_cidr("fd00::-122"), "fd00::/122");
        assert_eq!(
            block("10.244.1.64/26"),
            "/tern/v1/ipam/blocks/10.244.1.64-26"
        );
    }

    #[test]
    fn resource_keys() {
        assert_eq!(
            resource("IPPool", "default"),
            "/tern/v1/resources/ippool/default"
        );
        assert_eq!(
            namespaced_resource("WorkloadEndpoint", "ns1", "pod-eth0"),
            "/tern/v1/resources/workloadendpoint/ns1/pod-eth0"
        );
    }
}
