//! The encoder of SentencePiece-style BPE tokenizers (Llama 2, Mistral, Phi-3: a `Metaspace`
//! pre-tokenizer without splitting, a BPE model, usually with byte fallback): the same ids and
//! token start offsets as `tokenizers`' own `encode`, encoding each word on its own with a
//! per-thread cache instead of the whole text between two added tokens as one word.
//!
//! `Metaspace` with `split: false` turns every space into `▁` (and may put one `▁` before the
//! text) and hands the BPE model the whole segment as a single word, which the model's own word
//! cache cannot serve. BPE merges act only within adjacent symbols, so when no token of the
//! vocabulary holds a `▁` after another character, no merge can join a character with a `▁`
//! that follows it: the segment cut before every such `▁` encodes, piece by piece, to exactly
//! the tokens of the whole (each piece's merges happen in the same order as within the whole).
//! [`MetaspaceEncoder::recognise`] checks that condition on the vocabulary; pieces repeat
//! (words, the template's own text), so each thread keeps what every short piece encoded to,
//! in the piece cache it shares with [`super::byte_level_encoder`]. As with that encoder, a
//! tokenizer is only given this one after it agreed with `tokenizers` on a probe text.

use std::sync::atomic::Ordering;

use tokenizers::{Model, ModelWrapper};

use super::byte_level_encoder::{
    encode_segments, remember, Encoded, PieceCache, PieceToken, TokenSink, NEXT_ENCODER_ID,
};

/// When `Metaspace` puts a `▁` before a segment that does not start with one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prepend {
    Always,
    /// Only before the segment at the very start of the text.
    First,
    Never,
}

/// A recognised SentencePiece-style pipeline.
pub(crate) struct MetaspaceEncoder {
    /// Tells this encoder's piece cache from another's on the same thread.
    id: u64,
    replacement: char,
    prepend: Prepend,
}

impl MetaspaceEncoder {
    /// The encoder of `tokenizer`'s pipeline, its normalizer aside (the caller uses it only
    /// when there is none); `None` when the pipeline is not one this module reproduces or its
    /// vocabulary could merge across a word boundary.
    pub(crate) fn recognise(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return None;
        };
        // `ignore_merges` looks a whole word up in the vocabulary first: a piece of the word
        // could be found where the whole would have been merged.
        let plain_bpe = bpe.dropout.is_none_or(|p| p == 0.0)
            && !bpe.ignore_merges
            && bpe.continuing_subword_prefix.is_none()
            && bpe.end_of_word_suffix.is_none();
        if !plain_bpe {
            return None;
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        if pre["type"] != "Metaspace" || pre["split"] != false {
            return None;
        }
        let replacement = single_char(pre["replacement"].as_str()?)?;
        let prepend = match pre["prepend_scheme"].as_str()? {
            "always" => Prepend::Always,
            "first" => Prepend::First,
            "never" => Prepend::Never,
            _ => return None,
        };
        if let Some(post) = tokenizer.get_post_processor() {
            // With no special tokens added, a template changes nothing.
            if serde_json::to_value(post).ok()?["type"] != "TemplateProcessing" {
                return None;
            }
        }
        let vocab = bpe.get_vocab();
        if !vocab.contains_key(&replacement.to_string()) {
            return None;
        }
        let joins_words = vocab
            .keys()
            .any(|token| token.trim_start_matches(replacement).contains(replacement));
        if joins_words {
            return None;
        }
        Some(MetaspaceEncoder {
            id: NEXT_ENCODER_ID.fetch_add(1, Ordering::Relaxed),
            replacement,
            prepend,
        })
    }

