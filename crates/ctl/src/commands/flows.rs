//! `ternctl flows`: the flow records of every node, from each node's agent socket (on a lab,
//! the sockets its state file lists; else the local agent's, or `--socket`), filtered here
//! and printed as a table (a denied line says who, to whom, which port, which policy, which
//! rule) or as JSON lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tern_api::flow::{
    AggregateQuery, AggregateReply, FlowDirection, FlowEnd, FlowQuery, FlowRecord, FlowReply,
    FlowVerdict,
};
use tern_api::{Reply, Request};
use tern_model::Selector;

/// How many pages of one node's records a query reads at most (each at most
/// `tern_api::MAX_FRAME`), so a node cannot keep a reader busy forever.
const MAX_PAGES: usize = 64;

/// The filters of `ternctl flows`; every one given must hold.
#[derive(Debug, Default)]
pub struct Filter {
    /// Either end in this namespace.
    pub namespace: Option<String>,
    /// Either end this pod (`NS/POD` or `POD`).
    pub pod: Option<String>,
    /// Either end's labels match.
    pub selector: Option<Selector>,
    pub verdict: Option<FlowVerdict>,
    pub direction: Option<FlowDirection>,
    /// The destination port.
    pub port: Option<u16>,
    /// A policy named in the record: `NAME`, `NS/NAME` or `Kind/NS/NAME`.
    pub policy: Option<String>,
}

/// Parses a label selector: tern's language (`app == 'a' && has(tier)`) or kubectl's
/// (`app=a,tier!=x,role,!debug`).
pub fn parse_selector(text: &str) -> anyhow::Result<Selector> {
    let tern_like = ["==", "(", "&&", "||", " in ", "'", "\""]
        .iter()
        .any(|t| text.contains(t));
    let tern = if tern_like {
        text.to_string()
    } else {
        let mut terms = Vec::new();
        for t in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let term = if let Some((k, v)) = t.split_once("!=") {
                format!("{} != '{}'", k.trim(), v.trim())
            } else if let Some((k, v)) = t.split_once('=') {
                format!("{} == '{}'", k.trim(), v.trim())
            } else if let Some(k) = t.strip_prefix('!') {
                format!("!has({})", k.trim())
            } else {
                format!("has({t})")
            };
            terms.push(term);
        }
        if terms.is_empty() {
            "all()".to_string()
        } else {
            terms.join(" && ")
        }
    };
    Selector::parse(&tern).map_err(|e| anyhow::anyhow!("--selector {text:?}: {e}"))
}

