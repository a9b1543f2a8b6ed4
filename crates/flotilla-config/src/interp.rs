//! OmegaConf interpolation and resolvers, matching omegaconf 2.3.1 (and the resolvers Hydra
//! 1.3 registers).
//!
//! This module owns the step from a composed but unresolved config tree to the fully
//! resolved tree:
//!
//! * the `${...}` grammar: a hand-written lexer that mirrors the lexer modes of OmegaConf's
//!   ANTLR grammar (top-level text, interpolation, resolver arguments, quoted strings) and a
//!   recursive-descent parser over its tokens ([`parse`], [`Template`]);
//! * node interpolations (`${a.b}`, `${a[0]}`, `${a.0}`, `${.x}`, `${..x}`, `${a.${b}}`),
//!   typed results for a value that is exactly one interpolation, string interpolation
//!   (Python `str()` of each piece) and the escapes `\${` and `\\${`;
//! * the resolvers OmegaConf registers by default (`oc.env`, `oc.select`, `oc.decode`,
//!   `oc.create`, `oc.deprecated`, `oc.dict.keys`, `oc.dict.values`) and Hydra's (`now`,
//!   `hydra`, plus `flotilla` as an alias of `hydra`);
//! * cycle detection and errors that name the key, the interpolation, the origin of the node
//!   holding it and, for a key that does not exist, the nearest key that does.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use super::node::{python_float_repr, python_repr, python_str, Dict, Node, Origin, Value};

// ------------------------------------------------------------------------------------------
// Public API
// ------------------------------------------------------------------------------------------

/// Environment lookup: the value of a variable, if set.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What resolution may consult besides the tree: the clock and the environment.
#[derive(Clone)]
pub struct ResolveContext {
    /// One instant per composition, used by every `${now:...}`.
    pub now: chrono::DateTime<chrono::Local>,
    /// Environment lookup for `${oc.env:...}` (tests inject their own).
    pub env: EnvLookup,
}

impl ResolveContext {
    /// The current time and the process environment.
    pub fn from_process_env() -> Self {
        ResolveContext {
            now: chrono::Local::now(),
            env: Arc::new(|name| std::env::var(name).ok()),
        }
    }
}

impl fmt::Debug for ResolveContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolveContext")
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// An interpolation that could not be parsed or resolved.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct InterpError {
    /// Full key of the node holding the interpolation (`model.layers[0].lr`); empty when a
    /// string was parsed on its own.
    pub key: String,
    /// The interpolation that failed (`${trainer.lrr}`), or the whole string for a syntax
    /// error.
    pub text: String,
    /// Where the node holding the interpolation came from.
    pub origin: Origin,
    /// What went wrong (boxed to keep `Result<_, InterpError>` small).
    pub kind: Box<InterpErrorKind>,
    /// Keys whose resolution needed this one, innermost first.
    pub via: Vec<String>,
}

impl fmt::Display for InterpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self.kind {
            InterpErrorKind::Syntax(_) => write!(f, "invalid interpolation")?,
            _ => write!(f, "cannot resolve")?,
        }
        if !self.text.is_empty() {
            write!(f, " {}", self.text)?;
        }
        if !self.key.is_empty() {
            write!(f, " at {}", self.key)?;
        }
        if self.origin != Origin::Unknown {
            write!(f, " (from {})", self.origin)?;
        }
        write!(f, ": {}", self.kind)?;
        if !self.via.is_empty() {
            write!(f, " (while resolving {})", self.via.join(" <- "))?;
        }
        Ok(())
    }
}

/// The cause of an [`InterpError`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpErrorKind {
    /// The text does not follow OmegaConf's interpolation grammar.
    #[error("{0}")]
    Syntax(String),
    /// `${a.b}` where `a.b` does not exist.
    #[error("key '{key}' not found{}", did_you_mean(.suggestion))]
    KeyNotFound {
        key: String,
        suggestion: Option<String>,
    },
    /// An interpolation reached a `???` value.
    #[error("missing mandatory value '{key}' (???)")]
    MissingValue { key: String },
    /// A key walks through a value that is not a dictionary or list.
    #[error("error trying to access '{key}': node '{parent}' is not a container and thus cannot contain '{child}'")]
    NotAContainer {
        key: String,
        parent: String,
        child: String,
    },
    /// A list was indexed with something that is not an integer.
    #[error("index '{index}' (str) is not an int (while accessing '{key}')")]
    BadIndex { key: String, index: String },
    /// `${...x}` with more dots than there are parents.
    #[error("relative key '{key}' goes above the config root")]
    AboveRoot { key: String },
    /// An interpolation whose target contains the node holding it.
    #[error("interpolation to parent node '{key}' detected")]
    ToParent { key: String },
    /// Interpolations that depend on each other.
    #[error("recursive interpolation detected: {}", .0.join(" -> "))]
    Cycle(Vec<String>),
    /// A container whose resolved value would contain itself.
    #[error("recursive interpolation detected: '{key}' would contain itself")]
    SelfContaining { key: String },
    /// A nested interpolation used as a key or resolver name did not give a string.
    #[error("{0}")]
    KeyType(String),
    /// `${name:...}` with a resolver that is not registered.
    #[error("unsupported interpolation type '{name}'{}; known resolvers: {}", did_you_mean(.suggestion), .known.join(", "))]
    UnknownResolver {
        name: String,
        suggestion: Option<String>,
        known: Vec<String>,
    },
    /// A resolver rejected its arguments or failed.
    #[error("{name}: {message}")]
    Resolver { name: String, message: String },
    /// The interpolation itself is not in a dictionary or list.
    #[error("cannot resolve an interpolation for a node without a parent")]
    NoParent,
    /// Nesting beyond the limits that keep resolution off the end of the stack.
    #[error("interpolations nested too deeply (more than {0} levels)")]
    TooDeep(usize),
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean '{s}'?)"),
        None => String::new(),
    }
}

/// Resolves every interpolation in `root` and returns the fully resolved copy.
///
/// Strings without `${` are unchanged; escaped `\${` becomes `${`; `???` leaves stay
/// [`Value::Missing`] unless something interpolates them (then an error); a node produced by
/// an interpolation keeps the origin of the node that held the interpolation.
pub fn resolve_tree(root: &Node, ctx: &ResolveContext) -> Result<Node, InterpError> {
    let mut engine = Engine::new(root, ctx);
    let mut path = Vec::new();
    engine
        .resolved_copy(&mut path, root)
        .map_err(|f| f.into_error(root))
}

/// Resolves the single node at `path` (key segments; list items by index) inside `root`.
pub fn resolve_at(root: &Node, path: &[String], ctx: &ResolveContext) -> Result<Node, InterpError> {
    Resolver::new(root, ctx).resolve_at(path)
}

