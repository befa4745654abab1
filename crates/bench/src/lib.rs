//! tern-bench: the benchmarks behind the `tern-bench` binary, kept out of the product crates so
//! that `ternctl` and `tern-lab` link neither the agent nor its async runtime.
//!
//! Modules: [`bench`] (CNI ADD/DEL latency of tern beside the reference plugins, a module per
//! job), [`netbench`] (cross-node throughput and route convergence in a lab), [`policybench`]
//! (programming 1,000 policies and the latency of one change, per-packet cost), [`policyprop`]
//! (cross-node policy propagation), [`flowbench`] (flow records kept per second, memory with a
//! full ring). Labs are built with [`tern_lab`]; figures are in
//! `docs/benchmarks.md`.

pub mod bench;
pub mod flowbench;
pub mod netbench;
pub mod policybench;
pub mod policyprop;
