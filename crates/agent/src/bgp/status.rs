//! The per-session figures the BGP thread shares with the status request and `/metrics`
//! ([`Shared`]), and their metrics lines.

use std::collections::BTreeMap;
use std::net::IpAddr;

use tern_api::{BgpStatusReply, PeerState};

use crate::metrics::exposition::Page;

/// Per-session figures shared with the status request and `/metrics`.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) status: BgpStatusReply,
    pub(super) routes_installed: usize,
    /// Routes the import policy refused, per peer, since start.
    pub(super) routes_rejected: BTreeMap<IpAddr, u64>,
    /// Learned routes not installed because the kernel has a route tern does not own.
    pub(super) routes_conflicting: usize,
    pub(super) established_transitions: BTreeMap<IpAddr, u64>,
    pub(super) last_error: Option<String>,
}

impl Shared {
    /// Writes the per-session metrics to a `/metrics` page.
    pub(super) fn render_metrics(&self, page: &mut Page) {
        let mut f = page.gauge(
            "tern_bgp_session_up",
            "Whether the BGP session with the peer is Established.",
        );
        for p in &self.status.peers {
            let peer = p.address.to_string();
            f.sample(
                &[("peer", &peer), ("type", &p.peer_type)],
                p.state == PeerState::Up,
            );
        }
        let mut f = page.counter(
            "tern_bgp_session_established_total",
            "Times the session with the peer reached Established.",
        );
        for p in &self.status.peers {
            let n = self
                .established_transitions
                .get(&p.address)
                .copied()
                .unwrap_or(0);
            f.sample(&[("peer", &p.address.to_string())], n);
        }
        page.gauge(
            "tern_bgp_routes_installed",
            "Routes learned over BGP installed in the kernel.",
        )
        .sample(&[], self.routes_installed);
        let mut f = page.counter(
            "tern_bgp_routes_rejected_total",
            "Routes from the peer refused by the import policy.",
        );
        for (peer, n) in &self.routes_rejected {
            f.sample(&[("peer", &peer.to_string())], *n);
        }
        page.gauge(
            "tern_bgp_routes_conflicting",
            "Accepted routes not installed: the kernel has a route for the prefix that tern did \
             not install.",
        )
        .sample(&[], self.routes_conflicting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition;

    #[test]
    fn metrics_keep_their_names_and_labels() {
        let peer: IpAddr = "198.18.0.2".parse().unwrap();
        let mut s = Shared::default();
        s.status.peers.push(tern_api::BgpPeerStatus {
            address: peer,
            peer_type: "node-to-node mesh".into(),
            state: PeerState::Up,
            since_unix: 0,
            info: String::new(),
        });
        s.established_transitions.insert(peer, 2);
        s.routes_rejected.insert(peer, 3);
        s.routes_installed = 4;
        s.routes_conflicting = 1;
        let mut page = Page::new();
        s.render_metrics(&mut page);
        let out = page.into_string();
        assert_eq!(
            exposition::check(&out).unwrap(),
            [
                "tern_bgp_session_up",
                "tern_bgp_session_established_total",
                "tern_bgp_routes_installed",
                "tern_bgp_routes_rejected_total",
                "tern_bgp_routes_conflicting",
            ]
        );
        for line in [
            "tern_bgp_session_up{peer=\"198.18.0.2\",type=\"node-to-node mesh\"} 1\n",
            "tern_bgp_session_established_total{peer=\"198.18.0.2\"} 2\n",
            "\ntern_bgp_routes_installed 4\n",
            "tern_bgp_routes_rejected_total{peer=\"198.18.0.2\"} 3\n",
            "\ntern_bgp_routes_conflicting 1\n",
        ] {
            assert!(out.contains(line), "{line:?} not in\n{out}");
        }
    }
}
