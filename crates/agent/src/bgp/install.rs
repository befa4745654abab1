//! The learned routes in the kernel. BGP's routes are desired routes like the reconciler's:
//! [`Installer::sync_one`] (a route event) and [`Installer::sync_all`] (the periodic pass)
//! turn the routes the speaker wants into protocol-85 kernel routes, diff them against the
//! kernel's table with [`plan_with`] (owner: [`bgp_owned`]) and run the operations with
//! [`apply`], over one netlink handle kept for the thread's life (re-opened only after an
//! error). New routes are added with `NLM_F_EXCL` ([`AddMode::Exclusive`]): a route of
//! another protocol for the prefix, found in the listing or appearing before the add, is
//! never replaced but recorded as a conflict.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use tern_linux::TERN_BGP_ROUTE_PROTOCOL;
use tern_linux::kernel::Routes;
use tern_linux::netlink::{Handle, MAIN_TABLE, Route, RouteKind, Scope};

use crate::routes::plan::{AddMode, RouteOp, apply, bgp_owned, plan_with};

/// Opens the kernel's route table (the real one: a [`Handle`] in the thread's namespace).
pub(super) type Opener = Box<dyn FnMut() -> tern_linux::Result<Box<dyn Routes>>>;

/// The kernel side of the BGP speaker.
pub(super) struct Installer {
    kernel: Option<Box<dyn Routes>>,
    open: Opener,
    /// Accepted prefixes the kernel holds a foreign route for (not installed).
    pub conflicts: BTreeSet<IpNet>,
}

/// The kernel route for a learned prefix.
pub(super) fn bgp_route(dst: IpNet, gateway: Option<IpAddr>) -> Route {
    Route {
        dst,
        kind: RouteKind::Unicast,
        gateway,
        oif: None,
        onlink: false,
        scope: Scope::Universe,
        protocol: TERN_BGP_ROUTE_PROTOCOL,
        table: MAIN_TABLE,
    }
}

/// The gateway of the route to a BGP next hop `nh`: `nh` itself when the longest route
/// covering it is connected, else that route's gateway (eBGP multihop, a reflected route:
/// the kernel refuses a gateway it cannot reach on a link). tern's BGP routes never resolve
/// a next hop.
fn resolve(table: &[Route], nh: IpAddr) -> IpAddr {
    table
        .iter()
        .filter(|r| {
            r.table == MAIN_TABLE
                && r.kind == RouteKind::Unicast
                && r.protocol != TERN_BGP_ROUTE_PROTOCOL
                && r.dst.contains(&nh)
        })
        .max_by_key(|r| r.dst.prefix_len())
        .and_then(|r| r.gateway)
        .unwrap_or(nh)
}

fn op_dst(op: &RouteOp) -> IpNet {
    match op {
        RouteOp::Add(r) | RouteOp::Delete(r) | RouteOp::Replace { new: r, .. } => r.dst,
        RouteOp::Blocked { want, .. } => want.dst,
    }
}

impl Installer {
    /// An installer over the kernel `open` opens (when first needed, and again after an
    /// error).
    pub fn new(open: Opener) -> Installer {
        Installer {
            kernel: None,
            open,
            conflicts: BTreeSet::new(),
        }
    }

    /// The real kernel of the calling thread's network namespace.
    pub fn system() -> Installer {
        Installer::new(Box::new(|| Ok(Box::new(Handle::new()?) as Box<dyn Routes>)))
    }

    fn kernel(&mut self) -> tern_linux::Result<&mut dyn Routes> {
        if self.kernel.is_none() {
            self.kernel = Some((self.open)()?);
        }
        Ok(self.kernel.as_deref_mut().expect("opened just now"))
    }

    /// The main table's routes of the families `v6` (false: IPv4); an error drops the
    /// handle, so the next call opens a fresh one.
    fn dump(&mut self, families: &[bool]) -> tern_linux::Result<Vec<Route>> {
        let res = (|| {
            let k = self.kernel()?;
            let mut out = Vec::new();
            for v6 in families {
                out.extend(k.routes_full(*v6, MAIN_TABLE)?);
            }
            Ok(out)
        })();
        if res.is_err() {
            self.kernel = None;
        }
        res
    }

    /// The prefixes of tern's BGP routes in the kernel (at start: a previous run's).
    pub fn installed(&mut self) -> tern_linux::Result<BTreeSet<IpNet>> {
        Ok(self
            .dump(&[false, true])?
            .into_iter()
            .filter(bgp_owned)
            .map(|r| r.dst)
            .collect())
    }

