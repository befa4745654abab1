//! The one image packer (`scripts/k8s/oci_image.py`): each kind of image the scripts build
//! (`static` for pause and probe, `busybox` for the tests' pods, `agnhost` for the e2e specs;
//! `files` is `tern_image.rs`'s) packed from Debian's static busybox into a temp dir, and the
//! docker-archive read back with `tar`: the tag, the config containerd runs (entrypoint, cmd,
//! user, PATH, ports) and the layer's entries. Packing twice gives the same image.
//!
//! Needs python3, tar and busybox (busybox-static); no root. Everything lives in a temp dir.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn packer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/k8s/oci_image.py")
}

fn busybox() -> PathBuf {
    tern_testkit::find_binary("busybox").expect("busybox (guarded by need_binary)")
}

/// Runs the packer with `args`; its JSON summary.
fn pack(args: &[&str]) -> Value {
    let out = Command::new("python3")
        .arg(packer())
        .args(args)
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "oci_image.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("a summary line")).unwrap()
}

fn tar(args: &[&str], dir: &Path) -> String {
    let out = Command::new("tar")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// An image read back: its tags, its config's `config` and its layer's `tar -tv` lines as
/// (mode string, path, link target).
struct Image {
    tags: Value,
    config: Value,
    entries: Vec<(String, String, String)>,
}

impl Image {
    fn read(tarball: &Path) -> Image {
        let dir = tempfile::tempdir().unwrap();
        tar(&["-xf", tarball.to_str().unwrap()], dir.path());
        let read_json = |f: &str| -> Value {
            serde_json::from_slice(&std::fs::read(dir.path().join(f)).unwrap()).unwrap()
        };
        let manifest = read_json("manifest.json");
        let config = read_json(manifest[0]["Config"].as_str().unwrap());
        let layer = manifest[0]["Layers"][0].as_str().unwrap();
        let entries = tar(&["-tvf", layer], dir.path())
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (path, link) = match f.iter().position(|x| *x == "->") {
                    Some(i) => (f[i - 1], f[i + 1]),
                    None => (*f.last().unwrap(), ""),
                };
                (
                    f[0].to_string(),
                    path.trim_end_matches('/').to_string(),
                    link.to_string(),
                )
            })
            .collect();
        Image {
            tags: manifest[0]["RepoTags"].clone(),
            config: config["config"].clone(),
            entries,
        }
    }

    fn entry(&self, path: &str) -> (&str, &str) {
        self.entries
            .iter()
            .find(|(_, p, _)| p == path)
            .map(|(m, _, l)| (m.as_str(), l.as_str()))
            .unwrap_or_else(|| panic!("{path} not in the layer: {:?}", self.entries))
    }
}

/// What every test here runs.
const TOOLS: [&str; 3] = ["python3", "tar", "busybox"];

#[test]
fn a_static_binary_is_its_own_entrypoint_run_as_nobody() {
    for tool in TOOLS {
        tern_testkit::need_binary(tool);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pause.tar");
    let bb = busybox();
    let args = [
        "static",
        bb.to_str().unwrap(),
        "/bin/pause",
        out.to_str().unwrap(),
        "localhost/tern/pause:3.10",
    ];
    let first = pack(&args);
    let image = Image::read(&out);
    assert_eq!(image.tags, json!(["localhost/tern/pause:3.10"]));
    assert_eq!(
        image.config,
        json!({"Entrypoint": ["/bin/pause"], "User": "65535:65535", "WorkingDir": "/"})
    );
    let paths: Vec<&str> = image.entries.iter().map(|(_, p, _)| p.as_str()).collect();
    assert_eq!(paths, ["bin", "bin/pause"]);
    assert_eq!(image.entry("bin/pause").0, "-rwxr-xr-x");
    // Reproducible: the same input gives the same image.
    assert_eq!(pack(&args)["config_digest"], first["config_digest"]);
    assert_eq!(pack(&args)["diff_id"], first["diff_id"]);
}

#[test]
fn the_busybox_image_has_every_applet_and_a_shell() {
    for tool in TOOLS {
        tern_testkit::need_binary(tool);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("busybox.tar");
    let bb = busybox();
    let summary = pack(&[
        "busybox",
        bb.to_str().unwrap(),
        out.to_str().unwrap(),
        "tern-busybox:1",
    ]);
    let image = Image::read(&out);
    assert_eq!(image.tags, json!(["tern-busybox:1"]));
    assert_eq!(
        image.config,
        json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "WorkingDir": "/"})
    );
    assert_eq!(image.entry("bin/sh"), ("lrwxrwxrwx", "busybox"));
    assert_eq!(image.entry("bin/busybox").0, "-rwxr-xr-x");
    assert_eq!(image.entry("tmp").0, "drwxrwxrwt");
    assert_eq!(image.entry("etc/passwd").0, "-rw-r--r--");
    image.entry("var/www/index.html");
    let links = image
        .entries
        .iter()
        .filter(|(_, _, l)| l == "busybox")
        .count();
    assert_eq!(Some(links as u64), summary["applets"].as_u64());
}

#[test]
fn the_agnhost_image_lets_given_files_replace_applets() {
    for tool in TOOLS {
        tern_testkit::need_binary(tool);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("agnhost.tar");
    let bb = busybox();
    let bb = bb.to_str().unwrap();
    // busybox stands in for agnhost, and as the "bash" given for /bin/sh.
    let sh = format!("{bb}:/bin/sh");
    let tag = "registry.k8s.io/e2e-test-images/agnhost:2.56";
    pack(&["agnhost", bb, bb, out.to_str().unwrap(), tag, &sh]);
    let image = Image::read(&out);
    assert_eq!(image.tags, json!([tag]));
    assert_eq!(image.config["Entrypoint"], json!(["/agnhost"]));
    assert_eq!(image.config["Cmd"], json!(["pause"]));
    assert_eq!(
        image.config["Env"],
        json!(["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    );
    assert!(
        image.config["ExposedPorts"]["9376/tcp"].is_object(),
        "{}",
        image.config
    );
    assert_eq!(image.entry("agnhost").0, "-rwxr-xr-x");
    assert_eq!(image.entry("agnhost-2"), ("lrwxrwxrwx", "agnhost"));
    // The given file, not the applet.
    assert_eq!(image.entry("bin/sh"), ("-rwxr-xr-x", ""));
    assert_eq!(image.entry("bin/ls"), ("lrwxrwxrwx", "busybox"));
    for dir in [
        "uploads",
        "home",
        "home/user-defined-in-image",
        "usr/local/bin",
    ] {
        assert!(image.entry(dir).0.starts_with('d'), "{dir}");
    }
}

#[test]
fn a_tag_without_a_version_is_refused() {
    for tool in TOOLS {
        tern_testkit::need_binary(tool);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.tar");
    let status = Command::new("python3")
        .arg(packer())
        .args([
            "busybox",
            busybox().to_str().unwrap(),
            out.to_str().unwrap(),
            "tern-busybox",
        ])
        .output()
        .unwrap();
    assert!(!status.status.success());
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("expected REPO:TAG"), "{err}");
    assert!(!out.exists());
}
