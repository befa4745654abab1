//! The tern-node image (`scripts/k8s/tern-image.sh`, issue 13): built from our binaries (here
//! the debug ones beside the ternctl under test) plus `nft` and every shared library they
//! need; the tarball lists them; an extracted copy runs `nft --version`, `ternd --version`
//! and `ternctl install manifest` under `chroot`; a private containerd (own root, state and
//! socket in a temp dir; the machine's containerd is not touched) imports it with
//! `ctr -n k8s.io images import` under the name the manifest uses.
//!
//! Needs root (chroot), python3, nft, ldd, containerd and ctr; without one the test fails and
//! names it. Everything lives in a temp dir; containerd is killed by PID on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

mod common;

fn need(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} is needed by this test and not installed (apt-get install nftables containerd \
         python3 libc-bin)"
    );
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Libraries ldd resolves for `bin` (absolute paths, loader included).
fn libs_of(bin: &Path) -> Vec<String> {
    run(Command::new("ldd").arg(bin))
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once("=>") {
                Some((_, rhs)) => rhs.trim(),
                None => l,
            };
            let p = p.split(" (").next().unwrap().trim();
            p.starts_with('/').then(|| p.to_string())
        })
        .collect()
}

struct Containerd(Child);

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn image_has_the_binaries_and_nft_and_imports() {
    assert!(is_root(), "image test needs root (chroot); run it as root");
    for t in [
        "python3",
        "nft",
        "ldd",
        "tar",
        "chroot",
        "containerd",
        "ctr",
    ] {
        need(t);
    }
    let bins = common::fresh_binaries();
    let tmp = tempfile::tempdir().unwrap();
    let tar = tmp.path().join("tern-node.tar");
    let out = run(Command::new("bash")
        .arg(repo().join("scripts/k8s/tern-image.sh"))
        .arg("--bin-dir")
        .arg(bins)
        .arg("--out")
        .arg(&tar));
    let summary: serde_json::Value =
        serde_json::from_str(out.lines().last().expect("a summary line")).unwrap();
    let tag = format!("localhost/tern/tern-node:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(summary["tag"], tag.as_str());

    // The docker-archive: manifest.json names the tag and one layer.
    let outer = tmp.path().join("outer");
    std::fs::create_dir(&outer).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&outer));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(outer.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest[0]["RepoTags"][0], tag.as_str());
    let layer = outer.join(manifest[0]["Layers"][0].as_str().unwrap());
    let listing = run(Command::new("tar").arg("-tf").arg(&layer));
    let paths: Vec<&str> = listing.lines().collect();
    let nft =
        PathBuf::from(run(Command::new("sh").args(["-c", "readlink -f $(command -v nft)"])).trim());
    let mut want: Vec<String> = ["ternd", "ternctl", "tern", "tern-ipam"]
        .iter()
        .map(|b| format!("usr/local/bin/{b}"))
        .collect();
    want.push("usr/sbin/nft".into());
    for b in [bins.join("ternd"), bins.join("ternctl"), nft] {
        for l in libs_of(&b) {
            want.push(l.trim_start_matches('/').to_string());
        }
    }
    for w in &want {
        assert!(
            paths.contains(&w.as_str()),
            "{w} missing in the layer:\n{listing}"
        );
    }
    assert!(
        paths.iter().any(|p| p.contains("libnftables.so")),
        "{listing}"
    );

    // Runs from an extracted copy, with nothing of the host's filesystem.
    let root = tmp.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&layer)
        .arg("-C")
        .arg(&root));
    let v = run(Command::new("chroot")
        .arg(&root)
        .args(["/usr/sbin/nft", "--version"]));
    assert!(v.starts_with("nftables v"), "{v}");
    let v = run(Command::new("chroot")
        .arg(&root)
        .args(["/usr/local/bin/ternd", "--version"]));
    assert!(v.starts_with("ternd "), "{v}");
    let m = run(Command::new("chroot")
        .arg(&root)
        .args(["/usr/local/bin/ternctl", "install", "manifest"])
        .env_remove("TERN_STORE"));
    let checked_in = std::fs::read_to_string(repo().join("manifests/tern.yaml")).unwrap();
    assert_eq!(
        m, checked_in,
        "the image's ternctl renders the checked-in manifest"
    );

    // A private containerd imports it under the manifest's image name.
    let c = tmp.path().join("ctd");
    std::fs::create_dir(&c).unwrap();
    let sock = c.join("c.sock");
    let config = format!(
        "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\
         disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
         [grpc]\n  address = \"{0}/c.sock\"\n[ttrpc]\n  address = \"{0}/c.ttrpc\"\n\
         [debug]\n  address = \"\"\n\
         [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{0}/opt\"\n",
        c.display()
    );
    std::fs::write(c.join("config.toml"), config).unwrap();
    let log = std::fs::File::create(c.join("log")).unwrap();
    let _ctd = Containerd(
        Command::new("containerd")
            .arg("--config")
            .arg(c.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd"),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(
            Instant::now() < end,
            "containerd did not start: {}",
            std::fs::read_to_string(c.join("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ctr = |args: &[&str]| {
        run(Command::new("ctr")
            .arg("--address")
            .arg(&sock)
            .args(["-n", "k8s.io"])
            .args(args))
    };
    ctr(&["images", "import", tar.to_str().unwrap()]);
    let images = ctr(&["images", "ls", "-q"]);
    assert!(images.lines().any(|l| l == tag), "{images}");
}
