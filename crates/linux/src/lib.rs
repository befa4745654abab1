//! tern-linux: the kernel adapters of tern, synchronous and dependency-light so that both the
//! node agent `ternd` (thread per request) and the small CNI plugin binary can use them.
//!
//! - [`netns`]: open / enter / create network namespaces without ever moving the caller's thread;
//! - [`netlink`]: a hand-rolled rtnetlink client (links, addresses, routes, neighbours, FDB);
//! - [`nft`]: `nft -f` (the full-resync fallback) and `nft list`;
//! - [`nft_netlink`]: the `inet tern` table's changes (`tern-nft`) as one nfnetlink batch, no `nft`;
//! - [`sysctl`]: `/proc/sys` of the current thread's namespace;
//! - [`veth`]: the Calico-style pod wiring (veth pair, proxy-ARP, /32 host routes) used by ADD,
//!   DEL and CHECK;
//! - [`kernel`]: the seam: narrow traits (links, addresses, routes, neighbours, nftables)
//!   the reconcilers take, implemented by [`netlink::Handle`] and [`kernel::SystemNft`], and by
//!   the in-memory `fake::FakeKernel` (feature `test-support`) in tests without root.

pub mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
pub mod kernel;
pub mod netlink;
pub mod netns;
pub mod nflog;
pub mod nft;
pub mod nft_netlink;
pub mod signals;
pub mod sysctl;
pub mod veth;

pub use error::{LinuxError, Result};

/// Route protocol number carried by every route tern installs (`proto 84`), so tern can tell its
/// routes from everybody else's.
pub const TERN_ROUTE_PROTOCOL: u8 = 84;

/// Route protocol of the routes ternd learns over BGP (`proto 85`): distinct from
/// [`TERN_ROUTE_PROTOCOL`], so the route reconciler and the BGP speaker never remove each
/// other's routes.
pub const TERN_BGP_ROUTE_PROTOCOL: u8 = 85;

/// MAC of every host-side veth: pods reach 169.254.1.1 through proxy-ARP, which answers with it.
pub const HOST_VETH_MAC: [u8; 6] = [0xee; 6];

pub use tern_api::veth_name::{
    DEFAULT_VETH_PREFIX, MAX_IFNAME_LEN, NAME_DIGITS, attachment_veth_name, host_veth_name,
    veth_name_preimage,
};

/// Longest accepted interface prefix: it leaves the 11 hex digits (44 bits) of the name digest
/// within [`MAX_IFNAME_LEN`].
pub const MAX_INTERFACE_PREFIX_LEN: usize = MAX_IFNAME_LEN - NAME_DIGITS;

/// Prefixes of other software's interfaces (Docker, other CNIs, the kernel's own): a tern
/// prefix equal to one would make their devices look like tern's pod veths.
const RESERVED_PREFIXES: &[&str] = &[
    "veth", "eth", "lo", "docker", "cali", "cni", "flannel", "cilium", "lxc", "vxlan", "tun",
    "tap", "br",
];

/// Checks a host veth prefix (`--interface-prefix`, the plugin's `interface_prefix`): 1-4 bytes
/// of `[a-z0-9]`, not one of the prefixes other software names its devices with. A longer
/// prefix would cut the name digest short (collisions between pods); a shared one would make
/// reconciliation delete other software's veths. The error says why, without the field name.
pub fn validate_interface_prefix(prefix: &str) -> std::result::Result<(), String> {
    if prefix.is_empty() || prefix.len() > MAX_INTERFACE_PREFIX_LEN {
        return Err(format!(
            "{prefix:?} must be 1 to {MAX_INTERFACE_PREFIX_LEN} bytes, so that pod veth names keep {NAME_DIGITS} hex digits of their digest"
        ));
    }
    if !prefix
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Err(format!("{prefix:?} may hold only [a-z0-9]"));
    }
    if RESERVED_PREFIXES.contains(&prefix) {
        return Err(format!(
            "{prefix:?} is the interface prefix of other software (one of {})",
            RESERVED_PREFIXES.join(", ")
        ));
    }
    Ok(())
}