/// Resolves several nodes of one tree, sharing the work: each interpolation is evaluated
/// once however many of the requested nodes depend on it. (Each [`resolve_at`] call starts
/// afresh.)
pub struct Resolver<'t> {
    engine: Engine<'t>,
}

impl<'t> Resolver<'t> {
    pub fn new(root: &'t Node, ctx: &'t ResolveContext) -> Self {
        Resolver {
            engine: Engine::new(root, ctx),
        }
    }

    /// The resolved copy of the whole tree, as [`resolve_tree`] gives it.
    pub fn resolve_tree(&mut self) -> Result<Node, InterpError> {
        let root = self.engine.root;
        let mut path = Vec::new();
        let r = self.engine.resolved_copy(&mut path, root);
        self.engine.reset();
        r.map_err(|f| f.into_error(root))
    }

    /// The resolved copy of the node at `path` (key segments; list items by index).
    pub fn resolve_at(&mut self, path: &[String]) -> Result<Node, InterpError> {
        let root = self.engine.root;
        let mut segs: Vec<Seg<'_>> = Vec::with_capacity(path.len());
        let mut node = root;
        for key in path {
            let next = match &node.value {
                Value::Dict(d) => d.get_key_value(key.as_str()).map(|(k, n)| (Seg::Key(k), n)),
                Value::List(items) => key
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i).map(|n| (Seg::Idx(i), n))),
                _ => None,
            };
            match next {
                Some((seg, child)) => {
                    segs.push(seg);
                    node = child;
                }
                None => {
                    let wanted = path.join(".");
                    return Err(InterpError {
                        key: wanted.clone(),
                        text: String::new(),
                        origin: node.origin.clone(),
                        kind: Box::new(InterpErrorKind::KeyNotFound {
                            suggestion: suggest_key(root, &wanted),
                            key: wanted,
                        }),
                        via: Vec::new(),
                    });
                }
            }
        }
        let r = self.engine.resolved_copy(&mut segs, node);
        self.engine.reset();
        r.map_err(|f| f.into_error(root))
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

/// Parses a config string into its interpolation AST.
///
/// A string without `${` is plain text (OmegaConf does not parse it, so backslashes stay as
/// they are).
pub fn parse(text: &str) -> Result<Template, InterpError> {
    parse_template(text).map_err(|message| InterpError {
        key: String::new(),
        text: text.to_string(),
        origin: Origin::Unknown,
        kind: Box::new(InterpErrorKind::Syntax(message)),
        via: Vec::new(),
    })
}

/// Names of the resolvers this module knows.
pub const RESOLVERS: &[&str] = &[
    "oc.create",
    "oc.decode",
    "oc.deprecated",
    "oc.env",
    "oc.select",
    "oc.dict.keys",
    "oc.dict.values",
    "now",
    "hydra",
    "flotilla",
];

// ------------------------------------------------------------------------------------------
// AST
// ------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------
// Lexer: OmegaConf's lexer modes, longest match with rule order breaking ties.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tk {
    AnyStr,
    EscInter,
    TopEsc,
    InterOpen,
    BraceOpen,
    BraceClose,
    QuoteOpen,
    Comma,
    BracketOpen,
    BracketClose,
    Colon,
    Float,
    Int,
    Bool,
    Null,
    UnquotedChar,
    Id,
    Esc,
    Ws,
    InterClose,
    Dot,
    InterKey,
    QuoteClose,
    QuotedEsc,
    Eof,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// DEFAULT_MODE: a whole config string.
    Top,
    /// VALUE_MODE: resolver arguments, and `oc.decode` input.
    Value,
    /// INTERPOLATION_MODE: inside `${`.
    Inter,
    /// QUOTED_SINGLE_MODE.
    Single,
    /// QUOTED_DOUBLE_MODE.
    Double,
}

#[derive(Clone, Copy, Debug)]
struct Tok {
    kind: Tk,
    start: usize,
    end: usize,
}

#[derive(Clone, Copy)]
enum Act {
    Stay,
    Push(Mode),
    Pop,
    Set(Mode),
}

type Lexed = Option<(Tk, usize, Act)>;

fn lex(src: &str, start: Mode) -> Result<Vec<Tok>, String> {
    let b = src.as_bytes();
    let mut toks = Vec::with_capacity(8);
    let mut mode = start;
    let mut stack: Vec<Mode> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let lexed = match mode {
            Mode::Top => lex_top(b, i),
            Mode::Value => lex_value(b, i),
            Mode::Inter => lex_inter(b, i),
            Mode::Single => lex_quoted(b, i, b'\''),
            Mode::Double => lex_quoted(b, i, b'"'),
        };
        let Some((kind, len, act)) = lexed else {
            let c = src.get(i..).and_then(|s| s.chars().next()).unwrap_or('?');
            return Err(format!("token recognition error at: '{c}'"));
        };
        match act {
            Act::Stay => {}
            Act::Push(m) => {
                stack.push(mode);
                mode = m;
            }
            Act::Pop => mode = stack.pop().ok_or_else(|| "Empty Stack".to_string())?,
            Act::Set(m) => mode = m,
        }
        toks.push(Tok {
            kind,
            start: i,
            end: i + len,
        });
        i += len;
    }
    Ok(toks)
}

/// The longest candidate; the earliest rule wins a tie. `None` when nothing matches.
fn longest(cands: &[(usize, Tk)]) -> Option<(Tk, usize)> {
    let mut best: Option<(Tk, usize)> = None;
    for &(len, kind) in cands {
        if len > 0 && best.is_none_or(|(_, l)| len > l) {
            best = Some((kind, len));
        }
    }
    best
}

fn ws_len(b: &[u8], i: usize) -> usize {
    b.get(i..).map_or(0, |s| {
        s.iter().take_while(|&&c| c == b' ' || c == b'\t').count()
    })
}

fn backslashes(b: &[u8], i: usize) -> usize {
    b[i..].iter().take_while(|&&c| c == b'\\').count()
}

fn is_digit(c: Option<&u8>) -> bool {
    c.is_some_and(u8::is_ascii_digit)
}

/// `~[stop]* ~[\\ stop]`: the longest run of non-stop bytes that does not end in a backslash.
fn any_str_len(b: &[u8], i: usize, stop: impl Fn(u8) -> bool) -> usize {
    let mut last = None;
    let mut j = i;
    while j < b.len() && !stop(b[j]) {
        if b[j] != b'\\' {
            last = Some(j);
        }
        j += 1;
    }
    last.map_or(0, |l| l + 1 - i)
}

fn opens_interp(b: &[u8], i: usize) -> bool {
    b.get(i) == Some(&b'$') && b.get(i + 1) == Some(&b'{')
}

