//! Tokenizers (`data.tokenizer`), all of them Hugging Face `tokenizers` objects so that every
//! run can save the exact tokenizer it used as a `tokenizer.json` that Python loads unchanged:
//!
//! - `byte`: ids 0..=255 are the bytes of the UTF-8 text, then the special tokens
//!   [`PAD`] = 256, [`BOS`] = 257, [`EOS`] = 258 (259 ids). It is a GPT-2 style byte-level BPE
//!   with no merges, so decoding is exact for any text.
//! - `bpe`: a byte-level BPE trained on the training corpus with `data.vocab_size` ids in all:
//!   [`PAD`] = 0, [`BOS`] = 1, [`EOS`] = 2, the 256 byte symbols, then the learned merges. It is
//!   saved as `<run_dir>/tokenizer.json`, and a run directory that already has one (a resumed
//!   run) loads it instead of training again.
//! - a path: a Hugging Face `tokenizer.json`. Its special tokens are read from a sibling
//!   `tokenizer_config.json` (`eos_token`, `bos_token`, `pad_token`) when there is one, else
//!   recognised by their usual names (`</s>`, `<|endoftext|>`, `<|end_of_text|>`, ...).
//!
//! Data encoding never adds special tokens through the tokenizer's post-processor; the datasets
//! place BOS/EOS themselves (see the module docs of `text` and `jsonl`).

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use tokenizers::models::bpe::BpeTrainer;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use super::byte_level_encoder::{ByteLevelEncoder, Encoded};
use super::error::{DataError, Result};
use super::metaspace_encoder::MetaspaceEncoder;
use super::unicode_forms::{already_in, unicode_forms, UnicodeForm};

/// Padding token of the built-in tokenizers.
pub const PAD: &str = "<pad>";
/// Beginning-of-sequence token of the built-in tokenizers.
pub const BOS: &str = "<bos>";
/// End-of-sequence (and document separator) token of the built-in tokenizers.
pub const EOS: &str = "<eos>";

/// Ids of the byte tokenizer: 256 bytes plus PAD, BOS, EOS.
pub const BYTE_TOKENIZER_VOCAB: usize = flotilla_config::schema::BYTE_TOKENIZER_IDS;

const EOS_NAMES: &[&str] = &[
    EOS,
    "</s>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "<|eot_id|>",
    "[SEP]",
];
const BOS_NAMES: &[&str] = &[BOS, "<s>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]"];
const PAD_NAMES: &[&str] = &[PAD, "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>"];

/// Which kind of tokenizer this is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// The built-in byte-level tokenizer.
    Byte,
    /// A BPE trained by flotilla (or reloaded from a run directory).
    Bpe,
    /// A `tokenizer.json` given by path.
    File(PathBuf),
    /// The character-level tokenizer of the built-in arithmetic data.
    Arithmetic,
}

/// A tokenizer with its special ids.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    kind: TokenizerKind,
    pad_id: Option<u32>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    /// One more than the largest id the tokenizer can produce.
    id_limit: usize,
    /// Files saved beside `tokenizer.json` (a Hugging Face directory's `tokenizer_config.json`,
    /// `special_tokens_map.json`, `chat_template.jinja`), as `(name, bytes)`.
    companions: Vec<(String, Vec<u8>)>,
    /// The `tokenizer.json` it was read from, byte for byte: saved as it is, so that a
    /// directory written beside a model holds the base's own file.
    source_json: Option<Vec<u8>>,
    /// When the normalizer only applies Unicode forms: the same tokenizer without it, for texts
    /// already in those forms (see `unicode_forms`).
    without_normalizer: Option<(tokenizers::Tokenizer, Vec<UnicodeForm>)>,
    /// The faster encoder of a byte-level or SentencePiece-style BPE pipeline, for texts
    /// encoded without a normalizer (see `byte_level_encoder`, `metaspace_encoder`); shared by
    /// the clones of this tokenizer.
    fast: Option<std::sync::Arc<FastEncoder>>,
}

/// An encoder that gives `tokenizers`' ids and start offsets for the pipelines it recognises,
/// faster.
enum FastEncoder {
    /// Boxed: its byte table is 4 KB.
    ByteLevel(Box<ByteLevelEncoder>),
    Metaspace(MetaspaceEncoder),
}

