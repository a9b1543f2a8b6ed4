//! The Hydra job context of a user's `@hydra.main` app that flotilla runs as a job
//! (`flotilla.task.config_arg: hydra`): what `HydraConfig.get()` says inside it — `mode`,
//! `job.num` and `job.id` in a sweep, `overrides.task`, `job.override_dirname` — as hydra-core
//! gives them for the same command. The app is started on the job's resolved `config.yaml`,
//! which to Hydra is a single run without overrides; the values flotilla composed
//! ([`HydraJob`], kept in `task.json`) are set by a small Hydra callback
//! (`hydra_job_context.py`) that `flotilla exec-task` writes into the job directory and names
//! on the app's command line.
//!
//! This module owns that callback: writing its module into a job directory and the overrides
//! that register it. The context itself is part of the job's `task.json`, so [`HydraJob`] lives
//! with the task file in [`crate::rundir::task`] (re-exported here).

use crate::rundir::{io_err, write_atomic, RunDirError, TASK_FILE};
use std::path::{Path, PathBuf};

pub use crate::rundir::task::HydraJob;

/// Where in a job directory the callback's module is written.
pub const MODULE_DIR: &str = ".flotilla/hydra";
/// The callback's module (importable from [`MODULE_DIR`]).
const MODULE_NAME: &str = "flotilla_hydra_job";
/// The callback's source.
const MODULE_SOURCE: &str = include_str!("hydra_job_context.py");
/// The callback's key under `hydra.callbacks`.
const CALLBACK_KEY: &str = "flotilla_job_context";

/// Writes the callback's module into `job_dir` (unchanged when it is already there) and
/// returns the directory to put on `PYTHONPATH`.
pub fn install(job_dir: &Path) -> Result<PathBuf, RunDirError> {
    let dir = job_dir.join(MODULE_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    let path = dir.join(format!("{MODULE_NAME}.py"));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(MODULE_SOURCE) {
        write_atomic(&path, MODULE_SOURCE.as_bytes())?;
    }
    Ok(dir)
}

/// The Hydra overrides that register the callback for the job of `job_dir`.
pub fn callback_overrides(job_dir: &Path, quote: impl Fn(&str) -> String) -> [String; 2] {
    let task_file = job_dir.join(TASK_FILE);
    [
        format!("+hydra.callbacks.{CALLBACK_KEY}._target_={MODULE_NAME}.JobContext"),
        format!(
            "+hydra.callbacks.{CALLBACK_KEY}.task_file={}",
            quote(&task_file.display().to_string())
        ),
    ]
}
