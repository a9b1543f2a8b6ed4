//! The Hydra job context of a user's `@hydra.main` app that flotilla runs as a job
//! (`flotilla.task.config_arg: hydra`): what `HydraConfig.get()` says inside it — `mode`,
//! `job.num` and `job.id` in a sweep, `overrides.task`, `job.override_dirname` — as hydra-core
//! gives them for the same command. The app is started on the job's resolved `config.yaml`,
//! which to Hydra is a single run without overrides; the values flotilla composed
//! ([`HydraJob`], kept in `task.json`) are set by a small Hydra callback
//! (`hydra_job_context.py`) that `flotilla exec-task` writes into the job directory and names
//! on the app's command line.

use crate::rundir::{io_err, write_atomic, RunDirError};
use flotilla_config::node::{Node, Value};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where in a job directory the callback's module is written.
pub const MODULE_DIR: &str = ".flotilla/hydra";
/// The callback's module (importable from [`MODULE_DIR`]).
const MODULE_NAME: &str = "flotilla_hydra_job";
/// The callback's source.
const MODULE_SOURCE: &str = include_str!("hydra_job_context.py");
/// The callback's key under `hydra.callbacks`.
const CALLBACK_KEY: &str = "flotilla_job_context";

/// A job's Hydra context, from its composed runtime node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HydraJob {
    /// `RUN`, or `MULTIRUN` for a job of a sweep.
    pub mode: String,
    /// The job's number in its sweep (`None` for a single run, where Hydra leaves it unset).
    pub num: Option<u64>,
    /// The task overrides, as Hydra's `overrides.task` lists them.
    pub task: Vec<String>,
    /// `job.override_dirname`, with the config's separators and excluded keys.
    pub override_dirname: String,
}

impl HydraJob {
    /// The context a composed runtime node (`hydra:`/`flotilla:`) describes.
    pub fn from_runtime(runtime: &Node) -> HydraJob {
        let text = |key: &str| {
            runtime
                .select(key)
                .and_then(|n| n.value.as_str().map(str::to_string))
        };
        let mode = text("mode").unwrap_or_else(|| "RUN".into());
        let num = match runtime.select("job.num").map(|n| &n.value) {
            Some(Value::Int(n)) if mode == "MULTIRUN" => u64::try_from(*n).ok(),
            _ => None,
        };
        let task = match runtime.select("overrides.task").map(|n| &n.value) {
            Some(Value::List(items)) => items
                .iter()
                .filter_map(|n| n.value.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        HydraJob {
            mode,
            num,
            task,
            override_dirname: text("job.override_dirname").unwrap_or_default(),
        }
    }
}

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
    let task_file = job_dir.join(crate::user_task::TASK_FILE);
    [
        format!("+hydra.callbacks.{CALLBACK_KEY}._target_={MODULE_NAME}.JobContext"),
        format!(
            "+hydra.callbacks.{CALLBACK_KEY}.task_file={}",
            quote(&task_file.display().to_string())
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_job_is_multirun_with_its_number() {
        let runtime = flotilla_config::yaml::load_str(
            "mode: MULTIRUN\njob:\n  num: 3\n  override_dirname: db=postgres\noverrides:\n  task: [db=postgres]\n",
            "runtime",
        )
        .unwrap();
        assert_eq!(
            HydraJob::from_runtime(&runtime),
            HydraJob {
                mode: "MULTIRUN".into(),
                num: Some(3),
                task: vec!["db=postgres".into()],
                override_dirname: "db=postgres".into(),
            }
        );
        let single = flotilla_config::yaml::load_str(
            "mode: RUN\njob:\n  num: ???\n  override_dirname: ''\noverrides:\n  task: []\n",
            "runtime",
        )
        .unwrap();
        assert_eq!(HydraJob::from_runtime(&single).num, None);
    }
}
