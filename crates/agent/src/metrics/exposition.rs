//! The one home of the Prometheus text exposition format (version 0.0.4) in the agent: a
//! [`Page`] of metric families, each opened once with its `# HELP` and `# TYPE` lines
//! ([`Page::counter`], [`Page::gauge`], [`Page::histogram`]), whose samples are written with
//! their labels escaped here and nowhere else. Every part of `/metrics` (the CNI counters,
//! IPAM gauges, BGP, the Kubernetes source, host prerequisites, the heap) writes through it.
//!
//! Why not `prometheus-client`: it writes OpenMetrics, which names every counter sample
//! `<family>_total` and ends the page with `# EOF`, and it formats floats its own way
//! (`le="1.0"`). Our counter `ipam_gc_reclamations` (Calico's name) would become
//! `ipam_gc_reclamations_total`, and the `# TYPE` lines, bucket labels and the page's end
//! would change under the dashboards, tests and docs that read them. Most of our figures are
//! also computed at scrape time (from the store, the BGP thread, the heap), not kept in
//! registered metric objects. What we emit is small: this module writes exactly it. (The
//! crate itself would cost little: about 50 KiB on the release `ternd`, measured with 0.24.)
//! [`check`] reads a page back against the grammar, for tests.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Int(v as u64)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) if v.is_infinite() => {
                f.write_str(if *v > 0.0 { "+Inf" } else { "-Inf" })
            }
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

/// A `/metrics` page being written.
#[derive(Debug, Default)]
pub struct Page {
    out: String,
    families: BTreeSet<&'static str>,
}

/// One family of a [`Page`]: its samples follow its `# HELP` and `# TYPE` lines.
pub struct Family<'a> {
    page: &'a mut Page,
    name: &'static str,
}

/// A histogram family of a [`Page`].
pub struct HistogramFamily<'a> {
    family: Family<'a>,
}

impl Page {
    /// An empty page.
    pub fn new() -> Page {
        Page::default()
    }

    /// The page's text.
    pub fn into_string(self) -> String {
        self.out
    }

