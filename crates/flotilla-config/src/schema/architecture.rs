//! The Hugging Face architectures flotilla implements and what each adds to Llama's math:
//! `llama`, `mistral` and `qwen2` (Llama's units with biases and a sliding window), `qwen3`
//! (per-head q/k norms), `gemma2` and `gemma3_text` (Gemma's norms, GeGLU, scaled embeddings,
//! soft-capping, alternating sliding and global layers), `phi3` (q/k/v and gate/up fused into one
//! projection each, partial rotary embeddings) and `smollm3` (layers without rotary
//! embeddings). This file owns which attention
//! projections carry a bias ([`ModelConfig::attention_biases`]), each layer's attention window
//! ([`ModelConfig::layer_window`]), the per-family traits the model and the memory planner read
//! ([`ModelConfig::gemma_style`], [`ModelConfig::qk_norm`]), and [`hf_architecture`], which reads
//! them from a `config.json`: the one reading the trainer (`flotilla-train`) and the login side
//! (`flotilla-launch`'s `base_model.rs`) share.

use serde_json::{Map, Value};

use super::types::{LayerType, LoraModule, ModelConfig, ModelType};

impl ModelType {
    /// The transformers class a directory of this architecture loads as.
    pub fn hf_class(self) -> &'static str {
        match self {
            ModelType::Llama => "LlamaForCausalLM",
            ModelType::Mistral => "MistralForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
            ModelType::Qwen3 => "Qwen3ForCausalLM",
            ModelType::Gemma2 => "Gemma2ForCausalLM",
            ModelType::Gemma3 => "Gemma3ForCausalLM",
            ModelType::Phi3 => "Phi3ForCausalLM",
            ModelType::SmolLm3 => "SmolLM3ForCausalLM",
            ModelType::Mixtral => "MixtralForCausalLM",
            ModelType::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }

    /// The name people know the architecture by, for messages.
    pub fn display_name(self) -> &'static str {
        match self {
            ModelType::Llama => "Llama",
            ModelType::Mistral => "Mistral",
            ModelType::Qwen2 => "Qwen2",
            ModelType::Qwen3 => "Qwen3",
            ModelType::Gemma2 => "Gemma 2",
            ModelType::Gemma3 => "Gemma 3",
            ModelType::Phi3 => "Phi-3",
            ModelType::SmolLm3 => "SmolLM3",
            ModelType::Mixtral => "Mixtral",
            ModelType::Qwen3Moe => "Qwen3-MoE",
        }
    }

    /// The MLP's activation as `config.json` names it: `silu` (SwiGLU) but for Gemma's
    /// `gelu_pytorch_tanh` (GeGLU).
    pub fn activation(self) -> &'static str {
        if self.is_gemma() {
            "gelu_pytorch_tanh"
        } else {
            "silu"
        }
    }

    /// Gemma 2 and 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, ModelType::Gemma2 | ModelType::Gemma3)
    }
}

/// Which attention projections of a decoder block carry a bias (none of the MLP's ever do).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionBiases {
    /// `q_proj`, `k_proj` and `v_proj`.
    pub qkv: bool,
    /// `o_proj`.
    pub o: bool,
}

impl AttentionBiases {
    /// The bias elements of one block of `m`.
    pub fn elements(self, m: &ModelConfig) -> u64 {
        let q = (m.num_attention_heads * m.head_dim()) as u64;
        let kv = (m.num_key_value_heads * m.head_dim()) as u64;
        let qkv = if self.qkv { q + 2 * kv } else { 0 };
        let o = if self.o { m.hidden_size as u64 } else { 0 };
        qkv + o
    }
}

impl ModelConfig {
    /// The architecture (`model_type`, absent: Llama).
    pub fn architecture(&self) -> ModelType {
        self.model_type.unwrap_or(ModelType::Llama)
    }

