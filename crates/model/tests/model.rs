//! Pins the document format, error messages and validation rules users rely on.

use tern_model::*;
use tern_store::mem::MemStore;

fn parse_err(text: &str, file: &str) -> String {
    parse_documents(text, file).unwrap_err().to_string()
}

const POOLS: &str = "\
# two pools
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-v4
spec:
  cidr: 10.96.0.0/12
---
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-v6
spec:
  cidr: fd00:10::/64
  vxlanMode: Always
  natOutgoing: true
";

#[test]
fn parses_multi_document_yaml_with_defaults() {
    let rs = parse_documents(POOLS, "pools.yaml").unwrap();
    assert_eq!(rs.len(), 2);
    let Resource::IpPool(a) = &rs[0] else {
        panic!("not a pool")
    };
    assert_eq!(a.metadata.name, "pool-v4");
    assert_eq!(a.spec.block_size, 26);
    assert_eq!(a.spec.ipip_mode, EncapMode::Never);
    assert_eq!(a.spec.node_selector, "all()");
    assert_eq!(
        a.spec.allowed_uses,
        vec![AllowedUse::Workload, AllowedUse::Tunnel]
    );
    let Resource::IpPool(b) = &rs[1] else {
        panic!("not a pool")
    };
    assert_eq!(b.spec.block_size, 122);
    assert_eq!(b.spec.vxlan_mode, EncapMode::Always);
    assert!(b.spec.nat_outgoing);
    for r in &rs {
        r.validate().unwrap();
    }
}

#[test]
fn type_error_names_file_line_and_field() {
    let text = "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  cidr: 10.0.0.0/16\n  blockSize: big\n";
    assert_eq!(
        parse_err(text, "pool.yaml"),
        "pool.yaml:7: spec.blockSize: invalid type: string \"big\", expected u8"
    );
}

#[test]
fn unknown_field_is_rejected_with_line_relative_to_file() {
    // The error is in the second document: line numbers count from the top of the file.
    let text = format!(
        "{POOLS}---\napiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  cidrr: 10.0.0.0/16\n"
    );
    let msg = parse_err(&text, "pool.yaml");
    assert!(
        msg.starts_with("pool.yaml:23: spec: unknown field `cidrr`, expected one of `cidr`"),
        "{msg}"
    );
}

#[test]
fn unknown_metadata_field_and_bad_enum() {
    let text = "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\n  nam: x\nspec:\n  cidr: 10.0.0.0/16\n";
    let msg = parse_err(text, "p.yaml");
    assert!(
        msg.starts_with("p.yaml:5: metadata: unknown field `nam`"),
        "{msg}"
    );
    let text = "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  cidr: 10.0.0.0/16\n  ipipMode: Sometimes\n";
    let msg = parse_err(text, "p.yaml");
    assert!(
        msg.starts_with("p.yaml:7: spec.ipipMode: unknown variant `Sometimes`"),
        "{msg}"
    );
}

#[test]
fn missing_required_field() {
    let text =
        "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  blockSize: 26\n";
    let msg = parse_err(text, "p.yaml");
    assert!(msg.contains("spec: missing field `cidr`"), "{msg}");
    assert!(msg.starts_with("p.yaml:"), "{msg}");
}

#[test]
fn header_errors() {
    assert_eq!(
        parse_err("apiVersion: v1\nkind: IPPool\n", "x.yaml"),
        "x.yaml:1: apiVersion: unsupported apiVersion \"v1\", expected tern.dev/v1"
    );
    assert_eq!(
        parse_err(
            "# c\napiVersion: tern.dev/v1\nkind: Pod\nmetadata: {name: x}\n",
            "x.yaml"
        ),
        "x.yaml:3: kind: unknown kind \"Pod\"; expected one of IPPool, IPAMConfig, Node, WorkloadEndpoint, IPReservation, NetworkPolicy, GlobalNetworkPolicy, KubernetesNetworkPolicy, StagedNetworkPolicy, StagedGlobalNetworkPolicy, StagedKubernetesNetworkPolicy, Namespace, BGPConfiguration, BGPPeer"
    );
    assert_eq!(
        parse_err(
            "apiVersion: tern.dev/v1\nkind: AgentConfiguration\n",
            "x.yaml"
        ),
        "x.yaml:2: kind: kind AgentConfiguration is not supported yet"
    );
    assert_eq!(
        parse_err("\n\napiVersion: tern.dev/v1\n", "x.yaml"),
        "x.yaml:3: kind: missing field `kind`"
    );
    let msg = parse_err("apiVersion: tern.dev/v1\nkind: [\n", "x.yaml");
    assert!(msg.starts_with("x.yaml:"), "{msg}");
}

