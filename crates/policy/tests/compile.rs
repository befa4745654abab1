//! Text of compiled rulesets and deltas, and evaluator semantics of tern policies.

use std::collections::BTreeMap;

use tern_model::Protocol;
use tern_policy::flowtag::FlowTag;
use tern_policy::{
    Endpoint, Flow, FlowLog, PolicySet, Ruleset, compile, compile_with, nft, render_delta,
};

mod common;

fn ep(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> Endpoint {
    common::endpoint(ns, name, "n1", format!("v{name}"), ip, labels)
}

fn load(set: &mut PolicySet, yaml: &str) {
    for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
        r.validate().unwrap();
        set.apply(&r).unwrap();
    }
}

fn flow(src: &str, dst: &str, protocol: Protocol, dst_port: u16) -> Flow {
    Flow {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol,
        dst_port,
        icmp: None,
    }
}

fn base_set() -> PolicySet {
    let mut s = PolicySet::new();
    s.upsert_endpoint(ep("d", "a", "10.0.0.1", &[("app", "a")]));
    s.upsert_endpoint(ep("d", "b", "10.0.0.2", &[("app", "b"), ("tier", "x")]));
    s.upsert_endpoint(ep("e", "c", "10.0.0.3", &[("app", "a")]));
    s.upsert_namespace("e", BTreeMap::from([("team".into(), "blue".into())]));
    s
}

#[test]
fn ordering_actions_and_pass() {
    let mut s = base_set();
    load(
        &mut s,
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: deny-c}\nspec:\n  order: 5\n  selector: app == 'b' && has(tier)\n  ingress:\n  - action: Deny\n    source: {namespaceSelector: team == 'blue'}\n  - action: Pass\n    protocol: UDP\n---\n\
         apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: d}\nspec:\n  order: 100\n  selector: app in {'b'}\n  ingress:\n  - action: Allow\n    protocol: TCP\n    source: {selector: \"!has(tier)\"}\n    destination: {ports: [web]}\n",
    );
    // c (namespace e, team=blue) is denied by the earlier policy, even on the allowed port.
    assert!(!s.allowed(&flow("10.0.0.3", "10.0.0.2", Protocol::Tcp, 80)));
    // a is allowed on the named port only.
    assert!(s.allowed(&flow("10.0.0.1", "10.0.0.2", Protocol::Tcp, 80)));
    assert!(!s.allowed(&flow("10.0.0.1", "10.0.0.2", Protocol::Tcp, 81)));
    // UDP passes: the later policy is skipped, the profile allows.
    assert!(s.allowed(&flow("10.0.0.1", "10.0.0.2", Protocol::Udp, 53)));
    // An outside address is not an endpoint: only b's ingress applies (default deny for TCP).
    assert!(!s.allowed(&flow("192.0.2.1", "10.0.0.2", Protocol::Tcp, 80)));
    // Unselected endpoints are open.
    assert!(s.allowed(&flow("10.0.0.2", "10.0.0.1", Protocol::Tcp, 22)));
}

/// Rules as nft text.
fn texts(rules: &[nft::Rule]) -> Vec<String> {
    rules.iter().map(ToString::to_string).collect()
}

#[test]
fn conntrack_only_while_an_endpoint_is_filtered() {
    // No policy selects anything: the forward chain dispatches through the (empty) maps and
    // asks nothing of conntrack, so an unfiltered node's forwarding is not tracked.
    let s = base_set();
    let rs = compile(&s, "n1");
    let fwd = texts(&rs.chains["filter-forward"].rules);
    assert!(fwd.iter().all(|r| !r.contains("ct ")), "{fwd:?}");
    assert!(fwd.iter().any(|r| r == "oifname vmap @ep-in"));

    // One selected endpoint: established/related first, then dispatch.
    let mut s = base_set();
    load(
        &mut s,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: d}\nspec:\n  podSelector: {matchLabels: {app: b}}\n  ingress: []\n",
    );
    let filtered = compile(&s, "n1");
    let fwd = texts(&filtered.chains["filter-forward"].rules);
    assert_eq!(fwd[0], "ct state established,related accept");

    // The delta between the two is a rewrite of the forward chain plus the map entry.
    let d = render_delta(&rs, &filtered);
    assert!(d.contains("flush chain inet tern filter-forward"), "{d}");
    assert!(
        d.contains("add rule inet tern filter-forward ct state established,related accept"),
        "{d}"
    );
}

