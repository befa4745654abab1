//! Pods and ternd's records for the agent's Kubernetes tests (beside tern-testkit's API
//! server, `tern_testkit::kube_api`): a pod as the runtime sees it, the `tern` plugin run for it
//! with its Kubernetes identity in CNI_ARGS, and the endpoints and allocations ternd recorded.

use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::Path;
use tern_testkit::kube_api::KubeApi;
use tern_testkit::netns::Netns;
use tern_testkit::ternd::Ternd;

/// The network name of the test configurations.
pub const NETWORK: &str = "k8s-pod-network";

/// A pod as the runtime sees it: its Kubernetes identity, a sandbox network namespace, the
/// UID passed in CNI_ARGS (none when empty), and its address once added.
pub struct KubePod {
    pub namespace: String,
    pub name: String,
    /// The sandbox's container ID (unique per sandbox, as a runtime's).
    pub cid: String,
    pub uid: String,
    pub ns: Netns,
    pub ip: Option<IpAddr>,
}

impl KubePod {
    pub fn new(namespace: &str, name: &str) -> KubePod {
        let ns = Netns::new("p");
        KubePod {
            namespace: namespace.to_string(),
            name: name.to_string(),
            cid: format!("sandbox-{}", ns.name),
            uid: String::new(),
            ns,
            ip: None,
        }
    }

    /// Whether the sandbox has an `eth0`.
    pub fn has_eth0(&self) -> bool {
        self.ns.links().contains(": eth0@")
    }
}

/// ternd's records and the `tern` plugin, for the Kubernetes tests.
pub trait KubeTernd {
    fn add_api_pods(&self, api: &KubeApi, plugin: &Path, ns: &str, names: &[&str]) -> Vec<KubePod>;
    fn policy_chains(&self) -> usize;
    fn endpoints(&self) -> Vec<Value>;
    fn endpoint(&self, ns: &str, pod: &str) -> Option<Value>;
    fn allocations(&self, ns: &str, pod: &str) -> Vec<IpAddr>;
    fn cni(&self, plugin: &Path, cmd: &str, pod: Option<&KubePod>, extra: &Value) -> (i32, Value);
    fn cni_status(&self, plugin: &Path) -> (i32, Value);
}

impl KubeTernd for Ternd {
    /// CNI ADD of API pods `ns/<name>` (with their UIDs from the API server, as a runtime
    /// passes them): the pods with the addresses ternd gave them; panics on a failed ADD.
    fn add_api_pods(&self, api: &KubeApi, plugin: &Path, ns: &str, names: &[&str]) -> Vec<KubePod> {
        let mut pods: Vec<KubePod> = names.iter().map(|p| KubePod::new(ns, p)).collect();
        for p in pods.iter_mut() {
            p.uid = api.pod_uid(ns, &p.name);
            let (st, out) = self.cni(plugin, "ADD", Some(p), &json!({}));
            assert_eq!(st, 0, "ADD {}: {out}\n{}", p.name, self.log());
            let a = out["ips"][0]["address"].as_str().unwrap();
            p.ip = Some(a.split('/').next().unwrap().parse().unwrap());
        }
        pods
    }

    /// Number of policy chains (`pol-…`) in the node's `inet tern` table.
    fn policy_chains(&self) -> usize {
        self.nft_table()
            .lines()
            .filter(|l| l.trim_start().starts_with("chain pol-"))
            .count()
    }

    /// The node's WorkloadEndpoint documents.
    fn endpoints(&self) -> Vec<Value> {
        let (kvs, _) = self
            .store()
            .range(&tern_store::keys::resource_prefix("WorkloadEndpoint"))
            .unwrap();
        kvs.iter()
            .map(|kv| serde_json::from_slice(&kv.value).unwrap())
            .collect()
    }

    /// The WorkloadEndpoint of pod `ns/pod`, if any.
    fn endpoint(&self, ns: &str, pod: &str) -> Option<Value> {
        self.endpoints()
            .into_iter()
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

    /// Runs the `tern` plugin in the node namespace for `pod` (none: STATUS) as containerd
    /// does, `K8S_POD_*` in CNI_ARGS; `extra` is merged into the configuration. The exit
    /// status and the JSON it printed.
    fn cni(&self, plugin: &Path, cmd: &str, pod: Option<&KubePod>, extra: &Value) -> (i32, Value) {
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
        let mut command = super::cni_command(&self.netns, plugin, cmd);
        if let Some(p) = pod {
            let mut args = format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};\
                 K8S_POD_INFRA_CONTAINER_ID={}",
                p.namespace, p.name, p.cid
            );
            if !p.uid.is_empty() {
                args.push_str(&format!(";K8S_POD_UID={}", p.uid));
            }
            command
                .env("CNI_CONTAINERID", &p.cid)
                .env("CNI_NETNS", p.ns.path())
                .env("CNI_IFNAME", "eth0")
                .env("CNI_ARGS", args);
        }
        let out = super::output_with_stdin(&mut command, conf.to_string().as_bytes());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or(Value::String(stdout.into_owned()))
        };
        (out.status.code().unwrap_or(-1), v)
    }

    /// CNI STATUS (version 1.1.0) through the plugin.
    fn cni_status(&self, plugin: &Path) -> (i32, Value) {
        self.cni(plugin, "STATUS", None, &json!({"cniVersion": "1.1.0"}))
    }
}