#[test]
fn json_documents() {
    let text = r#"{
  "apiVersion": "tern.dev/v1",
  "kind": "IPAMConfig",
  "metadata": {"name": "default"},
  "spec": {"strictAffinity": true}
}"#;
    let rs = parse_documents(text, "c.json").unwrap();
    let Resource::IpamConfig(c) = &rs[0] else {
        panic!()
    };
    assert!(c.spec.strict_affinity);
    assert_eq!(c.spec.max_blocks_per_host, 20);

    let bad = text.replace("strictAffinity", "strict");
    let msg = parse_err(&bad, "c.json");
    assert!(
        msg.starts_with("c.json:5: spec: unknown field `strict`"),
        "{msg}"
    );

    let arr = format!("[{text}, {}]", text.replace("true", "\"yes\""));
    let msg = parse_err(&arr, "c.json");
    assert_eq!(
        msg,
        "c.json: [1].spec.strictAffinity: invalid type: string \"yes\", expected a boolean"
    );
}

#[test]
fn round_trips_yaml_and_json() {
    let wep_yaml = "\
apiVersion: tern.dev/v1
kind: WorkloadEndpoint
metadata:
  name: node1-k8s-web-eth0
  namespace: default
  labels:
    app: web
spec:
  node: node1
  orchestrator: k8s
  pod: web
  containerID: abc123
  endpoint: eth0
  interfaceName: tern1234567890a
  mac: 02:42:ac:11:00:02
  ipNetworks:
  - 10.244.0.5/32
  network: k8s-pod-network
";
    let node_yaml = "\
apiVersion: tern.dev/v1
kind: Node
metadata:
  name: node1
spec:
  addresses:
  - address: 198.18.0.2
    type: InternalIP
  podCIDRs:
  - 10.244.0.0/24
  bgp:
    ipv4Address: 198.18.0.2/24
    asNumber: 64512
";
    for text in [POOLS, wep_yaml, node_yaml] {
        let rs = parse_documents(text, "f.yaml").unwrap();
        for r in &rs {
            r.validate().unwrap();
            let again = parse_documents(&r.to_yaml(), "again.yaml").unwrap();
            assert_eq!(&again[0], r);
            let from_json = parse_documents(&r.to_json(), "again.json").unwrap();
            assert_eq!(&from_json[0], r);
            assert_eq!(&Resource::from_json(r.to_json().as_bytes()).unwrap(), r);
        }
    }
    let rs = parse_documents(wep_yaml, "w.yaml").unwrap();
    let Resource::WorkloadEndpoint(w) = &rs[0] else {
        panic!()
    };
    assert_eq!(w.spec.container_id, "abc123");
    assert!(rs[0].to_json().contains("\"containerID\":\"abc123\""));
    let rs = parse_documents(node_yaml, "n.yaml").unwrap();
    assert!(rs[0].to_json().contains("\"podCIDRs\""));
}

fn pool(name: &str, cidr: &str) -> IpPool {
    IpPool::new(name, IpPoolSpec::new(cidr))
}

fn invalid(r: impl Into<Resource>) -> String {
    r.into().validate().unwrap_err().to_string()
}