/// `5m`, `30s`, `2h`, `1d` (or a number of seconds).
pub fn parse_since(text: &str) -> anyhow::Result<Duration> {
    let t = text.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("--since {text:?}: expected a duration like 30s, 5m, 2h"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("--since {text:?}: unknown unit {unit:?} (s, m, h or d)"),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

fn end_matches_pod(e: &FlowEnd, pod: &str) -> bool {
    match pod.split_once('/') {
        Some((ns, p)) => e.namespace.as_deref() == Some(ns) && e.pod.as_deref() == Some(p),
        None => e.pod.as_deref() == Some(pod),
    }
}

/// Whether `--policy WANT` names the policy `kind` `namespace`/`name`: as `NAME`, `NS/NAME`,
/// `KIND/NS/NAME` or (a global one) `KIND/NAME`.
pub fn policy_matches(want: &str, kind: &str, namespace: Option<&str>, name: &str) -> bool {
    let ns = namespace.unwrap_or("");
    want == name
        || want == format!("{ns}/{name}")
        || want == format!("{kind}/{ns}/{name}")
        || want == format!("{kind}/{name}")
}

impl Filter {
    /// Whether `r` passes every filter given.
    pub fn matches(&self, r: &FlowRecord) -> bool {
        let ends = [&r.src, &r.dst];
        if let Some(ns) = &self.namespace
            && !ends.iter().any(|e| e.namespace.as_deref() == Some(ns))
        {
            return false;
        }
        if let Some(p) = &self.pod
            && !ends.iter().any(|e| end_matches_pod(e, p))
        {
            return false;
        }
        if let Some(s) = &self.selector
            && !ends
                .iter()
                .any(|e| e.kind == tern_api::flow::EndKind::Pod && s.matches(&e.labels))
        {
            return false;
        }
        if self.verdict.is_some_and(|v| v != r.verdict)
            || self.direction.is_some_and(|d| d != r.direction)
            || self.port.is_some_and(|p| r.dst.port != Some(p))
        {
            return false;
        }
        if let Some(want) = &self.policy
            && !r
                .policies
                .iter()
                .any(|p| policy_matches(want, &p.kind, p.namespace.as_deref(), &p.name))
        {
            return false;
        }
        true
    }
}

/// One request to the agent at `socket`, and its reply (an error reply as an error).
pub fn call(socket: &Path, req: &Request) -> anyhow::Result<Reply> {
    match tern_api::call(socket, req, None, Duration::from_secs(10)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => anyhow::bail!("ternd at {}: {}", socket.display(), e.msg),
        Err(e) => anyhow::bail!("ternd at {}: {e}", socket.display()),
    }
}

/// One page of the records of the agent at `socket` for `q`.
pub fn page(socket: &Path, q: &FlowQuery) -> anyhow::Result<FlowReply> {
    match call(socket, &Request::Flows(q.clone()))? {
        Reply::Flows(r) => Ok(r),
        other => anyhow::bail!("unexpected reply from ternd: {other:?}"),
    }
}

/// Asks the agent at `socket` for its records, following `more` as a [`Follower`] does.
pub fn fetch(socket: &Path, q: &FlowQuery) -> anyhow::Result<FlowReply> {
    let mut last = FlowReply::default();
    let records = Follower::new(q.clone()).poll_node("agent", &mut |q| {
        let r = page(socket, q)?;
        last.node.clone_from(&r.node);
        (last.last_seq, last.dropped, last.more) = (r.last_seq, r.dropped, r.more);
        Ok(r)
    })?;
    Ok(FlowReply { records, ..last })
}

/// One node's agent, as ternctl reaches it: its socket (on the node, on a lab), or its pod
/// through the API server (a Kubernetes cluster: [`crate::commands::flows_kube`]).
pub enum Agent {
    Socket {
        node: String,
        path: PathBuf,
    },
    Pod {
        store: tern_store::kube::KubeStore,
        pod: tern_store::kube::AgentPod,
    },
}

/// A node's agent as a [`Follower`] asks it: one page of records per call.
pub trait Pages {
    /// The node's name (the follower's key for its cursor).
    fn node(&self) -> &str;
    /// One page of the node's records for `q`.
    fn page(&self, q: &FlowQuery) -> anyhow::Result<FlowReply>;
}

impl Agent {
    /// The node's name.
    pub fn node(&self) -> &str {
        match self {
            Agent::Socket { node, .. } => node,
            Agent::Pod { pod, .. } => &pod.node,
        }
    }

    /// One request to the node's agent (a flows request: through the API server, the pod
    /// answers no other).
    pub fn call(&self, req: &Request) -> anyhow::Result<Reply> {
        match self {
            Agent::Socket { path, .. } => call(path, req),
            Agent::Pod { store, pod } => crate::commands::flows_kube::call(store, pod, req),
        }
    }

    /// The node's per-minute aggregates for `q`.
    pub fn aggregates(&self, q: &AggregateQuery) -> anyhow::Result<AggregateReply> {
        match self.call(&Request::FlowAggregates(q.clone()))? {
            Reply::FlowAggregates(r) => Ok(r),
            other => anyhow::bail!("unexpected reply from node {}: {other:?}", self.node()),
        }
    }
}

impl Pages for Agent {
    fn node(&self) -> &str {
        Agent::node(self)
    }

    fn page(&self, q: &FlowQuery) -> anyhow::Result<FlowReply> {
        match self.call(&Request::Flows(q.clone()))? {
            Reply::Flows(r) => Ok(r),
            other => anyhow::bail!("unexpected reply from node {}: {other:?}", self.node()),
        }
    }
}

/// What one round of a [`Follower`] over every node gave.
#[derive(Debug, Default)]
pub struct Polled {
    /// The new records of every node, oldest first (by time, then node and sequence).
    pub records: Vec<FlowRecord>,
    /// Records the nodes that answered did not keep (sampling, kernel losses), summed.
    pub dropped: u64,
    /// The nodes that did not answer, with the error.
    pub errors: Vec<String>,
}

/// Follows the records of every node: a cursor per node (each node numbers its own records),
/// the pages of a reply that says `more` (at most [`MAX_PAGES`] a round), and no record given
/// twice. A node's first round asks the `first` query (`since`, `last`); later rounds ask for
/// what came after the node's cursor. When a node's sequence goes back (its agent restarted
/// with an empty ring), the follower starts that node over from its first record.
#[derive(Debug, Default)]
pub struct Follower {
    first: FlowQuery,
    cursors: BTreeMap<String, u64>,
}

impl Follower {
    pub fn new(first: FlowQuery) -> Follower {
        Follower {
            first,
            cursors: BTreeMap::new(),
        }
    }

    /// The last sequence number taken from `node`, once it answered.
    pub fn cursor(&self, node: &str) -> Option<u64> {
        self.cursors.get(node).copied()
    }

    /// The new records of one node, oldest first: asks `page` (the node's first query, or
    /// after its cursor), following `more`. An error on the first page is the result; on a
    /// later one the records so far are (the next round goes on from them).
    pub fn poll_node(
        &mut self,
        node: &str,
        page: &mut dyn FnMut(&FlowQuery) -> anyhow::Result<FlowReply>,
    ) -> anyhow::Result<Vec<FlowRecord>> {
        let since_ms = self.first.since_ms;
        let after = |seq| FlowQuery {
            after_seq: Some(seq),
            since_ms,
            last: None,
        };
        let mut q = match self.cursors.get(node) {
            Some(c) => after(*c),
            None => self.first.clone(),
        };
        let mut out: Vec<FlowRecord> = Vec::new();
        let mut restarted = false;
        for i in 0..MAX_PAGES {
            let reply = match page(&q) {
                Ok(r) => r,
                Err(e) if i == 0 => return Err(e),
                Err(_) => break,
            };
            let cursor = self.cursors.get(node).copied();
            if let Some(c) = cursor
                && reply.last_seq < c
                && !restarted
            {
                // The agent numbers from 1 again: all it has is new.
                restarted = true;
                self.cursors.remove(node);
                q = after(0);
                continue;
            }
            let seen = cursor.unwrap_or(0);
            let newest = reply.records.iter().map(|r| r.seq).max().unwrap_or(0);
            // Pages continue after the last record of a follower's query; any other query is
            // answered newest first, and its one page is the answer.
            let paging = q.after_seq.is_some() && reply.more && !reply.records.is_empty();
            let next = if paging {
                seen.max(newest)
            } else {
                seen.max(newest).max(reply.last_seq)
            };
            self.cursors.insert(node.to_string(), next);
            out.extend(
                reply
                    .records
                    .into_iter()
                    .filter(|r| cursor.is_none_or(|c| r.seq > c)),
            );
            if !paging {
                break;
            }
            q = after(next);
        }
        Ok(out)
    }

    /// One round over every node: what is new at each, oldest first.
    pub fn poll<P: Pages>(&mut self, nodes: &[P]) -> Polled {
        let mut p = Polled::default();
        for n in nodes {
            let mut dropped = 0;
            let got = self.poll_node(n.node(), &mut |q| {
                let r = n.page(q)?;
                dropped = r.dropped;
                Ok(r)
            });
            match got {
                Ok(records) => {
                    p.records.extend(records);
                    p.dropped += dropped;
                }
                Err(e) => p.errors.push(format!("node {}: {e:#}", n.node())),
            }
        }
        p.records
            .sort_by(|a, b| (a.time, &a.node, a.seq).cmp(&(b.time, &b.node, b.seq)));
        p
    }
}

fn end_text(e: &FlowEnd) -> String {
    match (&e.namespace, &e.pod, &e.node) {
        (Some(ns), Some(p), _) => format!("{ns}/{p}"),
        (_, _, Some(n)) => format!("host:{n}({})", e.ip),
        _ => e.ip.clone(),
    }
}

/// `HH:MM:SS.mmm` (UTC) of a record's time.
fn clock(ms: u64) -> String {
    let t = tern_api::flow::format_time(ms);
    t.split_once('T')
        .map(|(_, c)| c.trim_end_matches('Z').to_string())
        .unwrap_or(t)
}

/// One table line: `TIME NODE DIRECTION VERDICT PROTO SRC -> DST:PORT CAUSE`.
pub fn render_line(r: &FlowRecord) -> String {
    let port = r.dst.port.map(|p| format!(":{p}")).unwrap_or_default();
    let cause = match r.reason {
        tern_api::flow::FlowReason::NoPolicy => "no policy".to_string(),
        tern_api::flow::FlowReason::DefaultDeny => {
            let names: Vec<String> = r.policies.iter().map(policy_text).collect();
            format!("default deny of {}", names.join(", "))
        }
        tern_api::flow::FlowReason::Rule => match r.policies.first() {
            Some(p) => format!(
                "{} {}",
                policy_text(p),
                p.rule.as_deref().unwrap_or("(rule unknown)")
            ),
            None => "rule (unnamed)".to_string(),
        },
    };
    format!(
        "{}  {:<8} {:<7} {:<7} {:<6} {} -> {}{port}  {cause}",
        clock(r.time),
        r.node,
        r.direction.as_str(),
        r.verdict.as_str().to_uppercase(),
        r.proto,
        end_text(&r.src),
        end_text(&r.dst),
    )
}

fn policy_text(p: &tern_api::flow::FlowPolicy) -> String {
    match &p.namespace {
        Some(ns) => format!("{} {ns}/{}", p.kind, p.name),
        None => format!("{} {}", p.kind, p.name),
    }
}

/// Milliseconds since the epoch now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The agents to ask: the sockets given; else, with a Kubernetes datastore (`--store
/// kubernetes[://KUBECONFIG]`), every tern-node pod through the API server; else every node of
/// the lab `lab` when it exists; else the local agent.
pub fn agents(given: &[PathBuf], lab: &str, store: Option<&str>) -> anyhow::Result<Vec<Agent>> {
    if !given.is_empty() {
        return Ok(given
            .iter()
            .map(|p| Agent::Socket {
                node: p.display().to_string(),
                path: p.clone(),
            })
            .collect());
    }
    if let Some(opened) = store.and_then(tern_store::kube::KubeStore::open_url) {
        let store = opened.map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok(crate::commands::flows_kube::agents(&store)?
            .into_iter()
            .map(|pod| Agent::Pod {
                store: store.clone(),
                pod,
            })
            .collect());
    }
    if let Some(state) = tern_lab::state::LabState::load(lab)? {
        return Ok(state
            .nodes
            .iter()
            .map(|n| Agent::Socket {
                node: n.name.clone(),
                path: n.socket.clone(),
            })
            .collect());
    }
    Ok(vec![Agent::Socket {
        node: "local".into(),
        path: PathBuf::from(tern_api::DEFAULT_SOCKET),
    }])
}

/// Keeps the last `n` of `records`.
pub fn last(mut records: Vec<FlowRecord>, n: Option<usize>) -> Vec<FlowRecord> {
    if let Some(n) = n
        && records.len() > n
    {
        records.drain(..records.len() - n);
    }
    records
}

/// `ternctl flows --agent-reply TEXT` inside a tern-node pod: asks the agent at `socket` and
/// returns the JSON to print. TEXT is a flows request (`{"op":"flows",...}` or
/// `{"op":"flow_aggregates",...}`), answered with the agent's reply; any other request is
/// refused, so this exec path reads records and nothing else. A bare flow query (what ternctl
/// sent before aggregates) is answered with the bare flow reply, every page of it.
pub fn agent_reply(socket: &std::path::Path, text: &str) -> anyhow::Result<String> {
    let v: serde_json::Value = serde_json::from_str(text).context("--agent-reply: not JSON")?;
    if v.get("op").is_none() {
        let q: FlowQuery = serde_json::from_value(v).context("--agent-reply: a flow query")?;
        return Ok(serde_json::to_string(&fetch(socket, &q)?)?);
    }
    let req: Request = serde_json::from_value(v).context("--agent-reply: a request")?;
    anyhow::ensure!(
        matches!(req, Request::Flows(_) | Request::FlowAggregates(_)),
        "--agent-reply answers flows requests only"
    );
    Ok(serde_json::to_string(&call(socket, &req)?)?)
}

#[cfg(test)]
mod agent_reply_tests {
    use super::*;

    /// Through a pod's exec only flows requests pass: anything else is refused before any
    /// socket is touched, and what is not JSON says so.
    #[test]
    fn agent_reply_answers_flows_requests_only() {
        let nowhere = std::path::Path::new("/nonexistent/ternd.sock");
        for other in [r#"{"op":"status"}"#, r#"{"op":"bgp_status"}"#] {
            let e = agent_reply(nowhere, other).unwrap_err().to_string();
            assert!(e.contains("flows requests only"), "{other}: {e}");
        }
        let e = agent_reply(nowhere, "{").unwrap_err().to_string();
        assert!(e.contains("not JSON"), "{e}");
        let e = agent_reply(nowhere, r#"{"op":"flows","last":"x"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a request"), "{e}");
        // A flows request goes to the socket (here: none).
        for ok in [r#"{"op":"flow_aggregates","minutes":1}"#, r#"{"last":1}"#] {
            let e = format!("{:#}", agent_reply(nowhere, ok).unwrap_err());
            assert!(e.contains("/nonexistent/ternd.sock"), "{ok}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use tern_api::flow::FlowReason;

    use super::*;

    fn denied() -> FlowRecord {
        FlowRecord::sample()
    }

    /// A node's agent as the follower sees it: a ring numbered from 1 (from `base` after a
    /// restart), answering a follower's query oldest first in pages of `page` records with
    /// `more`, any other query with the newest.
    struct FakeNode {
        name: &'static str,
        ring: std::cell::RefCell<Vec<FlowRecord>>,
        page: usize,
        asked: std::cell::RefCell<Vec<FlowQuery>>,
        fail: std::cell::Cell<bool>,
    }

    impl FakeNode {
        fn new(name: &'static str, page: usize) -> FakeNode {
            FakeNode {
                name,
                ring: Default::default(),
                page,
                asked: Default::default(),
                fail: Default::default(),
            }
        }

        fn add(&self, n: usize) {
            let mut ring = self.ring.borrow_mut();
            for _ in 0..n {
                let mut r = FlowRecord::sample();
                r.node = self.name.into();
                r.seq = ring.last().map_or(1, |l| l.seq + 1);
                r.time += r.seq;
                ring.push(r);
            }
        }

        fn seqs(records: &[FlowRecord], node: &str) -> Vec<u64> {
            records
                .iter()
                .filter(|r| r.node == node)
                .map(|r| r.seq)
                .collect()
        }
    }

    impl Pages for FakeNode {
        fn node(&self) -> &str {
            self.name
        }

        fn page(&self, q: &FlowQuery) -> anyhow::Result<FlowReply> {
            self.asked.borrow_mut().push(q.clone());
            anyhow::ensure!(!self.fail.get(), "{} is down", self.name);
            let ring = self.ring.borrow();
            let matching: Vec<&FlowRecord> = ring
                .iter()
                .filter(|r| q.after_seq.is_none_or(|s| r.seq > s))
                .collect();
            let from = q.last.map_or(0, |n| matching.len().saturating_sub(n));
            let matching = &matching[from..];
            let take = matching.len().min(self.page);
            let records: Vec<FlowRecord> = if q.after_seq.is_some() {
                matching[..take].iter().map(|r| (*r).clone()).collect()
            } else {
                matching[matching.len() - take..]
                    .iter()
                    .map(|r| (*r).clone())
                    .collect()
            };
            Ok(FlowReply {
                node: self.name.into(),
                more: take < matching.len(),
                records,
                last_seq: ring.last().map_or(0, |r| r.seq),
                dropped: 7,
            })
        }
    }

    /// Per-node cursors: each node's first round is the first query, then only what is new
    /// at that node; `more` is followed page by page; nothing comes twice.
    #[test]
    fn the_follower_keeps_a_cursor_per_node_and_follows_pages() {
        let (n1, n2) = (FakeNode::new("n1", 3), FakeNode::new("n2", 3));
        n1.add(2);
        n2.add(5);
        let nodes = [n1, n2];
        let mut f = Follower::new(FlowQuery {
            last: Some(4),
            ..FlowQuery::default()
        });
        let p = f.poll(&nodes);
        // The first query is answered newest first, one page: n2's 3 newest.
        assert_eq!(FakeNode::seqs(&p.records, "n1"), vec![1, 2]);
        assert_eq!(FakeNode::seqs(&p.records, "n2"), vec![3, 4, 5]);
        assert_eq!((f.cursor("n1"), f.cursor("n2")), (Some(2), Some(5)));
        assert_eq!(p.dropped, 14);
        assert!(p.errors.is_empty());
        let times: Vec<u64> = p.records.iter().map(|r| r.time).collect();
        assert!(times.is_sorted(), "oldest first: {times:?}");

        assert!(
            f.poll(&nodes).records.is_empty(),
            "nothing new, nothing again"
        );
        nodes[0].add(8);
        let before = nodes[0].asked.borrow().len();
        let p = f.poll(&nodes);
        assert_eq!(
            FakeNode::seqs(&p.records, "n1"),
            (3..=10).collect::<Vec<_>>()
        );
        let asked: Vec<Option<u64>> = nodes[0].asked.borrow()[before..]
            .iter()
            .map(|q| q.after_seq)
            .collect();
        assert_eq!(asked, vec![Some(2), Some(5), Some(8)], "three pages of 3");
        assert_eq!(f.cursor("n1"), Some(10));
        assert_eq!(f.cursor("n2"), Some(5));
    }

    /// A node that fails is reported and keeps its cursor; a restarted agent (its sequence
    /// back under the cursor) is read from its first record again.
    #[test]
    fn the_follower_survives_a_failing_and_a_restarted_node() {
        let nodes = [FakeNode::new("n1", 100)];
        nodes[0].add(3);
        let mut f = Follower::new(FlowQuery::default());
        assert_eq!(f.poll(&nodes).records.len(), 3);
        nodes[0].fail.set(true);
        let p = f.poll(&nodes);
        assert_eq!(p.errors, vec!["node n1: n1 is down".to_string()]);
        assert_eq!(f.cursor("n1"), Some(3));
        nodes[0].fail.set(false);
        nodes[0].ring.borrow_mut().clear();
        nodes[0].add(2);
        let p = f.poll(&nodes);
        assert_eq!(FakeNode::seqs(&p.records, "n1"), vec![1, 2]);
        assert_eq!(f.cursor("n1"), Some(2));
        nodes[0].add(1);
        assert_eq!(FakeNode::seqs(&f.poll(&nodes).records, "n1"), vec![3]);
    }

    /// Duplicates in a reply (a node answering again from before the cursor) are dropped.
    #[test]
    fn the_follower_gives_no_record_twice() {
        let mut f = Follower::new(FlowQuery::default());
        let mut r = FlowRecord::sample();
        let mut reply = |seqs: &[u64], last_seq| FlowReply {
            node: "n".into(),
            records: seqs
                .iter()
                .map(|s| {
                    r.seq = *s;
                    r.clone()
                })
                .collect(),
            last_seq,
            dropped: 0,
            more: false,
        };
        let first = reply(&[1, 2, 3], 3);
        let again = reply(&[2, 3, 4], 4);
        let got = f.poll_node("n", &mut |_| Ok(first.clone())).unwrap();
        assert_eq!(got.len(), 3);
        let got = f.poll_node("n", &mut |_| Ok(again.clone())).unwrap();
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
        assert_eq!(f.cursor("n"), Some(4));
    }

    #[test]
    fn a_denied_line_reads_in_one_glance() {
        assert_eq!(
            render_line(&denied()),
            "09:40:01.123  node2    ingress DENIED  tcp    a/client -> b/server:8080  default deny of KubernetesNetworkPolicy b/deny-all"
        );
        let mut allowed = denied();
        allowed.verdict = FlowVerdict::Allowed;
        allowed.reason = FlowReason::Rule;
        allowed.policies[0].rule = Some("ingress[0]".into());
        assert!(
            render_line(&allowed)
                .ends_with("ALLOWED tcp    a/client -> b/server:8080  KubernetesNetworkPolicy b/deny-all ingress[0]"),
            "{}",
            render_line(&allowed)
        );
    }

    #[test]
    fn filters_hold_on_either_end() {
        let r = denied();
        let f = |f: Filter| f.matches(&r);
        assert!(f(Filter::default()));
        assert!(f(Filter {
            namespace: Some("a".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            namespace: Some("c".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            pod: Some("b/server".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            pod: Some("a/server".into()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            selector: Some(parse_selector("app=client").unwrap()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            selector: Some(parse_selector("app == 'x'").unwrap()),
            ..Filter::default()
        }));
        assert!(f(Filter {
            verdict: Some(FlowVerdict::Denied),
            direction: Some(FlowDirection::Ingress),
            port: Some(8080),
            policy: Some("b/deny-all".into()),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            port: Some(80),
            ..Filter::default()
        }));
        assert!(!f(Filter {
            policy: Some("other".into()),
            ..Filter::default()
        }));
    }

    #[test]
    fn durations_and_selectors_parse_or_name_the_problem() {
        assert_eq!(parse_since("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_since("90").unwrap(), Duration::from_secs(90));
        assert!(parse_since("5x").unwrap_err().to_string().contains("5x"));
        assert!(parse_since("m").is_err());
        let s = parse_selector("app=a,tier!=x,role,!debug").unwrap();
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(s.matches(&l(&[("app", "a"), ("role", "r")])));
        assert!(!s.matches(&l(&[("app", "a"), ("role", "r"), ("debug", "1")])));
        assert!(
            parse_selector("app == ")
                .unwrap_err()
                .to_string()
                .contains("--selector")
        );
        assert_eq!(last(vec![denied(); 5], Some(2)).len(), 2);
    }
}
