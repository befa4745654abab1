//! The defaults the node agent, `ternctl` and the lab share, in one place.

/// CIDR of the default IPv4 pool: what ternd creates when the store has none, what
/// `ternctl install manifest` and the lab give it unless told otherwise.
pub const IPV4_POOL: &str = "10.244.0.0/16";
/// Name of the default IPv4 pool.
pub const IPV4_POOL_NAME: &str = "default-ipv4-ippool";
/// Name of the default IPv6 pool.
pub const IPV6_POOL_NAME: &str = "default-ipv6-ippool";
