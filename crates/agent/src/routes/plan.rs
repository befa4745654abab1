//! Route sync as a pure plan, Felix's `route_table.go` split: [`kernel_routes`] turns the
//! desired state into kernel routes, [`plan`] diffs them against what the kernel reports and
//! returns the operations to run; the dataplane applies them in a thin loop. Nothing here
//! touches the kernel, so every rule below is tested without root.
//!
//! Ownership: a route is tern's to change or delete only when it has protocol
//! [`TERN_ROUTE_PROTOCOL`] in the main table and does not go out of a pod interface (those
//! `/32`s belong to the endpoint code). Every other route is foreign and never touched; a
//! foreign route holding a destination tern wants is reported ([`RouteOp::Blocked`]), not
//! replaced.

use super::{Desired, Target};
use std::collections::HashSet;
use tern_linux::TERN_ROUTE_PROTOCOL;
use tern_linux::netlink::{MAIN_TABLE, Route, RouteKind, Scope};

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

/// True when the kernel's `have` already is the route `want` asks for. A `want` without a
/// device matches any device: the kernel fills in the one the gateway resolves to.
pub fn same_route(want: &Route, have: &Route) -> bool {
    want.dst == have.dst
        && want.kind == have.kind
        && want.gateway == have.gateway
        && (want.oif.is_none() || want.oif == have.oif)
        && want.onlink == have.onlink
}

/// The kernel routes of the desired state. `vxlan` / `ipip` are the tunnel device indexes;
/// a route through a tunnel that does not exist (yet) is left out.
pub fn kernel_routes(d: &Desired, vxlan: Option<u32>, ipip: Option<u32>) -> Vec<Route> {
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
    let mine: Vec<&Route> = have.iter().filter(|r| owned(r, pod_links)).collect();
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
            .find(|r| r.dst == w.dst && r.table == w.table && !owned(r, pod_links))
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
}
