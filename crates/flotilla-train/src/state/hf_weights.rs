//! A Hugging Face model directory's weights (`model.safetensors`, or the shards listed by
//! `model.safetensors.index.json`): [`HfWeights`] checks a directory's tensors against its
//! `config.json` from the file headers alone and reads them by ranges (an FSDP rank reads only
//! its shards); [`save_hf_from`] writes a directory transformers loads, one tensor at a time.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use super::hf_shards::{hub_planned, ShardedWriter};
use super::param_source::{FileSource, TensorSource};
use crate::error::TrainError;
use crate::model::hf_config::{io_err, kind_name, read_hf_config, weight_kind, HfConfigError};
use crate::model::{finish_hf_dir, read_model_config, write_generation_config, SpecialIds};
use crate::model::{CausalLm, ModelError, Params};

/// The name of a directory's weights file as flotilla writes it.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// The safetensors files of a model directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` lists (in first-mention order).
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        #[derive(Deserialize)]
        struct Index {
            weight_map: indexmap::IndexMap<String, String>,
        }
        let text = fs::read_to_string(&index).map_err(io_err(&index))?;
        let parsed: Index =
            serde_json::from_str(&text).map_err(|e| HfConfigError::BadConfigJson {
                path: index.clone(),
                message: e.to_string(),
            })?;
        let mut files: Vec<PathBuf> = Vec::new();
        for file in parsed.weight_map.values() {
            let path = dir.join(file);
            if !files.contains(&path) {
                files.push(path);
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(ModelError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json in this directory",
        ),
    })
}

/// The weights of a Hugging Face directory (`LlamaForCausalLM`, `MistralForCausalLM`,
/// `Qwen2ForCausalLM`), checked against its `config.json` from the safetensors headers alone (name, shape, dtype of every tensor; a
/// tied checkpoint that also stores `lm_head.weight` has it ignored, as transformers does; an
/// old `rotary_emb.inv_freq` buffer is skipped) and read by ranges.
pub struct HfWeights {
    source: FileSource,
    /// The dtype `config.json` declares for the weights, if any.
    pub declared_kind: Option<Kind>,
}

impl HfWeights {
    /// Opens `dir`: the model its `config.json` describes and its checked weights.
    pub fn open(dir: impl AsRef<Path>) -> Result<(CausalLm, Self), ModelError> {
        let dir = dir.as_ref();
        let config = read_model_config(dir)?;
        let model = CausalLm::new(&config)?;
        let declared_kind = weight_kind(&read_hf_config(dir)?);
        let source = FileSource::open(&weight_files(dir)?, "")?.with_parts_of(&model);
        for file in source.files() {
            for name in file.tensors().keys() {
                if name.ends_with("rotary_emb.inv_freq")
                    || model.param_spec(name).is_some()
                    || source.is_part(name)
                {
                    continue; // an old buffer recomputed from the config, or a weight
                }
                if name == "lm_head.weight" && config.tie_word_embeddings {
                    tracing::debug!(
                        "{}: ignoring lm_head.weight of a tied model",
                        file.path().display()
                    );
                    continue;
                }
                return Err(ModelError::UnexpectedTensor {
                    name: name.clone(),
                    file: file.path().to_path_buf(),
                    class: config.architecture().hf_class(),
                });
            }
        }
        source.check_all(&model)?;
        Ok((
            model,
            Self {
                source,
                declared_kind,
            },
        ))
    }

    /// Elements `lo..hi` of parameter `name`, flattened (CPU, the file's dtype).
    pub fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, ModelError> {
        self.source.read_param(name, lo, hi)
    }
}

impl TensorSource for HfWeights {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        Ok(HfWeights::read_range(self, name, lo, hi)?)
    }
}

/// Loads a Hugging Face model directory whole ([`HfWeights`] checks it), onto
/// `device` in `kind` (`None`: the dtype the config declares, else each tensor's own).
pub fn load_hf(
    dir: impl AsRef<Path>,
    device: Device,
    kind: Option<Kind>,
) -> Result<(CausalLm, Params), ModelError> {
    let (model, weights) = HfWeights::open(dir)?;
    let kind = kind.or(weights.declared_kind);
    let _guard = tch::no_grad_guard();
    let mut params = Params::new();
    for spec in model.param_specs() {
        let t = weights.read_range(&spec.name, 0, spec.numel() as i64)?;
        let t = t
            .f_to_kind(kind.unwrap_or(t.kind()))?
            .f_to_device(device)?
            .f_reshape(spec.shape.as_slice())?;
        params.insert(spec.name.clone(), t);
    }
    Ok((model, params))
}

/// How a Hugging Face directory is written besides its weights' dtype: its largest weights
/// file (`None`: one file whatever the size), and the base a job fine-tuned, whose
/// `config.json` and `generation_config.json` it keeps; without a base, the special-token ids
/// its config and generation config carry.
#[derive(Clone, Debug, Default)]
pub struct HfDirOptions<'a> {
    pub max_shard_bytes: Option<u64>,
    pub base: Option<&'a Path>,
    pub special: SpecialIds,
}

/// Saves the parameters `source` gives as a Hugging Face directory that transformers loads as
/// the model's class (`LlamaForCausalLM`, ...): one `model.safetensors` in `kind` (Hugging Face
/// names, no `lm_head.weight` when embeddings are tied), written a parameter at a time through
/// a temporary file, then `config.json` ([`finish_hf_dir`]).
pub fn save_hf_from(
    dir: impl AsRef<Path>,
    model: &CausalLm,
    source: &dyn TensorSource,
    kind: Kind,
) -> Result<(), TrainError> {
    save_hf_dir(dir.as_ref(), model, source, kind, &HfDirOptions::default())
}

