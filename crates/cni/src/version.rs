//! CNI specification versions and the VERSION command's output.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::CniError;

/// A released CNI specification version.
///
/// The variants are declared oldest first so the derived ordering is the
/// chronological one, which is what feature checks (`>= 0.4.0`) need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.1.0: the first release, legacy `ip4`/`ip6` results.
    V0_1_0,
    /// 0.2.0: adds the VERSION command.
    V0_2_0,
    /// 0.3.0: rich results (`interfaces`, `ips`) and chaining.
    V0_3_0,
    /// 0.3.1: typo fix of 0.3.0.
    V0_3_1,
    /// 0.4.0: CHECK, `prevResult` on DEL.
    V0_4_0,
    /// 1.0.0: removes `ips[].version`.
    V1_0_0,
    /// 1.1.0: STATUS, GC, extra interface and route fields.
    V1_1_0,
}

/// Every version this library reads and writes, oldest first, as strings.
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

impl Version {
    /// Every version, oldest first.
    pub const ALL: [Version; 7] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_3_1,
        Version::V0_4_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The newest version this library implements.
    pub const LATEST: Version = Version::V1_1_0;

    /// The version string, e.g. `"0.3.1"`.
    pub fn as_str(self) -> &'static str {
        SUPPORTED_VERSIONS[self as usize]
    }

    /// Parses a version string; `None` if it is not a released version.
    pub fn parse(s: &str) -> Option<Version> {
        SUPPORTED_VERSIONS
            .iter()
            .position(|v| *v == s)
            .map(|i| Version::ALL[i])
    }

    /// True when the CHECK command exists (>= 0.4.0).
    pub fn has_check(self) -> bool {
        self >= Version::V0_4_0
    }

    /// True when the GC and STATUS commands exist (>= 1.1.0).
    pub fn has_gc_status(self) -> bool {
        self >= Version::V1_1_0
    }

    /// True when results carry `ips[].version` (0.3.0, 0.3.1 and 0.4.0).
    pub fn has_ip_version_field(self) -> bool {
        matches!(self, Version::V0_3_0 | Version::V0_3_1 | Version::V0_4_0)
    }

    /// True for the legacy result format with `ip4`/`ip6` objects (0.1.0, 0.2.0).
    pub fn is_legacy(self) -> bool {
        self <= Version::V0_2_0
    }

    /// True when results carry the 1.1.0 extras (interface `mtu`, `socketPath`,
    /// `pciID`; route `mtu`, `advmss`, `priority`, `table`, `scope`).
    pub fn has_result_extras(self) -> bool {
        self >= Version::V1_1_0
    }
}

impl Default for Version {
    /// A configuration without `cniVersion` is 0.1.0 per the specification.
    fn default() -> Self {
        Version::V0_1_0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Version {
    type Err = CniError;

    /// An unknown version is error code 1 (incompatible version).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s).ok_or_else(|| {
            CniError::incompatible_version(format!(
                "incompatible CNI versions: cniVersion {s:?} is not one of {SUPPORTED_VERSIONS:?}"
            ))
        })
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Version {
    /// An empty string means 0.1.0, as for a missing `cniVersion`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        if s.is_empty() {
            return Ok(Version::default());
        }
        Version::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unsupported cniVersion {s:?}, expected one of {SUPPORTED_VERSIONS:?}"
            ))
        })
    }
}

/// The stdout of the VERSION command:
/// `{"cniVersion": <requested or 1.1.0>, "supportedVersions": [...]}`.
///
/// `requested` is the `cniVersion` the runtime sent on stdin; an empty string
/// means it sent none.
pub fn version_output(requested: &str) -> String {
    let cni_version = if requested.is_empty() {
        Version::LATEST.as_str()
    } else {
        requested
    };
    serde_json::json!({
        "cniVersion": cni_version,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

/// Like [`version_output`], reading the requested version from the VERSION
/// command's stdin (`{"cniVersion": "..."}`). Empty or unreadable input is
/// treated as no request, because VERSION must answer whatever it is sent.
pub fn version_output_for_stdin(stdin: &[u8]) -> String {
    let requested = serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .unwrap_or_default();
    version_output(&requested)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code;

    #[test]
    fn ordering_and_round_trip() {
        for pair in Version::ALL.windows(2) {
            assert!(pair[0] < pair[1]);
        }
        for (v, s) in Version::ALL.iter().zip(SUPPORTED_VERSIONS) {
            assert_eq!(v.as_str(), s);
            assert_eq!(s.parse::<Version>().unwrap(), *v);
            assert_eq!(v.to_string(), s);
        }
    }

    #[test]
    fn feature_helpers() {
        use Version::*;
        let check: Vec<_> = Version::ALL.iter().map(|v| v.has_check()).collect();
        assert_eq!(check, [false, false, false, false, true, true, true]);
        let gc: Vec<_> = Version::ALL.iter().map(|v| v.has_gc_status()).collect();
        assert_eq!(gc, [false, false, false, false, false, false, true]);
        let ipv: Vec<_> = Version::ALL
            .iter()
            .map(|v| v.has_ip_version_field())
            .collect();
        assert_eq!(ipv, [false, false, true, true, true, false, false]);
        let legacy: Vec<_> = Version::ALL.iter().map(|v| v.is_legacy()).collect();
        assert_eq!(legacy, [true, true, false, false, false, false, false]);
        assert!(V1_1_0.has_result_extras() && !V1_0_0.has_result_extras());
    }

    #[test]
    fn unknown_version_is_code_1_naming_it() {
        let err = "0.5.0".parse::<Version>().unwrap_err();
        assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
        assert!(err.msg.contains("\"0.5.0\""), "{}", err.msg);
    }

    #[test]
    fn serde_empty_string_is_0_1_0() {
        let v: Version = serde_json::from_str("\"\"").unwrap();
        assert_eq!(v, Version::V0_1_0);
        assert_eq!(
            serde_json::to_string(&Version::V0_3_1).unwrap(),
            "\"0.3.1\""
        );
        assert!(serde_json::from_str::<Version>("\"9.9.9\"").is_err());
    }

    #[test]
    fn version_output_echoes_request_or_latest() {
        let all = serde_json::json!([
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
        ]);
        let out: serde_json::Value = serde_json::from_str(&version_output("1.0.0")).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"cniVersion": "1.0.0", "supportedVersions": all})
        );
        let out: serde_json::Value = serde_json::from_str(&version_output("")).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": all})
        );
        let out: serde_json::Value =
            serde_json::from_str(&version_output_for_stdin(br#"{"cniVersion":"0.4.0"}"#)).unwrap();
        assert_eq!(out["cniVersion"], "0.4.0");
        let out: serde_json::Value = serde_json::from_str(&version_output_for_stdin(b"")).unwrap();
        assert_eq!(out["cniVersion"], "1.1.0");
    }
}
