//! A real Kubernetes cluster on the lab, networked by tern (issue 12): `ternctl lab up
//! --nodes 3 --kubernetes` with the components `scripts/k8s-components.sh` builds, a
//! Deployment of 6 busybox pods spread over the 3 nodes, every pod Running with an address from
//! tern's pool that `ternctl get wep` also shows, and every pod reaching every other pod over
//! TCP through `kubectl exec`; for `--encap none` and `vxlan`. Then `lab down` leaves no
//! namespace, cgroup or changed sysctl behind.
//!
//! Needs root and the components; without them the test FAILS with what is missing (it never
//! passes by skipping). The lab has a unique name and is removed by a guard.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tern_lab::kube;
use tern_lab::kube::pods::KubePod as Pod;
use tern_lab::kube::probe::{self, Dial};

mod common;
use common::kube_lab::{KubeLab as Lab, ternctl_store as ternctl_out};

/// The workspace's binaries, rebuilt when stale (the shared lab harness).
fn bin_dir() -> std::path::PathBuf {
    common::fresh_binaries().to_path_buf()
}

/// Preconditions; panics (fails the test) naming what is missing.
fn preconditions() -> std::path::PathBuf {
    common::kube_preconditions("lab_kube")
}

/// `hp` answers TCP on its node's port 18080 (hostPort, through the chained portmap) and
/// sinks TCP on 9000; `bw` (egress limited to 2 Mbit/s, through the chained bandwidth plugin)
/// and `free` (no limit) send to it, both on another node.
const EXTRAS: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: hp}
spec:
  nodeName: node1
  terminationGracePeriodSeconds: 1
  containers:
  - {name: web, image: tern-busybox:1, imagePullPolicy: Never, ports: [{containerPort: 8080, hostPort: 18080}],
     command: ["nc", "-ll", "-p", "8080", "-e", "/bin/hostname"]}
  - name: sink
    image: localhost/tern/probe:1
    imagePullPolicy: Never
    command: ["/probe", "sink", "9000"]
---
apiVersion: v1
kind: Pod
metadata:
  name: bw
  annotations: {kubernetes.io/egress-bandwidth: "2M"}
spec:
  nodeName: node2
  terminationGracePeriodSeconds: 1
  containers:
  - {name: p, image: "localhost/tern/probe:1", imagePullPolicy: Never, command: ["/probe", "serve-udp", "8081"]}
---
apiVersion: v1
kind: Pod
metadata: {name: free}
spec:
  nodeName: node2
  terminationGracePeriodSeconds: 1
  containers:
  - {name: p, image: "localhost/tern/probe:1", imagePullPolicy: Never, command: ["/probe", "serve-udp", "8081"]}
"#;

