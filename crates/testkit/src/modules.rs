//! The module graph of a crate, read from its sources, for the tests that keep every crate's
//! modules acyclic (`crates/*/tests/module_graph.rs`) and the agent's layering on top of them.
//!
//! [`graph`] follows the `mod` declarations from `src/lib.rs`: every file module is a node,
//! named by its path (`kinds::ippool`; `crate` for `lib.rs`). Its code is read without comments,
//! string and character literals, and `#[cfg(test)]` items (unit tests may use anything), and
//! every `crate::`, `super::` and `self::` path in it (`use crate::{a, b::{c, d}}` groups
//! included) is an edge to the longest module prefix of the path, or to `crate` when the path
//! names an item of the root (an item of `lib.rs` or one it re-exports). A parent's plain
//! `child::item` paths are not read: a parent and the children it declares are one unit unless
//! a crate asks for the stricter [`Graph::with_declarations`].
//! A module declared with a file only for unit tests (`#[cfg(test)] mod testutil;`) is a node
//! like any other: its file is read whole.
//!
//! ```no_run
//! let g = tern_testkit::modules::graph(env!("CARGO_MANIFEST_DIR"));
//! tern_testkit::modules::assert_acyclic(&g);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The name of the crate root's node.
pub const ROOT: &str = "crate";

/// A crate's modules and the modules each one names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    /// The crate, for messages (its directory's name).
    pub name: String,
    /// The file of each module.
    pub files: BTreeMap<String, PathBuf>,
    /// The modules each module names (never itself).
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

/// The module graph of the crate in `crate_dir` (the directory holding `Cargo.toml`). Panics
/// when a file cannot be read or a declared module has no file.
pub fn graph(crate_dir: impl AsRef<Path>) -> Graph {
    let dir = crate_dir.as_ref();
    let lib = dir.join("src/lib.rs");
    let mut files = BTreeMap::new();
    let mut texts = BTreeMap::new();
    let mut queue = vec![(ROOT.to_string(), lib)];
    while let Some((module, file)) = queue.pop() {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("module graph: {}: {e}", file.display()));
        let stripped = strip(&text);
        for child in declared_modules(&stripped) {
            let path = if module == ROOT {
                child.clone()
            } else {
                format!("{module}::{child}")
            };
            queue.push((path, child_file(&file, &child)));
        }
        texts.insert(module.clone(), without_tests(&stripped));
        files.insert(module, file);
    }
    let names: BTreeSet<String> = files.keys().cloned().collect();
    let edges = texts
        .iter()
        .map(|(m, code)| (m.clone(), edges(m, code, &names)))
        .collect();
    let name = dir
        .canonicalize()
        .unwrap_or_else(|_| dir.to_path_buf())
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
    Graph { name, files, edges }
}

