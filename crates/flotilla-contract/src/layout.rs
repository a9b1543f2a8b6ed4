//! Every name in a run, sweep or job directory, in one place, and the readers of the job files
//! that the launcher writes and the task, the report and the TensorBoard writer read back.
//!
//! A job directory holds [`CONFIG_FILE`], [`OVERRIDES_FILE`], [`META_FILE`], [`LOGS_DIR`] (one
//! [`rank_log`] per rank), [`METRICS_CSV`] (or a user program's [`METRICS_JSONL`] or event
//! files under [`TB_DIR`]), [`CHECKPOINTS_DIR`], [`FINAL_DIR`], and for a user program
//! [`TASK_FILE`]. A sweep directory holds [`SWEEP_FILE`] (a single run: [`JOB_FILE`]), the copy
//! of the config directory ([`SNAPSHOT_DIR`]) and, for an adaptive study, [`STUDY_FILE`].

use flotilla_config::node::{Node, Value};
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

/// The job's resolved config.
pub const CONFIG_FILE: &str = "config.yaml";
/// The job's task overrides, a YAML list.
pub const OVERRIDES_FILE: &str = "overrides.yaml";
/// Who composed the job, when, where, from what (JSON).
pub const META_FILE: &str = "meta.json";
/// Per-rank log files.
pub const LOGS_DIR: &str = "logs";
/// The plan of a sweep directory: every job, its overrides and state.
pub const SWEEP_FILE: &str = "sweep.json";
/// The plan of a single run's directory.
pub const JOB_FILE: &str = "job.json";
/// A user program's resolved task (`flotilla.task`), read by `flotilla exec-task`.
pub const TASK_FILE: &str = "task.json";
/// An adaptive study's trials and settings, in its sweep directory.
pub const STUDY_FILE: &str = "study.json";
/// The copy of the config directory a run or sweep was composed from.
pub const SNAPSHOT_DIR: &str = ".flotilla/conf";
/// The built-in trainer's metrics, one row per optimizer step.
pub const METRICS_CSV: &str = "metrics.csv";
/// A user program's metrics: one JSON object per line with a `step`.
pub const METRICS_JSONL: &str = "metrics.jsonl";
/// The directory of a job's TensorBoard event file.
pub const TB_DIR: &str = "tb";
/// Training checkpoints, one `step_N` directory each.
pub const CHECKPOINTS_DIR: &str = "checkpoints";
/// The final model, a Hugging Face directory.
pub const FINAL_DIR: &str = "final";
/// The marker, in a job's [`LOGS_DIR`], where the SLURM batch script writes
/// `<id> <STATE> <exit status>` when the job ends.
pub const SLURM_EXIT_MARKER: &str = "slurm.exit";

/// The sub-directories a job directory may hold (never themselves jobs).
pub const JOB_SUBDIRS: [&str; 5] = [CHECKPOINTS_DIR, FINAL_DIR, LOGS_DIR, TB_DIR, ".flotilla"];

/// The name of `rank`'s log file in [`LOGS_DIR`].
pub fn rank_log_name(rank: usize) -> String {
    format!("rank_{rank}.log")
}

/// The log file of `rank` in a job directory.
pub fn rank_log(job_dir: &Path, rank: usize) -> PathBuf {
    job_dir.join(LOGS_DIR).join(rank_log_name(rank))
}

/// The text of `overrides.yaml`: a YAML list of the task overrides (`[]` when none), the
/// format `flotilla train` writes.
pub fn overrides_yaml(overrides: &[String]) -> String {
    if overrides.is_empty() {
        return "[]\n".into();
    }
    overrides
        .iter()
        .map(|o| format!("- {}\n", serde_json::Value::from(o.as_str())))
        .collect()
}

/// A YAML file of a job directory as a tree; `None` when it is missing or does not parse.
fn load_job_file(job_dir: &Path, name: &str) -> Option<Node> {
    let path = job_dir.join(name);
    let text = std::fs::read_to_string(&path).ok()?;
    flotilla_config::yaml::load_str(&text, &path.display().to_string()).ok()
}

/// A job directory's resolved `config.yaml` as a tree; `None` when it is missing or unreadable.
pub fn load_job_config_tree(job_dir: &Path) -> Option<Node> {
    load_job_file(job_dir, CONFIG_FILE)
}

/// The task overrides a job directory's `overrides.yaml` lists (what [`overrides_yaml`]
/// wrote); `None` when it is missing or not a list.
pub fn read_overrides(job_dir: &Path) -> Option<Vec<String>> {
    match load_job_file(job_dir, OVERRIDES_FILE)?.value {
        Value::List(items) => Some(
            items
                .into_iter()
                .filter_map(|i| i.value.as_str().map(str::to_string))
                .collect(),
        ),
        _ => None,
    }
}

/// The assignments among task overrides as `key → value text`: the key without its `+`/`++`
/// prefix, deletions (`~key`) left out, a repeated key in its first place with its last value
/// (as the sweeper orders keys).
pub fn override_assignments(overrides: &[String]) -> IndexMap<String, String> {
    overrides
        .iter()
        .filter(|o| !o.starts_with('~'))
        .filter_map(|o| o.split_once('='))
        .map(|(key, value)| (key.trim_start_matches('+').to_string(), value.to_string()))
        .collect()
}
