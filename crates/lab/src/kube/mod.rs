//! A real Kubernetes cluster on a lab (`ternctl lab up --kubernetes`): the components built by
//! `scripts/k8s-components.sh`, networked by tern.
//!
//! ```text
//!   tl-<lab>-cp      eth0 198.18.0.3: etcd (loopback), kube-apiserver :6443 (TLS, Node+RBAC),
//!                    kube-controller-manager (node CIDRs from tern's pool), kube-scheduler
//!   tl-<lab>-nodeN   ternd (the tern-node pod's, or the lab's), and in one private mount
//!                    namespace held by a `pause` process: containerd (CRI), kubelet
//!                    (cgroupfs, cgroup root /tl-<lab>-nodeN), kube-proxy (iptables). The
//!                    mount namespace has tmpfs over /run, /var/lib, /var/log, /opt and /tmp,
//!                    so nothing the components write by default reaches the machine; every
//!                    configured path is under /run/tern-lab/<lab>/nodeN/k8s, the CNI
//!                    directories included.
//!   root namespace   only a TCP relay on 127.0.0.1:<port> into tl-<lab>-cp:6443, for the
//!                    operator's kubectl (`export KUBECONFIG=/run/tern-lab/<lab>/kube/kubeconfig`).
//! ```
//!
//! tern is installed as a user would ([`daemonset`]): the tern-node image imported on every
//! node, `ternctl install manifest` applied with kubectl; `KubeOptions::host_ternd` keeps the
//! lab's host-run ternd (and the lab's `ternctl install-cni`) instead, for debugging. On the
//! Kubernetes datastore (the lab's `StoreKind::Kubernetes`) tern's state lives in this
//! cluster's API server from the start: no etcd of tern's and no host ternd run, and the lab
//! writes the CRDs and its default pool there once the API server is up.
//! Each node's conflist is written (by `ternctl install-cni`) only after its ternd serves, so
//! containerd reports NetworkReady, and the kubelet Ready, only once tern is ready there.
//! [`teardown`] (called by `lab down`) stops everything, removes every pod with CNI DEL while
//! ternd still runs, kills what is left in the node cgroups, removes the cgroups and restores the
//! sysctls kubelet changed.

pub mod bench;
pub mod certs;
pub mod control;
pub mod daemonset;
pub mod node;
pub mod pods;
pub mod probe;
pub mod relay;
pub mod sys;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::addon::Addon;
pub use crate::process::tail;
pub use crate::state::{KubeNode, KubeState, Proc, admin_kubeconfig_in, cluster_dir};
use crate::state::{LabState, StoreKind};
use crate::{LabError, Result, process};

/// The Kubernetes release `scripts/k8s-components.sh` builds.
pub const K8S_VERSION: &str = "v1.34.4";
/// Where `scripts/k8s-components.sh` puts the binaries by default.
pub const DEFAULT_K8S_BIN: &str = "/var/cache/tern/k8s/v1.34.4/bin";
/// Environment variable overriding [`DEFAULT_K8S_BIN`].
pub const K8S_BIN_ENV: &str = "TERN_K8S_BIN";
/// The sandbox image every node imports (built from `scripts/k8s/pause.c`).
pub const PAUSE_IMAGE: &str = "localhost/tern/pause:3.10";
/// The busybox image every node imports (`scripts/k8s/oci_image.py busybox`).
pub const BUSYBOX_IMAGE: &str = "docker.io/library/tern-busybox:1";
/// The probe image every node imports (`scripts/k8s/probe.c`: UDP echo, timed transfers).
pub const PROBE_IMAGE: &str = "localhost/tern/probe:1";
/// The image tarballs (in the images directory) every node's containerd imports.
pub const IMAGE_TARBALLS: [&str; 3] = ["pause.tar", "busybox.tar", "probe.tar"];
/// Image tarballs every node imports when they exist (built by `scripts/k8s-e2e.sh`, not
/// needed by the cluster itself).
pub const OPTIONAL_IMAGE_TARBALLS: [&str; 1] = ["agnhost.tar"];
/// The upstream e2e image (`agnhost.tar`), tagged as k8s.io/kubernetes v1.34.4's
/// test/utils/image/manifest.go names it, so the e2e specs and our tests never pull it.
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.56";
/// The Service CIDR (the first address is the `kubernetes` Service).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// ClusterIP of the `kubernetes` Service.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The IPv6 Service CIDR of a dual-stack or IPv6-only cluster (the API server's largest: a
/// /112).
pub const SERVICE_CIDR6: &str = "fd00:10:96::/112";
/// ClusterIP of the `kubernetes` Service in an IPv6-only cluster (its IPv6 address).
pub const KUBERNETES_SERVICE_IP6: &str = "fd00:10:96::1";
/// Node CIDR sizes kube-controller-manager allocates from the cluster CIDRs (`spec.podCIDRs`;
/// tern's IPAM does not use them).
pub const NODE_CIDR_MASK_V4: u8 = 24;
pub const NODE_CIDR_MASK_V6: u8 = 64;

