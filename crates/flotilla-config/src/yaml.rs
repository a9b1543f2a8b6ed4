//! YAML in and out, as Hydra reads and OmegaConf writes it.
//!
//! Reading follows PyYAML's SafeLoader with OmegaConf's adjustments: YAML 1.1 plain scalars
//! (`yes`/`no`/`on`/`off` are booleans, `0x1F`/`0o17`/`017`/`1_000` are integers, `1e-4` and
//! `.5` are floats), no timestamps, duplicate keys rejected, anchors, aliases and `<<` merge keys
//! honoured, `???` as the missing value. Every node records the file and line it came from.
//! Hydra's `# @package` header is read from the comment lines at the top of a file.
//! Writing follows `OmegaConf.to_yaml`: PyYAML's block style, insertion order, strings quoted
//! when they would otherwise read back as another type.

use super::node::{python_float_repr, Dict, Node, Origin, Value};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A YAML document that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("{path}:{line}:{col}: malformed YAML: {message}")]
    Syntax {
        path: String,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{path}:{line}: duplicate key '{key}' in the same mapping")]
    DuplicateKey {
        path: String,
        line: usize,
        key: String,
    },
    #[error("{path}: {message}")]
    Other { path: String, message: String },
}

/// The header of a config file (`# @package foo.bar`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub package: Option<String>,
}

/// Reads Hydra's header: comment lines of the form `# @key value` at the top of the file,
/// up to the first line that is neither blank nor such a comment.
pub fn parse_header(text: &str, path: &str) -> Result<Header, YamlError> {
    let mut header = Header::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(rest) = line.strip_prefix('#') else {
            break;
        };
        let rest = rest.trim_start();
        if !rest.starts_with('@') {
            break;
        }
        let rest = line.trim_start_matches('#').trim();
        let parts: Vec<&str> = rest.split(' ').filter(|s| !s.is_empty()).collect();
        if parts.len() < 2 {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("expected header format '# @KEY VALUE', got '{rest}'"),
            });
        }
        if parts.len() > 2 {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("too many components in header '{rest}'"),
            });
        }
        if parts[0] == "@package" {
            header.package = Some(parts[1].to_string());
        }
    }
    Ok(header)
}

/// Parses one YAML document into a node tree. An empty document is an empty dictionary.
pub fn load_str(text: &str, path: &str) -> Result<Node, YamlError> {
    let file: Arc<str> = Arc::from(path);
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder {
        file,
        path,
        text,
        anchors: HashMap::new(),
        cost: 0,
    };
    let syntax = |e: yaml_rust2::ScanError| YamlError::Syntax {
        path: path.into(),
        line: e.marker().line(),
        col: e.marker().col() + 1,
        message: e.info().to_string(),
    };
    let mut next = || parser.next_token().map_err(syntax);
    // StreamStart
    let (ev, _) = next()?;
    debug_assert_eq!(ev, Event::StreamStart);
    let (ev, mark) = next()?;
    let root = match ev {
        Event::StreamEnd => Node::new(Value::dict(), builder.origin(mark)),
        Event::DocumentStart => {
            let (ev, mark) = next()?;
            let root = builder.node(ev, mark, &mut next)?;
            let (ev, mark) = next()?;
            if ev != Event::DocumentEnd {
                return Err(YamlError::Syntax {
                    path: path.into(),
                    line: mark.line(),
                    col: mark.col() + 1,
                    message: "expected a single document".into(),
                });
            }
            let (ev, mark) = next()?;
            if ev != Event::StreamEnd {
                return Err(YamlError::Syntax {
                    path: path.into(),
                    line: mark.line(),
                    col: mark.col() + 1,
                    message: "expected a single YAML document, found several".into(),
                });
            }
            root
        }
        other => {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("unexpected YAML event {other:?}"),
            })
        }
    };
    Ok(match root.value {
        Value::Null => Node::new(Value::dict(), root.origin),
        _ => root,
    })
}

/// The most a document may cost to build, in estimated bytes (every node counts
/// [`NODE_COST`], every scalar its text too), aliases counted as the copies they create. Real
/// configs cost kilobytes; a YAML alias bomb ("billion laughs") is stopped here long before it
/// exhausts memory.
pub const MAX_DOCUMENT_COST: u64 = 64 << 20;

/// The estimated cost of one node, apart from its text.
const NODE_COST: u64 = 64;

struct Builder<'p> {
    file: Arc<str>,
    path: &'p str,
    text: &'p str,
    /// Every anchored node and what building it cost, by the parser's anchor id.
    anchors: HashMap<usize, (Node, u64)>,
    /// The cost of everything built so far, aliases included.
    cost: u64,
}

