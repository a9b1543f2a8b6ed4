//! A model's chat template, rendered the way transformers' `apply_chat_template` renders it.
//!
//! The template is the Jinja text of a Hugging Face tokenizer directory: `chat_template.jinja`
//! beside `tokenizer.json` when there is one, else `tokenizer_config.json`'s `chat_template`
//! (a string, or the named list `[{"name": "default", "template": ...}, ...]`, whose `default`
//! is used). It is compiled once with minijinja under transformers' settings: `trim_blocks`,
//! `lstrip_blocks`, loop controls (`break`/`continue`), Python's string and dict methods
//! (minijinja-contrib's pycompat), `raise_exception(msg)`, `strftime_now(fmt)`, and a `tojson`
//! that writes what Python's `json.dumps(x, ensure_ascii=False, ...)` writes. transformers'
//! `{% generation %}` blocks are rendered as their content. A render sees `messages`,
//! `add_generation_prompt`, `tools` and `documents` (None), and the special tokens of
//! `tokenizer_config.json` (`bos_token`, `eos_token`, `unk_token`, `pad_token`, ...) as
//! strings, as transformers passes them; each message as `apply_chat_template` hands it over
//! (its null keys left out, its reasoning also under `reasoning_content`: `message_value`).
//!
//! Where minijinja and transformers' jinja2 (Python) differ on what templates use, Python's
//! behaviour is the one given (module `python`): `{{ x }}`, `string`, `trim` and `indent` write
//! a value as Python's `str()` does (`None`, `True`, a list of content parts as its `repr`);
//! `strip`, `lstrip`, `rstrip`, `isspace`, `split()` and `trim` take Python's whitespace (with
//! U+001C..U+001F); `splitlines` Python's line boundaries; `indent` is jinja2's; `tools` and
//! `documents` are a None that cannot be iterated (jinja2 raises) but that `select`,
//! `selectattr`, `reject`, `rejectattr` and `map` take as empty; `tojson` of an undefined value
//! fails, its `length` is 0 and its `first` and `last` undefined; `find`, `rfind` and `count`
//! count characters as Python does, `split` and `rsplit` take `sep`/`maxsplit` by name, and
//! `str.join` joins strings only; the tests `number` (booleans are), `sequence` (strings and
//! dicts are) and `iterable` (None is not) are jinja2's; and the source's line breaks are read
//! as jinja2 reads them (CR LF and CR as LF, in string literals too). Known differences that
//! remain: `~` writes none and booleans as minijinja does (`none`, `true`); `x == none` is
//! false for `tools`; `a and b` is a boolean, not an operand; `dict.items()` pairs are
//! written as lists, not tuples; `%` string formatting, the filters `wordcount` and `int` of a
//! non-number string, and the methods `partition`, `zfill`, `center` and `expandtabs` fail;
//! and Python's `repr` escapes unassigned code points, which are written as they are here.

use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value as Json;

use super::error::{DataError, Result};
use super::tokenizer::token_text;

/// The file name of a template stored beside `tokenizer.json`.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";
/// The tokenizer's settings file, which may hold the template and names the special tokens.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

const TEMPLATE_NAME: &str = "chat_template";
const SPECIAL_TOKEN_KEYS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

/// A compiled chat template with the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    special_tokens: Vec<(String, String)>,
    source: String,
    origin: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

fn template_error(origin: &Path, message: impl Into<String>) -> DataError {
    DataError::ChatTemplate {
        origin: origin.to_path_buf(),
        message: message.into(),
    }
}

fn read_json(path: &Path) -> Result<Option<Json>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| template_error(path, format!("invalid JSON: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DataError::io(path, e)),
    }
}