/// The Service CIDRs of a cluster with IPv4 and/or IPv6 (`families`), IPv4 first.
pub fn service_cidrs(families: (bool, bool)) -> Vec<&'static str> {
    let (v4, v6) = families;
    [(v4, SERVICE_CIDR), (v6, SERVICE_CIDR6)]
        .into_iter()
        .filter_map(|(on, c)| on.then_some(c))
        .collect()
}
/// The API server's port in the control-plane namespace.
pub const APISERVER_PORT: u16 = 6443;
/// The binaries a cluster needs from the components directory.
pub const K8S_BINARIES: [&str; 11] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "pause",
];
/// The OCI runtime containerd's shim runs (Debian's runc).
pub const RUNC: &str = "/usr/sbin/runc";
/// Where the reference CNI plugins are installed (Debian's containernetworking-plugins).
pub const REFERENCE_CNI_DIR: &str = "/usr/lib/cni";

/// How to build the cluster.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Directory with the Kubernetes binaries (`scripts/k8s-components.sh` prints it).
    pub k8s_bin: PathBuf,
    /// How long to wait for every node to become Ready.
    pub ready_timeout: Duration,
    /// Network the nodes' containerd use instead of tern: the reference `bridge` +
    /// `host-local` plugins on each Node's podCIDR (the baseline of the start-up benchmark;
    /// no routes between nodes).
    pub reference_cni: bool,
    /// Run tern as the lab's host processes (ternd per node, `ternctl install-cni` by the
    /// lab) instead of the `tern-node` DaemonSet; for debugging ternd outside a pod.
    pub host_ternd: bool,
}

impl KubeOptions {
    /// Binaries from `$TERN_K8S_BIN` or [`DEFAULT_K8S_BIN`].
    pub fn from_env() -> KubeOptions {
        KubeOptions {
            k8s_bin: std::env::var_os(K8S_BIN_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_K8S_BIN)),
            ready_timeout: Duration::from_secs(180),
            reference_cni: false,
            host_ternd: false,
        }
    }
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p)
        .map_err(|e| LabError::io(format!("cannot create {}", p.display()), e))
}

fn write(p: &Path, text: &str) -> Result<()> {
    std::fs::write(p, text).map_err(|e| LabError::io(format!("cannot write {}", p.display()), e))
}

/// Starts `cmd` in its own process group with stdout and stderr to `log`; returns the record.
pub(crate) fn spawn(name: &str, mut cmd: Command, marker: &str, log: &Path) -> Result<Proc> {
    let child = process::spawn_logged(&mut cmd, log, true)?;
    Ok(Proc {
        name: name.to_string(),
        pid: child.id(),
        marker: marker.to_string(),
        log: log.to_path_buf(),
    })
}

