//! A stateful in-memory kernel behind the [`crate::kernel`] traits, for tests without root
//! (feature `test-support`; never in a binary). It keeps links, addresses, routes,
//! neighbours, FDB entries and the nftables batches applied, and answers as the kernel does
//! where the agent relies on it:
//!
//! - a route add (`NLM_F_EXCL`) to a destination the table already routes is EEXIST; a
//!   replace overwrites the route to the same destination and table; deleting a route that
//!   is not there is ESRCH, a neighbour or FDB entry ENOENT;
//! - anything naming an absent link is ENODEV; a route out of a link that is down is ENETDOWN
//!   (and taking a link down drops its routes, as IPv4 does); a gateway that no connected
//!   route covers (and is not `onlink`) is ENETUNREACH, and a gateway route reads back with
//!   the device it resolved to;
//! - an address on an up link has its connected route (protocol kernel, scope link) in the
//!   dump, as long as both exist;
//! - a second link of a name is EEXIST, a second VXLAN device of a VNI and port in the same
//!   family (of its local address) too; a link
//!   kind marked [`FakeKernel::unsupported`] is EOPNOTSUPP.
//! - namespaces: a [`NetNs`] handed to it (any descriptor: the fake tells them apart by the
//!   file they refer to) is a namespace of its own, created with `lo` at first sight. A veth
//!   pair spans two namespaces, the host end carrying a `link_netnsid`, and deleting either
//!   end deletes both, as the kernel does; [`FakeKernel::in_netns`] reads a pod's namespace.
//! - sysctls: a key under `net/ipv4/conf/<if>/`, `net/ipv6/conf/<if>/` or `net/ipv4/neigh/<if>/`
//!   exists while the interface does (`all` and `default` always); keys under a prefix marked
//!   [`FakeKernel::absent_sysctls`] never exist (IPv6 disabled).
//!
//! Failure injection is one-shot: [`FakeKernel::fail_next`] makes the next call of an
//! [`Op`] fail with an errno (and change nothing), after which the kernel behaves again, as
//! Felix's `FailNextRouteAdd`-style flags do. Clones share one state, so a test keeps a clone
//! to inspect what the code under test (holding another) did.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::IpNet;
use tern_nft::TableChange;

use crate::Result;
use crate::error::LinuxError;
use crate::kernel::{
    Addresses, Links, Neighbours, NftApply, PodNamespaces, PodSide, Routes, Sysctls,
};
use crate::netlink::{
    FdbEntry, Link, MAIN_TABLE, Neighbour, Route, RouteKind, Scope, VethOptions, VxlanInfo,
    describe,
};
use crate::netns::NetNs;

/// `RTPROT_KERNEL`: the protocol of connected routes.
pub const KERNEL_PROTOCOL: u8 = 2;
/// `NUD_PERMANENT`.
pub const NUD_PERMANENT: u16 = 0x80;

/// A kind of kernel request, for failure injection and call counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// Listing links (`links`, `link_by_*`, `vxlan_devices`).
    LinkList,
    /// Creating a link.
    LinkAdd,
    /// Deleting a link.
    LinkDel,
    /// Changing a link (up, down, MAC, MTU).
    LinkSet,
    /// Listing addresses.
    AddrList,
    /// Adding an address.
    AddrAdd,
    /// Listing routes.
    RouteList,
    /// `RTM_NEWROUTE`: an add or a replace.
    RouteAdd,
    /// Deleting a route.
    RouteDel,
    /// Listing neighbours or FDB entries.
    NeighList,
    /// Adding a neighbour.
    NeighAdd,
    /// Deleting a neighbour.
    NeighDel,
    /// Adding an FDB entry.
    FdbAdd,
    /// Deleting an FDB entry.
    FdbDel,
    /// An nfnetlink batch.
    NftBatch,
    /// An `nft -f` script.
    NftScript,
    /// Writing a sysctl.
    SysctlSet,
    /// Entering a pod's namespace ([`PodNamespaces::enter_pod`]).
    NetnsEnter,
}

/// What reached nftables, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftApplied {
    /// One nfnetlink batch.
    Batch {
        /// The table.
        table: String,
        /// Its changes.
        changes: Vec<TableChange>,
    },
    /// One `nft -f` script.
    Script(String),
}

impl NftApplied {
    /// True for a batch or script that deletes and re-creates the table (a full resync).
    pub fn is_full(&self) -> bool {
        match self {
            NftApplied::Batch { changes, .. } => changes.contains(&TableChange::DeleteTable),
            NftApplied::Script(s) => s.contains("delete table"),
        }
    }
}

/// A namespace of the fake: 0 is the node's, the others pods' ([`FakeKernel::in_netns`]).
type NsKey = u32;

#[derive(Debug, Clone)]
struct FakeLink {
    link: Link,
    /// VNI, port and local address of a VXLAN device.
    vxlan: Option<(u32, u16, IpAddr)>,
    /// The other end of a veth pair: its namespace and index there.
    peer: Option<(NsKey, u32)>,
}

/// One network namespace.
#[derive(Debug, Default)]
struct State {
    next_index: u32,
    links: BTreeMap<u32, FakeLink>,
    addresses: Vec<(u32, IpNet)>,
    routes: Vec<Route>,
    neighbours: Vec<Neighbour>,
    fdb: Vec<FdbEntry>,
    nft: Vec<NftApplied>,
    sysctls: BTreeMap<String, String>,
}

