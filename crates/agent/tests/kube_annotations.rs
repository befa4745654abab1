//! Calico's IPAM annotations (and tern's `tern.dev/` equivalents) against a real etcd and
//! kube-apiserver (issue 13): pods created with `kubectl` and bound to the node, wired by the
//! real `tern` plugin with `K8S_POD_NAMESPACE/NAME` in CNI_ARGS as containerd passes them.
//!
//! Shown: `cni.projectcalico.org/ipAddrs` gives the pod exactly that address (CNI result and
//! WorkloadEndpoint); a second pod asking for it fails with 103 and leaves no endpoint, no
//! allocation, no veth; once the first is deleted the second gets it. A malformed annotation,
//! an unknown pool, disagreeing Calico/tern spellings and `ipAddrsNoIpam` without
//! `feature_control.ip_addrs_no_ipam` fail with 7 naming the pod and the annotation. A
//! namespace's `ipv4pools` is the default of its pods and a pod's own annotation overrides it;
//! with the feature on, `ipAddrsNoIpam` uses the address without IPAM.
//!
//! Needs root and the binaries of `scripts/k8s-components.sh`; without them the test fails and
//! says how to get them. Every namespace and process is uniquely named / killed by PID and
//! removed by drop guards; the root namespace is never touched.

mod common;

use common::REFERENCE_PLUGINS;
use common::kube::{KubePod, KubeTernd as _};
use ipnet::IpNet;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use tern_testkit::kube_api::{AGENT_RBAC, KubeNode};
use tern_testkit::ternd::Ternd;
use tern_testkit::wait::wait_until;

const NODE: &str = "annot-node";
const NODE_IP: &str = "198.18.0.20";

/// Waits until CNI STATUS succeeds (the watches listed everything).
fn wait_ready(t: &Ternd, plugin: &Path) {
    let mut last = Value::Null;
    let ok = wait_until(Duration::from_secs(30), || {
        let (st, out) = t.cni_status(plugin);
        last = out;
        st == 0
    });
    assert!(ok, "ternd not ready within 30 s: {last}\n{}", t.log());
}

fn pod_json(ns: &str, name: &str, annotations: &[(&str, &str)]) -> String {
    let ann: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": ann},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "pause"}]
        }
    })
    .to_string()
}

/// The address of a successful ADD's result (its first IP).
fn result_ip(out: &Value) -> IpNet {
    out["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in the result: {out}"))
        .parse()
        .unwrap()
}

/// Asserts an ADD failed with `code` and a message containing every one of `words`.
fn assert_refused(st: i32, out: &Value, code: u64, words: &[&str]) {
    assert_ne!(st, 0, "ADD should fail: {out}");
    assert_eq!(out["code"], code, "{out}");
    let msg = out["msg"].as_str().unwrap_or("");
    for w in words {
        assert!(msg.contains(w), "message {msg:?} does not contain {w:?}");
    }
    eprintln!("refused ({code}): {msg}");
}

