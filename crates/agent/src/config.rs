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
        }
    }
}
