//! One node's Kubernetes side: a private mount namespace (held by a `pause` process) in the
//! node's network namespace, containerd with the CRI and a private CNI directory, kubelet
//! (cgroupfs, a cgroup root of its own) and kube-proxy (iptables), next to tern (the
//! DaemonSet's ternd, or with `--host-ternd` the lab's own).
//!
//! The mount namespace is entered with `nsenter --net` (not `ip netns exec`, which would give
//! a /sys without the cgroup mounts) and then gets: a sysfs of the node's network namespace
//! with the machine's cgroup mounts moved under it, and tmpfs over /run (with the lab's
//! directory moved back in), /var/lib, /var/log, /opt and /tmp. Every path the components are
//! configured with is under `<node dir>/k8s`, which the operator can inspect from outside.
//!
//! The holder also gets a UTS namespace of its own whose hostname is the node's name, which
//! containerd, kubelet and kube-proxy join: hostNetwork pods (tern's DaemonSet among them)
//! share containerd's UTS namespace, so they see their node's name as a real node's would
//! (upstream's e2e checks it). The components' node names stay explicit
//! (`--hostname-override`, `hostnameOverride`); the machine's own hostname is never touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::certs::{self, CertSpec, San};
use super::{
    KubeNode, KubeState, PAUSE_IMAGE, Proc, REFERENCE_CNI_DIR, RUNC, kubectl, mkdir, spawn, sys,
    wait_for, write,
};
use crate::process;
use crate::state::{LabState, NodeState};
use crate::{LabError, Result};

/// Sets up the node's private mount and UTS namespaces, joins the node cgroup and becomes
/// `pause`. Arguments: cgroup path, node k8s dir, pause binary, `daemonset` when tern runs as
/// the DaemonSet (see [`super::daemonset`] for the node-independent paths bound here), the
/// node's name (its hostname) and the UTS namespace of the lab's own process (the machine's,
/// as `readlink /proc/self/ns/uts` shows it), which must not be the one renamed.
const HOLDER_SCRIPT: &str = r#"set -eu
cg=$1 dir=$2 pause=$3 mode=${4:-host} node=$5 outer_uts=$6
# The hostname is set only in a UTS namespace that is not the lab's (unshare made it).
if [ "$(readlink /proc/self/ns/uts)" = "$outer_uts" ]; then
  echo "refusing to set the hostname: still in the lab's UTS namespace $outer_uts" >&2
  exit 1
fi
printf '%s' "$node" > /proc/sys/kernel/hostname
for h in /sys/fs/cgroup/*/; do
  if [ -d "$h$cg/system" ]; then echo $$ > "$h$cg/system/cgroup.procs"; fi
done
# A sysfs of this network namespace, keeping the machine's cgroup mounts.
mount --rbind /sys/fs/cgroup /mnt
mount -t sysfs tern-node-sys /sys
mount --move /mnt /sys/fs/cgroup
# Nothing under /run (containerd, runc, shims, netns, xtables lock) reaches the machine.
mount --rbind /run/tern-lab /mnt
mount -t tmpfs -o mode=0755 tern-node-run /run
mkdir -p /run/tern-lab /run/netns
mount --move /mnt /run/tern-lab
for d in /var/lib /var/log /opt; do mount -t tmpfs -o mode=0755 tern-node "$d"; done
mount -t tmpfs -o mode=1777 tern-node-tmp /tmp
if [ "$mode" = daemonset ]; then
  # The DaemonSet's hostPaths, the same on every node, onto this node's own directories.
  mkdir -p /opt/cni/bin /opt/cni/net.d /run/tern /var/lib/tern "$dir/run-tern" "$dir/var-lib-tern"
  mount --bind "$dir/cni/bin" /opt/cni/bin
  mount --bind "$dir/cni/net.d" /opt/cni/net.d
  mount --bind "$dir/run-tern" /run/tern
  mount --bind "$dir/var-lib-tern" /var/lib/tern
  # kubelet's HostToContainer mount of /run/netns needs a shared mount; this namespace was
  # made private, so its new peer groups have no member outside it.
  mount --make-rshared /
fi
touch "$dir/holder.ready"
exec "$pause" "$dir/holder"
"#;

/// Moves itself into a cgroup (in every hierarchy), then execs the command.
const CGROUP_EXEC: &str = r#"cg=$1; shift
for h in /sys/fs/cgroup/*/; do
  if [ -d "$h$cg" ]; then echo $$ > "$h$cg/cgroup.procs" || exit 125; fi
