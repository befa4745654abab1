//! The agent against a store that can be switched off, in a fresh network namespace (the
//! agent reconciles interfaces of its namespace; the root namespace is never touched):
//! store outage (ADD answers code 11, DEL journals, the journal is replayed when the store is
//! back), leak repair (orphans released after the grace period, live ones kept), metrics and
//! health over HTTP.

mod common;

use common::{attachment, lo_up};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tern_agent::Agent;
use tern_api::{AddRequest, IpamAddRequest, IpamRequest, Reply, Request, Response};
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_store::{KeyValue, Store, StoreError, Txn, TxnResponse, Watch};
use tern_testkit::wait::wait_until;

/// A store that answers `Unavailable` while `down` is set.
struct Flaky {
    inner: Arc<dyn Store>,
    down: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> tern_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable("test: store switched off".into()))
        } else {
            Ok(())
        }
    }
}

impl Store for Flaky {
    fn get(&self, key: &str) -> tern_store::Result<Option<KeyValue>> {
        self.check()?;
        self.inner.get(key)
    }
    fn range(&self, prefix: &str) -> tern_store::Result<(Vec<KeyValue>, i64)> {
        self.check()?;
        self.inner.range(prefix)
    }
    fn txn(&self, txn: Txn) -> tern_store::Result<TxnResponse> {
        self.check()?;
        self.inner.txn(txn)
    }
    fn revision(&self) -> tern_store::Result<i64> {
        self.check()?;
        self.inner.revision()
    }
    fn watch(&self, prefix: &str, after: i64) -> tern_store::Result<Box<dyn Watch>> {
        self.check()?;
        self.inner.watch(prefix, after)
    }
    fn lease_grant(&self, ttl: Duration) -> tern_store::Result<i64> {
        self.check()?;
        self.inner.lease_grant(ttl)
    }
    fn lease_keepalive(&self, lease: i64) -> tern_store::Result<()> {
        self.check()?;
        self.inner.lease_keepalive(lease)
    }
    fn lease_revoke(&self, lease: i64) -> tern_store::Result<()> {
        self.check()?;
        self.inner.lease_revoke(lease)
    }
}

fn ip_of(resp: &Response) -> std::net::IpAddr {
    match resp {
        Ok(Reply::Result(r)) => r.ips[0]
            .address
            .parse::<ipnet::IpNet>()
            .expect("address")
            .addr(),
        other => panic!("expected a result, got {other:?}"),
    }
}

struct Setup {
    agent: Arc<Agent>,
    store: Arc<dyn Store>,
    down: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

fn setup(resync: u64, grace: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn Store> =
        Arc::new(tern_store::sqlite::SqliteStore::open(dir.path().join("s.db")).unwrap());
    let down = Arc::new(AtomicBool::new(false));
    let store: Arc<dyn Store> = Arc::new(Flaky {
        inner: inner.clone(),
        down: down.clone(),
    });
    let mut cfg = common::agent_config(dir.path(), "test://flaky", "10.77.0.0/24");
    cfg.resync_seconds = resync;
    cfg.leak_grace_seconds = grace;
    cfg.metrics_addr = "127.0.0.1:0".into();
    cfg.health_addr = "127.0.0.1:0".into();
    let agent = Agent::start_with_store(cfg, store.clone()).unwrap();
    Setup {
        agent,
        store: inner,
        down,
        _dir: dir,
    }
}

/// Runs `test` in a fresh network namespace (needs root, tern-testkit) against an agent on the
/// switchable store (resync and leak grace in seconds), its IPAM and its HTTP listeners; shuts
/// the agent down afterwards.
fn with_agent(
    resync: u64,
    grace: u64,
    test: impl FnOnce(&Setup, &Ipam, &[std::net::SocketAddr]) + Send,
) {
    tern_testkit::need_root();
    tern_linux::netns::run_in_new(|| {
        lo_up();
        let s = setup(resync, grace);
        let ipam = Ipam::new(s.store.clone());
        let addrs = tern_agent::http::start_http(&s.agent);
        test(&s, &ipam, &addrs);
        s.agent.shutdown();
    })
    .unwrap();
}

/// GET `path` from the agent's listener at `addr`: (status, body).
fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    tern_testkit::ternd::http_get(addr, path, Duration::from_secs(10)).unwrap()
}

