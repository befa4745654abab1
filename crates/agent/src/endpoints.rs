//! WorkloadEndpoints of this node: the store is the record, the cache answers CHECK and GC
//! without a store round trip.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tern_api::{Attachment, PodRef};
use tern_store::{Store, StoreError};

/// What the agent knows of one pod interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub node: String,
    pub attachment: Attachment,
    pub host_ifname: String,
    pub mac: String,
    /// Pod addresses as CIDRs ("10.244.0.5/32").
    pub ip_networks: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Addresses came from a delegated IPAM plugin: tern IPAM must not release them.
    pub delegated_ipam: bool,
}

impl Endpoint {
    /// Kubernetes namespace of the endpoint resource ("default" outside Kubernetes).
    pub fn namespace(&self) -> String {
        self.attachment
            .pod
            .as_ref()
            .map(|p| p.namespace.clone())
            .unwrap_or_else(|| "default".into())
    }

    /// Resource name, as Calico builds it: `<node>-k8s-<pod>-<ifname>` or
    /// `<node>-cni-<containerID>-<ifname>` without a pod.
    pub fn name(&self) -> String {
        endpoint_name(&self.node, &self.attachment)
    }
}

/// The resource name of an attachment's endpoint on `node`.
pub fn endpoint_name(node: &str, a: &Attachment) -> String {
    let esc = |s: &str| s.replace('-', "--");
    match &a.pod {
        Some(p) => format!("{}-k8s-{}-{}", esc(node), esc(&p.name), esc(&a.ifname)),
        None => format!(
            "{}-cni-{}-{}",
            esc(node),
            esc(&a.container_id),
            esc(&a.ifname)
        ),
    }
}

/// Key identifying an attachment within the node: (network, containerID, ifname).
pub type AttachmentKey = (String, String, String);

pub fn key_of(a: &Attachment) -> AttachmentKey {
    (a.network.clone(), a.container_id.clone(), a.ifname.clone())
}

/// The node's endpoints, persisted as WorkloadEndpoint resources.
pub struct Endpoints {
    store: Arc<dyn Store>,
    node: String,
    cache: Mutex<HashMap<AttachmentKey, Endpoint>>,
}

impl Endpoints {
    /// Loads this node's endpoints from the store.
    pub fn load(store: Arc<dyn Store>, node: &str) -> Result<Endpoints, StoreError> {
        let eps = Endpoints {
            store,
            node: node.to_string(),
            cache: Mutex::new(HashMap::new()),
        };
        eps.refresh()?;
        Ok(eps)
    }

    /// Re-reads the node's endpoints from the store into the cache.
    pub fn refresh(&self) -> Result<(), StoreError> {
        let list = crate::endpoints::store_io::list(&*self.store, &self.node)?;
        let mut cache = self.cache.lock().unwrap();
        cache.clear();
        for ep in list {
            cache.insert(key_of(&ep.attachment), ep);
        }
        Ok(())
    }

    pub fn get(&self, a: &Attachment) -> Option<Endpoint> {
        self.cache.lock().unwrap().get(&key_of(a)).cloned()
    }

    pub fn all(&self) -> Vec<Endpoint> {
        self.cache.lock().unwrap().values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.cache.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the endpoint to the store, then the cache.
    pub fn put(&self, ep: Endpoint) -> Result<(), StoreError> {
        store_io::put(&*self.store, &ep)?;
        self.cache
            .lock()
            .unwrap()
            .insert(key_of(&ep.attachment), ep);
        Ok(())
    }

    /// Deletes the endpoint from the store (idempotent), then the cache.
    pub fn remove(&self, a: &Attachment) -> Result<(), StoreError> {
        let ep = self.get(a).unwrap_or_else(|| Endpoint {
            node: self.node.clone(),
            attachment: a.clone(),
            host_ifname: String::new(),
            mac: String::new(),
            ip_networks: vec![],
            labels: BTreeMap::new(),
            delegated_ipam: false,
        });
        store_io::delete(&*self.store, &ep)?;
        self.cache.lock().unwrap().remove(&key_of(a));
        Ok(())
    }
}

/// Conversion between [`Endpoint`] and the stored WorkloadEndpoint document.
pub mod store_io {
    use super::*;
    use tern_model::{ObjectMeta, WorkloadEndpoint, WorkloadEndpointSpec};

