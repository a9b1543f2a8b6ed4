//! The grammar functions' registry (Hydra's `grammar/functions.py`): the Python signature of
//! each function, binding arguments to it as `inspect.Signature.bind` does, Hydra's argument
//! type checks, and the dispatch to the bodies in `grammar_functions`.

use super::grammar_functions::{
    fn_cast, fn_choice, fn_glob, fn_range, fn_shuffle, fn_sort, fn_tag, val_number, Cast,
};
use super::python::{py_err, PyResult};
use super::types::{Element, Sweep};
use super::value::{type_name, Ctx, Val};

/// The grammar functions Hydra 1.3.8 registers, sorted (as in its "Available:" message).
const FUNCTION_NAMES: [&str; 11] = [
    "bool", "choice", "float", "glob", "int", "interval", "range", "shuffle", "sort", "str", "tag",
];

const T_NONE: u16 = 1;
const T_BOOL: u16 = 1 << 1;
const T_INT: u16 = 1 << 2;
const T_FLOAT: u16 = 1 << 3;
const T_STR: u16 = 1 << 4;
const T_LIST: u16 = 1 << 5;
const T_DICT: u16 = 1 << 6;
const T_QUOTED: u16 = 1 << 7;
const T_CHOICE: u16 = 1 << 8;
const T_RANGE: u16 = 1 << 9;
const T_INTERVAL: u16 = 1 << 10;
const T_GLOB: u16 = 1 << 11;

const T_NUMBER: u16 = T_INT | T_FLOAT;
const T_SWEEP: u16 = T_CHOICE | T_RANGE | T_INTERVAL;
/// `CastType = Union[ParsedElementType, Sweep]`
const T_CAST: u16 =
    T_NONE | T_BOOL | T_INT | T_FLOAT | T_STR | T_LIST | T_DICT | T_QUOTED | T_SWEEP;
/// `Union[ElementType, ChoiceSweep, RangeSweep]` (`sort`, `shuffle`)
const T_SORTABLE: u16 = T_STR | T_INT | T_BOOL | T_FLOAT | T_LIST | T_DICT | T_CHOICE | T_RANGE;

#[derive(Clone, Copy, PartialEq, Eq)]
enum ParamKind {
    Positional,
    VarPositional,
    KeywordOnly,
}

struct Param {
    name: &'static str,
    kind: ParamKind,
    has_default: bool,
    /// Accepted types; `bool` passes where `int` does (Python's isinstance) unless `strict`.
    types: u16,
    strict: bool,
    annotation: &'static str,
}

const fn param(
    name: &'static str,
    kind: ParamKind,
    has_default: bool,
    types: u16,
    annotation: &'static str,
) -> Param {
    Param {
        name,
        kind,
        has_default,
        types,
        strict: false,
        annotation,
    }
}

