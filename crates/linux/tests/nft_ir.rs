//! Our nft text and our netlink encoding of the same typed table must agree: each table (a
//! rich one with every shape tern writes, and random ones) is applied once with `nft -f`
//! (its rendered text) in one private network namespace and once over netlink
//! (`NftSocket::apply_changes`) in another, and what the kernels report must be equal:
//! `nft -j list table inet tern` (handles removed, elements sorted) and, stricter, the
//! expressions and set entries the kernel holds (`nft --debug=netlink list table`). Deltas
//! between two tables are compared the same way after both namespaces applied the first.
//!
//! Each namespace is made by `unshare(CLONE_NEWNET)` on a thread of its own, which dies
//! with the thread: the machine's namespaces are never touched. Root and `nft` only.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use proptest::prelude::*;
use tern_nft::{
    Addr, AddrRange, BaseChain, Chain, ChainPolicy, ChainType, CtState, Family, Hook, Iface, Key,
    L4Proto, Match, PortRange, Rule, Ruleset, Set, SetType, Span, Stmt, TableChange, Verdict,
};

/// Runs `f` on a thread of its own inside a fresh network namespace of that thread.
fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tern_testkit::thread_for_test()
        .spawn(move || {
            // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
            assert_eq!(
                rc,
                0,
                "unshare(CLONE_NEWNET): {}",
                std::io::Error::last_os_error()
            );
            f()
        })
        .unwrap()
        .join()
        .unwrap()
}

/// Root and `nft`, or the test fails (tern-testkit).
fn can_run() {
    tern_testkit::need_root();
    tern_testkit::need_binary("nft");
}

