//! CNI ADD: allocate, wire, record.
//!
//! Order matters for "nothing half-created remains": ADD allocates first (cheap to undo), then
//! wires the kernel (veth pair with the peer made inside the pod's namespace, host sysctls,
//! policy, the pod's side, host routes), then records the endpoint. Every step registers its
//! undo on a guard ([`crate::undo::Undo`]) as soon as it succeeded; an error at any later step
//! returns, and the guard undoes the earlier ones, last first, then lets go of the claims.

use super::PodLifecycle;
use super::errors::{err, ipam_err, link_err, store_err};
use crate::endpoints::Endpoint;
use crate::undo::Undo;
use ipnet::IpNet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use tern_api::{
    AddRequest, Attachment, ErrorReply, Interface, IpConfig, IpamRequest, NetResult, Reply,
    Response, Route,
};
use tern_cni::code;
use tern_ipam::{AllocationAttrs, AssignArgs};
use tern_linux::netns::NetNs;
use tern_linux::veth;
use tern_model::MacAddr;
use tern_model::{EndpointPort, Protocol};

/// How long an ADD or DEL waits for another operation on the same interface.
pub(super) const CLAIM_WAIT: Duration = Duration::from_secs(10);

pub(super) fn busy(host_if: &str) -> ErrorReply {
    err(
        code::TRY_AGAIN_LATER,
        format!("another operation on interface {host_if} is still running; retry"),
    )
}

fn attrs_of(node: &str, a: &Attachment) -> AllocationAttrs {
    let pod = a.pod.clone().unwrap_or_default();
    AllocationAttrs {
        namespace: pod.namespace,
        pod: pod.name,
        node: node.to_string(),
        container_id: a.container_id.clone(),
        ifname: a.ifname.clone(),
    }
}

impl PodLifecycle {
    /// Allocates the addresses an ADD (or a standalone IPAM ADD) asks for. The caller has
    /// registered the release of the attachment's handle already: a failure part way (one of
    /// several requested addresses taken) leaves the others to that undo.
    pub(super) fn allocate(
        &self,
        a: &Attachment,
        req: &IpamRequest,
    ) -> Result<Vec<IpAddr>, ErrorReply> {
        let handle = a.handle();
        let attrs = attrs_of(&self.cfg.node_name, a);
        if !req.requested.is_empty() {
            let mut got = Vec::new();
            for s in &req.requested {
                let ip: IpAddr = s.split('/').next().unwrap_or("").parse().map_err(|_| {
                    err(
                        code::INVALID_CONFIG,
                        format!("requested IP {s:?} is not an IP address"),
                    )
                })?;
                self.ipam
                    .assign_ip(ip, &handle, &attrs)
                    .map_err(|e| ipam_err(&e))?;
                got.push(ip);
            }
            return Ok(got);
        }
        let args = AssignArgs {
            handle,
            node: self.cfg.node_name.clone(),
            attrs,
            num_v4: usize::from(req.assign_ipv4),
            num_v6: usize::from(req.assign_ipv6),
            v4_pools: req.ipv4_pools.clone(),
            v6_pools: req.ipv6_pools.clone(),
        };
        if args.num_v4 + args.num_v6 == 0 {
            return Err(err(
                code::INVALID_CONFIG,
                "ipam: both assign_ipv4 and assign_ipv6 are false",
            ));
        }
        self.ipam.auto_assign(&args).map_err(|e| ipam_err(&e))
    }

