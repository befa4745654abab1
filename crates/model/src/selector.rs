//! Calico's label selector language, used by `IPPool.nodeSelector` (and later by policies).
//!
//! Grammar (precedence from loosest to tightest: `||`, `&&`, `!`):
//!
//! ```text
//! expr    := and ('||' and)*
//! and     := unary ('&&' unary)*
//! unary   := '!' unary | primary
//! primary := '(' expr ')' | 'all()' | 'global()' | 'has(' key ')'
//!          | key '==' str | key '!=' str | key 'in' set | key 'not' 'in' set
//!          | key 'contains' str | key 'starts' 'with' str | key 'ends' 'with' str
//! set     := '{' [str (',' str)*] '}'
//! str     := '...' | "..."
//! key     := [A-Za-z0-9_./-]+
//! ```
//!
//! As in Calico, `k != 'v'` and `k not in {...}` also match when the label is absent, and an
//! empty (or all-blank) selector selects everything.
//!
//! Bounds: a selector is at most [`MAX_SELECTOR_BYTES`] long and nests at most
//! [`MAX_SELECTOR_DEPTH`] levels (each `(` and each `!` is a level), checked by the parser
//! itself, so no text, from `ternctl` or written straight into the store, can make parsing,
//! evaluation, printing or dropping recurse without bound. `&&`/`||` chains are flat lists
//! ([`Selector::And`], [`Selector::Or`]), walked iteratively.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tern_model::selector::Selector;
//!
//! let s: Selector = "zone in {'a', 'b'} && !has(edge)".parse().unwrap();
//! let labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
//! assert!(s.matches(&labels));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use crate::limits::{MAX_SELECTOR_BYTES, MAX_SELECTOR_DEPTH};

/// A parsed selector.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Selector {
    /// `all()`: every label set.
    All,
    /// `global()`: every label set (Calico uses it to select non-namespaced resources).
    Global,
    /// `has(k)`.
    Has(String),
    /// `k == 'v'`.
    Eq(String, String),
    /// `k != 'v'` (true when `k` is absent).
    Ne(String, String),
    /// `k in {...}`.
    In(String, BTreeSet<String>),
    /// `k not in {...}` (true when `k` is absent).
    NotIn(String, BTreeSet<String>),
    /// `k contains 's'`.
    Contains(String, String),
    /// `k starts with 's'`.
    StartsWith(String, String),
    /// `k ends with 's'`.
    EndsWith(String, String),
    /// `!e`.
    Not(Box<Selector>),
    /// `a && b && ...`: true when every operand is (an empty list is true). The parser
    /// produces at least two operands; a parenthesised operand stays a nested node.
    And(Vec<Selector>),
    /// `a || b || ...`: true when any operand is (an empty list is false). The parser produces
    /// at least two operands.
    Or(Vec<Selector>),
}

/// A selector that does not parse: what went wrong and where (0-based character offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError {
    /// The selector text (only its first few dozen characters when it broke a limit).
    pub selector: String,
    /// Character offset of the problem (the length of the text for "unexpected end").
    pub position: usize,
    /// What was expected or found; for a broken limit, the size and the limit.
    pub message: String,
    /// True when the selector broke [`MAX_SELECTOR_BYTES`] or [`MAX_SELECTOR_DEPTH`]: then
    /// the message leads (`selector is 9000 bytes, the limit is 4096`).
    pub exceeded_limit: bool,
}

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exceeded_limit {
            write!(f, "{} (selector begins {:?})", self.message, self.selector)
        } else {
            write!(
                f,
                "invalid selector {:?}: at position {}: {}",
                self.selector, self.position, self.message
            )
        }
    }
}

impl std::error::Error for SelectorError {}

/// How much of an over-limit selector an error quotes.
const QUOTED_PREFIX_CHARS: usize = 40;

fn limit_error(text: &str, position: usize, message: String) -> SelectorError {
    let mut selector: String = text.chars().take(QUOTED_PREFIX_CHARS).collect();
    if selector.len() < text.len() {
        selector.push_str("...");
    }
    SelectorError {
        selector,
        position,
        message,
        exceeded_limit: true,
    }
}

