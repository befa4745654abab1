//! A command run in a pod's container through the API server (`pods/exec`), as `kubectl exec`
//! does: how `ternctl flows` asks every node's agent on a Kubernetes cluster without any port of
//! the agent's on the network. Who may do it is the API server's RBAC (`create` on
//! `pods/exec` in the agents' namespace), the access ternctl needs there anyway.
//!
//! The API server speaks the Kubernetes channel protocol over WebSocket
//! (`v5.channel.k8s.io`, else `v4.channel.k8s.io`): each binary message's first byte is the
//! stream (1 stdout, 2 stderr, 3 the final status as a JSON `Status`). We send no input, so
//! the client side is the upgrade request, pongs and a close: a WebSocket crate
//! (tungstenite) would bring a second HTTP stack beside [`crate::http`] for that, which this
//! store's synchronous client already is. Bounds: every message and the whole output are
//! limited ([`MAX_MESSAGE`], the caller's `limit`), and the whole exchange ends at the
//! caller's deadline.

use std::fmt::Write as _;
use std::io::{self, BufRead, Read, Write};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{KubeStore, Result, StoreError};
use crate::http;

/// The largest WebSocket message accepted.
pub const MAX_MESSAGE: u64 = 4 << 20;

/// What a command run in a container printed, and how it ended.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The exit code (0 when the API server reported success).
    pub exit_code: i32,
    /// The API server's message when the command failed (`command terminated with non-zero
    /// exit code`, or why it could not run).
    pub message: Option<String>,
}

fn err(msg: impl Into<String>) -> StoreError {
    StoreError::Backend(msg.into())
}

/// `application/x-www-form-urlencoded`-style escaping of a query value.
fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// 16 random bytes, base64: a WebSocket key (and mask bytes from the same source).
fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

/// A client frame (masked, as RFC 6455 requires of a client).
fn frame(opcode: u8, payload: &[u8]) -> io::Result<Vec<u8>> {
    let mask: [u8; 4] = random_bytes()?;
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xffff => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    Ok(f)
}

/// One server frame: (fin, opcode, payload).
fn read_frame(r: &mut impl Read) -> io::Result<(bool, u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    r.read_exact(&mut h)?;
    let (fin, opcode, masked) = (h[0] & 0x80 != 0, h[0] & 0x0f, h[1] & 0x80 != 0);
    let len = match h[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b)?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a WebSocket frame of {len} bytes (at most {MAX_MESSAGE})"),
        ));
    }
    let mut mask = [0u8; 4];
    if masked {
        r.read_exact(&mut mask)?;
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((fin, opcode, payload))
}

/// The exit code of a final `Status` (`details.causes[{reason: ExitCode, message: "3"}]`).
fn exit_code(status: &Value) -> i32 {
    if status["status"] == "Success" {
        return 0;
    }
    status["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["reason"] == "ExitCode")
        .and_then(|c| c["message"].as_str()?.parse().ok())
        .unwrap_or(-1)
}

/// A pod of the agents' DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// Whether its phase is Running.
    pub running: bool,
}

