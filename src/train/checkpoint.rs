//! Checkpoints of a [`Trainer`]: `<run_dir>/checkpoints/step_<N>/` holds the parameters
//! (`model.safetensors`), the optimizer state (`optimizer.safetensors`) and
//! `trainer_state.json` (step, sampler position, schedule). A checkpoint is written into a
//! hidden temporary directory and renamed into place, and `trainer_state.json` is written last,
//! so a crash never leaves a directory that [`latest`] would pick. This file owns the layout,
//! saving, rotation and restoring.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::trainer::Trainer;
use super::TrainError;
use crate::config::schema::LrSchedule;
use crate::data::SamplerState;

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
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `<run_dir>/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
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

/// Writes a checkpoint of `trainer` at its current step to `<run_dir>/checkpoints/step_<N>/`
/// (atomically, replacing one of the same step), then removes all but the last `keep_last`
/// complete checkpoints (`0` keeps all). Returns the checkpoint directory.
pub fn save(trainer: &Trainer, run_dir: &Path, keep_last: usize) -> Result<PathBuf, TrainError> {
    let dir = checkpoints_dir(run_dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let step = trainer.step;
    let tmp = dir.join(format!(".tmp-step_{step}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;

    let model_path = tmp.join(MODEL_FILE);
    let params: Vec<(String, Tensor)> = trainer
        .params
        .iter()
        .map(|(n, t)| (n.to_string(), t.shallow_clone()))
        .collect();
    Tensor::write_safetensors(&params, &model_path).map_err(|source| TrainError::File {
        path: model_path.clone(),
        source,
    })?;
    trainer.optimizer.save(&tmp.join(OPTIMIZER_FILE))?;
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
    };
    let state_path = tmp.join(STATE_FILE);
    let json = serde_json::to_string_pretty(&state)
        .map_err(|e| TrainError::BadState(format!("trainer_state.json: {e}")))?;
    std::fs::write(&state_path, json).map_err(io(&state_path))?;

    let target = dir.join(format!("step_{step}"));
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
    Ok(target)
}

/// Reads `trainer_state.json` of a checkpoint directory.
pub fn read_state(dir: &Path) -> Result<TrainerState, TrainError> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text)
        .map_err(|e| TrainError::BadState(format!("{}: {e}", path.display())))
}

/// Restores `trainer` (parameters, optimizer, data position, step) from a checkpoint directory.
pub fn restore(trainer: &mut Trainer, dir: &Path) -> Result<TrainerState, TrainError> {
    let state = read_state(dir)?;
    let model_path = dir.join(MODEL_FILE);
    let tensors = Tensor::read_safetensors(&model_path).map_err(|source| TrainError::File {
        path: model_path.clone(),
        source,
    })?;
    let mut loaded = crate::model::Params::new();
    for (n, t) in tensors {
        loaded.insert(n, t);
    }
    trainer.model.check_params(&loaded)?;
    tch::no_grad(|| -> Result<(), TrainError> {
        for (name, p) in trainer.params.iter() {
            let src = loaded.require(name)?;
            let mut p = p.shallow_clone();
            p.f_copy_(src)?;
        }
        Ok(())
    })?;
    let opt_path = dir.join(OPTIMIZER_FILE);
    let tensors = Tensor::read_safetensors(&opt_path).map_err(|source| TrainError::File {
        path: opt_path.clone(),
        source,
    })?;
    let device = trainer
        .params
        .iter()
        .next()
        .map_or(tch::Device::Cpu, |(_, t)| t.device());
    let tensors = tensors
        .into_iter()
        .map(|(n, t)| {
            let t = if n == "step" { t } else { t.to_device(device) };
            (n, t)
        })
        .collect::<Vec<_>>();
    trainer.optimizer.load_state_tensors(tensors)?;
    trainer.loader.restore(&state.sampler)?;
    trainer.step = state.step;
    Ok(state)
}
