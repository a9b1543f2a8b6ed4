//! The data layer: tokenizers, datasets, the sample order, and batches, everything the trainer
//! needs to turn `data:` of a job config into `[M, T]` tensors, plus the exact-match accuracy of
//! the built-in arithmetic task.
//!
//! [`build`] reads a validated [`DataConfig`] and returns [`Data`]: the tokenizer (save it into
//! the final model directory), the training [`Dataset`], the evaluation dataset if the config
//! has one, and for `kind: arithmetic` the [`ArithmeticTask`] whose held-out problems the
//! trainer scores with [`ArithmeticTask::exact_match`]. [`DataLoader`] walks a dataset in the
//! order of a [`Sampler`] and gives each rank its micro-batches ([`Batch`]) for one optimizer
//! step; [`eval_batches`] does the same for evaluation.
//!
//! # Samples
//!
//! Every dataset is a list of fixed-length samples of `T = data.seq_len` positions: `input_ids`
//! and `labels`, both `T` long, where `labels[i]` is the target of position `i` (already
//! shifted: the trainer computes `cross_entropy(logits[.., i, ..], labels[.., i])` directly, with
//! no shift of its own), and [`IGNORE_INDEX`] (-100) marks positions without loss (padding,
//! masked prompts).
//!
//! - `tokens`: a flat little-endian uint16/uint32 file of `N` ids, read lazily by positional
//!   reads (never loaded whole). Sample `k` has inputs `tokens[k*T .. k*T+T]` and labels
//!   `tokens[k*T+1 .. k*T+T+1]`; there are `(N-1) / T` samples, and the tail that cannot fill a
//!   whole sample (`(N-1) mod T` tokens) is dropped, never wrapped. Ids are checked against
//!   `model.vocab_size` as they are read; an id out of range is an error naming the file, the
//!   token position and the vocabulary size.
//! - `text`: every file (globs expanded, sorted, each file once) is a document; the token
//!   stream is `doc_0 EOS doc_1 EOS ... doc_n EOS` and is cut into samples exactly like a
//!   `tokens` file. Every label counts.
//! - `jsonl`: one record per sample, `[BOS] prompt completion EOS` (BOS when the tokenizer has
//!   one), right-padded with PAD (labels -100) or truncated to `T+1` tokens. A record with
//!   `data.completion_key` renders `data.prompt_template` (`{field}` is the record's field,
//!   `{{`/`}}` are literal braces) as the prompt; with `mask_prompt` only completion tokens and
//!   the EOS are labelled. A record with only `text` is labelled everywhere.
//! - `arithmetic`: see [`arithmetic`]; the same one-problem-per-sample layout with the prompt
//!   masked.
//!
//! # Order (a contract the DDP/FSDP tests rely on)
//!
//! The sampler defines a stream of sample indices: stream position `p` lies in epoch
//! `e = p / S` (S samples) and holds sample `p mod S` when `data.shuffle=false`, else
//! `perm_e(p mod S)` for a seeded pseudorandom permutation that differs per epoch and is the
//! same for the same seed on every machine and build. With global batch size `G`, the global
//! batch of step `s` (0-based) is stream positions `s*G .. s*G+G` (so with `shuffle=false` and
//! a `tokens` file, samples `s*G .. s*G+G-1`, wrapping around at the end of the data).
//!
//! Rank `r` of `W` takes rows `r*G/W .. (r+1)*G/W` of that global batch, in order, and splits
//! them into `G/(W*M)` consecutive micro-batches of `M = micro_batch_size` rows. The union over
//! ranks is the same global batch for every `W`. Every rank also learns the number of labelled
//! tokens in the whole global batch ([`StepBatches::global_loss_tokens`], computed locally,
//! without communication), so the trainer normalises each micro-batch's summed loss by that
//! one count and the per-step loss (and gradient) does not depend on `W` or `M`.
//!
//! Evaluation takes the first `E` samples of the evaluation set in order (no shuffle), rank `r`
//! rows `r*E/W .. (r+1)*E/W`, in micro-batches of at most `M` rows.
//!
//! The position in the stream is [`SamplerState`] (JSON in checkpoints); restoring it resumes
//! on the exact next sample.
//!
//! The shuffle seed is whatever the trainer passes to [`DataLoader::new`] (the config has no
//! data-level shuffle seed; `trainer.seed` is the natural choice). `data.seed` only drives the
//! generation of arithmetic problems. `data.num_workers` is accepted and ignored: samples are
//! read on the calling thread (a positional read or a slice copy per sample).

pub mod arithmetic;
pub mod batch;
mod byte_level_encoder;
pub mod chat;
pub mod chat_cache;
pub mod chat_formats;
mod chat_markers;
pub mod chat_template;
pub mod dataset;
pub mod error;
pub mod jsonl;
pub mod masked;
mod metaspace_encoder;
pub mod mixture;
mod positional_read;
pub mod preference;
pub mod record_sets;
pub mod records;
pub mod rng;
mod sample_sink;
pub mod sampler;
pub mod sequences;
pub mod show;
pub mod text;
pub mod tokenizer;
pub mod tokens;
mod unicode_forms;

