//! A throw-away single-member etcd for tests and benchmarks (of this crate and the crates above
//! it): started on free loopback ports with its data in a temporary directory, killed by PID and
//! cleaned up on drop, also when a test panics.
//!
//! Behind the `test-support` feature: only tests, examples and benchmarks enable it, so the
//! production binaries carry none of it.

use std::fs;
use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{EtcdStore, Timeouts, TlsFiles};

/// The etcd binary: `$TERN_ETCD_BIN`, else `etcd` from `PATH`.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("TERN_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

/// True when the etcd binary can be run.
pub fn etcd_available() -> bool {
    Command::new(etcd_binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A fresh directory under the system temporary directory, removed by its owner's drop.
fn scratch_dir(what: &str) -> io::Result<PathBuf> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tern-{what}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Certificates made with `tern-pki` for a TLS etcd on 127.0.0.1.
#[derive(Debug)]
pub struct TestCerts {
    /// Directory holding every file (removed on drop).
    pub dir: PathBuf,
    /// The CA certificate that signed both others.
    pub ca: PathBuf,
    /// Server certificate for IP 127.0.0.1 / `localhost` (server and client use).
    pub server_cert: PathBuf,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// Client certificate (client use only).
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
}

impl TestCerts {
    /// Generates a CA, a server certificate for IP 127.0.0.1 and a client certificate
    /// (P-256 keys, valid two days) in a new directory.
    pub fn generate() -> io::Result<TestCerts> {
        use tern_pki::{Ca, CertSpec, San};
        let dir = scratch_dir("etcd-certs")?;
        let made = (|| {
            let ca = Ca::new("tern-test-ca", Duration::from_secs(2 * 24 * 3600))?;
            let ca_files = ca.write(&dir, "ca")?;
            // etcd's gateway dials its own gRPC port with the server certificate, so the
            // server certificate needs client use too.
            let localhost = [San::Ip([127, 0, 0, 1].into()), San::dns("localhost")];
            let server = CertSpec::server("tern-server", localhost).and_client();
            let server = ca.issue(&server)?.write(&dir, "server")?;
            let client = CertSpec::client("tern-client");
            let client = ca.issue(&client)?.write(&dir, "client")?;
            Ok::<_, tern_pki::PkiError>((ca_files, server, client))
        })();
        let (ca, server, client) = match made {
            Ok(made) => made,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(io::Error::other(e));
            }
        };
        Ok(TestCerts {
            ca: ca.cert,
            server_cert: server.cert,
            server_key: server.key,
            client_cert: client.cert,
            client_key: client.key,
            dir,
        })
    }

    /// The client side: CA plus client certificate and key.
    pub fn client_files(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca.clone(),
            cert: Some(self.client_cert.clone()),
            key: Some(self.client_key.clone()),
        }
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A running etcd child process.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `127.0.0.1:PORT` of the client listener.
    pub endpoint: String,
    tls: Option<TlsFiles>,
}

impl EtcdServer {
    /// Starts a plain-HTTP etcd and waits until it serves requests.
    pub fn start() -> io::Result<EtcdServer> {
        Self::start_with(None)
    }

    /// Starts an etcd serving HTTPS with `certs`, requiring client certificates.
    pub fn start_tls(certs: &TestCerts) -> io::Result<EtcdServer> {
        Self::start_with(Some(certs))
    }

    fn start_with(certs: Option<&TestCerts>) -> io::Result<EtcdServer> {
        // Another process may grab a probed port before etcd binds it: try a few times.
        let mut last = io::Error::other("etcd did not start");
        for _ in 0..3 {
            match Self::try_start(certs) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn try_start(certs: Option<&TestCerts>) -> io::Result<EtcdServer> {
        let dir = scratch_dir("etcd")?;
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let scheme = if certs.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let name = format!("t{}", std::process::id());
        let log = fs::File::create(dir.join("etcd.log"))?;
        let mut cmd = Command::new(etcd_binary());
        cmd.args(["--name", &name])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(c) = certs {
            cmd.arg("--cert-file")
                .arg(&c.server_cert)
                .arg("--key-file")
                .arg(&c.server_key)
                .arg("--trusted-ca-file")
                .arg(&c.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {}: {e}", etcd_binary().display()),
            )
        })?;
        let mut server = EtcdServer {
            child,
            dir,
            endpoint: format!("127.0.0.1:{client_port}"),
            tls: certs.map(TestCerts::client_files),
        };
        server.wait_ready(Duration::from_secs(20))?;
        Ok(server)
    }

    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        let quick = Timeouts {
            connect: Duration::from_millis(500),
            request: Duration::from_secs(2),
        };
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "etcd exited early ({status}): {}",
                    self.log_tail()
                )));
            }
            match EtcdStore::connect(&[&self.endpoint], self.tls.clone(), quick) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(io::Error::other(format!(
                        "etcd on {} not ready after {limit:?}: {e}; log: {}",
                        self.endpoint,
                        self.log_tail()
                    )));
                }
                Err(_) => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let start = log.len().saturating_sub(2000);
        log[log.ceil_char_boundary(start)..].to_string()
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint)
    }

    /// The client TLS files when the server runs TLS.
    pub fn tls(&self) -> Option<TlsFiles> {
        self.tls.clone()
    }

    /// A store connected to this server (with TLS when it runs TLS).
    pub fn store(&self) -> crate::Result<EtcdStore> {
        EtcdStore::connect(&[&self.endpoint], self.tls.clone(), Timeouts::default())
    }

    /// The process id, e.g. for tests that stop the server.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server now (the directory stays until drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The data directory's parent, holding `etcd.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One member of an [`EtcdCluster`].
