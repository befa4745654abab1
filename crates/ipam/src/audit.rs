//! Cluster-wide IPAM consistency check (the library behind `ternctl ipam check` and
//! `ternctl ipam release`), pure over a [`Store`].
//!
//! An address is *in use* when a WorkloadEndpoint with the allocation's handle exists (any
//! node), or when an owner record of standalone `tern-ipam` exists for the handle (the netns
//! can only be checked on its node, so the check here is conservative: such allocations are
//! never reported as leaked; the node's agent releases them when the sandbox is gone).
//!
//! On a store that derives its WorkloadEndpoints from the cluster's Pods (the Kubernetes
//! datastore, [`Store::derives_endpoints`]) an endpoint carries no container ID, so no handle:
//! an allocation is in use there when a Pod of its namespace and name holds its address, and
//! an allocation made for no pod (a bare CNI attachment, a tunnel address) is never reported,
//! since the record of its user is only on its node (whose agent repairs it, as for owner
//! records). Calico's `calicoctl ipam check` on its Kubernetes datastore compares the same way.
//! A pod whose kubelet has not reported its address yet looks unused for that moment: a
//! release from a report checks again first ([`release_from_report`]).
//!
//! The audit reads the records the agent writes (WorkloadEndpoints, owner records under
//! [`keys::OWNERS`]) itself, through [`list_endpoints`] and the owner-record functions below,
//! so that `ternctl` needs IPAM and the store but not the agent (`tern_agent::audit` re-exports
//! this module).

use crate::{Allocation, AllocationAttrs, Ipam, IpamError};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use tern_api::{Attachment, PodRef};
use tern_model::BadIpNetwork;
use tern_store::{Store, StoreError, keys};

/// Errors of the check and of releases.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("reading IPAM: {0}")]
    Ipam(#[from] IpamError),
    #[error("reading endpoints or owner records: {0}")]
    Store(#[from] StoreError),
    #[error("IP {0} is not assigned")]
    NotAssigned(IpAddr),
    #[error("IP {ip} is in use by endpoint {endpoint}; delete the workload first")]
    InUse { ip: IpAddr, endpoint: String },
}

/// An allocation with no user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeakedAllocation {
    pub ip: IpAddr,
    pub handle: String,
    pub block: ipnet::IpNet,
    /// Identifies this allocation: a release checks it, so a reused address is never freed.
    pub sequence_number: u64,
    pub node: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub pod: String,
    #[serde(default, rename = "containerID")]
    pub container_id: String,
}

/// An endpoint address that IPAM does not hold for the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnallocatedUse {
    pub ip: IpAddr,
    /// `<namespace>/<name>` of the WorkloadEndpoint.
    pub endpoint: String,
    pub node: String,
    /// When the address is allocated, but to another handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_to: Option<String>,
}

/// An address used by more than one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateUse {
    pub ip: IpAddr,
    pub endpoints: Vec<String>,
}

/// Result of a check; written as JSON by `ternctl ipam check -o`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamReport {
    pub allocations_checked: usize,
    pub endpoints_checked: usize,
    pub allocated_not_in_use: Vec<LeakedAllocation>,
    pub in_use_not_allocated: Vec<UnallocatedUse>,
    pub duplicates: Vec<DuplicateUse>,
    /// Endpoint address entries that are not CIDRs, each with its endpoint: what they stand
    /// for is unknown, so an allocation reported unused may be theirs. Absent from the JSON
    /// when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable_addresses: Vec<BadIpNetwork>,
}

impl IpamReport {
    /// Total number of problems found.
    pub fn problems(&self) -> usize {
        self.allocated_not_in_use.len()
            + self.in_use_not_allocated.len()
            + self.duplicates.len()
            + self.unreadable_addresses.len()
    }
}

/// What the audit needs of one WorkloadEndpoint: who it is, its addresses, and whether they
/// came from a delegated IPAM plugin. Read from the store as the agent reads its endpoints
/// (`tern_agent::endpoints::store_io`), less what the audit does not look at (host
/// interface, MAC, labels, ports, netns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUse {
    pub node: String,
    /// The attachment the endpoint was made for (`pod` set for the `k8s` orchestrator).
    pub attachment: Attachment,
    /// Pod addresses as CIDRs (10.244.0.5/32), parsed where the record is read.
    pub ip_networks: Vec<IpNet>,
    /// The record's address entries that are not CIDRs (reported by the check).
    pub bad_ip_networks: Vec<BadIpNetwork>,
    /// Addresses came from a delegated IPAM plugin: tern IPAM does not hold them.
    pub delegated_ipam: bool,
}

