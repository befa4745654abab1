//! ternctl: the command-line client of tern, in the manner of calicoctl. Resources
//! (`apply`, `get`, `delete`), policy verdicts (`explain`), IPAM (`ipam
//! show|check|release|configure`), CNI installation (`install-cni`) and throwaway labs in
//! network namespaces (`lab`).
//!
//! [`cli`] defines the command line, [`commands`] holds one module per command, [`table`] the
//! output tables; [`run`] dispatches.

#![forbid(unsafe_code)]

use std::sync::Arc;

use anyhow::Context;
use tern_model::Kind;
use tern_store::Store;

pub mod cli;
pub mod commands;
pub mod table;

use cli::{Cli, Command, IpamCommand};
use commands::{
    apply, delete, get, install_cni, ipam_check, ipam_configure, ipam_release, ipam_show, lab,
    label, port,
};

/// Where the datastore is and how to reach it.
struct StoreArgs<'a> {
    url: Option<&'a str>,
    ca: Option<&'a std::path::Path>,
    cert: Option<&'a std::path::Path>,
    key: Option<&'a std::path::Path>,
}

/// `label::label` or `port::port`: applies changes to a resource (kind, name, namespace).
type ApplyChanges<C> = fn(&dyn Store, Kind, &str, Option<&str>, &[C]) -> anyhow::Result<String>;

/// `label` or `port`: parses the kind and the changes (with `parse`), then applies them to the
/// resource in the store (with `apply`). The kind and what `apply` reports.
fn change<C>(
    store: &StoreArgs,
    c: &cli::Changes,
    parse: fn(&[String]) -> anyhow::Result<Vec<C>>,
    apply: ApplyChanges<C>,
) -> anyhow::Result<(Kind, String)> {
    let kind = get::parse_kind(&c.kind)?;
    let changes = parse(&c.changes)?;
    let s = open_store(store)?;
    let now = apply(&*s, kind, &c.name, c.namespace.as_deref(), &changes)?;
    Ok((kind, now))
}

fn open_store(args: &StoreArgs) -> anyhow::Result<Arc<dyn Store>> {
    let url = args
        .url
        .context("no datastore given: pass --store URL or set TERN_STORE")?;
    tern_store::etcd::open_with_tls(url, args.ca, args.cert, args.key)
        .with_context(|| format!("cannot open datastore {url}"))
}

/// The API server itself when the datastore is the Kubernetes one (for what lives in the
/// cluster's own resources rather than tern's, such as Kubernetes NetworkPolicies).
fn open_kube(args: &StoreArgs) -> anyhow::Result<Option<tern_store::kube::KubeStore>> {
    use tern_store::kube::{KubeConfig, KubeStore};
    let url = args.url.unwrap_or_default();
    let cfg = if url == "kubernetes" || url == "kubernetes://" {
        KubeConfig::discover(None)?
    } else if let Some(path) = url.strip_prefix("kubernetes://") {
        KubeConfig::from_kubeconfig(std::path::Path::new(path))?
    } else {
        return Ok(None);
    };
    Ok(Some(KubeStore::connect(cfg).with_context(|| {
        format!("cannot open the API server of {url}")
    })?))
}

/// Runs one `ipam` subcommand; returns the exit code (`check` exits 1 when it finds
/// problems, so scripts can act on it).
fn run_ipam(s: Arc<dyn Store>, command: IpamCommand) -> anyhow::Result<i32> {
    match command {
        IpamCommand::Show {
            show_blocks,
            ip,
            show_borrowed,
            show_configuration,
        } => {
            if let Some(ip) = ip {
                print!("{}", ipam_show::show_ip(s, ip)?);
                return Ok(0);
            }
            if show_configuration {
                print!("{}", ipam_configure::show(&*s)?);
            }
            if show_borrowed {
                print!("{}", ipam_show::show_borrowed(s.clone())?);
            }
            if !show_configuration && !show_borrowed || show_blocks {
                print!("{}", ipam_show::show(s, show_blocks)?);
            }
        }
        IpamCommand::Check { output } => {
            let report = ipam_check::check(s)?;
            print!("{}", tern_ipam::audit::summary(&report));
            if let Some(path) = output {
                ipam_check::write_report(&report, &path)?;
                println!("Report written to {}", path.display());
            }
            return Ok(i32::from(report.problems() > 0));
        }
        IpamCommand::Release { ip, from_report } => {
            let out = match (ip, from_report) {
                (Some(ip), _) => ipam_release::release_ip(s, ip)?,
                (None, Some(path)) => ipam_release::release_from_report(s, &path)?,
                (None, None) => anyhow::bail!("pass --ip IP or --from-report FILE"),
            };
            print!("{out}");
        }
        IpamCommand::Configure {
            strict_affinity,
            max_blocks_per_host,
        } => {
            let spec = ipam_configure::configure(&*s, strict_affinity, max_blocks_per_host)?;
            println!("Successfully set IPAM configuration.");
            print!("{}", ipam_configure::render(&spec));
        }
    }
    Ok(0)
}

