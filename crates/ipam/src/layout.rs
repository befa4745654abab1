//! Where blocks lie in a pool: the n-th block, an address's offset, the node's starting
//! point (a stable hash).

use std::net::IpAddr;

use ipnet::IpNet;

/// FNV-1a: a stable hash, so a node walks the pool's blocks in the same order across restarts
/// and nodes start at different places.
pub(crate) fn node_hash(node: &str) -> u64 {
    node.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// The `index`-th block of `block_size` within `pool`.
/// How far `addr` lies from `pool`'s network address.
pub(crate) fn net_offset(pool: &IpNet, addr: &IpAddr) -> u128 {
    match (pool, addr) {
        (IpNet::V4(n), IpAddr::V4(a)) => {
            (u32::from(*a) as u128).wrapping_sub(u32::from(n.network()) as u128)
        }
        (IpNet::V6(n), IpAddr::V6(a)) => u128::from(*a).wrapping_sub(u128::from(n.network())),
        _ => 0,
    }
}

pub(crate) fn nth_block(pool: &IpNet, block_size: u8, index: u128) -> IpNet {
    let shift = pool.max_prefix_len() - block_size;
    match pool {
        IpNet::V4(n) => {
            let base = u32::from(n.network()) as u128 + (index << shift);
            IpNet::new(IpAddr::V4((base as u32).into()), block_size).expect("valid prefix")
        }
        IpNet::V6(n) => {
            let base = u128::from(n.network()) + (index << shift);
            IpNet::new(IpAddr::V6(base.into()), block_size).expect("valid prefix")
        }
    }
}

pub(crate) fn family_of(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 4,
        IpNet::V6(_) => 6,
    }
}
