//! A real etcd and kube-apiserver for tests (no kubelet, no controller-manager) on the loopback
//! of a node network namespace, with certificates made by `tern-pki`, RBAC authorization, an
//! admin `kubectl`, and client-certificate kubeconfigs for other users (ternd's); for the test
//! targets named `*kube*` (`scripts/test.sh` runs them once the components are built).
//!
//! Everything runs inside a network namespace the test created (`ip netns exec`), so the root
//! namespace is never touched and fixed ports cannot collide with anything. Every process is
//! started here and killed by PID on drop; the files live in the caller's temp dir. The
//! certificates are made in one place, [`Ca`] (with `tern-pki`).

use serde_json::Value;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tern_pki::{CertSpec, San};

use crate::netns::{Netns, in_netns};
use crate::ternd::Ternd;
use crate::wait::wait_until;

/// Where `scripts/k8s-components.sh` puts the binaries (overridable with `TERN_K8S_BIN`).
pub const DEFAULT_BIN: &str = "/var/cache/tern/k8s/v1.34.4/bin";
/// Port of etcd's client URL on the namespace's loopback.
pub const ETCD_PORT: u16 = 2379;
/// Port of kube-apiserver's secure port on the namespace's loopback.
pub const API_PORT: u16 = 6443;

const K8S_BINARIES: [&str; 3] = ["etcd", "kube-apiserver", "kubectl"];

/// Directory of the Kubernetes binaries: `TERN_K8S_BIN`, else [`DEFAULT_BIN`].
pub fn bin_dir() -> PathBuf {
    PathBuf::from(std::env::var("TERN_K8S_BIN").unwrap_or_else(|_| DEFAULT_BIN.into()))
}

/// What these tests need: root and the Kubernetes binaries; fails the test
/// naming the command that builds them. Their directory.
#[track_caller]
pub fn need_k8s() -> PathBuf {
    crate::need_root();
    let dir = bin_dir();
    let missing: Vec<&str> = K8S_BINARIES
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    crate::need(
        &format!("the Kubernetes binaries {missing:?} in {}", dir.display()),
        missing.is_empty(),
        "build them with `scripts/k8s-components.sh` (from the repository root; it needs Go \
         1.24+ and prints the directory it filled), or set TERN_K8S_BIN to another directory",
    );
    eprintln!("kubernetes binaries: {}", dir.display());
    dir
}

/// The certificates of the API server, all made here: a certificate authority in `dir`
/// (`ca.crt`, `ca.key`) that signs the server's (`apiserver.crt`) and the clients' certificates
/// ([`Ca::client`]), and the service-account key pair (`sa.key`, `sa.pub`).
pub struct Ca {
    pub dir: PathBuf,
    pki: tern_pki::Ca,
}

impl Ca {
    /// The CA, the API server's certificate for `127.0.0.1`, `advertise` and the service
    /// address, and the service-account key pair.
    pub fn for_apiserver(dir: &Path, advertise: &str) -> Ca {
        let ca = Ca::new(dir);
        let advertise_ip: IpAddr = advertise
            .parse()
            .unwrap_or_else(|e| panic!("advertise address {advertise:?}: {e}"));
        let sans = [
            San::Ip([127, 0, 0, 1].into()),
            San::Ip(advertise_ip),
            San::Ip([10, 96, 0, 1].into()),
            San::dns("localhost"),
            San::dns("kubernetes.default.svc"),
        ];
        ca.issue("apiserver", &CertSpec::server("kube-apiserver", sans));
        let sa = tern_pki::CertPair {
            cert: ca.dir.join("sa.pub"),
            key: ca.dir.join("sa.key"),
        };
        tern_pki::signing_key_pair(&sa).unwrap_or_else(|e| panic!("service-account keys: {e}"));
        ca
    }

