//! Staged policies (`StagedNetworkPolicy`, `StagedGlobalNetworkPolicy`,
//! `StagedKubernetesNetworkPolicy`): parsing with the enforced kinds' defaults, round trips
//! through the store's JSON, aliases, and validation errors naming file, line and field.

use tern_model::{
    Kind, PolicyType, Resource, StagedAction, StagedKubernetesNetworkPolicySpec,
    StagedNetworkPolicySpec, parse_documents,
};

fn one(text: &str) -> Resource {
    let mut v = parse_documents(text, "s.yaml").unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

fn invalid(text: &str) -> String {
    match parse_documents(text, "s.yaml") {
        Err(e) => e.to_string(),
        Ok(v) => v[0].validate().unwrap_err().to_string(),
    }
}

const SNP: &str = "apiVersion: tern.dev/v1\nkind: StagedNetworkPolicy\nmetadata: {name: s, namespace: d}\nspec:\n";
const SGNP: &str =
    "apiVersion: tern.dev/v1\nkind: StagedGlobalNetworkPolicy\nmetadata: {name: g}\nspec:\n";
const SKNP: &str = "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: k, namespace: d}\nspec:\n";

#[test]
fn staged_kinds_parse_with_the_enforced_defaults_and_round_trip() {
    let r = one(&format!(
        "{SNP}  order: 10\n  selector: app == 'web'\n  egress: [{{action: Deny}}]\n"
    ));
    r.validate().unwrap();
    assert_eq!(r.kind(), Kind::StagedNetworkPolicy);
    let Resource::StagedNetworkPolicy(p) = &r else {
        panic!()
    };
    assert_eq!(p.spec.staged_action, StagedAction::Set);
    assert_eq!(p.spec.types, [PolicyType::Egress], "Calico's types default");
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);
    assert_eq!(Resource::from_stored(r.to_json().as_bytes()).unwrap(), r);
    // Set is the default and is not written.
    assert!(!r.to_json().contains("stagedAction"));
    assert_eq!(
        tern_model::resource_key(r.kind(), Some("d"), "s"),
        "/tern/v1/resources/stagednetworkpolicy/d/s"
    );

    let r = one(&format!("{SGNP}  selector: all()\n"));
    r.validate().unwrap();
    let Resource::StagedGlobalNetworkPolicy(g) = &r else {
        panic!()
    };
    assert_eq!(g.spec.types, [PolicyType::Ingress]);
    assert!(!r.kind().namespaced());
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);

    let r = one(&format!(
        "{SKNP}  podSelector: {{}}\n  egress: [{{ports: [{{port: 53}}]}}]\n"
    ));
    r.validate().unwrap();
    let Resource::StagedKubernetesNetworkPolicy(k) = &r else {
        panic!()
    };
    assert_eq!(
        k.spec.policy_types,
        [PolicyType::Ingress, PolicyType::Egress]
    );
    assert_eq!(
        k.spec.egress[0].ports[0].protocol,
        Some(tern_model::K8sProtocol::Tcp)
    );
    assert_eq!(k.spec.enforced().policy_types, k.spec.policy_types);
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);

    // A Delete holds nothing else, and gets no defaults.
    let r = one(&format!("{SKNP}  stagedAction: Delete\n"));
    r.validate().unwrap();
    let Resource::StagedKubernetesNetworkPolicy(k) = &r else {
        panic!()
    };
    assert_eq!(
        k.spec,
        StagedKubernetesNetworkPolicySpec {
            staged_action: StagedAction::Delete,
            ..Default::default()
        }
    );
    assert!(r.to_json().contains("\"stagedAction\":\"Delete\""));
    assert_eq!(Resource::from_json(r.to_json().as_bytes()).unwrap(), r);
    let r = one(&format!("{SGNP}  stagedAction: Delete\n"));
    r.validate().unwrap();
    let Resource::StagedGlobalNetworkPolicy(g) = &r else {
        panic!()
    };
    assert_eq!(
        g.spec.0,
        StagedNetworkPolicySpec {
            staged_action: StagedAction::Delete,
            ..Default::default()
        }
    );
}

#[test]
fn staged_kinds_by_their_aliases_and_their_enforced_kinds() {
    for (alias, kind, enforced) in [
        (
            "stagednetworkpolicy",
            Kind::StagedNetworkPolicy,
            Kind::NetworkPolicy,
        ),
        (
            "stagednetworkpolicies",
            Kind::StagedNetworkPolicy,
            Kind::NetworkPolicy,
        ),
        ("snp", Kind::StagedNetworkPolicy, Kind::NetworkPolicy),
        (
            "sgnp",
            Kind::StagedGlobalNetworkPolicy,
            Kind::GlobalNetworkPolicy,
        ),
        (
            "StagedGlobalNetworkPolicies",
            Kind::StagedGlobalNetworkPolicy,
            Kind::GlobalNetworkPolicy,
        ),
        (
            "sknp",
            Kind::StagedKubernetesNetworkPolicy,
            Kind::K8sNetworkPolicy,
        ),
        (
            "stagedkubernetesnetworkpolicy",
            Kind::StagedKubernetesNetworkPolicy,
            Kind::K8sNetworkPolicy,
        ),
    ] {
        assert_eq!(alias.parse::<Kind>(), Ok(kind), "{alias}");
        assert_eq!(kind.enforced_of_staged(), Some(enforced));
        assert!(kind.is_staged());
        assert!(!enforced.is_staged());
    }
}

#[test]
fn staged_bad_input_names_file_line_and_field() {
    for (text, want) in [
        // The enforced kinds' checks.
        (format!("{SNP}  selector: app ==\n"), "spec.selector"),
        (
            format!("{SNP}  ingress:\n  - action: Allow\n    destination: {{ports: [80]}}\n"),
            "spec.ingress[0].destination.ports: ports require protocol",
        ),
        (
            format!("{SGNP}  egress: [{{action: Deny, destination: {{nets: [10.0.0.0/33]}}}}]\n"),
            "spec.egress[0].destination.nets[0]",
        ),
        (
            format!(
                "{SKNP}  podSelector: {{}}\n  ingress: [{{ports: [{{port: 90, endPort: 80}}]}}]\n"
            ),
            "spec.ingress[0].ports[0].endPort: 80 must be greater than or equal to port 90",
        ),
        // stagedAction itself.
        (
            format!("{SNP}  stagedAction: Learn\n"),
            "s.yaml:5: spec.stagedAction: unknown variant `Learn`, expected `Set` or `Delete`",
        ),
        (
            format!("{SKNP}  stagedAction: Delete\n  podSelector: {{matchLabels: {{a: b}}}}\n"),
            "spec.podSelector: must not be set when stagedAction is Delete",
        ),
        (
            format!("{SGNP}  stagedAction: Delete\n  ingress: [{{action: Allow}}]\n"),
            "spec.ingress: must not be set when stagedAction is Delete",
        ),
        // A misspelt field is an error naming it, as for every kind.
        (
            format!("{SKNP}  podSelektor: {{}}\n"),
            "s.yaml:5: spec: unknown field `podSelektor`",
        ),
    ] {
        let got = invalid(&text);
        assert!(got.contains(want), "{text}\ngot:  {got}\nwant: {want}");
    }
}
