//! The `ternd` process started for the run, and its memory (`VmRSS`).

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{BenchError, io_err};
use super::log_scrape::{SPLIT_ENV, SPLIT_LOG};

/// A `ternd` started for the run inside the bench namespace; killed (by PID) on drop.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    /// The socket the plugins connect to.
    pub socket: PathBuf,
    /// Where `ternd`'s stdout and stderr go.
    pub log: PathBuf,
}

impl Agent {
    /// Starts `ternd --node-name bench --store sqlite://DIR/store.db --socket DIR/ternd.sock
    /// --state-dir DIR` and waits until its socket accepts a connection.
    pub fn start(ternd: &Path, dir: &Path, timeout: Duration) -> Result<Agent, BenchError> {
        if !ternd.is_file() {
            return Err(BenchError::MissingBinary(ternd.to_owned()));
        }
        let socket = dir.join("ternd.sock");
        let log = dir.join("ternd.log");
        let log_file =
            std::fs::File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
        let log_err = log_file
            .try_clone()
            .map_err(io_err(format!("dup {}", log.display())))?;
        let mut command = Command::new(ternd);
        command
            .arg("--node-name")
            .arg("bench")
            .arg("--store")
            .arg(format!("sqlite://{}", dir.join("store.db").display()))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        if std::env::var_os(SPLIT_ENV).is_some() {
            command.env("TERN_LOG", SPLIT_LOG);
        }
        let mut attempts = 0;
        let child = loop {
            match command.spawn() {
                // A binary written a moment ago can still be open for writing in a child forked
                // meanwhile by another thread (ETXTBSY); that clears as soon as the child execs.
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 10 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.map_err(io_err(format!("spawn {}", ternd.display())))?,
            }
        };
        let mut agent = Agent { child, socket, log };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = agent.child.try_wait() {
                return Err(BenchError::AgentStart(format!(
                    "{} exited ({status}) before opening {}; its log: {}",
                    ternd.display(),
                    agent.socket.display(),
                    agent.log_tail()
                )));
            }
            if UnixStream::connect(&agent.socket).is_ok() {
                return Ok(agent);
            }
            if Instant::now() >= deadline {
                // Dropping `agent` kills the process.
                return Err(BenchError::AgentStart(format!(
                    "{} did not open {} within {timeout:?}; its log: {}",
                    ternd.display(),
                    agent.socket.display(),
                    agent.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's resident set size in KiB.
    pub fn rss_kib(&self) -> Result<u64, BenchError> {
        vm_rss_kib(self.pid())
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            "(empty)".into()
        } else {
            tail
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Child::kill signals exactly this PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` in KiB from the text of `/proc/PID/status`.
pub fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
}

/// Resident set size of process `pid` in KiB.
pub fn vm_rss_kib(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(io_err(format!("read {path}")))?;
    parse_vm_rss_kib(&text).ok_or_else(|| BenchError::Io {
        context: format!("read {path}"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no VmRSS line"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_from_proc_status_text() {
        let status = "Name:\tternd\nVmPeak:\t  9000 kB\nVmRSS:\t    5432 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss_kib(status), Some(5432));
        assert_eq!(parse_vm_rss_kib("Name:\tkthreadd\n"), None);
        // Our own process has a resident set.
        assert!(vm_rss_kib(std::process::id()).unwrap() > 0);
    }

    /// Writes an executable stand-in for `ternd` into `dir`.
    fn fake_ternd(dir: &Path, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("ternd");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    const PYTHON: &str = "/usr/bin/python3";

    #[test]
    fn agent_is_ready_when_its_socket_accepts_and_is_killed_on_drop() {
        if !Path::new(PYTHON).is_file() {
            eprintln!("skipped: needs {PYTHON} for the stand-in agent");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Checks the command line tern-bench promises, then serves the socket after a delay.
        let ternd = fake_ternd(
            dir.path(),
            &format!(
                "#!{PYTHON}\n\
                 import socket, sys, time\n\
                 a = sys.argv[1:]\n\
                 assert a[0:2] == ['--node-name', 'bench'], a\n\
                 assert a[2] == '--store' and a[3].startswith('sqlite:///') and a[3].endswith('/store.db'), a\n\
                 assert a[4] == '--socket' and a[6] == '--state-dir', a\n\
                 time.sleep(0.3)\n\
                 s = socket.socket(socket.AF_UNIX); s.bind(a[5]); s.listen(8)\n\
                 while True: s.accept()\n"
            ),
        );
        let agent = Agent::start(&ternd, dir.path(), Duration::from_secs(10)).unwrap();
        assert_eq!(agent.socket, dir.path().join("ternd.sock"));
        assert!(agent.rss_kib().unwrap() > 0);
        let pid = agent.pid();
        drop(agent);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "agent {pid} still running"
        );
    }

    #[test]
    fn an_agent_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let ternd = fake_ternd(
            dir.path(),
            "#!/bin/sh\necho 'error: store sqlite:///x: locked' >&2\nexit 3\n",
        );
        let err = Agent::start(&ternd, dir.path(), Duration::from_secs(10)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("ternd did not start:")
                && text.contains("exit status: 3")
                && text.contains("error: store sqlite:///x: locked"),
            "{text}"
        );
    }

    #[test]
    fn an_agent_that_never_listens_times_out_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let ternd = fake_ternd(dir.path(), "#!/bin/sh\necho starting\nexec sleep 30\n");
        let start = Instant::now();
        let err = Agent::start(&ternd, dir.path(), Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        let text = err.to_string();
        assert!(
            text.contains("did not open") && text.contains("starting"),
            "{text}"
        );
    }
}
