//! WorkloadEndpoints of this node: the store is the record, the cache answers CHECK and GC
//! without a store round trip.
//!
//! Which store: the datastore itself on etcd and SQLite, where every node's endpoints are
//! documents all agents read. On a datastore that derives the cluster's endpoints from its
//! Pods (Kubernetes, [`tern_store::Store::derives_endpoints`]) the node's own records, with
//! what a Pod does not say (container ID, network, netns, MAC), live in a node-local SQLite
//! file instead ([`open_store`]): an ADD or DEL then writes the API server once (the IPAM
//! block), not twice, and no per-pod object of tern's exists there.

use ipnet::IpNet;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tern_api::{Attachment, PodRef};
use tern_model::EndpointPort;
use tern_model::MacAddr;
use tern_store::{Store, StoreError};

/// Annotation of a WorkloadEndpoint with the pod's UID (`K8S_POD_UID`, or the API server's).
pub const POD_UID_ANNOTATION: &str = "tern.dev/pod-uid";
/// Label carrying the pod's service account (as Calico's `projectcalico.org/serviceaccount`),
/// set by the Kubernetes source ([`crate::kube`]).
pub const SERVICE_ACCOUNT_LABEL: &str = "tern.dev/serviceaccount";

/// Label every endpoint gets with its Kubernetes namespace (as Calico's
/// `projectcalico.org/namespace`), so global policies can select by namespace.
pub const NAMESPACE_LABEL: &str = "tern.dev/namespace";
/// Label naming the orchestrator (`k8s` for pods, `cni` otherwise).
pub const ORCHESTRATOR_LABEL: &str = "tern.dev/orchestrator";

/// The labels an endpoint is created with: the runtime's (`args.cni.labels`) plus the ones
/// derived from the Kubernetes CNI args.
pub fn workload_labels(
    a: &Attachment,
    cni_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut l = cni_labels.clone();
    let (ns, orch) = match &a.pod {
        Some(p) => (p.namespace.as_str(), "k8s"),
        None => ("default", "cni"),
    };
    l.insert(NAMESPACE_LABEL.into(), ns.into());
    l.insert(ORCHESTRATOR_LABEL.into(), orch.into());
    l
}

/// The addresses of a WorkloadEndpoint record. An entry that is not a CIDR (validation refuses
/// them at write, so only a record written around it) is left out with a warning naming the
/// endpoint and the value.
fn parse_ip_networks(w: &tern_model::WorkloadEndpoint) -> Vec<IpNet> {
    let nets = w.ip_networks();
    for b in &nets.bad {
        log::warn!("ignoring the entry: {b}");
    }
    nets.nets
}

/// The pod interface's MAC of a WorkloadEndpoint record: none when empty; a bad one (only a
/// record written around validation) is left out with a warning naming the endpoint and the
/// value.
fn parse_mac(w: &tern_model::WorkloadEndpoint) -> Option<MacAddr> {
    if w.spec.mac.is_empty() {
        return None;
    }
    w.spec
        .mac
        .parse()
        .map_err(|e| {
            log::warn!(
                "WorkloadEndpoint {}/{}: ignoring spec.mac: {e}",
                w.metadata.namespace.as_deref().unwrap_or_default(),
                w.metadata.name
            )
        })
        .ok()
}

/// What the agent knows of one pod interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub node: String,
    pub attachment: Attachment,
    pub host_ifname: String,
    /// The pod interface's MAC (absent until the ADD wired it, or when the record's was bad).
    pub mac: Option<MacAddr>,
    /// Pod addresses as CIDRs (10.244.0.5/32), parsed once where a record is read
    /// from the store.
    pub ip_networks: Vec<IpNet>,
    pub labels: BTreeMap<String, String>,
    /// Named container ports (`spec.ports`), which policies may reference by name.
    pub ports: Vec<EndpointPort>,
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

/// The node an endpoint resource name was made for (the first part of [`endpoint_name`],
/// whose parts have `-` doubled); `None` when the name is not of that form.
pub fn endpoint_name_node(name: &str) -> Option<String> {
    let mut node = String::new();
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '-' {
            node.push(c);
        } else if chars.peek() == Some(&'-') {
            chars.next();
            node.push('-');
        } else {
            return Some(node);
        }
    }
    None
}

