//! `ternctl apply -f FILE`: parse every document, validate all of them (including IPPool
//! overlaps with stored pools and with each other), and write only if all are valid.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use tern_model::{IpPool, Kind, ModelError, Resource};
use tern_store::Store;

/// Reads `file` (`-` = stdin).
pub fn read_input(file: &str) -> anyhow::Result<(String, String)> {
    if file == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("cannot read resources from stdin")?;
        Ok((s, "<stdin>".to_string()))
    } else {
        let s = std::fs::read_to_string(file).with_context(|| format!("cannot read {file}"))?;
        Ok((s, file.to_string()))
    }
}

/// Start lines (0-based) and lines of each non-empty YAML document, split as the model splits.
fn yaml_documents(text: &str) -> Vec<(usize, Vec<&str>)> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut cur = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if t == "---" || t.starts_with("--- ") || t == "..." {
            docs.push((start, std::mem::take(&mut cur)));
            start = i + 1;
            continue;
        }
        cur.push(line);
    }
    docs.push((start, cur));
    docs.into_iter()
        .filter(|(_, d)| {
            d.iter().any(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
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
fn locate(err: &ModelError, file: &str, docs: &[(usize, Vec<&str>)], index: usize) -> String {
    let line = match err {
        ModelError::Invalid { field, .. } => docs.get(index).and_then(|d| field_line(d, field)),
        _ => None,
    }
    .or_else(|| docs.get(index).map(|d| d.0 + 1));
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
    let is_yaml = {
        let t = text.trim_start();
        !(file.ends_with(".json") || t.starts_with('{') || t.starts_with('['))
    };
    let docs = if is_yaml {
        yaml_documents(text)
    } else {
        Vec::new()
    };
    let mut problems = Vec::new();
    for (i, r) in resources.iter().enumerate() {
        if let Err(e) = r.validate() {
            problems.push(locate(&e, file, &docs, i));
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
    let resources = tern_model::parse_documents(text, file)?;
    if resources.is_empty() {
        bail!("{file}: no resources found");
    }
    let problems = validate_all(store, &resources, text, file)?;
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
