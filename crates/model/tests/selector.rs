//! The selector language: truth tables over label sets, parser errors with positions, and the
//! canonical printed form.

use std::collections::BTreeMap;

use tern_model::{
    IpPool, IpPoolSpec, IpReservation, IpReservationSpec, IpamConfig, IpamConfigSpec, Kind,
    Resource, Selector, parse_documents,
};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Evaluates `sel` on each label set and compares with the expected truth values.
fn table(sel: &str, cases: &[(&[(&str, &str)], bool)]) {
    let s = Selector::parse(sel).unwrap_or_else(|e| panic!("{e}"));
    for (ls, want) in cases {
        assert_eq!(s.matches(&labels(ls)), *want, "{sel} on {ls:?}");
        // The canonical form means the same thing.
        let again = Selector::parse(&s.to_string()).unwrap();
        assert_eq!(again, s, "round trip of {sel} via {s}");
    }
}

const NONE: &[(&str, &str)] = &[];
const A: &[(&str, &str)] = &[("zone", "a")];
const B: &[(&str, &str)] = &[("zone", "b")];
const C_EDGE: &[(&str, &str)] = &[("zone", "c"), ("edge", "")];
const A_EDGE: &[(&str, &str)] = &[("zone", "a"), ("edge", "true")];

#[test]
fn all_and_global_select_everything() {
    for sel in ["all()", "global()", "", "   ", "( all() )"] {
        table(sel, &[(NONE, true), (A, true), (C_EDGE, true)]);
    }
    assert!(Selector::parse("all()").unwrap().is_all());
    assert!(Selector::parse("").unwrap().is_all());
    assert!(!Selector::parse("!all()").unwrap().is_all());
    table("!all()", &[(NONE, false), (A, false)]);
}

#[test]
fn has_and_not_has() {
    table(
        "has(edge)",
        &[(NONE, false), (A, false), (C_EDGE, true), (A_EDGE, true)],
    );
    table(
        "!has(edge)",
        &[(NONE, true), (A, true), (C_EDGE, false), (A_EDGE, false)],
    );
}

#[test]
fn equality_and_inequality() {
    table("zone == 'a'", &[(NONE, false), (A, true), (B, false)]);
    table("zone == \"a\"", &[(NONE, false), (A, true), (B, false)]);
    // Calico: != also matches when the label is absent.
    table("zone != 'a'", &[(NONE, true), (A, false), (B, true)]);
    table(
        "edge == ''",
        &[(NONE, false), (C_EDGE, true), (A_EDGE, false)],
    );
}

#[test]
fn set_membership() {
    table(
        "zone in {'a', 'b'}",
        &[(NONE, false), (A, true), (B, true), (C_EDGE, false)],
    );
    table(
        "zone not in {'a','b'}",
        &[(NONE, true), (A, false), (B, false), (C_EDGE, true)],
    );
    table("zone in {}", &[(NONE, false), (A, false)]);
    table("zone not in {}", &[(NONE, true), (A, true)]);
}

#[test]
fn string_operators() {
    let host = &[("host", "rack1-node7")][..];
    table(
        "host contains 'node'",
        &[(host, true), (NONE, false), (A, false)],
    );
    table("host starts with 'rack1'", &[(host, true), (NONE, false)]);
    table("host ends with 'node7'", &[(host, true), (NONE, false)]);
    table("host ends with 'rack1'", &[(host, false)]);
}

#[test]
fn boolean_operators_and_precedence() {
    table(
        "zone == 'a' && has(edge)",
        &[(A, false), (A_EDGE, true), (C_EDGE, false), (NONE, false)],
    );
    table(
        "zone == 'a' || has(edge)",
        &[
            (A, true),
            (A_EDGE, true),
            (C_EDGE, true),
            (NONE, false),
            (B, false),
        ],
    );
    // && binds tighter than ||: a || (b && c).
    table(
        "zone == 'b' || zone == 'a' && has(edge)",
        &[(B, true), (A, false), (A_EDGE, true)],
    );
    table(
        "(zone == 'b' || zone == 'a') && has(edge)",
        &[(B, false), (A, false), (A_EDGE, true)],
    );
    // ! binds tightest: (!has(edge)) && zone == 'a'.
    table(
        "!has(edge) && zone == 'a'",
        &[(A, true), (A_EDGE, false), (B, false)],
    );
    table(
        "!(has(edge) && zone == 'a')",
        &[(A, true), (A_EDGE, false), (C_EDGE, true)],
    );
    table("!!has(edge)", &[(A, false), (C_EDGE, true)]);
    table(
        "all() && zone != 'c' || global() && has(edge) && zone == 'c'",
        &[(NONE, true), (C_EDGE, true), (&[("zone", "c")], false)],
    );
}

#[test]
fn keys_may_contain_prefixes_and_punctuation() {
    table(
        "kubernetes.io/hostname == 'node-1' && topology.kubernetes.io/zone in {'eu-1a'}",
        &[
            (
                &[
                    ("kubernetes.io/hostname", "node-1"),
                    ("topology.kubernetes.io/zone", "eu-1a"),
                ],
                true,
            ),
            (&[("kubernetes.io/hostname", "node-1")], false),
        ],
    );
}