/// File of the node-local endpoint store, in the state directory.
pub const LOCAL_STORE_FILE: &str = "endpoints.db";

/// The store holding this node's endpoint records: `main` itself, unless `main` derives its
/// endpoints from Pods; then `<state_dir>/endpoints.db`, into which the records a
/// `ternctl datastore migrate` left for this node ([`tern_store::keys::ENDPOINT_IMPORT`]) are
/// moved first (each written only where the local store has no record of that name, then
/// deleted from `main` at the revision read, so a crash in between only repeats the move).
pub fn open_store(
    main: &Arc<dyn Store>,
    state_dir: &Path,
    node: &str,
) -> Result<Arc<dyn Store>, StoreError> {
    if !main.derives_endpoints() {
        export_local(main, state_dir, node)?;
        return Ok(main.clone());
    }
    std::fs::create_dir_all(state_dir)
        .map_err(|e| StoreError::Unavailable(format!("creating {}: {e}", state_dir.display())))?;
    let local: Arc<dyn Store> = Arc::new(tern_store::sqlite::SqliteStore::open(
        state_dir.join(LOCAL_STORE_FILE),
    )?);
    let prefix = tern_store::keys::node_endpoint_imports(node);
    let (records, _) = main.range(&prefix)?;
    let mut moved = 0;
    for kv in records {
        let key = format!(
            "{}{}",
            tern_store::keys::resource_prefix("WorkloadEndpoint"),
            &kv.key[prefix.len()..]
        );
        let put = local.txn(tern_store::Txn {
            compare: vec![tern_store::Compare::CreateRevision(key.clone(), 0)],
            success: vec![tern_store::Op::put(key, kv.value.clone())],
            failure: vec![],
        })?;
        main.txn(tern_store::Txn {
            compare: vec![tern_store::Compare::ModRevision(
                kv.key.clone(),
                kv.mod_revision,
            )],
            success: vec![tern_store::Op::delete(kv.key.clone())],
            failure: vec![],
        })?;
        moved += usize::from(put.succeeded);
    }
    if moved > 0 {
        log::info!(
            "moved {moved} endpoint records of node {node} from the datastore into its local endpoint store"
        );
    }
    Ok(local)
}

/// After a move from a datastore that derives endpoints onto one that does not (`ternctl
/// datastore migrate` from Kubernetes to etcd): the node's records in its local endpoint
/// store are written into `main` (over whatever is there: the records are the node's own),
/// then the local file is removed. A crash in between only writes them again.
fn export_local(main: &Arc<dyn Store>, state_dir: &Path, node: &str) -> Result<(), StoreError> {
    let path = state_dir.join(LOCAL_STORE_FILE);
    if !path.exists() {
        return Ok(());
    }
    let local = tern_store::sqlite::SqliteStore::open(&path)?;
    let records = store_io::list(&local, node)?;
    for ep in &records {
        store_io::put(&**main, ep)?;
    }
    drop(local);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
    if !records.is_empty() {
        log::info!(
            "moved {} endpoint records of node {node} from its local endpoint store into the datastore",
            records.len()
        );
    }
    Ok(())
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
    cache: Mutex<Cache>,
}

/// The cache and what the agent itself wrote while a [`Endpoints::refresh`] was reading the
/// store: a refresh lists the store first and replaces the cache after, so an ADD's endpoint
/// written in between is not in the list, and dropping it would make the pod's veth look
/// like an orphan to the reconciler, which deletes it (a live pod cut off and its address
/// released: seen under the upstream e2e).
#[derive(Default)]
struct Cache {
    map: HashMap<AttachmentKey, Endpoint>,
    /// Incremented when a refresh starts.
    epoch: u64,
    /// Attachments written ([`Endpoints::put`]) or deleted ([`Endpoints::remove`]) by this
    /// agent, with the epoch of the write; a refresh that started at or before that epoch
    /// keeps the cache's entry (or its absence) for them.
    touched: HashMap<AttachmentKey, u64>,
}

impl Cache {
    fn touch(&mut self, k: AttachmentKey) {
        let e = self.epoch;
        self.touched.insert(k, e);
    }
}

