//! Reading typed values out of config nodes: the `FromNode` trait, reading a key or a field
//! (reporting `???`, missing keys and wrong types), dicts tagged by `mode`/`kind`, string
//! enums, the impls for scalars, options, lists and maps, and `Cx`, which collects every
//! problem found.

use super::messages::{
    alternatives, from_note, join, scalar_text, set_note, show, suggest, typo_note,
};
use super::{Problem, ProblemKind};
use crate::node::{Dict, Node, Origin, Value};
use indexmap::IndexMap;
use std::fmt;

/// A string-valued enum with a fixed list of spellings.
pub(super) trait Choice: Sized + Copy + 'static {
    const NAMES: &'static [&'static str];
    const ALL: &'static [Self];
    fn from_name(s: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| Self::ALL[i])
    }
}

/// Why a value could not be read.
pub(super) enum Fail {
    /// The value's type does not fit; the caller reports it with its own `expected()`.
    WrongType,
    /// The problem was already reported.
    Reported,
}

pub(super) type Parsed<T> = Result<T, Fail>;

/// Reading a typed value out of a node.
pub(super) trait FromNode: Sized {
    /// What the value should be, for "expected …" messages (`an integer`).
    fn expected() -> String;
    /// The same for a list of these values (`integers`).
    fn plural() -> String {
        format!("items that are each {}", Self::expected())
    }
    /// An example value, for messages about missing or `???` values.
    fn example() -> String {
        "...".into()
    }
    /// Reads a node that is not `???`.
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self>;
    /// The value of an absent key, or `None` when the key is required.
    fn absent() -> Option<Self> {
        None
    }
}

/// Reads `node` (at dotted `key`), reporting `???` and type mismatches.
pub(super) fn read<T: FromNode>(
    node: &Node,
    key: &str,
    example: Option<&str>,
    cx: &mut Cx,
) -> Option<T> {
    if matches!(node.value, Value::Missing) {
        let example = example.map(str::to_string).unwrap_or_else(T::example);
        let note = match &node.origin {
            Origin::Unknown => String::new(),
            o @ Origin::File { .. } => format!(" (left as ??? in {o})"),
            o @ Origin::Override(_) => format!(" (set to ??? by {o})"),
        };
        let message = format!("{key} is mandatory (???) — set it, e.g. {key}={example}{note}");
        cx.push(ProblemKind::Mandatory, key, &node.origin, message);
        return None;
    }
    match T::parse(node, key, cx) {
        Ok(v) => Some(v),
        Err(Fail::WrongType) => {
            cx.wrong_type(node, key, &T::expected());
            None
        }
        Err(Fail::Reported) => None,
    }
}

/// Reads the field `name` of the dict `parent_node` (at dotted `parent`).
pub(super) fn field<T: FromNode>(
    parent_node: &Node,
    dict: &Dict,
    parent: &str,
    name: &str,
    example: Option<&str>,
    cx: &mut Cx,
) -> Option<T> {
    let key = join(parent, name);
    if let Some(child) = dict.get(name) {
        return read::<T>(child, &key, example, cx);
    }
    if let Some(v) = T::absent() {
        return Some(v);
    }
    let example = example.map(str::to_string).unwrap_or_else(T::example);
    let message = format!(
        "{key} is missing{} — add it, e.g. +{key}={example}{}",
        from_note(&parent_node.origin),
        typo_note(dict, parent, name)
    );
    cx.push(ProblemKind::MissingKey, &key, &parent_node.origin, message);
    None
}

