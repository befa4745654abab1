//! The `kubernetes` thread: connecting, starting every watch and the garbage collector, and
//! the once-a-second ticker (snapshot, endpoint retries, the Node condition).

use super::*;

pub(super) async fn run(inner: Arc<Inner>) {
    let client = loop {
        match make_client(inner.settings.kubeconfig.as_deref()).await {
            Ok(c) => {
                *inner.client_error.lock().unwrap() = None;
                break c;
            }
            Err(e) => {
                log::warn!("kubernetes: no client for the API server: {e}; retrying");
                *inner.client_error.lock().unwrap() = Some(e);
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let _ = inner.client.set(client.clone());
    log::info!(
        "kubernetes: watching pods of node {}, namespaces and networkpolicies",
        inner.node()
    );
    let pods = {
        let api: Api<SlimPod> = Api::all(client.clone());
        let cfg = watcher::Config::default()
            .fields(&format!("spec.nodeName={}", inner.node()))
            .page_size(100);
        let mut buf = None;
        watch(inner.clone(), PODS, watcher(api, cfg), move |i, ev| {
            i.on_pod(&mut buf, ev)
        })
    };
    let namespaces = {
        // Metadata only: the API server sends PartialObjectMetadata, never the full object.
        let api: Api<::kube::core::PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let mut buf = None;
        let mut meta_buf = None;
        let cache = inner.clone();
        let s = watcher(api, watcher::Config::default()).map(move |r| {
            r.map(|ev| {
                cache.on_namespace_meta(&mut meta_buf, &ev);
                convert(ev, |m: &::kube::core::PartialObjectMeta<Namespace>| {
                    let name = m.metadata.name.clone().unwrap_or_default();
                    (None, name, slim::namespace_resource(&m.metadata))
                })
            })
        });
        watch(inner.clone(), NAMESPACES, s, move |i, ev| {
            i.on_object(Kind::Namespace, &i.namespaces_synced, &mut buf, ev)
        })
    };
    let policies = {
        let api: Api<NetworkPolicy> = Api::all(client.clone());
        let mut buf = None;
        let s = watcher(api, watcher::Config::default()).map(|r| {
            r.map(|ev| {
                convert(ev, |p: &NetworkPolicy| {
                    (
                        p.metadata.namespace.clone(),
                        p.metadata.name.clone().unwrap_or_default(),
                        slim::network_policy_resource(p),
                    )
                })
            })
        });
        watch(inner.clone(), POLICIES, s, move |i, ev| {
            i.on_object(Kind::K8sNetworkPolicy, &i.policies_synced, &mut buf, ev)
        })
    };
    let nodes = {
        let api: Api<SlimNode> = Api::all(client.clone());
        let mut buf = None;
        watch(
            inner.clone(),
            NODES,
            watcher(api, watcher::Config::default().page_size(100)),
            move |i, ev| i.on_node(&mut buf, ev),
        )
    };
    let node_gc = gc::run(inner.clone(), client.clone());
    let ticks = ticker(inner.clone(), client);
    if inner.policy.is_some() {
        tokio::join!(pods, namespaces, policies, nodes, ticks, node_gc);
    } else {
        // Namespaces still feed the IPAM annotation defaults.
        tokio::join!(pods, namespaces, nodes, ticks, node_gc);
    }
}

/// Once a second: write the snapshot when it changed, retry endpoint writes the store refused,
/// and set the Node condition once the agent is ready.
pub(super) async fn ticker(inner: Arc<Inner>, client: ::kube::Client) {
    let mut last_patch = std::time::Instant::now() - Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        if inner.snapshot_dirty.swap(false, Ordering::Relaxed)
            && inner.namespaces_synced.load(Ordering::Relaxed)
            && inner.policies_synced.load(Ordering::Relaxed)
        {
            inner.save_snapshot();
        }
        if inner.pods_dirty.load(Ordering::Relaxed) {
            inner.sync_node_endpoints();
        }
        if inner.own_node_dirty.load(Ordering::Relaxed) {
            inner.sync_own_node();
        }
        let ready = inner.pods_synced.load(Ordering::Relaxed)
            && inner.namespaces_synced.load(Ordering::Relaxed)
            && inner.policies_synced.load(Ordering::Relaxed);
        if ready
            && !inner.node_condition_set.load(Ordering::Relaxed)
            && last_patch.elapsed() >= Duration::from_secs(5)
        {
            last_patch = std::time::Instant::now();
            match set_node_condition(&client, inner.node()).await {
                Ok(()) => {
                    inner.clear_rbac(NODE_STATUS);
                    inner.node_condition_set.store(true, Ordering::Relaxed);
                    log::info!(
                        "kubernetes: node {} condition NetworkUnavailable=False ({NODE_CONDITION_REASON})",
                        inner.node()
                    );
                }
                Err(::kube::Error::Api(s)) if s.code == 401 || s.code == 403 => {
                    inner.set_rbac(NODE_STATUS, rbac_message("patch", NODE_STATUS, &s))
                }
                Err(e) => log::debug!("kubernetes: node condition not set yet: {e}"),
            }
        }
    }
}

pub(super) async fn set_node_condition(
    client: &::kube::Client,
    node: &str,
) -> Result<(), ::kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let now = rfc3339_now();
    let patch = serde_json::json!({
        "status": {
            "conditions": [{
                "type": "NetworkUnavailable",
                "status": "False",
                "reason": NODE_CONDITION_REASON,
                "message": "tern is running on this node",
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]
        }
    });
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
}

/// The current UTC time as RFC 3339 with second precision (`2026-12-01T08:00:00Z`).
pub(super) fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

pub(super) fn rfc3339(secs: u64) -> String {
    // The jiff of k8s-openapi, whose own `Time` is a `jiff::Timestamp`.
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_200 + 3661), "2026-12-01T01:01:01Z");
    }
}
