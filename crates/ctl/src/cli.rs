//! The command line of `ternctl` (clap). Dispatch lives in [`crate::run`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
pub use tern_lab::{Encap, IpFamily, StoreKind};

/// ternctl: manage tern resources, IPAM, CNI installation and throwaway labs.
#[derive(Debug, Parser)]
#[command(name = "ternctl", version, about)]
pub struct Cli {
    /// Datastore URL (sqlite:///abs/path.db, etcd://host:port, kubernetes: the API server of
    /// $KUBECONFIG or the pod's service account, kubernetes:///path/to/kubeconfig).
    #[arg(long, global = true, env = "TERN_STORE")]
    pub store: Option<String>,
    /// CA certificate for an etcd store over TLS.
    #[arg(long, global = true, env = "TERN_ETCD_CA", value_parser = path_or_empty)]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate for an etcd store over TLS.
    #[arg(long, global = true, env = "TERN_ETCD_CERT", value_parser = path_or_empty)]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for an etcd store over TLS.
    #[arg(long, global = true, env = "TERN_ETCD_KEY", value_parser = path_or_empty)]
    pub etcd_key: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// A path that may be empty: `TERN_ETCD_CA=""` (the manifest's ConfigMap without TLS) means
/// not given, which [`crate::run`] applies; clap's own path parser would refuse it.
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update resources from a file (YAML or JSON, several documents).
    Apply {
        /// File to read, `-` for stdin.
        #[arg(short = 'f', long = "filename")]
        file: String,
    },
    /// Show resources.
    Get {
        /// Kind: ippool(s), workloadendpoint(s)/wep, ipamconfig, node(s).
        kind: String,
        /// Name of one resource; all when absent.
        name: Option<String>,
        /// Namespace (namespaced kinds); all namespaces when absent.
        #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace (the default without `-n`; accepted as calicoctl and kubectl
        /// users type it).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Delete a resource (`KIND NAME`), or every resource a file names (`-f FILE`).
    Delete {
        /// Kind (as for `get`).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        kind: Option<String>,
        /// Name of the resource.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        name: Option<String>,
        /// Namespace (namespaced kinds; default `default`).
        #[arg(short = 'n', long, conflicts_with = "file")]
        namespace: Option<String>,
        /// Delete the resources named by the documents of this file (`-` for stdin), as
        /// `apply -f` reads it.
        #[arg(short = 'f', long = "filename")]
        file: Option<String>,
        /// With `-f`: resources that do not exist are not an error (calicoctl's
        /// `--skip-not-exists`, kubectl's `--ignore-not-found`).
        #[arg(long, visible_alias = "ignore-not-found", requires = "file")]
        skip_not_exists: bool,
    },
    /// Set (`key=value`) or remove (`key-`) labels of a workloadendpoint or namespace.
    #[command(
        // mut_arg moves an argument to the end: every positional is named, in order.
        mut_arg("kind", |a| a.help("Kind: workloadendpoint (wep) or namespace")),
        mut_arg("name", |a| a),
        mut_arg("changes", |a| a.help("Changes: `key=value` sets, `key-` removes")),
        mut_arg("namespace", |a| {
            a.help("Namespace of a workloadendpoint (default `default`)")
        })
    )]
    Label(Changes),
    /// Set (`name=port[/protocol]`) or remove (`name-`) named ports of a workloadendpoint.
    #[command(
        mut_arg("kind", |a| a.help("Kind: workloadendpoint (wep)")),
        mut_arg("name", |a| a),
        mut_arg("changes", |a| {
            a.help(
                "Changes: `http=8080/TCP` sets (protocol TCP, UDP or SCTP; TCP when absent), \
                 `http-` removes",
            )
        }),
        mut_arg("namespace", |a| {
            a.help("Namespace of the workloadendpoint (default `default`)")
        })
    )]
    Port(Changes),
    /// Which policy and which rule decide a connection, from live state (`--from NS/POD --to
    /// NS/POD --port 8080/TCP`).
    Explain(ExplainArgs),
    /// Policies (`policy promote`: a staged policy becomes its enforced kind).
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Recent connections with their verdict and its cause (policy and rule), from every
    /// node's agent (flow records).
    Flows(FlowsArgs),
    /// IP address management.
    Ipam {
        #[command(subcommand)]
        command: IpamCommand,
    },
    /// Install the tern CNI binaries and network configuration on this host.
    InstallCni(InstallCniArgs),
    /// Render installation files (`install manifest`: the Kubernetes manifest).
    Install {
        #[command(subcommand)]
        command: InstallCommand,
    },
    /// Throwaway clusters in network namespaces.
    Lab(LabArgs),
    /// This node.
    Node {
        #[command(subcommand)]
        command: NodeStatusCommand,
    },
    /// The datastore itself (`datastore migrate`).
    Datastore {
        #[command(subcommand)]
        command: DatastoreCommand,
    },
}

