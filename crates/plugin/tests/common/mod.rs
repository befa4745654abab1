//! The plugins' own test helpers, on tern-testkit's harnesses (`tern_testkit::netns` for the
//! namespaces, `tern_testkit::ternd` for the agent): a node (network namespace with an
//! underlay + `ternd`), pods (network namespaces) and a runner for the `tern` plugin inside the
//! node, with the checks that a DEL released everything.
//!
//! Every namespace is uniquely named and deleted by a drop guard, and every process this
//! harness starts is killed by PID, so the tests can run in parallel and leave nothing behind
//! even when an assertion panics. Nothing here touches the root network namespace.

// Each test binary uses a different subset of the harness.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tern_testkit::ternd::Ternd;

// tern-testkit's helpers the plugin's tests use, beside this file's (`use common::*`); each
// test binary uses some of them.
#[allow(unused_imports)]
pub use tern_testkit::netns::{Netns, in_netns, ip, ip_ok, udp_echo, unique_name};
#[allow(unused_imports)]
pub use tern_testkit::wait::wait_until;

/// The node's underlay address (every node is its own namespace, so they may share it).
pub const NODE_IP: &str = "198.18.0.10";
/// The network name used in the test configurations.
pub const NETWORK: &str = "k8s-pod-network";
/// The tern-assigned host veth MAC.
pub const HOST_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// Root, and an etcd binary to run; fails the test otherwise (tern-testkit).
pub fn need_etcd() {
    tern_testkit::need_root();
    tern_testkit::need(
        "an etcd binary",
        tern_store::etcd::harness::etcd_available(),
        tern_testkit::install_hint("etcd"),
    );
}

/// A node with ternd running and one pod; needs root (tern-testkit).
pub fn node_and_pod() -> (Node, Pod) {
    tern_testkit::need_root();
    (Node::new(), Pod::new())
}

/// Runs `f` and returns its value and how long it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = Instant::now();
    let v = f();
    (v, t0.elapsed())
}

/// Asserts that a failed ADD's message says the datastore is unreachable.
#[track_caller]
pub fn assert_store_unreachable(msg: &str) {
    assert!(
        msg.contains("datastore is unreachable"),
        "message does not say the datastore is unreachable: {msg}"
    );
}

/// `ip -n NS -j ARGS` parsed.
pub fn ip_json(ns: &str, args: &[&str]) -> Value {
    let mut all = vec!["-n", ns, "-j"];
    all.extend_from_slice(args);
    let out = ip(&all);
    if out.trim().is_empty() {
        return json!([]);
    }
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip -j {args:?} in {ns}: {e}: {out}"))
}

/// A pod sandbox: a network namespace.
pub struct Pod {
    pub ns: Netns,
}

impl Pod {
    pub fn new() -> Pod {
        Pod {
            ns: Netns::new("p"),
        }
    }

    pub fn name(&self) -> &str {
        &self.ns.name
    }

    pub fn path(&self) -> String {
        self.ns.path()
    }

    /// IPv4 addresses of `ifname` as "a.b.c.d/len" (empty when the interface is absent).
    pub fn ipv4(&self, ifname: &str) -> Vec<String> {
        let links = ip_json(self.name(), &["addr", "show"]);
        let mut out = Vec::new();
        for l in links.as_array().into_iter().flatten() {
            if l["ifname"] != ifname {
                continue;
            }
            for a in l["addr_info"].as_array().into_iter().flatten() {
                if a["family"] == "inet" {
                    out.push(format!(
                        "{}/{}",
                        a["local"].as_str().unwrap(),
                        a["prefixlen"]
                    ));
                }
            }
        }
        out
    }

    /// Names of the pod's links.
    pub fn links(&self) -> Vec<String> {
        link_names(self.name())
    }

    /// Whether the pod has a link named `ifname`.
    pub fn has_link(&self, ifname: &str) -> bool {
        self.links().iter().any(|l| l == ifname)
    }

