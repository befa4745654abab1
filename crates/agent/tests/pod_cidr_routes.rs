//! `--use-pod-cidr` (issue 13) on real kernels: nodes are network namespaces on an underlay
//! bridge (its own namespace), each with a `ternd` process, all on one shared SQLite store.
//! Every node has Kubernetes podCIDRs in its tern Node resource (`spec.podCIDRs`, written
//! through the store as the node's agent mirrors them from Kubernetes) and in
//! `<state_dir>/pod-cidrs.json` (what that agent writes for the plugin). Pods are added with the
//! real `tern` plugin delegating to the reference host-local with `ipam.subnet: usePodCidr`,
//! so their addresses come from no tern block: the only routes between them are the podCIDR
//! routes under test.
//!
//! - direct, then VXLAN: every node with the flag routes the other nodes' podCIDRs (protocol
//!   84) via their underlay address, then (a disabled IPPool over the podCIDRs asks for VXLAN)
//!   through `vxlan.tern`; TCP and UDP pass between pods of different nodes each time; a node
//!   without the flag routes none; a podCIDR removed from its Node, or the Node deleted, takes
//!   the route with it.
//! - BGP: with `--bgp` each node advertises its podCIDRs and installs the other's as learned
//!   routes (protocol 85), with no reconciler route for them.
//! - the BGP import policy and advertisement for podCIDRs, through the public API (no root).
//!
//! Needs root and `/usr/lib/cni/host-local`; nothing happens in the root namespace. Underlay
//! 198.18.7.0/24 and 198.18.8.0/24, podCIDRs in 10.250.0.0/16, inside the test's namespaces.

mod common;

use common::REFERENCE_PLUGINS;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tern_agent::bgp::{ImportPolicy, PoolRange, Rejection, originated};
use tern_agent::snapshot::{NodeInfo, PodCidr, Snapshot};
use tern_model::{EncapMode, IpPool, IpPoolSpec, Kind, Resource};
use tern_store::Store;
use tern_testkit::netns::{Netns, Underlay};
use tern_testkit::ternd::Ternd;
use tern_testkit::wait::wait_until;

/// How long a change may take to reach another node's kernel (store watch + sync; BGP).
const CONVERGE: Duration = Duration::from_secs(30);

/// One node: its ternd (killed first on drop), its namespace, its files.
struct Host {
    name: String,
    ip: IpAddr,
    ternd: Ternd,
    ns: Netns,
    dir: tempfile::TempDir,
}

impl Host {
    /// Node `name` at `ip`/24 on the underlay, its ternd on the shared `store` with `args`;
    /// ternd not started yet.
    fn new(name: &str, u: &Underlay, ip: &str, store: &Path, args: &[&str]) -> Host {
        let ns = Netns::new(name);
        let gw = format!("{}.254", ip.rsplit_once('.').unwrap().0);
        u.attach(&ns, &format!("{ip}/24"), &gw);
        let dir = tempfile::Builder::new().prefix("tpc-").tempdir().unwrap();
        let node_ip = format!("--node-ip={ip}");
        let mut all = vec![node_ip.as_str(), "--metrics-addr=0", "--resync-seconds=5"];
        all.extend_from_slice(args);
        let mut ternd = Ternd::new(&ns.name, dir.path(), name, &all);
        // One store for every node: the harness's per-node default is replaced.
        let store_arg = format!("--store=sqlite://{}", store.display());
        let i = ternd
            .args
            .iter()
            .position(|a| a.starts_with("--store="))
            .unwrap();
        ternd.args[i] = store_arg;
        Host {
            name: name.to_string(),
            ip: ip.parse().unwrap(),
            ternd,
            ns,
            dir,
        }
    }

    /// The kernel's route to exactly `dst` (main table), `""` when none.
    fn route(&self, dst: &str) -> String {
        self.ns
            .ip(&["route", "show", "exact", dst])
            .trim()
            .to_string()
    }

    /// Every route of the main table, for failure messages.
    fn routes(&self) -> String {
        self.ns.ip(&["route", "show"])
    }

    /// Writes what this node's agent writes from Kubernetes for the plugin's `usePodCidr`.
    fn write_pod_cidrs_file(&self, cidrs: &[&str]) {
        let path = self.ternd.state_dir().join(tern_api::POD_CIDRS_FILE);
        std::fs::write(
            &path,
            json!({"node": self.name, "podCIDRs": cidrs}).to_string(),
        )
        .unwrap();
    }
}

