//! The error codes of the agent's replies: CNI's well-known codes (below 100) and tern's own
//! (100 and up), shared by the CNI operations and the socket server.

pub const INVALID_ENV: u32 = 4;
pub const INVALID_CONFIG: u32 = 7;
pub const TRY_AGAIN: u32 = 11;
pub const NOT_AVAILABLE: u32 = 50;
pub const POOL_EXHAUSTED: u32 = 100;
pub const INTERNAL: u32 = 101;
pub const INTERFACE: u32 = 102;
pub const ADDRESS_UNAVAILABLE: u32 = 103;
pub const CHECK_FAILED: u32 = 104;
