//! Flow records (issue 21) against what the probes saw and what the independent evaluator
//! (`PolicySet::explain`) says, for the NetworkPolicy labs: `netpol.rs` (the agents' sockets)
//! and `lab_kube_netpol.rs` (the `tern-node` pods through the API server). How the records
//! are read and how a cell is probed again is each lab's; what a probe's last connection must
//! have on record is here.
//!
//! A probed cell's last connection: its newest egress record (at the client's node) by
//! source and destination address, protocol and destination port, and — when egress let it
//! through — the newest ingress record of the same (at the server's node), not older than the
//! egress one by more than a second. Each must carry the verdict and the cause (reason and
//! policies, with the deciding rule) explain gives its direction, and together the verdict the
//! probe saw.

use std::collections::HashMap;
use std::net::IpAddr;

use tern_api::flow::{EndKind, FlowDirection, FlowPolicy, FlowRecord, FlowVerdict};
use tern_policy::{DirectionExplanation, Explanation};

/// Policies as `kind/namespace/name rule`, sorted: how a cause's policies are compared.
pub fn policy_names(policies: &[FlowPolicy]) -> Vec<String> {
    let mut ps: Vec<String> = policies
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{} {}",
                p.kind,
                p.namespace.as_deref().unwrap_or(""),
                p.name,
                p.rule.as_deref().unwrap_or("")
            )
        })
        .collect();
    ps.sort();
    ps
}

/// A record's cause: its reason and its policies ([`policy_names`]).
pub fn record_cause(r: &FlowRecord) -> (String, Vec<String>) {
    (r.reason.as_str().to_string(), policy_names(&r.policies))
}

/// Agent arguments for a lab whose every probe's records are checked: no sampling, and a
/// ring with room for a step's rounds.
pub fn recording_agent_args() -> Vec<String> {
    ["--flow-ring", "200000", "--flow-rate", "1000000"]
        .map(String::from)
        .to_vec()
}

/// An explained direction's cause ([`DirectionExplanation::flow_cause`]), written as
/// [`record_cause`] writes a record's.
pub fn explained_cause(d: &DirectionExplanation) -> (String, Vec<String>) {
    let c = d.flow_cause();
    (c.reason.as_str().to_string(), policy_names(&c.policies))
}

type Key = (FlowDirection, IpAddr, IpAddr, String, Option<u16>);

/// The newest record of each direction, addresses, protocol and destination port, over the
/// records of every node read.
#[derive(Default)]
pub struct Latest(HashMap<Key, FlowRecord>);

impl Latest {
    /// Adds one node's records (those whose addresses do not parse are no probe's).
    pub fn add(&mut self, records: impl IntoIterator<Item = FlowRecord>) {
        for r in records {
            let (Ok(src), Ok(dst)) = (r.src.ip.parse(), r.dst.ip.parse()) else {
                continue;
            };
            let k = (r.direction, src, dst, r.proto.clone(), r.dst.port);
            if self
                .0
                .get(&k)
                .is_none_or(|o| (o.time, o.seq) < (r.time, r.seq))
            {
                self.0.insert(k, r);
            }
        }
    }

    /// The newest record of direction `d` from `src` to `dst`:`port` over `proto` (`tcp`,
    /// `udp` or `sctp`).
    pub fn newest(
        &self,
        d: FlowDirection,
        src: IpAddr,
        dst: IpAddr,
        proto: &str,
        port: u16,
    ) -> Option<&FlowRecord> {
        self.0.get(&(d, src, dst, proto.to_string(), Some(port)))
    }

    fn get(&self, d: FlowDirection, c: &Probed) -> Option<&FlowRecord> {
        self.newest(d, c.src, c.dst, c.proto, c.port)
    }
}

/// One probed pod-to-pod cell.
pub struct Probed<'a> {
    /// How a problem names it (`tcp/80 x/a -> y/b`).
    pub what: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// `tcp`, `udp` or `sctp`, as records write it.
    pub proto: &'a str,
    pub port: u16,
    /// Whether the probe got through.
    pub saw: bool,
    /// explain's answer for the cell.
    pub explained: &'a Explanation,
}

