//! The pod lifecycle on the in-memory kernel (`tern_linux::fake::FakeKernel`) and a real
//! SQLite store in a temporary directory, without root: ADD failing at every kernel call, at
//! the allocation, at the policy and at the endpoint record leaves nothing behind (no
//! allocation, no host interface, nothing in the pod's namespace, no route, no endpoint, no
//! claim), and the orphan sweep deletes only what no endpoint or ADD accounts for.

use super::*;
use crate::endpoints::Endpoints;
use ipnet::IpNet;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicUsize;
use tern_api::{AddRequest, PodRef, Reply};
use tern_linux::fake::{FakeKernel, Op};
use tern_linux::kernel::Routes;
use tern_linux::netns::NetNs;
use tern_store::testing::{Call, Hook, Hooked, Verdict};
use tern_store::{StoreError, sqlite::SqliteStore};

const NODE: &str = "n1";

/// Fails the next transaction whose text contains `.0` when armed (`.1` > 0).
#[derive(Default)]
struct FailTxn(Mutex<Option<String>>, AtomicUsize);

impl Hook for FailTxn {
    fn before(&self, call: &Call<'_>) -> Verdict {
        if let Call::Txn(t) = call {
            let mut armed = self.0.lock().unwrap();
            if armed
                .as_deref()
                .is_some_and(|needle| format!("{t:?}").contains(needle))
            {
                *armed = None;
                self.1.fetch_add(1, Ordering::Relaxed);
                return Verdict::Fail(StoreError::Unavailable("injected".into()));
            }
        }
        Verdict::Forward
    }
}

/// A policy service that refuses when told to, and keeps what it enforces.
#[derive(Default)]
struct FakePolicy {
    refuse: AtomicBool,
    enforced: Mutex<Vec<String>>,
}

impl EndpointPolicy for FakePolicy {
    fn endpoint_added(&self, ep: &Endpoint) -> Result<(), String> {
        // Part way: the rules are in before the refusal, as a failed batch may leave them.
        self.enforced.lock().unwrap().push(ep.name());
        if self.refuse.swap(false, Ordering::Relaxed) {
            return Err("policy refused (injected)".into());
        }
        Ok(())
    }
    fn endpoint_removed(&self, _namespace: &str, name: &str) -> Result<(), String> {
        self.enforced.lock().unwrap().retain(|n| n != name);
        Ok(())
    }
}

struct Rig {
    dir: tempfile::TempDir,
    k: FakeKernel,
    hook: Arc<Hooked<FailTxn>>,
    policy: Arc<FakePolicy>,
    pods: PodLifecycle,
    /// Stands in for the pod's namespace: the fake tells namespaces apart by the file.
    netns_file: std::fs::File,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let sqlite: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("store.db")).unwrap());
    let hook = Hooked::new(sqlite, FailTxn::default());
    let store: Arc<dyn Store> = hook.clone();
    Ipam::new(store.clone())
        .ensure_default_pool("10.244.0.0/16")
        .unwrap();
    let k = FakeKernel::new();
    k.add_device("eth0", 1500);
    let open = k.clone();
    let policy = Arc::new(FakePolicy::default());
    let pods = PodLifecycle::new(
        PodConfig {
            node_name: NODE.into(),
            interface_prefix: "tern".into(),
            state_dir: dir.path().join("state"),
            accept_new_store: false,
            leak_grace: Duration::from_secs(60),
        },
        PodParts {
            endpoints: Endpoints::load(store.clone(), NODE).unwrap(),
            store,
            kernel: Arc::new(move || Ok(Box::new(open.clone()) as Box<dyn PodKernel>)),
            policy: Some(policy.clone() as Arc<dyn EndpointPolicy>),
            pods: None,
            host_netns: vec![],
        },
    )
    .unwrap();
    let netns_file = std::fs::File::create(dir.path().join("netns")).unwrap();
    Rig {
        dir,
        k,
        hook,
        policy,
        pods,
        netns_file,
    }
}

fn attachment(cid: &str) -> Attachment {
    Attachment {
        network: "k8s-pod-network".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        netns_path: String::new(),
        pod: Some(PodRef {
            namespace: "default".into(),
            name: format!("web-{cid}"),
            ..Default::default()
        }),
    }
}

impl Rig {
    fn netns_fd(&self) -> OwnedFd {
        self.netns_file.try_clone().unwrap().into()
    }

    fn pod_ns(&self) -> FakeKernel {
        self.k.in_netns(&NetNs::from_fd(self.netns_fd()))
    }

