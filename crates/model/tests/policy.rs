//! Parsing and validation of NetworkPolicy, GlobalNetworkPolicy, Kubernetes NetworkPolicy and
//! Namespace documents, including every kind of bad input.

use tern_model::{PolicyType, Port, Protocol, Resource, parse_documents};

fn one(text: &str) -> Resource {
    let mut v = parse_documents(text, "p.yaml").unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

fn invalid(text: &str) -> String {
    match parse_documents(text, "p.yaml") {
        Err(e) => e.to_string(),
        Ok(v) => v[0].validate().unwrap_err().to_string(),
    }
}

const K8S: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: d}\nspec:\n";

#[test]
fn k8s_policy_parses_with_defaults() {
    let r = one(&format!(
        "{K8S}  podSelector: {{matchLabels: {{app: web}}, matchExpressions: [{{key: tier, operator: NotIn, values: [db]}}]}}\n  ingress:\n  - from:\n    - namespaceSelector: {{matchLabels: {{ns: x}}}}\n      podSelector: {{}}\n    ports: [{{port: 80, endPort: 90}}, {{port: http, protocol: UDP}}]\n  egress: [{{}}]\n"
    ));
    r.validate().unwrap();
    assert_eq!(r.kind().as_str(), "KubernetesNetworkPolicy");
    let Resource::K8sNetworkPolicy(p) = &r else {
        panic!()
    };
    assert_eq!(
        p.spec.policy_types,
        [PolicyType::Ingress, PolicyType::Egress]
    );
    assert_eq!(
        p.spec.ingress[0].ports[0].protocol,
        Some(tern_model::K8sProtocol::Tcp)
    );
    assert_eq!(
        p.spec.pod_selector.to_selector().to_string(),
        "app == 'web' && tier not in {'db'}"
    );
    // Round trip through the store's JSON keeps the flavour apart from tern's NetworkPolicy.
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);
    assert_eq!(
        tern_model::resource_key(r.kind(), Some("d"), "p"),
        "/tern/v1/resources/kubernetesnetworkpolicy/d/p"
    );
    // Without egress rules only Ingress is defaulted.
    let Resource::K8sNetworkPolicy(p) = one(&format!("{K8S}  podSelector: {{}}\n")) else {
        panic!()
    };
    assert_eq!(p.spec.policy_types, [PolicyType::Ingress]);
}

#[test]
fn k8s_policy_bad_input() {
    for (body, want) in [
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]\n",
            "spec.ingress[0].from[0].ipBlock.cidr: \"10.0.0.0/33\" is not a CIDR",
        ),
        (
            "  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24]}}]}]\n",
            "spec.egress[0].to[0].ipBlock.except[0]: 10.1.0.0/24 must be a strict subset of cidr 10.0.0.0/16",
        ),
        (
            "  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.0.0/16]}}]}]\n",
            "must be a strict subset",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: 90, endPort: 80}]}]\n",
            "spec.ingress[0].ports[0].endPort: 80 must be greater than or equal to port 90",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: http, endPort: 80}]}]\n",
            "endPort: may not be specified when port is the named port",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{endPort: 80}]}]\n",
            "endPort: may not be specified without port",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: 70000}]}]\n",
            "70000 must be between 1 and 65535",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{port: Not_A_Name}]}]\n",
            "is not a valid port name",
        ),
        (
            "  podSelector: {}\n  ingress: [{ports: [{protocol: ICMP}]}]\n",
            "unknown variant `ICMP`",
        ),
        (
            "  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]\n",
            "ipBlock may not be combined",
        ),
        (
            "  podSelector: {matchExpressions: [{key: a, operator: In}]}\n",
            "spec.podSelector.matchExpressions[0].values: must be non-empty",
        ),
        (
            "  podSelector: {}\n  ingres: []\n",
            "unknown field `ingres`",
        ),
        (
            "  podSelector: {}\n  policyTypes: [Ingress, Sideways]\n",
            "unknown variant `Sideways`",
        ),
    ] {
        let e = invalid(&format!("{K8S}{body}"));
        assert!(e.contains(want), "{body}: {e}");
    }
    // The Kubernetes apiVersion is only accepted for NetworkPolicy.
    let e = invalid("apiVersion: networking.k8s.io/v1\nkind: IPPool\nmetadata: {name: p}\n");
    assert!(e.contains("unsupported apiVersion"), "{e}");
}

const TERN: &str =
    "apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: d}\nspec:\n";

