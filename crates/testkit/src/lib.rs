//! Tern's test harnesses, shared by every crate's integration tests, and the rule they hold:
//! **a test that cannot run fails saying what is missing; only kernel limits may skip, visibly
//! and counted.**
//!
//! - [`guard`] (re-exported here): [`need_root`], [`need_binary`], [`need`] panic naming the
//!   test, what is missing and how to get it, so a test has no early return; the one skip,
//!   [`skip_kernel_limit!`] ([`kernel_limit`]), prints `SKIP (kernel limit) <test>: ...` and
//!   appends it to the file named by `TERN_TEST_SKIP_LOG`, where `scripts/test.sh` counts it.
//!   There is no lenient mode: a guard that returns cannot end its test, and a test that passes
//!   without running is the failure this crate exists to prevent. Without root, run the tests
//!   that need nothing (`cargo test -p tern-model`, most `--lib` tests) or use `sudo -E`.
//!   `crates/testkit/tests/bare_returns.rs` fails on any other early `return` in a test file.
//! - [`binaries`]: executables on `PATH`, their packages, and the workspace's own binaries,
//!   checked current ([`workspace_binaries`]).
//! - [`netns`]: uniquely named network namespaces removed on drop, an underlay bridge, commands
//!   that must succeed, work run inside a namespace; [`wait`]: polling until a condition holds.
//! - [`ternd`]: `ternd` as a process in a test's namespace, with its socket, store and state
//!   under the test's directory, killed by PID on drop.
//! - [`kube_api`]: a real etcd and kube-apiserver (RBAC, client certificates, `kubectl`) in a
//!   test's namespace, for the tests named `*kube*`.
//! - [`child`] runs part of a test in child processes (the test binary re-executed in a role);
//!   [`golden`] is the shared runner of the golden replay tests (cases in folders, expected
//!   outputs compared line by line, rewritten with `TERN_GOLDEN_UPDATE=1`; `check_file` for one
//!   golden file); [`modules`] reads a crate's module graph for the test every crate has that
//!   keeps it acyclic; [`conformance`] holds the NetworkPolicy truth tables three suites replay;
//!   [`nft`] runs the `nft` binary for the kernel-comparing tests; [`rng`] is the seeded
//!   generator of the tests that make random inputs.
//!
//! A crate keeps in its own `tests/common` only what is its own (the plugin's CNI runs, the
//! agent's socket probes, the lab's teardown checks).
//!
//! ```no_run
//! #[test]
//! fn needs_root_and_etcd() {
//!     tern_testkit::need_root();
//!     let etcd = tern_testkit::need_binary("etcd");
//!     // ...
//! }
//! ```

pub mod binaries;
pub mod child;
pub mod conformance;
pub mod golden;
pub mod guard;
pub mod kube_api;
pub mod modules;
pub mod netns;
pub mod nft;
pub mod rng;
pub mod ternd;
pub mod wait;
pub mod webdriver;

pub use binaries::{WORKSPACE_BINARIES, find_binary, install_hint, workspace_binaries};
pub use guard::{
    KERNEL_LIMITS, SKIP_LOG_ENV, SkipLog, is_root, kernel_limit, need, need_binary,
    need_binary_how, need_root, test_name, thread_for_test,
};

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
