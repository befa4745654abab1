//! tern-linux
