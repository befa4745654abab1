//! Network configuration: one plugin's stdin ([`NetConf`]) and the
//! runtime's list file ([`ConfList`]).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::env::is_valid_id;
use crate::error::{CniError, from_value_with_path};
use crate::result::Dns;
use crate::version::{SUPPORTED_VERSIONS, Version};

/// The `ipam` section: its typed `type` plus every other key as received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ipam {
    /// The IPAM plugin to run, e.g. `"tern-ipam"` or `"host-local"`.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// All other keys (e.g. `assign_ipv4`, `ranges`, `subnet`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// `runtimeConfig`: capability arguments the runtime injected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeConfig {
    /// `ips` capability: requested addresses (CIDR or plain).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// `mac` capability: requested MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// `portMappings` capability, kept raw for the portmap plugin's format.
    #[serde(
        rename = "portMappings",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub port_mappings: Option<Value>,
    /// `bandwidth` capability, kept raw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Value>,
    /// Every other capability (`ipRanges`, `dns`, `aliases`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A label in `args.cni.labels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// Label key.
    pub key: String,
    /// Label value.
    pub value: String,
}

/// The protocol of a named container port (Kubernetes `ContainerPort.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortProtocol {
    /// TCP, the default when `protocol` is absent.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl PortProtocol {
    /// `TCP`, `UDP` or `SCTP`, as Kubernetes spells them.
    pub fn as_str(self) -> &'static str {
        match self {
            PortProtocol::Tcp => "TCP",
            PortProtocol::Udp => "UDP",
            PortProtocol::Sctp => "SCTP",
        }
    }

    /// Parses a protocol name, case-insensitively (`tcp`, `Udp`, `SCTP`, ...).
    pub fn parse(s: &str) -> Option<PortProtocol> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(PortProtocol::Tcp),
            "UDP" => Some(PortProtocol::Udp),
            "SCTP" => Some(PortProtocol::Sctp),
            _ => None,
        }
    }
}

/// A named container port in `args.cni.ports`, a tern extension next to `args.cni.labels`
/// shaped like a Kubernetes `ContainerPort`:
/// `{"name": "http", "containerPort": 8080, "protocol": "TCP"}`.
///
/// [`NetConf::parse`] validates every entry (see [`validate_container_ports`]), so a parsed
/// configuration only holds valid ports. Other keys (`hostPort`, `hostIP`) are kept in
/// [`ContainerPort::extra`] and not used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerPort {
    /// The port's name, an IANA service name (`http`, `metrics`).
    pub name: String,
    /// The port number in the container, 1-65535.
    #[serde(rename = "containerPort")]
    pub container_port: u16,
    /// `TCP`, `UDP` or `SCTP` in any case; TCP when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Other keys, kept so a re-serialised configuration is unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ContainerPort {
    /// The protocol, TCP when absent; `None` for a name that is not TCP, UDP or SCTP (which
    /// [`NetConf::parse`] rejects).
    pub fn protocol(&self) -> Option<PortProtocol> {
        match &self.protocol {
            None => Some(PortProtocol::Tcp),
            Some(p) => PortProtocol::parse(p),
        }
    }
}

