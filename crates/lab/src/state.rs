//! The lab's state file: what was created, so that it can be removed again. Written after
//! every step (atomically: temp file + rename), so a crash or failure mid-way leaves an accurate
//! record for `down`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{LabError, RUN_DIR, Result};

/// Client port of the lab's etcd.
pub const ETCD_CLIENT_PORT: u16 = 2379;

/// Longest accepted lab name; keeps namespace and file names short.
pub const MAX_NAME_LEN: usize = 12;

/// Everything a lab consists of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    /// The lab's name (`lab` by default).
    pub name: String,
    /// Directory with the binaries `tern`, `tern-ipam` and `ternd` used by this lab.
    pub bin_dir: PathBuf,
    /// Every network namespace created for the lab, in creation order (pods excluded).
    pub namespaces: Vec<String>,
    /// The nodes.
    pub nodes: Vec<NodeState>,
    /// The pods.
    pub pods: Vec<PodState>,
    /// Echo servers started in pods.
    pub servers: Vec<ServerState>,
    /// How pod traffic crosses the underlay (labs from before multi-node default to `none`).
    #[serde(default)]
    pub encap: Encap,
    /// Which datastore the agents share.
    #[serde(default)]
    pub store: StoreKind,
    /// The etcd server, when `store` is etcd.
    #[serde(default)]
    pub etcd: Option<EtcdState>,
    /// Extra arguments given to every `ternd` (also to nodes added later).
    #[serde(default)]
    pub agent_args: Vec<String>,
    /// Highest node index ever used: a joining node never reuses a departed node's name and
    /// address, so no stale neighbour entry elsewhere can point at it.
    #[serde(default)]
    pub last_node_index: usize,
    /// The Kubernetes cluster on this lab (`lab up --kubernetes`), when there is one.
    #[serde(default)]
    pub kube: Option<KubeState>,
    /// CIDR of the lab's default IPPool ([`crate::cluster::apply_default_pool`]): applied by
    /// `up`, or, on the Kubernetes datastore, by `kube::up` once the API server runs. `None`
    /// in state files from before it was recorded.
    #[serde(default)]
    pub pool_cidr: Option<String>,
    /// The address families of the underlay and the pools (state files from before it was
    /// recorded are IPv4 labs).
    #[serde(default)]
    pub ip_family: IpFamily,
    /// CIDR of the lab's default IPv6 IPPool, when the lab has IPv6 (`ip_family` ipv6 or dual).
    #[serde(default)]
    pub pool6_cidr: Option<String>,
}

/// The address families of a lab (`lab up --ip-family`): its underlay, its pools, its pods.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// IPv4 underlay (198.18.0.0/15) and an IPv4 pool.
    #[default]
    Ipv4,
    /// IPv6 underlay (2001:db8::/32) and an IPv6 pool only.
    Ipv6,
    /// Both underlays and both pools: every pod gets an address of each family.
    Dual,
}

impl IpFamily {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
            IpFamily::Dual => "dual",
        }
    }

    /// Whether the lab has IPv4 (underlay, pool, pod addresses).
    pub fn has_v4(self) -> bool {
        self != IpFamily::Ipv6
    }

    /// Whether the lab has IPv6 (underlay, pool, pod addresses).
    pub fn has_v6(self) -> bool {
        self != IpFamily::Ipv4
    }

    /// Whether the lab has the family `v6` (`true`: IPv6, `false`: IPv4).
    pub fn has(self, v6: bool) -> bool {
        if v6 { self.has_v6() } else { self.has_v4() }
    }

    /// The lab's families as `v6` flags, IPv4 first.
    pub fn families(self) -> Vec<bool> {
        [false, true]
            .into_iter()
            .filter(|v6| self.has(*v6))
            .collect()
    }
}

/// `IPv4` or `IPv6` (`v6`), for messages.
pub fn family_name(v6: bool) -> &'static str {
    if v6 { "IPv6" } else { "IPv4" }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `host:port`, with the host in brackets when it is an IPv6 address (`[2001:db8::2]:2379`).
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How pod traffic between nodes is carried; set by the lab's default IPPool.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Encap {
    /// Plain routing over the shared underlay subnet (`vxlanMode`/`ipipMode` Never).
    #[default]
    None,
    /// VXLAN between every pair of nodes (`vxlanMode: Always`).
    Vxlan,
    /// IP-in-IP between every pair of nodes (`ipipMode: Always`).
    Ipip,
    /// Two underlay subnets joined by a router; VXLAN only between nodes of different
    /// subnets (`vxlanMode: CrossSubnet`).
    Crosssubnet,
}

