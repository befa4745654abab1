//! `ternctl ipam show [--show-blocks] [--ip IP] [--show-borrowed]`: address usage in
//! calicoctl's tables.

use std::sync::Arc;

use tern_ipam::{Allocation, Ipam, PoolUsage};
use tern_store::Store;

use crate::table::{Align, BoxTable, count_with_percent};

/// Renders the usage table: one `IP Pool` row per pool and, with `show_blocks`, one `Block`
/// row per block of that pool after it.
pub fn render(pools: &[PoolUsage], show_blocks: bool) -> String {
    let mut t = BoxTable::new(&[
        ("GROUPING", Align::Left),
        ("CIDR", Align::Left),
        ("IPS TOTAL", Align::Right),
        ("IPS IN USE", Align::Left),
        ("IPS FREE", Align::Left),
    ]);
    let mut row = |grouping: &str, cidr: String, total: u128, in_use: u128| {
        let free = total.saturating_sub(in_use);
        t.row(vec![
            grouping.to_string(),
            cidr,
            total.to_string(),
            count_with_percent(in_use, total),
            count_with_percent(free, total),
        ]);
    };
    for p in pools {
        row("IP Pool", p.cidr.to_string(), p.total, p.in_use);
        if show_blocks {
            for b in &p.blocks {
                row("Block", b.cidr.to_string(), b.total, b.in_use);
            }
        }
    }
    t.render()
}

/// Reads usage from the store and renders it.
pub fn show(store: Arc<dyn Store>, show_blocks: bool) -> anyhow::Result<String> {
    let usage = Ipam::new(store).usage()?;
    Ok(render(&usage, show_blocks))
}

/// `ipam show --ip IP`: whether the address is allocated and, if so, to what.
pub fn show_ip(store: Arc<dyn Store>, ip: std::net::IpAddr) -> anyhow::Result<String> {
    let allocs = Ipam::new(store).allocations(None)?;
    let Some(a) = allocs.into_iter().find(|a| a.ip == ip) else {
        return Ok(format!("IP {ip} is not assigned\n"));
    };
    let mut out = format!("IP {ip} is in use\nAttributes:\n");
    let at = &a.attrs;
    let mut field = |k: &str, v: &str| {
        if !v.is_empty() {
            out.push_str(&format!("  {k}: {v}\n"));
        }
    };
    field("handle", a.handle.as_deref().unwrap_or(""));
    field("namespace", &at.namespace);
    field("pod", &at.pod);
    field("node", &at.node);
    field("containerID", &at.container_id);
    field("interface", &at.ifname);
    field("block", &a.block.to_string());
    Ok(out)
}

/// One borrowed address: allocated by a node from a block affine to another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Borrowed {
    pub ip: std::net::IpAddr,
    pub borrowing_node: String,
    pub block: ipnet::IpNet,
    /// The node the block is affine to (empty when none).
    pub block_owner: String,
    /// `<namespace>/<pod>`, or the handle when the allocation has no pod.
    pub allocated_to: String,
}

/// Borrowed addresses among `allocs`, given every block's affinity from `pools`.
pub fn borrowed(pools: &[PoolUsage], allocs: &[Allocation]) -> Vec<Borrowed> {
    let owner = |block: &ipnet::IpNet| -> Option<String> {
        pools
            .iter()
            .flat_map(|p| p.blocks.iter())
            .find(|b| b.cidr == *block)
            .map(|b| b.affinity.clone().unwrap_or_default())
    };
    let mut out: Vec<Borrowed> = allocs
        .iter()
        .filter(|a| !a.attrs.node.is_empty())
        .filter_map(|a| {
            let block_owner = owner(&a.block).unwrap_or_default();
            (block_owner != a.attrs.node).then(|| Borrowed {
                ip: a.ip,
                borrowing_node: a.attrs.node.clone(),
                block: a.block,
                block_owner,
                allocated_to: if a.attrs.pod.is_empty() {
                    a.handle.clone().unwrap_or_default()
                } else {
                    format!("{}/{}", a.attrs.namespace, a.attrs.pod)
                },
            })
        })
        .collect();
    out.sort_by_key(|b| b.ip);
    out
}

