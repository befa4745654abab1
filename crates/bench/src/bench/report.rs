//! What `tern-bench cni` reports: the figures, the targets they are judged against, and the table.

use std::fmt;
use std::time::Duration;

use super::binaries::BinarySize;
use super::log_scrape::AgentSplit;
use super::phases::{Phase, PhaseResult};
use super::plugin_exec::PluginSet;

/// Targets from the issue, checked for the tern plugin set.
pub mod targets {
    use std::time::Duration;
    /// ADD p50 (sequential pods).
    pub const ADD_P50: Duration = Duration::from_millis(3);
    /// DEL p50 (sequential pods).
    pub const DEL_P50: Duration = Duration::from_millis(3);
    /// Stripped size of the `tern` plugin binary.
    pub const TERN_BINARY_BYTES: u64 = 5 * 1024 * 1024;
    /// Resident memory of an idle `ternd`, in KiB.
    pub const TERND_IDLE_RSS_KIB: u64 = 20 * 1024;
}

/// Everything `tern-bench cni` reports.
#[derive(Debug, Clone, Default)]
pub struct CniReport {
    /// Figures of every measured phase.
    pub phases: Vec<PhaseResult>,
    /// Plugin sets that could not be measured, with the reason.
    pub failures: Vec<(String, String)>,
    /// Stripped binary sizes.
    pub sizes: Vec<BinarySize>,
    /// `ternd` RSS in KiB after start-up and after the run.
    pub agent_rss_kib: Option<(u64, u64)>,
    /// With `TERN_BENCH_SPLIT=1`: where the sequential ADDs' time went inside `ternd`.
    pub agent_split: Option<AgentSplit>,
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

impl CniReport {
    /// For each phase measured for both sets: ref's p50 divided by tern's (how many times
    /// faster tern is).
    pub fn ratios(&self) -> Vec<(Phase, f64)> {
        let p50 = |plugin: &str, phase: Phase| {
            self.phases
                .iter()
                .find(|p| p.plugin == plugin && p.phase == phase)
                .and_then(|p| p.summary.p50)
        };
        [
            Phase::Add,
            Phase::Del,
            Phase::AddConcurrent,
            Phase::DelConcurrent,
        ]
        .into_iter()
        .filter_map(|ph| {
            let r = p50(&PluginSet::Reference.to_string(), ph)?;
            let t = p50(&PluginSet::Tern.to_string(), ph)?;
            (!t.is_zero()).then(|| (ph, r.as_secs_f64() / t.as_secs_f64()))
        })
        .collect()
    }

    /// True when every requested plugin set was measured and every execution succeeded with
    /// distinct addresses.
    pub fn all_ok(&self) -> bool {
        self.failures.is_empty()
            && self
                .phases
                .iter()
                .all(|p| p.summary.ok == p.summary.n && p.distinct_addresses.unwrap_or(true))
    }

