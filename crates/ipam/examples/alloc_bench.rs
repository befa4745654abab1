//! IPAM allocation rate: allocations per second for one node and for four contending nodes
//! (threads, each with its own store connection), store writes per allocation (counted by a
//! store decorator), and the reference `host-local` plugin's ADD+DEL rate in the same run.
//!
//! ```text
//! cargo run --release -p tern-ipam --example alloc_bench -- [--n 2000] [--store URL]
//! ```
//!
//! Without `--store`, each scenario uses a fresh SQLite file in a temporary directory.
//! `host-local` is only executed (with a temporary `dataDir`); nothing under /var/lib/cni
//! is touched.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_model::{IpPool, IpPoolSpec, IpamConfigSpec, put_resource};
use tern_store::{KeyValue, Store, Txn, TxnResponse, Watch};

/// Counts transactions that write (have any operation), i.e. store round trips that change
/// or may change the datastore.
struct Counting {
    inner: Arc<dyn Store>,
    writes: Arc<AtomicU64>,
}

impl Store for Counting {
    fn get(&self, key: &str) -> tern_store::Result<Option<KeyValue>> {
        self.inner.get(key)
    }
    fn range(&self, prefix: &str) -> tern_store::Result<(Vec<KeyValue>, i64)> {
        self.inner.range(prefix)
    }
    fn txn(&self, txn: Txn) -> tern_store::Result<TxnResponse> {
        if !txn.success.is_empty() || !txn.failure.is_empty() {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.txn(txn)
    }
    fn revision(&self) -> tern_store::Result<i64> {
        self.inner.revision()
    }
    fn watch(&self, prefix: &str, after: i64) -> tern_store::Result<Box<dyn Watch>> {
        self.inner.watch(prefix, after)
    }
    fn lease_grant(&self, ttl: Duration) -> tern_store::Result<i64> {
        self.inner.lease_grant(ttl)
    }
    fn lease_keepalive(&self, lease: i64) -> tern_store::Result<()> {
        self.inner.lease_keepalive(lease)
    }
    fn lease_revoke(&self, lease: i64) -> tern_store::Result<()> {
        self.inner.lease_revoke(lease)
    }
}

fn args(handle: String, node: &str) -> AssignArgs {
    AssignArgs {
        attrs: AllocationAttrs {
            namespace: "bench".into(),
            pod: handle.clone(),
            node: node.into(),
            container_id: handle.clone(),
            ifname: "eth0".into(),
        },
        handle,
        node: node.into(),
        num_v4: 1,
        ..AssignArgs::default()
    }
}

struct Row {
    scenario: String,
    ops: u64,
    secs: f64,
    writes: Option<u64>,
}

/// One scenario: `nodes` threads allocate `per_node` addresses each, then release them.
fn scenario(
    open: &dyn Fn() -> Arc<dyn Store>,
    nodes: usize,
    per_node: usize,
) -> anyhow::Result<(Row, Row)> {
    let setup = open();
    let mut spec = IpPoolSpec::new("10.200.0.0/16");
    spec.block_size = 26;
    put_resource(&*setup, &IpPool::new("bench", spec).into())?;
    Ipam::new(setup).put_config(&IpamConfigSpec {
        max_blocks_per_host: 0,
        ..IpamConfigSpec::default()
    })?;
    let writes = Arc::new(AtomicU64::new(0));
    let ipams: Vec<Ipam> = (0..nodes)
        .map(|_| {
            Ipam::new(Arc::new(Counting {
                inner: open(),
                writes: writes.clone(),
            }))
        })
        .collect();
    let run = |release: bool| -> anyhow::Result<f64> {
        let start = Instant::now();
        std::thread::scope(|s| -> anyhow::Result<()> {
            let hs: Vec<_> = ipams
                .iter()
                .enumerate()
                .map(|(n, ipam)| {
                    s.spawn(move || -> anyhow::Result<()> {
                        let node = format!("bench-node-{n}");
                        for i in 0..per_node {
                            let h = format!("bench.{node}.{i}");
                            if release {
                                ipam.release_by_handle(&h)?;
                            } else {
                                ipam.auto_assign(&args(h, &node))?;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
            }
            Ok(())
        })?;
        Ok(start.elapsed().as_secs_f64())
    };
    let total = (nodes * per_node) as u64;
    let alloc_secs = run(false)?;
    let alloc_writes = writes.swap(0, Ordering::Relaxed);
    let release_secs = run(true)?;
    let release_writes = writes.load(Ordering::Relaxed);
    let label = if nodes == 1 {
        "1 node".to_string()
    } else {
        format!("{nodes} contending nodes")
    };
    Ok((
        Row {
            scenario: format!("tern-ipam allocate, {label}"),
            ops: total,
            secs: alloc_secs,
            writes: Some(alloc_writes),
        },
        Row {
            scenario: format!("tern-ipam release by handle, {label}"),
            ops: total,
            secs: release_secs,
            writes: Some(release_writes),
        },
    ))
}

/// `host-local` ADD then DEL, `n` times, with a temporary data directory.
fn host_local(n: usize) -> anyhow::Result<Option<Row>> {
    let plugin = "/usr/lib/cni/host-local";
    if !std::path::Path::new(plugin).exists() {
        return Ok(None);
    }
    let dir = tempfile::tempdir()?;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "host-local",
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.201.0.0/16"}]],
            "dataDir": dir.path(),
        }
    })
    .to_string();
    let exec = |cmd: &str, id: &str| -> anyhow::Result<()> {
        let mut child = Command::new(plugin)
            .env_clear()
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", id)
            // host-local requires CNI_NETNS to be set but never enters it.
            .env("CNI_NETNS", "/proc/self/ns/net")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?
            .write_all(conf.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            anyhow::bail!(
                "host-local {cmd} failed: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(())
    };
    let start = Instant::now();
    for i in 0..n {
        let id = format!("bench{i}");
        exec("ADD", &id)?;
        exec("DEL", &id)?;
    }
    Ok(Some(Row {
        scenario: "host-local ADD+DEL (exec per call)".into(),
        ops: n as u64,
        secs: start.elapsed().as_secs_f64(),
        writes: None,
    }))
}

fn main() -> anyhow::Result<()> {
    let mut n = 2000usize;
    let mut url: Option<String> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => {
                n = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--n needs a value"))?
                    .parse()?
            }
            "--store" => url = it.next(),
            "-h" | "--help" => {
                println!("alloc_bench [--n N] [--store URL]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let mut rows = Vec::new();
    for nodes in [1usize, 4] {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bench.db");
        let url = url.clone();
        let open = move || -> Arc<dyn Store> {
            match &url {
                Some(u) => tern_store::open(u).expect("open store"),
                None => {
                    Arc::new(tern_store::sqlite::SqliteStore::open(&path).expect("open sqlite"))
                }
            }
        };
        let (a, r) = scenario(&open, nodes, n / nodes)?;
        rows.push(a);
        rows.push(r);
    }
    if let Some(r) = host_local((n / 10).max(20))? {
        rows.push(r);
    }
    println!(
        "store: {}",
        url.as_deref().unwrap_or("sqlite (fresh file per scenario)")
    );
    println!(
        "| {:<47} | {:>6} | {:>8} | {:>10} | {:>13} |",
        "scenario", "ops", "seconds", "ops/s", "writes per op"
    );
    println!(
        "|{:-<49}|{:->8}|{:->10}|{:->12}|{:->15}|",
        "", "", "", "", ""
    );
    for r in rows {
        let w = r.writes.map_or("-".to_string(), |w| {
            format!("{:.2}", w as f64 / r.ops as f64)
        });
        println!(
            "| {:<47} | {:>6} | {:>8.2} | {:>10.0} | {:>13} |",
            r.scenario,
            r.ops,
            r.secs,
            r.ops as f64 / r.secs,
            w
        );
    }
    Ok(())
}
