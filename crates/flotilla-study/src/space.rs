//! The search space of an adaptive sweep, built from overrides exactly as hydra-optuna-sweeper's
//! `create_params_from_overrides` builds Optuna distributions (its
//! `create_optuna_distribution_from_override`), and each [`Distribution`]'s two
//! representations: the internal one the samplers work in (a float; the index of a categorical
//! choice) and the external one a job receives (the value's override text: `trainer.lr=0.0031`,
//! `model=small`, `layers=4`).
//!
//! | override | distribution |
//! |---|---|
//! | `choice(a, b, ...)`, `a,b,...` | categorical over the items |
//! | `range(a, b)`, `range(a, b, step=s)` (ints) | `Int(a, b, step=s)`, `b` **included** |
//! | `range(...)` with any float | `Float(a, b, step=s)` (no step when `s` is 0) |
//! | `shuffle(range(...))` | categorical over the range's values |
//! | `interval(a, b)` | `Float(a, b)` |
//! | `int(interval(a, b))` | `Int(a, b)` |
//! | `tag(log, interval(a, b))` | the same with `log=True` |
//! | `key=value` | fixed: every trial gets `key=value` |
//! | `~key`, `~key=value` | fixed: passed on to every trial as written |
//!
//! Optuna's rules apply: `low <= high`; `step > 0`; a log domain needs `low > 0` (ints:
//! `low >= 1`) and no step; a `high` that is not on the step grid is lowered to the last grid
//! point (`range(0, 1, 0.3)` → `[0, 0.9]`, computed in decimal as Optuna does). A key that is
//! fixed anywhere is fixed (Hydra's sweeper drops it from the search space); for a key given
//! twice, the later value wins at the earlier position.
//!
//! Differences from the plugin, each where the plugin produces an override Hydra cannot read
//! back or behaves arbitrarily: a string choice is rendered escaped (`a\ b`, `'quoted'`) rather
//! than raw; a `choice` keeps its items in the order written (the plugin iterates a `shuffle`d
//! choice in random order, which only renumbers the categorical); a `shuffle(range(...))` is
//! enumerated with seed 0; `glob(...)` is refused (the plugin raises NotImplementedError).
//! flotilla's override parser keeps an interval's bounds as floats after `int(...)`, so whether
//! an interval is integral is read from the override text: the outermost `int(...)` or
//! `float(...)` around `interval(...)` decides, as Hydra's casts do.

use super::Params;
use flotilla_config::node::python_float_repr;
use flotilla_config::overrides::{parse_override_seeded, Number, Override, Sweep};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A search space's distribution over one parameter (Optuna's `FloatDistribution`,
/// `IntDistribution`, `CategoricalDistribution`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Distribution {
    /// Floats in `[low, high]`; on the grid `low + k·step` when `step` is set; sampled in log
    /// space when `log`.
    Float {
        low: f64,
        high: f64,
        log: bool,
        step: Option<f64>,
    },
    /// Integers `low, low+step, ..., high`; sampled in log space when `log` (then `step` is 1).
    Int {
        low: i64,
        high: i64,
        log: bool,
        step: i64,
    },
    /// One of `choices`, each the override text of a value (`small`, `3`, `True`, `'a b'`);
    /// internally its index.
    Categorical { choices: Vec<String> },
}

impl Distribution {
    /// Optuna's `FloatDistribution(low, high, log, step)`: validated, `high` lowered onto the
    /// step grid.
    pub fn float(low: f64, high: f64, log: bool, step: Option<f64>) -> Result<Self, String> {
        if log && step.is_some() {
            return Err("the parameter `step` is not supported when `log` is true".into());
        }
        if low.is_nan() || high.is_nan() || low > high {
            return Err(format!(
                "`low <= high` must hold, but got (low={}, high={})",
                python_float_repr(low),
                python_float_repr(high)
            ));
        }
        if !low.is_finite() || !high.is_finite() {
            return Err("the bounds must be finite".into());
        }
        if log && low <= 0.0 {
            return Err(format!(
                "`low > 0` must hold for a log domain, but got (low={}, high={})",
                python_float_repr(low),
                python_float_repr(high)
            ));
        }
        let mut high = high;
        if let Some(step) = step {
            if step.is_nan() || step <= 0.0 || !step.is_finite() {
                return Err(format!(
                    "`step > 0` must hold, but got step={}",
                    python_float_repr(step)
                ));
            }
            high = adjust_discrete_uniform_high(low, high, step);
        }
        Ok(Distribution::Float {
            low,
            high,
            log,
            step,
        })
    }

