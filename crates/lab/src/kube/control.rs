//! The control plane in its own namespace on the underlay: etcd on the namespace's loopback,
//! kube-apiserver (TLS, Node+RBAC authorization, NodeRestriction, service-account keys),
//! kube-controller-manager (allocates node CIDRs from tern's pool, signs service-account
//! tokens, publishes `kube-root-ca.crt`) and kube-scheduler. Flags follow envtest's control
//! plane and `hack/local-up-cluster.sh`.

use std::path::Path;
use std::time::Duration;

use super::certs::{self, CertSpec, San};
use super::{
    APISERVER_PORT, KUBERNETES_SERVICE_IP, KUBERNETES_SERVICE_IP6, KubeState, Proc, kubectl, mkdir,
    spawn, wait_for,
};
use crate::process::{self, netns_add, netns_exec};
use crate::state::LabState;
use crate::{LabError, Result, topology};

fn kube_mut(st: &mut LabState) -> &mut KubeState {
    st.kube.as_mut().expect("cluster state exists during up")
}

/// Creates the namespace, the PKI, and starts and waits for every control-plane component
/// and the operator's relay.
pub fn up(st: &mut LabState) -> Result<()> {
    let ns = kube_mut(st).cp_netns.clone();
    netns_add(&ns)?;
    st.namespaces.push(ns.clone());
    // One address per family of the lab (IPv4 first); the lab's own etcd (for --store etcd)
    // has .2 (::2) on the same subnet, the control plane .3 (::3).
    let mut places = topology::etcd_placements(st.ip_family, st.encap);
    for p in &mut places {
        p.address = cp_address(&p.address);
    }
    let addresses: Vec<String> = places.iter().map(|p| p.address.clone()).collect();
    kube_mut(st).cp_address = addresses[0].clone();
    st.save()?;
    topology::plug_all(st, &ns, "cp", &places)?;

    let k = st.kube.clone().expect("cluster state");
    pki(&k, &addresses)?;

    let etcd = start_etcd(&k)?;
    kube_mut(st).control.push(etcd.clone());
    st.save()?;
    wait_for(
        "etcd of the control plane to be healthy",
        Duration::from_secs(30),
        Some(&etcd),
        || {
            crate::netns::in_netns(&k.cp_netns, || {
                std::net::TcpStream::connect_timeout(
                    &"127.0.0.1:2379".parse().expect("literal address"),
                    Duration::from_millis(300),
                )
                .is_ok()
            })
            .ok()
            .filter(|ok| *ok)
        },
    )?;

    let api = start_apiserver(&k)?;
    kube_mut(st).control.push(api.clone());
    st.save()?;
    wait_for(
        "kube-apiserver /readyz",
        Duration::from_secs(90),
        Some(&api),
        || {
            kubectl(&k, &["get", "--raw", "/readyz"])
                .ok()
                .filter(|s| s.trim() == "ok")
        },
    )?;

    let kcm = start_controller_manager(&k)?;
    kube_mut(st).control.push(kcm.clone());
    let sched = start_scheduler(&k)?;
    kube_mut(st).control.push(sched);
    st.save()?;
    // The default ServiceAccount exists once the controller manager's token controllers run;
    // pods cannot be created before.
    wait_for(
        "the default ServiceAccount (kube-controller-manager running)",
        Duration::from_secs(60),
        Some(&kcm),
        || kubectl(&k, &["get", "serviceaccount", "default", "-o", "name"]).ok(),
    )?;

    let relay = start_relay(st, &k)?;
    kube_mut(st).relay = Some(relay.clone());
    st.save()?;
    let port_file = k.dir.join("relay.port");
    let port: u16 = wait_for(
        "the kubectl relay",
        Duration::from_secs(10),
        Some(&relay),
        || {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        },
    )?;
    let pki_dir = k.pki();
    certs::write_kubeconfig(
        &k.kubeconfig(),
        &format!("https://127.0.0.1:{port}"),
        &pki_dir.join("ca.crt"),
        "admin",
        &certs::CertPair {
            cert: pki_dir.join("admin.crt"),
            key: pki_dir.join("admin.key"),
        },
    )?;
    kube_mut(st).relay_port = Some(port);
    st.save()
}

/// The control plane's address of the lab's etcd's `etcd` (same subnet): `.3`, or `::3`.
fn cp_address(etcd: &str) -> String {
    match etcd.rsplit_once(['.', ':']) {
        Some((net, _)) if etcd.contains(':') => format!("{net}:3"),
        Some((net, _)) => format!("{net}.3"),
        None => etcd.to_string(),
    }
}

/// The `https://` URL of the API server at `address` (in brackets when IPv6).
pub fn apiserver_url(address: &str) -> String {
    format!(
        "https://{}",
        crate::state::host_port(address, APISERVER_PORT)
    )
}

