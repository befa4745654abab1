//! Node prerequisites: the sysctls tern's dataplane needs, checked at start and every resync and
//! (unless `--no-set-sysctls`) set.
//!
//! - `net.ipv4.ip_forward=1`: without it a node delivers to its own pods (their host veths
//!   forward) but routes nothing between its underlay and its pods, so cross-node traffic is
//!   silently dropped. Distributions ship 0.
//! - `net.ipv6.conf.all.forwarding=1` when an IPv6 pool exists (Felix does the same when IPv6
//!   is enabled). Note it makes the kernel ignore router advertisements on interfaces with
//!   `accept_ra=1`.
//! - Reverse-path filtering on `vxlan.tern` (and `tunl0`) not strict. The kernel applies
//!   `max(conf.all.rp_filter, conf.<dev>.rp_filter)`, so with a strict `all` (1, as several
//!   distributions ship) zeroing the device alone changes nothing; setting the device to 2
//!   (loose) makes the effective value loose whatever `all` is, without relaxing `all` (and so
//!   every other interface) the way Cilium does. Strict filtering breaks VXLAN whenever the
//!   route back to a remote pod leaves by another interface than its packets came in on
//!   (cross-subnet pools, a route being moved between the tunnel and the underlay). Felix,
//!   for comparison, sets strict `rp_filter=1` on each workload interface as anti-spoofing;
//!   tern keeps anti-spoofing in its nftables chains and leaves workload interfaces alone.
//!   `vxlan-v6.tern` (IPv6 pools over an IPv6 underlay) has no such requirement: IPv6 has no
//!   reverse-path sysctl (the kernel's IPv6 stack does no rp_filter), and the IPv4 one on that
//!   device never sees a packet, since only IPv6 travels inside it; its requirement is the
//!   IPv6 forwarding above, which its IPv6 pool already brings.
//!
//! What cannot be met is logged as a warning (once per change), reported in `/readiness`
//! (HTTP 503 naming the sysctl) and exported as `tern_host_prerequisite_ok`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use tern_linux::sysctl;
use tern_store::Store;

use crate::metrics::exposition::Page;

/// The state of every prerequisite at the last check.
#[derive(Debug, Default)]
pub struct HostState {
    /// Dotted sysctl name → problem (None when met).
    checks: Mutex<BTreeMap<String, Option<String>>>,
}

