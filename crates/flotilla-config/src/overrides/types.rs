//! The public types of a parsed override (Hydra's `hydra/core/override_parser/types.py`):
//! [`Override`], its [`OverrideValue`], the parsed [`Element`]s and [`Sweep`]s, the errors, and
//! the way values render back into override syntax (quoting and escaping included).

use crate::node::{python_float_repr, Dict, Node, Value};

/// What an override does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OverrideKind {
    /// `key=value`
    Change,
    /// `+key=value`
    Add,
    /// `++key=value`
    ForceAdd,
    /// `~key` or `~key=value`
    Delete,
}

/// One parsed command-line override (Hydra's `Override`).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub kind: OverrideKind,
    /// The config key or group as written: `trainer.lr`, `trainer/dist`, `db`.
    pub key_or_group: String,
    /// The package from `group@pkg=...`; `Some("")` for `group@=...`.
    pub package: Option<String>,
    /// The value; `None` only for `~key` without `=`.
    pub value: Option<OverrideValue>,
    /// The override text as given.
    pub input: String,
}

/// The part after `=`: a single element or a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum OverrideValue {
    Element(Element),
    Sweep(Sweep),
}

/// A parsed value (Hydra's `ParsedElementType`).
#[derive(Debug, Clone, PartialEq)]
pub enum Element {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// An unquoted string (escapes already removed); may hold `${...}` interpolations.
    Str(String),
    /// A quoted string: `text` is un-escaped, `quote` is `'` or `"`.
    Quoted {
        text: String,
        quote: char,
    },
    List(Vec<Element>),
    /// Insertion-ordered pairs. Keys that Hydra types are rendered as Hydra prints them:
    /// `1`, `1.5`, `True`, `null`.
    Dict(Vec<(String, Element)>),
}

/// A number in a `range` sweep: Python keeps ints and floats apart there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
}

/// A sweep (Hydra's `ChoiceSweep`, `RangeSweep`, `IntervalSweep` and `Glob`).
#[derive(Debug, Clone, PartialEq)]
pub enum Sweep {
    /// `a,b,c` (`simple_form`) or `choice(a,b,c)`.
    Choice {
        items: Vec<Element>,
        simple_form: bool,
        shuffle: bool,
        /// Sorted and de-duplicated (Hydra keeps a set).
        tags: Vec<String>,
    },
    /// `range(start, stop, step)`: Python's `range`, or Hydra's decimal float range.
    Range {
        start: Number,
        stop: Number,
        step: Number,
        shuffle: bool,
        tags: Vec<String>,
    },
    /// `interval(start, end)`: a continuous range, for optimizing sweepers only.
    Interval {
        start: f64,
        end: f64,
        tags: Vec<String>,
    },
    /// `glob(include, exclude)`: config-group options matching the `fnmatch` patterns.
    Glob {
        include: Vec<String>,
        exclude: Vec<String>,
    },
}

/// Why an override could not be parsed or expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// The text does not follow the override grammar. `column` counts characters from 0.
    #[error("Error parsing override '{input}': {message} at column {column}")]
    Syntax {
        input: String,
        message: String,
        column: usize,
    },
    /// A value is well-formed but cannot be evaluated (a grammar function rejected its
    /// arguments, an integer does not fit in 64 bits, ...). `column` is where it starts.
    #[error("Error parsing override '{input}': {message}")]
    Value {
        input: String,
        message: String,
        column: usize,
    },
    /// A parsed sweep cannot be enumerated.
    #[error("Error expanding sweep '{input}': {message}")]
    Sweep { input: String, message: String },
}

impl OverrideError {
    /// The override text that failed.
    pub fn input(&self) -> &str {
        match self {
            OverrideError::Syntax { input, .. }
            | OverrideError::Value { input, .. }
            | OverrideError::Sweep { input, .. } => input,
        }
    }

    /// What went wrong, without the override text.
    pub fn message(&self) -> &str {
        match self {
            OverrideError::Syntax { message, .. }
            | OverrideError::Value { message, .. }
            | OverrideError::Sweep { message, .. } => message,
        }
    }

