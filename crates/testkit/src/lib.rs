//! Preconditions of tern's integration tests, so that a test that cannot run says so.
//!
//! Many tests need root (network namespaces), a binary (etcd, BIRD, nft) or a kernel feature.
//! A bare early `return` makes such a test pass silently when the precondition is missing, and
//! libtest hides whatever it printed. Every test guard goes through this crate instead:
//!
//! - **Strict mode** (`TERN_TEST_STRICT=1`, set by `scripts/test.sh`): a missing precondition
//!   panics, naming the test, what is missing and how to get it. CI cannot go green on tests
//!   that did not run.
//! - **Otherwise** (a developer's machine): the test prints `SKIP <test>: <reason>` straight to
//!   the process's stderr (past libtest's output capture), appends the same line to the file
//!   named by `TERN_TEST_SKIP_LOG` when set, and the guard returns `false` so the test returns.
//! - **Kernel limits** ([`KERNEL_LIMITS`]: features the CI kernel really lacks) are the only skips
//!   allowed in strict mode: [`kernel_limit`] prints `SKIP (kernel limit) <test>: <reason>` and
//!   logs it, never panicking, so `scripts/test.sh` can count them in its summary.
//!
//! [`child`] runs part of a test in child processes (the test binary re-executed in a role);
//! [`golden`] is the shared runner of the golden replay tests (cases in folders, expected
//! outputs compared line by line, rewritten with `TERN_GOLDEN_UPDATE=1`; `check_file` for one
//! golden file); [`modules`] reads a crate's module graph for the test every crate has that
//! keeps it acyclic.
//!
//! ```no_run
//! #[test]
//! fn needs_root_and_etcd() {
//!     if !tern_testkit::require_root() || !tern_testkit::require_binary("etcd") {
//!         return;
//!     }
//!     // ...
//! }
//! ```

pub mod conformance;

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};

pub mod child;
pub mod golden;
pub mod modules;

/// The variable that turns a missing precondition into a test failure (`1`, `true` or `yes`).
pub const STRICT_ENV: &str = "TERN_TEST_STRICT";
/// The variable naming a file every skip line is appended to (for a summary after the run).
pub const SKIP_LOG_ENV: &str = "TERN_TEST_SKIP_LOG";
/// Kernel features the test machine lacks and that may be skipped even in strict mode
/// (lower case; [`kernel_limit`] compares case-insensitively).
pub const KERNEL_LIMITS: &[&str] = &["ipip", "dummy", "gre", "wireguard", "sctp"];

/// How a failed precondition is reported: the environment, made explicit so it can be tested.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mode {
    /// A missing precondition panics instead of skipping.
    pub strict: bool,
    /// Skip lines are appended here too.
    pub skip_log: Option<PathBuf>,
}

impl Mode {
    /// The mode of this process, from [`STRICT_ENV`] and [`SKIP_LOG_ENV`].
    pub fn from_env() -> Mode {
        let strict = std::env::var(STRICT_ENV)
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
        let skip_log = std::env::var_os(SKIP_LOG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        Mode { strict, skip_log }
    }

    /// As [`require`], in this mode.
    #[track_caller]
    pub fn require(&self, test: &str, what: &str, ok: bool, how: impl Display) -> bool {
        if ok {
            return true;
        }
        if self.strict {
            panic!(
                "{test}: cannot run: needs {what}; {how}. ({STRICT_ENV}=1: a test whose \
                 precondition is missing fails instead of passing untested)"
            );
        }
        self.log(&format!("SKIP {test}: needs {what}; {how}"));
        false
    }

    /// As [`kernel_limit`], in this mode.
    #[track_caller]
    pub fn kernel_limit(&self, test: &str, feature: &str, why: impl Display) {
        let known = KERNEL_LIMITS
            .iter()
            .any(|k| k.eq_ignore_ascii_case(feature));
        if self.strict && !known {
            panic!(
                "{test}: kernel_limit({feature:?}) is not an allowed kernel limit (only {}): {why}",
                KERNEL_LIMITS.join(", ")
            );
        }
        self.log(&format!("SKIP (kernel limit) {test}: {feature}: {why}"));
    }

    /// Writes `line` to the process's stderr and appends it to the skip log.
    fn log(&self, line: &str) {
        // Written to the stderr handle, not with eprintln!: libtest captures the print macros
        // of a passing test and would hide the line.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
        if let Some(path) = &self.skip_log {
            // One write of a whole short line on an O_APPEND file: lines from tests running in
            // parallel (threads or test binaries) do not interleave.
            let res = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
            if let Err(e) = res {
                let _ = writeln!(
                    std::io::stderr().lock(),
                    "tern-testkit: cannot append to {SKIP_LOG_ENV}={}: {e}",
                    path.display()
                );
            }
        }
    }
}

/// The name of the running test: libtest names each test's thread after the test.
pub fn test_name() -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_string(),
        _ => "<test on an unnamed thread>".to_string(),
    }
}

