//! Property fuzzing of everything the plugin parses from the runtime: the network configuration
//! (random bytes, random JSON, and valid configurations mutated at random paths), conflists, the
//! environment (`CNI_*` variables, `CNI_ARGS`) and results (`prevResult`). Nothing may panic;
//! every error carries a spec code (1-7) and a message.
//!
//! Case counts are bounded for CI; `TERN_FUZZ_CASES=N` runs N cases per property instead (e.g.
//! a long campaign before a release). A crash found becomes a named test in this file (none so
//! far: 500,000 cases, 100,000 per property, found nothing).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};
use tern_cni::{CniArgs, CniError, CniResult, ConfList, Environment, NetConf, Version};

fn cases(default: u32) -> u32 {
    std::env::var("TERN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(default: u32) -> TestRunner {
    TestRunner::new(Config {
        cases: cases(default),
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    })
}

/// A spec error: a known code and something to say.
fn check_error(e: &CniError, what: &str) {
    assert!(
        (1..=7).contains(&e.code),
        "{what}: code {} is not a spec input error: {}",
        e.code,
        e.msg
    );
    assert!(!e.msg.is_empty(), "{what}: error without a message");
}

const KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "ipam",
    "dns",
    "prevResult",
    "runtimeConfig",
    "args",
    "cni",
    "labels",
    "ips",
    "ports",
    "mac",
    "mtu",
    "plugins",
    "nameservers",
    "interfaces",
    "routes",
    "dst",
    "gw",
    "address",
    "gateway",
    "interface",
    "version",
    "capabilities",
    "disableCheck",
    "disableGC",
    "containerPort",
    "protocol",
    "key",
    "value",
    "portMappings",
    "ip4",
    "ip6",
    "ip",
    "sandbox",
    "cni.dev/valid-attachments",
    "validAttachments",
    "containerID",
    "ifname",
];

const STRINGS: &[&str] = &[
    "",
    "1.1.0",
    "1.0.0",
    "0.4.0",
    "0.3.1",
    "0.3.0",
    "0.2.0",
    "0.1.0",
    "9.9.9",
    "1.1",
    "tern",
    "tern-ipam",
    "host-local",
    "k8s-pod-network",
    "10.244.0.5",
    "10.244.0.5/32",
    "10.0.0.1/33",
    "fd00::1/128",
    "::",
    "0.0.0.0/0",
    "ee:ee:ee:ee:ee:ee",
    "zz:zz",
    "TCP",
    "udp",
    "SCTP",
    "http",
    "-bad-",
    "4",
    "6",
    "../../etc/passwd",
    "\u{0}",
    "\u{feff}",
    "é",
    "a=b;c=d",
];

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(STRINGS).prop_map(str::to_string),
        1 => "\\PC{0,24}",
        1 => "[a-z0-9.:/=;-]{0,40}",
    ]
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-zA-Z_.]{0,12}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        prop_oneof![Just(-1i64), Just(0), Just(1), Just(65535), Just(65536)].prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((arb_key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid configuration using most of what tern reads.
fn valid_conf() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "tern",
        "mtu": 1450,
        "ipam": {"type": "tern-ipam", "assign_ipv4": "true", "ipv4_pools": ["10.244.0.0/16"]},
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]},
        "runtimeConfig": {"ips": ["10.244.0.7"], "mac": "02:00:00:00:00:01",
                          "portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}]},
        "args": {"cni": {"labels": [{"key": "app", "value": "web"}],
                         "ips": ["10.244.0.8"],
                         "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}},
        "prevResult": {"cniVersion": "1.0.0",
                       "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/x"}],
                       "ips": [{"address": "10.244.0.5/32", "gateway": "169.254.1.1", "interface": 0}],
                       "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                       "dns": {"nameservers": ["10.96.0.10"]}},
        "cni.dev/valid-attachments": [{"containerID": "abc", "ifname": "eth0"}]
    })
}

/// Every path (as key/index steps) of a JSON value.
fn paths(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(here.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                here.push(Step::Key(k.clone()));
                paths(c, here, out);
                here.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                here.push(Step::Index(i));
                paths(c, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn at<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Insert(usize, String, Value),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), arb_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => (any::<usize>(), arb_key(), arb_json()).prop_map(|(i, k, v)| Mutation::Insert(i, k, v)),
    ]
}

