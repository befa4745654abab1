//! A real headless browser for the tests of tern's web page: Debian's `chromium`, driven by its
//! `chromedriver` over W3C WebDriver, both run inside a test's network namespace so the browser
//! reaches nothing but that namespace's loopback (no update checks or other traffic leave it).
//!
//! The WebDriver client is the few commands the tests use (new session, navigate, find, text,
//! click, execute script), JSON over HTTP/1.1 on std: a client crate (fantoccini, thirtyfour)
//! brings hyper and an async runtime into every test build for that.
//!
//! Processes: chromedriver runs in its own process group and the whole group (chromium and its
//! helpers are its children) is killed on drop, with the browser profile in a temporary directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::guard::need_binary_how;
use crate::netns::{Netns, in_netns};

/// The WebDriver element reference key.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// chromedriver's port inside the test namespace (the namespace is the test's own, so it is free).
const PORT: u16 = 9515;
/// Longest wait for chromedriver to answer, and for one command.
const TIMEOUT: Duration = Duration::from_secs(60);
/// Largest response read from chromedriver.
const MAX_RESPONSE: u64 = 16 << 20;

/// A chromium session in a namespace.
pub struct Browser {
    ns_path: String,
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
    log: PathBuf,
}

/// An element of the page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver in `ns` and opens a headless chromium session. Fails the test,
    /// saying how to install them, when chromium or chromedriver is missing.
    pub fn start(ns: &Netns) -> Browser {
        let how = "apt-get install chromium chromium-driver (scripts/deps.sh installs them)";
        let chromium = need_binary_how("chromium", how);
        let driver_bin = need_binary_how("chromedriver", how);
        let profile = tempfile::Builder::new()
            .prefix("tern-chromium-")
            .tempdir()
            .expect("a temporary browser profile");
        let log = profile.path().join("chromedriver.log");
        let driver = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(&driver_bin)
            .arg(format!("--port={PORT}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", driver_bin.display()));
        let mut b = Browser {
            ns_path: ns.path(),
            session: String::new(),
            driver,
            log,
            _profile: profile,
        };
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let status = b.http("GET", "/status", None);
            if status.as_ref().is_ok_and(|v| v["value"]["ready"] == true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready in {TIMEOUT:?} ({status:?}); its log:\n{}",
                b.driver_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-extensions",
                    format!("--user-data-dir={}", b._profile.path().join("profile").display()),
                    "--window-size=1400,1000",
                ],
            },
        }}});
        let v = b
            .http("POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("new chromium session: {e}; log:\n{}", b.driver_log()));
        b.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session in {v}; log:\n{}", b.driver_log()))
            .to_string();
        b
    }

    fn driver_log(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// One WebDriver call: the JSON answer, or the error it carries.
    fn http(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{PORT}\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let conn = in_netns(&self.ns_path, || {
            TcpStream::connect_timeout(&([127, 0, 0, 1], PORT).into(), Duration::from_secs(2))
        })
        .map_err(|e| format!("connecting to chromedriver: {e}"))?;
        conn.set_read_timeout(Some(TIMEOUT))
            .map_err(|e| e.to_string())?;
        (&conn)
            .write_all(req.as_bytes())
            .map_err(|e| format!("writing to chromedriver: {e}"))?;
        // chromedriver says `Connection: close` but keeps the connection open: read the head,
        // then exactly Content-Length bytes.
        let mut raw = Vec::new();
        let mut chunk = [0u8; 8192];
        let head_end = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let n = (&conn)
                .read(&mut chunk)
                .map_err(|e| format!("reading chromedriver's answer: {e}"))?;
            if n == 0 || raw.len() as u64 > MAX_RESPONSE {
                return Err(format!(
                    "a malformed answer: {:?}",
                    String::from_utf8_lossy(&raw)
                ));
            }
            raw.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
        let len: u64 = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
            .ok_or_else(|| format!("no Content-Length in {head:?}"))?;
        if len > MAX_RESPONSE {
            return Err(format!("an answer of {len} bytes"));
        }
        let mut body = raw[head_end + 4..].to_vec();
        while (body.len() as u64) < len {
            let n = (&conn)
                .read(&mut chunk)
                .map_err(|e| format!("reading chromedriver's answer: {e}"))?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
        let body = String::from_utf8_lossy(&body);
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("{e} in {body:?} ({head})"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!("{method} {path}: {}", v["value"]));
        }
        Ok(v)
    }

    fn cmd(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let p = format!("/session/{}{path}", self.session);
        self.http(method, &p, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {p}: {e}"))["value"]
            .take()
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Every element matching the CSS selector.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        let v = self.cmd(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        );
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT_KEY].as_str().map(|s| Element(s.to_string())))
            .collect()
    }

    /// The element's rendered text.
    pub fn text(&self, e: &Element) -> String {
        self.cmd("GET", &format!("/element/{}/text", e.0), None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The element's attribute.
    pub fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.cmd("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .as_str()
            .map(str::to_string)
    }

    /// Clicks the element as a user would (WebDriver's element click).
    pub fn click(&self, e: &Element) {
        self.cmd("POST", &format!("/element/{}/click", e.0), Some(&json!({})));
    }

    /// Types into an input element.
    pub fn type_into(&self, e: &Element, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(&json!({ "text": text })),
        );
    }

    /// Runs a script in the page; its return value.
    pub fn execute(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(&json!({"script": script, "args": []})),
        )
    }

    /// A PNG of the window, base64-encoded as WebDriver gives it.
    pub fn screenshot_base64(&self) -> String {
        self.cmd("GET", "/screenshot", None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Polls until `cond` gives a value or `timeout` passes; panics naming `what` with the
    /// page's text then.
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&Browser) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = cond(self) {
                return v;
            }
            if Instant::now() > deadline {
                let body = self.execute("return document.body.innerText");
                panic!("the page did not show {what} in {timeout:?}; it shows:\n{body}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.http("DELETE", &format!("/session/{}", self.session), None);
        }
        // chromedriver leads its own group: end it and the browser it started.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.wait();
    }
}
