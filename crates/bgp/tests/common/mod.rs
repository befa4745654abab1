//! Shared helpers: private network namespaces, event waits and a raw BGP peer.
#![allow(dead_code)]

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use tern_bgp::codec::{self, Framer, Message, Notification};
use tern_bgp::driver::{RouteEvent, SpeakerHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;

/// Runs `f` on a current-thread runtime in a thread that moved into a fresh, anonymous
/// network namespace (gone when the thread ends), with `lo` up. The root namespace is never
/// touched: sockets and child processes of this thread live in the new namespace.
pub fn in_netns<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    // A private network namespace needs root, or the test fails (tern-testkit).
    tern_testkit::need_root();
    // Named after the test, so tern-testkit's messages from inside name it.
    let h = tern_testkit::thread_for_test().spawn(move || {
        // SAFETY: plain syscall; affects only this thread's network namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        sh("ip link set lo up");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f());
    });
    let h = h.expect("spawning the test's namespace thread");
    if let Err(e) = h.join() {
        std::panic::resume_unwind(e);
    }
}

/// Runs a shell command (in the calling thread's namespace), panicking on failure.
pub fn sh(cmd: &str) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The next route event, failing after `secs`.
pub async fn next_event(rx: &mut UnboundedReceiver<RouteEvent>, secs: u64) -> RouteEvent {
    tokio::time::timeout(Duration::from_secs(secs), rx.recv())
        .await
        .expect("timed out waiting for a route event")
        .expect("event channel closed")
}

/// Waits for a specific event, skipping others; returns the skipped ones.
pub async fn wait_event(
    rx: &mut UnboundedReceiver<RouteEvent>,
    want: &RouteEvent,
    secs: u64,
) -> Vec<RouteEvent> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut skipped = Vec::new();
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {want:?}; saw {skipped:?}"))
            .expect("event channel closed");
        if &ev == want {
            return skipped;
        }
        skipped.push(ev);
    }
}

/// Polls the speaker's status until `pred` holds.
pub async fn wait_status(
    h: &SpeakerHandle,
    secs: u64,
    what: &str,
    pred: impl Fn(&[tern_bgp::driver::PeerStatus]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let st = h.status().await.unwrap();
        if pred(&st) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}: {st:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A hand-driven BGP peer over a raw TCP connection.
pub struct RawPeer {
    pub stream: TcpStream,
    framer: Framer,
}

impl RawPeer {
    /// Connects from `src` to `dst`.
    pub async fn connect(src: IpAddr, dst: SocketAddr) -> RawPeer {
        let s = TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::new(src, 0)).unwrap();
        let stream = s.connect(dst).await.unwrap();
        RawPeer {
            stream,
            framer: Framer::new(),
        }
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    pub async fn send(&mut self, m: &Message) {
        let b = codec::encode(m);
        self.send_raw(&b).await;
    }

    /// The next message, or `None` when the connection closed; fails after `secs`.
    pub async fn recv(&mut self, secs: u64) -> Option<Message> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut buf = [0u8; 4096];
        loop {
            if let Some(f) = self.framer.next_frame().unwrap() {
                return Some(codec::decode(&f).unwrap());
            }
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut buf))
                .await
                .expect("timed out waiting for a message")
                .unwrap_or(0);
            if n == 0 {
                return None;
            }
            self.framer.push(&buf[..n]);
        }
    }

    /// The last NOTIFICATION received before the peer closed the connection (each message
    /// within `secs`); panics when none came.
    pub async fn last_notification(&mut self, secs: u64) -> Notification {
        let mut n = None;
        while let Some(m) = self.recv(secs).await {
            if let Message::Notification(x) = m {
                n = Some(x);
            }
        }
        n.expect("a NOTIFICATION")
    }
}
