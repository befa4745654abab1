//! CNI results: the addresses of an ADD result, CNI error objects, and why an execution failed.

use std::net::IpAddr;

use serde_json::Value;

use super::error::BenchError;

/// Returns the `ips[].address` entries (CIDR notation) of a CNI ADD result.
///
/// A CNI error object (`{"code":..,"msg":..}`) becomes [`BenchError::Plugin`]; a result without
/// addresses or with a malformed address is [`BenchError::InvalidResult`].
pub fn parse_result_ips(stdout: &[u8]) -> Result<Vec<String>, BenchError> {
    let value: Value = serde_json::from_slice(stdout)
        .map_err(|e| BenchError::InvalidResult(format!("not JSON ({e}): {:?}", snippet(stdout))))?;
    if let Some(err) = parse_cni_error(&value) {
        return Err(err);
    }
    let ips = value
        .get("ips")
        .and_then(Value::as_array)
        .ok_or_else(|| BenchError::InvalidResult("no `ips` list in the result".into()))?;
    if ips.is_empty() {
        return Err(BenchError::InvalidResult("the `ips` list is empty".into()));
    }
    ips.iter()
        .map(|ip| {
            let address = ip.get("address").and_then(Value::as_str).ok_or_else(|| {
                BenchError::InvalidResult(format!("ips entry without an address: {ip}"))
            })?;
            validate_cidr(address)?;
            Ok(address.to_string())
        })
        .collect()
}

fn validate_cidr(address: &str) -> Result<(), BenchError> {
    let bad = || BenchError::InvalidResult(format!("address {address:?} is not IP/prefix"));
    let (ip, prefix) = address.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok(())
}

fn parse_cni_error(value: &Value) -> Option<BenchError> {
    let code = value.get("code")?.as_u64()?;
    let text = |key| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Some(BenchError::Plugin {
        code,
        msg: text("msg"),
        details: text("details"),
    })
}

/// Explains a failed execution: the CNI error on stdout if there is one, else stderr, else the
/// exit status.
pub fn describe_failure(status: &str, stdout: &[u8], stderr: &[u8]) -> String {
    if let Some(err) = serde_json::from_slice::<Value>(stdout)
        .ok()
        .as_ref()
        .and_then(parse_cni_error)
    {
        return format!("{err} [{status}]");
    }
    let stderr = snippet(stderr);
    if stderr.is_empty() {
        let stdout = snippet(stdout);
        if stdout.is_empty() {
            status.to_string()
        } else {
            format!("{stdout} [{status}]")
        }
    } else {
        format!("{stderr} [{status}]")
    }
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_of_a_ptp_result() {
        // Shape of ptp + host-local's 1.0.0 result.
        let out = br#"{
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "eth0", "mac": "11:22:33:44:55:66", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"interface": 1, "address": "10.250.0.2/16", "gateway": "10.250.0.1"},
                {"interface": 1, "address": "fd00::2/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        }"#;
        assert_eq!(
            parse_result_ips(out).unwrap(),
            vec!["10.250.0.2/16".to_string(), "fd00::2/64".to_string()]
        );
    }

    #[test]
    fn a_cni_error_object_becomes_a_plugin_error() {
        let out = br#"{"cniVersion":"1.0.0","code":11,"msg":"agent unreachable","details":"connect: ENOENT"}"#;
        match parse_result_ips(out) {
            Err(BenchError::Plugin { code, msg, details }) => {
                assert_eq!(code, 11);
                assert_eq!(msg, "agent unreachable");
                assert_eq!(details, "connect: ENOENT");
            }
            other => panic!("expected a plugin error, got {other:?}"),
        }
        let text = describe_failure("exit status: 1", out, b"");
        assert_eq!(
            text,
            "CNI error 11: agent unreachable (connect: ENOENT) [exit status: 1]"
        );
    }

    #[test]
    fn malformed_results_are_rejected() {
        for (out, needle) in [
            (&b"not json"[..], "not JSON"),
            (br#"{"cniVersion":"1.0.0"}"#, "no `ips`"),
            (br#"{"ips":[]}"#, "empty"),
            (br#"{"ips":[{"gateway":"10.0.0.1"}]}"#, "without an address"),
            (br#"{"ips":[{"address":"10.0.0.300/24"}]}"#, "not IP/prefix"),
            (br#"{"ips":[{"address":"10.0.0.3"}]}"#, "not IP/prefix"),
            (br#"{"ips":[{"address":"10.0.0.3/33"}]}"#, "not IP/prefix"),
        ] {
            let err = parse_result_ips(out).expect_err("must be rejected");
            assert!(
                matches!(err, BenchError::InvalidResult(_)) && err.to_string().contains(needle),
                "{err} should mention {needle}"
            );
        }
    }

    #[test]
    fn failure_description_falls_back_to_stderr_then_status() {
        assert_eq!(
            describe_failure("exit status: 2", b"", b"  boom\n"),
            "boom [exit status: 2]"
        );
        assert_eq!(describe_failure("signal: 9", b"", b""), "signal: 9");
    }
}
