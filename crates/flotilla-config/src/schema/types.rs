//! The typed config: the sections `validate` returns (`model`, `trainer` with
//! `trainer.dist`, `data`, `compute`) and the string enums they use, each declared with how it
//! is read from a node (`choice!` and `section!` generate the `FromNode` impls; `rope.rs` uses
//! them for the rope types and `model.rope_scaling`).

use super::from_node::{field, parse_choice, parse_tagged, Choice, Cx, Fail, FromNode, Parsed};
use super::messages::{quote_list, set_note};
pub use super::moe::MoeConfig;
pub use super::objective::ObjectiveConfig;
pub use super::peft::{ExpertTargets, LoraConfig, LoraModule, PeftConfig, PeftMethod, SavedModule};
pub use super::rope::{RopeScaling, RopeType};
use super::shard_size::{ShardSize, DEFAULT_MAX_SHARD_SIZE};
pub use super::tokenizer_spec::TokenizerSpec;
use super::ProblemKind;
use crate::node::{Dict, Node, Value};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::fmt;

// ---------------------------------------------------------------------------------------------
// Choice enums
// ---------------------------------------------------------------------------------------------

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
pub(super) use choice;

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
        /// `bf16-mixed` on a GPU, `32-true` on a CPU ([`JobConfig::precision`]).
        Auto = "auto",
    }
}

