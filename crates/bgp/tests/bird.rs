//! Interop with BIRD 2 (`/usr/sbin/bird`). BIRD runs in its own named network namespace
//! (deleted on drop, even on panic) joined by a veth pair to the test's private namespace
//! where the tern speakers run. Underlay 198.18.0.0/24: BIRD .1, tern speakers .2 and .3;
//! the IPv6 tests add (or use only) 2001:db8::/64: BIRD ::1, tern ::2.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use ipnet::IpNet;
use tern_bgp::driver::*;
use tern_bgp::fsm::State;

const BIRD: &str = "/usr/sbin/bird";
const BIRDC: &str = "/usr/sbin/birdc";

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// BIRD's namespace and process; both go away on drop.
struct Bird {
    ns: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Bird {
    /// Creates the namespace, the veth pair from the calling thread's namespace (tern side
    /// `tv0` with .2 and .3) and starts BIRD with `config`.
    fn start(tag: &str, config: &str) -> Bird {
        Bird::start_with(
            tag,
            config,
            &["198.18.0.2/24", "198.18.0.3/24"],
            &["198.18.0.1/24"],
        )
    }

    /// [`Bird::start`] with the addresses of the tern side (`tv0`) and BIRD's (`tv1`); IPv6
    /// ones are added `nodad` (usable at once).
    fn start_with(tag: &str, config: &str, tern: &[&str], bird_addrs: &[&str]) -> Bird {
        static N: AtomicU32 = AtomicU32::new(0);
        let ns = format!(
            "tbgp-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        sh(&format!("ip netns add {ns}"));
        let mut bird = Bird {
            ns: ns.clone(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        sh(&format!(
            "ip link add tv0 type veth peer name tv1 netns {ns}"
        ));
        let nodad = |a: &str| if a.contains(':') { " nodad" } else { "" };
        for a in tern {
            sh(&format!("ip addr add {a} dev tv0{}", nodad(a)));
        }
        sh("ip link set tv0 up");
        sh(&format!("ip -n {ns} link set lo up"));
        for a in bird_addrs {
            sh(&format!("ip -n {ns} addr add {a} dev tv1{}", nodad(a)));
        }
        sh(&format!("ip -n {ns} link set tv1 up"));
        let conf = bird.dir.path().join("bird.conf");
        std::fs::write(&conf, config).unwrap();
        let log = std::fs::File::create(bird.dir.path().join("bird.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, BIRD, "-f", "-c"])
            .arg(&conf)
            .arg("-s")
            .arg(bird.sock())
            .arg("-P")
            .arg(bird.dir.path().join("bird.pid"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        bird.child = Some(child);
        bird
    }

    fn sock(&self) -> std::path::PathBuf {
        self.dir.path().join("bird.ctl")
    }

    fn birdc(&self, cmd: &str) -> String {
        let out = Command::new(BIRDC)
            .arg("-s")
            .arg(self.sock())
            .args(cmd.split_whitespace())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bird.log")).unwrap_or_default()
    }

    /// Polls `birdc show route all` until every needle appears.
    async fn wait_routes(&self, needles: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.birdc("show route all");
            if needles.iter().all(|n| out.contains(n)) {
                return out;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "BIRD never showed {needles:?}:\n{out}\n{}\nlog:\n{}",
                    self.birdc("show protocols all"),
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Bird {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Kill exactly the process we started (ip netns exec execs into bird: same PID).
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// BIRD and birdc, or the test fails (tern-testkit).
fn need_bird() {
    tern_testkit::need_binary(BIRD);
    tern_testkit::need_binary(BIRDC);
}

fn tern(n: u8, asn: u32) -> SpeakerConfig {
    let addr = Ipv4Addr::new(198, 18, 0, n);
    let mut c = SpeakerConfig::new(asn, addr);
    c.listen = Some(SocketAddr::new(IpAddr::V4(addr), 179));
    c.connect_retry = Duration::from_millis(500);
    c.connect_retry_max = Duration::from_secs(2);
    c
}

const BIRD_HEAD: &str = r#"
log stderr all;
router id 198.18.0.1;
protocol device { scan time 1; }
protocol direct { ipv4; interface "tv*"; }
"#;

async fn established(h: &SpeakerHandle) {
    wait_status(h, 20, "Established with BIRD", |st| {
        st.iter().all(|p| p.state == State::Established)
    })
    .await;
}

#[test]
fn bird_route_reflector_with_two_tern_clients() {
    need_bird();
    in_netns(|| async {
        let conf = format!(
            r#"{BIRD_HEAD}
template bgp rrc {{
  local 198.18.0.1 as 64512;
  direct;
  passive on;
  rr client;
  rr cluster id 198.18.0.1;
  graceful restart;
  ipv4 {{ import all; export where source = RTS_BGP; gateway direct; }};
}}
protocol bgp c2 from rrc {{ neighbor 198.18.0.2 as 64512; }}
protocol bgp c3 from rrc {{ neighbor 198.18.0.3 as 64512; }}
"#
        );
        let bird = Bird::start("rr", &conf);
        let mut a = Speaker::start(tern(2, 64512)).await.unwrap();
        let mut b = Speaker::start(tern(3, 64512)).await.unwrap();
        let mut ev_a = a.take_events().unwrap();
        let mut ev_b = b.take_events().unwrap();
        a.originate(net("10.244.2.0/26"), None).await.unwrap();
        b.originate(net("10.244.3.0/26"), None).await.unwrap();
        a.add_peer(PeerConfig::new(ip("198.18.0.1"), 64512))
            .await
            .unwrap();
        b.add_peer(PeerConfig::new(ip("198.18.0.1"), 64512))
            .await
            .unwrap();
        established(&a).await;
        established(&b).await;
        wait_event(
            &mut ev_a,
            &RouteEvent::Install {
                prefix: net("10.244.3.0/26"),
                next_hop: ip("198.18.0.3"),
            },
            20,
        )
        .await;
        wait_event(
            &mut ev_b,
            &RouteEvent::Install {
                prefix: net("10.244.2.0/26"),
                next_hop: ip("198.18.0.2"),
            },
            20,
        )
        .await;
        bird.wait_routes(&[
            "10.244.2.0/26",
            "10.244.3.0/26",
            "via 198.18.0.2",
            "via 198.18.0.3",
        ])
        .await;

        // A withdrawal travels through the reflector.
        a.withdraw(net("10.244.2.0/26")).await.unwrap();
        wait_event(
            &mut ev_b,
            &RouteEvent::Remove {
                prefix: net("10.244.2.0/26"),
            },
            20,
        )
        .await;
        a.shutdown().await;
        b.shutdown().await;
        drop(bird);
    });
}

#[test]
fn bird_as_ebgp_peer() {
    need_bird();
    in_netns(|| async {
        let conf = format!(
            r#"{BIRD_HEAD}
protocol static pod_blocks {{ ipv4; route 10.99.0.0/24 blackhole; }}
protocol bgp tor {{
  local 198.18.0.1 as 65001;
  neighbor 198.18.0.2 as 64512;
  graceful restart;
  connect delay time 1;
  connect retry time 1;
  ipv4 {{ import all; export where source = RTS_STATIC; }};
}}
"#
        );
        let bird = Bird::start("ebgp", &conf);
        let mut a = Speaker::start(tern(2, 64512)).await.unwrap();
        let mut ev = a.take_events().unwrap();
        a.originate(net("10.244.2.0/26"), None).await.unwrap();
        // Passive: BIRD connects to us.
        a.add_peer(PeerConfig {
            passive: true,
            ..PeerConfig::new(ip("198.18.0.1"), 65001)
        })
        .await
        .unwrap();
        established(&a).await;
        let st = a.status().await.unwrap();
        assert_eq!(st[0].peer_type, PeerType::External);
        wait_event(
            &mut ev,
            &RouteEvent::Install {
                prefix: net("10.99.0.0/24"),
                next_hop: ip("198.18.0.1"),
            },
            20,
        )
        .await;
        let out = bird
            .wait_routes(&["10.244.2.0/26", "via 198.18.0.2", "BGP.as_path: 64512"])
            .await;
        assert!(
            !out.contains("BGP.local_pref: 100\n\tBGP.as_path: 64512"),
            "{out}"
        );
        a.shutdown().await;
        drop(bird);
    });
}

/// A tern speaker (router ID 198.18.0.2) listening on `listen`, with the IPv6 next hop
/// 2001:db8::2 for its IPv6 routes.
fn tern6(listen: IpAddr) -> SpeakerConfig {
    let mut c = SpeakerConfig::new(64512, Ipv4Addr::new(198, 18, 0, 2));
    c.listen = Some(SocketAddr::new(listen, 179));
    c.next_hop_v6 = Some("2001:db8::2".parse().unwrap());
    c.connect_retry = Duration::from_millis(500);
    c.connect_retry_max = Duration::from_secs(2);
    c
}

/// Waits until the speaker's RIB has `prefix` via `next_hop` as a best route.
async fn wait_rib(h: &SpeakerHandle, prefix: IpNet, next_hop: IpAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let routes = h.routes().await.unwrap();
        if routes
            .iter()
            .any(|r| r.prefix == prefix && r.next_hop == Some(next_hop))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{prefix} via {next_hop} never in the RIB: {routes:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// BIRD's head for the IPv6 tests: its static IPv6 route `fd00:10:244:99::/122`.
const BIRD6_HEAD: &str = r#"
log stderr all;
router id 198.18.0.1;
protocol device { scan time 1; }
protocol static pods6 { ipv6; route fd00:10:244:99::/122 blackhole; }
"#;

/// Starts speaker `c`, originates `prefixes`, peers with BIRD at `bird` and waits for the
/// session; then waits until BIRD's static IPv6 route (`fd00:10:244:99::/122`) is learned via
/// BIRD's global IPv6 address.
async fn with_bird6(
    c: SpeakerConfig,
    prefixes: &[&str],
    bird: &str,
) -> (
    SpeakerHandle,
    tokio::sync::mpsc::UnboundedReceiver<RouteEvent>,
) {
    let mut a = Speaker::start(c).await.unwrap();
    let mut ev = a.take_events().unwrap();
    for p in prefixes {
        a.originate(net(p), None).await.unwrap();
    }
    a.add_peer(PeerConfig::new(ip(bird), 64512)).await.unwrap();
    established(&a).await;
    wait_event(
        &mut ev,
        &RouteEvent::Install {
            prefix: net("fd00:10:244:99::/122"),
            next_hop: ip("2001:db8::1"),
        },
        20,
    )
    .await;
    (a, ev)
}

/// MP-BGP IPv6 unicast over an IPv6 session (a v6-only node): tern's block reaches BIRD's
/// table with tern's address as next hop, BIRD's static route reaches tern's RIB; a withdrawal
/// travels too.
#[test]
fn bird_ipv6_unicast_over_an_ipv6_session() {
    need_bird();
    in_netns(|| async {
        let conf = format!(
            r#"{BIRD6_HEAD}
protocol bgp t2 {{
  local 2001:db8::1 as 64512;
  neighbor 2001:db8::2 as 64512;
  direct;
  graceful restart;
  connect delay time 1;
  connect retry time 1;
  ipv6 {{ import all; export where source = RTS_STATIC; gateway direct; }};
}}
"#
        );
        let bird = Bird::start_with("v6", &conf, &["2001:db8::2/64"], &["2001:db8::1/64"]);
        // BIRD -> tern: the static route, next hop BIRD's global address.
        let (a, _ev) = with_bird6(
            tern6(ip("2001:db8::2")),
            &["fd00:10:244::40/122"],
            "2001:db8::1",
        )
        .await;
        wait_rib(&a, net("fd00:10:244:99::/122"), ip("2001:db8::1")).await;
        // tern -> BIRD: the block in BIRD's table, via tern's address, as an IPv6 BGP route.
        let out = bird
            .wait_routes(&["fd00:10:244::40/122", "via 2001:db8::2"])
            .await;
        assert!(out.contains("BGP.next_hop: 2001:db8::2"), "{out}");
        a.withdraw(net("fd00:10:244::40/122")).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while bird.birdc("show route").contains("fd00:10:244::40/122") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the withdrawal never reached BIRD"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        a.shutdown().await;
        drop(bird);
    });
}

/// A dual-stack node's IPv4 session carries its IPv6 blocks too (MP-BGP), with its IPv6
/// address as next hop, as Calico's BIRD; and BIRD's IPv6 routes come back over it.
#[test]
fn bird_ipv6_unicast_over_an_ipv4_session_with_ipv6_next_hops() {
    need_bird();
    in_netns(|| async {
        let conf = format!(
            r#"{BIRD6_HEAD}
protocol bgp t2 {{
  local 198.18.0.1 as 64512;
  neighbor 198.18.0.2 as 64512;
  direct;
  graceful restart;
  connect delay time 1;
  connect retry time 1;
  ipv4 {{ import all; export none; }};
  ipv6 {{
    import all;
    export where source = RTS_STATIC;
    next hop address 2001:db8::1;
    gateway direct;
  }};
}}
"#
        );
        let bird = Bird::start_with(
            "v6over4",
            &conf,
            &["198.18.0.2/24", "2001:db8::2/64"],
            &["198.18.0.1/24", "2001:db8::1/64"],
        );
        let mut c = tern6(ip("198.18.0.2"));
        c.listen_also = Some(SocketAddr::new(ip("2001:db8::2"), 179));
        let (a, _ev) = with_bird6(c, &["10.244.2.0/26", "fd00:10:244::40/122"], "198.18.0.1").await;
        let out = bird
            .wait_routes(&[
                "10.244.2.0/26",
                "via 198.18.0.2",
                "fd00:10:244::40/122",
                "via 2001:db8::2",
            ])
            .await;
        assert!(out.contains("BGP.next_hop: 2001:db8::2"), "{out}");
        a.shutdown().await;
        drop(bird);
    });
}
