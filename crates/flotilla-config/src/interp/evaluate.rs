//! Resolution: the evaluator that walks a tree and evaluates its interpolations the way
//! OmegaConf does (key selection, relative keys, typed values for a lone interpolation and
//! Python `str()` pieces otherwise), with memoization, cycle detection, depth limits, errors
//! attributed to the node holding the interpolation, and near-miss key suggestions.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use super::grammar::{
    parse_template, push_key_piece, split_key, Element, Interp, InterpKind, KeyItem, KeyPart,
    KeyPath, Part, Template,
};
use super::{InterpError, InterpErrorKind, ResolveContext};
use crate::node::{python_repr, python_str, Dict, Node, Origin, Value};

/// Deepest chain of interpolation strings evaluated inside one another (OmegaConf itself
/// stops at Python's recursion limit, after 60–80 chained interpolations).
const MAX_EVAL_DEPTH: usize = 64;
/// Deepest nesting of `${...}` evaluations (chained or nested in one string), counted
/// together so that their stack use stays bounded.
const MAX_NEST: usize = 64;
/// Deepest nesting of containers walked while building the resolved tree (OmegaConf stops
/// near 100).
const MAX_TREE_DEPTH: usize = 128;
/// Parsed strings kept per thread (sweeps resolve the same strings again and again).
const TEMPLATE_CACHE_SIZE: usize = 4096;

/// A small multiplicative hasher (FxHash) for the module's own maps, keyed by node
/// addresses and short strings; SipHash's DoS resistance buys nothing here.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        // The multiply leaves the low bits of aligned addresses poor; hash tables index by
        // them, so fold the high bits in.
        self.0 ^ (self.0 >> 29)
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

thread_local! {
    static TEMPLATES: RefCell<FastMap<String, Rc<Template>>> = RefCell::new(FastMap::default());
}

fn cached_template(text: &str) -> Result<Rc<Template>, String> {
    if let Some(t) = TEMPLATES.with(|c| c.borrow().get(text).cloned()) {
        return Ok(t);
    }
    let tpl = Rc::new(parse_template(text)?);
    TEMPLATES.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() >= TEMPLATE_CACHE_SIZE {
            cache.clear();
        }
        cache.insert(text.to_string(), tpl.clone());
    });
    Ok(tpl)
}

/// One step of a path from the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Seg<'t> {
    Key(&'t str),
    Idx(usize),
}

/// Full key as OmegaConf prints it: `a.b[0].c`.
pub(super) fn render_path(path: &[Seg<'_>]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Idx(i) => {
                let _ = write!(s, "[{i}]");
            }
        }
    }
    s
}

/// A container in the tree, with its path from the root.
#[derive(Clone, Debug)]
pub(super) struct Loc<'t> {
    path: Rc<[Seg<'t>]>,
    pub(super) node: &'t Node,
}

/// The value of an interpolation before it is written into the resolved tree.
#[derive(Clone, Debug)]
pub(super) enum Val<'t> {
    /// A scalar (`Missing` only from selections that tolerate it).
    Prim(Value),
    /// A dictionary or list of the tree, resolved in place when materialized.
    Tree(Loc<'t>),
    /// A dictionary or list made by a resolver, already resolved. The flag is set for an
    /// OmegaConf config (`oc.create`, `oc.dict.keys`), which later keys may walk into.
    Owned(Rc<Node>, bool),
    /// `oc.dict.values`: a list of `${key.k}` interpolations, resolved only when used.
    Values(Rc<LazyValues<'t>>),
}

/// What `oc.dict.values` returns: OmegaConf builds a list of interpolations to the
/// dictionary's entries, which print raw and resolve when the list is resolved.
#[derive(Debug)]
pub(super) struct LazyValues<'t> {
    /// The container holding the interpolation (the resolver's `_parent_`).
    pub(super) base: Rc<[Seg<'t>]>,
    /// The key the resolver was given.
    pub(super) key: String,
    /// The dictionary's keys.
    pub(super) keys: Vec<String>,
}

impl LazyValues<'_> {
    /// The list as OmegaConf prints it: `['${x.a}', '${x.b}']` (one more dot when relative).
    fn raw(&self) -> Value {
        let dot = if self.key.starts_with('.') { "." } else { "" };
        Value::List(
            self.keys
                .iter()
                .map(|k| Node::from(Value::Str(format!("${{{dot}{}.{k}}}", self.key))))
                .collect(),
        )
    }
}

