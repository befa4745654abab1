//! The CNI benchmark harness behind `tern-bench cni`.
//!
//! It times plugin executions exactly as a container runtime performs them (environment variables,
//! network configuration on stdin, result on stdout) for tern and, in the same run, for the
//! reference `ptp` + `host-local` plugins, so the figures are comparable on one machine.
//!
//! Safety: everything happens inside a private network and mount namespace entered with
//! [`enter_private_namespaces`]; [`setup_bench_host`] refuses to run in PID 1's network namespace.
//! Pods are network namespaces bind-mounted into a temporary directory, so nothing is left on the
//! machine: the mounts die with the private mount namespace even if the harness crashes.
//!
//! Only the plugin executions are timed; namespace creation, `ip` set-up and the runtime's result
//! cache are not.

use std::collections::HashSet;
use std::ffi::CString;
use std::fmt;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian's `containernetworking-plugins` package installs the reference plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";
/// The CNI version every configuration is sent with.
pub const CNI_VERSION: &str = "1.0.0";
/// The interface name requested inside every pod, as kubelet does.
pub const POD_IFNAME: &str = "eth0";
/// Subnet given to host-local for the reference plugins (exists only inside the bench namespace).
pub const REFERENCE_SUBNET: &str = "10.250.0.0/16";
/// The bench namespace's uplink address; from the benchmarking range 198.18.0.0/15.
pub const UPLINK_ADDR: &str = "198.18.0.1/30";
/// The default route's gateway, on the uplink's subnet.
pub const UPLINK_GATEWAY: &str = "198.18.0.2";
/// Name of the uplink veth (its peer is `UPLINK_IF` + "p").
pub const UPLINK_IF: &str = "tbench0";

/// Targets from the issue, checked for the tern plugin set.
pub mod targets {
    use std::time::Duration;
    /// ADD p50 (sequential pods).
    pub const ADD_P50: Duration = Duration::from_millis(3);
    /// DEL p50 (sequential pods).
    pub const DEL_P50: Duration = Duration::from_millis(3);
    /// Stripped size of the `tern` plugin binary.
    pub const TERN_BINARY_BYTES: u64 = 5 * 1024 * 1024;
    /// Resident memory of an idle `ternd`, in KiB.
    pub const TERND_IDLE_RSS_KIB: u64 = 20 * 1024;
}

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

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let context = context.into();
    move |source| BenchError::Io { context, source }
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// Nearest-rank percentile: the smallest sample such that at least `p` percent of all samples are
/// less than or equal to it. `None` for no samples or `p` outside (0, 100].
pub fn percentile(samples: &[Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    // p * n / 100 rather than p / 100 * n: 0.99 is not exact in binary and would round up a rank.
    let rank = (p * sorted.len() as f64 / 100.0).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Latency summary of one phase; percentiles cover successful executions only, since a fast
/// failure would flatter the figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Executions attempted.
    pub n: usize,
    /// Executions that succeeded.
    pub ok: usize,
    /// Median latency of the successful executions.
    pub p50: Option<Duration>,
    /// 99th percentile latency of the successful executions.
    pub p99: Option<Duration>,
    /// Slowest successful execution.
    pub max: Option<Duration>,
}

impl Summary {
    /// Summarises `ok_samples` (latencies of the successful executions) out of `n` attempts.
    pub fn new(n: usize, ok_samples: &[Duration]) -> Summary {
        Summary {
            n,
            ok: ok_samples.len(),
            p50: percentile(ok_samples, 50.0),
            p99: percentile(ok_samples, 99.0),
            max: ok_samples.iter().max().copied(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CNI results
// ---------------------------------------------------------------------------------------------

/// Returns the `ips[].address` entries (CIDR notation) of a CNI ADD result.
///
/// A CNI error object (`{"code":..,"msg":..}`) becomes [`BenchError::Plugin`]; a result without
/// addresses or with a malformed address is [`BenchError::InvalidResult`].
pub fn parse_result_ips(stdout: &[u8]) -> Result<Vec<String>, BenchError> {
    let value: Value = serde_json::from_slice(stdout)
        .map_err(|e| BenchError::InvalidResult(format!("not JSON ({e}): {:?}", snippet(stdout))))?;
    if let Some(err) = parse_cni_error(&value) {
        return Err(err);
    }
    let ips = value
        .get("ips")
        .and_then(Value::as_array)
        .ok_or_else(|| BenchError::InvalidResult("no `ips` list in the result".into()))?;
    if ips.is_empty() {
        return Err(BenchError::InvalidResult("the `ips` list is empty".into()));
    }
    ips.iter()
        .map(|ip| {
            let address = ip.get("address").and_then(Value::as_str).ok_or_else(|| {
                BenchError::InvalidResult(format!("ips entry without an address: {ip}"))
            })?;
            validate_cidr(address)?;
            Ok(address.to_string())
        })
        .collect()
}

fn validate_cidr(address: &str) -> Result<(), BenchError> {
    let bad = || BenchError::InvalidResult(format!("address {address:?} is not IP/prefix"));
    let (ip, prefix) = address.split_once('/').ok_or_else(bad)?;
    let ip: IpAddr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(bad());
    }
    Ok(())
}

fn parse_cni_error(value: &Value) -> Option<BenchError> {
    let code = value.get("code")?.as_u64()?;
    let text = |key| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    Some(BenchError::Plugin {
        code,
        msg: text("msg"),
        details: text("details"),
    })
}

/// Explains a failed execution: the CNI error on stdout if there is one, else stderr, else the
/// exit status.
pub fn describe_failure(status: &str, stdout: &[u8], stderr: &[u8]) -> String {
    if let Some(err) = serde_json::from_slice::<Value>(stdout)
        .ok()
        .as_ref()
        .and_then(parse_cni_error)
    {
        return format!("{err} [{status}]");
    }
    let stderr = snippet(stderr);
    if stderr.is_empty() {
        let stdout = snippet(stdout);
        if stdout.is_empty() {
            status.to_string()
        } else {
            format!("{stdout} [{status}]")
        }
    } else {
        format!("{stderr} [{status}]")
    }
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Namespaces
// ---------------------------------------------------------------------------------------------

fn netns_inode(path: &str) -> Result<u64, BenchError> {
    Ok(std::fs::metadata(path)
        .map_err(io_err(format!("stat {path}")))?
        .ino())
}

fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> Result<(), BenchError> {
    let cstr = |s: &str| CString::new(s).expect("mount arguments contain no NUL");
    let source = source.map(cstr);
    let fstype = fstype.map(cstr);
    let target_c = cstr(&target.to_string_lossy());
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(BenchError::Io {
            context: format!("mount {:?} on {}", source, target.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Inode of the network namespace [`enter_private_namespaces`] left; 0 until it has run.
static HOST_NETNS: AtomicU64 = AtomicU64::new(0);

/// Moves the calling thread into a new network and mount namespace.
///
/// Call it first thing in `main` (before any thread exists) so every thread and process the
/// harness starts inherits the namespaces; tests call it on a dedicated thread. Mount propagation
/// is made private before anything is mounted so no mount leaks back to the machine, and `/sys`
/// is remounted so `/sys/class/net` describes the new namespace.
pub fn enter_private_namespaces() -> Result<(), BenchError> {
    let before = netns_inode("/proc/thread-self/ns/net")?;
    // SAFETY: unshare has no memory-safety preconditions; it only changes this thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWNS) } != 0 {
        return Err(BenchError::Io {
            context: "unshare(CLONE_NEWNET | CLONE_NEWNS) (tern-bench must run as root)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    mount(None, Path::new("/"), None, libc::MS_REC | libc::MS_PRIVATE)?;
    let after = netns_inode("/proc/thread-self/ns/net")?;
    HOST_NETNS.store(before, Ordering::SeqCst);
    if after == before {
        return Err(BenchError::NotIsolated(after));
    }
    if let Err(e) = mount(Some("sysfs"), Path::new("/sys"), Some("sysfs"), 0) {
        // Not fatal: the plugins use netlink; only tools reading /sys would be misled.
        log::warn!("could not remount /sys in the bench namespace: {e}");
    }
    Ok(())
}

/// Fails unless [`enter_private_namespaces`] has run and the calling thread is in neither the
/// namespace it left nor (when readable: it is not in every sandbox) PID 1's.
pub fn ensure_isolated() -> Result<(), BenchError> {
    let ours = netns_inode("/proc/thread-self/ns/net")?;
    let left = HOST_NETNS.load(Ordering::SeqCst);
    let pid1 = netns_inode("/proc/1/ns/net").ok();
    if left == 0 || ours == left || pid1 == Some(ours) {
        return Err(BenchError::NotIsolated(ours));
    }
    Ok(())
}

fn run(program: &str, args: &[&str]) -> Result<(), BenchError> {
    tern_lab::process::run(Command::new(program).args(args))?;
    Ok(())
}

/// Prepares the bench namespace as a node: `lo` up and a default route via a veth addressed from
/// 198.18.0.0/15 (the kernel has no dummy module). Refuses to run in PID 1's network namespace.
pub fn setup_bench_host() -> Result<(), BenchError> {
    ensure_isolated()?;
    let peer = format!("{UPLINK_IF}p");
    run("ip", &["link", "set", "lo", "up"])?;
    run(
        "ip",
        &[
            "link", "add", UPLINK_IF, "type", "veth", "peer", "name", &peer,
        ],
    )?;
    run("ip", &["addr", "add", UPLINK_ADDR, "dev", UPLINK_IF])?;
    run("ip", &["link", "set", &peer, "up"])?;
    run("ip", &["link", "set", UPLINK_IF, "up"])?;
    run(
        "ip",
        &[
            "route",
            "add",
            "default",
            "via",
            UPLINK_GATEWAY,
            "dev",
            UPLINK_IF,
        ],
    )?;
    Ok(())
}

/// A pod's network namespace, bind-mounted on a file; unmounted and removed on drop.
#[derive(Debug)]
pub struct PodNetns {
    path: PathBuf,
}

impl PodNetns {
    /// Creates a new network namespace and pins it at `path` (a file that must not exist yet).
    pub fn create(path: &Path) -> Result<PodNetns, BenchError> {
        std::fs::File::create_new(path).map_err(io_err(format!("create {}", path.display())))?;
        // From here on, drop cleans up whatever exists.
        let netns = PodNetns {
            path: path.to_owned(),
        };
        let target = netns.path.clone();
        // A dedicated thread enters the new namespace so no other thread's namespace changes; the
        // bind mount keeps the namespace alive after the thread exits.
        let (_ns, mounted) = tern_linux::netns::run_in_new(|| {
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None,
                libc::MS_BIND,
            )
        })
        .map_err(|e| BenchError::Io {
            context: format!("unshare(CLONE_NEWNET) for pod {}", target.display()),
            source: match e {
                tern_linux::LinuxError::Io { source, .. } => source,
                e => std::io::Error::other(e.to_string()),
            },
        })?;
        mounted?;
        Ok(netns)
    }

    /// The path given to plugins as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if let Ok(target) = CString::new(self.path.to_string_lossy().as_bytes()) {
            // SAFETY: target is a valid NUL-terminated path. EINVAL (not mounted) is fine here.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------------------------
// Plugins and their execution
// ---------------------------------------------------------------------------------------------

/// A CNI command the harness issues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CniCommand {
    /// `CNI_COMMAND=ADD`.
    Add,
    /// `CNI_COMMAND=DEL`.
    Del,
}

impl fmt::Display for CniCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
        })
    }
}

/// Which plugins to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginSet {
    /// The reference `ptp` + `host-local` plugins.
    Reference,
    /// `tern` + `tern-ipam`, served by a `ternd` started for the run.
    Tern,
}

impl FromStr for PluginSet {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<PluginSet, BenchError> {
        match s.trim() {
            "ref" | "reference" => Ok(PluginSet::Reference),
            "tern" => Ok(PluginSet::Tern),
            other => Err(BenchError::UnknownPluginSet(other.to_string())),
        }
    }
}

impl fmt::Display for PluginSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            PluginSet::Reference => "ref",
            PluginSet::Tern => "tern",
        })
    }
}

/// A plugin as a runtime sees it: a binary, a `CNI_PATH` and a network configuration.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// Label in the results table.
    pub label: String,
    /// The main plugin binary that is executed.
    pub binary: PathBuf,
    /// `CNI_PATH`, where the plugin finds its IPAM plugin.
    pub cni_path: String,
    /// The network configuration sent on stdin (with `cniVersion` and `name`).
    pub conf: Value,
}

