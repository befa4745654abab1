//! tern-policy
