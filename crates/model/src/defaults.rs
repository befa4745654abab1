//! The defaults the node agent, `ternctl` and the lab share, in one place.

/// CIDR of the default IPv4 pool: what ternd creates when the store has none, what
/// `ternctl install manifest` and the lab give it unless told otherwise.
pub const IPV4_POOL: &str = "10.244.0.0/16";
/// Name of the default IPv4 pool.
pub const IPV4_POOL_NAME: &str = "default-ipv4-ippool";
/// Name of the default IPv6 pool.
pub const IPV6_POOL_NAME: &str = "default-ipv6-ippool";
/// CIDR of the default IPv6 pool of the lab (`lab up --ip-family ipv6|dual`) and of
/// `--default-ipv6-pool` examples: a ULA /48.
pub const IPV6_POOL: &str = "fd00:10:244::/48";
/// Calico's default IPv6 block size (`blockSize` 116-128).
pub const IPV6_BLOCK_SIZE: u8 = 122;
