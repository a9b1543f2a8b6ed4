//! A Hugging Face model's `config.json`: that of `LlamaForCausalLM`, `MistralForCausalLM` and
//! `Qwen2ForCausalLM` ([`HfLlamaConfig`], to and from [`ModelConfig`]; which architecture a
//! config is, and its biases and sliding window, are read by
//! `flotilla_config::schema::hf_architecture`, as the login side reads them), read from a
//! directory and written beside a model's weights ([`finish_hf_dir`]). The weights themselves
//! are `state::hf_weights`'.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Kind;

use flotilla_config::schema::{hf_architecture, ModelConfig, ModelType, RopeScaling, RopeType};

use super::{CausalLm, ModelError};

/// transformers' `rope_parameters` (≥ 5) or legacy `rope_scaling` dict.
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
    #[serde(default = "default_act")]
    pub hidden_act: String,
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

fn default_act() -> String {
    "silu".into()
}
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

fn bad(field: &str, message: impl Into<String>) -> ModelError {
    ModelError::BadConfigField {
        path: PathBuf::from(CONFIG_JSON),
        field: field.to_string(),
        message: message.into(),
    }
}

impl HfLlamaConfig {
    /// Parses a `config.json` text; errors quote the offending line.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ModelError> {
        serde_json::from_str(text).map_err(|e| {
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
            ModelError::BadConfigJson {
                path: path.to_path_buf(),
                message,
            }
        })
    }

    /// The weight dtype the config declares (`dtype`, else `torch_dtype`), if it names one.
    pub fn weight_kind(&self) -> Option<Kind> {
        self.dtype
            .as_deref()
            .or(self.torch_dtype.as_deref())
            .and_then(kind_from_name)
    }
}

impl TryFrom<&HfLlamaConfig> for ModelConfig {
    type Error = ModelError;

    fn try_from(hf: &HfLlamaConfig) -> Result<Self, ModelError> {
        // The architecture's own keys, read from the keys as written (absent stays absent).
        let keys = match serde_json::to_value(hf) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        let arch = hf_architecture(&keys).map_err(|e| bad(&e.field, e.message))?;
        if hf.hidden_act != "silu" {
            return Err(bad(
                "hidden_act",
                format!(
                    "`{}` is not supported; {} uses `silu`",
                    hf.hidden_act,
                    arch.model_type.unwrap_or(ModelType::Llama).display_name()
                ),
            ));
        }
        if hf.num_attention_heads == 0 || !hf.hidden_size.is_multiple_of(hf.num_attention_heads) {
            return Err(bad(
                "num_attention_heads",
                format!(
                    "{} does not divide hidden_size {}",
                    hf.num_attention_heads, hf.hidden_size
                ),
            ));
        }
        if let Some(d) = hf.head_dim {
            let implied = hf.hidden_size / hf.num_attention_heads;
            if d != implied {
                return Err(bad(
                    "head_dim",
                    format!(
                        "{d} differs from hidden_size / num_attention_heads = {implied}, which is not supported"
                    ),
                ));
            }
        }

        // rope_parameters (transformers >= 5) wins over the legacy rope_theta / rope_scaling.
        let (rope, rope_field) = match (&hf.rope_parameters, &hf.rope_scaling) {
            (Some(p), _) => (Some(p), "rope_parameters"),
            (None, Some(s)) => (Some(s), "rope_scaling"),
            (None, None) => (None, ""),
        };
        let rope_theta = hf
            .rope_parameters
            .as_ref()
            .and_then(|p| p.rope_theta)
            .or(hf.rope_theta)
            .unwrap_or(10000.0);
        let rope_scaling = match rope {
            None => None,
            Some(p) => {
                if let Some(f) = p.partial_rotary_factor {
                    if f != 1.0 {
                        return Err(bad(
                            &format!("{rope_field}.partial_rotary_factor"),
                            format!("{f} is not supported (only 1.0)"),
                        ));
                    }
                }
                match p.rope_type.as_deref().or(p.legacy_type.as_deref()) {
                    None | Some("default") => None,
                    Some("llama3") => {
                        let need = |v: Option<f64>, key: &str| {
                            v.ok_or_else(|| {
                                bad(&format!("{rope_field}.{key}"), "required for rope_type llama3")
                            })
                        };
                        Some(RopeScaling {
                            rope_type: RopeType::Llama3,
                            factor: need(p.factor, "factor")?,
                            low_freq_factor: need(p.low_freq_factor, "low_freq_factor")?,
                            high_freq_factor: need(p.high_freq_factor, "high_freq_factor")?,
                            original_max_position_embeddings: p
                                .original_max_position_embeddings
                                .ok_or_else(|| {
                                    bad(
                                        &format!("{rope_field}.original_max_position_embeddings"),
                                        "required for rope_type llama3",
                                    )
                                })?,
                        })
                    }
                    Some(other) => {
                        return Err(bad(
                            &format!("{rope_field}.rope_type"),
                            format!("`{other}` is not supported; flotilla implements `default` and `llama3`"),
                        ))
                    }
                }
            }
        };

        Ok(ModelConfig {
            name: "hf".into(),
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_hidden_layers: hf.num_hidden_layers,
            num_attention_heads: hf.num_attention_heads,
            num_key_value_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            max_position_embeddings: hf.max_position_embeddings,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: hf.tie_word_embeddings,
            initializer_range: hf.initializer_range,
            init_from: None,
            model_type: arch.model_type,
            attention_bias: arch.attention_bias,
            sliding_window: arch.sliding_window,
        })
    }
}

