//! The `tern` plugin's own configuration keys, read from the same stdin object as the spec's.
//!
//! A Calico conflist works with only `type` changed: every key of the Calico plugin is accepted;
//! those tern does not use are logged once at debug level.

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Keys of the Calico plugin that tern accepts and does not need (its agent owns these concerns).
pub const IGNORED_CALICO_KEYS: &[&str] = &[
    "datastore_type",
    "kubernetes",
    "policy",
    "nodename",
    "nodename_file",
    "nodename_file_optional",
    "endpoint_status_dir",
    "policy_setup_timeout_seconds",
    "etcd_endpoints",
    "etcd_discovery_srv",
    "etcd_key_file",
    "etcd_cert_file",
    "etcd_ca_cert_file",
    "etcd_scheme",
    "mode",
    "vxlan_mac_prefix",
    "vxlan_vni",
    "qps",
    "burst",
    "num_queues",
    "ipam_lock_file",
    "include_default_routes",
    "dataplane_options",
    "device_type",
    "readiness_gates",
    "require_mtu_file",
    "calico_api_group",
];

/// `container_settings`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerSettings {
    #[serde(default)]
    pub allow_ip_forwarding: bool,
}

/// `feature_control` (Calico's switches of optional features; the others are accepted and
/// unused).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FeatureControl {
    /// Allows the `ipAddrsNoIpam` pod annotation (addresses used without IPAM).
    #[serde(default)]
    pub ip_addrs_no_ipam: bool,
}

/// The keys of the `tern` plugin (and the Calico keys it honours).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TernConf {
    /// Pod MTU; 0 lets the agent decide.
    #[serde(default)]
    pub mtu: u32,
    /// ternd's socket (default `/run/tern/ternd.sock`).
    #[serde(default)]
    pub agent_socket: Option<PathBuf>,
    /// Node-local state directory shared with ternd (release journal).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Host veth prefix; must match ternd's `--interface-prefix`.
    #[serde(default)]
    pub interface_prefix: Option<String>,
    #[serde(default)]
    pub log_level: Option<String>,
    #[serde(default)]
    pub log_file_path: Option<PathBuf>,
    #[serde(default)]
    pub log_file_max_size: Option<u64>,
    #[serde(default)]
    pub log_file_max_age: Option<u64>,
    #[serde(default)]
    pub log_file_max_count: Option<u64>,
    #[serde(default)]
    pub container_settings: Option<ContainerSettings>,
    #[serde(default)]
    pub feature_control: Option<FeatureControl>,
    /// Every other key, checked against [`IGNORED_CALICO_KEYS`] for the debug log.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl TernConf {
    pub fn agent_socket(&self) -> PathBuf {
        self.agent_socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(tern_api::DEFAULT_SOCKET))
    }

    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(tern_api::DEFAULT_STATE_DIR))
    }

    pub fn interface_prefix(&self) -> &str {
        self.interface_prefix.as_deref().unwrap_or("tern")
    }

    /// The Calico keys present in this configuration that tern does not use.
    pub fn ignored_keys(&self) -> Vec<&str> {
        IGNORED_CALICO_KEYS
            .iter()
            .copied()
            .filter(|k| self.other.contains_key(*k))
            .collect()
    }
}

/// A boolean that Calico's conflists spell as a string ("true") or a JSON boolean.
fn flexible_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum B {
        Bool(bool),
        Str(String),
    }
    match Option::<B>::deserialize(d)? {
        None => Ok(None),
        Some(B::Bool(b)) => Ok(Some(b)),
        Some(B::Str(s)) => match s.to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(serde::de::Error::custom(format!(
                "expected \"true\" or \"false\", found {s:?}"
            ))),
        },
    }
}

/// The `ipam` section when its type is `tern-ipam` (Calico's calico-ipam keys).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TernIpamConf {
    #[serde(default, deserialize_with = "flexible_bool")]
    pub assign_ipv4: Option<bool>,
    #[serde(default, deserialize_with = "flexible_bool")]
    pub assign_ipv6: Option<bool>,
    #[serde(default)]
    pub ipv4_pools: Vec<String>,
    #[serde(default)]
    pub ipv6_pools: Vec<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calico_strings_and_bools() {
        let c: TernIpamConf = serde_json::from_value(
            serde_json::json!({"assign_ipv4": "true", "assign_ipv6": false}),
        )
        .unwrap();
        assert_eq!(c.assign_ipv4, Some(true));
        assert_eq!(c.assign_ipv6, Some(false));
        let e = serde_json::from_value::<TernIpamConf>(serde_json::json!({"assign_ipv4": "yes"}));
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("expected \"true\" or \"false\"")
        );
    }

    #[test]
    fn ignored_keys_listed() {
        let c: TernConf = serde_json::from_value(serde_json::json!({
            "type": "tern", "datastore_type": "kubernetes", "policy": {"type": "k8s"}, "mtu": 1400
        }))
        .unwrap();
        assert_eq!(c.mtu, 1400);
        assert_eq!(c.ignored_keys(), vec!["datastore_type", "policy"]);
    }
}
