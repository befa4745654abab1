//! Statistics: nearest-rank percentiles and the latency summary of one phase.

use std::time::Duration;

/// Nearest-rank percentile: the smallest sample such that at least `p` percent of all samples are
/// less than or equal to it. `None` for no samples or `p` outside (0, 100].
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    // p * n / 100 rather than p / 100 * n: 0.99 is not exact in binary and would round up a rank.
    let rank = (p * sorted.len() as f64 / 100.0).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Latency summary of one phase; percentiles cover successful executions only, since a fast
/// failure would flatter the figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Executions attempted.
    pub n: usize,
    /// Executions that succeeded.
    pub ok: usize,
    /// Median latency of the successful executions.
    pub p50: Option<Duration>,
    /// 99th percentile latency of the successful executions.
    pub p99: Option<Duration>,
    /// Slowest successful execution.
    pub max: Option<Duration>,
}

impl Summary {
    /// Summarises `ok_samples` (latencies of the successful executions) out of `n` attempts.
    pub fn new(n: usize, ok_samples: &[Duration]) -> Summary {
        Summary {
            n,
            ok: ok_samples.len(),
            p50: percentile(ok_samples, 50.0),
            p99: percentile(ok_samples, 99.0),
            max: ok_samples.iter().max().copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let samples = ms_list(&[4, 1, 3, 2]);
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(2)));
        assert_eq!(percentile(&samples, 75.0), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&samples, 76.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&samples, 100.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&samples, 1.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn p99_of_100_samples_is_the_99th_not_the_max() {
        // 1..=100 ms shuffled: p99 must be 99 ms (a p/100*n rank would round up to 100).
        let mut values: Vec<u64> = (1..=100).collect();
        values.reverse();
        values.swap(3, 70);
        let samples = ms_list(&values);
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        // 50 samples: rank ceil(49.5) = 50, the maximum.
        let fifty = ms_list(&(1..=50).collect::<Vec<_>>());
        assert_eq!(percentile(&fifty, 99.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&fifty, 50.0), Some(Duration::from_millis(25)));
    }

    #[test]
    fn percentile_rejects_empty_input_and_bad_p() {
        assert_eq!(percentile(&[], 50.0), None);
        let one = ms_list(&[7]);
        assert_eq!(percentile(&one, 0.0), None);
        assert_eq!(percentile(&one, 100.5), None);
        assert_eq!(percentile(&one, f64::NAN), None);
        assert_eq!(percentile(&one, 0.1), Some(Duration::from_millis(7)));
    }

    #[test]
    fn summary_counts_failures_but_times_successes_only() {
        let s = Summary::new(5, &ms_list(&[10, 30, 20]));
        assert_eq!(s.n, 5);
        assert_eq!(s.ok, 3);
        assert_eq!(s.p50, Some(Duration::from_millis(20)));
        assert_eq!(s.p99, Some(Duration::from_millis(30)));
        assert_eq!(s.max, Some(Duration::from_millis(30)));
        let none = Summary::new(2, &[]);
        assert_eq!((none.ok, none.p50, none.max), (0, None, None));
    }
}
