//! One peer's BGP finite state machine (RFC 4271 §8), sans-IO.
//!
//! [`Session::handle`] consumes an [`Event`] and returns the [`Action`]s the driver must carry
//! out, in order. The session never reads a clock: timers are requested with
//! [`Action::SetTimer`] / [`Action::CancelTimer`] and come back as [`Event::TimerExpired`];
//! `now` is only recorded (e.g. when the session came up) for status output.
//!
//! Simplifications, deliberate for tern's topology (one connection per peer; in a Calico-style
//! mesh one side is passive, so connections do not collide):
//! - The driver owns at most one TCP connection per session. It must refuse a second inbound
//!   connection while the session is past Connect/Active (no collision detection here).
//! - The session is always "automatically restarted" after an error: the IdleHold timer of
//!   RFC 4271 is folded into the connect-retry timer, which backs off exponentially from
//!   [`SessionConfig::connect_retry`] up to [`SessionConfig::connect_retry_max`] and resets when
//!   the session reaches Established.
//! - Graceful restart (RFC 4724) as helper: a session lost without a NOTIFICATION, where both
//!   sides advertised the capability, reports [`Action::SessionDown`] with `retain` set. The
//!   RIB marks the routes stale; they are purged on End-of-RIB ([`Action::EndOfRib`]), when the
//!   new OPEN no longer preserves forwarding for the family, or when the GracefulRestart timer
//!   fires ([`Action::PurgeStale`]). As restarting speaker the OPEN carries the Restart State
//!   bit on the first session after start-up when [`GracefulRestartConfig::restarting`] is set.

use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::codec::{
    Capability, CeaseSubcode, CodecOptions, DecodeError, ErrorAction, ErrorCode, Family,
    FsmSubcode, GracefulRestart, GracefulRestartFamily, Message, Notification, Open, OpenSubcode,
    Update,
};

/// Hold time used between sending OPEN and receiving the peer's (RFC 4271 §8.2.2: "large").
pub const OPEN_HOLD_TIME: Duration = Duration::from_secs(240);

/// Graceful-restart settings of the local speaker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GracefulRestartConfig {
    /// Restart Time advertised: how long peers should keep our routes (seconds, at most 4095).
    pub restart_time: u16,
    /// We have just restarted: set the Restart State bit in the first OPEN.
    pub restarting: bool,
    /// Forwarding state was preserved across our restart (the F bit per family).
    pub forwarding_preserved: bool,
    /// How long, once a restarted peer is back, its stale routes wait for End-of-RIB.
    pub stale_routes_time: Duration,
}

impl Default for GracefulRestartConfig {
    fn default() -> Self {
        GracefulRestartConfig {
            restart_time: 120,
            restarting: false,
            forwarding_preserved: true,
            stale_routes_time: Duration::from_secs(360),
        }
    }
}

/// Per-peer session configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionConfig {
    /// Our AS.
    pub local_as: u32,
    /// The AS the peer must announce.
    pub remote_as: u32,
    /// Our BGP identifier.
    pub router_id: Ipv4Addr,
    /// Hold time we propose (seconds; 0 disables keepalives, else at least 3).
    pub hold_time: u16,
    /// Initial connect-retry interval.
    pub connect_retry: Duration,
    /// Upper bound of the exponential connect-retry backoff.
    pub connect_retry_max: Duration,
    /// Wait for the peer to connect instead of connecting.
    pub passive: bool,
    /// Families we advertise (multiprotocol capability).
    pub families: Vec<Family>,
    /// Advertise route refresh.
    pub route_refresh: bool,
    /// Advertise graceful restart.
    pub graceful_restart: Option<GracefulRestartConfig>,
}

impl SessionConfig {
    /// Defaults in the spirit of Calico's BIRD template: hold 90 s, connect retry 5 s backing
    /// off to 120 s, IPv4 and IPv6 unicast, route refresh and graceful restart on.
    pub fn new(local_as: u32, remote_as: u32, router_id: Ipv4Addr) -> SessionConfig {
        SessionConfig {
            local_as,
            remote_as,
            router_id,
            hold_time: 90,
            connect_retry: Duration::from_secs(5),
            connect_retry_max: Duration::from_secs(120),
            passive: false,
            families: vec![Family::IPV4_UNICAST, Family::IPV6_UNICAST],
            route_refresh: true,
            graceful_restart: Some(GracefulRestartConfig::default()),
        }
    }
}

