//! Routing information bases: Adj-RIB-In per peer, the Loc-RIB (best path per prefix) and the
//! per-peer Adj-RIB-Out, with route reflection (RFC 4456) and graceful-restart stale handling.
//!
//! The export side reconciles rather than scripts: [`Rib::take_updates`] computes what each
//! Established peer should hold, diffs it against what was last sent (Adj-RIB-Out) and emits
//! exactly the UPDATEs that close the gap, then End-of-RIB once after a session comes up.
//!
//! Invariants:
//! - A route whose announcement fails an import check (AS loop, own ORIGINATOR_ID, own cluster
//!   ID in CLUSTER_LIST) replaces any earlier route for that prefix from the same peer with
//!   nothing: the rejected announcement is an implicit withdrawal.
//! - Stale routes (graceful-restart helper) stay eligible for best-path selection, so forwarding
//!   is undisturbed while the peer restarts; a fresh announcement clears the stale mark.
//! - Every exported UPDATE fits in [`MAX_MESSAGE_LEN`].
//! - With an [`ImportFilter`], a route the filter refuses stays in its peer's Adj-RIB-In (so a
//!   later policy change can admit it without a route refresh, as BIRD's `import keep
//!   filtered`) but never takes part in best-path selection: it is neither installed nor
//!   exported to any peer.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::codec::{
    AsSegment, CodecOptions, FLAG_PARTIAL, FLAG_TRANSITIVE, Family, HEADER_LEN, MAX_MESSAGE_LEN,
    MpReach, MpUnreach, Origin, PathAttribute, SegmentType, UnknownAttribute, Update,
};
use crate::fsm::{Negotiated, Retention};

/// Default LOCAL_PREF (RFC 4271 leaves it to policy; 100 is universal practice).
pub const DEFAULT_LOCAL_PREF: u32 = 100;

/// RIB errors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RibError {
    /// The peer is not configured.
    #[error("BGP peer {0} is not configured in the RIB")]
    UnknownPeer(IpAddr),
    /// The peer is configured already.
    #[error("BGP peer {0} is already configured in the RIB")]
    PeerExists(IpAddr),
}

/// Import policy: decides whether the route for a prefix learned from a peer may be used.
/// Evaluated at best-path selection, so replacing the filter re-evaluates every stored route.
#[derive(Clone)]
pub struct ImportFilter(Arc<ImportFn>);

/// The predicate inside an [`ImportFilter`]: (peer, prefix, the route's next hop).
type ImportFn = dyn Fn(IpAddr, &IpNet, Option<IpAddr>) -> bool + Send + Sync;

impl ImportFilter {
    /// A filter from a predicate over (peer address, prefix); `true` accepts.
    pub fn new(f: impl Fn(IpAddr, &IpNet) -> bool + Send + Sync + 'static) -> ImportFilter {
        ImportFilter(Arc::new(move |peer, prefix, _| f(peer, prefix)))
    }

    /// A filter from a predicate over (peer address, prefix, the route's next hop), for
    /// policies where who the traffic goes to matters (a reflected route keeps its
    /// originator's next hop); `true` accepts.
    pub fn with_next_hop(
        f: impl Fn(IpAddr, &IpNet, Option<IpAddr>) -> bool + Send + Sync + 'static,
    ) -> ImportFilter {
        ImportFilter(Arc::new(f))
    }

    /// Whether the route for `prefix` from `peer` is accepted (judged without a next hop).
    pub fn accepts(&self, peer: IpAddr, prefix: &IpNet) -> bool {
        (self.0)(peer, prefix, None)
    }

    /// Whether the route for `prefix` from `peer` via `next_hop` is accepted.
    pub fn accepts_via(&self, peer: IpAddr, prefix: &IpNet, next_hop: Option<IpAddr>) -> bool {
        (self.0)(peer, prefix, next_hop)
    }
}

impl std::fmt::Debug for ImportFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImportFilter")
    }
}

/// Speaker-wide RIB settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RibConfig {
    /// Our AS.
    pub local_as: u32,
    /// Our BGP identifier (ORIGINATOR_ID loop detection, ORIGINATOR_ID for reflected routes).
    pub router_id: Ipv4Addr,
    /// With a cluster ID this speaker is a route reflector (RFC 4456).
    pub cluster_id: Option<Ipv4Addr>,
}