#[test]
fn outage_add_fails_with_11_del_is_journaled_and_replayed() {
    with_agent(1, 3600, |s, ipam, addrs| {
        assert_eq!(addrs.len(), 1, "one listener when both addresses are equal");
        assert_eq!(http_get(addrs[0], "/readiness").0, 200);

        let a = attachment("c-a", "/proc/self/ns/net");
        let r = s.agent.handle(
            Request::IpamAdd(IpamAddRequest {
                attachment: a.clone(),
                ipam: IpamRequest::default(),
            }),
            None,
        );
        let ip_a = ip_of(&r);
        assert_eq!(ipam.ips_by_handle(&a.handle()).unwrap(), vec![ip_a]);

        s.down.store(true, Ordering::SeqCst);
        // ADD: code 11 with a clear message, nothing created.
        let me: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")
            .unwrap()
            .into();
        let add = s.agent.handle(
            Request::Add(AddRequest::new(attachment("c-b", "/proc/self/ns/net"))),
            Some(me),
        );
        let e = add.unwrap_err();
        assert_eq!(e.code, 11, "{e:?}");
        assert!(e.msg.contains("datastore is unreachable"), "{}", e.msg);
        let e = s
            .agent
            .handle(
                Request::IpamAdd(IpamAddRequest {
                    attachment: attachment("c-c", ""),
                    ipam: IpamRequest::default(),
                }),
                None,
            )
            .unwrap_err();
        assert_eq!(e.code, 11, "{e:?}");
        let (code, body) = http_get(addrs[0], "/readiness");
        assert_eq!(code, 503);
        assert!(body.contains("datastore unreachable"), "{body}");
        let (code, metrics) = http_get(addrs[0], "/metrics");
        assert_eq!(code, 200);
        assert!(
            metrics.contains("tern_datastore_up{node=\"n1\"} 0"),
            "{metrics}"
        );

        // DEL succeeds: journaled.
        assert_eq!(
            s.agent.handle(Request::IpamDel(a.clone()), None),
            Ok(Reply::Done)
        );
        let journal = s.agent_state_journal();
        assert_eq!(journal, 1);
        assert_eq!(ipam.ips_by_handle(&a.handle()).unwrap(), vec![ip_a]);

        // Store back: the maintenance loop completes the release within a few seconds.
        s.down.store(false, Ordering::SeqCst);
        s.agent.start_maintenance().unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || ipam
                .ips_by_handle(&a.handle())
                .unwrap()
                .is_empty()
                && s.agent_state_journal() == 0),
            "journaled release not completed"
        );
        // Only the block gateway that standalone tern-ipam keeps for subnet-style results
        // remains (it is never released automatically).
        let owners = tern_agent::owners::list_owners(&*s.store, None).unwrap();
        assert!(
            owners
                .iter()
                .all(|(_, o)| o.handle.starts_with("tern-ipam-gateway.")),
            "{owners:?}"
        );
        assert_eq!(http_get(addrs[0], "/readiness").0, 200);
        assert_eq!(http_get(addrs[0], "/liveness").0, 200);
        let (_, metrics) = http_get(addrs[0], "/metrics");
        assert!(
            metrics.contains("tern_cni_requests_total{op=\"add\",result=\"error\"} 1\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("tern_cni_requests_total{op=\"ipam_del\",result=\"ok\"} 1\n"),
            "{metrics}"
        );
        assert_eq!(http_get(addrs[0], "/nope").0, 404);
    });
}

impl Setup {
    fn agent_state_journal(&self) -> usize {
        tern_api::journal::pending(&self._dir.path().join("state"))
            .unwrap()
            .len()
    }
}

/// One IPv4 address and `num_v6` IPv6 ones for `handle` on `node`, straight from IPAM (no
/// endpoint: an ADD that died, or another node's pod).
fn assign_outside_the_agent(
    ipam: &Ipam,
    handle: &str,
    node: &str,
    num_v6: usize,
) -> Vec<std::net::IpAddr> {
    ipam.auto_assign(&AssignArgs {
        handle: handle.into(),
        node: node.into(),
        attrs: AllocationAttrs {
            node: node.into(),
            container_id: handle.into(),
            ..Default::default()
        },
        num_v4: 1,
        num_v6,
        ..Default::default()
    })
    .unwrap()
}

/// Starts the agent's maintenance, waits until leak repair released `n` addresses, and
/// returns the addresses still allocated.
fn reclaimed(s: &Setup, ipam: &Ipam, n: u64) -> Vec<std::net::IpAddr> {
    s.agent.start_maintenance().unwrap();
    assert!(
        wait_until(Duration::from_secs(15), || s.agent.gc_reclamations() == n),
        "{n} addresses not reclaimed: {:?}",
        ipam.allocations(None).unwrap()
    );
    ipam.allocations(None)
        .unwrap()
        .iter()
        .map(|a| a.ip)
        .collect()
}