/// RFC 4271 §8.2.2 states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Not trying to connect.
    Idle,
    /// Connecting.
    Connect,
    /// Waiting for an inbound connection (or for the next connect attempt).
    Active,
    /// OPEN sent, waiting for the peer's.
    OpenSent,
    /// OPENs exchanged, waiting for KEEPALIVE.
    OpenConfirm,
    /// Exchanging routes.
    Established,
}

/// The session's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimerKind {
    /// Connect retry (and, after an error, the delay before the next attempt).
    ConnectRetry,
    /// Hold timer.
    Hold,
    /// Keepalive interval.
    Keepalive,
    /// Graceful-restart helper: how long stale routes of the peer are kept.
    GracefulRestart,
}

/// Inputs to the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// Start (connect, or wait for the peer when passive).
    ManualStart,
    /// Stop with Cease / Administrative Shutdown.
    ManualStop,
    /// The TCP connection (outbound or accepted inbound) is up.
    TcpConnected,
    /// The connection attempt failed.
    TcpFailed,
    /// The connection was closed by the peer or broke.
    TcpClosed,
    /// A message was decoded.
    MessageReceived(Message),
    /// A message failed to decode.
    MessageInvalid(DecodeError),
    /// A timer requested earlier fired.
    TimerExpired(TimerKind),
    /// The peer's routes exceeded the configured limit (the driver counts them): Cease /
    /// Maximum Number of Prefixes Reached (RFC 4486) with the limit as data, and the session
    /// is retried later as after any error.
    PrefixLimitExceeded(u32),
}

/// Why an Established session went down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownReason {
    /// [`Event::ManualStop`].
    ManualStop,
    /// TCP closed or failed without a NOTIFICATION.
    ConnectionLost,
    /// Our hold timer expired.
    HoldTimerExpired,
    /// The peer sent this NOTIFICATION.
    NotificationReceived(Notification),
    /// We sent this NOTIFICATION.
    NotificationSent(Notification),
}

/// Stale-route retention requested on a graceful session loss.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    /// Families whose routes are kept, marked stale.
    pub families: Vec<Family>,
    /// The peer's advertised restart time.
    pub restart_time: Duration,
}

/// The result of the OPEN exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Negotiated {
    /// The peer's AS.
    pub peer_as: u32,
    /// The peer's BGP identifier.
    pub peer_id: Ipv4Addr,
    /// Whether the session is internal (same AS).
    pub ibgp: bool,
    /// Negotiated hold time (seconds; 0 = no keepalives, no hold timer).
    pub hold_time: u16,
    /// Keepalive interval (seconds): a third of the hold time.
    pub keepalive: u16,
    /// Both sides support 4-octet AS numbers.
    pub four_octet_as: bool,
    /// Families both sides advertised (IPv4 unicast when the peer advertised none).
    pub families: Vec<Family>,
    /// Both sides support route refresh.
    pub route_refresh: bool,
    /// The peer's graceful-restart capability, when both sides advertised it.
    pub graceful_restart: Option<GracefulRestart>,
}

impl Negotiated {
    /// Codec options for this session.
    pub fn codec_options(&self) -> CodecOptions {
        CodecOptions {
            four_octet_as: self.four_octet_as,
        }
    }
}

/// Outputs of the session, to be executed in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Open a TCP connection to the peer.
    Connect,
    /// Close (or abort) the TCP connection.
    CloseTcp,
    /// Encode and send a message.
    SendMessage(Message),
    /// (Re)arm a timer to fire after the duration.
    SetTimer(TimerKind, Duration),
    /// Disarm a timer.
    CancelTimer(TimerKind),
    /// The session reached Established.
    SessionUp(Negotiated),
    /// The Established session ended; with `retain`, keep the peer's routes as stale.
    SessionDown {
        /// Why.
        reason: DownReason,
        /// Graceful-restart retention, if applicable.
        retain: Option<Retention>,
    },
    /// An UPDATE to apply to the peer's Adj-RIB-In.
    RoutesReceived(Update),
    /// RFC 7606 treat-as-withdraw: remove these prefixes from the peer's Adj-RIB-In.
    RoutesWithdrawn(Vec<IpNet>),
    /// End-of-RIB received: the peer's stale routes of the family can go.
    EndOfRib(Family),
    /// The peer asked for our routes of the family again.
    RouteRefreshRequested(Family),
    /// Remove the peer's stale routes of these families.
    PurgeStale(Vec<Family>),
}

