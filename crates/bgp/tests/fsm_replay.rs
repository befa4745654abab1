//! FSM replay: recorded event sequences (`tests/replay/*.events.jsonl`) run against a fresh
//! [`Session`]; the state and actions after every event must equal the golden file
//! (`*.golden.jsonl`). Regenerate goldens with `TERN_BGP_BLESS=1 cargo test -p tern-bgp`.
//!
//! An events file starts with `{"config": SessionConfig}`; every further line has `at_ms` and
//! either `event` (an [`Event`]) or `bytes` (a received message in hex, decoded with the
//! session's codec options into `MessageReceived` or `MessageInvalid`, as the driver does).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tern_bgp::codec::decode_with;
use tern_bgp::fsm::{Event, Session, SessionConfig};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn run(events_path: &Path) -> String {
    let text = std::fs::read_to_string(events_path).unwrap();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first: Value = serde_json::from_str(lines.next().expect("config line")).unwrap();
    let config: SessionConfig = serde_json::from_value(first["config"].clone()).unwrap();
    let mut session = Session::new(config);
    let mut out = String::new();
    for (n, line) in lines.enumerate() {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: {e}", events_path.display(), n + 2));
        let at_ms = v["at_ms"].as_u64().expect("at_ms");
        let event: Event = if let Some(hex) = v["bytes"].as_str() {
            match decode_with(&unhex(hex), session.codec_options()) {
                Ok(m) => Event::MessageReceived(m),
                Err(e) => Event::MessageInvalid(e),
            }
        } else {
            serde_json::from_value(v["event"].clone()).unwrap()
        };
        let actions = session.handle(event.clone(), Duration::from_millis(at_ms));
        let mut rec = json!({
            "at_ms": at_ms,
            "event": event,
            "state": session.state(),
            "actions": actions,
        });
        if let Some(note) = v.get("note") {
            rec["note"] = note.clone();
        }
        out.push_str(&serde_json::to_string(&rec).unwrap());
        out.push('\n');
    }
    out
}

#[test]
fn replays_match_golden_outputs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/replay");
    let bless = std::env::var("TERN_BGP_BLESS").is_ok_and(|v| v == "1");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".events.jsonl"))
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 5,
        "replay cases missing in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for events in cases {
        let golden = PathBuf::from(
            events
                .to_string_lossy()
                .replace(".events.jsonl", ".golden.jsonl"),
        );
        let got = run(&events);
        if bless {
            std::fs::write(&golden, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_default();
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .map_or_else(
                    || "length differs".to_string(),
                    |i| format!("line {}", i + 1),
                );
            failures.push(format!("{} ({line})", golden.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "golden mismatch (rerun with TERN_BGP_BLESS=1 after checking the change): {failures:?}"
    );
}
