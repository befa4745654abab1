//! Unambiguous identities and deletion by name, against a real agent in a fresh network
//! namespace (nothing outside it is touched):
//!
//! - attachments whose old dotted names collided (`x.net1`/eth0 and `x`/net1, dotted network
//!   names and container IDs) get distinct handles and veths, and releasing one leaves the other;
//! - allocations made before the upgrade under the old handle form are still released by DEL,
//!   standalone IPAM DEL, the journal and GC, kept by leak repair and accepted by CHECK, and an
//!   old handle that belongs to another attachment is never taken for this one's;
//! - the journal replay deletes only tern's pod veths: a bridge (or a veth without the prefix)
//!   named by a journal entry survives.

mod common;

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tern_agent::Agent;
use tern_agent::endpoints::Endpoint;
use tern_api::journal::{self, JournalEntry};
use tern_api::{AddRequest, Attachment, DelRequest, GcRequest, PodRef, Reply, Request, Response};
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_store::Store;

const NET: &str = "k8s-pod-network";

struct Setup {
    agent: Arc<Agent>,
    store: Arc<dyn Store>,
    ipam: Ipam,
    dir: tempfile::TempDir,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.agent.shutdown();
    }
}

/// Runs `test` against a fresh agent (leak grace `grace` seconds) in a fresh network namespace;
/// needs root (tern-testkit).
fn with_agent(grace: u64, test: impl FnOnce(&Setup) + Send) {
    tern_testkit::need_root();
    tern_linux::netns::run_in_new(|| test(&setup(grace))).unwrap();
}

fn setup(grace: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(tern_store::sqlite::SqliteStore::open(dir.path().join("s.db")).unwrap());
    let mut cfg = common::agent_config(dir.path(), "test://sqlite", "10.78.0.0/24");
    cfg.resync_seconds = 3600;
    cfg.leak_grace_seconds = grace;
    let agent = Agent::start_with_store(cfg, store.clone()).unwrap();
    Setup {
        agent,
        ipam: Ipam::new(store.clone()),
        store,
        dir,
    }
}

fn att(network: &str, cid: &str, ifname: &str, pod: Option<&str>) -> Attachment {
    Attachment {
        network: network.into(),
        container_id: cid.into(),
        ifname: ifname.into(),
        netns_path: String::new(),
        pod: pod.map(|p| PodRef {
            namespace: "default".into(),
            name: p.into(),
            infra_container_id: String::new(),
            ..Default::default()
        }),
    }
}

fn add(s: &Setup, a: &Attachment, ns: &tern_linux::netns::NetNs) -> Response {
    let fd: OwnedFd = ns.as_fd().try_clone_to_owned().unwrap();
    s.agent
        .handle(Request::Add(AddRequest::new(a.clone())), Some(fd))
}

fn del(s: &Setup, a: &Attachment) -> Response {
    s.agent.handle(
        Request::Del(DelRequest {
            attachment: a.clone(),
            delegated_ipam: false,
        }),
        None,
    )
}

fn result_of(r: &Response) -> (std::net::IpAddr, String) {
    match r {
        Ok(Reply::Result(res)) => (
            res.ips[0].address.parse::<ipnet::IpNet>().unwrap().addr(),
            res.interfaces[0].name.clone(),
        ),
        other => panic!("expected a result, got {other:?}"),
    }
}

/// Records an endpoint of this node as the agent would (the agent's cache does not know it).
fn put_endpoint(
    s: &Setup,
    attachment: Attachment,
    host_ifname: &str,
    ip_networks: Vec<String>,
    delegated_ipam: bool,
) {
    let ep = Endpoint {
        node: "n1".into(),
        attachment,
        host_ifname: host_ifname.into(),
        mac: None,
        ip_networks: ip_networks.iter().map(|n| n.parse().unwrap()).collect(),
        labels: Default::default(),
        ports: Vec::new(),
        delegated_ipam,
    };
    tern_agent::endpoints::store_io::put(&*s.store, &ep).unwrap();
}

/// Journals the plugin's release of `attachment` (host veth `host_ifname`), as when ternd is
/// down.
fn journal_release(s: &Setup, attachment: Attachment, host_ifname: &str) {
    let entry = JournalEntry {
        attachment,
        host_ifname: host_ifname.into(),
        delegated_ipam: false,
        source: "plugin".into(),
    };
    journal::record(&s.dir.path().join("state"), &entry).unwrap();
}