pub struct Member {
    /// etcd's `--name`.
    pub name: String,
    /// `127.0.0.1:PORT` of the client listener.
    pub endpoint: String,
    peer_url: String,
    data: PathBuf,
    child: Option<Child>,
    starts: usize,
}

/// A throw-away etcd cluster of several members on loopback: unique ports and data
/// directories, every process killed by PID on drop (also when a test panics). With a
/// `launcher` prefix (e.g. `ip netns exec NAME`) the members run inside a network namespace
/// the caller created; `ready` then checks an endpoint from where it is reachable.
pub struct EtcdCluster {
    dir: PathBuf,
    launcher: Vec<String>,
    initial_cluster: String,
    token: String,
    /// The members, in the order of their endpoints.
    pub members: Vec<Member>,
}

impl EtcdCluster {
    /// Starts `n` members in this network namespace and waits until all serve requests.
    pub fn start(n: usize) -> io::Result<EtcdCluster> {
        let ready = |ep: &str| {
            let quick = Timeouts {
                connect: Duration::from_millis(300),
                request: Duration::from_secs(1),
            };
            EtcdStore::connect(&[ep], None, quick).is_ok()
        };
        Self::start_with(n, &[], &ready)
    }

    /// Starts `n` members on free ports through `launcher` (the program and arguments put
    /// before `etcd`) and waits up to 30 s until `ready` holds for every endpoint.
    pub fn start_with(
        n: usize,
        launcher: &[&str],
        ready: &dyn Fn(&str) -> bool,
    ) -> io::Result<EtcdCluster> {
        let ports = (0..n)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<io::Result<Vec<_>>>()?;
        Self::start_on(&ports, launcher, ready)
    }

