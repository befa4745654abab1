//! CNI CHECK and the datastore half of STATUS.

use super::PodLifecycle;
use super::errors::{err, ipam_err};
use ipnet::IpNet;
use std::os::fd::OwnedFd;
use tern_api::{CheckRequest, Reply, Response, StatusReply};
use tern_cni::code;
use tern_linux::netns::NetNs;
use tern_linux::veth;

impl PodLifecycle {
    /// Serves a CHECK on the pod namespace `fd`: the wiring is as ADD made it and IPAM still
    /// holds the endpoint's addresses.
    pub fn check(&self, req: CheckRequest, fd: Option<OwnedFd>) -> Response {
        let a = &req.attachment;
        let Some(ep) = self.endpoints.get(a) else {
            return Err(err(
                code::CHECK_FAILED,
                format!(
                    "ternd has no endpoint for container {} interface {} on network {}",
                    a.container_id, a.ifname, a.network
                ),
            ));
        };
        let Some(fd) = fd else {
            return Err(err(
                code::INVALID_ENV,
                "CNI_NETNS: no network namespace was passed with the CHECK request",
            ));
        };
        let ns = NetNs::from_fd(fd);
        let addrs = &ep.ip_networks;
        let checked = self.kernel().and_then(|mut k| {
            veth::check_pod_interface_on(&mut *k, &ep.host_ifname, &a.ifname, &ns, addrs)
        });
        if let Err(e) = checked {
            return Err(err(code::CHECK_FAILED, e.to_string()));
        }
        if let Some(prev) = &req.prev_result {
            for ip in &prev.ips {
                let Ok(n) = ip.address.parse::<IpNet>() else {
                    continue;
                };
                if !addrs.iter().any(|x| x.addr() == n.addr()) {
                    return Err(err(
                        code::CHECK_FAILED,
                        format!(
                            "address {} of the previous result is not on the endpoint",
                            ip.address
                        ),
                    ));
                }
            }
        }
        if !ep.delegated_ipam {
            let held = self.ips_of(a).map_err(|e| ipam_err(&e))?;
            for n in addrs {
                if !held.contains(&n.addr()) {
                    return Err(err(
                        code::CHECK_FAILED,
                        format!(
                            "address {} is not allocated to handle {} in IPAM",
                            n.addr(),
                            a.handle()
                        ),
                    ));
                }
            }
        }
        Ok(Reply::Done)
    }

    /// The datastore half of STATUS (the root asks the Kubernetes source first): the store
    /// answers and a pool can serve this node.
    pub fn status(&self) -> Response {
        if let Err(e) = self.store.revision() {
            return Err(err(
                code::NOT_AVAILABLE,
                format!("ternd cannot reach the datastore: {e}"),
            ));
        }
        let pools = self.ipam.usable_pools(&self.cfg.node_name).map_err(|e| {
            err(
                code::NOT_AVAILABLE,
                format!("ternd cannot read IP pools: {e}"),
            )
        })?;
        if pools.is_empty() {
            return Err(err(
                code::NOT_AVAILABLE,
                format!(
                    "no IP pool is usable for workloads on node {}",
                    self.cfg.node_name
                ),
            ));
        }
        Ok(Reply::Status(StatusReply {
            node: self.cfg.node_name.clone(),
            store_ok: true,
            usable_pools: pools,
            endpoints: self.endpoints.len(),
        }))
    }
}
