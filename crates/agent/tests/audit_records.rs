//! The IPAM audit lives in `tern-ipam` (so `ternctl` needs no agent) and reads the records the
//! agent writes with its own functions. These tests write endpoints and owner records through
//! the agent's writers and check that the audit reads them exactly as the agent does, and that
//! `tern_agent::audit` is the same module as `tern_ipam::audit`.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use tern_agent::endpoints::{Endpoint, store_io};
use tern_agent::owners::{OwnerRecord, list_owners, owner_key, record_owner};
use tern_api::{Attachment, PodRef};
use tern_ipam::{AllocationAttrs, Ipam};
use tern_model::{IpPool, IpPoolSpec, put_resource};
use tern_store::Store;
use tern_store::mem::MemStore;

fn endpoint(node: &str, cid: &str, ifname: &str, pod: Option<(&str, &str)>, ip: &str) -> Endpoint {
    Endpoint {
        node: node.into(),
        attachment: Attachment {
            network: "k8s-pod-network".into(),
            container_id: cid.into(),
            ifname: ifname.into(),
            netns_path: format!("/var/run/netns/{cid}"),
            pod: pod.map(|(namespace, name)| PodRef {
                namespace: namespace.into(),
                name: name.into(),
                infra_container_id: cid.into(),
                uid: format!("uid-{cid}"),
            }),
        },
        host_ifname: format!("tern{cid}"),
        mac: Some(tern_model::MacAddr([0xee; 6])),
        ip_networks: vec![format!("{ip}/32").parse().unwrap()],
        labels: BTreeMap::from([("app".to_string(), "web".to_string())]),
        ports: Vec::new(),
        delegated_ipam: false,
    }
}

/// Endpoints of several shapes (pod and bare container, dashes that the name escapes, a
/// second interface, delegated IPAM, two nodes) and owner records, all written by the agent.
fn agent_records(store: &dyn Store) -> Vec<Endpoint> {
    let mut delegated = endpoint("node-b", "c4", "eth0", None, "10.0.0.4");
    delegated.delegated_ipam = true;
    let eps = vec![
        endpoint("node-a", "c1", "eth0", Some(("prod", "web-1")), "10.0.0.1"),
        endpoint(
            "node-a",
            "c-2",
            "net1",
            Some(("kube-system", "dns")),
            "10.0.0.2",
        ),
        endpoint("node-b", "c3-x", "eth0", None, "10.0.0.3"),
        delegated,
    ];
    for e in &eps {
        store_io::put(store, e).unwrap();
    }
    for (node, handle) in [("node-a", "net:eth0.owned"), ("node-b", "net:eth0.other")] {
        record_owner(
            store,
            &OwnerRecord {
                handle: handle.into(),
                node: node.into(),
                network: "net".into(),
                container_id: "x".into(),
                ifname: "eth0".into(),
                netns: String::new(),
            },
        )
        .unwrap();
    }
    eps
}

#[test]
fn audit_reads_endpoints_and_owner_records_as_the_agent_does() {
    let store = MemStore::new();
    agent_records(&store);
    let mut agent: Vec<(String, String, Vec<String>, bool, String)> = store_io::list_all(&store)
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                format!("{}/{}", e.namespace(), e.name()),
                e.attachment.handle(),
                e.ip_networks.iter().map(|n| n.to_string()).collect(),
                e.delegated_ipam,
                e.attachment.legacy_handle(),
            )
        })
        .collect();
    let mut audit: Vec<(String, String, Vec<String>, bool, String)> =
        tern_ipam::audit::list_endpoints(&store)
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.label(),
                    e.attachment.handle(),
                    e.ip_networks.iter().map(|n| n.to_string()).collect(),
                    e.delegated_ipam,
                    e.attachment.legacy_handle(),
                )
            })
            .collect();
    agent.sort();
    audit.sort();
    assert_eq!(agent.len(), 4);
    assert_eq!(audit, agent);
    assert!(
        audit.iter().any(|a| a.0 == "prod/node--a-k8s-web--1-eth0"),
        "{audit:?}"
    );
    assert!(
        audit
            .iter()
            .any(|a| a.0 == "default/node--b-cni-c3--x-eth0"),
        "{audit:?}"
    );

    let owners: HashSet<String> = list_owners(&store, None).unwrap().into_keys().collect();
    assert_eq!(tern_ipam::audit::owner_handles(&store).unwrap(), owners);
    assert_eq!(owners.len(), 2);
    // The key layout the audit deletes under is the agent's.
    assert_eq!(
        tern_store::keys::owner("node-a", "net:eth0.owned"),
        owner_key("node-a", "net:eth0.owned")
    );
}

