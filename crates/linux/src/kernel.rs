//! The kernel seam: narrow traits for what the agent's reconcilers ask of the kernel (links,
//! addresses, routes, neighbours and FDB entries, sysctls, the pod namespaces a veth pair
//! spans, nftables batches), implemented by the real adapters ([`Handle`], [`SystemNft`]) and,
//! behind the `test-support` feature, by the
//! stateful in-memory [`crate::fake::FakeKernel`], so that every sync, rollback and repair
//! path above them is testable without root. Felix's route table takes its netlink the same
//! way.
//!
//! The traits mirror the inherent methods of [`Handle`] one for one (same names, same
//! semantics: deletes answer `Ok(false)` for nothing to delete, an existing address is
//! success), so a caller switches from a concrete handle to `&mut dyn Netlink` without
//! changing a call.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use tern_nft::TableChange;

use crate::Result;
use crate::netlink::{FdbEntry, Handle, Link, Neighbour, Route, VethOptions, VxlanInfo};
use crate::netns::NetNs;
use crate::sysctl::{self, OpenSysctl};

/// Network interfaces: listing, tern's tunnel devices, deletion and attributes.
pub trait Links {
    /// All links.
    fn links(&mut self) -> Result<Vec<Link>>;
    /// The link called `name`, if present.
    fn link_by_name(&mut self, name: &str) -> Result<Option<Link>>;
    /// The link with index `index`, if present.
    fn link_by_index(&mut self, index: u32) -> Result<Option<Link>>;
    /// Every VXLAN device with its VNI, port and local address.
    fn vxlan_devices(&mut self) -> Result<Vec<VxlanInfo>>;
    /// Creates a VXLAN device (down, learning off); EEXIST when the name is taken.
    fn create_vxlan(
        &mut self,
        name: &str,
        vni: u32,
        local: IpAddr,
        dev_index: Option<u32>,
        port: u16,
    ) -> Result<()>;
    /// Creates an IPIP tunnel device (down); EEXIST when the name is taken.
    fn create_ipip(&mut self, name: &str, local: Option<Ipv4Addr>) -> Result<()>;
    /// Deletes the link called `name`; `Ok(false)` when absent.
    fn delete_link(&mut self, name: &str) -> Result<bool>;
    /// Deletes the link with index `index`; `Ok(false)` when absent.
    fn delete_link_by_index(&mut self, index: u32) -> Result<bool>;
    /// Sets the link administratively up.
    fn set_link_up(&mut self, index: u32) -> Result<()>;
    /// Sets the link administratively down.
    fn set_link_down(&mut self, index: u32) -> Result<()>;
    /// Sets the link's MAC address.
    fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()>;
    /// Sets the link's MTU.
    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()>;
}

/// Interface addresses.
pub trait Addresses {
    /// Addresses as `(link index, address/prefix)`, of one link or of all.
    fn addresses(&mut self, index: Option<u32>) -> Result<Vec<(u32, IpNet)>>;
    /// Adds an address; one that already exists is success.
    fn add_address(&mut self, index: u32, addr: IpNet) -> Result<()>;
}

/// Routes of any [`crate::netlink::RouteKind`].
pub trait Routes {
    /// Unicast and blackhole routes of one family in `table`.
    fn routes_full(&mut self, v6: bool, table: u32) -> Result<Vec<Route>>;
    /// Adds a route only when the table has none for its destination (`NLM_F_EXCL`): EEXIST
    /// otherwise.
    fn add_route_full(&mut self, r: &Route) -> Result<()>;
    /// Installs a route or replaces the one to the same destination (`NLM_F_REPLACE`).
    fn replace_route_full(&mut self, r: &Route) -> Result<()>;
    /// Deletes a route; `Ok(false)` when absent.
    fn delete_route_full(&mut self, r: &Route) -> Result<bool>;
}

/// Permanent neighbour (ARP / NDP) and bridge FDB entries.
pub trait Neighbours {
    /// Neighbour entries of one link or of all.
    fn neighbours(&mut self, index: Option<u32>) -> Result<Vec<Neighbour>>;
    /// Adds or replaces a permanent neighbour entry.
    fn add_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()>;
    /// Deletes a neighbour entry; `Ok(false)` when absent.
    fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> Result<bool>;
    /// FDB entries of one device.
    fn fdb(&mut self, index: u32) -> Result<Vec<FdbEntry>>;
    /// Adds or replaces a permanent FDB entry `mac -> dst`.
    fn add_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<()>;
    /// Deletes an FDB entry; `Ok(false)` when absent.
    fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<bool>;
}

