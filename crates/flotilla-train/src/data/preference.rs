//! Preference pairs (`data.kind: preference`): records of a prompt with a chosen and a rejected
//! completion — from any file the record readers read (JSON lines, Parquet, `save_to_disk`
//! directories, the Hub's shard layout) —, tokenized as TRL's `DPOTrainer` tokenizes them, into
//! [`Sample`]s that carry both sequences of a pair.
//!
//! # Formats (TRL's)
//!
//! - explicit prompt: `{"prompt", "chosen", "rejected"}`, each a string (standard) or a list
//!   of `{role, content}` messages (conversational);
//! - implicit prompt: `{"chosen", "rejected"}` only, whole conversations (or texts) whose
//!   shared beginning is the prompt (TRL's `extract_prompt`: the longest common prefix of
//!   turns, or of characters with a space before the split given to the completions).
//!
//! # Tokens
//!
//! Conversational: the prompt is rendered with the chat template and the generation prompt,
//! each completion as the render of prompt + completion, both tokenized without special
//! tokens (as `apply_chat_template` does). Standard: the texts are tokenized with the
//! tokenizer's special tokens (a BOS where it adds one), and each completion ends with the EOS
//! text unless it already does. The completion starts where the prompt's ids and the
//! prompt + completion's ids first differ (TRL's `common_prefix_length`).
//!
//! # Truncation
//!
//! `data.max_prompt_length` first cuts a longer prompt (its start kept under `keep_start`, its
//! end under `keep_end`); then each sequence (prompt + completion) longer than `data.seq_len`
//! (TRL's `max_length`) keeps its first (`keep_start`) or last (`keep_end`) `seq_len` tokens.
//! Under `keep_start` a pair whose prompt alone fills `seq_len` is dropped, as TRL drops it
//! (nothing of its completions would remain).
//!
//! # Samples
//!
//! A pair is one [`Sample`] (the chosen sequence) whose [`Sample::rejected`] holds the
//! rejected one, each `seq_len` long, right-padded, labels shifted and set on completion
//! tokens only. [`Batch::collate`](super::Batch::collate) lays a micro-batch of `M` pairs out as
//! `2M` rows, the chosen ones first (TRL's order).

use serde_json::Value;

use super::chat::ChatTokenizer;
use super::dataset::{Dataset, Example, Sample, IGNORE_INDEX};
use super::error::{DataError, Result};
use super::record_sets::{sources_note, RecordSet, SourceStats};
use flotilla_config::schema::{PreferenceData, TruncationMode};

/// One pair's token ids, before truncation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairIds {
    pub prompt: Vec<u32>,
    pub chosen: Vec<u32>,
    pub rejected: Vec<u32>,
}

/// One pair ready for training: both sequences truncated, and where each completion starts.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pair {
    chosen: Vec<u32>,
    chosen_start: usize,
    rejected: Vec<u32>,
    rejected_start: usize,
    /// The record's line (or position in a `.json` array).
    source: usize,
}

/// What preparing preference data did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PreferenceStats {
    pub records: usize,
    pub pairs: usize,
    /// Pairs whose prompt alone fills `seq_len` under `keep_start`.
    pub dropped_long_prompt: usize,
    /// Sequences cut to `seq_len`.
    pub truncated: usize,
    /// Malformed records skipped (`data.skip_bad_records`), with the first reasons.
    pub skipped: usize,
    pub skip_reasons: Vec<String>,
    /// What each source held, held out and gave (one entry for a single path).
    pub sources: Vec<SourceStats>,
}

/// Preference pairs of one file.
#[derive(Debug)]
pub struct PreferenceDataset {
    pairs: Vec<Pair>,
    seq_len: usize,
    pad: i64,
    /// The files the pairs come from, for logs.
    path: String,
}

