//! The configuration tree: values, ordered dictionaries, lists, and where each value came from.
//!
//! A [`Node`] is what OmegaConf calls a node: a scalar, a list, a dictionary (insertion
//! ordered, like Python's dict), OmegaConf's `???` (missing), or a string that may hold
//! `${...}` interpolations resolved later. Every node carries an [`Origin`]: the file and line,
//! or the command-line override, that set it.

use indexmap::IndexMap;
use std::fmt;
use std::sync::Arc;

/// Insertion-ordered mapping from keys to nodes.
pub type Dict = IndexMap<String, Node>;

/// Where a value came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// Not known (created by the program, e.g. an empty intermediate dictionary).
    #[default]
    Unknown,
    /// A config file, with the 1-based line of the value when known.
    File { path: Arc<str>, line: u32 },
    /// A command-line (or sweep) override, verbatim.
    Override(Arc<str>),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Unknown => write!(f, "<unknown>"),
            Origin::File { path, line } if *line > 0 => write!(f, "{path}:{line}"),
            Origin::File { path, .. } => write!(f, "{path}"),
            Origin::Override(text) => write!(f, "override '{text}'"),
        }
    }
}

/// A configuration value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string; it is an interpolation when it contains `${`.
    Str(String),
    /// OmegaConf's mandatory-missing value `???`.
    Missing,
    List(Vec<Node>),
    Dict(Dict),
}

/// A value together with its origin.
#[derive(Clone, Debug)]
pub struct Node {
    pub value: Value,
    pub origin: Origin,
}

impl PartialEq for Node {
    /// Nodes compare by value; provenance does not take part in equality.
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl From<Value> for Node {
    fn from(value: Value) -> Self {
        Node {
            value,
            origin: Origin::Unknown,
        }
    }
}

impl Value {
    /// An empty dictionary.
    pub fn dict() -> Value {
        Value::Dict(Dict::new())
    }

    /// The name OmegaConf users know this kind of value by, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Missing => "missing (???)",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
        }
    }

    pub fn is_container(&self) -> bool {
        matches!(self, Value::List(_) | Value::Dict(_))
    }

    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    pub fn as_dict_mut(&mut self) -> Option<&mut Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// True when this is a string holding an (unescaped or escaped) interpolation marker.
    pub fn has_interpolation(&self) -> bool {
        matches!(self, Value::Str(s) if s.contains("${"))
    }
}

impl Node {
    pub fn new(value: Value, origin: Origin) -> Node {
        Node { value, origin }
    }

    /// An empty dictionary node with an unknown origin.
    pub fn empty_dict() -> Node {
        Node::from(Value::dict())
    }

    /// Sets `origin` on this node and every node below it.
    pub fn set_origin_deep(&mut self, origin: &Origin) {
        self.origin = origin.clone();
        match &mut self.value {
            Value::List(items) => items.iter_mut().for_each(|n| n.set_origin_deep(origin)),
            Value::Dict(d) => d.values_mut().for_each(|n| n.set_origin_deep(origin)),
            _ => {}
        }
    }

