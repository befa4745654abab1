//! The whole run: sets the bench namespace up as a node and measures each plugin set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::agent_proc::Agent;
use super::binaries::{BinarySize, elf_linkage, stripped_size};
use super::error::{BenchError, io_err};
use super::isolation::setup_bench_host;
use super::log_scrape::{SPLIT_ENV, agent_split};
use super::phases::{Phase, Workload, measure};
use super::plugin_exec::{Plugin, PluginSet, ResultCache};
use super::report::CniReport;

/// Options of `tern-bench cni`.
#[derive(Debug, Clone)]
pub struct CniBenchOptions {
    /// What each plugin set runs.
    pub workload: Workload,
    /// Plugin sets, in order.
    pub plugins: Vec<PluginSet>,
    /// Directory with `ternd`.
    pub bin_dir: PathBuf,
    /// Directory with the plugins `tern` and `tern-ipam` (`CNI_PATH`); the same as `bin_dir`
    /// unless the static plugins (`scripts/static-plugins.sh`) are measured.
    pub plugin_dir: PathBuf,
    /// Directory with the reference plugins.
    pub ref_dir: PathBuf,
    /// How long to wait for `ternd`'s socket.
    pub agent_timeout: Duration,
}

/// Runs the whole benchmark. The caller must already be in a private namespace
/// ([`enter_private_namespaces`]); this sets the namespace up as a node and measures each plugin
/// set in its own temporary directory. Only set-up errors are returned; a plugin set that cannot
/// be measured is recorded in [`CniReport::failures`].
pub fn run_cni(options: &CniBenchOptions) -> Result<CniReport, BenchError> {
    setup_bench_host()?;
    let work = tempfile::Builder::new()
        .prefix("tern-bench-")
        .tempdir()
        .map_err(io_err("create the bench's temporary directory"))?;
    let mut report = CniReport::default();
    for set in &options.plugins {
        let dir = work.path().join(set.to_string());
        std::fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        if let Err(e) = measure_set(*set, options, &dir, &mut report) {
            report.failures.push((set.to_string(), e.to_string()));
        }
    }
    report.sizes = binary_sizes(options, work.path());
    Ok(report)
}

fn measure_set(
    set: PluginSet,
    options: &CniBenchOptions,
    dir: &Path,
    report: &mut CniReport,
) -> Result<(), BenchError> {
    let netns_dir = dir.join("netns");
    std::fs::create_dir_all(&netns_dir)
        .map_err(io_err(format!("create {}", netns_dir.display())))?;
    let cache = ResultCache::new(&dir.join("cni-cache"))?;
    match set {
        PluginSet::Reference => {
            let data_dir = dir.join("host-local");
            let plugin = Plugin::reference(&options.ref_dir, &data_dir);
            report
                .phases
                .extend(measure(&plugin, &options.workload, &netns_dir, &cache)?);
        }
        PluginSet::Tern => {
            let state_dir = dir.join("state");
            std::fs::create_dir_all(&state_dir)
                .map_err(io_err(format!("create {}", state_dir.display())))?;
            let agent = Agent::start(&options.bin_dir.join("ternd"), dir, options.agent_timeout)?;
            // Let start-up allocations settle before calling it idle.
            std::thread::sleep(Duration::from_millis(200));
            let idle = agent.rss_kib()?;
            let plugin = Plugin::tern(&options.plugin_dir, &agent.socket, &state_dir);
            let measured = measure(&plugin, &options.workload, &netns_dir, &cache);
            let after = agent.rss_kib()?;
            report.agent_rss_kib = Some((idle, after));
            let measured = measured?;
            if std::env::var_os(SPLIT_ENV).is_some()
                && let Some(add) = measured.iter().find(|p| p.phase == Phase::Add)
            {
                let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
                report.agent_split = Some(agent_split(&log, &add.container_ids));
            }
            report.phases.extend(measured);
        }
    }
    Ok(())
}

fn binary_sizes(options: &CniBenchOptions, scratch: &Path) -> Vec<BinarySize> {
    let mut binaries = Vec::new();
    if options.plugins.contains(&PluginSet::Tern) {
        binaries.extend(["tern", "tern-ipam"].map(|b| options.plugin_dir.join(b)));
        binaries.push(options.bin_dir.join("ternd"));
    }
    if options.plugins.contains(&PluginSet::Reference) {
        binaries.extend(["ptp", "host-local"].map(|b| options.ref_dir.join(b)));
    }
    binaries
        .into_iter()
        .map(|path| BinarySize {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes: if path.is_file() {
                stripped_size(&path, scratch).map_err(|e| e.to_string())
            } else {
                Err(format!("{} not found", path.display()))
            },
            linkage: if path.is_file() {
                elf_linkage(&path).map_err(|e| e.to_string())
            } else {
                Err("not found".into())
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::isolation::{enter_private_namespaces, netns_inode};
    use crate::bench::plugin_exec::REFERENCE_PLUGIN_DIR;

    /// Runs the whole harness against the reference plugins, in a private namespace entered by a
    /// dedicated thread. Needs root and Debian's containernetworking-plugins; skipped otherwise.
    #[test]
    fn reference_plugins_are_measured_in_a_private_namespace() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root || !Path::new(REFERENCE_PLUGIN_DIR).join("ptp").is_file() {
            eprintln!("skipped: needs root and {REFERENCE_PLUGIN_DIR}/ptp");
            return;
        }
        let host_netns = netns_inode("/proc/thread-self/ns/net").unwrap();
        let report = std::thread::spawn(|| {
            enter_private_namespaces()?;
            run_cni(&CniBenchOptions {
                workload: Workload {
                    pods: 4,
                    concurrency: 4,
                },
                plugins: vec![PluginSet::Reference, PluginSet::Tern],
                bin_dir: PathBuf::from("/nonexistent-tern-bin"),
                plugin_dir: PathBuf::from("/nonexistent-tern-bin"),
                ref_dir: PathBuf::from(REFERENCE_PLUGIN_DIR),
                agent_timeout: Duration::from_secs(1),
            })
        })
        .join()
        .unwrap()
        .unwrap();
        // This thread never left the host namespace.
        assert_eq!(netns_inode("/proc/thread-self/ns/net").unwrap(), host_netns);

        let phases: Vec<(Phase, usize, usize)> = report
            .phases
            .iter()
            .map(|p| (p.phase, p.summary.n, p.summary.ok))
            .collect();
        assert_eq!(
            phases,
            vec![
                (Phase::Add, 4, 4),
                (Phase::Del, 4, 4),
                (Phase::AddConcurrent, 4, 4),
                (Phase::DelConcurrent, 4, 4),
            ],
            "{report}"
        );
        assert!(report.phases.iter().all(|p| p.plugin == "ref"));
        assert_eq!(report.phases[2].distinct_addresses, Some(true));
        assert!(report.phases[2].wall.is_some());
        // tern is reported as not measured, with the reason.
        assert_eq!(report.failures.len(), 1, "{report}");
        assert_eq!(report.failures[0].0, "tern");
        assert!(
            report.failures[0]
                .1
                .contains("/nonexistent-tern-bin/ternd not found"),
            "{report}"
        );
        assert!(!report.all_ok());
        let sizes: Vec<&str> = report.sizes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            sizes,
            vec!["tern", "tern-ipam", "ternd", "ptp", "host-local"]
        );
        assert!(report.sizes[3].bytes.as_ref().is_ok_and(|b| *b > 1_000_000));
    }
}
