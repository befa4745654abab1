//! Runs the `ternctl` binary of this build against a datastore, for the tests of commands that
//! need only a store (no lab, no kernel).

pub mod explain;

use std::process::Command;

/// `ternctl --store STORE ARGS...`: exit code, stdout and stderr.
pub fn ternctl(store: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ternctl"))
        .arg("--store")
        .arg(store)
        .args(args)
        .output()
        .expect("running ternctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