/// The CA, the control plane's certificates (for each of its `addresses`) and kubeconfigs.
fn pki(k: &KubeState, addresses: &[String]) -> Result<()> {
    let dir = k.pki();
    mkdir(&dir)?;
    let (ca, ca_files) = certs::ca(&dir)?;
    let (v4, v6) = k.families();
    let mut sans = Vec::new();
    for a in addresses {
        sans.push(certs::ip_san(a)?);
    }
    for (on, ip) in [(v4, KUBERNETES_SERVICE_IP), (v6, KUBERNETES_SERVICE_IP6)] {
        if on {
            sans.push(certs::ip_san(ip)?);
        }
    }
    sans.extend([
        San::Ip([127, 0, 0, 1].into()),
        San::dns("localhost"),
        San::dns("kubernetes"),
        San::dns("kubernetes.default"),
        San::dns("kubernetes.default.svc"),
        San::dns("kubernetes.default.svc.cluster.local"),
    ]);
    certs::issue_apiserver(&dir, &ca, sans)?;
    certs::service_account_keys(&dir)?;
    let server = apiserver_url(&k.cp_address);
    let clients: [(&str, &str, Option<&str>, Option<&Path>); 5] = [
        (
            "admin",
            "tern-lab-admin",
            Some("system:masters"),
            Some(&k.admin_kubeconfig()),
        ),
        (
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            None,
        ),
        (
            "controller-manager",
            "system:kube-controller-manager",
            None,
            Some(&k.dir.join("controller-manager.conf")),
        ),
        (
            "scheduler",
            "system:kube-scheduler",
            None,
            Some(&k.dir.join("scheduler.conf")),
        ),
        (
            "kube-proxy",
            "system:kube-proxy",
            None,
            Some(&k.dir.join("kube-proxy.conf")),
        ),
    ];
    for (file, cn, group, kubeconfig) in clients {
        let mut spec = CertSpec::client(cn);
        if let Some(group) = group {
            spec = spec.org(group);
        }
        let pair = certs::issue(&dir, file, &ca, spec)?;
        if let Some(path) = kubeconfig {
            certs::write_kubeconfig(path, &server, &ca_files.cert, cn, &pair)?;
        }
    }
    Ok(())
}

fn start_etcd(k: &KubeState) -> Result<Proc> {
    let data = k.dir.join("etcd");
    let mut c = netns_exec(&k.cp_netns, &k.k8s_bin.join("etcd"));
    c.arg("--name")
        .arg("cp")
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen-client-urls", "http://127.0.0.1:2379"])
        .args(["--advertise-client-urls", "http://127.0.0.1:2379"])
        .args(["--listen-peer-urls", "http://127.0.0.1:2380"])
        .args(["--initial-advertise-peer-urls", "http://127.0.0.1:2380"])
        .args(["--initial-cluster", "cp=http://127.0.0.1:2380"])
        // A throwaway lab: no fsync on every write (as envtest's etcd does).
        .arg("--unsafe-no-fsync")
        .args(["--log-level", "warn"]);
    spawn(
        "etcd",
        c,
        &data.display().to_string(),
        &k.dir.join("etcd.log"),
    )
}

fn start_apiserver(k: &KubeState) -> Result<Proc> {
    let pki = k.pki();
    let p = |f: &str| pki.join(f).display().to_string();
    let mut c = netns_exec(&k.cp_netns, &k.k8s_bin.join("kube-apiserver"));
    let services = super::service_cidrs(k.families()).join(",");
    // `::` takes IPv4 too (the namespace's bindv6only is 0); an IPv4 cluster keeps 0.0.0.0.
    let bind = if k.families().1 { "::" } else { "0.0.0.0" };
    c.args(["--etcd-servers", "http://127.0.0.1:2379"])
        .args(["--bind-address", bind])
        .args(["--advertise-address", &k.cp_address])
        .args(["--secure-port", &APISERVER_PORT.to_string()])
        .arg("--cert-dir")
        .arg(k.dir.join("apiserver-certs"))
        .args(["--tls-cert-file", &p("apiserver.crt")])
        .args(["--tls-private-key-file", &p("apiserver.key")])
        .args(["--client-ca-file", &p("ca.crt")])
        .args([
            "--kubelet-client-certificate",
            &p("apiserver-kubelet-client.crt"),
        ])
        .args(["--kubelet-client-key", &p("apiserver-kubelet-client.key")])
        .args(["--kubelet-certificate-authority", &p("ca.crt")])
        .args(["--kubelet-preferred-address-types", "InternalIP,Hostname"])
        .args([
            "--service-account-issuer",
            "https://kubernetes.default.svc.cluster.local",
        ])
        .args(["--service-account-key-file", &p("sa.pub")])
        .args(["--service-account-signing-key-file", &p("sa.key")])
        .args(["--service-cluster-ip-range", &services])
        .args(["--authorization-mode", "Node,RBAC"])
        .args(["--enable-admission-plugins", "NodeRestriction"])
        .arg("--allow-privileged=true")
        .arg("--profiling=false")
        .args(["--v", "1"]);
    spawn(
        "kube-apiserver",
        c,
        &k.dir.display().to_string(),
        &k.dir.join("kube-apiserver.log"),
    )
}