done
exec "$@""#;

/// A command run inside the node's mount, network and UTS namespaces, in cgroup `/<cgroup>`.
fn node_cmd(holder: &Proc, cgroup: &str, program: &Path) -> Command {
    let mut c = Command::new("nsenter");
    c.arg("-t")
        .arg(holder.pid.to_string())
        .args(["-m", "-n", "-u", "--"])
        .args(["sh", "-c", CGROUP_EXEC, "sh", cgroup])
        .arg(program);
    c
}

fn kube_mut(st: &mut LabState) -> &mut KubeState {
    st.kube.as_mut().expect("cluster state exists during up")
}

fn node_mut<'a>(st: &'a mut LabState, name: &str) -> &'a mut KubeNode {
    kube_mut(st)
        .nodes
        .iter_mut()
        .find(|n| n.name == name)
        .expect("node recorded before use")
}

/// Brings up node `name`'s Kubernetes components; returns once the kubelet registered the
/// Node and tern's conflist is installed (Ready is awaited by [`wait_ready`]).
pub fn up(st: &mut LabState, name: &str) -> Result<()> {
    let n: NodeState = st.node(name)?.clone();
    let dir = n.state_dir.join("k8s");
    for d in [
        "cni/bin",
        "cni/net.d",
        "containerd",
        "kubelet",
        "pod-logs",
        "pki",
    ] {
        mkdir(&dir.join(d))?;
    }
    let cgroup = format!("{}{name}", crate::state::ns_prefix(&st.name));
    kube_mut(st).nodes.push(KubeNode {
        name: name.to_string(),
        netns: n.netns.clone(),
        dir: dir.clone(),
        cgroup: cgroup.clone(),
        containerd_socket: dir.join("containerd.sock"),
        ..KubeNode::default()
    });
    st.save()?;
    sys::create(&cgroup, &["system", "kubelet"])?;

    // The private mount and UTS namespaces.
    let k = st.kube.clone().expect("cluster state");
    let ready = dir.join("holder.ready");
    let _ = std::fs::remove_file(&ready);
    let outer_uts = std::fs::read_link("/proc/self/ns/uts")
        .map_err(|e| LabError::io("cannot read /proc/self/ns/uts", e))?;
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{}", n.netns))
        .args(["--", "unshare", "--mount", "--uts"])
        .args(["--propagation", "private"])
        .args(["sh", "-c", HOLDER_SCRIPT, "sh", &cgroup])
        .arg(&dir)
        .arg(k.k8s_bin.join("pause"))
        .arg(if k.manifest.is_some() {
            "daemonset"
        } else {
            "host"
        })
        .arg(name)
        .arg(outer_uts);
    let holder = spawn(
        "holder",
        c,
        &dir.join("holder").display().to_string(),
        &dir.join("holder.log"),
    )?;
    node_mut(st, name).holder = Some(holder.clone());
    st.save()?;
    // Ready once the script has touched the file AND exec'ed pause: until then the process does
    // not carry its marker, and everything after this treats a holder without one as gone.
    wait_for(
        &format!("the mount namespace of {name}"),
        Duration::from_secs(10),
        Some(&holder),
        || (ready.is_file() && holder.alive()).then_some(()),
    )?;

    node_pki(&k, &n, &dir)?;

    let ctrd = start_containerd(st, name)?;
    wait_containerd(st.kube.as_ref().expect("cluster state"), name, &ctrd)?;
    let sock = dir.join("containerd.sock");
    let mut tarballs: Vec<PathBuf> = super::IMAGE_TARBALLS
        .iter()
        .map(|i| k.images.join(i))
        .collect();
    if k.manifest.is_some() {
        tarballs.push(k.dir.join(super::daemonset::IMAGE_TARBALL));
    }
    // The e2e images (scripts/k8s-e2e.sh) only where they were built.
    tarballs.extend(
        super::OPTIONAL_IMAGE_TARBALLS
            .iter()
            .map(|i| k.images.join(i))
            .filter(|p| p.is_file()),
    );
    for tarball in tarballs {
        process::run(
            Command::new(k.k8s_bin.join("ctr"))
                .arg("--address")
                .arg(&sock)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(tarball),
        )?;
    }

    // kubelet: the sysctls it changes are saved before the first one starts.
    if kube_mut(st).saved_sysctls.is_empty() {
        kube_mut(st).saved_sysctls = sys::save_sysctls(&st.name)?;
        st.save()?;
    }
    write(
        &dir.join("kubelet-config.yaml"),
        &kubelet_config(&dir, &cgroup, &n, &k),
    )?;
    write(&dir.join("resolv.conf"), "nameserver 198.18.0.1\n")?;
    let kubelet = start_kubelet(st, name)?;
    wait_for(
        &format!("kubelet of {name} to register its Node"),
        Duration::from_secs(90),
        Some(&kubelet),
        || kubectl(&k, &["get", "node", name, "-o", "name"]).ok(),
    )?;
    // Before tern's conflist the runtime's network is not ready, so neither is the Node.
    let (ready, message) = wait_for(
        &format!("the Ready condition of {name}"),
        Duration::from_secs(30),
        Some(&kubelet),
        || {
            ready_condition(&k, name)
                .ok()
                .filter(|(s, _)| !s.is_empty())
        },
    )?;
    if ready == "True" {
        return Err(LabError::Invalid(format!(
            "node {name} is Ready before tern's conflist is installed ({message})"
        )));
    }
    node_mut(st, name).ready_before_cni = format!("Ready={ready}: {message}");
    st.save()?;

    // tern's conflist, only now that ternd serves (the lab waited for its socket): until
    // then containerd reports NetworkReady=false and the Node stays NotReady.
    if k.reference_cni {
        install_reference_cni(&k, name, &dir)?;
    } else if k.manifest.is_some() {
        // The DaemonSet's init container copies tern's plugins and its cni-conf container
        // writes the conflist once ternd is ready; the chained reference plugins stay ours.
        copy_reference_plugins(&dir.join("cni/bin"))?;
    } else {
        install_cni(st, &n, &dir)?;
    }

    write(&dir.join("kube-proxy.yaml"), &kube_proxy_config(name, &k))?;
    start_proxy(st, name)?;
    Ok(())
}

