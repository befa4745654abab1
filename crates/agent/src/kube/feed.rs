//! The agent's copy of the Kubernetes datastore: kube-rs watchers that keep a
//! [`tern_store::cache::Cache`] current, so that every reader of the datastore in the agent
//! (dataplane, policy, BGP, IPAM, node GC) reads memory and the API server serves watches,
//! not lists.
//!
//! ```text
//!   kube-apiserver ──watch (kube-rs, bookmarks, relist with back-off)──► "store-feed" thread
//!     tern.dev CRDs (pools, nodes, blocks, affinities, owners, policies, staged policies,
//!     BGP, IPAM config, reservations; namespaces and Kubernetes policies in datastoreentries)
//!       ──► tern_store::kube::decode_object ──► Feed of the key's class ─┐
//!     every Pod (slim: EndpointPod)                                      ├──► Cache
//!       ──► tern_store::kube::derived_kv (the endpoint it stands for) ───┘      │
//!   CachedStore (range, watch, get of endpoints) ◄──────────────────────────────┘
//! ```
//!
//! One watcher per custom resource and one of the Pods, all on one current-thread runtime. A
//! watcher's (re)list is `Init` … `InitDone`: the class's copy is replaced only when the list
//! is complete ([`tern_store::cache::Feed::relist_end`]), so readers never see half a class.
//! Until a class is first listed, the [`tern_store::cache::CachedStore`] reads the API server
//! itself; `Agent::start` waits a bounded time for the first lists.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ::kube::api::{Api, ApiResource, DynamicObject};
use ::kube::runtime::{WatchStreamExt, watcher};
use futures::{FutureExt, StreamExt};
use tern_model::Kind;
use tern_store::cache::{Cache, ClassSpec, Feed};
use tern_store::keys;
use tern_store::kube::{self as kstore, Class};

use super::slim::EndpointPod;

/// Objects per page of a watcher's list.
const PAGE: u32 = 500;

/// The prefixes the agent reads from the copy, with whether `get` may be answered from it
/// (the endpoints derived from Pods, which nothing writes, and the IPAM configuration, which
/// the agent never writes: no compare-and-swap of the agent's starts from a stale copy).
pub fn cached_classes() -> Vec<ClassSpec> {
    let mut out: Vec<ClassSpec> = [
        Kind::IpPool,
        Kind::Node,
        Kind::IpReservation,
        Kind::NetworkPolicy,
        Kind::GlobalNetworkPolicy,
        Kind::K8sNetworkPolicy,
        Kind::StagedNetworkPolicy,
        Kind::StagedGlobalNetworkPolicy,
        Kind::StagedKubernetesNetworkPolicy,
        Kind::Namespace,
        Kind::BgpConfiguration,
        Kind::BgpPeer,
    ]
    .iter()
    .map(|k| ClassSpec::new(keys::resource_prefix(k.as_str())))
    .collect();
    out.push(ClassSpec {
        serve_gets: true,
        ..ClassSpec::new(keys::resource_prefix(Kind::WorkloadEndpoint.as_str()))
    });
    // The IPAM configuration too: IPAM reads it (its policy, the migration lock) at most
    // every second, and the agent never writes it.
    out.push(ClassSpec {
        serve_gets: true,
        ..ClassSpec::new(keys::IPAM_CONFIG)
    });
    for p in [keys::BLOCKS, keys::AFFINITIES, keys::OWNERS] {
        out.push(ClassSpec::new(p));
    }
    out
}

/// One watched resource: its class in the store, and the feeds of the cached prefixes whose
/// keys it holds (several for the catch-all class).
struct Source {
    class: &'static Class,
    feeds: Vec<Feed>,
}

impl Source {
    fn feed_of(&self, key: &str) -> Option<&Feed> {
        self.feeds.iter().find(|f| key.starts_with(&f.prefix()))
    }

    fn relist_begin(&self) {
        self.feeds.iter().for_each(Feed::relist_begin);
    }

    fn relist_end(&self) {
        self.feeds.iter().for_each(Feed::relist_end);
    }
}