/// Removes handles and sorts element lists (hash sets list in no particular order).
fn normalise_json(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("handle");
            for (k, x) in m.iter_mut() {
                normalise_json(x);
                if (k == "elem" || k == "set")
                    && let serde_json::Value::Array(a) = x
                {
                    a.sort_by_key(|e| e.to_string());
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(normalise_json),
        _ => {}
    }
}

/// The kernel's table twice: as `nft -j` lists it (normalised), and as the expressions and
/// set entries it holds (rule handles removed, each set's entries sorted).
#[derive(Debug, PartialEq, Eq)]
struct Listing {
    json: String,
    netlink: String,
}

fn listing() -> Listing {
    let mut v: serde_json::Value = serde_json::from_str(&tern_testkit::nft::output(&[
        "-j", "list", "table", "inet", "tern",
    ]))
    .unwrap();
    normalise_json(&mut v);
    let raw = tern_testkit::nft::output(&["--debug=netlink", "list", "table", "inet", "tern"]);
    let mut out: Vec<String> = Vec::new();
    let mut entries: Vec<String> = Vec::new();
    // What follows the expressions is the table as text, which `json` covers (with elements
    // sorted: an interval concatenation lists them in the order they were added).
    for line in raw
        .lines()
        .take_while(|l| !l.starts_with("table inet tern"))
    {
        if line.starts_with('\t') && line.trim_start().starts_with("element") {
            entries.push(line.to_string());
            continue;
        }
        entries.sort();
        out.append(&mut entries);
        // `inet tern CHAIN HANDLE [POSITION]`: the chain alone.
        if let Some(rest) = line.strip_prefix("inet tern ")
            && !rest.starts_with('@')
        {
            out.push(format!(
                "inet tern {}",
                rest.split_whitespace().next().unwrap_or("")
            ));
            continue;
        }
        out.push(line.to_string());
    }
    entries.sort();
    out.append(&mut entries);
    Listing {
        json: serde_json::to_string_pretty(&v).unwrap(),
        netlink: out.join("\n"),
    }
}

/// Applies `first` (and then `then`) by text in one namespace and over netlink in another;
/// the kernels' listings after `then`.
fn both_ways(first: Ruleset, then: Option<Ruleset>) -> (Listing, Listing) {
    let (f, t) = (first.clone(), then.clone());
    let by_text = in_netns(move || {
        tern_testkit::nft::apply(&f.render_full());
        if let Some(t) = &t {
            let delta = tern_nft::render_delta(&f, t);
            if !delta.is_empty() {
                tern_testkit::nft::apply(&delta);
            }
        }
        listing()
    });
    let by_netlink = in_netns(move || {
        let mut s = tern_linux::nft_netlink::NftSocket::new().unwrap();
        s.apply("tern", &first.full_changes())
            .unwrap_or_else(|e| panic!("full apply over netlink: {e}"));
        if let Some(t) = &then {
            let changes = tern_nft::delta_changes(&first, t).unwrap_or_else(|| t.full_changes());
            s.apply("tern", &changes)
                .unwrap_or_else(|e| panic!("delta over netlink: {e}"));
        }
        listing()
    });
    (by_text, by_netlink)
}

/// The lines only one side has, for a readable failure.
fn line_diff(a: &str, b: &str) -> String {
    let only = |x: &str, y: &str| -> Vec<String> {
        let ys: std::collections::BTreeSet<&str> = y.lines().collect();
        x.lines()
            .filter(|l| !ys.contains(l))
            .map(str::to_string)
            .collect()
    };
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let first = al
        .iter()
        .zip(&bl)
        .position(|(x, y)| x != y)
        .unwrap_or(al.len().min(bl.len()));
    let around = |v: &[&str]| v[first.saturating_sub(4)..(first + 8).min(v.len())].join("\n");
    format!(
        "only by nft -f:\n{}\nonly by netlink:\n{}\nfirst difference, line {first}:\n--- nft -f\n{}\n--- netlink\n{}",
        only(a, b).join("\n"),
        only(b, a).join("\n"),
        around(&al),
        around(&bl)
    )
}

/// `listing` without the end entries at 0 of interval sets. nft adds one with the first
/// elements of an interval set that was empty; the netlink encoding, which does not know the
/// kernel's elements, only when the set was created or flushed in the same batch. The entry
/// bounds nothing (a key below every interval matches none either way), so tables that differ
/// in it alone match the same packets; deltas are compared without it.
fn without_zero_ends(l: &Listing) -> Listing {
    let zero = |line: &&str| {
        let t = line.trim();
        !(t.starts_with("element 00000000")
            && t.ends_with(": 1 [end]")
            && t["element ".len()..t.len() - ": 1 [end]".len()]
                .split_whitespace()
                .all(|w| w == "00000000"))
    };
    Listing {
        json: l.json.clone(),
        netlink: l
            .netlink
            .lines()
            .filter(zero)
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn assert_same(ctx: &str, text: &Listing, netlink: &Listing) {
    assert!(
        text.json == netlink.json,
        "{ctx}: nft -j list differs\n{}\n\nwhole listing by nft -f:\n{}",
        line_diff(&text.json, &netlink.json),
        text.netlink
    );
    assert!(
        text.netlink == netlink.netlink,
        "{ctx}: kernel expressions / entries differ\n{}\n\nwhole listing by nft -f:\n{}",
        line_diff(&text.netlink, &netlink.netlink),
        text.netlink
    );
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn accept() -> Stmt {
    Stmt::Verdict(Verdict::Accept)
}

const FORWARD: BaseChain = BaseChain {
    chain_type: ChainType::Filter,
    hook: Hook::Forward,
    priority: -5,
    policy: ChainPolicy::Accept,
};

const NAT: BaseChain = BaseChain {
    chain_type: ChainType::Nat,
    hook: Hook::Postrouting,
    priority: 100,
    policy: ChainPolicy::Accept,
};

/// Every shape the compiler, its fast path and natOutgoing write.
fn rich() -> Ruleset {
    let mut rs = Ruleset::new();
    let v4 = Family::V4;
    let v6 = Family::V6;
    let mut sets: BTreeMap<&str, Set> = BTreeMap::new();
    let mut sel4 = Set::new(SetType::addr(v4));
    for a in ["198.18.0.1", "198.18.0.9", "198.18.0.10"] {
        sel4.insert(Key::Addr(ip(a)));
    }
    sets.insert("sel-a-v4", sel4);
    let mut sel6 = Set::new(SetType::addr(v6));
    sel6.insert(Key::Addr(ip("fd00::1")));
    sets.insert("sel-a-v6", sel6);
    let mut np4 = Set::new(SetType::addr_port(v4));
    np4.insert(Key::AddrPort(ip("198.18.0.1"), 80));
    np4.insert(Key::AddrPort(ip("198.18.0.2"), 8080));
    sets.insert("np-a-v4", np4);
    let mut np6 = Set::new(SetType::addr_port(v6));
    np6.insert(Key::AddrPort(ip("fd00::2"), 443));
    sets.insert("np-a-v6", np6);
    let range = |a: &str, b: &str| AddrRange {
        first: ip(a),
        last: ip(b),
    };
    let mut fp4 = Set::new(SetType::addr_proto_port(v4));
    fp4.insert(Key::AddrProtoPort {
        addr: range("10.0.0.0", "10.255.255.255"),
        proto: Span::one(6),
        port: PortRange::new(80, 90),
    });
    fp4.insert(Key::AddrProtoPort {
        addr: range("11.0.0.1", "11.0.0.5"),
        proto: Span::new(0, 255),
        port: PortRange::new(0, 65535),
    });
    fp4.insert(Key::AddrProtoPort {
        addr: range("12.0.0.1", "12.0.0.1"),
        proto: Span::one(17),
        port: PortRange::one(53),
    });
    sets.insert("fp-in-a-v4", fp4);
    let mut fp6 = Set::new(SetType::addr_proto_port(v6));
    fp6.insert(Key::AddrProtoPort {
        addr: range("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        proto: Span::new(0, 255),
        port: PortRange::new(0, 65535),
    });
    sets.insert("fp-out-a-v6", fp6);
    for fam in ["ipv4", "ipv6"] {
        let t = SetType::addr(if fam == "ipv4" { v4 } else { v6 }).auto_merge();
        let mut all = Set::new(t);
        let mut masq = Set::new(t);
        let nets: &[&str] = if fam == "ipv4" {
            // Adjacent (merged into a /15), overlapping, and one reaching the end.
            &[
                "10.244.0.0/16",
                "10.245.0.0/16",
                "10.96.0.0/12",
                "10.100.0.0/16",
                "255.255.255.0/24",
            ]
        } else {
            &["fd00::/64", "fd00:0:0:1::/64", "ffff::/16"]
        };
        for n in nets {
            all.insert(Key::Net(net(n)));
        }
        masq.insert(Key::Net(net(nets[0])));
        sets.insert(
            if fam == "ipv4" {
                "all-ipv4-pools"
            } else {
                "all-ipv6-pools"
            },
            all,
        );
        sets.insert(
            if fam == "ipv4" {
                "masq-ipv4-pools"
            } else {
                "masq-ipv6-pools"
            },
            masq,
        );
    }
    let mut iv = Set::new(SetType::addr(v4).interval());
    for n in ["192.0.2.0/24", "198.51.100.7/32", "240.0.0.0/4"] {
        iv.insert(Key::Net(net(n)));
    }
    sets.insert("iv-v4", iv);
    for (n, s) in sets {
        rs.sets.insert(n.into(), s);
    }
    // Endpoint chains and the maps jumping to them.
    let mut ep_in = Set::new(SetType::ifname_vmap());
    let mut ep_out = Set::new(SetType::ifname_vmap());
    rs.chains.insert(
        "ep-in-tern1".into(),
        Chain::regular(vec![
            Rule::new(
                vec![Match::AddrProtoDportInSet {
                    addr: Addr::saddr(v4),
                    set: "fp-in-a-v4".into(),
                }],
                vec![accept()],
            ),
            Rule::verdict(Verdict::Jump("pol-a-in".into())),
            Rule::verdict(Verdict::Drop),
        ]),
    );
    ep_in.insert_mapping(
        Key::Ifname("tern1".into()),
        Verdict::Jump("ep-in-tern1".into()),
    );
    rs.chains.insert(
        "ep-out-tern1".into(),
        Chain::regular(vec![
            Rule::new(vec![], vec![Stmt::MarkAnd(!0x0001_0000)]),
            Rule::new(
                vec![Match::AddrProtoDportInSet {
                    addr: Addr::daddr(v6),
                    set: "fp-out-a-v6".into(),
                }],
                vec![Stmt::Verdict(Verdict::Return)],
            ),
            Rule::verdict(Verdict::Jump("pol-a-out".into())),
            Rule::new(
                vec![Match::MarkAll(0x0001_0000)],
                vec![Stmt::Verdict(Verdict::Return)],
            ),
            Rule::verdict(Verdict::Drop),
        ]),
    );
    ep_out.insert_mapping(
        Key::Ifname("tern1".into()),
        Verdict::Jump("ep-out-tern1".into()),
    );
    rs.sets.insert("ep-in".into(), ep_in);
    rs.sets.insert("ep-out".into(), ep_out);
    // Policy chains.
    let nets = |ns: &[&str]| ns.iter().map(|n| net(n)).collect::<Vec<_>>();
    let mut pol_in = Vec::new();
    for (proto, fam) in [
        (L4Proto::Tcp, v4),
        (L4Proto::Udp, v6),
        (L4Proto::Sctp, v4),
        (L4Proto::UdpLite, v6),
        (L4Proto::Icmp, v4),
        (L4Proto::Icmpv6, v6),
        (L4Proto::Number(47), v4),
    ] {
        pol_in.push(Rule::new(
            vec![
                Match::L4Proto(proto),
                Match::AddrInSet {
                    addr: Addr::saddr(fam),
                    negate: false,
                    set: format!("sel-a-{}", if fam == v4 { "v4" } else { "v6" }),
                },
            ],
            vec![accept()],
        ));
    }
    for (single, negate) in [
        ("198.51.100.0/24", false),
        ("198.51.100.128/25", true),
        ("10.0.0.1/32", false),
        ("0.0.0.0/0", true),
        ("10.0.0.0/8", true),
        ("10.0.0.0/7", false),
        ("fd00::/64", false),
        ("fd00::/60", true),
        ("::/0", false),
        ("fd00::1/128", true),
    ] {
        let fam = Family::of_net(&net(single));
        pol_in.push(Rule::new(
            vec![Match::AddrInNets {
                addr: Addr::saddr(fam),
                negate,
                nets: nets(&[single]),
            }],
            vec![accept()],
        ));
    }
    pol_in.push(Rule::new(
        vec![
            Match::L4Proto(L4Proto::Tcp),
            Match::AddrInSet {
                addr: Addr::saddr(v4),
                negate: false,
                set: "sel-a-v4".into(),
            },
            Match::AddrInNets {
                addr: Addr::saddr(v4),
                negate: false,
                nets: nets(&["10.0.0.0/8", "10.1.0.0/16", "11.0.0.0/8", "192.168.1.7/32"]),
            },
            Match::AddrInNets {
                addr: Addr::saddr(v4),
                negate: true,
                nets: nets(&["10.2.0.0/16", "10.3.0.0/16", "255.255.255.0/24"]),
            },
            Match::DportIn(vec![
                PortRange::one(80),
                PortRange::one(443),
                PortRange::new(8000, 8090),
                PortRange::one(8080),
            ]),
        ],
        vec![accept()],
    ));
    pol_in.push(Rule::new(
        vec![
            Match::AddrInNets {
                addr: Addr::daddr(v6),
                negate: false,
                nets: nets(&["fd00::/8", "ffff::/16"]),
            },
            Match::DportIn(vec![PortRange::one(80), PortRange::one(443)]),
        ],
        vec![Stmt::Verdict(Verdict::Drop)],
    ));
    for ports in [
        vec![PortRange::one(53)],
        vec![PortRange::new(8000, 8090)],
        vec![PortRange::new(0, 65535)],
        vec![PortRange::one(80), PortRange::one(81)],
    ] {
        pol_in.push(Rule::new(vec![Match::DportIn(ports)], vec![accept()]));
    }
    for fam in [v4, v6] {
        let suffix = if fam == v4 { "v4" } else { "v6" };
        pol_in.push(Rule::new(
            vec![
                Match::L4Proto(L4Proto::Tcp),
                Match::AddrInSet {
                    addr: Addr::saddr(fam),
                    negate: false,
                    set: format!("sel-a-{suffix}"),
                },
                Match::AddrDportInSet {
                    addr: Addr::daddr(fam),
                    set: format!("np-a-{suffix}"),
                },
            ],
            vec![accept()],
        ));
    }
    pol_in.push(Rule::new(
        vec![Match::L4Proto(L4Proto::Tcp)],
        vec![Stmt::Log {
            prefix: "tern 0123456789ab-i7: ".into(),
        }],
    ));
    pol_in.push(Rule::new(
        vec![Match::L4Proto(L4Proto::Udp)],
        vec![
            Stmt::LogGroup {
                prefix: "t:0123456789ab:i:3:d".into(),
                group: 7,
                snaplen: 96,
            },
            Stmt::Verdict(Verdict::Drop),
        ],
    ));
    pol_in.push(Rule::verdict(Verdict::Drop));
    rs.chains.insert("pol-a-in".into(), Chain::regular(pol_in));
    rs.chains.insert(
        "pol-a-out".into(),
        Chain::regular(vec![
            Rule::new(
                vec![Match::AddrInSet {
                    addr: Addr::daddr(v4),
                    negate: true,
                    set: "sel-a-v4".into(),
                }],
                vec![Stmt::MarkOr(0x0001_0000), Stmt::Verdict(Verdict::Return)],
            ),
            Rule::new(
                vec![Match::AddrInSet {
                    addr: Addr::daddr(v4),
                    negate: false,
                    set: "iv-v4".into(),
                }],
                vec![Stmt::Verdict(Verdict::Continue)],
            ),
        ]),
    );
    // Base chains.
    rs.chains.insert(
        "filter-forward".into(),
        Chain {
            base: Some(FORWARD),
            rules: vec![
                Rule::new(
                    vec![Match::CtState(CtState::ESTABLISHED.or(CtState::RELATED))],
                    vec![accept()],
                ),
                Rule::new(
                    vec![Match::CtState(CtState::INVALID)],
                    vec![Stmt::Verdict(Verdict::Drop)],
                ),
                Rule::new(
                    vec![],
                    vec![Stmt::Vmap {
                        iface: Iface::In,
                        map: "ep-out".into(),
                    }],
                ),
                Rule::new(
                    vec![],
                    vec![Stmt::Vmap {
                        iface: Iface::Out,
                        map: "ep-in".into(),
                    }],
                ),
            ],
        },
    );
    let mut nat = Vec::new();
    for (fam, f) in [("ipv4", v4), ("ipv6", v6)] {
        nat.push(
            Rule::new(
                vec![
                    Match::AddrInSet {
                        addr: Addr::saddr(f),
                        negate: false,
                        set: format!("masq-{fam}-pools"),
                    },
                    Match::AddrInSet {
                        addr: Addr::daddr(f),
                        negate: true,
                        set: format!("all-{fam}-pools"),
                    },
                ],
                vec![Stmt::Masquerade],
            )
            .with_comment("tern natOutgoing"),
        );
    }
    rs.chains.insert(
        "nat-postrouting".into(),
        Chain {
            base: Some(NAT),
            rules: nat,
        },
    );
    rs
}

#[test]
fn a_rich_table_is_the_same_by_text_and_by_netlink() {
    can_run();
    let (text, netlink) = both_ways(rich(), None);
    assert!(text.json.contains("natOutgoing"), "{}", text.json);
    assert_same("rich table", &text, &netlink);
}

#[test]
fn deltas_of_a_rich_table_are_the_same_by_text_and_by_netlink() {
    can_run();
    let old = rich();
    let mut new = old.clone();
    // A pool joins (auto-merge: refilled), an address leaves, one joins, an endpoint goes,
    // a policy chain changes, a chain and a set appear.
    new.sets
        .get_mut("all-ipv4-pools")
        .unwrap()
        .insert(Key::Net(net("10.246.0.0/16")));
    let sel = new.sets.get_mut("sel-a-v4").unwrap();
    sel.elements.remove(&Key::Addr(ip("198.18.0.9")));
    sel.insert(Key::Addr(ip("198.18.0.77")));
    new.sets
        .get_mut("iv-v4")
        .unwrap()
        .insert(Key::Net(net("203.0.113.0/24")));
    new.sets.get_mut("ep-out").unwrap().elements.clear();
    new.chains.remove("ep-out-tern1");
    new.chains.get_mut("pol-a-out").unwrap().rules.pop();
    let mut sel_b = Set::new(SetType::addr(Family::V6));
    sel_b.insert(Key::Addr(ip("fd00::b")));
    new.sets.insert("sel-b-v6".into(), sel_b);
    new.chains.insert(
        "pol-b-in".into(),
        Chain::regular(vec![Rule::new(
            vec![Match::AddrInSet {
                addr: Addr::saddr(Family::V6),
                negate: false,
                set: "sel-b-v6".into(),
            }],
            vec![accept()],
        )]),
    );
    let (text, netlink) = both_ways(old.clone(), Some(new.clone()));
    assert_same("rich delta", &text, &netlink);
    // And back.
    let (text, netlink) = both_ways(new, Some(old));
    assert_same("rich delta back", &text, &netlink);
}

// ---------------------------------------------------------------------------------------------
// Random tables

fn family() -> impl Strategy<Value = Family> {
    prop_oneof![Just(Family::V4), Just(Family::V6)]
}

fn suffix(f: Family) -> &'static str {
    match f {
        Family::V4 => "v4",
        Family::V6 => "v6",
    }
}

/// A prefix of the family, host bits cleared.
fn prefix(f: Family) -> BoxedStrategy<IpNet> {
    match f {
        Family::V4 => (any::<u32>(), 0..=32u8)
            .prop_map(|(a, l)| {
                IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), l)
                    .unwrap()
                    .trunc()
            })
            .boxed(),
        Family::V6 => (any::<u128>(), 0..=128u8)
            .prop_map(|(a, l)| {
                IpNet::new(IpAddr::V6(Ipv6Addr::from(a)), l)
                    .unwrap()
                    .trunc()
            })
            .boxed(),
    }
}

fn addr(f: Family) -> BoxedStrategy<IpAddr> {
    match f {
        Family::V4 => any::<u32>().prop_map(|a| IpAddr::V4(a.into())).boxed(),
        Family::V6 => any::<u128>().prop_map(|a| IpAddr::V6(a.into())).boxed(),
    }
}

fn port_range() -> impl Strategy<Value = PortRange> {
    prop_oneof![
        any::<u16>().prop_map(PortRange::one),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| PortRange::new(a.min(b), a.max(b))),
    ]
}

fn proto() -> impl Strategy<Value = L4Proto> {
    prop_oneof![
        Just(L4Proto::Tcp),
        Just(L4Proto::Udp),
        Just(L4Proto::Sctp),
        Just(L4Proto::UdpLite),
        Just(L4Proto::Icmp),
        Just(L4Proto::Icmpv6),
        any::<u8>().prop_map(L4Proto::Number),
    ]
}

/// A match on an address of family `f`: a named set of the table, or prefixes.
fn addr_match(f: Family) -> impl Strategy<Value = Match> {
    let field = prop_oneof![Just(Addr::saddr(f)), Just(Addr::daddr(f))];
    (
        field,
        any::<bool>(),
        prop::option::of(prop::collection::vec(prefix(f), 1..5)),
    )
        .prop_map(move |(addr, negate, nets)| match nets {
            Some(nets) => Match::AddrInNets { addr, negate, nets },
            None => Match::AddrInSet {
                addr,
                negate,
                set: format!("sel-{}", suffix(f)),
            },
        })
}

/// A rule of a regular chain `c<i>`, jumping only to later chains.
fn rule(i: usize, chains: usize) -> impl Strategy<Value = Rule> {
    let verdicts: Vec<Verdict> = [
        Verdict::Accept,
        Verdict::Drop,
        Verdict::Return,
        Verdict::Continue,
    ]
    .into_iter()
    .chain(((i + 1)..chains).flat_map(|j| {
        [
            Verdict::Jump(format!("c{j}")),
            Verdict::Goto(format!("c{j}")),
        ]
    }))
    .collect();
    (
        family(),
        prop::option::of(proto()),
        prop::option::of(any::<u32>()),
        prop::option::of(prop_oneof![
            Just(CtState::ESTABLISHED.or(CtState::RELATED)),
            Just(CtState::INVALID),
            Just(CtState::NEW)
        ]),
        0..3usize,
        prop::option::of(prop::collection::vec(port_range(), 1..5)),
        0..4u8,
        prop::option::of(any::<u32>()),
        any::<bool>(),
        prop::option::of(prop::sample::select(verdicts)),
    )
        .prop_flat_map(
            |(f, proto, mark, ct, naddr, ports, lookup, mark_set, log, verdict)| {
                (
                    prop::collection::vec(addr_match(f), naddr),
                    Just((f, proto, mark, ct, ports, lookup, mark_set, log, verdict)),
                )
            },
        )
        .prop_map(
            |(addrs, (f, proto, mark, ct, ports, lookup, mark_set, log, verdict))| {
                let mut m = Vec::new();
                // nft cannot list a port match after a protocol it has no header for
                // (payload_expr_complete asserts): no such rule is tested.
                let ports_matched = ports.is_some() || lookup == 1 || lookup == 2;
                if let Some(p) = proto {
                    m.push(Match::L4Proto(match p {
                        L4Proto::Number(n) if ports_matched && ![1, 6, 17, 58].contains(&n) => {
                            L4Proto::Tcp
                        }
                        p => p,
                    }));
                }
                if let Some(c) = ct {
                    m.push(Match::CtState(c));
                }
                m.extend(addrs);
                match lookup {
                    1 => m.push(Match::AddrDportInSet {
                        addr: Addr::daddr(f),
                        set: format!("np-{}", suffix(f)),
                    }),
                    2 => m.push(Match::AddrProtoDportInSet {
                        addr: Addr::saddr(f),
                        set: format!("fp-{}", suffix(f)),
                    }),
                    _ => {}
                }
                if let Some(p) = ports {
                    m.push(Match::DportIn(p));
                }
                if let Some(bits) = mark {
                    m.push(Match::MarkAll(bits));
                }
                let mut s = Vec::new();
                match mark_set {
                    Some(v) if v % 2 == 0 => s.push(Stmt::MarkAnd(v)),
                    Some(v) => s.push(Stmt::MarkOr(v)),
                    None => {}
                }
                if log {
                    s.push(Stmt::Log {
                        prefix: "tern r: ".into(),
                    });
                }
                if let Some(v) = verdict {
                    s.push(Stmt::Verdict(v));
                }
                // A rule of nothing has no nft text.
                if m.is_empty() && s.is_empty() {
                    s.push(Stmt::Verdict(Verdict::Accept));
                }
                Rule::new(m, s)
            },
        )
}

/// Disjoint address ranges of a family: between consecutive points of a sorted list.
fn fp_elements(f: Family) -> BoxedStrategy<Vec<Key>> {
    (
        prop::collection::btree_set(addr(f), 2..8),
        prop::collection::vec(
            ((any::<u8>(), any::<u8>()), (any::<u16>(), any::<u16>())),
            8,
        ),
    )
        .prop_map(|(points, boxes)| {
            let points: Vec<IpAddr> = points.into_iter().collect();
            points
                .windows(2)
                .step_by(2)
                .zip(boxes)
                .map(|(w, ((p, q), (a, b)))| Key::AddrProtoPort {
                    addr: AddrRange {
                        first: w[0],
                        last: w[1],
                    },
                    proto: Span::new(p.min(q), p.max(q)),
                    port: PortRange::new(a.min(b), a.max(b)),
                })
                .collect()
        })
        .boxed()
}

/// Disjoint prefixes (overlapping ones dropped), for an interval set that does not merge.
fn disjoint(nets: Vec<IpNet>) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    for n in nets {
        if !out.iter().any(|o| o.contains(&n) || n.contains(o)) {
            out.push(n);
        }
    }
    out
}

