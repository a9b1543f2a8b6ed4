//! Python's behaviour where minijinja's differs, for what chat templates use: `str()` of a
//! value (`{{ x }}`, the `string` filter, what `trim` and `indent` read), `str.strip`,
//! `lstrip`, `rstrip`, `isspace` and `split()` with Python's whitespace, `str.splitlines` with
//! Python's line boundaries, and jinja2's `indent`; Python's `None` for `tools` and
//! `documents`, jinja2's tests and undefined-value filters, and Python's string methods where
//! pycompat's differ (the full list is in the parent module's documentation).

use std::fmt::Write as _;

use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};
use serde_json::Value as Json;

/// Python's `None` where transformers passes it to every template, as `tools` and
/// `documents` when there are none: false, `is none`, written `None` and `null` by
/// `tojson` like minijinja's none, but not iterable (minijinja iterates none as an empty
/// list, jinja2 raises `'NoneType' object is not iterable`), so a template that loops over
/// its tools unguarded fails as it does in transformers.
#[derive(Debug)]
struct PyNone;

impl minijinja::value::Object for PyNone {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }

    fn is_true(self: &std::sync::Arc<Self>) -> bool {
        false
    }

    fn render(self: &std::sync::Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

pub(super) fn none() -> Value {
    Value::from_object(PyNone)
}

/// The builtin filter `name` taking [`none()`] as an empty list, as jinja2's `select`,
/// `selectattr`, `reject`, `rejectattr` and `map` take any false value (`if value:` before
/// they iterate): `tools | selectattr(...)` is empty when there are no tools.
pub(super) fn none_as_empty(
    env: &mut minijinja::Environment<'static>,
    name: &'static str,
    builtin: Value,
) {
    env.add_filter(name, move |state: &State, args: Rest<Value>| {
        let mut args = args.0;
        if let Some(first) = args.first_mut() {
            if is_none(first) {
                *first = Value::from(());
            }
        }
        builtin.call(state, &args)
    });
}

/// The `none` test: minijinja's none or [`none()`].
pub(super) fn is_none(value: &Value) -> bool {
    value.is_none() || value.downcast_object_ref::<PyNone>().is_some()
}

/// Python's whitespace (`str.isspace`): Rust's, and the information separators
/// U+001C..U+001F.
pub(super) fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's line boundaries (`str.splitlines`).
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{0b}'
            | '\u{0c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// `s.splitlines(keepends)`.
pub(super) fn splitlines(s: &str, keepends: bool) -> Vec<&str> {
    let mut out = vec![];
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if is_line_break(c) {
            let mut end = i + c.len_utf8();
            if c == '\r' && chars.peek().is_some_and(|&(_, n)| n == '\n') {
                chars.next();
                end += 1;
            }
            out.push(if keepends {
                &s[start..end]
            } else {
                &s[start..i]
            });
            start = end;
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Python's `s.strip()` (what jinja2's `trim` filter does).
pub(crate) fn python_strip(s: &str) -> &str {
    strip(s, None, "strip")
}

/// `s.strip(chars)`, `lstrip` or `rstrip` (`which`).
fn strip<'a>(s: &'a str, chars: Option<&str>, which: &str) -> &'a str {
    let stripped = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_space(c),
    };
    match which {
        "lstrip" => s.trim_start_matches(stripped),
        "rstrip" => s.trim_end_matches(stripped),
        _ => s.trim_matches(stripped),
    }
}

/// `s.split(sep, maxsplit)`.
fn split(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Value, Error> {
    let limit = maxsplit.and_then(|n| usize::try_from(n).ok());
    let parts: Vec<&str> = match sep {
        Some("") => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "split: empty separator",
            ))
        }
        Some(sep) => match limit {
            Some(n) => s.splitn(n + 1, sep).collect(),
            None => s.split(sep).collect(),
        },
        None => {
            // Runs of whitespace separate; none at either end makes an empty part.
            let mut parts = vec![];
            let mut rest = s.trim_start_matches(is_space);
            while !rest.is_empty() {
                if limit == Some(parts.len()) {
                    parts.push(rest);
                    break;
                }
                let end = rest.find(is_space).unwrap_or(rest.len());
                parts.push(&rest[..end]);
                rest = rest[end..].trim_start_matches(is_space);
            }
            parts
        }
    };
    Ok(Value::from_iter(parts.into_iter().map(Value::from)))
}

