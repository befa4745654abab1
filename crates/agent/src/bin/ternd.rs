//! ternd: the tern node agent.

use clap::Parser;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use tern_agent::{Agent, AgentConfig};

/// The tern node agent: serves the CNI plugins, owns pod interfaces, routes and addresses.
#[derive(Parser, Debug)]
#[command(name = "ternd", version)]
struct Args {
    /// This node's name.
    #[arg(long, env = "TERN_NODE_NAME")]
    node_name: String,
    /// Datastore URL: sqlite:///path/to/file.db or etcd://host:port[,host:port].
    #[arg(long, env = "TERN_STORE")]
    store: String,
    /// Unix socket the CNI plugins connect to.
    #[arg(long, env = "TERN_SOCKET", default_value = tern_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Node-local state directory (release journal).
    #[arg(long, env = "TERN_STATE_DIR", default_value = tern_api::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// CIDR of the IPv4 pool created when no pool exists.
    #[arg(long, env = "TERN_DEFAULT_IPV4_POOL", default_value = tern_model::defaults::IPV4_POOL)]
    default_ipv4_pool: String,
    /// Create no IPv4 pool when none exists (an IPv6-only cluster).
    #[arg(long, env = "TERN_NO_DEFAULT_IPV4_POOL")]
    no_default_ipv4_pool: bool,
    /// CIDR of the IPv6 pool created when no IPv6 pool exists (default: none is created).
    #[arg(long, env = "TERN_DEFAULT_IPV6_POOL")]
    default_ipv6_pool: Option<String>,
    /// Prefix of host-side veth names.
    #[arg(long, env = "TERN_INTERFACE_PREFIX", default_value = "tern")]
    interface_prefix: String,
    /// Pod MTU (0: the default route interface's MTU).
    #[arg(long, env = "TERN_MTU", default_value_t = 0)]
    mtu: u32,
    /// Seconds between reconciliation passes.
    #[arg(long, env = "TERN_RESYNC_SECONDS", default_value_t = 30)]
    resync_seconds: u64,
    /// Seconds an allocation must look leaked before leak repair releases it.
    #[arg(long, env = "TERN_LEAK_GRACE_SECONDS", default_value_t = 60)]
    leak_grace_seconds: u64,
    /// Address of the Prometheus `/metrics` listener (`0` disables).
    #[arg(long, env = "TERN_METRICS_ADDR", default_value = "127.0.0.1:9091")]
    metrics_addr: String,
    /// Address of the `/liveness` and `/readiness` listener (`0` disables).
    #[arg(long, env = "TERN_HEALTH_ADDR", default_value = "127.0.0.1:9099")]
    health_addr: String,
    /// CA certificate for an etcd store over TLS.
    #[arg(long, env = "TERN_ETCD_CA", value_parser = path_or_empty)]
    etcd_ca: Option<PathBuf>,
    /// Client certificate for an etcd store over TLS.
    #[arg(long, env = "TERN_ETCD_CERT", value_parser = path_or_empty)]
    etcd_cert: Option<PathBuf>,
    /// Client key for an etcd store over TLS.
    #[arg(long, env = "TERN_ETCD_KEY", value_parser = path_or_empty)]
    etcd_key: Option<PathBuf>,
    /// This node's underlay address (must be on a local interface), or one of each family
    /// separated by a comma (`198.18.0.11,2001:db8::11`: a dual-stack node, as the downward
    /// API's `status.hostIPs` gives them); default: the addresses of the interfaces carrying
    /// the default routes.
    #[arg(long, env = "TERN_NODE_IP", value_parser = node_ips)]
    node_ip: Option<NodeIps>,
    /// Disable the dataplane reconciler (routes to other nodes, VXLAN/IPIP, natOutgoing).
    #[arg(long, env = "TERN_NO_DATAPLANE")]
    no_dataplane: bool,
    /// Run the BGP speaker: peer with the other nodes (and BGPPeers), advertise this node's
    /// blocks and route other nodes' blocks of unencapsulated pools over BGP.
    #[arg(long, env = "TERN_BGP")]
    bgp: bool,
    /// Route each node's Kubernetes podCIDRs (tern Node spec.podCIDRs) to it like a block
    /// affine to it (the IPPool covering a podCIDR decides the encapsulation; none: direct),
    /// and with --bgp advertise this node's: for a delegated host-local with
    /// `ipam.subnet: usePodCidr`. Set it on every node or on none.
    #[arg(long, env = "TERN_USE_POD_CIDR")]
    use_pod_cidr: bool,
    /// Read pods, namespaces and NetworkPolicies from the Kubernetes API server (kubeconfig
    /// from --kubeconfig, KUBECONFIG or the in-cluster service account).
    #[arg(long, env = "TERN_KUBERNETES")]
    kubernetes: bool,
    /// Kubeconfig of the Kubernetes API server; implies --kubernetes. (With --kubernetes
    /// alone, KUBECONFIG, ~/.kube/config or the in-cluster service account are used.)
    #[arg(long, env = "TERN_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Seconds a Kubernetes Node must stay deleted before one elected agent (Lease
    /// kube-system/tern-node-gc) releases its blocks, addresses, endpoints and tern Node.
    #[arg(long, env = "TERN_NODE_GC_GRACE", default_value_t = 60)]
    node_gc_grace: u64,
    /// Group allowed to use the agent socket besides root (name or gid). The socket is created
    /// mode 0660 owned by root and this group, whatever the umask.
    #[arg(long, env = "TERN_SOCKET_GROUP", default_value = "0")]
    socket_group: String,
    /// Requests served at once on the agent socket; more are answered "busy" (code 11).
    #[arg(long, env = "TERN_MAX_CONNECTIONS", default_value_t = tern_agent::server::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Start even though the store is empty, lacks the cluster ID or holds another cluster's
    /// while this node has pods: the pod interfaces the store does not know are then deleted.
    #[arg(long, env = "TERN_ACCEPT_NEW_STORE")]
    accept_new_store: bool,
    /// Only check the sysctls tern needs (net.ipv4.ip_forward, ...) and report them in
    /// /readiness; do not set them.
    #[arg(long, env = "TERN_NO_SET_SYSCTLS")]
    no_set_sysctls: bool,
    /// NFLOG group of the flow records: the policy rules log each connection's first packet
    /// there and ternd keeps a record of it (`ternctl flows`); 0 turns records off (the
    /// policy table then has no log statements).
    #[arg(long, env = "TERN_FLOW_LOG_GROUP", default_value_t = tern_agent::config::DEFAULT_FLOW_LOG_GROUP)]
    flow_log_group: u16,
    /// Flow records kept (the oldest go first).
    #[arg(long, env = "TERN_FLOW_RING", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    flow_ring: u32,
    /// Flow records made per second at most; beyond it they are counted as dropped.
    #[arg(long, env = "TERN_FLOW_RATE", default_value_t = 5_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    flow_rate: u32,
    /// Minutes of per-minute flow aggregates kept (`ternctl flows --aggregate`).
    #[arg(long, env = "TERN_FLOW_MINUTES", default_value_t = 15,
          value_parser = clap::value_parser!(u32).range(1..=60))]
    flow_minutes: u32,
    /// Distinct aggregate keys counted each minute; more are counted as not itemized.
    #[arg(long, env = "TERN_FLOW_KEYS_PER_MINUTE", default_value_t = 1_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    flow_keys_per_minute: u32,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, env = "TERN_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

