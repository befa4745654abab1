//! The agent's configuration, from its command line and environment.

use std::path::PathBuf;

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
    /// CIDR of the pool created when none exists.
    pub default_ipv4_pool: String,
    /// Prefix of host-side veth names; interfaces with it and no endpoint are removed.
    pub interface_prefix: String,
    /// Pod MTU when the plugin does not set one; 0 = detect from the default route's interface.
    pub mtu: u32,
    /// Seconds between background reconciliation passes.
    pub resync_seconds: u64,
    /// Seconds an allocation must look leaked (no endpoint, no owner, not in flight) before the
    /// leak repair releases it.
    pub leak_grace_seconds: u64,
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
    /// Run the dataplane reconciler (node registration with tunnel addresses, routes to
    /// remote blocks, VXLAN/IPIP, natOutgoing). On by default.
    pub dataplane: bool,
    /// Run the BGP speaker (`--bgp`, see [`crate::bgp`]): routes to other nodes' blocks in
    /// unencapsulated pools are then learned over BGP instead of computed from the store.
    pub bgp: bool,
}

impl AgentConfig {
    /// A configuration with tern's defaults for everything but the node, store and socket.
    pub fn new(node_name: &str, store_url: &str, socket: impl Into<PathBuf>) -> AgentConfig {
        AgentConfig {
            node_name: node_name.to_string(),
            store_url: store_url.to_string(),
            socket: socket.into(),
            state_dir: PathBuf::from(tern_api::DEFAULT_STATE_DIR),
            default_ipv4_pool: "10.244.0.0/16".to_string(),
            interface_prefix: "tern".to_string(),
            mtu: 0,
            resync_seconds: 30,
            leak_grace_seconds: 60,
            metrics_addr: "127.0.0.1:9091".to_string(),
            health_addr: "127.0.0.1:9099".to_string(),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            node_ip: None,
            dataplane: true,
            bgp: false,
        }
    }
}
