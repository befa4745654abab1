//! Harness of the API-server-only Kubernetes tests: a real etcd and kube-apiserver (no kubelet,
//! no controller-manager) on the loopback of a node network namespace, with certificates made
//! by the `openssl` CLI, RBAC authorization, an admin `kubectl`, and client-certificate
//! kubeconfigs for other users (ternd's).
//!
//! Everything runs inside a network namespace the test created (`ip netns exec`), so the root
//! namespace is never touched and fixed ports cannot collide with anything. Every process is
//! started by this harness and killed by PID on drop; the files live in the caller's temp dir.

#![allow(dead_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `scripts/k8s-components.sh` puts the binaries (overridable with `TERN_K8S_BIN`).
pub const DEFAULT_BIN: &str = "/var/cache/tern/k8s/v1.34.4/bin";
/// Port of etcd's client URL on the namespace's loopback.
pub const ETCD_PORT: u16 = 2379;
/// Port of kube-apiserver's secure port on the namespace's loopback.
pub const API_PORT: u16 = 6443;

/// Directory of the Kubernetes binaries; panics (the test fails) naming the command that
/// builds them when one is missing.
pub fn bin_dir() -> PathBuf {
    let dir = PathBuf::from(std::env::var("TERN_K8S_BIN").unwrap_or_else(|_| DEFAULT_BIN.into()));
    let missing: Vec<&str> = ["etcd", "kube-apiserver", "kubectl"]
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "Kubernetes binaries {missing:?} are missing in {} (set TERN_K8S_BIN to another \
         directory). Build them with:\n    scripts/k8s-components.sh\n(from the repository \
         root; it needs Go 1.24+ and prints the directory it filled)",
        dir.display()
    );
    dir
}

/// Runs `f` on a fresh thread inside the network namespace at `ns_path`.
pub fn in_netns<T: Send + 'static>(ns_path: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = ns_path.to_string();
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: setns on a descriptor we own; it only changes this thread's namespace.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("namespace thread panicked")
}

/// Polls `cond` every 100 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl (is the openssl CLI installed?)");
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority in `dir` (`ca.crt`, `ca.key`) that signs server and client certs.
pub struct Ca {
    pub dir: PathBuf,
}

impl Ca {
    pub fn new(dir: &Path) -> Ca {
        std::fs::create_dir_all(dir).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=tern-test-ca",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            ],
        );
        Ca {
            dir: dir.to_path_buf(),
        }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// Signs a key pair `<name>.crt`/`<name>.key` for `subject` with the given extensions
    /// (an `openssl x509 -extfile` body).
    pub fn issue(&self, name: &str, subject: &str, ext: &str) -> (PathBuf, PathBuf) {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.crt");
        let extf = format!("{name}.ext");
        std::fs::write(self.dir.join(&extf), ext).unwrap();
        openssl(
            &self.dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &extf,
            ],
        );
        (self.dir.join(crt), self.dir.join(key))
    }

    /// A client certificate for user `cn` in groups `orgs`.
    pub fn client(&self, name: &str, cn: &str, orgs: &[&str]) -> (PathBuf, PathBuf) {
        let mut subject = String::new();
        for o in orgs {
            subject.push_str(&format!("/O={o}"));
        }
        subject.push_str(&format!("/CN={cn}"));
        self.issue(
            name,
            &subject,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        )
    }
}

/// etcd + kube-apiserver inside the network namespace `netns`.
pub struct KubeApi {
    pub netns: String,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub ca: Ca,
    /// The node's underlay address, advertised by the API server.
    pub advertise: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    apiserver_starts: usize,
    admin: PathBuf,
}

impl KubeApi {
    /// Starts etcd and kube-apiserver in `netns` with files under `dir`, and waits until the
    /// API server is ready (RBAC bootstrap roles included).
    pub fn start(netns: &str, dir: &Path, advertise: &str) -> KubeApi {
        let bin = bin_dir();
        std::fs::create_dir_all(dir).unwrap();
        let ca = Ca::new(&dir.join("pki"));
        ca.issue(
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:{advertise},\
                 IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
            ),
        );
        openssl(&ca.dir, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(
            &ca.dir,
            &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"],
        );
        let mut api = KubeApi {
            netns: netns.to_string(),
            dir: dir.to_path_buf(),
            bin,
            ca,
            advertise: advertise.to_string(),
            etcd: None,
            apiserver: None,
            apiserver_starts: 0,
            admin: PathBuf::new(),
        };
        api.admin = api.kubeconfig("admin", "admin", &["system:masters"]);
        api.start_etcd();
        api.start_apiserver();
        api
    }