/// The directories of the workspace's crates (`crates/*` with a `Cargo.toml`), sorted, found
/// from `crate_dir`, one of them. Panics when there are fewer than ten (a moved folder must not
/// make a check over every crate pass on none).
pub fn workspace_crates(crate_dir: impl AsRef<Path>) -> Vec<PathBuf> {
    let crates = crate_dir.as_ref().join("..");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap_or_else(|e| panic!("{}: {e}", crates.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    out.sort();
    assert!(
        out.len() >= 10,
        "found only {} crates under {}",
        out.len(),
        crates.display()
    );
    out
}

/// Panics, naming the cycle and printing the graph, when `g` has a cycle.
#[track_caller]
pub fn assert_acyclic(g: &Graph) {
    if let Some(c) = g.find_cycle() {
        panic!(
            "{}: modules import each other in a circle: {}\nmodule graph (module -> imports):\n{}",
            g.name,
            c.join(" -> "),
            g.render()
        );
    }
}

impl Graph {
    /// The graph with an edge from every module to each child it declares: a child naming its
    /// parent, or anything through the root, is then a cycle.
    pub fn with_declarations(mut self) -> Graph {
        let names: Vec<String> = self.files.keys().cloned().collect();
        for m in names.iter().filter(|m| m.as_str() != ROOT) {
            let parent = m.rsplit_once("::").map_or(ROOT, |(p, _)| p);
            self.edges
                .entry(parent.to_string())
                .or_default()
                .insert(m.clone());
        }
        self
    }

    /// The graph of the top-level modules: `a::b` is merged into `a`, edges inside one
    /// top-level module are dropped.
    pub fn top_level(&self) -> Graph {
        let top = |m: &str| m.split("::").next().unwrap_or(m).to_string();
        let mut g = Graph {
            name: self.name.clone(),
            ..Graph::default()
        };
        for (m, f) in &self.files {
            g.files.entry(top(m)).or_insert_with(|| f.clone());
        }
        for (m, to) in &self.edges {
            let from = top(m);
            let set = g.edges.entry(from.clone()).or_default();
            set.extend(to.iter().map(|t| top(t)).filter(|t| *t != from));
        }
        g
    }

    /// A cycle of the graph (`a -> b -> a`), if it has one.
    pub fn find_cycle(&self) -> Option<Vec<String>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        fn visit(
            n: &str,
            g: &Graph,
            mark: &mut BTreeMap<String, Mark>,
            stack: &mut Vec<String>,
        ) -> Option<Vec<String>> {
            match mark.get(n) {
                Some(Mark::Done) => return None,
                Some(Mark::Open) => {
                    let at = stack.iter().position(|s| s == n).expect("open is stacked");
                    let mut c = stack[at..].to_vec();
                    c.push(n.to_string());
                    return Some(c);
                }
                None => {}
            }
            mark.insert(n.to_string(), Mark::Open);
            stack.push(n.to_string());
            for d in g.edges.get(n).into_iter().flatten() {
                if let Some(c) = visit(d, g, mark, stack) {
                    return Some(c);
                }
            }
            stack.pop();
            mark.insert(n.to_string(), Mark::Done);
            None
        }
        let mut mark = BTreeMap::new();
        self.edges
            .keys()
            .find_map(|n| visit(n, self, &mut mark, &mut Vec::new()))
    }

    /// One line per module: `  module -> a, b`.
    pub fn render(&self) -> String {
        self.edges
            .iter()
            .map(|(m, to)| {
                let to: Vec<&str> = to.iter().map(String::as_str).collect();
                format!("  {m} -> {}\n", to.join(", "))
            })
            .collect()
    }

    /// The code of module `m` as the scanner reads it (see [`code`]).
    pub fn code(&self, m: &str) -> String {
        let f = &self.files[m];
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        code(&text)
    }
}

/// `text` without comments, without the contents of string and character literals, and without
/// `#[cfg(test)]` items; line breaks are kept, so line numbers still hold.
pub fn code(text: &str) -> String {
    without_tests(&strip(text))
}

/// The file of module `child` declared in `parent_file`.
fn child_file(parent_file: &Path, child: &str) -> PathBuf {
    let dir = parent_file.parent().expect("a source file has a directory");
    let stem = parent_file.file_stem().unwrap_or_default();
    let dir = if stem == "lib" || stem == "mod" || stem == "main" {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    let candidates = [
        dir.join(format!("{child}.rs")),
        dir.join(child).join("mod.rs"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "module graph: {} declares `mod {child};` but neither {} nor {} exists",
                parent_file.display(),
                candidates[0].display(),
                candidates[1].display()
            )
        })
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every `mod name` of stripped code: the name, and what follows it.
fn mod_items(code: &str) -> Vec<(String, &str)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("mod") {
        let at = from + pos;
        from = at + 3;
        if (at > 0 && is_ident(b[at - 1]))
            || !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace())
        {
            continue;
        }
        let rest = code[at + 3..].trim_start();
        let len = rest.bytes().take_while(|&c| is_ident(c)).count();
        if len > 0 {
            out.push((rest[..len].to_string(), rest[len..].trim_start()));
        }
    }
    out
}

/// The modules declared with a file (`mod x;`, `pub(crate) mod x;`) in stripped code.
fn declared_modules(code: &str) -> Vec<String> {
    mod_items(code)
        .into_iter()
        .filter(|(_, after)| after.starts_with(';'))
        .map(|(name, _)| name)
        .collect()
}