/// The problems of `c`'s last connection on record (empty: it agrees with the probe and with
/// explain), one line each; `checked` counts the records compared.
pub fn cell_problems(latest: &Latest, c: &Probed, checked: &mut u64) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(eg) = latest.get(FlowDirection::Egress, c) else {
        return vec![format!("  {}: no egress record", c.what)];
    };
    let mut compare = |r: &FlowRecord, d: &DirectionExplanation| {
        *checked += 1;
        if (r.verdict == FlowVerdict::Allowed) != d.verdict.is_allowed()
            || record_cause(r) != explained_cause(d)
        {
            problems.push(format!(
                "  {}: {} record {} {:?}, explain {} {:?}",
                c.what,
                r.direction.as_str(),
                r.verdict.as_str(),
                record_cause(r),
                d.verdict.as_str(),
                explained_cause(d)
            ));
        }
    };
    compare(eg, &c.explained.egress);
    let mut allowed = eg.verdict == FlowVerdict::Allowed;
    if allowed {
        match latest.get(FlowDirection::Ingress, c) {
            Some(ig) if ig.time + 1000 >= eg.time => {
                allowed = ig.verdict == FlowVerdict::Allowed;
                compare(ig, &c.explained.ingress);
            }
            _ => problems.push(format!("  {}: egress allowed, no ingress record", c.what)),
        }
    }
    if allowed != c.saw {
        problems.push(format!(
            "  {}: records say {}, the probe saw {}",
            c.what,
            verdict(allowed),
            verdict(c.saw)
        ));
    }
    problems
}

fn verdict(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "denied" }
}

/// One connection whose ends must be named on record: the newest record of `direction` to
/// `dst`:`port` over `proto` (from `src` when given: a host's source address is the
/// kernel's choice), read from records since the connection was made.
pub struct Named<'a> {
    pub what: &'a str,
    pub direction: FlowDirection,
    pub src: Option<IpAddr>,
    pub dst: IpAddr,
    pub proto: &'a str,
    pub port: u16,
}

impl Named<'_> {
    /// The connection's newest record among `records`, or what is missing.
    pub fn find<'r>(&self, records: &'r [FlowRecord]) -> Result<&'r FlowRecord, String> {
        records
            .iter()
            .filter(|r| {
                r.direction == self.direction
                    && r.proto == self.proto
                    && r.dst.port == Some(self.port)
                    && r.dst.ip.parse::<IpAddr>() == Ok(self.dst)
                    && self.src.is_none_or(|s| r.src.ip.parse::<IpAddr>() == Ok(s))
            })
            .max_by_key(|r| (r.time, r.seq))
            .ok_or_else(|| {
                format!(
                    "{}: no {} record to {}:{} over {} among {} read",
                    self.what,
                    self.direction.as_str(),
                    self.dst,
                    self.port,
                    self.proto,
                    records.len()
                )
            })
    }
}

/// A host-to-pod connection's record names its source as node `node`'s host; a
/// pod-to-outside connection's names its destination as outside. A line for each or the
/// problem.
pub fn host_and_outside(
    records: &[FlowRecord],
    host: (&Named, &str),
    outside: &Named,
) -> Result<String, String> {
    let (h, node) = host;
    let hr = h.find(records)?;
    if hr.src.kind != EndKind::Host || hr.src.node.as_deref() != Some(node) {
        return Err(format!(
            "{}: the source of {hr:?} is not named as the host of {node}",
            h.what
        ));
    }
    let or = outside.find(records)?;
    if or.dst.kind != EndKind::Outside || or.dst.node.is_some() || or.dst.pod.is_some() {
        return Err(format!(
            "{}: the destination of {or:?} is not named as outside",
            outside.what
        ));
    }
    Ok(format!(
        "{}: {} {} record, source host:{node} ({}); {}: {} {} record at {}, destination outside ({})",
        h.what,
        hr.direction.as_str(),
        hr.verdict.as_str(),
        hr.src.ip,
        outside.what,
        or.direction.as_str(),
        or.verdict.as_str(),
        or.node,
        or.dst.ip
    ))
}