const CAST_SIG: [Param; 2] = [
    param("args", ParamKind::VarPositional, false, T_CAST, "CastType"),
    param(
        "value",
        ParamKind::KeywordOnly,
        true,
        T_CAST,
        "Optional[CastType]",
    ),
];
const CHOICE_SIG: [Param; 1] = [param(
    "args",
    ParamKind::VarPositional,
    false,
    T_STR | T_INT | T_FLOAT | T_BOOL | T_DICT | T_LIST | T_CHOICE,
    "Union[str, int, float, bool, Dict[Any, Any], List[Any], ChoiceSweep]",
)];
const RANGE_SIG: [Param; 3] = [
    param(
        "start",
        ParamKind::Positional,
        false,
        T_NUMBER,
        "Union[int, float]",
    ),
    param(
        "stop",
        ParamKind::Positional,
        true,
        T_NUMBER | T_NONE,
        "Optional[Union[int, float]]",
    ),
    param(
        "step",
        ParamKind::Positional,
        true,
        T_NUMBER,
        "Union[int, float]",
    ),
];
const INTERVAL_SIG: [Param; 2] = [
    param(
        "start",
        ParamKind::Positional,
        false,
        T_NUMBER,
        "Union[int, float]",
    ),
    param(
        "end",
        ParamKind::Positional,
        false,
        T_NUMBER,
        "Union[int, float]",
    ),
];
const TAG_SIG: [Param; 2] = [
    param(
        "args",
        ParamKind::VarPositional,
        false,
        T_STR | T_SWEEP,
        "Union[str, Sweep]",
    ),
    param(
        "sweep",
        ParamKind::KeywordOnly,
        true,
        T_SWEEP | T_NONE,
        "Optional[Sweep]",
    ),
];
const SHUFFLE_SIG: [Param; 3] = [
    param(
        "args",
        ParamKind::VarPositional,
        false,
        T_SORTABLE,
        "Union[str, int, bool, float, list, dict, ChoiceSweep, RangeSweep]",
    ),
    param(
        "sweep",
        ParamKind::KeywordOnly,
        true,
        T_CHOICE | T_RANGE | T_NONE,
        "Optional[Union[ChoiceSweep, RangeSweep]]",
    ),
    param(
        "list",
        ParamKind::KeywordOnly,
        true,
        T_LIST | T_NONE,
        "Optional[List[Any]]",
    ),
];
const SORT_SIG: [Param; 4] = [
    param(
        "args",
        ParamKind::VarPositional,
        false,
        T_SORTABLE,
        "Union[str, int, bool, float, list, dict, ChoiceSweep, RangeSweep]",
    ),
    param(
        "sweep",
        ParamKind::KeywordOnly,
        true,
        T_CHOICE | T_RANGE | T_NONE,
        "Optional[Union[ChoiceSweep, RangeSweep]]",
    ),
    param(
        "list",
        ParamKind::KeywordOnly,
        true,
        T_LIST | T_NONE,
        "Optional[List[Any]]",
    ),
    Param {
        name: "reverse",
        kind: ParamKind::KeywordOnly,
        has_default: true,
        types: T_BOOL,
        strict: true,
        annotation: "bool",
    },
];
const GLOB_SIG: [Param; 2] = [
    param(
        "include",
        ParamKind::Positional,
        false,
        T_LIST | T_STR,
        "Union[List[str], str]",
    ),
    param(
        "exclude",
        ParamKind::Positional,
        true,
        T_LIST | T_STR | T_NONE,
        "Optional[Union[List[str], str]]",
    ),
];

fn type_bit(v: &Val) -> u16 {
    match v {
        Val::E(Element::Null) => T_NONE,
        Val::E(Element::Bool(_)) => T_BOOL,
        Val::E(Element::Int(_)) => T_INT,
        Val::E(Element::Float(_)) => T_FLOAT,
        Val::E(Element::Str(_)) => T_STR,
        Val::E(Element::Quoted { .. }) => T_QUOTED,
        Val::E(Element::List(_)) => T_LIST,
        Val::E(Element::Dict(_)) => T_DICT,
        Val::S(Sweep::Choice { .. }) => T_CHOICE,
        Val::S(Sweep::Range { .. }) => T_RANGE,
        Val::S(Sweep::Interval { .. }) => T_INTERVAL,
        Val::S(Sweep::Glob { .. }) | Val::G { .. } => T_GLOB,
    }
}

fn type_matches(v: &Val, p: &Param) -> bool {
    let bit = type_bit(v);
    p.types & bit != 0 || (!p.strict && bit == T_BOOL && p.types & T_INT != 0)
}

/// Arguments bound to a signature's parameters (`None` where a parameter was not given).
struct Bound {
    values: Vec<Option<Val>>,
    var: Vec<Val>,
}

impl Bound {
    fn take(&mut self, sig: &[Param], name: &str) -> Option<Val> {
        let i = sig.iter().position(|p| p.name == name)?;
        self.values[i].take()
    }

    /// The value of an `Optional` parameter, with an explicit `null` meaning "not given".
    fn take_given(&mut self, sig: &[Param], name: &str) -> Option<Val> {
        match self.take(sig, name) {
            Some(Val::E(Element::Null)) | None => None,
            v => v,
        }
    }
}