/// Blanks comments and the contents of string, byte-string and character literals (raw ones
/// included) with spaces, keeping line breaks.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == '"' {
            // A string: up to the next unescaped quote.
            blank(&mut out, c[i]);
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            if i < c.len() {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"') | Some('#'))
            && {
                let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
                c.get(i + 1 + hashes) == Some(&'"')
            }
        {
            // A raw string: r#"..."# with as many hashes at the end.
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            let body = i + 1 + hashes + 1;
            let mut j = body;
            while j < c.len()
                && !(c[j] == '"'
                    && c[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&x| x == '#')
                        .count()
                        == hashes)
            {
                j += 1;
            }
            let end = (j + 1 + hashes).min(c.len());
            for &ch in &c[i..end] {
                blank(&mut out, ch);
            }
            i = end;
        } else if c[i] == '\'' {
            // A character literal ('a', '\n', '\u{..}') or a lifetime ('a): only the first is
            // blanked.
            let end = if next == Some('\\') {
                // The closing quote comes after the escaped character (`'\''` too).
                c.get(i + 3..)
                    .and_then(|rest| rest.iter().position(|&x| x == '\''))
                    .map(|p| i + 3 + p)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for &ch in &c[i..=e] {
                        blank(&mut out, ch);
                    }
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Stripped code without its `#[cfg(test)]` items (a `mod tests { .. }`, a function, a `use`).
fn without_tests(code: &str) -> String {
    const ATTR: &str = "#[cfg(test)]";
    let b = code.as_bytes();
    let mut out = code.as_bytes().to_vec();
    let mut from = 0;
    while let Some(pos) = code[from..].find(ATTR) {
        let start = from + pos;
        let mut i = start + ATTR.len();
        // Further attributes of the same item.
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if b.get(i) == Some(&b'#') {
                i = matching(b, i + 1).map_or(b.len(), |e| e + 1);
            } else {
                break;
            }
        }
        let item = code[i..].trim_start_matches("pub ").trim_start();
        let end = if item.starts_with("use ") {
            code[i..].find(';').map_or(b.len(), |p| i + p + 1)
        } else {
            let mut j = i;
            let mut depth = 0i32;
            loop {
                match b.get(j) {
                    None => break b.len(),
                    Some(b'(') | Some(b'[') => depth += 1,
                    Some(b')') | Some(b']') => depth -= 1,
                    Some(b';') if depth == 0 => break j + 1,
                    Some(b'{') if depth == 0 => break matching(b, j).map_or(b.len(), |e| e + 1),
                    _ => {}
                }
                j += 1;
            }
        };
        for x in &mut out[start..end] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        from = end;
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The index of the bracket closing the one at `open` (`{`, `[` or `(`).
fn matching(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (j, &x) in b.iter().enumerate().skip(open) {
        match x {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

/// Expands the path tree at the start of `s` (`a::b`, `{a, b::{c, d as e}, self}`) into paths
/// of identifiers; a glob or an alias ends its path.
fn paths(s: &str) -> Vec<Vec<String>> {
    fn skip_ws(s: &[u8], i: &mut usize) {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    }
    fn tree(s: &[u8], i: &mut usize, mut path: Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            skip_ws(s, i);
            if s.get(*i) == Some(&b'{') {
                *i += 1;
                loop {
                    skip_ws(s, i);
                    if s.get(*i) == Some(&b'}') {
                        *i += 1;
                        break;
                    }
                    tree(s, i, path.clone(), out);
                    // Past an alias (`as x`) to the next item or the group's end.
                    while *i < s.len() && s[*i] != b',' && s[*i] != b'}' && s[*i] != b'{' {
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
                }
                // The group was the rest of this path.
                break;
            }
            let start = *i;
            while *i < s.len() && is_ident(s[*i]) {
                *i += 1;
            }
            if start == *i {
                out.push(path);
                break;
            }
            path.push(String::from_utf8_lossy(&s[start..*i]).into_owned());
            if s[*i..].starts_with(b"::") {
                *i += 2;
            } else {
                out.push(path);
                break;
            }
        }
    }
    let mut out = Vec::new();
    tree(s.as_bytes(), &mut 0, Vec::new(), &mut out);
    out
}

/// The inline modules (`mod x { .. }`) of stripped code: where each body starts and ends, and
/// its name, in order of their start.
fn inline_modules(code: &str) -> Vec<(usize, usize, String)> {
    mod_items(code)
        .into_iter()
        .filter(|(_, after)| after.starts_with('{'))
        .map(|(name, after)| {
            let open = code.len() - after.len();
            let close = matching(code.as_bytes(), open).unwrap_or(code.len());
            (open, close, name)
        })
        .collect()
}

/// The modules that `module`, whose code is `code`, names through `crate::`, `super::` and
/// `self::` paths, among the modules `all`.
fn edges(module: &str, code: &str, all: &BTreeSet<String>) -> BTreeSet<String> {
    let own: Vec<String> = if module == ROOT {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let b = code.as_bytes();
    let inline = inline_modules(code);
    let mut out = BTreeSet::new();
    for marker in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(pos) = code[from..].find(marker) {
            let at = from + pos;
            from = at + marker.len();
            if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b':') {
                continue;
            }
            let head = &marker[..marker.len() - 2];
            // The module the path is written in: the file's, and the inline modules around it.
            let mut here = own.clone();
            here.extend(
                inline
                    .iter()
                    .filter(|(s, e, _)| *s < at && at < *e)
                    .map(|(_, _, n)| n.clone()),
            );
            for p in paths(&code[from..]) {
                let mut segs = match head {
                    "crate" => Vec::new(),
                    "super" => here[..here.len().saturating_sub(1)].to_vec(),
                    _ => here.clone(),
                };
                for s in p {
                    match s.as_str() {
                        "super" => {
                            segs.pop();
                        }
                        "self" => {}
                        _ => segs.push(s),
                    }
                }
                let target = (1..=segs.len())
                    .rev()
                    .map(|n| segs[..n].join("::"))
                    .find(|p| all.contains(p))
                    .unwrap_or_else(|| ROOT.to_string());
                if target != module {
                    out.insert(target);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn paths_expand_groups_aliases_and_globs() {
        assert_eq!(
            paths("{a::B, kinds::y::{C, D as E}, self, z::*};"),
            vec![
                vec!["a", "B"],
                vec!["kinds", "y", "C"],
                vec!["kinds", "y", "D"],
                vec!["self"],
                vec!["z"],
            ]
        );
        assert_eq!(paths("g::h(x)"), vec![vec!["g", "h"]]);
    }

    #[test]
    fn strip_blanks_comments_and_literals_only() {
        let src = "let a = \"crate::x\"; // crate::y\nlet b = r#\"crate::\"z\"#; /* crate::w /* n */ */ crate::v\nfn f<'a>(c: char) -> &'a str { if c == '\"' { crate::u } else { '\\''; 'x' } }\n";
        let s = strip(src);
        assert_eq!(s.lines().count(), src.lines().count());
        assert!(!s.contains("crate::x") && !s.contains("crate::y"));
        assert!(!s.contains("crate::\"z") && !s.contains("crate::w"));
        assert!(s.contains("crate::v") && s.contains("crate::u") && s.contains("<'a>"));
        // Only the two lifetimes keep their quote.
        assert_eq!(s.matches('\'').count(), 2, "{s}");
    }

    #[test]
    fn test_items_are_left_out() {
        let src = "use crate::a;\n#[cfg(test)]\nuse crate::b;\n#[cfg(test)]\n#[allow(dead_code)]\nfn t() { crate::c::f() }\nfn keep() { crate::d::f() }\n#[cfg(test)]\nmod tests { use crate::e; fn x() { {} } }\nuse crate::f;\n";
        let c = code(src);
        for kept in ["crate::a", "crate::d", "crate::f"] {
            assert!(c.contains(kept), "{kept} lost: {c}");
        }
        for gone in ["crate::b", "crate::c", "crate::e"] {
            assert!(!c.contains(gone), "{gone} kept: {c}");
        }
    }

    #[test]
    fn edges_resolve_to_the_longest_module_prefix() {
        let all = set(&["crate", "a", "kinds", "kinds::x", "kinds::y"]);
        let e = edges(
            "kinds::x",
            &code(
                "use crate::{a::B, kinds::y::{C, D}};\nuse super::Z;\nuse self::inner::Q;\n// crate::ignored::x\nfn f() { crate::Thing::new(); tern_crate::x(); $crate::a::m!() }\n",
            ),
            &all,
        );
        assert_eq!(e, set(&["a", "kinds", "kinds::y", "crate"]));
        assert_eq!(
            edges("kinds::x", "use super::super::a::B;", &all),
            set(&["a"])
        );
        // `super` in an inline module is the file's module.
        assert_eq!(
            edges(
                "a",
                "pub mod inner {\n    use super::*;\n    use self::deep::X;\n}\nuse super::kinds::y::Z;",
                &all
            ),
            set(&["kinds::y"])
        );
    }

    #[test]
    fn cycles_are_found_with_and_without_declarations() {
        let dir = TempDir::new();
        let src = dir.0.join("src");
        std::fs::create_dir_all(src.join("b")).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "pub mod a;\n#[cfg(test)]\nmod b;\npub struct Root;\n",
        )
        .unwrap();
        std::fs::write(src.join("a.rs"), "use crate::Root;\n").unwrap();
        std::fs::write(src.join("b/mod.rs"), "mod c;\nuse crate::a;\n").unwrap();
        std::fs::write(src.join("b/c.rs"), "use super::super::a::X;\n").unwrap();
        let g = graph(&dir.0);
        assert_eq!(
            g.files.keys().collect::<Vec<_>>(),
            ["a", "b", "b::c", "crate"]
        );
        assert_eq!(g.edges["a"], set(&["crate"]));
        assert_eq!(g.edges["b::c"], set(&["a"]));
        assert_eq!(g.find_cycle(), None);
        assert_eq!(g.top_level().edges["b"], set(&["a"]));
        let strict = g.with_declarations();
        assert_eq!(
            strict.find_cycle(),
            Some(vec!["a".to_string(), "crate".to_string(), "a".to_string()])
        );
        let msg = std::panic::catch_unwind(|| assert_acyclic(&strict))
            .expect_err("a cycle panics")
            .downcast::<String>()
            .expect("a formatted message");
        assert!(msg.contains("a -> crate -> a"), "{msg}");
    }

    /// A directory of this test's own, removed when dropped (on failure too).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            let d = std::env::temp_dir().join(format!(
                "tern-testkit-modules-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir(&d).unwrap();
            TempDir(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