/// Records `p` as the node's running `p.name`, replacing an earlier instance.
fn record(st: &mut LabState, name: &str, p: &Proc) -> Result<()> {
    let node = node_mut(st, name);
    node.procs.retain(|x| x.name != p.name);
    node.procs.push(p.clone());
    st.save()
}

fn node_parts(st: &LabState, name: &str) -> Result<(KubeState, KubeNode, Proc)> {
    let k = st
        .kube
        .clone()
        .ok_or_else(|| LabError::Invalid(format!("lab {} has no Kubernetes cluster", st.name)))?;
    let kn = k.node(name)?.clone();
    let holder = kn
        .holder
        .clone()
        .filter(Proc::alive)
        .ok_or_else(|| LabError::Invalid(format!("the mount namespace of {name} is gone")))?;
    Ok((k, kn, holder))
}

/// Starts the node's containerd (configuration written here), without waiting for it.
pub fn start_containerd(st: &mut LabState, name: &str) -> Result<Proc> {
    let (k, kn, holder) = node_parts(st, name)?;
    let conf = kn.dir.join("containerd.toml");
    write(&conf, &containerd_config(&kn.dir))?;
    let mut c = node_cmd(
        &holder,
        &format!("{}/system", kn.cgroup),
        &k.k8s_bin.join("containerd"),
    );
    c.arg("--config").arg(&conf);
    let p = spawn(
        "containerd",
        c,
        &conf.display().to_string(),
        &kn.dir.join("containerd.log"),
    )?;
    record(st, name, &p)?;
    Ok(p)
}

fn wait_containerd(k: &KubeState, name: &str, p: &Proc) -> Result<()> {
    let sock = k.node(name)?.containerd_socket.clone();
    wait_for(
        &format!("containerd of {name}"),
        Duration::from_secs(30),
        Some(p),
        || {
            std::os::unix::net::UnixStream::connect(&sock)
                .ok()
                .map(drop)
        },
    )
}