/// Reads a dict tagged by `tag` (`mode`, `kind`): the tag's value, the dict, and the keys the
/// chosen variant must not see (the tag, and keys reported as belonging to another variant).
pub(super) fn parse_tagged<'n, M: Choice + FromNode + fmt::Display>(
    node: &'n Node,
    key: &str,
    tag: &'static str,
    group: &str,
    keys_of: fn(M) -> &'static [&'static str],
    cx: &mut Cx,
) -> Result<(M, &'n Dict, Vec<&'n str>), Fail> {
    let Value::Dict(dict) = &node.value else {
        return Err(Fail::WrongType);
    };
    let Some(mode) = field::<M>(node, dict, key, tag, None, cx) else {
        // Without a variant, still flag keys that no variant knows.
        let mut all: Vec<&str> = vec![tag];
        for k in M::ALL.iter().flat_map(|m| keys_of(*m)) {
            if !all.contains(k) {
                all.push(k);
            }
        }
        cx.unknown_keys(dict, key, &all, &[]);
        return Err(Fail::Reported);
    };
    let own = keys_of(mode);
    let mut skip: Vec<&str> = vec![tag];
    for (k, child) in dict {
        if k == tag || own.contains(&k.as_str()) {
            continue;
        }
        let owners: Vec<String> = M::ALL
            .iter()
            .filter(|m| keys_of(**m).contains(&k.as_str()))
            .map(|m| m.to_string())
            .collect();
        if owners.is_empty() {
            continue; // reported as an unknown key by the variant
        }
        skip.push(k.as_str());
        let full = join(key, k);
        let tag_key = join(key, tag);
        let choices: Vec<String> = owners.iter().map(|o| format!("{group}={o}")).collect();
        let message = format!(
            "unknown key '{full}' for {tag_key}={mode}{}: it only applies when {tag_key} is {}; \
             select {}, or remove it",
            set_note(&child.origin),
            alternatives(&owners, false),
            alternatives(&choices, false),
        );
        cx.push(ProblemKind::UnknownKey, &full, &child.origin, message);
    }
    Ok((mode, dict, skip))
}

pub(super) fn parse_choice<C: Choice + FromNode>(node: &Node, key: &str, cx: &mut Cx) -> Parsed<C> {
    let given = match &node.value {
        Value::Str(s) => s.clone(),
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => scalar_text(&node.value),
        _ => return Err(Fail::WrongType),
    };
    if let Value::Str(s) = &node.value {
        if let Some(c) = C::from_name(s) {
            return Ok(c);
        }
    }
    let mut message = format!(
        "{key}: expected {}, got {}{}",
        C::expected(),
        show(&node.value),
        set_note(&node.origin)
    );
    let near = suggest(&given, C::NAMES);
    if !near.is_empty() {
        message.push_str(&format!("; did you mean {}?", alternatives(&near, true)));
    }
    cx.push(ProblemKind::BadChoice, key, &node.origin, message);
    Err(Fail::Reported)
}

impl FromNode for bool {
    fn expected() -> String {
        "a bool (true or false)".into()
    }
    fn plural() -> String {
        "bools".into()
    }
    fn example() -> String {
        "true".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Bool(b) => Ok(b),
            _ => Err(Fail::WrongType),
        }
    }
}

impl FromNode for i64 {
    fn expected() -> String {
        "an integer".into()
    }
    fn plural() -> String {
        "integers".into()
    }
    fn example() -> String {
        "1".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Int(i) => Ok(i),
            _ => Err(Fail::WrongType),
        }
    }
}

macro_rules! unsigned {
    ($($t:ty),+) => {$(
        impl FromNode for $t {
            fn expected() -> String {
                "an integer".into()
            }
            fn plural() -> String {
                "integers".into()
            }
            fn example() -> String {
                "1".into()
            }
            fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
                let Value::Int(i) = node.value else {
                    return Err(Fail::WrongType);
                };
                <$t>::try_from(i).map_err(|_| {
                    let message = format!(
                        "{key}: expected a non-negative integer, got {}{}; set it to 0 or more",
                        show(&node.value),
                        set_note(&node.origin)
                    );
                    cx.push(ProblemKind::Invalid, key, &node.origin, message);
                    Fail::Reported
                })
            }
        }
    )+};
}

unsigned!(u32, u64, usize);

impl FromNode for f64 {
    fn expected() -> String {
        "a number".into()
    }
    fn plural() -> String {
        "numbers".into()
    }
    fn example() -> String {
        "0.1".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Int(i) => Ok(i as f64),
            Value::Float(f) => Ok(f),
            _ => Err(Fail::WrongType),
        }
    }
}

impl FromNode for String {
    fn expected() -> String {
        "a string".into()
    }
    fn plural() -> String {
        "strings".into()
    }
    fn example() -> String {
        "...".into()
    }
    /// Numbers are taken as their text, as OmegaConf's string nodes do.
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(_) | Value::Float(_) => Ok(scalar_text(&node.value)),
            _ => Err(Fail::WrongType),
        }
    }
}