impl From<&ModelConfig> for HfLlamaConfig {
    /// The `config.json` transformers writes for this architecture (in the legacy
    /// `rope_theta` / `rope_scaling` form, which transformers 4 and 5 both read): its class and
    /// `model_type`, Llama's `attention_bias`, Mistral's `sliding_window` (`null`: none), and
    /// Qwen2's window on every layer or none.
    fn from(c: &ModelConfig) -> Self {
        let arch = c.architecture();
        let llama = arch == ModelType::Llama;
        let qwen2 = arch == ModelType::Qwen2;
        HfLlamaConfig {
            architectures: Some(vec![arch.hf_class().into()]),
            model_type: Some(arch.as_str().into()),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads: Some(c.num_key_value_heads),
            head_dim: Some(c.head_dim()),
            hidden_act: default_act(),
            max_position_embeddings: c.max_position_embeddings,
            initializer_range: c.initializer_range,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta: Some(c.rope_theta),
            rope_scaling: c.rope_scaling.as_ref().map(|s| HfRopeParameters {
                rope_type: Some(s.rope_type.as_str().into()),
                factor: Some(s.factor),
                low_freq_factor: Some(s.low_freq_factor),
                high_freq_factor: Some(s.high_freq_factor),
                original_max_position_embeddings: Some(s.original_max_position_embeddings),
                ..Default::default()
            }),
            rope_parameters: None,
            tie_word_embeddings: c.tie_word_embeddings,
            attention_bias: llama.then_some(c.attention_bias == Some(true)),
            mlp_bias: llama.then_some(false),
            sliding_window: (!llama).then_some(c.sliding_window),
            use_sliding_window: qwen2.then_some(c.sliding_window.is_some()),
            max_window_layers: (qwen2 && c.sliding_window.is_some()).then_some(0),
            layer_types: None,
            attention_dropout: 0.0,
            bos_token_id: None,
            eos_token_id: None,
            pad_token_id: None,
            torch_dtype: None,
            dtype: None,
            use_cache: Some(true),
            transformers_version: None,
        }
    }
}

/// transformers' dtype spelling for a parameter kind.
pub fn kind_name(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => return None,
    })
}

