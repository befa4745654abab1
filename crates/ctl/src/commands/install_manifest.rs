//! `ternctl install manifest`: renders the Kubernetes manifest that installs tern the way
//! Calico's `calico-node` installs (`kubectl apply -f`): a ServiceAccount, the least
//! ClusterRole ternd needs and its binding, the `tern-config` ConfigMap and the `tern-node`
//! DaemonSet in `kube-system`. `manifests/tern.yaml` in the repository is this command's
//! output with every option at its default (a test pins it byte for byte).
//!
//! ```text
//!   tern-node pod (hostNetwork, one per node, tolerates every taint)
//!     init install-cni   ternctl install-cni --skip-conflist   → /opt/cni/bin/{tern,tern-ipam}
//!     init apply-ippool  ternctl apply -f /etc/tern/ippool.yaml → the default IPPool (pool,
//!                                                                encapsulation) in the store
//!     ternd              --kubernetes, env from tern-config, probes on 127.0.0.1:9099
//!     cni-conf           ternctl install-cni --conflist-only --wait-ready …/readiness --stay
//!                        → /etc/cni/net.d/10-tern.conflist once ternd is ready, then waits
//! ```
//!
//! Why the conflist is written by a container beside ternd and not by the init container:
//! the container runtime reports the node's network ready (and kubelet the node Ready, so pods
//! get scheduled there) as soon as a conflist exists. Written by the init container it would
//! appear before ternd runs; written after ternd's `/readiness` answers 200 it appears only
//! once ternd can serve ADDs (as Cilium's agent writes its conflist once it is up). It is kept
//! on a restart of the pod (a rollout restart): ADDs meanwhile get "try again" (11) from the
//! plugin, and the node stays Ready.
//!
//! Why the probes use `host: 127.0.0.1`: with hostNetwork, kubelet probes the pod IP (the
//! node's address) by default, which would need ternd's health listener on the node address
//! or 0.0.0.0, reachable from the network. Kubelet runs in the node's network namespace, which
//! a hostNetwork pod shares, so it reaches 127.0.0.1:9099 there (Cilium's agent is probed the
//! same way); the health port stays off the network.
//!
//! etcd over TLS (`--etcd-ca`, and `--etcd-cert`/`--etcd-key` for client-certificate auth)
//! is rendered as Calico's etcd manifest does it: the files' contents go into the Secret
//! `tern-etcd-certs`, which the DaemonSet always mounts (optional, mode 0400) at
//! [`ETCD_CERTS_DIR`] in ternd and apply-ippool, the two containers that talk to the store;
//! the ConfigMap's `etcd_ca`, `etcd_cert` and `etcd_key` name the mounted files (empty: plain
//! http or SQLite) and reach both as `TERN_ETCD_CA`/`_CERT`/`_KEY`. So the DaemonSet is the
//! same with and without TLS, and without it no Secret is rendered: the manifest applies
//! unmodified for SQLite and plain-http etcd.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine as _;

use tern_lab::Encap;

/// Image of the DaemonSet when `--image` is not given.
pub const DEFAULT_IMAGE: &str = concat!("localhost/tern/tern-node:", env!("CARGO_PKG_VERSION"));
/// Store when `--store` is not given: the cluster's own API server (tern's custom resources;
/// no etcd of tern's to run).
pub const DEFAULT_STORE: &str = "kubernetes";
/// The SQLite store of a single-node cluster, as an example in messages.
const SQLITE_EXAMPLE: &str = "sqlite:///var/lib/tern/tern.db";
/// The node's CNI directories when not given (the container runtimes' defaults).
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// Directory the DaemonSet mounts from the host for ternd's state (and a SQLite store).
pub const STATE_DIR: &str = "/var/lib/tern";
/// ternd's health listener in the pod (the node's loopback: the pod is hostNetwork).
pub const HEALTH_ADDR: &str = "127.0.0.1:9099";
/// The Secret holding etcd's TLS files (keys `etcd-ca`, `etcd-cert`, `etcd-key`).
pub const ETCD_SECRET: &str = "tern-etcd-certs";
/// Where the DaemonSet mounts [`ETCD_SECRET`] (read-only) in the containers that use the store.
pub const ETCD_CERTS_DIR: &str = "/etc/tern-etcd-certs";

/// The PEM files of etcd over TLS, read by [`read_tls`] and rendered into [`ETCD_SECRET`].
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed the etcd members' certificates (`--etcd-ca`).
    pub ca: String,
    /// Client certificate and key (`--etcd-cert`, `--etcd-key`), for etcd's
    /// `--client-cert-auth`; `None`: TLS without a client certificate.
    pub client: Option<(String, String)>,
}

/// Without the contents: a private key has no place in an error message or a log.
impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &format_args!("{} bytes", self.ca.len()))
            .field(
                "client",
                &self.client.as_ref().map(|_| "certificate and key"),
            )
            .finish()
    }
}

/// Reads one PEM file of `flag`, which must hold a block whose label ends with `label`
/// (`CERTIFICATE`, `PRIVATE KEY`).
fn read_pem(flag: &str, path: &Path, label: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read the file", path.display()))?;
    let has_block = text.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|r| r.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if !has_block {
        bail!(
            "{flag} {}: not a PEM file with a {label} (no -----BEGIN ...{label}----- line)",
            path.display()
        );
    }
    Ok(text)
}