impl<T: FromNode> FromNode for Option<T> {
    fn expected() -> String {
        format!("{} or null", T::expected())
    }
    fn example() -> String {
        T::example()
    }
    /// Python's `None` written as a string gets a hint to write `null`.
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Null => Ok(None),
            Value::Str(s) if matches!(s.as_str(), "None" | "none" | "Null" | "NULL") => {
                let mut scratch = Cx::default();
                if let Ok(v) = T::parse(node, key, &mut scratch) {
                    return Ok(Some(v));
                }
                let message = format!(
                    "{key}: expected {}, got str '{s}'{}; write null for no value",
                    Self::expected(),
                    set_note(&node.origin)
                );
                cx.push(ProblemKind::BadChoice, key, &node.origin, message);
                Err(Fail::Reported)
            }
            _ => T::parse(node, key, cx).map(Some),
        }
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}

/// A list; a single non-list value is taken as a one-item list.
impl<T: FromNode> FromNode for Vec<T> {
    fn expected() -> String {
        format!("a list of {}", T::plural())
    }
    fn example() -> String {
        format!("[{}]", T::example())
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::List(items) => {
                let read: Vec<Option<T>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| read::<T>(item, &format!("{key}[{i}]"), None, cx))
                    .collect();
                read.into_iter()
                    .collect::<Option<Vec<T>>>()
                    .ok_or(Fail::Reported)
            }
            Value::Dict(_) | Value::Null => Err(Fail::WrongType),
            _ => T::parse(node, key, cx).map(|v| vec![v]),
        }
    }
}

impl FromNode for [f64; 2] {
    fn expected() -> String {
        "a list of 2 numbers".into()
    }
    fn example() -> String {
        "[0.9,0.95]".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::List(items) if items.len() == 2 => {
                let a = read::<f64>(&items[0], &format!("{key}[0]"), None, cx);
                let b = read::<f64>(&items[1], &format!("{key}[1]"), None, cx);
                Ok([a.ok_or(Fail::Reported)?, b.ok_or(Fail::Reported)?])
            }
            _ => Err(Fail::WrongType),
        }
    }
}

impl<T: FromNode> FromNode for IndexMap<String, T> {
    fn expected() -> String {
        format!("a dict of {}", T::plural())
    }
    fn example() -> String {
        "{}".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let Value::Dict(dict) = &node.value else {
            return Err(Fail::WrongType);
        };
        let mut out = IndexMap::new();
        let mut ok = true;
        for (k, child) in dict {
            match read::<T>(child, &join(key, k), None, cx) {
                Some(v) => {
                    out.insert(k.clone(), v);
                }
                None => ok = false,
            }
        }
        if ok {
            Ok(out)
        } else {
            Err(Fail::Reported)
        }
    }
}

/// A scalar (for `compute.additional_parameters`).
impl FromNode for serde_json::Value {
    fn expected() -> String {
        "a scalar (string, number, bool or null)".into()
    }
    fn plural() -> String {
        "scalars (strings, numbers, bools or nulls)".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Str(_) => {
                Ok(crate::node::to_json(node))
            }
            _ => Err(Fail::WrongType),
        }
    }
}

#[derive(Default)]
pub(super) struct Cx {
    pub(super) problems: Vec<Problem>,
}

impl Cx {
    pub(super) fn push(&mut self, kind: ProblemKind, key: &str, origin: &Origin, message: String) {
        self.problems.push(Problem {
            kind,
            key: key.to_string(),
            origin: origin.clone(),
            message,
        });
    }

    fn wrong_type(&mut self, node: &Node, key: &str, expected: &str) {
        let message = format!(
            "{key}: expected {expected}, got {}{}",
            show(&node.value),
            set_note(&node.origin)
        );
        self.push(ProblemKind::WrongType, key, &node.origin, message);
    }

    /// Reports the keys of `dict` (at dotted `parent`) outside `known` and `skip`.
    pub(super) fn unknown_keys(
        &mut self,
        dict: &Dict,
        parent: &str,
        known: &[&str],
        skip: &[&str],
    ) {
        for (k, child) in dict {
            if known.contains(&k.as_str()) || skip.contains(&k.as_str()) {
                continue;
            }
            let key = join(parent, k);
            let near: Vec<String> = suggest(k, known)
                .into_iter()
                .map(|c| join(parent, c))
                .collect();
            let hint = if !near.is_empty() {
                format!("did you mean {}?", alternatives(&near, true))
            } else if known.is_empty() {
                format!("'{parent}' takes no other keys here; remove it")
            } else {
                format!("remove it ('{parent}' accepts {})", known.join(", "))
            };
            let message = format!("unknown key '{key}'{}; {hint}", set_note(&child.origin));
            self.push(ProblemKind::UnknownKey, &key, &child.origin, message);
        }
    }
}
