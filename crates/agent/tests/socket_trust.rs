//! The agent socket as a trust boundary, against a real `ternd` in a private network namespace:
//! its mode whatever the umask, the peer-credential check (an unprivileged uid is refused even
//! when the socket's mode is forced open; a member of `--socket-group` is served), descriptors
//! checked and closed (10,000 requests with two fds leave the agent's fd count flat and an ADD
//! still succeeds), the frame limit and the connection cap.
//!
//! Every namespace has a unique name and is deleted by a drop guard; every ternd is killed by
//! PID. The root network namespace is never touched.

mod common;

use common::sendmsg_fds;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, Reply, Request, Response};
use tern_testkit::netns::Netns;

/// ternd in a namespace of its own, started under `umask 000`.
struct Node(tern_testkit::ternd::Node);

impl std::ops::Deref for Node {
    type Target = tern_testkit::ternd::Node;
    fn deref(&self) -> &tern_testkit::ternd::Node {
        &self.0
    }
}

impl Node {
    fn start(extra: &[&str]) -> Node {
        let mut args = vec![
            "--no-dataplane",
            "--metrics-addr=0",
            "--health-addr=0",
            "--mtu=1500",
            "--default-ipv4-pool=10.99.0.0/24",
            "--log-level=info",
        ];
        args.extend_from_slice(extra);
        let mut n = tern_testkit::ternd::Node::new(&args);
        // Traversable by anyone: the socket's own mode must be what keeps others out.
        std::fs::set_permissions(n.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        n.ternd.umask = Some(0);
        n.ternd.start();
        Node(n)
    }

    /// A STATUS request over the socket (as root).
    fn status(&self) -> Response {
        tern_api::call(
            &self.ternd.socket(),
            &Request::Status,
            None,
            Duration::from_secs(10),
        )
        .unwrap()
    }
}

/// What an unprivileged child saw: connect's errno (0 = connected) and the reply it read.
#[derive(Debug)]
struct ChildView {
    connect_errno: i32,
    reply: Vec<u8>,
}

/// Forks a child that drops to `uid`/`gid` (supplementary groups `groups`), connects to `sock`
/// and, when connected, sends a STATUS request and reads the reply. Everything the child uses
/// is allocated before the fork: it makes only system calls.
fn as_user(sock: &Path, uid: u32, gid: u32, groups: &[u32]) -> ChildView {
    let body = br#"{"op":"status"}"#;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = sock.as_os_str().as_encoded_bytes();
    assert!(p.len() < addr.sun_path.len());
    for (i, b) in p.iter().enumerate() {
        addr.sun_path[i] = *b as libc::c_char;
    }
    let mut pipe = [0; 2];
    // SAFETY: pipe writes two fds into the array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let mut buf = vec![0u8; 8192];
    let groups = groups.to_vec();
    // SAFETY: the child performs only async-signal-safe system calls on memory prepared above
    // and ends with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: in the forked child, as said above the fork: async-signal-safe calls on memory
        // prepared before it, ending with _exit.
        unsafe {
            libc::close(pipe[0]);
            let ok = libc::setgroups(groups.len(), groups.as_ptr()) == 0
                && libc::setgid(gid) == 0
                && libc::setuid(uid) == 0;
            if !ok {
                libc::_exit(3);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let rc = libc::connect(
                s,
                &addr as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            let errno: i32 = if rc == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            let mut n: isize = 0;
            if rc == 0 {
                libc::write(s, frame.as_ptr() as *const _, frame.len());
                let mut got = 0usize;
                loop {
                    let r = libc::read(s, buf.as_mut_ptr().add(got) as *mut _, buf.len() - got);
                    if r <= 0 {
                        break;
                    }
                    got += r as usize;
                }
                n = got as isize;
            }
            libc::write(pipe[1], &errno as *const i32 as *const _, 4);
            libc::write(pipe[1], buf.as_ptr() as *const _, n as usize);
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(pipe[1]) };
    // SAFETY: pipe[0] is ours.
    let mut r = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(pipe[0]) };
    let mut out = Vec::new();
    r.read_to_end(&mut out).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed to drop privileges: status {status}"
    );
    assert!(out.len() >= 4, "child reported nothing");
    let connect_errno = i32::from_ne_bytes(out[..4].try_into().unwrap());
    let reply = if out.len() > 8 {
        out[8..].to_vec()
    } else {
        Vec::new()
    };
    ChildView {
        connect_errno,
        reply,
    }
}

fn reply_of(v: &ChildView) -> Response {
    serde_json::from_slice(&v.reply)
        .unwrap_or_else(|e| panic!("reply {:?}: {e}", String::from_utf8_lossy(&v.reply)))
}

#[test]
fn socket_is_0660_root_under_umask_000_and_strangers_are_refused() {
    tern_testkit::need_root();
    let n = Node::start(&[]);
    let meta = std::fs::metadata(n.ternd.socket()).unwrap();
    assert_eq!(
        meta.mode() & 0o777,
        0o660,
        "socket mode {:o}",
        meta.mode() & 0o777
    );
    assert_eq!((meta.uid(), meta.gid()), (0, 0));

    // nobody cannot even connect.
    let v = as_user(&n.ternd.socket(), 65534, 65534, &[]);
    assert_eq!(v.connect_errno, libc::EACCES, "{v:?}");

    // Forced open, the peer-credential check still refuses nobody, with a clear reply.
    std::fs::set_permissions(n.ternd.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let v = as_user(&n.ternd.socket(), 65534, 65534, &[]);
    assert_eq!(v.connect_errno, 0);
    match reply_of(&v) {
        Err(e) => {
            assert_eq!(e.code, tern_agent::server::CODE_NOT_PERMITTED);
            assert!(
                e.msg.contains("permission denied") && e.msg.contains("uid 65534"),
                "{}",
                e.msg
            );
        }
        Ok(r) => panic!("nobody was served: {r:?}"),
    }
    let end = Instant::now() + Duration::from_secs(5);
    while !n.ternd.log().contains("refused a caller") {
        assert!(Instant::now() < end, "no log line: {}", n.ternd.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // And root still is served.
    let r = n.status();
    assert!(matches!(r, Ok(Reply::Status(_))), "{r:?}");
}

#[test]
fn members_of_the_socket_group_are_served() {
    tern_testkit::need_root();
    let n = Node::start(&["--socket-group", "4242"]);
    let meta = std::fs::metadata(n.ternd.socket()).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.gid()), (0o660, 4242));
    // Primary group.
    let v = as_user(&n.ternd.socket(), 65534, 4242, &[]);
    assert_eq!(v.connect_errno, 0);
    assert!(matches!(reply_of(&v), Ok(Reply::Status(_))), "{v:?}");
    // Supplementary group (SO_PEERGROUPS).
    let v = as_user(&n.ternd.socket(), 65534, 65534, &[4242]);
    assert_eq!(v.connect_errno, 0);
    assert!(matches!(reply_of(&v), Ok(Reply::Status(_))), "{v:?}");
    // Not a member.
    let v = as_user(&n.ternd.socket(), 65534, 65534, &[]);
    assert_eq!(v.connect_errno, libc::EACCES, "{v:?}");
}

fn add_request(cid: &str) -> Request {
    Request::Add(AddRequest::new(common::attachment(
        cid,
        "/proc/self/ns/net",
    )))
}

/// Sends `req` with `fds` attached over a fresh connection and reads the reply.
fn send_with_fds(sock: &Path, req: &Request, fds: &[i32]) -> Response {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tern_api::write_frame_fds(&s, &serde_json::to_vec(req).unwrap(), fds).unwrap();
    let (body, _) = tern_api::read_frame(&s).unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn code_of(r: &Response) -> u32 {
    match r {
        Err(e) => e.code,
        Ok(x) => panic!("expected an error, got {x:?}"),
    }
}

#[test]
fn received_descriptors_are_checked_and_extra_ones_never_leak() {
    tern_testkit::need_root();
    let n = Node::start(&[]);
    let pod = Netns::new("p");
    let pod_ns = File::open(pod.path()).unwrap();
    let other = File::open("/proc/self/status").unwrap();

    // Not a namespace, a namespace of another kind, the node's own: code 4 naming CNI_NETNS.
    let uts = File::open("/proc/self/ns/uts").unwrap();
    let node_ns = File::open(n.ns.path()).unwrap();
    for (what, fd) in [
        ("a regular file", other.as_raw_fd()),
        ("a UTS namespace", uts.as_raw_fd()),
        ("the node's own netns", node_ns.as_raw_fd()),
    ] {
        let r = send_with_fds(&n.ternd.socket(), &add_request("c-bad"), &[fd]);
        assert_eq!(code_of(&r), 4, "{what}: {r:?}");
        let msg = r.unwrap_err().msg;
        assert!(msg.contains("CNI_NETNS"), "{what}: {msg}");
    }
    assert!(
        !n.ns.links().contains("eth0") && !n.ns.links().contains("tern"),
        "something was wired into the node: {}",
        n.ns.links()
    );
    // A request that takes no descriptor must not carry one.
    let del = Request::IpamDel(Attachment {
        network: "n".into(),
        container_id: "c".into(),
        ifname: "eth0".into(),
        ..Default::default()
    });
    assert_eq!(
        code_of(&send_with_fds(
            &n.ternd.socket(),
            &del,
            &[pod_ns.as_raw_fd()]
        )),
        4
    );

    // 10,000 requests with two descriptors each: all refused, none kept.
    let before = n.ternd.fd_count();
    let t0 = Instant::now();
    for i in 0..10_000 {
        let r = send_with_fds(
            &n.ternd.socket(),
            &add_request("c-two"),
            &[pod_ns.as_raw_fd(), other.as_raw_fd()],
        );
        if i % 1000 == 0 {
            let e = r.as_ref().unwrap_err();
            assert_eq!(e.code, 4, "{e:?}");
            assert!(e.msg.contains("2 file descriptors"), "{}", e.msg);
        }
    }
    let after = n.ternd.fd_count();
    eprintln!(
        "10,000 two-fd requests in {:?}; ternd fds {before} -> {after}",
        t0.elapsed()
    );
    assert!(
        after <= before + 4,
        "ternd's descriptors grew from {before} to {after}"
    );
    // The agent still serves an ADD into a real pod namespace.
    let r = send_with_fds(
        &n.ternd.socket(),
        &add_request("c-ok"),
        &[pod_ns.as_raw_fd()],
    );
    assert!(
        matches!(r, Ok(Reply::Result(_))),
        "{r:?}\n{}",
        n.ternd.log()
    );
    assert!(pod.links().contains("eth0"), "{}", pod.links());
}

#[test]
fn oversized_frames_slow_clients_and_the_connection_cap() {
    tern_testkit::need_root();
    let n = Node::start(&["--max-connections", "4"]);
    // A 16 MiB frame is refused after its length prefix, naming the limit.
    let s = UnixStream::connect(n.ternd.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (&s).write_all(&(16u32 << 20).to_be_bytes()).unwrap();
    let (body, _) = tern_api::read_frame(&s).unwrap();
    let r: Response = serde_json::from_slice(&body).unwrap();
    let e = r.unwrap_err();
    assert_eq!(e.code, 7);
    assert!(
        e.msg.contains("over the limit of 1048576 bytes"),
        "{}",
        e.msg
    );

    // The refused connection's slot is released once the agent has answered and the client
    // has gone: wait for every slot to be free before taking them all (under load the agent's
    // handler thread may still hold it for a moment).
    drop(s);
    let free = Instant::now();
    while n.status().is_err() {
        assert!(free.elapsed() < Duration::from_secs(5), "slots never freed");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Four idle clients take every slot (each announced 100 bytes and sends none); a fifth is
    // answered "busy" at once (code 11).
    // A status answered does not mean its handler has given its slot back yet: an idle client
    // that arrives first is answered "busy" and closed, so such a client is replaced until
    // four are held.
    let connected = Instant::now();
    let idle_client = || {
        let s = UnixStream::connect(n.ternd.socket()).unwrap();
        // A client answered "busy" may find the connection closed before it writes (EPIPE):
        // it is replaced below like any refused one.
        let _ = (&s).write_all(&100u32.to_be_bytes());
        s
    };
    let mut idle: Vec<UnixStream> = (0..4).map(|_| idle_client()).collect();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let mut refused = 0;
        for c in idle.iter_mut() {
            c.set_nonblocking(true).unwrap();
            let mut b = [0u8; 4096];
            let answered = (&*c).read(&mut b).is_ok();
            c.set_nonblocking(false).unwrap();
            if answered {
                refused += 1;
                *c = idle_client();
            }
        }
        if refused == 0 {
            break;
        }
        assert!(
            connected.elapsed() < Duration::from_secs(5),
            "idle clients still refused after 5 s"
        );
    }
    // (Under load the agent may take a moment to accept all four.)
    let waited = Instant::now();
    let r = loop {
        let t0 = Instant::now();
        let r = n.status();
        if r.is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "busy took {:?}",
                t0.elapsed()
            );
            break r;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "never busy with 4 idle clients: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code_of(&r), 11, "{r:?}");
    assert!(r.unwrap_err().msg.contains("limit 4"));

    // Now they send a byte a second: each read is quick, the request never completes. The
    // agent drops them at its whole-request deadline (10 s), with an answer saying so.
    let readers: Vec<_> = idle
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || -> (Duration, Vec<u8>) {
                s.set_nonblocking(true).unwrap();
                let mut out = Vec::new();
                for _ in 0..30 {
                    let _ = (&s).write(b" ");
                    std::thread::sleep(Duration::from_secs(1));
                    let mut b = [0u8; 4096];
                    match (&s).read(&mut b) {
                        Ok(0) => break,
                        Ok(n) => {
                            out.extend_from_slice(&b[..n]);
                            break;
                        }
                        Err(_) => {}
                    }
                }
                (connected.elapsed(), out)
            })
        })
        .collect();
    for r in readers {
        let (held, out) = r.join().unwrap();
        assert!(
            held < Duration::from_secs(13),
            "a slow client was held {held:?}"
        );
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("did not arrive within 10000 ms"), "{text}");
    }
    // Slots are back.
    let r = n.status();
    assert!(matches!(r, Ok(Reply::Status(_))), "{r:?}");
}

