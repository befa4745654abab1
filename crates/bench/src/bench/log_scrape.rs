//! Where the sequential ADDs' time went inside `ternd`, scraped from its debug log.

use std::time::Duration;

use super::stats::percentile;

/// Where the sequential ADDs' time went inside `ternd` (p50 of each step over the phase), read
/// from its debug log (`TERN_BENCH_SPLIT=1` runs it with `tern_agent::pod` and
/// `tern_agent::server` at debug). What the runtime saw minus `served` is the plugin's exec,
/// start-up and exit, the socket round trip and ternd's accept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSplit {
    /// ADDs found in the log for the phase.
    pub n: usize,
    /// IPAM allocation (one store transaction).
    pub allocate: Option<Duration>,
    /// Creating the veth pair (peer made in the pod's namespace) and its host sysctls.
    pub create_veth: Option<Duration>,
    /// Policy for the endpoint, then the pod side (link up, addresses, routes) and host route.
    pub configure: Option<Duration>,
    /// Recording the WorkloadEndpoint.
    pub endpoint: Option<Duration>,
    /// The whole request as ternd served it (`ADD ... ok in`).
    pub served: Option<Duration>,
}

/// The environment variable that asks for [`AgentSplit`].
pub const SPLIT_ENV: &str = "TERN_BENCH_SPLIT";

/// `ternd`'s log filter when [`SPLIT_ENV`] is set.
pub(super) const SPLIT_LOG: &str = "info,tern_agent::pod=debug,tern_agent::server=debug";

/// Reads the whole microseconds `ternd` logs beside a step's `Debug` text: the `(us: A B C D)` at
/// the end of `ADD <id>: allocate ...` (`text` is what follows `: allocate `) or the `(N us)` of
/// `ADD <id>/<if> ok in ...`.
fn logged_micros(text: &str) -> Vec<Duration> {
    let Some((_, tail)) = text.trim_end().rsplit_once('(') else {
        return Vec::new();
    };
    let numbers = tail
        .strip_prefix("us: ")
        .or_else(|| tail.strip_suffix(" us)"))
        .map(|n| n.trim_end_matches(')'));
    numbers
        .into_iter()
        .flat_map(str::split_whitespace)
        .map_while(|n| n.parse().ok().map(Duration::from_micros))
        .collect()
}

/// Reads the split of the ADDs of `container_ids` from a `ternd` debug log.
pub fn agent_split(log: &str, container_ids: &[String]) -> AgentSplit {
    let wanted: std::collections::HashSet<&str> =
        container_ids.iter().map(String::as_str).collect();
    let mut parts: [Vec<Duration>; 5] = Default::default();
    for line in log.lines() {
        let Some(rest) = line.split(" ADD ").nth(1) else {
            continue;
        };
        if let Some((cid, steps)) = rest.split_once(": allocate ") {
            if !wanted.contains(cid) {
                continue;
            }
            // "A, create veth B, policy+configure C, endpoint D (us: a b c d)"
            let values = logged_micros(steps);
            if values.len() == 4 {
                for (part, d) in parts.iter_mut().zip(values) {
                    part.push(d);
                }
            }
        } else if let Some((target, took)) = rest.split_once(" ok in ") {
            let cid = target.split('/').next().unwrap_or("");
            if wanted.contains(cid)
                && let [d] = logged_micros(took)[..]
            {
                parts[4].push(d);
            }
        }
    }
    let p50 = |v: &Vec<Duration>| percentile(v, 50.0);
    AgentSplit {
        n: parts[4].len(),
        allocate: p50(&parts[0]),
        create_veth: p50(&parts[1]),
        configure: p50(&parts[2]),
        endpoint: p50(&parts[3]),
        served: p50(&parts[4]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_split_reads_only_the_phase_pods_from_the_log() {
        let log = "\
[2026-12-01T11:59:27.100Z DEBUG tern_agent::pod::add] ADD warm: allocate 9ms, create veth 9ms, policy+configure 9ms, endpoint 9ms (us: 9000 9000 9000 9000)
[2026-12-01T11:59:27.100Z DEBUG tern_agent::server] ADD warm/eth0 ok in 40ms (40000 us)
[2026-12-01T11:59:27.200Z DEBUG tern_agent::pod::add] ADD c1: allocate 100.4µs, create veth 600.1µs, policy+configure 300.9µs, endpoint 90µs (us: 100 600 300 90)
[2026-12-01T11:59:27.200Z DEBUG tern_agent::server] ADD c1/eth0 ok in 1.2004ms (1200 us)
[2026-12-01T11:59:27.300Z DEBUG tern_agent::pod::add] ADD c2: allocate 200µs, create veth 700µs, policy+configure 400µs, endpoint 110µs (us: 200 700 400 110)
[2026-12-01T11:59:27.300Z DEBUG tern_agent::server] ADD c2/eth0 ok in 1.5ms (1500 us)
[2026-12-01T11:59:27.400Z INFO  tern_agent::server] ADD c3/eth0 failed (code 11): busy
";
        let sp = agent_split(log, &["c1".into(), "c2".into(), "c3".into()]);
        assert_eq!(
            sp,
            AgentSplit {
                n: 2,
                allocate: Some(Duration::from_micros(100)),
                create_veth: Some(Duration::from_micros(600)),
                configure: Some(Duration::from_micros(300)),
                endpoint: Some(Duration::from_micros(90)),
                served: Some(Duration::from_micros(1200)),
            }
        );
        assert_eq!(agent_split(log, &[]).n, 0);
        // A line without the microseconds (a ternd from before they were logged) is not guessed at.
        let old = "[x DEBUG tern_agent::server] ADD c1/eth0 ok in 1.2ms\n";
        assert_eq!(agent_split(old, &["c1".into()]).n, 0);
    }
}
