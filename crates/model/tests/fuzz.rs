//! Property and fuzz campaign (issue 10) for the two parsers that read hostile text: selectors
//! and YAML/JSON streams. Runs on stable Rust with `proptest`, in CI with a bounded number of
//! cases per property (see `CASES`/`YAML_CASES`; the total run is a few seconds in a debug
//! build). Set `PROPTEST_CASES` to run a longer campaign locally.
//!
//! Properties: the selector parser never panics and never recurses past its limits on any
//! text; what it accepts prints to a canonical form that parses back to the same tree; and
//! its evaluation agrees with a naive reference evaluator on small generated selectors. The
//! stream reader never panics on random or mutated input, and returns within a time bound.
//! Every crash found became a named regression test in `tests/limits.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tern_model::{Selector, parse_documents};

/// Cases per selector property in CI.
const CASES: u32 = 512;
/// Cases per YAML property in CI (each parses a whole stream).
const YAML_CASES: u32 = 256;

fn config(cases: u32) -> ProptestConfig {
    // PROPTEST_CASES (read by `ProptestConfig::default`) overrides for a longer campaign.
    let default = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            default.cases
        } else {
            cases
        },
        ..default
    }
}

// ---------------------------------------------------------------------------------------------
// Selectors

/// One of `ts`, uniformly: in a `prop_oneof!` weighted by `ts.len()`, as likely as each token
/// being an arm of its own.
fn tokens(ts: &'static [&'static str]) -> impl Strategy<Value = String> + use<> {
    prop::sample::select(ts).prop_map(str::to_string)
}

/// Every token of the selector grammar.
const SELECTOR_TOKENS: &[&str] = &[
    "(",
    ")",
    "!",
    " && ",
    " || ",
    "&",
    "|",
    "==",
    "!=",
    " in ",
    " not in ",
    "{",
    "}",
    ",",
    "all()",
    "global()",
    "has(",
    " contains ",
    " starts with ",
    " ends with ",
];

/// Fragments that make adversarial selector text when concatenated at random: every token of
/// the grammar, plus broken ones.
fn selector_fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        SELECTOR_TOKENS.len() as u32 => tokens(SELECTOR_TOKENS),
        1 => "[a-z][a-z0-9./_-]{0,6}",
        1 => "'[a-z' \"]{0,4}'",
        1 => "\"[a-z']{0,4}\"",
        1 => "[ \t\n]{1,2}",
        1 => any::<char>().prop_map(|c| c.to_string()),
    ]
}

fn adversarial_selector() -> impl Strategy<Value = String> {
    prop::collection::vec(selector_fragment(), 0..80).prop_map(|v| v.concat())
}

fn key() -> impl Strategy<Value = String> {
    tokens(&["a", "b", "c"])
}

fn value() -> impl Strategy<Value = String> {
    tokens(&["", "x", "y", "xy"])
}

/// A small selector tree over a few keys and values, for the reference comparison. The tree
/// is the crate's own `Selector` (plain data); what is compared is the parser and `matches`
/// against [`ref_text`] and [`ref_eval`], written here without the crate's code.
fn ref_tree() -> impl Strategy<Value = Selector> {
    let set = || prop::collection::btree_set(value(), 0..3);
    let leaf = prop_oneof![
        Just(Selector::All),
        Just(Selector::Global),
        key().prop_map(Selector::Has),
        (key(), value()).prop_map(|(k, v)| Selector::Eq(k, v)),
        (key(), value()).prop_map(|(k, v)| Selector::Ne(k, v)),
        (key(), set()).prop_map(|(k, v)| Selector::In(k, v)),
        (key(), set()).prop_map(|(k, v)| Selector::NotIn(k, v)),
        (key(), value()).prop_map(|(k, v)| Selector::Contains(k, v)),
        (key(), value()).prop_map(|(k, v)| Selector::StartsWith(k, v)),
        (key(), value()).prop_map(|(k, v)| Selector::EndsWith(k, v)),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Selector::Not(Box::new(e))),
            prop::collection::vec(inner.clone(), 2..4).prop_map(Selector::And),
            prop::collection::vec(inner, 2..4).prop_map(Selector::Or),
        ]
    })
}

