//! Named container ports end to end (issue 5): a pod ADDed with `args.cni.ports` gets them in
//! its WorkloadEndpoint's `spec.ports`, and a Kubernetes NetworkPolicy that allows ingress only
//! to the named port `http` lets real TCP from another pod of the node reach that port's
//! number and not another port. Changing the stored port (as `ternctl port` does) moves the
//! hole. Bad `args.cni.ports` fail with code 7 before anything is created.
//!
//! Needs root; every namespace is created by the harness and deleted by its guards.

mod common;

use common::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use tern_model::{EndpointPort, Kind, Protocol, Resource, WorkloadEndpoint};

const HTTP: u16 = 8080;
const OTHER: u16 = 9090;
/// How long policy may take to follow a store change (agent store watch + nft).
const PROPAGATION: Duration = Duration::from_secs(10);

/// An echo server on `ip:port` inside the pod at `ns_path`; it serves until the test ends
/// (the listener lives in the pod namespace, which the guard deletes).
fn echo_server(ns_path: &str, ip: IpAddr, port: u16) {
    let listener = in_netns(ns_path, move || {
        TcpListener::bind(SocketAddr::new(ip, port))
    })
    .unwrap_or_else(|e| panic!("binding {ip}:{port} in {ns_path}: {e}"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 64];
                if let Ok(n) = c.read(&mut buf) {
                    let _ = c.write_all(&buf[..n]);
                }
            });
        }
    });
}

/// One TCP exchange from the pod at `from_ns` to `ip:port`: connect, send, read the echo.
fn tcp_echo(from_ns: &str, ip: IpAddr, port: u16) -> Result<(), String> {
    let dst = SocketAddr::new(ip, port);
    in_netns(from_ns, move || {
        let t = Duration::from_millis(400);
        let mut s =
            TcpStream::connect_timeout(&dst, t).map_err(|e| format!("connect {dst}: {e}"))?;
        s.set_read_timeout(Some(t)).map_err(|e| e.to_string())?;
        s.write_all(b"tern-named-port")
            .map_err(|e| format!("send to {dst}: {e}"))?;
        let mut buf = [0u8; 64];
        let n = s
            .read(&mut buf)
            .map_err(|e| format!("read from {dst}: {e}"))?;
        if &buf[..n] == b"tern-named-port" {
            Ok(())
        } else {
            Err(format!("{dst} echoed {:?}", &buf[..n]))
        }
    })
}

/// Waits until `port` on the server is reachable (`want`) or not from the client; returns the
/// last outcome on timeout.
fn wait_reach(client: &Pod, ip: IpAddr, port: u16, want: bool) -> Result<(), String> {
    let mut last = String::new();
    let ok = wait_until(PROPAGATION, || match tcp_echo(&client.path(), ip, port) {
        Ok(()) => {
            last = "reachable".into();
            want
        }
        Err(e) => {
            last = e;
            !want
        }
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "port {port} of {ip} should be {}reachable after {PROPAGATION:?}; last: {last}",
            if want { "" } else { "un" }
        ))
    }
}