#[test]
fn compiled_text_layout() {
    let mut s = base_set();
    load(
        &mut s,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: d}\nspec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {app: a}}\n    - ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.128/25]}\n    ports: [{port: 80, endPort: 90}, {protocol: UDP, port: web}]\n",
    );
    let rs = compile(&s, "n1");
    let full = rs.render_full();
    assert!(full.starts_with("add table inet tern\ndelete table inet tern\nadd table inet tern\n"));
    assert!(full.contains(
        "add chain inet tern filter-forward { type filter hook forward priority -5; policy accept; }"
    ));
    for l in [
        "add rule inet tern filter-forward ct state established,related accept",
        "add rule inet tern filter-forward ct state invalid drop",
        "add rule inet tern filter-forward iifname vmap @ep-out",
        "add rule inet tern filter-forward oifname vmap @ep-in",
        "add element inet tern ep-in { \"vb\" : jump ep-in-vb }",
        "add rule inet tern ep-in-vb drop",
    ] {
        assert!(full.lines().any(|x| x == l), "missing {l:?} in\n{full}");
    }
    // Only b is selected, and only for ingress.
    assert!(!rs.chains.contains_key("ep-in-va"));
    assert!(!rs.chains.contains_key("ep-out-vb"));
    let pol: Vec<&String> = rs.chains.keys().filter(|k| k.starts_with("pol-")).collect();
    assert_eq!(pol.len(), 1);
    let rules = texts(&rs.chains[pol[0]].rules);
    // An ingress policy accepts directly.
    let allow = "accept";
    assert!(
        rules
            .iter()
            .any(|r| r.starts_with("meta l4proto tcp ip saddr @sel-")
                && r.ends_with(&format!("th dport {{ 80-90 }} {allow}"))),
        "{rules:#?}"
    );
    assert!(rules.iter().any(|r| r == &format!(
        "meta l4proto tcp ip saddr {{ 192.0.2.0/24 }} ip saddr != {{ 192.0.2.128/25 }} th dport {{ 80-90 }} {allow}"
    )), "{rules:#?}");
    // The named port is UDP: the endpoints only name a TCP port, so the set is empty.
    let np: Vec<(&String, _)> = rs
        .sets
        .iter()
        .filter(|(k, _)| k.starts_with("np-"))
        .collect();
    assert!(!np.is_empty() && np.iter().all(|(_, s)| s.elements.is_empty()));
    let sel = rs
        .sets
        .iter()
        .find(|(k, s)| k.starts_with("sel-") && k.ends_with("-v4") && !s.elements.is_empty())
        .unwrap();
    let keys: Vec<String> = sel.1.elements.keys().map(ToString::to_string).collect();
    assert_eq!(keys, ["10.0.0.1"]);
}