#[test]
fn pool_validation() {
    assert_eq!(
        invalid(pool("p", "10.0.0.1/16")),
        "IPPool \"p\": spec.cidr: 10.0.0.1/16 is not a network address; did you mean 10.0.0.0/16?"
    );
    assert_eq!(
        invalid(pool("p", "10.0.0.0")),
        "IPPool \"p\": spec.cidr: \"10.0.0.0\" is not a CIDR (expected e.g. 10.244.0.0/16)"
    );
    assert_eq!(
        invalid(pool("p", "169.254.0.0/24")),
        "IPPool \"p\": spec.cidr: 169.254.0.0/24 overlaps the link-local range 169.254.0.0/16"
    );
    assert!(invalid(pool("p", "fe80::/64")).contains("link-local range fe80::/10"));
    assert!(invalid(pool("p", "128.0.0.0/1")).contains("169.254.0.0/16"));
    let mut p = pool("p", "10.0.0.0/16");
    p.spec.block_size = 19;
    assert_eq!(
        invalid(p.clone()),
        "IPPool \"p\": spec.blockSize: 19 is out of range for 10.0.0.0/16 (must be 20..=32)"
    );
    p.spec.block_size = 33;
    assert!(invalid(p.clone()).contains("out of range"));
    let mut p = pool("p", "10.0.0.0/28");
    p.spec.block_size = 26;
    assert!(invalid(p).contains("spec.blockSize: 26 is smaller than the pool's prefix length 28"),);
    let mut p = pool("p", "fd00::/64");
    assert_eq!(p.spec.block_size, 122);
    p.spec.block_size = 100;
    assert!(invalid(p).contains("must be 116..=128"));
    let mut p = pool("p", "fd00::/64");
    p.spec.ipip_mode = EncapMode::Always;
    assert!(invalid(p).contains("IPIP is not supported on IPv6"));
    let mut p = pool("p", "10.0.0.0/16");
    p.spec.ipip_mode = EncapMode::Always;
    p.spec.vxlan_mode = EncapMode::CrossSubnet;
    assert!(invalid(p).contains("both IPIP and VXLAN"));
    assert!(
        invalid(pool("Pool_1", "10.0.0.0/16"))
            .contains("metadata.name: \"Pool_1\" is not a valid DNS-1123 subdomain")
    );
    let mut ok = pool("p.a-1", "10.0.0.0/30");
    ok.spec.block_size = 30;
    Resource::from(ok).validate().unwrap();
}

#[test]
fn pool_overlaps() {
    let a = pool("a", "10.0.0.0/16");
    let b = pool("b", "10.0.128.0/20");
    let c = pool("c", "10.1.0.0/16");
    assert_eq!(ip_pool_overlaps(&a, std::slice::from_ref(&c)), None);
    // The pool itself (same name, e.g. on update) is not a conflict.
    assert_eq!(ip_pool_overlaps(&a, &[a.clone(), c.clone()]), None);
    assert_eq!(
        ip_pool_overlaps(&b, &[c, a]).unwrap(),
        "IPPool \"b\" (10.0.128.0/20) overlaps IPPool \"a\" (10.0.0.0/16)"
    );
}

