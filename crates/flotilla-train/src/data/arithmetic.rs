//! The built-in default data (`kind: arithmetic`): generated addition problems with a
//! character-level tokenizer, and their exact-match accuracy by greedy decoding.
//!
//! # Format
//!
//! Operands `a` and `b` have 1..=`digits` digits (the digit count is drawn uniformly, then the
//! value uniformly among numbers with that many digits, so short problems are not drowned out).
//! Every number is written zero-padded (operands to `digits`, the sum to `digits + 1`) and
//! **reversed**, least significant digit first:
//!
//! ```text
//! digits=4, 4821 + 377 = 5198:   <bos> 1284+7730= 89150 <eos>
//!                                \------ prompt -------/ \ answer /
//! ```
//!
//! The loss is masked on the prompt (labels -100): only the answer digits and EOS are learned.
//! Written this way, answer digit `i` depends on operand digits `i` (and the carry from digit
//! `i-1`, just written), which sit at the same distance behind it for every `i` and every
//! problem: a left-to-right model needs one fixed relative-position lookup. Padding also gives
//! every prompt the same length, so batched greedy decoding needs no padding.
//!
//! Measured with a transformers `LlamaForCausalLM` of `model=tiny`'s shape, AdamW at 3e-3 with
//! 30 warmup steps and cosine decay, 32 problems per step, 3 digits, exact match on 500 held-out
//! problems: plain `a+b=c` (prompt masked) 1.4% after 300 steps; only the answer reversed,
//! still at token loss ~1.0 after 600 steps; all three numbers reversed (this format) 0-2%
//! after 300 steps, 25% after 300 steps of 128 problems, and 99.8% after 1000 steps of 32. The
//! model sits on a plateau until about step 300-400, so the default 300 steps are too few.
//!
//! # Tokenizer
//!
//! 16 ids: `<pad>`=0, `<bos>`=1, `<eos>`=2, `<unk>`=3, `0`..`9` = 4..13, `+`=14, `=`=15; it
//! fits `model=tiny`'s 32. [`arithmetic_tokenizer`] is the same mapping as a Hugging Face
//! tokenizer (WordLevel over single characters) to ship with the model; its post-processor
//! starts an encoding with special tokens (transformers' `tokenizer(text)`) with `<bos>`, so a
//! prompt written as text is what the model was trained on.
//!
//! # Problems
//!
//! Deterministic from `data.seed` (a SplitMix64 stream, [`super::rng`]): the `num_eval`
//! held-out problems are drawn first and are distinct; the `num_train` training problems are
//! drawn next, skipping any held-out problem, so the two sets are disjoint (training problems
//! may repeat when the problem space is small).

use std::collections::HashSet;

use serde_json::json;
use tch::{Device, Tensor};

use flotilla_config::schema::{ArithmeticData, MAX_ARITHMETIC_DIGITS};

use super::error::{DataError, Result};
use super::rng::{mix64, SplitMix64};
use super::sequences::SequenceDataset;
use super::tokenizer::{Tokenizer, TokenizerKind, BOS, EOS, PAD};

pub const PAD_ID: u32 = 0;
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;
pub const UNK_ID: u32 = 3;
/// Id of the digit `0`; digit `d` is `DIGIT0_ID + d`.
pub const DIGIT0_ID: u32 = 4;
pub const PLUS_ID: u32 = 14;
pub const EQUALS_ID: u32 = 15;
/// Ids of the arithmetic tokenizer.
pub const ARITHMETIC_VOCAB: usize = 16;

/// The id of one character of a problem (`<unk>` for anything else).
pub fn char_id(c: char) -> u32 {
    match c {
        '0'..='9' => DIGIT0_ID + (c as u32 - '0' as u32),
        '+' => PLUS_ID,
        '=' => EQUALS_ID,
        _ => UNK_ID,
    }
}

/// The text of one id (`?` for a special or unknown id).
pub fn id_char(id: i64) -> char {
    match id {
        4..=13 => char::from(b'0' + (id - 4) as u8),
        14 => '+',
        15 => '=',
        _ => '?',
    }
}

/// The arithmetic tokenizer as a Hugging Face tokenizer (same ids as [`char_id`]).
pub fn arithmetic_tokenizer() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for (tok, id) in [(PAD, 0), (BOS, 1), (EOS, 2), ("<unk>", 3)] {
        vocab.insert(tok.into(), json!(id));
    }
    for c in "0123456789+=".chars() {
        vocab.insert(c.to_string(), json!(char_id(c)));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let value = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, PAD), special(1, BOS), special(2, EOS), special(3, "<unk>")],
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false
        },
        // `tokenizer(text)` in transformers starts a prompt with `<bos>`, as every problem
        // starts in training (the data encodes without it and places `<bos>` itself).
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": BOS, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}}
        },
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    Tokenizer::from_json(&value, TokenizerKind::Arithmetic)
        .expect("the built-in arithmetic tokenizer is valid")
}