    /// Like [`EtcdCluster::start_with`] with one member per `(client, peer)` port pair on
    /// 127.0.0.1: for members in a fresh network namespace, whose ports cannot collide and
    /// whose URL the caller must know before the cluster starts.
    pub fn start_on(
        ports: &[(u16, u16)],
        launcher: &[&str],
        ready: &dyn Fn(&str) -> bool,
    ) -> io::Result<EtcdCluster> {
        let n = ports.len();
        let dir = scratch_dir("etcd-cluster")?;
        let mut members = Vec::new();
        let mut initial = Vec::new();
        for (i, &(client_port, peer_port)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            initial.push(format!("{name}={peer_url}"));
            members.push(Member {
                data: dir.join(format!("{name}.data")),
                name,
                endpoint: format!("127.0.0.1:{client_port}"),
                peer_url,
                child: None,
                starts: 0,
            });
        }
        let mut cluster = EtcdCluster {
            token: dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir,
            launcher: launcher.iter().map(|s| s.to_string()).collect(),
            initial_cluster: initial.join(","),
            members,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_ready(ready, Duration::from_secs(30))?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> io::Result<()> {
        let m = &mut self.members[i];
        m.starts += 1;
        let log = fs::File::create(self.dir.join(format!("{}.{}.log", m.name, m.starts)))?;
        let client_url = format!("http://{}", m.endpoint);
        let mut cmd = match self.launcher.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(etcd_binary());
                c
            }
            None => Command::new(etcd_binary()),
        };
        cmd.args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &m.peer_url])
            .args(["--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {}: {e}", etcd_binary().display()),
            )
        })?;
        m.child = Some(child);
        Ok(())
    }

    fn wait_ready(&mut self, ready: &dyn Fn(&str) -> bool, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            loop {
                if let Some(c) = self.members[i].child.as_mut()
                    && let Some(status) = c.try_wait()?
                {
                    return Err(io::Error::other(format!(
                        "etcd member {i} exited early ({status}): {}",
                        self.log_tail()
                    )));
                }
                if ready(&self.members[i].endpoint) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(io::Error::other(format!(
                        "etcd member {i} on {} not ready after {limit:?}: {}",
                        self.members[i].endpoint,
                        self.log_tail()
                    )));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The end of every member's logs, for failure messages.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        for m in &self.members {
            for run in 1..=m.starts {
                let log = fs::read_to_string(self.dir.join(format!("{}.{run}.log", m.name)))
                    .unwrap_or_default();
                let start = log.len().saturating_sub(1500);
                s.push_str(&format!("--- {} run {run}\n", m.name));
                s.push_str(&log[log.ceil_char_boundary(start)..]);
            }
        }
        s
    }

    /// `host:port` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint.clone()).collect()
    }

    /// `etcd://` URL naming every member.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The PID of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// Kills member `i` with SIGKILL (a crash) by PID and reaps it; its data stays.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops member `i` gracefully (SIGTERM by PID: a leader hands over leadership first)
    /// and waits up to 10 s for it to exit, then kills it.
    pub fn stop(&mut self, i: usize) {
        let Some(mut c) = self.members[i].child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts a stopped member again on its data directory and ports, and waits until
    /// `ready` holds for it.
    pub fn restart(&mut self, i: usize, ready: &dyn Fn(&str) -> bool) -> io::Result<()> {
        if self.members[i].child.is_none() {
            self.spawn(i)?;
        }
        self.wait_ready(ready, Duration::from_secs(30))
    }

    /// Kills every member.
    pub fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// What `/v3/maintenance/status` of one member says: its own ID and its leader's (0 while
/// it knows none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
}

/// Asks the member at `endpoint` (`host:port`, plain HTTP) for its status, with a 1 s limit.
pub fn member_status(endpoint: &str) -> io::Result<MemberStatus> {
    use std::io::{Read, Write};
    let addr = endpoint
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("{endpoint} resolves to nothing")))?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.set_write_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(
        b"POST /v3/maintenance/status HTTP/1.1\r\nHost: etcd\r\nContent-Type: \
          application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    // The body may be chunked: the JSON object is the line that starts with '{'.
    let json = body
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| io::Error::other(format!("status of {endpoint}: {out:.300}")))?;
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| io::Error::other(format!("status of {endpoint}: {e}: {json:.300}")))?;
    let id = |x: Option<&serde_json::Value>| -> u64 {
        match x {
            Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
            Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0),
            _ => 0,
        }
    };
    Ok(MemberStatus {
        member_id: id(v.get("header").and_then(|h| h.get("member_id"))),
        leader: id(v.get("leader")),
    })
}

/// Asks the leader at `leader_endpoint` to hand leadership to the member `target_id`
/// (`/v3/maintenance/transfer-leadership`), waiting up to 5 s for the answer.
pub fn transfer_leadership(leader_endpoint: &str, target_id: u64) -> io::Result<()> {
    let store = EtcdStore::connect(
        &[leader_endpoint],
        None,
        Timeouts {
            connect: Duration::from_secs(1),
            request: Duration::from_secs(5),
        },
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    store
        .client
        .call(
            "/v3/maintenance/transfer-leadership",
            &serde_json::json!({"targetID": target_id.to_string()}),
            None,
            true,
        )
        .map(|_| ())
        .map_err(|e| io::Error::other(e.describe()))
}

/// The index in `endpoints` of the member that the reachable members agree is the leader.
pub fn leader_of(endpoints: &[String]) -> Option<usize> {
    let statuses: Vec<Option<MemberStatus>> =
        endpoints.iter().map(|e| member_status(e).ok()).collect();
    let leader = statuses
        .iter()
        .flatten()
        .map(|s| s.leader)
        .find(|l| *l != 0)?;
    statuses
        .iter()
        .position(|s| s.is_some_and(|s| s.member_id == leader))
}
