//! `flotilla generate`: text from a trained model, one prompt at a time. This module owns the
//! whole command: finding the weights, config and tokenizer of a model directory (a Hugging
//! Face directory such as a run's `final/`, or a checkpoint `checkpoints/step_N`, full or
//! FSDP-sharded, whose tokenizer is found in the run directory around it), an optional PEFT
//! LoRA adapter over it, the prompt's token ids (`--prompt` as transformers' `tokenizer(text)`
//! encodes it, with the tokenizer's post-processor; `--messages` rendered with the chat
//! template), the decoding loop (the prompt run once through [`CausalLm::forward_cached`], then
//! one token per step against the key/value cache), greedy decoding or seeded sampling in
//! transformers' order (temperature, top-k, top-p), the stop at the end-of-sequence ids
//! transformers' `generate` stops at, and the text and JSON outputs with their timings.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use flotilla_config::schema::ModelConfig;
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::checkpoint::CheckpointFiles;
use crate::data::rng::SplitMix64;
use crate::data::tokenizer::Tokenizer;
use crate::data::{ChatTemplate, DataError};
use crate::error::TrainError;
use crate::model::{CausalLm, KvCache, ModelError, Params};
use crate::state::hf_weights::HfWeights;
use crate::state::param_source::{materialize, Overlay, TensorSource};
use crate::state::peft;

/// Tokens generated when `--max-new-tokens` is not given.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 256;

/// The arguments of `flotilla generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    /// A Hugging Face model directory (a run's final/: config.json, model.safetensors,
    /// tokenizer.json) or a checkpoint directory (a run's checkpoints/step_N).
    pub model_dir: PathBuf,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) to apply
    /// over the model.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// The prompt, tokenized as transformers' `tokenizer(text)` does (with the special tokens
    /// the tokenizer's post-processor adds, e.g. a BOS).
    #[arg(
        long,
        required_unless_present = "messages",
        conflicts_with = "messages"
    )]
    pub prompt: Option<String>,
    /// A JSON file holding a list of {"role", "content"} messages (or an object with
    /// "messages"), rendered with the tokenizer's chat template and a generation prompt.
    #[arg(long)]
    pub messages: Option<PathBuf>,
    /// The most tokens to generate (default 256; fewer when the model's
    /// max_position_embeddings is reached); generation stops earlier at an end-of-sequence
    /// token.
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Sample with this temperature; 0 or absent: greedy decoding.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sample only among the most likely tokens whose probabilities sum to P (0 < P <= 1).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Sample only among the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Seed of the sampling (the same seed gives the same tokens); absent: a fresh one,
    /// printed on stderr.
    #[arg(long)]
    pub seed: Option<u64>,
    /// cpu, cuda, cuda:N, or auto (the first GPU when there is one).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Compute dtype: float32, bfloat16 or float16; default: the one config.json declares,
    /// else float32.
    #[arg(long, value_parser = parse_dtype)]
    pub dtype: Option<Kind>,
    /// A tokenizer.json (or the directory holding it) to use instead of the model's.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// text: the generated text on stdout, timings on stderr; json: one object with the
    /// prompt and output ids, the text and the decode speed.
    #[arg(long, value_enum, default_value = "text")]
    pub format: OutputFormat,
}

/// The output of `flotilla generate`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

/// The device `--device` names (checked against the machine when generation starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda(usize),
}

/// Parses `--device`: `cpu`, `cuda`, `cuda:N` or `auto`.
pub fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    let bad = || format!("unknown device `{s}`: use cpu, cuda, cuda:N (N a GPU index) or auto");
    match s.trim() {
        "auto" => Ok(DeviceChoice::Auto),
        "cpu" => Ok(DeviceChoice::Cpu),
        "cuda" => Ok(DeviceChoice::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(n) => n.parse().map(DeviceChoice::Cuda).map_err(|_| bad()),
            None => Err(bad()),
        },
    }
}

/// Parses `--dtype`: float32, bfloat16 or float16 (fp32, bf16, fp16).
pub fn parse_dtype(s: &str) -> Result<Kind, String> {
    match s {
        "float32" | "fp32" => Ok(Kind::Float),
        "bfloat16" | "bf16" => Ok(Kind::BFloat16),
        "float16" | "fp16" => Ok(Kind::Half),
        _ => Err(format!(
            "unknown dtype `{s}`: use float32, bfloat16 or float16"
        )),
    }
}

