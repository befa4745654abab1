//! `/proc/sys` access. Network sysctls resolve against the network namespace of the CURRENT
//! THREAD, so call these inside [`crate::netns::NetNs::run`] to reach another namespace.

use std::io;
use std::path::PathBuf;

use crate::error::{LinuxError, Result};

fn path_of(key: &str) -> Result<PathBuf> {
    // Slash-separated keys only: interface names may contain dots ("vxlan.tern").
    if key.is_empty()
        || key.starts_with('/')
        || key
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(LinuxError::InvalidArgument(format!(
            "sysctl key {key:?} must look like net/ipv4/conf/eth0/proxy_arp"
        )));
    }
    Ok(PathBuf::from("/proc/sys").join(key))
}

/// Writes `value` to `/proc/sys/<key>`, e.g. `set("net/ipv4/conf/eth0/proxy_arp", "1")`.
pub fn set(key: &str, value: &str) -> Result<()> {
    let path = path_of(key)?;
    std::fs::write(&path, value.as_bytes())
        .map_err(|e| LinuxError::io(format!("set sysctl {key}={value}"), e))
}

/// Reads `/proc/sys/<key>` without the trailing newline.
pub fn get(key: &str) -> Result<String> {
    let path = path_of(key)?;
    let mut s = std::fs::read_to_string(&path)
        .map_err(|e| LinuxError::io(format!("read sysctl {key}"), e))?;
    while s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

/// Like [`set`] but a missing key is success: for IPv6 keys on hosts with IPv6 disabled.
pub fn set_if_present(key: &str, value: &str) -> Result<()> {
    match set(key, value) {
        Err(LinuxError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A `/proc/sys` file opened for writing by [`open_if_present`]. A network sysctl is the one of
/// the namespace the OPENING thread was in, whichever thread writes it later: open it inside a
/// pod's namespace ([`crate::netns::NetNs::open_inside`]) and set it from the node's.
#[derive(Debug)]
pub struct OpenSysctl {
    key: String,
    file: std::fs::File,
}

/// Opens `/proc/sys/<key>` for a later [`OpenSysctl::set`]; `None` when it does not exist (as
/// [`set_if_present`] skips it).
pub fn open_if_present(key: &str) -> Result<Option<OpenSysctl>> {
    let path = path_of(key)?;
    match std::fs::OpenOptions::new().write(true).open(&path) {
        Ok(file) => Ok(Some(OpenSysctl {
            key: key.to_string(),
            file,
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LinuxError::io(format!("open sysctl {key}"), e)),
    }
}

impl OpenSysctl {
    /// Writes `value` (one write from offset 0, as `sysctl -w` does).
    pub fn set(&self, value: &str) -> Result<()> {
        use std::io::Write;
        (&self.file)
            .write_all(value.as_bytes())
            .map_err(|e| LinuxError::io(format!("set sysctl {}={value}", self.key), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_keys_that_escape_proc_sys() {
        for bad in [
            "",
            "/net/ipv4/ip_forward",
            "net/../../etc/passwd",
            "net//ipv4",
            "net/ipv4/",
        ] {
            assert!(
                matches!(path_of(bad), Err(LinuxError::InvalidArgument(_))),
                "{bad:?} accepted"
            );
        }
        assert_eq!(
            path_of("net/ipv4/conf/vxlan.tern/forwarding").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/vxlan.tern/forwarding")
        );
    }

    #[test]
    fn reads_a_kernel_value_without_newline() {
        let v = get("kernel/ostype").unwrap();
        assert_eq!(v, "Linux");
    }

    #[test]
    fn missing_key_error_names_the_key_and_is_not_found() {
        let e = get("net/ipv4/conf/nonexistent0/forwarding").unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(
            e.to_string()
                .contains("net/ipv4/conf/nonexistent0/forwarding"),
            "{e}"
        );
        assert!(set_if_present("net/ipv6/conf/nonexistent0/forwarding", "1").is_ok());
    }
}
