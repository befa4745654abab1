//! A test's preconditions, and the one skip there is.
//!
//! A precondition that is missing (root, a binary, a capability) fails the test: [`need`] and
//! the guards built on it panic naming the test, what is missing and how to get it, and return
//! what the test needs (`()`, or the path of the binary found), so a test never returns early.
//! A bare early `return` would make such a test pass silently, and libtest hides whatever it
//! printed.
//!
//! The only skip is a limit of this machine's kernel ([`KERNEL_LIMITS`]: features the CI kernel
//! really lacks): [`kernel_limit`] prints `SKIP (kernel limit) <test>: <feature>: <why>` to the
//! process's stderr (past libtest's capture) and appends it to the file named by
//! [`SKIP_LOG_ENV`], where `scripts/test.sh` counts it; the test then leaves the feature out,
//! or returns through [`skip_kernel_limit!`](crate::skip_kernel_limit), the only early return a
//! test has. A feature not in the list fails the test.

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

use crate::binaries::{find_binary, install_hint};

/// The variable naming a file every skip line is appended to (for a summary after the run).
pub const SKIP_LOG_ENV: &str = "TERN_TEST_SKIP_LOG";
/// Kernel features the test machine lacks and that a test may skip (lower case;
/// [`kernel_limit`] compares case-insensitively).
pub const KERNEL_LIMITS: &[&str] = &["ipip", "dummy", "gre", "wireguard", "sctp"];

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

/// The message of a test that cannot run.
fn missing(test: &str, what: &str, how: impl Display) -> String {
    format!("{test}: cannot run: needs {what}; {how}")
}

/// Fails the running test unless `ok`: panics with `<test>: cannot run: needs <what>; <how>`,
/// `how` telling a reader how to get what is missing.
#[track_caller]
pub fn need(what: &str, ok: bool, how: impl Display) {
    if !ok {
        panic!("{}", missing(&test_name(), what, how));
    }
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the running test unless it runs as root (network namespaces, nftables, routes).
#[track_caller]
pub fn need_root() {
    need(
        "root (it creates network namespaces)",
        is_root(),
        "run as root, e.g. `sudo -E cargo test ...` or `bash scripts/test.sh`",
    )
}

/// The binary `name` (a path, or a name looked up in `PATH`); fails the running test, saying
/// which package provides it, when it is not there.
#[track_caller]
pub fn need_binary(name: &str) -> PathBuf {
    need_binary_how(name, install_hint(name))
}

/// As [`need_binary`], with the caller's hint on how to get the binary.
#[track_caller]
pub fn need_binary_how(name: &str, how: impl Display) -> PathBuf {
    let found = find_binary(name);
    need(&format!("the binary `{name}`"), found.is_some(), how);
    found.unwrap_or_default()
}

/// Where kernel-limit skips are logged: the environment, made explicit so it can be tested.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkipLog {
    /// Skip lines are appended here too (besides stderr).
    pub path: Option<PathBuf>,
}

