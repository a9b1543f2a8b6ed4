//! Hydra 1.3's command-line override grammar, re-implemented to match hydra-core 1.3.8.
//!
//! This module owns turning one override string (`trainer.lr=1e-4`, `+a=[1,2]`, `++b={x:1}`,
//! `~c`, `db@pkg=mysql`, `lr=0.1,0.01`, `seed=range(3)`, `opt=glob(a*)`, ...) into an
//! [`Override`]: a hand-written lexer with Hydra's two lexical modes (key, value) and the
//! longest-match/first-rule token choice of `OverrideLexer.g4`, a recursive-descent parser for
//! the language of `OverrideParser.g4`, and an evaluator that types primitives, un-escapes and
//! runs the grammar functions (`choice`, `range`, `interval`, `glob`, `sort`, `shuffle`, `tag`,
//! `int`, `float`, `str`, `bool`) the way Hydra's visitor does. It also renders values back
//! into override syntax ([`Element::as_override_str`], Hydra's `_get_value_element_as_str`),
//! converts them to config values ([`Element::to_value`]) and enumerates discrete sweeps
//! exactly as Hydra's BasicSweeper does ([`Override::sweep_value_strings`], including float
//! ranges computed with Python's 28-digit `decimal` arithmetic and `fnmatch` globs).
//! Applying overrides to a config and listing config-group options belong to other modules.
//!
//! Deliberate differences from Hydra, each a case where Hydra fails later or cannot finish:
//! * integers outside `i64` are rejected (Python keeps big integers);
//! * a sweep nested in a list, dict or choice that survives into the final value
//!   (`[choice(1,2)]`, `choice(1,choice(2,3))`, `a,range(1,3)`), and a glob sweep whose
//!   patterns are not plain strings (`glob(['a*'])`), are rejected when parsing; Hydra accepts
//!   them and fails when the value is rendered, applied or expanded. (A `glob` nested in a value
//!   is supported: Hydra, and this module, turn it into `{include: [...], exclude: [...]}`.)
//! * nesting deeper than 400 levels is rejected (Hydra hits Python's recursion limit a little
//!   further on); a sweep with more than 1,000,000 values is rejected (Hydra would try to
//!   build it, or never finish for an endless float range);
//! * `shuffle` uses this module's own seeded generator, so shuffled orders differ from
//!   Python's `random` (the `*_seeded` entry points make them reproducible);
//! * dictionary keys are strings: Hydra's typed keys `1`, `1.5`, `true`, `null` become `"1"`,
//!   `"1.5"`, `"True"`, `"null"`, which is what Hydra prints for them; an interval cast with
//!   `int()` keeps its bounds as `f64`;
//! * `sort` of 64 or more items holding NaN may order them differently (CPython's timsort is
//!   reproduced exactly below 64 items only; without NaN any stable sort agrees);
//! * error messages are this module's own: they name the override, the problem and the
//!   0-based column, rather than repeating ANTLR's wording.
//!
//! Where things live:
//! * `types` — the public types ([`Override`], [`Element`], [`Sweep`], ...), rendering back
//!   into override syntax, quoting and escaping (Hydra's `override_parser/types.py`);
//! * `lexer` — tokens and the two lexical modes (`OverrideLexer.g4`);
//! * `parser` — the recursive-descent parser (`OverrideParser.g4`);
//! * `eval` and `value` — evaluation of the parsed tree into typed elements and sweeps (Hydra's
//!   `overrides_visitor.py`), and the evaluated values with their nested-sweep placeholders;
//! * `functions` and `grammar_functions` — the grammar functions: their signatures and argument
//!   binding, then their bodies (Hydra's `grammar/functions.py` and `grammar_functions.py`);
//! * `expand` — enumerating discrete sweeps: Python's `range`, Hydra's decimal float range
//!   (`decimal`), `fnmatch` globs and the seeded shuffle;
//! * `python` — Python semantics the grammar inherits: `int()`/`float()` of strings, number
//!   comparison, `sorted`, type names and exceptions.

mod decimal;
mod eval;
mod expand;
mod functions;
mod grammar_functions;
mod lexer;
mod parser;
mod python;
mod types;
mod value;

#[cfg(test)]
mod tests;

pub use types::{
    escape_special_characters, quote_string, Element, Number, Override, OverrideError,
    OverrideKind, OverrideValue, Sweep,
};

use eval::Evaluator;
use expand::random_seed;
use grammar_functions::glob_patterns;
use lexer::tokenize;
use parser::{ast_start, Parser, ValueAst};
use value::{finalize, Ctx, Val};

/// Parses one override. `shuffle(list)` values are shuffled with a random seed; see
/// [`parse_override_seeded`] for a reproducible order.
pub fn parse_override(text: &str) -> Result<Override, OverrideError> {
    parse_override_seeded(text, random_seed())
}

/// Parses several overrides, stopping at the first that fails.
pub fn parse_overrides(texts: &[String]) -> Result<Vec<Override>, OverrideError> {
    texts.iter().map(|t| parse_override(t)).collect()
}

/// Parses one override, shuffling `shuffle(list)` values with a generator seeded by `seed`.
pub fn parse_override_seeded(text: &str, seed: u64) -> Result<Override, OverrideError> {
    let chars: Vec<char> = text.chars().collect();
    let syntax = |message: String, column: usize| OverrideError::Syntax {
        input: text.to_string(),
        message,
        column,
    };
    let toks = tokenize(&chars).map_err(|(m, c)| syntax(m, c))?;
    let mut parser = Parser {
        s: &chars,
        toks,
        pos: 0,
    };
    let parsed = parser.parse_override().map_err(|(m, c)| syntax(m, c))?;
    let mut eval = Evaluator {
        s: &chars,
        ctx: Ctx::new(seed),
    };
    let value_error = |message: String, column: usize| OverrideError::Value {
        input: text.to_string(),
        message,
        column,
    };
    let value = match parsed.value {
        None => None,
        Some(ValueAst::Empty) => Some(OverrideValue::Element(Element::Str(String::new()))),
        Some(ValueAst::Element(ast)) => {
            let column = ast_start(&ast);
            let val = eval.eval(&ast, 0).map_err(|e| e.into_error(text))?;
            Some(match val {
                Val::E(e) => {
                    OverrideValue::Element(finalize(e).map_err(|m| value_error(m, column))?)
                }
                Val::S(Sweep::Choice {
                    items,
                    simple_form,
                    shuffle,
                    tags,
                }) => OverrideValue::Sweep(Sweep::Choice {
                    items: items
                        .into_iter()
                        .map(finalize)
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|m| value_error(m, column))?,
                    simple_form,
                    shuffle,
                    tags,
                }),
                Val::S(s) => OverrideValue::Sweep(s),
                Val::G { include, exclude } => OverrideValue::Sweep(Sweep::Glob {
                    include: glob_patterns(include).map_err(|m| value_error(m, column))?,
                    exclude: glob_patterns(exclude).map_err(|m| value_error(m, column))?,
                }),
            })
        }
        Some(ValueAst::Choice(asts)) => {
            let mut items = Vec::with_capacity(asts.len());
            for ast in &asts {
                let item = eval.eval_element(ast, 0).map_err(|e| e.into_error(text))?;
                items.push(finalize(item).map_err(|m| value_error(m, ast_start(ast)))?);
            }
            Some(OverrideValue::Sweep(Sweep::Choice {
                items,
                simple_form: true,
                shuffle: false,
                tags: Vec::new(),
            }))
        }
    };
    Ok(Override {
        kind: parsed.kind,
        key_or_group: parsed.key,
        package: parsed.package,
        value,
        input: text.to_string(),
    })
}