impl Plugin {
    /// `ptp` with `host-local` IPAM on [`REFERENCE_SUBNET`], keeping its leases in `data_dir`.
    pub fn reference(ref_dir: &Path, data_dir: &Path) -> Plugin {
        Plugin {
            label: PluginSet::Reference.to_string(),
            binary: ref_dir.join("ptp"),
            cni_path: ref_dir.to_string_lossy().into_owned(),
            conf: json!({
                "cniVersion": CNI_VERSION,
                "name": "bench-ref",
                "type": "ptp",
                "ipam": {
                    "type": "host-local",
                    "subnet": REFERENCE_SUBNET,
                    "dataDir": data_dir,
                },
            }),
        }
    }

    /// `tern` with `tern-ipam`, talking to the agent on `socket`.
    pub fn tern(bin_dir: &Path, socket: &Path, state_dir: &Path) -> Plugin {
        Plugin {
            label: PluginSet::Tern.to_string(),
            binary: bin_dir.join("tern"),
            cni_path: bin_dir.to_string_lossy().into_owned(),
            conf: json!({
                "cniVersion": CNI_VERSION,
                "name": "bench-tern",
                "type": "tern",
                "agent_socket": socket,
                "state_dir": state_dir,
                "ipam": { "type": "tern-ipam" },
            }),
        }
    }

    /// The network name from the configuration.
    pub fn network_name(&self) -> &str {
        self.conf.get("name").and_then(Value::as_str).unwrap_or("")
    }
}

/// One pod: its sandbox ID, Kubernetes name and network namespace.
#[derive(Debug)]
pub struct Pod {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `K8S_POD_NAME` (namespace is always `bench`).
    pub name: String,
    /// `CNI_NETNS`.
    pub netns: PodNetns,
}

static POD_COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Pod {
    /// Creates a pod with a fresh network namespace under `dir`; names are unique in the process.
    pub fn create(dir: &Path) -> Result<Pod, BenchError> {
        let i = POD_COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("benchpod-{pid}-{i}");
        let netns = PodNetns::create(&dir.join(&name))?;
        Ok(Pod {
            container_id: format!("bench{pid:08x}{i:08x}"),
            name,
            netns,
        })
    }
}

/// The outcome of one timed plugin execution.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// From spawn to exit, including writing stdin and reading stdout.
    pub elapsed: Duration,
    /// For ADD: the parsed result (addresses) and the raw result; for DEL: empty. `Err` explains
    /// a failure.
    pub outcome: Result<AddResult, String>,
}

/// What a successful ADD returned.
#[derive(Debug, Clone, Default)]
pub struct AddResult {
    /// `ips[].address`.
    pub addresses: Vec<String>,
    /// The whole result, kept for DEL's `prevResult`.
    pub raw: Value,
}

/// Executes `plugin` for `pod` as a runtime does and times it from spawn to exit.
///
/// DEL sends `prev_result` as `prevResult`, as libcni does from its cache for CNI >= 0.4.0.
pub fn invoke(
    plugin: &Plugin,
    command: CniCommand,
    pod: &Pod,
    prev_result: Option<&Value>,
) -> Invocation {
    let mut conf = plugin.conf.clone();
    if let (CniCommand::Del, Some(prev), Some(obj)) = (command, prev_result, conf.as_object_mut()) {
        obj.insert("prevResult".into(), prev.clone());
    }
    let stdin = conf.to_string();
    let cni_args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
        pod.name, pod.container_id
    );
    let mut cmd = Command::new(&plugin.binary);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command.to_string())
        .env("CNI_CONTAINERID", &pod.container_id)
        .env("CNI_NETNS", pod.netns.path())
        .env("CNI_IFNAME", POD_IFNAME)
        .env("CNI_PATH", &plugin.cni_path)
        .env("CNI_ARGS", cni_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    let start = Instant::now();
    let output = cmd.spawn().and_then(|mut child| {
        // The conf is far below the pipe buffer, so writing before reading cannot deadlock.
        let written = child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(stdin.as_bytes());
        let output = child.wait_with_output()?;
        // A plugin may exit without reading stdin (EPIPE); its exit status tells the story.
        if let Err(e) = written {
            log::debug!("writing the conf to {}: {e}", plugin.binary.display());
        }
        Ok(output)
    });
    let elapsed = start.elapsed();

    let outcome = match output {
        Err(e) => Err(format!("could not run {}: {e}", plugin.binary.display())),
        Ok(out) if !out.status.success() => Err(describe_failure(
            &status_text(out.status),
            &out.stdout,
            &out.stderr,
        )),
        Ok(out) => match command {
            CniCommand::Del => Ok(AddResult::default()),
            CniCommand::Add => parse_result_ips(&out.stdout)
                .map(|addresses| AddResult {
                    addresses,
                    raw: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
                })
                .map_err(|e| e.to_string()),
        },
    };
    Invocation { elapsed, outcome }
}

