//! Every crate whose library has no `unsafe` code forbids it (`#![forbid(unsafe_code)]` in
//! `src/lib.rs`), so none creeps in unnoticed; the crates that need it say why each block is
//! sound (`// SAFETY:`, clippy's `undocumented_unsafe_blocks`, on for the workspace). The
//! library is its module tree as `tern_testkit::modules` reads it, unit tests included.

/// Whether a line of code opens an unsafe block, function, impl or trait.
fn uses_unsafe(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    code.match_indices("unsafe").any(|(i, _)| {
        let before = code[..i].chars().last();
        let after = code[i + "unsafe".len()..].trim_start();
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && ["{", "fn ", "impl", "trait ", "extern "]
                .iter()
                .any(|k| after.starts_with(k))
    })
}

#[test]
fn crates_without_unsafe_code_forbid_it() {
    let mut missing = Vec::new();
    for c in tern_testkit::modules::workspace_crates(env!("CARGO_MANIFEST_DIR")) {
        let g = tern_testkit::modules::graph(&c);
        let has_unsafe = g.files.values().any(|f| {
            let text =
                std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            text.lines().any(uses_unsafe)
        });
        let lib = std::fs::read_to_string(c.join("src/lib.rs")).expect("lib.rs");
        if !has_unsafe && !lib.contains("#![forbid(unsafe_code)]") {
            missing.push(g.name);
        }
    }
    assert!(
        missing.is_empty(),
        "these crates have no unsafe code but do not say #![forbid(unsafe_code)] in src/lib.rs: \
         {missing:?}"
    );
}

#[test]
fn unsafe_is_found_as_code() {
    assert!(uses_unsafe("    let x = unsafe { libc::geteuid() };"));
    assert!(uses_unsafe("pub unsafe fn f() {}"));
    assert!(uses_unsafe("unsafe impl Send for X {}"));
    assert!(!uses_unsafe("        .arg(\"--unsafe-no-fsync\")"));
    assert!(!uses_unsafe("    // unsafe { not code }"));
    assert!(!uses_unsafe("#![forbid(unsafe_code)]"));
}
