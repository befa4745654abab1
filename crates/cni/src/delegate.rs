//! Running a delegated plugin (e.g. an IPAM plugin) as the CNI spec
//! describes: found by `type` in `CNI_PATH`, same environment, config on stdin.

use crate::code;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::env::{Command, Environment};
use crate::error::CniError;

/// How often to retry when the binary is being written ("text file busy"),
/// as libcni's `RawExec` does.
const BUSY_RETRIES: u32 = 5;

/// Finds the executable `plugin_type` in `dirs`, first match wins.
///
/// A `plugin_type` holding a path separator, or `.`/`..`, is refused (code 7)
/// so a configuration cannot name a binary outside `CNI_PATH`; not found is
/// code 5 listing the directories searched.
pub fn find_plugin(plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, CniError> {
    if plugin_type.is_empty()
        || plugin_type.contains('/')
        || plugin_type == "."
        || plugin_type == ".."
    {
        return Err(CniError::invalid_config(format!(
            "invalid plugin type {plugin_type:?}: must be a file name in CNI_PATH"
        )));
    }
    for dir in dirs {
        let candidate = dir.join(plugin_type);
        if is_executable_file(&candidate) {
            return Ok(candidate);
        }
    }
    Err(CniError::io(format!(
        "failed to find plugin {plugin_type:?} in CNI_PATH {dirs:?}"
    )))
}

fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Runs plugin `plugin_type` found in `env.path` with `command`, the config
/// `stdin_conf` on stdin, and the process environment plus `env`'s `CNI_*`
/// variables (`CNI_COMMAND` set to `command`).
///
/// - exit 0 with output: `Ok(Some(json))` (a result for ADD, for instance);
/// - exit 0 with empty output (DEL, CHECK, GC): `Ok(None)`;
/// - exit 0 with output that is not JSON: code 6;
/// - non-zero exit: the plugin's error JSON (`{"code","msg","details"}`) as
///   the `CniError`; if it printed none, code 999 with its stderr or exit
///   status in the message, as libcni does.
///
/// The plugin's stderr is captured and, on success, copied to this process's
/// stderr so its logs are not lost.
pub fn delegate(
    plugin_type: &str,
    command: Command,
    stdin_conf: &[u8],
    env: &Environment,
) -> Result<Option<Value>, CniError> {
    let path = find_plugin(plugin_type, &env.path)?;
    let mut attempt = 0;
    let output = loop {
        match run_once(&path, command, stdin_conf, env) {
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && attempt < BUSY_RETRIES => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(CniError::io(format!(
                    "failed to execute plugin {plugin_type:?} ({}) for {command}: {e}",
                    path.display()
                )));
            }
            Ok(out) => break out,
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(plugin_error(
            plugin_type,
            command,
            &output.status,
            &stdout,
            &stderr,
        ));
    }
    if !stderr.is_empty() {
        // Informational only, as in libcni; a failed write must not fail the call.
        let _ = std::io::stderr().write_all(stderr.as_bytes());
    }
    if stdout.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&stdout).map(Some).map_err(|e| {
        CniError::decode(format!(
            "failed to decode output of plugin {plugin_type:?} for {command}: {e}"
        ))
        .with_details(stdout.into_owned())
    })
}

fn run_once(
    path: &Path,
    command: Command,
    stdin_conf: &[u8],
    env: &Environment,
) -> std::io::Result<std::process::Output> {
    let mut child = Process::new(path)
        .envs(env.to_vars(command))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Feed stdin from a thread so a plugin that writes a lot before reading
    // cannot deadlock against us on full pipes.
    let writer = child.stdin.take().map(|mut stdin| {
        let data = stdin_conf.to_vec();
        std::thread::spawn(move || stdin.write_all(&data))
    });
    let output = child.wait_with_output()?;
    if let Some(writer) = writer {
        match writer.join() {
            // A plugin may exit without reading stdin; its exit status then
            // tells what happened, so a broken pipe is not an error of its own.
            Ok(Err(e)) if e.kind() != ErrorKind::BrokenPipe => return Err(e),
            Ok(_) => {}
            Err(_) => return Err(std::io::Error::other("stdin writer thread panicked")),
        }
    }
    Ok(output)
}

