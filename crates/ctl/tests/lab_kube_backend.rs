//! The seed's backend switch (issue 13): operators switch Calico between BGP and VXLAN by
//! editing its configuration and running `kubectl rollout restart daemonset calico-node`;
//! tern is switched the same way. On a real cluster (`ternctl lab up --nodes 2 --kubernetes
//! --store etcd --bgp`, tern installed by its DaemonSet):
//! - BGP: `ternctl node status` on each node shows its node-to-node mesh session
//!   Established, the other node's blocks are BGP routes (protocol 85) and no `vxlan.tern`
//!   exists;
//! - the ConfigMap `tern-config` is edited (`bgp: "false"`, the pool's `vxlanMode: Always`)
//!   and the DaemonSet restarted: each node then has `vxlan.tern`, the other node's blocks
//!   routed through it by the reconciler (protocol 84) and no BGP route left, and `ternctl
//!   node status` says "None of the BGP backend processes (tern's BGP speaker) are
//!   running."; a pod created now gets the VXLAN MTU;
//! - edited back (`bgp: "true"`, `vxlanMode: Never`) and restarted: sessions Established and
//!   BGP routes again, no `vxlan.tern`;
//! - before the switches, the cluster moves from the lab's etcd onto the Kubernetes datastore
//!   as an operator moves an install (issue 19): tern's CRDs, the agents stopped by a node
//!   selector on the DaemonSet, `ternctl datastore migrate --dry-run` then the copy,
//!   `store: kubernetes` in `tern-config`, the agents back. The pods keep their addresses,
//!   `ternctl ipam show --show-blocks` prints on the Kubernetes store what it printed on etcd,
//!   `ipam check` is clean, a second migration into the full target is refused, and the
//!   switches below run on the Kubernetes datastore (a new pod's address lands there, etcd
//!   stays as it was);
//! - all along, one TCP connection between pods on the two nodes carries a numbered line
//!   every 200 ms that the far end echoes back: after each switch the echoes resume, every
//!   line comes back, in order, and neither end ever restarted; new connections between pods
//!   on the two nodes work in each mode.
//!
//! Needs root and the components of `scripts/k8s-components.sh` (`TERN_K8S_BIN`); without
//! them the test FAILS naming what is missing. The lab has a unique name and is removed by a
//! guard, also when the test fails.

use std::time::{Duration, Instant};

mod common;
use common::kube_lab::{
    KubeLab as Lab, NAME_SERVER, RUN_ONCE, busybox_pod, shell_pod, ternctl_in, ternctl_output,
};

/// What `ternctl node status` prints for a node whose ternd runs without BGP.
const NO_BGP: &str = "None of the BGP backend processes (tern's BGP speaker) are running.";

/// The nodes of the lab.
const NODES: [&str; 2] = ["node1", "node2"];

/// A busybox pod bound to `node`, running `command` (a YAML flow list) once.
fn pod(name: &str, node: &str, command: &str) -> String {
    busybox_pod(name, node, "", RUN_ONCE, command)
}

/// A pod on `node` answering every TCP connection on :8080 with its name.
fn server(name: &str, node: &str) -> String {
    pod(name, node, NAME_SERVER)
}

/// The cluster as the test sees it.
struct Cluster {
    lab: Lab,
    st: tern_lab::LabState,
}

impl Cluster {
    /// A new connection `from` → `ip` answered by `want`, retried for up to 30 s (a switch's
    /// routes may still be converging); panics otherwise.
    fn must_reach(&self, from: &str, ip: &str, want: &str) {
        common::wait_until(
            &format!("{from} -> {ip} ({want})"),
            30,
            || self.context(),
            || {
                let got = self.lab.ask(from, ip);
                (got.as_deref() != Some(want)).then(|| format!("{got:?}"))
            },
        );
    }

    /// What a failed wait prints after its reason: the nodes' routes and the lab's state.
    fn context(&self) -> String {
        format!("{}{}", self.routes(), self.lab.diagnostics())
    }

    fn netns(&self, node: &str) -> &str {
        &self.st.node(node).expect("node in the lab").netns
    }