/// Reads the TLS files given with `--etcd-ca`, `--etcd-cert` and `--etcd-key`: `None` when
/// none is given. A client certificate needs its key and the CA; each file must be a
/// readable PEM file of its kind. Errors name the flag and the path.
pub fn read_tls(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> anyhow::Result<Option<EtcdTls>> {
    let ca = match (ca, cert, key) {
        (None, None, None) => return Ok(None),
        (Some(ca), _, _) => ca,
        (None, _, _) => bail!(
            "--etcd-cert/--etcd-key need --etcd-ca too: the CA that signed the etcd members' \
             certificates"
        ),
    };
    let ca = read_pem("--etcd-ca", ca, "CERTIFICATE")?;
    let client = match (cert, key) {
        (None, None) => None,
        (Some(c), Some(k)) => Some((
            read_pem("--etcd-cert", c, "CERTIFICATE")?,
            read_pem("--etcd-key", k, "PRIVATE KEY")?,
        )),
        (Some(_), None) => bail!("--etcd-cert needs --etcd-key (the client certificate's key)"),
        (None, Some(_)) => bail!("--etcd-key needs --etcd-cert (the key's client certificate)"),
    };
    Ok(Some(EtcdTls { ca, client }))
}

/// What the manifest is rendered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestOptions {
    /// Store URL: `etcd://host:port[,host:port]` or `sqlite:///var/lib/tern/<file>`.
    pub store: String,
    /// Image of every container.
    pub image: String,
    /// CIDR of the default IPv4 pool.
    pub pool: String,
    /// CIDR of the default IPv6 pool (`--ipv6-pool`): pods get an IPv6 address too (a
    /// dual-stack cluster); `None`: IPv4 only.
    pub ipv6_pool: Option<String>,
    /// No IPv4 pool and no IPv4 pod addresses (`--no-ipv4-pool`, with `ipv6_pool`: an
    /// IPv6-only cluster).
    pub no_ipv4_pool: bool,
    /// Encapsulation of the default pool.
    pub encap: Encap,
    /// Run ternd's BGP speaker.
    pub bgp: bool,
    /// ternd's log level.
    pub log_level: String,
    /// The node's CNI bin directory (hostPath).
    pub cni_bin_dir: String,
    /// The node's CNI configuration directory (hostPath).
    pub cni_conf_dir: String,
    /// etcd over TLS: the Secret's files; `None`: plain http (or SQLite), no Secret.
    pub etcd_tls: Option<EtcdTls>,
}

impl Default for ManifestOptions {
    fn default() -> ManifestOptions {
        ManifestOptions {
            store: DEFAULT_STORE.into(),
            image: DEFAULT_IMAGE.into(),
            pool: tern_model::defaults::IPV4_POOL.into(),
            ipv6_pool: None,
            no_ipv4_pool: false,
            encap: Encap::None,
            bgp: false,
            log_level: "info".into(),
            cni_bin_dir: DEFAULT_CNI_BIN_DIR.into(),
            cni_conf_dir: DEFAULT_CNI_CONF_DIR.into(),
            etcd_tls: None,
        }
    }
}

/// Characters a value may not hold: it is written inside double quotes or as a plain YAML
/// scalar, so quotes, backslashes, whitespace and `#` would change the document.
fn check_plain(field: &str, v: &str) -> anyhow::Result<()> {
    if v.is_empty() {
        bail!("{field}: must not be empty");
    }
    if let Some(c) = v
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\\' | '\'' | '#'))
    {
        bail!("{field} {v:?}: must not contain {c:?}");
    }
    Ok(())
}

/// Checks every option, naming the one that is wrong.
pub fn validate(o: &ManifestOptions) -> anyhow::Result<()> {
    check_plain("--store", &o.store)?;
    if let Some(hosts) = o.store.strip_prefix("etcd://") {
        if hosts.is_empty() || hosts.split(',').any(|h| h.rsplit_once(':').is_none()) {
            bail!(
                "--store {:?}: expected etcd://host:port[,host:port]",
                o.store
            );
        }
    } else if let Some(path) = o.store.strip_prefix("sqlite://") {
        // The DaemonSet mounts only STATE_DIR from the host; a file elsewhere would live in
        // the container's filesystem and vanish with it.
        let ok = path
            .strip_prefix(STATE_DIR)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|f| !f.is_empty() && !f.contains('/'));
        if !ok {
            bail!(
                "--store {:?}: a SQLite store must be a file directly in {STATE_DIR} (the \
                 host directory the DaemonSet mounts), e.g. {SQLITE_EXAMPLE}",
                o.store
            );
        }
    } else if o.store.starts_with("https://") || o.store.starts_with("http://") {
        // The store's own spelling: the scheme is etcd://, TLS comes from the CA given.
        bail!(
            "--store {:?}: an etcd store is written etcd://host:port[,host:port]; for TLS add \
             --etcd-ca (and --etcd-cert/--etcd-key)",
            o.store
        );
    } else if o.store != "kubernetes" {
        // `kubernetes`: the pods' own API server, through their service account.
        bail!(
            "--store {:?}: expected etcd://host:port[,host:port], kubernetes or \
             sqlite://{STATE_DIR}/FILE",
            o.store
        );
    }
    if o.etcd_tls.is_some() && !o.store.starts_with("etcd://") {
        bail!(
            "--etcd-ca/--etcd-cert/--etcd-key: TLS is for an etcd:// store, not {:?}",
            o.store
        );
    }
    check_plain("--image", &o.image)?;
    for (field, dir) in [
        ("--cni-bin-dir", &o.cni_bin_dir),
        ("--cni-conf-dir", &o.cni_conf_dir),
    ] {
        check_plain(field, dir)?;
        if !dir.starts_with('/') || dir.split('/').any(|c| c == "..") {
            bail!("{field} {dir:?}: must be an absolute path without ..");
        }
    }
    o.pool
        .parse::<ipnet::Ipv4Net>()
        .with_context(|| format!("--pool {:?}: not an IPv4 CIDR", o.pool))?;
    if let Some(p6) = &o.ipv6_pool {
        let net = p6
            .parse::<ipnet::Ipv6Net>()
            .with_context(|| format!("--ipv6-pool {p6:?}: not an IPv6 CIDR"))?;
        if net.prefix_len() > IPV6_BLOCK_SIZE {
            bail!(
                "--ipv6-pool {p6:?}: smaller than one /{IPV6_BLOCK_SIZE} block (the pool's \
                 blockSize)"
            );
        }
    } else if o.no_ipv4_pool {
        bail!("--no-ipv4-pool needs --ipv6-pool: a cluster needs a pool of some family");
    }
    if o.no_ipv4_pool && o.encap == Encap::Ipip {
        bail!("--encap ipip carries IPv4 only; an IPv6-only cluster takes none or vxlan");
    }
    check_plain("--log-level", &o.log_level)?;
    // A level, or a filter as ternd takes it (`info,tern_agent::bgp=debug`).
    let level = ["error", "warn", "info", "debug", "trace"].contains(&o.log_level.as_str());
    let filter = o.log_level.contains(['=', ','])
        && o.log_level
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '=' | ','));
    if !level && !filter {
        bail!(
            "--log-level {:?}: expected error, warn, info, debug, trace or a filter such as \
             info,tern_agent::bgp=debug",
            o.log_level
        );
    }
    Ok(())
}

