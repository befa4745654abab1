//! The values the [`Ipam`](crate::Ipam) API takes and returns: who an address is for, a request,
//! usage and allocation listings, the clock.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Who an address is allocated to (Calico's "secondary" attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationAttrs {
    pub namespace: String,
    pub pod: String,
    pub node: String,
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A request for addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignArgs {
    /// Handle the addresses are recorded under (tern-api's `Attachment::handle`).
    pub handle: String,
    /// The node allocating (blocks are claimed for it).
    pub node: String,
    pub attrs: AllocationAttrs,
    pub num_v4: usize,
    pub num_v6: usize,
    /// Restrict to these pools (by name or CIDR); empty = every usable pool.
    pub v4_pools: Vec<String>,
    pub v6_pools: Vec<String>,
}

/// Usage of one block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockUsage {
    pub cidr: IpNet,
    pub total: u128,
    pub in_use: u128,
    /// The node the block is affine to.
    pub affinity: Option<String>,
}

/// Usage of one pool and its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    pub pool: String,
    pub cidr: IpNet,
    pub total: u128,
    pub in_use: u128,
    pub blocks: Vec<BlockUsage>,
}

/// One live allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub ip: IpAddr,
    pub handle: Option<String>,
    pub attrs: AllocationAttrs,
    pub block: IpNet,
    /// The allocation's sequence number in its block (changes if the address is reused).
    pub sequence_number: u64,
}

/// Addresses of both families from one dual-stack request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assigned {
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
}

/// The clock of the allocator: unix seconds. Injectable so tests of cooldowns and grace
/// periods need not sleep.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock in unix seconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// How long a cached policy (pools, IPAM configuration, node labels, reservations) is
/// used before it is read again; see [`Ipam::with_policy_ttl`].
pub const DEFAULT_POLICY_TTL: Duration = Duration::from_secs(1);