/// A reconciliation pass that must report no error; it completes `journaled` journal entries.
fn reconcile_clean(s: &Setup, journaled: usize) {
    let r = s.agent.reconcile();
    assert!(r.errors.is_empty(), "{r}");
    assert_eq!(r.journal_completed, journaled, "{r}");
}

/// GC of network NET keeping the attachments `valid`.
fn gc(s: &Setup, valid: Vec<(String, String)>) -> Response {
    s.agent.handle(
        Request::Gc(GcRequest {
            network: NET.into(),
            valid,
            delegated_ipam: false,
        }),
        None,
    )
}

/// The addresses held under `handle`.
fn held(s: &Setup, handle: &str) -> Vec<std::net::IpAddr> {
    s.ipam.ips_by_handle(handle).unwrap()
}

/// Whether link `name` is gone within a second (the reaper deletes veths in the background).
fn gone_soon(name: &str) -> bool {
    (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !link_exists(name)
    })
}

fn link_exists(name: &str) -> bool {
    tern_linux::netlink::Handle::new()
        .unwrap()
        .link_by_name(name)
        .unwrap()
        .is_some()
}

/// Allocates one address under `handle` as an agent before the upgrade did (attributes of
/// the attachment, this node).
fn allocate_old(s: &Setup, handle: &str, cid: &str, ifname: &str) -> std::net::IpAddr {
    let ips = s
        .ipam
        .auto_assign(&AssignArgs {
            handle: handle.into(),
            node: "n1".into(),
            attrs: AllocationAttrs {
                namespace: "default".into(),
                pod: format!("pod-{cid}"),
                node: "n1".into(),
                container_id: cid.into(),
                ifname: ifname.into(),
            },
            num_v4: 1,
            num_v6: 0,
            v4_pools: vec![],
            v6_pools: vec![],
        })
        .unwrap();
    ips[0]
}

#[test]
fn colliding_names_get_distinct_handles_and_veths() {
    with_agent(3600, |s| {
        // Pod x.net1's eth0 and pod x's net1: one handle (`n.x.net1`) and one veth
        // (sha1("default.x.net1")) before.
        let a = att(NET, "x.net1", "eth0", Some("x.net1"));
        let b = att(NET, "x", "net1", Some("x"));
        // Dotted network vs dotted container ID: `a.b.c` for both before.
        let c = att("a.b", "c", "eth0", Some("pc"));
        let d = att("a", "b.c", "eth0", Some("pd"));
        let all = [&a, &b, &c, &d];
        let handles: std::collections::HashSet<String> = all.iter().map(|x| x.handle()).collect();
        assert_eq!(handles.len(), 4, "{handles:?}");
        assert_eq!(a.legacy_handle(), b.legacy_handle());
        assert_eq!(c.legacy_handle(), d.legacy_handle());

        let pods: Vec<_> = (0..4)
            .map(|_| tern_linux::netns::new_anonymous().unwrap())
            .collect();
        let mut got = Vec::new();
        for (x, ns) in all.iter().zip(&pods) {
            let r = add(s, x, ns);
            got.push(result_of(&r));
        }
        let veths: std::collections::HashSet<&String> = got.iter().map(|g| &g.1).collect();
        let ips: std::collections::HashSet<_> = got.iter().map(|g| g.0).collect();
        assert_eq!(veths.len(), 4, "{got:?}");
        assert_eq!(ips.len(), 4, "{got:?}");
        for (x, (ip, veth)) in all.iter().zip(&got) {
            assert_eq!(held(s, &x.handle()), vec![*ip]);
            assert!(link_exists(veth), "{veth}");
        }
        // `ternctl ipam check`'s audit: nothing used twice, nothing unallocated.
        let report = tern_agent::audit::check(&*s.store, &s.ipam).unwrap();
        assert_eq!(report.problems(), 0, "{report:?}");

        // Releasing b and d leaves a and c wired and allocated.
        assert_eq!(del(s, &b), Ok(Reply::Done));
        assert_eq!(del(s, &d), Ok(Reply::Done));
        for (i, x) in all.iter().enumerate() {
            let kept = held(s, &x.handle());
            if i % 2 == 0 {
                assert_eq!(kept, vec![got[i].0], "{} lost its address", x.handle());
                assert!(link_exists(&got[i].1), "{} lost its veth", got[i].1);
            } else {
                assert!(kept.is_empty());
            }
        }
        let report = tern_agent::audit::check(&*s.store, &s.ipam).unwrap();
        assert_eq!(report.problems(), 0, "{report:?}");
        assert_eq!(del(s, &a), Ok(Reply::Done));
        assert_eq!(del(s, &c), Ok(Reply::Done));
    });
}

