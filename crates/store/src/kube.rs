//! tern's datastore on the Kubernetes API: every key is one custom resource of group
//! `tern.dev/v1`, so a cluster needs no etcd of tern's (Calico's "Kubernetes datastore").
//!
//! ## Keys and objects
//! Keys fall into [`CLASSES`], each one CustomResourceDefinition:
//! - **documents** (`/tern/v1/resources/<kind>/…`, and the IPAM configuration): the stored value
//!   is a `tern.dev/v1` document, and the custom resource *is* that document, so
//!   `kubectl apply -f pool.yaml` takes the same YAML as `ternctl apply` and
//!   `kubectl get ippools` shows what tern uses. The name (and namespace) come from the key.
//! - **records** (IPAM blocks, affinities, handles, the cluster ID, liveness, and any other
//!   key): the value's exact bytes in `value` (UTF-8) or `valueBase64`, the key in the
//!   annotation `tern.dev/key`, and a few fields derived from the value in `spec` for
//!   `kubectl get` columns (a block's CIDR, node, used and free addresses). The object's name
//!   is the key's tail made a DNS subdomain, with a hash of the key when that changed it.
//! - **WorkloadEndpoints derived from Pods** ([`crate::kube_pods`]): no custom resource; a
//!   `range`, `get` or `watch` under the WorkloadEndpoint prefix reads `/api/v1/pods` and
//!   gives each running pod with addresses the endpoint document ternd would have written;
//!   writes there are refused ([`Store::derives_endpoints`]). Each agent keeps its own
//!   node's records in a node-local store, so an ADD or a DEL is one API write (the block).
//!
//! ## What a transaction can be
//! The Kubernetes API has compare-and-swap on one object (`resourceVersion`, and the
//! preconditions of a delete) and no transaction across objects. [`KubeStore::txn`] therefore
//! takes transactions on **one key**: any compares on it (mod revision, absence, version,
//! value), puts or deletes of it, and a failure branch; each is one conditional request (a
//! create, a `PUT` with the `resourceVersion` read, a `DELETE` with preconditions), retried
//! from a fresh read when another writer got in between. A transaction over several keys is
//! refused with [`StoreError::Backend`] naming them; [`Store::multi_key_txn`] is `false`, and
//! callers that need several writes order them so that a crash between any two leaves a
//! consistent store. A transaction whose compares failed and that wrote nothing answers the
//! key's revision as read (0 when absent) rather than the store's: a lost compare-and-swap
//! (frequent when many pods of a node are added at once) costs no further request.
//!
//! Revisions are `resourceVersion`s, which the API server takes from its etcd's revision:
//! one counter over every resource of the cluster, so revisions of different kinds compare.
//! A key's `version` is the object's `metadata.generation`; its `create_revision` is carried
//! in an annotation from the first update on (the creating write's revision until then).
//!
//! ## Watches, leases
//! A watch of a prefix is one Kubernetes watch per class under it (with bookmarks, resumed
//! from the last revision seen when the server ends it); `410 Gone` is
//! [`StoreError::Compacted`]. Leases are objects of their own (`DatastoreLease`: TTL and the
//! last renewal, by the renewing client's clock); a key put with one carries its id as a label.
//! Nothing on the server deletes expired keys: readers treat a key whose lease expired as
//! absent and delete it (with its `resourceVersion` as precondition), and revoking a lease
//! deletes its keys.
//!
//! ## Why our own client and not kube-rs
//! The store is synchronous and linked into `ternctl` (which links no async runtime) and the
//! CNI path of `ternd`; what it needs is a dozen REST calls over the same bounded HTTP/1.1
//! client as the etcd backend ([`crate::http`]). The agent does not watch through
//! [`KubeStore::watch_prefixes`]: it reads this store through a [`crate::cache::CachedStore`]
//! kept current by kube-rs watchers (`tern_agent::kube::feed`, using [`decode_object`] and
//! [`derived_kv`] for what each object stands for); this store's own watch serves `ternctl`,
//! the tests and anything that opens the store without that copy.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::http::{self, Body, Conn, TlsPem};

mod exec;
use crate::{
    Compare, Event, EventKind, KeyValue, Op, Result, Store, StoreError, Txn, TxnResponse, Watch,
    check_txn_size, keys,
};
pub use exec::{AgentPod, ExecOutput};

/// The API group and version of tern's custom resources.
pub const GROUP: &str = "tern.dev";
pub const VERSION: &str = "v1";
const API_VERSION: &str = "tern.dev/v1";
/// Annotation holding a record's exact key.
pub const KEY_ANNOTATION: &str = "tern.dev/key";
/// Annotation carrying a key's create revision once it has been updated.
const CREATED_ANNOTATION: &str = "tern.dev/create-revision";
/// Label naming the lease a key is attached to (hex id).
pub const LEASE_LABEL: &str = "tern.dev/lease";

/// The largest answer read whole (a list page is at most [`LIST_PAGE`] objects of at most
/// 1.5 MiB each, in practice far less).
const MAX_ANSWER: usize = 64 * 1024 * 1024;
/// The largest line of a watch stream (one event: one object).
const MAX_WATCH_LINE: usize = 4 * 1024 * 1024;
/// Objects per page of a list.
const LIST_PAGE: usize = 500;
/// How often a single-key transaction re-reads and retries when another writer changed the
/// object between its read and its conditional write.
const TXN_ATTEMPTS: usize = 16;
/// How long a read (or a write that was certainly not applied) is retried on an unreachable
/// or overloaded API server.
const RETRY_BUDGET: Duration = Duration::from_secs(6);
/// How long a watch stream may be silent before it is resumed on a new connection (the API
/// server sends a bookmark about every minute).
const WATCH_SILENCE: Duration = Duration::from_secs(150);
/// How often a service-account token file is read again (kubelet rotates projected tokens).
const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// How a class's values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The value is a `tern.dev/v1` document, and the object is that document.
    Document,
    /// The value's bytes are kept exactly in the object.
    Record,
    /// Read-only documents derived from Pods ([`crate::kube_pods`]): no custom resource of
    /// tern's, nothing written.
    DerivedFromPods,
}

/// One class of keys: a key prefix (or, for a singleton, the one key) and the custom resource
/// its keys are stored as.
#[derive(Debug, Clone, Copy)]
pub struct Class {
    /// The keys' prefix, or the key itself when `singleton` is set.
    pub prefix: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub short_names: &'static [&'static str],
    pub shape: Shape,
    pub namespaced: bool,
    /// The object name of a one-key class.
    pub singleton: Option<&'static str>,
}

const fn doc(prefix: &'static str, kind: &'static str, plural: &'static str) -> Class {
    Class {
        prefix,
        kind,
        plural,
        short_names: &[],
        shape: Shape::Document,
        namespaced: false,
        singleton: None,
    }
}

const fn rec(prefix: &'static str, kind: &'static str, plural: &'static str) -> Class {
    Class {
        prefix,
        kind,
        plural,
        short_names: &[],
        shape: Shape::Record,
        namespaced: false,
        singleton: None,
    }
}

/// Every class, most specific first; the last one takes every other key.
pub const CLASSES: &[Class] = &[
    Class {
        short_names: &["tippool"],
        ..doc("/tern/v1/resources/ippool/", "IPPool", "ippools")
    },
    doc("/tern/v1/resources/node/", "Node", "nodes"),
    Class {
        namespaced: true,
        shape: Shape::DerivedFromPods,
        ..doc(
            "/tern/v1/resources/workloadendpoint/",
            "WorkloadEndpoint",
            "workloadendpoints",
        )
    },
    doc(
        "/tern/v1/resources/ipreservation/",
        "IPReservation",
        "ipreservations",
    ),
    Class {
        namespaced: true,
        ..doc(
            "/tern/v1/resources/networkpolicy/",
            "NetworkPolicy",
            "networkpolicies",
        )
    },
    Class {
        short_names: &["gnp"],
        ..doc(
            "/tern/v1/resources/globalnetworkpolicy/",
            "GlobalNetworkPolicy",
            "globalnetworkpolicies",
        )
    },
    // Staged policies: evaluated by every agent, never enforced.
    Class {
        namespaced: true,
        ..doc(
            "/tern/v1/resources/stagednetworkpolicy/",
            "StagedNetworkPolicy",
            "stagednetworkpolicies",
        )
    },
    doc(
        "/tern/v1/resources/stagedglobalnetworkpolicy/",
        "StagedGlobalNetworkPolicy",
        "stagedglobalnetworkpolicies",
    ),
    Class {
        namespaced: true,
        ..doc(
            "/tern/v1/resources/stagedkubernetesnetworkpolicy/",
            "StagedKubernetesNetworkPolicy",
            "stagedkubernetesnetworkpolicies",
        )
    },
    doc(
        "/tern/v1/resources/bgpconfiguration/",
        "BGPConfiguration",
        "bgpconfigurations",
    ),
    doc("/tern/v1/resources/bgppeer/", "BGPPeer", "bgppeers"),
    Class {
        singleton: Some("default"),
        ..doc(keys::IPAM_CONFIG, "IPAMConfig", "ipamconfigs")
    },
    rec(keys::BLOCKS, "IPAMBlock", "ipamblocks"),
    rec(keys::AFFINITIES, "BlockAffinity", "blockaffinities"),
    rec(keys::HANDLES, "IPAMHandle", "ipamhandles"),
    rec(keys::OWNERS, "IPAMOwner", "ipamowners"),
    Class {
        singleton: Some("default"),
        ..rec(
            keys::CLUSTER_ID,
            "ClusterInformation",
            "clusterinformations",
        )
    },
    rec(keys::NODE_LIVENESS, "NodeLiveness", "nodelivenesses"),
    rec("", "DatastoreEntry", "datastoreentries"),
];

/// The classes with a key under any of `prefixes`: the streams a watch of them opens.
fn classes_under<'a>(prefixes: &'a [&'a str]) -> impl Iterator<Item = &'static Class> + 'a {
    CLASSES
        .iter()
        .filter(|c| prefixes.iter().any(|p| c.overlaps(p)))
}

/// The objects of the store's leases.
pub const LEASES: Class = rec("", "DatastoreLease", "datastoreleases");

impl Class {
    fn is_catch_all(&self) -> bool {
        self.prefix.is_empty()
    }

    /// True when `key` belongs to this class (the catch-all is tested last).
    fn holds(&self, key: &str) -> bool {
        match self.singleton {
            Some(_) => key == self.prefix,
            None => key.starts_with(self.prefix),
        }
    }

    /// True when a key under `prefix` can belong to this class.
    fn overlaps(&self, prefix: &str) -> bool {
        if self.is_catch_all() {
            // Every key under `prefix` belongs to one specific class when `prefix` lies
            // inside that class's prefix.
            return !CLASSES.iter().any(|c| {
                !c.is_catch_all() && c.singleton.is_none() && prefix.starts_with(c.prefix)
            });
        }
        self.prefix.starts_with(prefix)
            || (self.singleton.is_none() && prefix.starts_with(self.prefix))
    }

