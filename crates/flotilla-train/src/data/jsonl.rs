//! `kind: jsonl`: one JSON object per line, turned into one sample per record.
//!
//! A record with the `data.completion_key` field is a prompt/completion pair: the prompt is
//! `data.prompt_template` with each `{field}` replaced by that record field (strings as they
//! are, numbers and booleans as JSON, null as empty; `{{` and `}}` are literal braces), the
//! completion is the field itself. The Alpaca shape is
//! `prompt_template: "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"`
//! with `completion_key: output`. A record without that field but with `text` is plain text,
//! labelled everywhere. The sample is `[BOS] prompt completion EOS` (BOS when the tokenizer has
//! one; prompt and completion encoded separately so the mask boundary is exact), and with
//! `mask_prompt` only the completion and EOS carry labels (prompt labels are -100).
//!
//! The records come from any file [`super::records`] reads (`.jsonl`, `.json`, Parquet,
//! Arrow, globs and directories of them), or from a mixture of such sources with a carved
//! held-out set ([`super::record_sets`]). Blank lines are skipped; anything else that is not a
//! JSON object with the fields above is an error naming the file and the line (or row).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::{DataError, Result};
use super::record_sets::RecordSet;
use super::records::Origin;
use super::sequences::SequenceDataset;
use super::tokenizer::Tokenizer;

/// A parsed `data.prompt_template`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(String),
}

impl Template {
    pub fn parse(template: &str) -> Result<Self> {
        let bad = |msg: String| DataError::config("data.prompt_template", msg);
        let mut parts = vec![];
        let mut text = String::new();
        let mut chars = template.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|p| p.1) == Some('{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek().map(|p| p.1) == Some('}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((_, '{')) | None => {
                                return Err(bad(format!(
                                    "unclosed '{{' at byte {at}; write '{{{{' for a literal brace"
                                )))
                            }
                            Some((_, ch)) => name.push(ch),
                        }
                    }
                    if name.trim().is_empty() {
                        return Err(bad(format!("empty field name '{{}}' at byte {at}")));
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Field(name.trim().to_string()));
                }
                '}' => {
                    return Err(bad(format!(
                        "unmatched '}}' at byte {at}; write '}}}}' for a literal brace"
                    )))
                }
                _ => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Template { parts })
    }

    /// Field names the template uses.
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Field(f) => Some(f.as_str()),
            Part::Text(_) => None,
        })
    }

    /// Renders the template with `record`'s fields; `Err(field)` names a missing field.
    pub fn render(&self, record: &serde_json::Map<String, Value>) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(f) => match record.get(f) {
                    Some(v) => out.push_str(&value_text(v)),
                    None => return Err(f.clone()),
                },
            }
        }
        Ok(out)
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One record, rendered to text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The rendered prompt (empty for a `text` record).
    pub prompt: String,
    /// The completion, or the whole text of a `text` record.
    pub completion: String,
    /// False for a `text` record: labelled everywhere regardless of `mask_prompt`.
    pub has_prompt: bool,
    /// 1-based line of the record in its file.
    pub line: usize,
}

/// Reads the records of `set` (a file, a glob, a directory of them or a mixture of sources:
/// [`super::record_sets`]), each as many times as the set takes it.
pub fn read_records(
    set: &RecordSet,
    template: &Template,
    completion_key: &str,
) -> Result<Vec<Record>> {
    let mut records = vec![];
    for part in &set.parts {
        for chunk in part.files.chunks() {
            let chunk = chunk?;
            for k in 0..chunk.len() {
                let times = part.times(chunk.index(k)) as usize;
                if times == 0 {
                    continue;
                }
                let origin = chunk.origin(k);
                let record = parse_record(chunk.record(k)?, &origin, template, completion_key)?;
                records.extend(std::iter::repeat_n(record, times));
            }
        }
    }
    if records.is_empty() {
        return Err(DataError::config(
            &set.parts[0].files.key,
            format!("{} has no records", set.name()),
        ));
    }
    Ok(records)
}

/// One record as a prompt and completion, or as a text.
fn parse_record(
    value: Value,
    origin: &Origin,
    template: &Template,
    completion_key: &str,
) -> Result<Record> {
    let n = origin.place.number();
    let Value::Object(obj) = value else {
        return Err(origin.error("a record must be a JSON object"));
    };
    if let Some(c) = obj.get(completion_key) {
        let prompt = template.render(&obj).map_err(|f| {
            origin.error(format!(
                "record has no field '{f}', which data.prompt_template uses"
            ))
        })?;
        Ok(Record {
            prompt,
            completion: value_text(c),
            has_prompt: true,
            line: n,
        })
    } else if let Some(t) = obj.get("text") {
        let Value::String(t) = t else {
            return Err(origin.error("field 'text' is not a string"));
        };
        Ok(Record {
            prompt: String::new(),
            completion: t.clone(),
            has_prompt: false,
            line: n,
        })
    } else {
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        Err(origin.error(format!(
            "record has neither '{completion_key}' (data.completion_key) nor 'text'; its \
             fields are [{}]",
            keys.join(", ")
        )))
    }
}

/// Encodes records into one padded sample each (see the module docs).
pub fn encode_records(
    name: impl AsRef<Path>,
    records: &[Record],
    tokenizer: &Tokenizer,
    seq_len: usize,
    mask_prompt: bool,
) -> Result<SequenceDataset> {
    let eos = tokenizer.require_eos()?;
    let pad = tokenizer.pad_id().unwrap_or(eos);
    let mut items = Vec::with_capacity(records.len());
    for r in records {
        let mut ids: Vec<u32> = tokenizer.bos_id().into_iter().collect();
        if r.has_prompt {
            ids.extend(tokenizer.encode(&r.prompt)?);
        }
        let prompt_len = ids.len();
        ids.extend(tokenizer.encode(&r.completion)?);
        ids.push(eos);
        let loss_from = if mask_prompt && r.has_prompt {
            prompt_len
        } else {
            1
        };
        items.push((ids, loss_from));
    }
    let name: PathBuf = name.as_ref().to_path_buf();
    SequenceDataset::new(&format!("jsonl {}", name.display()), items, seq_len, pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_parses_fields_and_escapes() {
        let t = Template::parse("Q: {question} {{x}} {n}").unwrap();
        assert_eq!(t.fields().collect::<Vec<_>>(), vec!["question", "n"]);
        let rec: serde_json::Map<String, Value> =
            serde_json::from_str(r#"{"question": "why?", "n": 3}"#).unwrap();
        assert_eq!(t.render(&rec).unwrap(), "Q: why? {x} 3");
        let rec: serde_json::Map<String, Value> = serde_json::from_str(r#"{"n": 3}"#).unwrap();
        assert_eq!(t.render(&rec), Err("question".to_string()));
        assert!(Template::parse("{open").is_err());
        assert!(Template::parse("close}").is_err());
        assert!(Template::parse("{}").is_err());
    }
}