/// Renders borrowed addresses as calicoctl's `--show-borrowed` table.
pub fn render_borrowed(list: &[Borrowed]) -> String {
    let mut t = BoxTable::new(&[
        ("IP", Align::Left),
        ("BORROWING-NODE", Align::Left),
        ("BLOCK", Align::Left),
        ("BLOCK OWNER", Align::Left),
        ("ALLOCATED-TO", Align::Left),
    ]);
    for b in list {
        t.row(vec![
            b.ip.to_string(),
            b.borrowing_node.clone(),
            b.block.to_string(),
            b.block_owner.clone(),
            b.allocated_to.clone(),
        ]);
    }
    t.render()
}

/// `ipam show --show-borrowed`.
pub fn show_borrowed(store: Arc<dyn Store>) -> anyhow::Result<String> {
    let ipam = Ipam::new(store);
    let usage = ipam.usage()?;
    let allocs = ipam.allocations(None)?;
    Ok(render_borrowed(&borrowed(&usage, &allocs)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_ipam::BlockUsage;

    /// The table calicoctl prints for these numbers (seed document), byte for byte.
    const SEED: &str = "\
+----------+-----------------+-----------+------------+--------------+
| GROUPING |      CIDR       | IPS TOTAL | IPS IN USE |   IPS FREE   |
+----------+-----------------+-----------+------------+--------------+
| IP Pool  | 172.20.0.0/16   |     65536 | 61 (0%)    | 65475 (100%) |
| Block    | 172.20.147.0/26 |        64 | 24 (38%)   | 40 (62%)     |
+----------+-----------------+-----------+------------+--------------+
";

    fn seed_usage() -> Vec<PoolUsage> {
        vec![PoolUsage {
            pool: "default-ipv4-ippool".into(),
            cidr: "172.20.0.0/16".parse().unwrap(),
            total: 65536,
            in_use: 61,
            blocks: vec![BlockUsage {
                cidr: "172.20.147.0/26".parse().unwrap(),
                total: 64,
                in_use: 24,
                affinity: Some("node1".into()),
            }],
        }]
    }

    #[test]
    fn reproduces_the_calicoctl_seed_table() {
        assert_eq!(render(&seed_usage(), true), SEED);
    }

    #[test]
    fn without_blocks_only_pool_rows() {
        let out = render(&seed_usage(), false);
        assert!(out.contains("| IP Pool  | 172.20.0.0/16 |"), "{out}");
        assert!(!out.contains("Block"), "{out}");
    }

    #[test]
    fn shows_a_real_allocation() {
        use tern_model::{Document, IpPoolSpec};
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        tern_model::put_resource(
            &*store,
            &Document::new("p", IpPoolSpec::new("10.250.0.0/24")).into(),
        )
        .unwrap();
        let out = show(store.clone(), true).unwrap();
        assert!(
            out.contains("| IP Pool  | 10.250.0.0/24 |       256 | 0 (0%)     | 256 (100%) |"),
            "{out}"
        );
    }

    #[test]
    fn borrowed_table_lists_foreign_block_allocations() {
        use tern_ipam::AllocationAttrs;
        let usage = seed_usage();
        let mk = |ip: &str, node: &str, pod: &str| Allocation {
            ip: ip.parse().unwrap(),
            handle: Some(format!("net.{pod}")),
            attrs: AllocationAttrs {
                namespace: "default".into(),
                pod: pod.into(),
                node: node.into(),
                ..Default::default()
            },
            block: "172.20.147.0/26".parse().unwrap(),
            sequence_number: 1,
        };
        let list = borrowed(
            &usage,
            &[
                mk("172.20.147.1", "node1", "own"),
                mk("172.20.147.2", "node2", "guest"),
            ],
        );
        assert_eq!(list.len(), 1);
        assert_eq!(
            render_borrowed(&list),
            "\
+--------------+----------------+-----------------+-------------+---------------+
|      IP      | BORROWING-NODE |      BLOCK      | BLOCK OWNER | ALLOCATED-TO  |
+--------------+----------------+-----------------+-------------+---------------+
| 172.20.147.2 | node2          | 172.20.147.0/26 | node1       | default/guest |
+--------------+----------------+-----------------+-------------+---------------+
"
        );
    }
}
