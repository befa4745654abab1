//! The incremental compiler: after any sequence of changes its desired table equals a fresh
//! compile of the final state, its scripts are O(change), and every delta script it renders
//! applies cleanly to a real kernel (private network namespace, root only).

use std::collections::BTreeMap;
use std::process::Command;

use tern_model::Kind;
use tern_policy::{Endpoint, Incremental, PolicySet, Ruleset, Set};

mod common;
use common::{Netns, nft};

fn ep(ns: &str, name: &str, node: &str, ip: &str, labels: &[(&str, &str)]) -> Endpoint {
    common::endpoint(ns, name, node, format!("tv{name}"), ip, labels)
}

const POLICIES: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: allow-b, namespace: x}\nspec:\n  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - podSelector: {matchLabels: {pod: b}}\n      namespaceSelector: {}\n    ports:\n    - {port: web, protocol: TCP}\n    - {port: 81, protocol: UDP}\n---\n\
apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: egress-team}\nspec:\n  order: 10\n  selector: has(pod)\n  types: [Egress]\n  egress:\n  - action: Deny\n    destination: {namespaceSelector: team == 'red'}\n  - action: Allow\n";

fn resources(yaml: &str) -> Vec<tern_model::Resource> {
    tern_model::parse_documents(yaml, "t.yaml").unwrap()
}