impl DeviceChoice {
    /// The libtorch device, or an error when this machine has no such GPU.
    pub fn resolve(self) -> Result<Device, GenerateError> {
        match self {
            DeviceChoice::Cpu => Ok(Device::Cpu),
            DeviceChoice::Auto => Ok(crate::cuda::auto_device()),
            DeviceChoice::Cuda(n) => {
                let count = crate::cuda::device_count();
                if n >= count {
                    return Err(GenerateError::Usage(format!(
                        "--device cuda:{n}: {}; use --device cpu{}",
                        match count {
                            0 => "libtorch sees no CUDA GPU on this machine".to_string(),
                            c => format!("this machine has {c} CUDA GPU(s), numbered from 0"),
                        },
                        if count > 0 { " or cuda:0" } else { "" }
                    )));
                }
                Ok(Device::Cuda(n))
            }
        }
    }
}

/// What can go wrong in `flotilla generate`; each names the culprit and the fix.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A bad argument or input file, with its fix.
    #[error("{0}")]
    Usage(String),
    /// No tokenizer where one was looked for.
    #[error(
        "no tokenizer for {}: looked for {}; pass one with --tokenizer PATH/tokenizer.json",
        model.display(),
        looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoTokenizer {
        model: PathBuf,
        looked: Vec<PathBuf>,
    },
    /// The prompt leaves no room to generate.
    #[error(
        "the prompt is {prompt} tokens; the model holds at most {max_positions} positions \
         (max_position_embeddings in its config.json), so nothing can be generated: shorten \
         the prompt"
    )]
    PromptTooLong { prompt: usize, max_positions: usize },
    /// libtorch failed while generating.
    #[error("libtorch failed during {phase}: {message}{}", if *out_of_memory {
        "; the device ran out of memory: try --dtype bfloat16, a shorter prompt or fewer \
         --max-new-tokens, or --device cpu"
    } else { "" })]
    Libtorch {
        phase: String,
        message: String,
        out_of_memory: bool,
    },
    /// Reading the model, its adapter or its weights failed (the message holds the cause).
    #[error("{context}: {source}")]
    Model { context: String, source: TrainError },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("writing the output: {0}")]
    Output(std::io::Error),
}

impl GenerateError {
    /// Whether the input is at fault (a missing or malformed file or directory, a bad
    /// argument, a tokenizer or chat template that cannot serve): exit status 2.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            GenerateError::Usage(_)
                | GenerateError::NoTokenizer { .. }
                | GenerateError::PromptTooLong { .. }
                | GenerateError::Data(_)
        ) || matches!(self, GenerateError::Model { source, .. } if source.is_bad_input())
    }

    fn model(context: impl Into<String>) -> impl FnOnce(TrainError) -> GenerateError {
        let context = context.into();
        move |source| GenerateError::Model { context, source }
    }
}

fn usage(message: impl Into<String>) -> GenerateError {
    GenerateError::Usage(message.into())
}

/// A model ready to generate: its architecture, weights, tokenizer, the directory of the
/// tokenizer's files (for the chat template) and the ids that end generation.
pub struct Generator {
    pub model: CausalLm,
    pub params: Params,
    pub tokenizer: Tokenizer,
    pub tokenizer_dir: Option<PathBuf>,
    /// transformers' `generation_config.eos_token_id` (see [`eos_ids`]).
    pub eos_ids: Vec<i64>,
    pub device: Device,
}

/// Where a model directory's weights are.
enum Weights {
    /// A Hugging Face directory.
    Hf(PathBuf),
    /// A checkpoint `checkpoints/step_N` of the run directory `run_dir`.
    Checkpoint { dir: PathBuf, run_dir: PathBuf },
}

fn classify(dir: &Path) -> Result<Weights, GenerateError> {
    let fix = "pass a run's final/ directory (outputs/…/final) or one of its checkpoints \
               (outputs/…/checkpoints/step_N)";
    if !dir.exists() {
        return Err(usage(format!("{} does not exist: {fix}", dir.display())));
    }
    if !dir.is_dir() {
        return Err(usage(format!(
            "{} is not a directory: {fix}",
            dir.display()
        )));
    }
    let has = |name: &str| dir.join(name).is_file();
    if has("adapter_config.json") && !has("config.json") {
        let base = read_json(&dir.join("adapter_config.json"))
            .ok()
            .and_then(|c| c["base_model_name_or_path"].as_str().map(String::from))
            .unwrap_or_else(|| "BASE_MODEL_DIR".into());
        return Err(usage(format!(
            "{} is a LoRA adapter, not a model: generate with its base and the adapter, \
             `flotilla generate {base} --adapter {}`",
            dir.display(),
            dir.display()
        )));
    }
    if !has("config.json") {
        return Err(usage(format!(
            "{} has no config.json, so it is not a model directory: {fix}",
            dir.display()
        )));
    }
    if has(crate::checkpoint::SHARDED_META_FILE) || has("trainer_state.json") {
        let run_dir = dir
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        return Ok(Weights::Checkpoint {
            dir: dir.to_path_buf(),
            run_dir,
        });
    }
    Ok(Weights::Hf(dir.to_path_buf()))
}