/// The WorkloadEndpoint of container `cid` in the node's store.
fn wep_of(node: &Node, cid: &str) -> WorkloadEndpoint {
    let cid = cid.to_string();
    node.with_store_conn(move |s| {
        tern_model::list_resources(&*s, Kind::WorkloadEndpoint)
            .expect("listing endpoints")
            .into_iter()
            .find_map(|r| match r {
                Resource::WorkloadEndpoint(w) if w.spec.container_id == cid => Some(w),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no WorkloadEndpoint of {cid}"))
    })
}

fn put(node: &Node, r: Resource) {
    node.with_store_conn(move |s| {
        tern_model::put_resource(&*s, &r).expect("writing to the store");
    });
}

/// The node's configuration with `args.cni` labels and ports.
fn conf_with(node: &Node, cni_args: Value) -> Value {
    let mut c = node.conf("1.0.0");
    c["args"] = json!({ "cni": cni_args });
    c
}

#[test]
fn policy_on_a_named_port_allows_only_that_port() {
    tern_testkit::need_root();
    let node = Node::new();
    let (server, client) = (Pod::new(), Pod::new());
    let server_conf = conf_with(
        &node,
        json!({
            "labels": [{"key": "app", "value": "server"}],
            "ports": [
                {"name": "http", "containerPort": HTTP, "protocol": "tcp"},
                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            ],
        }),
    );
    let server_ip = result_ip(&node.add(&server, "np-server", &server_conf));
    let client_conf = conf_with(
        &node,
        json!({"labels": [{"key": "app", "value": "client"}]}),
    );
    node.add(&client, "np-client", &client_conf);

    // The stored endpoint carries the ports as given (protocol normalised, order kept).
    let wep = wep_of(&node, "np-server");
    assert_eq!(
        wep.spec.ports,
        vec![
            EndpointPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: HTTP
            },
            EndpointPort {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53
            },
        ],
        "spec.ports of {}",
        wep.metadata.name
    );
    assert!(wep_of(&node, "np-client").spec.ports.is_empty());

    // Without a policy both ports answer: a later failure is the policy's doing.
    echo_server(&server.path(), server_ip, HTTP);
    echo_server(&server.path(), server_ip, OTHER);
    wait_reach(&client, server_ip, HTTP, true).unwrap();
    wait_reach(&client, server_ip, OTHER, true).unwrap();

    let policy = tern_model::parse_documents(
        "apiVersion: networking.k8s.io/v1\n\
         kind: NetworkPolicy\n\
         metadata: {name: allow-http, namespace: default}\n\
         spec:\n  podSelector: {matchLabels: {app: server}}\n  ingress:\n  - ports: [{port: http}]\n",
        "allow-http.yaml",
    )
    .expect("policy parses")
    .remove(0);
    put(&node, policy);
    wait_reach(&client, server_ip, OTHER, false).unwrap();
    wait_reach(&client, server_ip, HTTP, true).unwrap();
    // Stays so: the denial is not a transient of the update.
    assert!(tcp_echo(&client.path(), server_ip, OTHER).is_err());
    assert_eq!(tcp_echo(&client.path(), server_ip, HTTP), Ok(()));

    // `ternctl port ... http=9090` rewrites spec.ports: the policy follows the name.
    let mut wep = wep_of(&node, "np-server");
    wep.spec.ports[0].port = OTHER;
    put(&node, Resource::WorkloadEndpoint(wep));
    wait_reach(&client, server_ip, HTTP, false).unwrap();
    wait_reach(&client, server_ip, OTHER, true).unwrap();

    // DEL removes the endpoint with its ports.
    node.cni("DEL", &server, "np-server", "eth0", &server_conf)
        .ok();
    assert!(node.endpoints_of("np-server").is_empty());
}

#[test]
fn bad_named_ports_fail_with_code_7_and_create_nothing() {
    let (node, pod) = node_and_pod();
    let cases = [
        (
            json!([{"name": "http", "containerPort": 80}, {"name": "big", "containerPort": 70000}]),
            "args.cni.ports[1].containerPort: 70000 is not a port",
        ),
        (
            json!([{"name": "Web_1", "containerPort": 80}]),
            "args.cni.ports[0].name: \"Web_1\" is not a valid port name",
        ),
        (
            json!([{"name": "q", "containerPort": 80, "protocol": "icmp"}]),
            "args.cni.ports[0].protocol: \"icmp\" is not TCP, UDP or SCTP",
        ),
    ];
    for (i, (ports, want)) in cases.into_iter().enumerate() {
        let cid = format!("np-bad{i}");
        let out = node.cni(
            "ADD",
            &pod,
            &cid,
            "eth0",
            &conf_with(&node, json!({ "ports": ports })),
        );
        let msg = out.fails_with(7);
        assert!(msg.contains(want), "{msg:?} does not name {want:?}");
        node.assert_nothing_left(&cid);
        assert!(!pod.has_link("eth0"));
    }
}
