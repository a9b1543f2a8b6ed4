//! The tensor files of a checkpoint directory, full or sharded, opened by their headers only
//! ([`CheckpointFiles`]): the names of its files, the layout of a sharded one
//! (`sharded_meta.json`, [`ShardedMeta`]) and sources of its parameters and AdamW moments read
//! by ranges ([`ShardedSource`] finds them in the shard files of whatever world size wrote
//! them).

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::{io, MODEL_FILE, OPTIMIZER_FILE};
use crate::error::TrainError;
use crate::model::{CausalLm, ModelError};
use crate::parallel::layout::GroupLayout;
use crate::parallel::weights::OptimizerSource;
use crate::safetensors_io::SafetensorsFile;
use crate::state::param_source::{FileSource, TensorSource};

/// The shard file of shard-group rank `r`.
pub fn shard_file(r: usize) -> String {
    format!("shard_{r:05}.safetensors")
}

/// Layout file of a sharded checkpoint.
pub const SHARDED_META_FILE: &str = "sharded_meta.json";
/// The model's Hugging Face `config.json`, in every checkpoint.
pub const CONFIG_FILE: &str = "config.json";
pub(super) const SHARDED_FORMAT: &str = "flotilla-fsdp-sharded-v1";

/// The contents of `sharded_meta.json`: how the flat groups were laid out and sharded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardedMeta {
    pub format: String,
    /// Ranks in the shard group that wrote `shard_<r>.safetensors`.
    pub shard_world: usize,
    pub optimizer_step: u64,
    pub groups: Vec<GroupLayout>,
}

/// The tensor files of a checkpoint directory, full or sharded, opened by their headers only:
/// sources of its parameters and AdamW moments by ranges.
// One value per resume: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum CheckpointFiles {
    Full {
        model: FileSource,
        exp_avg: FileSource,
        exp_avg_sq: FileSource,
        step: u64,
    },
    Sharded {
        files: Vec<SafetensorsFile>,
        meta: ShardedMeta,
    },
}

impl CheckpointFiles {
    /// Opens the checkpoint in `dir` and checks that it holds every parameter of `model` with
    /// its shape.
    pub fn open(dir: &Path, model: &CausalLm) -> Result<Self, TrainError> {
        let meta_path = dir.join(SHARDED_META_FILE);
        if !meta_path.is_file() {
            let files = FileSource::open(&[dir.join(MODEL_FILE)], "")?.with_parts_of(model);
            files.check_all(model)?;
            let optimizer = SafetensorsFile::open(dir.join(OPTIMIZER_FILE))?;
            let step = optimizer.read("step")?.f_int64_value(&[])? as u64;
            let path = [optimizer.path().to_path_buf()];
            return Ok(CheckpointFiles::Full {
                model: files,
                exp_avg: FileSource::open(&path, ".exp_avg")?,
                exp_avg_sq: FileSource::open(&path, ".exp_avg_sq")?,
                step,
            });
        }
        let text = std::fs::read_to_string(&meta_path).map_err(io(&meta_path))?;
        let meta: ShardedMeta = serde_json::from_str(&text)
            .map_err(|e| TrainError::BadState(format!("{}: {e}", meta_path.display())))?;
        if meta.format != SHARDED_FORMAT {
            return Err(TrainError::BadState(format!(
                "{}: unknown format `{}`",
                meta_path.display(),
                meta.format
            )));
        }
        // The trained parameters (all, but a LoRA job's frozen base, which comes from the base).
        for spec in model.param_specs().iter().filter(|s| s.trainable) {
            let entry = meta
                .groups
                .iter()
                .flat_map(|g| g.entries.iter())
                .find(|e| e.name == spec.name);
            match entry {
                Some(e) if e.shape == spec.shape => {}
                Some(e) => {
                    return Err(crate::model::ModelError::ShapeMismatch {
                        name: spec.name.clone(),
                        expected: spec.shape.clone(),
                        found: e.shape.clone(),
                        file: Some(meta_path.clone()),
                    }
                    .into())
                }
                None => {
                    return Err(crate::model::ModelError::MissingTensor {
                        name: spec.name.clone(),
                        files: meta_path.display().to_string(),
                    }
                    .into())
                }
            }
        }
        let files = open_shards(dir, meta.shard_world)?;
        for (g, layout) in meta.groups.iter().enumerate() {
            for f in &files {
                for what in ["param", "exp_avg", "exp_avg_sq"] {
                    let key = format!("group{g}.{what}");
                    let numel = f.info(&key).map(|i| i.numel);
                    if numel != Some(layout.shard_len) {
                        return Err(TrainError::BadState(format!(
                            "{}: `{key}` should hold {} elements (its layout in {SHARDED_META_FILE}), \
                             found {numel:?}",
                            f.path().display(),
                            layout.shard_len
                        )));
                    }
                }
            }
        }
        Ok(CheckpointFiles::Sharded { files, meta })
    }

