//! Value types several kinds share: [`IntOrString`], [`PolicyType`], the rule [`Protocol`]
//! and [`Port`] of tern policies, and the named [`EndpointPort`] of workload endpoints (which
//! Kubernetes and tern policies both match by name).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::validate::validate_port_name;

/// A value that is either an integer or a string, as Kubernetes' `IntOrString` (ports) and
/// Calico's `Protocol`/`Port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IntOrString {
    Int(i64),
    Str(String),
}

impl fmt::Display for IntOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntOrString::Int(i) => write!(f, "{i}"),
            IntOrString::Str(s) => f.write_str(s),
        }
    }
}

impl Serialize for IntOrString {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            IntOrString::Int(i) => s.serialize_i64(*i),
            IntOrString::Str(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<IntOrString, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = IntOrString;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IntOrString, E> {
                Ok(IntOrString::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IntOrString, E> {
                i64::try_from(v)
                    .map(IntOrString::Int)
                    .map_err(|_| E::custom(format!("{v} is out of range")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::Str(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Direction a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PolicyType {
    Ingress,
    Egress,
}

/// An IP protocol of a rule (Calico names, or a number 1-255).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "IntOrString", into = "IntOrString")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    IcmpV6,
    UdpLite,
    /// Any other IP protocol number.
    Number(u8),
}

impl Protocol {
    /// Whether rules with this protocol may match ports.
    pub fn has_ports(self) -> bool {
        matches!(
            self,
            Protocol::Tcp | Protocol::Udp | Protocol::Sctp | Protocol::UdpLite
        )
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
            Protocol::Icmp => 1,
            Protocol::IcmpV6 => 58,
            Protocol::UdpLite => 136,
            Protocol::Number(n) => n,
        }
    }
}

impl TryFrom<IntOrString> for Protocol {
    type Error = String;
    fn try_from(v: IntOrString) -> Result<Protocol, String> {
        match v {
            IntOrString::Int(n) => u8::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .map(Protocol::Number)
                .ok_or_else(|| format!("protocol number {n} is not in 1..=255")),
            IntOrString::Str(s) => Ok(match s.to_ascii_uppercase().as_str() {
                "TCP" => Protocol::Tcp,
                "UDP" => Protocol::Udp,
                "SCTP" => Protocol::Sctp,
                "ICMP" => Protocol::Icmp,
                "ICMPV6" => Protocol::IcmpV6,
                "UDPLITE" => Protocol::UdpLite,
                _ => {
                    return Err(format!(
                        "unknown protocol {s:?}; expected TCP, UDP, SCTP, ICMP, ICMPv6, UDPLite \
                         or a number"
                    ));
                }
            }),
        }
    }
}

impl From<Protocol> for IntOrString {
    fn from(p: Protocol) -> IntOrString {
        IntOrString::Str(
            match p {
                Protocol::Tcp => "TCP",
                Protocol::Udp => "UDP",
                Protocol::Sctp => "SCTP",
                Protocol::Icmp => "ICMP",
                Protocol::IcmpV6 => "ICMPv6",
                Protocol::UdpLite => "UDPLite",
                Protocol::Number(n) => return IntOrString::Int(n.into()),
            }
            .to_string(),
        )
    }
}

/// A port of a Calico rule: a number, a range (`"80:90"`) or a named port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "IntOrString", into = "IntOrString")]
pub enum Port {
    /// An inclusive range (a single port is `lo == hi`).
    Range(u16, u16),
    /// A named container port of the destination endpoint.
    Named(String),
}

impl TryFrom<IntOrString> for Port {
    type Error = String;
    fn try_from(v: IntOrString) -> Result<Port, String> {
        let num = |s: &str| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("{s:?} is not a port number (0-65535)"))
        };
        match v {
            IntOrString::Int(n) => u16::try_from(n)
                .map(|p| Port::Range(p, p))
                .map_err(|_| format!("port {n} is not in 0..=65535")),
            IntOrString::Str(s) => {
                if let Some((a, b)) = s.split_once(':') {
                    let (lo, hi) = (num(a)?, num(b)?);
                    if hi < lo {
                        return Err(format!("port range {s:?}: end {hi} is below start {lo}"));
                    }
                    Ok(Port::Range(lo, hi))
                } else if s.chars().all(|c| c.is_ascii_digit()) && !s.is_empty() {
                    num(&s).map(|p| Port::Range(p, p))
                } else {
                    validate_port_name(&s)?;
                    Ok(Port::Named(s))
                }
            }
        }
    }
}

impl From<Port> for IntOrString {
    fn from(p: Port) -> IntOrString {
        match p {
            Port::Range(a, b) if a == b => IntOrString::Int(a.into()),
            Port::Range(a, b) => IntOrString::Str(format!("{a}:{b}")),
            Port::Named(n) => IntOrString::Str(n),
        }
    }
}

/// A named container port of a workload (`WorkloadEndpoint.spec.ports`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPort {
    pub name: String,
    #[serde(default = "default_tcp")]
    pub protocol: Protocol,
    pub port: u16,
}

fn default_tcp() -> Protocol {
    Protocol::Tcp
}
