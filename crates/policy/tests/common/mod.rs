//! Helpers shared by the policy crate's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::net::IpAddr;
use std::process::Command;

use tern_model::{EndpointPort, Protocol};
use tern_policy::Endpoint;

/// Network namespaces (`ip netns`) deleted when dropped, even when the test fails.
pub struct Netns(pub Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// An endpoint with one address, the given labels and a named TCP port `web` (80).
pub fn endpoint(
    ns: &str,
    name: &str,
    node: &str,
    interface: String,
    ip: &str,
    labels: &[(&str, &str)],
) -> Endpoint {
    Endpoint {
        namespace: ns.into(),
        name: name.into(),
        node: node.into(),
        interface,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into(),
        ips: vec![ip.parse::<IpAddr>().unwrap()],
        ports: vec![EndpointPort {
            name: "web".into(),
            protocol: Protocol::Tcp,
            port: 80,
        }],
    }
}