impl Builder<'_> {
    fn origin(&self, mark: Marker) -> Origin {
        Origin::File {
            path: self.file.clone(),
            line: mark.line() as u32,
        }
    }

    /// The name of the alias at `mark` (`*name` in the source text).
    fn alias_name(&self, mark: Marker) -> String {
        let rest = self
            .text
            .chars()
            .skip(mark.index())
            .skip_while(|c| *c == '*');
        rest.take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ']' | '}'))
            .collect()
    }

    /// Adds `cost` to the document's total; an error names the culprit when the total passes
    /// [`MAX_DOCUMENT_COST`].
    fn spend(
        &mut self,
        cost: u64,
        mark: Marker,
        culprit: impl FnOnce() -> String,
    ) -> Result<(), YamlError> {
        self.cost = self.cost.saturating_add(cost);
        if self.cost > MAX_DOCUMENT_COST {
            return Err(YamlError::Other {
                path: format!("{}:{}", self.path, mark.line()),
                message: format!(
                    "{} takes the document past {} MiB; a config this large is an alias bomb \
                     (anchors expanded many times over) or data that belongs in a data file",
                    culprit(),
                    MAX_DOCUMENT_COST >> 20
                ),
            });
        }
        Ok(())
    }

    /// Records an anchored node with the cost of building it.
    fn remember(&mut self, anchor: usize, node: &Node, cost_before: u64) {
        if anchor > 0 {
            self.anchors
                .insert(anchor, (node.clone(), self.cost - cost_before));
        }
    }

    fn node(
        &mut self,
        ev: Event,
        mark: Marker,
        next: &mut impl FnMut() -> Result<(Event, Marker), YamlError>,
    ) -> Result<Node, YamlError> {
        let cost_before = self.cost;
        self.node_inner(ev, mark, next, cost_before)
    }

    fn node_inner(
        &mut self,
        ev: Event,
        mark: Marker,
        next: &mut impl FnMut() -> Result<(Event, Marker), YamlError>,
        cost_before: u64,
    ) -> Result<Node, YamlError> {
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let value = scalar_value(&text, style, tag.as_ref()).map_err(|message| {
                    YamlError::Other {
                        path: format!("{}:{}", self.path, mark.line()),
                        message,
                    }
                })?;
                self.spend(NODE_COST + text.len() as u64, mark, || "a scalar".into())?;
                let node = Node::new(value, self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            Event::Alias(id) => {
                let Some((node, cost)) = self.anchors.get(&id).cloned() else {
                    return Err(YamlError::Syntax {
                        path: self.path.into(),
                        line: mark.line(),
                        col: mark.col() + 1,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                let name = self.alias_name(mark);
                self.spend(cost, mark, || format!("alias *{name} (of anchor &{name})"))?;
                Ok(node)
            }
            Event::SequenceStart(anchor, _) => {
                self.spend(NODE_COST, mark, || "a sequence".into())?;
                let mut items = Vec::new();
                loop {
                    let (ev, m) = next()?;
                    if ev == Event::SequenceEnd {
                        break;
                    }
                    items.push(self.node(ev, m, next)?);
                }
                let node = Node::new(Value::List(items), self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            Event::MappingStart(anchor, _) => {
                self.spend(NODE_COST, mark, || "a mapping".into())?;
                let mut dict = Dict::new();
                // PyYAML 6.0.2+'s flatten_mapping, which OmegaConf and so Hydra use: the pairs
                // of every merge source come first, in source order, then the mapping's own
                // pairs; a later pair replaces an earlier value and keeps its place, so explicit
                // keys win. Among merge sources PyYAML drops a pair whose key object it has seen
                // (identity, not equality): CPython shares one object per 1-character Latin-1
                // string, so for such keys the first source wins, for longer keys the last.
                let mut merged: Vec<(String, Node)> = Vec::new();
                loop {
                    let (ev, key_mark) = next()?;
                    if ev == Event::MappingEnd {
                        break;
                    }
                    let is_merge_key =
                        matches!(&ev, Event::Scalar(k, TScalarStyle::Plain, _, None) if k == "<<");
                    let key_node = self.node(ev, key_mark, next)?;
                    let (ev, m) = next()?;
                    let value = self.node(ev, m, next)?;
                    if is_merge_key {
                        match value.value {
                            Value::Dict(d) => merged.extend(d),
                            Value::List(items) => {
                                let mut sources = Vec::with_capacity(items.len());
                                for item in items {
                                    match item.value {
                                        Value::Dict(d) => sources.push(d),
                                        _ => return Err(self.merge_error(key_mark)),
                                    }
                                }
                                merged.extend(sources.into_iter().flatten());
                            }
                            _ => return Err(self.merge_error(key_mark)),
                        }
                        continue;
                    }
                    let key = key_text(&key_node.value).ok_or_else(|| YamlError::Other {
                        path: format!("{}:{}", self.path, key_mark.line()),
                        message: format!(
                            "a mapping key must be a scalar, found a {}",
                            key_node.value.type_name()
                        ),
                    })?;
                    if dict.contains_key(&key) {
                        return Err(YamlError::DuplicateKey {
                            path: self.path.into(),
                            line: key_mark.line(),
                            key,
                        });
                    }
                    dict.insert(key, value);
                }
                if !merged.is_empty() {
                    let own = std::mem::take(&mut dict);
                    for (key, value) in merged {
                        let shared_key_object = {
                            let mut chars = key.chars();
                            matches!((chars.next(), chars.next()), (Some(c), None) if (c as u32) < 256)
                        };
                        if !(shared_key_object && dict.contains_key(&key)) {
                            dict.insert(key, value);
                        }
                    }
                    dict.extend(own);
                }
                let node = Node::new(Value::Dict(dict), self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            other => Err(YamlError::Other {
                path: self.path.into(),
                message: format!("unexpected YAML event {other:?}"),
            }),
        }
    }

    fn merge_error(&self, mark: Marker) -> YamlError {
        YamlError::Other {
            path: format!("{}:{}", self.path, mark.line()),
            message: "'<<' merge expects a mapping or a list of mappings".into(),
        }
    }
}

/// The text of a mapping key (keys are stored as strings, as OmegaConf prints them).
fn key_text(value: &Value) -> Option<String> {
    Some(match value {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => python_float_repr(*f),
        // Python's json module writes True/None keys as "true"/"null".
        Value::Bool(b) => if *b { "true" } else { "false" }.to_string(),
        Value::Null => "null".to_string(),
        Value::Missing => "???".to_string(),
        Value::List(_) | Value::Dict(_) => return None,
    })
}

fn scalar_value(text: &str, style: TScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    if let Some(tag) = tag {
        if tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!" {
            return match tag.suffix.as_str() {
                "str" => Ok(string_value(text)),
                "int" => parse_yaml11_int(text).ok_or_else(|| format!("'{text}' is not an int")),
                "float" => parse_yaml11_float(text)
                    .or_else(|| {
                        parse_yaml11_int(text).map(|v| match v {
                            Value::Int(i) => Value::Float(i as f64),
                            other => other,
                        })
                    })
                    .ok_or_else(|| format!("'{text}' is not a float")),
                "bool" => match yaml11_bool(text) {
                    Some(b) => Ok(Value::Bool(b)),
                    None => Err(format!("'{text}' is not a bool")),
                },
                "null" => Ok(Value::Null),
                other => Err(format!("unsupported YAML tag !!{other}")),
            };
        }
        return Err(format!("unsupported YAML tag {}{}", tag.handle, tag.suffix));
    }
    if style != TScalarStyle::Plain {
        return Ok(string_value(text));
    }
    Ok(plain_scalar(text))
}

fn string_value(text: &str) -> Value {
    if text == "???" {
        Value::Missing
    } else {
        Value::Str(text.to_string())
    }
}

/// Resolves a plain (unquoted) scalar with YAML 1.1's implicit types, as OmegaConf's loader does.
pub fn plain_scalar(text: &str) -> Value {
    if let Some(b) = yaml11_bool(text) {
        return Value::Bool(b);
    }
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    if let Some(first) = text.chars().next() {
        if "-+0123456789.".contains(first) {
            if let Some(v) = parse_yaml11_float_strict(text) {
                return v;
            }
            if let Some(v) = parse_yaml11_int(text) {
                return v;
            }
            if let Some(v) = parse_yaml11_float(text) {
                return v;
            }
        }
    }
    string_value(text)
}

/// YAML 1.1 booleans.
pub fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

fn all_chars(s: &str, allowed: impl Fn(char) -> bool) -> bool {
    !s.is_empty() && s.chars().all(allowed)
}

/// YAML 1.1 integers: binary `0b`, octal `0…`, decimal, hex `0x`, sexagesimal `1:30`; `_` ignored.
pub fn parse_yaml11_int(text: &str) -> Option<Value> {
    let (negative, body) = split_sign(text);
    let digits_of = |s: &str| s.replace('_', "");
    let magnitude: i128 = if let Some(bin) = body.strip_prefix("0b") {
        if !all_chars(bin, |c| c == '0' || c == '1' || c == '_') {
            return None;
        }
        i128::from_str_radix(&digits_of(bin), 2).ok()?
    } else if let Some(hex) = body.strip_prefix("0x") {
        if !all_chars(hex, |c| c.is_ascii_hexdigit() || c == '_') {
            return None;
        }
        i128::from_str_radix(&digits_of(hex), 16).ok()?
    } else if body.len() > 1
        && body.starts_with('0')
        && all_chars(&body[1..], |c| ('0'..='7').contains(&c) || c == '_')
    {
        let d = digits_of(&body[1..]);
        if d.is_empty() {
            0
        } else {
            i128::from_str_radix(&d, 8).ok()?
        }
    } else if body == "0" {
        0
    } else if body.starts_with(|c: char| ('1'..='9').contains(&c))
        && all_chars(body, |c| c.is_ascii_digit() || c == '_')
    {
        digits_of(body).parse().ok()?
    } else if body.contains(':') {
        let parts: Vec<&str> = body.split(':').collect();
        let head = parts[0];
        if !(head.starts_with(|c: char| ('1'..='9').contains(&c))
            && all_chars(head, |c| c.is_ascii_digit() || c == '_'))
        {
            return None;
        }
        let mut total: i128 = digits_of(head).parse().ok()?;
        for part in &parts[1..] {
            if part.is_empty() || part.len() > 2 || !all_chars(part, |c| c.is_ascii_digit()) {
                return None;
            }
            let v: i128 = part.parse().ok()?;
            if v > 59 {
                return None;
            }
            total = total * 60 + v;
        }
        total
    } else {
        return None;
    };
    let signed = if negative { -magnitude } else { magnitude };
    Some(match i64::try_from(signed) {
        Ok(i) => Value::Int(i),
        Err(_) => Value::Float(signed as f64),
    })
}

/// YAML 1.1's own float pattern (a dot is required, or `.inf`/`.nan`, or sexagesimal).
fn parse_yaml11_float_strict(text: &str) -> Option<Value> {
    let (negative, body) = split_sign(text);
    let sign = if negative { -1.0 } else { 1.0 };
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return Some(Value::Float(sign * f64::INFINITY));
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Some(Value::Float(f64::NAN));
    }
    // [0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?   |   \.[0-9_]+([eE][-+][0-9]+)?
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    if let Some(exp) = exponent {
        let ok = exp.len() > 1
            && (exp.starts_with('+') || exp.starts_with('-'))
            && all_chars(&exp[1..], |c| c.is_ascii_digit());
        if !ok {
            return sexagesimal_float(negative, body);
        }
    }
    let (int_part, frac) = mantissa.split_once('.')?;
    let int_ok = if int_part.is_empty() {
        !negative && !text.starts_with('+') && all_chars(frac, |c| c.is_ascii_digit() || c == '_')
    } else {
        int_part.starts_with(|c: char| c.is_ascii_digit())
            && int_part.chars().all(|c| c.is_ascii_digit() || c == '_')
            && frac.chars().all(|c| c.is_ascii_digit() || c == '_')
    };
    if !int_ok {
        return sexagesimal_float(negative, body);
    }
    float_from_parts(negative, int_part, frac, exponent)
}

fn sexagesimal_float(negative: bool, body: &str) -> Option<Value> {
    // [0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*
    if !body.contains(':') {
        return None;
    }
    let (whole, frac) = body.rsplit_once('.')?;
    if !frac.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    let parts: Vec<&str> = whole.split(':').collect();
    let head = parts[0];
    if !(head.starts_with(|c: char| c.is_ascii_digit())
        && all_chars(head, |c| c.is_ascii_digit() || c == '_'))
    {
        return None;
    }
    let mut total: f64 = head.replace('_', "").parse().ok()?;
    for (i, part) in parts[1..].iter().enumerate() {
        let last = i == parts.len() - 2;
        let p = *part;
        if p.is_empty() || p.len() > 2 || !all_chars(p, |c| c.is_ascii_digit()) {
            return None;
        }
        let mut v: f64 = p.parse().ok()?;
        if p.len() == 2 && p.as_bytes()[0] > b'5' {
            return None;
        }
        if last {
            let f = frac.replace('_', "");
            if !f.is_empty() {
                v += format!("0.{f}").parse::<f64>().ok()?;
            }
        }
        total = total * 60.0 + v;
    }
    Some(Value::Float(if negative { -total } else { total }))
}

/// The float pattern OmegaConf adds on top of YAML 1.1 (exponents without a dot, `1e-4`).
pub fn parse_yaml11_float(text: &str) -> Option<Value> {
    if let Some(v) = parse_yaml11_float_strict(text) {
        return Some(v);
    }
    let (negative, body) = split_sign(text);
    // [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+]?[0-9]+)?  |  [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    // |  \.[0-9_]+([eE][-+][0-9]+)?
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    if let Some(exp) = exponent {
        let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
        if !all_chars(digits, |c| c.is_ascii_digit()) {
            return None;
        }
    }
    match mantissa.split_once('.') {
        Some((int_part, frac)) => {
            if int_part.is_empty() {
                return None; // the `.5` forms are covered by the strict pattern
            }
            if !(int_part.starts_with(|c: char| c.is_ascii_digit())
                && int_part.chars().all(|c| c.is_ascii_digit() || c == '_')
                && frac.chars().all(|c| c.is_ascii_digit() || c == '_'))
            {
                return None;
            }
            float_from_parts(negative, int_part, frac, exponent)
        }
        None => {
            exponent?;
            if !(mantissa.starts_with(|c: char| c.is_ascii_digit())
                && mantissa.chars().all(|c| c.is_ascii_digit() || c == '_'))
            {
                return None;
            }
            float_from_parts(negative, mantissa, "", exponent)
        }
    }
}

fn float_from_parts(
    negative: bool,
    int_part: &str,
    frac: &str,
    exp: Option<&str>,
) -> Option<Value> {
    let int_digits = int_part.replace('_', "");
    let frac_digits = frac.replace('_', "");
    let mut s = String::new();
    if negative {
        s.push('-');
    }
    s.push_str(if int_digits.is_empty() {
        "0"
    } else {
        &int_digits
    });
    s.push('.');
    s.push_str(if frac_digits.is_empty() {
        "0"
    } else {
        &frac_digits
    });
    if let Some(e) = exp {
        s.push('e');
        s.push_str(e);
    }
    s.parse::<f64>().ok().map(Value::Float)
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Options for [`to_yaml`].
#[derive(Clone, Copy, Debug, Default)]
pub struct EmitOptions {
    /// Append `# <origin>` to every leaf.
    pub provenance: bool,
}

/// PyYAML's preferred line width; plain and single-quoted scalars fold at spaces beyond it.
const BEST_WIDTH: usize = 80;

/// Renders a tree as `OmegaConf.to_yaml` does (PyYAML block style, insertion order, long
/// scalars folded at column 80).
pub fn to_yaml(node: &Node, opts: EmitOptions) -> String {
    let mut w = Writer {
        out: String::new(),
        opts,
    };
    match &node.value {
        Value::Dict(d) if !d.is_empty() => w.dict(d, 0),
        Value::List(l) if !l.is_empty() => w.list(l, 0),
        _ => {
            w.scalar(&node.value, 0, 0);
            w.out.push('\n');
        }
    }
    w.out
}

struct Writer {
    out: String,
    opts: EmitOptions,
}

impl Writer {
    fn column(&self) -> usize {
        let line_start = self.out.rfind('\n').map(|i| i + 1).unwrap_or(0);
        self.out[line_start..].chars().count()
    }

    fn leaf_comment(&mut self, node: &Node) {
        if self.opts.provenance && node.origin != Origin::Unknown {
            let _ = write!(self.out, "  # {}", node.origin);
        }
    }

    fn key(&mut self, key: &str) {
        // Keys are simple keys: never folded.
        let text = string_scalar_text(key, usize::MAX, 0, 0);
        self.out.push_str(&text);
        self.out.push(':');
    }

    fn dict(&mut self, d: &Dict, indent: usize) {
        for (key, child) in d {
            self.out.push_str(&" ".repeat(indent));
            self.key(key);
            self.value_after_key(child, indent);
        }
    }

    fn value_after_key(&mut self, child: &Node, indent: usize) {
        match &child.value {
            Value::Dict(cd) if !cd.is_empty() => {
                self.out.push('\n');
                self.dict(cd, indent + 2);
            }
            Value::List(items) if !items.is_empty() => {
                // PyYAML does not indent block sequences inside mappings.
                self.out.push('\n');
                self.list(items, indent);
            }
            _ => {
                self.out.push(' ');
                let column = self.column();
                self.scalar(&child.value, column, indent + 2);
                self.leaf_comment(child);
                self.out.push('\n');
            }
        }
    }

    fn list(&mut self, items: &[Node], indent: usize) {
        for item in items {
            self.out.push_str(&" ".repeat(indent));
            self.out.push_str("- ");
            self.list_item(item, indent + 2);
        }
    }

    /// An item whose `- ` is already written; `indent` is the column after it.
    fn list_item(&mut self, item: &Node, indent: usize) {
        match &item.value {
            Value::Dict(d) if !d.is_empty() => {
                // First key on the dash line, the rest aligned under it.
                for (i, (key, child)) in d.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&" ".repeat(indent));
                    }
                    self.key(key);
                    self.value_after_key(child, indent);
                }
            }
            Value::List(inner) if !inner.is_empty() => {
                // A nested sequence starts on the same line: "- - a".
                for (i, n) in inner.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(&" ".repeat(indent));
                    }
                    self.out.push_str("- ");
                    self.list_item(n, indent + 2);
                }
            }
            _ => {
                let column = self.column();
                self.scalar(&item.value, column, indent);
                self.leaf_comment(item);
                self.out.push('\n');
            }
        }
    }

    fn scalar(&mut self, value: &Value, column: usize, indent: usize) {
        let text = match value {
            Value::Str(s) => string_scalar_text(s, BEST_WIDTH, column, indent),
            other => scalar_text(other),
        };
        self.out.push_str(&text);
    }
}

