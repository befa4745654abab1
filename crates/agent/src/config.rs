//! The agent's configuration, from its command line and environment.

use std::path::PathBuf;

/// Default number of requests served at once on the socket (`--max-connections`).
pub const MAX_CONNECTIONS: usize = 64;

/// Everything `ternd` needs to start.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's name (unique in the cluster).
    pub node_name: String,
    /// Store URL: `sqlite:///path/file.db` or `etcd://host:port[,host:port]`.
    pub store_url: String,
    /// Path of the unix socket the plugins connect to.
    pub socket: PathBuf,
    /// Node-local state: the release journal lives here.
    pub state_dir: PathBuf,
    /// CIDR of the IPv4 pool created when no IPv4 pool exists; empty: none is created (an
    /// IPv6-only cluster, `--no-default-ipv4-pool`).
    pub default_ipv4_pool: String,
    /// CIDR of the IPv6 pool created when no IPv6 pool exists (`--default-ipv6-pool`); `None`:
    /// none is created.
    pub default_ipv6_pool: Option<String>,
    /// Prefix of host-side veth names; interfaces with it and no endpoint are removed.
    pub interface_prefix: String,
    /// Pod MTU when the plugin does not set one; 0 = detect from the default route's interface.
    pub mtu: u32,
    /// Seconds between background reconciliation passes.
    pub resync_seconds: u64,
    /// Seconds an allocation must look leaked (no endpoint, no owner, not in flight) before the
    /// leak repair releases it.
    pub leak_grace_seconds: u64,
    /// Seconds a Kubernetes Node must stay deleted before the elected agent releases its IPAM
    /// (`--node-gc-grace`; see [`crate::kube::gc`]).
    pub node_gc_grace_seconds: u64,
    /// `host:port` of the HTTP listener serving `/metrics` (and the health paths); `0` or
    /// empty disables it.
    pub metrics_addr: String,
    /// `host:port` of the HTTP listener serving `/liveness` and `/readiness` (and `/metrics`);
    /// `0` or empty disables it. May equal `metrics_addr`: one listener then serves both.
    pub health_addr: String,
    /// TLS files for an etcd store (`--etcd-ca`, `--etcd-cert`, `--etcd-key`).
    pub etcd_ca: Option<PathBuf>,
    pub etcd_cert: Option<PathBuf>,
    pub etcd_key: Option<PathBuf>,
    /// Underlay address of this node (`--node-ip`); None = the default-route interface's
    /// addresses. Must be on a local interface.
    pub node_ip: Option<std::net::IpAddr>,
    /// The node's IPv6 underlay address next to an IPv4 `node_ip` (dual stack: `--node-ip`
    /// given as `v4,v6`). Must be on a local interface.
    pub node_ip6: Option<std::net::IpAddr>,
    /// Run the dataplane reconciler (node registration with tunnel addresses, routes to
    /// remote blocks, VXLAN/IPIP, natOutgoing). On by default.
    pub dataplane: bool,
    /// Run the BGP speaker (`--bgp`, see [`crate::bgp`]): routes to other nodes' blocks in
    /// unencapsulated pools are then learned over BGP instead of computed from the store.
    pub bgp: bool,
    /// Route every node's Kubernetes podCIDRs (tern Node `spec.podCIDRs`) to it like a block
    /// affine to it, and advertise this node's over BGP (`--use-pod-cidr`, for a delegated
    /// host-local with `ipam.subnet: usePodCidr`; Calico's `USE_POD_CIDR`). Off by default.
    pub use_pod_cidr: bool,
    /// Read pods, namespaces and NetworkPolicies from the Kubernetes API server
    /// (`--kubernetes`, or implied by `--kubeconfig`; see [`crate::kube`]).
    pub kubernetes: bool,
    /// Kubeconfig of the API server (`--kubeconfig` / `TERN_KUBECONFIG`); None with `kubernetes`
    /// set = the in-cluster service account (or `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// Group (gid) that may use the agent socket besides root (`--socket-group`, default 0): the
    /// socket is created `0660 root:<group>` whatever the umask, and every connection's peer
    /// credentials must be uid 0 or a member of this group.
    pub socket_group: u32,
    /// Requests served at once on the socket; a connection beyond this is answered "busy"
    /// (code 11) at once (`--max-connections`, default [`MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Start on a store that is empty, lacks the cluster ID or holds another cluster's, even
    /// though this node has pods (`--accept-new-store`): the reconciler then deletes the pod
    /// interfaces the store does not know. Off by default (see [`crate::identity`]).
    pub accept_new_store: bool,
    /// Set the sysctls tern needs (`ip_forward`, ...) when they are wrong; off with
    /// `--no-set-sysctls`, which only reports them (see [`crate::hostcheck`]).
    pub set_sysctls: bool,
    /// Flow records (see [`crate::flows`]): None = off, the policy table then carries no log
    /// statements. ternd turns them on by default (`--flow-log-group`).
    pub flows: Option<FlowsConfig>,
}

