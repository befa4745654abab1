//! BGP convergence benchmark: N tern speakers in one private network namespace, on loopback
//! addresses 127.0.1.x, as a full iBGP mesh and as clients of one route reflector.
//!
//! Measures the time from `originate()` on one speaker to the `RouteEvent::Install` on every
//! other speaker (p50/p99 over all receivers and trials), the time to bring all sessions up,
//! and resident memory per session (RSS delta / sessions; a session counts both its ends).
//!
//! Needs root (it unshares a network namespace for itself; the root namespace is untouched):
//! `cargo run -p tern-bgp --release --example mesh_bench -- [N] [TRIALS] [mesh|rr|both]`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tern_bgp::driver::{PeerConfig, RouteEvent, Speaker, SpeakerConfig, SpeakerHandle};
use tern_bgp::fsm::State;
use tokio::sync::mpsc;

const AS: u32 = 64512;

fn addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, (i + 1) as u8)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct Result {
    topology: &'static str,
    sessions: usize,
    up: Duration,
    p50: Duration,
    p99: Duration,
    max: Duration,
    rss_per_session_kib: f64,
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// `edges` are (i, j) sessions; the lower address is passive (the higher one connects).
async fn run(topology: &'static str, n: usize, trials: usize, reflector: bool) -> Result {
    let edges: Vec<(usize, usize)> = if reflector {
        (1..n).map(|j| (0, j)).collect()
    } else {
        (0..n)
            .flat_map(|i| ((i + 1)..n).map(move |j| (i, j)))
            .collect()
    };
    let rss0 = rss_kib();
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, IpNet, Instant)>();
    let mut speakers: Vec<SpeakerHandle> = Vec::new();
    for i in 0..n {
        let mut c = SpeakerConfig::new(AS, Ipv4Addr::new(198, 18, 1, (i + 1) as u8));
        c.listen = Some(SocketAddr::new(IpAddr::V4(addr(i)), 179));
        c.connect_retry = Duration::from_millis(200);
        c.connect_retry_max = Duration::from_secs(1);
        if reflector && i == 0 {
            c.cluster_id = Some(Ipv4Addr::new(198, 18, 1, 1));
        }
        let mut h = Speaker::start(c).await.expect("start speaker");
        let mut ev = h.take_events().unwrap();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(e) = ev.recv().await {
                if let RouteEvent::Install { prefix, .. } = e {
                    let _ = tx.send((i, prefix, Instant::now()));
                }
            }
        });
        speakers.push(h);
    }
    let t_up = Instant::now();
    for &(i, j) in &edges {
        let mut pi = PeerConfig::new(IpAddr::V4(addr(j)), AS);
        let mut pj = PeerConfig::new(IpAddr::V4(addr(i)), AS);
        pi.passive = true; // i < j: j connects
        pi.rr_client = reflector;
        pj.passive = false;
        speakers[i].add_peer(pi).await.unwrap();
        speakers[j].add_peer(pj).await.unwrap();
    }
    loop {
        let mut up = 0;
        for s in &speakers {
            up += s
                .status()
                .await
                .unwrap()
                .iter()
                .filter(|p| p.state == State::Established)
                .count();
        }
        if up == 2 * edges.len() {
            break;
        }
        assert!(
            t_up.elapsed() < Duration::from_secs(120),
            "sessions did not come up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let up = t_up.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib().saturating_sub(rss0);
    while rx.try_recv().is_ok() {}

    let mut lat = Vec::new();
    let mut worst = Duration::ZERO;
    for t in 0..trials {
        // In the reflector topology originate from a client, as a node would.
        let origin = if reflector { 1 + t % (n - 1) } else { t % n };
        let prefix: IpNet = format!("10.200.{}.0/24", t).parse().unwrap();
        let t0 = Instant::now();
        speakers[origin].originate(prefix, None).await.unwrap();
        let mut seen = vec![false; n];
        seen[origin] = true;
        let mut left = n - 1;
        while left > 0 {
            let (i, p, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("route did not converge")
                .unwrap();
            if p == prefix && !seen[i] {
                seen[i] = true;
                left -= 1;
                let d = at - t0;
                lat.push(d);
                worst = worst.max(d);
            }
        }
    }
    lat.sort();
    for s in speakers {
        s.shutdown().await;
    }
    Result {
        topology,
        sessions: edges.len(),
        up,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        max: worst,
        rss_per_session_kib: rss as f64 / edges.len() as f64,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let trials: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    // RSS is only meaningful for the first topology of a process (freed memory stays mapped),
    // so each topology can run in its own process.
    let which = args.next().unwrap_or_else(|| "both".to_string());
    assert!((2..=250).contains(&n), "N must be 2..=250");
    // SAFETY: plain syscall; moves this (still single-threaded) process into a new namespace.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNET) needs root: {}",
        std::io::Error::last_os_error()
    );
    let ok = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "ip link set lo up failed");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let results = rt.block_on(async {
        let mut v = Vec::new();
        if which != "rr" {
            v.push(run("full mesh", n, trials, false).await);
        }
        if which != "mesh" {
            v.push(run("route reflector", n, trials, true).await);
        }
        v
    });
    println!(
        "{:<16} {:>8} {:>9} {:>12} {:>10} {:>10} {:>10} {:>14}",
        "topology",
        "speakers",
        "sessions",
        "all up",
        "conv p50",
        "conv p99",
        "conv max",
        "RSS/session"
    );
    for r in results {
        println!(
            "{:<16} {:>8} {:>9} {:>12.1?} {:>10.2?} {:>10.2?} {:>10.2?} {:>10.1} KiB",
            r.topology, n, r.sessions, r.up, r.p50, r.p99, r.max, r.rss_per_session_kib
        );
    }
}