/// A non-string scalar as PyYAML writes it.
pub fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => if *b { "true" } else { "false" }.into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => yaml_float_text(*f),
        Value::Missing => "???".into(),
        Value::Str(s) => string_scalar_text(s, usize::MAX, 0, 0),
        Value::Dict(_) => "{}".into(),
        Value::List(_) => "[]".into(),
    }
}

/// PyYAML's float representer: `repr()` lower-cased, `.inf`/`.nan`, and a `.0` inserted before
/// an exponent that has no dot (`1e-05` → `1.0e-05`).
pub fn yaml_float_text(f: f64) -> String {
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            ".inf".into()
        } else {
            "-.inf".into()
        };
    }
    let r = python_float_repr(f).to_lowercase();
    if !r.contains('.') && r.contains('e') {
        r.replacen('e', ".0e", 1)
    } else {
        r
    }
}

/// What PyYAML's `analyze_scalar` finds out about a string.
struct ScalarAnalysis {
    allow_block_plain: bool,
    allow_single_quoted: bool,
}

fn is_break(c: char) -> bool {
    matches!(c, '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_printable(c: char) -> bool {
    // PyYAML with allow_unicode: printable ASCII, tab/newline handled separately, and the
    // printable Unicode ranges.
    matches!(c, '\x20'..='\x7e' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..='\u{10ffff}')
        && c != '\u{feff}'
}

fn analyze_scalar(s: &str) -> ScalarAnalysis {
    if s.is_empty() {
        return ScalarAnalysis {
            allow_block_plain: false,
            allow_single_quoted: true,
        };
    }
    let chars: Vec<char> = s.chars().collect();
    let mut block_indicators = s.starts_with("---") || s.starts_with("...");
    let (mut line_breaks, mut special) = (false, false);
    let (mut leading_space, mut leading_break) = (false, false);
    let (mut trailing_space, mut trailing_break) = (false, false);
    let (mut break_space, mut space_break) = (false, false);
    let (mut previous_space, mut previous_break) = (false, false);
    let mut preceded_by_whitespace = true;
    for (index, &ch) in chars.iter().enumerate() {
        let followed_by_whitespace = chars
            .get(index + 1)
            .is_none_or(|&n| n == ' ' || n == '\t' || is_break(n) || n == '\0');
        if index == 0 {
            if "#,[]{}&*!|>'\"%@`".contains(ch) {
                block_indicators = true;
            }
            if (ch == '?' || ch == ':' || ch == '-') && followed_by_whitespace {
                block_indicators = true;
            }
        } else if (ch == ':' && followed_by_whitespace) || (ch == '#' && preceded_by_whitespace) {
            block_indicators = true;
        }
        if is_break(ch) {
            line_breaks = true;
        }
        if !(ch == '\n' || ('\x20'..='\x7e').contains(&ch) || is_printable(ch)) {
            special = true;
        }
        if ch == ' ' {
            if index == 0 {
                leading_space = true;
            }
            if index == chars.len() - 1 {
                trailing_space = true;
            }
            if previous_break {
                break_space = true;
            }
            previous_space = true;
            previous_break = false;
        } else if is_break(ch) {
            if index == 0 {
                leading_break = true;
            }
            if index == chars.len() - 1 {
                trailing_break = true;
            }
            if previous_space {
                space_break = true;
            }
            previous_space = false;
            previous_break = true;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = ch == ' ' || ch == '\t' || is_break(ch) || ch == '\0';
    }
    let mut allow_block_plain = true;
    let mut allow_single_quoted = true;
    if leading_space || leading_break || trailing_space || trailing_break {
        allow_block_plain = false;
    }
    if space_break || special {
        allow_block_plain = false;
        allow_single_quoted = false;
    }
    if break_space {
        allow_block_plain = false;
        allow_single_quoted = false;
    }
    if line_breaks || block_indicators {
        allow_block_plain = false;
    }
    ScalarAnalysis {
        allow_block_plain,
        allow_single_quoted,
    }
}

/// Would PyYAML's dumper (YAML 1.1 resolvers, timestamps included) read this plain text back
/// as something other than a string, or does OmegaConf's representer force quotes on it
/// (strings that look like bools, ints or floats)?
fn needs_quotes_to_stay_string(s: &str) -> bool {
    if matches!(
        s,
        "y" | "Y" | "n" | "N" | "~" | "null" | "Null" | "NULL" | "<<" | "="
    ) || yaml11_bool(s).is_some()
    {
        return true;
    }
    if !matches!(plain_scalar(s), Value::Str(_) | Value::Missing) {
        return true;
    }
    looks_like_python_number(s) || is_yaml_timestamp(s)
}

/// Python's `int(s)` or `float(s)` would accept it.
fn looks_like_python_number(s: &str) -> bool {
    let t = s.trim();
    if t.is_empty() {
        return false;
    }
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), "inf" | "infinity" | "nan") {
        return true;
    }
    // Underscores are allowed between digits only.
    if body.starts_with('_') || body.ends_with('_') || body.contains("__") {
        return false;
    }
    let cleaned = body.replace('_', "");
    if cleaned.is_empty() {
        return false;
    }
    if cleaned.chars().all(|c| c.is_ascii_digit()) {
        return true;
    }
    let valid_chars = cleaned
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '+' | '-'));
    valid_chars && cleaned.chars().any(|c| c.is_ascii_digit()) && cleaned.parse::<f64>().is_ok()
}

