//! Evaluation of a parsed override (Hydra's `overrides_visitor.py`): typing primitives,
//! un-escaping, building lists and dicts with Python's key semantics, and calling the grammar
//! functions.

use super::functions::call_function;
use super::lexer::{Tk, Token};
use super::parser::{ast_start, Ast, Func};
use super::python::py_key_eq;
use super::types::{unquote, Element, OverrideError};
use super::value::{Ctx, Val};
use crate::node::{python_float_literal, python_float_repr, python_int_literal};

pub(super) struct EvalError {
    message: String,
    column: usize,
}

impl EvalError {
    pub(super) fn into_error(self, input: &str) -> OverrideError {
        OverrideError::Value {
            input: input.to_string(),
            message: self.message,
            column: self.column,
        }
    }
}

pub(super) struct Evaluator<'a> {
    pub(super) s: &'a [char],
    pub(super) ctx: Ctx,
}

impl Evaluator<'_> {
    fn text(&self, t: &Token) -> String {
        self.s[t.start..t.end].iter().collect()
    }

    pub(super) fn eval(&mut self, ast: &Ast, depth: usize) -> Result<Val, EvalError> {
        match ast {
            Ast::Prim(toks) => self.primitive(toks).map(Val::E),
            Ast::Quoted(t) => Ok(Val::E(Element::Quoted {
                text: unquote(&self.s[t.start..t.end]),
                quote: self.s[t.start],
            })),
            Ast::List(items, _) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    out.push(self.eval_element(item, depth + 1)?);
                }
                Ok(Val::E(Element::List(out)))
            }
            Ast::Dict(pairs, _) => {
                let mut out: Vec<(Element, Element)> = Vec::with_capacity(pairs.len());
                for (key_toks, value_ast) in pairs {
                    let key = self.primitive(key_toks)?;
                    let value = self.eval_element(value_ast, depth + 1)?;
                    // Python dict semantics: an equal key keeps its place and takes the value.
                    match out.iter_mut().find(|(k, _)| py_key_eq(k, &key)) {
                        Some(slot) => slot.1 = value,
                        None => out.push((key, value)),
                    }
                }
                Ok(Val::E(Element::Dict(
                    out.into_iter()
                        .map(|(k, v)| (dict_key_string(&k), v))
                        .collect(),
                )))
            }
            Ast::Func(f) => self.function(f, depth),
        }
    }

    /// Evaluates an element nested in a list, dict or simple choice: not a sweep.
    pub(super) fn eval_element(&mut self, ast: &Ast, depth: usize) -> Result<Element, EvalError> {
        let v = self.eval(ast, depth)?;
        Ok(self.ctx.nest(v))
    }

    /// The visitor's `_createPrimitive` for the non-quoted alternative (and dict keys).
    fn primitive(&self, toks: &[Token]) -> Result<Element, EvalError> {
        let mut first = 0;
        let mut last = toks.len();
        if toks[0].kind == Tk::Ws {
            if toks.len() == 1 {
                return Err(EvalError {
                    message: "Trying to parse a primitive that is all whitespaces".to_string(),
                    column: toks[0].start,
                });
            }
            first = 1;
        }
        if toks[last - 1].kind == Tk::Ws {
            last -= 1;
        }
        if last - first > 1 {
            let mut out = String::new();
            for t in &toks[first..last] {
                let chars = &self.s[t.start..t.end];
                if t.kind == Tk::Esc {
                    out.extend(chars.iter().skip(1).step_by(2));
                } else {
                    out.extend(chars.iter());
                }
            }
            return Ok(Element::Str(out));
        }
        let t = &toks[first];
        let text = self.text(t);
        Ok(match t.kind {
            Tk::Int => match python_int_literal(&text) {
                Some(i) => Element::Int(i),
                None => {
                    return Err(EvalError {
                        message: format!(
                        "integer {text} does not fit in 64 bits (Python would keep a big integer)"
                    ),
                        column: t.start,
                    })
                }
            },
            Tk::Float => Element::Float(python_float_literal(&text)),
            Tk::Null => Element::Null,
            Tk::Bool => Element::Bool(text.eq_ignore_ascii_case("true")),
            Tk::Esc => Element::Str(text.chars().skip(1).step_by(2).collect()),
            _ => Element::Str(text),
        })
    }

    fn function(&mut self, f: &Func, depth: usize) -> Result<Val, EvalError> {
        let mut args = Vec::new();
        let mut kwargs: Vec<(String, Val)> = Vec::new();
        for (name, ast) in &f.args {
            if name.is_none() && !kwargs.is_empty() {
                return Err(EvalError {
                    message: "positional argument follows keyword argument".to_string(),
                    column: ast_start(ast),
                });
            }
            let value = match self.eval(ast, depth + 1)? {
                // Functions receive quoted strings as plain strings (Functions.eval).
                Val::E(Element::Quoted { text, .. }) => Val::E(Element::Str(text)),
                v => v,
            };
            match name {
                Some(name) => match kwargs.iter_mut().find(|(k, _)| k == name) {
                    Some(slot) => slot.1 = value,
                    None => kwargs.push((name.clone(), value)),
                },
                None => args.push(value),
            }
        }
        let text: String = self.s[f.start..f.end].iter().collect();
        call_function(&f.name, args, kwargs, &mut self.ctx).map_err(|e| EvalError {
            message: format!("{} while evaluating '{}': {}", e.ty, text, e.msg),
            column: f.start,
        })
    }
}

/// How Hydra prints a dict key of this type (`_get_value_element_as_str` without escaping).
fn dict_key_string(key: &Element) -> String {
    match key {
        Element::Null => "null".to_string(),
        Element::Bool(true) => "True".to_string(),
        Element::Bool(false) => "False".to_string(),
        Element::Int(i) => i.to_string(),
        Element::Float(f) => python_float_repr(*f),
        Element::Str(s) => s.clone(),
        other => other.as_override_str(),
    }
}
