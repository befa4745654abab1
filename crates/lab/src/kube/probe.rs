//! Probing from a Kubernetes pod with no process of ours in it: a thread of the test enters
//! the pod's network namespace (its sandbox's, found through the CRI: `crictl inspectp`
//! gives the pause process) and asks a server for its hostname: an agnhost `netexec` over
//! HTTP, UDP or SCTP, exactly as netexec's own `/dial` does, or a server that writes its
//! name to every TCP connection or datagram (the echo Deployment's `nc -e hostname` and
//! `probe serve-udp`). The packets leave through the pod's
//! interface with the pod's address, so kube-proxy and NetworkPolicy see what they see from
//! a container. A round of hundreds of probes costs threads: a `kubectl exec` or a `wget` per
//! probe forked over a thousand processes a round, starved a two-core machine and made the
//! probes of other tests miss their timeouts.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::KubeState;
use crate::netns::in_netns_file;
use crate::process;
use crate::{LabError, Result};

/// How a probe asks (netexec's `/dial` protocols).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dial {
    /// `GET /hostname` over TCP.
    Http,
    /// A TCP connection; the server writes its name and closes.
    Tcp,
    /// A `hostname` datagram, sent again every second until an answer or the timeout.
    Udp,
    /// A `hostname` message on an SCTP association.
    Sctp,
}

/// The largest answer read (a hostname, or an HTTP response carrying one).
const MAX_ANSWER: u64 = 4096;

/// The network namespace of pod `namespace/pod`, from the node whose runtime runs its ready
/// sandbox. The file keeps the namespace open while the pod lives.
pub fn pod_netns(k: &KubeState, namespace: &str, pod: &str) -> Result<File> {
    let crictl: PathBuf = k.k8s_bin.join("crictl");
    for n in &k.nodes {
        let endpoint = format!("unix://{}", n.containerd_socket.display());
        let crictl_cmd = |args: &[&str]| {
            let mut c = Command::new(&crictl);
            c.args(["--runtime-endpoint", &endpoint, "--timeout", "20s"])
                .args(args);
            c
        };
        let ids = process::run(&mut crictl_cmd(&[
            "pods",
            "--namespace",
            namespace,
            "--name",
            pod,
            "--state",
            "ready",
            "-q",
        ]))?;
        // `--name` matches a substring: the exact one is checked below.
        for id in ids.split_whitespace() {
            let info = process::run(&mut crictl_cmd(&["inspectp", id]))?;
            let v: serde_json::Value = serde_json::from_str(&info)
                .map_err(|e| LabError::Invalid(format!("crictl inspectp {id}: {e}")))?;
            if v["status"]["metadata"]["name"] != pod
                || v["status"]["metadata"]["namespace"] != namespace
            {
                continue;
            }
            let pid = v["info"]["pid"]
                .as_u64()
                .ok_or_else(|| LabError::Invalid(format!("crictl inspectp {id}: no info.pid")))?;
            let path = format!("/proc/{pid}/ns/net");
            return File::open(&path).map_err(|e| LabError::io(format!("cannot open {path}"), e));
        }
    }
    Err(LabError::Invalid(format!(
        "no ready sandbox of pod {namespace}/{pod} on any node"
    )))
}