fn status_text(status: ExitStatus) -> String {
    status.to_string()
}

/// The runtime's result cache (libcni's `results/<network>-<container>-<ifname>`), kept in a
/// temporary directory: never `/var/lib/cni`.
#[derive(Debug, Clone)]
pub struct ResultCache {
    dir: PathBuf,
}

impl ResultCache {
    /// A cache rooted at `dir` (created if needed).
    pub fn new(dir: &Path) -> Result<ResultCache, BenchError> {
        let dir = dir.join("results");
        std::fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        Ok(ResultCache { dir })
    }

    fn file(&self, network: &str, container_id: &str) -> PathBuf {
        self.dir
            .join(format!("{network}-{container_id}-{POD_IFNAME}"))
    }

    /// Records a successful ADD the way libcni does (`kind: cniCacheV1`).
    pub fn store(&self, plugin: &Plugin, pod: &Pod, result: &Value) -> Result<(), BenchError> {
        let entry = json!({
            "kind": "cniCacheV1",
            "containerId": pod.container_id,
            "ifName": POD_IFNAME,
            "networkName": plugin.network_name(),
            "netns": pod.netns.path(),
            "result": result,
        });
        let path = self.file(plugin.network_name(), &pod.container_id);
        std::fs::write(&path, entry.to_string())
            .map_err(io_err(format!("write {}", path.display())))
    }

    /// The cached result for DEL's `prevResult`; `None` when absent or unreadable (libcni then
    /// proceeds without one).
    pub fn load(&self, plugin: &Plugin, pod: &Pod) -> Option<Value> {
        let text = std::fs::read(self.file(plugin.network_name(), &pod.container_id)).ok()?;
        let mut entry: Value = serde_json::from_slice(&text).ok()?;
        entry.get_mut("result").map(Value::take)
    }

    /// Forgets a pod after its DEL.
    pub fn remove(&self, plugin: &Plugin, pod: &Pod) {
        let _ = std::fs::remove_file(self.file(plugin.network_name(), &pod.container_id));
    }

    /// What a runtime passes before `command` (untimed): a DEL gets the cached ADD result as
    /// `prevResult`.
    fn before(&self, plugin: &Plugin, pod: &Pod, command: CniCommand) -> Option<Value> {
        match command {
            CniCommand::Del => self.load(plugin, pod),
            CniCommand::Add => None,
        }
    }

    /// What a runtime records after `command` (untimed): a successful ADD's result is cached,
    /// a successful DEL forgets it.
    fn after(&self, plugin: &Plugin, pod: &Pod, command: CniCommand, invocation: &Invocation) {
        match (command, &invocation.outcome) {
            (CniCommand::Add, Ok(result)) => {
                if let Err(e) = self.store(plugin, pod, &result.raw) {
                    log::warn!("{e}");
                }
            }
            (CniCommand::Del, Ok(_)) => self.remove(plugin, pod),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------------------------

/// A measured phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// ADD for each pod, one after another.
    Add,
    /// DEL for each of those pods, one after another.
    Del,
    /// ADDs started together from a barrier, one thread each.
    AddConcurrent,
    /// DELs of the concurrent pods, started together.
    DelConcurrent,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Phase::Add => "add",
            Phase::Del => "del",
            Phase::AddConcurrent => "add-concurrent",
            Phase::DelConcurrent => "del-concurrent",
        })
    }
}

/// The figures of one phase of one plugin set.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    /// Plugin-set label.
    pub plugin: String,
    /// Which phase.
    pub phase: Phase,
    /// Latencies.
    pub summary: Summary,
    /// For concurrent phases: first start to last exit.
    pub wall: Option<Duration>,
    /// For ADD phases: whether every returned address was distinct.
    pub distinct_addresses: Option<bool>,
    /// The first few failure messages (count in `summary`).
    pub errors: Vec<String>,
    /// `CNI_CONTAINERID` of every pod of the phase (to find its requests in ternd's log).
    pub container_ids: Vec<String>,
}

const MAX_ERRORS_KEPT: usize = 3;

fn phase_result(
    plugin: &Plugin,
    phase: Phase,
    invocations: &[Invocation],
    wall: Option<Duration>,
) -> PhaseResult {
    let ok: Vec<Duration> = invocations
        .iter()
        .filter(|i| i.outcome.is_ok())
        .map(|i| i.elapsed)
        .collect();
    let errors = invocations
        .iter()
        .filter_map(|i| i.outcome.as_ref().err().cloned())
        .take(MAX_ERRORS_KEPT)
        .collect();
    let distinct_addresses = matches!(phase, Phase::Add | Phase::AddConcurrent).then(|| {
        let all: Vec<&String> = invocations
            .iter()
            .filter_map(|i| i.outcome.as_ref().ok())
            .flat_map(|r| &r.addresses)
            .collect();
        all.iter().collect::<HashSet<_>>().len() == all.len()
    });
    PhaseResult {
        plugin: plugin.label.clone(),
        phase,
        summary: Summary::new(invocations.len(), &ok),
        wall,
        distinct_addresses,
        errors,
        container_ids: Vec::new(),
    }
}

/// How much work one plugin set gets.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Pods added then deleted one after another.
    pub pods: usize,
    /// Pods added (then deleted) concurrently.
    pub concurrency: usize,
}

fn create_pods(dir: &Path, count: usize) -> Result<Vec<Pod>, BenchError> {
    (0..count).map(|_| Pod::create(dir)).collect()
}

fn sequential(
    plugin: &Plugin,
    cache: &ResultCache,
    pods: &[Pod],
    command: CniCommand,
) -> Vec<Invocation> {
    pods.iter()
        .map(|pod| run_one(plugin, cache, pod, command))
        .collect()
}

/// One execution plus the runtime's cache bookkeeping, which is outside the timed span.
fn run_one(plugin: &Plugin, cache: &ResultCache, pod: &Pod, command: CniCommand) -> Invocation {
    let prev = cache.before(plugin, pod, command);
    let invocation = invoke(plugin, command, pod, prev.as_ref());
    cache.after(plugin, pod, command, &invocation);
    invocation
}

/// Runs one execution per pod, each on its own thread, all released together by a barrier.
/// Returns the invocations in pod order and the wall time from first start to last exit.
fn concurrent(
    plugin: &Plugin,
    cache: &ResultCache,
    pods: &[Pod],
    command: CniCommand,
) -> (Vec<Invocation>, Duration) {
    let barrier = Barrier::new(pods.len());
    let (invocations, spans): (Vec<Invocation>, Vec<(Instant, Instant)>) =
        std::thread::scope(|scope| {
            let handles: Vec<_> = pods
                .iter()
                .map(|pod| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let prev = cache.before(plugin, pod, command);
                        barrier.wait();
                        let start = Instant::now();
                        let invocation = invoke(plugin, command, pod, prev.as_ref());
                        let end = Instant::now();
                        (invocation, (start, end))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("bench thread does not panic"))
                .unzip()
        });
    for (pod, invocation) in pods.iter().zip(&invocations) {
        cache.after(plugin, pod, command, invocation);
    }
    let first = spans.iter().map(|s| s.0).min();
    let last = spans.iter().map(|s| s.1).max();
    let wall = match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    };
    (invocations, wall)
}