    /// The 0-based character column the problem was found at, when there is one.
    pub fn column(&self) -> Option<usize> {
        match self {
            OverrideError::Syntax { column, .. } | OverrideError::Value { column, .. } => {
                Some(*column)
            }
            OverrideError::Sweep { .. } => None,
        }
    }
}

impl Override {
    /// Hydra's `get_key_element()`: `+a.b`, `++a`, `~a`, `db@pkg`.
    pub fn key_element(&self) -> String {
        let prefix = match self.kind {
            OverrideKind::Change => "",
            OverrideKind::Add => "+",
            OverrideKind::ForceAdd => "++",
            OverrideKind::Delete => "~",
        };
        match &self.package {
            Some(p) => format!("{prefix}{}@{p}", self.key_or_group),
            None => format!("{prefix}{}", self.key_or_group),
        }
    }

    /// Hydra's `get_value_element_as_str()`: `[1,2]`, `{a:1}`, `'quoted'`, `null` for a
    /// delete without value. Hydra refuses this for sweeps; here a sweep gives its text as
    /// written (see [`Override::raw_value_text`]).
    pub fn value_element_as_str(&self) -> String {
        match &self.value {
            None => "null".to_string(),
            Some(OverrideValue::Element(e)) => e.as_override_str(),
            Some(OverrideValue::Sweep(_)) => self.raw_value_text(),
        }
    }

    /// Hydra's `get_value_string()`: the input after the first `=`, verbatim (empty if none).
    pub fn raw_value_text(&self) -> String {
        match self.input.find('=') {
            Some(i) => self.input[i + 1..].to_string(),
            None => String::new(),
        }
    }

    /// The element, when the value is not a sweep.
    pub fn element(&self) -> Option<&Element> {
        match &self.value {
            Some(OverrideValue::Element(e)) => Some(e),
            _ => None,
        }
    }

    /// The sweep, when the value is one.
    pub fn sweep(&self) -> Option<&Sweep> {
        match &self.value {
            Some(OverrideValue::Sweep(s)) => Some(s),
            _ => None,
        }
    }

    pub fn is_sweep(&self) -> bool {
        self.sweep().is_some()
    }

    /// Choice, range and glob sweeps (those that can be enumerated).
    pub fn is_discrete_sweep(&self) -> bool {
        matches!(
            self.sweep(),
            Some(Sweep::Choice { .. } | Sweep::Range { .. } | Sweep::Glob { .. })
        )
    }

    pub fn is_choice_sweep(&self) -> bool {
        matches!(
            self.sweep(),
            Some(Sweep::Choice { .. } | Sweep::Glob { .. })
        )
    }

    pub fn is_range_sweep(&self) -> bool {
        matches!(self.sweep(), Some(Sweep::Range { .. }))
    }

    pub fn is_interval_sweep(&self) -> bool {
        matches!(self.sweep(), Some(Sweep::Interval { .. }))
    }

    pub fn is_delete(&self) -> bool {
        self.kind == OverrideKind::Delete
    }

    pub fn is_add(&self) -> bool {
        self.kind == OverrideKind::Add
    }

    pub fn is_force_add(&self) -> bool {
        self.kind == OverrideKind::ForceAdd
    }

    /// Hydra's `is_hydra_override()`: the key is under `hydra.` or `hydra/`.
    pub fn is_hydra_override(&self) -> bool {
        self.key_or_group.starts_with("hydra.") || self.key_or_group.starts_with("hydra/")
    }

    /// The value as Hydra/OmegaConf store it: quoted strings become plain strings, lists and
    /// dicts become containers. `None` for a delete without value and for sweeps.
    pub fn value(&self) -> Option<Value> {
        self.element().map(Element::to_value)
    }
}

impl Element {
    /// The config value (Hydra's `Override._convert_value`).
    pub fn to_value(&self) -> Value {
        match self {
            Element::Null => Value::Null,
            Element::Bool(b) => Value::Bool(*b),
            Element::Int(i) => Value::Int(*i),
            Element::Float(f) => Value::Float(*f),
            Element::Str(s) => Value::Str(s.clone()),
            Element::Quoted { text, .. } => Value::Str(text.clone()),
            Element::List(items) => {
                Value::List(items.iter().map(|e| Node::from(e.to_value())).collect())
            }
            Element::Dict(pairs) => {
                let mut d = Dict::new();
                for (k, v) in pairs {
                    d.insert(k.clone(), Node::from(v.to_value()));
                }
                Value::Dict(d)
            }
        }
    }