    fn to_resource(ep: &Endpoint) -> WorkloadEndpoint {
        let pod = ep.attachment.pod.clone().unwrap_or_default();
        let mut annotations = BTreeMap::new();
        annotations.insert(
            "tern.dev/netns".to_string(),
            ep.attachment.netns_path.clone(),
        );
        if ep.delegated_ipam {
            annotations.insert("tern.dev/delegated-ipam".to_string(), "true".to_string());
        }
        if !pod.infra_container_id.is_empty() {
            annotations.insert(
                "tern.dev/infra-container-id".to_string(),
                pod.infra_container_id.clone(),
            );
        }
        let mut doc = WorkloadEndpoint::new(
            ep.name(),
            WorkloadEndpointSpec {
                node: ep.node.clone(),
                orchestrator: if ep.attachment.pod.is_some() {
                    "k8s".into()
                } else {
                    "cni".into()
                },
                pod: pod.name.clone(),
                container_id: ep.attachment.container_id.clone(),
                endpoint: ep.attachment.ifname.clone(),
                interface_name: ep.host_ifname.clone(),
                mac: ep.mac.clone(),
                ip_networks: ep.ip_networks.clone(),
                network: ep.attachment.network.clone(),
                profiles: vec![],
                service_account_name: None,
                ports: vec![],
            },
        );
        doc.metadata = ObjectMeta {
            name: ep.name(),
            namespace: Some(ep.namespace()),
            labels: ep.labels.clone(),
            annotations,
            ..Default::default()
        };
        doc
    }

    fn from_resource(w: WorkloadEndpoint) -> Endpoint {
        let ns = w.metadata.namespace.clone().unwrap_or_default();
        let ann = &w.metadata.annotations;
        let pod = (w.spec.orchestrator == "k8s").then(|| PodRef {
            namespace: ns,
            name: w.spec.pod.clone(),
            infra_container_id: ann
                .get("tern.dev/infra-container-id")
                .cloned()
                .unwrap_or_default(),
        });
        Endpoint {
            node: w.spec.node.clone(),
            attachment: Attachment {
                network: w.spec.network.clone(),
                container_id: w.spec.container_id.clone(),
                ifname: w.spec.endpoint.clone(),
                netns_path: ann.get("tern.dev/netns").cloned().unwrap_or_default(),
                pod,
            },
            host_ifname: w.spec.interface_name.clone(),
            mac: w.spec.mac.clone(),
            ip_networks: w.spec.ip_networks.clone(),
            labels: w.metadata.labels.clone(),
            delegated_ipam: ann
                .get("tern.dev/delegated-ipam")
                .is_some_and(|v| v == "true"),
        }
    }

    fn key(ep: &Endpoint) -> String {
        tern_store::keys::namespaced_resource("WorkloadEndpoint", &ep.namespace(), &ep.name())
    }

    pub fn put(store: &dyn Store, ep: &Endpoint) -> Result<(), StoreError> {
        let body =
            serde_json::to_vec(&to_resource(ep)).map_err(|e| StoreError::Backend(e.to_string()))?;
        store.put(&key(ep), &body)?;
        Ok(())
    }

    pub fn delete(store: &dyn Store, ep: &Endpoint) -> Result<(), StoreError> {
        store.delete(&key(ep))?;
        Ok(())
    }

    /// Every endpoint of `node`; documents that do not parse are skipped with a warning.
    pub fn list(store: &dyn Store, node: &str) -> Result<Vec<Endpoint>, StoreError> {
        list_where(store, |n| n == node)
    }

    /// Every endpoint of every node (for `ternctl ipam check`).
    pub fn list_all(store: &dyn Store) -> Result<Vec<Endpoint>, StoreError> {
        list_where(store, |_| true)
    }

    fn list_where(
        store: &dyn Store,
        on_node: impl Fn(&str) -> bool,
    ) -> Result<Vec<Endpoint>, StoreError> {
        let (kvs, _) = store.range(&tern_store::keys::resource_prefix("WorkloadEndpoint"))?;
        let mut out = Vec::new();
        for kv in kvs {
            match serde_json::from_slice::<WorkloadEndpoint>(&kv.value) {
                Ok(w) if on_node(&w.spec.node) => out.push(from_resource(w)),
                Ok(_) => {}
                Err(e) => log::warn!("skipping unreadable endpoint {}: {e}", kv.key),
            }
        }
        Ok(out)
    }
}