/// Per-peer RIB settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerConfig {
    /// The peer's address (its identity in the RIB).
    pub address: IpAddr,
    /// The peer's AS (iBGP when equal to ours).
    pub asn: u32,
    /// Our IPv4 next hop toward this peer (session source address).
    pub next_hop_v4: Option<Ipv4Addr>,
    /// Our IPv6 next hop toward this peer.
    pub next_hop_v6: Option<Ipv6Addr>,
    /// The peer is a route-reflector client (only meaningful with a cluster ID).
    pub rr_client: bool,
    /// Set ourselves as next hop for eBGP-learned routes sent to this iBGP peer
    /// (always done toward eBGP peers and for our own routes).
    pub next_hop_self: bool,
    /// Toward this eBGP peer, keep a route's existing next hop instead of rewriting it to
    /// ourselves (e.g. a route server or a ToR that should forward straight to the node).
    #[serde(default)]
    pub keep_original_next_hop: bool,
}

/// The attributes of one route, normalised from UPDATE path attributes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RouteAttrs {
    /// ORIGIN.
    pub origin: Origin,
    /// AS_PATH.
    pub as_path: Vec<AsSegment>,
    /// NEXT_HOP or the MP_REACH_NLRI next hop; `None` for our own routes before export.
    pub next_hop: Option<IpAddr>,
    /// MULTI_EXIT_DISC.
    pub med: Option<u32>,
    /// LOCAL_PREF.
    pub local_pref: Option<u32>,
    /// ATOMIC_AGGREGATE present.
    pub atomic_aggregate: bool,
    /// AGGREGATOR (AS, address).
    pub aggregator: Option<(u32, Ipv4Addr)>,
    /// COMMUNITIES.
    pub communities: Vec<u32>,
    /// ORIGINATOR_ID.
    pub originator_id: Option<Ipv4Addr>,
    /// CLUSTER_LIST.
    pub cluster_list: Vec<Ipv4Addr>,
    /// Unrecognised optional attributes.
    pub unknown: Vec<UnknownAttribute>,
}

impl RouteAttrs {
    /// Attributes of a locally originated route: ORIGIN IGP, empty AS_PATH.
    pub fn local() -> RouteAttrs {
        RouteAttrs {
            origin: Origin::Igp,
            as_path: Vec::new(),
            next_hop: None,
            med: None,
            local_pref: Some(DEFAULT_LOCAL_PREF),
            atomic_aggregate: false,
            aggregator: None,
            communities: Vec::new(),
            originator_id: None,
            cluster_list: Vec::new(),
            unknown: Vec::new(),
        }
    }

    /// Builds route attributes from an UPDATE's path attributes and a next hop.
    pub fn from_update(update: &Update, next_hop: Option<IpAddr>) -> RouteAttrs {
        let mut a = RouteAttrs {
            next_hop,
            local_pref: None,
            ..RouteAttrs::local()
        };
        for attr in &update.attributes {
            match attr {
                PathAttribute::Origin(o) => a.origin = *o,
                PathAttribute::AsPath(p) => a.as_path = p.clone(),
                PathAttribute::MultiExitDisc(m) => a.med = Some(*m),
                PathAttribute::LocalPref(l) => a.local_pref = Some(*l),
                PathAttribute::AtomicAggregate => a.atomic_aggregate = true,
                PathAttribute::Aggregator { asn, address } => a.aggregator = Some((*asn, *address)),
                PathAttribute::Communities(c) => a.communities = c.clone(),
                PathAttribute::OriginatorId(id) => a.originator_id = Some(*id),
                PathAttribute::ClusterList(c) => a.cluster_list = c.clone(),
                PathAttribute::Unknown(u) => a.unknown.push(u.clone()),
                PathAttribute::NextHop(_)
                | PathAttribute::MpReach(_)
                | PathAttribute::MpUnreach(_) => {}
            }
        }
        a
    }

    /// AS_PATH length for best-path selection: each AS_SET counts as one (RFC 4271 §9.1.2.2).
    pub fn as_path_len(&self) -> usize {
        self.as_path
            .iter()
            .map(|s| match s.kind {
                SegmentType::AsSequence => s.asns.len(),
                SegmentType::AsSet => 1,
            })
            .sum()
    }

