//! The IPAM storm of issue 19 with real agents on the Kubernetes datastore: three `ternd`
//! processes (`--store kubernetes`, each with its Kubernetes source, as the manifest's
//! DaemonSet runs them), each for its own node in its own node namespace, reach one real
//! kube-apiserver over an underlay bridge and take concurrent CNI ADDs over their sockets for
//! pods that exist in the API server, bound to their nodes.
//!
//! Two waves. In the first, one agent is killed with SIGKILL twice in its middle and started
//! again; in the second, kube-apiserver is killed with SIGKILL and started again in its
//! middle. The client acts as a runtime does: a failed ADD is followed by DELs until one
//! succeeds, then the pod gets a new sandbox and is added again; the sandbox's address goes
//! into the Pod's status as kubelet reports it (the Kubernetes datastore derives the
//! WorkloadEndpoints from the Pods). After each wave:
//!
//! - no address is held by two live pods (0 duplicates): every pod's address is its own, on
//!   its `eth0`, and allocated in IPAM to its attachment's handle, also after leak repair had
//!   time to act on the restarted agent, and the IPAM audit finds no address used twice;
//! - in the API server outage, a failed ADD answers code 11 (try again), also in the moment
//!   after its restart when it serves before its RBAC caches are filled and answers 403
//!   (kubernetes#121635), and every DEL succeeds (ternd journals the release and replays it);
//! - once every pod is deleted (DEL through the socket, the Pod objects removed): IPAM holds no
//!   allocation of the wave's pods, the journals are empty, no pod veth is left on any node,
//!   and the audit (`tern_ipam::audit::check` and `ternctl ipam check` on the Kubernetes
//!   store) is clean.
//!
//! The figures (ADDs done and failed, DELs retried, kills, times) are printed; nothing is
//! timed. Needs root and the binaries of `scripts/k8s-components.sh`; without them
//! the test fails and says how to get them. Every namespace is uniquely named and removed on
//! drop, every process is killed by PID; the root namespace is never touched. Underlay
//! 198.18.7.0/24.

mod common;

use common::kube::NETWORK;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tern_api::{AddRequest, Attachment, DelRequest, PodRef, Reply, Request};
use tern_ipam::Ipam;
use tern_store::kube::{KubeConfig, KubeStore};
use tern_testkit::kube_api::KubeApi;
use tern_testkit::netns::{Netns, Underlay, in_netns};
use tern_testkit::ternd::Ternd;
use tern_testkit::wait::wait_until;

const API_IP: &str = "198.18.7.1";
/// The nodes' default gateway: on the underlay's subnet, held by nobody (every address the
/// test uses is on that subnet).
const GATEWAY: &str = "198.18.7.254";
const NODES: [(&str, &str); 3] = [
    ("storm-a", "198.18.7.11"),
    ("storm-b", "198.18.7.12"),
    ("storm-c", "198.18.7.13"),
];
/// The agent killed in the first wave.
const VICTIM: usize = 1;
/// Its SIGKILLs, at these fractions of its pods added.
const KILL_AT: [f64; 2] = [0.3, 0.65];
const PODS_PER_AGENT: usize = 40;
const WORKERS_PER_AGENT: usize = 4;
/// Small blocks, so that the three agents claim several blocks each, concurrently.
const POOL: &str = "apiVersion: tern.dev/v1
kind: IPPool
metadata: {name: storm-pool}
spec: {cidr: 10.247.0.0/22, blockSize: 28}
";
/// The plugin's own timeout of a call to ternd.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// A pod without an address this long after its wave began means the cluster did not recover
/// (a bound against hanging, not a measurement).
const WAVE_LIMIT: Duration = Duration::from_secs(240);

/// A node: its agent (killed first on drop), then its namespace.
struct Agent {
    ternd: Ternd,
    ns: Netns,
}