fn kind_from_name(name: &str) -> Option<Kind> {
    Some(match name {
        "float32" | "float" => Kind::Float,
        "bfloat16" => Kind::BFloat16,
        "float16" | "half" => Kind::Half,
        "float64" | "double" => Kind::Double,
        _ => return None,
    })
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads and parses `dir/config.json`.
pub fn read_hf_config(dir: impl AsRef<Path>) -> Result<HfLlamaConfig, ModelError> {
    let path = dir.as_ref().join(CONFIG_JSON);
    let text = fs::read_to_string(&path).map_err(io_err(&path))?;
    HfLlamaConfig::from_json(&text, &path)
}

/// The `ModelConfig` of a Hugging Face directory: its `config.json`, named after the directory,
/// with `init_from` pointing at it.
pub fn read_model_config(dir: impl AsRef<Path>) -> Result<ModelConfig, ModelError> {
    let dir = dir.as_ref();
    let hf = read_hf_config(dir)?;
    let mut config = ModelConfig::try_from(&hf).map_err(|e| match e {
        ModelError::BadConfigField { field, message, .. } => ModelError::BadConfigField {
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

/// The special-token ids a model directory declares (`config.json`, `generation_config.json`),
/// each a number or a list of numbers as the base wrote it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecialIds {
    pub bos: Option<serde_json::Value>,
    pub eos: Option<serde_json::Value>,
    pub pad: Option<serde_json::Value>,
}

impl SpecialIds {
    /// Ids of the tokens a tokenizer names (`bos_token`, `eos_token`, `pad_token`).
    pub fn of_tokens(bos: Option<u32>, eos: Option<u32>, pad: Option<u32>) -> Self {
        let id = |v: Option<u32>| v.map(|i| serde_json::Value::from(i as u64));
        SpecialIds {
            bos: id(bos),
            eos: id(eos),
            pad: id(pad),
        }
    }
}

fn write_json_atomic(path: &Path, value: &serde_json::Value) -> Result<(), ModelError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON serialises");
    text.push('\n');
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    fs::write(&tmp, &text).map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

fn read_json_object(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>, ModelError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(ModelError::BadConfigJson {
            path: path.to_path_buf(),
            message: "not a JSON object".into(),
        }),
        Err(e) => Err(ModelError::BadConfigJson {
            path: path.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// Writes `config.json` into `dir` atomically, with `dtype` = `kind`. With a `base` directory
/// (the checkpoint a job fine-tuned) its `config.json` is kept whole (every field the
/// architecture and the serving stacks read, its special-token ids among them) with the dtype
/// set (`dtype`, and `torch_dtype` where the base wrote that spelling); without one, it is
/// built from the model's config with `special`'s ids.
pub fn finish_hf_dir(
    dir: &Path,
    model: &CausalLm,
    kind: Kind,
    base: Option<&Path>,
    special: &SpecialIds,
) -> Result<(), ModelError> {
    let dtype = kind_name(kind).ok_or_else(|| ModelError::UnsupportedDtype {
        name: "(save dtype)".into(),
        dtype: format!("{kind:?}"),
        file: None,
    })?;
    let base_config = base.map(|b| b.join(CONFIG_JSON)).filter(|p| p.is_file());
    let mut config = match &base_config {
        Some(path) => read_json_object(path)?,
        None => {
            let mut hf = HfLlamaConfig::from(model.config());
            hf.bos_token_id = special.bos.clone();
            hf.eos_token_id = special.eos.clone();
            hf.pad_token_id = special.pad.clone();
            match serde_json::to_value(&hf).expect("config serialises") {
                serde_json::Value::Object(map) => map,
                _ => unreachable!("a config serialises as an object"),
            }
        }
    };
    config.insert("dtype".into(), dtype.into());
    if config.contains_key("torch_dtype") {
        config.insert("torch_dtype".into(), dtype.into());
    }
    write_json_atomic(&dir.join(CONFIG_JSON), &serde_json::Value::Object(config))
}

/// The generation settings file of a model directory.
pub const GENERATION_CONFIG_JSON: &str = "generation_config.json";

/// Writes `generation_config.json` into `dir`: the base's as it is, or, without one, the
/// special-token ids as transformers' `GenerationConfig.from_model_config` takes them from a
/// config (`model.generate()` stops at `eos_token_id`). Nothing when there are no ids.
pub fn write_generation_config(
    dir: &Path,
    base: Option<&Path>,
    special: &SpecialIds,
) -> Result<(), ModelError> {
    if let Some(path) = base
        .map(|b| b.join(GENERATION_CONFIG_JSON))
        .filter(|p| p.is_file())
    {
        let config = read_json_object(&path)?;
        return write_json_atomic(
            &dir.join(GENERATION_CONFIG_JSON),
            &serde_json::Value::Object(config),
        );
    }
    let mut config = serde_json::Map::new();
    config.insert("_from_model_config".into(), true.into());
    for (key, id) in [
        ("bos_token_id", &special.bos),
        ("eos_token_id", &special.eos),
        ("pad_token_id", &special.pad),
    ] {
        if let Some(id) = id {
            config.insert(key.into(), id.clone());
        }
    }
    if config.len() == 1 {
        return Ok(());
    }
    write_json_atomic(
        &dir.join(GENERATION_CONFIG_JSON),
        &serde_json::Value::Object(config),
    )
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

    fn convert(text: &str) -> Result<ModelConfig, ModelError> {
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
        assert_eq!(new.rope_scaling.as_ref().unwrap().factor, 8.0);

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
        let err = convert(&json(r#", "head_dim": 32"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`head_dim`"), "{err}");
        let err = convert(&json(
            r#", "rope_scaling": {"rope_type": "yarn", "factor": 2.0}"#,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("rope_scaling.rope_type") && err.contains("yarn"),
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