impl HostState {
    /// The prerequisites not met at the last check, as readiness reasons.
    pub fn problems(&self) -> Vec<String> {
        self.lock().values().filter_map(|p| p.clone()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Option<String>>> {
        self.checks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Prometheus lines: one `tern_host_prerequisite_ok` gauge per sysctl checked.
    pub fn render_metrics(&self, node: &str, page: &mut Page) {
        let checks = self.lock();
        if checks.is_empty() {
            return;
        }
        let mut f = page.gauge(
            "tern_host_prerequisite_ok",
            "Whether a node prerequisite (sysctl) tern needs is met.",
        );
        for (name, problem) in checks.iter() {
            f.sample(&[("node", node), ("sysctl", name)], problem.is_none());
        }
    }
}

/// One sysctl tern needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// Dotted name for messages (`net.ipv4.ip_forward`); interface names may contain dots, so
    /// `key` is the slash form.
    pub name: String,
    pub key: String,
    /// The value written when the current one is not acceptable.
    pub want: String,
    /// Values that already satisfy the requirement.
    pub acceptable: Vec<String>,
    /// Why tern needs it (for the readiness reason).
    pub why: &'static str,
}

/// What one check found for one requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Met,
    /// Was wrong and has been set.
    Set {
        from: String,
    },
    /// Not met (and not set: not allowed, or the write failed).
    Unmet(String),
}

/// Checks `req` in the current thread's network namespace and sets it when `set` allows.
pub fn check_one(req: &Requirement, set: bool) -> Outcome {
    let read = |r: &Requirement| sysctl::get(&r.key);
    let cur = match read(req) {
        Ok(v) => v,
        Err(e) => {
            return Outcome::Unmet(format!(
                "{} cannot be read ({e}); tern needs it at {} ({})",
                req.name, req.want, req.why
            ));
        }
    };
    if req.acceptable.iter().any(|a| *a == cur.trim()) {
        return Outcome::Met;
    }
    if !set {
        return Outcome::Unmet(format!(
            "{} is {cur}, tern needs {} ({}); set it on the node or let ternd set it (drop \
             --no-set-sysctls)",
            req.name, req.want, req.why
        ));
    }
    if let Err(e) = sysctl::set(&req.key, &req.want) {
        return Outcome::Unmet(format!(
            "{} is {cur} and cannot be set to {} ({e}); {}",
            req.name, req.want, req.why
        ));
    }
    match read(req) {
        Ok(v) if req.acceptable.iter().any(|a| *a == v.trim()) => Outcome::Set { from: cur },
        Ok(v) => Outcome::Unmet(format!(
            "{} was set to {} but reads {v}; {}",
            req.name, req.want, req.why
        )),
        Err(e) => Outcome::Unmet(format!("{} cannot be read back ({e})", req.name)),
    }
}

/// The requirements of this node now: forwarding always, IPv6 forwarding with an IPv6 pool,
/// loose reverse-path filtering on the tunnel devices that exist (`vxlan.tern`, `tunl0`).
pub fn requirements(ipv6_pool: bool, tunnel_devices: &[&str]) -> Vec<Requirement> {
    let mut out = vec![Requirement {
        name: "net.ipv4.ip_forward".into(),
        key: "net/ipv4/ip_forward".into(),
        want: "1".into(),
        acceptable: vec!["1".into()],
        why: "without forwarding, pods are unreachable from other nodes",
    }];
    if ipv6_pool {
        out.push(Requirement {
            name: "net.ipv6.conf.all.forwarding".into(),
            key: "net/ipv6/conf/all/forwarding".into(),
            want: "1".into(),
            acceptable: vec!["1".into()],
            why: "an IPv6 pool exists and IPv6 pods are unreachable from other nodes without it",
        });
    }
    for dev in tunnel_devices {
        // Effective value is max(all, dev): the device at 2 is loose whatever `all` says. An
        // effective value already off or loose is accepted before this is consulted.
        out.push(Requirement {
            name: format!("net.ipv4.conf.{dev}.rp_filter"),
            key: format!("net/ipv4/conf/{dev}/rp_filter"),
            want: "2".into(),
            acceptable: vec!["2".into()],
            why: "strict reverse-path filtering drops tunnelled pod traffic whose return route \
                  leaves by another interface",
        });
    }
    out
}

impl HostState {
    /// Checks (and when `set_sysctls`, sets) the node's prerequisites for the pools in `store`
    /// and those of `tunnel_devices` that exist; runs at start and at every reconciliation.
    /// Changes are logged once: a value set at info, an unmet one as a warning.
    pub fn check(&self, store: &dyn Store, set_sysctls: bool, tunnel_devices: &[&str]) {
        let ipv6_pool = match tern_model::list_resources(store, tern_model::Kind::IpPool) {
            Ok(pools) => pools.iter().any(|r| match r {
                tern_model::Resource::IpPool(p) => p.spec.cidr.contains(':'),
                _ => false,
            }),
            // Unknown now: keep what the last check found for IPv6.
            Err(_) => self.lock().contains_key("net.ipv6.conf.all.forwarding"),
        };
        let tunnels: Vec<&str> = tunnel_devices
            .iter()
            .copied()
            .filter(|d| sysctl::get(&format!("net/ipv4/conf/{d}/rp_filter")).is_ok())
            .collect();
        let reqs = requirements(ipv6_pool, &tunnels);
        let mut found = BTreeMap::new();
        for (i, req) in reqs.iter().enumerate() {
            // The tunnel requirements come last, one per device in `tunnels`' order. An
            // effective reverse-path filter already off or loose (device 0 with `all` 0, say)
            // is left as the administrator set it.
            let tunnel = (i + tunnels.len())
                .checked_sub(reqs.len())
                .and_then(|t| tunnels.get(t));
            let outcome = if tunnel.is_some_and(|d| effective_rp_filter_loose(d)) {
                Outcome::Met
            } else if req.key == IPV6_FORWARDING_KEY
                && let Some(why) = ipv6_forwarding_hazard(set_sysctls)
            {
                Outcome::Unmet(why)
            } else {
                check_one(req, set_sysctls)
            };
            match &outcome {
                Outcome::Met => {}
                Outcome::Set { from } => log::info!(
                    "set {} = {} (was {from}): tern needs it",
                    req.name,
                    req.want
                ),
                Outcome::Unmet(_) => {}
            }
            found.insert(
                req.name.clone(),
                match outcome {
                    Outcome::Unmet(p) => Some(p),
                    _ => None,
                },
            );
        }
        let mut cur = self.lock();
        for (name, p) in &found {
            if let Some(p) = p
                && cur.get(name) != Some(&Some(p.clone()))
            {
                log::warn!("node prerequisite not met: {p}");
            }
        }
        *cur = found;
    }
}

/// `RTPROT_RA`: a route learnt from a router advertisement.
const RTPROT_RA: u8 = 9;

/// `net.ipv6.conf.all.forwarding`, which tern does not set over router advertisements.
const IPV6_FORWARDING_KEY: &str = "net/ipv6/conf/all/forwarding";

/// The interfaces of the current namespace with `accept_ra` 1 (the default: accept router
/// advertisements unless forwarding), `lo`, `all` and `default` aside.
pub fn interfaces_accepting_ra() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/proc/sys/net/ipv6/conf") else {
        return Vec::new();
    };
    let mut out: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !matches!(n.as_str(), "all" | "default" | "lo"))
        .filter(|n| {
            sysctl::get(&format!("net/ipv6/conf/{n}/accept_ra")).is_ok_and(|v| v.trim() == "1")
        })
        .collect();
    out.sort();
    out
}

