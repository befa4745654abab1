//! One module per `ternctl` command.

pub mod apply;
pub mod delete;
pub mod demo;
pub mod explain;
pub mod flows;
pub mod flows_aggregate;
pub mod flows_kube;
pub mod flows_web;
pub mod get;
pub mod install_cni;
pub mod install_manifest;
pub mod ipam_check;
pub mod ipam_configure;
pub mod ipam_release;
pub mod ipam_show;
pub mod lab;
pub mod label;
pub mod node_status;
pub mod port;
pub mod promote;
