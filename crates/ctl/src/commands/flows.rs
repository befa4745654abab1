//! `ternctl flows`: the flow records of every node, from each node's agent socket (on a lab,
//! the sockets its state file lists; else the local agent's, or `--socket`), filtered here
//! and printed as a table (a denied line says who, to whom, which port, which policy, which
//! rule) or as JSON lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tern_api::flow::{FlowDirection, FlowEnd, FlowQuery, FlowRecord, FlowReply, FlowVerdict};
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
            && !r.policies.iter().any(|p| {
                let ns = p.namespace.as_deref().unwrap_or("");
                *want == p.name
                    || *want == format!("{ns}/{}", p.name)
                    || *want == format!("{}/{ns}/{}", p.kind, p.name)
                    || *want == format!("{}/{}", p.kind, p.name)
            })
        {
            return false;
        }
        true
    }
}

/// Asks one agent for its records, following `more` (bounded by [`MAX_PAGES`]).
pub fn fetch(socket: &Path, q: &FlowQuery) -> anyhow::Result<FlowReply> {
    let mut q = q.clone();
    let mut out: Option<FlowReply> = None;
    for _ in 0..MAX_PAGES {
        let reply = match tern_api::call(
            socket,
            &Request::Flows(q.clone()),
            None,
            Duration::from_secs(10),
        ) {
            Ok(Ok(Reply::Flows(r))) => r,
            Ok(Ok(other)) => anyhow::bail!("unexpected reply from ternd: {other:?}"),
            Ok(Err(e)) => anyhow::bail!("ternd at {}: {}", socket.display(), e.msg),
            Err(e) => anyhow::bail!("ternd at {}: {e}", socket.display()),
        };
        let more = reply.more && !reply.records.is_empty();
        let next = reply.records.last().map(|r| r.seq);
        match &mut out {
            None => out = Some(reply),
            Some(o) => {
                o.records.extend(reply.records);
                o.last_seq = reply.last_seq;
                o.dropped = reply.dropped;
                o.more = reply.more;
            }
        }
        // A follower's pages continue after the last record; a `last`/`since` query is
        // answered newest first and its one page is the answer.
        if !more || q.after_seq.is_none() {
            break;
        }
        q.after_seq = next;
    }
    out.ok_or_else(|| anyhow::anyhow!("no reply from {}", socket.display()))
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

impl Agent {
    /// The node's name.
    pub fn node(&self) -> &str {
        match self {
            Agent::Socket { node, .. } => node,
            Agent::Pod { pod, .. } => &pod.node,
        }
    }

    /// The node's records for `q`.
    pub fn fetch(&self, q: &FlowQuery) -> anyhow::Result<FlowReply> {
        match self {
            Agent::Socket { path, .. } => fetch(path, q),
            Agent::Pod { store, pod } => crate::commands::flows_kube::fetch(store, pod, q),
        }
    }
}

/// Records of every node, filtered, oldest first (by time, then node and sequence).
pub fn collect(agents: &[Agent], q: &FlowQuery, filter: &Filter) -> (Vec<FlowRecord>, Vec<String>) {
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for a in agents {
        match a.fetch(q) {
            Ok(r) => records.extend(r.records.into_iter().filter(|r| filter.matches(r))),
            Err(e) => errors.push(format!("node {}: {e:#}", a.node())),
        }
    }
    records.sort_by(|a, b| (a.time, &a.node, a.seq).cmp(&(b.time, &b.node, b.seq)));
    (records, errors)
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

/// Each node's cursor for `--follow`.
pub type Cursors = BTreeMap<String, u64>;

#[cfg(test)]
mod tests {
    use tern_api::flow::{EndKind, FlowPolicy, FlowReason};

    use super::*;

    fn end(ns: &str, pod: &str, ip: &str, port: Option<u16>, app: &str) -> FlowEnd {
        FlowEnd {
            ip: ip.into(),
            port,
            kind: EndKind::Pod,
            namespace: Some(ns.into()),
            pod: Some(pod.into()),
            labels: BTreeMap::from([("app".to_string(), app.to_string())]),
            node: None,
        }
    }

    fn denied() -> FlowRecord {
        FlowRecord {
            seq: 1,
            time: 1_796_463_601_123,
            node: "node2".into(),
            direction: FlowDirection::Ingress,
            proto: "tcp".into(),
            src: end("a", "client", "10.244.0.5", Some(40312), "client"),
            dst: end("b", "server", "10.244.1.7", Some(8080), "server"),
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