#[test]
fn leak_repair_releases_orphans_and_keeps_what_is_used() {
    with_agent(1, 2, |s, ipam, addrs| {
        // A real pod interface (endpoint recorded): must survive.
        let pod = tern_linux::netns::new_anonymous().unwrap();
        let pod_fd: OwnedFd = pod.as_fd().try_clone_to_owned().unwrap();
        let live = attachment("live", "/proc/self/ns/net");
        let r = s
            .agent
            .handle(Request::Add(AddRequest::new(live.clone())), Some(pod_fd));
        let live_ip = ip_of(&r);

        // Standalone tern-ipam allocations: one whose sandbox exists, one whose sandbox goes.
        let marker_dir = tempfile::tempdir().unwrap();
        let alive = marker_dir.path().join("alive");
        let gone = marker_dir.path().join("gone");
        std::fs::write(&alive, "").unwrap();
        std::fs::write(&gone, "").unwrap();
        let ipam_alive = attachment("ipam-alive", alive.to_str().unwrap());
        let ipam_gone = attachment("ipam-gone", gone.to_str().unwrap());
        for a in [&ipam_alive, &ipam_gone] {
            let r = s.agent.handle(
                Request::IpamAdd(IpamAddRequest {
                    attachment: a.clone(),
                    ipam: IpamRequest::default(),
                }),
                None,
            );
            ip_of(&r);
        }
        std::fs::remove_file(&gone).unwrap();

        // An ADD that died after allocating (no endpoint), and another node's allocation.
        let assign = |handle: &str, node: &str| assign_outside_the_agent(ipam, handle, node, 0)[0];
        let orphan_ip = assign("k8s-pod-network.crashed", "n1");
        let foreign_ip = assign("k8s-pod-network.elsewhere", "n2");

        // Not before the grace period.
        let first = s.agent.repair_leaks();
        assert_eq!(first.suspects, 2, "{first:?}");
        assert!(first.released.is_empty(), "{first:?}");

        let left = reclaimed(s, ipam, 2);
        assert!(left.contains(&live_ip));
        assert!(left.contains(&foreign_ip));
        assert!(!left.contains(&orphan_ip));
        assert!(ipam.ips_by_handle(&ipam_gone.handle()).unwrap().is_empty());
        assert_eq!(ipam.ips_by_handle(&ipam_alive.handle()).unwrap().len(), 1);
        let owners = tern_agent::owners::list_owners(&*s.store, Some("n1")).unwrap();
        assert!(owners.contains_key(&ipam_alive.handle()));
        assert!(!owners.contains_key(&ipam_gone.handle()));

        // Nothing else goes, however long we wait.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(s.agent.gc_reclamations(), 2);

        // The cluster check sees only the other node's allocation as unused.
        let report = tern_agent::audit::check(&*s.store, ipam).unwrap();
        let leaked: Vec<std::net::IpAddr> =
            report.allocated_not_in_use.iter().map(|l| l.ip).collect();
        assert_eq!(leaked, vec![foreign_ip], "{report:?}");
        assert!(report.in_use_not_allocated.is_empty(), "{report:?}");
        assert!(report.duplicates.is_empty(), "{report:?}");

        let (_, metrics) = http_get(addrs[0], "/metrics");
        assert!(
            metrics.contains("ipam_gc_reclamations{node=\"n1\"} 2\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("tern_endpoints{node=\"n1\"} 1\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains(
                // two pods' addresses and the block gateway of standalone tern-ipam
                "ipam_allocations_in_use{ippool=\"default-ipv4-ippool\",node=\"n1\"} 3\n"
            ),
            "{metrics}"
        );
        assert!(
            metrics.contains("ipam_blocks{ippool=\"default-ipv4-ippool\",node=\"n1\"} 1\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains(
                "ipam_allocations_borrowed{ippool=\"default-ipv4-ippool\",node=\"n1\"} 0\n"
            ),
            "{metrics}"
        );
        drop(pod);
    });
}

/// Issue 22: leak repair and the cluster check for IPv6 blocks. With an IPv6 pool beside the
/// IPv4 one, a dual-stack allocation whose ADD died (no endpoint) loses both its addresses
/// after the grace period; another node's dual-stack allocation keeps both and is what the
/// cluster check reports as allocated and unused.
#[test]
fn leak_repair_of_dual_stack_allocations_in_ipv6_blocks() {
    with_agent(1, 2, |s, ipam, _| {
        let mut spec = tern_model::IpPoolSpec::new("fd00:77::/120");
        spec.block_size = 122;
        tern_model::put_resource(&*s.store, &tern_model::IpPool::new("v6", spec).into()).unwrap();
        let assign = |handle: &str, node: &str| {
            let ips = assign_outside_the_agent(ipam, handle, node, 1);
            assert_eq!(
                ips.iter().map(|a| a.is_ipv6()).collect::<Vec<_>>(),
                [false, true],
                "{ips:?}"
            );
            ips
        };
        let orphan = assign("k8s-pod-network.crashed6", "n1");
        let foreign = assign("k8s-pod-network.elsewhere6", "n2");
        let blocks6: Vec<String> = ipam
            .blocks()
            .unwrap()
            .iter()
            .filter(|b| b.cidr.addr().is_ipv6())
            .map(|b| b.cidr.to_string())
            .collect();
        assert_eq!(blocks6.len(), 2, "one /122 per node: {blocks6:?}");

        // One reclamation per address: the orphan's two.
        let left = reclaimed(s, ipam, 2);
        assert!(orphan.iter().all(|ip| !left.contains(ip)), "{left:?}");
        assert!(foreign.iter().all(|ip| left.contains(ip)), "{left:?}");

        let report = tern_agent::audit::check(&*s.store, ipam).unwrap();
        let mut leaked: Vec<std::net::IpAddr> =
            report.allocated_not_in_use.iter().map(|l| l.ip).collect();
        leaked.sort();
        assert_eq!(leaked, foreign, "{report:?}");
        assert!(report.duplicates.is_empty(), "{report:?}");
    });
}