fn mutate(base: &Value, muts: &[Mutation]) -> Value {
    let mut v = base.clone();
    for m in muts {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let pick = |i: usize| all[i % all.len()].clone();
        match m {
            Mutation::Replace(i, new) => *at(&mut v, &pick(*i)) = new.clone(),
            Mutation::Remove(i) => {
                let p = pick(*i);
                if let Some((last, parent)) = p.split_last() {
                    match (at(&mut v, parent), last) {
                        (Value::Object(o), Step::Key(k)) => {
                            o.remove(k);
                        }
                        (Value::Array(a), Step::Index(i)) if *i < a.len() => {
                            a.remove(*i);
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Insert(i, k, new) => {
                if let Value::Object(o) = at(&mut v, &pick(*i)) {
                    o.insert(k.clone(), new.clone());
                }
            }
        }
    }
    v
}

/// The plugin's whole configuration path on `bytes`.
fn parse_everything(bytes: &[u8]) {
    match NetConf::parse(bytes) {
        Ok(conf) => {
            // What parsed must serialize and parse again (the plugin hands it to delegates).
            let again = NetConf::parse(&conf.to_bytes());
            assert!(again.is_ok(), "re-parse failed: {:?}", again.err());
            let _ = tern_cni::conf::valid_attachments(&conf);
            if let Some(p) = &conf.prev_result {
                match CniResult::from_json(p) {
                    Ok(r) => render_all(&r),
                    Err(e) => check_error(&e, "prevResult"),
                }
            }
            let _ = conf.extra_as::<Value>();
        }
        Err(e) => check_error(&e, "netconf"),
    }
    match NetConf::parse_with::<Value>(bytes) {
        Ok(_) => {}
        Err(e) => check_error(&e, "netconf with extra"),
    }
    let _ = tern_cni::version_output_for_stdin(bytes);
}

fn render_all(r: &CniResult) {
    for v in tern_cni::SUPPORTED_VERSIONS {
        let v = Version::parse(v).expect("supported version parses");
        let j = r.to_json(v);
        // A rendered result decodes again (a runtime hands it back as prevResult).
        if let Err(e) = CniResult::from_json(&j) {
            panic!("{} rendering does not decode: {e:?}: {j}", v.as_str());
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut r = runner(3000);
    r.run(&proptest::collection::vec(any::<u8>(), 0..512), |b| {
        parse_everything(&b);
        Ok(())
    })
    .unwrap();
}

#[test]
fn random_json_never_panics() {
    let mut r = runner(3000);
    r.run(&arb_json(), |v| {
        parse_everything(v.to_string().as_bytes());
        match CniResult::from_json(&v) {
            Ok(res) => render_all(&res),
            Err(e) => check_error(&e, "result"),
        }
        if let Err(e) = ConfList::parse(v.to_string().as_bytes()) {
            check_error(&e, "conflist");
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn mutated_valid_configurations_never_panic() {
    let base = valid_conf();
    assert!(
        NetConf::parse(base.to_string().as_bytes()).is_ok(),
        "the seed must be valid"
    );
    let mut r = runner(4000);
    r.run(&proptest::collection::vec(arb_mutation(), 1..5), |muts| {
        let v = mutate(&base, &muts);
        parse_everything(v.to_string().as_bytes());
        // The same configuration as a conflist's single plugin.
        let mut list = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [v]});
        if let Ok(l) = ConfList::parse(list.to_string().as_bytes()) {
            let _ = l.plugin_conf(0);
            let _ = l.effective_version();
        }
        list["plugins"] = json!([]);
        if let Err(e) = ConfList::parse(list.to_string().as_bytes()) {
            check_error(&e, "empty conflist");
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn mutated_bytes_of_a_valid_configuration_never_panic() {
    let base = valid_conf().to_string().into_bytes();
    let mut r = runner(3000);
    let edits = proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 1..8);
    r.run(&edits, |edits| {
        let mut b = base.clone();
        tern_testkit::apply_byte_edits(&mut b, &edits);
        parse_everything(&b);
        Ok(())
    })
    .unwrap();
}

const VARS: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn arb_env_value() -> impl Strategy<Value = Option<String>> {
    let cmd =
        proptest::sample::select(&["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "add"][..])
            .prop_map(str::to_string);
    let args = proptest::collection::vec(
        (
            proptest::sample::select(
                &[
                    "IgnoreUnknown",
                    "K8S_POD_NAMESPACE",
                    "K8S_POD_NAME",
                    "K8S_POD_INFRA_CONTAINER_ID",
                    "K8S_POD_UID",
                    "IP",
                    "X",
                ][..],
            ),
            arb_string(),
        ),
        0..6,
    )
    .prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    });
    prop_oneof![
        1 => Just(None),
        2 => cmd.prop_map(Some),
        2 => args.prop_map(Some),
        3 => arb_string().prop_map(Some),
        1 => "[a-zA-Z0-9_.-]{1,300}".prop_map(Some),
    ]
}

#[test]
fn random_environments_never_panic() {
    let mut r = runner(4000);
    let env = proptest::collection::vec(arb_env_value(), VARS.len());
    r.run(&env, |vals| {
        let get = |k: &str| {
            VARS.iter()
                .position(|v| *v == k)
                .and_then(|i| vals[i].clone())
        };
        match Environment::from_vars(get) {
            Ok(e) => {
                let _ = e.to_vars(e.command);
            }
            Err(e) => check_error(&e, "environment"),
        }
        if let Some(a) = &vals[4] {
            if let Err(e) = CniArgs::parse(a) {
                check_error(&e, "CNI_ARGS");
            }
            let _ = CniArgs::parse_lenient(a);
        }
        Ok(())
    })
    .unwrap();
}
