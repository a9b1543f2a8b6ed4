//! `data: chat`: conversations rendered with the model's own chat template, tokenized, and
//! masked so that the loss falls on the tokens `data.train_on` asks for.
//!
//! # Records
//! Records come from [`super::records`] (a `.jsonl` or `.json` file, Parquet, Arrow, a glob, a
//! directory of shards or a `save_to_disk` directory), from one path or a mixture of sources
//! (`super::record_sets`), and are read by [`super::chat_formats`] as `data.format` says:
//! `{role, content}` turns (`messages`, ShareGPT's `{from, value}`, Alpaca's instruction and
//! output), prompt-completion, or text. `data.system` is prepended as a system turn to
//! conversations (and conversational prompts) that do not start with one.
//!
//! Prompt-completion records train the completion only, as TRL's `completion_only_loss`: a
//! conversational one renders `prompt + completion` and trains from where its ids and those of
//! the prompt rendered with the generation prompt part; a standard (string) one is
//! `tokenizer(prompt + completion + EOS)` (the EOS text appended unless the completion ends
//! with it), trained from where its ids and `tokenizer(prompt)`'s part. A `text` record is
//! `tokenizer(text + EOS)`, trained everywhere.
//!
//! # The text and the tokens
//! The conversation is rendered by [`ChatTemplate`] exactly as transformers'
//! `apply_chat_template(messages, tokenize=False)` renders it (a message's keys whose value is
//! null are left out, and its reasoning is also under `reasoning_content`, as transformers
//! passes them), and the text is tokenized with
//! no special tokens added (the template writes them), as `tokenizer(text,
//! add_special_tokens=False)` does.
//!
//! # Which tokens are trained (the prefix rule of TRL and torchtune)
//! - `all`: every token.
//! - `assistant`: for each assistant turn `i`, the characters from the end of
//!   `render(messages[..i], add_generation_prompt=true)` (which must be a prefix of the full
//!   text) to the end of the common prefix of `render(messages[..=i])` and the full text; so
//!   the end-of-turn token a template writes after the content is trained, and an EOS some
//!   templates (Phi-3) write only after the last turn is trained only there. A token is trained
//!   when its first character lies in such a span.
//! - `last_assistant`: the same for the last assistant turn only.
//!
//! A template that renders earlier turns differently once later ones follow (not
//! prefix-stable: Mistral v0.3 with a system prompt, the DeepSeek-R1 templates) cannot be
//! masked by this rule; such a conversation's turns are found by markers instead
//! (`chat_markers`: its assistant contents replaced by markers in a second render), the span
//! of each turn being its content and end-of-turn token. [`ChatStats::masked_by_markers`]
//! counts them, and `data show` says so.
//!
//! # Length
//! A sequence of `L` tokens needs `L <= seq_len + 1` (inputs and shifted labels). Longer ones
//! are cut to `seq_len + 1` tokens (`overflow: truncate`) or left out (`drop`); a cut that
//! leaves no trained token drops the record too. Every count is in [`ChatStats`].
//!
//! # Packing
//! With `packing: true` conversations are placed, in order, into windows of `seq_len + 1`
//! tokens (a conversation that does not fit in what is left of a window starts the next);
//! each keeps its mask, and the first token of each is never a target (it is not predicted
//! from the previous conversation). With `packed_attention: conversation` (the default) each
//! conversation's positions restart at 0 and its tokens attend only to its own earlier tokens,
//! exactly as if it were alone (transformers' rule for packed `position_ids`; the model builds
//! the block-diagonal mask); with `window` attention is causal over the whole window, so a
//! token also attends to the earlier conversations of its window (no mask: the fused causal
//! kernel, cheaper on long windows).
//!
//! # Speed and the cache
//! Records are parsed and encoded on every core (rayon), a chunk of records at a time, so a
//! large file is never held parsed whole; each conversation's messages are converted to
//! template values once for all the prefixes rendered. Tokenizing is most of the remaining
//! work; byte-level BPE tokenizers (Llama 3, Qwen2) take the faster exact path of
//! `byte_level_encoder`. The samples are written as they are made to the cache
//! (`chat_cache`) in `.flotilla-cache/` beside the data, keyed by the SHA-256 of the data files
//! (and the records a mixture or held-out set takes), the tokenizer files, the template, these
//! settings (and today's date when the template calls `strftime_now`), so a changed input is
//! never served stale, and training reads them from there a sample at a time: memory holds
//! only their index. An unwritable directory only costs the cache (the samples go to a
//! temporary file, `sample_sink`); a disk that fills while they are written is an error, and
//! leaves nothing half-written.

