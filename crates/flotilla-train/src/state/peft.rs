//! LoRA's files in PEFT's format: reading an adapter directory to start from
//! ([`PeftAdapter`]), the adapter's `adapter_config.json` ([`adapter_config`]), and merging an
//! adapter directory into its base after the fact ([`merge_into_base`], `flotilla consolidate
//! ADAPTER --base BASE`; the arithmetic is [`super::merge`]'s). Writing a
//! LoRA job's `final/` as an adapter directory is `checkpoint::final_dir`'s. The adapters
//! themselves are parameters of the model (`model::llama`, `CausalLm::with_lora`); the trainer
//! trains them like any other.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Kind, Tensor};

use super::hf_weights::{save_hf_dir, HfDirOptions, HfWeights};
use super::merge::MergedWeights;
use crate::data::Tokenizer;
use crate::error::TrainError;
use crate::model::names::ParamName;
use crate::model::SpecialIds;
use crate::model::{CausalLm, ModelError};
use crate::state::param_source::{FileSource, TensorSource};
use flotilla_config::schema::DEFAULT_MAX_SHARD_SIZE;
use flotilla_config::schema::{ExpertTargets, LoraConfig, LoraModule, ModelConfig};

/// PEFT's adapter settings file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
/// What PEFT puts before a parameter's Hugging Face name in an adapter file.
pub const PEFT_PREFIX: &str = "base_model.model.";
/// `final/merged/`: the merged model of a job with `peft.merge: true`.
pub const MERGED_DIR: &str = "merged";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An adapter problem that is the input's fault, naming the file and the fix.
fn bad_adapter(path: &Path, message: String) -> TrainError {
    TrainError::Model(ModelError::InvalidConfig {
        field: format!("peft.init_from ({})", path.display()),
        message,
    })
}

/// A PEFT LoRA adapter directory, checked against the job's model and LoRA settings from its
/// headers alone, read by ranges.
pub struct PeftAdapter {
    source: FileSource,
    names: HashSet<String>,
}

impl PeftAdapter {
    /// Opens `dir` (`adapter_config.json` and `adapter_model.safetensors`) for `model` (built
    /// with `lora`): the rank, the adapted layers and every tensor's name and shape must be
    /// the job's.
    pub fn open(dir: &Path, model: &CausalLm, lora: &LoraConfig) -> Result<Self, TrainError> {
        let (config_path, config) = read_adapter_config(dir)?;
        if config["peft_type"] != "LORA" {
            return Err(bad_adapter(
                &config_path,
                format!(
                    "peft_type is {}, not \"LORA\": only LoRA adapters can be loaded",
                    config["peft_type"]
                ),
            ));
        }
        if config["r"].as_u64() != Some(lora.r as u64) {
            return Err(bad_adapter(
                &config_path,
                format!(
                    "the adapter has r={}, the job peft.r={}; set peft.r={}",
                    config["r"], lora.r, config["r"]
                ),
            ));
        }
        let (weights, source) = open_adapter_weights(dir)?;
        // The adapted layers are those the file has factors of (adapter_config.json may list
        // them as names, full module paths or a pattern; its target_parameters say which
        // fused expert parameter each expert wrapper adapts).
        let config_of = model.config();
        let theirs_experts = file_expert_targets(&config, adapter_names(&source));
        let theirs = adapted_modules(adapter_names(&source), theirs_experts, config_of);
        let ours = adapted_modules(
            model.param_specs().iter().map(|s| s.name.as_str()),
            lora.expert_targets(config_of),
            config_of,
        );
        if theirs != ours {
            return Err(bad_adapter(
                &weights,
                format!(
                    "the adapter adapts {theirs:?}, the job {ours:?}; set \
                     peft.target_modules=[{}]",
                    theirs.join(",")
                ),
            ));
        }
        let mut names = HashSet::new();
        for (key, _) in source.entries() {
            let name = key.strip_prefix(PEFT_PREFIX).unwrap_or(key);
            match model.param_spec(name) {
                Some(s) if s.trainable => {
                    names.insert(name.to_string());
                }
                _ => {
                    return Err(ModelError::UnexpectedTensor {
                        name: key.to_string(),
                        file: weights.clone(),
                        class: model.config().architecture().hf_class(),
                    }
                    .into())
                }
            }
        }
        // Every adapter factor must be there with its shape (a base of another size has
        // other shapes); modules_to_save the adapter lacks start from the base.
        source.check_specs(model.param_specs().iter().filter(|s| is_factor(&s.name)))?;
        Ok(Self { source, names })
    }

