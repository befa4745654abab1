//! ternd reads Kubernetes (issue 13, API-server-only part): a real etcd and kube-apiserver (no
//! kubelet) on the loopback of a node namespace; ternd with `--kubeconfig` (a client
//! certificate whose user has only tern's RBAC); pods created with `kubectl` and bound to the
//! node (`spec.nodeName`), wired with the real `tern` plugin with `K8S_POD_NAMESPACE/NAME/UID`
//! in CNI_ARGS as containerd passes them; NetworkPolicies with `kubectl apply`. Pass or fail
//! is decided by the node's WorkloadEndpoints in the store, the `inet tern` table and real UDP
//! traffic between the pods.
//!
//! Shown: labels, service account, named ports and UID reach the endpoints; a policy (with a
//! named port) follows `kubectl apply`/`label`/`delete`; namespace labels feed
//! namespaceSelectors; a restart of the API server — and of ternd while the API server is
//! down — keeps the rules in force, and they follow again after the relist; an unknown pod's
//! ADD answers 11 while the API server is down and DEL succeeds; a missing RBAC permission is
//! a readiness error naming the verb and resource; the Node gets `NetworkUnavailable=False`.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. Every namespace and process is uniquely named / killed by PID and
//! removed by drop guards; the root namespace is never touched.

mod kube_api;

use kube_api::{KubeApi, in_netns, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const NODE: &str = "itest-node";
const NODE_IP: &str = "198.18.0.10";
const NETWORK: &str = "k8s-pod-network";
const PORT: u16 = 8080;

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn unique(tag: &str) -> String {
    format!(
        "tka{}-{tag}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A uniquely named network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let n = Netns(unique(tag));
        ip(&["netns", "add", &n.0]);
        ip(&["-n", &n.0, "link", "set", "lo", "up"]);
        n
    }
    fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// ternd: this build's, or `TERN_TEST_TERND` (e.g. a release build, to measure its RSS).
fn ternd_bin() -> PathBuf {
    std::env::var_os("TERN_TEST_TERND")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ternd")))
}

/// The `tern` plugin, built next to ternd (cargo makes it current; it is a no-op when it is).
fn tern_bin() -> PathBuf {
    tern_testkit::fresh_binaries(Path::new(env!("CARGO_BIN_EXE_ternd"))).join("tern")
}

/// ternd in the node namespace with `--kubeconfig`.
struct Ternd {
    netns: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    child: Option<Child>,
    starts: usize,
}

impl Ternd {
    fn socket(&self) -> PathBuf {
        self.dir.join("ternd.sock")
    }
    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    fn store_url(&self) -> String {
        format!("sqlite://{}/store.db", self.dir.display())
    }

    fn start(&mut self) {
        assert!(self.child.is_none());
        self.starts += 1;
        let log = File::create(self.dir.join(format!("ternd.{}.log", self.starts))).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(ternd_bin())
            .args(["--node-name", NODE, "--store", &self.store_url()])
            .arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--default-ipv4-pool", "10.244.0.0/16"])
            .args(["--resync-seconds", "5", "--log-level", "debug"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning ternd");
        self.child = Some(child);
        let sock = self.socket();
        let up = wait_until(Duration::from_secs(20), || {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("ternd exited ({st}): {}", self.log());
            }
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        assert!(up, "ternd did not listen within 20 s: {}", self.log());
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("ternd running").id()
    }

    fn log(&self) -> String {
        let mut s = String::new();
        for i in 1..=self.starts {
            s.push_str(&format!("--- ternd run {i}\n"));
            s.push_str(
                &std::fs::read_to_string(self.dir.join(format!("ternd.{i}.log")))
                    .unwrap_or_default(),
            );
        }
        s
    }

    /// `GET /readiness` on ternd's health port: (ready, body).
    fn readiness(&self) -> (bool, String) {
        in_netns(&format!("/run/netns/{}", self.netns), || {
            let Ok(mut s) = std::net::TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], 9099)),
                Duration::from_secs(1),
            ) else {
                return (false, "health port closed".to_string());
            };
            let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
            let _ = s.write_all(
                b"GET /readiness HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            );
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            (out.starts_with("HTTP/1.1 200"), out)
        })
    }

    fn wait_ready(&self, timeout: Duration) {
        let mut last = String::new();
        let ok = wait_until(timeout, || {
            let (ok, body) = self.readiness();
            last = body;
            ok
        });
        assert!(
            ok,
            "ternd not ready within {timeout:?}: {last}\n{}",
            self.log()
        );
    }

    /// The node's WorkloadEndpoint documents, by pod name.
    fn endpoints(&self) -> BTreeMap<String, Value> {
        let store = tern_store::open(&self.store_url()).expect("opening the store");
        let (kvs, _) = store
            .range(&tern_store::keys::resource_prefix("WorkloadEndpoint"))
            .unwrap();
        kvs.iter()
            .map(|kv| {
                let v: Value = serde_json::from_slice(&kv.value).unwrap();
                (v["spec"]["pod"].as_str().unwrap_or("").to_string(), v)
            })
            .collect()
    }

    fn labels_of(&self, pod: &str) -> BTreeMap<String, String> {
        self.endpoints()
            .get(pod)
            .and_then(|v| serde_json::from_value(v["metadata"]["labels"].clone()).ok())
            .unwrap_or_default()
    }

    /// Number of policy chains in the node's `inet tern` table.
    fn policy_chains(&self) -> usize {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "nft",
                "list",
                "table",
                "inet",
                "tern",
            ])
            .output()
            .expect("nft");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.trim_start().starts_with("chain pol-"))
            .count()
    }

    /// CNI STATUS through the plugin.
    fn status(&self, plugin: &Path) -> (i32, Value) {
        let conf = json!({
            "cniVersion": "1.1.0",
            "name": NETWORK,
            "type": "tern",
            "agent_socket": self.socket(),
            "state_dir": self.state_dir(),
            "ipam": {"type": "tern-ipam"},
        });
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(plugin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", plugin.parent().unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tern");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), v)
    }

    /// Runs the `tern` plugin in the node namespace.
    fn cni(&self, plugin: &Path, cmd: &str, pod: &Pod, uid: &str) -> (i32, Value) {
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "tern",
            "agent_socket": self.socket(),
            "state_dir": self.state_dir(),
            "ipam": {"type": "tern-ipam"},
        });
        let mut args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=prod;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            pod.name, pod.cid
        );
        if !uid.is_empty() {
            args.push_str(&format!(";K8S_POD_UID={uid}"));
        }
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(plugin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", &pod.cid)
            .env("CNI_NETNS", pod.ns.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", plugin.parent().unwrap())
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning tern");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or(Value::String(stdout.into_owned()))
        };
        (out.status.code().unwrap_or(-1), v)
    }
}

