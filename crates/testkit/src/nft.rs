//! The `nft` binary as the tests that compare tern's tables with the kernel's run it: a script
//! applied with `nft -f -` and what a command prints, in the caller's network namespace or,
//! through `ip netns exec`, in a named one. Each must succeed; a failure panics with nft's
//! error (and the script).

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// `nft ARGS` in the caller's namespace, or in `netns` (`ip netns exec NETNS nft ARGS`),
/// with `stdin` written to it.
fn run(netns: Option<&str>, args: &[&str], stdin: Option<&str>) -> Output {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft"]);
            c
        }
        None => Command::new("nft"),
    };
    c.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c
        .spawn()
        .unwrap_or_else(|e| panic!("running nft {args:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("writing to nft {args:?}: {e}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for nft {args:?}: {e}"))
}

/// Applies `script` with `nft -f -` (in `netns` when given); panics with nft's error and the
/// script when nft refuses it.
fn apply_script(netns: Option<&str>, script: &str) {
    let out = run(netns, &["-f", "-"], Some(script));
    assert!(
        out.status.success(),
        "nft -f failed{}: {}\nscript:\n{script}",
        netns.map(|n| format!(" in {n}")).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Applies `script` with `nft -f -` in the caller's network namespace; it must succeed.
pub fn apply(script: &str) {
    apply_script(None, script);
}

/// Applies `script` with `nft -f -` inside the named namespace `netns`; it must succeed.
pub fn apply_in(netns: &str, script: &str) {
    apply_script(Some(netns), script);
}

/// What `nft ARGS` prints (in `netns` when given); panics with nft's error when it fails.
fn checked_output(netns: Option<&str>, args: &[&str]) -> String {
    let out = run(netns, args, None);
    assert!(
        out.status.success(),
        "nft {args:?}{}: {}",
        netns.map(|n| format!(" in {n}")).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `nft ARGS` prints in the caller's network namespace; it must succeed.
pub fn output(args: &[&str]) -> String {
    checked_output(None, args)
}

/// What `nft ARGS` prints inside the named namespace `netns`; it must succeed.
pub fn output_in(netns: &str, args: &[&str]) -> String {
    checked_output(Some(netns), args)
}

/// Whether `nft ARGS` succeeds in the caller's network namespace (for asserting that
/// something is gone).
pub fn succeeds(args: &[&str]) -> bool {
    run(None, args, None).status.success()
}
