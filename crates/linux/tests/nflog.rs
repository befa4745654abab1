//! The NFLOG reader on the real kernel, in a private network namespace: a rule with
//! `log prefix ... group N snaplen 96` logs packets sent inside the namespace, and the reader
//! gets each one with its prefix, interface and headers, numbered without gaps; a reader that
//! falls behind a small buffer sees the kernel's losses counted, not lost silently.
//! Root and `nft` only.

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use tern_linux::nflog::{NflogBatch, NflogConfig, NflogEvent, NflogSocket};
use tern_testkit::netns::Netns;

fn setup(tag: &str, group: u16) -> Netns {
    tern_testkit::need_root();
    tern_testkit::need_binary("nft");
    let ns = Netns::new(tag);
    ns.exec(&[
        "nft",
        &format!(
            "add table inet tnflog; add chain inet tnflog out {{ type filter hook output priority 0; }}; \
             add rule inet tnflog out udp dport 9 log prefix \"t:dd:e\" group {group} snaplen 96"
        ),
    ]);
    ns
}

/// Sends `n` UDP datagrams to port 9 of `to` from one socket inside the namespace; the
/// socket's port.
fn send(ns: &Netns, bind: &str, to: &str, n: usize) -> u16 {
    let (bind, to) = (bind.to_string(), to.to_string());
    ns.run(move || {
        let s = UdpSocket::bind(&bind).unwrap();
        for _ in 0..n {
            // Nothing listens: ICMP unreachable comes back, which is fine.
            let _ = s.send_to(b"x", &to);
        }
        s.local_addr().unwrap().port()
    })
}

/// Reads until `n` events arrived, 10 s passed, or (after the first event) nothing came for
/// 300 ms, summing the batches.
fn read(sock: &mut NflogSocket, n: usize) -> (Vec<NflogEvent>, NflogBatch) {
    let mut all = Vec::new();
    let mut sum = NflogBatch::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while all.len() < n && Instant::now() < deadline {
        let b = sock.recv(Duration::from_millis(300)).unwrap();
        if b.events.is_empty() && b.overruns == 0 && !all.is_empty() {
            break;
        }
        sum.lost += b.lost;
        sum.overruns += b.overruns;
        sum.malformed += b.malformed;
        all.extend(b.events);
    }
    (all, sum)
}

#[test]
fn logged_packets_reach_the_reader_with_prefix_headers_and_sequence() {
    let ns = setup("nflog", 7);
    let mut sock = ns.run(|| NflogSocket::open(&NflogConfig::new(7))).unwrap();
    let port4 = send(&ns, "127.0.0.1:0", "127.0.0.1:9", 3);
    let port6 = send(&ns, "[::1]:0", "[::1]:9", 2);
    let (events, sum) = read(&mut sock, 5);
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!((sum.lost, sum.overruns, sum.malformed), (0, 0, 0));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.prefix, "t:dd:e");
        assert_eq!(e.seq, Some(i as u32), "numbered from 0 without gaps");
        // Output hook: the loopback is the out interface (index 1 in a new namespace).
        assert_eq!(e.outdev, Some(1), "{e:?}");
        let p = e.packet.expect("headers copied");
        assert_eq!((p.proto, p.dst_port), (17, Some(9)));
        let (want_src, want_port, fam) = if i < 3 {
            ("127.0.0.1", port4, 2)
        } else {
            ("::1", port6, 10)
        };
        assert_eq!(p.src, want_src.parse::<IpAddr>().unwrap());
        assert_eq!(p.src_port, Some(want_port));
        assert_eq!(e.family, fam);
    }
    // A second reader of the same group is refused, naming it.
    let err = ns
        .run(|| NflogSocket::open(&NflogConfig::new(7)))
        .err()
        .expect("the group is taken");
    assert!(err.to_string().contains("group 7"), "{err}");
    sock.unbind().unwrap();
}

#[test]
fn a_reader_that_falls_behind_counts_what_the_kernel_dropped() {
    let ns = setup("nflogloss", 8);
    let cfg = NflogConfig {
        qthreshold: 1,
        rcvbuf: 4096,
        ..NflogConfig::new(8)
    };
    let mut sock = ns.run(|| NflogSocket::open(&cfg)).unwrap();
    // Far more than a 4 KiB buffer holds, sent before anything is read.
    let flood = 3000;
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", flood);
    let (mut events, mut sum) = read(&mut sock, flood);
    // One more after the drain: its sequence number shows every loss before it.
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", 1);
    let (more, s2) = read(&mut sock, 1);
    events.extend(more);
    sum.lost += s2.lost;
    sum.overruns += s2.overruns;
    assert!(sum.lost > 0, "a 4 KiB buffer kept all {flood} events?");
    assert!(sum.overruns > 0, "the overflow was reported (ENOBUFS)");
    assert_eq!(
        events.len() as u64 + sum.lost,
        flood as u64 + 1,
        "every event is delivered or counted as lost"
    );
}
