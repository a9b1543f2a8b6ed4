//! Checkpoints of a [`Trainer`]: `<run_dir>/checkpoints/step_<N>/` holds the parameters
//! (`model.safetensors`, Hugging Face names, with the model's `config.json`), the optimizer
//! state (`optimizer.safetensors`) and `trainer_state.json` (step, sampler position, schedule,
//! loss scale); or, sharded (FSDP), one `shard_<r>.safetensors` per shard-group rank with its
//! flat parameter, gradient-free AdamW moments and `sharded_meta.json` with the layout.
//!
//! A full checkpoint of sharded weights is streamed: rank 0 writes each file's header first,
//! then each group as it is gathered to it (`ParallelWeights::visit_full`), so no rank holds
//! more than a group beyond its shards. Restoring reads, on every rank, only the elements that
//! rank holds, from either kind and whatever world size wrote it ([`CheckpointFiles`]);
//! [`consolidate`] turns either kind into a Hugging Face directory a parameter at a time.
//!
//! A checkpoint is written into a hidden temporary directory and renamed into place, and
//! `trainer_state.json` is written last, so a crash never leaves a directory that [`latest`]
//! would pick. Each records what it holds (`manifest.json`, [`manifest`]) before its state
//! file, and `resume: auto` takes the newest checkpoint that is still whole
//! ([`newest_intact`]), so a damaged newest one costs an interval, not the job. This file owns
//! the layout, saving, rotation and restoring; the files of a checkpoint are read through
//! [`files`], streamed out through [`state_file`], and a job's `final/` is [`final_dir`]'s.

pub mod files;
pub mod final_dir;
pub mod manifest;
pub mod state_file;

pub use files::{shard_file, CheckpointFiles, ShardedMeta, CONFIG_FILE, SHARDED_META_FILE};
pub use final_dir::{save_adapter, save_final, FinalOptions};
pub use state_file::{write_state_file, StateFile};

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::SamplerState;
use crate::error::TrainError;
use crate::model::hf_config::HfLlamaConfig;
use crate::optim::loss_scale::LossScaler;
use crate::parallel::tensor_comm::TensorCollectives;
use crate::state::whole_file::write_safetensors;
use crate::trainer::Trainer;
use files::SHARDED_FORMAT;
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

/// The newest complete checkpoint of `run_dir` that is whole ([`manifest::verify`]), the same
/// on every rank: a damaged one is logged (which file, and why) and an older one tried. `None`
/// when there is no checkpoint; an error naming each one tried when none is whole. Collective
/// in a distributed run (the ranks agree on the newest checkpoint all of them find whole).
pub fn newest_intact(trainer: &Trainer, run_dir: &Path) -> Result<Option<PathBuf>, TrainError> {
    let all = list(run_dir)?;
    let mut tried = vec![];
    let mut chosen: Option<(u64, &PathBuf)> = None;
    for (step, dir) in all.iter().rev() {
        match manifest::verify(dir) {
            Ok(()) => {
                chosen = Some((*step, dir));
                break;
            }
            Err(damage) => {
                tracing::warn!(
                    "checkpoint {} is damaged ({damage}); trying an older one",
                    dir.display()
                );
                tried.push(format!("{}: {damage}", dir.display()));
            }
        }
    }
    // The newest checkpoint every rank finds whole (-1: none).
    let mine = chosen.map_or(-1, |(step, _)| step as i64);
    let agreed = min_over_ranks(trainer, mine)?;
    if agreed < 0 {
        if all.is_empty() {
            return Ok(None);
        }
        return Err(TrainError::BadState(match tried.is_empty() {
            true => "no checkpoint of this run is whole on every rank (see the ranks' logs)".into(),
            false => format!(
                "no checkpoint of this run is whole, so it cannot resume: {}; remove the \
                 damaged checkpoints to start afresh, or set trainer.resume to an intact one",
                tried.join("; ")
            ),
        }));
    }
    let (_, dir) = all
        .iter()
        .find(|(step, _)| *step as i64 == agreed)
        .ok_or_else(|| {
            TrainError::BadState(format!(
                "another rank resumes from step_{agreed}, which this rank does not see"
            ))
        })?;
    if agreed != mine {
        manifest::verify(dir).map_err(|damage| {
            TrainError::BadState(format!(
                "the ranks disagree on the newest whole checkpoint: {}: {damage}",
                dir.display()
            ))
        })?;
    }
    Ok(Some(dir.clone()))
}

/// The least of every rank's `value` (an all-reduce, also a barrier); without a process
/// group, `value` itself.
fn min_over_ranks(trainer: &Trainer, value: i64) -> Result<i64, TrainError> {
    match trainer.comm() {
        Some(comm) => Ok(comm.all_reduce_host(&[value], ReduceOp::Min)?[0]),
        _ => Ok(value),
    }
}

