//! Tests of the peer plan and the import policy.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use ipnet::IpNet;
use tern_model::{
    BgpConfigurationSpec, BgpPeer, BgpPeerSpec, Document, EncapMode, Node, NodeBgpSpec, NodeSpec,
};

use crate::snapshot::{BlockInfo, NodeInfo, PoolInfo, Snapshot, reconciler_owns};

use super::*;

fn node(name: &str, addr: Option<&str>, rr: bool, labels: &[(&str, &str)]) -> Node {
    let mut n = Document::new(
        name,
        NodeSpec {
            bgp: addr.map(|a| NodeBgpSpec {
                ipv4_address: Some(format!("{a}/24")),
                route_reflector_cluster_id: rr.then(|| "224.0.0.1".to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    n.metadata.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    n
}

fn peer(name: &str, spec: BgpPeerSpec) -> BgpPeer {
    Document::new(name, spec)
}

/// An explicit peer's spec: its address (`ip` or `ip:port`) and AS number.
fn explicit(peer_ip: &str, as_number: u32) -> BgpPeerSpec {
    BgpPeerSpec {
        peer_ip: Some(peer_ip.into()),
        as_number: Some(as_number),
        ..Default::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn snap() -> Snapshot {
    Snapshot {
        blocks: vec![
            BlockInfo {
                cidr: "10.244.1.0/26".parse().unwrap(),
                affinity: Some("a".into()),
                allocations: vec![(ip("10.244.1.1"), "a".into())],
            },
            BlockInfo {
                cidr: "10.244.2.0/26".parse().unwrap(),
                affinity: Some("b".into()),
                allocations: vec![
                    (ip("10.244.2.1"), "b".into()),
                    (ip("10.244.2.9"), "a".into()),
                ],
            },
        ],
        ..Default::default()
    }
}

fn nodes() -> Vec<Node> {
    vec![
        node("a", Some("198.18.0.11"), false, &[("rack", "r1")]),
        node("b", Some("198.18.0.12"), false, &[("rack", "r2")]),
        node("c", Some("198.18.0.13"), true, &[]),
        node("d", None, false, &[]),
    ]
}

#[test]
fn full_mesh_by_default() {
    let p = plan("a", &nodes(), &Default::default(), &[], &snap()).unwrap();
    assert_eq!((p.asn, p.port, p.cluster_id), (64512, 179, None));
    assert_eq!(p.router_id, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
    let addrs: Vec<_> = p.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("198.18.0.12"), ip("198.18.0.13")]);
    assert!(
        p.peers
            .values()
            .all(|(c, k)| *k == PeerKind::Mesh && !c.rr_client)
    );
    // Own block plus the borrowed address; not the pod address inside the own block.
    let o: Vec<String> = p.originate.iter().map(|n| n.to_string()).collect();
    assert_eq!(o, vec!["10.244.1.0/26", "10.244.2.9/32"]);
}

#[test]
fn route_reflector_has_clients() {
    let p = plan("c", &nodes(), &Default::default(), &[], &snap()).unwrap();
    assert_eq!(p.cluster_id, Some("224.0.0.1".parse().unwrap()));
    assert!(p.peers.values().all(|(c, _)| c.rr_client));
    assert!(p.originate.is_empty());
}

#[test]
fn mesh_disabled_with_global_and_node_specific_peers() {
    let cfg = BgpConfigurationSpec {
        node_to_node_mesh_enabled: false,
        as_number: Some(65010),
        listen_port: 1179,
        ..Default::default()
    };
    let mut tor = explicit("198.18.0.250", 65001);
    tor.password = Some("pw".into());
    tor.keep_original_next_hop = true;
    let mut only_b = explicit("198.18.0.251:2179", 65002);
    only_b.node = Some("b".into());
    let rack1_to_rr = BgpPeerSpec {
        node_selector: Some("rack == 'r1'".into()),
        peer_selector: Some("!has(rack)".into()),
        ..Default::default()
    };
    let peers = vec![
        peer("tor", tor),
        peer("only-b", only_b),
        peer("rack1-to-rr", rack1_to_rr),
    ];
    let p = plan("a", &nodes(), &cfg, &peers, &snap()).unwrap();
    assert_eq!((p.asn, p.port), (65010, 1179));
    let tor = &p.peers[&ip("198.18.0.250")];
    assert_eq!(tor.1, PeerKind::Global);
    assert_eq!((tor.0.asn, tor.0.port), (65001, 179));
    assert_eq!(tor.0.password.as_deref(), Some("pw"));
    assert!(tor.0.keep_original_next_hop);
    // The selector picks node c (no rack label; d has no BGP address).
    assert_eq!(p.peers[&ip("198.18.0.13")].0.port, 1179);
    assert_eq!(p.peers.len(), 2, "{:?}", p.peers);
    let pb = plan("b", &nodes(), &cfg, &peers, &snap()).unwrap();
    let only = &pb.peers[&ip("198.18.0.251")];
    assert_eq!(
        (only.1, only.0.port, only.0.asn),
        (PeerKind::NodeSpecific, 2179, 65002)
    );
    assert_eq!(pb.peers.len(), 2, "{:?}", pb.peers);
}

#[test]
fn node_without_address_is_an_error_and_own_as_wins() {
    assert!(matches!(
        plan("d", &nodes(), &Default::default(), &[], &snap()),
        Err(BgpError::NoAddress(_))
    ));
    let mut ns = nodes();
    ns[0].spec.bgp.as_mut().unwrap().as_number = Some(65100);
    let p = plan("a", &ns, &Default::default(), &[], &snap()).unwrap();
    assert_eq!(p.asn, 65100);
    // b is then in another AS: eBGP, never an RR client.
    let pc = plan("c", &ns, &Default::default(), &[], &snap()).unwrap();
    let a = &pc.peers[&ip("198.18.0.11")].0;
    assert_eq!(a.asn, 65100);
    assert!(!a.rr_client);
}

fn n(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Node a: pool 10.244.0.0/16 (/26 blocks), disabled pool 10.250.0.0/16 with one block,
/// own block 10.244.1.0/26 with pod .1 and .5 lent to b, a pod of a borrowed in b's
/// block (.9), underlay 198.18.0.0/24; node b at 198.18.0.12, c at 198.18.5.13.
fn policy() -> ImportPolicy {
    let mut s = snap();
    s.blocks[0].allocations.push((ip("10.244.1.5"), "b".into()));
    s.blocks.push(BlockInfo {
        cidr: n("10.250.3.0/26"),
        affinity: Some("c".into()),
        allocations: vec![],
    });
    s.nodes = vec![
        NodeInfo {
            name: "a".into(),
            addresses: vec![n("198.18.0.11/24")],
            vxlan_tunnel_addr: None,
            vtep_mac: None,
            ..Default::default()
        },
        NodeInfo {
            name: "b".into(),
            addresses: vec![n("198.18.0.12/24")],
            vxlan_tunnel_addr: None,
            vtep_mac: None,
            ..Default::default()
        },
        NodeInfo {
            name: "c".into(),
            addresses: vec![n("198.18.5.13/24")],
            vxlan_tunnel_addr: None,
            vtep_mac: None,
            ..Default::default()
        },
    ];
    let pools = vec![
        PoolRange {
            cidr: n("10.244.0.0/16"),
            block_size: 26,
            disabled: false,
        },
        PoolRange {
            cidr: n("10.250.0.0/16"),
            block_size: 26,
            disabled: true,
        },
        PoolRange {
            cidr: n("fd00:244::/48"),
            block_size: 122,
            disabled: false,
        },
    ];
    let mut accept = BTreeMap::new();
    accept.insert(
        ip("198.18.0.250"),
        vec![
            (n("0.0.0.0/0"), 0),
            (n("10.99.0.0/16"), 24),
            (n("198.18.7.0/24"), 24),
        ],
    );
    // The interface list also has the node's own subnet (dedup'ed).
    ImportPolicy::new(
        "a",
        &s,
        pools,
        vec![n("198.18.0.0/24"), n("fe80::/64")],
        accept,
    )
}

#[test]
fn import_policy_accepts_only_pool_prefixes_at_block_size_or_longer() {
    let p = policy();
    let tor = ip("198.18.0.250");
    let mesh = ip("198.18.0.12");
    let ok = |peer: IpAddr, s: &str| p.evaluate(peer, &n(s));
    let c = ip("198.18.5.13");
    // Legitimate: b's block from b, a v6 prefix in no known block, an address of our own
    // block lent to b (from b), a block of a disabled pool from its node c.
    for (from, good) in [
        (mesh, "10.244.2.0/26"),
        (mesh, "10.244.9.0/26"),
        (mesh, "fd00:244::40/122"),
        (mesh, "10.244.1.5/32"),
        (c, "10.250.3.0/26"),
    ] {
        assert_eq!(ok(from, good), Ok(()), "{good}");
    }
    let shorter = Rejection::ShorterThanBlock {
        pool: n("10.244.0.0/16"),
        block_size: 26,
    };
    let cases: &[(IpAddr, &[&str], Result<(), Rejection>)] = &[
        (mesh, &["0.0.0.0/0", "::/0"], Err(Rejection::DefaultRoute)),
        (
            mesh,
            &["198.18.0.0/24", "198.18.0.11/32", "198.18.0.0/16"],
            Err(Rejection::Underlay(n("198.18.0.0/24"))),
        ),
        (mesh, &["198.18.5.0/24"], Err(Rejection::NodeAddress(c))),
        (
            mesh,
            &["fe80::/64"],
            Err(Rejection::Underlay(n("fe80::/64"))),
        ),
        (
            mesh,
            &["10.99.0.0/24", "192.0.2.0/24"],
            Err(Rejection::OutsidePools),
        ),
        (
            mesh,
            &["10.244.0.0/16", "10.244.0.0/24", "10.244.2.0/25"],
            Err(shorter),
        ),
        (
            mesh,
            &["10.250.4.0/26"],
            Err(Rejection::DisabledPool(n("10.250.0.0/16"))),
        ),
        // Our own block, anything inside it, our pods and our borrowed address: never.
        (
            tor,
            &[
                "10.244.1.0/26",
                "10.244.1.0/27",
                "10.244.1.1/32",
                "10.244.1.6/32",
            ],
            Err(Rejection::OwnBlock(n("10.244.1.0/26"))),
        ),
        (
            tor,
            &["10.244.2.9/32"],
            Err(Rejection::LocalAddress(ip("10.244.2.9"))),
        ),
        // The ToR's acceptPrefixes admit exactly what they list, to it alone.
        (tor, &["0.0.0.0/0", "10.99.0.0/24", "198.18.7.0/24"], Ok(())),
        (tor, &["10.99.0.0/25"], Err(Rejection::OutsidePools)),
        (tor, &["::/0"], Err(Rejection::DefaultRoute)),
        // Another node's block only from that node (or a route reflector, or a peer whose
        // acceptPrefixes list it).
        (
            tor,
            &["10.244.2.0/26"],
            Err(Rejection::NotBlockOwner(n("10.244.2.0/26"))),
        ),
    ];
    for (from, prefixes, want) in cases {
        for prefix in *prefixes {
            assert_eq!(&ok(*from, prefix), want, "{prefix} from {from}");
        }
    }
    // The filter the speaker gets says the same.
    let f = Arc::new(p.clone()).filter();
    assert!(f.accepts(mesh, &n("10.244.2.0/26")));
    assert!(!f.accepts(mesh, &n("0.0.0.0/0")) && f.accepts(tor, &n("0.0.0.0/0")));
    // Every rejection explains itself.
    assert_eq!(
        ok(mesh, "10.244.0.0/24").unwrap_err().to_string(),
        "shorter than blockSize /26 of pool 10.244.0.0/16"
    );
}

/// F8: inside another node's block, only that node announces the block, only a borrower
/// announces its borrowed address, nothing else more specific is taken from anyone; a
/// route reflector relays them; acceptPrefixes admit what they list, but never a route
/// more specific than a node address's network or inside the underlay.
#[test]
fn import_policy_refuses_hijacks_of_other_nodes_pods() {
    let mut s = snap();
    // c (198.18.5.13) borrowed 10.244.2.20 from b's block.
    s.blocks[1]
        .allocations
        .push((ip("10.244.2.20"), "c".into()));
    s.nodes = ["a", "b", "c"]
        .iter()
        .zip(["198.18.0.11/24", "198.18.0.12/24", "198.18.5.13/24"])
        .map(|(name, a)| NodeInfo {
            name: name.to_string(),
            addresses: vec![n(a)],
            vxlan_tunnel_addr: None,
            vtep_mac: None,
            ..Default::default()
        })
        .collect();
    let pools = vec![PoolRange {
        cidr: n("10.244.0.0/16"),
        block_size: 26,
        disabled: false,
    }];
    let (b, c, ext) = (ip("198.18.0.12"), ip("198.18.5.13"), ip("198.18.9.1"));
    let rr = ip("198.18.0.20");
    let mut accept = BTreeMap::new();
    accept.insert(ext, vec![(n("10.0.0.0/8"), 32), (n("198.18.0.0/16"), 32)]);
    let mut p = ImportPolicy::new("a", &s, pools, vec![n("198.18.0.0/24")], accept);
    p.set_peer_nodes(&[
        node("r", Some("198.18.0.20"), true, &[]),
        node("c", Some("198.18.5.13"), false, &[]),
    ]);
    let ok = |peer: IpAddr, s: &str| p.evaluate(peer, &n(s));
    let blk = n("10.244.2.0/26");
    let inside = Rejection::InsideRemoteBlock(blk);
    let node_address = Rejection::NodeAddress(c);
    let cases: &[(&str, &[IpAddr], Result<(), Rejection>)] = &[
        // The block: from b, or relayed by the route reflector; not from c.
        ("10.244.2.0/26", &[b, rr], Ok(())),
        ("10.244.2.0/26", &[c], Err(Rejection::NotBlockOwner(blk))),
        // A pod of b as /32: from nobody (b does not announce its own pods' host routes).
        ("10.244.2.1/32", &[b, c, rr], Err(inside.clone())),
        // The address c borrowed: from c or the reflector, not from b.
        ("10.244.2.20/32", &[c, rr], Ok(())),
        ("10.244.2.20/32", &[b], Err(inside.clone())),
        // A more specific than the block, from anyone: refused (it would win by LPM).
        ("10.244.2.0/27", &[b], Err(inside.clone())),
        // acceptPrefixes: an explicit peer admitted 10.0.0.0/8 gets the blocks it lists...
        ("10.244.2.1/32", &[ext], Ok(())),
        // ...and a route to a node's network (routing as usual)...
        ("198.18.5.0/24", &[ext], Ok(())),
        // ...but never another node's underlay address or the underlay itself.
        ("198.18.5.13/32", &[ext], Err(node_address.clone())),
        ("198.18.5.0/25", &[ext], Err(node_address)),
        (
            "198.18.0.128/25",
            &[ext],
            Err(Rejection::Underlay(n("198.18.0.0/24"))),
        ),
    ];
    for (prefix, peers, want) in cases {
        for from in *peers {
            assert_eq!(&ok(*from, prefix), want, "{prefix} from {from}");
        }
    }
    // An external reflector (not a Node): the route counts as the next hop's node's.
    let bird = ip("198.18.0.30");
    for (prefix, next_hop, want) in [
        (blk, b, Ok(())),
        (blk, bird, Err(Rejection::NotBlockOwner(blk))),
        (n("10.244.2.20/32"), c, Ok(())),
        (n("10.244.2.1/32"), b, Err(inside)),
    ] {
        assert_eq!(
            p.evaluate_via(bird, &prefix, Some(next_hop)),
            want,
            "{prefix} via {next_hop}"
        );
    }
}

#[test]
fn accept_prefixes_follow_the_bgppeer_that_wins_the_address() {
    use tern_model::AcceptPrefix;
    let cfg = BgpConfigurationSpec::default();
    let ap = |c: &str, m: Option<u8>| AcceptPrefix {
        cidr: c.into(),
        max_length: m,
    };
    let mut tor = explicit("198.18.0.250", 65001);
    tor.accept_prefixes = vec![ap("0.0.0.0/0", None), ap("10.99.0.0/16", Some(24))];
    let mut tor_again = explicit("198.18.0.250", 65001);
    tor_again.accept_prefixes = vec![ap("192.0.2.0/24", None)];
    let peers = vec![peer("tor", tor), peer("tor-again", tor_again)];
    let p = plan("a", &nodes(), &cfg, &peers, &snap()).unwrap();
    assert_eq!(
        p.accept.get(&ip("198.18.0.250")),
        Some(&vec![(n("0.0.0.0/0"), 0), (n("10.99.0.0/16"), 24)])
    );
    assert_eq!(p.accept.len(), 1, "mesh peers admit nothing extra");
    let mut bad = peers.clone();
    bad[0].spec.accept_prefixes = vec![ap("10.0.0.1/8", None)];
    let e = plan("a", &nodes(), &cfg, &bad, &snap()).unwrap_err();
    assert!(e.to_string().contains("BGPPeer tor: acceptPrefixes"), "{e}");
}

#[test]
fn encapsulating_pools_stay_with_the_reconciler() {
    let pool = |cidr: &str, vx: EncapMode| PoolInfo {
        name: cidr.into(),
        cidr: cidr.parse().unwrap(),
        vxlan: vx,
        ipip: EncapMode::Never,
        nat_outgoing: false,
        disabled: false,
    };
    let pools = vec![
        pool("10.244.0.0/16", EncapMode::Never),
        pool("10.245.0.0/16", EncapMode::Always),
    ];
    assert!(!reconciler_owns(&pools, &"10.244.1.0/26".parse().unwrap()));
    assert!(reconciler_owns(&pools, &"10.245.1.0/26".parse().unwrap()));
    assert!(!reconciler_owns(&pools, &"10.99.0.0/24".parse().unwrap()));
}

/// A node with BGP addresses of either or both families (`/64` for IPv6, `/24` for IPv4).
fn node46(name: &str, v4: Option<&str>, v6: Option<&str>, rr: bool) -> Node {
    let mut n = node(name, v4, rr, &[]);
    let bgp = n.spec.bgp.get_or_insert_with(|| NodeBgpSpec {
        route_reflector_cluster_id: rr.then(|| "224.0.0.1".to_string()),
        ..Default::default()
    });
    bgp.ipv6_address = v6.map(|a| format!("{a}/64"));
    n
}

/// Snapshot with a v4 and a v6 block of a, and a v6 block of b.
fn snap46() -> Snapshot {
    let mut s = snap();
    s.blocks.push(BlockInfo {
        cidr: n("fd00:10:244::40/122"),
        affinity: Some("a".into()),
        allocations: vec![(ip("fd00:10:244::41"), "a".into())],
    });
    s.blocks.push(BlockInfo {
        cidr: n("fd00:10:244::80/122"),
        affinity: Some("b".into()),
        allocations: vec![(ip("fd00:10:244::81"), "b".into())],
    });
    s
}

#[test]
fn dual_stack_mesh_runs_over_ipv4_and_originates_both_families() {
    let ns = vec![
        node46("a", Some("198.18.0.11"), Some("2001:db8::11"), false),
        node46("b", Some("198.18.0.12"), Some("2001:db8::12"), false),
        // Only IPv6: the session with it runs over IPv6.
        node46("c", None, Some("2001:db8::13"), false),
        // Only IPv4.
        node46("d", Some("198.18.0.14"), None, false),
    ];
    let p = plan("a", &ns, &Default::default(), &[], &snap46()).unwrap();
    assert_eq!(p.router_id, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
    assert_eq!(p.v4, Some("198.18.0.11".parse().unwrap()));
    assert_eq!(p.v6, Some("2001:db8::11".parse().unwrap()));
    let addrs: Vec<_> = p.peers.keys().copied().collect();
    assert_eq!(
        addrs,
        vec![ip("198.18.0.12"), ip("198.18.0.14"), ip("2001:db8::13")]
    );
    let o: Vec<String> = p.originate.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        o,
        vec!["10.244.1.0/26", "10.244.2.9/32", "fd00:10:244::40/122"]
    );
    // c (IPv6 only) and d (IPv4 only) share no family: no session between them.
    let pc = plan("c", &ns, &Default::default(), &[], &snap46()).unwrap();
    let addrs: Vec<_> = pc.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("2001:db8::11"), ip("2001:db8::12")]);
    let pd = plan("d", &ns, &Default::default(), &[], &snap46()).unwrap();
    assert_eq!(pd.v6, None);
    let addrs: Vec<_> = pd.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("198.18.0.11"), ip("198.18.0.12")]);
}

#[test]
fn ipv6_only_nodes_hash_their_router_id_and_peer_over_ipv6() {
    // Calico's hashToIPv4: the first four bytes of SHA-256("node1") are 202.18.243.27; for
    // "node16" the first byte, 232, is above 223 and lowered by 32.
    assert_eq!(router_id_hash("node1"), Ipv4Addr::new(202, 18, 243, 27));
    assert_eq!(router_id_hash("node16"), Ipv4Addr::new(200, 251, 245, 244));
    let ns = vec![
        node46("node1", None, Some("2001:db8::11"), false),
        node46("node2", None, Some("2001:db8::12"), false),
        node46("node3", None, None, false),
    ];
    let p = plan("node1", &ns, &Default::default(), &[], &Snapshot::default()).unwrap();
    assert_eq!(p.router_id, router_id_hash("node1"));
    assert_eq!((p.v4, p.v6), (None, Some("2001:db8::11".parse().unwrap())));
    let addrs: Vec<_> = p.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("2001:db8::12")]);
    assert_eq!(p.peers[&ip("2001:db8::12")].1, PeerKind::Mesh);
    // Two nodes, two router IDs (the hash is of the name).
    let p2 = plan("node2", &ns, &Default::default(), &[], &Snapshot::default()).unwrap();
    assert_ne!(p.router_id, p2.router_id);
    // A node with no address of either family is still an error, naming both fields.
    let e = plan("node3", &ns, &Default::default(), &[], &Snapshot::default()).unwrap_err();
    assert!(matches!(e, BgpError::NoAddress(_)));
    assert!(e.to_string().contains("ipv6Address"), "{e}");
}

#[test]
fn ipv6_route_reflector_has_ipv6_clients() {
    let ns = vec![
        node46("a", None, Some("2001:db8::11"), false),
        node46("b", None, Some("2001:db8::12"), false),
        node46("rr", None, Some("2001:db8::20"), true),
    ];
    let cfg = BgpConfigurationSpec {
        node_to_node_mesh_enabled: false,
        ..Default::default()
    };
    // Every node peers with the reflectors (Calico's peerSelector / nodeSelector pair).
    let to_rr = BgpPeerSpec {
        node_selector: Some("all()".into()),
        peer_selector: Some("has(rr)".into()),
        ..Default::default()
    };
    let rr_to_all = BgpPeerSpec {
        node_selector: Some("has(rr)".into()),
        peer_selector: Some("all()".into()),
        ..Default::default()
    };
    let mut ns = ns;
    ns[2].metadata.labels.insert("rr".into(), "yes".into());
    let peers = vec![peer("to-rr", to_rr), peer("rr-to-all", rr_to_all)];
    let pr = plan("rr", &ns, &cfg, &peers, &Snapshot::default()).unwrap();
    assert_eq!(pr.cluster_id, Some("224.0.0.1".parse().unwrap()));
    let clients: Vec<_> = pr
        .peers
        .iter()
        .map(|(a, (c, _))| (*a, c.rr_client))
        .collect();
    assert_eq!(
        clients,
        vec![(ip("2001:db8::11"), true), (ip("2001:db8::12"), true)]
    );
    let pa = plan("a", &ns, &cfg, &peers, &Snapshot::default()).unwrap();
    let addrs: Vec<_> = pa.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("2001:db8::20")]);
    assert!(!pa.peers[&ip("2001:db8::20")].0.rr_client);
}

