//! A BIRD 2 router (Debian package `bird2`) on a lab's underlay, in a namespace of its own
//! (`tl-<lab>-bird-<tag>`): the top-of-rack route reflector or eBGP peer of the BGP proofs.
//! The namespace is recorded in the lab state, so `lab down` removes it; the BIRD process is
//! stopped by PID when the [`BirdPeer`] is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{self, ip_in, netns_add};
use crate::state::LabState;
use crate::{LabError, Result};

/// The BIRD daemon.
pub const BIRD_BIN: &str = "/usr/sbin/bird";
/// Its control client.
pub const BIRDC_BIN: &str = "/usr/sbin/birdc";

/// Whether BIRD 2 is installed.
pub fn available() -> bool {
    std::path::Path::new(BIRD_BIN).is_file() && std::path::Path::new(BIRDC_BIN).is_file()
}

/// A running BIRD on the lab underlay.
pub struct BirdPeer {
    /// Its namespace.
    pub netns: String,
    /// Its underlay address.
    pub address: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl BirdPeer {
    /// Creates the namespace, plugs it into the flat underlay (`br0`) with `address`/24 (an
    /// IPv6 `address`: /64, `nodad`) and starts BIRD with `config` (which should say
    /// `router id`).
    pub fn start(st: &mut LabState, tag: &str, address: &str, config: &str) -> Result<BirdPeer> {
        BirdPeer::start_with(st, tag, &[address], config)
    }

    /// As [`BirdPeer::start`], with several addresses on its `eth0` (a dual-stack peer: its
    /// IPv4 and IPv6 addresses, with the same last number as the v4 one by the lab's
    /// convention); [`BirdPeer::address`] is the first.
    pub fn start_with(
        st: &mut LabState,
        tag: &str,
        addresses: &[&str],
        config: &str,
    ) -> Result<BirdPeer> {
        let Some(address) = addresses.first().copied() else {
            return Err(LabError::Invalid(format!("BIRD peer {tag}: no address")));
        };
        if !available() {
            return Err(LabError::Invalid(format!(
                "{BIRD_BIN} not found (apt-get install bird2)"
            )));
        }
        let ns = format!("{}bird-{tag}", crate::state::ns_prefix(&st.name));
        netns_add(&ns)?;
        st.namespaces.push(ns.clone());
        st.save()?;
        let ul = crate::state::underlay_ns(&st.name);
        let ul_end = format!("b{tag}");
        ip_in(
            &ul,
            &[
                "link", "add", &ul_end, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        ip_in(&ul, &["link", "set", &ul_end, "master", "br0", "up"])?;
        ip_in(&ns, &["link", "set", "lo", "up"])?;
        for a in addresses {
            let prefix = if a.contains(':') {
                crate::topology::UNDERLAY_PREFIX6
            } else {
                crate::topology::UNDERLAY_PREFIX
            };
            crate::topology::add_address(&ns, &format!("{a}/{prefix}"), "eth0")?;
        }
        ip_in(&ns, &["link", "set", "eth0", "up"])?;
        let dir = st.dir().join(format!("bird-{tag}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LabError::io(format!("cannot create {}", dir.display()), e))?;
        let conf = dir.join("bird.conf");
        std::fs::write(&conf, config)
            .map_err(|e| LabError::io(format!("cannot write {}", conf.display()), e))?;
        let log = std::fs::File::create(dir.join("bird.log"))
            .map_err(|e| LabError::io("cannot create bird.log", e))?;
        let mut cmd = process::netns_exec(&ns, std::path::Path::new(BIRD_BIN));
        cmd.arg("-f")
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(dir.join("bird.ctl"))
            .arg("-P")
            .arg(dir.join("bird.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().map_err(|e| LabError::Spawn {
            command: process::describe(&cmd),
            source: e,
        })?;
        let bird = BirdPeer {
            netns: ns,
            address: address.to_string(),
            dir,
            child: Some(child),
        };
        // Wait for the control socket: BIRD then has parsed its configuration.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !bird.dir.join("bird.ctl").exists() {
            if Instant::now() > deadline {
                return Err(LabError::Timeout(format!(
                    "BIRD in {} did not start: {}",
                    bird.netns,
                    bird.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(bird)
    }

    /// Runs `birdc CMD` and returns its output.
    pub fn birdc(&self, cmd: &str) -> Result<String> {
        process::run(
            Command::new(BIRDC_BIN)
                .arg("-s")
                .arg(self.dir.join("bird.ctl"))
                .args(cmd.split_whitespace()),
        )
    }

    /// BIRD's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("bird.log")).unwrap_or_default()
    }
}

impl Drop for BirdPeer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // `ip netns exec` execs BIRD: this PID is BIRD's, and only it is killed.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Configuration of BIRD as an iBGP route reflector in `asn` for `clients`, mesh-less.
pub fn route_reflector_config(router_id: &str, asn: u32, clients: &[String]) -> String {
    let mut c = format!(
        "log stderr all;\nrouter id {router_id};\nprotocol device {{ scan time 1; }}\n\
         template bgp rrc {{\n  local {router_id} as {asn};\n  direct;\n  rr client;\n  \
         rr cluster id {router_id};\n  graceful restart;\n  connect retry time 1;\n  \
         ipv4 {{ import all; export where source = RTS_BGP; gateway direct; }};\n}}\n"
    );
    for (i, cl) in clients.iter().enumerate() {
        c.push_str(&format!(
            "protocol bgp c{i} from rrc {{ neighbor {cl} as {asn}; }}\n"
        ));
    }
    c
}

/// Configuration of BIRD as an eBGP peer in `asn` of `peers` (in `peer_asn`), originating
/// `static_routes` (blackholes).
pub fn ebgp_config(
    router_id: &str,
    asn: u32,
    peers: &[String],
    peer_asn: u32,
    static_routes: &[&str],
) -> String {
    let mut c = format!(
        "log stderr all;\nrouter id {router_id};\nprotocol device {{ scan time 1; }}\n\
         protocol static st {{ ipv4;\n"
    );
    for r in static_routes {
        c.push_str(&format!("  route {r} blackhole;\n"));
    }
    c.push_str("}\n");
    for (i, p) in peers.iter().enumerate() {
        c.push_str(&format!(
            "protocol bgp e{i} {{\n  local {router_id} as {asn};\n  neighbor {p} as {peer_asn};\n  \
             graceful restart;\n  connect retry time 1;\n  \
             ipv4 {{ import all; export all; }};\n}}\n"
        ));
    }
    c
}