fn read_json(path: &Path) -> Result<Value, GenerateError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| usage(format!("{}: not valid JSON: {e}", path.display())))
}

/// transformers' end-of-generation ids for a model directory: `generation_config.json`'s
/// `eos_token_id` (an id or a list), else `config.json`'s, else the tokenizer's EOS. The first
/// of `dirs` that has the file decides.
pub fn eos_ids(dirs: &[&Path], tokenizer: &Tokenizer) -> Vec<i64> {
    let ids = |v: &Value| -> Option<Vec<i64>> {
        match v {
            Value::Number(n) => n.as_i64().map(|i| vec![i]),
            Value::Array(a) => Some(a.iter().filter_map(Value::as_i64).collect()),
            _ => None,
        }
    };
    for file in ["generation_config.json", "config.json"] {
        for dir in dirs {
            let path = dir.join(file);
            if !path.is_file() {
                continue;
            }
            if let Some(found) = read_json(&path).ok().and_then(|c| ids(&c["eos_token_id"])) {
                return found;
            }
            break; // the first directory with this file decides
        }
    }
    tokenizer.eos_id().map(i64::from).into_iter().collect()
}

/// The tokenizer `--tokenizer` names: a tokenizer.json or the directory holding one.
fn tokenizer_at(path: &Path) -> Result<(Tokenizer, Option<PathBuf>), GenerateError> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    let tok = Tokenizer::from_file(&file, "--tokenizer")?;
    Ok((tok, file.parent().map(Path::to_path_buf)))
}

/// The tokenizer of a model: `tokenizer.json` beside the weights; for a checkpoint, the run's
/// `final/`, the run directory (a trained BPE), else the tokenizer the run's config.yaml names
/// (the built-in arithmetic or byte tokenizer, or a file).
fn find_tokenizer(
    model_dir: &Path,
    weights: &Weights,
) -> Result<(Tokenizer, Option<PathBuf>), GenerateError> {
    let mut dirs = vec![model_dir.to_path_buf()];
    if let Weights::Checkpoint { run_dir, .. } = weights {
        dirs.push(run_dir.join(flotilla_contract::layout::FINAL_DIR));
        dirs.push(run_dir.clone());
    }
    let looked: Vec<PathBuf> = dirs.iter().map(|d| d.join("tokenizer.json")).collect();
    if let Some(file) = looked.iter().find(|f| f.is_file()) {
        return tokenizer_at(file);
    }
    if let Weights::Checkpoint { run_dir, .. } = weights {
        let config = run_dir.join(flotilla_contract::layout::CONFIG_FILE);
        if let Some(tok) = tokenizer_of_run_config(&config)? {
            return Ok(tok);
        }
        let mut looked = looked;
        looked.push(config);
        return Err(GenerateError::NoTokenizer {
            model: model_dir.to_path_buf(),
            looked,
        });
    }
    Err(GenerateError::NoTokenizer {
        model: model_dir.to_path_buf(),
        looked,
    })
}

/// The tokenizer a run's `config.yaml` trained with, when it needs no file of the run: the
/// arithmetic tokenizer, the byte tokenizer, or a `tokenizer.json` path.
fn tokenizer_of_run_config(
    config: &Path,
) -> Result<Option<(Tokenizer, Option<PathBuf>)>, GenerateError> {
    let Ok(text) = std::fs::read_to_string(config) else {
        return Ok(None);
    };
    let Ok(tree) = serde_yaml::from_str::<serde_yaml::Value>(&text) else {
        return Ok(None);
    };
    let data = &tree["data"];
    if data["kind"].as_str() == Some("arithmetic") {
        return Ok(Some((
            crate::data::arithmetic::arithmetic_tokenizer(),
            None,
        )));
    }
    match data["tokenizer"].as_str() {
        Some("byte") => Ok(Some((Tokenizer::byte(), None))),
        Some("bpe") | None => Ok(None),
        Some(path) => tokenizer_at(Path::new(path)).map(Some),
    }
}

