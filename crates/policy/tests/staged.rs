//! Staged policies: kept beside the enforced ones, never compiled, and evaluated by
//! `PolicySet::pending`. On the upstream NetworkPolicy truth tables: a staged default-deny
//! changes no enforced verdict and is pending `denied`, naming it alone, exactly where it would
//! newly deny; a staged Delete of every policy is pending what no policy gives; a staged Set
//! of every enforced policy as it is decides as the enforced set does, naming the staged kinds.

use tern_model::{Kind, Protocol};
use tern_policy::{
    Direction, DirectionExplanation, Flow, Incremental, PolicyKey, PolicySet, Reason, StagedPolicy,
    Verdict, compile,
};

mod common;
mod netpol_cluster;

fn load(set: &mut PolicySet, yaml: &str) {
    for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
        r.validate().unwrap();
        set.apply(&r).unwrap();
    }
}

const STAGED_DENY_ALL: &str = "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: default-deny, namespace: x}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress, Egress]\n";

const STAGED_TERN_DENY_ALL: &str = "apiVersion: tern.dev/v1\nkind: StagedGlobalNetworkPolicy\nmetadata: {name: deny-everything}\nspec:\n  order: 1\n  selector: all()\n  types: [Ingress, Egress]\n  ingress: [{action: Deny}]\n  egress: [{action: Deny}]\n---\napiVersion: tern.dev/v1\nkind: StagedNetworkPolicy\nmetadata: {name: deny-d, namespace: d}\nspec:\n  selector: all()\n  ingress: [{action: Deny}]\n";

fn sample() -> PolicySet {
    let mut s = PolicySet::new();
    s.upsert_endpoint(common::endpoint(
        "d",
        "a",
        "n1",
        "va".into(),
        "10.0.0.1",
        &[("app", "a")],
    ));
    s.upsert_endpoint(common::endpoint(
        "d",
        "b",
        "n1",
        "vb".into(),
        "10.0.0.2",
        &[("app", "b")],
    ));
    s.upsert_endpoint(common::endpoint(
        "x",
        "c",
        "n2",
        "vc".into(),
        "10.0.0.3",
        &[("app", "c")],
    ));
    load(
        &mut s,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: d}\nspec:\n  podSelector: {}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: allow-a, namespace: d}\nspec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: a}}}]\n    ports: [{port: 80}]\n",
    );
    s
}

fn tcp(src: &str, dst: &str, port: u16) -> Flow {
    Flow {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        protocol: Protocol::Tcp,
        dst_port: port,
        icmp: None,
    }
}

fn names(e: &DirectionExplanation) -> Vec<String> {
    e.policies
        .iter()
        .map(|p| match p.rule {
            Some(r) => format!("{} {r}", p.id()),
            None => p.id(),
        })
        .collect()
}

/// Staged deny-alls of every flavour leave the compiled ruleset as it was, whole or
/// incremental, and the enforced verdicts too.
#[test]
fn staged_policies_are_never_compiled() {
    let mut s = sample();
    let before: Vec<_> = ["n1", "n2"].iter().map(|n| compile(&s, n)).collect();
    let mut inc = Incremental::new("n1", s.clone());
    let first = inc.script();
    inc.commit(&first);
    let desired = inc.desired();
    for yaml in [STAGED_DENY_ALL, STAGED_TERN_DENY_ALL] {
        load(&mut s, yaml);
        for r in tern_model::parse_documents(yaml, "t.yaml").unwrap() {
            inc.apply(&r).unwrap();
        }
    }
    assert_eq!(s.staged().count(), 3);
    let after: Vec<_> = ["n1", "n2"].iter().map(|n| compile(&s, n)).collect();
    assert_eq!(
        before, after,
        "a staged policy changed the compiled ruleset"
    );
    assert_eq!(inc.pending(), 0, "a staged policy dirtied a chain or set");
    assert!(inc.script().text.is_empty());
    assert_eq!(inc.desired(), desired);
    assert_eq!(inc.policy_set().staged().count(), 3);
    // The enforced verdict is untouched: a -> b:80 is allowed, the staged deny says otherwise.
    let f = tcp("10.0.0.1", "10.0.0.2", 80);
    assert!(s.allowed(&f));
    let p = s.pending_direction(&f, Direction::Ingress).unwrap();
    assert_eq!(p.verdict, Verdict::Denied);
    assert_eq!(
        names(&p),
        ["StagedGlobalNetworkPolicy/deny-everything ingress[0]"]
    );
    // Removing them through the incremental state forgets them there.
    inc.remove(Kind::StagedGlobalNetworkPolicy, None, "deny-everything");
    inc.remove(Kind::StagedNetworkPolicy, Some("d"), "deny-d");
    inc.remove(
        Kind::StagedKubernetesNetworkPolicy,
        Some("x"),
        "default-deny",
    );
    assert!(!inc.policy_set().has_staged());
    assert_eq!(inc.pending(), 0);
}