impl Encap {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Encap::None => "none",
            Encap::Vxlan => "vxlan",
            Encap::Ipip => "ipip",
            Encap::Crosssubnet => "crosssubnet",
        }
    }

    /// `(vxlanMode, ipipMode)` of the lab's default IPPool.
    pub fn pool_modes(self) -> (tern_model::EncapMode, tern_model::EncapMode) {
        use tern_model::EncapMode::{Always, CrossSubnet, Never};
        match self {
            Encap::None => (Never, Never),
            Encap::Vxlan => (Always, Never),
            Encap::Ipip => (Never, Always),
            Encap::Crosssubnet => (CrossSubnet, Never),
        }
    }
}

impl std::fmt::Display for Encap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The datastore kind of a lab.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// One SQLite file in the lab directory, shared by the nodes (they share a host).
    #[default]
    Sqlite,
    /// An `etcd` server in a namespace of its own on the underlay.
    Etcd,
    /// The lab's Kubernetes API server (tern's custom resources; `--kubernetes` with tern as
    /// its DaemonSet only). No etcd of tern's runs: the lab writes tern's state into the API
    /// server once that runs (`kube::up`), and runs no host ternd.
    Kubernetes,
}

impl StoreKind {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Etcd => "etcd",
            StoreKind::Kubernetes => "kubernetes",
        }
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The lab's etcd server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdState {
    /// Its namespace.
    pub netns: String,
    /// Its underlay address (clients use `<address>:2379`).
    pub address: String,
    /// Its PID, once started.
    pub pid: Option<u32>,
    /// Its data directory (inside the lab directory; also identifies the process as ours).
    pub data_dir: PathBuf,
    /// The client's files when it serves over TLS and requires client certificates
    /// (`lab up --etcd-tls`); `None`: plain http.
    #[serde(default)]
    pub tls: Option<EtcdTlsFiles>,
}

/// The PEM files a client of the lab's TLS etcd uses (under `<lab dir>/etcd-pki`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdTlsFiles {
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    /// The client certificate (etcd runs with `--client-cert-auth`).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// One node: a namespace running `ternd`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// Node name as the agent knows it (`node1`).
    pub name: String,
    /// The node's network namespace.
    pub netns: String,
    /// Underlay address of the node's `eth0`.
    pub address: String,
    /// PID of the node's `ternd`, once started.
    pub ternd_pid: Option<u32>,
    /// The agent's socket.
    pub socket: PathBuf,
    /// The agent's state directory (also holds `ternd.log`).
    pub state_dir: PathBuf,
    /// The node's default gateway on the underlay.
    #[serde(default)]
    pub gateway: String,
    /// Prefix length of the node's underlay subnet.
    #[serde(default)]
    pub prefix_len: u8,
    /// The node's IPv6 underlay address in a dual-stack lab (in an IPv6-only lab, `address`
    /// is IPv6 and this is `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address6: Option<String>,
}

impl NodeState {
    /// The node's underlay addresses: `address`, then `address6` when there is one.
    pub fn addresses(&self) -> Vec<&str> {
        std::iter::once(self.address.as_str())
            .chain(self.address6.as_deref())
            .collect()
    }

    /// The node's underlay address of `v6`'s family, if it has one.
    pub fn address_of(&self, v6: bool) -> Option<&str> {
        self.addresses().into_iter().find(|a| a.contains(':') == v6)
    }
}

/// One pod: a namespace whose `eth0` was set up by the `tern` plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    /// Pod name (`K8S_POD_NAME`).
    pub name: String,
    /// The node whose agent serves the pod.
    pub node: String,
    /// The pod's network namespace.
    pub netns: String,
    /// `CNI_CONTAINERID` used for ADD and DEL.
    pub container_id: String,
    /// Addresses from the CNI result, without prefix length; empty until ADD succeeded.
    pub addresses: Vec<String>,
}

/// An echo server (`ternctl lab serve`) running in a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerState {
    /// The pod it runs in.
    pub pod: String,
    /// Its PID.
    pub pid: u32,
    /// TCP port, if serving TCP.
    pub tcp: Option<u16>,
    /// UDP port, if serving UDP.
    pub udp: Option<u16>,
    /// File the server creates once it listens; also identifies the process as ours.
    pub ready_file: PathBuf,
}