impl Selector {
    /// Parses a selector; see the module documentation for the grammar and the bounds.
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        if text.len() > MAX_SELECTOR_BYTES {
            let at = text
                .char_indices()
                .take_while(|(b, _)| *b < MAX_SELECTOR_BYTES)
                .count();
            return Err(limit_error(
                text,
                at,
                format!(
                    "selector is {} bytes, the limit is {MAX_SELECTOR_BYTES}",
                    text.len()
                ),
            ));
        }
        let err = |position: usize, message: String| SelectorError {
            selector: text.to_string(),
            position,
            message,
            exceeded_limit: false,
        };
        let tokens = lex(text).map_err(|(p, m)| err(p, m))?;
        if tokens.is_empty() {
            return Ok(Selector::All);
        }
        let mut p = Parser {
            toks: &tokens,
            i: 0,
            end: text.chars().count(),
            depth: 0,
            too_deep: false,
        };
        let sel = p.expr().map_err(|(pos, m)| {
            if p.too_deep {
                limit_error(text, pos, m)
            } else {
                err(pos, m)
            }
        })?;
        if let Some(t) = p.peek() {
            return Err(err(
                t.pos,
                format!(
                    "unexpected {} after a complete expression",
                    t.tok.describe()
                ),
            ));
        }
        Ok(sel)
    }

    /// Whether the labels satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let get = |k: &str| labels.get(k).map(String::as_str);
        match self {
            Selector::All | Selector::Global => true,
            Selector::Has(k) => labels.contains_key(k),
            Selector::Eq(k, v) => get(k) == Some(v),
            Selector::Ne(k, v) => get(k) != Some(v),
            Selector::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            Selector::NotIn(k, set) => !get(k).is_some_and(|v| set.contains(v)),
            Selector::Contains(k, s) => get(k).is_some_and(|v| v.contains(s.as_str())),
            Selector::StartsWith(k, s) => get(k).is_some_and(|v| v.starts_with(s.as_str())),
            Selector::EndsWith(k, s) => get(k).is_some_and(|v| v.ends_with(s.as_str())),
            Selector::Not(e) => !e.matches(labels),
            Selector::And(es) => es.iter().all(|e| e.matches(labels)),
            Selector::Or(es) => es.iter().any(|e| e.matches(labels)),
        }
    }

    /// True for `all()` / `global()` (or an empty selector): selects everything regardless of
    /// labels. Used where labels may be unknown (a node without a Node resource).
    pub fn is_all(&self) -> bool {
        matches!(self, Selector::All | Selector::Global)
    }
}

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Selector, SelectorError> {
        Selector::parse(s)
    }
}

fn quote(s: &str) -> String {
    // Prefer single quotes like Calico; fall back to double quotes when the value has one.
    if s.contains('\'') {
        format!("\"{s}\"")
    } else {
        format!("'{s}'")
    }
}

impl fmt::Display for Selector {
    /// The canonical text: re-parsing it gives the same AST.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |s: &BTreeSet<String>| s.iter().map(|v| quote(v)).collect::<Vec<_>>().join(", ");
        // Children of `&&`/`||`/`!` that are themselves compound get parentheses, so the
        // printed form never depends on precedence rules.
        let sub = |e: &Selector| match e {
            Selector::And(..) | Selector::Or(..) => format!("({e})"),
            _ => e.to_string(),
        };
        let join = |f: &mut fmt::Formatter<'_>, es: &[Selector], op: &str| {
            for (i, e) in es.iter().enumerate() {
                if i > 0 {
                    f.write_str(op)?;
                }
                f.write_str(&sub(e))?;
            }
            Ok(())
        };
        match self {
            Selector::All => write!(f, "all()"),
            Selector::Global => write!(f, "global()"),
            Selector::Has(k) => write!(f, "has({k})"),
            Selector::Eq(k, v) => write!(f, "{k} == {}", quote(v)),
            Selector::Ne(k, v) => write!(f, "{k} != {}", quote(v)),
            Selector::In(k, s) => write!(f, "{k} in {{{}}}", set(s)),
            Selector::NotIn(k, s) => write!(f, "{k} not in {{{}}}", set(s)),
            Selector::Contains(k, v) => write!(f, "{k} contains {}", quote(v)),
            Selector::StartsWith(k, v) => write!(f, "{k} starts with {}", quote(v)),
            Selector::EndsWith(k, v) => write!(f, "{k} ends with {}", quote(v)),
            Selector::Not(e) => write!(f, "!{}", sub(e)),
            // Empty lists only come from code, never from the parser; print what they mean.
            Selector::And(es) if es.is_empty() => write!(f, "all()"),
            Selector::Or(es) if es.is_empty() => write!(f, "!all()"),
            Selector::And(es) => join(f, es, " && "),
            Selector::Or(es) => join(f, es, " || "),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Str(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    Comma,
    EqEq,
    NotEq,
    Bang,
    AndAnd,
    OrOr,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Word(w) => format!("{w:?}"),
            Tok::Str(s) => format!("string {}", quote(s)),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::LBrace => "'{'".into(),
            Tok::RBrace => "'}'".into(),
            Tok::Comma => "','".into(),
            Tok::EqEq => "'=='".into(),
            Tok::NotEq => "'!='".into(),
            Tok::Bang => "'!'".into(),
            Tok::AndAnd => "'&&'".into(),
            Tok::OrOr => "'||'".into(),
        }
    }
}