    /// A block's linear layers (what LoRA may adapt, and `all-linear` means): Phi-3's fused
    /// ones, else Llama's seven.
    pub fn linear_modules(&self) -> &'static [LoraModule] {
        match self.architecture() {
            ModelType::Phi3 => &LoraModule::FUSED_LINEAR,
            ModelType::Mixtral => &LoraModule::MIXTRAL_LINEAR,
            ModelType::Qwen3Moe => &LoraModule::QWEN_MOE_LINEAR,
            _ => &LoraModule::LINEAR,
        }
    }

    /// Why `partial_rotary_factor` cannot be this model's: transformers rotates part of each
    /// head only in Phi-3 (its other families ignore the factor or fail on it).
    pub fn partial_rotary_problem(&self) -> Option<String> {
        match self.partial_rotary_factor {
            Some(f) if f != 1.0 && self.architecture() != ModelType::Phi3 => Some(format!(
                "{f} is Phi-3's setting: transformers rotates whole heads in {}",
                self.architecture().display_name()
            )),
            _ => None,
        }
    }

    /// Whether layer `i` applies rotary embeddings (all but SmolLM3's NoPE layers).
    pub fn layer_has_rope(&self, i: usize) -> bool {
        self.no_rope_layers
            .as_ref()
            .is_none_or(|flags| flags.get(i) != Some(&0))
    }

    /// The biases of a block's attention projections: Qwen2's on q/k/v, those of Llama, Qwen3
    /// and Gemma on q/k/v/o with `attention_bias`, none for Mistral.
    pub fn attention_biases(&self) -> AttentionBiases {
        match self.architecture() {
            ModelType::Mistral | ModelType::Phi3 | ModelType::Mixtral => AttentionBiases::default(),
            ModelType::Qwen2 => AttentionBiases {
                qkv: true,
                o: false,
            },
            ModelType::Llama
            | ModelType::Qwen3
            | ModelType::Qwen3Moe
            | ModelType::Gemma2
            | ModelType::Gemma3
            | ModelType::SmolLm3 => {
                let on = self.attention_bias == Some(true);
                AttentionBiases { qkv: on, o: on }
            }
        }
    }

    /// Gemma's conventions: RMSNorm scaled by `1 + w` in fp32, four norms a block (the
    /// attention's and the MLP's outputs normed too), embeddings scaled by `sqrt(hidden)`,
    /// GeGLU.
    pub fn gemma_style(&self) -> bool {
        self.architecture().is_gemma()
    }

    /// Whether each head's queries and keys are RMS-normed before the rotary embedding
    /// (`q_norm`, `k_norm`: Qwen3, Gemma 3).
    pub fn qk_norm(&self) -> bool {
        matches!(
            self.architecture(),
            ModelType::Qwen3 | ModelType::Qwen3Moe | ModelType::Gemma3
        )
    }

    /// The norm weights of one decoder block, in elements.
    pub fn block_norm_elements(&self) -> u64 {
        let h = self.hidden_size as u64;
        let per_block = if self.gemma_style() { 4 * h } else { 2 * h };
        let qk = if self.qk_norm() {
            2 * self.head_dim() as u64
        } else {
            0
        };
        per_block + qk
    }

    /// The attention window of layer `i` (positions a token attends to, itself included):
    /// `sliding_window` for a `sliding_attention` layer of `layer_types` (for every layer
    /// without `layer_types`), `None` for full attention.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        match &self.layer_types {
            Some(types) => match types.get(i) {
                Some(LayerType::Sliding) => self.sliding_window,
                _ => None,
            },
            None => self.sliding_window,
        }
    }
}

/// What a `config.json` says about the architecture, as [`ModelConfig`] carries it:
/// `model_type` (`None` for Llama), `attention_bias` (`Some(true)` only with biases), the
/// sliding window and which layers use it (`layer_types`, only when layers differ), and the
/// head size when the architecture sets its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfArchitecture {
    pub model_type: Option<ModelType>,
    pub attention_bias: Option<bool>,
    pub sliding_window: Option<usize>,
    pub layer_types: Option<Vec<LayerType>>,
    /// SmolLM3's `no_rope_layers` (1: rotary embeddings, 0: none), when some layer has none.
    pub no_rope_layers: Option<Vec<usize>>,
    /// `head_dim` as the config has it, else the architecture's default (Qwen3 128, Gemma
    /// 256); `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
}