#[test]
fn other_validation() {
    let mut w = WorkloadEndpoint::new(
        "n-k8s-p-eth0",
        WorkloadEndpointSpec {
            node: "n".into(),
            orchestrator: "k8s".into(),
            pod: "p".into(),
            container_id: "c".into(),
            endpoint: "eth0".into(),
            interface_name: "tern0123456789a".into(),
            mac: "ee:ee:ee:ee:ee:ee".into(),
            ip_networks: vec!["10.0.0.1/32".into()],
            network: String::new(),
            profiles: vec![],
            service_account_name: None,
            ports: vec![],
        },
    );
    assert!(invalid(w.clone()).contains("metadata.namespace: WorkloadEndpoint is namespaced"));
    w.metadata.namespace = Some("default".into());
    Resource::from(w.clone()).validate().unwrap();
    w.spec.ip_networks.push("10.0.0.300/32".into());
    assert!(invalid(w).contains("spec.ipNetworks[1]: \"10.0.0.300/32\" is not a CIDR"));

    let c = IpamConfig::new("cfg", IpamConfigSpec::default());
    assert!(invalid(c).contains("must be named \"default\""));

    let n = Node::new(
        "n1",
        NodeSpec {
            bgp: Some(NodeBgpSpec {
                ipv4_address: Some("fd00::1/64".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    assert_eq!(
        invalid(n),
        "Node \"n1\": spec.bgp.ipv4Address: \"fd00::1/64\" is not an IPv4 address"
    );
}

/// The IPv6 VXLAN fields (Calico's names) round-trip and are checked like the IPv4 ones: an
/// IPv6 address, a MAC.
#[test]
fn node_ipv6_vxlan_fields() {
    let doc = "\
apiVersion: tern.dev/v1
kind: Node
metadata: {name: n1}
spec:
  ipv4VXLANTunnelAddr: 10.244.0.1
  vxlanTunnelMACAddr: 66:1f:2a:00:00:01
  ipv6VXLANTunnelAddr: fd00:10:244::1
  vxlanTunnelMACAddrV6: 66:1f:2a:00:00:02
";
    let r = parse_documents(doc, "n.yaml").unwrap().remove(0);
    r.validate().unwrap();
    let Resource::Node(n) = &r else { panic!() };
    assert_eq!(
        n.spec.ipv6_vxlan_tunnel_addr.as_deref(),
        Some("fd00:10:244::1")
    );
    assert_eq!(
        n.spec.vxlan_tunnel_mac_addr_v6.as_deref(),
        Some("66:1f:2a:00:00:02")
    );
    let json = r.to_json();
    assert!(
        json.contains("\"ipv6VXLANTunnelAddr\":\"fd00:10:244::1\""),
        "{json}"
    );
    assert!(json.contains("\"vxlanTunnelMACAddrV6\""), "{json}");
    assert_eq!(parse_documents(&r.to_yaml(), "again.yaml").unwrap()[0], r);
    let with = |addr: Option<&str>, mac: Option<&str>| {
        Node::new(
            "n1",
            NodeSpec {
                ipv6_vxlan_tunnel_addr: addr.map(str::to_string),
                vxlan_tunnel_mac_addr_v6: mac.map(str::to_string),
                ..Default::default()
            },
        )
    };
    assert_eq!(
        invalid(with(Some("10.244.0.1"), None)),
        "Node \"n1\": spec.ipv6VXLANTunnelAddr: \"10.244.0.1\" is not an IPv6 address"
    );
    assert_eq!(
        invalid(with(Some("fd00::1/128"), None)),
        "Node \"n1\": spec.ipv6VXLANTunnelAddr: \"fd00::1/128\" is not an IPv6 address"
    );
    assert_eq!(
        invalid(with(None, Some("66:1f:2a:00:00"))),
        "Node \"n1\": spec.vxlanTunnelMACAddrV6: \"66:1f:2a:00:00\" is not a MAC address"
    );
}

#[test]
fn kind_names() {
    assert_eq!("ippools".parse::<Kind>().unwrap(), Kind::IpPool);
    assert_eq!("IPPool".parse::<Kind>().unwrap(), Kind::IpPool);
    assert_eq!("wep".parse::<Kind>().unwrap(), Kind::WorkloadEndpoint);
    assert!("frob".parse::<Kind>().is_err());
}

#[test]
fn store_round_trip_and_conflicts() {
    let store = MemStore::new();
    let s: &dyn tern_store::Store = &store;
    let p: Resource = pool("default-ipv4-ippool", "10.244.0.0/16").into();
    let rev = put_resource(s, &p).unwrap();
    assert_eq!(
        s.get("/tern/v1/resources/ippool/default-ipv4-ippool")
            .unwrap()
            .unwrap()
            .mod_revision,
        rev
    );
    let got = get_resource(s, Kind::IpPool, None, "default-ipv4-ippool")
        .unwrap()
        .unwrap();
    assert_eq!(got.metadata().resource_version, Some(rev.to_string()));
    let mut stripped = got.clone();
    stripped.metadata_mut().resource_version = None;
    assert_eq!(stripped, p);

    // An update with the read resourceVersion succeeds once; the stale one then conflicts.
    put_resource(s, &got).unwrap();
    let err = put_resource(s, &got).unwrap_err();
    assert!(matches!(err, ModelError::Conflict { .. }), "{err}");
    assert!(err.to_string().contains("modified concurrently"));

    // Invalid resources are never written.
    let bad: Resource = pool("bad", "10.0.0.1/8").into();
    assert!(matches!(
        put_resource(s, &bad),
        Err(ModelError::Invalid { .. })
    ));
    assert!(
        get_resource(s, Kind::IpPool, None, "bad")
            .unwrap()
            .is_none()
    );

    put_resource(s, &pool("other", "10.10.0.0/16").into()).unwrap();
    let names: Vec<_> = list_resources(s, Kind::IpPool)
        .unwrap()
        .iter()
        .map(|r| r.name().to_string())
        .collect();
    assert_eq!(names, ["default-ipv4-ippool", "other"]);

    let cfg: Resource = IpamConfig::new(
        "default",
        IpamConfigSpec {
            strict_affinity: true,
            max_blocks_per_host: 0,
            ..IpamConfigSpec::default()
        },
    )
    .into();
    put_resource(s, &cfg).unwrap();
    assert!(s.get(tern_store::keys::IPAM_CONFIG).unwrap().is_some());
    assert_eq!(list_resources(s, Kind::IpamConfig).unwrap().len(), 1);

    assert!(delete_resource(s, Kind::IpPool, None, "other").unwrap());
    assert!(!delete_resource(s, Kind::IpPool, None, "other").unwrap());
    assert_eq!(list_resources(s, Kind::IpPool).unwrap().len(), 1);
}

#[test]
fn namespaced_keys() {
    assert_eq!(
        resource_key(Kind::WorkloadEndpoint, Some("ns1"), "w"),
        "/tern/v1/resources/workloadendpoint/ns1/w"
    );
    assert_eq!(
        resource_key(Kind::Node, Some("ignored"), "n1"),
        "/tern/v1/resources/node/n1"
    );
}

/// A WorkloadEndpoint as written before its addresses were read typed decodes, writes back
/// byte for byte the same JSON, and gives its addresses as networks; an entry that is not a
/// CIDR is left out and reported with the record's name and the value.
#[test]
fn stored_endpoint_addresses_are_typed_and_bad_ones_named() {
    let stored = r#"{"apiVersion":"tern.dev/v1","kind":"WorkloadEndpoint","metadata":{"name":"n-k8s-p-eth0","namespace":"prod","labels":{"app":"web"}},"spec":{"node":"n","orchestrator":"k8s","pod":"p","containerID":"c","endpoint":"eth0","interfaceName":"tern0123","mac":"ee:ee:ee:ee:ee:ee","ipNetworks":["10.0.0.1/32","fd00::1/128"],"network":"net"}}"#;
    let w: WorkloadEndpoint = serde_json::from_str(stored).unwrap();
    assert_eq!(serde_json::to_string(&w).unwrap(), stored);
    let nets = w.ip_networks();
    assert_eq!(
        nets.nets,
        [
            "10.0.0.1/32".parse::<ipnet::IpNet>().unwrap(),
            "fd00::1/128".parse().unwrap()
        ]
    );
    assert!(nets.bad.is_empty());

    let mut odd = w.clone();
    odd.spec.ip_networks[0] = "10.0.0.300/32".into();
    let nets = odd.ip_networks();
    assert_eq!(nets.nets, ["fd00::1/128".parse::<ipnet::IpNet>().unwrap()]);
    assert_eq!(
        nets.bad.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["WorkloadEndpoint prod/n-k8s-p-eth0: ipNetworks entry \"10.0.0.300/32\" is not a CIDR"]
    );
}
