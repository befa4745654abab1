//! The `CNI_*` environment a runtime passes to a plugin, validated per command.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::args::CniArgs;
use crate::error::CniError;

/// A CNI command (`CNI_COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// `ADD`: attach the container to the network.
    Add,
    /// `DEL`: detach; idempotent and best-effort.
    Del,
    /// `CHECK`: verify an earlier ADD (>= 0.4.0).
    Check,
    /// `GC`: release resources of attachments not listed as valid (>= 1.1.0).
    Gc,
    /// `STATUS`: report readiness (>= 1.1.0).
    Status,
    /// `VERSION`: report supported versions.
    Version,
}

impl Command {
    /// The `CNI_COMMAND` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// True for the commands that act on one attachment (ADD, DEL, CHECK) and
    /// so need `CNI_CONTAINERID` and `CNI_IFNAME`.
    pub fn is_per_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Command {
    type Err = CniError;

    /// Unknown commands are code 4 naming `CNI_COMMAND`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => {
                return Err(CniError::invalid_env(format!(
                    "invalid CNI_COMMAND {s:?}: expected ADD, DEL, CHECK, GC, STATUS or VERSION"
                )));
            }
        })
    }
}

/// The validated plugin environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`: validated and non-empty for ADD, DEL and CHECK; empty
    /// for the other commands, which do not take it.
    pub container_id: String,
    /// `CNI_NETNS`: `Some` for ADD and CHECK; `None` when unset or empty (allowed
    /// for DEL, e.g. containerd tears down with an empty netns path).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`: validated for ADD, DEL and CHECK; empty otherwise.
    pub ifname: String,
    /// `CNI_ARGS` as received, passed on unchanged to delegated plugins.
    pub args_raw: String,
    /// `CNI_ARGS` parsed; strictly for ADD and CHECK, leniently for DEL.
    pub args: CniArgs,
    /// `CNI_PATH` split on `:`; empty elements dropped.
    pub path: Vec<PathBuf>,
}