/// Whether `v` is a list of messages (`{role, content}` objects), TRL's `is_conversational`.
fn is_messages(v: &Value) -> bool {
    matches!(v, Value::Array(items) if items.first().is_some_and(|m| m.get("role").is_some()))
}

/// The three parts of a record, the prompt extracted when it is implicit.
fn parts(record: &Value) -> std::result::Result<(Value, Value, Value), String> {
    let Value::Object(obj) = record else {
        return Err("a record must be a JSON object".into());
    };
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let (Some(chosen), Some(rejected)) = (get("chosen"), get("rejected")) else {
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        return Err(format!(
            "a preference record needs 'chosen' and 'rejected' (and optionally 'prompt'); its \
             fields are [{}]",
            keys.join(", ")
        ));
    };
    let kind = |v: &Value, what: &str| -> std::result::Result<bool, String> {
        match v {
            Value::String(_) => Ok(false),
            v if is_messages(v) => Ok(true),
            Value::Array(items) if items.is_empty() => Err(format!("'{what}' is an empty list")),
            _ => Err(format!(
                "'{what}' must be a string or a list of {{role, content}} messages"
            )),
        }
    };
    let conversational = kind(chosen, "chosen")?;
    if kind(rejected, "rejected")? != conversational {
        return Err("'chosen' and 'rejected' must both be strings or both be messages".into());
    }
    match get("prompt") {
        Some(prompt) => {
            let prompt_messages = match prompt {
                Value::String(_) => false,
                v if is_messages(v) => true,
                _ => {
                    return Err(
                        "'prompt' must be a string or a list of {role, content} messages".into(),
                    )
                }
            };
            if prompt_messages != conversational {
                return Err(
                    "'prompt' and the completions must both be strings or both be messages".into(),
                );
            }
            Ok((prompt.clone(), chosen.clone(), rejected.clone()))
        }
        None => Ok(extract_prompt(chosen, rejected)),
    }
}

/// TRL's `extract_prompt`: the longest common prefix of turns (conversations) or characters
/// (texts; a space just before the split goes to the completions).
fn extract_prompt(chosen: &Value, rejected: &Value) -> (Value, Value, Value) {
    match (chosen, rejected) {
        (Value::Array(c), Value::Array(r)) => {
            let idx = common_prefix(c, r);
            (
                Value::Array(c[..idx].to_vec()),
                Value::Array(c[idx..].to_vec()),
                Value::Array(r[idx..].to_vec()),
            )
        }
        (Value::String(c), Value::String(r)) => {
            let c_chars: Vec<char> = c.chars().collect();
            let r_chars: Vec<char> = r.chars().collect();
            let mut idx = common_prefix(&c_chars, &r_chars);
            if idx < c_chars.len().min(r_chars.len()) && idx > 0 && c_chars[idx - 1] == ' ' {
                idx -= 1;
            }
            let split = |s: &[char], from: usize| s[from..].iter().collect::<String>();
            (
                Value::String(c_chars[..idx].iter().collect()),
                Value::String(split(&c_chars, idx)),
                Value::String(split(&r_chars, idx)),
            )
        }
        _ => unreachable!("parts() checked the kinds"),
    }
}

