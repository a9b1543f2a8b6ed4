//! The `${...}` grammar (OmegaConf's `OmegaConfGrammarParser`): the AST of a parsed string
//! ([`Template`] and its parts), the recursive-descent parser over the lexer's tokens, and
//! OmegaConf's key splitting.

use std::borrow::Cow;
use std::ops::Range;

use super::lexer::{lex, Mode, Tk, Tok};
use crate::node::{python_float_literal, python_float_repr, python_int_literal, Value};

/// A parsed config string: literal text and interpolations, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// The text that was parsed.
    pub source: String,
    /// Its pieces; adjacent literal text is merged.
    pub parts: Vec<Part>,
}

impl Template {
    /// True when the string is exactly one interpolation (its value keeps its type).
    pub fn is_single_interpolation(&self) -> bool {
        matches!(self.parts.as_slice(), [Part::Interp(_)])
    }

    /// True when anything in the string needs resolving.
    pub fn has_interpolation(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Interp(_)))
    }
}

/// A piece of a string.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Literal text, already unescaped.
    Text(String),
    /// An interpolation.
    Interp(Interp),
}

/// One `${...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Interp {
    /// Byte range of the interpolation in the parsed text.
    pub span: Range<usize>,
    pub kind: InterpKind,
}

/// The two kinds of interpolation.
#[derive(Clone, Debug, PartialEq)]
pub enum InterpKind {
    /// `${a.b}`, `${..x}`, `${a[0]}`, `${a.${b}}`.
    Node(KeyPath),
    /// `${name:arg,...}`; the name is dotted parts, each a name or an interpolation.
    Resolver {
        name: Vec<KeyPart>,
        args: Vec<Element>,
    },
}

/// The key of a node interpolation.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyPath {
    /// Leading dots (relative interpolation).
    pub dots: usize,
    /// The keys, each after a dot or in brackets.
    pub items: Vec<KeyItem>,
    /// The key as OmegaConf assembles it (`..a.b[0]`), when no part is an interpolation.
    pub text: Option<String>,
}

/// One key of a [`KeyPath`].
#[derive(Clone, Debug, PartialEq)]
pub struct KeyItem {
    /// Written as `[key]` rather than `.key`.
    pub bracketed: bool,
    pub key: KeyPart,
}

/// A key, or a nested interpolation that must give a string.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyPart {
    Name(String),
    Interp(Box<Interp>),
}

/// A resolver argument (OmegaConf's `element` rule).
#[derive(Clone, Debug, PartialEq)]
pub enum Element {
    /// A typed primitive (`1`, `1.5`, `true`, `null`) or a string with nothing to resolve.
    Value(Value),
    /// Exactly one interpolation: its value keeps its type.
    Interp(Box<Interp>),
    /// Unquoted text with interpolations inside: a string.
    Concat(Vec<Part>),
    /// A quoted string with interpolations inside: a string.
    Quoted(Vec<Part>),
    /// `[a, b]`.
    List(Vec<Element>),
    /// `{k: v}`; keys as Python's `str()` renders them.
    Dict(Vec<(String, Element)>),
    /// Accepted by the grammar but rejected when evaluated (OmegaConf asserts on it).
    Invalid(String),
}

/// Deepest nesting of interpolations, quotes and containers the parser accepts.
const MAX_PARSE_DEPTH: usize = 128;

struct Parser<'s> {
    src: &'s str,
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
}

enum TextItem<'s> {
    Tok(Tk, &'s str),
    Interp(Interp),
}

pub(super) fn parse_template(text: &str) -> Result<Template, String> {
    if !text.contains("${") {
        let parts = if text.is_empty() {
            Vec::new()
        } else {
            vec![Part::Text(text.to_string())]
        };
        return Ok(Template {
            source: text.to_string(),
            parts,
        });
    }
    let mut p = Parser::new(text, lex(text, Mode::Top)?);
    let parts = p.parse_text(false)?;
    p.expect(Tk::Eof, "end of text")?;
    Ok(Template {
        source: text.to_string(),
        parts,
    })
}

/// OmegaConf's `singleElement` rule, as `oc.decode` uses it.
pub(super) fn parse_single_element(text: &str) -> Result<Element, String> {
    let mut p = Parser::new(text, lex(text, Mode::Value)?);
    let el = p.parse_element()?;
    p.expect(Tk::Eof, "end of text")?;
    Ok(el)
}

fn unescape_pairs(s: &str) -> String {
    s.chars().skip(1).step_by(2).collect()
}

impl<'s> Parser<'s> {
    fn new(src: &'s str, toks: Vec<Tok>) -> Self {
        Parser {
            src,
            toks,
            pos: 0,
            depth: 0,
        }
    }

    fn peek(&self) -> Tk {
        self.toks.get(self.pos).map_or(Tk::Eof, |t| t.kind)
    }

