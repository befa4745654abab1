//! IPAM allocation rate: allocations per second for one node and for four contending nodes
//! (threads, each with its own store connection), store writes per allocation (counted by a
//! store decorator), store requests per allocation (every `Store` call; on etcd each one is
//! exactly one HTTP round trip), and the reference `host-local` plugin's ADD+DEL rate in the
//! same run.
//!
//! ```text
//! cargo run --release -p tern-ipam --example alloc_bench -- [--n 2000] [--store sqlite|etcd|URL]
//! ```
//!
//! - no `--store` or `--store sqlite`: each scenario uses a fresh SQLite file in a temporary
//!   directory;
//! - `--store etcd`: each scenario starts its own throw-away etcd on loopback
//!   (`tern_store::etcd::harness::EtcdServer`: `$TERN_ETCD_BIN` or `etcd` on `PATH`), killed
//!   and removed when the scenario ends;
//! - `--store etcd://host:port[,...]`: an existing cluster; each scenario writes under its own
//!   key prefix (`/alloc-bench/<pid>/<nodes>`) so runs do not see each other's blocks;
//! - any other URL is opened with `tern_store::open` and shared by the scenarios.
//!
//! `host-local` is only executed (with a temporary `dataDir`); nothing under /var/lib/cni
//! is touched.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_model::{IpPool, IpPoolSpec, IpamConfigSpec, put_resource};
use tern_store::{Compare, KeyValue, Op, Store, Txn, TxnResponse, Watch};

/// Store calls made by the nodes of one scenario, shared by their [`Counting`] decorators.
#[derive(Default)]
struct Counters {
    /// Transactions that write (have any operation): round trips that change or may change
    /// the datastore.
    writes: AtomicU64,
    /// Every store call (get, range, txn, revision, ...): on etcd each is one HTTP request.
    requests: AtomicU64,
    gets: AtomicU64,
    ranges: AtomicU64,
    txns: AtomicU64,
    /// Nanoseconds spent waiting in gets, ranges and txns (summed over the nodes' threads):
    /// where an allocation's time goes.
    get_ns: AtomicU64,
    range_ns: AtomicU64,
    txn_ns: AtomicU64,
}

/// Per-operation figures of one phase, taken from [`Counters`].
#[derive(Clone, Copy)]
struct Counted {
    writes: u64,
    requests: u64,
    gets: u64,
    ranges: u64,
    txns: u64,
    get_ns: u64,
    range_ns: u64,
    txn_ns: u64,
}

impl Counters {
    /// Returns the counts so far and starts again from zero.
    fn take(&self) -> Counted {
        Counted {
            writes: self.writes.swap(0, Ordering::Relaxed),
            requests: self.requests.swap(0, Ordering::Relaxed),
            gets: self.gets.swap(0, Ordering::Relaxed),
            ranges: self.ranges.swap(0, Ordering::Relaxed),
            txns: self.txns.swap(0, Ordering::Relaxed),
            get_ns: self.get_ns.swap(0, Ordering::Relaxed),
            range_ns: self.range_ns.swap(0, Ordering::Relaxed),
            txn_ns: self.txn_ns.swap(0, Ordering::Relaxed),
        }
    }
}

/// Counts the store calls of one node (see [`Counters`]).
struct Counting {
    inner: Arc<dyn Store>,
    c: Arc<Counters>,
}

