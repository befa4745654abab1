//! Running commands and managing the lab's own processes. Every `ip` invocation goes through
//! [`ip_in`] or [`netns_exec`], which always name a lab namespace, so no command can act on the
//! root namespace by accident.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{LabError, Result};

/// Renders a command line for messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Starts `cmd` with stdin from /dev/null and stdout and stderr to the file `log` (appended
/// to when `append`, else truncated), in a process group of its own: a Ctrl-C aimed at
/// ternctl does not kill the lab's processes mid-teardown.
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path, append: bool) -> Result<Child> {
    let f = std::fs::File::options()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .map_err(|e| LabError::io(format!("cannot create {}", log.display()), e))?;
    let f2 = f
        .try_clone()
        .map_err(|e| LabError::io(format!("cannot reopen {}", log.display()), e))?;
    cmd.stdin(Stdio::null())
        .stdout(f)
        .stderr(f2)
        .process_group(0);
    cmd.spawn().map_err(|e| LabError::Spawn {
        command: describe(cmd),
        source: e,
    })
}

/// Runs a command to completion; its stdout on success, an error with stderr otherwise.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = output(cmd)?;
    check(cmd, &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command to completion and returns its output whatever the exit status.
pub fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Spawn {
            command: describe(cmd),
            source: e,
        })
}

fn check(cmd: &Command, out: &Output) -> Result<()> {
    if out.status.success() {
        return Ok(());
    }
    Err(LabError::Command {
        command: describe(cmd),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// `ip -n NS ARGS...`: an iproute2 command inside namespace `ns`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<String> {
    run(Command::new("ip").arg("-n").arg(ns).args(args))
}

/// A command that runs `program` inside namespace `ns` (`ip netns exec NS PROGRAM`).
pub fn netns_exec(ns: &str, program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// Creates a named network namespace.
pub fn netns_add(ns: &str) -> Result<()> {
    run(Command::new("ip").args(["netns", "add", ns])).map(drop)
}

/// Deletes a named network namespace; absent is success.
pub fn netns_del(ns: &str) -> Result<()> {
    if !netns_exists(ns) {
        return Ok(());
    }
    run(Command::new("ip").args(["netns", "del", ns])).map(drop)
}

/// Whether a named namespace exists (`/run/netns/NS`).
pub fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Every named namespace whose name starts with `prefix`.
pub fn netns_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut v: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

/// Sets a sysctl inside namespace `ns`. Writing `/proc/sys/net` from a process in the
/// namespace affects that namespace only.
pub fn sysctl_in(ns: &str, key: &str, value: &str) -> Result<()> {
    let mut c = netns_exec(ns, Path::new("sysctl"));
    c.args(["-q", "-w", &format!("{key}={value}")]);
    run(&mut c).map(drop)
}

/// The command line of a process (arguments joined by spaces), if it exists and is not a
/// zombie.
fn live_cmdline(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the parenthesised command name, which may itself contain spaces.
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    if state == 'Z' || state == 'X' {
        return None;
    }
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Whether `pid` exists and is not a zombie. For a child we have not reaped, the PID cannot
/// have been reused, so this is exact even while the child is between two `exec`s (when its
/// command line is briefly unreadable).
pub fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

/// Whether `pid` is alive and its command line contains `marker` (a path unique to the lab),
/// i.e. it is still the process we started and not a reused PID.
pub fn is_ours(pid: u32, marker: &str) -> bool {
    live_cmdline(pid).is_some_and(|c| c.contains(marker))
}

fn reap(pid: u32) {
    // Reaps the process if it is our child, so it does not linger as a zombie; harmless
    // (ECHILD) otherwise.
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG only inspects the child table.
    unsafe {
        libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG);
    }
}

/// Stops a process we started: SIGTERM, then SIGKILL after `grace`. Does nothing unless the
/// PID still runs a command containing `marker`. Returns true when a process was stopped.
pub fn stop(pid: u32, marker: &str, grace: Duration) -> bool {
    if !is_ours(pid, marker) {
        reap(pid);
        return false;
    }
    let signal = |sig| {
        // SAFETY: kill(2) on a PID verified above to be our process.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
    };
    signal(libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        reap(pid);
        if !is_ours(pid, marker) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        reap(pid);
        if !is_ours(pid, marker) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Kills a process we started with SIGKILL (as a crash would) and waits until it is gone.
/// Does nothing unless the PID still runs a command containing `marker`.
pub fn kill(pid: u32, marker: &str, timeout: Duration) -> Result<()> {
    if !is_ours(pid, marker) {
        reap(pid);
        return Ok(());
    }
    // SAFETY: kill(2) on a PID verified above to be our process.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        reap(pid);
        if !is_ours(pid, marker) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(LabError::Timeout(format!(
        "process {pid} ({marker}) still runs {timeout:?} after SIGKILL"
    )))
}

/// Random lowercase hex of `bytes` bytes, from the kernel's generator.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        // SAFETY: getrandom writes at most `bytes - filled` bytes into the buffer's tail.
        let n = unsafe { libc::getrandom(buf[filled..].as_mut_ptr().cast(), bytes - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_command_reports_stderr() {
        let e = run(Command::new("sh").args(["-c", "echo boom >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("boom") && e.contains("sh -c"), "{e}");
    }

    #[test]
    fn stop_only_kills_matching_process() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        // Until exec completes, /proc shows the forking test binary's command line.
        let t0 = Instant::now();
        while !is_ours(pid, "sleep 30") {
            assert!(t0.elapsed() < Duration::from_secs(5), "sleep did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!stop(pid, "no-such-marker", Duration::from_millis(100)));
        assert!(is_ours(pid, "sleep 30"));
        assert!(stop(pid, "sleep 30", Duration::from_secs(2)));
        // stop() may already have reaped it, so try_wait can report ECHILD.
        let _ = child.try_wait();
        assert!(!is_ours(pid, "sleep 30"));
    }

    #[test]
    fn random_hex_is_random() {
        let a = random_hex(8);
        assert_eq!(a.len(), 16);
        assert_ne!(a, random_hex(8));
    }
}
