//! The health and metrics listener under misbehaving local clients: `/liveness` answers within a
//! second while 50 slow-loris and oversized clients are connected, slow clients are dropped at
//! the 2 s request deadline (408), oversized heads at 8 KiB (431), and the agent's memory does
//! not grow with what they send. The agent runs in a fresh network namespace (its listener on
//! that namespace's loopback); the root namespace is never touched.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tern_agent::Agent;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn liveness_answers_while_slow_and_oversized_clients_are_connected() {
    tern_testkit::need_root();
    tern_linux::netns::run_in_new(|| {
        common::lo_up();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn tern_store::Store> = Arc::new(tern_store::mem::MemStore::new());
        let mut cfg = common::agent_config(dir.path(), "mem://", "10.78.0.0/24");
        cfg.dataplane = false;
        cfg.metrics_addr = "127.0.0.1:0".into();
        cfg.health_addr = "127.0.0.1:0".into();
        let agent = Agent::start_with_store(cfg, store).unwrap();
        agent.start_maintenance().unwrap();
        let addr = tern_agent::http::start_http(&agent)[0];
        assert_eq!(
            tern_testkit::ternd::http_get(addr, "/liveness", Duration::from_secs(2))
                .unwrap()
                .0,
            200
        );
        let rss_before = rss_kib();

        let start = Instant::now();
        // 25 slow-loris clients: a header line every 300 ms, never the blank line.
        let slow: Vec<_> = (0..25)
            .map(|_| {
                std::thread::spawn(move || -> (Duration, String) {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.write_all(b"GET /liveness HTTP/1.1\r\n").unwrap();
                    s.set_read_timeout(Some(Duration::from_millis(300)))
                        .unwrap();
                    let t0 = Instant::now();
                    let mut out = Vec::new();
                    while t0.elapsed() < Duration::from_secs(10) {
                        let mut b = [0u8; 512];
                        match s.read(&mut b) {
                            Ok(0) => break,
                            Ok(n) => out.extend_from_slice(&b[..n]),
                            Err(_) => {}
                        }
                        if s.write_all(b"X-Slow: 1\r\n").is_err() {
                            break;
                        }
                    }
                    (t0.elapsed(), String::from_utf8_lossy(&out).into_owned())
                })
            })
            .collect();
        // 25 oversized clients: an endless header (up to 64 MiB each).
        let big: Vec<_> = (0..25)
            .map(|_| {
                std::thread::spawn(move || -> usize {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                    let chunk = vec![b'a'; 64 << 10];
                    let mut sent = 0;
                    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ");
                    while sent < 64 << 20 {
                        match s.write(&chunk) {
                            Ok(n) => sent += n,
                            Err(_) => break,
                        }
                    }
                    sent
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));

        // While they are connected, /liveness answers within a second, every time.
        let mut worst = Duration::ZERO;
        let mut probes = 0;
        while start.elapsed() < Duration::from_secs(4) {
            let t0 = Instant::now();
            let r = tern_testkit::ternd::http_get(addr, "/liveness", Duration::from_secs(1));
            let took = t0.elapsed();
            assert!(
                matches!(r, Ok((200, _))),
                "/liveness under load: {r:?} after {took:?}"
            );
            worst = worst.max(took);
            probes += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(worst < Duration::from_secs(1), "worst /liveness {worst:?}");
        let (m, body) =
            tern_testkit::ternd::http_get(addr, "/metrics", Duration::from_secs(2)).unwrap();
        assert_eq!(m, 200);
        assert!(body.contains("tern_endpoints"), "{body}");
        // The whole page parses as the exposition format, each family once.
        let families = tern_agent::metrics::exposition::check(&body).unwrap();
        for name in [
            "tern_datastore_up",
            "tern_endpoints",
            "tern_cni_requests_total",
        ] {
            assert!(families.iter().any(|f| f == name), "{name} missing: {body}");
        }

        for t in slow {
            let (held, out) = t.join().unwrap();
            assert!(held < Duration::from_secs(4), "slow client held {held:?}");
            assert!(out.starts_with("HTTP/1.1 408"), "{out:?}");
        }
        for t in big {
            let sent = t.join().unwrap();
            assert!(
                sent < 32 << 20,
                "an oversized client could send {sent} bytes"
            );
        }
        let grown = rss_kib().saturating_sub(rss_before);
        eprintln!("{probes} /liveness probes, worst {worst:?}; RSS grew by {grown} KiB");
        assert!(grown < 64 << 10, "RSS grew by {grown} KiB");
        // And a head over 8 KiB gets its answer.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut req = b"GET /liveness HTTP/1.1\r\nX-Big: ".to_vec();
        req.extend(std::iter::repeat_n(b'b', 9000));
        let _ = s.write_all(&req);
        let mut out = [0u8; 64];
        let n = s.read(&mut out).unwrap_or(0);
        assert!(
            out[..n].starts_with(b"HTTP/1.1 431"),
            "{:?}",
            String::from_utf8_lossy(&out[..n])
        );
        agent.shutdown();
    })
    .unwrap();
}
