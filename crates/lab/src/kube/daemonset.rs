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

use super::pods::TERN_NODE_PODS;
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

/// Checks the lab can run tern as a DaemonSet: more than one node needs the Kubernetes
/// datastore or the lab's etcd (the nodes' `/var/lib` is private to each).
pub fn check(st: &LabState) -> Result<()> {
    if st.nodes.len() > 1 && !matches!(st.store, StoreKind::Etcd | StoreKind::Kubernetes) {
        return Err(LabError::Invalid(format!(
            "tern as a DaemonSet on {} nodes needs a store every node reaches: the Kubernetes \
             datastore (the default), --store etcd, or --host-ternd",
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
        replace_host_agent(st, n)?;
    }
    Ok(())
}

/// [`replace_host_agents`] for one node (one joining a running lab).
pub fn replace_host_agent(st: &mut LabState, node: &str) -> Result<()> {
    crate::topology::kill_agent(st, node)?;
    if let Some(x) = st.nodes.iter_mut().find(|x| x.name == node) {
        x.socket = node_socket(&x.state_dir.join("k8s"));
    }
    st.save()
}

/// One tern-node pod as `kubectl` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePod {
    /// The node it runs on.
    pub node: String,
    /// The pod's name.
    pub name: String,
    /// Its phase (`Pending`, `Running`, ...).
    pub phase: String,
    /// Containers ready, of all its containers (ternd and cni-conf).
    pub ready: (usize, usize),
    /// Restarts of its containers, summed.
    pub restarts: u64,
}

impl NodePod {
    /// Running with every container ready.
    pub fn healthy(&self) -> bool {
        self.phase == "Running" && self.ready.1 > 0 && self.ready.0 == self.ready.1
    }
}

/// The jsonpath of [`node_pods`]: node, pod, phase, readiness and restarts of each container.
const NODE_PODS_JSONPATH: &str = r#"jsonpath={range .items[*]}{.spec.nodeName}|{.metadata.name}|{.status.phase}|{.status.containerStatuses[*].ready}|{.status.containerStatuses[*].restartCount}{"\n"}{end}"#;

/// Parses the output of [`NODE_PODS_JSONPATH`].
fn parse_node_pods(out: &str) -> Vec<NodePod> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let [node, name, phase, ready, restarts] = f[..] else {
                return None;
            };
            let ready: Vec<&str> = ready.split_whitespace().collect();
            Some(NodePod {
                node: node.to_string(),
                name: name.to_string(),
                phase: phase.to_string(),
                ready: (ready.iter().filter(|r| **r == "true").count(), ready.len()),
                restarts: restarts
                    .split_whitespace()
                    .filter_map(|r| r.parse::<u64>().ok())
                    .sum(),
            })
        })
        .collect()
}

/// The tern-node pods of the cluster, from the API server.
pub fn node_pods(k: &KubeState) -> Result<Vec<NodePod>> {
    // `--request-timeout`: `lab status` must not hang on an API server that does not answer.
    let out = kubectl(
        k,
        &[
            &["--request-timeout=5s"],
            TERN_NODE_PODS,
            &["-o", NODE_PODS_JSONPATH],
        ]
        .concat(),
    )?;
    Ok(parse_node_pods(&out))
}

/// Waits until the tern-node pod of `node` runs with every container ready.
pub fn wait_node_pod(k: &KubeState, node: &str, timeout: Duration) -> Result<NodePod> {
    super::wait_for(
        &format!("the tern-node pod of {node} Running and ready"),
        timeout,
        None,
        || {
            node_pods(k)
                .ok()?
                .into_iter()
                .find(|p| p.node == node && p.healthy())
        },
    )
}

/// ternd's `/readiness` on a node (its health listener on the node's 127.0.0.1:9099, the
/// manifest's `TERN_HEALTH_ADDR`): `Ok("ready")`, or the reasons it gives or why it cannot
/// be asked.
pub fn ternd_readiness(netns: &str) -> std::result::Result<String, String> {
    let mut c = process::netns_exec(netns, Path::new("curl"));
    c.args(["-s", "--max-time", "3", "-w", "\n%{http_code}"])
        .arg("http://127.0.0.1:9099/readiness");
    match c.output() {
        Err(e) => Err(format!("cannot run curl: {e}")),
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
            match code.trim() {
                "200" => Ok(body.trim().to_string()),
                "000" | "" => Err("no answer on 127.0.0.1:9099".to_string()),
                c => Err(format!("HTTP {c}: {}", body.trim().replace('\n', "; "))),
            }
        }
    }
}