/// The messages of a `--messages` file: a JSON list of message objects, or an object whose
/// `messages` is one.
pub fn read_messages(path: &Path) -> Result<Value, GenerateError> {
    let shape = "a JSON list of {\"role\": ..., \"content\": ...} objects, or an object with \
                 such a list under \"messages\"";
    if !path.is_file() {
        return Err(usage(format!(
            "--messages {}: no such file; it should hold {shape}",
            path.display()
        )));
    }
    let value = read_json(path).map_err(|e| usage(format!("--messages {e}")))?;
    let messages = match value {
        Value::Object(mut o) => o.remove("messages").unwrap_or(Value::Null),
        v => v,
    };
    let Value::Array(list) = &messages else {
        return Err(usage(format!(
            "--messages {}: expected {shape}",
            path.display()
        )));
    };
    if list.is_empty() {
        return Err(usage(format!(
            "--messages {}: the list of messages is empty",
            path.display()
        )));
    }
    for (i, m) in list.iter().enumerate() {
        if !m.is_object() || !m["role"].is_string() {
            return Err(usage(format!(
                "--messages {}: message {i} is not an object with a string \"role\"; expected \
                 {shape}",
                path.display()
            )));
        }
    }
    Ok(messages)
}

/// The ids of `text` as transformers' `tokenizer(text)["input_ids"]` gives them for a
/// `tokenizer.json`: encoded with its post-processor, which adds the special tokens it is
/// built to add (transformers 5 ignores `add_bos_token`/`add_eos_token` of
/// `tokenizer_config.json` when a `tokenizer.json` is present, and a `null` post-processor adds
/// nothing).
pub fn prompt_ids(tokenizer: &Tokenizer, text: &str) -> Result<Vec<i64>, GenerateError> {
    let enc = tokenizer
        .inner()
        .encode_fast(text, true)
        .map_err(|e| DataError::Tokenizer {
            what: "prompt".into(),
            message: e.to_string(),
        })?;
    Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
}

/// The ids of a conversation: the chat template of `tokenizer_dir` rendered with a generation
/// prompt, tokenized without added special tokens (the template writes them).
pub fn chat_ids(
    tokenizer: &Tokenizer,
    tokenizer_dir: Option<&Path>,
    messages: &Value,
) -> Result<Vec<i64>, GenerateError> {
    let Some(dir) = tokenizer_dir else {
        return Err(usage(
            "--messages needs a chat template, and this model's tokenizer is a built-in one \
             with none: use --prompt, or --tokenizer DIR with a chat template",
        ));
    };
    let template = ChatTemplate::from_tokenizer_dir(dir).map_err(|e| {
        usage(format!(
            "--messages needs the model's chat template: {e}; use --prompt TEXT, or \
             --tokenizer DIR with a chat template"
        ))
    })?;
    let text = template.render(messages, true)?;
    Ok(tokenizer
        .encode(&text)?
        .into_iter()
        .map(i64::from)
        .collect())
}

impl Generator {
    /// Loads the model of `model_dir` (with `adapter` applied) onto `device` in `kind` (`None`:
    /// the dtype config.json declares, else float32), with its tokenizer (`tokenizer`
    /// overrides it).
    pub fn load(
        model_dir: &Path,
        adapter: Option<&Path>,
        tokenizer: Option<&Path>,
        device: Device,
        kind: Option<Kind>,
    ) -> Result<Generator, GenerateError> {
        let weights = classify(model_dir)?;
        let (tokenizer, tokenizer_dir) = match tokenizer {
            Some(path) => tokenizer_at(path)?,
            None => find_tokenizer(model_dir, &weights)?,
        };
        if let Some(a) = adapter {
            if !a.join("adapter_config.json").is_file() {
                return Err(usage(format!(
                    "--adapter {}: no adapter_config.json there; pass a PEFT LoRA adapter \
                     directory (a LoRA run's final/)",
                    a.display()
                )));
            }
        }
        let loading = format!("loading {}", model_dir.display());
        let (model, params) = match &weights {
            Weights::Hf(dir) => {
                let (base, hf) =
                    HfWeights::open(dir).map_err(|e| GenerateError::model(&loading)(e.into()))?;
                let kind = kind.or(hf.declared_kind).unwrap_or(Kind::Float);
                with_adapter(base.config(), &hf, adapter, kind, device)?
            }
            Weights::Checkpoint { dir, .. } => {
                let config = crate::model::read_model_config(dir)
                    .map_err(|e| GenerateError::model(&loading)(e.into()))?;
                let base =
                    CausalLm::new(&config).map_err(|e| GenerateError::model(&loading)(e.into()))?;
                let files = CheckpointFiles::open(dir, &base).map_err(|e| match e {
                    TrainError::Model(ModelError::MissingTensor { name, .. }) => usage(format!(
                        "{}: the checkpoint has no `{name}`: a LoRA run's checkpoints hold only \
                         the adapter; generate from the run's final/ (the adapter) over its \
                         base: `flotilla generate BASE --adapter RUN/final`",
                        dir.display()
                    )),
                    e => GenerateError::model(&loading)(e),
                })?;
                let kind = kind.unwrap_or(Kind::Float);
                files
                    .with_sources(&base, |source, _| {
                        Ok(with_adapter(&config, source, adapter, kind, device))
                    })
                    .map_err(GenerateError::model(&loading))??
            }
        };
        let config_dirs: Vec<&Path> = match &weights {
            Weights::Hf(dir) => vec![dir],
            Weights::Checkpoint { dir, .. } => vec![dir],
        };
        let eos_ids = eos_ids(&config_dirs, &tokenizer);
        Ok(Generator {
            model,
            params,
            tokenizer,
            tokenizer_dir,
            eos_ids,
            device,
        })
    }
}

