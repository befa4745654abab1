//! Property fuzzing of the agent's socket against a real in-process server (its own network
//! namespace; the root namespace is never touched): random and mutated request bodies, length
//! prefixes that lie (short, long, over the limit), and random numbers and kinds of descriptors
//! (a pod namespace, a regular file, a pipe, a UTS namespace, the agent's own namespace). After
//! every case the server still answers STATUS; after the campaign the process holds no more
//! descriptors than before and an ADD still succeeds.
//!
//! `TERN_FUZZ_CASES=N` runs N cases instead of the CI default.

mod common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tern_agent::Agent;
use tern_api::{Reply, Request, Response};

#[derive(Debug, Clone, Copy)]
enum FdKind {
    PodNetns,
    Regular,
    Pipe,
    Uts,
    OwnNetns,
}

#[derive(Debug, Clone)]
enum Prefix {
    /// The body's real length.
    Exact,
    /// Any value (mostly a lie).
    Any(u32),
    /// Over the 1 MiB limit.
    Huge(u32),
    /// Fewer than 4 bytes of prefix.
    Short(u8),
}

#[derive(Debug, Clone)]
struct Case {
    prefix: Prefix,
    body: Vec<u8>,
    fds: Vec<FdKind>,
}

const VALID: &[&str] = &[
    r#"{"op":"status"}"#,
    r#"{"op":"bgp_status"}"#,
    r#"{"op":"add","attachment":{"network":"k8s-pod-network","container_id":"fz1","ifname":"eth0","netns_path":"/x","pod":{"namespace":"default","name":"fz"}},"mtu":0,"ipam":{"assign_ipv4":true,"assign_ipv6":false},"labels":{"app":"x"},"ports":[{"name":"http","port":80}]}"#,
    r#"{"op":"del","attachment":{"network":"k8s-pod-network","container_id":"fz1","ifname":"eth0"}}"#,
    r#"{"op":"check","attachment":{"network":"k8s-pod-network","container_id":"fz1","ifname":"eth0"},"prev_result":{"interfaces":[],"ips":[{"address":"10.79.0.1/32"}],"routes":[]}}"#,
    r#"{"op":"gc","network":"k8s-pod-network","valid":[["fz1","eth0"]]}"#,
    r#"{"op":"ipam_add","attachment":{"network":"k8s-pod-network","container_id":"fz2","ifname":"eth0"},"ipam":{"assign_ipv4":true,"assign_ipv6":true,"requested":["10.79.0.9"]}}"#,
    r#"{"op":"ipam_del","network":"k8s-pod-network","container_id":"fz2","ifname":"eth0"}"#,
    r#"{"op":"ipam_check","network":"k8s-pod-network","container_id":"fz2","ifname":"eth0"}"#,
    r#"{"op":"flows","after_seq":3,"since_ms":1000,"last":10}"#,
];

fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        proptest::sample::select(VALID),
        proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..6),
    )
        .prop_map(|(v, edits)| {
            let mut b = v.as_bytes().to_vec();
            tern_testkit::apply_byte_edits(&mut b, &edits);
            b
        });
    prop_oneof![
        2 => proptest::collection::vec(any::<u8>(), 0..300),
        4 => mutated,
        2 => proptest::sample::select(VALID).prop_map(|v| v.as_bytes().to_vec()),
    ]
}

fn arb_case() -> impl Strategy<Value = Case> {
    let prefix = prop_oneof![
        5 => Just(Prefix::Exact),
        1 => any::<u32>().prop_map(Prefix::Any),
        1 => ((1u32 << 20) + 1..=u32::MAX).prop_map(Prefix::Huge),
        1 => (0u8..4).prop_map(Prefix::Short),
    ];
    let kind = prop_oneof![
        Just(FdKind::PodNetns),
        Just(FdKind::Regular),
        Just(FdKind::Pipe),
        Just(FdKind::Uts),
        Just(FdKind::OwnNetns),
    ];
    let fds = prop_oneof![
        3 => Just(vec![]),
        3 => proptest::collection::vec(kind.clone(), 1..2),
        2 => proptest::collection::vec(kind, 2..14),
    ];
    (prefix, arb_body(), fds).prop_map(|(prefix, body, fds)| Case { prefix, body, fds })
}

fn send_raw(s: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    if fds.is_empty() || bytes.is_empty() {
        return (&*s).write_all(bytes);
    }
    let sent = common::sendmsg_fds(s, bytes, fds)?;
    (&*s).write_all(&bytes[sent..])
}

