//! A Hugging Face model's `config.json` as flotilla reads it: that of `LlamaForCausalLM`,
//! `MistralForCausalLM` and `Qwen2ForCausalLM` ([`HfLlamaConfig`]), turned into a
//! [`ModelConfig`] with every check the trainer makes (the architecture, the activation, the
//! head size, the rope type and its parameters), and back. One implementation for both sides:
//! the trainer builds its model from it, and `run`'s pre-flight refuses on the login node, before
//! anything is created, a base directory the trainer would refuse after the queue wait.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::architecture::hf_architecture;
use super::moe::{hf_moe, write_hf_moe};
use super::rope::{check_hf_rope, hf_phi3_original_max, hf_rope, hf_rope_scaling};
use super::types::{LayerType, ModelConfig, ModelType};

/// Why a `config.json` cannot be read as a model flotilla trains; each names the file and,
/// where it is one field, the field.
#[derive(Debug, thiserror::Error)]
pub enum HfConfigError {
    /// A field that is missing, malformed or unsupported.
    #[error("{}: field `{field}`: {message}", path.display())]
    BadConfigField {
        path: PathBuf,
        field: String,
        message: String,
    },
    /// Not valid JSON, or not an object of the expected shape.
    #[error("{}: {message}", path.display())]
    BadConfigJson { path: PathBuf, message: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HfRopeParameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// The legacy spelling of `rope_type`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub legacy_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_fast: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta_slow: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mscale_all_dim: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_factor: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_factor: Option<Vec<f64>>,
}

/// A `config.json` of `LlamaForCausalLM`, `MistralForCausalLM` or `Qwen2ForCausalLM`. Defaults
/// are `LlamaConfig`'s (the architecture's own keys are read by `hf_architecture` with that
/// architecture's defaults); keys flotilla does not use are ignored on reading. Convert with `ModelConfig::try_from(&hf)` (which rejects what
/// the architecture does not implement) and `HfLlamaConfig::from(&model_config)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HfLlamaConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architectures: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// The MLP's activation (absent: the architecture's, `silu` but for Gemma).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Gemma's spelling of `hidden_act`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_activation: Option<String>,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_initializer_range")]
    pub initializer_range: f64,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Top-level `rope_theta` (transformers < 5 and most Hub checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Legacy scaling dict (transformers < 5).
    #[serde(default)]
    pub rope_scaling: Option<HfRopeParameters>,
    /// transformers ≥ 5: `rope_type`, `rope_theta` and the scaling values together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<HfRopeParameters>,
    /// Phi-3/4's fraction of each head the rotary embeddings rotate (transformers 5 also
    /// writes it into `rope_parameters`, which wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_factor: Option<f64>,
    /// Phi-3's pretraining context, read when `rope_scaling` does not give its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama's biases on q/k/v/o_proj (written for Llama only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// Mistral's and Qwen2's window: absent (`None`; the architecture's default applies),
    /// `null` (`Some(None)`: no window) or a size.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub sliding_window: Option<Option<usize>>,
    /// Qwen2: whether the window is used at all, and from which layer on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window_layers: Option<usize>,
    /// transformers ≥ 5's per-layer `full_attention` / `sliding_attention` (Qwen2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    #[serde(default)]
    pub attention_dropout: f64,
    /// Gemma: queries scaled by `query_pre_attn_scalar ** -0.5` (absent: 256). Written as an
    /// integer when it is one (transformers' config class checks that it is).
    #[serde(
        default,
        serialize_with = "whole_as_integer",
        skip_serializing_if = "Option::is_none"
    )]
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma's soft-capping of attention scores and logits: absent (the architecture's
    /// default: Gemma 2's 50 and 30, none for Gemma 3), `null` (none) or the cap.
    #[serde(
        default,
        deserialize_with = "present_f64",
        skip_serializing_if = "Option::is_none"
    )]
    pub attn_logit_softcapping: Option<Option<f64>>,
    #[serde(
        default,
        deserialize_with = "present_f64",
        skip_serializing_if = "Option::is_none"
    )]
    pub final_logit_softcapping: Option<Option<f64>>,
    /// Gemma 3: the rope theta of its sliding-window layers (absent: 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_local_base_freq: Option<f64>,
    /// Gemma 3: one global layer every this many (absent: 6), when `layer_types` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_pattern: Option<usize>,
    /// SmolLM3: which layers apply rotary embeddings (1) and which none (0), and how often a
    /// layer has none when the list is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_rope_layers: Option<Vec<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_rope_layer_interval: Option<usize>,
    /// Gemma: an encoder's attention, refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_bidirectional_attention: Option<bool>,
    /// Mixtral: experts per layer, and the noise on the router's input in training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_local_experts: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_jitter_noise: Option<f64>,
    /// Qwen3-MoE: experts per layer, their MLP width, top-k renormalisation, which layers are
    /// sparse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_intermediate_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_topk_prob: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decoder_sparse_step: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// Both: experts per token, and the auxiliary load-balancing loss (on with
    /// `output_router_logits`, weighted by `router_aux_loss_coef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_experts_per_tok: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_router_logits: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_aux_loss_coef: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<serde_json::Value>,
    /// Weight dtype (`float32`, `bfloat16`, `float16`); transformers ≥ 5 writes `dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_cache: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers_version: Option<String>,
}

