//! nftables set-element, chain and rule updates over netlink against the real kernel. Every
//! test runs on a dedicated thread moved into a fresh network namespace
//! (`unshare(CLONE_NEWNET)`), so the machine's own tables are never touched; `nft` run from
//! that thread inherits the namespace.

use std::collections::BTreeSet;
use std::net::IpAddr;

use tern_linux::LinuxError;
use tern_linux::nft_netlink::NftSocket;
use tern_nft::{
    Addr, DataType, Element, ElementChange, Family, IcmpField, Key, L4Proto, Match, Rule, SetType,
    Stmt, TableChange, Verdict,
};

const TABLE: &str = "\
add table inet tern
add set inet tern sel-a-v4 { type ipv4_addr; }
add set inet tern sel-a-v6 { type ipv6_addr; }
add set inet tern iv-v4 { type ipv4_addr; flags interval; }
add set inet tern np-a-v4 { type ipv4_addr . inet_service; }
add map inet tern ep-in { type ifname : verdict; }
add chain inet tern ep-in-tern1
add chain inet tern ep-in-tern2
";

/// Runs `f` in a private network namespace; fails the test without root or nft (tern-testkit).
fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // Checked on the test's own thread, so the message names the test.
    tern_testkit::need_root();
    tern_testkit::need_binary("nft");
    std::thread::spawn(move || {
        // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        Some(f())
    })
    .join()
    .unwrap()
}

fn setup() {
    tern_linux::nft::apply(TABLE).unwrap();
}

/// The elements of a set as `nft -j list set` renders them, as comparable strings.
fn listed(kind: &str, set: &str) -> BTreeSet<String> {
    let out = tern_testkit::nft::output(&["-j", "list", kind, "inet", "tern", set]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let obj = v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|o| o.get(kind))
        .unwrap();
    obj.get("elem")
        .and_then(|e| e.as_array())
        .map(|a| a.iter().map(|e| e.to_string()).collect())
        .unwrap_or_default()
}

/// The set kinds of [`TABLE`].
const V4: SetType = SetType {
    key: &[DataType::Ipv4Addr],
    data: None,
    interval: false,
    auto_merge: false,
};
const V6: SetType = SetType {
    key: &[DataType::Ipv6Addr],
    data: None,
    interval: false,
    auto_merge: false,
};
const IV: SetType = SetType {
    interval: true,
    ..V4
};
const NP: SetType = SetType {
    key: &[DataType::Ipv4Addr, DataType::InetService],
    ..V4
};

/// Adding (`add`) or deleting the element with `key` of `set`.
fn change(set: &str, add: bool, set_type: SetType, key: Key) -> TableChange {
    TableChange::Element(ElementChange {
        set: set.into(),
        set_type,
        add,
        element: Element { key, verdict: None },
    })
}

fn addr(s: &str) -> Key {
    Key::Addr(s.parse().unwrap())
}

fn net(s: &str) -> Key {
    let n: ipnet::IpNet = match s.parse::<IpAddr>() {
        Ok(ip) => ip.into(),
        Err(_) => s.parse().unwrap(),
    };
    Key::Net(n)
}

