//! Flow records on a one-node lab (real `ternd`, CNI plugin, NFLOG, nftables and packets):
//!
//! 1. A staged default-deny (`StagedKubernetesNetworkPolicy`) changes no verdict: x/a still
//!    connects to x/b, and that connection's ingress record says `allowed`, with
//!    `pending: denied` naming the staged policy.
//! 2. `ternctl policy promote` enforces it: x/a no longer reaches x/b, and the record says
//!    `denied` by the default deny of the promoted (enforced) policy.
//! 3. The page: `ternctl flows --lab NAME --web 127.0.0.1:8089`, run in a test namespace and
//!    opened there in a real headless chromium, draws the denied connection as a red edge
//!    x/a -> x/b; clicking it names the policy.
//!
//! 4. Following: `ternctl flows --lab NAME -f -o json` runs as a child before a new denied
//!    (x/a -> x/b:80) and a new allowed (x/a -> x/b:81, by the rule of allow-81) connection;
//!    it prints both records within a bound, and no record twice.
//! 5. Aggregates: `ternctl flows --aggregate -o json` counts them in their minute with their
//!    verdict and deciding policy, each count equal to the matching records of that minute.
//!
//! Needs root (namespaces), chromium and chromedriver; nothing happens in the root network
//! namespace. The lab has a unique name and is torn down by a guard, also when an assertion
//! fails; the page's and the follower's ternctl are killed by PID.
//!
//! `cargo test -p tern-ctl --test lab_flows -- --nocapture`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tern_api::flow::{FlowDirection, FlowReason, FlowRecord, FlowVerdict};
use tern_ctl::commands::flows_aggregate::Line;
use tern_lab::netns::in_netns;
use tern_lab::netpol::{self, K8sPod, L4};
use tern_testkit::netns::Netns;
use tern_testkit::webdriver::Browser;

mod common;
use common::Lab;

const ALLOW_81: &str = "\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-81, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
    ports: [{protocol: TCP, port: 81}]
";

const STAGED: &str = "\
apiVersion: tern.dev/v1
kind: StagedKubernetesNetworkPolicy
metadata: {name: try-deny, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
";

/// `ternctl ARGS` (the lab's store where a command needs one); stdout, or the failure.
fn ternctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new(common::ternctl())
        .args(args)
        .env_remove("TERN_STORE")
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "ternctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each line of `text` as JSON.
fn json_lines<T: serde::de::DeserializeOwned>(text: &str) -> Result<Vec<T>, String> {
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("a JSON line: {e}: {l}")))
        .collect()
}

/// The ingress records at x/b from x/a, newest last.
fn records_a_to_b(lab: &str, a: &K8sPod, b: &K8sPod) -> Result<Vec<FlowRecord>, String> {
    let json = ternctl(&[
        "flows",
        "--lab",
        lab,
        "--pod",
        "x/b",
        "--direction",
        "ingress",
        "--port",
        "80",
        "-o",
        "json",
    ])?;
    Ok(json_lines::<FlowRecord>(&json)?
        .into_iter()
        .filter(|r| r.src.ip == a.ip.to_string() && r.dst.ip == b.ip.to_string())
        .collect())
}