impl ChatTemplate {
    /// The template of a Hugging Face tokenizer directory (see the module docs for where it is
    /// looked for); an error names the directory and the fix when it has none.
    pub fn from_tokenizer_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_json(&config_path)?;
        let file = dir.join(TEMPLATE_FILE);
        if file.is_file() {
            let source = std::fs::read_to_string(&file).map_err(|e| DataError::io(&file, e))?;
            return Self::compile(source, &file, config.as_ref(), dir);
        }
        let Some(config) = config else {
            return Err(template_error(
                dir,
                format!(
                    "is not a Hugging Face tokenizer directory: it has neither {TEMPLATE_FILE} \
                     nor {TOKENIZER_CONFIG_FILE}"
                ),
            ));
        };
        let source = match config.get("chat_template") {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(named)) => {
                let find = |name: &str| {
                    named.iter().find_map(|t| {
                        (t.get("name").and_then(Json::as_str) == Some(name))
                            .then(|| t.get("template").and_then(Json::as_str))
                            .flatten()
                    })
                };
                match find("default") {
                    Some(s) => s.to_string(),
                    None => {
                        let names: Vec<&str> = named
                            .iter()
                            .filter_map(|t| t.get("name").and_then(Json::as_str))
                            .collect();
                        return Err(template_error(
                            &config_path,
                            format!(
                                "chat_template lists the templates [{}] but none named \
                                 'default'; set data.chat_template to a file holding the one \
                                 to use",
                                names.join(", ")
                            ),
                        ));
                    }
                }
            }
            _ => {
                return Err(template_error(
                    dir,
                    format!(
                        "has no chat template (no {TEMPLATE_FILE}, and {TOKENIZER_CONFIG_FILE} \
                         has no chat_template); set data.chat_template=/path/to/template.jinja"
                    ),
                ))
            }
        };
        Self::compile(source, &config_path, Some(&config), dir)
    }

    /// The template in `file`, rendered with the special tokens of the tokenizer in `dir`.
    pub fn from_file(file: &Path, dir: &Path) -> Result<Self> {
        let source = std::fs::read_to_string(file)
            .map_err(|e| DataError::open("data.chat_template", file, e))?;
        let config = read_json(&dir.join(TOKENIZER_CONFIG_FILE))?;
        Self::compile(source, file, config.as_ref(), dir)
    }

    fn compile(source: String, origin: &Path, config: Option<&Json>, dir: &Path) -> Result<Self> {
        let mut special_tokens = vec![];
        let map = read_json(&dir.join("special_tokens_map.json"))?;
        for key in SPECIAL_TOKEN_KEYS {
            let value = config
                .and_then(|c| c.get(*key))
                .and_then(token_text)
                .or_else(|| map.as_ref().and_then(|m| m.get(*key)).and_then(token_text));
            if let Some(v) = value {
                special_tokens.push((key.to_string(), v));
            }
        }
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(python::method);
        env.set_formatter(python::format);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", python::string_filter);
        env.add_filter("trim", python::trim_filter);
        env.add_filter("indent", python::indent_filter);
        env.add_test("none", python::is_none);
        env.add_test("number", python::is_number);
        env.add_test("sequence", python::is_sequence);
        env.add_test("iterable", python::is_iterable);
        env.add_filter("length", python::length_filter);
        env.add_filter("count", python::length_filter);
        env.add_filter("first", python::first_filter);
        env.add_filter("last", python::last_filter);
        use minijinja::filters;
        python::none_as_empty(&mut env, "select", Value::from_function(filters::select));
        python::none_as_empty(&mut env, "reject", Value::from_function(filters::reject));
        python::none_as_empty(&mut env, "map", Value::from_function(filters::map));
        let (select, reject) = (filters::selectattr, filters::rejectattr);
        python::none_as_empty(&mut env, "selectattr", Value::from_function(select));
        python::none_as_empty(&mut env, "rejectattr", Value::from_function(reject));
        let text = without_generation_tags(&jinja_newlines(&source));
        env.add_template_owned(TEMPLATE_NAME, text)
            .map_err(|e| template_error(origin, format!("does not parse: {}", describe(&e))))?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            source,
            origin: origin.to_path_buf(),
        })
    }

    /// Renders `messages` (a JSON array of message objects); with `add_generation_prompt` the
    /// text ends with the header of the assistant's next turn.
    pub fn render(&self, messages: &Json, add_generation_prompt: bool) -> Result<String> {
        self.try_render(messages, add_generation_prompt)
            .map_err(|m| template_error(&self.origin, m))
    }

    /// [`ChatTemplate::render`] with the error as a bare message (the caller names the record).
    pub(crate) fn try_render(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        let messages = match messages {
            Json::Array(list) => Value::from(list.iter().map(message_value).collect::<Vec<_>>()),
            other => Value::from_serialize(other),
        };
        self.render_messages(messages, add_generation_prompt)
    }

    /// Renders `messages`, already a template value (a list of message maps): the caller that
    /// renders several prefixes of one conversation converts its messages once.
    pub(crate) fn render_messages(
        &self,
        messages: Value,
        add_generation_prompt: bool,
    ) -> std::result::Result<String, String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| describe(&e))?;
        let mut context: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
            ("tools".into(), python::none()),
            ("documents".into(), python::none()),
        ];
        for (k, v) in &self.special_tokens {
            context.push((k.clone(), Value::from(v.as_str())));
        }
        let context: Value = context.into_iter().collect();
        template.render(context).map_err(|e| describe(&e))
    }

    /// The Jinja source as the tokenizer directory (or file) holds it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template was read from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// The value of a special token (`eos_token`, ...) the template is rendered with.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Where transformers looks for a message's reasoning, in order (`_REASONING_FIELDS`).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// One message as transformers' `apply_chat_template` hands it to the template: its keys whose