/// Starts the node's kubelet (its configuration already written), without waiting for it.
pub fn start_kubelet(st: &mut LabState, name: &str) -> Result<Proc> {
    let (k, kn, holder) = node_parts(st, name)?;
    let n = st.node(name)?.clone();
    let dir = &kn.dir;
    let kconf = dir.join("kubelet-config.yaml");
    let mut c = node_cmd(
        &holder,
        &format!("{}/kubelet", kn.cgroup),
        &k.k8s_bin.join("kubelet"),
    );
    c.arg("--config")
        .arg(&kconf)
        .arg("--kubeconfig")
        .arg(dir.join("kubelet.conf"))
        .arg("--root-dir")
        .arg(dir.join("kubelet"))
        .arg("--cert-dir")
        .arg(dir.join("pki"))
        .args(["--hostname-override", name])
        // One address per family (IPv4 first): the Node's InternalIPs, the pods' hostIPs.
        .args(["--node-ip", &n.addresses().join(",")])
        .args(["--v", "2"]);
    let p = spawn(
        "kubelet",
        c,
        &kconf.display().to_string(),
        &dir.join("kubelet.log"),
    )?;
    record(st, name, &p)?;
    Ok(p)
}

/// Starts the node's kube-proxy (its configuration already written).
pub fn start_proxy(st: &mut LabState, name: &str) -> Result<Proc> {
    let (k, kn, holder) = node_parts(st, name)?;
    let pconf = kn.dir.join("kube-proxy.yaml");
    let mut c = node_cmd(
        &holder,
        &format!("{}/system", kn.cgroup),
        &k.k8s_bin.join("kube-proxy"),
    );
    c.arg("--config").arg(&pconf).args(["--v", "1"]);
    let p = spawn(
        "kube-proxy",
        c,
        &pconf.display().to_string(),
        &kn.dir.join("kube-proxy.log"),
    )?;
    record(st, name, &p)?;
    Ok(p)
}

/// Restarts one component of a node (`containerd`, `kubelet` or `kube-proxy`): SIGTERM (then
/// SIGKILL), start again, wait until it serves (containerd's socket; the kubelet's healthz;
/// the Node Ready again). Running containers survive (their shims are not restarted).
pub fn restart(st: &mut LabState, name: &str, component: &str, timeout: Duration) -> Result<()> {
    let (k, kn, _) = node_parts(st, name)?;
    if let Some(p) = kn.proc(component) {
        process::stop(p.pid, &p.marker, Duration::from_secs(10));
    }
    match component {
        "containerd" => {
            let p = start_containerd(st, name)?;
            wait_containerd(&k, name, &p)?;
        }
        "kubelet" => {
            start_kubelet(st, name)?;
        }
        "kube-proxy" => {
            start_proxy(st, name)?;
        }
        other => {
            return Err(LabError::Invalid(format!(
                "unknown node component {other:?} (containerd, kubelet or kube-proxy)"
            )));
        }
    }
    let k = st.kube.clone().expect("cluster state");
    // The kubelet notices a restarted runtime within its status period; give it that long to
    // be seen NotReady before requiring Ready.
    std::thread::sleep(Duration::from_secs(1));
    wait_ready(&k, name, timeout)
}

/// The kubelet's client certificate (`system:node:<name>` in `system:nodes`), its serving
/// certificate (for the node's address, signed by the cluster CA) and its kubeconfig.
fn node_pki(k: &KubeState, n: &NodeState, dir: &Path) -> Result<()> {
    let pki = dir.join("pki");
    let ca_files = certs::CertPair::named(&k.pki(), "ca");
    let ca = certs::Ca::load(&ca_files).map_err(LabError::Pki)?;
    let cn = format!("system:node:{}", n.name);
    let client = CertSpec::client(&cn).org("system:nodes");
    let client = certs::issue(&pki, "kubelet-client", &ca, client)?;
    let mut sans = vec![San::dns(&n.name)];
    for a in n.addresses() {
        sans.push(certs::ip_san(a)?);
    }
    let serving = CertSpec::server(&cn, sans).org("system:nodes");
    certs::issue(&pki, "kubelet-serving", &ca, serving)?;
    let server = super::control::apiserver_url(&k.cp_address);
    certs::write_kubeconfig(
        &dir.join("kubelet.conf"),
        &server,
        &ca_files.cert,
        &cn,
        &client,
    )
}

/// containerd 2.x configuration (version 3): everything private to the node; CRI with our
/// pause image pinned as the sandbox image, runc with cgroupfs, the node's CNI directories
/// (one conflist).
pub fn containerd_config(dir: &Path) -> String {
    let d = |s: &str| dir.join(s).display().to_string();
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "{sock}"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # This machine withholds CAP_SYS_RESOURCE even from root: runc cannot set the negative
  # oom_score_adj the CRI asks for sandboxes, so clamp it to ours (as for rootless).
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"#,
        root = d("containerd/root"),
        state = d("containerd/state"),
        sock = d("containerd.sock"),
        opt = d("containerd/opt"),
        cni_bin = d("cni/bin"),
        cni_conf = d("cni/net.d"),
    )
}

