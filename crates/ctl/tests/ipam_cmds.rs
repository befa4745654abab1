//! `ternctl ipam check|release|configure|show` against a SQLite store holding real IPAM
//! allocations and WorkloadEndpoints (no kernel involved).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tern_agent::endpoints::{Endpoint, store_io};
use tern_api::{Attachment, PodRef};
use tern_ipam::{AllocationAttrs, AssignArgs, Ipam};
use tern_store::Store;

mod store_cmd;
use store_cmd::ternctl;

fn allocate(ipam: &Ipam, cid: &str, node: &str) -> std::net::IpAddr {
    ipam.auto_assign(&AssignArgs {
        handle: format!("k8s-pod-network.{cid}"),
        node: node.into(),
        attrs: AllocationAttrs {
            namespace: "default".into(),
            pod: format!("pod-{cid}"),
            node: node.into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
        },
        num_v4: 1,
        ..Default::default()
    })
    .unwrap()[0]
}

fn endpoint(store: &dyn Store, cid: &str, ip: std::net::IpAddr) {
    endpoint_of(store, cid, &[ip]);
}

/// A WorkloadEndpoint of pod `cid` on n1 with addresses `ips` (host routes).
fn endpoint_of(store: &dyn Store, cid: &str, ips: &[std::net::IpAddr]) {
    let ep = Endpoint {
        node: "n1".into(),
        attachment: Attachment {
            network: "k8s-pod-network".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            netns_path: "/run/netns/x".into(),
            pod: Some(PodRef {
                namespace: "default".into(),
                name: format!("pod-{cid}"),
                infra_container_id: String::new(),
                uid: String::new(),
            }),
        },
        host_ifname: format!("tern{cid}"),
        mac: Some(tern_model::MacAddr([0xee, 0xee, 0xee, 0xee, 0xee, 0x01])),
        ip_networks: ips.iter().map(|&ip| ipnet::IpNet::from(ip)).collect(),
        labels: BTreeMap::new(),
        ports: Vec::new(),
        delegated_ipam: false,
    };
    store_io::put(store, &ep).unwrap();
}

