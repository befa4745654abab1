//! The CNI error object: what a plugin prints on stdout when it fails.

use crate::code;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A CNI error: a numeric code from the specification (or >= 100 for
/// tern-specific failures), a short message and optional details.
///
/// Printed as `{"cniVersion", "code", "msg", "details"}` with a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    /// Error code (one of [`crate::code`]).
    pub code: u32,
    /// Short human-readable message; tern's messages name the field or variable at fault.
    pub msg: String,
    /// Longer explanation; omitted from JSON when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

/// Shorthand for results whose error is a [`CniError`].
pub type Result<T, E = CniError> = std::result::Result<T, E>;

impl CniError {
    /// An error with the given code and message and no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Replaces the details.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Code 1.
    pub fn incompatible_version(msg: impl Into<String>) -> Self {
        Self::new(code::INCOMPATIBLE_VERSION, msg)
    }

    /// Code 2.
    pub fn unsupported_field(msg: impl Into<String>) -> Self {
        Self::new(code::UNSUPPORTED_FIELD, msg)
    }

    /// Code 3.
    pub fn unknown_container(msg: impl Into<String>) -> Self {
        Self::new(code::UNKNOWN_CONTAINER, msg)
    }

    /// Code 4.
    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    /// Code 5.
    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(code::IO, msg)
    }

    /// Code 6.
    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(code::DECODE, msg)
    }

    /// Code 7.
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }

    /// Code 11.
    pub fn try_again_later(msg: impl Into<String>) -> Self {
        Self::new(code::TRY_AGAIN_LATER, msg)
    }

    /// Code 50.
    pub fn not_available(msg: impl Into<String>) -> Self {
        Self::new(code::NOT_AVAILABLE, msg)
    }

    /// Code 51.
    pub fn not_available_limited_connectivity(msg: impl Into<String>) -> Self {
        Self::new(code::NOT_AVAILABLE_LIMITED_CONNECTIVITY, msg)
    }

    /// Code 100.
    pub fn pool_exhausted(msg: impl Into<String>) -> Self {
        Self::new(code::POOL_EXHAUSTED, msg)
    }

    /// Code 101.
    pub fn agent(msg: impl Into<String>) -> Self {
        Self::new(code::AGENT, msg)
    }

    /// The JSON object a failing plugin prints on stdout.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("cniVersion".into(), cni_version.into());
        obj.insert("code".into(), self.code.into());
        obj.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            obj.insert("details".into(), self.details.clone().into());
        }
        serde_json::Value::Object(obj)
    }
}

/// Deserialises `value` into `T`, turning errors into code 7 messages that
/// name the field: ``invalid {what}: field `mtu`: invalid type: ...``.
pub(crate) fn from_value_with_path<T: DeserializeOwned>(
    value: Value,
    what: &str,
) -> Result<T, CniError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            CniError::invalid_config(format!("invalid {what}: {inner}"))
        } else {
            CniError::invalid_config(format!("invalid {what}: field `{path}`: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn to_json_shape() {
        let e = CniError::invalid_env("invalid CNI_IFNAME").with_details("too long");
        assert_eq!(
            e.to_json("1.0.0"),
            json!({"cniVersion": "1.0.0", "code": 4, "msg": "invalid CNI_IFNAME", "details": "too long"})
        );
        let e = CniError::pool_exhausted("no free address in pool default-ipv4");
        assert_eq!(
            e.to_json("0.3.1"),
            json!({"cniVersion": "0.3.1", "code": 100, "msg": "no free address in pool default-ipv4"})
        );
    }

    #[test]
    fn constructors_set_codes() {
        let cases = [
            (CniError::incompatible_version("x"), 1),
            (CniError::unsupported_field("x"), 2),
            (CniError::unknown_container("x"), 3),
            (CniError::invalid_env("x"), 4),
            (CniError::io("x"), 5),
            (CniError::decode("x"), 6),
            (CniError::invalid_config("x"), 7),
            (CniError::try_again_later("x"), 11),
            (CniError::not_available("x"), 50),
            (CniError::not_available_limited_connectivity("x"), 51),
            (CniError::pool_exhausted("x"), 100),
            (CniError::agent("x"), 101),
        ];
        for (e, code) in cases {
            assert_eq!(e.code, code);
        }
    }

    #[test]
    fn display_includes_details() {
        let e = CniError::io("reading stdin").with_details("broken pipe");
        assert_eq!(e.to_string(), "reading stdin: broken pipe");
        assert_eq!(CniError::io("reading stdin").to_string(), "reading stdin");
    }

    #[test]
    fn parses_plugin_error_json() {
        let e: CniError =
            serde_json::from_str(r#"{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"d"}"#)
                .unwrap();
        assert_eq!(e, CniError::invalid_config("bad").with_details("d"));
    }
}