    /// The neighbouring AS the route came from (first AS of the path), if any.
    pub fn neighbor_as(&self) -> Option<u32> {
        match self.as_path.first() {
            Some(s) if s.kind == SegmentType::AsSequence => s.asns.first().copied(),
            _ => None,
        }
    }

    /// Whether `asn` appears anywhere in the AS_PATH.
    pub fn path_contains(&self, asn: u32) -> bool {
        self.as_path.iter().any(|s| s.asns.contains(&asn))
    }

    /// Prepends `asn` to the AS_PATH.
    fn prepend(&mut self, asn: u32) {
        match self.as_path.first_mut() {
            Some(s) if s.kind == SegmentType::AsSequence && s.asns.len() < 255 => {
                s.asns.insert(0, asn)
            }
            _ => self.as_path.insert(
                0,
                AsSegment {
                    kind: SegmentType::AsSequence,
                    asns: vec![asn],
                },
            ),
        }
    }

    /// Path attributes for an UPDATE (without NEXT_HOP / MP_REACH), ascending type code.
    fn to_attributes(&self) -> Vec<PathAttribute> {
        let mut v = vec![
            PathAttribute::Origin(self.origin),
            PathAttribute::AsPath(self.as_path.clone()),
        ];
        if let Some(m) = self.med {
            v.push(PathAttribute::MultiExitDisc(m));
        }
        if let Some(l) = self.local_pref {
            v.push(PathAttribute::LocalPref(l));
        }
        if self.atomic_aggregate {
            v.push(PathAttribute::AtomicAggregate);
        }
        if let Some((asn, address)) = self.aggregator {
            v.push(PathAttribute::Aggregator { asn, address });
        }
        if !self.communities.is_empty() {
            v.push(PathAttribute::Communities(self.communities.clone()));
        }
        if let Some(id) = self.originator_id {
            v.push(PathAttribute::OriginatorId(id));
        }
        if !self.cluster_list.is_empty() {
            v.push(PathAttribute::ClusterList(self.cluster_list.clone()));
        }
        v.extend(self.unknown.iter().cloned().map(PathAttribute::Unknown));
        v
    }
}

/// Where a route came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RouteSource {
    /// Originated by this speaker.
    Local,
    /// Learned from the peer with this address.
    Peer(IpAddr),
}

/// How a best route was learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteKind {
    /// Our own route: nothing to install (the agent owns it, e.g. a blackhole for its block).
    Local,
    /// Learned over eBGP.
    Ebgp,
    /// Learned over iBGP.
    Ibgp,
}

/// One Loc-RIB entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BestRoute {
    /// The prefix.
    pub prefix: IpNet,
    /// Next hop to install (`None` for local routes).
    pub next_hop: Option<IpAddr>,
    /// How the route was learned.
    pub kind: RouteKind,
    /// Where it came from.
    pub source: RouteSource,
    /// Kept from a restarting peer (graceful restart) and not yet refreshed.
    pub stale: bool,
}

#[derive(Debug, Clone)]
struct Path {
    attrs: RouteAttrs,
    stale: bool,
    /// The import filter's verdict on this route, once asked: the filter runs once per route
    /// received (and once per route when the filter is replaced), not at every best-path pass
    /// over the whole RIB, so a peer holding many refused routes cannot make each small
    /// UPDATE or KEEPALIVE cost a pass of the filter over all of them.
    verdict: std::cell::Cell<Option<bool>>,
}

#[derive(Debug, Clone)]
struct Peer {
    config: PeerConfig,
    up: bool,
    router_id: Ipv4Addr,
    families: Vec<Family>,
    codec: CodecOptions,
    adj_in: BTreeMap<IpNet, Path>,
    adj_out: BTreeMap<IpNet, RouteAttrs>,
    pending_eor: Vec<Family>,
}

/// A candidate path during best-path selection.
struct Candidate<'a> {
    source: RouteSource,
    attrs: &'a RouteAttrs,
    stale: bool,
    ebgp: bool,
    router_id: Ipv4Addr,
}