/// The part of a stored WorkloadEndpoint document ([`tern_model::WorkloadEndpoint`]) the
/// audit reads. The rest (labels, ports, MAC, host interface, other annotations) is skipped
/// unread: the pod IPAM GC reads every endpoint of the cluster each pass, and decoding whole
/// documents built every label map only to drop it. A document whose other fields are off
/// still counts here, so its addresses are never reported unused for that.
#[derive(Deserialize)]
struct EndpointRecord {
    metadata: RecordMeta,
    spec: RecordSpec,
}

#[derive(Deserialize)]
struct RecordMeta {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    annotations: RecordAnnotations,
}

#[derive(Deserialize, Default)]
struct RecordAnnotations {
    #[serde(default, rename = "tern.dev/delegated-ipam")]
    delegated_ipam: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RecordSpec {
    node: String,
    /// Absent means `k8s`, as in [`tern_model::WorkloadEndpointSpec`].
    #[serde(default)]
    orchestrator: Option<String>,
    pod: String,
    #[serde(default, rename = "containerID")]
    container_id: String,
    #[serde(default)]
    endpoint: String,
    #[serde(default)]
    ip_networks: Vec<String>,
    #[serde(default)]
    network: String,
}

impl EndpointUse {
    /// The endpoint of a stored WorkloadEndpoint document, as the agent reads it.
    fn from_record(r: EndpointRecord) -> EndpointUse {
        let (m, s) = (r.metadata, r.spec);
        let namespace = m.namespace.unwrap_or_default();
        let nets =
            tern_model::parse_ip_networks(&format!("{namespace}/{}", m.name), &s.ip_networks);
        let pod = (s.orchestrator.as_deref().unwrap_or("k8s") == "k8s").then(|| PodRef {
            namespace,
            name: s.pod,
            ..Default::default()
        });
        EndpointUse {
            node: s.node,
            attachment: Attachment {
                network: s.network,
                container_id: s.container_id,
                ifname: s.endpoint,
                netns_path: String::new(),
                pod,
            },
            ip_networks: nets.nets,
            bad_ip_networks: nets.bad,
            delegated_ipam: m.annotations.delegated_ipam.as_deref() == Some("true"),
        }
    }

    /// `<namespace>/<name>` of the endpoint, the name built as the agent builds it (Calico's
    /// `<node>-k8s-<pod>-<ifname>`, or `<node>-cni-<containerID>-<ifname>` without a pod, each
    /// part with `-` doubled) and the namespace "default" outside Kubernetes.
    pub fn label(&self) -> String {
        let a = &self.attachment;
        let esc = |s: &str| s.replace('-', "--");
        match &a.pod {
            Some(p) => format!(
                "{}/{}-k8s-{}-{}",
                p.namespace,
                esc(&self.node),
                esc(&p.name),
                esc(&a.ifname)
            ),
            None => format!(
                "default/{}-cni-{}-{}",
                esc(&self.node),
                esc(&a.container_id),
                esc(&a.ifname)
            ),
        }
    }
}

/// Every WorkloadEndpoint of every node; a document whose fields the audit reads do not parse
/// is skipped with a warning (as the agent skips it).
pub fn list_endpoints(store: &dyn Store) -> Result<Vec<EndpointUse>, StoreError> {
    let (kvs, _) = store.range(&keys::resource_prefix("WorkloadEndpoint"))?;
    let mut out = Vec::new();
    for kv in kvs {
        match serde_json::from_slice::<EndpointRecord>(&kv.value) {
            Ok(r) => out.push(EndpointUse::from_record(r)),
            Err(e) => log::warn!("skipping unreadable endpoint {}: {e}", kv.key),
        }
    }
    Ok(out)
}

/// The fields of an owner record (`tern_agent::owners::OwnerRecord`, written by the agent for
/// standalone `tern-ipam` allocations). Parsed in full so that a record the agent skips as
/// unreadable is skipped here too.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct OwnerRecordFields {
    handle: String,
    #[serde(rename = "node")]
    _node: String,
    #[serde(rename = "network")]
    _network: String,
    #[serde(rename = "containerID")]
    _container_id: String,
    #[serde(rename = "ifname")]
    _ifname: String,
    #[serde(rename = "netns")]
    _netns: String,
}