    fn spawn(&self, log: &str, bin: &Path, args: &[String]) -> Child {
        let log = File::create(self.dir.join(log)).unwrap();
        Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()))
    }

    fn port_open(&self, port: u16) -> bool {
        in_netns(&format!("/run/netns/{}", self.netns), move || {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                Duration::from_millis(300),
            )
            .is_ok()
        })
    }

    fn start_etcd(&mut self) {
        let data = self.dir.join("etcd-data");
        let url = format!("http://127.0.0.1:{ETCD_PORT}");
        let peer = "http://127.0.0.1:2380".to_string();
        let args: Vec<String> = vec![
            "--name".into(),
            "default".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--listen-client-urls".into(),
            url.clone(),
            "--advertise-client-urls".into(),
            url,
            "--listen-peer-urls".into(),
            peer.clone(),
            "--initial-advertise-peer-urls".into(),
            peer.clone(),
            "--initial-cluster".into(),
            format!("default={peer}"),
            "--unsafe-no-fsync".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        let etcd = self.bin.join("etcd");
        self.etcd = Some(self.spawn("etcd.log", &etcd, &args));
        let up = wait_until(Duration::from_secs(20), || self.port_open(ETCD_PORT));
        assert!(
            up,
            "etcd did not listen within 20 s: {}",
            self.log("etcd.log")
        );
    }

    /// Starts kube-apiserver (again) and waits for `/readyz`.
    pub fn start_apiserver(&mut self) {
        assert!(self.apiserver.is_none(), "kube-apiserver already running");
        let pki = &self.ca.dir;
        let p = |f: &str| pki.join(f).display().to_string();
        let args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{ETCD_PORT}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={API_PORT}"),
            format!("--advertise-address={}", self.advertise),
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        self.apiserver_starts += 1;
        let log = format!("kube-apiserver.{}.log", self.apiserver_starts);
        let bin = self.bin.join("kube-apiserver");
        self.apiserver = Some(self.spawn(&log, &bin, &args));
        let ready = wait_until(Duration::from_secs(120), || {
            if let Some(c) = self.apiserver.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("kube-apiserver exited ({st}): {}", self.log(&log));
            }
            self.kubectl(&["get", "--raw=/readyz"]).is_ok()
        });
        assert!(
            ready,
            "kube-apiserver not ready within 120 s: {}",
            self.log(&log)
        );
    }

    /// Kills kube-apiserver (SIGKILL by PID) and reaps it.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self, name: &str) -> String {
        let s = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let tail: Vec<&str> = s.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Writes a kubeconfig for user `cn` (groups `orgs`) with a client certificate.
    pub fn kubeconfig(&self, name: &str, cn: &str, orgs: &[&str]) -> PathBuf {
        let (crt, key) = self.ca.client(name, cn, orgs);
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
             https://127.0.0.1:{API_PORT}\n    certificate-authority: {}\nusers:\n- name: {name}\n  \
             user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: test\n  \
             context:\n    cluster: test\n    user: {name}\ncurrent-context: test\n",
            self.ca.cert().display(),
            crt.display(),
            key.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs admin `kubectl ARGS` in the namespace; stdout or stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_in(args, None)
    }

    /// Admin `kubectl ARGS` with `stdin` (e.g. `apply -f -`).
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.admin)
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning kubectl");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().expect("kubectl");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `kubectl apply -f -` that must succeed.
    pub fn apply(&self, yaml: &str) {
        if let Err(e) = self.kubectl_in(&["apply", "-f", "-"], Some(yaml)) {
            panic!("kubectl apply failed: {e}\n{yaml}");
        }
    }

    /// `kubectl ARGS` that must succeed.
    pub fn must(&self, args: &[&str]) -> String {
        self.kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {} failed: {e}", args.join(" ")))
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.stop_apiserver();
        if let Some(mut c) = self.etcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