/// Why IPv6 forwarding is not set although an IPv6 pool wants it, when it is not already on:
/// with forwarding on, an interface at `accept_ra=1` stops taking router advertisements, and
/// a route (or address) learnt from them, as this interface's are, is lost when its lifetime runs out, hours
/// later and with no sign of why. tern leaves that choice to the administrator.
fn ipv6_forwarding_hazard(set_sysctls: bool) -> Option<String> {
    if !set_sysctls || sysctl::get(IPV6_FORWARDING_KEY).is_ok_and(|v| v.trim() == "1") {
        return None;
    }
    // Only interfaces that depend on RAs now: an IPv6 route the kernel learnt from one
    // (`proto ra`) through the device. A node without SLAAC (a lab, static addressing) gets
    // forwarding set as before.
    let ra_routes: Vec<u32> = tern_linux::netlink::Handle::new()
        .and_then(|mut h| h.routes_full(true, 254))
        .map(|rs| {
            rs.into_iter()
                .filter(|r| r.protocol == RTPROT_RA)
                .filter_map(|r| r.oif)
                .collect()
        })
        .unwrap_or_default();
    let indexes: std::collections::HashMap<String, u32> = tern_linux::netlink::Handle::new()
        .and_then(|mut h| h.links())
        .map(|ls| ls.into_iter().map(|l| (l.name, l.index)).collect())
        .unwrap_or_default();
    let ra: Vec<String> = interfaces_accepting_ra()
        .into_iter()
        .filter(|n| indexes.get(n).is_some_and(|i| ra_routes.contains(i)))
        .collect();
    if ra.is_empty() {
        return None;
    }
    Some(format!(
        "net.ipv6.conf.all.forwarding is off and ternd did not set it: interfaces {} accept          router advertisements (accept_ra=1) and route by them, which forwarding would switch off, so their          RA-learnt IPv6 addresses and default route would expire; set accept_ra=2 on them          (or configure them statically), then set net.ipv6.conf.all.forwarding=1 (an IPv6          pool exists and IPv6 pods are unreachable from other nodes without it)",
        ra.join(", ")
    ))
}

