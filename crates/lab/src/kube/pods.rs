//! Pods as `kubectl get pods` reports them, for the demo and the tests that wait for a
//! Deployment's pods: one jsonpath, one parser, one wait.

use std::time::{Duration, Instant};

/// The `-o` argument of `kubectl get pods` whose output [`parse_pods`] reads: a line per pod
/// with its name, phase, address, node and (when it is terminating) deletion time.
pub const POD_LINES_JSONPATH: &str = r#"jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.podIP} {.spec.nodeName} {.metadata.deletionTimestamp}{"\n"}{end}"#;

/// The arguments of `kubectl` that list the tern-node pods (the DaemonSet's); append `-o ...`.
pub const TERN_NODE_PODS: &[&str] = &[
    "-n",
    "kube-system",
    "get",
    "pods",
    "-l",
    "k8s-app=tern-node",
];

/// A running pod as `kubectl get pods` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubePod {
    /// The pod's name.
    pub name: String,
    /// Its address.
    pub ip: String,
    /// The node it runs on.
    pub node: String,
}

/// The pods of [`POD_LINES_JSONPATH`]'s output that are Running with an address and not
/// terminating, and how many pods it lists in all.
pub fn parse_pods(out: &str) -> (Vec<KubePod>, usize) {
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    let running = lines
        .iter()
        .filter_map(|l| {
            // A terminating pod has a fifth field, its deletion time.
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[1] == "Running").then(|| KubePod {
                name: f[0].into(),
                ip: f[2].into(),
                node: f[3].into(),
            })
        })
        .collect();
    (running, lines.len())
}

/// Polls `list` (the output of `kubectl get pods -l ... -o POD_LINES_JSONPATH`) every 500 ms
/// until exactly `n` pods exist, all Running with an address (none terminating); returns
/// them. After `timeout`, an error with the last output (or why `list` failed).
pub fn wait_running(
    n: usize,
    timeout: Duration,
    mut list: impl FnMut() -> Result<String, String>,
) -> Result<Vec<KubePod>, String> {
    let t = Instant::now();
    loop {
        let last = match list() {
            Ok(out) => {
                let (running, all) = parse_pods(&out);
                if running.len() == n && all == n {
                    return Ok(running);
                }
                out
            }
            Err(e) => e,
        };
        if t.elapsed() > timeout {
            return Err(format!(
                "not exactly {n} pods Running after {} s:\n{last}",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A Deployment named `app` of `replicas` pods labelled `app: <app>`, spread evenly over the
/// nodes, each answering every TCP connection to :8080 (busybox `nc`) and every UDP datagram
/// to :8081 (tern's probe image) with the pod's name. With `honor_taints`, a cordoned
/// (drained) node does not count in the spread.
pub fn echo_deployment(app: &str, replicas: usize, honor_taints: bool) -> String {
    let taints = if honor_taints {
        "\n        nodeTaintsPolicy: Honor"
    } else {
        ""
    };
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {app}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {app}}}
  template:
    metadata:
      labels: {{app: {app}}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule{taints}
        labelSelector:
          matchLabels: {{app: {app}}}
      containers:
      - name: web
        image: tern-busybox:1
        imagePullPolicy: Never
        command: ["nc", "-ll", "-p", "8080", "-e", "/bin/hostname"]
      - name: udp
        image: localhost/tern/probe:1
        imagePullPolicy: Never
        command: ["/probe", "serve-udp", "8081"]
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_pods_with_an_address_count() {
        let out = "web-1 Running 10.244.0.5 node1 \n\
                   web-2 Pending  node2 \n\
                   web-3 Running 10.244.1.7 node2 2026-12-01T10:00:00Z\n\n";
        let (running, all) = parse_pods(out);
        assert_eq!(all, 3);
        assert_eq!(
            running,
            [KubePod {
                name: "web-1".into(),
                ip: "10.244.0.5".into(),
                node: "node1".into()
            }]
        );
    }

    #[test]
    fn waiting_ends_with_the_last_output() {
        let mut calls = 0;
        let got = wait_running(2, Duration::from_millis(600), || {
            calls += 1;
            Ok("a Running 10.0.0.1 n1 \n".to_string())
        });
        let e = got.unwrap_err();
        assert!(
            e.starts_with("not exactly 2 pods Running after 0 s:\na Running"),
            "{e}"
        );
        assert!(calls >= 2, "polled {calls} times");
        let pods = wait_running(1, Duration::from_secs(1), || {
            Ok("a Running 10.0.0.1 n1 \n".to_string())
        })
        .unwrap();
        assert_eq!(pods[0].ip, "10.0.0.1");
    }

    #[test]
    fn the_deployment_honours_taints_only_when_asked() {
        let plain = echo_deployment("demo", 3, false);
        assert!(
            plain.contains("  name: demo\nspec:\n  replicas: 3\n"),
            "{plain}"
        );
        assert!(
            plain.contains(
                "DoNotSchedule\n        labelSelector:\n          matchLabels: {app: demo}\n"
            ),
            "{plain}"
        );
        let honour = echo_deployment("web", 6, true);
        assert!(
            honour
                .contains("DoNotSchedule\n        nodeTaintsPolicy: Honor\n        labelSelector:"),
            "{honour}"
        );
    }
}
