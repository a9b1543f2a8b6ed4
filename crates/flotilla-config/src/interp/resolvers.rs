//! The resolvers: those OmegaConf registers by default (`oc.env`, `oc.select`, `oc.decode`,
//! `oc.create`, `oc.deprecated`, `oc.dict.keys`, `oc.dict.values`) and Hydra's (`now`,
//! `hydra`, with `flotilla` as an alias of `hydra`), with Python's `strftime` for `now`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::rc::Rc;

use super::evaluate::{
    nearest, render_path, str_of, val_type_name, Evaluator, Fail, LazyValues, Loc, Seg, Sel, Val, R,
};
use super::grammar::{parse_single_element, Element, KeyPart};
use super::InterpErrorKind;
use crate::node::{Dict, Node, Origin, Value};

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

impl<'t> Evaluator<'t> {
    pub(super) fn eval_resolver(
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
                        let mut node = crate::yaml::load_str(&text, "<oc.create>")
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

fn resolver_error(name: &str, message: impl Into<String>) -> Fail {
    Fail::Kind(InterpErrorKind::Resolver {
        name: name.to_string(),
        message: message.into(),
    })
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