    fn collection(&self, namespace: Option<&str>) -> String {
        if self.shape == Shape::DerivedFromPods {
            return match namespace {
                Some(ns) => format!("/api/v1/namespaces/{ns}/pods"),
                None => "/api/v1/pods".to_string(),
            };
        }
        match namespace {
            Some(ns) => format!("/apis/{API_VERSION}/namespaces/{ns}/{}", self.plural),
            None => format!("/apis/{API_VERSION}/{}", self.plural),
        }
    }

    /// Where the object of `key` lives: namespace (for namespaced classes) and name.
    fn locate(&self, key: &str) -> Result<(Option<String>, String)> {
        if let Some(name) = self.singleton {
            return Ok((None, name.to_string()));
        }
        let tail = &key[self.prefix.len()..];
        if self.shape != Shape::Record {
            let (ns, name) = if self.namespaced {
                match tail.split_once('/') {
                    Some((ns, name)) => (Some(ns.to_string()), name),
                    None => {
                        return Err(StoreError::Backend(format!(
                            "key {key:?}: a namespaced {} key is <prefix><namespace>/<name>",
                            self.kind
                        )));
                    }
                }
            } else {
                (None, tail)
            };
            if !is_dns_subdomain(name) || ns.as_deref().is_some_and(|n| !is_dns_subdomain(n)) {
                return Err(StoreError::Backend(format!(
                    "key {key:?}: {} names must be DNS subdomains (lowercase letters, digits, \
                     '-' and '.') to be stored in Kubernetes",
                    self.kind
                )));
            }
            return Ok((ns, name.to_string()));
        }
        let tail = if self.is_catch_all() {
            key.trim_start_matches('/')
        } else {
            tail
        };
        Ok((None, object_name(tail, key)))
    }

    fn object_path(&self, ns: Option<&str>, name: &str) -> String {
        format!("{}/{name}", self.collection(ns))
    }
}

/// The class `key` is stored in.
pub fn class_of(key: &str) -> &'static Class {
    CLASSES
        .iter()
        .find(|c| !c.is_catch_all() && c.holds(key))
        .unwrap_or(&CLASSES[CLASSES.len() - 1])
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A DNS-subdomain object name for a record whose key ends in `tail`: the tail with `/` as
/// `.` and anything else outside `[a-z0-9.-]` as `-`; when that changed it, or it is too long,
/// a hash of the whole key is appended, so two keys never share an object.
fn object_name(tail: &str, key: &str) -> String {
    let mut name: String = tail
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            '/' => '.',
            _ => '-',
        })
        .collect();
    // Labels must not be empty nor start or end with '-'.
    let tidy: Vec<String> = name
        .split('.')
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_matches('-').to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let tidy = tidy.join(".");
    if tidy != tail || tidy.len() > 200 || tidy.is_empty() {
        let mut cut = tidy.len().min(200);
        while !tidy.is_char_boundary(cut) {
            cut -= 1;
        }
        let base = tidy[..cut].trim_end_matches(['-', '.']).to_string();
        name = if base.is_empty() {
            format!("k-{:016x}", fnv(key))
        } else {
            format!("{base}-{:016x}", fnv(key))
        };
    } else {
        name = tidy;
    }
    name
}

fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// How tern authenticates to the API server.
enum Auth {
    /// Client certificate (in the TLS configuration) or nothing.
    None,
    Token(String),
    /// A token file, read again every [`TOKEN_REREAD`] (projected service-account tokens).
    TokenFile {
        path: PathBuf,
        cached: Mutex<Option<(String, Instant)>>,
    },
}

/// Where the API server is and how to talk to it.
pub struct KubeConfig {
    host: String,
    port: u16,
    /// Path prefix of the server URL (`https://host/prefix`), usually empty.
    base: String,
    tls: Arc<rustls::ClientConfig>,
    auth: Auth,
    /// Where this configuration came from, for messages.
    pub source: String,
}

impl std::fmt::Debug for KubeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KubeConfig(https://{}:{}{} from {})",
            self.host, self.port, self.base, self.source
        )
    }
}

/// The largest kubeconfig read.
const MAX_KUBECONFIG: u64 = 1024 * 1024;

fn config_err(source: &str, msg: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("{source}: {msg}"))
}

impl KubeConfig {
    /// The configuration ternd and ternctl use when told `--store kubernetes`: the kubeconfig
    /// file given, else `$KUBECONFIG` (its first path), else the pod's service account
    /// (in-cluster), else `~/.kube/config`.
    pub fn discover(kubeconfig: Option<&Path>) -> Result<KubeConfig> {
        if let Some(p) = kubeconfig {
            return KubeConfig::from_kubeconfig(p);
        }
        if let Some(v) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
            let first = std::env::split_paths(&v).next().unwrap_or_default();
            return KubeConfig::from_kubeconfig(&first);
        }
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            return KubeConfig::in_cluster();
        }
        match std::env::var_os("HOME") {
            Some(home) => KubeConfig::from_kubeconfig(&Path::new(&home).join(".kube/config")),
            None => Err(StoreError::Config(
                "no Kubernetes credentials: pass --kubeconfig, set KUBECONFIG, or run in a pod \
                 with a service account"
                    .into(),
            )),
        }
    }

    /// In-cluster credentials: `KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's token
    /// and CA under `/var/run/secrets/kubernetes.io/serviceaccount`.
    pub fn in_cluster() -> Result<KubeConfig> {
        let dir = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
        let src = "in-cluster service account";
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| config_err(src, "KUBERNETES_SERVICE_HOST is not set"))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let port: u16 = port.parse().map_err(|_| {
            config_err(
                src,
                format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"),
            )
        })?;
        let ca = http::read_pem("service account CA", &dir.join("ca.crt"))
            .map_err(|e| config_err(src, e))?;
        let tls = http::tls_config("API server", &TlsPem { ca, client: None })
            .map_err(|e| config_err(src, e))?;
        let auth = Auth::TokenFile {
            path: dir.join("token"),
            cached: Mutex::new(None),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let cfg = KubeConfig {
            host,
            port,
            base: String::new(),
            tls,
            auth,
            source: src.into(),
        };
        cfg.token()?;
        Ok(cfg)
    }

    /// A kubeconfig file's current context: its cluster's server and CA (file or data), its
    /// user's client certificate and key (file or data), token or token file. Exec and
    /// auth-provider plugins are refused: tern runs no helper programs for credentials.
    pub fn from_kubeconfig(path: &Path) -> Result<KubeConfig> {
        let src = format!("kubeconfig {}", path.display());
        let text = read_bounded(path, MAX_KUBECONFIG).map_err(|e| config_err(&src, e))?;
        let v: Value = serde_norway::from_str(&text).map_err(|e| config_err(&src, e))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let current = v["current-context"].as_str().unwrap_or_default();
        let named = |list: &str, name: &str, field: &str| -> Result<Value> {
            v[list]
                .as_array()
                .and_then(|a| a.iter().find(|e| e["name"].as_str() == Some(name)))
                .map(|e| e[field].clone())
                .ok_or_else(|| config_err(&src, format!("{list}: no entry named {name:?}")))
        };
        let ctx = if current.is_empty() {
            // A single context is used without current-context (kubectl does the same).
            match v["contexts"].as_array().map(Vec::as_slice) {
                Some([one]) => one["context"].clone(),
                _ => return Err(config_err(&src, "current-context is not set")),
            }
        } else {
            named("contexts", current, "context")?
        };
        let cluster_name = ctx["cluster"].as_str().unwrap_or_default();
        let cluster = named("clusters", cluster_name, "cluster")?;
        let user = match ctx["user"].as_str() {
            Some(u) if !u.is_empty() => named("users", u, "user")?,
            _ => Value::Null,
        };
        let server = cluster["server"]
            .as_str()
            .ok_or_else(|| config_err(&src, format!("cluster {cluster_name:?}: no server")))?;
        let (host, port, base) = parse_server(server).map_err(|e| config_err(&src, e))?;
        let file_or_data = |obj: &Value, file: &str, data: &str| -> Result<Option<Vec<u8>>> {
            if let Some(d) = obj[data].as_str() {
                return B64
                    .decode(d.trim())
                    .map(Some)
                    .map_err(|e| config_err(&src, format!("{data}: {e}")));
            }
            match obj[file].as_str() {
                Some(f) => http::read_pem(file, &dir.join(f))
                    .map(Some)
                    .map_err(|e| config_err(&src, e)),
                None => Ok(None),
            }
        };
        if cluster["insecure-skip-tls-verify"].as_bool() == Some(true) {
            return Err(config_err(
                &src,
                "insecure-skip-tls-verify is not supported: give the cluster's certificate-authority",
            ));
        }
        let ca = file_or_data(
            &cluster,
            "certificate-authority",
            "certificate-authority-data",
        )?
        .ok_or_else(|| {
            config_err(
                &src,
                format!("cluster {cluster_name:?}: no certificate-authority(-data)"),
            )
        })?;
        for plugin in ["exec", "auth-provider"] {
            if !user[plugin].is_null() {
                return Err(config_err(
                    &src,
                    format!(
                        "user of context {current:?} authenticates with an {plugin} plugin, which \
                         tern does not run; give it a client certificate or a token"
                    ),
                ));
            }
        }
        let cert = file_or_data(&user, "client-certificate", "client-certificate-data")?;
        let key = file_or_data(&user, "client-key", "client-key-data")?;
        let client = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(config_err(
                    &src,
                    "a client certificate needs its key (client-key) and the other way round",
                ));
            }
        };
        let auth = if let Some(t) = user["token"].as_str() {
            Auth::Token(t.trim().to_string())
        } else if let Some(f) = user["tokenFile"].as_str() {
            Auth::TokenFile {
                path: dir.join(f),
                cached: Mutex::new(None),
            }
        } else {
            Auth::None
        };
        let tls = http::tls_config("API server", &TlsPem { ca, client })
            .map_err(|e| config_err(&src, e))?;
        Ok(KubeConfig {
            host,
            port,
            base,
            tls,
            auth,
            source: src,
        })
    }

    fn token(&self) -> Result<Option<String>> {
        match &self.auth {
            Auth::None => Ok(None),
            Auth::Token(t) => Ok(Some(t.clone())),
            Auth::TokenFile { path, cached } => {
                let mut c = cached.lock().unwrap();
                if let Some((t, at)) = &*c
                    && at.elapsed() < TOKEN_REREAD
                {
                    return Ok(Some(t.clone()));
                }
                let t = read_bounded(path, 64 * 1024)
                    .map_err(|e| config_err(&self.source, format!("token file: {e}")))?
                    .trim()
                    .to_string();
                *c = Some((t.clone(), Instant::now()));
                Ok(Some(t))
            }
        }
    }
}

fn read_bounded(path: &Path, limit: u64) -> std::result::Result<String, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut s = String::new();
    f.take(limit + 1)
        .read_to_string(&mut s)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if s.len() as u64 > limit {
        return Err(format!("{}: over {limit} bytes", path.display()));
    }
    Ok(s)
}

/// `https://host[:port][/path]` → host, port, path prefix.
fn parse_server(server: &str) -> std::result::Result<(String, u16, String), String> {
    let rest = server
        .strip_prefix("https://")
        .ok_or_else(|| format!("server {server:?}: only https:// API servers are supported"))?;
    let (hostport, base) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
        None => (rest, String::new()),
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h
            .split_once(']')
            .ok_or_else(|| format!("server {server:?}: unclosed '['"))?;
        (h.to_string(), p.strip_prefix(':').unwrap_or("443"))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (hostport.to_string(), "443"),
        }
    };
    let port = port
        .parse()
        .map_err(|_| format!("server {server:?}: bad port {port:?}"))?;
    Ok((host, port, base))
}