/// Whether `name` is an IANA service name as Kubernetes requires of port names: 1-15
/// characters of lowercase letters, digits and `-`, at least one letter, no leading,
/// trailing or double `-`.
pub fn is_iana_svc_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// Validates a raw `args.cni.ports` value (`field` is its path, e.g. `args.cni.ports`) and
/// returns a code 7 error naming the first bad field, e.g.
/// `invalid network config: args.cni.ports[1].containerPort: 70000 is not a port`.
///
/// Checked on the raw JSON rather than through serde so that every message names the exact
/// field: inside `args.cni` (a struct with flattened unknown keys) serde loses the path.
pub fn validate_container_ports(ports: &Value, field: &str) -> Result<(), CniError> {
    let bad =
        |f: String, why: String| CniError::invalid_config(format!("invalid {NETCONF}: {f}: {why}"));
    let Value::Array(list) = ports else {
        return Err(bad(
            field.to_string(),
            format!(
                "expected an array of {{\"name\", \"containerPort\", \"protocol\"}}, found {}",
                json_kind(ports)
            ),
        ));
    };
    let mut seen: Vec<&str> = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Value::Object(obj) = p else {
            return Err(bad(
                at,
                format!("expected an object, found {}", json_kind(p)),
            ));
        };
        let name = match obj.get("name") {
            None | Some(Value::Null) => {
                return Err(bad(
                    format!("{at}.name"),
                    "is missing (a named port needs a name)".into(),
                ));
            }
            Some(Value::String(s)) if is_iana_svc_name(s) => s.as_str(),
            Some(Value::String(s)) => {
                return Err(bad(
                    format!("{at}.name"),
                    format!(
                        "{s:?} is not a valid port name (1-15 lowercase letters, digits and '-', \
                         at least one letter, no leading, trailing or double '-')"
                    ),
                ));
            }
            Some(other) => {
                return Err(bad(
                    format!("{at}.name"),
                    format!("expected a string, found {}", json_kind(other)),
                ));
            }
        };
        match obj.get("containerPort") {
            None | Some(Value::Null) => {
                return Err(bad(format!("{at}.containerPort"), "is missing".into()));
            }
            Some(Value::Number(n)) if n.as_u64().is_some_and(|v| (1..=65535).contains(&v)) => {}
            Some(Value::Number(n)) => {
                return Err(bad(
                    format!("{at}.containerPort"),
                    format!("{n} is not a port (1-65535)"),
                ));
            }
            Some(other) => {
                return Err(bad(
                    format!("{at}.containerPort"),
                    format!("expected a number, found {}", json_kind(other)),
                ));
            }
        }
        match obj.get("protocol") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if PortProtocol::parse(s).is_some() => {}
            Some(Value::String(s)) => {
                return Err(bad(
                    format!("{at}.protocol"),
                    format!("{s:?} is not TCP, UDP or SCTP"),
                ));
            }
            Some(other) => {
                return Err(bad(
                    format!("{at}.protocol"),
                    format!("expected a string, found {}", json_kind(other)),
                ));
            }
        }
        // Kubernetes refuses two ports of one pod with the same name: a policy naming it
        // would otherwise be ambiguous.
        if let Some(j) = seen.iter().position(|n| *n == name) {
            return Err(bad(
                format!("{at}.name"),
                format!("{name:?} is already the name of {field}[{j}]"),
            ));
        }
        seen.push(name);
    }
    Ok(())
}

/// The `cni` namespace of `args` (CONVENTIONS.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniConventionArgs {
    /// `args.cni.labels`: `[{"key", "value"}]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<Label>,
    /// `args.cni.ports` (tern extension): the pod's named container ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// `args.cni.ips`: requested addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
    /// Other keys.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl CniConventionArgs {
    /// The labels as a map (a later duplicate key wins).
    pub fn labels_map(&self) -> BTreeMap<String, String> {
        self.labels
            .iter()
            .map(|l| (l.key.clone(), l.value.clone()))
            .collect()
    }
}

/// `args`: runtime-supplied arguments in the configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfArgs {
    /// `args.cni`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<CniConventionArgs>,
    /// Other namespaces (e.g. `org.apache.mesos`).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An attachment listed for GC: `{"containerID", "ifname"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// The container ID given to ADD.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name given to ADD.
    pub ifname: String,
}

/// One plugin's configuration, as received on stdin.
///
/// Unknown keys are kept in [`NetConf::extra`], so serialising a `NetConf`
/// gives back every key it was parsed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetConf {
    /// `cniVersion`; a missing or empty one is 0.1.0.
    #[serde(rename = "cniVersion", default)]
    pub cni_version: Version,
    /// The network name.
    pub name: String,
    /// The plugin binary name.
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// `ipam`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Ipam>,
    /// `dns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    /// `prevResult`, raw; parse with [`crate::CniResult::from_json`].
    #[serde(
        rename = "prevResult",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub prev_result: Option<Value>,
    /// `runtimeConfig`.
    #[serde(
        rename = "runtimeConfig",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_config: Option<RuntimeConfig>,
    /// `args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<ConfArgs>,
    /// `cni.dev/valid-attachments` (GC, 1.1.0).
    #[serde(
        rename = "cni.dev/valid-attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// `cni.dev/attachments`: the key libcni also sends for GC (cni#1101).
    #[serde(
        rename = "cni.dev/attachments",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub legacy_attachments: Option<Vec<Attachment>>,
    /// Every other key, e.g. plugin-specific settings such as `mtu`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Decodes stdin bytes to a JSON object: malformed JSON is code 6, anything
