//! No integration test returns early: a test that cannot run fails through a tern-testkit guard
//! (`need_root`, `need_binary`, `need`), which returns what the test needs, so a bare `return`
//! (`return;`, `else { return }`) has nothing left to do but make a test pass untested. The one
//! early return is the kernel-limit skip, `tern_testkit::skip_kernel_limit!`, which logs the
//! skip for `scripts/test.sh` to count. A loop that is done ends with `break`.

use std::path::{Path, PathBuf};

fn test_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            test_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether `line` (comments stripped) holds a `return` with no value: `return;` or
/// `return }`.
fn bare_return(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("return").any(|(i, _)| {
        let before = code[..i].chars().last();
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if before.is_some_and(word) {
            return false;
        }
        let after = code[i + "return".len()..].trim_start();
        after.starts_with(';') || after.starts_with('}')
    })
}

#[test]
fn a_bare_return_is_found_in_its_forms() {
    assert!(bare_return("        return;"));
    assert!(bare_return("    let Some(x) = f() else { return };"));
    assert!(bare_return("if x { return }"));
    assert!(!bare_return("        return None;"));
    assert!(!bare_return("    return Ok(());"));
    assert!(!bare_return("    // return;"));
    assert!(!bare_return("    early_return;"));
}

#[test]
fn no_integration_test_returns_early() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in std::fs::read_dir(&crates).expect("crates/").flatten() {
        test_files(&c.path().join("tests"), &mut files);
    }
    assert!(files.len() > 50, "found only {} test files", files.len());
    let this = Path::new(file!()).file_name().unwrap();
    let (mut skips, mut bad) = (0, Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        skips += text.matches("skip_kernel_limit!(").count();
        if f.file_name() == Some(this) {
            continue; // its own examples
        }
        for (i, l) in text.lines().enumerate() {
            if bare_return(l) {
                bad.push(format!("{}:{}: {}", f.display(), i + 1, l.trim()));
            }
        }
    }
    assert!(skips > 0, "no skip_kernel_limit! found: the scan is broken");
    assert!(
        bad.is_empty(),
        "a bare `return` in an integration test: a precondition fails the test through a \
         tern-testkit guard (`need_root`, `need_binary`, `need`), a kernel limit skips through \
         `tern_testkit::skip_kernel_limit!`, a finished loop ends with `break`: {bad:#?}"
    );
}