    /// The parameters the adapter gives (its factors, and the modules to save it holds).
    pub fn names(&self) -> &HashSet<String> {
        &self.names
    }
}

impl TensorSource for PeftAdapter {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        self.source.read_range(name, lo, hi)
    }
}

/// The LoRA factor parameters of `model`.
pub fn factor_names(model: &CausalLm) -> HashSet<String> {
    model
        .param_specs()
        .iter()
        .filter(|s| is_factor(&s.name))
        .map(|s| s.name.clone())
        .collect()
}

/// Whether parameter `name` is a LoRA factor.
fn is_factor(name: &str) -> bool {
    ParamName::parse(name).is_some_and(|p| p.is_lora_factor())
}

/// The PEFT module names (`q_proj`, ...) that the LoRA factors among `names` adapt, sorted:
/// a linear layer's by its name, a mixture's experts and router as `experts` says (under the
/// names `model` lists them by: `gate_proj`/`up_proj`/`down_proj` or `w1`/`w3`/`w2`, `gate`).
fn adapted_modules<'a>(
    names: impl Iterator<Item = &'a str>,
    experts: ExpertTargets,
    model: &ModelConfig,
) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = names
        .filter_map(|n| match ParamName::parse(n) {
            Some(ParamName::Lora(_, w, _)) => crate::model::decoder::lora_module(w),
            _ => None,
        })
        .map(|m| m.as_str())
        .collect();
    let (gate_up, down) = model.expert_lora_modules();
    if experts.gate_up {
        found.extend(gate_up.iter().map(|m| m.as_str()));
    }
    if experts.down {
        found.push(down.as_str());
    }
    if experts.router {
        found.push(LoraModule::Router.as_str());
    }
    found.sort_unstable();
    found.dedup();
    found
}

/// What an adapter file adapts in a mixture's sparse layers: the router where it has its
/// factors, the fused expert parameters its `adapter_config.json`'s `target_parameters` names
/// where it has expert factors.
fn file_expert_targets<'a>(config: &Value, names: impl Iterator<Item = &'a str>) -> ExpertTargets {
    let (mut experts, mut router) = (false, false);
    for n in names {
        match ParamName::parse(n) {
            Some(ParamName::ExpertLora(..)) => experts = true,
            Some(ParamName::RouterLora(..)) => router = true,
            _ => {}
        }
    }
    let fused = match (experts, config["target_parameters"].as_array()) {
        (true, Some(listed)) => ExpertTargets::fused_in(listed.iter().filter_map(Value::as_str)),
        _ => ExpertTargets::default(),
    };
    ExpertTargets { router, ..fused }
}

/// `dir/adapter_config.json`, parsed, with its path.
fn read_adapter_config(dir: &Path) -> Result<(PathBuf, Value), TrainError> {
    let path = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let config =
        serde_json::from_str(&text).map_err(|e| bad_adapter(&path, format!("not JSON: {e}")))?;
    Ok((path, config))
}

/// `dir/adapter_model.safetensors` (headers only), keyed by parameter name, with its path.
fn open_adapter_weights(dir: &Path) -> Result<(PathBuf, FileSource), TrainError> {
    let path = dir.join(ADAPTER_WEIGHTS);
    let source = FileSource::open_with_prefix(std::slice::from_ref(&path), PEFT_PREFIX, "")?;
    Ok((path, source))
}

/// The parameter names of an adapter file's tensors (PEFT's prefix removed).
fn adapter_names(source: &FileSource) -> impl Iterator<Item = &str> {
    source
        .entries()
        .map(|(k, _)| k.strip_prefix(PEFT_PREFIX).unwrap_or(k))
}