/// `p` unless it is empty.
fn non_empty(p: Option<&std::path::Path>) -> Option<&std::path::Path> {
    p.filter(|p| !p.as_os_str().is_empty())
}

/// `ternctl flows`: one listing, or a listing and then every new record (`--follow`).
fn run_flows(args: &cli::FlowsArgs, store_url: Option<&str>) -> anyhow::Result<i32> {
    use commands::flows;
    use tern_api::flow::{FlowDirection, FlowQuery, FlowVerdict};
    let filter = flows::Filter {
        namespace: args.namespace.clone(),
        pod: args.pod.clone(),
        selector: args
            .selector
            .as_deref()
            .map(flows::parse_selector)
            .transpose()?,
        verdict: args.verdict.map(|v| match v {
            cli::FlowVerdictArg::Allowed => FlowVerdict::Allowed,
            cli::FlowVerdictArg::Denied => FlowVerdict::Denied,
        }),
        direction: args.direction.map(|d| match d {
            cli::FlowDirectionArg::Ingress => FlowDirection::Ingress,
            cli::FlowDirectionArg::Egress => FlowDirection::Egress,
        }),
        port: args.port,
        policy: args.policy.clone(),
    };
    let since_ms = match &args.since {
        Some(s) => Some(flows::now_ms().saturating_sub(flows::parse_since(s)?.as_millis() as u64)),
        None => None,
    };
    // Inside a tern-node pod, for `ternctl flows` run elsewhere through the API server: the
    // local agent's reply to the request given, as one JSON document.
    if let Some(request) = &args.agent_reply {
        let socket = args
            .socket
            .first()
            .cloned()
            .unwrap_or_else(|| std::path::PathBuf::from(tern_api::DEFAULT_SOCKET));
        println!("{}", commands::flows::agent_reply(&socket, request)?);
        return Ok(0);
    }
    let agents = flows::agents(&args.socket, &args.lab, store_url)?;
    if let Some(addr) = &args.web {
        return run_flows_web(addr, agents);
    }
    if args.aggregate {
        return run_flows_aggregate(args, &filter, since_ms, &agents);
    }
    let print = |r: &tern_api::flow::FlowRecord| match args.output {
        cli::ExplainOutput::Table => println!("{}", flows::render_line(r)),
        cli::ExplainOutput::Json => {
            println!("{}", serde_json::to_string(r).unwrap_or_default())
        }
    };
    // The listing is the follower's first round: following goes on from exactly what it
    // printed, at each node.
    let mut follower = flows::Follower::new(FlowQuery {
        since_ms,
        ..FlowQuery::default()
    });
    let polled = follower.poll(&agents);
    for e in &polled.errors {
        eprintln!("warning: {e}");
    }
    if polled.errors.len() == agents.len() && !agents.is_empty() {
        anyhow::bail!("no agent answered: {}", polled.errors.join("; "));
    }
    let records: Vec<_> = polled
        .records
        .into_iter()
        .filter(|r| filter.matches(r))
        .collect();
    for r in &flows::last(records, args.last) {
        print(r);
    }
    if !args.follow {
        return Ok(0);
    }
    eprintln!(
        "following the records of {} node(s), every second (Ctrl-C to stop)",
        agents.len()
    );
    loop {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::thread::sleep(std::time::Duration::from_secs(1));
        let polled = follower.poll(&agents);
        for e in &polled.errors {
            eprintln!("warning: {e}");
        }
        for r in polled.records.iter().filter(|r| filter.matches(r)) {
            print(r);
        }
    }
}