/// Handles of every owner record of every node. Unreadable records are skipped with a warning.
pub fn owner_handles(store: &dyn Store) -> Result<HashSet<String>, StoreError> {
    let (kvs, _) = store.range(keys::OWNERS)?;
    let mut out = HashSet::new();
    for kv in kvs {
        match serde_json::from_slice::<OwnerRecordFields>(&kv.value) {
            Ok(o) => {
                out.insert(o.handle);
            }
            Err(e) => log::warn!("skipping unreadable owner record {}: {e}", kv.key),
        }
    }
    Ok(out)
}

/// Deletes the owner record of `handle` on `node`; Ok when absent.
pub fn delete_owner(store: &dyn Store, node: &str, handle: &str) -> Result<(), StoreError> {
    store.delete(&keys::owner(node, handle))?;
    Ok(())
}

/// Compares allocations with endpoints and owner records (pure; see [`check`]).
pub fn compare(
    allocs: &[Allocation],
    endpoints: &[EndpointUse],
    owner_handles: &HashSet<String>,
) -> IpamReport {
    compare_with(allocs, endpoints, owner_handles, false)
}

/// Whether `e` is an endpoint derived from a Pod: a pod's, with no container ID.
fn is_derived(e: &EndpointUse) -> bool {
    e.attachment.container_id.is_empty() && e.attachment.pod.is_some()
}

/// [`compare`]; with `derived`, the endpoints come from a store that derives them from Pods
/// (see the module documentation).
pub fn compare_with(
    allocs: &[Allocation],
    endpoints: &[EndpointUse],
    owner_handles: &HashSet<String>,
    derived: bool,
) -> IpamReport {
    let mut r = IpamReport {
        allocations_checked: allocs.len(),
        endpoints_checked: endpoints.len(),
        ..Default::default()
    };
    let ep_handles: HashSet<String> = endpoints
        .iter()
        .filter(|e| !e.delegated_ipam)
        .filter(|e| !(derived && is_derived(e)))
        .flat_map(|e| [e.attachment.handle(), e.attachment.legacy_handle()])
        .collect();
    // (namespace, pod, address) of every endpoint derived from a Pod.
    let pod_uses: HashSet<(&str, &str, IpAddr)> = endpoints
        .iter()
        .filter(|e| derived && is_derived(e) && !e.delegated_ipam)
        .flat_map(|e| {
            let p = e
                .attachment
                .pod
                .as_ref()
                .expect("derived endpoints have a pod");
            e.ip_networks
                .iter()
                .map(move |n| (p.namespace.as_str(), p.name.as_str(), n.addr()))
        })
        .collect();
    for a in allocs {
        let Some(h) = &a.handle else { continue };
        if ep_handles.contains(h) || owner_handles.contains(h) {
            continue;
        }
        if derived
            && (a.attrs.pod.is_empty()
                || pod_uses.contains(&(a.attrs.namespace.as_str(), a.attrs.pod.as_str(), a.ip)))
        {
            continue;
        }
        r.allocated_not_in_use.push(LeakedAllocation {
            ip: a.ip,
            handle: h.clone(),
            block: a.block,
            sequence_number: a.sequence_number,
            node: a.attrs.node.clone(),
            namespace: a.attrs.namespace.clone(),
            pod: a.attrs.pod.clone(),
            container_id: a.attrs.container_id.clone(),
        });
    }
    let by_ip: HashMap<IpAddr, &Allocation> = allocs.iter().map(|a| (a.ip, a)).collect();
    let mut users: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
    for e in endpoints {
        r.unreadable_addresses
            .extend(e.bad_ip_networks.iter().cloned());
        for n in &e.ip_networks {
            let ip = n.addr();
            users.entry(ip).or_default().push(e.label());
            if e.delegated_ipam {
                continue;
            }
            let held_by = by_ip.get(&ip).map(|a| a.handle.clone().unwrap_or_default());
            if derived && is_derived(e) {
                let pod = e
                    .attachment
                    .pod
                    .as_ref()
                    .expect("derived endpoints have a pod");
                let held = by_ip
                    .get(&ip)
                    .is_some_and(|a| a.attrs.namespace == pod.namespace && a.attrs.pod == pod.name);
                if !held {
                    r.in_use_not_allocated.push(UnallocatedUse {
                        ip,
                        endpoint: e.label(),
                        node: e.node.clone(),
                        allocated_to: held_by,
                    });
                }
                continue;
            }
            let handle = e.attachment.handle();
            // A pod added before handles were unambiguous holds its address under the
            // legacy form, made for this container and interface.
            let legacy = by_ip.get(&ip).is_some_and(|a| {
                a.handle.as_deref() == Some(e.attachment.legacy_handle().as_str())
                    && a.attrs.container_id == e.attachment.container_id
                    && tern_api::ident::same_ifname(&a.attrs.ifname, &e.attachment.ifname)
            });
            if held_by.as_deref() != Some(handle.as_str()) && !legacy {
                r.in_use_not_allocated.push(UnallocatedUse {
                    ip,
                    endpoint: e.label(),
                    node: e.node.clone(),
                    allocated_to: held_by,
                });
            }
        }
    }
    r.duplicates = users
        .into_iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(ip, endpoints)| DuplicateUse { ip, endpoints })
        .collect();
    r.allocated_not_in_use.sort_by_key(|l| l.ip);
    r.in_use_not_allocated.sort_by_key(|u| u.ip);
    r.unreadable_addresses
        .sort_by(|a, b| (&a.endpoint, &a.value).cmp(&(&b.endpoint, &b.value)));
    r
}