#[test]
fn deltas_are_minimal() {
    let mut s = base_set();
    load(
        &mut s,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: d}\nspec:\n  podSelector: {}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: a}}}]\n",
    );
    let old = compile(&s, "n1");
    assert_eq!(render_delta(&old, &old), "");
    // A remote pod in the selected set: one element.
    let mut remote = ep("d", "r", "10.0.1.9", &[("app", "a")]);
    remote.node = "n2".into();
    s.upsert_endpoint(remote);
    let new = compile(&s, "n1");
    let d = render_delta(&old, &new);
    assert_eq!(d.lines().count(), 1, "{d}");
    assert!(d.starts_with("add element inet tern sel-") && d.contains("10.0.1.9"));
    // A local pod: its chain, rules, map entry and set element; no policy chain rewritten.
    s.upsert_endpoint(ep("d", "n", "10.0.0.7", &[("app", "a")]));
    let newer = compile(&s, "n1");
    let d = render_delta(&new, &newer);
    assert!(d.contains("add chain inet tern ep-in-vn\n"), "{d}");
    assert!(d.contains("add element inet tern ep-in { \"vn\" : jump ep-in-vn }"));
    assert!(!d.contains("flush chain"), "{d}");
    // And it leaves again: deleted in dependency order.
    let d = render_delta(&newer, &new);
    let pos = |needle: &str| d.find(needle).unwrap_or_else(|| panic!("{needle} in {d}"));
    assert!(
        pos("delete element inet tern ep-in { \"vn\" }") < pos("delete chain inet tern ep-in-vn")
    );
    assert!(pos("flush chain inet tern ep-in-vn") < pos("delete chain inet tern ep-in-vn"));
}

#[test]
fn merged_rulesets_keep_foreign_chains() {
    let s = base_set();
    let mut rs = compile(&s, "n1");
    let mut nat = Ruleset::new();
    nat.chains.insert(
        "nat-postrouting".into(),
        tern_policy::Chain {
            base: Some(nft::BaseChain {
                chain_type: nft::ChainType::Nat,
                hook: nft::Hook::Postrouting,
                priority: 100,
                policy: nft::ChainPolicy::Accept,
            }),
            rules: vec![nft::Rule::new(
                vec![
                    nft::Match::AddrInSet {
                        addr: nft::Addr::saddr(nft::Family::V4),
                        negate: false,
                        set: "nat-pools".into(),
                    },
                    nft::Match::AddrInSet {
                        addr: nft::Addr::daddr(nft::Family::V4),
                        negate: true,
                        set: "pools".into(),
                    },
                ],
                vec![nft::Stmt::Masquerade],
            )],
        },
    );
    let interval = nft::SetType::addr(nft::Family::V4).interval();
    nat.sets
        .insert("pools".into(), tern_policy::Set::new(interval));
    nat.sets
        .insert("nat-pools".into(), tern_policy::Set::new(interval));
    rs.merge(nat);
    let full = rs.render_full();
    assert!(full.contains("add chain inet tern nat-postrouting { type nat hook postrouting"));
    assert!(full.contains("add set inet tern pools { type ipv4_addr; flags interval; }"));
    assert!(full.contains("add map inet tern ep-in { type ifname : verdict; }"));
}

#[test]
fn bad_policies_are_rejected_with_context() {
    let mut s = PolicySet::new();
    let mut p = tern_model::NetworkPolicy::new(
        "p",
        tern_model::NetworkPolicySpec {
            selector: "app == 'x' &&".into(),
            ..Default::default()
        },
    );
    p.metadata.namespace = Some("d".into());
    let e = s.upsert_tern_policy(&p).unwrap_err().to_string();
    assert!(
        e.contains("policy NetworkPolicy/d/p: spec.selector: invalid selector")
            && e.contains("at position 13"),
        "{e}"
    );
}

