//! The conflist timing of the DaemonSet (`manifests/tern.yaml`): the `cni-conf` container runs
//! `ternctl install-cni --conflist-only --wait-ready URL --stay`. Shown with the real binary and
//! a stand-in for ternd's health listener: no conflist while `/readiness` answers 503 (or
//! nothing listens), the conflist once it answers 200, the binaries untouched, and a SIGTERM
//! (the process may be PID 1 of its container, where an unhandled SIGTERM is ignored) ends it
//! at once with status 0, leaving the conflist in place.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[test]
fn conflist_appears_only_after_readiness_and_sigterm_ends_the_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    let conf = tmp.path().join("net.d");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("tern"), "old binary").unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/readiness", listener.local_addr().unwrap());
    let ready = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (ready, hits) = (ready.clone(), hits.clone());
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 1024];
                let _ = c.read(&mut buf);
                hits.fetch_add(1, Ordering::SeqCst);
                let status = if ready.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = c.write_all(format!("HTTP/1.1 {status}\r\n\r\nnot yet\n").as_bytes());
            }
        });
    }

    // The `cni-conf` container's command.
    let install_cni = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ternctl"));
        c.arg("install-cni")
            .arg("--bin-dir")
            .arg(&bin)
            .arg("--conf-dir")
            .arg(&conf)
            .arg("--conflist-only")
            .arg(format!("--wait-ready={url}"))
            .arg("--stay");
        c
    };
    // A SIGTERM while still waiting for readiness also ends it with status 0.
    let mut early = Guard(
        install_cni()
            .stderr(Stdio::null())
            .spawn()
            .expect("ternctl runs"),
    );
    let end = Instant::now() + Duration::from_secs(10);
    while hits.load(Ordering::SeqCst) < 1 {
        assert!(
            Instant::now() < end,
            "ternctl did not poll the readiness URL"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(terminate(&mut early.0).success());
    assert!(!conf.join("10-tern.conflist").exists());
    hits.store(0, Ordering::SeqCst);

    let mut guard = Guard(
        install_cni()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ternctl runs"),
    );
    let child = &mut guard.0;
    let conflist = conf.join("10-tern.conflist");

    // Not ready: several polls, no conflist.
    let end = Instant::now() + Duration::from_secs(10);
    while hits.load(Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < end,
            "ternctl did not poll the readiness URL"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!conflist.exists(), "conflist written before readiness");
    assert!(child.try_wait().unwrap().is_none(), "ternctl exited early");

    ready.store(true, Ordering::SeqCst);
    let end = Instant::now() + Duration::from_secs(10);
    while !conflist.exists() {
        assert!(Instant::now() < end, "no conflist 10 s after readiness");
        std::thread::sleep(Duration::from_millis(50));
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&conflist).unwrap()).unwrap();
    assert_eq!(v["plugins"][0]["type"], "tern");
    assert_eq!(
        std::fs::read_to_string(bin.join("tern")).unwrap(),
        "old binary"
    );
    // It stays.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "--stay exited by itself"
    );

    // SIGTERM: prompt exit 0, conflist kept.
    let status = terminate(child);
    assert!(status.success(), "exit status {status}");
    assert!(conflist.exists());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("waiting for"), "{err}");
}

/// SIGTERM to `child` (by PID); its exit status, which must come within 5 s.
fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill on the PID of a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ternctl did not exit within 5 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the child by PID if the test fails before it ends.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