/// The KubeletConfiguration: cgroupfs under the node's own cgroup root, no swap check,
/// eviction and image GC relaxed (the imported images must never be collected: there is no
/// registry to pull them back from), everything under the node directory.
pub fn kubelet_config(dir: &Path, cgroup: &str, n: &NodeState, k: &KubeState) -> String {
    let d = |s: &str| dir.join(s).display().to_string();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{addr}"
port: 10250
readOnlyPort: 0
healthzBindAddress: "127.0.0.1"
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: "/{cgroup}"
kubeletCgroups: "/{cgroup}/kubelet"
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: "unix://{sock}"
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: "{ca}"
authorization:
  mode: Webhook
tlsCertFile: "{cert}"
tlsPrivateKeyFile: "{key}"
rotateCertificates: false
serverTLSBootstrap: false
evictionHard:
  memory.available: "0%"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
podLogsDir: "{logs}"
resolvConf: "{resolv}"
clusterDomain: cluster.local
maxPods: 250
protectKernelDefaults: false
serializeImagePulls: false
"#,
        addr = n.address,
        sock = d("containerd.sock"),
        ca = k.pki().join("ca.crt").display(),
        cert = d("pki/kubelet-serving.crt"),
        key = d("pki/kubelet-serving.key"),
        logs = d("pod-logs"),
        resolv = d("resolv.conf"),
    )
}

/// kube-proxy in iptables mode (with both cluster CIDRs in a dual-stack cluster, it runs its
/// iptables and ip6tables proxiers); leaves the kernel-wide conntrack settings alone (they
/// can only be set from the root namespace).
pub fn kube_proxy_config(name: &str, k: &KubeState) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: "{conf}"
hostnameOverride: "{name}"
bindAddress: 0.0.0.0
clusterCIDR: "{cidr}"
mode: iptables
nodePortAddresses: ["primary"]
healthzBindAddress: "127.0.0.1:10256"
metricsBindAddress: "127.0.0.1:10249"
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
        conf = k.dir.join("kube-proxy.conf").display(),
        cidr = k.cluster_cidrs().join(","),
    )
}

/// Copies the reference plugins tern chains (and the loopback plugin containerd uses) into
/// the node's CNI bin directory, then runs `ternctl install-cni`, which copies tern's plugins
/// and writes the conflist last.
fn install_cni(st: &LabState, n: &NodeState, dir: &Path) -> Result<()> {
    let bin = dir.join("cni/bin");
    copy_reference_plugins(&bin)?;
    process::run(
        Command::new(st.bin_dir.join("ternctl"))
            .arg("install-cni")
            .arg("--bin-dir")
            .arg(&bin)
            .arg("--conf-dir")
            .arg(dir.join("cni/net.d"))
            .arg("--agent-socket")
            .arg(&n.socket)
            .arg("--state-dir")
            .arg(&n.state_dir)
            .arg("--plugin-dir")
            .arg(&st.bin_dir)
            .args(assign_args(st.ip_family))
            // Debian's bandwidth and portmap speak at most 1.0.0.
            .args(["--cni-version", "1.0.0"]),
    )
    .map(drop)
}

/// The address families every pod gets, as `ternctl install-cni` arguments.
fn assign_args(family: crate::IpFamily) -> Vec<&'static str> {
    let mut a = Vec::new();
    if family.has_v6() {
        a.push("--assign-ipv6");
    }
    if !family.has_v4() {
        a.push("--no-assign-ipv4");
    }
    a
}

/// Copies the reference plugins tern chains (bandwidth, portmap) and the loopback plugin
/// containerd uses into a node's CNI bin directory.
fn copy_reference_plugins(bin: &Path) -> Result<()> {
    for p in ["loopback", "bandwidth", "portmap", "host-local"] {
        let src = Path::new(REFERENCE_CNI_DIR).join(p);
        if src.is_file() {
            std::fs::copy(&src, bin.join(p)).map_err(|e| {
                LabError::io(
                    format!("cannot copy {} into {}", src.display(), bin.display()),
                    e,
                )
            })?;
        }
    }
    Ok(())
}

