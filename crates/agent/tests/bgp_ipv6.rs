//! The agent's BGP with IPv6 on real kernels (issue 22): nodes are network namespaces on an
//! underlay bridge, each running the agent's BGP thread (`tern_agent::bgp::Bgp`, started on a
//! thread inside its namespace) on one shared SQLite store with an IPv4 and an IPv6 pool.
//!
//! - dual stack: the agent records both BGP addresses, the mesh session runs over IPv4 and
//!   carries the IPv6 blocks with IPv6 next hops; each node installs the other's blocks of both
//!   families in its kernel (protocol 85).
//! - IPv6 only: the session runs over IPv6, the router ID is the hash of the node name, the
//!   IPv6 blocks are installed.
//! - a BIRD 2 peer over IPv6 (a global BGPPeer with an IPv6 `peerIP`): the nodes' IPv6 blocks
//!   in BIRD's table via their IPv6 addresses (`birdc`), BIRD's IPv6 routes in the nodes'
//!   kernels as the import policy admits them (a pool prefix, an `acceptPrefixes` one; not
//!   `::/0`), and the session in the node's status.
//!
//! Needs root (and BIRD 2 for the BIRD test); nothing happens in the root namespace. Underlay 198.18.9.0/24 and
//! 2001:db8:9::/64, pools 10.244.0.0/16 and fd00:10:244::/48 inside the test's namespaces.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tern_agent::bgp::{Bgp, BgpSettings, router_id_hash};
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_model::{
    AcceptPrefix, BgpPeer, BgpPeerSpec, IpPool, IpPoolSpec, Node, NodeAddress, NodeSpec, Resource,
};
use tern_store::Store;
use tern_testkit::netns::{Netns, Underlay};
use tern_testkit::wait::wait_until;

/// How long sessions and routes may take.
const CONVERGE: Duration = Duration::from_secs(30);

struct Host {
    name: String,
    ns: Netns,
    bgp: Option<Arc<Bgp>>,
}

impl Host {
    /// Node `name` on the underlay with `v4` (/24, default route via .254) and/or `v6` (/64,
    /// `nodad`, default route via ::254), and its Node resource with those addresses.
    fn new(
        name: &str,
        u: &Underlay,
        v4: Option<&str>,
        v6: Option<&str>,
        store: &dyn Store,
    ) -> Host {
        let ns = Netns::new(name);
        match v4 {
            Some(a) => u.attach(&ns, &format!("{a}/24"), "198.18.9.254"),
            None => {
                // attach() wants an IPv4 address: give it one and take it away again.
                u.attach(&ns, "198.18.9.250/24", "198.18.9.254");
                ns.ip(&["route", "del", "default"]);
                ns.ip(&["addr", "del", "198.18.9.250/24", "dev", "eth0"]);
            }
        }
        let mut addresses = Vec::new();
        if let Some(a) = v4 {
            addresses.push(format!("{a}/24"));
        }
        if let Some(a) = v6 {
            let cidr = format!("{a}/64");
            ns.ip(&["-6", "addr", "add", &cidr, "dev", "eth0", "nodad"]);
            ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:9::254"]);
            addresses.push(cidr);
        }
        let node = Node::new(
            name.to_string(),
            NodeSpec {
                addresses: addresses
                    .into_iter()
                    .map(|address| NodeAddress {
                        address,
                        kind: Some("InternalIP".into()),
                    })
                    .collect(),
                ..Default::default()
            },
        );
        tern_model::put_resource(store, &Resource::Node(node)).unwrap();
        Host {
            name: name.to_string(),
            ns,
            bgp: None,
        }
    }

    /// Starts the BGP thread inside the node's namespace (its threads inherit it).
    fn start(&mut self, store: &Arc<dyn Store>, node_ip: &str) {
        let settings = BgpSettings {
            node_name: self.name.clone(),
            node_ip: Some(node_ip.parse().unwrap()),
            node_ip6: None,
            use_pod_cidr: false,
        };
        let store = store.clone();
        self.bgp = Some(self.ns.run(move || Bgp::start(settings, store).unwrap()));
    }

