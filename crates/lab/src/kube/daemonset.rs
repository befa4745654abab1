//! tern installed the Kubernetes way (the default of `ternctl lab up --kubernetes`): the
//! `tern-node` image built by `scripts/k8s/tern-image.sh` from the lab's binaries and imported
//! into every node's containerd, the manifest rendered by `ternctl install manifest` and
//! applied with `kubectl apply -f`, then `kubectl rollout status ds/tern-node`.
//!
//! A DaemonSet's hostPaths are the same on every node, so each node's private mount namespace
//! gets its own directories bound onto the paths the manifest names: `<node>/k8s/cni/bin` on
//! `/opt/cni/bin`, `<node>/k8s/cni/net.d` on `/opt/cni/net.d` (the machine has no `/etc/cni`,
//! and the lab never creates one), `<node>/k8s/run-tern` on `/run/tern` (so ternd's socket
//! is reachable from outside as the lab's node socket) and `<node>/k8s/var-lib-tern` on
//! `/var/lib/tern`. The mount namespace is made rshared, as kubelet requires for the
//! `HostToContainer` mount of `/run/netns`; it was created private, so nothing propagates
//! to the machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{KubeState, kubectl, write};
use crate::process;
use crate::state::{LabState, StoreKind};
use crate::{LabError, Result};

/// The image tarball's file name in the cluster directory.
pub const IMAGE_TARBALL: &str = "tern-node.tar";
/// Environment variable naming `tern-image.sh` (default: the one in this source tree).
pub const IMAGE_SCRIPT_ENV: &str = "TERN_IMAGE_SCRIPT";
/// The nodes' CNI configuration directory in the manifest (node-independent, inside each
/// node's private mount namespace).
pub const CNI_CONF_DIR: &str = "/opt/cni/net.d";
/// The nodes' CNI bin directory in the manifest (the default).
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// How long the DaemonSet may take to roll out on every node.
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(240);

/// `tern-image.sh`: `$TERN_IMAGE_SCRIPT`, else the source tree's.
pub fn image_script() -> PathBuf {
    std::env::var_os(IMAGE_SCRIPT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s/tern-image.sh")
        })
}

/// The socket of the DaemonSet's ternd of a node, as seen from outside its mount namespace.
pub fn node_socket(node_k8s_dir: &Path) -> PathBuf {
    node_k8s_dir.join("run-tern/ternd.sock")
}

/// Checks the lab can run tern as a DaemonSet: more than one node needs the lab's etcd
/// (the nodes' `/var/lib` is private to each).
pub fn check(st: &LabState) -> Result<()> {
    if st.nodes.len() > 1 && st.store != StoreKind::Etcd {
        return Err(LabError::Invalid(format!(
            "tern as a DaemonSet on {} nodes needs a store every node reaches: use --store etcd \
             (or --host-ternd)",
            st.nodes.len()
        )));
    }
    let script = image_script();
    if !script.is_file() {
        return Err(LabError::Invalid(format!(
            "{} not found: the tern-node image is built by scripts/k8s/tern-image.sh (set \
             ${IMAGE_SCRIPT_ENV})",
            script.display()
        )));
    }
    Ok(())
}

/// Builds the tern-node image from the lab's binaries into `<cluster dir>/tern-node.tar`.
pub fn build_image(st: &LabState, k: &KubeState) -> Result<PathBuf> {
    let out = k.dir.join(IMAGE_TARBALL);
    process::run(
        Command::new("bash")
            .arg(image_script())
            .arg("--bin-dir")
            .arg(&st.bin_dir)
            .arg("--out")
            .arg(&out),
    )?;
    Ok(out)
}

/// Stops the lab's host-run ternd of every node (SIGKILL, as a crash: routes, interfaces and
/// the store's records stay for the DaemonSet's ternd to take over) and points each node's
/// socket at where the DaemonSet's ternd serves.
pub fn replace_host_agents(st: &mut LabState) -> Result<()> {
    let names: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    for n in &names {
        crate::topology::kill_agent(st, n)?;
        if let Some(x) = st.nodes.iter_mut().find(|x| &x.name == n) {
            x.socket = node_socket(&x.state_dir.join("k8s"));
        }
    }
    st.save()
}

/// Renders the manifest for this lab (its store, pool, encapsulation, BGP), applies it and
/// waits for the rollout. Returns the manifest's path.
pub fn install(st: &LabState, k: &KubeState) -> Result<PathBuf> {
    let path = k.dir.join("tern.yaml");
    let mut c = Command::new(st.bin_dir.join("ternctl"));
    c.env_remove("TERN_STORE")
        .args(["install", "manifest", "--store"])
        .arg(if st.store == StoreKind::Etcd {
            st.store_url()
        } else {
            single_node_store()
        })
        .args(["--pool", &k.cluster_cidr, "--encap", st.encap.as_str()])
        .args(["--cni-bin-dir", CNI_BIN_DIR, "--cni-conf-dir", CNI_CONF_DIR]);
    if st.agent_args.iter().any(|a| a == "--bgp") {
        c.arg("--bgp");
    }
    let yaml = process::run(&mut c)?;
    write(&path, &yaml)?;
    let p = path.display().to_string();
    kubectl(k, &["apply", "-f", &p])?;
    let timeout = format!("--timeout={}s", ROLLOUT_TIMEOUT.as_secs());
    kubectl(
        k,
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "daemonset/tern-node",
            &timeout,
        ],
    )
    .map_err(|e| {
        let pods = kubectl(
            k,
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=tern-node",
                "-o",
                "wide",
            ],
        )
        .unwrap_or_default();
        LabError::Invalid(format!(
            "the tern-node DaemonSet did not roll out: {e}\n{pods}"
        ))
    })?;
    Ok(path)
}

/// The store of a one-node SQLite lab's DaemonSet (the node's own `/var/lib/tern`).
fn single_node_store() -> String {
    "sqlite:///var/lib/tern/tern.db".to_string()
}

/// Removes the workloads while the DaemonSet's ternd still runs (their CNI DEL releases the
/// addresses), then the manifest's objects, and waits for the tern-node pods to go.
pub fn uninstall(k: &KubeState, manifest: &Path, done: &mut Vec<String>, errors: &mut Vec<String>) {
    let mut step = |args: &[&str]| match kubectl(k, args) {
        Ok(out) => {
            let n = out.lines().filter(|l| l.contains(" deleted")).count();
            if n > 0 {
                done.push(format!("kubectl {} {}: {n} deleted", args[0], args[1]));
            }
        }
        Err(e) => errors.push(e.to_string()),
    };
    // Controllers first, so the pods are not recreated.
    step(&[
        "delete",
        "deployments,replicasets,statefulsets,jobs,cronjobs,replicationcontrollers",
        "--all",
        "-A",
        "--wait=false",
    ]);
    step(&[
        "delete",
        "daemonsets",
        "-A",
        "-l",
        "k8s-app!=tern-node",
        "--wait=false",
    ]);
    step(&[
        "delete",
        "pods",
        "-A",
        "-l",
        "k8s-app!=tern-node",
        "--grace-period=1",
        "--timeout=90s",
    ]);
    let m = manifest.display().to_string();
    step(&["delete", "-f", &m, "--ignore-not-found", "--timeout=60s"]);
    // The DaemonSet's pods are removed by the garbage collector once it is gone.
    if let Err(e) = kubectl(
        k,
        &[
            "-n",
            "kube-system",
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "k8s-app=tern-node",
            "--timeout=60s",
        ],
    ) && !e.to_string().contains("no matching resources")
    {
        errors.push(e.to_string());
    }
}