/// Polls `check` every 200 ms until it returns `Some`, failing after `timeout` with `what`
/// and the output of `detail`. A `watch` process that dies fails at once.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    watch: Option<&Proc>,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if let Some(p) = watch
            && !process::is_alive(p.pid)
        {
            return Err(LabError::Invalid(format!(
                "{} exited while waiting for {what}; last log lines ({}):\n{}",
                p.name,
                p.log.display(),
                p.log_tail(25)
            )));
        }
        if start.elapsed() > timeout {
            let log = watch
                .map(|p| format!("; last lines of {}:\n{}", p.log.display(), p.log_tail(25)))
                .unwrap_or_default();
            return Err(LabError::Timeout(format!(
                "{what} (after {timeout:?}){log}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs our kubectl with the admin kubeconfig inside the control-plane namespace.
pub fn kubectl(k: &KubeState, args: &[&str]) -> Result<String> {
    let mut c = process::netns_exec(&k.cp_netns, &k.kubectl_bin());
    c.arg("--kubeconfig")
        .arg(k.admin_kubeconfig())
        .arg("--cache-dir")
        .arg(k.dir.join("kubectl-cache"))
        .args(args);
    process::run(&mut c)
}

/// The directories each node's mount namespace covers with its own (`node::HOLDER_SCRIPT`:
/// tmpfs on each, `/run/tern-lab` bound back): what lies under one of them is not there for
/// the node's kubelet, containerd and pods.
const NODE_PRIVATE_DIRS: [&str; 5] = ["/tmp", "/var/lib", "/var/log", "/opt", "/run"];

/// The node-private directory `p` lies under, if any (`p` as it resolves).
fn hidden_in_nodes(p: &Path) -> Option<&'static str> {
    let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    if p.starts_with("/run/tern-lab") {
        return None;
    }
    NODE_PRIVATE_DIRS.into_iter().find(|d| p.starts_with(d))
}

/// Checks that every binary the cluster needs is there, and where the nodes can run it; the
/// error names what is missing and how to build it.
pub fn check_binaries(k8s_bin: &Path) -> Result<()> {
    if let Some(dir) = hidden_in_nodes(k8s_bin) {
        return Err(LabError::Invalid(format!(
            "the Kubernetes components in {} cannot run on the lab's nodes: each node mounts \
             its own {dir} (as it does /tmp, /var/lib, /var/log, /opt and /run); build them \
             elsewhere (scripts/k8s-components.sh with TERN_K8S_CACHE, default /var/cache/tern)",
            k8s_bin.display()
        )));
    }
    let mut missing: Vec<String> = K8S_BINARIES
        .iter()
        .map(|b| k8s_bin.join(b))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    let images = images_dir(k8s_bin);
    for i in IMAGE_TARBALLS {
        if !images.join(i).is_file() {
            missing.push(images.join(i).display().to_string());
        }
    }
    for p in [RUNC.to_string(), format!("{REFERENCE_CNI_DIR}/loopback")] {
        if !Path::new(&p).is_file() {
            missing.push(p);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(LabError::Invalid(format!(
        "the Kubernetes components are missing: {} (build them with `bash scripts/k8s-components.sh` \
         and pass its last line as --k8s-bin-dir or ${K8S_BIN_ENV}; runc and /usr/lib/cni come \
         from scripts/deps.sh)",
        missing.join(", ")
    )))
}

/// The image directory next to a components bin directory.
pub fn images_dir(k8s_bin: &Path) -> PathBuf {
    k8s_bin
        .parent()
        .map(|p| p.join("images"))
        .unwrap_or_else(|| PathBuf::from("images"))
}

/// Builds the cluster on a running lab (its nodes' ternd already serve, unless the lab's store
/// is the Kubernetes datastore, which this brings up and bootstraps): control plane, then
/// every node, then waits until every node is Ready. The state is saved after every step, so
/// `lab down` removes a half-built cluster.
pub fn up(st: &mut LabState, opts: &KubeOptions) -> Result<()> {
    check_binaries(&opts.k8s_bin)?;
    for bin in ["ternctl", "tern", "tern-ipam"] {
        if !st.bin_dir.join(bin).is_file() {
            return Err(LabError::Invalid(format!(
                "{} not found: --kubernetes needs ternctl next to the plugins (build the workspace)",
                st.bin_dir.join(bin).display()
            )));
        }
    }
    if st.kube.is_some() {
        return Err(LabError::Invalid(format!(
            "lab {} already has a Kubernetes cluster",
            st.name
        )));
    }
    let daemonset = !opts.host_ternd && !opts.reference_cni;
    if daemonset {
        daemonset::check(st)?;
    }
    let kubernetes_store = st.store == StoreKind::Kubernetes;
    if kubernetes_store && !daemonset {
        return Err(LabError::Invalid(
            "the Kubernetes datastore needs tern as a DaemonSet (not --host-ternd or \
             --reference-cni)"
                .into(),
        ));
    }
    if opts.reference_cni && st.ip_family != crate::IpFamily::Ipv4 {
        return Err(LabError::Invalid(
            "--reference-cni builds an IPv4 network only (its bridge + host-local on the \
             nodes' IPv4 podCIDRs)"
                .into(),
        ));
    }
    let (v4, v6) = pool_cidrs(st)?;
    let (cluster_cidr, cluster_cidr6) = match (v4, v6) {
        (Some(v4), v6) => (v4, v6),
        (None, Some(v6)) => (v6, None),
        (None, None) => unreachable!("a lab has a family"),
    };
    let dir = cluster_dir(&st.dir());
    mkdir(&dir)?;
    st.kube = Some(KubeState {
        k8s_bin: opts.k8s_bin.clone(),
        images: images_dir(&opts.k8s_bin),
        dir,
        cp_netns: crate::state::ns_prefix(&st.name) + "cp",
        cluster_cidr,
        cluster_cidr6,
        reference_cni: opts.reference_cni,
        ..KubeState::default()
    });
    st.save()?;
    if daemonset {
        let k = st.kube.clone().expect("kube state set above");
        daemonset::build_image(st, &k)?;
        // The manifest's path marks the mode before anything is applied, so `lab down`
        // removes a half-installed DaemonSet the same way.
        let path = k.dir.join("tern.yaml");
        if let Some(k) = st.kube.as_mut() {
            k.manifest = Some(path);
        }
        st.save()?;
    }
    control::up(st)?;
    if kubernetes_store {
        // The store exists now: what `topology::up` writes into any other store.
        bootstrap_store(st)?;
    }
    let names: Vec<String> = st.nodes.iter().map(|n| n.name.clone()).collect();
    if daemonset {
        // No host ternd (on the Kubernetes datastore none was started): the DaemonSet's takes
        // over each node's routes and records.
        daemonset::replace_host_agents(st)?;
    }
    for n in &names {
        node::up(st, n)?;
    }
    let k = st.kube.clone().expect("kube state set above");
    if daemonset {
        daemonset::install(st, &k)?;
    }
    for n in &names {
        node::wait_ready(&k, n, opts.ready_timeout)?;
    }
    Ok(())
}

/// Writes tern's starting state into the Kubernetes datastore, the lab's store, once the API
/// server runs: tern's CustomResourceDefinitions (`tern_store::kube::crds_yaml`, applied and
/// Established) and the lab's default IPPools (one per family), as `topology::up` applies it to an etcd or
/// SQLite store before any agent starts. The rest (the cluster ID, Nodes, blocks) is the
/// DaemonSet's ternd's to write, as on any new store.
fn bootstrap_store(st: &LabState) -> Result<()> {
    let k = st.kube.as_ref().expect("cluster state");
    let crds = k.dir.join("tern-crds.yaml");
    write(&crds, &tern_store::kube::crds_yaml())?;
    kubectl(k, &["apply", "-f", &crds.display().to_string()])?;
    kubectl(
        k,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
    )?;
    // Through the KubeStore on the admin kubeconfig, from the control plane's namespace.
    for cidr in k.cluster_cidrs() {
        crate::cluster::apply_default_pool(st, cidr)?;
    }
    Ok(())
}

/// The lab's pool CIDR of each of its families, IPv4 then IPv6 (what the lab applied; see
/// `cluster::apply_default_pool`). The Kubernetes datastore does not exist yet: the CIDRs the
/// lab will apply there.
fn pool_cidrs(st: &LabState) -> Result<(Option<String>, Option<String>)> {
    let (has_v4, has_v6) = (st.ip_family.has_v4(), st.ip_family.has_v6());
    let default4 = || {
        st.pool_cidr
            .clone()
            .unwrap_or_else(|| tern_model::defaults::IPV4_POOL.to_string())
    };
    let default6 = || {
        st.pool6_cidr
            .clone()
            .unwrap_or_else(|| tern_model::defaults::IPV6_POOL.to_string())
    };
    if st.store == StoreKind::Kubernetes {
        return Ok((has_v4.then(default4), has_v6.then(default6)));
    }
    let pools = crate::cluster::with_store(st, |s| {
        tern_model::list_resources(&*s, tern_model::Kind::IpPool)
            .map_err(|e| LabError::Invalid(format!("cannot list IPPools: {e}")))
    })?;
    let find = |v6: bool| {
        pools.iter().find_map(|p| match p {
            tern_model::Resource::IpPool(p) if p.spec.cidr.contains(':') == v6 => {
                Some(p.spec.cidr.clone())
            }
            _ => None,
        })
    };
    Ok((
        has_v4.then(|| find(false).unwrap_or_else(default4)),
        has_v6.then(|| find(true).unwrap_or_else(default6)),
    ))
}

/// The cluster as the base lab's add-on ([`Addon`]): what `lab node add`/`node del`, `lab
/// down` and `lab status` do for it ([`crate::ops`] hands it to [`crate::topology`]). Each
/// step does nothing on a lab without a cluster.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cluster;

impl Addon for Cluster {
    fn check_node_add(&self, st: &LabState) -> Result<()> {
        check_node_add(st)
    }

    fn node_joined(&self, st: &mut LabState, node: &str) -> Result<()> {
        node_joined(st, node)
    }

    fn node_leaving(&self, st: &mut LabState, node: &str, done: &mut Vec<String>) -> Result<()> {
        node_leaving(st, node, done)
    }

    fn teardown(&self, st: &mut LabState, done: &mut Vec<String>, errors: &mut Vec<String>) {
        teardown(st, done, errors)
    }

    fn sweep(&self, name: &str, done: &mut Vec<String>, errors: &mut Vec<String>) {
        sweep_cgroups(name, done, errors)
    }

    fn agent_status(&self, st: &LabState) -> Option<String> {
        agent_status(st)
    }

    fn status(&self, st: &LabState) -> String {
        st.kube.as_ref().map(status).unwrap_or_default()
    }
}

/// Stops and removes the cluster of a lab (idempotent; errors collected). Runs before the
/// lab's ternd are stopped, so pod removal still releases their addresses.
pub fn teardown(st: &mut LabState, done: &mut Vec<String>, errors: &mut Vec<String>) {
    let Some(mut k) = st.kube.clone() else {
        return;
    };
    if let Some(r) = k.relay.take()
        && process::stop(r.pid, &r.marker, Duration::from_secs(2))
    {
        done.push(format!("stopped the kubectl relay {}", r.pid));
    }
    if let Some(m) = &k.manifest
        && m.is_file()
        && k.control.iter().any(Proc::alive)
    {
        daemonset::uninstall(&k, m, done, errors);
    }
    for n in k.nodes.clone() {
        node::teardown(&k, &n, done, errors);
    }
    control::teardown(&k, done);
    match sys::restore_sysctls(&k.saved_sysctls, &st.name) {
        Ok(d) => done.extend(d),
        Err(e) => errors.push(e.to_string()),
    }
    k.nodes.clear();
    k.control.clear();
    st.kube = None;
    if let Err(e) = st.save() {
        errors.push(e.to_string());
    }
}

/// Checks that a node can join this lab's cluster (nothing to check for other labs), before
/// anything of it is created: with tern as a DaemonSet every node's ternd must reach one
/// store, which a SQLite lab keeps in its single node's private `/var/lib/tern`.
pub fn check_node_add(st: &LabState) -> Result<()> {
    match &st.kube {
        Some(k)
            if k.manifest.is_some()
                && !matches!(st.store, StoreKind::Etcd | StoreKind::Kubernetes) =>
        {
            Err(LabError::Invalid(format!(
                "lab {} runs tern as a DaemonSet with the {} store of its first node; a node \
                 can join only a lab on the Kubernetes datastore or --store etcd (or \
                 --host-ternd)",
                st.name,
                st.store_url()
            )))
        }
        _ => Ok(()),
    }
}

/// How long a joining node has to become Ready: containerd, kubelet, kube-proxy and, with the
/// DaemonSet, the tern-node pod's init containers and ternd's readiness.
pub const NODE_JOIN_TIMEOUT: Duration = Duration::from_secs(180);

/// Brings a node that joined a Kubernetes lab into the cluster (nothing for other labs) and
/// waits until it is Ready. With tern as a DaemonSet the lab's host ternd of the new node is
/// replaced by the tern-node pod the DaemonSet controller starts there once the kubelet
/// registered (the node's socket then points at that pod's ternd), as at `lab up`; Ready
/// then means that pod's ternd answered `/readiness` and its conflist is in place.
pub fn node_joined(st: &mut LabState, node: &str) -> Result<()> {
    let Some(k) = st.kube.clone() else {
        return Ok(());
    };
    if k.manifest.is_some() {
        daemonset::replace_host_agent(st, node)?;
    }
    node::up(st, node)?;
    let k = st.kube.clone().expect("checked above");
    node::wait_ready(&k, node, NODE_JOIN_TIMEOUT)?;
    if k.manifest.is_some() {
        // Ready already implies the conflist; this names the pod in the error otherwise.
        daemonset::wait_node_pod(&k, node, NODE_JOIN_TIMEOUT)?;
    }
    Ok(())
}

/// Takes a leaving node out of a Kubernetes lab (nothing for other labs): deletes its Node
/// object, stops its components (removing its pods through the CRI) and removes its cgroups.
pub fn node_leaving(st: &mut LabState, node: &str, done: &mut Vec<String>) -> Result<()> {
    let Some(k) = st.kube.clone() else {
        return Ok(());
    };
    let Ok(kn) = k.node(node).cloned() else {
        return Ok(());
    };
    let out = kubectl(
        &k,
        &["delete", "node", node, "--ignore-not-found", "--wait=false"],
    )?;
    if !out.trim().is_empty() {
        done.push(out.trim().to_string());
    }
    let mut errors = Vec::new();
    node::teardown(&k, &kn, done, &mut errors);
    // The node's pods stay in the API after its Node object and kubelet are gone, until the
    // PodGC controller collects orphans (a 40 s quarantine, then its 20 s loop); a teardown
    // sooner than that waits on a pod no kubelet will confirm (the DaemonSet's tern-node pod:
    // `daemonset::uninstall`'s `kubectl wait --for=delete`). Their containers were stopped
    // above, so they are removed from the API now, as an operator does after removing a node.
    let selector = format!("spec.nodeName={node}");
    match kubectl(
        &k,
        &[
            "delete",
            "pods",
            "-A",
            "--field-selector",
            &selector,
            "--force",
            "--grace-period=0",
            "--wait=false",
        ],
    ) {
        Ok(out) if !out.trim().is_empty() => done.push(format!(
            "removed the pods of {node} from the API: {}",
            out.trim().replace('\n', "; ")
        )),
        Ok(_) => {}
        Err(e) => errors.push(format!("removing the pods of {node} from the API: {e}")),
    }
    if let Some(k) = st.kube.as_mut() {
        k.nodes.retain(|n| n.name != node);
    }
    st.save()?;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(LabError::Invalid(format!(
            "removing {node} from the cluster: {}",
            errors.join("; ")
        )))
    }
}

/// Removes cgroups of lab `name` that no state file recorded (a crash before it was saved).
pub fn sweep_cgroups(name: &str, done: &mut Vec<String>, errors: &mut Vec<String>) {
    for cg in sys::with_prefix(&crate::state::ns_prefix(name)) {
        match sys::remove(&cg) {
            Ok(d) => done.extend(d),
            Err(e) => errors.push(e.to_string()),
        }
    }
}

/// The agent part of a node's `lab status` line when tern runs as the DaemonSet (the lab
/// starts no ternd there); `None` otherwise.
pub fn agent_status(st: &LabState) -> Option<String> {
    st.kube
        .as_ref()
        .filter(|k| k.manifest.is_some())
        .map(|_| "ternd in the tern-node DaemonSet (see below)".to_string())
}

/// Lines for `lab status`.
pub fn status(k: &KubeState) -> String {
    let mut out = format!(
        "kubernetes {K8S_VERSION}  control plane netns {} eth0 {}  pods {}  services {}\n",
        k.cp_netns,
        k.cp_address,
        k.cluster_cidrs().join(","),
        service_cidrs(k.families()).join(",")
    );
    for p in &k.control {
        out.push_str(&format!(
            "  {} pid {} {}\n",
            p.name,
            p.pid,
            if p.alive() { "running" } else { "NOT running" }
        ));
    }
    for n in &k.nodes {
        let procs: Vec<String> = n
            .procs
            .iter()
            .map(|p| {
                format!(
                    "{} {}{}",
                    p.name,
                    p.pid,
                    if p.alive() { "" } else { " (dead)" }
                )
            })
            .collect();
        out.push_str(&format!("  {}: {}\n", n.name, procs.join(", ")));
    }
    if k.manifest.is_some() {
        if k.control
            .iter()
            .any(|p| p.name == "kube-apiserver" && p.alive())
        {
            out.push_str(&daemonset::status(k));
        } else {
            out.push_str("  tern-node pods: unknown, the API server is NOT running\n");
        }
    }
    if k.relay_port.is_some() {
        out.push_str(&format!("export KUBECONFIG={}\n", k.kubeconfig().display()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_under_a_node_private_directory_are_refused() {
        for p in [
            "/tmp/cache/k8s/v1/bin",
            "/var/lib/x/bin",
            "/run/k8s/bin",
            "/opt/k8s/bin",
        ] {
            let e = check_binaries(Path::new(p)).unwrap_err().to_string();
            assert!(e.contains("cannot run on the lab's nodes"), "{p}: {e}");
            assert!(e.contains(p), "{p}: {e}");
        }
        assert_eq!(hidden_in_nodes(Path::new("/run/tern-lab/x/bin")), None);
        assert_eq!(
            hidden_in_nodes(Path::new("/var/cache/tern/k8s/v1/bin")),
            None
        );
        assert_eq!(hidden_in_nodes(Path::new("/tmpfoo/bin")), None);
    }
}
