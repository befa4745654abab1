//! The pod-lifecycle service: everything between "a plugin asked for a pod's network" and "the
//! pod has an interface, addresses and an endpoint record", and back.
//!
//! It owns its state: the IPAM client, the endpoint cache, the in-flight claims (host
//! interfaces and IPAM handles an operation is working on), the veth reaper, the release
//! journal's retry flag and the leak tracker. The root ([`crate::Agent`]) builds it with a
//! kernel opener ([`OpenKernel`]: the real netlink in ternd, `tern_linux::fake::FakeKernel` in
//! unit tests) and the two hooks it needs from other services ([`EndpointPolicy`],
//! [`PodSource`]), and the socket server dispatches to it.
//!
//! - [`add`]: ADD: allocate, wire, record, each step undone by a guard ([`crate::undo`]) when a
//!   later one fails;
//! - [`release`]: DEL, GC, standalone IPAM, and the release journal's replay;
//! - [`check`]: CHECK and the datastore half of STATUS;
//! - [`repair`]: the reconciliation of endpoints against the node's interfaces (repair, release,
//!   the orphan sweep) and leak repair ([`leak`]).

pub mod add;
pub mod check;
mod errors;
pub mod leak;
pub mod release;
pub mod repair;

use crate::claims::Claims;
use crate::endpoints::{Endpoint, Endpoints};
use crate::reaper::Reaper;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tern_api::{Attachment, ErrorReply, IpamRequest};
use tern_ipam::Ipam;
use tern_linux::kernel::{Links, PodKernel};
use tern_store::Store;

pub use errors::{ipam_err, store_err};
pub use repair::Report;

/// Opens the kernel of the node's namespace for one operation (a netlink socket for ternd).
pub type OpenKernel = Arc<dyn Fn() -> tern_linux::Result<Box<dyn PodKernel>> + Send + Sync>;

/// The real kernel: a netlink socket in the calling thread's namespace.
pub fn system_kernel() -> OpenKernel {
    Arc::new(|| Ok(Box::new(tern_linux::netlink::Handle::new()?) as Box<dyn PodKernel>))
}

/// What the policy service does for a pod's endpoint: its chains before the pod can send.
pub trait EndpointPolicy: Send + Sync {
    /// The endpoint's rules, set elements and map entries, in force on return.
    fn endpoint_added(&self, ep: &Endpoint) -> Result<(), String>;
    /// Removes them (nothing to remove is success).
    fn endpoint_removed(&self, namespace: &str, name: &str) -> Result<(), String>;
}

/// What the Kubernetes source tells an ADD about its pod.
pub struct PodForAdd {
    /// The pod's namespace and name (named in errors).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Addresses the pod's annotations fix without IPAM (`no_ipam`).
    pub no_ipam: Option<Vec<IpAddr>>,
    /// Applies the pod's labels and named ports to the endpoint about to be recorded.
    pub apply: Box<dyn FnOnce(&mut Endpoint) + Send>,
}

/// The Kubernetes source, as the pod lifecycle asks it.
pub trait PodSource: Send + Sync {
    /// The pod of an ADD (None without pod arguments or when unknown), its IPAM annotations
    /// applied to `ipam`; refused ("try again", a bad annotation) before anything is made.
    fn pod_for_add(
        &self,
        a: &Attachment,
        ipam: &mut IpamRequest,
        delegated: bool,
    ) -> Result<Option<PodForAdd>, ErrorReply>;
    /// The endpoint of an ADD was recorded.
    fn endpoint_recorded(&self, ep: &Endpoint);
}

/// What the service is told at start.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// This node's name.
    pub node_name: String,
    /// Prefix of the host veths (`--interface-prefix`).
    pub interface_prefix: String,
    /// Where the release journal lives.
    pub state_dir: PathBuf,
    /// `--accept-new-store`: the orphan sweep may delete live pods the store does not know.
    pub accept_new_store: bool,
    /// How long an allocation must look leaked before leak repair releases it.
    pub leak_grace: Duration,
}

/// The pod-lifecycle service; see the module documentation.
pub struct PodLifecycle {
    cfg: PodConfig,
    store: Arc<dyn Store>,
    ipam: Ipam,
    endpoints: Endpoints,
    /// Host interfaces being created by an ADD that has not yet recorded its endpoint; the
    /// reconciler must not mistake them for leftovers.
    in_flight: Claims,
    /// IPAM handles of ADDs (tern and standalone IPAM) between "about to allocate" and
    /// "endpoint recorded / reply sent": leak repair must not take their addresses.
    in_flight_handles: Claims,
    /// Host interfaces a DEL has detached and the reaper thread has yet to delete.
    reaper: Reaper,
    /// Leak-repair suspects and when they were first seen.
    leaks: leak::LeakTracker,
    /// Set when a release was journaled: the maintenance loop retries every few seconds until
    /// the journal is empty, instead of waiting for the next resync.
    journal_dirty: AtomicBool,
    /// (st_dev, st_ino) of the namespaces no pod may be wired into.
    host_netns: Vec<(u64, u64)>,
    /// Why the last sweep kept pod interfaces the store does not know (the mass-deletion
    /// guard), for `/readiness`.
    orphan_problem: Mutex<Option<String>>,
    kernel: OpenKernel,
    policy: Option<Arc<dyn EndpointPolicy>>,
    pods: Option<Arc<dyn PodSource>>,
}

