//! Every shape renders as the text the compiler wrote before it was typed (pinned by the
//! policy crate's golden files), and diffs keep their transaction order.

use std::net::IpAddr;

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn v4s() -> Addr {
    Addr::saddr(Family::V4)
}

#[test]
fn rules_render_as_nft_writes_them() {
    let cases: Vec<(Rule, &str)> = vec![
        (Rule::verdict(Verdict::Drop), "drop"),
        (
            Rule::verdict(Verdict::Jump("pol-0123456789ab-in".into())),
            "jump pol-0123456789ab-in",
        ),
        (
            Rule::new(vec![], vec![Stmt::MarkAnd(!0x0001_0000)]),
            "meta mark set meta mark and 0xfffeffff",
        ),
        (
            Rule::new(
                vec![Match::MarkAll(0x0001_0000)],
                vec![Stmt::Verdict(Verdict::Return)],
            ),
            "meta mark and 0x10000 == 0x10000 return",
        ),
        (
            Rule::new(
                vec![Match::AddrProtoDportInSet {
                    addr: Addr::daddr(Family::V6),
                    set: "fp-out-x-v6".into(),
                }],
                vec![Stmt::Verdict(Verdict::Return)],
            ),
            "ip6 daddr . meta l4proto . th dport @fp-out-x-v6 return",
        ),
        (
            Rule::new(
                vec![Match::CtState(CtState::ESTABLISHED.or(CtState::RELATED))],
                vec![Stmt::Verdict(Verdict::Accept)],
            ),
            "ct state established,related accept",
        ),
        (
            Rule::new(
                vec![Match::CtState(CtState::INVALID)],
                vec![Stmt::Verdict(Verdict::Drop)],
            ),
            "ct state invalid drop",
        ),
        (
            Rule::new(
                vec![],
                vec![Stmt::Vmap {
                    iface: Iface::In,
                    map: "ep-out".into(),
                }],
            ),
            "iifname vmap @ep-out",
        ),
        (
            Rule::new(
                vec![
                    Match::L4Proto(L4Proto::Tcp),
                    Match::AddrInNets {
                        addr: v4s(),
                        negate: false,
                        nets: vec!["198.51.100.0/24".parse().unwrap()],
                    },
                    Match::AddrInNets {
                        addr: v4s(),
                        negate: true,
                        nets: vec!["198.51.100.128/25".parse().unwrap()],
                    },
                    Match::DportIn(vec![PortRange::one(80), PortRange::new(8000, 8090)]),
                ],
                vec![Stmt::Verdict(Verdict::Accept)],
            ),
            "meta l4proto tcp ip saddr { 198.51.100.0/24 } ip saddr != { 198.51.100.128/25 } th dport { 80, 8000-8090 } accept",
        ),
        (
            Rule::new(
                vec![
                    Match::L4Proto(L4Proto::Icmpv6),
                    Match::AddrInSet {
                        addr: Addr::saddr(Family::V6),
                        negate: false,
                        set: "sel-a-v6".into(),
                    },
                    Match::AddrDportInSet {
                        addr: Addr::daddr(Family::V6),
                        set: "np-b-v6".into(),
                    },
                ],
                vec![Stmt::MarkOr(0x0001_0000), Stmt::Verdict(Verdict::Return)],
            ),
            "meta l4proto ipv6-icmp ip6 saddr @sel-a-v6 ip6 daddr . th dport @np-b-v6 meta mark set meta mark or 0x10000 return",
        ),
        (
            Rule::new(
                vec![Match::L4Proto(L4Proto::Number(47))],
                vec![Stmt::Log {
                    prefix: "tern 0123-i0: ".into(),
                }],
            ),
            "meta l4proto 47 log prefix \"tern 0123-i0: \"",
        ),
        (
            Rule::new(
                Vec::new(),
                vec![
                    Stmt::LogGroup {
                        prefix: "t:0123456789ab:e:2:a".into(),
                        group: 7,
                        snaplen: 96,
                    },
                    Stmt::MarkOr(0x0001_0000),
                    Stmt::Verdict(Verdict::Return),
                ],
            ),
            "log prefix \"t:0123456789ab:e:2:a\" group 7 snaplen 96 meta mark set meta mark or 0x10000 return",
        ),
        (
            Rule::new(
                vec![
                    Match::AddrInSet {
                        addr: v4s(),
                        negate: false,
                        set: "masq-ipv4-pools".into(),
                    },
                    Match::AddrInSet {
                        addr: Addr::daddr(Family::V4),
                        negate: true,
                        set: "all-ipv4-pools".into(),
                    },
                ],
                vec![Stmt::Masquerade],
            )
            .with_comment("tern natOutgoing"),
            "ip saddr @masq-ipv4-pools ip daddr != @all-ipv4-pools masquerade comment \"tern natOutgoing\"",
        ),
    ];
    for (rule, text) in cases {
        assert_eq!(rule.to_string(), text);
    }
}

