//! Pod metadata into this node's WorkloadEndpoints.
//!
//! Each agent watches only the pods bound to its node and writes their labels, named ports and
//! service account into the node's WorkloadEndpoint documents in tern's store. Every agent's
//! policy engine already watches those documents (that is how `ternctl label` reaches every
//! node), so a `kubectl label pod` propagates to the whole cluster along the existing store
//! path, with its figures; no agent needs a cluster-wide pod cache.
//!
//! Writes are compare-and-swap on the document's `mod_revision` (retried), so a concurrent ADD,
//! DEL or `ternctl` write is never lost or resurrected. A document is only changed when it
//! belongs to the same pod incarnation: its `tern.dev/pod-uid` annotation must equal the pod's
//! UID; a document without one (written by an ADD that had no `K8S_POD_UID`) gets it.

use super::slim::PodInfo;
use crate::endpoints::POD_UID_ANNOTATION;
pub use crate::endpoints::SERVICE_ACCOUNT_LABEL;
use std::collections::{BTreeMap, HashMap};
use tern_model::{EndpointPort, WorkloadEndpoint};
use tern_store::{Compare, KeyValue, Op, Store, StoreError, Txn, keys};

/// Prefix of the labels tern itself derives (namespace, orchestrator, service account): they are
/// kept when the pod's own labels replace the rest.
const TERN_LABEL_PREFIX: &str = "tern.dev/";

/// CAS attempts per document before giving up until the next event or relist.
const ATTEMPTS: usize = 8;

/// The labels an endpoint of `pod` must carry: the pod's labels, tern's derived labels kept
/// from `current`, and the service account label.
pub fn desired_labels(
    current: &BTreeMap<String, String>,
    pod: &PodInfo,
) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = current
        .iter()
        .filter(|(k, _)| k.starts_with(TERN_LABEL_PREFIX) && k.as_str() != SERVICE_ACCOUNT_LABEL)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in &pod.labels {
        // A pod label may not impersonate tern's derived labels.
        if !k.starts_with(TERN_LABEL_PREFIX) {
            l.insert(k.clone(), v.clone());
        }
    }
    l.insert(
        crate::endpoints::NAMESPACE_LABEL.to_string(),
        pod.namespace.clone(),
    );
    if !pod.service_account.is_empty() {
        l.insert(
            SERVICE_ACCOUNT_LABEL.to_string(),
            pod.service_account.clone(),
        );
    }
    l
}

/// Escapes a name part as [`crate::endpoints::endpoint_name`] does.
fn esc(s: &str) -> String {
    s.replace('-', "--")
}

/// Key prefix of every endpoint document of `pod` on `node` (one per interface).
fn pod_prefix(node: &str, pod: &PodInfo) -> String {
    keys::namespaced_resource(
        "WorkloadEndpoint",
        &pod.namespace,
        &format!("{}-k8s-{}-", esc(node), esc(&pod.name)),
    )
}

/// Applies `pod` to one stored document; `None` when nothing changes or the document is not
/// this pod's (another node, another pod whose escaped name shares the prefix, another
/// incarnation).
fn updated(node: &str, pod: &PodInfo, mut w: WorkloadEndpoint) -> Option<WorkloadEndpoint> {
    if w.spec.node != node || w.spec.orchestrator != "k8s" || w.spec.pod != pod.name {
        return None;
    }
    let stored_uid = w.metadata.annotations.get(POD_UID_ANNOTATION).cloned();
    match stored_uid.as_deref() {
        Some(u) if !u.is_empty() && u != pod.uid => {
            log::debug!(
                "endpoint {} belongs to uid {u}, not pod {}/{} uid {}: left alone",
                w.metadata.name,
                pod.namespace,
                pod.name,
                pod.uid
            );
            return None;
        }
        _ => {}
    }
    let labels = desired_labels(&w.metadata.labels, pod);
    let ports: Vec<EndpointPort> = pod.ports.clone();
    let sa = (!pod.service_account.is_empty()).then(|| pod.service_account.clone());
    let uid_ok = stored_uid.as_deref() == Some(pod.uid.as_str()) || pod.uid.is_empty();
    if labels == w.metadata.labels
        && ports == w.spec.ports
        && sa == w.spec.service_account_name
        && uid_ok
    {
        return None;
    }
    w.metadata.labels = labels;
    w.spec.ports = ports;
    w.spec.service_account_name = sa;
    if !pod.uid.is_empty() {
        w.metadata
            .annotations
            .insert(POD_UID_ANNOTATION.to_string(), pod.uid.clone());
    }
    w.metadata.resource_version = None;
    Some(w)
}

/// Writes one document if `pod` changes it, by CAS on its revision; re-reads on a conflict.
/// Returns whether it wrote.
fn sync_kv(store: &dyn Store, node: &str, pod: &PodInfo, kv: KeyValue) -> Result<bool, StoreError> {
    let mut kv = kv;
    for _ in 0..ATTEMPTS {
        let w: WorkloadEndpoint = match serde_json::from_slice(&kv.value) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("kubernetes: skipping unreadable endpoint {}: {e}", kv.key);
                return Ok(false);
            }
        };
        let Some(next) = updated(node, pod, w) else {
            return Ok(false);
        };
        let body = serde_json::to_vec(&next).map_err(|e| StoreError::Backend(e.to_string()))?;
        let done = store.txn(Txn {
            compare: vec![Compare::ModRevision(kv.key.clone(), kv.mod_revision)],
            success: vec![Op::put(kv.key.clone(), body)],
            failure: vec![],
        })?;
        if done.succeeded {
            return Ok(true);
        }
        match store.get(&kv.key)? {
            Some(fresh) => kv = fresh,
            // Deleted meanwhile (a DEL): nothing to label.
            None => return Ok(false),
        }
    }
    Err(StoreError::Backend(format!(
        "endpoint {} kept changing while its pod labels were written",
        kv.key
    )))
}