    /// Optuna's `IntDistribution(low, high, log, step)`: validated, `high` lowered onto the
    /// step grid.
    pub fn int(low: i64, high: i64, log: bool, step: i64) -> Result<Self, String> {
        if log && step != 1 {
            return Err("a log domain only accepts step 1".into());
        }
        if low > high {
            return Err(format!(
                "`low <= high` must hold, but got (low={low}, high={high})"
            ));
        }
        if log && low < 1 {
            return Err(format!(
                "`low >= 1` must hold for a log domain, but got (low={low}, high={high})"
            ));
        }
        if step <= 0 {
            return Err(format!("`step > 0` must hold, but got step={step}"));
        }
        let r = high as i128 - low as i128;
        let step_i = step as i128;
        let high = if r % step_i != 0 {
            (r / step_i * step_i + low as i128) as i64
        } else {
            high
        };
        Ok(Distribution::Int {
            low,
            high,
            log,
            step,
        })
    }

    /// Optuna's `CategoricalDistribution(choices)` over override texts.
    pub fn categorical(choices: Vec<String>) -> Result<Self, String> {
        if choices.is_empty() {
            return Err("a choice must contain one or more elements".into());
        }
        Ok(Distribution::Categorical { choices })
    }

    /// Does the distribution hold a single value (Optuna's `single()`)? Samplers give it that
    /// value without sampling.
    pub fn single(&self) -> bool {
        match *self {
            Distribution::Float {
                low, high, step, ..
            } => match step {
                None => low == high,
                Some(step) => low == high || decimal_less(high, low, step),
            },
            Distribution::Int {
                low,
                high,
                log,
                step,
            } => {
                if log {
                    low == high
                } else {
                    low == high || (high as i128 - low as i128) < step as i128
                }
            }
            Distribution::Categorical { ref choices } => choices.len() == 1,
        }
    }

    /// The value of a [`single`](Self::single) distribution, internally.
    pub fn single_value(&self) -> f64 {
        match *self {
            Distribution::Float { low, .. } => low,
            Distribution::Int { low, .. } => low as f64,
            Distribution::Categorical { .. } => 0.0,
        }
    }

    /// Is `internal` a value of this distribution (Optuna's `_contains`)?
    pub fn contains(&self, internal: f64) -> bool {
        match *self {
            Distribution::Float {
                low, high, step, ..
            } => match step {
                None => low <= internal && internal <= high,
                Some(step) => {
                    let k = (internal - low) / step;
                    low <= internal && internal <= high && (k - k.round_ties_even()).abs() < 1e-8
                }
            },
            Distribution::Int {
                low, high, step, ..
            } => {
                internal.fract() == 0.0
                    && low as f64 <= internal
                    && internal <= high as f64
                    && ((internal as i64 - low) % step) == 0
            }
            Distribution::Categorical { ref choices } => {
                internal >= 0.0 && internal.fract() == 0.0 && (internal as usize) < choices.len()
            }
        }
    }

    /// The value as override text: Python's `str()` of a float (`0.0031`, `1e-05`), an int
    /// without a decimal point (Optuna's `int()` of the internal float), a categorical
    /// choice's text.
    pub fn to_external(&self, internal: f64) -> String {
        match self {
            Distribution::Float { .. } => python_float_repr(internal),
            Distribution::Int { .. } => (internal as i64).to_string(),
            Distribution::Categorical { choices } => {
                let i = (internal.max(0.0) as usize).min(choices.len() - 1);
                choices[i].clone()
            }
        }
    }