/// Every namespace, and what is shared between them (failure injection, call counts).
#[derive(Debug, Default)]
struct World {
    spaces: BTreeMap<NsKey, State>,
    /// (st_dev, st_ino) of each namespace descriptor seen, and its key.
    ns_files: HashMap<(u64, u64), NsKey>,
    /// Per op, the verdicts of its next calls: `None` passes, `Some(errno)` fails.
    fail: HashMap<Op, VecDeque<Option<i32>>>,
    calls: HashMap<Op, usize>,
    unsupported: HashSet<String>,
    absent_sysctls: Vec<String>,
}

/// The in-memory kernel; see the module documentation. A value reads and changes one
/// namespace (the node's from [`FakeKernel::new`]); its clones and [`FakeKernel::in_netns`]
/// views share every namespace.
#[derive(Debug, Clone)]
pub struct FakeKernel {
    world: Arc<Mutex<World>>,
    ns: NsKey,
}

/// The locked world, seen as the state of one namespace.
struct NsGuard<'a> {
    w: MutexGuard<'a, World>,
    ns: NsKey,
}

impl Deref for NsGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.w.spaces[&self.ns]
    }
}

impl DerefMut for NsGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.w.spaces.get_mut(&self.ns).expect("namespace exists")
    }
}

impl NsGuard<'_> {
    /// Counts the call and takes its injected failure, if any.
    fn enter(&mut self, op: Op, what: impl FnOnce() -> String) -> Result<()> {
        *self.w.calls.entry(op).or_default() += 1;
        match self.w.fail.get_mut(&op).and_then(VecDeque::pop_front) {
            Some(Some(errno)) => Err(err(errno, what())),
            _ => Ok(()),
        }
    }

    /// Removes a link and, for a veth, its peer in whichever namespace it is.
    fn remove_pair(&mut self, index: u32) -> bool {
        match self.remove_link(index) {
            Some(l) => {
                if let Some((pns, pidx)) = l.peer
                    && let Some(p) = self.w.spaces.get_mut(&pns)
                {
                    p.remove_link(pidx);
                }
                true
            }
            None => false,
        }
    }

    /// Whether sysctl `key` exists in this namespace.
    fn sysctl_exists(&self, key: &str) -> bool {
        if self
            .w
            .absent_sysctls
            .iter()
            .any(|p| key.starts_with(p.as_str()))
        {
            return false;
        }
        let parts: Vec<&str> = key.split('/').collect();
        let per_if = matches!(
            parts.as_slice(),
            ["net", "ipv4" | "ipv6", "conf", _, _] | ["net", "ipv4", "neigh", _, _]
        );
        !per_if || matches!(parts[3], "all" | "default") || self.by_name(parts[3]).is_some()
    }

    fn set_sysctl(&mut self, key: &str, value: &str, must_exist: bool) -> Result<bool> {
        self.enter(Op::SysctlSet, || format!("set sysctl {key}={value}"))?;
        if !self.sysctl_exists(key) {
            if must_exist {
                return Err(LinuxError::io(
                    format!("set sysctl {key}={value} (fake kernel)"),
                    io::Error::from_raw_os_error(libc::ENOENT),
                ));
            }
            return Ok(false);
        }
        self.sysctls.insert(key.into(), value.into());
        Ok(true)
    }
}

impl Default for FakeKernel {
    fn default() -> Self {
        FakeKernel::new()
    }
}

fn err(errno: i32, context: String) -> LinuxError {
    LinuxError::Netlink {
        context: format!("{context} (fake kernel)"),
        source: io::Error::from_raw_os_error(errno),
        ext_ack: None,
    }
}