/// Asks the netexec server at `target` for its hostname, within `timeout` in all: the
/// answer, or why there is none.
pub fn hostname(
    dial: Dial,
    target: SocketAddr,
    timeout: Duration,
) -> std::result::Result<String, String> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    match dial {
        Dial::Udp => {
            let any: SocketAddr = if target.is_ipv4() {
                "0.0.0.0:0".parse().unwrap()
            } else {
                "[::]:0".parse().unwrap()
            };
            let s = UdpSocket::bind(any).map_err(|e| format!("bind: {e}"))?;
            s.connect(target).map_err(|e| format!("connect: {e}"))?;
            let mut buf = [0u8; MAX_ANSWER as usize];
            loop {
                s.send(b"hostname").map_err(|e| format!("send: {e}"))?;
                s.set_read_timeout(Some(left().min(Duration::from_secs(1))))
                    .map_err(|e| e.to_string())?;
                match s.recv(&mut buf) {
                    Ok(n) => return answer(&buf[..n]),
                    Err(e) if Instant::now() >= deadline => return Err(format!("no answer: {e}")),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(format!("no answer: {e}")),
                }
            }
        }
        Dial::Http | Dial::Tcp | Dial::Sctp => {
            let mut s = if dial == Dial::Sctp {
                crate::netpol::sctp_connect(target, timeout)
            } else {
                TcpStream::connect_timeout(&target, timeout)
            }
            .map_err(|e| format!("connect: {e}"))?;
            s.set_write_timeout(Some(left()))
                .map_err(|e| e.to_string())?;
            let request: &[u8] = match dial {
                Dial::Http => b"GET /hostname HTTP/1.0\r\nHost: probe\r\n\r\n",
                Dial::Tcp => b"",
                _ => b"hostname",
            };
            s.write_all(request).map_err(|e| format!("send: {e}"))?;
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            loop {
                s.set_read_timeout(Some(left()))
                    .map_err(|e| e.to_string())?;
                match s.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                    Err(e) => return Err(format!("no answer: {e}")),
                }
                if got.len() as u64 > MAX_ANSWER {
                    return Err(format!("an answer over {MAX_ANSWER} bytes"));
                }
                // SCTP: netexec answers one message and keeps the association.
                if dial == Dial::Sctp {
                    break;
                }
            }
            match dial {
                Dial::Http => http_body(&got),
                _ => answer(&got),
            }
        }
    }
}

fn answer(b: &[u8]) -> std::result::Result<String, String> {
    let s = String::from_utf8_lossy(b).trim().to_string();
    if s.is_empty() {
        Err("an empty answer".into())
    } else {
        Ok(s)
    }
}

/// The body of a `200` HTTP response.
fn http_body(resp: &[u8]) -> std::result::Result<String, String> {
    let text = String::from_utf8_lossy(resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "an HTTP response without a header end".to_string())?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("HTTP status {status:?}"));
    }
    answer(body.as_bytes())
}

/// Runs every probe of `reqs` from the network namespace `netns`, all at once (a thread
/// each), each given `timeout`: the hostname that answered each (`None`: no answer).
pub fn from_pod(
    netns: &File,
    what: &str,
    reqs: &[(Dial, SocketAddr)],
    timeout: Duration,
) -> Result<Vec<Option<String>>> {
    in_netns_file(netns, what, || {
        std::thread::scope(|s| {
            let hs: Vec<_> = reqs
                .iter()
                .map(|&(dial, target)| s.spawn(move || hostname(dial, target, timeout).ok()))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(None))
                .collect::<Vec<_>>()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn http_body_needs_a_200_and_a_body() {
        assert_eq!(
            http_body(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nx-a"),
            Ok("x-a".to_string())
        );
        assert!(http_body(b"HTTP/1.1 404 Not Found\r\n\r\nno").is_err());
        assert!(http_body(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(http_body(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }

    #[test]
    fn asks_a_server_on_loopback_and_times_out_on_silence() {
        // A loopback server answering one connection with `reply` (after reading the request
        // when `read_first`).
        let serve_once = |read_first: bool, reply: &'static [u8]| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                if let Some(Ok(mut c)) = l.incoming().next() {
                    if read_first {
                        let _ = c.read(&mut [0u8; 256]);
                    }
                    let _ = c.write_all(reply);
                }
            });
            addr
        };
        let addr = serve_once(true, b"HTTP/1.0 200 OK\r\n\r\nserver-1");
        assert_eq!(
            hostname(Dial::Http, addr, Duration::from_secs(5)),
            Ok("server-1".to_string())
        );
        let raw_addr = serve_once(false, b"web-1\n");
        assert_eq!(
            hostname(Dial::Tcp, raw_addr, Duration::from_secs(5)),
            Ok("web-1".to_string())
        );
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let uaddr = u.local_addr().unwrap();
        let e = hostname(Dial::Udp, uaddr, Duration::from_millis(200)).unwrap_err();
        assert!(e.starts_with("no answer"), "{e}");
        let mut b = [0u8; 64];
        let (n, _) = u.recv_from(&mut b).unwrap();
        assert_eq!(&b[..n], b"hostname");
    }
}