/// A key that is present: `null` is `Some(None)`, unlike an absent key (`None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<usize>>, D::Error> {
    Option::<usize>::deserialize(d).map(Some)
}

/// A number written as an integer when it is whole.
fn whole_as_integer<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) if x.fract() == 0.0 && x.abs() < 9e15 => s.serialize_some(&(*x as i64)),
        other => other.serialize(s),
    }
}

/// [`present`] for a number.
fn present_f64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// Gemma 3's default rope thetas: its global layers' and its sliding layers'.
const GEMMA3_THETAS: (f64, f64) = (1_000_000.0, 10_000.0);
fn default_max_positions() -> usize {
    2048
}
fn default_initializer_range() -> f64 {
    0.02
}
fn default_eps() -> f64 {
    1e-6
}

/// Where `ModelConfig::try_from(&HfLlamaConfig)` errors say the config came from; the loader
/// replaces it with the real path.
const CONFIG_JSON: &str = "config.json";

fn bad(field: &str, message: impl Into<String>) -> HfConfigError {
    HfConfigError::BadConfigField {
        path: PathBuf::from(CONFIG_JSON),
        field: field.to_string(),
        message: message.into(),
    }
}

impl HfLlamaConfig {
    /// Parses a `config.json` text; errors quote the offending line.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, HfConfigError> {
        let quoted = |e: serde_json::Error| {
            let line = text
                .lines()
                .nth(e.line().saturating_sub(1))
                .unwrap_or("")
                .trim();
            let message = if line.is_empty() || e.line() == 0 {
                e.to_string()
            } else {
                format!("{e} (`{line}`)")
            };
            HfConfigError::BadConfigJson {
                path: path.to_path_buf(),
                message,
            }
        };
        let parsed: serde_json::Value = serde_json::from_str(text).map_err(quoted)?;
        serde_json::from_value(gemma3_rope_flattened(parsed)).map_err(|e| {
            // The same error read from the text itself names its line.
            match serde_json::from_str::<HfLlamaConfig>(text) {
                Err(e) => quoted(e),
                Ok(_) => HfConfigError::BadConfigJson {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                },
            }
        })
    }

    /// The weight dtype the config declares (`dtype`, else `torch_dtype`), as written.
    pub fn declared_dtype(&self) -> Option<&str> {
        self.dtype.as_deref().or(self.torch_dtype.as_deref())
    }
}

