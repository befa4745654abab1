//! Parsing of resource documents from any stream `kubectl apply -f` takes: YAML documents
//! separated by `---` (block or flow style), JSON documents (one object, an array of objects,
//! or several separated by `---`), and `kind: List` documents whose `items` are resources.
//! Every error names the file, the line in the file and the field path, so `ternctl apply -f`
//! can point the user at the mistake.
//!
//! Before any text reaches a parser, [`split_stream`] checks it in one linear pass against
//! [`MAX_STREAM_BYTES`], [`MAX_STREAM_DOCUMENTS`] and [`MAX_DOCUMENT_DEPTH`], so hostile
//! input is refused in linear time with an error naming the limit and the line.

use serde::Deserialize;

use crate::document::{API_VERSION, Document};
use crate::error::ModelError;
use crate::limits::{MAX_DOCUMENT_DEPTH, MAX_STREAM_BYTES, MAX_STREAM_DOCUMENTS};
use crate::registry::{Decode, Kind, Resource, Spec};

/// Parses every document of `text`; `file_name` is used in error messages (a `.json` name
/// makes a document that is not valid JSON an error rather than flow-style YAML). Defaults are
/// filled; validation is separate ([`Resource::validate`]).
pub fn parse_documents(text: &str, file_name: &str) -> Result<Vec<Resource>, ModelError> {
    Ok(parse_stream(text, file_name)?
        .into_iter()
        .map(|p| p.resource)
        .collect())
}

/// How a document of a stream is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (block or flow style).
    Yaml,
    /// Strict JSON (an object or an array).
    Json,
}

/// One document of a stream, as it appears in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceDocument<'a> {
    /// Lines of the file before the document's first line: a 1-based line inside the document
    /// plus this is the line in the file.
    pub line_offset: usize,
    /// The document's text (without its `---` separator).
    pub text: &'a str,
    /// Its format.
    pub format: Format,
}

/// A resource read from a stream, with the document it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedResource<'a> {
    /// The resource, defaults filled.
    pub resource: Resource,
    /// The document that holds it.
    pub source: SourceDocument<'a>,
    /// Its index in the document's `items` (a `kind: List`) or JSON array; `None` when the
    /// document is the resource.
    pub item: Option<usize>,
}

/// Parses every document of `text` (see [`parse_documents`]), keeping where each resource
/// came from so callers can point at lines of the file.
pub fn parse_stream<'a>(text: &'a str, file: &str) -> Result<Vec<ParsedResource<'a>>, ModelError> {
    let mut out = Vec::new();
    for doc in split_stream(text, file)? {
        let items = match doc.format {
            Format::Json => parse_json(doc, file)?,
            Format::Yaml => parse_yaml(doc, file)?,
        };
        for (resource, item) in items {
            out.push(ParsedResource {
                resource,
                source: doc,
                item,
            });
        }
        if out.len() > MAX_STREAM_DOCUMENTS {
            return Err(parse_error(
                file,
                Some(doc.line_offset + 1),
                ".",
                format!(
                    "more than {MAX_STREAM_DOCUMENTS} resources in one stream (counting list \
                     items), the limit is {MAX_STREAM_DOCUMENTS}"
                ),
            ));
        }
    }
    Ok(out)
}

