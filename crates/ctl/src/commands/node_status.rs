//! `ternctl node status`: the local agent's BGP sessions, in calicoctl's layout.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tern_api::{BgpStatusReply, Reply, Request};

use crate::table::{Align, BoxTable};

/// Asks the agent at `socket` for its BGP sessions and renders them. Errors name the socket.
pub fn fetch(socket: &Path) -> anyhow::Result<BgpStatusReply> {
    match tern_api::call(socket, &Request::BgpStatus, None, Duration::from_secs(10)) {
        Ok(Ok(Reply::BgpStatus(s))) => Ok(s),
        Ok(Ok(other)) => anyhow::bail!("unexpected reply from ternd: {other:?}"),
        Ok(Err(e)) => anyhow::bail!("ternd at {}: {}", socket.display(), e.msg),
        Err(e) => anyhow::bail!("tern agent is not running: {e}"),
    }
}

/// `HH:MM:SS` (UTC) for a session that changed state today, else the date, as BIRD shows it.
fn since(unix: u64, now: SystemTime) -> String {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if unix / 86_400 == now / 86_400 {
        let s = unix % 86_400;
        format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        // Days since the epoch to a civil date (Howard Hinnant's algorithm).
        let z = (unix / 86_400) as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!("{y:04}-{m:02}-{d:02}")
    }
}

/// What `ternctl node status` says of a node whose ternd runs without BGP, as calicoctl says
/// "None of the BGP backend processes (BIRD or GoBGP) are running.".
pub const NO_BGP: &str = "None of the BGP backend processes (tern's BGP speaker) are running.\n";

/// The report: `tern agent is running.`, then an `IPv4 BGP status` and an `IPv6 BGP status`
/// section, each a table `PEER ADDRESS | PEER TYPE | STATE | SINCE | INFO` or
/// `No IPvN peers found.`.
pub fn render(s: &BgpStatusReply, now: SystemTime) -> String {
    let mut out = String::from("tern agent is running.\n\n");
    if !s.enabled {
        // calicoctl's line for a node without BIRD/GoBGP (e.g. a VXLAN-only cluster), with
        // tern's one speaker named, and why it is not running.
        out.push_str(NO_BGP);
        out.push_str("ternd runs without --bgp: routes to other nodes come from the datastore.\n");
        return out;
    }
    for (fam, v4) in [("IPv4", true), ("IPv6", false)] {
        out.push_str(&format!("{fam} BGP status\n"));
        let mut peers: Vec<_> = s
            .peers
            .iter()
            .filter(|p| p.address.is_ipv4() == v4)
            .collect();
        if peers.is_empty() {
            out.push_str(&format!("No {fam} peers found.\n\n"));
            continue;
        }
        peers.sort_by_key(|p| p.address);
        let mut t = BoxTable::new(&[
            ("PEER ADDRESS", Align::Left),
            ("PEER TYPE", Align::Left),
            ("STATE", Align::Left),
            ("SINCE", Align::Left),
            ("INFO", Align::Left),
        ]);
        for p in peers {
            t.row(vec![
                p.address.to_string(),
                p.peer_type.clone(),
                p.state.to_string(),
                since(p.since_unix, now),
                p.info.clone(),
            ]);
        }
        out.push_str(&t.render());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_api::{BgpPeerStatus, PeerState};

    #[test]
    fn renders_like_calicoctl() {
        let now = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 7_230);
        let s = BgpStatusReply {
            enabled: true,
            asn: 64512,
            router_id: "198.18.0.11".into(),
            peers: vec![
                BgpPeerStatus {
                    address: "198.18.0.13".parse().unwrap(),
                    peer_type: "node-to-node mesh".into(),
                    state: PeerState::Start,
                    since_unix: 19_999 * 86_400,
                    info: "Active Connection refused".into(),
                },
                BgpPeerStatus {
                    address: "198.18.0.12".parse().unwrap(),
                    peer_type: "node-to-node mesh".into(),
                    state: PeerState::Up,
                    since_unix: 20_000 * 86_400 + 7_030,
                    info: "Established".into(),
                },
            ],
        };
        let out = render(&s, now);
        let want = "tern agent is running.

IPv4 BGP status
+--------------+-------------------+-------+------------+---------------------------+
| PEER ADDRESS |     PEER TYPE     | STATE |   SINCE    |           INFO            |
+--------------+-------------------+-------+------------+---------------------------+
| 198.18.0.12  | node-to-node mesh | up    | 01:57:10   | Established               |
| 198.18.0.13  | node-to-node mesh | start | 2024-10-03 | Active Connection refused |
+--------------+-------------------+-------+------------+---------------------------+

IPv6 BGP status
No IPv6 peers found.

";
        assert_eq!(out, want, "\n{out}");
        let off = render(&BgpStatusReply::default(), now);
        assert_eq!(
            off,
            "tern agent is running.\n\n\
             None of the BGP backend processes (tern's BGP speaker) are running.\n\
             ternd runs without --bgp: routes to other nodes come from the datastore.\n",
            "\n{off}"
        );
    }

    #[test]
    fn ipv6_sessions_fill_the_ipv6_table() {
        let now = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 7_230);
        let peer = |a: &str, t: &str| BgpPeerStatus {
            address: a.parse().unwrap(),
            peer_type: t.into(),
            state: PeerState::Up,
            since_unix: 20_000 * 86_400 + 7_030,
            info: "Established".into(),
        };
        let s = BgpStatusReply {
            enabled: true,
            asn: 64512,
            router_id: "202.18.243.27".into(),
            peers: vec![
                peer("2001:db8::250", "global"),
                peer("2001:db8::12", "node-to-node mesh"),
            ],
        };
        let out = render(&s, now);
        let want = "tern agent is running.

IPv4 BGP status
No IPv4 peers found.

IPv6 BGP status
+---------------+-------------------+-------+----------+-------------+
| PEER ADDRESS  |     PEER TYPE     | STATE |  SINCE   |    INFO     |
+---------------+-------------------+-------+----------+-------------+
| 2001:db8::12  | node-to-node mesh | up    | 01:57:10 | Established |
| 2001:db8::250 | global            | up    | 01:57:10 | Established |
+---------------+-------------------+-------+----------+-------------+

";
        assert_eq!(out, want, "\n{out}");
    }
}