    /// Opens counter family `name`.
    pub fn counter(&mut self, name: &'static str, help: &str) -> Family<'_> {
        self.family(name, help, "counter")
    }

    /// Opens gauge family `name`.
    pub fn gauge(&mut self, name: &'static str, help: &str) -> Family<'_> {
        self.family(name, help, "gauge")
    }

    /// Opens histogram family `name`.
    pub fn histogram(&mut self, name: &'static str, help: &str) -> HistogramFamily<'_> {
        HistogramFamily {
            family: self.family(name, help, "histogram"),
        }
    }

    fn family(&mut self, name: &'static str, help: &str, kind: &str) -> Family<'_> {
        debug_assert!(is_metric_name(name), "bad metric name {name:?}");
        let first = self.families.insert(name);
        debug_assert!(first, "metric family {name} written twice");
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { page: self, name }
    }
}

impl Family<'_> {
    /// Writes one sample with `labels` (names and values; values are escaped here).
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) -> &mut Self {
        self.suffixed("", labels, None, value.into());
        self
    }

    fn suffixed(&mut self, suffix: &str, labels: &[(&str, &str)], le: Option<f64>, v: Value) {
        let out = &mut self.page.out;
        out.push_str(self.name);
        out.push_str(suffix);
        let le = le.map(|b| Value::Float(b).to_string());
        let all = labels
            .iter()
            .copied()
            .chain(le.as_deref().map(|b| ("le", b)));
        for (i, (k, v)) in all.enumerate() {
            debug_assert!(is_label_name(k), "bad label name {k:?}");
            out.push(if i == 0 { '{' } else { ',' });
            let _ = write!(out, "{k}=\"{}\"", escape(v));
        }
        if !labels.is_empty() || le.is_some() {
            out.push('}');
        }
        let _ = writeln!(out, " {v}");
    }
}

impl HistogramFamily<'_> {
    /// Writes the series of one histogram with `labels`: its buckets, sum and count.
    pub fn series(&mut self, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        for (le, n) in h.bounds.iter().zip(&h.buckets) {
            self.family
                .suffixed("_bucket", labels, Some(*le), Value::Int(*n));
        }
        let count = Value::Int(h.count);
        self.family
            .suffixed("_bucket", labels, Some(f64::INFINITY), count);
        self.family
            .suffixed("_sum", labels, None, Value::Float(h.sum));
        self.family.suffixed("_count", labels, None, count);
        self
    }
}

/// Observations counted into buckets with upper bounds `bounds` (cumulative counts).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// An empty histogram with buckets up to each of `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    /// Counts one observation.
    pub fn observe(&mut self, v: f64) {
        for (le, n) in self.bounds.iter().zip(&mut self.buckets) {
            if v <= *le {
                *n += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }
}

/// Escapes a label value.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// Reads `text` as a page of the exposition format: every line a `# HELP`, a `# TYPE` or a
/// sample; each family's HELP and TYPE once, before its samples; every sample's name its
/// family's (with `_bucket`, `_sum`, `_count` for a histogram), labels well formed and
/// escaped, the value a number. The families, in order, or the first fault with its line.
pub fn check(text: &str) -> Result<Vec<String>, String> {
    let mut families: Vec<String> = Vec::new();
    let mut kinds: std::collections::BTreeMap<String, String> = Default::default();
    let mut helped: BTreeSet<String> = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |why: &str| Err(format!("line {}: {why}: {line:?}", i + 1));
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !is_metric_name(name) || !helped.insert(name.to_string()) {
                return bad("HELP of a bad or repeated family");
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if !helped.contains(name) || kinds.contains_key(name) {
                return bad("TYPE without HELP, or repeated");
            }
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return bad("unknown type");
            }
            kinds.insert(name.to_string(), kind.to_string());
            families.push(name.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return bad("not a HELP, TYPE or sample line");
        }
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..end];
        let Some(family) = families.last() else {
            return bad("sample before any family");
        };
        let suffixes: &[&str] = if kinds[family] == "histogram" {
            &["_bucket", "_sum", "_count"]
        } else {
            &[""]
        };
        if !suffixes.iter().any(|s| name == format!("{family}{s}")) {
            return bad("sample outside its family");
        }
        let mut rest = &line[end..];
        if let Some(labels) = rest.strip_prefix('{') {
            let mut l = labels;
            loop {
                let Some((k, v)) = l.split_once("=\"") else {
                    return bad("label without =\"");
                };
                if !is_label_name(k) {
                    return bad("bad label name");
                }
                // The value runs to the first quote that is not escaped.
                let mut chars = v.char_indices();
                let close = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\' | '"' | 'n')) => {}
                            _ => return bad("bad escape in a label value"),
                        },
                        Some((j, '"')) => break j,
                        Some(_) => {}
                        None => return bad("unterminated label value"),
                    }
                };
                l = &v[close + 1..];
                if let Some(r) = l.strip_prefix(',') {
                    l = r;
                } else if let Some(r) = l.strip_prefix('}') {
                    rest = r;
                    break;
                } else {
                    return bad("label not followed by , or }");
                }
            }
        }
        let Some(value) = rest.strip_prefix(' ') else {
            return bad("no space before the value");
        };
        let ok = matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok();
        if !ok {
            return bad("value is not a number");
        }
    }
    Ok(families)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_render_in_the_text_format() {
        let mut p = Page::new();
        p.counter("x_total", "Things.\nMore")
            .sample(&[("op", "a\"b"), ("result", "ok")], 2u64);
        p.gauge("g", "A gauge.").sample(&[], 1.5);
        let mut h = Histogram::new(&[0.5, 1.0]);
        h.observe(0.25);
        h.observe(2.0);
        p.histogram("d_seconds", "Durations.")
            .series(&[("op", "add")], &h);
        let text = p.into_string();
        assert_eq!(
            text,
            "# HELP x_total Things.\\nMore\n# TYPE x_total counter\n\
             x_total{op=\"a\\\"b\",result=\"ok\"} 2\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 1.5\n\
             # HELP d_seconds Durations.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{op=\"add\",le=\"0.5\"} 1\n\
             d_seconds_bucket{op=\"add\",le=\"1\"} 1\n\
             d_seconds_bucket{op=\"add\",le=\"+Inf\"} 2\n\
             d_seconds_sum{op=\"add\"} 2.25\n\
             d_seconds_count{op=\"add\"} 2\n"
        );
        assert_eq!(check(&text).unwrap(), vec!["x_total", "g", "d_seconds"]);
    }

    #[test]
    fn check_refuses_what_the_grammar_does_not_allow() {
        let head = "# HELP a A.\n# TYPE a gauge\n";
        for bad in [
            "a 1\n".to_string(),
            format!("{head}# HELP a again\n"),
            format!("{head}b 1\n"),
            format!("{head}a{{x=\"1\"\n"),
            format!("{head}a{{x=\"\\q\"}} 1\n"),
            format!("{head}a{{1x=\"v\"}} 1\n"),
            format!("{head}a one\n"),
            format!("{head}# a comment\n"),
        ] {
            assert!(check(&bad).is_err(), "{bad}");
        }
        assert!(check(&format!("{head}a{{x=\"q\\\"\\\\\\n\"}} +Inf\n")).is_ok());
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
