//! The CNI plugins `tern` and `tern-ipam`: small synchronous clients of `ternd`.
//!
//! A call reads the environment and stdin, validates them with `tern-cni`, sends one request to
//! the agent over its unix socket (with the pod's netns fd for ADD and CHECK), and prints the
//! result in the version the runtime asked for. The only work done here without the agent is a
//! DEL while the agent is down: the plugin removes the host veth itself and journals the release
//! for ternd to complete at start.

pub mod config;
pub mod log;
pub mod pod_cidr;

use config::{TernConf, TernIpamConf};
use log::{Level, Logger};
use serde_json::Value;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;
use tern_api::{
    AddRequest, Attachment, CallError, CheckRequest, DelRequest, ErrorReply, GcRequest,
    IpamAddRequest, IpamRequest, NetResult, PodRef, Reply, Request,
};
use tern_cni::{CniError, CniResult, Command, Environment, NetConf, Version};

/// How long a plugin waits for the agent.
const AGENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest network configuration read from stdin: 1 MiB (a tern configuration is a few KiB;
/// the agent's frame limit, [`tern_api::MAX_FRAME`], is the same).
pub const MAX_STDIN: usize = 1 << 20;
/// The IPAM type that the agent serves itself, without executing a second plugin.
pub const TERN_IPAM: &str = "tern-ipam";

/// Which binary is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    Tern,
    TernIpam,
}

/// Entry point of both binaries: runs the command and exits with the CNI conventions.
pub fn main(plugin: Plugin) -> ! {
    let mut stdin = Vec::new();
    let read = read_bounded(std::io::stdin().lock(), &mut stdin);
    let version = peek_version(&stdin);
    let out = match read {
        Ok(()) => run(plugin, &stdin),
        Err(e) => Err(e),
    };
    match out {
        Ok(Some(s)) => {
            println!("{s}");
            std::process::exit(0)
        }
        Ok(None) => std::process::exit(0),
        Err(e) => {
            println!("{}", e.to_json(&version));
            std::process::exit(1)
        }
    }
}

/// Reads the network configuration, at most [`MAX_STDIN`] bytes: a larger one is code 7 naming
/// the limit (and is not read further, so a runaway writer cannot grow the plugin).
pub fn read_bounded(input: impl Read, out: &mut Vec<u8>) -> Result<(), CniError> {
    input
        .take(MAX_STDIN as u64 + 1)
        .read_to_end(out)
        .map_err(|e| CniError::io(format!("reading the network configuration from stdin: {e}")))?;
    if out.len() > MAX_STDIN {
        return Err(CniError::invalid_config(format!(
            "the network configuration on stdin is larger than {MAX_STDIN} bytes (tern's limit)"
        )));
    }
    Ok(())
}

/// The cniVersion to put in an error, before the configuration is known to be valid.
fn peek_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(|s| s.as_str())
                .map(str::to_string)
        })
        .filter(|s| Version::parse(s).is_some())
        .unwrap_or_else(|| Version::LATEST.as_str().to_string())
}

/// Everything one invocation knows.
struct Call<'a> {
    env: Environment,
    conf: NetConf,
    tern: TernConf,
    stdin: &'a [u8],
    log: Logger,
}