/// One API call's answer.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    /// An answer from its status and body bytes (a body that is not JSON becomes a message).
    fn parse(status: u16, raw: &[u8]) -> Answer {
        let body: Value = if raw.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(raw).unwrap_or_else(
                |_| json!({"message": String::from_utf8_lossy(&raw[..raw.len().min(300)])}),
            )
        };
        Answer { status, body }
    }

    fn message(&self) -> String {
        self.body["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:.300}", self.body.to_string()))
    }

    fn reason(&self) -> &str {
        self.body["reason"].as_str().unwrap_or_default()
    }
}

/// Whether a request may be sent again when its answer was lost.
#[derive(Clone, Copy, PartialEq)]
enum Idempotent {
    Yes,
    No,
}

/// The store. Cheap to clone (one shared client).
#[derive(Clone)]
pub struct KubeStore {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: KubeConfig,
    pool: Mutex<Vec<Conn>>,
    connect_timeout: Duration,
    io_timeout: Duration,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KubeStore({:?})", self.inner.cfg)
    }
}

impl KubeStore {
    /// The store of a `kubernetes` URL (the API server of [`KubeConfig::discover`]) or a
    /// `kubernetes:///path/to/kubeconfig` one, as [`crate::open`] opens it; `None` for any
    /// other URL.
    pub fn open_url(url: &str) -> Option<Result<KubeStore>> {
        let cfg = if url == "kubernetes" || url == "kubernetes://" {
            KubeConfig::discover(None)
        } else {
            KubeConfig::from_kubeconfig(Path::new(url.strip_prefix("kubernetes://")?))
        };
        Some(cfg.and_then(KubeStore::connect))
    }

    /// A store on the API server of `cfg`; checks that it answers and that tern's
    /// CustomResourceDefinitions are installed.
    pub fn connect(cfg: KubeConfig) -> Result<KubeStore> {
        let s = KubeStore {
            inner: Arc::new(Inner {
                cfg,
                pool: Mutex::new(Vec::new()),
                connect_timeout: Duration::from_secs(2),
                io_timeout: Duration::from_secs(10),
            }),
        };
        s.revision()?;
        Ok(s)
    }

    fn conn(&self) -> io::Result<(Conn, bool)> {
        loop {
            let Some(c) = self.inner.pool.lock().unwrap().pop() else {
                break;
            };
            // An idle connection has nothing to read: EOF (the server closed it) or any byte
            // (a TLS close_notify) means it is not to be reused, so a request is never sent
            // on a connection already going away.
            if c.reader.buffer().is_empty() && idle_and_open(c.reader.get_ref().tcp()) {
                return Ok((c, true));
            }
        }
        let cfg = &self.inner.cfg;
        http::connect(
            &cfg.host,
            cfg.port,
            Some(&cfg.tls),
            self.inner.connect_timeout,
            self.inner.io_timeout,
            0,
        )
        .map(|c| (c, false))
    }