/// Pattern `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` shared by container IDs and network names.
pub fn is_valid_id(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Checks an interface name as libcni/skel do; `Err` carries the reason.
pub fn validate_ifname(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("interface name is empty".into());
    }
    if name.len() > 15 {
        return Err(format!(
            "interface name {name:?} is too long ({} bytes, at most 15)",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("interface name {name:?} is not allowed"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace())
    {
        return Err(format!(
            "interface name {name:?} contains invalid character {c:?}"
        ));
    }
    Ok(())
}

impl Environment {
    /// Reads and validates the process environment.
    pub fn from_env() -> Result<Environment, CniError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads and validates the environment through `get` (a variable's value or
    /// `None` when unset), so tests and embedders need not touch the process
    /// environment.
    ///
    /// Errors, each naming its variable:
    /// - `CNI_COMMAND` missing or unknown: code 4;
    /// - `CNI_CONTAINERID` empty for ADD/DEL/CHECK: code 3 "missing containerID";
    ///   bad characters: code 4;
    /// - other required variables missing (`CNI_NETNS` for ADD/CHECK,
    ///   `CNI_IFNAME` for ADD/DEL/CHECK, `CNI_PATH` for all but VERSION): code 4
    ///   listing them;
    /// - invalid `CNI_IFNAME`: code 4;
    /// - invalid `CNI_ARGS` (ADD/CHECK only): see [`CniArgs::parse`].
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Environment, CniError> {
        let var = |k: &str| get(k).unwrap_or_default();
        let command_raw = var("CNI_COMMAND");
        if command_raw.is_empty() {
            return Err(CniError::invalid_env(
                "required env variables [CNI_COMMAND] missing",
            ));
        }
        let command: Command = command_raw.parse()?;
        let per_attachment = command.is_per_attachment();

        let mut container_id = String::new();
        let mut ifname = String::new();
        let mut netns = None;
        let mut missing = Vec::new();
        if per_attachment {
            container_id = var("CNI_CONTAINERID");
            if container_id.is_empty() {
                return Err(CniError::unknown_container(
                    "missing containerID: CNI_CONTAINERID is empty or unset",
                ));
            }
            if !is_valid_id(&container_id) {
                return Err(CniError::invalid_env(format!(
                    "invalid characters in containerID: CNI_CONTAINERID {container_id:?} must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
                )));
            }
            let ns = var("CNI_NETNS");
            if ns.is_empty() {
                if command != Command::Del {
                    missing.push("CNI_NETNS");
                }
            } else {
                netns = Some(PathBuf::from(ns));
            }
            ifname = var("CNI_IFNAME");
            if ifname.is_empty() {
                missing.push("CNI_IFNAME");
            }
        }
        let path_raw = var("CNI_PATH");
        if path_raw.is_empty() && command != Command::Version {
            missing.push("CNI_PATH");
        }
        if !missing.is_empty() {
            return Err(CniError::invalid_env(format!(
                "required env variables [{}] missing for {command}",
                missing.join(",")
            )));
        }
        if per_attachment {
            validate_ifname(&ifname)
                .map_err(|why| CniError::invalid_env(format!("invalid CNI_IFNAME: {why}")))?;
        }

        let args_raw = var("CNI_ARGS");
        let args = match command {
            Command::Add | Command::Check => CniArgs::parse(&args_raw)?,
            Command::Del => CniArgs::parse_lenient(&args_raw),
            // GC, STATUS and VERSION take no CNI_ARGS; ignore whatever is there.
            _ => CniArgs::default(),
        };
        let path = path_raw
            .split(':')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect();
        Ok(Environment {
            command,
            container_id,
            netns,
            ifname,
            args_raw,
            args,
            path,
        })
    }

    /// The variables that describe this environment, as a runtime would set
    /// them, with `CNI_COMMAND` set to `command` (used to run delegated plugins).
    pub fn to_vars(&self, command: Command) -> Vec<(&'static str, String)> {
        let path = self
            .path
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        vec![
            ("CNI_COMMAND", command.as_str().to_owned()),
            ("CNI_CONTAINERID", self.container_id.clone()),
            (
                "CNI_NETNS",
                self.netns
                    .as_ref()
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            ("CNI_IFNAME", self.ifname.clone()),
            ("CNI_ARGS", self.args_raw.clone()),
            ("CNI_PATH", path),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Environment, CniError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Environment::from_vars(|k| map.get(k).cloned())
    }

    fn add_with(overrides: &[(&'static str, &'static str)]) -> Result<Environment, CniError> {
        let mut base = vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web"),
            ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        ];
        for (k, v) in overrides {
            base.retain(|(bk, _)| bk != k);
            base.push((k, v));
        }
        env(&base)
    }

    #[test]
    fn valid_add() {
        let e = add_with(&[]).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id, "abc123");
        assert_eq!(e.netns, Some(PathBuf::from("/run/netns/x")));
        assert_eq!(e.ifname, "eth0");
        assert_eq!(e.args.pod_name.as_deref(), Some("web"));
        assert_eq!(
            e.path,
            vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")]
        );
    }

    #[test]
    fn command_errors_name_cni_command() {
        let e = env(&[]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_COMMAND"), "{}", e.msg);
        let e = add_with(&[("CNI_COMMAND", "add")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(
            e.msg.contains("CNI_COMMAND") && e.msg.contains("\"add\""),
            "{}",
            e.msg
        );
    }

    #[test]
    fn container_id_errors() {
        let e = add_with(&[("CNI_CONTAINERID", "")]).unwrap_err();
        assert_eq!(e.code, 3);
        assert!(e.msg.contains("missing containerID") && e.msg.contains("CNI_CONTAINERID"));
        for bad in ["-abc", "a b", "a/b", "_x", "x;y"] {
            let e = add_with(&[("CNI_CONTAINERID", bad)]).unwrap_err();
            assert_eq!(e.code, 4, "{bad}");
            assert!(e.msg.contains("CNI_CONTAINERID"), "{}", e.msg);
        }
        assert!(add_with(&[("CNI_CONTAINERID", "default-rtB_1.x")]).is_ok());
    }

    #[test]
    fn netns_required_for_add_and_check_not_del() {
        let e = add_with(&[("CNI_NETNS", "")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_NETNS"), "{}", e.msg);
        let e = add_with(&[("CNI_COMMAND", "CHECK"), ("CNI_NETNS", "")]).unwrap_err();
        assert!(e.msg.contains("CNI_NETNS"), "{}", e.msg);
        let d = add_with(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")]).unwrap();
        assert_eq!(d.netns, None);
    }

    #[test]
    fn missing_vars_are_listed_together() {
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "c")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(
            e.msg.contains("[CNI_NETNS,CNI_IFNAME,CNI_PATH]"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn ifname_validation_names_cni_ifname() {
        for bad in ["a234567890123456", ".", "..", "a/b", "a:b", "a b", "a\tb"] {
            let e = add_with(&[("CNI_IFNAME", bad)]).unwrap_err();
            assert_eq!(e.code, 4, "{bad}");
            assert!(e.msg.contains("CNI_IFNAME"), "{bad}: {}", e.msg);
        }
        assert!(add_with(&[("CNI_IFNAME", "a23456789012345")]).is_ok());
        let e = add_with(&[("CNI_IFNAME", "")]).unwrap_err();
        assert!(e.msg.contains("CNI_IFNAME"));
    }

    #[test]
    fn cni_args_strict_for_add_lenient_for_del() {
        let e = add_with(&[("CNI_ARGS", "FOO=1")]).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("FOO"));
        assert!(add_with(&[("CNI_ARGS", "IgnoreUnknown=1;FOO=1")]).is_ok());
        let d = add_with(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_ARGS", "FOO=1;junk;K8S_POD_NAME=p"),
        ])
        .unwrap();
        assert_eq!(d.args.pod_name.as_deref(), Some("p"));
        assert_eq!(d.args_raw, "FOO=1;junk;K8S_POD_NAME=p");
    }

    #[test]
    fn gc_status_version_need_no_attachment() {
        let g = env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/bin")]).unwrap();
        assert_eq!(g.command, Command::Gc);
        assert!(g.container_id.is_empty() && g.ifname.is_empty());
        let s = env(&[("CNI_COMMAND", "STATUS")]).unwrap_err();
        assert!(s.msg.contains("CNI_PATH"), "{}", s.msg);
        let v = env(&[("CNI_COMMAND", "VERSION")]).unwrap();
        assert_eq!(v.command, Command::Version);
        assert!(v.path.is_empty());
    }

    #[test]
    fn to_vars_overrides_command() {
        let e = add_with(&[]).unwrap();
        let vars = e.to_vars(Command::Del);
        assert!(vars.contains(&("CNI_COMMAND", "DEL".to_owned())));
        assert!(vars.contains(&("CNI_PATH", "/opt/cni/bin:/usr/lib/cni".to_owned())));
        assert!(vars.contains(&("CNI_NETNS", "/run/netns/x".to_owned())));
    }

    #[test]
    fn id_pattern() {
        assert!(is_valid_id("k8s-pod-network"));
        assert!(is_valid_id("a"));
        assert!(!is_valid_id(""));
        assert!(!is_valid_id(".a"));
        assert!(!is_valid_id("a*"));
    }
}
