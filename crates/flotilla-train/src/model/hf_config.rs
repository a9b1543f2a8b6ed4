//! A Hugging Face model directory's configuration files as the trainer writes them:
//! `config.json` beside a model's weights ([`finish_hf_dir`]: the base's kept whole, or one
//! built from the model's config) and `generation_config.json` ([`write_generation_config`]).
//! Reading `config.json` into a `ModelConfig` is `flotilla_config::schema::hf_config`'s (the
//! login side's pre-flight uses the same); [`read_hf_config`] and [`read_model_config`] give its
//! errors as [`ModelError`]s. The weights themselves are `state::hf_weights`'.

use std::fs;
use std::path::Path;

use tch::Kind;

pub use flotilla_config::schema::hf_config::{HfConfigError, HfLlamaConfig, HfRopeParameters};
use flotilla_config::schema::{hf_config, ModelConfig};

use super::{CausalLm, ModelError};

const CONFIG_JSON: &str = "config.json";

/// The weight dtype a config declares (`dtype`, else `torch_dtype`), if it names one.
pub fn weight_kind(config: &HfLlamaConfig) -> Option<Kind> {
    config.declared_dtype().and_then(kind_from_name)
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
    Ok(hf_config::read_hf_config(dir)?)
}

/// The `ModelConfig` of a Hugging Face directory: its `config.json`, named after the directory,
/// with `init_from` pointing at it.
pub fn read_model_config(dir: impl AsRef<Path>) -> Result<ModelConfig, ModelError> {
    Ok(hf_config::read_model_config(dir)?)
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
        Ok(_) => Err(HfConfigError::BadConfigJson {
            path: path.to_path_buf(),
            message: "not a JSON object".into(),
        }
        .into()),
        Err(e) => Err(HfConfigError::BadConfigJson {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
        .into()),
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
            hf.pad_token_id = special.pad.clone().or(hf.pad_token_id);
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