    fn request_bytes(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
    ) -> Result<Vec<u8>> {
        let cfg = &self.inner.cfg;
        let mut head = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}:{}\r\nAccept: application/json\r\nUser-Agent: tern-store\r\n",
            cfg.base, cfg.host, cfg.port
        );
        if let Some(t) = cfg.token()? {
            let _ = write!(head, "Authorization: Bearer {t}\r\n");
        }
        let mut out = match body {
            Some((ctype, b)) => {
                let _ = write!(
                    head,
                    "Content-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
                    b.len()
                );
                let mut v = head.into_bytes();
                v.extend_from_slice(b);
                v
            }
            None => {
                head.push_str("\r\n");
                head.into_bytes()
            }
        };
        out.shrink_to_fit();
        Ok(out)
    }

    /// A write (`POST`, `PUT`, `DELETE`) with a JSON body, retried as [`Self::call`] retries
    /// a call that is not idempotent.
    fn write_json(&self, method: &str, path: &str, body: &Value) -> Result<Answer> {
        self.call(method, path, Some(body), "application/json", Idempotent::No)
    }

    /// One API call, retried within [`RETRY_BUDGET`] while the server cannot be reached or
    /// answers 429/503 (for a non-idempotent call, only when it was certainly not applied).
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        ctype: &str,
        idem: Idempotent,
    ) -> Result<Answer> {
        let (status, raw) = self.call_raw(method, path, body, ctype, idem)?;
        Ok(Answer::parse(status, &raw))
    }

    /// [`Self::call`], the answer's body as it came (a caller that decodes it into a type of
    /// its own, such as a page of Pods, never holds it as a JSON value).
    fn call_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        ctype: &str,
        idem: Idempotent,
    ) -> Result<(u16, Vec<u8>)> {
        let payload = body.map(|b| b.to_string().into_bytes());
        let request = self.request_bytes(method, path, payload.as_deref().map(|b| (ctype, b)))?;
        let deadline = Instant::now() + RETRY_BUDGET;
        let mut pause = Duration::from_millis(50);
        let mut last;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let attempt = self
                .conn()
                .map_err(|e| (false, false, e))
                .and_then(|(mut c, pooled)| {
                    match http::exchange(&mut c, &request, MAX_ANSWER) {
                        Ok(r) => {
                            if r.keep_alive {
                                self.inner.pool.lock().unwrap().push(c);
                            }
                            Ok(r)
                        }
                        // A pooled connection the server closed while idle fails before any answer
                        // with EOF or a reset. A read may be sent again; a write only when it
                        // was not all sent (else the server may have taken it: ambiguous).
                        Err(e)
                            if pooled
                                && !e.answered
                                && is_stale(&e.error)
                                && (idem == Idempotent::Yes || !e.sent) =>
                        {
                            Err((false, true, e.error))
                        }
                        Err(e) => Err((e.sent, false, e.error)),
                    }
                });
            match attempt {
                Ok(r) => {
                    let status = r.status;
                    if matches!(status, 429 | 503) && Instant::now() < deadline {
                        last = format!(
                            "HTTP {status}: {}",
                            Answer::parse(status, &r.body).message()
                        );
                    } else {
                        return Ok((status, r.body));
                    }
                }
                Err((sent, stale, e)) => {
                    last = e.to_string();
                    if stale {
                        continue;
                    }
                    if sent && idem == Idempotent::No {
                        return Err(StoreError::Ambiguous(format!(
                            "Kubernetes API {method} {path}: sent, no answer: {e}"
                        )));
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unavailable(format!(
                    "Kubernetes API server {}:{} did not answer {method} {path} within {}s ({attempts} attempts): {last}",
                    self.inner.cfg.host,
                    self.inner.cfg.port,
                    RETRY_BUDGET.as_secs()
                )));
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// The error for an answer no caller expects.
    fn unexpected(&self, what: &str, a: &Answer, class: &Class) -> StoreError {
        match a.status {
            401 => StoreError::Config(format!(
                "{}: the API server refused tern's credentials (401) for {what}",
                self.inner.cfg.source
            )),
            403 => StoreError::Forbidden(format!("{what}: forbidden: {}", a.message())),
            404 => StoreError::Config(format!(
                "{what}: the API server does not know {}.{GROUP}: install tern's \
                 CustomResourceDefinitions (`ternctl install crds | kubectl apply -f -`, or \
                 manifests/tern.yaml)",
                class.plural
            )),
            413 => StoreError::TooLarge(format!("{what}: {}", a.message())),
            500 | 504 => {
                StoreError::Ambiguous(format!("{what}: HTTP {}: {}", a.status, a.message()))
            }
            429 | 502 | 503 => {
                StoreError::Unavailable(format!("{what}: HTTP {}: {}", a.status, a.message()))
            }
            _ => StoreError::Backend(format!(
                "{what}: HTTP {} {}: {}",
                a.status,
                a.reason(),
                a.message()
            )),
        }
    }

    /// Reads the object of `key`; `None` when absent. 404 on an object means absent; the
    /// class missing altogether is an error naming the CRD.
    fn get_object(&self, class: &Class, ns: Option<&str>, name: &str) -> Result<Option<Value>> {
        let path = class.object_path(ns, name);
        let a = self.call("GET", &path, None, "", Idempotent::Yes)?;
        match a.status {
            200 => Ok(Some(a.body)),
            404 if a.body["details"]["name"].is_string() => Ok(None),
            _ => Err(self.unexpected(&format!("GET {path}"), &a, class)),
        }
    }

    /// Lists a class (every page), optionally with a label selector: objects and the list's
    /// resource version.
    fn list(&self, class: &Class, selector: Option<&str>) -> Result<(Vec<Value>, i64)> {
        self.list_in(class, None, selector)
    }

    /// [`KubeStore::list`] of one namespace (`None`: every namespace).
    fn list_in(
        &self,
        class: &Class,
        namespace: Option<&str>,
        selector: Option<&str>,
    ) -> Result<(Vec<Value>, i64)> {
        self.list_at(&class.collection(namespace), selector, |what, a| {
            self.unexpected(what, a, class)
        })
    }

    /// Every object of one of Kubernetes' own collections, as the API server serves them
    /// (`/api/v1/namespaces`, `/apis/networking.k8s.io/v1/networkpolicies`): what the agent
    /// watches beside this store on the Kubernetes datastore, for a reader without those
    /// watches (`ternctl explain`). Page by page, each page bounded as every answer is.
    pub fn list_builtin(&self, collection: &str) -> Result<Vec<Value>> {
        let (items, _) = self.list_at(collection, None, |what, a| match a.status {
            404 => StoreError::Config(format!(
                "{what}: the API server does not serve {collection}"
            )),
            _ => self.unexpected(what, a, class_of("")),
        })?;
        Ok(items)
    }

    /// Lists the collection at `collection` (every page), optionally with a label selector;
    /// an answer other than a page or an expired continue token is `unexpected`'s error.
    fn list_at(
        &self,
        collection: &str,
        selector: Option<&str>,
        unexpected: impl Fn(&str, &Answer) -> StoreError,
    ) -> Result<(Vec<Value>, i64)> {
        let mut out = Vec::new();
        let mut cont = String::new();
        let mut rev = None;
        loop {
            let mut path = format!("{collection}?limit={LIST_PAGE}");
            if let Some(s) = selector {
                let _ = write!(path, "&labelSelector={}", url_escape(s));
            }
            if !cont.is_empty() {
                let _ = write!(path, "&continue={}", url_escape(&cont));
            }
            let a = self.call("GET", &path, None, "", Idempotent::Yes)?;
            if a.status == 410 {
                // The continue token expired: start over.
                out.clear();
                cont.clear();
                rev = None;
                continue;
            }
            if a.status != 200 {
                return Err(unexpected(&format!("GET {path}"), &a));
            }
            if rev.is_none() {
                rev = Some(parse_rv(&a.body["metadata"]["resourceVersion"])?);
            }
            if let Some(items) = a.body["items"].as_array() {
                out.extend(items.iter().cloned());
            }
            cont = a.body["metadata"]["continue"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if cont.is_empty() {
                return Ok((out, rev.unwrap_or(0)));
            }
        }
    }

    /// A lease's state: `Some(expired)`, or `None` when there is no such lease.
    fn lease_state(&self, id: i64) -> Result<Option<(bool, Value)>> {
        let obj = self.get_object(&LEASES, None, &lease_name(id))?;
        Ok(obj.map(|o| (lease_expired(&o), o)))
    }

    /// Drops from `kvs` the keys whose lease expired or is gone, deleting them (and the
    /// expired leases) with their resource versions as preconditions.
    fn prune_expired(
        &self,
        kvs: Vec<(KeyValue, &'static Class, Option<String>, String)>,
    ) -> Result<Vec<KeyValue>> {
        let mut states: BTreeMap<i64, bool> = BTreeMap::new();
        let mut out = Vec::with_capacity(kvs.len());
        for (kv, class, ns, name) in kvs {
            if kv.lease != 0 {
                let dead = match states.get(&kv.lease) {
                    Some(d) => *d,
                    None => {
                        let d = match self.lease_state(kv.lease)? {
                            None => true,
                            Some((true, o)) => {
                                let rv = parse_rv(&o["metadata"]["resourceVersion"]).unwrap_or(0);
                                let _ = self.delete_object(
                                    &LEASES,
                                    None,
                                    &lease_name(kv.lease),
                                    Some(rv),
                                );
                                true
                            }
                            Some((false, _)) => false,
                        };
                        states.insert(kv.lease, d);
                        d
                    }
                };
                if dead {
                    let _ = self.delete_object(class, ns.as_deref(), &name, Some(kv.mod_revision));
                    continue;
                }
            }
            out.push(kv);
        }
        Ok(out)
    }

    /// Deletes an object, with a resource-version precondition when given. `Ok(Some(rev))`:
    /// deleted at `rev`; `Ok(None)`: absent or the precondition failed.
    fn delete_object(
        &self,
        class: &Class,
        ns: Option<&str>,
        name: &str,
        rv: Option<i64>,
    ) -> Result<Option<i64>> {
        let path = class.object_path(ns, name);
        let body = match rv {
            Some(rv) => json!({"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"resourceVersion": rv.to_string()}}),
            None => json!({"kind": "DeleteOptions", "apiVersion": "v1"}),
        };
        let a = self.write_json("DELETE", &path, &body)?;
        match a.status {
            200 | 202 => {
                // The answer is the object as deleted, with the deletion's revision.
                let rev = parse_rv(&a.body["metadata"]["resourceVersion"])
                    .or_else(|_| self.revision())?;
                Ok(Some(rev))
            }
            404 if a.body["details"]["name"].is_string() => Ok(None),
            409 => Ok(None),
            _ => Err(self.unexpected(&format!("DELETE {path}"), &a, class)),
        }
    }

    /// Writes `value` at `key` as a create (`current` `None`) or an update of `current`, with
    /// its resource version as precondition. `Ok(None)`: another writer got in first.
    fn write(
        &self,
        key: &str,
        value: &[u8],
        lease: i64,
        current: Option<&Value>,
    ) -> Result<Option<i64>> {
        let class = class_of(key);
        let (ns, name) = class.locate(key)?;
        let mut obj = encode(class, key, value, ns.as_deref(), &name)?;
        if lease != 0 {
            obj["metadata"]["labels"][LEASE_LABEL] = json!(lease_name(lease));
        }
        let (method, path) = match current {
            None => ("POST", class.collection(ns.as_deref())),
            Some(cur) => {
                let rv = cur["metadata"]["resourceVersion"].clone();
                obj["metadata"]["resourceVersion"] = rv.clone();
                // The create revision, carried from the first update on.
                let created = cur["metadata"]["annotations"][CREATED_ANNOTATION]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| {
                        (cur["metadata"]["generation"].as_i64() == Some(1))
                            .then(|| rv.as_str().unwrap_or_default().to_string())
                    });
                if let Some(c) = created {
                    obj["metadata"]["annotations"][CREATED_ANNOTATION] = json!(c);
                }
                ("PUT", class.object_path(ns.as_deref(), &name))
            }
        };
        let a = self.write_json(method, &path, &obj)?;
        match a.status {
            200 | 201 => Ok(Some(parse_rv(&a.body["metadata"]["resourceVersion"])?)),
            409 => Ok(None),
            404 if current.is_some() && a.body["details"]["name"].is_string() => Ok(None),
            422 => Err(StoreError::Backend(format!(
                "the API server refused {} {}: {}",
                class.kind,
                name,
                a.message()
            ))),
            _ => Err(self.unexpected(&format!("{method} {path}"), &a, class)),
        }
    }

    fn get_current(&self, key: &str) -> Result<Option<(Value, KeyValue)>> {
        let class = class_of(key);
        let (ns, name) = class.locate(key)?;
        let Some(obj) = self.get_object(class, ns.as_deref(), &name)? else {
            return Ok(None);
        };
        let kv = decode(class, &obj)?;
        if kv.key != key {
            // Two keys hashed to one name is not expected; refuse rather than mix them.
            return Err(StoreError::Backend(format!(
                "{} {name} holds key {:?}, not {key:?}",
                class.kind, kv.key
            )));
        }
        Ok(Some((obj, kv)))
    }
}

impl KubeStore {
    /// The endpoints derived from Pods under `prefix` (one namespace's when `prefix` names
    /// one) and the list's revision ([`crate::kube_pods`]).
    fn derived_range(&self, class: &Class, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        let ns = prefix
            .strip_prefix(class.prefix)
            .and_then(|tail| tail.split_once('/'))
            .map(|(ns, _)| ns)
            .filter(|ns| is_dns_subdomain(ns));
        let mut out = Vec::new();
        let rev = self.list_pods(ns, |pod| {
            if let Some(kv) = derived_kv(&pod)
                && kv.key.starts_with(prefix)
            {
                out.push(kv);
            }
        })?;
        Ok((out, rev))
    }

    /// Lists the Pods (of `namespace`, or all), page by page, each page decoded into slim
    /// [`crate::kube_pods::Pod`]s handed to `each`; the list's revision.
    fn list_pods(
        &self,
        namespace: Option<&str>,
        mut each: impl FnMut(crate::kube_pods::Pod),
    ) -> Result<i64> {
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct ListMeta {
            #[serde(rename = "resourceVersion")]
            resource_version: String,
            #[serde(rename = "continue")]
            cont: Option<String>,
        }
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Page {
            metadata: ListMeta,
            items: Vec<crate::kube_pods::Pod>,
        }
        let class = class_of(&keys::resource_prefix(crate::kube_pods::KIND));
        let mut cont = String::new();
        let mut rev = None;
        loop {
            let mut path = format!("{}?limit={LIST_PAGE}", class.collection(namespace));
            if !cont.is_empty() {
                let _ = write!(path, "&continue={}", url_escape(&cont));
            }
            let (status, raw) = self.call_raw("GET", &path, None, "", Idempotent::Yes)?;
            if status == 410 && rev.is_some() {
                return Err(StoreError::Compacted {
                    requested: rev.unwrap_or(0),
                    oldest: 0,
                });
            }
            if status != 200 {
                return Err(self.unexpected(
                    &format!("GET {path}"),
                    &Answer::parse(status, &raw),
                    class,
                ));
            }
            let page: Page = serde_json::from_slice(&raw)
                .map_err(|e| StoreError::Backend(format!("GET {path}: {e}")))?;
            drop(raw);
            if rev.is_none() {
                rev = Some(parse_rv(&json!(page.metadata.resource_version))?);
            }
            cont = page.metadata.cont.unwrap_or_default();
            page.items.into_iter().for_each(&mut each);
            if cont.is_empty() {
                return Ok(rev.unwrap_or(0));
            }
        }
    }
}

/// Why a derived key cannot be written.
fn derived_read_only(key: &str) -> StoreError {
    StoreError::Backend(format!(
        "{key:?}: on the Kubernetes datastore WorkloadEndpoints are derived from Pods and \
         cannot be written; change the Pod instead (kubectl label pod, kubectl edit pod)"
    ))
}

/// True when nothing can be read from the idle socket without waiting (neither data nor EOF).
fn idle_and_open(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let open = matches!(s.peek(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).is_ok() && open
}

fn is_stale(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
    )
}

fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

fn parse_rv(v: &Value) -> Result<i64> {
    v.as_str()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "resourceVersion {v} is not an integer: tern's Kubernetes datastore needs an API \
                 server whose resource versions are etcd revisions"
            ))
        })
}

fn lease_name(id: i64) -> String {
    format!("l-{:016x}", id as u64)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn lease_expired(obj: &Value) -> bool {
    let ttl = obj["spec"]["ttlMillis"].as_i64().unwrap_or(0);
    let renewed = obj["spec"]["renewedAtMillis"].as_i64().unwrap_or(0);
    now_ms() > renewed + ttl
}

/// Metadata the API server adds, left out of a document read back.
const SERVER_ANNOTATIONS: [&str; 3] = [
    KEY_ANNOTATION,
    CREATED_ANNOTATION,
    "kubectl.kubernetes.io/last-applied-configuration",
];

/// The object for `value` at `key`.
fn encode(class: &Class, key: &str, value: &[u8], ns: Option<&str>, name: &str) -> Result<Value> {
    let mut meta = json!({"name": name});
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    match class.shape {
        Shape::Document => {
            let mut d: Value = serde_json::from_slice(value).map_err(|e| {
                StoreError::Backend(format!(
                    "key {key:?}: a {} value must be a JSON document: {e}",
                    class.kind
                ))
            })?;
            let Some(map) = d.as_object_mut() else {
                return Err(StoreError::Backend(format!(
                    "key {key:?}: not a JSON object"
                )));
            };
            let m = map.remove("metadata").unwrap_or_default();
            for field in ["labels", "annotations"] {
                if let Some(v) = m
                    .get(field)
                    .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
                {
                    meta[field] = v.clone();
                }
            }
            map.insert("apiVersion".into(), json!(API_VERSION));
            map.insert("kind".into(), json!(class.kind));
            map.insert("metadata".into(), meta);
            Ok(d)
        }
        Shape::DerivedFromPods => Err(derived_read_only(key)),
        Shape::Record => {
            meta["annotations"] = json!({ KEY_ANNOTATION: key });
            let mut obj = json!({"apiVersion": API_VERSION, "kind": class.kind, "metadata": meta});
            match std::str::from_utf8(value) {
                Ok(text) => obj["value"] = json!(text),
                Err(_) => obj["valueBase64"] = json!(B64.encode(value)),
            }
            let spec = columns(class, value);
            if !spec.as_object().is_some_and(|o| o.is_empty()) {
                obj["spec"] = spec;
            }
            Ok(obj)
        }
    }
}

/// The fields of a record shown by `kubectl get` (derived from the value; never read back).
fn columns(class: &Class, value: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(value).unwrap_or_default();
    let mut out = serde_json::Map::new();
    match class.kind {
        "IPAMBlock" => {
            let cidr = v["cidr"].as_str().unwrap_or_default();
            out.insert("cidr".into(), json!(cidr));
            if let Some(a) = v["affinity"].as_str() {
                out.insert("node".into(), json!(a.strip_prefix("host:").unwrap_or(a)));
            }
            let size: u64 = match cidr.rsplit_once('/') {
                Some((ip, p)) => {
                    let bits = if ip.contains(':') { 128 } else { 32 };
                    p.parse::<u32>()
                        .ok()
                        .filter(|p| *p <= bits)
                        .map(|p| 1u64 << (bits - p).min(63))
                        .unwrap_or(0)
                }
                None => 0,
            };
            let free = free_count(&v);
            out.insert("free".into(), json!(free));
            out.insert("used".into(), json!(size.saturating_sub(free)));
        }
        "BlockAffinity" => {
            for f in ["node", "cidr", "state"] {
                if let Some(s) = v[f].as_str() {
                    out.insert(f.into(), json!(s));
                }
            }
        }
        "IPAMHandle" => {
            if let Some(b) = v["block"].as_object() {
                let n: i64 = b.values().filter_map(Value::as_i64).sum();
                out.insert("addresses".into(), json!(n));
            }
        }
        _ => {}
    }
    Value::Object(out)
}

/// Free addresses of a stored block: format 2's `free` runs (`"5-63,0,2-3"`) or format 1's
/// `unallocated` list.
fn free_count(v: &Value) -> u64 {
    if let Some(runs) = v["free"].as_str() {
        return runs
            .split(',')
            .filter(|r| !r.is_empty())
            .map(|r| match r.split_once('-') {
                Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                    (Ok(a), Ok(b)) if b >= a => b - a + 1,
                    _ => 0,
                },
                None => 1,
            })
            .sum();
    }
    v["unallocated"]
        .as_array()
        .map(|a| a.len() as u64)
        .unwrap_or(0)
}

/// The key-value an object of `class` stands for, as [`KubeStore`] reads it: what a watcher
/// of the class outside the store (the agent's cache feed) makes of each object it gets.
pub fn decode_object(class: &Class, obj: &Value) -> Result<KeyValue> {
    decode(class, obj)
}

/// The key-value an object stands for.
fn decode(class: &Class, obj: &Value) -> Result<KeyValue> {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let mod_revision = parse_rv(&meta["resourceVersion"])?;
    let version = meta["generation"].as_i64().unwrap_or(1);
    let create_revision = meta["annotations"][CREATED_ANNOTATION]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if version == 1 { mod_revision } else { 0 });
    let lease = meta["labels"][LEASE_LABEL]
        .as_str()
        .and_then(|l| l.strip_prefix("l-"))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .map(|l| l as i64)
        .unwrap_or(0);
    let (key, value) = match class.shape {
        Shape::Document => {
            let ns = meta["namespace"].as_str();
            let key = match (class.singleton, ns) {
                (Some(_), _) => class.prefix.to_string(),
                (None, Some(ns)) => format!("{}{ns}/{name}", class.prefix),
                (None, None) => format!("{}{name}", class.prefix),
            };
            let mut m = json!({"name": name});
            if let Some(ns) = ns {
                m["namespace"] = json!(ns);
            }
            if let Some(l) = meta["labels"].as_object() {
                let l: serde_json::Map<String, Value> = l
                    .iter()
                    .filter(|(k, _)| k.as_str() != LEASE_LABEL)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !l.is_empty() {
                    m["labels"] = Value::Object(l);
                }
            }
            if let Some(a) = meta["annotations"].as_object() {
                let a: serde_json::Map<String, Value> = a
                    .iter()
                    .filter(|(k, _)| !SERVER_ANNOTATIONS.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if !a.is_empty() {
                    m["annotations"] = Value::Object(a);
                }
            }
            for f in ["uid", "creationTimestamp"] {
                if let Some(v) = meta[f].as_str() {
                    m[f] = json!(v);
                }
            }
            let mut d = serde_json::Map::new();
            d.insert("apiVersion".into(), json!(API_VERSION));
            d.insert("kind".into(), json!(class.kind));
            d.insert("metadata".into(), m);
            if let Some(o) = obj.as_object() {
                for (k, v) in o {
                    if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                        d.insert(k.clone(), v.clone());
                    }
                }
            }
            (
                key,
                serde_json::to_vec(&Value::Object(d)).unwrap_or_default(),
            )
        }
        Shape::Record => {
            let key = match meta["annotations"][KEY_ANNOTATION].as_str() {
                Some(k) => k.to_string(),
                None if class.singleton.is_some() => class.prefix.to_string(),
                None => format!("{}{name}", class.prefix),
            };
            let value = if let Some(t) = obj["value"].as_str() {
                t.as_bytes().to_vec()
            } else if let Some(b) = obj["valueBase64"].as_str() {
                B64.decode(b).map_err(|e| {
                    StoreError::Backend(format!("{} {name}: valueBase64: {e}", class.kind))
                })?
            } else {
                Vec::new()
            };
            (key, value)
        }
        Shape::DerivedFromPods => {
            let pod = crate::kube_pods::Pod::from_value(obj)
                .map_err(|e| StoreError::Backend(format!("pod {name}: {e}")))?;
            return derived_kv(&pod)
                .ok_or_else(|| StoreError::Backend(format!("pod {name} has no endpoint")));
        }
    };
    let mut value = value;
    value.shrink_to_fit();
    Ok(KeyValue {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease,
    })
}

