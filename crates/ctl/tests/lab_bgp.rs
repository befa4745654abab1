//! BGP proofs (issue 6): labs whose agents run with `--bgp` and pools without encapsulation,
//! so pods can only reach each other over BGP-learned routes (protocol 85).
//!
//! - full mesh: 3 nodes, every pod reaches every other pod, remote blocks are proto 85 and
//!   there is no proto-84 route to them; `ternctl node status` shows the sessions; a killed
//!   agent's routes stay on its peers (graceful restart) and the sessions come back; the same
//!   after SIGTERM, which ternd answers with a graceful shutdown and exit status 0.
//! - BIRD 2 as top-of-rack route reflector (mesh disabled live through BGPConfiguration):
//!   BIRD learns every block, nodes learn each other's through it.
//! - BIRD as eBGP peer in another AS: each side learns the other's prefixes.
//!
//! Needs root (namespaces); nothing happens in the root namespace. Labs are removed by a guard.

use std::process::Command;
use std::time::{Duration, Instant};

use tern_lab::traffic::Proto;
use tern_lab::{Encap, mesh};
use tern_model::{
    BgpConfiguration, BgpConfigurationSpec, BgpPeer, BgpPeerSpec, Document, Resource,
};

const PORT: u16 = 7;
const BIRD_IP: &str = "198.18.0.250";

mod common;
use common::{Lab, ternctl};

impl Lab {
    fn dump(&self) -> String {
        self.logs_and_routes(25)
    }

    fn ip(&self, node: &str, args: &[&str]) -> String {
        let n = self.st.node(node).unwrap();
        tern_lab::process::ip_in(&n.netns, args).unwrap_or_default()
    }

    /// `ip route show proto 85` of a node.
    fn bgp_routes(&self, node: &str) -> String {
        self.ip(node, &["route", "show", "proto", "85"])
    }

