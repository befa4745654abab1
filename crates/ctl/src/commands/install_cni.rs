//! `ternctl install-cni`: copies the plugins into the CNI bin directory and writes
//! `10-tern.conflist`, the shape of Calico's conflist with tern's plugins. Every file is
//! written to a temporary name in the target directory and renamed, so a runtime never sees a
//! half-written binary or configuration.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::cli::InstallCniArgs;

/// File name of the network configuration list.
pub const CONFLIST_NAME: &str = "10-tern.conflist";
/// Binaries installed into the bin directory.
pub const PLUGINS: [&str; 2] = ["tern", "tern-ipam"];
/// Where distributions install the reference plugins.
pub const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";

/// The configuration list. `bandwidth` and `portmap` are chained (with the capabilities
/// Calico's list declares) only when those plugins are available.
pub fn conflist(args: &InstallCniArgs, bandwidth: bool, portmap: bool) -> Value {
    let mut plugins = vec![json!({
        "type": "tern",
        "agent_socket": args.agent_socket,
        "state_dir": args.state_dir,
        "mtu": args.mtu,
        "ipam": ipam(args),
    })];
    if bandwidth {
        plugins.push(json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}));
    }
    if portmap {
        plugins.push(json!({
            "type": "portmap",
            "snat": true,
            "capabilities": {"portMappings": true},
        }));
    }
    json!({
        "name": args.name,
        "cniVersion": args.cni_version,
        "plugins": plugins,
    })
}

/// The conflist's `ipam`: tern-ipam with the families asked for (`assign_ipv4` always
/// written, `assign_ipv6` only when on, so a single-stack conflist is as before).
fn ipam(args: &InstallCniArgs) -> Value {
    let mut ipam = json!({
        "type": "tern-ipam",
        "assign_ipv4": if args.no_assign_ipv4 { "false" } else { "true" },
    });
    if args.assign_ipv6 {
        ipam["assign_ipv6"] = json!("true");
    }
    ipam
}

/// Whether plugin `name` is available to the runtime: in `bin_dir` or [`SYSTEM_CNI_DIR`].
pub fn plugin_available(bin_dir: &Path, name: &str) -> bool {
    [bin_dir, Path::new(SYSTEM_CNI_DIR)]
        .iter()
        .any(|d| d.join(name).is_file())
}

/// Writes `bytes` to `dir/name` atomically with `mode`.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let target = dir.join(name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", tmp.path().display()))?;
    tmp.persist(&target)
        .with_context(|| format!("cannot rename into {}", target.display()))?;
    Ok(())
}

/// What `install` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Paths of the installed binaries.
    pub binaries: Vec<PathBuf>,
    /// Path of the configuration list (None with `--skip-conflist`).
    pub conflist: Option<PathBuf>,
    /// Plugins chained after tern.
    pub chained: Vec<String>,
}

/// Installs binaries from `plugin_dir` and writes the configuration list.
pub fn install(args: &InstallCniArgs, plugin_dir: &Path) -> anyhow::Result<Installed> {
    for d in [&args.bin_dir, &args.conf_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut binaries = Vec::new();
    for p in PLUGINS {
        if args.conflist_only {
            break;
        }
        let src = plugin_dir.join(p);
        if !src.is_file() {
            bail!(
                "{} not found; pass --plugin-dir with the directory holding {}",
                src.display(),
                PLUGINS.join(" and ")
            );
        }
        let bytes =
            std::fs::read(&src).with_context(|| format!("cannot read {}", src.display()))?;
        write_atomic(&args.bin_dir, p, &bytes, 0o755)?;
        binaries.push(args.bin_dir.join(p));
    }
    if args.skip_conflist {
        return Ok(Installed {
            binaries,
            conflist: None,
            chained: Vec::new(),
        });
    }
    let bandwidth = plugin_available(&args.bin_dir, "bandwidth");
    let portmap = plugin_available(&args.bin_dir, "portmap");
    let conf = conflist(args, bandwidth, portmap);
    let text = serde_json::to_string_pretty(&conf)? + "\n";
    write_atomic(&args.conf_dir, CONFLIST_NAME, text.as_bytes(), 0o644)?;
    let chained = [("bandwidth", bandwidth), ("portmap", portmap)]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n.to_string())
        .collect();
    Ok(Installed {
        binaries,
        conflist: Some(args.conf_dir.join(CONFLIST_NAME)),
        chained,
    })
}