fn same_family(a: &IpAddr, b: &IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

impl State {
    fn link(&self, index: u32) -> Result<&FakeLink> {
        self.links
            .get(&index)
            .ok_or_else(|| err(libc::ENODEV, format!("link index {index}")))
    }

    fn link_mut(&mut self, index: u32) -> Result<&mut FakeLink> {
        self.links
            .get_mut(&index)
            .ok_or_else(|| err(libc::ENODEV, format!("link index {index}")))
    }

    fn by_name(&self, name: &str) -> Option<u32> {
        self.links
            .values()
            .find(|l| l.link.name == name)
            .map(|l| l.link.index)
    }

    fn add_link(&mut self, mut link: Link, vxlan: Option<(u32, u16, IpAddr)>) -> Result<u32> {
        if self.by_name(&link.name).is_some() {
            return Err(err(libc::EEXIST, format!("create link {}", link.name)));
        }
        self.next_index += 1;
        link.index = self.next_index;
        if link.mac.is_none() && link.kind.as_deref() != Some("ipip") && link.name != "lo" {
            let [a, b, c, d] = link.index.to_be_bytes();
            link.mac = Some([0x02, 0xfa, a, b, c, d]);
        }
        let index = link.index;
        self.links.insert(
            index,
            FakeLink {
                link,
                vxlan,
                peer: None,
            },
        );
        Ok(index)
    }

    fn remove_link(&mut self, index: u32) -> Option<FakeLink> {
        let gone = self.links.remove(&index)?;
        self.addresses.retain(|(i, _)| *i != index);
        self.routes.retain(|r| r.oif != Some(index));
        self.neighbours.retain(|n| n.index != index);
        self.fdb.retain(|f| f.index != index);
        let name = format!("/{}/", gone.link.name);
        self.sysctls.retain(|k, _| !k.contains(&name));
        Some(gone)
    }

    /// The main tables as a dump shows them: the routes added plus the connected route of
    /// every address on an up link.
    fn view(&self) -> Vec<Route> {
        let mut out = self.routes.clone();
        for (index, a) in &self.addresses {
            let up = self.links.get(index).is_some_and(|l| l.link.up);
            let host = a.prefix_len() == a.max_prefix_len();
            if !up || host {
                continue;
            }
            let dst = a.trunc();
            if out.iter().any(|r| r.dst == dst && r.oif == Some(*index)) {
                continue;
            }
            out.push(Route {
                dst,
                kind: RouteKind::Unicast,
                gateway: None,
                oif: Some(*index),
                onlink: false,
                scope: Scope::Link,
                protocol: KERNEL_PROTOCOL,
                table: MAIN_TABLE,
            });
        }
        out
    }

    /// Checks `r` as `fib_check_nh` would and returns it as the kernel would store it (a
    /// gateway route with the device it resolved to).
    fn checked(&self, r: &Route, what: &dyn Fn() -> String) -> Result<Route> {
        if r.gateway.is_some_and(|g| !same_family(&g, &r.dst.addr())) {
            return Err(LinuxError::InvalidArgument(format!(
                "route {} has a gateway of another address family",
                r.dst
            )));
        }
        let mut out = r.clone();
        if r.kind == RouteKind::Blackhole {
            out.gateway = None;
            out.oif = None;
            out.scope = Scope::Universe;
            return Ok(out);
        }
        if let Some(oif) = r.oif {
            let l = self.link(oif).map_err(|_| err(libc::ENODEV, what()))?;
            if !l.link.up {
                return Err(err(libc::ENETDOWN, what()));
            }
        }
        if r.onlink {
            if r.oif.is_none() {
                return Err(err(libc::EINVAL, what()));
            }
            return Ok(out);
        }
        if let Some(gw) = r.gateway {
            let via = self
                .view()
                .into_iter()
                .filter(|x| {
                    x.table == MAIN_TABLE && x.kind == RouteKind::Unicast && x.dst.contains(&gw)
                })
                .max_by_key(|x| x.dst.prefix_len());
            match via {
                Some(x) if x.gateway.is_none() && r.oif.is_none_or(|o| x.oif == Some(o)) => {
                    out.oif = x.oif;
                }
                _ => return Err(err(libc::ENETUNREACH, what())),
            }
        }
        Ok(out)
    }
}

impl State {
    /// A namespace with only `lo` (index 1, up).
    fn with_lo() -> State {
        let mut s = State::default();
        let lo = Link {
            index: 0,
            name: "lo".into(),
            mac: None,
            mtu: 65536,
            up: true,
            kind: None,
            link_netnsid: None,
            peer_index: None,
        };
        s.add_link(lo, None).expect("empty namespace");
        s
    }
}

impl FakeKernel {
    /// A kernel with only `lo` (index 1, up).
    pub fn new() -> FakeKernel {
        let mut w = World::default();
        w.spaces.insert(0, State::with_lo());
        FakeKernel {
            world: Arc::new(Mutex::new(w)),
            ns: 0,
        }
    }

    fn st(&self) -> NsGuard<'_> {
        NsGuard {
            w: self.world.lock().unwrap(),
            ns: self.ns,
        }
    }

    /// The fake namespace of `fd`, created (with `lo`) at first sight.
    fn ns_of(w: &mut World, fd: BorrowedFd<'_>) -> NsKey {
        // SAFETY: fstat writes into the zeroed struct we own; fd is open for the call.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
        assert_eq!(rc, 0, "fake kernel: fstat of a namespace descriptor failed");
        let id = (st.st_dev, st.st_ino);
        if let Some(k) = w.ns_files.get(&id) {
            return *k;
        }
        let key = w.spaces.keys().next_back().copied().unwrap_or(0) + 1;
        w.spaces.insert(key, State::with_lo());
        w.ns_files.insert(id, key);
        key
    }

    /// This kernel as seen from inside `ns` (a pod's namespace), sharing every namespace.
    pub fn in_netns(&self, ns: &NetNs) -> FakeKernel {
        let key = FakeKernel::ns_of(&mut self.world.lock().unwrap(), ns.as_fd());
        FakeKernel {
            world: self.world.clone(),
            ns: key,
        }
    }

    /// Set-up: sysctl keys starting with `prefix` do not exist (`"net/ipv6/"`: IPv6 disabled).
    pub fn absent_sysctls(&self, prefix: &str) {
        self.world
            .lock()
            .unwrap()
            .absent_sysctls
            .push(prefix.into());
    }

    /// The value last written to sysctl `key` in this namespace.
    pub fn sysctl(&self, key: &str) -> Option<String> {
        self.st().sysctls.get(key).cloned()
    }

    /// Every link of this namespace.
    pub fn all_links(&self) -> Vec<Link> {
        self.st().links.values().map(|l| l.link.clone()).collect()
    }

    /// Set-up: a physical device (no kind), up, with `mtu`; returns its index.
    pub fn add_device(&self, name: &str, mtu: u32) -> u32 {
        let link = Link {
            index: 0,
            name: name.into(),
            mac: None,
            mtu,
            up: true,
            kind: None,
            link_netnsid: None,
            peer_index: None,
        };
        self.st()
            .add_link(link, None)
            .expect("fake device name taken")
    }

    /// Set-up: a link of `kind` (a pod's host veth: `"veth"`), up or down.
    pub fn add_link(&self, name: &str, kind: &str, up: bool) -> u32 {
        let link = Link {
            index: 0,
            name: name.into(),
            mac: None,
            mtu: 1500,
            up,
            kind: Some(kind.into()),
            link_netnsid: None,
            peer_index: None,
        };
        self.st()
            .add_link(link, None)
            .expect("fake link name taken")
    }

    /// Set-up: puts `r` in the table as is, unchecked (a route of another program).
    pub fn put_route(&self, r: Route) {
        self.st().routes.push(r);
    }

    /// Set-up: link kinds this kernel has no module for (creating one is EOPNOTSUPP).
    pub fn unsupported(&self, kind: &str) {
        self.st().w.unsupported.insert(kind.into());
    }

    /// Makes the next call of `op` (in any namespace) fail with `errno`, changing nothing.
    /// Several calls queue.
    pub fn fail_next(&self, op: Op, errno: i32) {
        self.st()
            .w
            .fail
            .entry(op)
            .or_default()
            .push_back(Some(errno));
    }

    /// Makes the `n`-th next call of `op` (1 is the next) fail with `errno`; the calls before
    /// it pass. For a test that fails each call of a sequence in turn.
    pub fn fail_nth(&self, op: Op, n: usize, errno: i32) {
        let mut st = self.st();
        let q = st.w.fail.entry(op).or_default();
        q.extend(std::iter::repeat_n(None, n.saturating_sub(1)));
        q.push_back(Some(errno));
    }

    /// Forgets every failure injected and not yet taken.
    pub fn clear_failures(&self) {
        self.st().w.fail.clear();
    }

    /// The next route add or replace fails (ENOBUFS, as under memory pressure).
    pub fn fail_next_route_add(&self) {
        self.fail_next(Op::RouteAdd, libc::ENOBUFS);
    }

    /// The next route delete fails (EBUSY).
    pub fn fail_next_route_del(&self) {
        self.fail_next(Op::RouteDel, libc::EBUSY);
    }

    /// The next link creation fails (ENOMEM).
    pub fn fail_next_link_add(&self) {
        self.fail_next(Op::LinkAdd, libc::ENOMEM);
    }

    /// The next nfnetlink batch is refused (EINVAL, as the kernel refuses a bad batch).
    pub fn fail_next_nft_apply(&self) {
        self.fail_next(Op::NftBatch, libc::EINVAL);
    }

    /// The next `nft -f` script fails.
    pub fn fail_next_nft_script(&self) {
        self.fail_next(Op::NftScript, libc::EINVAL);
    }

    /// How many calls of `op` were made (failed ones included).
    pub fn calls(&self, op: Op) -> usize {
        self.st().w.calls.get(&op).copied().unwrap_or(0)
    }

    /// Every route of every table, as a dump shows them (connected routes included).
    pub fn all_routes(&self) -> Vec<Route> {
        self.st().view()
    }

    /// The routes to `dst` in the main table.
    pub fn routes_to(&self, dst: IpNet) -> Vec<Route> {
        self.all_routes()
            .into_iter()
            .filter(|r| r.dst == dst && r.table == MAIN_TABLE)
            .collect()
    }

    /// The link called `name`.
    pub fn link(&self, name: &str) -> Option<Link> {
        let st = self.st();
        st.by_name(name).map(|i| st.links[&i].link.clone())
    }

    /// Every address.
    pub fn all_addresses(&self) -> Vec<(u32, IpNet)> {
        self.st().addresses.clone()
    }

    /// Every neighbour entry.
    pub fn all_neighbours(&self) -> Vec<Neighbour> {
        self.st().neighbours.clone()
    }

    /// Every FDB entry.
    pub fn all_fdb(&self) -> Vec<FdbEntry> {
        self.st().fdb.clone()
    }

    /// What reached nftables, in order.
    pub fn nft_applied(&self) -> Vec<NftApplied> {
        self.st().nft.clone()
    }
}