/// `adapter_config.json` for `lora`, as PEFT writes it for a causal LM (`target_modules`
/// expanded, `base_model_name_or_path` the base directory when there is one).
pub fn adapter_config(lora: &LoraConfig, model: &ModelConfig, base: Option<&str>) -> Value {
    let number = |v: f64| {
        if v.fract() == 0.0 {
            json!(v as i64)
        } else {
            json!(v)
        }
    };
    let alpha = number(lora.alpha);
    let modules_to_save: Option<Vec<&str>> = (!lora.modules_to_save.is_empty())
        .then(|| lora.modules_to_save.iter().map(|m| m.as_str()).collect());
    // A mixture's experts and router are PEFT's target_parameters (transformers 5 fuses the
    // experts), the fused gate_up_proj at twice the rank and alpha; its MLP modules are not
    // target_modules.
    let experts = lora.expert_targets(model);
    let target_modules: Vec<&str> = lora
        .targets(model)
        .iter()
        .filter(|m| !(model.is_moe() && m.in_mlp()))
        .map(|m| m.as_str())
        .collect();
    let target_parameters = experts.parameter_names();
    let (mut rank_pattern, mut alpha_pattern) = (json!({}), json!({}));
    if experts.gate_up {
        let key = r".*\.gate_up_proj";
        rank_pattern[key] = json!(lora.gate_up_rank());
        alpha_pattern[key] = number(lora.gate_up_alpha());
    }
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.r,
        "lora_alpha": alpha,
        "lora_dropout": lora.dropout,
        "target_modules": target_modules,
        "target_parameters": (!target_parameters.is_empty()).then_some(target_parameters),
        "use_rslora": lora.use_rslora,
        "modules_to_save": modules_to_save,
        "bias": "none",
        "fan_in_fan_out": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "use_dora": false,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "revision": null,
    })
}

/// The LoRA settings of a PEFT adapter directory: `r`, `lora_alpha`, `use_rslora` and
/// `modules_to_save` from its `adapter_config.json`, the adapted layers from its tensors.
pub fn adapter_settings(dir: &Path, model: &ModelConfig) -> Result<LoraConfig, TrainError> {
    let (config_path, config) = read_adapter_config(dir)?;
    let (_, source) = open_adapter_weights(dir)?;
    let experts = file_expert_targets(&config, adapter_names(&source));
    let targets = adapted_modules(adapter_names(&source), experts, model);
    let saved: Vec<&str> = match &config["modules_to_save"] {
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let settings = json!({
        "r": config["r"],
        "alpha": config["lora_alpha"].as_f64(),
        "dropout": 0.0,
        "target_modules": targets,
        "use_rslora": config["use_rslora"].as_bool().unwrap_or(false),
        "modules_to_save": saved,
        "init_from": dir.display().to_string(),
        "merge": true,
    });
    serde_json::from_value(settings).map_err(|e| {
        bad_adapter(
            &config_path,
            format!("not a LoRA adapter flotilla can merge: {e}"),
        )
    })
}

/// Merges the PEFT adapter directory `adapter` into the Hugging Face model `base` and writes
/// the result to `out` as a Hugging Face directory (fp32, one parameter in memory at a time;
/// `tokenizer.json` copied from the adapter or the base when there is one).
pub fn merge_into_base(adapter: &Path, base: &Path, out: &Path) -> Result<(), TrainError> {
    let (base_model, hf) = HfWeights::open(base)?;
    let lora = adapter_settings(adapter, base_model.config())?;
    let model = CausalLm::with_lora(base_model.config(), Some(&lora))?;
    let peft = PeftAdapter::open(adapter, &model, &lora)?;
    let source = crate::state::param_source::Overlay {
        names: peft.names().clone(),
        over: &peft,
        base: &hf,
    };
    let merged = MergedWeights::new(&source, &model, &lora);
    // As the base was saved: its dtype, its config.json and generation_config.json.
    let opts = HfDirOptions {
        max_shard_bytes: Some(DEFAULT_MAX_SHARD_SIZE),
        base: Some(base),
        special: SpecialIds::default(),
    };
    let kind = hf.declared_kind.unwrap_or(Kind::Float);
    save_hf_dir(out, &base_model, &merged, kind, &opts)?;
    // The tokenizer's files (tokenizer.json, tokenizer_config.json with the chat template and
    // special tokens, ...) of the adapter, else of the base, byte for byte.
    for dir in [adapter, base] {
        let tok = dir.join("tokenizer.json");
        if tok.is_file() {
            Tokenizer::from_file(&tok, "the tokenizer")?.save_into(out)?;
            break;
        }
    }
    Ok(())
}

/// The base directory an adapter was trained on, for `adapter_config.json`: the job's
/// `model.init_from`, made absolute.
pub fn base_path(init_from: Option<&str>) -> Option<String> {
    init_from.map(|p| {
        std::path::absolute(PathBuf::from(p))
            .unwrap_or_else(|_| PathBuf::from(p))
            .display()
            .to_string()
    })
}
