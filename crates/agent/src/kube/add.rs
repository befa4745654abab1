//! The Kubernetes part of a CNI ADD: the pod it is for (cache, else one GET), the pod's and
//! namespace's IPAM annotations applied to the request, and the endpoint brought up to date
//! after it is recorded.

use super::*;

impl Kube {
    /// The pod an ADD is for: from the cache when its UID matches the runtime's
    /// (`K8S_POD_UID`), else by one GET. `Ok(None)` for attachments without a pod. "Try
    /// again" ([`AddError::code`]) when the API server cannot answer and the pod is not
    /// cached, or when it knows another incarnation of the pod.
    pub fn pod_for_add(&self, a: &Attachment) -> Result<Option<PodInfo>, AddError> {
        let Some(p) = &a.pod else {
            return Ok(None);
        };
        let key = (p.namespace.clone(), p.name.clone());
        if let Some(c) = self.inner.pods.lock().unwrap().get(&key)
            && (p.uid.is_empty() || c.uid == p.uid)
        {
            return Ok(Some(c.clone()));
        }
        let got =
            self.inner
                .get_pod(&p.namespace, &p.name)
                .map_err(|cause| AddError::PodUnreadable {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    cause,
                })?;
        let Some(info) = got else {
            return Err(AddError::PodNotFound {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            });
        };
        if !p.uid.is_empty() && info.uid != p.uid {
            return Err(AddError::PodRecreated {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                asked: p.uid.clone(),
                found: info.uid,
            });
        }
        Ok(Some(info))
    }

    /// Applies the IPAM annotations of `pod` and of its namespace to the IPAM part of an ADD
    /// ([`annotations::apply`]; `delegated` when another IPAM plugin chose the addresses):
    /// `Ok(Some(addresses))` when they are to be used without IPAM (`ipAddrsNoIpam`). Fails
    /// with [`AddError::BadAnnotation`] for a bad or refused annotation (naming the pod and
    /// the annotation), and with a "try again" error when the namespace cannot be read now.
    pub fn ipam_for_add(
        &self,
        pod: &PodInfo,
        req: &mut tern_api::IpamRequest,
        delegated: bool,
    ) -> Result<Option<Vec<std::net::IpAddr>>, AddError> {
        let ns_ann = self.namespace_annotations(&pod.namespace)?;
        if pod.annotations.is_empty() && ns_ann.is_empty() {
            return Ok(None);
        }
        let parsed = annotations::parse(&pod.namespace, &pod.name, &pod.annotations, &ns_ann)?;
        if parsed.is_empty() {
            return Ok(None);
        }
        log::debug!(
            "kubernetes: pod {}/{} IPAM annotations {parsed:?}",
            pod.namespace,
            pod.name
        );
        let store = self.inner.store.clone();
        let pools = move || -> Result<Vec<annotations::PoolRef>, AddError> {
            let (list, _) = tern_model::list_resources_skipping(&*store, Kind::IpPool)
                .map_err(|e| AddError::pools(&e))?;
            Ok(list
                .into_iter()
                .filter_map(|r| match r {
                    Resource::IpPool(p) => Some(annotations::PoolRef {
                        net: p.spec.net()?,
                        name: p.metadata.name,
                        cidr: p.spec.cidr,
                    }),
                    _ => None,
                })
                .collect())
        };
        annotations::apply(&pod.namespace, &pod.name, &parsed, req, delegated, &pools)
    }

    /// The IPAM annotations of namespace `ns`: from the cache, else by one GET ("try again"
    /// when the API server cannot answer).
    fn namespace_annotations(&self, ns: &str) -> Result<BTreeMap<String, String>, AddError> {
        if let Some(a) = self.inner.ns_annotations.lock().unwrap().get(ns) {
            return Ok(a.clone());
        }
        self.inner
            .get_namespace_annotations(ns)
            .map_err(|cause| AddError::NamespaceUnreadable {
                namespace: ns.to_string(),
                cause,
            })
    }

    /// Called after an ADD recorded `ep`: when the pod changed between the cache read and the
    /// write (the watch event found no endpoint yet), the endpoint is brought up to date now.
    pub fn endpoint_recorded(&self, ep: &Endpoint) {
        let Some(p) = &ep.attachment.pod else {
            return;
        };
        let cached = self
            .inner
            .pods
            .lock()
            .unwrap()
            .get(&(p.namespace.clone(), p.name.clone()))
            .cloned();
        let Some(pod) = cached else {
            return;
        };
        if (!p.uid.is_empty() && p.uid != pod.uid)
            || (wep::desired_labels(&ep.labels, &pod) == ep.labels && pod.ports == ep.ports)
        {
            return;
        }
        if let Err(e) = wep::sync_pod(
            &*self.inner.endpoint_store,
            &self.inner.settings.node_name,
            &pod,
        ) {
            log::warn!(
                "kubernetes: labelling pod {}/{}: {e}",
                pod.namespace,
                pod.name
            );
            self.inner.pods_dirty.store(true, Ordering::Relaxed);
        }
    }
}