/// `--node-ip`: one address, or one of each family (an empty value: not given).
#[derive(Debug, Clone, Default)]
struct NodeIps(Vec<std::net::IpAddr>);

/// Parses `--node-ip`: at most two addresses separated by commas, of different families.
fn node_ips(s: &str) -> Result<NodeIps, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(NodeIps::default());
    }
    let ips = s
        .split(',')
        .map(|a| {
            a.trim()
                .parse::<std::net::IpAddr>()
                .map_err(|e| format!("{a:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips[..] {
        [_] => Ok(NodeIps(ips)),
        [a, b] if a.is_ipv4() != b.is_ipv4() => Ok(NodeIps(ips)),
        [_, _] => Err("two addresses must be one IPv4 and one IPv6".into()),
        _ => Err(format!(
            "{} addresses: expected one, or one IPv4 and one IPv6",
            ips.len()
        )),
    }
}

/// A path that may be empty (`TERN_ETCD_CA=""`: not given, see `main`); clap's own path
/// parser would refuse it.
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// glibc's malloc arenas ternd keeps at most, unless `MALLOC_ARENA_MAX` says otherwise. By
/// default glibc gives each of up to 8 x cores threads an arena of its own; ternd runs a
/// thread per CNI request besides its watchers, and the memory those arenas hold once (a
/// relist of 10,000 Pods, a burst of ADDs) stays in the RSS: at 1,000 nodes that was about
/// twice the RSS of two arenas (docs/benchmarks.md, the scale benchmark).
const MALLOC_ARENAS: i32 = 2;

/// Allocations from this size on get a mapping of their own (glibc's default, held fixed).
const MMAP_THRESHOLD: i32 = 128 * 1024;

fn main() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a tunable of glibc's allocator; it is called before
        // ternd starts any other thread, and M_ARENA_MAX takes any positive value.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        // SAFETY: as above. A fixed threshold keeps glibc from raising it (up to 32 MiB)
        // after the first large buffer is freed, so the large transient buffers of a
        // resync (a list of every endpoint) stay whole mappings, unmapped when freed,
        // instead of fragmenting the heap.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
    let args = Args::parse();
    tern_agent::logger::init(&args.log_level);
    let mut cfg = AgentConfig::new(&args.node_name, &args.store, args.socket);
    cfg.state_dir = args.state_dir;
    cfg.default_ipv4_pool = if args.no_default_ipv4_pool {
        String::new()
    } else {
        args.default_ipv4_pool
    };
    cfg.default_ipv6_pool = args.default_ipv6_pool.filter(|c| !c.is_empty());
    if let Err(e) = tern_linux::validate_interface_prefix(&args.interface_prefix) {
        eprintln!("ternd: --interface-prefix (TERN_INTERFACE_PREFIX): {e}");
        std::process::exit(2);
    }
    cfg.interface_prefix = args.interface_prefix;
    cfg.mtu = args.mtu;
    cfg.resync_seconds = args.resync_seconds;
    cfg.leak_grace_seconds = args.leak_grace_seconds;
    cfg.metrics_addr = args.metrics_addr;
    cfg.health_addr = args.health_addr;
    // Empty (the manifest's ConfigMap without TLS sets TERN_ETCD_CA=""): not given.
    let non_empty = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
    cfg.etcd_ca = non_empty(args.etcd_ca);
    cfg.etcd_cert = non_empty(args.etcd_cert);
    cfg.etcd_key = non_empty(args.etcd_key);
    let node_ips = args.node_ip.unwrap_or_default().0;
    cfg.node_ip = node_ips.first().copied();
    cfg.node_ip6 = node_ips.get(1).copied();
    cfg.dataplane = !args.no_dataplane;
    cfg.bgp = args.bgp;
    cfg.use_pod_cidr = args.use_pod_cidr;
    cfg.accept_new_store = args.accept_new_store;
    cfg.set_sysctls = !args.no_set_sysctls;
    cfg.flows = (args.flow_log_group != 0).then(|| tern_agent::config::FlowsConfig {
        ring: args.flow_ring as usize,
        rate: args.flow_rate,
        minutes: args.flow_minutes as usize,
        keys_per_minute: args.flow_keys_per_minute as usize,
        ..tern_agent::config::FlowsConfig::new(args.flow_log_group)
    });
    cfg.socket_group = match tern_agent::config::resolve_group(&args.socket_group) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("ternd: {e}");
            std::process::exit(2);
        }
    };
    cfg.max_connections = args.max_connections.max(1);
    cfg.kubernetes = args.kubernetes || args.kubeconfig.is_some();
    cfg.kubeconfig = args.kubeconfig;
    cfg.node_gc_grace_seconds = args.node_gc_grace;
    // SIGTERM / SIGINT: blocked here, before any thread exists, so every thread inherits the
    // mask and only the dedicated thread below receives them (through sigwait).
    let agent_cell: Arc<OnceLock<Arc<Agent>>> = Arc::new(OnceLock::new());
    if let Err(e) = handle_termination(agent_cell.clone()) {
        log::warn!("no graceful shutdown on SIGTERM: {e}");
    }
    // An unreachable datastore at start is waited for, not fatal: until the agent serves, the
    // plugins treat it as down (DEL journals, ADD answers "try again later").
    let agent = loop {
        match Agent::start(cfg.clone()) {
            Ok(a) => break a,
            Err(e) if store_unavailable(&e) => {
                log::warn!("waiting for the datastore: {e:#}");
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
            Err(e) => {
                eprintln!("ternd: {e:#}");
                std::process::exit(1);
            }
        }
    };
    let _ = agent_cell.set(agent.clone());
    if let Err(e) = agent.serve() {
        eprintln!("ternd: {e:#}");
        std::process::exit(1);
    }
}