use std::path::Path;
use std::sync::Arc;

use flotilla_config::schema::{DataConfig, TokenizerSpec};

pub use arithmetic::{greedy_generate, greedy_generate_in_step, Accuracy, ArithmeticTask, Problem};
pub use batch::{eval_batches, Batch, BatchLayout, DataLoader, StepBatches};
pub use chat::{ChatStats, ChatTokenizer};
pub use chat_template::ChatTemplate;
pub use dataset::{Dataset, Example, Sample, IGNORE_INDEX};
pub use error::{DataError, Result};
pub use jsonl::{read_records, Record, Template};
pub use masked::{MaskedSequences, SequenceIndex, SequenceWriter};
pub use preference::{PreferenceDataset, PreferenceStats};
pub use sampler::{eval_rows, micro_batch_rows, rank_rows, Sampler, SamplerState};
pub use sequences::SequenceDataset;
pub use text::{resolve_paths, PackedDataset};
pub use tokenizer::{Tokenizer, TokenizerKind};
pub use tokens::TokensDataset;

/// What [`build`] needs besides the config.
#[derive(Clone, Debug)]
pub struct DataOptions<'a> {
    /// `model.vocab_size`: every id the data produces must be below it.
    pub model_vocab_size: usize,
    /// The run directory: a trained BPE tokenizer is saved there as `tokenizer.json` (and
    /// reloaded from there when present, so a resumed run keeps its vocabulary).
    pub run_dir: Option<&'a Path>,
    /// `model.init_from`: chat data takes its tokenizer directory from there unless
    /// `data.tokenizer` names one.
    pub init_from: Option<&'a Path>,
}

/// The data of one run.
pub struct Data {
    /// The tokenizer (`None` for `kind: tokens`, whose ids come pre-tokenized).
    pub tokenizer: Option<Tokenizer>,
    pub train: Arc<dyn Dataset>,
    /// Held-out samples, when the config names some.
    pub eval: Option<Arc<dyn Dataset>>,
    /// The arithmetic problems (`kind: arithmetic` only), for exact-match evaluation.
    pub arithmetic: Option<ArithmeticTask>,
    /// What preparing chat data did (`kind: chat` only): the training set's counts.
    pub chat_stats: Option<ChatStats>,
    /// What preparing preference pairs did (`kind: preference` only): the training set's.
    pub preference_stats: Option<PreferenceStats>,
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("tokenizer", &self.tokenizer)
            .field("train", &self.train.describe())
            .field("eval", &self.eval.as_ref().map(|e| e.describe()))
            .finish()
    }
}

/// `data.tokenizer` as set, or unset: the base's with `model.init_from`, else `byte`.
fn base_or(spec: &Option<TokenizerSpec>, opts: &DataOptions<'_>) -> TokenizerSpec {
    let init_from = opts.init_from.map(|p| p.to_string_lossy().into_owned());
    TokenizerSpec::resolve(spec.as_ref(), init_from.as_deref())
}