/// Splits a stream into its non-empty documents after checking it against the stream limits
/// (size, number of documents, nesting depth), in one linear pass. A document whose first
/// significant character is `{` or `[` and that is valid JSON is [`Format::Json`]; in a
/// `.json` file every document is.
pub fn split_stream<'a>(text: &'a str, file: &str) -> Result<Vec<SourceDocument<'a>>, ModelError> {
    if text.len() > MAX_STREAM_BYTES {
        return Err(parse_error(
            file,
            None,
            ".",
            format!(
                "the stream is {} bytes, the limit is {MAX_STREAM_BYTES} ({} MiB)",
                text.len(),
                MAX_STREAM_BYTES >> 20
            ),
        ));
    }
    let json_file = file.ends_with(".json");
    let mut docs = Vec::new();
    let mut push = |line_offset: usize, body: &'a str| -> Result<(), ModelError> {
        if !has_content(body) {
            return Ok(());
        }
        if docs.len() == MAX_STREAM_DOCUMENTS {
            return Err(parse_error(
                file,
                Some(line_offset + 1),
                ".",
                format!(
                    "more than {MAX_STREAM_DOCUMENTS} documents in one stream, the limit is \
                     {MAX_STREAM_DOCUMENTS}"
                ),
            ));
        }
        check_depth(body).map_err(|(line, depth)| {
            parse_error(
                file,
                Some(line_offset + line),
                ".",
                format!(
                    "nesting depth {depth} exceeds the limit of {MAX_DOCUMENT_DEPTH} (flow '[' \
                     and '{{' plus block indentation levels)"
                ),
            )
        })?;
        let t = body.trim_start();
        let json_like = t.starts_with('{') || t.starts_with('[');
        let format = if json_file
            || (json_like && serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok())
        {
            Format::Json
        } else {
            Format::Yaml
        };
        docs.push(SourceDocument {
            line_offset,
            text: body,
            format,
        });
        Ok(())
    };
    // Byte offset where the current document starts, and its line offset.
    let mut start = 0usize;
    let mut start_line = 0usize;
    let mut pos = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let t = line.trim_end();
        let marker = t == "---" || t == "...";
        let marker_with_content = t.starts_with("--- ") || t.starts_with("---\t");
        if marker || marker_with_content {
            push(start_line, &text[start..pos])?;
            if marker {
                start = pos + line.len();
                start_line = i + 1;
            } else {
                // `--- {...}`: the document starts on the marker's line, after the marker.
                start = pos + 4;
                start_line = i;
            }
        }
        pos += line.len();
    }
    push(start_line, &text[start..])?;
    Ok(docs)
}

/// Whether a document has anything but blank lines and comments.
fn has_content(doc: &str) -> bool {
    doc.lines().any(|l| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    })
}

/// Scanner state carried across the lines of a document by [`check_depth`].
#[derive(Default)]
struct DepthScan {
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Indentation columns of the open block nodes, innermost last.
    block: Vec<usize>,
    /// Inside a quoted scalar (which may span lines): its quote character.
    quote: Option<char>,
    /// Inside a block scalar (`|`, `>`): the column of its parent node (the mapping key's
    /// column after any `- ` prefixes, or the dash's for a sequence item); lines indented
    /// deeper (or blank) are its content.
    block_scalar: Option<usize>,
    /// The previous line ended inside a plain scalar in block context, whose parent node is
    /// at this column: a line indented deeper continues the scalar (`a: x` / `    'y` is the
    /// one scalar `x 'y`), so a quote or bracket there is text, not structure.
    plain: Option<usize>,
}

/// The context-free bound behind [`check_depth`]: the deepest running count of `[`/`{` minus
/// `]`/`}` over the raw text, counting brackets inside strings, comments and block scalars
/// too (never below zero, so closers written first cannot pay for later openers). It cannot be
/// misled by a lexing mistake of the scanner, and selectors' brackets (`in {...}`) balance, so
/// real documents stay far below it.
pub(crate) const MAX_RAW_BRACKET_DEPTH: usize = 4 * MAX_DOCUMENT_DEPTH;

/// Checks [`MAX_RAW_BRACKET_DEPTH`]; on failure, the 1-based line and the depth reached.
fn check_raw_brackets(doc: &str) -> Result<(), (usize, usize)> {
    let (mut depth, mut line) = (0usize, 1usize);
    for b in doc.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_RAW_BRACKET_DEPTH {
                    return Err((line, depth));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'\n' => line += 1,
            _ => {}
        }
    }
    Ok(())
}

/// Checks a document's nesting depth (flow collections plus block indentation levels)
/// against [`MAX_DOCUMENT_DEPTH`] in one pass, without parsing it: quoted scalars, comments
/// and block scalars are skipped so brackets inside strings do not count. On failure, the
/// 1-based line inside the document and the depth reached.
///
/// [`check_raw_brackets`] runs after it, so flow nesting stays bounded even where this
/// scanner's imitation of YAML lexing is wrong.
fn check_depth(doc: &str) -> Result<(), (usize, usize)> {
    check_depth_scan(doc)?;
    check_raw_brackets(doc)
}

