//! `ternctl lab ...`: thin wrappers over [`tern_lab`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_lab::LabState;
use tern_lab::traffic::{self, Proto};

use crate::cli::{LabArgs, LabCommand, PodCommand};

/// The directory of the running ternctl, where `tern`, `tern-ipam` and `ternd` are expected.
pub fn own_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the ternctl binary")?;
    Ok(exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

fn load(name: &str) -> anyhow::Result<LabState> {
    LabState::load(name)?
        .with_context(|| format!("lab {name:?} does not exist; create it with `ternctl lab up`"))
}

/// Runs a `lab` subcommand; the process exit code.
pub fn run(args: &LabArgs) -> anyhow::Result<i32> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => own_dir()?,
    };
    match &args.command {
        LabCommand::Up {
            nodes,
            default_ipv4_pool,
        } => {
            let mut o = tern_lab::UpOptions::new(&args.name, &bin_dir);
            o.nodes = *nodes;
            o.default_ipv4_pool = default_ipv4_pool.clone();
            let st = tern_lab::up(&o).with_context(|| {
                format!(
                    "lab up failed; remove what was built with `ternctl lab down --name {}`",
                    args.name
                )
            })?;
            print!("{}", tern_lab::status(&st.name)?);
            Ok(0)
        }
        LabCommand::Status => {
            print!("{}", tern_lab::status(&args.name)?);
            Ok(0)
        }
        LabCommand::Down => {
            for line in tern_lab::down(&args.name)? {
                println!("{line}");
            }
            Ok(0)
        }
        LabCommand::Demo { pods } => super::demo::run(&args.name, &bin_dir, *pods),
        LabCommand::Pod { command } => {
            let mut st = load(&args.name)?;
            match command {
                PodCommand::Add { node, pod } => {
                    let p = tern_lab::add_pod(&mut st, node, pod)?;
                    println!("pod {} on {}: {}", p.name, p.node, p.addresses.join(", "));
                }
                PodCommand::Del { pod } => {
                    tern_lab::del_pod(&mut st, pod)?;
                    println!("pod {pod} deleted");
                }
            }
            Ok(0)
        }
        LabCommand::Serve {
            tcp,
            udp,
            ready_file,
        } => {
            traffic::serve(*tcp, *udp, ready_file.as_deref())?;
            Ok(0)
        }
        LabCommand::Probe {
            tcp,
            udp,
            timeout_ms,
        } => {
            let (proto, target) = match (tcp, udp) {
                (Some(t), None) => (Proto::Tcp, *t),
                (None, Some(u)) => (Proto::Udp, *u),
                _ => bail!("give exactly one of --tcp IP:PORT and --udp IP:PORT"),
            };
            match traffic::probe(proto, target, Duration::from_millis(*timeout_ms)) {
                Ok(ok) => {
                    println!("{ok}");
                    Ok(0)
                }
                Err(e) => {
                    println!("fail {} {target}: {e}", proto.as_str());
                    Ok(1)
                }
            }
        }
    }
}
