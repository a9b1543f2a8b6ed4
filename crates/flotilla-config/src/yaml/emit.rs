//! The emitter: a [`Node`] tree written as `OmegaConf.to_yaml` writes it (PyYAML's block
//! style, insertion order, long scalars folded at column 80, strings quoted when they would
//! otherwise read back as another type), optionally with each leaf's origin as a comment.

use super::scalars::{plain_scalar, yaml11_bool};
use crate::node::{python_float_repr, Dict, Node, Origin, Value};
use std::fmt::Write as _;

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
    use crate::yaml::load_str;

    fn load(text: &str) -> Node {
        load_str(text, "test.yaml").unwrap()
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