/// How many leading items `a` and `b` share.
pub fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The token ids of one record's pair, as TRL tokenizes them.
pub fn tokenize_pair(chat: &ChatTokenizer, record: &Value) -> std::result::Result<PairIds, String> {
    let (prompt, chosen, rejected) = parts(record)?;
    let (prompt_ids, chosen_full, rejected_full) = match (&prompt, &chosen, &rejected) {
        (Value::String(p), Value::String(c), Value::String(r)) => {
            let eos = chat
                .tokenizer
                .eos_id()
                .and_then(|id| chat.tokenizer.inner().id_to_token(id))
                .ok_or("the tokenizer has no EOS token, which ends each completion")?;
            let ended = |s: &str| {
                if s.ends_with(&eos) {
                    s.to_string()
                } else {
                    format!("{s}{eos}")
                }
            };
            let encode = |text: &str| -> std::result::Result<Vec<u32>, String> {
                chat.tokenizer
                    .inner()
                    .encode(text, true)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| format!("tokenizer: {e}"))
            };
            (
                encode(p)?,
                encode(&format!("{p}{}", ended(c)))?,
                encode(&format!("{p}{}", ended(r)))?,
            )
        }
        _ => {
            let render = |messages: &Value, generation: bool| {
                chat.template
                    .render(messages, generation)
                    .map_err(|e| e.to_string())
                    .and_then(|text| chat.tokenizer.encode(&text).map_err(|e| e.to_string()))
            };
            let joined = |completion: &Value| {
                let mut all = prompt.as_array().cloned().unwrap_or_default();
                all.extend(completion.as_array().cloned().unwrap_or_default());
                Value::Array(all)
            };
            (
                render(&prompt, true)?,
                render(&joined(&chosen), false)?,
                render(&joined(&rejected), false)?,
            )
        }
    };
    let prompt_len =
        common_prefix(&prompt_ids, &chosen_full).min(common_prefix(&prompt_ids, &rejected_full));
    Ok(PairIds {
        prompt: prompt_ids[..prompt_len].to_vec(),
        chosen: chosen_full[prompt_len..].to_vec(),
        rejected: rejected_full[prompt_len..].to_vec(),
    })
}

/// A sequence's ids and the index of its first completion token.
type Sequence = (Vec<u32>, usize);

/// How `cfg` truncates a pair; `None` when TRL drops it (its prompt fills `seq_len` under
/// `keep_start`). Returns the chosen and rejected sequences, and how many of them were cut.
fn truncate(ids: PairIds, cfg: &PreferenceData) -> Option<([Sequence; 2], usize)> {
    let mut prompt = ids.prompt;
    if let Some(max) = cfg.max_prompt_length {
        if prompt.len() > max {
            prompt = match cfg.truncation_mode {
                TruncationMode::KeepStart => prompt[..max].to_vec(),
                TruncationMode::KeepEnd => prompt[prompt.len() - max..].to_vec(),
            };
        }
    }
    let t = cfg.seq_len;
    if cfg.truncation_mode == TruncationMode::KeepStart && prompt.len() >= t {
        return None;
    }
    let mut cut = 0;
    let mut sequence = |completion: &[u32]| {
        let mut seq = prompt.clone();
        seq.extend_from_slice(completion);
        let mut start = prompt.len();
        if seq.len() > t {
            cut += 1;
            match cfg.truncation_mode {
                TruncationMode::KeepStart => seq.truncate(t),
                TruncationMode::KeepEnd => {
                    let drop = seq.len() - t;
                    seq.drain(..drop);
                    start = start.saturating_sub(drop);
                }
            }
        }
        (seq, start)
    };
    let pair = [sequence(&ids.chosen), sequence(&ids.rejected)];
    Some((pair, cut))
}