impl FastEncoder {
    fn recognise(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        ByteLevelEncoder::recognise(tokenizer)
            .map(|e| FastEncoder::ByteLevel(Box::new(e)))
            .or_else(|| MetaspaceEncoder::recognise(tokenizer).map(FastEncoder::Metaspace))
    }

    fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        with_starts: bool,
    ) -> tokenizers::Result<Encoded> {
        match self {
            FastEncoder::ByteLevel(e) => e.encode(tokenizer, text, with_starts),
            FastEncoder::Metaspace(e) => e.encode(tokenizer, text, with_starts),
        }
    }
}

/// The files of a Hugging Face tokenizer directory that travel with `tokenizer.json`.
const COMPANION_FILES: &[&str] = &[
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.id_limit)
            .field("pad_id", &self.pad_id)
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

fn tok_err(what: impl Into<String>, e: impl std::fmt::Display) -> DataError {
    DataError::Tokenizer {
        what: what.into(),
        message: e.to_string(),
    }
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes map to themselves, the others to
/// U+0100 onward, so every byte has a visible character.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        table[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            let c = char::from_u32(next).unwrap();
            next += 1;
            c
        };
    }
    table
}

fn added_token(id: u32, content: &str) -> Value {
    json!({
        "id": id, "content": content, "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true
    })
}

fn byte_level_bpe_json(vocab: Map<String, Value>, added: Vec<Value>) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
        },
        "post_processor": null,
        "decoder": {
            "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true
        },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": []
        }
    })
}

impl Tokenizer {
    /// Wraps a `tokenizers` tokenizer, finding its special ids by the given names.
    pub(crate) fn from_inner(
        inner: tokenizers::Tokenizer,
        kind: TokenizerKind,
        names: SpecialNames,
    ) -> Self {
        let find = |explicit: Option<String>, candidates: &[&str]| {
            explicit
                .and_then(|n| inner.token_to_id(&n))
                .or_else(|| candidates.iter().find_map(|n| inner.token_to_id(n)))
        };
        let eos_id = find(names.eos, EOS_NAMES);
        let bos_id = find(names.bos, BOS_NAMES);
        let pad_id = find(names.pad, PAD_NAMES);
        let id_limit = inner
            .get_vocab(true)
            .values()
            .map(|&i| i as usize + 1)
            .max()
            .unwrap_or(0);
        let without_normalizer = inner.get_normalizer().and_then(unicode_forms).map(|forms| {
            let mut plain = inner.clone();
            plain.with_normalizer(None::<tokenizers::NormalizerWrapper>);
            (plain, forms)
        });
        let fast = FastEncoder::recognise(&inner)
            .filter(|encoder| {
                let plain = match &without_normalizer {
                    Some((plain, _)) => plain,
                    None if inner.get_normalizer().is_none() => &inner,
                    None => return false,
                };
                agrees_on_probe(encoder, plain)
            })
            .map(std::sync::Arc::new);
        Tokenizer {
            inner,
            kind,
            pad_id,
            bos_id,
            eos_id,
            id_limit,
            companions: vec![],
            source_json: None,
            without_normalizer,
            fast,
        }
    }

    /// The tokenizer that encodes `text`: without its Unicode normalizer when the text is
    /// already normalized (the same result, faster), else the whole one.
    fn for_text(&self, text: &str) -> &tokenizers::Tokenizer {
        match &self.without_normalizer {
            Some((plain, forms)) if already_in(text, forms) => plain,
            _ => &self.inner,
        }
    }

    pub(crate) fn from_json(value: &Value, kind: TokenizerKind) -> Result<Self> {
        let inner: tokenizers::Tokenizer = value
            .to_string()
            .parse()
            .map_err(|e| tok_err("(built-in)", e))?;
        Ok(Self::from_inner(inner, kind, SpecialNames::default()))
    }