/// The key-value of the endpoint a Pod stands for ([`crate::kube_pods`]), when it has one:
/// the document, revisions from the Pod's `resourceVersion` (an endpoint has no history of
/// its own).
pub fn derived_kv(pod: &crate::kube_pods::Pod) -> Option<KeyValue> {
    let crate::kube_pods::Derived::Endpoint { key, doc } = crate::kube_pods::derive(pod) else {
        return None;
    };
    let rev = pod.metadata.resource_version.parse().unwrap_or(0);
    // Kept for as long as the pod runs by every agent's copy (10,000 of them at 1,000
    // nodes): without the spare capacity serialising leaves (about half).
    let mut value = serde_json::to_vec(&doc).unwrap_or_default();
    value.shrink_to_fit();
    Some(KeyValue {
        key,
        value,
        create_revision: rev,
        mod_revision: rev,
        version: 1,
        lease: 0,
    })
}

/// What a transaction on one key does when its compares hold (or not).
enum Effect {
    Nothing,
    Put(Vec<u8>, i64),
    Delete,
}

/// The net effect of a branch's ops on one key (the last op wins, as in one etcd txn on one
/// key), or an error for what one object cannot do.
fn branch(ops: &[Op], key: &str) -> Effect {
    let mut w = Effect::Nothing;
    for op in ops {
        match op {
            Op::Put {
                key: k,
                value,
                lease,
            } if k == key => w = Effect::Put(value.clone(), *lease),
            Op::Delete { key: k } if k == key => w = Effect::Delete,
            _ => {}
        }
    }
    w
}

fn holds(c: &Compare, kv: Option<&KeyValue>) -> bool {
    match c {
        Compare::ModRevision(_, r) => kv.map_or(0, |k| k.mod_revision) == *r,
        Compare::CreateRevision(_, r) => match kv {
            None => *r == 0,
            Some(k) => *r != 0 && (k.create_revision == *r || k.create_revision == 0),
        },
        Compare::Version(_, v) => kv.map_or(0, |k| k.version) == *v,
        Compare::Value(_, bytes) => kv.is_some_and(|k| &k.value == bytes),
    }
}

