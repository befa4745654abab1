//! Termination signals for a process that may be PID 1 of its container.
//!
//! A PID 1 without a handler ignores SIGTERM, so a pod's termination would wait for its grace
//! period and SIGKILL. Both `ternd` and `ternctl install-cni --stay` block SIGTERM and SIGINT and
//! wait for them on a thread of their own with `sigwait` (no async-signal-safety concerns: the
//! callback runs on an ordinary thread).

use std::io;

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread started after it;
/// call it before starting other threads) and starts a thread named `signals` that waits for
/// them and calls `on_signal` with the signal's number, or with the error of `sigwait`.
pub fn on_termination<F>(on_signal: F) -> io::Result<()>
where
    F: FnOnce(io::Result<libc::c_int>) + Send + 'static,
{
    // SAFETY: the sigset is initialised by sigemptyset before use; pthread_sigmask only reads
    // it and changes the calling thread's mask.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid, initialised sigset; `sig` is a valid out pointer.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            on_signal(if rc == 0 {
                Ok(sig)
            } else {
                Err(io::Error::from_raw_os_error(rc))
            });
        })?;
    Ok(())
}