/// Checks a lab name: 1 to [`MAX_NAME_LEN`] lowercase letters and digits. No `-`, so the
/// prefix `tl-<lab>-` can never match another lab's namespaces.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(LabError::Invalid(format!(
            "invalid lab name {name:?}: use 1 to {MAX_NAME_LEN} lowercase letters or digits"
        )))
    }
}

/// Checks a pod name: a DNS label (lowercase letters, digits, `-`), at most 30 characters.
pub fn validate_pod_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 30
        && !name.starts_with('-')
        && !name.ends_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LabError::Invalid(format!(
            "invalid pod name {name:?}: use up to 30 lowercase letters, digits or '-'"
        )))
    }
}

/// Prefix of every namespace of lab `name`.
pub fn ns_prefix(name: &str) -> String {
    format!("tl-{name}-")
}

/// Namespace of the underlay.
pub fn underlay_ns(name: &str) -> String {
    format!("{}ul", ns_prefix(name))
}

/// Namespace of a node.
pub fn node_ns(name: &str, node: &str) -> String {
    format!("{}{node}", ns_prefix(name))
}

/// Namespace of a pod.
pub fn pod_ns(name: &str, pod: &str) -> String {
    format!("{}pod-{pod}", ns_prefix(name))
}

/// Namespace of the router joining the two subnets of a cross-subnet lab.
pub fn router_ns(name: &str) -> String {
    format!("{}rtr", ns_prefix(name))
}

/// Namespace of the lab's etcd.
pub fn etcd_ns(name: &str) -> String {
    format!("{}etcd", ns_prefix(name))
}

/// Directory of lab `name` under `run_dir`.
pub fn lab_dir_in(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(name)
}

/// Directory of lab `name` under [`RUN_DIR`].
pub fn lab_dir(name: &str) -> PathBuf {
    lab_dir_in(Path::new(RUN_DIR), name)
}

impl LabState {
    /// An empty state for lab `name`.
    pub fn new(name: &str, bin_dir: &Path) -> LabState {
        LabState {
            name: name.to_string(),
            bin_dir: bin_dir.to_path_buf(),
            ..LabState::default()
        }
    }

    /// The lab's directory.
    pub fn dir(&self) -> PathBuf {
        lab_dir(&self.name)
    }

    /// The store URL shared by the lab's agents. An etcd URL is only reachable from inside
    /// the lab's namespaces (see [`crate::cluster::with_store`]).
    pub fn store_url(&self) -> String {
        match (&self.store, &self.etcd, &self.kube) {
            (StoreKind::Etcd, Some(e), _) => {
                format!("etcd://{}", host_port(&e.address, ETCD_CLIENT_PORT))
            }
            // The admin kubeconfig names the API server's underlay address: reachable from the
            // lab's namespaces. Its path is known before the cluster is built.
            (StoreKind::Kubernetes, _, k) => {
                let admin = match k {
                    Some(k) => k.admin_kubeconfig(),
                    None => admin_kubeconfig_in(&cluster_dir(&self.dir())),
                };
                format!("kubernetes://{}", admin.display())
            }
            _ => format!("sqlite://{}", self.dir().join("store.db").display()),
        }
    }

    /// The client TLS files of the lab's store, when it is an etcd served over TLS.
    pub fn store_tls(&self) -> Option<&EtcdTlsFiles> {
        match (&self.store, &self.etcd) {
            (StoreKind::Etcd, Some(e)) => e.tls.as_ref(),
            _ => None,
        }
    }

    /// `--etcd-ca CA --etcd-cert CERT --etcd-key KEY` for ternd and ternctl when the store is
    /// served over TLS ([`LabState::store_tls`]); nothing otherwise.
    pub fn store_tls_args(&self) -> Vec<std::ffi::OsString> {
        let Some(t) = self.store_tls() else {
            return Vec::new();
        };
        let mut v = Vec::new();
        for (flag, path) in [
            ("--etcd-ca", &t.ca),
            ("--etcd-cert", &t.cert),
            ("--etcd-key", &t.key),
        ] {
            v.push(flag.into());
            v.push(path.clone().into_os_string());
        }
        v
    }

    /// Finds a node by name.
    pub fn node(&self, name: &str) -> Result<&NodeState> {
        self.nodes.iter().find(|n| n.name == name).ok_or_else(|| {
            let names: Vec<_> = self.nodes.iter().map(|n| n.name.as_str()).collect();
            LabError::Invalid(format!(
                "lab {:?} has no node {name:?} (nodes: {})",
                self.name,
                names.join(", ")
            ))
        })
    }