impl Links for FakeKernel {
    fn links(&mut self) -> Result<Vec<Link>> {
        let mut st = self.st();
        st.enter(Op::LinkList, || "list links".into())?;
        Ok(st.links.values().map(|l| l.link.clone()).collect())
    }

    fn link_by_name(&mut self, name: &str) -> Result<Option<Link>> {
        crate::netlink::check_ifname(name)?;
        let mut st = self.st();
        st.enter(Op::LinkList, || format!("get link {name}"))?;
        Ok(st.by_name(name).map(|i| st.links[&i].link.clone()))
    }

    fn link_by_index(&mut self, index: u32) -> Result<Option<Link>> {
        let mut st = self.st();
        st.enter(Op::LinkList, || format!("get link index {index}"))?;
        Ok(st.links.get(&index).map(|l| l.link.clone()))
    }

    fn vxlan_devices(&mut self) -> Result<Vec<VxlanInfo>> {
        let mut st = self.st();
        st.enter(Op::LinkList, || "list links".into())?;
        Ok(st
            .links
            .values()
            .filter(|l| l.link.kind.as_deref() == Some("vxlan"))
            .map(|l| VxlanInfo {
                index: l.link.index,
                name: l.link.name.clone(),
                vni: l.vxlan.map(|v| v.0),
                port: l.vxlan.map(|v| v.1),
                local: l.vxlan.map(|v| v.2),
                mac: l.link.mac,
                mtu: l.link.mtu,
                up: l.link.up,
            })
            .collect())
    }

