//! The Hugging Face architectures flotilla implements (`llama`, `mistral`, `qwen2`) and what
//! each adds to Llama's math: which attention projections carry a bias
//! ([`ModelConfig::attention_biases`]) and the sliding attention window, with the refusal of a
//! context longer than it ([`ModelConfig::check_window`]). [`hf_architecture`] reads these
//! from a `config.json`, the one reading the trainer (`flotilla-train`'s `model/hf.rs`) and the
//! login side (`flotilla-launch`'s `base_model.rs`) share.

use serde_json::{Map, Value};

use super::types::{ModelConfig, ModelType};

impl ModelType {
    /// The transformers class a directory of this architecture loads as.
    pub fn hf_class(self) -> &'static str {
        match self {
            ModelType::Llama => "LlamaForCausalLM",
            ModelType::Mistral => "MistralForCausalLM",
            ModelType::Qwen2 => "Qwen2ForCausalLM",
        }
    }

    /// The name people know the architecture by, for messages.
    pub fn display_name(self) -> &'static str {
        match self {
            ModelType::Llama => "Llama",
            ModelType::Mistral => "Mistral",
            ModelType::Qwen2 => "Qwen2",
        }
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

    /// The biases of a block's attention projections: Qwen2's on q/k/v, Llama's on q/k/v/o
    /// with `attention_bias`, none for Mistral.
    pub fn attention_biases(&self) -> AttentionBiases {
        match self.architecture() {
            ModelType::Llama => {
                let on = self.attention_bias == Some(true);
                AttentionBiases { qkv: on, o: on }
            }
            ModelType::Mistral => AttentionBiases::default(),
            ModelType::Qwen2 => AttentionBiases {
                qkv: true,
                o: false,
            },
        }
    }

    /// Refuses `len` positions (of `what`, e.g. `data.seq_len`) beyond the sliding window:
    /// flotilla attends to every earlier position, which is the model's attention only within
    /// the window. The message names the window, the length and the fix.
    pub fn check_window(&self, what: &str, len: usize) -> Result<(), String> {
        match self.sliding_window {
            Some(window) if len > window => Err(format!(
                "{what} = {len} exceeds the {} model's sliding window of {window} positions \
                 (sliding_window = {window}): flotilla attends to every earlier position, which \
                 is this model's attention only within the window, and does not train or \
                 generate beyond it; set {what}={window} or less",
                self.architecture().display_name()
            )),
            _ => Ok(()),
        }
    }
}

/// What a `config.json` says about the architecture, as [`ModelConfig`] carries it:
/// `model_type` (`None` for Llama), `attention_bias` (`Some(true)` only for a Llama with
/// biases) and the sliding window in force (`None`: full attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HfArchitecture {
    pub model_type: Option<ModelType>,
    pub attention_bias: Option<bool>,
    pub sliding_window: Option<usize>,
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

/// transformers' default `sliding_window` of `MistralConfig` and `Qwen2Config` when the key is
/// absent.
const DEFAULT_WINDOW: usize = 4096;
/// `Qwen2Config`'s default `max_window_layers`.
const DEFAULT_MAX_WINDOW_LAYERS: usize = 28;

/// Reads the architecture of a `config.json` object as transformers does: `model_type`
/// (absent: `llama`; others are refused), Llama's `attention_bias` (`mlp_bias` is refused),
/// Mistral's `sliding_window` (absent: 4096, null: none) and Qwen2's (only with
/// `use_sliding_window`, on the layers `layer_types` or `max_window_layers` make sliding; a
/// model whose layers mix sliding and full attention is refused).
pub fn hf_architecture(config: &Map<String, Value>) -> Result<HfArchitecture, HfFieldError> {
    let model_type = match config.get("model_type") {
        None | Some(Value::Null) => ModelType::Llama,
        Some(Value::String(t)) => match t.as_str() {
            "llama" => ModelType::Llama,
            "mistral" => ModelType::Mistral,
            "qwen2" => ModelType::Qwen2,
            other => {
                return Err(refuse(
                    "model_type",
                    format!(
                        "`{other}` is not supported; flotilla implements `llama`, `mistral` and \
                         `qwen2`"
                    ),
                ))
            }
        },
        Some(v) => return Err(refuse("model_type", format!("expected a string, got {v}"))),
    };
    let (attention_bias, sliding_window) = match model_type {
        ModelType::Llama => {
            if flag(config, "mlp_bias")? {
                return Err(refuse(
                    "mlp_bias",
                    "biases on the MLP are not supported (only on the attention projections)",
                ));
            }
            (flag(config, "attention_bias")?.then_some(true), None)
        }
        ModelType::Mistral => (None, size(config, "sliding_window", Some(DEFAULT_WINDOW))?),
        ModelType::Qwen2 => (None, qwen2_window(config)?),
    };
    Ok(HfArchitecture {
        model_type: (model_type != ModelType::Llama).then_some(model_type),
        attention_bias,
        sliding_window,
    })
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

/// Qwen2's window: none without `use_sliding_window` or when no layer slides, the window when
/// every layer does; a mix is refused.
fn qwen2_window(config: &Map<String, Value>) -> Result<Option<usize>, HfFieldError> {
    if !flag(config, "use_sliding_window")? {
        return Ok(None);
    }
    let Some(window) = size(config, "sliding_window", Some(DEFAULT_WINDOW))? else {
        return Ok(None);
    };
    let layers = config
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let sliding: Vec<bool> = match config.get("layer_types") {
        Some(Value::Array(types)) => types
            .iter()
            .map(|t| t.as_str() == Some("sliding_attention"))
            .collect(),
        _ => {
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
    let count = sliding.iter().filter(|s| **s).count();
    if count == 0 {
        Ok(None)
    } else if count == sliding.len() {
        Ok(Some(window))
    } else {
        Err(refuse(
            "use_sliding_window",
            format!(
                "{count} of {} layers use sliding-window attention and the others full \
                 attention (layer_types / max_window_layers); flotilla implements one kind for \
                 every layer: set use_sliding_window to false if the window never matters, or \
                 max_window_layers to 0",
                sliding.len()
            ),
        ))
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
                sliding_window: None
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
        let err = arch(&format!(
            r#"{{{q}, "use_sliding_window": true, "max_window_layers": 2}}"#
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("2 of 4 layers"), "{err}");
        let typed = arch(&format!(
            r#"{{{q}, "use_sliding_window": true, "max_window_layers": 2,
                "layer_types": ["full_attention", "full_attention"]}}"#
        ))
        .unwrap();
        assert_eq!(typed.sliding_window, None, "layer_types wins");

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
