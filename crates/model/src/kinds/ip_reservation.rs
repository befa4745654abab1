//! The `IPReservation` kind: addresses automatic assignment never hands out (cluster-scoped).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::document::Document;
use crate::validate::{FieldError, invalid, parse_network_cidr};

/// Addresses excluded from automatic assignment (cluster-scoped).
pub type IpReservation = Document<IpReservationSpec>;

/// Spec of an [`IpReservation`]: CIDRs (or single addresses) that automatic assignment never
/// hands out. An explicitly requested address (`assign_ip`) may still be reserved, as in Calico.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpReservationSpec {
    #[serde(rename = "reservedCIDRs")]
    pub reserved_cidrs: Vec<String>,
}

impl IpReservationSpec {
    /// The reserved networks that parse (a bare address counts as a host route).
    pub fn nets(&self) -> Vec<ipnet::IpNet> {
        self.reserved_cidrs
            .iter()
            .filter_map(|c| {
                c.parse::<ipnet::IpNet>()
                    .ok()
                    .or_else(|| c.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
            })
            .collect()
    }
}

/// Write-time checks of an [`IpReservation`]: at least one entry, each an address or a
/// network address.
pub(crate) fn validate_ip_reservation(r: &IpReservation) -> Result<(), FieldError> {
    if r.spec.reserved_cidrs.is_empty() {
        return Err(invalid("spec.reservedCIDRs", "must list at least one CIDR"));
    }
    for (i, c) in r.spec.reserved_cidrs.iter().enumerate() {
        if c.parse::<IpAddr>().is_ok() {
            continue;
        }
        parse_network_cidr(c).map_err(|e| invalid(format!("spec.reservedCIDRs[{i}]"), e))?;
    }
    Ok(())
}
