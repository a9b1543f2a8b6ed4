//! Typed validation of the composed job config: the `seed`, `model`, `trainer` (with
//! `trainer.dist`), `data` and `compute` sections that `conf/` defines.
//!
//! [`validate`] takes the resolved job tree (the runtime `flotilla:`/`hydra:` node removed,
//! interpolations resolved) and returns a typed [`JobConfig`], or a [`SchemaError`] listing
//! every problem at once: unknown keys (with a near-miss suggestion), wrong types, values outside
//! an enum, mandatory `???` values left unset, missing keys, and the semantic checks that belong
//! to the config (head counts, batch divisibility, world size, sequence length). Each problem
//! names the dotted key, where the offending value was set, and how to fix it. Top-level keys
//! other than the five sections and `seed` are the user's own and are left alone.
//!
//! This module owns the schema; the files under `conf/` must agree with it (a test checks that
//! every shipped preset validates).

use super::node::{python_float_repr, python_repr, Dict, Node, Origin, Value};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Fewest model ids the byte-level tokenizer needs (one per byte, before special tokens).
pub const BYTE_VOCAB: usize = 256;

/// Largest `data.digits` for the built-in arithmetic data (products must fit in an `i64`).
pub const MAX_ARITHMETIC_DIGITS: usize = 9;

// ---------------------------------------------------------------------------------------------
// Problems
// ---------------------------------------------------------------------------------------------

/// What kind of problem a [`Problem`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// A key the schema does not know (or one that belongs to another `mode`/`kind`).
    UnknownKey,
    /// A required key is absent.
    MissingKey,
    /// A value of the wrong type.
    WrongType,
    /// A string outside an enum's allowed values.
    BadChoice,
    /// A mandatory value left as `???`.
    Mandatory,
    /// A well-typed value that breaks a rule: a range, or a relation with another key.
    Invalid,
}

/// One problem found by [`validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// Dotted key of the offending value (`trainer.lr`, `compute.setup[0]`).
    pub key: String,
    /// Where the offending value was set (for a missing key: its parent's origin).
    pub origin: Origin,
    /// The full message: key, what is wrong, where it was set, and the fix.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Every problem [`validate`] found; `Display` prints one per line.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub struct SchemaError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(&p.message)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Choice enums
// ---------------------------------------------------------------------------------------------

/// A string-valued enum with a fixed list of spellings.
trait Choice: Sized + Copy + 'static {
    const NAMES: &'static [&'static str];
    const ALL: &'static [Self];
    fn from_name(s: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == s)
            .map(|i| Self::ALL[i])
    }
}

macro_rules! choice {
    (
        $(#[$m:meta])*
        pub enum $name:ident { $( $(#[$vm:meta])* $var:ident = $s:literal ),+ $(,)? }
    ) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vm])* #[serde(rename = $s)] $var, )+
        }

        impl $name {
            /// Every value, in the order the schema lists them.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The spelling used in config files.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$var => $s, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Choice for $name {
            const NAMES: &'static [&'static str] = &[$($s),+];
            const ALL: &'static [$name] = &[$($name::$var),+];
        }

        impl FromNode for $name {
            fn expected() -> String {
                format!("one of {}", quote_list(<$name as Choice>::NAMES))
            }
            fn example() -> String {
                $name::ALL[0].as_str().to_string()
            }
            fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
                parse_choice::<$name>(node, key, cx)
            }
        }
    };
}

choice! {
    /// Learning-rate schedule after warmup.
    pub enum LrSchedule { Constant = "constant", Cosine = "cosine", Linear = "linear" }
}

choice! {
    /// Numeric precision of training (Lightning's spellings).
    pub enum Precision {
        /// Float32 weights and compute.
        Full32 = "32-true",
        /// Float32 weights, bfloat16 autocast compute.
        Bf16Mixed = "bf16-mixed",
        /// Bfloat16 weights and compute.
        Bf16True = "bf16-true",
        /// Float32 weights, float16 autocast compute with loss scaling.
        Fp16Mixed = "16-mixed",
    }
}

choice! {
    /// Where to train: `auto` picks CUDA when available.
    pub enum Device { Auto = "auto", Cpu = "cpu", Cuda = "cuda" }
}

choice! {
    /// How training is distributed (`trainer.dist.mode`).
    pub enum DistMode { None = "none", Ddp = "ddp", Fsdp = "fsdp" }
}

choice! {
    /// Collective backend: `auto` is nccl on CUDA and the CPU backend otherwise.
    pub enum Backend { Auto = "auto", Nccl = "nccl", Cpu = "cpu" }
}

choice! {
    /// FSDP sharding strategy (torch's `ShardingStrategy` names).
    pub enum ShardingStrategy {
        FullShard = "FULL_SHARD",
        ShardGradOp = "SHARD_GRAD_OP",
        HybridShard = "HYBRID_SHARD",
        NoShard = "NO_SHARD",
    }
}

choice! {
    /// FSDP unit boundaries: one unit per decoder block, or by parameter count.
    pub enum AutoWrapPolicy { Block = "block", Size = "size" }
}

choice! {
    /// FSDP backward prefetch (torch's `BackwardPrefetch` names).
    pub enum BackwardPrefetch { BackwardPre = "BACKWARD_PRE", BackwardPost = "BACKWARD_POST" }
}

choice! {
    /// A floating-point dtype for FSDP mixed precision.
    pub enum Dtype { Float32 = "float32", Bfloat16 = "bfloat16", Float16 = "float16" }
}

choice! {
    /// FSDP checkpoint layout: one consolidated file, or one shard per rank.
    pub enum StateDictType { Full = "full", Sharded = "sharded" }
}

choice! {
    /// Rotary-embedding scaling (Hugging Face `rope_scaling.rope_type`).
    pub enum RopeType { Llama3 = "llama3" }
}

choice! {
    /// Which data source `data` describes (`data.kind`).
    pub enum DataKind { Arithmetic = "arithmetic", Tokens = "tokens", Text = "text", Jsonl = "jsonl" }
}

choice! {
    /// Element type of a pre-tokenized file.
    pub enum TokenDtype { Uint16 = "uint16", Uint32 = "uint32" }
}

choice! {
    /// Where jobs run.
    pub enum Launcher { Local = "local", Slurm = "slurm" }
}

/// `trainer.resume`: `auto` (latest checkpoint of the run directory, if any), `never`, or the
/// path of a checkpoint to start from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Resume {
    Auto,
    Never,
    Path(String),
}

impl From<String> for Resume {
    fn from(s: String) -> Self {
        match s.as_str() {
            "auto" => Resume::Auto,
            "never" => Resume::Never,
            _ => Resume::Path(s),
        }
    }
}

impl From<Resume> for String {
    fn from(r: Resume) -> Self {
        match r {
            Resume::Auto => "auto".into(),
            Resume::Never => "never".into(),
            Resume::Path(p) => p,
        }
    }
}

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

