//! What a chat record holds, by `data.format`: the formats TRL recognises by their keys
//! (`messages`, ShareGPT's `conversations`, prompt-completion, `text`), Alpaca's
//! `instruction`/`input`/`output`, and the refusal of preference records (`chosen`/`rejected`,
//! which are `data=preference`'s). `format: auto` recognises each record by its keys, in this
//! order:
//!
//! 1. `chosen` and `rejected`: preference data, refused with the fix (`data=preference`);
//! 2. `data.messages_key` (`messages`), else `conversations`: a list of turns, each `{role,
//!    content}` or ShareGPT's `{from, value}` (told apart by the first turn's keys);
//! 3. `prompt` and `completion`: prompt-completion, both strings (standard) or both message
//!    lists (conversational);
//! 4. `instruction` and `output`: Alpaca, one user turn of the instruction and the `input`
//!    joined by a blank line (the input left out when empty) and one assistant turn of the
//!    output, as axolotl builds it;
//! 5. `text`: plain text.
//!
//! A record that matches none is an error naming its keys and the formats known. A named
//! format reads only its own keys (`sharegpt` reads `conversations` unless
//! `data.messages_key` names another field).

use flotilla_config::schema::ChatFormat;
use serde::Serialize;
use serde_json::{json, Map, Value};

/// The settings that say how a record is read.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RecordShape<'a> {
    pub format: ChatFormat,
    /// The field of a conversation's turns.
    pub messages_key: &'a str,
    /// Prepended as a system turn to conversations (and conversational prompts) without one.
    pub system: Option<&'a str>,
}

/// A record, read.
#[derive(Clone, Debug, PartialEq)]
pub enum Conversation {
    /// `{role, content}` turns (from messages, ShareGPT or Alpaca records).
    Messages(Vec<Value>),
    /// Conversational prompt-completion: the loss is on the completion's tokens only.
    PromptCompletion {
        prompt: Vec<Value>,
        completion: Vec<Value>,
    },
    /// Standard prompt-completion strings: the loss is on the completion's tokens only.
    PromptCompletionText { prompt: String, completion: String },
    /// Plain text, trained everywhere.
    Text(String),
}

/// The formats `auto` knows, for error messages.
const KNOWN: &str = "messages (a 'messages' list, or data.messages_key), sharegpt \
                     ('conversations'), prompt_completion ('prompt' and 'completion'), alpaca \
                     ('instruction', 'input', 'output'), text ('text')";

/// How a record is read as `shape` says (the error is a message for [`DataError::Record`]).
///
/// [`DataError::Record`]: super::error::DataError::Record
pub fn read(record: &Value, shape: &RecordShape<'_>) -> Result<Conversation, String> {
    let Value::Object(obj) = record else {
        return Err("a record must be a JSON object".into());
    };
    match shape.format {
        ChatFormat::Auto => auto(obj, shape),
        ChatFormat::Messages => turns(obj, shape.messages_key, Turns::Messages, shape),
        ChatFormat::Sharegpt => {
            let key = match shape.messages_key {
                "messages" => "conversations",
                other => other,
            };
            turns(obj, key, Turns::Sharegpt, shape)
        }
        ChatFormat::PromptCompletion => prompt_completion(obj, shape),
        ChatFormat::Alpaca => alpaca(obj, shape),
        ChatFormat::Text => text(obj),
    }
}