use std::path::{Path, PathBuf};

use flotilla_config::schema::{ChatData, Overflow, PackedAttention, TrainOn};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::chat_formats::{self, Conversation, RecordShape};
use super::chat_markers::marker_spans;
use super::chat_template::{message_value, ChatTemplate};
use super::error::{DataError, Result};
use super::masked::MaskedSequences;
use super::record_sets::{sources_note, RecordSet, SetPart, SourceStats};
use super::records::{self, Origin};
use super::sample_sink::SampleSink;
use super::tokenizer::Tokenizer;

/// Counts of one chat dataset's preparation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatStats {
    /// Records in the file.
    pub records: usize,
    /// Records skipped as bad (`skip_bad_records`).
    pub skipped: usize,
    /// Conversations cut to `seq_len + 1` tokens.
    pub truncated: usize,
    /// Conversations left out for their length (`overflow: drop`, or nothing trained after
    /// the cut).
    pub dropped: usize,
    /// Conversations in the samples.
    pub conversations: usize,
    /// Samples (conversations, or packed windows).
    pub examples: usize,
    /// Tokens in all samples.
    pub tokens: usize,
    /// Tokens that are targets of the loss.
    pub trained_tokens: usize,
    /// Conversations whose trained tokens were found by markers (the template is not
    /// prefix-stable).
    #[serde(default)]
    pub masked_by_markers: usize,
    /// The first reasons records were skipped, for the log.
    pub skip_reasons: Vec<String>,
    /// What each source gave.
    #[serde(default)]
    pub sources: Vec<SourceStats>,
}

/// The settings that decide how records become samples.
#[derive(Clone, Debug, Serialize)]
struct Settings<'a> {
    shape: RecordShape<'a>,
    train_on: TrainOn,
    overflow: Overflow,
    packing: bool,
    skip_bad_records: bool,
    seq_len: usize,
}

impl<'a> Settings<'a> {
    fn of(cfg: &'a ChatData) -> Self {
        Settings {
            shape: RecordShape {
                format: cfg.format,
                messages_key: cfg.messages_key.as_str(),
                system: cfg.system.as_deref(),
            },
            train_on: cfg.train_on,
            overflow: cfg.overflow,
            packing: cfg.packing,
            skip_bad_records: cfg.skip_bad_records,
            seq_len: cfg.seq_len,
        }
    }
}

/// The tokenizer and template of chat data, read once.
#[derive(Debug)]
pub struct ChatTokenizer {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The texts of the tokenizer's added tokens (special tokens and the like).
    added_tokens: Vec<String>,
    /// The tokenizer directory.
    pub dir: PathBuf,
}

impl ChatTokenizer {
    /// The tokenizer directory of `cfg` (or `init_from`) with its template, or the one
    /// `data.chat_template` names.
    pub fn open(cfg: &ChatData, init_from: Option<&Path>) -> Result<Self> {
        Self::open_dir(
            cfg.tokenizer.as_deref(),
            cfg.chat_template.as_deref(),
            init_from,
        )
    }

