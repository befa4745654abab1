//! A TCP relay from the root namespace's loopback into a lab namespace, so the operator's
//! `kubectl` (which runs in the root namespace) reaches the API server in the control-plane
//! namespace without any route or address being added to the root namespace. Each accepted
//! connection gets a socket created inside the lab namespace (sockets keep the namespace they
//! were made in) and two copying threads.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use crate::netns::in_netns;
use crate::{LabError, Result};

/// Listens on `127.0.0.1:<free port>` and forwards every connection to `target` inside
/// namespace `netns`. Writes the port to `ready_file` once listening. Runs until killed.
pub fn serve(netns: &str, target: SocketAddr, ready_file: &Path) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| LabError::io("relay: cannot listen on 127.0.0.1", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| LabError::io("relay: local address", e))?
        .port();
    let tmp = ready_file.with_extension("tmp");
    std::fs::File::create(&tmp)
        .and_then(|mut f| writeln!(f, "{port}"))
        .and_then(|_| std::fs::rename(&tmp, ready_file))
        .map_err(|e| LabError::io(format!("relay: cannot write {}", ready_file.display()), e))?;
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let ns = netns.to_string();
        std::thread::spawn(move || {
            let upstream = in_netns(&ns, || {
                TcpStream::connect_timeout(&target, Duration::from_secs(5))
            });
            match upstream {
                Ok(Ok(up)) => pipe(client, up),
                Ok(Err(e)) => eprintln!("relay: connect {target} in {ns}: {e}"),
                Err(e) => eprintln!("relay: {e}"),
            }
        });
    }
    Ok(())
}

/// Copies both directions until either side closes.
fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let t = std::thread::spawn(move || copy(a2, b2));
    copy(b, a);
    let _ = t.join();
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
