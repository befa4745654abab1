//! `ternctl port workloadendpoint NAME [-n NS] http=8080/TCP metrics=9090 [name-]`: sets or
//! removes named container ports (`spec.ports`) of an existing WorkloadEndpoint, which policies
//! reference by name (`ports: [{port: http}]`). The agents see the change through their store
//! watch; the agent keeps these ports when it rewrites the endpoint.

use anyhow::{Context, bail};
use tern_model::{EndpointPort, Kind, Protocol, Resource};
use tern_store::Store;

/// One requested change: set a named port (replacing one of the same name) or remove it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortChange {
    /// `name=port[/protocol]`.
    Set(EndpointPort),
    /// `name-`.
    Remove(String),
}

/// Parses one protocol name, case-insensitively.
pub(crate) fn parse_protocol(s: &str) -> Option<Protocol> {
    match s.to_ascii_uppercase().as_str() {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        _ => None,
    }
}

/// Parses `name=port[/protocol]` (protocol TCP, UDP or SCTP in any case; TCP when absent) and
/// `name-` arguments. Every error quotes the argument it is about.
pub fn parse_changes(args: &[String]) -> anyhow::Result<Vec<PortChange>> {
    if args.is_empty() {
        bail!("no port change given: pass name=port[/protocol] to set or name- to remove");
    }
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        let change = if let Some((name, rest)) = a.split_once('=') {
            tern_model::validate_port_name(name).map_err(|e| anyhow::anyhow!("port {a:?}: {e}"))?;
            let (num, proto) = match rest.split_once('/') {
                Some((n, p)) => (n, Some(p)),
                None => (rest, None),
            };
            let port = num
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .with_context(|| format!("port {a:?}: {num:?} is not a port (1-65535)"))?;
            let protocol = match proto {
                None => Protocol::Tcp,
                Some(p) => parse_protocol(p).with_context(|| {
                    format!("port {a:?}: protocol {p:?} is not TCP, UDP or SCTP")
                })?,
            };
            PortChange::Set(EndpointPort {
                name: name.to_string(),
                protocol,
                port,
            })
        } else if let Some(name) = a.strip_suffix('-').filter(|n| !n.is_empty()) {
            tern_model::validate_port_name(name).map_err(|e| anyhow::anyhow!("port {a:?}: {e}"))?;
            PortChange::Remove(name.to_string())
        } else {
            bail!("port {a:?}: expected name=port[/protocol] or name-")
        };
        out.push(change);
    }
    Ok(out)
}

/// Applies the changes in order: a set replaces the port of the same name in place (or
/// appends), a remove drops it (removing an absent name is not an error, as `label key-`).
pub fn apply_changes(ports: &mut Vec<EndpointPort>, changes: &[PortChange]) {
    for c in changes {
        match c {
            PortChange::Set(p) => match ports.iter_mut().find(|q| q.name == p.name) {
                Some(q) => *q = p.clone(),
                None => ports.push(p.clone()),
            },
            PortChange::Remove(name) => ports.retain(|q| &q.name != name),
        }
    }
}