/// The speaker's RIBs.
#[derive(Debug, Clone)]
pub struct Rib {
    config: RibConfig,
    peers: BTreeMap<IpAddr, Peer>,
    local: BTreeMap<IpNet, RouteAttrs>,
    import: Option<ImportFilter>,
}

impl Rib {
    /// An empty RIB.
    pub fn new(config: RibConfig) -> Rib {
        Rib {
            config,
            peers: BTreeMap::new(),
            local: BTreeMap::new(),
            import: None,
        }
    }

    /// Sets (or with `None` removes) the import filter. Takes effect at the next best-path
    /// selection, for routes already received too.
    /// Every held route is judged again by the new filter (lazily, once each).
    pub fn set_import_filter(&mut self, filter: Option<ImportFilter>) {
        self.import = filter;
        for peer in self.peers.values() {
            for path in peer.adj_in.values() {
                path.verdict.set(None);
            }
        }
    }

    /// Whether the import filter accepts the route `path` for `prefix` from `peer`: asked at
    /// most once per received route and filter (see [`Path::verdict`]).
    fn import_accepts(&self, peer: IpAddr, prefix: &IpNet, path: &Path) -> bool {
        let Some(f) = &self.import else {
            return true;
        };
        if let Some(v) = path.verdict.get() {
            return v;
        }
        let v = f.accepts_via(peer, prefix, path.attrs.next_hop);
        path.verdict.set(Some(v));
        v
    }

    /// The (peer, prefix) pairs held in Adj-RIBs-In that the import filter refuses.
    pub fn filtered(&self) -> Vec<(IpAddr, IpNet)> {
        if self.import.is_none() {
            return Vec::new();
        }
        self.peers
            .iter()
            .flat_map(|(a, p)| p.adj_in.iter().map(move |(n, path)| (*a, n, path)))
            .filter(|(a, n, path)| !self.import_accepts(*a, n, path))
            .map(|(a, n, _)| (a, *n))
            .collect()
    }

    /// Adds a peer (down until [`Rib::peer_up`]).
    pub fn add_peer(&mut self, config: PeerConfig) -> Result<(), RibError> {
        if self.peers.contains_key(&config.address) {
            return Err(RibError::PeerExists(config.address));
        }
        self.peers.insert(
            config.address,
            Peer {
                config,
                up: false,
                router_id: Ipv4Addr::UNSPECIFIED,
                families: Vec::new(),
                codec: CodecOptions::default(),
                adj_in: BTreeMap::new(),
                adj_out: BTreeMap::new(),
                pending_eor: Vec::new(),
            },
        );
        Ok(())
    }

    /// Removes a peer and all routes learned from it.
    pub fn remove_peer(&mut self, address: IpAddr) -> Result<(), RibError> {
        self.peers
            .remove(&address)
            .map(|_| ())
            .ok_or(RibError::UnknownPeer(address))
    }

    fn peer_mut(&mut self, address: IpAddr) -> Result<&mut Peer, RibError> {
        self.peers
            .get_mut(&address)
            .ok_or(RibError::UnknownPeer(address))
    }

    fn is_ebgp(&self, peer: &Peer) -> bool {
        peer.config.asn != self.config.local_as
    }