/// A Gemma 3 `config.json` with its rope as the other architectures have theirs: the per-layer
/// `rope_parameters` of transformers 5 (`{"full_attention": {...}, "sliding_attention":
/// {...}}`) become the global layers' `rope_parameters` and the sliding layers'
/// `rope_local_base_freq`, and the default thetas of `Gemma3TextConfig` fill what is absent.
fn gemma3_rope_flattened(mut config: serde_json::Value) -> serde_json::Value {
    let Some(map) = config.as_object_mut() else {
        return config;
    };
    if map.get("model_type").and_then(|t| t.as_str()) != Some("gemma3_text") {
        return config;
    }
    let nested = map
        .get("rope_parameters")
        .and_then(|p| p.as_object())
        .filter(|p| p.contains_key("full_attention") || p.contains_key("sliding_attention"))
        .cloned();
    if let Some(nested) = nested {
        let local = nested
            .get("sliding_attention")
            .and_then(|p| p.get("rope_theta"))
            .cloned();
        match nested.get("full_attention") {
            Some(full) => map.insert("rope_parameters".into(), full.clone()),
            None => map.remove("rope_parameters"),
        };
        if let Some(local) = local {
            map.insert("rope_local_base_freq".into(), local);
        }
    }
    let has_theta = map.contains_key("rope_theta")
        || map
            .get("rope_parameters")
            .and_then(|p| p.get("rope_theta"))
            .is_some();
    if !has_theta {
        map.insert("rope_theta".into(), GEMMA3_THETAS.0.into());
    }
    map.entry("rope_local_base_freq")
        .or_insert(GEMMA3_THETAS.1.into());
    config
}

impl TryFrom<&HfLlamaConfig> for ModelConfig {
    type Error = HfConfigError;

    fn try_from(hf: &HfLlamaConfig) -> Result<Self, HfConfigError> {
        // The architecture's own keys, read from the keys as written (absent stays absent).
        let keys = match serde_json::to_value(hf) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let arch = hf_architecture(&keys).map_err(|e| bad(&e.field, e.message))?;
        let model_type = arch.model_type.unwrap_or(ModelType::Llama);
        let (act_field, act) = match (&hf.hidden_activation, &hf.hidden_act) {
            (Some(a), _) if model_type.is_gemma() => ("hidden_activation", Some(a)),
            (_, a) => ("hidden_act", a.as_ref()),
        };
        let wanted = model_type.activation();
        if let Some(act) = act.filter(|a| a.as_str() != wanted) {
            return Err(bad(
                act_field,
                format!(
                    "`{act}` is not supported; {} uses `{wanted}`",
                    model_type.display_name()
                ),
            ));
        }
        if hf.num_attention_heads == 0
            || (arch.head_dim.is_none() && !hf.hidden_size.is_multiple_of(hf.num_attention_heads))
        {
            return Err(bad(
                "num_attention_heads",
                format!(
                    "{} does not divide hidden_size {} (and there is no head_dim)",
                    hf.num_attention_heads, hf.hidden_size
                ),
            ));
        }
        let implied = hf.hidden_size / hf.num_attention_heads;
        let head_dim = arch.head_dim.filter(|d| *d != implied);
        let gemma = model_type.is_gemma();
        let (attn_cap, final_cap) = match model_type {
            ModelType::Gemma2 => (Some(50.0), Some(30.0)),
            _ => (None, None),
        };
        let softcap = |v: Option<Option<f64>>, default: Option<f64>, field: &str| match v
            .unwrap_or(default)
        {
            Some(c) if c.is_nan() || c <= 0.0 => Err(bad(field, format!("{c} must be positive"))),
            c => Ok(c.filter(|_| gemma)),
        };
        let attn_logit_softcapping = softcap(
            hf.attn_logit_softcapping,
            attn_cap,
            "attn_logit_softcapping",
        )?;
        let final_logit_softcapping = softcap(
            hf.final_logit_softcapping,
            final_cap,
            "final_logit_softcapping",
        )?;
        let query_pre_attn_scalar = gemma.then(|| hf.query_pre_attn_scalar.unwrap_or(256.0));
        // The padding id (`padding_idx` of the embedding): the config's, else its class's
        // default where that is a token of the vocabulary.
        let pad_token_id = match &hf.pad_token_id {
            Some(serde_json::Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                bad(
                    "pad_token_id",
                    format!("expected a token id or null, got {v}"),
                )
            })? as usize),
            None => match model_type {
                ModelType::Gemma2 | ModelType::Gemma3 => Some(0),
                ModelType::Phi3 => Some(32000),
                ModelType::SmolLm3 => Some(128004),
                _ => None,
            }
            .filter(|p| *p < hf.vocab_size),
        };
        if let Some(p) = pad_token_id.filter(|p| *p >= hf.vocab_size) {
            return Err(bad(
                "pad_token_id",
                format!("{p} is not below vocab_size {}", hf.vocab_size),
            ));
        }
        let rope_local_base_freq = (model_type == ModelType::Gemma3)
            .then(|| hf.rope_local_base_freq.unwrap_or(GEMMA3_THETAS.1));

        let rope = hf_rope(hf).map_err(|(field, message)| bad(&field, message))?;
        let moe = hf_moe(hf, model_type).map_err(|(field, message)| bad(field, message))?;

        let config = ModelConfig {
            name: "hf".into(),
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_hidden_layers: hf.num_hidden_layers,
            num_attention_heads: hf.num_attention_heads,
            num_key_value_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            max_position_embeddings: hf.max_position_embeddings,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: rope.rope_theta,
            rope_scaling: rope.rope_scaling,
            partial_rotary_factor: rope.partial_rotary_factor,
            tie_word_embeddings: hf.tie_word_embeddings,
            initializer_range: hf.initializer_range,
            init_from: None,
            model_type: arch.model_type,
            attention_bias: arch.attention_bias,
            sliding_window: arch.sliding_window,
            head_dim,
            layer_types: arch.layer_types,
            no_rope_layers: arch.no_rope_layers,
            pad_token_id,
            query_pre_attn_scalar,
            attn_logit_softcapping,
            final_logit_softcapping,
            rope_local_base_freq,
            moe,
        };
        check_hf_rope(&config, rope.field).map_err(|(field, message)| bad(&field, message))?;
        if let Some(problem) = config.partial_rotary_problem() {
            return Err(bad("partial_rotary_factor", problem));
        }
        Ok(config)
    }
}