/// [`save_hf_from`] as `save_pretrained` writes a directory: the weights split into files of
/// at most `opts.max_shard_bytes` with `model.safetensors.index.json`, `config.json` and
/// `generation_config.json` (the base's, or built from `opts.special`).
pub fn save_hf_dir(
    dir: &Path,
    model: &CausalLm,
    source: &dyn TensorSource,
    kind: Kind,
    opts: &HfDirOptions<'_>,
) -> Result<(), TrainError> {
    if kind_name(kind).is_none() {
        return Err(ModelError::UnsupportedDtype {
            name: "(save dtype)".into(),
            dtype: format!("{kind:?}"),
            file: None,
        }
        .into());
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let order = model
        .param_specs()
        .iter()
        .flat_map(|s| hub_planned(&s.name, kind, &s.shape))
        .collect();
    let max = opts.max_shard_bytes.unwrap_or(u64::MAX);
    let mut writer = ShardedWriter::create(dir, "model", order, max)?;
    for s in model.param_specs() {
        // Whole (a merging source computes a parameter at once), then as the file holds it.
        let t = source.read_range(&s.name, 0, s.numel() as i64)?;
        writer.write_param(&s.name, &t.f_reshape(s.shape.as_slice())?)?;
    }
    writer.finish()?;
    finish_hf_dir(dir, model, kind, opts.base, &opts.special)?;
    write_generation_config(dir, opts.base, &opts.special)?;
    Ok(())
}

/// [`save_hf_from`] in-memory parameters.
pub fn save_hf(
    dir: impl AsRef<Path>,
    model: &CausalLm,
    params: &Params,
    kind: Kind,
) -> Result<(), ModelError> {
    model.check_params(params)?;
    save_hf_from(dir, model, params, kind).map_err(|e| match e {
        TrainError::Model(e) => e,
        TrainError::Safetensors(e) => e.into(),
        TrainError::Torch(e) => e.into(),
        other => ModelError::InvalidConfig {
            field: "(save)".into(),
            message: other.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors_io::SafetensorsFile;
    use flotilla_config::schema::ModelConfig;

    fn tiny_mixtral() -> ModelConfig {
        serde_yaml::from_str(
            "{name: t, vocab_size: 40, hidden_size: 16, intermediate_size: 24, \
             num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, \
             max_position_embeddings: 32, rms_norm_eps: 1.0e-5, rope_theta: 10000.0, \
             rope_scaling: null, tie_word_embeddings: false, initializer_range: 0.02, \
             init_from: null, model_type: mixtral, \
             moe: {num_experts: 3, num_experts_per_tok: 2}}",
        )
        .unwrap()
    }

    /// A mixture's stacked experts are written per expert under the Hub's names (no stacked
    /// tensor in the file), read back whole and by any range across the experts' tensors, and a
    /// file without one expert's tensor is refused naming it.
    #[test]
    fn stacked_experts_are_per_expert_tensors_in_the_files() {
        let model = CausalLm::new(&tiny_mixtral()).unwrap();
        let params = model.init_params(5, Device::Cpu, Kind::Float);
        let dir = tempfile::tempdir().unwrap();
        save_hf(dir.path(), &model, &params, Kind::Float).unwrap();

        let file = SafetensorsFile::open(dir.path().join(WEIGHTS_FILE)).unwrap();
        let names: Vec<&String> = file.tensors().keys().collect();
        assert!(names.iter().all(|n| !n.ends_with("_proj")), "{names:?}");
        let gate_up = params
            .get("model.layers.1.block_sparse_moe.experts.gate_up_proj")
            .unwrap();
        let down = params
            .get("model.layers.1.block_sparse_moe.experts.down_proj")
            .unwrap();
        assert_eq!(gate_up.size(), [3, 48, 16]);
        let up2 = file
            .read("model.layers.1.block_sparse_moe.experts.2.w3.weight")
            .unwrap();
        assert_eq!(up2.size(), [24, 16]);
        assert!(up2.equal(&gate_up.get(2).narrow(0, 24, 24)));
        let down0 = file
            .read("model.layers.1.block_sparse_moe.experts.0.w2.weight")
            .unwrap();
        assert!(down0.equal(&down.get(0)));

        let (_, weights) = HfWeights::open(dir.path()).unwrap();
        let flat = gate_up.reshape([-1]);
        for (lo, hi) in [(0, 1), (24 * 16 - 5, 3 * 24 * 16 + 7), (100, 48 * 16 * 3)] {
            let got = weights
                .read_range(
                    "model.layers.1.block_sparse_moe.experts.gate_up_proj",
                    lo,
                    hi,
                )
                .unwrap();
            assert!(got.equal(&flat.narrow(0, lo, hi - lo)), "{lo}..{hi}");
        }
        let (_, loaded) = load_hf(dir.path(), Device::Cpu, None).unwrap();
        for (name, t) in params.iter() {
            assert!(loaded.get(name).unwrap().equal(t), "{name}");
        }

        let gone = "model.layers.0.block_sparse_moe.experts.1.w2.weight";
        let kept: Vec<(String, Tensor)> = Tensor::read_safetensors(dir.path().join(WEIGHTS_FILE))
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n != gone)
            .collect();
        Tensor::write_safetensors(&kept, dir.path().join(WEIGHTS_FILE)).unwrap();
        let err = HfWeights::open(dir.path())
            .err()
            .expect("a missing expert is refused");
        assert!(
            matches!(&err, ModelError::MissingTensor { name, .. } if name == gone),
            "{err}"
        );
    }
}