/// Whether `name` has the exact shape of a pod veth name: `prefix` then lowercase hex digits
/// filling the rest of the 15 bytes ([`attachment_veth_name`]; 11 digits for a valid prefix).
pub fn has_pod_veth_shape(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let want = NAME_DIGITS.min(MAX_IFNAME_LEN.saturating_sub(prefix.len()));
    !prefix.is_empty()
        && want > 0
        && rest.len() == want
        && rest
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Name of tern's VXLAN tunnel device (with [`VXLAN_V6_TUNNEL_DEVICE`], the only non-veth
/// devices tern creates and may delete).
pub const VXLAN_TUNNEL_DEVICE: &str = "vxlan.tern";
/// Name of tern's IPv6 VXLAN tunnel device (IPv6 pools over an IPv6 underlay).
pub const VXLAN_V6_TUNNEL_DEVICE: &str = "vxlan-v6.tern";

/// Why tern refuses to delete an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOurs {
    /// The name is not tern's prefix plus the digest's hex digits (or the prefix is empty,
    /// which would match everything).
    Name,
    /// The device is not a veth (`IFLA_INFO_KIND` is this, None for physical devices).
    Kind(Option<String>),
}

impl std::fmt::Display for NotOurs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOurs::Name => write!(
                f,
                "its name is not tern's interface prefix followed by the name digest's hex digits"
            ),
            NotOurs::Kind(k) => write!(
                f,
                "it is a {} device, not a veth",
                k.as_deref().unwrap_or("physical")
            ),
        }
    }
}

/// Whether `link` is a pod veth tern made: a veth whose name is the (non-empty) interface
/// prefix followed by the digest's hex digits ([`has_pod_veth_shape`]). Deletion paths that act
/// on a name from a file or a configuration (the journal, the plugin's DEL while ternd is down)
/// check this first.
pub fn pod_veth_ours(link: &netlink::Link, prefix: &str) -> std::result::Result<(), NotOurs> {
    if !has_pod_veth_shape(&link.name, prefix) {
        return Err(NotOurs::Name);
    }
    if link.kind.as_deref() != Some("veth") {
        return Err(NotOurs::Kind(link.kind.clone()));
    }
    Ok(())
}

/// Whether `link` is any device tern made: a pod veth ([`pod_veth_ours`]) or one of tern's
/// VXLAN tunnel devices.
pub fn tern_device(link: &netlink::Link, prefix: &str) -> bool {
    pod_veth_ours(link, prefix).is_ok()
        || ([VXLAN_TUNNEL_DEVICE, VXLAN_V6_TUNNEL_DEVICE].contains(&link.name.as_str())
            && link.kind.as_deref() == Some("vxlan"))
}

/// What [`delete_pod_veth`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// The veth was deleted.
    Yes,
    /// No interface of that name exists (already gone: not an error for DEL).
    Absent,
    /// An interface of that name exists but is not tern's; it was left alone.
    Refused(NotOurs),
}

/// Deletes the pod veth `name` in the current namespace only when it is one of tern's
/// ([`pod_veth_ours`]); anything else of that name (a bridge, a physical NIC, a veth without
/// the prefix) is left alone and reported. The deletion goes by the index of the link that was
/// checked, so a rename in between cannot redirect it to another device.
pub fn delete_pod_veth(name: &str, prefix: &str) -> Result<Deleted> {
    delete_pod_veth_on(&mut netlink::Handle::new()?, name, prefix)
}