/// The baseline network: Debian's `bridge` with `host-local` on the Node's podCIDR (allocated
/// by kube-controller-manager), with the plugins tern's conflist chains (`bandwidth`, then
/// `portmap`), so that a comparison differs only in the main plugin and its IPAM.
fn install_reference_cni(k: &KubeState, name: &str, dir: &Path) -> Result<()> {
    let cidr = wait_for(
        &format!("the podCIDR of {name}"),
        Duration::from_secs(30),
        None,
        || {
            kubectl(k, &["get", "node", name, "-o", "jsonpath={.spec.podCIDR}"])
                .ok()
                .filter(|c| !c.trim().is_empty())
        },
    )?;
    install_reference_conflist(dir, "reference", cidr.trim(), "10-reference.conflist")
}

/// Copies the reference plugins into the node's CNI bin directory (`<node>/k8s/cni/bin`) and
/// installs a `bridge` + `host-local` conflist named `network` on `subnet`, chained like
/// tern's (`bandwidth`, `portmap`), as `file` in its conf directory.
pub(super) fn install_reference_conflist(
    dir: &Path,
    network: &str,
    subnet: &str,
    file: &str,
) -> Result<()> {
    let bin = dir.join("cni/bin");
    for p in ["loopback", "bridge", "host-local", "bandwidth", "portmap"] {
        let src = Path::new(REFERENCE_CNI_DIR).join(p);
        // Copied beside and renamed over: containerd may be executing the one there
        // (overwriting a running binary fails with ETXTBSY).
        let tmp = bin.join(format!(".{p}.tmp"));
        std::fs::copy(&src, &tmp)
            .and_then(|_| std::fs::rename(&tmp, bin.join(p)))
            .map_err(|e| {
                LabError::io(
                    format!("cannot copy {} into {}", src.display(), bin.display()),
                    e,
                )
            })?;
    }
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("host-local").display().to_string(),
                },
            },
            {"type": "bandwidth", "capabilities": {"bandwidth": true}},
            {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}},
        ],
    });
    // Written next to its final name (libcni ignores the .tmp suffix) and renamed: containerd
    // notices a rename within the directory, not one from elsewhere.
    let tmp = dir.join(format!("cni/net.d/.{file}.tmp"));
    write(&tmp, &format!("{conf:#}\n"))?;
    std::fs::rename(&tmp, dir.join("cni/net.d").join(file))
        .map_err(|e| LabError::io(format!("cannot install the reference conflist {file}"), e))
}

/// The Ready condition of a Node (`True`, `False`, `Unknown`) and its message.
pub fn ready_condition(k: &KubeState, name: &str) -> Result<(String, String)> {
    let out = kubectl(
        k,
        &[
            "get",
            "node",
            name,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}|{.status.conditions[?(@.type=="Ready")].message}"#,
        ],
    )?;
    let (s, m) = out.split_once('|').unwrap_or((out.as_str(), ""));
    Ok((s.trim().to_string(), m.trim().to_string()))
}

/// Waits until node `name` is Ready; the error carries the condition and the kubelet's and
/// containerd's last log lines.
pub fn wait_ready(k: &KubeState, name: &str, timeout: Duration) -> Result<()> {
    let kn = k.node(name)?;
    let kubelet = kn.proc("kubelet");
    let r = wait_for(&format!("node {name} Ready"), timeout, kubelet, || {
        ready_condition(k, name).ok().filter(|(s, _)| s == "True")
    });
    r.map(drop).map_err(|e| {
        let cond = ready_condition(k, name).unwrap_or_default();
        let ctrd = kn
            .proc("containerd")
            .map(|p| p.log_tail(15))
            .unwrap_or_default();
        LabError::Invalid(format!(
            "{e}\nReady={} ({})\n--- containerd log ---\n{ctrd}",
            cond.0, cond.1
        ))
    })
}