    /// Encodes `text` with `tokenizer` (the one [`recognise`](Self::recognise)d, without a
    /// normalizer); `with_starts` also returns token start offsets.
    pub(crate) fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        with_starts: bool,
    ) -> tokenizers::Result<Encoded> {
        let model = tokenizer.get_model();
        let mut piece = String::new();
        encode_segments(
            tokenizer,
            text,
            self.id,
            (with_starts, None),
            |segment, base, cache, out| {
                let Some(first) = segment.chars().next() else {
                    return Ok(());
                };
                let starts_with_replacement = first == ' ' || first == self.replacement;
                let prepended = !starts_with_replacement
                    && match self.prepend {
                        Prepend::Always => true,
                        Prepend::First => base == 0,
                        Prepend::Never => false,
                    };
                // Cut before every `▁` (or space) that follows another character.
                let (mut from, mut after_replacement) = (0, prepended);
                let mut with_prefix = prepended;
                for (i, c) in segment.char_indices() {
                    let is_replacement = c == ' ' || c == self.replacement;
                    if is_replacement && !after_replacement && i > from {
                        let word = Word {
                            text: &segment[from..i],
                            at: base + from,
                            prefixed: with_prefix,
                        };
                        self.encode_word(model, word, cache, out, &mut piece)?;
                        from = i;
                        with_prefix = false;
                    }
                    after_replacement = is_replacement;
                }
                let word = Word {
                    text: &segment[from..],
                    at: base + from,
                    prefixed: with_prefix,
                };
                self.encode_word(model, word, cache, out, &mut piece)
            },
        )
    }

    /// Encodes one word: its text with spaces as `▁` (and the prepended `▁`) through the model,
    /// or from the cache; token offsets, which the model gives in that text, are mapped back to
    /// the word's bytes.
    fn encode_word(
        &self,
        model: &ModelWrapper,
        word: Word<'_>,
        cache: &mut PieceCache,
        out: &mut TokenSink,
        piece: &mut String,
    ) -> tokenizers::Result<()> {
        piece.clear();
        if word.prefixed {
            piece.push(self.replacement);
        }
        piece.extend(
            word.text
                .chars()
                .map(|c| if c == ' ' { self.replacement } else { c }),
        );
        let fresh;
        let tokens: &[PieceToken] = match cache.get(piece.as_bytes()) {
            Some(tokens) => tokens,
            None => {
                fresh = model
                    .tokenize(piece)?
                    .iter()
                    .map(|t| PieceToken {
                        id: t.id,
                        start: t.offsets.0 as u32,
                        end: t.offsets.1 as u32,
                        leading: 0,
                    })
                    .collect::<Vec<_>>();
                remember(cache, piece.as_bytes(), &fresh);
                &fresh
            }
        };
        let mut to_text = WordOffsets::new(word, self.replacement);
        for t in tokens {
            let start = to_text.at(t.start as usize);
            let end = to_text.at(t.end as usize);
            out.push(t.id, word.at + start, word.at + end, 0);
        }
        Ok(())
    }
}

/// A piece of a segment: its text, where it starts in the whole text, and whether `Metaspace`
/// put a `▁` before it.
#[derive(Clone, Copy)]
struct Word<'a> {
    text: &'a str,
    at: usize,
    prefixed: bool,
}

/// Maps offsets in a word's model text (spaces as 3-byte `▁`, maybe a prepended `▁`) to byte
/// offsets in the word, for ascending offsets. An offset inside a character is aligned to that
/// character's start; the prepended `▁` and the first character both map to 0, as
/// `tokenizers` aligns a prepended character with the one it precedes.
struct WordOffsets<'a> {
    chars: std::str::CharIndices<'a>,
    replacement_len: usize,
    /// The model-text offset where the current character starts, its byte offset in the
    /// word, and its length in the model text.
    current: Option<(usize, usize, usize)>,
    word_len: usize,
}

impl<'a> WordOffsets<'a> {
    fn new(word: Word<'a>, replacement: char) -> Self {
        let replacement_len = replacement.len_utf8();
        let mut offsets = WordOffsets {
            chars: word.text.char_indices(),
            replacement_len,
            current: None,
            word_len: word.text.len(),
        };
        let prefix = if word.prefixed { replacement_len } else { 0 };
        offsets.current = offsets.next_char(prefix);
        offsets
    }

    fn next_char(&mut self, model_at: usize) -> Option<(usize, usize, usize)> {
        let (i, c) = self.chars.next()?;
        let len = if c == ' ' {
            self.replacement_len
        } else {
            c.len_utf8()
        };
        Some((model_at, i, len))
    }