    pub fn new(dir: &Path) -> Ca {
        let pki = tern_pki::Ca::new("tern-test-ca", Duration::from_secs(2 * 24 * 3600))
            .and_then(|ca| ca.write(dir, "ca").map(|_| ca))
            .unwrap_or_else(|e| panic!("making the CA: {e}"));
        Ca {
            dir: dir.to_path_buf(),
            pki,
        }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Signs a key pair `<name>.crt`/`<name>.key` as `spec` says.
    pub fn issue(&self, name: &str, spec: &tern_pki::CertSpec) -> (PathBuf, PathBuf) {
        let pair = self
            .pki
            .issue(spec)
            .and_then(|c| c.write(&self.dir, name))
            .unwrap_or_else(|e| panic!("issuing {name}: {e}"));
        (pair.cert, pair.key)
    }

    /// A client certificate for user `cn` in groups `orgs` (one at most).
    pub fn client(&self, name: &str, cn: &str, orgs: &[&str]) -> (PathBuf, PathBuf) {
        let spec = match orgs {
            [] => tern_pki::CertSpec::client(cn),
            [group] => tern_pki::CertSpec::client(cn).org(*group),
            _ => panic!("{cn}: a certificate names one group at most, not {orgs:?}"),
        };
        self.issue(name, &spec)
    }
}

/// etcd + kube-apiserver inside the network namespace `netns`.
pub struct KubeApi {
    pub netns: String,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub ca: Ca,
    /// The node's underlay address, advertised by the API server.
    pub advertise: String,
    /// kube-apiserver's `--bind-address`: the namespace's loopback, or `0.0.0.0` (every
    /// address of the namespace) when other namespaces reach it at `advertise`.
    pub bind_address: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    apiserver_starts: usize,
    admin: PathBuf,
    /// kubectl's `--request-timeout`.
    pub request_timeout: Duration,
}

/// Outcome of one kubectl run.
pub struct KubectlOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl KubeApi {
    /// Starts etcd and kube-apiserver in `netns` with files under `dir`, and waits until the
    /// API server is ready (RBAC bootstrap roles included). It listens on the namespace's
    /// loopback only.
    pub fn start(netns: &str, dir: &Path, advertise: &str) -> KubeApi {
        KubeApi::start_bound(netns, dir, advertise, "127.0.0.1")
    }

    /// As [`KubeApi::start`], kube-apiserver listening on every address of `netns`
    /// (`--bind-address=0.0.0.0`), so that node namespaces on an underlay reach it at
    /// `advertise` ([`KubeApi::remote_kubeconfig`]). etcd stays on the loopback.
    pub fn start_reachable(netns: &str, dir: &Path, advertise: &str) -> KubeApi {
        KubeApi::start_bound(netns, dir, advertise, "0.0.0.0")
    }

    fn start_bound(netns: &str, dir: &Path, advertise: &str, bind: &str) -> KubeApi {
        let bin = bin_dir();
        std::fs::create_dir_all(dir).unwrap();
        let ca = Ca::for_apiserver(&dir.join("pki"), advertise);
        let mut api = KubeApi {
            netns: netns.to_string(),
            dir: dir.to_path_buf(),
            bin,
            ca,
            advertise: advertise.to_string(),
            bind_address: bind.to_string(),
            etcd: None,
            apiserver: None,
            apiserver_starts: 0,
            admin: PathBuf::new(),
            request_timeout: Duration::from_secs(10),
        };
        api.admin = api.kubeconfig("admin", "admin", &["system:masters"]);
        api.start_etcd();
        api.start_apiserver();
        api
    }