    /// Finds a pod by name.
    pub fn pod(&self, name: &str) -> Result<&PodState> {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| LabError::Invalid(format!("lab {:?} has no pod {name:?}", self.name)))
    }

    /// Reads the state file at `path`.
    pub fn load_from(path: &Path) -> Result<LabState> {
        let text = std::fs::read_to_string(path).map_err(|e| LabError::State {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| LabError::State {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// Reads the state of lab `name`; `None` when no such lab exists.
    pub fn load(name: &str) -> Result<Option<LabState>> {
        validate_name(name)?;
        let path = lab_dir(name).join("state.json");
        if !path.exists() {
            return Ok(None);
        }
        LabState::load_from(&path).map(Some)
    }

    /// Writes the state to `path` atomically.
    pub fn save_to(&self, path: &Path) -> Result<()> {
        let err = |message: String| LabError::State {
            path: path.to_path_buf(),
            message,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| err(e.to_string()))?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| err(e.to_string()))?;
        tmp.write_all(&json).map_err(|e| err(e.to_string()))?;
        tmp.persist(path).map_err(|e| err(e.to_string()))?;
        Ok(())
    }

    /// Writes the state to the lab's `state.json`.
    pub fn save(&self) -> Result<()> {
        self.save_to(&self.dir().join("state.json"))
    }
}

/// The cluster part of a lab's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeState {
    /// Directory with the Kubernetes binaries.
    pub k8s_bin: PathBuf,
    /// Directory with the image tarballs (`pause.tar`, `busybox.tar`).
    pub images: PathBuf,
    /// The cluster's directory (`<lab dir>/kube`): PKI, kubeconfigs, control-plane data, logs.
    pub dir: PathBuf,
    /// The control plane's namespace.
    pub cp_netns: String,
    /// The control plane's underlay address.
    pub cp_address: String,
    /// The pod CIDR given to kube-controller-manager and kube-proxy (tern's pool): the IPv4
    /// pool's, or in an IPv6-only cluster the IPv6 pool's.
    pub cluster_cidr: String,
    /// The IPv6 pool's CIDR of a dual-stack cluster (after `cluster_cidr` wherever both are
    /// given); `None` in a single-stack one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_cidr6: Option<String>,
    /// Control-plane processes by component name (`etcd`, `kube-apiserver`, ...).
    pub control: Vec<Proc>,
    /// The relay for the operator's kubectl.
    pub relay: Option<Proc>,
    /// Its port on 127.0.0.1.
    pub relay_port: Option<u16>,
    /// Values of [`crate::kube::sys::KUBELET_SYSCTLS`] before the first kubelet started.
    pub saved_sysctls: Vec<(String, String)>,
    /// The nodes' Kubernetes components.
    pub nodes: Vec<KubeNode>,
    /// The nodes run the reference bridge + host-local network, not tern.
    #[serde(default)]
    pub reference_cni: bool,
    /// The manifest tern was installed with (`kubectl apply -f`), when tern runs as the
    /// `tern-node` DaemonSet; `None` when the lab runs ternd on the host.
    #[serde(default)]
    pub manifest: Option<PathBuf>,
}

/// A process the cluster started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proc {
    /// Component name.
    pub name: String,
    /// PID.
    pub pid: u32,
    /// A string in its command line (a path unique to the lab): tells it from a reused PID.
    pub marker: String,
    /// Its log file.
    pub log: PathBuf,
}

/// One node's Kubernetes side.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeNode {
    /// Node name (the lab's and Kubernetes').
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// `<node state dir>/k8s`.
    pub dir: PathBuf,
    /// cgroup root of its kubelet and runtime, in every hierarchy (`tl-<lab>-<node>`).
    pub cgroup: String,
    /// containerd's socket.
    pub containerd_socket: PathBuf,
    /// The process holding the node's private mount namespace.
    pub holder: Option<Proc>,
    /// containerd, kubelet, kube-proxy.
    pub procs: Vec<Proc>,
    /// The Node's Ready condition seen after the kubelet registered and before tern's
    /// conflist was installed (`Ready=False: ... cni plugin not initialized`).
    #[serde(default)]
    pub ready_before_cni: String,
}