impl From<TokenizerSpec> for String {
    fn from(t: TokenizerSpec) -> Self {
        match t {
            TokenizerSpec::Byte => "byte".into(),
            TokenizerSpec::Bpe => "bpe".into(),
            TokenizerSpec::File(p) => p,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------------------------

/// Declares a config section: the struct (serde, `deny_unknown_fields`), its `KEYS`, and the
/// walk that reads it from a [`Node`] collecting every problem. `field: Type => "example"` gives
/// the example value used when the key is missing or `???`.
macro_rules! section {
    (
        $(#[$m:meta])*
        pub struct $name:ident {
            $( $(#[$fm:meta])* $f:ident : $t:ty $(=> $ex:literal)? ),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$fm])* pub $f: $t, )+
        }

        impl $name {
            /// The keys this section accepts, in file order.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($f)),+];

            fn parse_fields(
                node: &Node,
                dict: &Dict,
                key: &str,
                cx: &mut Cx,
                skip: &[&str],
            ) -> Parsed<Self> {
                cx.unknown_keys(dict, key, Self::KEYS, skip);
                $( let $f = field::<$t>(node, dict, key, stringify!($f), section!(@ex $($ex)?), cx); )+
                Ok($name { $( $f: $f.ok_or(Fail::Reported)?, )+ })
            }
        }

        impl FromNode for $name {
            fn expected() -> String {
                "a dict".into()
            }
            fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
                let Value::Dict(dict) = &node.value else {
                    return Err(Fail::WrongType);
                };
                Self::parse_fields(node, dict, key, cx, &[])
            }
        }
    };
    (@ex) => { None };
    (@ex $ex:literal) => { Some($ex) };
}

/// The validated job config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobConfig {
    pub seed: i64,
    pub model: ModelConfig,
    pub trainer: TrainerConfig,
    pub data: DataConfig,
    pub compute: ComputeConfig,
}

section! {
    /// `model`: Hugging Face `LlamaConfig` field names.
    pub struct ModelConfig {
        /// Preset name, for logs and run names.
        name: String,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
        max_position_embeddings: usize,
        rms_norm_eps: f64,
        rope_theta: f64,
        /// Llama 3 rotary scaling; `None` for plain RoPE.
        rope_scaling: Option<RopeScaling>,
        tie_word_embeddings: bool,
        initializer_range: f64,
        /// Hugging Face model directory (`config.json` + `*.safetensors`) to load weights from.
        init_from: Option<String> => "/path/to/hf-model-dir",
    }
}

section! {
    /// `model.rope_scaling` (Hugging Face's `rope_scaling` dict for `rope_type: llama3`).
    pub struct RopeScaling {
        rope_type: RopeType,
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    }
}

impl ModelConfig {
    /// Per-head dimension (`hidden_size / num_attention_heads`).
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// Parameter count of the Llama architecture this config describes.
    pub fn num_parameters(&self) -> u64 {
        let h = self.hidden_size as u64;
        let kv = (self.num_key_value_heads * self.head_dim()) as u64;
        let layer = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate_size as u64 + 2 * h;
        let embeddings = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            embeddings
        };
        self.num_hidden_layers as u64 * layer + embeddings + head + h
    }
}

section! {
    /// `trainer`: optimisation, precision, evaluation, checkpointing; `trainer.dist` chooses how
    /// training is distributed.
    pub struct TrainerConfig {
        dist: DistConfig,
        max_steps: u64,
        /// Sequences per optimizer step over all ranks: micro_batch_size × world size × the
        /// number of gradient-accumulation steps.
        global_batch_size: usize,
        /// Sequences per forward/backward on one rank.
        micro_batch_size: usize,
        /// Peak learning rate (AdamW).
        lr: f64,
        /// Floor of the cosine/linear decay.
        min_lr: f64,
        /// Linear warmup steps from 0 to `lr`.
        warmup_steps: u64,
        schedule: LrSchedule,
        weight_decay: f64,
        betas: [f64; 2],
        eps: f64,
        /// Max global gradient norm; 0 disables clipping.
        grad_clip: f64,
        precision: Precision,
        device: Device,
        /// Steps between evaluations; 0 disables evaluation.
        eval_every: u64,
        /// Micro-batches per evaluation.
        eval_batches: usize,
        /// Steps between checkpoints; 0 saves only the final one.
        checkpoint_every: u64,
        /// Most recent checkpoints kept; 0 keeps all.
        keep_last_checkpoints: usize,
        resume: Resume => "auto",
        log_every: u64,
        /// Recompute each decoder block in the backward pass.
        activation_checkpointing: bool,
        seed: i64 => "1234",
    }
}

impl TrainerConfig {
    /// Gradient-accumulation steps per optimizer step for `world_size` ranks (validation
    /// guarantees an exact division).
    pub fn grad_accum_steps(&self, world_size: usize) -> usize {
        (self.global_batch_size / (self.micro_batch_size * world_size.max(1)).max(1)).max(1)
    }
}

/// `trainer.dist`, chosen by `trainer.dist.mode` (the `trainer/dist` config group).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode")]
pub enum DistConfig {
    /// One process, no process group.
    #[serde(rename = "none")]
    None,
    #[serde(rename = "ddp")]
    Ddp(DdpConfig),
    #[serde(rename = "fsdp")]
    Fsdp(FsdpConfig),
}

section! {
    /// `trainer.dist` with `mode: ddp`.
    pub struct DdpConfig {
        backend: Backend,
        /// Collective timeout in seconds.
        timeout_s: u64,
        /// Gradient bucket size (torch default 25).
        bucket_cap_mb: f64,
    }
}

section! {
    /// `trainer.dist` with `mode: fsdp`; defaults follow `torch.distributed.fsdp`.
    pub struct FsdpConfig {
        backend: Backend,
        /// Collective timeout in seconds.
        timeout_s: u64,
        sharding_strategy: ShardingStrategy,
        auto_wrap_policy: AutoWrapPolicy,
        /// Threshold of the `size` wrap policy.
        min_num_params: u64,
        /// Checkpoint-wrap each FSDP unit.
        activation_checkpointing: bool,
        limit_all_gathers: bool,
        forward_prefetch: bool,
        backward_prefetch: Option<BackwardPrefetch>,
        sync_module_states: bool,
        /// Keep sharded parameters and their gradients in CPU memory.
        cpu_offload: bool,
        /// `None`: follow `trainer.precision`.
        param_dtype: Option<Dtype>,
        /// `None`: follow `trainer.precision`.
        reduce_dtype: Option<Dtype>,
        state_dict_type: StateDictType,
    }
}

impl DistConfig {
    pub fn mode(&self) -> DistMode {
        match self {
            DistConfig::None => DistMode::None,
            DistConfig::Ddp(_) => DistMode::Ddp,
            DistConfig::Fsdp(_) => DistMode::Fsdp,
        }
    }

    /// The collective backend (`None` for `mode: none`).
    pub fn backend(&self) -> Option<Backend> {
        match self {
            DistConfig::None => None,
            DistConfig::Ddp(d) => Some(d.backend),
            DistConfig::Fsdp(f) => Some(f.backend),
        }
    }

    /// The collective timeout in seconds (`None` for `mode: none`).
    pub fn timeout_s(&self) -> Option<u64> {
        match self {
            DistConfig::None => None,
            DistConfig::Ddp(d) => Some(d.timeout_s),
            DistConfig::Fsdp(f) => Some(f.timeout_s),
        }
    }

    fn keys_of(mode: DistMode) -> &'static [&'static str] {
        match mode {
            DistMode::None => &[],
            DistMode::Ddp => DdpConfig::KEYS,
            DistMode::Fsdp => FsdpConfig::KEYS,
        }
    }
}

impl FromNode for DistConfig {
    fn expected() -> String {
        "a dict".into()
    }
    fn example() -> String {
        "{mode: none}".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let (mode, dict, skip) =
            parse_tagged::<DistMode>(node, key, "mode", "trainer/dist", DistConfig::keys_of, cx)?;
        Ok(match mode {
            DistMode::None => {
                cx.unknown_keys(dict, key, &[], &skip);
                DistConfig::None
            }
            DistMode::Ddp => DistConfig::Ddp(DdpConfig::parse_fields(node, dict, key, cx, &skip)?),
            DistMode::Fsdp => {
                DistConfig::Fsdp(FsdpConfig::parse_fields(node, dict, key, cx, &skip)?)
            }
        })
    }
}

/// `data`, chosen by `data.kind` (the `data` config group).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum DataConfig {
    #[serde(rename = "arithmetic")]
    Arithmetic(ArithmeticData),
    #[serde(rename = "tokens")]
    Tokens(TokensData),
    #[serde(rename = "text")]
    Text(TextData),
    #[serde(rename = "jsonl")]
    Jsonl(JsonlData),
}

section! {
    /// `data` with `kind: arithmetic`: generated problems, char-level tokenizer.
    pub struct ArithmeticData {
        /// Operands have 1..=digits digits.
        digits: usize,
        num_train: usize,
        /// Held-out problems; 0: no evaluation data.
        num_eval: usize,
        /// Problem generation seed.
        seed: i64,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

section! {
    /// `data` with `kind: tokens`: a flat binary file of token ids.
    pub struct TokensData {
        path: String => "/path/to/tokens.bin",
        /// Held-out file of the same dtype; `None`: no evaluation data.
        eval_path: Option<String> => "/path/to/eval.bin",
        token_dtype: TokenDtype,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

section! {
    /// `data` with `kind: text`: plain-text files (or glob patterns), tokenized and packed.
    pub struct TextData {
        /// Files or glob patterns; a single string is taken as a one-item list.
        paths: Vec<String> => "[/path/to/a.txt,/path/to/b.txt]",
        /// Held-out files or globs; `None`: no evaluation data.
        eval_paths: Option<Vec<String>> => "[/path/to/eval.txt]",
        tokenizer: TokenizerSpec => "byte",
        /// Vocabulary of a trained `bpe` tokenizer.
        vocab_size: usize,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

section! {
    /// `data` with `kind: jsonl`: prompt/completion records.
    pub struct JsonlData {
        path: String => "/path/to/train.jsonl",
        /// Held-out records; `None`: no evaluation data.
        eval_path: Option<String> => "/path/to/eval.jsonl",
        /// `{field}` is replaced by that record field.
        prompt_template: String => "'{prompt}'",
        /// Record field appended after the rendered prompt.
        completion_key: String => "completion",
        /// Loss only on completion tokens.
        mask_prompt: bool,
        tokenizer: TokenizerSpec => "byte",
        /// Vocabulary of a trained `bpe` tokenizer.
        vocab_size: usize,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

impl DataConfig {
    pub fn kind(&self) -> DataKind {
        match self {
            DataConfig::Arithmetic(_) => DataKind::Arithmetic,
            DataConfig::Tokens(_) => DataKind::Tokens,
            DataConfig::Text(_) => DataKind::Text,
            DataConfig::Jsonl(_) => DataKind::Jsonl,
        }
    }

    pub fn seq_len(&self) -> usize {
        match self {
            DataConfig::Arithmetic(d) => d.seq_len,
            DataConfig::Tokens(d) => d.seq_len,
            DataConfig::Text(d) => d.seq_len,
            DataConfig::Jsonl(d) => d.seq_len,
        }
    }

    pub fn shuffle(&self) -> bool {
        match self {
            DataConfig::Arithmetic(d) => d.shuffle,
            DataConfig::Tokens(d) => d.shuffle,
            DataConfig::Text(d) => d.shuffle,
            DataConfig::Jsonl(d) => d.shuffle,
        }
    }

    pub fn num_workers(&self) -> usize {
        match self {
            DataConfig::Arithmetic(d) => d.num_workers,
            DataConfig::Tokens(d) => d.num_workers,
            DataConfig::Text(d) => d.num_workers,
            DataConfig::Jsonl(d) => d.num_workers,
        }
    }

    /// The tokenizer choice of `text` and `jsonl` data.
    pub fn tokenizer(&self) -> Option<&TokenizerSpec> {
        match self {
            DataConfig::Text(d) => Some(&d.tokenizer),
            DataConfig::Jsonl(d) => Some(&d.tokenizer),
            _ => None,
        }
    }

    fn keys_of(kind: DataKind) -> &'static [&'static str] {
        match kind {
            DataKind::Arithmetic => ArithmeticData::KEYS,
            DataKind::Tokens => TokensData::KEYS,
            DataKind::Text => TextData::KEYS,
            DataKind::Jsonl => JsonlData::KEYS,
        }
    }
}

impl FromNode for DataConfig {
    fn expected() -> String {
        "a dict".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let (kind, dict, skip) =
            parse_tagged::<DataKind>(node, key, "kind", "data", DataConfig::keys_of, cx)?;
        Ok(match kind {
            DataKind::Arithmetic => {
                DataConfig::Arithmetic(ArithmeticData::parse_fields(node, dict, key, cx, &skip)?)
            }
            DataKind::Tokens => {
                DataConfig::Tokens(TokensData::parse_fields(node, dict, key, cx, &skip)?)
            }
            DataKind::Text => DataConfig::Text(TextData::parse_fields(node, dict, key, cx, &skip)?),
            DataKind::Jsonl => {
                DataConfig::Jsonl(JsonlData::parse_fields(node, dict, key, cx, &skip)?)
            }
        })
    }
}

section! {
    /// `compute`: where and with what resources jobs run (submitit's parameter names).
    pub struct ComputeConfig {
        launcher: Launcher,
        nodes: usize,
        /// Processes (ranks) per node.
        tasks_per_node: usize,
        gpus_per_node: usize,
        cpus_per_task: usize,
        /// `None`: no memory request.
        mem_gb: Option<u64> => "64",
        timeout_min: u64,
        partition: Option<String> => "gpu",
        account: Option<String> => "my-account",
        qos: Option<String> => "normal",
        constraint: Option<String> => "h100",
        /// Sweeps: most SLURM array tasks running at once.
        array_parallelism: usize,
        /// Seconds before the time limit at which the job is signalled to checkpoint and requeue.
        signal_delay_s: u64,
        /// Requeues after a timeout before giving up.
        max_num_timeout: u32,
        /// Shell lines run before the job starts; a single string is one line.
        setup: Vec<String> => "[]",
        /// Extra `#SBATCH --key=value` options.
        additional_parameters: IndexMap<String, serde_json::Value> => "{}",
        /// sbatch template; `None`: `launchers/slurm.sbatch.j2`.
        template: Option<String> => "launchers/slurm.sbatch.j2",
        /// Local sweeps: jobs running at the same time.
        max_parallel: usize,
    }
}

impl ComputeConfig {
    /// Ranks per job: `nodes × tasks_per_node`.
    pub fn world_size(&self) -> usize {
        self.nodes * self.tasks_per_node
    }
}

// ---------------------------------------------------------------------------------------------
// validate
// ---------------------------------------------------------------------------------------------

/// Checks the resolved job config tree and returns it typed, or every problem found.
pub fn validate(job: &Node) -> Result<JobConfig, SchemaError> {
    let mut cx = Cx::default();
    let Value::Dict(root) = &job.value else {
        cx.push(
            ProblemKind::WrongType,
            "",
            &job.origin,
            format!(
                "the job config must be a dict, got {}{}",
                show(&job.value),
                set_note(&job.origin)
            ),
        );
        return Err(SchemaError {
            problems: cx.problems,
        });
    };

    let seed = top::<i64>(
        job,
        root,
        "seed",
        "1234",
        "add it, e.g. +seed=1234",
        &mut cx,
    );
    let model = top::<ModelConfig>(
        job,
        root,
        "model",
        "tiny",
        "select a preset in the defaults list (- model: tiny) or with model=tiny",
        &mut cx,
    );
    let trainer = top::<TrainerConfig>(
        job,
        root,
        "trainer",
        "default",
        "select it in the defaults list (- trainer: default) or with trainer=default",
        &mut cx,
    );
    let data = top::<DataConfig>(
        job,
        root,
        "data",
        "arithmetic",
        "select a source in the defaults list (- data: arithmetic) or with data=arithmetic",
        &mut cx,
    );
    let compute = top::<ComputeConfig>(
        job,
        root,
        "compute",
        "local",
        "select one in the defaults list (- compute: local) or with compute=local",
        &mut cx,
    );

    let mut ck = Check { job, cx: &mut cx };
    if let Some(m) = &model {
        ck.model(m);
    }
    if let Some(t) = &trainer {
        ck.trainer(t, compute.as_ref());
    }
    if let Some(d) = &data {
        ck.data(d, model.as_ref());
    }
    if let Some(c) = &compute {
        ck.compute(c, trainer.as_ref());
    }

    match (seed, model, trainer, data, compute) {
        (Some(seed), Some(model), Some(trainer), Some(data), Some(compute))
            if cx.problems.is_empty() =>
        {
            Ok(JobConfig {
                seed,
                model,
                trainer,
                data,
                compute,
            })
        }
        _ => Err(SchemaError {
            problems: cx.problems,
        }),
    }
}

/// Reads one top-level section; `fix` says how to add it when absent.
fn top<T: FromNode>(
    job: &Node,
    root: &Dict,
    name: &str,
    example: &str,
    fix: &str,
    cx: &mut Cx,
) -> Option<T> {
    if let Some(node) = root.get(name) {
        return read::<T>(node, name, Some(example), cx);
    }
    let message = format!("{name} is missing — {fix}{}", typo_note(root, "", name));
    cx.push(ProblemKind::MissingKey, name, &job.origin, message);
    None
}

// ---------------------------------------------------------------------------------------------
// Reading nodes
// ---------------------------------------------------------------------------------------------

/// Why a value could not be read.
enum Fail {
    /// The value's type does not fit; the caller reports it with its own `expected()`.
    WrongType,
    /// The problem was already reported.
    Reported,
}

type Parsed<T> = Result<T, Fail>;

/// Reading a typed value out of a node.
trait FromNode: Sized {
    /// What the value should be, for "expected …" messages (`an integer`).
    fn expected() -> String;
    /// The same for a list of these values (`integers`).
    fn plural() -> String {
        format!("items that are each {}", Self::expected())
    }
    /// An example value, for messages about missing or `???` values.
    fn example() -> String {
        "...".into()
    }
    /// Reads a node that is not `???`.
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self>;
    /// The value of an absent key, or `None` when the key is required.
    fn absent() -> Option<Self> {
        None
    }
}

/// Reads `node` (at dotted `key`), reporting `???` and type mismatches.
fn read<T: FromNode>(node: &Node, key: &str, example: Option<&str>, cx: &mut Cx) -> Option<T> {
    if matches!(node.value, Value::Missing) {
        let example = example.map(str::to_string).unwrap_or_else(T::example);
        let note = match &node.origin {
            Origin::Unknown => String::new(),
            o @ Origin::File { .. } => format!(" (left as ??? in {o})"),
            o @ Origin::Override(_) => format!(" (set to ??? by {o})"),
        };
        let message = format!("{key} is mandatory (???) — set it, e.g. {key}={example}{note}");
        cx.push(ProblemKind::Mandatory, key, &node.origin, message);
        return None;
    }
    match T::parse(node, key, cx) {
        Ok(v) => Some(v),
        Err(Fail::WrongType) => {
            cx.wrong_type(node, key, &T::expected());
            None
        }
        Err(Fail::Reported) => None,
    }
}

/// Reads the field `name` of the dict `parent_node` (at dotted `parent`).
fn field<T: FromNode>(
    parent_node: &Node,
    dict: &Dict,
    parent: &str,
    name: &str,
    example: Option<&str>,
    cx: &mut Cx,
) -> Option<T> {
    let key = join(parent, name);
    if let Some(child) = dict.get(name) {
        return read::<T>(child, &key, example, cx);
    }
    if let Some(v) = T::absent() {
        return Some(v);
    }
    let example = example.map(str::to_string).unwrap_or_else(T::example);
    let message = format!(
        "{key} is missing{} — add it, e.g. +{key}={example}{}",
        from_note(&parent_node.origin),
        typo_note(dict, parent, name)
    );
    cx.push(ProblemKind::MissingKey, &key, &parent_node.origin, message);
    None
}

/// Reads a dict tagged by `tag` (`mode`, `kind`): the tag's value, the dict, and the keys the
/// chosen variant must not see (the tag, and keys reported as belonging to another variant).
fn parse_tagged<'n, M: Choice + FromNode + fmt::Display>(
    node: &'n Node,
    key: &str,
    tag: &'static str,
    group: &str,
    keys_of: fn(M) -> &'static [&'static str],
    cx: &mut Cx,
) -> Result<(M, &'n Dict, Vec<&'n str>), Fail> {
    let Value::Dict(dict) = &node.value else {
        return Err(Fail::WrongType);
    };
    let Some(mode) = field::<M>(node, dict, key, tag, None, cx) else {
        // Without a variant, still flag keys that no variant knows.
        let mut all: Vec<&str> = vec![tag];
        for k in M::ALL.iter().flat_map(|m| keys_of(*m)) {
            if !all.contains(k) {
                all.push(k);
            }
        }
        cx.unknown_keys(dict, key, &all, &[]);
        return Err(Fail::Reported);
    };
    let own = keys_of(mode);
    let mut skip: Vec<&str> = vec![tag];
    for (k, child) in dict {
        if k == tag || own.contains(&k.as_str()) {
            continue;
        }
        let owners: Vec<String> = M::ALL
            .iter()
            .filter(|m| keys_of(**m).contains(&k.as_str()))
            .map(|m| m.to_string())
            .collect();
        if owners.is_empty() {
            continue; // reported as an unknown key by the variant
        }
        skip.push(k.as_str());
        let full = join(key, k);
        let tag_key = join(key, tag);
        let choices: Vec<String> = owners.iter().map(|o| format!("{group}={o}")).collect();
        let message = format!(
            "unknown key '{full}' for {tag_key}={mode}{}: it only applies when {tag_key} is {}; \
             select {}, or remove it",
            set_note(&child.origin),
            alternatives(&owners, false),
            alternatives(&choices, false),
        );
        cx.push(ProblemKind::UnknownKey, &full, &child.origin, message);
    }
    Ok((mode, dict, skip))
}

fn parse_choice<C: Choice + FromNode>(node: &Node, key: &str, cx: &mut Cx) -> Parsed<C> {
    let given = match &node.value {
        Value::Str(s) => s.clone(),
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => scalar_text(&node.value),
        _ => return Err(Fail::WrongType),
    };
    if let Value::Str(s) = &node.value {
        if let Some(c) = C::from_name(s) {
            return Ok(c);
        }
    }
    let mut message = format!(
        "{key}: expected {}, got {}{}",
        C::expected(),
        show(&node.value),
        set_note(&node.origin)
    );
    let near = suggest(&given, C::NAMES);
    if !near.is_empty() {
        message.push_str(&format!("; did you mean {}?", alternatives(&near, true)));
    }
    cx.push(ProblemKind::BadChoice, key, &node.origin, message);
    Err(Fail::Reported)
}

impl FromNode for bool {
    fn expected() -> String {
        "a bool (true or false)".into()
    }
    fn plural() -> String {
        "bools".into()
    }
    fn example() -> String {
        "true".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Bool(b) => Ok(b),
            _ => Err(Fail::WrongType),
        }
    }
}

impl FromNode for i64 {
    fn expected() -> String {
        "an integer".into()
    }
    fn plural() -> String {
        "integers".into()
    }
    fn example() -> String {
        "1".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Int(i) => Ok(i),
            _ => Err(Fail::WrongType),
        }
    }
}

macro_rules! unsigned {
    ($($t:ty),+) => {$(
        impl FromNode for $t {
            fn expected() -> String {
                "an integer".into()
            }
            fn plural() -> String {
                "integers".into()
            }
            fn example() -> String {
                "1".into()
            }
            fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
                let Value::Int(i) = node.value else {
                    return Err(Fail::WrongType);
                };
                <$t>::try_from(i).map_err(|_| {
                    let message = format!(
                        "{key}: expected a non-negative integer, got {}{}; set it to 0 or more",
                        show(&node.value),
                        set_note(&node.origin)
                    );
                    cx.push(ProblemKind::Invalid, key, &node.origin, message);
                    Fail::Reported
                })
            }
        }
    )+};
}

unsigned!(u32, u64, usize);

impl FromNode for f64 {
    fn expected() -> String {
        "a number".into()
    }
    fn plural() -> String {
        "numbers".into()
    }
    fn example() -> String {
        "0.1".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match node.value {
            Value::Int(i) => Ok(i as f64),
            Value::Float(f) => Ok(f),
            _ => Err(Fail::WrongType),
        }
    }
}

impl FromNode for String {
    fn expected() -> String {
        "a string".into()
    }
    fn plural() -> String {
        "strings".into()
    }
    fn example() -> String {
        "...".into()
    }
    /// Numbers are taken as their text, as OmegaConf's string nodes do.
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Str(s) => Ok(s.clone()),
            Value::Int(_) | Value::Float(_) => Ok(scalar_text(&node.value)),
            _ => Err(Fail::WrongType),
        }
    }
}

impl<T: FromNode> FromNode for Option<T> {
    fn expected() -> String {
        format!("{} or null", T::expected())
    }
    fn example() -> String {
        T::example()
    }
    /// Python's `None` written as a string gets a hint to write `null`.
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Null => Ok(None),
            Value::Str(s) if matches!(s.as_str(), "None" | "none" | "Null" | "NULL") => {
                let mut scratch = Cx::default();
                if let Ok(v) = T::parse(node, key, &mut scratch) {
                    return Ok(Some(v));
                }
                let message = format!(
                    "{key}: expected {}, got str '{s}'{}; write null for no value",
                    Self::expected(),
                    set_note(&node.origin)
                );
                cx.push(ProblemKind::BadChoice, key, &node.origin, message);
                Err(Fail::Reported)
            }
            _ => T::parse(node, key, cx).map(Some),
        }
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}

