//! nftables set-element updates over netlink against the real kernel. Every test runs on a
//! dedicated thread moved into a fresh network namespace (`unshare(CLONE_NEWNET)`), so the
//! machine's own tables are never touched; `nft` run from that thread inherits the namespace.

use std::collections::BTreeSet;
use std::process::Command;

use tern_linux::LinuxError;
use tern_linux::nft_netlink::{
    Element, ElementChange, ElementOp, Key, NftSocket, Rule, SetKind, TableOp, Verdict,
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

/// Runs `f` in a private network namespace; skips (returns None) without root or nft, or fails
/// the test under `TERN_TEST_STRICT=1` (tern-testkit).
fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // Checked on the test's own thread, so the message names the test.
    if !tern_testkit::require_root() || !tern_testkit::require_binary("nft") {
        return None;
    }
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

/// What `nft ARGS` prints; it must succeed.
fn nft_stdout(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The elements of a set as `nft -j list set` renders them, as comparable strings.
fn listed(kind: &str, set: &str) -> BTreeSet<String> {
    let out = nft_stdout(&["-j", "list", kind, "inet", "tern", set]);
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

fn change(set: &str, op: ElementOp, kind: SetKind, text: &str) -> ElementChange {
    ElementChange {
        set: set.into(),
        op,
        element: kind.parse_element(text).unwrap(),
    }
}

fn strs(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn adds_and_deletes_elements_of_every_set_kind() {
    in_netns(|| {
        setup();
        let v4 = SetKind::from_spec("type ipv4_addr;").unwrap();
        let v6 = SetKind::from_spec("type ipv6_addr;").unwrap();
        let iv = SetKind::from_spec("type ipv4_addr; flags interval;").unwrap();
        let np = SetKind::from_spec("type ipv4_addr . inet_service;").unwrap();
        let map = SetKind::IfnameVerdict;
        let mut s = NftSocket::new().unwrap();
        s.apply(
            "tern",
            &[
                change("sel-a-v4", ElementOp::Add, v4, "198.18.0.1"),
                change("sel-a-v4", ElementOp::Add, v4, "198.18.0.2"),
                change("sel-a-v6", ElementOp::Add, v6, "fd00::7"),
                change("iv-v4", ElementOp::Add, iv, "198.18.1.1"),
                change("iv-v4", ElementOp::Add, iv, "198.19.0.0/16"),
                change("np-a-v4", ElementOp::Add, np, "198.18.0.1 . 8080"),
                change("ep-in", ElementOp::Add, map, "\"tern1\" : jump ep-in-tern1"),
                change("ep-in", ElementOp::Add, map, "\"tern2\" : jump ep-in-tern2"),
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
                change("sel-a-v4", ElementOp::Delete, v4, "198.18.0.1"),
                change("iv-v4", ElementOp::Delete, iv, "198.18.1.1"),
                change("np-a-v4", ElementOp::Delete, np, "198.18.0.1 . 8080"),
                change(
                    "ep-in",
                    ElementOp::Delete,
                    map,
                    "\"tern1\" : jump ep-in-tern1",
                ),
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
        let v4 = SetKind::from_spec("type ipv4_addr;").unwrap();
        let iv = SetKind::from_spec("type ipv4_addr; flags interval;").unwrap();
        let mut s = NftSocket::new().unwrap();
        let add = change("sel-a-v4", ElementOp::Add, v4, "198.18.0.1");
        s.apply("tern", std::slice::from_ref(&add)).unwrap();
        // Again, mixed in one message with a new element and a delete of a missing one.
        s.apply(
            "tern",
            &[
                add.clone(),
                change("sel-a-v4", ElementOp::Add, v4, "198.18.0.3"),
                change("sel-a-v4", ElementOp::Delete, v4, "198.18.0.9"),
                change("sel-a-v4", ElementOp::Delete, v4, "198.18.0.10"),
                change("iv-v4", ElementOp::Delete, iv, "198.18.5.5"),
            ],
        )
        .unwrap();
        assert_eq!(
            listed("set", "sel-a-v4"),
            strs(&["\"198.18.0.1\"", "\"198.18.0.3\""])
        );
        s.apply("tern", &[change("iv-v4", ElementOp::Add, iv, "198.18.1.1")])
            .unwrap();
        s.apply("tern", &[change("iv-v4", ElementOp::Add, iv, "198.18.1.1")])
            .unwrap();
        assert_eq!(listed("set", "iv-v4"), strs(&["\"198.18.1.1\""]));
        s.apply("tern", &[]).unwrap();
    });
}

#[test]
fn missing_set_or_table_is_not_found_and_nothing_is_applied() {
    in_netns(|| {
        setup();
        let v4 = SetKind::from_spec("type ipv4_addr;").unwrap();
        let mut s = NftSocket::new().unwrap();
        assert!(s.set_exists("tern", "sel-a-v4").unwrap());
        assert!(!s.set_exists("tern", "sel-nope-v4").unwrap());
        assert!(!s.set_exists("nope", "sel-a-v4").unwrap());
        let err = s
            .apply(
                "tern",
                &[
                    change("sel-a-v4", ElementOp::Add, v4, "198.18.0.1"),
                    change("sel-nope-v4", ElementOp::Add, v4, "198.18.0.2"),
                ],
            )
            .unwrap_err();
        assert!(matches!(err, LinuxError::NotFound { .. }), "{err}");
        assert!(err.is_not_found());
        assert!(err.to_string().contains("sel-nope-v4"), "{err}");
        // One transaction: the valid half was not applied either.
        assert!(listed("set", "sel-a-v4").is_empty());
        let err = s
            .apply(
                "nope",
                &[change("sel-a-v4", ElementOp::Delete, v4, "198.18.0.1")],
            )
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
            .apply(
                "tern",
                &[ElementChange {
                    set: "ep-in".into(),
                    op: ElementOp::Add,
                    element: Element {
                        key: Key::Ifname("tern9".into()),
                        verdict: Some(Verdict::Jump("ep-in-missing".into())),
                    },
                }],
            )
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
        let v4 = SetKind::from_spec("type ipv4_addr;").unwrap();
        let changes: Vec<ElementChange> = (0..2000u32)
            .map(|i| {
                let ip =
                    std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + i);
                change("sel-a-v4", ElementOp::Add, v4, &ip.to_string())
            })
            .collect();
        let mut s = NftSocket::new().unwrap();
        s.apply("tern", &changes).unwrap();
        assert_eq!(listed("set", "sel-a-v4").len(), 2000);
        let dels: Vec<ElementChange> = changes
            .iter()
            .map(|c| ElementChange {
                op: ElementOp::Delete,
                ..c.clone()
            })
            .collect();
        s.apply("tern", &dels).unwrap();
        assert!(listed("set", "sel-a-v4").is_empty());
    });
}

/// The rules of a chain as `nft list chain` prints them (handles and the chain line removed).
fn chain_rules(chain: &str) -> Vec<String> {
    nft_stdout(&["list", "chain", "inet", "tern", chain])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("table") && !l.starts_with("chain"))
        .filter(|l| *l != "}")
        .map(str::to_string)
        .collect()
}

/// An endpoint chain as tern's compiler writes it.
const EP_RULES: [&str; 6] = [
    "meta mark set meta mark and 0xfffeffff",
    "jump pol-a-in",
    "meta mark and 0x10000 == 0x10000 accept",
    "jump pol-b-in",
    "meta mark and 0x10000 == 0x10000 accept",
    "drop",
];

fn add_chain_ops(chain: &str, rules: &[&str]) -> Vec<TableOp> {
    let mut ops = vec![TableOp::AddChain(chain.into())];
    for r in rules {
        ops.push(TableOp::AddRule {
            chain: chain.into(),
            rule: Rule::parse(r).unwrap_or_else(|| panic!("{r} parses")),
        });
    }
    ops
}

fn map_entry(ifname: &str, op: ElementOp, chain: &str) -> TableOp {
    TableOp::Element(ElementChange {
        set: "ep-in".into(),
        op,
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
        let mut script = String::from(
            "add chain inet tern pol-a-in\nadd chain inet tern pol-b-in\nadd chain inet tern by-nft\n",
        );
        for r in EP_RULES {
            script.push_str(&format!("add rule inet tern by-nft {r}\n"));
        }
        tern_linux::nft::apply(&script).unwrap();
        let mut ops = add_chain_ops("ep-in-tern7", &EP_RULES);
        ops.push(map_entry("tern7", ElementOp::Add, "ep-in-tern7"));
        let mut s = NftSocket::new().unwrap();
        s.apply_ops("tern", &ops).unwrap();
        let want = chain_rules("by-nft");
        assert_eq!(want.len(), EP_RULES.len(), "{want:?}");
        assert_eq!(chain_rules("ep-in-tern7"), want);
        // What Display writes is what Rule::parse reads.
        for r in EP_RULES {
            assert_eq!(Rule::parse(r).unwrap().to_string(), r);
        }
        assert_eq!(listed("map", "ep-in").len(), 1);

        // Replace the rules (labels changed: one policy left), then remove the endpoint.
        let mut replace = vec![TableOp::FlushChain("ep-in-tern7".into())];
        replace.extend(
            add_chain_ops(
                "ep-in-tern7",
                &[EP_RULES[0], EP_RULES[3], EP_RULES[4], "drop"],
            )
            .into_iter()
            .skip(1),
        );
        s.apply_ops("tern", &replace).unwrap();
        assert_eq!(chain_rules("ep-in-tern7").len(), 4);
        assert!(chain_rules("ep-in-tern7")[1].contains("pol-b-in"));
        s.apply_ops(
            "tern",
            &[
                map_entry("tern7", ElementOp::Delete, ""),
                TableOp::DeleteChain("ep-in-tern7".into()),
            ],
        )
        .unwrap();
        assert!(listed("map", "ep-in").is_empty());
        let gone = Command::new("nft")
            .args(["list", "chain", "inet", "tern", "ep-in-tern7"])
            .output()
            .unwrap();
        assert!(!gone.status.success(), "the chain was deleted");
    });
}

#[test]
fn a_refused_operation_leaves_the_table_unchanged() {
    in_netns(|| {
        setup();
        tern_linux::nft::apply("add chain inet tern pol-a-in\nadd chain inet tern pol-b-in\n")
            .unwrap();
        let mut s = NftSocket::new().unwrap();
        let mut ops = add_chain_ops("ep-in-tern7", &EP_RULES);
        ops.push(map_entry("tern7", ElementOp::Add, "ep-in-tern7"));
        s.apply_ops("tern", &ops).unwrap();
        // Deleting a chain the map still jumps to is refused, and the transaction with it:
        // the rule added before it in the same batch is not there either.
        let err = s
            .apply_ops(
                "tern",
                &[
                    TableOp::AddRule {
                        chain: "ep-in-tern1".into(),
                        rule: Rule::Verdict(Verdict::Drop),
                    },
                    TableOp::DeleteChain("ep-in-tern7".into()),
                ],
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("delete chain ep-in-tern7"),
            "{err}"
        );
        assert!(chain_rules("ep-in-tern1").is_empty());
        assert_eq!(chain_rules("ep-in-tern7").len(), EP_RULES.len());
        // A rule jumping to a missing chain names the rule.
        let err = s
            .apply_ops(
                "tern",
                &[TableOp::AddRule {
                    chain: "ep-in-tern1".into(),
                    rule: Rule::Verdict(Verdict::Jump("nowhere".into())),
                }],
            )
            .unwrap_err();
        assert!(err.to_string().contains("jump nowhere"), "{err}");
        // Creating a chain that exists is fine.
        s.apply_ops("tern", &[TableOp::AddChain("ep-in-tern1".into())])
            .unwrap();
    });
}

/// The expressions of a chain's rules as the kernel holds them (`nft --debug=netlink`).
fn chain_exprs(chain: &str) -> Vec<String> {
    nft_stdout(&["--debug=netlink", "list", "chain", "inet", "tern", chain])
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
    in_netns(|| {
        setup();
        let mut script = String::from(
            "add set inet tern fp-v4 { type ipv4_addr . inet_proto . inet_service; flags interval; }\n\
             add set inet tern fp-v6 { type ipv6_addr . inet_proto . inet_service; flags interval; }\n\
             add element inet tern fp-v4 { 198.18.0.0/16 . 6 . 80 }\n\
             add chain inet tern by-nft\n",
        );
        for r in LOOKUPS {
            script.push_str(&format!("add rule inet tern by-nft {r}\n"));
        }
        tern_linux::nft::apply(&script).unwrap();
        for r in LOOKUPS {
            assert_eq!(Rule::parse(r).unwrap().to_string(), r);
        }
        let mut s = NftSocket::new().unwrap();
        s.apply_ops("tern", &add_chain_ops("by-netlink", &LOOKUPS))
            .unwrap();
        let want = chain_exprs("by-nft");
        assert!(
            want.iter().any(|l| l.contains("lookup reg 1 set fp-v6")),
            "{want:?}"
        );
        assert_eq!(chain_exprs("by-netlink"), want);
        assert_eq!(chain_rules("by-netlink"), chain_rules("by-nft"));
        // A lookup in a set that does not exist is refused and names the rule.
        let err = s
            .apply_ops(
                "tern",
                &[TableOp::AddRule {
                    chain: "by-netlink".into(),
                    rule: Rule::parse("ip saddr . meta l4proto . th dport @nope accept").unwrap(),
                }],
            )
            .unwrap_err();
        assert!(err.to_string().contains("@nope"), "{err}");
    });
}