/// Brings the endpoints of one pod on `node` in line with it. Returns the documents written.
pub fn sync_pod(store: &dyn Store, node: &str, pod: &PodInfo) -> Result<usize, StoreError> {
    let (kvs, _) = store.range(&pod_prefix(node, pod))?;
    let mut n = 0;
    for kv in kvs {
        if sync_kv(store, node, pod, kv)? {
            n += 1;
        }
    }
    Ok(n)
}

/// Brings every Kubernetes endpoint of `node` in line with `pods` (after a full list). Endpoints
/// whose pod is not listed are left alone: a pod deleted from the API keeps its endpoint until
/// the runtime's DEL (the sandbox may still be running; policy keeps applying to it).
pub fn sync_node(
    store: &dyn Store,
    node: &str,
    pods: &HashMap<(String, String), PodInfo>,
) -> Result<usize, StoreError> {
    let (kvs, _) = store.range(&keys::resource_prefix("WorkloadEndpoint"))?;
    let mut n = 0;
    for kv in kvs {
        let Ok(w) = serde_json::from_slice::<WorkloadEndpoint>(&kv.value) else {
            continue;
        };
        if w.spec.node != node || w.spec.orchestrator != "k8s" {
            continue;
        }
        let ns = w.metadata.namespace.clone().unwrap_or_default();
        if let Some(pod) = pods.get(&(ns, w.spec.pod.clone()))
            && sync_kv(store, node, pod, kv)?
        {
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::{Endpoint, Endpoints};
    use crate::testutil::label;
    use std::sync::Arc;
    use tern_api::{Attachment, PodRef};
    use tern_model::Protocol;

    fn ep(pod: &str, uid: &str) -> Endpoint {
        Endpoint {
            node: "n-1".into(),
            attachment: Attachment {
                network: "k8s-pod-network".into(),
                container_id: format!("c-{pod}"),
                ifname: "eth0".into(),
                netns_path: "/run/netns/x".into(),
                pod: Some(PodRef {
                    namespace: "prod".into(),
                    name: pod.into(),
                    uid: uid.into(),
                    ..Default::default()
                }),
            },
            host_ifname: "tern0123456789a".into(),
            mac: None,
            ip_networks: vec!["10.244.0.5/32".parse().unwrap()],
            labels: crate::endpoints::workload_labels(
                &Attachment {
                    pod: Some(PodRef {
                        namespace: "prod".into(),
                        name: pod.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                &BTreeMap::from([("old".to_string(), "x".to_string())]),
            ),
            ports: vec![],
            delegated_ipam: false,
        }
    }

    fn pod(name: &str, uid: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: "prod".into(),
            name: name.into(),
            uid: uid.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            service_account: "sa".into(),
            ports: vec![crate::testutil::port("http", 8080, Protocol::Tcp)],
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn pod_labels_replace_the_endpoint_labels_of_the_same_incarnation() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let eps = Endpoints::load(store.clone(), "n-1").unwrap();
        eps.put(ep("web", "u1")).unwrap();
        // "web-1" shares the key prefix "n--1-k8s-web-" in escaped form only if it were
        // "web"; a pod named "web--x" must not be touched by pod "web".
        eps.put(ep("web-x", "u9")).unwrap();

        let p = pod(
            "web",
            "u1",
            &[("app", "web"), ("tern.dev/namespace", "evil")],
        );
        assert_eq!(sync_pod(&*store, "n-1", &p).unwrap(), 1);
        eps.refresh().unwrap();
        let got = eps.get(&ep("web", "u1").attachment).unwrap();
        assert_eq!(label(&got.labels, "app"), Some("web"));
        assert_eq!(
            got.labels.get("old"),
            None,
            "labels the pod lost are removed"
        );
        assert_eq!(label(&got.labels, "tern.dev/namespace"), Some("prod"));
        assert_eq!(label(&got.labels, SERVICE_ACCOUNT_LABEL), Some("sa"));
        assert_eq!(got.ports, p.ports);
        let other = eps.get(&ep("web-x", "u9").attachment).unwrap();
        assert_eq!(label(&other.labels, "old"), Some("x"));
        // Idempotent: nothing to write the second time.
        assert_eq!(sync_pod(&*store, "n-1", &p).unwrap(), 0);

        // Another incarnation of the same name (stale cache) never labels this one.
        let stale = pod("web", "u0", &[("app", "stale")]);
        assert_eq!(sync_pod(&*store, "n-1", &stale).unwrap(), 0);
        // A document without a UID gets the pod's.
        eps.put(ep("db", "")).unwrap();
        let db = pod("db", "u5", &[("app", "db")]);
        let all = HashMap::from([(("prod".to_string(), "db".to_string()), db.clone())]);
        assert_eq!(sync_node(&*store, "n-1", &all).unwrap(), 1);
        eps.refresh().unwrap();
        let got = eps.get(&ep("db", "").attachment).unwrap();
        assert_eq!(got.attachment.pod.unwrap().uid, "u5");
        assert_eq!(label(&got.labels, "app"), Some("db"));
    }
}
