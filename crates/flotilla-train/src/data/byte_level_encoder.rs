//! The encoder of byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2, flotilla's own `byte` and
//! `bpe`): the same ids and token start offsets as `tokenizers`' own `encode`, without the
//! per-byte alignment bookkeeping of its `NormalizedString`s, which is most of the time it spends
//! on long chat texts.
//!
//! `tokenizers` encodes a text in four steps: split off the added tokens, pre-tokenize each
//! remaining segment (regex `Split`s, then `ByteLevel`, which maps every byte to a printable
//! character), run the BPE model on each piece, and let the post-processor adjust offsets. Each
//! step tracks, for every byte, where it came from, so that offsets survive any transformation.
//! For the pipelines recognised here those alignments are trivial (one byte-level character per
//! byte of the text), so this module runs the same steps with the same objects — the added
//! vocabulary's own splitting, the tokenizer's own regexes, its own BPE model and cache — and
//! computes offsets by counting. Pre-tokenized pieces repeat (words, indentation, the
//! template's own text), so each thread keeps what every piece of up to [`CACHED_PIECE`] bytes
//! encoded to: a repeated piece costs one hash lookup. Any pipeline it does not recognise (a
//! normalizer, Metaspace, a prefix space, truncation, padding, another post-processor) is left
//! to `tokenizers`; a tokenizer is only given this encoder after it agreed with `tokenizers` on
//! a probe text (see `Tokenizer::from_inner`).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use ahash::AHashMap;
use serde_json::Value;
use tokenizers::utils::SysRegex;
use tokenizers::{Model, ModelWrapper, NormalizerWrapper, OffsetReferential, OffsetType};

use super::tokenizer::byte_to_char;

/// A recognised byte-level BPE pipeline.
pub(crate) struct ByteLevelEncoder {
    /// Tells this encoder's piece cache from another's on the same thread.
    id: u64,
    /// The regex splits applied in turn to each segment between added tokens (all of them
    /// `Isolated`, not inverted: every match and every gap is a piece).
    splits: Vec<SysRegex>,
    /// `Some(add_prefix_space)` when the post-processor trims spaces off offsets (a
    /// `ByteLevel` processor with `trim_offsets`).
    trim: Option<bool>,
    /// The byte-level character of each byte, and its length in UTF-8.
    chars: [(char, usize); 256],
}

/// Ids of an encoded text and, when asked, the byte offset in the text where each token starts
/// (as `Encoding::get_offsets`' starts).
pub(crate) struct Encoded {
    pub ids: Vec<u32>,
    pub starts: Vec<usize>,
}

/// The pattern GPT-2's `ByteLevel` pre-tokenizer splits on when its `use_regex` is set
/// (`tokenizers`' own constant).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The character `ByteLevel` writes for a space.
const SPACE: char = '\u{120}';

/// The longest piece (in bytes) whose tokens are cached.
const CACHED_PIECE: usize = 256;
/// The most pieces a thread's cache holds (a few MB); it starts again empty when full.
const CACHED_PIECES: usize = 1 << 16;

/// One token of a piece: its id, where it starts and ends in the piece (bytes of the text,
/// aligned to whole characters as `tokenizers` aligns them), and how many leading spaces its
/// value has (what an offset-trimming post-processor skips).
#[derive(Clone, Copy)]
pub(super) struct PieceToken {
    pub(super) id: u32,
    pub(super) start: u32,
    pub(super) end: u32,
    pub(super) leading: u32,
}

pub(super) static NEXT_ENCODER_ID: AtomicU64 = AtomicU64::new(0);

/// The tokens of pieces, by the piece's bytes.
pub(super) type PieceCache = AHashMap<Box<[u8]>, Box<[PieceToken]>>;

thread_local! {
    /// The tokens of the pieces this thread encoded, for the encoder whose id is first.
    static PIECES: RefCell<(u64, PieceCache)> = RefCell::new((u64::MAX, PieceCache::new()));
}