/// YAML 1.1's timestamp pattern (PyYAML's resolver).
fn is_yaml_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .is_some_and(|x| x.iter().all(u8::is_ascii_digit))
    };
    if b.len() == 10
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
    {
        return true;
    }
    // yyyy-m?m-d?d(T|t|[ \t]+)h?h:mm:ss(.frac)?(tz)?
    if b.len() < 4 + 1 + 1 + 1 + 1 + 1 + 1 + 3 + 3 || !digits(0..4) || b[4] != b'-' {
        return false;
    }
    let rest = &s[5..];
    let mut parts = rest.splitn(2, '-');
    let (Some(month), Some(tail)) = (parts.next(), parts.next()) else {
        return false;
    };
    if !(1..=2).contains(&month.len()) || !month.bytes().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let day_len = tail.bytes().take_while(u8::is_ascii_digit).count();
    if !(1..=2).contains(&day_len) {
        return false;
    }
    let after = &tail[day_len..];
    let time = if let Some(t) = after.strip_prefix(['T', 't']) {
        t
    } else {
        let t = after.trim_start_matches([' ', '\t']);
        if t.len() == after.len() {
            return false;
        }
        t
    };
    let hour_len = time.bytes().take_while(u8::is_ascii_digit).count();
    if !(1..=2).contains(&hour_len) {
        return false;
    }
    let t = &time[hour_len..];
    let tb = t.as_bytes();
    tb.len() >= 6
        && tb[0] == b':'
        && tb[1..3].iter().all(u8::is_ascii_digit)
        && tb[3] == b':'
        && tb[4..6].iter().all(u8::is_ascii_digit)
}

