//! Bounded counts: per-minute aggregates of records, the rate budget above which events are
//! sampled out, and denies per policy for the metrics (top N + `other`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write;

use tern_api::flow::{
    AggregateMinute, AggregateQuery, AggregateReply, AggregateRow, FlowDirection, FlowPolicy,
    FlowRecord, FlowVerdict, MAX_FLOW_REPLY_BYTES,
};

/// What one aggregate counts: the ends by namespace (or kind), the port, the direction, the
/// verdict and the deciding (first) policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AggKey {
    pub direction: FlowDirection,
    pub verdict: FlowVerdict,
    pub src: String,
    pub dst: String,
    pub proto: String,
    pub port: Option<u16>,
    pub policy: Option<String>,
}

fn side(e: &tern_api::flow::FlowEnd) -> String {
    match (&e.namespace, &e.node) {
        (Some(ns), _) => ns.clone(),
        (None, Some(n)) => format!("host:{n}"),
        (None, None) => "outside".into(),
    }
}

/// Writes `Kind/namespace/name` of `p` (no namespace for a global policy) to `out`.
fn write_policy_id(out: &mut String, p: &FlowPolicy) {
    let _ = match &p.namespace {
        Some(ns) => write!(out, "{}/{ns}/{}", p.kind, p.name),
        None => write!(out, "{}/{}", p.kind, p.name),
    };
}

/// `Kind/namespace/name` of a record's first policy (the aggregates' key; tests compare with it).
pub fn policy_id(r: &FlowRecord) -> Option<String> {
    r.policies.first().map(|p| {
        let mut id = String::new();
        write_policy_id(&mut id, p);
        id
    })
}

impl AggKey {
    pub fn of(r: &FlowRecord) -> AggKey {
        AggKey {
            direction: r.direction,
            verdict: r.verdict,
            src: side(&r.src),
            dst: side(&r.dst),
            proto: r.proto.clone(),
            port: r.dst.port,
            policy: policy_id(r),
        }
    }
}

/// One minute's counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Minute {
    /// Minutes since the epoch.
    pub minute: u64,
    pub counts: HashMap<AggKey, u64>,
    /// Records whose key did not fit the minute's bound.
    pub overflow: u64,
}

/// The last `minutes` minutes, each with at most `keys` keys.
#[derive(Debug)]
pub struct Aggregates {
    minutes: usize,
    keys: usize,
    buf: VecDeque<Minute>,
}

impl Aggregates {
    pub fn new(minutes: usize, keys: usize) -> Aggregates {
        Aggregates {
            minutes: minutes.max(1),
            keys,
            buf: VecDeque::new(),
        }
    }

    /// Counts `r` in its minute (a record older than the newest minute counts in the newest).
    pub fn add(&mut self, r: &FlowRecord) {
        let m = r.time / 60_000;
        if self.buf.back().is_none_or(|b| b.minute < m) {
            if self.buf.len() == self.minutes {
                self.buf.pop_front();
            }
            self.buf.push_back(Minute {
                minute: m,
                ..Minute::default()
            });
        }
        let Some(cur) = self.buf.back_mut() else {
            return;
        };
        let k = AggKey::of(r);
        if let Some(c) = cur.counts.get_mut(&k) {
            *c += 1;
        } else if cur.counts.len() < self.keys {
            cur.counts.insert(k, 1);
        } else {
            cur.overflow += 1;
        }
    }

    /// The kept minutes, oldest first.
    pub fn minutes(&self) -> impl Iterator<Item = &Minute> {
        self.buf.iter()
    }

    /// The answer to `q` at node `node`: [`reply_of`] the minutes [`Aggregates::select`]s.
    pub fn reply(&self, node: &str, q: &AggregateQuery) -> AggregateReply {
        reply_of(node, self.select(q))
    }

    /// Copies of the minutes `q` selects, oldest first: all a reply needs of the aggregates
    /// (so the service holds its lock for the copy only, not for sorting and sizing).
    pub fn select(&self, q: &AggregateQuery) -> Vec<Minute> {
        let selected = self
            .buf
            .iter()
            .filter(|m| q.since_ms.is_none_or(|t| (m.minute + 1) * 60_000 > t));
        let from = q
            .minutes
            .map_or(0, |n| selected.clone().count().saturating_sub(n));
        selected.skip(from).cloned().collect()
    }
}

