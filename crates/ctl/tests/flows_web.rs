//! The flows page (`ternctl flows --web`) in a real headless chromium (Debian's, driven by
//! chromedriver over WebDriver), both in a test namespace with the page's server.
//!
//! Here the server's source gives records made by the test, as a node's agent would send
//! them, so every element of the page can be checked against known data: the table, the
//! graph's edges coloured by verdict, clicking a denied edge naming the policy and rule, the
//! filters, the token. The lab test (`lab_flows.rs`) shows the page with a real connection.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tern_api::flow::{FlowQuery, FlowRecord, FlowReply};
use tern_ctl::commands::flows::{Follower, Pages};
use tern_ctl::commands::flows_web;
use tern_testkit::netns::Netns;
use tern_testkit::webdriver::Browser;

fn record(seq: u64, src: &str, dst: &str, verdict: &str, extra: &str) -> FlowRecord {
    let end = |s: &str| {
        let (ns, pod) = s.split_once('/').unwrap();
        format!(
            r#"{{"ip":"10.244.0.{seq}","port":8080,"kind":"pod","namespace":"{ns}","pod":"{pod}","labels":{{"app":"{pod}"}}}}"#
        )
    };
    serde_json::from_str(&format!(
        r#"{{"seq":{seq},"time":"2026-12-05T09:40:{:02}.000Z","node":"node1","direction":"ingress",
        "proto":"tcp","src":{},"dst":{},"verdict":"{verdict}",{extra}}}"#,
        seq % 60,
        end(src),
        end(dst)
    ))
    .unwrap()
}

/// A source that serves `records` once to each node's first ask, then the ones pushed later.
struct Fake {
    records: Mutex<Vec<FlowRecord>>,
}

impl Pages for &Fake {
    fn node(&self) -> &str {
        "node1"
    }

    fn page(&self, q: &FlowQuery) -> anyhow::Result<FlowReply> {
        Ok(self.reply(q))
    }
}

impl Fake {
    fn reply(&self, q: &FlowQuery) -> FlowReply {
        let all = self.records.lock().unwrap();
        let after = q.after_seq.unwrap_or(0);
        let records: Vec<FlowRecord> = all.iter().filter(|r| r.seq > after).cloned().collect();
        FlowReply {
            node: "node1".into(),
            last_seq: all.last().map_or(0, |r| r.seq),
            records,
            dropped: 3,
            more: false,
        }
    }
}