/// value is null left out (an OpenAI-style `"tool_calls": null` must not make `'tool_calls' in
/// message` true), then, when it has a reasoning under `reasoning_content`, `thinking` or
/// `reasoning` (the first of them that is not null), that reasoning also under
/// `reasoning_content` (what templates read) and, unless the message has its own, `thinking`,
/// in the order Python's `{"thinking": r, **message, "reasoning_content": r}` gives the keys.
pub(crate) fn message_value(message: &Json) -> Value {
    let Json::Object(map) = message else {
        return Value::from_serialize(message);
    };
    let present: Vec<(&String, &Json)> = map.iter().filter(|(_, v)| !v.is_null()).collect();
    let reasoning = REASONING_FIELDS.iter().find_map(|f| {
        present
            .iter()
            .find(|(k, _)| k.as_str() == *f)
            .map(|(_, v)| *v)
    });
    let mut entries: Vec<(&str, &Json)> = Vec::with_capacity(present.len() + 2);
    if let Some(r) = reasoning {
        entries.push(("thinking", r));
    }
    for (k, v) in present {
        match k.as_str() {
            // Its own `thinking` keeps the first place, with its own value.
            "thinking" if reasoning.is_some() => entries[0].1 = v,
            "reasoning_content" => entries.push((k, reasoning.unwrap_or(v))),
            _ => entries.push((k, v)),
        }
    }
    if let Some(r) = reasoning {
        if map.get("reasoning_content").is_none_or(Json::is_null) {
            entries.push(("reasoning_content", r));
        }
    }
    entries
        .into_iter()
        .map(|(k, v)| (Value::from(k), Value::from_serialize(v)))
        .collect()
}

/// A template error as one line: what the template raised, or what failed and where.
fn describe(e: &Error) -> String {
    if e.kind() == ErrorKind::InvalidOperation {
        if let Some(raised) = e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            return format!("the template raised: {raised}");
        }
    }
    let mut text = match e.detail() {
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        text.push_str(&format!(" (template line {line})"));
    }
    text
}

const RAISED: &str = "raised: ";

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