/// The model of `config` with the adapter of `adapter` (if any) over the weights of
/// `source`, materialized on `device` in `kind`.
fn with_adapter(
    config: &ModelConfig,
    source: &dyn TensorSource,
    adapter: Option<&Path>,
    kind: Kind,
    device: Device,
) -> Result<(CausalLm, Params), GenerateError> {
    let Some(dir) = adapter else {
        let model =
            CausalLm::new(config).map_err(|e| GenerateError::model("the model")(e.into()))?;
        let params = materialize(&model, source, kind, kind, device)
            .map_err(GenerateError::model("reading the weights"))?;
        return Ok((model, params));
    };
    let context = format!("applying the adapter {}", dir.display());
    let lora = peft::adapter_settings(dir, config).map_err(GenerateError::model(&context))?;
    let model = CausalLm::with_lora(config, Some(&lora))
        .map_err(|e| GenerateError::model(&context)(e.into()))?;
    let peft =
        peft::PeftAdapter::open(dir, &model, &lora).map_err(GenerateError::model(&context))?;
    let overlay = Overlay {
        names: peft.names().clone(),
        over: &peft,
        base: source,
    };
    let params = materialize(&model, &overlay, kind, kind, device)
        .map_err(GenerateError::model(&context))?;
    Ok((model, params))
}

/// How the next token is chosen.
#[derive(Clone, Debug)]
pub enum Decoding {
    /// The most likely token (the first of equals, as `argmax` picks).
    Greedy,
    /// A draw from the distribution after transformers' warpers, in their order: temperature,
    /// top-k, top-p.
    Sample {
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        rng: SplitMix64,
    },
}

impl Decoding {
    /// The decoding `--temperature`, `--top-k`, `--top-p` and `--seed` ask for (checked).
    pub fn from_args(
        temperature: Option<f64>,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
    ) -> Result<Decoding, GenerateError> {
        let t = temperature.unwrap_or(0.0);
        if !t.is_finite() || t < 0.0 {
            return Err(usage(format!(
                "--temperature {t}: must be 0 (greedy) or positive"
            )));
        }
        if let Some(p) = top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(usage(format!(
                    "--top-p {p}: must be in (0, 1], e.g. --top-p 0.9"
                )));
            }
        }
        if top_k == Some(0) {
            return Err(usage("--top-k 0: must be at least 1, e.g. --top-k 50"));
        }
        if t == 0.0 {
            if top_k.is_some() || top_p.is_some() {
                return Err(usage(
                    "--top-k and --top-p shape sampling, which needs a --temperature above 0 \
                     (e.g. --temperature 0.8); without one decoding is greedy",
                ));
            }
            return Ok(Decoding::Greedy);
        }
        Ok(Decoding::Sample {
            temperature: t,
            top_k,
            top_p,
            rng: SplitMix64::new(seed),
        })
    }

    /// The next token from the logits `[vocab]` of the last position.
    pub fn next(&mut self, logits: &Tensor) -> Result<i64, TrainError> {
        match self {
            Decoding::Greedy => Ok(logits.f_argmax(-1, false)?.f_int64_value(&[])?),
            Decoding::Sample {
                temperature,
                top_k,
                top_p,
                rng,
            } => {
                let scores: Vec<f32> =
                    Vec::<f32>::try_from(logits.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?)?;
                let probs = warped_probs(&scores, *temperature, *top_k, *top_p);
                Ok(draw(&probs, rng) as i64)
            }
        }
    }
}