impl Store for KubeStore {
    fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let class = class_of(key);
        let (ns, name) = class.locate(key)?;
        if class.shape == Shape::DerivedFromPods {
            let (kvs, _) = self.derived_range(class, key)?;
            return Ok(kvs.into_iter().find(|kv| kv.key == key));
        }
        let Some((_, kv)) = self.get_current(key)? else {
            return Ok(None);
        };
        Ok(self.prune_expired(vec![(kv, class, ns, name)])?.pop())
    }

    fn range(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
        let mut rev = i64::MAX;
        let mut found = Vec::new();
        for class in CLASSES.iter().filter(|c| c.overlaps(prefix)) {
            if class.shape == Shape::DerivedFromPods {
                let (kvs, r) = self.derived_range(class, prefix)?;
                rev = rev.min(r);
                found.extend(kvs.into_iter().map(|kv| (kv, class, None, String::new())));
                continue;
            }
            let (objs, r) = self.list(class, None)?;
            rev = rev.min(r);
            for o in &objs {
                let kv = decode(class, o)?;
                // The catch-all holds only keys no other class takes.
                if kv.key.starts_with(prefix)
                    && (!class.is_catch_all() || class_of(&kv.key).is_catch_all())
                {
                    let ns = o["metadata"]["namespace"].as_str().map(str::to_string);
                    let name = o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    found.push((kv, class, ns, name));
                }
            }
        }
        let mut kvs = self.prune_expired(found)?;
        kvs.sort_by(|a, b| a.key.cmp(&b.key));
        if rev == i64::MAX {
            rev = self.revision()?;
        }
        Ok((kvs, rev))
    }

    fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        check_txn_size(&txn)?;
        let Some(key) = crate::single_key(&txn)? else {
            return Ok(TxnResponse {
                succeeded: true,
                revision: self.revision()?,
            });
        };
        let key = key.to_string();
        if class_of(&key).shape == Shape::DerivedFromPods {
            return Err(derived_read_only(&key));
        }
        for op in txn.success.iter().chain(&txn.failure) {
            if let Op::Put { lease, .. } = op
                && *lease != 0
                && !matches!(self.lease_state(*lease)?, Some((false, _)))
            {
                return Err(StoreError::LeaseNotFound(*lease));
            }
        }
        let class = class_of(&key);
        let (ns, name) = class.locate(&key)?;
        // Fast paths: one request, no read.
        if let ([Compare::ModRevision(_, r)], [op], []) = (
            txn.compare.as_slice(),
            txn.success.as_slice(),
            txn.failure.as_slice(),
        ) {
            let done = match (op, *r) {
                (Op::Put { value, lease, .. }, 0) => Some(self.write(&key, value, *lease, None)?),
                (Op::Delete { .. }, r) if r > 0 => {
                    Some(self.delete_object(class, ns.as_deref(), &name, Some(r))?)
                }
                _ => None,
            };
            match done {
                Some(Some(revision)) => {
                    return Ok(TxnResponse {
                        succeeded: true,
                        revision,
                    });
                }
                // A create that found the object may have found one whose lease expired
                // (absent to readers): the read below decides.
                Some(None) if matches!(op, Op::Put { .. }) => {}
                Some(None) => {
                    // Lost: the revision of the store is not worth a request here (see
                    // "What a transaction can be").
                    return Ok(TxnResponse {
                        succeeded: false,
                        revision: 0,
                    });
                }
                None => {}
            }
        }
        for _ in 0..TXN_ATTEMPTS {
            let current = self.get_current(&key)?;
            let (obj, kv) = match &current {
                Some((o, kv)) => (Some(o), Some(kv)),
                None => (None, None),
            };
            let kv = match kv {
                Some(k)
                    if k.lease != 0 && !matches!(self.lease_state(k.lease)?, Some((false, _))) =>
                {
                    // An expired key is absent; it goes first.
                    let _ =
                        self.delete_object(class, ns.as_deref(), &name, Some(k.mod_revision))?;
                    continue;
                }
                k => k,
            };
            let ok = txn.compare.iter().all(|c| holds(c, kv));
            let ops = if ok { &txn.success } else { &txn.failure };
            let done = match branch(ops, &key) {
                Effect::Nothing => Some(match kv {
                    Some(k) if !ok => k.mod_revision,
                    None if !ok => 0,
                    Some(k) if txn.compare.is_empty() => k.mod_revision.max(self.revision()?),
                    _ => self.revision()?,
                }),
                Effect::Put(value, lease) => self.write(&key, &value, lease, obj)?,
                Effect::Delete => match kv {
                    None => Some(self.revision()?),
                    Some(k) => {
                        self.delete_object(class, ns.as_deref(), &name, Some(k.mod_revision))?
                    }
                },
            };
            if let Some(revision) = done {
                return Ok(TxnResponse {
                    succeeded: ok,
                    revision,
                });
            }
        }
        Err(StoreError::Unavailable(format!(
            "{key:?}: {TXN_ATTEMPTS} conditional writes in a row lost to other writers"
        )))
    }

    fn revision(&self) -> Result<i64> {
        let class = &CLASSES[CLASSES.len() - 1];
        let path = format!("{}?limit=1", class.collection(None));
        let a = self.call("GET", &path, None, "", Idempotent::Yes)?;
        if a.status != 200 {
            return Err(self.unexpected(&format!("GET {path}"), &a, class));
        }
        parse_rv(&a.body["metadata"]["resourceVersion"])
    }

    fn watch(&self, prefix: &str, after_revision: i64) -> Result<Box<dyn Watch>> {
        self.watch_prefixes(&[prefix], after_revision)
    }

    /// One stream per class under any of `prefixes`, and only those: a node's dataplane
    /// needs four of the sixteen.
    fn watch_prefixes(&self, prefixes: &[&str], after_revision: i64) -> Result<Box<dyn Watch>> {
        let start = if after_revision <= 0 {
            self.revision()?
        } else {
            after_revision
        };
        let (tx, rx) = mpsc::channel();
        // Made first: when a class's stream cannot be opened, dropping it ends the threads
        // already started for the others.
        let watch = KubeWatch {
            events: crate::ChannelWatch::new(rx, "Kubernetes"),
            closed: Arc::new(AtomicBool::new(false)),
            sockets: Arc::new(Mutex::new(BTreeMap::new())),
        };
        for (slot, class) in classes_under(prefixes).enumerate() {
            let first = self.open_watch(class, start)?;
            let w = ClassWatch {
                store: self.clone(),
                class,
                prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
                rev: start,
                tx: tx.clone(),
                closed: watch.closed.clone(),
                sockets: watch.sockets.clone(),
                slot,
                derived_sent: HashMap::new(),
            };
            thread::Builder::new()
                .name("kube-watch".into())
                .spawn(move || w.run(first))
                .map_err(|e| StoreError::Backend(format!("cannot start a watch thread: {e}")))?;
        }
        Ok(Box::new(watch))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<i64> {
        let mut b = [0u8; 8];
        crate::random_bytes(&mut b)?;
        let id = (i64::from_le_bytes(b) & 0x7fff_ffff_ffff_ffff).max(1);
        let obj = json!({"apiVersion": API_VERSION, "kind": LEASES.kind,
            "metadata": {"name": lease_name(id)},
            "spec": {"ttlMillis": ttl.as_millis() as i64, "renewedAtMillis": now_ms()}});
        let path = LEASES.collection(None);
        let a = self.write_json("POST", &path, &obj)?;
        match a.status {
            // The sweep only tidies: the lease is granted whatever it meets.
            201 | 200 => {
                let _ = self.sweep_leases();
                Ok(id)
            }
            _ => Err(self.unexpected(&format!("POST {path}"), &a, &LEASES)),
        }
    }

    fn lease_keepalive(&self, lease: i64) -> Result<()> {
        for _ in 0..TXN_ATTEMPTS {
            let Some((expired, mut o)) = self.lease_state(lease)? else {
                return Err(StoreError::LeaseNotFound(lease));
            };
            if expired {
                self.lease_revoke(lease)?;
                return Err(StoreError::LeaseNotFound(lease));
            }
            o["spec"]["renewedAtMillis"] = json!(now_ms());
            let path = LEASES.object_path(None, &lease_name(lease));
            let a = self.write_json("PUT", &path, &o)?;
            match a.status {
                200 => return Ok(()),
                409 => continue,
                404 => return Err(StoreError::LeaseNotFound(lease)),
                _ => return Err(self.unexpected(&format!("PUT {path}"), &a, &LEASES)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "lease {lease}: keep-alive kept conflicting"
        )))
    }

    fn lease_revoke(&self, lease: i64) -> Result<()> {
        if self
            .delete_object(&LEASES, None, &lease_name(lease), None)?
            .is_none()
        {
            return Err(StoreError::LeaseNotFound(lease));
        }
        self.delete_attached(&lease_name(lease))
    }

    fn derives_endpoints(&self) -> bool {
        true
    }

    fn multi_key_txn(&self) -> bool {
        false
    }
}

impl KubeStore {
    /// Deletes the keys attached to the lease object `name` (its label on them).
    fn delete_attached(&self, name: &str) -> Result<()> {
        let selector = format!("{LEASE_LABEL}={name}");
        for class in CLASSES.iter().filter(|c| c.shape != Shape::DerivedFromPods) {
            let (objs, _) = self.list(class, Some(&selector))?;
            for o in objs {
                let ns = o["metadata"]["namespace"].as_str();
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                let rv = parse_rv(&o["metadata"]["resourceVersion"])?;
                self.delete_object(class, ns, name, Some(rv))?;
            }
        }
        Ok(())
    }