/// Where a selection walk stands: a node of the tree (its path is kept alongside), or a
/// container made by a resolver.
enum Cursor<'t> {
    Tree(&'t Node),
    Owned(Rc<Node>),
}

/// A key segment, whether split from text or taken from a parsed key.
trait SegText {
    fn seg_text(&self) -> &str;
}

impl SegText for &str {
    fn seg_text(&self) -> &str {
        self
    }
}

impl SegText for KeyItem {
    fn seg_text(&self) -> &str {
        match &self.key {
            KeyPart::Name(n) => n,
            KeyPart::Interp(_) => "",
        }
    }
}

/// The outcome of selecting a key.
pub(super) enum Sel<'t> {
    Found(Val<'t>),
    Missing,
    NotFound(String),
    NotContainer(InterpErrorKind),
}

/// An error while evaluating: not yet tied to a node, or complete.
#[derive(Debug)]
pub(super) enum Fail {
    Kind(InterpErrorKind),
    Full(Box<InterpError>),
}

pub(super) type R<T> = Result<T, Fail>;

impl From<InterpErrorKind> for Fail {
    fn from(kind: InterpErrorKind) -> Self {
        Fail::Kind(kind)
    }
}

impl Fail {
    pub(super) fn into_error(self, root: &Node) -> InterpError {
        match self {
            Fail::Full(e) => *e,
            Fail::Kind(kind) => InterpError {
                key: String::new(),
                text: String::new(),
                origin: root.origin.clone(),
                kind: Box::new(kind),
                via: Vec::new(),
            },
        }
    }
}

pub(super) struct Evaluator<'t> {
    pub(super) root: &'t Node,
    pub(super) ctx: &'t ResolveContext,
    /// Resolved value of every interpolation string evaluated so far, by node address.
    memo: FastMap<*const Node, Val<'t>>,
    /// Interpolation strings being evaluated (for cycles), innermost last.
    active: Vec<*const Node>,
    /// Containers (and `oc.dict.values` lists) being materialized, by address: one that
    /// would contain itself is a cycle.
    building: Vec<*const ()>,
    /// Nesting of interpolations inside one string (and `oc.decode` inside it).
    nest: usize,
    /// Spare path buffers for selections (they nest, so one is not enough).
    spare_paths: Vec<Vec<Seg<'t>>>,
}

impl<'t> Evaluator<'t> {
    pub(super) fn new(root: &'t Node, ctx: &'t ResolveContext) -> Self {
        Evaluator {
            root,
            ctx,
            memo: FastMap::with_capacity_and_hasher(64, Default::default()),
            active: Vec::new(),
            building: Vec::new(),
            nest: 0,
            spare_paths: Vec::new(),
        }
    }

    /// Clears what an aborted evaluation may leave on the stacks (the memo stays valid).
    pub(super) fn reset(&mut self) {
        self.active.clear();
        self.building.clear();
        self.nest = 0;
    }