/// Waits until `host`'s route to `dst` satisfies `ok`; panics with its routes and log.
fn wait_route(host: &Host, dst: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let done = wait_until(CONVERGE, || {
        last = host.route(dst);
        ok(&last)
    });
    assert!(
        done,
        "{}: route to {dst}: expected {what}, have {last:?}\nroutes:\n{}\nternd log:\n{}",
        host.name,
        host.routes(),
        host.ternd.log()
    );
    last
}

/// Sets `spec.podCIDRs` of tern Node `node` (compare-and-swap, retried), once the node's
/// agent has registered it.
fn set_pod_cidrs(store: &dyn Store, node: &str, cidrs: &[&str]) {
    let ok = wait_until(Duration::from_secs(20), || {
        let Ok(Some(Resource::Node(mut n))) =
            tern_model::get_resource(store, Kind::Node, None, node)
        else {
            return false;
        };
        n.spec.pod_cidrs =
            (!cidrs.is_empty()).then(|| cidrs.iter().map(|c| c.to_string()).collect());
        tern_model::put_resource(store, &Resource::Node(n)).is_ok()
    });
    assert!(ok, "could not set spec.podCIDRs of Node {node}");
}

/// The Node's VXLAN tunnel address, once registered.
fn tunnel_addr(store: &dyn Store, node: &str) -> String {
    let mut addr = None;
    let ok = wait_until(CONVERGE, || {
        addr = match tern_model::get_resource(store, Kind::Node, None, node) {
            Ok(Some(Resource::Node(n))) => n.spec.ipv4_vxlan_tunnel_addr,
            _ => None,
        };
        addr.is_some()
    });
    assert!(ok, "Node {node} got no VXLAN tunnel address");
    addr.unwrap().split('/').next().unwrap().to_string()
}

fn put_pool(store: &dyn Store, name: &str, cidr: &str, vxlan: EncapMode, disabled: bool) {
    let mut spec = IpPoolSpec::new(cidr);
    spec.vxlan_mode = vxlan;
    spec.disabled = disabled;
    tern_model::put_resource(
        store,
        &Resource::IpPool(IpPool::new(name.to_string(), spec)),
    )
    .unwrap();
}

/// A pod added by the `tern` plugin delegating to host-local with `subnet: usePodCidr`.
struct Pod {
    ns: Netns,
    ip: IpAddr,
}

/// The CNI configuration of `host`'s pods: tern with a delegated host-local on the podCIDR.
fn conf(host: &Host) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "tern",
        "agent_socket": host.ternd.socket(),
        "state_dir": host.ternd.state_dir(),
        "ipam": {
            "type": "host-local",
            "subnet": "usePodCidr",
            "dataDir": host.dir.path().join("host-local"),
        },
    })
}

/// Runs `tern` `cmd` in `host`'s namespace for the sandbox `ns` (container ID from its name).
fn cni(plugin: &Path, host: &Host, cmd: &str, ns: &Netns) -> (i32, String) {
    let cid = format!("sandbox-{}", ns.name);
    let mut command = common::cni_command(&host.ns.name, plugin, cmd);
    command
        .env("CNI_CONTAINERID", &cid)
        .env("CNI_NETNS", ns.path())
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{};\
                 K8S_POD_INFRA_CONTAINER_ID={cid}",
                ns.name
            ),
        );
    let out = common::output_with_stdin(&mut command, conf(host).to_string().as_bytes());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// ADD of a new pod on `host`; its address must lie in `pod_cidr` and come from no tern block.
fn add_pod(plugin: &Path, host: &Host, store: &Arc<dyn Store>, pod_cidr: &str) -> Pod {
    let ns = Netns::new("p");
    let (st, out) = cni(plugin, host, "ADD", &ns);
    assert_eq!(st, 0, "ADD on {}: {out}\n{}", host.name, host.ternd.log());
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let a = v["ips"][0]["address"].as_str().unwrap();
    let ip: IpAddr = a.split('/').next().unwrap().parse().unwrap();
    let net: ipnet::IpNet = pod_cidr.parse().unwrap();
    assert!(
        net.contains(&ip),
        "{ip} not in {}'s podCIDR {net}",
        host.name
    );
    let ipam = tern_ipam::Ipam::new(store.clone());
    assert!(
        !ipam.allocations(None).unwrap().iter().any(|x| x.ip == ip),
        "{ip} is a tern IPAM allocation"
    );
    Pod { ns, ip }
}