/// Frees the piece caches of the calling thread and of every thread of rayon's pool, once a
/// large encoding job is over: a training process keeps its threads, not their caches.
pub(crate) fn release_piece_caches() {
    let release = || PIECES.with_borrow_mut(|(_, cache)| *cache = PieceCache::new());
    release();
    rayon::broadcast(|_| release());
}

/// Leading spaces of a token's value as `tokenizers`' `process_offsets` counts them.
fn leading_spaces(value: &str) -> u32 {
    value
        .chars()
        .take_while(|&c| c == SPACE || c.is_whitespace())
        .count() as u32
}

impl ByteLevelEncoder {
    /// The encoder of `tokenizer`'s pipeline, its normalizer aside (the caller uses it only for
    /// texts the normalizer leaves unchanged, or when there is none); `None` when the pipeline
    /// is not one this module reproduces.
    pub(crate) fn recognise(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
            return None;
        }
        match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|p| p == 0.0) => {}
            _ => return None,
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let splits = pre_tokenizer_splits(&pre)?
            .iter()
            .map(|p| SysRegex::new(p).ok())
            .collect::<Option<Vec<_>>>()?;
        let trim = match tokenizer.get_post_processor() {
            None => None,
            Some(p) => post_processor_trim(&serde_json::to_value(p).ok()?)?,
        };
        let table = byte_to_char();
        Some(ByteLevelEncoder {
            id: NEXT_ENCODER_ID.fetch_add(1, Ordering::Relaxed),
            splits,
            trim,
            chars: std::array::from_fn(|b| (table[b], table[b].len_utf8())),
        })
    }

    /// Encodes `text` with `tokenizer` (the one [`recognise`](Self::recognise)d, without a
    /// normalizer that would change `text`); `with_starts` also returns token start offsets.
    pub(crate) fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        with_starts: bool,
    ) -> tokenizers::Result<Encoded> {
        let model = tokenizer.get_model();
        let mut pieces: Vec<(usize, usize)> = Vec::new();
        let mut scratch: Vec<(usize, usize)> = Vec::new();
        let mut byte_level = String::new();
        encode_segments(
            tokenizer,
            text,
            self.id,
            (with_starts, self.trim),
            |segment, base, cache, out| {
                self.split_segment(segment, &mut pieces, &mut scratch);
                for &(a, b) in &pieces {
                    let piece = &segment.as_bytes()[a..b];
                    let at = base + a;
                    if let Some(tokens) = cache.get(piece) {
                        for t in tokens.iter() {
                            out.push_piece_token(at, t);
                        }
                        continue;
                    }
                    let tokens = self.tokenize_piece(model, piece, &mut byte_level)?;
                    for t in &tokens {
                        out.push_piece_token(at, t);
                    }
                    remember(cache, piece, &tokens);
                }
                Ok(())
            },
        )
    }

    /// Runs the model on one piece of text (its bytes mapped to byte-level characters in
    /// `byte_level`, a reused buffer).
    fn tokenize_piece(
        &self,
        model: &ModelWrapper,
        piece: &[u8],
        byte_level: &mut String,
    ) -> tokenizers::Result<Vec<PieceToken>> {
        byte_level.clear();
        byte_level.extend(piece.iter().map(|&x| self.chars[x as usize].0));
        // Token offsets are byte offsets in `byte_level`; walk the piece's bytes to turn them
        // into offsets in the text (tokens come in order and cover it). A token that starts or
        // ends inside a character of the text is aligned, as `tokenizers` aligns it, with the
        // whole character.
        let (mut at, mut in_byte_level) = (0usize, 0usize);
        let mut to_byte = |offset: usize| {
            while in_byte_level < offset && at < piece.len() {
                in_byte_level += self.chars[piece[at] as usize].1;
                at += 1;
            }
            at
        };
        let inside_char = |i: usize| i < piece.len() && (piece[i] & 0xC0) == 0x80;
        let tokens = model.tokenize(byte_level)?;
        Ok(tokens
            .iter()
            .map(|t| {
                let mut start = to_byte(t.offsets.0);
                while inside_char(start) {
                    start -= 1;
                }
                let mut end = to_byte(t.offsets.1);
                while inside_char(end) {
                    end += 1;
                }
                PieceToken {
                    id: t.id,
                    start: start as u32,
                    end: end as u32,
                    leading: leading_spaces(&t.value),
                }
            })
            .collect())
    }

    /// The pieces of `segment` after every regex split, as byte ranges (empty ones dropped, as
    /// `PreTokenizedString::split` drops them).
    fn split_segment(
        &self,
        segment: &str,
        pieces: &mut Vec<(usize, usize)>,
        scratch: &mut Vec<(usize, usize)>,
    ) {
        pieces.clear();
        if !segment.is_empty() {
            pieces.push((0, segment.len()));
        }
        for regex in &self.splits {
            scratch.clear();
            for &(a, b) in pieces.iter() {
                let mut prev = a;
                for (s, e) in regex.find_iter(&segment[a..b]) {
                    if a + s != prev {
                        scratch.push((prev, a + s));
                    }
                    if e > s {
                        scratch.push((a + s, a + e));
                    }
                    prev = a + e;
                }
                if prev != b {
                    scratch.push((prev, b));
                }
            }
            std::mem::swap(pieces, scratch);
        }
    }
}