fn table() -> impl Strategy<Value = Ruleset> {
    (1..=4usize).prop_flat_map(table_of)
}

/// A table with `chains` regular chains.
fn table_of(chains: usize) -> impl Strategy<Value = Ruleset> {
    let per_family = |f: Family| {
        (
            prop::collection::vec(addr(f), 0..6),
            prop::collection::vec((addr(f), any::<u16>()), 0..6),
            fp_elements(f),
            prop::collection::vec(prefix(f), 0..6),
            prop::collection::vec(prefix(f), 0..6),
        )
    };
    (
        per_family(Family::V4),
        per_family(Family::V6),
        (0..chains)
            .map(|i| prop::collection::vec(rule(i, chains), 0..6))
            .collect::<Vec<_>>(),
        prop::collection::vec((0..chains, any::<bool>()), 0..4),
        prop::option::of("[a-z ]{1,20}"),
    )
        .prop_map(move |(s4, s6, rules, entries, comment)| {
            let mut rs = Ruleset::new();
            for (f, (sel, np, fp, pools, iv)) in [(Family::V4, s4), (Family::V6, s6)] {
                let x = suffix(f);
                let mut s = Set::new(SetType::addr(f));
                sel.into_iter().for_each(|a| s.insert(Key::Addr(a)));
                rs.sets.insert(format!("sel-{x}"), s);
                let mut s = Set::new(SetType::addr_port(f));
                np.into_iter()
                    .for_each(|(a, p)| s.insert(Key::AddrPort(a, p)));
                rs.sets.insert(format!("np-{x}"), s);
                let mut s = Set::new(SetType::addr_proto_port(f));
                fp.into_iter().for_each(|k| s.insert(k));
                rs.sets.insert(format!("fp-{x}"), s);
                let mut s = Set::new(SetType::addr(f).auto_merge());
                pools.into_iter().for_each(|n| s.insert(Key::Net(n)));
                rs.sets.insert(format!("pools-{x}"), s);
                let mut s = Set::new(SetType::addr(f).interval());
                disjoint(iv).into_iter().for_each(|n| s.insert(Key::Net(n)));
                rs.sets.insert(format!("iv-{x}"), s);
            }
            for (i, r) in rules.into_iter().enumerate() {
                rs.chains.insert(format!("c{i}"), Chain::regular(r));
            }
            let mut map = Set::new(SetType::ifname_vmap());
            for (i, (c, _)) in entries.iter().enumerate() {
                map.insert_mapping(
                    Key::Ifname(format!("tern{i}")),
                    Verdict::Jump(format!("c{c}")),
                );
            }
            rs.sets.insert("ep-in".into(), map);
            let mut fwd = vec![Rule::new(
                vec![],
                vec![Stmt::Vmap {
                    iface: Iface::Out,
                    map: "ep-in".into(),
                }],
            )];
            if entries.iter().any(|(_, ct)| *ct) {
                fwd.insert(
                    0,
                    Rule::new(
                        vec![Match::CtState(CtState::INVALID)],
                        vec![Stmt::Verdict(Verdict::Drop)],
                    ),
                );
            }
            rs.chains.insert(
                "filter-forward".into(),
                Chain {
                    base: Some(FORWARD),
                    rules: fwd,
                },
            );
            rs.chains.insert(
                "nat-postrouting".into(),
                Chain {
                    base: Some(NAT),
                    rules: vec![Rule {
                        comment,
                        ..Rule::new(
                            vec![Match::AddrInSet {
                                addr: Addr::daddr(Family::V4),
                                negate: true,
                                set: "pools-v4".into(),
                            }],
                            vec![Stmt::Masquerade],
                        )
                    }],
                },
            );
            rs
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            ProptestConfig::default().cases
        } else {
            24
        },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_tables_are_the_same_by_text_and_by_netlink(rs in table()) {
        can_run();
        let (text, netlink) = both_ways(rs, None);
        assert_same("random table", &text, &netlink);
    }

    #[test]
    fn random_deltas_are_the_same_by_text_and_by_netlink(old in table(), new in table()) {
        can_run();
        let (text, netlink) = both_ways(old, Some(new));
        assert_same(
            "random delta",
            &without_zero_ends(&text),
            &without_zero_ends(&netlink),
        );
    }
}

#[test]
fn a_refused_batch_changes_nothing_and_names_the_change() {
    can_run();
    in_netns(|| {
        let rs = rich();
        let mut s = tern_linux::nft_netlink::NftSocket::new().unwrap();
        s.apply("tern", &rs.full_changes()).unwrap();
        let before = listing();
        // A new chain and a rule jumping to a chain that does not exist: refused as one.
        let err = s
            .apply(
                "tern",
                &[
                    TableChange::AddChain("c-new".into()),
                    TableChange::AddRule {
                        chain: "c-new".into(),
                        rule: Rule::verdict(Verdict::Jump("nowhere".into())),
                    },
                ],
            )
            .unwrap_err();
        assert!(err.to_string().contains("jump nowhere"), "{err}");
        assert_eq!(listing(), before);
        // Deleting a set a rule still looks up is refused too.
        let err = s
            .apply(
                "tern",
                &[TableChange::DeleteSet {
                    name: "sel-a-v4".into(),
                    set_type: SetType::addr(Family::V4),
                }],
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("delete set inet tern sel-a-v4"),
            "{err}"
        );
        assert_eq!(listing(), before);
    });
}