/// Flow records: off is `compile()` exactly; on, every rule that ends a walk logs its tag to
/// the group before its verdict, the default deny logs `t:dd`, and endpoints no policy selects
/// go through the shared no-policy chains (which log and do what no entry does).
#[test]
fn flow_records_tag_every_deciding_rule() {
    let mut s = base_set();
    load(
        &mut s,
        "apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: d}\nspec:\n  selector: app == 'b'\n  ingress:\n  - action: Log\n  - action: Deny\n    source: {namespaceSelector: team == 'blue'}\n  - action: Allow\n    protocol: TCP\n    source: {selector: app == 'a'}\n  egress:\n  - action: Allow\n    destination: {nets: [192.0.2.0/24]}\n",
    );
    assert_eq!(compile_with(&s, "n1", None), compile(&s, "n1"));
    let log = FlowLog { group: 9 };
    let rs = compile_with(&s, "n1", Some(log));
    let key = s.policies().next().unwrap().key.to_string();
    let hash = tern_policy::compile::short_hash(&key);
    let pol_in = texts(&rs.chains[&format!("pol-{hash}-in")].rules);
    // The Log rule (index 0) keeps its kernel log; the Deny (1) and Allow (2) are tagged with
    // their index as written, once per family they compile to.
    assert!(pol_in[0].starts_with("log prefix \"tern "), "{pol_in:?}");
    let deny = format!("log prefix \"t:{hash}:i:1:d\" group 9 snaplen 96 drop");
    let allow = format!("log prefix \"t:{hash}:i:2:a\" group 9 snaplen 96 accept");
    assert!(pol_in.iter().any(|r| r.ends_with(&deny)), "{pol_in:?}");
    assert!(pol_in.iter().any(|r| r.ends_with(&allow)), "{pol_in:?}");
    // The egress allow is all nets: the fast path takes it, tagged `t:fp:e`.
    let ep_out = texts(&rs.chains["ep-out-vb"].rules);
    assert!(
        ep_out
            .iter()
            .any(|r| r.ends_with("log prefix \"t:fp:e\" group 9 snaplen 96 return")),
        "{ep_out:?}"
    );
    let ep_in = texts(&rs.chains["ep-in-vb"].rules);
    assert_eq!(
        ep_in.last().unwrap(),
        "log prefix \"t:dd:i\" group 9 snaplen 96 drop"
    );
    // a and c are selected by nothing: both directions go to the shared chains.
    for (map, chain, verdict, tag) in [
        ("ep-in", "flow-np-in", "accept", "t:np:i"),
        ("ep-out", "flow-np-out", "return", "t:np:e"),
    ] {
        let m = &rs.sets[map];
        for ifname in ["va", "vc"] {
            assert_eq!(
                m.elements.get(&nft::Key::Ifname(ifname.into())),
                Some(&Some(nft::Verdict::Jump(chain.into()))),
                "{map} {ifname}"
            );
        }
        assert_eq!(
            texts(&rs.chains[chain].rules),
            vec![format!("log prefix \"{tag}\" group 9 snaplen 96 {verdict}")]
        );
        assert!(FlowTag::parse(tag).is_some());
    }
    // Every tag in the table reads back.
    for c in rs.chains.values() {
        for r in &c.rules {
            for st in &r.stmts {
                if let nft::Stmt::LogGroup { prefix, .. } = st {
                    assert!(FlowTag::parse(prefix).is_some(), "{prefix}");
                }
            }
        }
    }
    // Conntrack goes first, so only a connection's first packet reaches a tag.
    let fwd = texts(&rs.chains["filter-forward"].rules);
    assert_eq!(fwd[0], "ct state established,related accept");
}

/// A rule whose only address criterion is an IPv4 `notNets` (found by
/// `crates/ctl/tests/lab_random_policy.rs`): its IPv6 copy must match IPv6 packets alone.
/// It used to have no address match at all, so in the `inet` table it matched every IPv4
/// packet too, the excluded addresses included (a Pass there took the rule's tag, a Deny would
/// have dropped them).
#[test]
fn not_nets_of_one_family_leave_the_other_copy_bound_to_its_family() {
    let mut set = base_set();
    load(
        &mut set,
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  selector: app == 'b'\n  egress:\n  - action: Deny\n    source: {notNets: [10.0.0.0/17]}\n  - action: Allow\n",
    );
    let text = compile(&set, "n1").render_full();
    let rules: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" pol-") && l.starts_with("add rule") && l.contains(" drop"))
        .collect();
    assert_eq!(
        rules,
        vec![
            rules
                .iter()
                .copied()
                .find(|l| l.contains("ip saddr != { 10.0.0.0/17 }"))
                .unwrap_or("no IPv4 copy"),
            rules
                .iter()
                .copied()
                .find(|l| l.contains("ip6 saddr { ::/0 }"))
                .unwrap_or("no IPv6 copy"),
        ],
        "{text}"
    );
    // The evaluator agrees: b (10.0.0.2) is inside the notNets, so the Deny does not apply.
    assert!(set.allowed(&flow("10.0.0.2", "10.0.0.1", Protocol::Tcp, 80)));
}