/// `vxlanMode` and `ipipMode` of the default pool, as the model spells them.
fn modes(e: Encap) -> (&'static str, &'static str) {
    let name = |m: tern_model::EncapMode| match m {
        tern_model::EncapMode::Always => "Always",
        tern_model::EncapMode::CrossSubnet => "CrossSubnet",
        tern_model::EncapMode::Never => "Never",
    };
    let (v, i) = e.pool_modes();
    (name(v), name(i))
}

/// Block size of the IPv6 pool (Calico's default for IPv6).
const IPV6_BLOCK_SIZE: u8 = 122;

/// The ConfigMap's `ippool.yaml` (replaces `@IPPOOLS@`): the IPv4 pool unless
/// `--no-ipv4-pool`, then the IPv6 pool when given, in the same encapsulation except IPIP,
/// which carries IPv4 only (the IPv6 pool of an IPIP cluster routes directly, as Calico's).
fn ippools(o: &ManifestOptions) -> String {
    let (vxlan, ipip4) = modes(o.encap);
    let pool = |name: &str, cidr: &str, block: Option<u8>| {
        let ipip = if block.is_some() { "Never" } else { ipip4 };
        let block = block
            .map(|b| format!("      blockSize: {b}\n"))
            .unwrap_or_default();
        format!(
            "    apiVersion: tern.dev/v1
    kind: IPPool
    metadata:
      name: {name}
    spec:
      cidr: {cidr}
{block}      vxlanMode: {vxlan}
      ipipMode: {ipip}
      natOutgoing: true
"
        )
    };
    let mut docs = Vec::new();
    if !o.no_ipv4_pool {
        docs.push(pool(tern_model::defaults::IPV4_POOL_NAME, &o.pool, None));
    }
    if let Some(p6) = &o.ipv6_pool {
        docs.push(pool(
            tern_model::defaults::IPV6_POOL_NAME,
            p6,
            Some(IPV6_BLOCK_SIZE),
        ));
    }
    docs.join("    ---\n")
}

/// The cni-conf container's extra `install-cni` arguments (replaces `@CNI_FAMILIES@`): the
/// address families every pod gets, when not IPv4 only.
fn cni_families(o: &ManifestOptions) -> String {
    let mut s = String::new();
    if o.ipv6_pool.is_some() {
        s.push_str("        - --assign-ipv6\n");
    }
    if o.no_ipv4_pool {
        s.push_str("        - --no-assign-ipv4\n");
    }
    s
}

/// The families of the default pools, as the ConfigMap's comment names them.
fn pool_families(o: &ManifestOptions) -> &'static str {
    match (o.no_ipv4_pool, o.ipv6_pool.is_some()) {
        (true, _) => "IPv6",
        (false, true) => "IPv4 and IPv6",
        (false, false) => "IPv4",
    }
}

/// The fields of a container that runs the image's ternctl (replaces `@TERNCTL@`, before
/// `@IMAGE@` is replaced).
const TERNCTL: &str = "image: @IMAGE@
        imagePullPolicy: IfNotPresent
        command: [/usr/local/bin/ternctl]";

/// The arguments of `ternctl install-cni` into the node's CNI directories, as mounted
/// (replaces `@INSTALL_CNI@`).
const INSTALL_CNI: &str = "- install-cni
        - --bin-dir=/host/opt/cni/bin
        - --conf-dir=/host/etc/cni/net.d";

/// The manifest (`manifest.yaml` beside this file). Placeholders `@NAME@` are replaced by
/// [`render`]; the YAML fragments above fill `@TERNCTL@`, `@INSTALL_CNI@`, and below
/// `@ETCD_ENV@` and `@ETCD_MOUNT@`.
const TEMPLATE: &str = include_str!("manifest.yaml");

/// etcd's TLS settings from tern-config (replaces `@ETCD_ENV@`), in each container that
/// opens the store: ternd and ternctl read them (empty: no TLS).
const ETCD_ENV: &str = "- name: TERN_ETCD_CA
          valueFrom: {configMapKeyRef: {name: tern-config, key: etcd_ca}}
        - name: TERN_ETCD_CERT
          valueFrom: {configMapKeyRef: {name: tern-config, key: etcd_cert}}
        - name: TERN_ETCD_KEY
          valueFrom: {configMapKeyRef: {name: tern-config, key: etcd_key}}";