fn check_depth_scan(doc: &str) -> Result<(), (usize, usize)> {
    let mut st = DepthScan::default();
    for (i, line) in doc.lines().enumerate() {
        let line_no = i + 1;
        let indent = line.len() - line.trim_start_matches(' ').len();
        let rest = &line[indent..];
        if let Some(parent) = st.block_scalar {
            if rest.trim().is_empty() || indent > parent {
                continue;
            }
            st.block_scalar = None;
        }
        if let Some(parent) = st.plain
            && st.quote.is_none()
            && st.flow == 0
        {
            if rest.trim().is_empty() {
                continue;
            }
            if indent > parent && !rest.starts_with('#') {
                continue;
            }
            st.plain = None;
        }
        st.plain = None;
        let mut col = indent;
        // The column of the last `- ` on this line: a node that is the sequence item itself
        // has the sequence as its parent.
        let mut item_parent = indent;
        if st.quote.is_none() && st.flow == 0 {
            if rest.is_empty() || rest.starts_with('#') || rest.trim().is_empty() {
                continue;
            }
            while st.block.last().is_some_and(|&top| top > indent) {
                st.block.pop();
            }
            if st.block.last() != Some(&indent) {
                st.block.push(indent);
            }
            // Compact sequences (`- - x`, `- key: v`) open one level per `- `.
            let mut r = rest;
            while let Some(after) = r.strip_prefix("- ") {
                let skipped = r.len() - after.trim_start_matches(' ').len();
                item_parent = col;
                col += skipped;
                r = &r[skipped..];
                st.block.push(col);
            }
            if st.block.len() > MAX_DOCUMENT_DEPTH {
                return Err((line_no, st.block.len()));
            }
        }
        scan_line(&mut st, &line[col..], item_parent, col).map_err(|d| (line_no, d))?;
    }
    Ok(())
}

/// Scans the rest of one line (from column `col`, after any `- ` prefixes) for quotes, flow
/// brackets, comments and block-scalar indicators; fails with the depth reached when it
/// passes [`MAX_DOCUMENT_DEPTH`]. `item_parent` is the parent's column of a node that starts
/// the text (the last dash's, or the line's indentation); a node after `key: ` has the
/// mapping at `col` as its parent.
fn scan_line(st: &mut DepthScan, text: &str, item_parent: usize, col: usize) -> Result<(), usize> {
    // Where the current plain scalar began, as its parent's column.
    let mut plain_parent: Option<usize> = None;
    // The last significant character before this one (None at the start of a node), and
    // whether whitespace came between.
    let mut prev: Option<char> = None;
    let mut spaced = true;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = st.quote {
            match (q, c) {
                ('\'', '\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                }
                ('"', '\\') => {
                    chars.next();
                }
                _ if c == q => {
                    st.quote = None;
                    prev = Some(c);
                    spaced = false;
                }
                _ => {}
            }
            continue;
        }
        if c == ' ' || c == '\t' {
            spaced = true;
            continue;
        }
        // A scalar (or collection) may start here: at the start of a node, after a flow
        // separator, or after a `: `/`- `/`? ` indicator (`"a":"b"` too inside flow).
        let node_start = match prev {
            None | Some('[' | '{') => true,
            Some(',') => st.flow > 0,
            Some(':') => spaced || st.flow > 0,
            Some('-' | '?') => spaced,
            _ => false,
        };
        // Whether `c` acted as an indicator; inside a plain scalar (`a[b`, `x, y`) it did not,
        // and must not make the next character look like the start of a node.
        let mut indicator = true;
        let parent = if prev.is_none() { item_parent } else { col };
        match c {
            '#' if spaced => return Ok(()),
            '\'' | '"' if node_start => st.quote = Some(c),
            '[' | '{' if node_start || st.flow > 0 => {
                st.flow += 1;
                let depth = st.flow + st.block.len();
                if depth > MAX_DOCUMENT_DEPTH {
                    return Err(depth);
                }
            }
            ']' | '}' if st.flow > 0 => st.flow -= 1,
            '|' | '>' if node_start && st.flow == 0 => {
                st.block_scalar = Some(parent);
                return Ok(());
            }
            ',' if st.flow > 0 => {}
            ':' | '-' | '?' => {
                // `: ` ends a plain scalar: it was a key. `-`/`?`/`:` inside one (`x-y`,
                // `a:b`) are text and keep it going.
                if c == ':' && matches!(chars.peek(), None | Some(' ' | '\t')) {
                    plain_parent = None;
                }
            }
            _ => {
                indicator = false;
                if node_start && st.flow == 0 {
                    plain_parent = Some(parent);
                }
            }
        }
        if matches!(c, '[' | '{' | '\'' | '"') && node_start {
            plain_parent = None;
        }
        prev = Some(if indicator { c } else { 'a' });
        spaced = false;
    }
    // Still inside a plain scalar at the end of the line (a comment ended it above).
    if st.quote.is_none() && st.flow == 0 {
        st.plain = plain_parent;
    }
    Ok(())
}

