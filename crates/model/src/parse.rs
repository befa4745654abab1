//! Parsing of resource documents from YAML (several documents separated by `---`) or JSON (one
//! object or an array of objects). Every error names the file, the line in the file and the
//! field path, so `ternctl apply -f` can point the user at the mistake.

use serde::Deserialize;

use crate::resources::{Document, Kind, Resource, Spec};
use crate::{API_VERSION, ModelError};

/// Parses every document of `text`; `file_name` is used in error messages and to recognise
/// JSON (`.json`; text starting with `{` or `[` is JSON too). Defaults are filled; validation
/// is separate ([`Resource::validate`]).
pub fn parse_documents(text: &str, file_name: &str) -> Result<Vec<Resource>, ModelError> {
    let trimmed = text.trim_start();
    if file_name.ends_with(".json") || trimmed.starts_with('{') || trimmed.starts_with('[') {
        parse_json(text, file_name)
    } else {
        parse_yaml(text, file_name)
    }
}

/// The fields read first to pick the document's type.
#[derive(Deserialize)]
struct Header {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
}

/// Removes the location suffix serde_yaml and serde_json append, and the path prefix serde_yaml
/// prepends, since both are reported separately.
fn bare_message(msg: &str, path: &str) -> String {
    let path = if msg.contains("unknown field") {
        path.rfind('.').map_or("", |i| &path[..i])
    } else {
        path
    };
    let mut m = msg;
    if let Some(i) = m.rfind(" at line ") {
        m = &m[..i];
    }
    let prefix = format!("{path}: ");
    if let Some(rest) = m.strip_prefix(&prefix) {
        m = rest;
    }
    m.to_string()
}

fn parse_error(file: &str, line: Option<usize>, path: &str, message: String) -> ModelError {
    // serde_path_to_error counts an unknown key as part of the path; the user wants the
    // object that contains it (`spec: unknown field `cidrr``).
    let mut path = path;
    if message.starts_with("unknown field") {
        path = match path.rfind('.') {
            Some(i) => &path[..i],
            None if !path.starts_with('[') => "",
            None => path,
        };
    }
    ModelError::Parse {
        file: file.to_string(),
        line,
        path: if path.is_empty() {
            ".".to_string()
        } else {
            path.to_string()
        },
        message,
    }
}