/// `lab status` lines of the DaemonSet: per node its tern-node pod (phase, containers ready,
/// restarts) and what its ternd answers on `/readiness`; a node without a pod says so.
pub fn status(k: &KubeState) -> String {
    let pods = match node_pods(k) {
        Ok(p) => p,
        Err(e) => return format!("  tern-node pods: cannot ask the API server: {e}\n"),
    };
    let mut out = String::new();
    for n in &k.nodes {
        let pod = match pods.iter().find(|p| p.node == n.name) {
            Some(p) => format!(
                "{} {} ({}/{} ready, {} restarts)",
                p.name, p.phase, p.ready.0, p.ready.1, p.restarts
            ),
            None => "NO tern-node pod".to_string(),
        };
        let health = match ternd_readiness(&n.netns) {
            Ok(r) => format!("ternd {r}"),
            Err(e) => format!("ternd NOT ready: {e}"),
        };
        out.push_str(&format!("  {}: tern-node pod {pod}; {health}\n", n.name));
    }
    out
}

/// Renders the manifest for this lab (its store and its TLS files, pool, encapsulation, BGP),
/// applies it and waits for the rollout. Returns the manifest's path.
pub fn install(st: &LabState, k: &KubeState) -> Result<PathBuf> {
    let path = k.dir.join("tern.yaml");
    let mut c = Command::new(st.bin_dir.join("ternctl"));
    c.env_remove("TERN_STORE")
        .env_remove("TERN_ETCD_CA")
        .env_remove("TERN_ETCD_CERT")
        .env_remove("TERN_ETCD_KEY")
        .args(["install", "manifest", "--store"])
        .arg(match st.store {
            StoreKind::Etcd => st.store_url(),
            // In the pods: the API server of their service account.
            StoreKind::Kubernetes => "kubernetes".to_string(),
            StoreKind::Sqlite => single_node_store(),
        })
        .args(pool_args(k))
        .args(["--encap", st.encap.as_str()])
        .args(["--cni-bin-dir", CNI_BIN_DIR, "--cni-conf-dir", CNI_CONF_DIR])
        // A TLS etcd: the client's files go into the manifest's Secret tern-etcd-certs.
        .args(st.store_tls_args());
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
        let pods = kubectl(k, &[TERN_NODE_PODS, &["-o", "wide"]].concat()).unwrap_or_default();
        LabError::Invalid(format!(
            "the tern-node DaemonSet did not roll out: {e}\n{pods}"
        ))
    })?;
    Ok(path)
}

/// `ternctl install manifest`'s pool arguments for the cluster's families: `--pool` (IPv4),
/// `--ipv6-pool` (dual stack, IPv6 only) and `--no-ipv4-pool` (IPv6 only).
fn pool_args(k: &KubeState) -> Vec<String> {
    let mut a = Vec::new();
    for cidr in k.cluster_cidrs() {
        let flag = if cidr.contains(':') {
            "--ipv6-pool"
        } else {
            "--pool"
        };
        a.extend([flag.to_string(), cidr.to_string()]);
    }
    if !k.families().0 {
        a.push("--no-ipv4-pool".to_string());
    }
    a
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
    // Not waited for: the CRDs' deletion waits for the API server to remove every tern.dev
    // object, which the cluster's teardown makes moot (it timed out once at 60 s on a loaded
    // machine); what must be gone before the nodes stop is the DaemonSet's pods, below.
    step(&["delete", "-f", &m, "--ignore-not-found", "--wait=false"]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_of_each_family_go_into_the_manifest() {
        let mut k = KubeState {
            cluster_cidr: "10.244.0.0/16".into(),
            ..KubeState::default()
        };
        assert_eq!(pool_args(&k), ["--pool", "10.244.0.0/16"]);
        k.cluster_cidr6 = Some("fd00:10:244::/48".into());
        assert_eq!(
            pool_args(&k),
            ["--pool", "10.244.0.0/16", "--ipv6-pool", "fd00:10:244::/48"]
        );
        k.cluster_cidr = "fd00:10:244::/48".into();
        k.cluster_cidr6 = None;
        assert_eq!(
            pool_args(&k),
            ["--ipv6-pool", "fd00:10:244::/48", "--no-ipv4-pool"]
        );
    }

    #[test]
    fn node_pods_are_parsed_from_kubectl() {
        let out = "node1|tern-node-abcde|Running|true true|0 2\n\
                   node2|tern-node-fghij|Pending|false false|0 0\n\
                   node3|tern-node-klmno|Pending||\n\
                   garbage\n";
        let p = parse_node_pods(out);
        assert_eq!(p.len(), 3);
        assert_eq!(
            p[0],
            NodePod {
                node: "node1".into(),
                name: "tern-node-abcde".into(),
                phase: "Running".into(),
                ready: (2, 2),
                restarts: 2,
            }
        );
        assert!(p[0].healthy());
        assert_eq!(p[1].ready, (0, 2));
        assert!(!p[1].healthy());
        assert_eq!(p[2].ready, (0, 0));
        assert!(
            !p[2].healthy(),
            "a pod with no container status is not healthy"
        );
    }
}