/// The API server's namespace, the three nodes and the underlay bridge between them, all
/// removed on drop (agents first, then the API server, then the namespaces).
struct Cluster {
    agents: Vec<Agent>,
    api: KubeApi,
    api_ns: Netns,
    _underlay: Underlay,
    /// An admin kubeconfig of the test's own clients (store, kubectl, ternctl).
    admin: PathBuf,
    ternctl: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        // The binaries the test runs (ternd, ternctl), checked current before anything starts.
        let ternctl = tern_testkit::workspace_binaries(&common::cargo_ternd()).join("ternctl");
        let tmp = tempfile::Builder::new().prefix("tks-").tempdir().unwrap();
        let underlay = Underlay::new();
        let api_ns = Netns::new("k");
        underlay.attach(&api_ns, &format!("{API_IP}/24"), GATEWAY);
        let api = KubeApi::start_reachable(&api_ns.name, &tmp.path().join("k8s"), API_IP);
        api.install_crds();
        // ternd authenticates as the manifest's ServiceAccount with the manifest's RBAC.
        api.apply(&tern_testkit::kube_api::manifest_rbac());
        api.apply(POOL);
        let nodes: Vec<String> = NODES
            .iter()
            .map(|(n, _)| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n"))
            .collect();
        api.apply(&nodes.join("---\n"));
        let admin = api.kubeconfig("storm-admin", "storm-admin", &["system:masters"]);
        // ternd's credentials, with the API server's underlay address.
        let kubeconfig = api.remote_kubeconfig("tern-node", tern_testkit::kube_api::SA_USER, &[]);
        let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
        let mut agents = Vec::new();
        for (name, ip) in NODES {
            let ns = Netns::new("n");
            underlay.attach(&ns, &format!("{ip}/24"), GATEWAY);
            let node_ip = format!("--node-ip={ip}");
            let ternd = Ternd::new(
                &ns.name,
                &tmp.path().join(name),
                name,
                &[
                    "--store=kubernetes",
                    &kubeconfig,
                    &node_ip,
                    "--default-ipv4-pool=10.247.0.0/22",
                    "--mtu=1500",
                    "--resync-seconds=1",
                    "--leak-grace-seconds=2",
                    "--log-level=info",
                ],
            );
            agents.push(Agent { ternd, ns });
        }
        for a in agents.iter_mut() {
            a.ternd.start();
        }
        for a in &agents {
            a.ternd.wait_ready(Duration::from_secs(60));
        }
        Cluster {
            agents,
            api,
            api_ns,
            _underlay: underlay,
            admin,
            ternctl,
            _tmp: tmp,
        }
    }

    /// Runs `f` with a fresh client of the Kubernetes store, in the API server's namespace
    /// (every socket the client opens is made there).
    fn with_store<T: Send>(&self, f: impl FnOnce(Arc<KubeStore>) -> T + Send) -> T {
        let admin = self.admin.clone();
        in_netns(&self.api_ns.path(), move || {
            let cfg = KubeConfig::from_kubeconfig(&admin).unwrap();
            f(Arc::new(
                KubeStore::connect(cfg).expect("connecting to the API server"),
            ))
        })
    }