/// The sampling distribution transformers' warpers make of `scores`: divided by the
/// temperature (unless 1); only scores at least the k-th largest kept (`TopKLogitsWarper`);
/// the smallest scores whose probabilities sum to at most `1 - top_p` removed, the most likely
/// always kept (`TopPLogitsWarper`); then the softmax (removed tokens have probability 0).
pub fn warped_probs(
    scores: &[f32],
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
) -> Vec<f64> {
    let mut s: Vec<f64> = scores.iter().map(|&x| f64::from(x)).collect();
    if temperature != 1.0 {
        for x in &mut s {
            *x /= temperature;
        }
    }
    if let Some(k) = top_k.filter(|&k| k < s.len()) {
        let mut sorted = s.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        for x in &mut s {
            if *x < kth {
                *x = f64::NEG_INFINITY;
            }
        }
    }
    if let Some(p) = top_p.filter(|&p| p < 1.0) {
        let probs = softmax(&s);
        let mut order: Vec<usize> = (0..s.len()).collect();
        // Ascending, as transformers sorts; a stable sort keeps equal scores in index order.
        order.sort_by(|&a, &b| s[a].total_cmp(&s[b]));
        let mut cumulative = 0.0;
        let last = order.len() - 1;
        for (rank, &i) in order.iter().enumerate() {
            cumulative += probs[i];
            if cumulative <= 1.0 - p && rank < last {
                s[i] = f64::NEG_INFINITY;
            }
        }
    }
    softmax(&s)
}

fn softmax(s: &[f64]) -> Vec<f64> {
    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|&x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// A draw from `probs` with one uniform number of `rng` (53 bits).
fn draw(probs: &[f64], rng: &mut SplitMix64) -> usize {
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut cumulative = 0.0;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cumulative += p;
            last = i;
            if u < cumulative {
                return i;
            }
        }
    }
    last // rounding left u above the total
}

/// What one generation produced.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_ids: Vec<i64>,
    /// The new tokens, the end-of-sequence token included when generation stopped at one.
    pub output_ids: Vec<i64>,
    /// Seconds of the prompt's forward (to the first new token).
    pub prefill_s: f64,
    /// Seconds of the steps after the first new token.
    pub decode_s: f64,
}

impl Generation {
    /// Tokens per second of the decode phase (the tokens after the first); `None` when there
    /// was no decode step.
    pub fn tokens_per_s(&self) -> Option<f64> {
        let steps = self.output_ids.len().saturating_sub(1);
        (steps > 0 && self.decode_s > 0.0).then(|| steps as f64 / self.decode_s)
    }
}

impl Generator {
    /// How many tokens may follow a prompt of `prompt_len`: `max_new_tokens`, bounded by the
    /// model's positions.
    pub fn budget(&self, prompt_len: usize, max_new_tokens: usize) -> Result<usize, GenerateError> {
        let max_positions = self.model.config().max_position_embeddings;
        if prompt_len == 0 {
            return Err(usage(
                "the prompt is empty (the tokenizer adds no token to it): give some text",
            ));
        }
        if prompt_len >= max_positions {
            return Err(GenerateError::PromptTooLong {
                prompt: prompt_len,
                max_positions,
            });
        }
        Ok(max_new_tokens.min(max_positions - prompt_len))
    }

    /// Generates up to `max_new_tokens` after `prompt` (see [`Generator::budget`]), stopping
    /// after an end-of-sequence id; `on_token` sees each new token as it comes.
    pub fn generate(
        &self,
        prompt: &[i64],
        max_new_tokens: usize,
        decoding: &mut Decoding,
        mut on_token: impl FnMut(&[i64]),
    ) -> Result<Generation, GenerateError> {
        let vocab = self.model.config().vocab_size as i64;
        if let Some(&bad) = prompt.iter().find(|&&id| id < 0 || id >= vocab) {
            return Err(usage(format!(
                "the prompt has token id {bad}, beyond the model's vocab_size {vocab}: the \
                 tokenizer does not belong to this model (pass the right one with --tokenizer)"
            )));
        }
        let budget = self.budget(prompt.len(), max_new_tokens)?;
        let mut out = Vec::with_capacity(budget);
        if budget == 0 {
            return Ok(Generation {
                prompt_ids: prompt.to_vec(),
                output_ids: out,
                prefill_s: 0.0,
                decode_s: 0.0,
            });
        }
        let mut cache = KvCache::new(&self.model, prompt.len() + budget);
        let _guard = tch::no_grad_guard();
        let step = |ids: &[i64], cache: &mut KvCache, decoding: &mut Decoding, phase: &str| {
            crate::error::torch_guard::guarded(|| {
                let x = Tensor::f_from_slice(ids)?
                    .f_reshape([1, ids.len() as i64])?
                    .f_to_device(self.device)?;
                let logits = self.model.forward_cached(&self.params, &x, cache)?;
                decoding.next(&logits.f_select(0, 0)?)
            })
            .map_err(|e| match e {
                TrainError::Libtorch {
                    out_of_memory,
                    message,
                    ..
                } => GenerateError::Libtorch {
                    phase: phase.to_string(),
                    message,
                    out_of_memory,
                },
                e => GenerateError::model(phase)(e),
            })
        };
        let start = Instant::now();
        let first = step(prompt, &mut cache, decoding, "the prompt's forward")?;
        let prefill_s = start.elapsed().as_secs_f64();
        out.push(first);
        on_token(&out);
        let start = Instant::now();
        while out.len() < budget && !self.eos_ids.contains(out.last().expect("one token")) {
            let last = [*out.last().expect("one token")];
            let phase = format!("generating token {}", out.len() + 1);
            let next = step(&last, &mut cache, decoding, &phase)?;
            out.push(next);
            on_token(&out);
        }
        let decode_s = start.elapsed().as_secs_f64();
        Ok(Generation {
            prompt_ids: prompt.to_vec(),
            output_ids: out,
            prefill_s,
            decode_s,
        })
    }