    /// Removes the leases whose holder stopped renewing them more than a TTL past their
    /// expiry, with the keys attached: an agent killed without revoking its lease would
    /// otherwise leave its DatastoreLease object behind for good (readers delete an expired
    /// lease only when they meet a key attached to it). Run at every grant, so each agent
    /// start tidies what the last crash left. The extra TTL covers clocks that differ between
    /// nodes; the delete's precondition lets a holder renewing at that moment win, and a
    /// holder whose lease went anyway gets `LeaseNotFound` and grants a new one. Returns how
    /// many leases it removed.
    pub fn sweep_leases(&self) -> Result<usize> {
        let (objs, _) = self.list(&LEASES, None)?;
        let mut removed = 0;
        for o in objs {
            let ttl = o["spec"]["ttlMillis"].as_i64().unwrap_or(0);
            let renewed = o["spec"]["renewedAtMillis"].as_i64().unwrap_or(0);
            if now_ms() <= renewed.saturating_add(ttl.saturating_mul(2)) {
                continue;
            }
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            let rv = parse_rv(&o["metadata"]["resourceVersion"])?;
            if self.delete_object(&LEASES, None, name, Some(rv))?.is_some() {
                self.delete_attached(name)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The API path of a Kubernetes (`networking.k8s.io/v1`) NetworkPolicy.
fn network_policy_path(namespace: &str, name: &str) -> String {
    format!("/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}")
}

impl KubeStore {
    /// Creates or replaces the Kubernetes NetworkPolicy `doc` (a `networking.k8s.io/v1`
    /// document) by server-side apply as `ternctl`: the cluster's own object, which every
    /// agent's Kubernetes source enforces, not a record of tern's. Idempotent.
    pub fn apply_network_policy(&self, namespace: &str, name: &str, doc: &Value) -> Result<()> {
        if !is_dns_subdomain(namespace) || !is_dns_subdomain(name) {
            return Err(StoreError::Backend(format!(
                "NetworkPolicy {namespace}/{name}: names must be DNS subdomains"
            )));
        }
        let path = format!(
            "{}?fieldManager=ternctl&force=true",
            network_policy_path(namespace, name)
        );
        let a = self.call(
            "PATCH",
            &path,
            Some(doc),
            "application/apply-patch+yaml",
            Idempotent::Yes,
        )?;
        match a.status {
            200 | 201 => Ok(()),
            _ => Err(StoreError::Backend(format!(
                "PATCH {path}: {} {}",
                a.status,
                a.message()
            ))),
        }
    }

    /// Deletes the Kubernetes NetworkPolicy `namespace/name`; `Ok(false)` when there was none
    /// (a delete of what is gone is success).
    pub fn delete_network_policy(&self, namespace: &str, name: &str) -> Result<bool> {
        let path = network_policy_path(namespace, name);
        let a = self.call(
            "DELETE",
            &path,
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1"})),
            "application/json",
            Idempotent::Yes,
        )?;
        match a.status {
            200 | 202 => Ok(true),
            404 => Ok(false),
            _ => Err(StoreError::Backend(format!(
                "DELETE {path}: {} {}",
                a.status,
                a.message()
            ))),
        }
    }
}

/// One class's watch stream: the socket handle (to end it) and the line reader.
type Stream = (BufReader<Body>, TcpStream);

impl KubeStore {
    /// Opens a watch of `class` from `rev` on a connection of its own.
    fn open_watch(&self, class: &Class, rev: i64) -> Result<Stream> {
        let path = format!(
            "{}?watch=true&allowWatchBookmarks=true&timeoutSeconds=600&resourceVersion={rev}",
            class.collection(None)
        );
        let request = self.request_bytes("GET", &path, None)?;
        let cfg = &self.inner.cfg;
        let deadline = Instant::now() + RETRY_BUDGET;
        loop {
            let attempt = http::connect(
                &cfg.host,
                cfg.port,
                Some(&cfg.tls),
                self.inner.connect_timeout,
                self.inner.io_timeout,
                0,
            )
            .and_then(|mut conn| {
                conn.reader.get_mut().write_all(&request)?;
                conn.reader.get_mut().flush()?;
                let head = http::read_head(&mut conn.reader)?;
                let sock = conn.reader.get_ref().tcp().try_clone()?;
                Ok((head, conn, sock))
            });
            match attempt {
                Ok((head, conn, sock)) if head.status == 200 => {
                    let _ = sock.set_read_timeout(Some(WATCH_SILENCE));
                    return Ok((BufReader::new(head.body_reader(conn.reader)), sock));
                }
                Ok((head, conn, _)) => {
                    let mut body = Vec::new();
                    let _ = head
                        .body_reader(conn.reader)
                        .take(64 * 1024)
                        .read_to_end(&mut body);
                    let a = Answer {
                        status: head.status,
                        body: serde_json::from_slice(&body).unwrap_or_default(),
                    };
                    if head.status == 410 {
                        return Err(StoreError::Compacted {
                            requested: rev,
                            oldest: 0,
                        });
                    }
                    if !matches!(head.status, 429 | 503) || Instant::now() >= deadline {
                        return Err(self.unexpected(&format!("watch {}", class.plural), &a, class));
                    }
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(StoreError::Unavailable(format!(
                        "Kubernetes API server {}:{}: watch of {}: {e}",
                        cfg.host, cfg.port, class.plural
                    )));
                }
                Err(_) => {}
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
}

struct ClassWatch {
    store: KubeStore,
    class: &'static Class,
    /// The watched prefixes; events under none of them are dropped.
    prefixes: Vec<String>,
    /// The last revision delivered (or bookmarked).
    rev: i64,
    tx: Sender<Result<Vec<Event>>>,
    closed: Arc<AtomicBool>,
    sockets: Arc<Mutex<BTreeMap<usize, TcpStream>>>,
    /// This class's place in `sockets`.
    slot: usize,
    /// For a class derived from Pods: what was last sent for each key (a digest of the
    /// document, `None` after a delete), so that the many pod updates that change nothing of
    /// the endpoint (conditions, container statuses) are not delivered.
    derived_sent: HashMap<String, Option<u64>>,
}

impl ClassWatch {
    fn run(mut self, first: Stream) {
        let mut stream = Some(first);
        while !self.closed.load(Ordering::Relaxed) {
            let (mut lines, sock) = match stream.take() {
                Some(s) => s,
                None => match self.store.open_watch(self.class, self.rev) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = self.tx.send(Err(e));
                        return;
                    }
                },
            };
            // One socket per class at a time: a resumed stream's replaces the ended one's.
            if let Ok(c) = sock.try_clone() {
                self.sockets.lock().unwrap().insert(self.slot, c);
            }
            if self.closed.load(Ordering::Relaxed) {
                let _ = sock.shutdown(Shutdown::Both);
                return;
            }
            match self.pump(&mut lines) {
                // The server ended the stream (its timeout) or went quiet: resume.
                Ok(()) => {}
                Err(e) => {
                    let _ = self.tx.send(Err(e));
                    return;
                }
            }
            let _ = sock.shutdown(Shutdown::Both);
        }
    }

    /// Forwards events until the stream ends (`Ok`) or the watch must end (`Err`).
    fn pump(&mut self, lines: &mut BufReader<Body>) -> Result<()> {
        loop {
            let mut line = Vec::new();
            match lines
                .by_ref()
                .take(MAX_WATCH_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
            {
                Ok(0) => return Ok(()),
                Ok(_) if line.len() > MAX_WATCH_LINE => {
                    return Err(StoreError::Backend(format!(
                        "watch of {}: an event over {MAX_WATCH_LINE} bytes",
                        self.class.plural
                    )));
                }
                Ok(_) => {}
                Err(_) if self.closed.load(Ordering::Relaxed) => {
                    return Err(StoreError::Unavailable("watch closed".into()));
                }
                // Silence past WATCH_SILENCE, or the connection broke: resume from `rev`.
                Err(_) => return Ok(()),
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let ev: Value = serde_json::from_slice(&line).map_err(|e| {
                StoreError::Backend(format!("watch of {}: bad event: {e}", self.class.plural))
            })?;
            let obj = &ev["object"];
            let kind = match ev["type"].as_str().unwrap_or_default() {
                "ADDED" | "MODIFIED" => EventKind::Put,
                "DELETED" => EventKind::Delete,
                "BOOKMARK" => {
                    if let Ok(r) = parse_rv(&obj["metadata"]["resourceVersion"]) {
                        self.rev = r;
                    }
                    continue;
                }
                "ERROR" => {
                    return Err(if obj["code"].as_i64() == Some(410) {
                        StoreError::Compacted {
                            requested: self.rev,
                            oldest: 0,
                        }
                    } else {
                        StoreError::Unavailable(format!(
                            "watch of {}: {}",
                            self.class.plural,
                            obj["message"].as_str().unwrap_or_default()
                        ))
                    });
                }
                other => {
                    return Err(StoreError::Backend(format!(
                        "watch of {}: unknown event type {other:?}",
                        self.class.plural
                    )));
                }
            };
            if self.class.shape == Shape::DerivedFromPods {
                let rev = parse_rv(&obj["metadata"]["resourceVersion"])?;
                self.rev = self.rev.max(rev);
                let Some(ev) = self.derived_event(kind, obj, rev)? else {
                    continue;
                };
                if self.tx.send(Ok(vec![ev])).is_err() {
                    return Err(StoreError::Unavailable("watch closed".into()));
                }
                continue;
            }
            let mut kv = decode(self.class, obj)?;
            self.rev = self.rev.max(kv.mod_revision);
            if !self.prefixes.iter().any(|p| kv.key.starts_with(p.as_str()))
                || (self.class.is_catch_all() && !class_of(&kv.key).is_catch_all())
            {
                continue;
            }
            if kind == EventKind::Delete {
                kv.value.clear();
                kv.create_revision = 0;
                kv.version = 0;
                kv.lease = 0;
            }
            if self.tx.send(Ok(vec![Event { kind, kv }])).is_err() {
                return Err(StoreError::Unavailable("watch closed".into()));
            }
        }
    }
}

impl ClassWatch {
    /// The event a Pod's change makes of its derived endpoint: a put when the pod has an
    /// endpoint that differs from the last one sent, a delete when it has none (any more),
    /// nothing when neither changed or the key is outside the watched prefixes.
    fn derived_event(&mut self, kind: EventKind, pod: &Value, rev: i64) -> Result<Option<Event>> {
        use crate::kube_pods::{Derived, Pod, derive};
        let pod = Pod::from_value(pod).map_err(|e| {
            StoreError::Backend(format!("watch of {}: bad pod: {e}", self.class.plural))
        })?;
        let derived = match (&kind, derive(&pod)) {
            (EventKind::Delete, d) => Derived::Nothing {
                key: d.key().map(str::to_string),
            },
            (_, d) => d,
        };
        let Some(key) = derived.key().map(str::to_string) else {
            return Ok(None);
        };
        if !self.prefixes.iter().any(|p| key.starts_with(p.as_str())) {
            return Ok(None);
        }
        let ev = match derived {
            Derived::Endpoint { doc, .. } => {
                let value = serde_json::to_vec(&doc).unwrap_or_default();
                let digest = Some({
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    value.hash(&mut h);
                    h.finish()
                });
                if self.derived_sent.get(&key) == Some(&digest) {
                    return Ok(None);
                }
                self.derived_sent.insert(key.clone(), digest);
                Event {
                    kind: EventKind::Put,
                    kv: KeyValue {
                        key,
                        value,
                        create_revision: rev,
                        mod_revision: rev,
                        version: 1,
                        lease: 0,
                    },
                }
            }
            Derived::Nothing { .. } => {
                // A key never sent may still be in the watcher's own list: send its delete
                // once. A pod gone for good is forgotten.
                let sent = if kind == EventKind::Delete {
                    self.derived_sent.remove(&key)
                } else {
                    self.derived_sent.insert(key.clone(), None)
                };
                if sent == Some(None) {
                    return Ok(None);
                }
                crate::mem::delete_event(key, rev)
            }
        };
        Ok(Some(ev))
    }
}

/// A live watch over one or more classes; events arrive from their threads.
struct KubeWatch {
    events: crate::ChannelWatch,
    closed: Arc<AtomicBool>,
    sockets: Arc<Mutex<BTreeMap<usize, TcpStream>>>,
}

impl Watch for KubeWatch {
    /// In revision order across the classes' streams.
    fn next_events(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        let mut out = self.events.next_events(timeout)?;
        out.sort_by_key(|e| e.kv.mod_revision);
        Ok(out)
    }
}

impl Drop for KubeWatch {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        for s in std::mem::take(&mut *self.sockets.lock().unwrap()).into_values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// The CustomResourceDefinitions of every class and of the leases, then the admission policy
/// that refuses overlapping pools, as one YAML stream for `kubectl apply -f`.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    let with_crd = CLASSES.iter().filter(|c| c.shape != Shape::DerivedFromPods);
    for class in with_crd.chain(std::iter::once(&LEASES)) {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd(class)).unwrap_or_default());
    }
    for doc in ippool_overlap_policy() {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&doc).unwrap_or_default());
    }
    out
}

/// The name of the admission policy that refuses overlapping IP pools, and of its binding.
pub const IPPOOL_OVERLAP_POLICY: &str = "ippools-no-overlap.tern.dev";

/// A ValidatingAdmissionPolicy and its binding that make the API server refuse an IP pool
/// whose CIDR overlaps another pool's (Calico checks this in calicoctl and its API server).
/// A CRD's own rules see one object; a policy with the IPPools themselves as its parameters
/// (`paramRef.selector` matching every pool) is evaluated once per existing pool, and the
/// request is refused when any evaluation fails. The API server reads the parameters from an
/// informer, so two overlapping pools created in the same instant can both pass; ternd and
/// `ternctl apply` check overlap too.
fn ippool_overlap_policy() -> [Value; 2] {
    let rule = "params.metadata.name == object.metadata.name \
        || !isCIDR(object.spec.cidr) || !isCIDR(params.spec.cidr) \
        || cidr(object.spec.cidr).ip().family() != cidr(params.spec.cidr).ip().family() \
        || !(cidr(object.spec.cidr).containsCIDR(cidr(params.spec.cidr)) \
             || cidr(params.spec.cidr).containsCIDR(cidr(object.spec.cidr)))";
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": IPPOOL_OVERLAP_POLICY},
            "spec": {
                "failurePolicy": "Fail",
                "paramKind": {"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "IPPool"},
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [GROUP], "apiVersions": [VERSION],
                    "operations": ["CREATE", "UPDATE"], "resources": ["ippools"],
                }]},
                "validations": [{
                    "expression": rule,
                    "messageExpression": "'spec.cidr ' + object.spec.cidr + ' overlaps IPPool ' \
                        + params.metadata.name + ' (' + params.spec.cidr + ')'",
                    "reason": "Invalid",
                }],
            },
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": IPPOOL_OVERLAP_POLICY},
            "spec": {
                "policyName": IPPOOL_OVERLAP_POLICY,
                "validationActions": ["Deny"],
                "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
            },
        }),
    ]
}