#[test]
fn allocations_under_old_handles_are_still_released_and_never_confused() {
    with_agent(0, |s| {
        // A pod added before the upgrade (no endpoint: its ADD predates it or it died).
        let old = att(NET, "old1", "eth0", None);
        let ip_old = allocate_old(s, &old.legacy_handle(), "old1", "eth0");
        assert_eq!(
            s.agent.handle(Request::IpamCheck(old.clone()), None),
            Ok(Reply::Done)
        );
        assert_eq!(del(s, &old), Ok(Reply::Done));
        assert!(
            held(s, &old.legacy_handle()).is_empty(),
            "DEL did not release the old-format handle"
        );
        assert!(
            !s.ipam
                .allocations(None)
                .unwrap()
                .iter()
                .any(|a| a.ip == ip_old)
        );

        // `ternctl ipam release <ip>` of an old-format allocation.
        let by_ip = att(NET, "old7", "eth0", None);
        let ip7 = allocate_old(s, &by_ip.legacy_handle(), "old7", "eth0");
        assert_eq!(
            tern_agent::audit::release_ip(&*s.store, &s.ipam, ip7).unwrap(),
            Some(by_ip.legacy_handle())
        );
        assert!(held(s, &by_ip.legacy_handle()).is_empty());

        // Standalone IPAM with an owner record under the old handle.
        let ipam_only = att(NET, "old2", "eth0", None);
        allocate_old(s, &ipam_only.legacy_handle(), "old2", "eth0");
        tern_agent::owners::record_owner(
            &*s.store,
            &tern_agent::owners::OwnerRecord {
                handle: ipam_only.legacy_handle(),
                node: "n1".into(),
                network: NET.into(),
                container_id: "old2".into(),
                ifname: "eth0".into(),
                netns: String::new(),
            },
        )
        .unwrap();
        assert_eq!(
            s.agent.handle(Request::IpamDel(ipam_only.clone()), None),
            Ok(Reply::Done)
        );
        assert!(held(s, &ipam_only.legacy_handle()).is_empty());
        assert!(
            !tern_agent::owners::list_owners(&*s.store, Some("n1"))
                .unwrap()
                .contains_key(&ipam_only.legacy_handle())
        );

        // The old handle `n.x.net1` of container x.net1's eth0 is not container x's net1.
        let x_net1 = att(NET, "x.net1", "eth0", None);
        let ip_x_net1 = allocate_old(s, &x_net1.legacy_handle(), "x.net1", "eth0");
        let x = att(NET, "x", "net1", None);
        assert_eq!(x.legacy_handle(), x_net1.legacy_handle());
        assert_eq!(del(s, &x), Ok(Reply::Done));
        assert_eq!(
            held(s, &x_net1.legacy_handle()),
            vec![ip_x_net1],
            "another attachment's DEL released an old handle it shares a spelling with"
        );
        assert!(
            s.agent.handle(Request::IpamCheck(x.clone()), None).is_err(),
            "CHECK accepted another attachment's address"
        );

        // A journaled DEL from before the upgrade completes against the old handle.
        let journaled = att(NET, "old3", "eth0", None);
        allocate_old(s, &journaled.legacy_handle(), "old3", "eth0");
        journal_release(s, journaled.clone(), "");
        reconcile_clean(s, 1);
        assert!(held(s, &journaled.legacy_handle()).is_empty());

        // GC: an old handle of this network not in `valid` goes; one of network
        // `k8s-pod-network.x` (same prefix `k8s-pod-network.` in the old form) stays.
        let gone = att(NET, "old4", "eth0", None);
        allocate_old(s, &gone.legacy_handle(), "old4", "eth0");
        let other_net = att("k8s-pod-network.x", "old5", "eth0", None);
        let ip_other = allocate_old(s, &other_net.legacy_handle(), "old5", "eth0");
        let r = gc(s, vec![("x.net1".into(), "eth0".into())]);
        assert_eq!(r, Ok(Reply::Done));
        assert!(held(s, &gone.legacy_handle()).is_empty());
        assert_eq!(
            held(s, &other_net.legacy_handle()),
            vec![ip_other],
            "GC of {NET} released an allocation of another network"
        );
        assert_eq!(held(s, &x_net1.legacy_handle()), vec![ip_x_net1]);

        // Leak repair (grace 0) keeps the old-format allocation of a live endpoint.
        let live = att(NET, "old6", "eth0", Some("live"));
        let ip_live = allocate_old(s, &live.legacy_handle(), "old6", "eth0");
        put_endpoint(
            s,
            live.clone(),
            "ternlive0000001",
            vec![format!("{ip_live}/32")],
            false,
        );
        // Not in the agent's endpoint cache: repair re-reads the store before releasing.
        for _ in 0..2 {
            let lr = s.agent.repair_leaks();
            assert!(!lr.released.contains(&ip_live), "{lr:?}");
        }
        assert_eq!(held(s, &live.legacy_handle()), vec![ip_live]);
        let report = tern_agent::audit::check(&*s.store, &s.ipam).unwrap();
        assert!(report.in_use_not_allocated.is_empty(), "{report:?}");
    });
}

