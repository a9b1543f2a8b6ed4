//! Checkpoints of a [`Trainer`]: `<run_dir>/checkpoints/step_<N>/` holds the parameters
//! (`model.safetensors`, Hugging Face names, with the model's `config.json`), the optimizer
//! state (`optimizer.safetensors`) and `trainer_state.json` (step, sampler position, schedule,
//! loss scale); or, sharded (FSDP), one `shard_<r>.safetensors` per shard-group rank with its
//! flat parameter, gradient-free AdamW moments and `sharded_meta.json` with the layout, which
//! [`read_full`] turns back into full tensors for any world size and [`consolidate`] into a
//! Hugging Face directory. A checkpoint is written into a
//! hidden temporary directory and renamed into place, and `trainer_state.json` is written last,
//! so a crash never leaves a directory that [`latest`] would pick. This file owns the layout,
//! saving, rotation and restoring.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::fsdp_layout::{unflatten, GroupLayout};
use super::loss_scale::LossScaler;
use super::trainer::Trainer;
use super::weights::CheckpointState;
use super::{read_safetensors, write_safetensors, TrainError};
use crate::data::SamplerState;
use crate::model::hf::HfLlamaConfig;
use crate::model::Params;
use crate::tensor_comm::TensorCollectives;
use flotilla_comm::comm::ReduceOp;
use flotilla_config::schema::LrSchedule;

/// Parameters file of a checkpoint.
pub const MODEL_FILE: &str = "model.safetensors";
/// Optimizer state file of a checkpoint.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Trainer state file of a checkpoint; its presence marks a complete checkpoint.
pub const STATE_FILE: &str = "trainer_state.json";

/// The schedule a checkpoint was written with (informational: a resumed run uses its config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleState {
    pub kind: LrSchedule,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub max_steps: u64,
}

/// The contents of `trainer_state.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps taken (the 0-based index of the next step).
    pub step: u64,
    /// Position of the training data sampler.
    pub sampler: SamplerState,
    pub schedule: ScheduleState,
    /// The trainer uses no random state of its own (no dropout); kept for the format.
    pub rng_seed: Option<u64>,
    /// fp16 loss scaling state (`16-mixed`).
    #[serde(default)]
    pub loss_scaler: Option<LossScaler>,
    /// Ranks of the run that wrote the checkpoint.
    #[serde(default = "one")]
    pub world_size: usize,
}

