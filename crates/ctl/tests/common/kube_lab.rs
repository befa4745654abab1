//! The Kubernetes lab of the ctl tests (`lab_kube`, `lab_kube_daemonset`, `lab_kube_backend`,
//! `lab_kube_etcd_tls`, …): `ternctl lab up --kubernetes`, kubectl through the operator's
//! kubeconfig, failure diagnostics, the Deployment's and tern-node's pods, busybox test pods
//! and asking them over TCP, `ternctl` in a node's namespace and against the lab's store, and
//! the checks that `lab down` left nothing behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tern_lab::LabState;
use tern_lab::kube::{self, pods};

/// A Kubernetes lab, removed when dropped (test passed, failed or panicked).
pub struct KubeLab {
    pub name: String,
    /// The Kubernetes components (`scripts/k8s-components.sh`).
    pub k8s: PathBuf,
    /// The operator's kubeconfig `lab up` printed (empty until it did).
    pub kubeconfig: PathBuf,
    /// kubectl's cache, and where manifests are written for `kubectl apply`.
    pub cache: tempfile::TempDir,
    /// kubelet's kernel-wide sysctls before the lab, which `lab down` must restore.
    sysctls_before: Vec<(String, String)>,
    /// The other labs running a cluster before this one came up (see [`other_clusters`]).
    others_before: Vec<String>,
}

