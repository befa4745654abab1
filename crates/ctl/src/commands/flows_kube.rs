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
use tern_api::flow::FlowReply;
use tern_api::{Reply, Request};
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

/// One request to a node's agent: `ternctl flows --agent-reply REQUEST` run in its agent's
/// pod, which answers flows requests only ([`crate::commands::flows::agent_reply`]).
pub fn call(store: &KubeStore, pod: &AgentPod, req: &Request) -> anyhow::Result<Reply> {
    let request = serde_json::to_string(req)?;
    let out = store
        .exec(
            AGENT_NAMESPACE,
            &pod.name,
            AGENT_CONTAINER,
            &["ternctl", "flows", "--agent-reply", &request],
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
    let reply = serde_json::from_slice::<Reply>(&out.stdout);
    match (reply, req) {
        (Ok(r), _) => Ok(r),
        // A ternctl from before aggregates reads the request as a flow query and prints its
        // flow reply bare.
        (Err(_), Request::Flows(_)) if serde_json::from_slice::<FlowReply>(&out.stdout).is_ok() => {
            Ok(Reply::Flows(serde_json::from_slice(&out.stdout)?))
        }
        (Err(e), _) => Err(e).with_context(|| {
            format!(
                "node {} (pod {}): the agent's answer is not a reply: {:?}",
                pod.node,
                pod.name,
                String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(200)])
            )
        }),
    }
}