/// `ternctl flows --aggregate`: every node's per-minute counts, filtered, per node or summed.
fn run_flows_aggregate(
    args: &cli::FlowsArgs,
    filter: &commands::flows::Filter,
    since_ms: Option<u64>,
    agents: &[commands::flows::Agent],
) -> anyhow::Result<i32> {
    use commands::flows_aggregate;
    let q = tern_api::flow::AggregateQuery {
        since_ms,
        minutes: None,
    };
    let mut replies = Vec::new();
    let mut errors = Vec::new();
    for a in agents {
        match a.aggregates(&q) {
            Ok(r) => replies.push(r),
            Err(e) => errors.push(format!("node {}: {e:#}", a.node())),
        }
    }
    for e in &errors {
        eprintln!("warning: {e}");
    }
    if replies.is_empty() && !agents.is_empty() {
        anyhow::bail!("no agent answered: {}", errors.join("; "));
    }
    let (lines, notes) = flows_aggregate::lines(&replies, filter, args.sum);
    match args.output {
        cli::ExplainOutput::Table => print!("{}", flows_aggregate::render_table(&lines)),
        cli::ExplainOutput::Json => {
            for l in &lines {
                println!("{}", serde_json::to_string(l)?);
            }
        }
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    Ok(0)
}

/// `ternctl flows --web ADDR`: the page until interrupted.
fn run_flows_web(addr: &str, agents: Vec<commands::flows::Agent>) -> anyhow::Result<i32> {
    use commands::flows_web;
    let listener = flows_web::bind(addr)?;
    let token = flows_web::new_token()?;
    let local = listener.local_addr()?;
    println!("flows page: http://{local}/?token={token} (Ctrl-C to stop)");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut follower = commands::flows::Follower::new(tern_api::flow::FlowQuery {
        last: Some(flows_web::MAX_KEPT),
        ..tern_api::flow::FlowQuery::default()
    });
    let source: flows_web::Source = Box::new(move || follower.poll(&agents));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    flows_web::serve(
        listener,
        token,
        source,
        std::time::Duration::from_secs(1),
        stop,
    )?;
    Ok(0)
}

/// Runs a parsed command line; returns the process exit code (errors are returned, not
/// printed).
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let store = StoreArgs {
        url: cli.store.as_deref(),
        // Empty (`TERN_ETCD_CA=""` from the manifest's ConfigMap without TLS): not given.
        ca: non_empty(cli.etcd_ca.as_deref()),
        cert: non_empty(cli.etcd_cert.as_deref()),
        key: non_empty(cli.etcd_key.as_deref()),
    };
    match cli.command {
        Command::Apply { file } => {
            let s = open_store(&store)?;
            let (text, name) = apply::read_input(&file)?;
            let counts = apply::apply(&*s, &text, &name)?;
            println!("{}", apply::summary(&counts));
        }
        Command::Get {
            kind,
            name,
            namespace,
            all_namespaces: _,
            output,
        } => {
            let kind = get::parse_kind(&kind)?;
            let s = open_store(&store)?;
            let found = get::fetch(&*s, kind, name.as_deref(), namespace.as_deref())?;
            print!("{}", get::render(kind, &found, output, name.is_some()));
        }
        Command::Delete {
            kind,
            name,
            namespace,
            file,
            skip_not_exists,
        } => {
            if let Some(file) = file {
                let s = open_store(&store)?;
                let (text, name) = apply::read_input(&file)?;
                let counts = delete::delete_documents(s, &text, &name, skip_not_exists)?;
                println!("{}", delete::summary(&counts));
                return Ok(0);
            }
            let (Some(kind), Some(name)) = (kind, name) else {
                anyhow::bail!("pass KIND NAME, or -f FILE");
            };
            let kind = get::parse_kind(&kind)?;
            let s = open_store(&store)?;
            println!("{}", delete::delete(s, kind, &name, namespace.as_deref())?);
        }
        Command::Label(c) => {
            let (kind, now) = change(&store, &c, label::parse_changes, label::label)?;
            println!("{} {} labelled: {now}", kind.as_str(), c.name);
        }
        Command::Port(c) => {
            let (kind, now) = change(&store, &c, port::parse_changes, port::port)?;
            println!("{} {} ports: {now}", kind.as_str(), c.name);
        }
        Command::Explain(args) => {
            let port = commands::explain::parse_port(&args.port)?;
            let timeout = std::time::Duration::try_from_secs_f64(args.probe_timeout)
                .ok()
                .filter(|t| !t.is_zero() && *t <= std::time::Duration::from_secs(60))
                .with_context(|| {
                    format!(
                        "--probe-timeout {}: give seconds, more than 0 and at most 60",
                        args.probe_timeout
                    )
                })?;
            // `--probe` works on a lab, `lab` unless named; a lab's state comes from its store.
            let lab_name = args
                .lab
                .clone()
                .or_else(|| args.probe.then(|| "lab".to_string()));
            let (lab_state, state) = match &lab_name {
                Some(name) => {
                    let (st, state) = commands::explain::load_lab(name)?;
                    (Some(st), state)
                }
                None => match store.url.and_then(commands::explain::load_kubernetes) {
                    Some(state) => (None, state?),
                    None => (None, commands::explain::load(&*open_store(&store)?)?),
                },
            };
            for why in &state.skipped {
                eprintln!("warning: skipped {why}");
            }
            let mut report = state.explain(&args.from, &args.to, port)?;
            if let (true, Some(st)) = (args.probe, &lab_state) {
                commands::explain::probe(st, &mut report, timeout)?;
            }
            print!(
                "{}",
                match args.output {
                    cli::ExplainOutput::Table => commands::explain::render_table(&report),
                    cli::ExplainOutput::Json => commands::explain::render_json(&report),
                }
            );
            if report.probe.as_ref().is_some_and(|p| !p.agrees) {
                return Ok(2);
            }
        }
        Command::Policy {
            command:
                cli::PolicyCommand::Promote {
                    name,
                    namespace,
                    kind,
                },
        } => {
            let kind = kind.as_deref().map(get::parse_kind).transpose()?;
            let s = open_store(&store)?;
            let staged = commands::promote::find(&*s, kind, &name, namespace.as_deref())?;
            let kube = open_kube(&store)?;
            println!(
                "{}",
                commands::promote::promote(&*s, kube.as_ref(), &staged)?
            );
        }
        Command::Flows(args) => return run_flows(&args, store.url),
        Command::Ipam { command } => {
            let s = open_store(&store)?;
            return run_ipam(s, command);
        }
        Command::InstallCni(args) => {
            let from = match &args.plugin_dir {
                Some(d) => d.clone(),
                None => lab::own_dir()?,
            };
            if args.wait_ready.is_some() || args.stay {
                install_cni::exit_on_termination()?;
            }
            if let Some(url) = &args.wait_ready {
                install_cni::wait_ready(url, None)?;
            }
            let done = install_cni::install(&args, &from)?;
            for b in &done.binaries {
                println!("installed {}", b.display());
            }
            if let Some(c) = &done.conflist {
                println!(
                    "wrote {}{}",
                    c.display(),
                    if done.chained.is_empty() {
                        String::new()
                    } else {
                        format!(" (chained: {})", done.chained.join(", "))
                    }
                );
            }
            if args.stay {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                // Until SIGTERM or SIGINT (see `exit_on_termination`).
                loop {
                    std::thread::park();
                }
            }
        }
        Command::Install {
            command: cli::InstallCommand::Crds,
        } => {
            print!("{}", tern_store::kube::crds_yaml());
        }
        Command::Install {
            command: cli::InstallCommand::Manifest(args),
        } => {
            // etcd over TLS: the files' contents go into the manifest's Secret.
            let etcd_tls = commands::install_manifest::read_tls(store.ca, store.cert, store.key)?;
            let opts = commands::install_manifest::ManifestOptions {
                store: store
                    .url
                    .unwrap_or(commands::install_manifest::DEFAULT_STORE)
                    .to_string(),
                image: args.image,
                pool: args.pool,
                ipv6_pool: args.ipv6_pool,
                no_ipv4_pool: args.no_ipv4_pool,
                encap: args.encap,
                bgp: args.bgp,
                log_level: args.log_level,
                cni_bin_dir: args.cni_bin_dir,
                cni_conf_dir: args.cni_conf_dir,
                etcd_tls,
            };
            print!("{}", commands::install_manifest::render(&opts)?);
        }
        Command::Lab(args) => return lab::run(&args, store.url),
        Command::Datastore {
            command: cli::DatastoreCommand::Lock { reason },
        } => {
            let s = open_store(&store)?;
            tern_ipam::Ipam::new(s)
                .set_migration_lock(Some(reason.clone()))
                .with_context(|| format!("locking datastore {}", store.url.unwrap_or_default()))?;
            println!(
                "locked datastore {} ({reason})",
                store.url.unwrap_or_default()
            );
        }
        Command::Datastore {
            command: cli::DatastoreCommand::Unlock,
        } => {
            let s = open_store(&store)?;
            tern_ipam::Ipam::new(s)
                .set_migration_lock(None)
                .with_context(|| {
                    format!("unlocking datastore {}", store.url.unwrap_or_default())
                })?;
            println!("unlocked datastore {}", store.url.unwrap_or_default());
        }
        Command::Datastore {
            command:
                cli::DatastoreCommand::Migrate {
                    from,
                    to,
                    dry_run,
                    force,
                    no_lock,
                },
        } => {
            // The etcd TLS files (--etcd-ca ...) belong to whichever side is etcd.
            let open = |url: &str| {
                let etcd = url.starts_with("etcd://");
                let (ca, cert, key) = if etcd {
                    (store.ca, store.cert, store.key)
                } else {
                    (None, None, None)
                };
                tern_store::etcd::open_with_tls(url, ca, cert, key)
                    .with_context(|| format!("cannot open datastore {url}"))
            };
            let (src, dst) = (open(&from)?, open(&to)?);
            if !dry_run && !no_lock {
                // Locked before it is read: an agent still on the source allocates nothing
                // the copy would miss (on etcd or SQLite its allocation's guard on the IPAM
                // configuration refuses at once; elsewhere within its policy TTL, waited out).
                tern_ipam::Ipam::new(src.clone())
                    .set_migration_lock(Some(format!("ternctl datastore migrate to {to}")))
                    .with_context(|| format!("locking {from} for the migration"))?;
                std::thread::sleep(3 * tern_ipam::DEFAULT_POLICY_TTL);
                println!(
                    "locked {from} (`ternctl --store {from} datastore unlock` to use it again)"
                );
            }
            let plan = tern_store::migrate::migrate(&*src, &*dst, dry_run, force)
                .with_context(|| format!("migrating {from} to {to}"))?;
            if !dry_run {
                // The copy of a locked source's configuration is locked too: the new
                // datastore is the one to use.
                tern_ipam::Ipam::new(dst.clone())
                    .set_migration_lock(None)
                    .with_context(|| format!("unlocking {to} after the copy"))?;
            }
            println!(
                "{} {from} to {to}: {plan}",
                if dry_run { "would migrate" } else { "migrated" }
            );
            // From a store that keeps allocations in the blocks only (the Kubernetes API) to
            // one that indexes them by handle: the handle records are rebuilt from the blocks.
            if !dry_run && !src.multi_key_txn() && dst.multi_key_txn() {
                let n = tern_ipam::Ipam::new(dst.clone())
                    .rebuild_handles()
                    .context("rebuilding the IPAM handle records from the blocks")?;
                println!("rebuilt {n} IPAM handle records from the blocks");
            }
        }
        Command::Node {
            command: cli::NodeStatusCommand::Status { socket },
        } => {
            let s = commands::node_status::fetch(&socket)?;
            print!(
                "{}",
                commands::node_status::render(&s, std::time::SystemTime::now())
            );
        }
    }
    Ok(0)
}
