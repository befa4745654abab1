//! The Kubernetes lab of the ctl tests (`lab_kube`, `lab_kube_daemonset`): `ternctl lab up
//! --kubernetes`, kubectl through the operator's kubeconfig, failure diagnostics, the
//! Deployment's pods, `ternctl` against the lab's store, and the checks that `lab down` left
//! nothing behind.

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
            let logs = [
                "-n",
                "kube-system",
                "logs",
                "-l",
                "k8s-app=tern-node",
                "-c",
                "ternd",
                "--tail",
                "15",
            ];
            out.push_str(&self.kubectl(&logs).unwrap_or_else(|e| e));
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
        assert_eq!(
            kube::sys::read_current().unwrap(),
            self.sysctls_before,
            "sysctls restored"
        );
        done
    }
}

/// `ternctl --store <lab store> ARGS`, run in a node's namespace (an etcd store is reachable
/// only from the lab's namespaces): (success, stdout + stderr).
pub fn ternctl_store(st: &LabState, args: &[&str]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", &st.nodes[0].netns])
        .arg(super::ternctl())
        .args(["--store", &st.store_url()])
        .args(args)
        .output()
        .expect("ternctl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