/// but an object is code 7.
fn decode_object(bytes: &[u8], what: &str) -> Result<Map<String, Value>, CniError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| CniError::decode(format!("failed to decode {what}: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(CniError::invalid_config(format!(
            "invalid {what}: expected a JSON object, found {}",
            json_kind(&other)
        ))),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks `cniVersion` before anything else, so an unsupported version is
/// code 1 rather than a generic decode error, as Go's skel does.
fn check_version(map: &Map<String, Value>) -> Result<Version, CniError> {
    match map.get("cniVersion") {
        None | Some(Value::Null) => Ok(Version::default()),
        Some(Value::String(s)) if s.is_empty() => Ok(Version::default()),
        Some(Value::String(s)) => s.parse(),
        Some(other) => Err(CniError::invalid_config(format!(
            "invalid network config: field `cniVersion`: expected a string, found {}",
            json_kind(other)
        ))),
    }
}

const NETCONF: &str = "network config";

impl NetConf {
    /// Parses one plugin's stdin.
    ///
    /// Malformed JSON is code 6; an unsupported `cniVersion` is code 1; a
    /// missing `name`/`type`, an empty `type` or a field of the wrong type is
    /// code 7 naming the field.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, CniError> {
        let map = decode_object(bytes, NETCONF)?;
        Self::from_map(map)
    }

    /// Parses stdin into a `NetConf` and also into a plugin-specific type `T`
    /// read from the same object (so `T` sees `mtu`, `ipam`, ... with the same
    /// error messages, e.g. ``field `mtu`: invalid type: string "x", expected u32``).
    pub fn parse_with<T: DeserializeOwned>(bytes: &[u8]) -> Result<(NetConf, T), CniError> {
        let map = decode_object(bytes, NETCONF)?;
        let conf = Self::from_map(map.clone())?;
        let typed = from_value_with_path(Value::Object(map), NETCONF)?;
        Ok((conf, typed))
    }

    fn from_map(map: Map<String, Value>) -> Result<NetConf, CniError> {
        check_version(&map)?;
        if let Some(ports) = map
            .get("args")
            .and_then(|a| a.get("cni"))
            .and_then(|c| c.get("ports"))
        {
            validate_container_ports(ports, "args.cni.ports")?;
        }
        let conf: NetConf = from_value_with_path(Value::Object(map), NETCONF)?;
        if conf.plugin_type.is_empty() {
            return Err(CniError::invalid_config(
                "invalid network config: field `type` is empty",
            ));
        }
        if let Some(ipam) = &conf.ipam
            && ipam.plugin_type.is_empty()
        {
            return Err(CniError::invalid_config(
                "invalid network config: field `ipam.type` is empty",
            ));
        }
        Ok(conf)
    }

    /// Reads the plugin-specific keys in [`NetConf::extra`] as `T`, with
    /// errors naming the field.
    pub fn extra_as<T: DeserializeOwned>(&self) -> Result<T, CniError> {
        from_value_with_path(Value::Object(self.extra.clone()), NETCONF)
    }

    /// The configuration as JSON (every key, including unknown ones).
    pub fn to_json(&self) -> Value {
        // Serialising plain maps, strings and numbers cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The configuration as bytes, e.g. the stdin of a delegated plugin.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The attachments a GC call says are still valid, from both
/// `cni.dev/valid-attachments` and the legacy `cni.dev/attachments`,
/// de-duplicated, in order of first appearance, as `(container_id, ifname)`.
pub fn valid_attachments(conf: &NetConf) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let all = conf
        .valid_attachments
        .iter()
        .chain(conf.legacy_attachments.iter())
        .flatten();
    for a in all {
        let pair = (a.container_id.clone(), a.ifname.clone());
        if !out.contains(&pair) {
            out.push(pair);
        }
    }
    out
}