    /// A short description: `float [1e-05, 1.0] log`, `int [1, 8] step 1`, `choice(a, b)`.
    pub fn describe(&self) -> String {
        match self {
            Distribution::Float {
                low,
                high,
                log,
                step,
            } => {
                let mut s = format!(
                    "float [{}, {}]",
                    python_float_repr(*low),
                    python_float_repr(*high)
                );
                if *log {
                    s.push_str(" log");
                }
                if let Some(step) = step {
                    s.push_str(&format!(" step {}", python_float_repr(*step)));
                }
                s
            }
            Distribution::Int {
                low,
                high,
                log,
                step,
            } => {
                let mut s = format!("int [{low}, {high}]");
                if *log {
                    s.push_str(" log");
                }
                if *step != 1 {
                    s.push_str(&format!(" step {step}"));
                }
                s
            }
            Distribution::Categorical { choices } => format!("choice({})", choices.join(", ")),
        }
    }
}

/// One parameter of the space: the override key (as Hydra's `get_key_element()` writes it:
/// `trainer.lr`, `+extra`, `db@pkg`) and its distribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Param {
    pub name: String,
    pub distribution: Distribution,
}

impl Param {
    /// `name=value` for the value `internal`.
    pub fn override_text(&self, internal: f64) -> String {
        format!("{}={}", self.name, self.distribution.to_external(internal))
    }
}

/// The parameters to sample, in the order first given, and the overrides every trial gets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchSpace {
    pub params: Vec<Param>,
    /// `key=value` for each fixed key (in the order first given), then the delete overrides
    /// as written.
    pub fixed: Vec<String>,
}

/// An override that cannot be part of a search space, with the override's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("search space override '{input}': {message}")]
pub struct SpaceError {
    pub input: String,
    pub message: String,
}

impl SearchSpace {
    /// The space described by `overrides` (`flotilla.sweeper.params` rendered as `key=value`,
    /// then a sweep file's, then the command line's), as hydra-optuna-sweeper builds it.
    pub fn from_overrides<S: AsRef<str>>(overrides: &[S]) -> Result<SearchSpace, SpaceError> {
        let mut search: IndexMap<String, Distribution> = IndexMap::new();
        let mut fixed: IndexMap<String, String> = IndexMap::new();
        let mut deletes = Vec::new();
        for text in overrides {
            let text = text.as_ref();
            let o = parse_override_seeded(text, 0).map_err(|e| SpaceError {
                input: text.to_string(),
                message: match e.column() {
                    Some(c) => format!("{} at column {c}", e.message()),
                    None => e.message().to_string(),
                },
            })?;
            if o.is_delete() {
                deletes.push(o.input.clone());
                continue;
            }
            let name = o.key_element();
            match distribution_of(&o).map_err(|message| SpaceError {
                input: text.to_string(),
                message,
            })? {
                Some(d) => {
                    search.insert(name, d);
                }
                None => {
                    fixed.insert(name, o.value_element_as_str());
                }
            }
        }
        for name in fixed.keys() {
            search.shift_remove(name);
        }
        Ok(SearchSpace {
            params: search
                .into_iter()
                .map(|(name, distribution)| Param { name, distribution })
                .collect(),
            fixed: fixed
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .chain(deletes)
                .collect(),
        })
    }

    /// The parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// A trial's overrides: each sampled param (in the space's order) as `name=value`, then the
    /// fixed ones. Params missing from `params` are left out.
    pub fn overrides(&self, params: &Params) -> Vec<String> {
        self.params
            .iter()
            .filter_map(|p| params.get(&p.name).map(|v| p.override_text(*v)))
            .chain(self.fixed.iter().cloned())
            .collect()
    }