    fn bump(&mut self) -> Tok {
        let t = self.toks.get(self.pos).copied().unwrap_or(Tok {
            kind: Tk::Eof,
            start: self.src.len(),
            end: self.src.len(),
        });
        self.pos += 1;
        t
    }

    fn text(&self, t: Tok) -> &'s str {
        &self.src[t.start..t.end]
    }

    fn found(&self) -> String {
        match self.toks.get(self.pos) {
            Some(t) => format!("'{}'", self.text(*t)),
            None => "end of text".to_string(),
        }
    }

    fn fail<T>(&self, expected: &str) -> Result<T, String> {
        Err(format!("expected {expected}, found {}", self.found()))
    }

    fn expect(&mut self, kind: Tk, what: &str) -> Result<Tok, String> {
        if self.peek() == kind {
            Ok(self.bump())
        } else {
            self.fail(what)
        }
    }

    fn enter(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_PARSE_DEPTH {
            return Err(format!("nesting deeper than {MAX_PARSE_DEPTH} levels"));
        }
        Ok(())
    }

    /// `text: (interpolation | ANY_STR | ESC | ESC_INTER | TOP_ESC | QUOTED_ESC)+`, unescaped
    /// as OmegaConf's visitor does.
    fn parse_text(&mut self, quoted: bool) -> Result<Vec<Part>, String> {
        let mut items = Vec::new();
        loop {
            match self.peek() {
                Tk::InterOpen => items.push(TextItem::Interp(self.parse_interp()?)),
                k @ (Tk::AnyStr | Tk::Esc | Tk::EscInter | Tk::TopEsc | Tk::QuotedEsc) => {
                    let t = self.bump();
                    items.push(TextItem::Tok(k, self.text(t)));
                }
                _ => break,
            }
        }
        let next_is_interp: Vec<bool> = (0..items.len())
            .map(|i| matches!(items.get(i + 1), Some(TextItem::Interp(_))))
            .collect();
        let count = items.len();
        let mut parts = Vec::new();
        let mut buf = String::new();
        for (i, item) in items.into_iter().enumerate() {
            match item {
                TextItem::Tok(kind, s) => match kind {
                    Tk::EscInter => buf.push_str(&s[s.len() - (s.len() / 2 + 1)..]),
                    Tk::Esc => buf.push_str(&unescape_pairs(s)),
                    Tk::TopEsc if next_is_interp[i] => buf.push_str(&unescape_pairs(s)),
                    Tk::QuotedEsc if quoted && (next_is_interp[i] || i + 1 == count) => {
                        buf.push_str(&unescape_pairs(s))
                    }
                    _ => buf.push_str(s),
                },
                TextItem::Interp(it) => {
                    if !buf.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut buf)));
                    }
                    parts.push(Part::Interp(it));
                }
            }
        }
        if !buf.is_empty() {
            parts.push(Part::Text(buf));
        }
        Ok(parts)
    }

    /// `interpolation: interpolationNode | interpolationResolver`.
    fn parse_interp(&mut self) -> Result<Interp, String> {
        self.enter()?;
        let open = self.expect(Tk::InterOpen, "'${'")?;
        let mut dots = 0;
        while self.peek() == Tk::Dot {
            self.bump();
            dots += 1;
        }
        // A resolver name is IDs and interpolations joined by single dots.
        let mut name_ok = dots == 0;
        let mut items = Vec::new();
        let mut first = true;
        loop {
            let bracketed = match self.peek() {
                Tk::BracketOpen => true,
                Tk::Dot if !first => false,
                _ if first => false,
                _ => break,
            };
            if bracketed || !first {
                self.bump();
            }
            let key = self.parse_config_key(&mut name_ok)?;
            if bracketed {
                self.expect(Tk::BracketClose, "']'")?;
                name_ok = false;
            }
            items.push(KeyItem { bracketed, key });
            first = false;
        }
        let kind = match self.peek() {
            Tk::InterClose => {
                self.bump();
                InterpKind::Node(KeyPath::new(dots, items))
            }
            Tk::Colon if name_ok => {
                self.bump();
                let args = if self.peek() == Tk::BraceClose {
                    Vec::new()
                } else {
                    self.parse_sequence(Tk::BraceClose)?
                };
                self.expect(Tk::BraceClose, "'}'")?;
                InterpKind::Resolver {
                    name: items.into_iter().map(|i| i.key).collect(),
                    args,
                }
            }
            _ => return self.fail("'}'"),
        };
        let end = self.toks[self.pos - 1].end;
        self.depth -= 1;
        Ok(Interp {
            span: open.start..end,
            kind,
        })
    }

    /// `configKey: interpolation | ID | INTER_KEY`.
    fn parse_config_key(&mut self, name_ok: &mut bool) -> Result<KeyPart, String> {
        match self.peek() {
            Tk::InterOpen => Ok(KeyPart::Interp(Box::new(self.parse_interp()?))),
            Tk::Id => {
                let t = self.bump();
                Ok(KeyPart::Name(self.text(t).to_string()))
            }
            Tk::InterKey => {
                *name_ok = false;
                let t = self.bump();
                Ok(KeyPart::Name(self.text(t).to_string()))
            }
            _ => self.fail("a key"),
        }
    }

    /// `sequence: (element (COMMA element?)*) | (COMMA element?)+`; missing elements are
    /// empty strings.
    fn parse_sequence(&mut self, end: Tk) -> Result<Vec<Element>, String> {
        let mut out = Vec::new();
        let mut previous_comma = true;
        let mut any = false;
        loop {
            match self.peek() {
                k if k == end || k == Tk::Eof => break,
                Tk::Comma => {
                    self.bump();
                    if previous_comma {
                        out.push(Element::Value(Value::Str(String::new())));
                    }
                    previous_comma = true;
                    any = true;
                }
                _ if !previous_comma => return self.fail("','"),
                _ => {
                    out.push(self.parse_element()?);
                    previous_comma = false;
                    any = true;
                }
            }
        }
        if any && previous_comma {
            out.push(Element::Value(Value::Str(String::new())));
        }
        Ok(out)
    }

    /// `element: primitive | quotedValue | listContainer | dictContainer`.
    fn parse_element(&mut self) -> Result<Element, String> {
        self.enter()?;
        let el = match self.peek() {
            Tk::QuoteOpen => {
                self.bump();
                let parts = self.parse_text(true)?;
                self.expect(Tk::QuoteClose, "closing quote")?;
                if parts.iter().any(|p| matches!(p, Part::Interp(_))) {
                    Element::Quoted(parts)
                } else {
                    let mut s = String::new();
                    for p in parts {
                        if let Part::Text(t) = p {
                            s.push_str(&t);
                        }
                    }
                    Element::Value(Value::Str(s))
                }
            }
            Tk::BracketOpen => {
                self.bump();
                let items = if self.peek() == Tk::BracketClose {
                    Vec::new()
                } else {
                    self.parse_sequence(Tk::BracketClose)?
                };
                self.expect(Tk::BracketClose, "']'")?;
                Element::List(items)
            }
            Tk::BraceOpen => {
                self.bump();
                let mut pairs = Vec::new();
                if self.peek() == Tk::BraceClose {
                    self.bump();
                } else {
                    loop {
                        let key = self.parse_dict_key()?;
                        self.expect(Tk::Colon, "':'")?;
                        let value = self.parse_element()?;
                        pairs.push((key, value));
                        match self.peek() {
                            Tk::Comma => {
                                self.bump();
                            }
                            Tk::BraceClose => {
                                self.bump();
                                break;
                            }
                            _ => return self.fail("',' or '}'"),
                        }
                    }
                }
                Element::Dict(pairs)
            }
            _ => self.parse_primitive()?,
        };
        self.depth -= 1;
        Ok(el)
    }

    /// `dictKey`: primitive tokens without `:` or interpolations; typed keys become the
    /// string Python's `str()` gives them.
    fn parse_dict_key(&mut self) -> Result<String, String> {
        let mut toks = Vec::new();
        while matches!(
            self.peek(),
            Tk::Id
                | Tk::Null
                | Tk::Int
                | Tk::Float
                | Tk::Bool
                | Tk::UnquotedChar
                | Tk::Esc
                | Tk::Ws
        ) {
            toks.push(self.bump());
        }
        match toks.as_slice() {
            [] => self.fail("a dictionary key"),
            [t] => {
                let s = self.text(*t);
                Ok(match t.kind {
                    Tk::Null => "None".to_string(),
                    Tk::Int => python_int_key(s),
                    Tk::Float => python_float_repr(python_float_literal(s)),
                    Tk::Bool => {
                        if s.eq_ignore_ascii_case("true") {
                            "True".to_string()
                        } else {
                            "False".to_string()
                        }
                    }
                    Tk::Esc => unescape_pairs(s),
                    _ => s.to_string(),
                })
            }
            many => Ok(many
                .iter()
                .map(|t| {
                    let s = self.text(*t);
                    if t.kind == Tk::Esc {
                        Cow::Owned(unescape_pairs(s))
                    } else {
                        Cow::Borrowed(s)
                    }
                })
                .collect()),
        }
    }

    /// `primitive: (ID | NULL | INT | FLOAT | BOOL | UNQUOTED_CHAR | COLON | ESC | WS |
    /// interpolation)+`.
    fn parse_primitive(&mut self) -> Result<Element, String> {
        let mut items: Vec<TextItem<'s>> = Vec::new();
        loop {
            match self.peek() {
                Tk::InterOpen => items.push(TextItem::Interp(self.parse_interp()?)),
                k @ (Tk::Id
                | Tk::Null
                | Tk::Int
                | Tk::Float
                | Tk::Bool
                | Tk::UnquotedChar
                | Tk::Colon
                | Tk::Esc
                | Tk::Ws) => {
                    let t = self.bump();
                    items.push(TextItem::Tok(k, self.text(t)));
                }
                _ => break,
            }
        }
        if items.len() == 1 {
            return Ok(match items.pop() {
                Some(TextItem::Interp(it)) => Element::Interp(Box::new(it)),
                Some(TextItem::Tok(kind, s)) => match kind {
                    Tk::Null => Element::Value(Value::Null),
                    Tk::Int => match python_int_literal(s) {
                        Some(i) => Element::Value(Value::Int(i)),
                        None => Element::Invalid(format!("integer {s} is out of range")),
                    },
                    Tk::Float => Element::Value(Value::Float(python_float_literal(s))),
                    Tk::Bool => Element::Value(Value::Bool(s.eq_ignore_ascii_case("true"))),
                    Tk::Esc => Element::Value(Value::Str(unescape_pairs(s))),
                    Tk::Ws => Element::Invalid("WS should never be reached".to_string()),
                    _ => Element::Value(Value::Str(s.to_string())),
                },
                None => unreachable!("one item"),
            });
        }
        if items.is_empty() {
            return self.fail("a value");
        }
        let mut parts = Vec::new();
        let mut buf = String::new();
        for item in items {
            match item {
                TextItem::Tok(Tk::Esc, s) => buf.push_str(&unescape_pairs(s)),
                TextItem::Tok(_, s) => buf.push_str(s),
                TextItem::Interp(it) => {
                    if !buf.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut buf)));
                    }
                    parts.push(Part::Interp(it));
                }
            }
        }
        if parts.is_empty() {
            return Ok(Element::Value(Value::Str(buf)));
        }
        if !buf.is_empty() {
            parts.push(Part::Text(buf));
        }
        Ok(Element::Concat(parts))
    }
}

