//! Golden replay of route computation and sync (holo's pattern): each directory under
//! `tests/conformance/routes/` is one topology. `config.json` is the store snapshot (pools with
//! their encapsulation, nodes, blocks) and the node being computed; `events.json` lists changes
//! to that snapshot; `output.txt` is what [`routes::compute`] wants after the config and after
//! every event, and the route operations [`plan::plan`] issues against a fake kernel table
//! that carries over from step to step (seeded by the config's `kernel` routes). Pure: no kernel, no root.
//!
//! Regenerate the expected files with `TERN_GOLDEN_UPDATE=1 cargo test -p tern-agent --test
//! routes_golden`, then review the diff.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;
use tern_agent::routes::plan::{self, RouteOp};
use tern_agent::routes::{self, Target};
use tern_agent::snapshot::{BlockInfo, NodeInfo, PoolInfo, Snapshot};
use tern_linux::netlink::{MAIN_TABLE, Route, RouteKind, Scope};
use tern_model::EncapMode;

/// Device indexes the fake kernel gives the tunnels.
const VXLAN_IDX: u32 = 10;
const IPIP_IDX: u32 = 11;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// The node whose routes are computed.
    node: String,
    /// Its interface networks (CrossSubnet).
    local_subnets: Vec<IpNet>,
    pools: Vec<Pool>,
    nodes: Vec<Node>,
    blocks: Vec<Block>,
    /// Routes the kernel holds before the first sync (a restart with leftovers, foreign
    /// routes); empty by default.
    #[serde(default)]
    kernel: Vec<KernelRoute>,
}

/// A route in the fake kernel table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelRoute {
    dst: IpNet,
    #[serde(default)]
    via: Option<IpAddr>,
    #[serde(default)]
    blackhole: bool,
    /// Route protocol; tern's (84) by default.
    #[serde(default = "tern_protocol")]
    protocol: u8,
}

fn tern_protocol() -> u8 {
    tern_linux::TERN_ROUTE_PROTOCOL
}

