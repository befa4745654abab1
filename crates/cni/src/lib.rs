//! tern-cni: the CNI specification (0.1.0 to 1.1.0) as a library.
//!
//! Pure data handling with no Linux calls except running a delegated plugin
//! binary. A plugin's `main()` reads its input with [`Environment::from_env`]
//! and [`NetConf::parse`], prints [`CniResult::to_json`] in the version the
//! configuration asked for, or [`CniError::to_json`] with a non-zero exit.
//!
//! ```
//! use tern_cni::{CniResult, Environment, NetConf};
//!
//! let env = Environment::from_vars(|k| match k {
//!     "CNI_COMMAND" => Some("ADD".into()),
//!     "CNI_CONTAINERID" => Some("c1".into()),
//!     "CNI_NETNS" => Some("/run/netns/c1".into()),
//!     "CNI_IFNAME" => Some("eth0".into()),
//!     "CNI_PATH" => Some("/opt/cni/bin".into()),
//!     _ => None,
//! })
//! .unwrap();
//! let conf = NetConf::parse(br#"{"cniVersion":"0.3.1","name":"n","type":"tern"}"#).unwrap();
//! let out = CniResult::default().to_json(conf.cni_version);
//! assert_eq!(out["cniVersion"], "0.3.1");
//! assert_eq!(env.ifname, "eth0");
//! ```

#![forbid(unsafe_code)]

pub mod args;
pub mod code;
pub mod conf;
pub mod delegate;
pub mod env;
pub mod error;
pub mod result;
pub mod version;

pub use args::CniArgs;
pub use conf::{
    Attachment, CniConventionArgs, ConfArgs, ConfList, Ipam, Label, NetConf, RuntimeConfig,
    valid_attachments,
};
pub use delegate::{delegate, find_plugin};
pub use env::{Command, Environment};
pub use error::CniError;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use version::{SUPPORTED_VERSIONS, Version, version_output, version_output_for_stdin};