struct Token {
    tok: Tok,
    pos: usize,
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

fn lex(text: &str) -> Result<Vec<Token>, (usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let pos = i;
        let two = |a: char, b: char| c == a && chars.get(i + 1) == Some(&b);
        let (tok, len) = if c.is_whitespace() {
            i += 1;
            continue;
        } else if two('=', '=') {
            (Tok::EqEq, 2)
        } else if two('!', '=') {
            (Tok::NotEq, 2)
        } else if two('&', '&') {
            (Tok::AndAnd, 2)
        } else if two('|', '|') {
            (Tok::OrOr, 2)
        } else if c == '!' {
            (Tok::Bang, 1)
        } else if c == '(' {
            (Tok::LParen, 1)
        } else if c == ')' {
            (Tok::RParen, 1)
        } else if c == '{' {
            (Tok::LBrace, 1)
        } else if c == '}' {
            (Tok::RBrace, 1)
        } else if c == ',' {
            (Tok::Comma, 1)
        } else if c == '\'' || c == '"' {
            let Some(len) = chars[i + 1..].iter().position(|&x| x == c) else {
                return Err((pos, format!("unterminated string starting with {c}")));
            };
            let s: String = chars[i + 1..i + 1 + len].iter().collect();
            (Tok::Str(s), len + 2)
        } else if key_char(c) {
            let len = chars[i..].iter().take_while(|&&x| key_char(x)).count();
            (Tok::Word(chars[i..i + len].iter().collect()), len)
        } else if c == '=' || c == '&' || c == '|' {
            return Err((pos, format!("unexpected {c:?}; did you mean \"{c}{c}\"?")));
        } else {
            return Err((pos, format!("unexpected character {c:?}")));
        };
        out.push(Token { tok, pos });
        i += len;
    }
    Ok(out)
}

struct Parser<'a> {
    toks: &'a [Token],
    i: usize,
    end: usize,
    /// Current nesting: open parentheses plus pending `!`s.
    depth: usize,
    /// Set when the error returned is [`MAX_SELECTOR_DEPTH`].
    too_deep: bool,
}