fn lex_top(b: &[u8], i: usize) -> Lexed {
    if b[i] == b'$' {
        if opens_interp(b, i) {
            return Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)));
        }
        return Some((Tk::AnyStr, 1, Act::Stay));
    }
    let any = any_str_len(b, i, |c| c == b'$');
    if b[i] != b'\\' {
        return Some((Tk::AnyStr, any, Act::Stay));
    }
    let n = backslashes(b, i);
    let esc_inter = if n % 2 == 1 && opens_interp(b, i + n) {
        n + 2
    } else {
        0
    };
    longest(&[
        (any, Tk::AnyStr),
        (esc_inter, Tk::EscInter),
        (n / 2 * 2, Tk::TopEsc),
        (n, Tk::AnyStr),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_quoted(b: &[u8], i: usize, quote: u8) -> Lexed {
    let c = b[i];
    if c == b'$' {
        if opens_interp(b, i) {
            return Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)));
        }
        return Some((Tk::AnyStr, 1, Act::Stay));
    }
    if c == quote {
        return Some((Tk::QuoteClose, 1, Act::Pop));
    }
    let any = any_str_len(b, i, |x| x == quote || x == b'$');
    if c != b'\\' {
        return Some((Tk::AnyStr, any, Act::Stay));
    }
    let n = backslashes(b, i);
    let odd = n % 2 == 1;
    let esc_inter = if odd && opens_interp(b, i + n) {
        n + 2
    } else {
        0
    };
    let esc_quote = if odd && b.get(i + n) == Some(&quote) {
        n + 1
    } else {
        0
    };
    longest(&[
        (any, Tk::AnyStr),
        (esc_inter, Tk::EscInter),
        (esc_quote, Tk::Esc),
        (n / 2 * 2, Tk::QuotedEsc),
        (n, Tk::AnyStr),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_value(b: &[u8], i: usize) -> Lexed {
    let w = ws_len(b, i);
    if w > 0 {
        let after = i + w;
        return Some(match b.get(after) {
            Some(b'}') => (Tk::BraceClose, w + 1, Act::Pop),
            Some(b',') => (Tk::Comma, w + 1 + ws_len(b, after + 1), Act::Stay),
            Some(b']') => (Tk::BracketClose, w + 1, Act::Stay),
            Some(b':') => (Tk::Colon, w + 1 + ws_len(b, after + 1), Act::Stay),
            _ => (Tk::Ws, w, Act::Stay),
        });
    }
    let simple = match b[i] {
        b'$' if opens_interp(b, i) => {
            Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)))
        }
        b'{' => Some((Tk::BraceOpen, 1 + ws_len(b, i + 1), Act::Push(Mode::Value))),
        b'}' => Some((Tk::BraceClose, 1, Act::Pop)),
        b'\'' => Some((Tk::QuoteOpen, 1, Act::Push(Mode::Single))),
        b'"' => Some((Tk::QuoteOpen, 1, Act::Push(Mode::Double))),
        b',' => Some((Tk::Comma, 1 + ws_len(b, i + 1), Act::Stay)),
        b'[' => Some((Tk::BracketOpen, 1 + ws_len(b, i + 1), Act::Stay)),
        b']' => Some((Tk::BracketClose, 1, Act::Stay)),
        b':' => Some((Tk::Colon, 1 + ws_len(b, i + 1), Act::Stay)),
        _ => None,
    };
    if simple.is_some() {
        return simple;
    }
    let unquoted = usize::from(b"/-\\+.$%*@?|".contains(&b[i]));
    longest(&[
        (float_len(b, i), Tk::Float),
        (int_len(b, i), Tk::Int),
        (keyword_len(b, i, &[b"true", b"false"]), Tk::Bool),
        (keyword_len(b, i, &[b"null"]), Tk::Null),
        (unquoted, Tk::UnquotedChar),
        (id_len(b, i), Tk::Id),
        (esc_len(b, i), Tk::Esc),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_inter(b: &[u8], i: usize) -> Lexed {
    let w = ws_len(b, i);
    match b.get(i + w) {
        Some(b':') => {
            let len = w + 1 + ws_len(b, i + w + 1);
            return Some((Tk::Colon, len, Act::Set(Mode::Value)));
        }
        Some(b'}') => return Some((Tk::InterClose, w + 1, Act::Pop)),
        _ if w > 0 => return None,
        _ => {}
    }
    match b[i] {
        b'$' if opens_interp(b, i) => {
            Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)))
        }
        b'.' => Some((Tk::Dot, 1, Act::Stay)),
        b'[' => Some((Tk::BracketOpen, 1, Act::Stay)),
        b']' => Some((Tk::BracketClose, 1, Act::Stay)),
        _ => {
            let id = id_len(b, i);
            let key = b[i..]
                .iter()
                .take_while(|&&c| !b"\\{}()[]:. \t'\"".contains(&c))
                .count();
            if id == 0 && key == 0 {
                None
            } else if id >= key {
                Some((Tk::Id, id, Act::Stay))
            } else {
                Some((Tk::InterKey, key, Act::Stay))
            }
        }
    }
}

/// `DIGIT (('_')? DIGIT)*` starting at a digit; returns the end.
fn digits_end(b: &[u8], mut j: usize) -> usize {
    j += 1;
    loop {
        if is_digit(b.get(j)) {
            j += 1;
        } else if b.get(j) == Some(&b'_') && is_digit(b.get(j + 1)) {
            j += 2;
        } else {
            return j;
        }
    }
}

/// `INT_UNSIGNED: '0' | [1-9] (('_')? DIGIT)*`; returns the end.
fn int_unsigned_end(b: &[u8], s: usize) -> Option<usize> {
    match b.get(s) {
        Some(b'0') => Some(s + 1),
        Some(c) if c.is_ascii_digit() => Some(digits_end(b, s)),
        _ => None,
    }
}

fn sign_end(b: &[u8], i: usize) -> usize {
    if matches!(b.get(i), Some(b'+' | b'-')) {
        i + 1
    } else {
        i
    }
}

fn int_len(b: &[u8], i: usize) -> usize {
    int_unsigned_end(b, sign_end(b, i)).map_or(0, |e| e - i)
}