    fn create_vxlan(
        &mut self,
        name: &str,
        vni: u32,
        local: IpAddr,
        dev_index: Option<u32>,
        port: u16,
    ) -> Result<()> {
        crate::netlink::check_ifname(name)?;
        let mut st = self.st();
        let what = || format!("create vxlan link {name} (vni {vni})");
        st.enter(Op::LinkAdd, what)?;
        if st.w.unsupported.contains("vxlan") {
            return Err(err(libc::EOPNOTSUPP, what()));
        }
        if let Some(d) = dev_index {
            st.link(d).map_err(|_| err(libc::ENODEV, what()))?;
        }
        // As the kernel: one device per VNI and port within a family (`vxlan.tern` and
        // `vxlan-v6.tern` share both).
        if st.links.values().any(|l| {
            l.vxlan
                .is_some_and(|v| v.0 == vni && v.1 == port && v.2.is_ipv6() == local.is_ipv6())
        }) {
            return Err(err(libc::EEXIST, what()));
        }
        let link = Link {
            index: 0,
            name: name.into(),
            mac: None,
            mtu: 1450,
            up: false,
            kind: Some("vxlan".into()),
            link_netnsid: None,
            peer_index: None,
        };
        st.add_link(link, Some((vni, port, local)))
            .map_err(|_| err(libc::EEXIST, what()))?;
        Ok(())
    }

    fn create_ipip(&mut self, name: &str, _local: Option<Ipv4Addr>) -> Result<()> {
        crate::netlink::check_ifname(name)?;
        let mut st = self.st();
        let what = || format!("create ipip link {name}");
        st.enter(Op::LinkAdd, what)?;
        if st.w.unsupported.contains("ipip") {
            return Err(err(libc::EOPNOTSUPP, what()));
        }
        let link = Link {
            index: 0,
            name: name.into(),
            mac: None,
            mtu: 1480,
            up: false,
            kind: Some("ipip".into()),
            link_netnsid: None,
            peer_index: None,
        };
        st.add_link(link, None)
            .map_err(|_| err(libc::EEXIST, what()))?;
        Ok(())
    }

    fn delete_link(&mut self, name: &str) -> Result<bool> {
        crate::netlink::check_ifname(name)?;
        let mut st = self.st();
        st.enter(Op::LinkDel, || format!("delete link {name}"))?;
        Ok(match st.by_name(name) {
            Some(i) => st.remove_pair(i),
            None => false,
        })
    }

    fn delete_link_by_index(&mut self, index: u32) -> Result<bool> {
        let mut st = self.st();
        st.enter(Op::LinkDel, || format!("delete link index {index}"))?;
        Ok(st.remove_pair(index))
    }

    fn set_link_up(&mut self, index: u32) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::LinkSet, || format!("set link index {index} up"))?;
        st.link_mut(index)?.link.up = true;
        Ok(())
    }

    fn set_link_down(&mut self, index: u32) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::LinkSet, || format!("set link index {index} down"))?;
        st.link_mut(index)?.link.up = false;
        st.routes.retain(|r| r.oif != Some(index));
        Ok(())
    }

    fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::LinkSet, || format!("set MAC on link index {index}"))?;
        st.link_mut(index)?.link.mac = Some(mac);
        Ok(())
    }

    fn set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::LinkSet, || {
            format!("set MTU {mtu} on link index {index}")
        })?;
        st.link_mut(index)?.link.mtu = mtu;
        Ok(())
    }
}

impl Addresses for FakeKernel {
    fn addresses(&mut self, index: Option<u32>) -> Result<Vec<(u32, IpNet)>> {
        let mut st = self.st();
        st.enter(Op::AddrList, || "list addresses".into())?;
        Ok(st
            .addresses
            .iter()
            .filter(|(i, _)| index.is_none_or(|x| x == *i))
            .copied()
            .collect())
    }

    fn add_address(&mut self, index: u32, addr: IpNet) -> Result<()> {
        let mut st = self.st();
        let what = || format!("add address {addr} to link index {index}");
        st.enter(Op::AddrAdd, what)?;
        st.link(index).map_err(|_| err(libc::ENODEV, what()))?;
        if !st.addresses.contains(&(index, addr)) {
            st.addresses.push((index, addr));
        }
        Ok(())
    }
}