/// A `config.json` field flotilla cannot take: the field's name and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct HfFieldError {
    pub field: String,
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> HfFieldError {
    HfFieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// transformers' default `sliding_window` of the configs that have one, when the key is
/// absent.
const DEFAULT_WINDOW: usize = 4096;
/// `Qwen2Config`'s and `Qwen3Config`'s default `max_window_layers`.
const DEFAULT_MAX_WINDOW_LAYERS: usize = 28;
/// What `model_type` may be.
const KNOWN_TYPES: &str = "`llama`, `mistral`, `qwen2`, `qwen3`, `gemma2`, `gemma3_text`, \
     `phi3`, `smollm3`, `mixtral` and `qwen3_moe`";

/// Reads the architecture of a `config.json` object as transformers does: `model_type`
/// (absent: `llama`; others are refused, a Gemma 3 multimodal checkpoint naming what to do),
/// `attention_bias` (`mlp_bias` is refused), the sliding window (Mistral's on every layer,
/// absent: 4096, null: none; Qwen2's and Qwen3's with `use_sliding_window`, on the layers
/// `layer_types` or `max_window_layers` make sliding; Gemma's on the layers `layer_types`
/// names, by default every second layer for Gemma 2 and five of six for Gemma 3), and the
/// head size.
pub fn hf_architecture(config: &Map<String, Value>) -> Result<HfArchitecture, HfFieldError> {
    let model_type =
        match config.get("model_type") {
            None | Some(Value::Null) => ModelType::Llama,
            Some(Value::String(t)) => match t.as_str() {
                "llama" => ModelType::Llama,
                "mistral" => ModelType::Mistral,
                "qwen2" => ModelType::Qwen2,
                "qwen3" => ModelType::Qwen3,
                "gemma2" => ModelType::Gemma2,
                "gemma3_text" => ModelType::Gemma3,
                "phi3" => ModelType::Phi3,
                "smollm3" => ModelType::SmolLm3,
                "mixtral" => ModelType::Mixtral,
                "qwen3_moe" => ModelType::Qwen3Moe,
                "gemma3" => return Err(refuse(
                    "model_type",
                    "`gemma3` is a Gemma 3 image-text checkpoint (Gemma3ForConditionalGeneration: \
                    its language model under `text_config`, its weights under \
                    `language_model.`); flotilla fine-tunes the text model: save it alone \
                    first, e.g. `Gemma3ForCausalLM.from_pretrained(DIR).save_pretrained(OUT)` \
                    in transformers, and pass OUT",
                )),
                other => {
                    return Err(refuse(
                        "model_type",
                        format!("`{other}` is not supported; flotilla implements {KNOWN_TYPES}"),
                    ))
                }
            },
            Some(v) => return Err(refuse("model_type", format!("expected a string, got {v}"))),
        };
    if flag(config, "mlp_bias")? {
        return Err(refuse(
            "mlp_bias",
            "biases on the MLP are not supported (only on the attention projections)",
        ));
    }
    if model_type.is_gemma() && flag(config, "use_bidirectional_attention")? {
        return Err(refuse(
            "use_bidirectional_attention",
            "bidirectional attention (an encoder) is not a causal language model; flotilla \
            trains causal models",
        ));
    }
    let layers = config
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let window_on = |sliding: Vec<bool>, window: Option<usize>| -> LayerWindows {
        let count = sliding.iter().filter(|s| **s).count();
        match window {
            Some(w) if count == sliding.len() && count > 0 => (Some(w), None),
            Some(w) if count > 0 => {
                let types = sliding
                    .iter()
                    .map(|s| {
                        if *s {
                            LayerType::Sliding
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect();
                (Some(w), Some(types))
            }
            _ => (None, None),
        }
    };
    let attention_bias = match model_type {
        ModelType::Mistral | ModelType::Qwen2 | ModelType::Phi3 | ModelType::Mixtral => None,
        _ => flag(config, "attention_bias")?.then_some(true),
    };
    let (sliding_window, layer_types) = match model_type {
        ModelType::Llama => (None, None),
        ModelType::Mistral => (size(config, "sliding_window", Some(DEFAULT_WINDOW))?, None),
        // Phi-3's and Mixtral's window (absent: none) is every layer's.
        ModelType::Phi3 | ModelType::Mixtral => (size(config, "sliding_window", None)?, None),
        // Qwen3-MoE's, with use_sliding_window, too (`Qwen3MoeConfig` has no per-layer types).
        ModelType::Qwen3Moe => {
            if flag(config, "use_sliding_window")? {
                (size(config, "sliding_window", Some(DEFAULT_WINDOW))?, None)
            } else {
                (None, None)
            }
        }
        // SmolLM3: with use_sliding_window, the layers `layer_types` names, by default those
        // without rotary embeddings.
        ModelType::SmolLm3 => {
            let window = size(config, "sliding_window", None)?;
            if !flag(config, "use_sliding_window")? || window.is_none() {
                (None, None)
            } else {
                let sliding = match layer_types_of(config)? {
                    Some(types) => types,
                    None => no_rope_layers(config, layers)?
                        .iter()
                        .map(|r| *r == 0)
                        .collect(),
                };
                window_on(sliding, window)
            }
        }
        ModelType::Qwen2 | ModelType::Qwen3 => {
            if !flag(config, "use_sliding_window")? {
                (None, None)
            } else {
                let window = size(config, "sliding_window", Some(DEFAULT_WINDOW))?;
                let sliding = match layer_types_of(config)? {
                    Some(types) => types,
                    None => {
                        let first = match config.get("max_window_layers") {
                            None | Some(Value::Null) => DEFAULT_MAX_WINDOW_LAYERS,
                            Some(v) => v.as_u64().ok_or_else(|| {
                                refuse(
                                    "max_window_layers",
                                    format!("expected a non-negative integer, got {v}"),
                                )
                            })? as usize,
                        };
                        (0..layers).map(|i| i >= first).collect()
                    }
                };
                window_on(sliding, window)
            }
        }
        ModelType::Gemma2 | ModelType::Gemma3 => {
            let window = size(config, "sliding_window", Some(DEFAULT_WINDOW))?;
            let pattern = if model_type == ModelType::Gemma2 {
                2
            } else {
                match config.get("sliding_window_pattern") {
                    Some(v) => v.as_u64().filter(|p| *p > 0).ok_or_else(|| {
                        refuse(
                            "sliding_window_pattern",
                            format!("expected a positive integer, got {v}"),
                        )
                    })? as usize,
                    None => 6,
                }
            };
            let sliding = match layer_types_of(config)? {
                Some(types) => types,
                None => (0..layers).map(|i| (i + 1) % pattern != 0).collect(),
            };
            window_on(sliding, window)
        }
    };
    let head_dim = match size(config, "head_dim", None)? {
        Some(d) => Some(d),
        None => match model_type {
            ModelType::Qwen3 => Some(128),
            ModelType::Gemma2 | ModelType::Gemma3 => Some(256),
            _ => None,
        },
    };
    let no_rope = match model_type {
        ModelType::SmolLm3 => Some(no_rope_layers(config, layers)?).filter(|f| f.contains(&0)),
        _ => None,
    };
    Ok(HfArchitecture {
        model_type: (model_type != ModelType::Llama).then_some(model_type),
        attention_bias,
        sliding_window,
        layer_types,
        no_rope_layers: no_rope,
        head_dim,
    })
}

/// SmolLM3's `no_rope_layers` (1: rotary embeddings, 0: none), as `SmolLM3Config` fills it
/// when absent: none every `no_rope_layer_interval` (4) layers.
fn no_rope_layers(config: &Map<String, Value>, layers: usize) -> Result<Vec<usize>, HfFieldError> {
    match config.get("no_rope_layers") {
        None | Some(Value::Null) => {
            let interval = match config.get("no_rope_layer_interval") {
                None | Some(Value::Null) => 4,
                Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    refuse(
                        "no_rope_layer_interval",
                        format!("expected a positive integer, got {v}"),
                    )
                })? as usize,
            };
            Ok((0..layers)
                .map(|i| usize::from((i + 1) % interval != 0))
                .collect())
        }
        Some(Value::Array(flags)) if flags.len() == layers => flags
            .iter()
            .map(|f| match f.as_u64() {
                Some(b @ (0 | 1)) => Ok(b as usize),
                _ => Err(refuse(
                    "no_rope_layers",
                    format!("`{f}` is not 0 (no rotary embeddings) or 1"),
                )),
            })
            .collect(),
        Some(v) => Err(refuse(
            "no_rope_layers",
            format!("expected a list of {layers} zeros and ones, got {v}"),
        )),
    }
}

/// The window all layers share, and each layer's kind when they differ.
type LayerWindows = (Option<usize>, Option<Vec<LayerType>>);

/// `layer_types` as a list of "is sliding", when present (one entry per layer).
fn layer_types_of(config: &Map<String, Value>) -> Result<Option<Vec<bool>>, HfFieldError> {
    let layers = config
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    match config.get("layer_types") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(types)) if types.len() != layers => Err(refuse(
            "layer_types",
            format!(
                "{} entries for {layers} layers (num_hidden_layers)",
                types.len()
            ),
        )),
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(refuse(
                    "layer_types",
                    format!("`{t}` is not `full_attention` or `sliding_attention`"),
                )),
            })
            .collect::<Result<Vec<bool>, _>>()
            .map(Some),
        Some(v) => Err(refuse("layer_types", format!("expected a list, got {v}"))),
    }
}