/// `explain`: a connection to judge.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The client: NAMESPACE/POD (POD alone: namespace `default`) or an IP address.
    #[arg(long)]
    pub from: String,
    /// The server: NAMESPACE/POD or an IP address.
    #[arg(long)]
    pub to: String,
    /// The destination port and protocol: `8080/TCP`, `53/UDP`, `8080` (TCP), or `ICMP`
    /// (an echo request; ICMPv6 between IPv6 addresses).
    #[arg(long)]
    pub port: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = ExplainOutput::Table)]
    pub output: ExplainOutput,
    /// Read the state from this lab's datastore (`ternctl lab up --name NAME`) instead of
    /// `--store`; `--probe` implies the lab `lab` when not given.
    #[arg(long, value_name = "NAME")]
    pub lab: Option<String>,
    /// Also make a real connection from the source's network namespace on the lab (TCP
    /// connect, UDP exchange, SCTP association or ICMP echo) and print the kernel's verdict
    /// beside the computed one; exits 2 when they disagree.
    #[arg(long)]
    pub probe: bool,
    /// How long the probe waits for an answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub probe_timeout: f64,
}

/// `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Turn a staged policy into its enforced kind (`stagedAction: Set` writes it, `Delete`
    /// deletes the enforced policy of that name), then delete the staged policy. Running it
    /// again after an interruption finishes it.
    Promote {
        /// Name of the staged policy.
        name: String,
        /// Namespace (namespaced kinds; default `default`).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Kind: StagedNetworkPolicy (snp), StagedGlobalNetworkPolicy (sgnp) or
        /// StagedKubernetesNetworkPolicy (sknp); needed only when several have the name.
        #[arg(long)]
        kind: Option<String>,
    },
}

/// `flows`: which records, from which agents, how shown.
#[derive(Debug, Args)]
pub struct FlowsArgs {
    /// Either end in this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Either end this pod (NAMESPACE/POD or POD).
    #[arg(long)]
    pub pod: Option<String>,
    /// Either end's labels match (`app=web,tier!=db` or tern's `app == 'web'`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// allowed or denied.
    #[arg(long, value_enum)]
    pub verdict: Option<FlowVerdictArg>,
    /// ingress or egress (at the pod that decided).
    #[arg(long, value_enum)]
    pub direction: Option<FlowDirectionArg>,
    /// The destination port.
    #[arg(long)]
    pub port: Option<u16>,
    /// A policy named in the record: NAME, NAMESPACE/NAME or KIND/NAMESPACE/NAME.
    #[arg(long)]
    pub policy: Option<String>,
    /// Only records of the last DURATION (30s, 5m, 2h, 1d).
    #[arg(long)]
    pub since: Option<String>,
    /// Only the last N records (after the filters).
    #[arg(long)]
    pub last: Option<usize>,
    /// Keep printing new records as they come.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Print the per-minute counts each node keeps instead of records: MINUTE NODE DIR
    /// VERDICT FROM TO PORT POLICY COUNT, ends by namespace (filters: -n, --verdict,
    /// --direction, --port, --policy, --since).
    #[arg(long, conflicts_with_all = ["follow", "web", "last", "pod", "selector"])]
    pub aggregate: bool,
    /// With --aggregate: sum the counts over the nodes (NODE is `all`).
    #[arg(long, requires = "aggregate")]
    pub sum: bool,
    /// Output format: a table, or JSON lines (one record, or aggregate row, a line).
    #[arg(short = 'o', long, value_enum, default_value_t = ExplainOutput::Table)]
    pub output: ExplainOutput,
    /// An agent socket to ask (repeatable); default: every node of the lab (`--name`), or
    /// the local agent when there is no such lab.
    #[arg(long)]
    pub socket: Vec<PathBuf>,
    /// The lab whose nodes are asked.
    #[arg(long, default_value = "lab")]
    pub lab: String,
    /// Serve the records as a page at this loopback address (`127.0.0.1:8089`): a live table
    /// with these filters and a graph of workloads, edges coloured by verdict. It prints the
    /// address with its access token.
    #[arg(long, value_name = "ADDR")]
    pub web: Option<String>,
    /// Inside a tern-node pod: ask the local agent this flows request (JSON) and print its
    /// reply (how `ternctl flows` reaches each node through the API server).
    #[arg(long, value_name = "QUERY", hide = true)]
    pub agent_reply: Option<String>,
}