#[test]
fn journal_replay_deletes_only_tern_pod_veths() {
    with_agent(3600, |s| {
        let mut h = tern_linux::netlink::Handle::new().unwrap();
        // A bridge carrying tern's prefix, and a veth without it, each named by an entry.
        h.create_bridge("ternb0000000001").unwrap();
        h.create_veth("other0", "other1", here().as_fd(), 0)
            .unwrap();
        // And a real pod whose veth the journal names: that one goes.
        let pod = tern_linux::netns::new_anonymous().unwrap();
        let real = att(NET, "real", "eth0", Some("real"));
        let (_, real_veth) = result_of(&add(s, &real, &pod));
        for (cid, ifname) in [
            ("bridge", "ternb0000000001"),
            ("plain", "other0"),
            ("real", real_veth.as_str()),
        ] {
            journal_release(s, att(NET, cid, "eth0", Some(cid)), ifname);
        }
        reconcile_clean(s, 3);
        assert!(link_exists("ternb0000000001"), "the bridge was deleted");
        assert!(
            link_exists("other0"),
            "a veth without the prefix was deleted"
        );
        let gone = gone_soon(&real_veth);
        assert!(
            gone,
            "the pod veth {real_veth} named by the journal was not deleted"
        );
        // The start-up / periodic sweep leaves the bridge alone too.
        let r = s.agent.reconcile();
        assert!(r.errors.is_empty(), "{r}");
        assert!(link_exists("ternb0000000001"));
        // A DEL whose computed veth name is taken by a bridge leaves the bridge.
        let a = att(NET, "brpod", "eth0", Some("brpod"));
        let name =
            tern_linux::attachment_veth_name("tern", Some(("default", "brpod")), "brpod", "eth0");
        h.create_bridge(&name).unwrap();
        assert_eq!(del(s, &a), Ok(Reply::Done));
        std::thread::sleep(Duration::from_millis(100));
        assert!(link_exists(&name), "DEL deleted bridge {name}");
    });
}

fn here() -> tern_linux::netns::NetNs {
    tern_linux::netns::NetNs::open(std::path::Path::new("/proc/thread-self/ns/net")).unwrap()
}

/// F2: a DEL for an old sandbox of a pod (a container ID with no endpoint) must not delete the
/// veth of the pod's current sandbox, which has the same derived name; nor may a journaled
/// release of the old sandbox, replayed later.
#[test]
fn a_stale_sandbox_del_keeps_the_live_sandboxs_veth() {
    with_agent(3600, |s| {
        let pod = tern_linux::netns::new_anonymous().unwrap();
        let b = att(NET, "sandbox-b", "eth0", Some("web-0"));
        let (ip_b, veth_b) = result_of(&add(s, &b, &pod));
        // The runtime retries the teardown of sandbox A (same pod, old container ID).
        let a = att(NET, "sandbox-a", "eth0", Some("web-0"));
        assert_eq!(
            tern_linux::attachment_veth_name("tern", Some(("default", "web-0")), "x", "eth0"),
            veth_b
        );
        assert_eq!(del(s, &a), Ok(Reply::Done));
        std::thread::sleep(Duration::from_millis(200));
        assert!(link_exists(&veth_b), "a stale DEL deleted {veth_b}");
        assert_eq!(held(s, &b.handle()), vec![ip_b]);
        // A journaled release of A naming that veth (the plugin's entry while ternd was down).
        journal_release(s, a.clone(), &veth_b);
        reconcile_clean(s, 1);
        assert!(link_exists(&veth_b), "the journal replay deleted {veth_b}");
        // Nor did A's DEL delete B's endpoint document (same pod, same document name).
        let stored = tern_agent::endpoints::store_io::list(&*s.store, "n1").unwrap();
        assert!(
            stored
                .iter()
                .any(|e| e.attachment.container_id == "sandbox-b"),
            "sandbox B's endpoint was deleted: {stored:?}"
        );
        // B's own DEL still removes it.
        assert_eq!(del(s, &b), Ok(Reply::Done));
        let gone = gone_soon(&veth_b);
        assert!(gone, "{veth_b} outlived its DEL");
    });
}