/// A thread builder named after the running test, for harnesses that run a test's body on a
/// thread of their own (e.g. in a private network namespace): guards on it still name the test.
pub fn thread_for_test() -> std::thread::Builder {
    let b = std::thread::Builder::new();
    match std::thread::current().name() {
        Some(n) => b.name(n.to_string()),
        None => b,
    }
}

/// Whether strict mode is on ([`STRICT_ENV`]).
pub fn strict() -> bool {
    Mode::from_env().strict
}

/// Checks a precondition of the running test: `true` when `ok`. Otherwise panics in strict mode,
/// or prints and logs `SKIP <test>: needs <what>; <how>` and returns `false` (the test then
/// returns). `how` tells a reader how to get what is missing.
#[track_caller]
pub fn require(what: &str, ok: bool, how: impl Display) -> bool {
    Mode::from_env().require(&test_name(), what, ok, how)
}

/// Whether the process runs as root (network namespaces, nftables, routes), as [`require`].
#[track_caller]
pub fn require_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    require(
        "root (it creates network namespaces)",
        root,
        "run as root, e.g. `sudo -E cargo test ...` or `bash scripts/test.sh`",
    )
}

/// Whether the binary `name` (a path, or a name looked up in `PATH`) exists and is executable,
/// as [`require`]; the message says which package provides it.
#[track_caller]
pub fn require_binary(name: &str) -> bool {
    require_binary_how(name, install_hint(name))
}

/// As [`require_binary`], with the caller's hint on how to get the binary.
#[track_caller]
pub fn require_binary_how(name: &str, how: impl Display) -> bool {
    require(
        &format!("the binary `{name}`"),
        find_binary(name).is_some(),
        how,
    )
}

/// Records that the running test (or part of it) is skipped because this machine's kernel lacks
/// `feature`, one of [`KERNEL_LIMITS`]: prints and logs `SKIP (kernel limit) <test>: ...`, also
/// in strict mode. The caller returns (or leaves the feature out). A feature not in the list
/// panics in strict mode: only the known limits of the CI kernel may be skipped there.
#[track_caller]
pub fn kernel_limit(feature: &str, why: impl Display) {
    Mode::from_env().kernel_limit(&test_name(), feature, why)
}

/// The executable `name`: itself when it contains a `/`, else the first match in `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return is_executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How to get a binary the tests use (Debian packages; `scripts/deps.sh` installs them all).
pub fn install_hint(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    let pkg = match base {
        "bird" | "birdc" => "bird2",
        "etcd" | "etcdctl" => "etcd-server",
        "nft" => "nftables",
        "ip" | "tc" | "bridge" => "iproute2",
        "iperf3" => "iperf3",
        "containerd" | "ctr" => "containerd",
        "runc" => "runc",
        "busybox" => "busybox-static",
        "host-local" | "ptp" | "loopback" | "bridge-plugin" => "containernetworking-plugins",
        "tern" | "tern-ipam" | "ternd" | "ternctl" => {
            return "build it: `cargo build --workspace --bins`".to_string();
        }
        _ => return "`bash scripts/deps.sh` installs the test dependencies".to_string(),
    };
    let mut hint = format!("`apt-get install {pkg}` (or `bash scripts/deps.sh`)");
    if pkg == "etcd-server" {
        hint.push_str(", or set TERN_ETCD_BIN");
    }
    hint
}