impl Endpoints {
    /// Loads this node's endpoints from the store.
    pub fn load(store: Arc<dyn Store>, node: &str) -> Result<Endpoints, StoreError> {
        let eps = Endpoints {
            store,
            node: node.to_string(),
            cache: Mutex::new(Cache::default()),
        };
        eps.refresh()?;
        Ok(eps)
    }

    /// The store the records live in ([`open_store`]).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The node's endpoints as the store has them now (not the cache).
    pub fn list_stored(&self) -> Result<Vec<Endpoint>, StoreError> {
        store_io::list(&*self.store, &self.node)
    }

    /// Re-reads the node's endpoints from the store into the cache.
    /// Endpoints this agent wrote or deleted while the list was read keep their cached state
    /// (see [`Cache`]).
    pub fn refresh(&self) -> Result<(), StoreError> {
        let start = {
            let mut c = self.cache.lock().unwrap();
            c.epoch += 1;
            c.epoch
        };
        let list = crate::endpoints::store_io::list(&*self.store, &self.node)?;
        let mut c = self.cache.lock().unwrap();
        let mut map: HashMap<AttachmentKey, Endpoint> = list
            .into_iter()
            .map(|ep| (key_of(&ep.attachment), ep))
            .collect();
        let Cache {
            map: old, touched, ..
        } = &mut *c;
        touched.retain(|_, e| *e >= start);
        for k in touched.keys() {
            match old.get(k) {
                Some(ep) => map.insert(k.clone(), ep.clone()),
                None => map.remove(k),
            };
        }
        c.map = map;
        Ok(())
    }

    pub fn get(&self, a: &Attachment) -> Option<Endpoint> {
        self.cache.lock().unwrap().map.get(&key_of(a)).cloned()
    }