/// Python's `str(int(text))` for an INT token (any size).
fn python_int_key(text: &str) -> String {
    if let Some(i) = python_int_literal(text) {
        return i.to_string();
    }
    let negative = text.starts_with('-');
    let digits: String = text
        .chars()
        .filter(|c| c.is_ascii_digit())
        .skip_while(|&c| c == '0')
        .collect();
    match (digits.is_empty(), negative) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits,
    }
}

impl KeyPath {
    fn new(dots: usize, items: Vec<KeyItem>) -> KeyPath {
        let mut text = Some(".".repeat(dots));
        for (i, item) in items.iter().enumerate() {
            match (&mut text, &item.key) {
                (Some(t), KeyPart::Name(name)) => push_key_piece(t, i, item.bracketed, name),
                _ => text = None,
            }
        }
        KeyPath { dots, items, text }
    }
}

pub(super) fn push_key_piece(out: &mut String, index: usize, bracketed: bool, key: &str) {
    if bracketed {
        out.push('[');
        out.push_str(key);
        out.push(']');
    } else {
        if index > 0 {
            out.push('.');
        }
        out.push_str(key);
    }
}

/// OmegaConf's `split_key`: `a.b[c].d` → `[a, b, c, d]`, with its exact quirks (a key that
/// starts with a bracket, empty segments, unterminated brackets dropped).
pub(super) fn split_key(key: &str) -> Vec<&str> {
    let b = key.as_bytes();
    // KEY_PATH_HEAD: (\.)*[^.[]*
    let mut first_stop = b.iter().take_while(|&&c| c == b'.').count();
    first_stop += b[first_stop..]
        .iter()
        .take_while(|&&c| c != b'.' && c != b'[')
        .count();
    let mut tokens: Vec<&str> = key[..first_stop].split('.').collect();
    if first_stop == key.len() {
        return tokens;
    }
    if b[first_stop] == b'[' && tokens.last().is_some_and(|t| t.is_empty()) {
        tokens.pop();
    }
    // KEY_PATH_OTHER: \.([^.[]*)|\[(.*?)\]   (findall: unmatched characters are skipped)
    let mut i = first_stop;
    while i < b.len() {
        match b[i] {
            b'.' => {
                let len = b[i + 1..]
                    .iter()
                    .take_while(|&&c| c != b'.' && c != b'[')
                    .count();
                tokens.push(&key[i + 1..i + 1 + len]);
                i += 1 + len;
            }
            b'[' => match b[i + 1..].iter().position(|&c| c == b']') {
                Some(close) => {
                    tokens.push(&key[i + 1..i + 1 + close]);
                    i += close + 2;
                }
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    tokens
}