impl KubeStore {
    /// The pods in `namespace` matching `label_selector` (`app.kubernetes.io/name=tern`),
    /// with their nodes, sorted by node.
    pub fn pods_by_label(&self, namespace: &str, label_selector: &str) -> Result<Vec<AgentPod>> {
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            escape(namespace),
            escape(label_selector)
        );
        let a = self.call(
            "GET",
            &path,
            None,
            "application/json",
            super::Idempotent::Yes,
        )?;
        if a.status != 200 {
            return Err(err(format!(
                "listing pods {label_selector} in {namespace}: {} {}",
                a.status, a.body["message"]
            )));
        }
        let mut pods: Vec<AgentPod> = a.body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| AgentPod {
                name: p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                node: p["spec"]["nodeName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                running: p["status"]["phase"] == "Running",
            })
            .collect();
        pods.sort_by(|a, b| (&a.node, &a.name).cmp(&(&b.node, &b.name)));
        Ok(pods)
    }

    /// Runs `argv` in `container` of pod `namespace/pod` and returns its output, at most
    /// `limit` bytes of stdout and of stderr, within `timeout`.
    pub fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        argv: &[&str],
        limit: usize,
        timeout: Duration,
    ) -> Result<ExecOutput> {
        let what = format!("exec in pod {namespace}/{pod}");
        let deadline = Instant::now() + timeout;
        let cfg = &self.inner.cfg;
        let mut path = format!(
            "{}/api/v1/namespaces/{}/pods/{}/exec?container={}&stdout=true&stderr=true",
            cfg.base,
            escape(namespace),
            escape(pod),
            escape(container)
        );
        for a in argv {
            let _ = write!(path, "&command={}", escape(a));
        }
        let key = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            random_bytes::<16>().map_err(|e| err(format!("{what}: {e}")))?,
        );
        let mut head = format!(
            "GET {path} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: tern-store\r\nConnection: Upgrade\r\n\
             Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\
             Sec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n",
            cfg.host, cfg.port
        );
        if let Some(t) = cfg.token()? {
            let _ = write!(head, "Authorization: Bearer {t}\r\n");
        }
        head.push_str("\r\n");
        let io_err = |e: io::Error| err(format!("{what}: {e}"));
        let mut conn = http::connect(
            &cfg.host,
            cfg.port,
            Some(&cfg.tls),
            self.inner.connect_timeout,
            timeout,
            0,
        )
        .map_err(io_err)?;
        conn.reader
            .get_mut()
            .write_all(head.as_bytes())
            .map_err(io_err)?;
        conn.reader.get_mut().flush().map_err(io_err)?;

        // The answer's head: 101 Switching Protocols, or an error with a Status body.
        let mut status_line = String::new();
        (&mut conn.reader)
            .take(http::MAX_HEAD as u64)
            .read_line(&mut status_line)
            .map_err(io_err)?;
        let mut headers = String::new();
        loop {
            let mut l = String::new();
            let n = (&mut conn.reader)
                .take(http::MAX_HEAD as u64)
                .read_line(&mut l)
                .map_err(io_err)?;
            if n == 0 || l == "\r\n" || headers.len() > http::MAX_HEAD {
                break;
            }
            headers.push_str(&l);
        }
        if !status_line.starts_with("HTTP/1.1 101") {
            let mut body = Vec::new();
            let _ = (&mut conn.reader).take(64 * 1024).read_to_end(&mut body);
            let msg = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            return Err(err(format!(
                "{what}: the API server answered {} {msg}",
                status_line.trim()
            )));
        }

        let mut out = ExecOutput::default();
        let mut message: Vec<u8> = Vec::new();
        loop {
            if Instant::now() > deadline {
                return Err(err(format!("{what}: no end within {timeout:?}")));
            }
            let (fin, opcode, payload) = match read_frame(&mut conn.reader) {
                Ok(f) => f,
                // The server may just close the connection after the status.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(io_err(e)),
            };
            match opcode {
                0..=2 => {
                    if message.len() + payload.len() > MAX_MESSAGE as usize {
                        return Err(err(format!("{what}: a message over {MAX_MESSAGE} bytes")));
                    }
                    message.extend_from_slice(&payload);
                    if !fin {
                        continue;
                    }
                    let m = std::mem::take(&mut message);
                    let Some((&channel, data)) = m.split_first() else {
                        continue;
                    };
                    match channel {
                        1 if out.stdout.len() + data.len() <= limit => {
                            out.stdout.extend_from_slice(data)
                        }
                        2 if out.stderr.len() + data.len() <= limit => {
                            out.stderr.extend_from_slice(data)
                        }
                        1 | 2 => {
                            return Err(err(format!(
                                "{what}: the command printed more than {limit} bytes"
                            )));
                        }
                        3 => {
                            let status: Value = serde_json::from_slice(data).unwrap_or_default();
                            out.exit_code = exit_code(&status);
                            if out.exit_code != 0 {
                                out.message = Some(
                                    status["message"].as_str().unwrap_or("failed").to_string(),
                                );
                            }
                        }
                        _ => {}
                    }
                }
                8 => {
                    let _ = conn
                        .reader
                        .get_mut()
                        .write_all(&frame(8, &[]).unwrap_or_default());
                    break;
                }
                9 => {
                    let pong = frame(10, &payload).map_err(io_err)?;
                    conn.reader.get_mut().write_all(&pong).map_err(io_err)?;
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_through_the_mask() {
        for len in [0usize, 5, 125, 126, 300, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let f = frame(2, &payload).unwrap();
            let (fin, op, back) = read_frame(&mut io::Cursor::new(f)).unwrap();
            assert!(fin);
            assert_eq!(op, 2);
            assert_eq!(back, payload, "length {len}");
        }
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut f = vec![0x82, 127];
        f.extend_from_slice(&(MAX_MESSAGE + 1).to_be_bytes());
        let e = read_frame(&mut io::Cursor::new(f)).unwrap_err();
        assert!(e.to_string().contains("WebSocket frame"), "{e}");
    }

    #[test]
    fn exit_codes_from_status() {
        assert_eq!(exit_code(&serde_json::json!({"status": "Success"})), 0);
        let failed = serde_json::json!({"status": "Failure", "message": "command terminated with non-zero exit code",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}});
        assert_eq!(exit_code(&failed), 3);
        assert_eq!(escape("a b/c"), "a%20b%2Fc");
    }
}
