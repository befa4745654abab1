//! tern-lab