/// Encodes `text` segment by segment: `tokenizer`'s added tokens as they are, every text
/// between them through `encode_segment(segment, its offset in text, piece cache, sink)`, with
/// this thread's piece cache (emptied first when encoder `id` did not use it last).
/// `(with_starts, trim)` configure the [`TokenSink`].
pub(super) fn encode_segments(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    id: u64,
    (with_starts, trim): (bool, Option<bool>),
    mut encode_segment: impl FnMut(
        &str,
        usize,
        &mut PieceCache,
        &mut TokenSink,
    ) -> tokenizers::Result<()>,
) -> tokenizers::Result<Encoded> {
    let segments = tokenizer
        .get_added_vocabulary()
        .extract_and_normalize(None::<&NormalizerWrapper>, text);
    let mut out = TokenSink {
        ids: Vec::with_capacity(text.len() / 3),
        starts: Vec::new(),
        with_starts,
        trim,
    };
    PIECES.with_borrow_mut(|(owner, cache)| {
        if *owner != id {
            *owner = id;
            cache.clear();
        }
        for (segment, (base, _), tokens) in
            segments.get_splits(OffsetReferential::Original, OffsetType::Byte)
        {
            match tokens {
                Some(tokens) => {
                    for t in tokens {
                        let leading = leading_spaces(&t.value);
                        out.push(t.id, base + t.offsets.0, base + t.offsets.1, leading);
                    }
                }
                None => encode_segment(segment, base, cache, &mut out)?,
            }
        }
        Ok::<(), tokenizers::Error>(())
    })?;
    Ok(Encoded {
        ids: out.ids,
        starts: out.starts,
    })
}

/// Keeps the tokens of `piece` in `cache` when the piece is short enough to be worth it (the
/// cache starts again empty when full).
pub(super) fn remember(cache: &mut PieceCache, piece: &[u8], tokens: &[PieceToken]) {
    if piece.len() <= CACHED_PIECE {
        if cache.len() >= CACHED_PIECES {
            cache.clear();
        }
        cache.insert(piece.into(), tokens.into());
    }
}

/// Where encoded tokens go: ids, and start offsets as the post-processor leaves them.
pub(super) struct TokenSink {
    ids: Vec<u32>,
    starts: Vec<usize>,
    with_starts: bool,
    trim: Option<bool>,
}

impl TokenSink {
    fn push_piece_token(&mut self, at: usize, t: &PieceToken) {
        let (start, end) = (at + t.start as usize, at + t.end as usize);
        self.push(t.id, start, end, t.leading);
    }