/// The workspace's binaries every end-to-end test runs (the plugins, the agent, the CLI).
pub const WORKSPACE_BINARIES: &[&str] = &["tern", "tern-ipam", "ternd", "ternctl"];

/// The directory of `exe` (a binary cargo built for this test, `env!("CARGO_BIN_EXE_...")`),
/// once every one of [`WORKSPACE_BINARIES`] in it is checked to be current, once per test
/// process. Tests never run cargo: `cargo build --workspace --bins` (the build step of
/// `scripts/test.sh`) built them, and `cargo test --workspace` rebuilds what changed before any
/// test starts. A binary counts as current when it exists and no source file its dep-info
/// (`<name>.d`, which cargo writes beside it) lists is newer than it, so `cargo test -p X` after
/// an edit to another package's code fails naming the stale binary and the command that
/// rebuilds it instead of testing old code.
pub fn workspace_binaries(exe: &Path) -> &'static Path {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    match DIR.get_or_init(|| check_binaries(exe, WORKSPACE_BINARIES)) {
        Ok(dir) => dir,
        Err(e) => panic!("{e}"),
    }
}

/// The command that makes every workspace binary current.
const REBUILD: &str = "`cargo build --workspace --bins` (scripts/test.sh's build step)";

fn check_binaries(exe: &Path, names: &[&str]) -> Result<PathBuf, String> {
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?
        .to_path_buf();
    let problems: Vec<String> = names
        .iter()
        .filter_map(|n| stale_reason(&dir.join(n)).err())
        .collect();
    if problems.is_empty() {
        Ok(dir)
    } else {
        Err(format!(
            "the workspace's binaries are not current: {}; run {REBUILD}",
            problems.join("; ")
        ))
    }
}

/// `Ok` when `bin` exists and is not older than any file of its dep-info; else why not.
fn stale_reason(bin: &Path) -> Result<(), String> {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let dep_info = bin.with_extension("d");
    let text = std::fs::read_to_string(&dep_info).map_err(|e| {
        format!(
            "{}: {e} (cargo writes it with the binary)",
            dep_info.display()
        )
    })?;
    for src in dep_info_sources(&text) {
        match std::fs::metadata(&src).and_then(|m| m.modified()) {
            Ok(t) if t <= built => {}
            Ok(_) => {
                return Err(format!("{} is older than {}", bin.display(), src.display()));
            }
            Err(e) => {
                return Err(format!(
                    "{} was built from {}: {e}",
                    bin.display(),
                    src.display()
                ));
            }
        }
    }
    Ok(())
}

