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
//! Needs root (namespaces), chromium and chromedriver; nothing happens in the root network
//! namespace. The lab has a unique name and is torn down by a guard, also when an assertion
//! fails; the page's ternctl is killed by PID.
//!
//! `cargo test -p tern-ctl --test lab_flows -- --nocapture`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tern_api::flow::{FlowDirection, FlowReason, FlowRecord, FlowVerdict};
use tern_lab::netns::in_netns;
use tern_lab::netpol::{self, K8sPod, L4};
use tern_testkit::netns::Netns;
use tern_testkit::webdriver::Browser;

mod common;
use common::Lab;

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
    let mut out = Vec::new();
    for l in json.lines() {
        let r: FlowRecord =
            serde_json::from_str(l).map_err(|e| format!("a JSON line: {e}: {l}"))?;
        if r.src.ip == a.ip.to_string() && r.dst.ip == b.ip.to_string() {
            out.push(r);
        }
    }
    Ok(out)
}

/// `ternctl flows --web` as a child in `ns`, killed on drop.
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
    netpol::serve_in(&pods["b"].netns, &[80], &[L4::Tcp]).unwrap();
    let connect = || {
        let target = SocketAddr::new(pods["b"].ip, 80);
        in_netns(&pods["a"].netns, move || {
            netpol::probe(L4::Tcp, target, Duration::from_millis(500)).is_ok()
        })
        .unwrap()
    };
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
}
