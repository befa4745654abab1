//! tern-ipam
