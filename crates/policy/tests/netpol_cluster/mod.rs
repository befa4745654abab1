//! The upstream Kubernetes NetworkPolicy truth tables (`tern_testkit::conformance`) replayed
//! on a [`PolicySet`]: 3 namespaces x 3 pods, every case, step, protocol and port, the
//! diagonal excluded as upstream does. Shared by the suites that check an evaluator on them.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_norway::Value;
use tern_model::{EndpointPort, Protocol, Resource};
use tern_policy::{Endpoint, Flow, PolicyKey, PolicySet};

use tern_testkit::conformance::labels;

/// The cluster of a case, as its steps so far left it.
pub struct Cluster {
    pub set: PolicySet,
    ips: BTreeMap<String, IpAddr>,
    policies: Vec<PolicyKey>,
}

impl Cluster {
    fn new(model: &Value) -> Cluster {
        let mut set = PolicySet::new();
        for ns in model["namespaces"].as_sequence().unwrap() {
            set.upsert_namespace(ns["name"].as_str().unwrap(), labels(&ns["labels"]));
        }
        let ports: Vec<EndpointPort> =
            serde_json::from_value(tern_testkit::conformance::endpoint_ports(model)).unwrap();
        let mut ips = BTreeMap::new();
        for p in model["pods"].as_sequence().unwrap() {
            let ns = p["namespace"].as_str().unwrap();
            let name = p["name"].as_str().unwrap();
            let ip: IpAddr = p["ip"].as_str().unwrap().parse().unwrap();
            ips.insert(format!("{ns}/{name}"), ip);
            set.upsert_endpoint(Endpoint {
                namespace: ns.into(),
                name: name.into(),
                node: "n1".into(),
                interface: format!("veth-{ns}-{name}"),
                labels: labels(&p["labels"]).into(),
                ips: vec![ip],
                ports: ports.clone(),
            });
        }
        Cluster {
            set,
            ips,
            policies: Vec::new(),
        }
    }

    fn apply(&mut self, action: &Value) {
        let (kind, arg) = action.as_mapping().unwrap().iter().next().unwrap();
        match kind.as_str().unwrap() {
            "create_policy" | "update_policy" => {
                let mut text = serde_norway::to_string(arg).unwrap();
                for (pod, ip) in &self.ips {
                    text = text.replace(&format!("{{{{ip:{pod}}}}}"), &ip.to_string());
                }
                let docs = tern_model::parse_documents(&text, "case.yaml").unwrap();
                for d in docs {
                    d.validate().unwrap();
                    let Resource::K8sNetworkPolicy(p) = &d else {
                        panic!("not a Kubernetes NetworkPolicy: {d:?}")
                    };
                    self.set.apply(&d).unwrap();
                    self.policies.push(PolicyKey {
                        kind: tern_model::Kind::K8sNetworkPolicy,
                        namespace: p.metadata.namespace.clone(),
                        name: p.metadata.name.clone(),
                    });
                }
            }
            "delete_all_policies" => {
                for k in self.policies.drain(..) {
                    self.set.remove_policy(&k);
                }
            }
            "add_namespace_labels" => {
                let ns = arg["namespace"].as_str().unwrap();
                let mut l = self.set.namespace_labels(ns);
                l.extend(labels(&arg["labels"]));
                self.set.upsert_namespace(ns, l);
            }
            "add_pod_labels" => {
                let pod = arg["pod"].as_str().unwrap();
                let (ns, name) = pod.split_once('/').unwrap();
                let mut ep = self
                    .set
                    .endpoints()
                    .find(|e| e.namespace == ns && e.name == name)
                    .unwrap()
                    .clone();
                std::sync::Arc::make_mut(&mut ep.labels).extend(labels(&arg["labels"]));
                self.set.upsert_endpoint(ep);
            }
            other => panic!("unknown action {other}"),
        }
    }
}

/// One cell of a truth table: a flow between two pods after a step, and whether it must be
/// allowed.
pub struct Cell<'a> {
    pub case: &'a str,
    pub step: usize,
    pub set: &'a PolicySet,
    /// `NS/POD` of each end.
    pub from: &'a str,
    pub to: &'a str,
    pub flow: Flow,
    pub want: bool,
}

impl Cell<'_> {
    /// The cell, for a failure message.
    pub fn name(&self) -> String {
        format!(
            "{} step {} {:?}/{} {} -> {}",
            self.case, self.step, self.flow.protocol, self.flow.dst_port, self.from, self.to
        )
    }
}

/// Replays every case and calls `check` on every cell; returns how many there were.
pub fn for_each_cell(mut check: impl FnMut(&Cell)) -> usize {
    let doc: Value = tern_testkit::conformance::netpol_cases();
    let cols = tern_testkit::conformance::matrix_columns(&doc["model"]);
    let mut cells = 0usize;
    let cases = doc["cases"].as_sequence().unwrap();
    assert!(cases.len() >= 40, "expected the full case list");
    for case in cases {
        let id = case["id"].as_str().unwrap();
        let mut c = Cluster::new(&doc["model"]);
        for (si, step) in case["steps"].as_sequence().unwrap().iter().enumerate() {
            for a in step["actions"].as_sequence().unwrap() {
                c.apply(a);
            }
            for (pp, rows) in step["expected"].as_mapping().unwrap() {
                let (proto, port) = pp.as_str().unwrap().split_once('/').unwrap();
                let protocol = match proto {
                    "TCP" => Protocol::Tcp,
                    "UDP" => Protocol::Udp,
                    "SCTP" => Protocol::Sctp,
                    p => panic!("protocol {p}"),
                };
                let port: u16 = port.parse().unwrap();
                for (from, row) in rows.as_mapping().unwrap() {
                    let from = from.as_str().unwrap();
                    for (j, glyph) in row.as_str().unwrap().chars().enumerate() {
                        let to = &cols[j];
                        if to == from {
                            continue;
                        }
                        cells += 1;
                        check(&Cell {
                            case: id,
                            step: si,
                            set: &c.set,
                            from,
                            to,
                            flow: Flow {
                                src: c.ips[from],
                                dst: c.ips[to.as_str()],
                                protocol,
                                dst_port: port,
                                icmp: None,
                            },
                            want: glyph == '.',
                        });
                    }
                }
            }
        }
    }
    cells
}
