//! `ternctl ipam check [-o report.json]`: addresses allocated but not in use, in use but not
//! allocated, and used by more than one endpoint (the logic is `tern_ipam::audit`, shared
//! with the agent's tests).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tern_ipam::Ipam;
use tern_ipam::audit::{self, IpamReport};
use tern_store::Store;

/// Runs the check against the store.
pub fn check(store: Arc<dyn Store>) -> anyhow::Result<IpamReport> {
    let ipam = Ipam::new(store.clone());
    Ok(audit::check(&*store, &ipam)?)
}

/// Writes the report as pretty JSON.
pub fn write_report(report: &IpamReport, path: &Path) -> anyhow::Result<()> {
    let json = serde_json::to_vec_pretty(report).context("encoding the report")?;
    std::fs::write(path, json).with_context(|| format!("writing report {}", path.display()))
}

/// Reads a report written by [`write_report`].
pub fn read_report(path: &Path) -> anyhow::Result<IpamReport> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading report {}", path.display()))?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not an ipam check report", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        let r = IpamReport {
            allocations_checked: 3,
            ..Default::default()
        };
        write_report(&r, &p).unwrap();
        assert_eq!(read_report(&p).unwrap(), r);
        std::fs::write(&p, "{nope").unwrap();
        let e = read_report(&p).unwrap_err();
        assert!(
            format!("{e:#}").contains("is not an ipam check report"),
            "{e:#}"
        );
    }
}
