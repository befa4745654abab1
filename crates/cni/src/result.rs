//! The ADD result: one version-independent model, rendered in and parsed from
//! the JSON shape of every specification version.

use crate::code;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::error::CniError;
use crate::version::Version;

/// DNS settings (`dns` in configurations and results). Empty fields are omitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name server addresses, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().unwrap_or("").is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// An interface created or configured by a plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address, e.g. `"ee:ee:ee:ee:ee:ee"`.
    pub mac: Option<String>,
    /// MTU (rendered from 1.1.0 on).
    pub mtu: Option<u32>,
    /// The netns path for container-side interfaces; `None` for host-side ones.
    pub sandbox: Option<String>,
    /// vhost-user socket path (rendered from 1.1.0 on).
    pub socket_path: Option<String>,
    /// PCI ID of a device (rendered from 1.1.0 on).
    pub pci_id: Option<String>,
}

/// An address assigned to an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with prefix length, e.g. `10.0.0.5/32`.
    pub address: IpNet,
    /// Default gateway for this address, if any.
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`] of the interface holding the address.
    pub interface: Option<usize>,
}

impl IpConfig {
    /// An address with no gateway and no interface index.
    pub fn new(address: IpNet) -> Self {
        IpConfig {
            address,
            gateway: None,
            interface: None,
        }
    }
}

/// A route. Fields other than `dst` and `gw` are rendered from 1.1.0 on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination network.
    pub dst: IpNet,
    /// Next hop; `None` for the interface's default gateway or a link route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// Route MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Advertised TCP MSS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    /// Route priority (metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Routing table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Scope (0 universe, 253 link, 254 host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

impl Route {
    /// A route to `dst` with no other attribute.
    pub fn new(dst: IpNet) -> Self {
        Route {
            dst,
            gw: None,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }

    /// The same route with a next hop.
    pub fn via(mut self, gw: IpAddr) -> Self {
        self.gw = Some(gw);
        self
    }
}

/// The result of an ADD, independent of the version it is printed in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// Interfaces; `ips[].interface` indexes into this list.
    pub interfaces: Vec<Interface>,
    /// Assigned addresses.
    pub ips: Vec<IpConfig>,
    /// Routes.
    pub routes: Vec<Route>,
    /// DNS settings.
    pub dns: Dns,
}

fn some_nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

impl CniResult {
    /// Renders the result in the exact JSON shape of `version`:
    /// - 0.1.0/0.2.0: `ip4`/`ip6` objects `{ip, gateway, routes}` holding the
    ///   first address of each family and the routes of that family (as Go's
    ///   converter does; a family with no address drops its routes);
    /// - 0.3.0/0.3.1/0.4.0: `ips[]` with `version` "4"/"6"; interfaces
    ///   `{name, mac, sandbox}`; routes `{dst, gw}`;
    /// - 1.0.0: as 0.4.0 without `ips[].version`;
    /// - 1.1.0: adds interface `mtu`, `socketPath`, `pciID` and route `mtu`,
    ///   `advmss`, `priority`, `table`, `scope`.
    ///
    /// Empty lists and unset fields are omitted; `dns` is always present,
    /// possibly `{}`, because Go's encoder never omits a struct.
    pub fn to_json(&self, version: Version) -> Value {
        let mut out = Map::new();
        out.insert("cniVersion".into(), version.as_str().into());
        if version.is_legacy() {
            for (key, v4) in [("ip4", true), ("ip6", false)] {
                if let Some(ip) = self.ips.iter().find(|ip| ip.address.addr().is_ipv4() == v4) {
                    let mut obj = Map::new();
                    obj.insert("ip".into(), ip.address.to_string().into());
                    if let Some(gw) = ip.gateway {
                        obj.insert("gateway".into(), gw.to_string().into());
                    }
                    let routes: Vec<Value> = self
                        .routes
                        .iter()
                        .filter(|r| r.dst.addr().is_ipv4() == v4)
                        .map(|r| route_json(r, false))
                        .collect();
                    if !routes.is_empty() {
                        obj.insert("routes".into(), routes.into());
                    }
                    out.insert(key.into(), obj.into());
                }
            }
        } else {
            let extras = version.has_result_extras();
            if !self.interfaces.is_empty() {
                let list: Vec<Value> = self
                    .interfaces
                    .iter()
                    .map(|i| interface_json(i, extras))
                    .collect();
                out.insert("interfaces".into(), list.into());
            }
            if !self.ips.is_empty() {
                let list: Vec<Value> = self
                    .ips
                    .iter()
                    .map(|ip| {
                        let mut obj = Map::new();
                        if version.has_ip_version_field() {
                            let family = if ip.address.addr().is_ipv4() {
                                "4"
                            } else {
                                "6"
                            };
                            obj.insert("version".into(), family.into());
                        }
                        obj.insert("address".into(), ip.address.to_string().into());
                        if let Some(gw) = ip.gateway {
                            obj.insert("gateway".into(), gw.to_string().into());
                        }
                        if let Some(idx) = ip.interface {
                            obj.insert("interface".into(), idx.into());
                        }
                        Value::Object(obj)
                    })
                    .collect();
                out.insert("ips".into(), list.into());
            }
            if !self.routes.is_empty() {
                let list: Vec<Value> = self.routes.iter().map(|r| route_json(r, extras)).collect();
                out.insert("routes".into(), list.into());
            }
        }
        out.insert(
            "dns".into(),
            serde_json::to_value(&self.dns).unwrap_or_else(|_| json!({})),
        );
        Value::Object(out)
    }

    /// Parses a result of any version (a `prevResult`, or a delegated IPAM
    /// plugin's output). Legacy `ip4`/`ip6` objects become entries of `ips`
    /// (IPv4 first) and their routes are appended to `routes`;
    /// `ips[].version` is ignored because the address says the family.
    /// Malformed input is code 6 naming the field.
    pub fn from_json(value: &Value) -> Result<CniResult, CniError> {
        let wire: WireResult = crate::error::from_value_with_path(value.clone(), "CNI result")
            .map_err(|e| CniError {
                code: code::DECODE,
                ..e
            })?;
        let mut result = CniResult {
            dns: wire.dns.unwrap_or_default(),
            ..CniResult::default()
        };
        for i in wire.interfaces.unwrap_or_default() {
            result.interfaces.push(Interface {
                name: i.name,
                mac: i.mac.filter(|s| !s.is_empty()),
                mtu: i.mtu.filter(|m| *m != 0),
                sandbox: i.sandbox.filter(|s| !s.is_empty()),
                socket_path: i.socket_path.filter(|s| !s.is_empty()),
                pci_id: i.pci_id.filter(|s| !s.is_empty()),
            });
        }
        for ip in wire.ips.unwrap_or_default() {
            result.ips.push(IpConfig {
                address: ip.address,
                gateway: ip.gateway,
                interface: ip.interface,
            });
        }
        result.routes = wire.routes.unwrap_or_default();
        for legacy in [wire.ip4, wire.ip6].into_iter().flatten() {
            result.ips.push(IpConfig {
                address: legacy.ip,
                gateway: legacy.gateway,
                interface: None,
            });
            result.routes.extend(legacy.routes.unwrap_or_default());
        }
        for r in &mut result.routes {
            // Go writes these as plain ints with omitempty, so 0 means unset.
            for f in [&mut r.mtu, &mut r.advmss, &mut r.priority] {
                if *f == Some(0) {
                    *f = None;
                }
            }
        }
        Ok(result)
    }
}

fn interface_json(i: &Interface, extras: bool) -> Value {
    let mut obj = Map::new();
    obj.insert("name".into(), i.name.clone().into());
    if let Some(mac) = some_nonempty(&i.mac) {
        obj.insert("mac".into(), mac.into());
    }
    if extras && let Some(mtu) = i.mtu.filter(|m| *m != 0) {
        obj.insert("mtu".into(), mtu.into());
    }
    if let Some(sandbox) = some_nonempty(&i.sandbox) {
        obj.insert("sandbox".into(), sandbox.into());
    }
    if extras {
        if let Some(p) = some_nonempty(&i.socket_path) {
            obj.insert("socketPath".into(), p.into());
        }
        if let Some(p) = some_nonempty(&i.pci_id) {
            obj.insert("pciID".into(), p.into());
        }
    }
    Value::Object(obj)
}

fn route_json(r: &Route, extras: bool) -> Value {
    let mut obj = Map::new();
    obj.insert("dst".into(), r.dst.to_string().into());
    if let Some(gw) = r.gw {
        obj.insert("gw".into(), gw.to_string().into());
    }
    if extras {
        for (key, val) in [
            ("mtu", r.mtu),
            ("advmss", r.advmss),
            ("priority", r.priority),
        ] {
            if let Some(v) = val.filter(|v| *v != 0) {
                obj.insert(key.into(), v.into());
            }
        }
        // table and scope are pointers in Go: 0 is a real value.
        for (key, val) in [("table", r.table), ("scope", r.scope)] {
            if let Some(v) = val {
                obj.insert(key.into(), v.into());
            }
        }
    }
    Value::Object(obj)
}

#[derive(Deserialize)]
struct WireResult {
    interfaces: Option<Vec<WireInterface>>,
    ips: Option<Vec<WireIp>>,
    routes: Option<Vec<Route>>,
    dns: Option<Dns>,
    ip4: Option<WireLegacyIp>,
    ip6: Option<WireLegacyIp>,
}

#[derive(Deserialize)]
struct WireInterface {
    name: String,
    mac: Option<String>,
    mtu: Option<u32>,
    sandbox: Option<String>,
    #[serde(rename = "socketPath")]
    socket_path: Option<String>,
    #[serde(rename = "pciID")]
    pci_id: Option<String>,
}

#[derive(Deserialize)]
struct WireIp {
    address: IpNet,
    gateway: Option<IpAddr>,
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct WireLegacyIp {
    ip: IpNet,
    gateway: Option<IpAddr>,
    routes: Option<Vec<Route>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A tern-shaped dual-stack result: host veth, pod eth0, /32 and /128, default routes.
    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "tern1a2b3c4d5e6".into(),
                    mac: Some("ee:ee:ee:ee:ee:ee".into()),
                    mtu: Some(1450),
                    ..Interface::default()
                },
                Interface {
                    name: "eth0".into(),
                    mac: Some("0a:58:0a:f4:01:05".into()),
                    mtu: Some(1450),
                    sandbox: Some("/run/netns/pod1".into()),
                    socket_path: Some("/run/vhost.sock".into()),
                    pci_id: Some("0000:00:1f.6".into()),
                },
            ],
            ips: vec![
                IpConfig {
                    address: net("10.244.1.5/32"),
                    gateway: Some(ip("169.254.1.1")),
                    interface: Some(1),
                },
                IpConfig {
                    address: net("10.244.1.6/32"),
                    gateway: None,
                    interface: Some(1),
                },
                IpConfig {
                    address: net("fd00:10:244::5/128"),
                    gateway: None,
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    mtu: Some(1400),
                    advmss: Some(1360),
                    priority: Some(100),
                    table: Some(0),
                    scope: Some(0),
                    ..Route::new(net("0.0.0.0/0")).via(ip("169.254.1.1"))
                },
                Route::new(net("::/0")),
            ],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                domain: None,
                search: vec!["default.svc.cluster.local".into()],
                options: vec![],
            },
        }
    }

    fn legacy_expected(v: &str) -> Value {
        json!({
            "cniVersion": v,
            "ip4": {
                "ip": "10.244.1.5/32",
                "gateway": "169.254.1.1",
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]
            },
            "ip6": {"ip": "fd00:10:244::5/128", "routes": [{"dst": "::/0"}]},
            "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
        })
    }

    fn v03_expected(v: &str) -> Value {
        json!({
            "cniVersion": v,
            "interfaces": [
                {"name": "tern1a2b3c4d5e6", "mac": "ee:ee:ee:ee:ee:ee"},
                {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/run/netns/pod1"}
            ],
            "ips": [
                {"version": "4", "address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1},
                {"version": "4", "address": "10.244.1.6/32", "interface": 1},
                {"version": "6", "address": "fd00:10:244::5/128", "interface": 1}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "::/0"}],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
        })
    }

    #[test]
    fn render_0_1_0_and_0_2_0() {
        let r = sample();
        assert_eq!(r.to_json(Version::V0_1_0), legacy_expected("0.1.0"));
        assert_eq!(r.to_json(Version::V0_2_0), legacy_expected("0.2.0"));
    }

    #[test]
    fn render_0_3_x_and_0_4_0() {
        let r = sample();
        assert_eq!(r.to_json(Version::V0_3_0), v03_expected("0.3.0"));
        assert_eq!(r.to_json(Version::V0_3_1), v03_expected("0.3.1"));
        assert_eq!(r.to_json(Version::V0_4_0), v03_expected("0.4.0"));
    }

    #[test]
    fn render_1_0_0() {
        let expected = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "tern1a2b3c4d5e6", "mac": "ee:ee:ee:ee:ee:ee"},
                {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "sandbox": "/run/netns/pod1"}
            ],
            "ips": [
                {"address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1},
                {"address": "10.244.1.6/32", "interface": 1},
                {"address": "fd00:10:244::5/128", "interface": 1}
            ],
            "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "::/0"}],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
        });
        assert_eq!(sample().to_json(Version::V1_0_0), expected);
    }

    #[test]
    fn render_1_1_0() {
        let expected = json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "tern1a2b3c4d5e6", "mac": "ee:ee:ee:ee:ee:ee", "mtu": 1450},
                {"name": "eth0", "mac": "0a:58:0a:f4:01:05", "mtu": 1450, "sandbox": "/run/netns/pod1",
                 "socketPath": "/run/vhost.sock", "pciID": "0000:00:1f.6"}
            ],
            "ips": [
                {"address": "10.244.1.5/32", "gateway": "169.254.1.1", "interface": 1},
                {"address": "10.244.1.6/32", "interface": 1},
                {"address": "fd00:10:244::5/128", "interface": 1}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "169.254.1.1", "mtu": 1400, "advmss": 1360, "priority": 100,
                 "table": 0, "scope": 0},
                {"dst": "::/0"}
            ],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["default.svc.cluster.local"]}
        });
        assert_eq!(sample().to_json(Version::V1_1_0), expected);
    }

    #[test]
    fn empty_result_keeps_cni_version_and_dns() {
        let r = CniResult::default();
        assert_eq!(
            r.to_json(Version::V1_0_0),
            json!({"cniVersion": "1.0.0", "dns": {}})
        );
        assert_eq!(
            r.to_json(Version::V0_2_0),
            json!({"cniVersion": "0.2.0", "dns": {}})
        );
    }

    #[test]
    fn parse_back_every_version() {
        let full = sample();
        // What each version can carry of the sample.
        let mut no_extras = full.clone();
        for i in &mut no_extras.interfaces {
            i.mtu = None;
            i.socket_path = None;
            i.pci_id = None;
        }
        no_extras.routes[0] = Route::new(net("0.0.0.0/0")).via(ip("169.254.1.1"));
        let legacy = CniResult {
            interfaces: vec![],
            ips: vec![
                IpConfig {
                    interface: None,
                    ..full.ips[0].clone()
                },
                IpConfig {
                    interface: None,
                    ..full.ips[2].clone()
                },
            ],
            routes: no_extras.routes.clone(),
            dns: full.dns.clone(),
        };
        for v in Version::ALL {
            let parsed = CniResult::from_json(&full.to_json(v)).unwrap();
            let expected = if v.is_legacy() {
                &legacy
            } else if v.has_result_extras() {
                &full
            } else {
                &no_extras
            };
            assert_eq!(&parsed, expected, "version {v}");
            // Rendering the parsed result again is stable.
            assert_eq!(parsed.to_json(v), full.to_json(v), "version {v}");
        }
    }

    #[test]
    fn parse_host_local_output() {
        // host-local 1.1.1 output for a 0.3.1 config (replayed on Debian's binary).
        let v = json!({
            "cniVersion": "0.3.1",
            "ips": [{"version": "4", "address": "10.77.100.2/24", "gateway": "10.77.100.1"}],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        });
        let r = CniResult::from_json(&v).unwrap();
        assert_eq!(
            r.ips,
            vec![IpConfig {
                address: net("10.77.100.2/24"),
                gateway: Some(ip("10.77.100.1")),
                interface: None
            }]
        );
        assert_eq!(r.routes, vec![Route::new(net("0.0.0.0/0"))]);
        assert!(r.dns.is_empty() && r.interfaces.is_empty());
    }

    #[test]
    fn parse_tolerates_nulls_and_empty_strings() {
        let v = json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "mac": "", "sandbox": ""}],
            "ips": null,
            "routes": [{"dst": "10.0.0.0/8", "mtu": 0}],
            "dns": null
        });
        let r = CniResult::from_json(&v).unwrap();
        assert_eq!(
            r.interfaces,
            vec![Interface {
                name: "eth0".into(),
                ..Interface::default()
            }]
        );
        assert_eq!(r.routes, vec![Route::new(net("10.0.0.0/8"))]);
    }

    #[test]
    fn parse_errors_are_code_6_naming_field() {
        let v = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.300/24"}]});
        let e = CniResult::from_json(&v).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("`ips[0].address`"), "{}", e.msg);
        let v = json!({"cniVersion": "0.2.0", "ip4": {"gateway": "10.0.0.1"}});
        let e = CniResult::from_json(&v).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("ip4") && e.msg.contains("`ip`"), "{}", e.msg);
    }
}