/// Labs other than `name` with a Kubernetes cluster: while any runs, its kubelets hold the
/// kernel-wide sysctls at kubelet's values and the last lab out restores the machine's (CI
/// runs upstream's e2e on a lab of its own during the tests; engineers run labs too).
pub fn other_clusters(name: &str) -> Vec<String> {
    std::fs::read_dir(tern_lab::RUN_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name() != name && e.path().join("kube").is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for KubeLab {
    fn drop(&mut self) {
        if let Err(e) = tern_lab::down(&self.name) {
            eprintln!("teardown of lab {}: {e}", self.name);
        }
    }
}

impl KubeLab {
    /// `ternctl lab up --kubernetes ARGS` with the components in `k8s`, for a new lab named
    /// `tag` and random digits (see [`super::lab_name`]); panics with the output and the
    /// diagnostics when it fails.
    pub fn up(tag: &str, k8s: &Path, args: &[&str]) -> KubeLab {
        let name = super::lab_name(tag);
        let mut lab = KubeLab {
            name: name.clone(),
            k8s: k8s.to_path_buf(),
            kubeconfig: PathBuf::new(),
            cache: tempfile::tempdir().expect("tempdir"),
            sysctls_before: kube::sys::read_current().expect("read sysctls"),
            others_before: other_clusters(&name),
        };
        let t0 = Instant::now();
        let out = Command::new(super::ternctl())
            .env_remove("TERN_STORE")
            .args(["lab", "--name", &name, "--bin-dir"])
            .arg(super::fresh_binaries())
            .args(["up", "--kubernetes"])
            .args(args)
            .arg("--k8s-bin-dir")
            .arg(k8s)
            .output()
            .expect("ternctl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "lab up --kubernetes failed:\n{stdout}\n{}{}",
            String::from_utf8_lossy(&out.stderr),
            lab.diagnostics()
        );
        eprintln!("lab up --kubernetes {}: {:?}", args.join(" "), t0.elapsed());
        let export = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export KUBECONFIG="))
            .unwrap_or_else(|| panic!("no `export KUBECONFIG=` in:\n{stdout}"));
        lab.kubeconfig = PathBuf::from(export.trim());
        lab
    }

    /// The lab's saved state.
    pub fn state(&self) -> LabState {
        LabState::load(&self.name)
            .expect("lab state")
            .expect("the lab is up")
    }

    /// kubectl with the operator's kubeconfig (through the relay in the root namespace).
    pub fn command(&self) -> Command {
        let mut c = Command::new(self.k8s.join("kubectl"));
        c.env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path());
        c
    }

    /// `kubectl ARGS`: its output, or an error with its stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command()
            .args(args)
            .output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `kubectl exec ARGS` ([`KubeLab::kubectl`]), tried again (up to 3 times, 1 s apart) when
    /// the exec stream itself could not be set up ("unable to upgrade connection", the
    /// kubelet's answer before the command runs: seen once in many CI runs, for a Running pod).
    /// Such a failure says nothing about the pod network a probe tests; each retry is logged.
    pub fn exec(&self, args: &[&str]) -> Result<String, String> {
        let mut exec = vec!["exec"];
        exec.extend_from_slice(args);
        let mut tries = 0;
        loop {
            match self.kubectl(&exec) {
                Err(e) if e.contains("unable to upgrade connection") && tries < 3 => {
                    tries += 1;
                    eprintln!("retrying (exec stream not set up, try {tries} of 3): {e}");
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// [`KubeLab::kubectl`], panicking with the diagnostics when it fails.
    pub fn must(&self, args: &[&str]) -> String {
        self.kubectl(args)
            .unwrap_or_else(|e| panic!("{e}{}", self.diagnostics()))
    }

    /// `kubectl apply -f` of `yaml`, written to `<cache>/<name>.yaml`: kubectl's output, or
    /// an error with its stderr.
    pub fn try_apply(&self, name: &str, yaml: &str) -> Result<String, String> {
        let p = self.cache.path().join(format!("{name}.yaml"));
        std::fs::write(&p, yaml).map_err(|e| format!("{}: {e}", p.display()))?;
        self.kubectl(&["apply", "-f", p.to_str().unwrap()])
    }

    /// [`KubeLab::try_apply`], panicking with the diagnostics when it fails.
    pub fn apply(&self, name: &str, yaml: &str) {
        self.try_apply(name, yaml)
            .unwrap_or_else(|e| panic!("{e}{}", self.diagnostics()));
    }

    /// For a failure message: the tern-node pods and their ternd logs, the nodes' component
    /// logs.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        if !self.kubeconfig.as_os_str().is_empty() {
            let wide = [pods::TERN_NODE_PODS, &["-o", "wide"]].concat();
            out.push_str(&self.kubectl(&wide).unwrap_or_else(|e| e));
            out.push_str(&self.ternd_logs("15").unwrap_or_else(|e| e));
        }
        if let Ok(Some(st)) = LabState::load(&self.name)
            && let Some(k) = &st.kube
        {
            for n in &k.nodes {
                for p in &n.procs {
                    out.push_str(&format!(
                        "\n--- {} {} ---\n{}",
                        n.name,
                        p.name,
                        p.log_tail(10)
                    ));
                }
            }
        }
        out
    }

    /// The last `tail` lines (`-1`: all) of every tern-node pod's ternd.
    pub fn ternd_logs(&self, tail: &str) -> Result<String, String> {
        self.kubectl(&[
            "-n",
            "kube-system",
            "logs",
            "-l",
            "k8s-app=tern-node",
            "-c",
            "ternd",
            &format!("--tail={tail}"),
        ])
    }

    /// The nodes whose tern-node pod is Running with every container ready (sorted), and
    /// what kubectl said of all the tern-node pods (a line a pod).
    pub fn tern_node_pods_ready(&self) -> (Vec<String>, String) {
        let ds = self.must(
            &[
                pods::TERN_NODE_PODS,
                &[
                    "-o",
                    r#"jsonpath={range .items[*]}{.spec.nodeName} {.status.phase} {.status.containerStatuses[*].ready}{"\n"}{end}"#,
                ],
            ]
            .concat(),
        );
        let mut on: Vec<String> = ds
            .lines()
            .filter(|l| l.ends_with("Running true true"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        on.sort();
        (on, ds)
    }

    /// Waits until pod `name` is Running and Ready; its address.
    pub fn wait_ready(&self, name: &str) -> String {
        self.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=120s",
        ])
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n{}{}",
                self.kubectl(&["describe", "pod", name]).unwrap_or_default(),
                self.diagnostics()
            )
        });
        self.must(&["get", "pod", name, "-o", "jsonpath={.status.podIP}"])
            .trim()
            .to_string()
    }

    /// `kubectl exec FROM -- nc -w 2 IP 8080`: the answer (a [`NAME_SERVER`] pod's name), if
    /// any.
    pub fn ask(&self, from: &str, ip: &str) -> Option<String> {
        self.kubectl(&["exec", from, "--", "nc", "-w", "2", ip, "8080"])
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// Polls [`KubeLab::ask`] until it answers (`open`) or stops answering (`!open`) for 3
    /// tries in a row; panics after `timeout`. Returns how long it took.
    pub fn wait_reach(&self, from: &str, ip: &str, open: bool, timeout: Duration) -> Duration {
        let t = Instant::now();
        let mut streak = 0;
        loop {
            let got = self.ask(from, ip);
            if got.is_some() == open {
                streak += if open { 3 } else { 1 };
                if streak >= 3 {
                    return t.elapsed();
                }
            } else {
                streak = 0;
            }
            assert!(
                t.elapsed() < timeout,
                "{from} -> {ip}: still {} after {timeout:?} ({got:?}){}",
                if open { "denied" } else { "open" },
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `kubectl rollout restart daemonset tern-node -n kube-system`, then `kubectl rollout
    /// status` until the new pods are ready (240 s at most; then it panics with the
    /// diagnostics).
    pub fn rollout_restart_tern_node(&self) {
        self.must(&[
            "-n",
            "kube-system",
            "rollout",
            "restart",
            "daemonset",
            "tern-node",
        ]);
        self.wait_tern_node_rollout();
    }

    /// `kubectl rollout status` of the tern-node DaemonSet until its pods are updated and
    /// ready (240 s at most; then it panics with the diagnostics).
    pub fn wait_tern_node_rollout(&self) {
        self.kubectl(&[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "daemonset/tern-node",
            "--timeout=240s",
        ])
        .unwrap_or_else(|e| panic!("{e}{}", self.diagnostics()));
    }

    /// The Nodes that are Ready, and what kubectl said of all of them.
    pub fn ready_nodes(&self) -> (usize, String) {
        let nodes = self.must(&[
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ]);
        (
            nodes.lines().filter(|l| l.ends_with(" True")).count(),
            nodes,
        )
    }

    /// Waits until exactly `n` pods labelled `selector` exist, all Running with an address (no
    /// pod terminating); panics after 180 s with the pods and the diagnostics.
    pub fn wait_pods(&self, selector: &str, n: usize) -> Vec<pods::KubePod> {
        let list = [
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            pods::POD_LINES_JSONPATH,
        ];
        pods::wait_running(n, Duration::from_secs(180), || self.kubectl(&list)).unwrap_or_else(
            |e| {
                panic!(
                    "{e}\n{}\n{}",
                    self.kubectl(&["describe", "pods", "-l", selector])
                        .unwrap_or_else(|e| e),
                    self.diagnostics()
                )
            },
        )
    }

    /// `lab down`, then checks that it left no cgroup or namespace and restored the sysctls;
    /// what it did.
    pub fn down_clean(&self) -> Vec<String> {
        let done = tern_lab::down(&self.name).expect("lab down");
        let prefix = tern_lab::state::ns_prefix(&self.name);
        assert!(kube::sys::with_prefix(&prefix).is_empty(), "cgroups left");
        assert!(
            tern_lab::process::netns_with_prefix(&prefix).is_empty(),
            "namespaces left"
        );
        let others_after = other_clusters(&self.name);
        if self.others_before.is_empty() && others_after.is_empty() {
            assert_eq!(
                kube::sys::read_current().unwrap(),
                self.sysctls_before,
                "sysctls restored"
            );
        } else {
            eprintln!(
                "sysctl check not applicable: other clusters ran meanwhile: {:?} {others_after:?}",
                self.others_before
            );
        }
        done
    }
}

/// The container command of a pod answering every TCP connection on :8080 with its name.
pub const NAME_SERVER: &str = r#"["nc", "-ll", "-p", "8080", "-e", "/bin/hostname"]"#;

/// A `spec` line of [`busybox_pod`]: the pod runs once (restartPolicy Never, so an exit is
/// seen, not hidden by a restart).
pub const RUN_ONCE: &str = "  restartPolicy: Never\n";

/// A busybox pod bound to `node`: `metadata` and `spec` are extra lines of those sections
/// (indented two spaces), `command` the container's command as a YAML flow list.
pub fn busybox_pod(name: &str, node: &str, metadata: &str, spec: &str, command: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
{metadata}spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
{spec}  containers:
  - name: main
    image: tern-busybox:1
    imagePullPolicy: Never
    command: {command}
"#
    )
}

/// A pod running `script` under sh once ([`RUN_ONCE`]).
pub fn shell_pod(name: &str, node: &str, script: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    busybox_pod(
        name,
        node,
        "",
        RUN_ONCE,
        &format!(r#"["sh", "-c", {script}]"#),
    )
}

/// Asserts that each `(pod, address)` is an IPv4 address in tern's `pool` and on a line of
/// `weps` (`ternctl get wep -o wide`) naming the pod.
pub fn assert_tern_addresses(pool: &ipnet::Ipv4Net, weps: &str, pods: &[(&str, &String)]) {
    for &(pod, addr) in pods {
        let v4: std::net::Ipv4Addr = addr.parse().unwrap_or_else(|_| panic!("{pod}: {addr:?}"));
        assert!(pool.contains(&v4), "{pod} {addr} not in tern's pool {pool}");
        assert!(
            weps.lines()
                .any(|l| l.contains(pod) && l.contains(addr.as_str())),
            "{pod} {addr} not among tern's endpoints:\n{weps}"
        );
    }
}

/// `ip netns exec NETNS ternctl`: ternctl in a lab node's namespace, arguments to follow.
pub fn ternctl_in(netns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns]).arg(super::ternctl());
    c
}

/// Runs a ternctl command: (success, stdout + stderr).
pub fn ternctl_output(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("ternctl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `ternctl --store <lab store> ARGS`, run in a node's namespace (an etcd store is reachable
/// only from the lab's namespaces): (success, stdout + stderr).
pub fn ternctl_store(st: &LabState, args: &[&str]) -> (bool, String) {
    ternctl_output(
        ternctl_in(&st.nodes[0].netns)
            .args(["--store", &st.store_url()])
            .args(args),
    )
}

/// The etcd processes of lab `name` (PID and command line): every process whose program is
/// an `etcd` and whose command line names the lab's directory (its data directory lies there).
pub fn lab_etcd_processes(name: &str) -> Vec<(u32, String)> {
    let dir = format!("{}/", tern_lab::state::lab_dir(name).display());
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        // A process that exits meanwhile has no command line: not an etcd of ours.
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_etcd = args
            .first()
            .is_some_and(|a| Path::new(a).file_name().is_some_and(|f| f == "etcd"));
        if is_etcd && args.iter().any(|a| a.starts_with(&dir)) {
            found.push((pid, args.join(" ")));
        }
    }
    found
}

/// Asserts that the only etcd of lab `st` is its control plane's (the API server's own): the
/// lab runs on the Kubernetes datastore and started no etcd of tern's (no etcd recorded, no
/// etcd namespace, no such process).
pub fn assert_no_tern_etcd(st: &LabState) {
    assert_eq!(st.store, tern_lab::StoreKind::Kubernetes, "the lab's store");
    assert!(
        st.store_url().starts_with("kubernetes://"),
        "{}",
        st.store_url()
    );
    assert_eq!(st.etcd, None, "the lab records an etcd of tern's");
    let etcd_ns = tern_lab::state::etcd_ns(&st.name);
    assert!(
        !tern_lab::process::netns_with_prefix(&etcd_ns).contains(&etcd_ns),
        "namespace {etcd_ns} exists"
    );
    let k = st.kube.as_ref().expect("a Kubernetes lab");
    let cp = k
        .control
        .iter()
        .find(|p| p.name == "etcd")
        .expect("the control plane's etcd is recorded");
    let procs = lab_etcd_processes(&st.name);
    let cp_data = format!("{}/etcd", k.dir.display());
    assert!(
        procs.len() == 1 && procs[0].0 == cp.pid && procs[0].1.contains(&cp_data),
        "etcd processes of lab {} (only the control plane's, pid {}, {cp_data}, may run): {procs:?}",
        st.name,
        cp.pid
    );
}