    /// The built-in byte-level tokenizer: bytes are ids 0..=255, then PAD, BOS, EOS.
    pub fn byte() -> Self {
        let table = byte_to_char();
        let vocab: Map<String, Value> =
            (0..256).map(|b| (table[b].to_string(), json!(b))).collect();
        let added = vec![
            added_token(256, PAD),
            added_token(257, BOS),
            added_token(258, EOS),
        ];
        Self::from_json(&byte_level_bpe_json(vocab, added), TokenizerKind::Byte)
            .expect("the built-in byte tokenizer is valid")
    }

    /// Loads a Hugging Face `tokenizer.json` (`key` names the config key, for errors).
    pub fn from_file(path: impl AsRef<Path>, key: &str) -> Result<Self> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(DataError::NotFound {
                key: key.to_string(),
                path: path.to_path_buf(),
            });
        }
        let source_json = std::fs::read(path).map_err(|e| DataError::io(path.to_path_buf(), e))?;
        let inner = tokenizers::Tokenizer::from_bytes(&source_json)
            .map_err(|e| tok_err(path.display().to_string(), e))?;
        let mut companions = vec![];
        for name in COMPANION_FILES {
            let file = path.with_file_name(name);
            match std::fs::read(&file) {
                Ok(bytes) => companions.push((name.to_string(), bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(DataError::io(file, e)),
            }
        }
        let names = match companions
            .iter()
            .find(|(n, _)| n == "tokenizer_config.json")
        {
            Some((n, bytes)) => SpecialNames::from_config(bytes, &path.with_file_name(n))?,
            None => SpecialNames::default(),
        };
        let mut tokenizer = Self::from_inner(inner, TokenizerKind::File(path.to_path_buf()), names);
        tokenizer.companions = companions;
        tokenizer.source_json = Some(source_json);
        Ok(tokenizer)
    }

    /// Saves `template` as the `chat_template.jinja` beside `tokenizer.json` (it takes
    /// precedence over `tokenizer_config.json`'s, for transformers as for flotilla).
    pub fn set_chat_template(&mut self, template: &str) {
        self.companions.retain(|(n, _)| n != "chat_template.jinja");
        self.companions
            .push(("chat_template.jinja".into(), template.as_bytes().to_vec()));
    }

    /// Writes `tokenizer.json` into `dir`, with the files of the Hugging Face tokenizer
    /// directory it was read from (`tokenizer_config.json`, ...), each atomically.
    pub fn save_into(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        self.save(dir.join("tokenizer.json"))?;
        for (name, bytes) in &self.companions {
            write_atomic(&dir.join(name), bytes)?;
        }
        Ok(())
    }

    /// Trains a byte-level BPE with `vocab_size` ids in all (PAD, BOS, EOS = 0, 1, 2, the 256
    /// byte symbols, then merges) on `texts`. Deterministic for the same texts.
    pub fn train_bpe<I, S>(texts: I, vocab_size: usize) -> Result<Self>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        let min = 3 + 256;
        if vocab_size < min {
            return Err(DataError::config(
                "data.vocab_size",
                format!(
                    "{vocab_size} is below the {min} ids a byte-level BPE needs (3 special tokens \
                     and 256 bytes); set data.vocab_size={min} or more"
                ),
            ));
        }
        let base = byte_level_bpe_json(Map::new(), vec![]);
        let mut inner: tokenizers::Tokenizer =
            base.to_string().parse().map_err(|e| tok_err("bpe", e))?;
        let trainer = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .special_tokens(vec![
                AddedToken::from(PAD, true),
                AddedToken::from(BOS, true),
                AddedToken::from(EOS, true),
            ])
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut trainer: TrainerWrapper = trainer.into();
        inner
            .train(&mut trainer, texts)
            .map_err(|e| tok_err("bpe training", e))?;
        Ok(Self::from_inner(
            inner,
            TokenizerKind::Bpe,
            SpecialNames::default(),
        ))
    }

    /// Writes `tokenizer.json` atomically (a temporary file in the same folder, then a rename):
    /// the file it was read from as it was, else its serialisation.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(bytes) = &self.source_json {
            return write_atomic(path, bytes);
        }
        let text = self
            .inner
            .to_string(true)
            .map_err(|e| tok_err("serialisation", e))?;
        write_atomic(path, text.as_bytes())
    }

    /// Token ids of `text`, with no special tokens added by a post-processor.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let t = self.for_text(text);
        if let Some(encoder) = self.fast_for(t) {
            let e = encoder
                .encode(t, text, false)
                .map_err(|e| tok_err("encode", e))?;
            return Ok(e.ids);
        }
        let enc = t
            .encode_fast(text, false)
            .map_err(|e| tok_err("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` with the byte offset in `text` where each token starts (no special
    /// tokens added by a post-processor).
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, Vec<usize>)> {
        let t = self.for_text(text);
        if let Some(encoder) = self.fast_for(t) {
            let e = encoder
                .encode(t, text, true)
                .map_err(|e| tok_err("encode", e))?;
            return Ok((e.ids, e.starts));
        }
        let enc = t.encode(text, false).map_err(|e| tok_err("encode", e))?;
        let starts = enc.get_offsets().iter().map(|o| o.0).collect();
        Ok((enc.get_ids().to_vec(), starts))
    }

    /// The fast encoder, when `t` (what [`for_text`](Self::for_text) chose) encodes without a
    /// normalizer.
    fn fast_for(&self, t: &tokenizers::Tokenizer) -> Option<&FastEncoder> {
        self.fast
            .as_deref()
            .filter(|_| t.get_normalizer().is_none())
    }

    /// The text of `ids`; `skip_special` drops PAD/BOS/EOS and other special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| tok_err("decode", e))
    }

    /// Which faster exact encoder this tokenizer uses for texts its normalizer leaves alone:
    /// `byte-level` (GPT-2, Llama 3, Qwen2 pipelines), `metaspace` (Llama 2, Mistral, Phi-3),
    /// or `None` (`tokenizers` itself).
    pub fn fast_encoder(&self) -> Option<&'static str> {
        self.fast.as_deref().map(|e| match e {
            FastEncoder::ByteLevel(_) => "byte-level",
            FastEncoder::Metaspace(_) => "metaspace",
        })
    }

    /// One more than the largest id this tokenizer produces: the model's vocabulary must be at
    /// least this large.
    pub fn vocab_size(&self) -> usize {
        self.id_limit
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// The end-of-sequence id, or an error saying that the tokenizer has none.
    pub fn require_eos(&self) -> Result<u32> {
        self.eos_id.ok_or_else(|| DataError::Tokenizer {
            what: format!("{:?}", self.kind),
            message: format!(
                "has no end-of-sequence token (looked for eos_token in tokenizer_config.json and \
                 for {}); packing and prompt/completion data need one",
                EOS_NAMES.join(", ")
            ),
        })
    }

    pub fn kind(&self) -> &TokenizerKind {
        &self.kind
    }

    /// The underlying `tokenizers` object.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Special-token names given explicitly (by a `tokenizer_config.json`).
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialNames {
    eos: Option<String>,
    bos: Option<String>,
    pad: Option<String>,
}

impl SpecialNames {
    /// The names a `tokenizer_config.json` (its bytes, read from `path`) gives.
    fn from_config(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| tok_err(path.display().to_string(), format!("invalid JSON: {e}")))?;
        let name = |key: &str| value.get(key).and_then(token_text);
        Ok(SpecialNames {
            eos: name("eos_token"),
            bos: name("bos_token"),
            pad: name("pad_token"),
        })
    }
}