/// The reply of node `node` with `minutes` (oldest first, as [`Aggregates::select`] gives
/// them), each minute's rows most counted first. At most [`MAX_FLOW_REPLY_BYTES`] of
/// JSON, filled from the newest minute back: rows past the bound are summed into their
/// minute's `overflow`, and the reply says `truncated`.
pub fn reply_of(node: &str, minutes: Vec<Minute>) -> AggregateReply {
    let mut budget = MAX_FLOW_REPLY_BYTES;
    let mut truncated = false;
    let mut out: Vec<AggregateMinute> = Vec::with_capacity(minutes.len());
    // One buffer to size every row in.
    let mut json: Vec<u8> = Vec::new();
    for m in minutes.into_iter().rev() {
        let mut am = AggregateMinute {
            minute: m.minute * 60_000,
            overflow: m.overflow,
            rows: Vec::new(),
        };
        // The minute's own fields, whatever its rows.
        budget = budget.saturating_sub(96);
        if truncated {
            am.overflow += m.counts.values().sum::<u64>();
            out.push(am);
            continue;
        }
        let mut keys: Vec<(AggKey, u64)> = m.counts.into_iter().collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (k, c) in keys {
            if truncated {
                am.overflow += c;
                continue;
            }
            let row = k.into_row(c);
            json.clear();
            let size = serde_json::to_writer(&mut json, &row).map_or(0, |()| json.len()) + 1;
            if size > budget {
                truncated = true;
                am.overflow += c;
                continue;
            }
            budget -= size;
            am.rows.push(row);
        }
        out.push(am);
    }
    out.reverse();
    AggregateReply {
        node: node.to_string(),
        minutes: out,
        truncated,
    }
}

impl AggKey {
    /// The key as a reply's row, with its count.
    fn into_row(self, count: u64) -> AggregateRow {
        AggregateRow {
            direction: self.direction,
            verdict: self.verdict,
            src: self.src,
            dst: self.dst,
            proto: self.proto,
            port: self.port,
            policy: self.policy,
            count,
        }
    }
}

/// A token bucket: `rate` events a second, bursts of as many.
#[derive(Debug)]
pub struct Budget {
    rate: f64,
    tokens: f64,
    last_ms: u64,
}

impl Budget {
    pub fn new(rate: u32) -> Budget {
        Budget {
            rate: f64::from(rate),
            tokens: f64::from(rate),
            last_ms: 0,
        }
    }

