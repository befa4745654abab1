//! Golden replay tests: a folder of cases, each a directory of input files and one expected
//! output, replayed by the test and compared line by line.
//!
//! The BGP RIB replay, the policy compiler's scenarios and the agent's route topologies share
//! this runner: [`check`] finds the cases, runs each, and either compares the output with the
//! case's expected file (all mismatches reported at once, each as `file:line: got …, want …`)
//! or, with [`UPDATE_ENV`]`=1`, rewrites the expected files after a change that was checked by
//! hand. [`parse`] reads one input file of a case, panicking with its path.
//!
//! ```no_run
//! # use std::path::Path;
//! fn run(case: &Path) -> String {
//!     let input = tern_testkit::golden::read(case, "input.txt");
//!     input.to_uppercase()
//! }
//! let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
//! tern_testkit::golden::check(&root, "output.txt", 4, run);
//! ```

use std::fmt::Display;
use std::path::{Path, PathBuf};

/// The variable that turns a golden test into a rewrite of its expected files (`1`).
pub const UPDATE_ENV: &str = "TERN_GOLDEN_UPDATE";

/// Whether this process rewrites the expected files ([`UPDATE_ENV`] is `1`).
pub fn updating() -> bool {
    std::env::var(UPDATE_ENV).is_ok_and(|v| v == "1")
}

/// The case directories under `root`, sorted by name. Panics when `root` cannot be read or
/// holds fewer than `min` cases (a moved folder must not make the test pass with no case).
pub fn cases(root: &Path, min: usize) -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", root.display()))
                .path()
        })
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= min,
        "{} golden cases in {}, expected at least {min}",
        cases.len(),
        root.display()
    );
    cases
}

