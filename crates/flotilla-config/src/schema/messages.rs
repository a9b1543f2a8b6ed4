//! How problems are worded: dotted keys, notes on where a value was set, values shown with
//! their type, lists of alternatives, and near-miss suggestions for misspelt keys and values.

use crate::node::{python_repr, Dict, Origin, Value};

pub(super) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// ` (set in file:line)`, ` (set by override '…')`, or nothing when unknown.
pub(super) fn set_note(origin: &Origin) -> String {
    match origin {
        Origin::Unknown => String::new(),
        o @ Origin::File { .. } => format!(" (set in {o})"),
        o @ Origin::Override(_) => format!(" (set by {o})"),
    }
}

/// ` (in the dict from file:line)` for a missing key's parent, or nothing.
pub(super) fn from_note(origin: &Origin) -> String {
    match origin {
        Origin::Unknown => String::new(),
        o @ Origin::File { .. } => format!(" (in the dict from {o})"),
        o @ Origin::Override(_) => format!(" (in the dict set by {o})"),
    }
}

/// ` (is 'trainer.lrr' a misspelling? set in …)` when a sibling of a missing key looks like it.
pub(super) fn typo_note(dict: &Dict, parent: &str, name: &str) -> String {
    dict.iter()
        .find(|(k, _)| k.as_str() != name && !near_miss(k, &[name]).is_empty())
        .map(|(k, n)| {
            format!(
                "; is '{}'{} a misspelling of it?",
                join(parent, k),
                set_note(&n.origin)
            )
        })
        .unwrap_or_default()
}

/// The text of a scalar as a user would type it.
pub(super) fn scalar_text(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => s.clone(),
        other => python_repr(other),
    }
}

/// `str 'ten'`, `int 5`, `null`, `list [1, 2]`: a value with its type, for messages.
pub(super) fn show(v: &Value) -> String {
    const MAX: usize = 60;
    let text = match v {
        Value::Null => return "null".into(),
        Value::Bool(b) => b.to_string(),
        other => python_repr(other),
    };
    let text = if text.chars().count() > MAX {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    } else {
        text
    };
    format!("{} {text}", v.type_name())
}

/// `'a', 'b', 'c'`.
pub(super) fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a`, `a or b`, `a, b or c` (quoted when asked).
pub(super) fn alternatives<S: AsRef<str>>(items: &[S], quote: bool) -> String {
    let q: Vec<String> = items
        .iter()
        .map(|s| {
            if quote {
                format!("'{}'", s.as_ref())
            } else {
                s.as_ref().to_string()
            }
        })
        .collect();
    match q.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Candidates close to `given`: a case-insensitive match, else the nearest by edit distance
/// ([`near_miss`]), else those it starts, or that share a run of `_`/`-` separated words with it
/// (`batch_size` → `global_batch_size`). At most three.
pub(super) fn suggest<'a>(given: &str, candidates: &[&'a str]) -> Vec<&'a str> {
    let mut near = near_miss(given, candidates);
    if near.is_empty() && given.chars().count() >= 2 {
        let g = given.to_lowercase();
        near = candidates
            .iter()
            .filter(|c| {
                let c = c.to_lowercase();
                c.starts_with(&g) || contains_words(&c, &g) || contains_words(&g, &c)
            })
            .copied()
            .collect();
    }
    near.truncate(3);
    near
}

/// Candidates within a small edit distance of `given` (Damerau-Levenshtein: a swap of two
/// neighbours counts once; at most a third of the length, at least 1;
/// case-insensitive), the nearest ones only.
fn near_miss<'a>(given: &str, candidates: &[&'a str]) -> Vec<&'a str> {
    let g = given.to_lowercase();
    if let Some(c) = candidates.iter().find(|c| c.to_lowercase() == g) {
        return vec![c];
    }
    let mut best = usize::MAX;
    let mut near = Vec::new();
    for c in candidates {
        let cl = c.to_lowercase();
        let d = strsim::damerau_levenshtein(&g, &cl);
        let limit = (g.chars().count().max(cl.chars().count()) / 3).max(1);
        if d > limit || d > best {
            continue;
        }
        if d < best {
            best = d;
            near.clear();
        }
        near.push(*c);
    }
    near
}

/// True when the `_`/`-` separated words of `needle` occur, in a row, among those of `haystack`.
fn contains_words(haystack: &str, needle: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(['_', '-'])
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (h, n) = (words(haystack), words(needle));
    !n.is_empty() && n.len() < h.len() && h.windows(n.len()).any(|w| w == n.as_slice())
}
