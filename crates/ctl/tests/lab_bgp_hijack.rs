//! BGP hijack proof (issue 10): a configured eBGP peer (BIRD 2, in its own namespace on the
//! lab underlay) announces a default route, the node's underlay subnet, the node's own
//! address, the /32 of a local pod, the node's own block, a prefix outside every pool and one
//! legitimate remote block. The node's routing table must then be exactly what it was plus the
//! legitimate block; after BIRD withdraws everything, exactly what it was. What tern owns and
//! loses anyway (a pod's /32, a learned block route deleted by hand) comes back by resync.
//!
//! Needs root (namespaces) and BIRD 2; nothing happens in the root namespace. The lab is removed
//! by a guard, BIRD is stopped by PID. A raw client in BIRD's namespace then sends a malformed
//! UPDATE: ternd answers with a NOTIFICATION and lives on.

use std::collections::BTreeSet;
use std::time::Duration;

use tern_lab::{Encap, LabState};
use tern_model::{AcceptPrefix, BgpPeer, BgpPeerSpec, Resource};

const BIRD_IP: &str = "198.18.0.250";
const BIRD_AS: u32 = 65001;

mod common;
use common::Lab;

impl Lab {
    fn ip(&self, args: &[&str]) -> String {
        let n = self.st.node("node1").unwrap();
        tern_lab::process::ip_in(&n.netns, args).unwrap_or_default()
    }

    /// Every IPv4 and IPv6 route of the node's main table, one normalised line each.
    fn routes(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for fam in ["-4", "-6"] {
            for l in self.ip(&[fam, "route", "show", "table", "main"]).lines() {
                out.insert(l.split_whitespace().collect::<Vec<_>>().join(" "));
            }
        }
        out
    }

    fn log(&self) -> String {
        tern_lab::topology::log_tail(self.st.node("node1").unwrap(), 400)
    }

    fn wait<F: FnMut() -> Option<String>>(&self, what: &str, secs: u64, f: F) {
        common::wait_until(
            what,
            secs,
            || format!("\n--- ternd log ---\n{}", self.log()),
            f,
        );
    }

