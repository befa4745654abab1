//! The NFLOG reader on the real kernel, in a private network namespace: a rule with
//! `log prefix ... group N snaplen 96` logs packets sent inside the namespace, and the reader
//! gets each one with its prefix, interface and headers, numbered without gaps; a reader that
//! falls behind a small buffer sees the kernel's losses counted, not lost silently; after an
//! overflow of the default buffer the socket drops everything until read empty, then
//! receives again, the gap counting what it dropped.
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

/// A namespace logging to `group` and a socket on it with the agent's configuration.
fn with_agent_config(tag: &str, group: u16) -> (Netns, NflogSocket) {
    let ns = setup(tag, group);
    let sock = ns
        .run(|| NflogSocket::open(&NflogConfig::new(group)))
        .unwrap();
    (ns, sock)
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
    let (ns, mut sock) = with_agent_config("nflog", 7);
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

/// Far more events than the agent's 4 MiB buffer holds (about 60,000).
const FLOOD: usize = 100_000;

#[test]
fn the_reader_keeps_receiving_after_its_buffer_overflowed() {
    // The agent's configuration (4 MiB buffer, batches of 32), one sender socket with fixed
    // ports: one conntrack entry, so only the socket buffer can be the limit.
    let (ns, mut sock) = with_agent_config("nflogovf", 9);
    let flood = FLOOD;
    let t = Instant::now();
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", flood);
    let sent_in = t.elapsed();
    let (events, sum) = read(&mut sock, flood);
    eprintln!(
        "flood of {flood} in {sent_in:?}: {} delivered, {} lost, {} overruns",
        events.len(),
        sum.lost,
        sum.overruns
    );
    assert!(
        sum.overruns > 0,
        "no overflow reported (ENOBUFS): a 4 MiB buffer kept all {flood} events? ({} lost)",
        sum.lost
    );
    // After the drain the socket receives again: 10 more all arrive, numbered on.
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", 10);
    let (more, s2) = read(&mut sock, 10);
    eprintln!(
        "after the drain: {} of 10 delivered, {} lost, {} overruns, seqs {:?}",
        more.len(),
        s2.lost,
        s2.overruns,
        more.iter().map(|e| e.seq).collect::<Vec<_>>()
    );
    assert_eq!(more.len(), 10, "events after an overflow arrive");
    let first = more[0].seq.expect("numbered");
    for (i, e) in more.iter().enumerate() {
        assert_eq!(e.seq, Some(first + i as u32), "numbered on without gaps");
    }
    assert_eq!(
        events.len() as u64 + sum.lost + s2.lost + 10,
        flood as u64 + 10,
        "every event before them is delivered or counted as lost"
    );
    assert_eq!(
        first as usize, flood,
        "the sequence continues after the flood"
    );
}

#[test]
fn after_an_overflow_the_socket_drops_until_its_queue_is_read_empty() {
    // The kernel's netlink congestion: an overflow marks the socket congested, and until the
    // reader has emptied its queue every new message is dropped, room or not. Under a steady
    // flood a reader slower than the sender so hears nothing new until it caught up, and the
    // drops show only as the gap before the next event delivered.
    let (ns, mut sock) = with_agent_config("nflogcong", 10);
    let flood = FLOOD;
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", flood);
    // One batch read: room for more, but the queue is not empty.
    let mut got = Vec::new();
    let mut sum = NflogBatch::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no event of the flood of {flood} within 10 s"
        );
        let b = sock.recv(Duration::from_millis(300)).unwrap();
        sum.overruns += b.overruns;
        got.extend(b.events);
    }
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", 10);
    // Past the kernel's 50 ms flush: the 10 were handed to the socket (or dropped) by now.
    std::thread::sleep(Duration::from_millis(200));
    let (rest, s) = read(&mut sock, flood + 10);
    got.extend(rest);
    sum.overruns += s.overruns;
    let late = got.iter().filter(|e| e.seq >= Some(flood as u32)).count();
    eprintln!(
        "{} delivered, {} overruns, {late} of the 10 sent while congested",
        got.len(),
        sum.overruns
    );
    assert!(sum.overruns > 0, "the flood overflowed the buffer");
    assert_eq!(late, 0, "sent while the queue was not empty: dropped");
    // Once read empty, the socket takes messages again; the gap counts the drops.
    send(&ns, "127.0.0.1:0", "127.0.0.1:9", 10);
    let (more, s2) = read(&mut sock, 10);
    assert_eq!(more.len(), 10);
    assert_eq!(more[0].seq, Some(flood as u32 + 10));
    assert_eq!(got.len() as u64 + s2.lost, flood as u64 + 10);
}
