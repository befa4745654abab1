//! Flow records: every new connection to or from a pod of this node, per direction, with its
//! verdict and its cause (issue 21), kept in a bounded ring and served on the agent socket
//! (`Request::Flows`, `ternctl flows`), with per-minute aggregates of them
//! (`Request::FlowAggregates`, `ternctl flows --aggregate`).
//!
//! ```text
//!  kernel: policy rules ── log group G, tag prefix ──► NFLOG (tern_linux::nflog)
//!                                                         │ one thread ("flows"): recv (500 ms)
//!                                                         ▼
//!   tag parse ─► rate budget (sampled out: counted) ─► resolution cache (model generation,
//!   no lock) ─► misses: resolve (one model lock per batch, FlowModel: PolicySet::explain)
//!   ─► + time, ports, host ends ─► ring + per-minute aggregates + counts
//!                                                         ▲
//!   socket request Flows(FlowQuery) ── Flows::query ──────┘         /metrics ◄── render_metrics
//!   socket request FlowAggregates(AggregateQuery) ── Flows::aggregate_reply (the minutes)
//! ```
//!
//! The policy model's lock is the one pod ADD and every policy change take, so the reader
//! takes it as little as it can: what the model says of an event (its cause, its ends as
//! pods) is cached ([`cache`]) by tag, addresses, protocol and destination port (not the
//! source port, which no rule reads), for one model generation ([`FlowModel::generation`], read
//! without the lock; any change of the model moves it and empties the cache). A batch whose
//! events all hit takes no model lock at all; one with misses takes it once, as before. Hits
//! and misses are counted (`tern_flow_resolve_cache_{hits,misses}_total`).
//!
//! Memory is bounded whatever the flood: the ring ([`FlowsConfig::ring`] records), the
//! aggregates (minutes x keys, the rest counted as overflow), denies per policy (1,000 names,
//! the rest `other`), and the rate budget ([`FlowsConfig::rate`] records a second, the rest
//! counted as sampled out before any resolution work). The kernel side drops, and counts,
//! what the reader does not take in time ([`tern_linux::nflog`]).
//!
//! The policy model belongs to the policy service; this service asks it through
//! [`FlowModel`], which the root implements (`agent.rs`).

pub mod aggregate;
pub mod cache;
pub mod resolve;
pub mod ring;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tern_api::flow::{
    AggregateQuery, AggregateReply, FlowDirection, FlowPolicy, FlowQuery, FlowReason, FlowReply,
};
use tern_linux::nflog::{NflogBatch, NflogConfig, NflogEvent, NflogSocket, PacketHeaders};
use tern_policy::PolicySet;
use tern_policy::flowtag::FlowTag;

use crate::config::FlowsConfig;
use crate::metrics::exposition::Page;
use aggregate::{Aggregates, Budget, Counts};
use cache::{CACHE_ENTRIES, Cache, Key};
use resolve::{Hosts, Resolved, complete, resolve_cause};
use ring::Ring;

/// What resolving needs from the rest of the agent.
pub trait FlowModel: Send + Sync {
    /// Runs `f` over the policy model as it is now (once per batch of events with a cache
    /// miss).
    fn with_policy_set(&self, f: &mut dyn FnMut(&PolicySet));
    /// The model's generation now, read without its lock: the [`PolicySet::revision`] of the
    /// set [`FlowModel::with_policy_set`] would show (so it moves with every change of the
    /// model). Resolutions cached at one generation are used while it does not move.
    fn generation(&self) -> u64;
    /// The cluster's node addresses (underlay and tunnel) and their nodes' names.
    fn hosts(&self) -> Hosts;
}