impl SkipLog {
    /// The log of this process, from [`SKIP_LOG_ENV`].
    pub fn from_env() -> SkipLog {
        let path = std::env::var_os(SKIP_LOG_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        SkipLog { path }
    }

    /// As [`kernel_limit`], for the test `test`.
    #[track_caller]
    pub fn kernel_limit(&self, test: &str, feature: &str, why: impl Display) {
        let known = KERNEL_LIMITS
            .iter()
            .any(|k| k.eq_ignore_ascii_case(feature));
        if !known {
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
        if let Some(path) = &self.path {
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

/// Records that the running test (or part of it) is skipped because this machine's kernel lacks
/// `feature`, one of [`KERNEL_LIMITS`]: prints and logs `SKIP (kernel limit) <test>: ...`. The
/// caller leaves the feature out, or returns through
/// [`skip_kernel_limit!`](crate::skip_kernel_limit). A feature not in the list fails the test.
#[track_caller]
pub fn kernel_limit(feature: &str, why: impl Display) {
    SkipLog::from_env().kernel_limit(&test_name(), feature, why)
}

/// Skips the rest of the running test because this machine's kernel lacks a feature: records
/// it with [`kernel_limit`](crate::kernel_limit) and returns from the enclosing function (which
/// returns `()`). The only early return a test may have (`tests/bare_returns.rs`).
///
/// ```no_run
/// # fn kernel_supports(_: &str) -> bool { true }
/// #[test]
/// fn over_ipip() {
///     tern_testkit::need_root();
///     if !kernel_supports("ipip") {
///         tern_testkit::skip_kernel_limit!("ipip", "`ip link add type ipip` fails");
///     }
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! skip_kernel_limit {
    ($feature:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {{
        $crate::kernel_limit($feature, ::std::format!($fmt $(, $arg)*));
        return;
    }};
    ($feature:expr, $why:expr $(,)?) => {{
        $crate::kernel_limit($feature, $why);
        return;
    }};
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::process::Command;

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
    fn a_met_precondition_returns() {
        need("root", true, "run as root");
        assert_eq!(need_binary("sh"), find_binary("sh").unwrap());
    }

    #[test]
    fn a_missing_precondition_fails_naming_the_test_what_and_how() {
        let e = std::panic::catch_unwind(|| need("root", false, "run as root"))
            .expect_err("a missing precondition fails");
        assert_eq!(
            panic_message(e),
            "guard::tests::a_missing_precondition_fails_naming_the_test_what_and_how: cannot \
             run: needs root; run as root"
        );
        let e = std::panic::catch_unwind(|| need_binary("tern-no-such-binary"))
            .expect_err("a missing binary fails");
        let msg = panic_message(e);
        assert!(
            msg.contains("needs the binary `tern-no-such-binary`; `bash scripts/deps.sh`"),
            "{msg}"
        );
    }

    #[test]
    fn kernel_limits_are_logged_and_never_fail() {
        let log = Rm(temp_log("kl"));
        let skips = SkipLog {
            path: Some(log.0.clone()),
        };
        skips.kernel_limit("t", "SCTP", "cannot create an SCTP socket");
        skips.kernel_limit("t2", "ipip", "no tunl0");
        let text = std::fs::read_to_string(&log.0).unwrap();
        assert_eq!(
            text,
            "SKIP (kernel limit) t: SCTP: cannot create an SCTP socket\n\
             SKIP (kernel limit) t2: ipip: no tunl0\n"
        );
    }

    #[test]
    fn an_unknown_kernel_limit_fails() {
        let e = std::panic::catch_unwind(|| SkipLog::default().kernel_limit("t", "vxlan", "no"))
            .expect_err("vxlan is not an allowed kernel limit");
        assert!(panic_message(e).contains("not an allowed kernel limit"));
    }

    #[test]
    fn the_test_name_is_the_thread_name() {
        assert_eq!(
            test_name(),
            "guard::tests::the_test_name_is_the_thread_name",
            "libtest names the thread after the test"
        );
    }

    #[test]
    fn a_thread_for_the_test_carries_its_name() {
        let name = thread_for_test().spawn(test_name).unwrap().join().unwrap();
        assert_eq!(name, "guard::tests::a_thread_for_the_test_carries_its_name");
    }

    /// The body of [`the_macro_skips_and_a_guard_fails`]'s child processes; a no-op otherwise.
    #[test]
    fn child_guard() {
        match std::env::var("TERN_TESTKIT_CHILD").as_deref() {
            Ok("skip") => {
                crate::skip_kernel_limit!("sctp", "no {} here", "SCTP");
            }
            Ok("need") => {
                need_binary("tern-no-such-binary");
            }
            _ => {}
        }
        assert_ne!(
            std::env::var("TERN_TESTKIT_CHILD").as_deref(),
            Ok("skip"),
            "the macro returns"
        );
    }

    /// End to end through the environment: the test binary itself, run as a child process.
    #[test]
    fn the_macro_skips_and_a_guard_fails() {
        let log = Rm(temp_log("env"));
        let run = |role: &str| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "guard::tests::child_guard", "--test-threads=1"])
                .env("TERN_TESTKIT_CHILD", role)
                .env(SKIP_LOG_ENV, &log.0)
                .output()
                .unwrap()
        };
        let out = run("skip");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a kernel-limit skip passes: {stderr}");
        // Visible although libtest captures the output of passing tests.
        let line = "SKIP (kernel limit) guard::tests::child_guard: sctp: no SCTP here";
        assert!(stderr.contains(line), "{stderr}");
        assert_eq!(
            std::fs::read_to_string(&log.0).unwrap(),
            format!("{line}\n")
        );

        let out = run("need");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "a missing binary fails the test");
        assert!(
            stdout.contains(
                "guard::tests::child_guard: cannot run: needs the binary `tern-no-such-binary`"
            ),
            "{stdout}"
        );
    }
}