    /// `ip ARGS` in a node's namespace (empty on error).
    fn ip(&self, node: &str, args: &[&str]) -> String {
        tern_lab::process::ip_in(self.netns(node), args).unwrap_or_default()
    }

    /// `ternctl node status` in the node's namespace, against its DaemonSet ternd's socket.
    fn node_status(&self, node: &str) -> String {
        let n = self.st.node(node).unwrap();
        ternctl_output(
            ternctl_in(&n.netns)
                .args(["node", "status", "--socket"])
                .arg(&n.socket),
        )
        .1
    }

    /// Both pods `(a, ip of a)` and `(b, ip of b)` reach each other: [`Cluster::must_reach`]
    /// both ways.
    fn must_reach_both(&self, (a, ip_a): (&str, &str), (b, ip_b): (&str, &str)) {
        self.must_reach(a, ip_b, b);
        self.must_reach(b, ip_a, a);
    }

    /// The MTU of pod `pod`'s eth0.
    fn mtu(&self, pod: &str) -> u32 {
        let mtu = self
            .lab
            .must(&["exec", pod, "--", "cat", "/sys/class/net/eth0/mtu"]);
        mtu.trim()
            .parse()
            .unwrap_or_else(|e| panic!("MTU of {pod}: {mtu:?}: {e}"))
    }

    /// The blocks affine to `node`: its blackhole routes.
    fn blocks_of(&self, node: &str) -> Vec<String> {
        self.ip(node, &["route", "show", "type", "blackhole"])
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect()
    }

    /// The blocks of every node but `n`, each with its node; why not when one has none.
    fn blocks_of_others(&self, n: &str) -> Result<Vec<(&'static str, String)>, String> {
        let mut all = Vec::new();
        for o in NODES.iter().filter(|o| **o != n) {
            let blocks = self.blocks_of(o);
            if blocks.is_empty() {
                return Err(format!("{o} has no block"));
            }
            all.extend(blocks.into_iter().map(|b| (*o, b)));
        }
        Ok(all)
    }

    /// Every node's routes and devices, for a failure message.
    fn routes(&self) -> String {
        NODES
            .iter()
            .map(|n| {
                format!(
                    "\n--- {n} routes ---\n{}--- {n} vxlan devices ---\n{}",
                    self.ip(n, &["route", "show"]),
                    self.ip(n, &["-d", "link", "show", "type", "vxlan"])
                )
            })
            .collect()
    }

    /// Why the cluster is not (yet) in BGP mode, or None: each node's session to the other is
    /// Established, the other node's blocks are BGP routes and not the reconciler's, no
    /// `vxlan.tern`.
    fn not_bgp(&self) -> Option<String> {
        for n in NODES {
            let status = self.node_status(n);
            if !(status.contains("IPv4 BGP status")
                && status.matches("| node-to-node mesh |").count() == NODES.len() - 1
                && status.matches("Established").count() == NODES.len() - 1)
            {
                return Some(format!("{n}: node status:\n{status}"));
            }
            if self
                .ip(n, &["link", "show", "vxlan.tern"])
                .contains("vxlan.tern")
            {
                return Some(format!("{n} still has vxlan.tern"));
            }
            let bgp = self.ip(n, &["route", "show", "proto", "85"]);
            let direct = self.ip(n, &["route", "show", "proto", "84"]);
            let blocks = match self.blocks_of_others(n) {
                Ok(b) => b,
                Err(why) => return Some(why),
            };
            for (o, b) in blocks {
                if !bgp.contains(&format!("{b} via ")) {
                    return Some(format!("{n}: no BGP route to {b} of {o}:\n{bgp}"));
                }
                if direct.contains(&format!("{b} via ")) {
                    return Some(format!("{n}: a reconciler route to {b}:\n{direct}"));
                }
            }
        }
        None
    }