fn plugin_error(
    plugin_type: &str,
    command: Command,
    status: &std::process::ExitStatus,
    stdout: &str,
    stderr: &str,
) -> CniError {
    if !stdout.trim().is_empty() {
        if let Ok(mut e) = serde_json::from_str::<CniError>(stdout) {
            if e.code == 0 {
                // Code 0 would read as success to anyone checking the code.
                e.code = code::GENERIC;
            }
            return e;
        }
        return CniError::new(
            code::GENERIC,
            format!(
                "plugin {plugin_type:?} failed ({command}, {status}) and its error output could not be parsed: {:?}",
                stdout.trim()
            ),
        )
        .with_details(stderr.trim().to_owned());
    }
    if stderr.trim().is_empty() {
        CniError::new(
            code::GENERIC,
            format!("plugin {plugin_type:?} failed ({command}, {status}) with no error message"),
        )
    } else {
        CniError::new(
            code::GENERIC,
            format!(
                "plugin {plugin_type:?} failed ({command}, {status}): {}",
                stderr.trim()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Writes an executable shell script named `name` into `dir`.
    fn script(dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn env_for(dirs: &[&Path], command: &str) -> Environment {
        let path = dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        let vars: HashMap<&str, String> = [
            ("CNI_COMMAND", command.to_owned()),
            ("CNI_CONTAINERID", "ctr1".to_owned()),
            ("CNI_NETNS", "/run/netns/test".to_owned()),
            ("CNI_IFNAME", "eth0".to_owned()),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p".to_owned()),
            ("CNI_PATH", path),
        ]
        .into_iter()
        .collect();
        Environment::from_vars(|k| vars.get(k).cloned()).unwrap()
    }

    #[test]
    fn success_returns_result_and_passes_env_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("seen");
        // Records its environment and stdin, then prints a 1.0.0 result.
        script(
            dir.path(),
            "fake-ipam",
            &format!(
                r#"echo "$CNI_COMMAND|$CNI_CONTAINERID|$CNI_NETNS|$CNI_IFNAME|$CNI_ARGS|$CNI_PATH" > {log}
cat >> {log}
echo 'log line' >&2
echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.22.0.5/24","gateway":"10.22.0.1"}}]}}'"#,
                log = log.display()
            ),
        );
        let empty = tempfile::tempdir().unwrap();
        let env = env_for(&[empty.path(), dir.path()], "ADD");
        let conf = br#"{"cniVersion":"1.0.0","name":"n","type":"fake-ipam"}"#;
        let out = delegate("fake-ipam", Command::Add, conf, &env)
            .unwrap()
            .unwrap();
        let result = crate::CniResult::from_json(&out).unwrap();
        assert_eq!(result.ips[0].address.to_string(), "10.22.0.5/24");

        let seen = std::fs::read_to_string(&log).unwrap();
        let (vars, stdin) = seen.split_once('\n').unwrap();
        assert_eq!(
            vars,
            format!(
                "ADD|ctr1|/run/netns/test|eth0|IgnoreUnknown=1;K8S_POD_NAME=p|{}:{}",
                empty.path().display(),
                dir.path().display()
            )
        );
        assert_eq!(stdin.as_bytes(), conf);
    }

    #[test]
    fn command_is_overridable_and_empty_output_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cmd");
        script(
            dir.path(),
            "p",
            &format!("echo \"$CNI_COMMAND\" > {}", log.display()),
        );
        let env = env_for(&[dir.path()], "ADD");
        assert_eq!(delegate("p", Command::Del, b"{}", &env).unwrap(), None);
        assert_eq!(std::fs::read_to_string(&log).unwrap().trim(), "DEL");
    }

    #[test]
    fn plugin_error_json_becomes_cni_error() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "failing",
            r#"echo '{"cniVersion":"1.0.0","code":11,"msg":"datastore busy","details":"retry"}'
exit 1"#,
        );
        let env = env_for(&[dir.path()], "ADD");
        let e = delegate("failing", Command::Add, b"{}", &env).unwrap_err();
        assert_eq!(
            e,
            CniError::try_again_later("datastore busy").with_details("retry")
        );
    }

    #[test]
    fn unparsable_failure_is_999_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "crash", "echo 'panic: boom' >&2\nexit 1");
        script(dir.path(), "silent", "exit 3");
        script(dir.path(), "garbage", "echo 'not json'\nexit 2");
        let env = env_for(&[dir.path()], "ADD");

        let e = delegate("crash", Command::Add, b"{}", &env).unwrap_err();
        assert_eq!(e.code, code::GENERIC);
        assert!(
            e.msg.contains("panic: boom") && e.msg.contains("\"crash\""),
            "{}",
            e.msg
        );

        let e = delegate("silent", Command::Add, b"{}", &env).unwrap_err();
        assert_eq!(e.code, code::GENERIC);
        assert!(
            e.msg.contains("no error message") && e.msg.contains('3'),
            "{}",
            e.msg
        );

        let e = delegate("garbage", Command::Add, b"{}", &env).unwrap_err();
        assert_eq!(e.code, code::GENERIC);
        assert!(e.msg.contains("not json"), "{}", e.msg);
    }

    #[test]
    fn success_with_non_json_output_is_code_6() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "chatty", "echo hello");
        let env = env_for(&[dir.path()], "ADD");
        let e = delegate("chatty", Command::Add, b"{}", &env).unwrap_err();
        assert_eq!(e.code, code::DECODE);
        assert!(e.msg.contains("\"chatty\""), "{}", e.msg);
    }

    #[test]
    fn plugin_that_ignores_stdin_still_works() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "quick", "exit 0");
        let env = env_for(&[dir.path()], "ADD");
        let big = vec![b' '; 1 << 20];
        assert_eq!(delegate("quick", Command::Add, &big, &env).unwrap(), None);
    }

    #[test]
    fn lookup_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("not-exec"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir(dir.path().join("a-dir")).unwrap();
        let env = env_for(&[dir.path()], "ADD");
        for missing in ["nope", "not-exec", "a-dir"] {
            let e = delegate(missing, Command::Add, b"{}", &env).unwrap_err();
            assert_eq!(e.code, code::IO, "{missing}");
            assert!(
                e.msg.contains(missing) && e.msg.contains("CNI_PATH"),
                "{}",
                e.msg
            );
        }
        for bad in ["../bin/sh", "/bin/sh", "", ".."] {
            let e = delegate(bad, Command::Add, b"{}", &env).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
    }
}