#[test]
fn canonical_form() {
    let s = Selector::parse("a=='x'||b=='y'&&!(c in {'2','1'})").unwrap();
    assert_eq!(s.to_string(), "a == 'x' || (b == 'y' && !c in {'1', '2'})");
    let s = Selector::parse("v == \"it's\"").unwrap();
    assert_eq!(s.to_string(), "v == \"it's\"");
    assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
}

/// Parses `sel`, expecting an error at `pos` whose message contains `needle`.
fn bad(sel: &str, pos: usize, needle: &str) {
    let e = Selector::parse(sel).expect_err(sel);
    assert_eq!(e.position, pos, "{sel}: {e}");
    assert!(e.message.contains(needle), "{sel}: {e}");
    let text = e.to_string();
    assert!(text.contains(&format!("position {pos}")), "{text}");
    assert!(text.contains(sel.trim()), "{text}");
}

#[test]
fn parse_errors_name_the_position() {
    bad("zone = 'a'", 5, "did you mean \"==\"");
    bad("zone == 'a", 8, "unterminated string");
    bad("zone == a", 8, "expected a quoted string");
    bad("zone", 4, "expected an operator after label key \"zone\"");
    bad("zone == 'a' &&", 14, "unexpected end of selector");
    bad("(zone == 'a'", 12, "expected ')'");
    bad(
        "zone == 'a')",
        11,
        "unexpected ')' after a complete expression",
    );
    bad("zone in 'a'", 8, "expected '{'");
    bad("zone in {'a' 'b'}", 13, "expected ',' or '}'");
    bad("zone not {'a'}", 9, "expected 'in' after 'not'");
    bad("has()", 4, "expected a label key in has()");
    bad("has(a", 5, "')' closing has(");
    bad("foo()", 0, "unknown function foo()");
    bad("zone == 'a' zone == 'b'", 12, "unexpected \"zone\"");
    bad("zone starts 'a'", 12, "expected 'with'");
    bad("zone == 'a' & has(x)", 12, "did you mean \"&&\"");
    bad("zone == 'a' #", 12, "unexpected character '#'");
    bad("&& x", 0, "expected a label key");
}

#[test]
fn pool_node_selector_is_validated() {
    let mut spec = IpPoolSpec::new("10.0.0.0/16");
    spec.node_selector = "zone == 'a' &&".into();
    let e = Resource::from(IpPool::new("p", spec))
        .validate()
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("spec.nodeSelector"), "{text}");
    assert!(text.contains("position 14"), "{text}");
    let mut spec = IpPoolSpec::new("10.0.0.0/16");
    spec.node_selector = "zone in {'a','b'} && !has(edge)".into();
    Resource::from(IpPool::new("p", spec)).validate().unwrap();
}

#[test]
fn ip_reservation_resource() {
    let docs = parse_documents(
        "apiVersion: tern.dev/v1\nkind: IPReservation\nmetadata:\n  name: gw\nspec:\n  reservedCIDRs: [10.0.0.0/30, 10.0.1.7, 'fd00::/120']\n",
        "r.yaml",
    )
    .unwrap();
    let Resource::IpReservation(r) = &docs[0] else {
        panic!("{docs:?}")
    };
    assert_eq!(docs[0].kind(), Kind::IpReservation);
    assert_eq!(r.spec.nets().len(), 3);
    assert_eq!(r.spec.nets()[1].to_string(), "10.0.1.7/32");
    docs[0].validate().unwrap();
    assert_eq!(
        "ipreservations".parse::<Kind>().unwrap(),
        Kind::IpReservation
    );
    assert!(!Kind::IpReservation.namespaced());

    let bad = |cidrs: &[&str], needle: &str| {
        let r = IpReservation::new(
            "r",
            IpReservationSpec {
                reserved_cidrs: cidrs.iter().map(|s| s.to_string()).collect(),
            },
        );
        let e = Resource::from(r).validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    bad(&[], "at least one CIDR");
    bad(
        &["10.0.0.1/24"],
        "spec.reservedCIDRs[0]: 10.0.0.1/24 is not a network address",
    );
    bad(&["10.0.0.0/24", "nope"], "spec.reservedCIDRs[1]");
}

#[test]
fn ipam_config_new_fields_default_and_validate() {
    let docs = parse_documents(
        "apiVersion: tern.dev/v1\nkind: IPAMConfig\nmetadata:\n  name: default\nspec:\n  strictAffinity: true\n",
        "c.yaml",
    )
    .unwrap();
    let Resource::IpamConfig(c) = &docs[0] else {
        panic!()
    };
    assert_eq!(c.spec.release_cooldown_seconds, 0);
    assert_eq!(c.spec.empty_block_grace_seconds, 300);
    let c = IpamConfig::new(
        "default",
        IpamConfigSpec {
            release_cooldown_seconds: 5000,
            ..IpamConfigSpec::default()
        },
    );
    let e = Resource::from(c).validate().unwrap_err().to_string();
    assert!(e.contains("spec.releaseCooldownSeconds"), "{e}");
}