/// A true/false key (absent or null: false).
fn flag(config: &Map<String, Value>, key: &str) -> Result<bool, HfFieldError> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(refuse(key, format!("expected true or false, got {v}"))),
    }
}

/// A positive size: `absent` when the key is absent, `None` when it is null.
fn size(
    config: &Map<String, Value>,
    key: &str,
    absent: Option<usize>,
) -> Result<Option<usize>, HfFieldError> {
    match config.get(key) {
        None => Ok(absent),
        Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(0) => Err(refuse(key, "must be positive")),
            Some(n) => Ok(Some(n as usize)),
            None => Err(refuse(key, format!("expected a positive integer, got {v}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(json: &str) -> Result<HfArchitecture, HfFieldError> {
        let v: Value = serde_json::from_str(json).unwrap();
        hf_architecture(v.as_object().unwrap())
    }

    #[test]
    fn reads_each_architecture_as_transformers_does() {
        let llama = arch(r#"{"num_hidden_layers": 2}"#).unwrap();
        assert_eq!(
            llama,
            HfArchitecture {
                model_type: None,
                attention_bias: None,
                sliding_window: None,
                layer_types: None,
                no_rope_layers: None,
                head_dim: None,
            }
        );
        let biased = arch(r#"{"model_type": "llama", "attention_bias": true}"#).unwrap();
        assert_eq!(biased.attention_bias, Some(true));
        let err = arch(r#"{"mlp_bias": true}"#).unwrap_err().to_string();
        assert!(err.starts_with("field `mlp_bias`"), "{err}");

        let mistral = arch(r#"{"model_type": "mistral"}"#).unwrap();
        assert_eq!(mistral.model_type, Some(ModelType::Mistral));
        assert_eq!(
            mistral.sliding_window,
            Some(4096),
            "MistralConfig's default"
        );
        let full = arch(r#"{"model_type": "mistral", "sliding_window": null}"#).unwrap();
        assert_eq!(full.sliding_window, None);
        let w = arch(r#"{"model_type": "mistral", "sliding_window": 32, "attention_bias": true}"#)
            .unwrap();
        assert_eq!((w.sliding_window, w.attention_bias), (Some(32), None));

        let q = r#""model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 64"#;
        let off = arch(&format!("{{{q}}}")).unwrap();
        assert_eq!(
            (off.model_type, off.sliding_window),
            (Some(ModelType::Qwen2), None)
        );
        let all = arch(&format!(
            r#"{{{q}, "use_sliding_window": true, "max_window_layers": 0}}"#
        ))
        .unwrap();
        assert_eq!(all.sliding_window, Some(64));
        let none = arch(&format!(r#"{{{q}, "use_sliding_window": true}}"#)).unwrap();
        assert_eq!(none.sliding_window, None, "max_window_layers 28 > 4 layers");
        let mixed = arch(&format!(
            r#"{{{q}, "use_sliding_window": true, "max_window_layers": 2}}"#
        ))
        .unwrap();
        use LayerType::{Full, Sliding};
        assert_eq!(mixed.sliding_window, Some(64));
        assert_eq!(mixed.layer_types, Some(vec![Full, Full, Sliding, Sliding]));
        let typed = arch(&format!(
            r#"{{{q}, "use_sliding_window": true, "max_window_layers": 2,
                "layer_types": ["full_attention", "full_attention", "full_attention",
                                "full_attention"]}}"#
        ))
        .unwrap();
        assert_eq!(typed.sliding_window, None, "layer_types wins");

        let q3 = arch(r#"{"model_type": "qwen3", "num_hidden_layers": 2}"#).unwrap();
        assert_eq!(
            (q3.head_dim, q3.sliding_window, q3.attention_bias),
            (Some(128), None, None),
            "Qwen3Config's head_dim"
        );
        let g2 = arch(r#"{"model_type": "gemma2", "num_hidden_layers": 4}"#).unwrap();
        assert_eq!((g2.head_dim, g2.sliding_window), (Some(256), Some(4096)));
        assert_eq!(
            g2.layer_types,
            Some(vec![Sliding, Full, Sliding, Full]),
            "Gemma2Config: every second layer global"
        );
        let g3 = arch(
            r#"{"model_type": "gemma3_text", "num_hidden_layers": 7, "head_dim": 16,
                          "sliding_window": 8}"#,
        )
        .unwrap();
        assert_eq!((g3.head_dim, g3.sliding_window), (Some(16), Some(8)));
        let mut want = vec![Sliding; 7];
        want[5] = Full;
        assert_eq!(
            g3.layer_types,
            Some(want),
            "five local layers to one global"
        );
        let err = arch(r#"{"model_type": "gemma3"}"#).unwrap_err().to_string();
        assert!(
            err.contains("image-text") && err.contains("Gemma3ForCausalLM"),
            "{err}"
        );
        let err = arch(
            r#"{"model_type": "gemma2", "num_hidden_layers": 3,
                           "layer_types": ["full_attention"]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("1 entries for 3 layers"), "{err}");

        let phi =
            arch(r#"{"model_type": "phi3", "num_hidden_layers": 2, "sliding_window": 7}"#).unwrap();
        assert_eq!((phi.sliding_window, phi.attention_bias), (Some(7), None));
        let smol = arch(r#"{"model_type": "smollm3", "num_hidden_layers": 5}"#).unwrap();
        assert_eq!(
            smol.no_rope_layers,
            Some(vec![1, 1, 1, 0, 1]),
            "SmolLM3Config: no rotary embeddings every fourth layer"
        );
        let windowed = arch(
            r#"{"model_type": "smollm3", "num_hidden_layers": 4, "use_sliding_window": true,
                "sliding_window": 3, "no_rope_layers": [1, 0, 1, 1]}"#,
        )
        .unwrap();
        assert_eq!(windowed.layer_types, Some(vec![Full, Sliding, Full, Full]));

        let err = arch(r#"{"model_type": "gemma"}"#).unwrap_err().to_string();
        assert!(
            err.contains("`gemma` is not supported") && err.contains("`qwen2`"),
            "{err}"
        );
        let err = arch(r#"{"model_type": "mistral", "sliding_window": 0}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sliding_window") && err.contains("positive"),
            "{err}"
        );
    }
}