fn strftime_now(format: String) -> std::result::Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format '{format}'"),
        ));
    }
    Ok(chrono::Local::now()
        .format_with_items(items.into_iter())
        .to_string())
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    if value.is_undefined() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: Object of type Undefined is not JSON serializable",
        ));
    }
    let value = if python::is_none(&value) {
        Value::from(())
    } else {
        value
    };
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut out = String::new();
    let style = PyJson {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    style.write(&json, 0, &mut out);
    Ok(out)
}

/// Python's `json.dumps` layout.
struct PyJson {
    indent: Option<usize>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }

    fn write(&self, v: &Json, level: usize, out: &mut String) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() => out.push_str(&py_float(f)),
                _ => out.push_str(&n.to_string()),
            },
            Json::String(s) => self.string(s, out),
            Json::Array(items) if items.is_empty() => out.push_str("[]"),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push(']');
            }
            Json::Object(map) if map.is_empty() => out.push_str("{}"),
            Json::Object(map) => {
                let mut entries: Vec<(&String, &Json)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key);
                    self.write(item, level + 1, out);
                }
                self.newline(level, out);
                out.push('}');
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && !c.is_ascii() => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as Python's `json.dumps` writes it: `NaN` and `(-)Infinity`, else its `repr`
/// (`1.0`, `0.5`, `1e-05`, `1e+16`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        flotilla_config::node::python_float_repr(f)
    }
}

/// The template with its line breaks as jinja2's lexer reads them: `\r\n` and a lone `\r`
/// become `\n` (its `newline_sequence`), in the text and in string literals alike, so that a
/// template holding a raw `\r\n` in `replace('\r\n', '\n')` replaces `\n` by `\n` there.
fn jinja_newlines(source: &str) -> std::borrow::Cow<'_, str> {
    if source.contains('\r') {
        std::borrow::Cow::Owned(source.replace("\r\n", "\n").replace('\r', "\n"))
    } else {
        std::borrow::Cow::Borrowed(source)
    }
}