/// The text of the case file `case/name`; panics naming the path when it cannot be read.
pub fn read(case: &Path, name: &str) -> String {
    let p = case.join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The case file `case/name` read and parsed with `parse` (e.g. `|t| serde_json::from_str(t)`);
/// panics naming the path when it cannot be read or parsed.
pub fn parse<T, E: Display>(
    case: &Path,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> T {
    let text = read(case, name);
    parse(&text).unwrap_or_else(|e| panic!("{}: {e}", case.join(name).display()))
}

/// `file:line: got …, want …` at the first line where `got` and `want` differ (line 1 when they
/// are equal line by line but not as text, e.g. a missing final newline).
pub fn first_difference(file: &Path, got: &str, want: &str) -> String {
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let i = (0..g.len().max(w.len()))
        .find(|&i| g.get(i) != w.get(i))
        .unwrap_or(0);
    format!(
        "{}:{}: got {:?}, want {:?}",
        file.display(),
        i + 1,
        g.get(i).unwrap_or(&"<end>"),
        w.get(i).unwrap_or(&"<end>")
    )
}

/// Compares `got` with the golden file `file` (one output, no cases), or rewrites the file when
/// [`updating`]. Panics at the first differing line.
pub fn check_file(file: &Path, got: &str) {
    check_file_with(updating(), file, got);
}

/// As [`check_file`], with the update switch given instead of read from [`UPDATE_ENV`].
pub fn check_file_with(update: bool, file: &Path, got: &str) {
    if update {
        std::fs::write(file, got).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        return;
    }
    let want = std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        got == want,
        "golden mismatch (rerun with {UPDATE_ENV}=1 after checking the change):\n{}",
        first_difference(file, got, &want)
    );
}

/// Runs `run` on every case under `root` (at least `min_cases`) and compares its output with
/// the case's `expected` file, or rewrites that file when [`updating`]. Panics listing every
/// mismatch.
pub fn check(root: &Path, expected: &str, min_cases: usize, run: impl Fn(&Path) -> String) {
    check_with(updating(), root, expected, min_cases, run);
}

/// As [`check`], with the update switch given instead of read from [`UPDATE_ENV`].
pub fn check_with(
    update: bool,
    root: &Path,
    expected: &str,
    min_cases: usize,
    run: impl Fn(&Path) -> String,
) {
    let mut failures = Vec::new();
    for case in cases(root, min_cases) {
        let got = run(&case);
        let file = case.join(expected);
        if update {
            std::fs::write(&file, &got).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            continue;
        }
        // A missing expected file is a mismatch against nothing, reported like any other.
        let want = std::fs::read_to_string(&file).unwrap_or_default();
        if got != want {
            failures.push(first_difference(&file, &got, &want));
        }
    }
    assert!(
        failures.is_empty(),
        "golden mismatch (rerun with {UPDATE_ENV}=1 after checking the change):\n{}",
        failures.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::tests::panic_message;

    /// A fresh directory of cases, removed when dropped (also when the test fails).
    struct Cases(PathBuf);
    impl Cases {
        fn new(tag: &str, cases: &[(&str, &str, Option<&str>)]) -> Cases {
            let root = std::env::temp_dir()
                .join(format!("tern-testkit-golden-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            for (name, input, expected) in cases {
                let dir = root.join(name);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("input.txt"), input).unwrap();
                if let Some(e) = expected {
                    std::fs::write(dir.join("output.txt"), e).unwrap();
                }
            }
            Cases(root)
        }
    }
    impl Drop for Cases {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn upper(case: &Path) -> String {
        read(case, "input.txt").to_uppercase()
    }

    #[test]
    fn the_first_differing_line_is_named() {
        let f = Path::new("c/output.txt");
        assert_eq!(
            first_difference(f, "a\nb\nc\n", "a\nx\nc\n"),
            "c/output.txt:2: got \"b\", want \"x\""
        );
        assert_eq!(
            first_difference(f, "a\n", "a\nb\n"),
            "c/output.txt:2: got \"<end>\", want \"b\""
        );
    }

    #[test]
    fn matching_cases_pass_and_mismatches_are_all_reported() {
        let ok = Cases::new(
            "ok",
            &[("a", "x\ny\n", Some("X\nY\n")), ("b", "z", Some("Z"))],
        );
        check_with(false, &ok.0, "output.txt", 2, upper);

        let bad = Cases::new(
            "bad",
            &[
                ("a", "x\ny\n", Some("X\nQ\n")),
                ("b", "z", None),
                ("c", "w", Some("W")),
            ],
        );
        let e = std::panic::catch_unwind(|| check_with(false, &bad.0, "output.txt", 3, upper))
            .expect_err("mismatches fail");
        let msg = panic_message(e);
        assert!(msg.contains(UPDATE_ENV), "{msg}");
        assert!(
            msg.contains("a/output.txt:2: got \"Y\", want \"Q\""),
            "{msg}"
        );
        assert!(
            msg.contains("b/output.txt:1: got \"Z\", want \"<end>\""),
            "{msg}"
        );
        assert!(!msg.contains("c/output.txt"), "{msg}");
    }

    #[test]
    fn update_rewrites_the_expected_files() {
        let c = Cases::new("update", &[("a", "x\n", Some("stale\n")), ("b", "y", None)]);
        check_with(true, &c.0, "output.txt", 2, upper);
        assert_eq!(read(&c.0.join("a"), "output.txt"), "X\n");
        assert_eq!(read(&c.0.join("b"), "output.txt"), "Y");
        check_with(false, &c.0, "output.txt", 2, upper);
    }

    #[test]
    fn one_file_is_compared_or_rewritten() {
        let c = Cases::new("file", &[("a", "x\n", Some("old\nline\n"))]);
        let file = c.0.join("a/output.txt");
        let e = std::panic::catch_unwind(|| check_file_with(false, &file, "new\nline\n"))
            .expect_err("a mismatch panics");
        let msg = panic_message(e);
        assert!(
            msg.contains("output.txt:1: got \"new\", want \"old\""),
            "{msg}"
        );
        check_file_with(true, &file, "new\nline\n");
        check_file_with(false, &file, "new\nline\n");
    }

    #[test]
    fn too_few_cases_fail() {
        let c = Cases::new("few", &[("a", "x", Some("X"))]);
        let e = std::panic::catch_unwind(|| cases(&c.0, 2)).expect_err("one case is too few");
        assert!(panic_message(e).contains("expected at least 2"));
    }

    #[test]
    fn parse_names_the_file_on_error() {
        let c = Cases::new("parse", &[("a", "12", None)]);
        let n: u32 = parse(&c.0.join("a"), "input.txt", |t| t.parse());
        assert_eq!(n, 12);
        let e =
            std::panic::catch_unwind(|| parse(&c.0.join("a"), "input.txt", |t| t.parse::<bool>()))
                .expect_err("12 is no bool");
        assert!(panic_message(e).contains("a/input.txt: "));
    }
}