    /// Registers on `undo` the release of the attachment's handle (a failure is only logged by
    /// the guard: the runtime DELs a failed ADD, and leak repair releases what no endpoint
    /// holds).
    pub(super) fn undo_allocation<'a>(&'a self, undo: &mut Undo<'a>, handle: String) {
        undo.push(format!("the allocation of handle {handle}"), move || {
            self.ipam
                .release_by_handle(&handle)
                .map(drop)
                .map_err(|e| e.to_string())
        });
    }

    /// Serves an ADD on the pod namespace `fd`; `mtu` is the pod MTU when the request sets
    /// none.
    pub fn add(&self, req: AddRequest, fd: Option<OwnedFd>, mtu: u32) -> Response {
        let a = &req.attachment;
        let Some(fd) = fd else {
            return Err(err(
                code::INVALID_ENV,
                "CNI_NETNS: no network namespace was passed with the ADD request",
            ));
        };
        let ns = NetNs::from_fd(fd);
        if self.endpoints.get(a).is_some() {
            return Err(err(
                code::INTERFACE,
                format!(
                    "container {} already has interface {} on network {} (ADD without DEL)",
                    a.container_id, a.ifname, a.network
                ),
            ));
        }
        let host_if = self.host_ifname(a);
        // A pod re-created with the same name gets the same veth name: let an earlier DEL's
        // deferred deletion of that name finish first. Proceeding while it is still queued
        // would replace a device the queue is about to delete: "try again" instead.
        if !self.reaper.wait_gone(&host_if, Duration::from_secs(5)) {
            return Err(err(
                code::TRY_AGAIN_LATER,
                format!("the deletion of the previous interface {host_if} is still queued; retry"),
            ));
        }
        let mut undo = Undo::new(format!("ADD {}/{}", a.container_id, a.ifname));
        // Held until the ADD is recorded or undone: the reconciler leaves the interface alone
        // and leak repair the handle's addresses.
        let Some(claim) = self.in_flight.claim(&host_if, CLAIM_WAIT) else {
            return Err(busy(&host_if));
        };
        undo.hold(claim);
        undo.hold(self.in_flight_handles.hold(&a.handle()));

        let t0 = Instant::now();
        let delegated = req.delegated_ips.is_some();
        let mtu = if req.mtu > 0 { req.mtu } else { mtu };
        let pod_mac = match req.mac.as_deref().map(str::parse::<MacAddr>) {
            Some(Ok(m)) => Some(m.octets()),
            Some(Err(e)) => {
                return Err(err(code::INVALID_CONFIG, format!("runtimeConfig.mac: {e}")));
            }
            None => None,
        };
        // Checked before anything is created, so a bad port has nothing to roll back.
        let ports = endpoint_ports(&req.ports)?;
        // The pod's labels, ports and IPAM annotations (pools, fixed addresses, or addresses
        // without IPAM) from the API server: refused before anything is created.
        let mut ipam_req = req.ipam.clone();
        let pod = match &self.pods {
            Some(p) => p.pod_for_add(a, &mut ipam_req, delegated)?,
            None => None,
        };
        let no_ipam = pod.as_ref().and_then(|p| p.no_ipam.clone());

        // Step 1, the addresses. Allocation and endpoint record stay two store transactions
        // with the kernel wiring between them, so each can be undone. Neither syncs to disk on
        // SQLite (WAL, `synchronous = NORMAL`): a killed ternd loses no commit, and an OS crash
        // can only lose the last whole commits, and with them the pods they were made for.
        let ips = match &no_ipam {
            Some(v) => v.clone(),
            None if delegated => delegated_addresses(&req)?,
            None => {
                self.undo_allocation(&mut undo, a.handle());
                // A refusal of what the annotations asked for names the pod.
                self.allocate(a, &ipam_req).map_err(|mut e| {
                    if let Some(p) = pod.as_ref().filter(|_| ipam_req != req.ipam) {
                        e.msg = format!(
                            "pod {}/{} (IPAM annotations): {}",
                            p.namespace, p.name, e.msg
                        );
                    }
                    e
                })?
            }
        };
        let t_alloc = t0.elapsed();
        let addrs: Vec<IpNet> = ips.iter().map(|ip| IpNet::from(*ip)).collect();
        let cfg = veth::PodInterfaceConfig {
            host_ifname: &host_if,
            pod_ifname: &a.ifname,
            pod_ns: &ns,
            addresses: &addrs,
            mtu,
            pod_mac,
            allow_ip_forwarding: req.allow_ip_forwarding,
        };

        // Step 2, the veth pair, its peer made inside the pod's namespace. Deleting the host
        // end undoes it and everything later in the kernel (the pod end, routes through it).
        let mut k = self
            .kernel()
            .map_err(|e| err(code::AGENT, format!("netlink: {e}")))?;
        let pending = veth::create_pod_veth(&mut *k, &cfg).map_err(link_err)?;
        let host_index = pending.host_index();
        undo.push(format!("veth pair {host_if}"), move || {
            self.kernel()
                .and_then(|mut k| k.delete_link_by_index(host_index))
                .map(drop)
                .map_err(|e| e.to_string())
        });
        // Step 3, the host end's sysctls (they go with the device).
        veth::prepare_host_side(&mut *k, &cfg, &pending).map_err(link_err)?;
        let t_veth = t0.elapsed();

        let mut ep = Endpoint {
            node: self.cfg.node_name.clone(),
            attachment: a.clone(),
            host_ifname: host_if.clone(),
            mac: None,
            ip_networks: addrs.clone(),
            labels: crate::endpoints::workload_labels(a, &req.labels),
            ports,
            // Addresses without IPAM are, like a delegated plugin's, never released by tern.
            delegated_ipam: delegated || no_ipam.is_some(),
        };
        if let Some(p) = pod {
            (p.apply)(&mut ep);
        }
        // Step 4, policy: the pod has no address and the host no route to it yet, so no packet
        // can reach or leave it before its chains, map entries and set elements are in. Its
        // undo is registered first: a failure part way leaves nothing either.
        if let Some(p) = &self.policy {
            let (ep_ns, ep_name) = (ep.namespace(), ep.name());
            undo.push(format!("the policy of endpoint {ep_name}"), move || {
                p.endpoint_removed(&ep_ns, &ep_name)
            });
            p.endpoint_added(&ep).map_err(|e| err(code::AGENT, e))?;
        }
        // Step 5, the pod's side: addresses, routes, sysctls inside its namespace (undone with
        // the pair).
        let pod_link = veth::configure_pod_side(&mut *k, &cfg, &pending).map_err(link_err)?;
        // Step 6, the node's routes to the pod.
        for r in veth::host_routes(&cfg, &pending) {
            k.replace_route_full(&r).map_err(link_err)?;
            undo.push(format!("host route {}", r.dst), move || {
                self.kernel()
                    .and_then(|mut k| k.delete_route_full(&r))
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
        }
        drop(k);
        let iface = pending.interface(&pod_link, mtu);
        ep.mac = Some(MacAddr(iface.pod_mac));
        let t_link = t0.elapsed();
        // Step 7, the endpoint record: the last step, so it needs no undo.
        self.endpoints
            .put(ep.clone())
            .map_err(|e| store_err("recording the endpoint", &e))?;
        if let Some(p) = &self.pods {
            p.endpoint_recorded(&ep);
        }
        let steps = [
            t_alloc,
            t_veth - t_alloc,
            t_link - t_veth,
            t0.elapsed() - t_link,
        ];
        // The same steps in whole microseconds at the end, for readers (tern-bench's split) that
        // should not parse `Duration`'s `Debug` text.
        log::debug!(
            "ADD {}: allocate {:?}, create veth {:?}, policy+configure {:?}, endpoint {:?} (us: {} {} {} {})",
            a.container_id,
            steps[0],
            steps[1],
            steps[2],
            steps[3],
            steps[0].as_micros(),
            steps[1].as_micros(),
            steps[2].as_micros(),
            steps[3].as_micros()
        );
        let result = add_result(a, &iface, &addrs);
        undo.commit();
        Ok(Reply::Result(result))
    }
}

/// The addresses a delegated IPAM plugin returned.
fn delegated_addresses(req: &AddRequest) -> Result<Vec<IpAddr>, ErrorReply> {
    req.delegated_ips
        .iter()
        .flatten()
        .map(|c| {
            c.address.parse::<IpNet>().map(|n| n.addr()).map_err(|_| {
                err(
                    code::INVALID_CONFIG,
                    format!("delegated IPAM returned an invalid address {:?}", c.address),
                )
            })
        })
        .collect()
}

/// The CNI result of an ADD: the host and pod interfaces, the addresses on the pod's, a default
/// route per family.
fn add_result(a: &Attachment, iface: &veth::PodInterface, addrs: &[IpNet]) -> NetResult {
    let mut result = NetResult {
        interfaces: vec![
            Interface {
                name: iface.host_ifname.clone(),
                mac: MacAddr(iface.host_mac).to_string(),
                sandbox: String::new(),
                mtu: None,
            },
            Interface {
                name: a.ifname.clone(),
                mac: MacAddr(iface.pod_mac).to_string(),
                sandbox: a.netns_path.clone(),
                mtu: Some(iface.mtu),
            },
        ],
        ips: Vec::new(),
        routes: Vec::new(),
    };
    let (mut v4, mut v6) = (false, false);
    for n in addrs {
        result.ips.push(IpConfig {
            address: n.to_string(),
            gateway: None,
            interface: Some(1),
        });
        match n {
            IpNet::V4(_) => v4 = true,
            IpNet::V6(_) => v6 = true,
        }
    }
    if v4 {
        result.routes.push(Route {
            dst: "0.0.0.0/0".into(),
            gw: None,
        });
    }
    if v6 {
        result.routes.push(Route {
            dst: "::/0".into(),
            gw: None,
        });
    }
    result
}

/// The named ports of an ADD as the WorkloadEndpoint stores them. The plugin validates
/// `args.cni.ports` already; this guards against other clients of the socket, with code 7
/// naming the field.
pub fn endpoint_ports(ports: &[tern_api::NamedPort]) -> Result<Vec<EndpointPort>, ErrorReply> {
    let mut out: Vec<EndpointPort> = Vec::with_capacity(ports.len());
    for (i, p) in ports.iter().enumerate() {
        let bad = |field: &str, why: String| {
            err(
                code::INVALID_CONFIG,
                format!("args.cni.ports[{i}].{field}: {why}"),
            )
        };
        tern_model::validate_port_name(&p.name).map_err(|e| bad("name", e))?;
        if p.port == 0 {
            return Err(bad("containerPort", "0 is not a port (1-65535)".into()));
        }
        let protocol = match p.protocol.to_ascii_uppercase().as_str() {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            _ => {
                return Err(bad(
                    "protocol",
                    format!("{:?} is not TCP, UDP or SCTP", p.protocol),
                ));
            }
        };
        if let Some(j) = out.iter().position(|q| q.name == p.name) {
            return Err(bad(
                "name",
                format!("{:?} is already the name of args.cni.ports[{j}]", p.name),
            ));
        }
        out.push(EndpointPort {
            name: p.name.clone(),
            protocol,
            port: p.port,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::port;

    #[test]
    fn endpoint_ports_convert_and_reject_bad_ones() {
        let np = |name: &str, port: u16, protocol: &str| tern_api::NamedPort {
            name: name.into(),
            port,
            protocol: protocol.into(),
        };
        let got = endpoint_ports(&[np("http", 8080, "TCP"), np("dns", 53, "udp")]).unwrap();
        assert_eq!(
            got,
            vec![
                port("http", 8080, Protocol::Tcp),
                port("dns", 53, Protocol::Udp)
            ]
        );
        for (ports, want) in [
            (vec![np("Bad", 1, "TCP")], "args.cni.ports[0].name"),
            (
                vec![np("a", 1, "TCP"), np("b", 0, "TCP")],
                "args.cni.ports[1].containerPort: 0 is not a port",
            ),
            (vec![np("a", 1, "ICMP")], "args.cni.ports[0].protocol"),
            (
                vec![np("a", 1, "TCP"), np("a", 2, "UDP")],
                "args.cni.ports[1].name: \"a\" is already",
            ),
        ] {
            let e = endpoint_ports(&ports).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(want), "{} does not contain {want}", e.msg);
        }
    }
}