/// The parts of the table that must not depend on the order changes arrived in.
fn fresh(inc: &Incremental) -> Ruleset {
    Incremental::new(inc.node(), inc.policy_set().clone()).desired()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

type Step = Box<dyn Fn(&mut Incremental)>;

#[test]
fn incremental_state_matches_a_fresh_compile_after_every_change() {
    let mut inc = Incremental::new("n1", PolicySet::new());
    let mut steps: Vec<Step> = vec![
        Box::new(|i| i.upsert_endpoint(ep("x", "a", "n1", "198.18.0.1", &[("pod", "a")]))),
        Box::new(|i| i.upsert_endpoint(ep("y", "b", "n2", "198.18.0.2", &[("pod", "b")]))),
        Box::new(|i| {
            for r in resources(POLICIES) {
                i.apply(&r).unwrap();
            }
        }),
        Box::new(|i| i.upsert_endpoint(ep("z", "b2", "n1", "198.18.0.3", &[("pod", "b")]))),
        Box::new(|i| {
            // Label change moves b2 out of the source set.
            i.upsert_endpoint(ep("z", "b2", "n1", "198.18.0.3", &[("pod", "c")]))
        }),
        Box::new(|i| {
            let mut ns = tern_model::Namespace::new("z", tern_model::NamespaceSpec::default());
            ns.metadata.labels = labels(&[("team", "red")]);
            i.apply(&tern_model::Resource::Namespace(ns)).unwrap();
        }),
        Box::new(|i| {
            i.remove_endpoint("y", "b");
        }),
        Box::new(|i| i.remove(Kind::K8sNetworkPolicy, Some("x"), "allow-b")),
        Box::new(|i| i.remove(Kind::GlobalNetworkPolicy, None, "egress-team")),
    ];
    for (n, step) in steps.iter_mut().enumerate() {
        step(&mut inc);
        assert_eq!(inc.desired(), fresh(&inc), "after step {n}");
        let s = inc.script();
        inc.commit(&s);
        assert_eq!(inc.pending(), 0);
    }
    // Everything removed: only the base chain and the empty maps remain.
    let d = inc.desired();
    assert_eq!(d.chains.keys().collect::<Vec<_>>(), vec!["filter-forward"]);
    assert!(d.sets.values().all(|s| s.elements.is_empty()), "{d:?}");
}

#[test]
fn a_pod_joining_a_selected_set_is_one_small_delta() {
    let mut set = PolicySet::new();
    for i in 0..200u32 {
        set.upsert_endpoint(ep(
            "x",
            &format!("p{i}"),
            if i % 2 == 0 { "n1" } else { "n2" },
            &format!("198.18.{}.{}", i / 200, i % 200 + 1),
            &[("pod", "a")],
        ));
    }
    for r in resources(POLICIES) {
        set.apply(&r).unwrap();
    }
    let mut inc = Incremental::new("n1", set);
    let full = inc.script();
    assert!(full.full);
    inc.commit(&full);
    // A remote pod that policy sources select: its address in the source selector's set and
    // its named port in the named-port set, nothing else.
    inc.upsert_endpoint(ep("y", "newb", "n2", "198.18.5.5", &[("pod", "b")]));
    let s = inc.script();
    assert!(!s.full);
    let lines: Vec<&str> = s.text.lines().collect();
    assert_eq!(lines.len(), 2, "{}", s.text);
    assert!(
        lines[0].starts_with("add element inet tern np-") && lines[0].contains("198.18.5.5 . 80"),
        "{}",
        s.text
    );
    assert!(
        lines[1].starts_with("add element inet tern sel-") && lines[1].contains("198.18.5.5"),
        "{}",
        s.text
    );
    inc.commit(&s);
    // A local pod selected by both policies: its two chains, two map entries, and its address
    // and named port in the sets that select it.
    inc.upsert_endpoint(ep("x", "newa", "n1", "198.18.6.6", &[("pod", "a")]));
    let s = inc.script();
    assert!(
        s.text.contains("add chain inet tern ep-in-tvnewa"),
        "{}",
        s.text
    );
    assert!(
        s.text.contains("add chain inet tern ep-out-tvnewa"),
        "{}",
        s.text
    );
    assert!(
        s.text
            .contains("add element inet tern ep-in { \"tvnewa\" : jump ep-in-tvnewa }"),
        "{}",
        s.text
    );
    assert!(s.text.lines().count() < 20, "{}", s.text);
    inc.commit(&s);
    // Removal takes the map entries out before the chains go.
    inc.remove_endpoint("x", "newa");
    let s = inc.script();
    let del_map = s.text.find("delete element inet tern ep-in").unwrap();
    let del_chain = s.text.find("delete chain inet tern ep-in-tvnewa").unwrap();
    assert!(del_map < del_chain, "{}", s.text);
}

#[test]
fn extra_chains_are_rendered_with_policy_and_a_failed_apply_forces_a_full_resync() {
    let mut inc = Incremental::new("n1", PolicySet::new());
    let mut extra = Ruleset::new();
    extra.sets.insert(
        "all-ipv4-pools".into(),
        Set::new("type ipv4_addr; flags interval;"),
    );
    inc.set_extra(extra.clone());
    let s = inc.script();
    assert!(s.full && s.text.contains("add set inet tern all-ipv4-pools"));
    inc.commit(&s);
    extra
        .sets
        .get_mut("all-ipv4-pools")
        .unwrap()
        .insert("198.18.0.0/16");
    inc.set_extra(extra);
    let s = inc.script();
    assert!(!s.full);
    assert_eq!(
        s.text.trim(),
        "add element inet tern all-ipv4-pools { 198.18.0.0/16 }"
    );
    inc.invalidate();
    let s = inc.script();
    assert!(s.full && s.text.contains("delete table inet tern"));
    assert!(s.text.contains("198.18.0.0/16"));
}

/// A fresh, uniquely named network namespace for applying scripts, or `None` (skipped)
/// without root; under `TERN_TEST_STRICT=1` a missing root fails the test (tern-testkit).
fn kernel_netns(tag: &str) -> Option<Netns> {
    if !tern_testkit::require_root() {
        return None;
    }
    let ns = Netns(vec![format!("tpol-{tag}-{}", std::process::id())]);
    let ok = Command::new("ip")
        .args(["netns", "add", &ns.0[0]])
        .status()
        .unwrap();
    assert!(ok.success());
    Some(ns)
}

/// Applies the pending script in `ns` (it must apply cleanly) and commits it.
fn apply_script(ns: &Netns, inc: &mut Incremental) {
    let s = inc.script();
    if !s.text.is_empty() {
        nft(&ns.0[0], &s.text);
    }
    inc.commit(&s);
}

/// After [`kernel_netns`], an empty node state applied there, then the local endpoint x/a
/// (not applied yet).
fn kernel_incremental(tag: &str) -> Option<(Netns, Incremental)> {
    let ns = kernel_netns(tag)?;
    let mut inc = Incremental::new("n1", PolicySet::new());
    apply_script(&ns, &mut inc);
    inc.upsert_endpoint(ep("x", "a", "n1", "198.18.0.1", &[("pod", "a")]));
    Some((ns, inc))
}

#[test]
fn every_delta_applies_to_a_real_kernel() {
    let Some((ns, mut inc)) = kernel_incremental("inc") else {
        return;
    };
    let apply = |inc: &mut Incremental| apply_script(&ns, inc);
    apply(&mut inc);
    for r in resources(POLICIES) {
        inc.apply(&r).unwrap();
    }
    apply(&mut inc);
    inc.upsert_endpoint(ep("y", "b", "n2", "198.18.0.2", &[("pod", "b")]));
    apply(&mut inc);
    inc.upsert_endpoint(ep("x", "a2", "n1", "198.18.0.3", &[("pod", "a")]));
    apply(&mut inc);
    inc.upsert_endpoint(ep("x", "a2", "n1", "198.18.0.3", &[("pod", "b")]));
    apply(&mut inc);
    inc.remove_endpoint("x", "a");
    apply(&mut inc);
    inc.remove(Kind::K8sNetworkPolicy, Some("x"), "allow-b");
    apply(&mut inc);
    // The kernel agrees with the model: list the table and look for what must be there.
    let out = Command::new("ip")
        .args([
            "netns", "exec", &ns.0[0], "nft", "list", "table", "inet", "tern",
        ])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("chain ep-out-tva2"), "{listing}");
    assert!(!listing.contains("chain ep-in-tva2"), "{listing}");
    assert!(!listing.contains("chain ep-out-tva "), "{listing}");
}