    pub(super) fn push(&mut self, id: u32, start: usize, end: usize, leading: u32) {
        let index = self.ids.len();
        self.ids.push(id);
        if !self.with_starts {
            return;
        }
        let mut start = start;
        if let Some(add_prefix_space) = self.trim {
            // tokenizers' `process_offsets`: leading spaces (counted in characters) move the
            // start, except the one space a prefix-space processor added to the first token.
            let leading = leading as usize;
            let is_first = index == 0 || start == 0;
            if leading > 0 && !(is_first && add_prefix_space && leading == 1) {
                start = (start + leading).min(end);
            }
        }
        self.starts.push(start);
    }
}

/// The regexes a pre-tokenizer splits on before its final `ByteLevel`, when it is one this
/// module reproduces: `ByteLevel` alone, or a `Sequence` of `Split`s by regex (`Isolated`, not
/// inverted) ending with `ByteLevel`, that `ByteLevel` adding no prefix space.
fn pre_tokenizer_splits(pre: &Value) -> Option<Vec<String>> {
    let steps: Vec<&Value> = match pre["type"].as_str()? {
        "Sequence" => pre["pretokenizers"].as_array()?.iter().collect(),
        _ => vec![pre],
    };
    let (last, splits) = steps.split_last()?;
    if last["type"] != "ByteLevel" || last["add_prefix_space"] != false {
        return None;
    }
    let mut patterns = splits
        .iter()
        .map(|s| {
            let regex = s["pattern"]["Regex"].as_str()?;
            let isolated = s["type"] == "Split" && s["behavior"] == "Isolated";
            (isolated && s["invert"] == false).then(|| regex.to_string())
        })
        .collect::<Option<Vec<_>>>()?;
    match last["use_regex"].as_bool() {
        Some(true) => patterns.push(GPT2_PATTERN.to_string()),
        Some(false) => {}
        None => return None,
    }
    Some(patterns)
}