/// The fields read first to pick the document's type.
#[derive(Deserialize)]
struct Header {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
}

/// Removes the location suffix serde_norway and serde_json append, and the path prefix serde_norway
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

/// 1-based line (within the document) of a top-level key, for errors about `kind`/`apiVersion`.
fn top_level_key_line(doc: &str, key: &str) -> Option<usize> {
    doc.lines()
        .position(|l| l.starts_with(&format!("{key}:")))
        .map(|i| i + 1)
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
    // A kind listed under another apiVersion (Kubernetes documents accepted unchanged).
    let foreign = match (h.api_version.as_deref(), h.kind.as_deref()) {
        (Some(api), Some(kind)) => Kind::exact(api, kind).is_some(),
        _ => false,
    };
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
    Kind::of_document(h.api_version.as_deref().unwrap_or_default(), &kind)
        .map_err(|m| parse_error(file, line_of("kind"), "kind", m))
}

/// Namespace documents usually have no `spec`; for kinds that allow it
/// ([`Kind::implied_spec`]) an empty one is implied.
fn implied_spec(kind: Kind, doc: &str) -> String {
    if kind.implied_spec() && top_level_key_line(doc, "spec").is_none() {
        format!("{doc}\nspec: {{}}\n")
    } else {
        doc.to_string()
    }
}

fn implied_spec_json(kind: Kind, v: &mut serde_json::Value) {
    if kind.implied_spec()
        && let Some(o) = v.as_object_mut()
    {
        o.entry("spec")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
    }
}

/// Resources of one document, each with its index in the document's list (if it is one).
type Items = Vec<(Resource, Option<usize>)>;

/// `kind: List` (Kubernetes' `v1` List, as `kubectl get -o yaml` prints it): its `items` are
/// the resources.
const LIST_KIND: &str = "List";

#[derive(Deserialize)]
struct ListDocument {
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

/// Line (1-based, in the file) of the document's first significant line.
fn first_line(doc: SourceDocument<'_>) -> usize {
    doc.line_offset
        + doc
            .text
            .lines()
            .position(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with('#')
            })
            .unwrap_or(0)
        + 1
}

/// One document's text to decode, with what turns a deserializer's error `E` at a path into
/// the model's error (the file and line it names).
struct Text<'a, E> {
    text: &'a str,
    err: &'a dyn Fn(&E, &str) -> ModelError,
}

/// Decodes a document from `de`, keeping the path of a field that does not decode for `err`,
/// and fills the spec's defaults.
fn decode_tracked<'de, S: Spec, D: serde::Deserializer<'de>>(
    de: D,
    err: &dyn Fn(&D::Error, &str) -> ModelError,
) -> Result<Document<S>, ModelError> {
    let mut d: Document<S> =
        serde_path_to_error::deserialize(de).map_err(|e| err(e.inner(), &e.path().to_string()))?;
    d.spec.fill_defaults();
    Ok(d)
}

impl Decode for Text<'_, serde_norway::Error> {
    type Error = ModelError;
    fn decode<S: Spec>(self) -> Result<Document<S>, ModelError> {
        decode_tracked(serde_norway::Deserializer::from_str(self.text), self.err)
    }
}

impl Decode for Text<'_, serde_json::Error> {
    type Error = ModelError;
    fn decode<S: Spec>(self) -> Result<Document<S>, ModelError> {
        let mut de = serde_json::Deserializer::from_str(self.text);
        let d = decode_tracked(&mut de, self.err)?;
        // Trailing text after the document is an error, not ignored.
        de.end().map_err(|e| (self.err)(&e, ""))?;
        Ok(d)
    }
}