/// What [`PodLifecycle::new`] is built from besides its configuration.
pub struct PodParts {
    /// The datastore (IPAM, owner records).
    pub store: Arc<dyn Store>,
    /// The node's endpoint cache, loaded.
    pub endpoints: Endpoints,
    /// The kernel of the node's namespace.
    pub kernel: OpenKernel,
    /// The policy service, when enforcing.
    pub policy: Option<Arc<dyn EndpointPolicy>>,
    /// The Kubernetes source, with `--kubernetes`.
    pub pods: Option<Arc<dyn PodSource>>,
    /// The namespaces no pod may be wired into ([`host_netns_ids`] in ternd).
    pub host_netns: Vec<(u64, u64)>,
}

impl PodLifecycle {
    /// The service, with its reaper thread started on `parts.kernel`.
    pub fn new(cfg: PodConfig, parts: PodParts) -> std::io::Result<PodLifecycle> {
        let open = parts.kernel.clone();
        let reaper = Reaper::start_with(Arc::new(move || open().map(|k| k as Box<dyn Links>)))?;
        Ok(PodLifecycle {
            ipam: Ipam::new(parts.store.clone()),
            cfg,
            store: parts.store,
            endpoints: parts.endpoints,
            in_flight: Claims::default(),
            in_flight_handles: Claims::default(),
            reaper,
            leaks: leak::LeakTracker::default(),
            journal_dirty: AtomicBool::new(false),
            host_netns: parts.host_netns,
            orphan_problem: Mutex::new(None),
            kernel: parts.kernel,
            policy: parts.policy,
            pods: parts.pods,
        })
    }

    /// The host-side veth name of an attachment.
    pub fn host_ifname(&self, a: &Attachment) -> String {
        let pod = a
            .pod
            .as_ref()
            .map(|p| (p.namespace.as_str(), p.name.as_str()));
        tern_linux::attachment_veth_name(
            &self.cfg.interface_prefix,
            pod,
            &a.container_id,
            &a.ifname,
        )
    }

    /// The IPAM client.
    pub fn ipam(&self) -> &Ipam {
        &self.ipam
    }

    /// The node's endpoints now.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.endpoints.all()
    }

    /// How many endpoints the node has.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether a release waits in the journal (the maintenance loop then retries soon).
    pub fn journal_dirty(&self) -> bool {
        self.journal_dirty.load(Ordering::Relaxed)
    }

    /// Sets or clears [`PodLifecycle::journal_dirty`].
    pub fn set_journal_dirty(&self, dirty: bool) {
        self.journal_dirty.store(dirty, Ordering::Relaxed);
    }

    /// Why the last sweep kept pod interfaces, if it did (for `/readiness`).
    pub fn orphan_problem(&self) -> Option<String> {
        self.orphan_problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The namespaces no pod may be wired into.
    pub fn host_netns(&self) -> &[(u64, u64)] {
        &self.host_netns
    }

    fn kernel(&self) -> tern_linux::Result<Box<dyn PodKernel>> {
        (self.kernel)()
    }
}

/// (st_dev, st_ino) of an open file: two namespace files with equal pairs are one namespace.
fn file_id(fd: BorrowedFd<'_>) -> std::io::Result<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the call and st is ours to write.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// The namespaces no pod may be wired into: the calling thread's (the agent's, i.e. the node's)
/// and PID 1's when readable and different.
pub fn host_netns_ids() -> Vec<(u64, u64)> {
    let mut ids = Vec::new();
    for p in ["/proc/thread-self/ns/net", "/proc/1/ns/net"] {
        match std::fs::File::open(p).and_then(|f| file_id(f.as_fd())) {
            Ok(id) if !ids.contains(&id) => ids.push(id),
            Ok(_) => {}
            Err(e) => log::debug!("cannot identify {p}: {e}"),
        }
    }
    ids
}

/// Checks that a received descriptor is a network namespace (nsfs, `NS_GET_NSTYPE` ==
/// `CLONE_NEWNET`) and none of `host` (the node's own). The message names CNI_NETNS.
pub fn check_netns_fd(fd: BorrowedFd<'_>, host: &[(u64, u64)]) -> Result<(), String> {
    use tern_linux::netns::NsFileError;
    match tern_linux::netns::check_net_namespace(fd) {
        Ok(()) => {}
        Err(NsFileError::NotNsfs(t)) => {
            return Err(format!(
                "CNI_NETNS: the descriptor passed is not a namespace file (filesystem type {t:#x}); a network namespace is required"
            ));
        }
        Err(NsFileError::NotNet(kind)) => {
            return Err(format!(
                "CNI_NETNS: the descriptor passed is a namespace but not a network namespace (type {kind:#x})"
            ));
        }
        Err(e) => {
            return Err(format!(
                "CNI_NETNS: cannot inspect the descriptor passed: {e}"
            ));
        }
    }
    let id = file_id(fd).map_err(|e| format!("CNI_NETNS: cannot inspect the namespace: {e}"))?;
    if host.contains(&id) {
        return Err(
            "CNI_NETNS is the node's own network namespace (ternd's): a pod interface is never wired into the host"
                .to_string(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