    fn add(&self, cid: &str) -> tern_api::Response {
        let mut req = AddRequest::new(attachment(cid));
        req.labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        self.pods.add(req, Some(self.netns_fd()), 1450)
    }

    /// Every kernel call of one successful ADD, per op.
    fn calls(&self) -> BTreeMap<Op, usize> {
        ALL_OPS.iter().map(|op| (*op, self.k.calls(*op))).collect()
    }

    /// Nothing of ADD `cid` remains anywhere.
    fn assert_clean(&self, cid: &str, why: &str) {
        let a = attachment(cid);
        let host_if = self.pods.host_ifname(&a);
        assert!(self.k.link(&host_if).is_none(), "{why}: host veth left");
        let names: Vec<String> = self.k.all_links().into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["lo", "eth0"], "{why}: host links");
        let pod: Vec<String> = self
            .pod_ns()
            .all_links()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert_eq!(pod, ["lo"], "{why}: links in the pod's namespace");
        assert!(self.k.all_routes().is_empty(), "{why}: host routes left");
        assert!(
            self.pod_ns().all_routes().is_empty(),
            "{why}: pod routes left"
        );
        let allocs = self.pods.ipam.allocations(Some(NODE)).unwrap();
        assert!(allocs.is_empty(), "{why}: allocations left: {allocs:?}");
        assert!(self.pods.endpoints().is_empty(), "{why}: endpoint cached");
        let stored = self.pods.endpoints.list_stored().unwrap();
        assert!(stored.is_empty(), "{why}: endpoint stored");
        assert!(!self.pods.in_flight.contains(&host_if), "{why}: claim held");
        assert!(
            !self.pods.in_flight_handles.contains(&a.handle()),
            "{why}: handle held"
        );
        assert!(
            self.policy.enforced.lock().unwrap().is_empty(),
            "{why}: policy left"
        );
    }
}

const ALL_OPS: &[Op] = &[
    Op::LinkList,
    Op::LinkAdd,
    Op::LinkDel,
    Op::LinkSet,
    Op::AddrList,
    Op::AddrAdd,
    Op::RouteList,
    Op::RouteAdd,
    Op::RouteDel,
    Op::SysctlSet,
    Op::NetnsEnter,
];

/// A successful ADD on the fake: the pair spans the two namespaces, the pod has its address
/// and default route, the node its /32 route, IPAM the allocation, the store the endpoint.
#[test]
fn add_wires_both_namespaces_and_records() {
    let r = rig();
    let Ok(Reply::Result(res)) = r.add("c1") else {
        panic!("ADD failed: {:?}", r.add("c1"));
    };
    let host_if = r.pods.host_ifname(&attachment("c1"));
    let host = r.k.link(&host_if).expect("host veth");
    assert_eq!(host.kind.as_deref(), Some("veth"));
    assert!(host.up && host.link_netnsid.is_some());
    assert_eq!(host.mtu, 1450);
    assert_eq!(
        r.k.sysctl(&format!("net/ipv4/conf/{host_if}/proxy_arp"))
            .as_deref(),
        Some("1")
    );
    let ip: IpNet = res.ips[0].address.parse().unwrap();
    let eth0 = r.pod_ns().link("eth0").expect("pod interface");
    assert!(r.pod_ns().all_addresses().contains(&(eth0.index, ip)));
    assert_eq!(r.pod_ns().routes_to("0.0.0.0/0".parse().unwrap()).len(), 1);
    assert_eq!(r.k.routes_to(ip)[0].oif, Some(host.index));
    assert_eq!(r.pods.ipam.allocations(Some(NODE)).unwrap().len(), 1);
    assert_eq!(r.pods.endpoints.list_stored().unwrap().len(), 1);
    assert!(!r.pods.in_flight.contains(&host_if));
    assert_eq!(r.policy.enforced.lock().unwrap().len(), 1);
}