    /// The node's BGP routes (protocol 85) of both families.
    fn bgp_routes(&self) -> String {
        let v4 = self.ns.ip(&["route", "show", "proto", "85"]);
        let v6 = self.ns.ip(&["-6", "route", "show", "proto", "85"]);
        format!("{v4}{v6}")
    }

    /// Waits until the node's BGP routes contain every needle.
    fn wait_routes(&self, needles: &[&str]) {
        let ok = wait_until(CONVERGE, || {
            let r = self.bgp_routes();
            needles.iter().all(|n| r.contains(n))
        });
        assert!(
            ok,
            "{}: BGP routes never had {needles:?}:\n{}\nstatus: {:?}",
            self.name,
            self.bgp_routes(),
            self.bgp.as_ref().map(|b| b.status())
        );
    }

    /// Waits until the node's sessions are exactly those with `peers` (in address order), all
    /// up: the plan may not have every peer yet while the other nodes record their addresses.
    fn wait_established(&self, peers: &[&str]) {
        let bgp = self.bgp.as_ref().unwrap();
        let want: Vec<IpAddr> = peers.iter().map(|p| p.parse().unwrap()).collect();
        let ok = wait_until(CONVERGE, || {
            let s = bgp.status();
            let mut have: Vec<IpAddr> = s.peers.iter().map(|p| p.address).collect();
            have.sort();
            have == want && s.peers.iter().all(|p| p.state == tern_api::PeerState::Up)
        });
        assert!(
            ok,
            "{}: sessions not {want:?}, all up: {:?}",
            self.name,
            bgp.status()
        );
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(b) = self.bgp.take() {
            b.stop_for_restart();
        }
    }
}

fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let s = tern_store::open(&format!("sqlite://{}/store.db", dir.path().display())).unwrap();
    for (name, cidr) in [("v4", "10.244.0.0/16"), ("v6", "fd00:10:244::/48")] {
        let pool = IpPool::new(name.to_string(), IpPoolSpec::new(cidr));
        tern_model::put_resource(&*s, &Resource::IpPool(pool)).unwrap();
    }
    (dir, s)
}

/// One pod address of each family `v4`/`v6` for `node`: claims the node's blocks.
fn allocate(store: &Arc<dyn Store>, node: &str, v4: bool) -> Vec<IpAddr> {
    Ipam::new(store.clone())
        .auto_assign(&AssignArgs {
            handle: format!("test.{node}"),
            node: node.to_string(),
            attrs: AllocationAttrs {
                node: node.to_string(),
                pod: format!("pod-{node}"),
                ..Default::default()
            },
            num_v4: usize::from(v4),
            num_v6: 1,
            ..Default::default()
        })
        .unwrap()
}

/// The block (as `ip route` prints it) of `ip`.
fn block(store: &Arc<dyn Store>, ip: IpAddr) -> String {
    Ipam::new(store.clone())
        .blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.cidr.contains(&ip))
        .unwrap()
        .cidr
        .to_string()
}

fn recorded(store: &dyn Store, node: &str) -> (Option<String>, Option<String>) {
    let Some(Resource::Node(n)) =
        tern_model::get_resource(store, tern_model::Kind::Node, None, node).unwrap()
    else {
        panic!("no Node {node}");
    };
    let b = n.spec.bgp.unwrap_or_default();
    (b.ipv4_address, b.ipv6_address)
}

/// Dual-stack nodes a (198.18.9.1, 2001:db8:9::1) and b (.2, ::2), a pod address of each
/// family allocated for each (their blocks), BGP started: the nodes and their addresses.
fn dual_pair(u: &Underlay, s: &Arc<dyn Store>) -> (Host, Host, Vec<IpAddr>, Vec<IpAddr>) {
    let mut a = Host::new("a", u, Some("198.18.9.1"), Some("2001:db8:9::1"), &**s);
    let mut b = Host::new("b", u, Some("198.18.9.2"), Some("2001:db8:9::2"), &**s);
    let pa = allocate(s, "a", true);
    let pb = allocate(s, "b", true);
    a.start(s, "198.18.9.1");
    b.start(s, "198.18.9.2");
    (a, b, pa, pb)
}