#[test]
fn tern_policies_parse() {
    let r = one(&format!(
        "{TERN}  order: 10.5\n  selector: app == 'web' && has(tier)\n  ingress:\n  - action: Allow\n    protocol: TCP\n    source: {{selector: \"role in {{'a', 'b'}}\", namespaceSelector: all(), nets: [10.0.0.0/8], notNets: [10.1.0.0/16]}}\n    destination: {{ports: [80, '8000:8080', http]}}\n  - action: Log\n  - action: Pass\n  - action: Deny\n    protocol: 132\n"
    ));
    r.validate().unwrap();
    let Resource::NetworkPolicy(p) = &r else {
        panic!()
    };
    assert_eq!(p.spec.types, [PolicyType::Ingress]);
    assert_eq!(p.spec.ingress[3].protocol, Some(Protocol::Number(132)));
    assert_eq!(
        p.spec.ingress[0].destination.ports,
        [
            Port::Range(80, 80),
            Port::Range(8000, 8080),
            Port::Named("http".into())
        ]
    );
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);
    let g = one(
        "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata: {name: g}\nspec:\n  selector: all()\n  egress: [{action: Deny}]\n",
    );
    g.validate().unwrap();
    let Resource::GlobalNetworkPolicy(g) = g else {
        panic!()
    };
    assert_eq!(
        g.spec.types,
        [PolicyType::Egress],
        "only egress rules: Egress"
    );
    let n = one("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {team: a}}\n");
    n.validate().unwrap();
    assert_eq!(n.metadata().labels["team"], "a");
}

#[test]
fn tern_policy_icmp_fields_parse_and_round_trip() {
    let text = format!(
        "{TERN}  ingress:\n  - action: Allow\n    protocol: ICMPv6\n    icmp: {{type: 128, code: 0}}\n  - action: Deny\n    protocol: ICMP\n    notICMP: {{type: 8}}\n    icmp: {{}}\n"
    );
    let Resource::NetworkPolicy(p) = one(&text) else {
        panic!("not a NetworkPolicy")
    };
    let r = &p.spec.ingress;
    assert_eq!(r[0].icmp.unwrap().bytes(), (Some(128), Some(0)));
    assert_eq!(r[0].not_icmp, None);
    assert_eq!(r[1].not_icmp.unwrap().bytes(), (Some(8), None));
    assert_eq!(r[1].icmp.unwrap().bytes(), (None, None));
    let json = serde_json::to_string(&p.spec).unwrap();
    assert!(json.contains(r#""icmp":{"type":128,"code":0}"#), "{json}");
    assert!(json.contains(r#""notICMP":{"type":8}"#), "{json}");
    Resource::NetworkPolicy(p).validate().unwrap();
}

#[test]
fn tern_policy_bad_input() {
    for (body, want) in [
        (
            "  selector: app == 'x' &&\n",
            "spec.selector: invalid selector \"app == 'x' &&\": at position 13",
        ),
        (
            "  ingress: [{action: Allow, source: {selector: \"a = 'b'\"}}]\n",
            "spec.ingress[0].source.selector: invalid selector \"a = 'b'\": at position 2",
        ),
        (
            "  ingress: [{action: Allow, source: {nets: [10.0.0/8]}}]\n",
            "spec.ingress[0].source.nets[0]: \"10.0.0/8\" is not a CIDR",
        ),
        (
            "  ingress: [{action: Allow, destination: {ports: [80]}}]\n",
            "ports require protocol",
        ),
        (
            "  ingress: [{action: Allow, protocol: TCP, destination: {ports: ['90:80']}}]\n",
            "end 80 is below start 90",
        ),
        (
            "  ingress: [{action: Allow, protocol: TCP, source: {ports: [80]}}]\n",
            "source ports are not supported",
        ),
        (
            "  ingress: [{action: Accept}]\n",
            "unknown variant `Accept`",
        ),
        (
            "  ingress: [{action: Allow, protocol: TCPX}]\n",
            "unknown protocol \"TCPX\"",
        ),
        (
            "  ingress: [{action: Allow}]\n  bogus: 1\n",
            "unknown field `bogus`",
        ),
        (
            "  ingress: [{action: Allow, icmp: {type: 8}}]\n",
            "spec.ingress[0].icmp: ICMP matches require protocol ICMP or ICMPv6",
        ),
        (
            "  egress: [{action: Allow, protocol: TCP, notICMP: {type: 8}}]\n",
            "spec.egress[0].notICMP: ICMP matches require protocol ICMP or ICMPv6",
        ),
        (
            "  ingress: [{action: Allow, protocol: ICMP, icmp: {type: 255}}]\n",
            "spec.ingress[0].icmp.type: 255 is not an ICMP type 0-254",
        ),
        (
            "  ingress: [{action: Allow, protocol: ICMPv6, icmp: {type: 1, code: 256}}]\n",
            "spec.ingress[0].icmp.code: 256 is not an ICMP code 0-255",
        ),
        (
            "  ingress: [{action: Allow, protocol: ICMP, notICMP: {code: 0}}]\n",
            "spec.ingress[0].notICMP.code: an ICMP code needs a type",
        ),
        (
            "  ingress: [{action: Allow, protocol: ICMP, icmp: {type: 8, kode: 0}}]\n",
            "unknown field `kode`",
        ),
        (
            "  ingress: [{action: Allow, protocol: ICMP, icmp: {type: -1}}]\n",
            "spec.ingress[0].icmp.type: invalid type: integer `-1`",
        ),
    ] {
        let e = invalid(&format!("{TERN}{body}"));
        assert!(e.contains(want), "{body}: {e}");
    }
    let e =
        invalid("apiVersion: tern.dev/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {}\n");
    assert!(e.contains("namespace is required"), "{e}");
}
