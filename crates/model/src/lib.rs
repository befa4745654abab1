//! tern-model
