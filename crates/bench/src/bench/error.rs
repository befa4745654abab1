//! Everything that can stop the harness or one of its plugin sets, and the helpers that turn an I/O
//! failure or a failed command into it.

use std::path::PathBuf;
use std::process::Command;

use super::cni::CniCommand;

/// Everything that can stop the harness or one of its plugin sets.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or system call failed; `context` says which and on what.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An external command (`ip`, `strip`) could not run or exited unsuccessfully.
    #[error(transparent)]
    Command(#[from] tern_lab::LabError),
    /// The harness would act on the machine's own network namespace.
    #[error(
        "still in the host network namespace (net ns inode {0}); refusing to change it — \
         call enter_private_namespaces first"
    )]
    NotIsolated(u64),
    /// `ternd` exited or never opened its socket.
    #[error("ternd did not start: {0}")]
    AgentStart(String),
    /// A plugin printed something that is not a CNI result.
    #[error("invalid CNI result: {0}")]
    InvalidResult(String),
    /// A plugin returned a CNI error object.
    #[error("CNI error {code}: {msg}{}", if details.is_empty() { String::new() } else { format!(" ({details})") })]
    Plugin {
        /// The CNI error code.
        code: u64,
        /// The error message.
        msg: String,
        /// The optional details.
        details: String,
    },
    /// The plugin-set name is neither `ref` nor `tern`.
    #[error("unknown plugin set {0:?}: expected `ref` or `tern`")]
    UnknownPluginSet(String),
    /// A binary the plugin set needs does not exist.
    #[error("{0} not found (build it, or point --bin-dir / --ref-dir at it)")]
    MissingBinary(PathBuf),
    /// The warm-up ADD/DEL failed, so the plugin set cannot be measured.
    #[error("{plugin}: warm-up {command} failed: {reason}")]
    WarmUp {
        /// Label of the plugin set.
        plugin: String,
        /// ADD or DEL.
        command: CniCommand,
        /// Why it failed.
        reason: String,
    },
}

pub(super) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

pub(super) fn run(program: &str, args: &[&str]) -> Result<(), BenchError> {
    tern_lab::process::run(Command::new(program).args(args))?;
    Ok(())
}