choice! {
    /// The dtype of `final/`'s weights (`trainer.save_dtype`): `auto` is the base's
    /// (`model.init_from`'s `dtype`/`torch_dtype`), else bfloat16 under the bf16 precisions and
    /// float32 otherwise.
    pub enum SaveDtype {
        Auto = "auto",
        Float32 = "float32",
        Bfloat16 = "bfloat16",
        Float16 = "float16",
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
    /// FSDP unit boundaries: one unit per decoder block, or by parameter count
    /// ([`AutoWrapPolicy::groups`]).
    pub enum AutoWrapPolicy { Block = "block", Size = "size" }
}

impl AutoWrapPolicy {
    /// The FSDP groups of consecutive units, given the parameters each unit owns (in forward
    /// order): `block` gives one group per unit; `size` closes a group once its units own at
    /// least `min_num_params` parameters (the rest form the last group). The one wrap policy
    /// that the trainer's FSDP and the memory planner both follow.
    pub fn groups(
        self,
        owned_per_unit: &[u64],
        min_num_params: u64,
    ) -> Vec<std::ops::Range<usize>> {
        let n = owned_per_unit.len();
        match self {
            AutoWrapPolicy::Block => (0..n).map(|u| u..u + 1).collect(),
            AutoWrapPolicy::Size => {
                let mut groups = vec![];
                let (mut start, mut count) = (0, 0u64);
                for (u, owned) in owned_per_unit.iter().enumerate() {
                    count += owned;
                    if count >= min_num_params {
                        groups.push(start..u + 1);
                        start = u + 1;
                        count = 0;
                    }
                }
                if start < n {
                    groups.push(start..n);
                }
                groups
            }
        }
    }
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
    /// The Hugging Face architecture `model` describes (`model.model_type`, `config.json`'s
    /// `model_type`): Llama, or Mistral and Qwen2, which are Llama's math with a sliding
    /// attention window (Mistral, Qwen2) and biases on q/k/v_proj (Qwen2).
    pub enum ModelType {
        Llama = "llama",
        Mistral = "mistral",
        Qwen2 = "qwen2",
        Qwen3 = "qwen3",
        Gemma2 = "gemma2",
        Gemma3 = "gemma3_text",
        Phi3 = "phi3",
        SmolLm3 = "smollm3",
        Mixtral = "mixtral",
        Qwen3Moe = "qwen3_moe",
    }
}

choice! {
    /// When a job builds its process group (`trainer.dist.process_group`).
    pub enum ProcessGroup { Auto = "auto", Always = "always" }
}

choice! {
    /// The attention of one decoder layer (`model.layer_types`, `config.json`'s `layer_types`).
    pub enum LayerType { Full = "full_attention", Sliding = "sliding_attention" }
}

choice! {
    /// Which data source `data` describes (`data.kind`).
    pub enum DataKind { Arithmetic = "arithmetic", Tokens = "tokens", Text = "text", Jsonl = "jsonl", Chat = "chat", Preference = "preference" }
}

choice! {
    /// Which end of a pair's sequence survives `data.seq_len` (TRL's `truncation_mode`).
    pub enum TruncationMode { KeepStart = "keep_start", KeepEnd = "keep_end" }
}

choice! {
    /// What a chat record holds (`data.format`): `auto` recognises each record by its keys as
    /// TRL does; the others name one format: OpenAI-style `{role, content}` messages,
    /// ShareGPT's `{from, value}` turns (human/gpt/system), TRL's prompt-completion
    /// (`{prompt, completion}`, strings or message lists; loss on the completion only),
    /// Alpaca's `{instruction, input, output}`, or plain `text`.
    pub enum ChatFormat {
        Auto = "auto",
        Messages = "messages",
        Sharegpt = "sharegpt",
        PromptCompletion = "prompt_completion",
        Alpaca = "alpaca",
        Text = "text",
    }
}

choice! {
    /// Which tokens of a conversation carry loss (`data.train_on`).
    pub enum TrainOn { Assistant = "assistant", All = "all", LastAssistant = "last_assistant" }
}

choice! {
    /// What happens to a conversation longer than `data.seq_len` (`data.overflow`).
    pub enum Overflow { Truncate = "truncate", Drop = "drop" }
}

choice! {
    /// What a token of a packed window attends to (`data.packed_attention`): its own
    /// conversation only, with positions restarting at each conversation (`conversation`, as
    /// transformers treats packed `position_ids`), or every earlier token of the window
    /// (`window`: plain causal attention, no mask).
    pub enum PackedAttention { Conversation = "conversation", Window = "window" }
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
pub(super) use section;

/// The validated job config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobConfig {
    pub seed: i64,
    pub model: ModelConfig,
    /// Parameter-efficient fine-tuning (absent from a config: `none`).
    #[serde(default)]
    pub peft: PeftConfig,
    pub trainer: TrainerConfig,
    pub data: DataConfig,
    pub compute: ComputeConfig,
    /// What the trainer optimises (absent from a config: `sft`).
    #[serde(default)]
    pub objective: ObjectiveConfig,
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
        /// The rotary embeddings' type and its parameters (Hugging Face's `rope_scaling`);
        /// absent: plain RoPE.
        rope_scaling: Option<RopeScaling>,
        /// The fraction of each head's features the rotary embeddings rotate (the first
        /// `int(head_dim * partial_rotary_factor)`; the rest pass through, as Phi-3/4 do);
        /// absent: 1.0, all of them.
        partial_rotary_factor: Option<f64> => "0.75",
        tie_word_embeddings: bool,
        initializer_range: f64,
        /// Hugging Face model directory (`config.json` + `*.safetensors`) to load weights from.
        init_from: Option<String> => "/path/to/hf-model-dir",
        /// The architecture (`llama`, `mistral`, `qwen2`); absent: `llama`.
        model_type: Option<ModelType> => "llama",
        /// Llama's `attention_bias`: biases on q/k/v/o_proj; absent: none. (Qwen2's q/k/v
        /// biases come with its `model_type`; Mistral has none.)
        attention_bias: Option<bool> => "false",
        /// Mistral's and Qwen2's sliding attention window (positions a token attends to);
        /// absent: full attention. Training and generating stay within it.
        sliding_window: Option<usize> => "4096",
        /// The size of each attention head; absent: `hidden_size / num_attention_heads`
        /// (Mistral Nemo, Qwen3 and Gemma set their own).
        head_dim: Option<usize> => "128",
        /// Each layer's attention, `full_attention` or `sliding_attention` (within
        /// `sliding_window`); absent: every layer the same (sliding when `sliding_window` is
        /// set). Gemma 2 and 3 alternate them.
        layer_types: Option<Vec<LayerType>> => "[sliding_attention, full_attention]",
        /// Gemma: queries are scaled by `query_pre_attn_scalar ** -0.5` (absent:
        /// `head_dim ** -0.5`).
        query_pre_attn_scalar: Option<f64> => "256",
        /// Gemma 2: attention scores soft-capped as `cap * tanh(score / cap)`.
        attn_logit_softcapping: Option<f64> => "50.0",
        /// Gemma 2: logits soft-capped as `cap * tanh(logit / cap)`.
        final_logit_softcapping: Option<f64> => "30.0",
        /// Gemma 3: the rope theta of its sliding-window layers (`rope_theta` is the global
        /// layers').
        rope_local_base_freq: Option<f64> => "10000.0",
        /// SmolLM3: whether each layer applies rotary embeddings (1) or none (0); absent:
        /// every layer does.
        no_rope_layers: Option<Vec<usize>> => "[1, 1, 1, 0]",
        /// The padding token, whose embedding row training leaves alone (transformers'
        /// `nn.Embedding` `padding_idx`: no gradient reaches it through the embedding); absent:
        /// none.
        pad_token_id: Option<usize> => "0",
        /// A mixture of experts' sparse MLP (Mixtral, Qwen3-MoE); absent: a dense model.
        moe: Option<MoeConfig>,
    }
}

