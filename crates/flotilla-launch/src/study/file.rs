//! A study as `study.json` in its sweep directory holds it ([`StudyFile`]): its config, metric
//! and direction, search space, trials and pruner state; read and written whole (atomically)
//! after every change, and summarised for people by [`summary`].

use crate::rundir::{write_atomic, RunDirError};
use flotilla_contract::metrics::format_value;
use flotilla_study::config::StudyConfig;
use flotilla_study::{best_trial, Direction, SearchSpace, SuccessiveHalving, Trial, TrialState};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The study file in the sweep directory.
pub use flotilla_contract::layout::STUDY_FILE;
/// The version of `study.json` this crate writes.
pub(super) const STUDY_VERSION: u32 = 1;

/// Everything a study is, as `study.json` holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudyFile {
    pub version: u32,
    pub config: StudyConfig,
    /// The metric and direction in use (the configured ones, or the defaults decided when the
    /// study started).
    pub metric: String,
    pub direction: Direction,
    pub space: SearchSpace,
    /// The runtime overrides every trial is composed with.
    pub runtime_overrides: Vec<String>,
    /// The primary config's name; the config is the sweep directory's copy of its directory.
    pub config_name: String,
    pub validate: bool,
    pub trials: Vec<Trial>,
    /// The pruner's state (its `auto` estimate once made).
    pub pruner: Option<SuccessiveHalving>,
}

impl StudyFile {
    pub fn read(sweep_dir: &Path) -> Result<Option<StudyFile>, RunDirError> {
        let path = sweep_dir.join(STUDY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(RunDirError::Io { path, error }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| RunDirError::Json { path, error })
    }

    /// Writes `study.json` in `sweep_dir` (atomically).
    pub(super) fn write(&self, sweep_dir: &Path) -> Result<(), RunDirError> {
        let mut text = serde_json::to_string_pretty(self).expect("a study serialises");
        text.push('\n');
        write_atomic(&sweep_dir.join(STUDY_FILE), text.as_bytes())
    }

    /// The best COMPLETE trial.
    pub fn best(&self) -> Option<&Trial> {
        best_trial(&self.trials, self.direction)
    }
}

/// A one-line summary of a study: trials by state and the best trial. A trial's value is its
/// metric's final value (the objective, as Optuna's), which the line says; `flotilla report`'s
/// best is the best value at any step.
pub fn summary(study: &StudyFile) -> String {
    let count = |s: TrialState| study.trials.iter().filter(|t| t.state == s).count();
    let mut out = format!(
        "study: {} trials ({} complete, {} pruned, {} failed, {} unfinished) of {}, {} {}",
        study.trials.len(),
        count(TrialState::Complete),
        count(TrialState::Pruned),
        count(TrialState::Failed),
        count(TrialState::Running),
        study.config.n_trials,
        study.direction.as_str(),
        study.metric
    );
    if let Some(best) = study.best() {
        out.push_str(&format!(
            "\nbest trial: {}, final {} = {} ({})",
            best.number,
            study.metric,
            format_value(best.value.unwrap_or(f64::NAN)),
            study.space.overrides(&best.params).join(" ")
        ));
    }
    out.push('\n');
    out
}
