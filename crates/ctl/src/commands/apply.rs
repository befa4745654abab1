//! `ternctl apply -f FILE`: parse every document, validate all of them (including IPPool
//! overlaps with stored pools and with each other), and write only if all are valid.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use tern_model::limits::MAX_STREAM_BYTES;
use tern_model::parse::{Format, ParsedResource};
use tern_model::{IpPool, Kind, ModelError, Resource};
use tern_store::Store;

/// Reads `file` (`-` = stdin), refusing more than [`MAX_STREAM_BYTES`] before reading it all.
pub fn read_input(file: &str) -> anyhow::Result<(String, String)> {
    use std::io::Read;
    let (reader, name): (Box<dyn Read>, String) = if file == "-" {
        (Box::new(std::io::stdin()), "<stdin>".to_string())
    } else {
        let f = std::fs::File::open(file).with_context(|| format!("cannot read {file}"))?;
        (Box::new(f), file.to_string())
    };
    // One byte more than the limit tells "at the limit" from "over it" without reading on.
    let mut buf = Vec::new();
    reader
        .take(MAX_STREAM_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("cannot read resources from {name}"))?;
    if buf.len() > MAX_STREAM_BYTES {
        bail!(
            "{name}: more than {MAX_STREAM_BYTES} bytes ({} MiB), the limit per file",
            MAX_STREAM_BYTES >> 20
        );
    }
    let text = String::from_utf8(buf).with_context(|| format!("{name} is not UTF-8 text"))?;
    Ok((text, name))
}

/// Start line offset and lines of each non-empty document, as the model's reader
/// ([`tern_model::parse::split_stream`]) splits them.
#[cfg(test)]
fn yaml_documents(text: &str) -> Vec<(usize, Vec<&str>)> {
    tern_model::parse::split_stream(text, "")
        .map(|docs| {
            docs.into_iter()
                .map(|d| (d.line_offset, d.text.lines().collect()))
                .collect()
        })
        .unwrap_or_default()
}

/// Where each resource's document is, for pointing at lines: the document's line offset and
/// lines for a YAML document that is the resource; the offset alone (the error points at the
/// list's first line) for an item of a `kind: List`; nothing for JSON (the error names the
/// document's number instead, as before).
type Located<'a> = Vec<Option<(usize, Vec<&'a str>)>>;

fn locations<'a>(parsed: &[ParsedResource<'a>]) -> Located<'a> {
    parsed
        .iter()
        .map(|p| match (p.source.format, p.item) {
            (Format::Yaml, None) => Some((p.source.line_offset, p.source.text.lines().collect())),
            (Format::Yaml, Some(_)) => Some((p.source.line_offset, Vec::new())),
            (Format::Json, _) => None,
        })
        .collect()
}

/// 1-based file line of `field` (`spec.cidr`, `spec.addresses[0].address`) in a document,
/// found by looking for each path segment's key in turn.
fn field_line(doc: &(usize, Vec<&str>), field: &str) -> Option<usize> {
    let mut from = 0;
    let mut found = None;
    for seg in field.split('.') {
        let key = seg.split('[').next().unwrap_or(seg);
        if key.is_empty() {
            continue;
        }
        let pos = doc.1[from..].iter().position(|l| {
            let t = l.trim_start().trim_start_matches("- ");
            t.starts_with(&format!("{key}:"))
        })?;
        from += pos;
        found = Some(doc.0 + from + 1);
        from += 1;
    }
    found
}

/// Describes a validation error of document `index`, with its line for YAML input.
fn locate(err: &ModelError, file: &str, docs: &Located<'_>, index: usize) -> String {
    let doc = docs.get(index).and_then(Option::as_ref);
    let line = match err {
        ModelError::Invalid { field, .. } => doc.and_then(|d| field_line(d, field)),
        _ => None,
    }
    .or_else(|| doc.map(|d| d.0 + 1));
    match line {
        Some(l) => format!("{file}:{l}: {err}"),
        None => format!("{file}: document {}: {err}", index + 1),
    }
}

/// Validates every resource of the file; the full list of problems when any is invalid.
pub fn validate_all(
    store: &dyn Store,
    resources: &[Resource],
    text: &str,
    file: &str,
) -> anyhow::Result<Vec<String>> {
    let parsed = tern_model::parse_stream(text, file).unwrap_or_default();
    let docs = if parsed.len() == resources.len() {
        locations(&parsed)
    } else {
        Vec::new()
    };
    validate_located(store, resources, &docs, file)
}

