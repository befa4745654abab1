//! Flow records: one per new connection and direction at a pod, with the verdict and its cause.
//!
//! ternd makes them from the kernel's log of each connection's first packet and keeps a bounded
//! ring of them; `ternctl flows` asks for them ([`FlowQuery`]) and prints them, and the web page
//! draws them. The JSON shape is the one operators script against:
//!
//! ```json
//! {"seq":7,"time":"2026-12-05T09:40:01.123Z","node":"node1","direction":"ingress","proto":"tcp",
//!  "src":{"ip":"10.244.0.5","port":40312,"kind":"pod","namespace":"a","pod":"client",
//!         "labels":{"app":"client"}},
//!  "dst":{"ip":"10.244.1.7","port":8080,"kind":"pod","namespace":"b","pod":"server"},
//!  "verdict":"denied","reason":"default-deny",
//!  "policies":[{"kind":"KubernetesNetworkPolicy","namespace":"b","name":"deny-all"}]}
//! ```
//!
//! `policies` is the deciding policy with its `rule` (`ingress[0]`) for `reason: rule`, every
//! policy that selects the pod in that direction for `default-deny`, and empty for `no-policy`.
//! `pending` is present when a staged policy would have decided otherwise.
//!
//! Each node also counts its records per minute ([`AggregateQuery`] -> [`AggregateReply`],
//! `ternctl flows --aggregate`): a row per key (ends by namespace, port, direction, verdict,
//! deciding policy) with its count, and what the minute did not itemize as `overflow`.
//!
//! Time travels as RFC 3339 in UTC with milliseconds; [`format_time`] and [`parse_time`] are the
//! two directions, without a date library (this crate is linked into the CNI plugin).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One record: a new connection seen at a pod in one direction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    /// The node's sequence number for this record (increasing; a follower asks for records
    /// after the last one it saw).
    pub seq: u64,
    /// When the first packet was seen, milliseconds since the Unix epoch, written as RFC 3339.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    pub time: u64,
    /// The node whose agent recorded it.
    pub node: String,
    /// At which end the verdict was taken: `ingress` at the destination pod, `egress` at the
    /// source pod.
    pub direction: FlowDirection,
    /// `tcp`, `udp`, `sctp`, `icmp`, `icmpv6` or the protocol number.
    pub proto: String,
    pub src: FlowEnd,
    pub dst: FlowEnd,
    pub verdict: FlowVerdict,
    pub reason: FlowReason,
    /// See the module documentation.
    #[serde(default)]
    pub policies: Vec<FlowPolicy>,
    /// What the staged policies would have done, when it differs from what was enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<FlowPending>,
}

/// `ingress` or `egress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowDirection {
    Ingress,
    Egress,
}

impl FlowDirection {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowDirection::Ingress => "ingress",
            FlowDirection::Egress => "egress",
        }
    }
}

/// `allowed` or `denied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowVerdict {
    Allowed,
    Denied,
}

impl FlowVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowVerdict::Allowed => "allowed",
            FlowVerdict::Denied => "denied",
        }
    }
}

/// What decided: a rule, the default deny of the selecting policies, or no policy at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowReason {
    Rule,
    DefaultDeny,
    NoPolicy,
}

impl FlowReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowReason::Rule => "rule",
            FlowReason::DefaultDeny => "default-deny",
            FlowReason::NoPolicy => "no-policy",
        }
    }
}

/// What an end of a flow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndKind {
    /// A pod (workload endpoint): `namespace`, `pod` and `labels` are set.
    Pod,
    /// A node's own address: `node` is set.
    Host,
    /// Any other address.
    Outside,
}

/// One end of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEnd {
    pub ip: String,
    /// The transport port; absent for protocols without ports (ICMP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    pub kind: EndKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// For a host end, the node's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A policy named in a record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FlowPolicy {
    /// tern's kind name: `NetworkPolicy`, `GlobalNetworkPolicy`, `KubernetesNetworkPolicy`,
    /// or a staged kind.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// The deciding rule as written, `ingress[0]`; absent for a default deny.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// What the staged policies would have done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowPending {
    pub verdict: FlowVerdict,
    pub reason: FlowReason,
    #[serde(default)]
    pub policies: Vec<FlowPolicy>,
}

/// A request for records (`Request::Flows`). Every filter given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowQuery {
    /// Only records with `seq` greater than this (a follower's cursor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_seq: Option<u64>,
    /// Only records at or after this time (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// At most this many, the most recent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<usize>,
}