/// A ternctl child (`--web`, `--follow`), killed (by its PID) and reaped on drop.
struct Page(Child);

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn staged_pending_promote_and_the_page() {
    let bin = common::lab_ready();
    let name = common::lab_name("flow");
    let mut o = tern_lab::UpOptions::new(&name, bin);
    o.nodes = 1;
    let t0 = Instant::now();
    let mut lab = Lab::up(&o);
    let x = BTreeMap::from([("ns".to_string(), "x".to_string())]);
    netpol::put_namespace(&lab.st, "x", &x).unwrap();
    let mut pods: BTreeMap<&str, K8sPod> = BTreeMap::new();
    for p in ["a", "b"] {
        let labels = BTreeMap::from([("pod".to_string(), p.to_string())]);
        let pod = netpol::add_k8s_pod(&mut lab.st, "node1", "x", p, &labels)
            .unwrap_or_else(|e| panic!("add x/{p}: {e}{}", lab.logs(15)));
        pods.insert(p, pod);
    }
    netpol::serve_in(&pods["b"].netns, &[80, 81], &[L4::Tcp]).unwrap();
    let connect_to = |port| {
        let target = SocketAddr::new(pods["b"].ip, port);
        in_netns(&pods["a"].netns, move || {
            netpol::probe(L4::Tcp, target, Duration::from_millis(500)).is_ok()
        })
        .unwrap()
    };
    let connect = || connect_to(80);
    println!("lab up with x/a, x/b in {:.1}s", t0.elapsed().as_secs_f64());

    // 1. Staged: every connection still goes through; its record says what the staged
    // policy would have done.
    netpol::apply_yaml(&lab.st, STAGED).unwrap();
    let (a, b) = (&pods["a"], &pods["b"]);
    let mut last = String::new();
    let pending =
        tern_testkit::wait::poll(Duration::from_secs(30), Duration::from_millis(300), || {
            assert!(
                connect(),
                "a staged policy denied x/a -> x/b{}",
                lab.logs(20)
            );
            match records_a_to_b(&name, a, b) {
                Ok(rs) => {
                    last = format!("{rs:?}");
                    rs.iter().any(|r| {
                        r.pending.as_ref().is_some_and(|p| {
                            p.verdict == FlowVerdict::Denied
                                && p.reason == FlowReason::DefaultDeny
                                && p.policies.iter().any(|p| {
                                    p.name == "try-deny"
                                        && p.kind == "StagedKubernetesNetworkPolicy"
                                })
                        })
                    })
                }
                Err(e) => {
                    last = e;
                    false
                }
            }
        });
    assert!(
        pending,
        "no record with pending: denied by try-deny; last: {last}{}",
        lab.logs(30)
    );
    let rs = records_a_to_b(&name, a, b).unwrap();
    let r = rs.iter().rfind(|r| r.pending.is_some()).unwrap();
    assert_eq!(r.verdict, FlowVerdict::Allowed, "{r:?}");
    assert_eq!(r.reason, FlowReason::NoPolicy, "{r:?}");
    assert_eq!(r.direction, FlowDirection::Ingress);
    assert_eq!(r.src.pod.as_deref(), Some("a"));
    assert_eq!(r.dst.pod.as_deref(), Some("b"));
    println!(
        "staged: allowed, pending denied by try-deny: {}",
        serde_json::to_string(r).unwrap()
    );

    // 2. Promote: enforced.
    let store = lab.st.store_url();
    let out = ternctl(&[
        "--store", &store, "policy", "promote", "try-deny", "-n", "x", "--kind", "sknp",
    ])
    .unwrap();
    println!("promote: {}", out.trim());
    common::wait_until(
        "the promoted policy in force",
        30,
        || lab.logs(20),
        || (connect()).then(|| "x/a still reaches x/b".to_string()),
    );
    let mut last = String::new();
    let denied =
        tern_testkit::wait::poll(Duration::from_secs(20), Duration::from_millis(300), || {
            let _ = connect();
            match records_a_to_b(&name, a, b) {
                Ok(rs) => {
                    last = format!("{rs:?}");
                    rs.iter().any(|r| {
                        r.verdict == FlowVerdict::Denied
                            && r.reason == FlowReason::DefaultDeny
                            && r.policies.iter().any(|p| {
                                p.name == "try-deny"
                                    && p.kind == "KubernetesNetworkPolicy"
                                    && p.namespace.as_deref() == Some("x")
                            })
                    })
                }
                Err(e) => {
                    last = e;
                    false
                }
            }
        });
    assert!(
        denied,
        "no denied record naming the promoted try-deny; last: {last}{}",
        lab.logs(30)
    );
    println!("promoted: x/a -> x/b denied by default, try-deny named");

    // 3. The page, in a namespace of its own with the browser.
    let ns = Netns::new("fw");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(common::ternctl())
        .args(["flows", "--lab", &name, "--web", "127.0.0.1:8089"])
        .env_remove("TERN_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("ternctl flows --web starts");
    let stdout = child.stdout.take().unwrap();
    let _page = Page(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:8089/?token="))
        .unwrap_or_else(|| panic!("no address in ternctl's first line: {line:?}"))
        .to_string();
    let browser = Browser::start(&ns);
    browser.goto(&url);
    let edge = browser.wait_for("the denied edge x/a -> x/b", Duration::from_secs(30), |b| {
        b.find_all(r#"#graph circle.handle[data-edge="x/a -> x/b"][data-verdict="denied"]"#)
            .pop()
    });
    browser.click(&edge);
    let details = browser.wait_for("the edge's policy", Duration::from_secs(10), |b| {
        let t = b.text(&b.find_all("#details").pop()?);
        t.contains("try-deny").then_some(t)
    });
    assert!(
        details.contains("default deny: KubernetesNetworkPolicy x/try-deny"),
        "{details}"
    );
    println!("the page names the policy of the denied edge:\n{details}");

    drop(browser);
    drop(_page);

    // 4. Following: a second rule lets x/a reach x/b on 81; the follower starts before the
    // new connections and prints their records.
    netpol::apply_yaml(&lab.st, ALLOW_81).unwrap();
    common::wait_until(
        "allow-81 in force",
        30,
        || lab.logs(20),
        || (!connect_to(81)).then(|| "x/a does not reach x/b:81".to_string()),
    );
    let mut child = Command::new(common::ternctl())
        .args(["flows", "--lab", &name, "-f", "-o", "json"])
        .env_remove("TERN_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ternctl flows -f starts");
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let _follower = Page(child);
    let (tx, lines) = std::sync::mpsc::channel::<Result<String, String>>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(Ok(l)).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx2.send(Err(l)).is_err() {
                break;
            }
        }
    });
    let mut printed: Vec<FlowRecord> = Vec::new();
    let take = |l: Result<String, String>, printed: &mut Vec<FlowRecord>| match l {
        Ok(l) => printed
            .push(serde_json::from_str(&l).unwrap_or_else(|e| panic!("a JSON line: {e}: {l}"))),
        Err(l) => println!("follower: {l}"),
    };
    // Its first listing done (the notice on stderr), it follows.
    let ready = Instant::now() + Duration::from_secs(20);
    loop {
        let left = ready.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(Err(l)) if l.starts_with("following") => break,
            Ok(l) => take(l, &mut printed),
            Err(e) => panic!("ternctl flows -f did not start following: {e}"),
        }
    }
    let mark = tern_ctl::commands::flows::now_ms();
    assert!(!connect(), "x/a reached x/b:80 past the default deny");
    assert!(connect_to(81), "allow-81 does not let x/a reach x/b:81");
    let new_ab = |r: &FlowRecord, port, verdict| {
        r.time >= mark
            && r.direction == FlowDirection::Ingress
            && r.src.ip == a.ip.to_string()
            && r.dst.ip == b.ip.to_string()
            && r.dst.port == Some(port)
            && r.verdict == verdict
    };
    let by = Instant::now() + Duration::from_secs(15);
    while !(printed.iter().any(|r| new_ab(r, 80, FlowVerdict::Denied))
        && printed.iter().any(|r| new_ab(r, 81, FlowVerdict::Allowed)))
    {
        let left = by.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) => take(l, &mut printed),
            Err(_) => panic!(
                "the follower did not print the new denied and allowed records within 15 s; \
                 since the connections it printed: {:?}{}",
                printed
                    .iter()
                    .filter(|r| r.time >= mark)
                    .collect::<Vec<_>>(),
                lab.logs(30)
            ),
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in &printed {
        assert!(seen.insert((r.node.clone(), r.seq)), "printed twice: {r:?}");
    }
    let allowed = printed
        .iter()
        .find(|r| new_ab(r, 81, FlowVerdict::Allowed))
        .unwrap();
    assert_eq!(allowed.reason, FlowReason::Rule, "{allowed:?}");
    assert_eq!(allowed.policies[0].name, "allow-81", "{allowed:?}");
    println!(
        "follower: {} records before the connections, their records within {:.1}s",
        printed.iter().filter(|r| r.time < mark).count(),
        (tern_ctl::commands::flows::now_ms() - mark) as f64 / 1000.0
    );
    drop(_follower);

    // 5. Aggregates: per minute, each key's count is the number of its records.
    let deny_id = "KubernetesNetworkPolicy/x/try-deny";
    let allow_id = "KubernetesNetworkPolicy/x/allow-81";
    let keyed = |r: &FlowRecord| -> Option<(u64, u16, FlowVerdict, String)> {
        let policy = tern_agent::flows::aggregate::policy_id(r)?;
        let port = r.dst.port?;
        (r.direction == FlowDirection::Ingress
            && r.src.namespace.as_deref() == Some("x")
            && r.dst.namespace.as_deref() == Some("x")
            && r.proto == "tcp")
            .then(|| (r.time / 60_000 * 60_000, port, r.verdict, policy))
    };
    type Counted = BTreeMap<(u64, u16, FlowVerdict, String), u64>;
    let aggregates = || -> Result<Counted, String> {
        let json = ternctl(&[
            "flows",
            "--lab",
            &name,
            "--aggregate",
            "-n",
            "x",
            "--direction",
            "ingress",
            "-o",
            "json",
        ])?;
        let mut m = Counted::new();
        for l in json_lines::<Line>(&json)? {
            let minute =
                tern_api::flow::parse_time(&l.minute).ok_or_else(|| format!("a minute: {l:?}"))?;
            let r = l.row;
            if r.src != "x" || r.dst != "x" || r.proto != "tcp" {
                continue;
            }
            let (Some(port), Some(policy)) = (r.port, r.policy) else {
                continue;
            };
            *m.entry((minute, port, r.verdict, policy)).or_insert(0) += r.count;
        }
        Ok(m)
    };
    let records = || -> Result<Counted, String> {
        let json = ternctl(&["flows", "--lab", &name, "-o", "json"])?;
        let mut m = Counted::new();
        for r in json_lines::<FlowRecord>(&json)? {
            if let Some(k) = keyed(&r) {
                *m.entry(k).or_insert(0) += 1;
            }
        }
        Ok(m)
    };
    let mut last = String::new();
    let equal = tern_testkit::wait::poll(
        Duration::from_secs(10),
        Duration::from_millis(500),
        || match (aggregates(), records()) {
            (Ok(a), Ok(r)) => {
                last = format!("aggregates {a:?}\nrecords {r:?}");
                a == r
            }
            (Err(e), _) | (_, Err(e)) => {
                last = e;
                false
            }
        },
    );
    assert!(equal, "aggregates and records disagree: {last}");
    let counted = aggregates().unwrap();
    let minute = mark / 60_000 * 60_000;
    let at = |port, verdict, policies: &[&str]| {
        counted
            .iter()
            .filter(|((m, p, v, pol), _)| {
                *m >= minute && *p == port && *v == verdict && policies.contains(&pol.as_str())
            })
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    // A default deny names first either policy that selects x/b.
    assert!(
        at(80, FlowVerdict::Denied, &[deny_id, allow_id]) >= 1,
        "{counted:?}"
    );
    assert!(
        at(81, FlowVerdict::Allowed, &[allow_id]) >= 1,
        "{counted:?}"
    );
    let table = ternctl(&["flows", "--lab", &name, "--aggregate", "--sum", "-n", "x"]).unwrap();
    assert!(table.starts_with("MINUTE"), "{table}");
    assert!(table.contains(allow_id), "{table}");
    println!("aggregates equal the records, minute by minute:\n{table}");
}