/// ADD failing at each kernel call it makes, in turn: every failure is an error and leaves
/// nothing behind, and the ADD succeeds when retried.
#[test]
fn add_failing_at_any_kernel_call_leaves_nothing() {
    let probe = rig();
    let before = probe.calls();
    probe.add("c0").expect("the probe ADD succeeds");
    let made: Vec<(Op, usize)> = probe
        .calls()
        .into_iter()
        .map(|(op, n)| (op, n - before[&op]))
        .filter(|(_, n)| *n > 0)
        .collect();
    // The ADD's kernel calls: veth creation, lookups, sysctls, the namespace visit, links up,
    // the address, the routes inside the pod and on the node.
    for op in [
        Op::LinkAdd,
        Op::LinkList,
        Op::SysctlSet,
        Op::NetnsEnter,
        Op::LinkSet,
        Op::AddrAdd,
        Op::RouteList,
        Op::RouteAdd,
    ] {
        assert!(
            made.iter().any(|(o, _)| *o == op),
            "{op:?} not called: {made:?}"
        );
    }
    let mut failed = 0;
    for (op, n) in made {
        for nth in 1..=n {
            let r = rig();
            r.k.fail_nth(op, nth, libc::EIO);
            let e = r.add("c1").expect_err("ADD with a failing kernel call");
            r.assert_clean("c1", &format!("{op:?} call {nth} failing ({})", e.msg));
            r.k.clear_failures();
            r.add("c1")
                .unwrap_or_else(|e| panic!("retry after {op:?} #{nth}: {}", e.msg));
            failed += 1;
        }
    }
    assert!(failed >= 10, "only {failed} kernel calls were failed");
}

/// The allocation failing (the store down), the policy refusing and the endpoint record
/// failing: nothing is left, and the store's failure is "try again" (11).
#[test]
fn add_failing_at_ipam_policy_or_record_leaves_nothing() {
    // The allocation: IPAM's first write.
    let r = rig();
    *r.hook.hook.0.lock().unwrap() = Some("ipam".into());
    let e = r.add("c1").expect_err("allocation fails");
    assert_eq!(r.hook.hook.1.load(Ordering::Relaxed), 1);
    assert_eq!(e.code, tern_cni::code::TRY_AGAIN_LATER, "{}", e.msg);
    r.assert_clean("c1", "allocation failing");
    r.add("c1").expect("retry");

    let r = rig();
    r.policy.refuse.store(true, Ordering::Relaxed);
    let e = r.add("c1").expect_err("policy refuses");
    assert!(e.msg.contains("policy refused"), "{}", e.msg);
    r.assert_clean("c1", "policy refusing");

    // The endpoint record: the last step, after the kernel is fully wired.
    let r = rig();
    *r.hook.hook.0.lock().unwrap() = Some("workloadendpoint".into());
    let e = r.add("c1").expect_err("record fails");
    assert_eq!(
        r.hook.hook.1.load(Ordering::Relaxed),
        1,
        "record not attempted"
    );
    assert_eq!(e.code, tern_cni::code::TRY_AGAIN_LATER, "{}", e.msg);
    assert!(e.msg.contains("recording the endpoint"), "{}", e.msg);
    r.assert_clean("c1", "endpoint record failing");
    r.add("c1").expect("retry");
}

/// The orphan sweep deletes a pod veth of tern's with no endpoint, and keeps one an ADD has
/// claimed, one with an endpoint, and every device that is not a pod veth of tern's; with an
/// untrusted store it deletes nothing.
#[test]
fn orphan_sweep_deletes_only_orphans() {
    let r = rig();
    r.add("c1").expect("ADD");
    let owned = r.pods.host_ifname(&attachment("c1"));
    let orphan = "tern0123456789a";
    let in_flight = "ternfedcba98765";
    r.k.add_link(orphan, "veth", true);
    r.k.add_link(in_flight, "veth", true);
    r.k.add_link("cali0123456789a", "veth", true);
    r.k.add_link("tern0123456789b", "bridge", true);

    let mut rep = Report::default();
    r.pods.sweep_interfaces(&mut rep, 1500, &|| false);
    assert!(
        r.k.link(orphan).is_some(),
        "deleted with an untrusted store"
    );
    assert_eq!(rep.interfaces_removed, 0);

    let claim = r.pods.in_flight.claim(in_flight, Duration::ZERO).unwrap();
    let mut rep = Report::default();
    r.pods.sweep_interfaces(&mut rep, 1500, &|| true);
    assert!(r.k.link(orphan).is_none(), "orphan kept: {rep}");
    assert_eq!(rep.interfaces_removed, 1, "{rep}");
    assert!(rep.errors.is_empty(), "{rep}");
    assert!(r.k.link(in_flight).is_some(), "in-flight interface deleted");
    assert!(
        r.k.link(&owned).is_some(),
        "interface of an endpoint deleted"
    );
    assert!(r.pod_ns().link("eth0").is_some());
    assert!(r.k.link("cali0123456789a").is_some());
    assert!(r.k.link("tern0123456789b").is_some());
    drop(claim);
    // Once its ADD let go without recording an endpoint, it is an orphan too.
    let mut rep = Report::default();
    r.pods.sweep_interfaces(&mut rep, 1500, &|| true);
    assert!(r.k.link(in_flight).is_none(), "{rep}");
    assert!(r.k.link(&owned).is_some());
}