/// Outcomes of the campaign by kind (printed at the end: what the cases reached).
static OUTCOMES: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn count(what: String) {
    *OUTCOMES.lock().unwrap().entry(what).or_default() += 1;
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Descriptors to send, kept open by the test for one case.
struct Fds {
    pod: File,
    own: File,
}

fn run_case(sock: &Path, fds: &Fds, case: &Case) -> Result<(), TestCaseError> {
    let regular = File::open("/proc/self/status").unwrap();
    let uts = File::open("/proc/self/ns/uts").unwrap();
    let (pr, pw) = std::io::pipe().unwrap();
    let raw: Vec<RawFd> = case
        .fds
        .iter()
        .map(|k| match k {
            FdKind::PodNetns => fds.pod.as_raw_fd(),
            FdKind::OwnNetns => fds.own.as_raw_fd(),
            FdKind::Regular => regular.as_raw_fd(),
            FdKind::Uts => uts.as_raw_fd(),
            FdKind::Pipe => pr.as_raw_fd(),
        })
        .collect();
    let mut bytes = match case.prefix {
        Prefix::Exact => (case.body.len() as u32).to_be_bytes().to_vec(),
        Prefix::Any(n) | Prefix::Huge(n) => n.to_be_bytes().to_vec(),
        Prefix::Short(n) => vec![0; n as usize],
    };
    if !matches!(case.prefix, Prefix::Short(_)) {
        bytes.extend_from_slice(&case.body);
    }
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = send_raw(&s, &bytes, &raw);
    // Never leave the server waiting for the rest: it would answer at its 10 s deadline.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = (&s).read_to_end(&mut out);
    drop((pr, pw));
    if out.len() >= 4 {
        let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        prop_assert_eq!(len, out.len() - 4, "reply framing");
        let r: Result<Response, _> = serde_json::from_slice(&out[4..]);
        prop_assert!(
            r.is_ok(),
            "reply is not a Response: {:?}",
            String::from_utf8_lossy(&out)
        );
        match &r {
            Ok(Err(e)) => {
                prop_assert!(!e.msg.is_empty());
                count(format!("error code {}", e.code));
            }
            Ok(Ok(reply)) => count(format!(
                "ok {}",
                serde_json::to_value(reply).unwrap()["kind"]
            )),
            Err(_) => {}
        }
    } else {
        count("closed without a reply".into());
        prop_assert!(out.is_empty(), "partial reply {:?}", out);
    }
    // The server keeps answering.
    let t0 = Instant::now();
    let st = tern_api::call(sock, &Request::Status, None, Duration::from_secs(10));
    prop_assert!(
        matches!(st, Ok(Ok(Reply::Status(_)))),
        "STATUS after the case: {:?}",
        st
    );
    prop_assert!(t0.elapsed() < Duration::from_secs(5));
    Ok(())
}

#[test]
fn socket_frames_never_crash_leak_or_stall_the_server() {
    tern_testkit::need_root();
    let cases: u32 = std::env::var("TERN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let pod = tern_linux::netns::new_anonymous().unwrap();
    let pod_file = File::from(pod.as_fd().try_clone_to_owned().unwrap());
    // A namespace of its own for the final ADD (the campaign may leave fz1 wired in `pod`).
    let last = tern_linux::netns::new_anonymous().unwrap();
    let last_file = File::from(last.as_fd().try_clone_to_owned().unwrap());
    tern_linux::netns::run_in_new(move || {
        common::lo_up();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn tern_store::Store> = Arc::new(tern_store::mem::MemStore::new());
        let mut cfg = common::agent_config(dir.path(), "mem://", "10.79.0.0/24");
        let sock = cfg.socket.clone();
        cfg.dataplane = false;
        cfg.metrics_addr = "0".into();
        cfg.health_addr = "0".into();
        let agent = Agent::start_with_store(cfg, store).unwrap();
        let server = {
            let a = agent.clone();
            std::thread::spawn(move || a.serve())
        };
        let end = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < end, "the agent did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        let fds = Fds {
            pod: pod_file,
            own: File::open("/proc/thread-self/ns/net").unwrap(),
        };
        // Warm up (threads, lazily opened files), then count.
        for _ in 0..3 {
            let _ = tern_api::call(&sock, &Request::Status, None, Duration::from_secs(5));
        }
        let before = fd_count();
        let t0 = Instant::now();
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 200,
            ..Config::default()
        });
        runner
            .run(&arb_case(), |case| run_case(&sock, &fds, &case))
            .unwrap();
        // Request threads finish after their reply: give the last ones a moment.
        let mut after = fd_count();
        let settle = Instant::now() + Duration::from_secs(5);
        while after > before + 2 && Instant::now() < settle {
            std::thread::sleep(Duration::from_millis(50));
            after = fd_count();
        }
        eprintln!(
            "{cases} socket cases in {:?}; descriptors {before} -> {after}",
            t0.elapsed()
        );
        eprintln!("outcomes: {:?}", OUTCOMES.lock().unwrap());
        assert!(
            after <= before + 2,
            "descriptors grew from {before} to {after}"
        );
        // And an ADD into a real pod namespace still succeeds.
        let add =
            serde_json::from_str::<Request>(&VALID[2].replace("\"fz1\"", "\"fz-final\"")).unwrap();
        let r = tern_api::call(
            &sock,
            &add,
            Some(last_file.as_raw_fd()),
            Duration::from_secs(20),
        )
        .unwrap();
        assert!(matches!(r, Ok(Reply::Result(_))), "{r:?}");
        agent.shutdown();
        server.join().unwrap().unwrap();
    })
    .unwrap();
}