/// Stops node `n`'s components: kube-proxy and kubelet, then every pod sandbox through the
/// CRI (CNI DEL while ternd still runs), containerd, whatever is left in the node's cgroup,
/// the mount-namespace holder, and removes the cgroups.
pub fn teardown(k: &KubeState, n: &KubeNode, done: &mut Vec<String>, errors: &mut Vec<String>) {
    let stop = |p: &Proc, done: &mut Vec<String>| {
        if process::stop(p.pid, &p.marker, Duration::from_secs(10)) {
            done.push(format!("stopped {} {} of {}", p.name, p.pid, n.name));
        }
    };
    for name in ["kube-proxy", "kubelet"] {
        if let Some(p) = n.proc(name) {
            stop(p, done);
        }
    }
    if let Some(c) = n.proc("containerd")
        && c.alive()
    {
        // Once more on failure: a sandbox being stopped by the kubelet as it exited can
        // make the first attempt time out.
        match remove_sandboxes(k, n).or_else(|_| remove_sandboxes(k, n)) {
            Ok(0) => {}
            Ok(count) => done.push(format!("removed {count} pod sandbox(es) of {}", n.name)),
            Err(e) => errors.push(e.to_string()),
        }
        stop(c, done);
    }
    if let Some(h) = &n.holder {
        stop(h, done);
    }
    // Whatever is left (shims, containers) dies with the cgroups.
    match sys::remove(&n.cgroup) {
        Ok(d) => done.extend(d),
        Err(e) => errors.push(e.to_string()),
    }
}

/// Stops and removes every pod sandbox through the CRI with `crictl` (when built) so the
/// CNI DEL releases the pods' addresses. Returns how many there were.
fn remove_sandboxes(k: &KubeState, n: &KubeNode) -> Result<usize> {
    let crictl: PathBuf = k.k8s_bin.join("crictl");
    if !crictl.is_file() {
        return Ok(0);
    }
    let endpoint = format!("unix://{}", n.containerd_socket.display());
    let base = |c: &mut Command| {
        c.args(["--runtime-endpoint", &endpoint, "--timeout", "20s"]);
    };
    let mut list = Command::new(&crictl);
    base(&mut list);
    list.args(["pods", "-q"]);
    let ids: Vec<String> = process::run(&mut list)?
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let mut rm = Command::new(&crictl);
    base(&mut rm);
    rm.args(["rmp", "-f"]).args(&ids);
    process::run(&mut rm)?;
    Ok(ids.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (KubeState, NodeState) {
        let k = KubeState {
            dir: "/run/tern-lab/t/kube".into(),
            cluster_cidr: "10.244.0.0/16".into(),
            ..KubeState::default()
        };
        let n = NodeState {
            name: "node1".into(),
            address: "198.18.0.11".into(),
            ..NodeState::default()
        };
        (k, n)
    }

    #[test]
    fn configs_keep_everything_under_the_node_directory() {
        let (k, n) = sample();
        let dir = Path::new("/run/tern-lab/t/node1/k8s");
        let c = containerd_config(dir);
        assert!(
            c.contains(r#"conf_dir = "/run/tern-lab/t/node1/k8s/cni/net.d""#),
            "{c}"
        );
        assert!(
            c.contains(r#"bin_dirs = ["/run/tern-lab/t/node1/k8s/cni/bin"]"#),
            "{c}"
        );
        assert!(c.contains("SystemdCgroup = false") && c.contains(PAUSE_IMAGE));
        assert!(!c.contains("/etc/cni") && !c.contains("/opt/cni"));
        let kc = kubelet_config(dir, "tl-t-node1", &n, &k);
        assert!(kc.contains("cgroupDriver: cgroupfs"));
        assert!(kc.contains(r#"cgroupRoot: "/tl-t-node1""#));
        assert!(
            kc.contains("failSwapOn: false") && kc.contains("imageGCHighThresholdPercent: 100")
        );
        assert!(kc.contains(r#"address: "198.18.0.11""#));
        let p = kube_proxy_config("node1", &k);
        assert!(p.contains("mode: iptables") && p.contains("maxPerCore: 0"));
        assert!(p.contains(r#"clusterCIDR: "10.244.0.0/16""#));
        let dual = KubeState {
            cluster_cidr6: Some("fd00:10:244::/48".into()),
            ..k
        };
        let p = kube_proxy_config("node1", &dual);
        assert!(p.contains(r#"clusterCIDR: "10.244.0.0/16,fd00:10:244::/48""#));
        assert_eq!(dual.families(), (true, true));
        assert!(assign_args(crate::IpFamily::Ipv4).is_empty());
        assert_eq!(assign_args(crate::IpFamily::Dual), ["--assign-ipv6"]);
        assert_eq!(
            assign_args(crate::IpFamily::Ipv6),
            ["--assign-ipv6", "--no-assign-ipv4"]
        );
    }
}