/// How often the node addresses are read again.
const HOSTS_REFRESH: Duration = Duration::from_secs(30);
/// How long the reader waits before binding the group again after a failure.
const REBIND_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Stats {
    /// Events of ours seen (before sampling).
    events: AtomicU64,
    sampled: AtomicU64,
    /// Lost by the kernel (sequence gaps).
    lost: AtomicU64,
    overruns: AtomicU64,
    malformed: AtomicU64,
    /// Events whose prefix is not a flow tag (another user of the group).
    foreign: AtomicU64,
    disagreements: AtomicU64,
    /// Events resolved from the cache, and by the model.
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

struct State {
    ring: Ring,
    aggregates: Aggregates,
    counts: Counts,
    budget: Budget,
    /// The policies last named for a default deny at each (pod address, direction): an event
    /// resolved just after its policies left the model (the kernel still enforced them when
    /// the packet came) names these rather than none. At most [`MAX_REMEMBERED`] entries.
    selecting: HashMap<(IpAddr, FlowDirection), Vec<FlowPolicy>>,
}

/// Bound of [`State::selecting`] (cleared when full).
const MAX_REMEMBERED: usize = 4096;

/// The flow-record service of this node.
pub struct Flows {
    cfg: FlowsConfig,
    node: String,
    state: Mutex<State>,
    /// Used by the reader only (never held with `state`).
    cache: Mutex<Cache>,
    stats: Stats,
}

fn ms_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Flows {
    pub fn new(node: &str, cfg: FlowsConfig) -> Flows {
        Flows {
            cfg,
            node: node.to_string(),
            state: Mutex::new(State {
                ring: Ring::new(cfg.ring),
                aggregates: Aggregates::new(cfg.minutes, cfg.keys_per_minute),
                counts: Counts::default(),
                budget: Budget::new(cfg.rate),
                selecting: HashMap::new(),
            }),
            cache: Mutex::new(Cache::new(CACHE_ENTRIES)),
            stats: Stats::default(),
        }
    }

    /// The configuration (the NFLOG group the policy table logs to).
    pub fn config(&self) -> FlowsConfig {
        self.cfg
    }

    /// Records dropped so far: sampled out, or lost by the kernel.
    pub fn dropped(&self) -> u64 {
        self.stats.sampled.load(Ordering::Relaxed) + self.stats.lost.load(Ordering::Relaxed)
    }

    /// Records the model disagreed with the kernel on.
    pub fn disagreements(&self) -> u64 {
        self.stats.disagreements.load(Ordering::Relaxed)
    }

    /// Records in the ring now.
    pub fn len(&self) -> usize {
        self.state.lock().unwrap().ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The answer to a query.
    pub fn query(&self, q: &FlowQuery) -> FlowReply {
        let st = self.state.lock().unwrap();
        let sel = st.ring.select(q);
        FlowReply {
            node: self.node.clone(),
            records: sel.records,
            last_seq: st.ring.last_seq(),
            dropped: self.dropped(),
            more: sel.more,
        }
    }

    /// The answer to an aggregate query (`Request::FlowAggregates`).
    pub fn aggregate_reply(&self, q: &AggregateQuery) -> AggregateReply {
        // Under the lock only the copy of the selected minutes: `take` waits on this lock,
        // and the NFLOG socket drops what it cannot buffer meanwhile.
        let minutes = self.state.lock().unwrap().aggregates.select(q);
        aggregate::reply_of(&self.node, minutes)
    }

    /// Takes one batch from the reader: counts the kernel's losses, samples, resolves what is
    /// kept (from the cache, else against the model: one lock of it for the batch's misses)
    /// and keeps the records.
    pub fn take(&self, batch: NflogBatch, model: &dyn FlowModel, hosts: &Hosts) {
        let s = &self.stats;
        s.lost.fetch_add(batch.lost, Ordering::Relaxed);
        s.overruns.fetch_add(batch.overruns, Ordering::Relaxed);
        s.malformed.fetch_add(batch.malformed, Ordering::Relaxed);
        let mut kept: Vec<(Key, PacketHeaders, u64)> = Vec::new();
        {
            let mut st = self.state.lock().unwrap();
            for ev in batch.events {
                let NflogEvent {
                    prefix,
                    packet,
                    time,
                    ..
                } = ev;
                let Some(tag) = FlowTag::parse(&prefix) else {
                    s.foreign.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let Some(pkt) = packet else {
                    s.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                s.events.fetch_add(1, Ordering::Relaxed);
                let t = ms_since_epoch(time);
                if !st.budget.allow(t) {
                    s.sampled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                kept.push((Key::of(tag, &pkt), pkt, t));
            }
        }
        if kept.is_empty() {
            return;
        }
        let out = self.resolve_all(&kept, model, hosts);
        let mut st = self.state.lock().unwrap();
        for ((_, pkt, _), mut r) in kept.iter().zip(out) {
            if r.record.reason == FlowReason::DefaultDeny {
                let local = match r.record.direction {
                    FlowDirection::Ingress => pkt.dst,
                    FlowDirection::Egress => pkt.src,
                };
                let key = (local, r.record.direction);
                if r.record.policies.is_empty() {
                    if let Some(p) = st.selecting.get(&key) {
                        r.record.policies = p.clone();
                    }
                } else if st.selecting.get(&key) != Some(&r.record.policies) {
                    if st.selecting.len() >= MAX_REMEMBERED && !st.selecting.contains_key(&key) {
                        st.selecting.clear();
                    }
                    st.selecting.insert(key, r.record.policies.clone());
                }
            }
            if r.disagrees {
                s.disagreements.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "flows: the policy model disagrees with the kernel on {:?}",
                    r.record
                );
            }
            st.aggregates.add(&r.record);
            st.counts.add(&r.record);
            st.ring.push(r.record);
        }
    }

    /// The records of `kept`, in order: each from the cache when its key is there at the
    /// model's generation now (no model lock), the others resolved under one lock of the
    /// model and cached.
    fn resolve_all(
        &self,
        kept: &[(Key, PacketHeaders, u64)],
        model: &dyn FlowModel,
        hosts: &Hosts,
    ) -> Vec<Resolved> {
        let s = &self.stats;
        let mut cache = self.cache.lock().unwrap();
        cache.at(model.generation());
        let mut out: Vec<Option<Resolved>> = Vec::with_capacity(kept.len());
        let mut missed = 0;
        for (key, pkt, t) in kept {
            let r = cache.get(key).map(|c| complete(c.clone(), hosts, pkt, *t));
            missed += usize::from(r.is_none());
            out.push(r);
        }
        s.cache_hits
            .fetch_add((kept.len() - missed) as u64, Ordering::Relaxed);
        if missed > 0 {
            let (mut hits, mut misses) = (0u64, 0u64);
            model.with_policy_set(&mut |set| {
                // The model may have moved since the generation was read: its own revision
                // is the one these resolutions hold for.
                cache.at(set.revision());
                for ((key, pkt, t), slot) in kept.iter().zip(out.iter_mut()) {
                    if slot.is_some() {
                        continue;
                    }
                    let cause = match cache.get(key) {
                        // Resolved earlier in this batch.
                        Some(c) => {
                            hits += 1;
                            c.clone()
                        }
                        None => {
                            misses += 1;
                            let c = resolve_cause(set, &self.node, &key.tag, pkt);
                            cache.insert(key.clone(), c.clone());
                            c
                        }
                    };
                    *slot = Some(complete(cause, hosts, pkt, *t));
                }
            });
            s.cache_hits.fetch_add(hits, Ordering::Relaxed);
            s.cache_misses.fetch_add(misses, Ordering::Relaxed);
        }
        // Every slot is filled: the hits above, the misses under the model lock. A hole would
        // shift every later record onto another event's packet in `take`.
        out.into_iter()
            .map(|r| r.expect("resolved under the model lock"))
            .collect()
    }

    /// Starts the reader thread: binds the group in this network namespace (again after a
    /// failure), reads until `stop`.
    pub fn spawn(
        self: &Arc<Self>,
        model: Arc<dyn FlowModel>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("flows".into())
            .spawn(move || me.run(&*model, &stop))
            .map(|_| ())
    }

    fn run(&self, model: &dyn FlowModel, stop: &AtomicBool) {
        let mut sock: Option<NflogSocket> = None;
        let mut hosts = model.hosts();
        let mut hosts_at = Instant::now();
        let mut warned = false;
        while !stop.load(Ordering::Relaxed) {
            let Some(s) = sock.as_mut() else {
                match NflogSocket::open(&NflogConfig::new(self.cfg.group)) {
                    Ok(s) => {
                        log::info!("flows: reading NFLOG group {}", self.cfg.group);
                        sock = Some(s);
                        warned = false;
                    }
                    Err(e) => {
                        if !warned {
                            log::warn!("flows: no flow records for now: {e}");
                            warned = true;
                        }
                        std::thread::sleep(REBIND_AFTER);
                    }
                }
                continue;
            };
            match s.recv(Duration::from_millis(500)) {
                Ok(batch) => self.take(batch, model, &hosts),
                Err(e) => {
                    log::warn!("flows: {e}; binding again");
                    sock = None;
                }
            }
            if hosts_at.elapsed() > HOSTS_REFRESH {
                hosts = model.hosts();
                hosts_at = Instant::now();
            }
        }
    }

    /// The service's part of `/metrics`.
    pub fn render_metrics(&self, node: &str, page: &mut Page) {
        let st = self.state.lock().unwrap();
        {
            let mut f = page.counter(
                "tern_flows_total",
                "New connections recorded at this node's pods, by direction and verdict.",
            );
            for ((d, v), n) in &st.counts.flows {
                f.sample(
                    &[
                        ("node", node),
                        ("direction", d.as_str()),
                        ("verdict", v.as_str()),
                    ],
                    *n,
                );
            }
        }
        {
            let mut f = page.counter(
                "tern_flow_denies_total",
                "Denied connections per policy (the 20 with most denies, the rest as other).",
            );
            for (p, n) in st.counts.top_denies() {
                f.sample(&[("node", node), ("policy", &p)], n);
            }
        }
        let s = &self.stats;
        {
            let mut f = page.counter(
                "tern_flow_records_dropped_total",
                "Flow records not kept: sampled out above the rate budget, or lost by the kernel.",
            );
            f.sample(
                &[("node", node), ("reason", "sampled")],
                s.sampled.load(Ordering::Relaxed),
            );
            f.sample(
                &[("node", node), ("reason", "kernel")],
                s.lost.load(Ordering::Relaxed),
            );
        }
        for (name, help, n) in [
            (
                "tern_flow_nflog_overruns_total",
                "Times the NFLOG socket's buffer overflowed.",
                &s.overruns,
            ),
            (
                "tern_flow_events_malformed_total",
                "NFLOG events that did not parse.",
                &s.malformed,
            ),
            (
                "tern_flow_resolve_cache_hits_total",
                "Flow records resolved from the cache (the policy model unchanged since).",
                &s.cache_hits,
            ),
            (
                "tern_flow_resolve_cache_misses_total",
                "Flow records resolved against the policy model (under its lock).",
                &s.cache_misses,
            ),
            (
                "tern_flow_explain_disagreements_total",
                "Records where the policy model named another cause than the kernel's rule.",
                &s.disagreements,
            ),
        ] {
            page.counter(name, help)
                .sample(&[("node", node)], n.load(Ordering::Relaxed));
        }
        page.gauge("tern_flow_ring_records", "Flow records kept in the ring.")
            .sample(&[("node", node)], st.ring.len());
    }
}

#[cfg(test)]
mod tests {
    use tern_api::flow::FlowRecord;

    use super::*;
    use crate::flows::resolve::resolve;

    struct Model(PolicySet);

    impl FlowModel for Model {
        fn with_policy_set(&self, f: &mut dyn FnMut(&PolicySet)) {
            f(&self.0)
        }
        fn generation(&self) -> u64 {
            self.0.revision()
        }
        fn hosts(&self) -> Hosts {
            Hosts::default()
        }
    }

    /// A model that changes, and counts how often it is locked.
    struct Changing {
        set: Mutex<PolicySet>,
        locks: AtomicU64,
    }

    impl FlowModel for Changing {
        fn with_policy_set(&self, f: &mut dyn FnMut(&PolicySet)) {
            self.locks.fetch_add(1, Ordering::Relaxed);
            f(&self.set.lock().unwrap())
        }
        fn generation(&self) -> u64 {
            self.set.lock().unwrap().revision()
        }
        fn hosts(&self) -> Hosts {
            Hosts::default()
        }
    }

    fn event(prefix: &str, sport: u16, ms: u64) -> NflogEvent {
        NflogEvent {
            family: 2,
            prefix: prefix.into(),
            indev: None,
            outdev: None,
            mark: None,
            seq: None,
            time: UNIX_EPOCH + Duration::from_millis(ms),
            packet: Some(PacketHeaders {
                src: "192.0.2.1".parse::<IpAddr>().unwrap(),
                dst: "10.0.0.1".parse::<IpAddr>().unwrap(),
                proto: 17,
                src_port: Some(sport),
                dst_port: Some(53),
                icmp: None,
            }),
        }
    }

    /// A default deny resolved after its policy left the model names the policy last seen.
    #[test]
    fn a_default_deny_resolved_late_names_the_policy_last_seen() {
        let mut set = PolicySet::new();
        set.upsert_endpoint(tern_policy::Endpoint {
            namespace: "b".into(),
            name: "n1-k8s-server-eth0".into(),
            node: "n1".into(),
            interface: "tserver".into(),
            labels: Arc::new([("app".to_string(), "server".to_string())].into()),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ports: Vec::new(),
        });
        let without = Model(set.clone());
        let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: b}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n";
        for r in tern_model::parse_documents(deny, "t.yaml").unwrap() {
            set.apply(&r).unwrap();
        }
        let with = Model(set);
        let f = Flows::new("n1", FlowsConfig::new(1));
        let batch = || NflogBatch {
            events: vec![event("t:dd:i", 1, 1_000)],
            ..NflogBatch::default()
        };
        f.take(batch(), &with, &Hosts::default());
        f.take(batch(), &without, &Hosts::default());
        let r = f.query(&FlowQuery::default()).records;
        assert_eq!(r.len(), 2);
        for x in &r {
            assert_eq!(x.reason, FlowReason::DefaultDeny);
            assert_eq!(x.policies.len(), 1, "{x:?}");
            assert_eq!(x.policies[0].name, "deny-all");
        }
        assert_eq!(f.disagreements(), 1, "the late one still counts");
    }

    /// A flood of new connections: the ring stays at its cap, the budget samples, the
    /// dropped counter rises, and what is not a tag is not a record.
    #[test]
    fn a_flood_leaves_the_ring_at_its_cap_and_counts_what_it_drops() {
        let cfg = FlowsConfig {
            ring: 100,
            rate: 1_000,
            ..FlowsConfig::new(1)
        };
        let f = Flows::new("n1", cfg);
        let model = Model(PolicySet::new());
        let mut t = 1_000_000;
        for round in 0..20u64 {
            let events: Vec<NflogEvent> = (0..500u16)
                .map(|p| event("t:np:i", p, t))
                .chain([event("something else", 1, t)])
                .collect();
            f.take(
                NflogBatch {
                    events,
                    lost: 3,
                    ..NflogBatch::default()
                },
                &model,
                &Hosts::default(),
            );
            assert_eq!(f.len(), 100.min(((round + 1) * 500) as usize));
            t += 100;
        }
        // 10,000 events in 2 s at 1,000/s with a burst of 1,000: about 3,000 kept.
        let kept = f.query(&FlowQuery::default()).last_seq;
        assert!((2_900..=3_100).contains(&kept), "{kept}");
        assert_eq!(f.dropped(), 10_000 - kept + 20 * 3);
        assert_eq!(f.stats.foreign.load(Ordering::Relaxed), 20);
        let reply = f.query(&FlowQuery {
            last: Some(5),
            ..FlowQuery::default()
        });
        assert_eq!(reply.records.len(), 5);
        assert_eq!(reply.records.last().unwrap().seq, kept);
        let mut page = Page::new();
        f.render_metrics("n1", &mut page);
        let text = page.into_string();
        crate::metrics::exposition::check(&text).unwrap();
        assert!(
            text.contains(
                "tern_flows_total{node=\"n1\",direction=\"ingress\",verdict=\"allowed\"} "
            )
        );
        assert!(text.contains("tern_flow_ring_records{node=\"n1\"} 100"));
    }

    fn apply(set: &mut PolicySet, yaml: &str) {
        for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
            set.apply(&r).unwrap();
        }
    }

    fn pod(ns: &str, name: &str, ip: &str, app: &str) -> tern_policy::Endpoint {
        tern_policy::Endpoint {
            namespace: ns.into(),
            name: format!("n1-k8s-{name}-eth0"),
            node: "n1".into(),
            interface: format!("t{name}"),
            labels: Arc::new([("app".to_string(), app.to_string())].into()),
            ips: vec![ip.parse().unwrap()],
            ports: Vec::new(),
        }
    }

    fn packet(src: &str, dst: &str, proto: u8, sport: u16, dport: u16) -> PacketHeaders {
        PacketHeaders {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto,
            src_port: Some(sport),
            dst_port: Some(dport),
            icmp: None,
        }
    }

    fn ev(prefix: &str, pkt: PacketHeaders, ms: u64) -> NflogEvent {
        NflogEvent {
            packet: Some(pkt),
            ..event(prefix, 0, ms)
        }
    }

    const WEB: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: b}\nspec:\n  podSelector: {matchLabels: {app: server}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: client}}, namespaceSelector: {}}]\n    ports: [{port: 8080, protocol: TCP}]\n---\napiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: web, namespace: b}\nspec: {stagedAction: Delete}\n";

    /// The batches of `events`, each event with a fresh source port every round.
    fn rounds(events: &[(&str, PacketHeaders)], round: u16, ms: u64) -> NflogBatch {
        NflogBatch {
            events: events
                .iter()
                .map(|(prefix, pkt)| {
                    let mut pkt = *pkt;
                    pkt.src_port = Some(40_000 + round);
                    ev(prefix, pkt, ms)
                })
                .collect(),
            ..NflogBatch::default()
        }
    }

    /// Cached resolutions: a batch of events seen before (new source ports) takes no model
    /// lock and gives the records a fresh resolution gives; a model change is seen at once.
    #[test]
    fn cached_resolutions_equal_fresh_ones_and_a_model_change_invalidates_them() {
        let mut set = PolicySet::new();
        set.upsert_endpoint(pod("a", "client", "10.0.0.1", "client"));
        set.upsert_endpoint(pod("b", "server", "10.0.0.2", "server"));
        set.upsert_endpoint(pod("a", "other", "10.0.0.3", "other"));
        apply(&mut set, WEB);
        let web = set.policies().next().unwrap().key.to_string();
        let rule = FlowTag::Rule {
            policy_hash: tern_policy::compile::short_hash(&web),
            direction: tern_policy::Direction::Ingress,
            index: 0,
            action: tern_policy::flowtag::TagAction::Allow,
        }
        .to_string();
        assert!(FlowTag::parse(&rule).is_some(), "{rule}");
        let hosts = Hosts {
            by_ip: HashMap::from([("198.18.0.9".parse().unwrap(), "node-9".to_string())]),
        };
        let events = [
            (rule.as_str(), packet("10.0.0.1", "10.0.0.2", 6, 0, 8080)),
            ("t:dd:i", packet("10.0.0.3", "10.0.0.2", 6, 0, 8080)),
            ("t:dd:i", packet("198.18.0.9", "10.0.0.2", 17, 0, 53)),
            ("t:np:e", packet("10.0.0.1", "192.0.2.7", 6, 0, 443)),
            ("t:np:e", packet("10.0.0.1", "198.18.0.9", 6, 0, 22)),
        ];
        let model = Changing {
            set: Mutex::new(set),
            locks: AtomicU64::new(0),
        };
        let f = Flows::new("n1", FlowsConfig::new(1));
        let mut ms = 1_000_000;
        // What a fresh resolution says of round `round`'s events, as of the model now.
        let fresh = |round: u16, ms: u64| -> Vec<FlowRecord> {
            let set = model.set.lock().unwrap();
            rounds(&events, round, ms)
                .events
                .iter()
                .map(|e| {
                    let tag = FlowTag::parse(&e.prefix).unwrap();
                    resolve(&set, "n1", &hosts, &tag, e.packet.as_ref().unwrap(), ms).record
                })
                .collect()
        };
        let taken = |f: &Flows, n: usize| -> Vec<FlowRecord> {
            let mut r = f.query(&FlowQuery::default()).records;
            let r = r.split_off(r.len() - n);
            r.into_iter().map(|x| FlowRecord { seq: 0, ..x }).collect()
        };
        for round in 0..3u16 {
            f.take(rounds(&events, round, ms), &model, &hosts);
            assert_eq!(taken(&f, events.len()), fresh(round, ms), "round {round}");
            ms += 1_000;
        }
        assert_eq!(
            model.locks.load(Ordering::Relaxed),
            1,
            "only the first batch locked"
        );
        let st = &f.stats;
        assert_eq!(st.cache_misses.load(Ordering::Relaxed), 5);
        assert_eq!(st.cache_hits.load(Ordering::Relaxed), 10);
        let got = taken(&f, 5);
        assert_eq!(got[0].policies[0].rule.as_deref(), Some("ingress[0]"));
        assert_eq!(got[0].src.port, Some(40_002), "ports are the event's own");
        assert_eq!(got[0].time, ms - 1_000, "so is the time");
        assert!(
            got[0].pending.is_some(),
            "the staged Delete would change it"
        );
        assert_eq!(got[2].src.node.as_deref(), Some("node-9"));
        assert_eq!(got[3].dst.kind, tern_api::flow::EndKind::Outside);
        // The model changes: the staged policy goes, the client is relabelled. Seen at once.
        {
            let mut set = model.set.lock().unwrap();
            set.remove_staged(&tern_policy::PolicyKey {
                kind: tern_model::Kind::StagedKubernetesNetworkPolicy,
                namespace: Some("b".into()),
                name: "web".into(),
            });
            set.upsert_endpoint(pod("a", "client", "10.0.0.1", "renamed"));
        }
        f.take(rounds(&events, 3, ms), &model, &hosts);
        let got = taken(&f, 5);
        assert_eq!(got, fresh(3, ms));
        assert_eq!(got[0].pending, None);
        assert_eq!(got[0].src.labels["app"], "renamed");
        assert_eq!(model.locks.load(Ordering::Relaxed), 2);
        assert_eq!(st.cache_misses.load(Ordering::Relaxed), 10);
        // The metrics say so.
        let mut page = Page::new();
        f.render_metrics("n1", &mut page);
        let text = page.into_string();
        crate::metrics::exposition::check(&text).unwrap();
        assert!(text.contains("tern_flow_resolve_cache_hits_total{node=\"n1\"} 10\n"));
        assert!(text.contains("tern_flow_resolve_cache_misses_total{node=\"n1\"} 10\n"));
    }

    /// Events of one batch with one key resolve once; distinct keys past the bound keep the
    /// cache at its bound.
    #[test]
    fn one_batch_resolves_a_key_once_and_the_cache_stays_bounded() {
        let mut set = PolicySet::new();
        set.upsert_endpoint(pod("b", "server", "10.0.0.2", "server"));
        let model = Changing {
            set: Mutex::new(set),
            locks: AtomicU64::new(0),
        };
        let f = Flows::new(
            "n1",
            FlowsConfig {
                rate: 1_000_000,
                ..FlowsConfig::new(1)
            },
        );
        let same: Vec<NflogEvent> = (0..50u16)
            .map(|p| ev("t:np:i", packet("192.0.2.1", "10.0.0.2", 6, p, 80), 1_000))
            .collect();
        f.take(
            NflogBatch {
                events: same,
                ..NflogBatch::default()
            },
            &model,
            &Hosts::default(),
        );
        assert_eq!(f.stats.cache_misses.load(Ordering::Relaxed), 1);
        assert_eq!(f.stats.cache_hits.load(Ordering::Relaxed), 49);
        // Distinct destination ports: one key each.
        let n = CACHE_ENTRIES + 100;
        let events: Vec<NflogEvent> = (0..n)
            .map(|i| {
                let port = 1_000 + u16::try_from(i).unwrap();
                ev("t:np:i", packet("192.0.2.1", "10.0.0.2", 6, 1, port), 2_000)
            })
            .collect();
        f.take(
            NflogBatch {
                events,
                ..NflogBatch::default()
            },
            &model,
            &Hosts::default(),
        );
        let cached = f.cache.lock().unwrap().len();
        assert!(cached <= CACHE_ENTRIES, "{cached}");
        // 1 + n distinct keys: emptied when CACHE_ENTRIES were kept, then filled with the rest.
        assert_eq!(
            cached,
            1 + n - CACHE_ENTRIES,
            "emptied when full, then filled again"
        );
        assert_eq!(f.stats.cache_misses.load(Ordering::Relaxed), 1 + n as u64);
        assert_eq!(model.locks.load(Ordering::Relaxed), 2);
    }
}