/// Everything rtnetlink: what one [`Handle`] (one socket) does.
pub trait Netlink: Links + Addresses + Routes + Neighbours {}

impl<T: Links + Addresses + Routes + Neighbours + ?Sized> Netlink for T {}

/// `/proc/sys` of one network namespace (keys such as `net/ipv4/conf/<if>/proxy_arp`).
pub trait Sysctls {
    /// Writes `value` to `key`; a key that does not exist is an error.
    fn set_sysctl(&mut self, key: &str, value: &str) -> Result<()>;
    /// As [`Sysctls::set_sysctl`], `Ok(false)` when the key does not exist (IPv6 disabled).
    fn set_sysctl_if_present(&mut self, key: &str, value: &str) -> Result<bool>;
}

/// The pod side of a namespace visit: its rtnetlink socket and the sysctl keys opened there.
pub struct PodSide {
    /// Links, addresses and routes inside the pod's namespace.
    pub netlink: Box<dyn Netlink>,
    /// The keys named to [`PodNamespaces::enter_pod`], inside the pod's namespace.
    pub sysctls: Box<dyn Sysctls>,
}

/// What pod wiring asks beyond the node's own namespace: a veth pair whose peer is created
/// directly inside the pod's namespace (never moved there), and one visit of that namespace.
pub trait PodNamespaces {
    /// Creates a veth pair in one request: `o.host_name` here, `o.peer_name` inside
    /// `o.peer_ns`, both with the MTU, MACs and admin state of `o`. EEXIST when a name is taken.
    fn create_veth_with(&mut self, o: &VethOptions<'_>) -> Result<()>;
    /// Opens, in one visit of `pod`, a netlink socket inside it and the sysctl keys `keys`
    /// (the only keys the returned [`PodSide::sysctls`] sets; an absent one reads as absent).
    fn enter_pod(&mut self, pod: &NetNs, keys: &[&str]) -> Result<PodSide>;
}

/// Everything the pod ADD path and the orphan sweep ask of the kernel: the node namespace's
/// links, addresses, routes and sysctls, and the pods' namespaces.
pub trait PodKernel: Netlink + Sysctls + PodNamespaces {}

impl<T: Netlink + Sysctls + PodNamespaces + ?Sized> PodKernel for T {}

/// Sysctls of the calling thread's namespace (the one a [`Handle`] opened on this thread
/// talks to).
impl Sysctls for Handle {
    fn set_sysctl(&mut self, key: &str, value: &str) -> Result<()> {
        sysctl::set(key, value)
    }
    fn set_sysctl_if_present(&mut self, key: &str, value: &str) -> Result<bool> {
        match sysctl::open_if_present(key)? {
            Some(f) => f.set(value).map(|()| true),
            None => Ok(false),
        }
    }
}

impl PodNamespaces for Handle {
    fn create_veth_with(&mut self, o: &VethOptions<'_>) -> Result<()> {
        Handle::create_veth_with(self, o)
    }
    fn enter_pod(&mut self, pod: &NetNs, keys: &[&str]) -> Result<PodSide> {
        let (netlink, files) = pod.open_inside(|| -> Result<_> {
            let h = Handle::new()?;
            let mut files = Vec::with_capacity(keys.len());
            for k in keys {
                files.push((k.to_string(), sysctl::open_if_present(k)?));
            }
            Ok((h, files))
        })??;
        Ok(PodSide {
            netlink: Box::new(netlink),
            sysctls: Box::new(OpenedSysctls(files)),
        })
    }
}

/// Sysctl files opened inside another namespace ([`PodNamespaces::enter_pod`]): writing them
/// later sets that namespace's values, whatever namespace the writer is in.
struct OpenedSysctls(Vec<(String, Option<OpenSysctl>)>);

impl OpenedSysctls {
    fn file(&self, key: &str) -> Result<Option<&OpenSysctl>> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, f)| f.as_ref())
            .ok_or_else(|| {
                crate::LinuxError::InvalidArgument(format!(
                    "sysctl {key} was not opened inside the namespace"
                ))
            })
    }
}

