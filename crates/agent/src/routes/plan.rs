//! Route sync as a pure plan, Felix's `route_table.go` split: [`kernel_routes`] turns the
//! desired state into kernel routes, [`plan`] diffs them against what the kernel reports and
//! returns the operations to run, and [`apply`] runs them through the kernel seam
//! ([`tern_linux::kernel::Routes`]) in a thin loop. The planning touches no kernel; the
//! loop takes any kernel, so every rule below, and what a refused operation leaves, is
//! tested without root (on `tern_linux::fake::FakeKernel`).
//!
//! Every route tern installs goes through here: the reconciler's (protocol 84, [`plan`]) and
//! the BGP speaker's learned routes (protocol 85, [`plan_with`] and [`bgp_owned`], applied
//! with [`AddMode::Exclusive`]); each owner only changes its own routes.
//!
//! Ownership: a route is the reconciler's to change or delete only when it has protocol
//! [`TERN_ROUTE_PROTOCOL`] in the main table and does not go out of a pod interface (those
//! `/32`s belong to the endpoint code). Every other route is foreign and never touched; a
//! foreign route holding a destination tern wants is reported ([`RouteOp::Blocked`]), not
//! replaced.

use super::{Desired, Target};
use std::collections::HashSet;
use tern_linux::kernel::Routes;
use tern_linux::netlink::{MAIN_TABLE, Route, RouteKind, Scope};
use tern_linux::{LinuxError, TERN_BGP_ROUTE_PROTOCOL, TERN_ROUTE_PROTOCOL};

/// One change the kernel needs so that its tern routes equal the desired ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteOp {
    /// Install a route to a destination tern holds no route for.
    Add(Route),
    /// Point an owned route of the same type at another next hop / device.
    Replace {
        /// The route the kernel holds now.
        old: Route,
        /// The route it must become.
        new: Route,
    },
    /// Remove an owned route that is stale (destination no longer wanted, a different route
    /// type, or a duplicate).
    Delete(Route),
    /// Not applied: a foreign route holds the destination. Reported so the operator sees why
    /// the destination is not routed by tern.
    Blocked {
        /// The route tern wanted.
        want: Route,
        /// The foreign route in the way.
        foreign: Route,
    },
}

/// True when tern may change or delete `r`: protocol 84, main table, not out of a pod
/// interface (`pod_links`: indexes of the host-side veths).
pub fn owned(r: &Route, pod_links: &HashSet<u32>) -> bool {
    r.protocol == TERN_ROUTE_PROTOCOL
        && r.table == MAIN_TABLE
        && !r.oif.is_some_and(|o| pod_links.contains(&o))
}

/// True when the BGP speaker may change or delete `r`: its own protocol 85 in the main table.
pub fn bgp_owned(r: &Route) -> bool {
    r.protocol == TERN_BGP_ROUTE_PROTOCOL && r.table == MAIN_TABLE
}

/// True when the kernel's `have` already is the route `want` asks for. A `want` without a
/// device matches any device: the kernel fills in the one the gateway resolves to.
pub fn same_route(want: &Route, have: &Route) -> bool {
    want.dst == have.dst
        && want.kind == have.kind
        && want.gateway == have.gateway
        && (want.oif.is_none() || want.oif == have.oif)
        && want.onlink == have.onlink
}

/// The kernel routes of the desired state. `vxlan` / `ipip` / `vxlan_v6` are the tunnel
/// device indexes (`vxlan.tern`, `tunl0`, `vxlan-v6.tern`: a VXLAN route takes the device of
/// its tunnel address's family); a route through a tunnel that does not exist (yet) is left
/// out.
pub fn kernel_routes(
    d: &Desired,
    vxlan: Option<u32>,
    ipip: Option<u32>,
    vxlan_v6: Option<u32>,
) -> Vec<Route> {
    let mut out = Vec::with_capacity(d.routes.len());
    for (dst, t) in &d.routes {
        let base = Route {
            dst: *dst,
            kind: RouteKind::Unicast,
            gateway: None,
            oif: None,
            onlink: false,
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        };
        let tunnel = |gw, dev: Option<u32>| {
            dev.map(|i| Route {
                gateway: Some(gw),
                oif: Some(i),
                onlink: true,
                ..base.clone()
            })
        };
        let route = match *t {
            Target::Blackhole => Some(Route {
                kind: RouteKind::Blackhole,
                ..base.clone()
            }),
            Target::Direct(gw) => Some(Route {
                gateway: Some(gw),
                ..base.clone()
            }),
            Target::Vxlan(gw) if gw.is_ipv6() => tunnel(gw, vxlan_v6),
            Target::Vxlan(gw) => tunnel(gw, vxlan),
            Target::Ipip(gw) => tunnel(gw, ipip),
        };
        out.extend(route);
    }
    out
}