    /// The targets for tern, each with whether it is met; empty when tern was not
    /// measured.
    pub fn tern_targets(&self) -> Vec<(String, bool)> {
        let phase = |ph| {
            self.phases
                .iter()
                .find(|p| p.plugin == "tern" && p.phase == ph)
        };
        let mut out = Vec::new();
        if let Some(p) = phase(Phase::Add) {
            let ok = p.summary.p50.is_some_and(|d| d <= targets::ADD_P50);
            out.push((
                format!("ADD p50 <= {} ms", targets::ADD_P50.as_millis()),
                ok,
            ));
        }
        if let Some(p) = phase(Phase::Del) {
            let ok = p.summary.p50.is_some_and(|d| d <= targets::DEL_P50);
            out.push((
                format!("DEL p50 <= {} ms", targets::DEL_P50.as_millis()),
                ok,
            ));
        }
        if let Some(p) = phase(Phase::AddConcurrent) {
            let ok = p.summary.ok == p.summary.n && p.distinct_addresses == Some(true);
            out.push((
                format!(
                    "all {} concurrent ADDs succeed with distinct addresses",
                    p.summary.n
                ),
                ok,
            ));
        }
        if let Some(size) = self.sizes.iter().find(|s| s.name == "tern") {
            let ok = size
                .bytes
                .as_ref()
                .is_ok_and(|b| *b <= targets::TERN_BINARY_BYTES);
            out.push(("tern binary <= 5 MiB stripped".into(), ok));
        }
        if let Some((idle, _)) = self.agent_rss_kib {
            out.push((
                "ternd idle RSS <= 20 MiB".into(),
                idle <= targets::TERND_IDLE_RSS_KIB,
            ));
        }
        out
    }
}

impl fmt::Display for CniReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<8} {:<15} {:>5} {:>5} {:>9} {:>9} {:>9}",
            "plugin", "phase", "n", "ok", "p50 ms", "p99 ms", "max ms"
        )?;
        for p in &self.phases {
            let s = &p.summary;
            writeln!(
                f,
                "{:<8} {:<15} {:>5} {:>5} {:>9} {:>9} {:>9}",
                p.plugin,
                p.phase,
                s.n,
                s.ok,
                ms(s.p50),
                ms(s.p99),
                ms(s.max)
            )?;
        }
        let notes: Vec<&PhaseResult> = self
            .phases
            .iter()
            .filter(|p| {
                p.wall.is_some() || !p.errors.is_empty() || p.distinct_addresses == Some(false)
            })
            .collect();
        if !notes.is_empty() {
            writeln!(f)?;
            for p in notes {
                let mut line = format!("{} {}:", p.plugin, p.phase);
                if let Some(wall) = p.wall {
                    line.push_str(&format!(" wall {} ms", ms(Some(wall))));
                }
                if let Some(distinct) = p.distinct_addresses {
                    line.push_str(if distinct {
                        ", addresses distinct"
                    } else {
                        ", DUPLICATE ADDRESSES"
                    });
                }
                for e in &p.errors {
                    line.push_str(&format!("\n    error: {e}"));
                }
                writeln!(f, "{line}")?;
            }
        }
        for (set, reason) in &self.failures {
            writeln!(f, "\n{set}: NOT MEASURED: {reason}")?;
        }
        if !self.sizes.is_empty() {
            writeln!(
                f,
                "\n{:<12} {:>12} {:>9}  linkage",
                "binary", "stripped B", "MiB"
            )?;
            for s in &self.sizes {
                let linkage = match &s.linkage {
                    Ok(l) => l.to_string(),
                    Err(e) => format!("? ({e})"),
                };
                match &s.bytes {
                    Ok(b) => writeln!(
                        f,
                        "{:<12} {:>12} {:>9.2}  {linkage}",
                        s.name,
                        b,
                        *b as f64 / (1024.0 * 1024.0)
                    )?,
                    Err(e) => writeln!(f, "{:<12} {e}", s.name)?,
                }
            }
        }
        let ratios = self.ratios();
        if !ratios.is_empty() {
            writeln!(f)?;
            for (phase, r) in ratios {
                writeln!(f, "ref/tern p50 {phase}: {r:.2}x")?;
            }
        }
        if let Some(sp) = &self.agent_split {
            writeln!(
                f,
                "\nternd's share of the sequential ADDs (p50 of {} from its log, ms): allocate {}, create veth {}, policy+configure {}, endpoint {}; served in {}",
                sp.n,
                ms(sp.allocate),
                ms(sp.create_veth),
                ms(sp.configure),
                ms(sp.endpoint),
                ms(sp.served)
            )?;
        }
        if let Some((idle, after)) = self.agent_rss_kib {
            writeln!(
                f,
                "\nternd VmRSS: {:.1} MiB after start-up, {:.1} MiB after the run",
                idle as f64 / 1024.0,
                after as f64 / 1024.0
            )?;
        }
        let targets = self.tern_targets();
        if !targets.is_empty() {
            writeln!(f, "\ntern targets:")?;
            for (what, ok) in targets {
                writeln!(f, "  {} {what}", pass(ok))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::binaries::Linkage;
    use crate::bench::stats::Summary;

    fn ms_list(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn targets_are_judged_from_the_report() {
        let phase = |phase, samples: &[u64], n, distinct| PhaseResult {
            plugin: "tern".into(),
            phase,
            summary: Summary::new(n, &ms_list(samples)),
            wall: None,
            distinct_addresses: distinct,
            errors: vec![],
            container_ids: vec![],
        };
        let report = CniReport {
            phases: vec![
                phase(Phase::Add, &[1, 2, 3], 3, Some(true)),
                phase(Phase::Del, &[4, 5, 6], 3, None),
                phase(Phase::AddConcurrent, &[1, 1], 3, Some(true)),
            ],
            failures: vec![],
            sizes: vec![BinarySize {
                name: "tern".into(),
                bytes: Ok(1_000_000),
                linkage: Ok(Linkage::Static),
            }],
            agent_rss_kib: Some((30 * 1024, 31 * 1024)),
            agent_split: None,
        };
        let verdicts: Vec<bool> = report.tern_targets().into_iter().map(|t| t.1).collect();
        assert_eq!(verdicts, vec![true, false, false, true, false]);
        assert!(!report.all_ok());
        let table = report.to_string();
        assert!(
            table.contains("plugin   phase               n    ok    p50 ms    p99 ms    max ms")
        );
        assert!(
            table.contains("tern     add                 3     3      2.00      3.00      3.00")
        );
        assert!(table.contains("FAIL DEL p50 <= 3 ms"));
        assert!(
            table.contains("tern              1000000      0.95  static"),
            "{table}"
        );
    }

    #[test]
    fn ratios_compare_the_sets_phase_by_phase() {
        let phase = |plugin: &str, ph: Phase, ms: u64| PhaseResult {
            plugin: plugin.into(),
            phase: ph,
            summary: Summary::new(1, &[Duration::from_millis(ms)]),
            wall: None,
            distinct_addresses: None,
            errors: vec![],
            container_ids: vec![],
        };
        let report = CniReport {
            phases: vec![
                phase("ref", Phase::Add, 12),
                phase("ref", Phase::Del, 30),
                phase("tern", Phase::Add, 3),
                phase("tern", Phase::Del, 2),
                phase("tern", Phase::AddConcurrent, 100),
            ],
            ..CniReport::default()
        };
        assert_eq!(report.ratios(), vec![(Phase::Add, 4.0), (Phase::Del, 15.0)]);
        assert!(report.to_string().contains("ref/tern p50 add: 4.00x"));
    }
}