impl From<&ModelConfig> for HfLlamaConfig {
    /// The `config.json` transformers writes for this architecture (in the legacy
    /// `rope_theta` / `rope_scaling` form, which transformers 4 and 5 both read): its class and
    /// `model_type`, `attention_bias`, the sliding window (`null`: none) and each layer's
    /// attention (`layer_types`), Gemma's scalars and soft-capping.
    fn from(c: &ModelConfig) -> Self {
        let arch = c.architecture();
        let llama = arch == ModelType::Llama;
        let qwen = matches!(arch, ModelType::Qwen2 | ModelType::Qwen3);
        let smol = arch == ModelType::SmolLm3;
        let gemma = arch.is_gemma();
        let biased = !matches!(
            arch,
            ModelType::Mistral | ModelType::Qwen2 | ModelType::Phi3 | ModelType::Mixtral
        );
        // Each layer's attention, written out whenever the layers differ or the architecture
        // would otherwise pick its own pattern (Gemma).
        let layer_types = (c.layer_types.is_some()
            || ((gemma || smol) && c.sliding_window.is_some()))
        .then(|| {
            (0..c.num_hidden_layers)
                .map(|i| match c.layer_window(i) {
                    Some(_) => LayerType::Sliding.as_str().to_string(),
                    None => LayerType::Full.as_str().to_string(),
                })
                .collect()
        });
        let mut hf = HfLlamaConfig {
            architectures: Some(vec![arch.hf_class().into()]),
            model_type: Some(arch.as_str().into()),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: Some(c.num_key_value_heads),
            head_dim: Some(c.head_dim()),
            hidden_act: (!gemma).then(|| arch.activation().into()),
            hidden_activation: gemma.then(|| arch.activation().into()),
            max_position_embeddings: c.max_position_embeddings,
            initializer_range: c.initializer_range,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: Some(c.rope_theta),
            rope_scaling: hf_rope_scaling(c),
            rope_parameters: None,
            partial_rotary_factor: c.partial_rotary_factor,
            original_max_position_embeddings: hf_phi3_original_max(c),
            tie_word_embeddings: c.tie_word_embeddings,
            attention_bias: biased.then_some(c.attention_bias == Some(true)),
            mlp_bias: (llama || smol).then_some(false),
            sliding_window: (!llama).then_some(c.sliding_window),
            use_sliding_window: (qwen || smol || arch == ModelType::Qwen3Moe)
                .then_some(c.sliding_window.is_some()),
            max_window_layers: (qwen && c.sliding_window.is_some()).then_some(0),
            no_rope_layers: smol.then(|| {
                (0..c.num_hidden_layers)
                    .map(|i| u64::from(c.layer_has_rope(i)))
                    .collect()
            }),
            no_rope_layer_interval: None,
            layer_types,
            attention_dropout: 0.0,
            query_pre_attn_scalar: c.query_pre_attn_scalar.filter(|_| gemma),
            attn_logit_softcapping: gemma.then_some(c.attn_logit_softcapping),
            final_logit_softcapping: gemma.then_some(c.final_logit_softcapping),
            rope_local_base_freq: c.rope_local_base_freq,
            sliding_window_pattern: None,
            use_bidirectional_attention: None,
            bos_token_id: None,
            eos_token_id: None,
            pad_token_id: Some(
                c.pad_token_id
                    .map_or(serde_json::Value::Null, serde_json::Value::from),
            ),
            torch_dtype: None,
            dtype: None,
            use_cache: Some(true),
            transformers_version: None,
            num_local_experts: None,
            router_jitter_noise: None,
            num_experts: None,
            moe_intermediate_size: None,
            norm_topk_prob: None,
            decoder_sparse_step: None,
            mlp_only_layers: None,
            num_experts_per_tok: None,
            output_router_logits: None,
            router_aux_loss_coef: None,
        };
        write_hf_moe(c, &mut hf);
        hf
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HfConfigError + '_ {
    move |source| HfConfigError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads and parses `dir/config.json`.
pub fn read_hf_config(dir: impl AsRef<Path>) -> Result<HfLlamaConfig, HfConfigError> {
    let path = dir.as_ref().join(CONFIG_JSON);
    let text = fs::read_to_string(&path).map_err(io_err(&path))?;
    HfLlamaConfig::from_json(&text, &path)
}

/// The `ModelConfig` of a Hugging Face directory: its `config.json`, named after the directory,
/// with `init_from` pointing at it.
pub fn read_model_config(dir: impl AsRef<Path>) -> Result<ModelConfig, HfConfigError> {
    let dir = dir.as_ref();
    let hf = read_hf_config(dir)?;
    let mut config = ModelConfig::try_from(&hf).map_err(|e| match e {
        HfConfigError::BadConfigField { field, message, .. } => HfConfigError::BadConfigField {
            path: dir.join(CONFIG_JSON),
            field,
            message,
        },
        e => e,
    })?;
    config.name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "hf".into());
    config.init_from = Some(dir.to_string_lossy().into_owned());
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(extra: &str) -> String {
        format!(
            r#"{{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4{extra}}}"#
        )
    }

    fn convert(text: &str) -> Result<ModelConfig, HfConfigError> {
        let hf = HfLlamaConfig::from_json(text, Path::new("x/config.json"))?;
        ModelConfig::try_from(&hf)
    }

    #[test]
    fn config_defaults_and_rope_forms() {
        let c = convert(&json("")).unwrap();
        assert_eq!(c.num_key_value_heads, 4);
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert!(!c.tie_word_embeddings && c.rope_scaling.is_none());

        let legacy = convert(&json(
            r#", "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}"#,
        ))
        .unwrap();
        let new = convert(&json(
            r#", "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}"#,
        ))
        .unwrap();
        assert_eq!(legacy, new);
        assert_eq!(new.rope_theta, 500000.0);
        assert_eq!(new.rope_scaling.as_ref().unwrap().factor, Some(8.0));

        let plain = convert(&json(
            r#", "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}"#,
        ))
        .unwrap();
        assert_eq!((plain.rope_theta, plain.rope_scaling), (1000.0, None));
    }

    #[test]
    fn config_round_trips_through_hf() {
        let c = convert(&json(
            r#", "num_key_value_heads": 2, "tie_word_embeddings": true,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#,
        ))
        .unwrap();
        let hf = HfLlamaConfig::from(&c);
        let text = serde_json::to_string(&hf).unwrap();
        assert!(
            text.contains(r#""architectures":["LlamaForCausalLM"]"#),
            "{text}"
        );
        assert_eq!(convert(&text).unwrap(), c);
    }

    #[test]
    fn mistral_and_qwen2_round_trip_through_hf() {
        let m = convert(&json(r#", "model_type": "mistral", "sliding_window": 32"#)).unwrap();
        assert_eq!(
            (m.model_type, m.sliding_window, m.attention_biases().qkv),
            (Some(ModelType::Mistral), Some(32), false)
        );
        let text = serde_json::to_string(&HfLlamaConfig::from(&m)).unwrap();
        assert!(
            text.contains(r#""architectures":["MistralForCausalLM"]"#)
                && text.contains(r#""model_type":"mistral""#)
                && text.contains(r#""sliding_window":32"#)
                && !text.contains("attention_bias"),
            "{text}"
        );
        assert_eq!(convert(&text).unwrap(), m);
        let full = convert(&json(
            r#", "model_type": "mistral", "sliding_window": null"#,
        ))
        .unwrap();
        assert_eq!(full.sliding_window, None);
        let text = serde_json::to_string(&HfLlamaConfig::from(&full)).unwrap();
        assert!(text.contains(r#""sliding_window":null"#), "{text}");
        assert_eq!(convert(&text).unwrap(), full);

        for extra in [
            r#", "model_type": "qwen2", "tie_word_embeddings": true"#,
            r#", "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 16,
               "max_window_layers": 0"#,
        ] {
            let q = convert(&json(extra)).unwrap();
            assert_eq!(q.model_type, Some(ModelType::Qwen2));
            assert!(q.attention_biases().qkv && !q.attention_biases().o);
            let text = serde_json::to_string(&HfLlamaConfig::from(&q)).unwrap();
            assert!(
                text.contains(r#""architectures":["Qwen2ForCausalLM"]"#),
                "{text}"
            );
            assert_eq!(convert(&text).unwrap(), q, "{text}");
        }

        let biased = convert(&json(r#", "attention_bias": true"#)).unwrap();
        assert_eq!(biased.attention_bias, Some(true));
        assert!(biased.attention_biases().o);
        let text = serde_json::to_string(&HfLlamaConfig::from(&biased)).unwrap();
        assert!(text.contains(r#""attention_bias":true"#), "{text}");
        assert_eq!(convert(&text).unwrap(), biased);
    }

    #[test]
    fn config_errors_name_the_field() {
        let err = convert(&json(r#", "hidden_act": "gelu""#))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`hidden_act`") && err.contains("gelu"),
            "{err}"
        );
        // A head size of its own (Mistral Nemo's 128 for 5120 / 32 = 160).
        let nemo = convert(&json(r#", "head_dim": 32"#)).unwrap();
        assert_eq!((nemo.head_dim, nemo.head_dim()), (Some(32), 32));
        let err = convert(&json(
            r#", "hidden_act": "gelu_pytorch_tanh", "model_type": "qwen3""#,
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("Qwen3 uses `silu`"), "{err}");
        let err = convert(&json(
            r#", "rope_scaling": {"rope_type": "ntk", "factor": 2.0}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rope_scaling.rope_type") && err.contains("`ntk`"),
            "{err}"
        );
        let err = convert(&json(
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 2.0}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("rope_scaling.low_freq_factor"), "{err}");
        let err = convert(&json(r#", "model_type": "gemma""#))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`model_type`") && err.contains("gemma"),
            "{err}"
        );
        let err = convert(&json(r#", "mlp_bias": true"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`mlp_bias`"), "{err}");
        let text = "{\n  \"vocab_size\": 100.5,\n  \"hidden_size\": 64\n}";
        let err = convert(text).unwrap_err().to_string();
        assert!(
            err.starts_with("x/config.json") && err.contains("\"vocab_size\": 100.5"),
            "{err}"
        );
        let err = convert(r#"{"vocab_size": 100}"#).unwrap_err().to_string();
        assert!(err.contains("missing field `hidden_size`"), "{err}");
    }
}