/// The Secret's mount (replaces `@ETCD_MOUNT@`).
const ETCD_MOUNT: &str = "{name: etcd-certs, mountPath: /etc/tern-etcd-certs, readOnly: true}";

/// The Secret with etcd's TLS files (replaces `@ETCD_SECRET@` when TLS is given): the values
/// are base64, so the PEM text cannot change the document.
fn etcd_secret(tls: &EtcdTls) -> String {
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t.as_bytes());
    let mut s = format!(
        "---
# etcd's TLS files for ternd and apply-ippool (tern-config's etcd_* keys name them as mounted).
apiVersion: v1
kind: Secret
type: Opaque
metadata:
  name: {ETCD_SECRET}
  namespace: kube-system
  labels:
    app.kubernetes.io/name: tern
data:
  etcd-ca: \"{}\"
",
        b64(&tls.ca)
    );
    if let Some((cert, key)) = &tls.client {
        let _ = writeln!(s, "  etcd-cert: \"{}\"", b64(cert));
        let _ = writeln!(s, "  etcd-key: \"{}\"", b64(key));
    }
    s
}

/// The options that differ from the defaults, as command-line flags (for the header).
fn args_line(o: &ManifestOptions) -> String {
    let d = ManifestOptions::default();
    let mut s = String::new();
    if o.store != d.store {
        let _ = write!(s, " --store {}", o.store);
    }
    if o.image != d.image {
        let _ = write!(s, " --image {}", o.image);
    }
    if o.pool != d.pool {
        let _ = write!(s, " --pool {}", o.pool);
    }
    if let Some(p6) = &o.ipv6_pool {
        let _ = write!(s, " --ipv6-pool {p6}");
    }
    if o.no_ipv4_pool {
        s.push_str(" --no-ipv4-pool");
    }
    if o.encap != d.encap {
        let _ = write!(s, " --encap {}", o.encap.as_str());
    }
    if o.bgp {
        s.push_str(" --bgp");
    }
    if o.log_level != d.log_level {
        let _ = write!(s, " --log-level {}", o.log_level);
    }
    if o.cni_bin_dir != d.cni_bin_dir {
        let _ = write!(s, " --cni-bin-dir {}", o.cni_bin_dir);
    }
    if o.cni_conf_dir != d.cni_conf_dir {
        let _ = write!(s, " --cni-conf-dir {}", o.cni_conf_dir);
    }
    // The files' paths are the renderer's machine's, not the manifest's: only the flags.
    if let Some(tls) = &o.etcd_tls {
        s.push_str(" --etcd-ca FILE");
        if tls.client.is_some() {
            s.push_str(" --etcd-cert FILE --etcd-key FILE");
        }
    }
    s
}

/// Renders the manifest (validated options only).
pub fn render(o: &ManifestOptions) -> anyhow::Result<String> {
    validate(o)?;
    let port = HEALTH_ADDR
        .rsplit_once(':')
        .map(|(_, p)| p)
        .unwrap_or("9099");
    let file = |name: &str| format!("{ETCD_CERTS_DIR}/{name}");
    let (secret, ca, cert, key) = match &o.etcd_tls {
        None => Default::default(),
        Some(tls) => {
            let (cert, key) = match tls.client {
                Some(_) => (file("etcd-cert"), file("etcd-key")),
                None => Default::default(),
            };
            (etcd_secret(tls), file("etcd-ca"), cert, key)
        }
    };
    Ok(TEMPLATE
        .replace("@TERNCTL@", TERNCTL)
        .replace("@INSTALL_CNI@", INSTALL_CNI)
        .replace("@ARGS@", &args_line(o))
        .replace("@STORE@", &o.store)
        .replace("@ETCD_SECRET@", &secret)
        .replace("@ETCD_CA@", &ca)
        .replace("@ETCD_CERT@", &cert)
        .replace("@ETCD_KEY@", &key)
        .replace("@ETCD_ENV@", ETCD_ENV)
        .replace("@ETCD_MOUNT@", ETCD_MOUNT)
        .replace("@BGP@", if o.bgp { "true" } else { "false" })
        .replace("@LOG_LEVEL@", &o.log_level)
        .replace("@POOL_FAMILIES@", pool_families(o))
        .replace("@IPPOOLS@", &ippools(o))
        // Only the cni-conf container writes the conflist, so only it is told the families.
        .replace("@CNI_FAMILIES@", &cni_families(o))
        .replace(
            "@HOST_IPS@",
            if o.ipv6_pool.is_some() {
                "status.hostIPs"
            } else {
                "status.hostIP"
            },
        )
        .replace(
            "@TERND_FAMILY_ENV@",
            if o.no_ipv4_pool {
                "        # IPv6 only: ternd creates no IPv4 pool when it finds none.
        - name: TERN_NO_DEFAULT_IPV4_POOL
          value: \"true\"
"
            } else {
                ""
            },
        )
        .replace("@IMAGE@", &o.image)
        .replace("@HEALTH_ADDR@", HEALTH_ADDR)
        .replace("@HEALTH_PORT@", port)
        .replace("@CNI_BIN_DIR@", &o.cni_bin_dir)
        .replace("@CNI_CONF_DIR@", &o.cni_conf_dir)
        + CRDS_HEADER
        + &tern_store::kube::crds_yaml())
}

/// Before the CustomResourceDefinitions.
const CRDS_HEADER: &str =
    "# tern's state as custom resources (group tern.dev), for the Kubernetes datastore