/// The operations that turn the kernel's routes `have` (a full dump of the main table, any
/// protocol) into `want`, touching only owned routes (see [`owned`]). Deletions of
/// unwanted destinations come first, then per wanted destination in `want` order: nothing
/// when an owned route already matches (extra owned duplicates are deleted), a replace when
/// an owned route of the same type differs, otherwise deletes of owned routes of another
/// type (replace cannot turn a blackhole into a unicast route) and an add.
pub fn plan(want: &[Route], have: &[Route], pod_links: &HashSet<u32>) -> Vec<RouteOp> {
    plan_with(want, have, &|r| owned(r, pod_links))
}

/// [`plan`] for the owner whose routes `owned` recognises (the reconciler's: [`owned`];
/// the BGP speaker's: [`bgp_owned`]): every route it does not own is foreign.
pub fn plan_with(want: &[Route], have: &[Route], owned: &dyn Fn(&Route) -> bool) -> Vec<RouteOp> {
    let mine: Vec<&Route> = have.iter().filter(|r| owned(r)).collect();
    let wanted: HashSet<_> = want.iter().map(|w| w.dst).collect();
    let mut ops: Vec<RouteOp> = mine
        .iter()
        .filter(|r| !wanted.contains(&r.dst))
        .map(|r| RouteOp::Delete((*r).clone()))
        .collect();
    for w in want {
        let same_dst: Vec<&Route> = mine.iter().copied().filter(|r| r.dst == w.dst).collect();
        if let Some(keep) = same_dst.iter().find(|r| same_route(w, r)) {
            ops.extend(
                same_dst
                    .iter()
                    .filter(|r| !std::ptr::eq(**r, *keep))
                    .map(|r| RouteOp::Delete((*r).clone())),
            );
            continue;
        }
        if let Some(foreign) = have
            .iter()
            .find(|r| r.dst == w.dst && r.table == w.table && !owned(r))
        {
            ops.push(RouteOp::Blocked {
                want: w.clone(),
                foreign: foreign.clone(),
            });
            continue;
        }
        match same_dst.iter().position(|r| r.kind == w.kind) {
            Some(i) => {
                ops.extend(
                    same_dst
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, r)| RouteOp::Delete((*r).clone())),
                );
                ops.push(RouteOp::Replace {
                    old: same_dst[i].clone(),
                    new: w.clone(),
                });
            }
            None => {
                ops.extend(same_dst.iter().map(|r| RouteOp::Delete((*r).clone())));
                ops.push(RouteOp::Add(w.clone()));
            }
        }
    }
    ops
}

/// How [`apply`] installs a route to a destination its owner holds no route for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddMode {
    /// `NLM_F_REPLACE` (the reconciler: the plan saw no route there).
    Replace,
    /// `NLM_F_EXCL` (the BGP speaker): a route someone installed since the listing is never
    /// replaced; the add fails with EEXIST ([`Applied::failed`]).
    Exclusive,
}

/// What [`apply`] did.
#[derive(Debug, Default)]
pub struct Applied {
    /// Routes added or replaced.
    pub set: Vec<Route>,
    /// Routes deleted (or already gone).
    pub removed: Vec<Route>,
    /// Destinations a foreign route holds: the route wanted and the foreign one.
    pub blocked: Vec<(Route, Route)>,
    /// Operations the kernel refused, with its error: the kernel keeps what it had, and the
    /// next plan (the next pass) issues them again.
    pub failed: Vec<(RouteOp, LinuxError)>,
}