    /// Runs `f` with sources of the parameters and, when `with_optimizer`, of the AdamW
    /// state.
    pub fn with_sources<T>(
        &self,
        model: &CausalLm,
        f: impl FnOnce(&dyn TensorSource, Option<OptimizerSource<'_>>) -> Result<T, TrainError>,
    ) -> Result<T, TrainError> {
        match self {
            CheckpointFiles::Full {
                model: params,
                exp_avg,
                exp_avg_sq,
                step,
            } => {
                let with_moments = model
                    .param_specs()
                    .iter()
                    .filter(|s| exp_avg.find(&format!("{}.exp_avg", s.name)).is_some())
                    .map(|s| s.name.clone())
                    .collect();
                f(
                    params,
                    Some(OptimizerSource {
                        exp_avg,
                        exp_avg_sq,
                        step: *step,
                        with_moments,
                    }),
                )
            }
            CheckpointFiles::Sharded { files, meta } => {
                let params = ShardedSource::new(files, &meta.groups, "param");
                let exp_avg = ShardedSource::new(files, &meta.groups, "exp_avg");
                let exp_avg_sq = ShardedSource::new(files, &meta.groups, "exp_avg_sq");
                f(
                    &params,
                    Some(OptimizerSource {
                        exp_avg: &exp_avg,
                        exp_avg_sq: &exp_avg_sq,
                        step: meta.optimizer_step,
                        with_moments: model
                            .param_specs()
                            .iter()
                            .filter(|s| s.trainable)
                            .map(|s| s.name.clone())
                            .collect(),
                    }),
                )
            }
        }
    }
}

/// One of a sharded checkpoint's flat tensors: `group{g}.{what}` in every shard file.
pub struct ShardedSource<'a> {
    files: &'a [SafetensorsFile],
    /// Parameter name → (group, offset in the group's flat tensor).
    place: HashMap<String, (usize, i64)>,
    /// Elements per shard of each group.
    shard_len: Vec<i64>,
    what: &'static str,
}

impl<'a> ShardedSource<'a> {
    /// `what` (`param`, `exp_avg` or `exp_avg_sq`) of the checkpoint whose shard files (in
    /// shard-rank order) and group layouts are given.
    pub fn new(files: &'a [SafetensorsFile], groups: &[GroupLayout], what: &'static str) -> Self {
        let mut place = HashMap::new();
        for (g, layout) in groups.iter().enumerate() {
            for e in &layout.entries {
                place.insert(e.name.clone(), (g, e.offset));
            }
        }
        Self {
            files,
            place,
            shard_len: groups.iter().map(|l| l.shard_len).collect(),
            what,
        }
    }
}

impl TensorSource for ShardedSource<'_> {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        let &(g, offset) = self
            .place
            .get(name)
            .ok_or_else(|| ModelError::MissingParam { name: name.into() })?;
        let k = self.shard_len[g];
        let key = format!("group{g}.{}", self.what);
        let (a, b) = (offset + lo, offset + hi);
        let mut parts = vec![];
        let mut at = a;
        while at < b {
            let r = (at / k) as usize;
            let end = b.min((r as i64 + 1) * k);
            let file = self.files.get(r).ok_or_else(|| {
                TrainError::BadState(format!(
                    "sharded checkpoint: `{name}` needs shard {r}, which it does not have"
                ))
            })?;
            parts.push(file.read_range(&key, at - r as i64 * k, end - r as i64 * k)?);
            at = end;
        }
        Ok(match parts.len() {
            0 => Tensor::f_empty([0], (Kind::Float, Device::Cpu))?,
            1 => parts.pop().expect("one part"),
            _ => Tensor::f_cat(&parts, 0)?,
        })
    }
}

/// The shard files of a sharded checkpoint directory, opened (headers only).
pub fn open_shards(dir: &Path, shard_world: usize) -> Result<Vec<SafetensorsFile>, TrainError> {
    (0..shard_world)
        .map(|r| Ok(SafetensorsFile::open(dir.join(shard_file(r)))?))
        .collect()
}