/// A string scalar as PyYAML (with OmegaConf's str representer) writes it, starting at
/// `column`, folding at spaces past `width` with continuation lines at `indent`.
fn string_scalar_text(s: &str, width: usize, column: usize, indent: usize) -> String {
    let analysis = analyze_scalar(s);
    let force_quotes = needs_quotes_to_stay_string(s);
    if s == "???" || (!force_quotes && analysis.allow_block_plain) {
        return fold_plain(s, width, column, indent);
    }
    if analysis.allow_single_quoted {
        return single_quoted(s, width, column, indent);
    }
    double_quoted(s)
}

fn fold_plain(s: &str, width: usize, column: usize, indent: usize) -> String {
    let mut out = String::with_capacity(s.len());
    let mut col = column;
    let words = s.split(' ');
    let mut first = true;
    for word in words {
        if !first {
            // A single space where the line is already past the width becomes a line break.
            if col > width && !word.is_empty() {
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                col = indent;
            } else {
                out.push(' ');
                col += 1;
            }
        }
        first = false;
        out.push_str(word);
        col += word.chars().count();
    }
    out
}

fn single_quoted(s: &str, width: usize, column: usize, indent: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::from("'");
    let mut col = column + 1;
    let newline = |out: &mut String, col: &mut usize| {
        out.push('\n');
        out.push_str(&" ".repeat(indent));
        *col = indent;
    };
    let (mut spaces, mut breaks) = (false, false);
    let (mut start, mut end) = (0usize, 0usize);
    while end <= chars.len() {
        let ch = chars.get(end).copied();
        if spaces {
            if ch != Some(' ') {
                if start + 1 == end && col > width && start != 0 && end != chars.len() {
                    newline(&mut out, &mut col);
                } else {
                    let data: String = chars[start..end].iter().collect();
                    col += end - start;
                    out.push_str(&data);
                }
                start = end;
            }
        } else if breaks {
            if ch.is_none_or(|c| !is_break(c)) {
                if chars[start] == '\n' {
                    out.push('\n');
                }
                for _ in start..end {
                    out.push('\n');
                }
                out.push_str(&" ".repeat(indent));
                col = indent;
                start = end;
            }
        } else if ch.is_none_or(|c| c == ' ' || is_break(c) || c == '\'') && start < end {
            let data: String = chars[start..end].iter().collect();
            col += end - start;
            out.push_str(&data);
            start = end;
        }
        if ch == Some('\'') {
            out.push_str("''");
            col += 2;
            start = end + 1;
        }
        if let Some(c) = ch {
            spaces = c == ' ';
            breaks = is_break(c);
        }
        end += 1;
    }
    out.push('\'');
    out
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\x0b' => out.push_str("\\v"),
            '\x0c' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\x1b' => out.push_str("\\e"),
            '\u{85}' => out.push_str("\\N"),
            '\u{a0}' => out.push_str("\\_"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if is_printable(c) || c == ' ' => out.push(c),
            c if (c as u32) <= 0xff => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c if (c as u32) <= 0xffff => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08X}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Node {
        load_str(text, "test.yaml").unwrap()
    }

    #[test]
    fn yaml11_scalars() {
        let n = load(
            "a: yes\nb: off\nc: 1e-4\nd: .5\ne: 5.\nf: 1_000\ng: 0x1F\nh: 017\ni: ~\nj: '1'\nk: ???\nl: 1:30\nm: 2024-01-01\nn: .inf\no: -1.5e+3\np: 1.2.3\nq: '???'\nr: 08\n",
        );
        let get = |k: &str| n.child(k).unwrap().value.clone();
        assert_eq!(get("a"), Value::Bool(true));
        assert_eq!(get("b"), Value::Bool(false));
        assert_eq!(get("c"), Value::Float(1e-4));
        assert_eq!(get("d"), Value::Float(0.5));
        assert_eq!(get("e"), Value::Float(5.0));
        assert_eq!(get("f"), Value::Int(1000));
        assert_eq!(get("g"), Value::Int(31));
        assert_eq!(get("h"), Value::Int(15));
        assert_eq!(get("i"), Value::Null);
        assert_eq!(get("j"), Value::Str("1".into()));
        assert_eq!(get("k"), Value::Missing);
        assert_eq!(get("l"), Value::Int(90));
        assert_eq!(get("m"), Value::Str("2024-01-01".into()));
        assert_eq!(get("n"), Value::Float(f64::INFINITY));
        assert_eq!(get("o"), Value::Float(-1500.0));
        assert_eq!(get("p"), Value::Str("1.2.3".into()));
        assert_eq!(get("q"), Value::Missing);
        assert_eq!(get("r"), Value::Str("08".into()));
    }

    #[test]
    fn lines_are_recorded() {
        let n = load("a: 1\nb:\n  c: 2\n");
        let c = n.select("b.c").unwrap();
        assert_eq!(
            c.origin,
            Origin::File {
                path: "test.yaml".into(),
                line: 3
            }
        );
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let err = load_str("a: 1\na: 2\n", "dup.yaml").unwrap_err();
        assert!(err.to_string().contains("duplicate key 'a'"), "{err}");
        assert!(err.to_string().contains("dup.yaml:2"), "{err}");
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let err = load_str("a: [1, 2\nb: 3\n", "bad.yaml").unwrap_err();
        assert!(err.to_string().starts_with("bad.yaml:"), "{err}");
    }

    #[test]
    fn merge_keys_and_aliases() {
        let n = load("base: &b\n  x: 1\n  y: 2\nderived:\n  <<: *b\n  y: 3\n");
        assert_eq!(n.select("derived.x").unwrap().value, Value::Int(1));
        assert_eq!(n.select("derived.y").unwrap().value, Value::Int(3));
    }

    #[test]
    fn header_package() {
        let h = parse_header("# @package _global_\na: 1\n", "x").unwrap();
        assert_eq!(h.package.as_deref(), Some("_global_"));
        let h = parse_header("# comment\n# @package foo\n", "x").unwrap();
        assert_eq!(h.package, None);
    }

    #[test]
    fn emits_like_omegaconf() {
        let n = load(
            "a: 1\nb:\n  c: 'yes'\n  d: [1, 2]\n  e: []\nf: 1e-5\ng: '123'\nh: ${a}\ni: null\nj:\n- x: 1\n  y: 2\n- [3, 4]\nk: ''\n",
        );
        let text = to_yaml(&n, EmitOptions::default());
        assert_eq!(
            text,
            "a: 1\nb:\n  c: 'yes'\n  d:\n  - 1\n  - 2\n  e: []\nf: 1.0e-05\ng: '123'\nh: ${a}\ni: null\nj:\n- x: 1\n  'y': 2\n- - 3\n  - 4\nk: ''\n"
        );
    }

    fn json_to_node(v: &serde_json::Value) -> Node {
        use serde_json::Value as J;
        Node::from(match v {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) if !n.is_f64() => Value::Int(i),
                _ => Value::Float(n.as_f64().unwrap()),
            },
            J::String(s) if s == "???" => Value::Missing,
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::List(items.iter().map(json_to_node).collect()),
            J::Object(m) => match m.get("__float__").and_then(|f| f.as_str()) {
                Some(f) => Value::Float(match f {
                    "inf" => f64::INFINITY,
                    "-inf" => f64::NEG_INFINITY,
                    _ => f64::NAN,
                }),
                None => Value::Dict(
                    m.iter()
                        .map(|(k, v)| (k.clone(), json_to_node(v)))
                        .collect(),
                ),
            },
        })
    }

    #[test]
    fn emits_exactly_like_omegaconf_to_yaml() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/oracle/fixtures/yaml_emit.json"
        );
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut failures = Vec::new();
        for case in &cases {
            let node = json_to_node(&case["doc"]);
            let got = to_yaml(&node, EmitOptions::default());
            let want = case["yaml"].as_str().unwrap();
            if got != want {
                failures.push(format!("--- want\n{want}--- got\n{got}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn emitted_yaml_reads_back_to_the_same_tree() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/oracle/fixtures/yaml_emit.json"
        );
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for case in &cases {
            let node = json_to_node(&case["doc"]);
            let text = to_yaml(&node, EmitOptions::default());
            let back = load_str(&text, "roundtrip.yaml").unwrap();
            let same = match (&back.value, &node.value) {
                (Value::Dict(a), Value::Dict(b)) => a.len() == b.len(),
                _ => false,
            };
            assert!(same, "round trip changed the tree:\n{text}");
        }
    }
}