/// The prerequisites of the first rule of a Makefile-style dep-info file (`target: a b c`, a
/// space in a path escaped as `\ `, lines continued with a trailing `\`).
fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let Some(first) = joined.lines().find(|l| !l.trim().is_empty()) else {
        return Vec::new();
    };
    // The target ends at the first unescaped ": ".
    let mut rest = None;
    let b = first.as_bytes();
    for i in 0..b.len().saturating_sub(1) {
        if b[i] == b':' && b[i + 1] == b' ' && (i == 0 || b[i - 1] != b'\\') {
            rest = Some(&first[i + 2..]);
            break;
        }
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = rest.unwrap_or("").chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            ' ' | '\t' => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn dep_info_lists_the_sources_of_the_first_rule() {
        let text = "/t/debug/ternd: /w/crates/agent/src/bin/ternd.rs /w/a\\ b.rs \\\n /w/c.rs\n\n/w/c.rs:\n";
        assert_eq!(
            dep_info_sources(text),
            ["/w/crates/agent/src/bin/ternd.rs", "/w/a b.rs", "/w/c.rs"]
                .map(PathBuf::from)
                .to_vec()
        );
        assert!(dep_info_sources("").is_empty());
    }

    #[test]
    fn a_binary_is_current_only_when_no_source_is_newer() {
        let dir = std::env::temp_dir().join(format!("tern-testkit-bins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        struct RmDir(PathBuf);
        impl Drop for RmDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = RmDir(dir.clone());
        let src = dir.join("main.rs");
        let bin = dir.join("prog");
        std::fs::write(&src, "fn main() {}").unwrap();
        std::fs::write(
            dir.join("prog.d"),
            format!("{}: {}\n", bin.display(), src.display()),
        )
        .unwrap();
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("prog: No such file"), "{e}");
        std::fs::write(&bin, "").unwrap();
        let set = |p: &Path, secs: u64| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap();
        };
        set(&src, 1_000);
        set(&bin, 2_000);
        assert_eq!(check_binaries(&bin, &["prog"]).unwrap(), dir);
        set(&src, 3_000);
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("is older than") && e.contains("main.rs"), "{e}");
        assert!(e.contains("cargo build --workspace --bins"), "{e}");
        std::fs::remove_file(&src).unwrap();
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("was built from"), "{e}");
    }

    fn temp_log(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "tern-testkit-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// Removes the file when dropped, even when the test fails.
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// The message of a caught panic.
    pub(crate) fn panic_message(e: Box<dyn std::any::Any + Send>) -> String {
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    #[test]
    fn a_met_precondition_is_true_in_both_modes() {
        for strict in [false, true] {
            let m = Mode {
                strict,
                skip_log: None,
            };
            assert!(m.require("t", "root", true, "run as root"));
        }
    }

    #[test]
    fn strict_mode_panics_naming_the_test_what_and_how() {
        let m = Mode {
            strict: true,
            skip_log: None,
        };
        let e = std::panic::catch_unwind(|| m.require("my_test", "root", false, "run as root"))
            .expect_err("strict mode must panic");
        let msg = panic_message(e);
        assert!(
            msg.starts_with("my_test: cannot run: needs root; run as root."),
            "{msg}"
        );
        assert!(msg.contains(STRICT_ENV), "{msg}");
    }

    #[test]
    fn non_strict_mode_returns_false_and_logs_a_skip_line() {
        let log = Rm(temp_log("skip"));
        let m = Mode {
            strict: false,
            skip_log: Some(log.0.clone()),
        };
        assert!(!m.require(
            "t1",
            "the binary `etcd`",
            false,
            "apt-get install etcd-server"
        ));
        assert!(!m.require("t2", "root", false, "run as root"));
        let text = std::fs::read_to_string(&log.0).unwrap();
        assert_eq!(
            text,
            "SKIP t1: needs the binary `etcd`; apt-get install etcd-server\n\
             SKIP t2: needs root; run as root\n"
        );
    }

    #[test]
    fn kernel_limits_never_panic_and_are_logged() {
        let log = Rm(temp_log("kl"));
        for strict in [false, true] {
            let m = Mode {
                strict,
                skip_log: Some(log.0.clone()),
            };
            m.kernel_limit("t", "SCTP", "cannot create an SCTP socket");
        }
        let text = std::fs::read_to_string(&log.0).unwrap();
        let line = "SKIP (kernel limit) t: SCTP: cannot create an SCTP socket\n";
        assert_eq!(text, format!("{line}{line}"));
    }

    #[test]
    fn an_unknown_kernel_limit_fails_in_strict_mode_only() {
        let m = Mode {
            strict: true,
            skip_log: None,
        };
        let e = std::panic::catch_unwind(|| m.kernel_limit("t", "vxlan", "no vxlan"))
            .expect_err("vxlan is not an allowed kernel limit");
        assert!(panic_message(e).contains("not an allowed kernel limit"));
        Mode::default().kernel_limit("t", "vxlan", "no vxlan");
    }

    #[test]
    fn the_test_name_is_the_thread_name() {
        assert_eq!(
            test_name(),
            "tests::the_test_name_is_the_thread_name",
            "libtest names the thread after the test"
        );
    }

    #[test]
    fn a_thread_for_the_test_carries_its_name() {
        let name = thread_for_test().spawn(test_name).unwrap().join().unwrap();
        assert_eq!(name, "tests::a_thread_for_the_test_carries_its_name");
    }

    #[test]
    fn binaries_are_found_by_path_and_by_name() {
        assert!(find_binary("sh").is_some(), "sh is on PATH");
        assert!(find_binary("/bin/sh").is_some());
        assert!(find_binary("tern-no-such-binary").is_none());
        // A file that is not executable is not a binary.
        let plain = Rm(temp_log("plain"));
        std::fs::write(&plain.0, "not a program").unwrap();
        assert!(find_binary(plain.0.to_str().unwrap()).is_none());
        assert!(install_hint("/usr/sbin/bird").contains("apt-get install bird2"));
        assert!(install_hint("etcd").contains("TERN_ETCD_BIN"));
    }

    /// The body of [`the_environment_decides`]'s child processes; a no-op otherwise.
    #[test]
    fn child_guard() {
        if std::env::var_os("TERN_TESTKIT_CHILD").is_none() {
            return;
        }
        if !require_binary("tern-no-such-binary") {
            return;
        }
        unreachable!("the binary does not exist");
    }

    /// End to end through the environment: the test binary itself, run as a child process.
    #[test]
    fn the_environment_decides() {
        let log = Rm(temp_log("env"));
        let run = |strict: &str| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "tests::child_guard", "--test-threads=1"])
                .env("TERN_TESTKIT_CHILD", "1")
                .env(STRICT_ENV, strict)
                .env(SKIP_LOG_ENV, &log.0)
                .output()
                .unwrap()
        };
        let out = run("0");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "non-strict passes: {stderr}");
        // Visible although libtest captures the output of passing tests.
        assert!(
            stderr.contains("SKIP tests::child_guard: needs the binary `tern-no-such-binary`"),
            "{stderr}"
        );
        let logged = std::fs::read_to_string(&log.0).unwrap();
        assert!(logged.starts_with("SKIP tests::child_guard: needs the binary"));

        let out = run("1");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "strict mode fails the test");
        assert!(
            stdout
                .contains("tests::child_guard: cannot run: needs the binary `tern-no-such-binary`"),
            "{stdout}"
        );
    }
}

