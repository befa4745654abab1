//! Golden replay of the RIB (holo's pattern, as `fsm_replay.rs` does for the FSM): each
//! directory under `tests/rib_replay/` is one topology. `config.json` holds the speaker
//! (AS, router ID, cluster ID), its configured peers and its own prefixes; `events.json` lists
//! what the sessions report (peer up, UPDATEs with paths, withdrawals, End-of-RIB, peer down
//! with or without graceful restart) and operator changes (import filter, originated
//! prefixes); `output.txt` is the Loc-RIB (best paths), the filtered routes and the UPDATEs
//! [`Rib::take_updates`] sends after every event. Pure: no sockets, no kernel.
//!
//! Regenerate the expected files with `TERN_GOLDEN_UPDATE=1 cargo test -p tern-bgp --test
//! rib_replay`, then review the diff.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use tern_bgp::codec::{
    AsSegment, Family, MpReach, MpUnreach, Origin, PathAttribute, SegmentType, Update,
};
use tern_bgp::fsm::{Negotiated, Retention};
use tern_bgp::rib::{ImportFilter, PeerConfig, Rib, RibConfig, RouteSource};
use tern_testkit::golden;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    local_as: u32,
    router_id: Ipv4Addr,
    #[serde(default)]
    cluster_id: Option<Ipv4Addr>,
    peers: Vec<Peer>,
    /// Prefixes this speaker originates (its own blocks).
    #[serde(default)]
    originate: Vec<IpNet>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Peer {
    address: IpAddr,
    asn: u32,
    #[serde(default)]
    rr_client: bool,
    #[serde(default)]
    next_hop_self: bool,
}