/// A list; a single non-list value is taken as a one-item list.
impl<T: FromNode> FromNode for Vec<T> {
    fn expected() -> String {
        format!("a list of {}", T::plural())
    }
    fn example() -> String {
        format!("[{}]", T::example())
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::List(items) => {
                let read: Vec<Option<T>> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| read::<T>(item, &format!("{key}[{i}]"), None, cx))
                    .collect();
                read.into_iter()
                    .collect::<Option<Vec<T>>>()
                    .ok_or(Fail::Reported)
            }
            Value::Dict(_) | Value::Null => Err(Fail::WrongType),
            _ => T::parse(node, key, cx).map(|v| vec![v]),
        }
    }
}

impl FromNode for [f64; 2] {
    fn expected() -> String {
        "a list of 2 numbers".into()
    }
    fn example() -> String {
        "[0.9,0.95]".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::List(items) if items.len() == 2 => {
                let a = read::<f64>(&items[0], &format!("{key}[0]"), None, cx);
                let b = read::<f64>(&items[1], &format!("{key}[1]"), None, cx);
                Ok([a.ok_or(Fail::Reported)?, b.ok_or(Fail::Reported)?])
            }
            _ => Err(Fail::WrongType),
        }
    }
}

impl<T: FromNode> FromNode for IndexMap<String, T> {
    fn expected() -> String {
        format!("a dict of {}", T::plural())
    }
    fn example() -> String {
        "{}".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let Value::Dict(dict) = &node.value else {
            return Err(Fail::WrongType);
        };
        let mut out = IndexMap::new();
        let mut ok = true;
        for (k, child) in dict {
            match read::<T>(child, &join(key, k), None, cx) {
                Some(v) => {
                    out.insert(k.clone(), v);
                }
                None => ok = false,
            }
        }
        if ok {
            Ok(out)
        } else {
            Err(Fail::Reported)
        }
    }
}