fn keys(obj: &Map<String, Value>) -> String {
    obj.keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn auto(obj: &Map<String, Value>, shape: &RecordShape<'_>) -> Result<Conversation, String> {
    if obj.contains_key("chosen") && obj.contains_key("rejected") {
        return Err(format!(
            "this is a preference record ('chosen' and 'rejected'; its fields are [{}]), which \
             chat data does not train on: use data=preference, or data.format with the field \
             to train on",
            keys(obj)
        ));
    }
    for key in [shape.messages_key, "conversations"] {
        if let Some(found) = obj.get(key) {
            let sharegpt = found
                .as_array()
                .and_then(|list| list.first())
                .is_some_and(|t| t.get("from").is_some() && t.get("role").is_none());
            let kind = if sharegpt {
                Turns::Sharegpt
            } else {
                Turns::Messages
            };
            return turns(obj, key, kind, shape);
        }
    }
    if obj.contains_key("prompt") && obj.contains_key("completion") {
        return prompt_completion(obj, shape);
    }
    if obj.contains_key("instruction") && obj.contains_key("output") {
        return alpaca(obj, shape);
    }
    if obj.contains_key("text") {
        return text(obj);
    }
    Err(format!(
        "the record matches no format: its fields are [{}]; data.format=auto knows {KNOWN}. \
         Rename the fields, set data.messages_key to the field of the turns, or set data.format",
        keys(obj)
    ))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Turns {
    Messages,
    Sharegpt,
}

fn turns(
    obj: &Map<String, Value>,
    key: &str,
    kind: Turns,
    shape: &RecordShape<'_>,
) -> Result<Conversation, String> {
    let Some(list) = obj.get(key) else {
        let hint = if kind == Turns::Messages && obj.contains_key("conversations") {
            "; this looks like ShareGPT data: set data.format=sharegpt (or auto)"
        } else {
            ""
        };
        return Err(format!(
            "record has no '{key}' list (data.messages_key); its fields are [{}]{hint}",
            keys(obj)
        ));
    };
    let Value::Array(list) = list else {
        return Err(format!(
            "'{key}' is {}, not a list of turns: write each record's '{key}' as a list of \
             {{\"role\", \"content\"}} objects (a Parquet column of list<struct<role, \
             content>>), or set data.messages_key to the field that holds them",
            type_name(list)
        ));
    };
    let messages = match kind {
        Turns::Messages => role_turns(list, key)?,
        Turns::Sharegpt => sharegpt_turns(list)?,
    };
    Ok(Conversation::Messages(with_system(messages, shape.system)))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// `{role, content}` turns as they are.
fn role_turns(list: &[Value], key: &str) -> Result<Vec<Value>, String> {
    list.iter()
        .enumerate()
        .map(|(i, turn)| match turn {
            Value::Object(t) if matches!(t.get("role"), Some(Value::String(_))) => Ok(turn.clone()),
            Value::Object(_) => Err(format!("'{key}' turn {} has no string 'role'", i + 1)),
            _ => Err(format!("'{key}' turn {} is not an object", i + 1)),
        })
        .collect()
}

/// ShareGPT's `{from, value}` turns as `{role, content}`.
fn sharegpt_turns(list: &[Value]) -> Result<Vec<Value>, String> {
    let mut messages = Vec::with_capacity(list.len());
    for (i, turn) in list.iter().enumerate() {
        let Value::Object(t) = turn else {
            return Err(format!("turn {} is not an object", i + 1));
        };
        let from = t
            .get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("turn {} has no string 'from' (ShareGPT format)", i + 1))?;
        let role = match from {
            "human" | "user" => "user",
            "gpt" | "assistant" | "chatgpt" | "model" => "assistant",
            "system" => "system",
            other => {
                return Err(format!(
                    "turn {} is from '{other}', which has no role (ShareGPT turns are from \
                     human, gpt or system)",
                    i + 1
                ))
            }
        };
        let value = t.get("value").cloned().unwrap_or(Value::Null);
        messages.push(json!({"role": role, "content": value}));
    }
    Ok(messages)
}

/// `system` prepended to `messages` unless they start with a system turn.
fn with_system(mut messages: Vec<Value>, system: Option<&str>) -> Vec<Value> {
    if let Some(system) = system {
        let has_system = messages
            .first()
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            == Some("system");
        if !has_system {
            messages.insert(0, json!({"role": "system", "content": system}));
        }
    }
    messages
}

fn prompt_completion(
    obj: &Map<String, Value>,
    shape: &RecordShape<'_>,
) -> Result<Conversation, String> {
    let (Some(prompt), Some(completion)) = (obj.get("prompt"), obj.get("completion")) else {
        return Err(format!(
            "record has no 'prompt' and 'completion' (data.format=prompt_completion); its \
             fields are [{}]",
            keys(obj)
        ));
    };
    match (prompt, completion) {
        (Value::String(p), Value::String(c)) => Ok(Conversation::PromptCompletionText {
            prompt: p.clone(),
            completion: c.clone(),
        }),
        (Value::Array(p), Value::Array(c)) => Ok(Conversation::PromptCompletion {
            prompt: with_system(role_turns(p, "prompt")?, shape.system),
            completion: role_turns(c, "completion")?,
        }),
        (p, c) => Err(format!(
            "'prompt' is {} and 'completion' is {}: both must be strings (standard \
             prompt-completion) or both lists of messages (conversational)",
            type_name(p),
            type_name(c)
        )),
    }
}

fn alpaca(obj: &Map<String, Value>, shape: &RecordShape<'_>) -> Result<Conversation, String> {
    let field = |name: &str| -> Result<Option<&str>, String> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(format!(
                "Alpaca field '{name}' is {}, not a string",
                type_name(other)
            )),
        }
    };
    let (Some(instruction), Some(output)) = (field("instruction")?, field("output")?) else {
        return Err(format!(
            "record has no 'instruction' and 'output' strings (data.format=alpaca); its fields \
             are [{}]",
            keys(obj)
        ));
    };
    let user = match field("input")? {
        Some(input) if !input.is_empty() => format!("{instruction}\n\n{input}"),
        _ => instruction.to_string(),
    };
    let messages = vec![
        json!({"role": "user", "content": user}),
        json!({"role": "assistant", "content": output}),
    ];
    Ok(Conversation::Messages(with_system(messages, shape.system)))
}