impl KubeNode {
    /// The process named `name`, if started.
    pub fn proc(&self, name: &str) -> Option<&Proc> {
        self.procs.iter().find(|p| p.name == name)
    }
}

impl KubeState {
    /// The operator's kubeconfig (through the relay on 127.0.0.1).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The admin kubeconfig for use inside the lab's namespaces (the API server's underlay
    /// address).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        admin_kubeconfig_in(&self.dir)
    }

    /// The cluster's PKI directory.
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Result<&KubeNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| LabError::Invalid(format!("the cluster has no node {name:?}")))
    }

    /// The `kubectl` binary.
    pub fn kubectl_bin(&self) -> PathBuf {
        self.k8s_bin.join("kubectl")
    }

    /// The pod CIDRs, IPv4 first: `cluster_cidr`, then `cluster_cidr6` in a dual-stack cluster.
    pub fn cluster_cidrs(&self) -> Vec<&str> {
        std::iter::once(self.cluster_cidr.as_str())
            .chain(self.cluster_cidr6.as_deref())
            .collect()
    }

    /// Whether the cluster has IPv4 (pods, Services), and IPv6.
    pub fn families(&self) -> (bool, bool) {
        let cidrs = self.cluster_cidrs();
        (
            cidrs.iter().any(|c| !c.contains(':')),
            cidrs.iter().any(|c| c.contains(':')),
        )
    }
}

impl Proc {
    /// Whether the process still runs (and is ours).
    pub fn alive(&self) -> bool {
        crate::process::is_ours(self.pid, &self.marker)
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::tail(&self.log, lines)
    }
}

/// The cluster's directory in the directory of its lab.
pub fn cluster_dir(lab_dir: &Path) -> PathBuf {
    lab_dir.join("kube")
}