    fn spawn(&self, log: &str, bin: &Path, args: &[String]) -> Child {
        let log = File::create(self.dir.join(log)).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()))
    }

    fn port_open(&self, port: u16) -> bool {
        in_netns(&format!("/run/netns/{}", self.netns), move || {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                Duration::from_millis(300),
            )
            .is_ok()
        })
    }

    fn start_etcd(&mut self) {
        let data = self.dir.join("etcd-data");
        let url = format!("http://127.0.0.1:{ETCD_PORT}");
        let peer = "http://127.0.0.1:2380".to_string();
        let args: Vec<String> = vec![
            "--name".into(),
            "default".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen-client-urls".into(),
            url.clone(),
            "--advertise-client-urls".into(),
            url,
            "--listen-peer-urls".into(),
            peer.clone(),
            "--initial-advertise-peer-urls".into(),
            peer.clone(),
            "--initial-cluster".into(),
            format!("default={peer}"),
            "--unsafe-no-fsync".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        let etcd = self.bin.join("etcd");
        self.etcd = Some(self.spawn("etcd.log", &etcd, &args));
        let up = wait_until(Duration::from_secs(20), || self.port_open(ETCD_PORT));
        assert!(
            up,
            "etcd did not listen within 20 s: {}",
            self.log("etcd.log")
        );
    }

    /// Starts kube-apiserver (again) and waits for `/readyz`.
    pub fn start_apiserver(&mut self) {
        assert!(self.apiserver.is_none(), "kube-apiserver already running");
        let pki = &self.ca.dir;
        let p = |f: &str| pki.join(f).display().to_string();
        let args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{ETCD_PORT}"),
            format!("--bind-address={}", self.bind_address),
            format!("--secure-port={API_PORT}"),
            format!("--advertise-address={}", self.advertise),
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        self.apiserver_starts += 1;
        let log = format!("kube-apiserver.{}.log", self.apiserver_starts);
        let bin = self.bin.join("kube-apiserver");
        self.apiserver = Some(self.spawn(&log, &bin, &args));
        let ready = wait_until(Duration::from_secs(120), || {
            if let Some(c) = self.apiserver.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("kube-apiserver exited ({st}): {}", self.log(&log));
            }
            self.kubectl(&["get", "--raw=/readyz"]).is_ok()
        });
        assert!(
            ready,
            "kube-apiserver not ready within 120 s: {}",
            self.log(&log)
        );
    }

    /// Kills kube-apiserver (SIGKILL by PID) and reaps it.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self, name: &str) -> String {
        let s = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Writes a kubeconfig for user `cn` (groups `orgs`) with a client certificate, for
    /// clients in the API server's namespace (server `127.0.0.1`).
    pub fn kubeconfig(&self, name: &str, cn: &str, orgs: &[&str]) -> PathBuf {
        self.write_kubeconfig(name, cn, orgs, "127.0.0.1")
    }

    /// As [`KubeApi::kubeconfig`], for clients in other namespaces: the server is the
    /// advertised underlay address (needs [`KubeApi::start_reachable`]).
    pub fn remote_kubeconfig(&self, name: &str, cn: &str, orgs: &[&str]) -> PathBuf {
        self.write_kubeconfig(name, cn, orgs, &self.advertise)
    }

    fn write_kubeconfig(&self, name: &str, cn: &str, orgs: &[&str], host: &str) -> PathBuf {
        let (crt, key) = self.ca.client(name, cn, orgs);
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
             https://{host}:{API_PORT}\n    certificate-authority: {}\nusers:\n- name: {name}\n  \
             user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  \
             context:\n    cluster: test\n    user: {name}\ncurrent-context: test\n",
            self.ca.cert().display(),
            crt.display(),
            key.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs admin `kubectl ARGS` in the namespace; stdout or stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_in(args, None)
    }

    /// Admin `kubectl ARGS` with `stdin` (e.g. `apply -f -`): stdout, or stderr on failure.
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        let out = self.kubectl_out(args, stdin);
        if out.ok {
            Ok(out.stdout)
        } else {
            Err(out.stderr)
        }
    }

    /// Admin `kubectl ARGS` with `stdin`, keeping both outputs (warnings are on stderr, `auth
    /// can-i`'s "no" on stdout with exit status 1).
    pub fn kubectl_out(&self, args: &[&str], stdin: Option<&str>) -> KubectlOut {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin)
            .arg(format!(
                "--request-timeout={}s",
                self.request_timeout.as_secs()
            ))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning kubectl");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().expect("kubectl");
        KubectlOut {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn apply(&self, yaml: &str) {
        if let Err(e) = self.kubectl_in(&["apply", "-f", "-"], Some(yaml)) {
            panic!("kubectl apply failed: {e}\n{yaml}");
        }
    }

    /// Applies tern's CustomResourceDefinitions (`tern_store::kube::crds_yaml`) and waits
    /// until every CRD is Established.
    pub fn install_crds(&self) {
        self.kubectl_in(&["apply", "-f", "-"], Some(&tern_store::kube::crds_yaml()))
            .unwrap_or_else(|e| panic!("applying tern's CRDs: {e}"));
        self.must(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ]);
    }

    /// The UID the API server gave pod `ns/name`.
    pub fn pod_uid(&self, ns: &str, name: &str) -> String {
        self.must(&[
            "get",
            "pod",
            "-n",
            ns,
            name,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    }

    /// `kubectl ARGS` that must succeed.
    pub fn must(&self, args: &[&str]) -> String {
        self.kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {} failed: {e}", args.join(" ")))
    }

    /// `kubectl create -f -` of `objs` in `parallel` chunks at once (one kubectl each).
    pub fn create_parallel(&self, objs: &[Value], parallel: usize) {
        self.run_parallel(&["create", "-f", "-"], objs, parallel);
    }

    /// `kubectl ARGS` with `objs` as a multi-document stream on its stdin, split into
    /// `parallel` chunks run at once; each must succeed.
    pub fn run_parallel(&self, args: &[&str], objs: &[Value], parallel: usize) {
        let chunk = objs.len().div_ceil(parallel.max(1)).max(1);
        std::thread::scope(|s| {
            for part in objs.chunks(chunk) {
                s.spawn(move || {
                    let yaml = part
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n---\n");
                    if let Err(e) = self.kubectl_in(args, Some(&yaml)) {
                        panic!("kubectl {} failed: {e}", args.join(" "));
                    }
                });
            }
        });
    }

    /// The API server's `/metrics`, parsed ([`parse_metrics`]).
    pub fn metrics(&self) -> Vec<Sample> {
        parse_metrics(&self.must(&["get", "--raw", "/metrics"]))
    }

    /// kube-apiserver's PID while it runs (`ip netns exec` execs it: the child is the server).
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// etcd's PID while it runs.
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd.as_ref().map(Child::id)
    }
}