    /// One line per parameter (`name: description`), then the fixed overrides.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for p in &self.params {
            out.push_str(&format!("{}: {}\n", p.name, p.distribution.describe()));
        }
        for f in &self.fixed {
            out.push_str(&format!("fixed: {f}\n"));
        }
        out
    }
}

impl fmt::Display for SearchSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// The distribution of a sweep override; `None` for a plain value (a fixed param).
fn distribution_of(o: &Override) -> Result<Option<Distribution>, String> {
    let Some(sweep) = o.sweep() else {
        return Ok(None);
    };
    match sweep {
        Sweep::Choice { items, .. } => {
            Distribution::categorical(items.iter().map(|e| e.as_override_str()).collect()).map(Some)
        }
        Sweep::Range {
            start,
            stop,
            step,
            shuffle,
            ..
        } => {
            if *shuffle {
                let values = o
                    .sweep_value_strings_seeded(&[], 0)
                    .map_err(|e| e.message().to_string())?;
                return Distribution::categorical(values).map(Some);
            }
            let is_float = |n: &Number| matches!(n, Number::Float(_));
            if is_float(start) || is_float(stop) || is_float(step) {
                let s = step.as_f64();
                let step = if s == 0.0 { None } else { Some(s) };
                Distribution::float(start.as_f64(), stop.as_f64(), false, step).map(Some)
            } else {
                let int = |n: &Number| match n {
                    Number::Int(i) => *i,
                    Number::Float(f) => *f as i64,
                };
                Distribution::int(int(start), int(stop), false, int(step)).map(Some)
            }
        }
        Sweep::Interval { start, end, tags } => {
            let log = tags.iter().any(|t| t == "log");
            if interval_is_int(&o.raw_value_text()) {
                let (lo, hi) = (*start, *end);
                if lo.fract() != 0.0 || hi.fract() != 0.0 || !lo.is_finite() || !hi.is_finite() {
                    return Err("an int interval needs integral bounds".into());
                }
                Distribution::int(lo as i64, hi as i64, log, 1).map(Some)
            } else {
                Distribution::float(*start, *end, log, None).map(Some)
            }
        }
        Sweep::Glob { .. } => Err(
            "glob() is not supported in a search space; list the options with choice(...)".into(),
        ),
    }
}

/// Whether the `interval(...)` in an override's value text ends up with int bounds: the
/// outermost `int(...)` or `float(...)` enclosing it decides (Hydra's casts apply inside out).
fn interval_is_int(text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let mut stack: Vec<String> = Vec::new();
    let mut quote: Option<char> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if let Some(q) = quote {
            if c == '\\' {
                i += 2;
                continue;
            }
            if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            '\\' => {
                i += 2;
                continue;
            }
            '\'' | '"' => quote = Some(c),
            '(' => {
                let mut j = i;
                while j > 0 && chars[j - 1].is_whitespace() {
                    j -= 1;
                }
                let end = j;
                while j > 0 && (chars[j - 1].is_alphanumeric() || chars[j - 1] == '_') {
                    j -= 1;
                }
                let name: String = chars[j..end].iter().collect();
                if name == "interval" {
                    return stack
                        .iter()
                        .find(|n| *n == "int" || *n == "float")
                        .is_some_and(|n| n == "int");
                }
                stack.push(name);
            }
            ')' => {
                stack.pop();
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// A decimal `m·10^e`: Python's `Decimal(str(x))` of a float.
#[derive(Clone, Copy, Debug)]
struct Dec {
    m: i128,
    e: i32,
}

fn dec(x: f64) -> Option<Dec> {
    if !x.is_finite() {
        return None;
    }
    let s = python_float_repr(x);
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s.as_str(), 0),
    };
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mant),
    };
    let (int_part, frac_part) = match mant.find('.') {
        Some(i) => (&mant[..i], &mant[i + 1..]),
        None => (mant, ""),
    };
    let digits = format!("{int_part}{frac_part}");
    let m: i128 = digits.parse().ok()?;
    Some(Dec {
        m: if neg { -m } else { m },
        e: exp - frac_part.len() as i32,
    })
}