/// `--verdict`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FlowVerdictArg {
    Allowed,
    Denied,
}

/// `--direction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FlowDirectionArg {
    Ingress,
    Egress,
}

/// Output formats of `explain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExplainOutput {
    Table,
    Json,
}

/// `datastore` subcommands.
#[derive(Debug, Subcommand)]
pub enum DatastoreCommand {
    /// Copy every tern key (pools, policies, BGP resources, IPAM blocks and affinities, the
    /// cluster ID) from one datastore to another, e.g. `--from etcd://10.0.0.5:2379 --to
    /// kubernetes`. Stop the agents first (pods keep running and keep their addresses); point
    /// them at the new store after. Refuses a target that holds tern keys unless --force.
    /// The source is locked first (as `datastore lock`) and left locked, so no agent still
    /// using it allocates an address the copy does not have; the copy is unlocked.
    Migrate {
        /// The datastore to copy from (a store URL, as --store).
        #[arg(long)]
        from: String,
        /// The datastore to copy into.
        #[arg(long)]
        to: String,
        /// Print what would be copied and skipped; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Copy into a target that already holds tern keys (overwriting them).
        #[arg(long)]
        force: bool,
        /// Do not lock the source (only when nothing can use it any more).
        #[arg(long)]
        no_lock: bool,
    },
    /// Lock the datastore (`--store`) for a migration, as `calicoctl datastore migrate lock`:
    /// until unlocked no address is allocated or released there (a pod's ADD answers "try
    /// again later", a DEL is journaled by its node's agent and replayed later).
    Lock {
        /// Why, shown in every refusal.
        #[arg(long, default_value = "ternctl datastore lock")]
        reason: String,
    },
    /// Unlock the datastore (`--store`) locked by `datastore lock` or `datastore migrate`.
    Unlock,
}

/// `install` subcommands.
#[derive(Debug, Subcommand)]
pub enum InstallCommand {
    /// Print the Kubernetes manifest (ServiceAccount, RBAC, ConfigMap, the tern-node
    /// DaemonSet): `ternctl install manifest | kubectl apply -f -`. The datastore is the global
    /// `--store`: kubernetes (the default: the cluster's API server, tern's custom resources),
    /// etcd://host:port[,host:port], or sqlite:///var/lib/tern/FILE for a single-node cluster.
    Manifest(InstallManifestArgs),
    /// Print only tern's CustomResourceDefinitions (group tern.dev, the Kubernetes datastore's
    /// objects) and the admission policy that refuses overlapping IP pools; also in the
    /// manifest: `ternctl install crds | kubectl apply -f -`.
    Crds,
}

/// Arguments of `install manifest`.
#[derive(Debug, Clone, Args)]
pub struct InstallManifestArgs {
    /// Image of the DaemonSet's containers (built by scripts/k8s/tern-image.sh).
    #[arg(long, default_value = crate::commands::install_manifest::DEFAULT_IMAGE)]
    pub image: String,
    /// CIDR of the default IPv4 pool.
    #[arg(long, default_value = tern_model::defaults::IPV4_POOL)]
    pub pool: String,
    /// CIDR of the default IPv6 pool (/122 blocks): every pod gets an IPv6 address too, and
    /// ternd registers the node's addresses of both families (`status.hostIPs`).
    #[arg(long, value_name = "CIDR")]
    pub ipv6_pool: Option<String>,
    /// No IPv4 pool and no IPv4 pod addresses: an IPv6-only cluster (needs --ipv6-pool).
    #[arg(long, requires = "ipv6_pool")]
    pub no_ipv4_pool: bool,
    /// Encapsulation of the default pool between nodes.
    #[arg(long, value_enum, default_value_t = Encap::None)]
    pub encap: Encap,
    /// Run ternd's BGP speaker.
    #[arg(long)]
    pub bgp: bool,
    /// ternd's log level (or a filter: info,tern_agent::kube=debug).
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// The nodes' CNI bin directory (the container runtime's `bin_dir`).
    #[arg(long, default_value = crate::commands::install_manifest::DEFAULT_CNI_BIN_DIR)]
    pub cni_bin_dir: String,
    /// The nodes' CNI configuration directory (the container runtime's `conf_dir`).
    #[arg(long, default_value = crate::commands::install_manifest::DEFAULT_CNI_CONF_DIR)]
    pub cni_conf_dir: String,
}