fn strs(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn adds_and_deletes_elements_of_every_set_kind() {
    in_netns(|| {
        setup();
        let mut s = NftSocket::new().unwrap();
        s.apply(
            "tern",
            &[
                change("sel-a-v4", true, V4, addr("198.18.0.1")),
                change("sel-a-v4", true, V4, addr("198.18.0.2")),
                change("sel-a-v6", true, V6, addr("fd00::7")),
                change("iv-v4", true, IV, net("198.18.1.1")),
                change("iv-v4", true, IV, net("198.19.0.0/16")),
                change(
                    "np-a-v4",
                    true,
                    NP,
                    Key::AddrPort("198.18.0.1".parse().unwrap(), 8080),
                ),
                map_entry("tern1", true, "ep-in-tern1"),
                map_entry("tern2", true, "ep-in-tern2"),
            ],
        )
        .unwrap();
        assert_eq!(
            listed("set", "sel-a-v4"),
            strs(&["\"198.18.0.1\"", "\"198.18.0.2\""])
        );
        assert_eq!(listed("set", "sel-a-v6"), strs(&["\"fd00::7\""]));
        assert_eq!(
            listed("set", "iv-v4"),
            strs(&[
                "\"198.18.1.1\"",
                r#"{"prefix":{"addr":"198.19.0.0","len":16}}"#
            ])
        );
        assert_eq!(
            listed("set", "np-a-v4"),
            strs(&[r#"{"concat":["198.18.0.1",8080]}"#])
        );
        assert_eq!(
            listed("map", "ep-in"),
            strs(&[
                r#"["tern1",{"jump":{"target":"ep-in-tern1"}}]"#,
                r#"["tern2",{"jump":{"target":"ep-in-tern2"}}]"#
            ])
        );

        s.apply(
            "tern",
            &[
                change("sel-a-v4", false, V4, addr("198.18.0.1")),
                change("iv-v4", false, IV, net("198.18.1.1")),
                change(
                    "np-a-v4",
                    false,
                    NP,
                    Key::AddrPort("198.18.0.1".parse().unwrap(), 8080),
                ),
                map_entry("tern1", false, "ep-in-tern1"),
            ],
        )
        .unwrap();
        assert_eq!(listed("set", "sel-a-v4"), strs(&["\"198.18.0.2\""]));
        assert_eq!(
            listed("set", "iv-v4"),
            strs(&[r#"{"prefix":{"addr":"198.19.0.0","len":16}}"#])
        );
        assert!(listed("set", "np-a-v4").is_empty());
        assert_eq!(
            listed("map", "ep-in"),
            strs(&[r#"["tern2",{"jump":{"target":"ep-in-tern2"}}]"#])
        );
        // nft itself still understands (and can change) what netlink wrote.
        tern_linux::nft::apply("delete element inet tern iv-v4 { 198.19.0.0/16 }\n").unwrap();
        assert!(listed("set", "iv-v4").is_empty());
    });
}

#[test]
fn existing_adds_and_missing_deletes_are_no_ops() {
    in_netns(|| {
        setup();
        let mut s = NftSocket::new().unwrap();
        let add = change("sel-a-v4", true, V4, addr("198.18.0.1"));
        s.apply("tern", std::slice::from_ref(&add)).unwrap();
        // Again, mixed in one message with a new element and a delete of a missing one.
        s.apply(
            "tern",
            &[
                add.clone(),
                change("sel-a-v4", true, V4, addr("198.18.0.3")),
                change("sel-a-v4", false, V4, addr("198.18.0.9")),
                change("sel-a-v4", false, V4, addr("198.18.0.10")),
                change("iv-v4", false, IV, net("198.18.5.5")),
            ],
        )
        .unwrap();
        assert_eq!(
            listed("set", "sel-a-v4"),
            strs(&["\"198.18.0.1\"", "\"198.18.0.3\""])
        );
        s.apply("tern", &[change("iv-v4", true, IV, net("198.18.1.1"))])
            .unwrap();
        s.apply("tern", &[change("iv-v4", true, IV, net("198.18.1.1"))])
            .unwrap();
        assert_eq!(listed("set", "iv-v4"), strs(&["\"198.18.1.1\""]));
        s.apply("tern", &[]).unwrap();
    });
}

#[test]
fn missing_set_or_table_is_not_found_and_nothing_is_applied() {
    in_netns(|| {
        setup();
        let mut s = NftSocket::new().unwrap();
        assert!(s.set_exists("tern", "sel-a-v4").unwrap());
        assert!(!s.set_exists("tern", "sel-nope-v4").unwrap());
        assert!(!s.set_exists("nope", "sel-a-v4").unwrap());
        let err = s
            .apply(
                "tern",
                &[
                    change("sel-a-v4", true, V4, addr("198.18.0.1")),
                    change("sel-nope-v4", true, V4, addr("198.18.0.2")),
                ],
            )
            .unwrap_err();
        assert!(matches!(err, LinuxError::NotFound { .. }), "{err}");
        assert!(err.is_not_found());
        assert!(err.to_string().contains("sel-nope-v4"), "{err}");
        // One transaction: the valid half was not applied either.
        assert!(listed("set", "sel-a-v4").is_empty());
        let err = s
            .apply("nope", &[change("sel-a-v4", false, V4, addr("198.18.0.1"))])
            .unwrap_err();
        assert!(err.is_not_found(), "{err}");
    });
}

#[test]
fn map_element_jumping_to_a_missing_chain_is_refused_with_context() {
    in_netns(|| {
        setup();
        let mut s = NftSocket::new().unwrap();
        let err = s
            .apply("tern", &[map_entry("tern9", true, "ep-in-missing")])
            .unwrap_err();
        assert!(matches!(err, LinuxError::Netlink { .. }), "{err}");
        assert!(err.to_string().contains("ep-in"), "{err}");
        assert!(listed("map", "ep-in").is_empty());
    });
}

#[test]
fn large_batches_are_one_transaction() {
    in_netns(|| {
        setup();
        let ips: Vec<Key> = (0..2000u32)
            .map(|i| {
                let ip =
                    std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + i);
                Key::Addr(ip.into())
            })
            .collect();
        let changes: Vec<TableChange> = ips
            .iter()
            .map(|k| change("sel-a-v4", true, V4, k.clone()))
            .collect();
        let mut s = NftSocket::new().unwrap();
        s.apply("tern", &changes).unwrap();
        assert_eq!(listed("set", "sel-a-v4").len(), 2000);
        let dels: Vec<TableChange> = ips
            .iter()
            .map(|k| change("sel-a-v4", false, V4, k.clone()))
            .collect();
        s.apply("tern", &dels).unwrap();
        assert!(listed("set", "sel-a-v4").is_empty());
    });
}

/// The rules of a chain as `nft list chain` prints them (handles and the chain line removed).
fn chain_rules(chain: &str) -> Vec<String> {
    tern_testkit::nft::output(&["list", "chain", "inet", "tern", chain])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("table") && !l.starts_with("chain"))
        .filter(|l| *l != "}")
        .map(str::to_string)
        .collect()
}

/// An endpoint chain as tern's compiler writes it, and its text.
fn ep_rules() -> Vec<(Rule, &'static str)> {
    let mark_test = || {
        Rule::new(
            vec![Match::MarkAll(0x10000)],
            vec![Stmt::Verdict(Verdict::Accept)],
        )
    };
    vec![
        (
            Rule::new(vec![], vec![Stmt::MarkAnd(0xfffe_ffff)]),
            "meta mark set meta mark and 0xfffeffff",
        ),
        (
            Rule::verdict(Verdict::Jump("pol-a-in".into())),
            "jump pol-a-in",
        ),
        (mark_test(), "meta mark and 0x10000 == 0x10000 accept"),
        (
            Rule::verdict(Verdict::Jump("pol-b-in".into())),
            "jump pol-b-in",
        ),
        (mark_test(), "meta mark and 0x10000 == 0x10000 accept"),
        (Rule::verdict(Verdict::Drop), "drop"),
    ]
}

fn add_chain_ops(chain: &str, rules: &[Rule]) -> Vec<TableChange> {
    let mut ops = vec![TableChange::AddChain(chain.into())];
    for r in rules {
        ops.push(TableChange::AddRule {
            chain: chain.into(),
            rule: r.clone(),
        });
    }
    ops
}

fn map_entry(ifname: &str, add: bool, chain: &str) -> TableChange {
    TableChange::Element(ElementChange {
        set: "ep-in".into(),
        set_type: SetType::ifname_vmap(),
        add,
        element: Element {
            key: Key::Ifname(ifname.into()),
            verdict: Some(Verdict::Jump(chain.into())),
        },
    })
}

#[test]
fn chains_and_rules_over_netlink_equal_what_nft_makes() {
    in_netns(|| {
        setup();
        let ep = ep_rules();
        let rules: Vec<Rule> = ep.iter().map(|(r, _)| r.clone()).collect();
        let mut script = String::from(
            "add chain inet tern pol-a-in\nadd chain inet tern pol-b-in\nadd chain inet tern by-nft\n",
        );
        for (_, text) in &ep {
            script.push_str(&format!("add rule inet tern by-nft {text}\n"));
        }
        tern_linux::nft::apply(&script).unwrap();
        let mut ops = add_chain_ops("ep-in-tern7", &rules);
        ops.push(map_entry("tern7", true, "ep-in-tern7"));
        let mut s = NftSocket::new().unwrap();
        s.apply("tern", &ops).unwrap();
        let want = chain_rules("by-nft");
        assert_eq!(want.len(), ep.len(), "{want:?}");
        assert_eq!(chain_rules("ep-in-tern7"), want);
        // What Display writes is the text nft was given.
        for (r, text) in &ep {
            assert_eq!(r.to_string(), *text);
        }
        assert_eq!(listed("map", "ep-in").len(), 1);

        // Replace the rules (labels changed: one policy left), then remove the endpoint.
        let mut replace = vec![TableChange::FlushChain("ep-in-tern7".into())];
        replace.extend(
            add_chain_ops(
                "ep-in-tern7",
                &[
                    rules[0].clone(),
                    rules[3].clone(),
                    rules[4].clone(),
                    Rule::verdict(Verdict::Drop),
                ],
            )
            .into_iter()
            .skip(1),
        );
        s.apply("tern", &replace).unwrap();
        assert_eq!(chain_rules("ep-in-tern7").len(), 4);
        assert!(chain_rules("ep-in-tern7")[1].contains("pol-b-in"));
        s.apply(
            "tern",
            &[
                map_entry("tern7", false, ""),
                TableChange::DeleteChain("ep-in-tern7".into()),
            ],
        )
        .unwrap();
        assert!(listed("map", "ep-in").is_empty());
        assert!(
            !tern_testkit::nft::succeeds(&["list", "chain", "inet", "tern", "ep-in-tern7"]),
            "the chain was deleted"
        );
    });
}

#[test]
fn a_refused_operation_leaves_the_table_unchanged() {
    in_netns(|| {
        setup();
        tern_linux::nft::apply("add chain inet tern pol-a-in\nadd chain inet tern pol-b-in\n")
            .unwrap();
        let mut s = NftSocket::new().unwrap();
        let rules: Vec<Rule> = ep_rules().into_iter().map(|(r, _)| r).collect();
        let mut ops = add_chain_ops("ep-in-tern7", &rules);
        ops.push(map_entry("tern7", true, "ep-in-tern7"));
        s.apply("tern", &ops).unwrap();
        // Deleting a chain the map still jumps to is refused, and the transaction with it:
        // the rule added before it in the same batch is not there either.
        let err = s
            .apply(
                "tern",
                &[
                    TableChange::AddRule {
                        chain: "ep-in-tern1".into(),
                        rule: Rule::verdict(Verdict::Drop),
                    },
                    TableChange::DeleteChain("ep-in-tern7".into()),
                ],
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("delete chain inet tern ep-in-tern7"),
            "{err}"
        );
        assert!(chain_rules("ep-in-tern1").is_empty());
        assert_eq!(chain_rules("ep-in-tern7").len(), rules.len());
        // A rule jumping to a missing chain names the rule.
        let err = s
            .apply(
                "tern",
                &[TableChange::AddRule {
                    chain: "ep-in-tern1".into(),
                    rule: Rule::verdict(Verdict::Jump("nowhere".into())),
                }],
            )
            .unwrap_err();
        assert!(err.to_string().contains("jump nowhere"), "{err}");
        // Creating a chain that exists is fine.
        s.apply("tern", &[TableChange::AddChain("ep-in-tern1".into())])
            .unwrap();
    });
}

/// The expressions of a chain's rules as the kernel holds them (`nft --debug=netlink`).
fn chain_exprs(chain: &str) -> Vec<String> {
    tern_testkit::nft::output(&["--debug=netlink", "list", "chain", "inet", "tern", chain])
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('['))
        .map(str::to_string)
        .collect()
}

#[test]
fn fast_path_lookups_over_netlink_are_the_expressions_nft_sends() {
    const LOOKUPS: [&str; 4] = [
        "ip saddr . meta l4proto . th dport @fp-v4 accept",
        "ip daddr . meta l4proto . th dport @fp-v4 return",
        "ip6 saddr . meta l4proto . th dport @fp-v6 accept",
        "ip6 daddr . meta l4proto . th dport @fp-v6 return",
    ];
    let lookup = |addr: Addr, set: &str, v: Verdict| {
        Rule::new(
            vec![Match::AddrProtoDportInSet {
                addr,
                set: set.into(),
            }],
            vec![Stmt::Verdict(v)],
        )
    };
    let rules = [
        lookup(Addr::saddr(Family::V4), "fp-v4", Verdict::Accept),
        lookup(Addr::daddr(Family::V4), "fp-v4", Verdict::Return),
        lookup(Addr::saddr(Family::V6), "fp-v6", Verdict::Accept),
        lookup(Addr::daddr(Family::V6), "fp-v6", Verdict::Return),
    ];
    in_netns(move || {
        setup();
        let mut s = NftSocket::new().unwrap();
        let want = nft_and_netlink_agree(
            &mut s,
            "add set inet tern fp-v4 { type ipv4_addr . inet_proto . inet_service; flags interval; }\n\
             add set inet tern fp-v6 { type ipv6_addr . inet_proto . inet_service; flags interval; }\n\
             add element inet tern fp-v4 { 198.18.0.0/16 . 6 . 80 }\n",
            &LOOKUPS,
            &rules,
        );
        assert!(
            want.iter().any(|l| l.contains("lookup reg 1 set fp-v6")),
            "{want:?}"
        );
        // A lookup in a set that does not exist is refused and names the rule.
        let err = s
            .apply(
                "tern",
                &[TableChange::AddRule {
                    chain: "by-netlink".into(),
                    rule: lookup(Addr::saddr(Family::V4), "nope", Verdict::Accept),
                }],
            )
            .unwrap_err();
        assert!(err.to_string().contains("@nope"), "{err}");
    });
}

/// Adds `texts` with nft (after `prelude`) to chain `by-nft` and `rules` over netlink to
/// `by-netlink`; asserts each rule prints as its text and both chains hold the same
/// expressions and rules. Returns the expressions.
fn nft_and_netlink_agree(
    s: &mut NftSocket,
    prelude: &str,
    texts: &[&str],
    rules: &[Rule],
) -> Vec<String> {
    let mut script = format!("{prelude}add chain inet tern by-nft\n");
    for r in texts {
        script.push_str(&format!("add rule inet tern by-nft {r}\n"));
    }
    tern_linux::nft::apply(&script).unwrap();
    for (r, text) in rules.iter().zip(texts) {
        assert_eq!(r.to_string(), *text);
    }
    s.apply("tern", &add_chain_ops("by-netlink", rules))
        .unwrap();
    let want = chain_exprs("by-nft");
    assert_eq!(chain_exprs("by-netlink"), want);
    assert_eq!(chain_rules("by-netlink"), chain_rules("by-nft"));
    want
}

#[test]
fn icmp_type_and_code_over_netlink_are_the_expressions_nft_sends() {
    const TEXTS: [&str; 3] = [
        "meta l4proto icmp icmp type 8 icmp code 0 accept",
        "meta l4proto ipv6-icmp icmpv6 type != 128 accept",
        "meta l4proto ipv6-icmp icmpv6 type 128 icmpv6 code != 0 accept",
    ];
    let icmp = |v6, field, negate, value| Match::Icmp {
        v6,
        field,
        negate,
        value,
    };
    let accept = |m: Vec<Match>| Rule::new(m, vec![Stmt::Verdict(Verdict::Accept)]);
    let rules = [
        accept(vec![
            Match::L4Proto(L4Proto::Icmp),
            icmp(false, IcmpField::Type, false, 8),
            icmp(false, IcmpField::Code, false, 0),
        ]),
        accept(vec![
            Match::L4Proto(L4Proto::Icmpv6),
            icmp(true, IcmpField::Type, true, 128),
        ]),
        accept(vec![
            Match::L4Proto(L4Proto::Icmpv6),
            icmp(true, IcmpField::Type, false, 128),
            icmp(true, IcmpField::Code, true, 0),
        ]),
    ];
    in_netns(move || {
        setup();
        let mut s = NftSocket::new().unwrap();
        let want = nft_and_netlink_agree(&mut s, "", &TEXTS, &rules);
        assert!(
            want.iter()
                .any(|l| l.contains("payload load 1b @ transport header + 1")),
            "{want:?}"
        );
    });
}