/// `name=port/PROTO,...` for output.
pub fn render(ports: &[EndpointPort]) -> String {
    ports
        .iter()
        .map(|p| {
            let proto = match p.protocol {
                Protocol::Tcp => "TCP",
                Protocol::Udp => "UDP",
                Protocol::Sctp => "SCTP",
                _ => "other",
            };
            format!("{}={}/{proto}", p.name, p.port)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Applies port changes to WorkloadEndpoint `name` in `namespace` (default `default`), which
/// must exist. Returns the resulting ports as `name=port/PROTO,...`.
pub fn port(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    namespace: Option<&str>,
    changes: &[PortChange],
) -> anyhow::Result<String> {
    if kind != Kind::WorkloadEndpoint {
        bail!(
            "ternctl port changes the named ports of a workloadendpoint, not {}",
            kind.as_str()
        );
    }
    let ns = namespace.unwrap_or("default");
    let r = tern_model::get_resource(store, kind, Some(ns), name)?
        .with_context(|| format!("WorkloadEndpoint {name} not found in namespace {ns}"))?;
    let Resource::WorkloadEndpoint(mut w) = r else {
        bail!("{name} in namespace {ns} is not a WorkloadEndpoint");
    };
    apply_changes(&mut w.spec.ports, changes);
    tern_model::put_resource(store, &Resource::WorkloadEndpoint(w.clone()))
        .with_context(|| format!("writing WorkloadEndpoint {name} in namespace {ns}"))?;
    Ok(render(&w.spec.ports))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_model::{WorkloadEndpoint, WorkloadEndpointSpec};

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn ep(name: &str, port: u16, protocol: Protocol) -> EndpointPort {
        EndpointPort {
            name: name.into(),
            protocol,
            port,
        }
    }

    #[test]
    fn port_parses_set_and_remove() {
        let c = parse_changes(&args(&[
            "http=8080/TCP",
            "metrics=9090",
            "dns=53/udp",
            "old-",
        ]))
        .unwrap();
        assert_eq!(
            c,
            vec![
                PortChange::Set(ep("http", 8080, Protocol::Tcp)),
                PortChange::Set(ep("metrics", 9090, Protocol::Tcp)),
                PortChange::Set(ep("dns", 53, Protocol::Udp)),
                PortChange::Remove("old".into()),
            ]
        );
        let c = parse_changes(&args(&["s=3868/Sctp"])).unwrap();
        assert_eq!(c, vec![PortChange::Set(ep("s", 3868, Protocol::Sctp))]);
    }

    #[test]
    fn port_errors_name_the_argument() {
        let cases = [
            ("http=70000", "port \"http=70000\": \"70000\" is not a port"),
            ("http=0", "port \"http=0\": \"0\" is not a port"),
            ("http=", "port \"http=\": \"\" is not a port"),
            (
                "http=80/ICMP",
                "port \"http=80/ICMP\": protocol \"ICMP\" is not TCP",
            ),
            (
                "HTTP=80",
                "port \"HTTP=80\": \"HTTP\" is not a valid port name",
            ),
            ("=80", "port \"=80\": \"\" is not a valid port name"),
            (
                "a--b=80",
                "port \"a--b=80\": \"a--b\" is not a valid port name",
            ),
            (
                "8080=80",
                "port \"8080=80\": \"8080\" is not a valid port name",
            ),
            ("Bad-", "port \"Bad-\": \"Bad\" is not a valid port name"),
            (
                "http",
                "port \"http\": expected name=port[/protocol] or name-",
            ),
            ("-", "port \"-\": expected name=port[/protocol] or name-"),
        ];
        for (arg, want) in cases {
            let e = parse_changes(&args(&["ok=1", arg]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{arg}: got {e:?}, want {want:?}");
        }
        assert!(
            parse_changes(&[])
                .unwrap_err()
                .to_string()
                .contains("no port change")
        );
    }

    #[test]
    fn port_command_line_parses() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "ternctl",
            "port",
            "wep",
            "node1-k8s-web-eth0",
            "-n",
            "prod",
            "http=8080/TCP",
            "metrics=9090",
            "old-",
        ])
        .unwrap();
        let crate::cli::Command::Port(crate::cli::Changes {
            kind,
            name,
            changes,
            namespace,
        }) = cli.command
        else {
            panic!("not the port command: {:?}", cli.command)
        };
        assert_eq!(
            (kind.as_str(), name.as_str()),
            ("wep", "node1-k8s-web-eth0")
        );
        assert_eq!(namespace.as_deref(), Some("prod"));
        assert_eq!(changes, args(&["http=8080/TCP", "metrics=9090", "old-"]));
        assert!(crate::cli::Cli::try_parse_from(["ternctl", "port", "wep", "x"]).is_err());
    }

    #[test]
    fn port_changes_apply_in_order() {
        let mut ports = vec![ep("http", 80, Protocol::Tcp), ep("dns", 53, Protocol::Udp)];
        let c = parse_changes(&args(&["http=8080", "metrics=9090/TCP", "dns-", "gone-"])).unwrap();
        apply_changes(&mut ports, &c);
        assert_eq!(
            ports,
            vec![
                ep("http", 8080, Protocol::Tcp),
                ep("metrics", 9090, Protocol::Tcp)
            ]
        );
        assert_eq!(render(&ports), "http=8080/TCP,metrics=9090/TCP");
    }

    #[test]
    fn port_updates_a_stored_endpoint_and_refuses_others() {
        let store = tern_store::mem::MemStore::new();
        let mut w = WorkloadEndpoint::new(
            "node1-k8s-web-eth0",
            WorkloadEndpointSpec {
                node: "node1".into(),
                orchestrator: "k8s".into(),
                pod: "web".into(),
                container_id: "c1".into(),
                endpoint: "eth0".into(),
                interface_name: "tern1".into(),
                mac: String::new(),
                ip_networks: vec!["10.244.0.5/32".into()],
                network: "k8s-pod-network".into(),
                profiles: vec![],
                service_account_name: None,
                ports: vec![ep("old", 1, Protocol::Tcp)],
            },
        );
        w.metadata.namespace = Some("prod".into());
        tern_model::put_resource(&store, &Resource::WorkloadEndpoint(w)).unwrap();

        let out = port(
            &store,
            Kind::WorkloadEndpoint,
            "node1-k8s-web-eth0",
            Some("prod"),
            &parse_changes(&args(&["http=8080", "old-"])).unwrap(),
        )
        .unwrap();
        assert_eq!(out, "http=8080/TCP");
        let Some(Resource::WorkloadEndpoint(stored)) = tern_model::get_resource(
            &store,
            Kind::WorkloadEndpoint,
            Some("prod"),
            "node1-k8s-web-eth0",
        )
        .unwrap() else {
            panic!("endpoint vanished")
        };
        assert_eq!(stored.spec.ports, vec![ep("http", 8080, Protocol::Tcp)]);

        let set = parse_changes(&args(&["a=1"])).unwrap();
        let e = port(&store, Kind::WorkloadEndpoint, "nope", Some("prod"), &set).unwrap_err();
        assert!(
            e.to_string().contains("nope not found in namespace prod"),
            "{e}"
        );
        let e = port(&store, Kind::Namespace, "prod", None, &set).unwrap_err();
        assert!(e.to_string().contains("not Namespace"), "{e}");
    }
}