/// `ternctl node ...`.
#[derive(Debug, Subcommand)]
pub enum NodeStatusCommand {
    /// The local agent's BGP sessions (IPv4, then IPv6), as `calicoctl node status`.
    Status {
        /// The agent's socket.
        #[arg(long, env = "TERN_SOCKET", default_value = tern_api::DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

/// Output formats of `get`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    /// A table with more columns (for nodes: tunnel addresses and MAC).
    Wide,
    Yaml,
    Json,
}

/// `ipam` subcommands.
#[derive(Debug, Subcommand)]
pub enum IpamCommand {
    /// Address usage per pool (and per block), one address, borrowed addresses or the IPAM
    /// configuration.
    Show {
        /// Also show one row per allocation block.
        #[arg(long)]
        show_blocks: bool,
        /// Show whether one address is allocated, and to what.
        #[arg(long, conflicts_with_all = ["show_blocks", "show_borrowed", "show_configuration"])]
        ip: Option<std::net::IpAddr>,
        /// List addresses allocated from blocks affine to another node, with block and owner.
        #[arg(long)]
        show_borrowed: bool,
        /// Show the IPAM configuration (StrictAffinity, MaxBlocksPerHost).
        #[arg(long)]
        show_configuration: bool,
    },
    /// Find addresses allocated but not in use, used but not allocated, and used twice.
    Check {
        /// Write the full report as JSON to this file (input of `release --from-report`).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
    },
    /// Release addresses: one (refused while an endpoint uses it) or the leaks of a report.
    Release {
        /// The address to release.
        #[arg(
            long,
            required_unless_present = "from_report",
            conflicts_with = "from_report"
        )]
        ip: Option<std::net::IpAddr>,
        /// Release the allocations a `check -o` report lists as not in use that are still not
        /// in use.
        #[arg(long)]
        from_report: Option<PathBuf>,
    },
    /// Change the IPAM configuration.
    Configure {
        /// Never borrow addresses from blocks affine to other nodes.
        #[arg(long = "strictaffinity", value_parser = clap::builder::BoolishValueParser::new())]
        strict_affinity: Option<bool>,
        /// Maximum blocks one node may claim (0 = unlimited).
        #[arg(long)]
        max_blocks_per_host: Option<u32>,
    },
}

/// Arguments of `install-cni`.
#[derive(Debug, Clone, Args)]
pub struct InstallCniArgs {
    /// Where CNI binaries go (e.g. /opt/cni/bin).
    #[arg(long)]
    pub bin_dir: PathBuf,
    /// Where the network configuration goes (e.g. /etc/cni/net.d).
    #[arg(long)]
    pub conf_dir: PathBuf,
    /// The agent's socket, written into the configuration.
    #[arg(long, default_value = tern_api::DEFAULT_SOCKET)]
    pub agent_socket: PathBuf,
    /// The agent's state directory, written into the configuration.
    #[arg(long, default_value = tern_api::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Network name.
    #[arg(long, default_value = "k8s-pod-network")]
    pub name: String,
    /// cniVersion of the configuration list.
    #[arg(long, default_value = "0.3.1")]
    pub cni_version: String,
    /// Pod MTU; 0 lets the agent choose.
    #[arg(long, default_value_t = 0)]
    pub mtu: u32,
    /// Give every pod an IPv6 address too (`"assign_ipv6": "true"` in the conflist: a
    /// dual-stack cluster, or with --no-assign-ipv4 an IPv6-only one).
    #[arg(long)]
    pub assign_ipv6: bool,
    /// Give pods no IPv4 address (`"assign_ipv4": "false"`; needs --assign-ipv6).
    #[arg(long, requires = "assign_ipv6")]
    pub no_assign_ipv4: bool,
    /// Directory to copy `tern` and `tern-ipam` from (default: ternctl's own directory).
    #[arg(long)]
    pub plugin_dir: Option<PathBuf>,
    /// Install the binaries only, no conflist (the DaemonSet's init container: the conflist
    /// is written once ternd is ready, by `--conflist-only --wait-ready`).
    #[arg(long, conflicts_with = "conflist_only")]
    pub skip_conflist: bool,
    /// Write the conflist only (the binaries are already installed).
    #[arg(long)]
    pub conflist_only: bool,
    /// Before writing anything, wait until this URL (ternd's `/readiness`, plain http://)
    /// answers 200.
    #[arg(long, value_name = "URL")]
    pub wait_ready: Option<String>,
    /// After installing, keep running until SIGTERM or SIGINT (a container beside ternd).
    #[arg(long)]
    pub stay: bool,
}

