//! The BGP kinds: the cluster-wide [`BgpConfiguration`] (named `default`) and
//! [`BgpPeer`]s, with Calico's v3 field names. Node-level BGP settings live in
//! [`crate::NodeBgpSpec`].

use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::selector::Selector;
use crate::validate::FieldError;

/// The AS number nodes use when neither the node nor the BGPConfiguration sets one (Calico's).
pub const DEFAULT_AS_NUMBER: u32 = 64512;
/// The TCP port BGP listens on by default.
pub const DEFAULT_BGP_PORT: u16 = 179;
/// Name of the BGPConfiguration that applies cluster-wide.
pub const DEFAULT_BGP_CONFIGURATION: &str = "default";

/// Cluster-wide BGP settings (only the one named `default` is read).
pub type BgpConfiguration = Document<BgpConfigurationSpec>;
/// An explicit BGP peering.
pub type BgpPeer = Document<BgpPeerSpec>;

fn default_true() -> bool {
    true
}

fn default_port() -> u16 {
    DEFAULT_BGP_PORT
}

/// Spec of a [`BgpConfiguration`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpConfigurationSpec {
    /// Default AS of nodes that set none; [`DEFAULT_AS_NUMBER`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// Full iBGP mesh between all nodes (default true). Turn off when route reflectors
    /// (in-cluster or top-of-rack) distribute the routes.
    #[serde(default = "default_true")]
    pub node_to_node_mesh_enabled: bool,
    /// Port the node agents listen on and connect to for mesh peers.
    #[serde(default = "default_port")]
    pub listen_port: u16,
    /// Accepted for Calico compatibility; tern's log level is `ternd --log-level`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_severity_screen: Option<String>,
}

impl Default for BgpConfigurationSpec {
    fn default() -> Self {
        BgpConfigurationSpec {
            as_number: None,
            node_to_node_mesh_enabled: true,
            listen_port: DEFAULT_BGP_PORT,
            log_severity_screen: None,
        }
    }
}

impl BgpConfigurationSpec {
    /// The cluster's default AS.
    pub fn as_number(&self) -> u32 {
        self.as_number.unwrap_or(DEFAULT_AS_NUMBER)
    }
}

/// Spec of a [`BgpPeer`]. Which nodes peer: `node` (one node), else `nodeSelector`, else all
/// nodes (a "global" peer). With whom: `peerIP` + `asNumber`, or every node matching
/// `peerSelector` (at its BGP address and AS).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BgpPeerSpec {
    /// The node that peers (node-specific peering).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Selector of the nodes that peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<String>,
    /// The peer's address, optionally with a port (`198.18.0.1`, `198.18.0.1:1179`,
    /// `[fd00::1]:179`).
    #[serde(default, rename = "peerIP", skip_serializing_if = "Option::is_none")]
    pub peer_ip: Option<String>,
    /// Selector of nodes to peer with (instead of `peerIP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_selector: Option<String>,
    /// The peer's AS (required with `peerIP`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_number: Option<u32>,
    /// TCP MD5 password (RFC 2385), given inline (Calico reads it from a Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Toward an eBGP peer, advertise routes with their original next hop.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_original_next_hop: bool,
    /// Prefixes outside every IPPool this peer may announce to the node (a default route, an
    /// external network, a prefix inside the underlay). Without an entry, a node installs
    /// only routes inside its IPPools at their block size or longer; this node's own blocks
    /// and pod addresses are refused whatever this list says, and a learned route never
    /// replaces a kernel route tern did not install. At most [`MAX_ACCEPT_PREFIXES`] entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_prefixes: Vec<AcceptPrefix>,
}

/// Most entries in [`BgpPeerSpec::accept_prefixes`].
pub const MAX_ACCEPT_PREFIXES: usize = 64;

/// One entry of [`BgpPeerSpec::accept_prefixes`]: prefixes inside `cidr` whose length lies
/// between the length of `cidr` and `maxLength` (inclusive; default: the length of `cidr`,
/// i.e. exactly `cidr`), as in an RPKI ROA. `{cidr: 0.0.0.0/0}` admits the IPv4 default route
/// and nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcceptPrefix {
    /// The covering prefix (no host bits set).
    pub cidr: String,
    /// Longest prefix length admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u8>,
}

impl AcceptPrefix {
    /// The entry as (covering prefix, longest admitted length), or why it is invalid.
    pub fn parse(&self) -> Result<(ipnet::IpNet, u8), String> {
        let net: ipnet::IpNet = self
            .cidr
            .parse()
            .map_err(|_| format!("{:?} is not a CIDR", self.cidr))?;
        if net.trunc() != net {
            return Err(format!(
                "{} has host bits set (did you mean {}?)",
                self.cidr,
                net.trunc()
            ));
        }
        let max = self.max_length.unwrap_or(net.prefix_len());
        if max < net.prefix_len() || max > net.max_prefix_len() {
            return Err(format!(
                "maxLength {max} must lie between {} and {} for {}",
                net.prefix_len(),
                net.max_prefix_len(),
                self.cidr
            ));
        }
        Ok((net, max))
    }

