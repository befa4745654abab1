//! What one NetworkPolicy activation and deactivation costs a node: 25 local pods among
//! 10,000 endpoints (200 namespaces), a policy in each namespace with local pods already
//! enforced; then, repeatedly, one more NetworkPolicy is created (it selects the 5 local pods
//! of its namespace: its chain, a selector set of 1,000 peers, a named-port set and the pods'
//! chains reach the kernel) and deleted again, each applied the way ternd applies it
//! (`tern_agent::policy::apply_pending`).
//!
//! Figures per step: CPU of the applying thread plus the child processes it waited for
//! (`nft`), and wall time; for the kernel step alone (`apply_pending`) and for the whole
//! change (model update + kernel). Runs on a dedicated thread inside a network namespace of
//! its own (`unshare(CLONE_NEWNET)`): the machine's namespaces are never touched. Root only.
//!
//! `cargo run -p tern-agent --release --example policy_activation_cost -- [rounds]`

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tern_agent::policy::{Applied, apply_pending};
use tern_model::{EndpointPort, Kind, Protocol};
use tern_policy::{Endpoint, Incremental, PolicySet};

const ENDPOINTS: u32 = 10_000;
const NAMESPACES: u32 = 200;
const LOCAL: u32 = 25;

/// Endpoint `i`: namespace `ns<i % 200>`; the first 25 live on this node (`n1`), 5 in each
/// of namespaces ns0..ns4; every tenth is a `role: client`; all have a named port `http`.
fn endpoint(i: u32) -> Endpoint {
    let local = i < LOCAL;
    let ns = if local { i / 5 } else { i % NAMESPACES };
    let mut labels = BTreeMap::from([("app".to_string(), format!("app{}", i % 50))]);
    if i % 10 == 3 {
        labels.insert("role".into(), "client".into());
    }
    Endpoint {
        namespace: format!("ns{ns}"),
        name: format!("pod{i}"),
        node: if local { "n1" } else { "n2" }.into(),
        interface: if local {
            format!("tern{i:011x}")
        } else {
            String::new()
        },
        labels: labels.into(),
        ips: vec![IpAddr::from([
            10,
            64 + (i / 65536) as u8,
            (i / 256 % 256) as u8,
            (i % 256) as u8,
        ])],
        ports: vec![EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
    }
}

fn resource(yaml: &str) -> tern_model::Resource {
    tern_model::parse_documents(yaml, "bench.yaml")
        .expect("a valid policy")
        .remove(0)
}

/// The policies in force before: per namespace, ingress from the same namespace's `app`
/// peers on TCP 8080 (active in the 5 namespaces with local pods).
fn baseline(ns: u32) -> tern_model::Resource {
    resource(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: base, namespace: ns{ns}}}\nspec:\n  podSelector: {{}}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - podSelector: {{matchLabels: {{app: app{}}}}}\n    ports:\n    - {{port: 8080, protocol: TCP}}\n",
        ns % 50
    ))
}

/// The policy that comes and goes: selects the 5 local pods of ns0; allows clients of every
/// namespace (1,000 endpoints) on the named port `http` and TCP 9090, and a CIDR minus an
/// exception.
fn measured() -> tern_model::Resource {
    resource(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: clients, namespace: ns0}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress:\n  - from:\n    - namespaceSelector: {}\n      podSelector: {matchLabels: {role: client}}\n    ports:\n    - {port: http, protocol: TCP}\n    - {port: 9090, protocol: TCP}\n  - from:\n    - ipBlock: {cidr: 192.168.0.0/16, except: [192.168.7.0/24]}\n",
    )
}

/// CPU time (user + system) of the calling thread plus that of every waited-for child.
fn cpu() -> Duration {
    let usage = |who| {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage.
        let rc = unsafe { libc::getrusage(who, &mut r) };
        assert_eq!(rc, 0, "getrusage");
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        tv(r.ru_utime) + tv(r.ru_stime)
    };
    usage(libc::RUSAGE_THREAD) + usage(libc::RUSAGE_CHILDREN)
}

#[derive(Default)]
struct Figures {
    kernel_cpu: Vec<Duration>,
    kernel_wall: Vec<Duration>,
    total_cpu: Vec<Duration>,
    total_wall: Vec<Duration>,
    how: Vec<Applied>,
}

fn step(f: &mut Figures, inc: &mut Incremental, change: impl FnOnce(&mut Incremental)) {
    let (c0, t0) = (cpu(), Instant::now());
    change(inc);
    let (c1, t1) = (cpu(), Instant::now());
    let how = apply_pending(inc).expect("applying the change");
    let (c2, t2) = (cpu(), Instant::now());
    f.kernel_cpu.push(c2 - c1);
    f.kernel_wall.push(t2 - t1);
    f.total_cpu.push(c2 - c0);
    f.total_wall.push(t2 - t0);
    f.how.push(how);
}

fn ms(v: &[Duration], p: f64) -> String {
    let mut v = v.to_vec();
    v.sort();
    let d = v[((v.len() - 1) as f64 * p).round() as usize];
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

fn report(what: &str, f: &Figures) {
    let mut how: Vec<String> = f.how.iter().map(|h| format!("{h:?}")).collect();
    how.sort();
    how.dedup();
    println!(
        "| {what} | {} | {} / {} | {} / {} | {} / {} | {} / {} |",
        how.join(" + "),
        ms(&f.kernel_cpu, 0.5),
        ms(&f.kernel_cpu, 0.9),
        ms(&f.kernel_wall, 0.5),
        ms(&f.kernel_wall, 0.9),
        ms(&f.total_cpu, 0.5),
        ms(&f.total_cpu, 0.9),
        ms(&f.total_wall, 0.5),
        ms(&f.total_wall, 0.9),
    );
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("rounds"))
        .unwrap_or(20);
    let t = std::thread::spawn(move || {
        // SAFETY: unshare only affects this dedicated thread (and processes it spawns).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            panic!(
                "unshare(CLONE_NEWNET): {}; run as root",
                std::io::Error::last_os_error()
            );
        }
        let mut set = PolicySet::new();
        for i in 0..ENDPOINTS {
            set.upsert_endpoint(endpoint(i));
        }
        for ns in 0..NAMESPACES {
            set.apply(&baseline(ns)).expect("baseline policy");
        }
        let mut inc = Incremental::new("n1", set);
        let t = Instant::now();
        let how = apply_pending(&mut inc).expect("the first full apply");
        let d = inc.desired();
        println!(
            "table: {} chains, {} sets, {} set elements; first apply ({how:?}) {:.1} ms",
            d.chains.len(),
            d.sets.len(),
            d.sets.values().map(|s| s.elements.len()).sum::<usize>(),
            t.elapsed().as_secs_f64() * 1e3
        );
        let (mut on, mut off) = (Figures::default(), Figures::default());
        for _ in 0..rounds {
            step(&mut on, &mut inc, |i| i.apply(&measured()).expect("policy"));
            step(&mut off, &mut inc, |i| {
                i.remove(Kind::K8sNetworkPolicy, Some("ns0"), "clients")
            });
        }
        println!(
            "\n{rounds} rounds; ms as p50 / p90; CPU = applying thread + waited-for children\n"
        );
        println!("| change | applied by | kernel CPU | kernel wall | total CPU | total wall |");
        println!("|---|---|---|---|---|---|");
        report("activation", &on);
        report("deactivation", &off);
    });
    t.join().expect("the benchmark thread");
}