/// `lab` arguments.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// Lab name (lowercase letters and digits).
    #[arg(long, global = true, default_value = "lab")]
    pub name: String,
    /// Directory with tern, tern-ipam and ternd (default: ternctl's own directory).
    #[arg(long, global = true)]
    pub bin_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: LabCommand,
}

/// `lab` subcommands.
#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Build the lab and start the agents. The datastore is chosen with the global
    /// `--store sqlite|etcd|kubernetes` (default sqlite; etcd runs in a namespace of its own;
    /// with --kubernetes the default is kubernetes: tern's state in the lab's API server, no
    /// etcd of tern's and no host ternd at all).
    Up {
        /// Number of nodes.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Default IPv4 pool (CIDR) of the lab.
        #[arg(long)]
        default_ipv4_pool: Option<String>,
        /// Default IPv6 pool (CIDR) of the lab (with --ip-family ipv6 or dual; default
        /// fd00:10:244::/48, /122 blocks).
        #[arg(long)]
        default_ipv6_pool: Option<String>,
        /// Address families: of the underlay (198.18.0.0/15, 2001:db8::/32), the pools and
        /// the pods (dual: an address of each).
        #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
        ip_family: IpFamily,
        /// Encapsulation between nodes (crosssubnet: two subnets joined by a router, VXLAN
        /// only across them).
        #[arg(long, value_enum, default_value_t = Encap::None)]
        encap: Encap,
        /// Seconds between the agents' full resyncs.
        #[arg(long)]
        resync_seconds: Option<u64>,
        /// Run the agents with `--bgp`: routes between nodes are learned over BGP (full mesh
        /// unless a BGPConfiguration says otherwise).
        #[arg(long)]
        bgp: bool,
        /// Also run a real Kubernetes cluster on the lab (control plane in a namespace of its
        /// own; containerd, kubelet and kube-proxy on every node, tern as the CNI). Prints
        /// `export KUBECONFIG=...`.
        #[arg(long)]
        kubernetes: bool,
        /// Directory with the Kubernetes binaries (the last line of
        /// `scripts/k8s-components.sh`).
        #[arg(long, env = "TERN_K8S_BIN")]
        k8s_bin_dir: Option<PathBuf>,
        /// With --kubernetes: give the nodes the reference bridge + host-local network instead
        /// of tern (the baseline of the pod start-up benchmark; no routes between nodes).
        #[arg(long, requires = "kubernetes")]
        reference_cni: bool,
        /// With --kubernetes: run ternd on every node as the lab's host process (and the
        /// conflist written by the lab) instead of installing tern's DaemonSet manifest
        /// (the default, whose store is the Kubernetes API, or etcd with --store etcd); for
        /// debugging.
        #[arg(long, requires = "kubernetes")]
        host_ternd: bool,
        /// Serve the lab's etcd over TLS with client-certificate auth (--client-cert-auth): a
        /// CA, server and client certificates under the lab's directory, used by every ternd
        /// and, with --kubernetes, put into the manifest's Secret. Needs the etcd store.
        #[arg(long)]
        etcd_tls: bool,
    },
    /// Describe the lab.
    Status,
    /// Remove the lab (also after a failed `up`).
    Down,
    /// Build a lab, add pods, prove connectivity with real packets, tear down. With more than
    /// one node: cross-node traffic, each node's routes to the other nodes' blocks (over BGP
    /// or VXLAN), `ipam show --show-blocks`, `node status` and `get nodes -o wide`. With
    /// --kubernetes: the same on a real cluster (kubectl get nodes/pods, kubectl exec).
    Demo {
        /// Number of pods (spread over the nodes; with --kubernetes, the Deployment's replicas).
        #[arg(long, default_value_t = 6)]
        pods: usize,
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Encapsulation between nodes.
        #[arg(long, value_enum, default_value_t = Encap::None)]
        encap: Encap,
        /// Address families of the lab (see `lab up --ip-family`); the traffic is proven in
        /// each.
        #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
        ip_family: IpFamily,
        /// Run the agents with `--bgp` (the default with --encap none, several nodes and
        /// --ip-family ipv4).
        #[arg(long, conflicts_with = "no_bgp")]
        bgp: bool,
        /// Do not run BGP: with --encap none, ternd programs the routes from the store.
        #[arg(long)]
        no_bgp: bool,
        /// Run the demo on a real Kubernetes cluster built on the lab (see `lab up
        /// --kubernetes`).
        #[arg(long)]
        kubernetes: bool,
        /// Directory with the Kubernetes binaries (the last line of
        /// `scripts/k8s-components.sh`).
        #[arg(long, env = "TERN_K8S_BIN")]
        k8s_bin_dir: Option<PathBuf>,
    },
    /// Pods of the lab.
    Pod {
        #[command(subcommand)]
        command: PodCommand,
    },
    /// Nodes of the lab: join, leave, agent kill/restart.
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Show the routes of every node (or one), of each of the lab's families.
    Routes {
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
    },
    /// Echo server (run inside a pod namespace).
    Serve {
        /// TCP port to echo on.
        #[arg(long)]
        tcp: Option<u16>,
        /// UDP port to echo on.
        #[arg(long)]
        udp: Option<u16>,
        /// File created once listening.
        #[arg(long, hide = true)]
        ready_file: Option<PathBuf>,
    },
    /// Send a random token to an echo server and expect it back.
    Probe {
        /// TCP target IP:PORT.
        #[arg(long, conflicts_with = "udp", required_unless_present = "udp")]
        tcp: Option<std::net::SocketAddr>,
        /// UDP target IP:PORT.
        #[arg(long)]
        udp: Option<std::net::SocketAddr>,
        /// Give up after this many milliseconds.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Probe every --interval-ms for --duration-s and report the longest gap.
        #[arg(long)]
        continuous: bool,
        /// Interval of a continuous probe.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// Duration of a continuous probe.
        #[arg(long, default_value_t = 10)]
        duration_s: u64,
        /// Fail a continuous probe whose longest gap exceeds this many milliseconds.
        #[arg(long)]
        max_gap_ms: Option<u64>,
    },
    /// Relay 127.0.0.1:<port> to an address inside a lab namespace (the operator's kubectl
    /// path to a `--kubernetes` lab's API server; started by `lab up`).
    #[command(hide = true)]
    Relay {
        /// The lab namespace to connect in.
        #[arg(long)]
        netns: String,
        /// Target IP:PORT inside it.
        #[arg(long)]
        to: std::net::SocketAddr,
        /// File the chosen port is written to.
        #[arg(long)]
        ready_file: PathBuf,
    },
}