#[test]
fn page_shows_flows_and_names_the_policy_of_a_denied_edge() {
    tern_testkit::need_root();
    let ns = Netns::new("web");
    let fake = Arc::new(Fake {
        records: Mutex::new(vec![
            record(1, "x/a", "y/b", "allowed", r#""reason":"no-policy""#),
            record(
                2,
                "x/a",
                "z/web-7c9d8f6b5-x2k4q",
                "allowed",
                r#""reason":"rule","policies":[{"kind":"KubernetesNetworkPolicy","namespace":"z","name":"allow-x","rule":"ingress[0]"}]"#,
            ),
        ]),
    });
    let (listener, port) = ns.run(|| {
        let l = flows_web::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    });
    let token = flows_web::new_token().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (fake, stop, token) = (Arc::clone(&fake), Arc::clone(&stop), token.clone());
        std::thread::spawn(move || {
            let mut follower = Follower::new(FlowQuery {
                last: Some(flows_web::MAX_KEPT),
                ..FlowQuery::default()
            });
            let source: flows_web::Source = Box::new(move || follower.poll(&[&*fake]));
            flows_web::serve(listener, token, source, Duration::from_millis(200), stop)
        })
    };
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop = Stop(Arc::clone(&stop));

    let browser = Browser::start(&ns);
    // Without the token: nothing but the refusal.
    browser.goto(&format!("http://127.0.0.1:{port}/"));
    let body = browser.execute("return document.body.innerText");
    assert!(body.as_str().unwrap().contains("token is needed"), "{body}");

    browser.goto(&format!("http://127.0.0.1:{port}/?token={token}"));
    let rows = browser.wait_for("two flows", Duration::from_secs(20), |b| {
        let rows = b.find_all("#flows tbody tr");
        (rows.len() == 2).then_some(rows)
    });
    let newest = browser.text(&rows[0]);
    assert!(
        newest.contains("x/a") && newest.contains("z/web-7c9d8f6b5-x2k4q"),
        "{newest}"
    );
    assert!(
        newest.contains("KubernetesNetworkPolicy z/allow-x ingress[0]"),
        "{newest}"
    );
    // The Deployment's pod is drawn as its workload; both edges allowed (green).
    let edges = browser.find_all("#graph path.edge");
    assert_eq!(edges.len(), 2);
    for e in &edges {
        assert_eq!(browser.attr(e, "data-verdict").as_deref(), Some("allowed"));
    }
    assert_eq!(browser.find_all(r#"#graph [data-node="z/web"]"#).len(), 1);

    // A default deny arrives while the page is open: a red edge, named when clicked.
    fake.records.lock().unwrap().push(record(
        3,
        "y/b",
        "z/web-7c9d8f6b5-x2k4q",
        "denied",
        r#""reason":"default-deny","policies":[{"kind":"KubernetesNetworkPolicy","namespace":"z","name":"deny-all"}],
           "pending":{"verdict":"denied","reason":"default-deny","policies":[{"kind":"StagedKubernetesNetworkPolicy","namespace":"z","name":"try-deny"}]}"#,
    ));
    let denied = browser.wait_for("a denied edge", Duration::from_secs(20), |b| {
        b.find_all(r#"#graph circle.handle[data-verdict="denied"]"#)
            .pop()
    });
    assert_eq!(
        browser.attr(&denied, "data-edge").as_deref(),
        Some("y/b -> z/web")
    );
    browser.click(&denied);
    let details = browser.wait_for("the edge's details", Duration::from_secs(10), |b| {
        let t = b.text(&b.find_all("#details").pop()?);
        t.contains("deny-all").then_some(t)
    });
    assert!(
        details.contains("default deny: KubernetesNetworkPolicy z/deny-all"),
        "{details}"
    );
    assert!(
        details.contains("StagedKubernetesNetworkPolicy z/try-deny"),
        "{details}"
    );
    // TERN_WEB_SCREENSHOT=page.png keeps a picture of the page at this point, to look at.
    if let Some(path) = std::env::var_os("TERN_WEB_SCREENSHOT") {
        use base64::Engine;
        let png = base64::engine::general_purpose::STANDARD
            .decode(browser.screenshot_base64())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
    let dropped = browser.text(&browser.find_all("#dropped").pop().unwrap());
    assert!(dropped.contains("3 records not kept"), "{dropped}");

    // The filters of `ternctl flows`: verdict, then namespace.
    let verdict = browser.find_all("#f-verdict").pop().unwrap();
    browser.execute(
        "const s = document.getElementById('f-verdict'); s.value = 'denied'; \
         s.dispatchEvent(new Event('input'));",
    );
    let _ = verdict;
    let rows = browser.find_all("#flows tbody tr");
    assert_eq!(rows.len(), 1, "verdict=denied leaves the one denied flow");
    assert_eq!(
        browser.attr(&rows[0], "data-verdict").as_deref(),
        Some("denied")
    );
    browser.execute(
        "const s = document.getElementById('f-verdict'); s.value = ''; \
         s.dispatchEvent(new Event('input'));",
    );
    let ns_filter = browser.find_all("#f-namespace").pop().unwrap();
    browser.type_into(&ns_filter, "y");
    let rows = browser.wait_for("namespace y's flows", Duration::from_secs(5), |b| {
        let rows = b.find_all("#flows tbody tr");
        (rows.len() == 2).then_some(rows)
    });
    for r in &rows {
        assert!(browser.text(r).contains("y/b"));
    }

    drop(browser);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap().unwrap();
}