/// `s.rsplit(sep, maxsplit)`: [`split`] from the right.
fn rsplit(s: &str, sep: Option<&str>, maxsplit: Option<i64>) -> Result<Value, Error> {
    let limit = maxsplit.and_then(|n| usize::try_from(n).ok());
    let mut parts: Vec<&str> = match sep {
        Some("") => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "rsplit: empty separator",
            ))
        }
        Some(sep) => match limit {
            Some(n) => s.rsplitn(n + 1, sep).collect(),
            None => s.rsplit(sep).collect(),
        },
        None => {
            let mut parts = vec![];
            let mut rest = s.trim_end_matches(is_space);
            while !rest.is_empty() {
                if limit == Some(parts.len()) {
                    parts.push(rest);
                    break;
                }
                let start = rest
                    .char_indices()
                    .rev()
                    .find(|&(_, c)| is_space(c))
                    .map_or(0, |(i, c)| i + c.len_utf8());
                parts.push(&rest[start..]);
                rest = rest[..start].trim_end_matches(is_space);
            }
            parts
        }
    };
    parts.reverse();
    Ok(Value::from_iter(parts.into_iter().map(Value::from)))
}

/// jinja2's `length` (and `count`): an undefined value has length 0.
pub(super) fn length_filter(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    minijinja::filters::length(value)
}

/// jinja2's `first`: undefined for an undefined value (it iterates as empty).
pub(super) fn first_filter(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::UNDEFINED);
    }
    minijinja::filters::first(value)
}

/// jinja2's `last`: undefined for an undefined value.
pub(super) fn last_filter(value: Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::UNDEFINED);
    }
    minijinja::filters::last(value)
}

/// jinja2's `number` test: `isinstance(value, Number)`, which booleans are.
pub(super) fn is_number(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Number | ValueKind::Bool)
}

/// jinja2's `sequence` test (it has a length and an index): strings, lists, dicts, and
/// undefined.
pub(super) fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Undefined
    )
}

/// jinja2's `iterable` test: `iter(value)` works, which it does not on None.
pub(super) fn is_iterable(value: &Value) -> bool {
    !is_none(value) && value.try_iter().is_ok()
}