/// The agent's answer to a [`FlowQuery`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowReply {
    pub node: String,
    /// Oldest first.
    pub records: Vec<FlowRecord>,
    /// The last sequence number the node has given (a follower's next cursor when `records`
    /// is empty).
    pub last_seq: u64,
    /// Records the node did not keep: sampled out under load or lost by the kernel.
    pub dropped: u64,
    /// More records matched than one reply carries (`tern_api::MAX_FRAME`): a follower asks
    /// again after the last one.
    #[serde(default)]
    pub more: bool,
}

/// A request for the per-minute aggregates (`Request::FlowAggregates`, `ternctl flows
/// --aggregate`). Every bound given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateQuery {
    /// Only minutes that end after this time (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
    /// At most this many minutes, the most recent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minutes: Option<usize>,
}

/// The agent's answer to an [`AggregateQuery`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateReply {
    pub node: String,
    /// Oldest first.
    pub minutes: Vec<AggregateMinute>,
    /// The reply reached its size bound ([`MAX_FLOW_REPLY_BYTES`]): rows that did not fit
    /// are counted in their minute's `overflow` (older minutes go first).
    #[serde(default)]
    pub truncated: bool,
}

/// JSON bytes of records one [`FlowReply`], or of rows one [`AggregateReply`], carries at
/// most: under `MAX_FRAME` with room for the envelope.
pub const MAX_FLOW_REPLY_BYTES: usize = 768 * 1024;

/// One minute's counts at one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateMinute {
    /// The minute's start, milliseconds since the epoch, written as RFC 3339.
    #[serde(serialize_with = "ser_time", deserialize_with = "de_time")]
    pub minute: u64,
    /// Records of the minute not itemized in `rows`: over the node's keys per minute, or cut
    /// to fit the reply. Rows' counts plus this are every record the minute kept.
    pub overflow: u64,
    /// Most counted first.
    pub rows: Vec<AggregateRow>,
}

/// Records of one minute with the same ends, port, direction, verdict and deciding policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AggregateRow {
    pub direction: FlowDirection,
    pub verdict: FlowVerdict,
    /// The source's namespace, `host:NODE` for a node, or `outside`.
    pub src: String,
    /// The destination's, as `src`.
    pub dst: String,
    pub proto: String,
    /// The destination port; absent for protocols without ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The deciding (first) policy as `Kind/NAMESPACE/NAME` (`Kind/NAME` for a global one);
    /// absent when no policy decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    pub count: u64,
}

impl FlowRecord {
    /// A denied ingress record x/client -> b/server:8080 at node2 (the default deny of
    /// `KubernetesNetworkPolicy b/deny-all`): the one example the unit tests of this crate
    /// and of ternctl share.
    #[doc(hidden)]
    pub fn sample() -> FlowRecord {
        let end = |ns: &str, pod: &str, ip: &str, port: u16| FlowEnd {
            ip: ip.into(),
            port: Some(port),
            kind: EndKind::Pod,
            namespace: Some(ns.into()),
            pod: Some(pod.into()),
            labels: BTreeMap::from([("app".into(), pod.into())]),
            node: None,
        };
        FlowRecord {
            seq: 1,
            time: 1_796_463_601_123,
            node: "node2".into(),
            direction: FlowDirection::Ingress,
            proto: "tcp".into(),
            src: end("a", "client", "10.244.0.5", 40312),
            dst: end("b", "server", "10.244.1.7", 8080),
            verdict: FlowVerdict::Denied,
            reason: FlowReason::DefaultDeny,
            policies: vec![FlowPolicy {
                kind: "KubernetesNetworkPolicy".into(),
                namespace: Some("b".into()),
                name: "deny-all".into(),
                rule: None,
            }],
            pending: None,
        }
    }
}

fn ser_time<S: Serializer>(ms: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_time(*ms))
}