#[test]
fn explicit_ipv6_peers_apply_to_nodes_with_ipv6() {
    let ns = vec![
        node46("a", Some("198.18.0.11"), Some("2001:db8::11"), false),
        node46("d", Some("198.18.0.14"), None, false),
    ];
    let cfg = BgpConfigurationSpec {
        node_to_node_mesh_enabled: false,
        ..Default::default()
    };
    let mut tor6 = explicit("2001:db8::250", 65001);
    tor6.password = Some("pw".into());
    let peers = vec![
        peer("tor6", tor6),
        peer("tor6-port", explicit("[2001:db8::251]:2179", 65002)),
        peer("tor4", explicit("198.18.0.250", 65001)),
        // Our own address is never a peer.
        peer("self", explicit("2001:db8::11", 64512)),
    ];
    let p = plan("a", &ns, &cfg, &peers, &Snapshot::default()).unwrap();
    let addrs: Vec<_> = p.peers.keys().copied().collect();
    assert_eq!(
        addrs,
        vec![ip("198.18.0.250"), ip("2001:db8::250"), ip("2001:db8::251")]
    );
    let t = &p.peers[&ip("2001:db8::250")];
    assert_eq!((t.1, t.0.asn, t.0.port), (PeerKind::Global, 65001, 179));
    assert_eq!(t.0.password.as_deref(), Some("pw"));
    assert_eq!(p.peers[&ip("2001:db8::251")].0.port, 2179);
    // A node without IPv6 has nothing to run an IPv6 session from: left out, as Calico.
    let pd = plan("d", &ns, &cfg, &peers, &Snapshot::default()).unwrap();
    let addrs: Vec<_> = pd.peers.keys().copied().collect();
    assert_eq!(addrs, vec![ip("198.18.0.250")]);
}

