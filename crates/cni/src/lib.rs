//! tern-cni