/// A received announcement: one set of path attributes for some prefixes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Announce {
    peer: IpAddr,
    prefixes: Vec<IpNet>,
    next_hop: IpAddr,
    #[serde(default)]
    as_path: Vec<u32>,
    #[serde(default)]
    local_pref: Option<u32>,
    #[serde(default)]
    med: Option<u32>,
    #[serde(default)]
    originator_id: Option<Ipv4Addr>,
    #[serde(default)]
    cluster_list: Vec<Ipv4Addr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Withdraw {
    peer: IpAddr,
    prefixes: Vec<IpNet>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerDown {
    peer: IpAddr,
    /// Graceful restart: the peer's routes stay, marked stale.
    #[serde(default)]
    graceful: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Filter {
    /// Prefixes inside any of these are refused on import.
    deny: Vec<IpNet>,
}

/// One event; exactly one field besides `note` is set.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    PeerUp(IpAddr),
    Update(Announce),
    Withdraw(Withdraw),
    EndOfRib(IpAddr),
    PeerDown(PeerDown),
    /// `null` removes the filter.
    ImportFilter(Option<Filter>),
    Originate(IpNet),
    WithdrawLocal(IpNet),
}

#[derive(Deserialize)]
struct Event {
    note: String,
    #[serde(flatten)]
    action: Action,
}

const FAMILIES: [Family; 2] = [Family::IPV4_UNICAST, Family::IPV6_UNICAST];

fn negotiated(rib: &Rib, local_as: u32, addr: IpAddr) -> Negotiated {
    let peer_as = rib
        .peer_config(addr)
        .expect("peer_up of a configured peer")
        .asn;
    Negotiated {
        peer_as,
        // The peers of these topologies use their IPv4 address as router ID.
        peer_id: match addr {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => Ipv4Addr::new(198, 18, 255, 1),
        },
        ibgp: peer_as == local_as,
        hold_time: 90,
        keepalive: 30,
        four_octet_as: true,
        families: FAMILIES.to_vec(),
        route_refresh: true,
        graceful_restart: None,
    }
}

fn announcement(a: &Announce) -> Update {
    let mut attrs = vec![
        PathAttribute::Origin(Origin::Igp),
        PathAttribute::AsPath(if a.as_path.is_empty() {
            vec![]
        } else {
            vec![AsSegment {
                kind: SegmentType::AsSequence,
                asns: a.as_path.clone(),
            }]
        }),
    ];
    attrs.extend(a.med.map(PathAttribute::MultiExitDisc));
    attrs.extend(a.local_pref.map(PathAttribute::LocalPref));
    attrs.extend(a.originator_id.map(PathAttribute::OriginatorId));
    if !a.cluster_list.is_empty() {
        attrs.push(PathAttribute::ClusterList(a.cluster_list.clone()));
    }
    let (v4, v6) = split(&a.prefixes);
    let mut u = Update::default();
    if !v4.is_empty() {
        let IpAddr::V4(nh) = a.next_hop else {
            panic!("IPv4 prefixes need an IPv4 next hop");
        };
        attrs.push(PathAttribute::NextHop(nh));
        u.nlri = v4;
    }
    if !v6.is_empty() {
        attrs.push(PathAttribute::MpReach(MpReach {
            family: Family::IPV6_UNICAST,
            next_hops: vec![a.next_hop],
            nlri: v6,
        }));
    }
    u.attributes = attrs;
    u
}

fn withdrawal(prefixes: &[IpNet]) -> Update {
    let (v4, v6) = split(prefixes);
    let mut u = Update {
        withdrawn: v4,
        ..Update::default()
    };
    if !v6.is_empty() {
        u.attributes.push(PathAttribute::MpUnreach(MpUnreach {
            family: Family::IPV6_UNICAST,
            withdrawn: v6,
        }));
    }
    u
}

fn split(prefixes: &[IpNet]) -> (Vec<ipnet::Ipv4Net>, Vec<IpNet>) {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for p in prefixes {
        match p {
            IpNet::V4(n) => v4.push(*n),
            IpNet::V6(_) => v6.push(*p),
        }
    }
    (v4, v6)
}

fn list<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One UPDATE as a line: what it withdraws and announces, and with which attributes.
fn render_update(u: &Update) -> String {
    if let Some(f) = u.end_of_rib_family() {
        return format!("end-of-rib afi {} safi {}", f.afi, f.safi);
    }
    let mut withdrawn: Vec<IpNet> = u.withdrawn.iter().map(|n| IpNet::V4(*n)).collect();
    let mut nlri: Vec<IpNet> = u.nlri.iter().map(|n| IpNet::V4(*n)).collect();
    let mut attrs = Vec::new();
    for a in &u.attributes {
        match a {
            PathAttribute::Origin(o) => attrs.push(format!("origin {o:?}")),
            PathAttribute::AsPath(segs) => {
                let asns: Vec<u32> = segs.iter().flat_map(|s| s.asns.clone()).collect();
                attrs.push(format!("as-path [{}]", list(&asns)));
            }
            PathAttribute::NextHop(nh) => attrs.push(format!("next-hop {nh}")),
            PathAttribute::MultiExitDisc(m) => attrs.push(format!("med {m}")),
            PathAttribute::LocalPref(l) => attrs.push(format!("local-pref {l}")),
            PathAttribute::OriginatorId(id) => attrs.push(format!("originator {id}")),
            PathAttribute::ClusterList(c) => attrs.push(format!("cluster-list [{}]", list(c))),
            PathAttribute::MpReach(r) => {
                attrs.push(format!("mp-next-hop {}", list(&r.next_hops)));
                nlri.extend(r.nlri.iter().copied());
            }
            PathAttribute::MpUnreach(r) => withdrawn.extend(r.withdrawn.iter().copied()),
            other => attrs.push(format!("{other:?}")),
        }
    }
    let mut s = String::new();
    if !withdrawn.is_empty() {
        write!(s, "withdraw {}", list(&withdrawn)).unwrap();
    }
    if !nlri.is_empty() {
        if !s.is_empty() {
            s.push_str("; ");
        }
        write!(s, "announce {} ({})", list(&nlri), attrs.join(", ")).unwrap();
    }
    s
}

fn step(out: &mut String, title: &str, rib: &mut Rib) {
    writeln!(out, "## {title}").unwrap();
    writeln!(out, "best:").unwrap();
    for b in rib.best_routes() {
        let via = b
            .next_hop
            .map_or("local".to_string(), |n| format!("via {n}"));
        let from = match b.source {
            RouteSource::Local => "self".to_string(),
            RouteSource::Peer(p) => p.to_string(),
        };
        let stale = if b.stale { " stale" } else { "" };
        writeln!(out, "  {} {via} {:?} from {from}{stale}", b.prefix, b.kind).unwrap();
    }
    let filtered = rib.filtered();
    if !filtered.is_empty() {
        writeln!(out, "filtered:").unwrap();
        for (peer, p) in filtered {
            writeln!(out, "  {p} from {peer}").unwrap();
        }
    }
    writeln!(out, "sent:").unwrap();
    for (peer, u) in rib.take_updates() {
        writeln!(out, "  to {peer}: {}", render_update(&u)).unwrap();
    }
    out.push('\n');
}

fn run(dir: &Path) -> String {
    let cfg: Config = golden::parse(dir, "config.json", |t| serde_json::from_str(t));
    let events: Vec<Event> = golden::parse(dir, "events.json", |t| serde_json::from_str(t));
    let mut rib = Rib::new(RibConfig {
        local_as: cfg.local_as,
        router_id: cfg.router_id,
        cluster_id: cfg.cluster_id,
    });
    for p in &cfg.peers {
        rib.add_peer(PeerConfig {
            address: p.address,
            asn: p.asn,
            next_hop_v4: Some(cfg.router_id),
            next_hop_v6: Some("fd00::1".parse().unwrap()),
            rr_client: p.rr_client,
            next_hop_self: p.next_hop_self,
            keep_original_next_hop: false,
        })
        .unwrap_or_else(|e| panic!("{}: peer {}: {e}", dir.display(), p.address));
    }
    for p in &cfg.originate {
        rib.originate(*p);
    }
    let mut out = String::new();
    step(&mut out, "config", &mut rib);
    for (i, e) in events.iter().enumerate() {
        let ctx = format!("{}: event {}", dir.display(), i + 1);
        let r = match &e.action {
            Action::PeerUp(a) => {
                let n = negotiated(&rib, cfg.local_as, *a);
                rib.peer_up(*a, &n)
            }
            Action::Update(a) => rib.apply_update(a.peer, &announcement(a)).map(|_| ()),
            Action::Withdraw(w) => rib
                .apply_update(w.peer, &withdrawal(&w.prefixes))
                .map(|_| ()),
            Action::EndOfRib(a) => rib.end_of_rib(*a, Family::IPV4_UNICAST),
            Action::PeerDown(d) => {
                let keep = Retention {
                    families: FAMILIES.to_vec(),
                    restart_time: Duration::from_secs(120),
                };
                rib.peer_down(d.peer, d.graceful.then_some(&keep))
            }
            Action::ImportFilter(f) => {
                rib.set_import_filter(f.as_ref().map(|f| {
                    let deny = f.deny.clone();
                    ImportFilter::new(move |_, p| !deny.iter().any(|d| d.contains(p)))
                }));
                Ok(())
            }
            Action::Originate(p) => {
                rib.originate(*p);
                Ok(())
            }
            Action::WithdrawLocal(p) => {
                rib.withdraw_local(*p);
                Ok(())
            }
        };
        r.unwrap_or_else(|err| panic!("{ctx}: {err}"));
        step(&mut out, &format!("event {}: {}", i + 1, e.note), &mut rib);
    }
    out
}

#[test]
fn rib_topologies_match_golden_outputs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/rib_replay");
    golden::check(&root, "output.txt", 4, run);
}
