//! The watches and what each event does: nodes (the node cache, this node's podCIDRs), pods
//! (this node's WorkloadEndpoints), namespaces and NetworkPolicies (the policy engine, the
//! namespace annotation cache); permission problems kept for readiness.

use super::*;

impl Inner {
    /// Keeps the cluster's nodes; a relist replaces them at `InitDone`. Changes of podCIDRs,
    /// deletion marks and removals are logged (a removed node's IPAM is released by [`gc`]).
    pub(super) fn on_node(
        &self,
        buf: &mut Option<HashMap<String, NodeInfo>>,
        ev: watcher::Event<SlimNode>,
    ) {
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(n) => {
                let i = NodeInfo::from_node(&n);
                buf.get_or_insert_with(HashMap::new)
                    .insert(i.name.clone(), i);
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} nodes in the cluster", all.len());
                *self.nodes.lock().unwrap() = all;
                self.nodes_synced.store(true, Ordering::Relaxed);
                self.sync_own_node();
            }
            watcher::Event::Apply(n) => {
                let i = NodeInfo::from_node(&n);
                let before = self.nodes.lock().unwrap().insert(i.name.clone(), i.clone());
                if i.name == self.node()
                    && before.as_ref().map(|b| &b.pod_cidrs) != Some(&i.pod_cidrs)
                {
                    self.sync_own_node();
                }
                match before {
                    Some(b) if b == i => {}
                    Some(b) => {
                        if b.pod_cidrs != i.pod_cidrs || b.addresses != i.addresses {
                            log::info!(
                                "kubernetes: node {} now has addresses {:?}, podCIDRs {:?}",
                                i.name,
                                i.addresses,
                                i.pod_cidrs
                            );
                        }
                        if i.deleting && !b.deleting {
                            log::info!("kubernetes: node {} is being deleted", i.name);
                        }
                    }
                    None => log::info!(
                        "kubernetes: node {} added (addresses {:?}, podCIDRs {:?})",
                        i.name,
                        i.addresses,
                        i.pod_cidrs
                    ),
                }
            }
            watcher::Event::Delete(n) => {
                let i = NodeInfo::from_node(&n);
                self.nodes.lock().unwrap().remove(&i.name);
                log::info!("kubernetes: node {} deleted", i.name);
            }
        }
    }

    /// Mirrors this node's `spec.podCIDRs` from Kubernetes into tern's Node resource (CAS on
    /// its revision; the agent's own registration writes the other fields). Retried by the
    /// ticker while the store refuses or the Node is not registered yet.
    pub(super) fn sync_own_node(&self) {
        let Some(info) = self.nodes.lock().unwrap().get(self.node()).cloned() else {
            return;
        };
        let want: Option<Vec<String>> = (!info.pod_cidrs.is_empty())
            .then(|| info.pod_cidrs.iter().map(|c| c.to_string()).collect());
        let mut result = Err(String::new());
        for _ in 0..5 {
            result = match tern_model::get_resource(&*self.store, Kind::Node, None, self.node()) {
                Ok(Some(Resource::Node(mut n))) => {
                    if n.spec.pod_cidrs == want {
                        Ok(false)
                    } else {
                        n.spec.pod_cidrs = want.clone();
                        match tern_model::put_resource(&*self.store, &Resource::Node(n)) {
                            Ok(_) => Ok(true),
                            Err(tern_model::ModelError::Conflict { .. }) => continue,
                            Err(e) => Err(e.to_string()),
                        }
                    }
                }
                Ok(_) => Err(format!("tern Node {} is not registered yet", self.node())),
                Err(e) => Err(e.to_string()),
            };
            break;
        }
        if let Err(e) = self.write_pod_cidrs_file(&info) {
            log::warn!("kubernetes: writing {}: {e}", tern_api::POD_CIDRS_FILE);
            result = Err(e.to_string());
        }
        match result {
            Ok(wrote) => {
                self.own_node_dirty.store(false, Ordering::Relaxed);
                if wrote {
                    log::info!(
                        "kubernetes: node {} podCIDRs {:?} written to tern's Node",
                        self.node(),
                        want.unwrap_or_default()
                    );
                }
            }
            Err(e) => {
                self.own_node_dirty.store(true, Ordering::Relaxed);
                log::debug!("kubernetes: node podCIDRs not written yet: {e}");
            }
        }
    }

    /// Records this node's podCIDRs in `<state_dir>/pod-cidrs.json` for the plugin's
    /// `usePodCidr` (written to a temporary file and renamed, so a reader never sees half).
    pub(super) fn write_pod_cidrs_file(&self, info: &NodeInfo) -> std::io::Result<()> {
        let path = self.settings.state_dir.join(tern_api::POD_CIDRS_FILE);
        let body = serde_json::json!({
            "node": info.name,
            "podCIDRs": info.pod_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        });
        if std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v == body)
        {
            return Ok(());
        }
        std::fs::create_dir_all(&self.settings.state_dir)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, body.to_string())?;
        std::fs::rename(&tmp, &path)
    }

    /// Keeps the namespaces' IPAM annotations; a relist replaces them at `InitDone`.
    pub(super) fn on_namespace_meta(
        &self,
        buf: &mut Option<HashMap<String, BTreeMap<String, String>>>,
        ev: &watcher::Event<::kube::core::PartialObjectMeta<Namespace>>,
    ) {
        let entry = |m: &::kube::core::PartialObjectMeta<Namespace>| {
            (
                m.metadata.name.clone().unwrap_or_default(),
                annotations::relevant(m.metadata.annotations.as_ref()),
            )
        };
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(m) => {
                let (k, v) = entry(m);
                buf.get_or_insert_with(HashMap::new).insert(k, v);
            }
            watcher::Event::InitDone => {
                *self.ns_annotations.lock().unwrap() = buf.take().unwrap_or_default();
            }
            watcher::Event::Apply(m) => {
                let (k, v) = entry(m);
                self.ns_annotations.lock().unwrap().insert(k, v);
            }
            watcher::Event::Delete(m) => {
                let (k, _) = entry(m);
                self.ns_annotations.lock().unwrap().remove(&k);
            }
        }
    }

    pub(super) fn set_rbac(&self, resource: &'static str, msg: String) {
        let mut r = self.rbac.lock().unwrap();
        if r.get(resource) != Some(&msg) {
            log::error!("kubernetes: {msg}");
        }
        r.insert(resource, msg);
    }

    pub(super) fn clear_rbac(&self, resource: &'static str) {
        let mut r = self.rbac.lock().unwrap();
        if r.remove(resource).is_some() {
            log::info!("kubernetes: {resource} readable again");
        }
    }

    pub(super) fn sync_node_endpoints(&self) {
        let pods = self.pods.lock().unwrap().clone();
        match wep::sync_node(&*self.endpoint_store, self.node(), &pods) {
            Ok(n) => {
                self.pods_dirty.store(false, Ordering::Relaxed);
                if n > 0 {
                    log::info!("kubernetes: {n} endpoints relabelled from their pods");
                }
            }
            Err(e) => {
                self.pods_dirty.store(true, Ordering::Relaxed);
                log::warn!("kubernetes: writing pod labels to the endpoints: {e}");
            }
        }
    }

    pub(super) fn on_pod(
        &self,
        buf: &mut Option<HashMap<(String, String), PodInfo>>,
        ev: watcher::Event<SlimPod>,
    ) {
        let key = |p: &PodInfo| (p.namespace.clone(), p.name.clone());
        match ev {
            watcher::Event::Init => *buf = Some(HashMap::new()),
            watcher::Event::InitApply(p) => {
                let i = PodInfo::from_pod(&p);
                buf.get_or_insert_with(HashMap::new).insert(key(&i), i);
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} pods on node {}", all.len(), self.node());
                *self.pods.lock().unwrap() = all;
                self.pods_synced.store(true, Ordering::Relaxed);
                self.sync_node_endpoints();
            }
            watcher::Event::Apply(p) => {
                let i = PodInfo::from_pod(&p);
                let before = self.pods.lock().unwrap().insert(key(&i), i.clone());
                if before.as_ref() != Some(&i) {
                    log::debug!("kubernetes: pod {}/{} changed", i.namespace, i.name);
                    if let Err(e) = wep::sync_pod(&*self.endpoint_store, self.node(), &i) {
                        log::warn!("kubernetes: labelling pod {}/{}: {e}", i.namespace, i.name);
                        self.pods_dirty.store(true, Ordering::Relaxed);
                    }
                }
            }
            watcher::Event::Delete(p) => {
                let i = PodInfo::from_pod(&p);
                // The endpoint stays until the runtime's DEL (the sandbox may still run).
                self.pods.lock().unwrap().remove(&key(&i));
            }
        }
    }

    /// Feeds namespace or policy events into the engine; the full list replaces the engine's
    /// objects of `kind` only at `InitDone`.
    pub(super) fn on_object(
        &self,
        kind: Kind,
        synced: &AtomicBool,
        buf: &mut Option<Vec<Resource>>,
        ev: watcher::Event<Converted>,
    ) {
        let Some(policy) = &self.policy else {
            return;
        };
        let converted = |r: Converted| match r {
            Ok(r) => Some(r),
            Err((ns, name, e)) => {
                log::error!(
                    "kubernetes: {} {}{name} cannot be enforced: {e}",
                    kind.as_str(),
                    ns.map(|n| format!("{n}/")).unwrap_or_default()
                );
                None
            }
        };
        let result = match ev {
            watcher::Event::Init => {
                *buf = Some(Vec::new());
                Ok(())
            }
            watcher::Event::InitApply(r) => {
                if let Some(r) = converted(r) {
                    buf.get_or_insert_with(Vec::new).push(r);
                }
                Ok(())
            }
            watcher::Event::InitDone => {
                let all = buf.take().unwrap_or_default();
                log::info!("kubernetes: {} {} objects listed", all.len(), kind.as_str());
                let r = policy.replace(&[kind], all, true);
                synced.store(true, Ordering::Relaxed);
                r
            }
            watcher::Event::Apply(r) => match converted(r) {
                Some(r) => policy.apply(r),
                None => Ok(()),
            },
            watcher::Event::Delete(r) => {
                let (ns, name) = match &r {
                    Ok(r) => (r.namespace().map(str::to_string), r.name().to_string()),
                    Err((ns, name, _)) => (ns.clone(), name.clone()),
                };
                policy.remove(kind, ns.as_deref(), &name)
            }
        };
        if let Err(e) = result {
            log::warn!("kubernetes: policy update: {e}");
        }
        self.snapshot_dirty.store(true, Ordering::Relaxed);
    }
}