    /// Brings the kernel's route to `prefix` to `next_hop` (installed or replaced), or, for
    /// None, deletes tern's BGP route to it.
    pub fn sync_one(&mut self, prefix: IpNet, next_hop: Option<IpAddr>) {
        let want: BTreeMap<IpNet, IpAddr> = next_hop.map(|nh| (prefix, nh)).into_iter().collect();
        self.sync(&want, Some(prefix), true, &|_| false);
    }

    /// Brings every BGP route of the kernel to `want` (prefix → next hop). Routes to
    /// prefixes `leave` names (pools that encapsulate: the reconciler's to replace) are
    /// neither installed nor deleted; unwanted ones are deleted only when
    /// `delete_unwanted` (stale routes of a previous run stay while the sessions come back).
    pub fn sync_all(
        &mut self,
        want: &BTreeMap<IpNet, IpAddr>,
        delete_unwanted: bool,
        leave: &dyn Fn(&IpNet) -> bool,
    ) {
        self.sync(want, None, delete_unwanted, leave);
    }

    fn sync(
        &mut self,
        want: &BTreeMap<IpNet, IpAddr>,
        only: Option<IpNet>,
        delete_unwanted: bool,
        leave: &dyn Fn(&IpNet) -> bool,
    ) {
        let families: &[bool] = match only {
            Some(p) if p.addr().is_ipv6() => &[true],
            Some(_) => &[false],
            None => &[false, true],
        };
        let table = match self.dump(families) {
            Ok(t) => t,
            Err(e) => {
                log::warn!("BGP: listing routes: {e}");
                return;
            }
        };
        let in_scope = |dst: &IpNet| only.is_none_or(|p| p == *dst) && !leave(dst);
        let routes: Vec<Route> = want
            .iter()
            .filter(|(p, _)| in_scope(p))
            .map(|(p, nh)| bgp_route(*p, Some(resolve(&table, *nh))))
            .collect();
        let have: Vec<Route> = table.iter().filter(|r| in_scope(&r.dst)).cloned().collect();
        let mut ops = plan_with(&routes, &have, &bgp_owned);
        if !delete_unwanted {
            ops.retain(|op| !matches!(op, RouteOp::Delete(x) if !want.contains_key(&x.dst)));
        }
        let touched: BTreeSet<IpNet> = ops.iter().map(op_dst).collect();
        for r in routes.iter().filter(|r| !touched.contains(&r.dst)) {
            self.conflicts.remove(&r.dst);
        }
        if ops.is_empty() {
            return;
        }
        let done = match self.kernel() {
            Ok(k) => apply(k, ops, AddMode::Exclusive),
            Err(e) => {
                log::warn!("BGP: netlink: {e}");
                return;
            }
        };
        let via = |p: &IpNet| want.get(p).copied();
        for r in &done.set {
            self.conflicts.remove(&r.dst);
        }
        for (w, foreign) in done.blocked {
            self.conflict(w.dst, via(&w.dst), foreign.protocol);
        }
        for (op, e) in done.failed {
            match op {
                // Someone installed a route for the prefix since the listing: theirs stays.
                RouteOp::Add(w) if e.is_already_exists() => {
                    let theirs = self.dump(&[w.dst.addr().is_ipv6()]).ok().and_then(|t| {
                        t.into_iter()
                            .find(|x| x.dst == w.dst && !bgp_owned(x))
                            .map(|x| x.protocol)
                    });
                    if let Some(protocol) = theirs {
                        self.conflict(w.dst, via(&w.dst), protocol);
                    }
                }
                RouteOp::Add(w) | RouteOp::Replace { new: w, .. } => log::warn!(
                    "BGP: installing {} via {}: {e}",
                    w.dst,
                    via(&w.dst).map_or("-".into(), |n| n.to_string())
                ),
                RouteOp::Delete(x) => log::warn!("BGP: removing {}: {e}", x.dst),
                RouteOp::Blocked { .. } => {}
            }
        }
    }