/// Applies fuzzing edits to `bytes`, each `(at, byte, op)`: op 0 overwrites the byte at
/// `at % (len + 1)` with `byte`, op 1 inserts `byte` there, op 2 removes the byte there (an
/// overwrite or removal past the end does nothing). The fuzz tests mutate valid inputs with it
/// (edits drawn by proptest as `vec((any::<usize>(), any::<u8>(), 0u8..3), ..)`).
pub fn apply_byte_edits(bytes: &mut Vec<u8>, edits: &[(usize, u8, u8)]) {
    for &(at, byte, op) in edits {
        let i = at % (bytes.len() + 1);
        match op {
            0 if i < bytes.len() => bytes[i] = byte,
            1 => bytes.insert(i, byte),
            _ if i < bytes.len() => {
                bytes.remove(i);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod byte_edit_tests {
    #[test]
    fn edits_overwrite_insert_and_remove() {
        let mut b = b"abc".to_vec();
        super::apply_byte_edits(&mut b, &[(0, b'x', 0), (3, b'!', 1), (1, 0, 2), (99, 0, 2)]);
        // overwrite a -> xbc; insert at 3 -> xbc!; remove at 1 -> xc!; 99 % 4 = 3 -> xc! (3 is the end: nothing)
        assert_eq!(b, b"xc!".to_vec());
    }
}