#[test]
fn check_and_release_over_agent_records() {
    let store: Arc<dyn Store> = Arc::new(MemStore::new());
    put_resource(
        &*store,
        &IpPool::new("p", IpPoolSpec::new("10.0.0.0/24")).into(),
    )
    .unwrap();
    let ipam = Ipam::new(store.clone());
    let eps = agent_records(&*store);
    let assign = |ip: &str, handle: &str, node: &str| {
        let ip: IpAddr = ip.parse().unwrap();
        let attrs = AllocationAttrs {
            node: node.into(),
            ..Default::default()
        };
        ipam.assign_ip(ip, handle, &attrs).unwrap();
        ip
    };
    // Held by the first endpoint under its handle: in use.
    assign("10.0.0.1", &eps[0].attachment.handle(), "node-a");
    // Held by an owner record's handle: in use (checked on the node).
    assign("10.0.0.20", "net:eth0.owned", "node-a");
    // Nobody's: leaked.
    let leaked = assign("10.0.0.30", "net:eth0.gone", "node-b");

    // The re-export is the same module: its report type is tern_ipam's.
    let report: tern_ipam::audit::IpamReport = tern_agent::audit::check(&*store, &ipam).unwrap();
    assert_eq!(report.allocations_checked, 3);
    assert_eq!(report.endpoints_checked, 4);
    let leaked_ips: Vec<IpAddr> = report.allocated_not_in_use.iter().map(|l| l.ip).collect();
    assert_eq!(leaked_ips, vec![leaked]);
    // Endpoints 2 and 3 hold addresses IPAM never gave them; the delegated one is not counted.
    let unallocated: Vec<String> = report
        .in_use_not_allocated
        .iter()
        .map(|u| u.endpoint.clone())
        .collect();
    assert_eq!(
        unallocated,
        vec![
            "kube-system/node--a-k8s-dns-net1".to_string(),
            "default/node--b-cni-c3--x-eth0".to_string(),
        ]
    );

    // Releasing an endpoint's address is refused, naming the endpoint.
    let err = tern_ipam::audit::release_ip(&*store, &ipam, "10.0.0.1".parse().unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("prod/node--a-k8s-web--1-eth0"), "{err}");
    // Releasing the owner-held address frees it and deletes its owner record.
    let handle =
        tern_ipam::audit::release_ip(&*store, &ipam, "10.0.0.20".parse().unwrap()).unwrap();
    assert_eq!(handle.as_deref(), Some("net:eth0.owned"));
    assert!(
        store
            .get(&owner_key("node-a", "net:eth0.owned"))
            .unwrap()
            .is_none()
    );
    assert_eq!(list_owners(&*store, None).unwrap().len(), 1);
    // The report's leak is released; a second release of the same report does nothing.
    let out = tern_ipam::audit::release_from_report(&*store, &ipam, &report).unwrap();
    assert_eq!(out.released, vec![leaked]);
    let again = tern_ipam::audit::release_from_report(&*store, &ipam, &report).unwrap();
    assert!(again.released.is_empty());
    assert_eq!(again.skipped.len(), 1);
}