    /// Hydra's `_get_value_element_as_str()`: the element in override syntax, e.g. `[1,2]`,
    /// `{a:1}`, `'quoted'`, `a\ b`, `True`, `null`, `1e-05`.
    pub fn as_override_str(&self) -> String {
        let mut out = String::new();
        self.write_override_str(&mut out);
        out
    }

    fn write_override_str(&self, out: &mut String) {
        match self {
            Element::Null => out.push_str("null"),
            Element::Bool(true) => out.push_str("True"),
            Element::Bool(false) => out.push_str("False"),
            Element::Int(i) => out.push_str(&i.to_string()),
            Element::Float(f) => out.push_str(&python_float_repr(*f)),
            Element::Str(s) => out.push_str(&escape_special_characters(s)),
            Element::Quoted { text, quote } => out.push_str(&quote_string(text, *quote)),
            Element::List(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    item.write_override_str(out);
                }
                out.push(']');
            }
            Element::Dict(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&escape_special_characters(k));
                    out.push(':');
                    v.write_override_str(out);
                }
                out.push('}');
            }
        }
    }
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }

    /// Python's `str()` of the number.
    pub fn python_str(self) -> String {
        match self {
            Number::Int(i) => i.to_string(),
            Number::Float(f) => python_float_repr(f),
        }
    }
}

impl Sweep {
    /// The tags set with `tag(...)` (always empty for globs).
    pub fn tags(&self) -> &[String] {
        match self {
            Sweep::Choice { tags, .. }
            | Sweep::Range { tags, .. }
            | Sweep::Interval { tags, .. } => tags,
            Sweep::Glob { .. } => &[],
        }
    }
}

/// Hydra's `escape_special_characters`: a backslash before each of `\()[]{}:=, ` and tab.
pub fn escape_special_characters(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_escapable(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

pub(super) fn is_escapable(c: char) -> bool {
    matches!(
        c,
        '\\' | '(' | ')' | '[' | ']' | '{' | '}' | ':' | '=' | ',' | ' ' | '\t'
    )
}

/// Hydra's `QuotedString.with_quotes()`: `text` between `quote`s, with the quote escaped and
/// the backslashes that precede a quote (or the end) doubled.
pub fn quote_string(text: &str, quote: char) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let mut j = i;
            while j < chars.len() && chars[j] == '\\' {
                j += 1;
            }
            let run = j - i;
            if j == chars.len() {
                // Backslashes before the closing quote: double them.
                out.extend(std::iter::repeat_n('\\', 2 * run));
            } else if chars[j] == quote {
                out.extend(std::iter::repeat_n('\\', 2 * run + 1));
                out.push(quote);
                j += 1;
            } else {
                out.extend(std::iter::repeat_n('\\', run));
            }
            i = j;
        } else {
            if c == quote {
                out.push('\\');
            }
            out.push(c);
            i += 1;
        }
    }
    out.push(quote);
    out
}

/// Hydra's `_unescape_quoted_string`: the inside of a `QUOTED_VALUE` token (quotes included).
pub(super) fn unquote(token: &[char]) -> String {
    let quote = token[0];
    let inner = &token[1..token.len() - 1];
    let mut out = String::with_capacity(inner.len());
    let mut i = 0;
    while i < inner.len() {
        if inner[i] == '\\' {
            let mut j = i;
            while j < inner.len() && inner[j] == '\\' {
                j += 1;
            }
            let run = j - i;
            if j == inner.len() {
                // An even run before the closing quote: each pair is one backslash.
                out.extend(std::iter::repeat_n('\\', run / 2));
            } else if inner[j] == quote {
                // An odd run before an inner quote: pairs are backslashes, the last escapes.
                out.extend(std::iter::repeat_n('\\', run / 2));
                out.push(quote);
                j += 1;
            } else {
                out.extend(std::iter::repeat_n('\\', run));
            }
            i = j;
        } else {
            out.push(inner[i]);
            i += 1;
        }
    }
    out
}
