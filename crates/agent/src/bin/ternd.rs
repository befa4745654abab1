//! ternd: the tern node agent.

use clap::Parser;
use std::path::PathBuf;
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
    #[arg(long, env = "TERN_DEFAULT_IPV4_POOL", default_value = "10.244.0.0/16")]
    default_ipv4_pool: String,
    /// Prefix of host-side veth names.
    #[arg(long, env = "TERN_INTERFACE_PREFIX", default_value = "tern")]
    interface_prefix: String,
    /// Pod MTU (0: the default route interface's MTU).
    #[arg(long, env = "TERN_MTU", default_value_t = 0)]
    mtu: u32,
    /// Seconds between reconciliation passes.
    #[arg(long, env = "TERN_RESYNC_SECONDS", default_value_t = 30)]
    resync_seconds: u64,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long, env = "TERN_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

fn main() {
    let args = Args::parse();
    tern_agent::logger::init(&args.log_level);
    let mut cfg = AgentConfig::new(&args.node_name, &args.store, args.socket);
    cfg.state_dir = args.state_dir;
    cfg.default_ipv4_pool = args.default_ipv4_pool;
    cfg.interface_prefix = args.interface_prefix;
    cfg.mtu = args.mtu;
    cfg.resync_seconds = args.resync_seconds;
    let run = || -> anyhow::Result<()> {
        let agent = Agent::start(cfg)?;
        agent.serve()
    };
    if let Err(e) = run() {
        eprintln!("ternd: {e:#}");
        std::process::exit(1);
    }
}
