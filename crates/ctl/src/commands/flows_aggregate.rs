//! `ternctl flows --aggregate`: the per-minute counts every node keeps of its flow records
//! (`Request::FlowAggregates`), filtered here like the records (namespace, verdict,
//! direction, port, policy), per node or summed over the nodes (`--sum`), as a table or as JSON
//! lines (one row a line).
//!
//! A row counts the records of one minute with the same ends (by namespace, `host:NODE` or
//! `outside`), destination port, direction, verdict and deciding policy. What a node did not
//! itemize (over its keys per minute, or cut to fit its reply) is said on stderr, so the rows
//! never pass for more than they are.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tern_api::flow::{AggregateReply, AggregateRow, FlowDirection, FlowVerdict, format_time};

use crate::commands::flows::{Filter, policy_matches};

/// One printed row: a node's (or, summed, every node's) count of one key in one minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The minute's start, RFC 3339.
    pub minute: String,
    /// The node, or `all` when summed over the nodes.
    pub node: String,
    #[serde(flatten)]
    pub row: AggregateRow,
}

/// Whether `row` passes the filters that apply to aggregates (a row has no pods or labels).
pub fn row_matches(f: &Filter, row: &AggregateRow) -> bool {
    if let Some(ns) = &f.namespace
        && row.src != *ns
        && row.dst != *ns
    {
        return false;
    }
    if f.verdict.is_some_and(|v| v != row.verdict)
        || f.direction.is_some_and(|d| d != row.direction)
        || f.port.is_some_and(|p| row.port != Some(p))
    {
        return false;
    }
    if let Some(want) = &f.policy {
        let Some(id) = &row.policy else {
            return false;
        };
        let parts: Vec<&str> = id.splitn(3, '/').collect();
        let matched = match parts.as_slice() {
            [kind, ns, name] => policy_matches(want, kind, Some(*ns), name),
            [kind, name] => policy_matches(want, kind, None, name),
            _ => want == id,
        };
        if !matched {
            return false;
        }
    }
    true
}

type Key = (
    u64,
    FlowDirection,
    FlowVerdict,
    String,
    String,
    String,
    Option<u16>,
    Option<String>,
);

/// The rows of every reply that pass `filter`, per node or summed (`sum`), sorted by minute,
/// then most counted first; and the notes on what the nodes did not itemize.
pub fn lines(replies: &[AggregateReply], filter: &Filter, sum: bool) -> (Vec<Line>, Vec<String>) {
    let mut counts: BTreeMap<(Key, String), u64> = BTreeMap::new();
    let mut notes = Vec::new();
    for reply in replies {
        if reply.truncated {
            notes.push(format!(
                "node {}: the reply reached its size bound; rows past it are counted as not itemized",
                reply.node
            ));
        }
        for m in &reply.minutes {
            if m.overflow > 0 {
                notes.push(format!(
                    "node {} minute {}: {} records not itemized (over the node's keys per minute)",
                    reply.node,
                    format_time(m.minute),
                    m.overflow
                ));
            }
            for r in m.rows.iter().filter(|r| row_matches(filter, r)) {
                let key = (
                    m.minute,
                    r.direction,
                    r.verdict,
                    r.src.clone(),
                    r.dst.clone(),
                    r.proto.clone(),
                    r.port,
                    r.policy.clone(),
                );
                let node = if sum { "all" } else { reply.node.as_str() };
                *counts.entry((key, node.to_string())).or_insert(0) += r.count;
            }
        }
    }
    let mut out: Vec<(u64, Line)> = counts
        .into_iter()
        .map(|((k, node), count)| {
            let (minute, direction, verdict, src, dst, proto, port, policy) = k;
            let row = AggregateRow {
                direction,
                verdict,
                src,
                dst,
                proto,
                port,
                policy,
                count,
            };
            let minute_text = format_time(minute);
            (
                minute,
                Line {
                    minute: minute_text,
                    node,
                    row,
                },
            )
        })
        .collect();
    // Stable: within a minute and count, the map's order (node, then the key).
    out.sort_by(|(ma, a), (mb, b)| ma.cmp(mb).then(b.row.count.cmp(&a.row.count)));
    (out.into_iter().map(|(_, l)| l).collect(), notes)
}

/// `HH:MM` of an RFC 3339 minute.
fn hh_mm(minute: &str) -> &str {
    minute
        .split_once('T')
        .and_then(|(_, c)| c.get(..5))
        .unwrap_or(minute)
}

