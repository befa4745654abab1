//! `ternctl lab ...`: thin wrappers over [`tern_lab`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tern_lab::traffic::{self, Proto};
use tern_lab::{LabState, StoreKind};

use crate::cli::{LabArgs, LabCommand, NodeCommand, PodCommand};

/// How long `lab node` commands wait for an agent's socket.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The lab's datastore kind from the global `--store`: `sqlite` (also when absent), `etcd` or
/// `kubernetes` (with `--kubernetes`).
/// A URL that came from the `TERN_STORE` environment is meant for other commands and ignored.
pub fn lab_store(store: Option<&str>) -> anyhow::Result<StoreKind> {
    let from_env = std::env::var("TERN_STORE").ok();
    match store {
        None | Some("sqlite") => Ok(StoreKind::Sqlite),
        Some("etcd") => Ok(StoreKind::Etcd),
        Some("kubernetes") => Ok(StoreKind::Kubernetes),
        Some(s) if from_env.as_deref() == Some(s) => Ok(StoreKind::Sqlite),
        Some(s) => bail!("a lab's --store is `sqlite`, `etcd` or `kubernetes`, not {s:?}"),
    }
}

/// Runs a `lab` subcommand; the process exit code. `store` is the global `--store`.
pub fn run(args: &LabArgs, store: Option<&str>) -> anyhow::Result<i32> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => own_dir()?,
    };
    match &args.command {
        LabCommand::Up {
            nodes,
            default_ipv4_pool,
            default_ipv6_pool,
            ip_family,
            encap,
            resync_seconds,
            bgp,
            kubernetes,
            k8s_bin_dir,
            reference_cni,
            host_ternd,
            etcd_tls,
        } => {
            let mut o = tern_lab::UpOptions::new(&args.name, &bin_dir);
            o.nodes = *nodes;
            o.default_ipv4_pool = default_ipv4_pool.clone();
            o.default_ipv6_pool = default_ipv6_pool.clone();
            o.ip_family = *ip_family;
            o.encap = *encap;
            let daemonset = *kubernetes && !*host_ternd && !*reference_cni;
            // The DaemonSet's ternd on every node needs one store they all reach: by default
            // the cluster's API server (no etcd of tern's runs); `--store etcd` keeps tern's.
            o.store = match lab_store(store)? {
                _ if daemonset && store.is_none() => StoreKind::Kubernetes,
                StoreKind::Kubernetes if !daemonset => {
                    bail!("--store kubernetes needs --kubernetes with tern as a DaemonSet")
                }
                s => s,
            };
            o.resync_seconds = *resync_seconds;
            o.etcd_tls = *etcd_tls;
            if *bgp {
                o.agent_args.push("--bgp".into());
            }
            let kube = kubernetes.then(|| {
                let mut k = tern_lab::kube::KubeOptions::from_env();
                if let Some(d) = k8s_bin_dir {
                    k.k8s_bin = d.clone();
                }
                k.reference_cni = *reference_cni;
                k.host_ternd = *host_ternd;
                k
            });
            if let Some(k) = &kube {
                // Before building anything: a missing component is an error at once.
                tern_lab::kube::check_binaries(&k.k8s_bin)?;
            }
            let failed = || {
                format!(
                    "lab up failed; remove what was built with `ternctl lab down --name {}`",
                    args.name
                )
            };
            let mut st = tern_lab::up(&o).with_context(failed)?;
            if let Some(k) = &kube {
                tern_lab::kube::up(&mut st, k).with_context(failed)?;
            }
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
        LabCommand::Demo {
            pods,
            nodes,
            encap,
            ip_family,
            bgp,
            no_bgp,
            kubernetes,
            k8s_bin_dir,
        } => {
            if lab_store(store)? == StoreKind::Kubernetes && !*kubernetes {
                bail!("--store kubernetes needs --kubernetes");
            }
            if *kubernetes && *ip_family != tern_lab::IpFamily::Ipv4 {
                bail!(
                    "lab demo --kubernetes shows an IPv4 cluster; for --ip-family {ip_family} \
                     use `lab up --kubernetes --ip-family {ip_family}`"
                );
            }
            super::demo::run(
                &args.name,
                &bin_dir,
                &super::demo::DemoOptions {
                    pods: *pods,
                    nodes: *nodes,
                    encap: *encap,
                    ip_family: *ip_family,
                    // As `lab up --kubernetes`: tern's DaemonSet needs a store every node reaches,
                    // by default the Kubernetes datastore (no etcd of tern's).
                    store: match lab_store(store)? {
                        _ if *kubernetes && store.is_none() => StoreKind::Kubernetes,
                        s => s,
                    },
                    // BGP carries the routes when nothing else does (no encapsulation); with
                    // IPv6, ternd programs them from the store unless --bgp is given.
                    bgp: *bgp
                        || (!*no_bgp
                            && *encap == tern_lab::Encap::None
                            && *nodes > 1
                            && *ip_family == tern_lab::IpFamily::Ipv4),
                    kubernetes: kubernetes.then(|| {
                        k8s_bin_dir
                            .clone()
                            .unwrap_or_else(|| tern_lab::kube::KubeOptions::from_env().k8s_bin)
                    }),
                },
            )
        }
        LabCommand::Node { command } => {
            let mut st = load(&args.name)?;
            match command {
                NodeCommand::Add => {
                    let n = tern_lab::node_add(&mut st, AGENT_TIMEOUT)?;
                    // Joining a Kubernetes lab may have replaced the host ternd.
                    let n = st.node(&n.name)?.clone();
                    let agent = match (n.ternd_pid, tern_lab::kube::agent_status(&st)) {
                        (None, Some(ds)) => ds,
                        (p, _) => format!("ternd pid {}", p.map_or("-".into(), |p| p.to_string())),
                    };
                    println!(
                        "node {} joined: netns {}, eth0 {}, {agent}",
                        n.name,
                        n.netns,
                        n.addresses().join(",")
                    );
                    if let Some(k) = &st.kube {
                        println!("node {} joined the Kubernetes cluster: Ready", n.name);
                        if k.manifest.is_some() {
                            print!("{}", tern_lab::kube::daemonset::status(k));
                        }
                    }
                }
                NodeCommand::Del { node } => {
                    for line in tern_lab::node_del(&mut st, node)? {
                        println!("{line}");
                    }
                }
                NodeCommand::Kill { node } => {
                    tern_lab::kill_agent(&mut st, node)?;
                    println!("ternd of {node} killed");
                }
                NodeCommand::Start { node } => {
                    let pid = tern_lab::start_agent(&mut st, node, true)?;
                    tern_lab::topology::wait_for_agent(st.node(node)?, AGENT_TIMEOUT)?;
                    println!("ternd of {node} started (pid {pid})");
                }
                NodeCommand::Restart { node } => {
                    tern_lab::restart_agent(&mut st, node, AGENT_TIMEOUT)?;
                    let pid = st.node(node)?.ternd_pid.unwrap_or_default();
                    println!("ternd of {node} restarted (pid {pid})");
                }
            }
            Ok(0)
        }
        LabCommand::Routes { node } => {
            let st = load(&args.name)?;
            for n in &st.nodes {
                if node.as_ref().is_some_and(|x| *x != n.name) {
                    continue;
                }
                println!("--- {} ({}) ---", n.name, n.addresses().join(", "));
                for v6 in st.ip_family.families() {
                    print!("{}", tern_lab::mesh::routes_of(&st, &n.name, v6)?);
                }
            }
            Ok(0)
        }
        LabCommand::Pod { command } => {
            let mut st = load(&args.name)?;
            match command {
                PodCommand::Add { names, node } => {
                    let (node, pod) = match (node, names.as_slice()) {
                        (Some(n), [pod]) => (n.clone(), pod.clone()),
                        (None, [n, pod]) => (n.clone(), pod.clone()),
                        _ => bail!("use `lab pod add --node NODE POD` (or `lab pod add NODE POD`)"),
                    };
                    let (node, pod) = (&node, &pod);
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
        LabCommand::Relay {
            netns,
            to,
            ready_file,
        } => {
            tern_lab::kube::relay::serve(netns, *to, ready_file)?;
            Ok(0)
        }
        LabCommand::Probe {
            tcp,
            udp,
            timeout_ms,
            continuous,
            interval_ms,
            duration_s,
            max_gap_ms,
        } => {
            let (proto, target) = match (tcp, udp) {
                (Some(t), None) => (Proto::Tcp, *t),
                (None, Some(u)) => (Proto::Udp, *u),
                _ => bail!("give exactly one of --tcp IP:PORT and --udp IP:PORT"),
            };
            if *continuous {
                let r = traffic::probe_continuous(
                    proto,
                    target,
                    Duration::from_millis(*interval_ms),
                    Duration::from_secs(*duration_s),
                )?;
                println!("{r}");
                let too_long = max_gap_ms.is_some_and(|m| r.longest_gap > Duration::from_millis(m));
                return Ok(if r.received == 0 || too_long { 1 } else { 0 });
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_store_kinds() {
        assert_eq!(lab_store(None).unwrap(), StoreKind::Sqlite);
        assert_eq!(lab_store(Some("sqlite")).unwrap(), StoreKind::Sqlite);
        assert_eq!(lab_store(Some("etcd")).unwrap(), StoreKind::Etcd);
        assert_eq!(
            lab_store(Some("kubernetes")).unwrap(),
            StoreKind::Kubernetes
        );
        let e = lab_store(Some("etcd://198.18.0.2:2379"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`sqlite`, `etcd` or `kubernetes`"), "{e}");
    }
}
