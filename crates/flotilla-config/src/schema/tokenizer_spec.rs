//! `data.tokenizer` of the `text` and `jsonl` kinds ([`TokenizerSpec`]): what it names, how a
//! job without one resolves it, and how it is read from a node.

use super::from_node::{Cx, Fail, FromNode, Parsed};
use super::messages::{alternatives, set_note, show, suggest};
use super::ProblemKind;
use crate::node::{Node, Value};
use serde::{Deserialize, Serialize};

/// `data.tokenizer`: the byte-level tokenizer, a BPE tokenizer trained on the data
/// (`data.vocab_size` tokens), or a Hugging Face `tokenizer.json` file. A file is recognised by
/// a `/` in the value or a `.json` ending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum TokenizerSpec {
    Byte,
    Bpe,
    File(String),
}

impl From<String> for TokenizerSpec {
    fn from(s: String) -> Self {
        match s.as_str() {
            "byte" => TokenizerSpec::Byte,
            "bpe" => TokenizerSpec::Bpe,
            _ => TokenizerSpec::File(s),
        }
    }
}

impl TokenizerSpec {
    /// The tokenizer `data.tokenizer` asks for: as set, or when unset (`null`) the base's
    /// (`model.init_from/tokenizer.json`) for a job that starts from one, else `byte`.
    pub fn resolve(spec: Option<&TokenizerSpec>, init_from: Option<&str>) -> TokenizerSpec {
        match (spec, init_from) {
            (Some(s), _) => s.clone(),
            (None, Some(dir)) => TokenizerSpec::File(
                std::path::Path::new(dir)
                    .join("tokenizer.json")
                    .to_string_lossy()
                    .into_owned(),
            ),
            (None, None) => TokenizerSpec::Byte,
        }
    }
}

impl From<TokenizerSpec> for String {
    fn from(t: TokenizerSpec) -> Self {
        match t {
            TokenizerSpec::Byte => "byte".into(),
            TokenizerSpec::Bpe => "bpe".into(),
            TokenizerSpec::File(p) => p,
        }
    }
}

impl FromNode for TokenizerSpec {
    fn expected() -> String {
        "'byte', 'bpe' or a path to a tokenizer.json".into()
    }
    fn example() -> String {
        "byte".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let Value::Str(s) = &node.value else {
            return Err(Fail::WrongType);
        };
        if s == "byte" || s == "bpe" || s.contains('/') || s.ends_with(".json") {
            return Ok(TokenizerSpec::from(s.clone()));
        }
        let mut message = format!(
            "{key}: expected {}, got {}{}",
            Self::expected(),
            show(&node.value),
            set_note(&node.origin)
        );
        let near = suggest(s, &["byte", "bpe"]);
        if near.is_empty() {
            message.push_str("; a tokenizer file needs a '/' or a .json ending, e.g. ./tok.json");
        } else {
            message.push_str(&format!("; did you mean {}?", alternatives(&near, true)));
        }
        cx.push(ProblemKind::BadChoice, key, &node.origin, message);
        Err(Fail::Reported)
    }
}