/// One peer's session.
#[derive(Debug, Clone)]
pub struct Session {
    config: SessionConfig,
    state: State,
    started: bool,
    backoff: Duration,
    restarting: bool,
    negotiated: Option<Negotiated>,
    established_at: Option<Duration>,
    stale: Vec<Family>,
}

fn secs(s: u16) -> Duration {
    Duration::from_secs(u64::from(s))
}

impl Session {
    /// A new session in Idle.
    pub fn new(config: SessionConfig) -> Session {
        let restarting = config
            .graceful_restart
            .as_ref()
            .is_some_and(|g| g.restarting);
        Session {
            backoff: config.connect_retry,
            config,
            state: State::Idle,
            started: false,
            restarting,
            negotiated: None,
            established_at: None,
            stale: Vec::new(),
        }
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The OPEN negotiation result, from OpenConfirm on.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// When the session last reached Established (the `now` passed with that event).
    pub fn established_at(&self) -> Option<Duration> {
        self.established_at
    }

    /// Codec options for the current connection.
    pub fn codec_options(&self) -> CodecOptions {
        self.negotiated
            .as_ref()
            .map(Negotiated::codec_options)
            .unwrap_or_default()
    }

    /// The OPEN this session sends.
    pub fn open_message(&self) -> Open {
        let mut caps: Vec<Capability> = self
            .config
            .families
            .iter()
            .map(|f| Capability::Multiprotocol(*f))
            .collect();
        if self.config.route_refresh {
            caps.push(Capability::RouteRefresh);
        }
        if let Some(gr) = &self.config.graceful_restart {
            caps.push(Capability::GracefulRestart(GracefulRestart {
                restart_state: self.restarting,
                other_flags: 0,
                restart_time: gr.restart_time.min(0x0fff),
                families: self
                    .config
                    .families
                    .iter()
                    .map(|f| GracefulRestartFamily {
                        family: *f,
                        forwarding_preserved: gr.forwarding_preserved,
                        other_flags: 0,
                    })
                    .collect(),
            }));
        }
        Open::new(
            self.config.local_as,
            self.config.hold_time,
            self.config.router_id,
            caps,
        )
    }

    /// Connection collision (RFC 4271 §6.8) lost by the current connection: forgets it and
    /// returns to Active without arming the connect-retry timer, so the driver can hand over
    /// the winning connection with [`Event::TcpConnected`]. Only OpenSent and OpenConfirm can
    /// collide; in other states nothing happens.
    pub fn collision_reset(&mut self) -> Vec<Action> {
        if !matches!(self.state, State::OpenSent | State::OpenConfirm) {
            return Vec::new();
        }
        self.negotiated = None;
        self.state = State::Active;
        vec![
            Action::CancelTimer(TimerKind::Hold),
            Action::CancelTimer(TimerKind::Keepalive),
        ]
    }

    /// Processes one event at time `now` (any monotonic origin) and returns the actions.
    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::ManualStart => {
                if self.state == State::Idle && !self.started {
                    self.started = true;
                    self.backoff = self.config.connect_retry;
                    self.begin_connecting(&mut out);
                }
            }
            Event::ManualStop => self.stop(&mut out),
            Event::TcpConnected => match self.state {
                State::Connect | State::Active => {
                    out.push(Action::CancelTimer(TimerKind::ConnectRetry));
                    out.push(Action::SendMessage(Message::Open(self.open_message())));
                    out.push(Action::SetTimer(TimerKind::Hold, OPEN_HOLD_TIME));
                    self.state = State::OpenSent;
                }
                // Not expecting a connection: refuse it.
                State::Idle => out.push(Action::CloseTcp),
                _ => {}
            },
            Event::TcpFailed | Event::TcpClosed => match self.state {
                State::Connect => {
                    self.state = State::Active;
                    self.arm_retry(&mut out);
                }
                State::OpenSent | State::OpenConfirm | State::Established => {
                    self.fail(&mut out, DownReason::ConnectionLost, None);
                }
                _ => {}
            },
            Event::TimerExpired(kind) => self.timer(kind, &mut out),
            Event::MessageReceived(msg) => self.message(msg, now, &mut out),
            Event::MessageInvalid(err) => self.invalid(err, &mut out),
            Event::PrefixLimitExceeded(limit) => {
                if self.state == State::Established {
                    let n = Notification::new(
                        ErrorCode::Cease(CeaseSubcode::MaximumNumberOfPrefixesReached),
                        limit.to_be_bytes().to_vec(),
                    );
                    self.fail(&mut out, DownReason::NotificationSent(n.clone()), Some(n));
                }
            }
        }
        out
    }

    fn begin_connecting(&mut self, out: &mut Vec<Action>) {
        if self.config.passive {
            self.state = State::Active;
        } else {
            self.state = State::Connect;
            out.push(Action::Connect);
            self.arm_retry(out);
        }
    }

    /// Arms the connect-retry timer with the current backoff, then doubles the backoff.
    fn arm_retry(&mut self, out: &mut Vec<Action>) {
        out.push(Action::SetTimer(TimerKind::ConnectRetry, self.backoff));
        self.backoff = (self.backoff * 2).min(self.config.connect_retry_max);
    }

    fn stop(&mut self, out: &mut Vec<Action>) {
        if !self.started && self.state == State::Idle {
            return;
        }
        if matches!(
            self.state,
            State::OpenSent | State::OpenConfirm | State::Established
        ) {
            out.push(Action::SendMessage(Message::Notification(
                Notification::bare(ErrorCode::Cease(CeaseSubcode::AdministrativeShutdown)),
            )));
        }
        if self.state != State::Idle && self.state != State::Active {
            out.push(Action::CloseTcp);
        }
        for t in [
            TimerKind::ConnectRetry,
            TimerKind::Hold,
            TimerKind::Keepalive,
        ] {
            out.push(Action::CancelTimer(t));
        }
        if self.state == State::Established {
            out.push(Action::SessionDown {
                reason: DownReason::ManualStop,
                retain: None,
            });
        }
        if !self.stale.is_empty() {
            out.push(Action::CancelTimer(TimerKind::GracefulRestart));
            out.push(Action::PurgeStale(std::mem::take(&mut self.stale)));
        }
        self.started = false;
        self.negotiated = None;
        self.state = State::Idle;
    }

    /// Ends the connection: optional NOTIFICATION, close, report, go Idle and schedule the
    /// next attempt.
    fn fail(&mut self, out: &mut Vec<Action>, reason: DownReason, send: Option<Notification>) {
        if let Some(n) = send {
            out.push(Action::SendMessage(Message::Notification(n)));
        }
        out.push(Action::CloseTcp);
        out.push(Action::CancelTimer(TimerKind::Hold));
        out.push(Action::CancelTimer(TimerKind::Keepalive));
        if self.state == State::Established {
            let retain = if reason == DownReason::ConnectionLost {
                self.retention()
            } else {
                None
            };
            out.push(Action::SessionDown {
                reason,
                retain: retain.clone(),
            });
            if let Some(r) = retain {
                self.stale = r.families;
                out.push(Action::SetTimer(TimerKind::GracefulRestart, r.restart_time));
            } else if !self.stale.is_empty() {
                // A second loss before End-of-RIB without GR: nothing stale survives.
                out.push(Action::CancelTimer(TimerKind::GracefulRestart));
                out.push(Action::PurgeStale(std::mem::take(&mut self.stale)));
            }
        }
        self.negotiated = None;
        self.state = State::Idle;
        if self.started {
            self.arm_retry(out);
        }
    }

    /// Families to keep stale when the session is lost, per RFC 4724 §4.2.
    fn retention(&self) -> Option<Retention> {
        self.config.graceful_restart.as_ref()?;
        let neg = self.negotiated.as_ref()?;
        let gr = neg.graceful_restart.as_ref()?;
        if gr.restart_time == 0 {
            return None;
        }
        let families: Vec<Family> = gr
            .families
            .iter()
            .map(|f| f.family)
            .filter(|f| neg.families.contains(f))
            .collect();
        if families.is_empty() {
            return None;
        }
        Some(Retention {
            families,
            restart_time: secs(gr.restart_time),
        })
    }

    fn timer(&mut self, kind: TimerKind, out: &mut Vec<Action>) {
        match (kind, self.state) {
            (TimerKind::ConnectRetry, State::Idle) if self.started => self.begin_connecting(out),
            (TimerKind::ConnectRetry, State::Connect) => {
                out.push(Action::CloseTcp);
                out.push(Action::Connect);
                self.arm_retry(out);
            }
            (TimerKind::ConnectRetry, State::Active) if !self.config.passive => {
                self.state = State::Connect;
                out.push(Action::Connect);
                self.arm_retry(out);
            }
            (TimerKind::Hold, State::OpenSent | State::OpenConfirm | State::Established) => {
                self.fail(
                    out,
                    DownReason::HoldTimerExpired,
                    Some(Notification::bare(ErrorCode::HoldTimerExpired)),
                );
            }
            (TimerKind::Keepalive, State::OpenConfirm | State::Established) => {
                out.push(Action::SendMessage(Message::Keepalive));
                if let Some(n) = &self.negotiated
                    && n.keepalive > 0
                {
                    out.push(Action::SetTimer(TimerKind::Keepalive, secs(n.keepalive)));
                }
            }
            (TimerKind::GracefulRestart, _) if !self.stale.is_empty() => {
                out.push(Action::PurgeStale(std::mem::take(&mut self.stale)));
            }
            _ => {}
        }
    }

    fn restart_hold(&self, out: &mut Vec<Action>) {
        if let Some(n) = &self.negotiated
            && n.hold_time > 0
        {
            out.push(Action::SetTimer(TimerKind::Hold, secs(n.hold_time)));
        }
    }

    fn fsm_error(&mut self, out: &mut Vec<Action>, sub: FsmSubcode) {
        let n = Notification::bare(ErrorCode::Fsm(sub));
        self.fail(out, DownReason::NotificationSent(n.clone()), Some(n));
    }

    fn message(&mut self, msg: Message, now: Duration, out: &mut Vec<Action>) {
        if let Message::Notification(n) = &msg {
            if matches!(
                self.state,
                State::OpenSent | State::OpenConfirm | State::Established
            ) {
                self.fail(out, DownReason::NotificationReceived(n.clone()), None);
            }
            return;
        }
        match self.state {
            State::OpenSent => match msg {
                Message::Open(open) => match self.negotiate(&open) {
                    Ok(neg) => {
                        out.push(Action::SendMessage(Message::Keepalive));
                        if neg.hold_time > 0 {
                            out.push(Action::SetTimer(TimerKind::Hold, secs(neg.hold_time)));
                            out.push(Action::SetTimer(TimerKind::Keepalive, secs(neg.keepalive)));
                        } else {
                            out.push(Action::CancelTimer(TimerKind::Hold));
                        }
                        self.negotiated = Some(neg);
                        self.state = State::OpenConfirm;
                    }
                    Err(n) => self.fail(out, DownReason::NotificationSent(n.clone()), Some(n)),
                },
                _ => self.fsm_error(out, FsmSubcode::UnexpectedMessageInOpenSent),
            },
            State::OpenConfirm => match msg {
                Message::Keepalive => self.establish(now, out),
                _ => self.fsm_error(out, FsmSubcode::UnexpectedMessageInOpenConfirm),
            },
            State::Established => match msg {
                Message::Keepalive => self.restart_hold(out),
                Message::Update(u) => {
                    self.restart_hold(out);
                    if let Some(f) = u.end_of_rib_family() {
                        out.push(Action::EndOfRib(f));
                        if self.stale.contains(&f) {
                            self.stale.retain(|s| *s != f);
                            if self.stale.is_empty() {
                                out.push(Action::CancelTimer(TimerKind::GracefulRestart));
                            }
                        }
                    } else {
                        out.push(Action::RoutesReceived(u));
                    }
                }
                Message::RouteRefresh(rr) => {
                    // RFC 2918 §4: ignore a request for a family not negotiated.
                    if let Some(n) = &self.negotiated
                        && n.route_refresh
                        && n.families.contains(&rr.family)
                    {
                        out.push(Action::RouteRefreshRequested(rr.family));
                    }
                }
                _ => self.fsm_error(out, FsmSubcode::UnexpectedMessageInEstablished),
            },
            // No connection in these states: whatever arrives is stale data from the driver.
            State::Idle | State::Connect | State::Active => {}
        }
    }

    fn establish(&mut self, now: Duration, out: &mut Vec<Action>) {
        let Some(neg) = self.negotiated.clone() else {
            return;
        };
        self.state = State::Established;
        self.established_at = Some(now);
        self.backoff = self.config.connect_retry;
        self.restarting = false;
        self.restart_hold(out);
        out.push(Action::SessionUp(neg.clone()));
        if !self.stale.is_empty() {
            // RFC 4724 §4.2: families the restarted peer no longer preserves go now; the rest
            // wait for End-of-RIB, bounded by the stale-routes time.
            let preserved: Vec<Family> = neg
                .graceful_restart
                .as_ref()
                .map(|g| {
                    g.families
                        .iter()
                        .filter(|f| f.forwarding_preserved)
                        .map(|f| f.family)
                        .collect()
                })
                .unwrap_or_default();
            let (keep, purge): (Vec<Family>, Vec<Family>) =
                self.stale.iter().partition(|f| preserved.contains(f));
            if !purge.is_empty() {
                out.push(Action::PurgeStale(purge));
            }
            self.stale = keep;
            if self.stale.is_empty() {
                out.push(Action::CancelTimer(TimerKind::GracefulRestart));
            } else {
                let t = self
                    .config
                    .graceful_restart
                    .as_ref()
                    .map(|g| g.stale_routes_time)
                    .unwrap_or_default();
                out.push(Action::SetTimer(TimerKind::GracefulRestart, t));
            }
        }
    }

    fn invalid(&mut self, err: DecodeError, out: &mut Vec<Action>) {
        if !matches!(
            self.state,
            State::OpenSent | State::OpenConfirm | State::Established
        ) {
            return;
        }
        match err.action {
            ErrorAction::TreatAsWithdraw(prefixes) if self.state == State::Established => {
                self.restart_hold(out);
                out.push(Action::RoutesWithdrawn(prefixes));
            }
            _ => {
                let n = err.notification;
                self.fail(out, DownReason::NotificationSent(n.clone()), Some(n));
            }
        }
    }

    /// Validates the peer's OPEN (RFC 4271 §6.2) and computes the negotiated parameters.
    fn negotiate(&self, open: &Open) -> Result<Negotiated, Notification> {
        if open.hold_time == 1 || open.hold_time == 2 {
            return Err(Notification::bare(ErrorCode::Open(
                OpenSubcode::UnacceptableHoldTime,
            )));
        }
        let peer_as = open.asn();
        if peer_as != self.config.remote_as {
            return Err(Notification::new(
                ErrorCode::Open(OpenSubcode::BadPeerAs),
                open.my_as.to_be_bytes().to_vec(),
            ));
        }
        let ibgp = peer_as == self.config.local_as;
        if open.bgp_id.is_unspecified() || (ibgp && open.bgp_id == self.config.router_id) {
            return Err(Notification::new(
                ErrorCode::Open(OpenSubcode::BadBgpIdentifier),
                open.bgp_id.octets().to_vec(),
            ));
        }
        let hold_time = self.config.hold_time.min(open.hold_time);
        let mut peer_families = open.multiprotocol();
        if peer_families.is_empty() {
            peer_families.push(Family::IPV4_UNICAST);
        }
        let families = self
            .config
            .families
            .iter()
            .copied()
            .filter(|f| peer_families.contains(f))
            .collect();
        let graceful_restart = if self.config.graceful_restart.is_some() {
            open.graceful_restart().cloned()
        } else {
            None
        };
        Ok(Negotiated {
            peer_as,
            peer_id: open.bgp_id,
            ibgp,
            hold_time,
            keepalive: hold_time / 3,
            four_octet_as: open.four_octet_as().is_some(),
            families,
            route_refresh: self.config.route_refresh && open.route_refresh(),
            graceful_restart,
        })
    }
}