#[test]
fn declarations_render_as_nft_writes_them() {
    let four = SetType::addr(Family::V4);
    assert_eq!(four.to_string(), "type ipv4_addr;");
    assert_eq!(
        SetType::of(&[DataType::Ipv6Addr, DataType::InetService]).to_string(),
        "type ipv6_addr . inet_service;"
    );
    assert_eq!(
        SetType::of(&[
            DataType::Ipv4Addr,
            DataType::InetProto,
            DataType::InetService
        ])
        .interval()
        .to_string(),
        "type ipv4_addr . inet_proto . inet_service; flags interval;"
    );
    assert_eq!(
        four.auto_merge().to_string(),
        "type ipv4_addr; flags interval; auto-merge;"
    );
    assert_eq!(SetType::ifname_vmap().to_string(), "type ifname : verdict;");
    let filter = BaseChain {
        chain_type: ChainType::Filter,
        hook: Hook::Forward,
        priority: -5,
        policy: ChainPolicy::Accept,
    };
    assert_eq!(
        filter.to_string(),
        "type filter hook forward priority -5; policy accept;"
    );
    let nat = BaseChain {
        chain_type: ChainType::Nat,
        hook: Hook::Postrouting,
        priority: 100,
        policy: ChainPolicy::Accept,
    };
    assert_eq!(
        nat.to_string(),
        "type nat hook postrouting priority srcnat; policy accept;"
    );
}

#[test]
fn keys_render_as_nft_writes_them() {
    let range = |a: &str, b: &str| AddrRange {
        first: ip(a),
        last: ip(b),
    };
    assert_eq!(
        range("10.0.0.0", "10.255.255.255").to_string(),
        "10.0.0.0/8"
    );
    assert_eq!(range("10.0.0.0", "10.0.0.0").to_string(), "10.0.0.0");
    assert_eq!(
        range("10.0.0.0", "10.0.0.5").to_string(),
        "10.0.0.0-10.0.0.5"
    );
    assert_eq!(range("0.0.0.0", "255.255.255.255").to_string(), "0.0.0.0/0");
    assert_eq!(
        range("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff").to_string(),
        "::/0"
    );
    let k = Key::AddrProtoPort {
        addr: range("0.0.0.1", "0.0.0.1"),
        proto: Span::new(0, 255),
        port: PortRange::new(0, 65535),
    };
    assert_eq!(k.to_string(), "0.0.0.1 . 0-255 . 0-65535");
    assert_eq!(Key::AddrPort(ip("fd00::1"), 53).to_string(), "fd00::1 . 53");
    assert_eq!(
        Key::Net("10.0.0.1/32".parse().unwrap()).to_string(),
        "10.0.0.1/32"
    );
    let e = Element {
        key: Key::Ifname("tern1".into()),
        verdict: Some(Verdict::Jump("ep-in-tern1".into())),
    };
    assert_eq!(e.to_string(), "\"tern1\" : jump ep-in-tern1");
}

fn table() -> Ruleset {
    let mut rs = Ruleset::new();
    rs.chains.insert(
        "filter-forward".into(),
        Chain {
            base: Some(BaseChain {
                chain_type: ChainType::Filter,
                hook: Hook::Forward,
                priority: -5,
                policy: ChainPolicy::Accept,
            }),
            rules: vec![Rule::new(
                vec![],
                vec![Stmt::Vmap {
                    iface: Iface::Out,
                    map: "ep-in".into(),
                }],
            )],
        },
    );
    rs.chains.insert(
        "ep-in-a".into(),
        Chain::regular(vec![Rule::verdict(Verdict::Drop)]),
    );
    let mut m = Set::new(SetType::ifname_vmap());
    m.insert_mapping(Key::Ifname("a".into()), Verdict::Jump("ep-in-a".into()));
    rs.sets.insert("ep-in".into(), m);
    let mut s = Set::new(SetType::addr(Family::V4));
    // Key text order differs from address order: 10.0.0.10 < 10.0.0.9 as text.
    for a in ["10.0.0.9", "10.0.0.10"] {
        s.insert(Key::Addr(ip(a)));
    }
    rs.sets.insert("sel-x-v4".into(), s);
    rs
}