/// A special token as `tokenizer_config.json` stores it: a string, or an added-token object
/// with its `content`.
pub(crate) fn token_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
        _ => None,
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so readers never see a
/// partial file and concurrent writers of the same content do not corrupt it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|source| DataError::Write {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| DataError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The tokenizer a `data.tokenizer` value asks for. `corpus` yields the training texts and is
/// only called when a BPE must be trained; `run_dir/tokenizer.json` is reused when present (a
/// resumed run), else written after training.
pub fn tokenizer_for_spec<F>(
    spec: &flotilla_config::schema::TokenizerSpec,
    vocab_size: usize,
    run_dir: Option<&Path>,
    corpus: F,
) -> Result<Tokenizer>
where
    F: FnOnce() -> Result<Vec<String>>,
{
    use flotilla_config::schema::TokenizerSpec;
    match spec {
        TokenizerSpec::Byte => Ok(Tokenizer::byte()),
        TokenizerSpec::File(p) => Tokenizer::from_file(p, "data.tokenizer"),
        TokenizerSpec::Bpe => {
            let saved = run_dir.map(|d| d.join("tokenizer.json"));
            if let Some(saved) = saved.as_ref().filter(|p| p.exists()) {
                let inner = tokenizers::Tokenizer::from_file(saved)
                    .map_err(|e| tok_err(saved.display().to_string(), e))?;
                return Ok(Tokenizer::from_inner(
                    inner,
                    TokenizerKind::Bpe,
                    SpecialNames::default(),
                ));
            }
            let texts = corpus()?;
            let tok = Tokenizer::train_bpe(texts.iter(), vocab_size)?;
            if let Some(saved) = saved {
                tok.save(saved)?;
            }
            Ok(tok)
        }
    }
}