/// True when the effective reverse-path filter of `dev` (`max(all, dev)`) is not strict.
fn effective_rp_filter_loose(dev: &str) -> bool {
    let get = |k: &str| {
        sysctl::get(k)
            .ok()
            .and_then(|v| v.trim().parse::<u8>().ok())
    };
    match (
        get("net/ipv4/conf/all/rp_filter"),
        get(&format!("net/ipv4/conf/{dev}/rp_filter")),
    ) {
        (Some(a), Some(d)) => a.max(d) != 1,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_follow_pools_and_devices() {
        let r = requirements(false, &[]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "net.ipv4.ip_forward");
        let r = requirements(true, &["vxlan.tern"]);
        let names: Vec<&str> = r.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "net.ipv4.ip_forward",
                "net.ipv6.conf.all.forwarding",
                "net.ipv4.conf.vxlan.tern.rp_filter"
            ]
        );
        assert_eq!(r[2].key, "net/ipv4/conf/vxlan.tern/rp_filter");
    }

    #[test]
    fn unreadable_sysctl_is_unmet_and_named() {
        let req = Requirement {
            name: "net.ipv4.conf.nonexistent0.rp_filter".into(),
            key: "net/ipv4/conf/nonexistent0/rp_filter".into(),
            want: "2".into(),
            acceptable: vec!["2".into()],
            why: "test",
        };
        match check_one(&req, true) {
            Outcome::Unmet(m) => assert!(m.contains("nonexistent0"), "{m}"),
            o => panic!("{o:?}"),
        }
    }

    /// F12: in a private namespace with a veth at accept_ra=1, an IPv6 pool does not make the
    /// check switch IPv6 forwarding on; it is reported unmet with the reason. With accept_ra=2
    /// everywhere, it is set.
    #[test]
    fn ipv6_forwarding_is_not_set_over_router_advertisements() {
        crate::testutil::in_new_netns(|h, here| {
            h.create_veth("ra0", "ra1", here.as_fd(), 0).unwrap();
            for d in ["ra0", "ra1"] {
                sysctl::set(&format!("net/ipv6/conf/{d}/accept_ra"), "1").unwrap();
            }
            sysctl::set(IPV6_FORWARDING_KEY, "0").unwrap();
            // Without RA-learnt routes the interfaces do not depend on RAs: no hazard.
            assert_eq!(ipv6_forwarding_hazard(true), None);
            for d in ["ra0", "ra1"] {
                let l = h.link_by_name(d).unwrap().unwrap();
                h.set_link_up(l.index).unwrap();
                h.add_route_full(&tern_linux::netlink::Route {
                    dst: if d == "ra0" {
                        "2001:db8:1::/64"
                    } else {
                        "2001:db8:2::/64"
                    }
                    .parse()
                    .unwrap(),
                    kind: tern_linux::netlink::RouteKind::Unicast,
                    gateway: None,
                    oif: Some(l.index),
                    onlink: false,
                    scope: tern_linux::netlink::Scope::Universe,
                    protocol: RTPROT_RA,
                    table: 254,
                })
                .unwrap();
            }
            let store = tern_store::mem::MemStore::new();
            let pool = tern_model::parse_documents(
                "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: v6\nspec:\n  cidr: fd00:10::/64\n",
                "pool.yaml",
            )
            .unwrap();
            for r in pool {
                tern_model::put_resource(&store, &r).unwrap();
            }
            let host = HostState::default();
            host.check(&store, true, &[]);
            assert_eq!(sysctl::get(IPV6_FORWARDING_KEY).unwrap().trim(), "0");
            let p = host.problems().join("; ");
            assert!(p.contains("accept_ra=1") && p.contains("ra0, ra1"), "{p}");
            for d in ["ra0", "ra1"] {
                sysctl::set(&format!("net/ipv6/conf/{d}/accept_ra"), "2").unwrap();
            }
            host.check(&store, true, &[]);
            assert_eq!(sysctl::get(IPV6_FORWARDING_KEY).unwrap().trim(), "1");
            assert!(host.problems().is_empty(), "{:?}", host.problems());
        });
    }

    #[test]
    fn metrics_list_each_check() {
        let h = HostState::default();
        h.lock()
            .insert("net.ipv4.ip_forward".into(), Some("off".into()));
        let mut page = Page::new();
        h.render_metrics("n1", &mut page);
        let out = page.into_string();
        assert_eq!(
            crate::metrics::exposition::check(&out).unwrap(),
            ["tern_host_prerequisite_ok"]
        );
        assert!(
            out.contains("tern_host_prerequisite_ok{node=\"n1\",sysctl=\"net.ipv4.ip_forward\"} 0"),
            "{out}"
        );
        assert_eq!(h.problems(), ["off"]);
    }
}