#[test]
fn element_delta_covers_only_pure_set_element_changes() {
    let mut set = PolicySet::new();
    set.upsert_endpoint(ep("x", "a", "n1", "198.18.0.1", &[("pod", "a")]));
    for r in resources(POLICIES) {
        set.apply(&r).unwrap();
    }
    let mut inc = Incremental::new("n1", set);
    // Kernel state unknown: no element delta.
    assert_eq!(inc.element_delta(), None);
    let full = inc.script();
    inc.commit(&full);
    assert_eq!(inc.element_delta(), Some(vec![]));
    // A remote pod the source selector matches: two element additions, nothing else.
    inc.upsert_endpoint(ep("y", "b", "n2", "198.18.5.5", &[("pod", "b")]));
    let d = inc.element_delta().unwrap();
    let mut got: Vec<(String, bool, String)> = d
        .iter()
        .map(|c| (c.set[..3].to_string(), c.add, c.element.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("np-".into(), true, "198.18.5.5 . 80".into()),
            ("sel".into(), true, "198.18.5.5".into()),
        ]
    );
    let np = d.iter().find(|c| c.set.starts_with("np-")).unwrap();
    assert_eq!(np.spec, "type ipv4_addr . inet_service;");
    let s = inc.script();
    inc.commit(&s);
    // It leaves the selected set (label change); named-port sets ignore labels, so it stays
    // there.
    inc.upsert_endpoint(ep("y", "b", "n2", "198.18.5.5", &[("pod", "c")]));
    let d = inc.element_delta().unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(!d[0].add && d[0].set.starts_with("sel-") && d[0].element == "198.18.5.5");
    let s = inc.script();
    inc.commit(&s);
    // A local pod brings its own chains: not an element-only change.
    inc.upsert_endpoint(ep("x", "a2", "n1", "198.18.0.9", &[("pod", "a")]));
    assert_eq!(inc.element_delta(), None);
}