    /// Whether `prefix` is admitted by this entry (false when the entry is invalid).
    pub fn admits(&self, prefix: &ipnet::IpNet) -> bool {
        self.parse()
            .is_ok_and(|(net, max)| net.contains(prefix) && prefix.prefix_len() <= max)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl BgpPeerSpec {
    /// `peerIP` as address and port (179 when not given); `None` when absent, an error when
    /// malformed.
    pub fn peer_address(&self) -> Result<Option<std::net::SocketAddr>, String> {
        let Some(s) = self.peer_ip.as_deref() else {
            return Ok(None);
        };
        if let Ok(ip) = s.parse::<std::net::IpAddr>() {
            return Ok(Some(std::net::SocketAddr::new(ip, DEFAULT_BGP_PORT)));
        }
        s.parse::<std::net::SocketAddr>()
            .map(Some)
            .map_err(|_| format!("{s:?} is not an IP address or IP:port"))
    }
}

/// Write-time checks of a BGPConfiguration.
pub(crate) fn validate_configuration(c: &BgpConfiguration) -> Result<(), FieldError> {
    if c.spec.as_number == Some(0) {
        return Err(("spec.asNumber".into(), "AS 0 is reserved".into()));
    }
    if c.spec.listen_port == 0 {
        return Err(("spec.listenPort".into(), "port 0 is not a port".into()));
    }
    Ok(())
}

/// Write-time checks of a BGPPeer.
pub(crate) fn validate_peer(p: &BgpPeer) -> Result<(), FieldError> {
    let s = &p.spec;
    s.peer_address()
        .map_err(|e| ("spec.peerIP".to_string(), e))?;
    match (&s.peer_ip, &s.peer_selector) {
        (None, None) => {
            return Err((
                "spec".into(),
                "one of peerIP or peerSelector is required".into(),
            ));
        }
        (Some(_), Some(_)) => {
            return Err((
                "spec.peerSelector".into(),
                "peerIP and peerSelector are mutually exclusive".into(),
            ));
        }
        (Some(_), None) if s.as_number.is_none() => {
            return Err(("spec.asNumber".into(), "required with peerIP".into()));
        }
        _ => {}
    }
    if s.as_number == Some(0) {
        return Err(("spec.asNumber".into(), "AS 0 is reserved".into()));
    }
    if s.node.is_some() && s.node_selector.is_some() {
        return Err((
            "spec.nodeSelector".into(),
            "node and nodeSelector are mutually exclusive".into(),
        ));
    }
    if s.accept_prefixes.len() > MAX_ACCEPT_PREFIXES {
        return Err((
            "spec.acceptPrefixes".into(),
            format!(
                "{} entries; at most {MAX_ACCEPT_PREFIXES} are allowed",
                s.accept_prefixes.len()
            ),
        ));
    }
    for (i, a) in s.accept_prefixes.iter().enumerate() {
        a.parse()
            .map_err(|e| (format!("spec.acceptPrefixes[{i}]"), e))?;
    }
    for (field, sel) in [
        ("spec.nodeSelector", &s.node_selector),
        ("spec.peerSelector", &s.peer_selector),
    ] {
        if let Some(sel) = sel {
            Selector::parse(sel).map_err(|e| (field.to_string(), e.to_string()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::BgpPeer;
    use crate::{Resource, parse_documents};

    fn parse(text: &str) -> Result<Resource, String> {
        let mut v = parse_documents(text, "t.yaml").map_err(|e| e.to_string())?;
        let mut r = v.remove(0);
        r.fill_defaults();
        r.validate().map_err(|e| e.to_string())?;
        Ok(r)
    }

    /// [`parse`] of a BGPPeer named `name` whose spec is `spec` (the YAML after `spec:`).
    fn parse_peer(name: &str, spec: &str) -> Result<Resource, String> {
        parse(&format!(
            "apiVersion: tern.dev/v1\nkind: BGPPeer\nmetadata: {{name: {name}}}\nspec:{spec}\n"
        ))
    }

    /// A valid BGPPeer named `name` whose spec is `spec`.
    fn peer(name: &str, spec: &str) -> BgpPeer {
        match parse_peer(name, spec).unwrap_or_else(|e| panic!("{e}")) {
            Resource::BgpPeer(p) => p,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn configuration_defaults_follow_calico() {
        let r = parse("apiVersion: tern.dev/v1\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {}\n")
            .unwrap();
        let Resource::BgpConfiguration(c) = r else {
            panic!("{r:?}")
        };
        assert_eq!(c.spec.as_number(), 64512);
        assert!(c.spec.node_to_node_mesh_enabled);
        assert_eq!(c.spec.listen_port, 179);
        let r = parse("apiVersion: tern.dev/v1\nkind: BGPConfiguration\nmetadata: {name: default}\nspec: {asNumber: 65010, nodeToNodeMeshEnabled: false, listenPort: 1179}\n")
            .unwrap();
        let Resource::BgpConfiguration(c) = r else {
            panic!("{r:?}")
        };
        assert_eq!(
            (
                c.spec.as_number(),
                c.spec.node_to_node_mesh_enabled,
                c.spec.listen_port
            ),
            (65010, false, 1179)
        );
        // Round trip through the stored JSON.
        let back = Resource::from_json(Resource::BgpConfiguration(c.clone()).to_json().as_bytes())
            .unwrap();
        assert_eq!(back, Resource::BgpConfiguration(c));
    }

    #[test]
    fn peer_fields_and_validation() {
        let p = peer(
            "tor",
            "\n  peerIP: 198.18.0.250:1179\n  asNumber: 65001\n  nodeSelector: rack == 'a'\n  password: s3cret\n  keepOriginalNextHop: true",
        );
        assert_eq!(
            p.spec.peer_address().unwrap(),
            Some("198.18.0.250:1179".parse().unwrap())
        );
        assert_eq!(p.spec.password.as_deref(), Some("s3cret"));
        assert!(p.spec.keep_original_next_hop);
        for (spec, want) in [
            (
                " {peerIP: 198.18.0.1}",
                "spec.asNumber: required with peerIP",
            ),
            (" {asNumber: 1}", "one of peerIP or peerSelector"),
            (" {peerIP: nope, asNumber: 1}", "spec.peerIP"),
            (" {peerSelector: 'a ==', asNumber: 1}", "spec.peerSelector"),
        ] {
            let e = parse_peer("x", spec).unwrap_err();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn accept_prefixes_are_validated_and_match_like_a_roa() {
        let p = peer(
            "tor",
            "\n  peerIP: 198.18.0.250\n  asNumber: 65001\n  acceptPrefixes:\n  - cidr: 0.0.0.0/0\n  - {cidr: 10.99.0.0/16, maxLength: 24}",
        );
        let [dflt, ext] = &p.spec.accept_prefixes[..] else {
            panic!("{:?}", p.spec.accept_prefixes)
        };
        let n = |s: &str| s.parse::<ipnet::IpNet>().unwrap();
        assert!(dflt.admits(&n("0.0.0.0/0")));
        assert!(!dflt.admits(&n("10.0.0.0/8")), "a default entry is exact");
        assert!(!dflt.admits(&n("::/0")));
        assert!(ext.admits(&n("10.99.0.0/16")) && ext.admits(&n("10.99.7.0/24")));
        assert!(!ext.admits(&n("10.99.7.0/25")) && !ext.admits(&n("10.0.0.0/8")));
        // Round trip through the stored JSON keeps the list.
        let back = Resource::from_json(Resource::BgpPeer(p.clone()).to_json().as_bytes()).unwrap();
        assert_eq!(back, Resource::BgpPeer(p));
        let head = "\n  peerIP: 198.18.0.1\n  asNumber: 1\n  acceptPrefixes:\n";
        for (entry, want) in [
            (
                "  - cidr: nope\n",
                "spec.acceptPrefixes[0]: \"nope\" is not a CIDR",
            ),
            (
                "  - cidr: 10.0.0.1/8\n",
                "has host bits set (did you mean 10.0.0.0/8?)",
            ),
            (
                "  - {cidr: 10.0.0.0/8, maxLength: 7}\n",
                "maxLength 7 must lie between 8 and 32",
            ),
            ("  - {cidr: 10.0.0.0/8, maxLength: 33}\n", "maxLength 33"),
            ("  - {cidr: 10.0.0.0/8, le: 9}\n", "le"),
        ] {
            let e = parse_peer("x", &format!("{head}{entry}")).unwrap_err();
            assert!(e.contains(want), "{entry}: {e}");
        }
        let many: String = (0..65)
            .map(|i| format!("  - cidr: 10.{i}.0.0/16\n"))
            .collect();
        let e = parse_peer("x", &format!("{head}{many}")).unwrap_err();
        assert!(
            e.contains("spec.acceptPrefixes: 65 entries; at most 64"),
            "{e}"
        );
    }

    #[test]
    fn node_route_reflector_cluster_id() {
        let r = parse("apiVersion: tern.dev/v1\nkind: Node\nmetadata: {name: n1}\nspec:\n  bgp: {ipv4Address: 198.18.0.11/24, ipv6Address: 'fd00::11/64', routeReflectorClusterID: 224.0.0.1}\n")
            .unwrap();
        let Resource::Node(n) = r else {
            panic!("{r:?}")
        };
        let b = n.spec.bgp.unwrap();
        assert_eq!(b.route_reflector_cluster_id.as_deref(), Some("224.0.0.1"));
        assert_eq!(b.ipv6_address.as_deref(), Some("fd00::11/64"));
        let e = parse("apiVersion: tern.dev/v1\nkind: Node\nmetadata: {name: n1}\nspec:\n  bgp: {routeReflectorClusterID: x}\n")
            .unwrap_err();
        assert!(e.contains("spec.bgp.routeReflectorClusterID"), "{e}");
    }
}