/// libcni accepts `true`/`false` and the strings `"true"`/`"false"` for
/// `disableCheck` and `disableGC`.
fn bool_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Bool(b) => Ok(b),
        Value::String(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Value::String(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        other => Err(serde::de::Error::custom(format!(
            "expected a boolean or \"true\"/\"false\", found {other}"
        ))),
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A network configuration list (a `.conflist` file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfList {
    /// `cniVersion` as written (may be empty when only `cniVersions` is given).
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// `cniVersions` (1.1.0): alternative versions; the highest supported wins.
    #[serde(rename = "cniVersions", default, skip_serializing_if = "Vec::is_empty")]
    pub cni_versions: Vec<String>,
    /// The network name, `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
    pub name: String,
    /// The runtime must not call CHECK.
    #[serde(
        rename = "disableCheck",
        default,
        deserialize_with = "bool_or_string",
        skip_serializing_if = "is_false"
    )]
    pub disable_check: bool,
    /// The runtime must not call GC.
    #[serde(
        rename = "disableGC",
        default,
        deserialize_with = "bool_or_string",
        skip_serializing_if = "is_false"
    )]
    pub disable_gc: bool,
    /// Only the inlined `plugins` are used (no separate plugin files).
    #[serde(
        rename = "loadOnlyInlinedPlugins",
        default,
        skip_serializing_if = "is_false"
    )]
    pub load_only_inlined_plugins: bool,
    /// The plugin configurations, raw (each has at least a string `type`).
    pub plugins: Vec<Map<String, Value>>,
    /// Other top-level keys.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

const CONFLIST: &str = "network config list";

impl ConfList {
    /// Parses and validates a configuration list: malformed JSON is code 6;
    /// a bad `name`, no plugins, a plugin without a string `type` or a field of
    /// the wrong type is code 7; no supported version is code 1.
    pub fn parse(bytes: &[u8]) -> Result<ConfList, CniError> {
        let map = decode_object(bytes, CONFLIST)?;
        let list: ConfList = from_value_with_path(Value::Object(map), CONFLIST)?;
        if !is_valid_id(&list.name) {
            return Err(CniError::invalid_config(format!(
                "invalid {CONFLIST}: field `name`: {:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
                list.name
            )));
        }
        if list.plugins.is_empty() {
            return Err(CniError::invalid_config(format!(
                "invalid {CONFLIST}: field `plugins` is empty"
            )));
        }
        for (i, p) in list.plugins.iter().enumerate() {
            match p.get("type") {
                Some(Value::String(t)) if !t.is_empty() => {}
                _ => {
                    return Err(CniError::invalid_config(format!(
                        "invalid {CONFLIST}: field `plugins[{i}].type` is missing or not a non-empty string"
                    )));
                }
            }
        }
        list.effective_version()?;
        Ok(list)
    }

    /// The version to run the list with: the highest supported one of
    /// `cniVersion` ∪ `cniVersions`. Unsupported entries are skipped; none at
    /// all is code 7 (missing) or code 1 (none supported).
    pub fn effective_version(&self) -> Result<Version, CniError> {
        let candidates: Vec<&String> = std::iter::once(&self.cni_version)
            .filter(|v| !v.is_empty())
            .chain(self.cni_versions.iter())
            .collect();
        if candidates.is_empty() {
            return Err(CniError::invalid_config(format!(
                "invalid {CONFLIST}: missing field `cniVersion`"
            )));
        }
        candidates
            .iter()
            .filter_map(|v| Version::parse(v))
            .max()
            .ok_or_else(|| {
                CniError::incompatible_version(format!(
                    "incompatible CNI versions: cniVersion/cniVersions {candidates:?} has none of {SUPPORTED_VERSIONS:?}"
                ))
            })
    }

    /// The names of the plugin types, in list order.
    pub fn plugin_types(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
            .collect()
    }