#[test]
fn dual_stack_nodes_carry_ipv6_blocks_over_their_ipv4_session() {
    tern_testkit::need_root();
    let (_d, s) = store();
    let u = Underlay::new();
    let (a, b, pa, pb) = dual_pair(&u, &s);
    // The mesh session runs over IPv4 only.
    a.wait_established(&["198.18.9.2"]);
    b.wait_established(&["198.18.9.1"]);
    assert_eq!(a.bgp.as_ref().unwrap().status().router_id, "198.18.9.1");
    assert_eq!(
        recorded(&*s, "a"),
        (
            Some("198.18.9.1/24".to_string()),
            Some("2001:db8:9::1/64".to_string())
        )
    );
    // Both families of the other's blocks in the kernel, each via the node's own address of
    // that family.
    let (a4, a6) = (block(&s, pa[0]), block(&s, pa[1]));
    let (b4, b6) = (block(&s, pb[0]), block(&s, pb[1]));
    assert!(b6.ends_with("/122"), "{b6}");
    a.wait_routes(&[
        &format!("{b4} via 198.18.9.2 dev eth0"),
        &format!("{b6} via 2001:db8:9::2 dev eth0"),
    ]);
    b.wait_routes(&[
        &format!("{a4} via 198.18.9.1 dev eth0"),
        &format!("{a6} via 2001:db8:9::1 dev eth0"),
    ]);
    // Never its own blocks.
    let own = a.bgp_routes();
    assert!(!own.contains(&a4) && !own.contains(&a6), "{own}");
    // The route carries traffic: a TCP connection from node a reaches b's IPv6 pod address
    // (on b's loopback here), from a's IPv6 node address.
    b.ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{}/128", pb[1]),
        "dev",
        "lo",
        "nodad",
    ]);
    let to = pb[1];
    let server =
        b.ns.run(move || TcpListener::bind(SocketAddr::new(to, 0)).unwrap());
    let dst = server.local_addr().unwrap();
    let client =
        a.ns.run(move || TcpStream::connect_timeout(&dst, Duration::from_secs(5)));
    assert!(client.is_ok(), "TCP to {dst} from a: {client:?}");
    let (_, from) = server.accept().unwrap();
    assert_eq!(from.ip(), "2001:db8:9::1".parse::<IpAddr>().unwrap());
}

#[test]
fn ipv6_only_nodes_peer_over_ipv6_with_hashed_router_ids() {
    tern_testkit::need_root();
    let (_d, s) = store();
    let u = Underlay::new();
    let mut a = Host::new("a", &u, None, Some("2001:db8:9::1"), &*s);
    let mut b = Host::new("b", &u, None, Some("2001:db8:9::2"), &*s);
    let pa = allocate(&s, "a", false);
    let pb = allocate(&s, "b", false);
    a.start(&s, "2001:db8:9::1");
    b.start(&s, "2001:db8:9::2");
    a.wait_established(&["2001:db8:9::2"]);
    b.wait_established(&["2001:db8:9::1"]);
    assert_eq!(
        a.bgp.as_ref().unwrap().status().router_id,
        router_id_hash("a").to_string()
    );
    assert_eq!(
        recorded(&*s, "b"),
        (None, Some("2001:db8:9::2/64".to_string()))
    );
    let (a6, b6) = (block(&s, pa[0]), block(&s, pb[0]));
    a.wait_routes(&[&format!("{b6} via 2001:db8:9::2 dev eth0")]);
    b.wait_routes(&[&format!("{a6} via 2001:db8:9::1 dev eth0")]);
}

