//! `usePodCidr` for a delegated host-local, as Calico's plugin accepts it: `ipam.subnet:
//! "usePodCidr"` (or `ipam.ranges[][].subnet: "usePodCidr"` / `"usePodCidrIPv6"`) is replaced
//! by this node's Kubernetes `spec.podCIDRs` before host-local runs. ternd writes them to
//! `<state_dir>/pod-cidrs.json` ([`tern_api::POD_CIDRS_FILE`]) from its node watch, so the
//! plugin needs no access to the API server.

use serde_json::Value;
use std::path::Path;
use tern_cni::CniError;

/// The value of `subnet` that asks for the node's IPv4 podCIDR.
pub const USE_POD_CIDR: &str = "usePodCidr";
/// The value of a range's `subnet` that asks for the node's IPv6 podCIDR.
pub const USE_POD_CIDR_V6: &str = "usePodCidrIPv6";

/// Whether the configuration's `ipam` section asks for the podCIDR anywhere.
fn wants(ipam: &Value) -> bool {
    let is = |v: &Value| matches!(v.as_str(), Some(USE_POD_CIDR | USE_POD_CIDR_V6));
    ipam.get("subnet").is_some_and(is)
        || ipam
            .get("ranges")
            .and_then(Value::as_array)
            .is_some_and(|sets| {
                sets.iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .any(|r| r.get("subnet").is_some_and(is))
            })
}

/// `(IPv4, IPv6)` podCIDRs from ternd's file; code 11 when it is missing or has no CIDR of a
/// family asked for (the controller-manager may not have assigned one yet).
fn read(state_dir: &Path) -> Result<(Option<String>, Option<String>), CniError> {
    let path = state_dir.join(tern_api::POD_CIDRS_FILE);
    let text = std::fs::read(&path).map_err(|e| {
        CniError::try_again_later(format!(
            "ipam.subnet {USE_POD_CIDR}: ternd has not recorded this node's Kubernetes \
             spec.podCIDRs yet ({}: {e}); retry once the node has a podCIDR and ternd runs \
             with --kubeconfig",
            path.display()
        ))
    })?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| CniError::try_again_later(format!("{}: unreadable: {e}", path.display())))?;
    let mut out = (None, None);
    for c in v["podCIDRs"].as_array().into_iter().flatten() {
        let Some(c) = c.as_str() else { continue };
        if c.contains(':') {
            out.1.get_or_insert_with(|| c.to_string());
        } else {
            out.0.get_or_insert_with(|| c.to_string());
        }
    }
    Ok(out)
}

/// The configuration with every `usePodCidr` replaced, or `None` when it asks for none.
pub fn resolve(stdin: &[u8], state_dir: &Path) -> Result<Option<Vec<u8>>, CniError> {
    let Ok(mut conf) = serde_json::from_slice::<Value>(stdin) else {
        return Ok(None);
    };
    if !conf.get("ipam").is_some_and(wants) {
        return Ok(None);
    }
    let (v4, v6) = read(state_dir)?;
    let pick = |which: &str| -> Result<String, CniError> {
        let (got, family) = if which == USE_POD_CIDR_V6 {
            (&v6, "IPv6")
        } else {
            (&v4, "IPv4")
        };
        got.clone().ok_or_else(|| {
            CniError::try_again_later(format!(
                "ipam subnet {which}: this node has no {family} podCIDR in Kubernetes yet"
            ))
        })
    };
    let ipam = &mut conf["ipam"];
    if let Some(s) = ipam
        .get("subnet")
        .and_then(Value::as_str)
        .map(str::to_string)
        && (s == USE_POD_CIDR || s == USE_POD_CIDR_V6)
    {
        ipam["subnet"] = Value::String(pick(&s)?);
    }
    if let Some(sets) = ipam.get_mut("ranges").and_then(Value::as_array_mut) {
        for r in sets.iter_mut().filter_map(Value::as_array_mut).flatten() {
            if let Some(s) = r.get("subnet").and_then(Value::as_str).map(str::to_string)
                && (s == USE_POD_CIDR || s == USE_POD_CIDR_V6)
            {
                r["subnet"] = Value::String(pick(&s)?);
            }
        }
    }
    serde_json::to_vec(&conf)
        .map(Some)
        .map_err(|e| CniError::invalid_config(format!("re-encoding the configuration: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subnet_and_ranges_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let conf = json!({"name": "n", "type": "tern",
                          "ipam": {"type": "host-local", "subnet": "usePodCidr",
                                   "ranges": [[{"subnet": "usePodCidrIPv6"}], [{"subnet": "10.9.0.0/24"}]]}});
        let bytes = serde_json::to_vec(&conf).unwrap();
        // No file yet: try again later.
        let e = resolve(&bytes, dir.path()).unwrap_err();
        assert_eq!(e.code, 11, "{}", e.msg);
        std::fs::write(
            dir.path().join(tern_api::POD_CIDRS_FILE),
            r#"{"node": "n1", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"]}"#,
        )
        .unwrap();
        let out: Value =
            serde_json::from_slice(&resolve(&bytes, dir.path()).unwrap().unwrap()).unwrap();
        assert_eq!(out["ipam"]["subnet"], "10.244.1.0/24");
        assert_eq!(out["ipam"]["ranges"][0][0]["subnet"], "fd00:1::/64");
        assert_eq!(out["ipam"]["ranges"][1][0]["subnet"], "10.9.0.0/24");
        // A configuration without usePodCidr is left alone.
        let plain =
            serde_json::to_vec(&json!({"ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}))
                .unwrap();
        assert_eq!(resolve(&plain, dir.path()).unwrap(), None);
        // A family the node has no podCIDR of: try again later, naming it.
        std::fs::write(
            dir.path().join(tern_api::POD_CIDRS_FILE),
            r#"{"node": "n1", "podCIDRs": ["10.244.1.0/24"]}"#,
        )
        .unwrap();
        let e = resolve(&bytes, dir.path()).unwrap_err();
        assert_eq!(e.code, 11);
        assert!(e.msg.contains("no IPv6 podCIDR"), "{}", e.msg);
    }
}