/// [`delete_pod_veth`] on the links `h` (the kernel seam).
pub fn delete_pod_veth_on(h: &mut dyn kernel::Links, name: &str, prefix: &str) -> Result<Deleted> {
    let Some(link) = h.link_by_name(name)? else {
        return Ok(Deleted::Absent);
    };
    if let Err(why) = pod_veth_ours(&link, prefix) {
        return Ok(Deleted::Refused(why));
    }
    Ok(if h.delete_link_by_index(link.index)? {
        Deleted::Yes
    } else {
        Deleted::Absent
    })
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
        // The container-ID form is hashed over "/c3:abc4:eth0" (it used to be sha1("abc"),
        // which pod default/nginx shared with container ID "default.nginx"):
        // printf '/c3:abc4:eth0' | sha1sum -> 459795a13c62e6bab05e83bae34016bf8e1e9fce
        assert_eq!(veth_name_preimage(None, "abc", "eth0"), b"/c3:abc4:eth0");
        let n = host_veth_name("tern", None, "abc");
        assert_eq!(n, "tern459795a13c6");
        let long = host_veth_name("verylongprefix", None, "abc");
        assert_eq!(long.len(), MAX_IFNAME_LEN);
        assert!(long.starts_with("verylongprefix"));
        assert_eq!(host_veth_name("", None, "abc"), n["tern".len()..]);
        // Truncation never splits a multi-byte character.
        let uni = host_veth_name("ééééééé", None, "abc");
        assert!(uni.len() <= MAX_IFNAME_LEN && uni.starts_with("ééééééé"));
    }

    #[test]
    fn secondary_interfaces_and_container_ids_do_not_collide() {
        let pod = |ns, n, i| attachment_veth_name("tern", Some((ns, n)), "cid", i);
        // printf '/p7:default5:nginx4:net1' | sha1sum -> 9e0746bb43d3eaa173af3cc99aaf2a7917b5360c
        assert_eq!(pod("default", "nginx", "net1"), "tern9e0746bb43d");
        // The observed collision: pod x.net1's eth0 and pod x's net1.
        assert_ne!(
            pod("default", "x.net1", "eth0"),
            pod("default", "x", "net1")
        );
        // Empty ifname is eth0; eth0 keeps Calico's name.
        assert_eq!(pod("default", "nginx", ""), "ternc440f455693");
        // A pod and a container ID spelled like "<namespace>.<pod>".
        assert_ne!(
            attachment_veth_name("tern", None, "default.nginx", "eth0"),
            pod("default", "nginx", "eth0")
        );
        // Container IDs with dots.
        assert_ne!(
            attachment_veth_name("tern", None, "a.net1", "eth0"),
            attachment_veth_name("tern", None, "a", "net1")
        );
        // A namespace that is not a DNS label cannot shift the split point.
        assert_ne!(pod("a.b", "c", "eth0"), pod("a", "b.c", "eth0"));
    }

    #[test]
    fn only_prefixed_veths_are_ours() {
        let link = |name: &str, kind: Option<&str>| netlink::Link {
            index: 1,
            name: name.into(),
            mac: None,
            mtu: 1500,
            up: true,
            kind: kind.map(str::to_string),
            link_netnsid: None,
            peer_index: None,
        };
        assert_eq!(
            pod_veth_ours(&link("tern0123456789a", Some("veth")), "tern"),
            Ok(())
        );
        // The exact shape: prefix + 11 lowercase hex digits, nothing shorter, longer or else.
        for name in [
            "tern1234",
            "tern0123456789",
            "ternorphan0abcd",
            "tern0123456789A",
            "tern0123456789a0",
            "terN0123456789a",
        ] {
            assert_eq!(
                pod_veth_ours(&link(name, Some("veth")), "tern"),
                Err(NotOurs::Name),
                "{name}"
            );
        }
        assert_eq!(
            pod_veth_ours(&link("tern0123456789a", Some("bridge")), "tern"),
            Err(NotOurs::Kind(Some("bridge".into())))
        );
        assert_eq!(
            pod_veth_ours(&link("tern0123456789a", None), "tern"),
            Err(NotOurs::Kind(None))
        );
        assert_eq!(
            pod_veth_ours(&link("veth1", Some("veth")), "tern"),
            Err(NotOurs::Name)
        );
        // An empty prefix would make every veth "ours".
        assert_eq!(
            pod_veth_ours(&link("veth1", Some("veth")), ""),
            Err(NotOurs::Name)
        );
        assert!(tern_device(&link("vxlan.tern", Some("vxlan")), "tern"));
        assert!(!tern_device(&link("vxlan.tern", Some("bridge")), "tern"));
        assert!(tern_device(&link("vxlan-v6.tern", Some("vxlan")), "tern"));
        assert!(!tern_device(&link("vxlan-v6.tern", Some("veth")), "tern"));
        assert!(pod_veth_ours(&link("vxlan.tern", Some("vxlan")), "tern").is_err());
    }

    #[test]
    fn interface_prefixes_are_validated() {
        for ok in ["tern", "t", "ab12", "k8s"] {
            assert_eq!(validate_interface_prefix(ok), Ok(()), "{ok}");
            let n = host_veth_name(ok, Some(("default", "nginx")), "x");
            assert!(has_pod_veth_shape(&n, ok), "{n}");
        }
        for (bad, why) in [
            ("", "1 to 4 bytes"),
            ("terns", "1 to 4 bytes"),
            ("mycluster-pod-", "1 to 4 bytes"),
            ("Tern", "[a-z0-9]"),
            ("t-1", "[a-z0-9]"),
            ("veth", "other software"),
            ("cali", "other software"),
            ("br", "other software"),
            ("lo", "other software"),
        ] {
            let e = validate_interface_prefix(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// In a private namespace: a bridge carrying the prefix, and a veth without it, survive
    /// `delete_pod_veth`; a prefixed veth is deleted; a missing name is `Absent`.
    #[test]
    fn delete_pod_veth_refuses_other_devices() {
        assert!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() } == 0,
            "needs root to create a network namespace"
        );
        netns::run_in_new(|| {
            let mut h = netlink::Handle::new().unwrap();
            h.create_bridge("terndeadbeef012").unwrap();
            let here =
                netns::NetNs::open(std::path::Path::new("/proc/thread-self/ns/net")).unwrap();
            h.create_veth("ternfeed0000001", "peer0", here.as_fd(), 0)
                .unwrap();
            h.create_veth("other0", "peer1", here.as_fd(), 0).unwrap();
            assert_eq!(
                delete_pod_veth("terndeadbeef012", "tern").unwrap(),
                Deleted::Refused(NotOurs::Kind(Some("bridge".into())))
            );
            assert_eq!(
                delete_pod_veth("other0", "tern").unwrap(),
                Deleted::Refused(NotOurs::Name)
            );
            assert_eq!(
                delete_pod_veth("other0", "").unwrap(),
                Deleted::Refused(NotOurs::Name)
            );
            assert_eq!(
                delete_pod_veth("ternfeed0000001", "tern").unwrap(),
                Deleted::Yes
            );
            assert_eq!(
                delete_pod_veth("ternfeed0000001", "tern").unwrap(),
                Deleted::Absent
            );
            assert!(h.link_by_name("terndeadbeef012").unwrap().is_some());
            assert!(h.link_by_name("other0").unwrap().is_some());
        })
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

        /// Distinct attachments never share a veth preimage, dots or not.
        #[test]
        fn veth_preimage_is_injective(
            a in attachment(),
            b in attachment(),
        ) {
            let norm = |t: &(Option<(String, String)>, String, String)| {
                let i = if t.2.is_empty() { "eth0".to_string() } else { t.2.clone() };
                // The container ID does not name the veth of a known pod.
                let c = if t.0.is_some() { String::new() } else { t.1.clone() };
                (t.0.clone(), c, i)
            };
            let pre = |t: &(Option<(String, String)>, String, String)| {
                veth_name_preimage(
                    t.0.as_ref().map(|(n, p)| (n.as_str(), p.as_str())),
                    &t.1,
                    &t.2,
                )
            };
            if norm(&a) != norm(&b) {
                proptest::prop_assert_ne!(pre(&a), pre(&b));
            }
        }
    }

    fn part() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        proptest::collection::vec(
            prop_oneof![
                Just('.'),
                Just('/'),
                Just(':'),
                Just('a'),
                Just('1'),
                Just('-'),
                any::<char>()
            ],
            0..8,
        )
        .prop_map(|v| v.into_iter().collect())
    }

    fn attachment()
    -> impl proptest::strategy::Strategy<Value = (Option<(String, String)>, String, String)> {
        use proptest::prelude::*;
        let ifname = prop_oneof![Just(String::new()), Just("eth0".to_string()), part()];
        (proptest::option::of((part(), part())), part(), ifname)
    }
}
