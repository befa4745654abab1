//! The tokio driver: one task owns the [`Rib`] and every peer's [`Session`], executes the
//! sessions' actions on real sockets and timers, and reports best-route changes.
//!
//! Task layout: the speaker task is the only owner of protocol state. Socket I/O lives in small
//! helper tasks (listener, one outbound connect attempt, one reader and one writer per
//! connection) that talk to the speaker task through a channel, tagged with a connection id so
//! events from a connection that was already dropped are recognised and ignored.
//!
//! Connection collisions (RFC 4271 §6.8), which the sans-IO FSM leaves to the driver: an inbound
//! connection arriving while the session is in OpenSent/OpenConfirm is held as a candidate until
//! its OPEN arrives; then the connection initiated by the speaker with the higher BGP identifier
//! survives and the other is closed with Cease / Connection Collision Resolution. An inbound
//! connection while Established is refused the same way.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::codec::{
    self, CeaseSubcode, DecodeError, ErrorCode, Family, Framer, Message, Notification, Open,
};
use crate::fsm::{
    Action, DownReason, Event, GracefulRestartConfig, Session, SessionConfig, State, TimerKind,
};
use crate::md5::{self, Md5Error};
use crate::rib::{self, BestRoute, ImportFilter, Rib, RibConfig, RibError, RouteKind};

/// The standard BGP port.
pub const BGP_PORT: u16 = 179;

/// Speaker-wide settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpeakerConfig {
    /// Our AS.
    pub asn: u32,
    /// Our BGP identifier.
    pub router_id: Ipv4Addr,
    /// Where to accept connections; `None` accepts none (every peer must be active). A
    /// specific address is also the source address of outbound connections.
    pub listen: Option<SocketAddr>,
    /// A second address to accept connections on, of the other family (a dual-stack node
    /// listens on its IPv4 and its IPv6 address); also the source address of outbound
    /// connections of its family.
    #[serde(default)]
    pub listen_also: Option<SocketAddr>,
    /// With a cluster ID this speaker is a route reflector for its `rr_client` peers.
    pub cluster_id: Option<Ipv4Addr>,
    /// Graceful-restart Restart Time to advertise (seconds); `None` disables graceful restart.
    pub graceful_restart_time: Option<u16>,
    /// We are coming back from a graceful restart: set the Restart State bit.
    pub restarting: bool,
    /// Hold time to propose (seconds).
    pub hold_time: u16,
    /// First connect-retry interval; it backs off to `connect_retry_max`.
    pub connect_retry: Duration,
    /// Longest connect-retry interval.
    pub connect_retry_max: Duration,
    /// IPv4 next hop to advertise; default: the session's local address when it is IPv4.
    pub next_hop_v4: Option<Ipv4Addr>,
    /// IPv6 next hop to advertise; default: the session's local address when it is IPv6.
    pub next_hop_v6: Option<Ipv6Addr>,
    /// Most routes kept from one peer (refused ones included): beyond, the session ends with
    /// Cease / Maximum Number of Prefixes Reached, so a peer cannot grow the speaker's memory
    /// without bound. Default [`DEFAULT_MAX_PREFIXES_PER_PEER`].
    #[serde(default = "default_max_prefixes")]
    pub max_prefixes_per_peer: u32,
}

/// Default of [`SpeakerConfig::max_prefixes_per_peer`]: far above a cluster's blocks and
/// borrowed addresses (a /16 pool in /26 blocks is 1,024 routes), far below what hurts.
pub const DEFAULT_MAX_PREFIXES_PER_PEER: u32 = 100_000;

fn default_max_prefixes() -> u32 {
    DEFAULT_MAX_PREFIXES_PER_PEER
}

impl SpeakerConfig {
    /// Defaults: listen on port 179 of all addresses, no route reflection, graceful restart
    /// with 120 s, hold time 90 s, connect retry 5 s backing off to 120 s.
    pub fn new(asn: u32, router_id: Ipv4Addr) -> SpeakerConfig {
        SpeakerConfig {
            asn,
            router_id,
            listen: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), BGP_PORT)),
            listen_also: None,
            cluster_id: None,
            graceful_restart_time: Some(120),
            restarting: false,
            hold_time: 90,
            connect_retry: Duration::from_secs(5),
            connect_retry_max: Duration::from_secs(120),
            next_hop_v4: None,
            next_hop_v6: None,
            max_prefixes_per_peer: DEFAULT_MAX_PREFIXES_PER_PEER,
        }
    }
}