/// One plain-HTTP GET of `url` (`http://host:port/path`); true when it answers 200.
fn answers_200(url: &str) -> anyhow::Result<bool> {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--wait-ready {url:?}: only http:// URLs are supported"))?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = hostport
        .to_socket_addrs()
        .with_context(|| format!("--wait-ready {url:?}: bad host:port {hostport:?}"))?
        .next()
        .with_context(|| format!("--wait-ready {url:?}: {hostport:?} resolves to nothing"))?;
    let timeout = std::time::Duration::from_secs(3);
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return Ok(false);
    };
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: {hostport}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return Ok(false);
    }
    // The status line is all that matters; a bounded read keeps a hostile server harmless.
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < head.len() {
        match s.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
        if head[..n].contains(&b'\n') {
            break;
        }
    }
    let line = String::from_utf8_lossy(&head[..n]);
    Ok(line
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code == "200"))
}

/// Waits until `url` answers 200 (`--wait-ready`), polling every second and logging the wait
/// every 30 s; `timeout` None waits for ever (a container is restarted by kubelet anyway).
pub fn wait_ready(url: &str, timeout: Option<std::time::Duration>) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let mut next_log = std::time::Duration::ZERO;
    loop {
        if answers_200(url)? {
            return Ok(());
        }
        let waited = start.elapsed();
        if let Some(t) = timeout
            && waited >= t
        {
            bail!("{url} did not answer 200 within {} s", t.as_secs());
        }
        if waited >= next_log {
            eprintln!("waiting for {url} to answer 200");
            next_log = waited + std::time::Duration::from_secs(30);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Makes SIGTERM and SIGINT end the process with status 0 (`--wait-ready`, `--stay`): they
/// are blocked in the calling thread (and so in every thread started later) and a thread
/// waits for them with `sigwait`. Needed because the process may be PID 1 of its container,
/// for which signals without a handler are ignored: a pod's termination would otherwise wait
/// for the grace period and SIGKILL. Call it before starting other threads.
pub fn exit_on_termination() -> anyhow::Result<()> {
    tern_linux::signals::on_termination(|sig| {
        if let Ok(sig) = sig {
            eprintln!("signal {sig} received: exiting");
        }
        let _ = std::io::stdout().flush();
        std::process::exit(0);
    })
    .context("cannot start the signal thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(bin: &Path, conf: &Path) -> InstallCniArgs {
        InstallCniArgs {
            bin_dir: bin.to_path_buf(),
            conf_dir: conf.to_path_buf(),
            agent_socket: "/run/tern/ternd.sock".into(),
            state_dir: "/var/lib/tern".into(),
            name: "k8s-pod-network".into(),
            cni_version: "0.3.1".into(),
            mtu: 0,
            assign_ipv6: false,
            no_assign_ipv4: false,
            plugin_dir: None,
            skip_conflist: false,
            conflist_only: false,
            wait_ready: None,
            stay: false,
        }
    }

    #[test]
    fn conflist_has_the_calico_shape() {
        let a = args(Path::new("/x"), Path::new("/y"));
        let c = conflist(&a, true, true);
        assert_eq!(
            c,
            json!({
                "name": "k8s-pod-network",
                "cniVersion": "0.3.1",
                "plugins": [
                    {
                        "type": "tern",
                        "agent_socket": "/run/tern/ternd.sock",
                        "state_dir": "/var/lib/tern",
                        "mtu": 0,
                        "ipam": {"type": "tern-ipam", "assign_ipv4": "true"}
                    },
                    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
                    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
                ]
            })
        );
        let only = conflist(&a, false, false);
        assert_eq!(only["plugins"].as_array().unwrap().len(), 1);
        let pm = conflist(&a, false, true);
        assert_eq!(pm["plugins"][1]["type"], "portmap");
    }

    #[test]
    fn conflist_asks_for_the_families_given() {
        let mut a = args(Path::new("/x"), Path::new("/y"));
        a.assign_ipv6 = true;
        let dual = &conflist(&a, false, false)["plugins"][0]["ipam"];
        assert_eq!(
            *dual,
            json!({"type": "tern-ipam", "assign_ipv4": "true", "assign_ipv6": "true"})
        );
        a.no_assign_ipv4 = true;
        let v6 = &conflist(&a, false, false)["plugins"][0]["ipam"];
        assert_eq!(v6["assign_ipv4"], "false");
        assert_eq!(v6["assign_ipv6"], "true");
    }

    #[test]
    fn installs_binaries_and_conflist() {
        let src = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        for p in PLUGINS {
            std::fs::write(src.path().join(p), format!("#!/bin/sh\necho {p}\n")).unwrap();
        }
        let bin = root.path().join("bin");
        let conf = root.path().join("net.d");
        std::fs::create_dir_all(&bin).unwrap();
        // A portmap in the bin dir gets chained (bandwidth only if /usr/lib/cni has one).
        std::fs::write(bin.join("portmap"), "").unwrap();
        let a = args(&bin, &conf);
        let done = install(&a, src.path()).unwrap();
        for p in PLUGINS {
            let path = bin.join(p);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o755, "{p}");
            assert_eq!(
                std::fs::read_to_string(&path).unwrap(),
                format!("#!/bin/sh\necho {p}\n")
            );
        }
        let text = std::fs::read_to_string(conf.join(CONFLIST_NAME)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let types: Vec<&str> = v["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types.first(), Some(&"tern"));
        assert_eq!(types.last(), Some(&"portmap"));
        assert!(done.chained.contains(&"portmap".to_string()));
        // No temporary files are left behind.
        let stray: Vec<_> = std::fs::read_dir(&bin)
            .unwrap()
            .chain(std::fs::read_dir(&conf).unwrap())
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(stray.is_empty(), "{stray:?}");
    }

    #[test]
    fn binaries_first_then_the_conflist() {
        let src = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        for p in PLUGINS {
            std::fs::write(src.path().join(p), p).unwrap();
        }
        let (bin, conf) = (root.path().join("bin"), root.path().join("net.d"));
        let mut a = args(&bin, &conf);
        a.skip_conflist = true;
        let done = install(&a, src.path()).unwrap();
        assert_eq!(done.binaries.len(), 2);
        assert_eq!(done.conflist, None);
        assert!(!conf.join(CONFLIST_NAME).exists());
        // --conflist-only needs no plugin directory and leaves the binaries alone.
        std::fs::write(bin.join("tern"), "kept").unwrap();
        a.skip_conflist = false;
        a.conflist_only = true;
        let done = install(&a, root.path().join("nowhere").as_path()).unwrap();
        assert!(done.binaries.is_empty());
        assert_eq!(done.conflist, Some(conf.join(CONFLIST_NAME)));
        assert_eq!(std::fs::read_to_string(bin.join("tern")).unwrap(), "kept");
    }

    #[test]
    fn wait_ready_waits_for_200() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/readiness", l.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            // Two "not ready" answers, then ready.
            for code in [
                "503 Service Unavailable",
                "503 Service Unavailable",
                "200 OK",
            ] {
                let (mut c, _) = l.accept().unwrap();
                let mut buf = [0u8; 512];
                let n = c.read(&mut buf).unwrap();
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /readiness "));
                c.write_all(format!("HTTP/1.1 {code}\r\n\r\n").as_bytes())
                    .unwrap();
            }
        });
        let t = std::time::Instant::now();
        wait_ready(&url, Some(std::time::Duration::from_secs(20))).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_secs(2));
        server.join().unwrap();
        // Nobody listening: the timeout is an error naming the URL.
        let e = wait_ready(&url, Some(std::time::Duration::from_secs(1))).unwrap_err();
        assert!(e.to_string().contains(&url), "{e}");
        let e = wait_ready("https://x/", None).unwrap_err();
        assert!(e.to_string().contains("only http://"), "{e}");
    }

    #[test]
    fn missing_plugin_is_named() {
        let src = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let a = args(&root.path().join("b"), &root.path().join("c"));
        let e = format!("{:#}", install(&a, src.path()).unwrap_err());
        assert!(e.contains("tern not found"), "{e}");
        assert!(!root.path().join("c").join(CONFLIST_NAME).exists());
    }
}
