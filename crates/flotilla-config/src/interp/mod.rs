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
//!
//! Where things live: `lexer` and `grammar` turn a string into its [`Template`] (the lexer
//! modes, then the parser and the AST); `evaluate` resolves a tree (selection of keys, typed
//! and string interpolation, memoization, cycles, limits, near-miss suggestions); `resolvers`
//! holds the resolvers themselves and the list of their names ([`RESOLVERS`]).

mod evaluate;
mod grammar;
mod lexer;
mod resolvers;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

pub use grammar::{Element, Interp, InterpKind, KeyItem, KeyPart, KeyPath, Part, Template};
pub use resolvers::RESOLVERS;

use crate::node::{Node, Origin, Value};
use evaluate::{suggest_key, Evaluator, Seg};
use grammar::parse_template;

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
    let mut evaluator = Evaluator::new(root, ctx);
    let mut path = Vec::new();
    evaluator
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
    evaluator: Evaluator<'t>,
}

impl<'t> Resolver<'t> {
    pub fn new(root: &'t Node, ctx: &'t ResolveContext) -> Self {
        Resolver {
            evaluator: Evaluator::new(root, ctx),
        }
    }

    /// The resolved copy of the whole tree, as [`resolve_tree`] gives it.
    pub fn resolve_tree(&mut self) -> Result<Node, InterpError> {
        let root = self.evaluator.root;
        let mut path = Vec::new();
        let r = self.evaluator.resolved_copy(&mut path, root);
        self.evaluator.reset();
        r.map_err(|f| f.into_error(root))
    }

    /// The resolved copy of the node at `path` (key segments; list items by index).
    pub fn resolve_at(&mut self, path: &[String]) -> Result<Node, InterpError> {
        let root = self.evaluator.root;
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
        let r = self.evaluator.resolved_copy(&mut segs, node);
        self.evaluator.reset();
        r.map_err(|f| f.into_error(root))
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