fn validate_located(
    store: &dyn Store,
    resources: &[Resource],
    docs: &Located<'_>,
    file: &str,
) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        if let Err(e) = r.validate() {
            problems.push(locate(&e, file, docs, i));
        }
    }
    // Overlaps: against stored pools (except those this file replaces) and within the file.
    let file_pools: Vec<(usize, IpPool)> = resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Resource::IpPool(p) => Some((i, p.clone())),
            _ => None,
        })
        .collect();
    if !file_pools.is_empty() {
        let mut pools: BTreeMap<String, IpPool> = BTreeMap::new();
        for r in tern_model::list_resources(store, Kind::IpPool)
            .context("cannot read existing IP pools")?
        {
            if let Resource::IpPool(p) = r {
                pools.insert(p.metadata.name.clone(), p);
            }
        }
        for (_, p) in &file_pools {
            pools.insert(p.metadata.name.clone(), p.clone());
        }
        let all: Vec<IpPool> = pools.into_values().collect();
        for (i, p) in &file_pools {
            if let Some(msg) = tern_model::ip_pool_overlaps(p, &all) {
                let line = docs
                    .get(*i)
                    .and_then(Option::as_ref)
                    .and_then(|d| field_line(d, "spec.cidr"))
                    .map(|l| format!(":{l}"))
                    .unwrap_or_default();
                problems.push(format!("{file}{line}: spec.cidr: {msg}"));
            }
        }
    }
    Ok(problems)
}

/// Applies the resources in `text`: nothing is written unless every document is valid.
/// Returns the number of resources written per kind.
pub fn apply(store: &dyn Store, text: &str, file: &str) -> anyhow::Result<BTreeMap<Kind, usize>> {
    let parsed = tern_model::parse_stream(text, file)?;
    if parsed.is_empty() {
        bail!("{file}: no resources found");
    }
    let docs = locations(&parsed);
    let resources: Vec<Resource> = parsed.into_iter().map(|p| p.resource).collect();
    let problems = validate_located(store, &resources, &docs, file)?;
    if !problems.is_empty() {
        bail!(
            "{file} is invalid ({} problem{}); nothing was applied:\n  {}",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" },
            problems.join("\n  ")
        );
    }
    let mut counts = BTreeMap::new();
    for r in &resources {
        tern_model::put_resource(store, r)
            .with_context(|| format!("cannot write {} {:?}", r.kind(), r.name()))?;
        *counts.entry(r.kind()).or_insert(0) += 1;
    }
    Ok(counts)
}

