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
use tern_testkit::golden;

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
        ..Default::default()
    }
}

fn block_info(b: &Block) -> BlockInfo {
    BlockInfo {
        cidr: b.cidr,
        affinity: b.affinity.clone(),
        allocations: b.allocations.clone(),
    }
}

/// Removes the entries `same` picks from `v`; an error naming `what` when there is none.
fn remove<T>(v: &mut Vec<T>, what: &str, same: impl Fn(&T) -> bool) -> Result<(), String> {
    let before = v.len();
    v.retain(|x| !same(x));
    if v.len() == before {
        return Err(format!("{what} not in the snapshot"));
    }
    Ok(())
}

/// One kind's half of an event: replaces (or adds) the entry with `upsert`'s key, removes the
/// entry keyed `remove`. Returns how many of the two the event set.
fn change<R, T, K: PartialEq + std::fmt::Display>(
    v: &mut Vec<T>,
    what: &str,
    upsert: Option<&R>,
    remove_key: Option<&K>,
    info: fn(&R) -> T,
    key: fn(&T) -> &K,
) -> Result<usize, String> {
    if let Some(r) = upsert {
        let item = info(r);
        match v.iter_mut().find(|x| key(x) == key(&item)) {
            Some(x) => *x = item,
            None => v.push(item),
        }
    }
    if let Some(k) = remove_key {
        remove(v, &format!("{what} {k}"), |x| key(x) == k)?;
    }
    Ok(usize::from(upsert.is_some()) + usize::from(remove_key.is_some()))
}

/// Applies one event; returns an error naming what the event refers to when it is unknown.
fn apply_event(s: &mut Snapshot, table: &mut Vec<Route>, e: &Event) -> Result<(), String> {
    let mut set = change(
        &mut s.pools,
        "pool",
        e.upsert_pool.as_ref(),
        e.remove_pool.as_ref(),
        pool_info,
        |x| &x.name,
    )?;
    set += change(
        &mut s.nodes,
        "node",
        e.upsert_node.as_ref(),
        e.remove_node.as_ref(),
        node_info,
        |x| &x.name,
    )?;
    set += change(
        &mut s.blocks,
        "block",
        e.upsert_block.as_ref(),
        e.remove_block.as_ref(),
        block_info,
        |x| &x.cidr,
    )?;
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
    let want = plan::kernel_routes(
        &d,
        d.vxlan.then_some(VXLAN_IDX),
        d.ipip.then_some(IPIP_IDX),
        None,
    );
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
    let cfg: Config = golden::parse(dir, "config.json", |t| serde_json::from_str(t));
    let events: Vec<Event> = golden::parse(dir, "events.json", |t| serde_json::from_str(t));
    let mut s = Snapshot {
        pools: cfg.pools.iter().map(pool_info).collect(),
        nodes: cfg.nodes.iter().map(node_info).collect(),
        blocks: cfg.blocks.iter().map(block_info).collect(),
        errors: vec![],
        ..Snapshot::default()
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
    golden::check(&root, "output.txt", 6, run);
}