    /// The tokenizer directory `tokenizer` (`data.tokenizer`, else `init_from`) with its
    /// template, or the one in the file `chat_template` (`data.chat_template`).
    pub fn open_dir(
        tokenizer: Option<&str>,
        chat_template: Option<&str>,
        init_from: Option<&Path>,
    ) -> Result<Self> {
        let dir = match (tokenizer, init_from) {
            (Some(d), _) => PathBuf::from(d),
            (None, Some(d)) => d.to_path_buf(),
            (None, None) => {
                return Err(DataError::config(
                    "data.tokenizer",
                    "is null and there is no model.init_from to take the tokenizer from; set \
                     data.tokenizer=/path/to/tokenizer_dir",
                ))
            }
        };
        let key = if tokenizer.is_some() {
            "data.tokenizer"
        } else {
            "model.init_from"
        };
        let file = dir.join("tokenizer.json");
        if !file.is_file() {
            return Err(DataError::config(
                key,
                format!(
                    "{} has no tokenizer.json; chat and preference data need a Hugging Face \
                     tokenizer directory (tokenizer.json and tokenizer_config.json with its chat \
                     template)",
                    dir.display()
                ),
            ));
        }
        let mut tokenizer = Tokenizer::from_file(&file, key)?;
        let template = match chat_template {
            Some(f) => ChatTemplate::from_file(Path::new(f), &dir)?,
            None => ChatTemplate::from_tokenizer_dir(&dir)?,
        };
        if chat_template.is_some() {
            // final/ carries the template the model was trained with.
            tokenizer.set_chat_template(template.source());
        }
        let added_tokens = tokenizer
            .inner()
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect();
        Ok(ChatTokenizer {
            tokenizer,
            template,
            added_tokens,
            dir,
        })
    }
}

pub(super) fn role_of(message: &Value) -> Option<&str> {
    message.get("role").and_then(Value::as_str)
}

/// How a conversation's trained tokens were found (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskMethod {
    /// `train_on: all`: every token.
    All,
    /// The prefix rule.
    Prefixes,
    /// Markers in place of the assistant contents (a template that is not prefix-stable).
    Markers,
    /// A prompt-completion record: the tokens after the prompt's.
    Completion,
}

/// Byte spans of the rendered text that are trained, by the prefix rule, or by markers where
/// the template is not prefix-stable (module docs). `values` are `messages` as template
/// values, converted once for every prefix rendered.
fn trained_spans(
    template: &ChatTemplate,
    added: &[String],
    messages: &[Value],
    values: &[minijinja::Value],
    full: &str,
    train_on: TrainOn,
) -> std::result::Result<(Vec<(usize, usize)>, MaskMethod), String> {
    if train_on == TrainOn::All {
        return Ok((vec![(0, full.len())], MaskMethod::All));
    }
    let mut turns: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| role_of(m) == Some("assistant"))
        .map(|(i, _)| i)
        .collect();
    if turns.is_empty() {
        return Err(format!(
            "the conversation has no assistant turn, so nothing is trained under \
             data.train_on={}; set data.train_on=all, or data.skip_bad_records=true to skip \
             such records",
            train_on.as_str()
        ));
    }
    if train_on == TrainOn::LastAssistant {
        turns.drain(..turns.len() - 1);
    }
    let prefix = |n: usize| minijinja::Value::from(values[..n].to_vec());
    let mut spans = Vec::with_capacity(turns.len());
    for &i in &turns {
        let before = template.render_messages(prefix(i), true)?;
        if !full.starts_with(&before) {
            let spans = marker_spans(template, added, messages, full, &turns)?;
            return Ok((spans, MaskMethod::Markers));
        }
        let upto = if i + 1 == values.len() {
            // the whole conversation: its render is `full` itself
            full.to_owned()
        } else {
            template.render_messages(prefix(i + 1), false)?
        };
        let end = outside_added_tokens(common_prefix_len(&upto, full), &[full, &upto], added);
        if end > before.len() {
            spans.push((before.len(), end));
        }
    }
    Ok((spans, MaskMethod::Prefixes))
}

/// `end` moved back to the start of any added token that it would cut in one of `texts` (all
/// of which agree before `end`): the tokenizer reads an added token as one symbol, so a common
/// prefix is taken over it whole. (Phi-3 ends an earlier turn's render with `<|endoftext|>`
/// where the conversation goes on with `<|user|>`: they share `<|`, which is not a prefix.)
pub(super) fn outside_added_tokens(mut end: usize, texts: &[&str], added: &[String]) -> usize {
    'again: loop {
        for text in texts {
            for token in added {
                let n = token.len();
                if n < 2 {
                    continue;
                }
                let mut lo = end.saturating_sub(n - 1);
                while !text.is_char_boundary(lo) {
                    lo -= 1;
                }
                let hi = (end + n - 1).min(text.len());
                if lo >= hi || !text.is_char_boundary(hi) {
                    continue;
                }
                if let Some(p) = text[lo..hi].find(token.as_str()) {
                    let at = lo + p;
                    if at < end && end < at + n {
                        end = at;
                        continue 'again;
                    }
                }
            }
        }
        return end;
    }
}