/// One addition problem `a + b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    pub a: u64,
    pub b: u64,
}

impl Problem {
    pub fn sum(&self) -> u64 {
        self.a + self.b
    }
}

/// Generated train and held-out problems of one `digits` setting.
#[derive(Clone, Debug)]
pub struct ArithmeticTask {
    pub digits: usize,
    pub train: Vec<Problem>,
    pub eval: Vec<Problem>,
}

/// Exact-match accuracy over a set of problems.
#[derive(Clone, Debug, PartialEq)]
pub struct Accuracy {
    pub correct: usize,
    pub total: usize,
    /// Up to five wrong answers, as `prompt expected=... got=...`, for logs.
    pub failures: Vec<String>,
}

impl Accuracy {
    /// `correct / total` (0 for no problems).
    pub fn fraction(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

/// `n` zero-padded to `width` digits, least significant digit first.
fn reversed(n: u64, width: usize) -> String {
    format!("{n:0width$}").chars().rev().collect()
}

fn draw_operand(rng: &mut SplitMix64, digits: usize) -> u64 {
    let n = rng.range_inclusive(1, digits as u64) as u32;
    if n == 1 {
        rng.below(10)
    } else {
        rng.range_inclusive(10u64.pow(n - 1), 10u64.pow(n) - 1)
    }
}

impl ArithmeticTask {
    /// The problems `data` describes.
    pub fn generate(data: &ArithmeticData) -> Result<Self> {
        Self::with_params(data.digits, data.num_train, data.num_eval, data.seed)
    }

    pub fn with_params(
        digits: usize,
        num_train: usize,
        num_eval: usize,
        seed: i64,
    ) -> Result<Self> {
        if digits == 0 || digits > MAX_ARITHMETIC_DIGITS {
            return Err(DataError::config(
                "data.digits",
                format!("must be between 1 and {MAX_ARITHMETIC_DIGITS}, got {digits}"),
            ));
        }
        if num_train == 0 {
            return Err(DataError::config("data.num_train", "must be at least 1"));
        }
        let space = 10u128.pow(digits as u32).pow(2);
        if num_eval as u128 * 2 > space {
            return Err(DataError::config(
                "data.num_eval",
                format!(
                    "{num_eval} held-out problems is more than half of the {space} distinct \
                     problems with data.digits={digits}; lower data.num_eval or raise data.digits"
                ),
            ));
        }
        let mut rng = SplitMix64::new(mix64(seed as u64 ^ 0xA817_4E71_C000_0000));
        let mut held_out = HashSet::with_capacity(num_eval);
        let mut eval = Vec::with_capacity(num_eval);
        // With at most half the space held out, each draw is new with probability >= 1/2 in
        // expectation; the cap only guards against a pathological generator.
        let cap = 1000 * (num_eval + num_train) as u64 + 1_000_000;
        let mut draws = 0u64;
        let mut draw = |rng: &mut SplitMix64| -> Result<Problem> {
            draws += 1;
            if draws > cap {
                return Err(DataError::config(
                    "data.num_eval",
                    "could not draw enough distinct problems; lower data.num_eval",
                ));
            }
            Ok(Problem {
                a: draw_operand(rng, digits),
                b: draw_operand(rng, digits),
            })
        };
        while eval.len() < num_eval {
            let p = draw(&mut rng)?;
            if held_out.insert(p) {
                eval.push(p);
            }
        }
        let mut train = Vec::with_capacity(num_train);
        while train.len() < num_train {
            let p = draw(&mut rng)?;
            if !held_out.contains(&p) {
                train.push(p);
            }
        }
        Ok(ArithmeticTask {
            digits,
            train,
            eval,
        })
    }

    /// `240+773=` for 42 + 377 (operands zero-padded to `digits`, reversed).
    pub fn prompt(&self, p: &Problem) -> String {
        format!(
            "{}+{}=",
            reversed(p.a, self.digits),
            reversed(p.b, self.digits)
        )
    }

    /// `9140` for 42 + 377 = 419: the sum zero-padded to `digits + 1`, reversed.
    pub fn answer(&self, p: &Problem) -> String {
        reversed(p.sum(), self.digits + 1)
    }

    /// The problem in ordinary notation (`42+377=419`), for logs.
    pub fn display(&self, p: &Problem) -> String {
        format!("{}+{}={}", p.a, p.b, p.sum())
    }

    /// `<bos>` and the prompt's characters.
    pub fn prompt_ids(&self, p: &Problem) -> Vec<i64> {
        std::iter::once(BOS_ID)
            .chain(self.prompt(p).chars().map(char_id))
            .map(i64::from)
            .collect()
    }

    /// The answer's characters (without `<eos>`).
    pub fn answer_ids(&self, p: &Problem) -> Vec<i64> {
        self.answer(p).chars().map(|c| char_id(c) as i64).collect()
    }

    /// Ids of one whole problem: `<bos>`, prompt, answer, `<eos>` (`3*digits + 5`).
    pub fn sequence_len(&self) -> usize {
        3 * self.digits + 5
    }

    /// Tokens to generate for an answer: its digits and `<eos>`.
    pub fn max_new_tokens(&self) -> usize {
        self.digits + 2
    }

    /// One sample per problem, prompt masked, padded to `seq_len` (which must hold a whole
    /// problem: `seq_len + 1 >= 3*digits + 5`).
    pub fn dataset(&self, problems: &[Problem], seq_len: usize) -> Result<SequenceDataset> {
        if seq_len + 1 < self.sequence_len() {
            return Err(DataError::config(
                "data.seq_len",
                format!(
                    "{seq_len} is too short for {}-digit problems, which need {}; set \
                     data.seq_len={} or more",
                    self.digits,
                    self.sequence_len() - 1,
                    self.sequence_len() - 1
                ),
            ));
        }
        let items = problems
            .iter()
            .map(|p| {
                let mut ids: Vec<u32> = self.prompt_ids(p).iter().map(|&i| i as u32).collect();
                let prompt_len = ids.len();
                ids.extend(self.answer_ids(p).iter().map(|&i| i as u32));
                ids.push(EOS_ID);
                (ids, prompt_len)
            })
            .collect();
        SequenceDataset::new("arithmetic", items, seq_len, PAD_ID)
    }

    /// Exact-match accuracy on `problems`: `generate(prompts, max_new_tokens)` must return,
    /// for each prompt (`[<bos>, prompt chars]`, all the same length), the greedily generated
    /// continuation (at most `max_new_tokens` ids, without the prompt). A continuation is cut
    /// at its first `<eos>`, and is correct when what remains equals the answer's digits.
    /// Prompts go to `generate` in chunks of `batch_size`.
    pub fn exact_match<F, E>(
        &self,
        problems: &[Problem],
        batch_size: usize,
        mut generate: F,
    ) -> Result<Accuracy>
    where
        F: FnMut(&[Vec<i64>], usize) -> std::result::Result<Vec<Vec<i64>>, E>,
        E: std::fmt::Display,
    {
        let mut acc = Accuracy {
            correct: 0,
            total: 0,
            failures: vec![],
        };
        for chunk in problems.chunks(batch_size.max(1)) {
            let prompts: Vec<Vec<i64>> = chunk.iter().map(|p| self.prompt_ids(p)).collect();
            let outs = generate(&prompts, self.max_new_tokens())
                .map_err(|e| DataError::Generate(e.to_string()))?;
            if outs.len() != prompts.len() {
                return Err(DataError::Generate(format!(
                    "returned {} continuations for {} prompts",
                    outs.len(),
                    prompts.len()
                )));
            }
            for (p, out) in chunk.iter().zip(outs) {
                let end = out
                    .iter()
                    .position(|&t| t == EOS_ID as i64)
                    .unwrap_or(out.len());
                let got = &out[..end];
                acc.total += 1;
                if got == self.answer_ids(p).as_slice() {
                    acc.correct += 1;
                } else if acc.failures.len() < 5 {
                    acc.failures.push(format!(
                        "{} ({}) expected={} got={}",
                        self.prompt(p),
                        self.display(p),
                        self.answer(p),
                        got.iter().map(|&t| id_char(t)).collect::<String>()
                    ));
                }
            }
        }
        Ok(acc)
    }
}

/// Greedy decoding without a cache, for short prompts: `forward` maps input ids `[B, L]` (on
/// `device`) to logits `[B, L, V]`; each step appends the argmax of the last position. The
/// prompts must all have the same length. Returns each continuation, cut before its first
/// `eos_id`. Runs under `no_grad`.
pub fn greedy_generate<F, E>(
    prompts: &[Vec<i64>],
    max_new_tokens: usize,
    eos_id: i64,
    device: Device,
    mut forward: F,
) -> Result<Vec<Vec<i64>>>
where
    F: FnMut(&Tensor) -> std::result::Result<Tensor, E>,
    E: std::fmt::Display,
{
    greedy_generate_in_step(
        prompts,
        max_new_tokens,
        eos_id,
        device,
        |x| x.map(&mut forward).transpose(),
        |active| Ok::<_, E>(active),
    )
}

/// [`greedy_generate`] in step with other processes whose forward passes are collective
/// (sharded weights): before each new token, `agree(active)` says whether any process still
/// generates (this one is active while a prompt of its batch has not ended), and while any
/// does, `forward` is called every step, with `None` once this process is done or when it has
/// no prompts. `prompts` may be empty.
pub fn greedy_generate_in_step<F, A, E>(
    prompts: &[Vec<i64>],
    max_new_tokens: usize,
    eos_id: i64,
    device: Device,
    mut forward: F,
    mut agree: A,
) -> Result<Vec<Vec<i64>>>
where
    F: FnMut(Option<&Tensor>) -> std::result::Result<Option<Tensor>, E>,
    A: FnMut(bool) -> std::result::Result<bool, E>,
    E: std::fmt::Display,
{
    let generate = |e: E| DataError::Generate(e.to_string());
    let len = prompts.first().map_or(1, Vec::len);
    if prompts.iter().any(|p| p.len() != len) || len == 0 {
        return Err(DataError::Generate(
            "greedy_generate needs non-empty prompts of one length".into(),
        ));
    }
    let b = prompts.len();
    let flat: Vec<i64> = prompts.concat();
    tch::no_grad(|| {
        let mut x = Tensor::f_from_slice(&flat)?
            .f_reshape([b as i64, len as i64])?
            .f_to_device(device)?;
        let mut out = vec![vec![]; b];
        let mut done = vec![false; b];
        for _ in 0..max_new_tokens {
            let active = b > 0 && !done.iter().all(|&d| d);
            if !agree(active).map_err(generate)? {
                break;
            }
            let logits = forward(active.then_some(&x)).map_err(generate)?;
            let Some(logits) = logits.filter(|_| active) else {
                continue;
            };
            let next = logits.f_select(1, -1)?.f_argmax(-1, false)?;
            let ids: Vec<i64> = Vec::<i64>::try_from(next.f_to_device(Device::Cpu)?)?;
            for (i, &t) in ids.iter().enumerate() {
                if !done[i] {
                    if t == eos_id {
                        done[i] = true;
                    } else {
                        out[i].push(t);
                    }
                }
            }
            x = Tensor::f_cat(&[x, next.f_unsqueeze(1)?], 1)?;
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_is_padded_and_reversed() {
        let t = ArithmeticTask {
            digits: 4,
            train: vec![],
            eval: vec![],
        };
        let p = Problem { a: 4821, b: 377 };
        assert_eq!(t.prompt(&p), "1284+7730=");
        assert_eq!(t.answer(&p), "89150");
        assert_eq!(t.display(&p), "4821+377=5198");
        let ids = t.prompt_ids(&p);
        assert_eq!(ids.len() + t.answer_ids(&p).len() + 1, t.sequence_len());
    }

    #[test]
    fn char_ids_match_the_hf_tokenizer() {
        let tok = arithmetic_tokenizer();
        let text = "0123456789+=";
        let ours: Vec<u32> = text.chars().map(char_id).collect();
        assert_eq!(tok.encode(text).unwrap(), ours);
        assert_eq!(tok.decode(&ours, false).unwrap(), text);
        assert_eq!(tok.vocab_size(), ARITHMETIC_VOCAB);
        assert_eq!(
            (tok.pad_id(), tok.bos_id(), tok.eos_id()),
            (Some(PAD_ID), Some(BOS_ID), Some(EOS_ID))
        );
        // With special tokens (transformers' `tokenizer(text)`), a prompt's text gives the
        // ids the model is trained and evaluated on: `<bos>` first.
        let task = ArithmeticTask {
            digits: 3,
            train: vec![],
            eval: vec![],
        };
        let p = Problem { a: 210, b: 43 };
        let encoded = tok.inner().encode(task.prompt(&p), true).unwrap();
        let ids: Vec<i64> = encoded.get_ids().iter().map(|&i| i64::from(i)).collect();
        assert_eq!(ids, task.prompt_ids(&p));
    }
}