/// One configured neighbour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerConfig {
    /// The peer's address (also how inbound connections are matched to it).
    pub address: IpAddr,
    /// The peer's TCP port for outbound connections.
    pub port: u16,
    /// The peer's AS (iBGP when equal to ours).
    pub asn: u32,
    /// TCP MD5 (RFC 2385) password.
    pub password: Option<String>,
    /// The peer is a route-reflector client (needs [`SpeakerConfig::cluster_id`]).
    pub rr_client: bool,
    /// Toward an eBGP peer: keep the routes' next hops instead of rewriting them to us.
    pub keep_original_next_hop: bool,
    /// Never connect; wait for the peer.
    pub passive: bool,
}

impl PeerConfig {
    /// An active, unauthenticated peer on port 179.
    pub fn new(address: IpAddr, asn: u32) -> PeerConfig {
        PeerConfig {
            address,
            port: BGP_PORT,
            asn,
            password: None,
            rr_client: false,
            keep_original_next_hop: false,
            passive: false,
        }
    }
}

/// How a peer relates to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerType {
    /// iBGP (same AS).
    Internal,
    /// iBGP route-reflector client.
    RouteReflectorClient,
    /// eBGP.
    External,
}

/// A peer's session as `ternctl node status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The peer's address.
    pub address: IpAddr,
    /// FSM state.
    pub state: State,
    /// When the session entered this state.
    pub since: SystemTime,
    /// The last notable event (why the session went down, last connect error, ...).
    pub info: String,
    /// The peer's AS.
    pub asn: u32,
    /// iBGP, RR client or eBGP.
    pub peer_type: PeerType,
}

/// A change of the best route for a prefix learned from a peer: what the agent programs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteEvent {
    /// Install (or replace) the route.
    Install {
        /// Destination.
        prefix: IpNet,
        /// Gateway.
        next_hop: IpAddr,
    },
    /// Remove the route.
    Remove {
        /// Destination.
        prefix: IpNet,
    },
    /// The import filter ([`SpeakerHandle::set_import_filter`]) refused a route the peer
    /// announced. Reported once per (peer, prefix) until the route is withdrawn or accepted.
    Rejected {
        /// The peer that announced it.
        peer: IpAddr,
        /// Its prefix.
        prefix: IpNet,
    },
}

