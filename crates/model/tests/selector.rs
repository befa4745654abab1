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
fn table(sel: &str, cases: Cases) {
    let s = Selector::parse(sel).unwrap_or_else(|e| panic!("{e}"));
    for (ls, want) in cases {
        assert_eq!(s.matches(&labels(ls)), *want, "{sel} on {ls:?}");
        // The canonical form means the same thing.
        let again = Selector::parse(&s.to_string()).unwrap();
        assert_eq!(again, s, "round trip of {sel} via {s}");
    }
}

/// A truth table: `sets` are its columns, and each row is a selector with one character per
/// column: `1` it matches that label set, `0` it does not, `-` not asserted. Each row is
/// checked as [`table`].
fn truth(sets: &[&[(&str, &str)]], rows: &[(&str, &str)]) {
    for (sel, want) in rows {
        assert_eq!(want.len(), sets.len(), "row {sel:?}: one mark per column");
        let cases: Vec<(&[(&str, &str)], bool)> = sets
            .iter()
            .zip(want.chars())
            .filter_map(|(ls, c)| match c {
                '1' => Some((*ls, true)),
                '0' => Some((*ls, false)),
                '-' => None,
                _ => panic!("row {sel:?}: mark {c:?} is not 1, 0 or -"),
            })
            .collect();
        table(sel, &cases);
    }
}

/// Label sets and the truth value a selector must have on each.
type Cases<'a> = &'a [(&'a [(&'a str, &'a str)], bool)];

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
    let sets = [NONE, A, C_EDGE, A_EDGE];
    truth(&sets, &[("has(edge)", "0011"), ("!has(edge)", "1100")]);
}

#[test]
fn equality_and_inequality() {
    let sets = [NONE, A, B, C_EDGE, A_EDGE];
    truth(
        &sets,
        &[
            ("zone == 'a'", "010--"),
            ("zone == \"a\"", "010--"),
            // Calico: != also matches when the label is absent.
            ("zone != 'a'", "101--"),
            ("edge == ''", "0--10"),
        ],
    );
}

#[test]
fn set_membership() {
    let sets = [NONE, A, B, C_EDGE];
    truth(
        &sets,
        &[
            ("zone in {'a', 'b'}", "0110"),
            ("zone not in {'a','b'}", "1001"),
            ("zone in {}", "00--"),
            ("zone not in {}", "11--"),
        ],
    );
}

#[test]
fn string_operators() {
    let sets = [&[("host", "rack1-node7")][..], NONE, A];
    truth(
        &sets,
        &[
            ("host contains 'node'", "100"),
            ("host starts with 'rack1'", "10-"),
            ("host ends with 'node7'", "10-"),
            ("host ends with 'rack1'", "0--"),
        ],
    );
}

#[test]
fn boolean_operators_and_precedence() {
    let sets = [NONE, A, B, C_EDGE, A_EDGE, &[("zone", "c")][..]];
    truth(
        &sets,
        &[
            ("zone == 'a' && has(edge)", "00-01-"),
            ("zone == 'a' || has(edge)", "01011-"),
            // && binds tighter than ||: a || (b && c).
            ("zone == 'b' || zone == 'a' && has(edge)", "-01-1-"),
            ("(zone == 'b' || zone == 'a') && has(edge)", "-00-1-"),
            // ! binds tightest: (!has(edge)) && zone == 'a'.
            ("!has(edge) && zone == 'a'", "-10-0-"),
            ("!(has(edge) && zone == 'a')", "-1-10-"),
            ("!!has(edge)", "-0-1--"),
            (
                "all() && zone != 'c' || global() && has(edge) && zone == 'c'",
                "1--1-0",
            ),
        ],
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

/// The first resource of a `tern.dev/v1` document of `kind` named `name` whose spec is the one
/// YAML line `spec`.
fn first_document(kind: &str, name: &str, spec: &str) -> Resource {
    let yaml = format!(
        "apiVersion: tern.dev/v1\nkind: {kind}\nmetadata:\n  name: {name}\nspec:\n  {spec}\n"
    );
    let docs = parse_documents(&yaml, "doc.yaml").unwrap_or_else(|e| panic!("{e}"));
    docs.into_iter()
        .next()
        .unwrap_or_else(|| panic!("no resource in {yaml}"))
}

#[test]
fn ip_reservation_resource() {
    let doc = first_document(
        "IPReservation",
        "gw",
        "reservedCIDRs: [10.0.0.0/30, 10.0.1.7, 'fd00::/120']",
    );
    let Resource::IpReservation(r) = &doc else {
        panic!("{doc:?}")
    };
    assert_eq!(doc.kind(), Kind::IpReservation);
    assert_eq!(r.spec.nets().len(), 3);
    assert_eq!(r.spec.nets()[1].to_string(), "10.0.1.7/32");
    doc.validate().unwrap();
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
    let doc = first_document("IPAMConfig", "default", "strictAffinity: true");
    let Resource::IpamConfig(c) = &doc else {
        panic!("{doc:?}")
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