    /// The session with the peer reached Established: the full table is sent on the next
    /// [`Rib::take_updates`], followed by End-of-RIB per family.
    pub fn peer_up(&mut self, address: IpAddr, negotiated: &Negotiated) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        peer.up = true;
        peer.router_id = negotiated.peer_id;
        peer.families = negotiated.families.clone();
        peer.codec = negotiated.codec_options();
        peer.adj_out.clear();
        peer.pending_eor = negotiated.families.clone();
        Ok(())
    }

    /// The session went down. With `retain` (graceful restart) the peer's routes of those
    /// families stay, marked stale; all others are removed.
    pub fn peer_down(
        &mut self,
        address: IpAddr,
        retain: Option<&Retention>,
    ) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        peer.up = false;
        peer.adj_out.clear();
        peer.pending_eor.clear();
        let keep: &[Family] = retain.map(|r| r.families.as_slice()).unwrap_or(&[]);
        peer.adj_in.retain(|p, _| keep.contains(&Family::of(p)));
        for path in peer.adj_in.values_mut() {
            path.stale = true;
        }
        Ok(())
    }

    /// End-of-RIB from the peer: its remaining stale routes of the family are gone.
    pub fn end_of_rib(&mut self, address: IpAddr, family: Family) -> Result<(), RibError> {
        self.purge_stale(address, &[family])
    }

    /// Removes the peer's stale routes of the families.
    pub fn purge_stale(&mut self, address: IpAddr, families: &[Family]) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        peer.adj_in
            .retain(|p, path| !(path.stale && families.contains(&Family::of(p))));
        Ok(())
    }

    /// Withdraws prefixes learned from the peer (e.g. RFC 7606 treat-as-withdraw).
    pub fn withdraw(&mut self, address: IpAddr, prefixes: &[IpNet]) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        for p in prefixes {
            peer.adj_in.remove(p);
        }
        Ok(())
    }

    /// Applies an UPDATE from the peer to its Adj-RIB-In. Returns how many announced routes
    /// were accepted; the others failed an import check and act as withdrawals.
    pub fn apply_update(&mut self, address: IpAddr, update: &Update) -> Result<usize, RibError> {
        let local_as = self.config.local_as;
        let router_id = self.config.router_id;
        let cluster_id = self.config.cluster_id;
        let peer = self
            .peers
            .get(&address)
            .ok_or(RibError::UnknownPeer(address))?;
        let ebgp = self.is_ebgp(peer);
        let withdrawn = update.all_withdrawn();
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        for (prefix, nh) in update.all_announced() {
            let mut attrs = RouteAttrs::from_update(update, nh);
            let ok = if ebgp {
                // RFC 4271 §5.1.5: LOCAL_PREF from an external peer is ignored; RR attributes
                // are meaningless across AS borders.
                attrs.local_pref = None;
                attrs.originator_id = None;
                attrs.cluster_list.clear();
                !attrs.path_contains(local_as)
            } else {
                attrs.originator_id != Some(router_id)
                    && !cluster_id.is_some_and(|c| attrs.cluster_list.contains(&c))
            };
            if ok && nh.is_some() {
                accepted.push((prefix, attrs));
            } else {
                rejected.push(prefix);
            }
        }
        let peer = self.peer_mut(address)?;
        for p in withdrawn.iter().chain(&rejected) {
            peer.adj_in.remove(p);
        }
        let n = accepted.len();
        for (p, attrs) in accepted {
            peer.adj_in.insert(
                p,
                Path {
                    attrs,
                    stale: false,
                    verdict: std::cell::Cell::new(None),
                },
            );
        }
        Ok(n)
    }

    /// Originates a prefix (e.g. this node's pod address block).
    pub fn originate(&mut self, prefix: IpNet) {
        self.local.insert(prefix.trunc(), RouteAttrs::local());
    }

    /// Originates a prefix with an explicit next hop, advertised instead of the session's own
    /// address to iBGP peers (and to eBGP peers with `keep_original_next_hop`). A next hop of
    /// the other address family is ignored.
    pub fn originate_via(&mut self, prefix: IpNet, next_hop: Option<IpAddr>) {
        let next_hop = next_hop.filter(|nh| nh.is_ipv4() == prefix.addr().is_ipv4());
        self.local.insert(
            prefix.trunc(),
            RouteAttrs {
                next_hop,
                ..RouteAttrs::local()
            },
        );
    }

    /// Changes the next hops we advertise to the peer (e.g. once the session's local address
    /// is known). Takes effect on the next [`Rib::take_updates`].
    pub fn set_next_hops(
        &mut self,
        address: IpAddr,
        v4: Option<Ipv4Addr>,
        v6: Option<Ipv6Addr>,
    ) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        peer.config.next_hop_v4 = v4;
        peer.config.next_hop_v6 = v6;
        Ok(())
    }

    /// The peer's RIB settings.
    pub fn peer_config(&self, address: IpAddr) -> Option<&PeerConfig> {
        self.peers.get(&address).map(|p| &p.config)
    }

    /// Stops originating a prefix.
    pub fn withdraw_local(&mut self, prefix: IpNet) {
        self.local.remove(&prefix.trunc());
    }

    /// Forgets what was sent to the peer for the family so the next [`Rib::take_updates`]
    /// re-sends it (route refresh request).
    pub fn refresh(&mut self, address: IpAddr, family: Family) -> Result<(), RibError> {
        let peer = self.peer_mut(address)?;
        peer.adj_out.retain(|p, _| Family::of(p) != family);
        Ok(())
    }

    /// Routes learned from the peer (Adj-RIB-In): prefix → (attributes, stale).
    pub fn adj_rib_in(&self, address: IpAddr) -> Result<Vec<(IpNet, RouteAttrs, bool)>, RibError> {
        let peer = self
            .peers
            .get(&address)
            .ok_or(RibError::UnknownPeer(address))?;
        Ok(peer
            .adj_in
            .iter()
            .map(|(p, path)| (*p, path.attrs.clone(), path.stale))
            .collect())
    }

    /// How many routes the peer's Adj-RIB-In holds (filtered ones included).
    pub fn adj_rib_in_len(&self, address: IpAddr) -> usize {
        self.peers.get(&address).map_or(0, |p| p.adj_in.len())
    }

    fn candidates(&self, prefix: &IpNet) -> Vec<Candidate<'_>> {
        let mut out = Vec::new();
        if let Some(attrs) = self.local.get(prefix) {
            out.push(Candidate {
                source: RouteSource::Local,
                attrs,
                stale: false,
                ebgp: false,
                router_id: self.config.router_id,
            });
        }
        for (addr, peer) in &self.peers {
            if let Some(path) = peer.adj_in.get(prefix) {
                if !self.import_accepts(*addr, prefix, path) {
                    continue;
                }
                out.push(Candidate {
                    source: RouteSource::Peer(*addr),
                    attrs: &path.attrs,
                    stale: path.stale,
                    ebgp: self.is_ebgp(peer),
                    router_id: path.attrs.originator_id.unwrap_or(peer.router_id),
                });
            }
        }
        out
    }

    /// Best-path selection (RFC 4271 §9.1.2.2, RFC 4456 §9): local routes first, then highest
    /// LOCAL_PREF, shortest AS_PATH, lowest ORIGIN, lowest MED among routes from the same
    /// neighbour AS, eBGP over iBGP, lowest router ID (ORIGINATOR_ID for reflected routes),
    /// shortest CLUSTER_LIST, lowest peer address.
    fn select<'a>(&self, mut c: Vec<Candidate<'a>>) -> Option<Candidate<'a>> {
        if let Some(i) = c.iter().position(|x| x.source == RouteSource::Local) {
            return Some(c.swap_remove(i));
        }
        fn keep_min<T: Ord + Copy>(c: &mut Vec<Candidate<'_>>, key: impl Fn(&Candidate<'_>) -> T) {
            if let Some(m) = c.iter().map(&key).min() {
                c.retain(|x| key(x) == m);
            }
        }
        keep_min(&mut c, |x| {
            std::cmp::Reverse(x.attrs.local_pref.unwrap_or(DEFAULT_LOCAL_PREF))
        });
        keep_min(&mut c, |x| x.attrs.as_path_len());
        keep_min(&mut c, |x| x.attrs.origin);
        // MED is only comparable between routes from the same neighbouring AS.
        let meds: Vec<(Option<u32>, u32)> = c
            .iter()
            .map(|x| (x.attrs.neighbor_as(), x.attrs.med.unwrap_or(0)))
            .collect();
        let mut i = 0;
        c.retain(|_| {
            let (nas, med) = meds[i];
            i += 1;
            !meds.iter().any(|(o, m)| *o == nas && *m < med)
        });
        if c.iter().any(|x| x.ebgp) {
            c.retain(|x| x.ebgp);
        }
        keep_min(&mut c, |x| x.router_id);
        keep_min(&mut c, |x| x.attrs.cluster_list.len());
        keep_min(&mut c, |x| x.source);
        c.into_iter().next()
    }

    fn all_prefixes(&self) -> Vec<IpNet> {
        let mut v: Vec<IpNet> = self.local.keys().copied().collect();
        for peer in self.peers.values() {
            v.extend(peer.adj_in.keys().copied());
        }
        v.sort();
        v.dedup();
        v
    }

    /// The Loc-RIB: the best route per prefix. The agent installs the non-[`RouteKind::Local`]
    /// entries as kernel routes.
    pub fn best_routes(&self) -> Vec<BestRoute> {
        self.all_prefixes()
            .into_iter()
            .filter_map(|p| {
                let best = self.select(self.candidates(&p))?;
                Some(BestRoute {
                    prefix: p,
                    next_hop: best.attrs.next_hop,
                    kind: match best.source {
                        RouteSource::Local => RouteKind::Local,
                        _ if best.ebgp => RouteKind::Ebgp,
                        _ => RouteKind::Ibgp,
                    },
                    source: best.source,
                    stale: best.stale,
                })
            })
            .collect()
    }

    /// What `to` should hold for `prefix` given the best route, or `None` if not exported.
    fn export(&self, to: &Peer, best: &Candidate<'_>, prefix: &IpNet) -> Option<RouteAttrs> {
        let family = Family::of(prefix);
        if !to.families.contains(&family) {
            return None;
        }
        let self_nh = match prefix {
            IpNet::V4(_) => to.config.next_hop_v4.map(IpAddr::V4),
            IpNet::V6(_) => to.config.next_hop_v6.map(IpAddr::V6),
        };
        let from = match best.source {
            RouteSource::Local => None,
            RouteSource::Peer(a) if a == to.config.address => return None,
            RouteSource::Peer(a) => Some(self.peers.get(&a)?),
        };
        let mut attrs = best.attrs.clone();
        // RFC 4271 §5: unrecognised optional transitive attributes travel on with the Partial
        // bit; unrecognised non-transitive ones stop here.
        attrs.unknown.retain(|u| u.flags & FLAG_TRANSITIVE != 0);
        for u in &mut attrs.unknown {
            u.flags |= FLAG_PARTIAL;
        }
        if self.is_ebgp(to) {
            if attrs.path_contains(to.config.asn) {
                return None;
            }
            attrs.prepend(self.config.local_as);
            if !(to.config.keep_original_next_hop && attrs.next_hop.is_some()) {
                attrs.next_hop = Some(self_nh?);
            }
            attrs.local_pref = None;
            attrs.originator_id = None;
            attrs.cluster_list.clear();
            if from.is_some() {
                // MED is not propagated beyond the neighbouring AS (RFC 4271 §5.1.4).
                attrs.med = None;
            }
            return Some(attrs);
        }
        attrs.local_pref = Some(attrs.local_pref.unwrap_or(DEFAULT_LOCAL_PREF));
        match from {
            None => {
                // Our own route keeps an explicit next hop given at origination.
                if attrs.next_hop.is_none() {
                    attrs.next_hop = Some(self_nh?);
                }
            }
            Some(src) if self.is_ebgp(src) => {
                if to.config.next_hop_self {
                    attrs.next_hop = Some(self_nh?);
                }
            }
            Some(src) => {
                // iBGP-learned toward iBGP: only a route reflector passes it on (RFC 4456 §6).
                let cluster = self.config.cluster_id?;
                if !src.config.rr_client && !to.config.rr_client {
                    return None;
                }
                attrs.originator_id = Some(attrs.originator_id.unwrap_or(src.router_id));
                attrs.cluster_list.insert(0, cluster);
            }
        }
        Some(attrs)
    }

    /// Computes the UPDATEs that bring every Established peer's Adj-RIB-Out in line with the
    /// Loc-RIB, records them as sent, and returns them in order (withdrawals, announcements,
    /// then End-of-RIB after a session's first table).
    pub fn take_updates(&mut self) -> Vec<(IpAddr, Update)> {
        let prefixes = self.all_prefixes();
        let mut desired: BTreeMap<IpAddr, BTreeMap<IpNet, RouteAttrs>> = BTreeMap::new();
        for p in &prefixes {
            let Some(best) = self.select(self.candidates(p)) else {
                continue;
            };
            for (addr, peer) in &self.peers {
                if !peer.up {
                    continue;
                }
                if let Some(a) = self.export(peer, &best, p) {
                    desired.entry(*addr).or_default().insert(*p, a);
                }
            }
        }
        let mut out = Vec::new();
        for (addr, peer) in self.peers.iter_mut() {
            if !peer.up {
                continue;
            }
            let want = desired.remove(addr).unwrap_or_default();
            let withdrawn: Vec<IpNet> = peer
                .adj_out
                .keys()
                .filter(|p| !want.contains_key(p))
                .copied()
                .collect();
            let mut groups: Vec<(RouteAttrs, Vec<IpNet>)> = Vec::new();
            for (p, a) in &want {
                if peer.adj_out.get(p) == Some(a) {
                    continue;
                }
                match groups.iter_mut().find(|(g, _)| g == a) {
                    Some((_, v)) => v.push(*p),
                    None => groups.push((a.clone(), vec![*p])),
                }
            }
            for u in withdraw_updates(&withdrawn) {
                out.push((*addr, u));
            }
            for (attrs, prefixes) in &groups {
                for u in announce_updates(attrs, prefixes, peer.codec) {
                    out.push((*addr, u));
                }
            }
            for f in std::mem::take(&mut peer.pending_eor) {
                out.push((*addr, Update::end_of_rib(f)));
            }
            peer.adj_out = want;
        }
        out
    }
}

