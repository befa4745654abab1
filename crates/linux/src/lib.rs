//! tern-linux: the kernel adapters of tern, synchronous and dependency-light so that both the
//! node agent `ternd` (thread per request) and the small CNI plugin binary can use them.
//!
//! - [`netns`]: open / enter / create network namespaces without ever moving the caller's thread;
//! - [`netlink`]: a hand-rolled rtnetlink client (links, addresses, routes, neighbours, FDB);
//! - [`nft_netlink`]: nftables set-element updates as one nfnetlink batch (no `nft` process);
//! - [`sysctl`]: `/proc/sys` of the current thread's namespace;
//! - [`veth`]: the Calico-style pod wiring (veth pair, proxy-ARP, /32 host routes) used by ADD,
//!   DEL and CHECK.

pub mod error;
pub mod netlink;
pub mod netns;
pub mod nft;
pub mod nft_netlink;
pub mod sysctl;
pub mod veth;

pub use error::{LinuxError, Result};

use sha1::{Digest, Sha1};

/// Route protocol number carried by every route tern installs (`proto 84`), so tern can tell its
/// routes from everybody else's.
pub const TERN_ROUTE_PROTOCOL: u8 = 84;

/// Route protocol of the routes ternd learns over BGP (`proto 85`): distinct from
/// [`TERN_ROUTE_PROTOCOL`], so the route reconciler and the BGP speaker never remove each
/// other's routes.
pub const TERN_BGP_ROUTE_PROTOCOL: u8 = 85;

/// MAC of every host-side veth: pods reach 169.254.1.1 through proxy-ARP, which answers with it.
pub const HOST_VETH_MAC: [u8; 6] = [0xee; 6];

/// Default host veth name prefix.
pub const DEFAULT_VETH_PREFIX: &str = "tern";

/// Linux interface name limit (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// Host-side veth name of one attachment: [`host_veth_name`] for `eth0` (Calico's name), and
/// for any other interface of the same pod a name hashed over `<namespace>.<pod>.<ifname>` (or
/// `<containerID>.<ifname>`), so a pod's second interface never collides with its first.
pub fn attachment_veth_name(
    prefix: &str,
    pod: Option<(&str, &str)>,
    container_id: &str,
    ifname: &str,
) -> String {
    if ifname == "eth0" || ifname.is_empty() {
        return host_veth_name(prefix, pod, container_id);
    }
    match pod {
        Some((ns, name)) => host_veth_name(
            prefix,
            Some((ns, &format!("{name}.{ifname}"))),
            container_id,
        ),
        None => host_veth_name(prefix, None, &format!("{container_id}.{ifname}")),
    }
}

/// Host-side veth name: `prefix` + the first 11 hex digits of `sha1("<namespace>.<pod>")` (or of
/// `container_id` when no pod is known), truncated to 15 bytes. Same scheme as Calico's
/// `cali` + sha1, so names are stable across ADD/DEL/CHECK and across agent restarts.
pub fn host_veth_name(prefix: &str, pod: Option<(&str, &str)>, container_id: &str) -> String {
    let mut h = Sha1::new();
    match pod {
        Some((ns, name)) => {
            h.update(ns.as_bytes());
            h.update(b".");
            h.update(name.as_bytes());
        }
        None => h.update(container_id.as_bytes()),
    }
    let digest = hex::encode(h.finalize());
    let mut name = String::with_capacity(MAX_IFNAME_LEN);
    name.push_str(prefix);
    name.push_str(&digest[..11]);
    let mut cut = MAX_IFNAME_LEN.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    name.truncate(cut);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_name_pinned_to_sha1_of_namespace_dot_pod() {
        // printf default.nginx | sha1sum -> c440f455693b69cdd48a37aa5ecd78038f50413d
        assert_eq!(
            host_veth_name("tern", Some(("default", "nginx")), "ignored"),
            "ternc440f455693"
        );
        assert_eq!(
            host_veth_name("cali", Some(("default", "nginx")), "x"),
            "calic440f455693"
        );
    }

    #[test]
    fn veth_name_falls_back_to_container_id_and_truncates() {
        // printf abc | sha1sum -> a9993e364706816aba3e25717850c26c9cd0d89d
        assert_eq!(host_veth_name("tern", None, "abc"), "terna9993e36470");
        let long = host_veth_name("verylongprefix", None, "abc");
        assert_eq!(long, "verylongprefixa");
        assert_eq!(host_veth_name("", None, "abc"), "a9993e36470");
        // Truncation never splits a multi-byte character.
        let uni = host_veth_name("ééééééé", None, "abc");
        assert!(uni.len() <= MAX_IFNAME_LEN && uni.starts_with("ééééééé"));
    }
}