    /// The Kubernetes namespace `ns` with its default service account and
    /// `PODS_PER_AGENT` pods per node; the pods with their UIDs, by agent.
    fn create_pods(&self, ns: &str) -> Vec<Vec<PodSpec>> {
        let mut docs = vec![
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"),
            format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {ns}}}\n"
            ),
        ];
        self.api
            .kubectl_in(&["create", "-f", "-"], Some(&docs.join("---\n")))
            .unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
        docs.clear();
        for (a, (node, _)) in NODES.iter().enumerate() {
            for i in 0..PODS_PER_AGENT {
                docs.push(format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{a}-{i}, namespace: {ns}}}\n\
                     spec: {{nodeName: {node}, automountServiceAccountToken: false, \
                     containers: [{{name: c, image: pause}}]}}\n"
                ));
            }
        }
        self.api
            .kubectl_in(&["create", "-f", "-"], Some(&docs.join("---\n")))
            .unwrap_or_else(|e| panic!("creating the pods of {ns}: {e}"));
        let uids = self.api.must(&[
            "get",
            "pods",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{\"\\n\"}{end}",
        ]);
        let uids: HashMap<&str, &str> = uids.lines().filter_map(|l| l.split_once(' ')).collect();
        (0..NODES.len())
            .map(|a| {
                (0..PODS_PER_AGENT)
                    .map(|i| {
                        let name = format!("p{a}-{i}");
                        let uid = uids
                            .get(name.as_str())
                            .unwrap_or_else(|| panic!("no UID for pod {ns}/{name}"))
                            .to_string();
                        PodSpec {
                            namespace: ns.to_string(),
                            name,
                            uid,
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Admin kubectl in the API server's namespace, usable while `api` is borrowed mutably.
    fn kubectl(&self) -> Kubectl {
        Kubectl {
            netns: self.api_ns.name.clone(),
            bin: self.api.bin.join("kubectl"),
            kubeconfig: self.admin.clone(),
        }
    }

    /// `ternctl --store kubernetes:///<admin kubeconfig> ipam check` in the API server's
    /// namespace: whether it found no problem, and its output.
    fn ternctl_ipam_check(&self) -> (bool, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.api_ns.name])
            .arg(&self.ternctl)
            .arg(format!("--store=kubernetes://{}", self.admin.display()))
            .args(["ipam", "check"])
            .stdin(Stdio::null())
            .output()
            .expect("running ternctl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn logs(&self) -> String {
        self.agents
            .iter()
            .zip(NODES)
            .map(|(a, (n, _))| format!("--- ternd {n}\n{}", tail(&a.ternd.log(), 60)))
            .collect()
    }
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}

/// kubectl with the admin kubeconfig inside a namespace (a plain value: threads keep it while
/// the test restarts the API server).
#[derive(Clone)]
struct Kubectl {
    netns: String,
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns])
            .arg(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=5s")
            .args(args);
        let out = common::output_with_stdin(&mut cmd, stdin.as_bytes());
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// A pod of the API server, as the runtime knows it.
#[derive(Clone)]
struct PodSpec {
    namespace: String,
    name: String,
    uid: String,
}

/// A pod whose sandbox was added: its sandbox namespace (kept until its DEL), attachment and
/// address.
struct Live {
    agent: usize,
    pod: PodSpec,
    ns: Netns,
    att: Attachment,
    ip: IpAddr,
}

/// Why one call failed.
enum Failure {
    /// ternd answered with a CNI error.
    Cni { code: u32, msg: String },
    /// No answer: ternd is not running, or the connection broke (an ADD in flight when it
    /// was killed).
    Transport(tern_api::CallError),
}

impl Failure {
    /// What the figures count it as.
    fn kind(&self) -> String {
        match self {
            // A refusal by the API server's authorizer, which a restarted kube-apiserver
            // answers until its RBAC caches are filled.
            Failure::Cni { code, msg } if msg.contains("forbidden: ") => {
                format!("code {code} (forbidden)")
            }
            Failure::Cni { code, .. } => format!("code {code}"),
            Failure::Transport(tern_api::CallError::AgentDown(_)) => "agent down".into(),
            Failure::Transport(_) => "connection broken".into(),
        }
    }

    fn text(&self) -> String {
        match self {
            Failure::Cni { code, msg } => format!("code {code}: {msg}"),
            Failure::Transport(e) => format!("transport: {e}"),
        }
    }
}

/// The figures of one wave.
#[derive(Default)]
struct Figures {
    adds_ok: AtomicUsize,
    adds_failed: AtomicUsize,
    dels_ok: AtomicUsize,
    dels_failed: AtomicUsize,
    /// Successful ADDs per agent (the kill trigger).
    done: [AtomicUsize; NODES.len()],
    /// Failures by kind: count and the first message.
    add_errors: Mutex<BTreeMap<String, (usize, String)>>,
    del_errors: Mutex<BTreeMap<String, (usize, String)>>,
    /// Pods that never got an address within [`WAVE_LIMIT`]; DELs that never succeeded.
    gave_up: Mutex<Vec<String>>,
    live: Mutex<Vec<Live>>,
}

impl Figures {
    fn note(map: &Mutex<BTreeMap<String, (usize, String)>>, f: &Failure) {
        let mut m = map.lock().unwrap();
        let e = m.entry(f.kind()).or_insert_with(|| (0, f.text()));
        e.0 += 1;
    }

    fn print_errors(what: &str, map: &Mutex<BTreeMap<String, (usize, String)>>) {
        for (kind, (n, first)) in map.lock().unwrap().iter() {
            let first: String = first.chars().take(300).collect();
            eprintln!("    {what} failed, {kind}: {n} (first: {first})");
        }
    }
}

fn add(sock: &Path, pod_ns: &Netns, att: &Attachment) -> Result<IpAddr, Failure> {
    let f = File::open(pod_ns.path()).unwrap();
    let req = Request::Add(AddRequest::new(att.clone()));
    match tern_api::call(sock, &req, Some(f.as_raw_fd()), CALL_TIMEOUT) {
        Ok(Ok(Reply::Result(r))) => Ok(r.ips[0]
            .address
            .parse::<ipnet::IpNet>()
            .expect("ADD result address")
            .addr()),
        Ok(Ok(other)) => panic!("ADD answered {other:?}"),
        Ok(Err(e)) => Err(Failure::Cni {
            code: e.code,
            msg: e.msg,
        }),
        Err(e) => Err(Failure::Transport(e)),
    }
}

fn del(sock: &Path, att: &Attachment) -> Result<(), Failure> {
    let req = Request::Del(DelRequest {
        attachment: att.clone(),
        delegated_ipam: false,
    });
    match tern_api::call(sock, &req, None, CALL_TIMEOUT) {
        Ok(Ok(Reply::Done)) => Ok(()),
        Ok(Ok(other)) => panic!("DEL answered {other:?}"),
        Ok(Err(e)) => Err(Failure::Cni {
            code: e.code,
            msg: e.msg,
        }),
        Err(e) => Err(Failure::Transport(e)),
    }
}

/// DEL of `att` as a runtime does it: retried until it succeeds (or `limit`); the failures
/// counted.
fn del_until_done(sock: &Path, att: &Attachment, fig: &Figures, limit: Instant) -> bool {
    loop {
        match del(sock, att) {
            Ok(()) => {
                fig.dels_ok.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            Err(f) => {
                fig.dels_failed.fetch_add(1, Ordering::Relaxed);
                Figures::note(&fig.del_errors, &f);
                if Instant::now() > limit {
                    fig.gave_up.lock().unwrap().push(format!(
                        "DEL of {}: {}",
                        att.container_id,
                        f.text()
                    ));
                    return false;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// A pod brought up as a runtime does: a sandbox and its ADD; a failed ADD is followed by
/// DELs until one succeeds and a new sandbox, until one ADD succeeds (or `limit`). The
/// address goes to `status` (kubelet's status report).
fn provision(
    agent: usize,
    sock: &Path,
    pod: &PodSpec,
    fig: &Figures,
    status: &mpsc::Sender<(String, String, IpAddr)>,
    limit: Instant,
) {
    loop {
        let ns = Netns::new("p");
        let cid = format!("sandbox-{}", ns.name);
        let att = Attachment {
            network: NETWORK.into(),
            container_id: cid.clone(),
            ifname: "eth0".into(),
            netns_path: ns.path(),
            pod: Some(PodRef {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                infra_container_id: cid,
                uid: pod.uid.clone(),
            }),
        };
        match add(sock, &ns, &att) {
            Ok(ip) => {
                fig.adds_ok.fetch_add(1, Ordering::Relaxed);
                fig.done[agent].fetch_add(1, Ordering::Relaxed);
                let _ = status.send((pod.namespace.clone(), pod.name.clone(), ip));
                fig.live.lock().unwrap().push(Live {
                    agent,
                    pod: pod.clone(),
                    ns,
                    att,
                    ip,
                });
                break;
            }
            Err(f) => {
                fig.adds_failed.fetch_add(1, Ordering::Relaxed);
                Figures::note(&fig.add_errors, &f);
                let released = del_until_done(sock, &att, fig, limit);
                drop(ns);
                if !released || Instant::now() > limit {
                    fig.gave_up.lock().unwrap().push(format!(
                        "pod {}/{}: last ADD {}",
                        pod.namespace,
                        pod.name,
                        f.text()
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

/// kubelet's status reports: the addresses received on `rx` go into the Pods' status
/// (`phase: Running`, `podIP`, `podIPs`) in batches, by server-side apply of the status
/// subresource; a batch the API server refuses (it is down) is tried again. Ends once `rx` is
/// closed and every report is in, or `limit` has passed; the reports it could not make.
fn report_status(
    kubectl: Kubectl,
    rx: mpsc::Receiver<(String, String, IpAddr)>,
    limit: Instant,
) -> Vec<String> {
    let mut pending: Vec<(String, String, IpAddr)> = Vec::new();
    let mut closed = false;
    let mut last_err = String::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(300)) {
            Ok(r) => {
                pending.push(r);
                pending.extend(rx.try_iter());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => closed = true,
        }
        if !pending.is_empty() {
            let docs: Vec<String> = pending
                .iter()
                .map(|(ns, name, ip)| {
                    format!(
                        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                         status: {{phase: Running, podIP: '{ip}', podIPs: [{{ip: '{ip}'}}]}}\n"
                    )
                })
                .collect();
            match kubectl.run(
                &[
                    "apply",
                    "--server-side",
                    "--subresource=status",
                    "--field-manager=kubelet",
                    "-f",
                    "-",
                ],
                &docs.join("---\n"),
            ) {
                Ok(_) => pending.clear(),
                Err(e) => {
                    last_err = e;
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        if closed && pending.is_empty() {
            return Vec::new();
        }
        if closed && Instant::now() > limit {
            return pending
                .iter()
                .map(|(ns, n, ip)| format!("{ns}/{n} {ip}: {last_err}"))
                .collect();
        }
    }
}

/// What disturbs a wave in its middle.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// SIGKILL of agent [`VICTIM`] at each of [`KILL_AT`], started again at once.
    KillAgent,
    /// SIGKILL of kube-apiserver once a third of the pods are up, started again 8 s later.
    RestartApiServer,
}

/// One wave: pods in namespace `ns` added on every agent at once while `fault` strikes,
/// checked, deleted, checked again.
fn wave(c: &mut Cluster, ns: &str, fault: Fault) {
    let t0 = Instant::now();
    let pods = c.create_pods(ns);
    let socks: Vec<PathBuf> = c.agents.iter().map(|a| a.ternd.socket()).collect();
    let kubectl = c.kubectl();
    let fig = Figures::default();
    let limit = Instant::now() + WAVE_LIMIT;
    let finished = AtomicBool::new(false);
    let mut kills = 0;
    let mut outage = Duration::ZERO;
    let next: Vec<AtomicUsize> = (0..NODES.len()).map(|_| AtomicUsize::new(0)).collect();
    let t_wave = Instant::now();
    let unreported = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        let reporter = s.spawn(move || report_status(kubectl, rx, limit));
        let mut workers = Vec::new();
        for (a, sock) in socks.iter().enumerate() {
            for _ in 0..WORKERS_PER_AGENT {
                let (pods, next, fig, tx) = (&pods[a], &next[a], &fig, tx.clone());
                workers.push(s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(pod) = pods.get(i) else { break };
                        provision(a, sock, pod, fig, &tx, limit);
                    }
                }));
            }
        }
        drop(tx);
        let watcher = s.spawn(|| {
            for w in workers {
                w.join().unwrap();
            }
            finished.store(true, Ordering::Relaxed);
        });
        // The fault, in the middle of the wave.
        let wait_for = |c: &Cluster, pred: &dyn Fn() -> bool| {
            let ok = wait_until(WAVE_LIMIT, || pred() || finished.load(Ordering::Relaxed));
            assert!(ok, "the wave did not progress:\n{}", c.logs());
            assert!(
                !finished.load(Ordering::Relaxed),
                "the wave ended before its fault"
            );
        };
        match fault {
            Fault::KillAgent => {
                for at in KILL_AT {
                    let n = (PODS_PER_AGENT as f64 * at) as usize;
                    wait_for(c, &|| fig.done[VICTIM].load(Ordering::Relaxed) >= n);
                    let t = Instant::now();
                    c.agents[VICTIM].ternd.kill();
                    kills += 1;
                    std::thread::sleep(Duration::from_millis(800));
                    c.agents[VICTIM].ternd.start();
                    outage += t.elapsed();
                }
            }
            Fault::RestartApiServer => {
                let n = NODES.len() * PODS_PER_AGENT / 3;
                let total = || {
                    fig.done
                        .iter()
                        .map(|d| d.load(Ordering::Relaxed))
                        .sum::<usize>()
                };
                wait_for(c, &|| total() >= n);
                let t = Instant::now();
                c.api.stop_apiserver();
                kills += 1;
                // Longer than a store call's retry budget (6 s), so that ADDs fail.
                std::thread::sleep(Duration::from_secs(8));
                c.api.start_apiserver();
                outage += t.elapsed();
            }
        }
        watcher.join().unwrap();
        reporter.join().unwrap()
    });
    let wave_time = t_wave.elapsed();
    let gave_up = std::mem::take(&mut *fig.gave_up.lock().unwrap());
    assert!(
        gave_up.is_empty(),
        "{ns}: {} pods or DELs never succeeded: {gave_up:#?}\n{}",
        gave_up.len(),
        c.logs()
    );
    assert!(
        unreported.is_empty(),
        "{ns}: status not reported: {unreported:?}"
    );
    let mut live = std::mem::take(&mut *fig.live.lock().unwrap());
    assert_eq!(
        live.len(),
        NODES.len() * PODS_PER_AGENT,
        "{ns}: every pod is up"
    );

    // No address twice among the live pods.
    let mut owner: HashMap<IpAddr, String> = HashMap::new();
    for l in &live {
        if let Some(other) = owner.insert(l.ip, l.pod.name.clone()) {
            panic!("{ns}: {} was given to {other} and to {}", l.ip, l.pod.name);
        }
    }
    // Each on its pod's eth0.
    for l in &live {
        let addrs = l.ns.ip(&["-o", "-4", "addr", "show", "dev", "eth0"]);
        assert!(
            addrs.contains(&format!("inet {}/", l.ip)),
            "{ns}: pod {} lost {} from its eth0: {addrs}\n{}",
            l.pod.name,
            l.ip,
            c.logs()
        );
    }
    // Each still allocated to its attachment once leak repair (grace 2 s, resync 1 s) had
    // time to act on what the restarts left; the audit sees no address used twice.
    std::thread::sleep(Duration::from_secs(4));
    let (allocs, report) = c.with_store(|store| {
        let ipam = Ipam::new(store.clone());
        let allocs = ipam.allocations(None).unwrap();
        let report = tern_ipam::audit::check(&*store, &ipam).unwrap();
        (allocs, report)
    });
    let by_ip: HashMap<IpAddr, &tern_ipam::Allocation> = allocs.iter().map(|a| (a.ip, a)).collect();
    for l in &live {
        let a = by_ip.get(&l.ip).unwrap_or_else(|| {
            panic!(
                "{ns}: {} of pod {} on {} is not allocated\n{}",
                l.ip,
                l.pod.name,
                NODES[l.agent].0,
                c.logs()
            )
        });
        assert_eq!(
            (a.handle.as_deref(), a.attrs.pod.as_str()),
            (Some(l.att.handle().as_str()), l.pod.name.as_str()),
            "{ns}: the allocation of {} (pod {})",
            l.ip,
            l.pod.name
        );
    }
    assert!(
        report.duplicates.is_empty() && report.in_use_not_allocated.is_empty(),
        "{ns}: addresses in use twice or not allocated to their pod:\n{}",
        tern_ipam::audit::summary(&report)
    );
    let extra = allocs
        .iter()
        .filter(|a| a.attrs.namespace == ns && !owner.contains_key(&a.ip))
        .count();
    eprintln!(
        "{ns}: audit with every pod up: {} allocations, {} endpoints, {} allocated not in use, \
         0 in use not allocated, 0 duplicates; {extra} allocations of failed sandboxes left",
        report.allocations_checked,
        report.endpoints_checked,
        report.allocated_not_in_use.len(),
    );

    // DEL of every pod (retried until it succeeds), then the Pod objects go.
    let t_del = Instant::now();
    let dels_before = fig.dels_ok.load(Ordering::Relaxed);
    let del_limit = Instant::now() + WAVE_LIMIT;
    std::thread::scope(|s| {
        let chunk = live.len().div_ceil(NODES.len() * WORKERS_PER_AGENT);
        for part in live.chunks_mut(chunk) {
            let (socks, fig) = (&socks, &fig);
            s.spawn(move || {
                for l in part {
                    del_until_done(&socks[l.agent], &l.att, fig, del_limit);
                    l.ns.delete();
                }
            });
        }
    });
    let t_dels = t_del.elapsed();
    let gave_up = std::mem::take(&mut *fig.gave_up.lock().unwrap());
    assert!(gave_up.is_empty(), "{ns}: {gave_up:#?}\n{}", c.logs());
    // One request (deletecollection), immediate (no kubelet confirms a graceful deletion).
    c.api.must(&[
        "delete",
        "--raw",
        &format!("/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0"),
    ]);
    let t_pods = t_del.elapsed();

    // Nothing left: no allocation of the wave's pods, no journal entry, no pod veth, and a
    // clean audit.
    let mut last = String::new();
    let mut first: Option<String> = None;
    let clean = wait_until(Duration::from_secs(60), || {
        let (left, report) = c.with_store(|store| {
            let ipam = Ipam::new(store.clone());
            let left: Vec<String> = ipam
                .allocations(None)
                .unwrap()
                .into_iter()
                .filter(|a| a.attrs.namespace == ns)
                .map(|a| format!("{} {:?} ({})", a.ip, a.handle, a.attrs.node))
                .collect();
            (left, tern_ipam::audit::check(&*store, &ipam).unwrap())
        });
        let journals: usize = c
            .agents
            .iter()
            .map(|a| {
                tern_api::journal::pending(&a.ternd.state_dir())
                    .map(|v| v.len())
                    .unwrap_or(0)
            })
            .sum();
        let veths: Vec<String> = c.agents.iter().flat_map(|a| a.ns.tern_veths()).collect();
        let pods = c.api.must(&["get", "pods", "-n", ns, "-o", "name"]);
        let pods = pods.lines().count();
        last = format!(
            "allocations left: {left:?}\njournal entries: {journals}\nveths: {veths:?}\n\
             Pod objects: {pods}\n{}",
            tern_ipam::audit::summary(&report)
        );
        first.get_or_insert_with(|| {
            format!(
                "{} allocations, {journals} journal entries, {} veths, {} audit problems",
                left.len(),
                veths.len(),
                report.problems()
            )
        });
        left.is_empty() && journals == 0 && veths.is_empty() && pods == 0 && report.problems() == 0
    });

    assert!(
        clean,
        "{ns}: not clean after DEL of all:\n{last}\n{}",
        c.logs()
    );
    let t_clean = t_del.elapsed();
    let (ok, out) = c.ternctl_ipam_check();
    assert!(ok, "{ns}: ternctl ipam check:\n{out}");
    let found: Vec<&str> = out.lines().filter(|l| l.starts_with("Found")).collect();
    let t_ternctl = t_del.elapsed() - t_clean;

    let logs: String = c.agents.iter().map(|a| a.ternd.log()).collect();
    let count = |needle: &str| logs.matches(needle).count();
    eprintln!(
        "{ns} ({}): {} pods on {} agents, {} ADDs done, {} ADDs failed, {} DELs done ({} of \
         them the final DEL of a pod), {} DELs failed and retried; {kills} SIGKILL(s) of {}, \
         down {:.1} s in all; wave {:.1} s, DEL of all {:.1} s, Pod objects deleted {:.1} s, \
         clean {:.1} s after, ternctl ipam check {:.1} s; round {:.1} s",
        match fault {
            Fault::KillAgent => "agent killed",
            Fault::RestartApiServer => "API server restarted",
        },
        live.len(),
        NODES.len(),
        fig.adds_ok.load(Ordering::Relaxed),
        fig.adds_failed.load(Ordering::Relaxed),
        fig.dels_ok.load(Ordering::Relaxed),
        fig.dels_ok.load(Ordering::Relaxed) - dels_before,
        fig.dels_failed.load(Ordering::Relaxed),
        match fault {
            Fault::KillAgent => NODES[VICTIM].0,
            Fault::RestartApiServer => "kube-apiserver",
        },
        outage.as_secs_f64(),
        wave_time.as_secs_f64(),
        t_dels.as_secs_f64(),
        (t_pods - t_dels).as_secs_f64(),
        (t_clean - t_pods).as_secs_f64(),
        t_ternctl.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    eprintln!(
        "    just after the DELs: {}; ternctl ipam check: {}",
        first.unwrap_or_default(),
        found.join(" ")
    );
    Figures::print_errors("ADDs", &fig.add_errors);
    Figures::print_errors("DELs", &fig.del_errors);
    eprintln!(
        "    ternd logs so far: {} releases journaled, {} journal retries, {} leak repairs",
        count("release journaled at"),
        count("journal retry:"),
        count("leak repair: released")
    );

    match fault {
        Fault::KillAgent => {}
        Fault::RestartApiServer => {
            // The outage met the wave; ADD answered "try again" and DEL succeeded.
            assert!(
                fig.adds_failed.load(Ordering::Relaxed) > 0,
                "{ns}: no ADD met the outage"
            );
            // Code 11 while it is down, and also while a restarted kube-apiserver serves before
            // its RBAC caches are filled, refusing what it allows a moment later
            // (kubernetes#121635; counted apart as "forbidden").
            let errors = fig.add_errors.lock().unwrap();
            let other: Vec<_> = errors
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "code 11" | "code 11 (forbidden)"))
                .collect();
            assert!(
                other.is_empty(),
                "{ns}: ADDs in the API server outage failed otherwise than with code 11: \
                 {other:?}"
            );
            assert_eq!(
                fig.dels_failed.load(Ordering::Relaxed),
                0,
                "{ns}: DELs failed in the API server outage: {:?}",
                fig.del_errors.lock().unwrap()
            );
        }
    }
}

#[test]
fn ipam_storm_of_three_agents_through_agent_kill_and_api_server_restart() {
    tern_testkit::kube_api::need_k8s();
    let t0 = Instant::now();
    let mut c = Cluster::start();
    eprintln!(
        "API server and {} agents ready in {:.1} s",
        NODES.len(),
        t0.elapsed().as_secs_f64()
    );
    wave(&mut c, "storm-1", Fault::KillAgent);
    wave(&mut c, "storm-2", Fault::RestartApiServer);
    // Every address of both waves is free again; what remains is the nodes' blocks.
    let blocks = c.with_store(|store| Ipam::new(store).blocks().unwrap().len());
    eprintln!(
        "blocks of the pool at the end: {blocks}; test took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