/// Measures one plugin set: a warm-up ADD+DEL (not counted, so the page cache and the agent are
/// warm), `pods` sequential ADDs then DELs, and `concurrency` concurrent ADDs then DELs.
///
/// Pod namespaces are created in `netns_dir` before each phase pair and removed after it, also
/// on error. Failing executions are counted, not fatal; a failing warm-up is.
pub fn measure(
    plugin: &Plugin,
    workload: &Workload,
    netns_dir: &Path,
    cache: &ResultCache,
) -> Result<Vec<PhaseResult>, BenchError> {
    if !plugin.binary.is_file() {
        return Err(BenchError::MissingBinary(plugin.binary.clone()));
    }
    let warm = create_pods(netns_dir, 1)?;
    for command in [CniCommand::Add, CniCommand::Del] {
        if let Err(reason) = run_one(plugin, cache, &warm[0], command).outcome {
            return Err(BenchError::WarmUp {
                plugin: plugin.label.clone(),
                command,
                reason,
            });
        }
    }
    drop(warm);

    let mut results = Vec::new();
    if workload.pods > 0 {
        let pods = create_pods(netns_dir, workload.pods)?;
        let adds = sequential(plugin, cache, &pods, CniCommand::Add);
        let mut add = phase_result(plugin, Phase::Add, &adds, None);
        add.container_ids = pods.iter().map(|p| p.container_id.clone()).collect();
        results.push(add);
        let dels = sequential(plugin, cache, &pods, CniCommand::Del);
        results.push(phase_result(plugin, Phase::Del, &dels, None));
    }
    if workload.concurrency > 0 {
        let pods = create_pods(netns_dir, workload.concurrency)?;
        let (adds, wall) = concurrent(plugin, cache, &pods, CniCommand::Add);
        results.push(phase_result(
            plugin,
            Phase::AddConcurrent,
            &adds,
            Some(wall),
        ));
        let (dels, wall) = concurrent(plugin, cache, &pods, CniCommand::Del);
        results.push(phase_result(
            plugin,
            Phase::DelConcurrent,
            &dels,
            Some(wall),
        ));
    }
    Ok(results)
}

// ---------------------------------------------------------------------------------------------
// ternd, sizes, memory
// ---------------------------------------------------------------------------------------------

/// A `ternd` started for the run inside the bench namespace; killed (by PID) on drop.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    /// The socket the plugins connect to.
    pub socket: PathBuf,
    /// Where `ternd`'s stdout and stderr go.
    pub log: PathBuf,
}