/// A TCP connection from `from` to a listener on `to.ip`, one byte each way.
fn tcp(from: &Pod, to: &Pod) -> Result<(), String> {
    common::tcp_echo(&from.ns, &to.ns, to.ip)
}

/// UDP from `from` to `to`, echoed back; the source address `to` saw.
fn udp(from: &Pod, to: &Pod) -> Result<IpAddr, String> {
    tern_testkit::netns::udp_echo(&from.ns.path(), &to.ns.path(), to.ip)
}

/// TCP both ways and UDP between `a` and `b` (retried while routes converge).
fn assert_traffic(a: &Pod, b: &Pod, ctx: &str) {
    let mut last = String::new();
    let ok = wait_until(Duration::from_secs(10), || {
        let r = tcp(a, b)
            .and_then(|_| tcp(b, a))
            .and_then(|_| udp(a, b))
            .and_then(|src| {
                (src == a.ip)
                    .then_some(())
                    .ok_or_else(|| format!("source {src}, not {}", a.ip))
            });
        match r {
            Ok(()) => true,
            Err(e) => {
                last = e;
                false
            }
        }
    });
    assert!(ok, "{ctx}: traffic {} <-> {}: {last}", a.ip, b.ip);
}

/// TX packets of `vxlan.tern` in `host`.
fn vxlan_tx(host: &Host) -> u64 {
    let out = host.ns.ip(&["-s", "-j", "link", "show", "vxlan.tern"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0)
}

/// Root and host-local, or the test fails (tern-testkit).
fn preconditions() {
    tern_testkit::need_root();
    tern_testkit::need_binary(&format!("{REFERENCE_PLUGINS}/host-local"));
}

/// The store's directory, the plugin, the store's path, the store and the underlay.
type Setup = (
    tempfile::TempDir,
    PathBuf,
    PathBuf,
    Arc<dyn Store>,
    Underlay,
);

/// What the kernel tests start from, after [`preconditions`]: the
/// directory of one SQLite store for every node (first: dropped last), the `tern` plugin, the
/// store's path and the store, holding tern's own pool (away from the podCIDRs, so ternd
/// creates no default pool), and the underlay.
fn setup() -> Setup {
    preconditions();
    let plugin = common::tern_plugin();
    let store_dir = tempfile::Builder::new().prefix("tpc-s-").tempdir().unwrap();
    let store_path = store_dir.path().join("store.db");
    let store = tern_store::open(&format!("sqlite://{}", store_path.display())).unwrap();
    put_pool(&*store, "tern", "10.244.0.0/16", EncapMode::Never, false);
    (store_dir, plugin, store_path, store, Underlay::new())
}

#[test]
fn pod_cidrs_are_routed_directly_then_over_vxlan_and_follow_their_nodes() {
    let (_store_dir, plugin, store_path, store, u) = setup();
    let flag = ["--use-pod-cidr"];
    let mut a = Host::new("a", &u, "198.18.7.1", &store_path, &flag);
    let mut b = Host::new("b", &u, "198.18.7.2", &store_path, &flag);
    // c runs without the flag: the default mode, which must route no podCIDR.
    let mut c = Host::new("c", &u, "198.18.7.3", &store_path, &[]);
    for h in [&mut a, &mut b, &mut c] {
        h.ternd.start();
    }
    let cidrs = [
        (&a, "10.250.1.0/24"),
        (&b, "10.250.2.0/24"),
        (&c, "10.250.3.0/24"),
    ];
    for (h, cidr) in cidrs {
        set_pod_cidrs(&*store, &h.name, &[cidr]);
        h.write_pod_cidrs_file(&[cidr]);
    }

    // Direct: no pool covers the podCIDRs.
    let via = |h: &Host| {
        let want = format!("via {} dev eth0 proto 84", h.ip);
        move |r: &str| r.contains(&want)
    };
    wait_route(&a, "10.250.2.0/24", "direct via b", via(&b));
    wait_route(&a, "10.250.3.0/24", "direct via c", via(&c));
    wait_route(&b, "10.250.1.0/24", "direct via a", via(&a));
    wait_route(&b, "10.250.3.0/24", "direct via c", via(&c));
    for (h, own) in [(&a, "10.250.1.0/24"), (&b, "10.250.2.0/24")] {
        wait_route(h, own, "a blackhole (own podCIDR)", |r| {
            r.starts_with("blackhole") && r.contains("proto 84")
        });
    }
    let on_c = c.ns.ip(&["route", "show", "root", "10.250.0.0/16"]);
    assert!(
        on_c.trim().is_empty(),
        "c (no --use-pod-cidr) routes podCIDRs: {on_c}"
    );

    let pa = add_pod(&plugin, &a, &store, "10.250.1.0/24");
    let pb = add_pod(&plugin, &b, &store, "10.250.2.0/24");
    assert_traffic(&pa, &pb, "direct");
    eprintln!("direct: {} <-> {} over podCIDR routes", pa.ip, pb.ip);

    // VXLAN: tern's pool encapsulates (the nodes' tunnel addresses come from it), and a
    // disabled pool over the podCIDRs asks for VXLAN without tern ever allocating from it.
    put_pool(&*store, "tern", "10.244.0.0/16", EncapMode::Always, false);
    put_pool(
        &*store,
        "pod-cidrs",
        "10.250.0.0/16",
        EncapMode::Always,
        true,
    );
    let (ta, tb) = (tunnel_addr(&*store, "a"), tunnel_addr(&*store, "b"));
    let over = |tip: &str| {
        let want = format!("via {tip} dev vxlan.tern ");
        move |r: &str| r.contains(&want) && r.contains("proto 84") && r.contains("onlink")
    };
    wait_route(&a, "10.250.2.0/24", "over VXLAN to b", over(&tb));
    wait_route(&b, "10.250.1.0/24", "over VXLAN to a", over(&ta));
    let tx = vxlan_tx(&a);
    assert_traffic(&pa, &pb, "VXLAN");
    let tx2 = vxlan_tx(&a);
    assert!(
        tx2 > tx,
        "no packet left a through vxlan.tern ({tx} -> {tx2})"
    );
    eprintln!(
        "VXLAN: {} <-> {} via {tb} / {ta}, {} packets through a's vxlan.tern",
        pa.ip,
        pb.ip,
        tx2 - tx
    );

    // A podCIDR removed from its Node takes its routes along, on every node; restored, back.
    set_pod_cidrs(&*store, "b", &[]);
    wait_route(&a, "10.250.2.0/24", "no route", str::is_empty);
    wait_route(&b, "10.250.2.0/24", "no blackhole", str::is_empty);
    set_pod_cidrs(&*store, "b", &["10.250.2.0/24"]);
    wait_route(&a, "10.250.2.0/24", "over VXLAN to b", over(&tb));
    assert_traffic(&pa, &pb, "restored podCIDR");

    // A deleted node (its agent gone first, or it would register again) takes its route too.
    b.ternd.stop();
    tern_model::delete_resource(&*store, Kind::Node, None, "b").unwrap();
    wait_route(&a, "10.250.2.0/24", "no route", str::is_empty);
    // c's, still there, is routed over VXLAN now too.
    wait_route(&a, "10.250.3.0/24", "over VXLAN to c", |r| {
        r.contains("dev vxlan.tern proto 84")
    });
    // c synced this state (it routes a's tunnel block over VXLAN) and still routes no podCIDR,
    // though the VXLAN pool covers them.
    let synced = wait_until(CONVERGE, || {
        c.ns.ip(&["route", "show", "proto", "84"])
            .contains("dev vxlan.tern")
    });
    assert!(synced, "c has no VXLAN route:\n{}", c.routes());
    let on_c = c.ns.ip(&["route", "show", "root", "10.250.0.0/16"]);
    assert!(
        on_c.trim().is_empty(),
        "c (no --use-pod-cidr) routes podCIDRs: {on_c}"
    );
}

#[test]
fn with_bgp_pod_cidrs_are_advertised_and_learned() {
    let (_store_dir, plugin, store_path, store, u) = setup();
    let flags = ["--use-pod-cidr", "--bgp"];
    let mut a = Host::new("a", &u, "198.18.8.1", &store_path, &flags);
    let mut b = Host::new("b", &u, "198.18.8.2", &store_path, &flags);
    for h in [&mut a, &mut b] {
        h.ternd.start();
    }
    for (h, cidr) in [(&a, "10.250.1.0/24"), (&b, "10.250.2.0/24")] {
        set_pod_cidrs(&*store, &h.name, &[cidr]);
        h.write_pod_cidrs_file(&[cidr]);
    }
    // Learned over BGP (protocol 85), not computed by the reconciler (no pool covers them).
    wait_route(&a, "10.250.2.0/24", "learned from b", |r| {
        r.contains("via 198.18.8.2 dev eth0 proto 85")
    });
    wait_route(&b, "10.250.1.0/24", "learned from a", |r| {
        r.contains("via 198.18.8.1 dev eth0 proto 85")
    });
    let direct = a.ns.ip(&["route", "show", "proto", "84"]);
    assert!(!direct.contains("10.250.2.0/24"), "{direct}");
    // The own podCIDR keeps the reconciler's blackhole.
    wait_route(&a, "10.250.1.0/24", "a blackhole", |r| {
        r.starts_with("blackhole") && r.contains("proto 84")
    });
    let pa = add_pod(&plugin, &a, &store, "10.250.1.0/24");
    let pb = add_pod(&plugin, &b, &store, "10.250.2.0/24");
    assert_traffic(&pa, &pb, "BGP");
    // b's podCIDR removed: b withdraws it, a removes the learned route.
    set_pod_cidrs(&*store, "b", &[]);
    wait_route(&a, "10.250.2.0/24", "withdrawn", str::is_empty);
}

/// The snapshot of nodes a (198.18.0.11) and b (198.18.0.12) with podCIDRs 10.250.1.0/24 and
/// 10.250.2.0/24, routed when `on`.
fn bgp_snapshot(on: bool) -> Snapshot {
    let node = |name: &str, a: &str| NodeInfo {
        name: name.into(),
        addresses: vec![a.parse().unwrap()],
        vxlan_tunnel_addr: None,
        vtep_mac: None,
        ..Default::default()
    };
    Snapshot {
        nodes: vec![node("a", "198.18.0.11/24"), node("b", "198.18.0.12/24")],
        pod_cidrs: vec![
            PodCidr {
                node: "a".into(),
                cidr: "10.250.1.0/24".parse().unwrap(),
            },
            PodCidr {
                node: "b".into(),
                cidr: "10.250.2.0/24".parse().unwrap(),
            },
        ],
        use_pod_cidr: on,
        ..Snapshot::default()
    }
}

fn policy(on: bool) -> ImportPolicy {
    let pools = vec![PoolRange {
        cidr: "10.244.0.0/16".parse().unwrap(),
        block_size: 26,
        disabled: false,
    }];
    let underlay = vec!["198.18.0.0/24".parse().unwrap()];
    ImportPolicy::new("a", &bgp_snapshot(on), pools, underlay, BTreeMap::new())
}

#[test]
fn bgp_advertises_own_pod_cidrs_and_accepts_others_from_their_node_only() {
    let net = |s: &str| -> ipnet::IpNet { s.parse().unwrap() };
    let (peer_b, stranger): (IpAddr, IpAddr) = (
        "198.18.0.12".parse().unwrap(),
        "198.18.0.99".parse().unwrap(),
    );
    // Off: nothing of the podCIDRs is advertised or accepted (outside every pool).
    assert!(originated(&bgp_snapshot(false), "a").is_empty());
    let p = policy(false);
    assert_eq!(
        p.evaluate(peer_b, &net("10.250.2.0/24")),
        Err(Rejection::OutsidePools)
    );
    // On: a advertises its own podCIDR, accepts b's from b (or a next hop of b), refuses it
    // from anyone else, and never accepts its own or more-specifics outside the pools.
    let out: Vec<_> = originated(&bgp_snapshot(true), "a").into_iter().collect();
    assert_eq!(out, vec![net("10.250.1.0/24")]);
    let p = policy(true);
    assert_eq!(p.evaluate(peer_b, &net("10.250.2.0/24")), Ok(()));
    assert_eq!(
        p.evaluate_via(stranger, &net("10.250.2.0/24"), Some(peer_b)),
        Ok(())
    );
    assert_eq!(
        p.evaluate(stranger, &net("10.250.2.0/24")),
        Err(Rejection::NotBlockOwner(net("10.250.2.0/24")))
    );
    assert_eq!(
        p.evaluate(peer_b, &net("10.250.1.0/24")),
        Err(Rejection::OwnBlock(net("10.250.1.0/24")))
    );
    assert_eq!(
        p.evaluate(peer_b, &net("10.250.1.7/32")),
        Err(Rejection::OwnBlock(net("10.250.1.0/24")))
    );
    assert_eq!(
        p.evaluate(peer_b, &net("10.250.2.0/25")),
        Err(Rejection::OutsidePools)
    );
}