fn store_unavailable(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<tern_store::StoreError>(),
            Some(tern_store::StoreError::Unavailable(_) | tern_store::StoreError::Ambiguous(_))
        )
    })
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread started later) and
/// starts a thread that waits for them with `sigwait`. On a signal the agent shuts down
/// gracefully ([`Agent::shutdown`]: BGP sessions close without NOTIFICATION so the peers keep
/// this node's routes during the restart) and the process exits with status 0.
fn handle_termination(agent: Arc<OnceLock<Arc<Agent>>>) -> std::io::Result<()> {
    tern_linux::signals::on_termination(move |sig| match sig {
        Ok(sig) => {
            log::info!("signal {sig} received: shutting down");
            if let Some(a) = agent.get() {
                a.shutdown();
            }
            std::process::exit(0);
        }
        Err(e) => log::warn!("sigwait failed: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::node_ips;

    #[test]
    fn node_ip_takes_one_address_or_one_of_each_family() {
        assert!(node_ips("").unwrap().0.is_empty());
        assert_eq!(node_ips("198.18.0.11").unwrap().0.len(), 1);
        let both = node_ips("198.18.0.11, 2001:db8::11").unwrap().0;
        assert_eq!(both[1], "2001:db8::11".parse::<std::net::IpAddr>().unwrap());
        assert!(
            node_ips("198.18.0.11,198.18.0.12")
                .unwrap_err()
                .contains("one IPv4")
        );
        assert!(node_ips("a,b,c").is_err());
        let three = node_ips("198.18.0.11,2001:db8::11,198.18.0.12").unwrap_err();
        assert!(three.contains("3 addresses"), "{three}");
    }
}