#[test]
fn table_delta_orders_chain_and_element_changes_for_one_transaction() {
    use tern_policy::TableChange;
    let mut set = PolicySet::new();
    set.upsert_endpoint(ep("x", "a", "n1", "198.18.0.1", &[("pod", "a")]));
    for r in resources(POLICIES) {
        set.apply(&r).unwrap();
    }
    let mut inc = Incremental::new("n1", set);
    assert_eq!(inc.table_delta(), None, "kernel state unknown");
    let full = inc.script();
    inc.commit(&full);
    // A second local pod that both policies select: its chains, their rules, then the map
    // entries jumping to them, plus its address in the sets that select it.
    inc.upsert_endpoint(ep("x", "a2", "n1", "198.18.0.9", &[("pod", "a")]));
    let d = inc.table_delta().expect("chains and elements only");
    let chain_in = pos_of(
        &d,
        |c| matches!(c, TableChange::AddChain(n) if n == "ep-in-tva2"),
    );
    let rule_in = pos_of(
        &d,
        |c| matches!(c, TableChange::AddRule { chain, .. } if chain == "ep-in-tva2"),
    );
    let entry_in = pos_of(
        &d,
        |c| matches!(c, TableChange::Element(e) if e.set == "ep-in" && e.add && e.element.contains("tva2")),
    );
    assert!(chain_in < rule_in && rule_in < entry_in, "{d:#?}");
    assert!(
        d.iter()
            .any(|c| matches!(c, TableChange::AddChain(n) if n == "ep-out-tva2"))
    );
    let last_rule = d
        .iter()
        .rev()
        .find_map(|c| match c {
            TableChange::AddRule { chain, rule } if chain == "ep-in-tva2" => Some(rule.as_str()),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_rule, "drop", "default deny ends the endpoint chain");
    let s = inc.script();
    inc.commit(&s);
    // Labels change so no ingress policy selects it: map entry out first, chain deleted last.
    inc.upsert_endpoint(ep("x", "a2", "n1", "198.18.0.9", &[("other", "a")]));
    let d = inc.table_delta().expect("chains and elements only");
    let entry_out = pos_of(
        &d,
        |c| matches!(c, TableChange::Element(e) if e.set == "ep-in" && !e.add && e.element.contains("tva2")),
    );
    let chain_gone = pos_of(
        &d,
        |c| matches!(c, TableChange::DeleteChain(n) if n == "ep-in-tva2"),
    );
    assert!(entry_out < chain_gone, "{d:#?}");
    let s = inc.script();
    inc.commit(&s);
    // Removing the last filtered endpoints changes the base chain (no more conntrack rules):
    // not expressible as a table delta.
    inc.remove_endpoint("x", "a");
    inc.remove_endpoint("x", "a2");
    assert_eq!(inc.table_delta(), None);
}

fn pos_of(d: &[tern_policy::TableChange], f: impl Fn(&tern_policy::TableChange) -> bool) -> usize {
    d.iter().position(f).unwrap()
}

const IPBLOCKS: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: wide, namespace: x}\nspec:\n  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Ingress, Egress]\n  ingress:\n  - from:\n    - ipBlock: {cidr: 198.19.0.0/16}\n    ports:\n    - {port: 80, protocol: TCP}\n  egress:\n  - to:\n    - ipBlock: {cidr: 0.0.0.0/0}\n---\n\
apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: narrow, namespace: x}\nspec:\n  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - ipBlock: {cidr: 198.19.5.0/24}\n    - ipBlock: {cidr: '2001:db8::/32'}\n    ports:\n    - {port: 80, endPort: 90, protocol: TCP}\n    - {port: 53, protocol: UDP}\n";