    fn ternd_alive(&self) -> bool {
        let pid = self
            .st
            .node("node1")
            .unwrap()
            .ternd_pid
            .expect("ternd runs");
        // SAFETY: signal 0 only checks that our child exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }
}

/// Writes BGPPeer `tor` (BIRD) admitting `accept` on top of the pools.
fn put_peer(st: &LabState, accept: &[&str]) {
    let peer = Resource::BgpPeer(BgpPeer::new(
        "tor",
        BgpPeerSpec {
            peer_ip: Some(BIRD_IP.into()),
            as_number: Some(BIRD_AS),
            accept_prefixes: accept
                .iter()
                .map(|c| AcceptPrefix {
                    cidr: c.to_string(),
                    max_length: None,
                })
                .collect(),
            ..Default::default()
        },
    ));
    tern_lab::cluster::with_store(st, move |s| {
        tern_model::put_resource(&*s, &peer)
            .map(drop)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap();
}

fn diff(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

#[test]
fn hostile_peer_cannot_hijack_and_withdraw_leaves_the_table_as_it_was() {
    // Root and BIRD 2, or the test fails saying what is missing (tern-testkit).
    tern_testkit::need_root();
    common::need_bird();
    let name = common::lab_name("bgph");
    let mut o = tern_lab::UpOptions::new(&name, common::fresh_binaries());
    o.nodes = 1;
    o.encap = Encap::None;
    o.resync_seconds = Some(2);
    o.agent_timeout = Duration::from_secs(30);
    o.agent_args.push("--bgp".into());
    let mut lab = Lab::up(&o);
    tern_lab::add_pod(&mut lab.st, "node1", "p1").unwrap_or_else(|e| panic!("add p1: {e}"));
    let pod = lab.st.pods[0].addresses[0].clone();
    let node_ip = lab.st.node("node1").unwrap().address.clone();
    let blackholes = |lab: &Lab| -> Vec<String> {
        lab.ip(&["route", "show", "type", "blackhole"])
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    };
    // The block's blackhole follows the pod's ADD by one dataplane sync.
    lab.wait("node1's block is routed", 20, || {
        blackholes(&lab)
            .is_empty()
            .then(|| "no blackhole".to_string())
    });
    let own = blackholes(&lab);
    let legit = ["10.244.250.0/26", "10.244.251.0/26"]
        .into_iter()
        .find(|b| !own.iter().any(|o| o == b))
        .unwrap();
    let pod_route = format!("{pod} dev ");
    let before = lab.routes();
    assert!(
        before.iter().any(|l| l.starts_with("default via")),
        "the lab node has a default route: {before:?}"
    );
    assert!(
        before.iter().any(|l| l.starts_with(&pod_route)),
        "{before:?}"
    );

    let hostile = [
        "0.0.0.0/0".to_string(),
        "198.18.0.0/24".to_string(),
        format!("{node_ip}/32"),
        format!("{pod}/32"),
        own[0].clone(),
        "10.99.0.0/24".to_string(),
        "203.0.113.0/24".to_string(),
    ];
    let mut statics: Vec<&str> = hostile.iter().map(String::as_str).collect();
    statics.push(legit);
    let conf = tern_lab::bird::ebgp_config(
        BIRD_IP,
        BIRD_AS,
        std::slice::from_ref(&node_ip),
        64512,
        &statics,
    );
    let bird = tern_lab::bird::BirdPeer::start(&mut lab.st, "hj", BIRD_IP, &conf)
        .unwrap_or_else(|e| panic!("BIRD: {e}"));
    // 203.0.113.0/24 is explicitly admitted from this peer: the one foreign prefix that may
    // be installed. The others stay out whatever the peer says.
    put_peer(&lab.st, &["203.0.113.0/24"]);

    // BIRD sends everything in one burst; the legitimate routes arriving means the rest has
    // been seen too. Then two more sync periods for anything late.
    let want_legit = format!("{legit} via {BIRD_IP} dev eth0 proto 85");
    let want_admitted = format!("203.0.113.0/24 via {BIRD_IP} dev eth0 proto 85");
    lab.wait("the legitimate routes are learned", 60, || {
        let r = lab.routes();
        (!r.iter().any(|l| l.starts_with(&want_legit))
            || !r.iter().any(|l| l.starts_with(&want_admitted)))
        .then(|| {
            format!(
                "{r:?}\n{}",
                bird.birdc("show protocols").unwrap_or_default()
            )
        })
    });
    std::thread::sleep(Duration::from_secs(7));
    let during = lab.routes();
    let added = diff(&during, &before);
    let removed = diff(&before, &during);
    assert!(
        removed.is_empty(),
        "routes lost: {removed:?}\n{}",
        lab.log()
    );
    assert_eq!(added.len(), 2, "added: {added:?}\n{}", lab.log());
    assert!(
        added.iter().any(|l| l.starts_with(&want_legit))
            && added.iter().any(|l| l.starts_with(&want_admitted)),
        "{added:?}"
    );
    let log = lab.log();
    for p in &hostile[..6] {
        assert!(
            log.contains(&format!("rejected {p} from peer {BIRD_IP}")),
            "no rejection logged for {p}:\n{log}"
        );
    }

    // Second line of defence, live: the peer is now allowed the default route and the
    // underlay subnet. The import policy admits them, but the kernel's routes for both are
    // not tern's (the default route, the connected subnet): nothing replaces them.
    put_peer(&lab.st, &["203.0.113.0/24", "0.0.0.0/0", "198.18.0.0/24"]);
    lab.wait("the kernel check refuses foreign routes", 30, || {
        let log = lab.log();
        ["0.0.0.0/0", "198.18.0.0/24"]
            .iter()
            .find(|p| !log.contains(&format!("not installing {p} via {BIRD_IP}")))
            .map(|p| format!("no conflict logged for {p}"))
    });
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(lab.routes(), during, "{}", lab.log());
    let m = metrics(&lab.st.node("node1").unwrap().netns);
    let rejected: u64 = m
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "tern_bgp_routes_rejected_total{{peer=\"{BIRD_IP}\"}} "
            ))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rejection counter:\n{m}"));
    assert!(rejected >= 4, "{m}");
    assert!(m.contains("\ntern_bgp_routes_conflicting 2\n"), "{m}");
    put_peer(&lab.st, &["203.0.113.0/24"]);

    // BIRD withdraws everything: exactly the table of before.
    bird.birdc("disable st").unwrap();
    lab.wait("withdrawals applied", 30, || {
        let r = lab.routes();
        (r != before).then(|| {
            format!(
                "added {:?} removed {:?}",
                diff(&r, &before),
                diff(&before, &r)
            )
        })
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(lab.routes(), before, "{}", lab.log());

    // What tern owns comes back when lost: the pod's host route (dataplane resync) ...
    let pod32 = format!("{pod}/32");
    lab.ip(&["route", "del", &pod32]);
    assert!(!lab.routes().iter().any(|l| l.starts_with(&pod_route)));
    lab.wait("the pod's host route is restored", 20, || {
        let r = lab.routes();
        (r != before).then(|| format!("{:?}", diff(&before, &r)))
    });
    // ... and a learned block route (BGP kernel sync).
    bird.birdc("enable st").unwrap();
    lab.wait("the block is learned again", 60, || {
        let r = lab.routes();
        (!r.iter().any(|l| l.starts_with(&want_legit))).then(|| format!("{r:?}"))
    });
    lab.ip(&["route", "del", legit, "proto", "85"]);
    lab.wait("the learned route is reinstalled", 20, || {
        let r = lab.routes();
        (!r.iter().any(|l| l.starts_with(&want_legit))).then(|| format!("{r:?}"))
    });
    let again = lab.routes();
    assert_eq!(diff(&before, &again), Vec::<String>::new(), "{}", lab.log());
    assert_eq!(
        diff(&again, &before).len(),
        2,
        "{:?}",
        diff(&again, &before)
    );

    // A malformed UPDATE from the peer's address: ternd answers UPDATE Message Error /
    // Malformed Attribute List, drops only that session, and BIRD's session comes back.
    bird.birdc("disable e0").unwrap();
    let msgs = raw_session_with_malformed_update(&bird.netns, &node_ip);
    assert!(
        msgs.iter()
            .any(|(t, b)| *t == 3 && b.get(..2) == Some(&[3, 1][..])),
        "no UPDATE Message Error / Malformed Attribute List: {msgs:?}\n{}",
        lab.log()
    );
    assert!(lab.ternd_alive(), "ternd died:\n{}", lab.log());
    bird.birdc("enable e0").unwrap();
    lab.wait("BIRD's session and routes come back", 60, || {
        let r = lab.routes();
        (!r.iter().any(|l| l.starts_with(&want_legit))).then(|| format!("{r:?}"))
    });
    assert!(lab.ternd_alive(), "ternd died:\n{}", lab.log());
    drop(bird);
}

/// ternd's `/metrics` page, fetched from inside the node's namespace.
fn metrics(ns: &str) -> String {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on this short-lived thread only, with a valid namespace fd.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let mut s = std::net::TcpStream::connect("127.0.0.1:9091").expect("ternd's metrics");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
    .join()
    .unwrap()
}

/// One BGP message: 16 x 0xff, length, type, body.
fn frame(typ: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![0xffu8; 16];
    m.extend_from_slice(&u16::try_from(19 + body.len()).unwrap().to_be_bytes());
    m.push(typ);
    m.extend_from_slice(body);
    m
}

/// From the peer's namespace (its address): OPEN (AS 65001, no capabilities), KEEPALIVE, then
/// an UPDATE whose path attribute length overruns the message. Returns the messages received
/// (type, body) until ternd closes the connection.
fn raw_session_with_malformed_update(ns: &str, node_ip: &str) -> Vec<(u8, Vec<u8>)> {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    let target: std::net::SocketAddr = format!("{node_ip}:179").parse().unwrap();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on this short-lived thread only, with a valid namespace fd; the
        // thread ends after the exchange.
        assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
        let mut s = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(5))
            .expect("connect to ternd's BGP port");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut open = vec![4u8];
        open.extend_from_slice(&(BIRD_AS as u16).to_be_bytes());
        open.extend_from_slice(&90u16.to_be_bytes());
        open.extend_from_slice(&[198, 18, 0, 250, 0]);
        s.write_all(&frame(1, &open)).unwrap();
        let mut got = Vec::new();
        let mut buf = Vec::new();
        let mut sent_update = false;
        loop {
            let mut chunk = [0u8; 4096];
            let n = match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 19 {
                let len = usize::from(u16::from_be_bytes([buf[16], buf[17]]));
                if len < 19 || buf.len() < len {
                    break;
                }
                let m: Vec<u8> = buf.drain(..len).collect();
                got.push((m[18], m[19..].to_vec()));
                if m[18] == 4 && !sent_update {
                    sent_update = true;
                    s.write_all(&frame(4, &[])).unwrap();
                    s.write_all(&frame(2, &[0, 0, 0xff, 0xff, 0x40, 0x01, 0x01, 0x00]))
                        .unwrap();
                }
            }
        }
        got
    })
    .join()
    .unwrap()
}