/// The mantissas of `xs` at their smallest exponent.
fn align<const N: usize>(xs: [Dec; N]) -> Option<([i128; N], i32)> {
    let e = xs.iter().map(|d| d.e).min()?;
    let mut out = [0i128; N];
    for (o, d) in out.iter_mut().zip(xs) {
        let scale = 10i128.checked_pow(u32::try_from(d.e - e).ok()?)?;
        *o = d.m.checked_mul(scale)?;
    }
    Some((out, e))
}

fn dec_to_f64(m: i128, e: i32) -> f64 {
    format!("{m}e{e}").parse().unwrap_or(f64::NAN)
}

/// Optuna's `_adjust_discrete_uniform_high`: when `high − low` is not a multiple of `step` (in
/// decimal, from the floats' shortest representations), `high` becomes the last grid point.
fn adjust_discrete_uniform_high(low: f64, high: f64, step: f64) -> f64 {
    let exact = (|| {
        let ([l, h, s], e) = align([dec(low)?, dec(high)?, dec(step)?])?;
        let r = h.checked_sub(l)?;
        if r % s == 0 {
            return Some(high);
        }
        Some(dec_to_f64((r / s).checked_mul(s)?.checked_add(l)?, e))
    })();
    exact.unwrap_or_else(|| {
        let k = ((high - low) / step).floor();
        if k * step + low == high {
            high
        } else {
            k * step + low
        }
    })
}