/// Fully parenthesised text of a tree: precedence never matters.
fn ref_text(r: &Selector) -> String {
    let set = |vs: &BTreeSet<String>| {
        vs.iter()
            .map(|v| format!("'{v}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let join = |es: &[Selector], op: &str| {
        es.iter()
            .map(|e| format!("({})", ref_text(e)))
            .collect::<Vec<_>>()
            .join(op)
    };
    match r {
        Selector::All => "all()".into(),
        Selector::Global => "global()".into(),
        Selector::Has(k) => format!("has({k})"),
        Selector::Eq(k, v) => format!("{k} == '{v}'"),
        Selector::Ne(k, v) => format!("{k} != '{v}'"),
        Selector::In(k, vs) => format!("{k} in {{{}}}", set(vs)),
        Selector::NotIn(k, vs) => format!("{k} not in {{{}}}", set(vs)),
        Selector::Contains(k, v) => format!("{k} contains '{v}'"),
        Selector::StartsWith(k, v) => format!("{k} starts with '{v}'"),
        Selector::EndsWith(k, v) => format!("{k} ends with '{v}'"),
        Selector::Not(e) => format!("!({})", ref_text(e)),
        Selector::And(es) => join(es, " && "),
        Selector::Or(es) => join(es, " || "),
    }
}

/// The naive reference semantics (Calico's): `!=` and `not in` match an absent label.
fn ref_eval(r: &Selector, l: &BTreeMap<String, String>) -> bool {
    let get = |k: &String| l.get(k);
    match r {
        Selector::All | Selector::Global => true,
        Selector::Has(k) => get(k).is_some(),
        Selector::Eq(k, v) => get(k) == Some(v),
        Selector::Ne(k, v) => get(k) != Some(v),
        Selector::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
        Selector::NotIn(k, vs) => !get(k).is_some_and(|x| vs.contains(x)),
        Selector::Contains(k, v) => get(k).is_some_and(|x| x.contains(v.as_str())),
        Selector::StartsWith(k, v) => get(k).is_some_and(|x| x.starts_with(v.as_str())),
        Selector::EndsWith(k, v) => get(k).is_some_and(|x| x.ends_with(v.as_str())),
        Selector::Not(e) => !ref_eval(e, l),
        Selector::And(es) => es.iter().all(|e| ref_eval(e, l)),
        Selector::Or(es) => es.iter().any(|e| ref_eval(e, l)),
    }
}

fn label_set() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(key(), value(), 0..3)
}

proptest! {
    #![proptest_config(config(CASES))]

    /// Any text: no panic; an accepted selector's canonical form re-parses to the same tree
    /// and prints identically (printing is a fixed point).
    #[test]
    fn selector_parse_never_panics_and_round_trips(text in adversarial_selector()) {
        if let Ok(s) = Selector::parse(&text) {
            let printed = s.to_string();
            let again = Selector::parse(&printed)
                .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}: {e}"));
            prop_assert_eq!(&again, &s);
            prop_assert_eq!(again.to_string(), printed);
        }
    }

    /// Arbitrary Unicode, including text far past the length limit.
    #[test]
    fn selector_parse_of_arbitrary_text_never_panics(text in "\\PC{0,5000}") {
        let _ = Selector::parse(&text);
    }

    /// Random nesting of parentheses and bangs around random chains: accepted exactly when
    /// within the depth limit, and never overflows.
    #[test]
    fn selector_depth_is_enforced_exactly(
        opens in prop::collection::vec(prop::bool::ANY, 0..60),
        terms in 1usize..6,
    ) {
        let mut text = String::new();
        let mut parens = 0;
        for is_paren in &opens {
            if *is_paren { text.push('('); parens += 1 } else { text.push('!') }
        }
        text.push_str(&vec!["has(a)"; terms].join(" || "));
        text.push_str(&")".repeat(parens));
        let r = Selector::parse(&text);
        prop_assert_eq!(r.is_ok(), opens.len() <= tern_model::limits::MAX_SELECTOR_DEPTH, "{}", text);
    }

    /// Parser and evaluator agree with the naive reference on small selectors and label sets.
    #[test]
    fn selector_evaluation_matches_reference(r in ref_tree(), sets in prop::collection::vec(label_set(), 1..6)) {
        let text = ref_text(&r);
        let s = Selector::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let canonical = Selector::parse(&s.to_string()).unwrap();
        for l in &sets {
            prop_assert_eq!(s.matches(l), ref_eval(&r, l), "{} on {:?}", text, l);
            prop_assert_eq!(canonical.matches(l), ref_eval(&r, l), "{} on {:?}", s, l);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// YAML / JSON streams

/// Longest a stream of these sizes may take to be read or refused in a debug build: the
/// reader is linear, so this is generous; a quadratic path blows through it.
const TIME_BOUND: Duration = Duration::from_secs(2);

const VALID_STREAM: &str = "\
# pools and a policy
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-a
  labels: {zone: a}
  annotations:
    note: 'it''s [not] {a} flow'
spec:
  cidr: 10.244.0.0/16
  nodeSelector: \"zone in {'a', 'b'} && !has(edge)\"
---
{\"apiVersion\": \"tern.dev/v1\", \"kind\": \"IPPool\", \"metadata\": {\"name\": \"j\"}, \"spec\": {\"cidr\": \"10.9.0.0/16\"}}
---
apiVersion: tern.dev/v1
kind: GlobalNetworkPolicy
metadata: {name: g}
spec:
  selector: all()
  ingress:
  - action: Allow
    protocol: TCP
    source: {selector: \"role == 'db'\", nets: [10.0.0.0/8]}
    destination:
      ports: [80, '8000:8080']
  egress:
  - action: Deny
---
apiVersion: v1
kind: List
items:
- {apiVersion: tern.dev/v1, kind: IPReservation, metadata: {name: r}, spec: {reservedCIDRs: [10.0.0.0/30]}}
";

/// One edit of a valid stream: insert fragments that stress the pre-scan and the parser.
#[derive(Debug, Clone)]
enum Mutation {
    Insert(usize, String),
    Delete(usize, usize),
    Duplicate(usize, usize),
}

/// YAML punctuation that makes streams hostile.
const YAML_TOKENS: &[&str] = &[
    "\n---\n", "\n...\n", "'", "\"", ": |\n", "- - - ", "&a ", "*a", "!!str ", "\t", "#",
];

fn yaml_fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        YAML_TOKENS.len() as u32 => tokens(YAML_TOKENS),
        1 => "[\\[\\]{}]{1,80}",
        1 => "(\\[){0,200}",
        1 => "\n {0,40}[a-z]{1,3}: ",
        1 => "\\PC{0,20}",
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), yaml_fragment()).prop_map(|(p, s)| Mutation::Insert(p, s)),
        (any::<usize>(), 0usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), 0usize..200).prop_map(|(p, n)| Mutation::Duplicate(p, n)),
    ]
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(text: &str, muts: &[Mutation]) -> String {
    let mut s = text.to_string();
    for m in muts {
        match m {
            Mutation::Insert(p, frag) => {
                let at = floor_char(&s, p % (s.len() + 1));
                s.insert_str(at, frag);
            }
            Mutation::Delete(p, n) => {
                let a = floor_char(&s, p % (s.len() + 1));
                let b = floor_char(&s, a + n);
                s.replace_range(a..b, "");
            }
            Mutation::Duplicate(p, n) => {
                let a = floor_char(&s, p % (s.len() + 1));
                let b = floor_char(&s, a + n);
                let piece = s[a..b].to_string();
                s.insert_str(b, &piece);
            }
        }
    }
    s
}

/// Parses and validates within the time bound; panics are the failures proptest reports.
fn read_within_bound(text: &str, file: &str) {
    let t = Instant::now();
    if let Ok(rs) = parse_documents(text, file) {
        for r in &rs {
            let _ = r.validate();
        }
    }
    let took = t.elapsed();
    assert!(took < TIME_BOUND, "{} bytes took {took:?}", text.len());
}

proptest! {
    #![proptest_config(config(YAML_CASES))]

    #[test]
    fn valid_stream_parses(_x in Just(())) {
        let rs = parse_documents(VALID_STREAM, "v.yaml").unwrap();
        prop_assert_eq!(rs.len(), 4);
        for r in &rs {
            r.validate().unwrap();
        }
    }

    /// Random bytes (as lossy UTF-8) never panic and stay within the time bound.
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        let text = String::from_utf8_lossy(&bytes);
        read_within_bound(&text, "r.yaml");
        read_within_bound(&text, "r.json");
    }

    /// Mutations of a valid stream (brackets, quotes, markers, anchors, duplicated spans)
    /// never panic and stay within the time bound.
    #[test]
    fn mutated_streams_never_panic(muts in prop::collection::vec(mutation(), 1..8)) {
        let text = apply(VALID_STREAM, &muts);
        read_within_bound(&text, "m.yaml");
    }

    /// Large repetitions of hostile shapes (up to ~1 MB): refused or read in linear time.
    #[test]
    fn big_hostile_shapes_stay_linear(
        depth in 1usize..200,
        copies in 1usize..2000,
        shape in 0usize..3,
    ) {
        let one = match shape {
            0 => format!("a: {}{}\n", "[".repeat(depth), "]".repeat(depth)),
            1 => format!("{}x\n", "- ".repeat(depth)),
            _ => format!("{{\"a\": {}1{}}}\n", "[".repeat(depth), "]".repeat(depth)),
        };
        let text = one.repeat(copies.min(1_000_000 / one.len().max(1)));
        read_within_bound(&text, "big.yaml");
    }
}

/// Known-tricky inputs pinned by name, so a regression shows even with few cases.
#[test]
fn known_tricky_inputs() {
    for text in [
        "((",
        "!",
        "has(",
        "a in {",
        "a == '",
        "a not",
        "(all()) )",
        "\u{0}",
    ] {
        assert!(Selector::parse(text).is_err(), "{text:?}");
    }
    read_within_bound(
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        "x.yaml",
    );
    read_within_bound("--- --- ---\n--- [\n", "x.yaml");
    read_within_bound("a: \"\n[[[[\n", "x.yaml");
}