/// Whether every rank succeeded (`ok` is this rank's outcome): an all-reduce of the failure
/// flags, which is also a barrier. Without a process group, `ok` itself.
fn agree(trainer: &Trainer, ok: bool) -> Result<bool, TrainError> {
    match trainer.comm() {
        Some(comm) => Ok(comm.all_reduce_host(&[(!ok) as i64], ReduceOp::Max)?[0] == 0),
        _ => Ok(ok),
    }
}

/// Runs `f` on every rank, then agrees: a local error is returned as is; a failure on another
/// rank becomes an error naming the phase.
pub(crate) fn on_all_ranks(
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
/// every rank and rank 0 removes the hidden temporary directory (one that a killed process
/// left is removed by the next checkpoint). The previous checkpoints are untouched until the
/// new one is complete.
pub fn save(trainer: &Trainer, run_dir: &Path, keep_last: usize) -> Result<PathBuf, TrainError> {
    let dir = checkpoints_dir(run_dir);
    let step = trainer.step;
    let (rank, _) = trainer.rank_world();
    let tmp = dir.join(format!("{TMP_PREFIX}{step}"));
    on_all_ranks(trainer, "set-up", || {
        if rank == 0 {
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            remove_unfinished(&dir)?;
            std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        }
        Ok(())
    })?;
    let written = write_and_commit(trainer, run_dir, &tmp, keep_last);
    if let Err(e) = &written {
        tracing::error!(
            "checkpoint of step {step} abandoned, the earlier checkpoints are untouched: {e}"
        );
        if rank == 0 {
            // Best effort: the error that matters is the one being returned.
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    written
}

/// Name prefix of a checkpoint being written (`.tmp-step_<N>`), renamed when complete.
const TMP_PREFIX: &str = ".tmp-step_";

/// Removes the unfinished checkpoints under `dir`: those a failed save did not clean up (a
/// process killed while writing).
fn remove_unfinished(dir: &Path) -> Result<(), TrainError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

/// The collective write of the state into `tmp`, then rank 0's commit: the trainer state, the
/// rename to `step_<N>` and the rotation.
fn write_and_commit(
    trainer: &Trainer,
    run_dir: &Path,
    tmp: &Path,
    keep_last: usize,
) -> Result<PathBuf, TrainError> {
    let step = trainer.step;
    let (rank, _) = trainer.rank_world();
    let target = checkpoints_dir(run_dir).join(format!("step_{step}"));
    // Gathering (full checkpoints of sharded weights) is collective: every rank takes part.
    match trainer.weights().sharded_state() {
        Some(shard) => on_all_ranks(trainer, "write", || {
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
        None => on_all_ranks(trainer, "write", || {
            let weights = trainer.weights();
            // one file each, whatever the size (a checkpoint is not a Hub directory)
            write_state_file(weights, tmp, StateFile::Model(None), u64::MAX, rank == 0)?;
            write_state_file(weights, tmp, StateFile::Optimizer, u64::MAX, rank == 0)
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
        manifest::record(tmp)?;
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
        std::fs::rename(tmp, &target).map_err(io(&target))?;

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

/// Writes a checkpoint's model (full or sharded) as a Hugging Face directory, a parameter at
/// a time, in the checkpoint's dtype.
pub fn consolidate(checkpoint: &Path, out: &Path) -> Result<(), TrainError> {
    let config = crate::model::read_model_config(checkpoint)?;
    let model = crate::model::CausalLm::new(&config)?;
    let files = CheckpointFiles::open(checkpoint, &model)?;
    let kind = match &files {
        CheckpointFiles::Full { model: m, .. } => {
            m.entries().next().map_or(tch::Kind::Float, |(_, f)| {
                f.tensors()
                    .values()
                    .next()
                    .map_or(tch::Kind::Float, |i| i.kind)
            })
        }
        CheckpointFiles::Sharded { files, .. } => files
            .first()
            .and_then(|f| f.info("group0.param"))
            .map_or(tch::Kind::Float, |i| i.kind),
    };
    files.with_sources(&model, |params, _| {
        crate::state::hf_weights::save_hf_from(out, &model, params, kind)?;
        Ok(())
    })
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
/// reads from the files only the elements it holds; nothing is collective.
pub fn restore(trainer: &mut Trainer, dir: &Path) -> Result<TrainerState, TrainError> {
    let state = read_state(dir)?;
    let files = CheckpointFiles::open(dir, &trainer.model)?;
    let weights = &mut trainer.weights;
    files.with_sources(&trainer.model, |params, optimizer| {
        weights.load_state(params, optimizer)
    })?;
    trainer.loader.restore(&state.sampler)?;
    trainer.step = state.step;
    if trainer.scaler.is_some() {
        trainer.scaler = Some(state.loss_scaler.unwrap_or_default());
    }
    Ok(state)
}