    /// The child reached by one key segment: a dictionary key, or a list index.
    pub fn child(&self, key: &str) -> Option<&Node> {
        match &self.value {
            Value::Dict(d) => d.get(key),
            Value::List(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        }
    }

    pub fn child_mut(&mut self, key: &str) -> Option<&mut Node> {
        match &mut self.value {
            Value::Dict(d) => d.get_mut(key),
            Value::List(items) => key.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
    }

    /// The node at a path of key segments, if every segment exists.
    pub fn get_path<S: AsRef<str>>(&self, path: &[S]) -> Option<&Node> {
        path.iter()
            .try_fold(self, |node, key| node.child(key.as_ref()))
    }

    pub fn get_path_mut<S: AsRef<str>>(&mut self, path: &[S]) -> Option<&mut Node> {
        path.iter()
            .try_fold(self, |node, key| node.child_mut(key.as_ref()))
    }

    /// The node at a dotted key (`a.b.0.c`; `a[0]` is accepted for list items).
    pub fn select(&self, dotted: &str) -> Option<&Node> {
        if dotted.is_empty() {
            return Some(self);
        }
        self.get_path(&split_key(dotted))
    }
}

/// Splits a dotted key into segments: `a.b[1].c` → `["a", "b", "1", "c"]`.
pub fn split_key(dotted: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in dotted.split('.') {
        let mut rest = part;
        if let Some(open) = rest.find('[') {
            out.push(rest[..open].to_string());
            rest = &rest[open..];
            while let Some(stripped) = rest.strip_prefix('[') {
                match stripped.find(']') {
                    Some(close) => {
                        out.push(stripped[..close].to_string());
                        rest = &stripped[close + 1..];
                    }
                    None => {
                        out.push(stripped.to_string());
                        rest = "";
                    }
                }
            }
            if !rest.is_empty() {
                out.push(rest.to_string());
            }
        } else {
            out.push(rest.to_string());
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// Formats a float as Python's `repr` does (shortest round-trip digits; exponent form below
/// 1e-4 and from 1e16), which is how OmegaConf renders floats inside strings.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Shortest round-trip digits and decimal exponent, from Rust's `{:e}` formatting.
    let sci = format!("{:e}", x);
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let body = if exp >= 0 {
            if n > exp + 1 {
                format!(
                    "{}.{}",
                    &digits[..(exp + 1) as usize],
                    &digits[(exp + 1) as usize..]
                )
            } else {
                format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
            }
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        };
        format!("{sign}{body}")
    } else {
        let mant = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits.clone()
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

/// The value of a `FLOAT` token of the override and interpolation grammars, which share
/// Python's float literals: `1_000.5`, `.5`, `5.`, `1e-3`, `-inf`, `NaN` (underscores between
/// digits, at most one sign, `inf` and `nan` in any case). The lexers produce nothing else;
/// other text gives NaN.
pub(crate) fn python_float_literal(text: &str) -> f64 {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    let (neg, body) = match cleaned.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, cleaned.strip_prefix('+').unwrap_or(&cleaned)),
    };
    let v = if body.eq_ignore_ascii_case("inf") {
        f64::INFINITY
    } else if body.eq_ignore_ascii_case("nan") {
        f64::NAN
    } else {
        // The lexers only produce valid Python float literals.
        body.parse::<f64>().unwrap_or(f64::NAN)
    };
    if neg {
        -v
    } else {
        v
    }
}

/// The value of an `INT` token of the override and interpolation grammars (`1_000`, `-5`,
/// `+3`), or `None` when it does not fit in an `i64` (Python would keep a big integer).
pub(crate) fn python_int_literal(text: &str) -> Option<i64> {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    cleaned.parse::<i64>().ok()
}

/// Renders a value as Python's `str()` would render the OmegaConf container holding it. This
/// is how values are spliced into string interpolations (`"lr=${lr}"` → `lr=0.001`).
pub fn python_str(value: &Value) -> String {
    match value {
        Value::Str(s) => s.clone(),
        other => python_repr(other),
    }
}

/// Python's `repr()` of a value (strings quoted), as used inside containers.
pub fn python_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => python_float_repr(*f),
        Value::Missing => "'???'".into(),
        Value::Str(s) => python_str_repr(s),
        Value::List(items) => {
            let parts: Vec<String> = items.iter().map(|n| python_repr(&n.value)).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Dict(d) => {
            let parts: Vec<String> = d
                .iter()
                .map(|(k, n)| format!("{}: {}", python_str_repr(k), python_repr(&n.value)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// Python's `repr()` of a string: single quotes unless the text holds a single quote and no
/// double quote.
pub fn python_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Converts to JSON (values as they stand; interpolations are not resolved here).
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value as J;
    match &node.value {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(J::Number)
            .unwrap_or_else(|| J::String(python_float_repr(*f))),
        Value::Str(s) => J::String(s.clone()),
        Value::Missing => J::String("???".into()),
        Value::List(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Dict(d) => J::Object(d.iter().map(|(k, n)| (k.clone(), to_json(n))).collect()),
    }
}

/// Writes a tree as JSON the way Python's `json.dumps` does for OmegaConf containers: floats
/// in `repr` form, and the non-finite floats as `NaN`, `Infinity`, `-Infinity` (which
/// `json.loads` reads back). With `indent`, one entry per line indented by that many spaces.
pub fn to_json_text(node: &Node, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(node, indent, 0, &mut out);
    out
}

fn write_json(node: &Node, indent: Option<usize>, depth: usize, out: &mut String) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(step) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(step * depth));
        }
    };
    let sep = if indent.is_some() { ": " } else { ":" };
    match &node.value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) if f.is_nan() => out.push_str("NaN"),
        Value::Float(f) if f.is_infinite() => {
            out.push_str(if *f > 0.0 { "Infinity" } else { "-Infinity" })
        }
        Value::Float(f) => out.push_str(&python_float_repr(*f)),
        Value::Str(s) => out.push_str(&serde_json::Value::String(s.clone()).to_string()),
        Value::Missing => out.push_str("\"???\""),
        Value::List(items) if items.is_empty() => out.push_str("[]"),
        Value::Dict(d) if d.is_empty() => out.push_str("{}"),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, v)) in d.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::Value::String(k.clone()).to_string());
                out.push_str(sep);
                write_json(v, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (3e-4, "0.0003"),
            (0.1, "0.1"),
            (5.0, "5.0"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
            (100.0, "100.0"),
            (0.30000000000000004, "0.30000000000000004"),
            (1e15, "1000000000000000.0"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "repr({x})");
        }
    }

    #[test]
    fn json_text_writes_non_finite_floats_as_python_does() {
        let mut d = Dict::new();
        d.insert("a".into(), Node::from(Value::Float(f64::INFINITY)));
        d.insert("b".into(), Node::from(Value::Float(f64::NAN)));
        d.insert("c".into(), Node::from(Value::Float(-f64::INFINITY)));
        d.insert("d".into(), Node::from(Value::Float(1e-5)));
        d.insert(
            "e".into(),
            Node::from(Value::List(vec![Node::from(Value::Int(1))])),
        );
        d.insert("f".into(), Node::from(Value::Str("q\"".into())));
        let node = Node::from(Value::Dict(d));
        assert_eq!(
            to_json_text(&node, None),
            r#"{"a":Infinity,"b":NaN,"c":-Infinity,"d":1e-05,"e":[1],"f":"q\""}"#
        );
        assert_eq!(
            to_json_text(&node, Some(2)).lines().nth(1),
            Some("  \"a\": Infinity,")
        );
    }

    #[test]
    fn split_key_handles_brackets() {
        assert_eq!(split_key("a.b[1].c"), vec!["a", "b", "1", "c"]);
        assert_eq!(split_key("a"), vec!["a"]);
        assert_eq!(split_key("a[0][1]"), vec!["a", "0", "1"]);
    }

    #[test]
    fn python_repr_of_containers() {
        let mut d = Dict::new();
        d.insert("a".into(), Node::from(Value::Int(1)));
        d.insert(
            "b".into(),
            Node::from(Value::List(vec![
                Node::from(Value::Str("x".into())),
                Node::from(Value::Bool(true)),
                Node::from(Value::Null),
            ])),
        );
        assert_eq!(
            python_str(&Value::Dict(d)),
            "{'a': 1, 'b': ['x', True, None]}"
        );
        assert_eq!(python_str_repr("it's"), "\"it's\"");
    }
}
