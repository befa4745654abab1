//! Pods: a namespace per pod, set up and torn down by running the real `tern` CNI plugin
//! inside the node's namespace, exactly as a container runtime on that node would.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::process::{self, ip_in, netns_add, netns_del, netns_exec};
use crate::state::{self, IpFamily, LabState, NodeState, PodState, ServerState};
use crate::{LabError, Result};

/// CNI network name used by lab pods.
pub const NETWORK_NAME: &str = "k8s-pod-network";
/// Kubernetes namespace of lab pods.
pub const POD_NAMESPACE: &str = "default";

/// The network configuration given to `tern` for pods of `node` in an IPv4 lab.
pub fn netconf(node: &NodeState) -> serde_json::Value {
    netconf_for(node, IpFamily::Ipv4)
}

/// The network configuration given to `tern` for pods of `node` in a lab of `family`: an
/// address of each of the lab's families (`assign_ipv4` / `assign_ipv6`, as Calico's).
pub fn netconf_for(node: &NodeState, family: IpFamily) -> serde_json::Value {
    let flag = |on: bool| if on { "true" } else { "false" };
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "type": "tern",
        "agent_socket": node.socket,
        "state_dir": node.state_dir,
        "ipam": {
            "type": "tern-ipam",
            "assign_ipv4": flag(family.has_v4()),
            "assign_ipv6": flag(family.has_v6()),
        },
    })
}

/// Pod addresses (without prefix length) from a CNI result's `ips[].address`.
pub fn result_addresses(result: &serde_json::Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .map(|a| a.split('/').next().unwrap_or(a).to_string())
        .collect()
}

/// Runs the plugin for `command` (`ADD` or `DEL`); its stdout on success.
fn run_plugin(
    st: &LabState,
    node: &NodeState,
    pod: &PodState,
    command: &'static str,
) -> Result<String> {
    let conf = netconf_for(node, st.ip_family).to_string();
    exec_plugin(st, node, pod, command, (POD_NAMESPACE, &pod.name), &conf)
}