type PResult<T> = Result<T, (usize, String)>;

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.toks.get(self.i)
    }

    fn peek_tok(&self) -> Option<&Tok> {
        self.peek().map(|t| &t.tok)
    }

    fn pos(&self) -> usize {
        self.peek().map_or(self.end, |t| t.pos)
    }

    fn found(&self) -> String {
        self.peek()
            .map_or_else(|| "end of selector".to_string(), |t| t.tok.describe())
    }

    fn expect(&mut self, want: Tok, what: &str) -> PResult<()> {
        if self.peek_tok() == Some(&want) {
            self.i += 1;
            Ok(())
        } else {
            Err((
                self.pos(),
                format!("expected {what}, found {}", self.found()),
            ))
        }
    }

    fn word_is(&self, w: &str) -> bool {
        matches!(self.peek_tok(), Some(Tok::Word(x)) if x == w)
    }

    /// Enters `levels` more levels of nesting, or fails naming [`MAX_SELECTOR_DEPTH`].
    fn descend(&mut self, levels: usize, pos: usize) -> PResult<()> {
        self.depth += levels;
        if self.depth > MAX_SELECTOR_DEPTH {
            self.too_deep = true;
            return Err((
                pos,
                format!(
                    "selector nests deeper than {MAX_SELECTOR_DEPTH} levels at position {pos} \
                     (each '(' and '!' is a level), the limit is {MAX_SELECTOR_DEPTH}"
                ),
            ));
        }
        Ok(())
    }

    fn expr(&mut self) -> PResult<Selector> {
        self.chain(&Tok::OrOr, Self::and, Selector::Or)
    }

    fn and(&mut self) -> PResult<Selector> {
        self.chain(&Tok::AndAnd, Self::unary, Selector::And)
    }

    /// Operands read by `operand` and joined by `op`: the operand itself when it stands alone,
    /// else `join` of them all. A chain is collected into one flat list: its length costs no
    /// stack.
    fn chain(
        &mut self,
        op: &Tok,
        operand: fn(&mut Self) -> PResult<Selector>,
        join: fn(Vec<Selector>) -> Selector,
    ) -> PResult<Selector> {
        let mut terms = vec![operand(self)?];
        while self.peek_tok() == Some(op) {
            self.i += 1;
            terms.push(operand(self)?);
        }
        Ok(if terms.len() == 1 {
            terms.pop().expect("one term")
        } else {
            join(terms)
        })
    }

    fn unary(&mut self) -> PResult<Selector> {
        // `!!!x` is read in a loop, not by recursion; each `!` still counts as a level since
        // the tree it builds is that deep.
        let mut bangs = 0;
        while self.peek_tok() == Some(&Tok::Bang) {
            let pos = self.pos();
            self.i += 1;
            bangs += 1;
            self.descend(1, pos)?;
        }
        let mut e = self.primary()?;
        self.depth -= bangs;
        for _ in 0..bangs {
            e = Selector::Not(Box::new(e));
        }
        Ok(e)
    }

    fn string(&mut self) -> PResult<String> {
        match self.peek_tok() {
            Some(Tok::Str(s)) => {
                let s = s.clone();
                self.i += 1;
                Ok(s)
            }
            _ => Err((
                self.pos(),
                format!("expected a quoted string, found {}", self.found()),
            )),
        }
    }

    fn set(&mut self) -> PResult<BTreeSet<String>> {
        self.expect(Tok::LBrace, "'{' starting a set of strings")?;
        let mut set = BTreeSet::new();
        if self.peek_tok() == Some(&Tok::RBrace) {
            self.i += 1;
            return Ok(set);
        }
        loop {
            set.insert(self.string()?);
            match self.peek_tok() {
                Some(Tok::Comma) => self.i += 1,
                Some(Tok::RBrace) => {
                    self.i += 1;
                    return Ok(set);
                }
                _ => {
                    return Err((
                        self.pos(),
                        format!("expected ',' or '}}' in a set, found {}", self.found()),
                    ));
                }
            }
        }
    }

    fn primary(&mut self) -> PResult<Selector> {
        let pos = self.pos();
        let Some(tok) = self.peek_tok().cloned() else {
            return Err((
                pos,
                "unexpected end of selector, expected an expression".into(),
            ));
        };
        match tok {
            Tok::LParen => {
                self.i += 1;
                self.descend(1, pos)?;
                let e = self.expr()?;
                self.depth -= 1;
                self.expect(Tok::RParen, "')'")?;
                Ok(e)
            }
            Tok::Word(w) => {
                self.i += 1;
                let is_call = self.peek_tok() == Some(&Tok::LParen);
                match w.as_str() {
                    "all" | "global" if is_call => {
                        self.i += 1;
                        self.expect(Tok::RParen, &format!("')' closing {w}("))?;
                        Ok(if w == "all" {
                            Selector::All
                        } else {
                            Selector::Global
                        })
                    }
                    "has" if is_call => {
                        self.i += 1;
                        let k = match self.peek_tok() {
                            Some(Tok::Word(k)) => k.clone(),
                            _ => {
                                return Err((
                                    self.pos(),
                                    format!(
                                        "expected a label key in has(), found {}",
                                        self.found()
                                    ),
                                ));
                            }
                        };
                        self.i += 1;
                        self.expect(Tok::RParen, "')' closing has(")?;
                        Ok(Selector::Has(k))
                    }
                    _ if is_call => Err((pos, format!("unknown function {w}()"))),
                    _ => self.comparison(w),
                }
            }
            other => Err((
                pos,
                format!(
                    "expected a label key, '(', '!', all(), global() or has(), found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn comparison(&mut self, key: String) -> PResult<Selector> {
        match self.peek_tok() {
            Some(Tok::EqEq) => {
                self.i += 1;
                Ok(Selector::Eq(key, self.string()?))
            }
            Some(Tok::NotEq) => {
                self.i += 1;
                Ok(Selector::Ne(key, self.string()?))
            }
            Some(Tok::Word(w)) => match w.as_str() {
                "in" => {
                    self.i += 1;
                    Ok(Selector::In(key, self.set()?))
                }
                "not" => {
                    self.i += 1;
                    if !self.word_is("in") {
                        return Err((
                            self.pos(),
                            format!("expected 'in' after 'not', found {}", self.found()),
                        ));
                    }
                    self.i += 1;
                    Ok(Selector::NotIn(key, self.set()?))
                }
                "contains" => {
                    self.i += 1;
                    Ok(Selector::Contains(key, self.string()?))
                }
                "starts" | "ends" => {
                    let starts = w == "starts";
                    self.i += 1;
                    if !self.word_is("with") {
                        return Err((
                            self.pos(),
                            format!("expected 'with', found {}", self.found()),
                        ));
                    }
                    self.i += 1;
                    let s = self.string()?;
                    Ok(if starts {
                        Selector::StartsWith(key, s)
                    } else {
                        Selector::EndsWith(key, s)
                    })
                }
                _ => Err(self.bad_operator(&key)),
            },
            _ => Err(self.bad_operator(&key)),
        }
    }

    fn bad_operator(&self, key: &str) -> (usize, String) {
        (
            self.pos(),
            format!(
                "expected an operator after label key {key:?} (==, !=, in, not in, contains, \
                 starts with, ends with), found {}",
                self.found()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_round_trip() {
        let s = Selector::parse("a == 'x' || b == 'y' && !c == 'z'").unwrap();
        assert_eq!(
            s.to_string(),
            "a == 'x' || (b == 'y' && !c == 'z')",
            "&& binds tighter than ||, ! tightest"
        );
        assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
    }
}
