//! `ternctl flows` on a Kubernetes cluster: every node's agent asked through the API server.
//!
//! The agents listen on no port: each answers only on its node's root-only unix socket. So
//! ternctl runs `ternctl flows --agent-reply QUERY` in the `ternd` container of each
//! `tern-node` pod through the API server's `pods/exec` (as `kubectl exec` does;
//! [`tern_store::kube::KubeStore::exec`]); that command asks its node's agent over the socket
//! and prints the reply as one JSON document. Who may read records is who may exec into the
//! DaemonSet's pods: the API server's RBAC, and its audit log records each read.

use std::time::Duration;

use anyhow::Context;
use tern_api::flow::{FlowQuery, FlowReply};
use tern_store::kube::{AgentPod, KubeStore};

/// The agents' namespace (the manifest's).
pub const AGENT_NAMESPACE: &str = "kube-system";
/// The agents' pods.
pub const AGENT_SELECTOR: &str = "k8s-app=tern-node";
/// The agent's container in them.
pub const AGENT_CONTAINER: &str = "ternd";
/// Longest wait for one node's answer.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(20);

/// The agents' pods, by node.
pub fn agents(store: &KubeStore) -> anyhow::Result<Vec<AgentPod>> {
    let pods = store
        .pods_by_label(AGENT_NAMESPACE, AGENT_SELECTOR)
        .context("finding tern's agents (the tern-node DaemonSet's pods)")?;
    anyhow::ensure!(
        !pods.is_empty(),
        "no tern-node pod in {AGENT_NAMESPACE}: is tern installed (ternctl install manifest)?"
    );
    Ok(pods)
}

/// One node's records: `ternctl flows --agent-reply` run in its agent's pod.
pub fn fetch(store: &KubeStore, pod: &AgentPod, q: &FlowQuery) -> anyhow::Result<FlowReply> {
    let query = serde_json::to_string(q)?;
    let out = store
        .exec(
            AGENT_NAMESPACE,
            &pod.name,
            AGENT_CONTAINER,
            &["ternctl", "flows", "--agent-reply", &query],
            tern_api::MAX_FRAME * 2,
            EXEC_TIMEOUT,
        )
        .with_context(|| format!("node {}", pod.node))?;
    if out.exit_code != 0 {
        anyhow::bail!(
            "node {} (pod {}): {}: {}",
            pod.node,
            pod.name,
            out.message.unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "node {} (pod {}): the agent's reply is not a flow reply: {:?}",
            pod.node,
            pod.name,
            String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(200)])
        )
    })
}