/// Runs one command; `Ok(Some(json))` is printed on stdout.
pub fn run(plugin: Plugin, stdin: &[u8]) -> Result<Option<String>, CniError> {
    let env = Environment::from_env()?;
    if env.command == Command::Version {
        return Ok(Some(tern_cni::version_output_for_stdin(stdin)));
    }
    let (conf, tern): (NetConf, TernConf) = NetConf::parse_with(stdin)?;
    // A prefix ternd would refuse: refused here too, before it names or deletes anything.
    if let Some(p) = &tern.interface_prefix {
        tern_linux::validate_interface_prefix(p)
            .map_err(|e| CniError::invalid_config(format!("interface_prefix: {e}")))?;
    }
    let v = conf.cni_version;
    match env.command {
        Command::Check if !v.has_check() => {
            return Err(CniError::incompatible_version(format!(
                "config version {} does not allow CHECK (needs 0.4.0 or later)",
                v.as_str()
            )));
        }
        Command::Gc | Command::Status if !v.has_gc_status() => {
            return Err(CniError::incompatible_version(format!(
                "config version {} does not allow {} (needs 1.1.0)",
                v.as_str(),
                env.command
            )));
        }
        _ => {}
    }
    let prefix = match plugin {
        Plugin::Tern => "tern",
        Plugin::TernIpam => "tern-ipam",
    };
    let log = Logger::new(
        tern.log_level.as_deref(),
        tern.log_file_path.as_deref(),
        tern.log_file_max_size,
        format!(
            "{prefix} {} {}/{}",
            env.command, env.container_id, env.ifname
        ),
    );
    if log.enabled(Level::Debug) {
        let ignored = tern.ignored_keys();
        if !ignored.is_empty() {
            log.log(
                Level::Debug,
                &format!("accepted and not used by tern: {}", ignored.join(", ")),
            );
        }
    }
    let call = Call {
        env,
        conf,
        tern,
        stdin,
        log,
    };
    let out = match plugin {
        Plugin::Tern => call.tern(),
        Plugin::TernIpam => call.tern_ipam(),
    };
    if let Err(e) = &out {
        call_log_error(&call, e);
    }
    out
}

fn call_log_error(call: &Call, e: &CniError) {
    call.log
        .log(Level::Error, &format!("code {}: {}", e.code, e.msg));
}

/// A failed call as the runtime should see it: only an absent agent is `down`; a refused
/// caller, an oversized request and a broken connection say what they are.
fn call_error(e: CallError, down: impl FnOnce(String) -> CniError) -> CniError {
    match e {
        CallError::AgentDown(m) => down(m),
        CallError::Denied(m) => CniError::io(format!(
            "{m}: ternd's socket admits only root and its --socket-group"
        )),
        e @ CallError::TooLarge { .. } => CniError::invalid_config(e.to_string()),
        CallError::Io(m) => CniError::io(m),
    }
}

fn from_reply(e: ErrorReply) -> CniError {
    CniError::new(e.code, e.msg).with_details(e.details)
}