/// BIRD 2 in its own namespace on the underlay, stopped by PID on drop (the namespace goes
/// with its `Netns`).
struct Bird {
    /// Held for its drop: the namespace goes after BIRD.
    _ns: Netns,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Bird {
    /// BIRD at 198.18.9.100 and 2001:db8:9::100 on the underlay, with `config`.
    fn start(u: &Underlay, config: &str) -> Bird {
        let bin = tern_testkit::need_binary("/usr/sbin/bird");
        tern_testkit::need_binary("/usr/sbin/birdc");
        let ns = Netns::new("bird");
        u.attach(&ns, "198.18.9.100/24", "198.18.9.254");
        ns.ip(&[
            "-6",
            "addr",
            "add",
            "2001:db8:9::100/64",
            "dev",
            "eth0",
            "nodad",
        ]);
        let dir = tempfile::Builder::new().prefix("tbird-").tempdir().unwrap();
        let conf = dir.path().join("bird.conf");
        std::fs::write(&conf, config).unwrap();
        let log = std::fs::File::create(dir.path().join("bird.log")).unwrap();
        // `ip netns exec` execs into bird: the child's PID is BIRD's.
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(bin)
            .arg("-f")
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(dir.path().join("bird.ctl"))
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Bird {
            _ns: ns,
            child,
            dir,
        }
    }

    fn birdc(&self, cmd: &str) -> String {
        let out = std::process::Command::new("/usr/sbin/birdc")
            .arg("-s")
            .arg(self.dir.path().join("bird.ctl"))
            .args(cmd.split_whitespace())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until BIRD's route for `prefix` goes via `via`.
    fn wait_route(&self, prefix: &str, via: &str) {
        let cmd = format!("show route for {prefix}");
        let ok = wait_until(CONVERGE, || {
            let out = self.birdc(&cmd);
            out.contains(prefix) && out.contains(&format!("via {via}"))
        });
        assert!(
            ok,
            "BIRD: {prefix} never via {via}:\n{}\n{}\nlog:\n{}",
            self.birdc("show route"),
            self.birdc("show protocols all"),
            std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
        );
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn dual_stack_nodes_peer_with_bird_over_ipv6() {
    tern_testkit::need_root();
    let (_d, s) = store();
    let u = Underlay::new();
    let bird = Bird::start(
        &u,
        r#"
log stderr all;
router id 198.18.9.100;
protocol device { scan time 1; }
protocol static ext6 {
  ipv6;
  route fd00:10:244:ff::/122 blackhole;
  route 2001:db8:ff::/64 blackhole;
  route ::/0 blackhole;
}
template bgp node {
  local 2001:db8:9::100 as 65001;
  direct;
  connect delay time 1;
  connect retry time 1;
  ipv6 { import all; export where source = RTS_STATIC; };
}
protocol bgp a from node { neighbor 2001:db8:9::1 as 64512; }
protocol bgp b from node { neighbor 2001:db8:9::2 as 64512; }
"#,
    );
    // Every node peers with BIRD over IPv6; its acceptPrefixes admit 2001:db8:ff::/48.
    let mut spec = BgpPeerSpec {
        peer_ip: Some("2001:db8:9::100".into()),
        as_number: Some(65001),
        ..Default::default()
    };
    spec.accept_prefixes = vec![AcceptPrefix {
        cidr: "2001:db8:ff::/48".into(),
        max_length: Some(64),
    }];
    let peer: BgpPeer = BgpPeer::new("tor6".to_string(), spec);
    tern_model::put_resource(&*s, &Resource::BgpPeer(peer)).unwrap();
    let (a, b, pa, pb) = dual_pair(&u, &s);
    // The mesh over IPv4, BIRD over IPv6: the node's status has one session of each family.
    let bird_ip: IpAddr = "2001:db8:9::100".parse().unwrap();
    a.wait_established(&["198.18.9.2", "2001:db8:9::100"]);
    let st = a.bgp.as_ref().unwrap().status();
    let tor = st.peers.iter().find(|p| p.address == bird_ip).unwrap();
    assert_eq!(tor.peer_type, "global");
    // tern -> BIRD: each node's IPv6 block via the node's IPv6 address.
    bird.wait_route(&block(&s, pa[1]), "2001:db8:9::1");
    bird.wait_route(&block(&s, pb[1]), "2001:db8:9::2");
    // BIRD -> tern: a pool prefix and an admitted one in the kernel; never the default route.
    for h in [&a, &b] {
        h.wait_routes(&[
            "fd00:10:244:ff::/122 via 2001:db8:9::100 dev eth0",
            "2001:db8:ff::/64 via 2001:db8:9::100 dev eth0",
        ]);
        let routes = h.bgp_routes();
        assert!(!routes.contains("default"), "{}: {routes}", h.name);
    }
    let default = a.ns.ip(&["-6", "route", "show", "default"]);
    assert!(default.contains("via 2001:db8:9::254"), "{default}");
}