/// Driver errors.
#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    /// Binding the listener failed.
    #[error("cannot listen for BGP on {address}: {source}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The peer is configured already.
    #[error("BGP peer {0} is already configured")]
    PeerExists(IpAddr),
    /// The peer is not configured.
    #[error("BGP peer {0} is not configured")]
    UnknownPeer(IpAddr),
    /// A password was given but no listener exists to attach it to, or MD5 failed.
    #[error(transparent)]
    Md5(#[from] Md5Error),
    /// The RIB refused.
    #[error(transparent)]
    Rib(#[from] RibError),
    /// The speaker task is gone.
    #[error("the BGP speaker has stopped")]
    Stopped,
}

enum Command {
    AddPeer(PeerConfig, oneshot::Sender<Result<(), SpeakerError>>),
    RemovePeer(IpAddr, oneshot::Sender<Result<(), SpeakerError>>),
    Originate(IpNet, Option<IpAddr>, oneshot::Sender<()>),
    Withdraw(IpNet, oneshot::Sender<()>),
    Status(oneshot::Sender<Vec<PeerStatus>>),
    Routes(oneshot::Sender<Vec<BestRoute>>),
    SetImportFilter(Option<ImportFilter>, oneshot::Sender<()>),
    Shutdown { graceful_restart: bool },
}

/// Events from the socket helper tasks.
enum Io {
    Connected {
        peer: IpAddr,
        id: u64,
        stream: TcpStream,
    },
    ConnectFailed {
        peer: IpAddr,
        id: u64,
        error: String,
    },
    Accepted {
        stream: TcpStream,
        remote: SocketAddr,
    },
    Frame {
        peer: IpAddr,
        id: u64,
        bytes: Vec<u8>,
    },
    FrameError {
        peer: IpAddr,
        id: u64,
        error: DecodeError,
    },
    Closed {
        peer: IpAddr,
        id: u64,
    },
}

/// Entry point.
pub struct Speaker;

impl Speaker {
    /// Binds the listener (if any) and spawns the speaker task on the current tokio runtime.
    /// Sockets are created in the network namespace of the calling thread.
    pub async fn start(config: SpeakerConfig) -> Result<SpeakerHandle, SpeakerError> {
        let (io_tx, io_rx) = mpsc::unbounded_channel();
        let mut listener_fds = Vec::new();
        let mut accept_tasks = Vec::new();
        for address in config.listen.into_iter().chain(config.listen_also) {
            let listener = match bind_listener(address) {
                Ok(l) => l,
                Err(source) => {
                    accept_tasks.iter().for_each(JoinHandle::abort);
                    return Err(SpeakerError::Listen { address, source });
                }
            };
            listener_fds.push((address, listener.as_raw_fd()));
            let tx = io_tx.clone();
            accept_tasks.push(tokio::spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, remote)) => {
                            if tx.send(Io::Accepted { stream, remote }).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            log::warn!("BGP accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }));
        }
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let core = Core {
            rib: Rib::new(RibConfig {
                local_as: config.asn,
                router_id: config.router_id,
                cluster_id: config.cluster_id,
            }),
            config,
            peers: BTreeMap::new(),
            timers: std::collections::HashMap::new(),
            installed: BTreeMap::new(),
            rejected: std::collections::BTreeSet::new(),
            events: ev_tx,
            io_tx,
            next_id: 1,
            listener_fds,
        };
        let task = tokio::spawn(core.run(cmd_rx, io_rx, accept_tasks));
        Ok(SpeakerHandle {
            cmd: cmd_tx,
            events: Some(ev_rx),
            task: Some(task),
        })
    }
}

/// Controls a running speaker. Dropping it stops the speaker as [`SpeakerHandle::shutdown`]
/// does, without waiting.
pub struct SpeakerHandle {
    cmd: mpsc::UnboundedSender<Command>,
    events: Option<mpsc::UnboundedReceiver<RouteEvent>>,
    task: Option<JoinHandle<()>>,
}

impl SpeakerHandle {
    async fn ask<T>(
        &self,
        f: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, SpeakerError> {
        let (tx, rx) = oneshot::channel();
        self.cmd.send(f(tx)).map_err(|_| SpeakerError::Stopped)?;
        rx.await.map_err(|_| SpeakerError::Stopped)
    }

    /// The stream of best-route changes (once; later calls return `None`).
    pub fn take_events(&mut self) -> Option<mpsc::UnboundedReceiver<RouteEvent>> {
        self.events.take()
    }

    /// Configures a peer and starts its session.
    pub async fn add_peer(&self, peer: PeerConfig) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::AddPeer(peer, tx)).await?
    }

    /// Stops the peer's session (Cease / Peer De-configured) and forgets its routes.
    pub async fn remove_peer(&self, address: IpAddr) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::RemovePeer(address, tx)).await?
    }

    /// Originates a prefix; `next_hop` overrides our own address as the advertised next hop.
    pub async fn originate(
        &self,
        prefix: IpNet,
        next_hop: Option<IpAddr>,
    ) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::Originate(prefix, next_hop, tx))
            .await
    }

    /// Stops originating a prefix.
    pub async fn withdraw(&self, prefix: IpNet) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::Withdraw(prefix, tx)).await
    }

    /// Sets the import filter applied to every route learned from any peer (`None`: accept
    /// all). Routes already received are re-evaluated at once: newly refused ones are removed
    /// (and withdrawn from other peers), newly accepted ones installed. Set it before adding
    /// peers so that no route is ever used unfiltered.
    pub async fn set_import_filter(
        &self,
        filter: Option<ImportFilter>,
    ) -> Result<(), SpeakerError> {
        self.ask(|tx| Command::SetImportFilter(filter, tx)).await
    }

    /// Per-peer session status.
    pub async fn status(&self) -> Result<Vec<PeerStatus>, SpeakerError> {
        self.ask(Command::Status).await
    }

    /// The Loc-RIB (including our own and stale routes).
    pub async fn routes(&self) -> Result<Vec<BestRoute>, SpeakerError> {
        self.ask(Command::Routes).await
    }

    async fn stop(mut self, graceful_restart: bool) {
        let _ = self.cmd.send(Command::Shutdown { graceful_restart });
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }

    /// Ends every session with Cease / Administrative Shutdown and waits for the task to end.
    pub async fn shutdown(self) {
        self.stop(false).await
    }

    /// Closes sessions for a restart: where graceful restart was negotiated the TCP connection
    /// is just closed, without NOTIFICATION, so the peer keeps our routes (RFC 4724); other
    /// sessions get Cease. Waits for the task to end.
    pub async fn graceful_shutdown_for_restart(self) {
        self.stop(true).await
    }
}

