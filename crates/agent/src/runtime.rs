//! The threads of the agent's async services (the BGP speaker, the Kubernetes source): each
//! runs its own current-thread tokio runtime, so the rest of the agent stays synchronous.

use std::future::Future;

/// Spawns the thread `name`, which builds a current-thread runtime and runs the future `f`
/// makes (given the runtime's handle) to its end. A runtime that cannot be built is logged,
/// as `what`, and ends the thread.
pub fn spawn_current_thread<F, Fut>(name: &str, what: &str, f: F) -> std::io::Result<()>
where
    F: FnOnce(&tokio::runtime::Handle) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let what = what.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    log::error!("{what}: cannot build the runtime: {e}");
                    return;
                }
            };
            let fut = f(rt.handle());
            rt.block_on(fut);
        })
        .map(|_| ())
}
