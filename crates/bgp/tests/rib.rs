//! RIB behaviour: best-path selection, route reflection, loop detection, export rewriting and
//! graceful-restart stale handling.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ipnet::IpNet;
use tern_bgp::codec::*;
use tern_bgp::fsm::{Negotiated, Retention};
use tern_bgp::rib::*;

const LOCAL_AS: u32 = 64512;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}
fn ip4(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}
fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn rib(cluster: Option<&str>) -> Rib {
    Rib::new(RibConfig {
        local_as: LOCAL_AS,
        router_id: ip4("198.18.0.1"),
        cluster_id: cluster.map(ip4),
    })
}

/// Adds peer 198.18.0.<n> with router ID 198.18.0.<n> and brings it up.
fn peer(r: &mut Rib, n: u8, asn: u32, rr_client: bool) -> IpAddr {
    let addr = IpAddr::V4(Ipv4Addr::new(198, 18, 0, n));
    r.add_peer(PeerConfig {
        address: addr,
        asn,
        next_hop_v4: Some(ip4("198.18.0.1")),
        next_hop_v6: Some("fd00::1".parse().unwrap()),
        rr_client,
        next_hop_self: false,
        keep_original_next_hop: false,
    })
    .unwrap();
    r.peer_up(addr, &negotiated(n, asn)).unwrap();
    addr
}

fn negotiated(n: u8, asn: u32) -> Negotiated {
    Negotiated {
        peer_as: asn,
        peer_id: Ipv4Addr::new(198, 18, 0, n),
        ibgp: asn == LOCAL_AS,
        hold_time: 90,
        keepalive: 30,
        four_octet_as: true,
        families: vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST],
        route_refresh: true,
        graceful_restart: None,
    }
}

struct Route {
    prefix: &'static str,
    next_hop: &'static str,
    path: Vec<u32>,
    local_pref: Option<u32>,
    med: Option<u32>,
    origin: Origin,
    extra: Vec<PathAttribute>,
}

fn route(prefix: &'static str, next_hop: &'static str) -> Route {
    Route {
        prefix,
        next_hop,
        path: vec![],
        local_pref: None,
        med: None,
        origin: Origin::Igp,
        extra: vec![],
    }
}

fn update(r: &Route) -> Update {
    let mut attrs = vec![
        PathAttribute::Origin(r.origin),
        PathAttribute::AsPath(if r.path.is_empty() {
            vec![]
        } else {
            vec![AsSegment {
                kind: SegmentType::AsSequence,
                asns: r.path.clone(),
            }]
        }),
    ];
    if let Some(m) = r.med {
        attrs.push(PathAttribute::MultiExitDisc(m));
    }
    if let Some(l) = r.local_pref {
        attrs.push(PathAttribute::LocalPref(l));
    }
    attrs.extend(r.extra.iter().cloned());
    match net(r.prefix) {
        IpNet::V4(p) => {
            attrs.push(PathAttribute::NextHop(r.next_hop.parse().unwrap()));
            Update {
                withdrawn: vec![],
                attributes: attrs,
                nlri: vec![p],
            }
        }
        p @ IpNet::V6(_) => {
            attrs.push(PathAttribute::MpReach(MpReach {
                family: Family::IPV6_UNICAST,
                next_hops: vec![ip(r.next_hop)],
                nlri: vec![p],
            }));
            Update {
                withdrawn: vec![],
                attributes: attrs,
                nlri: vec![],
            }
        }
    }
}

fn best(r: &Rib, prefix: &str) -> Option<BestRoute> {
    r.best_routes()
        .into_iter()
        .find(|b| b.prefix == net(prefix))
}

fn best_hop(r: &Rib, prefix: &str) -> Option<IpAddr> {
    best(r, prefix).and_then(|b| b.next_hop)
}

/// Updates sent to `to`, minus End-of-RIB markers.
fn sent_to(all: &[(IpAddr, Update)], to: IpAddr) -> Vec<Update> {
    all.iter()
        .filter(|(a, u)| *a == to && u.end_of_rib_family().is_none())
        .map(|(_, u)| u.clone())
        .collect()
}