/// A watched object in tern's form, or its identity (namespace, name) and why it could not be
/// converted.
pub(super) type Converted = Result<Resource, (Option<String>, String, String)>;

/// Runs one watch until the agent stops, handing events to `on`; errors are retried with
/// kube-runtime's backoff (a 410 relists), permission errors are kept as problems.
pub(super) async fn watch<K, T>(
    inner: Arc<Inner>,
    resource: &'static str,
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut on: T,
) where
    T: FnMut(&Inner, watcher::Event<K>),
{
    let mut s = std::pin::pin!(stream.default_backoff());
    while let Some(item) = s.next().await {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        match item {
            Ok(ev) => {
                inner.clear_rbac(resource);
                on(&inner, ev);
            }
            Err(e) => match rbac_problem(resource, &e) {
                Some(msg) => inner.set_rbac(resource, msg),
                None => match &e {
                    watcher::Error::WatchError(s) if s.code == 410 => {
                        log::info!("kubernetes: {resource} watch expired (410): relisting")
                    }
                    _ => log::warn!("kubernetes: {resource}: {e}; retrying"),
                },
            },
        }
    }
}

/// Converts a watched object, keeping its identity on failure for the log and for deletes.
pub(super) fn convert<K>(
    ev: watcher::Event<K>,
    f: impl Fn(&K) -> (Option<String>, String, Result<Resource, String>),
) -> watcher::Event<Converted> {
    let c = |k: K| {
        let (ns, name, r) = f(&k);
        r.map_err(|e| (ns, name, e))
    };
    match ev {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(k) => watcher::Event::InitApply(c(k)),
        watcher::Event::Apply(k) => watcher::Event::Apply(c(k)),
        watcher::Event::Delete(k) => watcher::Event::Delete(c(k)),
    }
}