impl Drop for SpeakerHandle {
    fn drop(&mut self) {
        if self.task.is_some() {
            let _ = self.cmd.send(Command::Shutdown {
                graceful_restart: false,
            });
        }
    }
}

fn bind_listener(address: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    if address.is_ipv6() {
        // Accept IPv4 peers on [::] too, as v4-mapped addresses.
        sock.set_only_v6(false)?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&address.into())?;
    sock.listen(128)?;
    TcpListener::from_std(sock.into())
}

/// Makes an outbound socket with the MD5 key set before the SYN.
fn outbound_socket(
    peer: SocketAddr,
    source: Option<IpAddr>,
    password: Option<&str>,
) -> Result<TcpSocket, String> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(peer),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| format!("socket: {e}"))?;
    sock.set_nonblocking(true)
        .map_err(|e| format!("nonblocking: {e}"))?;
    let _ = sock.set_tcp_nodelay(true);
    if let Some(src) = source.filter(|s| s.is_ipv4() == peer.is_ipv4() && !s.is_unspecified()) {
        let _ = sock.set_reuse_address(true);
        sock.bind(&SocketAddr::new(src, 0).into())
            .map_err(|e| format!("binding source address {src}: {e}"))?;
    }
    if let Some(pw) = password {
        md5::set_key(sock.as_raw_fd(), peer.ip(), Some(pw.as_bytes()))
            .map_err(|e| e.to_string())?;
    }
    Ok(TcpSocket::from_std_stream(sock.into()))
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

struct Conn {
    id: u64,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    reader: JoinHandle<()>,
    local: SocketAddr,
}

impl Conn {
    /// Splits the stream into a reader task (frames to the speaker) and a writer task that
    /// flushes queued messages and closes the socket once the sender is dropped.
    fn spawn(stream: TcpStream, peer: IpAddr, id: u64, io: mpsc::UnboundedSender<Io>) -> Conn {
        let local = stream
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(buf) = rx.recv().await {
                if wr.write_all(&buf).await.is_err() {
                    return;
                }
            }
            let _ = wr.shutdown().await;
        });
        let reader = tokio::spawn(async move {
            let mut framer = Framer::new();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = io.send(Io::Closed { peer, id });
                        return;
                    }
                    Ok(n) => n,
                };
                framer.push(&buf[..n]);
                loop {
                    match framer.next_frame() {
                        Ok(Some(bytes)) => {
                            if io.send(Io::Frame { peer, id, bytes }).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(error) => {
                            let _ = io.send(Io::FrameError { peer, id, error });
                            return;
                        }
                    }
                }
            }
        });
        Conn {
            id,
            tx,
            reader,
            local,
        }
    }

    fn send(&self, msg: &Message, opts: codec::CodecOptions) {
        let _ = self.tx.send(codec::encode_with(msg, opts));
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The writer ends (after flushing) when `tx` drops; the reader must be stopped.
        self.reader.abort();
    }
}

struct Peer {
    config: PeerConfig,
    session: Session,
    conn: Option<Conn>,
    /// Inbound connection held during collision detection, with the speaker's OPEN pending.
    candidate: Option<Conn>,
    connecting: Option<(u64, JoinHandle<()>)>,
    since: SystemTime,
    info: String,
    state: State,
}

struct Core {
    config: SpeakerConfig,
    rib: Rib,
    peers: BTreeMap<IpAddr, Peer>,
    timers: std::collections::HashMap<(IpAddr, TimerKind), Instant>,
    installed: BTreeMap<IpNet, IpAddr>,
    /// Routes the import filter refuses, as last reported.
    rejected: std::collections::BTreeSet<(IpAddr, IpNet)>,
    events: mpsc::UnboundedSender<RouteEvent>,
    io_tx: mpsc::UnboundedSender<Io>,
    next_id: u64,
    /// The listening sockets (at most one per family) and their addresses.
    listener_fds: Vec<(SocketAddr, RawFd)>,
}

fn collision_notification() -> Message {
    Message::Notification(Notification::bare(ErrorCode::Cease(
        CeaseSubcode::ConnectionCollisionResolution,
    )))
}

