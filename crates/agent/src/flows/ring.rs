//! The bounded ring of recent records, numbered as they come, and the answer to a
//! [`FlowQuery`] from it (bounded by the socket's frame size).

use std::collections::VecDeque;

use tern_api::flow::{FlowQuery, FlowRecord, MAX_FLOW_REPLY_BYTES};

/// The most recent records, at most `cap`.
#[derive(Debug)]
pub struct Ring {
    cap: usize,
    buf: VecDeque<FlowRecord>,
    last_seq: u64,
}

/// The records a query selects, oldest first, and whether more matched than fit.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selected {
    pub records: Vec<FlowRecord>,
    pub more: bool,
}

impl Ring {
    /// An empty ring of `cap` records (at least 1).
    pub fn new(cap: usize) -> Ring {
        Ring {
            cap: cap.max(1),
            buf: VecDeque::new(),
            last_seq: 0,
        }
    }

    /// Numbers `r` with the next sequence number and keeps it, dropping the oldest at the cap.
    pub fn push(&mut self, mut r: FlowRecord) -> u64 {
        self.last_seq += 1;
        r.seq = self.last_seq;
        if self.buf.len() == self.cap {
            self.buf.pop_front();
        }
        self.buf.push_back(r);
        self.last_seq
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The last sequence number given.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The records after `after_seq` and at or after `since_ms`; of those the `last` most
    /// recent. A follower (`after_seq`) gets the oldest first up to the reply's size; any other
    /// query the newest.
    pub fn select(&self, q: &FlowQuery) -> Selected {
        let matching: Vec<&FlowRecord> = self
            .buf
            .iter()
            .filter(|r| q.after_seq.is_none_or(|s| r.seq > s))
            .filter(|r| q.since_ms.is_none_or(|t| r.time >= t))
            .collect();
        let from = q.last.map_or(0, |n| matching.len().saturating_sub(n));
        let matching = &matching[from..];
        let mut bytes = 0;
        let mut fits = |r: &FlowRecord| {
            bytes += serde_json::to_vec(r).map_or(0, |v| v.len()) + 1;
            bytes <= MAX_FLOW_REPLY_BYTES
        };
        let mut out = Vec::new();
        let mut more = false;
        if q.after_seq.is_some() {
            for r in matching {
                if !fits(r) {
                    more = true;
                    break;
                }
                out.push((*r).clone());
            }
        } else {
            for r in matching.iter().rev() {
                if !fits(r) {
                    more = true;
                    break;
                }
                out.push((*r).clone());
            }
            out.reverse();
        }
        Selected { records: out, more }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use tern_api::flow::{EndKind, FlowDirection, FlowEnd, FlowReason, FlowVerdict};

    use super::*;

    pub(crate) fn record(time: u64, port: u16) -> FlowRecord {
        let end = |ip: &str, port| FlowEnd {
            ip: ip.into(),
            port,
            kind: EndKind::Outside,
            namespace: None,
            pod: None,
            labels: BTreeMap::new(),
            node: None,
        };
        FlowRecord {
            seq: 0,
            time,
            node: "n1".into(),
            direction: FlowDirection::Ingress,
            proto: "udp".into(),
            src: end("192.0.2.1", Some(port)),
            dst: end("10.0.0.1", Some(53)),
            verdict: FlowVerdict::Allowed,
            reason: FlowReason::NoPolicy,
            policies: Vec::new(),
            pending: None,
        }
    }

    #[test]
    fn the_ring_keeps_its_cap_and_numbers_records() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            r.push(record(i, i as u16));
        }
        assert_eq!((r.len(), r.last_seq()), (3, 10));
        let all = r.select(&FlowQuery::default());
        let seqs: Vec<u64> = all.records.iter().map(|x| x.seq).collect();
        assert_eq!(seqs, vec![8, 9, 10]);
        assert!(!all.more);
    }

    #[test]
    fn queries_follow_filter_by_time_and_take_the_last() {
        let mut r = Ring::new(100);
        for i in 0..10 {
            r.push(record(1000 + i, 1));
        }
        let q = |after_seq, since_ms, last| FlowQuery {
            after_seq,
            since_ms,
            last,
        };
        let seqs = |s: Selected| s.records.iter().map(|x| x.seq).collect::<Vec<_>>();
        assert_eq!(seqs(r.select(&q(Some(7), None, None))), vec![8, 9, 10]);
        assert_eq!(seqs(r.select(&q(None, Some(1008), None))), vec![9, 10]);
        assert_eq!(seqs(r.select(&q(None, None, Some(2)))), vec![9, 10]);
        assert_eq!(seqs(r.select(&q(Some(10), None, None))), Vec::<u64>::new());
    }

    #[test]
    fn a_reply_stops_at_its_size_bound() {
        let mut r = Ring::new(20_000);
        for i in 0..20_000 {
            r.push(record(i, 1));
        }
        let follow = r.select(&FlowQuery {
            after_seq: Some(0),
            ..FlowQuery::default()
        });
        assert!(follow.more);
        assert_eq!(follow.records[0].seq, 1, "a follower gets the oldest first");
        let bytes: usize = follow
            .records
            .iter()
            .map(|x| serde_json::to_vec(x).unwrap().len() + 1)
            .sum();
        assert!(bytes <= MAX_FLOW_REPLY_BYTES);
        let recent = r.select(&FlowQuery::default());
        assert!(recent.more);
        assert_eq!(recent.records.last().unwrap().seq, 20_000);
    }
}