impl ModelConfig {
    /// Per-head dimension: `head_dim`, else `hidden_size / num_attention_heads`.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Parameter count of the architecture this config describes.
    pub fn num_parameters(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = (self.num_attention_heads * self.head_dim()) as u64;
        let kv = (self.num_key_value_heads * self.head_dim()) as u64;
        let attention = 2 * h * q
            + 2 * h * kv
            + self.block_norm_elements()
            + self.attention_biases().elements(self);
        let mlps: u64 = (0..self.num_hidden_layers)
            .map(|i| self.mlp_elements(i))
            .sum();
        let embeddings = self.vocab_size as u64 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            embeddings
        };
        self.num_hidden_layers as u64 * attention + mlps + embeddings + head + h
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
        /// The dtype of `final/`'s weights (absent: `auto`).
        save_dtype: Option<SaveDtype>,
        /// The largest weights file of `final/` (absent: [`DEFAULT_MAX_SHARD_SIZE`]).
        max_shard_size: Option<ShardSize>,
        /// fp32 matrix products and convolutions on GPUs in TF32 (absent: false, PyTorch's
        /// default).
        allow_tf32: Option<bool>,
    }
}

impl TrainerConfig {
    /// The largest weights file of `final/`, in bytes.
    pub fn max_shard_bytes(&self) -> u64 {
        self.max_shard_size.map_or(DEFAULT_MAX_SHARD_SIZE, |s| s.0)
    }

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
        /// Gradient bucket size in MB (torch default 25); a bucket ends at the first unit
        /// boundary where it holds this much.
        bucket_cap_mb: f64,
        /// `always`: a process group and every collective even for one rank (proves the NCCL
        /// path on one GPU); absent or `auto`: only with more than one rank.
        process_group: Option<ProcessGroup> => "always",
    }
}

impl DdpConfig {
    /// DDP's gradient buckets over units whose trained parameters hold `elements_per_unit`
    /// fp32 gradient elements (in forward order): units in reverse, the order their gradients
    /// become final, a bucket closed at the first unit boundary where it holds
    /// `bucket_cap_mb` or more, the last one at unit 0 when it holds anything. In backward
    /// order. The one bucket layout that the trainer's DDP and the memory planner both follow.
    pub fn buckets(&self, elements_per_unit: &[u64]) -> Vec<std::ops::Range<usize>> {
        let cap = ((self.bucket_cap_mb * 1024.0 * 1024.0 / 4.0) as u64).max(1);
        let mut out = vec![];
        let (mut elements, mut top) = (0, None);
        for u in (0..elements_per_unit.len()).rev() {
            elements += elements_per_unit[u];
            let highest = *top.get_or_insert(u);
            if elements >= cap || (u == 0 && elements > 0) {
                out.push(u..highest + 1);
                (elements, top) = (0, None);
            }
        }
        out
    }
}

