//! tern-bgp
