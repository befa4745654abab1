//! `ternctl get KIND [NAME] [-n NS] -o table|yaml|json`.

use anyhow::bail;
use tern_model::{
    BgpConfigurationSpec, BgpPeerSpec, Document, GlobalNetworkPolicySpec, IpPoolSpec,
    IpReservationSpec, IpamConfigSpec, K8sNetworkPolicySpec, Kind, NamespaceSpec,
    NetworkPolicySpec, NodeSpec, Resource, StagedGlobalNetworkPolicySpec,
    StagedKubernetesNetworkPolicySpec, StagedNetworkPolicySpec, WorkloadEndpointSpec,
};
use tern_store::Store;

use crate::cli::Output;
use crate::table;

/// Parses a kind as users type it: case-insensitive, singular, plural or short
/// (`ippools`, `wep`, `IPAMConfig`, `nodes`).
pub fn parse_kind(s: &str) -> anyhow::Result<Kind> {
    s.parse::<Kind>().map_err(anyhow::Error::msg)
}

/// Reads the requested resources. With a name: that resource (in `namespace`, or in any
/// namespace for a namespaced kind when none is given), an error if absent. Without: every
/// resource of the kind, restricted to `namespace` when given.
pub fn fetch(
    store: &dyn Store,
    kind: Kind,
    name: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<Resource>> {
    let all = tern_model::list_resources(store, kind)?;
    let in_ns =
        |r: &Resource| !kind.namespaced() || namespace.is_none_or(|n| r.namespace() == Some(n));
    let found: Vec<Resource> = all
        .into_iter()
        .filter(|r| in_ns(r) && name.is_none_or(|n| r.name() == n))
        .collect();
    if let Some(n) = name
        && found.is_empty()
    {
        match (kind.namespaced(), namespace) {
            (true, Some(ns)) => bail!("{kind} {n:?} not found in namespace {ns:?}"),
            _ => bail!("{kind} {n:?} not found"),
        }
    }
    Ok(found)
}

/// Renders resources in the requested format. YAML lists are `---`-separated documents and JSON
/// lists are arrays, so the output can be fed back to `apply -f`.
pub fn render(kind: Kind, resources: &[Resource], output: Output, single: bool) -> String {
    match output {
        Output::Table => render_table(kind, resources),
        Output::Wide if kind == Kind::Node => render_nodes_wide(resources),
        Output::Wide => {
            render_wide(kind, resources).unwrap_or_else(|| render_table(kind, resources))
        }
        Output::Yaml => resources
            .iter()
            .map(|r| r.to_yaml())
            .collect::<Vec<_>>()
            .join("---\n"),
        Output::Json => {
            let v: Vec<serde_json::Value> = resources
                .iter()
                .map(|r| serde_json::to_value(r).unwrap_or_default())
                .collect();
            let v = if single && v.len() == 1 {
                v.into_iter().next().unwrap_or_default()
            } else {
                serde_json::Value::Array(v)
            };
            serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
        }
    }
}

/// One column of a kind's table: its header and how a document of the kind fills it.
type Column<S> = (&'static str, fn(&Document<S>) -> String);

/// A spec whose documents `get` tabulates: picks them out of the resources.
trait Tabulated: Sized {
    fn pick(r: &Resource) -> Option<&Document<Self>>;
}

macro_rules! tabulated {
    ($($variant:ident: $spec:ty),+ $(,)?) => {$(
        impl Tabulated for $spec {
            fn pick(r: &Resource) -> Option<&Document<$spec>> {
                match r {
                    Resource::$variant(d) => Some(d),
                    _ => None,
                }
            }
        }
    )+};
}

tabulated! {
    IpPool: IpPoolSpec,
    WorkloadEndpoint: WorkloadEndpointSpec,
    Node: NodeSpec,
    IpReservation: IpReservationSpec,
    IpamConfig: IpamConfigSpec,
    NetworkPolicy: NetworkPolicySpec,
    GlobalNetworkPolicy: GlobalNetworkPolicySpec,
    K8sNetworkPolicy: K8sNetworkPolicySpec,
    StagedNetworkPolicy: StagedNetworkPolicySpec,
    StagedGlobalNetworkPolicy: StagedGlobalNetworkPolicySpec,
    StagedKubernetesNetworkPolicy: StagedKubernetesNetworkPolicySpec,
    Namespace: NamespaceSpec,
    BgpConfiguration: BgpConfigurationSpec,
    BgpPeer: BgpPeerSpec,
}

/// The table of the documents of spec `S` among `resources`, one row each, in `columns`.
fn columns<S: Tabulated>(resources: &[Resource], columns: &[Column<S>]) -> String {
    let headers: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    let rows: Vec<Vec<String>> = resources
        .iter()
        .filter_map(S::pick)
        .map(|d| columns.iter().map(|(_, cell)| cell(d)).collect())
        .collect();
    table::plain(&headers, &rows)
}

/// The NAME column's cell.
fn name<S>(d: &Document<S>) -> String {
    d.metadata.name.clone()
}

/// The NAMESPACE column's cell (empty for a document without one).
fn namespace<S>(d: &Document<S>) -> String {
    d.metadata.namespace.clone().unwrap_or_default()
}

/// A policy's order as calicoctl prints it (empty when unset).
fn order(o: Option<f64>) -> String {
    o.map(|o| o.to_string()).unwrap_or_default()
}

fn render_table(kind: Kind, resources: &[Resource]) -> String {
    let r = resources;
    match kind {
        Kind::IpPool => columns::<IpPoolSpec>(
            r,
            &[
                ("NAME", name),
                ("CIDR", |p| p.spec.cidr.clone()),
                ("SELECTOR", |p| p.spec.node_selector.clone()),
            ],
        ),
        Kind::WorkloadEndpoint => columns::<WorkloadEndpointSpec>(
            r,
            &[
                ("NAMESPACE", namespace),
                ("NAME", name),
                ("WORKLOAD", |w| w.spec.pod.clone()),
                ("NODE", |w| w.spec.node.clone()),
                ("NETWORKS", |w| w.spec.ip_networks.join(",")),
                ("INTERFACE", |w| w.spec.interface_name.clone()),
            ],
        ),
        Kind::Node => columns::<NodeSpec>(r, &[("NAME", name), ("ADDRESSES", node_addresses)]),
        Kind::IpReservation => columns::<IpReservationSpec>(
            r,
            &[
                ("NAME", name),
                ("RESERVED CIDRS", |x| x.spec.reserved_cidrs.join(",")),
            ],
        ),
        Kind::IpamConfig => columns::<IpamConfigSpec>(
            r,
            &[
                ("NAME", name),
                ("STRICTAFFINITY", |c| c.spec.strict_affinity.to_string()),
                ("MAXBLOCKSPERHOST", |c| {
                    c.spec.max_blocks_per_host.to_string()
                }),
            ],
        ),
        Kind::NetworkPolicy => {
            columns::<NetworkPolicySpec>(r, &[("NAMESPACE", namespace), ("NAME", name)])
        }
        Kind::GlobalNetworkPolicy => columns::<GlobalNetworkPolicySpec>(r, &[("NAME", name)]),
        Kind::K8sNetworkPolicy => columns::<K8sNetworkPolicySpec>(
            r,
            &[
                ("NAMESPACE", namespace),
                ("NAME", name),
                ("POD-SELECTOR", |p| label_selector(&p.spec.pod_selector)),
            ],
        ),
        Kind::StagedNetworkPolicy => columns::<StagedNetworkPolicySpec>(
            r,
            &[
                ("NAMESPACE", namespace),
                ("NAME", name),
                ("ACTION", |p| p.spec.staged_action.as_str().to_string()),
            ],
        ),
        Kind::StagedGlobalNetworkPolicy => columns::<StagedGlobalNetworkPolicySpec>(
            r,
            &[
                ("NAME", name),
                ("ACTION", |p| p.spec.0.staged_action.as_str().to_string()),
            ],
        ),
        Kind::StagedKubernetesNetworkPolicy => columns::<StagedKubernetesNetworkPolicySpec>(
            r,
            &[
                ("NAMESPACE", namespace),
                ("NAME", name),
                ("ACTION", |p| p.spec.staged_action.as_str().to_string()),
                ("POD-SELECTOR", |p| label_selector(&p.spec.pod_selector)),
            ],
        ),
        Kind::Namespace => columns::<NamespaceSpec>(
            r,
            &[("NAME", name), ("LABELS", |n| labels(&n.metadata.labels))],
        ),
        Kind::BgpConfiguration => columns::<BgpConfigurationSpec>(
            r,
            &[
                ("NAME", name),
                ("LOGSEVERITY", |c| {
                    c.spec
                        .log_severity_screen
                        .clone()
                        .unwrap_or_else(|| "Info".to_string())
                }),
                ("MESHENABLED", |c| {
                    c.spec.node_to_node_mesh_enabled.to_string()
                }),
                ("ASNUMBER", |c| c.spec.as_number().to_string()),
            ],
        ),
        Kind::BgpPeer => columns::<BgpPeerSpec>(
            r,
            &[
                ("NAME", name),
                ("PEERIP", |p| {
                    p.spec
                        .peer_ip
                        .clone()
                        .or_else(|| p.spec.peer_selector.clone())
                        .unwrap_or_default()
                }),
                ("NODE", |p| {
                    p.spec
                        .node
                        .clone()
                        .or_else(|| p.spec.node_selector.clone())
                        .unwrap_or_else(|| "(global)".to_string())
                }),
                ("ASN", |p| {
                    p.spec.as_number.map(|a| a.to_string()).unwrap_or_default()
                }),
            ],
        ),
    }
}

/// A node's addresses, or its BGP IPv4 address when it lists none.
fn node_addresses(n: &Document<NodeSpec>) -> String {
    let mut addrs: Vec<String> = n.spec.addresses.iter().map(|a| a.address.clone()).collect();
    if addrs.is_empty()
        && let Some(a) = n.spec.bgp.as_ref().and_then(|b| b.ipv4_address.clone())
    {
        addrs.push(a);
    }
    addrs.join(",")
}

/// A pool's spec field by its document name, as `-o wide` shows it: a string or a boolean as
/// written, `default` when unset.
fn pool_field(p: &Document<IpPoolSpec>, key: &str, default: &str) -> String {
    let spec = serde_json::to_value(&p.spec).unwrap_or_default();
    match &spec[key] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Bool(b) => b.to_string(),
        _ => default.to_string(),
    }
}

/// `-o wide` for the kinds with extra columns (calicoctl's): pools show their encapsulation
/// and NAT, policies their order and selector. `None` for kinds whose wide table is the plain
/// one.
fn render_wide(kind: Kind, resources: &[Resource]) -> Option<String> {
    let r = resources;
    Some(match kind {
        Kind::IpPool => columns::<IpPoolSpec>(
            r,
            &[
                ("NAME", name),
                ("CIDR", |p| p.spec.cidr.clone()),
                ("NAT", |p| pool_field(p, "natOutgoing", "false")),
                ("IPIPMODE", |p| pool_field(p, "ipipMode", "Never")),
                ("VXLANMODE", |p| pool_field(p, "vxlanMode", "Never")),
                ("DISABLED", |p| pool_field(p, "disabled", "false")),
                ("SELECTOR", |p| p.spec.node_selector.clone()),
            ],
        ),
        Kind::NetworkPolicy => columns::<NetworkPolicySpec>(
            r,
            &[
                ("NAMESPACE", namespace),
                ("NAME", name),
                ("ORDER", |p| order(p.spec.order)),
                ("SELECTOR", |p| p.spec.selector.clone()),
            ],
        ),
        Kind::GlobalNetworkPolicy => columns::<GlobalNetworkPolicySpec>(
            r,
            &[
                ("NAME", name),
                ("ORDER", |p| order(p.spec.0.order)),
                ("SELECTOR", |p| p.spec.0.selector.clone()),
            ],
        ),
        _ => return None,
    })
}

/// A Kubernetes label selector as kubectl prints it (`app=web,tier in (a,b),!debug`);
/// `<none>` for the empty selector.
fn label_selector(s: &tern_model::LabelSelector) -> String {
    use tern_model::LabelSelectorOperator as Op;
    let mut parts: Vec<String> = s
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in &s.match_expressions {
        parts.push(match e.operator {
            Op::In => format!("{} in ({})", e.key, e.values.join(",")),
            Op::NotIn => format!("{} notin ({})", e.key, e.values.join(",")),
            Op::Exists => e.key.clone(),
            Op::DoesNotExist => format!("!{}", e.key),
        });
    }
    if parts.is_empty() {
        "<none>".to_string()
    } else {
        parts.join(",")
    }
}

/// Labels as `k=v,k2=v2` (kubectl's `--show-labels`); `<none>` when there are none.
fn labels(l: &std::collections::BTreeMap<String, String>) -> String {
    if l.is_empty() {
        return "<none>".to_string();
    }
    l.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `get nodes -o wide`: the node's addresses and its tunnel endpoints. Fields are read from the
/// serialised spec by their document names, so tunnel fields added to the model later
/// (`ipv4IPIPTunnelAddr`) show up without a change here.
fn render_nodes_wide(resources: &[Resource]) -> String {
    columns::<NodeSpec>(
        resources,
        &[
            ("NAME", name),
            ("ADDRESSES", |n| {
                let addrs: Vec<String> =
                    n.spec.addresses.iter().map(|a| a.address.clone()).collect();
                if addrs.is_empty() {
                    "-".to_string()
                } else {
                    addrs.join(",")
                }
            }),
            ("IPV4", |n| node_field(n, &["bgp", "ipv4Address"])),
            ("VXLAN TUNNEL ADDR", |n| {
                node_field(n, &["ipv4VXLANTunnelAddr"])
            }),
            ("VXLAN MAC", |n| node_field(n, &["vxlanTunnelMACAddr"])),
            ("IPIP TUNNEL ADDR", |n| {
                node_field(n, &["ipv4IPIPTunnelAddr"])
            }),
        ],
    )
}

/// The string at `path` in a node's serialised spec; `-` when there is none.
fn node_field(n: &Document<NodeSpec>, path: &[&str]) -> String {
    let spec = serde_json::to_value(&n.spec).unwrap_or_default();
    let mut v = &spec;
    for p in path {
        v = &v[*p];
    }
    v.as_str().unwrap_or("-").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_model::{Document, IpPoolSpec, WorkloadEndpointSpec};
    use tern_store::mem::MemStore;

    #[test]
    fn kind_aliases() {
        for s in ["ippool", "IPPool", "ippools", "IPPOOLS", "pool"] {
            assert_eq!(parse_kind(s).unwrap(), Kind::IpPool, "{s}");
        }
        for s in ["workloadendpoint", "WorkloadEndpoints", "wep", "weps"] {
            assert_eq!(parse_kind(s).unwrap(), Kind::WorkloadEndpoint, "{s}");
        }
        for s in ["node", "Nodes", "no"] {
            assert_eq!(parse_kind(s).unwrap(), Kind::Node, "{s}");
        }
        for s in ["ipamconfig", "IPAMConfig", "ipamconfigs"] {
            assert_eq!(parse_kind(s).unwrap(), Kind::IpamConfig, "{s}");
        }
        let e = parse_kind("bogus").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    fn wep(ns: &str, name: &str, pod: &str, ip: &str) -> Resource {
        let mut d = Document::new(
            name,
            WorkloadEndpointSpec {
                node: "node1".into(),
                orchestrator: "k8s".into(),
                pod: pod.into(),
                container_id: "abc".into(),
                endpoint: "eth0".into(),
                interface_name: "tern1234567890a".into(),
                mac: String::new(),
                ip_networks: vec![ip.into()],
                network: String::new(),
                profiles: vec![],
                service_account_name: None,
                ports: vec![],
            },
        );
        d.metadata.namespace = Some(ns.into());
        d.into()
    }

    fn seeded() -> MemStore {
        let s = MemStore::new();
        tern_model::put_resource(
            &s,
            &Document::new("default-pool", IpPoolSpec::new("10.244.0.0/16")).into(),
        )
        .unwrap();
        tern_model::put_resource(
            &s,
            &wep("default", "node1-k8s-web-eth0", "web", "10.244.0.1/32"),
        )
        .unwrap();
        tern_model::put_resource(&s, &wep("prod", "node1-k8s-db-eth0", "db", "10.244.0.2/32"))
            .unwrap();
        s
    }

    #[test]
    fn pool_table() {
        let s = seeded();
        let r = fetch(&s, Kind::IpPool, None, None).unwrap();
        assert_eq!(
            render(Kind::IpPool, &r, Output::Table, false),
            "NAME           CIDR            SELECTOR\ndefault-pool   10.244.0.0/16   all()\n"
        );
    }

    #[test]
    fn workload_endpoints_by_namespace() {
        let s = seeded();
        let all = fetch(&s, Kind::WorkloadEndpoint, None, None).unwrap();
        assert_eq!(all.len(), 2);
        let out = render(Kind::WorkloadEndpoint, &all, Output::Table, false);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "NAMESPACE",
                "NAME",
                "WORKLOAD",
                "NODE",
                "NETWORKS",
                "INTERFACE"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "default",
                "node1-k8s-web-eth0",
                "web",
                "node1",
                "10.244.0.1/32",
                "tern1234567890a"
            ]
        );
        let prod = fetch(&s, Kind::WorkloadEndpoint, None, Some("prod")).unwrap();
        assert_eq!(prod.len(), 1);
        assert_eq!(prod[0].name(), "node1-k8s-db-eth0");
        // A name without -n is looked up in every namespace.
        assert_eq!(
            fetch(&s, Kind::WorkloadEndpoint, Some("node1-k8s-db-eth0"), None)
                .unwrap()
                .len(),
            1
        );
        let e = fetch(
            &s,
            Kind::WorkloadEndpoint,
            Some("node1-k8s-db-eth0"),
            Some("default"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not found in namespace \"default\""), "{e}");
    }

    #[test]
    fn nodes_wide_shows_tunnel_endpoints() {
        use tern_model::{NodeAddress, NodeBgpSpec, NodeSpec};
        let s = MemStore::new();
        let spec = NodeSpec {
            addresses: vec![NodeAddress {
                address: "198.18.0.11".into(),
                kind: Some("InternalIP".into()),
            }],
            bgp: Some(NodeBgpSpec {
                ipv4_address: Some("198.18.0.11/24".into()),
                ..NodeBgpSpec::default()
            }),
            ipv4_vxlan_tunnel_addr: Some("10.244.0.0".into()),
            vxlan_tunnel_mac_addr: Some("66:1f:2a:00:00:01".into()),
            ..NodeSpec::default()
        };
        tern_model::put_resource(&s, &Document::new("node1", spec).into()).unwrap();
        tern_model::put_resource(&s, &Document::new("node2", NodeSpec::default()).into()).unwrap();
        let r = fetch(&s, Kind::Node, None, None).unwrap();
        let out = render(Kind::Node, &r, Output::Wide, false);
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| {
                l.split("   ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAME",
                "ADDRESSES",
                "IPV4",
                "VXLAN TUNNEL ADDR",
                "VXLAN MAC",
                "IPIP TUNNEL ADDR"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "node1",
                "198.18.0.11",
                "198.18.0.11/24",
                "10.244.0.0",
                "66:1f:2a:00:00:01",
                "-"
            ]
        );
        assert_eq!(lines[2], ["node2", "-", "-", "-", "-", "-"]);
        // Kinds without wide columns fall back to the plain table.
        let cfgs = fetch(&s, Kind::IpamConfig, None, None).unwrap();
        assert_eq!(
            render(Kind::IpamConfig, &cfgs, Output::Wide, false),
            render(Kind::IpamConfig, &cfgs, Output::Table, false)
        );
    }

    #[test]
    fn yaml_and_json_round_trip_through_parse() {
        let s = seeded();
        let all = fetch(&s, Kind::WorkloadEndpoint, None, None).unwrap();
        let yaml = render(Kind::WorkloadEndpoint, &all, Output::Yaml, false);
        let back = tern_model::parse_documents(&yaml, "out.yaml").unwrap();
        assert_eq!(back, all);
        let json = render(Kind::WorkloadEndpoint, &all, Output::Json, false);
        assert_eq!(tern_model::parse_documents(&json, "out.json").unwrap(), all);
        let one = fetch(&s, Kind::IpPool, Some("default-pool"), None).unwrap();
        let json = render(Kind::IpPool, &one, Output::Json, true);
        assert!(json.trim_start().starts_with('{'));
        assert_eq!(tern_model::parse_documents(&json, "p.json").unwrap(), one);
    }

    fn columns(out: &str) -> Vec<Vec<String>> {
        out.lines()
            .map(|l| {
                l.split("   ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_kind_has_a_calicoctl_shaped_table() {
        let s = MemStore::new();
        let text = "\
apiVersion: tern.dev/v1
kind: BGPPeer
metadata:
  name: rack1-tor
spec:
  peerIP: 198.18.0.1
  asNumber: 64512
  node: node1
---
apiVersion: tern.dev/v1
kind: BGPPeer
metadata:
  name: everyone
spec:
  peerIP: 198.18.0.2
  asNumber: 64513
---
apiVersion: tern.dev/v1
kind: BGPConfiguration
metadata:
  name: default
spec:
  nodeToNodeMeshEnabled: false
  asNumber: 64512
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: allow-web
  namespace: prod
spec:
  podSelector:
    matchLabels: {app: web}
    matchExpressions:
    - {key: tier, operator: In, values: [a, b]}
---
apiVersion: tern.dev/v1
kind: GlobalNetworkPolicy
metadata:
  name: deny-all
spec:
  order: 10
  selector: all()
---
apiVersion: v1
kind: Namespace
metadata:
  name: prod
  labels: {team: blue}
";
        crate::commands::apply::apply(&s, text, "all.yaml").unwrap();
        let table = |kind, output| {
            let r = fetch(&s, kind, None, None).unwrap();
            columns(&render(kind, &r, output, false))
        };
        assert_eq!(
            table(Kind::BgpPeer, Output::Table),
            [
                vec!["NAME", "PEERIP", "NODE", "ASN"],
                vec!["everyone", "198.18.0.2", "(global)", "64513"],
                vec!["rack1-tor", "198.18.0.1", "node1", "64512"],
            ]
        );
        assert_eq!(
            table(Kind::BgpConfiguration, Output::Table),
            [
                vec!["NAME", "LOGSEVERITY", "MESHENABLED", "ASNUMBER"],
                vec!["default", "Info", "false", "64512"],
            ]
        );
        assert_eq!(
            table(Kind::K8sNetworkPolicy, Output::Table),
            [
                vec!["NAMESPACE", "NAME", "POD-SELECTOR"],
                vec!["prod", "allow-web", "app=web,tier in (a,b)"],
            ]
        );
        assert_eq!(
            table(Kind::GlobalNetworkPolicy, Output::Table),
            [vec!["NAME"], vec!["deny-all"]]
        );
        assert_eq!(
            table(Kind::GlobalNetworkPolicy, Output::Wide),
            [
                vec!["NAME", "ORDER", "SELECTOR"],
                vec!["deny-all", "10", "all()"]
            ]
        );
        assert_eq!(
            table(Kind::Namespace, Output::Table),
            [vec!["NAME", "LABELS"], vec!["prod", "team=blue"]]
        );
    }

    #[test]
    fn pools_wide_show_encapsulation_and_nat() {
        let s = seeded();
        let r = fetch(&s, Kind::IpPool, None, None).unwrap();
        assert_eq!(
            columns(&render(Kind::IpPool, &r, Output::Wide, false)),
            [
                vec![
                    "NAME",
                    "CIDR",
                    "NAT",
                    "IPIPMODE",
                    "VXLANMODE",
                    "DISABLED",
                    "SELECTOR"
                ],
                vec![
                    "default-pool",
                    "10.244.0.0/16",
                    "false",
                    "Never",
                    "Never",
                    "false",
                    "all()"
                ],
            ]
        );
    }

    #[test]
    fn all_namespaces_flag_is_accepted() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(["ternctl", "get", "bgpPeer", "-A"]).unwrap();
        let crate::cli::Command::Get {
            all_namespaces,
            namespace,
            ..
        } = cli.command
        else {
            panic!("not a get");
        };
        assert!(all_namespaces);
        assert!(namespace.is_none());
        let e = crate::cli::Cli::try_parse_from(["ternctl", "get", "wep", "-A", "-n", "x"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
        // delete takes KIND NAME or -f FILE, not both.
        assert!(crate::cli::Cli::try_parse_from(["ternctl", "delete", "-f", "x.yaml"]).is_ok());
        assert!(crate::cli::Cli::try_parse_from(["ternctl", "delete", "ippool", "p1"]).is_ok());
        assert!(crate::cli::Cli::try_parse_from(["ternctl", "delete", "ippool"]).is_err());
        assert!(
            crate::cli::Cli::try_parse_from(["ternctl", "delete", "ippool", "p", "-f", "x"])
                .is_err()
        );
        // The bin dir may come from TERN_K8S_BIN (scripts/test.sh exports it) without
        // --kubernetes: the plain demo must still parse.
        assert!(
            crate::cli::Cli::try_parse_from(["ternctl", "lab", "demo", "--k8s-bin-dir", "/x"])
                .is_ok()
        );
    }
}