impl Routes for FakeKernel {
    fn routes_full(&mut self, v6: bool, table: u32) -> Result<Vec<Route>> {
        let mut st = self.st();
        st.enter(Op::RouteList, || {
            format!("list IPv{} routes", if v6 { 6 } else { 4 })
        })?;
        Ok(st
            .view()
            .into_iter()
            .filter(|r| r.dst.addr().is_ipv6() == v6 && r.table == table)
            .collect())
    }

    fn add_route_full(&mut self, r: &Route) -> Result<()> {
        let mut st = self.st();
        let what = || format!("add route {}", describe(r));
        st.enter(Op::RouteAdd, what)?;
        let stored = st.checked(r, &what)?;
        if st
            .view()
            .iter()
            .any(|x| x.dst == r.dst && x.table == r.table)
        {
            return Err(err(libc::EEXIST, what()));
        }
        st.routes.push(stored);
        Ok(())
    }

    fn replace_route_full(&mut self, r: &Route) -> Result<()> {
        let mut st = self.st();
        let what = || format!("replace route {}", describe(r));
        st.enter(Op::RouteAdd, what)?;
        let stored = st.checked(r, &what)?;
        match st
            .routes
            .iter_mut()
            .find(|x| x.dst == r.dst && x.table == r.table)
        {
            Some(x) => *x = stored,
            None => st.routes.push(stored),
        }
        Ok(())
    }

    fn delete_route_full(&mut self, r: &Route) -> Result<bool> {
        let mut st = self.st();
        st.enter(Op::RouteDel, || format!("delete route {}", describe(r)))?;
        let found = st.routes.iter().position(|x| {
            x.dst == r.dst
                && x.table == r.table
                && x.kind == r.kind
                && (r.protocol == 0 || x.protocol == r.protocol)
                && (r.gateway.is_none() || x.gateway == r.gateway)
                && (r.oif.is_none() || x.oif == r.oif)
        });
        // The kernel answers ESRCH, which a delete reports as nothing deleted.
        Ok(match found {
            Some(i) => {
                st.routes.remove(i);
                true
            }
            None => false,
        })
    }
}

impl Neighbours for FakeKernel {
    fn neighbours(&mut self, index: Option<u32>) -> Result<Vec<Neighbour>> {
        let mut st = self.st();
        st.enter(Op::NeighList, || "list neighbours".into())?;
        Ok(st
            .neighbours
            .iter()
            .filter(|n| index.is_none_or(|i| i == n.index))
            .cloned()
            .collect())
    }

    fn add_neighbour(&mut self, index: u32, ip: IpAddr, mac: [u8; 6]) -> Result<()> {
        let mut st = self.st();
        let what = || format!("add neighbour {ip} on link index {index}");
        st.enter(Op::NeighAdd, what)?;
        st.link(index).map_err(|_| err(libc::ENODEV, what()))?;
        st.neighbours.retain(|n| !(n.index == index && n.ip == ip));
        st.neighbours.push(Neighbour {
            index,
            ip,
            mac: Some(mac),
            state: NUD_PERMANENT,
        });
        Ok(())
    }

    fn delete_neighbour(&mut self, index: u32, ip: IpAddr) -> Result<bool> {
        let mut st = self.st();
        st.enter(Op::NeighDel, || {
            format!("delete neighbour {ip} on link index {index}")
        })?;
        let before = st.neighbours.len();
        st.neighbours.retain(|n| !(n.index == index && n.ip == ip));
        Ok(st.neighbours.len() != before)
    }

    fn fdb(&mut self, index: u32) -> Result<Vec<FdbEntry>> {
        let mut st = self.st();
        st.enter(Op::NeighList, || format!("list fdb of link index {index}"))?;
        Ok(st
            .fdb
            .iter()
            .filter(|f| f.index == index)
            .cloned()
            .collect())
    }

    fn add_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<()> {
        let mut st = self.st();
        let what = || format!("add fdb dst {dst} on link index {index}");
        st.enter(Op::FdbAdd, what)?;
        st.link(index).map_err(|_| err(libc::ENODEV, what()))?;
        st.fdb.retain(|f| !(f.index == index && f.mac == mac));
        st.fdb.push(FdbEntry {
            index,
            mac,
            dst: Some(dst),
        });
        Ok(())
    }

    fn delete_fdb(&mut self, index: u32, mac: [u8; 6], dst: IpAddr) -> Result<bool> {
        let mut st = self.st();
        st.enter(Op::FdbDel, || {
            format!("delete fdb dst {dst} on link index {index}")
        })?;
        let before = st.fdb.len();
        st.fdb
            .retain(|f| !(f.index == index && f.mac == mac && f.dst == Some(dst)));
        Ok(st.fdb.len() != before)
    }
}

impl Sysctls for FakeKernel {
    fn set_sysctl(&mut self, key: &str, value: &str) -> Result<()> {
        self.st().set_sysctl(key, value, true).map(|_| ())
    }

    fn set_sysctl_if_present(&mut self, key: &str, value: &str) -> Result<bool> {
        self.st().set_sysctl(key, value, false)
    }
}

