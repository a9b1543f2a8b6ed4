//! The bodies of the grammar functions (Hydra's `grammar/grammar_functions.py`): the casts
//! `int`, `float`, `str` and `bool`, and `choice`, `range`, `interval`, `tag`, `shuffle`,
//! `sort` and `glob`.

use std::cmp::Ordering;

use super::expand::Rng;
use super::python::{
    element_type_name, float_to_int, num_cmp, py_err, py_sorted, python_float, python_int, PyResult,
};
use super::types::{Element, Number, Sweep};
use super::value::{is_nested_glob, type_name, Ctx, Val, NESTED_SWEEP};
use crate::node::python_float_repr;

/// A number argument that passed the `Union[int, float]` check (bools count as ints).
pub(super) fn val_number(v: Option<Val>) -> Number {
    match v {
        Some(Val::E(Element::Float(f))) => Number::Float(f),
        Some(Val::E(Element::Int(i))) => Number::Int(i),
        Some(Val::E(Element::Bool(b))) => Number::Int(i64::from(b)),
        _ => Number::Int(0),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Cast {
    Int,
    Float,
    Str,
    Bool,
}

/// `_list_to_simple_choice`
fn simple_choice(args: Vec<Val>) -> PyResult<Sweep> {
    let mut items = Vec::with_capacity(args.len());
    for a in args {
        match a {
            Val::E(e) => items.push(e),
            Val::S(_) | Val::G { .. } => return py_err("AssertionError", ""),
        }
    }
    Ok(Sweep::Choice {
        items,
        simple_form: true,
        shuffle: false,
        tags: Vec::new(),
    })
}

pub(super) fn fn_cast(
    kind: Cast,
    args: Vec<Val>,
    value: Option<Val>,
    ctx: &mut Ctx,
) -> PyResult<Val> {
    // _normalize_cast_value
    let value = match value {
        Some(_) if !args.is_empty() => {
            return py_err("TypeError", "cannot use both position and named arguments")
        }
        Some(v) => v,
        None if args.is_empty() => {
            return py_err("TypeError", "No positional args or value specified")
        }
        None if args.len() == 1 => args.into_iter().next().expect("one argument"),
        None => Val::S(simple_choice(args)?),
    };
    cast_value(kind, value, ctx)
}

fn cast_value(kind: Cast, value: Val, ctx: &mut Ctx) -> PyResult<Val> {
    match value {
        Val::E(e) => cast_element(kind, &e, ctx).map(Val::E),
        Val::S(Sweep::Choice {
            items, simple_form, ..
        }) => {
            let mut cast_items = Vec::with_capacity(items.len());
            for item in &items {
                let c = cast_element(kind, item, ctx)?;
                // cast_choice asserts each result is an element.
                if ctx.parked_sweep(&c).is_some() {
                    return py_err("AssertionError", "");
                }
                cast_items.push(c);
            }
            let items = cast_items;
            Ok(Val::S(Sweep::Choice {
                items,
                simple_form,
                shuffle: false,
                tags: Vec::new(),
            }))
        }
        Val::S(Sweep::Range {
            start, stop, step, ..
        }) => {
            let f = |n: Number| -> PyResult<Number> {
                match kind {
                    Cast::Int => match n {
                        Number::Int(i) => Ok(Number::Int(i)),
                        Number::Float(x) => float_to_int(x).map(Number::Int),
                    },
                    Cast::Float => Ok(Number::Float(n.as_f64())),
                    _ => py_err("ValueError", "Range can only be cast to int or float"),
                }
            };
            Ok(Val::S(Sweep::Range {
                start: f(start)?,
                stop: f(stop)?,
                step: f(step)?,
                shuffle: false,
                tags: Vec::new(),
            }))
        }
        Val::S(Sweep::Interval { start, end, tags }) => {
            let f = |x: f64| -> PyResult<f64> {
                match kind {
                    Cast::Int => float_to_int(x).map(|i| i as f64),
                    Cast::Float => Ok(x),
                    Cast::Str => py_err("ValueError", "Intervals cannot be cast to str"),
                    Cast::Bool => py_err("ValueError", "Intervals cannot be cast to bool"),
                }
            };
            Ok(Val::S(Sweep::Interval {
                start: f(start)?,
                end: f(end)?,
                tags,
            }))
        }
        Val::S(Sweep::Glob { .. }) | Val::G { .. } => py_err("AssertionError", ""),
    }
}

fn cast_element(kind: Cast, e: &Element, ctx: &mut Ctx) -> PyResult<Element> {
    if let Some(sweep) = ctx.parked_sweep(e) {
        let cast = cast_value(kind, Val::S(sweep), ctx)?;
        return Ok(ctx.nest(cast));
    }
    if is_nested_glob(e) {
        // cast_bool ends in `bool(value)`, True for a Glob; the other casts assert a primitive.
        return match kind {
            Cast::Bool => Ok(Element::Bool(true)),
            _ => py_err("AssertionError", ""),
        };
    }
    match e {
        Element::Quoted { text, .. } => cast_element(kind, &Element::Str(text.clone()), ctx),
        Element::List(items) => {
            let mut out = Vec::with_capacity(items.len());
            for x in items {
                out.push(cast_element(kind, x, ctx)?);
            }
            Ok(Element::List(out))
        }
        Element::Dict(pairs) => {
            let mut out = Vec::with_capacity(pairs.len());
            for (k, v) in pairs {
                out.push((k.clone(), cast_element(kind, v, ctx)?));
            }
            Ok(Element::Dict(out))
        }
        Element::Null if kind == Cast::Bool => Ok(Element::Bool(false)),
        Element::Null => py_err("AssertionError", ""),
        _ => cast_primitive(kind, e),
    }
}

fn cast_primitive(kind: Cast, e: &Element) -> PyResult<Element> {
    Ok(match (kind, e) {
        (Cast::Int, Element::Bool(b)) => Element::Int(i64::from(*b)),
        (Cast::Int, Element::Int(i)) => Element::Int(*i),
        (Cast::Int, Element::Float(f)) => Element::Int(float_to_int(*f)?),
        (Cast::Int, Element::Str(s)) => Element::Int(python_int(s)?),
        (Cast::Float, Element::Bool(b)) => Element::Float(if *b { 1.0 } else { 0.0 }),
        (Cast::Float, Element::Int(i)) => Element::Float(*i as f64),
        (Cast::Float, Element::Float(f)) => Element::Float(*f),
        (Cast::Float, Element::Str(s)) => Element::Float(python_float(s)?),
        (Cast::Str, Element::Bool(b)) => Element::Str(if *b { "true" } else { "false" }.into()),
        (Cast::Str, Element::Int(i)) => Element::Str(i.to_string()),
        (Cast::Str, Element::Float(f)) => Element::Str(python_float_repr(*f)),
        (Cast::Str, Element::Str(s)) => Element::Str(s.clone()),
        (Cast::Bool, Element::Bool(b)) => Element::Bool(*b),
        (Cast::Bool, Element::Int(i)) => Element::Bool(*i != 0),
        (Cast::Bool, Element::Float(f)) => Element::Bool(*f != 0.0),
        (Cast::Bool, Element::Str(s)) => match s.to_lowercase().as_str() {
            "false" => Element::Bool(false),
            "true" => Element::Bool(true),
            _ => return py_err("ValueError", format!("Cannot cast '{s}' to bool")),
        },
        _ => return py_err("AssertionError", ""),
    })
}

pub(super) fn fn_choice(args: Vec<Val>, ctx: &mut Ctx) -> PyResult<Val> {
    if args.is_empty() {
        return py_err("ValueError", "empty choice is not legal");
    }
    if args.len() == 1 {
        if let Val::S(Sweep::Choice {
            items,
            simple_form,
            shuffle,
            tags,
        }) = &args[0]
        {
            if !*simple_form {
                return py_err("ValueError", "nesting choices is not supported");
            }
            return Ok(Val::S(Sweep::Choice {
                items: items.clone(),
                simple_form: false,
                shuffle: *shuffle,
                tags: tags.clone(),
            }));
        }
    }
    let mut items = Vec::with_capacity(args.len());
    for a in args {
        items.push(ctx.nest(a));
    }
    Ok(Val::S(Sweep::Choice {
        items,
        simple_form: false,
        shuffle: false,
        tags: Vec::new(),
    }))
}

pub(super) fn fn_range(start: Option<Val>, stop: Option<Val>, step: Option<Val>) -> PyResult<Val> {
    let mut start_n = val_number(start);
    let stop_n = match stop {
        Some(v) => val_number(Some(v)),
        None => {
            let s = start_n;
            start_n = Number::Int(0);
            s
        }
    };
    let step_n = match step {
        Some(v) => val_number(Some(v)),
        None => Number::Int(1),
    };
    Ok(Val::S(Sweep::Range {
        start: start_n,
        stop: stop_n,
        step: step_n,
        shuffle: false,
        tags: Vec::new(),
    }))
}

pub(super) fn fn_tag(mut args: Vec<Val>, sweep: Option<Val>) -> PyResult<Val> {
    if args.is_empty() {
        return py_err(
            "ValueError",
            "Not enough arguments to tag, must take at least a sweep",
        );
    }
    if let Some(s) = sweep {
        args.push(s);
    }
    let last = args.pop().expect("at least one argument");
    let mut sweep =
        match last {
            Val::S(s @ (Sweep::Choice { .. } | Sweep::Range { .. } | Sweep::Interval { .. })) => s,
            _ => return py_err(
                "ValueError",
                "Last argument to tag() must be a choice(), range() or interval(), got NoneType",
            ),
        };
    let mut new_tags = Vec::with_capacity(args.len());
    for a in &args {
        match a {
            Val::E(Element::Str(s)) => new_tags.push(s.clone()),
            other => {
                return py_err(
                    "ValueError",
                    format!(
                        "tag arguments type must be string, got {}",
                        type_name(other)
                    ),
                )
            }
        }
    }
    new_tags.sort();
    new_tags.dedup();
    match &mut sweep {
        Sweep::Choice { tags, .. } | Sweep::Range { tags, .. } | Sweep::Interval { tags, .. } => {
            *tags = new_tags
        }
        Sweep::Glob { .. } => {}
    }
    Ok(Val::S(sweep))
}

pub(super) fn fn_shuffle(
    args: Vec<Val>,
    sweep: Option<Val>,
    list: Option<Val>,
    rng: &mut Rng,
) -> PyResult<Val> {
    let one = |v: Val, rng: &mut Rng| -> PyResult<Val> {
        Ok(match v {
            Val::S(Sweep::Choice {
                items,
                simple_form,
                tags,
                ..
            }) => Val::S(Sweep::Choice {
                items,
                simple_form,
                shuffle: true,
                tags,
            }),
            Val::S(Sweep::Range {
                start,
                stop,
                step,
                tags,
                ..
            }) => Val::S(Sweep::Range {
                start,
                stop,
                step,
                shuffle: true,
                tags,
            }),
            Val::E(Element::List(mut items)) => {
                rng.shuffle(&mut items);
                Val::E(Element::List(items))
            }
            Val::E(e) => Val::E(Element::List(vec![e])),
            Val::S(_) | Val::G { .. } => return py_err("ValueError", NESTED_SWEEP),
        })
    };
    if let Some(l) = list {
        return one(l, rng);
    }
    if let Some(s) = sweep {
        return one(s, rng);
    }
    if args.len() == 1 {
        return one(args.into_iter().next().expect("one argument"), rng);
    }
    let mut choice = simple_choice(args)?;
    if let Sweep::Choice { shuffle, .. } = &mut choice {
        *shuffle = true;
    }
    Ok(Val::S(choice))
}

pub(super) fn fn_sort(
    args: Vec<Val>,
    sweep: Option<Val>,
    list: Option<Val>,
    reverse: bool,
) -> PyResult<Val> {
    if let Some(Val::E(Element::List(items))) = list {
        return Ok(Val::E(Element::List(py_sorted(items, reverse)?)));
    }
    if let Some(Val::S(s)) = sweep {
        return sort_sweep(s, reverse).map(Val::S);
    }
    if args.len() == 1 {
        return match args.into_iter().next().expect("one argument") {
            Val::S(s @ (Sweep::Choice { .. } | Sweep::Range { .. })) => {
                sort_sweep(s, reverse).map(Val::S)
            }
            Val::E(Element::List(items)) => Ok(Val::E(Element::List(py_sorted(items, reverse)?))),
            Val::E(e) => Ok(Val::E(e)),
            Val::S(_) | Val::G { .. } => py_err("TypeError", "Invalid arguments"),
        };
    }
    for a in &args {
        if !matches!(
            a,
            Val::E(Element::Bool(_) | Element::Int(_) | Element::Float(_) | Element::Str(_))
        ) {
            return py_err("TypeError", "Invalid arguments");
        }
    }
    if args.is_empty() {
        return py_err("ValueError", "empty sort input");
    }
    sort_sweep(simple_choice(args)?, reverse).map(Val::S)
}

/// `_sort_sweep`
fn sort_sweep(sweep: Sweep, reverse: bool) -> PyResult<Sweep> {
    match sweep {
        Sweep::Choice {
            items,
            simple_form,
            shuffle,
            tags,
        } => Ok(Sweep::Choice {
            items: py_sorted(items, reverse)?,
            simple_form,
            shuffle,
            tags,
        }),
        Sweep::Range {
            start,
            stop,
            step,
            shuffle,
            tags,
        } => {
            let flip = if reverse {
                num_cmp(start, stop) == Some(Ordering::Less)
            } else {
                num_cmp(start, stop) == Some(Ordering::Greater)
            };
            if !flip {
                return Ok(Sweep::Range {
                    start,
                    stop,
                    step,
                    shuffle,
                    tags,
                });
            }
            let abs_step = num_abs(step)?;
            let (new_start, new_stop) = if reverse {
                (num_sub(stop, abs_step)?, num_sub(start, abs_step)?)
            } else {
                (num_add(stop, abs_step)?, num_add(start, abs_step)?)
            };
            Ok(Sweep::Range {
                start: new_start,
                stop: new_stop,
                step: num_neg(step)?,
                shuffle,
                tags,
            })
        }
        other => Ok(other),
    }
}

fn overflow<T>() -> PyResult<T> {
    py_err("OverflowError", "integer arithmetic overflows 64 bits")
}

fn num_add(a: Number, b: Number) -> PyResult<Number> {
    match (a, b) {
        (Number::Int(x), Number::Int(y)) => {
            x.checked_add(y).map(Number::Int).map_or_else(overflow, Ok)
        }
        _ => Ok(Number::Float(a.as_f64() + b.as_f64())),
    }
}

fn num_sub(a: Number, b: Number) -> PyResult<Number> {
    match (a, b) {
        (Number::Int(x), Number::Int(y)) => {
            x.checked_sub(y).map(Number::Int).map_or_else(overflow, Ok)
        }
        _ => Ok(Number::Float(a.as_f64() - b.as_f64())),
    }
}

fn num_abs(a: Number) -> PyResult<Number> {
    match a {
        Number::Int(x) => x.checked_abs().map(Number::Int).map_or_else(overflow, Ok),
        Number::Float(f) => Ok(Number::Float(f.abs())),
    }
}

fn num_neg(a: Number) -> PyResult<Number> {
    match a {
        Number::Int(x) => x.checked_neg().map(Number::Int).map_or_else(overflow, Ok),
        Number::Float(f) => Ok(Number::Float(-f)),
    }
}

pub(super) fn fn_glob(include: Option<Val>, exclude: Option<Val>) -> PyResult<Val> {
    let patterns = |v: Option<Val>| -> Vec<Element> {
        match v {
            Some(Val::E(Element::List(items))) => items,
            Some(Val::E(e)) => vec![e],
            _ => Vec::new(),
        }
    };
    Ok(Val::G {
        include: patterns(include),
        exclude: patterns(exclude),
    })
}

/// The patterns of a glob sweep; Hydra's `fnmatch` fails on anything but plain strings.
pub(super) fn glob_patterns(items: Vec<Element>) -> Result<Vec<String>, String> {
    items
        .into_iter()
        .map(|e| match e {
            Element::Str(s) => Ok(s),
            other => Err(format!(
                "glob patterns must be plain strings, got {} \
                 (Hydra fails on this when the glob is expanded)",
                element_type_name(&other)
            )),
        })
        .collect()
}