/// One cluster at a time: they share the machine's two cores and the kernel-wide sysctls
/// whose restoration each test checks.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cluster_test(encap: &str, restarts: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let k8s = preconditions();
    let lab = Lab::up("k", &k8s, &["--nodes", "3", "--encap", encap]);
    let name = lab.name.clone();
    // Every node Ready, through the operator's kubeconfig (the relay in the root namespace).
    let (ready, nodes) = lab.ready_nodes();
    assert_eq!(ready, 3, "nodes: {nodes}");
    let version = lab.kubectl(&["version"]).unwrap();
    assert!(
        version.matches(kube::K8S_VERSION).count() >= 2,
        "client and server report {}: {version}",
        kube::K8S_VERSION
    );

    // The Deployment.
    lab.apply("web", &kube::pods::echo_deployment("web", 6, true));
    let t1 = Instant::now();
    let pods = wait_pods(&lab, 6);
    eprintln!("6 pods Running after {:?}", t1.elapsed());
    let st = tern_lab::LabState::load(&name).unwrap().unwrap();
    for n in &st.kube.as_ref().unwrap().nodes {
        assert!(
            n.ready_before_cni.starts_with("Ready=False")
                && n.ready_before_cni.contains("cni plugin not initialized"),
            "{}: before tern's conflist the Node must be NotReady for want of a network: {:?}",
            n.name,
            n.ready_before_cni
        );
    }
    check_addresses(&st, &pods);
    let per_node: std::collections::BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
    assert_eq!(per_node.len(), 3, "pods spread over all nodes: {pods:?}");
    assert_mesh(&lab, &pods);
    // kubectl logs and port-forward work (the kubelet's serving certificate is trusted).
    lab.kubectl(&["logs", &pods[0].name]).unwrap();
    port_forward(&lab, &pods[1]);
    services(&lab, &pods);
    if restarts {
        host_port_and_bandwidth(&lab, &name, &pods);
    } else {
        drain_and_delete(&lab, &name);
    }

    if restarts {
        let mut st = tern_lab::LabState::load(&name).unwrap().unwrap();
        let step = |what: &str, st: &mut tern_lab::LabState| {
            let r = match what {
                "kubelet" => kube::node::restart(st, "node1", "kubelet", Duration::from_secs(90)),
                "containerd" => {
                    kube::node::restart(st, "node2", "containerd", Duration::from_secs(90))
                }
                // ternd is node3's tern-node pod (the DaemonSet): deleted, it is replaced.
                _ => restart_ternd_pod(&lab, "node3"),
            };
            r.unwrap_or_else(|e| panic!("restart of {what}: {e}{}", lab.diagnostics()));
            let after = wait_pods(&lab, 6);
            let key = |v: &[Pod]| {
                let mut k: Vec<(String, String)> =
                    v.iter().map(|p| (p.name.clone(), p.ip.clone())).collect();
                k.sort();
                k
            };
            assert_eq!(
                key(&after),
                key(&pods),
                "pods and addresses after restarting {what}"
            );
            assert_mesh(&lab, &after);
            eprintln!("{what} restarted: pods kept their addresses and connectivity");
        };
        step("kubelet", &mut st);
        step("containerd", &mut st);
        step("ternd", &mut st);
        // New pods still start.
        lab.kubectl(&["scale", "deployment", "web", "--replicas", "9"])
            .unwrap();
        let nine = wait_pods(&lab, 9);
        check_addresses(&st, &nine);
    }

    // Scale to zero: every address released, nothing leaked; and back.
    lab.kubectl(&["scale", "deployment", "web", "--replicas", "0"])
        .unwrap();
    wait_pods(&lab, 0);
    let weps = ternctl_out(&st, &["get", "wep", "-o", "wide"]);
    assert!(
        !weps.1.contains("web-"),
        "no workload endpoint left after scaling to 0:\n{}",
        weps.1
    );
    let check = ternctl_out(&st, &["ipam", "check"]);
    assert!(check.0, "ipam check after scaling to 0:\n{}", check.1);
    let show = ternctl_out(&st, &["ipam", "show"]);
    lab.kubectl(&["scale", "deployment", "web", "--replicas", "6"])
        .unwrap();
    let again = wait_pods(&lab, 6);
    check_addresses(&st, &again);
    eprintln!(
        "scaled to 0 (ipam check clean; {}) and back to 6",
        show.1.trim().replace('\n', " | ")
    );

    // Teardown leaves nothing.
    let done = lab.down_clean();
    assert!(
        done.iter().any(|d| d.contains("cgroup")),
        "down removed cgroups: {done:?}"
    );
}

#[test]
fn kubernetes_deployment_over_tern_direct() {
    cluster_test("none", true);
}

#[test]
fn kubernetes_deployment_over_tern_vxlan() {
    cluster_test("vxlan", false);
}

