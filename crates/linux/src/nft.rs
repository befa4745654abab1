//! nftables through the `nft` command: a ruleset is applied as one atomic transaction
//! (`nft -f -`), so the kernel never sees half of it. `nft` runs in the caller's network
//! namespace (a child process inherits it), so callers in a node namespace program that node.
//! tern's own table goes over netlink ([`crate::nft_netlink`]); `nft -f` of its rendered text
//! is the fallback when the kernel refuses a batch.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{LinuxError, Result};

/// The `nft` binary used (overridable with `TERN_NFT` for unusual installs).
fn nft_bin() -> String {
    std::env::var("TERN_NFT").unwrap_or_else(|_| "nft".to_string())
}

/// Applies `ruleset` (nft syntax, several commands) in one transaction with `nft -f -`.
/// Either all of it takes effect or none; the error carries nft's message.
pub fn apply(ruleset: &str) -> Result<()> {
    let mut child = Command::new(nft_bin())
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LinuxError::io("running nft -f -", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(ruleset.as_bytes())
            .map_err(|e| LinuxError::io("writing the ruleset to nft", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| LinuxError::io("waiting for nft", e))?;
    if !out.status.success() {
        return Err(LinuxError::InvalidArgument(format!(
            "nft rejected the ruleset: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// `nft list table FAMILY NAME`; `None` when the table does not exist.
pub fn list_table(family: &str, name: &str) -> Result<Option<String>> {
    let out = Command::new(nft_bin())
        .args(["list", "table", family, name])
        .output()
        .map_err(|e| LinuxError::io(format!("running nft list table {family} {name}"), e))?;
    if out.status.success() {
        return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("No such file or directory") || err.contains("does not exist") {
        return Ok(None);
    }
    Err(LinuxError::InvalidArgument(format!(
        "nft list table {family} {name}: {}",
        err.trim()
    )))
}

/// Deletes table `FAMILY NAME` if present; true when it existed.
pub fn delete_table(family: &str, name: &str) -> Result<bool> {
    if list_table(family, name)?.is_none() {
        return Ok(false);
    }
    apply(&format!("delete table {family} {name}\n"))?;
    Ok(true)
}