    /// The text of generated ids, special tokens left out.
    pub fn text(&self, ids: &[i64]) -> Result<String, GenerateError> {
        let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        Ok(self.tokenizer.decode(&ids, true)?)
    }
}

/// `flotilla generate`: loads the model, generates, prints (text: the new text on stdout as it
/// comes and the timings on stderr; json: one object on stdout).
pub fn run(args: &GenerateArgs) -> Result<(), GenerateError> {
    let device = args.device.resolve()?;
    crate::cuda::bind(device).map_err(GenerateError::Usage)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let mut decoding = Decoding::from_args(args.temperature, args.top_k, args.top_p, seed)?;
    if matches!(decoding, Decoding::Sample { .. }) && args.seed.is_none() {
        eprintln!("sampling with --seed {seed}");
    }
    // Read the messages before loading the model: a bad file fails fast.
    let messages = args.messages.as_deref().map(read_messages).transpose()?;
    let generator = Generator::load(
        &args.model_dir,
        args.adapter.as_deref(),
        args.tokenizer.as_deref(),
        device,
        args.dtype,
    )?;
    let prompt = match (&messages, &args.prompt) {
        (Some(m), _) => chat_ids(&generator.tokenizer, generator.tokenizer_dir.as_deref(), m)?,
        (None, Some(text)) => prompt_ids(&generator.tokenizer, text)?,
        (None, None) => return Err(usage("give --prompt TEXT or --messages FILE")),
    };
    let stream = args.format == OutputFormat::Text;
    let mut printed = String::new();
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let max_new_tokens = args.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
    let budget = generator.budget(prompt.len(), max_new_tokens)?;
    if args.max_new_tokens.is_some() && budget < max_new_tokens {
        tracing::warn!(
            "generating at most {budget} tokens, not {max_new_tokens}: the {}-token prompt \
             leaves {budget} of the model's {} positions",
            prompt.len(),
            generator.model.config().max_position_embeddings
        );
    }
    let generation = generator.generate(&prompt, budget, &mut decoding, |ids| {
        if !stream || write_error.is_some() {
            return;
        }
        // Print what decoding all the new ids adds to what is printed, once it is whole
        // (a byte-level token may end inside a character).
        let Ok(text) = generator.text(ids) else {
            return;
        };
        if let Some(new) = text.strip_prefix(printed.as_str()) {
            if !new.is_empty() && !new.ends_with('\u{FFFD}') {
                if let Err(e) = stdout
                    .write_all(new.as_bytes())
                    .and_then(|_| stdout.flush())
                {
                    write_error = Some(e);
                }
                printed = text;
            }
        }
    })?;
    if let Some(e) = write_error {
        return Err(GenerateError::Output(e));
    }
    let text = generator.text(&generation.output_ids)?;
    match args.format {
        OutputFormat::Text => {
            let rest = text.strip_prefix(printed.as_str()).unwrap_or("");
            writeln!(stdout, "{rest}").map_err(GenerateError::Output)?;
            let stop = match generation.output_ids.last() {
                Some(id) if generator.eos_ids.contains(id) => "end of sequence",
                _ => "token limit",
            };
            eprintln!(
                "{} prompt tokens, prefill {:.1} ms; {} new tokens ({stop}), decode {}",
                generation.prompt_ids.len(),
                generation.prefill_s * 1e3,
                generation.output_ids.len(),
                match generation.tokens_per_s() {
                    Some(r) => format!("{r:.1} tokens/s"),
                    None => "— (one token, from the prefill)".into(),
                }
            );
        }
        OutputFormat::Json => {
            let value = serde_json::json!({
                "prompt_ids": generation.prompt_ids,
                "output_ids": generation.output_ids,
                "text": text,
                "tokens_per_s": generation.tokens_per_s(),
            });
            writeln!(stdout, "{value}").map_err(GenerateError::Output)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_name_the_fix() {
        assert_eq!(parse_device("cpu"), Ok(DeviceChoice::Cpu));
        assert_eq!(parse_device("cuda"), Ok(DeviceChoice::Cuda(0)));
        assert_eq!(parse_device("cuda:3"), Ok(DeviceChoice::Cuda(3)));
        assert_eq!(parse_device("auto"), Ok(DeviceChoice::Auto));
        let err = parse_device("tpu").unwrap_err();
        assert!(err.contains("`tpu`") && err.contains("cuda:N"), "{err}");
        assert!(parse_device("cuda:x").is_err());
        if crate::cuda::device_count() == 0 {
            let err = DeviceChoice::Cuda(0).resolve().unwrap_err().to_string();
            assert!(
                err.contains("no CUDA GPU") && err.contains("--device cpu"),
                "{err}"
            );
        }
    }

    #[test]
    fn warpers_follow_transformers() {
        let scores = [1.0f32, 3.0, 2.0, 0.0];
        // Temperature only: a softmax of scores / T.
        let p = warped_probs(&scores, 2.0, None, None);
        let e: Vec<f64> = scores.iter().map(|&s| (f64::from(s) / 2.0).exp()).collect();
        let z: f64 = e.iter().sum();
        for (a, b) in p.iter().zip(&e) {
            assert!((a - b / z).abs() < 1e-12);
        }
        // Top-2: only ids 1 and 2 remain.
        let p = warped_probs(&scores, 1.0, Some(2), None);
        assert_eq!((p[0], p[3]), (0.0, 0.0));
        assert!((p[1] / p[2] - 1f64.exp()).abs() < 1e-12);
        // Top-p 0.6: id 1 alone has 0.64 of the mass, so it is all that is kept.
        let p = warped_probs(&scores, 1.0, None, Some(0.6));
        assert_eq!(p, vec![0.0, 1.0, 0.0, 0.0]);
        // Top-p 0.9: ids 1 and 2 (0.64 + 0.24 = 0.88 < 0.9) and id 0 (0.09) are needed.
        let p = warped_probs(&scores, 1.0, None, Some(0.9));
        assert!(p[0] > 0.0 && p[3] == 0.0, "{p:?}");
        // Ties at the k-th score are kept, as `scores < kth` removes only smaller ones.
        let p = warped_probs(&[1.0, 1.0, 0.0], 1.0, Some(1), None);
        assert_eq!(p, vec![0.5, 0.5, 0.0]);
    }

    #[test]
    fn sampling_is_reproducible_and_follows_the_distribution() {
        let probs = [0.1, 0.0, 0.6, 0.3];
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        let mut counts = [0usize; 4];
        for _ in 0..20_000 {
            let i = draw(&probs, &mut a);
            assert_eq!(i, draw(&probs, &mut b));
            counts[i] += 1;
        }
        assert_eq!(counts[1], 0);
        for (c, p) in counts.iter().zip(probs) {
            assert!((*c as f64 / 20_000.0 - p).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn bad_decoding_arguments_name_the_fix() {
        let err = |t, k, p| Decoding::from_args(t, k, p, 0).unwrap_err().to_string();
        assert!(err(Some(-1.0), None, None).contains("--temperature -1"));
        assert!(err(Some(1.0), None, Some(1.5)).contains("--top-p 1.5"));
        assert!(err(Some(1.0), Some(0), None).contains("--top-k 0"));
        assert!(err(None, Some(5), None).contains("needs a --temperature"));
        assert!(matches!(
            Decoding::from_args(Some(0.0), None, None, 0),
            Ok(Decoding::Greedy)
        ));
    }

    #[test]
    fn messages_files_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let list = write("list.json", r#"[{"role": "user", "content": "hi"}]"#);
        assert_eq!(read_messages(&list).unwrap()[0]["content"], "hi");
        let obj = write(
            "obj.json",
            r#"{"messages": [{"role": "user", "content": "yo"}]}"#,
        );
        assert_eq!(read_messages(&obj).unwrap()[0]["content"], "yo");
        for (name, text, expect) in [
            ("bad.json", "[{", "not valid JSON"),
            ("str.json", r#""hello""#, "expected a JSON list"),
            ("empty.json", "[]", "empty"),
            ("norole.json", r#"[{"content": "x"}]"#, "message 0"),
        ] {
            let err = read_messages(&write(name, text)).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(expect), "{err}");
        }
        let err = read_messages(&dir.join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.json: no such file"), "{err}");
    }
}