/// Bytes `a` and `b` share from the start, at a character boundary.
pub(super) fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}

/// One encoded conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedChat {
    /// The rendered text.
    pub text: String,
    pub ids: Vec<u32>,
    /// `trained[j]`: token `j` is a target of the loss.
    pub trained: Vec<bool>,
    /// How the trained tokens were found.
    pub mask: MaskMethod,
}

/// Renders, tokenizes and masks one conversation (`messages`: a JSON array).
pub fn encode_conversation(
    chat: &ChatTokenizer,
    messages: &Value,
    train_on: TrainOn,
) -> std::result::Result<EncodedChat, String> {
    let Value::Array(list) = messages else {
        return Err("messages must be a list".into());
    };
    let values: Vec<minijinja::Value> = list.iter().map(message_value).collect();
    let text = chat
        .template
        .render_messages(minijinja::Value::from(values.clone()), false)?;
    let (mut spans, mask) = trained_spans(
        &chat.template,
        &chat.added_tokens,
        list,
        &values,
        &text,
        train_on,
    )?;
    let (ids, starts) = chat
        .tokenizer
        .encode_with_offsets(&text)
        .map_err(|e| e.to_string())?;
    if mask == MaskMethod::Markers {
        // A content's first token may begin before it (Metaspace's `▁` of the space the
        // template writes before a reply): the token holding a turn's first character is
        // trained, as transformers' `{% generation %}` masks take it.
        for span in &mut spans {
            let holding = starts.partition_point(|&s| s <= span.0);
            if let Some(&s) = holding.checked_sub(1).and_then(|k| starts.get(k)) {
                span.0 = s;
            }
        }
    }
    let trained = starts
        .iter()
        .map(|&s| spans.iter().any(|&(a, b)| a <= s && s < b))
        .collect();
    Ok(EncodedChat {
        text,
        ids,
        trained,
        mask,
    })
}

/// Renders, tokenizes and masks one record of a chat file as `cfg` says (the error is the
/// message a [`DataError::Record`] would carry).
pub fn encode_record(
    chat: &ChatTokenizer,
    record: &Value,
    cfg: &ChatData,
) -> std::result::Result<EncodedChat, String> {
    encode_with(chat, record, &Settings::of(cfg))
}

fn encode_with(
    chat: &ChatTokenizer,
    record: &Value,
    settings: &Settings<'_>,
) -> std::result::Result<EncodedChat, String> {
    match chat_formats::read(record, &settings.shape)? {
        Conversation::Messages(messages) => {
            encode_conversation(chat, &Value::Array(messages), settings.train_on)
        }
        Conversation::PromptCompletion { prompt, completion } => {
            encode_prompt_completion(chat, &prompt, &completion, settings.train_on)
        }
        Conversation::PromptCompletionText { prompt, completion } => {
            encode_plain(chat, &prompt, &completion, settings.train_on)
        }
        Conversation::Text(text) => encode_plain(chat, "", &text, TrainOn::All),
    }
}