fn float_len(b: &[u8], i: usize) -> usize {
    let s = sign_end(b, i);
    let mut best = 0;
    if let Some(word) = b.get(s..s + 3) {
        if word.eq_ignore_ascii_case(b"inf") || word.eq_ignore_ascii_case(b"nan") {
            best = s + 3 - i;
        }
    }
    let int_end = int_unsigned_end(b, s);
    // POINT_FLOAT: INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*
    let p1 = int_end.filter(|&u| b.get(u) == Some(&b'.')).map(|u| u + 1);
    let q = int_end.unwrap_or(s);
    let p2 = (b.get(q) == Some(&b'.') && is_digit(b.get(q + 1))).then(|| digits_end(b, q + 1));
    for end in [p1, p2].into_iter().flatten() {
        best = best.max(end - i);
    }
    // EXPONENT_FLOAT: (INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*
    for base in [int_end, p1, p2].into_iter().flatten() {
        if matches!(b.get(base), Some(b'e' | b'E')) {
            let k = sign_end(b, base + 1);
            if is_digit(b.get(k)) {
                best = best.max(digits_end(b, k) - i);
            }
        }
    }
    best
}

fn keyword_len(b: &[u8], i: usize, words: &[&[u8]]) -> usize {
    words
        .iter()
        .find(|w| {
            b.get(i..i + w.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(w))
        })
        .map_or(0, |w| w.len())
}

fn id_len(b: &[u8], i: usize) -> usize {
    if !(b[i].is_ascii_alphabetic() || b[i] == b'_') {
        return 0;
    }
    1 + b[i + 1..]
        .iter()
        .take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        .count()
}

fn esc_len(b: &[u8], i: usize) -> usize {
    let mut j = i;
    while b.get(j) == Some(&b'\\') && b.get(j + 1).is_some_and(|c| b"\\()[]{}:=, \t".contains(c)) {
        j += 2;
    }
    j - i
}

// ------------------------------------------------------------------------------------------
// Parser: recursive descent over the tokens (OmegaConfGrammarParser's rules).
// ------------------------------------------------------------------------------------------

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

