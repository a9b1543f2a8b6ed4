//! A job's `task.json`: the user's own program as the job directory keeps it ([`TaskSpec`]:
//! its resolved command, ranks, directory, environment and `compute`, and, for a Hydra app, the
//! Hydra job context flotilla composed for it, [`HydraJob`]), how it is built from the validated
//! config, read back, and how its program is found.
//!
//! [`prepare`](super::prepare) writes it; `flotilla exec-task` ([`crate::user_task`]) and the
//! launchers that start a job again read it.

use super::{io_err, RunDirError};
use flotilla_config::node::{Node, Value};
use flotilla_config::schema::{ComputeConfig, ConfigArg, TaskConfig, TaskRanks};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

pub use flotilla_contract::layout::TASK_FILE;

/// The resolved task of one job, as `task.json` holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The program and its arguments (interpolations resolved, placeholders not yet filled).
    pub argv: Vec<String>,
    pub ranks: TaskRanks,
    /// The absolute working directory.
    pub cwd: PathBuf,
    pub env: IndexMap<String, String>,
    pub config_arg: Option<ConfigArg>,
    /// The job's `compute` (defaults filled in), for the launcher that starts it again.
    pub compute: ComputeConfig,
    /// For a Hydra app (`config_arg: hydra`): the Hydra job context it is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hydra_job: Option<HydraJob>,
}

/// Why a task cannot be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error(transparent)]
    RunDir(#[from] RunDirError),
    #[error("{}: invalid {TASK_FILE}: {error}", path.display())]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{0}")]
    Place(String),
}

impl TaskSpec {
    /// The task of a job from its validated `flotilla.task` (its command set) and `compute`;
    /// a relative or absent `cwd` is taken from `start_dir` (where flotilla was started).
    pub fn new(task: &TaskConfig, compute: &ComputeConfig, start_dir: &Path) -> TaskSpec {
        let cwd = match &task.cwd {
            Some(dir) => start_dir.join(dir),
            None => start_dir.to_path_buf(),
        };
        TaskSpec {
            argv: task.command.clone().unwrap_or_default(),
            ranks: task.ranks,
            cwd,
            env: task.env.clone(),
            config_arg: task.config_arg,
            compute: compute.clone(),
            hydra_job: None,
        }
    }

    /// How many processes the launcher starts: one per rank, or one per node.
    pub fn processes(&self) -> usize {
        match self.ranks {
            TaskRanks::PerTask => self.compute.world_size(),
            TaskRanks::PerNode => self.compute.nodes,
        }
    }

    /// The text of `task.json`.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a task serialises");
        s.push('\n');
        s
    }

    /// The task of a job directory; `None` when it runs the built-in trainer (no `task.json`).
    pub fn read(job_dir: &Path) -> Result<Option<TaskSpec>, TaskError> {
        let path = job_dir.join(TASK_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, e).into()),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| TaskError::Json { path, error })
    }

    /// The program's path: a name with a `/` relative to the task's directory, else found on
    /// `PATH` (the task's own `env.PATH` when it sets one). `Err` says where it looked.
    pub fn find_program(&self) -> Result<PathBuf, String> {
        let program = self.argv.first().map(String::as_str).unwrap_or("");
        if program.contains('/') {
            let path = self.cwd.join(program);
            return if is_executable(&path) {
                Ok(path)
            } else if path.exists() {
                Err(format!("{} is not executable (chmod +x it, or run it through its interpreter, e.g. [python, {program}])", path.display()))
            } else {
                Err(format!("{} does not exist", path.display()))
            };
        }
        let search = self
            .env
            .get("PATH")
            .map(OsString::from)
            .or_else(|| std::env::var_os("PATH"))
            .unwrap_or_default();
        std::env::split_paths(&search)
            .map(|dir| self.cwd.join(dir).join(program))
            .find(|p| is_executable(p))
            .ok_or_else(|| format!("`{program}` was not found on PATH"))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A job's Hydra context, from its composed runtime node; inside the app, the callback that
/// [`crate::hydra_job`] installs sets it.
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