fn de_time<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    parse_time(&s).ok_or_else(|| serde::de::Error::custom(format!("bad time {s:?}")))
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) to days since 1970-01-01 (`days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Milliseconds since the epoch as `2026-12-05T09:40:01.123Z`.
pub fn format_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The inverse of [`format_time`]; also accepts no fraction or up to nine fraction digits.
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, clock) = s.split_once('T')?;
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let mo: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    let (hms, frac) = match clock.split_once('.') {
        Some((a, b)) => (a, b),
        None => (clock, ""),
    };
    let mut cp = hms.splitn(3, ':');
    let h: u64 = cp.next()?.parse().ok()?;
    let mi: u64 = cp.next()?.parse().ok()?;
    let sec: u64 = cp.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms: u64 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().ok()?
    };
    let days = days_from_civil(y, mo, d);
    let days = u64::try_from(days).ok()?;
    Some((days * 86_400 + h * 3600 + mi * 60 + sec) * 1000 + ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trips() {
        for ms in [
            0,
            1_000,
            951_782_400_123,   // 2000-02-29
            1_796_463_601_123, // 2026-12-05T09:40:01.123
            4_102_444_799_999, // 2099-12-31T23:59:59.999
        ] {
            assert_eq!(
                parse_time(&format_time(ms)),
                Some(ms),
                "{}",
                format_time(ms)
            );
        }
        assert_eq!(format_time(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(parse_time("2026-12-05T09:40:01Z"), Some(1_796_463_601_000));
        assert_eq!(
            parse_time("2026-12-05T09:40:01.5Z"),
            Some(1_796_463_601_500)
        );
        for bad in [
            "",
            "2026-12-05",
            "2026-13-05T00:00:00Z",
            "2026-12-05T24:00:00Z",
            "x",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn record_json_has_the_documented_fields() {
        let mut r = FlowRecord::sample();
        r.dst = FlowEnd {
            ip: "198.18.0.2".into(),
            port: Some(8080),
            kind: EndKind::Host,
            namespace: None,
            pod: None,
            labels: BTreeMap::new(),
            node: Some("node2".into()),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["time"], "2026-12-05T09:40:01.123Z");
        assert_eq!(v["direction"], "ingress");
        assert_eq!(v["src"]["pod"], "client");
        assert_eq!(v["dst"]["kind"], "host");
        assert_eq!(v["reason"], "default-deny");
        assert!(v.get("pending").is_none());
        let back: FlowRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn aggregates_round_trip_with_the_documented_fields() {
        let q = AggregateQuery {
            since_ms: Some(1_796_463_600_000),
            minutes: Some(5),
        };
        let req = crate::Request::FlowAggregates(q.clone());
        let text = serde_json::to_string(&req).unwrap();
        assert_eq!(
            text,
            r#"{"op":"flow_aggregates","since_ms":1796463600000,"minutes":5}"#
        );
        assert_eq!(serde_json::from_str::<crate::Request>(&text).unwrap(), req);
        assert_eq!(
            serde_json::from_str::<AggregateQuery>("{}").unwrap(),
            AggregateQuery::default()
        );
        let reply = AggregateReply {
            node: "node1".into(),
            minutes: vec![AggregateMinute {
                minute: 1_796_463_600_000,
                overflow: 2,
                rows: vec![
                    AggregateRow {
                        direction: FlowDirection::Ingress,
                        verdict: FlowVerdict::Denied,
                        src: "a".into(),
                        dst: "b".into(),
                        proto: "tcp".into(),
                        port: Some(8080),
                        policy: Some("KubernetesNetworkPolicy/b/deny-all".into()),
                        count: 3,
                    },
                    AggregateRow {
                        direction: FlowDirection::Egress,
                        verdict: FlowVerdict::Allowed,
                        src: "a".into(),
                        dst: "outside".into(),
                        proto: "icmp".into(),
                        port: None,
                        policy: None,
                        count: 1,
                    },
                ],
            }],
            truncated: false,
        };
        let v = serde_json::to_value(crate::Reply::FlowAggregates(reply.clone())).unwrap();
        assert_eq!(v["kind"], "flow_aggregates");
        assert_eq!(v["minutes"][0]["minute"], "2026-12-05T09:40:00.000Z");
        assert_eq!(v["minutes"][0]["rows"][0]["verdict"], "denied");
        assert_eq!(v["minutes"][0]["rows"][0]["port"], 8080);
        assert!(v["minutes"][0]["rows"][1].get("port").is_none());
        assert!(v["minutes"][0]["rows"][1].get("policy").is_none());
        let back: crate::Reply = serde_json::from_value(v).unwrap();
        assert_eq!(back, crate::Reply::FlowAggregates(reply));
        let bad = r#"{"node":"n","minutes":[{"minute":"yesterday","overflow":0,"rows":[]}]}"#;
        let err = serde_json::from_str::<AggregateReply>(bad).unwrap_err();
        assert!(err.to_string().contains("bad time"), "{err}");
    }
}