/// Tokens `a` and `b` share from the start.
fn common_ids(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A conversational prompt-completion record, as TRL's `completion_only_loss` trains it:
/// `render(prompt + completion)` tokenized, trained from where its ids and those of
/// `render(prompt, add_generation_prompt=true)` part (all of it with `train_on: all`).
fn encode_prompt_completion(
    chat: &ChatTokenizer,
    prompt: &[Value],
    completion: &[Value],
    train_on: TrainOn,
) -> std::result::Result<EncodedChat, String> {
    let values: Vec<minijinja::Value> =
        prompt.iter().chain(completion).map(message_value).collect();
    let text = chat
        .template
        .render_messages(minijinja::Value::from(values.clone()), false)?;
    let ids = chat.tokenizer.encode(&text).map_err(|e| e.to_string())?;
    let (start, mask) = if train_on == TrainOn::All {
        (0, MaskMethod::All)
    } else {
        let before = chat.template.render_messages(
            minijinja::Value::from(values[..prompt.len()].to_vec()),
            true,
        )?;
        let prompt_ids = chat.tokenizer.encode(&before).map_err(|e| e.to_string())?;
        (common_ids(&prompt_ids, &ids), MaskMethod::Completion)
    };
    Ok(trained_from(text, ids, start, mask))
}

/// An encoding whose tokens from `start` on are trained.
fn trained_from(text: String, ids: Vec<u32>, start: usize, mask: MaskMethod) -> EncodedChat {
    let trained = (0..ids.len()).map(|j| j >= start).collect();
    EncodedChat {
        text,
        ids,
        trained,
        mask,
    }
}

/// Standard prompt-completion strings (or plain text, with an empty prompt), as TRL trains
/// them: the EOS token's text appended to the completion unless it ends with it, `prompt +
/// completion` tokenized with the tokenizer's special tokens (`tokenizer(text)`), trained from
/// where its ids and the prompt's part.
fn encode_plain(
    chat: &ChatTokenizer,
    prompt: &str,
    completion: &str,
    train_on: TrainOn,
) -> std::result::Result<EncodedChat, String> {
    let tokenizer = chat.tokenizer.inner();
    let eos = chat
        .tokenizer
        .eos_id()
        .and_then(|id| tokenizer.id_to_token(id));
    let mut text = format!("{prompt}{completion}");
    if let Some(eos) = eos.filter(|e| !completion.ends_with(e.as_str())) {
        text.push_str(&eos);
    }
    let encode = |t: &str| {
        tokenizer
            .encode(t, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("tokenizer: {e}"))
    };
    let ids = encode(&text)?;
    let (start, mask) = if train_on == TrainOn::All || prompt.is_empty() {
        (0, MaskMethod::All)
    } else {
        (common_ids(&encode(prompt)?, &ids), MaskMethod::Completion)
    };
    Ok(trained_from(text, ids, start, mask))
}

/// Reads and encodes the conversations of `path` (`key` names its config key), every record
/// once, from the cache when it holds them.
pub fn build(
    key: &str,
    path: &Path,
    cfg: &ChatData,
    chat: &ChatTokenizer,
    use_cache: bool,
) -> Result<(MaskedSequences, ChatStats)> {
    let files = records::locate(key, &path.to_string_lossy(), cfg.split.as_deref())?;
    build_set(&RecordSet::whole(files), cfg, chat, use_cache)
}

/// Reads and encodes a [`RecordSet`], from the cache when it holds it.
pub fn build_set(
    set: &RecordSet,
    cfg: &ChatData,
    chat: &ChatTokenizer,
    use_cache: bool,
) -> Result<(MaskedSequences, ChatStats)> {
    let (mut out, stats) = prepare(set, cfg, chat, use_cache)?;
    out.isolate(cfg.packing && cfg.packed_attention == PackedAttention::Conversation);
    Ok((out, stats))
}

fn prepare(
    set: &RecordSet,
    cfg: &ChatData,
    chat: &ChatTokenizer,
    use_cache: bool,
) -> Result<(MaskedSequences, ChatStats)> {
    let settings = Settings::of(cfg);
    let name = set.name();
    let cache = if use_cache {
        let mut data = Sha256::new();
        for part in &set.parts {
            data.update(part.files.digest()?);
            if let Some(takes) = &part.takes {
                data.update((takes.len() as u64).to_le_bytes());
                for t in takes {
                    data.update(t.to_le_bytes());
                }
            }
        }
        let digest: [u8; 32] = data.finalize().into();
        Some(super::chat_cache::CacheEntry::new(
            &set.parts[0].files.cache_parent,
            &digest,
            chat,
            &settings,
        ))
    } else {
        None
    };
    let cached = || {
        let entry = cache.as_ref()?;
        let hit = entry.load()?;
        tracing::info!(
            "{name}: prepared conversations read from {}",
            entry.path().display()
        );
        Some(hit)
    };
    if let Some(hit) = cached() {
        return Ok(hit);
    }
    // Held until this function returns: another rank preparing the same entry finishes first
    // and this one reads what it stored.
    let preparing = cache.as_ref().and_then(|c| c.lock());
    if let Some(hit) = preparing.as_ref().and_then(|_| cached()) {
        return Ok(hit);
    }
    let pad = chat
        .tokenizer
        .pad_id()
        .or(chat.tokenizer.eos_id())
        .unwrap_or(0);
    let mut samples = Samples {
        out: SampleSink::open(cache.as_ref()),
        stats: ChatStats::default(),
        settings: &settings,
        window: Window::default(),
    };
    for (part, counted) in set.parts.iter().zip(&set.counted) {
        let source = samples.add_part(part, chat)?;
        samples.stats.sources.push(SourceStats {
            held_out: counted.map_or(0, |c| c.1),
            ..source
        });
    }
    super::byte_level_encoder::release_piece_caches();
    // An error from here on drops the sink, and with it what was written.
    let (sink, stats) = samples.finish()?;
    if stats.records == 0 {
        return Err(DataError::config(
            &set.parts[0].files.key,
            format!("{name} has no records"),
        ));
    }
    if stats.examples == 0 {
        return Err(DataError::config(
            &set.parts[0].files.key,
            format!(
                "{name}: no conversation is left to train on ({} records, {} skipped, {} \
                 dropped for length); check data.train_on, data.seq_len and data.overflow",
                stats.records, stats.skipped, stats.dropped
            ),
        ));
    }
    let out = sink.finish(&format!("chat {name}"), cfg.seq_len, pad, &stats)?;
    Ok((out, stats))
}

/// The tokens of one encoded conversation and which of them are trained.
#[derive(Clone)]
struct EncodedTokens {
    ids: Vec<u32>,
    trained: Vec<bool>,
    by_markers: bool,
}

fn encode_tokens(
    chat: &ChatTokenizer,
    record: &Value,
    settings: &Settings<'_>,
) -> std::result::Result<EncodedTokens, String> {
    let e = encode_with(chat, record, settings)?;
    Ok(EncodedTokens {
        ids: e.ids,
        trained: e.trained,
        by_markers: e.mask == MaskMethod::Markers,
    })
}

/// Encoded conversations becoming samples, in file order: cut or dropped for length, packed
/// into windows when asked, counted, and written out as they are made.
struct Samples<'a> {
    out: SampleSink,
    stats: ChatStats,
    settings: &'a Settings<'a>,
    /// The window being packed.
    window: Window,
}