/// The template with transformers' `{% generation %}`/`{% endgeneration %}` markers (which
/// only track assistant spans there) turned into a block that always renders its content.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let body = inner.trim_start_matches('-').trim_end_matches('-').trim();
        let (open_dash, close_dash) = (inner.starts_with('-'), inner.ends_with('-'));
        let replacement = match body {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                out.push_str("{%");
                if open_dash {
                    out.push('-');
                }
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                if close_dash {
                    out.push('-');
                }
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

mod python;

pub(crate) use python::python_strip;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(source: &str) -> ChatTemplate {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            json!({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": source})
                .to_string(),
        )
        .unwrap();
        ChatTemplate::from_tokenizer_dir(dir.path()).unwrap()
    }

    #[test]
    fn renders_with_special_tokens_and_python_methods() {
        let t = template(
            "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[U] \
             {{ m.content.strip() }}{% else %}[A] {{ m['content'] }}{{ eos_token }}{% endif %}\
             {% endfor %}{% if add_generation_prompt %}[A]{% endif %}",
        );
        let msgs =
            json!([{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "yo"}]);
        assert_eq!(t.render(&msgs, false).unwrap(), "<s>[U] hi[A] yo</s>");
        assert_eq!(t.render(&msgs, true).unwrap(), "<s>[U] hi[A] yo</s>[A]");
    }

    #[test]
    fn raise_exception_is_reported_with_its_message() {
        let t = template("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok");
        let err = t
            .try_render(&json!([{"role": "system", "content": "x"}]), false)
            .unwrap_err();
        assert_eq!(err, "the template raised: System role not supported");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        // (Nested: a message's own null keys are left out before the template sees it.)
        let t = template("{{ messages[0].x | tojson }}|{{ messages[0].x | tojson(indent=2) }}");
        let out = t
            .render(
                &json!([{"x": {"b": [1, 2.5, "é\n\"x\""], "a": {}, "c": null, "d": 1e-5}}]),
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, \"é\\n\\\"x\\\"\"], \"a\": {}, \"c\": null, \"d\": 1e-05}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é\\n\\\"x\\\"\"\n  ],\n  \"a\": {},\n  \"c\": null,\n  \"d\": 1e-05\n}"
        );
    }

    #[test]
    fn generation_tags_render_their_content_and_loop_controls_work() {
        let t = template(
            "{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}\
             {%- generation -%} <{{ m.content }}> {%- endgeneration -%}{% endfor %}",
        );
        let msgs = json!([{"content": "a"}, {"content": "b"}, {"content": "c"}]);
        assert_eq!(t.render(&msgs, false).unwrap(), "<a><b>");
    }

    #[test]
    fn messages_reach_the_template_as_transformers_passes_them() {
        // Null keys left out; the reasoning also under `thinking` and `reasoning_content`.
        let t = template("{% for m in messages %}{{ m | tojson }}\n{% endfor %}");
        let msgs = json!([
            {"role": "user", "content": "hi", "name": null},
            {"role": "assistant", "content": "yo", "reasoning": "think", "tool_calls": null},
            {"role": "assistant", "thinking": "mine", "content": "x", "reasoning_content": "r"}
        ]);
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "{\"role\": \"user\", \"content\": \"hi\"}\n\
             {\"thinking\": \"think\", \"role\": \"assistant\", \"content\": \"yo\", \
             \"reasoning\": \"think\", \"reasoning_content\": \"think\"}\n\
             {\"thinking\": \"mine\", \"role\": \"assistant\", \"content\": \"x\", \
             \"reasoning_content\": \"r\"}\n"
        );
        let t = template("{{ 'tool_calls' in messages[0] }}");
        let msgs = json!([{"role": "assistant", "content": "a", "tool_calls": null}]);
        assert_eq!(t.render(&msgs, false).unwrap(), "False");
    }

    /// The expected texts are what transformers' jinja2 environment renders.
    #[test]
    fn values_strings_and_lines_behave_as_in_python() {
        let render = |source: &str, content: &str| {
            template(source)
                .render(&json!([{"role": "user", "content": content}]), false)
                .unwrap()
        };
        assert_eq!(
            render(
                "{{ none }}|{{ true }}|{{ [1, 'a', none, {'k': 2.0, \"it's\": 1e-7}] }}|\
                 {{ 3|string }}|{{ x }}|{{ 2.5 }}",
                ""
            ),
            "None|True|[1, 'a', None, {'k': 2.0, \"it's\": 1e-07}]|3||2.5"
        );
        let c = "{% set s = messages[0].content %}";
        assert_eq!(
            render(
                &format!("{c}[{{{{ s.strip() }}}}][{{{{ s|trim }}}}][{{{{ s.lstrip() }}}}][{{{{ s.rstrip('\u{1f}') }}}}]"),
                "\u{1c} a \u{1f}"
            ),
            "[a][a][a \u{1f}][\u{1c} a ]"
        );
        assert_eq!(
            render(
                &format!("{c}{{{{ s.splitlines() }}}}{{{{ s.splitlines(true) }}}}{{{{ ''.splitlines() }}}}"),
                "a\rb\r\nc\u{0b}d\u{2028}e\n"
            ),
            "['a', 'b', 'c', 'd', 'e']['a\\r', 'b\\r\\n', 'c\\x0b', 'd\\u2028', 'e\\n'][]"
        );
        assert_eq!(
            render(
                &format!("{c}{{{{ s.split() }}}}{{{{ s.split(none, 1) }}}}{{{{ s.split(' ') }}}}{{{{ s.split(' ', 1) }}}}"),
                " a  b\u{1f}c "
            ),
            "['a', 'b', 'c']['a', 'b\\x1fc ']['', 'a', '', 'b\\x1fc', '']['', 'a  b\\x1fc ']"
        );
        assert_eq!(
            render(
                &format!("{c}[{{{{ s|indent }}}}][{{{{ s|indent(2, true) }}}}][{{{{ s|indent(width='> ', first=true, blank=true) }}}}][{{{{ 'x'|indent }}}}]"),
                "a\n\nb\n"
            ),
            "[a\n\n    b\n][  a\n\n  b\n][> a\n> \n> b\n> ][x]"
        );
        assert_eq!(
            render("{{ ''.isspace() }}{{ '\u{1c}'.isspace() }}", ""),
            "FalseTrue"
        );
        let t = template("{{ messages[0].content|trim }}");
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "It's \"x\"\n\u{e9}\u{200b}"}]}]);
        assert_eq!(
            t.render(&parts, false).unwrap(),
            "[{'type': 'text', 'text': 'It\\'s \"x\"\\n\u{e9}\\u200b'}]"
        );
        let err = template("{{ x|tojson }}")
            .render(&json!([]), false)
            .unwrap_err();
        assert!(err.to_string().contains("not JSON serializable"), "{err}");
    }

    /// The expected texts are what transformers' jinja2 environment renders.
    #[test]
    fn filters_tests_and_methods_behave_as_in_jinja2() {
        let t = template(
            "{{ x|length }}|{{ x|first }}|{{ x|last }}|{{ 'héllo'.find('l') }}|\
             {{ 'héllo'.rfind('l') }}|{{ 'abc'.count('') }}|{{ 'aaa'.count('aa') }}|\
             {{ 'a,b,c'.rsplit(',', 1) }}|{{ '  a  b '.rsplit(none, 1) }}|\
             {{ 'aXbXc'.split('X', maxsplit=1) }}|{{ true is number }}|{{ 'x' is sequence }}|\
             {{ {} is sequence }}|{{ none is iterable }}",
        );
        assert_eq!(
            t.render(&json!([]), false).unwrap(),
            "0|||2|3|4|1|['a,b', 'c']|['  a', 'b']|['a', 'bXc']|True|True|True|False"
        );
        let err = template("{{ ', '.join([1]) }}")
            .render(&json!([]), false)
            .unwrap_err();
        assert!(err.to_string().contains("expected str instance"), "{err}");
    }

    #[test]
    fn tools_and_documents_are_python_none() {
        let render = |source: &str| template(source).render(&json!([]), false);
        assert_eq!(
            render(
                "{{ tools }}|{{ tools is none }}|{{ tools is not none }}|{{ tools is defined }}|\
                 {{ not tools }}|{{ tools|tojson }}|{{ tools|string }}|{{ tools is iterable }}|\
                 {{ tools|selectattr('type', 'equalto', 'x')|list }}|{{ documents|map(attribute='x')|list }}"
            )
            .unwrap(),
            "None|True|False|True|True|null|None|False|[]|[]"
        );
        // jinja2: TypeError: 'NoneType' object is not iterable.
        let err = render("{% for t in tools %}{{ t }}{% endfor %}").unwrap_err();
        assert!(err.to_string().contains("not iterable"), "{err}");
    }

    #[test]
    fn line_breaks_are_read_as_jinja2_reads_them() {
        // A raw CR LF in a string literal is a LF to jinja2, so this replace changes nothing.
        let t = template("{{ messages[0].content.replace('\r\n', '\n') }}\r\n|\r|");
        let msgs = json!([{"role": "user", "content": "a\r\nb"}]);
        assert_eq!(t.render(&msgs, false).unwrap(), "a\r\nb\n|\n|");
    }

    #[test]
    fn a_directory_without_a_template_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), "{}").unwrap();
        let err = ChatTemplate::from_tokenizer_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("has no chat template"), "{err}");
        assert!(err.contains("data.chat_template="), "{err}");
    }

    #[test]
    fn a_template_that_does_not_parse_is_an_error_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(TEMPLATE_FILE),
            "ok\n{% for m in messages %}",
        )
        .unwrap();
        let err = ChatTemplate::from_tokenizer_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not parse"), "{err}");
        assert!(err.contains("line"), "{err}");
    }
}
