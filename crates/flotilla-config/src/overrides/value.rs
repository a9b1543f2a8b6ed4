//! Values while an override is evaluated: an element, a sweep or a glob ([`Val`]), the state
//! the grammar functions share ([`Ctx`]), and the placeholders that stand for a sweep or glob
//! nested in a container until [`finalize`] turns them into what Hydra makes of them (or
//! refuses them).

use super::expand::Rng;
use super::python::element_type_name;
use super::types::{Element, Sweep};
use crate::node::python_float_repr;

pub(super) const NESTED_SWEEP: &str = "a sweep cannot be nested inside a list, a dict or a choice \
     (Hydra fails on such values when they are used)";

/// An evaluated element, sweep or glob. A glob keeps its raw patterns until it is either the
/// whole value (a glob sweep, whose patterns must be strings) or nested in a container, where
/// Hydra renders it as the dict `{include: [...], exclude: [...]}`.
#[derive(Debug, Clone)]
pub(super) enum Val {
    E(Element),
    S(Sweep),
    G {
        include: Vec<Element>,
        exclude: Vec<Element>,
    },
}

/// The only key of the placeholder dict that stands for a glob nested in a container while
/// values are evaluated (the lexer never produces a NUL, so no parsed key can equal it).
const NESTED_GLOB_KEY: &str = "\u{0}glob";

fn nested_glob(include: Vec<Element>, exclude: Vec<Element>) -> Element {
    Element::Dict(vec![(
        NESTED_GLOB_KEY.to_string(),
        Element::List(vec![Element::List(include), Element::List(exclude)]),
    )])
}

pub(super) fn is_nested_glob(e: &Element) -> bool {
    matches!(e, Element::Dict(pairs) if pairs.len() == 1 && pairs[0].0 == NESTED_GLOB_KEY)
}

/// Replaces nested-glob placeholders by what OmegaConf makes of Hydra's `Glob` dataclass: a
/// dict of two string lists.
pub(super) fn finalize(e: Element) -> Result<Element, String> {
    Ok(match e {
        Element::Dict(pairs) if pairs.len() == 1 && pairs[0].0 == NESTED_SWEEP_KEY => {
            return Err(NESTED_SWEEP.to_string())
        }
        Element::Dict(mut pairs) if pairs.len() == 1 && pairs[0].0 == NESTED_GLOB_KEY => {
            let Some((_, Element::List(mut parts))) = pairs.pop() else {
                unreachable!("placeholder holds two lists")
            };
            let exclude = parts.pop();
            let include = parts.pop();
            let strings = |part: Option<Element>| -> Result<Element, String> {
                let items = match part {
                    Some(Element::List(items)) => items,
                    _ => Vec::new(),
                };
                let items = items
                    .into_iter()
                    .map(|x| match x {
                        Element::Str(s) => Ok(Element::Str(s)),
                        Element::Int(i) => Ok(Element::Str(i.to_string())),
                        Element::Float(f) => Ok(Element::Str(python_float_repr(f))),
                        Element::Bool(b) => {
                            Ok(Element::Str(if b { "True" } else { "False" }.into()))
                        }
                        other => Err(format!(
                            "a glob nested in a value needs string patterns, got {} \
                             (Hydra fails on this when the value is used)",
                            element_type_name(&other)
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Element::List(items))
            };
            Element::Dict(vec![
                ("include".to_string(), strings(include)?),
                ("exclude".to_string(), strings(exclude)?),
            ])
        }
        Element::List(items) => Element::List(
            items
                .into_iter()
                .map(finalize)
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Element::Dict(pairs) => Element::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| Ok((k, finalize(v)?)))
                .collect::<Result<Vec<_>, String>>()?,
        ),
        other => other,
    })
}

/// State the grammar functions share while one override is evaluated.
pub(super) struct Ctx {
    pub(super) rng: Rng,
    /// Sweeps nested in a list, dict or choice. Hydra keeps such values while evaluating (a
    /// later duplicate dict key may still drop them, and casts apply to them) and fails only
    /// when the final value is used; here they are parked, referenced by a placeholder
    /// element, and refused by [`finalize`] if they survive.
    parked: Vec<Sweep>,
}

/// The only key of the placeholder dict that stands for a parked nested sweep.
const NESTED_SWEEP_KEY: &str = "\u{0}sweep";

impl Ctx {
    pub(super) fn new(seed: u64) -> Ctx {
        Ctx {
            rng: Rng::new(seed),
            parked: Vec::new(),
        }
    }

    /// The element standing for `v` inside a container.
    pub(super) fn nest(&mut self, v: Val) -> Element {
        match v {
            Val::E(e) => e,
            Val::G { include, exclude } => nested_glob(include, exclude),
            Val::S(s) => {
                self.parked.push(s);
                Element::Dict(vec![(
                    NESTED_SWEEP_KEY.to_string(),
                    Element::Int((self.parked.len() - 1) as i64),
                )])
            }
        }
    }

    /// The parked sweep `e` stands for, if it is a placeholder.
    pub(super) fn parked_sweep(&self, e: &Element) -> Option<Sweep> {
        match e {
            Element::Dict(pairs) if pairs.len() == 1 && pairs[0].0 == NESTED_SWEEP_KEY => {
                match pairs[0].1 {
                    Element::Int(i) => self.parked.get(i as usize).cloned(),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// Python's `type(x).__name__`.
pub(super) fn type_name(v: &Val) -> &'static str {
    match v {
        Val::E(e) => element_type_name(e),
        Val::S(Sweep::Choice { .. }) => "ChoiceSweep",
        Val::S(Sweep::Range { .. }) => "RangeSweep",
        Val::S(Sweep::Interval { .. }) => "IntervalSweep",
        Val::S(Sweep::Glob { .. }) | Val::G { .. } => "Glob",
    }
}