/// Whether a post-processor trims offsets (`Some(Some(add_prefix_space))`), leaves them alone
/// (`Some(None)`), or is not one this module reproduces (`None`). With no special tokens added,
/// `TemplateProcessing` changes nothing; one `ByteLevel` trims when its `trim_offsets` is set.
fn post_processor_trim(post: &Value) -> Option<Option<bool>> {
    let steps: Vec<&Value> = match post["type"].as_str()? {
        "Sequence" => post["processors"].as_array()?.iter().collect(),
        _ => vec![post],
    };
    let mut trim = None;
    for step in steps {
        match step["type"].as_str()? {
            "TemplateProcessing" => {}
            "ByteLevel" if step["trim_offsets"] == true => {
                if trim.is_some() {
                    return None;
                }
                trim = Some(step["add_prefix_space"].as_bool()?);
            }
            "ByteLevel" if step["trim_offsets"] == false => {}
            _ => return None,
        }
    }
    Some(trim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Llama 3 style tokenizer: its split regex, `ByteLevel`, a few merges, added tokens,
    /// and the given post-processor.
    fn llama3_like(post: Value) -> tokenizers::Tokenizer {
        let table = byte_to_char();
        let mut vocab = serde_json::Map::new();
        for (b, c) in table.iter().enumerate() {
            vocab.insert(c.to_string(), json!(b));
        }
        let merges = [
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("Ġ", "Ġ"),
            ("Ċ", "Ċ"),
            ("a", "s"),
            ("Ġ", "as"),
        ];
        let mut next = 256;
        for (a, b) in merges {
            vocab.insert(format!("{a}{b}"), json!(next));
            next += 1;
        }
        let added: Vec<Value> = ["<|start|>", "<|end|>", " <|spaced|>", "\u{3000}x"]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": next + i, "content": c, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": i < 2})
            })
            .collect();
        let json = json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                 "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                 "use_regex": false}]},
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
        });
        json.to_string().parse().unwrap()
    }

    const TEXTS: &[&str] = &[
        "",
        " ",
        "the cat as the  hat",
        "  the\n\n\nthe\r\n the\t\tas ",
        "<|start|>user\nHello there<|end|><|start|>assistant\n\n as the <|end|>",
        "caf\u{e9} 🦀 日本語 naïve\u{301} it's we'll I'D",
        "a <|spaced|>b <|spaced|><|spaced|>",
        "x\u{3000}x\u{3000}\u{3000}xy  \u{3000}x",
        "1234567 12,345.67 -42\u{a0}\u{85}end",
        "<|end|>",
        "   <|start|>   ",
    ];

    fn compare(t: &tokenizers::Tokenizer) {
        let fast = ByteLevelEncoder::recognise(t).expect("a byte-level pipeline");
        for text in TEXTS {
            let want = t.encode(*text, false).unwrap();
            let got = fast.encode(t, text, true).unwrap();
            assert_eq!(got.ids, want.get_ids(), "ids of {text:?}");
            let starts: Vec<usize> = want.get_offsets().iter().map(|o| o.0).collect();
            assert_eq!(got.starts, starts, "starts of {text:?}");
            assert_eq!(fast.encode(t, text, false).unwrap().ids, want.get_ids());
        }
    }

    #[test]
    fn equals_tokenizers_with_and_without_offset_trimming() {
        compare(&llama3_like(Value::Null));
        let byte_level = |prefix| json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": false});
        compare(&llama3_like(byte_level(false)));
        compare(&llama3_like(byte_level(true)));
        compare(&llama3_like(json!({"type": "Sequence", "processors": [
            byte_level(true),
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|start|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|start|>": {"id": "<|start|>", "ids": [263], "tokens": ["<|start|>"]}}}
        ]})));
    }

    #[test]
    fn equals_tokenizers_for_the_built_in_and_trained_tokenizers() {
        use crate::data::tokenizer::Tokenizer;
        compare(Tokenizer::byte().inner());
        let corpus = [
            "the cat sat on the mat; the hat",
            "12 + 34 = 46\n\n  the end",
        ];
        let bpe = Tokenizer::train_bpe(corpus.iter().cycle().take(50), 300).unwrap();
        compare(bpe.inner());
    }

    #[test]
    fn repeated_pieces_are_cached_until_released() {
        let t = llama3_like(Value::Null);
        let fast = ByteLevelEncoder::recognise(&t).unwrap();
        let cached =
            || PIECES.with_borrow(|(owner, cache)| (*owner == fast.id).then(|| cache.len()));
        let first = fast.encode(&t, "the cat as the hat", true).unwrap();
        let pieces = cached().expect("this encoder's cache");
        assert!(pieces >= 4, "{pieces} pieces cached");
        let again = fast.encode(&t, "the cat as the hat", true).unwrap();
        assert_eq!((first.ids, first.starts), (again.ids, again.starts));
        assert_eq!(cached(), Some(pieces), "nothing new to cache");
        release_piece_caches();
        assert_eq!(cached(), Some(0));
    }

    #[test]
    fn pipelines_it_does_not_reproduce_are_left_to_tokenizers() {
        let llama3 = llama3_like(Value::Null);
        let mut t = llama3.clone();
        t.with_pre_tokenizer(Some(
            tokenizers::pre_tokenizers::metaspace::Metaspace::default(),
        ));
        assert!(ByteLevelEncoder::recognise(&t).is_none(), "Metaspace");
        let mut t = llama3.clone();
        t.with_pre_tokenizer(Some(
            tokenizers::pre_tokenizers::byte_level::ByteLevel::new(true, true, true),
        ));
        assert!(ByteLevelEncoder::recognise(&t).is_none(), "a prefix space");
        let mut t = llama3.clone();
        t.with_post_processor(Some(
            tokenizers::processors::roberta::RobertaProcessing::default(),
        ));
        assert!(
            ByteLevelEncoder::recognise(&t).is_none(),
            "RoBERTa's processor"
        );
        let mut t = llama3;
        t.with_truncation(Some(tokenizers::TruncationParams::default()))
            .unwrap();
        assert!(ByteLevelEncoder::recognise(&t).is_none(), "truncation");
    }
}
