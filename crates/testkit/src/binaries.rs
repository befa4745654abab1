//! The binaries tests run: executables found on `PATH` ([`find_binary`]), how to install one
//! ([`install_hint`]), and the workspace's own binaries, checked current before a test runs
//! them ([`workspace_binaries`]).

use std::path::{Path, PathBuf};

/// The executable `name`: itself when it contains a `/`, else the first match in `PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return is_executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How to get a binary the tests use (Debian packages; `scripts/deps.sh` installs them all).
pub fn install_hint(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    let pkg = match base {
        "bird" | "birdc" => "bird2",
        "etcd" | "etcdctl" => "etcd-server",
        "nft" => "nftables",
        "ip" | "tc" | "bridge" => "iproute2",
        "iperf3" => "iperf3",
        "containerd" | "ctr" => "containerd",
        "runc" => "runc",
        "busybox" => "busybox-static",
        "host-local" | "ptp" | "loopback" | "bridge-plugin" => "containernetworking-plugins",
        "tern" | "tern-ipam" | "ternd" | "ternctl" => {
            return "build it: `cargo build --workspace --bins`".to_string();
        }
        _ => return "`bash scripts/deps.sh` installs the test dependencies".to_string(),
    };
    let mut hint = format!("`apt-get install {pkg}` (or `bash scripts/deps.sh`)");
    if pkg == "etcd-server" {
        hint.push_str(", or set TERN_ETCD_BIN");
    }
    hint
}

/// The workspace's binaries every end-to-end test runs (the plugins, the agent, the CLI).
pub const WORKSPACE_BINARIES: &[&str] = &["tern", "tern-ipam", "ternd", "ternctl"];

/// The directory of `exe` (a binary cargo built for this test, `env!("CARGO_BIN_EXE_...")`),
/// once every one of [`WORKSPACE_BINARIES`] in it is checked to be current, once per test
/// process. Tests never run cargo: `cargo build --workspace --bins` (the build step of
/// `scripts/test.sh`) built them, and `cargo test --workspace` rebuilds what changed before any
/// test starts. A binary counts as current when it exists and no source file its dep-info
/// (`<name>.d`, which cargo writes beside it) lists is newer than it, so `cargo test -p X` after
/// an edit to another package's code fails naming the stale binary and the command that
/// rebuilds it instead of testing old code.
pub fn workspace_binaries(exe: &Path) -> &'static Path {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    match DIR.get_or_init(|| check_binaries(exe, WORKSPACE_BINARIES)) {
        Ok(dir) => dir,
        Err(e) => panic!("{e}"),
    }
}

/// The command that makes every workspace binary current.
const REBUILD: &str = "`cargo build --workspace --bins` (scripts/test.sh's build step)";

fn check_binaries(exe: &Path, names: &[&str]) -> Result<PathBuf, String> {
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?
        .to_path_buf();
    let problems: Vec<String> = names
        .iter()
        .filter_map(|n| stale_reason(&dir.join(n)).err())
        .collect();
    if problems.is_empty() {
        Ok(dir)
    } else {
        Err(format!(
            "the workspace's binaries are not current: {}; run {REBUILD}",
            problems.join("; ")
        ))
    }
}

/// `Ok` when `bin` exists and is not older than any file of its dep-info; else why not.
fn stale_reason(bin: &Path) -> Result<(), String> {
    let built = std::fs::metadata(bin)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let dep_info = bin.with_extension("d");
    let text = std::fs::read_to_string(&dep_info).map_err(|e| {
        format!(
            "{}: {e} (cargo writes it with the binary)",
            dep_info.display()
        )
    })?;
    for src in dep_info_sources(&text) {
        match std::fs::metadata(&src).and_then(|m| m.modified()) {
            Ok(t) if t <= built => {}
            Ok(_) => {
                return Err(format!("{} is older than {}", bin.display(), src.display()));
            }
            Err(e) => {
                return Err(format!(
                    "{} was built from {}: {e}",
                    bin.display(),
                    src.display()
                ));
            }
        }
    }
    Ok(())
}

/// The prerequisites of the first rule of a Makefile-style dep-info file (`target: a b c`, a
/// space in a path escaped as `\ `, lines continued with a trailing `\`).
fn dep_info_sources(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let Some(first) = joined.lines().find(|l| !l.trim().is_empty()) else {
        return Vec::new();
    };
    // The target ends at the first unescaped ": ".
    let mut rest = None;
    let b = first.as_bytes();
    for i in 0..b.len().saturating_sub(1) {
        if b[i] == b':' && b[i + 1] == b' ' && (i == 0 || b[i - 1] != b'\\') {
            rest = Some(&first[i + 2..]);
            break;
        }
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = rest.unwrap_or("").chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => {
                cur.push(' ');
                chars.next();
            }
            ' ' | '\t' => {
                if !cur.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut cur)));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(PathBuf::from(cur));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dep_info_lists_the_sources_of_the_first_rule() {
        let text = "/t/debug/ternd: /w/crates/agent/src/bin/ternd.rs /w/a\\ b.rs \\\n /w/c.rs\n\n/w/c.rs:\n";
        assert_eq!(
            dep_info_sources(text),
            ["/w/crates/agent/src/bin/ternd.rs", "/w/a b.rs", "/w/c.rs"]
                .map(PathBuf::from)
                .to_vec()
        );
        assert!(dep_info_sources("").is_empty());
    }

    #[test]
    fn a_binary_is_current_only_when_no_source_is_newer() {
        let dir = std::env::temp_dir().join(format!("tern-testkit-bins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        struct RmDir(PathBuf);
        impl Drop for RmDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = RmDir(dir.clone());
        let src = dir.join("main.rs");
        let bin = dir.join("prog");
        std::fs::write(&src, "fn main() {}").unwrap();
        std::fs::write(
            dir.join("prog.d"),
            format!("{}: {}\n", bin.display(), src.display()),
        )
        .unwrap();
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("prog: No such file"), "{e}");
        std::fs::write(&bin, "").unwrap();
        let set = |p: &Path, secs: u64| {
            let f = std::fs::File::options().write(true).open(p).unwrap();
            f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                .unwrap();
        };
        set(&src, 1_000);
        set(&bin, 2_000);
        assert_eq!(check_binaries(&bin, &["prog"]).unwrap(), dir);
        set(&src, 3_000);
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("is older than") && e.contains("main.rs"), "{e}");
        assert!(e.contains("cargo build --workspace --bins"), "{e}");
        std::fs::remove_file(&src).unwrap();
        let e = check_binaries(&bin, &["prog"]).unwrap_err();
        assert!(e.contains("was built from"), "{e}");
    }

    #[test]
    fn binaries_are_found_by_path_and_by_name() {
        assert!(find_binary("sh").is_some(), "sh is on PATH");
        assert!(find_binary("/bin/sh").is_some());
        assert!(find_binary("tern-no-such-binary").is_none());
        // A file that is not executable is not a binary.
        let plain = std::env::temp_dir().join(format!("tern-testkit-plain-{}", std::process::id()));
        std::fs::write(&plain, "not a program").unwrap();
        let found = find_binary(plain.to_str().unwrap());
        std::fs::remove_file(&plain).unwrap();
        assert!(found.is_none());
        assert!(install_hint("/usr/sbin/bird").contains("apt-get install bird2"));
        assert!(install_hint("etcd").contains("TERN_ETCD_BIN"));
    }
}