impl Drop for Ternd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
        self.stop();
    }
}

/// A pod: its sandbox network namespace and its address once added.
struct Pod {
    /// The Kubernetes pod name.
    name: String,
    /// The sandbox's container ID (unique per sandbox, as a runtime's).
    cid: String,
    ns: Netns,
    ip: Option<IpAddr>,
}

impl Pod {
    fn new(name: &str) -> Pod {
        let ns = Netns::new("p");
        Pod {
            name: name.to_string(),
            cid: format!("sandbox-{}", ns.0),
            ns,
            ip: None,
        }
    }
}

/// Whether a UDP datagram from `from` reaches `to`:PORT and its echo comes back.
fn udp_reaches(from: &Pod, to: &Pod) -> bool {
    let to_ip = to.ip.expect("target pod has an address");
    let server = in_netns(&to.ns.path(), move || {
        UdpSocket::bind(SocketAddr::new(to_ip, PORT))
    })
    .expect("binding the server");
    let client = in_netns(&from.ns.path(), || UdpSocket::bind("0.0.0.0:0")).unwrap();
    let t = Some(Duration::from_millis(400));
    server.set_read_timeout(t).unwrap();
    client.set_read_timeout(t).unwrap();
    let dst = SocketAddr::new(to_ip, PORT);
    for _ in 0..3 {
        let _ = client.send_to(b"tern", dst);
        let mut buf = [0u8; 16];
        let Ok((n, src)) = server.recv_from(&mut buf) else {
            continue;
        };
        let _ = server.send_to(&buf[..n], src);
        if client.recv_from(&mut buf).is_ok() {
            return true;
        }
    }
    false
}

/// Waits until `from` → `to` is `allowed` (or not); panics with `what` otherwise.
fn expect_traffic(from: &Pod, to: &Pod, allowed: bool, what: &str, t: &Ternd) {
    let ok = wait_until(Duration::from_secs(15), || udp_reaches(from, to) == allowed);
    assert!(
        ok,
        "{what}: {} -> {} should be {}\n{}",
        from.name,
        to.name,
        if allowed { "allowed" } else { "denied" },
        t.log()
    );
}