impl PreferenceDataset {
    /// Reads and tokenizes the pairs of `set` (a file or a mixture of sources, each taking
    /// its records as many times as the set says), a chunk of records at a time.
    pub fn build(
        set: &RecordSet,
        cfg: &PreferenceData,
        chat: &ChatTokenizer,
    ) -> Result<(Self, PreferenceStats)> {
        let mut stats = PreferenceStats::default();
        let mut pairs = Vec::new();
        for (part, counted) in set.parts.iter().zip(&set.counted) {
            let mut source = SourceStats {
                path: part.files.spec.clone(),
                held_out: counted.map_or(0, |c| c.1),
                ..Default::default()
            };
            for chunk in part.files.chunks() {
                let chunk = chunk?;
                source.records += chunk.len();
                for k in 0..chunk.len() {
                    let times = part.times(chunk.index(k)) as usize;
                    if times == 0 {
                        continue;
                    }
                    source.taken += times;
                    stats.records += times;
                    let origin = chunk.origin(k);
                    let ids = chunk
                        .record(k)
                        .map_err(|e| match e {
                            DataError::Record { message, .. } => message,
                            other => other.to_string(),
                        })
                        .and_then(|r| tokenize_pair(chat, &r));
                    let ids = match ids {
                        Ok(ids) => ids,
                        Err(message) if cfg.skip_bad_records => {
                            stats.skipped += times;
                            if stats.skip_reasons.len() < 5 {
                                stats.skip_reasons.push(format!("{origin}: {message}"));
                            }
                            continue;
                        }
                        Err(message) => {
                            return Err(origin.error(format!(
                                "{message} (or set data.skip_bad_records=true to count and skip \
                                 such records)"
                            )))
                        }
                    };
                    let Some(([(chosen, chosen_start), (rejected, rejected_start)], cut)) =
                        truncate(ids, cfg)
                    else {
                        stats.dropped_long_prompt += times;
                        continue;
                    };
                    stats.truncated += cut * times;
                    let pair = Pair {
                        chosen,
                        chosen_start,
                        rejected,
                        rejected_start,
                        source: origin.place.number(),
                    };
                    pairs.extend(std::iter::repeat_n(pair, times));
                }
            }
            stats.sources.push(source);
        }
        stats.pairs = pairs.len();
        if pairs.is_empty() {
            return Err(DataError::config(
                &set.parts[0].files.key,
                format!(
                    "{} has no usable preference pair ({} records, {} with a prompt that fills \
                     data.seq_len={}, {} skipped); raise data.seq_len or set \
                     data.max_prompt_length",
                    set.name(),
                    stats.records,
                    stats.dropped_long_prompt,
                    cfg.seq_len,
                    stats.skipped
                ),
            ));
        }
        let pad = chat
            .tokenizer
            .pad_id()
            .or(chat.tokenizer.eos_id())
            .unwrap_or(0) as i64;
        Ok((
            PreferenceDataset {
                pairs,
                seq_len: cfg.seq_len,
                pad,
                path: set.name(),
            },
            stats,
        ))
    }

    /// One sequence as a padded sample: labels on completion tokens, shifted.
    fn row(&self, ids: &[u32], start: usize) -> Sample {
        let t = self.seq_len;
        let mut input_ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        input_ids.resize(t, self.pad);
        let mut labels = vec![IGNORE_INDEX; t];
        for j in start.max(1)..ids.len() {
            labels[j - 1] = ids[j] as i64;
        }
        Sample {
            input_ids,
            labels,
            positions: None,
            rejected: None,
        }
    }

    fn example_of(ids: &[u32], start: usize, source: usize) -> Example {
        Example {
            ids: ids.to_vec(),
            trained: (0..ids.len()).map(|j| j >= start.max(1)).collect(),
            source: Some(source),
            positions: None,
            rejected: None,
        }
    }
}

impl Dataset for PreferenceDataset {
    fn len(&self) -> usize {
        self.pairs.len()
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let p = &self.pairs[index];
        let mut chosen = self.row(&p.chosen, p.chosen_start);
        chosen.rejected = Some(Box::new(self.row(&p.rejected, p.rejected_start)));
        Ok(chosen)
    }

    fn num_tokens(&self, index: usize) -> Result<usize> {
        let p = &self.pairs[index];
        Ok(p.chosen.len() + p.rejected.len())
    }

    fn example(&self, index: usize) -> Result<Example> {
        let p = &self.pairs[index];
        let mut chosen = Self::example_of(&p.chosen, p.chosen_start, p.source);
        chosen.rejected = Some(Box::new(Self::example_of(
            &p.rejected,
            p.rejected_start,
            p.source,
        )));
        Ok(chosen)
    }

    fn describe(&self) -> String {
        format!(
            "preference {}: {} pairs of {}",
            self.path,
            self.pairs.len(),
            self.seq_len
        )
    }
}