/// Runs `ops` (from [`plan`] or [`plan_with`]) against `k`, each on its own: a refused
/// operation is recorded and the rest still run.
pub fn apply(k: &mut dyn Routes, ops: Vec<RouteOp>, mode: AddMode) -> Applied {
    let mut out = Applied::default();
    for op in ops {
        let res = match &op {
            RouteOp::Delete(x) => k.delete_route_full(x).map(|_| ()),
            RouteOp::Add(w) if mode == AddMode::Exclusive => k.add_route_full(w),
            RouteOp::Add(w) | RouteOp::Replace { new: w, .. } => k.replace_route_full(w),
            RouteOp::Blocked { want, foreign } => {
                out.blocked.push((want.clone(), foreign.clone()));
                continue;
            }
        };
        match (res, op) {
            (Ok(()), RouteOp::Delete(x)) => out.removed.push(x),
            (Ok(()), RouteOp::Add(w) | RouteOp::Replace { new: w, .. }) => out.set.push(w),
            (Ok(()), RouteOp::Blocked { .. }) => {}
            (Err(e), op) => out.failed.push((op, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const VXLAN_IDX: u32 = 7;
    const POD_VETH: u32 = 20;

    fn desired(routes: &[(&str, Target)]) -> Desired {
        Desired {
            routes: routes
                .iter()
                .map(|(d, t)| (d.parse().unwrap(), *t))
                .collect::<BTreeMap<_, _>>(),
            ..Desired::default()
        }
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    fn want() -> Vec<Route> {
        kernel_routes(
            &desired(&[
                ("10.244.0.0/26", Target::Blackhole),
                ("10.244.1.0/26", Target::Direct(ip("198.18.0.2"))),
                ("10.244.2.0/26", Target::Vxlan(ip("10.244.2.1"))),
            ]),
            Some(VXLAN_IDX),
            None,
            None,
        )
    }

    fn pods() -> HashSet<u32> {
        [POD_VETH].into_iter().collect()
    }

    /// A route of another protocol (the connected underlay, a default route, BIRD's).
    fn foreign(dst: &str, protocol: u8) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            kind: RouteKind::Unicast,
            gateway: Some(ip("198.18.0.254")),
            oif: Some(2),
            onlink: false,
            scope: Scope::Universe,
            protocol,
            table: MAIN_TABLE,
        }
    }

    /// The endpoint code's host route of a local pod (tern's protocol, out of a pod veth).
    fn pod_route(dst: &str) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            kind: RouteKind::Unicast,
            gateway: None,
            oif: Some(POD_VETH),
            onlink: false,
            scope: Scope::Link,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        }
    }

    /// What the kernel reports back for an installed route: a gateway route resolved to the
    /// underlay device gets that device as `oif`.
    fn as_reported(r: &Route) -> Route {
        let mut r = r.clone();
        if r.gateway.is_some() && r.oif.is_none() {
            r.oif = Some(2);
        }
        r
    }

    /// A stateful fake of the main table: replace overwrites the route to the same
    /// destination in the same table, as `NLM_F_CREATE | NLM_F_REPLACE` does.
    fn apply(mut kernel: Vec<Route>, ops: &[RouteOp]) -> Vec<Route> {
        for op in ops {
            match op {
                RouteOp::Add(r) | RouteOp::Replace { new: r, .. } => {
                    kernel.retain(|k| !(k.dst == r.dst && k.table == r.table));
                    kernel.push(as_reported(r));
                }
                RouteOp::Delete(r) => kernel.retain(|k| k != r),
                RouteOp::Blocked { .. } => {}
            }
        }
        kernel
    }

    #[test]
    fn kernel_routes_leave_out_routes_through_missing_tunnels() {
        let w = kernel_routes(
            &desired(&[
                ("10.244.1.0/26", Target::Ipip(ip("198.18.0.2"))),
                ("10.244.2.0/26", Target::Vxlan(ip("10.244.2.1"))),
            ]),
            Some(VXLAN_IDX),
            None,
            None,
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].oif, Some(VXLAN_IDX));
        assert!(w[0].onlink);
        assert_eq!(w[0].protocol, TERN_ROUTE_PROTOCOL);
    }

    #[test]
    fn an_empty_kernel_gets_every_route_added() {
        let ops = plan(&want(), &[], &pods());
        assert_eq!(ops.len(), 3);
        assert!(ops.iter().all(|o| matches!(o, RouteOp::Add(_))), "{ops:?}");
    }

    #[test]
    fn foreign_and_endpoint_routes_are_never_touched() {
        let have = vec![
            foreign("0.0.0.0/0", 3),
            foreign("10.99.0.0/16", 12),
            pod_route("10.244.0.5/32"),
            Route {
                table: 200,
                ..pod_route("10.244.7.0/26")
            },
        ];
        let ops = plan(&[], &have, &pods());
        assert!(ops.is_empty(), "{ops:?}");
    }

    #[test]
    fn stale_owned_routes_are_deleted() {
        let stale = Route {
            dst: "10.244.9.0/26".parse().unwrap(),
            ..as_reported(&want()[1])
        };
        let ops = plan(&want(), std::slice::from_ref(&stale), &pods());
        assert_eq!(ops[0], RouteOp::Delete(stale));
        assert_eq!(ops.len(), 4);
    }

    #[test]
    fn a_changed_next_hop_is_replaced() {
        let w = want();
        let mut old = as_reported(&w[1]);
        old.gateway = Some(ip("198.18.0.9"));
        let have: Vec<Route> = vec![as_reported(&w[0]), old.clone(), as_reported(&w[2])];
        let ops = plan(&w, &have, &pods());
        assert_eq!(
            ops,
            vec![RouteOp::Replace {
                old,
                new: w[1].clone()
            }]
        );
    }

    #[test]
    fn a_route_of_another_type_is_deleted_then_added() {
        let w = want();
        let old = Route {
            kind: RouteKind::Blackhole,
            gateway: None,
            ..w[1].clone()
        };
        let ops = plan(&w[1..2], std::slice::from_ref(&old), &pods());
        assert_eq!(ops, vec![RouteOp::Delete(old), RouteOp::Add(w[1].clone())]);
    }

    #[test]
    fn a_foreign_route_on_a_wanted_destination_blocks_it() {
        let w = want();
        let bird = foreign("10.244.1.0/26", 12);
        let ops = plan(&w[1..2], std::slice::from_ref(&bird), &pods());
        assert_eq!(
            ops,
            vec![RouteOp::Blocked {
                want: w[1].clone(),
                foreign: bird
            }]
        );
    }

    #[test]
    fn owned_duplicates_of_a_matching_route_are_deleted() {
        let w = want();
        let good = as_reported(&w[1]);
        let dup = Route {
            gateway: Some(ip("198.18.0.9")),
            ..good.clone()
        };
        let ops = plan(&w[1..2], &[dup.clone(), good], &pods());
        assert_eq!(ops, vec![RouteOp::Delete(dup)]);
    }

    #[test]
    fn applying_a_plan_leaves_nothing_to_do() {
        let w = want();
        let mut wrong = as_reported(&w[2]);
        wrong.gateway = Some(ip("10.244.2.99"));
        let starts = vec![
            vec![],
            vec![foreign("0.0.0.0/0", 3), pod_route("10.244.0.5/32")],
            vec![
                wrong,
                Route {
                    kind: RouteKind::Blackhole,
                    gateway: None,
                    ..w[1].clone()
                },
                Route {
                    dst: "10.244.9.0/26".parse().unwrap(),
                    ..w[0].clone()
                },
                as_reported(&w[0]),
            ],
        ];
        for have in starts {
            let after = apply(have.clone(), &plan(&w, &have, &pods()));
            let again = plan(&w, &after, &pods());
            assert!(again.is_empty(), "from {have:?}: {again:?}");
            for f in have.iter().filter(|r| !owned(r, &pods())) {
                assert!(after.contains(f), "foreign route {f:?} lost");
            }
            for x in &w {
                assert!(after.iter().any(|k| same_route(x, k)), "{x:?} missing");
            }
        }
    }

    /// A fake kernel with the underlay eth0 (198.18.0.1/24) and `vxlan.tern` up, at the
    /// indexes [`want`] uses.
    fn fake() -> tern_linux::fake::FakeKernel {
        use tern_linux::kernel::{Addresses, Links};
        let mut k = tern_linux::fake::FakeKernel::new();
        let eth0 = k.add_device("eth0", 1500);
        k.add_address(eth0, "198.18.0.1/24".parse().unwrap())
            .unwrap();
        for i in eth0 + 1..VXLAN_IDX {
            k.add_device(&format!("dummy{i}"), 1500);
        }
        k.create_vxlan("vxlan.tern", 4096, ip("198.18.0.1"), None, 4789)
            .unwrap();
        assert_eq!(k.link("vxlan.tern").unwrap().index, VXLAN_IDX);
        k.set_link_up(VXLAN_IDX).unwrap();
        k
    }

    fn dump(k: &mut dyn Routes) -> Vec<Route> {
        let mut v = k.routes_full(false, MAIN_TABLE).unwrap();
        v.extend(k.routes_full(true, MAIN_TABLE).unwrap());
        v
    }

    #[test]
    fn a_refused_operation_is_reported_the_rest_applied_and_the_next_pass_retries_it() {
        let mut k = fake();
        let w = want();
        k.fail_next_route_add();
        let have = dump(&mut k);
        let done = super::apply(&mut k, plan(&w, &have, &pods()), AddMode::Replace);
        assert_eq!(done.failed.len(), 1, "{:?}", done.failed);
        assert_eq!(done.set.len(), 2);
        let (RouteOp::Add(refused), e) = &done.failed[0] else {
            panic!("{:?}", done.failed)
        };
        assert_eq!(e.errno(), Some(libc::ENOBUFS));
        assert!(k.routes_to(refused.dst).is_empty());
        // The next pass plans exactly the refused route again, and then nothing.
        let have = dump(&mut k);
        let again = plan(&w, &have, &pods());
        assert_eq!(again, vec![RouteOp::Add(refused.clone())]);
        let done = super::apply(&mut k, again, AddMode::Replace);
        assert!(done.failed.is_empty() && done.set.len() == 1);
        let have = dump(&mut k);
        assert!(plan(&w, &have, &pods()).is_empty());
    }

    #[test]
    fn a_refused_delete_keeps_the_route_until_the_next_pass() {
        let mut k = fake();
        let stale = Route {
            dst: "10.244.9.0/26".parse().unwrap(),
            ..want()[0].clone()
        };
        k.put_route(stale.clone());
        k.fail_next_route_del();
        let have = dump(&mut k);
        let done = super::apply(&mut k, plan(&[], &have, &pods()), AddMode::Replace);
        assert!(matches!(&done.failed[..], [(RouteOp::Delete(x), _)] if *x == stale));
        assert_eq!(k.routes_to(stale.dst), vec![stale.clone()]);
        let have = dump(&mut k);
        let done = super::apply(&mut k, plan(&[], &have, &pods()), AddMode::Replace);
        assert_eq!(done.removed, vec![stale.clone()]);
        assert!(k.routes_to(stale.dst).is_empty());
    }

    #[test]
    fn an_exclusive_add_never_replaces_a_route_that_appeared_after_the_listing() {
        let mut k = fake();
        let w = want();
        let have = dump(&mut k);
        let ops = plan_with(&w[1..2], &have, &bgp_owned);
        // Another daemon routes the destination between the listing and the add.
        let bird = foreign("10.244.1.0/26", 12);
        k.put_route(bird.clone());
        let done = super::apply(&mut k, ops, AddMode::Exclusive);
        assert!(done.set.is_empty());
        assert!(done.failed[0].1.is_already_exists(), "{:?}", done.failed);
        assert_eq!(k.routes_to(bird.dst), vec![bird.clone()]);
        // The same plan with replace would have taken it over: exclusive is what BGP needs.
        let have = dump(&mut k);
        assert_eq!(
            plan_with(&w[1..2], &have, &bgp_owned),
            vec![RouteOp::Blocked {
                want: w[1].clone(),
                foreign: bird
            }]
        );
    }

    #[test]
    fn each_owner_plans_only_its_own_routes() {
        let w = want();
        let mut bgp = as_reported(&w[1]);
        bgp.protocol = TERN_BGP_ROUTE_PROTOCOL;
        // To the reconciler a BGP route on its destination is foreign, and the reverse.
        assert!(matches!(
            &plan(&w[1..2], std::slice::from_ref(&bgp), &pods())[..],
            [RouteOp::Blocked { .. }]
        ));
        let mut bgp_want = w[1].clone();
        bgp_want.protocol = TERN_BGP_ROUTE_PROTOCOL;
        assert!(matches!(
            &plan_with(
                std::slice::from_ref(&bgp_want),
                &[as_reported(&w[1])],
                &bgp_owned
            )[..],
            [RouteOp::Blocked { .. }]
        ));
        assert!(plan_with(&[], &[as_reported(&w[1])], &bgp_owned).is_empty());
        assert_eq!(
            plan_with(&[], std::slice::from_ref(&bgp), &bgp_owned),
            vec![RouteOp::Delete(bgp)]
        );
    }
}
