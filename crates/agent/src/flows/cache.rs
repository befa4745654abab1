//! The resolution cache of the flow service: what the policy model said of an event
//! ([`resolve_cause`](super::resolve::resolve_cause)), by everything that cause depends on,
//! for one model generation.
//!
//! Key: the flow tag (direction and deciding rule as the kernel logged them), both addresses,
//! the protocol and the destination port. Not the source port: no rule matches one (the
//! model's [`tern_policy::Flow`] has none), and the record's ports are filled in per event
//! ([`complete`](super::resolve::complete)), as are its time and its host ends. So a
//! client's new connections to one service, which differ by source port only, resolve once
//! per generation.
//!
//! Validity: the entries hold for one model generation ([`super::FlowModel::generation`], the
//! policy set's [`tern_policy::PolicySet::revision`]), and are all dropped when it moves. At
//! most [`CACHE_ENTRIES`] entries: a full cache is emptied before the next insert (a flood of
//! distinct flows resolves as without a cache; the service's rate budget bounds it anyway).

use std::collections::HashMap;
use std::net::IpAddr;

use tern_linux::nflog::PacketHeaders;
use tern_policy::flowtag::FlowTag;

use super::resolve::Resolved;

/// Bound of the cache, in entries. Each is a record without time and ports: 1 to 2 KiB
/// with both ends' labels and the policies, so some 8 MiB at most (an agent's whole heap is
/// a few tens of MiB). A node's repeated connections between two model changes are far
/// fewer.
pub const CACHE_ENTRIES: usize = 4_096;

/// What a cause depends on, besides the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub tag: FlowTag,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub dst_port: Option<u16>,
}

impl Key {
    /// The key of an event: its tag and headers.
    pub fn of(tag: FlowTag, pkt: &PacketHeaders) -> Key {
        Key {
            tag,
            src: pkt.src,
            dst: pkt.dst,
            proto: pkt.proto,
            dst_port: pkt.dst_port,
        }
    }
}

/// Causes by [`Key`], for one generation.
#[derive(Debug)]
pub struct Cache {
    generation: Option<u64>,
    entries: HashMap<Key, Resolved>,
    cap: usize,
}

impl Cache {
    /// An empty cache of at most `cap` entries.
    pub fn new(cap: usize) -> Cache {
        Cache {
            generation: None,
            entries: HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// Makes the cache hold for `generation`: emptied when it held for another.
    pub fn at(&mut self, generation: u64) {
        if self.generation != Some(generation) {
            self.entries.clear();
            self.generation = Some(generation);
        }
    }

    /// The cause kept for `k` (at the generation of the last [`Cache::at`]).
    pub fn get(&self, k: &Key) -> Option<&Resolved> {
        self.entries.get(k)
    }

    /// Keeps a cause; a full cache is emptied first.
    pub fn insert(&mut self, k: Key, v: Resolved) {
        if self.entries.len() >= self.cap && !self.entries.contains_key(&k) {
            self.entries.clear();
        }
        self.entries.insert(k, v);
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use tern_api::flow::{EndKind, FlowDirection, FlowEnd, FlowReason, FlowRecord, FlowVerdict};
    use tern_policy::Direction;

    use super::*;

    fn key(port: u16) -> Key {
        Key {
            tag: FlowTag::NoPolicy(Direction::Ingress),
            src: "192.0.2.1".parse().unwrap(),
            dst: "10.0.0.1".parse().unwrap(),
            proto: 6,
            dst_port: Some(port),
        }
    }

    fn cause(port: u16) -> Resolved {
        let end = |ip: &str| FlowEnd {
            ip: ip.into(),
            port: None,
            kind: EndKind::Outside,
            namespace: None,
            pod: None,
            labels: Default::default(),
            node: None,
        };
        Resolved {
            record: FlowRecord {
                seq: 0,
                time: 0,
                node: "n1".into(),
                direction: FlowDirection::Ingress,
                proto: port.to_string(),
                src: end("192.0.2.1"),
                dst: end("10.0.0.1"),
                verdict: FlowVerdict::Allowed,
                reason: FlowReason::NoPolicy,
                policies: Vec::new(),
                pending: None,
            },
            disagrees: false,
        }
    }

    /// Entries hold for one generation; the bound holds whatever is inserted.
    #[test]
    fn entries_hold_for_one_generation_and_the_bound_holds() {
        let mut c = Cache::new(10);
        c.at(7);
        c.insert(key(1), cause(1));
        assert_eq!(c.get(&key(1)), Some(&cause(1)));
        assert_eq!(c.get(&key(2)), None);
        c.at(7);
        assert_eq!(c.len(), 1, "the same generation keeps them");
        c.at(8);
        assert!(c.is_empty(), "another generation drops them");
        assert_eq!(c.get(&key(1)), None);
        for p in 0..25u16 {
            c.insert(key(p), cause(p));
            assert!(c.len() <= 10);
            assert_eq!(c.get(&key(p)), Some(&cause(p)), "the last insert is kept");
        }
        // Replacing a kept key in a full cache keeps the others.
        for p in 25..30u16 {
            c.insert(key(p), cause(p));
        }
        assert_eq!(c.len(), 10);
        c.insert(key(20), cause(21));
        assert_eq!(c.len(), 10);
        assert_eq!(c.get(&key(20)), Some(&cause(21)));
    }
}