/// A scalar (for `compute.additional_parameters`).
impl FromNode for serde_json::Value {
    fn expected() -> String {
        "a scalar (string, number, bool or null)".into()
    }
    fn plural() -> String {
        "scalars (strings, numbers, bools or nulls)".into()
    }
    fn parse(node: &Node, _: &str, _: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Null | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Str(_) => {
                Ok(super::node::to_json(node))
            }
            _ => Err(Fail::WrongType),
        }
    }
}

impl FromNode for Resume {
    fn expected() -> String {
        "'auto', 'never' or a checkpoint path".into()
    }
    fn example() -> String {
        "auto".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        match &node.value {
            Value::Str(s) if !s.is_empty() => Ok(Resume::from(s.clone())),
            Value::Str(_) => {
                let message = format!(
                    "{key}: expected {}, got an empty string{}",
                    Self::expected(),
                    set_note(&node.origin)
                );
                cx.push(ProblemKind::BadChoice, key, &node.origin, message);
                Err(Fail::Reported)
            }
            _ => Err(Fail::WrongType),
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

// ---------------------------------------------------------------------------------------------
// Collecting problems
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Cx {
    problems: Vec<Problem>,
}

impl Cx {
    fn push(&mut self, kind: ProblemKind, key: &str, origin: &Origin, message: String) {
        self.problems.push(Problem {
            kind,
            key: key.to_string(),
            origin: origin.clone(),
            message,
        });
    }

    fn wrong_type(&mut self, node: &Node, key: &str, expected: &str) {
        let message = format!(
            "{key}: expected {expected}, got {}{}",
            show(&node.value),
            set_note(&node.origin)
        );
        self.push(ProblemKind::WrongType, key, &node.origin, message);
    }

    /// Reports the keys of `dict` (at dotted `parent`) outside `known` and `skip`.
    fn unknown_keys(&mut self, dict: &Dict, parent: &str, known: &[&str], skip: &[&str]) {
        for (k, child) in dict {
            if known.contains(&k.as_str()) || skip.contains(&k.as_str()) {
                continue;
            }
            let key = join(parent, k);
            let near: Vec<String> = suggest(k, known)
                .into_iter()
                .map(|c| join(parent, c))
                .collect();
            let hint = if !near.is_empty() {
                format!("did you mean {}?", alternatives(&near, true))
            } else if known.is_empty() {
                format!("'{parent}' takes no other keys here; remove it")
            } else {
                format!("remove it ('{parent}' accepts {})", known.join(", "))
            };
            let message = format!("unknown key '{key}'{}; {hint}", set_note(&child.origin));
            self.push(ProblemKind::UnknownKey, &key, &child.origin, message);
        }
    }
}

/// Semantic checks on typed sections; origins are looked up in the tree by key.
struct Check<'a> {
    job: &'a Node,
    cx: &'a mut Cx,
}

impl Check<'_> {
    fn invalid(&mut self, key: &str, problem: String, fix: String) {
        let origin = self
            .job
            .select(key)
            .map(|n| n.origin.clone())
            .unwrap_or_default();
        let message = format!("{key}: {problem}{}; {fix}", set_note(&origin));
        self.cx.push(ProblemKind::Invalid, key, &origin, message);
    }

    fn at_least(&mut self, key: &str, value: u64, min: u64) -> bool {
        if value < min {
            self.invalid(
                key,
                format!("must be at least {min}, got {value}"),
                format!("set {key}={min} or more"),
            );
            return false;
        }
        true
    }

    fn positive(&mut self, key: &str, value: f64) -> bool {
        if !(value.is_finite() && value > 0.0) {
            self.invalid(
                key,
                format!(
                    "must be a positive number, got {}",
                    python_float_repr(value)
                ),
                format!("set {key} to a number above 0"),
            );
            return false;
        }
        true
    }

    fn non_negative(&mut self, key: &str, value: f64) -> bool {
        if !(value.is_finite() && value >= 0.0) {
            self.invalid(
                key,
                format!("must be 0 or more, got {}", python_float_repr(value)),
                format!("set {key} to a number ≥ 0"),
            );
            return false;
        }
        true
    }

    fn model(&mut self, m: &ModelConfig) {
        let sizes = [
            ("model.vocab_size", m.vocab_size),
            ("model.hidden_size", m.hidden_size),
            ("model.intermediate_size", m.intermediate_size),
            ("model.num_hidden_layers", m.num_hidden_layers),
            ("model.num_attention_heads", m.num_attention_heads),
            ("model.num_key_value_heads", m.num_key_value_heads),
            ("model.max_position_embeddings", m.max_position_embeddings),
        ];
        let mut all_positive = true;
        for (key, v) in sizes {
            all_positive &= self.at_least(key, v as u64, 1);
        }
        self.positive("model.rms_norm_eps", m.rms_norm_eps);
        self.positive("model.rope_theta", m.rope_theta);
        self.positive("model.initializer_range", m.initializer_range);
        if let Some(r) = &m.rope_scaling {
            if r.factor.is_nan() || r.factor < 1.0 {
                self.invalid(
                    "model.rope_scaling.factor",
                    format!("must be at least 1, got {}", python_float_repr(r.factor)),
                    "set model.rope_scaling.factor=1.0 or more (Llama 3.1 uses 8.0)".into(),
                );
            }
            if self.positive("model.rope_scaling.low_freq_factor", r.low_freq_factor)
                && r.high_freq_factor.partial_cmp(&r.low_freq_factor)
                    != Some(std::cmp::Ordering::Greater)
            {
                self.invalid(
                    "model.rope_scaling.high_freq_factor",
                    format!(
                        "{} must be above model.rope_scaling.low_freq_factor ({})",
                        python_float_repr(r.high_freq_factor),
                        python_float_repr(r.low_freq_factor)
                    ),
                    "raise it (Llama 3 uses low 1.0, high 4.0)".into(),
                );
            }
            self.at_least(
                "model.rope_scaling.original_max_position_embeddings",
                r.original_max_position_embeddings as u64,
                1,
            );
        }
        if !all_positive {
            return;
        }
        let heads = m.num_attention_heads;
        if m.hidden_size % heads != 0 {
            self.invalid(
                "model.hidden_size",
                format!(
                    "{} is not divisible by model.num_attention_heads ({heads})",
                    m.hidden_size
                ),
                format!(
                    "use a multiple of {heads}, e.g. model.hidden_size={}, or change \
                     model.num_attention_heads",
                    nearest_multiple(m.hidden_size, heads)
                ),
            );
        } else if m.head_dim() % 2 != 0 {
            self.invalid(
                "model.hidden_size",
                format!(
                    "gives an odd head dimension {} (model.hidden_size / \
                     model.num_attention_heads = {} / {heads}); rotary embeddings need it even",
                    m.head_dim(),
                    m.hidden_size
                ),
                format!(
                    "use a multiple of {}, e.g. model.hidden_size={}",
                    2 * heads,
                    nearest_multiple(m.hidden_size, 2 * heads)
                ),
            );
        }
        let kv = m.num_key_value_heads;
        if heads % kv != 0 {
            let divisors: Vec<String> = (1..=heads)
                .filter(|d| heads % d == 0)
                .map(|d| d.to_string())
                .collect();
            self.invalid(
                "model.num_key_value_heads",
                format!("{kv} does not divide model.num_attention_heads ({heads})"),
                format!("use one of {}", alternatives(&divisors, false)),
            );
        }
    }

    fn trainer(&mut self, t: &TrainerConfig, compute: Option<&ComputeConfig>) {
        self.at_least("trainer.max_steps", t.max_steps, 1);
        let global_ok = self.at_least("trainer.global_batch_size", t.global_batch_size as u64, 1);
        let micro_ok = self.at_least("trainer.micro_batch_size", t.micro_batch_size as u64, 1);
        self.at_least("trainer.log_every", t.log_every, 1);
        let lr_ok = self.positive("trainer.lr", t.lr);
        if self.non_negative("trainer.min_lr", t.min_lr) && lr_ok && t.min_lr > t.lr {
            self.invalid(
                "trainer.min_lr",
                format!(
                    "{} is above trainer.lr ({})",
                    python_float_repr(t.min_lr),
                    python_float_repr(t.lr)
                ),
                "set it to at most trainer.lr (often a tenth of it)".into(),
            );
        }
        // warmup_steps > max_steps is allowed: the warm-up ramp simply never completes (a
        // quick `trainer.max_steps=5` smoke run must not need a second override).
        self.non_negative("trainer.weight_decay", t.weight_decay);
        if t.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            self.invalid(
                "trainer.betas",
                format!(
                    "each beta must be in [0, 1), got [{}, {}]",
                    python_float_repr(t.betas[0]),
                    python_float_repr(t.betas[1])
                ),
                "use e.g. trainer.betas=[0.9,0.95]".into(),
            );
        }
        self.positive("trainer.eps", t.eps);
        self.non_negative("trainer.grad_clip", t.grad_clip);
        if t.eval_every > 0 && t.eval_batches == 0 {
            self.invalid(
                "trainer.eval_batches",
                format!("is 0 but trainer.eval_every is {}", t.eval_every),
                "set trainer.eval_batches=1 or more, or trainer.eval_every=0 to disable evaluation"
                    .into(),
            );
        }

        // The batch must split evenly over micro-batches and ranks.
        let world = compute
            .map(|c| c.world_size())
            .filter(|w| *w > 0)
            .unwrap_or(1);
        if global_ok && micro_ok {
            let per_step = t.micro_batch_size * world;
            if t.global_batch_size % per_step != 0 {
                let problem = if world == 1 {
                    format!(
                        "{} is not divisible by trainer.micro_batch_size ({})",
                        t.global_batch_size, t.micro_batch_size
                    )
                } else {
                    format!(
                        "{} is not divisible by trainer.micro_batch_size × world size = {} × {world} \
                         = {per_step} (world size = compute.nodes × compute.tasks_per_node)",
                        t.global_batch_size, t.micro_batch_size
                    )
                };
                self.invalid(
                    "trainer.global_batch_size",
                    problem,
                    format!(
                        "use a multiple of {per_step}, e.g. trainer.global_batch_size={}, or \
                         change trainer.micro_batch_size",
                        nearest_multiple(t.global_batch_size, per_step)
                    ),
                );
            }
        }

        match &t.dist {
            DistConfig::None => {
                if world > 1 {
                    let c = compute.expect("world > 1 comes from compute");
                    self.invalid(
                        "trainer.dist.mode",
                        format!(
                            "is none but the job starts {world} processes (compute.nodes {} × \
                             compute.tasks_per_node {})",
                            c.nodes, c.tasks_per_node
                        ),
                        "select trainer/dist=ddp or trainer/dist=fsdp, or set compute.nodes=1 \
                         compute.tasks_per_node=1"
                            .into(),
                    );
                }
            }
            DistConfig::Ddp(d) => {
                self.at_least("trainer.dist.timeout_s", d.timeout_s, 1);
                self.positive("trainer.dist.bucket_cap_mb", d.bucket_cap_mb);
            }
            DistConfig::Fsdp(f) => {
                self.at_least("trainer.dist.timeout_s", f.timeout_s, 1);
                if f.auto_wrap_policy == AutoWrapPolicy::Size {
                    self.at_least("trainer.dist.min_num_params", f.min_num_params, 1);
                }
            }
        }
        if t.dist.backend() == Some(Backend::Nccl) && t.device == Device::Cpu {
            self.invalid(
                "trainer.dist.backend",
                "nccl needs CUDA but trainer.device is cpu".into(),
                "set trainer.dist.backend=cpu (or auto), or trainer.device=cuda".into(),
            );
        }
    }