fn icmp_flow(src: &str, dst: &str, protocol: Protocol, ty: u8, code: u8) -> Flow {
    Flow {
        icmp: Some((ty, code)),
        ..flow(src, dst, protocol, 0)
    }
}

/// The `add rule` lines of b's policy chain that accept.
fn accepting_policy_rules(set: &PolicySet) -> Vec<String> {
    compile(set, "n1")
        .render_full()
        .lines()
        .filter(|l| l.starts_with("add rule") && l.contains(" pol-") && l.ends_with(" accept"))
        .map(|l| {
            l.split_once(" pol-")
                .unwrap()
                .1
                .split_once(' ')
                .unwrap()
                .1
                .to_string()
        })
        .collect()
}

#[test]
fn icmp_type_and_code_compile_per_family_and_judge_flows() {
    let mut set = base_set();
    set.upsert_endpoint(ep("d", "b6", "fd00::2", &[("app", "b6")]));
    load(
        &mut set,
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  selector: app == 'b' || app == 'b6'\n  ingress:\n  - action: Allow\n    protocol: ICMP\n    icmp: {type: 8, code: 0}\n  - action: Allow\n    protocol: ICMPv6\n    icmp: {type: 128}\n",
    );
    assert_eq!(
        accepting_policy_rules(&set),
        vec![
            "meta l4proto icmp icmp type 8 icmp code 0 accept",
            "meta l4proto ipv6-icmp icmpv6 type 128 accept",
        ]
    );
    let v4 = |ty, code| set.allowed(&icmp_flow("10.0.0.1", "10.0.0.2", Protocol::Icmp, ty, code));
    assert!(v4(8, 0));
    assert!(!v4(8, 1), "another code");
    assert!(!v4(13, 0), "another type");
    let v6 = |ty, code| set.allowed(&icmp_flow("fd00::1", "fd00::2", Protocol::IcmpV6, ty, code));
    assert!(v6(128, 0));
    assert!(v6(128, 5), "any code");
    assert!(!v6(129, 0));
    // The ICMP rule's type 8 does not allow ICMPv6 type 8.
    assert!(!v6(8, 0));
}

#[test]
fn not_icmp_is_type_or_code_different() {
    let mut set = base_set();
    set.upsert_endpoint(ep("d", "b6", "fd00::2", &[("app", "b")]));
    load(
        &mut set,
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: p}\nspec:\n  selector: app == 'b'\n  ingress:\n  - action: Allow\n    protocol: ICMPv6\n    notICMP: {type: 128, code: 0}\n  - action: Allow\n    protocol: ICMP\n    notICMP: {type: 8}\n",
    );
    assert_eq!(
        accepting_policy_rules(&set),
        vec![
            "meta l4proto ipv6-icmp icmpv6 type != 128 accept",
            "meta l4proto ipv6-icmp icmpv6 type 128 icmpv6 code != 0 accept",
            "meta l4proto icmp icmp type != 8 accept",
        ]
    );
    let v4 = |ty| set.allowed(&icmp_flow("10.0.0.1", "10.0.0.2", Protocol::Icmp, ty, 0));
    assert!(!v4(8));
    assert!(v4(0));
    let v6 = |ty, code| set.allowed(&icmp_flow("fd00::1", "fd00::2", Protocol::IcmpV6, ty, code));
    assert!(!v6(128, 0));
    assert!(v6(128, 1));
    assert!(v6(129, 0));
}