impl Agent {
    /// Starts `ternd --node-name bench --store sqlite://DIR/store.db --socket DIR/ternd.sock
    /// --state-dir DIR` and waits until its socket accepts a connection.
    pub fn start(ternd: &Path, dir: &Path, timeout: Duration) -> Result<Agent, BenchError> {
        if !ternd.is_file() {
            return Err(BenchError::MissingBinary(ternd.to_owned()));
        }
        let socket = dir.join("ternd.sock");
        let log = dir.join("ternd.log");
        let log_file =
            std::fs::File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
        let log_err = log_file
            .try_clone()
            .map_err(io_err(format!("dup {}", log.display())))?;
        let mut command = Command::new(ternd);
        command
            .arg("--node-name")
            .arg("bench")
            .arg("--store")
            .arg(format!("sqlite://{}", dir.join("store.db").display()))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        if std::env::var_os(SPLIT_ENV).is_some() {
            command.env("TERN_LOG", SPLIT_LOG);
        }
        let mut attempts = 0;
        let child = loop {
            match command.spawn() {
                // A binary written a moment ago can still be open for writing in a child forked
                // meanwhile by another thread (ETXTBSY); that clears as soon as the child execs.
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 10 => {
                    attempts += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.map_err(io_err(format!("spawn {}", ternd.display())))?,
            }
        };
        let mut agent = Agent { child, socket, log };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = agent.child.try_wait() {
                return Err(BenchError::AgentStart(format!(
                    "{} exited ({status}) before opening {}; its log: {}",
                    ternd.display(),
                    agent.socket.display(),
                    agent.log_tail()
                )));
            }
            if UnixStream::connect(&agent.socket).is_ok() {
                return Ok(agent);
            }
            if Instant::now() >= deadline {
                // Dropping `agent` kills the process.
                return Err(BenchError::AgentStart(format!(
                    "{} did not open {} within {timeout:?}; its log: {}",
                    ternd.display(),
                    agent.socket.display(),
                    agent.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The agent's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's resident set size in KiB.
    pub fn rss_kib(&self) -> Result<u64, BenchError> {
        vm_rss_kib(self.pid())
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            "(empty)".into()
        } else {
            tail
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Child::kill signals exactly this PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` in KiB from the text of `/proc/PID/status`.
pub fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|n| n.trim().parse().ok())
}

/// Resident set size of process `pid` in KiB.
pub fn vm_rss_kib(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(io_err(format!("read {path}")))?;
    parse_vm_rss_kib(&text).ok_or_else(|| BenchError::Io {
        context: format!("read {path}"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no VmRSS line"),
    })
}

/// The size of `binary` once stripped: a copy in `scratch` is stripped with `strip`, so debug
/// builds give the same figure as the release profile (`strip = "symbols"`).
pub fn stripped_size(binary: &Path, scratch: &Path) -> Result<u64, BenchError> {
    let name = binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "binary".into());
    let copy = scratch.join(format!("{name}.stripped"));
    std::fs::copy(binary, &copy).map_err(io_err(format!(
        "copy {} to {}",
        binary.display(),
        copy.display()
    )))?;
    let result = run("strip", &[&copy.to_string_lossy()]).and_then(|()| {
        Ok(std::fs::metadata(&copy)
            .map_err(io_err(format!("stat {}", copy.display())))?
            .len())
    });
    let _ = std::fs::remove_file(&copy);
    result
}

/// The stripped size of one binary, or why it could not be measured.
#[derive(Debug, Clone)]
pub struct BinarySize {
    /// Binary name.
    pub name: String,
    /// Stripped size in bytes, or the error.
    pub bytes: Result<u64, String>,
    /// How it is linked, or why that could not be read.
    pub linkage: Result<Linkage, String>,
}

/// How an ELF executable is linked, as the kernel sees it when it execs the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linkage {
    /// No `PT_INTERP`: the kernel jumps straight to the binary (static or static-pie), no
    /// dynamic loader and no shared library is mapped.
    Static,
    /// `PT_INTERP` names the dynamic loader (e.g. `/lib64/ld-linux-x86-64.so.2`), which maps
    /// and relocates the shared libraries before `main`.
    Dynamic {
        /// The loader `PT_INTERP` names.
        interpreter: String,
    },
}

impl fmt::Display for Linkage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Linkage::Static => write!(f, "static"),
            Linkage::Dynamic { interpreter } => write!(f, "dynamic ({interpreter})"),
        }
    }
}

/// The `PT_INTERP` program header type.
const PT_INTERP: u32 = 3;

/// Reads how the ELF file `binary` is linked: [`Linkage::Dynamic`] when it has a `PT_INTERP`
/// program header, else [`Linkage::Static`]. 64-bit little-endian ELF only (every binary the
/// bench runs on x86_64 and aarch64 Linux); anything else is an error, never a guess.
pub fn elf_linkage(binary: &Path) -> Result<Linkage, BenchError> {
    let bytes = std::fs::read(binary).map_err(io_err(format!("read {}", binary.display())))?;
    parse_elf_linkage(&bytes).map_err(|why| BenchError::Io {
        context: format!("read the ELF header of {}", binary.display()),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    })
}

/// [`elf_linkage`] on the file's bytes; the error says which field is wrong.
pub fn parse_elf_linkage(bytes: &[u8]) -> Result<Linkage, String> {
    let field = |off: usize, len: usize| -> Result<&[u8], String> {
        off.checked_add(len)
            .and_then(|end| bytes.get(off..end))
            .ok_or_else(|| format!("truncated: {len} bytes at offset {off} past the end"))
    };
    let u16_at = |off| field(off, 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |off| field(off, 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()));
    let u64_at = |off| field(off, 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    if field(0, 4)? != b"\x7fELF" {
        return Err("not an ELF file (no \\x7fELF magic)".into());
    }
    // e_ident[EI_CLASS] = ELFCLASS64, e_ident[EI_DATA] = ELFDATA2LSB.
    if field(4, 2)? != [2, 1] {
        return Err("not a 64-bit little-endian ELF (EI_CLASS/EI_DATA)".into());
    }
    let to_usize = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| format!("{what} {v} does not fit in memory"))
    };
    let phoff = to_usize(u64_at(32)?, "e_phoff")?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    if phnum > 0 && phentsize < 56 {
        return Err(format!("e_phentsize {phentsize} < 56"));
    }
    for i in 0..phnum {
        let ph = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or_else(|| format!("program header {i} offset overflows"))?;
        if u32_at(ph)? != PT_INTERP {
            continue;
        }
        let off = to_usize(u64_at(ph + 8)?, "PT_INTERP p_offset")?;
        let size = to_usize(u64_at(ph + 32)?, "PT_INTERP p_filesz")?;
        let raw = field(off, size)?;
        let name = raw.split(|b| *b == 0).next().unwrap_or_default();
        return Ok(Linkage::Dynamic {
            interpreter: String::from_utf8_lossy(name).into_owned(),
        });
    }
    Ok(Linkage::Static)
}

// ---------------------------------------------------------------------------------------------
// The whole run
// ---------------------------------------------------------------------------------------------

/// Options of `tern-bench cni`.
#[derive(Debug, Clone)]
pub struct CniBenchOptions {
    /// What each plugin set runs.
    pub workload: Workload,
    /// Plugin sets, in order.
    pub plugins: Vec<PluginSet>,
    /// Directory with `ternd`.
    pub bin_dir: PathBuf,
    /// Directory with the plugins `tern` and `tern-ipam` (`CNI_PATH`); the same as `bin_dir`
    /// unless the static plugins (`scripts/static-plugins.sh`) are measured.
    pub plugin_dir: PathBuf,
    /// Directory with the reference plugins.
    pub ref_dir: PathBuf,
    /// How long to wait for `ternd`'s socket.
    pub agent_timeout: Duration,
}

/// Everything `tern-bench cni` reports.
#[derive(Debug, Clone, Default)]
pub struct CniReport {
    /// Figures of every measured phase.
    pub phases: Vec<PhaseResult>,
    /// Plugin sets that could not be measured, with the reason.
    pub failures: Vec<(String, String)>,
    /// Stripped binary sizes.
    pub sizes: Vec<BinarySize>,
    /// `ternd` RSS in KiB after start-up and after the run.
    pub agent_rss_kib: Option<(u64, u64)>,
    /// With `TERN_BENCH_SPLIT=1`: where the sequential ADDs' time went inside `ternd`.
    pub agent_split: Option<AgentSplit>,
}

/// Where the sequential ADDs' time went inside `ternd` (p50 of each step over the phase), read
/// from its debug log (`TERN_BENCH_SPLIT=1` runs it with `tern_agent::ops` and
/// `tern_agent::server` at debug). What the runtime saw minus `served` is the plugin's exec,
/// start-up and exit, the socket round trip and ternd's accept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentSplit {
    /// ADDs found in the log for the phase.
    pub n: usize,
    /// IPAM allocation (one store transaction).
    pub allocate: Option<Duration>,
    /// Creating the veth pair (peer made in the pod's namespace) and its host sysctls.
    pub create_veth: Option<Duration>,
    /// Policy for the endpoint, then the pod side (link up, addresses, routes) and host route.
    pub configure: Option<Duration>,
    /// Recording the WorkloadEndpoint.
    pub endpoint: Option<Duration>,
    /// The whole request as ternd served it (`ADD ... ok in`).
    pub served: Option<Duration>,
}

/// The environment variable that asks for [`AgentSplit`].
pub const SPLIT_ENV: &str = "TERN_BENCH_SPLIT";

/// `ternd`'s log filter when [`SPLIT_ENV`] is set.
const SPLIT_LOG: &str = "info,tern_agent::ops=debug,tern_agent::server=debug";

/// Parses a `Duration`'s `Debug` text (`380.006µs`, `1.104281ms`, `2.5s`, `800ns`).
pub fn parse_debug_duration(text: &str) -> Option<Duration> {
    let t = text.trim().trim_end_matches(',');
    let (num, unit) = t.split_at(t.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?);
    let v: f64 = num.parse().ok()?;
    let nanos = match unit {
        "ns" => v,
        "µs" | "us" => v * 1e3,
        "ms" => v * 1e6,
        "s" => v * 1e9,
        _ => return None,
    };
    (nanos.is_finite() && nanos >= 0.0).then(|| Duration::from_nanos(nanos as u64))
}

/// Reads the split of the ADDs of `container_ids` from a `ternd` debug log.
pub fn agent_split(log: &str, container_ids: &[String]) -> AgentSplit {
    let wanted: std::collections::HashSet<&str> =
        container_ids.iter().map(String::as_str).collect();
    let mut parts: [Vec<Duration>; 5] = Default::default();
    for line in log.lines() {
        let Some(rest) = line.split(" ADD ").nth(1) else {
            continue;
        };
        if let Some((cid, steps)) = rest.split_once(": allocate ") {
            if !wanted.contains(cid) {
                continue;
            }
            // "A, create veth B, policy+configure C, endpoint D"
            let mut fields = steps.split(", ");
            let values = [
                fields.next(),
                fields.next().and_then(|f| f.strip_prefix("create veth ")),
                fields
                    .next()
                    .and_then(|f| f.strip_prefix("policy+configure ")),
                fields.next().and_then(|f| f.strip_prefix("endpoint ")),
            ];
            for (i, v) in values.into_iter().enumerate() {
                if let Some(d) = v.and_then(parse_debug_duration) {
                    parts[i].push(d);
                }
            }
        } else if let Some((target, took)) = rest.split_once(" ok in ") {
            let cid = target.split('/').next().unwrap_or("");
            if wanted.contains(cid)
                && let Some(d) = parse_debug_duration(took)
            {
                parts[4].push(d);
            }
        }
    }
    let p50 = |v: &Vec<Duration>| percentile(v, 50.0);
    AgentSplit {
        n: parts[4].len(),
        allocate: p50(&parts[0]),
        create_veth: p50(&parts[1]),
        configure: p50(&parts[2]),
        endpoint: p50(&parts[3]),
        served: p50(&parts[4]),
    }
}

/// Runs the whole benchmark. The caller must already be in a private namespace
/// ([`enter_private_namespaces`]); this sets the namespace up as a node and measures each plugin
/// set in its own temporary directory. Only set-up errors are returned; a plugin set that cannot
/// be measured is recorded in [`CniReport::failures`].
pub fn run_cni(options: &CniBenchOptions) -> Result<CniReport, BenchError> {
    setup_bench_host()?;
    let work = tempfile::Builder::new()
        .prefix("tern-bench-")
        .tempdir()
        .map_err(io_err("create the bench's temporary directory"))?;
    let mut report = CniReport::default();
    for set in &options.plugins {
        let dir = work.path().join(set.to_string());
        std::fs::create_dir_all(&dir).map_err(io_err(format!("create {}", dir.display())))?;
        if let Err(e) = measure_set(*set, options, &dir, &mut report) {
            report.failures.push((set.to_string(), e.to_string()));
        }
    }
    report.sizes = binary_sizes(options, work.path());
    Ok(report)
}

fn measure_set(
    set: PluginSet,
    options: &CniBenchOptions,
    dir: &Path,
    report: &mut CniReport,
) -> Result<(), BenchError> {
    let netns_dir = dir.join("netns");
    std::fs::create_dir_all(&netns_dir)
        .map_err(io_err(format!("create {}", netns_dir.display())))?;
    let cache = ResultCache::new(&dir.join("cni-cache"))?;
    match set {
        PluginSet::Reference => {
            let data_dir = dir.join("host-local");
            let plugin = Plugin::reference(&options.ref_dir, &data_dir);
            report
                .phases
                .extend(measure(&plugin, &options.workload, &netns_dir, &cache)?);
        }
        PluginSet::Tern => {
            let state_dir = dir.join("state");
            std::fs::create_dir_all(&state_dir)
                .map_err(io_err(format!("create {}", state_dir.display())))?;
            let agent = Agent::start(&options.bin_dir.join("ternd"), dir, options.agent_timeout)?;
            // Let start-up allocations settle before calling it idle.
            std::thread::sleep(Duration::from_millis(200));
            let idle = agent.rss_kib()?;
            let plugin = Plugin::tern(&options.plugin_dir, &agent.socket, &state_dir);
            let measured = measure(&plugin, &options.workload, &netns_dir, &cache);
            let after = agent.rss_kib()?;
            report.agent_rss_kib = Some((idle, after));
            let measured = measured?;
            if std::env::var_os(SPLIT_ENV).is_some()
                && let Some(add) = measured.iter().find(|p| p.phase == Phase::Add)
            {
                let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
                report.agent_split = Some(agent_split(&log, &add.container_ids));
            }
            report.phases.extend(measured);
        }
    }
    Ok(())
}

fn binary_sizes(options: &CniBenchOptions, scratch: &Path) -> Vec<BinarySize> {
    let mut binaries = Vec::new();
    if options.plugins.contains(&PluginSet::Tern) {
        binaries.extend(["tern", "tern-ipam"].map(|b| options.plugin_dir.join(b)));
        binaries.push(options.bin_dir.join("ternd"));
    }
    if options.plugins.contains(&PluginSet::Reference) {
        binaries.extend(["ptp", "host-local"].map(|b| options.ref_dir.join(b)));
    }
    binaries
        .into_iter()
        .map(|path| BinarySize {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            bytes: if path.is_file() {
                stripped_size(&path, scratch).map_err(|e| e.to_string())
            } else {
                Err(format!("{} not found", path.display()))
            },
            linkage: if path.is_file() {
                elf_linkage(&path).map_err(|e| e.to_string())
            } else {
                Err("not found".into())
            },
        })
        .collect()
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

impl CniReport {
    /// For each phase measured for both sets: ref's p50 divided by tern's (how many times
    /// faster tern is).
    pub fn ratios(&self) -> Vec<(Phase, f64)> {
        let p50 = |plugin: &str, phase: Phase| {
            self.phases
                .iter()
                .find(|p| p.plugin == plugin && p.phase == phase)
                .and_then(|p| p.summary.p50)
        };
        [
            Phase::Add,
            Phase::Del,
            Phase::AddConcurrent,
            Phase::DelConcurrent,
        ]
        .into_iter()
        .filter_map(|ph| {
            let r = p50(&PluginSet::Reference.to_string(), ph)?;
            let t = p50(&PluginSet::Tern.to_string(), ph)?;
            (!t.is_zero()).then(|| (ph, r.as_secs_f64() / t.as_secs_f64()))
        })
        .collect()
    }

    /// True when every requested plugin set was measured and every execution succeeded with
    /// distinct addresses.
    pub fn all_ok(&self) -> bool {
        self.failures.is_empty()
            && self
                .phases
                .iter()
                .all(|p| p.summary.ok == p.summary.n && p.distinct_addresses.unwrap_or(true))
    }

    /// The issue's targets for tern, each with whether it is met; empty when tern was not
    /// measured.
    pub fn tern_targets(&self) -> Vec<(String, bool)> {
        let phase = |ph| {
            self.phases
                .iter()
                .find(|p| p.plugin == "tern" && p.phase == ph)
        };
        let mut out = Vec::new();
        if let Some(p) = phase(Phase::Add) {
            let ok = p.summary.p50.is_some_and(|d| d <= targets::ADD_P50);
            out.push((
                format!("ADD p50 <= {} ms", targets::ADD_P50.as_millis()),
                ok,
            ));
        }
        if let Some(p) = phase(Phase::Del) {
            let ok = p.summary.p50.is_some_and(|d| d <= targets::DEL_P50);
            out.push((
                format!("DEL p50 <= {} ms", targets::DEL_P50.as_millis()),
                ok,
            ));
        }
        if let Some(p) = phase(Phase::AddConcurrent) {
            let ok = p.summary.ok == p.summary.n && p.distinct_addresses == Some(true);
            out.push((
                format!(
                    "all {} concurrent ADDs succeed with distinct addresses",
                    p.summary.n
                ),
                ok,
            ));
        }
        if let Some(size) = self.sizes.iter().find(|s| s.name == "tern") {
            let ok = size
                .bytes
                .as_ref()
                .is_ok_and(|b| *b <= targets::TERN_BINARY_BYTES);
            out.push(("tern binary <= 5 MiB stripped".into(), ok));
        }
        if let Some((idle, _)) = self.agent_rss_kib {
            out.push((
                "ternd idle RSS <= 20 MiB".into(),
                idle <= targets::TERND_IDLE_RSS_KIB,
            ));
        }
        out
    }
}

impl fmt::Display for CniReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<8} {:<15} {:>5} {:>5} {:>9} {:>9} {:>9}",
            "plugin", "phase", "n", "ok", "p50 ms", "p99 ms", "max ms"
        )?;
        for p in &self.phases {
            let s = &p.summary;
            writeln!(
                f,
                "{:<8} {:<15} {:>5} {:>5} {:>9} {:>9} {:>9}",
                p.plugin,
                p.phase,
                s.n,
                s.ok,
                ms(s.p50),
                ms(s.p99),
                ms(s.max)
            )?;
        }
        let notes: Vec<&PhaseResult> = self
            .phases
            .iter()
            .filter(|p| {
                p.wall.is_some() || !p.errors.is_empty() || p.distinct_addresses == Some(false)
            })
            .collect();
        if !notes.is_empty() {
            writeln!(f)?;
            for p in notes {
                let mut line = format!("{} {}:", p.plugin, p.phase);
                if let Some(wall) = p.wall {
                    line.push_str(&format!(" wall {} ms", ms(Some(wall))));
                }
                if let Some(distinct) = p.distinct_addresses {
                    line.push_str(if distinct {
                        ", addresses distinct"
                    } else {
                        ", DUPLICATE ADDRESSES"
                    });
                }
                for e in &p.errors {
                    line.push_str(&format!("\n    error: {e}"));
                }
                writeln!(f, "{line}")?;
            }
        }
        for (set, reason) in &self.failures {
            writeln!(f, "\n{set}: NOT MEASURED: {reason}")?;
        }
        if !self.sizes.is_empty() {
            writeln!(
                f,
                "\n{:<12} {:>12} {:>9}  linkage",
                "binary", "stripped B", "MiB"
            )?;
            for s in &self.sizes {
                let linkage = match &s.linkage {
                    Ok(l) => l.to_string(),
                    Err(e) => format!("? ({e})"),
                };
                match &s.bytes {
                    Ok(b) => writeln!(
                        f,
                        "{:<12} {:>12} {:>9.2}  {linkage}",
                        s.name,
                        b,
                        *b as f64 / (1024.0 * 1024.0)
                    )?,
                    Err(e) => writeln!(f, "{:<12} {e}", s.name)?,
                }
            }
        }
        let ratios = self.ratios();
        if !ratios.is_empty() {
            writeln!(f)?;
            for (phase, r) in ratios {
                writeln!(f, "ref/tern p50 {phase}: {r:.2}x")?;
            }
        }
        if let Some(sp) = &self.agent_split {
            writeln!(
                f,
                "\nternd's share of the sequential ADDs (p50 of {} from its log, ms): allocate {}, create veth {}, policy+configure {}, endpoint {}; served in {}",
                sp.n,
                ms(sp.allocate),
                ms(sp.create_veth),
                ms(sp.configure),
                ms(sp.endpoint),
                ms(sp.served)
            )?;
        }
        if let Some((idle, after)) = self.agent_rss_kib {
            writeln!(
                f,
                "\nternd VmRSS: {:.1} MiB after start-up, {:.1} MiB after the run",
                idle as f64 / 1024.0,
                after as f64 / 1024.0
            )?;
        }
        let targets = self.tern_targets();
        if !targets.is_empty() {
            writeln!(f, "\ntern targets:")?;
            for (what, ok) in targets {
                writeln!(f, "  {} {what}", pass(ok))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let samples = ms_list(&[4, 1, 3, 2]);
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(2)));
        assert_eq!(percentile(&samples, 75.0), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&samples, 76.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&samples, 100.0), Some(Duration::from_millis(4)));
        assert_eq!(percentile(&samples, 1.0), Some(Duration::from_millis(1)));
    }

    #[test]
    fn p99_of_100_samples_is_the_99th_not_the_max() {
        // 1..=100 ms shuffled: p99 must be 99 ms (a p/100*n rank would round up to 100).
        let mut values: Vec<u64> = (1..=100).collect();
        values.reverse();
        values.swap(3, 70);
        let samples = ms_list(&values);
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        // 50 samples: rank ceil(49.5) = 50, the maximum.
        let fifty = ms_list(&(1..=50).collect::<Vec<_>>());
        assert_eq!(percentile(&fifty, 99.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&fifty, 50.0), Some(Duration::from_millis(25)));
    }

    #[test]
    fn percentile_rejects_empty_input_and_bad_p() {
        assert_eq!(percentile(&[], 50.0), None);
        let one = ms_list(&[7]);
        assert_eq!(percentile(&one, 0.0), None);
        assert_eq!(percentile(&one, 100.5), None);
        assert_eq!(percentile(&one, f64::NAN), None);
        assert_eq!(percentile(&one, 0.1), Some(Duration::from_millis(7)));
    }

    #[test]
    fn summary_counts_failures_but_times_successes_only() {
        let s = Summary::new(5, &ms_list(&[10, 30, 20]));
        assert_eq!(s.n, 5);
        assert_eq!(s.ok, 3);
        assert_eq!(s.p50, Some(Duration::from_millis(20)));
        assert_eq!(s.p99, Some(Duration::from_millis(30)));
        assert_eq!(s.max, Some(Duration::from_millis(30)));
        let none = Summary::new(2, &[]);
        assert_eq!((none.ok, none.p50, none.max), (0, None, None));
    }

    #[test]
    fn parses_addresses_of_a_ptp_result() {
        // Shape of ptp + host-local's 1.0.0 result.
        let out = br#"{
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth1234", "mac": "aa:bb:cc:dd:ee:ff"},
                {"name": "eth0", "mac": "11:22:33:44:55:66", "sandbox": "/run/netns/x"}
            ],
            "ips": [
                {"interface": 1, "address": "10.250.0.2/16", "gateway": "10.250.0.1"},
                {"interface": 1, "address": "fd00::2/64"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        }"#;
        assert_eq!(
            parse_result_ips(out).unwrap(),
            vec!["10.250.0.2/16".to_string(), "fd00::2/64".to_string()]
        );
    }

    #[test]
    fn a_cni_error_object_becomes_a_plugin_error() {
        let out = br#"{"cniVersion":"1.0.0","code":11,"msg":"agent unreachable","details":"connect: ENOENT"}"#;
        match parse_result_ips(out) {
            Err(BenchError::Plugin { code, msg, details }) => {
                assert_eq!(code, 11);
                assert_eq!(msg, "agent unreachable");
                assert_eq!(details, "connect: ENOENT");
            }
            other => panic!("expected a plugin error, got {other:?}"),
        }
        let text = describe_failure("exit status: 1", out, b"");
        assert_eq!(
            text,
            "CNI error 11: agent unreachable (connect: ENOENT) [exit status: 1]"
        );
    }

    #[test]
    fn malformed_results_are_rejected() {
        for (out, needle) in [
            (&b"not json"[..], "not JSON"),
            (br#"{"cniVersion":"1.0.0"}"#, "no `ips`"),
            (br#"{"ips":[]}"#, "empty"),
            (br#"{"ips":[{"gateway":"10.0.0.1"}]}"#, "without an address"),
            (br#"{"ips":[{"address":"10.0.0.300/24"}]}"#, "not IP/prefix"),
            (br#"{"ips":[{"address":"10.0.0.3"}]}"#, "not IP/prefix"),
            (br#"{"ips":[{"address":"10.0.0.3/33"}]}"#, "not IP/prefix"),
        ] {
            let err = parse_result_ips(out).expect_err("must be rejected");
            assert!(
                matches!(err, BenchError::InvalidResult(_)) && err.to_string().contains(needle),
                "{err} should mention {needle}"
            );
        }
    }

    #[test]
    fn failure_description_falls_back_to_stderr_then_status() {
        assert_eq!(
            describe_failure("exit status: 2", b"", b"  boom\n"),
            "boom [exit status: 2]"
        );
        assert_eq!(describe_failure("signal: 9", b"", b""), "signal: 9");
    }

    #[test]
    fn vm_rss_is_read_from_proc_status_text() {
        let status = "Name:\tternd\nVmPeak:\t  9000 kB\nVmRSS:\t    5432 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss_kib(status), Some(5432));
        assert_eq!(parse_vm_rss_kib("Name:\tkthreadd\n"), None);
        // Our own process has a resident set.
        assert!(vm_rss_kib(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn plugin_sets_parse_from_the_command_line() {
        assert_eq!("ref".parse::<PluginSet>().unwrap(), PluginSet::Reference);
        assert_eq!(" tern".parse::<PluginSet>().unwrap(), PluginSet::Tern);
        let err = "calico".parse::<PluginSet>().unwrap_err();
        assert!(err.to_string().contains("\"calico\""), "{err}");
    }

    #[test]
    fn confs_carry_version_name_and_plugin_specific_fields() {
        let r = Plugin::reference(Path::new("/usr/lib/cni"), Path::new("/tmp/d"));
        assert_eq!(r.binary, Path::new("/usr/lib/cni/ptp"));
        assert_eq!(r.conf["cniVersion"], "1.0.0");
        assert_eq!(r.conf["ipam"]["type"], "host-local");
        assert_eq!(r.conf["ipam"]["subnet"], REFERENCE_SUBNET);
        assert_eq!(r.conf["ipam"]["dataDir"], "/tmp/d");
        let t = Plugin::tern(Path::new("/b"), Path::new("/s/ternd.sock"), Path::new("/s"));
        assert_eq!(t.binary, Path::new("/b/tern"));
        assert_eq!(t.cni_path, "/b");
        assert_eq!(t.conf["type"], "tern");
        assert_eq!(t.conf["agent_socket"], "/s/ternd.sock");
        assert_eq!(t.conf["state_dir"], "/s");
        assert_eq!(t.conf["ipam"]["type"], "tern-ipam");
        assert_eq!(t.network_name(), "bench-tern");
    }

    #[test]
    fn targets_are_judged_from_the_report() {
        let phase = |phase, samples: &[u64], n, distinct| PhaseResult {
            plugin: "tern".into(),
            phase,
            summary: Summary::new(n, &ms_list(samples)),
            wall: None,
            distinct_addresses: distinct,
            errors: vec![],
            container_ids: vec![],
        };
        let report = CniReport {
            phases: vec![
                phase(Phase::Add, &[1, 2, 3], 3, Some(true)),
                phase(Phase::Del, &[4, 5, 6], 3, None),
                phase(Phase::AddConcurrent, &[1, 1], 3, Some(true)),
            ],
            failures: vec![],
            sizes: vec![BinarySize {
                name: "tern".into(),
                bytes: Ok(1_000_000),
                linkage: Ok(Linkage::Static),
            }],
            agent_rss_kib: Some((30 * 1024, 31 * 1024)),
            agent_split: None,
        };
        let verdicts: Vec<bool> = report.tern_targets().into_iter().map(|t| t.1).collect();
        assert_eq!(verdicts, vec![true, false, false, true, false]);
        assert!(!report.all_ok());
        let table = report.to_string();
        assert!(
            table.contains("plugin   phase               n    ok    p50 ms    p99 ms    max ms")
        );
        assert!(
            table.contains("tern     add                 3     3      2.00      3.00      3.00")
        );
        assert!(table.contains("FAIL DEL p50 <= 3 ms"));
        assert!(
            table.contains("tern              1000000      0.95  static"),
            "{table}"
        );
    }

    /// A minimal 64-bit little-endian ELF image: header, `phdrs` program headers of
    /// (type, offset, filesz), then `tail`.
    fn elf(phdrs: &[(u32, u64, u64)], tail: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // ELFDATA2LSB
        b[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        b[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        b[56..58].copy_from_slice(&(phdrs.len() as u16).to_le_bytes()); // e_phnum
        for (ty, off, size) in phdrs {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&ty.to_le_bytes());
            ph[8..16].copy_from_slice(&off.to_le_bytes());
            ph[32..40].copy_from_slice(&size.to_le_bytes());
            b.extend(ph);
        }
        b.extend(tail);
        b
    }

    #[test]
    fn elf_linkage_reads_pt_interp() {
        // PT_LOAD (1) only: static (or static-pie).
        assert_eq!(
            parse_elf_linkage(&elf(&[(1, 0, 0)], &[])),
            Ok(Linkage::Static)
        );
        // PT_PHDR (6), PT_INTERP (3) pointing at the NUL-terminated loader path after them.
        let loader = b"/lib64/ld-linux-x86-64.so.2\0";
        let at = 64 + 2 * 56;
        let img = elf(&[(6, 64, 112), (3, at, loader.len() as u64)], loader);
        let dynamic = Linkage::Dynamic {
            interpreter: "/lib64/ld-linux-x86-64.so.2".into(),
        };
        assert_eq!(parse_elf_linkage(&img), Ok(dynamic.clone()));
        assert_eq!(dynamic.to_string(), "dynamic (/lib64/ld-linux-x86-64.so.2)");
        // Bad input is an error naming what is wrong, never a panic or a guess.
        let err = |b: &[u8]| parse_elf_linkage(b).unwrap_err();
        assert!(err(b"#!/bin/sh\n").contains("not an ELF"));
        assert!(err(b"\x7fEL").contains("truncated"));
        let mut be = elf(&[], &[]);
        be[5] = 2;
        assert!(err(&be).contains("64-bit little-endian"));
        // An interpreter past the end of the file, and offsets that overflow.
        assert!(err(&elf(&[(3, 10_000, 30)], &[])).contains("truncated"));
        assert!(err(&elf(&[(3, u64::MAX, 30)], &[])).contains("truncated"));
        let mut far = elf(&[(1, 0, 0)], &[]);
        far[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_elf_linkage(&far).is_err());
        // This test binary: cargo links it dynamically unless crt-static is set.
        let me = elf_linkage(&std::env::current_exe().unwrap()).unwrap();
        if cfg!(target_feature = "crt-static") {
            assert_eq!(me, Linkage::Static);
        } else {
            assert!(matches!(me, Linkage::Dynamic { .. }), "{me}");
        }
    }

    #[test]
    fn debug_durations_parse_in_every_unit() {
        assert_eq!(
            parse_debug_duration("380.006µs"),
            Some(Duration::from_nanos(380_006))
        );
        assert_eq!(
            parse_debug_duration("1.104281ms,"),
            Some(Duration::from_nanos(1_104_281))
        );
        assert_eq!(
            parse_debug_duration("800ns"),
            Some(Duration::from_nanos(800))
        );
        assert_eq!(
            parse_debug_duration("2.5s"),
            Some(Duration::from_millis(2500))
        );
        for bad in ["", "ms", "12", "1.0xs", "-1ms"] {
            assert_eq!(parse_debug_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn agent_split_reads_only_the_phase_pods_from_the_log() {
        let log = "\
[2026-12-01T11:59:27.100Z DEBUG tern_agent::ops] ADD warm: allocate 9ms, create veth 9ms, policy+configure 9ms, endpoint 9ms
[2026-12-01T11:59:27.100Z DEBUG tern_agent::server] ADD warm/eth0 ok in 40ms
[2026-12-01T11:59:27.200Z DEBUG tern_agent::ops] ADD c1: allocate 100µs, create veth 600µs, policy+configure 300µs, endpoint 90µs
[2026-12-01T11:59:27.200Z DEBUG tern_agent::server] ADD c1/eth0 ok in 1.2ms
[2026-12-01T11:59:27.300Z DEBUG tern_agent::ops] ADD c2: allocate 200µs, create veth 700µs, policy+configure 400µs, endpoint 110µs
[2026-12-01T11:59:27.300Z DEBUG tern_agent::server] ADD c2/eth0 ok in 1.5ms
[2026-12-01T11:59:27.400Z INFO  tern_agent::server] ADD c3/eth0 failed (code 11): busy
";
        let sp = agent_split(log, &["c1".into(), "c2".into(), "c3".into()]);
        assert_eq!(
            sp,
            AgentSplit {
                n: 2,
                allocate: Some(Duration::from_micros(100)),
                create_veth: Some(Duration::from_micros(600)),
                configure: Some(Duration::from_micros(300)),
                endpoint: Some(Duration::from_micros(90)),
                served: Some(Duration::from_micros(1200)),
            }
        );
        assert_eq!(agent_split(log, &[]).n, 0);
    }

    #[test]
    fn ratios_compare_the_sets_phase_by_phase() {
        let phase = |plugin: &str, ph: Phase, ms: u64| PhaseResult {
            plugin: plugin.into(),
            phase: ph,
            summary: Summary::new(1, &[Duration::from_millis(ms)]),
            wall: None,
            distinct_addresses: None,
            errors: vec![],
            container_ids: vec![],
        };
        let report = CniReport {
            phases: vec![
                phase("ref", Phase::Add, 12),
                phase("ref", Phase::Del, 30),
                phase("tern", Phase::Add, 3),
                phase("tern", Phase::Del, 2),
                phase("tern", Phase::AddConcurrent, 100),
            ],
            ..CniReport::default()
        };
        assert_eq!(report.ratios(), vec![(Phase::Add, 4.0), (Phase::Del, 15.0)]);
        assert!(report.to_string().contains("ref/tern p50 add: 4.00x"));
    }

    #[test]
    fn stripping_a_copy_leaves_the_original_alone() {
        let scratch = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let before = std::fs::metadata(&exe).unwrap().len();
        let stripped = stripped_size(&exe, scratch.path()).unwrap();
        assert!(stripped > 0 && stripped < before, "{stripped} vs {before}");
        assert_eq!(std::fs::metadata(&exe).unwrap().len(), before);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }

    /// Writes an executable stand-in for `ternd` into `dir`.
    fn fake_ternd(dir: &Path, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("ternd");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    const PYTHON: &str = "/usr/bin/python3";

    #[test]
    fn agent_is_ready_when_its_socket_accepts_and_is_killed_on_drop() {
        if !Path::new(PYTHON).is_file() {
            eprintln!("skipped: needs {PYTHON} for the stand-in agent");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Checks the command line tern-bench promises, then serves the socket after a delay.
        let ternd = fake_ternd(
            dir.path(),
            &format!(
                "#!{PYTHON}\n\
                 import socket, sys, time\n\
                 a = sys.argv[1:]\n\
                 assert a[0:2] == ['--node-name', 'bench'], a\n\
                 assert a[2] == '--store' and a[3].startswith('sqlite:///') and a[3].endswith('/store.db'), a\n\
                 assert a[4] == '--socket' and a[6] == '--state-dir', a\n\
                 time.sleep(0.3)\n\
                 s = socket.socket(socket.AF_UNIX); s.bind(a[5]); s.listen(8)\n\
                 while True: s.accept()\n"
            ),
        );
        let agent = Agent::start(&ternd, dir.path(), Duration::from_secs(10)).unwrap();
        assert_eq!(agent.socket, dir.path().join("ternd.sock"));
        assert!(agent.rss_kib().unwrap() > 0);
        let pid = agent.pid();
        drop(agent);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "agent {pid} still running"
        );
    }

    #[test]
    fn an_agent_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let ternd = fake_ternd(
            dir.path(),
            "#!/bin/sh\necho 'error: store sqlite:///x: locked' >&2\nexit 3\n",
        );
        let err = Agent::start(&ternd, dir.path(), Duration::from_secs(10)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("ternd did not start:")
                && text.contains("exit status: 3")
                && text.contains("error: store sqlite:///x: locked"),
            "{text}"
        );
    }

    #[test]
    fn an_agent_that_never_listens_times_out_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let ternd = fake_ternd(dir.path(), "#!/bin/sh\necho starting\nexec sleep 30\n");
        let start = Instant::now();
        let err = Agent::start(&ternd, dir.path(), Duration::from_millis(300)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        let text = err.to_string();
        assert!(
            text.contains("did not open") && text.contains("starting"),
            "{text}"
        );
    }

    /// Runs the whole harness against the reference plugins, in a private namespace entered by a
    /// dedicated thread. Needs root and Debian's containernetworking-plugins; skipped otherwise.
    #[test]
    fn reference_plugins_are_measured_in_a_private_namespace() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root || !Path::new(REFERENCE_PLUGIN_DIR).join("ptp").is_file() {
            eprintln!("skipped: needs root and {REFERENCE_PLUGIN_DIR}/ptp");
            return;
        }
        let host_netns = netns_inode("/proc/thread-self/ns/net").unwrap();
        let report = std::thread::spawn(|| {
            enter_private_namespaces()?;
            run_cni(&CniBenchOptions {
                workload: Workload {
                    pods: 4,
                    concurrency: 4,
                },
                plugins: vec![PluginSet::Reference, PluginSet::Tern],
                bin_dir: PathBuf::from("/nonexistent-tern-bin"),
                plugin_dir: PathBuf::from("/nonexistent-tern-bin"),
                ref_dir: PathBuf::from(REFERENCE_PLUGIN_DIR),
                agent_timeout: Duration::from_secs(1),
            })
        })
        .join()
        .unwrap()
        .unwrap();
        // This thread never left the host namespace.
        assert_eq!(netns_inode("/proc/thread-self/ns/net").unwrap(), host_netns);

        let phases: Vec<(Phase, usize, usize)> = report
            .phases
            .iter()
            .map(|p| (p.phase, p.summary.n, p.summary.ok))
            .collect();
        assert_eq!(
            phases,
            vec![
                (Phase::Add, 4, 4),
                (Phase::Del, 4, 4),
                (Phase::AddConcurrent, 4, 4),
                (Phase::DelConcurrent, 4, 4),
            ],
            "{report}"
        );
        assert!(report.phases.iter().all(|p| p.plugin == "ref"));
        assert_eq!(report.phases[2].distinct_addresses, Some(true));
        assert!(report.phases[2].wall.is_some());
        // tern is reported as not measured, with the reason.
        assert_eq!(report.failures.len(), 1, "{report}");
        assert_eq!(report.failures[0].0, "tern");
        assert!(
            report.failures[0]
                .1
                .contains("/nonexistent-tern-bin/ternd not found"),
            "{report}"
        );
        assert!(!report.all_ok());
        let sizes: Vec<&str> = report.sizes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            sizes,
            vec!["tern", "tern-ipam", "ternd", "ptp", "host-local"]
        );
        assert!(report.sizes[3].bytes.as_ref().is_ok_and(|b| *b > 1_000_000));
    }
}