#[test]
fn check_release_configure_show() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let url = format!("sqlite://{}", db.display());
    let store: Arc<dyn Store> = tern_store::open(&url).unwrap();
    let ipam = Ipam::new(store.clone());
    assert!(ipam.ensure_default_pool("10.90.0.0/24").unwrap());
    let used = allocate(&ipam, "used", "n1");
    endpoint(&*store, "used", used);
    let leaked = allocate(&ipam, "leaked", "n1");
    endpoint(&*store, "ghost", "10.90.0.200".parse().unwrap());

    let report = dir.path().join("report.json");
    let (code, out, err) = ternctl(&url, &["ipam", "check", "-o", report.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("Found 1 IPs allocated but not in use.\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("  {leaked} handle k8s-pod-network.leaked node n1")),
        "{out}"
    );
    assert!(
        out.contains("Found 1 IPs in use but not allocated.\n"),
        "{out}"
    );
    assert!(
        out.contains("Found 0 IPs used by more than one endpoint.\n"),
        "{out}"
    );
    assert!(Path::new(&report).is_file());

    // An address in use is never released.
    let (code, _, err) = ternctl(&url, &["ipam", "release", "--ip", &used.to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("in use by endpoint"), "{err}");

    let (code, out, err) = ternctl(
        &url,
        &["ipam", "release", "--from-report", report.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("Released {leaked}\n")), "{out}");
    assert!(
        out.contains("Released 1 IP addresses; skipped 0.\n"),
        "{out}"
    );
    assert!(
        ipam.ips_by_handle("k8s-pod-network.leaked")
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        ipam.ips_by_handle("k8s-pod-network.used").unwrap(),
        vec![used]
    );
    // Replaying the report releases nothing more.
    let (_, out, _) = ternctl(
        &url,
        &["ipam", "release", "--from-report", report.to_str().unwrap()],
    );
    assert!(
        out.contains("Released 0 IP addresses; skipped 1.\n"),
        "{out}"
    );

    let (_, out, _) = ternctl(&url, &["ipam", "show", "--ip", &used.to_string()]);
    assert!(out.contains(&format!("IP {used} is in use")), "{out}");
    assert!(out.contains("pod: pod-used"), "{out}");

    let (code, out, err) = ternctl(
        &url,
        &[
            "ipam",
            "configure",
            "--strictaffinity=true",
            "--max-blocks-per-host",
            "3",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Successfully set IPAM configuration."),
        "{out}"
    );
    let (_, out, _) = ternctl(&url, &["ipam", "show", "--show-configuration"]);
    assert!(out.contains("| StrictAffinity   |  true |"), "{out}");
    assert!(out.contains("| MaxBlocksPerHost |     3 |"), "{out}");

    // n1 may hold one block: once it is full, n1 borrows from n2's block.
    ternctl(
        &url,
        &[
            "ipam",
            "configure",
            "--strictaffinity=false",
            "--max-blocks-per-host",
            "1",
        ],
    );
    let n2_ip = allocate(&ipam, "other", "n2");
    let own_block = ipnet::IpNet::new(used, 26).unwrap().trunc();
    let lent = (0..70)
        .map(|i| allocate(&ipam, &format!("fill{i}"), "n1"))
        .find(|ip| !own_block.contains(ip))
        .expect("n1 borrowed an address");
    assert!(
        ipnet::IpNet::new(n2_ip, 26)
            .unwrap()
            .trunc()
            .contains(&lent)
    );
    let (code, out, err) = ternctl(&url, &["ipam", "show", "--show-borrowed"]);
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.contains(&format!("| {lent} ")))
        .unwrap_or_else(|| panic!("{lent} not listed:\n{out}"));
    assert!(row.contains("| n1 "), "{row}");
    assert!(row.contains("| n2 "), "{row}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("| 10.")).count(),
        1,
        "{out}"
    );

    let (code, out, _) = ternctl(&url, &["ipam", "show", "--show-blocks"]);
    assert_eq!(code, 0);
    assert!(out.contains("| IP Pool  | 10.90.0.0/24"), "{out}");
    assert!(out.contains("| Block    |"), "{out}");
}

/// Issue 22: the IPAM commands over an IPv4 and an IPv6 pool (/122 blocks) with dual-stack
/// pods: `ipam show --show-blocks` lists both pools and their blocks, `ipam show --ip` an IPv6
/// address's owner, `ipam check` finds a leaked dual-stack allocation's two addresses and
/// `ipam release --from-report` gives both back.
#[test]
fn ipam_commands_in_both_families() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store: Arc<dyn Store> = tern_store::open(&url).unwrap();
    let ipam = Ipam::new(store.clone());
    assert!(ipam.ensure_default_pool("10.91.0.0/24").unwrap());
    let mut spec = tern_model::IpPoolSpec::new("fd00:91::/120");
    spec.block_size = 122;
    tern_model::put_resource(&*store, &tern_model::IpPool::new("v6", spec).into()).unwrap();
    let dual = |cid: &str| {
        ipam.auto_assign(&AssignArgs {
            handle: format!("k8s-pod-network.{cid}"),
            node: "n1".into(),
            attrs: AllocationAttrs {
                namespace: "default".into(),
                pod: format!("pod-{cid}"),
                node: "n1".into(),
                container_id: cid.into(),
                ifname: "eth0".into(),
            },
            num_v4: 1,
            num_v6: 1,
            ..Default::default()
        })
        .unwrap()
    };
    let used = dual("used");
    assert!(used[1].is_ipv6(), "{used:?}");
    endpoint_of(&*store, "used", &used);
    let leaked = dual("leaked");

    let (code, out, err) = ternctl(&url, &["ipam", "show", "--show-blocks"]);
    assert_eq!(code, 0, "{err}");
    let row = |what: &str| {
        out.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what} not listed:\n{out}"))
            .to_string()
    };
    assert!(
        row("| IP Pool  | fd00:91::/120").contains("| 2 (1%)"),
        "{out}"
    );
    let block6 = tern_ipam::Ipam::new(store.clone())
        .blocks()
        .unwrap()
        .into_iter()
        .find(|b| b.cidr.addr().is_ipv6())
        .unwrap()
        .cidr;
    assert_eq!(block6.prefix_len(), 122);
    assert!(
        row(&format!("| Block    | {block6} ")).contains(" 64 | 2 (3%)"),
        "{out}"
    );
    assert!(
        row("| IP Pool  | 10.91.0.0/24").contains("| 2 (1%)"),
        "{out}"
    );

    let (_, out, _) = ternctl(&url, &["ipam", "show", "--ip", &used[1].to_string()]);
    assert!(out.contains(&format!("IP {} is in use", used[1])), "{out}");
    assert!(out.contains("pod: pod-used"), "{out}");
    assert!(out.contains(&format!("block: {block6}")), "{out}");

    let report = dir.path().join("report.json");
    let (code, out, err) = ternctl(&url, &["ipam", "check", "-o", report.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("Found 2 IPs allocated but not in use.\n"),
        "{out}"
    );
    for ip in &leaked {
        assert!(
            out.contains(&format!("  {ip} handle k8s-pod-network.leaked node n1")),
            "{out}"
        );
    }
    let (code, out, err) = ternctl(
        &url,
        &["ipam", "release", "--from-report", report.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Released 2 IP addresses; skipped 0.\n"),
        "{out}"
    );
    assert!(
        ipam.ips_by_handle("k8s-pod-network.leaked")
            .unwrap()
            .is_empty()
    );
    assert_eq!(ipam.ips_by_handle("k8s-pod-network.used").unwrap(), used);
}

/// `datastore migrate` locks its source first and leaves it locked (an agent still on it
/// allocates nothing the copy lacks), the copy unlocked; `datastore lock`/`unlock` do it by
/// hand; `ipam show --show-configuration` shows the lock while it is set.
#[test]
fn migrate_locks_its_source_and_unlock_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (
        format!("sqlite://{}", dir.path().join("src.db").display()),
        format!("sqlite://{}", dir.path().join("dst.db").display()),
    );
    let s = tern_store::open(&src).unwrap();
    let ipam = Ipam::new(s.clone());
    ipam.ensure_default_pool("10.77.0.0/24").unwrap();
    let ip = allocate(&ipam, "c1", "n1");
    let (code, out, err) = ternctl(
        &src,
        &["datastore", "migrate", "--from", &src, "--to", &dst],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("locked") && out.contains("migrated"), "{out}");
    // The source refuses changes; the copy serves (and holds the allocation).
    let e = Ipam::new(s.clone())
        .auto_assign(&AssignArgs {
            handle: "h2".into(),
            node: "n1".into(),
            num_v4: 1,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(e, tern_ipam::IpamError::Locked(_)), "{e}");
    let (_, shown, _) = ternctl(&src, &["ipam", "show", "--show-configuration"]);
    assert!(shown.contains("MigrationLock"), "{shown}");
    let d = tern_store::open(&dst).unwrap();
    assert_eq!(Ipam::new(d.clone()).config().unwrap().migration_lock, None);
    assert_eq!(
        Ipam::new(d).ips_by_handle("k8s-pod-network.c1").unwrap(),
        [ip]
    );
    // By hand: unlock, lock with a reason, unlock.
    let (code, out, err) = ternctl(&src, &["datastore", "unlock"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(Ipam::new(s.clone()).config().unwrap().migration_lock, None);
    let (code, out, err) = ternctl(&src, &["datastore", "lock", "--reason", "moving to etcd"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        Ipam::new(s.clone())
            .config()
            .unwrap()
            .migration_lock
            .as_deref(),
        Some("moving to etcd")
    );
    assert!(matches!(
        Ipam::new(s.clone()).release_by_handle("k8s-pod-network.c1"),
        Err(tern_ipam::IpamError::Locked(_))
    ));
    ternctl(&src, &["datastore", "unlock"]);
    assert_eq!(
        Ipam::new(s)
            .release_by_handle("k8s-pod-network.c1")
            .unwrap(),
        [ip]
    );
}