    pub fn all(&self) -> Vec<Endpoint> {
        self.cache.lock().unwrap().map.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.cache.lock().unwrap().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the endpoint to the store, then the cache. Labels and named ports that a stored
    /// document of the same attachment already has are kept (see [`store_io::put`]); the cache
    /// gets the endpoint as written.
    pub fn put(&self, ep: Endpoint) -> Result<(), StoreError> {
        let ep = store_io::put(&*self.store, &ep)?;
        let mut c = self.cache.lock().unwrap();
        let k = key_of(&ep.attachment);
        c.touch(k.clone());
        c.map.insert(k, ep);
        Ok(())
    }

    /// Deletes the endpoint from the store (idempotent), then the cache.
    pub fn remove(&self, a: &Attachment) -> Result<(), StoreError> {
        let ep = self.get(a).unwrap_or_else(|| Endpoint {
            node: self.node.clone(),
            attachment: a.clone(),
            host_ifname: String::new(),
            mac: None,
            ip_networks: vec![],
            labels: BTreeMap::new(),
            ports: Vec::new(),
            delegated_ipam: false,
        });
        if self.get(a).is_some() {
            store_io::delete(&*self.store, &ep)?;
        } else {
            // Not a cached endpoint (a stale sandbox's DEL, a repeated DEL): the document is
            // named by pod and interface, so it may be another sandbox's of the same pod.
            store_io::delete_if_attachment(&*self.store, &ep)?;
        }
        let mut c = self.cache.lock().unwrap();
        c.touch(key_of(a));
        c.map.remove(&key_of(a));
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
        if !pod.uid.is_empty() {
            annotations.insert(POD_UID_ANNOTATION.to_string(), pod.uid.clone());
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
                mac: ep.mac.map(|m| m.to_string()).unwrap_or_default(),
                ip_networks: ep.ip_networks.iter().map(|n| n.to_string()).collect(),
                network: ep.attachment.network.clone(),
                profiles: vec![],
                service_account_name: ep.labels.get(SERVICE_ACCOUNT_LABEL).cloned(),
                ports: ep.ports.clone(),
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
            uid: ann.get(POD_UID_ANNOTATION).cloned().unwrap_or_default(),
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
            mac: parse_mac(&w),
            ip_networks: super::parse_ip_networks(&w),
            labels: w.metadata.labels.clone(),
            ports: w.spec.ports.clone(),
            delegated_ipam: ann
                .get("tern.dev/delegated-ipam")
                .is_some_and(|v| v == "true"),
        }
    }

    pub(super) fn key(ep: &Endpoint) -> String {
        tern_store::keys::namespaced_resource("WorkloadEndpoint", &ep.namespace(), &ep.name())
    }

    /// Attempts of [`put`]: the blind first write, then up to 8 read-merge-writes.
    const PUT_ATTEMPTS: usize = 9;

    /// Whether two endpoints describe the same pod interface (not merely the same name: a pod
    /// re-created under the same name is a new sandbox with its own ports and labels).
    fn same_attachment(a: &Endpoint, b: &Endpoint) -> bool {
        a.node == b.node
            && a.attachment.network == b.attachment.network
            && a.attachment.container_id == b.attachment.container_id
            && a.attachment.ifname == b.attachment.ifname
    }

    /// Keeps what the stored document of the same attachment carries: its labels and named
    /// ports were set after the endpoint was first written (`ternctl label`, `ternctl port`, an
    /// orchestrator integration) and win over `ep`'s; entries only `ep` has are added.
    pub fn merge_stored(ep: &mut Endpoint, stored: &Endpoint) {
        if !same_attachment(ep, stored) {
            return;
        }
        for (k, v) in &stored.labels {
            ep.labels.insert(k.clone(), v.clone());
        }
        let mut ports = stored.ports.clone();
        for p in &ep.ports {
            if !ports.iter().any(|q| q.name == p.name) {
                ports.push(p.clone());
            }
        }
        ep.ports = ports;
    }

    /// Writes the endpoint's document and returns the endpoint as written. When the store
    /// already holds a document of the same attachment, its labels and ports are kept
    /// ([`merge_stored`]); the write is conditional on that document not changing meanwhile
    /// (retried), so a concurrent `ternctl label`/`port` is never lost.
    pub fn put(store: &dyn Store, ep: &Endpoint) -> Result<Endpoint, StoreError> {
        let key = key(ep);
        // The first attempt assumes the document is new (a pod ADD, the hot path): one write,
        // no read. Only when it exists is it read and merged.
        let mut out = ep.clone();
        let mut rev = 0;
        for attempt in 0..PUT_ATTEMPTS {
            if attempt > 0 {
                out = ep.clone();
                rev = match store.get(&key)? {
                    Some(kv) => {
                        match serde_json::from_slice::<WorkloadEndpoint>(&kv.value) {
                            Ok(w) => merge_stored(&mut out, &from_resource(w)),
                            Err(e) => log::warn!("replacing unreadable endpoint {key}: {e}"),
                        }
                        kv.mod_revision
                    }
                    None => 0,
                };
            }
            let body = serde_json::to_vec(&to_resource(&out))
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            let done = store.txn(tern_store::Txn {
                compare: vec![tern_store::Compare::ModRevision(key.clone(), rev)],
                success: vec![tern_store::Op::put(key.clone(), body)],
                failure: vec![],
            })?;
            if done.succeeded {
                return Ok(out);
            }
        }
        Err(StoreError::Backend(format!(
            "endpoint {key} kept changing while it was written ({PUT_ATTEMPTS} attempts)"
        )))
    }

    pub fn delete(store: &dyn Store, ep: &Endpoint) -> Result<(), StoreError> {
        store.delete(&key(ep))?;
        Ok(())
    }

    /// Deletes the stored document of `ep`'s name only when it records `ep`'s attachment
    /// (network, container ID, interface), or cannot be read: another sandbox of the same pod,
    /// which has the same document name, keeps its endpoint. Compared and deleted in one
    /// transaction (mod_revision), so a write in between is never deleted.
    pub fn delete_if_attachment(store: &dyn Store, ep: &Endpoint) -> Result<(), StoreError> {
        let key = key(ep);
        let Some(kv) = store.get(&key)? else {
            return Ok(());
        };
        if let Ok(w) = serde_json::from_slice::<WorkloadEndpoint>(&kv.value) {
            let stored = from_resource(w);
            if key_of(&stored.attachment) != key_of(&ep.attachment) {
                log::info!(
                    "not deleting endpoint {key}: it records container {}, not {}",
                    stored.attachment.container_id,
                    ep.attachment.container_id
                );
                return Ok(());
            }
        }
        store.txn(tern_store::Txn {
            compare: vec![tern_store::Compare::ModRevision(
                key.clone(),
                kv.mod_revision,
            )],
            success: vec![tern_store::Op::delete(key)],
            failure: vec![],
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::port;
    use tern_model::{Kind, Protocol, Resource};

    fn ep(container_id: &str, ports: Vec<EndpointPort>) -> Endpoint {
        Endpoint {
            node: "n1".into(),
            attachment: Attachment {
                network: "k8s-pod-network".into(),
                container_id: container_id.into(),
                ifname: "eth0".into(),
                netns_path: "/run/netns/x".into(),
                pod: Some(PodRef {
                    namespace: "prod".into(),
                    name: "web".into(),
                    infra_container_id: String::new(),
                    uid: String::new(),
                }),
            },
            host_ifname: "tern0123456789a".into(),
            mac: Some(MacAddr([0x0a, 0x58, 0, 0, 0, 1])),
            ip_networks: vec!["10.244.0.5/32".parse().unwrap()],
            labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
            ports,
            delegated_ipam: false,
        }
    }

    fn stored(store: &dyn Store) -> tern_model::WorkloadEndpoint {
        match tern_model::get_resource(
            store,
            Kind::WorkloadEndpoint,
            Some("prod"),
            "n1-k8s-web-eth0",
        )
        .unwrap()
        .expect("endpoint stored")
        {
            Resource::WorkloadEndpoint(w) => w,
            other => panic!("not a WorkloadEndpoint: {other:?}"),
        }
    }

    /// An ADD's endpoint written while a refresh reads the store (so the list misses it)
    /// survives the refresh; a later refresh converges on the store again.
    #[test]
    fn an_endpoint_written_during_a_refresh_is_kept() {
        use std::sync::OnceLock;
        use tern_store::testing::{Call, Hook, Hooked, Verdict};
        #[derive(Default)]
        struct PutDuringList {
            eps: OnceLock<Arc<Endpoints>>,
            inner: OnceLock<Arc<dyn Store>>,
            pending: Mutex<Option<Endpoint>>,
        }
        impl Hook for PutDuringList {
            fn before(&self, call: &Call<'_>) -> Verdict {
                if matches!(call, Call::Range(_))
                    && let Some(ep) = self.pending.lock().unwrap().take()
                {
                    // The ADD's put (store and cache), then the key taken out of the store
                    // underneath: the list about to run sees the store as it was before.
                    let key = store_io::key(&ep);
                    self.eps.get().unwrap().put(ep).unwrap();
                    let txn = tern_store::Txn {
                        compare: vec![],
                        success: vec![tern_store::Op::delete(key)],
                        failure: vec![],
                    };
                    self.inner.get().unwrap().txn(txn).unwrap();
                }
                Verdict::Forward
            }
        }
        let inner: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let hooked = Hooked::new(inner.clone(), PutDuringList::default());
        let store: Arc<dyn Store> = hooked.clone();
        let eps = Arc::new(Endpoints::load(store, "n1").unwrap());
        let _ = hooked.hook.eps.set(eps.clone());
        let _ = hooked.hook.inner.set(inner);
        let e = ep("c1", vec![]);
        *hooked.hook.pending.lock().unwrap() = Some(e.clone());
        eps.refresh().unwrap();
        assert_eq!(
            eps.get(&e.attachment),
            Some(e.clone()),
            "lost by the refresh"
        );
        // The next refresh reads a store without it and nothing wrote it since: gone.
        eps.refresh().unwrap();
        assert_eq!(eps.get(&e.attachment), None);
    }

    #[test]
    fn ports_are_written_to_spec_and_read_back() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let ports = vec![
            port("http", 8080, Protocol::Tcp),
            port("dns", 53, Protocol::Udp),
        ];
        let eps = Endpoints::load(store.clone(), "n1").unwrap();
        eps.put(ep("c1", ports.clone())).unwrap();
        assert_eq!(stored(&*store).spec.ports, ports);
        // A fresh agent (cache loaded from the store) sees the same ports.
        let again = Endpoints::load(store, "n1").unwrap();
        assert_eq!(again.all()[0].ports, ports);
        assert_eq!(again.all()[0], ep("c1", ports));
    }

    #[test]
    fn rewrite_keeps_labels_and_ports_the_store_has() {
        let store: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let eps = Endpoints::load(store.clone(), "n1").unwrap();
        eps.put(ep("c1", vec![port("http", 8080, Protocol::Tcp)]))
            .unwrap();
        // `ternctl port` / `ternctl label` change the stored document afterwards.
        let mut w = stored(&*store);
        w.spec.ports = vec![
            port("http", 9000, Protocol::Tcp),
            port("metrics", 9090, Protocol::Tcp),
        ];
        w.metadata.labels.insert("tier".into(), "front".into());
        w.metadata.labels.insert("app".into(), "web2".into());
        tern_model::put_resource(&*store, &Resource::WorkloadEndpoint(w)).unwrap();

        // The agent rewrites the same attachment's endpoint (e.g. an ADD retried after its
        // cache lost the endpoint): the store's values survive, the new ones are added.
        let mut again = ep("c1", vec![port("http", 8080, Protocol::Tcp)]);
        again.ports.push(port("grpc", 7000, Protocol::Tcp));
        let fresh = Endpoints::load(store.clone(), "n1").unwrap();
        fresh.put(again.clone()).unwrap();
        let w = stored(&*store);
        assert_eq!(
            w.spec.ports,
            vec![
                port("http", 9000, Protocol::Tcp),
                port("metrics", 9090, Protocol::Tcp),
                port("grpc", 7000, Protocol::Tcp),
            ]
        );
        assert_eq!(
            w.metadata.labels.get("tier").map(String::as_str),
            Some("front")
        );
        assert_eq!(
            w.metadata.labels.get("app").map(String::as_str),
            Some("web2")
        );
        // The cache holds what was written.
        assert_eq!(fresh.get(&again.attachment).unwrap().ports, w.spec.ports);

        // A new sandbox of the same pod name is a new pod: its own ports replace the old ones.
        fresh
            .put(ep("c2", vec![port("web", 80, Protocol::Tcp)]))
            .unwrap();
        let w = stored(&*store);
        assert_eq!(w.spec.container_id, "c2");
        assert_eq!(w.spec.ports, vec![port("web", 80, Protocol::Tcp)]);
        assert_eq!(w.metadata.labels.get("tier"), None);
    }

    /// Onto the Kubernetes datastore (endpoints derived) a migration's endpoint-import
    /// record of this node moves into the node-local store, and is gone from the datastore;
    /// back on a datastore that does not derive them, the local records are written into it
    /// and the local file is removed.
    #[test]
    fn endpoint_records_follow_the_datastore_kind() {
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let kube: Arc<dyn Store> = tern_store::testing::kube_like(inner.clone());
        let e = ep("c1", vec![]);
        let doc = store_io::put(&*inner, &e).unwrap();
        let key = store_io::key(&doc);
        let import = format!(
            "{}prod/{}",
            tern_store::keys::node_endpoint_imports("n1"),
            e.name()
        );
        let value = inner.get(&key).unwrap().unwrap().value;
        inner.delete(&key).unwrap();
        inner.put(&import, &value).unwrap();
        let local = open_store(&kube, dir.path(), "n1").unwrap();
        assert!(!Arc::ptr_eq(&local, &kube));
        assert_eq!(
            store_io::list(&*local, "n1").unwrap(),
            std::slice::from_ref(&e)
        );
        assert!(inner.get(&import).unwrap().is_none(), "import record moved");
        drop(local);
        // Started again on the same store: nothing to move, the record stays local.
        let local = open_store(&kube, dir.path(), "n1").unwrap();
        assert_eq!(
            store_io::list(&*local, "n1").unwrap(),
            std::slice::from_ref(&e)
        );
        drop(local);
        // On etcd or SQLite again (after a migration back).
        let plain: Arc<dyn Store> = Arc::new(tern_store::mem::MemStore::new());
        let same = open_store(&plain, dir.path(), "n1").unwrap();
        assert!(Arc::ptr_eq(&same, &plain));
        assert_eq!(store_io::list(&*plain, "n1").unwrap(), [e]);
        assert!(!dir.path().join(LOCAL_STORE_FILE).exists());
    }
}