/// The string methods whose Python meaning minijinja-contrib's pycompat does not give;
/// everything else goes to pycompat.
pub(super) fn method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match method {
            "strip" | "lstrip" | "rstrip" => {
                let (chars,): (Option<&str>,) = from_args(args)?;
                return Ok(Value::from(strip(s, chars, method)));
            }
            "isspace" => {
                let () = from_args(args)?;
                return Ok(Value::from(!s.is_empty() && s.chars().all(is_space)));
            }
            "split" | "rsplit" => {
                let (sep, maxsplit, kwargs): (Option<&str>, Option<i64>, Kwargs) = from_args(args)?;
                let sep = match sep {
                    Some(sep) => Some(sep),
                    None => kwargs.get::<Option<&str>>("sep")?,
                };
                let maxsplit = match maxsplit {
                    Some(n) => Some(n),
                    None => kwargs.get::<Option<i64>>("maxsplit")?,
                };
                kwargs.assert_all_used()?;
                return if method == "split" {
                    split(s, sep, maxsplit)
                } else {
                    rsplit(s, sep, maxsplit)
                };
            }
            "count" => {
                let (sub,): (&str,) = from_args(args)?;
                let n = if sub.is_empty() {
                    s.chars().count() + 1
                } else {
                    s.matches(sub).count()
                };
                return Ok(Value::from(n));
            }
            "find" | "rfind" => {
                // Python counts characters, not bytes.
                let (sub,): (&str,) = from_args(args)?;
                let at = if method == "find" {
                    s.find(sub)
                } else {
                    s.rfind(sub)
                };
                return Ok(Value::from(
                    at.map_or(-1, |b| s[..b].chars().count() as i64),
                ));
            }
            "join" => {
                // Python joins strings only.
                let (items,): (&Value,) = from_args(args)?;
                let mut parts = vec![];
                for item in items.try_iter()? {
                    match item.as_str() {
                        Some(part) => parts.push(part.to_string()),
                        None => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!(
                                    "sequence item {}: expected str instance, {} found",
                                    parts.len(),
                                    item.kind()
                                ),
                            ))
                        }
                    }
                }
                return Ok(Value::from(parts.join(s)));
            }
            "splitlines" => {
                let (keepends,): (Option<bool>,) = from_args(args)?;
                let lines = splitlines(s, keepends.unwrap_or(false));
                return Ok(Value::from_iter(lines.into_iter().map(Value::from)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `{{ value }}`: what jinja2 writes, `str(value)`.
pub(super) fn format(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let written = match value.as_str() {
        Some(s) => out.write_str(s),
        None => out.write_str(&str_of(value)),
    };
    written.map_err(|_| Error::from(ErrorKind::WriteFailure))
}

/// jinja2's `string` filter: `str(value)`.
pub(super) fn string_filter(value: &Value) -> Value {
    match value.as_str() {
        Some(_) => value.clone(),
        None => Value::from(str_of(value)),
    }
}

/// jinja2's `trim(value, chars=None)`: `str(value).strip(chars)`.
pub(super) fn trim_filter(value: &Value, chars: Option<String>) -> Value {
    let text = str_of(value);
    Value::from(strip(&text, chars.as_deref(), "strip"))
}

/// jinja2's `indent(s, width=4, first=False, blank=False)` (`width` may be a string, the
/// indentation itself): the lines of `str(s)` after the first (all with `first`) are
/// indented, blank lines only with `blank`; the lines are Python's (`splitlines`) and are
/// joined with `\n`.
pub(super) fn indent_filter(
    value: &Value,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => Some(w),
        None => kwargs.get::<Option<Value>>("width")?,
    };
    let first = match first {
        Some(f) => f,
        None => kwargs.get::<Option<bool>>("first")?.unwrap_or(false),
    };
    let blank = match blank {
        Some(b) => b,
        None => kwargs.get::<Option<bool>>("blank")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let indention = match &width {
        None => "    ".to_string(),
        Some(w) => match w.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = usize::try_from(w.clone())
                    .map_err(|_| Error::new(ErrorKind::InvalidOperation, "indent: bad width"))?;
                " ".repeat(n)
            }
        },
    };
    let mut text = str_of(value);
    text.push('\n');
    let lines = splitlines(&text, false);
    let mut out = String::new();
    if blank {
        out.push_str(&lines.join(&format!("\n{indention}")));
    } else {
        let mut lines = lines.into_iter();
        out.push_str(lines.next().unwrap_or_default());
        for line in lines {
            out.push('\n');
            if !line.is_empty() {
                out.push_str(&indention);
            }
            out.push_str(line);
        }
    }
    if first {
        out.insert_str(0, &indention);
    }
    Ok(Value::from(out))
}

/// Python's `str(value)` for the values a template sees: a string itself, `None`, `True`
/// and `False`, numbers as Python writes them, lists and dicts as their `repr`; undefined
/// is empty (jinja2's `Undefined`).
pub(super) fn str_of(value: &Value) -> String {
    match value.as_str() {
        Some(s) => s.to_string(),
        None if value.is_undefined() => String::new(),
        None => {
            let mut out = String::new();
            write_repr(value, &mut out);
            out
        }
    }
}

fn write_repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => match serde_json::to_value(value) {
            Ok(Json::Number(n)) if n.is_f64() => out.push_str(
                &flotilla_config::node::python_float_repr(n.as_f64().unwrap_or(f64::NAN)),
            ),
            _ => out.push_str(&value.to_string()),
        },
        ValueKind::String => write_str_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(&key, out);
                    out.push_str(": ");
                    write_repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr` of a string: in single quotes unless it holds a single quote and no
/// double one, with `\\`, `\n`, `\r`, `\t`, the quote and the characters Python does not
/// print escaped.
fn write_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
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
            c if !is_printable(c) => {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// The assigned characters Python's `str.isprintable` refuses (Unicode 14, Python 3.11):
/// controls (Cc), formats (Cf), private use (Co), and the separators (Zl, Zp, Zs) but the
/// space. (Python also escapes unassigned code points; they are written as they are here.)
const NOT_PRINTABLE: &[(u32, u32)] = &[
    (0x0, 0x1f),
    (0x7f, 0xa0),
    (0xad, 0xad),
    (0x600, 0x605),
    (0x61c, 0x61c),
    (0x6dd, 0x6dd),
    (0x70f, 0x70f),
    (0x890, 0x891),
    (0x8e2, 0x8e2),
    (0x1680, 0x1680),
    (0x180e, 0x180e),
    (0x2000, 0x200f),
    (0x2028, 0x202f),
    (0x205f, 0x2064),
    (0x2066, 0x206f),
    (0x3000, 0x3000),
    (0xe000, 0xf8ff),
    (0xfeff, 0xfeff),
    (0xfff9, 0xfffb),
    (0x110bd, 0x110bd),
    (0x110cd, 0x110cd),
    (0x13430, 0x13438),
    (0x1bca0, 0x1bca3),
    (0x1d173, 0x1d17a),
    (0xe0001, 0xe0001),
    (0xe0020, 0xe007f),
    (0xf0000, 0xffffd),
    (0x100000, 0x10fffd),
];

fn is_printable(c: char) -> bool {
    let n = c as u32;
    !NOT_PRINTABLE.iter().any(|&(a, b)| a <= n && n <= b)
}