    /// Why the cluster is not (yet) in VXLAN mode, or None: each node says no BGP speaker
    /// runs, has `vxlan.tern`, routes the other node's blocks over it and has no BGP route.
    fn not_vxlan(&self) -> Option<String> {
        for n in NODES {
            let status = self.node_status(n);
            if !status.contains(NO_BGP) {
                return Some(format!("{n}: node status:\n{status}"));
            }
            let link = self.ip(n, &["-d", "link", "show", "vxlan.tern"]);
            if !link.contains("vxlan id 4096") {
                return Some(format!("{n}: no vxlan.tern: {link}"));
            }
            let bgp = self.ip(n, &["route", "show", "proto", "85"]);
            if !bgp.trim().is_empty() {
                return Some(format!("{n}: BGP routes left:\n{bgp}"));
            }
            let direct = self.ip(n, &["route", "show", "proto", "84"]);
            let blocks = match self.blocks_of_others(n) {
                Ok(b) => b,
                Err(why) => return Some(why),
            };
            for (o, b) in blocks {
                let over = direct
                    .lines()
                    .any(|l| l.starts_with(&format!("{b} via ")) && l.contains(" dev vxlan.tern "));
                if !over {
                    return Some(format!("{n}: {b} of {o} not over vxlan.tern:\n{direct}"));
                }
            }
        }
        None
    }

    /// `kubectl patch configmap tern-config --type merge -p PATCH`.
    fn patch_config(&self, patch: &serde_json::Value) {
        self.lab.must(&[
            "-n",
            "kube-system",
            "patch",
            "configmap",
            "tern-config",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ]);
    }

    /// Polls `check` until it returns None; panics after `secs` with its last reason.
    fn converge(
        &self,
        what: &str,
        secs: u64,
        check: impl Fn(&Cluster) -> Option<String>,
    ) -> Duration {
        let t = Instant::now();
        common::wait_until(
            &format!("{what} not reached in {secs} s"),
            secs,
            || self.context(),
            || check(self),
        );
        t.elapsed()
    }

    /// The operator's switch: edits `tern-config` (`bgp` and the pool's `vxlanMode`), then
    /// `kubectl rollout restart daemonset tern-node -n kube-system` and `kubectl rollout
    /// status`. Returns how long the restart and rollout took.
    fn switch(&self, bgp: bool) -> Duration {
        let pool = self.lab.must(&[
            "-n",
            "kube-system",
            "get",
            "configmap",
            "tern-config",
            r"-o=jsonpath={.data.ippool\.yaml}",
        ]);
        let (from, to) = if bgp {
            ("vxlanMode: Always", "vxlanMode: Never")
        } else {
            ("vxlanMode: Never", "vxlanMode: Always")
        };
        assert!(pool.contains(from), "tern-config's ippool.yaml:\n{pool}");
        let patch = serde_json::json!({"data": {
            "bgp": if bgp { "true" } else { "false" },
            "ippool.yaml": pool.replace(from, to),
        }});
        self.patch_config(&patch);
        let t = Instant::now();
        self.lab.rollout_restart_tern_node();
        t.elapsed()
    }

    /// The lines the talker got back over its connection, with the seconds (of the day) its
    /// container runtime logged each at.
    fn echoed(&self) -> Vec<(f64, String)> {
        self.lab
            .must(&["logs", "--timestamps", "talker"])
            .lines()
            .filter_map(|l| {
                let (ts, line) = l.split_once(' ')?;
                Some((seconds_of_day(ts)?, line.to_string()))
            })
            .collect()
    }