impl Counting {
    /// Counts one call in `which`, and its duration in `ns`.
    fn timed<T>(&self, which: &AtomicU64, ns: &AtomicU64, f: impl FnOnce() -> T) -> T {
        which.fetch_add(1, Ordering::Relaxed);
        self.c.requests.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let out = f();
        ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl Store for Counting {
    fn get(&self, key: &str) -> tern_store::Result<Option<KeyValue>> {
        self.timed(&self.c.gets, &self.c.get_ns, || self.inner.get(key))
    }
    fn range(&self, prefix: &str) -> tern_store::Result<(Vec<KeyValue>, i64)> {
        self.timed(&self.c.ranges, &self.c.range_ns, || {
            self.inner.range(prefix)
        })
    }
    fn txn(&self, txn: Txn) -> tern_store::Result<TxnResponse> {
        if !txn.success.is_empty() || !txn.failure.is_empty() {
            self.c.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.timed(&self.c.txns, &self.c.txn_ns, || self.inner.txn(txn))
    }
    fn revision(&self) -> tern_store::Result<i64> {
        self.c.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.revision()
    }
    fn watch(&self, prefix: &str, after: i64) -> tern_store::Result<Box<dyn Watch>> {
        self.c.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.watch(prefix, after)
    }
    fn lease_grant(&self, ttl: Duration) -> tern_store::Result<i64> {
        self.c.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.lease_grant(ttl)
    }
    fn lease_keepalive(&self, lease: i64) -> tern_store::Result<()> {
        self.c.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.lease_keepalive(lease)
    }
    fn lease_revoke(&self, lease: i64) -> tern_store::Result<()> {
        self.c.requests.fetch_add(1, Ordering::Relaxed);
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
    counted: Option<Counted>,
}

/// The floor under an allocation: `n` single-key reads, then `n` compare-and-swap writes of a
/// small value (one store request each), on one connection. An allocation's time divided by
/// these tells whether the store's round trips or tern's own work dominate.
fn baseline(open: &dyn Fn() -> Arc<dyn Store>, n: usize) -> anyhow::Result<Vec<Row>> {
    let counters = Arc::new(Counters::default());
    let store = Counting {
        inner: open(),
        c: counters.clone(),
    };
    let key = "/tern/bench/baseline";
    store.txn(Txn {
        compare: vec![],
        success: vec![Op::put(key, b"0".to_vec())],
        failure: vec![],
    })?;
    counters.take();
    let start = Instant::now();
    for _ in 0..n {
        store.get(key)?;
    }
    let get_secs = start.elapsed().as_secs_f64();
    let gets = counters.take();
    let start = Instant::now();
    for i in 0..n {
        let rev = store.get(key)?.map_or(0, |kv| kv.mod_revision);
        let ok = store
            .txn(Txn {
                compare: vec![Compare::ModRevision(key.into(), rev)],
                success: vec![Op::put(key, i.to_string().into_bytes())],
                failure: vec![],
            })?
            .succeeded;
        anyhow::ensure!(ok, "uncontended compare-and-swap failed");
    }
    let cas_secs = start.elapsed().as_secs_f64();
    let cas = counters.take();
    Ok(vec![
        Row {
            scenario: "store get, 1 key (floor)".into(),
            ops: n as u64,
            secs: get_secs,
            counted: Some(gets),
        },
        Row {
            scenario: "store get + CAS put, 1 key (floor)".into(),
            ops: n as u64,
            secs: cas_secs,
            counted: Some(cas),
        },
    ])
}

/// One scenario: `nodes` threads allocate `per_node` addresses each, then release them.
/// One node also measures the store's floor ([`baseline`]) on the same store afterwards.
fn scenario(
    open: &dyn Fn() -> Arc<dyn Store>,
    nodes: usize,
    per_node: usize,
) -> anyhow::Result<Vec<Row>> {
    let setup = open();
    let mut spec = IpPoolSpec::new("10.200.0.0/16");
    spec.block_size = 26;
    put_resource(&*setup, &IpPool::new("bench", spec).into())?;
    Ipam::new(setup).put_config(&IpamConfigSpec {
        max_blocks_per_host: 0,
        ..IpamConfigSpec::default()
    })?;
    let counters = Arc::new(Counters::default());
    let ipams: Vec<Ipam> = (0..nodes)
        .map(|_| {
            Ipam::new(Arc::new(Counting {
                inner: open(),
                c: counters.clone(),
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
    let alloc_counted = counters.take();
    let release_secs = run(true)?;
    let release_counted = counters.take();
    let label = if nodes == 1 {
        "1 node".to_string()
    } else {
        format!("{nodes} contending nodes")
    };
    let mut rows = vec![
        Row {
            scenario: format!("tern-ipam allocate, {label}"),
            ops: total,
            secs: alloc_secs,
            counted: Some(alloc_counted),
        },
        Row {
            scenario: format!("tern-ipam release by handle, {label}"),
            ops: total,
            secs: release_secs,
            counted: Some(release_counted),
        },
    ];
    if nodes == 1 {
        rows.extend(baseline(open, per_node.min(1000))?);
    }
    Ok(rows)
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
        counted: None,
    }))
}

/// Where the scenarios' stores come from.
enum Backend {
    /// A fresh SQLite file per scenario.
    Sqlite,
    /// A fresh throw-away etcd per scenario.
    EtcdHarness,
    /// An existing etcd cluster, one key prefix per scenario.
    EtcdUrl(String),
    /// Any other store URL, shared by the scenarios.
    Url(String),
}

impl Backend {
    fn parse(arg: Option<&str>) -> Backend {
        match arg {
            None | Some("sqlite") => Backend::Sqlite,
            Some("etcd") => Backend::EtcdHarness,
            Some(u) if u.starts_with("etcd://") => Backend::EtcdUrl(u.to_string()),
            Some(u) => Backend::Url(u.to_string()),
        }
    }

    fn describe(&self) -> String {
        match self {
            Backend::Sqlite => "sqlite (fresh file per scenario)".into(),
            Backend::EtcdHarness => format!(
                "etcd (fresh single-member {} on loopback per scenario)",
                etcd_version()
            ),
            Backend::EtcdUrl(u) => format!("{u} (key prefix /alloc-bench/<pid>/<nodes>)"),
            Backend::Url(u) => u.clone(),
        }
    }
}

/// `etcd --version`'s first line, for the report.
fn etcd_version() -> String {
    Command::new(tern_store::etcd::harness::etcd_binary())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "etcd".into())
}

/// One scenario (`nodes` contending nodes) on a store of `backend`.
fn run_scenario(backend: &Backend, nodes: usize, per_node: usize) -> anyhow::Result<Vec<Row>> {
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir()?;
            let path = dir.path().join("bench.db");
            let open = move || -> Arc<dyn Store> {
                Arc::new(tern_store::sqlite::SqliteStore::open(&path).expect("open sqlite"))
            };
            scenario(&open, nodes, per_node)
        }
        Backend::EtcdHarness => {
            // Dropped at the end of this arm: etcd is killed by PID and its directory removed.
            let server = tern_store::etcd::harness::EtcdServer::start()
                .map_err(|e| anyhow::anyhow!("starting a throw-away etcd: {e}"))?;
            let url = server.url();
            let open = move || -> Arc<dyn Store> { tern_store::open(&url).expect("open etcd") };
            scenario(&open, nodes, per_node)
        }
        Backend::EtcdUrl(url) => {
            let endpoints = tern_store::etcd::parse_url(url)?;
            let prefix = format!("/alloc-bench/{}/{nodes}", std::process::id());
            let open = move || -> Arc<dyn Store> {
                let store = tern_store::etcd::EtcdStore::connect(
                    &endpoints,
                    None,
                    tern_store::etcd::Timeouts::default(),
                )
                .expect("connect to etcd");
                Arc::new(store.with_namespace(&prefix))
            };
            scenario(&open, nodes, per_node)
        }
        Backend::Url(url) => {
            let url = url.clone();
            let open = move || -> Arc<dyn Store> { tern_store::open(&url).expect("open store") };
            scenario(&open, nodes, per_node)
        }
    }
}

fn main() -> anyhow::Result<()> {
    let mut n = 2000usize;
    let mut store: Option<String> = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--n" => {
                n = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--n needs a value"))?
                    .parse()?
            }
            "--store" => {
                store = Some(
                    it.next()
                        .ok_or_else(|| anyhow::anyhow!("--store needs a value"))?,
                )
            }
            "-h" | "--help" => {
                println!("alloc_bench [--n N] [--store sqlite|etcd|etcd://host:port|URL]");
                return Ok(());
            }
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let backend = Backend::parse(store.as_deref());
    let mut rows = Vec::new();
    for nodes in [1usize, 4] {
        rows.extend(run_scenario(&backend, nodes, n / nodes)?);
    }
    if let Some(r) = host_local((n / 10).max(20))? {
        rows.push(r);
    }
    println!("store: {}", backend.describe());
    println!(
        "| {:<47} | {:>6} | {:>8} | {:>10} | {:>13} | {:>15} | {:>20} | {:>26} |",
        "scenario",
        "ops",
        "seconds",
        "ops/s",
        "writes per op",
        "requests per op",
        "get/range/txn per op",
        "ms in get/range/txn per op"
    );
    println!(
        "|{:-<49}|{:->8}|{:->10}|{:->12}|{:->15}|{:->17}|{:->22}|{:->28}|",
        "", "", "", "", "", "", "", ""
    );
    for r in rows {
        let per = |x: u64| format!("{:.2}", x as f64 / r.ops as f64);
        let ms = |ns: u64| format!("{:.2}", ns as f64 / 1e6 / r.ops as f64);
        let (w, q, split, time) = match r.counted {
            Some(c) => (
                per(c.writes),
                per(c.requests),
                format!("{}/{}/{}", per(c.gets), per(c.ranges), per(c.txns)),
                format!("{}/{}/{}", ms(c.get_ns), ms(c.range_ns), ms(c.txn_ns)),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {:<47} | {:>6} | {:>8.2} | {:>10.0} | {:>13} | {:>15} | {:>20} | {:>26} |",
            r.scenario,
            r.ops,
            r.secs,
            r.ops as f64 / r.secs,
            w,
            q,
            split,
            time
        );
    }
    Ok(())
}
