//! `tern-bench`: benchmarks for tern. `tern-bench cni` times CNI ADD/DEL of tern side by side with
//! the reference `ptp` + `host-local` plugins, inside a private network namespace.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tern_bench::bench::{self, CniBenchOptions, PluginSet, Workload};
use tern_bench::netbench;

#[derive(Parser)]
#[command(
    name = "tern-bench",
    about = "Benchmarks for tern (run as root; never touches the host network namespace)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// CNI ADD/DEL latency (sequential and concurrent), binary sizes and ternd's RSS.
    Cni(CniArgs),
    /// Cross-node pod-to-pod TCP throughput (iperf3) and request/response latency, tern vs the
    /// same path built by hand, in IPv4 and/or IPv6.
    Net(NetArgs),
    /// Route convergence: a pod's ADD on node A to the first packet from node B.
    Converge(ConvergeArgs),
    /// NetworkPolicy programming: 1,000 policies x 1,000 endpoints, and incremental changes.
    Policy(PolicyArgs),
    /// Policy propagation: a NetworkPolicy's write to every node enforcing it, and its delete
    /// to traffic flowing again (3-node lab).
    PolicyPropagation(PolicyPropagationArgs),
    /// Flow records: records/s the flow service keeps (kernel NFLOG in a private namespace,
    /// and userspace only), and memory with a full ring.
    Flows(FlowsArgs),
}

#[derive(Args)]
struct FlowsArgs {
    /// Seconds per measurement (each kernel and each userspace workload).
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Records of the large ring measured for memory (the default 10,000 is measured too).
    #[arg(long, default_value_t = 100_000)]
    ring: usize,
    /// Endpoints of the policy model (at most 1,000).
    #[arg(long, default_value_t = 1000)]
    endpoints: u32,
    /// Policies of the policy model.
    #[arg(long, default_value_t = 300)]
    policies: u32,
}

#[derive(Args)]
struct PolicyPropagationArgs {
    /// Directory holding the `tern`, `tern-ipam` and `ternd` binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Directory holding the plugins `tern` and `tern-ipam` [default: --bin-dir]; e.g. the
    /// static ones of `scripts/static-plugins.sh`, with ternd still from --bin-dir.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Apply/delete rounds (each gives one sample per node and direction).
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Datastore of the lab.
    #[arg(long, value_enum, default_value_t = tern_lab::StoreKind::Etcd)]
    store: tern_lab::StoreKind,
}

#[derive(Args)]
struct PolicyArgs {
    /// Policies to program.
    #[arg(long, default_value_t = 1000)]
    policies: u32,
    /// Local endpoints (as many remote ones feed the selector sets).
    #[arg(long, default_value_t = 1000)]
    endpoints: u32,
    /// Incremental changes timed per kind.
    #[arg(long, default_value_t = 50)]
    samples: u32,
    /// Give every policy a second ingress rule from a CIDR, so selected endpoints get
    /// allow-only fast-path sets.
    #[arg(long)]
    ipblocks: bool,
    /// Instead: per-packet cost (iperf3, TCP request/response, new connections) with
    /// `--rules` rules in tern vs no netfilter vs conntrack only vs a linear iptables chain.
    #[arg(long)]
    per_packet: bool,
    /// Rules for `--per-packet`.
    #[arg(long, default_value_t = 10000)]
    rules: u32,
    /// Seconds per measurement for `--per-packet`.
    #[arg(long, default_value_t = 3)]
    seconds: u32,
    /// Rounds for `--per-packet`: each measures every configuration once, in a rotating
    /// order; medians and per-round paired losses are reported.
    #[arg(long, default_value_t = 8)]
    runs: u32,
    /// CPU of the client for `--per-packet` (iperf3 -c via taskset, client threads). Client
    /// and server share one CPU by default: the whole path (send, forward, receive) then runs
    /// there, and no round trip waits for another vCPU to wake up.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
    /// CPU of the server for `--per-packet` (iperf3 -s via taskset, server threads).
    #[arg(long, default_value_t = 1)]
    server_cpu: usize,
    /// Leave client and server placement to the scheduler for `--per-packet`.
    #[arg(long)]
    no_pin: bool,
}

#[derive(Args)]
struct NetArgs {
    /// Directory holding the `tern`, `tern-ipam` and `ternd` binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Directory holding the plugins `tern` and `tern-ipam` [default: --bin-dir]; e.g. the
    /// static ones of `scripts/static-plugins.sh`, with ternd still from --bin-dir.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Seconds per iperf3 run, and per request/response run.
    #[arg(long, default_value_t = 5)]
    seconds: u32,
    /// Runs per path; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Address families to measure: `v4`, `v6` or both (`v4,v6`: each mode's lab is dual
    /// stack, both families on the same lab).
    #[arg(long, value_delimiter = ',', default_value = "v4", value_parser = netbench::parse_family)]
    families: Vec<bool>,
}