/// `inspect.Signature.bind` followed by Hydra's argument type checks.
fn bind(sig: &[Param], args: Vec<Val>, mut kwargs: Vec<(String, Val)>) -> PyResult<Bound> {
    let mut values: Vec<Option<Val>> = sig.iter().map(|_| None).collect();
    let mut var = Vec::new();
    let mut order: Vec<usize> = Vec::new();
    let n_args = args.len();
    let mut args = args.into_iter();
    let mut pi = 0;
    let mut keyword_from = sig.len();
    let mut consumed = 0;
    loop {
        if consumed == n_args {
            // No more positional arguments.
            if pi >= sig.len() {
                break;
            }
            let p = &sig[pi];
            if p.kind == ParamKind::VarPositional {
                keyword_from = pi + 1;
                break;
            }
            if kwargs.iter().any(|(k, _)| k == p.name) || p.has_default {
                keyword_from = pi;
                break;
            }
            return py_err(
                "TypeError",
                format!("missing a required argument: '{}'", p.name),
            );
        }
        if pi >= sig.len() || sig[pi].kind == ParamKind::KeywordOnly {
            return py_err("TypeError", "too many positional arguments");
        }
        let p = &sig[pi];
        if p.kind == ParamKind::VarPositional {
            var.extend(args.by_ref());
            order.push(pi);
            keyword_from = pi + 1;
            break;
        }
        if kwargs.iter().any(|(k, _)| k == p.name) {
            return py_err(
                "TypeError",
                format!("multiple values for argument '{}'", p.name),
            );
        }
        values[pi] = args.next();
        consumed += 1;
        order.push(pi);
        pi += 1;
    }
    for (i, p) in sig.iter().enumerate().skip(keyword_from) {
        if p.kind == ParamKind::VarPositional {
            continue;
        }
        match kwargs.iter().position(|(k, _)| k == p.name) {
            Some(k) => {
                values[i] = Some(kwargs.remove(k).1);
                order.push(i);
            }
            None if !p.has_default => {
                return py_err(
                    "TypeError",
                    format!("missing a required argument: '{}'", p.name),
                )
            }
            None => {}
        }
    }
    if let Some((k, _)) = kwargs.first() {
        return py_err(
            "TypeError",
            format!("got an unexpected keyword argument '{k}'"),
        );
    }
    for i in order {
        let p = &sig[i];
        if p.kind == ParamKind::VarPositional {
            for (j, v) in var.iter().enumerate() {
                if !type_matches(v, p) {
                    return py_err(
                        "TypeError",
                        format!(
                            "mismatch type argument {}[{j}]: {} is incompatible with {}",
                            p.name,
                            type_name(v),
                            p.annotation
                        ),
                    );
                }
            }
        } else if let Some(v) = &values[i] {
            if !type_matches(v, p) {
                return py_err(
                    "TypeError",
                    format!(
                        "mismatch type argument {}: {} is incompatible with {}",
                        p.name,
                        type_name(v),
                        p.annotation
                    ),
                );
            }
        }
    }
    Ok(Bound { values, var })
}

pub(super) fn call_function(
    name: &str,
    args: Vec<Val>,
    kwargs: Vec<(String, Val)>,
    ctx: &mut Ctx,
) -> PyResult<Val> {
    let sig: &[Param] = match name {
        "int" | "float" | "str" | "bool" => &CAST_SIG,
        "choice" => &CHOICE_SIG,
        "range" => &RANGE_SIG,
        "interval" => &INTERVAL_SIG,
        "tag" => &TAG_SIG,
        "shuffle" => &SHUFFLE_SIG,
        "sort" => &SORT_SIG,
        "glob" => &GLOB_SIG,
        _ => {
            return py_err(
                "HydraException",
                format!(
                    "Unknown function '{name}'\nAvailable: {}\n",
                    FUNCTION_NAMES.join(",")
                ),
            )
        }
    };
    let mut b = bind(sig, args, kwargs)?;
    match name {
        "int" | "float" | "str" | "bool" => {
            let kind = match name {
                "int" => Cast::Int,
                "float" => Cast::Float,
                "str" => Cast::Str,
                _ => Cast::Bool,
            };
            let value = b.take_given(sig, "value");
            fn_cast(kind, b.var, value, ctx)
        }
        "choice" => fn_choice(b.var, ctx),
        "range" => {
            let start = b.take(sig, "start");
            let stop = b.take_given(sig, "stop");
            let step = b.take(sig, "step");
            fn_range(start, stop, step)
        }
        "interval" => {
            let start = b.take(sig, "start");
            let end = b.take(sig, "end");
            Ok(Val::S(Sweep::Interval {
                start: val_number(start).as_f64(),
                end: val_number(end).as_f64(),
                tags: Vec::new(),
            }))
        }
        "tag" => {
            let sweep = b.take_given(sig, "sweep");
            fn_tag(b.var, sweep)
        }
        "shuffle" => {
            let sweep = b.take_given(sig, "sweep");
            let list = b.take_given(sig, "list");
            fn_shuffle(b.var, sweep, list, &mut ctx.rng)
        }
        "sort" => {
            let sweep = b.take_given(sig, "sweep");
            let list = b.take_given(sig, "list");
            let reverse = matches!(b.take(sig, "reverse"), Some(Val::E(Element::Bool(true))));
            fn_sort(b.var, sweep, list, reverse)
        }
        _ => {
            let include = b.take(sig, "include");
            let exclude = b.take_given(sig, "exclude");
            fn_glob(include, exclude)
        }
    }
}
