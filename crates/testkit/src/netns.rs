//! Network namespaces of a test, and the commands run in them.
//!
//! Every namespace is uniquely named ([`unique_name`]: the test process's PID and a counter) and
//! deleted by a drop guard ([`Netns`]), so tests run in parallel and leave nothing behind even
//! when an assertion panics. Nothing here touches the root network namespace: commands that
//! change the network run with `ip -n NS` / `ip netns exec NS`, and sockets are made on threads
//! that entered a test namespace ([`in_netns`], through `tern_linux::netns::NetNs::run`).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A name unique on this machine: `t<pid>-<tag><n>`. With a `tag` of up to 3 characters it is
/// short enough for an interface name too (15 bytes).
pub fn unique_name(tag: &str) -> String {
    format!(
        "t{}-{tag}{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `cmd` and returns its stdout; panics naming the command and its stderr when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip ARGS`, which must succeed; its stdout.
pub fn ip(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

/// Whether `ip ARGS` succeeds (for commands whose failure is a result).
pub fn ip_ok(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `f` on a fresh thread inside the network namespace at `ns_path` (sockets it creates
/// stay in that namespace; no thread of the test changes namespace).
pub fn in_netns<T: Send>(ns_path: &str, f: impl FnOnce() -> T + Send) -> T {
    tern_linux::netns::NetNs::open(Path::new(ns_path))
        .and_then(|ns| ns.run(f))
        .unwrap_or_else(|e| panic!("running in {ns_path}: {e}"))
}

/// Sends a datagram from a socket in the namespace at `from_ns` to a server bound on `to_ip` in
/// the one at `to_ns` (paths), which echoes it back: the source address the server saw. Tries 5
/// times (700 ms each) because the first packet may wait for neighbour resolution.
pub fn udp_echo(from_ns: &str, to_ns: &str, to_ip: IpAddr) -> Result<IpAddr, String> {
    let server = in_netns(to_ns, move || UdpSocket::bind(SocketAddr::new(to_ip, 0)))
        .map_err(|e| format!("binding {to_ip} in {to_ns}: {e}"))?;
    let client = in_netns(from_ns, || UdpSocket::bind("0.0.0.0:0"))
        .map_err(|e| format!("binding a client in {from_ns}: {e}"))?;
    let dst = server.local_addr().map_err(|e| e.to_string())?;
    let t = Some(Duration::from_millis(700));
    server.set_read_timeout(t).map_err(|e| e.to_string())?;
    client.set_read_timeout(t).map_err(|e| e.to_string())?;
    let mut last = String::new();
    for attempt in 0..5 {
        let msg = format!("tern-itest-{attempt}");
        if let Err(e) = client.send_to(msg.as_bytes(), dst) {
            last = format!("send to {dst}: {e}");
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        let mut buf = [0u8; 64];
        let (n, src) = match server.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) => {
                last = format!("server {dst} received nothing: {e}");
                continue;
            }
        };
        server
            .send_to(&buf[..n], src)
            .map_err(|e| format!("reply to {src}: {e}"))?;
        let mut back = [0u8; 64];
        match client.recv_from(&mut back) {
            Ok((m, from)) if &back[..m] == msg.as_bytes() && from == dst => return Ok(src.ip()),
            Ok((m, from)) => last = format!("unexpected reply {:?} from {from}", &back[..m]),
            Err(e) => last = format!("client got no reply from {dst}: {e}"),
        }
    }
    Err(last)
}

/// A uniquely named network namespace (`/run/netns/<name>`) with `lo` up, deleted on drop.
pub struct Netns {
    pub name: String,
    deleted: bool,
}

impl Netns {
    /// Creates the namespace `t<pid>-<tag><n>` and brings its loopback up.
    pub fn new(tag: &str) -> Netns {
        let name = unique_name(tag);
        ip(&["netns", "add", &name]);
        let ns = Netns {
            name,
            deleted: false,
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// A node namespace with an underlay address: `addr`/24 on `ul0`, a veth whose peer `ul1`
    /// stays in the namespace (up, so the address is usable and advertised).
    pub fn with_underlay(tag: &str, addr: &str) -> Netns {
        let ns = Netns::new(tag);
        ns.ip(&["link", "add", "ul0", "type", "veth", "peer", "name", "ul1"]);
        ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", "ul0"]);
        ns.ip(&["link", "set", "ul0", "up"]);
        ns.ip(&["link", "set", "ul1", "up"]);
        ns
    }

    /// The bind-mounted path runtimes pass as CNI_NETNS.
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `ip -n NS ARGS`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// `ARGS` run inside the namespace (`ip netns exec`), which must succeed.
    pub fn exec(&self, args: &[&str]) -> String {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args))
    }

    /// Runs `f` on a fresh thread inside this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.path(), f)
    }

    /// `ip -o link show` in the namespace.
    pub fn links(&self) -> String {
        self.ip(&["-o", "link", "show"])
    }

    /// The veths with tern's prefix (the pods' host ends), sorted.
    pub fn tern_veths(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .ip(&["-o", "link", "show", "type", "veth"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with("tern"))
            .collect();
        v.sort();
        v
    }

    /// Deletes the namespace now (as a runtime does when a pod sandbox goes away); it must
    /// succeed.
    pub fn delete(&mut self) {
        if !self.deleted {
            ip(&["netns", "del", &self.name]);
            self.deleted = true;
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The underlay of a multi-node test: a bridge `br0` in its own namespace, the nodes attached
/// to it with a veth each.
pub struct Underlay {
    pub ns: Netns,
}

impl Default for Underlay {
    fn default() -> Self {
        Underlay::new()
    }
}

impl Underlay {
    pub fn new() -> Underlay {
        let ns = Netns::new("u");
        ns.ip(&["link", "add", "br0", "type", "bridge"]);
        ns.ip(&["link", "set", "br0", "up"]);
        Underlay { ns }
    }

    /// Attaches the node namespace `node`: a veth whose end `eth0` in the node has `cidr`
    /// (address/prefix) and carries the default route via `gw`, its other end on the bridge.
    pub fn attach(&self, node: &Netns, cidr: &str, gw: &str) {
        let host_end = unique_name("u");
        self.ns.ip(&[
            "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &node.name,
        ]);
        self.ns
            .ip(&["link", "set", &host_end, "master", "br0", "up"]);
        node.ip(&["addr", "add", cidr, "dev", "eth0"]);
        node.ip(&["link", "set", "eth0", "up"]);
        node.ip(&["route", "add", "default", "via", gw]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_fit_an_interface() {
        let (a, b) = (unique_name("u"), unique_name("u"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("t{}-u", std::process::id())), "{a}");
        assert!(a.len() <= 15, "{a}");
    }

    #[test]
    fn a_namespace_is_entered_and_removed_on_drop() {
        crate::need_root();
        let ns = Netns::new("k");
        let path = ns.path();
        assert!(Path::new(&path).exists());
        let inside = ns.run(|| std::fs::read_link("/proc/thread-self/ns/net").unwrap());
        let home = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        assert_ne!(inside, home, "the closure ran in the test's namespace");
        assert!(ns.links().contains("lo: <LOOPBACK,UP"), "{}", ns.links());
        drop(ns);
        assert!(!Path::new(&path).exists(), "{path} outlived its guard");
    }
}