/// The import policy of dual-stack node a for IPv6: pool fd00:10:244::/48 in /122 blocks, a's
/// block ::40/122, b's block ::80/122, underlay 2001:db8::/64.
#[test]
fn import_policy_for_ipv6_as_for_ipv4() {
    let mut s = snap46();
    s.nodes = ["a", "b", "c"]
        .iter()
        .zip([
            ["198.18.0.11/24", "2001:db8::11/64"],
            ["198.18.0.12/24", "2001:db8::12/64"],
            ["198.18.0.13/24", "2001:db8::13/64"],
        ])
        .map(|(name, a)| NodeInfo {
            name: name.to_string(),
            addresses: a.iter().map(|a| n(a)).collect(),
            ..NodeInfo::default()
        })
        .collect();
    let pools = vec![
        PoolRange {
            cidr: n("10.244.0.0/16"),
            block_size: 26,
            disabled: false,
        },
        PoolRange {
            cidr: n("fd00:10:244::/48"),
            block_size: 122,
            disabled: false,
        },
    ];
    let tor6 = ip("2001:db8::250");
    let mut accept = BTreeMap::new();
    accept.insert(tor6, vec![(n("::/0"), 0), (n("2001:db8:99::/48"), 64)]);
    let mut p = ImportPolicy::new(
        "a",
        &s,
        pools,
        vec![n("198.18.0.0/24"), n("2001:db8::/64"), n("fe80::/64")],
        accept,
    );
    p.set_peer_nodes(&[
        node46("b", Some("198.18.0.12"), Some("2001:db8::12"), false),
        node46("c", Some("198.18.0.13"), Some("2001:db8::13"), false),
        node46("rr", None, Some("2001:db8::20"), true),
    ]);
    let (b4, b6, c6, rr) = (
        ip("198.18.0.12"),
        ip("2001:db8::12"),
        ip("2001:db8::13"),
        ip("2001:db8::20"),
    );
    let blk = n("fd00:10:244::80/122");
    let cases: &[(&str, &[IpAddr], Result<(), Rejection>)] = &[
        // b's block from b, over its IPv4 or its IPv6 session, or relayed by the reflector.
        ("fd00:10:244::80/122", &[b4, b6, rr], Ok(())),
        // A block in no known allocation yet, at block size or longer.
        ("fd00:10:244::1000/122", &[b6], Ok(())),
        ("fd00:10:244::1000/128", &[b6], Ok(())),
        // Not b's block from c.
        (
            "fd00:10:244::80/122",
            &[c6],
            Err(Rejection::NotBlockOwner(blk)),
        ),
        // A more specific inside b's block: refused from anyone.
        (
            "fd00:10:244::80/123",
            &[b6, rr],
            Err(Rejection::InsideRemoteBlock(blk)),
        ),
        // Shorter than blockSize.
        (
            "fd00:10:244::/64",
            &[b6],
            Err(Rejection::ShorterThanBlock {
                pool: n("fd00:10:244::/48"),
                block_size: 122,
            }),
        ),
        // Our own block and our pod: never, whoever sends it.
        (
            "fd00:10:244::40/122",
            &[b6, tor6],
            Err(Rejection::OwnBlock(n("fd00:10:244::40/122"))),
        ),
        (
            "fd00:10:244::41/128",
            &[b6],
            Err(Rejection::OwnBlock(n("fd00:10:244::40/122"))),
        ),
        // Outside every pool, the default route, the underlay, a node's address.
        ("2001:db8:99::/64", &[b6], Err(Rejection::OutsidePools)),
        ("::/0", &[b6], Err(Rejection::DefaultRoute)),
        (
            "2001:db8::/64",
            &[b6, tor6],
            Err(Rejection::Underlay(n("2001:db8::/64"))),
        ),
        (
            "2001:db8::13/128",
            &[tor6],
            Err(Rejection::Underlay(n("2001:db8::/64"))),
        ),
        // The ToR's acceptPrefixes admit what they list.
        ("::/0", &[tor6], Ok(())),
        ("2001:db8:99::/64", &[tor6], Ok(())),
        ("2001:db8:99::/65", &[tor6], Err(Rejection::OutsidePools)),
    ];
    for (prefix, peers, want) in cases {
        for from in *peers {
            assert_eq!(&p.evaluate(*from, &n(prefix)), want, "{prefix} from {from}");
        }
    }
    // An external reflector: b's block counts as b's when the next hop is b's IPv6 address.
    let bird = ip("2001:db8::30");
    assert_eq!(p.evaluate_via(bird, &blk, Some(b6)), Ok(()));
    assert_eq!(
        p.evaluate_via(bird, &blk, Some(bird)),
        Err(Rejection::NotBlockOwner(blk))
    );
}