/// A text that exercises what the fast encoders compute (added tokens, spaces before and after
/// them, runs of whitespace and newlines, multi-byte characters, digits, a literal `▁`): an
/// encoder is used only when it gives `plain`'s ids and offsets on it.
const PROBE: &str = "<|im_start|>user\n  Hello, world!\r\n\n\tcaf\u{e9} \u{1f980} \u{65e5}\u{672c} it's 12,345.6<|im_end|> <|eot_id|>\n\n  x  <|endoftext|><eos></s> [INST] a \u{2581}b\u{2581} [/INST]<s>  ";

fn agrees_on_probe(encoder: &FastEncoder, plain: &tokenizers::Tokenizer) -> bool {
    let (Ok(want), Ok(got)) = (
        plain.encode(PROBE, false),
        encoder.encode(plain, PROBE, true),
    ) else {
        return false;
    };
    let starts: Vec<usize> = want.get_offsets().iter().map(|o| o.0).collect();
    let agrees = got.ids == want.get_ids() && got.starts == starts;
    if !agrees {
        tracing::debug!(
            "the fast encoder disagrees with tokenizers on the probe text; using tokenizers"
        );
    }
    agrees
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokenizer_round_trips_any_text() {
        let t = Tokenizer::byte();
        let text = "héllo wörld\n\t\u{0}\u{7f} 🦀 <eos>?";
        let ids = t.encode("héllo").unwrap();
        assert_eq!(ids, "héllo".bytes().map(u32::from).collect::<Vec<_>>());
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), text);
        assert_eq!(t.vocab_size(), BYTE_TOKENIZER_VOCAB);
        assert_eq!(
            (t.pad_id(), t.bos_id(), t.eos_id()),
            (Some(256), Some(257), Some(258))
        );
    }

    #[test]
    fn a_unicode_normalizer_is_skipped_only_where_it_changes_nothing() {
        let mut inner = Tokenizer::byte().inner().clone();
        inner.with_normalizer(Some(tokenizers::normalizers::unicode::NFC));
        let t = Tokenizer::from_inner(inner, TokenizerKind::Byte, SpecialNames::default());
        for text in [
            "plain <eos> ascii",
            "caf\u{e9} 🦀 日本",
            "cafe\u{301} and e\u{301}t\u{e9}",
            "\u{fb01}",
        ] {
            let whole = t.inner().encode(text, false).unwrap();
            let starts: Vec<usize> = whole.get_offsets().iter().map(|o| o.0).collect();
            assert_eq!(
                t.encode_with_offsets(text).unwrap(),
                (whole.get_ids().to_vec(), starts),
                "{text:?}"
            );
            assert_eq!(t.encode(text).unwrap(), whole.get_ids(), "{text:?}");
        }
        // a decomposed é is composed by NFC: two bytes, where the raw text has three
        assert_eq!(
            t.encode("e\u{301}").unwrap(),
            "\u{e9}".bytes().map(u32::from).collect::<Vec<_>>()
        );
    }

    #[test]
    fn byte_table_is_a_bijection() {
        let table = byte_to_char();
        let set: std::collections::HashSet<char> = table.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(set, ByteLevel::alphabet().into_iter().collect());
    }
}