fn kernel_route(k: &KernelRoute) -> Route {
    Route {
        dst: k.dst,
        kind: if k.blackhole {
            RouteKind::Blackhole
        } else {
            RouteKind::Unicast
        },
        gateway: k.via,
        oif: None,
        onlink: false,
        scope: Scope::Universe,
        protocol: k.protocol,
        table: MAIN_TABLE,
    }
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Pool {
    name: String,
    cidr: IpNet,
    #[serde(default)]
    vxlan: EncapMode,
    #[serde(default)]
    ipip: EncapMode,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Node {
    name: String,
    addresses: Vec<IpNet>,
    /// With a tunnel address the VTEP MAC is the node's deterministic one.
    #[serde(default)]
    vxlan_tunnel_addr: Option<IpAddr>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Block {
    cidr: IpNet,
    affinity: Option<String>,
    /// `[address, allocating node]` pairs.
    #[serde(default)]
    allocations: Vec<(IpAddr, String)>,
}

/// One change to the snapshot; exactly one field besides `note` is set.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Event {
    note: String,
    #[serde(default)]
    upsert_pool: Option<Pool>,
    #[serde(default)]
    remove_pool: Option<String>,
    #[serde(default)]
    upsert_node: Option<Node>,
    #[serde(default)]
    remove_node: Option<String>,
    #[serde(default)]
    upsert_block: Option<Block>,
    #[serde(default)]
    remove_block: Option<IpNet>,
    /// Another owner deletes its (foreign) routes to this destination from the kernel.
    #[serde(default)]
    foreign_route_deleted: Option<IpNet>,
}

fn pool_info(p: &Pool) -> PoolInfo {
    PoolInfo {
        name: p.name.clone(),
        cidr: p.cidr,
        vxlan: p.vxlan,
        ipip: p.ipip,
        nat_outgoing: false,
        disabled: false,
    }
}

fn node_info(n: &Node) -> NodeInfo {
    NodeInfo {
        name: n.name.clone(),
        addresses: n.addresses.clone(),
        vxlan_tunnel_addr: n.vxlan_tunnel_addr,
        vtep_mac: n.vxlan_tunnel_addr.map(|_| routes::vtep_mac(&n.name)),
    }
}

fn block_info(b: &Block) -> BlockInfo {
    BlockInfo {
        cidr: b.cidr,
        affinity: b.affinity.clone(),
        allocations: b.allocations.clone(),
    }
}

/// Applies one event; returns an error naming what the event refers to when it is unknown.
fn apply_event(s: &mut Snapshot, table: &mut Vec<Route>, e: &Event) -> Result<(), String> {
    fn upsert<T>(v: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
        match v.iter_mut().find(|x| same(x)) {
            Some(x) => *x = item,
            None => v.push(item),
        }
    }
    fn remove<T>(v: &mut Vec<T>, what: &str, same: impl Fn(&T) -> bool) -> Result<(), String> {
        let before = v.len();
        v.retain(|x| !same(x));
        if v.len() == before {
            return Err(format!("{what} not in the snapshot"));
        }
        Ok(())
    }
    let mut set = 0;
    if let Some(p) = &e.upsert_pool {
        set += 1;
        upsert(&mut s.pools, pool_info(p), |x| x.name == p.name);
    }
    if let Some(n) = &e.remove_pool {
        set += 1;
        remove(&mut s.pools, &format!("pool {n}"), |x| &x.name == n)?;
    }
    if let Some(n) = &e.upsert_node {
        set += 1;
        upsert(&mut s.nodes, node_info(n), |x| x.name == n.name);
    }
    if let Some(n) = &e.remove_node {
        set += 1;
        remove(&mut s.nodes, &format!("node {n}"), |x| &x.name == n)?;
    }
    if let Some(b) = &e.upsert_block {
        set += 1;
        upsert(&mut s.blocks, block_info(b), |x| x.cidr == b.cidr);
    }
    if let Some(c) = &e.remove_block {
        set += 1;
        remove(&mut s.blocks, &format!("block {c}"), |x| x.cidr == *c)?;
    }
    if let Some(dst) = &e.foreign_route_deleted {
        set += 1;
        remove(table, &format!("foreign route {dst}"), |r| {
            r.dst == *dst && r.protocol != tern_linux::TERN_ROUTE_PROTOCOL
        })?;
    }
    if set != 1 {
        return Err(format!("event {:?} must set exactly one change", e.note));
    }
    Ok(())
}

fn target(t: &Target) -> String {
    match t {
        Target::Blackhole => "blackhole".into(),
        Target::Direct(gw) => format!("via {gw}"),
        Target::Vxlan(gw) => format!("via {gw} dev {} onlink", routes::VXLAN_DEVICE),
        Target::Ipip(gw) => format!("via {gw} dev {} onlink", routes::IPIP_DEVICE),
    }
}

fn kernel(r: &Route) -> String {
    let mut s = match r.kind {
        RouteKind::Blackhole => format!("blackhole {}", r.dst),
        RouteKind::Unicast => r.dst.to_string(),
    };
    if let Some(gw) = r.gateway {
        write!(s, " via {gw}").unwrap();
    }
    match r.oif {
        Some(VXLAN_IDX) => write!(s, " dev {}", routes::VXLAN_DEVICE).unwrap(),
        Some(IPIP_IDX) => write!(s, " dev {}", routes::IPIP_DEVICE).unwrap(),
        Some(i) => write!(s, " dev #{i}").unwrap(),
        None => {}
    }
    if r.onlink {
        s.push_str(" onlink");
    }
    if r.protocol != tern_linux::TERN_ROUTE_PROTOCOL {
        write!(s, " proto {}", r.protocol).unwrap();
    }
    s
}

/// Renders the desired state and the plan against `table`, then applies the plan to it.
fn step(
    out: &mut String,
    title: &str,
    s: &Snapshot,
    me: &str,
    local: &[IpNet],
    table: &mut Vec<Route>,
) {
    let d = routes::compute(s, me, local);
    writeln!(out, "## {title}").unwrap();
    writeln!(out, "devices: vxlan={} ipip={}", d.vxlan, d.ipip).unwrap();
    writeln!(out, "routes:").unwrap();
    for (dst, t) in &d.routes {
        writeln!(out, "  {dst} {}", target(t)).unwrap();
    }
    if !d.vteps.is_empty() {
        writeln!(out, "vteps:").unwrap();
        for v in &d.vteps {
            let mac: Vec<String> = v.mac.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(
                out,
                "  {} {} lladdr {} dst {}",
                v.node,
                v.tunnel_ip,
                mac.join(":"),
                v.underlay
            )
            .unwrap();
        }
    }
    if !d.errors.is_empty() {
        writeln!(out, "errors:").unwrap();
        for e in &d.errors {
            writeln!(out, "  {e}").unwrap();
        }
    }
    let want = plan::kernel_routes(&d, d.vxlan.then_some(VXLAN_IDX), d.ipip.then_some(IPIP_IDX));
    let ops = plan::plan(&want, table, &HashSet::new());
    writeln!(out, "ops:").unwrap();
    for op in &ops {
        match op {
            RouteOp::Add(r) => {
                writeln!(out, "  add {}", kernel(r)).unwrap();
                table.push(r.clone());
            }
            RouteOp::Replace { old, new } => {
                writeln!(out, "  replace {} -> {}", kernel(old), kernel(new)).unwrap();
                table.retain(|k| k != old);
                table.push(new.clone());
            }
            RouteOp::Delete(r) => {
                writeln!(out, "  delete {}", kernel(r)).unwrap();
                table.retain(|k| k != r);
            }
            RouteOp::Blocked { want, foreign } => {
                writeln!(out, "  blocked {} by {}", kernel(want), kernel(foreign)).unwrap();
            }
        }
    }
    // Applied once, nothing is left to do but what a foreign route still blocks.
    let again: Vec<RouteOp> = plan::plan(&want, table, &HashSet::new())
        .into_iter()
        .filter(|op| !matches!(op, RouteOp::Blocked { .. }))
        .collect();
    assert!(again.is_empty(), "{title}: plan not idempotent: {again:?}");
    out.push('\n');
}

fn run(dir: &Path) -> String {
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()))
    };
    let cfg: Config = serde_json::from_str(&read("config.json"))
        .unwrap_or_else(|e| panic!("{}/config.json: {e}", dir.display()));
    let events: Vec<Event> = serde_json::from_str(&read("events.json"))
        .unwrap_or_else(|e| panic!("{}/events.json: {e}", dir.display()));
    let mut s = Snapshot {
        pools: cfg.pools.iter().map(pool_info).collect(),
        nodes: cfg.nodes.iter().map(node_info).collect(),
        blocks: cfg.blocks.iter().map(block_info).collect(),
        errors: vec![],
    };
    let mut table: Vec<Route> = cfg.kernel.iter().map(kernel_route).collect();
    let mut out = String::new();
    let (me, local) = (&cfg.node, &cfg.local_subnets);
    step(&mut out, "config", &s, me, local, &mut table);
    for (i, e) in events.iter().enumerate() {
        apply_event(&mut s, &mut table, e)
            .unwrap_or_else(|err| panic!("{}: event {i}: {err}", dir.display()));
        step(
            &mut out,
            &format!("event {}: {}", i + 1, e.note),
            &s,
            me,
            local,
            &mut table,
        );
    }
    out
}

#[test]
fn route_topologies_match_golden_outputs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/routes");
    let update = std::env::var("TERN_GOLDEN_UPDATE").is_ok_and(|v| v == "1");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 6,
        "route cases missing in {}",
        root.display()
    );
    let mut failures = Vec::new();
    for case in &cases {
        let got = run(case);
        let expected = case.join("output.txt");
        if update {
            std::fs::write(&expected, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected).unwrap_or_default();
        if got != want {
            failures.push(first_difference(&expected, &got, &want));
        }
    }
    assert!(
        failures.is_empty(),
        "golden mismatch (rerun with TERN_GOLDEN_UPDATE=1 after checking the change):\n{}",
        failures.join("\n")
    );
}

/// `file:line: got … / want …` at the first differing line.
fn first_difference(file: &Path, got: &str, want: &str) -> String {
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let i = (0..g.len().max(w.len()))
        .find(|&i| g.get(i) != w.get(i))
        .unwrap_or(0);
    format!(
        "{}:{}: got {:?}, want {:?}",
        file.display(),
        i + 1,
        g.get(i).unwrap_or(&"<end>"),
        w.get(i).unwrap_or(&"<end>")
    )
}