    /// The execution configuration of plugin `index` as a runtime builds it
    /// (spec section 3): `cniVersion` and `name` injected, `capabilities`
    /// removed, `runtimeConfig` = the capability arguments the plugin declares,
    /// `prevResult` injected when given. Errors: index out of range is code 7.
    pub fn exec_config(
        &self,
        index: usize,
        prev_result: Option<&Value>,
        capability_args: &Map<String, Value>,
    ) -> Result<Value, CniError> {
        let mut conf = self.plugins.get(index).cloned().ok_or_else(|| {
            CniError::invalid_config(format!(
                "{CONFLIST} {:?} has {} plugins, no index {index}",
                self.name,
                self.plugins.len()
            ))
        })?;
        let version = self.effective_version()?;
        conf.insert("cniVersion".into(), version.as_str().into());
        conf.insert("name".into(), self.name.clone().into());
        let capabilities = conf.remove("capabilities");
        let mut runtime_config = Map::new();
        if let Some(Value::Object(caps)) = capabilities {
            for (key, enabled) in caps {
                if enabled == Value::Bool(true)
                    && let Some(arg) = capability_args.get(&key)
                {
                    runtime_config.insert(key, arg.clone());
                }
            }
        }
        if !runtime_config.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime_config));
        }
        if let Some(prev) = prev_result {
            conf.insert("prevResult".into(), prev.clone());
        }
        Ok(Value::Object(conf))
    }

    /// The execution configuration of plugin `index` parsed as a [`NetConf`]
    /// (no `prevResult`, no capability arguments).
    pub fn plugin_conf(&self, index: usize) -> Result<NetConf, CniError> {
        match self.exec_config(index, None, &Map::new())? {
            Value::Object(map) => NetConf::from_map(map),
            _ => unreachable!("exec_config always returns an object"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code;
    use serde_json::json;

    const BASIC: &str = r#"{
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "tern",
        "mtu": 1450,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/16"}]]},
        "dns": {"nameservers": ["10.96.0.10"]},
        "runtimeConfig": {
            "ips": ["10.1.0.9/16"],
            "mac": "0a:58:00:00:00:01",
            "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
            "bandwidth": {"ingressRate": 1000},
            "aliases": ["a"]
        },
        "args": {"cni": {"labels": [{"key": "app", "value": "web"}], "ips": ["10.1.0.9"]},
                 "org.apache.mesos": {"x": 1}},
        "cni.dev/some-future-key": true,
        "policy": {"type": "k8s"}
    }"#;

    #[test]
    fn parses_typed_fields() {
        let c = NetConf::parse(BASIC.as_bytes()).unwrap();
        assert_eq!(c.cni_version, Version::V1_0_0);
        assert_eq!(c.name, "k8s-pod-network");
        assert_eq!(c.plugin_type, "tern");
        let ipam = c.ipam.as_ref().unwrap();
        assert_eq!(ipam.plugin_type, "host-local");
        assert!(ipam.extra.contains_key("ranges"));
        assert_eq!(c.dns.as_ref().unwrap().nameservers, vec!["10.96.0.10"]);
        let rc = c.runtime_config.as_ref().unwrap();
        assert_eq!(rc.ips, vec!["10.1.0.9/16"]);
        assert_eq!(rc.mac.as_deref(), Some("0a:58:00:00:00:01"));
        assert_eq!(rc.port_mappings.as_ref().unwrap()[0]["hostPort"], 8080);
        assert_eq!(rc.bandwidth.as_ref().unwrap()["ingressRate"], 1000);
        assert_eq!(rc.extra["aliases"], json!(["a"]));
        let cni_args = c.args.as_ref().unwrap().cni.as_ref().unwrap();
        assert_eq!(
            cni_args.labels_map().get("app").map(String::as_str),
            Some("web")
        );
        assert_eq!(cni_args.ips, vec!["10.1.0.9"]);
        assert_eq!(c.extra["mtu"], 1450);
        assert_eq!(c.extra["policy"]["type"], "k8s");
        assert!(c.prev_result.is_none());
    }

    #[test]
    fn round_trip_keeps_unknown_keys() {
        let original: Value = serde_json::from_str(BASIC).unwrap();
        let c = NetConf::parse(BASIC.as_bytes()).unwrap();
        assert_eq!(c.to_json(), original);
        let again = NetConf::parse(&c.to_bytes()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn malformed_json_is_code_6() {
        let e = NetConf::parse(b"{\"name\": ").unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("network config"), "{}", e.msg);
        assert_eq!(NetConf::parse(b"").unwrap_err().code, code::DECODE);
    }

    #[test]
    fn not_an_object_is_code_7() {
        let e = NetConf::parse(b"[1]").unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("array"), "{}", e.msg);
    }

    #[test]
    fn missing_type_and_name_are_code_7_naming_them() {
        let e = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("`type`"), "{}", e.msg);
        let e = NetConf::parse(br#"{"cniVersion":"1.0.0","type":"tern"}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("`name`"), "{}", e.msg);
        let e = NetConf::parse(br#"{"name":"n","type":""}"#).unwrap_err();
        assert!(e.msg.contains("`type` is empty"), "{}", e.msg);
        let e = NetConf::parse(br#"{"name":"n","type":"t","ipam":{}}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(
            e.msg.contains("`ipam`") && e.msg.contains("`type`"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn wrong_type_names_the_field_path() {
        let e =
            NetConf::parse(br#"{"name":"n","type":"t","runtimeConfig":{"ips":[5]}}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert_eq!(
            e.msg,
            "invalid network config: field `runtimeConfig.ips[0]`: invalid type: integer `5`, expected a string"
        );
        let e = NetConf::parse(br#"{"name":"n","type":"t","cniVersion":1}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("`cniVersion`"), "{}", e.msg);
    }

    #[test]
    fn plugin_specific_fields_via_parse_with() {
        #[derive(Deserialize)]
        struct TernConf {
            #[serde(default)]
            mtu: u32,
        }
        let (conf, t): (NetConf, TernConf) =
            NetConf::parse_with(br#"{"name":"n","type":"tern","mtu":1400}"#).unwrap();
        assert_eq!((conf.plugin_type.as_str(), t.mtu), ("tern", 1400));
        let e = NetConf::parse_with::<TernConf>(br#"{"name":"n","type":"tern","mtu":"x"}"#)
            .err()
            .unwrap();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert_eq!(
            e.msg,
            "invalid network config: field `mtu`: invalid type: string \"x\", expected u32"
        );
        let t: TernConf = conf.extra_as().unwrap();
        assert_eq!(t.mtu, 1400);
    }

    #[test]
    fn cni_version_missing_is_0_1_0_and_unsupported_is_code_1() {
        let c = NetConf::parse(br#"{"name":"n","type":"t"}"#).unwrap();
        assert_eq!(c.cni_version, Version::V0_1_0);
        let c = NetConf::parse(br#"{"cniVersion":"","name":"n","type":"t"}"#).unwrap();
        assert_eq!(c.cni_version, Version::V0_1_0);
        let e = NetConf::parse(br#"{"cniVersion":"2.0.0","name":"n","type":"t"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(
            e.msg.contains("cniVersion") && e.msg.contains("2.0.0"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn gc_attachments_from_both_keys() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"tern",
                "cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"containerID":"c2","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"c2","ifname":"eth0"},{"containerID":"c3","ifname":"net1"}]}"#,
        )
        .unwrap();
        assert_eq!(
            valid_attachments(&c),
            vec![
                ("c1".to_owned(), "eth0".to_owned()),
                ("c2".to_owned(), "eth0".to_owned()),
                ("c3".to_owned(), "net1".to_owned()),
            ]
        );
        let only_legacy = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","type":"tern","cni.dev/attachments":[{"containerID":"c9","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            valid_attachments(&only_legacy),
            vec![("c9".to_owned(), "eth0".to_owned())]
        );
        let none = NetConf::parse(br#"{"name":"n","type":"t"}"#).unwrap();
        assert!(valid_attachments(&none).is_empty());
        let bad = NetConf::parse(
            br#"{"name":"n","type":"t","cni.dev/valid-attachments":[{"ifname":"eth0"}]}"#,
        )
        .unwrap_err();
        assert!(
            bad.msg.contains("cni.dev/valid-attachments[0]"),
            "{}",
            bad.msg
        );
        assert!(bad.msg.contains("containerID"), "{}", bad.msg);
    }

    #[test]
    fn prev_result_kept_raw() {
        let c = NetConf::parse(
            br#"{"cniVersion":"0.4.0","name":"n","type":"bandwidth",
                "prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/32"}]}}"#,
        )
        .unwrap();
        let prev = crate::CniResult::from_json(c.prev_result.as_ref().unwrap()).unwrap();
        assert_eq!(prev.ips[0].address.to_string(), "10.0.0.2/32");
    }

    #[test]
    fn conflist_validation() {
        let ok = br#"{"cniVersion":"1.0.0","name":"net1","plugins":[{"type":"tern"}]}"#;
        assert_eq!(
            ConfList::parse(ok).unwrap().effective_version().unwrap(),
            Version::V1_0_0
        );

        let e =
            ConfList::parse(br#"{"cniVersion":"1.0.0","name":"-bad","plugins":[{"type":"x"}]}"#)
                .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(
            e.msg.contains("`name`") && e.msg.contains("-bad"),
            "{}",
            e.msg
        );

        let e = ConfList::parse(br#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#).unwrap_err();
        assert!(e.msg.contains("`plugins`"), "{}", e.msg);

        let e = ConfList::parse(
            br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a"},{"mtu":1}]}"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("`plugins[1].type`"), "{}", e.msg);

        let e = ConfList::parse(br#"{"cniVersion":"1.0.0","name":"n"}"#).unwrap_err();
        assert!(e.msg.contains("`plugins`"), "{}", e.msg);

        let e = ConfList::parse(br#"{"cniVersion":"3.0.0","name":"n","plugins":[{"type":"a"}]}"#)
            .unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);

        let e = ConfList::parse(br#"{"name":"n","plugins":[{"type":"a"}]}"#).unwrap_err();
        assert!(e.msg.contains("`cniVersion`"), "{}", e.msg);

        let e = ConfList::parse(
            br#"{"cniVersion":"1.0.0","name":"n","disableCheck":3,"plugins":[{"type":"a"}]}"#,
        )
        .unwrap_err();
        assert!(e.msg.contains("`disableCheck`"), "{}", e.msg);

        assert_eq!(ConfList::parse(b"{").unwrap_err().code, code::DECODE);
    }

    #[test]
    fn conflist_versions_and_flags() {
        let l = ConfList::parse(
            br#"{"cniVersion":"0.4.0","cniVersions":["1.0.0","1.1.0","9.0.0"],"name":"n",
                "disableCheck":"true","disableGC":true,"plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        assert_eq!(l.effective_version().unwrap(), Version::V1_1_0);
        assert!(l.disable_check && l.disable_gc && !l.load_only_inlined_plugins);
    }

    #[test]
    fn exec_config_injects_and_filters_capabilities() {
        let l = ConfList::parse(
            br#"{"cniVersion":"1.0.0","name":"net1","plugins":[
                {"type":"tern","mtu":1400},
                {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false},"snat":true}]}"#,
        )
        .unwrap();
        let mut caps = Map::new();
        caps.insert("portMappings".into(), json!([{"hostPort": 80}]));
        caps.insert("bandwidth".into(), json!({"ingressRate": 1}));
        let prev = json!({"cniVersion": "1.0.0"});
        let conf = l.exec_config(1, Some(&prev), &caps).unwrap();
        assert_eq!(
            conf,
            json!({"cniVersion": "1.0.0", "name": "net1", "type": "portmap", "snat": true,
                   "runtimeConfig": {"portMappings": [{"hostPort": 80}]},
                   "prevResult": {"cniVersion": "1.0.0"}})
        );
        let first = l.exec_config(0, None, &caps).unwrap();
        assert_eq!(
            first,
            json!({"cniVersion": "1.0.0", "name": "net1", "type": "tern", "mtu": 1400})
        );
        assert_eq!(
            l.exec_config(2, None, &caps).unwrap_err().code,
            code::INVALID_CONFIG
        );
        assert_eq!(l.plugin_types(), vec!["tern", "portmap"]);
    }
    fn with_ports(ports: &str) -> Result<NetConf, CniError> {
        NetConf::parse(
            format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"tern","args":{{"cni":{{"ports":{ports}}}}}}}"#
            )
            .as_bytes(),
        )
    }

    #[test]
    fn named_ports_parse_with_default_and_any_case_protocol() {
        let c = with_ports(
            r#"[{"name":"http","containerPort":8080,"protocol":"TCP"},
                {"name":"dns","containerPort":53,"protocol":"udp"},
                {"name":"metrics-2","containerPort":9090},
                {"name":"assoc","containerPort":3868,"protocol":"Sctp","hostPort":3868}]"#,
        )
        .unwrap();
        let ports = &c.args.as_ref().unwrap().cni.as_ref().unwrap().ports;
        let got: Vec<(&str, u16, Option<PortProtocol>)> = ports
            .iter()
            .map(|p| (p.name.as_str(), p.container_port, p.protocol()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("http", 8080, Some(PortProtocol::Tcp)),
                ("dns", 53, Some(PortProtocol::Udp)),
                ("metrics-2", 9090, Some(PortProtocol::Tcp)),
                ("assoc", 3868, Some(PortProtocol::Sctp)),
            ]
        );
        assert_eq!(ports[3].extra["hostPort"], 3868);
        // Re-serialising keeps the entries as written (a delegated plugin sees the same).
        let again = NetConf::parse(&c.to_bytes()).unwrap();
        assert_eq!(again, c);
        assert_eq!(c.to_json()["args"]["cni"]["ports"][1]["protocol"], "udp");
        // No ports at all is fine, and so is an empty list.
        assert!(with_ports("[]").is_ok());
    }

    #[test]
    fn bad_named_ports_are_code_7_naming_the_field() {
        let cases: &[(&str, &str)] = &[
            (
                r#"[{"name":"http","containerPort":80},{"name":"big","containerPort":70000}]"#,
                "invalid network config: args.cni.ports[1].containerPort: 70000 is not a port (1-65535)",
            ),
            (
                r#"[{"name":"zero","containerPort":0}]"#,
                "args.cni.ports[0].containerPort: 0 is not a port",
            ),
            (
                r#"[{"name":"neg","containerPort":-1}]"#,
                "args.cni.ports[0].containerPort: -1 is not a port",
            ),
            (
                r#"[{"name":"frac","containerPort":80.5}]"#,
                "args.cni.ports[0].containerPort: 80.5 is not a port",
            ),
            (
                r#"[{"name":"str","containerPort":"80"}]"#,
                "args.cni.ports[0].containerPort: expected a number, found a string",
            ),
            (
                r#"[{"name":"none"}]"#,
                "args.cni.ports[0].containerPort: is missing",
            ),
            (
                r#"[{"containerPort":80}]"#,
                "args.cni.ports[0].name: is missing",
            ),
            (
                r#"[{"name":"HTTP","containerPort":80}]"#,
                "args.cni.ports[0].name: \"HTTP\" is not a valid port name",
            ),
            (
                r#"[{"name":"8080","containerPort":80}]"#,
                "args.cni.ports[0].name: \"8080\" is not a valid port name",
            ),
            (
                r#"[{"name":"a--b","containerPort":80}]"#,
                "args.cni.ports[0].name: \"a--b\" is not a valid port name",
            ),
            (
                r#"[{"name":"-web","containerPort":80}]"#,
                "args.cni.ports[0].name: \"-web\" is not a valid port name",
            ),
            (
                r#"[{"name":"web-","containerPort":80}]"#,
                "args.cni.ports[0].name: \"web-\" is not a valid port name",
            ),
            (
                r#"[{"name":"abcdefghijklmnop","containerPort":80}]"#,
                "args.cni.ports[0].name: \"abcdefghijklmnop\" is not a valid port name",
            ),
            (
                r#"[{"name":"","containerPort":80}]"#,
                "args.cni.ports[0].name: \"\" is not a valid port name",
            ),
            (
                r#"[{"name":7,"containerPort":80}]"#,
                "args.cni.ports[0].name: expected a string, found a number",
            ),
            (
                r#"[{"name":"q","containerPort":80,"protocol":"ICMP"}]"#,
                "args.cni.ports[0].protocol: \"ICMP\" is not TCP, UDP or SCTP",
            ),
            (
                r#"[{"name":"q","containerPort":80,"protocol":6}]"#,
                "args.cni.ports[0].protocol: expected a string, found a number",
            ),
            (
                r#"[{"name":"web","containerPort":80},{"name":"web","containerPort":81,"protocol":"UDP"}]"#,
                "args.cni.ports[1].name: \"web\" is already the name of args.cni.ports[0]",
            ),
            (
                r#"["http"]"#,
                "args.cni.ports[0]: expected an object, found a string",
            ),
            (r#"{"name":"http"}"#, "args.cni.ports: expected an array"),
            ("null", "args.cni.ports: expected an array"),
        ];
        for (ports, want) in cases {
            let e = with_ports(ports).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{ports}: {}", e.msg);
            assert!(
                e.msg.contains(want),
                "{ports}: got {:?}, want {want:?}",
                e.msg
            );
        }
    }

    #[test]
    fn iana_service_names() {
        for ok in ["http", "a", "h2", "web-api", "a1-b2-c3", "x23456789012345"] {
            assert!(is_iana_svc_name(ok), "{ok}");
        }
        for bad in [
            "",
            "1",
            "123",
            "Http",
            "a_b",
            "a--b",
            "-a",
            "a-",
            "x234567890123456",
            "é",
        ] {
            assert!(!is_iana_svc_name(bad), "{bad}");
        }
    }
}
