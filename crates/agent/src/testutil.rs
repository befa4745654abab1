//! Helpers of the modules' unit tests.

use std::collections::BTreeMap;
use tern_linux::netlink::Handle;
use tern_linux::netns::NetNs;
use tern_model::{EndpointPort, Protocol};

/// Runs `f` in a new network namespace (never the machine's) on a thread of its own, with a
/// netlink handle in it and the namespace itself; the test fails unless it runs as root.
pub fn in_new_netns(f: impl FnOnce(&mut Handle, &NetNs) + Send) {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "needs root to create a network namespace"
    );
    tern_linux::netns::run_in_new(|| {
        let mut h = Handle::new().unwrap();
        let here = NetNs::current().unwrap();
        f(&mut h, &here)
    })
    .unwrap();
}

/// A named port, as an endpoint's `ports` hold it.
pub fn port(name: &str, port: u16, protocol: Protocol) -> EndpointPort {
    EndpointPort {
        name: name.into(),
        protocol,
        port,
    }
}

/// The value of label `key`, if set.
pub fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    labels.get(key).map(String::as_str)
}