/// One sample of a Prometheus text exposition (the API server's `/metrics`): the metric's
/// name, its labels and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, "" when the sample has none.
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// Every sample line of a Prometheus text exposition (`name{k="v",...} value [timestamp]`);
/// comments, blank lines and lines that do not parse are skipped.
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_sample).collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        // label="value" pairs; a value may hold escaped quotes, commas and braces.
        let mut chars = body.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                c => value.push(c),
                            },
                            c => value.push(c),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        };
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop_apiserver();
        if let Some(mut c) = self.etcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// ternd's ClusterRole and its binding to the user `tern-agent` (the kubeconfig of
/// [`KubeApi::kubeconfig`]`("tern-agent", "tern-agent", &[])`).
pub const AGENT_RBAC: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tern-node}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [get, list, watch]
- apiGroups: ["networking.k8s.io"]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: tern-node}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: tern-node}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: tern-agent}
"#;

/// The user of the manifest's ServiceAccount `kube-system/tern-node` (a kubeconfig of
/// [`KubeApi::kubeconfig`] for it authenticates as the DaemonSet's ternd does).
pub const SA_USER: &str = "system:serviceaccount:kube-system:tern-node";

/// The ServiceAccount, ClusterRole and ClusterRoleBinding of `manifests/tern.yaml`.
pub fn manifest_rbac() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../manifests/tern.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let docs: Vec<&str> = text
        .split("\n---\n")
        .filter(|d| {
            ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
                .iter()
                .any(|k| d.lines().any(|l| l.trim() == format!("kind: {k}")))
        })
        .collect();
    assert_eq!(docs.len(), 3, "RBAC documents of {path}");
    docs.join("\n---\n")
}

/// A node with the API server: its namespace (underlay address `node_ip`), etcd and
/// kube-apiserver in it, the test's files; dropped API server first, then the namespace.
pub struct KubeNode {
    pub api: KubeApi,
    pub netns: Netns,
    pub tmp: tempfile::TempDir,
}

impl KubeNode {
    /// Starts the API server in a fresh node namespace with ternd's RBAC applied.
    pub fn start(node_ip: &str) -> KubeNode {
        let tmp = tempfile::Builder::new().prefix("tk-").tempdir().unwrap();
        let netns = Netns::with_underlay("n", node_ip);
        let api = KubeApi::start(&netns.name, &tmp.path().join("k8s"), node_ip);
        KubeNode { api, netns, tmp }
    }

    /// ternd for `node` in the node namespace, authenticated as `tern-agent` with `--kubeconfig`,
    /// its files under `<tmp>/node`, with `extra` arguments; not started.
    pub fn ternd(&self, node: &str, extra: &[&str]) -> Ternd {
        let kubeconfig = self.api.kubeconfig("tern-agent", "tern-agent", &[]);
        let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
        let mut args = vec![
            kubeconfig.as_str(),
            "--default-ipv4-pool=10.244.0.0/16",
            "--log-level=debug",
        ];
        args.extend_from_slice(extra);
        Ternd::new(&self.netns.name, &self.tmp.path().join("node"), node, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_is_parsed_with_labels_and_escapes() {
        let text = "# HELP x help\n# TYPE x counter\n\
                    apiserver_request_total{verb=\"LIST\",resource=\"pods\"} 12\n\
                    up 1 1700000000\n\
                    odd{path=\"/a,b}\\\"c\\n\"} 2.5\n\
                    \n\
                    broken{x=1} 3\n";
        let s = parse_metrics(text);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!(s[0].name, "apiserver_request_total");
        assert_eq!(s[0].label("verb"), "LIST");
        assert_eq!(s[0].label("resource"), "pods");
        assert_eq!(s[0].label("absent"), "");
        assert_eq!(s[0].value, 12.0);
        assert_eq!((s[1].name.as_str(), s[1].value), ("up", 1.0));
        assert!(s[1].labels.is_empty());
        assert_eq!(s[2].label("path"), "/a,b}\"c\n");
        assert_eq!(s[2].value, 2.5);
    }
}