    /// Phase and restart count of a pod.
    fn phase(&self, pod: &str) -> String {
        self.lab.must(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount}",
        ])
    }

    /// After a switch: waits until the connection's echoes resume (10 more lines than now),
    /// asserts every line came back in order and both ends still run, never restarted.
    /// Returns the longest pause between two echoes since `since` (seconds of the day).
    fn connection_survived(&self, what: &str, since: f64) -> f64 {
        let n0 = self.echoed().len();
        let t = Instant::now();
        let lines = loop {
            let lines = self.echoed();
            if lines.len() >= n0 + 10 {
                break lines;
            }
            assert!(
                t.elapsed() < Duration::from_secs(90),
                "{what}: the connection carries nothing any more ({} echoes, {} before; talker \
                 {}, listener {}){}{}",
                lines.len(),
                n0,
                self.phase("talker"),
                self.phase("listener"),
                self.routes(),
                self.lab.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        let got: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        let want: Vec<String> = (0..lines.len()).map(|i| i.to_string()).collect();
        assert_eq!(got, want, "{what}: the echoed lines, in order, none lost");
        for p in ["talker", "listener"] {
            assert_eq!(self.phase(p), "Running 0", "{what}: {p} still runs");
        }
        lines
            .windows(2)
            .filter(|w| w[1].0 >= since)
            .map(|w| (w[1].0 - w[0].0).rem_euclid(86_400.0))
            .fold(0.0, f64::max)
    }
}

impl Cluster {
    /// `ternctl ARGS` against `store` from node1's namespace; panics when it fails.
    fn ternctl(&self, store: &str, args: &[&str]) -> String {
        let (ok, out) = ternctl_output(
            ternctl_in(self.netns("node1"))
                .args(["--store", store])
                .args(args),
        );
        assert!(ok, "ternctl --store {store} {args:?}:\n{out}");
        out
    }

    /// The URL of the lab's Kubernetes datastore (its admin kubeconfig).
    fn kube_store(&self) -> String {
        let k = self.st.kube.as_ref().expect("a Kubernetes lab");
        format!("kubernetes://{}", k.admin_kubeconfig().display())
    }

    /// The pod's address (`status.podIP`).
    fn pod_ip(&self, pod: &str) -> String {
        self.lab
            .must(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
    }

    /// Moves the running cluster from the lab's etcd onto the Kubernetes datastore the way the
    /// module doc of `tern_store::migrate` tells an operator to: tern's CRDs applied; the
    /// agents stopped (the DaemonSet's pods taken off every node by a node selector that
    /// matches none; the pods keep running); `ternctl datastore migrate --dry-run`, then the
    /// copy; `store: kubernetes` in `tern-config`; the agents back. Asserts that `ternctl ipam
    /// show --show-blocks` prints on the Kubernetes store what it printed on etcd, that `ipam
    /// check` is clean there, that every pod of `pods` kept its address and is one of tern's
    /// endpoints, and that a second migration into the now full target is refused. Returns
    /// those addresses and what `ipam show --show-blocks` printed.
    fn migrate_to_kubernetes(&self, pods: &[&str]) -> (Vec<String>, String) {
        let (etcd, kube) = (self.st.store_url(), self.kube_store());
        let before: Vec<String> = pods.iter().map(|p| self.pod_ip(p)).collect();
        let blocks = self.ternctl(&etcd, &["ipam", "show", "--show-blocks"]);
        let crds = self.ternctl(&etcd, &["install", "crds"]);
        self.lab.apply("tern-crds", &crds);
        self.lab.must(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ]);
        let ds = ["-n", "kube-system", "patch", "daemonset", "tern-node", "-p"];
        let park =
            r#"{"spec":{"template":{"spec":{"nodeSelector":{"tern.dev/migrating":"true"}}}}}"#;
        self.lab.must(&[&ds[..], &[park]].concat());
        common::wait_until(
            "the tern-node pods did not stop",
            120,
            || self.lab.diagnostics(),
            || {
                let pods = self
                    .lab
                    .must(&[tern_lab::kube::pods::TERN_NODE_PODS, &["-o", "name"]].concat());
                (!pods.trim().is_empty()).then(|| pods.trim().replace('\n', " "))
            },
        );
        let migrate = ["datastore", "migrate", "--from", &etcd, "--to", &kube];
        let dry = self.ternctl(&etcd, &[&migrate[..], &["--dry-run"]].concat());
        assert!(
            dry.contains("would migrate") && dry.contains("ipam/blocks"),
            "{dry}"
        );
        let done = self.ternctl(&etcd, &migrate);
        assert!(
            done.contains("migrated") && done.contains("ipam/blocks"),
            "{done}"
        );
        // The source is left locked for the migration, the copy is not.
        let source_cfg = self.ternctl(&etcd, &["ipam", "show", "--show-configuration"]);
        assert!(
            done.contains("locked") && source_cfg.contains("MigrationLock"),
            "{done}\n{source_cfg}"
        );
        let target_cfg = self.ternctl(&kube, &["ipam", "show", "--show-configuration"]);
        assert!(!target_cfg.contains("MigrationLock"), "{target_cfg}");
        let (ok, again) = ternctl_output(ternctl_in(self.netns("node1")).args(migrate));
        assert!(
            !ok && again.contains("not empty"),
            "a second migration: {again}"
        );
        self.patch_config(&serde_json::json!({"data": {"store": "kubernetes"}}));
        let unpark = r#"{"spec":{"template":{"spec":{"nodeSelector":null}}}}"#;
        self.lab.must(&[&ds[..], &[unpark]].concat());
        self.lab.wait_tern_node_rollout();
        common::wait_until(
            "the tern-node pods did not come back",
            120,
            || self.lab.diagnostics(),
            || {
                let ready = self.lab.tern_node_pods_ready().0.len();
                (ready < NODES.len()).then(|| format!("{ready} of {} ready", NODES.len()))
            },
        );
        assert_eq!(
            self.ternctl(&kube, &["ipam", "show", "--show-blocks"]),
            blocks,
            "ipam show on the Kubernetes store against what etcd showed"
        );
        let check = self.ternctl(&kube, &["ipam", "check"]);
        eprintln!("after the migration: {}", check.trim());
        let weps = self.ternctl(&kube, &["get", "workloadendpoints", "-o", "wide"]);
        for (p, ip) in pods.iter().zip(&before) {
            assert_eq!(&self.pod_ip(p), ip, "{p} kept its address");
            assert!(
                weps.lines()
                    .any(|l| l.contains(p) && l.contains(ip.as_str())),
                "{p} {ip} not among the endpoints on the Kubernetes store:\n{weps}"
            );
        }
        (before, blocks)
    }
}

/// `2026-12-01T14:40:00.123456789Z` → seconds since that day's midnight (UTC).
fn seconds_of_day(ts: &str) -> Option<f64> {
    let time = ts.split_once('T')?.1.trim_end_matches('Z');
    let mut f = time.splitn(3, ':');
    let h: f64 = f.next()?.parse().ok()?;
    let m: f64 = f.next()?.parse().ok()?;
    let s: f64 = f.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// Now, in seconds of the day (UTC), comparable with [`seconds_of_day`].
fn now_of_day() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    d.as_secs_f64().rem_euclid(86_400.0)
}

#[test]
fn switch_bgp_to_vxlan_and_back_by_rollout_restart() {
    let k8s = common::kube_preconditions("lab_kube_backend");
    let t0 = Instant::now();
    let lab = Lab::up("bk", &k8s, &["--nodes", "2", "--store", "etcd", "--bgp"]);
    let c = Cluster {
        st: lab.state(),
        lab,
    };
    let cm = c.lab.must(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "tern-config",
        r#"-o=jsonpath={.data.bgp}|{.data.ippool\.yaml}"#,
    ]);
    assert!(
        cm.starts_with("true|") && cm.contains("vxlanMode: Never"),
        "tern-config of a --bgp lab: {cm}"
    );

    // Pods on both nodes; the long-lived connection node1 -> node2, echoed back.
    c.lab.apply("a", &server("a", "node1"));
    c.lab.apply("b", &server("b", "node2"));
    c.lab.apply(
        "listener",
        &pod(
            "listener",
            "node2",
            r#"["nc", "-l", "-p", "9000", "-e", "/bin/cat"]"#,
        ),
    );
    let a = c.lab.wait_ready("a");
    let b = c.lab.wait_ready("b");
    let listener = c.lab.wait_ready("listener");
    let took = c.converge("BGP mode", 60, Cluster::not_bgp);
    c.must_reach_both(("a", &a), ("b", &b));
    let talk = format!(
        "sleep 1; i=0; while :; do echo $i; i=$((i+1)); usleep 200000; done | nc {listener} 9000"
    );
    c.lab.apply("talker", &shell_pod("talker", "node1", &talk));
    c.lab.wait_ready("talker");
    c.connection_survived("BGP at start", 0.0);
    eprintln!(
        "BGP mode: sessions Established, BGP routes ({took:?} after the pods); a {a} (node1) and \
         b {b} (node2) reach each other; {:?} since the start",
        t0.elapsed()
    );

    // etcd -> Kubernetes, on the running cluster, as an operator moves an existing install
    // onto the API server. The pods keep running, keep their addresses and the connection.
    let since = now_of_day();
    let (addrs, blocks) = c.migrate_to_kubernetes(&["a", "b", "listener", "talker"]);
    let gap = c.connection_survived("etcd -> Kubernetes", since);
    c.converge("BGP mode on the Kubernetes datastore", 90, Cluster::not_bgp);
    c.must_reach_both(("a", &a), ("b", &b));
    eprintln!(
        "etcd -> Kubernetes: pods kept {addrs:?}; longest pause of the connection {gap:.1} s; \
         {:?} since the start",
        t0.elapsed()
    );

    // BGP -> VXLAN.
    let since = now_of_day();
    let rollout = c.switch(false);
    let took = c.converge("VXLAN mode", 60, Cluster::not_vxlan);
    let gap = c.connection_survived("BGP -> VXLAN", since);
    // How the BGP routes went: replaced in place by the new ternd (or the old one seeing the
    // pool change), not deleted first.
    let logs = c
        .lab
        .ternd_logs("-1")
        .unwrap_or_else(|e| panic!("{e}{}", c.lab.diagnostics()));
    let taken = logs.matches("took over the BGP route").count();
    c.must_reach_both(("a", &a), ("b", &b));
    c.lab.apply("v", &server("v", "node2"));
    let v = c.lab.wait_ready("v");
    assert!(
        !addrs.contains(&v),
        "pod v got {v}, an address a pod from before the migration holds ({addrs:?})"
    );
    // The agents allocate on the Kubernetes store now; the old etcd is left as it was.
    let (etcd, kube) = (c.st.store_url(), c.kube_store());
    assert_eq!(
        c.ternctl(&etcd, &["ipam", "show", "--show-blocks"]),
        blocks,
        "etcd untouched"
    );
    let now = c.ternctl(&kube, &["ipam", "show", "--show-blocks"]);
    assert_ne!(
        now, blocks,
        "pod v's address is not on the Kubernetes store"
    );
    c.must_reach("a", &v, "v");
    let mtu = c.mtu("v");
    let underlay_mtu = c.mtu("a");
    assert_eq!(
        mtu,
        underlay_mtu - 50,
        "a pod made in VXLAN mode has the VXLAN MTU"
    );
    eprintln!(
        "BGP -> VXLAN: rollout {rollout:?}, VXLAN routes {took:?} later; {taken} BGP routes \
         replaced in place (logs of the new tern-node pods); longest pause of the connection \
         {gap:.1} s; new pod v {v} (MTU {mtu}) reached; {:?} since the start",
        t0.elapsed()
    );

    // VXLAN -> BGP.
    let since = now_of_day();
    let rollout = c.switch(true);
    let took = c.converge("BGP mode again", 90, Cluster::not_bgp);
    let gap = c.connection_survived("VXLAN -> BGP", since);
    c.must_reach_both(("a", &a), ("b", &b));
    c.must_reach("a", &v, "v");
    c.lab.apply("g", &server("g", "node1"));
    let g = c.lab.wait_ready("g");
    c.must_reach("b", &g, "g");
    assert_eq!(
        c.mtu("g"),
        underlay_mtu,
        "a pod made in BGP mode has the unencapsulated MTU"
    );
    eprintln!(
        "VXLAN -> BGP: rollout {rollout:?}, sessions Established {took:?} later; longest pause \
         of the connection {gap:.1} s; new pod g {g} reached; {} lines echoed in all; {:?} \
         since the start",
        c.echoed().len(),
        t0.elapsed()
    );
}
