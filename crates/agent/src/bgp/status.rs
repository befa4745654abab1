//! The per-session figures the BGP thread shares with the status request and `/metrics`
//! ([`Shared`]), and their metrics lines.

use std::collections::BTreeMap;
use std::net::IpAddr;

use tern_api::{BgpStatusReply, PeerState};

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
    /// Appends the per-session metrics to a `/metrics` page.
    pub(super) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let s = self;
        out.push_str("# HELP tern_bgp_session_up Whether the BGP session with the peer is Established.\n# TYPE tern_bgp_session_up gauge\n");
        for p in &s.status.peers {
            let _ = writeln!(
                out,
                "tern_bgp_session_up{{peer=\"{}\",type=\"{}\"}} {}",
                p.address,
                p.peer_type,
                u8::from(p.state == PeerState::Up)
            );
        }
        out.push_str("# HELP tern_bgp_session_established_total Times the session with the peer reached Established.\n# TYPE tern_bgp_session_established_total counter\n");
        for p in &s.status.peers {
            let n = s
                .established_transitions
                .get(&p.address)
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "tern_bgp_session_established_total{{peer=\"{}\"}} {n}",
                p.address
            );
        }
        out.push_str("# HELP tern_bgp_routes_installed Routes learned over BGP installed in the kernel.\n# TYPE tern_bgp_routes_installed gauge\n");
        let _ = writeln!(out, "tern_bgp_routes_installed {}", s.routes_installed);
        out.push_str("# HELP tern_bgp_routes_rejected_total Routes from the peer refused by the import policy.\n# TYPE tern_bgp_routes_rejected_total counter\n");
        for (peer, n) in &s.routes_rejected {
            let _ = writeln!(out, "tern_bgp_routes_rejected_total{{peer=\"{peer}\"}} {n}");
        }
        out.push_str("# HELP tern_bgp_routes_conflicting Accepted routes not installed: the kernel has a route for the prefix that tern did not install.\n# TYPE tern_bgp_routes_conflicting gauge\n");
        let _ = writeln!(out, "tern_bgp_routes_conflicting {}", s.routes_conflicting);
    }
}