/// Splits YAML text into documents, each with the number of lines before it in the file.
fn split_yaml(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut start = 0usize;
    let mut cur = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_end();
        if t == "---" || t.starts_with("--- ") || t == "..." {
            docs.push((start, std::mem::take(&mut cur)));
            start = i + 1;
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
    }
    docs.push((start, cur));
    docs.into_iter()
        .filter(|(_, d)| {
            d.lines().any(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
        })
        .collect()
}

/// 1-based line (within the document) of a top-level key, for errors about `kind`/`apiVersion`.
fn top_level_key_line(doc: &str, key: &str) -> Option<usize> {
    doc.lines()
        .position(|l| l.starts_with(&format!("{key}:")))
        .map(|i| i + 1)
}

/// The kind of a document from its `apiVersion` and `kind`: tern's kinds under
/// `tern.dev/v1`, plus Kubernetes `networking.k8s.io/v1` NetworkPolicy and core `v1` Namespace
/// documents, accepted unchanged.
pub(crate) fn kind_of(api_version: &str, kind: &str) -> Result<Kind, String> {
    match (api_version, kind) {
        (crate::policy::K8S_NETWORKING_API_VERSION, "NetworkPolicy") => Ok(Kind::K8sNetworkPolicy),
        ("v1", "Namespace") => Ok(Kind::Namespace),
        _ => kind.parse::<Kind>(),
    }
}

fn check_header(
    h: Header,
    file: &str,
    doc: Option<&str>,
    doc_line: usize,
    offset: usize,
) -> Result<Kind, ModelError> {
    let line_of = |key: &str| {
        doc.and_then(|d| top_level_key_line(d, key))
            .map_or(Some(doc_line), |l| Some(l + offset))
    };
    let foreign = matches!(
        (h.api_version.as_deref(), h.kind.as_deref()),
        (
            Some(crate::policy::K8S_NETWORKING_API_VERSION),
            Some("NetworkPolicy")
        ) | (Some("v1"), Some("Namespace"))
    );
    match h.api_version.as_deref() {
        Some(API_VERSION) => {}
        _ if foreign => {}
        Some(other) => {
            return Err(parse_error(
                file,
                line_of("apiVersion"),
                "apiVersion",
                format!("unsupported apiVersion {other:?}, expected {API_VERSION}"),
            ));
        }
        None => {
            return Err(parse_error(
                file,
                Some(doc_line),
                "apiVersion",
                "missing field `apiVersion`".into(),
            ));
        }
    }
    let Some(kind) = h.kind else {
        return Err(parse_error(
            file,
            Some(doc_line),
            "kind",
            "missing field `kind`".into(),
        ));
    };
    kind_of(h.api_version.as_deref().unwrap_or_default(), &kind)
        .map_err(|m| parse_error(file, line_of("kind"), "kind", m))
}

/// Builds the [`Resource`] variant of `kind` with `$typed` (a generic fn over the spec type).
macro_rules! dispatch {
    ($kind:expr, $typed:ident ( $($arg:expr),* )) => {
        match $kind {
            Kind::IpPool => Resource::IpPool($typed($($arg),*)?),
            Kind::IpamConfig => Resource::IpamConfig($typed($($arg),*)?),
            Kind::Node => Resource::Node($typed($($arg),*)?),
            Kind::WorkloadEndpoint => Resource::WorkloadEndpoint($typed($($arg),*)?),
            Kind::IpReservation => Resource::IpReservation($typed($($arg),*)?),
            Kind::NetworkPolicy => Resource::NetworkPolicy($typed($($arg),*)?),
            Kind::GlobalNetworkPolicy => Resource::GlobalNetworkPolicy($typed($($arg),*)?),
            Kind::K8sNetworkPolicy => Resource::K8sNetworkPolicy($typed($($arg),*)?),
            Kind::Namespace => Resource::Namespace($typed($($arg),*)?),
            Kind::BgpConfiguration => Resource::BgpConfiguration($typed($($arg),*)?),
            Kind::BgpPeer => Resource::BgpPeer($typed($($arg),*)?),
        }
    };
}

/// Namespace documents usually have no `spec`; an empty one is implied.
fn implied_spec(kind: Kind, doc: &str) -> String {
    if kind == Kind::Namespace && top_level_key_line(doc, "spec").is_none() {
        format!("{doc}\nspec: {{}}\n")
    } else {
        doc.to_string()
    }
}

fn implied_spec_json(kind: Kind, v: &mut serde_json::Value) {
    if kind == Kind::Namespace
        && let Some(o) = v.as_object_mut()
    {
        o.entry("spec")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
    }
}

fn parse_yaml(text: &str, file: &str) -> Result<Vec<Resource>, ModelError> {
    let mut out = Vec::new();
    for (offset, doc) in split_yaml(text) {
        let yaml_err = |e: &serde_yaml::Error, path: &str| {
            let line = e.location().map(|l| l.line() + offset);
            parse_error(file, line, path, bare_message(&e.to_string(), path))
        };
        let header: Header = serde_yaml::from_str(&doc).map_err(|e| yaml_err(&e, ""))?;
        let doc_line = offset
            + doc
                .lines()
                .position(|l| {
                    let t = l.trim();
                    !t.is_empty() && !t.starts_with('#')
                })
                .unwrap_or(0)
            + 1;
        let kind = check_header(header, file, Some(&doc), doc_line, offset)?;
        fn typed<S: Spec>(
            doc: &str,
            err: &dyn Fn(&serde_yaml::Error, &str) -> ModelError,
        ) -> Result<Document<S>, ModelError> {
            let de = serde_yaml::Deserializer::from_str(doc);
            let mut d: Document<S> = serde_path_to_error::deserialize(de)
                .map_err(|e| err(e.inner(), &e.path().to_string()))?;
            d.spec.fill_defaults();
            Ok(d)
        }
        let doc = implied_spec(kind, &doc);
        out.push(dispatch!(kind, typed(&doc, &yaml_err)));
    }
    Ok(out)
}

fn parse_json(text: &str, file: &str) -> Result<Vec<Resource>, ModelError> {
    let json_err = |e: &serde_json::Error, path: &str| {
        let line = (e.line() > 0).then_some(e.line());
        parse_error(file, line, path, bare_message(&e.to_string(), path))
    };
    if text.trim_start().starts_with('[') {
        // Elements of an array are re-read from values, so lines are lost; the path names the
        // element instead.
        let items: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
        let mut out = Vec::new();
        for (i, v) in items.into_iter().enumerate() {
            let at = |path: &str| {
                if path.is_empty() || path == "." {
                    format!("[{i}]")
                } else {
                    format!("[{i}].{path}")
                }
            };
            let header: Header = serde_json::from_value(v.clone())
                .map_err(|e| parse_error(file, None, &at(""), bare_message(&e.to_string(), "")))?;
            let kind = check_header(header, file, None, 0, 0).map_err(|e| match e {
                ModelError::Parse { path, message, .. } => {
                    parse_error(file, None, &at(&path), message)
                }
                other => other,
            })?;
            fn typed<S: Spec>(
                v: serde_json::Value,
                file: &str,
                at: &dyn Fn(&str) -> String,
            ) -> Result<Document<S>, ModelError> {
                let mut d: Document<S> = serde_path_to_error::deserialize(v).map_err(|e| {
                    let path = e.path().to_string();
                    parse_error(
                        file,
                        None,
                        &at(&path),
                        bare_message(&e.inner().to_string(), &path),
                    )
                })?;
                d.spec.fill_defaults();
                Ok(d)
            }
            let mut v = v;
            implied_spec_json(kind, &mut v);
            out.push(dispatch!(kind, typed(v.clone(), file, &at)));
        }
        return Ok(out);
    }
    let header: Header = serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
    let kind = check_header(header, file, None, 1, 0)?;
    fn typed<S: Spec>(
        text: &str,
        err: &dyn Fn(&serde_json::Error, &str) -> ModelError,
    ) -> Result<Document<S>, ModelError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let mut d: Document<S> = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| err(e.inner(), &e.path().to_string()))?;
        de.end().map_err(|e| err(&e, ""))?;
        d.spec.fill_defaults();
        Ok(d)
    }
    if kind == Kind::Namespace {
        let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
        implied_spec_json(kind, &mut v);
        let text = v.to_string();
        return Ok(vec![dispatch!(kind, typed(&text, &json_err))]);
    }
    Ok(vec![dispatch!(kind, typed(text, &json_err))])
}