/// A window being packed: its ids and trained flags, where each conversation starts, and the
/// line of its first.
#[derive(Default)]
struct Window {
    ids: Vec<u32>,
    trained: Vec<bool>,
    starts: Vec<usize>,
    line: usize,
}

impl Window {
    /// Writes the window's conversations to `out` as one sequence, leaving it empty.
    fn flush(&mut self, out: &mut SampleSink) -> Result<()> {
        if !self.ids.is_empty() {
            out.push_packed(&self.ids, &self.trained, &self.starts, self.line)?;
        }
        self.ids.clear();
        self.trained.clear();
        self.starts.clear();
        Ok(())
    }
}

impl Samples<'_> {
    /// Encodes the records `part` takes, a chunk at a time on every core, and adds them in
    /// order (a record taken `n` times, `n` times).
    fn add_part(&mut self, part: &SetPart, chat: &ChatTokenizer) -> Result<SourceStats> {
        let settings = self.settings;
        let mut source = SourceStats {
            path: part.files.spec.clone(),
            ..Default::default()
        };
        let mut warned = std::collections::HashSet::new();
        for chunk in part.files.chunks() {
            let chunk = chunk?;
            source.records += chunk.len();
            let left_out = chunk.unreadable_columns();
            if !left_out.is_empty() && warned.insert(chunk.file().to_path_buf()) {
                tracing::warn!(
                    "{}: columns left out of the records (their types hold no JSON value): {}",
                    chunk.file().display(),
                    left_out.join(", ")
                );
            }
            let taken: Vec<(usize, u32)> = (0..chunk.len())
                .map(|k| {
                    let times = part.times(chunk.index(k));
                    (k, times)
                })
                .filter(|&(_, times)| times > 0)
                .collect();
            type Encoded = (Origin, u32, std::result::Result<EncodedTokens, String>);
            let encoded: Vec<Result<Encoded>> = taken
                .into_par_iter()
                .map(|(k, times)| {
                    let record = chunk.record(k)?;
                    Ok((
                        chunk.origin(k),
                        times,
                        encode_tokens(chat, &record, settings),
                    ))
                })
                .collect();
            for item in encoded {
                let (origin, times, result) = item?;
                source.taken += times as usize;
                self.stats.records += times as usize;
                match result {
                    Ok(e) => {
                        for _ in 1..times {
                            self.add(e.clone(), origin.place.number())?;
                        }
                        self.add(e, origin.place.number())?;
                    }
                    Err(message) if settings.skip_bad_records => {
                        self.stats.skipped += times as usize;
                        if self.stats.skip_reasons.len() < 5 {
                            self.stats.skip_reasons.push(format!("{origin}: {message}"));
                        }
                    }
                    Err(message) => return Err(origin.error(message)),
                }
            }
        }
        Ok(source)
    }

    fn add(&mut self, e: EncodedTokens, at: usize) -> Result<()> {
        let limit = self.settings.seq_len + 1;
        self.stats.masked_by_markers += e.by_markers as usize;
        let (mut ids, mut trained) = (e.ids, e.trained);
        if ids.len() > limit {
            if self.settings.overflow == Overflow::Drop {
                self.stats.dropped += 1;
                return Ok(());
            }
            ids.truncate(limit);
            trained.truncate(limit);
            if !trained.iter().skip(1).any(|&t| t) {
                self.stats.dropped += 1;
                return Ok(());
            }
            self.stats.truncated += 1;
        }
        self.stats.conversations += 1;
        if !self.settings.packing {
            return self.out.push_packed(&ids, &trained, &[0], at);
        }
        let window = &mut self.window;
        if window.ids.len() + ids.len() > limit {
            window.flush(&mut self.out)?;
        }
        if window.ids.is_empty() {
            window.line = at;
        } else {
            trained[0] = false;
        }
        window.starts.push(window.ids.len());
        window.ids.extend_from_slice(&ids);
        window.trained.extend_from_slice(&trained);
        Ok(())
    }

    /// The samples written (the last window too) and their counts.
    fn finish(mut self) -> Result<(SampleSink, ChatStats)> {
        self.window.flush(&mut self.out)?;
        let mut stats = self.stats;
        stats.examples = self.out.index().len();
        stats.tokens = self.out.index().num_tokens();
        stats.trained_tokens = self.out.trained_tokens();
        Ok((self.out, stats))
    }
}

