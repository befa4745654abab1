//! Tests that run part of themselves in other processes: the test binary re-executes itself
//! with `--exact <child test>` and a role in [`ROLE_ENV`]; the child test runs that role
//! ([`serve`]) and prints its results as marked lines ([`emit`]), which the parent collects
//! ([`output`]) after checking that the child succeeded.
//!
//! Run as an ordinary test (no role in the environment), a child test does nothing.
//!
//! ```no_run
//! #[test]
//! fn parent() {
//!     let c = tern_testkit::child::spawn("child", "count", &[("N", "3".to_string())]);
//!     assert_eq!(tern_testkit::child::output("counter", c), ["0", "1", "2"]);
//! }
//!
//! #[test]
//! fn child() {
//!     tern_testkit::child::serve(|role| {
//!         assert_eq!(role, "count");
//!         let n: usize = std::env::var("N").unwrap().parse().unwrap();
//!         (0..n).for_each(tern_testkit::child::emit);
//!     });
//! }
//! ```

use std::fmt::Display;
use std::process::{Child, Command, Stdio};

/// The variable carrying a child process's role; absent in an ordinary test run.
pub const ROLE_ENV: &str = "TERN_TEST_CHILD_ROLE";

/// What starts each result line of a child on its stdout. libtest's own output shares stdout
/// (its `test child ... ` has no newline before the first line), so the marker is searched
/// anywhere in a line.
const MARK: &str = "CHILD ";

/// Starts the running test binary to run only the test `test` (one thread, output not
/// captured) in `role`, with `env` added to its environment and its output piped.
pub fn spawn(test: &str, role: &str, env: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(&exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("starting {} as {role}: {e}", exe.display()))
}

/// Waits for a child of [`spawn`] and returns the lines it [`emit`]ted. Panics, naming the
/// child `name` and showing its output, when it failed or emitted nothing (it did not run
/// its role).
pub fn output(name: &str, child: Child) -> Vec<String> {
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = marked(&stdout);
    assert!(!lines.is_empty(), "{name} did not run its role:\n{stdout}");
    lines
}

/// The text after the marker of every marked line of `stdout`.
fn marked(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.find(MARK).map(|i| l[i + MARK.len()..].to_string()))
        .collect()
}

/// In a child test: runs `body` with the role the parent gave, or nothing in an ordinary test
/// run (the child test then passes without doing anything).
pub fn serve(body: impl FnOnce(&str)) {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        body(&role);
    }
}

/// Prints one result line of a child for its parent's [`output`].
pub fn emit(line: impl Display) {
    println!("{MARK}{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_lines_are_found_after_libtest_output() {
        let out = "running 1 test\ntest child ... CHILD 1\nCHILD two words\nnoise\nok\n";
        assert_eq!(marked(out), ["1", "two words"]);
    }

    #[test]
    fn a_child_runs_its_role_and_reports() {
        let c = spawn(
            "child::tests::child_body",
            "echo",
            &[("TERN_TESTKIT_ECHO", "a,b".into())],
        );
        assert_eq!(output("echo child", c), ["echo a", "echo b"]);
    }

    #[test]
    fn a_failing_child_fails_the_parent() {
        let c = spawn("child::tests::child_body", "fail", &[]);
        let e = std::panic::catch_unwind(move || output("failing child", c))
            .expect_err("the child failed");
        let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.starts_with("failing child failed"), "{msg}");
        assert!(msg.contains("asked to fail"), "{msg}");
    }

    /// The body of the children above; does nothing as an ordinary test.
    #[test]
    fn child_body() {
        serve(|role| match role {
            "echo" => {
                for w in std::env::var("TERN_TESTKIT_ECHO").unwrap().split(',') {
                    emit(format!("echo {w}"));
                }
            }
            other => panic!("asked to fail ({other})"),
        });
    }
}