/// One line of `data show`'s summary for preference data.
pub fn summary_line(stats: &PreferenceStats) -> String {
    let mut line = format!("{} pairs from {} records", stats.pairs, stats.records);
    if stats.truncated > 0 {
        line.push_str(&format!(", {} sequences truncated", stats.truncated));
    }
    if stats.dropped_long_prompt > 0 {
        line.push_str(&format!(
            ", {} dropped (prompt fills data.seq_len)",
            stats.dropped_long_prompt
        ));
    }
    if stats.skipped > 0 {
        line.push_str(&format!(", {} bad records skipped", stats.skipped));
    }
    line.push_str(&sources_note(&stats.sources));
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_implicit_prompt_is_the_shared_turns_or_text() {
        let c =
            json!([{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}]);
        let r = json!([{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Green."}]);
        let (p, c2, r2) = extract_prompt(&c, &r);
        assert_eq!(p, json!([{"role": "user", "content": "Sky?"}]));
        assert_eq!(c2, json!([{"role": "assistant", "content": "Blue."}]));
        assert_eq!(r2, json!([{"role": "assistant", "content": "Green."}]));
        // TRL gives the space before the split to the completions.
        let (p, c2, r2) = extract_prompt(&json!("The sky is blue."), &json!("The sky is green."));
        assert_eq!(
            (p, c2, r2),
            (json!("The sky is"), json!(" blue."), json!(" green."))
        );
    }

    #[test]
    fn bad_records_name_what_is_wrong() {
        let e = parts(&json!({"prompt": "x", "chosen": "y"})).unwrap_err();
        assert!(
            e.contains("needs 'chosen' and 'rejected'") && e.contains("[prompt, chosen]"),
            "{e}"
        );
        let e = parts(&json!({"prompt": "x", "chosen": "y", "rejected": 3})).unwrap_err();
        assert!(e.contains("'rejected' must be a string or a list"), "{e}");
        let e = parts(
            &json!({"prompt": [{"role": "user", "content": "x"}], "chosen": "y", "rejected": "z"}),
        )
        .unwrap_err();
        assert!(e.contains("both be strings or both be messages"), "{e}");
    }

    fn cfg(seq_len: usize, mode: TruncationMode, max_prompt: Option<usize>) -> PreferenceData {
        PreferenceData {
            path: Some("p.jsonl".into()),
            split: None,
            sources: None,
            eval_path: None,
            eval_split: None,
            eval_fraction: None,
            eval_records: None,
            seed: None,
            tokenizer: None,
            chat_template: None,
            max_prompt_length: max_prompt,
            truncation_mode: mode,
            skip_bad_records: false,
            seq_len,
            shuffle: false,
            num_workers: 0,
        }
    }

    #[test]
    fn truncation_keeps_the_named_end_and_drops_prompts_that_fill_the_window() {
        let ids = || PairIds {
            prompt: vec![1, 2, 3],
            chosen: vec![4, 5, 6],
            rejected: vec![7],
        };
        let (pair, cut) = truncate(ids(), &cfg(5, TruncationMode::KeepStart, None)).unwrap();
        assert_eq!(pair, [(vec![1, 2, 3, 4, 5], 3), (vec![1, 2, 3, 7], 3)]);
        assert_eq!(cut, 1);
        let (pair, _) = truncate(ids(), &cfg(5, TruncationMode::KeepEnd, None)).unwrap();
        assert_eq!(pair, [(vec![2, 3, 4, 5, 6], 2), (vec![1, 2, 3, 7], 3)]);
        assert!(truncate(ids(), &cfg(3, TruncationMode::KeepStart, None)).is_none());
        let (pair, _) = truncate(ids(), &cfg(8, TruncationMode::KeepEnd, Some(2))).unwrap();
        assert_eq!(pair[0], (vec![2, 3, 4, 5, 6], 2));
    }
}