/// The CRD of one class: a structural schema (the IP pool's in full, with the checks the API
/// server can make itself), printer columns for `kubectl get`.
pub fn crd(class: &Class) -> Value {
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let mut props = serde_json::Map::new();
    let mut columns = Vec::new();
    let col =
        |name: &str, ty: &str, path: &str| json!({"name": name, "type": ty, "jsonPath": path});
    match class.shape {
        Shape::Document | Shape::DerivedFromPods => {
            props.insert(
                "spec".into(),
                if class.kind == "IPPool" {
                    ippool_schema()
                } else {
                    preserve.clone()
                },
            );
        }
        Shape::Record => {
            props.insert(
                "value".into(),
                json!({"type": "string", "description": "The stored value, exactly (UTF-8)."}),
            );
            props.insert("valueBase64".into(), json!({"type": "string", "description": "The stored value, exactly, when not UTF-8."}));
            props.insert("spec".into(), json!({"type": "object", "description": "Fields derived from the value for kubectl get; never read by tern.", "x-kubernetes-preserve-unknown-fields": true}));
        }
    }
    match class.kind {
        "IPPool" => {
            columns.push(col("CIDR", "string", ".spec.cidr"));
            columns.push(col("Block", "integer", ".spec.blockSize"));
            columns.push(col("VXLAN", "string", ".spec.vxlanMode"));
            columns.push(col("IPIP", "string", ".spec.ipipMode"));
            columns.push(col("NAT", "boolean", ".spec.natOutgoing"));
            columns.push(col("Disabled", "boolean", ".spec.disabled"));
        }
        "IPAMBlock" => {
            columns.push(col("CIDR", "string", ".spec.cidr"));
            columns.push(col("Node", "string", ".spec.node"));
            columns.push(col("Used", "integer", ".spec.used"));
            columns.push(col("Free", "integer", ".spec.free"));
        }
        "BlockAffinity" => {
            columns.push(col("Node", "string", ".spec.node"));
            columns.push(col("CIDR", "string", ".spec.cidr"));
            columns.push(col("State", "string", ".spec.state"));
        }
        "IPAMHandle" => columns.push(col("Addresses", "integer", ".spec.addresses")),
        "BGPPeer" => {
            columns.push(col("Peer", "string", ".spec.peerIP"));
            columns.push(col("AS", "integer", ".spec.asNumber"));
        }
        "DatastoreLease" => {
            columns.push(col("TTL-ms", "integer", ".spec.ttlMillis"));
        }
        "StagedNetworkPolicy" | "StagedGlobalNetworkPolicy" | "StagedKubernetesNetworkPolicy" => {
            columns.push(col("Action", "string", ".spec.stagedAction"));
        }
        _ => {}
    }
    if class.shape == Shape::Record && class.kind != "DatastoreLease" {
        columns.push(col("Key", "string", ".metadata.annotations.tern\\.dev/key"));
    }
    columns.push(col("Age", "date", ".metadata.creationTimestamp"));
    let mut names = json!({"kind": class.kind, "listKind": format!("{}List", class.kind),
        "plural": class.plural, "singular": class.kind.to_ascii_lowercase(), "categories": ["tern"]});
    if !class.short_names.is_empty() {
        names["shortNames"] = json!(class.short_names);
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{GROUP}", class.plural)},
        "spec": {
            "group": GROUP,
            "scope": if class.namespaced { "Namespaced" } else { "Cluster" },
            "names": names,
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": props}},
                "additionalPrinterColumns": columns,
            }],
        },
    })
}

/// The IP pool's schema: the fields tern reads, with what the API server can check itself
/// (CIDR syntax, block size for the family and within the pool, encapsulation modes, one
/// encapsulation at most); overlap with other pools is the admission policy's
/// (`ippool_overlap_policy`).
fn ippool_schema() -> Value {
    let modes =
        json!({"type": "string", "enum": ["Never", "Always", "CrossSubnet"], "default": "Never"});
    json!({
        "type": "object",
        "required": ["cidr"],
        "properties": {
            "cidr": {"type": "string", "maxLength": 64,
                "description": "The pool's network (IPv4 or IPv6 CIDR).",
                "x-kubernetes-validations": [{"rule": "isCIDR(self)", "message": "must be a CIDR such as 10.244.0.0/16"}]},
            "blockSize": {"type": "integer", "minimum": 0, "maximum": 128,
                "description": "Prefix length of the pool's blocks (0: 26 for IPv4, 122 for IPv6)."},
            "vxlanMode": modes,
            "ipipMode": modes,
            "natOutgoing": {"type": "boolean"},
            "disabled": {"type": "boolean"},
            "nodeSelector": {"type": "string", "maxLength": 1024, "default": "all()", "minLength": 1},
            "allowedUses": {"type": "array", "maxItems": 4, "items": {"type": "string", "enum": ["Workload", "Tunnel"]}},
        },
        "x-kubernetes-validations": [
            {"rule": "!isCIDR(self.cidr) || !has(self.blockSize) || self.blockSize == 0 || (cidr(self.cidr).ip().family() == 4 ? (self.blockSize >= 20 && self.blockSize <= 32) : (self.blockSize >= 116 && self.blockSize <= 128))",
             "message": "blockSize must be 20..32 for an IPv4 pool and 116..128 for an IPv6 pool", "fieldPath": ".blockSize"},
            {"rule": "!isCIDR(self.cidr) || !has(self.blockSize) || self.blockSize == 0 || self.blockSize >= cidr(self.cidr).prefixLength()",
             "message": "blockSize is smaller than the pool's prefix length: a block must fit in the pool", "fieldPath": ".blockSize"},
            {"rule": "!(has(self.ipipMode) && has(self.vxlanMode)) || self.ipipMode == 'Never' || self.vxlanMode == 'Never'",
             "message": "a pool cannot use both IPIP and VXLAN; set one of them to Never"},
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_classes_and_names() {
        assert_eq!(class_of("/tern/v1/resources/ippool/default").kind, "IPPool");
        assert_eq!(
            class_of("/tern/v1/ipam/blocks/10.244.0.0-26").kind,
            "IPAMBlock"
        );
        assert_eq!(class_of("/tern/v1/ipam/config").kind, "IPAMConfig");
        assert_eq!(class_of("/tern/v1/ipam/configx").kind, "DatastoreEntry");
        assert_eq!(class_of("/conformance/a").kind, "DatastoreEntry");
        assert_eq!(
            class_of("/tern/v1/resources/kubernetesnetworkpolicy/a/b").kind,
            "DatastoreEntry"
        );
        let b = class_of("/tern/v1/ipam/blocks/10.244.0.0-26");
        assert_eq!(
            b.locate("/tern/v1/ipam/blocks/10.244.0.0-26").unwrap().1,
            "10.244.0.0-26"
        );
        let a = class_of("/tern/v1/ipam/affinities/node1/10.244.0.0-26");
        // A '/' becomes '.', and the hash keeps "a/b" and "a.b" apart.
        let name = a
            .locate("/tern/v1/ipam/affinities/node1/10.244.0.0-26")
            .unwrap()
            .1;
        assert!(name.starts_with("node1.10.244.0.0-26-"), "{name}");
        // Names that had to change carry a hash of the key: distinct keys, distinct names.
        let x = object_name("Tern.ABC", "/k/Tern.ABC");
        let y = object_name("tern.abc", "/k/tern.abc");
        assert_ne!(x, y);
        assert!(is_dns_subdomain(&x), "{x}");
        assert!(is_dns_subdomain(&object_name(
            "conformance/a b/__/",
            "/conformance/a b/__/"
        )));
        assert!(is_dns_subdomain(&object_name(&"x".repeat(400), "/x")));
        assert!(is_dns_subdomain(&object_name("///", "/k////")));
        let ns = class_of("/tern/v1/resources/networkpolicy/default/allow");
        assert_eq!(
            ns.locate("/tern/v1/resources/networkpolicy/default/allow")
                .unwrap(),
            (Some("default".to_string()), "allow".to_string())
        );
        assert!(
            ns.locate("/tern/v1/resources/networkpolicy/Bad_NS/x")
                .is_err()
        );
    }

    #[test]
    fn prefixes_overlap_the_right_classes() {
        let kinds = |p: &str| -> Vec<&str> {
            CLASSES
                .iter()
                .filter(|c| c.overlaps(p))
                .map(|c| c.kind)
                .collect()
        };
        assert_eq!(kinds("/tern/v1/ipam/blocks/"), ["IPAMBlock"]);
        assert_eq!(kinds("/tern/v1/ipam/blocks/10.244"), ["IPAMBlock"]);
        assert_eq!(kinds("/conformance/x/"), ["DatastoreEntry"]);
        assert_eq!(
            kinds("/tern/v1/ipam/").len(),
            6,
            "{:?}",
            kinds("/tern/v1/ipam/")
        );
        assert_eq!(kinds("/tern/v1/").len(), CLASSES.len());
        // What a node's dataplane watches: four streams, not one per class.
        let under = |p: &[&str]| -> Vec<&str> { classes_under(p).map(|c| c.kind).collect() };
        assert_eq!(
            under(&[
                "/tern/v1/resources/ippool/",
                "/tern/v1/resources/node/",
                keys::BLOCKS,
                keys::AFFINITIES
            ]),
            ["IPPool", "Node", "IPAMBlock", "BlockAffinity"]
        );
        // Kinds without a class of their own (Namespace) live in the catch-all.
        assert_eq!(
            under(&[
                "/tern/v1/resources/namespace/",
                "/tern/v1/resources/networkpolicy/"
            ]),
            ["NetworkPolicy", "DatastoreEntry"]
        );
    }

    #[test]
    fn documents_and_records_round_trip() {
        let pool = br#"{"apiVersion":"tern.dev/v1","kind":"IPPool","metadata":{"name":"p1","labels":{"a":"b"}},"spec":{"cidr":"10.0.0.0/16"}}"#;
        let key = "/tern/v1/resources/ippool/p1";
        let class = class_of(key);
        let mut obj = encode(class, key, pool, None, "p1").unwrap();
        obj["metadata"]["resourceVersion"] = json!("42");
        obj["metadata"]["generation"] = json!(1);
        obj["metadata"]["uid"] = json!("u-1");
        obj["metadata"]["managedFields"] = json!([{"manager": "kubectl"}]);
        let kv = decode(class, &obj).unwrap();
        assert_eq!(
            (
                kv.key.as_str(),
                kv.mod_revision,
                kv.version,
                kv.create_revision
            ),
            (key, 42, 1, 42)
        );
        let back: Value = serde_json::from_slice(&kv.value).unwrap();
        assert_eq!(back["spec"]["cidr"], "10.0.0.0/16");
        assert_eq!(back["metadata"]["labels"]["a"], "b");
        assert_eq!(back["metadata"]["uid"], "u-1");
        assert!(back["metadata"]["managedFields"].is_null());

        for value in [
            &b"{\"cidr\":\"10.1.0.0/26\",\"affinity\":\"host:n1\",\"free\":\"2-63\",\"v\":2}"[..],
            &[0xff, 0, 1][..],
        ] {
            let key = "/tern/v1/ipam/blocks/10.1.0.0-26";
            let class = class_of(key);
            let mut obj = encode(class, key, value, None, "10.1.0.0-26").unwrap();
            obj["metadata"]["resourceVersion"] = json!("7");
            let kv = decode(class, &obj).unwrap();
            assert_eq!((kv.key.as_str(), kv.value.as_slice()), (key, value));
        }
        let key = "/tern/v1/ipam/blocks/10.1.0.0-26";
        let obj = encode(
            class_of(key),
            key,
            b"{\"cidr\":\"10.1.0.0/26\",\"affinity\":\"host:n1\",\"free\":\"2-63\"}",
            None,
            "x",
        )
        .unwrap();
        assert_eq!(
            obj["spec"],
            json!({"cidr": "10.1.0.0/26", "node": "n1", "free": 62, "used": 2})
        );
    }

    #[test]
    fn kubeconfig_is_read_and_plugins_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = tern_pki::Ca::new("tern-test-ca", std::time::Duration::from_secs(3600)).unwrap();
        let pem = ca.cert_pem().as_bytes().to_vec();
        let cfg = |user: &str| {
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n{user}\n",
                B64.encode(&pem)
            )
        };
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, cfg("    token: abc")).unwrap();
        let c = KubeConfig::from_kubeconfig(&path).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 6443));
        assert_eq!(c.token().unwrap().as_deref(), Some("abc"));
        std::fs::write(&path, cfg("    exec: {command: aws}")).unwrap();
        let e = KubeConfig::from_kubeconfig(&path).unwrap_err().to_string();
        assert!(e.contains("exec plugin"), "{e}");
        assert_eq!(
            parse_server("https://[::1]:8443/x/").unwrap(),
            ("::1".into(), 8443, "/x".into())
        );
        assert!(parse_server("http://a").is_err());
    }
}
