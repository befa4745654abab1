//! Flow records under a flood of new connections, on the real kernel in a private network
//! namespace: a rule logs every new UDP flow with a flow tag, a sender opens thousands of
//! connections (one source port each), and the agent's flow service, fed by the NFLOG reader,
//! keeps its ring at the cap while its dropped counter rises with every flood.
//! Root and `nft` only.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use tern_agent::config::FlowsConfig;
use tern_agent::flows::resolve::Hosts;
use tern_agent::flows::{FlowModel, Flows};
use tern_api::flow::FlowQuery;
use tern_linux::nflog::{NflogConfig, NflogSocket};
use tern_policy::PolicySet;
use tern_testkit::netns::Netns;

struct Empty(PolicySet);

impl FlowModel for Empty {
    fn with_policy_set(&self, f: &mut dyn FnMut(&PolicySet)) {
        f(&self.0)
    }
    fn generation(&self) -> u64 {
        self.0.revision()
    }
    fn hosts(&self) -> Hosts {
        Hosts::default()
    }
}

/// `n` new UDP connections (a fresh source port each) to 127.0.0.1:9 inside `ns`.
fn flood(ns: &Netns, n: usize) {
    ns.run(move || {
        for _ in 0..n {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let _ = s.send_to(b"x", "127.0.0.1:9");
        }
    });
}

/// Feeds the service until nothing came for 300 ms (at most 10 s).
fn drain(sock: &mut NflogSocket, flows: &Flows, model: &Empty) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let b = sock.recv(Duration::from_millis(300)).unwrap();
        if b.events.is_empty() && b.overruns == 0 && b.lost == 0 {
            break;
        }
        flows.take(b, model, &Hosts::default());
    }
}

#[test]
fn a_flood_of_new_connections_keeps_the_ring_at_its_cap_and_counts_the_rest() {
    tern_testkit::need_root();
    tern_testkit::need_binary("nft");
    let ns = Netns::new("flflood");
    ns.exec(&[
        "nft",
        "add table inet tflood; add chain inet tflood out { type filter hook output priority 0; }; \
         add rule inet tflood out udp dport 9 log prefix \"t:np:e\" group 31 snaplen 96",
    ]);
    let mut sock = ns.run(|| NflogSocket::open(&NflogConfig::new(31))).unwrap();
    let cfg = FlowsConfig {
        ring: 200,
        rate: 500,
        ..FlowsConfig::new(31)
    };
    let flows = Flows::new("n1", cfg);
    let model = Empty(PolicySet::new());
    flood(&ns, 3000);
    drain(&mut sock, &flows, &model);
    assert_eq!(flows.len(), 200, "the ring holds its cap");
    let first = flows.dropped();
    assert!(first >= 2000, "3,000 flows at most 500/s: {first} dropped");
    flood(&ns, 3000);
    drain(&mut sock, &flows, &model);
    assert_eq!(flows.len(), 200);
    assert!(
        flows.dropped() > first,
        "the dropped counter rises with every flood ({first} -> {})",
        flows.dropped()
    );
    let reply = flows.query(&FlowQuery::default());
    assert_eq!(reply.records.len(), 200);
    assert_eq!(reply.dropped, flows.dropped());
    let r = &reply.records[0];
    assert_eq!((r.proto.as_str(), r.dst.port), ("udp", Some(9)));
    assert_eq!(r.reason.as_str(), "no-policy");
    assert!(
        reply.last_seq > 200,
        "numbered past the ring: {}",
        reply.last_seq
    );
}