/// A DEL after an ADD on the fake gives the address back, deletes the endpoint, and the reaper
/// deletes the veth pair on the same kernel.
#[test]
fn del_after_add_releases_and_deletes() {
    let r = rig();
    r.add("c1").expect("ADD");
    let a = attachment("c1");
    let host_if = r.pods.host_ifname(&a);
    r.pods
        .del(tern_api::DelRequest {
            attachment: a.clone(),
            delegated_ipam: false,
        })
        .expect("DEL");
    assert!(r.pods.reaper.wait_gone(&host_if, Duration::from_secs(5)));
    r.assert_clean("c1", "after DEL");
}

/// An endpoint whose interface vanished and whose network namespace is gone (no path) is
/// released by the sweep: its address back in IPAM, its record deleted; one whose interface
/// is there is left alone.
#[test]
fn sweep_releases_an_endpoint_whose_interface_and_netns_are_gone() {
    let r = rig();
    r.add("c1").expect("ADD c1");
    // Another pod, in a namespace of its own.
    let other = std::fs::File::create(r.dir.path().join("netns2")).unwrap();
    r.pods
        .add(AddRequest::new(attachment("c2")), Some(other.into()), 1450)
        .expect("ADD c2");
    let gone = r.pods.host_ifname(&attachment("c1"));
    r.k.clone().delete_link(&gone).unwrap();
    let mut rep = Report::default();
    r.pods.sweep_interfaces(&mut rep, 1500, &|| true);
    assert_eq!(rep.endpoints_released, 1, "{rep}");
    assert_eq!(rep.interfaces_removed, 0, "{rep}");
    let left: Vec<String> = r
        .pods
        .endpoints()
        .into_iter()
        .map(|e| e.attachment.container_id)
        .collect();
    assert_eq!(left, ["c2"]);
    let allocs = r.pods.ipam.allocations(Some(NODE)).unwrap();
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    assert_eq!(allocs[0].attrs.container_id, "c2");
    assert!(r.k.link(&r.pods.host_ifname(&attachment("c2"))).is_some());
}

/// CHECK on the fake: passes after ADD, fails naming what is missing once the node's route to
/// the pod is gone, and once IPAM no longer holds the address.
#[test]
fn check_finds_what_add_made_and_names_what_is_missing() {
    let r = rig();
    let Ok(Reply::Result(res)) = r.add("c1") else {
        panic!("ADD failed");
    };
    let check = || {
        r.pods.check(
            tern_api::CheckRequest {
                attachment: attachment("c1"),
                prev_result: Some(res.clone()),
            },
            Some(r.netns_fd()),
        )
    };
    check().expect("CHECK after ADD");
    let ip: IpNet = res.ips[0].address.parse().unwrap();
    let route = r.k.routes_to(ip).remove(0);
    r.k.clone().delete_route_full(&route).unwrap();
    let e = check().expect_err("CHECK without the host route");
    assert_eq!(e.code, tern_cni::code::CHECK_FAILED);
    assert!(e.msg.contains("host route"), "{}", e.msg);
    r.k.clone().replace_route_full(&route).unwrap();
    check().expect("CHECK with the route back");
    r.pods
        .ipam
        .release_by_handle(&attachment("c1").handle())
        .unwrap();
    let e = check().expect_err("CHECK without the allocation");
    assert!(e.msg.contains("not allocated"), "{}", e.msg);
}

/// A standalone IPAM ADD undoes through the same guard: the allocation failing deletes the
/// owner record written before it; a success keeps both, and the handle is let go.
#[test]
fn ipam_add_failing_at_the_allocation_keeps_no_owner_record() {
    let r = rig();
    let req = || tern_api::IpamAddRequest {
        attachment: attachment("c1"),
        ipam: IpamRequest::default(),
    };
    let owners = || crate::owners::list_owners(&*r.pods.store, Some(NODE)).unwrap();
    *r.hook.hook.0.lock().unwrap() = Some("ipam/blocks".into());
    let e = r.pods.ipam_add(req()).expect_err("allocation fails");
    assert_eq!(r.hook.hook.1.load(Ordering::Relaxed), 1, "{}", e.msg);
    assert!(owners().is_empty(), "owner record left: {:?}", owners());
    assert!(r.pods.ipam.allocations(Some(NODE)).unwrap().is_empty());
    let handle = attachment("c1").handle();
    assert!(!r.pods.in_flight_handles.contains(&handle));
    r.pods.ipam_add(req()).expect("retry");
    assert!(owners().contains_key(&handle));
    assert!(!r.pods.in_flight_handles.contains(&handle));
}