/// Runs the `tern` plugin in `node`'s namespace for `command` on `pod`, which Kubernetes
/// knows as `k8s_pod` (namespace, name), with the netconf `conf` on its stdin; its stdout on
/// success, an error naming the command and the pod otherwise.
pub(crate) fn exec_plugin(
    st: &LabState,
    node: &NodeState,
    pod: &PodState,
    command: &'static str,
    k8s_pod: (&str, &str),
    conf: &str,
) -> Result<String> {
    let (namespace, name) = k8s_pod;
    let mut cmd = netns_exec(&node.netns, &st.bin_dir.join("tern"));
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &pod.container_id)
        .env("CNI_NETNS", Path::new("/run/netns").join(&pod.netns))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &st.bin_dir)
        .env(
            "CNI_ARGS",
            format!(
                "K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={}",
                pod.container_id
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let err = |message: String| LabError::Cni {
        command,
        pod: pod.name.clone(),
        message,
    };
    let mut child = cmd.spawn().map_err(|e| LabError::Spawn {
        command: process::describe(&cmd),
        source: e,
    })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(conf.as_bytes())
            .map_err(|e| err(format!("writing the netconf to the plugin: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| err(format!("waiting for the plugin: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(err(format!(
            "plugin exited with {}: {} {}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(stdout)
}

/// Creates the network namespace of lab pod `pod` on `node` (loopback up) and records the
/// pod, saved, so `down` removes it whatever comes next. The node's and the pod's records.
pub(crate) fn new_pod_netns(
    st: &mut LabState,
    node: &str,
    pod: &str,
) -> Result<(NodeState, PodState)> {
    state::validate_pod_name(pod)?;
    let node = st.node(node)?.clone();
    if st.pods.iter().any(|p| p.name == pod) {
        return Err(LabError::Invalid(format!(
            "lab {:?} already has a pod {pod:?}",
            st.name
        )));
    }
    let p = PodState {
        name: pod.to_string(),
        node: node.name.clone(),
        netns: state::pod_ns(&st.name, pod),
        container_id: process::random_hex(32),
        addresses: Vec::new(),
    };
    netns_add(&p.netns)?;
    st.pods.push(p.clone());
    st.save()?;
    ip_in(&p.netns, &["link", "set", "lo", "up"])?;
    Ok((node, p))
}

/// Creates pod `pod` on `node`: its namespace, then CNI ADD. Records the pod (before ADD, so a
/// failed ADD is still cleaned up by DEL) and its addresses.
pub fn add_pod(st: &mut LabState, node: &str, pod: &str) -> Result<PodState> {
    let (node, mut p) = new_pod_netns(st, node, pod)?;
    let out = run_plugin(st, &node, &p, "ADD")?;
    let result: serde_json::Value = serde_json::from_str(&out).map_err(|e| LabError::Cni {
        command: "ADD",
        pod: pod.to_string(),
        message: format!("result is not JSON ({e}): {out}"),
    })?;
    p.addresses = result_addresses(&result);
    if p.addresses.is_empty() {
        return Err(LabError::Cni {
            command: "ADD",
            pod: pod.to_string(),
            message: format!("result has no ips[].address: {out}"),
        });
    }
    if let Some(sp) = st.pods.iter_mut().find(|x| x.name == pod) {
        sp.addresses = p.addresses.clone();
    }
    st.save()?;
    Ok(p)
}

/// Deletes pod `pod`: stops its echo servers, runs CNI DEL, deletes its namespace, forgets it.
/// The namespace is deleted and the pod forgotten even when DEL fails; the DEL error is
/// returned.
pub fn del_pod(st: &mut LabState, pod: &str) -> Result<()> {
    let p = st.pod(pod)?.clone();
    let servers: Vec<ServerState> = st
        .servers
        .iter()
        .filter(|s| s.pod == pod)
        .cloned()
        .collect();
    for s in &servers {
        process::stop(
            s.pid,
            &s.ready_file.display().to_string(),
            Duration::from_secs(2),
        );
    }
    st.servers.retain(|s| s.pod != pod);
    let del = match st.node(&p.node) {
        Ok(node) => {
            let node = node.clone();
            run_plugin(st, &node, &p, "DEL").map(drop)
        }
        Err(e) => Err(e),
    };
    let ns = netns_del(&p.netns);
    st.pods.retain(|x| x.name != pod);
    st.save()?;
    del?;
    ns
}

/// Starts an echo server (`<ternctl> lab serve`) inside the pod's namespace, in the
/// background, and waits until it listens. `ternctl` is the path of the ternctl binary.
pub fn start_server(
    st: &mut LabState,
    pod: &str,
    ternctl: &Path,
    tcp: Option<u16>,
    udp: Option<u16>,
) -> Result<ServerState> {
    let p = st.pod(pod)?.clone();
    let ready_file = st
        .dir()
        .join(format!("serve-{pod}-{}.ready", process::random_hex(4)));
    let log_path = st.dir().join(format!("serve-{pod}.log"));
    let mut cmd = netns_exec(&p.netns, ternctl);
    cmd.args(["lab", "serve"]);
    if let Some(t) = tcp {
        cmd.arg("--tcp").arg(t.to_string());
    }
    if let Some(u) = udp {
        cmd.arg("--udp").arg(u.to_string());
    }
    cmd.arg("--ready-file").arg(&ready_file);
    let mut child = process::spawn_logged(&mut cmd, &log_path, false)?;
    let s = ServerState {
        pod: pod.to_string(),
        pid: child.id(),
        tcp,
        udp,
        ready_file: ready_file.clone(),
    };
    st.servers.push(s.clone());
    st.save()?;
    let start = Instant::now();
    while !ready_file.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(LabError::Invalid(format!(
                "echo server in pod {pod} exited ({status}): {}",
                log.trim()
            )));
        }
        if start.elapsed() > Duration::from_secs(5) {
            return Err(LabError::Timeout(format!(
                "echo server in pod {pod} did not start listening"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netconf_has_the_plugin_keys() {
        let n = NodeState {
            name: "node1".into(),
            netns: "tl-lab-node1".into(),
            address: "198.18.0.11".into(),
            ternd_pid: None,
            socket: "/run/tern-lab/lab/node1/ternd.sock".into(),
            state_dir: "/run/tern-lab/lab/node1".into(),
            ..NodeState::default()
        };
        let c = netconf(&n);
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["type"], "tern");
        assert_eq!(c["name"], "k8s-pod-network");
        assert_eq!(c["agent_socket"], "/run/tern-lab/lab/node1/ternd.sock");
        assert_eq!(c["state_dir"], "/run/tern-lab/lab/node1");
        assert_eq!(c["ipam"]["type"], "tern-ipam");
        assert_eq!(c["ipam"]["assign_ipv4"], "true");
        assert_eq!(c["ipam"]["assign_ipv6"], "false");
        let v6 = netconf_for(&n, IpFamily::Ipv6);
        assert_eq!(v6["ipam"]["assign_ipv4"], "false");
        assert_eq!(v6["ipam"]["assign_ipv6"], "true");
        let dual = netconf_for(&n, IpFamily::Dual);
        assert_eq!(dual["ipam"]["assign_ipv4"], "true");
        assert_eq!(dual["ipam"]["assign_ipv6"], "true");
    }

    #[test]
    fn addresses_from_result() {
        let r: serde_json::Value = serde_json::from_str(
            r#"{"cniVersion":"1.0.0","ips":[{"address":"10.244.0.5/32","interface":1},
                {"address":"fd00::5/128"}]}"#,
        )
        .unwrap();
        assert_eq!(result_addresses(&r), vec!["10.244.0.5", "fd00::5"]);
        assert!(result_addresses(&serde_json::json!({})).is_empty());
    }
}
