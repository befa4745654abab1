//! ternctl: the command-line client of tern, in the manner of calicoctl. Resources
//! (`apply`, `get`, `delete`), IPAM (`ipam show`), CNI installation (`install-cni`) and
//! throwaway labs in network namespaces (`lab`).
//!
//! [`cli`] defines the command line, [`commands`] holds one module per command, [`table`] the
//! output tables; [`run`] dispatches.

use std::sync::Arc;

use anyhow::Context;
use tern_store::Store;

pub mod cli;
pub mod commands;
pub mod table;

use cli::{Cli, Command, IpamCommand};
use commands::{apply, delete, get, install_cni, ipam_show, lab};

fn open_store(url: Option<&str>) -> anyhow::Result<Arc<dyn Store>> {
    let url = url.context("no datastore given: pass --store URL or set TERN_STORE")?;
    tern_store::open(url).with_context(|| format!("cannot open datastore {url}"))
}

/// Runs a parsed command line; returns the process exit code (errors are returned, not
/// printed).
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let store = cli.store.as_deref();
    match cli.command {
        Command::Apply { file } => {
            let s = open_store(store)?;
            let (text, name) = apply::read_input(&file)?;
            let counts = apply::apply(&*s, &text, &name)?;
            println!("{}", apply::summary(&counts));
        }
        Command::Get {
            kind,
            name,
            namespace,
            output,
        } => {
            let kind = get::parse_kind(&kind)?;
            let s = open_store(store)?;
            let found = get::fetch(&*s, kind, name.as_deref(), namespace.as_deref())?;
            print!("{}", get::render(kind, &found, output, name.is_some()));
        }
        Command::Delete {
            kind,
            name,
            namespace,
        } => {
            let kind = get::parse_kind(&kind)?;
            let s = open_store(store)?;
            println!("{}", delete::delete(s, kind, &name, namespace.as_deref())?);
        }
        Command::Ipam {
            command: IpamCommand::Show { show_blocks, ip },
        } => {
            let s = open_store(store)?;
            match ip {
                Some(ip) => print!("{}", ipam_show::show_ip(s, ip)?),
                None => print!("{}", ipam_show::show(s, show_blocks)?),
            }
        }
        Command::InstallCni(args) => {
            let from = match &args.plugin_dir {
                Some(d) => d.clone(),
                None => lab::own_dir()?,
            };
            let done = install_cni::install(&args, &from)?;
            for b in &done.binaries {
                println!("installed {}", b.display());
            }
            println!(
                "wrote {}{}",
                done.conflist.display(),
                if done.chained.is_empty() {
                    String::new()
                } else {
                    format!(" (chained: {})", done.chained.join(", "))
                }
            );
        }
        Command::Lab(args) => return lab::run(&args),
    }
    Ok(0)
}