#[derive(Args)]
struct ConvergeArgs {
    /// Directory holding the `tern`, `tern-ipam` and `ternd` binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Directory holding the plugins `tern` and `tern-ipam` [default: --bin-dir]; e.g. the
    /// static ones of `scripts/static-plugins.sh`, with ternd still from --bin-dir.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Pods added on node A.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Datastore of the lab.
    #[arg(long, value_enum, default_value_t = tern_lab::StoreKind::Etcd)]
    store: tern_lab::StoreKind,
    /// Encapsulation between the nodes.
    #[arg(long, value_enum, default_value_t = tern_lab::Encap::Vxlan)]
    encap: tern_lab::Encap,
}

#[derive(Args)]
struct CniArgs {
    /// Pods added then deleted one after another.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Pods added (then deleted) concurrently, one thread each.
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Plugin sets to measure, in order: `ref` (ptp + host-local) and/or `tern`.
    #[arg(long, value_delimiter = ',', default_value = "ref,tern")]
    plugins: Vec<PluginSet>,
    /// Directory holding the `tern`, `tern-ipam` and `ternd` binaries.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Directory holding the plugins `tern` and `tern-ipam` [default: --bin-dir]; e.g. the
    /// static ones of `scripts/static-plugins.sh`, with ternd still from --bin-dir.
    #[arg(long)]
    plugin_dir: Option<PathBuf>,
    /// Directory holding the reference plugins.
    #[arg(long, default_value = bench::REFERENCE_PLUGIN_DIR)]
    ref_dir: PathBuf,
    /// Seconds to wait for ternd's socket.
    #[arg(long, default_value_t = 10)]
    agent_timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("tern-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    // Resolve relative paths before anything else changes.
    let absolute =
        |p: PathBuf| std::path::absolute(&p).with_context(|| format!("resolve {}", p.display()));
    let args = match cli.command {
        Cmd::Cni(args) => args,
        // The network benches build lab namespaces and never enter them from this thread.
        Cmd::Net(a) => {
            let (_, table) = netbench::run_net(&netbench::NetBenchOptions {
                bin_dir: absolute(a.bin_dir)?,
                seconds: a.seconds,
                runs: a.runs,
                families: a.families,
            })?;
            print!("{table}");
            return Ok(!table.contains("MISS"));
        }
        Cmd::Policy(a) if a.per_packet => {
            let r = tern_bench::policybench::run_per_packet(
                &tern_bench::policybench::PerPacketOptions {
                    runs: a.runs,
                    rules: a.rules,
                    seconds: a.seconds,
                    pin: (!a.no_pin).then_some(tern_bench::policybench::CpuPin {
                        client: a.client_cpu,
                        server: a.server_cpu,
                    }),
                },
            )?;
            let table = tern_bench::policybench::render_per_packet(&r);
            print!("{table}");
            return Ok(!table.contains("MISS"));
        }
        Cmd::Policy(a) => {
            let o = tern_bench::policybench::PolicyBenchOptions {
                policies: a.policies,
                endpoints: a.endpoints,
                samples: a.samples,
                ipblocks: a.ipblocks,
            };
            let r = tern_bench::policybench::run_policy(&o)?;
            let table = tern_bench::policybench::render(&o, &r);
            print!("{table}");
            return Ok(!table.contains("MISS"));
        }
        Cmd::Flows(a) => {
            let o = tern_bench::flowbench::FlowBenchOptions {
                seconds: a.seconds,
                ring: a.ring,
                endpoints: a.endpoints,
                policies: a.policies,
            };
            let r = tern_bench::flowbench::run_flows(&o)?;
            print!("{}", tern_bench::flowbench::render(&o, &r));
            return Ok(true);
        }
        Cmd::PolicyPropagation(a) => {
            let mut o =
                tern_bench::policyprop::PropagationOptions::new(absolute(a.bin_dir)?, a.trials);
            o.store = a.store;
            let r = tern_bench::policyprop::run_propagation(&o)?;
            println!("{r}");
            return Ok(r.pass());
        }
        Cmd::Converge(a) => {
            let r = netbench::run_converge(&netbench::ConvergeOptions {
                bin_dir: absolute(a.bin_dir)?,
                pods: a.pods,
                store: a.store,
                encap: a.encap,
            })?;
            println!("{r}");
            return Ok(!r.to_string().contains("MISS"));
        }
    };
    let options = CniBenchOptions {
        workload: Workload {
            pods: args.pods,
            concurrency: args.concurrency,
        },
        plugins: args.plugins,
        plugin_dir: absolute(args.plugin_dir.unwrap_or_else(|| args.bin_dir.clone()))?,
        bin_dir: absolute(args.bin_dir)?,
        ref_dir: absolute(args.ref_dir)?,
        agent_timeout: Duration::from_secs(args.agent_timeout),
    };
    // Namespaces first, while this is the only thread, so every later thread inherits them.
    bench::enter_private_namespaces().context("enter a private network namespace")?;
    let report = bench::run_cni(&options).context("set up the bench namespace")?;
    let mut out = std::io::stdout().lock();
    match write!(out, "{report}").and_then(|()| out.flush()) {
        // A closed pipe (`| head`) is the reader's choice, not a failure of the run.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("write the report"),
        _ => Ok(report.all_ok()),
    }
}