fn pod_yaml(name: &str, labels: &[(&str, &str)]) -> String {
    let labels: BTreeMap<&str, &str> = labels.iter().cloned().collect();
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "prod", "labels": labels},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": "web-sa",
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "pause",
                            "ports": [{"name": "echo", "containerPort": PORT, "protocol": "UDP"}]}]
        }
    }))
    .unwrap()
}

const AGENT_RBAC: &str = r#"
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

/// The same role without any permission on networkpolicies.
const AGENT_RBAC_NO_POLICIES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: tern-node}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [nodes/status]
  verbs: [patch, update]
"#;

const POLICY_FROM_CLIENT: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-client, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: echo, protocol: UDP}]
"#;

const POLICY_FROM_BLUE: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-blue, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: blue}}}]
"#;

const POLICY_DENY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-deny, namespace: prod}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
"#;

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn ternd_follows_the_kubernetes_api() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (network namespaces, nftables): run it as root"
    );
    let bin = kube_api::bin_dir();
    let plugin = tern_bin();
    let tmp = tempfile::Builder::new().prefix("tka-").tempdir().unwrap();
    let node = Netns::new("n");
    let n = node.0.clone();
    ip(&[
        "-n", &n, "link", "add", "ul0", "type", "veth", "peer", "name", "ul1",
    ]);
    ip(&[
        "-n",
        &n,
        "addr",
        "add",
        &format!("{NODE_IP}/24"),
        "dev",
        "ul0",
    ]);
    ip(&["-n", &n, "link", "set", "ul0", "up"]);
    ip(&["-n", &n, "link", "set", "ul1", "up"]);
    ip(&["-n", &n, "route", "add", "default", "via", "198.18.0.1"]);
    eprintln!("kubernetes binaries: {}", bin.display());

    let mut api = KubeApi::start(&n, &tmp.path().join("k8s"), NODE_IP);
    api.apply(AGENT_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\n---\napiVersion: v1\nkind: \
         Namespace\nmetadata: {{name: prod, labels: {{team: red}}}}\n---\napiVersion: v1\nkind: \
         ServiceAccount\nmetadata: {{name: web-sa, namespace: prod}}\n"
    ));
    for (name, labels) in [
        ("web", vec![("app", "web")]),
        ("client", vec![("role", "client")]),
        ("other", vec![]),
    ] {
        api.apply(&pod_yaml(name, &labels));
    }
    let uid = |pod: &str| {
        api.must(&[
            "get",
            "pod",
            "-n",
            "prod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    };
    let (web_uid, client_uid, other_uid) = (uid("web"), uid("client"), uid("other"));

    let mut ternd = Ternd {
        netns: n.clone(),
        dir: tmp.path().join("node"),
        kubeconfig: api.kubeconfig("tern-agent", "tern-agent", &[]),
        child: None,
        starts: 0,
    };
    std::fs::create_dir_all(&ternd.dir).unwrap();
    ternd.start();
    ternd.wait_ready(Duration::from_secs(30));

    // The Node condition.
    let cond = wait_until(Duration::from_secs(20), || {
        api.kubectl(&[
            "get", "node", NODE, "-o",
            "jsonpath={.status.conditions[?(@.type==\"NetworkUnavailable\")].status}/{.status.conditions[?(@.type==\"NetworkUnavailable\")].reason}",
        ])
        .is_ok_and(|s| s == "False/TernIsUp")
    });
    assert!(
        cond,
        "NetworkUnavailable=False (TernIsUp) not set on node {NODE}\n{}",
        ternd.log()
    );

    // ADD: labels, service account, named ports and UID from the API server.
    let mut pods: Vec<Pod> = ["web", "client", "other"]
        .iter()
        .map(|p| Pod::new(p))
        .collect();
    for (p, u) in pods.iter_mut().zip([&web_uid, &client_uid, &other_uid]) {
        let (st, out) = ternd.cni(&plugin, "ADD", p, u);
        assert_eq!(st, 0, "ADD {}: {out}\n{}", p.name, ternd.log());
        let a = out["ips"][0]["address"].as_str().unwrap();
        p.ip = Some(a.split('/').next().unwrap().parse().unwrap());
    }
    let (web, client, other) = (&pods[0], &pods[1], &pods[2]);
    let eps = ternd.endpoints();
    let w = &eps["web"];
    assert_eq!(w["metadata"]["labels"]["app"], "web", "{w}");
    assert_eq!(
        w["metadata"]["labels"]["tern.dev/serviceaccount"], "web-sa",
        "{w}"
    );
    assert_eq!(
        w["metadata"]["annotations"]["tern.dev/pod-uid"],
        web_uid.as_str(),
        "{w}"
    );
    assert_eq!(w["spec"]["serviceAccountName"], "web-sa", "{w}");
    assert_eq!(
        w["spec"]["ports"],
        json!([{"name": "echo", "protocol": "UDP", "port": PORT}]),
        "{w}"
    );

    // A UID the API server does not know for that name: try again, nothing created.
    let ghost = Pod::new("web");
    let (st, out) = ternd.cni(
        &plugin,
        "ADD",
        &ghost,
        "00000000-0000-0000-0000-000000000000",
    );
    assert_ne!(st, 0, "ADD with a stale UID must fail: {out}");
    assert_eq!(out["code"], 11, "{out}");
    eprintln!("ADD with a stale UID: {}", out["msg"]);

    // No policy: everything flows.
    expect_traffic(client, web, true, "no policy", &ternd);
    expect_traffic(other, web, true, "no policy", &ternd);

    // A NetworkPolicy with a named port, by kubectl apply.
    assert_eq!(ternd.policy_chains(), 0);
    api.apply(POLICY_FROM_CLIENT);
    expect_traffic(other, web, false, "web-from-client", &ternd);
    expect_traffic(client, web, true, "web-from-client", &ternd);
    assert!(ternd.policy_chains() > 0);

    // kubectl label pod: the endpoint's labels follow and policy re-evaluates.
    api.must(&["label", "pod", "-n", "prod", "other", "role=client"]);
    assert!(
        wait_until(Duration::from_secs(10), || ternd
            .labels_of("other")
            .get("role")
            == Some(&"client".to_string())),
        "label not on the endpoint: {:?}",
        ternd.labels_of("other")
    );
    expect_traffic(other, web, true, "other relabelled role=client", &ternd);
    api.must(&["label", "pod", "-n", "prod", "other", "role-"]);
    expect_traffic(other, web, false, "other's role removed", &ternd);
    assert_eq!(ternd.labels_of("other").get("role"), None);

    // Delete the policy: its rules go.
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-from-client"]);
    expect_traffic(other, web, true, "policy deleted", &ternd);
    assert!(wait_until(Duration::from_secs(5), || ternd.policy_chains() == 0));

    // namespaceSelector follows the namespace's labels.
    api.apply(POLICY_FROM_BLUE);
    expect_traffic(
        client,
        web,
        false,
        "web-from-blue, namespace team=red",
        &ternd,
    );
    api.must(&["label", "namespace", "prod", "team=blue", "--overwrite"]);
    expect_traffic(client, web, true, "namespace relabelled team=blue", &ternd);
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-from-blue"]);

    // API server restart, and ternd restart while it is down: the rules stay in force.
    api.apply(POLICY_DENY);
    expect_traffic(client, web, false, "web-deny", &ternd);
    let rss_idle = rss_kib(ternd.pid());
    eprintln!("ternd RSS with the Kubernetes watch on (3 pods): {rss_idle} KiB");

    // Watch expiry: etcd moves on (other objects change) and the API server restarts while
    // ternd runs; its watch cache starts at the new revision, so ternd's resume is answered
    // 410 and the watcher relists. The rules stay in force throughout and follow afterwards.
    let listed = |t: &Ternd| {
        t.log()
            .matches("KubernetesNetworkPolicy objects listed")
            .count()
    };
    let before = listed(&ternd);
    for i in 0..5 {
        api.must(&["create", "configmap", "-n", "prod", &format!("bump-{i}")]);
    }
    // A prober sends to the denied port the whole time: not one datagram may get through
    // while the API server is down, while ternd resumes (410) and while it relists.
    let leaked = AtomicUsize::new(0);
    let probes = AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (relisted, expired) = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                probes.fetch_add(1, Ordering::Relaxed);
                if udp_reaches(client, web) {
                    leaked.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        api.stop_apiserver();
        std::thread::sleep(Duration::from_secs(2));
        api.start_apiserver();
        let relisted = wait_until(Duration::from_secs(60), || listed(&ternd) > before);
        let expired = ternd.log().contains("watch expired (410)");
        // A few more probes after the relist completed.
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        (relisted, expired)
    });
    eprintln!(
        "API server restart: 410 seen {expired}, relisted {relisted}, {} probes, {} leaked",
        probes.load(Ordering::Relaxed),
        leaked.load(Ordering::Relaxed)
    );
    assert!(
        relisted && expired,
        "after the API server restart ternd should get a 410 and relist (410 {expired}, \
         relisted {relisted})\n{}",
        ternd.log()
    );
    assert_eq!(
        leaked.load(Ordering::Relaxed),
        0,
        "denied traffic got through during the API server restart / relist"
    );
    expect_traffic(client, web, false, "after the API server restart", &ternd);
    api.must(&["label", "pod", "-n", "prod", "client", "after=restart"]);
    assert!(
        wait_until(Duration::from_secs(20), || ternd
            .labels_of("client")
            .get("after")
            == Some(&"restart".to_string())),
        "pod labels do not follow after the API server restart: {:?}",
        ternd.labels_of("client")
    );

    api.stop_apiserver();
    std::thread::sleep(Duration::from_secs(3));
    expect_traffic(client, web, false, "API server down", &ternd);
    ternd.stop();
    ternd.start();
    assert!(ternd.policy_chains() > 0, "ternd restart dropped the rules");
    expect_traffic(
        client,
        web,
        false,
        "ternd restarted while the API server is down",
        &ternd,
    );
    let (ready, body) = ternd.readiness();
    assert!(!ready, "ternd ready without the API server: {body}");
    // An ADD of a pod ternd has never seen cannot be answered: try again. DEL needs no API.
    let newcomer = Pod::new("newcomer");
    let (st, out) = ternd.cni(&plugin, "ADD", &newcomer, "");
    assert_eq!((st != 0, out["code"].clone()), (true, json!(11)), "{out}");
    eprintln!("ADD of an unknown pod, API server down: {}", out["msg"]);
    let (st, out) = ternd.cni(&plugin, "DEL", other, &other_uid);
    assert_eq!(st, 0, "DEL with the API server down: {out}");

    api.start_apiserver();
    ternd.wait_ready(Duration::from_secs(60));
    expect_traffic(
        client,
        web,
        false,
        "after the relist, web-deny still exists",
        &ternd,
    );
    api.must(&["delete", "networkpolicy", "-n", "prod", "web-deny"]);
    expect_traffic(
        client,
        web,
        true,
        "web-deny deleted after the API server restart",
        &ternd,
    );
    assert!(wait_until(Duration::from_secs(5), || ternd.policy_chains() == 0));

    // The runtime retries the newcomer's ADD once the API server is back and the pod exists.
    api.apply(&pod_yaml("newcomer", &[("app", "newcomer")]));
    let nc_uid = api.must(&[
        "get",
        "pod",
        "-n",
        "prod",
        "newcomer",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let (st, out) = ternd.cni(&plugin, "ADD", &newcomer, &nc_uid);
    assert_eq!(st, 0, "ADD newcomer after the API server is back: {out}");
    assert_eq!(
        ternd.labels_of("newcomer").get("app").map(String::as_str),
        Some("newcomer")
    );

    // RBAC: without networkpolicies the agent says exactly what it lacks.
    api.apply(AGENT_RBAC_NO_POLICIES);
    ternd.stop();
    ternd.start();
    let mut last = String::new();
    let named = wait_until(Duration::from_secs(30), || {
        let (ready, body) = ternd.readiness();
        last = body;
        !ready && last.contains("may not list networkpolicies.networking.k8s.io")
    });
    assert!(
        named,
        "readiness does not name the missing permission: {last}"
    );
    assert!(
        ternd
            .log()
            .contains("RBAC: ternd may not list networkpolicies.networking.k8s.io"),
        "the log does not name the missing permission"
    );
    let (st, out) = ternd.status(&plugin);
    assert_ne!(
        st, 0,
        "STATUS must fail while a permission is missing: {out}"
    );
    assert_eq!(out["code"], 50, "{out}");
    assert!(
        out["msg"]
            .as_str()
            .unwrap_or("")
            .contains("networkpolicies"),
        "{out}"
    );
    api.apply(AGENT_RBAC);
    ternd.wait_ready(Duration::from_secs(90));
    eprintln!(
        "ternd RSS idle with the watch on: {} KiB",
        rss_kib(ternd.pid())
    );
    if let Ok(p) = std::env::var("TERN_TEST_DUMP_LOGS") {
        std::fs::write(p, ternd.log()).unwrap();
    }
}
