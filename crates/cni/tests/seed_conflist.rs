//! The Calico conflist from the seed document parses, and each plugin's
//! execution configuration exposes its plugin-specific keys.

use serde_json::json;
use tern_cni::{ConfList, Version, code};

const SEED: &[u8] = include_bytes!("fixtures/calico-seed.conflist");

#[test]
fn seed_conflist_parses() {
    let list = ConfList::parse(SEED).unwrap();
    assert_eq!(list.name, "k8s-pod-network");
    assert_eq!(list.effective_version().unwrap(), Version::V0_3_1);
    assert_eq!(list.plugin_types(), vec!["calico", "bandwidth", "portmap"]);
    assert!(!list.disable_check && !list.disable_gc);
}

#[test]
fn calico_entry_exposes_its_keys_via_extra() {
    let list = ConfList::parse(SEED).unwrap();
    let calico = list.plugin_conf(0).unwrap();
    assert_eq!(calico.cni_version, Version::V0_3_1);
    assert_eq!(calico.name, "k8s-pod-network");
    assert_eq!(calico.plugin_type, "calico");
    assert_eq!(calico.extra["mtu"], 0);
    assert_eq!(calico.extra["datastore_type"], "kubernetes");
    assert_eq!(calico.extra["log_file_max_age"], 30);
    assert_eq!(calico.extra["policy"], json!({"type": "k8s"}));
    assert_eq!(
        calico.extra["container_settings"]["allow_ip_forwarding"],
        false
    );
    assert_eq!(calico.extra["nodename_file_optional"], false);
    let ipam = calico.ipam.as_ref().unwrap();
    assert_eq!(ipam.plugin_type, "calico-ipam");
    assert_eq!(ipam.extra["assign_ipv4"], "true");
    assert_eq!(ipam.extra["assign_ipv6"], "false");
}

#[test]
fn chained_entries_get_runtime_config_from_capabilities() {
    let list = ConfList::parse(SEED).unwrap();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "portMappings".into(),
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    caps.insert(
        "bandwidth".into(),
        json!({"ingressRate": 1000000, "ingressBurst": 1000000}),
    );
    let exec = list.exec_config(2, None, &caps).unwrap();
    let portmap = tern_cni::NetConf::parse(exec.to_string().as_bytes()).unwrap();
    assert_eq!(portmap.extra["snat"], true);
    assert!(!portmap.extra.contains_key("capabilities"));
    let rc = portmap.runtime_config.unwrap();
    assert_eq!(rc.port_mappings.unwrap()[0]["hostPort"], 8080);
    assert!(rc.bandwidth.is_none());
    let bandwidth = list.plugin_conf(1).unwrap();
    assert!(bandwidth.runtime_config.is_none());
}

#[test]
fn seed_entry_with_wrong_mtu_type_names_the_field() {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct CalicoConf {
        mtu: u32,
    }
    let text = String::from_utf8(SEED.to_vec())
        .unwrap()
        .replace("\"mtu\": 0", "\"mtu\": \"x\"");
    let list = ConfList::parse(text.as_bytes()).unwrap();
    let exec = list.exec_config(0, None, &serde_json::Map::new()).unwrap();
    let err = tern_cni::NetConf::parse_with::<CalicoConf>(exec.to_string().as_bytes())
        .err()
        .unwrap();
    assert_eq!(err.code, code::INVALID_CONFIG);
    assert_eq!(
        err.msg,
        "invalid network config: field `mtu`: invalid type: string \"x\", expected u32"
    );
}
