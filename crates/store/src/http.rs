//! The HTTP/1.1 client side the datastore backends share (etcd's JSON gateway, the Kubernetes
//! API): one connection (TCP, or TLS with rustls), one request written whole, the answer's
//! head and body read with bounds, chunked transfer encoding, and streaming bodies for watches.
//!
//! Why our own and not a crate: the store is synchronous and linked into short-lived
//! processes (`ternctl`, the CNI path of `ternd`); what the backends need is a request line,
//! a few headers and a JSON body over a connection they pool and time out themselves. The
//! retry policy (which endpoint next, which answers leave a write's outcome open) belongs to
//! each backend, not here.
//!
//! Bounds: an answer's head (status line and headers) is at most [`MAX_HEAD`] bytes; a whole
//! body read by [`exchange`] at most the caller's limit; every read and write has the
//! socket timeouts the caller set.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The most an answer's status line and headers may take.
pub(crate) const MAX_HEAD: usize = 64 * 1024;

/// PEM material for a TLS client: the CA bundle that signed the server's certificate and,
/// when the server asks for one, the client's certificate chain and key.
pub(crate) struct TlsPem {
    pub(crate) ca: Vec<u8>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// A rustls client configuration from PEM material; errors name `what` (for the message) and
/// the part that failed.
pub(crate) fn tls_config(what: &str, pem: &TlsPem) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem.ca)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} CA: {e}"))?;
    if cas.is_empty() {
        return Err(format!("{what} CA: no certificate in it"));
    }
    for ca in cas {
        roots.add(ca).map_err(|e| format!("{what} CA: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("{what} TLS setup: {e}"))?
        .with_root_certificates(roots);
    Ok(Arc::new(match &pem.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{what} client certificate: {e}"))?;
            if chain.is_empty() {
                return Err(format!("{what} client certificate: no certificate in it"));
            }
            let pk = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| format!("{what} client key: {e}"))?;
            builder
                .with_client_auth_cert(chain, pk)
                .map_err(|e| format!("{what} client certificate/key: {e}"))?
        }
    }))
}

/// Reads a PEM file for [`TlsPem`], the error naming `what` and the path.
pub(crate) fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// A new connection to `host:port` (TLS when `tls` is given, checking the server's name
/// against `host`), connected and handshaken within `connect`, then with `io` as the timeout
/// of every read and write.
pub(crate) fn connect(
    host: &str,
    port: u16,
    tls: Option<&Arc<rustls::ClientConfig>>,
    connect: Duration,
    io_timeout: Duration,
    endpoint: usize,
) -> io::Result<Conn> {
    let addrs = (host, port).to_socket_addrs()?;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "host resolves to no address");
    let mut tcp = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, connect) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let tcp = tcp.ok_or(last)?;
    tcp.set_nodelay(true)?;
    // The TLS handshake happens on first use; bound it by the connect timeout.
    tcp.set_read_timeout(Some(connect))?;
    tcp.set_write_timeout(Some(connect))?;
    let stream = match tls {
        None => Stream::Plain(tcp),
        Some(cfg) => {
            let name = ServerName::try_from(host.to_string()).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name: {e}"))
            })?;
            let conn = rustls::ClientConnection::new(cfg.clone(), name)
                .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            while s.conn.is_handshaking() {
                s.conn
                    .complete_io(&mut s.sock)
                    .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
            }
            Stream::Tls(Box::new(s))
        }
    };
    stream.tcp().set_read_timeout(Some(io_timeout))?;
    stream.tcp().set_write_timeout(Some(io_timeout))?;
    Ok(Conn {
        reader: BufReader::new(stream),
        endpoint,
    })
}

/// True for the errors a socket timeout produces.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A failed exchange on one connection. `sent`: the whole request was written; `answered`: a
/// response byte arrived.
pub(crate) struct ExchangeError {
    pub(crate) sent: bool,
    pub(crate) answered: bool,
    pub(crate) error: io::Error,
}

/// Sends one request and reads the whole answer.
pub(crate) fn exchange(
    conn: &mut Conn,
    request: &[u8],
    max_body: usize,
) -> std::result::Result<Response, ExchangeError> {
    let not_sent = |error| ExchangeError {
        sent: false,
        answered: false,
        error,
    };
    let not_answered = |error| ExchangeError {
        sent: true,
        answered: false,
        error,
    };
    let answered = |error| ExchangeError {
        sent: true,
        answered: true,
        error,
    };
    let stream = conn.reader.get_mut();
    stream.write_all(request).map_err(not_sent)?;
    stream.flush().map_err(not_sent)?;
    if conn.reader.fill_buf().map_err(not_answered)?.is_empty() {
        return Err(not_answered(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before an answer",
        )));
    }
    let head = read_head(&mut conn.reader).map_err(answered)?;
    let mut body = Vec::new();
    let keep_alive = head.keep_alive && head.framed();
    let too_big = || {
        answered(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answer body over the limit of {max_body} bytes"),
        ))
    };
    match head.framing {
        Framing::Length(n) => {
            if n > max_body {
                return Err(too_big());
            }
            body.resize(n, 0);
            conn.reader.read_exact(&mut body).map_err(answered)?;
        }
        Framing::Chunked | Framing::UntilClose => {
            // One byte over the limit tells a body at the limit from one beyond it.
            let limit = max_body as u64 + 1;
            let r: &mut dyn Read = match head.framing {
                Framing::Chunked => &mut Body::chunked(&mut conn.reader).take(limit),
                _ => &mut (&mut conn.reader).take(limit),
            };
            r.read_to_end(&mut body).map_err(answered)?;
            if body.len() > max_body {
                return Err(too_big());
            }
        }
    }
    Ok(Response {
        status: head.status,
        keep_alive,
        body,
    })
}

pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) keep_alive: bool,
    pub(crate) body: Vec<u8>,
}

pub(crate) enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) keep_alive: bool,
    pub(crate) framing: Framing,
}

impl Head {
    pub(crate) fn framed(&self) -> bool {
        !matches!(self.framing, Framing::UntilClose)
    }

    /// The body of a streaming answer as a reader that owns the connection.
    pub(crate) fn body_reader(&self, reader: BufReader<Stream>) -> Body {
        Body::chunked(Box::new(reader)).with_framing(&self.framing)
    }
}

pub(crate) fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let mut line = String::new();
    let mut r = r.take(MAX_HEAD as u64);
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before an answer",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an HTTP status line: {line:?}"),
            )
        })?;
    let mut keep_alive = line.starts_with("HTTP/1.1");
    let mut framing = Framing::UntilClose;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                if r.limit() == 0 {
                    "HTTP answer head over 64 KiB"
                } else {
                    "connection closed inside the HTTP header"
                },
            ));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                let n = value.parse().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad Content-Length {value:?}"),
                    )
                })?;
                if !matches!(framing, Framing::Chunked) {
                    framing = Framing::Length(n);
                }
            }
            "transfer-encoding" if value.to_ascii_lowercase().contains("chunked") => {
                framing = Framing::Chunked;
            }
            "connection" if value.eq_ignore_ascii_case("close") => keep_alive = false,
            _ => {}
        }
    }
    Ok(Head {
        status,
        keep_alive,
        framing,
    })
}

/// A reader of an HTTP body: chunked transfer encoding, or (`length_framed`) a body of
/// `remaining` bytes (`usize::MAX` for "until the connection closes").
pub(crate) struct Body<R = Box<BufReader<Stream>>> {
    inner: R,
    /// Bytes left in the current chunk, or in the whole body when length-framed.
    remaining: usize,
    done: bool,
    length_framed: bool,
}

impl<R> Body<R> {
    pub(crate) fn chunked(inner: R) -> Body<R> {
        Body {
            inner,
            remaining: 0,
            done: false,
            length_framed: false,
        }
    }

    /// Adapts the reader to the answer's framing: a length-framed body is one big chunk.
    fn with_framing(mut self, framing: &Framing) -> Body<R> {
        match framing {
            Framing::Chunked => {}
            Framing::Length(n) => {
                self.remaining = *n;
                self.done = *n == 0;
                self.length_framed = true;
            }
            Framing::UntilClose => {
                self.remaining = usize::MAX;
                self.length_framed = true;
            }
        }
        self
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.length_framed {
            let want = buf.len().min(self.remaining);
            let n = self.inner.read(&mut buf[..want])?;
            if n == 0 {
                self.done = true;
                if self.remaining != usize::MAX {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside the body",
                    ));
                }
            } else if self.remaining != usize::MAX {
                self.remaining -= n;
                self.done = self.remaining == 0;
            }
            return Ok(n);
        }
        if self.remaining == 0 {
            // Chunk header: hex size, optional extensions.
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a chunked body",
                ));
            }
            let size_text = line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size_text, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size line {line:?}"),
                )
            })?;
            if size == 0 {
                // Trailers end with an empty line.
                loop {
                    line.clear();
                    if self.inner.read_line(&mut line)? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(0);
            }
            self.remaining = size;
        }
        let want = buf.len().min(self.remaining);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a chunk",
            ));
        }
        self.remaining -= n;
        if self.remaining == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        Ok(n)
    }
}

/// A plain or TLS connection to one endpoint.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

pub(crate) struct Conn {
    pub(crate) reader: BufReader<Stream>,
    pub(crate) endpoint: usize,
}

// Throw-away etcd processes for tests and benchmarks, out of production builds.
#[cfg(feature = "test-support")]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_body_decodes() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        let mut r = io::Cursor::new(&raw[..]);
        let mut c = Body::chunked(&mut r);
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert_eq!(out, "hello, world");
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "NEXT", "the reader stops right after the body");
    }

    #[test]
    fn heads_and_bodies_are_bounded() {
        let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
        while big.len() <= MAX_HEAD {
            big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        big.extend_from_slice(b"\r\n");
        let e = read_head(&mut io::Cursor::new(&big[..]))
            .err()
            .expect("over the bound");
        assert!(e.to_string().contains("64 KiB"), "{e}");
        let ok = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /x\r\nContent-Length: 3\r\n\r\nabc";
        let h = read_head(&mut io::Cursor::new(&ok[..])).unwrap();
        assert_eq!(h.status, 307);
        assert!(matches!(h.framing, Framing::Length(3)));
    }
}