    fn at(&mut self, offset: usize) -> usize {
        while let Some((model_at, i, len)) = self.current {
            if offset < model_at + len {
                return i;
            }
            self.current = self.next_char(model_at + len);
        }
        self.word_len
    }
}

fn single_char(s: &str) -> Option<char> {
    let mut chars = s.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A Llama 2 style tokenizer: `Metaspace` (prepend `first`, no split), BPE with byte
    /// fallback over a small vocabulary (every byte, a few words, runs of `▁`), added tokens.
    fn llama2_like(vocab_extra: &[&str]) -> tokenizers::Tokenizer {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<unk>".into(), json!(0));
        for b in 0..=255u32 {
            vocab.insert(format!("<0x{b:02X}>"), json!(vocab.len()));
        }
        let mut merges = vec![];
        for (a, b) in [
            ("▁", "▁"),
            ("▁▁", "▁▁"),
            ("h", "e"),
            ("l", "l"),
            ("he", "ll"),
            ("hell", "o"),
            ("▁", "hello"),
            ("▁", "w"),
            ("o", "r"),
            ("▁w", "or"),
            ("▁wor", "l"),
            ("▁worl", "d"),
        ] {
            merges.push(json!([a, b]));
            for piece in [a.to_string(), b.to_string(), format!("{a}{b}")] {
                if !vocab.contains_key(&piece) {
                    vocab.insert(piece, json!(vocab.len()));
                }
            }
        }
        for c in "abcdefghijklmnopqrstuvwxyz,.!'".chars() {
            if !vocab.contains_key(&c.to_string()) {
                vocab.insert(c.to_string(), json!(vocab.len()));
            }
        }
        for extra in vocab_extra {
            vocab.insert(extra.to_string(), json!(vocab.len()));
        }
        let n = vocab.len();
        let added: Vec<Value> = ["<s>", "</s>", "[INST]", "[/INST]"]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": n + i, "content": c, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let json = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁",
                              "prepend_scheme": "first", "split": false},
            "post_processor": null, "decoder": null,
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": merges}
        });
        json.to_string().parse().unwrap()
    }

    const TEXTS: &[&str] = &[
        "hello world",
        " hello  world   ",
        "[INST] hello world [/INST] hello.</s><s>[INST]  hi",
        "héllo wörld 🦀\n\n\tdone",
        "▁literal ▁▁ markers▁ and spaces ▁",
        "",
        "   ",
        "<s>",
        "hello<s> world</s>  ",
        "日本語 text, with 12 numbers!",
    ];

    #[test]
    fn ids_and_starts_equal_tokenizers_on_tricky_texts() {
        let tok = llama2_like(&[]);
        let encoder = MetaspaceEncoder::recognise(&tok).expect("a Metaspace pipeline");
        for text in TEXTS {
            let want = tok.encode(*text, false).unwrap();
            let starts: Vec<usize> = want.get_offsets().iter().map(|o| o.0).collect();
            // Twice: the second time from the piece cache.
            for _ in 0..2 {
                let got = encoder.encode(&tok, text, true).unwrap();
                assert_eq!(got.ids, want.get_ids(), "ids of {text:?}");
                assert_eq!(got.starts, starts, "starts of {text:?}");
            }
        }
    }

    #[test]
    fn a_vocabulary_that_merges_across_words_is_left_to_tokenizers() {
        assert!(MetaspaceEncoder::recognise(&llama2_like(&["o▁w"])).is_none());
        assert!(MetaspaceEncoder::recognise(&llama2_like(&["▁▁x"])).is_some());
        // So is a model that looks whole words up before merging.
        let mut json: Value =
            serde_json::from_str(&llama2_like(&[]).to_string(false).unwrap()).unwrap();
        json["model"]["ignore_merges"] = json!(true);
        let tok: tokenizers::Tokenizer = json.to_string().parse().unwrap();
        assert!(MetaspaceEncoder::recognise(&tok).is_none());
    }
}