/// Room for NLRI in an UPDATE after the fixed fields and `attrs_len` octets of attributes.
fn nlri_room(attrs_len: usize) -> usize {
    MAX_MESSAGE_LEN.saturating_sub(HEADER_LEN + 4 + attrs_len)
}

/// Splits prefixes into runs whose encoded size stays within `room`.
fn chunk(prefixes: &[IpNet], room: usize) -> Vec<Vec<IpNet>> {
    let mut out: Vec<Vec<IpNet>> = Vec::new();
    let mut cur = Vec::new();
    let mut used = 0;
    for p in prefixes {
        let n = 1 + usize::from(p.prefix_len()).div_ceil(8);
        if used + n > room && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
            used = 0;
        }
        used += n;
        cur.push(*p);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn withdraw_updates(prefixes: &[IpNet]) -> Vec<Update> {
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = prefixes.iter().partition(|p| p.addr().is_ipv4());
    let mut out = Vec::new();
    for c in chunk(&v4, nlri_room(0)) {
        out.push(Update {
            withdrawn: c
                .into_iter()
                .filter_map(|p| match p {
                    IpNet::V4(p) => Some(p),
                    IpNet::V6(_) => None,
                })
                .collect(),
            ..Update::default()
        });
    }
    // MP_UNREACH header: flags, type, 2-octet length, AFI, SAFI.
    for c in chunk(&v6, nlri_room(7)) {
        out.push(Update {
            attributes: vec![PathAttribute::MpUnreach(MpUnreach {
                family: Family::IPV6_UNICAST,
                withdrawn: c,
            })],
            ..Update::default()
        });
    }
    out
}

fn announce_updates(attrs: &RouteAttrs, prefixes: &[IpNet], codec: CodecOptions) -> Vec<Update> {
    let Some(nh) = attrs.next_hop else {
        return Vec::new();
    };
    let base = attrs.to_attributes();
    let mut base_len = 0;
    let mut scratch = Vec::new();
    for a in &base {
        scratch.clear();
        crate::codec::encode_attribute_into(a, codec, &mut scratch);
        base_len += scratch.len();
    }
    let sorted = |mut v: Vec<PathAttribute>| {
        v.sort_by_key(PathAttribute::type_code);
        v
    };
    match nh {
        IpAddr::V4(nh4) => chunk(prefixes, nlri_room(base_len + 7))
            .into_iter()
            .map(|c| {
                let mut a = base.clone();
                a.push(PathAttribute::NextHop(nh4));
                Update {
                    withdrawn: Vec::new(),
                    attributes: sorted(a),
                    nlri: c
                        .into_iter()
                        .filter_map(|p| match p {
                            IpNet::V4(p) => Some(p),
                            IpNet::V6(_) => None,
                        })
                        .collect(),
                }
            })
            .collect(),
        // MP_REACH overhead: 4 header + 3 AFI/SAFI + 1 NH length + 16 NH + 1 reserved.
        IpAddr::V6(_) => chunk(prefixes, nlri_room(base_len + 25))
            .into_iter()
            .map(|c| {
                let mut a = base.clone();
                a.push(PathAttribute::MpReach(MpReach {
                    family: Family::IPV6_UNICAST,
                    next_hops: vec![nh],
                    nlri: c,
                }));
                Update {
                    withdrawn: Vec::new(),
                    attributes: sorted(a),
                    nlri: Vec::new(),
                }
            })
            .collect(),
    }
}