/// A staged Delete of an allow: what it would deny is pending as the remaining default deny;
/// a staged Set replacing the allow with another port moves the allow.
#[test]
fn a_staged_delete_and_a_staged_set_of_an_allow() {
    let mut s = sample();
    let f80 = tcp("10.0.0.1", "10.0.0.2", 80);
    let f81 = tcp("10.0.0.1", "10.0.0.2", 81);
    assert_eq!(
        names(&s.explain(&f80).ingress),
        ["KubernetesNetworkPolicy/d/allow-a ingress[0]"]
    );
    load(
        &mut s,
        "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: allow-a, namespace: d}\nspec:\n  stagedAction: Delete\n",
    );
    assert!(s.allowed(&f80), "a staged Delete is not enforced");
    let p = s.pending_direction(&f80, Direction::Ingress).unwrap();
    assert_eq!(
        (p.verdict, p.reason),
        (Verdict::Denied, Reason::DefaultDeny)
    );
    assert_eq!(names(&p), ["KubernetesNetworkPolicy/d/deny-all"]);
    // The flows service's form of it.
    let fp = s.pending(&f80, Direction::Ingress).unwrap();
    let v = serde_json::to_value(&fp).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"verdict": "denied", "reason": "default-deny", "policies":
            [{"kind": "KubernetesNetworkPolicy", "namespace": "d", "name": "deny-all"}]})
    );
    // Already denied by default, listing both: the cause without allow-a is pending, with
    // the same verdict.
    let p = s.pending_direction(&f81, Direction::Ingress).unwrap();
    assert_eq!(p.verdict, Verdict::Denied);
    assert_eq!(names(&p), ["KubernetesNetworkPolicy/d/deny-all"]);
    // No endpoint's policies change on the egress side: nothing pending.
    assert!(s.pending_direction(&f80, Direction::Egress).is_none());

    // The same name staged as a Set on port 81 instead.
    load(
        &mut s,
        "apiVersion: tern.dev/v1\nkind: StagedKubernetesNetworkPolicy\nmetadata: {name: allow-a, namespace: d}\nspec:\n  podSelector: {matchLabels: {app: b}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: a}}}]\n    ports: [{port: 81}]\n",
    );
    assert_eq!(s.staged().count(), 1, "the Set replaced the Delete");
    let p = s.pending_direction(&f81, Direction::Ingress).unwrap();
    assert_eq!((p.verdict, p.reason), (Verdict::Allowed, Reason::Rule));
    assert_eq!(
        names(&p),
        ["StagedKubernetesNetworkPolicy/d/allow-a ingress[0]"]
    );
    let p = s.pending_direction(&f80, Direction::Ingress).unwrap();
    assert_eq!(p.verdict, Verdict::Denied);
    assert_eq!(
        names(&p),
        // In evaluation order: allow-a sorts before deny-all, staged or not.
        [
            "StagedKubernetesNetworkPolicy/d/allow-a",
            "KubernetesNetworkPolicy/d/deny-all"
        ]
    );
    // A staged Delete of a policy that does not exist changes nothing.
    s.remove_staged(&PolicyKey {
        kind: Kind::StagedKubernetesNetworkPolicy,
        namespace: Some("d".into()),
        name: "allow-a".into(),
    });
    load(
        &mut s,
        "apiVersion: tern.dev/v1\nkind: StagedNetworkPolicy\nmetadata: {name: allow-a, namespace: d}\nspec:\n  stagedAction: Delete\n",
    );
    assert!(s.pending_direction(&f80, Direction::Ingress).is_none());
    assert!(s.pending_direction(&f81, Direction::Ingress).is_none());
    // An outside address has no policy, staged or not.
    assert!(
        s.pending_direction(&tcp("192.0.2.1", "10.0.0.2", 80), Direction::Egress)
            .is_none()
    );
}

/// A staged tern policy orders as the policy it stages and is named by its staged kind.
#[test]
fn a_staged_tern_deny_orders_first() {
    let mut s = sample();
    load(&mut s, STAGED_TERN_DENY_ALL);
    let f = tcp("10.0.0.1", "10.0.0.2", 80);
    assert!(s.allowed(&f));
    let p = s.pending_direction(&f, Direction::Egress).unwrap();
    assert_eq!(
        names(&p),
        ["StagedGlobalNetworkPolicy/deny-everything egress[0]"]
    );
    assert_eq!(p.policies[0].kind, Kind::StagedGlobalNetworkPolicy);
}

