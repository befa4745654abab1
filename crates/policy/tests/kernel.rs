//! Applies compiled rulesets to a real kernel: a private "router" network namespace with two
//! veth "pods" (each in its own uniquely named namespace, deleted even on failure), then checks
//! allowed and denied TCP/UDP traffic and that an incremental delta takes effect.
//! Runs only as root; addresses are from 198.18.0.0/15.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Duration;

use tern_model::{EndpointPort, Protocol};
use tern_policy::{Endpoint, PolicySet, compile, render_delta};

mod common;
use common::Netns;
use tern_testkit::nft;

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread that has entered network namespace `ns`; sockets it creates stay in
/// that namespace.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on a valid namespace fd only changes this (dedicated) thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}");
        f()
    })
    .join()
    .unwrap()
}

const A: &str = "198.18.10.2";
const B: &str = "198.18.20.2";

/// One TCP connection attempt (400 ms).
fn tcp_once(from: &str, to: &str, port: u16) -> bool {
    let dst = SocketAddr::new(to.parse().unwrap(), port);
    in_ns(from, move || {
        TcpStream::connect_timeout(&dst, Duration::from_millis(400)).is_ok()
    })
}

/// A connection the rules allow gets through within a few attempts (the first packet of a
/// fresh namespace waits for neighbour resolution, longer on a loaded machine).
fn tcp_ok(from: &str, to: &str, port: u16) -> bool {
    (0..5).any(|_| tcp_once(from, to, port))
}

/// A connection the rules drop: one attempt fails (a retry could not succeed either).
fn tcp_blocked(from: &str, to: &str, port: u16) -> bool {
    !tcp_once(from, to, port)
}

fn udp_ok(from: &str, server: &UdpSocket, to: &str, port: u16) -> bool {
    (0..5).any(|_| udp_once(from, server, to, port))
}

fn udp_blocked(from: &str, server: &UdpSocket, to: &str, port: u16) -> bool {
    !udp_once(from, server, to, port)
}

fn udp_once(from: &str, server: &UdpSocket, to: &str, port: u16) -> bool {
    let dst = SocketAddr::new(to.parse().unwrap(), port);
    let sock = in_ns(from, || UdpSocket::bind("0.0.0.0:0").unwrap());
    sock.send_to(b"ping", dst).unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    let mut buf = [0u8; 16];
    let mut got = false;
    while let Ok((n, _)) = server.recv_from(&mut buf) {
        got |= &buf[..n] == b"ping";
    }
    got
}

