//! `ternctl ipam release --ip IP | --from-report FILE`.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use tern_ipam::Ipam;
use tern_ipam::audit::{self, ReleaseOutcome};
use tern_store::Store;

/// Releases one address (refused while a WorkloadEndpoint uses it).
pub fn release_ip(store: Arc<dyn Store>, ip: IpAddr) -> anyhow::Result<String> {
    let ipam = Ipam::new(store.clone());
    let handle = audit::release_ip(&*store, &ipam, ip)?;
    Ok(match handle {
        Some(h) => format!("Successfully released IP address {ip} (handle {h})\n"),
        None => format!("Successfully released IP address {ip}\n"),
    })
}

/// Releases the leaks listed in a report that are still leaked.
pub fn release_from_report(store: Arc<dyn Store>, path: &Path) -> anyhow::Result<String> {
    let report = crate::commands::ipam_check::read_report(path)?;
    let ipam = Ipam::new(store.clone());
    let out = audit::release_from_report(&*store, &ipam, &report)?;
    Ok(render(&out))
}

/// Describes what a release did.
pub fn render(out: &ReleaseOutcome) -> String {
    let mut s = String::new();
    for ip in &out.released {
        let _ = writeln!(s, "Released {ip}");
    }
    for (ip, why) in &out.skipped {
        let _ = writeln!(s, "Skipped {ip}: {why}");
    }
    let _ = writeln!(
        s,
        "Released {} IP addresses; skipped {}.",
        out.released.len(),
        out.skipped.len()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_released_and_skipped() {
        let out = ReleaseOutcome {
            released: vec!["10.0.0.1".parse().unwrap()],
            skipped: vec![("10.0.0.2".parse().unwrap(), "no longer leaked".into())],
        };
        assert_eq!(
            render(&out),
            "Released 10.0.0.1\nSkipped 10.0.0.2: no longer leaked\nReleased 1 IP addresses; skipped 1.\n"
        );
    }
}
