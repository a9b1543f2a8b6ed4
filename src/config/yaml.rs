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
        anchors: HashMap::new(),
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

struct Builder<'p> {
    file: Arc<str>,
    path: &'p str,
    anchors: HashMap<usize, Node>,
}

impl Builder<'_> {
    fn origin(&self, mark: Marker) -> Origin {
        Origin::File {
            path: self.file.clone(),
            line: mark.line() as u32,
        }
    }

    fn node(
        &mut self,
        ev: Event,
        mark: Marker,
        next: &mut impl FnMut() -> Result<(Event, Marker), YamlError>,
    ) -> Result<Node, YamlError> {
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let value = scalar_value(&text, style, tag.as_ref()).map_err(|message| {
                    YamlError::Other {
                        path: format!("{}:{}", self.path, mark.line()),
                        message,
                    }
                })?;
                let node = Node::new(value, self.origin(mark));
                if anchor > 0 {
                    self.anchors.insert(anchor, node.clone());
                }
                Ok(node)
            }
            Event::Alias(id) => self
                .anchors
                .get(&id)
                .cloned()
                .ok_or_else(|| YamlError::Syntax {
                    path: self.path.into(),
                    line: mark.line(),
                    col: mark.col() + 1,
                    message: "alias to an unknown anchor".into(),
                }),
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    let (ev, m) = next()?;
                    if ev == Event::SequenceEnd {
                        break;
                    }
                    items.push(self.node(ev, m, next)?);
                }
                let node = Node::new(Value::List(items), self.origin(mark));
                if anchor > 0 {
                    self.anchors.insert(anchor, node.clone());
                }
                Ok(node)
            }
            Event::MappingStart(anchor, _) => {
                let mut dict = Dict::new();
                let mut merged: Vec<Dict> = Vec::new();
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
                            Value::Dict(d) => merged.push(d),
                            Value::List(items) => {
                                for item in items {
                                    match item.value {
                                        Value::Dict(d) => merged.push(d),
                                        _ => return Err(self.merge_error(key_mark)),
                                    }
                                }
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
                // Keys given explicitly win over merged ones; earlier merge sources win over later.
                for source in merged {
                    for (k, v) in source {
                        dict.entry(k).or_insert(v);
                    }
                }
                let node = Node::new(Value::Dict(dict), self.origin(mark));
                if anchor > 0 {
                    self.anchors.insert(anchor, node.clone());
                }
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

/// Renders a tree as `OmegaConf.to_yaml` does (block style, insertion order).
pub fn to_yaml(node: &Node, opts: EmitOptions) -> String {
    let mut out = String::new();
    match &node.value {
        Value::Dict(d) if d.is_empty() => out.push_str("{}\n"),
        Value::List(l) if l.is_empty() => out.push_str("[]\n"),
        Value::Dict(d) => emit_dict(d, 0, opts, &mut out),
        Value::List(l) => emit_list(l, 0, opts, &mut out),
        _ => {
            out.push_str(&scalar_text(&node.value));
            out.push('\n');
        }
    }
    out
}

fn leaf_comment(node: &Node, opts: EmitOptions, out: &mut String) {
    if opts.provenance && node.origin != Origin::Unknown {
        let _ = write!(out, "  # {}", node.origin);
    }
}

fn emit_dict(d: &Dict, indent: usize, opts: EmitOptions, out: &mut String) {
    for (key, child) in d {
        out.push_str(&" ".repeat(indent));
        out.push_str(&key_scalar_text(key));
        out.push(':');
        emit_value_after_key(child, indent, opts, out);
    }
}

fn emit_value_after_key(child: &Node, indent: usize, opts: EmitOptions, out: &mut String) {
    match &child.value {
        Value::Dict(cd) if !cd.is_empty() => {
            out.push('\n');
            emit_dict(cd, indent + 2, opts, out);
        }
        Value::List(items) if !items.is_empty() => {
            // PyYAML does not indent block sequences inside mappings.
            out.push('\n');
            emit_list(items, indent, opts, out);
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar_text(&child.value));
            leaf_comment(child, opts, out);
            out.push('\n');
        }
    }
}

fn emit_list(items: &[Node], indent: usize, opts: EmitOptions, out: &mut String) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        match &item.value {
            Value::Dict(d) if !d.is_empty() => {
                // First key on the dash line, the rest aligned under it.
                let mut first = true;
                for (key, child) in d {
                    if !first {
                        out.push_str(&" ".repeat(indent + 2));
                    }
                    first = false;
                    out.push_str(&key_scalar_text(key));
                    out.push(':');
                    emit_value_after_key(child, indent + 2, opts, out);
                }
            }
            Value::List(inner) if !inner.is_empty() => {
                // Nested sequence starts on the same line: "- - a".
                let mut nested = String::new();
                emit_list(inner, indent + 2, opts, &mut nested);
                out.push_str(nested.trim_start());
            }
            _ => {
                out.push_str(&scalar_text(&item.value));
                leaf_comment(item, opts, out);
                out.push('\n');
            }
        }
    }
}

fn key_scalar_text(key: &str) -> String {
    string_scalar_text(key)
}

/// A scalar as PyYAML (with OmegaConf's representers) would write it.
pub fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => if *b { "true" } else { "false" }.into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => yaml_float_text(*f),
        Value::Missing => "???".into(),
        Value::Str(s) => string_scalar_text(s),
        Value::Dict(d) if d.is_empty() => "{}".into(),
        Value::List(l) if l.is_empty() => "[]".into(),
        Value::Dict(_) | Value::List(_) => unreachable!("containers are emitted in block style"),
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

fn string_scalar_text(s: &str) -> String {
    if plain_allowed(s) {
        return s.to_string();
    }
    if s.chars()
        .any(|c| c == '\n' || (c as u32) < 0x20 || c == '\u{7f}')
    {
        return double_quoted(s);
    }
    format!("'{}'", s.replace('\'', "''"))
}

fn plain_allowed(s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    // Would it read back as something other than the same string?
    match plain_scalar(s) {
        Value::Str(ref t) if t == s => {}
        Value::Missing if s == "???" => return true,
        _ => return false,
    }
    let first = s.chars().next().unwrap();
    let last = s.chars().last().unwrap();
    if first.is_whitespace() || last.is_whitespace() {
        return false;
    }
    if "#,[]{}&*!|>'\"%@`".contains(first) {
        return false;
    }
    if "-?:".contains(first) {
        let second = s.chars().nth(1);
        if second.is_none_or(|c| c.is_whitespace()) {
            return false;
        }
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    if s.contains(": ") || s.contains(" #") || s.ends_with(':') {
        return false;
    }
    !s.chars()
        .any(|c| c == '\n' || c == '\t' || (c as u32) < 0x20 || c == '\u{7f}' || c == '\u{feff}')
}

fn double_quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
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
            "a: 1\nb:\n  c: 'yes'\n  d:\n  - 1\n  - 2\n  e: []\nf: 1.0e-05\ng: '123'\nh: ${a}\ni: null\nj:\n- x: 1\n  y: 2\n- - 3\n  - 4\nk: ''\n"
        );
    }
}