/// Deletes the tern-node pod of `node` and waits until the DaemonSet's replacement is Ready.
fn restart_ternd_pod(lab: &Lab, node: &str) -> Result<(), tern_lab::LabError> {
    let field = format!("spec.nodeName={node}");
    let sel = [
        "-n",
        "kube-system",
        "-l",
        "k8s-app=tern-node",
        "--field-selector",
        field.as_str(),
    ];
    let old = lab
        .kubectl(&[&["get", "pods", "-o", "name"][..], &sel[..]].concat())
        .map_err(tern_lab::LabError::Invalid)?;
    lab.kubectl(&[&["delete", "pods"][..], &sel[..]].concat())
        .map_err(tern_lab::LabError::Invalid)?;
    let t = Instant::now();
    loop {
        let now = lab
            .kubectl(&[
                    &["get", "pods", "-o", "jsonpath={.items[*].metadata.name} {.items[*].status.containerStatuses[*].ready}"][..],
                    &sel[..],
                ]
                .concat(),
            )
            .unwrap_or_default();
        let name = now.split_whitespace().next().unwrap_or("");
        if !name.is_empty() && !old.contains(name) && now.ends_with("true true") {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(90) {
            return Err(tern_lab::LabError::Timeout(format!(
                "no new Ready tern-node pod on {node}: {now}"
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until exactly `n` pods of the Deployment exist, all Running with an address (no pod
/// terminating).
fn wait_pods(lab: &Lab, n: usize) -> Vec<Pod> {
    lab.wait_pods("app=web", n)
}

/// Every pod's address is in tern's pool and is the address of tern's endpoint of that pod on
/// that node.
fn check_addresses(st: &tern_lab::LabState, pods: &[Pod]) {
    let pool: ipnet::Ipv4Net = tern_model::defaults::IPV4_POOL.parse().unwrap();
    let (_, weps) = ternctl_out(st, &["get", "wep", "-o", "wide"]);
    for p in pods {
        let ip: std::net::Ipv4Addr =
            p.ip.parse()
                .unwrap_or_else(|_| panic!("pod {} has no IPv4 address: {p:?}", p.name));
        assert!(pool.contains(&ip), "pod {p:?} not in tern's pool {pool}");
        assert!(
            weps.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.contains(&p.name.as_str())
                    && f.contains(&p.node.as_str())
                    && f.iter().any(|x| x.split('/').next() == Some(p.ip.as_str()))
            }),
            "pod {p:?} not among tern's workload endpoints:\n{weps}"
        );
    }
}

/// `kubectl exec A -- nc -w 3 IP PORT`: the answer (the name of the pod that answered).
fn ask(lab: &Lab, from: &str, ip: &str, port: &str) -> Result<String, String> {
    lab.exec(&[from, "--", "nc", "-w", "3", ip, port])
        .map(|s| s.trim().to_string())
}

/// The probes of [`assert_mesh`] from pod `a` to every other pod: the failures.
fn mesh_from(lab: &Lab, k: &kube::KubeState, a: &Pod, pods: &[Pod]) -> Vec<String> {
    let peers: Vec<&Pod> = pods.iter().filter(|b| b.name != a.name).collect();
    let mut failures = Vec::new();
    let script = peers
        .iter()
        .map(|b| format!("echo \"{} $(nc -w 3 {} 8080)\"", b.ip, b.ip))
        .collect::<Vec<_>>()
        .join("; ");
    let tcp = lab.exec(&[&a.name, "-c", "web", "--", "sh", "-c", &script]);
    // UDP from the pod's network namespace, all peers at once (3 s, a datagram a second).
    let reqs: Vec<(Dial, SocketAddr)> = peers
        .iter()
        .map(|b| (Dial::Udp, SocketAddr::new(b.ip.parse().unwrap(), 8081)))
        .collect();
    let udp = probe::pod_netns(k, "default", &a.name)
        .and_then(|ns| probe::from_pod(&ns, &a.name, &reqs, Duration::from_secs(3)))
        .map_err(|e| e.to_string());
    for (bi, b) in peers.iter().enumerate() {
        let got = tcp.as_ref().map(|out| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{} ", b.ip)))
                .unwrap_or_default()
                .trim()
                .to_string()
        });
        match got {
            Ok(s) if s == b.name => {}
            other => failures.push(format!(
                "TCP {} ({}, {}) -> {} ({}, {}): {other:?}",
                a.name, a.node, a.ip, b.name, b.node, b.ip
            )),
        }
        match udp.as_ref().map(|a| a[bi].as_deref()) {
            Ok(Some(s)) if s == b.name => {}
            other => failures.push(format!(
                "UDP {} ({}, {}) -> {} ({}, {}): {other:?}",
                a.name, a.node, a.ip, b.name, b.node, b.ip
            )),
        }
    }
    failures
}

/// Every pod reaches every other pod over TCP and UDP. The pods probe at once, a thread
/// each: one kubectl exec runs a pod's TCP probes (busybox's `nc`, one after another; so
/// exec works too), and its UDP probes go from its network namespace
/// ([`tern_lab::kube::probe`]: no process per probe).
fn assert_mesh(lab: &Lab, pods: &[Pod]) {
    let st = lab.state();
    let k = st.kube.as_ref().expect("the lab's Kubernetes state");
    let failures: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .map(|a| s.spawn(move || mesh_from(lab, k, a, pods)))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} pod-to-pod TCP and UDP probes failed:\n{}{}",
        failures.len(),
        2 * pods.len() * (pods.len() - 1),
        failures.join("\n"),
        lab.diagnostics()
    );
}

/// `kubectl port-forward` to a pod answers on 127.0.0.1.
fn port_forward(lab: &Lab, pod: &Pod) {
    use std::io::{BufRead, Read};
    let mut child = lab
        .command()
        .args(["port-forward", &format!("pod/{}", pod.name), ":8080"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    reader.read_line(&mut line).unwrap();
    // "Forwarding from 127.0.0.1:41234 -> 8080"
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected port-forward output {line:?}"));
    let mut got = String::new();
    let r = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.read_to_string(&mut got)
    });
    let _ = child.kill();
    let _ = child.wait();
    r.unwrap_or_else(|e| panic!("port-forward to {}: {e}", pod.name));
    assert_eq!(got.trim(), pod.name, "port-forward answer");
}

const SERVICES: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: solo
spec:
  selector: {app: web, solo: "yes"}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// ClusterIP Services through kube-proxy: every pod reaches `web`; `solo` has its only
/// backend on one node and every pod on the other nodes reaches it (DNAT to a pod on another
/// node, through tern's dataplane).
fn services(lab: &Lab, pods: &[Pod]) {
    let backend = &pods[0];
    lab.kubectl(&["label", "pod", &backend.name, "solo=yes"])
        .unwrap();
    lab.apply("services", SERVICES);
    let ip = |svc: &str| {
        lab.kubectl(&["get", "svc", svc, "-o", "jsonpath={.spec.clusterIP}"])
            .unwrap()
    };
    let (web, solo) = (ip("web"), ip("solo"));
    let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let mut failures = Vec::new();
    for p in pods {
        let mut targets = vec![(web.as_str(), None)];
        if p.node != backend.node {
            targets.push((solo.as_str(), Some(backend.name.as_str())));
        }
        for (svc_ip, want) in targets {
            // kube-proxy programs a new Service within a second or two.
            let t = Instant::now();
            let last = loop {
                let got = ask(lab, &p.name, svc_ip, "80");
                let ok = match (&got, want) {
                    (Ok(s), Some(w)) => s == w,
                    (Ok(s), None) => names.contains(&s.as_str()),
                    _ => false,
                };
                if ok || t.elapsed() > Duration::from_secs(20) {
                    break ok.then_some(()).ok_or(got);
                }
                std::thread::sleep(Duration::from_millis(500));
            };
            if let Err(got) = last {
                failures.push(format!("{} ({}) -> {svc_ip}:80: {got:?}", p.name, p.node));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "Service probes failed:\n{}",
        failures.join("\n")
    );
}

/// hostPort (portmap chained after tern) answers on the node's address from a pod on another
/// node; the egress-bandwidth annotation (bandwidth chained after tern) shapes a pod's traffic:
/// containerd asks for the largest burst, so the test sends the burst the plugin installed
/// plus 500 kB, which at 2 Mbit/s takes at least 2 s, while the same transfer from an
/// unshaped pod on the same node takes a fraction of that.
fn host_port_and_bandwidth(lab: &Lab, name: &str, pods: &[Pod]) {
    lab.apply("extras", EXTRAS);
    let t = Instant::now();
    loop {
        let out = lab
            .kubectl(&[
                "get",
                "pods",
                "hp",
                "bw",
                "free",
                "-o",
                "jsonpath={.items[*].status.phase}",
            ])
            .unwrap_or_default();
        if out.split_whitespace().filter(|p| *p == "Running").count() == 3 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "hp/bw/free not Running: {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let st = tern_lab::LabState::load(name).unwrap().unwrap();
    let node1 = st.node("node1").unwrap().address.clone();
    let client = pods
        .iter()
        .find(|p| p.node != "node1")
        .expect("a pod on another node");
    let got = ask(lab, &client.name, &node1, "18080");
    assert_eq!(
        got.as_deref(),
        Ok("hp"),
        "hostPort 18080 on {node1} from {} on {}",
        client.name,
        client.node
    );

    let hp_ip = lab
        .kubectl(&["get", "pod", "hp", "-o", "jsonpath={.status.podIP}"])
        .unwrap();
    let qdiscs = tern_lab::process::run(Command::new("ip").args([
        "netns",
        "exec",
        &st.node("node2").unwrap().netns,
        "tc",
        "qdisc",
        "show",
    ]))
    .unwrap();
    let tbf = qdiscs
        .lines()
        .find(|l| l.contains(" tbf ") && l.contains("rate 2Mbit"))
        .unwrap_or_else(|| panic!("no 2 Mbit/s tbf on node2:\n{qdiscs}"));
    let burst: u64 = tbf
        .split("burst ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|b| b.trim_end_matches('b').parse().ok())
        .unwrap_or_else(|| panic!("no burst in {tbf:?}"));
    let bytes = (burst + 500_000).to_string();
    let send = |pod: &str| -> Duration {
        let out = lab
            .kubectl(&["exec", pod, "--", "/probe", "send", &hp_ip, "9000", &bytes])
            .unwrap_or_else(|e| panic!("transfer from {pod}: {e}"));
        // "N bytes in MS ms (KBIT kbit/s)"
        let ms: u64 = out
            .split(" bytes in ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("unexpected probe output {out:?}"));
        Duration::from_millis(ms)
    };
    let free = send("free");
    let shaped = send("bw");
    eprintln!(
        "bandwidth: {bytes} bytes (tbf burst {burst}) from the 2 Mbit/s pod in {shaped:?}, \
         from the unshaped pod in {free:?}"
    );
    assert!(
        shaped >= Duration::from_millis(1600),
        "2 Mbit/s pod sent burst + 500 kB in {shaped:?}: not shaped"
    );
    assert!(
        free * 2 < shaped,
        "the unshaped pod ({free:?}) is not faster than the shaped one ({shaped:?})"
    );
}

/// Issue 12's pod start-up benchmark: tern against the reference bridge + host-local (both
/// chaining bandwidth and portmap) under the same kubelet and containerd: one one-node
/// cluster whose containerd is switched between the two networks
/// (`kube::bench::use_network`), in rounds of a tern phase and a reference phase (the order
/// alternating, ABBA, so load drift on the shared machine falls on both). Prints every
/// phase and the pooled figures; asserts only that every phase ran completely.
/// `TERN_BENCH_SEQ` (default 30), `TERN_BENCH_BURST` (default 100) and `TERN_BENCH_ROUNDS`
/// (default 2) size it; `TERN_BENCH_BIN_DIR` runs it on the binaries there (e.g.
/// `target/release`, built with `cargo build --release --workspace --bins`) instead of the
/// freshly built debug ones; `TERN_BENCH_HOST_TERND=1` runs ternd as a lab process instead of
/// the DaemonSet.
#[test]
#[ignore = "benchmark: cargo test -p tern-ctl --test lab_kube -- --ignored --nocapture"]
fn kubernetes_pod_startup_benchmark() {
    use kube::bench::{Network, StartupFigures, quantile};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (seq, burst) = (env("TERN_BENCH_SEQ", 30), env("TERN_BENCH_BURST", 100));
    let rounds = env("TERN_BENCH_ROUNDS", 2).max(1);
    let bins = match std::env::var_os("TERN_BENCH_BIN_DIR") {
        Some(d) => {
            let d = std::fs::canonicalize(&d)
                .unwrap_or_else(|e| panic!("TERN_BENCH_BIN_DIR {}: {e}", Path::new(&d).display()));
            for b in ["ternd", "ternctl", "tern", "tern-ipam"] {
                assert!(
                    d.join(b).is_file(),
                    "TERN_BENCH_BIN_DIR {} has no {b}: cargo build --release --workspace --bins",
                    d.display()
                );
            }
            d
        }
        None => bin_dir(),
    };
    // With binaries of its own the benchmark needs no debug build: root and the components.
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "the benchmark needs root");
    let k8s = kube::KubeOptions::from_env().k8s_bin;
    if let Err(e) = kube::check_binaries(&k8s) {
        panic!("{e}");
    }
    let host_ternd = std::env::var_os("TERN_BENCH_HOST_TERND").is_some_and(|v| v == "1");
    eprintln!(
        "binaries: {}; ternd {}; {rounds} round(s) of {seq} sequential pods and a burst of {burst}",
        bins.display(),
        if host_ternd {
            "run by the lab"
        } else {
            "in the tern-node DaemonSet"
        }
    );
    let name = format!("b{}", tern_lab::process::random_hex(3));
    let _lab = common::Lab::guard(&name);
    let mut o = tern_lab::UpOptions::new(&name, &bins);
    o.nodes = 1;
    let mut st = tern_lab::up(&o).unwrap_or_else(|e| panic!("lab up: {e}"));
    let mut ko = kube::KubeOptions::from_env();
    ko.k8s_bin = k8s.clone();
    ko.host_ternd = host_ternd;
    kube::up(&mut st, &ko).unwrap_or_else(|e| panic!("kube up: {e}"));
    let k = st.kube.as_ref().unwrap();
    let mut results: Vec<(Network, Vec<StartupFigures>)> = vec![
        (Network::Tern, Vec::new()),
        (Network::Reference, Vec::new()),
    ];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let net = results[i].0;
            kube::bench::use_network(k, "node1", net)
                .unwrap_or_else(|e| panic!("switching to {}: {e}", net.label()));
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            let fig = kube::bench::pod_startup(k, "node1", seq, burst)
                .unwrap_or_else(|e| panic!("benchmark ({}): {e}", net.label()));
            eprintln!(
                "round {} {}: {} [load before: {}]",
                round + 1,
                net.label(),
                fig.summary(),
                load.split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            results[i].1.push(fig);
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "\npod start-up under kubelet {} (containerd 2.2.9), one node, {rounds} round(s):",
        kube::K8S_VERSION
    );
    eprintln!(
        "| network | {} sequential: p50 | p99 | burst of {burst}, each round | mean | burst RunPodSandbox p50 | p99 |",
        seq * rounds
    );
    eprintln!("|---|---|---|---|---|---|---|");
    for (net, figs) in &results {
        let seqs: Vec<Duration> = figs.iter().flat_map(|f| f.sequential.clone()).collect();
        let sandboxes: Vec<Duration> = figs
            .iter()
            .flat_map(|f| f.burst_sandboxes.clone())
            .collect();
        let bursts: Vec<String> = figs
            .iter()
            .map(|f| format!("{:.2} s", f.burst.as_secs_f64()))
            .collect();
        let mean = figs.iter().map(|f| f.burst.as_secs_f64()).sum::<f64>() / figs.len() as f64;
        eprintln!(
            "| {} | {:.0} ms | {:.0} ms | {} | {mean:.2} s | {:.0} ms | {:.0} ms |",
            net.label(),
            ms(quantile(&seqs, 0.5)),
            ms(quantile(&seqs, 0.99)),
            bursts.join(", "),
            ms(quantile(&sandboxes, 0.5)),
            ms(quantile(&sandboxes, 0.99)),
        );
    }
    for (net, figs) in &results {
        assert_eq!(figs.len(), rounds, "{}: phases", net.label());
        assert!(
            figs.iter().all(|f| f.sequential.len() == seq),
            "{}: sequential pods measured",
            net.label()
        );
    }
}

/// `kubectl drain node3`: its pods move to the other nodes and still reach each other; then
/// the node is deleted (`ternctl lab node del`, which deletes the Node object too): its blocks
/// and the other nodes' routes to them go.
fn drain_and_delete(lab: &Lab, name: &str) {
    let mut st = tern_lab::LabState::load(name).unwrap().unwrap();
    let blocks = |st: &tern_lab::LabState| -> Vec<String> {
        tern_lab::cluster::with_store(st, |s| {
            Ok(tern_ipam::Ipam::new(s)
                .affinities(Some("node3"))
                .map(|v| v.iter().map(|a| a.cidr.to_string()).collect())
                .unwrap_or_default())
        })
        .unwrap()
    };
    let before = blocks(&st);
    assert!(!before.is_empty(), "node3 has a block before the drain");
    lab.kubectl(&[
        "drain",
        "node3",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=120s",
    ])
    .unwrap();
    let moved = wait_pods(lab, 6);
    assert!(
        moved.iter().all(|p| p.node != "node3"),
        "pods left on the drained node: {moved:?}"
    );
    assert_mesh(lab, &moved);
    let done = tern_lab::node_del(&mut st, "node3").unwrap_or_else(|e| panic!("node del: {e}"));
    eprintln!("node del node3: {}", done.join("; "));
    let nodes = lab.kubectl(&["get", "nodes", "-o", "name"]).unwrap();
    assert!(!nodes.contains("node3"), "Node node3 still there: {nodes}");
    assert!(blocks(&st).is_empty(), "node3's blocks remain");
    for n in ["node1", "node2"] {
        let routes = tern_lab::mesh::routes(&st, n).unwrap();
        for b in &before {
            assert!(
                !routes.contains(b.as_str()),
                "{n} still routes node3's block {b}:\n{routes}"
            );
        }
    }
    let after = wait_pods(lab, 6);
    assert_mesh(lab, &after);
    check_addresses(&st, &after);
}
