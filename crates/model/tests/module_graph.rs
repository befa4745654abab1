//! The module graph of `tern-model` is acyclic, and generic code reaches the kind modules only
//! through the table (`registry`).
//!
//! A plain text scan of `src/`: every `crate::a::b` path (including `use crate::{a, b::c}`
//! groups) and `super::` path outside comments is an edge from the file's module to the
//! longest module prefix of the path, or to the crate root (`lib.rs`) when the path names an
//! item re-exported there. A parent module has an edge to each child it declares, so a module
//! importing through the root or its parent shows up as a cycle. Code after `#[cfg(test)]` is
//! not scanned: unit tests may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`kinds::ippool`; `crate` for lib.rs) of each source file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let mut pre = prefix.to_vec();
                pre.push(stem);
                walk(&p, &pre, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let mut path = prefix.to_vec();
                if stem != "mod" && !(prefix.is_empty() && stem == "lib") {
                    path.push(stem.clone());
                }
                if prefix.is_empty() && stem == "lib" {
                    out.insert("crate".into(), p);
                } else if !(prefix.is_empty() && stem == "main") {
                    out.insert(path.join("::"), p);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &[], &mut out);
    out
}

/// The code of a file without comments and without what follows `#[cfg(test)]`.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let line = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Expands the path tree after `crate::` or `super::` at the start of `s` (`a::b`,
/// `{a, b::{c, d}}`) into paths of identifiers.
fn paths(s: &str) -> Vec<Vec<String>> {
    fn tree(s: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while *i < s.len() && s[*i].is_ascii_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == b'{' {
                *i += 1;
                loop {
                    tree(s, i, path.clone(), out);
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            break;
                        }
                        _ => break,
                    }
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&b'}') {
                        *i += 1;
                        break;
                    }
                }
                // not a skip: control flow
                return;
            }
            let start = *i;
            while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
                *i += 1;
            }
            if start == *i {
                break;
            }
            path.push(String::from_utf8_lossy(&s[start..*i]).to_string());
            if s[*i..].starts_with(b"::") {
                *i += 2;
            } else {
                break;
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    tree(s.as_bytes(), &mut 0, Vec::new(), &mut out);
    out
}

/// Edges from `module` (whose code is `code`) to the modules it names.
fn edges(module: &str, code: &str, all: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let self_path: Vec<String> = if module == "crate" {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let resolve = |segs: Vec<String>, out: &mut BTreeSet<String>| {
        let target = (1..=segs.len())
            .rev()
            .map(|n| segs[..n].join("::"))
            .find(|p| all.contains(p))
            .unwrap_or_else(|| "crate".to_string());
        if target != module {
            out.insert(target);
        }
    };
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = code.as_bytes();
    for (marker, base) in [
        ("crate::", Vec::new()),
        (
            "super::",
            self_path[..self_path.len().saturating_sub(1)].to_vec(),
        ),
    ] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(marker) {
            let at = from + pos;
            from = at + marker.len();
            if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                continue;
            }
            for p in paths(&code[from..]) {
                let mut segs = base.clone();
                segs.extend(p);
                resolve(segs, &mut out);
            }
        }
    }
    // A parent depends on the children it declares.
    for line in code.lines() {
        let t = line.trim();
        let decl = t
            .strip_prefix("pub mod ")
            .or_else(|| t.strip_prefix("pub(crate) mod "))
            .or_else(|| t.strip_prefix("mod "));
        if let Some(name) = decl.and_then(|d| d.strip_suffix(';')) {
            let mut child = self_path.clone();
            child.push(name.trim().to_string());
            out.insert(child.join("::"));
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    assert!(
        mods.len() > 5,
        "found only {mods:?} under {}",
        src.display()
    );
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    mods.iter()
        .map(|(m, p)| {
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            (m.clone(), edges(m, &code(&text), &names))
        })
        .collect()
}

fn render(g: &BTreeMap<String, BTreeSet<String>>) -> String {
    g.iter()
        .map(|(m, deps)| {
            format!(
                "  {m} -> {}\n",
                deps.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

/// A cycle of the graph, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        mark: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        mark.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            match mark.get(d).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let i = stack
                        .iter()
                        .position(|s| s == d)
                        .expect("open is on the stack");
                    let mut c = stack[i..].to_vec();
                    c.push(d.clone());
                    return Some(c);
                }
                Mark::New => {
                    if let Some(c) = visit(d, g, mark, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        mark.insert(n.to_string(), Mark::Done);
        None
    }
    let mut mark = BTreeMap::new();
    for n in g.keys() {
        if mark.get(n).copied().unwrap_or(Mark::New) == Mark::New
            && let Some(c) = visit(n, g, &mut mark, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn module_graph_is_acyclic() {
    let g = graph();
    if let Some(c) = find_cycle(&g) {
        panic!(
            "tern-model's modules import each other in a circle: {}\nmodule graph:\n{}",
            c.join(" -> "),
            render(&g)
        );
    }
    println!("module graph:\n{}", render(&g));
}

#[test]
fn generic_code_reaches_kinds_only_through_the_table() {
    let g = graph();
    for (m, deps) in &g {
        let generic = !(m == "crate" || m == "registry" || m.starts_with("kinds"));
        let to_kinds: Vec<_> = deps.iter().filter(|d| d.starts_with("kinds")).collect();
        assert!(
            !generic || to_kinds.is_empty(),
            "{m} imports {to_kinds:?}; generic code must go through the registry\nmodule graph:\n{}",
            render(&g)
        );
    }
    for leaf in ["error", "limits", "document", "validate"] {
        let deps = &g[leaf];
        assert!(
            deps.iter().all(|d| d == "limits"),
            "{leaf} must be a leaf (it may use only limits) but imports {deps:?}"
        );
    }
}

/// The scanner itself sees the edges it must: a cycle through the root is found.
#[test]
fn scanner_finds_edges_and_cycles() {
    let all: BTreeSet<String> = ["crate", "a", "kinds", "kinds::x", "kinds::y"]
        .into_iter()
        .map(str::to_string)
        .collect();
    let e = edges(
        "kinds::x",
        &code(
            "use crate::{a::B, kinds::y::{C, D}};\nuse super::Z;\n// crate::ignored::x\nfn f() { crate::Thing::new() }\n",
        ),
        &all,
    );
    let want: BTreeSet<String> = ["a", "kinds", "kinds::y", "crate"]
        .into_iter()
        .map(str::to_string)
        .collect();
    assert_eq!(e, want);
    let mut g = BTreeMap::new();
    g.insert("crate".to_string(), edges("crate", "pub mod a;\n", &all));
    g.insert("a".to_string(), edges("a", "use crate::Thing;\n", &all));
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".to_string(), "crate".to_string(), "a".to_string()])
    );
}