section! {
    /// `trainer.dist` with `mode: fsdp`; defaults follow `torch.distributed.fsdp`.
    pub struct FsdpConfig {
        backend: Backend,
        /// Collective timeout in seconds.
        timeout_s: u64,
        /// `always`: a process group and every collective even for one rank; absent or `auto`:
        /// only with more than one rank.
        process_group: Option<ProcessGroup> => "always",
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
    #[serde(rename = "chat")]
    Chat(ChatData),
    #[serde(rename = "preference")]
    Preference(PreferenceData),
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
        /// Held-out files or globs; `None`: no evaluation data (or a carved
        /// `eval_fraction`/`eval_records`).
        eval_paths: Option<Vec<String>> => "[/path/to/eval.txt]",
        /// A fraction of the training documents held out for evaluation (without
        /// `eval_paths`), as run_clm's `validation_split_percentage`.
        eval_fraction: Option<f64> => "0.05",
        /// A number of training documents held out for evaluation (without `eval_paths`).
        eval_records: Option<usize> => "100",
        /// Seeds the held-out documents; `None`: 0.
        seed: Option<usize> => "0",
        /// `None`: `model.init_from`'s tokenizer, else `byte` ([`TokenizerSpec::resolve`]).
        tokenizer: Option<TokenizerSpec> => "byte",
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
        /// A data file (`.jsonl`, `.json`, `.parquet`, `.arrow`), a glob, a directory of
        /// Parquet shards or a `datasets.save_to_disk` directory; `None` with `sources`.
        path: Option<String> => "/path/to/train.jsonl",
        /// The split of a directory that holds several; `None`: `train`.
        split: Option<String> => "train",
        /// Several sources mixed into the training set, instead of `path`.
        sources: Option<Vec<DataSource>> => "[{path: /path/to/a.parquet, weight: 1.0}]",
        /// Held-out records; `None`: no evaluation data (or `eval_split`, or a carved
        /// `eval_fraction`/`eval_records`).
        eval_path: Option<String> => "/path/to/eval.jsonl",
        /// The split of `eval_path` (or, without it, of `path`) held out for evaluation.
        eval_split: Option<String> => "test",
        /// A fraction of the training records held out for evaluation (without `eval_path`).
        eval_fraction: Option<f64> => "0.05",
        /// A number of training records held out for evaluation (without `eval_path`).
        eval_records: Option<usize> => "500",
        /// Seeds the mixture's sampling and the held-out records; `None`: 0.
        seed: Option<usize> => "0",
        /// `{field}` is replaced by that record field.
        prompt_template: String => "'{prompt}'",
        /// Record field appended after the rendered prompt.
        completion_key: String => "completion",
        /// Loss only on completion tokens.
        mask_prompt: bool,
        /// `None`: `model.init_from`'s tokenizer, else `byte` ([`TokenizerSpec::resolve`]).
        tokenizer: Option<TokenizerSpec> => "byte",
        /// Vocabulary of a trained `bpe` tokenizer.
        vocab_size: usize,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

section! {
    /// One source of a data mixture (`data.sources[i]`): its records and how many of them the
    /// training set takes (at most one of `weight`, `fraction`, `records`; none: all of them).
    pub struct DataSource {
        /// A data file, a glob, a directory of shards or a `save_to_disk` directory.
        path: String => "/path/to/data.parquet",
        /// The split of a directory that holds several; `None`: `train`.
        split: Option<String> => "train",
        /// A share of the mixture relative to the other sources' weights (sampled without
        /// replacement until the first source runs out, as `interleave_datasets`'s
        /// `first_exhausted`).
        weight: Option<f64> => "1.0",
        /// A fraction of this source's records (above 1: repeated).
        fraction: Option<f64> => "0.5",
        /// A number of this source's records (more than it has: repeated).
        records: Option<usize> => "1000",
    }
}

section! {
    /// `data` with `kind: chat`: conversations rendered with the tokenizer's chat template.
    pub struct ChatData {
        /// A data file (`.jsonl`, `.json`, `.parquet`, `.arrow`), a glob, a directory of
        /// Parquet shards or a `datasets.save_to_disk` directory; `None` with `sources`.
        path: Option<String> => "/path/to/chats.jsonl",
        /// The split of a directory that holds several; `None`: `train`.
        split: Option<String> => "train",
        /// Several sources mixed into the training set, instead of `path`.
        sources: Option<Vec<DataSource>> => "[{path: /path/to/a.parquet, weight: 1.0}]",
        /// Held-out conversations; `None`: no evaluation data (or `eval_split`, or a carved
        /// `eval_fraction`/`eval_records`).
        eval_path: Option<String> => "/path/to/eval.jsonl",
        /// The split of `eval_path` (or, without it, of `path`) held out for evaluation.
        eval_split: Option<String> => "test",
        /// A fraction of the training records held out for evaluation (without `eval_path`).
        eval_fraction: Option<f64> => "0.05",
        /// A number of training records held out for evaluation (without `eval_path`).
        eval_records: Option<usize> => "500",
        /// Seeds the mixture's sampling and the held-out records (fixed, so that runs that
        /// vary `trainer.seed` share them); `None`: 0.
        seed: Option<usize> => "0",
        /// A Hugging Face tokenizer directory (`tokenizer.json` + `tokenizer_config.json`);
        /// `None`: the one in `model.init_from`.
        tokenizer: Option<String> => "/path/to/tokenizer_dir",
        /// A Jinja file used instead of the tokenizer directory's chat template.
        chat_template: Option<String> => "/path/to/template.jinja",
        /// `auto` (by each record's keys), `messages`, `sharegpt`, `prompt_completion`,
        /// `alpaca` or `text`.
        format: ChatFormat,
        /// The record field holding the turns (`auto` also looks for `conversations`).
        messages_key: String => "messages",
        /// A system prompt prepended to every conversation that has none.
        system: Option<String> => "'You are a helpful assistant.'",
        /// Tokens with loss: `assistant`, `all`, or `last_assistant`.
        train_on: TrainOn,
        /// A conversation longer than `seq_len`: `truncate` or `drop`.
        overflow: Overflow,
        /// Several conversations per window (loss masks kept).
        packing: bool,
        /// With packing: `conversation` (attention and positions within each conversation) or
        /// `window` (causal over the whole window).
        packed_attention: PackedAttention,
        /// Skip (and count) records the template rejects or that have nothing to train,
        /// instead of stopping at the first.
        skip_bad_records: bool,
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

section! {
    /// `data` with `kind: preference`: pairs of a prompt with a chosen and a rejected
    /// completion (TRL's preference formats), for `objective: dpo`.
    pub struct PreferenceData {
        /// A `.jsonl`/`.json`/`.parquet` file, a glob, a directory of Parquet shards or a
        /// `save_to_disk` directory; `None` with `sources`.
        path: Option<String> => "/path/to/pairs.jsonl",
        /// The split of a directory that holds several; `None`: `train`.
        split: Option<String> => "train_prefs",
        /// Several sources mixed into the training set, instead of `path`.
        sources: Option<Vec<DataSource>> => "[{path: /path/to/a.parquet, weight: 1.0}]",
        /// Held-out pairs; `None`: no evaluation data (or `eval_split`, or a carved
        /// `eval_fraction`/`eval_records`).
        eval_path: Option<String> => "/path/to/eval_pairs.jsonl",
        /// The split of `eval_path` (or, without it, of `path`) held out for evaluation.
        eval_split: Option<String> => "test_prefs",
        /// A fraction of the training pairs held out for evaluation (without `eval_path`).
        eval_fraction: Option<f64> => "0.05",
        /// A number of training pairs held out for evaluation (without `eval_path`).
        eval_records: Option<usize> => "500",
        /// Seeds the mixture's sampling and the held-out pairs (fixed, so that runs that vary
        /// `trainer.seed` share them); `None`: 0.
        seed: Option<usize> => "0",
        /// A Hugging Face tokenizer directory; `None`: the one in `model.init_from`.
        tokenizer: Option<String> => "/path/to/tokenizer_dir",
        /// A Jinja file used instead of the tokenizer directory's chat template.
        chat_template: Option<String> => "/path/to/template.jinja",
        /// Prompts longer than this keep their end (`None`: no limit of their own).
        max_prompt_length: Option<usize> => "512",
        /// A prompt + completion longer than `seq_len`: `keep_start` or `keep_end`.
        truncation_mode: TruncationMode,
        /// Skip (and count) malformed records instead of stopping at the first.
        skip_bad_records: bool,
        /// TRL's `max_length`: positions of each of a pair's two sequences.
        seq_len: usize,
        shuffle: bool,
        num_workers: usize,
    }
}

/// Which records make a data set, as chat and preference data name them alike: `path` (with
/// `split`) or a mixture of `sources`, and the held-out records (`eval_path`/`eval_split`, or
/// carved from the training records by `eval_fraction`/`eval_records`, seeded by `seed`).
#[derive(Clone, Copy, Debug)]
pub struct RecordSelection<'a> {
    pub path: Option<&'a str>,
    pub split: Option<&'a str>,
    pub sources: Option<&'a [DataSource]>,
    pub eval_path: Option<&'a str>,
    pub eval_split: Option<&'a str>,
    pub eval_fraction: Option<f64>,
    pub eval_records: Option<usize>,
    pub seed: u64,
}

impl<'a> RecordSelection<'a> {
    /// Whether the job has evaluation data: `eval_path`, `eval_split`, or records carved from
    /// the training data.
    pub fn has_eval(&self) -> bool {
        self.eval_path.is_some()
            || self.eval_split.is_some()
            || self.eval_fraction.is_some()
            || self.eval_records.is_some()
    }

    /// The training records' path as the config names it (`None` for a mixture).
    pub fn describe(&self) -> &'a str {
        self.path.unwrap_or("a mixture of data.sources")
    }
}

/// The [`RecordSelection`] of each data section that reads records.
macro_rules! record_selection {
    ($($section:ident),+) => {$(
        impl $section {
            /// The records this data set is made of.
            pub fn selection(&self) -> RecordSelection<'_> {
                RecordSelection {
                    path: self.path.as_deref(),
                    split: self.split.as_deref(),
                    sources: self.sources.as_deref(),
                    eval_path: self.eval_path.as_deref(),
                    eval_split: self.eval_split.as_deref(),
                    eval_fraction: self.eval_fraction,
                    eval_records: self.eval_records,
                    seed: self.seed.unwrap_or(0) as u64,
                }
            }

            /// Whether the job has evaluation data ([`RecordSelection::has_eval`]).
            pub fn has_eval(&self) -> bool {
                self.selection().has_eval()
            }
        }
    )+};
}
record_selection!(ChatData, PreferenceData, JsonlData);

impl DataConfig {
    pub fn kind(&self) -> DataKind {
        match self {
            DataConfig::Arithmetic(_) => DataKind::Arithmetic,
            DataConfig::Tokens(_) => DataKind::Tokens,
            DataConfig::Text(_) => DataKind::Text,
            DataConfig::Jsonl(_) => DataKind::Jsonl,
            DataConfig::Chat(_) => DataKind::Chat,
            DataConfig::Preference(_) => DataKind::Preference,
        }
    }

    /// Whether samples pack several sequences that attend only to themselves (chat data with
    /// `packing` and `packed_attention: conversation`): the model then takes position ids and
    /// an attention mask per row.
    pub fn isolates_packed_sequences(&self) -> bool {
        matches!(self, DataConfig::Chat(d) if d.packing && d.packed_attention == PackedAttention::Conversation)
    }

    pub fn seq_len(&self) -> usize {
        match self {
            DataConfig::Arithmetic(d) => d.seq_len,
            DataConfig::Tokens(d) => d.seq_len,
            DataConfig::Text(d) => d.seq_len,
            DataConfig::Jsonl(d) => d.seq_len,
            DataConfig::Chat(d) => d.seq_len,
            DataConfig::Preference(d) => d.seq_len,
        }
    }

    pub fn shuffle(&self) -> bool {
        match self {
            DataConfig::Arithmetic(d) => d.shuffle,
            DataConfig::Tokens(d) => d.shuffle,
            DataConfig::Text(d) => d.shuffle,
            DataConfig::Jsonl(d) => d.shuffle,
            DataConfig::Chat(d) => d.shuffle,
            DataConfig::Preference(d) => d.shuffle,
        }
    }

    pub fn num_workers(&self) -> usize {
        match self {
            DataConfig::Arithmetic(d) => d.num_workers,
            DataConfig::Tokens(d) => d.num_workers,
            DataConfig::Text(d) => d.num_workers,
            DataConfig::Jsonl(d) => d.num_workers,
            DataConfig::Chat(d) => d.num_workers,
            DataConfig::Preference(d) => d.num_workers,
        }
    }

    /// The tokenizer `text` and `jsonl` data use, for a job that starts from `init_from`
    /// ([`TokenizerSpec::resolve`]); `None` for the other kinds.
    pub fn tokenizer(&self, init_from: Option<&str>) -> Option<TokenizerSpec> {
        let spec = match self {
            DataConfig::Text(d) => d.tokenizer.as_ref(),
            DataConfig::Jsonl(d) => d.tokenizer.as_ref(),
            _ => return None,
        };
        Some(TokenizerSpec::resolve(spec, init_from))
    }

    fn keys_of(kind: DataKind) -> &'static [&'static str] {
        match kind {
            DataKind::Arithmetic => ArithmeticData::KEYS,
            DataKind::Tokens => TokensData::KEYS,
            DataKind::Text => TextData::KEYS,
            DataKind::Jsonl => JsonlData::KEYS,
            DataKind::Chat => ChatData::KEYS,
            DataKind::Preference => PreferenceData::KEYS,
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
            DataKind::Chat => DataConfig::Chat(ChatData::parse_fields(node, dict, key, cx, &skip)?),
            DataKind::Preference => {
                DataConfig::Preference(PreferenceData::parse_fields(node, dict, key, cx, &skip)?)
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
        /// SLURM sweeps: the slots (one rank each, with its `cpus_per_task` and its share of
        /// the GPUs) of one allocation that runs the sweep's jobs as job steps, starting the
        /// next job as soon as one ends; `None` or 1: one allocation per job.
        pack: Option<usize> => "4",
        /// Seconds before the time limit at which the job is signalled to checkpoint and requeue.
        signal_delay_s: u64,
        /// Requeues after a timeout before giving up.
        max_num_timeout: u32,
        /// SLURM: `true` (`sbatch --requeue`): a job whose node fails, or that checkpointed
        /// after the stop signal, is requeued and resumes from its checkpoint; `false`
        /// (`--no-requeue`): such a job ends (NODE_FAIL, or FAILED with the failing rank's
        /// error) and stays ended; `None`: the cluster's `JobRequeue` decides.
        requeue: Option<bool> => "false",
        /// Shell lines run before the job starts; a single string is one line.
        setup: Vec<String> => "[]",
        /// Extra `#SBATCH --key=value` options.
        additional_parameters: IndexMap<String, serde_json::Value> => "{}",
        /// sbatch template; `None`: `launchers/slurm.sbatch.j2`.
        template: Option<String> => "launchers/slurm.sbatch.j2",
        /// Local sweeps: jobs running at the same time.
        max_parallel: usize,
        /// The GPU model each rank gets, a name of the GPU table (`schema::GPU_MODELS`): the
        /// memory `flotilla plan --memory` and `flotilla run`'s fit check measure against.
        /// `None`: `gpu_mem_gb`, else a `constraint` naming a known GPU, else unknown.
        gpu_type: Option<String> => "h100",
        /// Memory of one GPU in GiB (2^30 bytes); takes precedence over `gpu_type`.
        gpu_mem_gb: Option<f64> => "80",
        /// Refuse to start a GPU job whose estimated peak memory exceeds its GPU's.
        check_memory: bool,
    }
}

impl ComputeConfig {
    /// Ranks per job: `nodes × tasks_per_node`.
    pub fn world_size(&self) -> usize {
        self.nodes * self.tasks_per_node
    }
}

choice! {
    /// How the processes of a user task are started (`flotilla.task.ranks`).
    pub enum TaskRanks {
        /// flotilla starts `nodes × tasks_per_node` processes, each with its rank.
        PerTask = "per_task",
        /// flotilla starts one process per node, which starts its own workers (torchrun).
        PerNode = "per_node",
    }
}

choice! {
    /// What the user's program is handed to find the job config (`flotilla.task.config_arg`).
    pub enum ConfigArg {
        /// `--config-path=<job dir> --config-name=config hydra.run.dir=<job dir>`: an unchanged
        /// `@hydra.main` app loads the job's resolved config and writes into the job directory.
        Hydra = "hydra",
    }
}

section! {
    /// `flotilla.task`: the program every job runs instead of the built-in trainer. The
    /// command's interpolations are resolved once per job.
    pub struct TaskConfig {
        /// The program and its arguments; `None`: the built-in trainer.
        command: Option<Vec<String>> => "[python, train.py]",
        ranks: TaskRanks,
        /// The working directory; `None`: the directory flotilla was started from.
        cwd: Option<String> => "/path/to/project",
        /// Extra environment variables.
        env: IndexMap<String, String> => "{}",
        config_arg: Option<ConfigArg>,
        /// `per_node`: the program starts its own workers (checked for the known launchers).
        starts_workers: bool,
    }
}