/// The resources to watch for `cache`'s classes, each cached prefix under the custom
/// resource [`tern_store::kube::class_of`] puts its keys in.
fn sources(cache: &Arc<Cache>) -> Vec<Source> {
    let mut by_class: BTreeMap<&'static str, Source> = BTreeMap::new();
    for prefix in cache.prefixes() {
        let class = kstore::class_of(&prefix);
        let Some(feed) = cache.feed(&prefix) else {
            continue;
        };
        by_class
            .entry(class.plural)
            .or_insert_with(|| Source {
                class,
                feeds: Vec::new(),
            })
            .feeds
            .push(feed);
    }
    by_class.into_values().collect()
}

/// Starts the "store-feed" thread keeping `cache` current from the API server of
/// `kubeconfig` (`None`: kube-rs's inference: `$KUBECONFIG`, `~/.kube/config`, the pod's
/// service account).
pub fn spawn(cache: Arc<Cache>, kubeconfig: Option<PathBuf>) -> std::io::Result<()> {
    crate::runtime::spawn_current_thread("store-feed", "the datastore feed", move |_| {
        run(cache, kubeconfig)
    })
}

async fn run(cache: Arc<Cache>, kubeconfig: Option<PathBuf>) {
    let client = loop {
        match super::make_client(kubeconfig.as_deref()).await {
            Ok(c) => break c,
            Err(e) => {
                log::warn!("datastore feed: no client for the API server: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let mut tasks = Vec::new();
    for src in sources(&cache) {
        if src.class.shape == kstore::Shape::DerivedFromPods {
            tasks.push(watch_pods(client.clone(), src).boxed_local());
        } else {
            tasks.push(watch_class(client.clone(), src).boxed_local());
        }
    }
    futures::future::join_all(tasks).await;
}

/// Logs a watcher's error once per run of failures (kube-rs retries with back-off; a 410
/// relists).
struct Failures {
    resource: &'static str,
    failing: bool,
}

impl Failures {
    fn ok(&mut self) {
        if self.failing {
            log::info!("datastore feed: watch of {} is back", self.resource);
            self.failing = false;
        }
    }

    fn failed(&mut self, e: &watcher::Error) {
        if let watcher::Error::WatchError(s) = e
            && s.code == 410
        {
            log::info!(
                "datastore feed: {} watch expired (410): relisting",
                self.resource
            );
            return;
        }
        if !self.failing {
            log::warn!(
                "datastore feed: {}: {e}; retrying with back-off (reads of it come from the \
                 last copy)",
                self.resource
            );
            self.failing = true;
        }
    }
}

/// Keeps the feeds of one custom resource current.
async fn watch_class(client: ::kube::Client, src: Source) {
    let class = src.class;
    let ar = ApiResource {
        group: kstore::GROUP.into(),
        version: kstore::VERSION.into(),
        api_version: format!("{}/{}", kstore::GROUP, kstore::VERSION),
        kind: class.kind.into(),
        plural: class.plural.into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let stream = watcher(api, watcher::Config::default().page_size(PAGE)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut failures = Failures {
        resource: class.plural,
        failing: false,
    };
    let decode = |obj: &DynamicObject| {
        serde_json::to_value(obj)
            .map_err(|e| e.to_string())
            .and_then(|v| kstore::decode_object(class, &v).map_err(|e| e.to_string()))
            .inspect_err(|e| {
                log::warn!(
                    "datastore feed: {} {}: {e}",
                    class.kind,
                    obj.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .ok()
    };
    while let Some(item) = stream.next().await {
        let ev = match item {
            Ok(ev) => {
                failures.ok();
                ev
            }
            Err(e) => {
                failures.failed(&e);
                continue;
            }
        };
        match ev {
            watcher::Event::Init => src.relist_begin(),
            watcher::Event::InitApply(obj) => {
                if let Some(kv) = decode(&obj)
                    && let Some(f) = src.feed_of(&kv.key)
                {
                    f.relisted(kv);
                }
            }
            watcher::Event::InitDone => src.relist_end(),
            watcher::Event::Apply(obj) => {
                if let Some(kv) = decode(&obj)
                    && let Some(f) = src.feed_of(&kv.key)
                {
                    f.put(kv);
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some(kv) = decode(&obj)
                    && let Some(f) = src.feed_of(&kv.key)
                {
                    f.delete(&kv.key, kv.mod_revision);
                }
            }
        }
    }
}

/// Keeps the derived endpoints current from every Pod of the cluster.
async fn watch_pods(client: ::kube::Client, src: Source) {
    let Some(feed) = src.feeds.first() else {
        return;
    };
    let api: Api<EndpointPod> = Api::all(client);
    let stream = watcher(api, watcher::Config::default().page_size(PAGE)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut failures = Failures {
        resource: "pods",
        failing: false,
    };
    while let Some(item) = stream.next().await {
        let ev = match item {
            Ok(ev) => {
                failures.ok();
                ev
            }
            Err(e) => {
                failures.failed(&e);
                continue;
            }
        };
        match ev {
            watcher::Event::Init => feed.relist_begin(),
            watcher::Event::InitApply(p) => {
                if let Some(kv) = kstore::derived_kv(&p.into_pod()) {
                    feed.relisted(kv);
                }
            }
            watcher::Event::InitDone => feed.relist_end(),
            watcher::Event::Apply(p) => {
                let pod = p.into_pod();
                let rev = pod.metadata.resource_version.parse().unwrap_or(0);
                match kstore::derived_kv(&pod) {
                    Some(kv) => feed.put(kv),
                    // Not (or no longer) an endpoint: pending, finished, host network.
                    None => match tern_store::kube_pods::derive(&pod).key() {
                        Some(key) => feed.delete(key, rev),
                        None => feed.progress(rev),
                    },
                }
            }
            watcher::Event::Delete(p) => {
                let pod = p.into_pod();
                let rev = pod.metadata.resource_version.parse().unwrap_or(0);
                match tern_store::kube_pods::derive(&pod).key() {
                    Some(key) => feed.delete(key, rev),
                    None => feed.progress(rev),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Pod as the API server sends it (managed fields, statuses and all) becomes the
    /// endpoint the store derives from it; one without an address yet, none.
    #[test]
    fn a_watched_pod_becomes_its_endpoint() {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "u-1",
                "resourceVersion": "4711", "labels": {"app": "web"},
                "managedFields": [{"manager": "kubelet", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:podIP": {}}}}]},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "c", "image": "x",
                    "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": "10.1.0.5",
                "podIPs": [{"ip": "10.1.0.5"}],
                "containerStatuses": [{"name": "c", "ready": true}]}
        });
        let p: EndpointPod = serde_json::from_value(pod.clone()).unwrap();
        let kv = kstore::derived_kv(&p.into_pod()).unwrap();
        assert_eq!(
            kv.key,
            "/tern/v1/resources/workloadendpoint/prod/n1-k8s-web--1-eth0"
        );
        assert_eq!(kv.mod_revision, 4711);
        let doc: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
        assert_eq!(
            doc["spec"]["ipNetworks"],
            serde_json::json!(["10.1.0.5/32"])
        );
        assert_eq!(doc["metadata"]["labels"]["app"], "web");
        assert_eq!(doc["spec"]["ports"][0]["port"], 8080);
        let mut pending = pod;
        pending["status"] = serde_json::json!({"phase": "Pending"});
        let p: EndpointPod = serde_json::from_value(pending).unwrap();
        let pod = p.into_pod();
        assert!(kstore::derived_kv(&pod).is_none());
        assert_eq!(
            tern_store::kube_pods::derive(&pod).key(),
            Some("/tern/v1/resources/workloadendpoint/prod/n1-k8s-web--1-eth0")
        );
    }

    /// Every cached prefix lies in one custom resource of the store, the catch-all only for
    /// the kinds that have none of their own; the derived endpoints are the one class whose
    /// gets the copy answers.
    #[test]
    fn cached_prefixes_map_to_the_stores_classes() {
        let cache = Cache::new(cached_classes());
        let srcs = sources(&cache);
        let mut seen: Vec<(&str, usize)> = srcs
            .iter()
            .map(|s| (s.class.plural, s.feeds.len()))
            .collect();
        seen.sort();
        assert!(seen.contains(&("datastoreentries", 2)), "{seen:?}");
        assert!(seen.contains(&("workloadendpoints", 1)), "{seen:?}");
        assert!(seen.contains(&("ipamblocks", 1)), "{seen:?}");
        assert_eq!(
            srcs.iter().map(|s| s.feeds.len()).sum::<usize>(),
            cached_classes().len()
        );
        let gets: Vec<String> = cached_classes()
            .into_iter()
            .filter(|c| c.serve_gets)
            .map(|c| c.prefix)
            .collect();
        assert_eq!(
            gets,
            [
                keys::resource_prefix("WorkloadEndpoint"),
                keys::IPAM_CONFIG.to_string()
            ]
        );
    }
}