    fn data(&mut self, d: &DataConfig, model: Option<&ModelConfig>) {
        let seq_len = d.seq_len();
        if self.at_least("data.seq_len", seq_len as u64, 1) {
            if let Some(m) = model.filter(|m| m.max_position_embeddings > 0) {
                if seq_len > m.max_position_embeddings {
                    self.invalid(
                        "data.seq_len",
                        format!(
                            "{seq_len} exceeds model.max_position_embeddings ({})",
                            m.max_position_embeddings
                        ),
                        format!(
                            "set data.seq_len={} or less, or raise model.max_position_embeddings",
                            m.max_position_embeddings
                        ),
                    );
                }
            }
        }
        match d {
            DataConfig::Arithmetic(a) => {
                if a.digits == 0 || a.digits > MAX_ARITHMETIC_DIGITS {
                    self.invalid(
                        "data.digits",
                        format!(
                            "must be between 1 and {MAX_ARITHMETIC_DIGITS}, got {}",
                            a.digits
                        ),
                        "set e.g. data.digits=3".into(),
                    );
                }
                self.at_least("data.num_train", a.num_train as u64, 1);
            }
            DataConfig::Tokens(t) => {
                self.non_empty("data.path", &t.path);
            }
            DataConfig::Text(t) => {
                if t.paths.is_empty() {
                    self.invalid(
                        "data.paths",
                        "is an empty list".into(),
                        "list the text files or globs, e.g. data.paths=[/path/to/a.txt]".into(),
                    );
                }
                self.vocab(&t.tokenizer, t.vocab_size, model);
            }
            DataConfig::Jsonl(j) => {
                self.non_empty("data.path", &j.path);
                self.non_empty("data.completion_key", &j.completion_key);
                self.vocab(&j.tokenizer, j.vocab_size, model);
            }
        }
    }

    fn non_empty(&mut self, key: &str, value: &str) {
        if value.is_empty() {
            self.invalid(key, "is empty".into(), format!("set {key}"));
        }
    }

    /// The tokenizer's ids must fit the model's embedding table.
    fn vocab(&mut self, tokenizer: &TokenizerSpec, vocab_size: usize, model: Option<&ModelConfig>) {
        match tokenizer {
            TokenizerSpec::Bpe => {
                if !self.at_least("data.vocab_size", vocab_size as u64, 1) {
                    return;
                }
                if let Some(m) = model.filter(|m| vocab_size > m.vocab_size) {
                    self.invalid(
                        "data.vocab_size",
                        format!(
                            "the bpe tokenizer's {vocab_size} tokens exceed model.vocab_size ({})",
                            m.vocab_size
                        ),
                        format!(
                            "set data.vocab_size={} or less, or raise model.vocab_size",
                            m.vocab_size
                        ),
                    );
                }
            }
            TokenizerSpec::Byte => {
                if let Some(m) = model.filter(|m| m.vocab_size > 0 && m.vocab_size < BYTE_VOCAB) {
                    self.invalid(
                        "model.vocab_size",
                        format!(
                            "{} is too small for data.tokenizer=byte, which needs at least \
                             {BYTE_VOCAB} ids plus its special tokens",
                            m.vocab_size
                        ),
                        "raise model.vocab_size (e.g. model=small), or use data.tokenizer=bpe"
                            .into(),
                    );
                }
            }
            TokenizerSpec::File(_) => {}
        }
    }

    fn compute(&mut self, c: &ComputeConfig, trainer: Option<&TrainerConfig>) {
        self.at_least("compute.nodes", c.nodes as u64, 1);
        self.at_least("compute.tasks_per_node", c.tasks_per_node as u64, 1);
        self.at_least("compute.cpus_per_task", c.cpus_per_task as u64, 1);
        self.at_least("compute.timeout_min", c.timeout_min, 1);
        self.at_least("compute.array_parallelism", c.array_parallelism as u64, 1);
        self.at_least("compute.max_parallel", c.max_parallel as u64, 1);
        if let Some(mem) = c.mem_gb {
            self.at_least("compute.mem_gb", mem, 1);
        }
        let Some(t) = trainer else { return };
        if c.launcher == Launcher::Slurm && t.device == Device::Cuda && c.gpus_per_node == 0 {
            self.invalid(
                "compute.gpus_per_node",
                "is 0 but trainer.device is cuda".into(),
                "request GPUs, e.g. compute.gpus_per_node=8, or set trainer.device=cpu".into(),
            );
        }
        if c.gpus_per_node > 0
            && c.tasks_per_node > c.gpus_per_node
            && t.dist.mode() != DistMode::None
            && t.device != Device::Cpu
        {
            self.invalid(
                "compute.tasks_per_node",
                format!(
                    "{} ranks per node would share {} GPUs; each rank needs its own GPU",
                    c.tasks_per_node, c.gpus_per_node
                ),
                format!(
                    "set compute.tasks_per_node={} (or fewer), or raise compute.gpus_per_node",
                    c.gpus_per_node
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Message helpers
// ---------------------------------------------------------------------------------------------

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// ` (set in file:line)`, ` (set by override '…')`, or nothing when unknown.
fn set_note(origin: &Origin) -> String {
    match origin {
        Origin::Unknown => String::new(),
        o @ Origin::File { .. } => format!(" (set in {o})"),
        o @ Origin::Override(_) => format!(" (set by {o})"),
    }
}

/// ` (in the dict from file:line)` for a missing key's parent, or nothing.
fn from_note(origin: &Origin) -> String {
    match origin {
        Origin::Unknown => String::new(),
        o @ Origin::File { .. } => format!(" (in the dict from {o})"),
        o @ Origin::Override(_) => format!(" (in the dict set by {o})"),
    }
}

/// ` (is 'trainer.lrr' a misspelling? set in …)` when a sibling of a missing key looks like it.
fn typo_note(dict: &Dict, parent: &str, name: &str) -> String {
    dict.iter()
        .find(|(k, _)| k.as_str() != name && !near_miss(k, &[name]).is_empty())
        .map(|(k, n)| {
            format!(
                "; is '{}'{} a misspelling of it?",
                join(parent, k),
                set_note(&n.origin)
            )
        })
        .unwrap_or_default()
}

/// The text of a scalar as a user would type it.
fn scalar_text(v: &Value) -> String {
    match v {
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => s.clone(),
        other => python_repr(other),
    }
}

/// `str 'ten'`, `int 5`, `null`, `list [1, 2]`: a value with its type, for messages.
fn show(v: &Value) -> String {
    const MAX: usize = 60;
    let text = match v {
        Value::Null => return "null".into(),
        Value::Bool(b) => b.to_string(),
        other => python_repr(other),
    };
    let text = if text.chars().count() > MAX {
        format!("{}…", text.chars().take(MAX).collect::<String>())
    } else {
        text
    };
    format!("{} {text}", v.type_name())
}

/// `'a', 'b', 'c'`.
fn quote_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `a`, `a or b`, `a, b or c` (quoted when asked).
fn alternatives<S: AsRef<str>>(items: &[S], quote: bool) -> String {
    let q: Vec<String> = items
        .iter()
        .map(|s| {
            if quote {
                format!("'{}'", s.as_ref())
            } else {
                s.as_ref().to_string()
            }
        })
        .collect();
    match q.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Candidates close to `given`: a case-insensitive match, else the nearest by edit distance
/// ([`near_miss`]), else those it starts, or that share a run of `_`/`-` separated words with it
/// (`batch_size` → `global_batch_size`). At most three.
fn suggest<'a>(given: &str, candidates: &[&'a str]) -> Vec<&'a str> {
    let mut near = near_miss(given, candidates);
    if near.is_empty() && given.chars().count() >= 2 {
        let g = given.to_lowercase();
        near = candidates
            .iter()
            .filter(|c| {
                let c = c.to_lowercase();
                c.starts_with(&g) || contains_words(&c, &g) || contains_words(&g, &c)
            })
            .copied()
            .collect();
    }
    near.truncate(3);
    near
}

/// Candidates within a small edit distance of `given` (Damerau-Levenshtein: a swap of two
/// neighbours counts once; at most a third of the length, at least 1;
/// case-insensitive), the nearest ones only.
fn near_miss<'a>(given: &str, candidates: &[&'a str]) -> Vec<&'a str> {
    let g = given.to_lowercase();
    if let Some(c) = candidates.iter().find(|c| c.to_lowercase() == g) {
        return vec![c];
    }
    let mut best = usize::MAX;
    let mut near = Vec::new();
    for c in candidates {
        let cl = c.to_lowercase();
        let d = strsim::damerau_levenshtein(&g, &cl);
        let limit = (g.chars().count().max(cl.chars().count()) / 3).max(1);
        if d > limit || d > best {
            continue;
        }
        if d < best {
            best = d;
            near.clear();
        }
        near.push(*c);
    }
    near
}

