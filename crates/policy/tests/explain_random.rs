//! `PolicySet::explain` against an independent, straightforward evaluator on random policies.
//!
//! A seeded generator makes namespaces and pods with random labels and named ports, and
//! random Kubernetes NetworkPolicies (pod and namespace selectors, ipBlocks with excepts,
//! numbered, ranged and named ports) and tern NetworkPolicies and GlobalNetworkPolicies
//! (orders with ties, Allow/Deny/Pass/Log, protocols, selectors, nets and notNets). The
//! generator's own values are evaluated here by the semantics `tern_policy::model` documents,
//! written afresh and reading nothing of the crate but `tern_model::Kind`'s order for ties; the same
//! values, rendered as documents, go through `PolicySet::apply`. Every flow between pods and
//! outside addresses, on several protocols and ports, must get the same verdict per direction,
//! and an allow or deny by a rule must name the policy and rule the evaluator found first.
//!
//! The generator and the evaluator live in `randpol` (`tests/randpol/mod.rs`), which the lab
//! test `crates/ctl/tests/lab_random_policy.rs` shares.

mod randpol;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use randpol::{Found, OUTSIDE, World, policy_json, random_world};
use tern_model::Protocol;
use tern_policy::{Flow, PolicySet, Reason};
use tern_testkit::rng::Rng;

fn policy_set(w: &World) -> PolicySet {
    let mut set = PolicySet::new();
    for (ns, l) in &w.ns_labels {
        set.upsert_namespace(ns, l.clone());
    }
    for p in &w.pods {
        set.upsert_endpoint(tern_policy::Endpoint {
            namespace: p.ns.into(),
            name: p.name.clone(),
            node: "n1".into(),
            interface: format!("v{}", p.name),
            labels: p.labels.clone().into(),
            ips: vec![IpAddr::V4(p.ip)],
            ports: p
                .ports
                .iter()
                .map(|(name, protocol, port)| tern_model::EndpointPort {
                    name: name.to_string(),
                    protocol: *protocol,
                    port: *port,
                })
                .collect(),
        });
    }
    for p in &w.pols {
        let text = serde_json::to_string(&policy_json(p)).unwrap();
        for d in tern_model::parse_documents(&text, "random.json")
            .unwrap_or_else(|e| panic!("{e}: {text}"))
        {
            d.validate().unwrap_or_else(|e| panic!("{e}: {text}"));
            set.apply(&d).unwrap_or_else(|e| panic!("{e}: {text}"));
        }
    }
    set
}

#[test]
fn explain_agrees_with_an_independent_evaluator_on_random_policies() {
    let mut r = Rng(0x7e27_2026_0021_0001);
    let (mut flows, mut causes) = (0usize, BTreeMap::<String, usize>::new());
    for world in 0..300 {
        let w = random_world(&mut r);
        let set = policy_set(&w);
        let addrs: Vec<Ipv4Addr> = w
            .pods
            .iter()
            .map(|p| p.ip)
            .chain(OUTSIDE.iter().map(|a| a.parse().unwrap()))
            .collect();
        for &src in &addrs {
            for &dst in &addrs {
                if src == dst
                    || OUTSIDE.contains(&src.to_string().as_str())
                        && OUTSIDE.contains(&dst.to_string().as_str())
                {
                    continue;
                }
                for (protocol, dst_port) in [
                    (Protocol::Tcp, 80),
                    (Protocol::Tcp, 443),
                    (Protocol::Tcp, 8080),
                    (Protocol::Udp, 53),
                    (Protocol::Udp, 80),
                    (Protocol::Sctp, 80),
                ] {
                    let f = Flow {
                        src: src.into(),
                        dst: dst.into(),
                        protocol,
                        dst_port,
                        icmp: None,
                    };
                    flows += 1;
                    let e = set.explain(&f);
                    let mut all = true;
                    for d in [&e.egress, &e.ingress] {
                        let want = w.decide(&f, d.direction);
                        let got = match d.reason {
                            Reason::NoPolicy => Found::NoPolicy,
                            Reason::DefaultDeny => Found::DefaultDeny,
                            Reason::Rule => Found::Rule(
                                d.policies[0].name.clone(),
                                d.policies[0].rule.unwrap().index,
                                d.verdict.is_allowed(),
                            ),
                        };
                        *causes.entry(format!("{:?}", d.reason)).or_default() += 1;
                        let want_allowed =
                            !matches!(want, Found::DefaultDeny | Found::Rule(_, _, false));
                        all &= want_allowed;
                        assert_eq!(
                            got,
                            want,
                            "world {world}, {:?} {f:?}\npolicies:\n{}",
                            d.direction,
                            w.pols
                                .iter()
                                .map(|p| policy_json(p).to_string())
                                .collect::<Vec<_>>()
                                .join("\n")
                        );
                    }
                    assert_eq!(e.verdict.is_allowed(), all);
                    assert_eq!(set.allowed(&f), all);
                }
            }
        }
    }
    assert!(flows > 50_000, "{flows} flows");
    // Every cause occurs often enough to have been tested.
    for reason in ["Rule", "DefaultDeny", "NoPolicy"] {
        assert!(causes.get(reason).is_some_and(|n| *n > 1000), "{causes:?}");
    }
}