    /// Records that a foreign route of `protocol` holds `prefix` (logged once).
    fn conflict(&mut self, prefix: IpNet, next_hop: Option<IpAddr>, protocol: u8) {
        if self.conflicts.insert(prefix) {
            log::warn!(
                "BGP: not installing {prefix} via {}: the kernel has a route for it with protocol {protocol} that tern's BGP did not install",
                next_hop.map_or("-".into(), |n| n.to_string())
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use tern_linux::TERN_ROUTE_PROTOCOL;
    use tern_linux::fake::{FakeKernel, Op};
    use tern_linux::kernel::Addresses;

    fn n(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A node on 198.18.0.1/24 (eth0) with a default route via 198.18.0.254, and an
    /// installer over it that counts how often it opens the kernel.
    fn node() -> (FakeKernel, Installer, Rc<Cell<usize>>) {
        let mut k = FakeKernel::new();
        let eth0 = k.add_device("eth0", 1500);
        k.add_address(eth0, n("198.18.0.1/24")).unwrap();
        k.put_route(Route {
            dst: n("0.0.0.0/0"),
            gateway: Some(ip("198.18.0.254")),
            oif: Some(eth0),
            protocol: 3,
            ..bgp_route(n("0.0.0.0/0"), None)
        });
        let opens = Rc::new(Cell::new(0));
        let (k2, o2) = (k.clone(), opens.clone());
        let inst = Installer::new(Box::new(move || {
            o2.set(o2.get() + 1);
            Ok(Box::new(k2.clone()) as Box<dyn Routes>)
        }));
        (k, inst, opens)
    }

    fn bgp_routes(k: &FakeKernel) -> BTreeMap<IpNet, Option<IpAddr>> {
        k.all_routes()
            .into_iter()
            .filter(bgp_owned)
            .map(|r| (r.dst, r.gateway))
            .collect()
    }

    #[test]
    fn learned_routes_are_installed_and_withdrawn_through_the_plan_on_one_handle() {
        let (k, mut inst, opens) = node();
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.2")));
        inst.sync_one(n("10.244.2.0/26"), Some(ip("198.18.0.3")));
        assert_eq!(
            bgp_routes(&k),
            BTreeMap::from([
                (n("10.244.1.0/26"), Some(ip("198.18.0.2"))),
                (n("10.244.2.0/26"), Some(ip("198.18.0.3"))),
            ])
        );
        // A next-hop change replaces in place; a withdrawal deletes.
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.9")));
        inst.sync_one(n("10.244.2.0/26"), None);
        assert_eq!(
            bgp_routes(&k),
            BTreeMap::from([(n("10.244.1.0/26"), Some(ip("198.18.0.9")))])
        );
        assert_eq!(opens.get(), 1, "one netlink handle for every route");
        // Replaying the same event changes nothing.
        let adds = k.calls(Op::RouteAdd);
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.9")));
        assert_eq!(k.calls(Op::RouteAdd), adds);
    }

    #[test]
    fn a_next_hop_off_every_connected_network_resolves_through_the_kernel_table() {
        let (k, mut inst, _) = node();
        inst.sync_one(n("10.244.7.0/26"), Some(ip("203.0.113.7")));
        assert_eq!(
            bgp_routes(&k),
            BTreeMap::from([(n("10.244.7.0/26"), Some(ip("198.18.0.254")))])
        );
        // The periodic pass agrees with what the event installed: nothing to do.
        let adds = k.calls(Op::RouteAdd);
        inst.sync_all(
            &BTreeMap::from([(n("10.244.7.0/26"), ip("203.0.113.7"))]),
            true,
            &|_| false,
        );
        assert_eq!(k.calls(Op::RouteAdd), adds);
    }

    #[test]
    fn a_foreign_route_is_a_conflict_never_replaced_and_installed_once_gone() {
        let (k, mut inst, _) = node();
        let bird = Route {
            gateway: Some(ip("198.18.0.50")),
            protocol: 12,
            ..bgp_route(n("10.244.1.0/26"), None)
        };
        k.put_route(bird.clone());
        let want = BTreeMap::from([(n("10.244.1.0/26"), ip("198.18.0.2"))]);
        inst.sync_all(&want, true, &|_| false);
        assert_eq!(k.routes_to(bird.dst), vec![bird.clone()]);
        assert!(inst.conflicts.contains(&bird.dst));
        // The reconciler's routes are foreign too.
        let mut reconciler = bird.clone();
        reconciler.protocol = TERN_ROUTE_PROTOCOL;
        reconciler.dst = n("10.244.3.0/26");
        k.put_route(reconciler.clone());
        inst.sync_one(reconciler.dst, Some(ip("198.18.0.3")));
        assert!(inst.conflicts.contains(&reconciler.dst));
        assert_eq!(k.routes_to(reconciler.dst), vec![reconciler]);
        // The foreign route goes: the next pass installs ours and clears the conflict.
        let mut other = k.clone();
        assert!(other.delete_route_full(&bird).unwrap());
        inst.sync_all(&want, true, &|_| false);
        assert!(!inst.conflicts.contains(&bird.dst));
        assert_eq!(bgp_routes(&k).get(&bird.dst), Some(&Some(ip("198.18.0.2"))));
    }

    #[test]
    fn a_failed_install_is_retried_by_the_next_pass() {
        let (k, mut inst, _) = node();
        k.fail_next_route_add();
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.2")));
        assert!(bgp_routes(&k).is_empty());
        inst.sync_all(
            &BTreeMap::from([(n("10.244.1.0/26"), ip("198.18.0.2"))]),
            true,
            &|_| false,
        );
        assert_eq!(bgp_routes(&k).len(), 1);
        // A failed withdrawal stays until a pass deletes the unwanted route.
        k.fail_next_route_del();
        inst.sync_one(n("10.244.1.0/26"), None);
        assert_eq!(bgp_routes(&k).len(), 1);
        inst.sync_all(&BTreeMap::new(), true, &|_| false);
        assert!(bgp_routes(&k).is_empty());
    }

    #[test]
    fn stale_routes_stay_until_released_and_encapsulating_pools_are_left_alone() {
        let (k, mut inst, _) = node();
        for p in ["10.244.1.0/26", "10.244.2.0/26", "10.250.0.0/26"] {
            inst.sync_one(n(p), Some(ip("198.18.0.2")));
        }
        assert_eq!(inst.installed().unwrap().len(), 3);
        let want = BTreeMap::from([(n("10.244.1.0/26"), ip("198.18.0.2"))]);
        let vxlan_pool = |p: &IpNet| n("10.250.0.0/16").contains(p);
        // While a restart's sessions come back: nothing unwanted is deleted.
        inst.sync_all(&want, false, &vxlan_pool);
        assert_eq!(bgp_routes(&k).len(), 3);
        // Afterwards the stale route goes; the VXLAN pool's stays for the reconciler.
        inst.sync_all(&want, true, &vxlan_pool);
        let left: Vec<IpNet> = bgp_routes(&k).into_keys().collect();
        assert_eq!(left, vec![n("10.244.1.0/26"), n("10.250.0.0/26")]);
    }

    #[test]
    fn ipv6_routes_are_installed_as_ipv4_ones() {
        let (mut k, mut inst, _) = node();
        let eth0 = k
            .all_links()
            .iter()
            .find(|l| l.name == "eth0")
            .unwrap()
            .index;
        k.add_address(eth0, n("2001:db8::11/64")).unwrap();
        k.put_route(Route {
            dst: n("::/0"),
            gateway: Some(ip("2001:db8::1")),
            oif: Some(eth0),
            protocol: 3,
            ..bgp_route(n("::/0"), None)
        });
        // A next hop on the link, and one off it (a reflected route from another subnet).
        inst.sync_one(n("fd00:10:244::80/122"), Some(ip("2001:db8::12")));
        inst.sync_one(n("fd00:10:244::c0/122"), Some(ip("2001:db8:2::12")));
        let want = BTreeMap::from([
            (n("fd00:10:244::80/122"), Some(ip("2001:db8::12"))),
            (n("fd00:10:244::c0/122"), Some(ip("2001:db8::1"))),
        ]);
        assert_eq!(bgp_routes(&k), want);
        // Both families in one pass: the IPv4 route goes in, the IPv6 ones stay.
        inst.sync_all(
            &BTreeMap::from([
                (n("10.244.1.0/26"), ip("198.18.0.2")),
                (n("fd00:10:244::80/122"), ip("2001:db8::12")),
                (n("fd00:10:244::c0/122"), ip("2001:db8:2::12")),
            ]),
            true,
            &|_| false,
        );
        assert_eq!(bgp_routes(&k).len(), 3);
        // A withdrawal deletes.
        inst.sync_one(n("fd00:10:244::c0/122"), None);
        assert!(!bgp_routes(&k).contains_key(&n("fd00:10:244::c0/122")));
    }

    #[test]
    fn a_failed_listing_reopens_the_handle() {
        let (k, mut inst, opens) = node();
        k.fail_next(Op::RouteList, libc::ENOBUFS);
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.2")));
        assert!(bgp_routes(&k).is_empty());
        inst.sync_one(n("10.244.1.0/26"), Some(ip("198.18.0.2")));
        assert_eq!(bgp_routes(&k).len(), 1);
        assert_eq!(opens.get(), 2);
    }
}