    /// Whether one more event may be recorded at `now_ms`.
    pub fn allow(&mut self, now_ms: u64) -> bool {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = (self.tokens + dt * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Distinct policies counted by name before the rest go to `other`.
pub const MAX_POLICY_KEYS: usize = 1_000;
/// Policies named in the metrics; the rest are summed as `other`.
pub const TOP_POLICIES: usize = 20;

/// Flows by direction and verdict, denies per policy.
#[derive(Debug, Default)]
pub struct Counts {
    pub flows: BTreeMap<(FlowDirection, FlowVerdict), u64>,
    denies: HashMap<String, u64>,
    denies_other: u64,
    /// The policy id being counted (reused: a policy already counted costs no allocation).
    id: String,
}

impl Counts {
    pub fn add(&mut self, r: &FlowRecord) {
        *self.flows.entry((r.direction, r.verdict)).or_insert(0) += 1;
        if r.verdict != FlowVerdict::Denied {
            return;
        }
        for p in &r.policies {
            self.id.clear();
            write_policy_id(&mut self.id, p);
            if let Some(c) = self.denies.get_mut(self.id.as_str()) {
                *c += 1;
            } else if self.denies.len() < MAX_POLICY_KEYS {
                self.denies.insert(self.id.clone(), 1);
            } else {
                self.denies_other += 1;
            }
        }
    }

    /// The `TOP_POLICIES` policies with most denies, then `other` (the rest), when any.
    pub fn top_denies(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(&String, &u64)> = self.denies.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let mut out: Vec<(String, u64)> = v
            .iter()
            .take(TOP_POLICIES)
            .map(|(k, c)| ((*k).clone(), **c))
            .collect();
        let rest: u64 =
            v.iter().skip(TOP_POLICIES).map(|(_, c)| **c).sum::<u64>() + self.denies_other;
        if rest > 0 {
            out.push(("other".into(), rest));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use tern_api::flow::FlowPolicy;

    use super::*;
    use crate::flows::ring::tests::record;

    #[test]
    fn aggregates_keep_their_minutes_and_keys_bounded() {
        let mut a = Aggregates::new(3, 2);
        for minute in 0..5u64 {
            for port in 0..4u16 {
                let mut r = record(minute * 60_000 + 5, 1);
                r.dst.port = Some(port);
                a.add(&r);
            }
        }
        let ms: Vec<&Minute> = a.minutes().collect();
        assert_eq!(
            ms.iter().map(|m| m.minute).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        for m in ms {
            assert_eq!(m.counts.len(), 2);
            assert_eq!(m.overflow, 2);
        }
    }

    /// Records of two minutes in, rows out: counts per key, most counted first, the
    /// selection by `since` and `minutes`, and totals that equal the records counted.
    #[test]
    fn a_reply_lists_each_minutes_rows_with_their_counts() {
        let mut a = Aggregates::new(15, 1_000);
        let denied = FlowRecord::sample();
        let mut allowed = FlowRecord::sample();
        allowed.verdict = FlowVerdict::Allowed;
        allowed.reason = tern_api::flow::FlowReason::NoPolicy;
        allowed.policies.clear();
        let m0 = denied.time / 60_000;
        for (r, n) in [(&denied, 3), (&allowed, 1)] {
            for _ in 0..n {
                a.add(r);
            }
        }
        let mut later = allowed.clone();
        later.time = (m0 + 1) * 60_000 + 10;
        later.dst.kind = tern_api::flow::EndKind::Host;
        later.dst.namespace = None;
        later.dst.node = Some("node1".into());
        a.add(&later);

        let all = a.reply("node2", &AggregateQuery::default());
        assert_eq!(all.node, "node2");
        assert!(!all.truncated);
        assert_eq!(all.minutes.len(), 2);
        let first = &all.minutes[0];
        assert_eq!(first.minute, m0 * 60_000);
        assert_eq!(first.overflow, 0);
        assert_eq!(first.rows.len(), 2);
        assert_eq!(first.rows[0].verdict, FlowVerdict::Denied);
        assert_eq!(first.rows[0].count, 3);
        assert_eq!(
            first.rows[0].policy.as_deref(),
            Some("KubernetesNetworkPolicy/b/deny-all")
        );
        assert_eq!(
            (first.rows[0].src.as_str(), first.rows[0].dst.as_str()),
            ("a", "b")
        );
        assert_eq!(first.rows[0].port, Some(8080));
        assert_eq!(first.rows[1].verdict, FlowVerdict::Allowed);
        assert_eq!(first.rows[1].policy, None);
        assert_eq!(all.minutes[1].rows[0].dst, "host:node1");

        let newest = a.reply(
            "node2",
            &AggregateQuery {
                minutes: Some(1),
                ..AggregateQuery::default()
            },
        );
        assert_eq!(newest.minutes.len(), 1);
        assert_eq!(newest.minutes[0].minute, (m0 + 1) * 60_000);
        // A minute still counts when it ends after `since`.
        let since = |ms| {
            a.reply(
                "node2",
                &AggregateQuery {
                    since_ms: Some(ms),
                    ..AggregateQuery::default()
                },
            )
            .minutes
            .len()
        };
        assert_eq!(since(m0 * 60_000 + 59_999), 2);
        assert_eq!(since((m0 + 1) * 60_000), 1);
        assert_eq!(since((m0 + 2) * 60_000), 0);
    }

    /// More keys than a reply carries: the newest minute is itemized first, what does not fit
    /// is summed in its minute's overflow, and the totals stay the records counted.
    #[test]
    fn a_reply_stays_under_its_bound_and_keeps_its_totals() {
        let mut a = Aggregates::new(3, 100_000);
        let mut r = FlowRecord::sample();
        let long = "n".repeat(60);
        for minute in 0..3u64 {
            for i in 0..2_000u32 {
                r.time = minute * 60_000 + 5;
                r.src.namespace = Some(format!("{long}{i}"));
                a.add(&r);
            }
        }
        let reply = a.reply("n1", &AggregateQuery::default());
        assert!(reply.truncated);
        let bytes = serde_json::to_vec(&reply).unwrap().len();
        assert!(bytes < tern_api::MAX_FRAME, "{bytes}");
        assert_eq!(reply.minutes.len(), 3);
        for m in &reply.minutes {
            let rows: u64 = m.rows.iter().map(|r| r.count).sum();
            assert_eq!(rows + m.overflow, 2_000);
        }
        assert_eq!(reply.minutes[2].overflow, 0, "the newest minute whole");
        assert!(reply.minutes[0].rows.len() < reply.minutes[2].rows.len());
    }

    #[test]
    fn the_budget_allows_its_rate_and_refills() {
        let mut b = Budget::new(100);
        let allowed = (0..1000).filter(|_| b.allow(1_000)).count();
        assert_eq!(allowed, 100, "a burst of the rate");
        assert!(!b.allow(1_000));
        // Half a second later, half the rate again.
        let allowed = (0..1000).filter(|_| b.allow(1_500)).count();
        assert_eq!(allowed, 50);
    }

    #[test]
    fn denies_per_policy_are_bounded_to_the_top_and_other() {
        let mut c = Counts::default();
        for i in 0..(TOP_POLICIES + 5) {
            for _ in 0..=i {
                let mut r = record(0, 1);
                r.verdict = FlowVerdict::Denied;
                r.policies = vec![FlowPolicy {
                    kind: "GlobalNetworkPolicy".into(),
                    namespace: None,
                    name: format!("p{i}"),
                    rule: None,
                }];
                c.add(&r);
            }
        }
        let top = c.top_denies();
        assert_eq!(top.len(), TOP_POLICIES + 1);
        assert_eq!(
            top[0],
            (format!("GlobalNetworkPolicy/p{}", TOP_POLICIES + 4), 25)
        );
        assert_eq!(
            top.last().unwrap(),
            &("other".to_string(), 1 + 2 + 3 + 4 + 5)
        );
    }
}