/// The review's F4 attack: 16 connections each announce a 1 MiB frame and send it one byte
/// per `sendmsg`, each byte with 8 descriptors. ternd refuses each at the second descriptor
/// (code 4) and its descriptor count stays flat (it used to hold 8 per byte received).
#[test]
fn descriptors_sent_one_byte_at_a_time_do_not_pile_up() {
    tern_testkit::need_root();
    let n = Node::start(&[]);
    let f = File::open("/proc/self/status").unwrap();
    let eight = [f.as_raw_fd(); 8];
    let before = n.ternd.fd_count();
    let mut conns = Vec::new();
    let mut peak = before;
    for _ in 0..16 {
        let s = UnixStream::connect(n.ternd.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (&s).write_all(&(1u32 << 20).to_be_bytes()).unwrap();
        for _ in 0..100 {
            if sendmsg_fds(&s, b" ", &eight).is_err() {
                break; // ternd stopped reading and closed: the intended outcome
            }
        }
        peak = peak.max(n.ternd.fd_count());
        conns.push(s);
    }
    for s in &conns {
        let (body, _) = tern_api::read_frame(s).unwrap();
        let r: Response = serde_json::from_slice(&body).unwrap();
        let e = r.unwrap_err();
        assert_eq!(e.code, 4, "{e:?}");
        assert!(e.msg.contains("file descriptors"), "{}", e.msg);
    }
    drop(conns);
    std::thread::sleep(Duration::from_millis(200));
    let after = n.ternd.fd_count();
    eprintln!("ternd fds: before {before}, peak {peak}, after {after}");
    assert!(
        peak <= before + 16 + 8,
        "ternd's descriptors peaked at {peak} (from {before})"
    );
    assert!(
        after <= before + 4,
        "ternd's descriptors grew from {before} to {after}"
    );
    // Still serving.
    let pod = Netns::new("p");
    let pod_ns = File::open(pod.path()).unwrap();
    let r = send_with_fds(
        &n.ternd.socket(),
        &add_request("c-after"),
        &[pod_ns.as_raw_fd()],
    );
    assert!(
        matches!(r, Ok(Reply::Result(_))),
        "{r:?}\n{}",
        n.ternd.log()
    );
}