/// `lab node` subcommands.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Join a new node to the running lab.
    Add,
    /// Remove a node: its pods, its agent, its datastore records, its namespace.
    Del { node: String },
    /// Kill a node's ternd with SIGKILL (pods keep running).
    Kill { node: String },
    /// Start a node's ternd (after `kill`).
    Start { node: String },
    /// Kill and restart a node's ternd.
    Restart { node: String },
}

/// `lab pod` subcommands.
#[derive(Debug, Subcommand)]
pub enum PodCommand {
    /// Create a pod on a node (CNI ADD): `add --node NODE POD` or `add NODE POD`.
    Add {
        /// The node (or, without --node, the node followed by the pod).
        #[arg(num_args = 1..=2, required = true)]
        names: Vec<String>,
        /// The node.
        #[arg(long)]
        node: Option<String>,
    },
    /// Delete a pod (CNI DEL, then its namespace).
    Del { pod: String },
}

/// The arguments of `label` and `port`: changes to one resource (each command's help names
/// what its kind and changes may be).
#[derive(Debug, Args)]
pub struct Changes {
    /// Kind of the resource.
    pub kind: String,
    /// Name of the resource.
    pub name: String,
    /// The changes.
    #[arg(required = true)]
    pub changes: Vec<String>,
    /// Namespace of a namespaced resource.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}