/// The admin kubeconfig in a cluster directory (see [`KubeState::admin_kubeconfig`]).
pub fn admin_kubeconfig_in(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("admin.conf")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LabState {
        let mut s = LabState::new("lab", Path::new("/opt/tern/bin"));
        s.namespaces = vec!["tl-lab-ul".into(), "tl-lab-node1".into()];
        s.nodes.push(NodeState {
            name: "node1".into(),
            netns: "tl-lab-node1".into(),
            address: "198.18.0.11".into(),
            ternd_pid: Some(4242),
            socket: "/run/tern-lab/lab/node1/ternd.sock".into(),
            state_dir: "/run/tern-lab/lab/node1".into(),
            gateway: "198.18.0.1".into(),
            prefix_len: 24,
            address6: Some("2001:db8::11".into()),
        });
        s.pods.push(PodState {
            name: "pod1".into(),
            node: "node1".into(),
            netns: "tl-lab-pod-pod1".into(),
            container_id: "0123abcd".into(),
            addresses: vec!["10.244.0.1".into()],
        });
        s.servers.push(ServerState {
            pod: "pod1".into(),
            pid: 77,
            tcp: Some(7),
            udp: None,
            ready_file: "/run/tern-lab/lab/serve-pod1.ready".into(),
        });
        s
    }

    #[test]
    fn state_file_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        let s = sample();
        s.save_to(&path).unwrap();
        let back = LabState::load_from(&path).unwrap();
        assert_eq!(back, s);
        // Overwriting replaces, never appends.
        let mut s2 = s.clone();
        s2.pods.clear();
        s2.save_to(&path).unwrap();
        assert_eq!(LabState::load_from(&path).unwrap(), s2);
    }

    #[test]
    fn state_from_before_multi_node_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(
            &path,
            r#"{"name":"old","bin_dir":"/b","namespaces":[],"nodes":[{"name":"node1",
            "netns":"tl-old-node1","address":"198.18.0.11","ternd_pid":null,
            "socket":"/s","state_dir":"/d"}],"pods":[],"servers":[]}"#,
        )
        .unwrap();
        let s = LabState::load_from(&path).unwrap();
        assert_eq!(s.encap, Encap::None);
        assert_eq!(s.store, StoreKind::Sqlite);
        assert!(s.etcd.is_none() && s.agent_args.is_empty());
        assert_eq!(s.nodes[0].gateway, "");
        assert_eq!(s.ip_family, IpFamily::Ipv4);
        assert_eq!(s.nodes[0].addresses(), ["198.18.0.11"]);
        assert_eq!(s.nodes[0].address_of(true), None);
    }

    #[test]
    fn families_and_addresses() {
        let n = &sample().nodes[0];
        assert_eq!(n.addresses(), ["198.18.0.11", "2001:db8::11"]);
        assert_eq!(n.address_of(true), Some("2001:db8::11"));
        assert_eq!(n.address_of(false), Some("198.18.0.11"));
        assert!(IpFamily::Dual.has_v4() && IpFamily::Dual.has_v6());
        assert!(!IpFamily::Ipv6.has_v4() && !IpFamily::Ipv4.has_v6());
        assert_eq!(IpFamily::Dual.families(), [false, true]);
        assert_eq!(IpFamily::Ipv6.families(), [true]);
        assert!(IpFamily::Ipv4.has(false) && !IpFamily::Ipv4.has(true));
        assert_eq!(serde_json::to_string(&IpFamily::Dual).unwrap(), r#""dual""#);
        assert_eq!(host_port("2001:db8::2", 2379), "[2001:db8::2]:2379");
        assert_eq!(host_port("198.18.0.2", 2379), "198.18.0.2:2379");
    }

    #[test]
    fn encap_pool_modes() {
        use tern_model::EncapMode::{Always, CrossSubnet, Never};
        assert_eq!(Encap::None.pool_modes(), (Never, Never));
        assert_eq!(Encap::Vxlan.pool_modes(), (Always, Never));
        assert_eq!(Encap::Ipip.pool_modes(), (Never, Always));
        assert_eq!(Encap::Crosssubnet.pool_modes(), (CrossSubnet, Never));
        assert_eq!(Encap::Crosssubnet.to_string(), "crosssubnet");
        let j = serde_json::to_string(&(Encap::Vxlan, StoreKind::Etcd)).unwrap();
        assert_eq!(j, r#"["vxlan","etcd"]"#);
    }

    #[test]
    fn corrupt_state_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{not json").unwrap();
        let e = LabState::load_from(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }

    #[test]
    fn names_and_prefixes() {
        assert!(validate_name("lab").is_ok());
        assert!(validate_name("t123").is_ok());
        assert!(validate_name("").is_err());
        assert!(
            validate_name("a-b").is_err(),
            "dash would make prefixes ambiguous"
        );
        assert!(validate_name("Lab").is_err());
        assert!(validate_name("abcdefghijklm").is_err());
        assert!(validate_pod_name("pod-1").is_ok());
        assert!(validate_pod_name("-pod").is_err());
        assert!(validate_pod_name("pod_1").is_err());
        assert_eq!(underlay_ns("lab"), "tl-lab-ul");
        assert_eq!(node_ns("lab", "node1"), "tl-lab-node1");
        assert_eq!(pod_ns("lab", "web"), "tl-lab-pod-web");
        assert_eq!(sample().store_url(), "sqlite:///run/tern-lab/lab/store.db");
        assert_eq!(router_ns("lab"), "tl-lab-rtr");
        assert_eq!(etcd_ns("lab"), "tl-lab-etcd");
        let mut s = sample();
        s.store = StoreKind::Etcd;
        s.etcd = Some(EtcdState {
            netns: etcd_ns("lab"),
            address: "198.18.0.2".into(),
            pid: None,
            data_dir: "/run/tern-lab/lab/etcd".into(),
            tls: None,
        });
        assert_eq!(s.store_url(), "etcd://198.18.0.2:2379");
        // An IPv6-only lab's etcd: the address in brackets.
        if let Some(e) = s.etcd.as_mut() {
            e.address = "2001:db8::2".into();
        }
        assert_eq!(s.store_url(), "etcd://[2001:db8::2]:2379");
        assert_eq!(
            tern_store::etcd::parse_url(&s.store_url()).unwrap(),
            ["[2001:db8::2]:2379"]
        );
        // The Kubernetes datastore has no etcd; its URL is known before the cluster exists.
        let mut s = sample();
        s.store = StoreKind::Kubernetes;
        assert_eq!(
            s.store_url(),
            "kubernetes:///run/tern-lab/lab/kube/admin.conf"
        );
        assert_eq!(s.store_tls(), None);
        assert!(s.store_tls_args().is_empty());
    }

    #[test]
    fn lookups_name_what_is_missing() {
        let s = sample();
        assert_eq!(s.node("node1").unwrap().address, "198.18.0.11");
        let e = s.node("node9").unwrap_err().to_string();
        assert!(e.contains("node9") && e.contains("node1"), "{e}");
        assert!(s.pod("nope").is_err());
    }
}
