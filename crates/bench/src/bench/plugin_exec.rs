//! Plugins and their execution: the plugin sets, a plugin as a runtime sees it, pods, one timed
//! execution, and the runtime's result cache.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cni::{CNI_VERSION, CniCommand, POD_IFNAME};
use super::error::{BenchError, io_err};
use super::isolation::PodNetns;
use super::result::{describe_failure, parse_result_ips};

/// Where Debian's `containernetworking-plugins` package installs the reference plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Subnet given to host-local for the reference plugins (exists only inside the bench namespace).
pub const REFERENCE_SUBNET: &str = "10.250.0.0/16";

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
    pub(super) fn before(&self, plugin: &Plugin, pod: &Pod, command: CniCommand) -> Option<Value> {
        match command {
            CniCommand::Del => self.load(plugin, pod),
            CniCommand::Add => None,
        }
    }

    /// What a runtime records after `command` (untimed): a successful ADD's result is cached,
    /// a successful DEL forgets it.
    pub(super) fn after(
        &self,
        plugin: &Plugin,
        pod: &Pod,
        command: CniCommand,
        invocation: &Invocation,
    ) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