/// Reads allocations, endpoints and owner records and compares them.
pub fn check(store: &dyn Store, ipam: &Ipam) -> Result<IpamReport, AuditError> {
    let allocs = ipam.allocations(None)?;
    let eps = list_endpoints(store)?;
    let owners = owner_handles(store)?;
    Ok(compare_with(
        &allocs,
        &eps,
        &owners,
        store.derives_endpoints(),
    ))
}

/// Human summary of a report, in the manner of `calicoctl ipam check`.
pub fn summary(r: &IpamReport) -> String {
    let mut out = String::from("Checking IPAM for inconsistencies...\n\n");
    let _ = writeln!(
        out,
        "Found {} active IP allocations and {} workload endpoints.",
        r.allocations_checked, r.endpoints_checked
    );
    let _ = writeln!(
        out,
        "Found {} IPs allocated but not in use.",
        r.allocated_not_in_use.len()
    );
    for l in &r.allocated_not_in_use {
        let _ = writeln!(
            out,
            "  {} handle {} node {} (block {})",
            l.ip, l.handle, l.node, l.block
        );
    }
    let _ = writeln!(
        out,
        "Found {} IPs in use but not allocated.",
        r.in_use_not_allocated.len()
    );
    for u in &r.in_use_not_allocated {
        match &u.allocated_to {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "  {} used by {} on {} but allocated to handle {h}",
                    u.ip, u.endpoint, u.node
                );
            }
            None => {
                let _ = writeln!(out, "  {} used by {} on {}", u.ip, u.endpoint, u.node);
            }
        }
    }
    let _ = writeln!(
        out,
        "Found {} IPs used by more than one endpoint.",
        r.duplicates.len()
    );
    for d in &r.duplicates {
        let _ = writeln!(out, "  {}: {}", d.ip, d.endpoints.join(", "));
    }
    // Only when there are any: the summary of a sound store reads as calicoctl's.
    if !r.unreadable_addresses.is_empty() {
        let _ = writeln!(
            out,
            "Found {} endpoint addresses that are not CIDRs.",
            r.unreadable_addresses.len()
        );
        for b in &r.unreadable_addresses {
            let _ = writeln!(out, "  {b}");
        }
    }
    let _ = writeln!(out, "Check complete; found {} problems.", r.problems());
    out
}

/// What a release did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    pub released: Vec<IpAddr>,
    /// Listed addresses left alone, with why.
    pub skipped: Vec<(IpAddr, String)>,
}

fn to_allocation(l: &LeakedAllocation) -> Allocation {
    Allocation {
        ip: l.ip,
        handle: Some(l.handle.clone()),
        attrs: AllocationAttrs {
            namespace: l.namespace.clone(),
            pod: l.pod.clone(),
            node: l.node.clone(),
            container_id: l.container_id.clone(),
            ifname: String::new(),
        },
        block: l.block,
        sequence_number: l.sequence_number,
    }
}