fn parse_yaml(src: SourceDocument<'_>, file: &str) -> Result<Items, ModelError> {
    let offset = src.line_offset;
    let doc = src.text;
    let yaml_err = |e: &serde_norway::Error, path: &str| {
        let line = e.location().map(|l| l.line() + offset);
        parse_error(file, line, path, bare_message(&e.to_string(), path))
    };
    let header: Header = serde_norway::from_str(doc).map_err(|e| yaml_err(&e, ""))?;
    let doc_line = first_line(src);
    if header.kind.as_deref() == Some(LIST_KIND) {
        let list: ListDocument = serde_norway::from_str(doc).map_err(|e| yaml_err(&e, ""))?;
        return parse_values(list.items, file, "items");
    }
    let kind = check_header(header, file, Some(doc), doc_line, offset)?;
    let doc = implied_spec(kind, doc);
    let resource = kind.decode(Text {
        text: &doc,
        err: &yaml_err,
    })?;
    Ok(vec![(resource, None)])
}

/// Resources from decoded values (the elements of a JSON array, the `items` of a List):
/// lines are lost, so the path names the element (`[1].spec`, `items[1].spec`).
fn parse_values(
    items: Vec<serde_json::Value>,
    file: &str,
    prefix: &str,
) -> Result<Items, ModelError> {
    if items.len() > MAX_STREAM_DOCUMENTS {
        return Err(parse_error(
            file,
            None,
            prefix,
            format!(
                "{} items, the limit is {MAX_STREAM_DOCUMENTS} resources per stream",
                items.len()
            ),
        ));
    }
    struct Value<'a> {
        v: serde_json::Value,
        file: &'a str,
        at: &'a dyn Fn(&str) -> String,
    }
    impl Decode for Value<'_> {
        type Error = ModelError;
        fn decode<S: Spec>(self) -> Result<Document<S>, ModelError> {
            let (file, at) = (self.file, self.at);
            decode_tracked(self.v, &|e: &serde_json::Error, path: &str| {
                parse_error(file, None, &at(path), bare_message(&e.to_string(), path))
            })
        }
    }
    let mut out = Vec::new();
    for (i, v) in items.into_iter().enumerate() {
        let at = |path: &str| {
            if path.is_empty() || path == "." {
                format!("{prefix}[{i}]")
            } else {
                format!("{prefix}[{i}].{path}")
            }
        };
        let header: Header = serde_json::from_value(v.clone())
            .map_err(|e| parse_error(file, None, &at(""), bare_message(&e.to_string(), "")))?;
        let kind = check_header(header, file, None, 0, 0).map_err(|e| match e {
            ModelError::Parse { path, message, .. } => parse_error(file, None, &at(&path), message),
            other => other,
        })?;
        let mut v = v;
        implied_spec_json(kind, &mut v);
        let resource = kind.decode(Value { v, file, at: &at })?;
        out.push((resource, Some(i)));
    }
    Ok(out)
}

fn parse_json(src: SourceDocument<'_>, file: &str) -> Result<Items, ModelError> {
    let offset = src.line_offset;
    let text = src.text;
    let json_err = |e: &serde_json::Error, path: &str| {
        let line = (e.line() > 0).then_some(e.line() + offset);
        parse_error(file, line, path, bare_message(&e.to_string(), path))
    };
    if text.trim_start().starts_with('[') {
        let items: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
        return parse_values(items, file, "");
    }
    let header: Header = serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
    if header.kind.as_deref() == Some(LIST_KIND) {
        let list: ListDocument = serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
        return parse_values(list.items, file, "items");
    }
    let kind = check_header(header, file, None, first_line(src), 0)?;
    let resource = if kind.implied_spec() {
        let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| json_err(&e, ""))?;
        implied_spec_json(kind, &mut v);
        let text = v.to_string();
        kind.decode(Text {
            text: &text,
            err: &json_err,
        })?
    } else {
        kind.decode(Text {
            text,
            err: &json_err,
        })?
    };
    Ok(vec![(resource, None)])
}
