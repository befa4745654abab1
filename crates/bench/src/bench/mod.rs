//! The CNI benchmark harness behind `tern-bench cni`.
//!
//! It times plugin executions exactly as a container runtime performs them (environment variables,
//! network configuration on stdin, result on stdout) for tern and, in the same run, for the
//! reference `ptp` + `host-local` plugins, so the figures are comparable on one machine.
//!
//! Safety: everything happens inside a private network and mount namespace entered with
//! [`enter_private_namespaces`]; [`setup_bench_host`] refuses to run in PID 1's network namespace.
//! Pods are network namespaces bind-mounted into a temporary directory, so nothing is left on the
//! machine: the mounts die with the private mount namespace even if the harness crashes.
//!
//! Only the plugin executions are timed; namespace creation, `ip` set-up and the runtime's result
//! cache are not.
//!
//! Modules, one job each (this one only declares them and re-exports their public items):
//! `cni` (CNI version, interface name, commands), `error` ([`BenchError`]), `stats`
//! (percentiles, [`Summary`]), `result` (CNI results and errors), `isolation` (the private
//! namespaces, the bench host, pod namespaces), `plugin_exec` (plugin sets, one timed execution,
//! the result cache), `phases` (sequential and concurrent phases), `agent_proc` (the `ternd`
//! process and its RSS), `binaries` (stripped sizes, ELF linkage), `log_scrape` (ternd's split
//! from its debug log), `report` ([`CniReport`], the targets, the table) and `run` ([`run_cni`]).

mod agent_proc;
mod binaries;
mod cni;
mod error;
mod isolation;
mod log_scrape;
mod phases;
mod plugin_exec;
mod report;
mod result;
mod run;
mod stats;

pub use self::agent_proc::{Agent, parse_vm_rss_kib, vm_rss_kib};
pub use self::binaries::{BinarySize, Linkage, elf_linkage, parse_elf_linkage, stripped_size};
pub use self::cni::{CNI_VERSION, CniCommand, POD_IFNAME};
pub use self::error::BenchError;
pub use self::isolation::{
    PodNetns, UPLINK_ADDR, UPLINK_GATEWAY, UPLINK_IF, ensure_isolated, enter_private_namespaces,
    setup_bench_host,
};
pub use self::log_scrape::{AgentSplit, SPLIT_ENV, agent_split};
pub use self::phases::{Phase, PhaseResult, Workload, measure};
pub use self::plugin_exec::{
    AddResult, Invocation, Plugin, PluginSet, Pod, REFERENCE_PLUGIN_DIR, REFERENCE_SUBNET,
    ResultCache, invoke,
};
pub use self::report::{CniReport, targets};
pub use self::result::{describe_failure, parse_result_ips};
pub use self::run::{CniBenchOptions, run_cni};
pub use self::stats::{Summary, percentile};