#[test]
fn fast_path_sets_follow_policy_changes_in_a_real_kernel() {
    let Some((ns, mut inc)) = kernel_incremental("fp") else {
        return;
    };
    let apply = |inc: &mut Incremental| apply_script(&ns, inc);
    let docs = resources(IPBLOCKS);
    // The wide policy alone, then the narrow one overlapping it (the set's elements are
    // re-cut into disjoint boxes: a delta that must delete before it adds), then back.
    inc.apply(&docs[0]).unwrap();
    apply(&mut inc);
    let fp = fast_set(&inc, "in", "v4").expect("fast path set");
    assert_eq!(
        fp.elements.keys().collect::<Vec<_>>(),
        ["198.19.0.0/16 . 6 . 80"]
    );
    let eg = fast_set(&inc, "out", "v4").expect("egress fast path");
    assert_eq!(
        eg.elements.keys().collect::<Vec<_>>(),
        ["0.0.0.0/0 . 0-255 . 0-65535"]
    );
    inc.apply(&docs[1]).unwrap();
    apply(&mut inc);
    let fp = fast_set(&inc, "in", "v4").unwrap();
    assert!(
        fp.elements.contains_key("198.19.5.0/24 . 6 . 80-90")
            && fp.elements.contains_key("198.19.5.0/24 . 17 . 53")
            && fp.elements.contains_key("198.19.0.0-198.19.4.255 . 6 . 80"),
        "{:?}",
        fp.elements.keys()
    );
    assert!(fast_set(&inc, "in", "v6").is_some());
    // Everything agrees with a fresh compile, and the kernel took every delta.
    assert_eq!(inc.desired(), fresh(&inc));
    let listing = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.0[0],
            "nft",
            "list",
            "chain",
            "inet",
            "tern",
            "ep-in-tva",
        ])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    let name = fast_name(&inc, "in", "v4").unwrap();
    assert!(
        listing.contains(&format!(
            "ip saddr . meta l4proto . th dport @{name} accept"
        )),
        "{listing}"
    );
    // A second pod with the same policies shares the set: its delta is chains, rules and
    // elements only (netlink-able), no set is declared.
    inc.upsert_endpoint(ep("x", "a3", "n1", "198.18.0.3", &[("pod", "a")]));
    let d = inc
        .table_delta()
        .expect("no set declared for a pod like one already there");
    assert!(
        d.iter().any(
            |c| matches!(c, tern_policy::TableChange::AddRule { rule, .. } if rule.contains(&name))
        ),
        "{d:#?}"
    );
    apply(&mut inc);
    inc.remove_endpoint("x", "a3");
    assert!(
        inc.table_delta().is_some(),
        "the set stays for the first pod"
    );
    apply(&mut inc);
    inc.remove(Kind::K8sNetworkPolicy, Some("x"), "wide");
    apply(&mut inc);
    // A Deny in any applicable policy makes order matter: no fast path then.
    let deny = "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: deny-some}\nspec:\n  order: 1\n  selector: has(pod)\n  types: [Ingress]\n  ingress:\n  - action: Deny\n    source: {nets: [198.19.5.7/32]}\n";
    inc.apply(&resources(deny)[0]).unwrap();
    apply(&mut inc);
    assert!(fast_set(&inc, "in", "v4").is_none());
    inc.remove(Kind::GlobalNetworkPolicy, None, "deny-some");
    apply(&mut inc);
    assert!(fast_set(&inc, "in", "v4").is_some());
    inc.remove_endpoint("x", "a");
    apply(&mut inc);
    assert!(fast_set(&inc, "in", "v4").is_none());
    assert!(fast_set(&inc, "out", "v4").is_none());
    let full = inc.full_script();
    nft(&ns.0[0], &full.text);
}

/// The name of the (only) fast-path set of a direction and family.
fn fast_name(inc: &Incremental, dir: &str, fam: &str) -> Option<String> {
    let names: Vec<String> = inc
        .desired()
        .sets
        .keys()
        .filter(|k| k.starts_with(&format!("fp-{dir}-")) && k.ends_with(fam))
        .cloned()
        .collect();
    assert!(names.len() <= 1, "{names:?}");
    names.into_iter().next()
}

fn fast_set(inc: &Incremental, dir: &str, fam: &str) -> Option<Set> {
    fast_name(inc, dir, fam).and_then(|n| inc.set_elements(&n).cloned())
}