/// The flow records' bounds (`ternd --flow-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowsConfig {
    /// The NFLOG group the policy rules log each connection's first packet to.
    pub group: u16,
    /// Records kept (the ring; the oldest go first).
    pub ring: usize,
    /// Records made per second at most (a burst of as many); beyond it events are counted
    /// as dropped (sampled out), never queued.
    pub rate: u32,
    /// Minutes of per-minute aggregates kept.
    pub minutes: usize,
    /// Distinct aggregate keys per minute; more are counted in the minute's overflow.
    pub keys_per_minute: usize,
}

impl FlowsConfig {
    /// The defaults: group 2100, 10,000 records, 5,000 records/s, 15 minutes of at most
    /// 1,000 keys.
    pub fn new(group: u16) -> FlowsConfig {
        FlowsConfig {
            group,
            ring: 10_000,
            rate: 5_000,
            minutes: 15,
            keys_per_minute: 1_000,
        }
    }
}

/// The NFLOG group ternd logs flows to unless told otherwise.
pub const DEFAULT_FLOW_LOG_GROUP: u16 = 2100;

impl AgentConfig {
    /// A configuration with tern's defaults for everything but the node, store and socket.
    pub fn new(node_name: &str, store_url: &str, socket: impl Into<PathBuf>) -> AgentConfig {
        AgentConfig {
            node_name: node_name.to_string(),
            store_url: store_url.to_string(),
            socket: socket.into(),
            state_dir: PathBuf::from(tern_api::DEFAULT_STATE_DIR),
            default_ipv4_pool: tern_model::defaults::IPV4_POOL.to_string(),
            default_ipv6_pool: None,
            interface_prefix: "tern".to_string(),
            mtu: 0,
            resync_seconds: 30,
            leak_grace_seconds: 60,
            node_gc_grace_seconds: 60,
            metrics_addr: "127.0.0.1:9091".to_string(),
            health_addr: "127.0.0.1:9099".to_string(),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            node_ip: None,
            node_ip6: None,
            dataplane: true,
            bgp: false,
            use_pod_cidr: false,
            kubernetes: false,
            kubeconfig: None,
            socket_group: 0,
            max_connections: MAX_CONNECTIONS,
            accept_new_store: false,
            set_sysctls: true,
            flows: None,
        }
    }
}

/// Resolves `--socket-group`: a numeric gid or a group name from the group database.
pub fn resolve_group(spec: &str) -> Result<u32, String> {
    let spec = spec.trim();
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(spec)
        .map_err(|_| format!("--socket-group {spec:?}: contains a NUL byte"))?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: group is plain data filled by getgrnam_r; buf outlives the call and is only
    // referenced through `grp`'s string pointers, which we do not read.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: name is NUL-terminated; grp, buf (with its length) and out are ours and outlive the
    // call.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            &mut out,
        )
    };
    if rc != 0 {
        return Err(format!(
            "--socket-group {spec:?}: cannot read the group database: {}",
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    if out.is_null() {
        return Err(format!(
            "--socket-group {spec:?}: no such group (give a group name or a numeric gid)"
        ));
    }
    Ok(grp.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_resolve_by_number_and_name() {
        assert_eq!(resolve_group("0"), Ok(0));
        assert_eq!(resolve_group("1234"), Ok(1234));
        assert_eq!(resolve_group("root"), Ok(0));
        let e = resolve_group("no-such-group-tern").unwrap_err();
        assert!(e.contains("no such group"), "{e}");
    }
}