/// F6: GC deletes an endpoint's interface only when it is one of tern's pod veths: an endpoint
/// record naming `cni0` (a bridge) does not cost the node that bridge.
#[test]
fn gc_leaves_a_device_that_is_not_a_tern_veth() {
    with_agent(3600, |s| {
        let mut h = tern_linux::netlink::Handle::new().unwrap();
        h.create_bridge("cni0").unwrap();
        let victim = att(NET, "hostile", "eth0", Some("hostile"));
        put_endpoint(s, victim.clone(), "cni0", vec![], true);
        let _ = s.agent.reconcile(); // picks the endpoint up
        let r = gc(s, vec![]);
        assert!(r.is_ok(), "{r:?}");
        assert!(link_exists("cni0"), "GC deleted the bridge cni0");
    });
}

/// F7: the repair of an endpoint whose interface is missing opens its stored netns path
/// without blocking and never wires into the node's own namespace: a FIFO and the agent's own
/// namespace are refused promptly, and nothing is created.
#[test]
fn repair_refuses_a_fifo_and_the_nodes_own_namespace() {
    with_agent(3600, |s| {
        let fifo = s.dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // SAFETY: gettid has no preconditions.
        let own = format!("/proc/{}/task/{}/ns/net", std::process::id(), unsafe {
            libc::gettid()
        });
        for (cid, path, ifname, veth) in [
            (
                "fifo",
                fifo.to_str().unwrap().to_string(),
                "eth7",
                "tern00000000f1f",
            ),
            ("own", own.clone(), "eth8", "tern00000000f2f"),
        ] {
            let mut a = att(NET, cid, ifname, Some(cid));
            a.netns_path = path;
            put_endpoint(s, a, veth, vec!["10.78.0.200/32".into()], true);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let agent = s.agent.clone();
        std::thread::spawn(move || {
            let _ = tx.send(agent.reconcile());
        });
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the reconciliation hung on a FIFO netns path");
        let text = r.to_string();
        assert!(
            text.contains("node's own network namespace"),
            "the own namespace was not refused: {text}"
        );
        for name in ["tern00000000f1f", "tern00000000f2f", "eth7", "eth8"] {
            assert!(!link_exists(name), "{name} was created in the node: {text}");
        }
    });
}

/// F3: when most of the node's pod veths have a live peer but no endpoint (the store forgot
/// them), the orphan pass keeps them, says so in /readiness, and still removes a half-made
/// pair whose peer is in the node's own namespace.
#[test]
fn the_orphan_pass_refuses_a_mass_deletion_of_live_pods() {
    with_agent(3600, |s| {
        let mut h = tern_linux::netlink::Handle::new().unwrap();
        let pods: Vec<_> = (0..3)
            .map(|_| tern_linux::netns::new_anonymous().unwrap())
            .collect();
        let live = ["tern0000000a001", "tern0000000a002", "tern0000000a003"];
        for (name, ns) in live.iter().zip(&pods) {
            h.create_veth(name, "eth0", ns.as_fd(), 0).unwrap();
        }
        h.create_veth("tern0000000b001", "halfpeer", here().as_fd(), 0)
            .unwrap();
        let r = s.agent.reconcile();
        for name in live {
            assert!(
                link_exists(name),
                "a live pod's veth {name} was deleted: {r}"
            );
        }
        assert!(
            !link_exists("tern0000000b001"),
            "the half-made pair stayed: {r}"
        );
        assert!(r.to_string().contains("not deleting them"), "{r}");
        let problems = s.agent.readiness_problems().join("; ");
        assert!(
            problems.contains("3 of the node's 4 pod interfaces"),
            "{problems}"
        );
        // One unknown pod among known ones is an ordinary leftover: it goes, and the problem
        // clears.
        for (i, name) in live.iter().enumerate().skip(1) {
            let a = att(
                NET,
                &format!("known{i}"),
                "eth0",
                Some(&format!("known{i}")),
            );
            put_endpoint(s, a, name, vec![], true);
        }
        let r = s.agent.reconcile();
        assert!(!link_exists(live[0]), "{r}");
        assert!(link_exists(live[1]) && link_exists(live[2]), "{r}");
        assert!(s.agent.readiness_problems().is_empty(), "{r}");
    });
}