fn parse_template(text: &str) -> Result<Template, String> {
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
fn parse_single_element(text: &str) -> Result<Element, String> {
    let mut p = Parser::new(text, lex(text, Mode::Value)?);
    let el = p.parse_element()?;
    p.expect(Tk::Eof, "end of text")?;
    Ok(el)
}

fn unescape_pairs(s: &str) -> String {
    s.chars().skip(1).step_by(2).collect()
}

fn python_int_text(text: &str) -> Option<i64> {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    cleaned.parse::<i64>().ok()
}

fn python_float_text(text: &str) -> f64 {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    let unsigned = cleaned.trim_start_matches(['+', '-']);
    let negative = cleaned.starts_with('-');
    let x = if unsigned.eq_ignore_ascii_case("inf") {
        f64::INFINITY
    } else if unsigned.eq_ignore_ascii_case("nan") {
        f64::NAN
    } else {
        unsigned.parse::<f64>().unwrap_or(f64::NAN)
    };
    if negative {
        -x
    } else {
        x
    }
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
                    Tk::Float => python_float_repr(python_float_text(s)),
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
                    Tk::Int => match python_int_text(s) {
                        Some(i) => Element::Value(Value::Int(i)),
                        None => Element::Invalid(format!("integer {s} is out of range")),
                    },
                    Tk::Float => Element::Value(Value::Float(python_float_text(s))),
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
    if let Some(i) = python_int_text(text) {
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

fn push_key_piece(out: &mut String, index: usize, bracketed: bool, key: &str) {
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
fn split_key(key: &str) -> Vec<&str> {
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

// ------------------------------------------------------------------------------------------
// Evaluation
// ------------------------------------------------------------------------------------------

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
enum Seg<'t> {
    Key(&'t str),
    Idx(usize),
}

/// Full key as OmegaConf prints it: `a.b[0].c`.
fn render_path(path: &[Seg<'_>]) -> String {
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
struct Loc<'t> {
    path: Rc<[Seg<'t>]>,
    node: &'t Node,
}

/// The value of an interpolation before it is written into the resolved tree.
#[derive(Clone, Debug)]
enum Val<'t> {
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
struct LazyValues<'t> {
    /// The container holding the interpolation (the resolver's `_parent_`).
    base: Rc<[Seg<'t>]>,
    /// The key the resolver was given.
    key: String,
    /// The dictionary's keys.
    keys: Vec<String>,
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
enum Sel<'t> {
    Found(Val<'t>),
    Missing,
    NotFound(String),
    NotContainer(InterpErrorKind),
}

/// An error while evaluating: not yet tied to a node, or complete.
#[derive(Debug)]
enum Fail {
    Kind(InterpErrorKind),
    Full(Box<InterpError>),
}

type R<T> = Result<T, Fail>;

impl From<InterpErrorKind> for Fail {
    fn from(kind: InterpErrorKind) -> Self {
        Fail::Kind(kind)
    }
}

impl Fail {
    fn into_error(self, root: &Node) -> InterpError {
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

fn resolver_error(name: &str, message: impl Into<String>) -> Fail {
    Fail::Kind(InterpErrorKind::Resolver {
        name: name.to_string(),
        message: message.into(),
    })
}

struct Engine<'t> {
    root: &'t Node,
    ctx: &'t ResolveContext,
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

impl<'t> Engine<'t> {
    fn new(root: &'t Node, ctx: &'t ResolveContext) -> Self {
        Engine {
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
    fn reset(&mut self) {
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
    fn resolved_copy(&mut self, path: &mut Vec<Seg<'t>>, node: &'t Node) -> R<Node> {
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
    fn materialize(&mut self, v: Val<'t>, origin: &Origin) -> R<Node> {
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
    fn key_part<'a>(&mut self, part: &'a KeyPart, home: &[Seg<'t>], what: &str) -> R<Cow<'a, str>> {
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
    fn select(&mut self, base: &[Seg<'t>], key: &str, throw_on_missing: bool) -> R<Sel<'t>> {
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

    fn eval_element(&mut self, el: &Element, home: &[Seg<'t>]) -> R<Val<'t>> {
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

    fn eval_resolver(
        &mut self,
        name_parts: &[KeyPart],
        arg_els: &[Element],
        home: &[Seg<'t>],
    ) -> R<Val<'t>> {
        let mut name = String::new();
        for (i, part) in name_parts.iter().enumerate() {
            if i > 0 {
                name.push('.');
            }
            let piece = self.key_part(part, home, "resolver name")?;
            name.push_str(&piece);
        }
        let mut args = Vec::with_capacity(arg_els.len());
        for el in arg_els {
            args.push(self.eval_element(el, home)?);
        }
        let base = &home[..home.len() - 1];
        let name = name.as_str();
        match name {
            "oc.env" => {
                arity(name, &args, 1, 2)?;
                let var = str_arg(name, &args[0])?;
                match (self.ctx.env)(var) {
                    Some(v) => Ok(Val::Prim(Value::Str(v))),
                    None => match args.get(1) {
                        Some(Val::Prim(Value::Null)) => Ok(Val::Prim(Value::Null)),
                        Some(default) => Ok(Val::Prim(Value::Str(str_of(default)))),
                        None => Err(resolver_error(
                            name,
                            format!("Environment variable '{var}' not found"),
                        )),
                    },
                }
            }
            "oc.select" => {
                arity(name, &args, 1, 2)?;
                let key = str_arg(name, &args[0])?;
                match self.select(base, key, false)? {
                    Sel::Found(v) => Ok(v),
                    _ => Ok(args.get(1).cloned().unwrap_or(Val::Prim(Value::Null))),
                }
            }
            "oc.decode" => {
                arity(name, &args, 1, 1)?;
                match &args[0] {
                    Val::Prim(Value::Null) => Ok(Val::Prim(Value::Null)),
                    Val::Prim(Value::Str(s)) => {
                        let el = parse_single_element(s)
                            .map_err(|m| resolver_error(name, format!("cannot decode '{s}': {m}")))?;
                        self.eval_element(&el, home)
                    }
                    other => Err(resolver_error(
                        name,
                        format!(
                            "`oc.decode` can only take strings or None as input, but `{}` is of type {}",
                            str_of(other),
                            val_type_name(other)
                        ),
                    )),
                }
            }
            "oc.create" => {
                arity(name, &args, 1, 1)?;
                match args.swap_remove(0) {
                    Val::Prim(Value::Null) => Ok(Val::Prim(Value::Null)),
                    Val::Prim(Value::Str(text)) => {
                        // OmegaConf.create(str) reads the string as YAML; a lone string becomes
                        // a mapping with that key set to null.
                        let mut node = super::yaml::load_str(&text, "<oc.create>")
                            .map_err(|e| resolver_error(name, e.to_string()))?;
                        node.set_origin_deep(&Origin::Unknown);
                        match node.value {
                            Value::Dict(_) | Value::List(_) => {}
                            Value::Str(key) => {
                                let mut d = Dict::new();
                                d.insert(key, Node::from(Value::Null));
                                node.value = Value::Dict(d);
                            }
                            other => {
                                return Err(resolver_error(
                                    name,
                                    format!("Object of unsupported type: '{}'", other.type_name()),
                                ))
                            }
                        }
                        Ok(Val::Owned(Rc::new(node), true))
                    }
                    Val::Prim(other) => Err(resolver_error(
                        name,
                        format!("Object of unsupported type: '{}'", other.type_name()),
                    )),
                    Val::Owned(n, _) => Ok(Val::Owned(n, true)),
                    other => {
                        let n = self.materialize(other, &Origin::Unknown)?;
                        Ok(Val::Owned(Rc::new(n), true))
                    }
                }
            }
            "oc.deprecated" => {
                arity(name, &args, 1, 2)?;
                let key = str_arg(name, &args[0])?;
                if let Some(message) = args.get(1) {
                    str_arg(name, message)?;
                }
                match self.select(base, key, false)? {
                    Sel::Found(v) => Ok(v),
                    Sel::Missing => Err(InterpErrorKind::MissingValue {
                        key: key.to_string(),
                    }
                    .into()),
                    _ => Err(resolver_error(
                        name,
                        format!(
                            "In oc.deprecated resolver at '{}': Key not found: '{key}'",
                            render_path(home)
                        ),
                    )),
                }
            }
            "oc.dict.keys" | "oc.dict.values" => {
                arity(name, &args, 1, 1)?;
                let key = str_arg(name, &args[0])?;
                let dict = match self.select(base, key, true)? {
                    Sel::Found(v) => v,
                    _ => return Err(resolver_error(name, format!("Key not found: '{key}'"))),
                };
                let keys: Vec<String> = match &dict {
                    Val::Tree(Loc {
                        node:
                            Node {
                                value: Value::Dict(d),
                                ..
                            },
                        ..
                    }) => d.keys().cloned().collect(),
                    Val::Owned(n, _) if matches!(n.value, Value::Dict(_)) => n
                        .value
                        .as_dict()
                        .map_or_else(Vec::new, |d| d.keys().cloned().collect()),
                    other => {
                        return Err(resolver_error(
                            name,
                            format!(
                                "`{name}` cannot be applied to objects of type: {}",
                                val_type_name(other)
                            ),
                        ))
                    }
                };
                if name == "oc.dict.keys" {
                    let items = keys
                        .into_iter()
                        .map(|k| Node::from(Value::Str(k)))
                        .collect();
                    return Ok(Val::Owned(Rc::new(Node::from(Value::List(items))), true));
                }
                Ok(Val::Values(Rc::new(LazyValues {
                    base: Rc::from(base),
                    key: key.to_string(),
                    keys,
                })))
            }
            "now" => {
                arity(name, &args, 1, 1)?;
                let pattern = str_arg(name, &args[0])?;
                Ok(Val::Prim(Value::Str(python_strftime(
                    &self.ctx.now,
                    pattern,
                ))))
            }
            "hydra" | "flotilla" => {
                arity(name, &args, 1, 1)?;
                let key = str_arg(name, &args[0])?;
                // The runtime node lives under `hydra` while resolving (compositions may also
                // keep it under `flotilla`).
                let runtime = self.root.value.as_dict().and_then(|d| {
                    ["hydra", "flotilla"]
                        .into_iter()
                        .find_map(|k| d.get_key_value(k).filter(|(_, n)| n.value.is_container()))
                });
                let Some((hydra_key, _)) = runtime else {
                    return Err(resolver_error(
                        name,
                        format!("'${{{name}:{key}}}' needs a 'hydra' node in the config"),
                    ));
                };
                let base = [Seg::Key(hydra_key.as_str())];
                let key: Cow<'_, str> = if key.starts_with('.') {
                    Cow::Borrowed(key)
                } else {
                    Cow::Owned(format!(".{key}"))
                };
                match self.select(&base, &key, false)? {
                    Sel::Found(v) => Ok(v),
                    _ => Ok(Val::Prim(Value::Null)),
                }
            }
            _ => {
                let suggestion = nearest(name, RESOLVERS.iter().copied()).map(str::to_string);
                Err(InterpErrorKind::UnknownResolver {
                    name: name.to_string(),
                    suggestion,
                    known: RESOLVERS.iter().map(|s| s.to_string()).collect(),
                }
                .into())
            }
        }
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

fn arity(name: &str, args: &[Val<'_>], min: usize, max: usize) -> R<()> {
    if args.len() < min || args.len() > max {
        let wanted = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(resolver_error(
            name,
            format!("takes {wanted} argument(s) but {} were given", args.len()),
        ));
    }
    Ok(())
}

fn str_arg<'a>(name: &str, v: &'a Val<'_>) -> R<&'a str> {
    match v {
        Val::Prim(Value::Str(s)) => Ok(s),
        other => Err(resolver_error(
            name,
            format!(
                "str expected, not {} (`{}`)",
                val_type_name(other),
                str_of(other)
            ),
        )),
    }
}

fn val_type_name(v: &Val<'_>) -> &'static str {
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

fn str_of(v: &Val<'_>) -> String {
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
fn nearest<'a>(wanted: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
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
fn suggest_key(root: &Node, wanted: &str) -> Option<String> {
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

// ------------------------------------------------------------------------------------------
// `now`: Python's `datetime.now().strftime(pattern)` (glibc conversions; naive time)
// ------------------------------------------------------------------------------------------

fn python_strftime(t: &chrono::DateTime<chrono::Local>, pattern: &str) -> String {
    use chrono::Timelike;
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut rest = pattern;
    while let Some(pos) = rest.find('%') {
        out.push_str(&rest[..pos]);
        let spec = &rest[pos + 1..];
        let mut chars = spec.chars();
        let mut used = 0;
        let mut c = chars.next();
        let flag = match c {
            Some(f @ ('-' | '_' | '0' | '^' | '#')) => {
                used += 1;
                c = chars.next();
                Some(f)
            }
            _ => None,
        };
        if let Some('E' | 'O') = c {
            used += 1;
            c = chars.next();
        }
        let rendered = c.and_then(|conv| {
            let text = match conv {
                '%' => Some("%".to_string()),
                'f' => Some(format!("{:06}", t.nanosecond() % 1_000_000_000 / 1000)),
                'z' | 'Z' => Some(String::new()),
                c if "aAbBcCdDeFgGhHIjklmMnpPrRsStTuUVwWxXyY".contains(c) => {
                    let padded = match flag {
                        Some(f @ ('-' | '_' | '0')) => chrono_format(t, &format!("%{f}{c}")),
                        _ => None,
                    };
                    padded.or_else(|| chrono_format(t, &format!("%{c}")))
                }
                _ => None,
            }?;
            used += conv.len_utf8();
            Some(if flag == Some('^') {
                text.to_uppercase()
            } else {
                text
            })
        });
        match rendered {
            Some(text) => {
                out.push_str(&text);
                rest = &spec[used..];
            }
            None => {
                // glibc copies an unknown conversion as written.
                out.push('%');
                rest = spec;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Formats one chrono specifier, or `None` when chrono does not know it.
fn chrono_format(t: &chrono::DateTime<chrono::Local>, spec: &str) -> Option<String> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(spec).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return None;
    }
    let mut s = String::new();
    write!(s, "{}", t.format_with_items(items.into_iter())).ok()?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// Builds a node tree from the JSON the oracle recorder writes: integers stay `Int`,
    /// other numbers are `Float`, `"???"` is `Missing`, `{"$float": "inf"}` is a non-finite
    /// float.
    fn from_json(j: &serde_json::Value) -> Node {
        use serde_json::Value as J;
        let value = match j {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) if !n.is_f64() => Value::Int(i),
                _ => Value::Float(n.as_f64().expect("finite number")),
            },
            J::String(s) if s == "???" => Value::Missing,
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::List(items.iter().map(from_json).collect()),
            J::Object(map) => match map.get("$float").and_then(J::as_str) {
                Some(f) if map.len() == 1 => Value::Float(f.parse().expect("float")),
                _ => Value::Dict(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect()),
            },
        };
        Node::from(value)
    }

    /// Equality on values and types (floats bit-exact, NaN equal to NaN).
    fn same(a: &Node, b: &Node) -> bool {
        match (&a.value, &b.value) {
            (Value::Float(x), Value::Float(y)) => {
                (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
            }
            (Value::List(x), Value::List(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
            }
            (Value::Dict(x), Value::Dict(y)) => {
                x.len() == y.len()
                    && x.iter()
                        .zip(y)
                        .all(|((kp, p), (kq, q))| kp == kq && same(p, q))
            }
            (x, y) => x == y,
        }
    }

    fn fixed_now() -> chrono::DateTime<chrono::Local> {
        chrono::Local
            .with_ymd_and_hms(2024, 3, 5, 7, 8, 9)
            .single()
            .expect("unambiguous local time")
            + chrono::Duration::microseconds(12_345)
    }

    fn ctx_with(env: &[(&str, &str)]) -> ResolveContext {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ResolveContext {
            now: fixed_now(),
            env: Arc::new(move |k| env.get(k).cloned()),
        }
    }

    fn s(text: &str) -> Node {
        Node::from(Value::Str(text.to_string()))
    }

    fn dict(entries: Vec<(&str, Node)>) -> Node {
        Node::from(Value::Dict(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        ))
    }

    fn fixture_path() -> String {
        match std::env::var("FLOTILLA_FIXTURES") {
            Ok(dir) => format!("{dir}/interp.json"),
            Err(_) => concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/oracle/fixtures/interp.json"
            )
            .to_string(),
        }
    }

    #[test]
    fn matches_omegaconf_oracle() {
        let path = fixture_path();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let cases: Vec<serde_json::Value> = serde_json::from_str(&text).expect("fixture JSON");
        assert!(cases.len() >= 120, "only {} cases in {path}", cases.len());
        let mut failures = Vec::new();
        for case in &cases {
            let name = case["name"].as_str().unwrap_or("?");
            let input = from_json(&case["input"]);
            let env: Vec<(String, String)> = case["env"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let env_refs: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let ctx = ctx_with(&env_refs);
            let got = resolve_tree(&input, &ctx);
            match (case.get("result"), got) {
                (Some(want), Ok(node)) => {
                    let want = from_json(want);
                    if !same(&want, &node) {
                        failures.push(format!(
                            "{name}: want {}\n      got  {}",
                            python_repr(&want.value),
                            python_repr(&node.value)
                        ));
                    }
                }
                (Some(want), Err(e)) => failures.push(format!(
                    "{name}: want {}\n      got error {e}",
                    python_repr(&from_json(want).value)
                )),
                (None, Ok(node)) => failures.push(format!(
                    "{name}: want error {}\n      got {}",
                    case["error"],
                    python_repr(&node.value)
                )),
                (None, Err(e)) => {
                    if let Some(sub) = case.get("rust_contains").and_then(|v| v.as_str()) {
                        if !e.to_string().contains(sub) {
                            failures.push(format!("{name}: error lacks '{sub}': {e}"));
                        }
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} oracle cases differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn error_message_names_key_text_origin_and_suggestion() {
        let mut lr = s("${trainer.lrr}");
        lr.origin = Origin::File {
            path: Arc::from("conf/model/base.yaml"),
            line: 3,
        };
        let root = dict(vec![
            ("trainer", dict(vec![("lr", Node::from(Value::Float(0.1)))])),
            ("model", dict(vec![("lr", lr)])),
        ]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot resolve ${trainer.lrr} at model.lr (from conf/model/base.yaml:3): \
             key 'trainer.lrr' not found (did you mean 'trainer.lr'?)"
        );
        let plain = dict(vec![
            ("trainer", dict(vec![("lr", Node::from(Value::Float(0.1)))])),
            ("model", dict(vec![("lr", s("${trainer.lrr}"))])),
        ]);
        assert_eq!(
            resolve_tree(&plain, &ctx_with(&[]))
                .unwrap_err()
                .to_string(),
            "cannot resolve ${trainer.lrr} at model.lr: key 'trainer.lrr' not found \
             (did you mean 'trainer.lr'?)"
        );
    }

    #[test]
    fn error_inside_a_referenced_node_names_the_chain() {
        let root = dict(vec![
            ("a", s("${b}")),
            ("b", s("x${c.nope}")),
            ("c", dict(vec![("n", Node::from(Value::Int(1)))])),
        ]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
        assert_eq!(err.key, "b");
        assert_eq!(err.text, "${c.nope}");
        assert_eq!(err.via, vec!["a".to_string()]);
        assert!(err.to_string().ends_with("(while resolving a)"), "{err}");
    }

    #[test]
    fn cycles_are_named() {
        let root = dict(vec![("a", s("${b}")), ("b", s("${c}")), ("c", s("${a}"))]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
        assert_eq!(
            *err.kind,
            InterpErrorKind::Cycle(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        let root = dict(vec![
            ("a", Node::from(Value::List(vec![s("${b}")]))),
            ("b", dict(vec![("x", s("${a}"))])),
        ]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
        assert!(
            matches!(*err.kind, InterpErrorKind::SelfContaining { .. }),
            "{err}"
        );
    }

    #[test]
    fn unknown_resolver_lists_known_ones() {
        let root = dict(vec![("a", s("${oc.evn:HOME}"))]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err().to_string();
        assert!(err.contains("unsupported interpolation type 'oc.evn' (did you mean 'oc.env'?)"));
        assert!(
            err.contains("known resolvers: oc.create, oc.decode"),
            "{err}"
        );
    }

    #[test]
    fn origins_are_kept() {
        let file = |line| Origin::File {
            path: Arc::from("c.yaml"),
            line,
        };
        let mut x = Node::from(Value::Int(1));
        x.origin = file(2);
        let mut a = dict(vec![("x", x)]);
        a.origin = file(1);
        let mut b = s("${a}");
        b.origin = Origin::Override(Arc::from("b=${a}"));
        let mut c = s("v=${a.x}");
        c.origin = file(9);
        let mut m = Node::from(Value::Missing);
        m.origin = file(10);
        let root = dict(vec![("a", a), ("b", b), ("c", c), ("m", m)]);
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        let get = |k: &str| out.select(k).unwrap();
        assert_eq!(get("a").origin, file(1));
        assert_eq!(get("a.x").origin, file(2));
        assert_eq!(get("b").origin, Origin::Override(Arc::from("b=${a}")));
        assert_eq!(get("b.x").origin, file(2));
        assert_eq!(get("c").origin, file(9));
        assert_eq!(get("c").value, Value::Str("v=1".into()));
        assert_eq!(get("m").value, Value::Missing);
        assert_eq!(get("m").origin, file(10));
    }

    #[test]
    fn now_uses_the_context_instant_and_python_patterns() {
        let root = dict(vec![
            ("a", s("${now:%Y-%m-%d_%H-%M-%S}")),
            ("b", s("${now:%H:%M:%S.%f}")),
            ("c", s("run_${now:%Y%m%d}_x")),
            ("d", s("${now:%-d/%-m %j %a %b %p %z|%Z %% %Q %Ey}")),
            ("e", s("${now:'%Y, %m'}")),
        ]);
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        let get = |k: &str| out.select(k).unwrap().value.clone();
        assert_eq!(get("a"), Value::Str("2024-03-05_07-08-09".into()));
        assert_eq!(get("b"), Value::Str("07:08:09.012345".into()));
        assert_eq!(get("c"), Value::Str("run_20240305_x".into()));
        assert_eq!(get("d"), Value::Str("5/3 065 Tue Mar AM | % %Q 24".into()));
        assert_eq!(get("e"), Value::Str("2024, 03".into()));
    }

    #[test]
    fn env_comes_from_the_context() {
        let root = dict(vec![
            ("a", s("${oc.env:FLOTILLA_X}")),
            ("b", s("${oc.env:FLOTILLA_Y,7}")),
        ]);
        let out = resolve_tree(&root, &ctx_with(&[("FLOTILLA_X", "on")])).unwrap();
        assert_eq!(out.select("a").unwrap().value, Value::Str("on".into()));
        assert_eq!(out.select("b").unwrap().value, Value::Str("7".into()));
        let root = dict(vec![("a", s("${oc.env:FLOTILLA_Y}"))]);
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err().to_string();
        assert!(
            err.contains("Environment variable 'FLOTILLA_Y' not found"),
            "{err}"
        );
    }

    #[test]
    fn resolve_at_resolves_one_node() {
        let root = dict(vec![
            ("a", dict(vec![("b", s("${c}")), ("bad", s("${nope}"))])),
            ("c", Node::from(Value::Int(4))),
        ]);
        let ctx = ctx_with(&[]);
        let got = resolve_at(&root, &["a".into(), "b".into()], &ctx).unwrap();
        assert_eq!(got.value, Value::Int(4));
        assert!(resolve_at(&root, &["a".into(), "bad".into()], &ctx).is_err());
        let err = resolve_at(&root, &["a".into(), "bb".into()], &ctx).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot resolve at a.bb: key 'a.bb' not found (did you mean 'a.b'?)"
        );
        let err = parse("${a").unwrap_err().to_string();
        assert!(err.starts_with("invalid interpolation ${a: "), "{err}");
    }

    #[test]
    fn resolver_shares_work_across_calls() {
        let root = dict(vec![
            ("a", s("${b}")),
            ("b", s("${oc.env:FLOTILLA_X}")),
            ("c", dict(vec![("d", s("${b}-${a}"))])),
        ]);
        let ctx = ctx_with(&[("FLOTILLA_X", "v")]);
        let mut r = Resolver::new(&root, &ctx);
        assert_eq!(
            r.resolve_at(&["a".into()]).unwrap().value,
            Value::Str("v".into())
        );
        assert!(r.resolve_at(&["nope".into()]).is_err());
        let c = r.resolve_at(&["c".into()]).unwrap();
        assert_eq!(c.select("d").unwrap().value, Value::Str("v-v".into()));
        assert_eq!(
            r.resolve_tree().unwrap(),
            resolve_tree(&root, &ctx).unwrap()
        );
    }

    #[test]
    fn hydra_resolver_needs_the_hydra_node() {
        let root = dict(vec![("a", s("${hydra:job.name}"))]);
        assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
        let root = dict(vec![
            ("hydra", dict(vec![("job", dict(vec![("name", s("j"))]))])),
            ("a", s("${hydra:job.name}")),
            ("b", s("${flotilla:job}")),
            ("c", s("${hydra:..a}")),
        ]);
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        assert_eq!(out.select("a").unwrap().value, Value::Str("j".into()));
        assert_eq!(out.select("b.name").unwrap().value, Value::Str("j".into()));
        assert_eq!(out.select("c").unwrap().value, Value::Str("j".into()));
    }

    #[test]
    fn parse_gives_the_ast() {
        let t = parse("${a.b}").unwrap();
        assert!(t.is_single_interpolation());
        let Part::Interp(it) = &t.parts[0] else {
            panic!("interp")
        };
        assert_eq!(it.span, 0..6);
        let InterpKind::Node(kp) = &it.kind else {
            panic!("node")
        };
        assert_eq!(kp.text.as_deref(), Some("a.b"));
        let t = parse("x \\${y} ${oc.env:A,[1, 'b']}").unwrap();
        assert_eq!(t.parts[0], Part::Text("x ${y} ".into()));
        assert!(!t.is_single_interpolation());
        assert!(parse("no interpolation \\ here").unwrap().parts.len() == 1);
        for bad in [
            "${a",
            "${a..b}",
            "${}",
            "${a b}",
            "${f:'x}",
            "${oc.env:a=b}",
            "${a.}",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(matches!(*e.kind, InterpErrorKind::Syntax(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn split_key_matches_omegaconf() {
        assert_eq!(split_key("a.b"), vec!["a", "b"]);
        assert_eq!(split_key("a[b]"), vec!["a", "b"]);
        assert_eq!(split_key(".a.b[c].d"), vec!["", "a", "b", "c", "d"]);
        assert_eq!(split_key("[a].b"), vec!["a", "b"]);
        assert_eq!(split_key("..[a]"), vec!["", "", "a"]);
        assert_eq!(split_key("a..b"), vec!["a", "", "b"]);
        assert_eq!(split_key("a[b"), vec!["a"]);
        assert_eq!(split_key(""), vec![""]);
    }

    #[test]
    fn long_chains_and_deep_nesting_fail_cleanly() {
        let mut entries = vec![("a0".to_string(), Node::from(Value::Int(1)))];
        for i in 1..60 {
            entries.push((format!("a{i}"), s(&format!("${{a{}}}", i - 1))));
        }
        let root = Node::from(Value::Dict(entries.iter().cloned().rev().collect()));
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        assert_eq!(out.select("a59").unwrap().value, Value::Int(1));
        for i in 60..400 {
            entries.push((format!("a{i}"), s(&format!("${{a{}}}", i - 1))));
        }
        // Memoization keeps a chain shallow when it is resolved from its start; resolved
        // from its end, it is 400 interpolations deep.
        let root = Node::from(Value::Dict(entries.into_iter().rev().collect()));
        let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
        assert!(matches!(*err.kind, InterpErrorKind::TooDeep(_)), "{err}");
    }

    #[test]
    fn deep_parse_nesting_fails_cleanly() {
        let deep = format!("${{oc.decode:'{}{}'}}", "[".repeat(5000), "]".repeat(5000));
        assert!(parse(&deep).is_ok());
        let root = dict(vec![("a", s(&deep))]);
        assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
        let nested = format!("{}x{}", "${a.".repeat(3000), "}".repeat(3000));
        assert!(parse(&nested).is_err());
    }

    #[test]
    fn deep_trees_fail_cleanly() {
        let mut node = Node::from(Value::Int(0));
        for _ in 0..2000 {
            node = Node::from(Value::List(vec![node]));
        }
        let root = dict(vec![("deep", node)]);
        assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
        let mut node = s("${a}");
        for _ in 0..120 {
            node = Node::from(Value::List(vec![node]));
        }
        let root = dict(vec![("a", Node::from(Value::Int(3))), ("deep", node)]);
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        let mut leaf = out.select("deep").unwrap();
        while let Value::List(items) = &leaf.value {
            leaf = &items[0];
        }
        assert_eq!(leaf.value, Value::Int(3));
    }

    #[test]
    fn memoizes_repeated_references() {
        // Each level evaluates the previous one twice; without memoization this is 2^60
        // evaluations.
        let mut entries = vec![("a0".to_string(), s("x"))];
        for i in 1..60 {
            let p = i - 1;
            entries.push((
                format!("a{i}"),
                s(&format!("${{oc.select:a{p},${{a{p}}}}}")),
            ));
        }
        let root = Node::from(Value::Dict(entries.into_iter().collect()));
        let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
        assert_eq!(out.select("a59").unwrap().value, Value::Str("x".into()));
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn tree_with(text: &str) -> Node {
            dict(vec![
                ("a", Node::from(Value::Int(1))),
                (
                    "b",
                    dict(vec![
                        ("c", s("x")),
                        ("d", Node::from(Value::List(vec![s("y"), s(text)]))),
                    ]),
                ),
                ("e", Node::from(Value::Missing)),
                ("s", s(text)),
                ("t", dict(vec![("u", s(text))])),
                ("hydra", dict(vec![("job", dict(vec![("name", s(text))]))])),
            ])
        }

        fn check(text: &str) {
            let _ = parse(text);
            let ctx = ctx_with(&[("HOME", "/h")]);
            if let Ok(out) = resolve_tree(&tree_with(text), &ctx) {
                assert!(out.value.is_container());
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn arbitrary_strings_never_panic(text in "\\PC{0,40}") {
                check(&text);
            }

            #[test]
            fn grammar_shaped_strings_never_panic(
                text in "([$]\\{|\\}|[.:,\\[\\]'\"\\\\ ]|oc\\.(env|select|decode|create|dict\\.keys)|now|hydra|[abcestu]|[0-9]|null|true|1e5|-)*"
            ) {
                check(&text);
            }

            #[test]
            fn wrapped_grammar_strings_never_panic(
                inner in "([$]\\{|\\}|[.:,\\[\\]'\"\\\\ ]|[abcdestu]|[0-9]|oc\\.select|oc\\.decode)*"
            ) {
                check(&format!("${{{inner}}}"));
                check(&format!("${{oc.decode:'{inner}'}}"));
                check(&format!("x${{b.{inner}}}y"));
            }
        }
    }
}