    fn node_at(&self, path: &[Seg<'t>]) -> &'t Node {
        let mut node = self.root;
        for seg in path {
            let next = match (seg, &node.value) {
                (Seg::Key(k), Value::Dict(d)) => d.get(*k),
                (Seg::Idx(i), Value::List(items)) => items.get(*i),
                _ => None,
            };
            // Paths are only ever built from the tree itself.
            node = next.expect("path from the tree");
        }
        node
    }

    fn error_at(&self, path: &[Seg<'t>], node: &Node, text: &str, kind: InterpErrorKind) -> Fail {
        Fail::Full(Box::new(InterpError {
            key: render_path(path),
            text: text.to_string(),
            origin: node.origin.clone(),
            kind: Box::new(kind),
            via: Vec::new(),
        }))
    }

    /// Ties an error to the node whose string was being resolved (or records that node as
    /// one that needed the failing one).
    fn attribute(&self, fail: Fail, path: &[Seg<'t>], node: &Node, text: &str) -> Fail {
        match fail {
            Fail::Kind(kind) => self.error_at(path, node, text, kind),
            Fail::Full(mut e) => {
                let key = render_path(path);
                if e.key != key
                    && e.via.last() != Some(&key)
                    && !matches!(*e.kind, InterpErrorKind::Cycle(_))
                {
                    e.via.push(key);
                }
                Fail::Full(e)
            }
        }
    }

    /// The resolved copy of `node` (at `path`), every interpolation below it resolved.
    pub(super) fn resolved_copy(&mut self, path: &mut Vec<Seg<'t>>, node: &'t Node) -> R<Node> {
        match &node.value {
            Value::Str(s) if s.contains("${") => {
                let v = self.eval_node(path, node, s)?;
                self.materialize(v, &node.origin)
                    .map_err(|f| self.attribute(f, path, node, s))
            }
            Value::Dict(_) | Value::List(_) => {
                // Cloning keeps the dictionaries' hash tables (no re-hashing of keys); the
                // interpolations are then replaced in place. Cloning recurses, so the depth is
                // checked first.
                check_depth(node)?;
                let mut out = node.clone();
                self.patch(path, node, &mut out)?;
                Ok(out)
            }
            _ => Ok(node.clone()),
        }
    }

    /// Replaces, in `out` (a copy of the container `node`), every interpolation below
    /// `node` by its resolved value.
    fn patch(&mut self, path: &mut Vec<Seg<'t>>, node: &'t Node, out: &mut Node) -> R<()> {
        self.enter_container(path, node)?;
        let r = self.patch_children(path, node, out);
        self.building.pop();
        r
    }

    fn patch_children(&mut self, path: &mut Vec<Seg<'t>>, node: &'t Node, out: &mut Node) -> R<()> {
        match (&node.value, &mut out.value) {
            (Value::Dict(d), Value::Dict(od)) => {
                for ((k, child), slot) in d.iter().zip(od.values_mut()) {
                    path.push(Seg::Key(k));
                    let r = self.patch_child(path, child, slot);
                    path.pop();
                    r?;
                }
            }
            (Value::List(items), Value::List(oi)) => {
                for (i, (child, slot)) in items.iter().zip(oi.iter_mut()).enumerate() {
                    path.push(Seg::Idx(i));
                    let r = self.patch_child(path, child, slot);
                    path.pop();
                    r?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn patch_child(&mut self, path: &mut Vec<Seg<'t>>, child: &'t Node, slot: &mut Node) -> R<()> {
        match &child.value {
            Value::Str(s) if s.contains("${") => {
                let v = self.eval_node(path, child, s)?;
                *slot = self
                    .materialize(v, &child.origin)
                    .map_err(|f| self.attribute(f, path, child, s))?;
                Ok(())
            }
            Value::Dict(_) | Value::List(_) => self.patch(path, child, slot),
            _ => Ok(()),
        }
    }

    fn enter_container(&mut self, path: &[Seg<'t>], node: &'t Node) -> R<()> {
        self.enter_building((node as *const Node).cast(), || render_path(path))
    }

    fn enter_building(&mut self, ptr: *const (), key: impl FnOnce() -> String) -> R<()> {
        if self.building.contains(&ptr) {
            return Err(InterpErrorKind::SelfContaining { key: key() }.into());
        }
        if self.building.len() >= MAX_TREE_DEPTH {
            return Err(InterpErrorKind::TooDeep(MAX_TREE_DEPTH).into());
        }
        self.building.push(ptr);
        Ok(())
    }

    /// Writes a value into the resolved tree with the origin of the node that held the
    /// interpolation.
    pub(super) fn materialize(&mut self, v: Val<'t>, origin: &Origin) -> R<Node> {
        match v {
            Val::Prim(value) => Ok(Node::new(value, origin.clone())),
            Val::Tree(loc) => {
                let mut path = loc.path.to_vec();
                let mut n = self.resolved_copy(&mut path, loc.node)?;
                n.origin = origin.clone();
                Ok(n)
            }
            Val::Owned(n, _) => {
                let mut n = Rc::unwrap_or_clone(n);
                n.set_origin_deep(origin);
                Ok(n)
            }
            Val::Values(lazy) => {
                self.enter_building(Rc::as_ptr(&lazy).cast(), || {
                    format!("${{oc.dict.values:{}}}", lazy.key)
                })?;
                let r = self.materialize_values(&lazy, origin);
                self.building.pop();
                r
            }
        }
    }

    fn materialize_values(&mut self, lazy: &LazyValues<'t>, origin: &Origin) -> R<Node> {
        let mut items = Vec::with_capacity(lazy.keys.len());
        for k in &lazy.keys {
            let v = self.dict_value(lazy, k)?;
            items.push(self.materialize(v, origin)?);
        }
        Ok(Node::new(Value::List(items), origin.clone()))
    }

    /// One entry of an `oc.dict.values` list: the interpolation `${key.k}`.
    fn dict_value(&mut self, lazy: &LazyValues<'t>, k: &str) -> R<Val<'t>> {
        let key = format!("{}.{k}", lazy.key);
        match self.select(&lazy.base, &key, true)? {
            Sel::Found(v) => {
                if let Val::Tree(loc) = &v {
                    if lazy.base.starts_with(&loc.path) {
                        return Err(InterpErrorKind::ToParent {
                            key: render_path(&loc.path),
                        }
                        .into());
                    }
                }
                Ok(v)
            }
            Sel::Missing => Err(InterpErrorKind::MissingValue { key }.into()),
            Sel::NotFound(absolute) => Err(InterpErrorKind::KeyNotFound {
                suggestion: suggest_key(self.root, &absolute),
                key,
            }
            .into()),
            Sel::NotContainer(kind) => Err(kind.into()),
        }
    }

    /// The value of a node of the tree as an interpolation sees it.
    fn value_at(&mut self, path: &[Seg<'t>], node: &'t Node) -> R<Val<'t>> {
        match &node.value {
            Value::Str(s) if s.contains("${") => self.eval_node(path, node, s),
            Value::Dict(_) | Value::List(_) => Ok(Val::Tree(Loc {
                path: Rc::from(path),
                node,
            })),
            other => Ok(Val::Prim(other.clone())),
        }
    }

    /// Evaluates the interpolation string held by `node` (memoized; cycles are errors).
    fn eval_node(&mut self, path: &[Seg<'t>], node: &'t Node, s: &str) -> R<Val<'t>> {
        let ptr = node as *const Node;
        if let Some(v) = self.memo.get(&ptr) {
            return Ok(v.clone());
        }
        if let Some(i) = self.active.iter().position(|p| *p == ptr) {
            let mut cycle: Vec<String> = self.active[i..]
                .iter()
                .map(|p| path_of(self.root, *p).unwrap_or_else(|| "?".to_string()))
                .collect();
            cycle.push(render_path(path));
            return Err(self.error_at(path, node, s, InterpErrorKind::Cycle(cycle)));
        }
        if path.is_empty() {
            return Err(self.error_at(path, node, s, InterpErrorKind::NoParent));
        }
        if self.active.len() >= MAX_EVAL_DEPTH {
            return Err(self.error_at(path, node, s, InterpErrorKind::TooDeep(MAX_EVAL_DEPTH)));
        }
        let tpl = match cached_template(s) {
            Ok(t) => t,
            Err(m) => return Err(self.error_at(path, node, s, InterpErrorKind::Syntax(m))),
        };
        self.active.push(ptr);
        let r = self.eval_template(&tpl, path, node);
        self.active.pop();
        match r {
            Ok(v) => {
                self.memo.insert(ptr, v.clone());
                Ok(v)
            }
            Err(f) => Err(self.attribute(f, path, node, s)),
        }
    }

    fn eval_template(&mut self, tpl: &Template, home: &[Seg<'t>], node: &Node) -> R<Val<'t>> {
        let at = |this: &Self, f: Fail, it: &Interp| {
            let text = tpl.source.get(it.span.clone()).unwrap_or(&tpl.source);
            this.attribute(f, home, node, text)
        };
        if let [Part::Interp(it)] = tpl.parts.as_slice() {
            return self.eval_interp(it, home).map_err(|f| at(self, f, it));
        }
        let mut out = String::new();
        for part in &tpl.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Interp(it) => {
                    let v = self.eval_interp(it, home).map_err(|f| at(self, f, it))?;
                    push_str_of(&mut out, &v);
                }
            }
        }
        Ok(Val::Prim(Value::Str(out)))
    }

    fn eval_parts_str(&mut self, parts: &[Part], home: &[Seg<'t>]) -> R<String> {
        let mut out = String::new();
        for part in parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Interp(it) => {
                    let v = self.eval_interp(it, home)?;
                    push_str_of(&mut out, &v);
                }
            }
        }
        Ok(out)
    }

    fn eval_interp(&mut self, it: &Interp, home: &[Seg<'t>]) -> R<Val<'t>> {
        if self.nest >= MAX_NEST {
            return Err(InterpErrorKind::TooDeep(MAX_NEST).into());
        }
        self.nest += 1;
        let r = match &it.kind {
            InterpKind::Node(kp) => self.eval_node_interp(kp, home),
            InterpKind::Resolver { name, args } => self.eval_resolver(name, args, home),
        };
        self.nest -= 1;
        r
    }

    fn eval_node_interp(&mut self, kp: &KeyPath, home: &[Seg<'t>]) -> R<Val<'t>> {
        let base = &home[..home.len() - 1];
        let key: Cow<'_, str> = match &kp.text {
            Some(t) => Cow::Borrowed(t),
            None => {
                let mut s = ".".repeat(kp.dots);
                for (i, item) in kp.items.iter().enumerate() {
                    let piece = self.key_part(&item.key, home, "config key")?;
                    push_key_piece(&mut s, i, item.bracketed, &piece);
                }
                Cow::Owned(s)
            }
        };
        let selected = match &kp.text {
            // A key without nested interpolations: its segments are the parsed names.
            Some(_) => {
                let start = start_of(base, kp.dots, &key)?;
                self.select_segs(&base[..start], &kp.items, true)?
            }
            None => self.select(base, &key, true)?,
        };
        match selected {
            Sel::Found(v) => {
                if let Val::Tree(loc) = &v {
                    if base.starts_with(&loc.path) {
                        return Err(InterpErrorKind::ToParent {
                            key: render_path(&loc.path),
                        }
                        .into());
                    }
                }
                Ok(v)
            }
            Sel::NotFound(absolute) => Err(InterpErrorKind::KeyNotFound {
                suggestion: suggest_key(self.root, &absolute),
                key: key.into_owned(),
            }
            .into()),
            Sel::Missing => Err(InterpErrorKind::MissingValue {
                key: key.into_owned(),
            }
            .into()),
            Sel::NotContainer(kind) => Err(kind.into()),
        }
    }

    /// A key or resolver-name part; a nested interpolation must give a string.
    pub(super) fn key_part<'a>(
        &mut self,
        part: &'a KeyPart,
        home: &[Seg<'t>],
        what: &str,
    ) -> R<Cow<'a, str>> {
        match part {
            KeyPart::Name(n) => Ok(Cow::Borrowed(n)),
            KeyPart::Interp(it) => match self.eval_interp(it, home)? {
                Val::Prim(Value::Str(s)) => Ok(Cow::Owned(s)),
                other => Err(InterpErrorKind::KeyType(format!(
                    "the interpolation used as a {what} must give a string, but gave `{}` of type {}",
                    str_of(&other),
                    val_type_name(&other)
                ))
                .into()),
            },
        }
    }

    /// OmegaConf's `_resolve_key_and_root` + `_select_impl`: leading dots climb from `base`
    /// (one dot is `base` itself); otherwise the key starts at the root.
    pub(super) fn select(
        &mut self,
        base: &[Seg<'t>],
        key: &str,
        throw_on_missing: bool,
    ) -> R<Sel<'t>> {
        let dots = key.bytes().take_while(|&c| c == b'.').count();
        let rest = &key[dots..];
        let start = start_of(base, dots, key)?;
        if rest.is_empty() {
            let start_path = &base[..start];
            let node = self.node_at(start_path);
            return Ok(Sel::Found(self.value_at(start_path, node)?));
        }
        let segs = split_key(rest);
        if segs.is_empty() {
            // OmegaConf fails on such keys (`[`) with an IndexError.
            return Err(InterpErrorKind::KeyNotFound {
                key: key.to_string(),
                suggestion: None,
            }
            .into());
        }
        self.select_segs(&base[..start], &segs, throw_on_missing)
    }

    /// Walks `segs` from the container at `start_path` (OmegaConf's `_select_impl`).
    fn select_segs<S: SegText>(
        &mut self,
        start_path: &[Seg<'t>],
        segs: &[S],
        throw_on_missing: bool,
    ) -> R<Sel<'t>> {
        let mut path = self.spare_paths.pop().unwrap_or_default();
        path.clear();
        path.extend_from_slice(start_path);
        let r = self.walk_segs(start_path, &mut path, segs, throw_on_missing);
        self.spare_paths.push(path);
        r
    }

    fn walk_segs<S: SegText>(
        &mut self,
        start_path: &[Seg<'t>],
        path: &mut Vec<Seg<'t>>,
        segs: &[S],
        throw_on_missing: bool,
    ) -> R<Sel<'t>> {
        let mut cursor = Cursor::Tree(self.node_at(path));
        let so_far = |i: usize| {
            segs[..=i]
                .iter()
                .map(|s| s.seg_text())
                .collect::<Vec<_>>()
                .join(".")
        };
        for (i, seg) in segs.iter().enumerate() {
            let seg = seg.seg_text();
            let last = i + 1 == segs.len();
            let bad_index = || InterpErrorKind::BadIndex {
                key: so_far(i),
                index: seg.to_string(),
            };
            let not_found = || {
                let mut absolute = dotted(start_path);
                for s in segs {
                    if !absolute.is_empty() {
                        absolute.push('.');
                    }
                    absolute.push_str(s.seg_text());
                }
                Sel::NotFound(absolute)
            };
            let not_container = || {
                Sel::NotContainer(InterpErrorKind::NotAContainer {
                    key: so_far(segs.len() - 1),
                    parent: so_far(i),
                    child: segs.get(i + 1).map_or("", |s| s.seg_text()).to_string(),
                })
            };
            let next = match &cursor {
                Cursor::Tree(node) => {
                    let found = match &node.value {
                        Value::Dict(d) => d.get_key_value(seg).map(|(k, c)| (Seg::Key(k), c)),
                        Value::List(items) => {
                            let i = python_int(seg).ok_or_else(bad_index)?;
                            usize::try_from(i)
                                .ok()
                                .and_then(|i| items.get(i).map(|c| (Seg::Idx(i), c)))
                        }
                        _ => None,
                    };
                    let Some((step, child)) = found else {
                        return Ok(not_found());
                    };
                    if child.value == Value::Missing {
                        if throw_on_missing {
                            return Err(InterpErrorKind::MissingValue { key: so_far(i) }.into());
                        }
                        return Ok(if last { Sel::Missing } else { not_container() });
                    }
                    path.push(step);
                    if last {
                        return Ok(Sel::Found(self.value_at(path, child)?));
                    }
                    match &child.value {
                        Value::Dict(_) | Value::List(_) => Cursor::Tree(child),
                        Value::Str(s) if s.contains("${") => {
                            match self.eval_node(path, child, s)? {
                                Val::Tree(loc) => {
                                    path.clear();
                                    path.extend_from_slice(&loc.path);
                                    Cursor::Tree(loc.node)
                                }
                                Val::Owned(n, true) => Cursor::Owned(n),
                                lazy @ Val::Values(_) => {
                                    Cursor::Owned(Rc::new(self.materialize(lazy, &child.origin)?))
                                }
                                _ => return Ok(not_container()),
                            }
                        }
                        _ => return Ok(not_container()),
                    }
                }
                Cursor::Owned(n) => {
                    let found = match &n.value {
                        Value::Dict(d) => d.get(seg),
                        Value::List(items) => {
                            let i = python_int(seg).ok_or_else(bad_index)?;
                            usize::try_from(i).ok().and_then(|i| items.get(i))
                        }
                        _ => None,
                    };
                    let Some(child) = found else {
                        return Ok(not_found());
                    };
                    if child.value == Value::Missing {
                        if throw_on_missing {
                            return Err(InterpErrorKind::MissingValue { key: so_far(i) }.into());
                        }
                        return Ok(if last { Sel::Missing } else { not_container() });
                    }
                    if last {
                        return Ok(Sel::Found(owned_val(Rc::new(child.clone()))));
                    }
                    if !child.value.is_container() {
                        return Ok(not_container());
                    }
                    Cursor::Owned(Rc::new(child.clone()))
                }
            };
            cursor = next;
        }
        unreachable!("segs is never empty")
    }

    pub(super) fn eval_element(&mut self, el: &Element, home: &[Seg<'t>]) -> R<Val<'t>> {
        match el {
            Element::Value(v) => Ok(Val::Prim(v.clone())),
            Element::Interp(it) => self.eval_interp(it, home),
            Element::Concat(parts) | Element::Quoted(parts) => {
                Ok(Val::Prim(Value::Str(self.eval_parts_str(parts, home)?)))
            }
            Element::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    let v = self.eval_element(item, home)?;
                    out.push(self.materialize(v, &Origin::Unknown)?);
                }
                Ok(Val::Owned(Rc::new(Node::from(Value::List(out))), false))
            }
            Element::Dict(pairs) => {
                let mut out = Dict::with_capacity(pairs.len());
                for (k, item) in pairs {
                    let v = self.eval_element(item, home)?;
                    let n = self.materialize(v, &Origin::Unknown)?;
                    out.insert(k.clone(), n);
                }
                Ok(Val::Owned(Rc::new(Node::from(Value::Dict(out))), false))
            }
            Element::Invalid(m) => Err(InterpErrorKind::Syntax(m.clone()).into()),
        }
    }
}

/// Rejects trees nested deeper than resolution (and OmegaConf) handles, before anything
/// recurses through them (the recursion here stops at the limit).
fn check_depth(root: &Node) -> R<()> {
    fn too_deep(node: &Node, remaining: usize) -> Option<&Node> {
        let children: &mut dyn Iterator<Item = &Node> = match &node.value {
            Value::Dict(d) => &mut d.values(),
            Value::List(items) => &mut items.iter(),
            _ => return None,
        };
        if remaining == 0 {
            return Some(node);
        }
        for child in children {
            if let Some(deep) = too_deep(child, remaining - 1) {
                return Some(deep);
            }
        }
        None
    }
    match too_deep(root, MAX_TREE_DEPTH) {
        None => Ok(()),
        Some(_) => Err(InterpErrorKind::TooDeep(MAX_TREE_DEPTH).into()),
    }
}

/// How much of `base` a key with `dots` leading dots starts from: no dot is the root, one
/// dot `base` itself, each further dot one level up.
fn start_of(base: &[Seg<'_>], dots: usize, key: &str) -> R<usize> {
    if dots == 0 {
        return Ok(0);
    }
    base.len().checked_sub(dots - 1).ok_or_else(|| {
        InterpErrorKind::AboveRoot {
            key: key.to_string(),
        }
        .into()
    })
}

/// The full key of the node at address `target` (for error messages only).
fn path_of(root: &Node, target: *const Node) -> Option<String> {
    fn walk<'t>(node: &'t Node, target: *const Node, path: &mut Vec<Seg<'t>>) -> bool {
        if std::ptr::eq(node, target) {
            return true;
        }
        match &node.value {
            Value::Dict(d) => d.iter().any(|(k, c)| {
                path.push(Seg::Key(k));
                let found = walk(c, target, path);
                if !found {
                    path.pop();
                }
                found
            }),
            Value::List(items) => items.iter().enumerate().any(|(i, c)| {
                path.push(Seg::Idx(i));
                let found = walk(c, target, path);
                if !found {
                    path.pop();
                }
                found
            }),
            _ => false,
        }
    }
    let mut path = Vec::new();
    walk(root, target, &mut path).then(|| render_path(&path))
}

fn owned_val<'t>(n: Rc<Node>) -> Val<'t> {
    if n.value.is_container() {
        Val::Owned(n, true)
    } else {
        Val::Prim(n.value.clone())
    }
}

fn dotted(path: &[Seg<'_>]) -> String {
    let mut s = String::new();
    for (i, seg) in path.iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        match seg {
            Seg::Key(k) => s.push_str(k),
            Seg::Idx(n) => {
                let _ = write!(s, "{n}");
            }
        }
    }
    s
}

pub(super) fn val_type_name(v: &Val<'_>) -> &'static str {
    match v {
        Val::Prim(p) => p.type_name(),
        Val::Tree(loc) => loc.node.value.type_name(),
        Val::Owned(n, _) => n.value.type_name(),
        Val::Values(_) => "list",
    }
}

/// Python's `str()` of an interpolation result: containers of the tree print their raw
/// (unresolved) content, as `str(DictConfig)` does.
fn push_str_of(out: &mut String, v: &Val<'_>) {
    match v {
        Val::Prim(Value::Str(s)) => out.push_str(s),
        Val::Prim(Value::Missing) => out.push_str("???"),
        Val::Prim(p) => out.push_str(&python_str(p)),
        Val::Tree(loc) => out.push_str(&python_repr(&loc.node.value)),
        Val::Owned(n, _) => out.push_str(&python_repr(&n.value)),
        Val::Values(lazy) => out.push_str(&python_repr(&lazy.raw())),
    }
}

pub(super) fn str_of(v: &Val<'_>) -> String {
    let mut s = String::new();
    push_str_of(&mut s, v);
    s
}

/// Python's `int(text)` for a list index (`" 1"`, `"+1"`, `"1_0"` are integers).
fn python_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let b = digits.as_bytes();
    if b.is_empty() || !b[0].is_ascii_digit() || !b[b.len() - 1].is_ascii_digit() {
        return None;
    }
    let mut value: i64 = 0;
    let mut previous_underscore = false;
    for &c in b {
        if c == b'_' {
            if previous_underscore {
                return None;
            }
            previous_underscore = true;
            continue;
        }
        if !c.is_ascii_digit() {
            return None;
        }
        previous_underscore = false;
        value = value.saturating_mul(10).saturating_add(i64::from(c - b'0'));
    }
    Some(if negative { -value } else { value })
}

// ------------------------------------------------------------------------------------------
// Near-miss suggestions
// ------------------------------------------------------------------------------------------

fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The closest candidate, if it is close enough to be a plausible typo.
pub(super) fn nearest<'a>(
    wanted: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (wanted.chars().count() / 3).max(2);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = levenshtein(wanted, c);
        if d > 0 && d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// The existing dotted key nearest to `wanted` (all keys of the tree, dotted).
pub(super) fn suggest_key(root: &Node, wanted: &str) -> Option<String> {
    const LIMIT: usize = 20_000;
    let mut keys = Vec::new();
    let mut stack: Vec<(String, &Node)> = vec![(String::new(), root)];
    while let Some((prefix, node)) = stack.pop() {
        if keys.len() >= LIMIT {
            break;
        }
        let children: Vec<(String, &Node)> = match &node.value {
            Value::Dict(d) => d.iter().map(|(k, n)| (k.clone(), n)).collect(),
            Value::List(items) => items
                .iter()
                .enumerate()
                .map(|(i, n)| (i.to_string(), n))
                .collect(),
            _ => Vec::new(),
        };
        for (k, n) in children {
            let full = if prefix.is_empty() {
                k
            } else {
                format!("{prefix}.{k}")
            };
            keys.push(full.clone());
            stack.push((full, n));
        }
    }
    nearest(wanted, keys.iter().map(String::as_str)).map(str::to_string)
}
