//! `CNI_ARGS` parsing: `K1=V1;K2=V2`.

use crate::error::CniError;

/// The keys tern understands in `CNI_ARGS`.
///
/// `K8S_POD_UID` is accepted as well because containerd and CRI-O send it.
pub const KNOWN_KEYS: [&str; 6] = [
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID",
    "IP",
    "IgnoreUnknown",
];

/// Parsed `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub pod_infra_container_id: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `IP`: requested address(es), comma separated as Calico accepts them.
    pub ip: Option<String>,
    /// `IgnoreUnknown` was `1` or `true` (case-insensitive).
    pub ignore_unknown: bool,
    /// Unknown pairs kept when `IgnoreUnknown` allowed them, in input order.
    pub unknown: Vec<(String, String)>,
}

impl CniArgs {
    /// Parses `CNI_ARGS` strictly, as `skel`/`types.LoadArgs` do: every
    /// non-empty element must be `K=V` (code 4 naming `CNI_ARGS`), and an unknown
    /// key is code 7 naming the key unless `IgnoreUnknown=1|true` is present
    /// anywhere in the string.
    pub fn parse(raw: &str) -> Result<CniArgs, CniError> {
        Self::parse_inner(raw, false)
    }

    /// Parses `CNI_ARGS` leniently: malformed elements are skipped and unknown
    /// keys are kept in [`CniArgs::unknown`]. Used for DEL, which must succeed whenever possible: failing a
    /// DEL on an argument would leave the pod stuck in termination.
    pub fn parse_lenient(raw: &str) -> CniArgs {
        Self::parse_inner(raw, true).unwrap_or_default()
    }

    fn parse_inner(raw: &str, lenient: bool) -> Result<CniArgs, CniError> {
        let mut pairs = Vec::new();
        for element in raw.split(';').filter(|e| !e.is_empty()) {
            match element.split_once('=') {
                Some((k, v)) if !k.is_empty() => pairs.push((k, v)),
                _ if lenient => {}
                _ => {
                    return Err(CniError::invalid_env(format!(
                        "invalid CNI_ARGS: element {element:?} is not KEY=VALUE"
                    )));
                }
            }
        }
        let flag = pairs
            .iter()
            .any(|(k, v)| *k == "IgnoreUnknown" && is_true(v));
        // Lenient parsing keeps unknown keys as if IgnoreUnknown were set, but
        // reports the flag as the runtime actually sent it.
        let ignore_unknown = lenient || flag;
        let mut args = CniArgs {
            ignore_unknown: flag,
            ..CniArgs::default()
        };
        for (k, v) in pairs {
            let slot = match k {
                "K8S_POD_NAMESPACE" => &mut args.pod_namespace,
                "K8S_POD_NAME" => &mut args.pod_name,
                "K8S_POD_INFRA_CONTAINER_ID" => &mut args.pod_infra_container_id,
                "K8S_POD_UID" => &mut args.pod_uid,
                "IP" => &mut args.ip,
                "IgnoreUnknown" => {
                    if !lenient && !is_bool(v) {
                        return Err(CniError::invalid_env(format!(
                            "invalid CNI_ARGS: IgnoreUnknown={v:?} is not a boolean"
                        )));
                    }
                    continue;
                }
                _ if ignore_unknown => {
                    args.unknown.push((k.to_owned(), v.to_owned()));
                    continue;
                }
                _ => {
                    return Err(CniError::invalid_config(format!(
                        "unknown key {k:?} in CNI_ARGS (set IgnoreUnknown=1 to allow it)"
                    ))
                    .with_details(format!("known keys: {}", KNOWN_KEYS.join(", "))));
                }
            };
            *slot = Some(v.to_owned());
        }
        Ok(args)
    }
}

/// Go's `strconv.ParseBool` true values plus `true` in any case, as `LoadArgs` accepts.
fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T") || v.eq_ignore_ascii_case("true")
}

fn is_bool(v: &str) -> bool {
    is_true(v) || matches!(v, "0" | "f" | "F") || v.eq_ignore_ascii_case("false")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code;

    #[test]
    fn parses_known_keys() {
        let a = CniArgs::parse(
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;IP=10.0.0.5",
        )
        .unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("default"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_infra_container_id.as_deref(), Some("abc"));
        assert_eq!(a.ip.as_deref(), Some("10.0.0.5"));
        assert!(!a.ignore_unknown);
        assert!(a.unknown.is_empty());
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse(";;").unwrap(), CniArgs::default());
    }

    #[test]
    fn unknown_key_without_ignore_unknown_is_code_7_naming_key() {
        let e = CniArgs::parse("K8S_POD_NAME=a;FOO=bar").unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(
            e.msg.contains("\"FOO\"") && e.msg.contains("CNI_ARGS"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn unknown_key_with_ignore_unknown_is_kept() {
        // containerd's real CNI_ARGS: IgnoreUnknown first, then pod keys.
        for flag in ["1", "true", "TRUE"] {
            let a = CniArgs::parse(&format!(
                "IgnoreUnknown={flag};FOO=bar;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"
            ))
            .unwrap();
            assert!(a.ignore_unknown);
            assert_eq!(a.unknown, vec![("FOO".to_owned(), "bar".to_owned())]);
            assert_eq!(a.pod_name.as_deref(), Some("p"));
        }
        // IgnoreUnknown after the unknown key still counts.
        assert!(CniArgs::parse("FOO=bar;IgnoreUnknown=1").is_ok());
        // IgnoreUnknown=0 does not.
        assert_eq!(
            CniArgs::parse("FOO=bar;IgnoreUnknown=0").unwrap_err().code,
            code::INVALID_CONFIG
        );
    }

    #[test]
    fn malformed_pair_is_code_4_naming_cni_args() {
        let e = CniArgs::parse("K8S_POD_NAME").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("CNI_ARGS"), "{}", e.msg);
        let e = CniArgs::parse("IgnoreUnknown=maybe").unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
    }

    #[test]
    fn lenient_skips_everything_bad() {
        let a = CniArgs::parse_lenient("junk;FOO=bar;K8S_POD_NAME=p;=x");
        assert_eq!(a.pod_name.as_deref(), Some("p"));
        assert_eq!(a.unknown, vec![("FOO".to_owned(), "bar".to_owned())]);
        assert!(!a.ignore_unknown);
    }

    #[test]
    fn value_may_contain_equals() {
        let a = CniArgs::parse("IP=fd00::1=x").unwrap();
        assert_eq!(a.ip.as_deref(), Some("fd00::1=x"));
    }
}
