//! Calico's IPAM annotations (and tern's `tern.dev/` equivalents) against a real etcd and
//! kube-apiserver (issue 13): pods created with `kubectl` and bound to the node, wired by the
//! real `tern` plugin with `K8S_POD_NAMESPACE/NAME` in CNI_ARGS as containerd passes them.
//!
//! Shown: `cni.projectcalico.org/ipAddrs` gives the pod exactly that address (CNI result and
//! WorkloadEndpoint); a second pod asking for it fails with 103 and leaves no endpoint, no
//! allocation, no veth; once the first is deleted the second gets it. A malformed annotation,
//! an unknown pool, disagreeing Calico/tern spellings and `ipAddrsNoIpam` without
//! `feature_control.ip_addrs_no_ipam` fail with 7 naming the pod and the annotation. A
//! namespace's `ipv4pools` is the default of its pods and a pod's own annotation overrides it;
//! with the feature on, `ipAddrsNoIpam` uses the address without IPAM.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. Every namespace and process is uniquely named / killed by PID and
//! removed by drop guards; the root namespace is never touched.

mod kube_api;

use ipnet::IpNet;
use kube_api::{KubeApi, wait_until};
use serde_json::{Value, json};
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const NODE: &str = "annot-node";
const NODE_IP: &str = "198.18.0.20";
const NETWORK: &str = "k8s-pod-network";
/// Where the reference CNI plugins (host-local) are installed.
const REFERENCE_PLUGINS: &str = "/usr/lib/cni";

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn unique(tag: &str) -> String {
    format!(
        "tkn{}-{tag}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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

/// The `tern` plugin, built next to ternd (cargo makes it current; a no-op when it is).
fn tern_bin() -> PathBuf {
    tern_testkit::fresh_binaries(Path::new(env!("CARGO_BIN_EXE_ternd"))).join("tern")
}

/// ternd in the node namespace with `--kubeconfig`; killed by PID on drop.
struct Ternd {
    netns: String,
    dir: PathBuf,
    child: Option<Child>,
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
    fn store(&self) -> std::sync::Arc<dyn tern_store::Store> {
        tern_store::open(&self.store_url()).expect("opening the store")
    }

    fn start(netns: &str, dir: PathBuf, kubeconfig: &Path) -> Ternd {
        std::fs::create_dir_all(&dir).unwrap();
        let log = File::create(dir.join("ternd.log")).unwrap();
        let mut t = Ternd {
            netns: netns.to_string(),
            dir,
            child: None,
        };
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(env!("CARGO_BIN_EXE_ternd"))
            .args(["--node-name", NODE, "--store", &t.store_url()])
            .arg("--socket")
            .arg(t.socket())
            .arg("--state-dir")
            .arg(t.state_dir())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--default-ipv4-pool", "10.244.0.0/16"])
            .args(["--log-level", "debug"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning ternd");
        t.child = Some(child);
        let sock = t.socket();
        let up = wait_until(Duration::from_secs(20), || {
            if let Some(c) = t.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("ternd exited ({st}): {}", t.log());
            }
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        assert!(up, "ternd did not listen within 20 s: {}", t.log());
        t
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ternd.log")).unwrap_or_default()
    }

    /// Waits until CNI STATUS succeeds (the watches listed everything).
    fn wait_ready(&self, plugin: &Path) {
        let mut last = Value::Null;
        let ok = wait_until(Duration::from_secs(30), || {
            let (st, out) = self.run(plugin, "STATUS", None, &json!({"cniVersion": "1.1.0"}), "");
            last = out;
            st == 0
        });
        assert!(ok, "ternd not ready within 30 s: {last}\n{}", self.log());
    }

    /// The node's WorkloadEndpoint of `pod` in `ns`, if any.
    fn endpoint(&self, ns: &str, pod: &str) -> Option<Value> {
        let (kvs, _) = self
            .store()
            .range(&tern_store::keys::resource_prefix("WorkloadEndpoint"))
            .unwrap();
        kvs.iter()
            .map(|kv| serde_json::from_slice::<Value>(&kv.value).unwrap())
            .find(|v| v["metadata"]["namespace"] == ns && v["spec"]["pod"] == pod)
    }

    /// IPAM allocations recorded for pod `ns/pod`.
    fn allocations(&self, ns: &str, pod: &str) -> Vec<IpAddr> {
        tern_ipam::Ipam::new(self.store())
            .allocations(None)
            .unwrap()
            .into_iter()
            .filter(|a| a.attrs.namespace == ns && a.attrs.pod == pod)
            .map(|a| a.ip)
            .collect()
    }

    /// Names of the host-side pod veths in the node namespace.
    fn veths(&self) -> Vec<String> {
        ip(&["-n", &self.netns, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("tern"))
            .collect()
    }

    /// Runs the `tern` plugin in the node namespace; `extra` is merged into the conflist.
    fn run(
        &self,
        plugin: &Path,
        cmd: &str,
        pod: Option<&Pod>,
        extra: &Value,
        _tag: &str,
    ) -> (i32, Value) {
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "tern",
            "agent_socket": self.socket(),
            "state_dir": self.state_dir(),
            "ipam": {"type": "tern-ipam"},
        });
        if let (Some(c), Some(e)) = (conf.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                c.insert(k.clone(), v.clone());
            }
        }
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.netns])
            .arg(plugin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_COMMAND", cmd)
            .env(
                "CNI_PATH",
                format!("{}:{REFERENCE_PLUGINS}", plugin.parent().unwrap().display()),
            );
        if let Some(p) = pod {
            command
                .env("CNI_CONTAINERID", &p.cid)
                .env("CNI_NETNS", p.ns.path())
                .env("CNI_IFNAME", "eth0")
                .env(
                    "CNI_ARGS",
                    format!(
                        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};\
                         K8S_POD_INFRA_CONTAINER_ID={}",
                        p.namespace, p.name, p.cid
                    ),
                );
        }
        let mut child = command
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
            eprintln!("--- ternd log\n{}", self.log());
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A pod: its Kubernetes identity and sandbox network namespace.
struct Pod {
    namespace: String,
    name: String,
    cid: String,
    ns: Netns,
}

impl Pod {
    fn new(namespace: &str, name: &str) -> Pod {
        let ns = Netns::new("p");
        Pod {
            namespace: namespace.to_string(),
            name: name.to_string(),
            cid: format!("sandbox-{}", ns.0),
            ns,
        }
    }

    /// Whether the sandbox has an `eth0`.
    fn has_eth0(&self) -> bool {
        Command::new("ip")
            .args(["-n", &self.ns.0, "link", "show", "eth0"])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

fn pod_json(ns: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": ann},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "pause"}]
        }
    })
    .to_string()
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

/// The address of a successful ADD's result (its first IP).
fn result_ip(out: &Value) -> IpNet {
    out["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in the result: {out}"))
        .parse()
        .unwrap()
}

/// Asserts an ADD failed with `code` and a message containing every one of `words`.
fn assert_refused(st: i32, out: &Value, code: u64, words: &[&str]) {
    assert_ne!(st, 0, "ADD should fail: {out}");
    assert_eq!(out["code"], code, "{out}");
    let msg = out["msg"].as_str().unwrap_or("");
    for w in words {
        assert!(msg.contains(w), "message {msg:?} does not contain {w:?}");
    }
    eprintln!("refused ({code}): {msg}");
}

#[test]
fn calico_ipam_annotations_from_the_api_server() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (network namespaces, nftables): run it as root"
    );
    let bin = kube_api::bin_dir();
    eprintln!("kubernetes binaries: {}", bin.display());
    let plugin = tern_bin();
    let tmp = tempfile::Builder::new().prefix("tkn-").tempdir().unwrap();
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

    let api = KubeApi::start(&n, &tmp.path().join("k8s"), NODE_IP);
    api.apply(AGENT_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\nspec: {{podCIDR: 10.250.1.0/24, \
         podCIDRs: [10.250.1.0/24]}}\n---\napiVersion: v1\nkind: \
         Namespace\nmetadata: {{name: prod}}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  \
         name: blue\n  annotations:\n    cni.projectcalico.org/ipv4pools: '[\"pool-b\"]'\n"
    ));
    // No controller-manager runs: the pods' service accounts are created here.
    for ns in ["prod", "blue"] {
        api.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {ns}}}\n"
        ));
    }

    // Three pools (ternd creates its default only when no IPv4 pool exists).
    let dir = tmp.path().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    {
        let store = tern_store::open(&format!("sqlite://{}/store.db", dir.display())).unwrap();
        for (name, cidr) in [
            ("default-ipv4-ippool", "10.244.0.0/16"),
            ("pool-b", "10.245.0.0/16"),
            ("pool-c", "10.246.0.0/16"),
        ] {
            let pool = tern_model::Resource::IpPool(tern_model::IpPool::new(
                name,
                tern_model::IpPoolSpec::new(cidr),
            ));
            tern_model::put_resource(&*store, &pool).unwrap();
        }
    }
    let kubeconfig = api.kubeconfig("tern-agent", "tern-agent", &[]);
    let ternd = Ternd::start(&n, dir, &kubeconfig);
    ternd.wait_ready(&plugin);
    let plain = json!({});
    let add = |p: &Pod, extra: &Value| ternd.run(&plugin, "ADD", Some(p), extra, "");

    // ipAddrs: exactly that address, in the CNI result and the WorkloadEndpoint.
    const FIXED: &str = "10.244.7.7";
    api.apply(&pod_json(
        "prod",
        "fixed",
        &[("cni.projectcalico.org/ipAddrs", &format!("[\"{FIXED}\"]"))],
    ));
    let fixed = Pod::new("prod", "fixed");
    let (st, out) = add(&fixed, &plain);
    assert_eq!(st, 0, "ADD fixed: {out}\n{}", ternd.log());
    assert_eq!(result_ip(&out).to_string(), format!("{FIXED}/32"), "{out}");
    let ep = ternd.endpoint("prod", "fixed").expect("endpoint of fixed");
    assert_eq!(
        ep["spec"]["ipNetworks"],
        json!([format!("{FIXED}/32")]),
        "{ep}"
    );
    assert_eq!(
        ternd.allocations("prod", "fixed"),
        vec![FIXED.parse::<IpAddr>().unwrap()]
    );

    // A second pod asking for the same address: 103, and nothing is left behind.
    api.apply(&pod_json(
        "prod",
        "twin",
        &[("tern.dev/ipAddrs", &format!("[\"{FIXED}\"]"))],
    ));
    let veths_before = ternd.veths();
    let twin = Pod::new("prod", "twin");
    let (st, out) = add(&twin, &plain);
    assert_refused(st, &out, 103, &["pod prod/twin", FIXED, "already in use"]);
    assert!(
        ternd.endpoint("prod", "twin").is_none(),
        "twin's endpoint left"
    );
    assert!(
        ternd.allocations("prod", "twin").is_empty(),
        "twin's allocation left"
    );
    assert_eq!(
        ternd.veths(),
        veths_before,
        "a veth of the failed ADD is left"
    );
    assert!(!twin.has_eth0(), "the failed ADD left eth0 in the sandbox");

    // Once fixed is deleted, twin's retry gets the address.
    let (st, out) = ternd.run(&plugin, "DEL", Some(&fixed), &plain, "");
    assert_eq!(st, 0, "DEL fixed: {out}");
    let (st, out) = add(&twin, &plain);
    assert_eq!(st, 0, "ADD twin after fixed's DEL: {out}\n{}", ternd.log());
    assert_eq!(result_ip(&out).to_string(), format!("{FIXED}/32"));

    // Malformed, conflicting and disabled annotations: 7, naming the pod and the annotation.
    for (name, ann, words) in [
        (
            "malformed",
            vec![("cni.projectcalico.org/ipAddrs", "10.244.7.8")],
            vec![
                "pod prod/malformed",
                "cni.projectcalico.org/ipAddrs",
                "not a JSON list",
            ],
        ),
        (
            "spellings",
            vec![
                ("cni.projectcalico.org/ipv4pools", "[\"pool-b\"]"),
                ("tern.dev/ipv4pools", "[\"pool-c\"]"),
            ],
            vec!["pod prod/spellings", "tern.dev/ipv4pools"],
        ),
        (
            "both",
            vec![
                ("cni.projectcalico.org/ipAddrs", "[\"10.245.0.9\"]"),
                ("cni.projectcalico.org/ipv4pools", "[\"pool-b\"]"),
            ],
            vec!["pod prod/both", "cannot be used together"],
        ),
        (
            "unknown-pool",
            vec![("cni.projectcalico.org/ipv4pools", "[\"no-such-pool\"]")],
            vec![
                "pod prod/unknown-pool",
                "cni.projectcalico.org/ipv4pools",
                "\"no-such-pool\" does not exist",
            ],
        ),
        (
            "noipam",
            vec![("cni.projectcalico.org/ipAddrsNoIpam", "[\"192.0.2.44\"]")],
            vec![
                "pod prod/noipam",
                "cni.projectcalico.org/ipAddrsNoIpam",
                "requested feature is not enabled: ip_addrs_no_ipam",
            ],
        ),
    ] {
        api.apply(&pod_json("prod", name, &ann));
        let p = Pod::new("prod", name);
        let (st, out) = add(&p, &plain);
        assert_refused(st, &out, 7, &words);
        assert!(
            ternd.endpoint("prod", name).is_none(),
            "{name}: endpoint left"
        );
        assert!(!p.has_eth0(), "{name}: eth0 left in the sandbox");
    }
    // fixed's veth may still be in its deferred deletion.
    assert!(
        wait_until(Duration::from_secs(10), || ternd.veths().len() == 1),
        "only twin's veth should remain: {:?}",
        ternd.veths()
    );

    // With the feature on, ipAddrsNoIpam uses the address without IPAM.
    let noipam = Pod::new("prod", "noipam");
    let (st, out) = add(
        &noipam,
        &json!({"feature_control": {"ip_addrs_no_ipam": true}}),
    );
    assert_eq!(
        st,
        0,
        "ADD noipam with the feature on: {out}\n{}",
        ternd.log()
    );
    assert_eq!(result_ip(&out).to_string(), "192.0.2.44/32");
    assert!(ternd.allocations("prod", "noipam").is_empty());
    let (st, out) = ternd.run(&plugin, "DEL", Some(&noipam), &plain, "");
    assert_eq!(st, 0, "DEL noipam: {out}");

    // The namespace's ipv4pools is its pods' default; a pod's own annotation overrides it.
    let in_pool = |out: &Value, cidr: &str| {
        let net: IpNet = cidr.parse().unwrap();
        assert!(
            net.contains(&result_ip(out).addr()),
            "{} not in {cidr}: {out}",
            result_ip(out)
        );
    };
    api.apply(&pod_json("blue", "default-pool", &[]));
    let p1 = Pod::new("blue", "default-pool");
    let (st, out) = add(&p1, &plain);
    assert_eq!(st, 0, "ADD blue/default-pool: {out}\n{}", ternd.log());
    in_pool(&out, "10.245.0.0/16");
    api.apply(&pod_json(
        "blue",
        "own-pool",
        &[("tern.dev/ipv4pools", "[\"10.246.0.0/16\"]")],
    ));
    let p2 = Pod::new("blue", "own-pool");
    let (st, out) = add(&p2, &plain);
    assert_eq!(st, 0, "ADD blue/own-pool: {out}\n{}", ternd.log());
    in_pool(&out, "10.246.0.0/16");
    // A namespace annotation changed later applies to the next pod.
    api.must(&[
        "annotate",
        "namespace",
        "blue",
        "--overwrite",
        "cni.projectcalico.org/ipv4pools=[\"pool-c\"]",
    ]);
    api.apply(&pod_json("blue", "after-change", &[]));
    let p3 = Pod::new("blue", "after-change");
    let ok = wait_until(Duration::from_secs(10), || {
        let (st, out) = add(&p3, &plain);
        if st != 0 {
            panic!("ADD blue/after-change: {out}\n{}", ternd.log());
        }
        let got = result_ip(&out).addr();
        if "10.246.0.0/16".parse::<IpNet>().unwrap().contains(&got) {
            return true;
        }
        // The watch had not delivered the change yet: undo and retry.
        let _ = ternd.run(&plugin, "DEL", Some(&p3), &plain, "");
        false
    });
    assert!(ok, "the namespace's new ipv4pools was not applied");

    // The node watch: this node's podCIDRs reach tern's Node resource; another node's
    // podCIDRs, addresses and deletion reach ternd.
    let own = wait_until(Duration::from_secs(10), || {
        tern_model::get_resource(&*ternd.store(), tern_model::Kind::Node, None, NODE)
            .ok()
            .flatten()
            .and_then(|r| serde_json::to_value(&r).ok())
            .is_some_and(|v| v["spec"]["podCIDRs"] == json!(["10.250.1.0/24"]))
    });
    assert!(
        own,
        "spec.podCIDRs of tern's Node {NODE} not written\n{}",
        ternd.log()
    );

    // usePodCidr: a delegated host-local on this node's podCIDR, as Calico's plugin does it.
    assert!(
        Path::new(REFERENCE_PLUGINS).join("host-local").is_file(),
        "host-local is missing in {REFERENCE_PLUGINS} (install the containernetworking-plugins \
         package)"
    );
    let hl_conf = json!({"ipam": {
        "type": "host-local",
        "subnet": "usePodCidr",
        "dataDir": tmp.path().join("host-local"),
    }});
    api.apply(&pod_json("prod", "hl", &[]));
    let hl = Pod::new("prod", "hl");
    let (st, out) = add(&hl, &hl_conf);
    assert_eq!(st, 0, "ADD with usePodCidr: {out}\n{}", ternd.log());
    let got = result_ip(&out).addr();
    assert!(
        "10.250.1.0/24".parse::<IpNet>().unwrap().contains(&got),
        "{got} is not in the node's podCIDR: {out}"
    );
    assert!(
        ternd.allocations("prod", "hl").is_empty(),
        "tern IPAM was used"
    );
    let (st, out) = ternd.run(&plugin, "DEL", Some(&hl), &hl_conf, "");
    assert_eq!(st, 0, "DEL with usePodCidr: {out}");
    api.apply(
        "apiVersion: v1\nkind: Node\nmetadata: {name: other-node}\nspec:\n  podCIDR: \
         10.244.2.0/24\n  podCIDRs: [10.244.2.0/24]\n",
    );
    let logged = |s: &str| wait_until(Duration::from_secs(10), || ternd.log().contains(s));
    assert!(
        logged("node other-node added (addresses [], podCIDRs [10.244.2.0/24])"),
        "node addition not seen\n{}",
        ternd.log()
    );
    api.must(&[
        "patch",
        "node",
        "other-node",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"addresses":[{"type":"InternalIP","address":"198.18.0.21"}]}}"#,
    ]);
    assert!(
        logged("node other-node now has addresses [198.18.0.21], podCIDRs [10.244.2.0/24]"),
        "node address not seen\n{}",
        ternd.log()
    );
    api.must(&["delete", "node", "other-node"]);
    assert!(logged("node other-node deleted"), "node deletion not seen");
}