fn endpoint(name: &str, iface: &str, ip: &str, app: &str) -> Endpoint {
    Endpoint {
        namespace: "default".into(),
        name: name.into(),
        node: "n1".into(),
        interface: iface.into(),
        labels: BTreeMap::from([("app".into(), app.into())]).into(),
        ips: vec![ip.parse::<IpAddr>().unwrap()],
        ports: vec![EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
    }
}

fn load(set: &mut PolicySet, yaml: &str) {
    for r in tern_model::parse_documents(yaml, "test.yaml").unwrap() {
        r.validate().unwrap();
        set.apply(&r).unwrap();
    }
}

#[test]
fn rulesets_enforce_policy_in_a_private_namespace() {
    tern_testkit::need_root();
    let tag = std::process::id();
    let (r, a, b) = (
        format!("tpol-{tag}-r"),
        format!("tpol-{tag}-a"),
        format!("tpol-{tag}-b"),
    );
    let _guard = Netns(vec![r.clone(), a.clone(), b.clone()]);
    for n in [&r, &a, &b] {
        run(&["ip", "netns", "add", n]);
    }
    for (pod, veth, net) in [(&a, "va", "198.18.10"), (&b, "vb", "198.18.20")] {
        run(&[
            "ip", "-n", &r, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
            pod,
        ]);
        run(&[
            "ip",
            "-n",
            &r,
            "addr",
            "add",
            &format!("{net}.1/24"),
            "dev",
            veth,
        ]);
        run(&["ip", "-n", &r, "link", "set", veth, "up"]);
        run(&[
            "ip",
            "-n",
            pod,
            "addr",
            "add",
            &format!("{net}.2/24"),
            "dev",
            "eth0",
        ]);
        run(&["ip", "-n", pod, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", pod, "link", "set", "lo", "up"]);
        run(&[
            "ip",
            "-n",
            pod,
            "route",
            "add",
            "default",
            "via",
            &format!("{net}.1"),
        ]);
    }
    run(&[
        "ip",
        "netns",
        "exec",
        &r,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);

    let (bb, aa) = (b.clone(), a.clone());
    let _tcp_b = in_ns(&b, || TcpListener::bind("0.0.0.0:8080").unwrap());
    let _tcp_b2 = in_ns(&b, || TcpListener::bind("0.0.0.0:8081").unwrap());
    let _tcp_a = in_ns(&a, || TcpListener::bind("0.0.0.0:8080").unwrap());
    let udp_b = in_ns(&bb, || UdpSocket::bind("0.0.0.0:9090").unwrap());
    let udp_a = in_ns(&aa, || UdpSocket::bind("0.0.0.0:9090").unwrap());

    // No policy: everything flows.
    let mut set = PolicySet::new();
    set.upsert_endpoint(endpoint("a", "va", A, "x"));
    set.upsert_endpoint(endpoint("b", "vb", B, "b"));
    let rs0 = compile(&set, "n1");
    nft::apply_in(&r, &rs0.render_full());
    assert!(tcp_ok(&a, B, 8080));
    assert!(udp_ok(&a, &udp_b, B, 9090));

    // b accepts only TCP on its named port "http" from app=a; a is still app=x.
    load(
        &mut set,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b-web, namespace: default}\n\
         spec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: a}}}]\n    ports: [{port: http}]\n",
    );
    let rs1 = compile(&set, "n1");
    nft::apply_in(&r, &rs1.render_full());
    assert!(tcp_blocked(&a, B, 8080), "a (app=x) must not reach b");
    assert!(udp_blocked(&a, &udp_b, B, 9090));
    assert!(
        tcp_ok(&b, A, 8080),
        "a is not selected: ingress to a is open"
    );
    assert!(udp_ok(&b, &udp_a, A, 9090));

    // a becomes app=a: the delta only adds set elements.
    set.upsert_endpoint(endpoint("a", "va", A, "a"));
    let rs2 = compile(&set, "n1");
    let delta = render_delta(&rs1, &rs2);
    assert!(
        delta.lines().all(|l| l.starts_with("add element")),
        "a label change of a peer must only add elements:\n{delta}"
    );
    nft::apply_in(&r, &delta);
    assert!(tcp_ok(&a, B, 8080), "allowed after the delta");
    assert!(tcp_blocked(&a, B, 8081), "port 8081 is not the named port");
    assert!(udp_blocked(&a, &udp_b, B, 9090), "UDP is not allowed");

    // A tern policy ahead of the k8s one: log, deny TCP 8080 from a, egress from a denied for
    // UDP to b; Pass for the rest.
    load(
        &mut set,
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: first}\nspec:\n  order: 10\n  selector: app == 'b'\n  ingress:\n  - action: Log\n    protocol: TCP\n  - action: Deny\n    protocol: TCP\n    source: {nets: ['198.18.10.0/24'], notNets: ['198.18.10.9/32']}\n    destination: {ports: ['8000:8090']}\n---\n\
         apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: a-out, namespace: default}\nspec:\n  selector: app == 'a'\n  egress:\n  - action: Deny\n    protocol: UDP\n    destination: {selector: app == 'b'}\n  - action: Pass\n",
    );
    let rs3 = compile(&set, "n1");
    nft::apply_in(&r, &render_delta(&rs2, &rs3));
    assert!(
        tcp_blocked(&a, B, 8080),
        "denied by the ordered GlobalNetworkPolicy"
    );
    assert!(udp_blocked(&a, &udp_b, B, 9090));
    assert!(tcp_ok(&b, A, 8080), "b -> a still open");

    // Resync repairs drift: delete a rule behind the agent's back, then re-apply in full.
    nft::output_in(&r, &["flush", "chain", "inet", "tern", "filter-forward"]);
    assert!(tcp_ok(&a, B, 8080), "drift opened the door");
    nft::apply_in(&r, &rs3.render_full());
    assert!(tcp_blocked(&a, B, 8080), "full resync closed it");

    // Removing every policy through a delta tears down chains and sets cleanly.
    let mut empty = PolicySet::new();
    for ep in set.endpoints() {
        empty.upsert_endpoint(ep.clone());
    }
    let rs4 = compile(&empty, "n1");
    nft::apply_in(&r, &render_delta(&rs3, &rs4));
    assert!(tcp_ok(&a, B, 8080));
    assert!(udp_ok(&a, &udp_b, B, 9090));
    assert!(rs4.chains.keys().all(|c| !c.starts_with("pol-")));

    // An allow-only CIDR policy: b's chain gets the fast-path lookup. Emptying the policy's
    // own chain behind the compiler's back shows which one admits: the set alone lets a's TCP
    // to 8080 in, and nothing else.
    load(
        &mut empty,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-net, namespace: default}\n\
         spec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from: [{ipBlock: {cidr: 198.18.10.0/24}}]\n    ports: [{port: 8080, protocol: TCP}]\n",
    );
    let rs5 = compile(&empty, "n1");
    let fp = rs5
        .sets
        .keys()
        .find(|k| k.starts_with("fp-in-"))
        .expect("a fast-path set")
        .clone();
    assert!(
        rs5.chains["ep-in-vb"].rules[0]
            .to_string()
            .contains(&format!("@{fp} accept")),
        "{:?}",
        rs5.chains["ep-in-vb"]
    );
    nft::apply_in(&r, &render_delta(&rs4, &rs5));
    assert!(tcp_ok(&a, B, 8080));
    assert!(tcp_blocked(&a, B, 8081), "port 8081 is not allowed");
    let pol = rs5.chains.keys().find(|k| k.starts_with("pol-")).unwrap();
    nft::output_in(&r, &["flush", "chain", "inet", "tern", pol]);
    assert!(tcp_ok(&a, B, 8080), "the fast-path set admits on its own");
    assert!(tcp_blocked(&a, B, 8081));
    assert!(udp_blocked(&a, &udp_b, B, 9090));
    nft::output_in(&r, &["flush", "set", "inet", "tern", &fp]);
    assert!(
        tcp_blocked(&a, B, 8080),
        "with both emptied nothing admits: the set was the one letting it in"
    );
}