#[test]
fn calico_ipam_annotations_from_the_api_server() {
    tern_testkit::kube_api::need_k8s();
    tern_testkit::need_binary(&format!("{REFERENCE_PLUGINS}/host-local"));
    let plugin = common::tern_plugin();
    let k = KubeNode::start(NODE_IP);
    let api = &k.api;
    api.apply(AGENT_RBAC);
    api.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE}}}\nspec: {{podCIDR: 10.250.1.0/24, \
         podCIDRs: [10.250.1.0/24]}}\n---\napiVersion: v1\nkind: \
         Namespace\nmetadata: {{name: prod}}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  \
         name: blue\n  annotations:\n    cni.projectcalico.org/ipv4pools: '[\"pool-b\"]'\n"
    ));
    // No controller-manager runs: the pods' service accounts are created here.
    for ns in ["prod", "blue"] {
        api.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {ns}}}\n"
        ));
    }

    // Three pools (ternd creates its default only when no IPv4 pool exists).
    let mut ternd = k.ternd(NODE, &[]);
    {
        let store = ternd.store();
        for (name, cidr) in [
            ("default-ipv4-ippool", "10.244.0.0/16"),
            ("pool-b", "10.245.0.0/16"),
            ("pool-c", "10.246.0.0/16"),
        ] {
            let pool = tern_model::Resource::IpPool(tern_model::IpPool::new(
                name,
                tern_model::IpPoolSpec::new(cidr),
            ));
            tern_model::put_resource(&*store, &pool).unwrap();
        }
    }
    ternd.start();
    wait_ready(&ternd, &plugin);
    let plain = json!({});
    let add = |p: &KubePod, extra: &Value| ternd.cni(&plugin, "ADD", Some(p), extra);

    // ipAddrs: exactly that address, in the CNI result and the WorkloadEndpoint.
    const FIXED: &str = "10.244.7.7";
    api.apply(&pod_json(
        "prod",
        "fixed",
        &[("cni.projectcalico.org/ipAddrs", &format!("[\"{FIXED}\"]"))],
    ));
    let fixed = KubePod::new("prod", "fixed");
    let (st, out) = add(&fixed, &plain);
    assert_eq!(st, 0, "ADD fixed: {out}\n{}", ternd.log());
    assert_eq!(result_ip(&out).to_string(), format!("{FIXED}/32"), "{out}");
    let ep = ternd.endpoint("prod", "fixed").expect("endpoint of fixed");
    assert_eq!(
        ep["spec"]["ipNetworks"],
        json!([format!("{FIXED}/32")]),
        "{ep}"
    );
    assert_eq!(
        ternd.allocations("prod", "fixed"),
        vec![FIXED.parse::<IpAddr>().unwrap()]
    );

    // A second pod asking for the same address: 103, and nothing is left behind.
    api.apply(&pod_json(
        "prod",
        "twin",
        &[("tern.dev/ipAddrs", &format!("[\"{FIXED}\"]"))],
    ));
    let veths_before = k.netns.tern_veths();
    let twin = KubePod::new("prod", "twin");
    let (st, out) = add(&twin, &plain);
    assert_refused(st, &out, 103, &["pod prod/twin", FIXED, "already in use"]);
    assert!(
        ternd.endpoint("prod", "twin").is_none(),
        "twin's endpoint left"
    );
    assert!(
        ternd.allocations("prod", "twin").is_empty(),
        "twin's allocation left"
    );
    assert_eq!(
        k.netns.tern_veths(),
        veths_before,
        "a veth of the failed ADD is left"
    );
    assert!(!twin.has_eth0(), "the failed ADD left eth0 in the sandbox");

    // Once fixed is deleted, twin's retry gets the address.
    let (st, out) = ternd.cni(&plugin, "DEL", Some(&fixed), &plain);
    assert_eq!(st, 0, "DEL fixed: {out}");
    let (st, out) = add(&twin, &plain);
    assert_eq!(st, 0, "ADD twin after fixed's DEL: {out}\n{}", ternd.log());
    assert_eq!(result_ip(&out).to_string(), format!("{FIXED}/32"));

    // Malformed, conflicting and disabled annotations: 7, naming the pod and the annotation.
    for (name, ann, words) in [
        (
            "malformed",
            vec![("cni.projectcalico.org/ipAddrs", "10.244.7.8")],
            vec![
                "pod prod/malformed",
                "cni.projectcalico.org/ipAddrs",
                "not a JSON list",
            ],
        ),
        (
            "spellings",
            vec![
                ("cni.projectcalico.org/ipv4pools", "[\"pool-b\"]"),
                ("tern.dev/ipv4pools", "[\"pool-c\"]"),
            ],
            vec!["pod prod/spellings", "tern.dev/ipv4pools"],
        ),
        (
            "both",
            vec![
                ("cni.projectcalico.org/ipAddrs", "[\"10.245.0.9\"]"),
                ("cni.projectcalico.org/ipv4pools", "[\"pool-b\"]"),
            ],
            vec!["pod prod/both", "cannot be used together"],
        ),
        (
            "unknown-pool",
            vec![("cni.projectcalico.org/ipv4pools", "[\"no-such-pool\"]")],
            vec![
                "pod prod/unknown-pool",
                "cni.projectcalico.org/ipv4pools",
                "\"no-such-pool\" does not exist",
            ],
        ),
        (
            "noipam",
            vec![("cni.projectcalico.org/ipAddrsNoIpam", "[\"192.0.2.44\"]")],
            vec![
                "pod prod/noipam",
                "cni.projectcalico.org/ipAddrsNoIpam",
                "requested feature is not enabled: ip_addrs_no_ipam",
            ],
        ),
    ] {
        api.apply(&pod_json("prod", name, &ann));
        let p = KubePod::new("prod", name);
        let (st, out) = add(&p, &plain);
        assert_refused(st, &out, 7, &words);
        assert!(
            ternd.endpoint("prod", name).is_none(),
            "{name}: endpoint left"
        );
        assert!(!p.has_eth0(), "{name}: eth0 left in the sandbox");
    }
    // fixed's veth may still be in its deferred deletion.
    assert!(
        wait_until(Duration::from_secs(10), || k.netns.tern_veths().len() == 1),
        "only twin's veth should remain: {:?}",
        k.netns.tern_veths()
    );

    // With the feature on, ipAddrsNoIpam uses the address without IPAM.
    let noipam = KubePod::new("prod", "noipam");
    let (st, out) = add(
        &noipam,
        &json!({"feature_control": {"ip_addrs_no_ipam": true}}),
    );
    assert_eq!(
        st,
        0,
        "ADD noipam with the feature on: {out}\n{}",
        ternd.log()
    );
    assert_eq!(result_ip(&out).to_string(), "192.0.2.44/32");
    assert!(ternd.allocations("prod", "noipam").is_empty());
    let (st, out) = ternd.cni(&plugin, "DEL", Some(&noipam), &plain);
    assert_eq!(st, 0, "DEL noipam: {out}");

    // The namespace's ipv4pools is its pods' default; a pod's own annotation overrides it.
    let in_pool = |out: &Value, cidr: &str| {
        let net: IpNet = cidr.parse().unwrap();
        assert!(
            net.contains(&result_ip(out).addr()),
            "{} not in {cidr}: {out}",
            result_ip(out)
        );
    };
    api.apply(&pod_json("blue", "default-pool", &[]));
    let p1 = KubePod::new("blue", "default-pool");
    let (st, out) = add(&p1, &plain);
    assert_eq!(st, 0, "ADD blue/default-pool: {out}\n{}", ternd.log());
    in_pool(&out, "10.245.0.0/16");
    api.apply(&pod_json(
        "blue",
        "own-pool",
        &[("tern.dev/ipv4pools", "[\"10.246.0.0/16\"]")],
    ));
    let p2 = KubePod::new("blue", "own-pool");
    let (st, out) = add(&p2, &plain);
    assert_eq!(st, 0, "ADD blue/own-pool: {out}\n{}", ternd.log());
    in_pool(&out, "10.246.0.0/16");
    // A namespace annotation changed later applies to the next pod.
    api.must(&[
        "annotate",
        "namespace",
        "blue",
        "--overwrite",
        "cni.projectcalico.org/ipv4pools=[\"pool-c\"]",
    ]);
    api.apply(&pod_json("blue", "after-change", &[]));
    let p3 = KubePod::new("blue", "after-change");
    let ok = wait_until(Duration::from_secs(10), || {
        let (st, out) = add(&p3, &plain);
        if st != 0 {
            panic!("ADD blue/after-change: {out}\n{}", ternd.log());
        }
        let got = result_ip(&out).addr();
        if "10.246.0.0/16".parse::<IpNet>().unwrap().contains(&got) {
            return true;
        }
        // The watch had not delivered the change yet: undo and retry.
        let _ = ternd.cni(&plugin, "DEL", Some(&p3), &plain);
        false
    });
    assert!(ok, "the namespace's new ipv4pools was not applied");

    // The node watch: this node's podCIDRs reach tern's Node resource; another node's
    // podCIDRs, addresses and deletion reach ternd.
    let own = wait_until(Duration::from_secs(10), || {
        tern_model::get_resource(&*ternd.store(), tern_model::Kind::Node, None, NODE)
            .ok()
            .flatten()
            .and_then(|r| serde_json::to_value(&r).ok())
            .is_some_and(|v| v["spec"]["podCIDRs"] == json!(["10.250.1.0/24"]))
    });
    assert!(
        own,
        "spec.podCIDRs of tern's Node {NODE} not written\n{}",
        ternd.log()
    );

    // usePodCidr: a delegated host-local on this node's podCIDR, as Calico's plugin does it.
    let hl_conf = json!({"ipam": {
        "type": "host-local",
        "subnet": "usePodCidr",
        "dataDir": k.tmp.path().join("host-local"),
    }});
    api.apply(&pod_json("prod", "hl", &[]));
    let hl = KubePod::new("prod", "hl");
    let (st, out) = add(&hl, &hl_conf);
    assert_eq!(st, 0, "ADD with usePodCidr: {out}\n{}", ternd.log());
    let got = result_ip(&out).addr();
    assert!(
        "10.250.1.0/24".parse::<IpNet>().unwrap().contains(&got),
        "{got} is not in the node's podCIDR: {out}"
    );
    assert!(
        ternd.allocations("prod", "hl").is_empty(),
        "tern IPAM was used"
    );
    let (st, out) = ternd.cni(&plugin, "DEL", Some(&hl), &hl_conf);
    assert_eq!(st, 0, "DEL with usePodCidr: {out}");
    api.apply(
        "apiVersion: v1\nkind: Node\nmetadata: {name: other-node}\nspec:\n  podCIDR: \
         10.244.2.0/24\n  podCIDRs: [10.244.2.0/24]\n",
    );
    let logged = |s: &str| wait_until(Duration::from_secs(10), || ternd.log().contains(s));
    assert!(
        logged("node other-node added (addresses [], podCIDRs [10.244.2.0/24])"),
        "node addition not seen\n{}",
        ternd.log()
    );
    api.must(&[
        "patch",
        "node",
        "other-node",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"addresses":[{"type":"InternalIP","address":"198.18.0.21"}]}}"#,
    ]);
    assert!(
        logged("node other-node now has addresses [198.18.0.21], podCIDRs [10.244.2.0/24]"),
        "node address not seen\n{}",
        ternd.log()
    );
    api.must(&["delete", "node", "other-node"]);
    assert!(logged("node other-node deleted"), "node deletion not seen");
}