/// On every truth-table cell: a staged default-deny of namespace x changes no enforced
/// explanation; a direction at a pod of x is pending `denied` by default naming it alone
/// exactly where no policy selected the pod (the flows it would newly deny), pending the
/// same verdict with it added to the default deny's list where the pod was denied by
/// default, and not pending where a rule decided. Elsewhere nothing is pending.
#[test]
fn a_staged_default_deny_on_the_truth_tables() {
    let staged = tern_model::parse_documents(STAGED_DENY_ALL, "t.yaml").unwrap();
    let mut failures = Vec::new();
    let mut newly_denied = 0usize;
    let cells = netpol_cluster::for_each_cell(|c| {
        let mut s = c.set.clone();
        for r in &staged {
            s.apply(r).unwrap();
        }
        let want = c.set.explain(&c.flow);
        let got = s.explain(&c.flow);
        let mut bad = Vec::new();
        if got != want {
            bad.push("the staged policy changed the enforced explanation".to_string());
        }
        for (dir, e) in [
            (Direction::Egress, &want.egress),
            (Direction::Ingress, &want.ingress),
        ] {
            let pending = s.pending_direction(&c.flow, dir);
            // The form given the enforced explanation (the flow records') says the same.
            if s.pending_direction_given(&c.flow, e) != pending {
                bad.push(format!(
                    "{dir:?}: pending given the enforced explanation differs"
                ));
            }
            let in_x = e.endpoint.as_ref().is_some_and(|r| r.namespace == "x");
            match (in_x, e.reason, pending) {
                (false, _, None) | (true, Reason::Rule, None) => {}
                (true, Reason::NoPolicy, Some(p)) => {
                    newly_denied += 1;
                    if p.verdict != Verdict::Denied
                        || p.reason != Reason::DefaultDeny
                        || names(&p) != ["StagedKubernetesNetworkPolicy/x/default-deny"]
                    {
                        bad.push(format!("{dir:?}: newly denied as {:?}", names(&p)));
                    }
                }
                (true, Reason::DefaultDeny, Some(p)) => {
                    let mut listed = names(e);
                    listed.push("StagedKubernetesNetworkPolicy/x/default-deny".into());
                    let mut got = names(&p);
                    listed.sort();
                    got.sort();
                    if p.verdict != Verdict::Denied || got != listed {
                        bad.push(format!("{dir:?}: still denied as {got:?}"));
                    }
                }
                (_, r, p) => bad.push(format!(
                    "{dir:?}: enforced {r:?} in x={in_x}, pending {:?}",
                    p.map(|p| (p.verdict, names(&p)))
                )),
            }
        }
        if !bad.is_empty() {
            failures.push(format!("{}: {}", c.name(), bad.join("; ")));
        }
    });
    assert!(cells > 10_000, "only {cells} cells compared");
    assert!(newly_denied > 1000, "only {newly_denied} newly denied");
    assert!(
        failures.is_empty(),
        "{} of {cells} cells are wrong:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}

/// On every truth-table cell: every enforced policy staged as `Set` with its own rules is
/// pending nothing but the renaming (same verdict, reason and rule, staged kinds), and staged
/// as `Delete` is pending what no policy at all gives.
#[test]
fn staged_copies_and_deletes_of_every_policy_on_the_truth_tables() {
    let mut failures = Vec::new();
    let cells = netpol_cluster::for_each_cell(|c| {
        let staged_key = |k: &PolicyKey| PolicyKey {
            kind: Kind::StagedKubernetesNetworkPolicy,
            namespace: k.namespace.clone(),
            name: k.name.clone(),
        };
        let mut copies = c.set.clone();
        let mut deletes = c.set.clone();
        for p in c.set.policies() {
            assert_eq!(p.key.kind, Kind::K8sNetworkPolicy);
            let mut ir = p.clone();
            ir.key = staged_key(&p.key);
            copies.keep_staged(ir.key.clone(), StagedPolicy::Set(Box::new(ir)));
            deletes.keep_staged(staged_key(&p.key), StagedPolicy::Delete);
        }
        let mut bad = Vec::new();
        let e = c.set.explain(&c.flow);
        for (dir, e) in [
            (Direction::Egress, &e.egress),
            (Direction::Ingress, &e.ingress),
        ] {
            let renamed: Vec<String> = names(e)
                .iter()
                .map(|n| n.replace("KubernetesNetworkPolicy/", "StagedKubernetesNetworkPolicy/"))
                .collect();
            match copies.pending_direction(&c.flow, dir) {
                None if e.policies.is_empty() => {}
                Some(p)
                    if p.verdict == e.verdict && p.reason == e.reason && names(&p) == renamed => {}
                other => bad.push(format!(
                    "{dir:?} copies: want {:?} {renamed:?}, pending {:?}",
                    e.verdict,
                    other.map(|p| (p.verdict, names(&p)))
                )),
            }
            match deletes.pending_direction(&c.flow, dir) {
                None if e.selecting.is_empty() => {}
                Some(p)
                    if !e.selecting.is_empty()
                        && p.verdict == Verdict::Allowed
                        && p.reason == Reason::NoPolicy
                        && p.policies.is_empty() => {}
                other => bad.push(format!(
                    "{dir:?} deletes: selected by {}, pending {:?}",
                    e.selecting.len(),
                    other.map(|p| (p.verdict, names(&p)))
                )),
            }
        }
        if !bad.is_empty() {
            failures.push(format!("{}: {}", c.name(), bad.join("; ")));
        }
    });
    assert!(cells > 10_000, "only {cells} cells compared");
    assert!(
        failures.is_empty(),
        "{} of {cells} cells are wrong:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}
