//! The `IPPool` kind: a range pods (and tunnel devices) get addresses from, with Calico's
//! rules for block sizes and encapsulation.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::selector::Selector;
use crate::validate::{FieldError, invalid, link_local, nets_overlap, parse_network_cidr};

/// An IP pool.
pub type IpPool = Document<IpPoolSpec>;

/// When a pool's traffic is encapsulated between nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum EncapMode {
    Always,
    CrossSubnet,
    #[default]
    Never,
}

/// What addresses of a pool may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllowedUse {
    Workload,
    Tunnel,
}

fn default_allowed_uses() -> Vec<AllowedUse> {
    vec![AllowedUse::Workload, AllowedUse::Tunnel]
}

fn default_node_selector() -> String {
    "all()".to_string()
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Spec of an [`IpPool`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpPoolSpec {
    pub cidr: String,
    /// Prefix length of the pool's blocks; 0 in a document means "family default" and is
    /// replaced by 26 (IPv4) or 122 (IPv6) when parsed.
    #[serde(default)]
    pub block_size: u8,
    #[serde(default)]
    pub vxlan_mode: EncapMode,
    #[serde(default)]
    pub ipip_mode: EncapMode,
    #[serde(default, skip_serializing_if = "is_false")]
    pub nat_outgoing: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disabled: bool,
    #[serde(default = "default_node_selector")]
    pub node_selector: String,
    #[serde(default = "default_allowed_uses")]
    pub allowed_uses: Vec<AllowedUse>,
}

impl IpPoolSpec {
    /// A pool over `cidr` with every other field at its default.
    pub fn new(cidr: impl Into<String>) -> IpPoolSpec {
        let mut s = IpPoolSpec {
            cidr: cidr.into(),
            block_size: 0,
            vxlan_mode: EncapMode::Never,
            ipip_mode: EncapMode::Never,
            nat_outgoing: false,
            disabled: false,
            node_selector: default_node_selector(),
            allowed_uses: default_allowed_uses(),
        };
        fill_defaults(&mut s);
        s
    }

    /// The pool's network, if `cidr` parses.
    pub fn net(&self) -> Option<ipnet::IpNet> {
        self.cidr.parse().ok()
    }
}

/// A block size of 0 means the family default: 26 for IPv4, 122 for IPv6.
pub(crate) fn fill_defaults(s: &mut IpPoolSpec) {
    if s.block_size == 0 {
        s.block_size = match s.net() {
            Some(ipnet::IpNet::V6(_)) => 122,
            _ => 26,
        };
    }
}

/// Write-time checks of an [`IpPool`], as Calico's.
pub(crate) fn validate_ip_pool(p: &IpPool) -> Result<(), FieldError> {
    let s = &p.spec;
    let net = parse_network_cidr(&s.cidr).map_err(|e| invalid("spec.cidr", e))?;
    let ll = link_local(&net);
    if nets_overlap(&net, &ll) {
        return Err(invalid(
            "spec.cidr",
            format!("{net} overlaps the link-local range {ll}"),
        ));
    }
    let (lo, hi) = match net {
        IpNet::V4(_) => (20, 32),
        IpNet::V6(_) => (116, 128),
    };
    if !(lo..=hi).contains(&s.block_size) {
        return Err(invalid(
            "spec.blockSize",
            format!(
                "{} is out of range for {net} (must be {lo}..={hi})",
                s.block_size
            ),
        ));
    }
    if s.block_size < net.prefix_len() {
        return Err(invalid(
            "spec.blockSize",
            format!(
                "{} is smaller than the pool's prefix length {}: a block must fit in the pool",
                s.block_size,
                net.prefix_len()
            ),
        ));
    }
    if s.ipip_mode != EncapMode::Never && matches!(net, IpNet::V6(_)) {
        return Err(invalid(
            "spec.ipipMode",
            "IPIP is not supported on IPv6 pools",
        ));
    }
    if s.ipip_mode != EncapMode::Never && s.vxlan_mode != EncapMode::Never {
        return Err(invalid(
            "spec.vxlanMode",
            "a pool cannot use both IPIP and VXLAN; set one of them to Never",
        ));
    }
    if s.node_selector.trim().is_empty() {
        return Err(invalid(
            "spec.nodeSelector",
            "must not be empty (use \"all()\" to select every node)",
        ));
    }
    Selector::parse(&s.node_selector).map_err(|e| invalid("spec.nodeSelector", e.to_string()))?;
    Ok(())
}

/// Returns a description of the first pool in `others` (other than `pool` itself, by name)
/// whose CIDR overlaps `pool`'s, or `None`. Pools with unparseable CIDRs are ignored here;
/// [`crate::Resource::validate`] reports those.
pub fn ip_pool_overlaps(pool: &IpPool, others: &[IpPool]) -> Option<String> {
    let net: IpNet = pool.spec.cidr.parse().ok()?;
    others
        .iter()
        .filter(|o| o.metadata.name != pool.metadata.name)
        .find_map(|o| {
            let on: IpNet = o.spec.cidr.parse().ok()?;
            nets_overlap(&net, &on).then(|| {
                format!(
                    "IPPool {:?} ({net}) overlaps IPPool {:?} ({on})",
                    pool.metadata.name, o.metadata.name
                )
            })
        })
}