#[test]
fn full_script_lists_declarations_rules_then_elements_sorted_by_text() {
    assert_eq!(
        table().render_full(),
        "add table inet tern\n\
         delete table inet tern\n\
         add table inet tern\n\
         add chain inet tern ep-in-a\n\
         add chain inet tern filter-forward { type filter hook forward priority -5; policy accept; }\n\
         add map inet tern ep-in { type ifname : verdict; }\n\
         add set inet tern sel-x-v4 { type ipv4_addr; }\n\
         add rule inet tern ep-in-a drop\n\
         add rule inet tern filter-forward oifname vmap @ep-in\n\
         add element inet tern ep-in { \"a\" : jump ep-in-a }\n\
         add element inet tern sel-x-v4 { 10.0.0.10, 10.0.0.9 }\n"
    );
    // As given, a run keeps its order.
    let changes = table().full_changes();
    let text = render_changes(&changes);
    assert!(
        text.ends_with("add element inet tern sel-x-v4 { 10.0.0.9, 10.0.0.10 }\n"),
        "{text}"
    );
}

#[test]
fn deltas_add_before_use_and_delete_after_last_use() {
    let old = table();
    let mut new = table();
    // A second endpoint chain and its map entry; one address leaves, one joins; a new set.
    new.chains.insert(
        "ep-in-b".into(),
        Chain::regular(vec![Rule::verdict(Verdict::Drop)]),
    );
    new.sets
        .get_mut("ep-in")
        .unwrap()
        .insert_mapping(Key::Ifname("b".into()), Verdict::Jump("ep-in-b".into()));
    let sel = new.sets.get_mut("sel-x-v4").unwrap();
    sel.elements.remove(&Key::Addr(ip("10.0.0.9")));
    sel.insert(Key::Addr(ip("10.0.0.11")));
    new.sets
        .insert("sel-y-v6".into(), Set::new(SetType::addr(Family::V6)));
    assert_eq!(
        render_delta(&old, &new),
        "add chain inet tern ep-in-b\n\
         add set inet tern sel-y-v6 { type ipv6_addr; }\n\
         add element inet tern sel-x-v4 { 10.0.0.11 }\n\
         add rule inet tern ep-in-b drop\n\
         add element inet tern ep-in { \"b\" : jump ep-in-b }\n\
         delete element inet tern sel-x-v4 { 10.0.0.9 }\n"
    );
    // And back: map entry out, then the chain (flushed, then deleted), then the set.
    assert_eq!(
        render_delta(&new, &old),
        "delete element inet tern ep-in { \"b\" }\n\
         add element inet tern sel-x-v4 { 10.0.0.9 }\n\
         delete element inet tern sel-x-v4 { 10.0.0.11 }\n\
         flush chain inet tern ep-in-b\n\
         delete chain inet tern ep-in-b\n\
         delete set inet tern sel-y-v6\n"
    );
    assert_eq!(render_delta(&old, &old), "");
    // A redeclared set: only a full resync.
    let mut re = old.clone();
    re.sets.get_mut("sel-x-v4").unwrap().set_type = SetType::addr(Family::V4).interval();
    assert!(old.redeclares(&re) && re.redeclares(&old));
    assert_eq!(delta_changes(&old, &re), None);
    assert_eq!(render_delta(&old, &re), re.render_full());
}

#[test]
fn interval_sets_remove_first_and_auto_merge_sets_are_refilled() {
    let net = |s: &str| Key::Net(s.parse().unwrap());
    let mut old = Ruleset::new();
    let mut iv = Set::new(SetType::addr(Family::V4).interval());
    iv.insert(net("10.0.0.0/8"));
    old.sets.insert("iv".into(), iv);
    let mut am = Set::new(SetType::addr(Family::V4).auto_merge());
    am.insert(net("10.244.0.0/16"));
    am.insert(net("10.96.0.0/16"));
    old.sets.insert("pools".into(), am);
    let mut new = old.clone();
    let iv = new.sets.get_mut("iv").unwrap();
    iv.elements.clear();
    iv.insert(net("10.0.0.0/7"));
    let am = new.sets.get_mut("pools").unwrap();
    am.insert(net("10.245.0.0/16"));
    assert_eq!(
        render_delta(&old, &new),
        "delete element inet tern iv { 10.0.0.0/8 }\n\
         add element inet tern iv { 10.0.0.0/7 }\n\
         flush set inet tern pools\n\
         add element inet tern pools { 10.244.0.0/16, 10.245.0.0/16, 10.96.0.0/16 }\n"
    );
}
