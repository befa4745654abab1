//! `ternctl label workloadendpoint|namespace NAME key=value [key-] [-n NS]`: changes the labels
//! policy selectors match on. The agents see the change through their store watch and update
//! the selector sets of every node.

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use tern_model::{Kind, Namespace, NamespaceSpec, Resource};
use tern_store::Store;

/// One requested change: set a label or remove it (`key-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

/// Parses `key=value` and `key-` arguments.
pub fn parse_changes(args: &[String]) -> anyhow::Result<Vec<LabelChange>> {
    if args.is_empty() {
        bail!("no label change given: pass key=value to set or key- to remove");
    }
    args.iter()
        .map(|a| {
            if let Some((k, v)) = a.split_once('=') {
                if k.is_empty() {
                    bail!("label change {a:?}: the key is empty");
                }
                Ok(LabelChange::Set(k.to_string(), v.to_string()))
            } else if let Some(k) = a.strip_suffix('-').filter(|k| !k.is_empty()) {
                Ok(LabelChange::Remove(k.to_string()))
            } else {
                bail!("label change {a:?}: expected key=value or key-")
            }
        })
        .collect()
}

fn apply_changes(labels: &mut BTreeMap<String, String>, changes: &[LabelChange]) {
    for c in changes {
        match c {
            LabelChange::Set(k, v) => {
                labels.insert(k.clone(), v.clone());
            }
            LabelChange::Remove(k) => {
                labels.remove(k);
            }
        }
    }
}

/// Applies label changes to a WorkloadEndpoint (which must exist; `namespace` defaults to
/// `default`) or a Namespace (created when absent, as Kubernetes namespaces exist without a
/// tern resource). Returns the resulting labels as `k=v,...`.
pub fn label(
    store: &dyn Store,
    kind: Kind,
    name: &str,
    namespace: Option<&str>,
    changes: &[LabelChange],
) -> anyhow::Result<String> {
    let mut r = match kind {
        Kind::WorkloadEndpoint => {
            let ns = namespace.unwrap_or("default");
            tern_model::get_resource(store, kind, Some(ns), name)?
                .with_context(|| format!("WorkloadEndpoint {name} not found in namespace {ns}"))?
        }
        Kind::Namespace => match tern_model::get_resource(store, kind, None, name)? {
            Some(r) => r,
            None => Resource::Namespace(Namespace::new(name, NamespaceSpec::default())),
        },
        other => bail!(
            "ternctl label changes workloadendpoint and namespace labels, not {}",
            other.as_str()
        ),
    };
    apply_changes(&mut r.metadata_mut().labels, changes);
    tern_model::put_resource(store, &r)
        .with_context(|| format!("writing {} {name}", kind.as_str()))?;
    let shown: Vec<String> = r
        .metadata()
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(shown.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_set_and_remove() {
        let c = parse_changes(&["app=web".into(), "tier-".into()]).unwrap();
        assert_eq!(
            c,
            vec![
                LabelChange::Set("app".into(), "web".into()),
                LabelChange::Remove("tier".into())
            ]
        );
        assert!(parse_changes(&["=x".into()]).is_err());
        assert!(parse_changes(&["bare".into()]).is_err());
        assert!(parse_changes(&[]).is_err());
    }

    #[test]
    fn labels_namespaces_and_refuses_missing_endpoints() {
        let store = tern_store::mem::MemStore::new();
        let out = label(
            &store,
            Kind::Namespace,
            "x",
            None,
            &parse_changes(&["team=red".into()]).unwrap(),
        )
        .unwrap();
        assert_eq!(out, "team=red");
        let out = label(
            &store,
            Kind::Namespace,
            "x",
            None,
            &parse_changes(&["team-".into(), "env=prod".into()]).unwrap(),
        )
        .unwrap();
        assert_eq!(out, "env=prod");
        let r = tern_model::get_resource(&store, Kind::Namespace, None, "x")
            .unwrap()
            .unwrap();
        assert_eq!(
            r.metadata().labels.get("env").map(String::as_str),
            Some("prod")
        );
        let e = label(
            &store,
            Kind::WorkloadEndpoint,
            "nope",
            Some("y"),
            &parse_changes(&["a=b".into()]).unwrap(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("nope not found in namespace y"),
            "{e}"
        );
    }
}