/// `high − low < step`, in decimal.
fn decimal_less(high: f64, low: f64, step: f64) -> bool {
    (|| {
        let ([l, h, s], _) = align([dec(low)?, dec(high)?, dec(step)?])?;
        Some(h.checked_sub(l)? < s)
    })()
    .unwrap_or(high - low < step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(overrides: &[&str]) -> SearchSpace {
        SearchSpace::from_overrides(overrides).unwrap()
    }

    fn one(o: &str) -> Distribution {
        let s = space(&[o]);
        assert_eq!(s.params.len(), 1, "{o}");
        s.params[0].distribution.clone()
    }

    fn err(o: &str) -> String {
        SearchSpace::from_overrides(&[o]).unwrap_err().to_string()
    }

    #[test]
    fn choices_become_categoricals_of_override_texts() {
        let d = one("model=choice(small, large)");
        assert_eq!(
            d,
            Distribution::Categorical {
                choices: vec!["small".into(), "large".into()]
            }
        );
        let d = one("x=1,2.5,true,null,'a b',[1,2]");
        assert_eq!(
            d,
            Distribution::Categorical {
                choices: vec![
                    "1".into(),
                    "2.5".into(),
                    "True".into(),
                    "null".into(),
                    "'a b'".into(),
                    "[1,2]".into()
                ]
            }
        );
        let s = space(&["model=choice(small,large)"]);
        assert_eq!(s.params[0].override_text(1.0), "model=large");
        assert_eq!(s.params[0].name, "model");
    }

    #[test]
    fn ranges_include_their_stop_and_take_optunas_types() {
        assert_eq!(
            one("layers=range(1,5)"),
            Distribution::Int {
                low: 1,
                high: 5,
                log: false,
                step: 1
            }
        );
        assert_eq!(
            one("bs=range(8, 64, step=8)"),
            Distribution::Int {
                low: 8,
                high: 64,
                log: false,
                step: 8
            }
        );
        // Off the grid: Optuna lowers high to the last grid point 1 + 3k <= 8, which is 7.
        assert_eq!(
            one("n=range(1,8,3)"),
            Distribution::Int {
                low: 1,
                high: 7,
                log: false,
                step: 3
            }
        );
        assert_eq!(
            one("p=range(0.1, 0.5, 0.1)"),
            Distribution::Float {
                low: 0.1,
                high: 0.5,
                log: false,
                step: Some(0.1)
            }
        );
        // Decimal arithmetic: 1.0 − 0.0 is not a multiple of 0.3; high becomes 0.9.
        assert_eq!(
            one("p=range(0, 1.0, 0.3)"),
            Distribution::Float {
                low: 0.0,
                high: 0.9,
                log: false,
                step: Some(0.3)
            }
        );
        // range(5) starts at 0.
        assert_eq!(
            one("k=range(5)"),
            Distribution::Int {
                low: 0,
                high: 5,
                log: false,
                step: 1
            }
        );
        // A shuffled range is a categorical over its values.
        match one("k=shuffle(range(3))") {
            Distribution::Categorical { mut choices } => {
                choices.sort();
                assert_eq!(choices, vec!["0", "1", "2"]);
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn intervals_are_floats_ints_and_log_domains() {
        assert_eq!(
            one("lr=interval(0, 1)"),
            Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None
            }
        );
        assert_eq!(
            one("n=int(interval(1, 8))"),
            Distribution::Int {
                low: 1,
                high: 8,
                log: false,
                step: 1
            }
        );
        assert_eq!(
            one("n=int(interval(1.7, 8.2))"),
            Distribution::Int {
                low: 1,
                high: 8,
                log: false,
                step: 1
            }
        );
        assert_eq!(
            one("lr=tag(log, interval(1e-5, 1))"),
            Distribution::Float {
                low: 1e-5,
                high: 1.0,
                log: true,
                step: None
            }
        );
        assert_eq!(
            one("w=tag(log, int(interval(1, 1024)))"),
            Distribution::Int {
                low: 1,
                high: 1024,
                log: true,
                step: 1
            }
        );
        assert_eq!(
            one("w=int(tag(log, interval(2, 64)))"),
            Distribution::Int {
                low: 2,
                high: 64,
                log: true,
                step: 1
            }
        );
        // The outermost cast decides.
        assert!(matches!(
            one("w=float(int(interval(1.5, 9.5)))"),
            Distribution::Float { low, high, .. } if low == 1.0 && high == 9.0
        ));
    }

    #[test]
    fn plain_values_and_deletes_are_fixed() {
        let s = space(&[
            "trainer.lr=tag(log, interval(1e-5, 1))",
            "seed=3",
            "~trainer.clip",
            "+extra=a\\ b",
            "model=choice(small,large)",
        ]);
        assert_eq!(
            s.params.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            vec!["trainer.lr", "model"]
        );
        assert_eq!(s.fixed, vec!["seed=3", "+extra=a\\ b", "~trainer.clip"]);
        let params = Params::from([("trainer.lr".to_string(), 0.0031), ("model".into(), 0.0)]);
        assert_eq!(
            s.overrides(&params),
            vec![
                "trainer.lr=0.0031",
                "model=small",
                "seed=3",
                "+extra=a\\ b",
                "~trainer.clip"
            ]
        );
    }

    #[test]
    fn a_key_fixed_anywhere_is_fixed_and_later_sweeps_replace_earlier() {
        let s = space(&["lr=interval(0,1)", "lr=0.1"]);
        assert!(s.params.is_empty());
        assert_eq!(s.fixed, vec!["lr=0.1"]);
        let s = space(&["lr=0.1", "lr=interval(0,1)"]);
        assert!(s.params.is_empty());
        let s = space(&["a=interval(0,1)", "b=range(1,3)", "a=choice(x,y)"]);
        assert_eq!(s.params[0].name, "a");
        assert!(matches!(
            s.params[0].distribution,
            Distribution::Categorical { .. }
        ));
    }

    #[test]
    fn external_representations() {
        let f = Distribution::float(1e-5, 1.0, true, None).unwrap();
        assert_eq!(f.to_external(0.0031), "0.0031");
        assert_eq!(f.to_external(1e-5), "1e-05");
        assert_eq!(f.to_external(1.0), "1.0");
        let i = Distribution::int(1, 8, false, 1).unwrap();
        assert_eq!(i.to_external(4.0), "4");
        assert_eq!(i.to_external(-0.0), "0");
        assert!(i.contains(3.0) && !i.contains(3.5) && !i.contains(9.0));
        let s = Distribution::float(0.0, 1.0, false, Some(0.25)).unwrap();
        assert!(s.contains(0.75) && !s.contains(0.7));
        assert_eq!(
            f.describe(),
            "float [1e-05, 1.0] log",
            "describe shows the domain"
        );
    }

    #[test]
    fn single_distributions() {
        assert!(Distribution::float(1.0, 1.0, false, None).unwrap().single());
        assert!(Distribution::float(0.0, 0.2, false, Some(0.3))
            .unwrap()
            .single());
        assert!(!Distribution::float(0.0, 0.3, false, Some(0.3))
            .unwrap()
            .single());
        assert!(Distribution::int(2, 4, false, 3).unwrap().single());
        assert!(Distribution::categorical(vec!["a".into()])
            .unwrap()
            .single());
        assert!(!Distribution::int(2, 5, false, 3).unwrap().single());
    }

    #[test]
    fn bad_overrides_are_refused_naming_the_override() {
        let e = err("lr=interval(1, 0)");
        assert!(
            e.contains("'lr=interval(1, 0)'") && e.contains("low <= high"),
            "{e}"
        );
        let e = err("lr=tag(log, interval(0, 1))");
        assert!(e.contains("low > 0"), "{e}");
        let e = err("n=tag(log, int(interval(0, 8)))");
        assert!(e.contains("low >= 1"), "{e}");
        let e = err("n=range(1, 5, 0)");
        assert!(
            e.contains("step > 0") && e.contains("'n=range(1, 5, 0)'"),
            "{e}"
        );
        let e = err("n=range(5, 1)");
        assert!(e.contains("low <= high"), "{e}");
        let e = err("opt=glob(a*)");
        assert!(e.contains("glob") && e.contains("'opt=glob(a*)'"), "{e}");
        let e = err("lr=interval(0,");
        assert!(e.contains("'lr=interval(0,'"), "{e}");
        let e = err("lr=float(interval(0, 1)");
        assert!(
            e.starts_with("search space override 'lr=float(interval(0, 1)'"),
            "{e}"
        );
        // A float range with step 0 is continuous (the plugin's `if value.step`).
        assert_eq!(
            one("p=range(0.0, 1.0, 0.0)"),
            Distribution::Float {
                low: 0.0,
                high: 1.0,
                log: false,
                step: None
            }
        );
    }

    #[test]
    fn interval_casts_are_read_from_the_text() {
        assert!(interval_is_int("int(interval(1,2))"));
        assert!(interval_is_int("tag(log, int(value=interval(1,2)))"));
        assert!(!interval_is_int("interval(1,2)"));
        assert!(!interval_is_int("float(int(interval(1,2)))"));
        assert!(interval_is_int("int(float(interval(1,2)))"));
        assert!(!interval_is_int("tag('int(', interval(1,2))"));
    }

    #[test]
    fn decimal_high_adjustment_matches_optuna() {
        // Values from optuna 5.0.0: FloatDistribution(low, high, step=s).high.
        assert_eq!(adjust_discrete_uniform_high(0.0, 1.0, 0.3), 0.9);
        assert_eq!(adjust_discrete_uniform_high(0.1, 1.0, 0.2), 0.9);
        assert_eq!(adjust_discrete_uniform_high(0.1, 0.7, 0.1), 0.7);
        assert_eq!(adjust_discrete_uniform_high(-1.0, 1.05, 0.5), 1.0);
        assert_eq!(adjust_discrete_uniform_high(1e-5, 1e-3, 1e-4), 0.00091);
        assert_eq!(adjust_discrete_uniform_high(0.0, 3.3, 1.1), 3.3);
    }
}
