//! ternd
