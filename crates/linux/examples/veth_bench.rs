//! Times `setup_pod_interface` + `teardown_pod_interface` per pod.
//!
//! Runs entirely inside namespaces it creates: a fresh "node" namespace (the main work thread
//! unshares its own) and one anonymous namespace per pod. The root namespace is never touched.
//!
//! `cargo run -p tern-linux --example veth_bench --release -- [pods]`

use std::time::{Duration, Instant};

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr};
use tern_linux::netns::{self, NetNs};
use tern_linux::veth::{self, PodInterfaceConfig};
use tern_linux::{DEFAULT_VETH_PREFIX, host_veth_name};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    let total: Duration = v.iter().sum();
    println!(
        "{what:<18} n={:<5} mean={:>8.1?} p50={:>8.1?} p90={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        v.len(),
        total / v.len() as u32,
        percentile(&v, 0.5),
        percentile(&v, 0.9),
        percentile(&v, 0.99),
        v[v.len() - 1],
    );
}

fn main() {
    let pods: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("pods must be a number"))
        .unwrap_or(200);
    std::thread::spawn(move || {
        netns::unshare_net().expect("unshare(CLONE_NEWNET): run as root");
        // Pod namespaces are created up front: their creation is the runtime's cost, not ours.
        let namespaces: Vec<NetNs> = (0..pods)
            .map(|_| netns::new_anonymous().expect("pod namespace"))
            .collect();
        let names: Vec<String> = (0..pods)
            .map(|i| {
                host_veth_name(
                    DEFAULT_VETH_PREFIX,
                    Some(("bench", &format!("pod-{i}"))),
                    "",
                )
            })
            .collect();
        let mut setup = Vec::with_capacity(pods);
        let mut teardown = Vec::with_capacity(pods);
        let mut both = Vec::with_capacity(pods);
        for (i, ns) in namespaces.iter().enumerate() {
            let ip = Ipv4Addr::new(10, 66, (i / 250) as u8, (i % 250 + 1) as u8);
            let addrs = [IpNet::new(IpAddr::V4(ip), 32).unwrap()];
            let cfg = PodInterfaceConfig {
                host_ifname: &names[i],
                pod_ifname: "eth0",
                pod_ns: ns,
                addresses: &addrs,
                mtu: 1450,
                pod_mac: None,
                allow_ip_forwarding: false,
            };
            let t0 = Instant::now();
            veth::setup_pod_interface(&cfg).expect("setup");
            let t1 = Instant::now();
            setup.push(t1 - t0);
            both.push(t1 - t0);
        }
        for (i, name) in names.iter().enumerate() {
            let t0 = Instant::now();
            veth::teardown_pod_interface(name).expect("teardown");
            let d = t0.elapsed();
            teardown.push(d);
            both[i] += d;
        }
        println!("tern-linux veth bench: {pods} pods, IPv4 /32 each, node of {pods} veths at peak");
        report("setup", setup);
        report("teardown", teardown);
        report("setup+teardown", both);
    })
    .join()
    .expect("bench thread");
}