impl PodNamespaces for FakeKernel {
    fn create_veth_with(&mut self, o: &VethOptions<'_>) -> Result<()> {
        crate::netlink::check_ifname(o.host_name)?;
        crate::netlink::check_ifname(o.peer_name)?;
        let mut w = self.world.lock().unwrap();
        let pns = FakeKernel::ns_of(&mut w, o.peer_ns);
        let mut st = NsGuard { w, ns: self.ns };
        let what = || format!("create veth {} peer {}", o.host_name, o.peer_name);
        st.enter(Op::LinkAdd, what)?;
        let taken_there = st.w.spaces[&pns].by_name(o.peer_name).is_some();
        if st.by_name(o.host_name).is_some() || taken_there {
            return Err(err(libc::EEXIST, what()));
        }
        let end = |name: &str, mac: Option<[u8; 6]>, netnsid: Option<i32>| Link {
            index: 0,
            name: name.into(),
            mac,
            mtu: if o.mtu > 0 { o.mtu } else { 1500 },
            up: o.up,
            kind: Some("veth".into()),
            link_netnsid: netnsid,
            peer_index: None,
        };
        let other = (pns != self.ns).then_some(0);
        let host = st.add_link(end(o.host_name, o.host_mac, other), None)?;
        let there = st.w.spaces.get_mut(&pns).expect("namespace exists");
        let peer = there.add_link(end(o.peer_name, o.peer_mac, other), None)?;
        let p = there.links.get_mut(&peer).expect("just added");
        p.peer = Some((self.ns, host));
        p.link.peer_index = Some(host);
        let h = st.links.get_mut(&host).expect("just added");
        h.peer = Some((pns, peer));
        h.link.peer_index = Some(peer);
        Ok(())
    }

    fn enter_pod(&mut self, pod: &NetNs, _keys: &[&str]) -> Result<PodSide> {
        self.st()
            .enter(Op::NetnsEnter, || format!("enter network namespace {pod}"))?;
        let inside = self.in_netns(pod);
        Ok(PodSide {
            netlink: Box::new(inside.clone()),
            sysctls: Box::new(inside),
        })
    }
}