fn text(obj: &Map<String, Value>) -> Result<Conversation, String> {
    match obj.get("text") {
        Some(Value::String(t)) => Ok(Conversation::Text(t.clone())),
        Some(other) => Err(format!("'text' is {}, not a string", type_name(other))),
        None => Err(format!(
            "record has no 'text' (data.format=text); its fields are [{}]",
            keys(obj)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(format: ChatFormat) -> RecordShape<'static> {
        RecordShape {
            format,
            messages_key: "messages",
            system: None,
        }
    }

    #[test]
    fn auto_recognises_each_format_by_its_keys() {
        let auto = shape(ChatFormat::Auto);
        let m = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            read(&m, &auto).unwrap(),
            Conversation::Messages(vec![json!({"role": "user", "content": "hi"})])
        );
        let s = json!({"conversations": [{"from": "human", "value": "hi"}]});
        assert_eq!(
            read(&s, &auto).unwrap(),
            Conversation::Messages(vec![json!({"role": "user", "content": "hi"})])
        );
        let pc = json!({"prompt": "2+2=", "completion": "4"});
        assert_eq!(
            read(&pc, &auto).unwrap(),
            Conversation::PromptCompletionText {
                prompt: "2+2=".into(),
                completion: "4".into()
            }
        );
        let t = json!({"text": "once"});
        assert_eq!(read(&t, &auto).unwrap(), Conversation::Text("once".into()));
    }

    #[test]
    fn alpaca_joins_instruction_and_input_with_a_blank_line() {
        let a = json!({"instruction": "Add.", "input": "2 and 2", "output": "4"});
        assert_eq!(
            read(&a, &shape(ChatFormat::Auto)).unwrap(),
            Conversation::Messages(vec![
                json!({"role": "user", "content": "Add.\n\n2 and 2"}),
                json!({"role": "assistant", "content": "4"}),
            ])
        );
        let no_input = json!({"instruction": "Say hi.", "input": "", "output": "hi"});
        let Conversation::Messages(m) = read(&no_input, &shape(ChatFormat::Alpaca)).unwrap() else {
            panic!()
        };
        assert_eq!(m[0]["content"], "Say hi.");
    }

    #[test]
    fn sharegpt_turns_map_to_roles_and_system_is_prepended() {
        let r = json!({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]});
        let s = RecordShape {
            system: Some("be brief"),
            ..shape(ChatFormat::Sharegpt)
        };
        assert_eq!(
            read(&r, &s).unwrap(),
            Conversation::Messages(vec![
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": "yo"}),
            ])
        );
        let bad = json!({"conversations": [{"from": "tool", "value": "x"}]});
        let err = read(&bad, &shape(ChatFormat::Sharegpt)).unwrap_err();
        assert!(err.contains("from 'tool'"), "{err}");
    }

    #[test]
    fn a_record_without_messages_names_its_fields_and_the_sharegpt_fix() {
        let r = json!({"conversations": [], "id": 3});
        let err = read(&r, &shape(ChatFormat::Messages)).unwrap_err();
        assert!(err.contains("no 'messages' list"), "{err}");
        assert!(err.contains("[conversations, id]"), "{err}");
        assert!(err.contains("data.format=sharegpt"), "{err}");
    }

    #[test]
    fn preference_and_unknown_records_name_the_fix() {
        let p = json!({"prompt": "q", "chosen": "a", "rejected": "b"});
        let err = read(&p, &shape(ChatFormat::Auto)).unwrap_err();
        assert!(err.contains("data=preference"), "{err}");
        let u = json!({"question": "q", "answer": "a"});
        let err = read(&u, &shape(ChatFormat::Auto)).unwrap_err();
        assert!(
            err.contains("[question, answer]") && err.contains("alpaca"),
            "{err}"
        );
        let mixed = json!({"prompt": [{"role": "user", "content": "q"}], "completion": "a"});
        let err = read(&mixed, &shape(ChatFormat::Auto)).unwrap_err();
        assert!(err.contains("both must be strings"), "{err}");
    }
}