/// Builds the datasets (and tokenizer) a data config describes. Relative paths are taken
/// relative to the current directory.
pub fn build(cfg: &DataConfig, opts: &DataOptions<'_>) -> Result<Data> {
    match cfg {
        DataConfig::Arithmetic(a) => {
            let task = ArithmeticTask::generate(a)?;
            let tokenizer = arithmetic::arithmetic_tokenizer();
            check_vocab(&tokenizer, opts.model_vocab_size)?;
            let train = Arc::new(task.dataset(&task.train, a.seq_len)?);
            let eval = if task.eval.is_empty() {
                None
            } else {
                Some(Arc::new(task.dataset(&task.eval, a.seq_len)?) as Arc<dyn Dataset>)
            };
            Ok(Data {
                tokenizer: Some(tokenizer),
                train,
                eval,
                arithmetic: Some(task),
                chat_stats: None,
                preference_stats: None,
            })
        }
        DataConfig::Tokens(t) => {
            let open = |key: &str, path: &str| {
                TokensDataset::open(path, key, t.token_dtype, t.seq_len, opts.model_vocab_size)
            };
            let train = Arc::new(open("data.path", &t.path)?);
            let eval = match &t.eval_path {
                Some(p) => Some(Arc::new(open("data.eval_path", p)?) as Arc<dyn Dataset>),
                None => None,
            };
            Ok(Data {
                tokenizer: None,
                train,
                eval,
                arithmetic: None,
                chat_stats: None,
                preference_stats: None,
            })
        }
        DataConfig::Text(t) => {
            let docs = text::read_documents("data.paths", &t.paths)?;
            let (train_docs, carved) = text::carve(docs, t)?;
            let tokenizer = tokenizer::tokenizer_for_spec(
                &base_or(&t.tokenizer, opts),
                t.vocab_size,
                opts.run_dir,
                || Ok(train_docs.iter().map(|(_, s)| s.clone()).collect()),
            )?;
            check_vocab(&tokenizer, opts.model_vocab_size)?;
            let train = Arc::new(PackedDataset::from_documents(
                "data.paths",
                &train_docs,
                &tokenizer,
                t.seq_len,
            )?);
            let eval_docs = match (&t.eval_paths, carved) {
                (Some(p), _) => Some((
                    "data.eval_paths",
                    text::read_documents("data.eval_paths", p)?,
                )),
                (None, Some(docs)) => Some(("data.eval_fraction", docs)),
                (None, None) => None,
            };
            let eval = match eval_docs {
                Some((key, docs)) => Some(Arc::new(PackedDataset::from_documents(
                    key, &docs, &tokenizer, t.seq_len,
                )?) as Arc<dyn Dataset>),
                None => None,
            };
            Ok(Data {
                tokenizer: Some(tokenizer),
                train,
                eval,
                arithmetic: None,
                chat_stats: None,
                preference_stats: None,
            })
        }
        DataConfig::Jsonl(j) => {
            let template = jsonl::Template::parse(&j.prompt_template)?;
            let (train_set, eval_set) = record_sets::plan(&j.selection())?;
            let records = jsonl::read_records(&train_set, &template, &j.completion_key)?;
            let tokenizer = tokenizer::tokenizer_for_spec(
                &base_or(&j.tokenizer, opts),
                j.vocab_size,
                opts.run_dir,
                || {
                    Ok(records
                        .iter()
                        .map(|r| format!("{}{}", r.prompt, r.completion))
                        .collect())
                },
            )?;
            check_vocab(&tokenizer, opts.model_vocab_size)?;
            let train = Arc::new(jsonl::encode_records(
                train_set.name(),
                &records,
                &tokenizer,
                j.seq_len,
                j.mask_prompt,
            )?);
            let eval = match &eval_set {
                Some(set) => {
                    let recs = jsonl::read_records(set, &template, &j.completion_key)?;
                    Some(Arc::new(jsonl::encode_records(
                        set.name(),
                        &recs,
                        &tokenizer,
                        j.seq_len,
                        j.mask_prompt,
                    )?) as Arc<dyn Dataset>)
                }
                None => None,
            };
            Ok(Data {
                tokenizer: Some(tokenizer),
                train,
                eval,
                arithmetic: None,
                chat_stats: None,
                preference_stats: None,
            })
        }
        DataConfig::Chat(c) => {
            let chat = ChatTokenizer::open(c, opts.init_from)?;
            check_vocab(&chat.tokenizer, opts.model_vocab_size)?;
            let (train_set, eval_set) = record_sets::plan(&c.selection())?;
            let (train, stats) = chat::build_set(&train_set, c, &chat, true)?;
            tracing::info!("{}: {}", train_set.name(), chat::summary_line(&stats));
            for reason in &stats.skip_reasons {
                tracing::warn!("skipped {reason}");
            }
            let eval = match &eval_set {
                Some(set) => {
                    let (eval, eval_stats) = chat::build_set(set, c, &chat, true)?;
                    tracing::info!(
                        "held out {}: {}",
                        set.name(),
                        chat::summary_line(&eval_stats)
                    );
                    Some(Arc::new(eval) as Arc<dyn Dataset>)
                }
                None => None,
            };
            Ok(Data {
                tokenizer: Some(chat.tokenizer),
                train: Arc::new(train),
                eval,
                arithmetic: None,
                chat_stats: Some(stats),
                preference_stats: None,
            })
        }
        DataConfig::Preference(p) => {
            let chat = ChatTokenizer::open_dir(
                p.tokenizer.as_deref(),
                p.chat_template.as_deref(),
                opts.init_from,
            )?;
            check_vocab(&chat.tokenizer, opts.model_vocab_size)?;
            let (train_set, eval_set) = record_sets::plan(&p.selection())?;
            let (train, stats) = PreferenceDataset::build(&train_set, p, &chat)?;
            tracing::info!("{}: {}", train_set.name(), preference::summary_line(&stats));
            for reason in &stats.skip_reasons {
                tracing::warn!("skipped {reason}");
            }
            let eval = match &eval_set {
                Some(set) => {
                    let (eval, eval_stats) = PreferenceDataset::build(set, p, &chat)?;
                    tracing::info!(
                        "held out {}: {}",
                        set.name(),
                        preference::summary_line(&eval_stats)
                    );
                    Some(Arc::new(eval) as Arc<dyn Dataset>)
                }
                None => None,
            };
            Ok(Data {
                tokenizer: Some(chat.tokenizer),
                train: Arc::new(train),
                eval,
                arithmetic: None,
                chat_stats: None,
                preference_stats: Some(stats),
            })
        }
    }
}

/// Every id of `tokenizer` must fit a model of `model_vocab_size` ids.
pub fn check_vocab(tokenizer: &Tokenizer, model_vocab_size: usize) -> Result<()> {
    if tokenizer.vocab_size() > model_vocab_size {
        return Err(DataError::config(
            "model.vocab_size",
            format!(
                "{model_vocab_size} is smaller than the {:?} tokenizer's {} ids; raise \
                 model.vocab_size to {} or more",
                tokenizer.kind(),
                tokenizer.vocab_size(),
                tokenizer.vocab_size()
            ),
        ));
    }
    Ok(())
}