impl NftApply for FakeKernel {
    fn apply_changes(&mut self, table: &str, changes: &[TableChange]) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::NftBatch, || {
            format!("nftables batch of {} changes", changes.len())
        })?;
        st.nft.push(NftApplied::Batch {
            table: table.into(),
            changes: changes.to_vec(),
        });
        Ok(())
    }

    fn apply_script(&mut self, script: &str) -> Result<()> {
        let mut st = self.st();
        st.enter(Op::NftScript, || "nft -f".into())?;
        st.nft.push(NftApplied::Script(script.into()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TERN_ROUTE_PROTOCOL;

    fn route(dst: &str, gw: Option<&str>) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            kind: RouteKind::Unicast,
            gateway: gw.map(|g| g.parse().unwrap()),
            oif: None,
            onlink: false,
            scope: Scope::Universe,
            protocol: TERN_ROUTE_PROTOCOL,
            table: MAIN_TABLE,
        }
    }

    /// A kernel with eth0 (index 2) holding 198.18.0.1/24.
    fn host() -> (FakeKernel, u32) {
        let mut k = FakeKernel::new();
        let eth0 = k.add_device("eth0", 1500);
        k.add_address(eth0, "198.18.0.1/24".parse().unwrap())
            .unwrap();
        (k, eth0)
    }

    #[test]
    fn routes_answer_as_the_kernel_does() {
        let (mut k, eth0) = host();
        let r = route("10.244.1.0/26", Some("198.18.0.2"));
        k.add_route_full(&r).unwrap();
        // Read back with the device the gateway resolved to.
        assert_eq!(k.routes_to(r.dst)[0].oif, Some(eth0));
        let dup = k.add_route_full(&r).unwrap_err();
        assert!(dup.is_already_exists(), "{dup}");
        // Unreachable gateway; absent device; device down.
        let e = k
            .add_route_full(&route("10.244.2.0/26", Some("203.0.113.1")))
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENETUNREACH));
        let e = k
            .add_route_full(&Route {
                oif: Some(99),
                ..route("10.244.3.0/26", None)
            })
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODEV));
        let veth = k.add_link("tern0", "veth", false);
        let e = k
            .replace_route_full(&Route {
                oif: Some(veth),
                ..route("10.244.0.5/32", None)
            })
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENETDOWN));
        // Replace overwrites; deleting twice deletes once.
        let moved = route("10.244.1.0/26", Some("198.18.0.9"));
        k.replace_route_full(&moved).unwrap();
        assert_eq!(k.routes_to(r.dst).len(), 1);
        assert_eq!(k.routes_to(r.dst)[0].gateway, moved.gateway);
        assert!(k.delete_route_full(&moved).unwrap());
        assert!(!k.delete_route_full(&moved).unwrap());
    }

    #[test]
    fn injected_failures_are_one_shot_and_change_nothing() {
        let (mut k, _) = host();
        let r = route("10.244.1.0/26", Some("198.18.0.2"));
        k.fail_next_route_add();
        assert_eq!(
            k.replace_route_full(&r).unwrap_err().errno(),
            Some(libc::ENOBUFS)
        );
        assert!(k.routes_to(r.dst).is_empty());
        k.replace_route_full(&r).unwrap();
        assert_eq!(k.calls(Op::RouteAdd), 2);
        k.fail_next_route_del();
        assert!(k.delete_route_full(&r).is_err());
        assert_eq!(k.routes_to(r.dst).len(), 1);
        k.fail_next_nft_apply();
        assert!(k.apply_changes("tern", &[TableChange::AddTable]).is_err());
        k.apply_changes("tern", &[TableChange::AddTable]).unwrap();
        assert_eq!(k.nft_applied().len(), 1);
    }

    #[test]
    fn links_addresses_and_neighbours_go_with_their_link() {
        let (mut k, _) = host();
        k.create_vxlan(
            "vxlan.tern",
            4096,
            "198.18.0.1".parse().unwrap(),
            None,
            4789,
        )
        .unwrap();
        let e = k
            .create_vxlan(
                "vxlan.other",
                4096,
                "198.18.0.1".parse().unwrap(),
                None,
                4789,
            )
            .unwrap_err();
        assert!(e.is_already_exists());
        // The other family's device of the same VNI and port is allowed, as in the kernel.
        k.create_vxlan(
            "vxlan-v6.tern",
            4096,
            "2001:db8::11".parse().unwrap(),
            None,
            4789,
        )
        .unwrap();
        assert!(k.delete_link("vxlan-v6.tern").unwrap());
        let vx = k.link("vxlan.tern").unwrap();
        assert!(!vx.up);
        k.set_link_up(vx.index).unwrap();
        k.add_address(vx.index, "10.244.0.0/32".parse().unwrap())
            .unwrap();
        let tip = "10.244.1.0".parse().unwrap();
        k.add_neighbour(vx.index, tip, [2; 6]).unwrap();
        k.add_fdb(vx.index, [2; 6], "198.18.0.2".parse().unwrap())
            .unwrap();
        k.replace_route_full(&Route {
            oif: Some(vx.index),
            onlink: true,
            ..route("10.244.1.0/26", Some("10.244.1.0"))
        })
        .unwrap();
        assert!(k.delete_link("vxlan.tern").unwrap());
        assert!(!k.delete_link("vxlan.tern").unwrap());
        assert!(k.all_neighbours().is_empty() && k.all_fdb().is_empty());
        assert!(k.routes_to("10.244.1.0/26".parse().unwrap()).is_empty());
        assert_eq!(k.all_addresses().len(), 1);
        assert_eq!(
            k.add_neighbour(vx.index, tip, [2; 6]).unwrap_err().errno(),
            Some(libc::ENODEV)
        );
        k.unsupported("ipip");
        assert!(k.create_ipip("tunl0", None).unwrap_err().is_unsupported());
    }

    /// A veth pair spans the node's namespace and a pod's (any descriptor stands for one);
    /// deleting either end deletes both; per-interface sysctls exist while the interface does;
    /// `fail_nth` lets the calls before the n-th pass.
    #[test]
    fn veth_pairs_span_namespaces_and_die_whole() {
        use crate::kernel::{PodNamespaces, Sysctls};
        let dir = std::env::temp_dir().join(format!("tern-fake-ns-{}", std::process::id()));
        std::fs::write(&dir, b"").unwrap();
        let file = std::fs::File::open(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        let pod_ns = NetNs::from_fd(file.try_clone().unwrap().into());
        let (mut k, _) = host();
        let opts = |host: &'static str| VethOptions {
            host_name: host,
            peer_name: "eth0",
            peer_ns: pod_ns.as_fd(),
            mtu: 1450,
            host_mac: Some([0xee; 6]),
            peer_mac: None,
            up: true,
        };
        k.create_veth_with(&opts("tern0")).unwrap();
        // The pod already has an eth0: EEXIST, and nothing is made.
        let e = k.create_veth_with(&opts("tern1")).unwrap_err();
        assert!(e.is_already_exists(), "{e}");
        assert!(k.link("tern1").is_none());
        let host_end = k.link("tern0").unwrap();
        assert!(host_end.link_netnsid.is_some());
        let mut side = k.enter_pod(&pod_ns, &[]).unwrap();
        let peer = side.netlink.link_by_name("eth0").unwrap().unwrap();
        assert_eq!((peer.mtu, host_end.peer_index), (1450, Some(peer.index)));
        assert_eq!(
            k.in_netns(&NetNs::from_fd(file.into())).link("eth0"),
            Some(peer)
        );
        k.set_sysctl("net/ipv4/conf/tern0/proxy_arp", "1").unwrap();
        assert_eq!(
            k.sysctl("net/ipv4/conf/tern0/proxy_arp").as_deref(),
            Some("1")
        );
        assert!(
            k.set_sysctl("net/ipv4/conf/tern9/proxy_arp", "1")
                .unwrap_err()
                .is_not_found()
        );
        k.absent_sysctls("net/ipv6/");
        assert!(
            !k.set_sysctl_if_present("net/ipv6/conf/tern0/forwarding", "1")
                .unwrap()
        );
        k.fail_nth(Op::LinkList, 2, libc::EIO);
        side.netlink.link_by_name("eth0").unwrap();
        assert!(side.netlink.link_by_name("eth0").is_err());
        assert!(k.delete_link("tern0").unwrap());
        assert!(side.netlink.link_by_name("eth0").unwrap().is_none());
        assert!(k.sysctl("net/ipv4/conf/tern0/proxy_arp").is_none());
    }
}