fn one() -> usize {
    1
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `<run_dir>/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join(flotilla_contract::layout::CHECKPOINTS_DIR)
}

/// The step of a complete checkpoint directory name (`step_<N>`).
fn parse_step(name: &str) -> Option<u64> {
    name.strip_prefix("step_")?.parse().ok()
}

/// Complete checkpoints under `<run_dir>/checkpoints`, oldest first. Temporary directories and
/// directories without `trainer_state.json` are ignored.
pub fn list(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let dir = checkpoints_dir(run_dir);
    if !dir.is_dir() {
        return Ok(vec![]);
    }
    let mut out = vec![];
    for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
        let entry = entry.map_err(io(&dir))?;
        let Some(step) = entry.file_name().to_str().and_then(parse_step) else {
            continue;
        };
        let path = entry.path();
        if path.join(STATE_FILE).is_file() {
            out.push((step, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The latest complete checkpoint of a run directory, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    Ok(list(run_dir)?.pop().map(|(_, p)| p))
}

/// Whether every rank succeeded (`ok` is this rank's outcome): an all-reduce of the failure
/// flags, which is also a barrier. Without a process group, `ok` itself.
fn agree(trainer: &Trainer, ok: bool) -> Result<bool, TrainError> {
    match trainer.comm() {
        Some(comm) if comm.world_size() > 1 => {
            let flag = Tensor::from_slice(&[(!ok) as i64]);
            comm.all_reduce_tensor(&flag, ReduceOp::Max)?.wait()?;
            Ok(flag.f_int64_value(&[0])? == 0)
        }
        _ => Ok(ok),
    }
}

/// Runs `f` on every rank, then agrees: a local error is returned as is; a failure on another
/// rank becomes an error naming the phase.
fn on_all_ranks(
    trainer: &Trainer,
    phase: &str,
    f: impl FnOnce() -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let result = f();
    let all_ok = agree(trainer, result.is_ok())?;
    result?;
    if !all_ok {
        return Err(TrainError::BadState(format!(
            "checkpoint {phase} failed on another rank (see its log)"
        )));
    }
    Ok(())
}

/// Writes a checkpoint of `trainer` at its current step to `<run_dir>/checkpoints/step_<N>/`
/// (atomically, replacing one of the same step), then removes all but the last `keep_last`
/// complete checkpoints (`0` keeps all). Returns the checkpoint directory.
///
/// Collective in a distributed run: full checkpoints gather the parameters and optimizer state
/// and rank 0 writes them; sharded checkpoints (FSDP, `state_dict_type: sharded`) have each
/// first replica of a shard write `shard_<r>.safetensors` and rank 0 the layout. Rank 0 alone
/// creates, renames and rotates directories; a failure on any rank fails the checkpoint on
/// every rank, and leaves only a hidden temporary directory behind.
pub fn save(trainer: &Trainer, run_dir: &Path, keep_last: usize) -> Result<PathBuf, TrainError> {
    let dir = checkpoints_dir(run_dir);
    let step = trainer.step;
    let (rank, _) = trainer.rank_world();
    let tmp = dir.join(format!(".tmp-step_{step}"));
    let target = dir.join(format!("step_{step}"));
    on_all_ranks(trainer, "set-up", || {
        if rank == 0 {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
            }
            std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        }
        Ok(())
    })?;

    // Gathering (full checkpoints of sharded weights) is collective: every rank takes part.
    match trainer.weights().checkpoint_state()? {
        CheckpointState::Sharded(shard) => on_all_ranks(trainer, "write", || {
            if shard.writes_shard {
                write_safetensors(&tmp.join(shard_file(shard.shard_rank)), &shard.tensors)?;
            }
            if rank == 0 {
                let meta = ShardedMeta {
                    format: SHARDED_FORMAT.to_string(),
                    shard_world: shard.shard_world,
                    optimizer_step: shard.optimizer_step,
                    groups: shard.layouts,
                };
                let path = tmp.join(SHARDED_META_FILE);
                let json = serde_json::to_string_pretty(&meta)
                    .map_err(|e| TrainError::BadState(format!("{SHARDED_META_FILE}: {e}")))?;
                std::fs::write(&path, json).map_err(io(&path))?;
            }
            Ok(())
        })?,
        CheckpointState::Full { params, optimizer } => on_all_ranks(trainer, "write", || {
            // Rank 0 writes.
            if rank == 0 {
                let params: Vec<(String, Tensor)> = params
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.shallow_clone()))
                    .collect();
                write_safetensors(&tmp.join(MODEL_FILE), &params)?;
                write_safetensors(&tmp.join(OPTIMIZER_FILE), &optimizer)?;
            }
            Ok(())
        })?,
    }

    on_all_ranks(trainer, "commit", || {
        if rank != 0 {
            return Ok(());
        }
        let hf = serde_json::to_string_pretty(&HfLlamaConfig::from(trainer.model.config()))
            .map_err(|e| TrainError::BadState(format!("config.json: {e}")))?;
        let config_path = tmp.join(CONFIG_FILE);
        std::fs::write(&config_path, hf).map_err(io(&config_path))?;
        let s = &trainer.schedule;
        let state = TrainerState {
            step,
            sampler: trainer.loader.state(),
            schedule: ScheduleState {
                kind: s.kind,
                lr: s.lr,
                min_lr: s.min_lr,
                warmup_steps: s.warmup_steps,
                max_steps: s.max_steps,
            },
            rng_seed: None,
            loss_scaler: trainer.scaler,
            world_size: trainer.rank_world().1,
        };
        let state_path = tmp.join(STATE_FILE);
        let json = serde_json::to_string_pretty(&state)
            .map_err(|e| TrainError::BadState(format!("trainer_state.json: {e}")))?;
        std::fs::write(&state_path, json).map_err(io(&state_path))?;

        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io(&target))?;
        }
        std::fs::rename(&tmp, &target).map_err(io(&target))?;

        if keep_last > 0 {
            let all = list(run_dir)?;
            let excess = all.len().saturating_sub(keep_last);
            for (_, old) in &all[..excess] {
                std::fs::remove_dir_all(old).map_err(io(old))?;
            }
        }
        Ok(())
    })?;
    Ok(target)
}

/// The shard file of shard-group rank `r`.
pub fn shard_file(r: usize) -> String {
    format!("shard_{r:05}.safetensors")
}

/// Layout file of a sharded checkpoint.
pub const SHARDED_META_FILE: &str = "sharded_meta.json";
/// The model's Hugging Face `config.json`, in every checkpoint.
pub const CONFIG_FILE: &str = "config.json";
const SHARDED_FORMAT: &str = "flotilla-fsdp-sharded-v1";

/// The contents of `sharded_meta.json`: how the flat groups were laid out and sharded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardedMeta {
    pub format: String,
    /// Ranks in the shard group that wrote `shard_<r>.safetensors`.
    pub shard_world: usize,
    pub optimizer_step: u64,
    pub groups: Vec<GroupLayout>,
}

/// The full parameters and optimizer state (single-process format) of a checkpoint, full or
/// sharded (shards are concatenated and unpadded, whatever the world size that wrote them).
pub fn read_full(dir: &Path) -> Result<(Params, Vec<(String, Tensor)>), TrainError> {
    let meta_path = dir.join(SHARDED_META_FILE);
    if !meta_path.is_file() {
        let mut params = Params::new();
        for (n, t) in read_safetensors(&dir.join(MODEL_FILE))? {
            params.insert(n, t);
        }
        return Ok((params, read_safetensors(&dir.join(OPTIMIZER_FILE))?));
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
    let mut shards: Vec<std::collections::HashMap<String, Tensor>> = vec![];
    for r in 0..meta.shard_world {
        shards.push(
            read_safetensors(&dir.join(shard_file(r)))?
                .into_iter()
                .collect(),
        );
    }
    let mut params = Params::new();
    let mut optimizer = vec![("step".to_string(), Tensor::from(meta.optimizer_step as i64))];
    for (g, layout) in meta.groups.iter().enumerate() {
        let full = |what: &str| -> Result<Params, TrainError> {
            let key = format!("group{g}.{what}");
            let parts = shards
                .iter()
                .enumerate()
                .map(|(r, s)| {
                    s.get(&key).map(Tensor::shallow_clone).ok_or_else(|| {
                        TrainError::BadState(format!(
                            "{}: no tensor `{key}`",
                            dir.join(shard_file(r)).display()
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let flat = Tensor::f_cat(&parts, 0)?;
            if flat.numel() as i64 != layout.padded {
                return Err(TrainError::BadState(format!(
                    "{}: group {g} has {} elements over its shards, its layout says {}",
                    dir.display(),
                    flat.numel(),
                    layout.padded
                )));
            }
            let mut out = Params::new();
            unflatten(layout, &flat, &mut out)?;
            Ok(out)
        };
        for (n, t) in full("param")?.iter() {
            params.insert(n, t.shallow_clone());
        }
        let avg = full("exp_avg")?;
        let sq = full("exp_avg_sq")?;
        for e in &layout.entries {
            optimizer.push((
                format!("{}.exp_avg", e.name),
                avg.require(&e.name)?.shallow_clone(),
            ));
            optimizer.push((
                format!("{}.exp_avg_sq", e.name),
                sq.require(&e.name)?.shallow_clone(),
            ));
        }
    }
    Ok((params, optimizer))
}

/// Writes a checkpoint's model (full or sharded) as a Hugging Face directory.
pub fn consolidate(checkpoint: &Path, out: &Path) -> Result<(), TrainError> {
    let config = crate::model::hf::read_model_config(checkpoint)?;
    let model = crate::model::Llama::new(&config)?;
    let (params, _) = read_full(checkpoint)?;
    let kind = params
        .iter()
        .next()
        .map_or(tch::Kind::Float, |(_, t)| t.kind());
    crate::model::save_hf(out, &model, &params, kind)?;
    Ok(())
}

/// Reads `trainer_state.json` of a checkpoint directory.
pub fn read_state(dir: &Path) -> Result<TrainerState, TrainError> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text)
        .map_err(|e| TrainError::BadState(format!("{}: {e}", path.display())))
}

/// Restores `trainer` (parameters, optimizer, data position, step, loss scale) from a
/// checkpoint directory, full or sharded, written by any world size and strategy. Every rank
/// reads the files itself; nothing is collective.
pub fn restore(trainer: &mut Trainer, dir: &Path) -> Result<TrainerState, TrainError> {
    let state = read_state(dir)?;
    let (loaded, optimizer) = read_full(dir)?;
    trainer.model.check_params(&loaded)?;
    trainer.weights.load_full_state(&loaded, optimizer)?;
    trainer.loader.restore(&state.sampler)?;
    trainer.step = state.step;
    if trainer.scaler.is_some() {
        trainer.scaler = Some(state.loss_scaler.unwrap_or_default());
    }
    Ok(state)
}