/// Releases exactly the leaked allocations listed in `report` that a fresh check still finds
/// leaked (same address, handle and sequence number); the release itself re-checks the
/// sequence number in its compare-and-swap.
pub fn release_from_report(
    store: &dyn Store,
    ipam: &Ipam,
    report: &IpamReport,
) -> Result<ReleaseOutcome, AuditError> {
    let fresh = check(store, ipam)?;
    let still: HashSet<(IpAddr, &str, u64)> = fresh
        .allocated_not_in_use
        .iter()
        .map(|l| (l.ip, l.handle.as_str(), l.sequence_number))
        .collect();
    let mut out = ReleaseOutcome::default();
    let mut todo = Vec::new();
    for l in &report.allocated_not_in_use {
        if still.contains(&(l.ip, l.handle.as_str(), l.sequence_number)) {
            todo.push(to_allocation(l));
        } else {
            out.skipped.push((
                l.ip,
                "no longer leaked (in use, released or reallocated since the report)".into(),
            ));
        }
    }
    let released = ipam.release_allocations(&todo)?;
    for a in &todo {
        if !released.contains(&a.ip) {
            out.skipped
                .push((a.ip, "changed while releasing; left alone".into()));
        }
    }
    out.released = released;
    Ok(out)
}

/// Releases one address, refusing when an endpoint uses it. Returns the handle it was
/// allocated to.
pub fn release_ip(
    store: &dyn Store,
    ipam: &Ipam,
    ip: IpAddr,
) -> Result<Option<String>, AuditError> {
    let alloc = ipam
        .allocations(None)?
        .into_iter()
        .find(|a| a.ip == ip)
        .ok_or(AuditError::NotAssigned(ip))?;
    for e in list_endpoints(store)? {
        for b in &e.bad_ip_networks {
            log::warn!("releasing {ip}: {b}; it may stand for this address");
        }
        let uses = e.ip_networks.iter().any(|n| n.addr() == ip);
        if uses && !e.delegated_ipam {
            return Err(AuditError::InUse {
                ip,
                endpoint: e.label(),
            });
        }
    }
    let released = ipam.release_allocations(std::slice::from_ref(&alloc))?;
    if released.is_empty() {
        // Reallocated between the read and the release: not ours to free.
        return Err(AuditError::NotAssigned(ip));
    }
    if let Some(h) = &alloc.handle
        && ipam.ips_by_handle(h)?.is_empty()
    {
        delete_owner(store, &alloc.attrs.node, h)?;
    }
    Ok(alloc.handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ip: &str, handle: &str, seq: u64) -> Allocation {
        Allocation {
            ip: ip.parse().unwrap(),
            handle: Some(handle.into()),
            attrs: AllocationAttrs {
                node: "n1".into(),
                ..Default::default()
            },
            block: "10.0.0.0/26".parse().unwrap(),
            sequence_number: seq,
        }
    }

    fn ep(cid: &str, ip: &str) -> EndpointUse {
        EndpointUse {
            node: "n1".into(),
            attachment: Attachment {
                network: "net".into(),
                container_id: cid.into(),
                ifname: "eth0".into(),
                ..Default::default()
            },
            ip_networks: vec![format!("{ip}/32").parse().unwrap()],
            bad_ip_networks: vec![],
            delegated_ipam: false,
        }
    }

    #[test]
    fn finds_each_kind_of_problem() {
        let allocs = vec![
            alloc("10.0.0.1", "net:eth0.a", 1),
            alloc("10.0.0.2", "net:eth0.leaked", 2),
            alloc("10.0.0.3", "net:eth0.ipamonly", 3),
            alloc("10.0.0.4", "net:eth0.other", 4),
        ];
        let eps = vec![
            ep("a", "10.0.0.1"),
            ep("b", "10.0.0.9"),
            ep("c", "10.0.0.4"),
            ep("d", "10.0.0.1"),
        ];
        let owners: HashSet<String> = ["net:eth0.ipamonly".to_string()].into();
        let r = compare(&allocs, &eps, &owners);
        assert_eq!(r.allocations_checked, 4);
        assert_eq!(r.endpoints_checked, 4);
        let leaked: Vec<String> = r
            .allocated_not_in_use
            .iter()
            .map(|l| l.handle.clone())
            .collect();
        assert_eq!(leaked, vec!["net:eth0.leaked", "net:eth0.other"]);
        let unalloc: Vec<(String, Option<String>)> = r
            .in_use_not_allocated
            .iter()
            .map(|u| (u.ip.to_string(), u.allocated_to.clone()))
            .collect();
        assert_eq!(
            unalloc,
            vec![
                ("10.0.0.1".to_string(), Some("net:eth0.a".to_string())),
                ("10.0.0.4".to_string(), Some("net:eth0.other".to_string())),
                ("10.0.0.9".to_string(), None),
            ]
        );
        assert_eq!(r.duplicates.len(), 1);
        assert_eq!(r.duplicates[0].endpoints.len(), 2);
        assert_eq!(r.problems(), 6);
        let s = summary(&r);
        assert!(s.contains("Found 2 IPs allocated but not in use.\n"), "{s}");
        assert!(s.contains("Found 3 IPs in use but not allocated.\n"), "{s}");
        assert!(
            s.contains("Found 1 IPs used by more than one endpoint.\n"),
            "{s}"
        );
        assert!(s.contains("Check complete; found 6 problems.\n"), "{s}");
        assert!(
            s.contains("  10.0.0.2 handle net:eth0.leaked node n1 (block 10.0.0.0/26)\n"),
            "{s}"
        );
    }

    #[test]
    fn clean_report_and_json_round_trip() {
        let r = compare(
            &[alloc("10.0.0.1", "net:eth0.a", 1)],
            &[ep("a", "10.0.0.1")],
            &HashSet::new(),
        );
        assert_eq!(r.problems(), 0);
        assert!(summary(&r).contains("found 0 problems"));
        let leaky = compare(&[alloc("10.0.0.2", "net:eth0.x", 7)], &[], &HashSet::new());
        let json = serde_json::to_string(&leaky).unwrap();
        assert!(json.contains("\"allocatedNotInUse\""), "{json}");
        assert!(json.contains("\"sequenceNumber\":7"), "{json}");
        assert!(!json.contains("unreadableAddresses"), "{json}");
        let back: IpamReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, leaky);
    }

    /// On a store that derives endpoints from Pods: an allocation is in use when the Pod of
    /// its namespace and name holds its address; one made for no pod is never reported; a
    /// pod's address held for another pod is reported, as is a pod address nobody holds.
    #[test]
    fn derived_endpoints_are_matched_by_pod_and_address() {
        let for_pod = |ip: &str, handle: &str, pod: &str| {
            let mut a = alloc(ip, handle, 1);
            a.attrs.namespace = "prod".into();
            a.attrs.pod = pod.into();
            a
        };
        let derived = |pod: &str, ip: &str| {
            let mut e = ep("", ip);
            e.attachment.network = String::new();
            e.attachment.pod = Some(PodRef {
                namespace: "prod".into(),
                name: pod.into(),
                ..Default::default()
            });
            e
        };
        let allocs = vec![
            for_pod("10.0.0.1", "net:eth0.c1", "web"),
            for_pod("10.0.0.2", "net:eth0.c2", "gone"),
            alloc("10.0.0.3", "net:eth0.bare", 3),
            for_pod("10.0.0.4", "net:eth0.c4", "db"),
        ];
        let eps = vec![
            derived("web", "10.0.0.1"),
            derived("api", "10.0.0.4"),
            derived("cache", "10.0.0.9"),
        ];
        let r = compare_with(&allocs, &eps, &HashSet::new(), true);
        let leaked: Vec<&str> = r
            .allocated_not_in_use
            .iter()
            .map(|l| l.pod.as_str())
            .collect();
        assert_eq!(leaked, ["gone", "db"], "{r:?}");
        let unalloc: Vec<(String, Option<String>)> = r
            .in_use_not_allocated
            .iter()
            .map(|u| (u.ip.to_string(), u.allocated_to.clone()))
            .collect();
        assert_eq!(
            unalloc,
            [
                ("10.0.0.4".to_string(), Some("net:eth0.c4".to_string())),
                ("10.0.0.9".to_string(), None)
            ]
        );
        // The same endpoints read as full records (not derived) match nothing by handle.
        let plain = compare(&allocs, &eps, &HashSet::new());
        assert_eq!(plain.allocated_not_in_use.len(), 4, "{plain:?}");
    }

    /// A WorkloadEndpoint document as the agent stores it (every field, labels, ports and
    /// annotations included) is read with its address typed; a record with an entry that is
    /// not a CIDR keeps its other address and the check reports the entry by record and value.
    #[test]
    fn stored_endpoints_decode_and_bad_addresses_are_reported_by_name() {
        let store = tern_store::mem::MemStore::new();
        let doc = |name: &str, nets: &str| {
            format!(
                r#"{{"apiVersion":"tern.dev/v1","kind":"WorkloadEndpoint",
                "metadata":{{"name":"{name}","namespace":"prod",
                  "labels":{{"app":"web","tern.dev/namespace":"prod"}},
                  "annotations":{{"tern.dev/netns":"/var/run/netns/x"}}}},
                "spec":{{"node":"n1","orchestrator":"k8s","pod":"{name}","containerID":"c-{name}",
                  "endpoint":"eth0","interfaceName":"tern0123","mac":"ee:ee:ee:ee:ee:ee",
                  "ipNetworks":{nets},"network":"net",
                  "ports":[{{"name":"web","protocol":"TCP","port":80}}]}}}}"#
            )
        };
        let put = |name: &str, nets: &str| {
            let key = keys::namespaced_resource("WorkloadEndpoint", "prod", name);
            store.put(&key, doc(name, nets).as_bytes()).unwrap();
        };
        put("web", r#"["10.0.0.1/32","fd00::1/128"]"#);
        put("odd", r#"["10.0.0.2/32","10.0.0.300/32"]"#);
        let eps = list_endpoints(&store).unwrap();
        let by_pod = |pod: &str| {
            eps.iter()
                .find(|e| e.attachment.pod.as_ref().unwrap().name == pod)
                .unwrap()
        };
        let web = by_pod("web");
        assert_eq!(
            web.ip_networks,
            [
                "10.0.0.1/32".parse::<IpNet>().unwrap(),
                "fd00::1/128".parse().unwrap()
            ]
        );
        assert!(web.bad_ip_networks.is_empty());
        assert_eq!(web.attachment.handle(), "net:eth0.c-web");
        let odd = by_pod("odd");
        assert_eq!(odd.ip_networks, ["10.0.0.2/32".parse::<IpNet>().unwrap()]);

        let mut allocs = vec![alloc("10.0.0.1", "net:eth0.c-web", 1)];
        allocs.push(alloc("10.0.0.2", "net:eth0.c-odd", 2));
        let r = compare(&allocs, &eps, &HashSet::new());
        assert_eq!(
            r.unreadable_addresses,
            [BadIpNetwork {
                endpoint: "prod/odd".into(),
                value: "10.0.0.300/32".into(),
            }]
        );
        assert_eq!(r.problems(), 2, "{r:?}"); // and fd00::1, allocated nowhere
        let s = summary(&r);
        assert!(
            s.contains(
                "Found 1 endpoint addresses that are not CIDRs.\n  \
                 WorkloadEndpoint prod/odd: ipNetworks entry \"10.0.0.300/32\" is not a CIDR\n"
            ),
            "{s}"
        );
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.contains(
                r#""unreadableAddresses":[{"endpoint":"prod/odd","value":"10.0.0.300/32"}]"#
            ),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<IpamReport>(&json).unwrap(), r);
    }

    /// A pod added before handles were unambiguous holds its address under the legacy
    /// handle: accepted when the allocation was made for that container and interface, and
    /// reported when the legacy handle belongs to another attachment.
    #[test]
    fn legacy_handles_of_the_same_attachment_are_in_use() {
        let legacy = |ip: &str, cid: &str, ifname: &str| {
            let mut a = alloc(ip, "net.x.net1", 1);
            a.attrs.container_id = cid.into();
            a.attrs.ifname = ifname.into();
            a
        };
        let mut x_net1 = ep("x", "10.0.0.1");
        x_net1.attachment.ifname = "net1".into();
        let r = compare(
            &[legacy("10.0.0.1", "x", "net1")],
            &[x_net1],
            &HashSet::new(),
        );
        assert_eq!(r.problems(), 0, "{r:?}");
        // Same legacy string, but allocated for container x.net1's eth0: not this pod's.
        let mut x_net1 = ep("x", "10.0.0.1");
        x_net1.attachment.ifname = "net1".into();
        let r = compare(
            &[legacy("10.0.0.1", "x.net1", "eth0")],
            &[x_net1],
            &HashSet::new(),
        );
        assert_eq!(r.in_use_not_allocated.len(), 1, "{r:?}");
    }
}