impl Call<'_> {
    fn ipam_type(&self) -> &str {
        self.conf
            .ipam
            .as_ref()
            .map(|i| i.plugin_type.as_str())
            .unwrap_or(TERN_IPAM)
    }

    fn delegated(&self) -> bool {
        self.ipam_type() != TERN_IPAM
    }

    fn attachment(&self) -> Attachment {
        let args = &self.env.args;
        let pod = match (&args.pod_namespace, &args.pod_name) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some(PodRef {
                namespace: ns.clone(),
                name: name.clone(),
                infra_container_id: args.pod_infra_container_id.clone().unwrap_or_default(),
                uid: args.pod_uid.clone().unwrap_or_default(),
            }),
            _ => None,
        };
        Attachment {
            network: self.conf.name.clone(),
            container_id: self.env.container_id.clone(),
            ifname: self.env.ifname.clone(),
            netns_path: self
                .env
                .netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            pod,
        }
    }

    fn agent_down_hint(&self, why: &str) -> String {
        format!(
            "ternd is not running on this node ({why}). Start the agent, e.g. `ternd --node-name $(hostname) \
             --store sqlite:///var/lib/tern/store.db --socket {}`, then retry",
            self.tern.agent_socket().display()
        )
    }

    /// Sends a request; an unreachable agent is `Err(CallError)`, an agent error `Ok(Err)`.
    fn call(
        &self,
        req: &Request,
        fd: Option<&File>,
    ) -> Result<Result<Reply, ErrorReply>, CallError> {
        tern_api::call(
            &self.tern.agent_socket(),
            req,
            fd.map(|f| f.as_raw_fd()),
            AGENT_TIMEOUT,
        )
    }

    /// Like [`Call::call`], with an unreachable agent turned into `down(message)`.
    fn call_or(
        &self,
        req: &Request,
        fd: Option<&File>,
        down: fn(String) -> CniError,
    ) -> Result<Reply, CniError> {
        match self.call(req, fd) {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(from_reply(e)),
            Err(e) => Err(call_error(e, |m| down(self.agent_down_hint(&m)))),
        }
    }

    /// Opens CNI_NETNS and makes sure it is a network namespace.
    fn open_netns(&self) -> Result<File, CniError> {
        let Some(path) = &self.env.netns else {
            return Err(CniError::invalid_env(
                "required env variable CNI_NETNS is missing",
            ));
        };
        open_netns(path)
    }

    fn ipam_request(&self) -> Result<IpamRequest, CniError> {
        let mut req = IpamRequest::default();
        if let Some(ipam) = &self.conf.ipam {
            let ic: TernIpamConf = serde_path_to_error::deserialize(Value::Object(
                ipam.extra.clone(),
            ))
            .map_err(|e| {
                CniError::invalid_config(format!(
                    "invalid network config: field `ipam.{}`: {}",
                    e.path(),
                    e.inner()
                ))
            })?;
            req.assign_ipv4 = ic.assign_ipv4.unwrap_or(true);
            req.assign_ipv6 = ic.assign_ipv6.unwrap_or(false);
            req.ipv4_pools = ic.ipv4_pools;
            req.ipv6_pools = ic.ipv6_pools;
        }
        let mut requested: Vec<String> = Vec::new();
        if let Some(rc) = &self.conf.runtime_config {
            requested.extend(rc.ips.iter().cloned());
        }
        if let Some(ip) = &self.env.args.ip {
            requested.extend(
                ip.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            );
        }
        if let Some(cni) = self.conf.args.as_ref().and_then(|a| a.cni.as_ref()) {
            requested.extend(cni.ips.iter().cloned());
        }
        requested.dedup();
        req.requested = requested;
        req.ip_addrs_no_ipam = self
            .tern
            .feature_control
            .as_ref()
            .is_some_and(|f| f.ip_addrs_no_ipam);
        Ok(req)
    }

    fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.conf
            .args
            .as_ref()
            .and_then(|a| a.cni.as_ref())
            .map(|c| c.labels_map())
            .unwrap_or_default()
    }

    /// `args.cni.ports` for the agent (validated by [`NetConf::parse`]).
    fn ports(&self) -> Result<Vec<tern_api::NamedPort>, CniError> {
        let Some(cni) = self.conf.args.as_ref().and_then(|a| a.cni.as_ref()) else {
            return Ok(Vec::new());
        };
        cni.ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let protocol = p.protocol().ok_or_else(|| {
                    CniError::invalid_config(format!(
                        "invalid network config: args.cni.ports[{i}].protocol: {:?} is not TCP, UDP or SCTP",
                        p.protocol.as_deref().unwrap_or_default()
                    ))
                })?;
                Ok(tern_api::NamedPort {
                    name: p.name.clone(),
                    port: p.container_port,
                    protocol: protocol.as_str().to_string(),
                })
            })
            .collect()
    }

    fn delegate(&self, command: Command) -> Result<Option<Value>, CniError> {
        // `ipam.subnet: usePodCidr` (Calico's host-local convention): the node's podCIDR.
        if let Some(conf) = pod_cidr::resolve(self.stdin, &self.tern.state_dir())? {
            return tern_cni::delegate(self.ipam_type(), command, &conf, &self.env);
        }
        tern_cni::delegate(self.ipam_type(), command, self.stdin, &self.env)
    }

    // ---- tern ----

    fn tern(&self) -> Result<Option<String>, CniError> {
        match self.env.command {
            Command::Add => self.add(),
            Command::Del => self.del().map(|_| None),
            Command::Check => self.check().map(|_| None),
            Command::Gc => self.gc().map(|_| None),
            Command::Status => self.status().map(|_| None),
            Command::Version => unreachable!("handled before parsing"),
        }
    }

    fn add(&self) -> Result<Option<String>, CniError> {
        // Everything that can be refused is checked before anything is created.
        let prev = match &self.conf.prev_result {
            Some(p) => Some(CniResult::from_json(p).map_err(|e| {
                CniError::new(e.code, format!("prevResult: {}", e.msg)).with_details(e.details)
            })?),
            None => None,
        };
        let netns = self.open_netns()?;
        let mut req = AddRequest {
            attachment: self.attachment(),
            mtu: self.tern.mtu,
            ipam: IpamRequest::default(),
            delegated_ips: None,
            mac: self
                .conf
                .runtime_config
                .as_ref()
                .and_then(|r| r.mac.clone()),
            allow_ip_forwarding: self
                .tern
                .container_settings
                .as_ref()
                .is_some_and(|c| c.allow_ip_forwarding),
            labels: self.labels(),
            ports: self.ports()?,
        };
        if self.delegated() {
            // Exit 0 with no output may still have allocated: undone like a bad result.
            let Some(out) = self.delegate(Command::Add)? else {
                self.undo_delegated_add();
                return Err(CniError::decode(format!(
                    "IPAM plugin {:?} returned no result",
                    self.ipam_type()
                )));
            };
            let r = match CniResult::from_json(&out) {
                Ok(r) => r,
                Err(e) => {
                    self.undo_delegated_add();
                    return Err(e);
                }
            };
            if r.ips.is_empty() {
                self.undo_delegated_add();
                return Err(CniError::invalid_config(format!(
                    "IPAM plugin {:?} returned no addresses",
                    self.ipam_type()
                )));
            }
            req.delegated_ips = Some(
                r.ips
                    .iter()
                    .map(|ip| tern_api::IpConfig {
                        address: ip.address.to_string(),
                        gateway: ip.gateway.map(|g| g.to_string()),
                        interface: None,
                    })
                    .collect(),
            );
        } else {
            req.ipam = self.ipam_request()?;
        }
        let reply = match self.call(&Request::Add(req), Some(&netns)) {
            Ok(Ok(r)) => r,
            // The ADD was sent and the answer lost (timeout, the agent died mid-request): the
            // agent may still complete it, so it is undone like a bad answer (DEL is
            // idempotent) rather than left for the runtime's DEL.
            Err(e @ CallError::Io(_)) => {
                self.rollback_add();
                return Err(call_error(e, CniError::try_again_later));
            }
            other => {
                if self.delegated() {
                    self.undo_delegated_add();
                }
                return Err(match other {
                    Ok(Err(e)) => from_reply(e),
                    Err(e) => {
                        call_error(e, |m| CniError::try_again_later(self.agent_down_hint(&m)))
                    }
                    Ok(Ok(_)) => unreachable!("matched above"),
                });
            }
        };
        let converted = match reply {
            Reply::Result(nr) => to_cni_result(&nr).map(|r| (nr, r)),
            _ => Err(CniError::agent("ternd answered ADD without a result")),
        };
        let (nr, mut result) = match converted {
            Ok(x) => x,
            Err(e) => {
                // The pod is wired but the runtime will see a failure: undo it all.
                self.rollback_add();
                return Err(e);
            }
        };
        if let Some(dns) = &self.conf.dns {
            result.dns = dns.clone();
        }
        if let Some(prev) = prev {
            result = merge_prev(prev, result);
        }
        self.log.log(
            Level::Info,
            &format!(
                "ADD ok: {}",
                nr.ips
                    .iter()
                    .map(|i| i.address.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        );
        Ok(Some(result.to_json(self.conf.cni_version).to_string()))
    }

    /// Undoes an ADD the agent completed when the plugin cannot report it: DEL through the agent,
    /// then the delegated IPAM's DEL.
    fn rollback_add(&self) {
        let req = Request::Del(DelRequest {
            attachment: self.attachment(),
            delegated_ipam: self.delegated(),
        });
        match self.call(&req, None) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self
                .log
                .log(Level::Warn, &format!("undoing ADD: DEL failed: {}", e.msg)),
            Err(e) => self
                .log
                .log(Level::Warn, &format!("undoing ADD: DEL failed: {e}")),
        }
        if self.delegated() {
            self.undo_delegated_add();
        }
    }

    /// Releases what a delegated IPAM ADD allocated when the rest of ADD fails (spec: the
    /// main plugin runs the IPAM DEL before returning the failure).
    fn undo_delegated_add(&self) {
        if let Err(e) = self.delegate(Command::Del) {
            self.log
                .log(Level::Warn, &format!("undoing IPAM ADD: {}", e.msg));
        }
    }

    fn del(&self) -> Result<(), CniError> {
        let attachment = self.attachment();
        let req = Request::Del(DelRequest {
            attachment: attachment.clone(),
            delegated_ipam: self.delegated(),
        });
        match self.call(&req, None) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(from_reply(e)),
            // A refused caller or an oversized request is not an absent agent: the plugin
            // must not tear down on its own behalf.
            Err(e @ (CallError::Denied(_) | CallError::TooLarge { .. })) => {
                return Err(call_error(e, CniError::io));
            }
            Err(e) => self.del_without_agent(&attachment, &e.to_string())?,
        }
        if self.delegated() {
            self.delegate(Command::Del)?;
        }
        Ok(())
    }

    /// DEL while ternd is down: remove the host veth here, journal the release for ternd.
    fn del_without_agent(&self, a: &Attachment, why: &str) -> Result<(), CniError> {
        let pod = a
            .pod
            .as_ref()
            .map(|p| (p.namespace.as_str(), p.name.as_str()));
        let host_if = tern_linux::attachment_veth_name(
            self.tern.interface_prefix(),
            pod,
            &a.container_id,
            &a.ifname,
        );
        // The derived name is shared by every sandbox of the pod: the veth goes only when it is
        // this sandbox's, i.e. its peer is CNI_IFNAME inside CNI_NETNS. Otherwise (another
        // sandbox's veth, no or a gone netns) the release is only journaled, naming the veth,
        // and ternd decides (it keeps a veth that another endpoint owns).
        match veth_peers_pod(&host_if, self.env.netns.as_deref(), &a.ifname) {
            Ok(true) => {}
            Ok(false) => {
                self.log.log(
                    Level::Info,
                    &format!(
                        "ternd is down ({why}); interface {host_if} is not the peer of {} in CNI_NETNS: journaling only",
                        a.ifname
                    ),
                );
                return self.journal_release(a, host_if, why);
            }
            Err(e) => {
                self.log.log(
                    Level::Warn,
                    &format!("ternd is down ({why}); not deleting interface {host_if}: {e}"),
                );
                return self.journal_release(a, host_if, why);
            }
        }
        // Only tern's own pod veth goes: a device of that name that is not a veth with the
        // interface prefix (a bridge, a NIC, a prefix configured empty) is left alone.
        match tern_linux::delete_pod_veth(&host_if, self.tern.interface_prefix()) {
            Ok(tern_linux::Deleted::Refused(not_ours)) => self.log.log(
                Level::Warn,
                &format!("ternd is down ({why}); not deleting interface {host_if}: {not_ours}"),
            ),
            Ok(_) => {}
            Err(e) => {
                return Err(CniError::io(format!(
                    "ternd is down ({why}) and removing {host_if} failed: {e}"
                )));
            }
        }
        // Deleted here already: the journal only asks for the release.
        self.journal_release(a, String::new(), why)
    }

    /// Journals the release of `a` for ternd to complete.
    fn journal_release(
        &self,
        a: &Attachment,
        host_ifname: String,
        why: &str,
    ) -> Result<(), CniError> {
        let entry = tern_api::journal::JournalEntry {
            attachment: a.clone(),
            host_ifname,
            delegated_ipam: self.delegated(),
            source: "plugin".into(),
        };
        let path = tern_api::journal::record(&self.tern.state_dir(), &entry).map_err(|e| {
            CniError::io(format!(
                "ternd is down ({why}) and the release journal in {} cannot be written: {e}",
                self.tern.state_dir().display()
            ))
        })?;
        self.log.log(
            Level::Warn,
            &format!(
                "ternd is down ({why}); release journaled at {}",
                path.display()
            ),
        );
        Ok(())
    }

    fn check(&self) -> Result<(), CniError> {
        let netns = self.open_netns()?;
        let prev = match &self.conf.prev_result {
            Some(p) => Some(to_api_result(&CniResult::from_json(p)?)),
            None => None,
        };
        let req = Request::Check(CheckRequest {
            attachment: self.attachment(),
            prev_result: prev,
        });
        self.call_or(&req, Some(&netns), CniError::try_again_later)?;
        if self.delegated() {
            self.delegate(Command::Check)?;
        }
        Ok(())
    }

    fn gc(&self) -> Result<(), CniError> {
        let valid = tern_cni::conf::valid_attachments(&self.conf);
        let req = Request::Gc(GcRequest {
            network: self.conf.name.clone(),
            valid,
            delegated_ipam: self.delegated(),
        });
        let mut errors = Vec::new();
        if let Err(e) = self.call_or(&req, None, CniError::try_again_later) {
            errors.push(e);
        }
        if self.delegated()
            && let Err(e) = self.delegate(Command::Gc)
        {
            errors.push(e);
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(CniError::new(
                errors[0].code,
                errors
                    .iter()
                    .map(|e| e.msg.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
        }
    }

    fn status(&self) -> Result<(), CniError> {
        self.call_or(&Request::Status, None, CniError::not_available)?;
        if self.delegated() {
            self.delegate(Command::Status)?;
        }
        Ok(())
    }

    // ---- tern-ipam ----

    fn tern_ipam(&self) -> Result<Option<String>, CniError> {
        let a = self.attachment();
        match self.env.command {
            Command::Add => {
                let req = Request::IpamAdd(IpamAddRequest {
                    attachment: a,
                    ipam: self.ipam_request()?,
                });
                let Reply::Result(nr) = self.call_or(&req, None, CniError::try_again_later)? else {
                    return Err(CniError::agent("ternd answered IPAM ADD without a result"));
                };
                let r = to_cni_result(&nr)?;
                Ok(Some(r.to_json(self.conf.cni_version).to_string()))
            }
            Command::Del => {
                match self.call(&Request::IpamDel(a.clone()), None) {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(from_reply(e)),
                    Err(e @ (CallError::Denied(_) | CallError::TooLarge { .. })) => {
                        return Err(call_error(e, CniError::io));
                    }
                    Err(e) => {
                        let entry = tern_api::journal::JournalEntry {
                            attachment: a,
                            host_ifname: String::new(),
                            delegated_ipam: false,
                            source: "plugin".into(),
                        };
                        tern_api::journal::record(&self.tern.state_dir(), &entry).map_err(|je| {
                            CniError::io(format!("ternd is down ({e}) and the release journal cannot be written: {je}"))
                        })?;
                    }
                }
                Ok(None)
            }
            Command::Check => self
                .call_or(&Request::IpamCheck(a), None, CniError::try_again_later)
                .map(|_| None),
            Command::Gc => {
                let valid = tern_cni::conf::valid_attachments(&self.conf);
                let req = Request::Gc(GcRequest {
                    network: self.conf.name.clone(),
                    valid,
                    delegated_ipam: false,
                });
                self.call_or(&req, None, CniError::try_again_later)
                    .map(|_| None)
            }
            Command::Status => self
                .call_or(&Request::Status, None, CniError::not_available)
                .map(|_| None),
            Command::Version => unreachable!("handled before parsing"),
        }
    }
}

/// Opens a netns path, with errors naming CNI_NETNS (code 4). The open never blocks (a FIFO
/// given as CNI_NETNS would otherwise wait for a writer forever), and the file must be a
/// network namespace: nsfs, and `NS_GET_NSTYPE` says CLONE_NEWNET.
pub fn open_netns(path: &Path) -> Result<File, CniError> {
    use tern_linux::netns::NsFileError;
    match tern_linux::netns::open_nonblocking(path) {
        Ok(fd) => Ok(File::from(fd)),
        Err(NsFileError::Open(e)) => Err(CniError::invalid_env(format!(
            "CNI_NETNS {}: cannot open the network namespace: {e}",
            path.display()
        ))),
        Err(NsFileError::NotNet(_)) => Err(CniError::invalid_env(format!(
            "CNI_NETNS {}: a namespace of another type, not a network namespace",
            path.display()
        ))),
        Err(_) => Err(CniError::invalid_env(format!(
            "CNI_NETNS {}: not a network namespace (not a namespace file)",
            path.display()
        ))),
    }
}

/// Whether the host veth `host_if` (in the current namespace) and the device `ifname` inside
/// the network namespace at `netns` are the two ends of one veth pair: each one's `IFLA_LINK`
/// is the other's index. False when the host veth, the namespace or the device is missing.
pub fn veth_peers_pod(host_if: &str, netns: Option<&Path>, ifname: &str) -> Result<bool, String> {
    let Some(path) = netns.filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(false);
    };
    let mut h = tern_linux::netlink::Handle::new().map_err(|e| e.to_string())?;
    let Some(host) = h.link_by_name(host_if).map_err(|e| e.to_string())? else {
        return Ok(false);
    };
    let (Some(peer_index), Some(_)) = (host.peer_index, host.link_netnsid) else {
        // The peer is in this namespace (a half-made pair) or the device is no veth.
        return Ok(false);
    };
    let ns = match tern_linux::netns::open_nonblocking(path) {
        Ok(fd) => tern_linux::netns::NetNs::from_fd(fd),
        Err(_) => return Ok(false),
    };
    let pod = ns
        .run(|| tern_linux::netlink::Handle::new().and_then(|mut h| h.link_by_name(ifname)))
        .and_then(|r| r)
        .map_err(|e| e.to_string())?;
    Ok(pod.is_some_and(|p| {
        p.index == peer_index
            && p.peer_index == Some(host.index)
            && p.kind.as_deref() == Some("veth")
    }))
}

/// The agent's result in tern-cni's model.
pub fn to_cni_result(nr: &NetResult) -> Result<CniResult, CniError> {
    let bad =
        |what: &str, v: &str| CniError::agent(format!("ternd returned an invalid {what} {v:?}"));
    let mut r = CniResult::default();
    for i in &nr.interfaces {
        r.interfaces.push(tern_cni::Interface {
            name: i.name.clone(),
            mac: (!i.mac.is_empty()).then(|| i.mac.clone()),
            mtu: i.mtu,
            sandbox: (!i.sandbox.is_empty()).then(|| i.sandbox.clone()),
            ..Default::default()
        });
    }
    for ip in &nr.ips {
        r.ips.push(tern_cni::IpConfig {
            address: ip
                .address
                .parse()
                .map_err(|_| bad("address", &ip.address))?,
            gateway: match &ip.gateway {
                Some(g) => Some(g.parse().map_err(|_| bad("gateway", g))?),
                None => None,
            },
            interface: ip.interface,
        });
    }
    for rt in &nr.routes {
        let mut route = tern_cni::Route::new(rt.dst.parse().map_err(|_| bad("route", &rt.dst))?);
        if let Some(g) = &rt.gw {
            route = route.via(g.parse().map_err(|_| bad("gateway", g))?);
        }
        r.routes.push(route);
    }
    Ok(r)
}

/// tern-cni's result in the agent's model (for CHECK's prevResult).
pub fn to_api_result(r: &CniResult) -> NetResult {
    NetResult {
        interfaces: r
            .interfaces
            .iter()
            .map(|i| tern_api::Interface {
                name: i.name.clone(),
                mac: i.mac.clone().unwrap_or_default(),
                sandbox: i.sandbox.clone().unwrap_or_default(),
                mtu: i.mtu,
            })
            .collect(),
        ips: r
            .ips
            .iter()
            .map(|i| tern_api::IpConfig {
                address: i.address.to_string(),
                gateway: i.gateway.map(|g| g.to_string()),
                interface: i.interface,
            })
            .collect(),
        routes: r
            .routes
            .iter()
            .map(|rt| tern_api::Route {
                dst: rt.dst.to_string(),
                gw: rt.gw.map(|g| g.to_string()),
            })
            .collect(),
    }
}

/// Appends our result to a previous plugin's (when tern is not first in a chain).
fn merge_prev(mut prev: CniResult, ours: CniResult) -> CniResult {
    let offset = prev.interfaces.len();
    prev.interfaces.extend(ours.interfaces);
    prev.ips.extend(ours.ips.into_iter().map(|mut ip| {
        ip.interface = ip.interface.map(|i| i + offset);
        ip
    }));
    prev.routes.extend(ours.routes);
    if prev.dns.is_empty() {
        prev.dns = ours.dns;
    }
    prev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_conversion_round_trip() {
        let nr = NetResult {
            interfaces: vec![
                tern_api::Interface {
                    name: "ternabc".into(),
                    mac: "ee:ee:ee:ee:ee:ee".into(),
                    sandbox: String::new(),
                    mtu: None,
                },
                tern_api::Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:01".into(),
                    sandbox: "/run/netns/x".into(),
                    mtu: Some(1500),
                },
            ],
            ips: vec![tern_api::IpConfig {
                address: "10.244.0.5/32".into(),
                gateway: None,
                interface: Some(1),
            }],
            routes: vec![tern_api::Route {
                dst: "0.0.0.0/0".into(),
                gw: None,
            }],
        };
        let r = to_cni_result(&nr).unwrap();
        let j = r.to_json(Version::parse("0.3.1").unwrap());
        assert_eq!(j["ips"][0]["version"], "4");
        assert_eq!(j["ips"][0]["interface"], 1);
        assert_eq!(j["interfaces"][1]["sandbox"], "/run/netns/x");
        assert!(j["interfaces"][0].get("sandbox").is_none());
        assert_eq!(to_api_result(&r), nr);
    }

    #[test]
    fn bad_agent_result_is_an_error() {
        let nr = NetResult {
            ips: vec![tern_api::IpConfig {
                address: "nope".into(),
                gateway: None,
                interface: None,
            }],
            ..Default::default()
        };
        let e = to_cni_result(&nr).unwrap_err();
        assert!(e.msg.contains("nope"));
    }

    #[test]
    fn merge_shifts_interface_indices() {
        let mut prev = CniResult::default();
        prev.interfaces.push(tern_cni::Interface {
            name: "lo".into(),
            ..Default::default()
        });
        let mut ours = CniResult::default();
        ours.interfaces.push(tern_cni::Interface {
            name: "eth0".into(),
            ..Default::default()
        });
        ours.ips.push(tern_cni::IpConfig {
            address: "10.0.0.1/32".parse().unwrap(),
            gateway: None,
            interface: Some(0),
        });
        let m = merge_prev(prev, ours);
        assert_eq!(m.interfaces.len(), 2);
        assert_eq!(m.ips[0].interface, Some(1));
    }

    #[test]
    fn stdin_is_read_up_to_the_limit() {
        let mut out = Vec::new();
        read_bounded(&vec![b' '; MAX_STDIN][..], &mut out).unwrap();
        assert_eq!(out.len(), MAX_STDIN);
        let mut out = Vec::new();
        // An endless writer: only limit + 1 bytes are ever read.
        let e = read_bounded(std::io::repeat(b'x'), &mut out).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("1048576 bytes"), "{}", e.msg);
        assert_eq!(out.len(), MAX_STDIN + 1);
    }

    #[test]
    fn call_errors_say_what_they_are() {
        let down = |m: String| CniError::try_again_later(format!("down: {m}"));
        let e = call_error(
            CallError::TooLarge {
                len: 2 << 20,
                max: tern_api::MAX_FRAME,
            },
            down,
        );
        assert_eq!(e.code, 7);
        assert!(
            e.msg.contains("over the limit of 1048576 bytes"),
            "{}",
            e.msg
        );
        assert!(!e.msg.contains("not running"), "{}", e.msg);
        let e = call_error(CallError::Denied("permission denied".into()), down);
        assert_eq!(e.code, 5);
        assert!(e.msg.contains("--socket-group"), "{}", e.msg);
        let e = call_error(CallError::AgentDown("refused".into()), down);
        assert_eq!((e.code, e.msg.as_str()), (11, "down: refused"));
    }

    #[test]
    fn a_fifo_or_a_foreign_namespace_is_not_a_netns() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a NUL-terminated path in our temp dir.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Would block forever without O_NONBLOCK (no writer).
        let e = open_netns(&fifo).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_NETNS"), "{}", e.msg);
        let e = open_netns(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("another type"), "{}", e.msg);
        assert!(open_netns(Path::new("/proc/self/ns/net")).is_ok());
    }

    #[test]
    fn peek_version_falls_back() {
        assert_eq!(peek_version(br#"{"cniVersion":"0.3.1"}"#), "0.3.1");
        assert_eq!(peek_version(b"garbage"), "1.1.0");
        assert_eq!(peek_version(br#"{"cniVersion":"9.9.9"}"#), "1.1.0");
    }
}
