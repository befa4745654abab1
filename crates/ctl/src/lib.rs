//! ternctl