    fn node_status(&self, node: &str) -> String {
        let n = self.st.node(node).unwrap();
        let out = Command::new(ternctl())
            .args(["node", "status", "--socket"])
            .arg(&n.socket)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The blocks affine to `node`.
    fn blocks_of(&self, node: &str) -> Vec<String> {
        let out = self.ip(node, &["route", "show", "type", "blackhole"]);
        out.lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    }

    fn wait<F: FnMut() -> Option<String>>(&self, what: &str, secs: u64, f: F) {
        common::wait_until(what, secs, || self.dump(), f);
    }

    fn assert_full_mesh(&self) {
        self.wait("pod mesh", 30, || {
            let r = mesh::check_mesh(&self.st, PORT, &[Proto::Tcp], Duration::from_millis(1500))
                .unwrap();
            (!r.failures().is_empty()).then(|| format!("{r}"))
        });
    }

    /// Every node has every other node's blocks as proto-85 routes and no proto-84 route to
    /// them.
    fn assert_bgp_routes(&self, secs: u64) {
        let nodes: Vec<String> = self.st.nodes.iter().map(|n| n.name.clone()).collect();
        self.wait("BGP routes", secs, || {
            for n in &nodes {
                let bgp = self.bgp_routes(n);
                let direct = self.ip(n, &["route", "show", "proto", "84"]);
                for other in nodes.iter().filter(|o| *o != n) {
                    for b in self.blocks_of(other) {
                        if !bgp.contains(&format!("{b} via")) {
                            return Some(format!("{n} lacks BGP route to {b} of {other}:\n{bgp}"));
                        }
                        if direct.contains(&format!("{b} via")) {
                            return Some(format!("{n} has a proto-84 route to {b}:\n{direct}"));
                        }
                    }
                }
            }
            None
        });
    }
}

fn build(tag: &str, nodes: usize) -> Lab {
    let name = common::lab_name(tag);
    let mut o = tern_lab::UpOptions::new(&name, common::fresh_binaries());
    o.nodes = nodes;
    o.encap = Encap::None;
    o.resync_seconds = Some(2);
    o.agent_timeout = Duration::from_secs(30);
    o.agent_args.push("--bgp".into());
    let mut lab = Lab::up(&o);
    for n in 1..=nodes {
        lab.add_echo_pod(&format!("node{n}"), &format!("p{n}"), Some(PORT), None);
    }
    lab
}

fn put(lab: &Lab, r: Resource) {
    tern_lab::cluster::with_store(&lab.st, move |s| {
        tern_model::put_resource(&*s, &r)
            .map(drop)
            .map_err(|e| tern_lab::LabError::Invalid(e.to_string()))
    })
    .unwrap();
}

#[test]
fn bgp_full_mesh_graceful_restart_and_flap() {
    tern_testkit::need_root();
    let mut lab = build("bgpm", 3);
    lab.assert_bgp_routes(40);
    lab.assert_full_mesh();
    let status = lab.node_status("node2");
    assert!(status.contains("IPv4 BGP status"), "{status}{}", lab.dump());
    assert!(
        status.contains("| PEER ADDRESS |") && status.matches("node-to-node mesh").count() == 2,
        "{status}{}",
        lab.dump()
    );
    assert_eq!(
        status.matches("Established").count(),
        2,
        "{status}{}",
        lab.dump()
    );

    // Graceful restart: node1's agent dies; its blocks stay routed on node2 and node3.
    let b1 = lab.blocks_of("node1");
    assert!(!b1.is_empty());
    tern_lab::kill_agent(&mut lab.st, "node1").unwrap();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(6) {
        for n in ["node2", "node3"] {
            let r = lab.bgp_routes(n);
            for b in &b1 {
                assert!(
                    r.contains(b.as_str()),
                    "{n} dropped {b} during GR:\n{r}{}",
                    lab.dump()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The session comes back (flap recovered), routes are current, pods connect.
    tern_lab::start_agent(&mut lab.st, "node1", true).unwrap();
    tern_lab::topology::wait_for_agent(lab.st.node("node1").unwrap(), Duration::from_secs(30))
        .unwrap();
    lab.wait("sessions after restart", 40, || {
        let s = lab.node_status("node2");
        (s.matches("Established").count() != 2).then_some(s)
    });
    lab.assert_bgp_routes(30);
    lab.assert_full_mesh();

    // SIGTERM: ternd shuts BGP down for a restart (no NOTIFICATION) and exits with status 0;
    // the peers keep its routes meanwhile, and the restarted agent's sessions come back.
    let b3 = lab.blocks_of("node3");
    let pid = lab
        .st
        .node("node3")
        .unwrap()
        .ternd_pid
        .expect("ternd of node3 runs");
    // SAFETY: the PID is ternd's, a child of this process that has not been reaped.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let t = Instant::now();
    let code = loop {
        let mut wstatus = 0;
        // SAFETY: waitpid on our own child, with a valid out pointer.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut wstatus, libc::WNOHANG) };
        if r == pid as libc::pid_t {
            break libc::WIFEXITED(wstatus).then(|| libc::WEXITSTATUS(wstatus));
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "ternd ignored SIGTERM{}",
            lab.dump()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "ternd exit after SIGTERM{}", lab.dump());
    let log = tern_lab::topology::log_tail(lab.st.node("node3").unwrap(), 10);
    assert!(log.contains("shutting down"), "{log}");
    lab.st
        .nodes
        .iter_mut()
        .find(|n| n.name == "node3")
        .unwrap()
        .ternd_pid = None;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(4) {
        for n in ["node1", "node2"] {
            let r = lab.bgp_routes(n);
            for b in &b3 {
                assert!(
                    r.contains(b.as_str()),
                    "{n} dropped {b} after SIGTERM of node3:\n{r}{}",
                    lab.dump()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    tern_lab::start_agent(&mut lab.st, "node3", true).unwrap();
    tern_lab::topology::wait_for_agent(lab.st.node("node3").unwrap(), Duration::from_secs(30))
        .unwrap();
    lab.wait("sessions after SIGTERM restart", 40, || {
        let s = lab.node_status("node3");
        (s.matches("Established").count() != 2).then_some(s)
    });
    lab.assert_bgp_routes(30);
    lab.assert_full_mesh();
}

#[test]
fn bird_route_reflector_with_mesh_disabled() {
    tern_testkit::need_root();
    common::need_bird();
    let mut lab = build("bgprr", 3);
    let clients: Vec<String> = lab.st.nodes.iter().map(|n| n.address.clone()).collect();
    let conf = tern_lab::bird::route_reflector_config(BIRD_IP, 64512, &clients);
    let bird = tern_lab::bird::BirdPeer::start(&mut lab.st, "rr", BIRD_IP, &conf).unwrap();
    // Live reconfiguration: mesh off, everyone peers with the ToR reflector.
    put(
        &lab,
        Resource::BgpConfiguration(BgpConfiguration::new(
            "default",
            BgpConfigurationSpec {
                node_to_node_mesh_enabled: false,
                ..Default::default()
            },
        )),
    );
    put(
        &lab,
        Resource::BgpPeer(BgpPeer::new(
            "tor",
            BgpPeerSpec {
                peer_ip: Some(BIRD_IP.into()),
                as_number: Some(64512),
                ..Default::default()
            },
        )),
    );
    let all_blocks: Vec<String> = ["node1", "node2", "node3"]
        .iter()
        .flat_map(|n| lab.blocks_of(n))
        .collect();
    lab.wait("BIRD learns every block", 40, || {
        let out = bird.birdc("show route").unwrap_or_default();
        let missing: Vec<_> = all_blocks
            .iter()
            .filter(|b| !out.contains(b.as_str()))
            .collect();
        (!missing.is_empty()).then(|| format!("missing {missing:?}:\n{out}\n{}", bird.log()))
    });
    lab.wait("only the reflector peers", 40, || {
        let s = lab.node_status("node1");
        (s.contains("node-to-node mesh") || !s.contains(BIRD_IP) || !s.contains("Established"))
            .then_some(s)
    });
    lab.assert_bgp_routes(40);
    lab.assert_full_mesh();
    drop(bird);
}

#[test]
fn bird_as_ebgp_peer() {
    tern_testkit::need_root();
    common::need_bird();
    let mut lab = build("bgpe", 2);
    let peers: Vec<String> = lab.st.nodes.iter().map(|n| n.address.clone()).collect();
    let conf = tern_lab::bird::ebgp_config(BIRD_IP, 65001, &peers, 64512, &["10.99.0.0/24"]);
    let bird = tern_lab::bird::BirdPeer::start(&mut lab.st, "eb", BIRD_IP, &conf).unwrap();
    put(
        &lab,
        Resource::BgpPeer(Document::new(
            "tor",
            BgpPeerSpec {
                peer_ip: Some(BIRD_IP.into()),
                as_number: Some(65001),
                // Outside every pool: installed only because the peer is allowed to send it.
                accept_prefixes: vec![tern_model::AcceptPrefix {
                    cidr: "10.99.0.0/24".into(),
                    max_length: None,
                }],
                ..Default::default()
            },
        )),
    );
    let blocks: Vec<String> = ["node1", "node2"]
        .iter()
        .flat_map(|n| lab.blocks_of(n))
        .collect();
    lab.wait("BIRD learns the blocks over eBGP", 40, || {
        let out = bird.birdc("show route all").unwrap_or_default();
        let ok =
            blocks.iter().all(|b| out.contains(b.as_str())) && out.contains("BGP.as_path: 64512");
        (!ok).then(|| format!("{out}\n{}", bird.log()))
    });
    lab.wait("nodes learn BIRD's prefix", 40, || {
        let r = lab.bgp_routes("node1");
        (!r.contains(&format!("10.99.0.0/24 via {BIRD_IP}"))).then_some(r)
    });
    let s = lab.node_status("node1");
    assert!(
        s.contains(&format!("| {BIRD_IP}")) && s.contains("global"),
        "{s}"
    );
    // The mesh between the nodes is still up and carries the pod routes.
    lab.assert_bgp_routes(30);
    lab.assert_full_mesh();
    drop(bird);
}