    /// IPv4 routes of the pod's main table.
    pub fn routes(&self) -> Vec<Value> {
        ip_json(self.name(), &["route", "show"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// Names of the links of a namespace.
pub fn link_names(ns: &str) -> Vec<String> {
    ip_json(ns, &["link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect()
}

/// The `tern` plugin binary.
pub fn tern_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tern"))
}

/// The `tern-ipam` plugin binary.
pub fn tern_ipam_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tern-ipam"))
}

/// Directory of the plugin binaries (and of `ternd`).
pub fn bin_dir() -> PathBuf {
    tern_bin().parent().unwrap().to_path_buf()
}

/// CNI_PATH: our binaries, then the reference plugins (host-local, ptp).
pub fn cni_path() -> String {
    format!("{}:/usr/lib/cni", bin_dir().display())
}

/// `ternctl`, next to the plugin binaries, checked current (tern-testkit's
/// `workspace_binaries`: a stale one fails the test naming the command that rebuilds it).
pub fn ternctl_bin() -> PathBuf {
    tern_testkit::workspace_binaries(&tern_bin()).join("ternctl")
}

/// `ternd`, next to the plugin binaries, checked current (as [`ternctl_bin`]): a test never
/// runs an agent older than the code under test.
pub fn ternd_bin() -> PathBuf {
    tern_testkit::workspace_binaries(&tern_bin()).join("ternd")
}

/// Result of one plugin run: exit status and stdout (JSON, or Null when empty).
#[derive(Debug, Clone)]
pub struct Out {
    pub status: i32,
    pub json: Value,
    pub stderr: String,
}

impl Out {
    /// A finished plugin's output: its status, stdout as JSON (Null when empty) and stderr.
    pub fn from_output(out: std::process::Output) -> Out {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("plugin stdout is not JSON ({e}): {stdout}"))
        };
        Out {
            status: out.status.code().unwrap_or(-1),
            json,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// The CNI error code, when stdout is an error object.
    pub fn code(&self) -> Option<u64> {
        self.json.get("code").and_then(Value::as_u64)
    }

    /// `msg` and `details` of an error, for "names the field" assertions.
    pub fn message(&self) -> String {
        format!(
            "{} {}",
            self.json.get("msg").and_then(Value::as_str).unwrap_or(""),
            self.json
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or("")
        )
    }

    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &Value {
        assert_eq!(
            self.status, 0,
            "plugin failed: {} (stderr: {})",
            self.json, self.stderr
        );
        &self.json
    }

    /// Asserts a failure (with any code: `what` says what must not have succeeded); returns
    /// the message.
    #[track_caller]
    pub fn fails(&self, what: &str) -> String {
        assert_ne!(self.status, 0, "{what} succeeded: {}", self.json);
        self.message()
    }

    /// Asserts a failure with the CNI `code`; returns the message.
    pub fn fails_with(&self, code: u64) -> String {
        assert_ne!(
            self.status, 0,
            "expected failure code {code}, got success: {}",
            self.json
        );
        assert_eq!(
            self.code(),
            Some(code),
            "unexpected error: {} (stderr: {})",
            self.json,
            self.stderr
        );
        self.message()
    }
}

/// A node: its network namespace (underlay veth pair with 198.18.0.10/24 and a default route,
/// which proxy-ARP needs), a temp dir with the store, socket and state dir, and `ternd`
/// (node `itest-node`, resync every second, debug log).
pub struct Node {
    // Field order matters on drop: the agent is killed (and its log printed when the test
    // panics) first, then the namespace is deleted, then the temp dir removed.
    pub ternd: Ternd,
    pub ns: Netns,
    pub dir: tempfile::TempDir,
    pub pool: Option<String>,
    /// Whether the datastore is given by URL (e.g. etcd), not a SQLite file in `dir`.
    remote_store: bool,
}

impl Node {
    /// A node with ternd running and the agent's default pool.
    pub fn new() -> Node {
        let mut node = Node::build(None, None);
        node.start();
        node
    }

    /// A node whose ternd creates `cidr` as its default IPv4 pool.
    pub fn with_pool(cidr: &str) -> Node {
        let mut node = Node::build(Some(cidr.to_string()), None);
        node.start();
        node
    }

    /// A node whose ternd runs on the datastore at `url` (e.g. `etcd://127.0.0.1:PORT`); the
    /// URL is resolved inside the node namespace, so a loopback etcd must run there too.
    pub fn with_store(url: &str) -> Node {
        let mut node = Node::build(None, Some(url));
        node.start();
        node
    }

    /// Like [`Node::with_store`] but ternd is not started yet: for tests that first start
    /// the datastore inside the node namespace, or start ternd while it is down
    /// ([`Node::spawn_agent`]).
    pub fn unstarted_with_store(url: &str) -> Node {
        Node::build(None, Some(url))
    }

    fn build(pool: Option<String>, store: Option<&str>) -> Node {
        let ns = Netns::with_underlay("n", NODE_IP);
        ns.ip(&["route", "add", "default", "via", "198.18.0.1"]);
        let dir = tempfile::Builder::new()
            .prefix("tpt-")
            .tempdir()
            .expect("temp dir");
        let mut args = vec![
            "--resync-seconds=1".to_string(),
            "--log-level=debug".to_string(),
        ];
        if let Some(url) = store {
            args.push(format!("--store={url}"));
        }
        if let Some(p) = &pool {
            args.push(format!("--default-ipv4-pool={p}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut ternd = Ternd::new(&ns.name, dir.path(), "itest-node", &args);
        ternd.bin = ternd_bin();
        ternd.listen_timeout = Duration::from_secs(10);
        Node {
            ternd,
            ns,
            dir,
            pool,
            remote_store: store.is_some(),
        }
    }

    pub fn name(&self) -> &str {
        &self.ns.name
    }

    pub fn socket(&self) -> PathBuf {
        self.ternd.socket()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.ternd.state_dir()
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.state_dir().join("journal")
    }

    pub fn store_url(&self) -> String {
        self.ternd.store_url()
    }

    /// Runs `f` with a fresh connection to the node's store. For a store given by URL (etcd)
    /// `f` runs on a thread inside the node namespace, where ternd resolves the URL: an etcd on
    /// the node's loopback is only reachable from there, and an etcd store opens its TCP
    /// connections lazily on the calling thread. A SQLite file is opened directly.
    pub fn with_store_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(std::sync::Arc<dyn tern_store::Store>) -> T + Send + 'static,
    ) -> T {
        let url = self.store_url();
        let open = move || {
            let store =
                tern_store::open(&url).unwrap_or_else(|e| panic!("opening the store {url}: {e}"));
            f(store)
        };
        if self.remote_store {
            in_netns(&self.ns.path(), open)
        } else {
            open()
        }
    }

    /// Starts ternd in the node namespace and waits (10 s) until its socket accepts
    /// connections.
    pub fn start(&mut self) {
        self.ternd.start();
    }

    /// Starts ternd in the node namespace without waiting for its socket (ternd waits for an
    /// unreachable datastore before it serves).
    pub fn spawn_agent(&mut self) {
        self.ternd.spawn();
    }

    /// Waits up to `timeout` until ternd's socket accepts connections; panics when ternd exits.
    pub fn wait_listening(&mut self, timeout: Duration) -> bool {
        self.ternd.wait_listening(timeout)
    }

    /// Kills ternd (SIGKILL by PID, like a crash) and reaps it. The stale socket file stays.
    pub fn stop(&mut self) {
        self.ternd.stop();
    }

    /// Everything ternd logged in every run of this node.
    pub fn agent_log(&self) -> String {
        self.ternd.log()
    }

    /// The `tern` plugin's network configuration for this node.
    pub fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": NETWORK,
            "type": "tern",
            "agent_socket": self.socket(),
            "state_dir": self.state_dir(),
            "ipam": {"type": "tern-ipam"},
        })
    }

    /// Runs a plugin binary inside the node namespace with exactly `env` (plus PATH) and `conf`
    /// on stdin.
    pub fn run_plugin(&self, bin: &Path, env: &[(&str, String)], stdin: &[u8]) -> Out {
        use std::io::Write;
        let mut child = self
            .plugin_command(bin, env)
            .spawn()
            .expect("spawning the plugin");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin)
            .expect("writing the plugin's stdin");
        Out::from_output(child.wait_with_output().expect("waiting for the plugin"))
    }

    /// The command that runs a plugin binary inside the node namespace with exactly `env`
    /// (plus PATH), its stdin, stdout and stderr piped.
    pub fn plugin_command(&self, bin: &Path, env: &[(&str, String)]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name()])
            .arg(bin)
            .env_clear();
        if let Ok(p) = std::env::var("PATH") {
            cmd.env("PATH", p);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Asserts that nothing of `cid` exists on the node: no address, no endpoint, no host veth.
    pub fn assert_nothing_left(&self, cid: &str) {
        assert!(
            self.allocated_to(cid).is_empty(),
            "{cid} holds {:?}",
            self.allocated_to(cid)
        );
        assert!(self.endpoints_of(cid).is_empty(), "{cid} has an endpoint");
        assert!(
            self.tern_links_settled().is_empty(),
            "host veths left: {:?}",
            self.tern_links()
        );
    }

    /// The usual CNI environment for a per-attachment command on `pod`.
    pub fn env(
        &self,
        cmd: &str,
        netns: &str,
        container_id: &str,
        ifname: &str,
        pod_name: &str,
    ) -> Vec<(&'static str, String)> {
        vec![
            ("CNI_COMMAND", cmd.to_string()),
            ("CNI_CONTAINERID", container_id.to_string()),
            ("CNI_NETNS", netns.to_string()),
            ("CNI_IFNAME", ifname.to_string()),
            ("CNI_PATH", cni_path()),
            // As kubelet passes them: IgnoreUnknown lets host-local accept the K8S_ keys.
            (
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod_name}"),
            ),
        ]
    }

    /// [`Node::env`] for `pod` (CNI_NETNS = its path, eth0), with `overrides` replacing
    /// variables; an override with an empty value removes the variable.
    pub fn env_with(
        &self,
        cmd: &str,
        pod: &Pod,
        cid: &str,
        overrides: &[(&'static str, &str)],
    ) -> Vec<(&'static str, String)> {
        let mut env = self.env(cmd, &pod.path(), cid, "eth0", pod.name());
        for (k, v) in overrides {
            env.retain(|(name, _)| name != k);
            if !v.is_empty() {
                env.push((k, v.to_string()));
            }
        }
        env
    }

    /// Runs `tern` for `cmd` on `pod` (CNI_NETNS = the pod's path).
    pub fn cni(&self, cmd: &str, pod: &Pod, container_id: &str, ifname: &str, conf: &Value) -> Out {
        let env = self.env(cmd, &pod.path(), container_id, ifname, pod.name());
        self.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes())
    }

    /// Runs `tern` for a network-wide command (GC, STATUS): only CNI_COMMAND and CNI_PATH.
    pub fn cni_global(&self, cmd: &str, conf: &Value) -> Out {
        let env = vec![("CNI_COMMAND", cmd.to_string()), ("CNI_PATH", cni_path())];
        self.run_plugin(&tern_bin(), &env, conf.to_string().as_bytes())
    }

    /// [`Node::add`] of eth0 that must succeed; returns the result, the pod address and the
    /// host veth.
    pub fn add_pod(&self, pod: &Pod, container_id: &str, conf: &Value) -> (Value, IpAddr, String) {
        let r = self.add(pod, container_id, conf);
        let (ip, host_if) = (result_ip(&r), result_host_if(&r));
        (r, ip, host_if)
    }

    /// ADD that must succeed; returns the result.
    pub fn add(&self, pod: &Pod, container_id: &str, conf: &Value) -> Value {
        let out = self.cni("ADD", pod, container_id, "eth0", conf);
        assert_eq!(
            out.status,
            0,
            "ADD {container_id} failed: {}\n{}",
            out.json,
            self.agent_log()
        );
        out.json
    }

    /// Names of the node's links.
    pub fn links(&self) -> Vec<String> {
        link_names(self.name())
    }

    /// Whether the node has a link named `ifname`.
    pub fn has_link(&self, ifname: &str) -> bool {
        self.links().iter().any(|l| l == ifname)
    }

    /// Asserts that `cid`'s DEL released everything: its host veth `host_if` is gone, and it
    /// holds no address and no endpoint.
    #[track_caller]
    pub fn assert_released(&self, cid: &str, host_if: &str) {
        assert!(!self.has_link(host_if), "{host_if} survived DEL");
        self.assert_unclaimed(cid, "by DEL");
    }

    /// Asserts that the store holds no address and no endpoint of `cid` (released `how`).
    #[track_caller]
    pub fn assert_unclaimed(&self, cid: &str, how: &str) {
        assert!(
            self.allocated_to(cid).is_empty(),
            "address of {cid} not released {how}"
        );
        assert!(
            self.endpoints_of(cid).is_empty(),
            "endpoint of {cid} not deleted {how}"
        );
    }

    /// The node's host veths (`tern*`).
    pub fn tern_links(&self) -> Vec<String> {
        self.links()
            .into_iter()
            .filter(|l| l.starts_with("tern"))
            .collect()
    }

    /// The node's `tern*` links once deferred deletions have finished: a DEL takes the host veth
    /// down at once and ternd deletes it off the request path (~20 ms each in the kernel), so
    /// this waits up to 5 s for the list to stop shrinking to empty.
    pub fn tern_links_settled(&self) -> Vec<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let links = self.tern_links();
            if links.is_empty() || std::time::Instant::now() > deadline {
                return links;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The node's IPv4 routes.
    pub fn routes(&self) -> Vec<Value> {
        ip_json(self.name(), &["route", "show"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every IPAM allocation in the node's store, read through a second connection.
    pub fn allocations(&self) -> Vec<tern_ipam::Allocation> {
        self.with_store_conn(|store| {
            tern_ipam::Ipam::new(store)
                .allocations(None)
                .expect("listing allocations")
        })
    }

    /// Allocated addresses of one container.
    pub fn allocated_to(&self, container_id: &str) -> Vec<IpAddr> {
        self.allocations()
            .into_iter()
            .filter(|a| a.attrs.container_id == container_id)
            .map(|a| a.ip)
            .collect()
    }

    /// WorkloadEndpoint specs in the store, as (containerID, endpoint ifname, host ifname).
    pub fn endpoints(&self) -> Vec<(String, String, String)> {
        let (kvs, _) = self.with_store_conn(|store| {
            store
                .range(&tern_store::keys::resource_prefix("WorkloadEndpoint"))
                .expect("listing endpoints")
        });
        kvs.iter()
            .map(|kv| {
                let v: Value = serde_json::from_slice(&kv.value).expect("endpoint JSON");
                let s = &v["spec"];
                let f = |k: &str| s[k].as_str().unwrap_or("").to_string();
                (f("containerID"), f("endpoint"), f("interfaceName"))
            })
            .collect()
    }

    /// Endpoints of one container.
    pub fn endpoints_of(&self, container_id: &str) -> Vec<(String, String, String)> {
        self.endpoints()
            .into_iter()
            .filter(|e| e.0 == container_id)
            .collect()
    }

    /// Files in the release journal.
    pub fn journal_files(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(self.journal_dir()) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect(),
            Err(_) => vec![],
        }
    }
}

/// The pod address of an ADD result (ips[0].address without the prefix).
pub fn result_ip(result: &Value) -> IpAddr {
    let a = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips in {result}"));
    a.split('/').next().unwrap().parse().unwrap()
}

/// The host veth of an ADD result (interfaces[0].name).
pub fn result_host_if(result: &Value) -> String {
    result["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("no host interface in {result}"))
        .to_string()
}
