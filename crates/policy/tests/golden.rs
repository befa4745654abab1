//! Golden replay of the incremental policy compiler (holo's pattern): each directory under
//! `tests/golden/` is one scenario. `config.yaml` names the node and holds the initial
//! resources (namespaces, workload endpoints, policies, as stored); `events.yaml` lists store
//! changes (`apply` a YAML stream, or `delete` one object by kind and name); `output.nft`
//! is the nft script [`Incremental`] renders after the config (a full resync) and after every
//! event (a delta), each then committed, with the set-element fast path when it applies.
//! After every step the incremental state must equal a fresh compile and the table of
//! `tern_policy::compile()` (only policies selecting a local endpoint have chains). Pure: no
//! kernel.
//!
//! Regenerate the expected files with `TERN_GOLDEN_UPDATE=1 cargo test -p tern-policy --test
//! golden`, then review the diff.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_norway::Value;
use tern_model::{Kind, Resource};
use tern_policy::{Incremental, PolicySet};
use tern_testkit::golden;

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_mapping()?.get(Value::from(key))
}

fn text(v: &Value, key: &str, ctx: &str) -> String {
    field(v, key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{ctx}: `{key}` must be a string"))
        .to_string()
}

fn resources(yaml: &str, ctx: &str) -> Vec<Resource> {
    tern_model::parse_documents(yaml, ctx).unwrap_or_else(|e| panic!("{ctx}: {e}"))
}

/// Renders the pending change, checks it against a fresh compile, and commits it.
fn step(out: &mut String, title: &str, inc: &mut Incremental) {
    let fresh = Incremental::new(inc.node(), inc.policy_set().clone()).desired();
    assert_eq!(
        inc.desired(),
        fresh,
        "{title}: incremental state != fresh compile"
    );
    assert_eq!(
        inc.desired(),
        tern_policy::compile(inc.policy_set(), inc.node()),
        "{title}: incremental state != compile()"
    );
    let script = inc.script();
    writeln!(out, "## {title}").unwrap();
    match inc.element_delta() {
        Some(changes) if !changes.is_empty() => {
            writeln!(out, "# element fast path:").unwrap();
            for c in changes {
                let sign = if c.add { '+' } else { '-' };
                writeln!(out, "#   {sign} {} {{ {} }}", c.set, c.element).unwrap();
            }
        }
        _ => {}
    }
    let kind = if script.full { "full" } else { "delta" };
    if script.text.trim().is_empty() {
        writeln!(out, "# {kind}: nothing to do").unwrap();
    } else {
        writeln!(out, "# {kind}:").unwrap();
        out.push_str(script.text.trim_end());
        out.push('\n');
    }
    out.push('\n');
    inc.commit(&script);
    assert_eq!(inc.pending(), 0, "{title}: pending after commit");
}

fn run(dir: &Path) -> String {
    let read = |f: &str| -> (String, Value) {
        let v = golden::parse(dir, f, |t| serde_norway::from_str(t));
        (dir.join(f).display().to_string(), v)
    };
    let (cfg_name, cfg) = read("config.yaml");
    let mut inc = Incremental::new(&text(&cfg, "node", &cfg_name), PolicySet::new());
    if let Some(r) = field(&cfg, "resources") {
        let yaml = r.as_str().expect("config `resources` is a YAML stream");
        for r in resources(yaml, &cfg_name) {
            inc.apply(&r).unwrap_or_else(|e| panic!("{cfg_name}: {e}"));
        }
    }
    let mut out = String::new();
    step(&mut out, "config", &mut inc);
    let (ev_name, events) = read("events.yaml");
    let events = events.as_sequence().expect("events.yaml is a list");
    for (i, e) in events.iter().enumerate() {
        let ctx = format!("{ev_name}: event {}", i + 1);
        let note = text(e, "note", &ctx);
        match (field(e, "apply"), field(e, "delete")) {
            (Some(y), None) => {
                let yaml = y
                    .as_str()
                    .unwrap_or_else(|| panic!("{ctx}: `apply` is a string"));
                for r in resources(yaml, &ctx) {
                    inc.apply(&r).unwrap_or_else(|err| panic!("{ctx}: {err}"));
                }
            }
            (None, Some(d)) => {
                let kind: Kind = text(d, "kind", &ctx)
                    .parse()
                    .unwrap_or_else(|err| panic!("{ctx}: {err}"));
                let ns = field(d, "namespace").and_then(Value::as_str);
                inc.remove(kind, ns, &text(d, "name", &ctx));
            }
            _ => panic!("{ctx}: set exactly one of `apply`, `delete`"),
        }
        step(&mut out, &format!("event {}: {note}", i + 1), &mut inc);
    }
    out
}

#[test]
fn policy_scenarios_match_golden_outputs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    golden::check(&root, "output.nft", 4, run);
}
