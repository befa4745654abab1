//! The CNI error codes, in one list: the specification's (below 100) and tern's own (100 and
//! up). [`crate::CniError`]'s constructors, the plugins and ternd's replies all use these.

/// 1: the configuration's version is not supported.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// 2: a field of the configuration is not supported.
pub const UNSUPPORTED_FIELD: u32 = 2;
/// 3: the container is unknown or does not exist.
pub const UNKNOWN_CONTAINER: u32 = 3;
/// 4: an environment variable is missing or invalid.
pub const INVALID_ENV: u32 = 4;
/// 5: an I/O operation failed.
pub const IO: u32 = 5;
/// 6: decoding input (JSON) failed.
pub const DECODE: u32 = 6;
/// 7: the network configuration is invalid.
pub const INVALID_CONFIG: u32 = 7;
/// 11: a transient failure; the runtime should try again later.
pub const TRY_AGAIN_LATER: u32 = 11;
/// 50: STATUS: the plugin is not available.
pub const NOT_AVAILABLE: u32 = 50;
/// 51: STATUS: not available, and existing containers may have limited connectivity.
pub const NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
/// 100 (tern): no free address in any usable pool.
pub const POOL_EXHAUSTED: u32 = 100;
/// 101 (tern): the node agent failed (an internal error) or could not be reached.
pub const AGENT: u32 = 101;
/// 102 (tern): the pod's interface could not be set up, or a veth name is taken.
pub const INTERFACE: u32 = 102;
/// 103 (tern): a requested address is not available.
pub const ADDRESS_UNAVAILABLE: u32 = 103;
/// 104 (tern): CHECK found the attachment not as it was set up.
pub const CHECK_FAILED: u32 = 104;
/// 999: a generic failure, e.g. a delegated plugin failed without a readable error.
pub const GENERIC: u32 = 999;