impl Sysctls for OpenedSysctls {
    fn set_sysctl(&mut self, key: &str, value: &str) -> Result<()> {
        match self.file(key)? {
            Some(f) => f.set(value),
            None => Err(crate::LinuxError::io(
                format!("set sysctl {key}={value}"),
                std::io::Error::from_raw_os_error(libc::ENOENT),
            )),
        }
    }
    fn set_sysctl_if_present(&mut self, key: &str, value: &str) -> Result<bool> {
        match self.file(key)? {
            Some(f) => f.set(value).map(|()| true),
            None => Ok(false),
        }
    }
}

/// nftables: a batch of table changes as one transaction, and the `nft -f` fallback.
pub trait NftApply {
    /// Applies `changes` to table `table` (family inet) as one nfnetlink transaction: all of
    /// them or, on an error, none.
    fn apply_changes(&mut self, table: &str, changes: &[TableChange]) -> Result<()>;
    /// Runs `script` through `nft -f` (itself one transaction).
    fn apply_script(&mut self, script: &str) -> Result<()>;
}

/// The real nftables of the calling thread's network namespace: batches on the per-thread
/// cached socket ([`crate::nft_netlink::apply_cached`]), scripts through `nft -f`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemNft;

impl NftApply for SystemNft {
    fn apply_changes(&mut self, table: &str, changes: &[TableChange]) -> Result<()> {
        crate::nft_netlink::apply_cached(table, changes)
    }

    fn apply_script(&mut self, script: &str) -> Result<()> {
        crate::nft::apply(script)
    }
}

impl Links for Handle {
    fn links(&mut self) -> Result<Vec<Link>> {
        Handle::links(self)
    }
    fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        Handle::link_by_name(self, name)
    }
    fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        Handle::link_by_index(self, index)
    }
    fn vxlan_devices(&mut self) -> Result<Vec<VxlanInfo>> {
        Handle::vxlan_devices(self)
    }
    fn create_vxlan(
        &mut self,
        name: &str,
        vni: u32,
        local: IpAddr,
        dev_index: Option<u32>,
        port: u16,
    ) -> Result<()> {
        Handle::create_vxlan(self, name, vni, local, dev_index, port)
    }
    fn create_ipip(&mut self, name: &str, local: Option<Ipv4Addr>) -> Result<()> {
        Handle::create_ipip(self, name, local)
    }
    fn delete_link(&mut self, name: &str) -> Result<bool> {
        Handle::delete_link(self, name)
    }
    fn delete_link_by_index(&mut self, index: u32) -> Result<bool> {
        Handle::delete_link_by_index(self, index)
    }
    fn set_link_up(&mut self, index: u32) -> Result<()> {
        Handle::set_link_up(self, index)
    }
    fn set_link_down(&mut self, index: u32) -> Result<()> {
        Handle::set_link_down(self, index)
    }
    fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        Handle::set_mac(self, index, mac)
    }
    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        Handle::set_mtu(self, index, mtu)
    }
}

impl Addresses for Handle {
    fn addresses(&mut self, index: Option<u32>) -> Result<Vec<(u32, IpNet)>> {
        Handle::addresses(self, index)
    }
    fn add_address(&mut self, index: u32, addr: IpNet) -> Result<()> {
        Handle::add_address(self, index, addr)
    }
}

impl Routes for Handle {
    fn routes_full(&mut self, v6: bool, table: u32) -> Result<Vec<Route>> {
        Handle::routes_full(self, v6, table)
    }
    fn add_route_full(&mut self, r: &Route) -> Result<()> {
        Handle::add_route_full(self, r)
    }
    fn replace_route_full(&mut self, r: &Route) -> Result<()> {
        Handle::replace_route_full(self, r)
    }
    fn delete_route_full(&mut self, r: &Route) -> Result<bool> {
        Handle::delete_route_full(self, r)
    }
}

impl Neighbours for Handle {
    fn neighbours(&mut self, index: Option<u32>) -> Result<Vec<Neighbour>> {
        Handle::neighbours(self, index)
    }
    fn add_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()> {
        Handle::add_neighbour(self, index, ip, mac)
    }
    fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> Result<bool> {
        Handle::delete_neighbour(self, index, ip)
    }
    fn fdb(&mut self, index: u32) -> Result<Vec<FdbEntry>> {
        Handle::fdb(self, index)
    }
    fn add_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<()> {
        Handle::add_fdb(self, index, mac, dst)
    }
    fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<bool> {
        Handle::delete_fdb(self, index, mac, dst)
    }
}