/// True when the `_`/`-` separated words of `needle` occur, in a row, among those of `haystack`.
fn contains_words(haystack: &str, needle: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        s.split(['_', '-'])
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (h, n) = (words(haystack), words(needle));
    !n.is_empty() && n.len() < h.len() && h.windows(n.len()).any(|w| w == n.as_slice())
}

/// The multiple of `m` nearest to `x` (at least `m`).
fn nearest_multiple(x: usize, m: usize) -> usize {
    (((x + m / 2) / m) * m).max(m)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    /// Turns a JSON literal into a tree whose every node has `origin` (`"???"` → Missing).
    fn tree(j: &serde_json::Value, origin: &Origin) -> Node {
        use serde_json::Value as J;
        let value = match j {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap()),
            },
            J::String(s) if s == "???" => Value::Missing,
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::List(items.iter().map(|i| tree(i, origin)).collect()),
            J::Object(m) => Value::Dict(
                m.iter()
                    .map(|(k, v)| (k.clone(), tree(v, origin)))
                    .collect(),
            ),
        };
        Node::new(value, origin.clone())
    }

    fn file(path: &str, line: u32) -> Origin {
        Origin::File {
            path: Arc::from(path),
            line,
        }
    }

    fn ovr(text: &str) -> Origin {
        Origin::Override(Arc::from(text))
    }

    /// A conf file as a tree: each top-level key's subtree gets the line that key is on.
    fn conf(path: &str, text: &str) -> Node {
        let j: serde_json::Value = serde_yaml::from_str(text).unwrap();
        let mut node = tree(&j, &file(path, 0));
        if let Value::Dict(d) = &mut node.value {
            for (k, child) in d.iter_mut() {
                let line = text
                    .lines()
                    .position(|l| l.starts_with(&format!("{k}:")))
                    .map(|i| i as u32 + 1)
                    .unwrap_or(0);
                child.set_origin_deep(&file(path, line));
            }
            d.shift_remove("defaults");
        }
        node
    }

    const MODELS: &[(&str, &str)] = &[
        ("tiny", include_str!("../../../conf/model/tiny.yaml")),
        ("small", include_str!("../../../conf/model/small.yaml")),
        (
            "llama-1b",
            include_str!("../../../conf/model/llama-1b.yaml"),
        ),
        (
            "llama-8b",
            include_str!("../../../conf/model/llama-8b.yaml"),
        ),
    ];
    const DISTS: &[(&str, &str)] = &[
        ("none", include_str!("../../../conf/trainer/dist/none.yaml")),
        ("ddp", include_str!("../../../conf/trainer/dist/ddp.yaml")),
        ("fsdp", include_str!("../../../conf/trainer/dist/fsdp.yaml")),
    ];
    const DATAS: &[(&str, &str)] = &[
        (
            "arithmetic",
            include_str!("../../../conf/data/arithmetic.yaml"),
        ),
        ("tokens", include_str!("../../../conf/data/tokens.yaml")),
        ("text", include_str!("../../../conf/data/text.yaml")),
        ("jsonl", include_str!("../../../conf/data/jsonl.yaml")),
    ];
    const COMPUTES: &[(&str, &str)] = &[
        ("local", include_str!("../../../conf/compute/local.yaml")),
        ("slurm", include_str!("../../../conf/compute/slurm.yaml")),
    ];
    const TRAINER: &str = include_str!("../../../conf/trainer/default.yaml");
    const PRIMARY: &str = include_str!("../../../conf/config.yaml");

    fn pick<'a>(table: &'a [(&str, &str)], name: &str) -> &'a str {
        table.iter().find(|(n, _)| *n == name).unwrap().1
    }

    /// Composes the shipped conf files by hand (defaults order, `${seed}` resolved, the
    /// runtime node removed).
    fn compose(model: &str, dist: &str, data: &str, compute: &str) -> Node {
        let mut trainer = conf("conf/trainer/default.yaml", TRAINER);
        let mut dist_node = conf(&format!("conf/trainer/dist/{dist}.yaml"), pick(DISTS, dist));
        dist_node.origin = Origin::Unknown;
        let primary = conf("conf/config.yaml", PRIMARY);
        let seed = primary.child("seed").unwrap().clone();
        let Value::Dict(t) = &mut trainer.value else {
            unreachable!()
        };
        t.shift_insert(0, "dist".into(), dist_node);
        t.insert("seed".into(), seed.clone());
        let mut root = Dict::new();
        let m = format!("conf/model/{model}.yaml");
        let d = format!("conf/data/{data}.yaml");
        let c = format!("conf/compute/{compute}.yaml");
        root.insert("model".into(), conf(&m, pick(MODELS, model)));
        root.insert("trainer".into(), trainer);
        root.insert("data".into(), conf(&d, pick(DATAS, data)));
        root.insert("compute".into(), conf(&c, pick(COMPUTES, compute)));
        root.insert("seed".into(), seed);
        let mut job = Node::from(Value::Dict(root));
        if dist == "none" && compute == "local" {
            // The shipped local compute starts 2 ranks (for DDP); one process here.
            set(
                &mut job,
                "compute.tasks_per_node",
                json!(1),
                ovr("compute.tasks_per_node=1"),
            );
        }
        job
    }

    fn base() -> Node {
        compose("tiny", "none", "arithmetic", "local")
    }

    fn set(job: &mut Node, key: &str, value: serde_json::Value, origin: Origin) {
        let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
        let node = tree(&value, &origin);
        let parent = if parent.is_empty() {
            job
        } else {
            job.get_path_mut(&super::super::node::split_key(parent))
                .unwrap()
        };
        parent
            .value
            .as_dict_mut()
            .unwrap()
            .insert(last.into(), node);
    }

    fn remove(job: &mut Node, key: &str) {
        let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
        let parent = if parent.is_empty() {
            job
        } else {
            job.get_path_mut(&super::super::node::split_key(parent))
                .unwrap()
        };
        parent.value.as_dict_mut().unwrap().shift_remove(last);
    }

    fn problems(job: &Node) -> Vec<Problem> {
        match validate(job) {
            Ok(_) => panic!("expected problems"),
            Err(e) => e.problems,
        }
    }

    fn only(job: &Node) -> Problem {
        let p = problems(job);
        assert_eq!(p.len(), 1, "{p:#?}");
        p.into_iter().next().unwrap()
    }

    #[test]
    fn default_config_validates() {
        let cfg = validate(&base()).unwrap();
        assert_eq!(cfg.seed, 1234);
        assert_eq!(cfg.trainer.seed, 1234);
        assert_eq!(cfg.model.name, "tiny");
        assert_eq!(cfg.model.head_dim(), 32);
        assert!((700_000..1_200_000).contains(&cfg.model.num_parameters()));
        assert_eq!(cfg.trainer.dist, DistConfig::None);
        assert_eq!(cfg.trainer.precision, Precision::Full32);
        assert_eq!(cfg.trainer.schedule, LrSchedule::Cosine);
        assert_eq!(cfg.trainer.resume, Resume::Auto);
        assert_eq!(cfg.trainer.betas, [0.9, 0.95]);
        assert_eq!(cfg.trainer.grad_accum_steps(cfg.compute.world_size()), 2);
        assert_eq!(cfg.data.kind(), DataKind::Arithmetic);
        assert_eq!(cfg.compute.launcher, Launcher::Local);
        assert_eq!(cfg.compute.world_size(), 1);
    }

    #[test]
    fn every_shipped_preset_validates() {
        let mut n = 0;
        for (model, _) in MODELS {
            for (dist, _) in DISTS {
                for (data, _) in DATAS {
                    for (compute, _) in COMPUTES {
                        let mut job = compose(model, dist, data, compute);
                        // Presets that need each other: multi-rank compute needs a dist mode
                        // and a batch that splits over 8 ranks; tiny's 256 positions and 32
                        // ids only fit the arithmetic data.
                        if *compute == "slurm" && *dist == "none" {
                            continue;
                        }
                        if *model == "tiny" && *data != "arithmetic" {
                            continue;
                        }
                        if *compute == "slurm" {
                            set(&mut job, "trainer.global_batch_size", json!(128), ovr("g"));
                        }
                        match *data {
                            "tokens" => set(&mut job, "data.path", json!("/x.bin"), ovr("x")),
                            "jsonl" => set(&mut job, "data.path", json!("/x.jsonl"), ovr("x")),
                            "text" => set(&mut job, "data.paths", json!(["/a.txt"]), ovr("x")),
                            _ => {}
                        }
                        let cfg = validate(&job)
                            .unwrap_or_else(|e| panic!("{model}/{dist}/{data}/{compute}:\n{e}"));
                        assert_eq!(cfg.trainer.dist.mode().as_str(), *dist);
                        assert_eq!(cfg.data.kind().as_str(), *data);
                        // Serialize / Deserialize round-trip, and serde agrees with the walk.
                        let j = serde_json::to_value(&cfg).unwrap();
                        assert_eq!(serde_json::from_value::<JobConfig>(j).unwrap(), cfg);
                        let raw = super::super::node::to_json(&job);
                        assert_eq!(serde_json::from_value::<JobConfig>(raw).unwrap(), cfg);
                        n += 1;
                    }
                }
            }
        }
        assert_eq!(n, 96 - 16 - 18 + 3);
    }

    #[test]
    fn preset_sizes_are_the_documented_ones() {
        let params = |m: &str| {
            validate(&compose(m, "none", "arithmetic", "local"))
                .unwrap()
                .model
                .num_parameters()
        };
        assert_eq!(params("llama-1b"), 1_235_814_400);
        assert_eq!(params("llama-8b"), 8_030_261_248);
        assert!((20_000_000..30_000_000).contains(&params("small")));
    }

    #[test]
    fn unknown_key_names_origin_and_near_miss() {
        let mut job = base();
        set(
            &mut job,
            "trainer.lrr",
            json!(0.1),
            file("conf/trainer/default.yaml", 4),
        );
        let p = only(&job);
        assert_eq!(p.kind, ProblemKind::UnknownKey);
        assert_eq!(p.key, "trainer.lrr");
        assert_eq!(
            p.message,
            "unknown key 'trainer.lrr' (set in conf/trainer/default.yaml:4); did you mean \
             'trainer.lr'?"
        );
    }

    #[test]
    fn unknown_key_without_near_miss_lists_known_keys() {
        let mut job = base();
        set(
            &mut job,
            "model.flavour",
            json!("x"),
            ovr("+model.flavour=x"),
        );
        let p = only(&job);
        assert!(p.message.starts_with(
            "unknown key 'model.flavour' (set by override '+model.flavour=x'); remove it \
             ('model' accepts name, vocab_size,"
        ));
    }

    #[test]
    fn unknown_key_contained_suggests_all_candidates() {
        let mut job = base();
        set(
            &mut job,
            "trainer.batch_size",
            json!(8),
            ovr("+trainer.batch_size=8"),
        );
        let p = only(&job);
        assert!(
            p.message.ends_with(
                "did you mean 'trainer.global_batch_size' or 'trainer.micro_batch_size'?"
            ),
            "{}",
            p.message
        );
    }

    #[test]
    fn extra_top_level_keys_are_allowed() {
        let mut job = base();
        set(
            &mut job,
            "notes",
            json!({"who": "me"}),
            ovr("+notes.who=me"),
        );
        set(
            &mut job,
            "flotilla",
            json!({"run": {"dir": "x"}}),
            Origin::Unknown,
        );
        assert!(validate(&job).is_ok());
    }

    #[test]
    fn wrong_type_names_expected_type_and_override() {
        let mut job = base();
        set(
            &mut job,
            "trainer.max_steps",
            json!("ten"),
            ovr("trainer.max_steps=ten"),
        );
        let p = only(&job);
        assert_eq!(p.kind, ProblemKind::WrongType);
        assert_eq!(
            p.message,
            "trainer.max_steps: expected an integer, got str 'ten' (set by override \
             'trainer.max_steps=ten')"
        );
        assert_eq!(p.origin, ovr("trainer.max_steps=ten"));
    }

    #[test]
    fn wrong_types_of_other_shapes() {
        let mut job = base();
        set(
            &mut job,
            "trainer.lr",
            json!("fast"),
            ovr("trainer.lr=fast"),
        );
        set(
            &mut job,
            "trainer.betas",
            json!([0.9]),
            ovr("trainer.betas=[0.9]"),
        );
        set(&mut job, "model.tie_word_embeddings", json!(1), ovr("t=1"));
        set(&mut job, "compute.setup", json!({"a": 1}), ovr("s"));
        set(&mut job, "compute.partition", json!([1]), ovr("p"));
        set(
            &mut job,
            "compute.additional_parameters",
            json!({"x": [1]}),
            ovr("a"),
        );
        let msgs: Vec<String> = problems(&job).into_iter().map(|p| p.message).collect();
        let expect = [
            "trainer.lr: expected a number, got str 'fast' (set by override 'trainer.lr=fast')",
            "trainer.betas: expected a list of 2 numbers, got list [0.9]",
            "model.tie_word_embeddings: expected a bool (true or false), got int 1",
            "compute.setup: expected a list of strings, got dict {'a': 1}",
            "compute.partition: expected a string or null, got list [1]",
            "compute.additional_parameters.x: expected a scalar (string, number, bool or null)",
        ];
        assert_eq!(msgs.len(), expect.len(), "{msgs:#?}");
        for e in expect {
            assert!(msgs.iter().any(|m| m.starts_with(e)), "{e}\n{msgs:#?}");
        }
    }

    #[test]
    fn negative_count_is_out_of_range() {
        let mut job = base();
        set(
            &mut job,
            "trainer.eval_every",
            json!(-5),
            ovr("trainer.eval_every=-5"),
        );
        let p = only(&job);
        assert_eq!(p.kind, ProblemKind::Invalid);
        assert_eq!(
            p.message,
            "trainer.eval_every: expected a non-negative integer, got int -5 (set by override \
             'trainer.eval_every=-5'); set it to 0 or more"
        );
    }

    #[test]
    fn bad_enum_lists_allowed_values_and_suggests() {
        let mut job = base();
        set(
            &mut job,
            "trainer.precision",
            json!("bf16"),
            ovr("trainer.precision=bf16"),
        );
        set(
            &mut job,
            "trainer.schedule",
            json!("cosin"),
            file("conf/trainer/default.yaml", 9),
        );
        set(
            &mut job,
            "trainer.device",
            json!(32),
            ovr("trainer.device=32"),
        );
        let p = problems(&job);
        assert_eq!(p.len(), 3, "{p:#?}");
        assert!(p.iter().all(|p| p.kind == ProblemKind::BadChoice));
        // Reading order follows the file: schedule, precision, device.
        assert_eq!(
            p[0].message,
            "trainer.schedule: expected one of 'constant', 'cosine', 'linear', got str \
             'cosin' (set in conf/trainer/default.yaml:9); did you mean 'cosine'?"
        );
        assert_eq!(
            p[1].message,
            "trainer.precision: expected one of '32-true', 'bf16-mixed', 'bf16-true', \
             '16-mixed', got str 'bf16' (set by override 'trainer.precision=bf16'); did you \
             mean 'bf16-mixed' or 'bf16-true'?"
        );
        assert_eq!(
            p[2].message,
            "trainer.device: expected one of 'auto', 'cpu', 'cuda', got int 32 (set by \
             override 'trainer.device=32')"
        );
        let mut job = compose("tiny", "fsdp", "arithmetic", "local");
        set(
            &mut job,
            "trainer.dist.backward_prefetch",
            json!("None"),
            ovr("b=None"),
        );
        assert_eq!(
            only(&job).message,
            "trainer.dist.backward_prefetch: expected one of 'BACKWARD_PRE', 'BACKWARD_POST' or \
             null, got str 'None' (set by override 'b=None'); write null for no value"
        );
        // Case is significant, but suggested.
        let mut job = compose("tiny", "fsdp", "arithmetic", "local");
        set(
            &mut job,
            "trainer.dist.sharding_strategy",
            json!("full_shard"),
            ovr("s"),
        );
        assert!(only(&job).message.ends_with("did you mean 'FULL_SHARD'?"));
    }

    #[test]
    fn mandatory_value_names_the_fix() {
        let job = compose("small", "none", "tokens", "local");
        let p = only(&job);
        assert_eq!(p.kind, ProblemKind::Mandatory);
        assert_eq!(p.key, "data.path");
        assert_eq!(
            p.message,
            "data.path is mandatory (???) — set it, e.g. data.path=/path/to/tokens.bin (left \
             as ??? in conf/data/tokens.yaml:3)"
        );
        let job = compose("small", "none", "text", "local");
        assert!(only(&job).message.starts_with(
            "data.paths is mandatory (???) — set it, e.g. \
             data.paths=[/path/to/a.txt,/path/to/b.txt]"
        ));
        // A ??? inside a list, set by an override.
        let mut job = base();
        set(
            &mut job,
            "compute.setup",
            json!(["echo hi", "???"]),
            ovr("compute.setup=[echo hi,???]"),
        );
        assert_eq!(
            only(&job).message,
            "compute.setup[1] is mandatory (???) — set it, e.g. compute.setup[1]=... (set to \
             ??? by override 'compute.setup=[echo hi,???]')"
        );
    }

    #[test]
    fn missing_key_and_missing_section() {
        let mut job = base();
        remove(&mut job, "trainer.eps");
        let p = only(&job);
        assert_eq!(p.kind, ProblemKind::MissingKey);
        assert_eq!(
            p.message,
            "trainer.eps is missing (in the dict from conf/trainer/default.yaml) — add it, e.g. \
             +trainer.eps=0.1"
        );
        let mut job = base();
        let model = job
            .value
            .as_dict_mut()
            .unwrap()
            .shift_remove("model")
            .unwrap();
        job.value
            .as_dict_mut()
            .unwrap()
            .insert("modle".into(), model);
        let p = only(&job);
        assert_eq!(
            p.message,
            "model is missing — select a preset in the defaults list (- model: tiny) or with \
             model=tiny; is 'modle' (set in conf/model/tiny.yaml) a misspelling of it?"
        );
        let mut job = base();
        remove(&mut job, "trainer.dist");
        assert_eq!(
            only(&job).message,
            "trainer.dist is missing (in the dict from conf/trainer/default.yaml) — add it, e.g. \
             +trainer.dist={mode: none}"
        );
        // Optional keys may be left out.
        let mut job = base();
        remove(&mut job, "model.init_from");
        remove(&mut job, "model.rope_scaling");
        assert_eq!(validate(&job).unwrap().model.init_from, None);
    }

    #[test]
    fn all_problems_are_collected_one_per_line() {
        let mut job = base();
        set(&mut job, "trainer.lrr", json!(0.1), ovr("+trainer.lrr=0.1"));
        set(
            &mut job,
            "trainer.max_steps",
            json!("ten"),
            ovr("trainer.max_steps=ten"),
        );
        set(
            &mut job,
            "model.hidden_size",
            json!(130),
            ovr("model.hidden_size=130"),
        );
        set(
            &mut job,
            "data.seq_len",
            json!(4096),
            ovr("data.seq_len=4096"),
        );
        set(
            &mut job,
            "compute.launcher",
            json!("slurmm"),
            ovr("compute.launcher=slurmm"),
        );
        set(&mut job, "seed", json!("???"), file("conf/config.yaml", 9));
        let e = validate(&job).unwrap_err();
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        // Reading order (seed, model, trainer, data, compute), then the semantic checks.
        assert_eq!(
            keys,
            [
                "seed",
                "trainer.lrr",
                "trainer.max_steps",
                "compute.launcher",
                "model.hidden_size",
                "data.seq_len"
            ]
        );
        let text = e.to_string();
        assert_eq!(text.lines().count(), e.problems.len());
        assert!(text.contains("seed is mandatory (???) — set it, e.g. seed=1234"));
        assert!(text.contains("did you mean 'slurm'?"));
    }

    #[test]
    fn model_shape_rules() {
        let mut job = base();
        set(
            &mut job,
            "model.hidden_size",
            json!(130),
            ovr("model.hidden_size=130"),
        );
        assert_eq!(
            only(&job).message,
            "model.hidden_size: 130 is not divisible by model.num_attention_heads (4) (set by \
             override 'model.hidden_size=130'); use a multiple of 4, e.g. \
             model.hidden_size=132, or change model.num_attention_heads"
        );
        let mut job = base();
        set(&mut job, "model.num_key_value_heads", json!(3), ovr("kv=3"));
        assert_eq!(
            only(&job).message,
            "model.num_key_value_heads: 3 does not divide model.num_attention_heads (4) (set by \
             override 'kv=3'); use one of 1, 2 or 4"
        );
        let mut job = base();
        set(&mut job, "model.hidden_size", json!(12), ovr("h"));
        assert!(only(&job).message.contains("odd head dimension 3"));
        let mut job = base();
        set(
            &mut job,
            "model.num_attention_heads",
            json!(0),
            ovr("model.num_attention_heads=0"),
        );
        assert_eq!(
            only(&job).message,
            "model.num_attention_heads: must be at least 1, got 0 (set by override \
             'model.num_attention_heads=0'); set model.num_attention_heads=1 or more"
        );
        let mut job = compose("llama-8b", "none", "arithmetic", "local");
        set(
            &mut job,
            "model.rope_scaling.high_freq_factor",
            json!(0.5),
            ovr("r"),
        );
        assert!(only(&job)
            .message
            .contains("must be above model.rope_scaling.low_freq_factor"));
    }

    #[test]
    fn batch_must_split_over_micro_batches_and_ranks() {
        let mut job = base();
        set(
            &mut job,
            "trainer.global_batch_size",
            json!(30),
            ovr("trainer.global_batch_size=30"),
        );
        assert_eq!(
            only(&job).message,
            "trainer.global_batch_size: 30 is not divisible by trainer.micro_batch_size (16) \
             (set by override 'trainer.global_batch_size=30'); use a multiple of 16, e.g. \
             trainer.global_batch_size=32, or change trainer.micro_batch_size"
        );
        let mut job = compose("small", "ddp", "arithmetic", "slurm");
        set(&mut job, "trainer.global_batch_size", json!(64), ovr("g"));
        let p = only(&job);
        assert!(
            p.message.contains("× world size = 16 × 8 = 128"),
            "{}",
            p.message
        );
        assert!(p.message.contains("trainer.global_batch_size=128"));
    }

    #[test]
    fn multi_rank_compute_needs_a_dist_mode() {
        let job = compose("small", "none", "arithmetic", "slurm");
        let p = problems(&job);
        assert_eq!(p.len(), 2, "{p:#?}"); // also 32 % (16 × 8)
        assert!(p.iter().any(|p| p.key == "trainer.dist.mode"
            && p.message
                .contains("select trainer/dist=ddp or trainer/dist=fsdp")));
    }

    #[test]
    fn keys_of_another_mode_are_named_as_such() {
        let mut job = compose("tiny", "fsdp", "arithmetic", "local");
        set(
            &mut job,
            "trainer.dist.bucket_cap_mb",
            json!(50),
            ovr("+trainer.dist.bucket_cap_mb=50"),
        );
        assert_eq!(
            only(&job).message,
            "unknown key 'trainer.dist.bucket_cap_mb' for trainer.dist.mode=fsdp (set by \
             override '+trainer.dist.bucket_cap_mb=50'): it only applies when \
             trainer.dist.mode is ddp; select trainer/dist=ddp, or remove it"
        );
        let mut job = base();
        set(&mut job, "trainer.dist.timeout_s", json!(60), ovr("t"));
        assert!(only(&job)
            .message
            .contains("applies when trainer.dist.mode is ddp or fsdp"));
        let mut job = base();
        set(
            &mut job,
            "trainer.dist.mode",
            json!("dpp"),
            ovr("trainer.dist.mode=dpp"),
        );
        set(&mut job, "trainer.dist.wat", json!(1), ovr("w"));
        let p = problems(&job);
        assert_eq!(p.len(), 2, "{p:#?}");
        assert!(p[0].message.ends_with("did you mean 'ddp'?"));
        assert_eq!(p[1].key, "trainer.dist.wat");
    }

    #[test]
    fn data_rules() {
        let mut job = base();
        set(
            &mut job,
            "data.seq_len",
            json!(4096),
            ovr("data.seq_len=4096"),
        );
        assert_eq!(
            only(&job).message,
            "data.seq_len: 4096 exceeds model.max_position_embeddings (256) (set by override \
             'data.seq_len=4096'); set data.seq_len=256 or less, or raise \
             model.max_position_embeddings"
        );
        let mut job = compose("tiny", "none", "text", "local");
        set(
            &mut job,
            "data.paths",
            json!("/data/*.txt"),
            ovr("data.paths=/data/*.txt"),
        );
        set(&mut job, "data.seq_len", json!(128), ovr("s"));
        let p = only(&job);
        assert_eq!(p.key, "model.vocab_size");
        assert!(p.message.contains("too small for data.tokenizer=byte"));
        set(&mut job, "data.tokenizer", json!("bpe"), ovr("t"));
        let p = only(&job);
        assert!(p.message.starts_with(
            "data.vocab_size: the bpe tokenizer's 4096 tokens exceed model.vocab_size (32)"
        ));
        set(&mut job, "data.tokenizer", json!("bytes"), ovr("t"));
        assert!(only(&job).message.ends_with("did you mean 'byte'?"));
        set(&mut job, "data.tokenizer", json!("./tok.json"), ovr("t"));
        let cfg = validate(&job).unwrap();
        let DataConfig::Text(t) = &cfg.data else {
            panic!()
        };
        assert_eq!(t.paths, ["/data/*.txt"]);
        assert_eq!(t.tokenizer, TokenizerSpec::File("./tok.json".into()));
        let mut job = base();
        set(&mut job, "data.digits", json!(0), ovr("d"));
        assert!(only(&job).message.contains("must be between 1 and 9"));
        let mut job = base();
        set(
            &mut job,
            "data.kind",
            json!("tokens"),
            ovr("data.kind=tokens"),
        );
        let p = problems(&job);
        // arithmetic keys are named as such; path and dtype are missing.
        assert!(p.iter().any(|p| p.key == "data.digits"
            && p.message
                .contains("only applies when data.kind is arithmetic; select data=arithmetic")));
        assert!(p
            .iter()
            .any(|p| p.key == "data.path" && p.kind == ProblemKind::MissingKey));
    }

    #[test]
    fn trainer_rules() {
        let mut job = base();
        set(&mut job, "trainer.min_lr", json!(0.1), ovr("m"));
        set(&mut job, "trainer.warmup_steps", json!(1000), ovr("w"));
        set(&mut job, "trainer.betas", json!([0.9, 1.5]), ovr("b"));
        set(&mut job, "trainer.eval_batches", json!(0), ovr("e"));
        set(&mut job, "trainer.lr", json!(0), ovr("l"));
        let keys: Vec<String> = problems(&job).into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            ["trainer.lr", "trainer.betas", "trainer.eval_batches"]
        );
        let mut job = base();
        set(&mut job, "trainer.min_lr", json!(0.1), ovr("m"));
        assert!(only(&job).message.contains("at most trainer.lr"));
        let mut job = compose("tiny", "ddp", "arithmetic", "local");
        set(&mut job, "trainer.dist.backend", json!("nccl"), ovr("b"));
        set(&mut job, "trainer.device", json!("cpu"), ovr("d"));
        assert!(only(&job).message.contains("nccl needs CUDA"));
        set(
            &mut job,
            "trainer.resume",
            json!("/ckpt/step_100"),
            ovr("r"),
        );
        set(&mut job, "trainer.dist.backend", json!("cpu"), ovr("b"));
        let cfg = validate(&job).unwrap();
        assert_eq!(cfg.trainer.resume, Resume::Path("/ckpt/step_100".into()));
        assert_eq!(cfg.trainer.dist.backend(), Some(Backend::Cpu));
    }

    #[test]
    fn compute_rules() {
        // The local launcher simulates several nodes on one host (hybrid sharding tests).
        let mut job = base();
        set(&mut job, "compute.nodes", json!(2), ovr("compute.nodes=2"));
        set(&mut job, "trainer.global_batch_size", json!(64), ovr("g"));
        let p = problems(&job);
        assert!(!p.iter().any(|p| p.key == "compute.nodes"), "{p:?}");
        let mut job = compose("small", "fsdp", "arithmetic", "slurm");
        set(&mut job, "compute.tasks_per_node", json!(16), ovr("t"));
        set(&mut job, "trainer.global_batch_size", json!(256), ovr("g"));
        assert!(only(&job)
            .message
            .contains("16 ranks per node would share 8 GPUs"));
        let mut job = compose("small", "fsdp", "arithmetic", "slurm");
        set(&mut job, "trainer.global_batch_size", json!(128), ovr("g"));
        set(
            &mut job,
            "compute.additional_parameters",
            json!({"exclusive": true}),
            ovr("a"),
        );
        set(
            &mut job,
            "compute.setup",
            json!("module load cuda"),
            ovr("s"),
        );
        let cfg = validate(&job).unwrap();
        assert_eq!(cfg.compute.additional_parameters["exclusive"], json!(true));
        assert_eq!(cfg.compute.setup, ["module load cuda"]);
        assert_eq!(cfg.compute.world_size(), 8);
        assert_eq!(cfg.trainer.grad_accum_steps(8), 1);
    }

    #[test]
    fn root_must_be_a_dict_and_origins_may_be_unknown() {
        let e = validate(&Node::from(Value::Int(3))).unwrap_err();
        assert_eq!(e.to_string(), "the job config must be a dict, got int 3");
        let mut j = serde_json::to_value(validate(&base()).unwrap()).unwrap();
        j["trainer"]["lr"] = json!("x");
        let job = tree(&j, &Origin::Unknown);
        assert_eq!(
            only(&job).message,
            "trainer.lr: expected a number, got str 'x'"
        );
    }
}