# (--store kubernetes): IP pools, policies and BGP resources are the documents `ternctl apply`
# takes; IPAM blocks, affinities and handles are records tern writes (`kubectl get ipamblocks`);
# WorkloadEndpoints are no resource of tern's: they are derived from the Pods.
";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    /// The checked-in manifest, relative to this crate.
    const CHECKED_IN: &str = include_str!("../../../../manifests/tern.yaml");

    /// Every document of a YAML stream as JSON.
    fn docs(text: &str) -> Vec<Value> {
        use serde::Deserialize;
        serde_norway::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).expect("valid YAML"))
            .filter(|v| !v.is_null())
            .collect()
    }

    /// The objects every rendering starts with (the RBAC and the ConfigMap), in order.
    const FIRST_KINDS: [&str; 4] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
    ];

    /// The `kind` of each document, in order.
    /// The CustomResourceDefinitions at the end of every rendering.
    /// The CRDs (every class and the leases), then the pool-overlap admission policy.
    fn crds() -> Vec<&'static str> {
        // One per class of keys with objects of its own (not the endpoints derived from
        // Pods), and the leases'.
        let with_crd = tern_store::kube::CLASSES
            .iter()
            .filter(|c| c.shape != tern_store::kube::Shape::DerivedFromPods)
            .count();
        let mut k = vec!["CustomResourceDefinition"; with_crd + 1];
        k.extend([
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]);
        k
    }

    fn kinds(d: &[Value]) -> Vec<&str> {
        d.iter().map(|v| v["kind"].as_str().unwrap()).collect()
    }

    /// Paths (`doc/key/key/0/...`) whose values differ between `a` and `b`.
    fn diff(path: &str, a: &Value, b: &Value, out: &mut BTreeSet<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let n = Value::Null;
                    diff(
                        &format!("{path}/{k}"),
                        x.get(k).unwrap_or(&n),
                        y.get(k).unwrap_or(&n),
                        out,
                    );
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    diff(&format!("{path}/{i}"), p, q, out);
                }
            }
            _ if a != b => {
                out.insert(path.to_string());
            }
            _ => {}
        }
    }

    fn changed(o: &ManifestOptions) -> BTreeSet<String> {
        let a = docs(&render(&ManifestOptions::default()).unwrap());
        let b = docs(&render(o).unwrap());
        assert_eq!(a.len(), b.len());
        let mut out = BTreeSet::new();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            diff(&i.to_string(), x, y, &mut out);
        }
        out
    }

    fn set(paths: &[&str]) -> BTreeSet<String> {
        paths.iter().map(|s| s.to_string()).collect()
    }

    /// `manifests/tern.yaml` is the golden file of the default rendering: after a change checked
    /// by hand, `TERN_GOLDEN_UPDATE=1 cargo test -p tern-ctl --lib install_manifest` rewrites
    /// it (as does `ternctl install manifest > manifests/tern.yaml`).
    #[test]
    fn checked_in_manifest_is_the_default_rendering() {
        let now = render(&ManifestOptions::default()).unwrap();
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/tern.yaml");
        tern_testkit::golden::check_file(&golden, &now);
    }

    /// Every `@NAME@` of the template is filled, with and without the optional parts.
    #[test]
    fn every_placeholder_is_filled() {
        let (_dir, ca, cert, key) = pem_files();
        let tls = read_tls(Some(&ca), Some(&cert), Some(&key))
            .unwrap()
            .unwrap();
        for o in [ManifestOptions::default(), tls_options(tls)] {
            // The manifest has no `@` of its own.
            let text = render(&o).unwrap();
            let left = text.lines().find(|l| l.contains('@'));
            assert!(left.is_none(), "a placeholder is left: {left:?}");
        }
        assert!(TEMPLATE.contains("@STORE@") && TEMPLATE.starts_with("# tern: a Kubernetes"));
    }

    #[test]
    fn default_manifest_has_the_objects_and_fields() {
        let d = docs(CHECKED_IN);
        assert_eq!(
            kinds(&d),
            [&FIRST_KINDS[..], &["DaemonSet"], &crds()].concat()
        );
        let ds = &d[4]["spec"]["template"]["spec"];
        assert_eq!(ds["hostNetwork"], true);
        assert_eq!(
            ds["tolerations"],
            serde_json::json!([{"operator": "Exists"}])
        );
        let ternd = &ds["containers"][0];
        assert_eq!(ternd["args"], serde_json::json!(["--kubernetes"]));
        assert_eq!(ternd["livenessProbe"]["httpGet"]["port"], 9099);
        assert_eq!(ternd["livenessProbe"]["httpGet"]["host"], "127.0.0.1");
        // The ConfigMap's pool document is a valid tern IPPool.
        let pool = d[3]["data"]["ippool.yaml"].as_str().unwrap();
        let parsed = tern_model::parse::parse_stream(pool, "ippool.yaml").unwrap();
        assert_eq!(parsed.len(), 1);
    }

    /// `--ipv6-pool`: a second IPPool (/122 blocks, same encapsulation) in `ippool.yaml`, the
    /// cni-conf container asks for both families, ternd gets both node addresses;
    /// `--no-ipv4-pool` leaves the IPv4 pool and IPv4 pod addresses out.
    #[test]
    fn ipv6_pool_renders_dual_and_ipv6_only_clusters() {
        let dual = ManifestOptions {
            ipv6_pool: Some("fd00:10:244::/48".into()),
            encap: Encap::Vxlan,
            ..ManifestOptions::default()
        };
        let d = docs(&render(&dual).unwrap());
        let pools = d[3]["data"]["ippool.yaml"].as_str().unwrap();
        let parsed = tern_model::parse::parse_stream(pools, "ippool.yaml").unwrap();
        assert_eq!(parsed.len(), 2, "{pools}");
        assert!(pools.contains("name: default-ipv6-ippool"), "{pools}");
        assert!(
            pools.contains("cidr: fd00:10:244::/48\n  blockSize: 122\n"),
            "{pools}"
        );
        assert_eq!(pools.matches("vxlanMode: Always").count(), 2, "{pools}");
        // IPIP carries IPv4 only: the IPv6 pool of an IPIP cluster routes directly.
        let ipip = ManifestOptions {
            encap: Encap::Ipip,
            ..dual.clone()
        };
        let di = docs(&render(&ipip).unwrap());
        let pools_ipip = di[3]["data"]["ippool.yaml"].as_str().unwrap();
        let (p4, p6) = pools_ipip.split_once("---").unwrap();
        assert!(
            p4.contains("ipipMode: Always") && p6.contains("ipipMode: Never"),
            "{pools_ipip}"
        );
        let ds = &d[4]["spec"]["template"]["spec"];
        let cni_conf: Vec<&str> = ds["containers"][1]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(cni_conf.contains(&"--assign-ipv6"), "{cni_conf:?}");
        assert!(!cni_conf.contains(&"--no-assign-ipv4"), "{cni_conf:?}");
        let env = ds["containers"][0]["env"].as_array().unwrap();
        let node_ip = env.iter().find(|e| e["name"] == "TERN_NODE_IP").unwrap();
        assert_eq!(
            node_ip["valueFrom"]["fieldRef"]["fieldPath"],
            "status.hostIPs"
        );
        assert!(!env.iter().any(|e| e["name"] == "TERN_NO_DEFAULT_IPV4_POOL"));

        let v6 = ManifestOptions {
            no_ipv4_pool: true,
            ..dual.clone()
        };
        let text = render(&v6).unwrap();
        assert!(text.contains("# Rendered by `ternctl install manifest --ipv6-pool fd00:10:244::/48 --no-ipv4-pool --encap vxlan`."));
        let d = docs(&text);
        let pools = d[3]["data"]["ippool.yaml"].as_str().unwrap();
        assert!(!pools.contains("default-ipv4-ippool"), "{pools}");
        let ds = &d[4]["spec"]["template"]["spec"];
        assert!(
            ds["containers"][1]["args"]
                .as_array()
                .unwrap()
                .contains(&Value::from("--no-assign-ipv4"))
        );
        let env = ds["containers"][0]["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "TERN_NO_DEFAULT_IPV4_POOL"));

        for (o, want) in [
            (
                ManifestOptions {
                    ipv6_pool: Some("10.9.0.0/16".into()),
                    ..ManifestOptions::default()
                },
                "not an IPv6 CIDR",
            ),
            (
                ManifestOptions {
                    ipv6_pool: Some("fd00::/124".into()),
                    ..ManifestOptions::default()
                },
                "smaller than one /122 block",
            ),
            (
                ManifestOptions {
                    no_ipv4_pool: true,
                    ..ManifestOptions::default()
                },
                "--no-ipv4-pool needs --ipv6-pool",
            ),
            (
                ManifestOptions {
                    encap: Encap::Ipip,
                    ..v6.clone()
                },
                "carries IPv4 only",
            ),
        ] {
            let e = format!("{:#}", render(&o).unwrap_err());
            assert!(e.contains(want), "{o:?}: {e}");
        }
    }

    #[test]
    fn each_option_changes_exactly_its_fields() {
        let dflt = ManifestOptions::default();
        let store = ManifestOptions {
            store: "etcd://198.18.0.3:2379,198.18.0.4:2379".into(),
            ..dflt.clone()
        };
        assert_eq!(changed(&store), set(&["3/data/store"]));
        let image = ManifestOptions {
            image: "registry.example/tern-node:9".into(),
            ..dflt.clone()
        };
        let ds = "4/spec/template/spec";
        assert_eq!(
            changed(&image),
            set(&[
                &format!("{ds}/initContainers/0/image"),
                &format!("{ds}/initContainers/1/image"),
                &format!("{ds}/containers/0/image"),
                &format!("{ds}/containers/1/image"),
            ])
        );
        // The pool and the encapsulation live in the ConfigMap's IPPool document (a string).
        for (o, needle) in [
            (
                ManifestOptions {
                    pool: "10.50.0.0/16".into(),
                    ..dflt.clone()
                },
                "cidr: 10.50.0.0/16",
            ),
            (
                ManifestOptions {
                    encap: Encap::Vxlan,
                    ..dflt.clone()
                },
                "vxlanMode: Always",
            ),
            (
                ManifestOptions {
                    encap: Encap::Crosssubnet,
                    ..dflt.clone()
                },
                "vxlanMode: CrossSubnet",
            ),
            (
                ManifestOptions {
                    encap: Encap::Ipip,
                    ..dflt.clone()
                },
                "ipipMode: Always",
            ),
        ] {
            assert_eq!(changed(&o), set(&["3/data/ippool.yaml"]), "{o:?}");
            let text = render(&o).unwrap();
            assert!(text.contains(needle), "{needle}");
        }
        let bgp = ManifestOptions {
            bgp: true,
            ..dflt.clone()
        };
        assert_eq!(changed(&bgp), set(&["3/data/bgp"]));
        assert!(render(&bgp).unwrap().contains("  bgp: \"true\"\n"));
        let log = ManifestOptions {
            log_level: "debug".into(),
            ..dflt.clone()
        };
        assert_eq!(changed(&log), set(&["3/data/log_level"]));
        let filter = ManifestOptions {
            log_level: "info,tern_agent::kube=debug".into(),
            ..dflt.clone()
        };
        assert_eq!(changed(&filter), set(&["3/data/log_level"]));
        let dirs = ManifestOptions {
            cni_bin_dir: "/run/lab/node1/cni/bin".into(),
            cni_conf_dir: "/run/lab/node1/cni/net.d".into(),
            ..dflt.clone()
        };
        assert_eq!(
            changed(&dirs),
            set(&[
                "4/spec/template/spec/volumes/5/hostPath/path",
                "4/spec/template/spec/volumes/6/hostPath/path",
            ])
        );
        // The header names the flags used.
        let text = render(&ManifestOptions {
            bgp: true,
            encap: Encap::Vxlan,
            ..dflt
        })
        .unwrap();
        assert!(
            text.contains("# Rendered by `ternctl install manifest --encap vxlan --bgp`."),
            "{}",
            text.lines().nth(3).unwrap()
        );
    }

    /// PEM-looking files in a temporary directory: (dir, ca, cert, key).
    fn pem_files() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, label: &str, body: &str| {
            let p = dir.path().join(name);
            let text = format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n");
            std::fs::write(&p, text).unwrap();
            p
        };
        let ca = write("ca.crt", "CERTIFICATE", "Q0EgIyBub3QgYSBjb21tZW50Cg==");
        let cert = write("client.crt", "CERTIFICATE", "Y2xpZW50Ogp4OiAiInkK");
        let key = write("client.key", "EC PRIVATE KEY", "a2V5IGl0c2VsZg==");
        (dir, ca, cert, key)
    }

    fn tls_options(tls: EtcdTls) -> ManifestOptions {
        ManifestOptions {
            store: "etcd://198.18.0.2:2379".into(),
            etcd_tls: Some(tls),
            ..ManifestOptions::default()
        }
    }

    fn by_name<'a>(list: &'a Value, name: &str) -> &'a Value {
        list.as_array()
            .and_then(|l| l.iter().find(|v| v["name"] == name))
            .unwrap_or_else(|| panic!("{name} not in {list}"))
    }

    #[test]
    fn etcd_tls_renders_the_secret_and_names_its_files() {
        let (_dir, ca, cert, key) = pem_files();
        let tls = read_tls(Some(&ca), Some(&cert), Some(&key))
            .unwrap()
            .expect("TLS given");
        let o = tls_options(tls);
        let text = render(&o).unwrap();
        let mut d = docs(&text);
        assert_eq!(
            kinds(&d),
            [&FIRST_KINDS[..], &["Secret", "DaemonSet"], &crds()].concat()
        );
        // The Secret holds the files byte for byte.
        let secret = d.remove(4);
        assert_eq!(secret["metadata"]["name"], ETCD_SECRET);
        assert_eq!(secret["metadata"]["namespace"], "kube-system");
        assert_eq!(secret["type"], "Opaque");
        let data = secret["data"].as_object().unwrap();
        assert_eq!(data.len(), 3, "{data:?}");
        for (k, file) in [("etcd-ca", &ca), ("etcd-cert", &cert), ("etcd-key", &key)] {
            let got = base64::engine::general_purpose::STANDARD
                .decode(data[k].as_str().unwrap())
                .unwrap();
            assert_eq!(got, std::fs::read(file).unwrap(), "{k}");
        }
        // The ConfigMap names the mounted files; nothing else differs from the default
        // (the DaemonSet is the same: it always mounts the optional Secret).
        let base = docs(&render(&tls_options_store_only()).unwrap());
        let mut out = BTreeSet::new();
        for (i, (x, y)) in base.iter().zip(&d).enumerate() {
            diff(&i.to_string(), x, y, &mut out);
        }
        assert_eq!(
            out,
            set(&["3/data/etcd_ca", "3/data/etcd_cert", "3/data/etcd_key"])
        );
        let cm = &d[3]["data"];
        for (k, file) in [
            ("etcd_ca", "etcd-ca"),
            ("etcd_cert", "etcd-cert"),
            ("etcd_key", "etcd-key"),
        ] {
            assert_eq!(cm[k], format!("{ETCD_CERTS_DIR}/{file}"), "{k}");
            assert!(data.contains_key(file), "{file}");
        }
        // Mounted read-only (mode 0400) where the ConfigMap says, in both containers that
        // open the store, with the settings in their environment.
        let spec = &d[4]["spec"]["template"]["spec"];
        let vol = by_name(&spec["volumes"], "etcd-certs");
        assert_eq!(
            vol["secret"],
            serde_json::json!({"secretName": ETCD_SECRET, "optional": true, "defaultMode": 0o400})
        );
        for c in [
            by_name(&spec["initContainers"], "apply-ippool"),
            by_name(&spec["containers"], "ternd"),
        ] {
            let m = by_name(&c["volumeMounts"], "etcd-certs");
            assert_eq!(m["mountPath"], ETCD_CERTS_DIR, "{}", c["name"]);
            assert_eq!(m["readOnly"], true, "{}", c["name"]);
            for (var, key) in [
                ("TERN_ETCD_CA", "etcd_ca"),
                ("TERN_ETCD_CERT", "etcd_cert"),
                ("TERN_ETCD_KEY", "etcd_key"),
            ] {
                assert_eq!(
                    by_name(&c["env"], var)["valueFrom"]["configMapKeyRef"],
                    serde_json::json!({"name": "tern-config", "key": key}),
                    "{} {var}",
                    c["name"]
                );
            }
        }
        // The header names the flags, not this machine's paths.
        assert!(
            text.contains(
                "# Rendered by `ternctl install manifest --store etcd://198.18.0.2:2379 \
                 --etcd-ca FILE --etcd-cert FILE --etcd-key FILE`."
            ),
            "{}",
            text.lines().nth(3).unwrap()
        );
        assert!(!text.contains(ca.to_str().unwrap()));
    }

    /// The TLS options' store without TLS.
    fn tls_options_store_only() -> ManifestOptions {
        ManifestOptions {
            store: "etcd://198.18.0.2:2379".into(),
            ..ManifestOptions::default()
        }
    }

    #[test]
    fn etcd_tls_with_a_ca_only_has_no_client_files() {
        let (_dir, ca, _, _) = pem_files();
        let tls = read_tls(Some(&ca), None, None).unwrap().unwrap();
        assert_eq!(tls.client, None);
        let d = docs(&render(&tls_options(tls)).unwrap());
        let keys: Vec<&String> = d[4]["data"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["etcd-ca"]);
        assert_eq!(d[3]["data"]["etcd_ca"], format!("{ETCD_CERTS_DIR}/etcd-ca"));
        assert_eq!(d[3]["data"]["etcd_cert"], "");
        assert_eq!(d[3]["data"]["etcd_key"], "");
    }

    #[test]
    fn without_tls_there_is_no_secret_and_the_settings_are_empty() {
        assert_eq!(read_tls(None, None, None).unwrap(), None);
        let d = docs(CHECKED_IN);
        assert!(d.iter().all(|v| v["kind"] != "Secret"));
        for k in ["etcd_ca", "etcd_cert", "etcd_key"] {
            assert_eq!(d[3]["data"][k], "", "{k}");
        }
        // Still mounted (optional), so a Secret and a ConfigMap edit turn TLS on.
        let spec = &d[4]["spec"]["template"]["spec"];
        assert_eq!(
            by_name(&spec["volumes"], "etcd-certs")["secret"]["optional"],
            true
        );
    }

    #[test]
    fn bad_tls_files_are_named() {
        let (dir, ca, cert, key) = pem_files();
        let missing = dir.path().join("nope.crt");
        let not_pem = dir.path().join("plain.txt");
        std::fs::write(&not_pem, "just text\n").unwrap();
        let err = |ca: Option<&PathBuf>, cert: Option<&PathBuf>, key: Option<&PathBuf>| {
            let r = read_tls(
                ca.map(PathBuf::as_path),
                cert.map(PathBuf::as_path),
                key.map(PathBuf::as_path),
            );
            format!("{:#}", r.expect_err("an error"))
        };
        let m = missing.display().to_string();
        for (e, want) in [
            (
                err(Some(&missing), None, None),
                vec!["--etcd-ca", m.as_str()],
            ),
            (
                err(Some(&ca), Some(&missing), Some(&key)),
                vec!["--etcd-cert", m.as_str(), "cannot read"],
            ),
            (
                err(Some(&ca), Some(&cert), Some(&missing)),
                vec!["--etcd-key", m.as_str()],
            ),
            (err(None, Some(&cert), Some(&key)), vec!["need --etcd-ca"]),
            (err(None, None, Some(&key)), vec!["need --etcd-ca"]),
            (
                err(Some(&ca), Some(&cert), None),
                vec!["--etcd-cert needs --etcd-key"],
            ),
            (
                err(Some(&ca), None, Some(&key)),
                vec!["--etcd-key needs --etcd-cert"],
            ),
            (
                err(Some(&not_pem), None, None),
                vec!["--etcd-ca", "not a PEM file"],
            ),
            // A key given as the CA, a certificate as the key.
            (
                err(Some(&key), None, None),
                vec!["--etcd-ca", "CERTIFICATE"],
            ),
            (
                err(Some(&ca), Some(&cert), Some(&cert)),
                vec!["--etcd-key", "PRIVATE KEY"],
            ),
        ] {
            for w in want {
                assert!(e.contains(w), "{w:?} not in {e}");
            }
        }
        // TLS is for etcd; an https:// store is told how etcd's is spelt.
        let tls = read_tls(Some(&ca), None, None).unwrap().unwrap();
        let sqlite = ManifestOptions {
            etcd_tls: Some(tls.clone()),
            ..ManifestOptions::default()
        };
        let e = format!("{:#}", render(&sqlite).unwrap_err());
        assert!(e.contains("TLS is for an etcd:// store"), "{e}");
        let https = ManifestOptions {
            store: "https://198.18.0.2:2379".into(),
            ..tls_options(tls)
        };
        let e = format!("{:#}", render(&https).unwrap_err());
        assert!(
            e.contains("etcd://host:port") && e.contains("--etcd-ca"),
            "{e}"
        );
    }

    #[test]
    fn bad_options_are_named() {
        let d = ManifestOptions::default();
        for (o, want) in [
            (
                ManifestOptions {
                    store: "mysql://x".into(),
                    ..d.clone()
                },
                "--store",
            ),
            (
                ManifestOptions {
                    store: "sqlite:///tmp/x.db".into(),
                    ..d.clone()
                },
                "directly in /var/lib/tern",
            ),
            (
                ManifestOptions {
                    store: "etcd://".into(),
                    ..d.clone()
                },
                "etcd://host:port",
            ),
            (
                ManifestOptions {
                    image: "a b".into(),
                    ..d.clone()
                },
                "--image",
            ),
            (
                ManifestOptions {
                    image: "x\"\nkind: Secret".into(),
                    ..d.clone()
                },
                "--image",
            ),
            (
                ManifestOptions {
                    pool: "10.0.0.0/33".into(),
                    ..d.clone()
                },
                "--pool",
            ),
            (
                ManifestOptions {
                    pool: "fd00::/64".into(),
                    ..d.clone()
                },
                "not an IPv4 CIDR",
            ),
            (
                ManifestOptions {
                    cni_conf_dir: "etc/cni".into(),
                    ..d.clone()
                },
                "--cni-conf-dir",
            ),
            (
                ManifestOptions {
                    log_level: "loud".into(),
                    ..d.clone()
                },
                "--log-level",
            ),
        ] {
            let e = format!("{:#}", render(&o).unwrap_err());
            assert!(e.contains(want), "{o:?}: {e}");
        }
    }
}