fn start_controller_manager(k: &KubeState) -> Result<Proc> {
    let pki = k.pki();
    let p = |f: &str| pki.join(f).display().to_string();
    let conf = k.dir.join("controller-manager.conf").display().to_string();
    let mut c = netns_exec(&k.cp_netns, &k.k8s_bin.join("kube-controller-manager"));
    c.args(["--kubeconfig", &conf])
        .args(["--authentication-kubeconfig", &conf])
        .args(["--authorization-kubeconfig", &conf])
        .args(["--bind-address", "127.0.0.1"])
        .arg("--leader-elect=false")
        .arg("--use-service-account-credentials=true")
        .args(["--service-account-private-key-file", &p("sa.key")])
        .args(["--root-ca-file", &p("ca.crt")])
        .args(["--cluster-signing-cert-file", &p("ca.crt")])
        .args(["--cluster-signing-key-file", &p("ca.key")])
        .arg("--allocate-node-cidrs=true")
        .args(["--cluster-cidr", &k.cluster_cidrs().join(",")])
        .args(node_cidr_masks(k.families()))
        .args([
            "--service-cluster-ip-range",
            &super::service_cidrs(k.families()).join(","),
        ])
        .args(["--v", "1"]);
    spawn(
        "kube-controller-manager",
        c,
        &k.dir.display().to_string(),
        &k.dir.join("kube-controller-manager.log"),
    )
}

/// kube-controller-manager's node CIDR sizes: `--node-cidr-mask-size` for one family, the
/// per-family flags in a dual-stack cluster (where it refuses the former).
fn node_cidr_masks(families: (bool, bool)) -> Vec<String> {
    match families {
        (true, true) => vec![
            format!("--node-cidr-mask-size-ipv4={}", super::NODE_CIDR_MASK_V4),
            format!("--node-cidr-mask-size-ipv6={}", super::NODE_CIDR_MASK_V6),
        ],
        (false, _) => vec![format!(
            "--node-cidr-mask-size={}",
            super::NODE_CIDR_MASK_V6
        )],
        (true, false) => vec![format!(
            "--node-cidr-mask-size={}",
            super::NODE_CIDR_MASK_V4
        )],
    }
}

fn start_scheduler(k: &KubeState) -> Result<Proc> {
    let conf = k.dir.join("scheduler.conf").display().to_string();
    let mut c = netns_exec(&k.cp_netns, &k.k8s_bin.join("kube-scheduler"));
    c.args(["--kubeconfig", &conf])
        .args(["--authentication-kubeconfig", &conf])
        .args(["--authorization-kubeconfig", &conf])
        .args(["--bind-address", "127.0.0.1"])
        .arg("--leader-elect=false")
        .args(["--v", "1"]);
    spawn(
        "kube-scheduler",
        c,
        &k.dir.display().to_string(),
        &k.dir.join("kube-scheduler.log"),
    )
}

/// `ternctl lab relay`: 127.0.0.1:<port> in the root namespace to the API server.
fn start_relay(st: &LabState, k: &KubeState) -> Result<Proc> {
    let ternctl = st.bin_dir.join("ternctl");
    if !ternctl.is_file() {
        return Err(LabError::Invalid(format!(
            "{} not found (the operator's kubectl relay runs `ternctl lab relay`)",
            ternctl.display()
        )));
    }
    let ready = k.dir.join("relay.port");
    let _ = std::fs::remove_file(&ready);
    let mut c = std::process::Command::new(&ternctl);
    c.args(["lab", "--name", &st.name, "relay", "--netns", &k.cp_netns])
        .arg("--to")
        .arg(crate::state::host_port(&k.cp_address, APISERVER_PORT))
        .arg("--ready-file")
        .arg(&ready);
    spawn(
        "relay",
        c,
        &ready.display().to_string(),
        &k.dir.join("relay.log"),
    )
}

/// Stops the control plane (scheduler and controller manager first, etcd last).
pub fn teardown(k: &KubeState, done: &mut Vec<String>) {
    for p in k.control.iter().rev() {
        if process::stop(p.pid, &p.marker, Duration::from_secs(5)) {
            done.push(format!("stopped {} {}", p.name, p.pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_addresses_and_flags_per_family() {
        assert_eq!(cp_address("198.18.0.2"), "198.18.0.3");
        assert_eq!(cp_address("2001:db8::2"), "2001:db8::3");
        assert_eq!(cp_address("2001:db8:1::2"), "2001:db8:1::3");
        assert_eq!(apiserver_url("198.18.0.3"), "https://198.18.0.3:6443");
        assert_eq!(apiserver_url("2001:db8::3"), "https://[2001:db8::3]:6443");
        assert_eq!(node_cidr_masks((true, false)), ["--node-cidr-mask-size=24"]);
        assert_eq!(node_cidr_masks((false, true)), ["--node-cidr-mask-size=64"]);
        assert_eq!(
            node_cidr_masks((true, true)),
            [
                "--node-cidr-mask-size-ipv4=24",
                "--node-cidr-mask-size-ipv6=64"
            ]
        );
        assert_eq!(
            super::super::service_cidrs((true, true)),
            ["10.96.0.0/16", "fd00:10:96::/112"]
        );
        assert_eq!(
            super::super::service_cidrs((false, true)),
            ["fd00:10:96::/112"]
        );
    }
}
