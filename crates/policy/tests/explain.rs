//! `PolicySet::explain` on the upstream Kubernetes NetworkPolicy truth tables: on every case,
//! step, protocol and port its verdict is the table's, and its cause holds up. An allow by a
//! rule names a policy that selects the endpoint whose named rule alone allows the flow while
//! everything evaluated before it does not; a default deny lists exactly the policies that
//! select the endpoint in that direction; no policy only when none does.

use tern_policy::{
    Direction, DirectionExplanation, Endpoint, Flow, IrPolicy, PolicyKey, PolicySet, Reason,
    Verdict,
};

mod netpol_cluster;

fn key(p: &tern_policy::PolicyRef) -> PolicyKey {
    PolicyKey {
        kind: p.kind,
        namespace: p.namespace.clone(),
        name: p.name.clone(),
    }
}

/// The policies selecting `ep` in `dir`, in evaluation order, found without `policies_for`.
fn selecting(set: &PolicySet, ep: &Endpoint, dir: Direction) -> Vec<PolicyKey> {
    let mut v: Vec<&IrPolicy> = set
        .policies()
        .filter(|p| p.rules(dir).is_some() && set.selects(&p.applies_to, ep))
        .collect();
    v.sort_by(|a, b| a.order.total_cmp(&b.order).then(a.key.cmp(&b.key)));
    v.into_iter().map(|p| p.key.clone()).collect()
}

/// `set` with only `pols` (as given), for checking what some rules alone decide.
fn only(set: &PolicySet, pols: Vec<IrPolicy>) -> PolicySet {
    let mut s = set.clone();
    let keys: Vec<PolicyKey> = s.policies().map(|p| p.key.clone()).collect();
    for k in &keys {
        s.remove_policy(k);
    }
    for p in pols {
        s.keep_policy(p);
    }
    s
}

/// `p` with only the rules of `dir` that `keep` takes (by the index of the rule as written).
fn with_rules(p: &IrPolicy, dir: Direction, keep: impl Fn(usize) -> bool) -> IrPolicy {
    let mut p = p.clone();
    let rules = match dir {
        Direction::Ingress => p.ingress.as_mut(),
        Direction::Egress => p.egress.as_mut(),
    };
    rules.unwrap().retain(|r| keep(r.index));
    p
}

/// Problems with one direction's explanation of `flow`.
fn check_direction(set: &PolicySet, flow: &Flow, e: &DirectionExplanation) -> Vec<String> {
    let dir = e.direction;
    let ep = match &e.endpoint {
        Some(r) => set
            .endpoint(&r.namespace, &r.name)
            .expect("explained endpoint exists"),
        None => {
            return (e.reason != Reason::NoPolicy || !e.policies.is_empty())
                .then(|| format!("{dir:?}: no endpoint but {:?}", e.reason))
                .into_iter()
                .collect();
        }
    };
    let mut bad = Vec::new();
    let want_sel = selecting(set, ep, dir);
    let got_sel: Vec<PolicyKey> = e.selecting.iter().map(key).collect();
    if got_sel != want_sel {
        bad.push(format!("{dir:?}: selecting {got_sel:?}, want {want_sel:?}"));
    }
    match e.reason {
        Reason::NoPolicy => {
            if !want_sel.is_empty() || e.verdict != Verdict::Allowed {
                bad.push(format!("{dir:?}: no-policy but {want_sel:?} select it"));
            }
        }
        Reason::DefaultDeny => {
            let listed: Vec<PolicyKey> = e.policies.iter().map(key).collect();
            if listed != want_sel || want_sel.is_empty() || e.verdict != Verdict::Denied {
                bad.push(format!(
                    "{dir:?}: default-deny lists {listed:?}, want {want_sel:?}"
                ));
            }
            if e.policies.iter().any(|p| p.rule.is_some()) {
                bad.push(format!("{dir:?}: default-deny names a rule"));
            }
        }
        Reason::Rule => {
            let [p] = &e.policies[..] else {
                bad.push(format!(
                    "{dir:?}: rule reason with {} policies",
                    e.policies.len()
                ));
                return bad;
            };
            let k = key(p);
            let Some(pos) = want_sel.iter().position(|s| *s == k) else {
                bad.push(format!(
                    "{dir:?}: deciding {k} does not select the endpoint"
                ));
                return bad;
            };
            let rule = p.rule.expect("a rule reason names its rule");
            if rule.direction != dir {
                bad.push(format!("{dir:?}: rule {rule} of the other direction"));
            }
            let ir = set.policy(&k).unwrap();
            // The named rule alone decides the flow the same way.
            let alone = only(set, vec![with_rules(ir, dir, |i| i == rule.index)]);
            let a = alone.explain_direction(ep, dir, flow);
            if a.reason != Reason::Rule || a.policies[0].rule != Some(rule) {
                bad.push(format!("{dir:?}: {k} {rule} alone gives {:?}", a.reason));
            }
            // Everything evaluated before it matches nothing.
            let mut before: Vec<IrPolicy> = want_sel[..pos]
                .iter()
                .map(|k| set.policy(k).unwrap().clone())
                .collect();
            before.push(with_rules(ir, dir, |i| i < rule.index));
            let b = only(set, before).explain_direction(ep, dir, flow);
            if b.reason != Reason::DefaultDeny {
                bad.push(format!(
                    "{dir:?}: before {k} {rule} the result is {:?}, not default-deny",
                    b.reason
                ));
            }
        }
    }
    bad
}

#[test]
fn explain_matches_upstream_truth_tables_and_names_its_cause() {
    let mut failures = Vec::new();
    let (mut by_rule, mut by_default) = (0usize, 0usize);
    let cells = netpol_cluster::for_each_cell(|c| {
        let e = c.set.explain(&c.flow);
        let mut bad = Vec::new();
        if e.verdict.is_allowed() != c.want {
            bad.push(format!("verdict {:?}, want allowed={}", e.verdict, c.want));
        }
        let both = e.egress.verdict.is_allowed() && e.ingress.verdict.is_allowed();
        if e.verdict.is_allowed() != both {
            bad.push("overall verdict is not both directions'".to_string());
        }
        for d in [&e.egress, &e.ingress] {
            by_rule += usize::from(d.reason == Reason::Rule);
            by_default += usize::from(d.reason == Reason::DefaultDeny);
            bad.extend(check_direction(c.set, &c.flow, d));
        }
        if !bad.is_empty() {
            failures.push(format!("{}: {}", c.name(), bad.join("; ")));
        }
    });
    assert!(cells > 10_000, "only {cells} cells compared");
    // Both causes are exercised, many times over.
    assert!(
        by_rule > 1000 && by_default > 1000,
        "{by_rule} by rule, {by_default} by default"
    );
    assert!(
        failures.is_empty(),
        "{} of {cells} cells are wrong:\n{}",
        failures.len(),
        failures[..failures.len().min(30)].join("\n")
    );
}