/// The table: `MINUTE NODE DIR VERDICT FROM TO PORT POLICY COUNT` (minutes in UTC).
pub fn render_table(lines: &[Line]) -> String {
    let rows: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            let r = &l.row;
            vec![
                hh_mm(&l.minute).to_string(),
                l.node.clone(),
                r.direction.as_str().to_string(),
                r.verdict.as_str().to_uppercase(),
                r.src.clone(),
                r.dst.clone(),
                match r.port {
                    Some(p) => format!("{}/{p}", r.proto),
                    None => r.proto.clone(),
                },
                r.policy.clone().unwrap_or_else(|| "-".into()),
                r.count.to_string(),
            ]
        })
        .collect();
    crate::table::plain(
        &[
            "MINUTE", "NODE", "DIR", "VERDICT", "FROM", "TO", "PORT", "POLICY", "COUNT",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use tern_api::flow::AggregateMinute;

    use super::*;

    fn row(
        verdict: FlowVerdict,
        port: Option<u16>,
        policy: Option<&str>,
        count: u64,
    ) -> AggregateRow {
        AggregateRow {
            direction: FlowDirection::Ingress,
            verdict,
            src: "a".into(),
            dst: "b".into(),
            proto: "tcp".into(),
            port,
            policy: policy.map(String::from),
            count,
        }
    }

    fn replies() -> Vec<AggregateReply> {
        let deny = Some("KubernetesNetworkPolicy/b/deny-all");
        let node = |name: &str, n: u64, overflow: u64| AggregateReply {
            node: name.into(),
            minutes: vec![
                AggregateMinute {
                    minute: 1_796_463_600_000,
                    overflow,
                    rows: vec![
                        row(FlowVerdict::Allowed, Some(80), None, n),
                        row(FlowVerdict::Denied, Some(8080), deny, 2 * n),
                    ],
                },
                AggregateMinute {
                    minute: 1_796_463_660_000,
                    overflow: 0,
                    rows: vec![row(FlowVerdict::Denied, Some(8080), deny, 1)],
                },
            ],
            truncated: false,
        };
        vec![node("node1", 1, 0), node("node2", 5, 4)]
    }

    /// (minute, node, count) of each line.
    fn short(ls: &[Line]) -> Vec<(&str, &str, u64)> {
        ls.iter()
            .map(|l| (hh_mm(&l.minute), l.node.as_str(), l.row.count))
            .collect()
    }

    #[test]
    fn rows_are_sorted_by_minute_then_count_and_summed_on_demand() {
        let (ls, notes) = lines(&replies(), &Filter::default(), false);
        assert_eq!(
            short(&ls),
            vec![
                ("09:40", "node2", 10),
                ("09:40", "node2", 5),
                ("09:40", "node1", 2),
                ("09:40", "node1", 1),
                ("09:41", "node1", 1),
                ("09:41", "node2", 1),
            ]
        );
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("node2") && notes[0].contains("4 records"),
            "{notes:?}"
        );

        let (summed, _) = lines(&replies(), &Filter::default(), true);
        assert_eq!(
            short(&summed),
            vec![
                ("09:40", "all", 12),
                ("09:40", "all", 6),
                ("09:41", "all", 2)
            ]
        );
        let table = render_table(&summed);
        let first = table.lines().next().unwrap();
        assert!(
            first.starts_with("MINUTE") && first.ends_with("COUNT"),
            "{table}"
        );
        let second: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            second,
            [
                "09:40",
                "all",
                "ingress",
                "DENIED",
                "a",
                "b",
                "tcp/8080",
                "KubernetesNetworkPolicy/b/deny-all",
                "12"
            ],
            "{table}"
        );
        let json = serde_json::to_value(&summed[0]).unwrap();
        assert_eq!(json["minute"], "2026-12-05T09:40:00.000Z");
        assert_eq!(json["node"], "all");
        assert_eq!(json["count"], 12);
        assert_eq!(json["policy"], "KubernetesNetworkPolicy/b/deny-all");
    }

    #[test]
    fn filters_apply_to_rows() {
        let count = |f: Filter| {
            lines(&replies(), &f, true)
                .0
                .iter()
                .map(|l| l.row.count)
                .sum::<u64>()
        };
        assert_eq!(count(Filter::default()), 20);
        assert_eq!(
            count(Filter {
                verdict: Some(FlowVerdict::Denied),
                ..Filter::default()
            }),
            14
        );
        assert_eq!(
            count(Filter {
                port: Some(80),
                ..Filter::default()
            }),
            6
        );
        for (want, n) in [
            ("deny-all", 14),
            ("b/deny-all", 14),
            ("KubernetesNetworkPolicy/b/deny-all", 14),
            ("other", 0),
        ] {
            assert_eq!(
                count(Filter {
                    policy: Some(want.into()),
                    ..Filter::default()
                }),
                n,
                "{want}"
            );
        }
        assert_eq!(
            count(Filter {
                namespace: Some("a".into()),
                direction: Some(FlowDirection::Egress),
                ..Filter::default()
            }),
            0
        );
        assert_eq!(
            count(Filter {
                namespace: Some("b".into()),
                ..Filter::default()
            }),
            20
        );
    }
}