/// One line that says what preparation did (for logs and `data show`).
pub fn summary_line(stats: &ChatStats) -> String {
    let fraction = if stats.tokens == 0 {
        0.0
    } else {
        100.0 * stats.trained_tokens as f64 / stats.tokens as f64
    };
    let mut line = format!(
        "{} records: {} conversations in {} examples, {} tokens, {:.1}% trained; {} cut to \
         fit, {} dropped for length, {} skipped as bad",
        stats.records,
        stats.conversations,
        stats.examples,
        stats.tokens,
        fraction,
        stats.truncated,
        stats.dropped,
        stats.skipped
    );
    line.push_str(&markers_note(stats.masked_by_markers));
    line.push_str(&sources_note(&stats.sources));
    line
}

/// `; N masked by markers (...)` when the template is not prefix-stable for some
/// conversations, else nothing.
pub fn markers_note(masked_by_markers: usize) -> String {
    match masked_by_markers {
        0 => String::new(),
        n => format!(
            "; {n} masked by markers (the chat template is not prefix-stable, so each assistant \
             content and its end-of-turn token were found in a render with markers)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_common_prefix_never_ends_inside_an_added_token() {
        let added = vec!["<|user|>".to_string(), "<|endoftext|>".to_string()];
        let full = "<|assistant|>hi<|end|>\n<|user|>more";
        let upto = "<|assistant|>hi<|end|>\n<|endoftext|>";
        let end = common_prefix_len(upto, full);
        assert_eq!(&full[..end], "<|assistant|>hi<|end|>\n<|");
        let end = outside_added_tokens(end, &[full, upto], &added);
        assert_eq!(&full[..end], "<|assistant|>hi<|end|>\n");
    }

    #[test]
    fn common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix_len("abcé", "abcé!"), 5);
        assert_eq!(common_prefix_len("abx", "aby"), 2);
        assert_eq!(common_prefix_len("", "a"), 0);
    }
}