impl Core {
    async fn run(
        mut self,
        mut cmd_rx: mpsc::UnboundedReceiver<Command>,
        mut io_rx: mpsc::UnboundedReceiver<Io>,
        accept_tasks: Vec<JoinHandle<()>>,
    ) {
        let started = Instant::now();
        loop {
            let next = self.timers.values().min().copied();
            let sleep_to = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                cmd = cmd_rx.recv() => match cmd {
                    None => { self.shutdown(false); break; }
                    Some(Command::Shutdown { graceful_restart }) => {
                        self.shutdown(graceful_restart);
                        break;
                    }
                    Some(c) => self.command(c),
                },
                Some(io) = io_rx.recv() => self.io(io),
                _ = tokio::time::sleep_until(sleep_to), if next.is_some() => {
                    self.fire_timers(started);
                }
            }
            self.sync();
        }
        for t in accept_tasks {
            t.abort();
        }
    }

    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
    }

    fn session_config(&self, p: &PeerConfig) -> SessionConfig {
        let mut s = SessionConfig::new(self.config.asn, p.asn, self.config.router_id);
        s.hold_time = self.config.hold_time;
        s.connect_retry = self.config.connect_retry;
        s.connect_retry_max = self.config.connect_retry_max;
        s.passive = p.passive;
        s.families = vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST];
        s.graceful_restart = self
            .config
            .graceful_restart_time
            .map(|t| GracefulRestartConfig {
                restart_time: t,
                restarting: self.config.restarting,
                ..GracefulRestartConfig::default()
            });
        s
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::AddPeer(p, reply) => {
                let _ = reply.send(self.add_peer(p));
            }
            Command::RemovePeer(a, reply) => {
                let _ = reply.send(self.remove_peer(a));
            }
            Command::Originate(prefix, nh, reply) => {
                self.rib.originate_via(prefix, nh);
                let _ = reply.send(());
            }
            Command::Withdraw(prefix, reply) => {
                self.rib.withdraw_local(prefix);
                let _ = reply.send(());
            }
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::Routes(reply) => {
                let _ = reply.send(self.rib.best_routes());
            }
            Command::SetImportFilter(f, reply) => {
                self.rib.set_import_filter(f);
                let _ = reply.send(());
            }
            Command::Shutdown { .. } => {}
        }
    }

    fn add_peer(&mut self, p: PeerConfig) -> Result<(), SpeakerError> {
        let address = canonical(p.address);
        if self.peers.contains_key(&address) {
            return Err(SpeakerError::PeerExists(address));
        }
        if let Some(pw) = &p.password {
            for fd in self.listener_fds_for(address) {
                md5::set_key(fd, address, Some(pw.as_bytes()))?;
            }
        }
        self.rib.add_peer(rib::PeerConfig {
            address,
            asn: p.asn,
            next_hop_v4: self.config.next_hop_v4,
            next_hop_v6: self.config.next_hop_v6,
            rr_client: p.rr_client,
            next_hop_self: false,
            keep_original_next_hop: p.keep_original_next_hop,
        })?;
        let session = Session::new(self.session_config(&p));
        let config = PeerConfig { address, ..p };
        self.peers.insert(
            address,
            Peer {
                config,
                session,
                conn: None,
                candidate: None,
                connecting: None,
                since: SystemTime::now(),
                info: String::new(),
                state: State::Idle,
            },
        );
        self.feed(address, Event::ManualStart);
        Ok(())
    }

    fn remove_peer(&mut self, address: IpAddr) -> Result<(), SpeakerError> {
        let address = canonical(address);
        let Some(peer) = self.peers.get_mut(&address) else {
            return Err(SpeakerError::UnknownPeer(address));
        };
        if let Some(c) = &peer.conn
            && matches!(
                peer.session.state(),
                State::OpenSent | State::OpenConfirm | State::Established
            )
        {
            c.send(
                &Message::Notification(Notification::bare(ErrorCode::Cease(
                    CeaseSubcode::PeerDeconfigured,
                ))),
                peer.session.codec_options(),
            );
        }
        let peer = self.peers.remove(&address).expect("checked above");
        if let Some((_, t)) = &peer.connecting {
            t.abort();
        }
        if peer.config.password.is_some() {
            for fd in self.listener_fds_for(address) {
                let _ = md5::set_key(fd, address, None);
            }
        }
        self.timers.retain(|(a, _), _| *a != address);
        self.rib.remove_peer(address)?;
        Ok(())
    }

    /// The listening sockets that accept `peer`: those of its family, or every one when none
    /// is (an IPv4 peer on a dual-stack `[::]` listener).
    fn listener_fds_for(&self, peer: IpAddr) -> Vec<RawFd> {
        let same: Vec<RawFd> = self
            .listener_fds
            .iter()
            .filter(|(a, _)| a.is_ipv4() == peer.is_ipv4())
            .map(|(_, fd)| *fd)
            .collect();
        if same.is_empty() {
            self.listener_fds.iter().map(|(_, fd)| *fd).collect()
        } else {
            same
        }
    }

    fn status(&self) -> Vec<PeerStatus> {
        self.peers
            .values()
            .map(|p| PeerStatus {
                address: p.config.address,
                state: p.session.state(),
                since: p.since,
                info: p.info.clone(),
                asn: p.config.asn,
                peer_type: if p.config.asn != self.config.asn {
                    PeerType::External
                } else if p.config.rr_client && self.config.cluster_id.is_some() {
                    PeerType::RouteReflectorClient
                } else {
                    PeerType::Internal
                },
            })
            .collect()
    }

    fn shutdown(&mut self, graceful_restart: bool) {
        let addrs: Vec<IpAddr> = self.peers.keys().copied().collect();
        for a in addrs {
            let Some(peer) = self.peers.get_mut(&a) else {
                continue;
            };
            let gr = peer
                .session
                .negotiated()
                .is_some_and(|n| n.graceful_restart.is_some());
            if graceful_restart && gr && peer.session.state() == State::Established {
                // Just close: the peer sees a lost connection and retains our routes.
                peer.conn = None;
            } else {
                self.feed(a, Event::ManualStop);
            }
            if let Some(peer) = self.peers.get_mut(&a) {
                peer.conn = None;
                peer.candidate = None;
                if let Some((_, t)) = peer.connecting.take() {
                    t.abort();
                }
            }
        }
        self.peers.clear();
    }

    fn fire_timers(&mut self, _started: Instant) {
        let now = Instant::now();
        let due: Vec<(IpAddr, TimerKind)> = self
            .timers
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| *k)
            .collect();
        for (a, k) in due {
            self.timers.remove(&(a, k));
            self.feed(a, Event::TimerExpired(k));
        }
    }

    fn io(&mut self, io: Io) {
        match io {
            Io::Connected { peer, id, stream } => {
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                if p.connecting.as_ref().map(|c| c.0) != Some(id) {
                    return;
                }
                p.connecting = None;
                if p.session.state() != State::Connect {
                    return;
                }
                p.conn = Some(Conn::spawn(stream, peer, id, self.io_tx.clone()));
                self.feed(peer, Event::TcpConnected);
            }
            Io::ConnectFailed { peer, id, error } => {
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                if p.connecting.as_ref().map(|c| c.0) != Some(id) {
                    return;
                }
                p.connecting = None;
                p.info = format!("connect failed: {error}");
                self.feed(peer, Event::TcpFailed);
            }
            Io::Accepted { stream, remote } => self.accepted(stream, remote),
            Io::Frame { peer, id, bytes } => self.frame(peer, id, Ok(bytes)),
            Io::FrameError { peer, id, error } => self.frame(peer, id, Err(error)),
            Io::Closed { peer, id } => {
                let Some(p) = self.peers.get_mut(&peer) else {
                    return;
                };
                if p.candidate.as_ref().is_some_and(|c| c.id == id) {
                    p.candidate = None;
                } else if p.conn.as_ref().is_some_and(|c| c.id == id) {
                    p.conn = None;
                    self.feed(peer, Event::TcpClosed);
                }
            }
        }
    }

    fn accepted(&mut self, stream: TcpStream, remote: SocketAddr) {
        let addr = canonical(remote.ip());
        let id = self.next_id;
        self.next_id += 1;
        let Some(p) = self.peers.get_mut(&addr) else {
            log::info!("BGP: refusing connection from unconfigured peer {remote}");
            return;
        };
        match p.session.state() {
            State::OpenSent | State::OpenConfirm => {
                p.candidate = Some(Conn::spawn(stream, addr, id, self.io_tx.clone()));
            }
            State::Established => {
                let c = Conn::spawn(stream, addr, id, self.io_tx.clone());
                c.send(&collision_notification(), codec::CodecOptions::default());
            }
            _ => {
                let c = Conn::spawn(stream, addr, id, self.io_tx.clone());
                self.adopt(addr, c, None);
            }
        }
    }

    /// Makes `conn` the session's connection (from Idle/Connect/Active), then replays the
    /// peer's OPEN if it was already read during collision detection.
    fn adopt(&mut self, addr: IpAddr, conn: Conn, open: Option<Open>) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.session.state() == State::Idle {
            // Between attempts after an error: the peer is back, so skip the rest of the wait.
            self.timers.remove(&(addr, TimerKind::ConnectRetry));
            self.feed(addr, Event::TimerExpired(TimerKind::ConnectRetry));
        }
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if !matches!(p.session.state(), State::Connect | State::Active) {
            return;
        }
        if let Some((_, t)) = p.connecting.take() {
            t.abort();
        }
        p.conn = Some(conn);
        self.feed(addr, Event::TcpConnected);
        if let Some(open) = open {
            self.feed(addr, Event::MessageReceived(Message::Open(open)));
        }
    }

    fn frame(&mut self, addr: IpAddr, id: u64, bytes: Result<Vec<u8>, DecodeError>) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if p.candidate.as_ref().is_some_and(|c| c.id == id) {
            let cand = p.candidate.take().expect("checked");
            let open = match bytes.and_then(|b| codec::decode(&b)) {
                Ok(Message::Open(o)) => o,
                Ok(_) => return,
                Err(e) => {
                    cand.send(
                        &Message::Notification(e.notification),
                        codec::CodecOptions::default(),
                    );
                    return;
                }
            };
            self.collision(addr, cand, open);
            return;
        }
        if p.conn.as_ref().is_none_or(|c| c.id != id) {
            return;
        }
        let ev = match bytes.and_then(|b| codec::decode_with(&b, p.session.codec_options())) {
            Ok(m) => Event::MessageReceived(m),
            Err(e) => {
                p.info = format!("malformed message: {e}");
                Event::MessageInvalid(e)
            }
        };
        self.feed(addr, ev);
    }

    /// RFC 4271 §6.8: keep the connection opened by the speaker with the higher identifier.
    fn collision(&mut self, addr: IpAddr, cand: Conn, open: Open) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        match p.session.state() {
            State::OpenSent | State::OpenConfirm => {}
            State::Established => {
                cand.send(&collision_notification(), codec::CodecOptions::default());
                return;
            }
            _ => {
                self.adopt(addr, cand, Some(open));
                return;
            }
        }
        if u32::from(self.config.router_id) >= u32::from(open.bgp_id) {
            // Ours wins: the existing connection stays only if it is the one we opened; the
            // FSM has one connection, so the newer inbound one is refused either way here.
            cand.send(&collision_notification(), codec::CodecOptions::default());
            return;
        }
        if let Some(old) = p.conn.take() {
            old.send(&collision_notification(), p.session.codec_options());
        }
        let actions = p.session.collision_reset();
        p.info = "connection collision: kept the peer's connection".into();
        self.execute(addr, actions);
        self.adopt(addr, cand, Some(open));
    }

    /// Feeds an event to the peer's session and carries out the resulting actions.
    fn feed(&mut self, addr: IpAddr, ev: Event) {
        let now = self.now();
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        let actions = p.session.handle(ev, now);
        self.execute(addr, actions);
    }

    fn execute(&mut self, addr: IpAddr, actions: Vec<Action>) {
        let mut over_limit = false;
        for a in actions {
            let Some(p) = self.peers.get_mut(&addr) else {
                return;
            };
            match a {
                Action::Connect => {
                    if let Some((_, t)) = p.connecting.take() {
                        t.abort();
                    }
                    let id = self.next_id;
                    self.next_id += 1;
                    let target = SocketAddr::new(p.config.address, p.config.port);
                    let source = self
                        .config
                        .listen
                        .into_iter()
                        .chain(self.config.listen_also)
                        .map(|l| l.ip())
                        .find(|s| s.is_ipv4() == target.is_ipv4());
                    let pw = p.config.password.clone();
                    let io = self.io_tx.clone();
                    let task = tokio::spawn(async move {
                        let res = match outbound_socket(target, source, pw.as_deref()) {
                            Ok(s) => s.connect(target).await.map_err(|e| e.to_string()),
                            Err(e) => Err(e),
                        };
                        let _ = io.send(match res {
                            Ok(stream) => Io::Connected {
                                peer: target.ip(),
                                id,
                                stream,
                            },
                            Err(error) => Io::ConnectFailed {
                                peer: target.ip(),
                                id,
                                error,
                            },
                        });
                    });
                    p.connecting = Some((id, task));
                }
                Action::CloseTcp => {
                    p.conn = None;
                    if let Some((_, t)) = p.connecting.take() {
                        t.abort();
                    }
                }
                Action::SendMessage(m) => {
                    if let Some(c) = &p.conn {
                        c.send(&m, p.session.codec_options());
                    }
                    if let Message::Notification(n) = &m {
                        p.info = format!("sent NOTIFICATION {n}");
                    }
                }
                Action::SetTimer(k, d) => {
                    self.timers.insert((addr, k), Instant::now() + d);
                }
                Action::CancelTimer(k) => {
                    self.timers.remove(&(addr, k));
                }
                Action::SessionUp(neg) => {
                    let local = p.conn.as_ref().map(|c| canonical(c.local.ip()));
                    let v4 = self.config.next_hop_v4.or(match local {
                        Some(IpAddr::V4(a)) => Some(a),
                        _ => None,
                    });
                    let v6 = self.config.next_hop_v6.or(match local {
                        Some(IpAddr::V6(a)) => Some(a),
                        _ => None,
                    });
                    p.info = format!("established with {} (AS {})", neg.peer_id, neg.peer_as);
                    let _ = self.rib.set_next_hops(addr, v4, v6);
                    let _ = self.rib.peer_up(addr, &neg);
                }
                Action::SessionDown { reason, retain } => {
                    p.info = match &reason {
                        DownReason::ManualStop => "stopped".to_string(),
                        DownReason::ConnectionLost => "connection lost".to_string(),
                        DownReason::HoldTimerExpired => "hold timer expired".to_string(),
                        DownReason::NotificationReceived(n) => {
                            format!("received NOTIFICATION {n}")
                        }
                        DownReason::NotificationSent(n) => format!("sent NOTIFICATION {n}"),
                    };
                    if retain.is_some() {
                        p.info
                            .push_str(" (graceful restart: routes retained as stale)");
                    }
                    let _ = self.rib.peer_down(addr, retain.as_ref());
                }
                Action::RoutesReceived(u) => {
                    let _ = self.rib.apply_update(addr, &u);
                    let limit = self.config.max_prefixes_per_peer;
                    if self.rib.adj_rib_in_len(addr) > limit as usize {
                        over_limit = true;
                    }
                }
                Action::RoutesWithdrawn(prefixes) => {
                    let _ = self.rib.withdraw(addr, &prefixes);
                }
                Action::EndOfRib(f) => {
                    let _ = self.rib.end_of_rib(addr, f);
                }
                Action::RouteRefreshRequested(f) => {
                    let _ = self.rib.refresh(addr, f);
                }
                Action::PurgeStale(fs) => {
                    let _ = self.rib.purge_stale(addr, &fs);
                }
            }
        }
        if let Some(p) = self.peers.get_mut(&addr)
            && p.state != p.session.state()
        {
            p.state = p.session.state();
            p.since = SystemTime::now();
        }
        if over_limit {
            let limit = self.config.max_prefixes_per_peer;
            log::warn!("BGP peer {addr} sent more than {limit} routes: closing the session");
            self.feed(addr, Event::PrefixLimitExceeded(limit));
        }
    }

    /// Sends pending UPDATEs and reports best-route changes.
    fn sync(&mut self) {
        for (addr, update) in self.rib.take_updates() {
            if let Some(p) = self.peers.get(&addr)
                && let Some(c) = &p.conn
            {
                c.send(&Message::Update(update), p.session.codec_options());
            }
        }
        let mut want: BTreeMap<IpNet, IpAddr> = BTreeMap::new();
        for r in self.rib.best_routes() {
            if r.kind != RouteKind::Local
                && let Some(nh) = r.next_hop
            {
                want.insert(r.prefix, nh);
            }
        }
        for prefix in self.installed.keys() {
            if !want.contains_key(prefix) {
                let _ = self.events.send(RouteEvent::Remove { prefix: *prefix });
            }
        }
        for (prefix, nh) in &want {
            if self.installed.get(prefix) != Some(nh) {
                let _ = self.events.send(RouteEvent::Install {
                    prefix: *prefix,
                    next_hop: *nh,
                });
            }
        }
        self.installed = want;
        let rejected: std::collections::BTreeSet<(IpAddr, IpNet)> =
            self.rib.filtered().into_iter().collect();
        for (peer, prefix) in rejected.difference(&self.rejected) {
            let _ = self.events.send(RouteEvent::Rejected {
                peer: *peer,
                prefix: *prefix,
            });
        }
        self.rejected = rejected;
    }
}