fn attr(u: &Update, code: u8) -> Option<&PathAttribute> {
    u.attributes.iter().find(|a| a.type_code() == code)
}

#[test]
fn best_path_prefers_local_pref_then_as_path_then_origin() {
    let mut r = rib(None);
    let a = peer(&mut r, 2, LOCAL_AS, false);
    let b = peer(&mut r, 3, LOCAL_AS, false);
    let p = "10.244.0.0/26";
    r.apply_update(
        a,
        &update(&Route {
            local_pref: Some(100),
            path: vec![65001],
            ..route(p, "198.18.0.2")
        }),
    )
    .unwrap();
    r.apply_update(
        b,
        &update(&Route {
            local_pref: Some(200),
            path: vec![65001, 65002, 65003],
            ..route(p, "198.18.0.3")
        }),
    )
    .unwrap();
    assert_eq!(
        best_hop(&r, p),
        Some(ip("198.18.0.3")),
        "higher LOCAL_PREF wins over shorter path"
    );

    r.apply_update(
        b,
        &update(&Route {
            local_pref: Some(100),
            path: vec![65001, 65002],
            ..route(p, "198.18.0.3")
        }),
    )
    .unwrap();
    assert_eq!(
        best_hop(&r, p),
        Some(ip("198.18.0.2")),
        "shorter AS_PATH wins"
    );

    r.apply_update(
        b,
        &update(&Route {
            local_pref: Some(100),
            path: vec![65009],
            origin: Origin::Igp,
            ..route(p, "198.18.0.3")
        }),
    )
    .unwrap();
    r.apply_update(
        a,
        &update(&Route {
            local_pref: Some(100),
            path: vec![65001],
            origin: Origin::Incomplete,
            ..route(p, "198.18.0.2")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.3")), "lower ORIGIN wins");
}

#[test]
fn med_compared_only_within_the_same_neighbour_as() {
    let mut r = rib(None);
    let a = peer(&mut r, 2, 65001, false);
    let b = peer(&mut r, 3, 65001, false);
    let c = peer(&mut r, 4, 65002, false);
    let p = "10.1.0.0/16";
    r.apply_update(
        a,
        &update(&Route {
            path: vec![65001],
            med: Some(50),
            ..route(p, "198.18.0.2")
        }),
    )
    .unwrap();
    r.apply_update(
        b,
        &update(&Route {
            path: vec![65001],
            med: Some(10),
            ..route(p, "198.18.0.3")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.3")));
    // A route from another AS with a lower MED does not eliminate AS 65001's best; the
    // tie is broken by router ID (198.18.0.3 < 198.18.0.4).
    r.apply_update(
        c,
        &update(&Route {
            path: vec![65002],
            med: Some(0),
            ..route(p, "198.18.0.4")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.3")));
    assert_eq!(best(&r, p).unwrap().kind, RouteKind::Ebgp);
}

#[test]
fn ebgp_beats_ibgp_and_router_id_breaks_ties() {
    let mut r = rib(None);
    let i = peer(&mut r, 2, LOCAL_AS, false);
    let e = peer(&mut r, 9, 65001, false);
    let p = "10.2.0.0/16";
    r.apply_update(
        i,
        &update(&Route {
            path: vec![65001],
            ..route(p, "198.18.0.2")
        }),
    )
    .unwrap();
    r.apply_update(
        e,
        &update(&Route {
            path: vec![65001],
            ..route(p, "198.18.0.9")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.9")));
    let i2 = peer(&mut r, 5, LOCAL_AS, false);
    r.withdraw(e, &[net(p)]).unwrap();
    r.apply_update(
        i2,
        &update(&Route {
            path: vec![65001],
            ..route(p, "198.18.0.5")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.2")), "lowest router ID");
    // ORIGINATOR_ID stands in for the router ID of reflected routes.
    r.apply_update(
        i2,
        &update(&Route {
            path: vec![65001],
            extra: vec![PathAttribute::OriginatorId(ip4("198.18.0.0"))],
            ..route(p, "198.18.0.5")
        }),
    )
    .unwrap();
    assert_eq!(best_hop(&r, p), Some(ip("198.18.0.5")));
}

#[test]
fn loop_detection_drops_routes() {
    let mut r = rib(Some("198.18.0.100"));
    let e = peer(&mut r, 9, 65001, false);
    let i = peer(&mut r, 2, LOCAL_AS, true);
    // Our AS in the path from an eBGP peer.
    let n = r
        .apply_update(
            e,
            &update(&Route {
                path: vec![65001, LOCAL_AS],
                ..route("10.3.0.0/16", "198.18.0.9")
            }),
        )
        .unwrap();
    assert_eq!(n, 0);
    // Our router ID as ORIGINATOR_ID.
    r.apply_update(
        i,
        &update(&Route {
            extra: vec![PathAttribute::OriginatorId(ip4("198.18.0.1"))],
            ..route("10.4.0.0/16", "198.18.0.2")
        }),
    )
    .unwrap();
    // Our cluster ID in CLUSTER_LIST.
    r.apply_update(
        i,
        &update(&Route {
            extra: vec![PathAttribute::ClusterList(vec![
                ip4("198.18.0.7"),
                ip4("198.18.0.100"),
            ])],
            ..route("10.5.0.0/16", "198.18.0.2")
        }),
    )
    .unwrap();
    assert!(r.best_routes().is_empty());
    // A looped announcement replaces an earlier good one: implicit withdrawal.
    r.apply_update(
        e,
        &update(&Route {
            path: vec![65001],
            ..route("10.6.0.0/16", "198.18.0.9")
        }),
    )
    .unwrap();
    assert!(best(&r, "10.6.0.0/16").is_some());
    r.apply_update(
        e,
        &update(&Route {
            path: vec![65001, LOCAL_AS],
            ..route("10.6.0.0/16", "198.18.0.9")
        }),
    )
    .unwrap();
    assert!(best(&r, "10.6.0.0/16").is_none());
}

#[test]
fn non_reflector_applies_ibgp_split_horizon() {
    let mut r = rib(None);
    let a = peer(&mut r, 2, LOCAL_AS, false);
    let b = peer(&mut r, 3, LOCAL_AS, false);
    let e = peer(&mut r, 9, 65001, false);
    r.apply_update(a, &update(&route("10.244.2.0/26", "198.18.0.2")))
        .unwrap();
    let ups = r.take_updates();
    assert!(
        sent_to(&ups, b).is_empty(),
        "iBGP route not passed to iBGP peer"
    );
    assert!(sent_to(&ups, a).is_empty(), "not sent back to its source");
    let to_e = sent_to(&ups, e);
    assert_eq!(to_e.len(), 1);
    let u = &to_e[0];
    assert_eq!(u.nlri, vec!["10.244.2.0/26".parse().unwrap()]);
    assert_eq!(
        attr(u, 2),
        Some(&PathAttribute::AsPath(vec![AsSegment {
            kind: SegmentType::AsSequence,
            asns: vec![LOCAL_AS]
        }])),
        "AS prepended toward eBGP"
    );
    assert_eq!(
        attr(u, 3),
        Some(&PathAttribute::NextHop(ip4("198.18.0.1"))),
        "next-hop-self toward eBGP"
    );
    assert_eq!(attr(u, 5), None, "no LOCAL_PREF toward eBGP");
    // End-of-RIB follows the first table, once per family.
    let eors: Vec<_> = ups
        .iter()
        .filter(|(a, u)| *a == e && u.end_of_rib_family().is_some())
        .collect();
    assert_eq!(eors.len(), 2);
    assert!(r.take_updates().is_empty(), "nothing new to send");
}

#[test]
fn route_reflector_reflects_per_rfc4456() {
    let mut r = rib(Some("198.18.0.100"));
    let c1 = peer(&mut r, 2, LOCAL_AS, true);
    let c2 = peer(&mut r, 3, LOCAL_AS, true);
    let nc = peer(&mut r, 4, LOCAL_AS, false);
    let nc2 = peer(&mut r, 5, LOCAL_AS, false);
    r.take_updates();

    // From a client: to all other clients and non-clients.
    r.apply_update(c1, &update(&route("10.244.1.0/26", "198.18.0.2")))
        .unwrap();
    let ups = r.take_updates();
    assert!(sent_to(&ups, c1).is_empty());
    for to in [c2, nc, nc2] {
        let u = sent_to(&ups, to);
        assert_eq!(u.len(), 1, "to {to}");
        assert_eq!(
            attr(&u[0], 9),
            Some(&PathAttribute::OriginatorId(ip4("198.18.0.2")))
        );
        assert_eq!(
            attr(&u[0], 10),
            Some(&PathAttribute::ClusterList(vec![ip4("198.18.0.100")]))
        );
        assert_eq!(
            attr(&u[0], 3),
            Some(&PathAttribute::NextHop(ip4("198.18.0.2"))),
            "RR keeps the next hop"
        );
        assert_eq!(attr(&u[0], 5), Some(&PathAttribute::LocalPref(100)));
    }

    // From a non-client: to clients only.
    r.apply_update(nc, &update(&route("10.244.4.0/26", "198.18.0.4")))
        .unwrap();
    let ups = r.take_updates();
    assert_eq!(sent_to(&ups, c1).len(), 1);
    assert_eq!(sent_to(&ups, c2).len(), 1);
    assert!(sent_to(&ups, nc2).is_empty());

    // Withdrawal propagates to everyone who got the route.
    let w = Update {
        withdrawn: vec!["10.244.1.0/26".parse().unwrap()],
        ..Update::default()
    };
    r.apply_update(c1, &w).unwrap();
    let ups = r.take_updates();
    for to in [c2, nc, nc2] {
        let u = sent_to(&ups, to);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].withdrawn, vec!["10.244.1.0/26".parse().unwrap()]);
    }
}

#[test]
fn local_routes_exported_with_next_hop_self_ipv4_and_ipv6() {
    let mut r = rib(None);
    let a = peer(&mut r, 2, LOCAL_AS, false);
    r.originate(net("10.244.7.0/26"));
    r.originate(net("fd00:10:244:7::/64"));
    let ups = sent_to(&r.take_updates(), a);
    assert_eq!(ups.len(), 2);
    let v4 = ups.iter().find(|u| !u.nlri.is_empty()).unwrap();
    assert_eq!(
        attr(v4, 3),
        Some(&PathAttribute::NextHop(ip4("198.18.0.1")))
    );
    assert_eq!(attr(v4, 2), Some(&PathAttribute::AsPath(vec![])));
    let v6 = ups.iter().find(|u| u.nlri.is_empty()).unwrap();
    match attr(v6, 14) {
        Some(PathAttribute::MpReach(m)) => {
            assert_eq!(m.next_hops, vec![ip("fd00::1")]);
            assert_eq!(m.nlri, vec![net("fd00:10:244:7::/64")]);
        }
        other => panic!("no MP_REACH: {other:?}"),
    }
    // Local routes are selected but not for installation as learned routes.
    assert_eq!(best(&r, "10.244.7.0/26").unwrap().kind, RouteKind::Local);
    r.withdraw_local(net("fd00:10:244:7::/64"));
    let ups = sent_to(&r.take_updates(), a);
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].all_withdrawn(), vec![net("fd00:10:244:7::/64")]);
    // Route refresh re-sends the family.
    r.refresh(a, Family::IPV4_UNICAST).unwrap();
    assert_eq!(sent_to(&r.take_updates(), a).len(), 1);
    // Every encoded update is decodable and within the size limit.
    for i in 0..2000u32 {
        r.originate(IpNet::V4(
            ipnet::Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + (i << 8)), 24).unwrap(),
        ));
    }
    let ups = sent_to(&r.take_updates(), a);
    assert!(ups.len() > 1, "large table split into several UPDATEs");
    let total: usize = ups.iter().map(|u| u.nlri.len()).sum();
    assert_eq!(total, 2000);
    for u in ups {
        let bytes = encode(&Message::Update(u.clone()));
        assert!(bytes.len() <= MAX_MESSAGE_LEN);
        assert_eq!(decode(&bytes).unwrap(), Message::Update(u));
    }
}

#[test]
fn ebgp_export_drops_med_of_learned_routes_and_sets_partial_on_unknown() {
    let mut r = rib(None);
    let e1 = peer(&mut r, 9, 65001, false);
    let e2 = peer(&mut r, 8, 65002, false);
    let unknown = UnknownAttribute {
        flags: FLAG_OPTIONAL | FLAG_TRANSITIVE,
        type_code: 99,
        value: vec![7],
    };
    let nontrans = UnknownAttribute {
        flags: FLAG_OPTIONAL,
        type_code: 98,
        value: vec![8],
    };
    r.apply_update(
        e1,
        &update(&Route {
            path: vec![65001],
            med: Some(5),
            extra: vec![
                PathAttribute::Unknown(unknown.clone()),
                PathAttribute::Unknown(nontrans),
            ],
            ..route("10.8.0.0/16", "198.18.0.9")
        }),
    )
    .unwrap();
    let ups = sent_to(&r.take_updates(), e2);
    assert_eq!(ups.len(), 1);
    assert_eq!(attr(&ups[0], 4), None);
    assert_eq!(attr(&ups[0], 98), None);
    assert_eq!(
        attr(&ups[0], 99),
        Some(&PathAttribute::Unknown(UnknownAttribute {
            flags: unknown.flags | FLAG_PARTIAL,
            ..unknown
        }))
    );
    assert_eq!(
        attr(&ups[0], 2),
        Some(&PathAttribute::AsPath(vec![AsSegment {
            kind: SegmentType::AsSequence,
            asns: vec![LOCAL_AS, 65001]
        }]))
    );
    // Not sent to an eBGP peer whose AS is already in the path.
    let e3 = peer(&mut r, 7, 65001, false);
    assert!(sent_to(&r.take_updates(), e3).is_empty());
}

#[test]
fn graceful_restart_helper_keeps_stale_routes_until_end_of_rib() {
    let mut r = rib(None);
    let a = peer(&mut r, 2, LOCAL_AS, false);
    r.apply_update(a, &update(&route("10.244.2.0/26", "198.18.0.2")))
        .unwrap();
    r.apply_update(a, &update(&route("10.244.3.0/26", "198.18.0.2")))
        .unwrap();
    r.apply_update(a, &update(&route("fd00:2::/64", "fd00::2")))
        .unwrap();
    let retain = Retention {
        families: vec![Family::IPV4_UNICAST],
        restart_time: Duration::from_secs(120),
    };
    r.peer_down(a, Some(&retain)).unwrap();
    let routes = r.best_routes();
    assert_eq!(routes.len(), 2, "IPv4 kept, IPv6 (not retained) withdrawn");
    assert!(routes.iter().all(|b| b.stale));

    // The peer is back and re-announces one route, then End-of-RIB.
    r.peer_up(a, &negotiated(2, LOCAL_AS)).unwrap();
    r.apply_update(a, &update(&route("10.244.2.0/26", "198.18.0.2")))
        .unwrap();
    assert!(!best(&r, "10.244.2.0/26").unwrap().stale);
    assert!(best(&r, "10.244.3.0/26").unwrap().stale);
    r.end_of_rib(a, Family::IPV4_UNICAST).unwrap();
    assert!(
        best(&r, "10.244.3.0/26").is_none(),
        "stale route purged on End-of-RIB"
    );
    assert!(best(&r, "10.244.2.0/26").is_some());

    // Restart timer expiry purges everything stale.
    r.peer_down(a, Some(&retain)).unwrap();
    r.purge_stale(a, &[Family::IPV4_UNICAST]).unwrap();
    assert!(r.best_routes().is_empty());

    // A non-graceful loss removes routes at once.
    r.peer_up(a, &negotiated(2, LOCAL_AS)).unwrap();
    r.apply_update(a, &update(&route("10.244.2.0/26", "198.18.0.2")))
        .unwrap();
    r.peer_down(a, None).unwrap();
    assert!(r.best_routes().is_empty());
}

#[test]
fn peer_errors_carry_the_address() {
    let mut r = rib(None);
    let err = r.withdraw(ip("198.18.0.77"), &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BGP peer 198.18.0.77 is not configured in the RIB"
    );
    peer(&mut r, 2, LOCAL_AS, false);
    let dup = r.add_peer(PeerConfig {
        address: ip("198.18.0.2"),
        asn: LOCAL_AS,
        next_hop_v4: None,
        next_hop_v6: None,
        rr_client: false,
        next_hop_self: false,
        keep_original_next_hop: false,
    });
    assert_eq!(dup, Err(RibError::PeerExists(ip("198.18.0.2"))));
}

/// Next hop of each announced prefix in the updates for `to`.
fn announced_to(updates: &[(IpAddr, Update)], to: IpAddr) -> Vec<(IpNet, Option<IpAddr>)> {
    updates
        .iter()
        .filter(|(a, _)| *a == to)
        .flat_map(|(_, u)| u.all_announced())
        .collect()
}

#[test]
fn explicit_origination_next_hop_goes_to_ibgp_and_to_ebgp_only_when_kept() {
    let mut r = rib(None);
    let ibgp = peer(&mut r, 2, LOCAL_AS, false);
    let ebgp = peer(&mut r, 3, 65001, false);
    r.add_peer(PeerConfig {
        address: ip("198.18.0.4"),
        asn: 65002,
        next_hop_v4: Some(ip4("198.18.0.1")),
        next_hop_v6: None,
        rr_client: false,
        next_hop_self: false,
        keep_original_next_hop: true,
    })
    .unwrap();
    r.peer_up(ip("198.18.0.4"), &negotiated(4, 65002)).unwrap();
    r.originate_via(net("10.244.1.0/26"), Some(ip("198.18.0.77")));
    // A next hop of the wrong family is ignored: our session address is used.
    r.originate_via(net("10.244.2.0/26"), Some(ip("fd00::9")));
    let ups = r.take_updates();
    let mut to_ibgp = announced_to(&ups, ibgp);
    to_ibgp.sort();
    assert_eq!(
        to_ibgp,
        vec![
            (net("10.244.1.0/26"), Some(ip("198.18.0.77"))),
            (net("10.244.2.0/26"), Some(ip("198.18.0.1"))),
        ]
    );
    assert!(
        announced_to(&ups, ebgp)
            .iter()
            .all(|(_, nh)| *nh == Some(ip("198.18.0.1")))
    );
    assert!(
        announced_to(&ups, ip("198.18.0.4"))
            .contains(&(net("10.244.1.0/26"), Some(ip("198.18.0.77"))))
    );
    // Changing the session's next hops re-advertises with the new address.
    r.set_next_hops(ibgp, Some(ip4("198.18.0.100")), None)
        .unwrap();
    let ups = r.take_updates();
    assert_eq!(
        announced_to(&ups, ibgp),
        vec![(net("10.244.2.0/26"), Some(ip("198.18.0.100")))]
    );
    assert!(r.peer_config(ibgp).is_some());
}

#[test]
fn import_filter_keeps_refused_routes_out_of_selection_and_export_until_admitted() {
    let mut r = rib(Some("198.18.0.100"));
    let hostile = peer(&mut r, 2, LOCAL_AS, true);
    let good = peer(&mut r, 3, LOCAL_AS, true);
    let client = peer(&mut r, 4, LOCAL_AS, true);
    r.take_updates();
    // Only 10.244.0.0/16 at /26 or longer, from anyone; 0.0.0.0/0 only from `good`.
    r.set_import_filter(Some(ImportFilter::new(move |peer, p: &IpNet| {
        (net("10.244.0.0/16").contains(p) && p.prefix_len() >= 26)
            || (peer == good && p.prefix_len() == 0)
    })));
    for p in [
        "0.0.0.0/0",
        "10.244.9.0/26",
        "10.99.0.0/24",
        "10.244.0.0/16",
    ] {
        r.apply_update(hostile, &update(&route(p, "198.18.0.2")))
            .unwrap();
    }
    assert_eq!(best_hop(&r, "10.244.9.0/26"), Some(ip("198.18.0.2")));
    for p in ["0.0.0.0/0", "10.99.0.0/24", "10.244.0.0/16"] {
        assert_eq!(best(&r, p), None, "{p} must not be selected");
    }
    let mut filtered = r.filtered();
    filtered.sort();
    assert_eq!(
        filtered,
        vec![
            (hostile, net("0.0.0.0/0")),
            (hostile, net("10.99.0.0/24")),
            (hostile, net("10.244.0.0/16")),
        ]
    );
    // Refused routes are not reflected either.
    let ups = r.take_updates();
    let to_client = announced_to(&ups, client);
    assert_eq!(
        to_client,
        vec![(net("10.244.9.0/26"), Some(ip("198.18.0.2")))]
    );
    // The same prefix from a peer the filter admits it for is used.
    r.apply_update(good, &update(&route("0.0.0.0/0", "198.18.0.3")))
        .unwrap();
    assert_eq!(best_hop(&r, "0.0.0.0/0"), Some(ip("198.18.0.3")));
    // Dropping the filter admits what was kept (no route refresh needed); setting a
    // stricter one withdraws from the other peers what it now refuses.
    r.set_import_filter(None);
    assert_eq!(best_hop(&r, "10.99.0.0/24"), Some(ip("198.18.0.2")));
    assert!(r.filtered().is_empty());
    r.take_updates();
    r.set_import_filter(Some(ImportFilter::new(|_, _: &IpNet| false)));
    assert!(r.best_routes().is_empty());
    let ups = r.take_updates();
    let w = sent_to(&ups, client);
    let mut gone: Vec<IpNet> = w.iter().flat_map(|u| u.all_withdrawn()).collect();
    gone.sort();
    assert_eq!(
        gone,
        vec![
            net("0.0.0.0/0"),
            net("10.99.0.0/24"),
            net("10.244.0.0/16"),
            net("10.244.9.0/26"),
        ]
    );
}

/// F9: the import filter runs once per received route, not at every best-path pass: a peer
/// holding 100,000 refused routes and sending one more UPDATE costs one evaluation, however
/// often the speaker recomputes its best paths and its refused set. Replacing the filter judges
/// everything again.
#[test]
fn import_filter_is_evaluated_incrementally() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut r = rib(None);
    let hostile = peer(&mut r, 2, LOCAL_AS, false);
    let calls = Arc::new(AtomicUsize::new(0));
    let counting = |calls: &Arc<AtomicUsize>| {
        let calls = calls.clone();
        ImportFilter::new(move |_, p: &IpNet| {
            calls.fetch_add(1, Ordering::Relaxed);
            p.prefix_len() == 26
        })
    };
    r.set_import_filter(Some(counting(&calls)));
    let n = 100_000u32;
    let nlri: Vec<ipnet::Ipv4Net> = (0..n)
        .map(|i| ipnet::Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 + i), 32).unwrap())
        .collect();
    let mut big = update(&route("10.255.0.0/24", "198.18.0.2"));
    big.nlri = nlri;
    r.apply_update(hostile, &big).unwrap();
    // A driver pass: best paths plus the refused set.
    let pass = |r: &Rib| (r.best_routes().len(), r.filtered().len());
    assert_eq!(pass(&r), (0, n as usize));
    assert_eq!(calls.load(Ordering::Relaxed), n as usize);
    for _ in 0..3 {
        assert_eq!(pass(&r), (0, n as usize));
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        n as usize,
        "no re-evaluation"
    );
    // One more UPDATE (an accepted /26): one evaluation.
    r.apply_update(hostile, &update(&route("10.244.9.0/26", "198.18.0.2")))
        .unwrap();
    assert_eq!(pass(&r), (1, n as usize));
    assert_eq!(calls.load(Ordering::Relaxed), n as usize + 1);
    // A withdrawal and a re-announcement of one refused route: one more.
    r.withdraw(hostile, &[net("10.0.0.7/32")]).unwrap();
    r.apply_update(hostile, &update(&route("10.0.0.7/32", "198.18.0.2")))
        .unwrap();
    assert_eq!(pass(&r), (1, n as usize));
    assert_eq!(calls.load(Ordering::Relaxed), n as usize + 2);
    // A new filter: every held route once more, then incremental again.
    let fresh = Arc::new(AtomicUsize::new(0));
    r.set_import_filter(Some(counting(&fresh)));
    assert_eq!(pass(&r), (1, n as usize));
    assert_eq!(pass(&r), (1, n as usize));
    assert_eq!(fresh.load(Ordering::Relaxed), n as usize + 1);
}