/// The success message, as calicoctl words it.
pub fn summary(counts: &BTreeMap<Kind, usize>) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("Successfully applied {n} '{k}' resource(s)"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_store::mem::MemStore;

    const TWO_POOLS: &str = "\
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-a
spec:
  cidr: 10.244.0.0/16
---
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-b
spec:
  cidr: 10.245.0.0/16
  blockSize: 24
";

    #[test]
    fn applies_every_document() {
        let store = MemStore::new();
        let counts = apply(&store, TWO_POOLS, "pools.yaml").unwrap();
        assert_eq!(counts[&Kind::IpPool], 2);
        assert_eq!(
            summary(&counts),
            "Successfully applied 2 'IPPool' resource(s)"
        );
        let pools = tern_model::list_resources(&store, Kind::IpPool).unwrap();
        assert_eq!(pools.len(), 2);
        // Re-applying the same file updates in place.
        apply(&store, TWO_POOLS, "pools.yaml").unwrap();
        assert_eq!(
            tern_model::list_resources(&store, Kind::IpPool)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn one_invalid_document_writes_nothing_and_names_the_line() {
        let store = MemStore::new();
        let text = TWO_POOLS.replace("10.245.0.0/16", "10.245.0.0/33");
        let e = format!("{:#}", apply(&store, &text, "pools.yaml").unwrap_err());
        assert!(e.contains("pools.yaml:13:"), "{e}");
        assert!(e.contains("spec.cidr"), "{e}");
        assert!(e.contains("nothing was applied"), "{e}");
        assert!(
            tern_model::list_resources(&store, Kind::IpPool)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn parse_errors_name_file_and_line() {
        let store = MemStore::new();
        let text = TWO_POOLS.replace("blockSize: 24", "blockSize: big");
        let e = format!("{:#}", apply(&store, &text, "pools.yaml").unwrap_err());
        assert!(e.contains("pools.yaml:14"), "{e}");
        assert!(e.contains("blockSize"), "{e}");
        assert!(
            tern_model::list_resources(&store, Kind::IpPool)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn overlapping_pools_are_refused() {
        let store = MemStore::new();
        apply(&store, TWO_POOLS, "pools.yaml").unwrap();
        let other = "\
apiVersion: tern.dev/v1
kind: IPPool
metadata:
  name: pool-c
spec:
  cidr: 10.244.128.0/17
";
        let e = format!("{:#}", apply(&store, other, "c.yaml").unwrap_err());
        assert!(e.contains("c.yaml:6: spec.cidr"), "{e}");
        assert!(e.contains("pool-a"), "{e}");
        // Within one file as well.
        let store2 = MemStore::new();
        let both = format!("{TWO_POOLS}---\n{other}");
        assert!(apply(&store2, &both, "x.yaml").is_err());
        assert!(
            tern_model::list_resources(&store2, Kind::IpPool)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn json_input_is_accepted() {
        let store = MemStore::new();
        let json = r#"{"apiVersion":"tern.dev/v1","kind":"IPPool",
            "metadata":{"name":"j"},"spec":{"cidr":"10.1.0.0/16"}}"#;
        apply(&store, json, "p.json").unwrap();
        let p = tern_model::get_resource(&store, Kind::IpPool, None, "j")
            .unwrap()
            .unwrap();
        match p {
            Resource::IpPool(p) => assert_eq!(p.spec.block_size, 26),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Issue 10: a selector of a few KB aborted ternctl with a stack overflow; now it is
    /// refused naming the field and the limit, and nothing is written.
    #[test]
    fn hostile_selectors_are_refused_naming_field_and_limit() {
        let store = MemStore::new();
        let gnp = |sel: &str| {
            format!(
                "apiVersion: tern.dev/v1\nkind: GlobalNetworkPolicy\nmetadata:\n  name: g\nspec:\n  selector: \"{sel}\"\n"
            )
        };
        let e = format!(
            "{:#}",
            apply(&store, &gnp(&"a".repeat(9000)), "g.yaml").unwrap_err()
        );
        assert!(
            e.contains("g.yaml:6: GlobalNetworkPolicy \"g\": spec.selector: selector is 9000 bytes, the limit is 4096"),
            "{e}"
        );
        let deep = format!("{}all(){}", "(".repeat(50_000), ")".repeat(50_000));
        let e = format!("{:#}", apply(&store, &gnp(&deep), "g.yaml").unwrap_err());
        assert!(e.contains("the limit is 4096"), "{e}");
        let deep = format!("{}all(){}", "(".repeat(40), ")".repeat(40));
        let e = format!("{:#}", apply(&store, &gnp(&deep), "g.yaml").unwrap_err());
        assert!(
            e.contains("spec.selector: selector nests deeper than 32"),
            "{e}"
        );
        let pool = "apiVersion: tern.dev/v1\nkind: IPPool\nmetadata:\n  name: p\nspec:\n  cidr: 10.0.0.0/16\n  nodeSelector: \"!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!all()\"\n";
        let e = format!("{:#}", apply(&store, pool, "p.yaml").unwrap_err());
        assert!(
            e.contains("p.yaml:7: IPPool \"p\": spec.nodeSelector: selector nests deeper"),
            "{e}"
        );
        assert!(
            tern_model::list_resources(&store, Kind::GlobalNetworkPolicy)
                .unwrap()
                .is_empty()
        );
        assert!(
            tern_model::list_resources(&store, Kind::IpPool)
                .unwrap()
                .is_empty()
        );
    }

    /// Issue 11: a stream of JSON documents separated by `---` (what many tools emit) was
    /// refused with "trailing characters".
    #[test]
    fn json_document_stream_is_applied() {
        let store = MemStore::new();
        let doc = |n: &str, c: &str| {
            format!(
                r#"{{"apiVersion":"tern.dev/v1","kind":"IPPool","metadata":{{"name":"{n}"}},"spec":{{"cidr":"{c}"}}}}"#
            )
        };
        let text = format!(
            "{}\n---\n{}\n",
            doc("a", "10.1.0.0/16"),
            doc("b", "10.2.0.0/16")
        );
        let counts = apply(&store, &text, "-").unwrap();
        assert_eq!(counts[&Kind::IpPool], 2);
        // A validation error in the second document names its line.
        let text = format!(
            "{}\n---\n{}\n",
            doc("c", "10.3.0.0/16"),
            doc("d", "10.4.0.0/33")
        );
        let e = format!("{:#}", apply(&store, &text, "s.json").unwrap_err());
        assert!(e.contains("s.json: document 2:"), "{e}");
        assert!(e.contains("spec.cidr"), "{e}");
    }

    #[test]
    fn oversized_input_is_refused_before_it_is_read_whole() {
        let path = std::env::temp_dir().join(format!("tern-apply-big-{}.yaml", std::process::id()));
        struct Rm(std::path::PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let _rm = Rm(path.clone());
        std::fs::write(&path, vec![b'#'; MAX_STREAM_BYTES + 1]).unwrap();
        let e = format!("{:#}", read_input(path.to_str().unwrap()).unwrap_err());
        assert!(
            e.contains("more than 8388608 bytes (8 MiB), the limit per file"),
            "{e}"
        );
        std::fs::write(&path, b"# empty\n").unwrap();
        assert_eq!(read_input(path.to_str().unwrap()).unwrap().0, "# empty\n");
    }

    #[test]
    fn field_lines() {
        let docs = yaml_documents(TWO_POOLS);
        assert_eq!(docs.len(), 2);
        assert_eq!(field_line(&docs[0], "spec.cidr"), Some(6));
        assert_eq!(field_line(&docs[1], "metadata.name"), Some(11));
        assert_eq!(field_line(&docs[1], "spec.blockSize"), Some(14));
        assert_eq!(field_line(&docs[1], "spec.natOutgoing"), None);
    }
}
